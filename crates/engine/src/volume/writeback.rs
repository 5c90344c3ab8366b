//! Write-back (destage): dirty blocks copied to the backing device in batches sorted by
//! address, flushed there, and only then marked clean, exactly the versions written
//! (docs/format.md §4.3). Three callers here pick the batches: the elevator
//! (`destage_step`), the head pre-cleaner (`preclean`: the blocks reclaim would otherwise
//! meet dirty) and `write_back_all` (the online and offline flush). Reclaim calls it too when
//! it meets a mostly dirty window, and so does open's `restore_reclaim_reserve`.

use super::costs::Judge;
use super::reclaim::DenseChoice;
use super::*;

/// The elevator `destage_step` runs: where the last batch stopped, and the dirty blocks
/// found after it by the last scan, in the order they are to be taken.
#[derive(Default)]
pub(super) struct Elevator {
    cursor: u64,
    plan: VecDeque<u64>,
}

/// Keeps the `cap` blocks of `found` that come first in the elevator's order from `cursor`:
/// those at or after it by address, then, wrapping, the lowest. With `ordered`, sorted in
/// that order with duplicates (a block a scan met twice) dropped.
fn keep_nearest(found: &mut Vec<u64>, cursor: u64, cap: usize, ordered: bool) {
    let rank = |b: &u64| b.wrapping_sub(cursor);
    if found.len() > cap {
        found.select_nth_unstable_by_key(cap, rank);
        found.truncate(cap);
    }
    if ordered {
        found.sort_unstable_by_key(rank);
        found.dedup();
    }
}

/// How far ahead of the head the pre-cleaner looks (`preclean`).
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(super) enum Reach {
    /// As far as the writers write in `PRECLEAN_HORIZON_MS` (`preclean_horizon`).
    Horizon,
    /// Further (`PRECLEAN_IDLE_REACH_PERMILLE` of the log), when nothing within the horizon
    /// needs writing back: the backing device would otherwise stand idle.
    Idle,
}

/// How hard a write-back batch presses on devices it may share with the writers' I/O.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Pace {
    /// Something waits for the batch, or soon will: the log read in stretches as long as the
    /// batch allows, every backing write in flight together.
    Full,
    /// Nothing does (the pre-cleaner while the writers, at their pace of the last second, are
    /// more than half a second from what it has not judged; or its idle reach): the log read
    /// `GENTLE_READ_BLOCKS` slots at a time and at most `GENTLE_WRITES_IN_FLIGHT` backing
    /// writes in flight, so that a writer's log write and cache flush queue behind little
    /// (constants.rs has the figures). If the gentle pace falls behind, the writers come
    /// closer and the next batch runs `Full`; so does the rest of a batch once a writer's
    /// reclaim waits for it.
    Gentle,
}

impl Volume {
    /// Writes back one batch of dirty blocks in backing-address order, continuing from where
    /// the last batch stopped (an elevator). Returns how many blocks were written back.
    ///
    /// The blocks come from the elevator's plan, refilled by a scan of the index when it runs
    /// out: the scan looks at every bucket, so one per batch held the state lock about 10 ms
    /// a batch on a 1 GiB cache (every reader and writer waited that long behind it).
    pub fn destage_step(&self, max_blocks: usize) -> Result<usize> {
        let mut elevator = self.lock_destage_behind_reclaims();
        self.lock().check_poisoned()?;
        let mut batch = self.take_planned(&mut elevator, max_blocks)?;
        if batch.is_empty() {
            // The plan ran out, or what was left of it was clean by now: a fresh one.
            self.plan_sweep(&mut elevator);
            batch = self.take_planned(&mut elevator, max_blocks)?;
        }
        if batch.is_empty() {
            return Ok(0);
        }
        self.destage_blocks(batch, Pace::Full)
    }

    /// Fills the elevator's plan: the first `ELEVATOR_PLAN_BLOCKS` dirty blocks at or after
    /// its cursor in address order, then wrapping to the lowest. The index is scanned a
    /// chunk of buckets per state-lock hold (`scan_index`, which misses no entry present
    /// throughout); what changes between two holds is caught when the plan's blocks are
    /// looked up again as they are taken (`take_planned`), or by the next sweep (a block
    /// dirtied meanwhile where the scan had already passed).
    fn plan_sweep(&self, elevator: &mut Elevator) {
        let mut found: Vec<u64> = Vec::new();
        self.scan_index(|st, buckets| {
            found.extend(st.index.dirty_in_buckets(buckets).map(|(block, _)| block));
            if found.len() > 2 * ELEVATOR_PLAN_BLOCKS {
                keep_nearest(&mut found, elevator.cursor, ELEVATOR_PLAN_BLOCKS, false);
            }
        });
        keep_nearest(&mut found, elevator.cursor, ELEVATOR_PLAN_BLOCKS, true);
        elevator.plan = found.into();
    }

