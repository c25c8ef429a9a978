#!/usr/bin/env bash
# Comparison peers for `dpufs bench`: MooseFS and GlusterFS from Debian's packages, each on
# this one machine with replication 1, set up in a scratch directory and torn down again.
#
#   bench/peers.sh up   SCRATCH     # install if needed, start both, print NAME=MOUNT lines
#   bench/peers.sh down SCRATCH     # unmount, stop daemons, remove the network namespace
#
# Both refuse plain loopback: MooseFS rejects any 127.x address for its master and chunk
# servers, and the gluster CLI rejects 127.0.0.1 as a brick host. So:
# - MooseFS gets its own test host: a network namespace `dpufs-mfs` joined to this one by a
#   veth pair (10.213.0.1 here, 10.213.0.2 there). Master and chunk server run inside it; the
#   client mount (mfsmount) runs here and reaches the master over the veth.
# - GlusterFS uses the machine's hostname as brick host (one brick, FUSE mount).
#
# Durability matches the dpufs protocol (fio end_fsync=1 must reach the disk): the MooseFS
# chunk server fsyncs chunks before close (HDD_FSYNC_BEFORE_CLOSE = 1) and gluster's posix
# brick honours fsync by default. Everything else is left at the packages' defaults; the
# tuning that matters for the comparison is written below where it is set.
set -Eeuo pipefail

NS=dpufs-mfs
HOST_IP=10.213.0.1
NS_IP=10.213.0.2
GLUSTER_VOL=dpufsbench

log() { echo "peers: $*" >&2; }

