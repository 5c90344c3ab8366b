#!/usr/bin/python3
"""What an online `tiercache flush` costs the foreground load (issue 14): a client does 4 KiB
random writes + FLUSH in a loop over NBD (libnbd) in 1-second rounds: alone, then while
`tiercache flush` writes back DIRTY MiB of the served volume, then alone again. Prints the
rate of every round and the ratio of the medians (during / before). One run.

Needs python3-libnbd:  apt-get install python3-libnbd
Usage: bench/online-flush.py [--dirty-mib 1024] [--tiercache PATH] [--dir DIR]
Uses sparse files in DIR (default /var/tmp/tiercache-online-flush), removed at the end."""
import argparse, json, os, random, shutil, statistics, subprocess, sys, threading, time

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
here = os.path.dirname(os.path.abspath(__file__))
ap.add_argument("--tiercache", default=shutil.which("tiercache") or os.path.join(here, "../target/release/tiercache"))
ap.add_argument("--dir", default="/var/tmp/tiercache-online-flush")
ap.add_argument("--dirty-mib", type=int, default=1024)
a = ap.parse_args()
try:
    import nbd
except ImportError:
    sys.exit("python3-libnbd is missing: apt-get install python3-libnbd (run with /usr/bin/python3)")
T, D = a.tiercache, a.dir
shutil.rmtree(D, ignore_errors=True); os.makedirs(D)
srv = None
try:
    subprocess.run(["truncate", "-s", "8G", f"{D}/back"], check=True)
    subprocess.run([T, "create", "--cache", f"{D}/cache", "--cache-size", "4G", "--backing", f"{D}/back"],
                   check=True, stdout=subprocess.DEVNULL)
    srv = subprocess.Popen([T, "serve", "--cache", f"{D}/cache", "--backing", f"{D}/back", "--nbd", f"unix:{D}/s",
                            "--control", f"{D}/c"], stderr=subprocess.DEVNULL)
    h = nbd.NBD()
    for _ in range(100):
        try:
            h.connect_uri(f"nbd+unix:///tiercache?socket={D}/s"); break
        except nbd.Error:
            time.sleep(0.1); h = nbd.NBD()
    big = os.urandom(1 << 20)
    for i in range(a.dirty_mib):
        h.pwrite(big, i << 20)
    h.flush()
    small, rng = os.urandom(4096), random.Random(1)

    def rounds(n, until=None):
        out = []
        for _ in range(n):
            t, k = time.time(), 0
            while time.time() - t < 1.0:
                h.pwrite(small, (6 << 30) + rng.randrange(1 << 18) * 4096); h.flush(); k += 1
            out.append(round(k / (time.time() - t)))
            if until is not None and until.is_set():
                break
        return out

    before = rounds(5)
    done, result = threading.Event(), {}
    def flush():
        t = time.time()
        r = subprocess.run([T, "flush", "--cache", f"{D}/cache", "--control", f"{D}/c", "--json"], capture_output=True, text=True)
        result.update(json.loads(r.stdout) if r.returncode == 0 else {"error": r.stderr.strip()})
        result["wall_seconds"] = round(time.time() - t, 2); done.set()
    th = threading.Thread(target=flush); th.start()
    during = rounds(100000, done)
    th.join()
    after = rounds(5)
    m = statistics.median
    print(json.dumps({"dirty_mib": a.dirty_mib, "flush": result, "write_flush_per_second_before": before,
                      "during": during, "after": after,
                      "median_during_over_before": round(m(during) / m(before), 2),
                      "worst_round_during_over_median_before": round(min(during) / m(before), 2)}, indent=1))
finally:
    if srv is not None:
        srv.terminate(); srv.wait()
    shutil.rmtree(D, ignore_errors=True)