    /// Takes the next blocks of the elevator's plan that are still dirty, at most
    /// `max_blocks`, and moves the cursor past them. Each is looked up afresh (its newest
    /// copy, wherever it is now); `INDEX_SCAN_CHUNK` lookups per state-lock hold.
    fn take_planned(&self, elevator: &mut Elevator, max_blocks: usize) -> Result<Vec<Picked>> {
        let mut batch = Vec::new();
        while batch.len() < max_blocks && !elevator.plan.is_empty() {
            let st = self.lock();
            st.check_poisoned()?;
            for _ in 0..INDEX_SCAN_CHUNK {
                if batch.len() == max_blocks {
                    break;
                }
                let Some(block) = elevator.plan.pop_front() else { break };
                elevator.cursor = block + 1;
                if let Some(entry) = st.index.get(block).filter(|e| e.dirty) {
                    batch.push(Picked { block, entry, position: self.position_of(&st, &entry) });
                }
            }
        }
        Ok(batch)
    }

    /// Writes back the dirty blocks in the next reclaim window (the few segments after the
    /// head), so that reclaim finds them clean and writes never wait for the backing device.
    /// Incremental: each slot is looked at once (in RAM, through the index's reverse map).
    /// Returns how many blocks were written back.
    pub fn destage_oldest(&self, max_blocks: usize) -> Result<usize> {
        self.preclean(max_blocks, false, Reach::Horizon)
    }

