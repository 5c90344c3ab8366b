#!/bin/sh
modprobe -a fuse loop dm_writecache dm_cache dm_cache_smq bcache
T=/host/target/release/tiercache
mkdir -p /tmp/d /tmp/f /tmp/m
truncate -s 256M /tmp/d/slow.img; mkfs.ext4 -q -F /tmp/d/slow.img; echo hello > /tmp/x
truncate -s 16M /tmp/d/cache.img
$T serve --passthrough emulated:hdd:/tmp/d/slow.img --fuse /tmp/f 2>/tmp/serve.log &
sleep 3; ls -la /tmp/f
S=$(losetup --direct-io=on --show -f /tmp/f/volume); F=$(losetup --direct-io=on --show -f /tmp/d/cache.img)
echo "slow $S fast $F"; blkid $S
dd if=/dev/zero of=$F bs=1M count=8 oflag=direct status=none
dmsetup create wc --table "0 $(blockdev --getsz $S) writecache s $S $F 4096 0"; echo "create $?"
dmsetup mknodes wc; ls -la /dev/mapper; blkid /dev/mapper/wc
mount /dev/mapper/wc /tmp/m; echo "mount $?"; ls /tmp/m
dmesg | tail -20
