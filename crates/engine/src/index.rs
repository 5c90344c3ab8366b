//! The index: backing block -> where its newest cached copy lives, in about 12.7 bytes of RAM
//! per cached block at full cache (the kernel caches spend 50-80 bytes per 4 KiB block).
//!
//! Two arrays, both sized once for the log's block count, so nothing grows or allocates on
//! the data path:
//! - `slots`: per log slot, the backing block it holds and the data's CRC (8 bytes). It is
//!   also the reverse map that reclaim and the pre-cleaner scan, with no I/O.
//! - `buckets`: an open-addressing hash table (linear probing, backward-shift deletion, at
//!   most 85 % full) of 4-byte values `slot | DIRTY | FREQ` (FREQ: a 2-bit count of reads
//!   since the copy was cached or last kept by reclaim, the eviction policy's input). The key is not stored: a
//!   bucket's key is `slots[slot].block`, one indirection away.
//!
//! Invariant: a bucket names slot `s` iff `slots[s].block` is that bucket's key, and every
//! live entry has its own slot. A slot that no entry names has `block == NONE`.
//!
//! Written by hand rather than with `hashbrown`: a generic map needs the key in the table and
//! a power-of-two capacity (13 to 30 bytes per entry), and the compact index is this
//! product's own value (docs/design.md).

use tiercache_format::constants::MAX_BACKING_BLOCKS;

/// A bucket with no entry.
const EMPTY: u32 = u32::MAX;
/// A slot holding no live block.
const NONE: u32 = u32::MAX;
const _: () = assert!(MAX_BACKING_BLOCKS < NONE as u64);

/// Maximum load factor of the bucket table: 85 / 100.
const LOAD_NUM: u64 = 85;
const LOAD_DEN: u64 = 100;

const SLOT_MASK: u32 = (1 << 29) - 1;
const FREQ_SHIFT: u32 = 29;
const FREQ_MASK: u32 = 3 << FREQ_SHIFT;
const DIRTY_BIT: u32 = 1 << 31;
/// The most reads a copy's count remembers.
pub const FREQ_MAX: u8 = 3;
// The one value that would equal EMPTY, the last slot of a 2^29-block log dirty with a count
// of 3, never occurs: that slot's count stops at 2 (`freq_max`). (A smaller `MAX_LOG_BLOCKS`
// would have refused caches already formatted at the largest size.)
const _: () = assert!(SLOT_MASK | DIRTY_BIT | FREQ_MASK == EMPTY);
const _: () = assert!(tiercache_format::constants::MAX_LOG_BLOCKS <= SLOT_MASK as u64 + 1);

/// The highest count an entry in `slot` keeps.
fn freq_max(slot: u32) -> u8 {
    if slot == SLOT_MASK {
        FREQ_MAX - 1
    } else {
        FREQ_MAX
    }
}

/// Where a backing block's newest cached copy lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    /// The log slot holding the data.
    pub slot: u32,
    /// Newer than the backing device's copy.
    pub dirty: bool,
    /// Reads since it was cached or last kept by reclaim, up to `FREQ_MAX` (the eviction
    /// policy: reclaim keeps a clean copy whose count is not zero, one less).
    pub freq: u8,
    /// CRC-32C of the data, checked on every read from the cache device.
    pub crc: u32,
}

#[derive(Debug, Clone, Copy)]
#[repr(C)]
struct SlotInfo {
    block: u32,
    crc: u32,
}

const _: () = assert!(std::mem::size_of::<SlotInfo>() == 8);

/// RAM the index takes for a log of `log_blocks` (what `create` reports before opening).
pub fn index_ram_bytes(log_blocks: u64) -> u64 {
    (log_blocks * LOAD_DEN).div_ceil(LOAD_NUM).max(log_blocks + 1) * 4
        + log_blocks * std::mem::size_of::<SlotInfo>() as u64
}

/// The index. Not synchronised: the volume keeps it under its state lock. (`Clone` is two
/// flat copies: a checkpoint's snapshot.)
#[derive(Clone)]
pub struct Index {
    buckets: Box<[u32]>,
    slots: Box<[SlotInfo]>,
    len: usize,
    dirty: usize,
    /// Entries whose read count is not zero.
    hot: usize,
    /// Entries replaced or removed so far: while it stays the same, every entry that was
    /// present still names the same slot (`moves`).
    moves: u64,
}

