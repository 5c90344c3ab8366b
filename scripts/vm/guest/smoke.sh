#!/bin/sh
# The VM works: the kernel loads the modules issue 9 needs, and the host's binary runs.
set -e
for m in ublk_drv nbd dm_cache dm_writecache bcache loop; do modprobe "$m"; done
ls -l /dev/ublk-control /dev/nbd0
/host/target/release/tiercache --version
echo "smoke: ok"
