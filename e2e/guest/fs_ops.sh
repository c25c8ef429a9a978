# The differential file-system script (e2e/tests/virtiofs_guest.rs), run by busybox sh in a QEMU
# guest on a virtio-fs mount. Whatever serves the mount, its transcript must be the same: it
# prints what the operations did (output, errors, exit status), sizes, types, names and
# checksums of contents, never times, inode numbers, link counts or owners.
#
# Usage: sh fs_ops.sh MOUNTPOINT. Test data: /data/one (1 B), /data/page (4 KiB), /data/big
# (1 MiB + 4099 B). `RESULT key=value` lines are what the test checks against the data itself.
set -u
cd "$1" || exit 1

# Prints the command, its output and errors, and its exit status.
run() {
    echo "\$ $*"
    "$@" 2>&1
    echo "[rc=$?]"
}
sha() { sha256sum "$1" | cut -d' ' -f1; }
# RESULT lines with the size and the checksum of file $1, keyed $2.
measure() {
    echo "RESULT size.$2=$(stat -c %s "$1")"
    echo "RESULT sha.$2=$(sha "$1")"
}
# Written pages go to the server, and the guest forgets its cached pages, names and
# attributes: what is read next comes from the server.
flush() {
    sync
    echo 3 >/proc/sys/vm/drop_caches
}
# `ls -la` with what may differ between servers left out: link counts, owners, times, and the
# sizes of directories (file-system specific).
ls_la() {
    ls -la "$@" | awk '/^total/ { next }
        { size = ($1 ~ /^d/) ? "-" : $5; name = $9; for (i = 10; i <= NF; i++) name = name " " $i
          print $1, size, name }'
}

echo "== write: 0 B, 1 B, 4 KiB, 1 MiB + 4099 B"
run touch empty
run cp /data/one one
run cp /data/page page
run cp /data/big big
# Odd-sized writes: 16 of 65537 bytes and a short last one.
dd if=/data/big of=big.dd bs=65537 2>/dev/null
echo "dd bs=65537: rc=$?"
for f in empty one page big big.dd; do measure "$f" "$f.cached"; done
flush

echo "== read back from the server"
for f in empty one page big big.dd; do measure "$f" "$f"; done
echo "RESULT sha.big.piece=$(dd if=big bs=4097 skip=3 count=5 2>/dev/null | sha256sum | cut -d' ' -f1)"

echo "== overwrite in place"
printf XYZ | dd of=page bs=1 seek=100 conv=notrunc 2>/dev/null
flush
measure page page.patched

echo "== append"
echo first >log
echo second >>log
run cat log
cat /data/one >>log
printf tail >>log
flush
measure log log

echo "== truncate"
run truncate -s 1000 big.dd
flush
measure big.dd shrunk
run truncate -s 20000 big.dd
flush
measure big.dd grown
echo "RESULT nonzero-after-1000.grown=$(dd if=big.dd bs=1000 skip=1 2>/dev/null | tr -d '\000' | wc -c)"
cp page page.copy
: >page.copy
flush
measure page.copy truncated-on-open

echo "== directories"
run mkdir -p a/b/c
run mkdir a
run rmdir a/b
run rmdir a/b/c
run rmdir missing
run mkdir d2
run ls_la a

echo "== rename"
run mv one a/one.moved
echo target >target
echo source >source
run mv -f source target
run cat target
run cat source
run mv a/b d2/b.moved
run mv page.copy d2/b.moved/
run mv missing elsewhere
flush
run ls_la d2/b.moved

echo "== symbolic links"
run ln -s a/one.moved link
run readlink link
echo "RESULT sha.link=$(sha link)"
run ln -s nowhere dangling
run readlink dangling
run cat dangling
run ln -s elsewhere link

echo "== unlink"
run rm big.dd
run rm big.dd
exec 3<big
run rm big
run cat big
flush
echo "big, read through a descriptor opened before its unlink:"
run sha256sum <&3
exec 3<&-

echo "== stat"
run stat -c %s missing
run stat -c '%s %F' empty
run stat -c '%F' a
run stat -c '%s %F' link

echo "== ls -la"
run ls_la .

echo "== sync"
run sync

echo "== manifest"
flush
find . | sort | while read -r p; do
    if [ -L "$p" ]; then
        echo "M l $p -> $(readlink "$p")"
    elif [ -d "$p" ]; then
        echo "M d $p"
    else
        echo "M f $p $(stat -c %s "$p") $(sha "$p")"
    fi
done
echo "== end"