impl Index {
    /// An index for a log of `log_blocks` slots.
    pub fn with_capacity(log_blocks: usize) -> Index {
        let buckets = (log_blocks as u64 * LOAD_DEN).div_ceil(LOAD_NUM).max(log_blocks as u64 + 1);
        let buckets = usize::try_from(buckets).expect("index fits memory");
        Index {
            buckets: vec![EMPTY; buckets].into_boxed_slice(),
            slots: vec![SlotInfo { block: NONE, crc: 0 }; log_blocks].into_boxed_slice(),
            len: 0,
            dirty: 0,
            hot: 0,
            moves: 0,
        }
    }

    /// How many entries have been replaced or removed (not counting read counts and dirty
    /// flags): a reader that finds it unchanged knows every hit it planned is still current
    /// (`Volume::admit_and_confirm`), with no lookup per block.
    pub fn moves(&self) -> u64 {
        self.moves
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Entries that are dirty.
    pub fn dirty_len(&self) -> usize {
        self.dirty
    }

    /// Entries read since cached or last kept (a read count above zero).
    pub fn hot_len(&self) -> usize {
        self.hot
    }

    /// RAM used by both arrays.
    pub fn memory_bytes(&self) -> usize {
        self.buckets.len() * 4 + self.slots.len() * std::mem::size_of::<SlotInfo>()
    }

    /// RAM per block when the cache is full (what `status` reports).
    pub fn bytes_per_cached_block(&self) -> f64 {
        self.memory_bytes() as f64 / self.slots.len().max(1) as f64
    }

    fn home(&self, key: u32) -> usize {
        // Fibonacci hashing, then a multiply-shift range reduction (no power-of-two size).
        let h = u64::from(key.wrapping_mul(0x9E37_79B1));
        ((h * self.buckets.len() as u64) >> 32) as usize
    }

    fn key_of(&self, bucket: u32) -> u32 {
        self.slots[(bucket & SLOT_MASK) as usize].block
    }

    fn entry_of(&self, bucket: u32) -> IndexEntry {
        let slot = bucket & SLOT_MASK;
        IndexEntry {
            slot,
            dirty: bucket & DIRTY_BIT != 0,
            freq: ((bucket & FREQ_MASK) >> FREQ_SHIFT) as u8,
            crc: self.slots[slot as usize].crc,
        }
    }

    fn find(&self, key: u32) -> Option<usize> {
        let n = self.buckets.len();
        let mut i = self.home(key);
        loop {
            let b = self.buckets[i];
            if b == EMPTY {
                return None;
            }
            if self.key_of(b) == key {
                return Some(i);
            }
            i = if i + 1 == n { 0 } else { i + 1 };
        }
    }

    fn key(block: u64) -> u32 {
        assert!(block <= MAX_BACKING_BLOCKS, "backing block {block} beyond the index's range");
        block as u32
    }

    /// Brings the table memory that lookups of `blocks` will touch into the CPU cache: each
    /// block's home bucket, then the slot it names, in two tight passes whose loads the CPU
    /// overlaps (a large read looks up hundreds of blocks one after another, each a cache
    /// miss or two once the data it read has pushed the table out).
    pub fn warm(&self, blocks: std::ops::Range<u64>) {
        let mut sum = 0u32;
        for block in blocks.clone() {
            sum ^= self.buckets[self.home(Self::key(block))];
        }
        for block in blocks {
            let b = self.buckets[self.home(Self::key(block))];
            if b != EMPTY {
                sum ^= self.slots[(b & SLOT_MASK) as usize].block;
            }
        }
        std::hint::black_box(sum);
    }

    pub fn get(&self, block: u64) -> Option<IndexEntry> {
        self.find(Self::key(block)).map(|i| self.entry_of(self.buckets[i]))
    }

    /// The block whose live copy is in `slot`, if any (the reverse map).
    pub fn owner(&self, slot: u32) -> Option<(u64, IndexEntry)> {
        let block = self.slots[slot as usize].block;
        if block == NONE {
            return None;
        }
        let e = self.get(u64::from(block))?;
        (e.slot == slot).then_some((u64::from(block), e))
    }

    /// Counts a read of a present entry (saturating at `FREQ_MAX`).
    pub fn touch(&mut self, block: u64) {
        if let Some(i) = self.find(Self::key(block)) {
            let b = self.buckets[i];
            if (((b & FREQ_MASK) >> FREQ_SHIFT) as u8) < freq_max(b & SLOT_MASK) {
                self.buckets[i] = b + (1 << FREQ_SHIFT);
                self.hot += usize::from(b & FREQ_MASK == 0);
            }
        }
    }

    /// Inserts or replaces; returns the previous entry. `e.slot` must hold no other live block.
    pub fn insert(&mut self, block: u64, e: IndexEntry) -> Option<IndexEntry> {
        let key = Self::key(block);
        assert!(e.slot <= SLOT_MASK && (e.slot as usize) < self.slots.len(), "slot {} out of range", e.slot);
        debug_assert!(
            self.owner(e.slot).is_none_or(|(b, _)| b == block),
            "slot {} still holds a live block while {block} is put there",
            e.slot
        );
        assert!(e.freq <= FREQ_MAX, "read count out of range: {e:?}");
        let freq = e.freq.min(freq_max(e.slot));
        let value = e.slot | if e.dirty { DIRTY_BIT } else { 0 } | u32::from(freq) << FREQ_SHIFT;
        match self.find(key) {
            Some(i) => {
                let old = self.entry_of(self.buckets[i]);
                self.dirty = self.dirty - usize::from(old.dirty) + usize::from(e.dirty);
                self.hot = self.hot - usize::from(old.freq > 0) + usize::from(freq > 0);
                if old.slot != e.slot {
                    self.slots[old.slot as usize] = SlotInfo { block: NONE, crc: 0 };
                }
                self.slots[e.slot as usize] = SlotInfo { block: key, crc: e.crc };
                self.buckets[i] = value;
                self.moves += 1;
                Some(old)
            }
            None => {
                assert!(self.len < self.slots.len(), "index over capacity ({} entries)", self.slots.len());
                self.slots[e.slot as usize] = SlotInfo { block: key, crc: e.crc };
                let n = self.buckets.len();
                let mut i = self.home(key);
                while self.buckets[i] != EMPTY {
                    i = if i + 1 == n { 0 } else { i + 1 };
                }
                self.buckets[i] = value;
                self.len += 1;
                self.dirty += usize::from(e.dirty);
                self.hot += usize::from(freq > 0);
                None
            }
        }
    }

    /// Sets the read count of a present entry (capped as `touch` caps it).
    pub fn set_freq(&mut self, block: u64, freq: u8) {
        if let Some(i) = self.find(Self::key(block)) {
            let b = self.buckets[i];
            let freq = freq.min(freq_max(b & SLOT_MASK));
            self.hot = self.hot - usize::from(b & FREQ_MASK != 0) + usize::from(freq > 0);
            self.buckets[i] = (b & !FREQ_MASK) | u32::from(freq) << FREQ_SHIFT;
        }
    }

    /// Marks a present entry clean if it still names `slot`; returns whether it did.
    pub fn mark_clean(&mut self, block: u64, slot: u32) -> bool {
        match self.find(Self::key(block)) {
            Some(i) if self.buckets[i] & SLOT_MASK == slot && self.buckets[i] & DIRTY_BIT != 0 => {
                self.buckets[i] &= !DIRTY_BIT;
                self.dirty -= 1;
                true
            }
            _ => false,
        }
    }

    /// Removes an entry; returns it.
    pub fn remove(&mut self, block: u64) -> Option<IndexEntry> {
        let mut hole = self.find(Self::key(block))?;
        let old = self.entry_of(self.buckets[hole]);
        self.slots[old.slot as usize] = SlotInfo { block: NONE, crc: 0 };
        self.len -= 1;
        self.dirty -= usize::from(old.dirty);
        self.hot -= usize::from(old.freq > 0);
        self.moves += 1;
        // Backward-shift deletion: move later members of the probe run into the hole so
        // that lookups never stop early (no tombstones, no rehashing).
        let n = self.buckets.len();
        let mut j = hole;
        loop {
            j = if j + 1 == n { 0 } else { j + 1 };
            let b = self.buckets[j];
            if b == EMPTY {
                break;
            }
            let home = self.home(self.key_of(b));
            // Can bucket j's entry move to `hole`? Only if its home is not cyclically in (hole, j].
            let in_range = if hole <= j { home > hole && home <= j } else { home > hole || home <= j };
            if !in_range {
                self.buckets[hole] = b;
                hole = j;
            }
        }
        self.buckets[hole] = EMPTY;
        Some(old)
    }

    /// Removes the entry only if it still names `slot`.
    pub fn remove_if_slot(&mut self, block: u64, slot: u32) -> Option<IndexEntry> {
        match self.get(block) {
            Some(e) if e.slot == slot => self.remove(block),
            _ => None,
        }
    }

    /// Every entry, in table order.
    pub fn iter(&self) -> impl Iterator<Item = (u64, IndexEntry)> + '_ {
        self.buckets.iter().filter(|&&b| b != EMPTY).map(|&b| (u64::from(self.key_of(b)), self.entry_of(b)))
    }

