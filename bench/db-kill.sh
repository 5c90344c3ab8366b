#!/usr/bin/env bash
# A real database killed under load: MariaDB and/or PostgreSQL on the hybrid volume, through
# the README's stack (tiercache serve --fuse, losetup --direct-io=on, ext4, mount), with the
# tiercache server SIGKILLed mid-commit, round after round.
#
# Once per database: a cache file and an emulated slow backing (emulated:PROFILE:FILE), the
# stack, mkfs.ext4, the data directory (durable settings: MariaDB
# innodb_flush_log_at_trx_commit=1, binlog on with sync_binlog=1, doublewrite on; PostgreSQL
# fsync, synchronous_commit and full_page_writes on, data checksums) and a table
# t(id primary key, payload). Sockets in the work directory only, no TCP.
# Each round: several clients commit one row per transaction (autocommit INSERT, increasing
# ids) and append each id to an ack file outside the volume once the server acknowledged it;
# after a seeded random delay `tiercache serve` gets SIGKILL. The dead stack is torn down (the
# database and the clients are SIGKILLed by PID, umount -l, losetup -d, fusermount3 -uz) and
# rebuilt as the README says: serve again, losetup, mount (ext4 replays its journal), start
# the database (its crash recovery). Then every acknowledged id of every round so far must
# be in the table with its payload intact. At the end: the database's own check (CHECK TABLE
# / amcheck), a clean stop, e2fsck -fn, SIGTERM to the server, `tiercache check`.
# Prints a table, "db-kill: N rounds, M lost acknowledged commits", and writes JSON. Exits
# non-zero on any lost acknowledged commit, failed recovery or failed check.
#
# Usage: bench/db-kill.sh [--db mariadb|postgres|both] [--rounds 10] [--seed 1]
#          [--min-delay 2] [--max-delay 8] [--clients 4] [--slow hdd] [--volume-size 1G]
#          [--cache-size 256M] [--workdir /var/tmp/tiercache-dbkill] [--json FILE]
# TIERCACHE=PATH picks the binary (default target/release/tiercache, built if missing).
# DBKILL_INJECT_LOST_ACK=1 proves the check can fail: round 1 acknowledges one id that was
# never committed, and the run must end with "1 lost acknowledged commits" and exit 1.
# Needs root (loop devices, mounts). Installs mariadb-server, postgresql, python3-pymysql,
# python3-psycopg2, fuse3, e2fsprogs, util-linux.
set -euo pipefail
cd "$(dirname "$0")/.."

DB=both
ROUNDS=10
SEED=1
MIN_DELAY=2
MAX_DELAY=8
CLIENTS=4
SLOW=hdd
VOLUME_SIZE=1G
CACHE_SIZE=256M
WORKDIR=/var/tmp/tiercache-dbkill
JSON=""
while [ $# -gt 0 ]; do
    case "$1" in
        --db) DB=$2; shift 2 ;;
        --rounds) ROUNDS=$2; shift 2 ;;
        --seed) SEED=$2; shift 2 ;;
        --min-delay) MIN_DELAY=$2; shift 2 ;;
        --max-delay) MAX_DELAY=$2; shift 2 ;;
        --clients) CLIENTS=$2; shift 2 ;;
        --slow) SLOW=$2; shift 2 ;;
        --volume-size) VOLUME_SIZE=$2; shift 2 ;;
        --cache-size) CACHE_SIZE=$2; shift 2 ;;
        --workdir) WORKDIR=$2; shift 2 ;;
        --json) JSON=$2; shift 2 ;;
        -h|--help) sed -n '2,27p' "$0"; exit 0 ;;
        *) echo "db-kill: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
done
case "$DB" in mariadb|postgres) DBS=("$DB") ;; both) DBS=(mariadb postgres) ;;
    *) echo "db-kill: --db must be mariadb, postgres or both" >&2; exit 2 ;; esac
[ "$(id -u)" -eq 0 ] || { echo "db-kill: run as root (loop devices and mounts)" >&2; exit 1; }

