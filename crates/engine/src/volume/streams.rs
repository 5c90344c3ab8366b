//! Sequential streams, recognised across requests: a read (or, in a table of its own, a
//! write) that starts near where a
//! recent one ended (within about the stream's last request length either way: clients keep
//! several requests in flight, which may arrive swapped, and unaligned reads overlap their
//! neighbours' edge blocks; random 4 KiB reads in a small hot area stay apart) continues its
//! stream. Past `VolumeOptions::sequential_bypass_bytes` a stream's
//! misses are not admitted into the cache (a table scan, a backup or `pg_dump` reads the
//! volume once; admitted, it would push the hot set out of a FIFO log). A small table of
//! the most recent streams, least recently used replaced: several concurrent scans are each
//! recognised, and random reads (which never continue one) cost one table probe.
//!
//! Writes have a table too: a sequential writer sweeping through data that sits dirty at the
//! log head in the order it was first written (a backup restored twice, a file rewritten in
//! place; nbdcopy's threads each write a region of their own, so several at once) supersedes
//! each block just before the head reaches it; the pre-cleaner leaves such data alone
//! (`sweepers`) instead of writing back what is about to be dead.

/// How many streams are followed at once.
const STREAMS: usize = 16;

#[derive(Debug, Default, Clone, Copy)]
struct Stream {
    /// The block the next read of this stream starts at.
    next: u64,
    /// Blocks read by the stream so far.
    blocks: u64,
    /// Its last read's length in blocks: the next read of the stream may start up to this far
    /// past `next`, or twice this far before it.
    last: u64,
    /// When it was last continued (a counter of requests).
    used: u64,
    /// ...and the clock then.
    at_ns: u64,
    /// `Streams::blocks` when it began: its share of all blocks noted since is its pace
    /// among the writers.
    began_at_block: u64,
    /// `Streams::blocks` when its `next` last moved forward: a stream whose requests all land
    /// behind `next` (a writer wrapping round a small region, or going backwards) writes
    /// nothing ahead of it.
    advanced_at_block: u64,
}

#[derive(Debug, Default)]
pub(super) struct Streams {
    table: [Stream; STREAMS],
    reads: u64,
    /// Blocks noted, in all requests (streams' or not).
    blocks: u64,
    /// How far out of order a stream's requests may arrive, in request lengths (0 counts as
    /// 1: a swapped neighbour). The write table allows more (`WRITE_STREAM_REORDER_REQUESTS`).
    reorder: u64,
    /// A stream continued after this long idle starts its count again (0: never). The write
    /// table's: a writer that starts where another stopped long ago (nbdcopy's second thread
    /// where its first thread ended on the last copy) is a new stream, with a pace of its own.
    restart_ns: u64,
}

impl Streams {
    /// A table whose streams' requests may arrive up to `reorder` request lengths out of
    /// order, and whose streams start again after `restart_ns` idle.
    pub(super) fn for_writes(reorder: u64, restart_ns: u64) -> Streams {
        Streams { reorder, restart_ns, ..Streams::default() }
    }

    /// Notes a read of blocks `first..first + n`; returns how many blocks its stream had
    /// advanced through before it (0 when it starts a new one, and for an empty read, which
    /// is not noted). A stream advances by the blocks a read takes it past where it stood.
    pub(super) fn note(&mut self, first: u64, n: u64, now_ns: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        self.reads += 1;
        self.blocks += n;
        let now = self.reads;
        // (Behind by up to two reads: the one a swapped neighbour pushed `next` past, and its
        // own; times `reorder`.)
        let k = self.reorder.max(1);
        let near = |s: &&mut Stream| s.blocks > 0 && first + 2 * k * s.last >= s.next && first <= s.next + k * s.last;
        // (The longest stream near, if several are: a re-read of a scan's tail continues it.)
        if let Some(s) = self.table.iter_mut().filter(near).max_by_key(|s| s.blocks) {
            if self.restart_ns > 0 && now_ns.saturating_sub(s.at_ns) > self.restart_ns {
                s.blocks = 0;
                s.began_at_block = self.blocks - n;
            }
            let before = s.blocks;
            if first + n > s.next {
                s.advanced_at_block = self.blocks;
            }
            // Progress through the volume only: the blocks past where the stream stood, or a
            // whole read that fills in behind it (a neighbour that arrived swapped). A read of
            // what the last request read again (a hot block or range read over and over, a
            // block read in sectors, an unaligned read's edge block) adds nothing: counted, it
            // made a hot block look like a long scan.
            s.blocks += if first + n > s.next {
                (first + n - s.next).min(n)
            } else if first + s.last >= s.next {
                0
            } else {
                n
            };
            s.next = s.next.max(first + n);
            s.last = n;
            s.used = now;
            s.at_ns = now_ns;
            return before;
        }
        let oldest = self.table.iter_mut().min_by_key(|s| s.used).expect("a non-empty table");
        *oldest = Stream {
            next: first + n,
            blocks: n,
            last: n,
            used: now,
            at_ns: now_ns,
            began_at_block: self.blocks - n,
            advanced_at_block: self.blocks,
        };
        0
    }

