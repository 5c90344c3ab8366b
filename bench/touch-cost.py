#!/usr/bin/python3
"""What an O_DIRECT I/O costs when the CPU has just touched its buffer, against the same I/O
from a buffer nobody touches: the question behind `bench seq`'s rows at queue depth 1.

`bench seq`'s raw rows read into (and write from) one buffer per worker that the CPU never
reads or fills between requests. The hybrid volume cannot do that: it checksums every block
it reads from the cache (issue 13 keeps that check) and copies every block it writes into a
record buffer with its checksum. On some machines (this VM's virtio disk, 2026-11-30) an I/O
into or out of memory the CPU has just read or written takes longer by itself, beyond the
CPU's own time. This measures that on a file, with a huge-page buffer as both sides use:

  reads   READ_KIB requests, in order through the file; "untouched": one pread after another
          into the same buffer; "touched": each pread followed by a read of every byte of the
          buffer (a copy out of it, as a checksum reads it)
  writes  WRITE_KIB requests; "untouched": the same buffer written again and again;
          "touched": the buffer refilled by a copy before each write (as a record is built)

Rounds alternate the two ways; each row gives the median round's time per I/O (the syscall
alone, not the touching) and the ratio touched / untouched.

Usage: bench/touch-cost.py [--file PATH] [--size-mib 128] [--rounds 5] [--requests 256]
                           [--read-kib 256] [--write-kib 508] [--json]
The file (default /var/tmp/tiercache-touch-cost) is created, written once, and removed."""
import argparse, ctypes, json, mmap, os, statistics, sys, time

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument("--file", default="/var/tmp/tiercache-touch-cost")
ap.add_argument("--size-mib", type=int, default=128)
ap.add_argument("--rounds", type=int, default=5)
ap.add_argument("--requests", type=int, default=256, help="I/Os per round and way")
ap.add_argument("--read-kib", type=int, default=256)
ap.add_argument("--write-kib", type=int, default=508)
ap.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
a = ap.parse_args()
for name in ("read_kib", "write_kib"):
    if getattr(a, name) % 4 or not 4 <= getattr(a, name) <= 2048:
        sys.exit(f"--{name.replace('_', '-')} must be a multiple of 4 between 4 and 2048")
if a.rounds < 1 or a.requests < 1 or a.size_mib * 1024 < 2 * max(a.read_kib, a.write_kib):
    sys.exit("--rounds and --requests must be at least 1, and the file hold two requests")

HUGE = 2 << 20


def huge_buffer():
    """2 MiB, aligned to 2 MiB and in a transparent huge page where the kernel grants it."""
    # (Private: an anonymous shared mapping is shmem, which THP serves only where shmem_enabled
    # allows.)
    m = mmap.mmap(-1, 2 * HUGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    start = (-ctypes.addressof(ctypes.c_char.from_buffer(m))) % HUGE
    view = memoryview(m)
    if hasattr(mmap, "MADV_HUGEPAGE"):
        m.madvise(mmap.MADV_HUGEPAGE, start, HUGE)
    buf = view[start:start + HUGE]
    buf[:] = bytes([7]) * HUGE
    return m, buf


size = a.size_mib << 20
fd = os.open(a.file, os.O_RDWR | os.O_CREAT, 0o600)
try:
    os.ftruncate(fd, size)
    keep_m, buf = huge_buffer()
    src_m, src = huge_buffer()
    huge_kib = sum(int(l.split()[1]) for l in open("/proc/self/smaps_rollup") if l.startswith("AnonHugePages"))
    huge = huge_kib >= 2 * HUGE // 1024
    dfd = os.open(a.file, os.O_RDWR | os.O_DIRECT)
    # Written once so that reads read data, not holes.
    for off in range(0, size, HUGE):
        os.pwritev(dfd, [buf[:min(HUGE, size - off)]], off)
    os.fsync(dfd)

    def one_round(write, touched):
        n = (a.write_kib if write else a.read_kib) << 10
        spent = 0.0
        for k in range(a.requests):
            off = (k * n) % (size - n) // 4096 * 4096
            piece = buf[:n]
            if touched and write:
                piece[:] = src[:n]  # the buffer filled, as a record is built
            t = time.perf_counter()
            done = os.pwritev(dfd, [piece], off) if write else os.preadv(dfd, [piece], off)
            spent += time.perf_counter() - t
            if done != n:
                sys.exit(f"short I/O: {done} of {n} bytes at {off}")
            if touched and not write:
                piece.tobytes()  # every byte read, as a checksum reads them
        return spent / a.requests * 1e6

    rows = {}
    for write in (False, True):
        times = {False: [], True: []}
        for r in range(a.rounds):
            for touched in ((False, True) if r % 2 == 0 else (True, False)):
                times[touched].append(one_round(write, touched))
        kind = "write" if write else "read"
        kib = a.write_kib if write else a.read_kib
        u, t = statistics.median(times[False]), statistics.median(times[True])
        rows[kind] = {"kib": kib, "untouched_us": round(u, 1), "touched_us": round(t, 1), "ratio": round(t / u, 2),
                      "rounds_untouched_us": [round(x, 1) for x in times[False]],
                      "rounds_touched_us": [round(x, 1) for x in times[True]]}
    os.close(dfd)
finally:
    os.close(fd)
    os.unlink(a.file)

if a.json:
    print(json.dumps({"file": a.file, "huge_pages": huge, "rounds": a.rounds, "requests": a.requests, "rows": rows}, indent=2))
else:
    pages = "huge-page buffers" if huge else "buffers in 4 KiB pages (no transparent huge page granted)"
    print(f"{a.file}: O_DIRECT, one request at a time, {pages}; median of {a.rounds} rounds")
    print(f"{'I/O':<14}{'untouched us':>14}{'touched us':>12}{'ratio':>7}")
    for kind, r in rows.items():
        print(f"{kind + ' ' + str(r['kib']) + ' KiB':<14}{r['untouched_us']:>14}{r['touched_us']:>12}{r['ratio']:>7}")