    /// `destage_oldest`; with `dense_only`, the pre-cleaner walks the log as reclaim will, a
    /// segment-sized window at a time: a window is written back only if it holds more dirty
    /// blocks than reclaim copies forward and reclaim would not copy it forward in a shorter
    /// window either (`dense_choice`); after such a cut the next window starts at the cut,
    /// as reclaim's does. A sparsely dirty stretch costs reclaim one cache read and write of
    /// its few dirty blocks, less than a write-back (the pre-cleaner below the watermark
    /// chooses the cheaper of the two this way).
    pub(super) fn preclean(&self, max_blocks: usize, dense_only: bool, reach: Reach) -> Result<usize> {
        let _elevator = self.lock_destage_behind_reclaims();
        let (batch, until, swept, pace) = {
            let st = self.lock();
            st.check_poisoned()?;
            let mut swept_blocks = 0;
            let window_end = st.head
                + match reach {
                    Reach::Horizon => self.preclean_horizon(&st),
                    Reach::Idle => self.preclean_idle_reach(&st),
                };
            // Each round walks from the head: the first `PRECLEAN_SEGMENTS` segments there are
            // judged again, whatever an earlier round judged them, then the walk resumes where
            // the last round stopped. A window judged far ahead as one reclaim will copy may be
            // one it writes back once the head reaches it (dirty data went above the watermark,
            // or the stretch after it filled with copies): left alone, reclaim wrote it back in
            // a writer's path, which then waited for the pre-clean batch under way far ahead and
            // then for its own (MariaDB over an emulated HDD, 80 % high watermark: 49 reclaims
            // over 200 ms in 150 s). Above the watermark, likewise, the oldest dirty blocks are
            // the head's, not those after the last round's end.
            let rejudged_until = st.head + self.preclean_floor();
            let resume = match reach {
                Reach::Horizon => st.precleaned_until,
                Reach::Idle => st.idle_precleaned_until.max(st.precleaned_until),
            }
            .max(st.head);
            // (The idle reach walks at most `PRECLEAN_IDLE_WALK_BLOCKS` past where it resumes
            // per round, under this one state-lock hold; the next round goes on from there.)
            let walk_end = match reach {
                Reach::Horizon => u64::MAX,
                Reach::Idle => resume.max(rejudged_until) + PRECLEAN_IDLE_WALK_BLOCKS,
            };
            let (from, until) = (st.head, window_end.min(st.written_tail).min(walk_end));
            let stretch = if dense_only { u64::from(self.layout.segment_blocks) } else { 1 };
            let free = st.head + self.layout.log_blocks - st.tail;
            // Gentle while the writers, at their pace of the last `PRECLEAN_HORIZON_MS`, need
            // more than half that long to reach what the pre-cleaner has not judged yet (the
            // free room, then the windows it cleaned or left to copy-forward). (Not half the
            // horizon, which is capped at a quarter of the log: a writer filling a small cache
            // at 550 MiB/s crossed half of it in 30 ms, gentle batches could not keep ahead,
            // and `bench seq --emulated nvme:sata-raid5`'s writes meeting dirty data at the
            // head fell from 0.38-0.62 of the empty-cache rate to 0.29-0.44.) (Only the
            // pre-cleaner below the watermark, `dense_only`, is ever gentle: above it,
            // `destage_oldest` makes room writers are throttled for.)
            let ahead = free + st.precleaned_until.saturating_sub(st.head);
            let pace = if dense_only
                && (reach == Reach::Idle || 2 * ahead >= self.writers_pace(&st))
                && !self.reclaim_waits_for_destage()
            {
                Pace::Gentle
            } else {
                Pace::Full
            };
            // (A gentle batch is sized by the gentle batches' timing: sized for full pace and
            // run gently, it held the destage lock several times as long.)
            let max_blocks = match pace {
                Pace::Full => max_blocks,
                Pace::Gentle => {
                    max_blocks.min(st.costs.gentle_batch_blocks(self.batch_bounds(DESTAGE_BACKGROUND_BATCH_MIN_BLOCKS)))
                }
            };
            let since = self.clock.now_ns().saturating_sub(WRITE_STREAM_ACTIVE_MS * 1_000_000);
            let sweepers = if dense_only {
                st.write_streams.sweepers(since, u64::from(self.layout.segment_blocks))
            } else {
                vec![]
            };
            let mut batch = Vec::new();
            // The window left to sequential writers (below): looked at again next round.
            let mut swept_from = None;
            let mut pos = from;
            while pos < until && batch.len() < max_blocks {
                if pos >= rejudged_until && pos < resume {
                    pos = resume;
                    continue;
                }
                let end = pos + stretch;
                if end > until && dense_only {
                    // (A stretch cut short by the horizon is judged whole on a later round,
                    // not now on its first part alone.)
                    break;
                }
                let end = end.min(until);
                let live: Vec<Picked> = self.live_between(&st, pos, end).collect();
                let dirty: Vec<Picked> = live.iter().filter(|p| p.entry.dirty).copied().collect();
                let dense = dirty.len() > self.copy_forward_max();
                if dense && self.swept_by_writers(&sweepers, &dirty, pos - st.head + free) {
                    // Sequential writers are rewriting these blocks in the order they sit here,
                    // far enough ahead that they supersede them before reclaim takes this
                    // window: written back now, they would be written for nothing. And nothing
                    // after it is written back this round: data that sits after data being
                    // rewritten in order is likely next (nbdcopy's threads rewrite a backup's
                    // first regions, then its next: written back meanwhile, the next regions
                    // cost 76-300 MiB of a 512 MiB rewrite for nothing). Once the writers stop
                    // for `WRITE_STREAM_ACTIVE_MS`, the rounds write it back as before.
                    swept_from = Some(pos);
                    swept_blocks += dirty.len() as u64;
                    pos = end;
                    break;
                }
                if dense_only && dense {
                    // Reclaim's own choice for this window, asked with the pre-cleaner's
                    // stricter margins (`Judge::Ahead`: what it leaves must still be a copy
                    // when the head arrives): copied forward up to the cut (cheaper: no
                    // write-back ahead of it), and its next window starts there, off the
                    // segment boundary, as reclaim's will; or written back.
                    if let DenseChoice::Copy { cut, .. } =
                        self.dense_choice(&st, Judge::Ahead, pos, end, &live, dirty.len())
                    {
                        pos = cut;
                        continue;
                    }
                }
                if !dense_only || dense {
                    if dirty.len() > max_blocks {
                        // A window denser than a whole batch (a writer's reclaim may be waiting
                        // for the batch): written back a batch at a time, its oldest blocks
                        // first, and looked at again from its start (once what is left is
                        // sparse, it is left to reclaim's copy-forward). After other windows,
                        // it is the next batch's.
                        if batch.is_empty() {
                            batch.extend(dirty.into_iter().take(max_blocks));
                        }
                        break;
                    }
                    // (Whole windows while the batch is short of its size: at most twice that.
                    // Stopping short of it instead, one window a batch at the 256-block floor
                    // over an emulated HDD halved the pre-cleaner's pace: writes meeting dirty
                    // data at the head fell from 0.80-0.96 of the empty-cache rate to 0.21-0.24.)
                    batch.extend(dirty);
                }
                pos = end;
            }
            tracing::debug!(
                from,
                until = swept_from.unwrap_or(pos),
                head = st.head,
                free,
                dirty = batch.len(),
                swept = swept_blocks,
                writers = sweepers.len(),
                "pre-clean round"
            );
            (batch, swept_from.unwrap_or(pos), swept_blocks, pace)
        };
        let written = if batch.is_empty() { 0 } else { self.destage_blocks(batch, pace)? };
        let mut st = self.lock();
        st.counters.preclean_swept_blocks += swept;
        match reach {
            Reach::Horizon => {
                st.precleaned_until = st.precleaned_until.max(until);
                if written > 0 {
                    st.precleaned_ns = Some(self.clock.now_ns());
                }
            }
            Reach::Idle => {
                st.idle_precleaned_until = st.idle_precleaned_until.max(until);
                st.counters.preclean_idle_blocks += written as u64;
            }
        }
        Ok(written)
    }

