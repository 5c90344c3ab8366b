#!/usr/bin/env bash
# fsync rate measured inside ext4 mounted on the volume, through each frontend:
#
#   fuse-raw     ext4 on loop on `serve --passthrough FILE --fuse` (the raw cache file, same stack)
#   fuse-hybrid  ext4 on loop on `serve --fuse` (hybrid: cache FILE, backing emulated slow device)
#   nbd-hybrid   ext4 on loop on nbdfuse on `serve --nbd unix:` (the NBD frontend; this kernel has
#                no NBD module, so libnbd's nbdfuse turns the export into a file)
#
# In each, `tiercache bench fsync --target FILE-ON-EXT4` runs its loop (O_DIRECT and buffered
# rows). Usage: bench/fsync-in-ext4.sh [--seconds 5] [--slow usb-disk] [--workdir DIR]
# Needs root. Installs fuse3, libnbd-bin.
set -euo pipefail
cd "$(dirname "$0")/.."
SECS=5
SLOW=usb-disk
WORKDIR=/var/tmp/tiercache-fsync-ext4
while [ $# -gt 0 ]; do
    case "$1" in
        --seconds) SECS=$2; shift 2 ;;
        --slow) SLOW=$2; shift 2 ;;
        --workdir) WORKDIR=$2; shift 2 ;;
        -h|--help) sed -n '2,13p' "$0"; exit 0 ;;
        *) echo "fsync-in-ext4: unknown option $1" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" -eq 0 ] || { echo "fsync-in-ext4: run as root" >&2; exit 1; }
for p in fuse3 libnbd-bin e2fsprogs; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$p"
done
[ -x target/release/tiercache ] || cargo build --release
TC=$PWD/target/release/tiercache

PIDS=(); LOOP=""
cleanup() {
    set +e
    mountpoint -q "$WORKDIR/ext" && umount "$WORKDIR/ext"
    [ -n "$LOOP" ] && losetup -d "$LOOP"; LOOP=""
    for p in "${PIDS[@]}"; do kill -TERM "$p" 2>/dev/null; wait "$p" 2>/dev/null; done; PIDS=()
    for m in "$WORKDIR/nbdfuse" "$WORKDIR/fuse"; do mountpoint -q "$m" && umount -l "$m"; done
    set -e
}
trap cleanup EXIT

measure() { # name file-to-attach
    LOOP=$(losetup --direct-io=on --show -f "$2")
    mkfs.ext4 -q -E nodiscard "$LOOP"; mount "$LOOP" "$WORKDIR/ext"
    fallocate -l 64M "$WORKDIR/ext/fsync.img"
    dd if=/dev/zero of="$WORKDIR/ext/fsync.img" bs=4M count=16 conv=notrunc,fsync status=none
    echo "== $1"
    "$TC" bench fsync --seconds "$SECS" --target "$WORKDIR/ext/fsync.img" | sed 1d
    cleanup
}

rm -rf "$WORKDIR"; mkdir -p "$WORKDIR"/{fuse,nbdfuse,ext}
truncate -s 1G "$WORKDIR/raw.img"
dd if=/dev/zero of="$WORKDIR/raw.img" bs=4M count=256 conv=notrunc,fsync status=none
"$TC" serve --passthrough "$WORKDIR/raw.img" --fuse "$WORKDIR/fuse" 2>/dev/null & PIDS+=($!)
for _ in $(seq 100); do [ -e "$WORKDIR/fuse/volume" ] && break; sleep 0.1; done
measure "fuse-raw (raw cache file)" "$WORKDIR/fuse/volume"

truncate -s 1G "$WORKDIR/backing.img"
"$TC" create --cache "$WORKDIR/cache.img" --cache-size 512M --backing "emulated:$SLOW:$WORKDIR/backing.img" >/dev/null
"$TC" serve --cache "$WORKDIR/cache.img" --backing "emulated:$SLOW:$WORKDIR/backing.img" --fuse "$WORKDIR/fuse" 2>/dev/null & PIDS+=($!)
for _ in $(seq 100); do [ -e "$WORKDIR/fuse/volume" ] && break; sleep 0.1; done
measure "fuse-hybrid (cache file over emulated $SLOW)" "$WORKDIR/fuse/volume"

"$TC" create --force --cache "$WORKDIR/cache.img" --backing "emulated:$SLOW:$WORKDIR/backing.img" >/dev/null
"$TC" serve --cache "$WORKDIR/cache.img" --backing "emulated:$SLOW:$WORKDIR/backing.img" --nbd "unix:$WORKDIR/nbd.sock" 2>/dev/null & PIDS+=($!)
for _ in $(seq 100); do [ -e "$WORKDIR/nbd.sock" ] && break; sleep 0.1; done
nbdfuse "$WORKDIR/nbdfuse" "nbd+unix:///tiercache?socket=$WORKDIR/nbd.sock" & PIDS+=($!)
for _ in $(seq 100); do [ -e "$WORKDIR/nbdfuse/nbd" ] && break; sleep 0.1; done
measure "nbd-hybrid (same, through NBD and nbdfuse)" "$WORKDIR/nbdfuse/nbd"
