#!/usr/bin/env bash
# A real database on three volumes, side by side (docs/seeds.md §1, on this machine's devices):
#
#   fast    the raw cache file alone                   tiercache serve --passthrough FILE
#   slow    the emulated slow backing device alone     tiercache serve --passthrough emulated:PROFILE:FILE
#   hybrid  the hybrid volume: cache = a file like fast, backing = the emulated slow device
#           (the default read-cache policy, serve --eviction adaptive)
#   hybrid-s3fifo  the same, with plain S3-FIFO (serve --eviction s3fifo)
#   hybrid-fifo  the same, with the read cache's first eviction policy (serve --eviction
#           fifo: FIFO over the log), to measure the policy against (--targets hybrid,hybrid-fifo)
#   hybrid-reinsert  the same, with the log alone (serve --eviction reinsert: no probation ring)
#
# Every volume reaches the database the same way: a FUSE file, `losetup --direct-io=on`,
# ext4, mount; so the only difference between the rows is what is behind the FUSE file.
# MariaDB runs sysbench oltp_read_write; PostgreSQL runs pgbench (TPC-B-like). Both commit
# durably (fsync per transaction). Prints a table and writes JSON next to it; for the hybrid
# targets also the cache's read hit ratio during the run (blocks, from `tiercache status`).
#
# Usage: bench/db-bench.sh [--db mariadb|postgres|both] [--seconds 60] [--threads 8]
#          [--tables 4] [--table-size 50000] [--pg-scale 10] [--slow emulated-profile]
#          [--volume-size 4G] [--cache-size 1G] [--buffer-pool 64M] [--workdir DIR]
#          [--targets fast,slow,hybrid[,hybrid-s3fifo,hybrid-fifo,hybrid-reinsert]]
#          [--record-trace DIR]
# --record-trace DIR: the hybrid servers record every request into DIR/TARGET-DB-N.csv.gz
# (`serve --record-trace`), for `tiercache replay`.
# Needs root (loop devices, mounts). Installs mariadb-server, sysbench, postgresql, fuse3.
set -euo pipefail
cd "$(dirname "$0")/.."

DB=mariadb
RUN_SECONDS=60
THREADS=8
TABLES=4
TABLE_SIZE=50000
PG_SCALE=10
SLOW=hdd
VOLUME_SIZE=4G
CACHE_SIZE=1G
BUFFER_POOL=64M
TRACE_DIR=""
WORKDIR=/var/tmp/tiercache-dbbench
TARGETS=fast,slow,hybrid
while [ $# -gt 0 ]; do
    case "$1" in
        --db) DB=$2; shift 2 ;;
        --seconds) RUN_SECONDS=$2; shift 2 ;;
        --threads) THREADS=$2; shift 2 ;;
        --tables) TABLES=$2; shift 2 ;;
        --table-size) TABLE_SIZE=$2; shift 2 ;;
        --pg-scale) PG_SCALE=$2; shift 2 ;;
        --slow) SLOW=$2; shift 2 ;;
        --volume-size) VOLUME_SIZE=$2; shift 2 ;;
        --cache-size) CACHE_SIZE=$2; shift 2 ;;
        --buffer-pool) BUFFER_POOL=$2; shift 2 ;;
        --workdir) WORKDIR=$2; shift 2 ;;
        --targets) TARGETS=$2; shift 2 ;;
        --record-trace) TRACE_DIR=$2; shift 2 ;;
        -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
        *) echo "db-bench: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
[ "$(id -u)" -eq 0 ] || { echo "db-bench: run as root (loop devices and mounts)" >&2; exit 1; }

apt_install() {
    local missing=()
    for p in "$@"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
    [ "${#missing[@]}" -eq 0 ] && return 0
    for attempt in 1 2 3 4 5 6; do
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" && return 0
        echo "apt-get failed (attempt $attempt); retrying in 15 s" >&2; sleep 15
    done
    return 1
}
apt_install mariadb-server sysbench postgresql fuse3 e2fsprogs util-linux
[ -x target/release/tiercache ] || cargo build --release
TC=$PWD/target/release/tiercache
PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)

mkdir -p "$WORKDIR"
RESULTS="$WORKDIR/results.json"
echo "[" > "$RESULTS.tmp"
SERVER_PID=""
LOOP=""

