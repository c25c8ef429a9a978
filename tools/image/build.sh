#!/usr/bin/env bash
# Builds the dpufs OCI image without any registry: the four release binaries (dpufs,
# dpufs-csi, dpufs-engine, dpufs-operator) on a small Debian bookworm root file system with
# fuse3, made by mmdebstrap from Debian's packages and packed as an OCI layout by umoci.
#
#   tools/image/build.sh [OUT_DIR]        # default target/image
#
# Writes OUT_DIR/dpufs-<version>.oci.tar (an OCI image layout archive, loadable with
# `ctr -n k8s.io images import OUT_DIR/dpufs-<version>.oci.tar` or `podman load`) and prints
# the image's size. Reproducible: package versions come from the apt sources of this
# machine, every timestamp is SOURCE_DATE_EPOCH (the last commit's time by default), so two
# builds of one commit on one package snapshot give the same layer digest.
#
# Needs root (mmdebstrap's root mode and file ownership in the image), mmdebstrap and umoci
# (apt-get install mmdebstrap umoci). The user in the image is `dpufs` (uid 10001) for the
# operator and the controller; the node plugin's pod runs as root, privileged (docs/deploy.md).
set -euo pipefail
cd "$(dirname "$0")/../.."

OUT=${1:-target/image}
SUITE=bookworm
BINARIES=(dpufs dpufs-csi dpufs-engine dpufs-operator)
UID_DPUFS=10001

for tool in mmdebstrap umoci; do
  command -v "$tool" >/dev/null || {
    echo "tools/image/build.sh needs $tool: apt-get install mmdebstrap umoci" >&2
    exit 1
  }
done
if [ "$(id -u)" != 0 ]; then
  echo "tools/image/build.sh runs as root (mmdebstrap --mode=root, file ownership)" >&2
  exit 1
fi

VERSION=$(cargo metadata --no-deps --format-version 1 --locked |
  python3 -c 'import json,sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"]=="dpufs"))')
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-$(git log -1 --format=%ct)}
TAG="$VERSION"

echo "=== cargo build --release (${BINARIES[*]})"
cargo build --release --locked -p dpufs -p dpufs-csi -p dpufs-engine -p dpufs-operator

WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
ROOTFS="$WORK/rootfs"

echo "=== mmdebstrap $SUITE (essential + fuse3, libssl3, ca-certificates)"
# No documentation, manual pages or locales in the image.
mmdebstrap --quiet --mode=root --variant=essential --format=directory \
  --include=fuse3,libssl3,ca-certificates \
  --dpkgopt='path-exclude=/usr/share/doc/*' \
  --dpkgopt='path-include=/usr/share/doc/*/copyright' \
  --dpkgopt='path-exclude=/usr/share/man/*' \
  --dpkgopt='path-exclude=/usr/share/locale/*' \
  --dpkgopt='path-exclude=/usr/share/info/*' \
  "$SUITE" "$ROOTFS"

# Stripped: the release profile keeps line tables for backtraces, which are most of a
# binary's size and of no use without the sources.
for b in "${BINARIES[@]}"; do
  install -m 0755 --strip "target/release/$b" "$ROOTFS/usr/local/bin/$b"
done
echo "dpufs:x:$UID_DPUFS:$UID_DPUFS:dpufs:/nonexistent:/usr/sbin/nologin" >>"$ROOTFS/etc/passwd"
echo "dpufs:x:$UID_DPUFS:" >>"$ROOTFS/etc/group"
# Files mmdebstrap writes with the build's time or machine.
rm -f "$ROOTFS/etc/machine-id" "$ROOTFS/etc/hostname" "$ROOTFS/var/cache/ldconfig/aux-cache"
rm -rf "$ROOTFS/var/log/"* "$ROOTFS/var/cache/debconf/"*-old
find "$ROOTFS" -newermt "@$SOURCE_DATE_EPOCH" -print0 |
  xargs -0r touch --no-dereference --date="@$SOURCE_DATE_EPOCH"

echo "=== umoci: OCI layout"
LAYOUT="$WORK/layout"
umoci init --layout "$LAYOUT"
umoci new --image "$LAYOUT:$TAG"
umoci unpack --image "$LAYOUT:$TAG" "$WORK/bundle" >/dev/null
rm -rf "$WORK/bundle/rootfs"
mv "$ROOTFS" "$WORK/bundle/rootfs"
CREATED=$(date -u -d "@$SOURCE_DATE_EPOCH" +%Y-%m-%dT%H:%M:%SZ)
umoci repack --image "$LAYOUT:$TAG" \
  --history.created "$CREATED" --history.author dpufs \
  --history.created_by "tools/image/build.sh: Debian $SUITE (mmdebstrap) and ${BINARIES[*]}" \
  "$WORK/bundle"
umoci config --no-history --image "$LAYOUT:$TAG" \
  --created "$CREATED" --author dpufs \
  --config.user "$UID_DPUFS:$UID_DPUFS" \
  --config.entrypoint /usr/local/bin/dpufs-csi \
  --config.workingdir / \
  --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --config.label "org.opencontainers.image.version=$VERSION" \
  --config.label "org.opencontainers.image.title=dpufs"
umoci gc --layout "$LAYOUT"

mkdir -p "$OUT"
ARCHIVE="$OUT/dpufs-$VERSION.oci.tar"
tar --sort=name --mtime="@$SOURCE_DATE_EPOCH" --owner=0 --group=0 --numeric-owner \
  -C "$LAYOUT" -cf "$ARCHIVE" .
manifest=$(python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["manifests"][0]["digest"])' "$LAYOUT/index.json")
layers=$(python3 - "$LAYOUT" "$manifest" <<'EOF'
import json, sys
layout, digest = sys.argv[1], sys.argv[2]
m = json.load(open(f"{layout}/blobs/{digest.replace(':', '/')}"))
print(sum(l["size"] for l in m["layers"]))
EOF
)
unpacked=$(du -sb "$WORK/bundle/rootfs" | cut -f1)
echo "image dpufs:$TAG → $ARCHIVE"
echo "  manifest $manifest"
echo "  compressed layers $((layers / 1024 / 1024)) MiB, unpacked $((unpacked / 1024 / 1024)) MiB"
echo "load it: ctr -n k8s.io images import --base-name docker.io/library/dpufs $ARCHIVE"