    /// Whether sequential write streams (`sweepers`: continued lately, at least a segment
    /// long) are about to supersede the dirty blocks of a window: all but a copy-forward's
    /// worth of them lie ahead of a stream, within what that stream writes before reclaim
    /// takes the window (what is left, reclaim copies forward cheaply). `ahead` is the log
    /// room the writers fill until then: from the head to the window, and the free room, less
    /// what a writer leaves when it reclaims (a record and reclaim's reserve) and the reclaim
    /// records written meanwhile (two blocks a segment the head passes). Each stream writes
    /// its share of that room. (Record headers do not count: the data being superseded was
    /// written with as many.)
    fn swept_by_writers(&self, sweepers: &[streams::Sweeper], dirty: &[Picked], ahead: u64) -> bool {
        if sweepers.is_empty() {
            return false;
        }
        let seg = u64::from(self.layout.segment_blocks);
        let room = ahead.saturating_sub(2 * ahead / seg + 1 + self.staging_limit as u64 + self.reclaim_reserve());
        let left = dirty.iter().filter(|p| !sweepers.iter().any(|w| w.reaches(p.block, room))).count();
        left <= self.copy_forward_max()
    }

    /// How far ahead of the log head the pre-cleaner keeps the log clean: as many blocks as
    /// were written in the last `PRECLEAN_HORIZON_MS` (so write-back starts as far ahead of
    /// the writer as the writer's own pace), capped at a quarter of the log, and never less
    /// than `PRECLEAN_SEGMENTS` segments (on a log of fewer than 16 segments that floor is more
    /// than a quarter: a small log is pre-cleaned further ahead, as before the horizon).
    pub(super) fn preclean_horizon(&self, st: &State) -> u64 {
        self.written_lately(st).min(self.layout.log_blocks / 4).max(self.preclean_floor())
    }

    /// Log blocks written in the last `PRECLEAN_HORIZON_MS`.
    fn written_lately(&self, st: &State) -> u64 {
        let since = self.clock.now_ns().saturating_sub(PRECLEAN_HORIZON_MS * 1_000_000);
        let k = st.age_samples.partition_point(|&(_, t)| t < since);
        st.age_samples.get(k).map_or(0, |&(pos, _)| st.tail.saturating_sub(pos))
    }

    /// What the writers wrote in the last `PRECLEAN_HORIZON_MS`, at least the pre-cleaner's
    /// floor (the test rule, where set: its horizon).
    fn writers_pace(&self, st: &State) -> u64 {
        #[cfg(feature = "testing")]
        if self.options.gentle_pace_by_horizon {
            return self.preclean_horizon(st);
        }
        self.written_lately(st).max(self.preclean_floor())
    }

    /// `PRECLEAN_SEGMENTS` segments: the least the pre-cleaner looks ahead.
    fn preclean_floor(&self) -> u64 {
        PRECLEAN_SEGMENTS * u64::from(self.layout.segment_blocks)
    }

    /// How far ahead of the head the pre-cleaner looks when nothing within its horizon needs
    /// writing back (`Reach::Idle`): over the records written at least
    /// `PRECLEAN_IDLE_AGE_MS` ago (their live blocks not rewritten since), at most
    /// `PRECLEAN_IDLE_REACH_PERMILLE` of the log. Younger data is left alone: a stretch that a
    /// workload is still rewriting thins out before the head reaches it (the judge, looking
    /// at it now, would write back blocks about to be superseded).
    fn preclean_idle_reach(&self, st: &State) -> u64 {
        let Some(before) = self.clock.now_ns().checked_sub(self.preclean_idle_age_ms() * 1_000_000) else {
            return 0;
        };
        // The records before the first one sampled since then: a sample is taken at the first
        // record `AGE_SAMPLE_INTERVAL_MS` after the last, so those were written before the
        // last sample at or before then plus that interval (at most 10 ms younger than the
        // age); all of them where no sample is younger. None where every sample is younger
        // (the records before the first are of unknown age, as on a volume opened since).
        let k = st.age_samples.partition_point(|&(_, t)| t <= before);
        if k == 0 {
            return 0;
        }
        let old_until = st.age_samples.get(k).map_or(st.tail, |&(pos, _)| pos);
        let reach = self.layout.log_blocks * PRECLEAN_IDLE_REACH_PERMILLE / 1000;
        old_until.clamp(st.head, st.head + reach).saturating_sub(st.head)
    }