teardown() {
    set +e
    # A run interrupted mid-benchmark leaves its database up on the mount: stop it by its own
    # command first (else the unmount fails and the server keeps serving the mounted file).
    [ -S "$WORKDIR/cur/mysql.sock" ] && mariadb-admin -S "$WORKDIR/cur/mysql.sock" -uroot shutdown
    [ -f "$WORKDIR/cur/mnt/pg/postmaster.pid" ] && runuser -u postgres -- "$PGBIN/pg_ctl" -D "$WORKDIR/cur/mnt/pg" -w stop >/dev/null
    mountpoint -q "$WORKDIR/cur/mnt" && umount "$WORKDIR/cur/mnt"
    [ -n "$LOOP" ] && losetup -d "$LOOP" && LOOP=""
    if [ -n "$SERVER_PID" ]; then kill -TERM "$SERVER_PID"; wait "$SERVER_PID"; SERVER_PID=""; fi
    mountpoint -q "$WORKDIR/cur/fuse" && umount -l "$WORKDIR/cur/fuse"
    set -e
}
trap teardown EXIT

# Brings up one target's volume as ext4 mounted at $WORKDIR/cur/mnt (for database $2).
setup() {
    local t=$1 db=$2
    rm -rf "$WORKDIR/cur"; mkdir -p "$WORKDIR/cur/fuse" "$WORKDIR/cur/mnt"
    local d="$WORKDIR/cur"
    case "$t" in
        fast)
            truncate -s "$VOLUME_SIZE" "$d/dev.img"
            dd if=/dev/zero of="$d/dev.img" bs=4M count=$(( $(stat -c %s "$d/dev.img") / 4194304 )) conv=notrunc,fsync status=none
            "$TC" serve --passthrough "$d/dev.img" --fuse "$d/fuse" 2>"$d/serve.log" & ;;
        slow)
            truncate -s "$VOLUME_SIZE" "$d/dev.img"
            "$TC" serve --passthrough "emulated:$SLOW:$d/dev.img" --fuse "$d/fuse" 2>"$d/serve.log" & ;;
        hybrid|hybrid-s3fifo|hybrid-fifo|hybrid-reinsert)
            local eviction=adaptive
            [ "$t" = hybrid-s3fifo ] && eviction=s3fifo
            [ "$t" = hybrid-fifo ] && eviction=fifo
            [ "$t" = hybrid-reinsert ] && eviction=reinsert
            truncate -s "$VOLUME_SIZE" "$d/backing.img"
            "$TC" create --cache "$d/cache.img" --cache-size "$CACHE_SIZE" --backing "emulated:$SLOW:$d/backing.img" >/dev/null
            local record=()
            if [ -n "$TRACE_DIR" ]; then
                mkdir -p "$TRACE_DIR"
                local n=1
                while [ -e "$TRACE_DIR/$t-$db-$n.csv.gz" ]; do n=$((n + 1)); done
                record=(--record-trace "$(realpath "$TRACE_DIR")/$t-$db-$n.csv.gz")
            fi
            "$TC" serve --cache "$d/cache.img" --backing "emulated:$SLOW:$d/backing.img" --fuse "$d/fuse" \
                --eviction "$eviction" "${record[@]}" 2>"$d/serve.log" & ;;
        *) echo "db-bench: unknown target $t" >&2; exit 2 ;;
    esac
    SERVER_PID=$!
    for _ in $(seq 1 200); do [ -e "$d/fuse/volume" ] && break; sleep 0.1; done
    [ -e "$d/fuse/volume" ] || { cat "$d/serve.log" >&2; echo "db-bench: $t did not come up" >&2; exit 1; }
    LOOP=$(losetup --direct-io=on --show -f "$d/fuse/volume")
    mkfs.ext4 -q -E nodiscard "$LOOP"
    mount "$LOOP" "$d/mnt"
}

# The hybrid volume's read counters now ("hits misses"; nothing for the other targets).
read_counters() {
    [ -e "$WORKDIR/cur/cache.img" ] || return 0
    "$TC" status --cache "$WORKDIR/cur/cache.img" --json |
        python3 -c 'import json,sys; d=json.load(sys.stdin); c=d.get("counters") or d["volume"]["counters"]; print(c["read_hit_blocks"], c["read_miss_blocks"])'
}

# The read hit ratio between two read_counters outputs ("null" without them).
hit_ratio() {
    [ -n "$1" ] || { echo null; return; }
    python3 -c 'import sys; h0,m0,h1,m1=map(int,sys.argv[1:]); n=h1-h0+m1-m0; print("%.3f" % ((h1-h0)/n) if n else "null")' $1 $2
}

record() { # target db tps lat_avg_ms lat_p99_ms read_hit_ratio
    printf '  {"target":"%s","db":"%s","tps":%s,"latency_ms_avg":%s,"latency_ms_p99":%s,"read_hit_ratio":%s},\n' "$@" >> "$RESULTS.tmp"
    printf '%-12s %-9s %10s tps   avg %8s ms   p99 %8s ms   read hits %s\n' "$1" "$2" "$3" "$4" "$5" "$6"
}

