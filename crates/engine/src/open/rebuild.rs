//! Pass 2 of recovery: the index and the lost set, from the checkpoint's entries and the
//! replayed records (docs/format.md 4.6, the "building the index" rows). Reads nothing: pass 1
//! (`scan`) read and checked every record it hands over.

use super::checkpoint::Checkpoint;
use super::scan::ScannedRecord;
use crate::index::{Index, IndexEntry};
use std::collections::BTreeMap;
use tiercache_format::{CheckpointHeader, EntryKind, Layout, RecordEntry};

/// Where the replayed chain ends, which writing resumes from: the last replayed record's
/// values, or the checkpoint's when nothing was replayed.
pub(super) struct ChainEnd {
    pub tail: u64,
    pub head: u64,
    pub epoch: u64,
    pub next_seq: u64,
    pub last_header_crc: u32,
}

impl ChainEnd {
    pub fn of(records: &[ScannedRecord], ck: &CheckpointHeader) -> ChainEnd {
        match records.last() {
            Some(r) => ChainEnd {
                tail: r.end(),
                head: r.header.head_position,
                epoch: r.header.epoch.max(ck.epoch),
                next_seq: r.header.sequence + 1,
                last_header_crc: r.checksum,
            },
            None => ChainEnd {
                tail: ck.log_position,
                head: ck.head_position,
                epoch: ck.epoch,
                next_seq: ck.next_record_sequence,
                last_header_crc: ck.prev_record_checksum,
            },
        }
    }
}

/// Lost blocks: backing block -> (the position of the copy that failed, `u64::MAX` for a
/// tombstone; the lost version's CRC).
pub(super) type LostSet = BTreeMap<u64, (u64, u32)>;

/// Builds the index and the lost set, keeping only blocks whose position is live in the final
/// `[head, tail)`: the checkpoint's entries first, then the replayed records' in order.
pub(super) fn rebuild_index(
    layout: &Layout,
    ck: &Checkpoint,
    records: &[ScannedRecord],
    end: &ChainEnd,
) -> (Index, LostSet) {
    let mut index = Index::with_capacity(layout.log_blocks as usize);
    let mut lost = LostSet::new();
    load_checkpoint(layout, ck, end, &mut index, &mut lost);
    let mut replay = Replay { layout, end, index: &mut index, lost: &mut lost };
    for record in records {
        replay.record(record);
    }
    (index, lost)
}

/// The checkpoint's entries. A checkpoint entry's position is taken relative to the
/// checkpoint (its slot may have been reused by the replayed tail, which a position relative
/// to the final tail would not show).
fn load_checkpoint(layout: &Layout, ck: &Checkpoint, end: &ChainEnd, index: &mut Index, lost: &mut LostSet) {
    let log_position = ck.header.log_position;
    for e in &ck.entries {
        if e.lost {
            // A tombstone does not keep the position: u64::MAX matches no MarkClean.
            lost.insert(e.backing_block, (u64::MAX, e.data_crc));
            continue;
        }
        let position = layout.position_of_slot(e.slot, log_position);
        let overwritten = layout.position_of_slot(e.slot, end.tail) >= log_position;
        if position >= end.head && !overwritten {
            index.insert(e.backing_block, IndexEntry { slot: e.slot, dirty: e.dirty, freq: 0, crc: e.data_crc });
        }
    }
}

/// Applies replayed records' entries to the index and the lost set.
struct Replay<'a> {
    layout: &'a Layout,
    end: &'a ChainEnd,
    index: &'a mut Index,
    lost: &'a mut LostSet,
}

impl Replay<'_> {
    fn record(&mut self, record: &ScannedRecord) {
        // Data entry k (counted among the data entries) sits at position + 1 + k.
        let mut k = 0usize;
        for e in &record.header.entries {
            match e.kind {
                EntryKind::DataDirty | EntryKind::DataClean => {
                    self.data(e, record.position + 1 + k as u64, record.damaged.contains(&k));
                    k += 1;
                }
                EntryKind::MarkClean => self.mark_clean(e),
                EntryKind::Trim => {
                    // Written after the block's new data reached the backing device, flushed
                    // (a write-around, format.md 4.10): no cached copy is current, and a loss
                    // of an older version is over.
                    self.index.remove(e.backing_block);
                    self.lost.remove(&e.backing_block);
                }
                EntryKind::Lost => {
                    // Never written after newer data of the block (see volume/mod.rs, `Lost`).
                    self.index.remove(e.backing_block);
                    self.lost.insert(e.backing_block, (e.ref_position, e.data_crc));
                }
            }
        }
    }

    /// A DataDirty or DataClean entry whose block is at `position`.
    fn data(&mut self, e: &RecordEntry, position: u64, damaged: bool) {
        if damaged {
            // Acknowledged data corrupted on the medium. A clean copy equals the backing
            // device's: forget it. A dirty one was the newest version.
            self.index.remove(e.backing_block);
            if e.kind == EntryKind::DataDirty {
                tracing::error!(block = e.backing_block, position, "replayed dirty block fails its checksum: lost");
                self.lost.insert(e.backing_block, (position, e.data_crc));
            }
            return;
        }
        if e.kind == EntryKind::DataDirty {
            self.lost.remove(&e.backing_block); // newer data ends a loss
        }
        if position >= self.end.head {
            let entry = IndexEntry {
                slot: self.layout.slot(position),
                dirty: e.kind == EntryKind::DataDirty,
                freq: 0,
                crc: e.data_crc,
            };
            self.index.insert(e.backing_block, entry);
        } else {
            // Reclaimed later in the replayed tail; any older copy is older still.
            self.index.remove(e.backing_block);
        }
    }

    fn mark_clean(&mut self, e: &RecordEntry) {
        // The backing device holds exactly the version a loss named: it is over.
        if self.lost.get(&e.backing_block).map(|l| l.0) == Some(e.ref_position) {
            self.lost.remove(&e.backing_block);
        }
        // By position, not slot: a newer copy may sit in the same slot a lap later.
        let current = self.index.get(e.backing_block).map(|c| self.layout.position_of_slot(c.slot, self.end.tail));
        if current == Some(e.ref_position) {
            self.index.mark_clean(e.backing_block, self.layout.slot(e.ref_position));
        }
    }
}