    /// The age of the data the idle reach takes: `PRECLEAN_IDLE_AGE_MS`; the test age, where
    /// set (as `batch_bounds`).
    fn preclean_idle_age_ms(&self) -> u64 {
        #[cfg(feature = "testing")]
        if let Some(ms) = self.options.preclean_idle_age_ms {
            return ms;
        }
        PRECLEAN_IDLE_AGE_MS
    }

    /// Writes `blocks` back to the backing device (destage lock held): read from the cache
    /// and verify; write in address order, merging neighbours; flush the backing device; only
    /// then mark clean and queue MarkClean entries.
    ///
    /// The rule (docs/format.md 4.3, "the mark-clean rule"): a write-back marks clean
    /// exactly the versions it wrote, named by the log positions captured when the batch was
    /// taken, in RAM and in the MarkClean entry. The backing flush can take seconds, long
    /// enough for the log to lap and a newer version of the same block to land in the same
    /// slot; a position never repeats, so that newer version stays dirty.
    pub(super) fn destage_blocks(&self, mut blocks: Vec<Picked>, pace: Pace) -> Result<usize> {
        let bs = self.bs;
        let started = std::time::Instant::now();
        let started_ns = self.clock.now_ns();
        blocks.sort_unstable_by_key(|p| p.block);
        // Write-arounds of other blocks, with no copy in the cache, may begin beside the
        // batch from here on (`try_write_around`); until it returns.
        let _published = PublishedBatch::new(self, &blocks);
        let mut data = AlignedBuf::new(blocks.len().max(1) * bs);
        let slots: Vec<u32> = blocks.iter().map(|p| p.entry.slot).collect();
        let read = self.read_slots_paced(&slots, &mut data[..blocks.len() * bs], pace);
        self.cache_io("reading dirty blocks from the cache device", read)?;
        let keep = self.verify_batch(&blocks, &data);
        if !keep.iter().any(|&k| k) {
            return Ok(0);
        }
        let (written, fixed_ns) = self.write_back_kept(&blocks, &data, &keep, started, pace)?;
        let ns = self.clock.now_ns().saturating_sub(started_ns);
        let mut st = self.lock();
        if pace == Pace::Full {
            st.costs.note_write_back_batch(fixed_ns, ns.saturating_sub(fixed_ns), written as u64);
        } else {
            // (Timed apart: a gentle batch takes longer than reclaim's own write-back would,
            // and timed with those it would make reclaim copy forward what writing back costs
            // less; it sizes the next gentle batches.)
            st.costs.note_gentle_batch(fixed_ns, ns.saturating_sub(fixed_ns), written as u64);
            st.counters.gentle_write_back_batches += 1;
        }
        Ok(written)
    }

    /// `destage_blocks` after verification: the kept blocks to the backing device, flushed,
    /// then marked clean. Returns how many were written, and how long the batch's fixed part
    /// took (its flushes and the fingerprint update: `ReclaimCosts::note_write_back_batch`).
    fn write_back_kept(
        &self,
        blocks: &[Picked],
        data: &[u8],
        keep: &[bool],
        started: std::time::Instant,
        pace: Pace,
    ) -> Result<(usize, u64)> {
        let t0 = self.clock.now_ns();
        // The versions about to reach the backing device must be durable in the cache's log
        // first: otherwise a crash could keep them on the backing device while the cache
        // recovers an older version as clean, and the block would later change by itself.
        self.cache_io("flushing the cache device before write-back", self.cache.flush())?;
        let fingerprints = self.begin_fingerprint_update(blocks, data, keep)?;
        let t1 = self.clock.now_ns();
        let written = self.write_runs(blocks, data, keep, pace)?;
        let t2 = self.clock.now_ns();
        if !sabotaged!(self, DestageSkipsBackingFlush) {
            self.backing.flush().map_err(EngineError::backing)?;
        }
        if let Some(new) = fingerprints {
            self.end_fingerprint_update(&new)?;
        }
        let fixed_ns = t1.saturating_sub(t0).saturating_add(self.clock.now_ns().saturating_sub(t2));
        let mut st = self.lock();
        st.counters.backing_flushes += 1;
        self.mark_written_clean(&mut st, blocks, keep);
        tracing::debug!(
            picked = blocks.len(),
            written,
            gentle = pace == Pace::Gentle,
            elapsed_us = started.elapsed().as_micros() as u64,
            "write-back batch"
        );
        Ok((written, fixed_ns))
    }

