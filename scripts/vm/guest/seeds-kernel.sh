#!/bin/sh
# bench/seeds.py with the kernel caches as rows, in the test VM, whose kernel has dm-writecache,
# dm-cache and bcache (this machine's has none): every experiment at --quick scale with
# `--kernel-caches dm-writecache,dm-cache,bcache` (all three must set up, or the run fails),
# the work folder on the disk vda; then nothing of the run may be left: no device-mapper
# device, bcache device, loop device, mount or process. Results (JSON, charts, report.md) go
# to /out/results. Needs the VM built with --with-db (MariaDB, sysbench, FUSE, matplotlib):
#   scripts/vm/build.sh --with-db
#   VM_TIMEOUT=3600 scripts/vm/run.sh --dir /var/tmp/tiercache-vm-db --mem 8192 \
#       --disk work:24G scripts/vm/guest/seeds-kernel.sh --out DIR
# Then bench/tests/test_seeds.py's interrupted runs, with the three kernel caches up.
# Files in DIR, all optional: `experiments` (one line, e.g. "race dirty"; default "all");
# `commit` (`git rev-parse --short HEAD`: git is not in the guest) names the tree in the
# charts; `args` adds options, e.g. the real-device mode on three more virtio disks:
#   echo "--cache /dev/vdb --backing /dev/vdc --backing2 /dev/vdd --destructive \
#         --kernel-caches dm-writecache,dm-cache" > DIR/args     (bcache cannot run there)
#   ... --disk work:24G --disk cache:1G --disk b1:2G --disk b2:2G ...
set -eu
modprobe -a fuse loop dm_writecache dm_cache dm_cache_smq bcache
# (mariadb-install-db looks the host name up.)
hostname tcvm; printf "127.0.0.1 localhost tcvm\n" > /etc/hosts
W=/var/tmp/tiercache-seeds
mkfs.ext4 -q -F /dev/vda
mkdir -p $W && mount /dev/vda $W
EXPS=all ARGS=""
[ -s /out/experiments ] && EXPS=$(cat /out/experiments)
[ -s /out/args ] && ARGS=$(cat /out/args)
[ -s /out/commit ] && export TIERCACHE_COMMIT="$(cat /out/commit)"
rc=0
for e in $EXPS; do
    echo "seeds-kernel: $e"
    python3 /host/bench/seeds.py "$e" --quick --kernel-caches dm-writecache,dm-cache,bcache \
        --tiercache /host/target/release/tiercache --workdir $W/run --results /out/results $ARGS || rc=1
done
# A run stopped by Ctrl-C or SIGTERM mid-phase, with the three kernel caches up, leaves nothing
# either (bench/tests/test_seeds.py; its quick runs are small enough for the guest's RAM).
TEST_SEEDS_KERNEL_CACHES=dm-writecache,dm-cache,bcache TIERCACHE=/host/target/release/tiercache \
    python3 /host/bench/tests/test_seeds.py Interrupted || rc=1
left=""
[ -z "$(dmsetup ls 2>/dev/null | grep -v 'No devices found')" ] || left="$left dm:$(dmsetup ls | tr '\n' ' ')"
ls /sys/block | grep -q '^bcache' && left="$left bcache:$(ls /sys/block | grep '^bcache' | tr '\n' ' ')"
losetup -l -n | grep -q "$W/run" && left="$left loop:$(losetup -l -n | grep "$W/run" | tr '\n' ' ')"
grep -q "$W/run" /proc/mounts && left="$left mounts"
pgrep -f "$W/run" >/dev/null && left="$left processes:$(pgrep -af "$W/run" | tr '\n' ' ')"
if [ -n "$left" ]; then echo "seeds-kernel: FAILED: left behind:$left"; rc=1; fi
umount $W
[ $rc = 0 ] && echo "seeds-kernel: passed" || echo "seeds-kernel: FAILED"
exit $rc
