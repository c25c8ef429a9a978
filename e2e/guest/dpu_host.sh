# The host of a DPU, as the DPU-mode test (e2e/tests/dpu_mode.rs) runs it in a QEMU guest, run
# by busybox sh. The CSI node shim (`dpufs-csi node --mode dpu-host`) serves kubelet's socket and
# finds its DPU's agent through the API server (DPF's pairing label); `tcp-to-unix` lets the
# test, outside the guest, reach that socket through QEMU's port forward. Then the guest does
# what the test tells it, one command at a time: it opens a TCP connection to the test on the
# DPU's link, reads one line, runs it (only the functions below), and opens the next. Each
# command's RESULT lines start with its first argument, a label the test chose.
#
# Usage: sh dpu_host.sh DPU_ADDR COMMAND_PORT AGENT_PORT
set -u
DPU=$1
COMMAND_PORT=$2
AGENT_PORT=$3
CSI=/run/dpufs/csi.sock
mkdir -p /run/dpufs /var/lib/dpufs /var/lib/kubelet

sha() { sha256sum "$1" | cut -d' ' -f1; }
# The guest's pages go to the server, and the guest forgets what it cached: what is read next
# comes from the DPU.
flush() {
    sync
    echo 3 >/proc/sys/vm/drop_caches
}
# User and system CPU time of process $1, in clock ticks (USER_HZ, 100 on x86).
ticks() {
    # shellcheck disable=SC2046
    set -- $(cat "/proc/$1/stat")
    echo $((${14} + ${15}))
}
uptime_ms() { awk '{ printf "%d", $1 * 1000 }' /proc/uptime; }

start_shim() {
    rm -f $CSI
    KUBECONFIG=/etc/dpufs/kubeconfig RUST_LOG=info /bin/dpufs-csi node --mode dpu-host \
        --endpoint unix://$CSI --node-id host-1 --dpu-agent-port "$AGENT_PORT" \
        --tls-ca /etc/dpufs/ca.crt --tls-cert /etc/dpufs/host.crt --tls-key /etc/dpufs/host.key \
        --state-dir /var/lib/dpufs --mount-root /var/lib/kubelet 1>&2 &
    echo $! >/run/dpufs/shim.pid
    while [ ! -S $CSI ]; do
        # A shim that cannot start ends the guest (its error is on the console).
        kill -0 "$(cat /run/dpufs/shim.pid)" 2>/dev/null || exit 1
        sleep 0.1
    done
}

# mkdirs LABEL DIR...: what kubelet makes before it calls the plugin.
mkdirs() {
    label=$1
    shift
    mkdir -p "$@"
    echo "RESULT $label.made=$#"
}

