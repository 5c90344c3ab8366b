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
//! place) supersedes each block just before the head reaches it; the pre-cleaner leaves such
//! data alone (`sweeping`) instead of writing back what is about to be dead.

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
}

#[derive(Debug, Default)]
pub(super) struct Streams {
    table: [Stream; STREAMS],
    reads: u64,
}

impl Streams {
    /// Notes a read of blocks `first..first + n`; returns how many blocks its stream had
    /// advanced through before it (0 when it starts a new one, and for an empty read, which
    /// is not noted). A stream advances by the blocks a read takes it past where it stood.
    pub(super) fn note(&mut self, first: u64, n: u64, now_ns: u64) -> u64 {
        if n == 0 {
            return 0;
        }
        self.reads += 1;
        let now = self.reads;
        // (Behind by up to two reads: the one a swapped neighbour pushed `next` past, and its own.)
        let near = |s: &&mut Stream| s.blocks > 0 && first + 2 * s.last >= s.next && first <= s.next + s.last;
        // (The longest stream near, if several are: a re-read of a scan's tail continues it.)
        if let Some(s) = self.table.iter_mut().filter(near).max_by_key(|s| s.blocks) {
            let before = s.blocks;
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
        *oldest = Stream { next: first + n, blocks: n, last: n, used: now, at_ns: now_ns };
        0
    }

    /// Whether a stream continued since `since_ns`, at least `min_blocks` long, stands at or
    /// before block `lo` and will pass `hi` within `reach` more blocks: its next requests
    /// supersede the blocks `lo..=hi` (those of them still to be written).
    pub(super) fn sweeping(&self, lo: u64, hi: u64, reach: u64, since_ns: u64, min_blocks: u64) -> bool {
        self.table
            .iter()
            .any(|s| s.blocks >= min_blocks && s.at_ns >= since_ns && s.next <= lo && hi < s.next.saturating_add(reach))
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
    fn a_sweeping_stream_is_one_recent_long_enough_and_short_of_the_blocks() {
        let mut s = Streams::default();
        for k in 0..8 {
            s.note(1000 + 64 * k, 64, 10 + k); // a writer through 1000..1512, last at t=17
        }
        s.note(50, 1, 20); // and a random write
        assert!(s.sweeping(1512, 1767, 256, 17, 512), "the blocks right ahead of it");
        assert!(s.sweeping(1600, 1700, 256, 0, 0));
        assert!(!s.sweeping(1512, 1768, 256, 17, 512), "past its reach");
        assert!(!s.sweeping(1400, 1600, 256, 17, 512), "blocks it has passed already");
        assert!(!s.sweeping(1512, 1600, 256, 18, 512), "not continued since");
        assert!(!s.sweeping(1512, 1600, 256, 17, 513), "too short");
        assert!(!s.sweeping(51, 52, 256, 0, 2), "a random write is no stream");
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
