//! The index: backing block -> where its newest cached copy lives, in 12 bytes per entry.
//!
//! An open-addressing hash table with linear probing and backward-shift deletion, sized once
//! for the most blocks the log can hold (at most 85 % full), so it never grows and never
//! allocates on the data path. About 14 bytes of RAM per cached block at full cache; the
//! kernel caches spend 1.3-2 % of the cache size (50-80 bytes per 4 KiB block).
//!
//! Written by hand rather than with `hashbrown`: its power-of-two capacity and control bytes
//! put it between 13 and 30 bytes per entry depending on where the size falls, and a compact
//! index is this product's own value (DESIGN.md).

use tiercache_format::constants::MAX_BACKING_BLOCKS;

/// The key marking an empty bucket.
const EMPTY: u32 = u32::MAX;
const _: () = assert!(MAX_BACKING_BLOCKS < EMPTY as u64);
const _: () = assert!(tiercache_format::constants::MAX_LOG_BLOCKS <= SLOT_MASK as u64 + 1);

/// Maximum load factor, as a fraction: 85 / 100.
const LOAD_NUM: u64 = 85;
const LOAD_DEN: u64 = 100;

const SLOT_MASK: u32 = (1 << 29) - 1;
const DIRTY_BIT: u32 = 1 << 31;
const REFERENCED_BIT: u32 = 1 << 30;

/// The largest log slot the index can name (2 TiB of cache at 4 KiB blocks).
pub const MAX_INDEX_SLOT: u32 = SLOT_MASK;

/// Where a backing block's newest cached copy lives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexEntry {
    /// The log slot holding the data.
    pub slot: u32,
    /// Newer than the backing device's copy.
    pub dirty: bool,
    /// Read since it was cached (for eviction decisions).
    pub referenced: bool,
    /// CRC-32C of the data, checked on every read from the cache device.
    pub crc: u32,
}

#[derive(Debug, Clone, Copy)]
#[repr(C)]
struct Bucket {
    key: u32,
    /// slot | DIRTY_BIT | REFERENCED_BIT
    value: u32,
    crc: u32,
}

const _: () = assert!(std::mem::size_of::<Bucket>() == 12);

impl Bucket {
    const VACANT: Bucket = Bucket { key: EMPTY, value: 0, crc: 0 };

    fn entry(&self) -> IndexEntry {
        IndexEntry {
            slot: self.value & SLOT_MASK,
            dirty: self.value & DIRTY_BIT != 0,
            referenced: self.value & REFERENCED_BIT != 0,
            crc: self.crc,
        }
    }

    fn set(&mut self, key: u32, e: IndexEntry) {
        assert!(e.slot <= SLOT_MASK, "slot {} too large", e.slot);
        self.key = key;
        self.value = e.slot | if e.dirty { DIRTY_BIT } else { 0 } | if e.referenced { REFERENCED_BIT } else { 0 };
        self.crc = e.crc;
    }
}

/// The index. Not synchronised: the volume keeps it under its state lock.
pub struct Index {
    buckets: Box<[Bucket]>,
    len: usize,
    dirty: usize,
    max_entries: usize,
}

impl Index {
    /// An index able to hold `max_entries` (the log's block count).
    pub fn with_capacity(max_entries: usize) -> Index {
        let buckets = (max_entries as u64 * LOAD_DEN).div_ceil(LOAD_NUM).max(max_entries as u64 + 1);
        let buckets = usize::try_from(buckets).expect("index fits memory");
        Index { buckets: vec![Bucket::VACANT; buckets].into_boxed_slice(), len: 0, dirty: 0, max_entries }
    }

    pub fn len(&self) -> usize {
        self.len
    }

    /// Entries that are dirty.
    pub fn dirty_len(&self) -> usize {
        self.dirty
    }

    /// RAM used by the table itself.
    pub fn memory_bytes(&self) -> usize {
        self.buckets.len() * std::mem::size_of::<Bucket>()
    }

    /// RAM per block when the cache is full (what `status` reports).
    pub fn bytes_per_cached_block(&self) -> f64 {
        self.memory_bytes() as f64 / self.max_entries.max(1) as f64
    }

    fn home(&self, key: u32) -> usize {
        // Fibonacci hashing, then a multiply-shift range reduction (no power-of-two size).
        let h = u64::from(key.wrapping_mul(0x9E37_79B1));
        ((h * self.buckets.len() as u64) >> 32) as usize
    }

    fn find(&self, key: u32) -> Option<usize> {
        let n = self.buckets.len();
        let mut i = self.home(key);
        loop {
            let k = self.buckets[i].key;
            if k == key {
                return Some(i);
            }
            if k == EMPTY {
                return None;
            }
            i += 1;
            if i == n {
                i = 0;
            }
        }
    }

    fn key(block: u64) -> u32 {
        assert!(block <= MAX_BACKING_BLOCKS, "backing block {block} beyond the index's range");
        block as u32
    }

    pub fn get(&self, block: u64) -> Option<IndexEntry> {
        self.find(Self::key(block)).map(|i| self.buckets[i].entry())
    }

    /// Sets the referenced bit of a present entry.
    pub fn touch(&mut self, block: u64) {
        if let Some(i) = self.find(Self::key(block)) {
            self.buckets[i].value |= REFERENCED_BIT;
        }
    }

