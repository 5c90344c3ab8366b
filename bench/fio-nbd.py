#!/usr/bin/python3
"""Small synchronous writes through NBD once the log has wrapped, as issue 13 measured them:
fio's nbd engine, JOBS jobs (one NBD connection each) of 4 KiB random writes each followed by
a FLUSH (fsync=1), ROUNDS rounds of SECONDS alternating between `tiercache serve` (a 1 GiB
cache on a file) and nbdkit's file plugin on a file of the same size beside it. Before the
first round, tiercache's log is written once through (so every round runs on a wrapped log).
Reports, per round: writes/s of each, the ratio, and FLUSH latency p99 (fio's sync latency).

Needs fio (with its nbd engine: Debian's fio has it) and nbdkit:  apt-get install fio nbdkit
Usage: bench/fio-nbd.py [--jobs 16] [--rounds 5] [--seconds 10] [--tiercache PATH] [--json FILE]
Uses about 6 GiB in DIR (default /var/tmp/tiercache-fio), removed at the end."""
import argparse, json, os, shutil, statistics, subprocess, sys, time

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
here = os.path.dirname(os.path.abspath(__file__))
ap.add_argument("--tiercache", default=shutil.which("tiercache") or os.path.join(here, "../target/release/tiercache"))
ap.add_argument("--dir", default="/var/tmp/tiercache-fio")
ap.add_argument("--jobs", type=int, default=16)
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--seconds", type=int, default=10)
ap.add_argument("--json", help="also write the rounds as JSON here")
a = ap.parse_args()
for tool in ("fio", "nbdkit", "nbdinfo"):
    if not shutil.which(tool):
        sys.exit(f"{tool} is missing: apt-get install fio nbdkit libnbd-bin")
if not os.access(a.tiercache, os.X_OK):
    sys.exit(f"{a.tiercache}: no tiercache binary (cargo build --release, or --tiercache PATH)")
T, D = a.tiercache, a.dir
shutil.rmtree(D, ignore_errors=True); os.makedirs(D)
procs = []

def sh(*args, **kw):
    return subprocess.run(list(args), check=True, **kw)

def wait_for(uri):
    for _ in range(200):
        if subprocess.run(["nbdinfo", "--size", uri], capture_output=True).returncode == 0:
            return
        time.sleep(0.1)
    sys.exit(f"nothing serves {uri}")

def fio(uri, seconds, jobs, rw="randwrite", fsync=1, size="4G"):
    out = subprocess.run(["fio", "--name=w", "--ioengine=nbd", f"--uri={uri}", f"--rw={rw}", "--bs=4k",
                          f"--fsync={fsync}", f"--numjobs={jobs}", "--time_based", f"--runtime={seconds}",
                          "--group_reporting", f"--size={size}", "--output-format=json"],
                         check=True, capture_output=True, text=True).stdout
    j = json.loads(out[out.index("{"):])["jobs"][0]
    p99 = j["sync"]["lat_ns"].get("percentile", {}).get("99.000000", 0) / 1e6
    return j["write"]["iops"], p99

