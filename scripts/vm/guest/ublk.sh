#!/bin/sh
# ublk interop (issue 9), in the test VM: ext4 on /dev/ublkb0 served by `tiercache serve
# --ublk`; files written and fsynced; the server killed with SIGKILL and restarted with the
# same --ublk-id (user recovery) while the file system stays mounted, after another volume was
# refused the device; the files intact, and new writes work; then SIGTERM removes the device. Disks: vda (cache), vdb (backing).
set -eu
T=/host/target/release/tiercache
modprobe -a ublk_drv virtio_blk; udevadm settle 2>/dev/null || sleep 1
fail() { echo "ublk: FAILED: $*"; exit 1; }
$T create --cache /dev/vda --backing /dev/vdb --force >/dev/null 2>&1 || $T create --cache /dev/vda --backing /dev/vdb >/dev/null
$T serve --cache /dev/vda --backing /dev/vdb --ublk --ublk-id 0 --control /run/tc.sock 2>/tmp/serve1.log &
S=$!
for i in $(seq 100); do [ -b /dev/ublkb0 ] && break; sleep 0.2; done
[ -b /dev/ublkb0 ] || { cat /tmp/serve1.log; fail "no /dev/ublkb0"; }
echo "ublk: device up: $(cat /sys/block/ublkb0/queue/logical_block_size)-byte blocks, write cache: $(cat /sys/block/ublkb0/queue/write_cache), fua: $(cat /sys/block/ublkb0/queue/fua 2>/dev/null)"
mkfs.ext4 -q -F /dev/ublkb0
mkdir -p /mnt/u && mount /dev/ublkb0 /mnt/u
for i in 1 2 3 4 5 6 7 8; do
    head -c 1048576 /dev/urandom > /mnt/u/f$i
done
sync -f /mnt/u/f8
sha=$(cat /mnt/u/f* | sha256sum)
# A second server on the live device's number is refused, and the device stays.
$T create --cache emulated:optane:/tmp/c2 --cache-size 64M --backing emulated:optane:/tmp/b2 >/dev/null 2>&1 ||
    { truncate -s 256M /tmp/b2; $T create --cache emulated:optane:/tmp/c2 --cache-size 64M --backing emulated:optane:/tmp/b2 >/dev/null; }
if timeout 60 $T serve --cache emulated:optane:/tmp/c2 --backing emulated:optane:/tmp/b2 --ublk --ublk-id 0 --control /run/other.sock 2>/tmp/other.log; then
    fail "a second server took the live device"
fi
grep -q "served by another running server" /tmp/other.log || { cat /tmp/other.log; fail "no in-use message"; }
[ "$(cat /mnt/u/f* | sha256sum)" = "$sha" ] || fail "the live device changed under the second server"
echo "ublk: a second server was refused the live device; it still serves"
echo "ublk: 8 files written and synced; SIGKILL to the server"
kill -9 $S; wait $S 2>/dev/null || true
state=$(cat /sys/block/ublkb0/size 2>/dev/null || echo gone)
echo "ublk: after SIGKILL /dev/ublkb0 is ${state:+present}"
[ -b /dev/ublkb0 ] || fail "the device went away with the server"
# A write from the file system while no server runs: queued, not failed.
( echo queued > /mnt/u/while-down; sync -f /mnt/u/while-down; echo "ublk: the write made while the server was down completed" ) &
W=$!
sleep 1
# Another volume must not take over the device (its mounted file system is the first's).
if timeout 60 $T serve --cache emulated:optane:/tmp/c2 --backing emulated:optane:/tmp/b2 --ublk --ublk-id 0 --control /run/other.sock 2>/tmp/other.log; then
    fail "another volume re-attached to /dev/ublkb0"
fi
grep -q "refusing to re-attach" /tmp/other.log || { cat /tmp/other.log; fail "no refusal message"; }
echo "ublk: another volume was refused the device: $(tail -1 /tmp/other.log | cut -c1-100)"
# (One queue where the device has one per core: recovery keeps the device's own.)
$T serve --cache /dev/vda --backing /dev/vdb --ublk --ublk-id 0 --ublk-queues 1 --control /run/tc.sock 2>/tmp/serve2.log &
S=$!
for i in $(seq 150); do grep -q "serving" /tmp/serve2.log && break; sleep 0.2; done
grep -q "re-attaching" /tmp/serve2.log || { cat /tmp/serve2.log; fail "the restarted server did not re-attach (user recovery)"; }
wait $W || fail "the queued write failed"
echo 3 > /proc/sys/vm/drop_caches
[ "$(cat /mnt/u/f* | sha256sum)" = "$sha" ] || fail "files differ after the restart"
[ "$(cat /mnt/u/while-down)" = queued ] || fail "the write made while down is missing"
dd if=/dev/urandom of=/mnt/u/after bs=1M count=4 conv=fsync status=none
echo "ublk: files intact after SIGKILL and re-attach; new writes work"
# SIGTERM while mounted: the server keeps serving and says why.
kill -TERM $S; sleep 3
kill -0 $S 2>/dev/null || fail "the server stopped with the file system still mounted"
grep -q "not stopping: the device is in use" /tmp/serve2.log || { cat /tmp/serve2.log; fail "no in-use message at SIGTERM"; }
echo "ublk: SIGTERM with the file system mounted: still serving, and said why"
umount /mnt/u
kill -TERM $S; wait $S || fail "serve exited non-zero at SIGTERM"
[ -b /dev/ublkb0 ] && fail "SIGTERM left /dev/ublkb0 behind"
$T check --cache /dev/vda --backing /dev/vdb >/dev/null 2>&1 || echo "ublk: (check reported something; see below)"
echo "ublk: SIGTERM removed the device; ok"
