#!/usr/bin/env bash
# Boots the test VM (scripts/vm/build.sh) and runs one script of this tree inside it:
#
#   scripts/vm/run.sh [--dir DIR] [--mem MiB] [--disk NAME:SIZE[:IOPS]].. SCRIPT [--out DIR]
#
# SCRIPT is a path relative to the repository root (the guest sees the tree read-only at /host,
# and a results folder at /out); each --disk adds a virtio disk (/dev/vda, /dev/vdb, ... in
# order) backed by a sparse file of SIZE, throttled by qemu to IOPS requests per second if
# given (a slow disk). Prints the guest's console, and exits with SCRIPT's
# exit code (or 99 if the guest never ran it). qemu runs with software emulation (TCG).
set -euo pipefail
cd "$(dirname "$0")/../.."
DIR=/var/tmp/tiercache-vm; MEM=3072; OUT=""; DISKS=(); SCRIPT=""
while [ $# -gt 0 ]; do
    case "$1" in
        --dir) DIR=$2; shift 2 ;;
        --mem) MEM=$2; shift 2 ;;
        --disk) DISKS+=("$2"); shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        -h|--help) sed -n '2,9p' "$0"; exit 0 ;;
        *) SCRIPT=$1; shift ;;
    esac
done
[ -n "$SCRIPT" ] && [ -f "$SCRIPT" ] || { echo "vm/run: no script $SCRIPT in $(pwd)" >&2; exit 2; }
[ -s "$DIR/vmlinuz" ] || { echo "vm/run: no VM in $DIR: run scripts/vm/build.sh first" >&2; exit 2; }
KEEP=1; [ -n "$OUT" ] || KEEP=0
OUT=${OUT:-$(mktemp -d /var/tmp/tiercache-vm-out.XXXXXX)}
mkdir -p "$OUT"; rm -f "$OUT/rc"
ARGS=()
for d in "${DISKS[@]}"; do
    IFS=: read -r name size iops <<< "$d"
    f="$OUT/disk-$name.img"; truncate -s "$size" "$f"
    ARGS+=(-drive "file=$f,format=raw,if=virtio,cache=none,aio=threads${iops:+,throttling.iops-total=$iops}")
done
# A guest that has not started the script within BOOT_WAIT seconds (a boot that hangs under
# TCG, about 1 in 10 here) is killed and booted again, up to 3 times; a script that hangs is
# a failure after VM_TIMEOUT seconds.
QEMU=(qemu-system-x86_64 -machine q35 -accel tcg -cpu max -smp 2 -m "$MEM" -nographic -no-reboot
      -kernel "$DIR/vmlinuz" -initrd "$DIR/initrd.cpio" -append "console=ttyS0 rdinit=/init quiet tc.run=$SCRIPT"
      -virtfs "local,path=$(pwd),mount_tag=host,security_model=none,readonly=on"
      -virtfs "local,path=$OUT,mount_tag=out,security_model=none" "${ARGS[@]}")
for attempt in 1 2 3; do
    rm -f "$OUT/log" "$OUT/rc"
    setsid timeout "${VM_TIMEOUT:-900}" "${QEMU[@]}" </dev/null > "$OUT/console" 2>&1 &
    qemu=$!
    for _ in $(seq "${BOOT_WAIT:-120}"); do
        [ -e "$OUT/log" ] || ! kill -0 "$qemu" 2>/dev/null && break
        sleep 1
    done
    if [ -e "$OUT/log" ]; then
        wait "$qemu" || true
        break
    fi
    kill -- -"$qemu" 2>/dev/null || true
    wait "$qemu" 2>/dev/null || true
    echo "vm/run: the guest did not start $SCRIPT (attempt $attempt); booting again" >&2
done
grep -v -e '^\s*$' -e 'SeaBIOS' -e 'iPXE' -e 'Booting from' "$OUT/console" | tr -d '\r' || true
rc=$(cat "$OUT/rc" 2>/dev/null || echo 99)
if [ "$rc" = 0 ] && [ "$KEEP" = 0 ]; then
    rm -rf "$OUT"; echo "vm/run: $SCRIPT exited 0"
else
    echo "vm/run: $SCRIPT exited $rc (results and disks in $OUT)"
fi
exit "$rc"
