#!/bin/sh
# `tiercache bench fsync --through ublk` in the test VM: ext4 on /dev/ublkbN against ext4 on a
# loop device over a raw file, both on the virtio disk vda (ext4, mounted at /work).
set -eu
modprobe -a ublk_drv loop
mkfs.ext4 -q -F /dev/vda && mkdir -p /work && mount /dev/vda /work
/host/target/release/tiercache bench fsync --through ublk --dir /work --seconds "${SECONDS_TOTAL:-8}" --rounds 2
umount /work
