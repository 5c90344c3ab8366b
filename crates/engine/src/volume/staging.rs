//! Blocks written into RAM and not yet sealed into a record: the volume's volatile write
//! cache. Laid out as the record will be, so sealing is a header write and a buffer swap.

use crate::constants::{MAX_RECORD_BLOCKS, RECORD_ENTRIES};
use foldhash::{HashMap, HashMapExt};
use tiercache_device::AlignedBuf;
use tiercache_format::{EntryKind, RecordEntry};

/// Blocks written into RAM and not yet sealed into a record. Its buffer is laid out as the
/// record will be: block 0 for the header, then one block per data entry.
pub(super) struct Staging {
    pub(super) buf: AlignedBuf,
    /// Data entries in record order: (backing block, kind, crc).
    pub(super) data: Vec<(u64, EntryKind, u32)>,
    /// Backing block -> index into `data`.
    pub(super) map: HashMap<u64, usize>,
    pub(super) meta: Vec<RecordEntry>,
    /// Clock time of the first block staged (for the background writer's age limit).
    pub(super) first_staged_ns: Option<u64>,
    /// Most entries a record may hold: `RECORD_ENTRIES`, or less on a small log so that a
    /// record always fits in the space reclaim can free.
    pub(super) limit: usize,
}

impl Staging {
    pub(super) fn new(bs: usize, limit: usize) -> Staging {
        assert!((1..=RECORD_ENTRIES).contains(&limit));
        Staging {
            limit,
            // (In huge pages, as the record buffers it swaps with at each seal: `Volume::open`.)
            buf: AlignedBuf::new_huge(bs * MAX_RECORD_BLOCKS as usize),
            data: Vec::with_capacity(RECORD_ENTRIES),
            map: HashMap::with_capacity(RECORD_ENTRIES),
            meta: Vec::new(),
            first_staged_ns: None,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.data.is_empty() && self.meta.is_empty()
    }

    pub(super) fn entries(&self) -> usize {
        self.data.len() + self.meta.len()
    }

    pub(super) fn data_limit(&self) -> usize {
        Self::data_limit_of(self.limit)
    }

    /// Whether the data part is full (no block can be put, however much metadata room is left).
    pub(super) fn data_full(&self) -> bool {
        self.data.len() >= self.data_limit()
    }

    /// The data blocks a staging of `limit` entries takes (the rest is room for metadata).
    pub(super) fn data_limit_of(limit: usize) -> usize {
        (limit * 3 / 4).max(1)
    }

    pub(super) fn has_dirty(&self) -> bool {
        self.data.iter().any(|(_, k, _)| *k == EntryKind::DataDirty)
    }

    pub(super) fn block(&self, i: usize, bs: usize) -> &[u8] {
        &self.buf[(1 + i) * bs..(2 + i) * bs]
    }

    /// Stages a block (replacing a staged copy in place). False if there is no room.
    pub(super) fn put(&mut self, block: u64, kind: EntryKind, data: &[u8], crc: u32, now_ns: u64) -> bool {
        let bs = data.len();
        let i = match self.map.get(&block) {
            Some(&i) => {
                // A dirty write replaces a staged clean fill, never the other way round.
                if kind == EntryKind::DataDirty || self.data[i].1 == EntryKind::DataClean {
                    self.data[i] = (block, kind, crc);
                } else {
                    return true;
                }
                i
            }
            None => {
                // A quarter of each record is kept for metadata, so MarkClean entries are
                // never starved by a stream of writes.
                if self.entries() >= self.limit || self.data_full() {
                    return false;
                }
                self.data.push((block, kind, crc));
                self.map.insert(block, self.data.len() - 1);
                self.data.len() - 1
            }
        };
        self.buf[(1 + i) * bs..(2 + i) * bs].copy_from_slice(data);
        self.first_staged_ns.get_or_insert(now_ns);
        true
    }

    /// Drops a staged block (TRIM), moving the last data block into its place.
    pub(super) fn remove(&mut self, block: u64, bs: usize) -> bool {
        let Some(i) = self.map.remove(&block) else { return false };
        let last = self.data.len() - 1;
        if i != last {
            self.buf.copy_within((1 + last) * bs..(2 + last) * bs, (1 + i) * bs);
            self.data[i] = self.data[last];
            self.map.insert(self.data[i].0, i);
        }
        self.data.pop();
        true
    }
}
