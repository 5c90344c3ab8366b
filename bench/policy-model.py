#!/usr/bin/env python3
"""A model of the read cache's eviction policy on a log, for trying a change to it in
seconds (Python) before building it into the engine: a ring of C slots filled at the tail,
emptied at the head in windows of a segment, where a clean block read since it was cached or
last kept is copied forward with its 2-bit count one less (at most half a segment of copies
per reclaim record; the window ends early rather than evict a kept block, as long as it
frees a block beyond its record, as volume/reclaim.rs does with no writer waiting), a block
read once is evicted into the ghost queue (half a log of evictions per generation, two
generations: ghost.rs), and a miss of a ghost enters with a count of one. Misses are
admitted in records of min(168, C/8) blocks.

    bench/policy-model.py TRACE.csv.gz [--anchors ../shared/traces/missratio-anchors.tsv]
                          [--ring | --adaptive [--gate on|off|duel]]

With --ring, the `s3fifo` policy (volume/probation.rs): a tenth of the cache is a ring that a
miss enters unless it is a ghost, read in batches of 64; two reads there move a block into
the log (count 0); the ring's drops, not the log's evictions, feed the ghost queue (a log's
length of them per generation, as the engine's); a ghost's miss enters the log.

With --adaptive, the `adaptive` policy (the default since 2026-11-27, volume/admission.rs):
`s3fifo`, plus misses entering the log until it first fills, plus the frequency gate (a
ghost's miss enters the log only if a count-min sketch, frequency.rs, counts it read more
often than the first block from the log's head that reclaim would evict; else the ring),
(the first block within 1,024 slots of the log's head that reclaim would evict), applied
while a duel of two miniature simulations of the policy, with and without the gate,
on 1 in S sampled blocks, says the gate misses less (duel.rs). `--gate on|off` fixes the gate
instead.

Prints the model's miss ratio at 1/5/10/25 % of the trace's footprint beside libCacheSim's
LRU, FIFO and best policy. It follows the engine's replay (`tiercache replay`) within about
0.01-0.02 of miss ratio; it leaves out record headers, the reclaim reserve (together about
1.5 % of the cache) and the sequential bypass, and keeps the copies per reclaim record at
half a segment where the engine takes up to a record's entries (volume/reclaim.rs).
"""
import argparse, collections, csv, gzip