run_mariadb() {
    local t=$1 d="$WORKDIR/cur" sock="$WORKDIR/cur/mysql.sock"
    mkdir -p "$d/mnt/mysql"
    mariadb-install-db --user=root --datadir="$d/mnt/mysql" --auth-root-authentication-method=normal >/dev/null 2>&1
    mariadbd --user=root --datadir="$d/mnt/mysql" --socket="$sock" --port=3307 --bind-address=127.0.0.1 \
        --pid-file="$d/mysql.pid" --skip-log-bin --innodb-buffer-pool-size="$BUFFER_POOL" --innodb-log-file-size=64M \
        --innodb-flush-log-at-trx-commit=1 --innodb-flush-method=O_DIRECT --log-error="$d/mysql.err" &
    local pid=$!
    for _ in $(seq 1 300); do mariadb-admin -S "$sock" -uroot ping >/dev/null 2>&1 && break; sleep 0.2; done
    mariadb -S "$sock" -uroot -e "CREATE DATABASE sbtest"
    local sb=(sysbench oltp_read_write --db-driver=mysql --mysql-socket="$sock" --mysql-user=root
              --tables="$TABLES" --table-size="$TABLE_SIZE" --threads="$THREADS")
    "${sb[@]}" prepare >/dev/null
    local before after
    before=$(read_counters)
    "${sb[@]}" --time="$RUN_SECONDS" --percentile=99 --report-interval=0 run > "$d/sysbench.out"
    after=$(read_counters)
    mariadb-admin -S "$sock" -uroot shutdown; wait "$pid" || true
    local tps avg p99
    tps=$(awk '/transactions:/ {gsub(/\(/,"",$3); print $3}' "$d/sysbench.out")
    avg=$(awk '/avg:/ {print $2; exit}' "$d/sysbench.out")
    p99=$(awk '/99th percentile:/ {print $3}' "$d/sysbench.out")
    record "$t" mariadb "$tps" "$avg" "$p99" "$(hit_ratio "$before" "$after")"
}

run_postgres() {
    local t=$1 d="$WORKDIR/cur" sockdir="$WORKDIR/cur/pgsock"
    mkdir -p "$d/mnt/pg" "$sockdir"; chown postgres "$d/mnt/pg" "$sockdir"
    runuser -u postgres -- "$PGBIN/initdb" -D "$d/mnt/pg" -A trust >/dev/null
    runuser -u postgres -- "$PGBIN/pg_ctl" -D "$d/mnt/pg" -l "$sockdir/pg.log" -w \
        -o "-p 5433 -k $sockdir -c listen_addresses=127.0.0.1 -c shared_buffers=32MB -c fsync=on -c synchronous_commit=on" start >/dev/null
    runuser -u postgres -- "$PGBIN/createdb" -h "$sockdir" -p 5433 bench
    runuser -u postgres -- "$PGBIN/pgbench" -h "$sockdir" -p 5433 -i -q -s "$PG_SCALE" bench >/dev/null 2>&1
    local before after
    before=$(read_counters)
    runuser -u postgres -- "$PGBIN/pgbench" -h "$sockdir" -p 5433 -c "$THREADS" -j 2 -T "$RUN_SECONDS" \
        --log --log-prefix="$sockdir/lat" bench > "$d/pgbench.out" 2>&1
    after=$(read_counters)
    runuser -u postgres -- "$PGBIN/pg_ctl" -D "$d/mnt/pg" -w stop >/dev/null
    local tps avg p99
    tps=$(awk '/^tps =/ {print $3; exit}' "$d/pgbench.out")
    avg=$(awk '/latency average/ {print $4}' "$d/pgbench.out")
    # Per-transaction log: 3rd column is the latency in microseconds.
    p99=$(cat "$sockdir"/lat.* | awk '{print $3}' | sort -n | awk '{a[NR]=$1} END {i=int(NR*0.99); if (i<1) i=1; printf "%.3f", a[i]/1000}')
    record "$t" postgres "$tps" "$avg" "$p99" "$(hit_ratio "$before" "$after")"
}

echo "db-bench: $DB on ${TARGETS//,/ / } volumes (slow: $SLOW), ${RUN_SECONDS}s runs, $THREADS threads"
for t in ${TARGETS//,/ }; do
    for db in $( [ "$DB" = both ] && echo mariadb postgres || echo "$DB" ); do
        setup "$t" "$db"
        "run_$db" "$t"
        teardown
    done
done
sed -i '$ s/},$/}/' "$RESULTS.tmp"; echo "]" >> "$RESULTS.tmp"; mv "$RESULTS.tmp" "$RESULTS"
echo "db-bench: results in $RESULTS"
