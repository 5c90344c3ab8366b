#!/bin/sh
# The end-to-end comparison of issue 9, in the test VM, on the same two virtual disks: vda the
# fast device, vdb the slow one (run.sh throttles it). Each target gets, with fio at QD1:
# O_DIRECT 4 KiB random write + fsync (the database commit), then 4 KiB random reads of the
# region just written, twice (the second pass warm). Targets: the fast disk alone, tiercache
# over ublk, dm-writecache, dm-cache (writeback, smq) and bcache (writeback), each set up on
# vda + vdb and torn down before the next. Prints a table; the JSON goes to /out/e2e.json.
#   scripts/vm/run.sh --disk fast:1G --disk slow:2G:180 scripts/vm/guest/e2e-bench.sh
set -eu
T=/host/target/release/tiercache
SECS=${E2E_SECONDS:-10}
REGION=128M
modprobe -a ublk_drv dm_writecache dm_cache dm_cache_smq bcache 2>/dev/null || true
FAST=/dev/vda SLOW=/dev/vdb
SLOW_SECTORS=$(blockdev --getsz $SLOW) FAST_SECTORS=$(blockdev --getsz $FAST)
wipe() { dd if=/dev/zero of="$1" bs=1M count=8 oflag=direct status=none; }
run_fio() { # DEV RW -> "iops"
    fio --name=j --filename="$1" --direct=1 --rw="$2" --bs=4k --iodepth=1 --size=$REGION \
        --runtime="$SECS" --time_based $3 --output-format=json 2>/dev/null |
        python3 -c 'import json,sys; j=json.load(sys.stdin)["jobs"][0]; e=j["error"]; print(round(j["write"]["iops"] if j["write"]["iops"] else j["read"]["iops"]) if not e else f"error{e}")'
}
RESULTS=/out/e2e.tsv; : > $RESULTS
measure() { # NAME DEV
    # The region written once in full and made durable: every target caches it (warm reads).
    dd if=/dev/urandom of="$2" bs=1M count=128 oflag=direct conv=fsync status=none
    w=$(run_fio "$2" randwrite "--fsync=1")
    r1=$(run_fio "$2" randread "")
    r2=$(run_fio "$2" randread "")
    printf '%s\t%s\t%s\t%s\n' "$1" "$w" "$r1" "$r2" >> $RESULTS
    echo "e2e: $1: write+fsync $w/s, reads $r1/s then $r2/s"
}

wipe $FAST; measure "fast disk alone" $FAST

wipe $FAST
$T create --cache $FAST --backing $SLOW --force >/dev/null 2>&1
$T serve --cache $FAST --backing $SLOW --ublk --ublk-id 0 2>/tmp/serve.log & S=$!
for i in $(seq 150); do [ -b /dev/ublkb0 ] && break; sleep 0.2; done
measure "tiercache over ublk" /dev/ublkb0
# What the engine did: records written ahead of a FLUSH (a committer's write), cache flushes per FLUSH.
$T status --cache $FAST --json 2>/dev/null | python3 -c 'import json,sys; c=json.load(sys.stdin)["counters"]; print("e2e: tiercache counters: %d records written ahead of %d, %d FLUSH requests, %.2f cache flushes per FLUSH" % (c.get("records_written_ahead", 0), c["records_written"], c["flush_requests"], c["cache_flushes"] / max(1, c["flush_requests"])))' || true
kill -TERM $S; wait $S

wipe $FAST
dmsetup create wc --table "0 $SLOW_SECTORS writecache s $SLOW $FAST 4096 0"
dmsetup mknodes
measure "dm-writecache" /dev/mapper/wc
dmsetup remove wc

wipe $FAST
META=131072
dmsetup create cmeta --table "0 $META linear $FAST 0"
dmsetup create cdata --table "0 $((FAST_SECTORS - META)) linear $FAST $META"
dmsetup mknodes
dd if=/dev/zero of=/dev/mapper/cmeta bs=1M count=4 oflag=direct status=none
dmsetup create cached --table "0 $SLOW_SECTORS cache /dev/mapper/cmeta /dev/mapper/cdata $SLOW 512 1 writeback smq 0"
dmsetup mknodes
measure "dm-cache (writeback)" /dev/mapper/cached
dmsetup remove cached; dmsetup remove cdata; dmsetup remove cmeta

if command -v make-bcache >/dev/null; then
    wipe $FAST; wipe $SLOW
    make-bcache --wipe-bcache -C $FAST -B $SLOW --writeback >/dev/null 2>&1 || true
    echo $FAST > /sys/fs/bcache/register 2>/dev/null || true
    echo $SLOW > /sys/fs/bcache/register 2>/dev/null || true
    for i in $(seq 50); do [ -b /dev/bcache0 ] && break; sleep 0.2; done
    if [ -b /dev/bcache0 ]; then
        echo writeback > /sys/block/bcache0/bcache/cache_mode
        measure "bcache (writeback)" /dev/bcache0
    else
        echo "e2e: bcache did not come up; left out"
    fi
fi

python3 - "$RESULTS" <<'PY'
import json, sys
rows = [l.rstrip("\n").split("\t") for l in open(sys.argv[1]) if l.strip()]
fast = rows[0]
out = []
print(f"{'target':<24} {'write+fsync/s':>14} {'ratio':>6} {'reads/s':>8} {'warm reads/s':>13} {'ratio':>6}")
for name, w, r1, r2 in rows:
    rw, rr = int(w) / int(fast[1]), int(r2) / int(fast[3])
    out.append({"target": name, "write_fsync_per_s": int(w), "write_ratio_to_fast": round(rw, 3),
                "reads_per_s": int(r1), "warm_reads_per_s": int(r2), "warm_read_ratio_to_fast": round(rr, 3)})
    print(f"{name:<24} {w:>14} {rw:>6.2f} {r1:>8} {r2:>13} {rr:>6.2f}")
json.dump(out, open("/out/e2e.json", "w"), indent=1)
PY
