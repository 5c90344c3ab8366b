#!/bin/sh
# Where the time of a ublk request goes, in the test VM: fio at QD1 (4 KiB O_DIRECT random
# write + fsync, then random reads) on the fast disk alone, on `serve --passthrough --ublk`
# (the ublk path with no engine), and on `serve --ublk` (the hybrid volume).
set -eu
T=/host/target/release/tiercache
SECS=${E2E_SECONDS:-8}
modprobe ublk_drv
FAST=/dev/vda SLOW=/dev/vdb
one() { # DEV RW EXTRA
    fio --name=j --filename="$1" --direct=1 --rw="$2" --bs=4k --iodepth=1 --size=64M --runtime="$SECS" \
        --time_based $3 --output-format=json 2>/dev/null |
        python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; print(round(j["write"]["iops"] or j["read"]["iops"]))'
}
both() { # NAME DEV
    dd if=/dev/urandom of="$2" bs=1M count=64 oflag=direct conv=fsync status=none
    echo "cost: $1: write+fsync $(one "$2" randwrite --fsync=1)/s, reads $(one "$2" randread "")/s"
}
both "fast disk alone" $FAST
$T serve --passthrough $FAST --ublk --ublk-id 0 2>/tmp/p.log & S=$!
for i in $(seq 100); do [ -b /dev/ublkb0 ] && break; sleep 0.2; done
both "ublk, no engine (passthrough)" /dev/ublkb0
kill -TERM $S; wait $S || true
$T create --cache $FAST --backing $SLOW --force >/dev/null 2>&1
$T serve --cache $FAST --backing $SLOW --ublk --ublk-id 0 2>/tmp/s.log & S=$!
for i in $(seq 100); do [ -b /dev/ublkb0 ] && break; sleep 0.2; done
both "ublk, hybrid volume" /dev/ublkb0
kill -TERM $S; wait $S || true
