#!/usr/bin/python3
"""The cost of one NBD round trip, as issue 9 measures it: a libnbd client (Python, QD1, one
connection over a Unix socket) in a loop of "write 4 KiB, FLUSH", and in a loop of 4 KiB reads
of data already cached, against
  raw      the same loop on a plain file: pwrite + fdatasync, and O_DIRECT preads (the way
           tiercache reads its cache device),
  nbdkit   nbdkit's file plugin on a file beside it, the same client,
  tiercache `tiercache serve --nbd unix:` on a cache file and a backing file, the same client.
Rounds of SECONDS alternate between the three; each row reports the median round and its ratio
to raw and to nbdkit. All files live in DIR (default /var/tmp/tiercache-nbdrt), one disk.

Needs python3-libnbd and nbdkit:  apt-get install python3-libnbd nbdkit
Usage: bench/nbd-roundtrip.py [--rounds 5] [--seconds 3] [--tiercache PATH] [--json FILE]"""
import argparse, json, mmap, os, random, shutil, statistics, subprocess, sys, time

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
here = os.path.dirname(os.path.abspath(__file__))
ap.add_argument("--tiercache", default=shutil.which("tiercache") or os.path.join(here, "../target/release/tiercache"))
ap.add_argument("--dir", default="/var/tmp/tiercache-nbdrt")
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--seconds", type=float, default=3)
ap.add_argument("--json", help="also write the rounds as JSON here")
a = ap.parse_args()
try:
    import nbd
except ImportError:
    sys.exit("python3-libnbd is missing (apt-get install python3-libnbd; run with /usr/bin/python3)")
if not shutil.which("nbdkit"):
    sys.exit("nbdkit is missing: apt-get install nbdkit")
if not os.access(a.tiercache, os.X_OK):
    sys.exit(f"{a.tiercache}: no tiercache binary (cargo build --release, or --tiercache PATH)")
T, D = a.tiercache, a.dir
SIZE = 256 << 20
SPAN = 4096  # blocks the loops touch (16 MiB: cached in every target after the warm-up)
shutil.rmtree(D, ignore_errors=True)
os.makedirs(D)
procs = []


def sh(*args, **kw):
    return subprocess.run(list(args), check=True, **kw)


def connect(sock):
    for _ in range(200):
        h = nbd.NBD()
        try:
            h.connect_unix(sock)
            return h
        except nbd.Error:
            time.sleep(0.05)
    sys.exit(f"nothing serves {sock}")


class Raw:
    def __init__(self, path):
        self.fd = os.open(path, os.O_RDWR)
        self.dfd = os.open(path, os.O_RDWR | os.O_DIRECT)
        self.buf = mmap.mmap(-1, 4096)  # page-aligned, for O_DIRECT

    def write_flush(self, off, data):
        os.pwrite(self.fd, data, off)
        os.fdatasync(self.fd)

    def fill(self, data):
        for off in range(0, SPAN * 4096, len(data)):
            os.pwrite(self.fd, data, off)
        os.fdatasync(self.fd)

    def read(self, off):
        os.preadv(self.dfd, [self.buf], off)


class Nbd:
    def __init__(self, sock):
        self.h = connect(sock)

    def write_flush(self, off, data):
        self.h.pwrite(data, off)
        self.h.flush()

    def fill(self, data):
        for off in range(0, SPAN * 4096, len(data)):
            self.h.pwrite(data, off)
        self.h.flush()

    def read(self, off):
        self.h.pread(4096, off)

    def close(self):
        self.h.shutdown()  # NBD_CMD_DISC; the handle closes when dropped


def loop(target, op, seconds):
    data = os.urandom(4096)
    rng = random.Random(1)
    n, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(64):
            off = rng.randrange(SPAN) * 4096
            if op == "write+flush":
                target.write_flush(off, data)
            else:
                target.read(off)
        n += 64
    return n / seconds


result = {"rounds": [], "medians": {}}
targets = {}
try:
    for name in ("raw", "nbdkit", "back"):
        with open(f"{D}/{name}", "wb") as f:
            f.truncate(SIZE)
    sh(T, "create", "--cache", f"{D}/cache", "--cache-size", "128M", "--backing", f"{D}/back",
       stdout=subprocess.DEVNULL)
    tc_sock, k_sock = f"{D}/t.sock", f"{D}/k.sock"
    procs.append(subprocess.Popen([T, "serve", "--cache", f"{D}/cache", "--backing", f"{D}/back", "--nbd",
                                   f"unix:{tc_sock}", "--control", f"{D}/ctl.sock"], stderr=subprocess.DEVNULL))
    procs.append(subprocess.Popen(["nbdkit", "-f", "-U", k_sock, "file", f"{D}/nbdkit"]))
    targets = {"raw": Raw(f"{D}/raw"), "nbdkit": Nbd(k_sock), "tiercache": Nbd(tc_sock)}
    for t in targets.values():  # warm-up: write the span once, so reads hit everywhere
        t.fill(b"\1" * (1 << 20))
        loop(t, "write+flush", 0.5)
        loop(t, "read", 0.5)
    ops = ("write+flush", "read")
    for r in range(a.rounds):
        row = {}
        for op in ops:
            for name, t in targets.items():
                row[f"{name} {op}"] = loop(t, op, a.seconds)
        result["rounds"].append(row)
        print(f"round {r + 1}/{a.rounds}: " + ", ".join(f"{k} {v:,.0f}/s" for k, v in row.items()), file=sys.stderr)
    print(f"{'loop':<12} {'raw /s':>9} {'nbdkit /s':>10} {'tiercache /s':>13} {'tc/raw':>7} {'tc/nbdkit':>10}")
    for op in ops:
        med = {n: statistics.median(r[f"{n} {op}"] for r in result["rounds"]) for n in targets}
        result["medians"][op] = med
        print(f"{op:<12} {med['raw']:>9,.0f} {med['nbdkit']:>10,.0f} {med['tiercache']:>13,.0f} "
              f"{med['tiercache'] / med['raw']:>7.2f} {med['tiercache'] / med['nbdkit']:>10.2f}")
    print(f"(medians of {a.rounds} alternating rounds of {a.seconds:g} s; one connection, QD1; files in {D})")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)
finally:
    for t in targets.values():
        if isinstance(t, Nbd):
            try:
                t.close()  # nbdkit waits for its clients before it exits
            except Exception:  # the servers are stopped below whatever happened here
                pass
    for p in procs:
        p.terminate()
        p.wait()
    shutil.rmtree(D, ignore_errors=True)