# apt may be held by another apt: retry with a pause instead of failing (as scripts/test).
apt_install() {
    local missing=()
    for p in "$@"; do dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed" || missing+=("$p"); done
    [ "${#missing[@]}" -eq 0 ] && return 0
    for attempt in 1 2 3 4 5 6 7 8 9 10; do
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" && return 0
        echo "apt-get failed (attempt $attempt); retrying in 15 s" >&2; sleep 15
    done
    echo "db-kill: could not install: ${missing[*]}" >&2
    return 1
}
PKGS=(fuse3 e2fsprogs util-linux python3)
for db in "${DBS[@]}"; do
    case "$db" in
        mariadb) PKGS+=(mariadb-server python3-pymysql) ;;
        postgres) PKGS+=(postgresql postgresql-contrib python3-psycopg2) ;;
    esac
done
apt_install "${PKGS[@]}"
if [ -z "${TIERCACHE:-}" ]; then
    [ -x target/release/tiercache ] || cargo build --release
    TIERCACHE=$PWD/target/release/tiercache
fi
TC=$TIERCACHE
[ -x "$TC" ] || { echo "db-kill: $TC is not an executable" >&2; exit 1; }
PY=/usr/bin/python3 # Debian's: python3-pymysql and python3-psycopg2 live in its dist-packages
PGBIN=""
if [[ " ${DBS[*]} " == *" postgres "* ]]; then PGBIN=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1); fi

mkdir -p "$WORKDIR"
WORKDIR=$(cd "$WORKDIR" && pwd)
[ -n "$JSON" ] || JSON=$WORKDIR/results.json
SERVE_TIMEOUT=120 # s for recovery + the FUSE file to appear
DB_TIMEOUT=180    # s for the database to start (crash recovery included)
KILL_TIMEOUT=60   # s for a SIGKILLed process to be gone

# ---------------------------------------------------------------------------------------------
# The Python side: the committing clients, the verification, the database's own check, and the
# report. Written next to the results so that the script stays one file.
cat > "$WORKDIR/dbkill.py" <<'PYEOF'
import json, os, sys, threading, time

DB = os.environ.get("DBKILL_DB", "")
SOCK = os.environ.get("DBKILL_SOCK", "")
ROUND_IDS = 100_000_000  # ids of round r: r * ROUND_IDS + i * clients + c


def payload(i):
    return (f"{i:x}:" * 40)[:160]


def connect(dbname="killtest"):
    if DB == "mariadb":
        import pymysql
        return pymysql.connect(unix_socket=SOCK, user="root", database=dbname, autocommit=True,
                               connect_timeout=10)
    import psycopg2
    c = psycopg2.connect(host=SOCK, port=5432, user="postgres", dbname=dbname, connect_timeout=10)
    c.autocommit = True
    return c


def setup():
    if DB == "mariadb":
        c = connect(None)
        c.cursor().execute("CREATE DATABASE killtest")
        c.select_db("killtest")
        c.cursor().execute("CREATE TABLE t (id BIGINT PRIMARY KEY, payload VARCHAR(255) NOT NULL) ENGINE=InnoDB")
    else:
        c = connect("postgres")
        c.cursor().execute("CREATE DATABASE killtest")
        c.close()
        c = connect()
        c.cursor().execute("CREATE TABLE t (id BIGINT PRIMARY KEY, payload TEXT NOT NULL)")
    c.close()


