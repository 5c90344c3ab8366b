#!/usr/bin/python3
"""The seed experiments (docs/seeds.md) as one command, with charts and a report.

    bench/seeds.py race|sweep|dirty|latency|fsync|all [--quick | --scale F] [--json]
                   [--slow hdd|sata-raid5] [--results DIR] [--workdir DIR]
    bench/seeds.py report [--results DIR]          (re-writes report.md from the JSON there)

  race     seed 1 (Intel CAS + Optane over RAID5, 5.6x): one sysbench database staged on the
           slow device, the same image copied to a second slow device, a cache attached to one
           of them without reformatting (bolt-on), warmed by a read-only run, then both run in
           parallel to the same number of transactions; the same database on the fast device
           alone is the ceiling.
  sweep    seed 5 (buy RAM or SSD?): a fixed data size, the buffer pool grown from about
           data/8 to above the data size (online, so each point starts warm); tps for slow
           alone, fast alone and hybrid at each point.
  dirty    seed 3 (FlashCache, 20 % vs 80 % dirty threshold, 1.7x): a write-only workload
           larger than the cache on two hybrid volumes in parallel, one with the high dirty
           watermark at 20 %, one at 80 %; tps and dirty data over time.
  latency  seed 4 (Optane vs NAND under MySQL, small buffer pool): p95/p99 per concurrency
           for slow alone, hybrid with an optane-profile cache, hybrid with an nvme-profile
           cache, and the fast device alone.
  fsync    seed 2: `tiercache bench fsync` (emulated devices; with --cache/--backing the real
           ones too), included in the report.
  all      every experiment above, then the report.

Every volume reaches MariaDB the same way: `tiercache serve --fuse`, `losetup --direct-io=on`,
ext4, mount; only what is behind the FUSE file differs (a raw file, an emulated slow device,
or the hybrid volume of the two). MariaDB commits durably (innodb_flush_log_at_trx_commit=1,
O_DIRECT). Slow devices are emulated profiles (--slow; every chart's caption says which).

Kernel caches: where the kernel has dm-writecache, dm-cache or bcache, each experiment runs
them as extra rows on the same devices (--kernel-caches auto|none|LIST; docs/BENCHMARKS.md
says how each is set up). The report says which ran and why the others did not.

On real hardware: --cache /dev/nvme0n1 --backing /dev/md0 [--backing2 /dev/md1] --destructive
(race and dirty need a second slow device: the race's slow volume, the dirty experiment's copy
of the staged image; without --backing2 they are skipped). The devices are used as they are,
with no emulation; the cache device and the first --set volume bytes of the backing devices
are overwritten. With one cache device the dirty experiment's volumes and the kernel caches
run one after another, and the latency experiment's rows are the cache device alone, the
hybrid and the slow device alone (docs/BENCHMARKS.md, "On real hardware").

Results: DIR/EXPERIMENT.json, DIR/EXPERIMENT-*.png and .svg, DIR/report.md (default DIR:
bench-results/ in the current directory). --json also prints the experiment's JSON on stdout.
Databases run on loopback ports (3310-3317) with data directories under --workdir; nothing
stays mounted, attached or running after a run, even one stopped with Ctrl-C.
Needs root (loop devices, mounts); installs mariadb-server, sysbench, python3-matplotlib.
"""

import argparse
import datetime
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGES = ["mariadb-server", "sysbench", "python3-matplotlib", "fuse3", "e2fsprogs", "util-linux"]
EXPERIMENTS = ["race", "sweep", "dirty", "latency", "fsync"]
MIB = 1 << 20

# Default scale: each experiment runs in minutes on a 2-core machine. --scale multiplies the
# data sizes (rows, cache, buffer pool, volume); --quick is a smoke run in well under a minute
# of measuring per experiment (used by the tests).
DEFAULTS = {
    "race": dict(tables=8, table_size=250_000, cache="160M", buffer_pool="32M", volume="2G",
                 threads=8, warm_seconds=60, events=4000, cap_seconds=600),
    "sweep": dict(tables=4, table_size=250_000, cache="160M", volume="2G", threads=8,
                  warm_seconds=15, seconds=30, fractions=[0.125, 0.25, 1 / 3, 0.5, 1.25]),
    "dirty": dict(tables=8, table_size=250_000, cache="128M", buffer_pool="32M", volume="2G",
                  threads=8, seconds=300, highs=[20, 80]),
    "latency": dict(tables=4, table_size=250_000, cache="384M", buffer_pool="16M", volume="2G",
                    threads_list=[1, 4, 16, 64], warm_seconds=15, seconds=20),
}
QUICK = {
    "race": dict(tables=2, table_size=10_000, cache="16M", buffer_pool="8M", volume="256M",
                 threads=4, warm_seconds=5, events=200, cap_seconds=60),
    "sweep": dict(tables=2, table_size=10_000, cache="16M", volume="256M", threads=4,
                  warm_seconds=3, seconds=5, fractions=[0.5, 1.25]),
    "dirty": dict(tables=2, table_size=10_000, cache="16M", buffer_pool="8M", volume="256M",
                  threads=4, seconds=15, highs=[20, 80]),
    "latency": dict(tables=2, table_size=10_000, cache="48M", buffer_pool="8M", volume="256M",
                    threads_list=[1, 4], warm_seconds=3, seconds=5),
}


# ---------------------------------------------------------------------------------------------
# Small helpers


def log(msg):
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def phase(name):
    print(f"\n== {name}", file=sys.stderr, flush=True)


def parse_size(s):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)([KMGT]?)i?B?", str(s).strip(), re.I)
    if not m:
        raise ValueError(f"not a size: {s!r} (e.g. 160M, 2G)")
    return int(float(m.group(1)) * {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}[m.group(2).upper()])


def mib(n):
    return f"{n / MIB:.0f} MiB"


def run(cmd, check=True, quiet=True, **kw):
    """Runs a short command; its output is returned (stderr shown on failure)."""
    p = subprocess.run(cmd, capture_output=True, text=True, **kw)
    if check and p.returncode != 0:
        raise RuntimeError(f"{' '.join(map(str, cmd))} failed ({p.returncode}): {p.stderr.strip() or p.stdout.strip()}")
    return p.stdout


def apt_install(packages):
    missing = [p for p in packages
               if "ok installed" not in subprocess.run(["dpkg-query", "-W", "-f=${Status}", p],
                                                       capture_output=True, text=True).stdout]
    if not missing:
        return
    log(f"installing {' '.join(missing)}")
    for attempt in range(10):
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        if (subprocess.run(["apt-get", "update", "-qq"], env=env).returncode == 0
                and subprocess.run(["apt-get", "install", "-y", "-qq", *missing], env=env).returncode == 0):
            return
        log(f"apt-get failed (attempt {attempt + 1}; another apt may hold the lock); retrying in 15 s")
        time.sleep(15)
    sys.exit(f"seeds: could not install {' '.join(missing)}")


def median(xs):
    return statistics.median(xs) if xs else None


def percentile_from_histogram(hist, p):
    """hist: [(value_ms, count)] as sysbench prints it; the value at the p-th fraction."""
    total = sum(c for _, c in hist)
    if total == 0:
        return None
    need = p * total
    acc = 0
    for v, c in sorted(hist):
        acc += c
        if acc >= need:
            return v
    return sorted(hist)[-1][0]


def moving_average(xs, window):
    out = []
    for i in range(len(xs)):
        lo = max(0, i - window + 1)
        out.append(sum(xs[lo:i + 1]) / (i + 1 - lo))
    return out


