#!/usr/bin/env python3
"""What recording a trace costs the I/O path (`serve --record-trace`, issue 10): fio's nbd
engine, 4 KiB random reads of cached data (the fastest path, where a per-request cost shows
most), against the same server without recording, in alternating rounds; medians.

    bench/trace-overhead.py [--jobs 4] [--rounds 5] [--seconds 5] [--json FILE]

Needs fio (with its nbd engine). Prints each round's rates, the median ratio (recording /
not), and how many requests each trace held.
"""
import argparse, json, os, shutil, statistics, subprocess, sys, time

here = os.path.dirname(os.path.abspath(__file__))
ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--tiercache", default=shutil.which("tiercache") or os.path.join(here, "../target/release/tiercache"))
ap.add_argument("--dir", default="/var/tmp/tiercache-trace-overhead")
ap.add_argument("--jobs", type=int, default=4)
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--seconds", type=int, default=5)
ap.add_argument("--json", help="also write the rounds as JSON here")
a = ap.parse_args()
if not shutil.which("fio"):
    sys.exit("trace-overhead: needs fio (apt-get install fio)")

shutil.rmtree(a.dir, ignore_errors=True)
os.makedirs(a.dir)
cache, backing, sock = (os.path.join(a.dir, n) for n in ("cache.img", "backing.img", "nbd.sock"))
with open(backing, "wb") as f:
    f.truncate(2 << 30)
subprocess.run([a.tiercache, "create", "--cache", cache, "--cache-size", "1G", "--backing", backing],
               check=True, stdout=subprocess.DEVNULL)
uri = f"nbd+unix:///tiercache?socket={sock}"


def serve(trace=None):
    args = [a.tiercache, "serve", "--cache", cache, "--backing", backing, "--nbd", f"unix:{sock}"]
    if trace:
        args += ["--record-trace", trace]
    p = subprocess.Popen(args, stderr=subprocess.DEVNULL)
    for _ in range(200):
        if os.path.exists(sock) and subprocess.run(["nbdinfo", "--size", uri], capture_output=True).returncode == 0 \
                if shutil.which("nbdinfo") else os.path.exists(sock):
            return p
        time.sleep(0.05)
    p.kill()
    sys.exit("trace-overhead: the server did not come up")


def stop(p):
    p.terminate()
    p.wait(timeout=60)


def fio(rw, seconds, size="256M"):
    out = subprocess.run(["fio", "--name=r", "--ioengine=nbd", f"--uri={uri}", f"--rw={rw}", "--bs=4k",
                          f"--size={size}", f"--numjobs={a.jobs}", "--group_reporting", "--time_based",
                          f"--runtime={seconds}", "--output-format=json"], check=True, capture_output=True, text=True)
    # (fio may print a warning before its JSON.)
    j = json.loads(out.stdout[out.stdout.index("{"):])["jobs"][0]
    return j["read"]["iops"] + j["write"]["iops"]


# The data read below, written once and cached (write-back: it stays in the cache).
p = serve()
try:
    subprocess.run(["fio", "--name=fill", "--ioengine=nbd", f"--uri={uri}", "--rw=write", "--bs=1M", "--size=256M"],
                   check=True, capture_output=True)
finally:
    stop(p)
rounds = []
for r in range(a.rounds):
    row = {}
    for mode in ("plain", "recording") if r % 2 == 0 else ("recording", "plain"):
        trace = os.path.join(a.dir, f"t{r}.csv.gz") if mode == "recording" else None
        p = serve(trace)
        try:
            row[mode] = fio("randread", a.seconds)
        finally:
            stop(p)
        if trace:
            out = subprocess.run(["zcat", trace], capture_output=True, text=True).stdout
            row["trace_requests"] = out.count("\n") - 1
    row["ratio"] = row["recording"] / row["plain"]
    rounds.append(row)
    print(f"round {r + 1}: plain {row['plain']:.0f}/s, recording {row['recording']:.0f}/s "
          f"({row['ratio']:.3f}), {row['trace_requests']} requests in the trace")
median = statistics.median(x["ratio"] for x in rounds)
print(f"median ratio, recording / plain: {median:.3f} ({a.jobs} jobs of 4 KiB random reads of cached data)")
if a.json:
    with open(a.json, "w") as f:
        json.dump({"jobs": a.jobs, "rounds": rounds, "median_ratio": median}, f, indent=2)