    /// Which blocks of a batch read into `data` to write back: those whose index entry still
    /// names the position read (the read itself raced nothing then: that position cannot be
    /// overwritten while it is live) and whose data verifies. Copies that fail their checksum
    /// are lost, unless the backing device holds that version.
    fn verify_batch(&self, blocks: &[Picked], data: &[u8]) -> Vec<bool> {
        let bs = self.bs;
        let mut keep = vec![false; blocks.len()];
        let mut suspects = Vec::new();
        // The checksums first, outside the state lock (they depend on the data read and the
        // CRC captured when the batch was taken, nothing else): under the lock they held every
        // reader and writer for up to 10 ms per batch (a 1 GiB cache, 32 KiB sequential writes).
        let crc_ok: Vec<bool> =
            blocks.iter().enumerate().map(|(i, p)| checksum(&data[i * bs..(i + 1) * bs]) == p.entry.crc).collect();
        {
            let st = self.lock();
            for (i, p) in blocks.iter().enumerate() {
                if !self.still_dirty_at(&st, p) {
                    continue; // overwritten, moved, lost, repaired or written around meanwhile
                }
                if !crc_ok[i] {
                    suspects.push(*p);
                    continue;
                }
                keep[i] = true;
            }
        }
        let mut scratch = AlignedBuf::new(bs);
        for p in suspects {
            let on_backing = self.backing_holds(p.block, p.entry.crc, &mut scratch);
            let mut st = self.lock();
            if self.still_dirty_at(&st, &p) && !st.is_in_flight(p.block) {
                self.settle_bad_dirty_copy(&mut st, p, on_backing);
            }
        }
        keep
    }

    /// Fingerprint blocks among those about to be written: phase 1 of their update, the
    /// superblock names the new content as also acceptable, so an attach during or after the
    /// write accepts it. Returns the new fingerprints if there are any. (Only the destager
    /// writes the superblock, under the destage lock.)
    fn begin_fingerprint_update(
        &self,
        blocks: &[Picked],
        data: &[u8],
        keep: &[bool],
    ) -> Result<Option<[Option<u32>; FINGERPRINT_BLOCKS]>> {
        let bs = self.bs;
        let sb = self.superblock();
        let fingerprint_blocks = sb.fingerprint_blocks();
        let mut new_fingerprints = [None; FINGERPRINT_BLOCKS];
        for (i, p) in blocks.iter().enumerate() {
            for (f, &fb) in fingerprint_blocks.iter().enumerate() {
                if keep[i] && p.block == fb {
                    new_fingerprints[f] = Some(sb.fingerprint_hash.of(&data[i * bs..(i + 1) * bs]));
                }
            }
        }
        if !new_fingerprints.iter().any(Option::is_some) {
            return Ok(None);
        }
        let mut sb = sb;
        for (f, new) in new_fingerprints.iter().enumerate() {
            if new.is_some() {
                sb.backing_fingerprints[f].next = *new;
            }
        }
        self.write_superblock(sb)?;
        Ok(Some(new_fingerprints))
    }

    /// Phase 3: the new content is the fingerprint. Written at once, so that the
    /// "write-back in flight" allowance at attach does not stay set on disk.
    fn end_fingerprint_update(&self, new_fingerprints: &[Option<u32>; FINGERPRINT_BLOCKS]) -> Result<()> {
        let mut sb = self.superblock();
        for (f, new) in new_fingerprints.iter().enumerate() {
            if let Some(crc) = new {
                sb.backing_fingerprints[f] = Fingerprint { crc: *crc, next: None };
            }
        }
        self.write_superblock(sb)
    }

    /// Writes the kept blocks to the backing device, one write per run of consecutive block
    /// numbers (the batch is sorted by block), at most `GENTLE_WRITES_IN_FLIGHT` of them in
    /// flight at `Pace::Gentle`. Returns how many blocks were written.
    fn write_runs(&self, blocks: &[Picked], data: &[u8], keep: &[bool], pace: Pace) -> Result<usize> {
        let bs = self.bs;
        let mut i = 0;
        let mut written = 0;
        // Every run in flight at once (`write_batch`): one after another, a batch of scattered
        // dirty blocks ran at the backing device's queue-depth-1 rate, which bounded every
        // write workload larger than the cache (issue 13; a crash meanwhile leaves any subset
        // of them written, which is harmless: nothing is marked clean before the flush).
        let mut runs: Vec<(u64, &[u8])> = Vec::new();
        while i < blocks.len() {
            if !keep[i] {
                i += 1;
                continue;
            }
            let start = i;
            while i + 1 < blocks.len() && keep[i + 1] && blocks[i + 1].block == blocks[i].block + 1 {
                i += 1;
            }
            i += 1;
            runs.push((blocks[start].block * bs as u64, &data[start * bs..i * bs]));
            written += i - start;
        }
        let mut rest = &runs[..];
        while !rest.is_empty() {
            // (A writer's reclaim that comes to wait for this batch meanwhile gets the rest of
            // it at full pace: it waits for the batch either way.)
            let gentle = pace == Pace::Gentle && !self.reclaim_waits_for_destage();
            let n = if gentle { GENTLE_WRITES_IN_FLIGHT.min(rest.len()) } else { rest.len() };
            for result in self.backing.write_batch(&rest[..n]) {
                result.map_err(EngineError::backing)?;
            }
            rest = &rest[n..];
        }
        Ok(written)
    }