install_packages() {
    local missing=()
    for p in moosefs-master moosefs-chunkserver moosefs-client glusterfs-server glusterfs-client iproute2; do
        dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
    done
    if ((${#missing[@]})); then
        log "installing ${missing[*]}"
        DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}" >/dev/null
    fi
}

wait_for() { # wait_for SECONDS DESCRIPTION COMMAND...
    local secs=$1 what=$2
    shift 2
    for _ in $(seq $((secs * 10))); do
        "$@" >/dev/null 2>&1 && return 0
        sleep 0.1
    done
    log "timed out waiting for $what"
    return 1
}

moosefs_up() {
    local dir=$1/moosefs
    mkdir -p "$dir"/{master,chunks,mnt}
    ip netns add "$NS"
    ip link add dpufs-mfs0 type veth peer name dpufs-mfs1
    ip link set dpufs-mfs1 netns "$NS"
    ip addr add "$HOST_IP/30" dev dpufs-mfs0
    ip link set dpufs-mfs0 up
    ip netns exec "$NS" ip addr add "$NS_IP/30" dev dpufs-mfs1
    ip netns exec "$NS" ip link set dpufs-mfs1 up
    ip netns exec "$NS" ip link set lo up

    cp /var/lib/mfs/metadata.mfs.empty "$dir/master/metadata.mfs"
    cat >"$dir/mfsexports.cfg" <<EOF
* / rw,alldirs,maproot=0
EOF
    cat >"$dir/mfsmaster.cfg" <<EOF
WORKING_USER = root
WORKING_GROUP = root
DATA_PATH = $dir/master
EXPORTS_FILENAME = $dir/mfsexports.cfg
MATOML_LISTEN_HOST = $NS_IP
MATOCS_LISTEN_HOST = $NS_IP
MATOCL_LISTEN_HOST = $NS_IP
EOF
    echo "$dir/chunks" >"$dir/mfshdd.cfg"
    cat >"$dir/mfschunkserver.cfg" <<EOF
WORKING_USER = root
WORKING_GROUP = root
DATA_PATH = $dir/chunks
HDD_CONF_FILENAME = $dir/mfshdd.cfg
MASTER_HOST = $NS_IP
BIND_HOST = $NS_IP
CSSERV_LISTEN_HOST = $NS_IP
# Same durability as dpufs: a chunk is on disk before close/fsync returns.
HDD_FSYNC_BEFORE_CLOSE = 1
EOF
    ip netns exec "$NS" mfsmaster -c "$dir/mfsmaster.cfg" start >"$dir/master.log" 2>&1
    ip netns exec "$NS" mfschunkserver -c "$dir/mfschunkserver.cfg" start >"$dir/chunkserver.log" 2>&1
    wait_for 30 "the MooseFS master" bash -c "exec 3<>/dev/tcp/$NS_IP/9421"
    mfsmount "$dir/mnt" -H "$NS_IP" >"$dir/mount.log" 2>&1
    # Replication 1, like the single dpufs engine and the single gluster brick.
    mfssetgoal -r 1 "$dir/mnt" >/dev/null
    # The chunk server must have registered before the first write.
    wait_for 60 "the MooseFS chunk server" bash -c "echo probe >'$dir/mnt/.probe' && rm '$dir/mnt/.probe'"
    echo "moosefs=$dir/mnt"
}

moosefs_down() {
    local dir=$1/moosefs
    if mountpoint -q "$dir/mnt" 2>/dev/null; then umount "$dir/mnt" || umount -l "$dir/mnt"; fi
    if ip netns list 2>/dev/null | grep -qw "$NS"; then
        [[ -f $dir/mfschunkserver.cfg ]] && ip netns exec "$NS" mfschunkserver -c "$dir/mfschunkserver.cfg" stop >/dev/null 2>&1 || true
        [[ -f $dir/mfsmaster.cfg ]] && ip netns exec "$NS" mfsmaster -c "$dir/mfsmaster.cfg" stop >/dev/null 2>&1 || true
        ip netns pids "$NS" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        ip netns del "$NS"
    fi
    ip link del dpufs-mfs0 2>/dev/null || true
    rm -rf "$dir"
}

glusterfs_up() {
    local dir=$1/glusterfs host
    host=$(hostname)
    mkdir -p "$dir"/{brick,mnt}
    pgrep -x glusterd >/dev/null || glusterd --log-file="$dir/glusterd.log"
    wait_for 30 "glusterd" gluster --mode=script pool list
    # `force`: the brick sits on the root file system, which gluster warns about.
    gluster --mode=script volume create "$GLUSTER_VOL" "$host:$dir/brick" force >/dev/null
    gluster --mode=script volume start "$GLUSTER_VOL" >/dev/null
    wait_for 30 "the gluster mount" mount -t glusterfs "$host:/$GLUSTER_VOL" "$dir/mnt"
    echo "glusterfs=$dir/mnt"
}

glusterfs_down() {
    local dir=$1/glusterfs
    if mountpoint -q "$dir/mnt" 2>/dev/null; then umount "$dir/mnt" || umount -l "$dir/mnt"; fi
    if pgrep -x glusterd >/dev/null; then
        gluster --mode=script volume stop "$GLUSTER_VOL" force >/dev/null 2>&1 || true
        gluster --mode=script volume delete "$GLUSTER_VOL" >/dev/null 2>&1 || true
        pkill -x glusterd || true
        pkill -x glusterfsd || true
        pkill -f "glusterfs.*$GLUSTER_VOL" || true
        wait_for 20 "gluster to stop" bash -c '! pgrep -x "glusterd|glusterfsd"'
    fi
    rm -rf "$dir"
}

main() {
    local cmd=${1:-} scratch=${2:-}
    if [[ -z $cmd || -z $scratch ]]; then
        echo "usage: $0 up|down SCRATCH_DIR" >&2
        exit 2
    fi
    [[ $(id -u) == 0 ]] || { echo "peers: must run as root (mounts, network namespaces)" >&2; exit 1; }
    mkdir -p "$scratch"
    scratch=$(cd "$scratch" && pwd)
    case $cmd in
    up)
        install_packages
        # A failed start must not leave half a setup behind.
        trap 'moosefs_down "$scratch"; glusterfs_down "$scratch"' ERR
        moosefs_up "$scratch"
        glusterfs_up "$scratch"
        trap - ERR
        ;;
    down)
        moosefs_down "$scratch"
        glusterfs_down "$scratch"
        ;;
    *)
        echo "usage: $0 up|down SCRATCH_DIR" >&2
        exit 2
        ;;
    esac
}

main "$@"