def client(rnd, nclients, ackdir):
    """Commits one row per transaction forever; an id goes to the ack file only after the
    server acknowledged its COMMIT. Stops a thread at its first error (the volume is gone)."""
    def worker(c):
        try:
            conn = connect()
            cur = conn.cursor()
        except Exception as e:
            print(f"client {c}: connect: {e}", file=sys.stderr)
            return
        fd = os.open(os.path.join(ackdir, f"r{rnd}-c{c}.txt"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        i = 0
        while True:
            row = rnd * ROUND_IDS + i * nclients + c
            try:
                cur.execute("INSERT INTO t (id, payload) VALUES (%s, %s)", (row, payload(row)))
            except Exception as e:
                print(f"client {c}: after {i} commits: {type(e).__name__}: {str(e).strip()[:200]}", file=sys.stderr)
                return
            os.write(fd, b"%d\n" % row)  # one write(2) per line, O_APPEND: never torn
            i += 1
    threads = [threading.Thread(target=worker, args=(c,), daemon=True) for c in range(nclients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()


def read_acks(ackdir, upto):
    acked, this_round, partial = set(), set(), 0
    for name in os.listdir(ackdir):
        if not (name.startswith("r") and name.endswith(".txt")):
            continue
        r = int(name[1:].split("-")[0])
        if r > upto:
            continue
        with open(os.path.join(ackdir, name)) as f:
            data = f.read()
        lines = data.split("\n")
        if lines[-1] != "":
            partial += 1  # cannot happen with one write(2) per line; counted, not used
        ids = {int(x) for x in lines[:-1] if x}
        acked |= ids
        if r == upto:
            this_round |= ids
    return acked, this_round, partial


def verify(rnd, ackdir, missing_file):
    """Every acknowledged id of rounds <= rnd must be present, with its payload."""
    acked, this_round, partial = read_acks(ackdir, rnd)
    conn = connect()
    if DB == "mariadb":
        import pymysql.cursors
        cur = conn.cursor(pymysql.cursors.SSCursor)
    else:
        conn.autocommit = False
        cur = conn.cursor(name="verify")
        cur.itersize = 20000
    cur.execute("SELECT id, payload FROM t")
    present, bad = set(), []
    while True:
        rows = cur.fetchmany(20000)
        if not rows:
            break
        for i, p in rows:
            present.add(i)
            if p != payload(i):
                bad.append(i)
    cur.close()
    conn.close()
    missing = sorted(acked - present)
    with open(missing_file, "w") as f:
        f.write("".join(f"{i}\n" for i in missing))
    print(json.dumps({
        "acked": len(this_round),
        "found": len(this_round & present),
        "missing": len(this_round - present),
        "acked_total": len(acked),
        "missing_total": len(missing),
        "rows": len(present),
        # committed, yet never acknowledged to the client (the in-flight ones): may be there
        "unacked_present": sum(1 for i in present - acked if i // ROUND_IDS == rnd),
        "unacked_present_total": len(present - acked),
        "bad_payload": len(bad),
        "partial_ack_lines": partial,
        "missing_sample": missing[:10],
    }))


def dbcheck():
    conn = connect()
    cur = conn.cursor()
    if DB == "mariadb":
        cur.execute("CHECK TABLE t EXTENDED")
        rows = cur.fetchall()
        ok = any(r[2] == "status" and r[3] == "OK" for r in rows) and not any(r[2] == "error" for r in rows)
        msg = "; ".join(f"{r[2]}: {r[3]}" for r in rows)
    else:
        cur.execute("CREATE EXTENSION IF NOT EXISTS amcheck")
        cur.execute("SELECT bt_index_parent_check('t_pkey', true, true)")
        cur.execute("SELECT blkno, offnum, msg FROM verify_heapam('t', check_toast => true)")
        heap = cur.fetchall()
        cur.execute("SELECT count(*) FROM t")
        ok = not heap
        msg = (f"amcheck: index t_pkey ok (bt_index_parent_check, heapallindexed), heap of t: "
               f"{len(heap)} problems {heap[:3]}, {cur.fetchone()[0]} rows")
    cur.close()
    conn.close()
    print(msg)
    sys.exit(0 if ok else 1)


def report(jsonl, out, meta_json):
    meta = json.loads(meta_json)
    recs = [json.loads(l) for l in open(jsonl) if l.strip()]
    rounds = [r for r in recs if r["kind"] == "round"]
    finals = {r["db"]: r for r in recs if r["kind"] == "final"}
    cols = ["db", "round", "delay_s", "acked", "found", "missing", "lost_total", "unacked", "rows",
            "teardown_s", "serve_s", "mount_s", "db_s", "round_s", "recovered", "fs_used%"]
    print(" ".join(f"{c:>10}" for c in cols))
    for r in rounds:
        v = r.get("verify") or {}
        vals = [r["db"], r["round"], r["delay_s"], v.get("acked", "-"), v.get("found", "-"),
                v.get("missing", "-"), v.get("missing_total", "-"), v.get("unacked_present", "-"),
                v.get("rows", "-"), r["teardown_s"], r["serve_s"], r["mount_s"], r["db_s"], r["round_s"],
                "yes" if r["recovered"] else "NO", r.get("fs_used_pct")]
        print(" ".join(f"{str(x):>10}" for x in vals))
    lost = 0
    summary = {}
    for db in meta["dbs"]:
        mine = [r for r in rounds if r["db"] == db]
        ids = set()
        for r in mine:
            if r.get("missing_file") and os.path.exists(r["missing_file"]):
                ids |= {int(x) for x in open(r["missing_file"]) if x.strip()}
        f = finals.get(db, {})
        lost += len(ids)
        summary[db] = {
            "rounds": len(mine),
            "lost_acknowledged_commits": len(ids),
            "failed_recoveries": sum(1 for r in mine if not r["recovered"]),
            "bad_payloads": max([(r.get("verify") or {}).get("bad_payload", 0) for r in mine] or [0]),
            "acknowledged_commits": max([(r.get("verify") or {}).get("acked_total", 0) for r in mine] or [0]),
            "final": f,
        }
        t = [r["round_s"] for r in mine]
        if t:
            print(f"{db}: {len(mine)} rounds, {summary[db]['acknowledged_commits']} acknowledged commits, "
                  f"{len(ids)} lost; round {min(t):.1f}-{max(t):.1f} s (mean {sum(t)/len(t):.1f}); "
                  f"db check: {f.get('db_check', '-')}; e2fsck: {f.get('e2fsck', '-')}; "
                  f"serve exit: {f.get('serve_exit', '-')}; tiercache check: {f.get('tiercache_check', '-')}")
    with open(out, "w") as fh:
        json.dump({"meta": meta, "summary": summary, "rounds": rounds}, fh, indent=1)
    print(f"db-kill: {len(rounds)} rounds, {lost} lost acknowledged commits")


if __name__ == "__main__":
    cmd, args = sys.argv[1], sys.argv[2:]
    if cmd == "setup":
        setup()
    elif cmd == "client":
        client(int(args[0]), int(args[1]), args[2])
    elif cmd == "verify":
        verify(int(args[0]), args[1], args[2])
    elif cmd == "dbcheck":
        dbcheck()
    elif cmd == "report":
        report(args[0], args[1], args[2])
    else:
        sys.exit(f"unknown command {cmd}")
PYEOF

# ---------------------------------------------------------------------------------------------
# State of the stack of the database under test (the trap tears down whatever is set).
D=""            # $WORKDIR/<db>
FUSE=""         # $D/fuse: the FUSE mount (volume file)
MNT=""          # $D/mnt: ext4
SERVE_PID=""
LOOP=""
DB_PID=""       # mariadbd, or the postmaster (started through setpriv, which execs)
CLIENT_PID=""
CUR_DB=""
FAILED=0
RECORDS=$WORKDIR/records.jsonl
: > "$RECORDS"

log() { echo "db-kill: $*" >&2; }
now() { printf '%s' "$EPOCHREALTIME"; }
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.2f", b - a }'; }

# Alive and not a zombie (PID 1 here need not reap the orphans we SIGKILL).
alive() {
    local st
    st=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
    [[ "$st" != Z* ]]
}
# Waits (bounded) until PID is gone; reaps it if it is our child. Returns 1 on timeout.
wait_gone() {
    local pid=$1 timeout=${2:-$KILL_TIMEOUT} deadline
    deadline=$(( SECONDS + timeout ))
    while alive "$pid"; do
        if [ "$SECONDS" -ge "$deadline" ]; then
            log "process $pid ($(ps -o comm= -p "$pid" 2>/dev/null), state $(ps -o stat= -p "$pid" 2>/dev/null)) still there after ${timeout}s"
            return 1
        fi
        sleep 0.1
    done
    wait "$pid" 2>/dev/null || true
}

# SIGKILL by PID. disown first: bash would otherwise print "Killed" for each of its jobs, and
# nothing needs their exit status; wait_gone still sees them go (bash reaps them).
sigkill() {
    disown "$@" 2>/dev/null || true
    kill -KILL "$@" 2>/dev/null || true
}

# SIGKILL the database server we started and every process it forked (by PID: the postmaster's
# backends are its children). SIGSTOP first so that it forks nothing new meanwhile.
kill_db() {
    [ -n "$DB_PID" ] || return 0
    local pids=("$DB_PID") ok=0
    kill -STOP "$DB_PID" 2>/dev/null || true
    mapfile -t -O 1 pids < <(ps -o pid= --ppid "$DB_PID" 2>/dev/null | tr -d ' ')
    pids[0]=$DB_PID
    sigkill "${pids[@]}"
    for p in "${pids[@]}"; do wait_gone "$p" || ok=1; done
    DB_PID=""
    return $ok
}

kill_client() {
    [ -n "$CLIENT_PID" ] || return 0
    sigkill "$CLIENT_PID"
    wait_gone "$CLIENT_PID" || true
    CLIENT_PID=""
}

# Starts `tiercache serve` on the devices of $D; waits (bounded) for the FUSE file.
serve_start() {
    "$TC" serve --cache "$D/cache.img" --backing "emulated:$SLOW:$D/backing.img" --fuse "$FUSE" 2>>"$D/serve.log" &
    SERVE_PID=$!
    local deadline=$(( SECONDS + SERVE_TIMEOUT ))
    until [ -e "$FUSE/volume" ]; do
        if ! alive "$SERVE_PID" || [ "$SECONDS" -ge "$deadline" ]; then
            tail -5 "$D/serve.log" >&2; log "tiercache serve did not come up"; return 1
        fi
        sleep 0.05
    done
}

attach_and_mount() { # [mkfs]
    LOOP=$(losetup --direct-io=on --show -f "$FUSE/volume")
    # Inode tables and journal written now, not by ext4lazyinit in the background of round 1.
    [ "${1:-}" = mkfs ] && mkfs.ext4 -q -E nodiscard,lazy_itable_init=0,lazy_journal_init=0 "$LOOP"
    mount "$LOOP" "$MNT"
}

# The dead stack after the SIGKILL of the server: clients, database, ext4, loop, FUSE.
crash_teardown() {
    local ok=0
    kill_client
    kill_db || ok=1
    if mountpoint -q "$MNT"; then umount -l "$MNT" || ok=1; fi
    if [ -n "$LOOP" ]; then losetup -d "$LOOP" || ok=1; LOOP=""; fi
    # The server is dead: its FUSE mount answers ENOTCONN until lazily unmounted.
    fusermount3 -uz "$FUSE" 2>/dev/null || umount -l "$FUSE" 2>/dev/null || true
    if [ -n "$SERVE_PID" ]; then wait_gone "$SERVE_PID" || ok=1; SERVE_PID=""; fi
    return $ok
}

# --- MariaDB -----------------------------------------------------------------------------------
mariadb_init() {
    mkdir -p "$MNT/mysql"
    mariadb-install-db --no-defaults --user=root --datadir="$MNT/mysql" \
        --auth-root-authentication-method=normal > "$D/install-db.log" 2>&1
}
mariadb_start() {
    # --no-defaults: nothing from /etc/mysql; no TCP, the socket and pid file outside the volume.
    mariadbd --no-defaults --user=root --datadir="$MNT/mysql" --socket="$D/mysql.sock" \
        --skip-networking --pid-file="$D/mysql.pid" --log-error="$D/mysql.err" \
        --log-bin=binlog --server-id=1 --sync-binlog=1 \
        --innodb-flush-log-at-trx-commit=1 --innodb-doublewrite=1 --innodb-flush-method=O_DIRECT \
        --innodb-buffer-pool-size=64M --innodb-log-file-size=48M --skip-name-resolve >> "$D/mysql.out" 2>&1 &
    DB_PID=$!
}
mariadb_ready() { mariadb-admin --no-defaults -S "$D/mysql.sock" -uroot --connect-timeout=2 ping >/dev/null 2>&1; }
mariadb_stop() {
    mariadb-admin --no-defaults -S "$D/mysql.sock" -uroot shutdown && wait_gone "$DB_PID" "$DB_TIMEOUT"
}
mariadb_log() { echo "$D/mysql.err"; }
mariadb_errors() { grep -c '\[ERROR\]' || true; } # log lines of a start that are errors
mariadb_sock() { echo "$D/mysql.sock"; }

# --- PostgreSQL --------------------------------------------------------------------------------
pg_as() { setpriv --reuid=postgres --regid=postgres --init-groups -- "$@"; }
postgres_init() {
    mkdir -p "$MNT/pg" "$D/pgsock"; chown postgres "$MNT/pg" "$D/pgsock"
    # The postgres user must reach the data directory and the socket (mktemp -d makes 0700).
    chmod a+x "$WORKDIR" "$D" "$MNT"
    pg_as test -w "$MNT/pg" || { log "the postgres user cannot reach $MNT/pg: give it search permission on the parents of --workdir"; return 1; }
    (cd / && pg_as "$PGBIN/initdb" -D "$MNT/pg" -A trust -U postgres --data-checksums) > "$D/initdb.log" 2>&1
}
postgres_start() {
    # setpriv execs: $! is the postmaster itself. Unix socket in the work directory only.
    (cd / && exec setpriv --reuid=postgres --regid=postgres --init-groups -- "$PGBIN/postgres" -D "$MNT/pg" \
        -c listen_addresses= -c unix_socket_directories="$D/pgsock" -c port=5432 \
        -c fsync=on -c synchronous_commit=on -c full_page_writes=on -c wal_sync_method=fdatasync \
        -c shared_buffers=32MB -c max_wal_size=256MB -c logging_collector=off \
        -c external_pid_file="$D/pgsock/postmaster.pid") >> "$D/pg.log" 2>&1 &
    DB_PID=$!
}
postgres_ready() { "$PGBIN/pg_isready" -q -h "$D/pgsock" -p 5432 -U postgres -d postgres -t 2; }
postgres_stop() {
    (cd / && pg_as "$PGBIN/pg_ctl" -D "$MNT/pg" -m fast -w -t "$DB_TIMEOUT" stop) >/dev/null && wait_gone "$DB_PID" "$DB_TIMEOUT"
}
postgres_log() { echo "$D/pg.log"; }
postgres_errors() { # our own readiness probes while it recovers are FATAL lines too: not errors;
    # nor is a client that went away mid-reply (a probe that timed out): "connection to client lost"
    grep -E '(ERROR|FATAL|PANIC):' | grep -vc -e 'the database system is starting up' -e 'not yet accepting connections' \
        -e 'connection to client lost' || true
}
postgres_sock() { echo "$D/pgsock"; }

# Starts the database (crash recovery after a crash) and waits (bounded) until it answers.
db_start() {
    "${CUR_DB}_start"
    local deadline=$(( SECONDS + DB_TIMEOUT ))
    until "${CUR_DB}_ready"; do
        if ! alive "$DB_PID" || [ "$SECONDS" -ge "$deadline" ]; then
            tail -20 "$("${CUR_DB}_log")" >&2; log "$CUR_DB did not start"; return 1
        fi
        sleep 0.1
    done
}
py() { DBKILL_DB=$CUR_DB DBKILL_SOCK=$("${CUR_DB}_sock") "$PY" "$WORKDIR/dbkill.py" "$@"; }

# Whatever is left, on any exit: only what this script started, by PID.
cleanup() {
    set +e
    kill_client
    kill_db
    [ -n "$MNT" ] && mountpoint -q "$MNT" && umount -l "$MNT"
    [ -n "$LOOP" ] && losetup -d "$LOOP"
    LOOP=""
    if [ -n "$SERVE_PID" ]; then
        kill -TERM "$SERVE_PID" 2>/dev/null
        wait_gone "$SERVE_PID" 30 || { sigkill "$SERVE_PID"; wait_gone "$SERVE_PID"; }
        SERVE_PID=""
    fi
    [ -n "$FUSE" ] && mountpoint -q "$FUSE" && { fusermount3 -uz "$FUSE" 2>/dev/null || umount -l "$FUSE"; }
}
trap cleanup EXIT
trap 'exit 130' INT TERM

json_round() { # db round delay teardown serve mount db_s round_s recovered start_errors fs_used_pct verify_json missing_file
    printf '{"kind":"round","db":"%s","round":%s,"delay_s":%s,"teardown_s":%s,"serve_s":%s,"mount_s":%s,"db_s":%s,"round_s":%s,"recovered":%s,"start_errors":%s,"fs_used_pct":%s,"verify":%s,"missing_file":"%s"}\n' \
        "$@" >> "$RECORDS"
}

# ---------------------------------------------------------------------------------------------
run_db() {
    CUR_DB=$1
    D=$WORKDIR/$CUR_DB FUSE=$WORKDIR/$CUR_DB/fuse MNT=$WORKDIR/$CUR_DB/mnt
    for m in "$MNT" "$FUSE"; do mountpoint -q "$m" 2>/dev/null && umount -l "$m"; done
    rm -rf "$D"; mkdir -p "$FUSE" "$MNT" "$D/acks"

    log "$CUR_DB: creating the hybrid volume ($VOLUME_SIZE on emulated:$SLOW, $CACHE_SIZE cache file), ext4, data directory"
    truncate -s "$VOLUME_SIZE" "$D/backing.img"
    "$TC" create --cache "$D/cache.img" --cache-size "$CACHE_SIZE" --backing "emulated:$SLOW:$D/backing.img" >/dev/null
    serve_start
    attach_and_mount mkfs
    "${CUR_DB}_init" || { tail -5 "$D"/initdb.log "$D"/install-db.log 2>/dev/null >&2; log "$CUR_DB: initialising the data directory failed"; exit 1; }
    db_start
    py setup

    RANDOM=$SEED
    local r ok=1
    for r in $(seq 1 "$ROUNDS"); do
        local t_round delay_ms delay t0 teardown_s serve_s=null mount_s=null db_s=null recovered=false verify=null
        local start_errors=null fs_used=null
        local x=$(( RANDOM * 32768 + RANDOM )) # here, not in a $( ) subshell: RANDOM must advance
        t_round=$(now)
        delay_ms=$(awk -v a="$MIN_DELAY" -v b="$MAX_DELAY" -v x="$x" \
            'BEGIN { printf "%d", a * 1000 + x % (int((b - a) * 1000) + 1) }')
        delay=$(awk -v m="$delay_ms" 'BEGIN { printf "%.3f", m / 1000 }')
        # Not through py(): a function in the background is a subshell, and $! would be that.
        DBKILL_DB=$CUR_DB DBKILL_SOCK=$("${CUR_DB}_sock") "$PY" "$WORKDIR/dbkill.py" client "$r" "$CLIENTS" "$D/acks" \
            2>>"$D/client.log" &
        CLIENT_PID=$!
        # The delay counts from the first acknowledged commit of the round.
        local deadline=$(( SECONDS + 60 ))
        until [ -n "$(find "$D/acks" -name "r$r-c*.txt" -size +0 -print -quit)" ]; do
            if ! alive "$CLIENT_PID" || [ "$SECONDS" -ge "$deadline" ]; then
                log "$CUR_DB round $r: no commit acknowledged"; tail -5 "$D/client.log" >&2; ok=0; break
            fi
            sleep 0.05
        done
        [ "$ok" = 1 ] || { json_round "$CUR_DB" "$r" "$delay" null null null null "$(since "$t_round")" false null null null ""; break; }
        sleep "$delay"
        [ "${DBKILL_INJECT_LOST_ACK:-0}" = 1 ] && [ "$r" = 1 ] && echo $(( r * 100000000 + 99999999 )) >> "$D/acks/r$r-c0.txt"

        sigkill "$SERVE_PID"
        t0=$(now)
        crash_teardown || { log "$CUR_DB round $r: teardown did not complete (see above)"; ok=0; }
        teardown_s=$(since "$t0")

        if [ "$ok" = 1 ]; then
            t0=$(now); echo "--- round $r: restart after SIGKILL" >> "$D/serve.log"
            if serve_start; then
                serve_s=$(since "$t0")
                t0=$(now)
                if attach_and_mount; then
                    mount_s=$(since "$t0")
                    echo "--- round $r: start after SIGKILL of the volume" >> "$("${CUR_DB}_log")"
                    t0=$(now)
                    if db_start; then
                        db_s=$(since "$t0")
                        # Recovered cleanly: it answers, and its log of this start has no error.
                        start_errors=$(sed -n "/^--- round $r: start after/,\$p" "$("${CUR_DB}_log")" | "${CUR_DB}_errors")
                        [ "$start_errors" = 0 ] && recovered=true
                        fs_used=$(df --output=pcent "$MNT" | tail -1 | tr -dc 0-9)
                        [ "$fs_used" -lt 85 ] || log "$CUR_DB round $r: ext4 ${fs_used}% full: use a larger --volume-size"
                        verify=$(py verify "$r" "$D/acks" "$D/missing-r$r.txt") || verify=null
                    fi
                fi
            fi
        fi
        json_round "$CUR_DB" "$r" "$delay" "$teardown_s" "$serve_s" "$mount_s" "$db_s" "$(since "$t_round")" \
            "$recovered" "$start_errors" "$fs_used" "$verify" "$D/missing-r$r.txt"
        local missing
        missing=$(tail -1 "$RECORDS" | "$PY" -c 'import json,sys; v=json.load(sys.stdin)["verify"]; print(v["missing_total"] if v else "?")')
        log "$CUR_DB round $r: delay ${delay}s, teardown ${teardown_s}s, serve ${serve_s}s, mount ${mount_s}s, db ${db_s}s, recovered $recovered (errors in its log: $start_errors), missing $missing, ext4 ${fs_used}% used"
        if [ "$recovered" != true ] || [ "$verify" = null ]; then ok=0; fi
        [ "$ok" = 1 ] || break
    done
    [ "$ok" = 1 ] || FAILED=1

    # The end: the database's own check and clean stop, umount, e2fsck, SIGTERM, tiercache check.
    local db_check=skipped e2fsck=skipped serve_exit=skipped tc_check=failed msg
    if [ -n "$DB_PID" ] && alive "$DB_PID"; then
        if msg=$(py dbcheck 2>&1); then db_check=ok; else db_check=failed; FAILED=1; fi
        log "$CUR_DB check: $msg"
        "${CUR_DB}_stop" || { log "$CUR_DB did not stop cleanly"; FAILED=1; kill_db; }
        DB_PID=""
    fi
    if mountpoint -q "$MNT"; then
        umount "$MNT"
        if e2fsck -fn "$LOOP" > "$D/e2fsck.log" 2>&1; then e2fsck=ok; else e2fsck=failed; FAILED=1; tail -20 "$D/e2fsck.log" >&2; fi
    fi
    if [ -n "$LOOP" ]; then losetup -d "$LOOP"; LOOP=""; fi
    if [ -n "$SERVE_PID" ]; then
        kill -TERM "$SERVE_PID"
        local deadline=$(( SECONDS + 60 ))
        while alive "$SERVE_PID" && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
        if alive "$SERVE_PID"; then serve_exit=timeout; FAILED=1; kill -KILL "$SERVE_PID"; fi # status wanted
        local rc=0; wait "$SERVE_PID" 2>/dev/null || rc=$?
        [ "$serve_exit" = timeout ] || serve_exit=$rc
        [ "$rc" = 0 ] || FAILED=1
        SERVE_PID=""
    fi
    mountpoint -q "$FUSE" && { fusermount3 -uz "$FUSE" 2>/dev/null || umount -l "$FUSE"; }
    if "$TC" check --cache "$D/cache.img" --backing "emulated:$SLOW:$D/backing.img" > "$D/check.log" 2>&1; then
        tc_check=ok
    else
        FAILED=1; cat "$D/check.log" >&2
    fi
    log "$CUR_DB final: db check $db_check, e2fsck $e2fsck, serve exit $serve_exit, tiercache check $tc_check"
    printf '{"kind":"final","db":"%s","db_check":"%s","e2fsck":"%s","serve_exit":"%s","tiercache_check":"%s"}\n' \
        "$CUR_DB" "$db_check" "$e2fsck" "$serve_exit" "$tc_check" >> "$RECORDS"
}

log "${DBS[*]}: $ROUNDS rounds each, $CLIENTS clients, kill after ${MIN_DELAY}-${MAX_DELAY} s (seed $SEED), workdir $WORKDIR"
for db in "${DBS[@]}"; do run_db "$db"; done

META=$(printf '{"dbs":["%s"],"rounds":%s,"seed":%s,"min_delay_s":%s,"max_delay_s":%s,"clients":%s,"slow":"%s","volume_size":"%s","cache_size":"%s"}' \
    "$(IFS=,; echo "${DBS[*]}" | sed 's/,/","/g')" "$ROUNDS" "$SEED" "$MIN_DELAY" "$MAX_DELAY" "$CLIENTS" "$SLOW" "$VOLUME_SIZE" "$CACHE_SIZE")
"$PY" "$WORKDIR/dbkill.py" report "$RECORDS" "$JSON" "$META" | tee "$WORKDIR/summary.txt"
echo "db-kill: results in $JSON"
LOST=$(awk '/^db-kill: .* rounds, / { print $(NF-3) }' "$WORKDIR/summary.txt")
[ "$LOST" = 0 ] || FAILED=1
exit "$FAILED"