    /// How many buckets the table has (the bound of `dirty_in_buckets`' ranges).
    pub fn bucket_count(&self) -> usize {
        self.buckets.len()
    }

    /// The first empty bucket at or after `bucket` (or the bucket count: no wrap). A scan a
    /// range at a time that runs each range on to here sees every entry present when it
    /// scans the range, whatever deletions do between two ranges: a backward shift moves an
    /// entry back at most to its home bucket, and linear probing leaves no empty bucket
    /// between an entry's home and where it sits, so an entry that can shift back below
    /// `bucket` lies in the run of full buckets starting there. (One homed beyond an empty
    /// bucket never shifts past it.) At 85 % load such runs are a few buckets long.
    pub fn run_end(&self, bucket: usize) -> usize {
        self.buckets[bucket..].iter().position(|&b| b == EMPTY).map_or(self.buckets.len(), |i| bucket + i)
    }

    /// The dirty entries in buckets `range` as (block, slot), in table order. The dirty bit
    /// is in the bucket, so a clean entry costs no look at its slot: a caller can scan the
    /// table a range at a time (each under its own lock hold) without decoding all of it.
    /// Between two calls, a deletion's backward shift can move an entry into a range already
    /// scanned (missed, unless that range ran on to `run_end`) or, at the wrap, from the
    /// table's first buckets to its last (seen twice).
    pub fn dirty_in_buckets(&self, range: std::ops::Range<usize>) -> impl Iterator<Item = (u64, u32)> + '_ {
        self.buckets[range]
            .iter()
            .filter(|&&b| b != EMPTY && b & DIRTY_BIT != 0)
            .map(|&b| (u64::from(self.key_of(b)), b & SLOT_MASK))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use std::collections::HashMap;