    /// The written blocks are on the backing device, flushed: marks clean each one whose
    /// index entry still names the version written, and queues its MarkClean entry.
    fn mark_written_clean(&self, st: &mut State, blocks: &[Picked], keep: &[bool]) {
        for (i, p) in blocks.iter().enumerate() {
            if !keep[i] {
                continue;
            }
            let (marked, ref_position) = if sabotaged!(self, MarkCleanBySlot) {
                // The old, broken rule: whatever now sits in the slot read, named by the
                // current tail.
                (st.index.mark_clean(p.block, p.entry.slot), self.layout.position_of_slot(p.entry.slot, st.tail))
            } else {
                let current = st.index.get(p.block);
                let same = current.is_some_and(|c| c.dirty && self.position_of(st, &c) == p.position);
                // The copy read for this write-back verified, then rotted and was declared
                // lost meanwhile: the backing device now holds exactly that version, so the
                // loss is over (the MarkClean entry ends it on replay too).
                let rescued = st.lost.get(&p.block).is_some_and(|l| l.position == p.position);
                if rescued {
                    st.lost.remove(&p.block);
                    tracing::warn!(
                        block = p.block,
                        "a lost block's version reached the backing device: readable again"
                    );
                }
                ((same && st.index.mark_clean(p.block, p.entry.slot)) || rescued, p.position)
            };
            if marked {
                // (A clean block the frequency gate's victim search passed while it was
                // dirty: the search resumes there.)
                st.victim_cursor.set(st.victim_cursor.get().min(p.position));
                st.pending_meta.push_back(RecordEntry {
                    kind: EntryKind::MarkClean,
                    backing_block: p.block,
                    data_crc: 0,
                    ref_position,
                });
                st.counters.destaged_blocks += 1;
            }
        }
    }

    /// Writes the next superblock copy and flushes the cache device, then makes it current.
    /// Holds no lock across the I/O.
    pub(super) fn write_superblock(&self, mut sb: Superblock) -> Result<()> {
        sb.sequence += 1;
        let mut block = AlignedBuf::new(self.bs);
        sb.encode(&mut block);
        let at = (sb.sequence % 2) * self.bs as u64;
        let result = self.cache.write_at(at, &block).and_then(|()| self.cache.flush());
        if let Err(e) = result {
            let e = EngineError::cache(e);
            self.lock().poison(format!("writing the superblock failed: {e}"));
            return Err(e);
        }
        *lock_order::ranked(self.lock_owner(), lock_order::Rank::Superblock, || {
            self.superblock.lock().expect("superblock lock")
        }) = sb;
        Ok(())
    }

    /// Writes back every dirty block and checkpoints: the backing device then holds all data
    /// (`LostBlocks` if a lost block's stale copy is all it holds). `progress(done, remaining)`
    /// after each batch.
    pub fn flush_all(&self, mut progress: impl FnMut(u64, u64)) -> Result<()> {
        self.write_back_all(1.0, |done, remaining| {
            progress(done, remaining);
            true
        })
        .map(|_| ())
    }