def blocks(path):
    with gzip.open(path, 'rt') if path.endswith('.gz') else open(path) as f:
        next(f)
        for line in f:
            _, _, off, ln = line.split(',')
            off, ln = int(off), int(ln)
            yield from range(off // 4096, (off + ln + 4095) // 4096)


def segment_for(cap):
    """The replay's segment: the largest power of two at most cap / 64, 4 to 256."""
    s = max(4, min(256, cap // 64))
    return 1 << (s.bit_length() - 1)


class Ghosts:
    """The ghost queue: two generations of `cap` // 2 evicted blocks each (ghost.rs)."""

    def __init__(self, cap):
        self.cap, self.current, self.older = cap, set(), set()

    def add(self, b):
        self.current.add(b)
        if len(self.current) >= self.cap // 2:
            self.older, self.current = self.current, set()

    def __contains__(self, b):
        return b in self.current or b in self.older


class Log:
    """The log: `cap` slots filled at the tail, emptied at the head in windows of a segment,
    where a block whose 2-bit count is not zero is copied forward with it one less (at most
    `room` per reclaim record: half a segment; the window ends early rather than evict a kept block,
    as long as it frees room/16 blocks beyond its record), and the rest are evicted
    (`on_evict`). `count` is the index: block -> count."""

    def __init__(self, cap, seg, on_evict):
        self.cap, self.seg, self.on_evict = cap, seg, on_evict
        self.room = min(seg // 2, 168)
        self.min_progress = 1
        self.ring, self.count, self.copies = collections.deque(), {}, 0

    def reclaim(self):
        ring, count, room = self.ring, self.count, self.room
        window = [ring[i] for i in range(min(self.seg, len(ring)))]
        kept = [i for i, b in enumerate(window) if count[b] > 0]
        limit = room
        if len(kept) > room and kept[room] - 1 - self.min_progress > 0:
            window = window[:kept[room]]
            limit = min(room, len(window) - 1 - self.min_progress)
        limit = min(limit, len(window) - 1)  # (at least one block leaves)
        for _ in window:
            ring.popleft()
        keep = set(sorted((b for b in window if count[b] > 0), key=lambda b: -count[b])[:limit])
        for b in window:
            if b in keep:
                count[b] -= 1
                ring.append(b)
                self.copies += 1
            else:
                del count[b]
                self.on_evict(b)

    def admit(self, blocks, count_of):
        """A record of `blocks`, each entering with `count_of(block)`."""
        while self.cap - len(self.ring) < len(blocks):
            self.reclaim()
        for b in blocks:
            self.ring.append(b)
            self.count[b] = count_of(b)


class Staging:
    """Misses gathered into a record of `record` blocks, then admitted into `log` (each with
    `count_of(block)`); a block staged is neither a hit nor a miss again until then."""

    def __init__(self, log, record, count_of):
        self.log, self.record, self.count_of = log, record, count_of
        self.blocks, self.held = [], set()

    def add(self, b):
        self.blocks.append(b)
        self.held.add(b)
        if len(self.blocks) >= self.record:
            self.log.admit(self.blocks, self.count_of)
            self.blocks.clear()
            self.held.clear()


def model(trace, cap):
    seg = segment_for(cap)
    cap = cap // seg * seg
    record = min(168, cap // 8)
    ghosts = Ghosts(cap)
    log = Log(cap, seg, ghosts.add)
    staging = Staging(log, record, lambda s: 1 if s in ghosts else 0)
    reads = misses = 0
    for b in trace:
        reads += 1
        c = log.count.get(b)
        if c is not None:
            log.count[b] = min(3, c + 1)
            continue
        if b in staging.held:
            continue
        misses += 1
        staging.add(b)
    return misses / reads, log.copies / reads


class Sketch:
    """The frequency sketch (frequency.rs): 64-bit words of sixteen 4-bit counters, a word
    per cache block; a block picks one word (multiply-shift) and one counter in each
    quarter of it; every counter halves after 5 cache-fulls of increments."""

    M = 0xFFFFFFFFFFFFFFFF

    def __init__(self, cache_blocks):
        self.words = [0] * max(8, int(cache_blocks))
        self.counted, self.period = 0, max(64, cache_blocks * 5)

    @staticmethod
    def mix(x):
        M = Sketch.M
        z = (x + 0x9E3779B97F4A7C15) & M
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M
        return z ^ (z >> 31)

    def _slots(self, b):
        h = self.mix(b)
        pick = h >> 32
        return ((h & 0xFFFFFFFF) * len(self.words)) >> 32, [((pick >> (2 * i)) & 3) * 16 + i * 4 for i in range(4)]

    def increment(self, b):
        w, offs = self._slots(b)
        v = self.words[w]
        for o in offs:
            if (v >> o) & 15 < 15:
                v += 1 << o
        self.words[w] = v
        self.counted += 1
        if self.counted >= self.period:
            self.words = [(x >> 1) & 0x7777777777777777 for x in self.words]
            self.counted = 0

    def estimate(self, b):
        w, offs = self._slots(b)
        return min((self.words[w] >> o) & 15 for o in offs)


class Adaptive:
    """The `adaptive` policy (volume/admission.rs) at `cap` blocks: the probation ring in front
    of the log, plus (`fill`) misses entering the log while it fills, plus (`gate`, fixed or
    set by a duel) the frequency gate. Without either, the `s3fifo` policy."""

    def __init__(self, cap, gate=False, fill=True, ring_frac=0.1, promote=2, batch=64):
        seg = segment_for(cap)
        ring_cap = int(cap * ring_frac) // seg * seg
        if ring_cap < 2 * seg or cap - ring_cap < 8 * seg:
            ring_cap = 0
        self.ring_cap, self.log_cap = ring_cap, max(seg, (cap - ring_cap) // seg * seg)
        self.record = max(1, min(168, self.log_cap // 8))
        self.batch = min(batch, max(1, ring_cap // 4))
        self.ghosts = Ghosts(2 * self.log_cap)
        self.log = Log(self.log_cap, seg, lambda b: None)
        self.staging = Staging(self.log, self.record, lambda s: 0)
        self.ring, self.ring_pos, self.hits = collections.deque(), {}, {}
        self.pending, self.pending_set = [], set()
        self.gate, self.fill, self.promote, self.sketch = gate, fill, promote, Sketch(cap)
        self.reads = self.misses = self.copies = self.tick = 0

    def filling(self):
        return len(self.log.ring) + len(self.staging.blocks) + self.record < self.log_cap

    def victim(self):
        """The sketch's count of the first block within 1,024 of the log's head with a count
        of 0, else of the head's block."""
        near = [x for _, x in zip(range(1024), self.log.ring)]
        for x in near:
            if self.log.count[x] == 0:
                return self.sketch.estimate(x)
        return self.sketch.estimate(near[0]) if near else 0

    def step(self, b):
        """A read of block `b`; returns whether it hit."""
        self.reads += 1
        self.sketch.increment(b)
        c = self.log.count.get(b)
        if c is not None:
            self.log.count[b] = min(3, c + 1)
            return True
        if b in self.staging.held or b in self.pending_set:
            return True
        if b in self.ring_pos:
            self.hits[b] += 1
            if self.hits[b] >= self.promote:
                del self.ring_pos[b], self.hits[b]
                self.copies += 1
                self.staging.add(b)
            return True
        self.misses += 1
        if self.ring_cap == 0 or (self.fill and self.filling()):
            self.staging.add(b)
            return False
        if b in self.ghosts and not (self.gate and self.sketch.estimate(b) <= self.victim()):
            self.staging.add(b)
            return False
        self.pending.append(b)
        self.pending_set.add(b)
        if len(self.pending) >= self.batch:
            while len(self.ring) + len(self.pending) > self.ring_cap:
                o, t = self.ring.popleft()
                if self.ring_pos.get(o) == t:
                    del self.ring_pos[o], self.hits[o]
                    self.ghosts.add(o)
            for p in self.pending:
                self.tick += 1
                self.ring.append((p, self.tick))
                self.ring_pos[p], self.hits[p] = self.tick, 0
            self.pending.clear()
            self.pending_set.clear()
        return False


def model_ring(trace, cap):
    """The probation ring in front of the log (see the module doc): `Adaptive` with neither
    the filling log nor the gate."""
    p = Adaptive(cap, gate=False, fill=False)
    for b in trace:
        p.step(b)
    return p.misses / p.reads, (p.copies + p.log.copies) / p.reads


def model_adaptive(trace, cap, gate='duel'):
    """The adaptive policy; with `gate` 'duel', two miniature simulations (gate on, off) on
    the blocks a hash samples at 1 in S (a power of two: each holds 2,048 to 65,536 blocks)
    pick the gate, by misses decayed by 0.9999 per sampled read, switching once the other
    rule misses 5 % less (duel.rs)."""
    real = Adaptive(cap, gate=(gate == 'on'))
    if gate != 'duel':
        for b in trace:
            real.step(b)
        return real.misses / real.reads, (real.copies + real.log.copies) / real.reads
    rate = max(1, min(16, cap // 2048))
    rate = 1 << (rate.bit_length() - 1)
    if cap // rate > 65536:
        rate = 1 << (cap // 65536 - 1).bit_length()
    sims, missed = [Adaptive(cap // rate, gate=True), Adaptive(cap // rate, gate=False)], [0.0, 0.0]
    salt = 0x5A4D504C45445545
    for b in trace:
        if Sketch.mix(b ^ salt) & (rate - 1) == 0:
            for i, sim in enumerate(sims):
                missed[i] = missed[i] * 0.9999 + (not sim.step(b))
            # (Switching only past a 5 % margin, as duel.rs's SWITCH_MARGIN.)
            real.gate = missed[1] >= missed[0] * 0.95 if real.gate else missed[0] < missed[1] * 0.95
        real.step(b)
    return real.misses / real.reads, (real.copies + real.log.copies) / real.reads


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('trace')
    ap.add_argument('--anchors')
    ap.add_argument('--ring', action='store_true', help='the s3fifo policy (the probation ring)')
    ap.add_argument('--adaptive', action='store_true', help='the adaptive policy (the default since 2026-11-27)')
    ap.add_argument('--gate', choices=['on', 'off', 'duel'], default='duel', help='with --adaptive: the frequency gate always, never, or as the duel picks (the engine)')
    a = ap.parse_args()
    trace = list(blocks(a.trace))
    name = a.trace.rsplit('/', 1)[-1].split('.')[0]
    anchors = collections.defaultdict(dict)
    if a.anchors:
        for r in csv.DictReader(open(a.anchors), delimiter='\t'):
            if r['trace'] == name:
                anchors[int(r['cache_blocks'])][r['algorithm']] = float(r['miss_ratio'])
    footprint = len(set(trace))
    sizes = sorted(anchors) or [footprint * p // 100 for p in (1, 5, 10, 25)]
    print(f'{name}: {len(trace)} block reads, footprint {footprint} blocks')
    for cap in sizes:
        if a.adaptive:
            m, c = model_adaptive(trace, cap, a.gate)
        else:
            m, c = (model_ring if a.ring else model)(trace, cap)
        an = anchors.get(cap, {})
        best = min(((v, k) for k, v in an.items() if k != 'Belady'), default=None)
        ref = f"  LRU {an['LRU']:.4f} FIFO {an['FIFO']:.4f} best {best[0]:.4f} ({best[1]})" if best else ''
        print(f'{cap:>8} blocks: miss ratio {m:.4f}, copies per read {c:.2f}{ref}')


if __name__ == '__main__':
    main()
