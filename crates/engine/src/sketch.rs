//! The read-frequency sketch: how often each backing block was read lately, for blocks in the
//! cache and out of it, in about 2 bytes of RAM per cache block (a count-min sketch of 4-bit
//! counters, as TinyLFU and Caffeine keep, halved every `AGING_FACTOR` x width reads so it
//! follows the workload).
//!
//! The eviction policy asks it one question: was a block that just missed read before,
//! recently? Such a block (a re-reference the cache lost, what S3-FIFO's ghost queue
//! remembers) is admitted with a read already counted, so reclaim keeps it once more
//! (volume/reclaim.rs). A ghost list of evicted block numbers would cost 8 or more bytes per
//! cache block; the sketch costs 2 and needs no eviction bookkeeping.

/// Counters per row, per cache block (rounded up to a power of two).
const ROWS: usize = 4;
/// Reads between two halvings, per counter of a row.
const AGING_FACTOR: u64 = 10;
const SEEDS: [u64; ROWS] = [0x9E37_79B9_7F4A_7C15, 0xC2B2_AE3D_27D4_EB4F, 0x1656_67B1_9E37_79F9, 0x85EB_CA77_C2B2_AE63];

/// A count-min sketch of 4-bit counters over backing block numbers.
pub struct FrequencySketch {
    /// `ROWS` rows of `width` nibbles, two per byte.
    table: Box<[u8]>,
    /// Counters per row: a power of two.
    width: usize,
    /// Reads counted since the last halving.
    additions: u64,
}

impl FrequencySketch {
    /// A sketch for a cache of `cache_blocks` blocks.
    pub fn new(cache_blocks: usize) -> FrequencySketch {
        let width = cache_blocks.max(64).next_power_of_two();
        FrequencySketch { table: vec![0; ROWS * width / 2].into_boxed_slice(), width, additions: 0 }
    }

    /// RAM the sketch takes.
    pub fn memory_bytes(&self) -> usize {
        self.table.len()
    }

    fn cell(&self, row: usize, block: u64) -> usize {
        let h = (block ^ (row as u64) << 59).wrapping_mul(SEEDS[row]);
        row * self.width + (h >> 32) as usize % self.width
    }

    fn get(&self, cell: usize) -> u8 {
        (self.table[cell / 2] >> (4 * (cell % 2))) & 0xF
    }

    /// How often `block` was read lately (an overestimate by hash collisions, never under).
    pub fn estimate(&self, block: u64) -> u8 {
        (0..ROWS).map(|r| self.get(self.cell(r, block))).min().expect("rows")
    }

    /// Counts a read of `block` (conservative update: only the smallest counters grow, which
    /// keeps collisions from inflating the estimate).
    pub fn record(&mut self, block: u64) {
        let cells: [usize; ROWS] = std::array::from_fn(|r| self.cell(r, block));
        let min = cells.iter().map(|&c| self.get(c)).min().expect("rows");
        if min < 15 {
            for c in cells {
                if self.get(c) == min {
                    self.table[c / 2] += 1 << (4 * (c % 2));
                }
            }
        }
        self.additions += 1;
        if self.additions >= AGING_FACTOR * self.width as u64 {
            self.age();
        }
    }

    /// Halves every counter (both nibbles of a byte at once).
    fn age(&mut self) {
        for b in self.table.iter_mut() {
            *b = (*b >> 1) & 0x77;
        }
        self.additions = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_reads_and_forgets_them_with_age() {
        let mut s = FrequencySketch::new(1000);
        assert_eq!(s.estimate(42), 0);
        for _ in 0..3 {
            s.record(42);
        }
        assert_eq!(s.estimate(42), 3);
        for _ in 0..40 {
            s.record(7);
        }
        assert_eq!(s.estimate(7), 15, "counters saturate");
        // Other blocks' reads age it: after a halving, 3 -> 1.
        for b in 0..(AGING_FACTOR * s.width as u64) {
            s.record(1_000_000 + b);
        }
        assert!(s.estimate(42) <= 1, "aged: {}", s.estimate(42));
        assert!(s.estimate(7) >= 7, "halved, not cleared: {}", s.estimate(7));
    }

    #[test]
    fn collisions_overestimate_a_little_and_never_under() {
        let mut s = FrequencySketch::new(1024);
        for b in 0..1024u64 {
            for _ in 0..(b % 3) {
                s.record(b);
            }
        }
        let mut over = 0;
        for b in 0..1024u64 {
            let e = s.estimate(b);
            assert!(e >= (b % 3) as u8, "block {b}: {e}");
            over += usize::from(e > (b % 3) as u8);
        }
        assert!(over < 1024 / 10, "{over} of 1024 overestimated");
    }

    #[test]
    fn two_bytes_per_cache_block() {
        assert_eq!(FrequencySketch::new(1 << 20).memory_bytes(), 2 << 20);
    }
}