    /// Writes back every block that is dirty when it is called, batch by batch in address
    /// order, then checkpoints; returns how many blocks it wrote back. Blocks written after
    /// the call began are not its business: a served volume keeps taking writes, and the
    /// call still ends. `busy_share` (0 < share <= 1) paces it: after each batch it pauses so
    /// that it works that share of the time, leaving the devices to the foreground load.
    /// `progress(done, remaining)` after each batch; returning false stops early. Everything
    /// written back so far stays clean (durably, through the MarkClean entries and the
    /// checkpoint), so a stopped call resumes where it left off when called again.
    pub fn write_back_all(&self, busy_share: f64, mut progress: impl FnMut(u64, u64) -> bool) -> Result<u64> {
        assert!(busy_share > 0.0 && busy_share <= 1.0, "busy share {busy_share} out of (0, 1]");
        self.flush()?;
        // The versions to write back: (block, crc) of every dirty block now. A version found
        // again at another position (copied forward meanwhile) is still this call's.
        let wanted: HashMap<u64, u32> = {
            let st = self.lock();
            st.check_poisoned()?;
            st.index.iter().filter(|(_, e)| e.dirty).map(|(b, e)| (b, e.crc)).collect()
        };
        let total = wanted.len() as u64;
        let mut done = 0u64;
        let mut idle_passes = 0;
        loop {
            // Still dirty with the version wanted: not yet written back, nor overwritten.
            let mut pending = self.still_dirty(&wanted)?;
            if pending.is_empty() {
                break;
            }
            pending.sort_unstable_by_key(|p| p.block);
            let mut progressed = false;
            // (Batches sized by time, as a writer's reclaim's, with its floor: a reclaim that
            // comes meanwhile waits for the batch under way, then goes first. The background's
            // lower floor cost a flush with no writer waiting 38 % more time over a backing
            // device whose flush takes 15 ms, four times the backing flushes.)
            for batch in pending.chunks(self.write_back_batch_blocks()) {
                let started = std::time::Instant::now();
                let n = {
                    let _destage = self.lock_destage_behind_reclaims();
                    self.destage_blocks(batch.to_vec(), Pace::Full)?
                };
                progressed |= n > 0;
                done = (done + n as u64).min(total);
                if !progress(done, total - done) {
                    self.checkpoint()?;
                    return Ok(done);
                }
                if busy_share < 1.0 {
                    std::thread::sleep(started.elapsed().mul_f64((1.0 - busy_share) / busy_share));
                }
            }
            if !progressed {
                // Every block of the pass moved or changed meanwhile (look again), or some
                // cannot be written back at all (give up after a while).
                idle_passes += 1;
                if idle_passes > 100 {
                    return Err(EngineError::WriteBackStuck { count: pending.len() as u64 });
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            } else {
                idle_passes = 0;
            }
        }
        progress(total, 0);
        self.checkpoint()?;
        // Everything else is on the backing device now, but a lost block's backing copy is
        // stale: "the backing device holds all data" would be a lie.
        let lost = self.lost_blocks();
        if !lost.is_empty() {
            return Err(EngineError::LostBlocks { count: lost.len() as u64, blocks: lost });
        }
        Ok(done)
    }

    /// The versions of `wanted` (block -> CRC) still dirty, not lost, and not overwritten:
    /// not yet written back.
    fn still_dirty(&self, wanted: &HashMap<u64, u32>) -> Result<Vec<Picked>> {
        let st = self.lock();
        st.check_poisoned()?;
        Ok(wanted
            .iter()
            .filter_map(|(&block, &crc)| {
                let entry = st.index.get(block).filter(|e| e.dirty && e.crc == crc)?;
                (!st.lost.contains_key(&block)).then(|| Picked {
                    block,
                    entry,
                    position: self.position_of(&st, &entry),
                })
            })
            .collect())
    }
}

/// A write-back batch's blocks published in `Around::batch` while the batch runs (every
/// caller of `destage_blocks` holds the destage lock, and one batch runs at a time).
struct PublishedBatch<'a>(&'a Volume);

impl<'a> PublishedBatch<'a> {
    fn new(volume: &'a Volume, sorted: &[Picked]) -> Self {
        let mut st = volume.lock();
        debug_assert!(st.around.batch.is_none(), "one write-back batch at a time");
        st.around.batch = Some(sorted.iter().map(|p| p.block).collect());
        PublishedBatch(volume)
    }
}

impl Drop for PublishedBatch<'_> {
    fn drop(&mut self) {
        // (Not while a panic unwinds: the state lock may be held, or poisoned, and the volume
        // is unusable anyway.)
        if !std::thread::panicking() {
            self.0.lock().around.batch = None;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::keep_nearest;
    use rand::{Rng, SeedableRng};

    /// `keep_nearest` applied to a scan's chunks as `plan_sweep` applies it keeps what one
    /// sort of everything found would: the first `cap` distinct blocks from the cursor on,
    /// wrapping.
    #[test]
    fn keep_nearest_in_chunks_matches_one_sort_of_everything() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
        let mut next = || rng.gen::<u64>();
        for round in 0..200 {
            let cap = 1 + (next() % 40) as usize;
            let cursor = next() % 300;
            let mut found_all: Vec<u64> = (0..next() % 400).map(|_| next() % 300).collect();
            let distinct = round % 2 == 0;
            if distinct {
                found_all.sort_unstable();
                found_all.dedup();
                for i in (1..found_all.len()).rev() {
                    found_all.swap(i, (next() % (i as u64 + 1)) as usize); // (table order: any)
                }
            }
            let mut expected = found_all.clone();
            expected.sort_unstable_by_key(|b| b.wrapping_sub(cursor));
            expected.dedup();
            expected.truncate(cap);
            let mut kept = Vec::new();
            for chunk in found_all.chunks(1 + (next() % 50) as usize) {
                kept.extend_from_slice(chunk);
                if kept.len() > 2 * cap {
                    keep_nearest(&mut kept, cursor, cap, false);
                }
            }
            keep_nearest(&mut kept, cursor, cap, true);
            // (Duplicates are dropped only at the end: a block met twice can take two of the
            // cap's places before, so the plan may come out shorter, never different.)
            assert!(expected.starts_with(&kept), "round {round}: {kept:?} is not a prefix of {expected:?}");
            if distinct {
                assert_eq!(kept, expected, "round {round}");
            }
        }
    }
}
