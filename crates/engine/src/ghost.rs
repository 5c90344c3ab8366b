//! The ghost queue: which blocks reclaim evicted lately, in about 4 bytes of RAM per cache
//! block (S3-FIFO's ghost queue remembers as many evicted keys as its main queue holds; a
//! list of block numbers would cost 8 bytes or more per entry).
//!
//! Two Bloom filters, each sized for `capacity` evictions (the volume gives its log's
//! length) at about 0.1 % false positives (16 bits and 6 probes per entry): evictions go
//! into the current one; when it holds `capacity`, it becomes the previous one and the old
//! previous one is cleared for reuse. A block is a ghost if either holds it: so the queue
//! remembers the last one to two generations of evictions. A false positive (about 0.2 %
//! with both full) costs a block admitted into the log that the probation ring would have
//! tried first: not nothing (with 12 bits per entry, 0.7 % false positives, the replay of
//! the shared traces missed 0.24 % more on average), so the filters stay this large.
//!
//! The eviction policy asks one question (volume/commit.rs, `freq_at_install`): was a block
//! that just missed evicted lately? Such a block is a re-reference the cache lost; it is
//! admitted with a read already counted, so reclaim keeps it once.

/// Bits per entry of one filter, and probes per entry (about 0.1 % false positives full).
const BITS_PER_ENTRY: usize = 16;
const PROBES: u64 = 6;

pub struct Ghosts {
    /// Two filters of `bits` bits each: `current` receives evictions.
    filters: [Box<[u64]>; 2],
    current: usize,
    /// Evictions the current filter holds, and how many it takes before it is rotated.
    inserted: u64,
    capacity: u64,
    /// Bits per filter: a multiple of 64.
    bits: u64,
}

impl Ghosts {
    /// A ghost queue whose generations hold `capacity` evictions each.
    pub fn new(capacity: usize) -> Ghosts {
        let bits = (capacity.max(64) * BITS_PER_ENTRY).next_multiple_of(64) as u64;
        let words = (bits / 64) as usize;
        Ghosts {
            filters: [vec![0; words].into_boxed_slice(), vec![0; words].into_boxed_slice()],
            current: 0,
            inserted: 0,
            capacity: capacity.max(1) as u64,
            bits,
        }
    }

    /// RAM both filters take.
    pub fn memory_bytes(&self) -> usize {
        self.filters.iter().map(|f| f.len() * 8).sum()
    }

    /// The bit positions of `block` in filters of `bits` bits (double hashing of one 64-bit
    /// mix).
    fn probes(bits: u64, block: u64) -> impl Iterator<Item = u64> {
        let h = (block ^ 0x5851_F42D_4C95_7F2D).wrapping_mul(0x9E37_79B9_7F4A_7C15);
        let (h1, h2) = (h >> 32, (h & 0xFFFF_FFFF) | 1);
        // (Multiply-shift range reduction of a 32-bit hash: no power-of-two size needed. In
        // 128 bits: a filter of more than 2^32 bits, a log of more than 2^28 blocks, would
        // overflow 64.)
        (0..PROBES).map(move |i| {
            let h = h1.wrapping_add(i.wrapping_mul(h2)) & 0xFFFF_FFFF;
            ((u128::from(h) * u128::from(bits)) >> 32) as u64
        })
    }

    /// Remembers that `block` was evicted.
    pub fn insert(&mut self, block: u64) {
        if self.inserted >= self.capacity {
            self.current ^= 1;
            self.filters[self.current].fill(0);
            self.inserted = 0;
        }
        let f = &mut self.filters[self.current];
        for p in Self::probes(self.bits, block) {
            f[(p / 64) as usize] |= 1 << (p % 64);
        }
        self.inserted += 1;
    }

    /// Whether `block` was evicted within the last one to two generations of evictions (or,
    /// about once in 500, a block that was not).
    pub fn contains(&self, block: u64) -> bool {
        self.filters.iter().any(|f| Self::probes(self.bits, block).all(|p| f[(p / 64) as usize] & (1 << (p % 64)) != 0))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remembers_one_to_two_logs_of_evictions() {
        let mut g = Ghosts::new(1000);
        for b in 0..1000 {
            g.insert(b);
        }
        assert!((0..1000).all(|b| g.contains(b)), "a log's worth is remembered");
        for b in 1000..2000 {
            g.insert(b);
        }
        assert!((0..2000).all(|b| g.contains(b)), "and the one before it");
        for b in 2000..3000 {
            g.insert(b);
        }
        let old = (0..1000).filter(|&b| g.contains(b)).count();
        assert!(old < 50, "the oldest generation is forgotten: {old} of 1000 still reported");
        assert!((1000..3000).all(|b| g.contains(b)));
    }

    #[test]
    fn false_positives_are_rare() {
        let mut g = Ghosts::new(10_000);
        for b in 0..20_000u64 {
            g.insert(b * 7919);
        }
        let fp = (0..100_000u64).map(|b| 1_000_000_007 + b * 13).filter(|&b| g.contains(b)).count();
        // (Each full filter about 0.1 %; a block is checked against both.)
        assert!(fp < 500, "{fp} false positives in 100,000");
    }

    /// A log of 2^29 blocks (2 TiB) makes filters of 2^33 bits: every probe lands inside.
    #[test]
    fn probes_fit_filters_of_more_than_2_32_bits() {
        let bits = 16u64 << 29;
        for block in (0..1_000_000u64).map(|b| b * 2_654_435_761) {
            assert!(Ghosts::probes(bits, block).all(|p| p < bits), "block {block}");
        }
        assert!((0..1000u64).flat_map(|b| Ghosts::probes(bits, b)).any(|p| p >= 1 << 32), "probes use the high bits");
    }

    #[test]
    fn four_bytes_per_cache_block() {
        // (Two generations of 2 bytes per entry; the volume sizes each for its log.)
        assert_eq!(Ghosts::new(1 << 20).memory_bytes(), 2 * (16 << 20) / 8);
    }
}
