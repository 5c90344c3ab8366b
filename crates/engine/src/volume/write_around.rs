//! Write-around: a large write while the cache holds more dirty data than its high watermark
//! goes straight to the backing device instead of into the log (docs/format.md §4.10). Such a
//! writer would otherwise wait for write-back anyway (the cache is destage-bound); going
//! around, its data crosses the backing device once instead of cache write + cache read +
//! backing write, so a stream larger than the cache runs at the backing device's speed.
//!
//! The cached copies of the blocks written around become stale. They leave RAM at once
//! (index, staging, the record in flight; fills are cancelled), but on the medium they stay
//! until something durable says otherwise, and the order of that matters:
//! - The backing write is not durable until a backing flush. Until then nothing may make the
//!   drop of an older copy durable: no checkpoint (it omits the block), no reclaim record
//!   moving the head past the copy, no Trim entry. A crash would otherwise lose the older
//!   copy (perhaps acknowledged by a FLUSH) while the backing device drops the new data,
//!   and the block would read a version older than both. So checkpoint, reclaim and FLUSH
//!   first flush the backing device when a write-around is not yet flushed (`settle`).
//! - After that flush a Trim entry for each block must reach the log before FLUSH returns,
//!   or recovery would replay the older copy over the new data. A Trim is staged only after
//!   the flush that covers its block, and never for a block written through the cache since
//!   (its newer record supersedes the older copy on replay, and a Trim sealed after it would
//!   drop it): a write through the cache marks the block superseded.
//! - A block not yet flushed is not admitted as clean from the backing device (clean means
//!   the backing device durably holds it).
//! - The destage lock is held across the backing write, so no write-back batch can write an
//!   older version of a block over it.
//!
//! Not written around: requests smaller than the policy's minimum, lost blocks (their loss
//! must end through a record), and the backing device's fingerprint blocks (their update goes
//! through the superblock's two phases, 4.3).

use super::*;

/// When writes go around the cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WriteAroundPolicy {
    /// Writes of at least this many bytes may go around (0: never).
    pub min_bytes: u64,
    /// Only while the cache holds more dirty data than its high watermark (the default);
    /// `false` writes around whenever the size allows (the simulator's setting, to make the
    /// path common).
    pub only_when_destage_bound: bool,
}

impl Default for WriteAroundPolicy {
    fn default() -> Self {
        WriteAroundPolicy { min_bytes: WRITE_AROUND_MIN_BYTES, only_when_destage_bound: true }
    }
}

/// What the write-arounds still owe.
#[derive(Debug, Default)]
pub(super) struct Around {
    /// Blocks written around since the last backing flush: block -> (generation of the
    /// write, written through the cache since).
    unflushed: HashMap<u64, (u64, bool)>,
    /// Counts write-arounds; `flushed_gen` is the last one a backing flush covers.
    gen: u64,
    flushed_gen: u64,
    /// Blocks whose write-around is flushed on the backing device and whose Trim entry is not
    /// yet staged.
    untrimmed: BTreeSet<u64>,
    /// Blocks whose copy left the index without a record saying so (a clean copy evicted by
    /// reclaim before its record is durable, or dropped by TRIM; a rotted dirty copy whose
    /// version the backing device holds), by the copy's log position: recovery may bring the
    /// copy back until the head passes that position. Such a block is not written around:
    /// the copy, back as clean (or checked against the backing device), would shadow the new
    /// data on the backing device.
    resurrectable: HashMap<u64, u64>,
    /// Blocks whose write-around is under way (not admitted meanwhile: a fill could read the
    /// backing device half-written).
    writing: HashSet<u64>,
    /// Blocks a write-back batch is writing to the backing device (from its verification
    /// to its mark-clean): not written around meanwhile.
    pub(super) in_batch: HashSet<u64>,
    /// Clock time of the last write-around.
    last_ns: Option<u64>,
}

