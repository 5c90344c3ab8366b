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
//! - After that flush a Trim entry for each block that had a copy on the log must reach the
//!   log before FLUSH returns, or recovery would replay the older copy over the new data. A
//!   Trim is staged only after the flush that covers its block, or together with newer data
//!   of the block written through the cache (same record, metadata first: the data
//!   supersedes the older copy either way, and a Trim in a later record would drop it).
//! - No clean copy is admitted while a write-around is unflushed (clean means the backing
//!   device durably holds it).
//! - Write-arounds run concurrently, but none is under way while the destage lock is held
//!   by anyone else (`lock_destage` waits for them), so no write-back batch can write an
//!   older version of a block over it, and no reader can declare it lost meanwhile. The one
//!   exception: beside a write-back batch, which publishes its blocks (`Around::batch`), a
//!   write-around of blocks with no copy in the cache and none of the batch's may begin
//!   without the destage lock (the batch cannot write those; the next holder of the lock
//!   waits for it as for any other).
//! - A failed settle (backing flush) poisons the volume: the written-around data has no other
//!   copy, and a retried flush could report durable what the failed one dropped.
//!
//! Not written around (format.md 4.10): requests smaller than the policy's minimum, blocks
//! with a clean copy on the log or a copy not yet durable, lost blocks, the backing device's
//! fingerprint blocks, and anything on a backing device that may tear a block.

use super::*;

/// Log positions `dirty_head_in_the_way` looks at per call at most (index lookups under the
/// state lock: 32,768 of them in one hold stalled I/O 2-7 ms, `reclaim_window`).
const DENSE_DIRTY_SCAN_BLOCKS: u64 = 4096;

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

/// Blocks written so far through the log (every block written, less those written around).
fn through_log_blocks(st: &State) -> u64 {
    st.counters.written_blocks - st.counters.written_around_blocks
}

/// Why the shipped policy sends a write around (`goes_around_now`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Why {
    DestageBound,
    DirtyHead,
}

/// What the write-arounds still owe.
#[derive(Debug, Default)]
pub(super) struct Around {
    /// Blocks written around, since the last backing flush, whose older copy is on the log:
    /// block -> generation of the write.
    unflushed: HashMap<u64, u64>,
    /// Counts write-arounds; `flushed_gen` is the last one a backing flush covers.
    gen: u64,
    flushed_gen: u64,
    /// Blocks whose write-around is flushed on the backing device and whose Trim entry is not
    /// yet staged.
    untrimmed: BTreeSet<u64>,
    /// Blocks whose copy left the index without a record saying so (a clean copy evicted by
    /// reclaim before its record is durable, dropped by TRIM, or found bad by a read; a rotted dirty copy whose
    /// version the backing device holds), by the copy's log position: recovery may bring the
    /// copy back until the head passes that position. Such a block is not written around:
    /// the copy, back as clean (or checked against the backing device), would shadow the new
    /// data on the backing device.
    resurrectable: HashMap<u64, u64>,
    /// Blocks whose write-around is under way.
    writing: HashSet<u64>,
    /// The write-arounds under way (they run concurrently), their blocks, each with the lock its writer
    /// holds across the backing write: the around lock's and the destage lock's holders wait
    /// on them (`lock_around`, `lock_destage`), and none begins while either is held.
    pub(super) under_way: Vec<(u64, std::ops::Range<u64>, Arc<Mutex<()>>)>,
    next_id: u64,
    /// Blocks whose staged Trim came with a rewrite through the cache before their
    /// write-around was flushed: that Trim is safe only in the same record as the rewrite's
    /// data. (A Trim staged after the settle is safe on its own.) Cleared when staging is
    /// sealed.
    pub(super) trim_with_data: HashSet<u64>,
    /// The blocks of the write-back batch under way (sorted), published by the batch
    /// (`destage_blocks`) while it holds the destage lock: a write-around of blocks with no
    /// copy in the cache and none of these may begin beside it (`begin_write_around`).
    pub(super) batch: Option<Vec<u64>>,
    /// Clock time of the last write-around.
    last_ns: Option<u64>,
    /// Clock time of the last write-around begun because of dirty data at the head, and the
    /// blocks written through the log by then (`through_log_blocks`).
    dirty_head_ns: Option<u64>,
    dirty_head_through_log: u64,
}

