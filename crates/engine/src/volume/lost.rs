//! Lost blocks: a dirty copy that fails its checksum is the only copy of its data, so the
//! block reads as an I/O error until rewritten, durably across crashes and restarts
//! (docs/format.md §4.8) — unless the backing device turns out to hold that very version
//! (a write-back whose MarkClean a crash dropped), and then the copy is simply forgotten.

use super::*;

impl Volume {
    /// Ends the losses the backing device turns out to hold (open calls it, with the backing
    /// device attached): a lost version that a write-back had already put there.
    pub(crate) fn recheck_lost_against_backing(&self) {
        let candidates: Vec<(u64, u32)> = self.lock().lost.iter().map(|(&b, l)| (b, l.crc)).collect();
        let mut buf = AlignedBuf::new(self.bs);
        for (block, crc) in candidates {
            if self.backing_holds(block, crc, &mut buf) {
                tracing::warn!(block, "a lost block's version is on the backing device: readable again");
                self.lock().lost.remove(&block);
            }
        }
    }

    /// Puts the Lost entries not yet logged into the staging record being sealed (metadata
    /// goes first in a record). A block with data in this same record, or in one sealed
    /// before it and still in flight, is skipped: that data supersedes the loss, and its entry
    /// leaves `lost` when the record is written.
    pub(super) fn stage_lost_entries(&self, st: &mut State) {
        if sabotaged!(self, LostInRamOnly) || st.lost.values().all(|l| l.logged != Logged::No) {
            return;
        }
        let State { lost, staging, inflight, .. } = st;
        for (&block, l) in lost.iter_mut() {
            if staging.entries() >= staging.limit {
                break;
            }
            // (Or in a record sealed before this one whose write is still in progress: this
            // record follows it in the log, and a Lost entry after newer data would bring
            // the loss back on replay.)
            let superseded = staging.map.get(&block).is_some_and(|&i| staging.data[i].1 == EntryKind::DataDirty)
                || inflight.iter().any(|r| r.map.get(&block).is_some_and(|&i| r.data[i].1 == EntryKind::DataDirty));
            if l.logged != Logged::No || superseded {
                continue;
            }
            staging.meta.push(RecordEntry {
                kind: EntryKind::Lost,
                backing_block: block,
                data_crc: l.crc,
                ref_position: l.position,
            });
            l.logged = Logged::Staged;
        }
    }

    /// Declares the copy of `block` at `position` lost: its checksum failed and it was the
    /// only copy of dirty data. The caller checked, under this same lock, that the index
    /// still names that position and that no newer data of the block is in flight. The
    /// block reads as an I/O error until rewritten (unless staging already holds newer data).
    pub(super) fn declare_lost(&self, st: &mut State, block: u64, position: u64, crc: u32) {
        debug_assert!(!st.is_in_flight(block));
        st.index.remove(block);
        st.cancel_fill(block);
        tracing::error!(block, position, "dirty block failed its checksum on the cache device: lost");
        st.lost.insert(block, Lost { position, crc, logged: Logged::No });
        let limit = Layout::max_lost_blocks_for(self.layout.log_blocks) as usize;
        if st.lost.len() > limit {
            st.poison(format!("more than {limit} blocks lost to checksum failures: the cache device is failing"));
        }
    }

    /// Whether the backing device durably holds exactly the version with CRC `crc` of
    /// `block` (then a dirty copy that fails its checksum is not a loss: it was written back,
    /// and a crash dropped the MarkClean entry that said so). A read sees the backing
    /// device's volatile cache too: the version read may be a write-back still waiting for
    /// its backing flush, which a crash would drop, so a match is flushed before it counts
    /// (the copy is forgotten on the strength of it). Reads into `buf`.
    ///
    /// Callers that act on the answer hold the destage lock from this check until they have
    /// acted: otherwise a write-back batch that took an older version of the block could
    /// write it after the check (a rewrite with the backing device's own content, zeroes
    /// say, makes the check succeed), and the forgotten block would read the older data.
    pub(super) fn backing_holds(&self, block: u64, crc: u32, buf: &mut [u8]) -> bool {
        self.backing.read_at(block * self.bs as u64, buf).is_ok()
            && checksum(buf) == crc
            && self.backing.flush().is_ok()
    }

    /// A dirty copy failed its checksum but the backing device holds that very version:
    /// forget the copy (reads go to the backing device). No record is needed: after a crash
    /// the copy is found bad and checked against the backing device again.
    pub(super) fn repaired_from_backing(&self, st: &mut State, block: u64, position: u64) {
        st.index.remove(block);
        st.around.dropped_without_record(block, position);
        st.counters.repaired_blocks += 1;
        tracing::warn!(block, position, "dirty block failed its checksum but the backing device holds that version");
    }

    /// Settles a dirty copy of `p.block` that failed its checksum, once the caller has checked
    /// (under this same lock) that the index still names exactly that copy: repaired if the
    /// backing device holds that version (`on_backing`, from `backing_holds`), else lost.
    pub(super) fn settle_bad_dirty_copy(&self, st: &mut State, p: Picked, on_backing: bool) {
        if on_backing {
            self.repaired_from_backing(st, p.block, p.position);
        } else {
            self.declare_lost(st, p.block, p.position, p.entry.crc);
        }
    }

    pub fn lost_blocks(&self) -> Vec<u64> {
        self.lock().lost.keys().copied().collect()
    }
}
