#!/usr/bin/python3
"""Tests of bench/seeds.py, the seed experiments' command.

What they prove:
- the parsers read what sysbench 1.0 prints (per-second lines, totals, the latency histogram),
  and the percentiles, the settle time and sizes are computed as the report says;
- a run stopped with Ctrl-C (SIGINT) or SIGTERM in the middle of a phase leaves nothing behind:
  no mount, no loop device, no tiercache, MariaDB or sysbench process under its work folder.
  These need root and MariaDB (installed by scripts/test); without root they are skipped.

Run: bench/tests/test_seeds.py (prints "seeds tests: N passed, N failed").
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(os.path.dirname(HERE), "seeds.py")
sys.path.insert(0, os.path.dirname(HERE))
import seeds  # noqa: E402

SYSBENCH_OUT = """sysbench 1.0.20 (using system LuaJIT 2.1.0-beta3)

Running the test with following options:
Number of threads: 4
Report intermediate results every 1 second(s)

[ 1s ] thds: 4 tps: 19.97 qps: 419.36 (r/w/o: 293.55/85.87/39.94) lat (ms,99%): 746.32 err/s: 0.00 reconn/s: 0.00
[ 2s ] thds: 4 tps: 22.00 qps: 440.00 (r/w/o: 308.00/88.00/44.00) lat (ms,99%): 502.10 err/s: 0.00 reconn/s: 0.00
Latency histogram (values are in milliseconds)
       value  ------------- distribution ------------- count
       2.000 |****************************************  90
      10.000 |****                                      9
     700.000 |*                                         1
 
SQL statistics:
    queries performed:
        read:                            602
    transactions:                        42     (20.95 per sec.)
    queries:                             860    (428.97 per sec.)
General statistics:
    total time:                          2.0042s
    total number of events:              42
Latency (ms):
         min:                                    4.08
         avg:                                  190.04
         max:                                  746.49
         99th percentile:                      746.32
"""


class Parsers(unittest.TestCase):
    def test_sysbench_output(self):
        r = seeds.parse_sysbench(SYSBENCH_OUT)
        self.assertEqual([x["t"] for x in r["intervals"]], [1, 2])
        self.assertEqual(r["intervals"][1]["qps"], 440.0)
        self.assertEqual(r["transactions"], 42)
        self.assertEqual(r["tps"], 20.95)
        self.assertEqual(r["qps"], 428.97)
        self.assertEqual(r["seconds"], 2.0042)
        self.assertEqual(r["latency_ms_avg"], 190.04)
        # 100 samples: 90 at 2 ms, 9 at 10 ms, 1 at 700 ms.
        self.assertEqual(r["latency_ms_p95"], 10.0)
        self.assertEqual(r["latency_ms_p99"], 10.0)
        self.assertEqual(seeds.percentile_from_histogram(r["histogram"], 0.995), 700.0)
        self.assertEqual(seeds.percentile_from_histogram(r["histogram"], 0.5), 2.0)
        self.assertIsNone(seeds.percentile_from_histogram([], 0.99))

    def test_settle_time(self):
        # 30 s ramping up from 0, then flat at 100: settles once the 10 s average is within 25 %.
        series = [i * 100 / 30 for i in range(30)] + [100.0] * 60
        t, rate = seeds.settle_time(series)
        self.assertEqual(rate, 100.0)
        avg = seeds.moving_average(series, 10)
        self.assertTrue(abs(avg[t - 1] - 100) <= 25 and abs(avg[t - 2] - 100) > 25)
        # A run whose end leaves the band has not settled.
        self.assertIsNone(seeds.settle_time([100.0] * 90 + [1000.0] * 5)[0])
        self.assertIsNone(seeds.settle_time([1.0, 2.0])[0])

    def test_sizes(self):
        self.assertEqual(seeds.parse_size("160M"), 160 << 20)
        self.assertEqual(seeds.parse_size("2G"), 2 << 30)
        self.assertEqual(seeds.parse_size("4096"), 4096)
        with self.assertRaises(ValueError):
            seeds.parse_size("lots")

    def test_report_without_results(self):
        with tempfile.TemporaryDirectory() as d:
            path = seeds.write_report(d)
            with open(path) as f:
                self.assertIn("No experiment has run yet", f.read())


def leftovers(workdir):
    """Mounts, loop devices, device-mapper devices of the script and processes that still refer
    to `workdir`."""
    found = []
    dm = subprocess.run(["dmsetup", "ls"], capture_output=True, text=True).stdout if os.path.exists("/dev/mapper/control") else ""
    found += [f"dm: {line.split()[0]}" for line in dm.splitlines() if line.startswith("tcseeds-")]
    with open("/proc/mounts") as f:
        for line in f:
            if workdir in line:
                found.append("mount: " + line.split()[1])
    loops = json.loads(subprocess.run(["losetup", "-J", "-l"], capture_output=True, text=True).stdout or '{"loopdevices": []}')
    for dev in loops.get("loopdevices", []):
        if workdir in (dev.get("back-file") or ""):
            found.append(f"loop: {dev['name']} -> {dev['back-file']}")
    for pid in os.listdir("/proc"):
        if pid.isdigit() and int(pid) != os.getpid():
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if workdir in cmd:
                found.append(f"process {pid}: {cmd[:120]}")
    return found


@unittest.skipUnless(os.geteuid() == 0, "needs root (loop devices, mounts)")
class Interrupted(unittest.TestCase):
    def interrupt(self, sig, when):
        with tempfile.TemporaryDirectory(dir="/var/tmp") as work, tempfile.TemporaryDirectory() as results:
            # (From a shell that started this test in the background SIGINT arrives ignored:
            # the script must catch it anyway.)
            # (TEST_SEEDS_KERNEL_CACHES=dm-writecache,dm-cache,bcache: with those as rows too; the
            # test VM's scripts/vm/guest/seeds-kernel.sh runs it so.)
            kernel = os.environ.get("TEST_SEEDS_KERNEL_CACHES", "none")
            p = subprocess.Popen([sys.executable, SCRIPT, "race", "--quick", "--workdir", work, "--results", results,
                                  "--port-base", "3410", "--kernel-caches", kernel,
                                  *(["--tiercache", os.environ["TIERCACHE"]] if os.environ.get("TIERCACHE") else [])], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                 preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
            seen = []
            deadline = time.monotonic() + 300
            for line in p.stderr:
                seen.append(line)
                if when in line:
                    break
                self.assertLess(time.monotonic(), deadline, "the phase never started:\n" + "".join(seen[-20:]))
            else:
                self.fail("the run ended before the phase:\n" + "".join(seen[-20:]))
            time.sleep(3)  # inside the phase: servers up, sysbench running
            self.assertTrue(leftovers(work), "nothing was running yet: the test would prove nothing")
            p.send_signal(sig)
            rest = p.stderr.read()
            p.stderr.close()
            rc = p.wait(timeout=300)
            self.assertEqual(rc, 130, rest)
            self.assertIn("interrupted: cleaning up", rest)
            self.assertEqual(leftovers(work), [], rest)

    def test_ctrl_c_during_the_race(self):
        self.interrupt(signal.SIGINT, "volumes in parallel to")

    def test_sigterm_during_the_warm_up(self):
        self.interrupt(signal.SIGTERM, "race: warm-up")


if __name__ == "__main__":
    result = unittest.main(exit=False, verbosity=2).result
    failed = len(result.failures) + len(result.errors)
    print(f"seeds tests: {result.testsRun - failed - len(result.skipped)} passed, {failed} failed")
    sys.exit(1 if failed else 0)