impl Around {
    /// Whether a write through the cache of `block` must carry a Trim (an older copy on the
    /// log that a write-around left owed).
    pub(super) fn owes_trim(&self, block: u64) -> bool {
        self.unflushed.contains_key(&block) || self.untrimmed.contains(&block)
    }

    /// The Trim of `block` is staged with newer data of it: nothing more is owed.
    pub(super) fn trim_staged(&mut self, block: u64) {
        if self.unflushed.remove(&block).is_some() {
            self.trim_with_data.insert(block);
        }
        self.untrimmed.remove(&block);
    }

    /// Whether `block` may be admitted as clean from the backing device: not while any
    /// write-around is unflushed (its data on the backing device may still vanish).
    /// A write-around is not yet flushed (so no clean copy may be admitted until a settle).
    pub(super) fn owes_a_settle(&self) -> bool {
        self.gen != self.flushed_gen
    }

    pub(super) fn admissible(&self, block: u64) -> bool {
        self.gen == self.flushed_gen && !self.writing.contains(&block)
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

/// What `begin_write_around` decided.
enum Begin {
    /// Under way: its id and its lock (see `Around::under_way`).
    Begun((u64, Arc<Mutex<()>>)),
    /// Through the cache instead.
    Refused,
    /// Asked beside the destage lock's holder, which is not a write-back batch that lets
    /// these blocks go around beside it: ask again with the lock (`eligible`: the blocks have
    /// no copy in the cache, so they may once the holder publishes its batch).
    NotBeside { eligible: bool },
    /// Some of the blocks are being written around already: wait for that write-around (its
    /// lock), then ask again.
    Overlaps(Arc<Mutex<()>>),
}

/// A Trim entry for `block`.
pub(super) fn trim_entry(block: u64) -> RecordEntry {
    RecordEntry { kind: EntryKind::Trim, backing_block: block, data_crc: 0, ref_position: 0 }
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
        let blocks = first..first + (data.len() / self.bs) as u64;
        // (A first look without the write-around and destage locks: a writer that will not
        // go around must not wait for a write-back batch to find out.)
        if policy.only_when_destage_bound && self.goes_around_now(&mut self.lock(), blocks.clone()).is_none() {
            return Ok(false);
        }
        if self.fingerprint_blocks.iter().any(|b| blocks.contains(b)) {
            return Ok(false);
        }
        // Begins under the around and destage locks (taken without waiting for the
        // write-arounds under way: they run concurrently), which it lets go once it holds its
        // own lock: no settle, write-back batch or reader's loss check runs until it ends
        // (see the header). Or, while a write-back batch holds the destage lock, beside it
        // if the blocks have no copy in the cache and are not in the batch: a batch takes
        // tens of milliseconds, and a write-around queued behind it held every writer whose
        // reclaim settles the write-arounds behind it too (issue 13's dirty-head case).
        let (id, own);
        let under_way;
        let mut beside = true;
        let mut pause_us = 50;
        loop {
            let _around = self.lock_around_to_begin();
            let _destage = if beside { self.try_lock_destage_to_begin() } else { Some(self.lock_destage_to_begin()) };
            match self.begin_write_around(blocks.clone(), policy, _destage.is_none())? {
                Begin::Begun(begun) => (id, own) = begun,
                Begin::Refused => return Ok(false),
                Begin::NotBeside { eligible } => {
                    drop((_destage, _around));
                    if eligible {
                        // (The holder may be a batch about to publish its blocks, or one
                        // waiting for the write-arounds under way: a moment, then again, the
                        // pause doubling to a millisecond, so that 16 writers polling beside
                        // a long holder, such as the elevator's scan, do not take a core.)
                        pause_before_asking_again(pause_us);
                        pause_us = (pause_us * 2).min(1000);
                    } else {
                        beside = false;
                    }
                    continue;
                }
                Begin::Overlaps(earlier) => {
                    // Overlapping write-arounds run one after the other, in the order they
                    // began (the later one's data wins, as it would on a disk); others go on.
                    drop((_destage, _around));
                    drop(self.lock_write_around_write(&earlier));
                    continue;
                }
            }
            // (Taken before the two locks go: a waiter never finds it free before the end.)
            under_way = self.lock_write_around_write(&own);
            break;
        }
        let written = self.backing.write_at(offset, data).map_err(EngineError::backing);
        let mut st = self.lock();
        for block in blocks.clone() {
            st.around.writing.remove(&block);
        }
        st.around.under_way.retain(|(k, _, _)| *k != id);
        let ended = written.map(|()| self.end_write_around(&mut st, blocks));
        drop(st);
        drop(under_way);
        ended.map(|()| true)
    }

    /// Under the state lock: whether `blocks` may be written around now, and if so, marks
    /// them `writing` (no clean copy of them may reach the log meanwhile: staged ones go,
    /// never sealed; fills in flight are cancelled; new ones are refused) and registers the
    /// write-around as under way: returns its id and its lock (not yet taken: the caller
    /// takes it before letting the around and destage locks go, so no waiter sees it free).
    /// `beside`: asked without the destage lock, which another thread holds (see
    /// `Around::batch`).
    fn begin_write_around(
        &self,
        blocks: std::ops::Range<u64>,
        policy: WriteAroundPolicy,
        beside: bool,
    ) -> Result<Begin> {
        let mut st = self.lock();
        st.check_poisoned()?;
        let reason = if policy.only_when_destage_bound {
            match self.goes_around_now(&mut st, blocks.clone()) {
                Some(reason) => Some(reason),
                None => return Ok(Begin::Refused),
            }
        } else {
            None
        };
        if let Some((_, _, earlier)) =
            st.around.under_way.iter().find(|(_, r, _)| r.start < blocks.end && blocks.start < r.end)
        {
            return Ok(Begin::Overlaps(Arc::clone(earlier)));
        }
        if blocks.clone().any(|b| !self.may_write_around(&st, b)) {
            return Ok(Begin::Refused);
        }
        if beside {
            // Beside a write-back batch only blocks it cannot hold: none with a copy in the
            // cache (a later batch, which waits for this write-around, may take a copy
            // written meanwhile), and none of its own (a copy it picked that has left the
            // index since, declared lost or repaired, is still being written by the batch;
            // `may_write_around` refuses those too, and this keeps the rule local).
            let eligible = blocks.clone().all(|b| st.index.get(b).is_none() && !st.staging.map.contains_key(&b));
            let in_batch =
                st.around.batch.as_ref().map(|batch| blocks.clone().any(|b| batch.binary_search(&b).is_ok()));
            if in_batch != Some(false) || !eligible {
                return Ok(Begin::NotBeside { eligible: eligible && in_batch.is_none() });
            }
            st.counters.written_around_beside_write_back += 1;
        }
        for block in blocks.clone() {
            st.cancel_fill(block);
            if st.staging.map.get(&block).is_some_and(|&k| st.staging.data[k].1 == EntryKind::DataClean) {
                st.staging.remove(block, self.bs);
                st.hot_on_install.remove(&block);
                st.hot_on_install.remove(&block);
            }
            st.around.writing.insert(block);
        }
        if reason == Some(Why::DirtyHead) {
            st.counters.written_around_at_dirty_head += 1;
            st.around.dirty_head_ns = Some(self.clock.now_ns());
            st.around.dirty_head_through_log = through_log_blocks(&st);
        }
        st.around.next_id += 1;
        if !st.around.under_way.is_empty() {
            st.counters.concurrent_write_arounds += 1;
        }
        let begun = (st.around.next_id, Arc::new(Mutex::new(())));
        st.around.under_way.push((begun.0, blocks, Arc::clone(&begun.1)));
        Ok(Begin::Begun(begun))
    }

    /// Above the high watermark, or draining towards the low one after it.
    fn destage_bound(&self, st: &State) -> bool {
        st.destaging || st.index.dirty_len() as u64 > self.dirty_high_blocks
    }

    /// Whether a write of `blocks` (large enough) goes around now, as the shipped policy
    /// decides: while the cache is destage-bound; or while the log has no room for it
    /// without a reclaim (`log_short_of`) and that room is bought with write-back: the log's
    /// next quarter holds a segment with more dirty blocks than a reclaim copies forward
    /// (`dirty_head_in_the_way`), or the pre-cleaner wrote back ahead of the writers lately
    /// (`precleaned_lately`); if no block of the write has a copy in the cache. Through the
    /// log such a write costs a log write plus, for each dirty block it displaces, a cache
    /// read and a backing write (or a cache write) in the writer's path;
    /// around it, one backing write, and the dirty data stays cached as the watermarks say
    /// (bcache likewise sends large sequential writes around its cache). A block with a copy
    /// goes through the log: a rewrite of data the log holds supersedes it there (a rewrite
    /// in order makes the head's dirty blocks stale before reclaim reaches them), where
    /// around it would owe a Trim.
    fn goes_around_now(&self, st: &mut State, blocks: std::ops::Range<u64>) -> Option<Why> {
        if self.destage_bound(st) {
            return Some(Why::DestageBound);
        }
        let n = blocks.end - blocks.start;
        // (The cheap test first: a log with room answers for most writes.)
        let short = self.log_short_of(st, n);
        let uncached = || blocks.clone().all(|b| st.index.get(b).is_none() && !st.staging.map.contains_key(&b));
        (short && uncached() && (self.precleaned_lately(st) || self.dirty_head_in_the_way(st, n)))
            .then_some(Why::DirtyHead)
    }

    /// Whether the pre-cleaner wrote back dirty data within its horizon in the last
    /// `WRITE_AROUND_YIELD_MS`: the room writers take at the tail is being bought with
    /// write-back just ahead of them, though the head they meet is clean by then (the
    /// pre-cleaner got there first). Without this, writes that met a head the pre-cleaner had
    /// just cleaned went through the log while it went on writing back the dirty data beyond,
    /// in half the runs of `bench seq`'s dirty-head case (0.28-0.39 of the empty-cache rate
    /// there, on one disk, against 0.6-1.2 when they went around).
    fn precleaned_lately(&self, st: &State) -> bool {
        self.within_yield(st.precleaned_ns)
    }

    /// Whether the log lacks room for `n` more blocks without a reclaim, with a segment and a
    /// whole record to spare: concurrent writers that each found room enough for themselves
    /// stage together, and the record they fill is sealed later (measured without the spare,
    /// 16 writers of 64 KiB ran into the dirty head anyway).
    fn log_short_of(&self, st: &State, n: u64) -> bool {
        let free = st.head + self.layout.log_blocks - st.tail;
        let spare = self.reclaim_reserve() + 1 + self.staging_limit as u64 + u64::from(self.layout.segment_blocks);
        free < n + spare
    }

    /// Whether the log's next quarter from the head (at least `n` blocks) holds a segment with
    /// more dirty blocks than a reclaim copies forward: the room `n` blocks take now is soon
    /// bought by writing those back (by reclaim in the writer's path, or by the pre-cleaner
    /// just ahead of it, on the same devices) or copying them, for data that can go around
    /// at the cost of one backing write. (A quarter, not the pre-cleaner's horizon, what the
    /// log took in the last second: writes going around take none, so the horizon shrank
    /// below the stretch the pre-cleaner had cleaned, the next large write went through the
    /// log, the pre-cleaner woke for it and wrote back the dirty data beyond; in `bench seq`'s
    /// dirty-head case on one disk, 0.33-0.42 of the empty-cache rate in some runs where
    /// writes around kept 0.6-0.9.) The search resumes at `dense_dirty_from`, so each
    /// position is looked at about once.
    fn dirty_head_in_the_way(&self, st: &mut State, n: u64) -> bool {
        let seg = u64::from(self.layout.segment_blocks);
        // (Only over records in the index: a sealed record's entries enter it when its write
        // ends, so a segment that holds one is looked at again later, as is one the tail is
        // still filling.)
        let installed = st.inflight.front().map_or(st.tail, |r| r.position);
        let reach = installed.min(st.head + (self.layout.log_blocks / 4).max(n));
        let mut from = st.dense_dirty_from.max(st.head);
        // (At most `DENSE_DIRTY_SCAN_BLOCKS` positions per call, under the state lock; the
        // next call goes on from there.)
        let reach = reach.min(from + DENSE_DIRTY_SCAN_BLOCKS.max(seg));
        let found = loop {
            let end = from + seg;
            if end > reach {
                break false;
            }
            if self.live_between(st, from, end).filter(|p| p.entry.dirty).nth(self.copy_forward_max()).is_some() {
                break true;
            }
            from = end;
        };
        st.dense_dirty_from = from;
        found
    }

    /// Whether `block`'s copies allow a write-around. Its only copy on the log may be a dirty
    /// one in a durable record (the Trim, after the backing flush, ends it), or none. A clean
    /// copy (indexed, or dropped without a record while replay could bring it back) would
    /// come back after a crash as "the backing device's content" over the new data; so could
    /// a clean copy below a dirty one not yet durable, or below one in a record in flight.
    /// A dirty copy still staged is refused too: it may be sealed during the backing write,
    /// and `end_write_around` takes a copy in flight at its end for a rewrite made after the
    /// write-around began (which wins).
    /// A lost block's loss ends through a record (4.8).
    fn may_write_around(&self, st: &State, block: u64) -> bool {
        let durable_copy = st.index.get(block).is_none_or(|e| e.dirty && self.position_of(st, &e) < st.durable_tail);
        durable_copy
            && !st.lost.contains_key(&block)
            && !st.staging.map.get(&block).is_some_and(|&k| st.staging.data[k].1 == EntryKind::DataDirty)
            && !st.around.resurrectable.contains_key(&block)
            && !st.is_in_flight(block)
    }

    /// Under the state lock, after the backing write: the blocks' copies leave RAM, and
    /// those with an older copy on the log owe a backing flush and a Trim, unless a rewrite
    /// sealed meanwhile is still in flight (it wins: two writes in flight at once have no
    /// order, and that one is what reads already return).
    fn end_write_around(&self, st: &mut State, blocks: std::ops::Range<u64>) {
        st.around.gen += 1;
        let gen = st.around.gen;
        let n = blocks.end - blocks.start;
        for block in blocks {
            st.cancel_fill(block);
            st.staging.remove(block, self.bs);
            // A Trim staged with newer data of the block before its write-around was flushed
            // (now dropped) goes with that data; the older copy it was for is owed again
            // below. A Trim staged after a settle stays: it is safe on its own.
            let mut dropped_trim = false;
            if st.around.trim_with_data.remove(&block) {
                st.staging.meta.retain(|m| !(m.kind == EntryKind::Trim && m.backing_block == block));
                dropped_trim = true;
            }
            let on_log = st.index.remove(block).is_some() || dropped_trim || st.around.owes_trim(block);
            st.around.untrimmed.remove(&block);
            // A rewrite through the cache sealed while this write went around (begin refused
            // blocks in flight) is in a record still being written: it is the block's newest
            // copy (reads see it, and it enters the index when written), and on replay it
            // supersedes the older copy. A Trim, written after it, would drop it instead.
            // (It carried any Trim owed before, in its own record.)
            if on_log && !st.is_in_flight(block) {
                st.around.unflushed.insert(block, gen);
            }
        }
        st.counters.written_around_blocks += n;
        st.counters.written_blocks += n;
        st.counters.write_requests += 1;
        st.around.last_ns = Some(self.clock.now_ns());
    }

    /// Whether writes are going around (one in the last `WRITE_AROUND_YIELD_MS`) while the
    /// log still has room (dirty data under `WRITE_AROUND_YIELD_MAX_PERMILLE` of it): then
    /// the background write-back above the high watermark yields the backing device to them.
    /// Reclaim still writes back what a writer through the cache needs.
    pub(super) fn write_around_has_the_backing_device(&self) -> bool {
        let st = self.lock();
        let recent = self.within_yield(st.around.last_ns);
        let room = (st.index.dirty_len() as u64) * 1000 < self.layout.log_blocks * WRITE_AROUND_YIELD_MAX_PERMILLE;
        recent && room
    }

    /// Whether a write went around the dirty head in the last `WRITE_AROUND_YIELD_MS` and no
    /// block has been written through the log since: the pre-cleaner then leaves the head as
    /// it is (those writers do not need its room; writing it back would only take the devices
    /// from them and the dirty data from the cache). A writer through the log does need the
    /// room, and without the pre-cleaner its own reclaims wrote the dense head back
    /// (`adversarial_around_dirty_head.rs`: small writers beside large write-arounds paid 7
    /// such reclaims in 1.2 s where the pre-cleaner, not yielding, left them none).
    pub(super) fn writes_go_around_the_dirty_head(&self, st: &State) -> bool {
        self.within_yield(st.around.dirty_head_ns) && through_log_blocks(st) == st.around.dirty_head_through_log
    }

    /// Whether clock time `t` (none: never) lies within the last `WRITE_AROUND_YIELD_MS`.
    fn within_yield(&self, t: Option<u64>) -> bool {
        t.is_some_and(|t| self.clock.now_ns().saturating_sub(t) < WRITE_AROUND_YIELD_MS * 1_000_000)
    }

    /// Makes every write-around so far durable on the backing device (a backing flush, if
    /// one is owed), so that checkpoints, reclaim records and Trim entries may record the
    /// drop of older copies. Call with the around lock held. Returns whether Trim entries
    /// are owed (`untrimmed`). A failed flush poisons the volume (never retried).
    pub(super) fn settle_write_around(&self) -> Result<bool> {
        let gen = {
            let st = self.lock();
            st.check_poisoned()?;
            if st.around.gen == st.around.flushed_gen {
                return Ok(!st.around.untrimmed.is_empty());
            }
            st.around.gen
        };
        if !sabotaged!(self, WriteAroundSkipsBackingFlush) {
            if let Err(e) = self.backing.flush() {
                let e = EngineError::backing(e);
                self.lock().poison(format!("flushing the backing device after writes around the cache failed: {e}"));
                return Err(e);
            }
        }
        let mut st = self.lock();
        st.counters.backing_flushes += 1;
        st.around.flushed_gen = st.around.flushed_gen.max(gen);
        let flushed: Vec<u64> = st.around.unflushed.iter().filter(|(_, &g)| g <= gen).map(|(&b, _)| b).collect();
        for block in flushed {
            st.around.unflushed.remove(&block);
            st.around.untrimmed.insert(block);
        }
        Ok(!st.around.untrimmed.is_empty())
    }

    /// FLUSH's part (io lock held): under the around lock, settles the write-arounds, then
    /// puts a Trim entry for every block that owes one into staging (metadata goes first in
    /// a record), writing records out as staging fills. Returns whether any Trim was staged
    /// (then FLUSH must write and flush a record even if its own writes are durable).
    pub(super) fn stage_write_around_trims(&self, io: &mut IoBuffers) -> Result<bool> {
        let mut staged = false;
        loop {
            let around = self.lock_around();
            if !self.settle_write_around()? {
                return Ok(staged);
            }
            staged = true;
            let full = {
                let mut st = self.lock();
                let State { staging, around, .. } = &mut *st;
                while staging.entries() < staging.limit {
                    let Some(block) = around.untrimmed.pop_first() else { break };
                    staging.meta.push(trim_entry(block));
                }
                !around.untrimmed.is_empty()
            };
            if !full {
                return Ok(true);
            }
            // (The record writer may reclaim or checkpoint, which settle under the around
            // lock themselves: it is not held across.)
            drop(around);
            self.write_out(io)?;
        }
    }
}
