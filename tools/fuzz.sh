#!/usr/bin/env bash
# Runs every fuzz target (fuzz/, docs/reliability.md "Fuzzing") under AFL++ for SECONDS each
# (default 60), from its checked-in corpus, and fails when AFL++ finds a crash or a hang.
#
#   tools/fuzz.sh [SECONDS] [TARGET...]
#   tools/fuzz.sh build      (the instrumented build alone: CI runs it beside the tests)
#
# Needs cargo-afl with its AFL++ built (`cargo install cargo-afl`, `cargo afl config --build`;
# .ci/run does both). Findings and AFL++'s state go to $FUZZ_OUT (default target/fuzz); an
# input that crashed is printed with the command that replays it, and belongs in
# fuzz/corpus/<target>/ once fixed (fuzz/tests/corpus.rs then keeps it fixed).
set -euo pipefail
cd "$(dirname "$0")/.."
build_only=0
if [ "${1:-}" = build ]; then
  build_only=1
  shift
fi
seconds=${1:-60}
shift || true
targets=("$@")
if ((${#targets[@]} == 0)); then
  targets=(fabric_wire handshake dfs_request node_protocols csi_fields dpu_channel fuse_request mgmt_request)
fi
out=${FUZZ_OUT:-$PWD/target/fuzz}
# Instrumented builds keep a target directory of their own: sharing the normal one would
# rebuild everything whenever one switches between `cargo afl` and `cargo`.
export CARGO_TARGET_DIR=${AFL_TARGET_DIR:-$PWD/target/afl}
bin=$CARGO_TARGET_DIR/release/dpufs-fuzz
# The in-process engines' data (fuzz/src/engine.rs), in memory where there is tmpfs; AFL++ kills
# its children, so what they leave is removed here.
DPUFS_FUZZ_DATA=$(mktemp -d /dev/shm/dpufs-fuzz.XXXXXX 2>/dev/null || mktemp -d)
export DPUFS_FUZZ_DATA
trap 'rm -rf "$DPUFS_FUZZ_DATA"' EXIT

# cargo-afl compiles every crate with one codegen unit at opt-level 3 by default: 14.5 min for
# this graph in CI. At opt-level 1 and without debug info it builds in about 11.5 min; a planted
# decoder bug is still found in seconds (docs/reliability.md, "Runs").
export AFL_OPT_LEVEL=1 CARGO_PROFILE_RELEASE_DEBUG=false
echo "=== building the fuzz targets with AFL++ instrumentation"
cargo afl build --release --locked -p dpufs-fuzz --features afl --bin dpufs-fuzz
((build_only == 0)) || exit 0

# No screen, no CPU binding or frequency checks (CI machines and VMs), and a missing
# core-dump handler is fine: crashes are detected by the fork server either way.
export AFL_NO_UI=1 AFL_SKIP_CPUFREQ=1 AFL_NO_AFFINITY=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1
# Stop at the first crash: the run fails anyway, and the time it took is the figure.
export AFL_BENCH_UNTIL_CRASH=1

# The targets run side by side, as many at once as there are cores (FUZZ_JOBS): each fuzzer is
# one process on one core, and running them one after another cost CI a minute per target.
parallel=${FUZZ_JOBS:-$(nproc)}

# Fuzzes target $1 for $seconds; its table row and findings go to $out/$1.result, and
# $out/$1.failed marks a crash, a hang or a fuzzer that did not run.
fuzz_one() {
  local t=$1 result=$out/$1.result
  rm -rf "${out:?}/$t" "$out/$t.failed" "$result"
  mkdir -p "$out/$t"
  # -t: an engine starts on a target's first input in each forked child (dfs_request,
  # fuse_request); 5 s leaves room for that on a loaded machine.
  if ! cargo afl fuzz -i "fuzz/corpus/$t" -o "$out/$t" -V "$seconds" -t 5000 -- "$bin" "$t" \
    >"$out/$t.log" 2>&1; then
    { echo "afl-fuzz failed for $t:"; tail -20 "$out/$t.log"; } >"$result"
    touch "$out/$t.failed"
    return
  fi
  local stats=$out/$t/default/fuzzer_stats
  stat() { sed -n "s/^$1 *: *//p" "$stats"; }
  printf '%-16s %10s %10s %8s %8s %8s %7s\n' "$t" "$(stat execs_done)" "$(stat execs_per_sec)" \
    "$(stat corpus_count)" "$(stat saved_crashes)" "$(stat saved_hangs)" "$(stat run_time)" >"$result"
  for kind in crashes hangs; do
    for f in "$out/$t/default/$kind"/id:*; do
      [ -e "$f" ] || continue
      echo "!!! $t: $kind input $f; replay: $bin $t < '$f'" >>"$result"
      touch "$out/$t.failed"
    done
  done
}

echo "=== ${#targets[@]} targets, ${seconds}s each, $parallel at a time"
for t in "${targets[@]}"; do
  while (($(jobs -rp | wc -l) >= parallel)); do wait -n || true; done
  fuzz_one "$t" &
done
wait

failed=0
printf '%-16s %10s %10s %8s %8s %8s %7s\n' target execs execs/s paths crashes hangs seconds
for t in "${targets[@]}"; do
  cat "$out/$t.result" 2>/dev/null || { echo "$t: no result (see $out/$t.log)"; failed=1; }
  [ ! -e "$out/$t.failed" ] || failed=1
done
exit "$failed"