    /// A scan a few buckets at a time, each range run on to `run_end`, with deletions and
    /// insertions between two ranges (`Volume::scan_index` lets the state lock go there):
    /// every entry present from the scan's start to its end is seen. Without the run-on,
    /// a deletion's backward shift hides some (asserted too, so the test shows what it tests).
    #[test]
    fn a_scan_run_on_to_the_run_end_sees_every_entry_present_throughout() {
        let mut hidden_without_run_on = 0;
        for seed in 0..200 {
            for run_on in [true, false] {
                let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
                let cap = rng.gen_range(20..300usize);
                let mut idx = Index::with_capacity(cap);
                let mut free_slots: Vec<u32> = (0..cap as u32).collect();
                let mut keys: Vec<u64> = Vec::new();
                while keys.len() < cap * 85 / 100 {
                    let key = rng.gen_range(0..cap as u64 * 4);
                    if idx.get(key).is_none() {
                        let slot = free_slots.pop().unwrap();
                        idx.insert(key, IndexEntry { slot, dirty: true, freq: 0, crc: 0 });
                        keys.push(key);
                    }
                }
                let mut throughout: std::collections::HashSet<u64> = keys.iter().copied().collect();
                let mut seen = std::collections::HashSet::new();
                let chunk = rng.gen_range(1..8usize);
                let mut from = 0;
                while from < idx.bucket_count() {
                    let end = (from + chunk).min(idx.bucket_count());
                    let to = if run_on { idx.run_end(end) } else { end };
                    seen.extend(idx.dirty_in_buckets(from..to).map(|(k, _)| k));
                    from = to;
                    for _ in 0..rng.gen_range(0..3) {
                        if rng.gen_bool(0.6) && !keys.is_empty() {
                            let key = keys.swap_remove(rng.gen_range(0..keys.len()));
                            free_slots.push(idx.remove(key).expect("present").slot);
                            throughout.remove(&key);
                        } else if let Some(slot) = free_slots.pop() {
                            let key = rng.gen_range(0..cap as u64 * 4);
                            if idx.get(key).is_none() {
                                idx.insert(key, IndexEntry { slot, dirty: true, freq: 0, crc: 0 });
                                keys.push(key);
                            } else {
                                free_slots.push(slot);
                            }
                        }
                    }
                }
                let missed = throughout.iter().filter(|k| !seen.contains(k)).count();
                if run_on {
                    assert_eq!(missed, 0, "seed {seed}: entries present throughout, not seen");
                } else {
                    hidden_without_run_on += missed;
                }
            }
        }
        assert!(hidden_without_run_on > 0, "the deletions never hid an entry: the test shows nothing");
    }

