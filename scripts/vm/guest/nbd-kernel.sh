#!/bin/sh
# The kernel's NBD client against `tiercache serve --nbd`, in the test VM: nbd-client attaches
# /dev/nbd0 over a Unix socket (and over TCP on loopback), ext4 on it, files written and
# synced; the device detached and the server stopped (SIGTERM); a new server, attached again,
# the files intact. Then a SIGKILLed server: the synced files survive its restart.
set -eu
T=/host/target/release/tiercache
modprobe -a nbd virtio_blk
# Loopback up (the VM's init does it too; a VM built before that did not).
python3 -c "import socket,fcntl,struct; fcntl.ioctl(socket.socket(), 0x8914, struct.pack('16sh', b'lo', 0x49))"
fail() { echo "nbd-kernel: FAILED: $*"; exit 1; }
# On any failure: what the server said, and the kernel's view of the connection.
trap 'rc=$?; [ $rc = 0 ] || { echo "--- serve log"; tail -40 /tmp/serve.log; echo "--- dmesg"; dmesg | tail -20; }' EXIT
serve() { rm -f /run/tc.sock; $T serve --cache /dev/vda --backing /dev/vdb --nbd unix:/run/tc.sock --nbd tcp:10809 2>>/tmp/serve.log & S=$!
          for i in $(seq 100); do [ -S /run/tc.sock ] && break; sleep 0.2; done; }
$T create --cache /dev/vda --backing /dev/vdb --force >/dev/null 2>&1
serve
nbd-client -unix /run/tc.sock /dev/nbd0 -N tiercache -b 4096 >/dev/null || fail "nbd-client over the Unix socket"
mkfs.ext4 -q -F /dev/nbd0
mkdir -p /mnt/n && mount /dev/nbd0 /mnt/n
for i in 1 2 3 4; do head -c 2097152 /dev/urandom > /mnt/n/f$i; done
sync -f /mnt/n/f4
sha=$(cat /mnt/n/f* | sha256sum)
umount /mnt/n; nbd-client -d /dev/nbd0 >/dev/null
kill -TERM $S; wait $S || fail "serve exited non-zero at SIGTERM"
echo "nbd-kernel: ext4 written over a Unix socket, detached, server stopped cleanly"
serve
nbd-client 127.0.0.1 10809 /dev/nbd0 -N tiercache -b 4096 >/dev/null || fail "nbd-client over TCP"
mount /dev/nbd0 /mnt/n
[ "$(cat /mnt/n/f* | sha256sum)" = "$sha" ] || fail "files differ after the restart"
head -c 1048576 /dev/urandom > /mnt/n/g; sync -f /mnt/n/g
sha=$(cat /mnt/n/f* /mnt/n/g | sha256sum)
echo "nbd-kernel: files intact over TCP after a restart; SIGKILL to the server"
kill -9 $S; wait $S 2>/dev/null || true
# Detach first: the kernel then fails the requests the dead server will never answer. An
# unmount first would sync the file system into a device that never replies, and hang
# whenever ext4 still had a journal commit in flight (it did, once in CI).
nbd-client -d /dev/nbd0 >/dev/null 2>&1 || true; umount -l /mnt/n 2>/dev/null || true
serve
nbd-client -unix /run/tc.sock /dev/nbd1 -N tiercache -b 4096 >/dev/null || fail "reattach after SIGKILL"
mount /dev/nbd1 /mnt/n
[ "$(cat /mnt/n/f* /mnt/n/g | sha256sum)" = "$sha" ] || fail "synced files lost at SIGKILL"
umount /mnt/n; nbd-client -d /dev/nbd1 >/dev/null
kill -TERM $S; wait $S || fail "serve exited non-zero"
echo "nbd-kernel: synced files survived SIGKILL; ok"