    /// Inserts or replaces; returns the previous entry.
    pub fn insert(&mut self, block: u64, e: IndexEntry) -> Option<IndexEntry> {
        let key = Self::key(block);
        let n = self.buckets.len();
        let mut i = self.home(key);
        loop {
            let k = self.buckets[i].key;
            if k == key {
                let old = self.buckets[i].entry();
                self.dirty = self.dirty - usize::from(old.dirty) + usize::from(e.dirty);
                self.buckets[i].set(key, e);
                return Some(old);
            }
            if k == EMPTY {
                assert!(self.len < self.max_entries, "index over capacity ({} entries)", self.max_entries);
                self.buckets[i].set(key, e);
                self.len += 1;
                self.dirty += usize::from(e.dirty);
                return None;
            }
            i += 1;
            if i == n {
                i = 0;
            }
        }
    }

    /// Marks a present entry clean if it still names `slot`; returns whether it did.
    pub fn mark_clean(&mut self, block: u64, slot: u32) -> bool {
        match self.find(Self::key(block)) {
            Some(i) if self.buckets[i].entry().slot == slot && self.buckets[i].entry().dirty => {
                self.buckets[i].value &= !DIRTY_BIT;
                self.dirty -= 1;
                true
            }
            _ => false,
        }
    }

    /// Removes an entry; returns it.
    pub fn remove(&mut self, block: u64) -> Option<IndexEntry> {
        let mut hole = self.find(Self::key(block))?;
        let old = self.buckets[hole].entry();
        self.len -= 1;
        self.dirty -= usize::from(old.dirty);
        // Backward-shift deletion: move later members of the probe run into the hole so
        // that lookups never stop early (no tombstones, no rehashing).
        let n = self.buckets.len();
        let mut j = hole;
        loop {
            j = if j + 1 == n { 0 } else { j + 1 };
            let k = self.buckets[j].key;
            if k == EMPTY {
                break;
            }
            let home = self.home(k);
            // Can bucket j's entry move to `hole`? Only if its home is not cyclically in (hole, j].
            let in_range = if hole <= j { home > hole && home <= j } else { home > hole || home <= j };
            if !in_range {
                self.buckets[hole] = self.buckets[j];
                hole = j;
            }
        }
        self.buckets[hole] = Bucket::VACANT;
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
        self.buckets.iter().filter(|b| b.key != EMPTY).map(|b| (u64::from(b.key), b.entry()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};
    use std::collections::HashMap;

    fn e(slot: u32, dirty: bool) -> IndexEntry {
        IndexEntry { slot, dirty, referenced: false, crc: slot.wrapping_mul(7) }
    }

    #[test]
    fn behaves_like_a_hashmap_under_random_operations() {
        for seed in 0..20 {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
            let cap = rng.gen_range(1..500);
            let mut idx = Index::with_capacity(cap);
            let mut model: HashMap<u64, IndexEntry> = HashMap::new();
            for _ in 0..5000 {
                let key = rng.gen_range(0..cap as u64 * 2);
                match rng.gen_range(0..4) {
                    0 | 1 if model.len() < cap || model.contains_key(&key) => {
                        let v = e(rng.gen_range(0..1000), rng.gen_bool(0.5));
                        assert_eq!(idx.insert(key, v), model.insert(key, v));
                    }
                    2 => assert_eq!(idx.remove(key), model.remove(&key)),
                    _ => {
                        let slot = rng.gen_range(0..1000);
                        let expect = matches!(model.get(&key), Some(x) if x.slot == slot && x.dirty);
                        assert_eq!(idx.mark_clean(key, slot), expect);
                        if expect {
                            model.get_mut(&key).unwrap().dirty = false;
                        }
                    }
                }
                assert_eq!(idx.len(), model.len());
                assert_eq!(idx.dirty_len(), model.values().filter(|v| v.dirty).count());
            }
            for (k, v) in &model {
                assert_eq!(idx.get(*k), Some(*v), "seed {seed} key {k}");
            }
            assert_eq!(idx.iter().count(), model.len());
        }
    }

    #[test]
    fn full_table_keeps_every_entry_reachable() {
        let cap = 10_000;
        let mut idx = Index::with_capacity(cap);
        for k in 0..cap as u64 {
            idx.insert(k * 7919, e(k as u32, false));
        }
        for k in (0..cap as u64).step_by(3) {
            idx.remove(k * 7919);
        }
        for k in 0..cap as u64 {
            assert_eq!(idx.get(k * 7919).is_some(), k % 3 != 0, "key {k}");
        }
    }

    #[test]
    fn ram_per_cached_block_is_under_16_bytes() {
        for cap in [1000, 262_144, 1_000_003] {
            let idx = Index::with_capacity(cap);
            assert!(idx.bytes_per_cached_block() <= 14.2, "{cap}: {}", idx.bytes_per_cached_block());
        }
    }

    #[test]
    fn referenced_bit_is_kept_apart_from_the_slot() {
        let mut idx = Index::with_capacity(4);
        idx.insert(3, e(MAX_INDEX_SLOT, true));
        idx.touch(3);
        let got = idx.get(3).unwrap();
        assert_eq!((got.slot, got.dirty, got.referenced), (MAX_INDEX_SLOT, true, true));
    }
}
