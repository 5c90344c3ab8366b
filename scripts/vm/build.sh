#!/usr/bin/env bash
# Builds the test VM of issue 9: a Debian bookworm guest with the bookworm-backports kernel
# (6.12: ublk_drv, nbd, dm-cache, dm-writecache and bcache as modules), booted by qemu with
# software emulation (this machine's /dev/kvm cannot boot a stock kernel), whose whole root
# file system is its initramfs (no disk image to keep in sync). The host's tree is shared
# read-only over 9p at /host, so the guest runs the binary built here.
#
#   scripts/vm/build.sh [--dir DIR]      (default /var/tmp/tiercache-vm; about 600 MB)
#   scripts/vm/build.sh --with-db        (default /var/tmp/tiercache-vm-db: also MariaDB,
#                                         sysbench, FUSE and matplotlib, for bench/seeds.py)
#
# Produces DIR/vmlinuz and DIR/initrd.cpio; scripts/vm/run.sh boots them. Needs root, network
# access to deb.debian.org, and installs qemu-system-x86, mmdebstrap and cpio when missing.
set -euo pipefail
DIR=""; EXTRA=""
while [ $# -gt 0 ]; do
    case "$1" in
        --dir) DIR=$2; shift 2 ;;
        --with-db) EXTRA=",mariadb-server,sysbench,fuse3,python3-matplotlib"; shift ;;
        -h|--help) sed -n '2,14p' "$0"; exit 0 ;;
        *) echo "vm/build: unknown option $1" >&2; exit 2 ;;
    esac
done
[ -n "$DIR" ] || { [ -n "$EXTRA" ] && DIR=/var/tmp/tiercache-vm-db || DIR=/var/tmp/tiercache-vm; }
[ "$(id -u)" -eq 0 ] || { echo "vm/build: run as root" >&2; exit 1; }
apt_install() {
    for i in 1 2 3 4 5; do
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >/dev/null && return 0
        echo "vm/build: apt-get busy or failed (try $i); retrying" >&2; sleep 10
    done
    return 1
}
for p in qemu-system-x86 mmdebstrap cpio; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || apt_install "$p"
done
mkdir -p "$DIR"
cd "$DIR"
if [ -s vmlinuz ] && [ -s initrd.cpio ]; then
    echo "vm/build: $DIR already holds a VM (remove it to rebuild)"; exit 0
fi
APT=(-o Dir::Etc::SourceList="$DIR/bpo.list" -o Dir::Etc::SourceParts=/dev/null
     -o Dir::State::Lists="$DIR/lists" -o Dir::Cache::archives="$DIR/debs")
echo "deb http://deb.debian.org/debian bookworm-backports main" > bpo.list
mkdir -p lists/partial debs/partial
echo "vm/build: fetching the backports kernel"
apt-get "${APT[@]}" update -qq
# (The newest 6.12 kernel in backports: the exact version moves; take whatever is there.)
KPKG=$(apt-cache "${APT[@]}" search '^linux-image-6\.12\..*-amd64-unsigned$' | awk '{print $1}' | grep -v -e cloud -e rt | sort -V | tail -1)
[ -n "$KPKG" ] || { echo "vm/build: no 6.12 kernel in bookworm-backports" >&2; exit 1; }
rm -f ./*.deb
apt-get "${APT[@]}" download "$KPKG" 2>/dev/null
rm -rf kernel && mkdir kernel && dpkg-deb -x ./*.deb kernel
KV=$(ls kernel/lib/modules)
echo "vm/build: kernel $KV; building the root file system (mmdebstrap)"
rm -rf root && mkdir root
mmdebstrap --quiet --variant=minbase \
    --include=kmod,util-linux,e2fsprogs,nbd-client,fio,procps,python3,thin-provisioning-tools,bcache-tools,dmsetup$EXTRA \
    bookworm root http://deb.debian.org/debian
cp -a kernel/lib/modules root/lib/
chroot root /sbin/depmod "$KV"
cat > root/init <<'INIT'
#!/bin/sh
# The guest's init: mounts, the host tree at /host (read-only) and the results folder at /out,
# then runs the script named on the kernel command line (tc.run=PATH under /host) and powers
# off. Its exit code lands in /out/rc.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root
mount -t proc proc /proc; mount -t sysfs sys /sys; mount -t devtmpfs dev /dev
mkdir -p /dev/pts /dev/shm /tmp /run /host /out; mount -t devpts devpts /dev/pts
mount -t tmpfs tmpfs /tmp; mount -t tmpfs tmpfs /run
modprobe -a 9pnet_virtio 9p loop ext4 virtio_blk 2>/dev/null
# Loopback up (TCP tests on 127.0.0.1): SIOCSIFFLAGS with IFF_UP | IFF_LOOPBACK | IFF_RUNNING.
python3 -c "import socket,fcntl,struct; fcntl.ioctl(socket.socket(), 0x8914, struct.pack('16sh', b'lo', 0x49))"
mount -t 9p -o trans=virtio,version=9p2000.L,ro host /host
mount -t 9p -o trans=virtio,version=9p2000.L out /out
RUN=$(sed -n 's/.*tc\.run=\([^ ]*\).*/\1/p' /proc/cmdline)
echo "guest: $(uname -r), running /host/$RUN"
cd /host && sh "/host/$RUN" > /out/log 2>&1; echo $? > /out/rc
cat /out/log
sync; echo o > /proc/sysrq-trigger; sleep 5; poweroff -f
INIT
chmod +x root/init
cp "kernel/boot/vmlinuz-$KV" vmlinuz
echo "vm/build: packing the initramfs"
(cd root && find . | cpio -o -H newc --quiet) > initrd.cpio
rm -rf root kernel debs lists ./*.deb
echo "vm/build: done: $DIR/vmlinuz, $DIR/initrd.cpio ($(du -h initrd.cpio | cut -f1))"