def settle_time(series, window=None, band=0.25):
    """The first second after which the `window`-second moving average of `series` (one value
    per second; by default a tenth of the run, at least 10 s: a database on an HDD commits in
    bursts) stays within +-band of the median of the run's last third; None if it never
    does. Returns (seconds, settled_rate)."""
    window = window or max(10, len(series) // 10)
    if len(series) < 3 * window:
        return None, median(series)
    settled = median(series[len(series) * 2 // 3:])
    if not settled:
        return None, settled
    avg = moving_average(series, window)
    t = None
    for i in range(len(avg) - 1, window - 2, -1):
        if abs(avg[i] - settled) > band * settled:
            break
        t = i
    return (t + 1 if t is not None else None), settled


# ---------------------------------------------------------------------------------------------
# Resources: everything started or attached registers its undo here, and is undone in reverse
# order on any exit (normal, error, Ctrl-C, SIGTERM).


class Cleanup:
    """Undo steps, run in reverse order on any exit. A token names one step for good (ids are
    never reused), so a step popped by its owner after `run_all` has begun is a no-op."""

    def __init__(self):
        self.steps = {}  # token -> (what, fn), in insertion order
        self.next = 0

    def push(self, what, fn):
        self.next += 1
        self.steps[self.next] = (what, fn)
        return self.next

    def forget(self, token):
        """Drops a step without running it (its owner's own undo now covers it)."""
        self.steps.pop(token, None)

    def pop(self, token):
        """Runs one undo now (out of order is fine: each undo is idempotent)."""
        step = self.steps.pop(token, None)
        if step:
            step[1]()

    def run_all(self):
        while self.steps:
            what, fn = self.steps.pop(next(reversed(self.steps)))
            try:
                fn()
            except Exception as e:  # keep undoing the rest
                log(f"cleanup: {what}: {e}")


CLEANUP = Cleanup()


def on_signal(signum, _frame):
    raise KeyboardInterrupt(f"signal {signum}")


def unmount(mnt):
    """Unmounts MNT if mounted, retrying while busy for 10 s, then lazily."""
    for _ in range(50):
        if subprocess.run(["mountpoint", "-q", mnt]).returncode != 0:
            return
        if subprocess.run(["umount", mnt], capture_output=True).returncode == 0:
            return
        time.sleep(0.2)
    run(["umount", "-l", mnt], check=False)


def stop_process(p, sig=signal.SIGTERM, timeout=120):
    if p.poll() is not None:
        return
    p.send_signal(sig)
    try:
        p.wait(timeout)
    except subprocess.TimeoutExpired:
        log(f"pid {p.pid} did not stop within {timeout} s: SIGKILL")
        p.kill()
        p.wait()


# ---------------------------------------------------------------------------------------------
# A volume served by tiercache and mounted as ext4


class Stack:
    """One volume through `tiercache serve --fuse`, a loop device with direct I/O, and ext4.

    kind "passthrough": serve DEVICE itself (the fast or slow device alone).
    kind "hybrid": `create` a cache on CACHE for BACKING (bolt-on: BACKING keeps its ext4), then
    serve the pair.
    """

    def __init__(self, ctx, name, kind, device=None, cache=None, backing=None, cache_size=None,
                 serve_extra=()):
        self.ctx, self.name, self.kind = ctx, name, kind
        self.device, self.cache, self.backing, self.cache_size = device, cache, backing, cache_size
        self.serve_extra = list(serve_extra)
        self.dir = os.path.join(ctx.workdir, name)
        self.fuse = os.path.join(self.dir, "fuse")
        self.mnt = os.path.join(self.dir, "mnt")
        self.control = os.path.join(self.dir, "control.sock")
        self.server = self.loop = None
        self.token = None

    def describe(self):
        if self.kind == "passthrough":
            return self.device
        return f"cache {self.cache} + backing {self.backing}"

    def up(self, mkfs_size=None, mount=True):
        """Serves the volume and attaches its loop device; mounts its ext4 unless `mount` is
        False (a kernel cache's slow device: the block device is what it needs)."""
        os.makedirs(self.fuse, exist_ok=True)
        os.makedirs(self.mnt, exist_ok=True)
        tc = self.ctx.tc
        if self.kind == "passthrough":
            cmd = [tc, "serve", "--passthrough", self.device, "--fuse", self.fuse]
        else:
            create = [tc, "create", "--cache", self.cache, "--backing", self.backing]
            if self.cache_size and not self.cache.startswith("/dev/"):
                path = self.cache.split(":")[-1]
                if os.path.exists(path):
                    os.unlink(path)
                create += ["--cache-size", str(self.cache_size)]
            if self.ctx.real:
                create.append("--force")
            run(create)
            cmd = [tc, "serve", "--cache", self.cache, "--backing", self.backing, "--fuse", self.fuse,
                   "--control", self.control, *self.serve_extra]
        logf = open(os.path.join(self.dir, "serve.log"), "a")
        # Its own session: Ctrl-C reaches this script only, which then takes the stack down in
        # order (database, file system, loop device, server).
        self.server = subprocess.Popen(cmd, stdout=logf, stderr=logf, start_new_session=True)
        self.token = CLEANUP.push(f"stack {self.name}", self.down)
        vol = os.path.join(self.fuse, "volume")
        for _ in range(600):
            if os.path.exists(vol):
                break
            if self.server.poll() is not None:
                raise RuntimeError(f"{self.name}: tiercache serve exited: {open(logf.name).read()[-2000:]}")
            time.sleep(0.1)
        else:
            raise RuntimeError(f"{self.name}: {vol} did not appear in 60 s")
        self.loop = run(["losetup", "--direct-io=on", "--show", "-f", vol]).strip()
        if mkfs_size is not None:
            # (4 KiB blocks even for a small --quick volume: dm-writecache exposes 4 KiB sectors.)
            run(["mkfs.ext4", "-q", "-F", "-b", "4096", "-E", "nodiscard", self.loop, f"{mkfs_size // 1024}k"])
        if mount:
            run(["mount", self.loop, self.mnt])
        return self

    def down(self):
        if self.loop:
            unmount(self.mnt)
            run(["losetup", "-d", self.loop], check=False)
            self.loop = None
        if self.server:
            stop_process(self.server)
            self.server = None
        if subprocess.run(["mountpoint", "-q", self.fuse]).returncode == 0:
            run(["umount", "-l", self.fuse], check=False)

    def close(self):
        if self.token is not None:
            CLEANUP.pop(self.token)
            self.token = None

    def preload(self, paths):
        """`tiercache preload` of files on this volume's ext4 (the hybrid's cache warmed at the
        backing device's sequential speed, the blocks kept as hot)."""
        out = run([self.ctx.tc, "preload", "--cache", self.cache, "--control", self.control, "--json", *paths])
        return json.loads(out)

    def status(self):
        if self.kind != "hybrid":
            return None
        out = subprocess.run([self.ctx.tc, "status", "--cache", self.cache, "--control", self.control, "--json"],
                             capture_output=True, text=True, timeout=30)
        return json.loads(out.stdout) if out.returncode == 0 else None


def sectors(dev):
    return int(run(["blockdev", "--getsz", dev]).strip())


def write_sysfs(path, value):
    with open(path, "w") as f:
        f.write(str(value))


class KernelStack:
    """One volume on a kernel cache (dm-writecache, dm-cache or bcache) over a fast and a slow
    device, mounted as ext4: the extra rows where the kernel has them. Same interface as Stack
    (up, down, close, status, dir, mnt), so MariaDB and sysbench run on it the same way.

    FAST and SLOW are what `serve` takes. A real block device is used as it is; a plain file
    becomes a loop device with direct I/O (so the kernel cache reaches its fast device without
    a user-space frontend in between, as it would on a server); an emulated profile
    (`emulated:hdd:FILE`) is served by `tiercache serve --passthrough --fuse` with a loop device
    over that file (the emulation lives in tiercache: the slow-alone volume takes the same
    path). dm-writecache and dm-cache are bolted onto the slow device's existing ext4, as
    tiercache is. bcache cannot be: `make-bcache -B` writes its superblock where the file
    system starts, so the backing device is formatted for bcache and IMAGE (the staged ext4) is
    copied in through /dev/bcacheN, which hides those first 8 KiB.

    `settings`: dm-writecache's optional arguments (high_watermark, low_watermark, ...).
    `clean_on_down`: write every dirty block back before taking the cache apart (real devices,
    where the backing device must hold the database for the next row); on files the cache's
    dirty data is simply dropped with them.
    """

    def __init__(self, ctx, name, kind, fast, slow, cache_size=None, image=None, settings=None,
                 clean_on_down=False, mount=True):
        assert kind in KERNEL_CACHES
        self.ctx, self.name, self.kind = ctx, name, kind
        self.fast, self.slow, self.cache_size, self.image = fast, slow, cache_size, image
        self.settings = dict(settings or {})
        self.clean_on_down, self.mount = clean_on_down, mount
        self.dir = os.path.join(ctx.workdir, name)
        self.mnt = os.path.join(self.dir, "mnt")
        self.dm = "tcseeds-" + re.sub(r"[^a-z0-9]+", "-", name.lower())  # dmsetup names
        self.parts = []  # what `down` undoes, in reverse: (what, fn)
        self.dev = None
        self.bcache = None
        self.token = None

    def describe(self):
        return f"{self.kind}: cache {self.fast} + backing {self.slow}"

    def _block_device(self, spec, role, size=None):
        """A block device for SPEC (see the class doc)."""
        if spec.startswith("/dev/"):
            return spec
        if spec.startswith("emulated:"):
            st = Stack(self.ctx, f"{self.name}-{role}", "passthrough", device=spec)
            self.parts.append((f"{role} server", lambda: (st.down(), st.close())))
            st.up(mount=False)
            # From here this stack's own undo takes the server down, after what sits on it
            # (the global step, pushed after this stack's, would run first).
            CLEANUP.forget(st.token)
            st.token = None
            return st.loop
        if size is not None:
            with open(spec, "ab") as f:
                f.truncate(size)
        # (The undo first: an interrupt may land after losetup attached the file.)
        self.parts.append((f"{role} loop", lambda: [run(["losetup", "-d", line.split(":")[0]], check=False)
                                                    for line in run(["losetup", "-j", spec]).splitlines()]))
        return run(["losetup", "--direct-io=on", "--show", "-f", spec]).strip()

    def _dmsetup_create(self, name, table):
        self.parts.append((f"dm {name}", lambda: self._dm_remove(name)))
        run(["dmsetup", "create", name, "--table", table])
        run(["dmsetup", "mknodes", name], check=False)
        return f"/dev/mapper/{name}"

    def _dm_remove(self, name):
        for _ in range(50):
            if subprocess.run(["dmsetup", "info", name], capture_output=True).returncode != 0:
                return
            if subprocess.run(["dmsetup", "remove", name], capture_output=True).returncode == 0:
                return
            time.sleep(0.2)
        if self.clean_on_down:
            # (Never --force on a real device: dirty data could still be in flight.)
            raise RuntimeError(f"{name} stays busy; left in place (remove it with dmsetup remove {name})")
        run(["dmsetup", "remove", "--force", name], check=False)

    def up(self):
        os.makedirs(self.mnt, exist_ok=True)
        self.token = CLEANUP.push(f"kernel cache {self.name}", self.down)
        fast_size = parse_size(self.cache_size) if self.cache_size and not self.fast.startswith("/dev/") else None
        if fast_size and self.fast.startswith("emulated:"):
            path = self.fast.split(":", 2)[2]
            with open(path, "ab") as f:
                f.truncate(fast_size)
        fast = self._block_device(self.fast, "fast", fast_size)
        slow = self._block_device(self.slow, "slow")
        # A cache device that held something else must not be taken for a cache of this volume.
        run(["dd", "if=/dev/zero", f"of={fast}", "bs=1M", "count=8", "oflag=direct", "status=none"])
        if self.kind == "dm-writecache":
            opts = [f"{k} {v}" for k, v in self.settings.items()]
            args = " ".join(opts)
            n = 2 * len(opts)
            self.dev = self._dmsetup_create(self.dm, f"0 {sectors(slow)} writecache s {slow} {fast} 4096 {n} {args}".rstrip())
        elif self.kind == "dm-cache":
            # Metadata: what it needs, 4 MiB + 16 bytes per block, rounded up to a MiB; blocks
            # of 64 KiB, lvmcache's default; smq, write-back.
            total = sectors(fast)
            meta = (4 * MIB + 16 * (total // 128) + MIB - 1) // MIB * MIB // 512
            mdev = self._dmsetup_create(self.dm + "-meta", f"0 {meta} linear {fast} 0")
            ddev = self._dmsetup_create(self.dm + "-data", f"0 {total - meta} linear {fast} {meta}")
            self.table = f"0 {sectors(slow)} cache {mdev} {ddev} {slow} 128 1 writeback smq 0"
            self.dev = self._dmsetup_create(self.dm, self.table)
        else:
            run(["dd", "if=/dev/zero", f"of={slow}", "bs=1M", "count=8", "oflag=direct", "status=none"])
            # Buckets of 512 KiB (its default) unless the cache would have fewer than 1,024 of
            # them (make-bcache refuses under 128: a --quick cache is 16 MiB).
            bucket = 512 * 1024
            while sectors(fast) * 512 // bucket < 1024 and bucket > 16 * 1024:
                bucket //= 2
            fastname, slowname = os.path.basename(fast), os.path.basename(slow)
            self.parts.append(("bcache", lambda: self._bcache_stop(fastname, slowname)))
            run(["make-bcache", "--wipe-bcache", "--bucket", f"{bucket // 1024}k", "-C", fast, "-B", slow,
                 "--writeback"])
            for d in (fast, slow):
                subprocess.run(["sh", "-c", f"echo {d} > /sys/fs/bcache/register"], capture_output=True)
            name = os.path.basename(slow)
            for _ in range(100):
                found = [b for b in os.listdir("/sys/block") if b.startswith("bcache")
                         and os.path.exists(f"/sys/block/{b}/slaves/{name}")]
                if found:
                    break
                time.sleep(0.2)
            else:
                raise RuntimeError(f"{self.name}: bcache did not come up over {slow}")
            self.bcache = found[0]
            self.dev = f"/dev/{self.bcache}"
            sysfs = f"/sys/block/{self.bcache}/bcache"
            for _ in range(50):
                if os.path.exists(f"{sysfs}/cache"):  # attached to its cache set
                    break
                time.sleep(0.2)
            else:
                # (Else the row would measure the slow device through bcache, uncached.)
                raise RuntimeError(f"{self.name}: {self.dev} did not attach to its cache set "
                                   f"(state: {open(f'{sysfs}/state').read().strip()})")
            if self.image:
                # The image goes straight to the backing device, not through the cache.
                write_sysfs(f"{sysfs}/cache_mode", "none")
                log(f"{self.name}: copying the image into {self.dev} (bcache's superblock took the device's start)")
                run(["dd", f"if={self.image}", f"of={self.dev}", "bs=4M", "conv=sparse,fsync", "oflag=direct",
                     "status=none"])
                write_sysfs(f"{sysfs}/cache_mode", "writeback")
        if self.mount:
            run(["mount", self.dev, self.mnt])
        return self

    def _bcache_stop(self, fastname, slowname):
        if self.clean_on_down and self.bcache:
            # Write back: no dirty data may stay behind on a real backing device.
            sysfs = f"/sys/block/{self.bcache}/bcache"
            if os.path.exists(sysfs):
                write_sysfs(f"{sysfs}/writeback_percent", 0)
                write_sysfs(f"{sysfs}/cache_mode", "writethrough")
                self._wait(lambda: re.fullmatch(r"0(\.0+)?[kMGT]?", open(f"{sysfs}/dirty_data").read().strip()),
                           "bcache write-back")
        # (Through the members' own sysfs: this works before /dev/bcacheN has appeared too.)
        if os.path.exists(f"/sys/block/{slowname}/bcache/stop"):
            write_sysfs(f"/sys/block/{slowname}/bcache/stop", 1)
        cset = f"/sys/block/{fastname}/bcache/set"
        if os.path.exists(cset):
            write_sysfs(os.path.join(os.path.realpath(cset), "stop"), 1)
        self._wait(lambda: not os.path.exists(f"/sys/block/{fastname}/bcache")
                   and not os.path.exists(f"/sys/block/{slowname}/bcache"), "bcache to stop", seconds=120)
        self.bcache = None

    def _wait(self, done, what, seconds=3600):
        deadline = time.monotonic() + seconds
        while not done():
            if time.monotonic() > deadline:
                raise RuntimeError(f"{self.name}: {what} did not finish in {seconds} s")
            time.sleep(0.5)

    def _clean_dm(self):
        """Writes every dirty block back before the dm cache is removed (real devices)."""
        if self.kind == "dm-writecache":
            run(["dmsetup", "message", self.dm, "0", "flush_on_suspend"])
            run(["dmsetup", "suspend", self.dm])  # returns once written back
            f = self.dm_status()
            if f[3] != "0" or f[6] != "0":  # error indicator, blocks under write-back
                raise RuntimeError(f"{self.name}: dm-writecache did not write everything back (status: "
                                   f"{' '.join(f)}); left in place")
        elif self.kind == "dm-cache":
            run(["dmsetup", "suspend", self.dm])
            run(["dmsetup", "reload", self.dm, "--table", self.table.replace("writeback smq 0", "writeback cleaner 0")])
            run(["dmsetup", "resume", self.dm])
            self._wait(lambda: self.dm_status()[13] == "0", "dm-cache write-back (cleaner policy)")

    def warm(self, paths):
        """Reads the files under PATHS twice with direct I/O (bcache's sequential cutoff lifted
        meanwhile, or it would pass the reads by)."""
        sysfs = f"/sys/block/{self.bcache}/bcache/sequential_cutoff" if self.bcache else None
        cutoff = open(sysfs).read().strip() if sysfs else None
        if sysfs:
            write_sysfs(sysfs, 0)
        for _ in range(2):
            for root in paths:
                for d, _, fs in os.walk(root):
                    for f in fs:
                        run(["dd", f"if={os.path.join(d, f)}", "of=/dev/null", "bs=1M", "iflag=direct",
                             "status=none"], check=False)
        if sysfs:
            write_sysfs(sysfs, parse_size(cutoff))

    def dm_status(self):
        return run(["dmsetup", "status", self.dm]).split()

    def down(self):
        if self.dev:
            unmount(self.mnt)
            if self.clean_on_down and self.kind != "bcache":
                # (If this fails the devices stay: removing them would drop dirty data that
                # the real backing device does not hold.)
                self._clean_dm()
            self.dev = None
        while self.parts:
            what, fn = self.parts[-1]
            try:
                fn()
            except Exception as e:  # undo the rest anyway
                log(f"{self.name}: taking down {what}: {e}")
            # (Popped once done: a Ctrl-C in the middle leaves it for the next attempt.)
            self.parts.pop()

    def close(self):
        if self.token is not None:
            CLEANUP.pop(self.token)
            self.token = None

    def status(self):
        """Read hits and misses as the kernel cache counts them (requests, not blocks; none for
        dm-writecache before Linux 5.15, which does not count reads), in `status`'s shape."""
        try:
            if self.kind == "dm-cache":
                f = self.dm_status()
                h, m = int(f[7]), int(f[8])
            elif self.kind == "dm-writecache":
                f = self.dm_status()
                if len(f) < 9:
                    return None
                reads, h = int(f[7]), int(f[8])
                m = reads - h
            else:
                base = f"/sys/block/{self.bcache}/bcache/stats_total"
                h, m = (int(open(f"{base}/{k}").read()) for k in ("cache_hits", "cache_misses"))
        except (RuntimeError, OSError, ValueError, IndexError):
            return None
        return {"counters": {"read_hit_blocks": h, "read_miss_blocks": m}}


class StatusSampler(threading.Thread):
    """Samples a hybrid volume's `status` every `period` seconds (dirty data, hits, write-back)."""

    def __init__(self, stack, period=2.0):
        super().__init__(daemon=True)
        self.stack, self.period = stack, period
        self.samples = []
        self.stop_event = threading.Event()
        self.t0 = time.monotonic()

    def run(self):
        while not self.stop_event.is_set():
            try:
                s = self.stack.status()
            except Exception:
                s = None
            if s:
                c = s["counters"]
                self.samples.append(dict(
                    t=round(time.monotonic() - self.t0, 1),
                    dirty_percent=100.0 * s["dirty_bytes"] / s["cache_size_bytes"],
                    read_hit_blocks=c["read_hit_blocks"], read_miss_blocks=c["read_miss_blocks"],
                    destaged_blocks=c["destaged_blocks"], written_blocks=c["written_blocks"],
                    throttled_writes=c["throttled_writes"], written_around_blocks=c["written_around_blocks"],
                    # (Writers' reclaims that wrote back, and the pre-cleaner's write-back beyond
                    # its horizon: absent from the kernel caches' status and older builds.)
                    reclaim_write_backs=c.get("reclaim_write_backs"),
                    preclean_idle_blocks=c.get("preclean_idle_blocks")))
            self.stop_event.wait(self.period)

    def stop(self):
        self.stop_event.set()
        self.join()
        return self.samples


def hit_ratio(before, after):
    if not before or not after:
        return None
    h = after["counters"]["read_hit_blocks"] - before["counters"]["read_hit_blocks"]
    m = after["counters"]["read_miss_blocks"] - before["counters"]["read_miss_blocks"]
    return round(h / (h + m), 3) if h + m else None


# ---------------------------------------------------------------------------------------------
# MariaDB and sysbench


def pool_resize_options():
    """Options that let the buffer pool grow online: MariaDB 10.11.12 and later reserve
    innodb_buffer_pool_size_max at start (default: the starting size, so it could never grow);
    earlier versions grow in chunks of innodb_buffer_pool_chunk_size."""
    global _POOL_OPTS
    if _POOL_OPTS is None:
        helptext = subprocess.run(["mariadbd", "--no-defaults", "--verbose", "--help"], capture_output=True, text=True).stdout
        _POOL_OPTS = (["--innodb-buffer-pool-size-max=16G"] if "innodb-buffer-pool-size-max" in helptext
                      else ["--innodb-buffer-pool-chunk-size=4194304"])
    return _POOL_OPTS


_POOL_OPTS = None


class MariaDB:
    def __init__(self, ctx, stack, port):
        self.ctx, self.stack, self.port = ctx, stack, port
        self.datadir = os.path.join(stack.mnt, "mysql")
        self.sock = os.path.join(stack.dir, "mysql.sock")
        self.proc = None
        self.token = None

    def install(self):
        os.makedirs(self.datadir, exist_ok=True)
        run(["mariadb-install-db", "--user=root", f"--datadir={self.datadir}",
             "--auth-root-authentication-method=normal"])

    def start(self, buffer_pool):
        errlog = os.path.join(self.stack.dir, "mysql.err")
        cmd = ["mariadbd", "--no-defaults", "--user=root", f"--datadir={self.datadir}", f"--socket={self.sock}",
               f"--port={self.port}", "--bind-address=127.0.0.1", f"--pid-file={self.stack.dir}/mysql.pid",
               "--skip-log-bin", f"--innodb-buffer-pool-size={buffer_pool}",
               *pool_resize_options(),
               # Every point starts from what is in the pool, not from a dump of an earlier run.
               "--innodb-buffer-pool-load-at-startup=OFF", "--innodb-buffer-pool-dump-at-shutdown=OFF",
               "--innodb-log-file-size=64M", "--innodb-flush-log-at-trx-commit=1",
               "--innodb-flush-method=O_DIRECT", "--max-connections=300", f"--log-error={errlog}"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                     start_new_session=True)
        self.token = CLEANUP.push(f"mariadb {self.stack.name}", self.stop)
        for _ in range(600):
            if subprocess.run(["mariadb-admin", "-S", self.sock, "-uroot", "ping"], capture_output=True).returncode == 0:
                return self
            if self.proc.poll() is not None:
                raise RuntimeError(f"mariadbd on {self.stack.name} exited; see {errlog}")
            time.sleep(0.2)
        raise RuntimeError(f"mariadbd on {self.stack.name} did not answer in 120 s; see {errlog}")

    def sql(self, statement):
        return run(["mariadb", "-S", self.sock, "-uroot", "-N", "-e", statement])

    def set_buffer_pool(self, nbytes):
        """Resizes the buffer pool online (pages already in it stay) and waits for the resize."""
        self.sql(f"SET GLOBAL innodb_buffer_pool_size = {nbytes}")
        for _ in range(240):
            actual = int(self.sql("SELECT @@innodb_buffer_pool_size").strip())
            status = self.sql("SHOW STATUS LIKE 'Innodb_buffer_pool_resize_status'").split("\t")[-1].strip()
            if actual == nbytes and (not status or "Completed" in status):
                return actual
            time.sleep(0.5)
        raise RuntimeError(f"{self.stack.name}: the buffer pool did not reach {mib(nbytes)} "
                           f"(it is {mib(actual)}; resize status: {status!r})")

    def stop(self):
        if not self.proc or self.proc.poll() is not None:
            self.proc = None
            return
        subprocess.run(["mariadb-admin", "-S", self.sock, "-uroot", "shutdown"], capture_output=True, timeout=600)
        stop_process(self.proc, timeout=300)
        self.proc = None

    def close(self):
        if self.token is not None:
            CLEANUP.pop(self.token)
            self.token = None

    def data_bytes(self):
        return int(run(["du", "-sb", os.path.join(self.datadir, "sbtest")]).split()[0])


INTERVAL = re.compile(r"^\[ (\d+)s \] thds: (\d+) tps: ([\d.]+) qps: ([\d.]+) .*lat \(ms,(\d+)%\): ([\d.]+)")
HISTO = re.compile(r"^\s+([\d.]+)\s+\|\**\s+(\d+)\s*$")


def parse_sysbench(text):
    """Per-second intervals, totals and the latency histogram of a sysbench 1.0 run."""
    out = dict(intervals=[], histogram=[])
    for line in text.splitlines():
        m = INTERVAL.match(line)
        if m:
            out["intervals"].append(dict(t=int(m.group(1)), tps=float(m.group(3)), qps=float(m.group(4)),
                                         lat_ms=float(m.group(6))))
            continue
        m = HISTO.match(line)
        if m:
            out["histogram"].append((float(m.group(1)), int(m.group(2))))
            continue
        m = re.match(r"\s+transactions:\s+(\d+)\s+\(([\d.]+) per sec", line)
        if m:
            out["transactions"], out["tps"] = int(m.group(1)), float(m.group(2))
        m = re.match(r"\s+queries:\s+(\d+)\s+\(([\d.]+) per sec", line)
        if m:
            out["qps"] = float(m.group(2))
        m = re.match(r"\s+total time:\s+([\d.]+)s", line)
        if m:
            out["seconds"] = float(m.group(1))
        m = re.match(r"\s+avg:\s+([\d.]+)", line)
        if m and "latency_ms_avg" not in out:
            out["latency_ms_avg"] = float(m.group(1))
    for p in (95, 99):
        v = percentile_from_histogram(out["histogram"], p / 100)
        out[f"latency_ms_p{p}"] = v
    return out


class Sysbench(threading.Thread):
    """One sysbench run in the background; its per-second lines are parsed as they come."""

    def __init__(self, ctx, db, test, threads, seconds=0, events=0, extra=()):
        super().__init__(daemon=True)
        d = ctx.params
        self.cmd = ["sysbench", test, "--db-driver=mysql", f"--mysql-socket={db.sock}", "--mysql-user=root",
                    "--mysql-db=sbtest", f"--tables={d['tables']}", f"--table-size={d['table_size']}",
                    f"--threads={threads}", "--rand-type=gaussian", "--report-interval=1", "--percentile=99",
                    "--histogram=on", f"--time={seconds}", f"--events={events}", *extra, "run"]
        self.lines = []
        self.done_tx = 0.0
        self.result = None
        self.proc = None

    def run(self):
        self.proc = subprocess.Popen(self.cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        token = CLEANUP.push("sysbench", lambda: stop_process(self.proc, signal.SIGKILL, 30))
        for line in self.proc.stdout:
            self.lines.append(line)
            m = INTERVAL.match(line)
            if m:
                self.done_tx += float(m.group(3))
        self.proc.wait()
        CLEANUP.pop(token)
        self.result = parse_sysbench("".join(self.lines))
        self.result["exit_code"] = self.proc.returncode

    def finish(self):
        self.join()
        if self.result["exit_code"] != 0 or "transactions" not in self.result:
            raise RuntimeError(f"sysbench failed ({self.result['exit_code']}): {''.join(self.lines[-20:])}")
        return self.result


def run_sysbench(ctx, db, test, threads, seconds=0, events=0, label=None, extra=()):
    """Runs sysbench to completion, with a progress line every 10 s."""
    sb = Sysbench(ctx, db, test, threads, seconds, events, extra)
    sb.start()
    progress([(label or db.stack.name, sb, events, seconds)])
    return sb.finish()


def progress(runs):
    """Prints a rate line every 10 s until every run in `runs` [(label, Sysbench, events,
    seconds)] has ended."""
    t0 = time.monotonic()
    next_print = t0 + 10
    while any(sb.is_alive() for _, sb, _, _ in runs):
        time.sleep(0.5)
        now = time.monotonic()
        if now >= next_print:
            next_print += 10
            parts = []
            for label, sb, events, seconds in runs:
                last = [m for m in (INTERVAL.match(x) for x in sb.lines[-3:]) if m]
                tps = float(last[-1].group(3)) if last else 0.0
                goal = f"/{events:,} tx" if events else f" tx of {seconds} s"
                state = "done" if not sb.is_alive() else f"{tps:.0f} tps"
                parts.append(f"{label} {sb.done_tx:,.0f}{goal} ({state})")
            log(f"  {now - t0:4.0f} s  " + "   ".join(parts))


# ---------------------------------------------------------------------------------------------
# The experiments' shared set-up


class Ctx:
    def __init__(self, args, experiment):
        self.args = args
        self.experiment = experiment
        self.tc = args.tiercache
        self.real = bool(args.cache)
        base = dict((QUICK if args.quick else DEFAULTS)[experiment]) if experiment in DEFAULTS else {}
        if args.scale != 1 and base:
            base["table_size"] = int(base["table_size"] * args.scale)
            for k in ("cache", "buffer_pool", "volume"):
                if k in base:
                    base[k] = str(int(parse_size(base[k]) * args.scale))
        for k, v in (args.set or []):
            base[k] = type(base[k])(v) if k in base and not isinstance(base[k], list) else json.loads(v)
        self.params = base
        self.workdir = os.path.join(args.workdir, experiment)
        self.devdir = os.path.join(self.workdir, "devices")
        self.kernel = kernel_caches(args.kernel_caches)
        if self.real:
            # bcache would take the start of the real backing device (see KernelStack).
            if args.kernel_caches not in ("auto", "none") and "bcache" in args.kernel_caches.split(","):
                sys.exit("seeds: --kernel-caches: bcache cannot run on real devices (make-bcache would take the "
                         "start of the backing device, which holds the staged database)")
            if "bcache" in self.kernel["used"]:
                self.kernel["used"].remove("bcache")
                self.kernel["note"] = (("measured as extra rows: " + ", ".join(self.kernel["used"]) + "; "
                                        if self.kernel["used"] else "not run: ")
                                       + "bcache left out on real devices: make-bcache would take the start "
                                       "of the backing device, which holds the staged database")

    def begin(self, needs_second_slow):
        """The work folder for device files, and the volume size; None (the experiment is
        skipped, said why) where real devices lack the second slow device it needs."""
        if self.real and needs_second_slow and not self.args.backing2:
            log(f"{self.experiment}: skipped on real devices without --backing2 (a second slow device)")
            return None
        os.makedirs(self.devdir, exist_ok=True)
        return parse_size(self.params["volume"])

    def slow(self, path):
        """The slow device as serve takes it: an emulated profile over a file, or a real device."""
        return path if self.real else f"emulated:{self.args.slow}:{path}"

    def file(self, name):
        return os.path.join(self.devdir, name)

    def stage(self, stack_name, image, size, buffer_pool="256M"):
        """Makes `image` (a raw file, or a real device) hold ext4 with the sysbench database,
        staged through the fast path (no emulated latency: what is timed comes later).
        Returns the data size in bytes."""
        p = self.params
        if not self.real:
            with open(image, "wb") as f:
                f.truncate(size)
        st = Stack(self, stack_name, "passthrough", device=image).up(mkfs_size=size)
        db = MariaDB(self, st, self.args.port_base)
        db.install()
        db.start(buffer_pool)
        db.sql("CREATE DATABASE sbtest")
        log(f"staging {p['tables']} tables x {p['table_size']:,} rows on {image}")
        t0 = time.monotonic()
        run(["sysbench", "oltp_read_write", "--db-driver=mysql", f"--mysql-socket={db.sock}", "--mysql-user=root",
             "--mysql-db=sbtest", f"--tables={p['tables']}", f"--table-size={p['table_size']}",
             f"--threads={min(p['tables'], os.cpu_count() or 2)}", "prepare"])
        data = db.data_bytes()
        log(f"staged {mib(data)} of data in {time.monotonic() - t0:.0f} s")
        db.stop()
        db.close()
        st.down()
        st.close()
        shutil.rmtree(st.dir, ignore_errors=True)
        return data

    def copy_image(self, src, dst, size):
        """The same image on another device (a sparse copy of a file, or dd of the first `size`
        bytes of a real device)."""
        log(f"copying the image {src} -> {dst}")
        if self.real:
            run(["dd", f"if={src}", f"of={dst}", "bs=4M", f"count={size // (4 * MIB)}", "oflag=direct",
                 "conv=fsync", "status=none"])
        else:
            run(["cp", "--sparse=always", src, dst])


def kernel_volume(ctx, kind, image, size, cache_size, tag="", fast_profile=None, settings=None, mount=True):
    """A kernel cache volume, up and mounted. On files it gets a fresh copy of IMAGE on its own
    slow file (the emulated profile) and its own cache file of CACHE_SIZE (`fast_profile`: an
    emulated profile for it too), deleted when it goes down; on real devices it runs on --cache
    and --backing, which hold the database the hybrid left (see `flush_real_hybrid`), and writes
    back all it holds when it goes down, for the next one."""
    name = kind + tag
    if ctx.real:
        return KernelStack(ctx, name, kind, ctx.args.cache, ctx.args.backing, settings=settings,
                           clean_on_down=True, mount=mount).up()
    slow, cache = ctx.file(f"{name}-slow.img"), ctx.file(f"{name}-cache.img")
    if kind == "bcache" or image is None:
        with open(slow, "wb") as f:
            f.truncate(size + MIB)  # room for bcache's header; the image is copied in
    else:
        ctx.copy_image(image, slow, size)
    fast = f"emulated:{fast_profile}:{cache}" if fast_profile else cache
    st = KernelStack(ctx, name, kind, fast, ctx.slow(slow), cache_size=cache_size, image=image, settings=settings,
                     mount=mount)
    st.parts.append(("files", lambda: [os.unlink(f) for f in (slow, cache) if os.path.exists(f)]))
    return st.up()


def kernel_volumes(ctx, image, size, cache_size, **kw):
    """Each kernel cache the run uses (ctx.kernel["used"]), one at a time (`kernel_volume`),
    taken down when the caller asks for the next."""
    for kind in ctx.kernel["used"]:
        phase(f"{ctx.experiment}: {kind}")
        st = kernel_volume(ctx, kind, image, size, cache_size, **kw)
        log(st.describe())
        yield st
        st.down()
        st.close()


def flush_real_hybrid(ctx, cache, backing):
    """On real devices, once the hybrid is done with them: its dirty data written back (`tiercache
    flush`), so the backing device alone holds the database for a kernel cache, and the next
    experiment finds a clean cache device (`bench fsync` refuses one holding dirty data)."""
    if ctx.real:
        log(f"writing the hybrid's dirty data back to {backing} (tiercache flush)")
        run([ctx.tc, "flush", "--cache", cache, "--backing", backing])


def pristine_image(ctx, image, size):
    """A copy of the staged image for the kernel caches' rows (files only; None otherwise)."""
    if ctx.real or not ctx.kernel["used"]:
        return None
    copy = ctx.file("image-pristine.img")
    ctx.copy_image(image, copy, size)
    return copy


KERNEL_CACHES = ("dm-writecache", "dm-cache", "bcache")
KERNEL_COLORS = ["tab:purple", "tab:brown", "tab:cyan"]  # their lines in every chart, in that order
# What each needs: kernel modules (loaded if they can be), a user-space tool and its Debian package.
KERNEL_NEEDS = {"dm-writecache": (["dm_writecache"], "dmsetup", "dmsetup"),
                "dm-cache": (["dm_cache", "dm_cache_smq"], "dmsetup", "dmsetup"),
                "bcache": (["bcache"], "make-bcache", "bcache-tools")}


def kernel_caches(wanted="auto"):
    """Which of dm-writecache, dm-cache and bcache run here as extra rows, and why the others
    do not. `wanted`: "auto" (every one the kernel has), "none", or a comma-separated list
    (one that cannot be set up is then an error, not a silent gap)."""
    names = [] if wanted == "none" else list(KERNEL_CACHES) if wanted == "auto" else wanted.split(",")
    for n in names:
        if n not in KERNEL_CACHES:
            sys.exit(f"seeds: --kernel-caches: unknown {n!r} (dm-writecache, dm-cache, bcache, auto or none)")
    have, why_not = {}, {}
    for name in KERNEL_CACHES:
        modules, tool, package = KERNEL_NEEDS[name]
        missing = [m for m in modules if not os.path.exists(f"/sys/module/{m}") and not (
            shutil.which("modprobe") and subprocess.run(["modprobe", "-q", m], capture_output=True).returncode == 0)]
        if missing:
            why_not[name] = f"no {', '.join(missing)} module in kernel {os.uname().release}"
        elif not shutil.which(tool):
            why_not[name] = f"no {tool} (Debian: {package})"
        have[name] = name not in why_not
    used = [n for n in names if have[n]]
    if wanted not in ("auto", "none"):
        bad = [f"{n}: {why_not[n]}" for n in names if not have[n]]
        if bad:
            sys.exit("seeds: --kernel-caches: cannot set up " + "; ".join(bad))
    if wanted == "none":
        note = "not run (--kernel-caches none)"
    elif used:
        note = ("measured as extra rows: " + ", ".join(used)
                + "".join(f"; {n} left out: {why_not[n]}" for n in KERNEL_CACHES if n in why_not))
    elif len(why_not) == len(KERNEL_CACHES) and all("module" in w for w in why_not.values()):
        note = f"not run: this kernel ({os.uname().release}) has no dm-cache, dm-writecache or bcache modules"
    else:
        note = "not run: " + "; ".join(f"{n}: {why_not[n]}" for n in KERNEL_CACHES if n in why_not)
    return dict(available=have, used=used, note=note)


def base_result(ctx):
    if shutil.which("git"):
        commit = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                                text=True).stdout.strip() or "unknown"
        dirty = subprocess.run(["git", "-C", REPO, "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True).stdout.strip()
    else:  # (the test VM: the tree is shared in, git is not installed)
        commit, dirty = os.environ.get("TIERCACHE_COMMIT", "unknown"), ""
    return dict(experiment=ctx.experiment, date=datetime.date.today().isoformat(),
                commit=commit + ("+changes" if dirty else ""), host=os.uname().nodename, cpus=os.cpu_count(),
                slow_profile=None if ctx.real else ctx.args.slow, real_devices=ctx.real,
                quick=ctx.args.quick, scale=ctx.args.scale, params=ctx.params, kernel_caches=ctx.kernel)


# ---------------------------------------------------------------------------------------------
# Experiment 1: race


def exp_race(ctx):
    p = ctx.params
    a = ctx.args
    size = ctx.begin(needs_second_slow=True)
    if size is None:
        return None
    backing = a.backing or ctx.file("backing.img")
    backing2 = a.backing2 or ctx.file("backing2.img")
    fast = a.cache or ctx.file("fast.img")
    cache = a.cache or ctx.file("cache.img")
    res = base_result(ctx)

    phase("race: staging (one database on the slow device, copied to a second slow device)")
    data = ctx.stage("stage", backing, size)
    ctx.copy_image(backing, backing2, size)
    res["data_bytes"] = data
    pristine = pristine_image(ctx, backing, size)
    # On real devices the ceiling runs on the cache device itself (before the cache is
    # created on it), so it must hold the image.
    fast_ok = not ctx.real or int(run(["blockdev", "--getsize64", fast])) >= size
    ceiling = None
    if fast_ok:
        ctx.copy_image(backing, fast, size)
        phase(f"race: ceiling (the same database on the fast device alone, {p['events']:,} transactions)")
        st = Stack(ctx, "fast", "passthrough", device=fast).up()
        db = MariaDB(ctx, st, ctx.args.port_base).start(p["buffer_pool"])
        run_sysbench(ctx, db, "oltp_read_only", p["threads"], seconds=p["warm_seconds"], label="fast warm-up")
        ceiling = run_sysbench(ctx, db, "oltp_read_write", p["threads"], events=p["events"],
                               seconds=p["cap_seconds"], label="fast")
        db.stop(), db.close(), st.down(), st.close()
        if not ctx.real:
            os.unlink(fast)

    phase("race: bolt-on (create a cache for the existing volume, serve, mount its ext4 as it is)")
    hyb = Stack(ctx, "hybrid", "hybrid", cache=cache, backing=ctx.slow(backing), cache_size=p["cache"]).up()
    slow = Stack(ctx, "slow", "passthrough", device=ctx.slow(backing2)).up()
    racers = [("hybrid", hyb), ("slow", slow)]
    # On files the kernel caches race beside them, each on its own copy of the image, so that
    # all share the CPU alike. On real devices they need the hybrid's devices: they race alone
    # afterwards, like the ceiling (marked "alone").
    if not ctx.real:
        racers += [(kind, kernel_volume(ctx, kind, pristine, size, p["cache"])) for kind in ctx.kernel["used"]]
    dbs = [MariaDB(ctx, st, ctx.args.port_base + 1 + i).start(p["buffer_pool"]) for i, (_, st) in enumerate(racers)]
    names = [n for n, _ in racers]
    who = "both volumes" if len(racers) == 2 else f"all {len(racers)} volumes"

    phase(f"race: warm-up (read-only, {p['warm_seconds']} s, {who}, as the seed did)")
    warms = [Sysbench(ctx, db, "oltp_read_only", p["threads"], seconds=p["warm_seconds"]) for db in dbs]
    for w in warms:
        w.start()
    progress([(n, w, 0, p["warm_seconds"]) for n, w in zip(names, warms)])
    warm = [w.finish() for w in warms]
    res["warm"] = dict(hybrid_tps=warm[0]["tps"], slow_tps=warm[1]["tps"],
                       **{f"{n}_tps": w["tps"] for n, w in zip(names[2:], warm[2:])})

    phase(f"race: {who} in parallel to {p['events']:,} transactions (oltp_read_write, gaussian, "
          f"{p['threads']} threads each; cap {p['cap_seconds']} s)")
    before = [st.status() for _, st in racers]
    sampler = StatusSampler(hyb)
    sampler.start()
    races = [Sysbench(ctx, db, "oltp_read_write", p["threads"], events=p["events"], seconds=p["cap_seconds"])
             for db in dbs]
    for r in races:
        r.start()
    progress([(n, r, p["events"], 0) for n, r in zip(names, races)])
    raced = [r.finish() for r in races]
    samples = sampler.stop()
    after = [st.status() for _, st in racers]
    for db in dbs:
        db.stop(), db.close()
    for _, st in reversed(racers):
        st.down(), st.close()

    def row(name, r):
        finished = r["transactions"] >= p["events"]
        t = r["seconds"] if finished else r["seconds"] * p["events"] / max(r["transactions"], 1)
        return dict(target=name, transactions=r["transactions"], finished=finished, seconds=r["seconds"],
                    time_to_finish_s=round(t, 1), extrapolated=not finished, tps=r["tps"], qps=r.get("qps"),
                    latency_ms_p95=r["latency_ms_p95"], latency_ms_p99=r["latency_ms_p99"],
                    qps_series=[x["qps"] for x in r["intervals"]], tps_series=[x["tps"] for x in r["intervals"]])

    rows = [row("hybrid", raced[0]), row("slow alone", raced[1])]
    if ceiling:
        rows.append(row("fast alone", ceiling))
    for n, r, b, a in zip(names[2:], raced[2:], before[2:], after[2:]):
        rows.append(dict(row(n, r), read_hit_ratio=hit_ratio(b, a)))
    flush_real_hybrid(ctx, cache, ctx.slow(backing))
    for kst in kernel_volumes(ctx, pristine, size, p["cache"]) if ctx.real else ():
        db = MariaDB(ctx, kst, ctx.args.port_base + 3).start(p["buffer_pool"])
        run_sysbench(ctx, db, "oltp_read_only", p["threads"], seconds=p["warm_seconds"], label=f"{kst.kind} warm-up")
        b = kst.status()
        r = run_sysbench(ctx, db, "oltp_read_write", p["threads"], events=p["events"], seconds=p["cap_seconds"],
                         label=kst.kind)
        rows.append(dict(row(kst.kind, r), alone=True, read_hit_ratio=hit_ratio(b, kst.status())))
        db.stop(), db.close()
    res["rows"] = rows
    res["hybrid_read_hit_ratio"] = hit_ratio(before[0], after[0])
    res["status_samples"] = samples
    res["speedup"] = round(rows[1]["time_to_finish_s"] / rows[0]["time_to_finish_s"], 2)
    if ceiling:
        res["hybrid_vs_fast"] = round(rows[2]["time_to_finish_s"] / rows[0]["time_to_finish_s"], 2)
    res["kernel_speedups"] = {r["target"]: round(rows[1]["time_to_finish_s"] / r["time_to_finish_s"], 2)
                              for r in rows if r["target"] in KERNEL_CACHES}
    res["goals"] = [
        goal("hybrid at least 5.6x faster than the slow volume (seed 1)", res["speedup"], 5.6),
        goal("hybrid within 80 % of the fast device alone", res.get("hybrid_vs_fast"), 0.8),
    ]
    return res


def goal(text, value, at_least):
    return dict(goal=text, value=value, target=at_least, met=value is not None and value >= at_least)


# ---------------------------------------------------------------------------------------------
# Experiment 2: sweep


def exp_sweep(ctx):
    p = ctx.params
    a = ctx.args
    size = ctx.begin(needs_second_slow=False)
    backing = a.backing or ctx.file("backing.img")
    slow_dev = a.backing2 or ctx.file("slow.img")
    fast = ctx.file("fast.img") if not ctx.real else None
    cache = a.cache or ctx.file("cache.img")
    res = base_result(ctx)

    phase("sweep: staging (one database, copied to each volume)")
    data = ctx.stage("stage", backing, size)
    res["data_bytes"] = data
    pristine = pristine_image(ctx, backing, size)
    if ctx.real and not a.backing2:
        log("sweep: no --backing2: the slow-alone curve is measured on --backing before the cache is attached")
    targets = []
    if not ctx.real:
        ctx.copy_image(backing, fast, size)
        ctx.copy_image(backing, slow_dev, size)
        targets = [("slow alone", "passthrough", dict(device=ctx.slow(slow_dev))),
                   ("fast alone", "passthrough", dict(device=fast)),
                   ("hybrid", "hybrid", dict(cache=cache, backing=ctx.slow(backing), cache_size=p["cache"]))]
    else:
        if a.backing2:
            ctx.copy_image(backing, a.backing2, size)
            targets.append(("slow alone", "passthrough", dict(device=a.backing2)))
        targets.append(("hybrid", "hybrid", dict(cache=cache, backing=backing)))
    pools = sorted({max(8 * MIB, int(data * f) // (4 * MIB) * 4 * MIB) for f in p["fractions"]})
    res["buffer_pools"] = pools
    stacks, dbs = [], []
    for i, (name, kind, kw) in enumerate(targets):
        st = Stack(ctx, name.split()[0], kind, **kw).up()
        stacks.append(st)
        dbs.append(MariaDB(ctx, st, ctx.args.port_base + i).start(pools[0]))
    rows = {name: [] for name, _, _ in targets}

    def point(name, st, db, bp):
        actual = db.set_buffer_pool(bp)
        log(f"{name}: buffer pool {mib(actual)} (data / {data / actual:.1f})")
        run_sysbench(ctx, db, "oltp_read_write", p["threads"], seconds=p["warm_seconds"], label=f"{name} warm-up")
        before = st.status()
        r = run_sysbench(ctx, db, "oltp_read_write", p["threads"], seconds=p["seconds"], label=name)
        return dict(buffer_pool_bytes=actual, data_over_pool=round(data / actual, 2), tps=r["tps"],
                    latency_ms_p95=r["latency_ms_p95"], latency_ms_p99=r["latency_ms_p99"],
                    read_hit_ratio=hit_ratio(before, st.status()))

    phase(f"sweep: {len(pools)} buffer pool sizes x {len(targets)} volumes "
          f"({p['warm_seconds']} s warm-up + {p['seconds']} s each, interleaved)")
    for bp in pools:
        for (name, _, _), st, db in zip(targets, stacks, dbs):
            rows[name].append(point(name, st, db, bp))
    for db in dbs:
        db.stop(), db.close()
    for st in stacks:
        st.down(), st.close()
    # The kernel caches after, one at a time through every pool size (on real devices they
    # take the hybrid's devices, so they cannot be interleaved with it).
    flush_real_hybrid(ctx, cache, backing)
    for kst in kernel_volumes(ctx, pristine, size, p["cache"]):
        db = MariaDB(ctx, kst, ctx.args.port_base + 3).start(pools[0])
        rows[kst.kind] = [point(kst.kind, kst, db, bp) for bp in pools]
        db.stop(), db.close()
    res["rows"] = rows
    # The seed's point: data about 3x the buffer pool.
    at3 = min(range(len(pools)), key=lambda i: abs(math.log(data / pools[i] / 3)))
    res["point_3x"] = dict(buffer_pool_bytes=pools[at3], data_over_pool=round(data / pools[at3], 2))
    if "slow alone" in rows and rows["slow alone"][at3]["tps"]:
        res["hybrid_over_slow_at_3x"] = round(rows["hybrid"][at3]["tps"] / rows["slow alone"][at3]["tps"], 2)
    res["goals"] = [goal("at data about 3x the buffer pool, hybrid at least 5x slow alone (seed 5)",
                         res.get("hybrid_over_slow_at_3x"), 5.0)]
    return res


# ---------------------------------------------------------------------------------------------
# Experiment 3: dirty threshold


def exp_dirty(ctx):
    p = ctx.params
    a = ctx.args
    size = ctx.begin(needs_second_slow=True)
    if size is None:
        return None
    res = base_result(ctx)
    highs = p["highs"]
    if ctx.real:
        # One cache device: the volumes run one after another on --cache and --backing, each
        # from the staged image, kept on --backing2 and copied back before each.
        phase("dirty: staging (one database on --backing, kept on --backing2 to start every run from)")
        data = ctx.stage("stage", a.backing, size)
        ctx.copy_image(a.backing, a.backing2, size)
        pristine = a.backing2
    else:
        phase("dirty: staging (one database, copied for the second volume)")
        backings = [ctx.file("backing-a.img"), ctx.file("backing-b.img")]
        data = ctx.stage("stage", backings[0], size)
        ctx.copy_image(backings[0], backings[1], size)
        pristine = pristine_image(ctx, backings[0], size)
    res["data_bytes"] = data
    cache_label = f"{p['cache']} cache"
    if ctx.real:
        # (The whole cache device is the cache: the workload is larger than it only if the
        # data is; --scale and --set volume size the data.)
        cache_bytes = int(run(["blockdev", "--getsize64", a.cache]))
        res["cache_bytes"] = cache_bytes
        cache_label = f"the {mib(cache_bytes)} cache device {a.cache}"
        if data <= cache_bytes:
            log(f"dirty: the data ({mib(data)}) fits in {a.cache} ({mib(cache_bytes)}): the workload is not larger "
                "than the cache (raise --scale)")

    def hybrid(i, high):
        cache, backing = (a.cache, a.backing) if ctx.real else (ctx.file(f"cache-{i}.img"), ctx.slow(backings[i]))
        return Stack(ctx, f"dirty{high}", "hybrid", cache=cache, backing=backing, cache_size=p["cache"],
                     serve_extra=["--dirty-high", str(high), "--dirty-low", str(max(0, high - 10))]).up()

    def kernel(kind, high):
        settings = dict(high_watermark=high, low_watermark=max(0, high - 10)) if high is not None else None
        return kernel_volume(ctx, kind, pristine, size, p["cache"], tag=f"-{high}" if high is not None else "",
                             settings=settings)

    # Groups of volumes run in parallel: (target, high watermark or None, how to make it). On
    # files tiercache's two run side by side, as do dm-writecache's; on real devices each runs
    # alone. dm-writecache has the same knob (high_watermark, low_watermark 10 points below).
    # dm-cache has no dirty threshold and bcache's (writeback_percent) is a target the kernel
    # caps at 40 %: each runs once with its defaults.
    pairs = [[("tiercache", h, lambda i, h=h: hybrid(i, h)) for h in highs]]
    for kind in ctx.kernel["used"]:
        pairs.append([(kind, h, lambda i, k=kind, h=h: kernel(k, h))
                      for h in (highs if kind == "dm-writecache" else [None])])
    groups = [g for pair in pairs for g in ([[v] for v in pair] if ctx.real else [pair])]

    def write_only(dbs):
        return [Sysbench(ctx, db, "oltp_write_only", p["threads"], seconds=p["seconds"], extra=["--rand-type=uniform"])
                for db in dbs]

    def dirty_row(high, r, smp, **more):
        series = [x["tps"] for x in r["intervals"]]
        t_settle, settled = settle_time(series)
        stalls = sum(1 for x in series[5:] if x == 0)
        destage = [(b["t"], b["destaged_blocks"]) for b in smp]
        return dict(dirty_high_percent=high, dirty_low_percent=max(0, high - 10) if high is not None else None,
                    tps=r["tps"], settled_tps=settled, settle_seconds=t_settle, zero_tps_seconds=stalls,
                    latency_ms_p95=r["latency_ms_p95"], latency_ms_p99=r["latency_ms_p99"],
                    tps_series=series, status_samples=smp,
                    destaged_mib=round((destage[-1][1] - destage[0][1]) * 4096 / MIB, 1) if len(destage) > 1 else None,
                    **more)

    rows = []
    for n, group in enumerate(groups):
        if ctx.real and n > 0:
            ctx.copy_image(a.backing2, a.backing, size)
        names = [f"{t}" + (f" high {h} %" if h is not None else "") for t, h, _ in group]
        phase(f"dirty: write-only sysbench (uniform keys, {mib(data)} of data, {cache_label}), {p['seconds']} s: "
              + (" and ".join(names) + " in parallel" if len(group) > 1 else names[0]))
        stacks = [make(i) for i, (_, _, make) in enumerate(group)]
        dbs = [MariaDB(ctx, st, ctx.args.port_base + i).start(p["buffer_pool"]) for i, st in enumerate(stacks)]
        samplers = [StatusSampler(st) for st in stacks if st.kind == "hybrid"]
        runs = write_only(dbs)
        for s in samplers + runs:
            s.start()
        progress([(name, r, 0, p["seconds"]) for name, r in zip(names, runs)])
        results = [r.finish() for r in runs]
        samples = iter([s.stop() for s in samplers])
        for db in dbs:
            db.stop(), db.close()
        for st in stacks:
            st.down(), st.close()
        rows += [dirty_row(h, r, next(samples) if st.kind == "hybrid" else [], target=t)
                 for (t, h, _), r, st in zip(group, results, stacks)]
    res["rows"] = rows
    ours = [r for r in rows if r["target"] == "tiercache"]
    if ours[0]["settled_tps"]:
        res["high_over_low"] = round(ours[-1]["settled_tps"] / ours[0]["settled_tps"], 2)
    wc = [r for r in rows if r["target"] == "dm-writecache"]
    if len(wc) == 2 and wc[0]["settled_tps"]:
        res["dm_writecache_high_over_low"] = round(wc[1]["settled_tps"] / wc[0]["settled_tps"], 2)
    res["goals"] = [goal(f"the {highs[-1]} % run at least 1.7x the {highs[0]} % run once settled (seed 3)",
                         res.get("high_over_low"), 1.7),
                    dict(goal="no stall (no one-second interval at zero tps)",
                         value=sum(r["zero_tps_seconds"] for r in ours), target=0,
                         met=all(r["zero_tps_seconds"] == 0 for r in ours))]
    return res


# ---------------------------------------------------------------------------------------------
# Experiment 4: tail latency


def exp_latency(ctx):
    p = ctx.params
    a = ctx.args
    size = ctx.begin(needs_second_slow=False)
    res = base_result(ctx)
    rows = {}

    def sweep(group):
        """Warms each (name, stack) of GROUP, then runs the thread counts on them, interleaved."""
        dbs = [MariaDB(ctx, st, ctx.args.port_base + i).start(p["buffer_pool"]) for i, (_, st) in enumerate(group)]
        # The seed compares devices holding the working set: the hybrids' caches are warmed with
        # `tiercache preload` of the database's files (a read-only run on an HDD would take
        # minutes to fill them), then every volume's buffer pool with a short read-only run.
        how = [w for w, kinds in (("tiercache preload of the database files into each hybrid's cache", {"hybrid"}),
                                  ("the files read twice through each kernel cache", set(KERNEL_CACHES)))
               if any(st.kind in kinds for _, st in group)]
        phase(f"latency: warm-up ({', '.join(n for n, _ in group)}: {''.join(w + ', then ' for w in how)}"
              f"read-only, {p['warm_seconds']} s per volume)")
        for n, st in group:
            if st.kind == "hybrid":
                pre = st.preload([os.path.join(st.mnt, "mysql")])
                res.setdefault("preload", {})[n] = pre
                log(f"{n}: preloaded {pre}")
            elif st.kind in KERNEL_CACHES:
                # No preload command: the files read twice, for what their read caching makes of it.
                st.warm([os.path.join(st.mnt, "mysql")])
        for (n, _), db in zip(group, dbs):
            run_sysbench(ctx, db, "oltp_read_only", 4, seconds=p["warm_seconds"], label=n)
        phase(f"latency: threads {p['threads_list']} x {len(group)} volumes, {p['seconds']} s each"
              + (", interleaved" if len(group) > 1 else ""))
        for n, _ in group:
            rows[n] = []
        for threads in p["threads_list"]:
            for (n, st), db in zip(group, dbs):
                before = st.status()
                r = run_sysbench(ctx, db, "oltp_read_write", threads, seconds=p["seconds"], label=f"{n} x{threads}")
                rows[n].append(dict(threads=threads, tps=r["tps"], latency_ms_avg=r.get("latency_ms_avg"),
                                    latency_ms_p95=r["latency_ms_p95"], latency_ms_p99=r["latency_ms_p99"],
                                    read_hit_ratio=hit_ratio(before, st.status())))
        for db in dbs:
            db.stop(), db.close()
        for _, st in group:
            st.down(), st.close()

    if not ctx.real:
        phase("latency: staging (one database, copied to each volume)")
        image = ctx.file("image.img")
        data = ctx.stage("stage", image, size)
        names = ["slow alone", "hybrid (optane cache)", "hybrid (nvme cache)", "fast alone (optane)"]
        files = {n: ctx.file(f"v{i}.img") for i, n in enumerate(names)}
        for n in names:
            ctx.copy_image(image, files[n], size)
        specs = [("slow", "passthrough", dict(device=ctx.slow(files[names[0]]))),
                 ("optane", "hybrid", dict(cache=f"emulated:optane:{ctx.file('cache-optane.img')}",
                                           backing=ctx.slow(files[names[1]]), cache_size=p["cache"])),
                 ("nvme", "hybrid", dict(cache=f"emulated:nvme:{ctx.file('cache-nvme.img')}",
                                         backing=ctx.slow(files[names[2]]), cache_size=p["cache"])),
                 ("fast", "passthrough", dict(device=f"emulated:optane:{files[names[3]]}"))]
        group = [(n, Stack(ctx, short, kind, **kw).up()) for n, (short, kind, kw) in zip(names, specs)]
        # The kernel caches, with the same emulated optane cache device, interleaved with the rest.
        group += [(f"{kind} (optane cache)", kernel_volume(ctx, kind, image, size, p["cache"], fast_profile="optane"))
                  for kind in ctx.kernel["used"]]
        os.unlink(image)
        sweep(group)
        hybrid, fast = names[1], names[3]
    else:
        # Real devices: the cache device's own speed is the ceiling (measured on it first, before
        # the cache is created on it), then the hybrid beside the slow device alone (--backing2,
        # if given), then each kernel cache alone on the hybrid's devices.
        phase("latency: staging (one database on --backing, copied to the cache device and --backing2)")
        data = ctx.stage("stage", a.backing, size)
        hybrid, fast = "hybrid", "fast alone (cache device)"
        if int(run(["blockdev", "--getsize64", a.cache])) >= size:
            ctx.copy_image(a.backing, a.cache, size)
            sweep([(fast, Stack(ctx, "fast", "passthrough", device=a.cache).up())])
        else:
            log(f"latency: {a.cache} is smaller than the volume: no fast-alone rows")
        group = []
        if a.backing2:
            ctx.copy_image(a.backing, a.backing2, size)
            group.append(("slow alone", Stack(ctx, "slow", "passthrough", device=a.backing2).up()))
        group.append((hybrid, Stack(ctx, "hybrid", "hybrid", cache=a.cache, backing=a.backing).up()))
        sweep(group)
        flush_real_hybrid(ctx, a.cache, a.backing)
        for kind in ctx.kernel["used"]:
            sweep([(kind, kernel_volume(ctx, kind, None, size, None))])
    res["data_bytes"] = data
    res["rows"] = rows
    worst = None
    for i, r in enumerate(rows[hybrid]):
        f = rows[fast][i]["latency_ms_p99"] if fast in rows else None
        if r["latency_ms_p99"] and f:
            ratio = r["latency_ms_p99"] / f
            worst = ratio if worst is None else max(worst, ratio)
    res["worst_p99_hybrid_over_fast"] = round(worst, 2) if worst else None
    res["goals"] = [dict(goal=f"{hybrid} p99 within 2x of fast alone at every concurrency",
                         value=res["worst_p99_hybrid_over_fast"], target=2.0,
                         met=worst is not None and worst <= 2.0)]
    return res


# ---------------------------------------------------------------------------------------------
# Experiment 5: fsync


def exp_fsync(ctx):
    res = base_result(ctx)
    phase("fsync: tiercache bench fsync (emulated devices, the seed table)")
    seconds = "1" if ctx.args.quick else "3"
    # (On real devices the matrix also measures the raw cache device and a hybrid volume on
    # them: bench fsync overwrites the cache device and the backing device's first blocks.)
    real = ["--cache", ctx.args.cache, "--backing", ctx.args.backing, "--destructive"] if ctx.real else []
    if ctx.real:
        # (An earlier experiment's hybrid may have left dirty data there; bench fsync refuses
        # such a cache. Nothing to write back is fine too.)
        run([ctx.tc, "flush", "--cache", ctx.args.cache, "--backing", ctx.args.backing], check=False)
    out = run([ctx.tc, "bench", "fsync", "--json", "--seconds", seconds, *real])
    res["bench"] = json.loads(out)
    hybrid = [r for r in res["bench"]["results"] if r.get("ratio_to_raw_cache") is not None]
    res["goals"] = [goal("hybrid fsync rate at least 90 % of the raw cache device", hybrid[0]["ratio_to_raw_cache"]
                         if hybrid else None, 0.9)]
    if ctx.kernel["used"]:
        res["block_rows"] = fsync_block_rows(ctx, seconds=float(seconds))
    return res


def fsync_loop(dev, seconds, region=64 * MIB):
    """O_DIRECT 4 KiB writes at random offsets of the first REGION bytes of DEV, each followed
    by fdatasync, for SECONDS: (rate per second, latencies in µs)."""
    import mmap
    import random
    fd = os.open(dev, os.O_RDWR | os.O_DIRECT)
    try:
        buf = mmap.mmap(-1, 4096)  # page-aligned, as O_DIRECT needs
        buf.write(os.urandom(4096))
        rng = random.Random(1)
        lat = []
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            t = time.perf_counter()
            os.pwrite(fd, buf, rng.randrange(region // 4096) * 4096)
            os.fdatasync(fd)
            lat.append((time.perf_counter() - t) * 1e6)
        return len(lat) / (time.monotonic() - t0), lat
    finally:
        os.close(fd)


def fsync_block_rows(ctx, seconds, rounds=3):
    """The seed's fsync comparison with the kernel caches as rows: the same loop (4 KiB O_DIRECT
    write + fdatasync, QD1) on block devices: the fast device alone, the hybrid (tiercache serve
    --fuse, loop), and each kernel cache. On files the fast device is an emulated optane (a loop
    device over its FUSE file) and the slow one the emulated slow profile, and the rounds are
    interleaved; on real devices each target has them to itself in turn (the raw cache device,
    then the hybrid, then each kernel cache, on --cache and --backing). Medians of the rounds;
    the ratio is to the fast device alone measured the same way."""
    size = 1 << 30
    cache = "256M"
    fast_name = "cache device alone" if ctx.real else "optane alone"
    phase(f"fsync: block devices ({fast_name}, hybrid, {', '.join(ctx.kernel['used'])}), "
          f"{rounds} rounds of {seconds:g} s")
    os.makedirs(ctx.devdir, exist_ok=True)
    rates, lats = {}, {}

    def measure(targets):
        for n, _ in targets:
            rates[n], lats[n] = [], []
        for _ in range(rounds):
            for n, dev in targets:
                rate, lat = fsync_loop(dev, seconds)
                rates[n].append(rate)
                lats[n] += lat
                log(f"fsync: {n}: {rate:,.0f}/s")

    hybrid_name = "tiercache (FUSE + loop)"
    if ctx.real:
        measure([(fast_name, ctx.args.cache)])
        hyb = Stack(ctx, "fsync-hybrid", "hybrid", cache=ctx.args.cache, backing=ctx.args.backing)
        measure([(hybrid_name, hyb.up(mount=False).loop)])
        hyb.down(), hyb.close()
        for kind in ctx.kernel["used"]:
            k = kernel_volume(ctx, kind, None, size, None, mount=False)
            measure([(kind, k.dev)])
            k.down(), k.close()
        names = [fast_name, hybrid_name, *ctx.kernel["used"]]
    else:
        with open(ctx.file("fast.img"), "wb") as f:
            f.truncate(size)
        fast = Stack(ctx, "fsync-fast", "passthrough", device=f"emulated:optane:{ctx.file('fast.img')}")
        targets = [(fast_name, fast.up(mount=False).loop)]
        with open(ctx.file("slow.img"), "wb") as f:
            f.truncate(size)
        hyb = Stack(ctx, "fsync-hybrid", "hybrid", cache=f"emulated:optane:{ctx.file('cache.img')}",
                    backing=ctx.slow(ctx.file("slow.img")), cache_size=cache)
        targets.append((hybrid_name, hyb.up(mount=False).loop))
        kernel = [kernel_volume(ctx, kind, None, size, cache, fast_profile="optane", mount=False)
                  for kind in ctx.kernel["used"]]
        targets += [(k.kind, k.dev) for k in kernel]
        measure(targets)
        for k in kernel:
            k.down(), k.close()
        for st in (hyb, fast):
            st.down(), st.close()
        names = [n for n, _ in targets]
    ref = median(rates[fast_name])
    rows = []
    for n in names:
        lat = sorted(lats[n])
        rows.append(dict(target=n, fsyncs_per_second=round(median(rates[n])), ratio_to_fast=round(median(rates[n]) / ref, 3),
                         latency_us_p50=round(lat[len(lat) // 2], 1), latency_us_p99=round(lat[int(len(lat) * 0.99)], 1)))
    return rows


# ---------------------------------------------------------------------------------------------
# Charts (matplotlib: PNG and SVG of each)


SEED_SWEEP = [(2, 450, 81), (6, 608, 122), (10, 769, 253), (14, 977, 429), (18, 1472, 935), (20, 2536, 2487)]
SEED_DATA_GB = 18


def caption(res):
    where = "real devices" if res["real_devices"] else f"slow device: emulated {res['slow_profile']} profile"
    if res["experiment"] == "fsync":
        where = "emulated devices (bench fsync's matrix)"
    return f"{where}; {res['date']}, commit {res['commit']}, {res['cpus']} cores"


def charts(res, outdir):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    exp = res["experiment"]
    made = []

    def save(fig, name):
        name += res.get("tag", "")
        fig.text(0.01, 0.005, caption(res), fontsize=7, color="#555")
        fig.tight_layout(rect=(0, 0.03, 1, 1))
        for ext in ("png", "svg"):
            fig.savefig(os.path.join(outdir, f"{name}.{ext}"), dpi=110)
        plt.close(fig)
        made.append(name)

    if exp == "race":
        fig, ax = plt.subplots(figsize=(8, 4.2))
        colors = dict(zip(["hybrid", "slow alone", "fast alone", *KERNEL_CACHES],
                          ["tab:green", "tab:red", "tab:blue", *KERNEL_COLORS]))
        for r in res["rows"]:
            color = colors.get(r["target"], "tab:gray")
            q = r["qps_series"]
            xs = range(1, len(q) + 1)
            ax.plot(xs, [max(v, 1) for v in q], color=color, lw=0.5, alpha=0.35)
            ax.plot(xs, [max(v, 1) for v in moving_average(q, 10)], color=color, lw=1.5,
                    label=f"{r['target']}{' (alone)' if r.get('alone') else ''}: {r['time_to_finish_s']:.0f} s"
                    + (" (extrapolated)" if r["extrapolated"] else ""))
            if r["finished"]:
                ax.axvline(r["seconds"], color=color, ls=":", lw=1)
        ax.set_yscale("log")
        ax.set_xlabel("time (s)")
        ax.set_ylabel("queries/s (log; 10 s average)")
        ax.set_title(f"Race to {res['params']['events']:,} transactions: hybrid {res['speedup']}x the slow volume "
                     f"(seed: 5.6x)")
        ax.legend(fontsize=8)
        save(fig, "race-qps")
    elif exp == "sweep":
        fig, (ax, ax2) = plt.subplots(1, 2, figsize=(11, 4.2))
        for name, color in (("slow alone", "tab:red"), ("fast alone", "tab:blue"), ("hybrid", "tab:green"),
                            *zip(KERNEL_CACHES, KERNEL_COLORS)):
            if name in res["rows"]:
                pts = res["rows"][name]
                ax.plot([x["buffer_pool_bytes"] / MIB for x in pts], [x["tps"] for x in pts], "o-", color=color, label=name)
        ax.axvline(res["point_3x"]["buffer_pool_bytes"] / MIB, color="#888", ls="--", lw=1)
        ax.text(res["point_3x"]["buffer_pool_bytes"] / MIB, ax.get_ylim()[1] * 0.9, " data = 3x pool", fontsize=8, color="#555")
        ax.set_yscale("log")
        ax.set_xlabel("InnoDB buffer pool (MiB)")
        ax.set_ylabel("transactions per second (log)")
        ax.set_title(f"tps against buffer pool, {res['data_bytes'] / MIB:.0f} MiB of data")
        ax.legend(fontsize=8)
        if "slow alone" in res["rows"]:
            ratio = [(x["data_over_pool"], h["tps"] / x["tps"]) for x, h in zip(res["rows"]["slow alone"], res["rows"]["hybrid"]) if x["tps"]]
            ax2.plot([r[0] for r in ratio], [r[1] for r in ratio], "o-", color="tab:green", label="hybrid / slow alone (this run)")
            ax2.plot([SEED_DATA_GB / b for b, _, _ in SEED_SWEEP], [f / r for _, f, r in SEED_SWEEP], "s--", color="#999",
                     label="seed 5: FusionIO / RAID10")
            ax2.axhline(5, color="#bbb", ls=":", lw=1)
            ax2.set_xscale("log")
            ax2.set_xlabel("data / buffer pool (log)")
            ax2.set_ylabel("speed-up over the slow device")
            ax2.set_title("speed-up against the seed's")
            ax2.legend(fontsize=8)
        save(fig, "sweep-tps")
    elif exp == "dirty":
        fig, (ax, ax2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
        kernel_colors = iter(KERNEL_COLORS + ["tab:gray", "tab:pink"])
        for r in res["rows"]:
            ours = r.get("target", "tiercache") == "tiercache"
            color = ("tab:orange" if r["dirty_high_percent"] == res["params"]["highs"][0] else "tab:green") if ours \
                else next(kernel_colors)
            s = r["tps_series"]
            who = "" if ours else f"{r['target']}, "
            knob = f"high watermark {r['dirty_high_percent']} %" if r["dirty_high_percent"] is not None else "defaults"
            if ours:
                ax.plot(range(1, len(s) + 1), s, color=color, lw=0.5, alpha=0.4)
            ax.plot(range(1, len(s) + 1), moving_average(s, 10), color=color, lw=1.5 if ours else 1.0,
                    ls="-" if ours else "--", label=f"{who}{knob}: settled {r['settled_tps'] or 0:.0f} tps")
            if not ours:
                continue
            if r["settle_seconds"]:
                ax.axvline(r["settle_seconds"], color=color, ls=":", lw=1)
            ax2.plot([x["t"] for x in r["status_samples"]], [x["dirty_percent"] for x in r["status_samples"]],
                     color=color, label=f"dirty, high {r['dirty_high_percent']} %")
            ax2.axhline(r["dirty_high_percent"], color=color, ls="--", lw=0.8)
        ax.set_ylabel("transactions per second")
        ax.set_title(f"Write-only load larger than the cache: 80 % / 20 % = {res.get('high_over_low')}x (seed: 1.7x)")
        ax.legend(fontsize=8)
        ax2.set_xlabel("time (s)")
        ax2.set_ylabel("dirty data (% of cache)")
        ax2.legend(fontsize=8)
        save(fig, "dirty-tps")
    elif exp == "latency":
        fig, axes = plt.subplots(1, 2, figsize=(11, 4.2), sharey=True)
        for ax, pct in zip(axes, (95, 99)):
            for name, pts in res["rows"].items():
                color = ("tab:red" if name.startswith("slow") else "tab:blue" if name.startswith("fast")
                         else "tab:olive" if "nvme" in name else "tab:green" if name.startswith("hybrid")
                         else dict(zip(KERNEL_CACHES, KERNEL_COLORS)).get(name.split()[0], "tab:gray"))
                ax.plot([x["threads"] for x in pts], [x[f"latency_ms_p{pct}"] for x in pts], "o-", color=color, label=name)
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_xlabel("sysbench threads")
            ax.set_ylabel(f"p{pct} latency (ms, log)")
            ax.set_title(f"p{pct} transaction latency")
            ax.legend(fontsize=8)
        save(fig, "latency-p95-p99")
    elif exp == "fsync":
        rows = res["bench"]["results"]
        fig, ax = plt.subplots(figsize=(8, 3.6))
        names = [r["target"] for r in rows]
        ax.barh(names, [r["fsyncs_per_second"] for r in rows], color="tab:blue", label="measured")
        for i, r in enumerate(rows):
            if r.get("documented_fsyncs_per_second"):
                ax.plot(r["documented_fsyncs_per_second"], i, "k|", ms=14)
        ax.set_xscale("log")
        ax.set_xlabel("write 4 KiB + flush per second (log); | = the seed's figure")
        ax.set_title("fsync rate (seed 2)")
        save(fig, "fsync-rate")
    return made


# ---------------------------------------------------------------------------------------------
# The report


def fmt(v, nd=1):
    if v is None:
        return "n/a"
    if isinstance(v, float):
        return f"{v:,.{nd}f}"
    return f"{v:,}" if isinstance(v, int) else str(v)


def goals_md(res):
    out = ["", "| goal | value | met |", "| --- | ---: | --- |"]
    for g in res.get("goals", []):
        out.append(f"| {g['goal']} | {fmt(g['value'], 2)} | {'yes' if g['met'] else '**no**'} |")
    return out


def section(res):
    exp = res["experiment"]
    p = res["params"]
    tag = res.get("tag", "")
    lines = []
    head = {"race": "1. Race (seed 1: Intel CAS + Optane over RAID5, 5.6x)",
            "sweep": "2. Sweep: buffer pool against fast storage (seed 5)",
            "dirty": "3. Dirty threshold (seed 3: FlashCache, 20 % vs 80 %, 1.7x)",
            "latency": "4. Tail latency (seed 4: Optane vs NAND, small buffer pool)",
            "fsync": "5. fsync (seed 2: dm-cache, bcache, ZFS SLOG)"}[exp]
    if tag:
        head += f", slow device {res['slow_profile']}"
    lines += [f"## {head}", "", f"{caption(res)}; {'quick' if res['quick'] else 'scale ' + str(res['scale'])}. "
              f"Command: `bench/seeds.py {exp}{' --quick' if res['quick'] else ''}"
              f"{' --slow ' + res['slow_profile'] if tag else ''}`.", ""]
    if "data_bytes" in res:
        lines.append(f"Data: {p.get('tables')} tables x {p.get('table_size'):,} rows = {mib(res['data_bytes'])}; "
                     + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in p.items()
                                 if k in ("buffer_pool", "threads", "warm_seconds", "seconds", "events")
                                 or (k == "cache" and not res["real_devices"])) + "."
                     + (f" The cache: the whole cache device, {mib(res['cache_bytes'])}." if res.get("cache_bytes") else ""))
        lines.append("")
    if exp == "race":
        lines += ["| volume | transactions | time to finish (s) | tps | p95 ms | p99 ms |",
                  "| --- | ---: | ---: | ---: | ---: | ---: |"]
        for r in res["rows"]:
            t = fmt(r["time_to_finish_s"]) + (" (extrapolated)" if r["extrapolated"] else "")
            lines.append(f"| {r['target']}{' (alone)' if r.get('alone') else ''} | {r['transactions']:,} | {t} | {fmt(r['tps'])} | {fmt(r['latency_ms_p95'])} | {fmt(r['latency_ms_p99'])} |")
        lines += ["", f"Hybrid {res['speedup']}x the slow volume"
                  + (f", at {res['hybrid_vs_fast']} of the fast device alone" if res.get("hybrid_vs_fast") else "")
                  + f"; the cache's read hit ratio during the race: {fmt(res['hybrid_read_hit_ratio'], 3)}. "
                  f"Warm-up (read-only): hybrid {fmt(res['warm']['hybrid_tps'])} tps, slow {fmt(res['warm']['slow_tps'])} tps."
                  + ("".join(f" {k}{' (alone, after the race, like the ceiling)' if next(r for r in res['rows'] if r['target'] == k).get('alone') else ''}: {v}x the slow volume, read hit ratio "
                             f"{fmt(next(r for r in res['rows'] if r['target'] == k).get('read_hit_ratio'), 3)}."
                             for k, v in res.get("kernel_speedups", {}).items())),
                  "", f"![race](race-qps{tag}.png)"]
    elif exp == "sweep":
        names = list(res["rows"])
        lines += ["| buffer pool | data / pool | " + " | ".join(f"{n} tps" for n in names) + " | hybrid read hits |",
                  "| ---: | ---: | " + " | ".join("---:" for _ in names) + " | ---: |"]
        for i, bp in enumerate(res["buffer_pools"]):
            r0 = res["rows"][names[0]][i]
            lines.append(f"| {mib(r0['buffer_pool_bytes'])} | {r0['data_over_pool']} | "
                         + " | ".join(fmt(res["rows"][n][i]["tps"]) for n in names)
                         + f" | {fmt(res['rows']['hybrid'][i]['read_hit_ratio'], 3)} |")
        lines += ["", f"![sweep](sweep-tps{tag}.png)"]
    elif exp == "dirty":
        lines += ["| volume | high watermark | tps (whole run) | settled tps | settles after (s) | seconds at 0 tps | p99 ms | written back (MiB) |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in res["rows"]:
            knob = f"{r['dirty_high_percent']} %" if r["dirty_high_percent"] is not None else "its default"
            lines.append(f"| {r.get('target', 'tiercache')} | {knob} | {fmt(r['tps'])} | {fmt(r['settled_tps'])} | "
                         f"{fmt(r['settle_seconds'])} | {r['zero_tps_seconds']} | {fmt(r['latency_ms_p99'])} | {fmt(r['destaged_mib'])} |")
        lines += ["", "Settled: the median tps of the last third of the run; it settles when the moving "
                  "average over a tenth of the run (at least 10 s) stays within 25 % of that. Seconds at "
                  "0 tps: one-second intervals in which no transaction completed (after the first 5 s).",
                  "", f"![dirty](dirty-tps{tag}.png)"]
    elif exp == "latency":
        names = list(res["rows"])
        lines += ["| threads | " + " | ".join(f"{n} p95 / p99 ms" for n in names) + " |",
                  "| ---: | " + " | ".join("---:" for _ in names) + " |"]
        for i, t in enumerate(p["threads_list"]):
            lines.append(f"| {t} | " + " | ".join(f"{fmt(res['rows'][n][i]['latency_ms_p95'])} / {fmt(res['rows'][n][i]['latency_ms_p99'])}"
                                                 for n in names) + " |")
        lines += ["", f"![latency](latency-p95-p99{tag}.png)"]
    elif exp == "fsync":
        lines += ["| target | fsync/s | p50 us | p99 us | seed figure |", "| --- | ---: | ---: | ---: | ---: |"]
        for r in res["bench"]["results"]:
            lines.append(f"| {r['target']} | {fmt(r['fsyncs_per_second'], 0)} | {fmt(r['latency_us_p50'])} | "
                         f"{fmt(r['latency_us_p99'])} | {fmt(r.get('documented_fsyncs_per_second'), 0)} |")
        lines += ["", f"![fsync](fsync-rate{tag}.png)"]
        if res.get("block_rows"):
            where = ("the real devices, each target alone in turn" if res["real_devices"] else
                     "emulated optane cache, emulated slow device, interleaved rounds")
            lines += ["", f"The same loop on block devices (4 KiB O_DIRECT write + fdatasync, QD1; {where}; medians "
                      "of the rounds):", "",
                      "| target | fsync/s | ratio to the fast device alone | p50 us | p99 us |",
                      "| --- | ---: | ---: | ---: | ---: |"]
            for r in res["block_rows"]:
                lines.append(f"| {r['target']} | {fmt(r['fsyncs_per_second'])} | {fmt(r['ratio_to_fast'], 2)} | "
                             f"{fmt(r['latency_us_p50'])} | {fmt(r['latency_us_p99'])} |")
    lines += goals_md(res)
    lines += ["", f"Kernel caches: {res['kernel_caches']['note']}.", ""]
    return lines


def write_report(outdir):
    parts = ["# tiercache: the seed experiments", "",
             "Written by `bench/seeds.py`; each section is the latest run of that experiment in this folder.", ""]
    found = False
    for exp in EXPERIMENTS:
        # (The default slow profile's run first, then any other profile's, `EXP-PROFILE.json`.)
        names = sorted(n for n in os.listdir(outdir) if re.fullmatch(rf"{exp}(-[a-z0-9-]+)?\.json", n))
        for name in sorted(names, key=lambda n: (n != f"{exp}.json", n)):
            found = True
            with open(os.path.join(outdir, name)) as f:
                parts += section(json.load(f))
    if not found:
        parts.append("No experiment has run yet.")
    with open(os.path.join(outdir, "report.md"), "w") as f:
        f.write("\n".join(parts) + "\n")
    return os.path.join(outdir, "report.md")


# ---------------------------------------------------------------------------------------------


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], epilog=__doc__.split("\n\n", 1)[1],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("experiment", choices=EXPERIMENTS + ["all", "report"])
    ap.add_argument("--quick", action="store_true", help="a smoke run: tiny data, seconds per phase")
    ap.add_argument("--scale", type=float, default=1.0, help="multiply data sizes (rows, cache, pool, volume)")
    ap.add_argument("--slow", default="hdd", help="emulated profile of the slow device (hdd, sata-raid5, usb-disk)")
    ap.add_argument("--results", default="bench-results", help="folder for JSON, charts, report.md")
    ap.add_argument("--workdir", default="/var/tmp/tiercache-seeds", help="device files, mounts, databases")
    ap.add_argument("--port-base", type=int, default=3310, help="MariaDB servers listen on 127.0.0.1 from this port")
    ap.add_argument("--json", action="store_true", help="also print each experiment's JSON on stdout")
    ap.add_argument("--cache", help="a real fast device (with --backing and --destructive)")
    ap.add_argument("--backing", help="a real slow device")
    ap.add_argument("--backing2", help="a second real slow device (race, dirty)")
    ap.add_argument("--destructive", action="store_true", help="allow overwriting the real devices")
    ap.add_argument("--set", nargs=2, action="append", metavar=("KEY", "VALUE"),
                    help="override one parameter of the experiment (e.g. --set events 2000)")
    ap.add_argument("--kernel-caches", default="auto", metavar="auto|none|LIST",
                    help="dm-writecache, dm-cache and bcache as extra rows: every one the kernel has (auto), "
                         "none, or a comma-separated list that must all be there")
    ap.add_argument("--tiercache", default=os.path.join(REPO, "target", "release", "tiercache"))
    args = ap.parse_args(argv)
    os.makedirs(args.results, exist_ok=True)
    if args.experiment == "report":
        # (The charts are drawn again from the JSON too, so a change to a chart needs no rerun.)
        for name in sorted(os.listdir(args.results)):
            if name.endswith(".json"):
                with open(os.path.join(args.results, name)) as f:
                    charts(json.load(f), args.results)
        print(write_report(args.results))
        return 0
    if os.geteuid() != 0:
        sys.exit("seeds: run as root (loop devices and mounts)")
    if bool(args.cache) != bool(args.backing):
        sys.exit("seeds: --cache and --backing go together (real devices)")
    if args.cache and not args.destructive:
        sys.exit(f"seeds: {args.cache}, {args.backing}{', ' + args.backing2 if args.backing2 else ''} would be "
                 "overwritten; add --destructive")
    if args.slow not in ("hdd", "sata-raid5", "usb-disk", "nvme", "optane"):
        sys.exit(f"seeds: unknown profile {args.slow!r} (hdd, sata-raid5, usb-disk)")
    apt_install(PACKAGES)
    if not os.path.exists(args.tiercache):
        log("building tiercache (cargo build --release)")
        subprocess.run(["cargo", "build", "--release", "-p", "tiercache-cli"], cwd=REPO, check=True)
    # (Set explicitly: a script started in the background inherits SIGINT ignored, and Python
    # then installs no KeyboardInterrupt for it.)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGHUP, on_signal)
    todo = EXPERIMENTS if args.experiment == "all" else [args.experiment]
    rc = 0
    try:
        for exp in todo:
            ctx = Ctx(args, exp)
            if os.path.exists(ctx.workdir):
                shutil.rmtree(ctx.workdir)
            os.makedirs(ctx.workdir)
            t0 = time.monotonic()
            res = globals()[f"exp_{exp}"](ctx)
            CLEANUP.run_all()
            if res is None:
                continue
            res["elapsed_s"] = round(time.monotonic() - t0)
            # (A slow profile other than the default is kept beside it: race-sata-raid5.json.)
            res["tag"] = "" if args.slow == "hdd" or exp == "fsync" else f"-{args.slow}"
            with open(os.path.join(args.results, f"{exp}{res['tag']}.json"), "w") as f:
                json.dump(res, f, indent=1)
            charts(res, args.results)
            if args.json:
                print(json.dumps(res))
            for g in res.get("goals", []):
                log(f"{exp}: {g['goal']}: {fmt(g['value'], 2)} ({'met' if g['met'] else 'not met'})")
            log(f"{exp}: done in {res['elapsed_s']} s")
            shutil.rmtree(ctx.workdir, ignore_errors=True)
        log(f"report: {write_report(args.results)}")
    except KeyboardInterrupt:
        log("interrupted: cleaning up")
        rc = 130
    finally:
        # A second Ctrl-C must not cut the clean-up short.
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        CLEANUP.run_all()
    return rc


if __name__ == "__main__":
    sys.exit(main())