impl Around {
    /// A write through the cache staged `block`: its record supersedes any older copy on
    /// replay, so no Trim may follow it.
    pub(super) fn written_through(&mut self, block: u64) {
        if let Some(u) = self.unflushed.get_mut(&block) {
            u.1 = true;
        }
        self.untrimmed.remove(&block);
    }

    /// Whether a write-back batch may write `block` now (not while it is written around).
    pub(super) fn batch_may_write(&self, block: u64) -> bool {
        !self.writing.contains(&block)
    }

    /// Whether `block` may be admitted as clean from the backing device.
    pub(super) fn admissible(&self, block: u64) -> bool {
        !self.unflushed.contains_key(&block) && !self.writing.contains(&block)
    }

    /// `block`'s copy at `position` left the index without a record.
    pub(super) fn dropped_without_record(&mut self, block: u64, position: u64) {
        let p = self.resurrectable.entry(block).or_insert(position);
        *p = (*p).max(position);
    }

    /// The head moved to `head` (durably): copies before it are never replayed again.
    pub(super) fn head_moved(&mut self, head: u64) {
        self.resurrectable.retain(|_, &mut position| position >= head);
    }
}

impl Volume {
    /// Writes whole blocks around the cache if the policy and the blocks allow; returns
    /// whether it did (otherwise the caller writes through the cache).
    pub(super) fn try_write_around(&self, offset: u64, data: &[u8]) -> Result<bool> {
        let policy = self.options.write_around;
        if policy.min_bytes == 0 || (data.len() as u64) < policy.min_bytes {
            return Ok(false);
        }
        // A crash may tear a write in flight; written through the cache, a block is whole
        // either way (the log's copy, or the backing copy once flushed), but written around
        // it is only as whole as the backing device makes it.
        if self.backing.atomic_write_bytes() < self.layout.block_size {
            return Ok(false);
        }
        let first = offset / self.bs as u64;
        let n = (data.len() / self.bs) as u64;
        let fingerprints = self.superblock().fingerprint_blocks();
        if fingerprints.iter().any(|b| (first..first + n).contains(b)) {
            return Ok(false);
        }
        let _around = self.lock_around();
        {
            let mut st = self.lock();
            st.check_poisoned()?;
            // Above the high watermark, or draining towards the low one after it.
            let destage_bound = st.destaging || st.index.dirty_len() as u64 > self.dirty_high_blocks;
            if (policy.only_when_destage_bound && !destage_bound) || st.lost.range(first..first + n).next().is_some() {
                return Ok(false);
            }
            // A clean copy on the log (indexed, in the record being written, or dropped
            // without a record) would come back after a crash as "the backing device's
            // content" while the backing device holds the new data: only a dirty copy (which
            // the Trim, after the backing flush, ends) or none at all may be written around.
            let clean_copy = |b: u64| {
                st.index.get(b).is_some_and(|e| !e.dirty)
                    || st.around.resurrectable.contains_key(&b)
                    || st
                        .inflight
                        .as_ref()
                        .is_some_and(|f| f.map.get(&b).is_some_and(|&k| f.data[k].1 == EntryKind::DataClean))
            };
            // A write-back batch writing one of these blocks (`in_batch`) could land its
            // older version after ours: write through the cache instead of waiting for it.
            if (first..first + n).any(|b| clean_copy(b) || st.around.in_batch.contains(&b)) {
                return Ok(false);
            }
            // No clean copy may reach the log meanwhile: staged ones go (never sealed), fills
            // in flight are cancelled, new ones are refused (`admissible`).
            for block in first..first + n {
                st.cancel_fill(block);
                if st.staging.map.get(&block).is_some_and(|&k| st.staging.data[k].1 == EntryKind::DataClean) {
                    st.staging.remove(block, self.bs);
                }
                st.around.writing.insert(block);
            }
        }
        let written = self.backing.write_at(offset, data).map_err(EngineError::backing);
        let mut st = self.lock();
        for block in first..first + n {
            st.around.writing.remove(&block);
        }
        written?;
        st.around.gen += 1;
        let gen = st.around.gen;
        for block in first..first + n {
            st.cancel_fill(block);
            st.staging.remove(block, self.bs);
            if let Some(f) = st.inflight.as_mut() {
                // Not indexed when its record is written (`install_record` indexes only what
                // the map still names); its copy on the medium is what the Trim is for.
                f.map.remove(&block);
            }
            st.index.remove(block);
            st.around.untrimmed.remove(&block);
            st.around.unflushed.insert(block, (gen, false));
        }
        st.counters.written_around_blocks += n;
        st.around.last_ns = Some(self.clock.now_ns());
        st.counters.written_blocks += n;
        st.counters.write_requests += 1;
        Ok(true)
    }