    #[test]
    fn behaves_like_a_hashmap_with_a_reverse_map_under_random_operations() {
        for seed in 0..20 {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let cap = rng.gen_range(1..500usize);
            let mut idx = Index::with_capacity(cap);
            let mut model: HashMap<u64, IndexEntry> = HashMap::new();
            for _ in 0..5000 {
                let key = rng.gen_range(0..cap as u64 * 2);
                match rng.gen_range(0..4) {
                    0 | 1 => {
                        // Only free slots (or the key's own) may be used, as in the log.
                        let used: std::collections::HashSet<u32> =
                            model.iter().filter(|(k, _)| **k != key).map(|(_, v)| v.slot).collect();
                        let free: Vec<u32> = (0..cap as u32).filter(|s| !used.contains(s)).collect();
                        if free.is_empty() {
                            continue;
                        }
                        let slot = free[rng.gen_range(0..free.len())];
                        let v = IndexEntry {
                            slot,
                            dirty: rng.gen_bool(0.5),
                            freq: rng.gen_range(0..=FREQ_MAX),
                            crc: rng.gen(),
                        };
                        assert_eq!(idx.insert(key, v), model.insert(key, v));
                    }
                    2 if rng.gen_bool(0.5) => {
                        idx.touch(key);
                        if let Some(v) = model.get_mut(&key) {
                            v.freq = (v.freq + 1).min(FREQ_MAX);
                        }
                    }
                    2 => assert_eq!(idx.remove(key), model.remove(&key)),
                    _ => {
                        let slot = rng.gen_range(0..cap as u32);
                        let expect = matches!(model.get(&key), Some(x) if x.slot == slot && x.dirty);
                        assert_eq!(idx.mark_clean(key, slot), expect);
                        if expect {
                            model.get_mut(&key).unwrap().dirty = false;
                        }
                    }
                }
                assert_eq!(idx.len(), model.len());
                assert_eq!(idx.dirty_len(), model.values().filter(|v| v.dirty).count());
                assert_eq!(idx.hot_len(), model.values().filter(|v| v.freq > 0).count());
            }
            for (k, v) in &model {
                assert_eq!(idx.get(*k), Some(*v), "seed {seed} key {k}");
                assert_eq!(idx.owner(v.slot), Some((*k, *v)), "seed {seed} reverse map of slot {}", v.slot);
            }
            let live: usize = (0..cap as u32).filter(|&s| idx.owner(s).is_some()).count();
            assert_eq!(live, model.len());
            assert_eq!(idx.iter().count(), model.len());
            // The dirty entries, a range of buckets at a time, are the model's dirty ones.
            let step = 1 + seed as usize * 7;
            let mut dirty: Vec<(u64, u32)> = (0..idx.bucket_count())
                .step_by(step)
                .flat_map(|from| idx.dirty_in_buckets(from..(from + step).min(idx.bucket_count())))
                .collect();
            dirty.sort_unstable();
            let mut expected: Vec<(u64, u32)> =
                model.iter().filter(|(_, v)| v.dirty).map(|(&k, v)| (k, v.slot)).collect();
            expected.sort_unstable();
            assert_eq!(dirty, expected, "seed {seed}");
        }
    }

