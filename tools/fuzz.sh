#!/usr/bin/env bash
# Runs every fuzz target (fuzz/, docs/reliability.md "Fuzzing") under AFL++ for SECONDS each
# (default 60), from its checked-in corpus, and fails when AFL++ finds a crash or a hang.
#
#   tools/fuzz.sh [SECONDS] [TARGET...]
#
# Needs cargo-afl with its AFL++ built (`cargo install cargo-afl`, `cargo afl config --build`;
# .ci/run does both). Findings and AFL++'s state go to $FUZZ_OUT (default target/fuzz); an
# input that crashed is printed with the command that replays it, and belongs in
# fuzz/corpus/<target>/ once fixed (fuzz/tests/corpus.rs then keeps it fixed).
set -euo pipefail
cd "$(dirname "$0")/.."
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

echo "=== building the fuzz targets with AFL++ instrumentation"
cargo afl build --release --locked -p dpufs-fuzz --features afl --bin dpufs-fuzz

# No screen, no CPU binding or frequency checks (CI machines and VMs), and a missing
# core-dump handler is fine: crashes are detected by the fork server either way.
export AFL_NO_UI=1 AFL_SKIP_CPUFREQ=1 AFL_NO_AFFINITY=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1
# Stop at the first crash: the run fails anyway, and the time it took is the figure.
export AFL_BENCH_UNTIL_CRASH=1

failed=0
printf '%-16s %10s %10s %8s %8s %8s %7s\n' target execs execs/s paths crashes hangs seconds
for t in "${targets[@]}"; do
  rm -rf "${out:?}/$t"
  mkdir -p "$out/$t"
  # -t: an engine starts on a target's first input in each forked child (dfs_request,
  # fuse_request); 5 s leaves room for that on a loaded machine.
  cargo afl fuzz -i "fuzz/corpus/$t" -o "$out/$t" -V "$seconds" -t 5000 -- "$bin" "$t" \
    >"$out/$t.log" 2>&1 || { echo "afl-fuzz failed for $t:"; tail -20 "$out/$t.log"; failed=1; continue; }
  stats=$out/$t/default/fuzzer_stats
  stat() { sed -n "s/^$1 *: *//p" "$stats"; }
  printf '%-16s %10s %10s %8s %8s %8s %7s\n' "$t" "$(stat execs_done)" "$(stat execs_per_sec)" \
    "$(stat corpus_count)" "$(stat saved_crashes)" "$(stat saved_hangs)" "$(stat run_time)"
  for kind in crashes hangs; do
    for f in "$out/$t/default/$kind"/id:*; do
      [ -e "$f" ] || continue
      echo "!!! $t: $kind input $f; replay: $bin $t < '$f'"
      failed=1
    done
  done
done
exit "$failed"
