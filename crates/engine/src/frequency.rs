//! How often each block was read lately: a count-min sketch of 4-bit counters that halves
//! itself every few cache-fulls of reads (TinyLFU's frequency sketch, Einziger et al., 2017).
//!
//! The read cache asks it one question (`volume/admission.rs`): is a block the log is about
//! to admit read more often than the block the log would evict for it? A loop over more data
//! than the cache holds (arc_P6 at 10 %) reads every block of the loop as often as every
//! other, so no FIFO or LRU order keeps any of them; refusing blocks no more frequent than
//! the victim keeps a stable part of the loop, as W-TinyLFU does (0.35 miss ratio there
//! against S3-FIFO's 0.45).
//!
//! Layout, as in Caffeine's sketch: 64-bit words of sixteen 4-bit counters; a block hashes to
//! one word and to one counter in each quarter of it (four counters, one cache line for all
//! four). A word per cache block (8 bytes, Caffeine's size too): on the shared traces the
//! engine's replay missed 2.2 % more than the best published policy on average with it, 3.0 %
//! with half a word (overcounts make the gate's comparisons noisy, and the duel's choice with
//! them), and the model 1-3 % more again at a quarter. Written by hand:
//! the crates that offer one (`moka`'s is internal) do not expose the estimate and the reset
//! this policy needs, and the whole of it is a page.

/// Counters saturate here.
const COUNTER_MAX: u64 = 15;
/// Every counter halved when this many cache-fulls of reads were counted since the last
/// halving: frequency is that of the last few laps, not of all time.
pub const AGE_CACHE_FULLS: u64 = 5;
/// Sketch words per cache block (a word is 8 bytes).
const WORDS_PER_BLOCK: f64 = 1.0;

pub struct Sketch {
    words: Vec<u64>,
    /// Increments since the last halving, and how many trigger the next.
    counted: u64,
    period: u64,
}

impl Sketch {
    /// A sketch for a cache of `cache_blocks` blocks.
    pub fn new(cache_blocks: u64) -> Sketch {
        // (Any number of words, not a power of two: the word is picked by multiplying, so the
        // table is a word per block at every size, not up to twice that.)
        let words = ((cache_blocks as f64 * WORDS_PER_BLOCK) as u64).clamp(8, u64::from(u32::MAX));
        Sketch { words: vec![0; words as usize], counted: 0, period: (cache_blocks * AGE_CACHE_FULLS).max(64) }
    }

    /// RAM the sketch takes.
    pub fn memory_bytes(&self) -> usize {
        self.words.len() * 8
    }

    /// The word of `block`, and the bit offsets of its four counters in it.
    fn slots(&self, block: u64) -> (usize, [u32; 4]) {
        let h = mix(block);
        // (The low half of the hash scaled to the table: Lemire's multiply-shift reduction.)
        let word = (((h & 0xFFFF_FFFF) * self.words.len() as u64) >> 32) as usize;
        let pick = (h >> 32) as u32;
        // Counter i of the block lies in quarter i of the word: four distinct counters.
        (word, std::array::from_fn(|i| ((pick >> (2 * i)) & 3) * 16 + i as u32 * 4))
    }

    /// Counts one read of `block`.
    pub fn increment(&mut self, block: u64) {
        let (w, offsets) = self.slots(block);
        let mut word = self.words[w];
        for o in offsets {
            if (word >> o) & COUNTER_MAX < COUNTER_MAX {
                word += 1 << o;
            }
        }
        self.words[w] = word;
        self.counted += 1;
        if self.counted >= self.period {
            self.halve();
        }
    }

    /// How many times `block` was read lately (an overestimate at worst, 0 to 15).
    pub fn estimate(&self, block: u64) -> u8 {
        let (w, offsets) = self.slots(block);
        let word = self.words[w];
        offsets.iter().map(|&o| ((word >> o) & COUNTER_MAX) as u8).min().expect("four counters")
    }

    fn halve(&mut self) {
        for w in &mut self.words {
            *w = (*w >> 1) & 0x7777_7777_7777_7777;
        }
        self.counted = 0;
    }
}

/// SplitMix64's finalizer: blocks that differ in one bit land on unrelated words.
pub(crate) fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_reads_and_saturates() {
        let mut s = Sketch::new(1 << 16);
        for _ in 0..3 {
            s.increment(7);
        }
        assert_eq!(s.estimate(7), 3);
        assert_eq!(s.estimate(8), 0);
        for _ in 0..40 {
            s.increment(9);
        }
        assert_eq!(s.estimate(9), 15);
    }

    #[test]
    fn halves_every_few_cache_fulls() {
        let mut s = Sketch::new(4096);
        for _ in 0..8 {
            s.increment(1);
        }
        // 4096 blocks: the period is 5 x 4096 = 20,480 increments, 8 spent. (Another block
        // takes the rest: its four counters saturate, and block 1's stay apart from them.)
        for _ in 0..20_471 {
            s.increment(2);
        }
        assert_eq!(s.estimate(1), 8);
        assert_eq!(s.estimate(2), 15);
        s.increment(2);
        assert_eq!(s.estimate(1), 4, "halved at the 20,480th increment");
        assert_eq!(s.estimate(2), 7);
    }

    #[test]
    fn estimates_rarely_overcount_at_a_word_per_block() {
        // A cache of 4096 blocks, 4096 blocks read once each: one per word on average, so a
        // block's four counters all collide with others' for a few per cent of them (a
        // Poisson mix of 1 - (3/4)^k per quarter, to the fourth), never by much.
        let mut s = Sketch::new(4096);
        for b in 0..4096 {
            s.increment(b * 7919);
        }
        let over = (0..4096).filter(|b| s.estimate(b * 7919) > 1).count();
        assert!(over < 200, "{over} of 4096 overcounted");
        assert!((0..4096).all(|b| s.estimate(b * 7919) <= 3), "no estimate far off");
        assert_eq!(s.memory_bytes(), 4096 * 8);
        assert_eq!(Sketch::new(3 << 19).memory_bytes(), 3 << 22, "8 bytes a block, not rounded up");
    }
}