    #[test]
    fn full_table_keeps_every_entry_reachable() {
        let cap = 10_000;
        let mut idx = Index::with_capacity(cap);
        for k in 0..cap as u64 {
            idx.insert(k * 7919, IndexEntry { slot: k as u32, dirty: false, freq: 0, crc: 1 });
        }
        for k in (0..cap as u64).step_by(3) {
            idx.remove(k * 7919);
        }
        for k in 0..cap as u64 {
            assert_eq!(idx.get(k * 7919).is_some(), k % 3 != 0, "key {k}");
            assert_eq!(idx.owner(k as u32).is_some(), k % 3 != 0);
        }
    }

    #[test]
    fn ram_per_cached_block_is_under_16_bytes() {
        for cap in [1000, 262_144, 1_000_003] {
            let idx = Index::with_capacity(cap);
            assert!(idx.bytes_per_cached_block() <= 12.8, "{cap}: {}", idx.bytes_per_cached_block());
        }
    }

    #[test]
    fn flags_are_kept_apart_from_the_slot() {
        let mut idx = Index::with_capacity(SLOT_MASK as usize + 1 - (SLOT_MASK as usize + 1 - 8));
        idx.insert(3, IndexEntry { slot: 7, dirty: true, freq: 0, crc: 9 });
        idx.touch(3);
        let got = idx.get(3).unwrap();
        assert_eq!((got.slot, got.dirty, got.freq, got.crc), (7, true, 1, 9));
        for _ in 0..5 {
            idx.touch(3);
        }
        assert_eq!(idx.get(3).unwrap().freq, FREQ_MAX, "the count saturates");
        assert_eq!(idx.get(3).unwrap().slot, 7, "without spilling into the slot");
        assert!(idx.mark_clean(3, 7));
        assert!(!idx.get(3).unwrap().dirty);
    }

    #[test]
    fn the_last_slot_of_the_largest_log_never_looks_empty() {
        // (The real index for 2^29 slots takes 6 GiB; the bucket encoding is what matters.)
        let slot = SLOT_MASK;
        let value = |freq: u8| slot | DIRTY_BIT | u32::from(freq.min(freq_max(slot))) << FREQ_SHIFT;
        assert_ne!(value(FREQ_MAX), EMPTY);
        assert_eq!(freq_max(slot), 2);
        assert_eq!(freq_max(slot - 1), FREQ_MAX);
    }

    #[test]
    fn moves_counts_replacements_and_removals_only() {
        let e = |slot, dirty| IndexEntry { slot, dirty, freq: 0, crc: slot };
        let mut idx = Index::with_capacity(64);
        idx.insert(1, e(0, true));
        idx.insert(2, e(1, false));
        assert_eq!(idx.moves(), 0, "new entries move nothing that was there");
        idx.touch(1);
        idx.set_freq(2, 3);
        assert!(idx.mark_clean(1, 0));
        assert!(idx.remove_if_slot(2, 7).is_none());
        assert!(idx.remove(9).is_none());
        idx.warm(0..64);
        assert_eq!(idx.moves(), 0, "counts, dirty flags, misses and warming are no moves");
        assert_eq!(idx.get(1), Some(IndexEntry { slot: 0, dirty: false, freq: 1, crc: 0 }));
        idx.insert(1, e(5, true));
        assert_eq!(idx.moves(), 1, "a new version elsewhere");
        assert!(idx.remove_if_slot(2, 1).is_some());
        assert_eq!(idx.moves(), 2);
        idx.remove(1);
        assert_eq!(idx.moves(), 3);
    }
}
