#!/usr/bin/python3
"""Read misses queued behind write-back, as a database over an HDD meets them: fio's nbd
engine, JOBS jobs of 16 KiB random reads and writes (60 % reads, a FLUSH every 4 writes) over
a 512 MiB volume whose backing device is the emulated `hdd` profile and whose cache is a
128 MiB file, with the high dirty watermark at HIGH % (low 10 points below), so that
write-back runs all the time. Reports read and write throughput and latency (p99, max): a
read miss waits for whatever write-back has queued on the disk before it.

With --baseline BIN, the rounds alternate between --tiercache and BIN (same devices, same
workload, a fresh cache each round), and the medians are compared side by side: the way to
measure a change to write-back.

Needs fio (with its nbd engine) and nbdinfo:  apt-get install fio libnbd-bin
Usage: bench/reads-behind-writeback.py [--tiercache PATH] [--baseline PATH] [--rounds 2]
       [--seconds 60] [--jobs 8] [--high 20] [--json FILE]
Uses about 700 MiB in DIR (default /var/tmp/tiercache-rbw), removed at the end.

Measured 2026-11-28 (3485cfd, this 2-core VM): read p99 401-405 ms, max 688-696 ms; 88
reads/s and 60 writes/s. Write-back sends a batch's runs all at once, and the emulated HDD
serves one request at a time: the emulator booked a 256-block batch (about 64 runs of 16 KiB)
at once, holding the disk about 480 ms, where a FileDevice issues it 32 runs at a time.
With the emulator booking the same groups of 32 (2026-11-29): read p99 251-253 ms, max
269-277 ms (one group of 32 scattered runs, about 7.5 ms each); 91-92 reads/s."""
import argparse, json, os, shutil, statistics, subprocess, sys, time

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
here = os.path.dirname(os.path.abspath(__file__))
ap.add_argument("--tiercache", default=shutil.which("tiercache") or os.path.join(here, "../target/release/tiercache"))
ap.add_argument("--baseline", help="a second tiercache binary, alternated with --tiercache round by round")
ap.add_argument("--dir", default="/var/tmp/tiercache-rbw")
ap.add_argument("--rounds", type=int, default=2)
ap.add_argument("--seconds", type=int, default=60)
ap.add_argument("--jobs", type=int, default=8)
ap.add_argument("--high", type=int, default=20, help="high dirty watermark, percent (default 20)")
ap.add_argument("--json", help="also write the rounds as JSON here")
a = ap.parse_args()
for tool in ("fio", "nbdinfo"):
    if not shutil.which(tool):
        sys.exit(f"{tool} is missing: apt-get install fio libnbd-bin")
binaries = {"tiercache": a.tiercache}
if a.baseline:
    binaries["baseline"] = a.baseline
for name, path in binaries.items():
    if not os.access(path, os.X_OK):
        sys.exit(f"{path}: no tiercache binary for {name} (cargo build --release, or --{name} PATH)")
if not 10 <= a.high <= 100:
    sys.exit(f"--high {a.high}: a percentage from 10 to 100")
D = a.dir


def one_round(binary):
    """A fresh cache over a fresh backing file, served over NBD; fio for SECONDS; the figures."""
    shutil.rmtree(D, ignore_errors=True)
    os.makedirs(D)
    subprocess.run(["truncate", "-s", "512M", f"{D}/back"], check=True)
    backing = f"emulated:hdd:{D}/back"
    subprocess.run([binary, "create", "--cache", f"{D}/cache", "--cache-size", "128M", "--backing", backing],
                   check=True, stdout=subprocess.DEVNULL)
    sock = f"{D}/t.sock"
    uri = f"nbd+unix:///tiercache?socket={sock}"
    server = subprocess.Popen([binary, "serve", "--cache", f"{D}/cache", "--backing", backing, "--nbd", f"unix:{sock}",
                               "--control", f"{D}/ctl.sock", "--dirty-high", str(a.high),
                               "--dirty-low", str(a.high - 10)], stderr=subprocess.DEVNULL)
    try:
        for _ in range(200):
            if subprocess.run(["nbdinfo", "--size", uri], capture_output=True).returncode == 0:
                break
            time.sleep(0.1)
        else:
            sys.exit(f"nothing serves {uri}")
        out = subprocess.run(["fio", "--name=rbw", "--ioengine=nbd", f"--uri={uri}", "--rw=randrw", "--rwmixread=60",
                              "--bs=16k", "--fsync=4", f"--numjobs={a.jobs}", "--time_based", f"--runtime={a.seconds}",
                              "--group_reporting", "--size=512M", "--output-format=json"],
                             check=True, capture_output=True, text=True).stdout
    finally:
        server.terminate()
        server.wait()
    job = json.loads(out[out.index("{"):])["jobs"][0]
    pct = lambda d: d["clat_ns"].get("percentile", {}).get("99.000000", 0) / 1e6
    r, w = job["read"], job["write"]
    return {"reads_per_s": round(r["iops"]), "writes_per_s": round(w["iops"]),
            "read_p99_ms": round(pct(r), 1), "read_max_ms": round(r["clat_ns"]["max"] / 1e6, 1),
            "write_p99_ms": round(pct(w), 1), "write_max_ms": round(w["clat_ns"]["max"] / 1e6, 1)}


rounds = []
try:
    print(f"{a.jobs} jobs of 16 KiB random reads (60 %) and writes, a FLUSH every 4 writes, {a.seconds} s a round; "
          f"a 128 MiB cache over an emulated HDD of 512 MiB, high watermark {a.high} %")
    cols = ("reads_per_s", "writes_per_s", "read_p99_ms", "read_max_ms", "write_p99_ms", "write_max_ms")
    print(f"{'round':>5} {'binary':>10} " + " ".join(f"{c:>13}" for c in cols))
    for r in range(a.rounds):
        for name, path in binaries.items():
            row = {"round": r + 1, "binary": name, **one_round(path)}
            rounds.append(row)
            print(f"{r + 1:>5} {name:>10} " + " ".join(f"{row[c]:>13}" for c in cols), flush=True)
    print("medians:")
    for name in binaries:
        mine = [x for x in rounds if x["binary"] == name]
        print(f"{'':>5} {name:>10} " + " ".join(f"{statistics.median(x[c] for x in mine):>13.1f}" for c in cols))
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"jobs": a.jobs, "seconds": a.seconds, "high_percent": a.high, "rounds": rounds}, f, indent=1)
finally:
    shutil.rmtree(D, ignore_errors=True)