    /// The streams continued since `since_ns` and at least `min_blocks` long: where each
    /// writes next, and its share of all the blocks noted since it began (its pace among the
    /// writers: of the log room the writers fill next, about that share is its blocks).
    pub(super) fn sweepers(&self, since_ns: u64, min_blocks: u64) -> Vec<Sweeper> {
        self.table
            .iter()
            .filter(|s| s.blocks > 0 && s.blocks >= min_blocks && s.at_ns >= since_ns)
            // (Moved forward within its reorder distance of all the writes since: a stream
            // that only fills in behind `next` sweeps nothing ahead of it.)
            .filter(|s| self.blocks - s.advanced_at_block <= self.reorder.max(1) * s.last)
            .map(|s| Sweeper {
                next: s.next,
                share: s.blocks as f64 / (self.blocks - s.began_at_block).max(s.blocks) as f64,
            })
            .collect()
    }
}

/// An active sequential write stream, as the pre-cleaner sees it (`Streams::sweepers`).
#[derive(Debug, Clone, Copy)]
pub(super) struct Sweeper {
    pub next: u64,
    pub share: f64,
}

impl Sweeper {
    /// Whether this stream writes `block` within the next `room` blocks the writers write.
    pub fn reaches(&self, block: u64, room: u64) -> bool {
        block >= self.next && block - self.next < (room as f64 * self.share) as u64
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    impl Streams {
        /// `note` at time 0.
        fn note_(&mut self, first: u64, n: u64) -> u64 {
            self.note(first, n, 0)
        }
    }

    #[test]
    fn sweepers_are_streams_continued_lately_long_enough_with_their_share_of_the_writes() {
        let mut s = Streams::default();
        for k in 0..8 {
            s.note(1000 + 64 * k, 64, 10 + k); // a writer through 1000..1512, last at t=17
        }
        s.note(50, 1, 20); // and a random write
        let w = s.sweepers(17, 512);
        assert_eq!(w.len(), 1, "{w:?}");
        assert_eq!(w[0].next, 1512);
        assert!((w[0].share - 512.0 / 513.0).abs() < 1e-9, "{w:?}");
        assert!(w[0].reaches(1512, 256) && w[0].reaches(1766, 256), "the blocks right ahead of it");
        assert!(!w[0].reaches(1767, 256), "past its reach (its share of 256: 255)");
        assert!(!w[0].reaches(1511, 256), "a block it has passed already");
        assert!(s.sweepers(18, 512).is_empty(), "not continued since");
        assert!(s.sweepers(17, 513).is_empty(), "too short");
        assert_eq!(s.sweepers(0, 1).len(), 2, "a random write is a stream of one block");
        // A second writer as fast as the first, interleaved with it: each has half the pace.
        let mut s = Streams::default();
        for k in 0..8 {
            s.note(1000 + 64 * k, 64, k);
            s.note(90_000 + 64 * k, 64, k);
        }
        let w = s.sweepers(0, 512);
        assert_eq!(w.len(), 2);
        assert!(w.iter().all(|w| (w.share - 0.5).abs() < 0.05), "{w:?}");
        assert!(w[0].reaches(1512 + 127, 256) && !w[0].reaches(1512 + 128, 256));
        // A writer going round a small region, and one going backwards: after their first
        // requests, every request lands behind `next`, which stays put. Once more requests
        // than the reordering allows (64) have gone by without `next` moving, neither is a
        // sweeper of the blocks after `next` (it never writes them).
        let mut s = Streams::for_writes(64, 0);
        for lap in 0..12 {
            for k in 0..8 {
                s.note(1000 + 64 * k, 64, lap * 8 + k);
            }
            assert_eq!(s.sweepers(0, 64).is_empty(), lap >= 9, "a circular writer, lap {lap}");
        }
        let mut s = Streams::for_writes(64, 0);
        for k in 0..80 {
            s.note(10_000 - 64 * k, 64, k);
        }
        assert!(s.sweepers(0, 64).is_empty(), "a backward writer: {:?}", s.sweepers(0, 64));
    }

    #[test]
    fn interleaved_scans_are_each_followed_and_random_reads_start_none() {
        let mut s = Streams::default();
        // Two scans, interleaved, 16 blocks per read.
        for k in 0..10 {
            assert_eq!(s.note_(1000 + 16 * k, 16), 16 * k);
            assert_eq!(s.note_(9000 + 16 * k, 16), 16 * k);
        }
        // Random reads never continue a stream (nor do empty ones count).
        for b in [5, 300, 2000, 4000, 6000] {
            assert_eq!(s.note_(b, 1), 0);
        }
        assert_eq!(s.note_(1160, 0), 0);
        // Swapped neighbours still continue the first scan.
        assert_eq!(s.note_(1176, 16), 160);
        assert_eq!(s.note_(1160, 16), 176);
        // Sixteen other streams later, the first scan has been forgotten.
        for k in 0..STREAMS as u64 {
            s.note_(100_000 * (k + 1), 1);
        }
        assert_eq!(s.note_(1192, 16), 0);
    }
}
