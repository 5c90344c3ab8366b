//! Sequential read streams, recognised across requests: a read that starts where a recent
//! one ended continues its stream. Past `VolumeOptions::sequential_bypass_bytes` a stream's
//! misses are not admitted into the cache (a table scan, a backup or `pg_dump` reads the
//! volume once; admitted, it would push the hot set out of a FIFO log). A small table of
//! the most recent streams, least recently used replaced: several concurrent scans are each
//! recognised, and random reads (which never continue one) cost one table probe.

/// How many streams are followed at once.
const STREAMS: usize = 16;

#[derive(Debug, Default, Clone, Copy)]
struct Stream {
    /// The block the next read of this stream starts at.
    next: u64,
    /// Blocks read by the stream so far.
    blocks: u64,
    /// When it was last continued (a counter of reads).
    used: u64,
}

#[derive(Debug, Default)]
pub(super) struct Streams {
    table: [Stream; STREAMS],
    reads: u64,
}

impl Streams {
    /// Notes a read of blocks `first..first + n`; returns how many blocks its stream has
    /// read, this request included (`n` when it starts a new one).
    pub(super) fn note(&mut self, first: u64, n: u64) -> u64 {
        self.reads += 1;
        let now = self.reads;
        if let Some(s) = self.table.iter_mut().find(|s| s.blocks > 0 && s.next == first) {
            s.next = first + n;
            s.blocks += n;
            s.used = now;
            return s.blocks;
        }
        let oldest = self.table.iter_mut().min_by_key(|s| s.used).expect("a non-empty table");
        *oldest = Stream { next: first + n, blocks: n, used: now };
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn interleaved_scans_are_each_followed_and_random_reads_start_none() {
        let mut s = Streams::default();
        // Two scans, interleaved, 16 blocks per read.
        for k in 0..10 {
            assert_eq!(s.note(1000 + 16 * k, 16), 16 * (k + 1));
            assert_eq!(s.note(9000 + 16 * k, 16), 16 * (k + 1));
        }
        // Random reads never continue a stream.
        for b in [5, 77, 300, 12, 4000] {
            assert_eq!(s.note(b, 1), 1);
        }
        // Sixteen other streams later, the first scan has been forgotten.
        for k in 0..STREAMS as u64 {
            s.note(100_000 * (k + 1), 1);
        }
        assert_eq!(s.note(1160, 16), 16);
    }
}