# reach LABEL NAME=HOST:PORT...: whether a TCP connection to each address opens from here. An
# open connection is closed after 3 s (rc 137); a refused or unreachable one fails at once.
reach() {
    label=$1
    shift
    for target in "$@"; do
        name=${target%%=*}
        addr=${target#*=}
        timeout -s KILL 3 nc "${addr%:*}" "${addr##*:}" </dev/null >/dev/null 2>/tmp/nc.err
        echo "RESULT $label.$name=rc $? $(tr '\n' ' ' </tmp/nc.err)"
    done
}

# devices LABEL: the virtio-fs functions the guest's kernel has, and the tags mounted.
devices() {
    n=0
    for d in /sys/bus/virtio/devices/*; do
        [ "$(cat "$d/device" 2>/dev/null)" = 0x001a ] && n=$((n + 1))
    done
    echo "RESULT $1.virtiofs=$n"
    echo "RESULT $1.mounted=$(awk '$3 == "virtiofs" { print $1 }' /proc/mounts | sort -u | tr '\n' ' ')"
}

# manifest LABEL: every entry under the current directory, as `M LABEL type path [size sha]`.
manifest() {
    find . | sort | while read -r p; do
        if [ -d "$p" ]; then
            echo "M $1 d $p"
        else
            echo "M $1 f $p $(stat -c %s "$p") $(sha "$p")"
        fi
    done
}

# io LABEL DIR BLOB: the volume's files through the host's virtio-fs mount, with checksums from
# the DPU's side of the device (caches dropped before each read).
io() {
    label=$1
    cd "$2" || { echo "RESULT $label.error=cd $2"; return; }
    echo "RESULT $label.before=$(ls -A | tr '\n' ' ')"
    mkdir -p docs/sub
    cp "$3" docs/blob
    # Odd-sized writes: 7 of 65537 bytes.
    dd if="$3" of=docs/odd bs=65537 count=7 2>/dev/null
    echo "$label" >owner
    flush
    echo "RESULT $label.sha.blob=$(sha docs/blob)"
    echo "RESULT $label.sha.odd=$(sha docs/odd)"
    mv docs/odd docs/sub/odd.moved
    mv owner OWNER
    truncate -s 100000 docs/blob
    truncate -s 500000 docs/sub/odd.moved
    flush
    echo "RESULT $label.sha.shrunk=$(sha docs/blob)"
    echo "RESULT $label.sha.grown=$(sha docs/sub/odd.moved)"
    echo "RESULT $label.listing=$(ls -A | tr '\n' ' ')"
    manifest "$label"
    cd /
    echo "RESULT $label.done=1"
}

# read LABEL FILE: the file's checksum, from the server.
read_back() {
    flush
    echo "RESULT $1.sha=$(sha "$2" 2>&1)"
}

# loop LABEL DIR N: write_loop in the background (the guest takes commands meanwhile);
# LABEL.done when it is over.
loop() {
    write_loop "$@" &
}

# waiting LABEL: each dd, with its state and the kernel function it sleeps in (wchan).
waiting() {
    for p in /proc/[0-9]*; do
        [ "$(cat "$p/comm" 2>/dev/null)" = dd ] || continue
        echo "RESULT $1.dd${p#/proc/}=$(cut -d' ' -f3 "$p/stat") $(cat "$p/wchan")"
    done
}

# write_loop LABEL DIR N: N files of /data/chunk written one after the other (each synced), then read
# back; says which writes failed and how many files hold the chunk.
write_loop() {
    label=$1 dir=$2/loop n=$3
    mkdir -p "$dir"
    i=0 ok=0 failed=0
    start=$(uptime_ms)
    while [ $i -lt "$n" ]; do
        if timeout -s KILL 60 dd if=/data/chunk of="$dir/$i" bs=65536 conv=fsync 2>/tmp/dd.err; then
            ok=$((ok + 1))
        else
            failed=$((failed + 1))
            echo "RESULT $label.failed.$i=$(tr '\n' ' ' </tmp/dd.err)"
        fi
        [ $i -eq 4 ] && echo "RESULT $label.started=1"
        i=$((i + 1))
    done
    echo "RESULT $label.ms=$(($(uptime_ms) - start))"
    flush
    want=$(sha /data/chunk)
    intact=0
    for f in "$dir"/*; do
        [ "$(sha "$f")" = "$want" ] && intact=$((intact + 1))
    done
    echo "RESULT $label.ok=$ok"
    echo "RESULT $label.failures=$failed"
    echo "RESULT $label.intact=$intact"
    echo "RESULT $label.done=1"
}

# cpu LABEL DIR MIB: MIB MiB written (synced) and read back through the mount, with the
# shim's CPU time over the run.
cpu() {
    label=$1 file=$2/cpu.dat mib=$3
    pid=$(cat /run/dpufs/shim.pid)
    before=$(ticks "$pid")
    start=$(uptime_ms)
    dd if=/dev/zero of="$file" bs=1048576 count="$mib" conv=fsync 2>/dev/null
    flush
    dd if="$file" of=/dev/null bs=1048576 2>/dev/null
    echo "RESULT $label.ms=$(($(uptime_ms) - start))"
    echo "RESULT $label.shim_ticks=$(($(ticks "$pid") - before))"
    echo "RESULT $label.bytes=$((2 * mib * 1048576))"
    rm -f "$file"
}

# restart_shim LABEL: kill -9 of the shim, and a new one.
restart_shim() {
    old=$(cat /run/dpufs/shim.pid)
    kill -9 "$old"
    start_shim
    echo "RESULT $1.old=$old"
    echo "RESULT $1.new=$(cat /run/dpufs/shim.pid)"
}

# The shim refuses a key others may read; files in the initramfs are 0644.
chmod 600 /etc/dpufs/host.key
start_shim
/bin/tcp-to-unix 0.0.0.0:10000 $CSI 1>&2 &
# QEMU's port forward accepts the test's connection whether or not the relay listens, and
# resets it when nothing does: "booted" waits for the listening socket (port 10000 is 2710).
until awk '$2 ~ /:2710$/ && $4 == "0A" { found = 1 } END { exit !found }' /proc/net/tcp; do
    sleep 0.05
done
echo "RESULT booted=$(uptime_ms)"
while :; do
    line=$(nc "$DPU" "$COMMAND_PORT" </dev/null) || { sleep 0.2; continue; }
    # shellcheck disable=SC2086
    set -- $line
    case ${1:-} in
    mkdirs | reach | devices | io | read_back | loop | waiting | cpu | restart_shim)
        cmd=$1
        shift
        "$cmd" "$@"
        echo "RESULT $1.end=$(uptime_ms)"
        ;;
    quit) break ;;
    *) echo "RESULT unknown=$line" ;;
    esac
done
