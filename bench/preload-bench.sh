#!/usr/bin/env bash
# `tiercache preload` against the backing device's sequential read speed (issue 10):
#
#   1. a hybrid volume (cache file + emulated slow backing device), ext4 on it through
#      FUSE + loop, a FILE of --file-size written and written back, the server stopped;
#   2. reference: the backing device alone (`serve --passthrough emulated:PROFILE:FILE`), the
#      same file's bytes read through FUSE with O_DIRECT 1 MiB requests (dd), MiB/s;
#   3. a fresh, empty cache on the same backing device (create --force: bolt-on), served,
#      ext4 mounted again, `tiercache preload FILE`: MiB/s, and the ratio to (2);
#   4. the file read again with O_DIRECT: the volume's read hits over that read (all of them
#      should be hits).
# Alternates (2) and (3) --rounds times and reports medians. Cleans up on exit or Ctrl-C.
#
# Usage: bench/preload-bench.sh [--slow hdd] [--file-size 256M] [--rounds 3] [--workdir DIR] [--json]
# Needs root (loop devices, mounts).
set -euo pipefail
cd "$(dirname "$0")/.."

SLOW=hdd
FILE_SIZE=256M
ROUNDS=3
WORKDIR=/var/tmp/tiercache-preload
JSON=0
while [ $# -gt 0 ]; do
    case "$1" in
        --slow) SLOW=$2; shift 2 ;;
        --file-size) FILE_SIZE=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --workdir) WORKDIR=$2; shift 2 ;;
        --json) JSON=1; shift ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "preload-bench: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" -eq 0 ] || { echo "preload-bench: run as root (loop devices and mounts)" >&2; exit 1; }
[ -x target/release/tiercache ] || cargo build --release
TC=$PWD/target/release/tiercache

rm -rf "$WORKDIR"; mkdir -p "$WORKDIR/fuse" "$WORKDIR/mnt"
cd "$WORKDIR"
SERVER_PID=""
LOOP=""
teardown() {
    set +e
    mountpoint -q mnt && umount mnt
    [ -n "$LOOP" ] && losetup -d "$LOOP" && LOOP=""
    if [ -n "$SERVER_PID" ]; then kill -TERM "$SERVER_PID"; wait "$SERVER_PID"; SERVER_PID=""; fi
    mountpoint -q fuse && umount -l fuse
    set -e
}
trap teardown EXIT
say() { [ "$JSON" = 1 ] || echo "$@"; }

serve() { # serve ARGS...: the volume's FUSE file up
    "$TC" serve "$@" --fuse fuse 2>>serve.log &
    SERVER_PID=$!
    for _ in $(seq 1 200); do [ -e fuse/volume ] && return 0; sleep 0.1; done
    cat serve.log >&2; echo "preload-bench: the server did not come up" >&2; exit 1
}
mount_volume() {
    LOOP=$(losetup --direct-io=on --show -f fuse/volume)
    mount "$LOOP" mnt
}
stop() { teardown; }

say "preload-bench: a $FILE_SIZE file on ext4 on a hybrid volume, backing emulated:$SLOW, $ROUNDS rounds"
truncate -s 2G backing.img
"$TC" create --cache cache.img --cache-size 1G --backing "emulated:$SLOW:backing.img" >/dev/null
serve --cache cache.img --backing "emulated:$SLOW:backing.img"
LOOP=$(losetup --direct-io=on --show -f fuse/volume)
mkfs.ext4 -q -E nodiscard "$LOOP"
mount "$LOOP" mnt
dd if=/dev/urandom of=mnt/table.ibd bs=1M count=$(( $(numfmt --from=iec "$FILE_SIZE") >> 20 )) conv=fsync status=none
# The file's extents on the device (ext4 offsets = volume offsets: the loop device starts at 0).
filefrag -e -b4096 mnt/table.ibd | awk -F'[ .:]+' '/^ *[0-9]+:/ {print $5, $6}' > extents.txt
umount mnt; losetup -d "$LOOP"; LOOP=""
"$TC" flush --cache cache.img >/dev/null
stop

raw=() pre=() hits=()
for round in $(seq 1 "$ROUNDS"); do
    # (2) the backing device alone, the file's extents read in order, 1 MiB O_DIRECT requests.
    serve --passthrough "emulated:$SLOW:backing.img"
    t0=$(date +%s.%N)
    while read -r first last; do
        dd if=fuse/volume of=/dev/null bs=1M iflag=direct,skip_bytes,count_bytes \
            skip=$(( first * 4096 )) count=$(( (last - first + 1) * 4096 )) status=none
    done < extents.txt
    t1=$(date +%s.%N)
    stop
    raw+=("$(python3 -c "print(f'{$(numfmt --from=iec "$FILE_SIZE") / ($t1 - $t0) / 2**20:.1f}')")")
    # (3) an empty cache, the file preloaded.
    "$TC" create --cache cache.img --cache-size 1G --backing "emulated:$SLOW:backing.img" --force >/dev/null
    serve --cache cache.img --backing "emulated:$SLOW:backing.img"
    mount_volume
    "$TC" preload --cache cache.img --json mnt/table.ibd > preload.json
    pre+=("$(python3 -c 'import json; r = json.load(open("preload.json")); print("%.1f" % r["mib_per_second"])')")
    # (4) read it again, O_DIRECT: the volume's read hits over that read.
    c0=$("$TC" status --cache cache.img --json | python3 -c 'import json,sys; c=json.load(sys.stdin)["counters"]; print(c["read_hit_blocks"], c["read_miss_blocks"])')
    dd if=mnt/table.ibd of=/dev/null bs=1M iflag=direct status=none
    c1=$("$TC" status --cache cache.img --json | python3 -c 'import json,sys; c=json.load(sys.stdin)["counters"]; print(c["read_hit_blocks"], c["read_miss_blocks"])')
    hits+=("$(python3 -c "import sys; h0,m0,h1,m1=map(int,'$c0 $c1'.split()); print(f'{(h1-h0)/max(1,h1-h0+m1-m0):.3f}')")")
    stop
    say "round $round: backing alone ${raw[-1]} MiB/s, preload ${pre[-1]} MiB/s, read hits afterwards ${hits[-1]}"
done
python3 - "$JSON" "${raw[*]}" "${pre[*]}" "${hits[*]}" "$SLOW" "$FILE_SIZE" <<'EOF'
import json, statistics, sys
as_json, raw, pre, hits, slow, size = sys.argv[1] == "1", *[list(map(float, a.split())) for a in sys.argv[2:5]], sys.argv[5], sys.argv[6]
r = {"slow": slow, "file_size": size, "backing_mib_per_second": raw, "preload_mib_per_second": pre,
     "read_hit_ratio_after": hits, "ratio_median": round(statistics.median(p / b for p, b in zip(pre, raw)), 3)}
if as_json:
    print(json.dumps(r, indent=2))
else:
    print(f"median: backing alone {statistics.median(raw):.1f} MiB/s, preload {statistics.median(pre):.1f} MiB/s, "
          f"ratio {r['ratio_median']:.2f} (per round {', '.join(f'{p / b:.2f}' for p, b in zip(pre, raw))}); "
          f"read hits afterwards {', '.join(f'{h:.3f}' for h in hits)}")
EOF
