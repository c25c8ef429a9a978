#!/usr/bin/env bash
# Two (or more) builds of dpufs side by side: each round starts `dpufs up` from each build in
# turn in a fresh scratch directory and runs the same 4 KiB direct fio cases on its mount, so a
# change to the data path is judged against the build before it on the same machine, minutes
# apart, in alternating order (a VM's speed drifts by tens of percent over an hour).
#
#   bench/builds.sh ROUNDS NAME=BINDIR NAME=BINDIR...
#   BLOCK=1m bench/builds.sh ...      # 1 MiB sequential reads and writes instead of 4 KiB random
#
# BINDIR holds a build's `dpufs`, `dpufs-engine` and `dpufs-csi` (copy them out of
# target/release before building the next). Runs as root (it drops the page cache). Prints one
# line per case: IOPS, the serving CPU per request (the engine's and the volume worker's user
# and system time over the requests fio made; fio's own is not in it) and fio's p99 latency.
set -Eeuo pipefail

if [[ $# -lt 2 ]]; then
    sed -n '2,13p' "$0" >&2
    exit 2
fi
ROUNDS=$1
shift
BLOCK=${BLOCK:-4k}
case $BLOCK in
    4k) READ=randread WRITE=randwrite SIZE=128M ;;
    1m) READ=read WRITE=write SIZE=512M ;;
    *) echo "BLOCK is 4k or 1m" >&2; exit 2 ;;
esac
COMMON=(--direct=1 --ioengine=psync --bs="$BLOCK" --time_based=1 --runtime=5 --group_reporting=1
        --size="$SIZE" --output-format=json)

ticks() { # the user+system clock ticks of the processes given
    local sum=0 pid
    for pid in "$@"; do sum=$((sum + $(awk '{print $14 + $15}' "/proc/$pid/stat"))); done
    echo "$sum"
}

report() { # BUILD CASE TICKS FIO_JSON
    python3 - "$@" <<'PY'
import json, os, sys
build, case, ticks, path = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
jobs = json.load(open(path))["jobs"]
ios = sum(j["read"]["total_ios"] + j["write"]["total_ios"] for j in jobs)
iops = sum(j["read"]["iops"] + j["write"]["iops"] for j in jobs)
side = jobs[0]["read"] if jobs[0]["read"]["total_ios"] else jobs[0]["write"]
p99 = side["clat_ns"]["percentile"]["99.000000"] / 1000
cpu = ticks * 1e6 / os.sysconf("SC_CLK_TCK") / ios
print(f"{build:10} {case:24} {iops:9.0f} IOPS  {cpu:6.1f} µs serving CPU/request  p99 {p99:5.0f} µs")
PY
}

one_case() { # BUILD DIR CASE FIO_ARGS...
    local build=$1 dir=$2 case=$3
    shift 3
    local engine worker before
    engine=$(pgrep -f "dpufs-engine --data-dir $dir/") worker=$(pgrep -f "dpufs-csi worker.*$dir/")
    before=$(ticks "$engine" "$worker")
    echo 3 >/proc/sys/vm/drop_caches
    fio "${COMMON[@]}" --directory="$dir/mnt" "$@" >"$dir.fio.json"
    report "$build" "$case" $(($(ticks "$engine" "$worker") - before)) "$dir.fio.json"
}

stop_stack() {
    pkill -INT -f "dpufs up --pool-size" || true
    for _ in $(seq 1 40); do pgrep -f "dpufs up --pool-size" >/dev/null || return 0; sleep 0.25; done
}

for round in $(seq 1 "$ROUNDS"); do
    for spec in "$@"; do
        build=${spec%%=*} bin=${spec#*=}
        dir=/tmp/dpufs-builds-$build
        stop_stack
        rm -rf "$dir" && mkdir -p "$dir"
        (cd "$dir" && setsid "$bin/dpufs" up --pool-size 8G >"$dir.log" 2>&1 &)
        for _ in $(seq 1 60); do mount | grep -q " $dir/mnt " && break; sleep 0.5; done
        mount | grep -q " $dir/mnt " || { echo "$build: no mount (see $dir.log)" >&2; exit 1; }
        echo "# round $round, $build ($bin)"
        fio --name=read --directory="$dir/mnt" --size="$SIZE" --rw=write --bs=1M --direct=1 \
            --numjobs=4 >/dev/null
        one_case "$build" "$dir" "$BLOCK $READ, 1 job" --name=read --rw=$READ --numjobs=1
        one_case "$build" "$dir" "$BLOCK $READ, 4 jobs" --name=read --rw=$READ --numjobs=4
        one_case "$build" "$dir" "$BLOCK $WRITE, 1 job" --name=w1 --rw=$WRITE --numjobs=1
        one_case "$build" "$dir" "$BLOCK $WRITE, 4 jobs" --name=w4 --rw=$WRITE --numjobs=4
        stop_stack
        # A stack's scratch directory holds gigabytes of chunk files.
        rm -rf "$dir"
    done
done