    /// Whether writes are going around (one in the last `WRITE_AROUND_YIELD_MS`) while the
    /// log still has room (dirty data under `WRITE_AROUND_YIELD_MAX_PERMILLE` of it): then
    /// the background write-back above the high watermark yields the backing device to them.
    /// Reclaim still writes back what a writer through the cache needs.
    pub(super) fn write_around_has_the_backing_device(&self) -> bool {
        let st = self.lock();
        let recent = st
            .around
            .last_ns
            .is_some_and(|t| self.clock.now_ns().saturating_sub(t) < WRITE_AROUND_YIELD_MS * 1_000_000);
        let room = (st.index.dirty_len() as u64) * 1000 < self.layout.log_blocks * WRITE_AROUND_YIELD_MAX_PERMILLE;
        recent && room
    }

    /// Makes every write-around so far durable on the backing device (a backing flush, if
    /// one is owed), so that checkpoints, reclaim records and Trim entries may record the
    /// drop of older copies. Returns whether Trim entries are owed (`untrimmed`).
    pub(super) fn settle_write_around(&self) -> Result<bool> {
        let gen = {
            let st = self.lock();
            if st.around.gen == st.around.flushed_gen {
                return Ok(!st.around.untrimmed.is_empty());
            }
            st.around.gen
        };
        if !sabotaged!(self, WriteAroundSkipsBackingFlush) {
            self.backing.flush().map_err(EngineError::backing)?;
        }
        let mut st = self.lock();
        st.counters.backing_flushes += 1;
        st.around.flushed_gen = st.around.flushed_gen.max(gen);
        let flushed: Vec<(u64, bool)> = st
            .around
            .unflushed
            .iter()
            .filter(|(_, &(g, _))| g <= gen)
            .map(|(&block, &(_, superseded))| (block, superseded))
            .collect();
        for (block, superseded) in flushed {
            st.around.unflushed.remove(&block);
            if !superseded {
                st.around.untrimmed.insert(block);
            }
        }
        Ok(!st.around.untrimmed.is_empty())
    }

    /// FLUSH's part (io lock held): settles the write-arounds, then puts a Trim entry for
    /// every block that owes one into staging (metadata goes first in a record, so a write
    /// through the cache staged after it lands after it), writing records out as staging
    /// fills. Returns whether any Trim was staged (then FLUSH must write and flush a record
    /// even if its own writes are durable already).
    pub(super) fn stage_write_around_trims(&self, io: &mut IoBuffers) -> Result<bool> {
        if !self.settle_write_around()? {
            return Ok(false);
        }
        loop {
            let full = {
                let mut st = self.lock();
                let State { staging, around, .. } = &mut *st;
                while staging.entries() < staging.limit {
                    let Some(block) = around.untrimmed.pop_first() else { break };
                    staging.meta.push(RecordEntry {
                        kind: EntryKind::Trim,
                        backing_block: block,
                        data_crc: 0,
                        ref_position: 0,
                    });
                }
                !around.untrimmed.is_empty()
            };
            if !full {
                return Ok(true);
            }
            self.write_out(io)?;
        }
    }
}
