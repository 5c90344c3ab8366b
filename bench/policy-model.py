#!/usr/bin/env python3
"""A model of the read cache's eviction policy on a log, for tuning it fast (seconds per
trace in Python instead of the engine's replay): a ring of C slots filled at the tail,
emptied at the head, where a block read since it was cached or last kept is copied forward
with its 2-bit count one less (reclaim.rs), and a miss of a block read lately (the frequency
sketch; exact counts halved every 10 x C reads here) enters with a count of one.

    bench/policy-model.py TRACE.csv.gz [--anchors ../shared/traces/missratio-anchors.tsv]

Prints the model's miss ratio at 1/5/10/25 % of the trace's footprint beside libCacheSim's
LRU, FIFO and best policy. The engine (tiercache replay) runs the same policy with the log's
real costs (record headers, the reclaim reserve, a segment per reclaim, at most half a
segment of copies per reclaim record) and misses more than this model: see the note in
ARCHITECTURE.md.
"""
import argparse, collections, csv, gzip


def blocks(path):
    with gzip.open(path, 'rt') if path.endswith('.gz') else open(path) as f:
        next(f)
        for line in f:
            _, _, off, ln = line.split(',')
            off, ln = int(off), int(ln)
            yield from range(off // 4096, (off + ln + 4095) // 4096)


def model(trace, cap, sample=10, fmax=3):
    ring, count, freq = collections.deque(), {}, collections.defaultdict(int)
    reads = misses = copies = 0
    for b in trace:
        reads += 1
        if freq[b] < 15:
            freq[b] += 1
        if reads % (sample * cap) == 0:
            for k in list(freq):
                freq[k] >>= 1
                if not freq[k]:
                    del freq[k]
        c = count.get(b)
        if c is not None:
            count[b] = min(fmax, c + 1)
            continue
        misses += 1
        if len(ring) >= cap:
            while count[ring[0]] > 0:
                h = ring.popleft()
                count[h] -= 1
                ring.append(h)
                copies += 1
            del count[ring.popleft()]
        ring.append(b)
        count[b] = 1 if freq[b] >= 2 else 0
    return misses / reads, copies / reads


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument('trace')
    ap.add_argument('--anchors')
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
        m, c = model(trace, cap)
        an = anchors.get(cap, {})
        best = min(((v, k) for k, v in an.items() if k != 'Belady'), default=None)
        ref = f"  LRU {an['LRU']:.4f} FIFO {an['FIFO']:.4f} best {best[0]:.4f} ({best[1]})" if best else ''
        print(f'{cap:>8} blocks: miss ratio {m:.4f}, copies per read {c:.2f}{ref}')


if __name__ == '__main__':
    main()