rounds = []
try:
    for name in ("back", "nbdkit"):
        sh("truncate", "-s", "4G", f"{D}/{name}")
    sh(T, "create", "--cache", f"{D}/cache", "--cache-size", "1G", "--backing", f"{D}/back", stdout=subprocess.DEVNULL)
    tc_sock, k_sock = f"{D}/t.sock", f"{D}/k.sock"
    procs.append(subprocess.Popen([T, "serve", "--cache", f"{D}/cache", "--backing", f"{D}/back", "--nbd",
                                   f"unix:{tc_sock}", "--control", f"{D}/ctl.sock"], stderr=subprocess.DEVNULL))
    procs.append(subprocess.Popen(["nbdkit", "-f", "-U", k_sock, "file", f"{D}/nbdkit"]))
    tc, nk = f"nbd+unix:///tiercache?socket={tc_sock}", f"nbd+unix:///?socket={k_sock}"
    wait_for(tc); wait_for(nk)
    def laps():
        st = json.loads(sh(T, "status", "--cache", f"{D}/cache", "--control", f"{D}/ctl.sock", "--json",
                           capture_output=True).stdout)
        return st["log_tail"] * 4096 / st["log_bytes"], st
    print(f"wrapping tiercache's log: 1.25 GiB of sequential 32 KiB writes ...", flush=True)
    # (32 KiB: below the write-around threshold, so the writes go through the log.)
    sh("fio", "--name=wrap", "--ioengine=nbd", f"--uri={tc}", "--rw=write", "--bs=32k", "--size=1280M",
       "--output-format=terse", stdout=subprocess.DEVNULL)
    print(f"  the log has been written {laps()[0]:.1f} times over")
    print(f"{a.jobs} jobs of 4 KiB random write + FLUSH, {a.rounds} rounds of {a.seconds} s each, alternating")
    print(f"{'round':>5} {'tiercache/s':>12} {'nbdkit/s':>10} {'ratio':>6} {'flush p99 ms':>13} {'nbdkit p99 ms':>14}")
    _, before = laps()
    for r in range(a.rounds):
        t_iops, t_p99 = fio(tc, a.seconds, a.jobs)
        _, after = laps()
        k_iops, k_p99 = fio(nk, a.seconds, a.jobs)
        row = {"round": r + 1, "tiercache_iops": round(t_iops), "nbdkit_iops": round(k_iops),
               "ratio": round(t_iops / k_iops, 3), "tiercache_flush_p99_ms": round(t_p99, 2),
               "nbdkit_flush_p99_ms": round(k_p99, 2)}
        rounds.append(row)
        print(f"{r + 1:>5} {row['tiercache_iops']:>12} {row['nbdkit_iops']:>10} {row['ratio']:>6.2f} "
              f"{row['tiercache_flush_p99_ms']:>13.2f} {row['nbdkit_flush_p99_ms']:>14.2f}", flush=True)
        # What tiercache did meanwhile: how dirty the cache ended, and the write-back the round
        # cost (by the destager, and by reclaim in the writers' path), writes delayed by the
        # backpressure above the high watermark, and writes that went around the cache.
        c0, c1 = before["counters"], after["counters"]
        d = {k: c1.get(k, 0) - c0.get(k, 0) for k in ("destaged_blocks", "reclaim_write_backs", "throttled_writes",
                                                     "written_around_blocks", "cache_flushes", "flush_requests",
                                                     "copied_forward_blocks", "reclaimed_blocks")}
        row.update({"dirty_share_after": round(after["dirty_bytes"] / after["log_bytes"], 3), **d})
        print(f"      (dirty {row['dirty_share_after']:.0%} after; {d['destaged_blocks'] * 4 // 1024} MiB written back, "
              f"{d['reclaim_write_backs']} reclaims wrote back, {d['copied_forward_blocks'] * 4 // 1024} MiB copied forward, "
              f"{d['throttled_writes']} writes delayed, "
              f"{d['written_around_blocks'] * 4 // 1024} MiB written around, "
              f"{d['cache_flushes'] / max(1, d['flush_requests']):.2f} cache flushes per FLUSH)", flush=True)
        before = after
    t1, _ = fio(tc, a.seconds, 1)
    k1, _ = fio(nk, a.seconds, 1)
    print(f"one job: tiercache {t1:.0f}/s, nbdkit {k1:.0f}/s, ratio {t1 / k1:.2f}")
    n, st = laps()
    print(f"the log has been written {n:.1f} times over")
    c = st.get("counters", {})
    if c.get("flush_requests"):
        print(f"cache-device flushes per FLUSH request: {c['cache_flushes'] / c['flush_requests']:.2f}")
    print(f"median ratio {statistics.median(r['ratio'] for r in rounds):.2f}, lowest {min(r['ratio'] for r in rounds):.2f}")
    if a.json:
        json.dump({"rounds": rounds, "one_job": {"tiercache_iops": round(t1), "nbdkit_iops": round(k1)}},
                  open(a.json, "w"), indent=1)
finally:
    for p in procs:
        if p.poll() is None:
            p.terminate(); p.wait()
    shutil.rmtree(D, ignore_errors=True)
