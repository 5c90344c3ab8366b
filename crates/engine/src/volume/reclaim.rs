//! Reclaim: making room at the head of the log for the record writer (docs/format.md §4.5).
//! Clean blocks in the window are evicted at no I/O cost, unless they were read since they
//! were cached or last kept (the eviction policy: FIFO with reinsertion, below); live dirty
//! blocks are copied forward to the tail (a few) or written back first (many); one reclaim
//! record carries the copies and the new head, and is durable before any of the window is
//! overwritten.
//!
//! The eviction policy. Each cached copy counts its reads, up to 3 (index.rs). At the head, a
//! clean copy whose count is not zero is copied forward with the count one less (the
//! reinsertion of S3-FIFO's main queue and CLOCK's second chance, generalised to 2 bits);
//! one whose count is zero is evicted. A read miss of a block evicted lately (the ghost
//! queue, ghost.rs: two Bloom filters, 4 bytes per cache block) enters with a count of
//! one. So a block read once is evicted after one lap of the log, a block read again keeps its
//! place for as many passes of the head as its reads earned, and a scan (which never reads a
//! block twice) pushes a hot block out only after that many passes (which come sooner the more
//! of the log is hot: the sequential bypass, streams.rs, keeps long scans out altogether). The copies
//! cost cache bandwidth only, in the reclaim record the head moves by anyway: at most a
//! record's entries per reclaim record (and no more than the tail has room for), whose window
//! then ends early rather than evict a block its count keeps.

use super::costs::{Judge, DENSE_MIN_FREE_DIVISOR};
use super::*;

/// How far past a dense window's cut reclaim looks to judge a copy over the lap: the share of
/// those segments that is dirty is the share of what the head passes next that it cannot
/// free (`dense_choice`).
const LAP_LOOKAHEAD_SEGMENTS: u64 = 8;

/// Reclaim's choice for a window denser in dirty blocks than one record copies
/// (`dense_choice`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum DenseChoice {
    /// Copy forward up to `cut` (judged per block this window frees, or `over_the_lap`).
    Copy { cut: u64, over_the_lap: bool },
    /// Write the window back, with the dirty blocks of the segments after it.
    WriteBack,
}

impl Volume {
    /// Frees the head of the log until `need` blocks are free at the tail (at least a
    /// segment's worth, never past the tail), io lock held.
    pub(super) fn reclaim(&self, io: &mut IoBuffers, need: u64) -> Result<()> {
        let started = std::time::Instant::now();
        let (head, tail, mut checkpoint) = {
            let st = self.lock();
            (st.head, st.tail, st.checkpoint_position)
        };
        let free = head + self.layout.log_blocks - tail;
        assert!(free >= self.reclaim_reserve(), "the writer keeps {} blocks free for reclaim", self.reclaim_reserve());
        let want = u64::from(self.layout.segment_blocks).max(need.saturating_sub(free));
        let target = (head + want).min(tail);
        if target > checkpoint {
            // The head may not pass the durable checkpoint: replay starts there.
            self.checkpoint_locked()?;
            checkpoint = self.lock().checkpoint_position;
        }
        assert!(target <= checkpoint, "checkpoint at {checkpoint} behind reclaim target {target}");
        // (No record write can run meanwhile: this thread holds the io lock. So the index
        // entries below keep naming the same positions until this function changes them.)
        let (mut new_head, mut live) = self.reclaim_window(head, target, checkpoint);
        let mut dirty: Vec<Picked> = live.iter().filter(|p| p.entry.dirty).copied().collect();
        if dirty.len() > self.copy_forward_max() {
            let choice = self.dense_choice(&self.lock(), Judge::AtTheHead, head, new_head, &live, dirty.len());
            if let DenseChoice::Copy { cut, over_the_lap } = choice {
                // Copied forward in a shorter window: cheaper than the write-back (costs.rs).
                new_head = cut;
                live.retain(|p| p.position < cut);
                dirty.retain(|p| p.position < cut);
                let mut st = self.lock();
                st.counters.dense_copy_forwards += 1;
                st.counters.dense_copy_throughs += u64::from(over_the_lap);
            } else {
                self.write_back_for_reclaim(std::mem::take(&mut dirty), new_head)?;
                // The window as the write-back left it (clean now, read counts kept).
                let mut st = self.lock();
                st.counters.reclaim_write_backs += 1;
                live = self.live_between(&st, head, new_head).collect();
            }
        }
        // (The clean copies the record has room for; never so many that the record takes
        // more than the window frees, which a window cut short could otherwise allow.)
        let window_room = (new_head - head).saturating_sub(2 + dirty.len() as u64) as usize;
        // (Clean copies may take up to a record's entries, not half a segment, where the tail
        // has room for them beyond the writer's reserve and the header of the writer's
        // record: a head dense with blocks read again then keeps them, where half a segment
        // evicted the least read of them. On the shared traces the replay missed 2.9 % more
        // than the best published policy on average with half a segment, 2.4 % with a whole
        // one (with a smaller sketch than now). A record, not a segment: every reclaim record
        // takes a header block of the log, and where a segment is smaller than a record (a
        // default segment is not; the replay's are for caches under 64 MiB) a segment's bound
        // wrote a header per few copies. Replayed with 8-block segments, 10 % of arc_P6 missed
        // 0.435 with a segment's bound (9,186 blocks cached on average of 10,184) and 0.387
        // with a record's; the 16 points as the replay formats them went from 0.89 % to
        // 0.76 % above the best on average. The reserve stays half a segment, and whatever
        // the room, the window frees at least a block more than the record takes, so the
        // reserve is free after it.)
        let copies_max = self.staging_limit.min(free as usize - 2).max(self.copy_forward_max());
        let room = (copies_max - dirty.len()).min(window_room);
        let kept = self.reinsertions(head, &mut new_head, &mut live, &mut dirty, room);
        // (The copy's cost: reading the copies, then writing and flushing the record; not the
        // loss checkpoint or the write-around settle in between, which any reclaim may owe.)
        let read_started_ns = self.clock.now_ns();
        let mut copies = self.read_copies(io, dirty, kept)?;
        let read_ns = self.clock.now_ns().saturating_sub(read_started_ns);
        // Every loss not yet in a written record goes into the reclaim record (below), because
        // the head is about to pass blocks that recovery would otherwise replay as dirty (or,
        // once passed, forget, serving the stale backing copy). If they do not all fit, a
        // checkpoint (which holds every loss as a tombstone) makes them durable first.
        let unlogged = self.lock().lost.values().filter(|l| l.logged != Logged::Yes).count();
        if unlogged + copies.len() > RECORD_ENTRIES && !sabotaged!(self, LostInRamOnly) {
            self.checkpoint_locked()?;
        }
        let (pos, blocks) = {
            // Write-arounds dropped older copies that this record may leave behind the head:
            // they must be on the backing device first, and none may slip in before the
            // record is sealed (write_around.rs).
            let _around = self.lock_around();
            self.settle_write_around()?;
            self.seal_reclaim_record(io, &live, &mut copies, head, new_head)
        };
        let write_started_ns = self.clock.now_ns();
        let result = self.write_log(pos, &io.copy[..blocks as usize * self.bs], None);
        self.cache_io("writing a reclaim record", result)?;
        self.lock().written_tail = pos + blocks;
        self.flush_cache(sabotaged!(self, ReclaimSkipsMarkerFlush))?;
        if !copies.is_empty() {
            let ns = read_ns.saturating_add(self.clock.now_ns().saturating_sub(write_started_ns));
            self.lock().costs.note_copy(ns, blocks);
        }
        tracing::debug!(
            head,
            new_head,
            live = live.len(),
            copied = copies.len(),
            elapsed_us = started.elapsed().as_micros() as u64,
            "reclaim"
        );
        let mut st = self.lock();
        if new_head - head > blocks {
            st.barren_since = None;
        } else if st.barren_since.is_none() {
            st.barren_since = Some(head);
        }
        self.finish_reclaim(&mut st, head, new_head, &copies, pos);
        self.check_invariants(&st);
        Ok(())
    }

    /// The window reclaim frees, `[head, new head)`, and the blocks live in it (the index's
    /// reverse map: no I/O). At least up to `target`; whole segments beyond it that hold no
    /// dirty block are taken too, up to an eighth of the log: evicting clean data costs no
    /// I/O but this reclaim's record and cache flush, and a wider window pays that once for
    /// many segments (a writer meeting a cache full of clean data runs at the empty-cache
    /// rate).
    fn reclaim_window(&self, head: u64, target: u64, checkpoint: u64) -> (u64, Vec<Picked>) {
        let mut live = self.live_between(&self.lock(), head, target).collect::<Vec<_>>();
        let mut target = target;
        let seg = u64::from(self.layout.segment_blocks);
        // (A segment per state-lock hold: the widest window, 32,768 blocks of a 1 GiB cache,
        // looked up under one hold stalled every reader and writer for 2-7 ms. The caller
        // holds the io lock, so no record moves the tail or an entry meanwhile; what others
        // change between two holds (a write-back, a TRIM) they could change after the last.)
        loop {
            let st = self.lock();
            let limit = (head + self.layout.log_blocks / 8).min(st.tail).min(checkpoint);
            if target + seg > limit {
                break;
            }
            // (Only segments whose blocks are all clean and unread since cached: evicting
            // those costs the policy nothing.)
            let next: Vec<Picked> = self.live_between(&st, target, target + seg).collect();
            if next.iter().any(|p| p.entry.dirty || self.keeps(p)) {
                break;
            }
            live.extend(next);
            target += seg;
        }
        (target, live)
    }

    /// What reclaim does with a window holding more live dirty blocks than a reclaim record
    /// copies forward (`window_dirty` of them in `[head, new_head)`). Its copies (dirty
    /// blocks and the clean ones the eviction policy keeps, in log order) just fill a record
    /// in a window cut short at the first live block that does not fit. That shorter window is
    /// copied forward if dirty data is at or below the high watermark and not draining (above
    /// it, write-back is what brings it down) and copying was measured cheaper than writing
    /// back (`costs.rs`): per block this window frees where it frees an eighth of its length,
    /// over the lap of the head where it frees less (a window of whole records of dirty
    /// blocks, such as an earlier reclaim's copies, is copied again while the rest of the log
    /// has room, rather than a writer waiting for a slow backing device below the
    /// watermark). A shorter window whose record would take more room than it frees (a
    /// record's worth of dirty blocks with no header among them: the writer's reserve would
    /// shrink) is written back.
    pub(super) fn dense_choice(
        &self,
        st: &State,
        judge: Judge,
        head: u64,
        new_head: u64,
        live: &[Picked],
        window_dirty: usize,
    ) -> DenseChoice {
        let max = self.copy_forward_max();
        let mut copies = 0;
        let Some(cut) = live.iter().find(|p| {
            if p.entry.dirty || self.keeps(p) {
                copies += 1;
            }
            copies > max
        }) else {
            return DenseChoice::WriteBack;
        };
        let cut = cut.position;
        // (The background round's view of the watermark: staged data counts, and once above
        // the high watermark the destager drains to the low one.)
        let log_dirty = (st.index.dirty_len() + st.staging.data.len()) as u64;
        if st.destaging || log_dirty > self.dirty_high_blocks {
            return DenseChoice::WriteBack;
        }
        // (The window holds `max` copies before the cut, so it is at least `max` long; the
        // record is one longer.)
        let window = cut - head;
        let (dirty, whole) = (window_dirty as u64, new_head - head);
        // (A window that would free less than nothing is a record of more dirty blocks than
        // one reclaim record holds, a large write's: written back with the segments after
        // it, in large runs.)
        let Some(freed) = window.checked_sub(1 + max as u64) else { return DenseChoice::WriteBack };
        let copy = if freed > 0 && freed >= window / DENSE_MIN_FREE_DIVISOR {
            st.costs.copy_is_cheaper(judge, max as u64, freed, dirty, whole).then_some(false)
        } else {
            // Freeing little or nothing here, as when copying again an earlier reclaim's record
            // of copies, still moves the head on towards the blocks that do free. Over the lap,
            // the head frees what it passes next that is neither dirty nor a header that the
            // copies of dirty blocks need: judged on the stretch it meets next,
            // `LAP_LOOKAHEAD_SEGMENTS`, not on the whole log, whose dirty data may lie in one
            // dense run (a large sequential write: copying it frees nothing until past its
            // end). A log of reclaim records of `max` copies each is `max / (max + 1)` dirty,
            // yet copying it again frees nothing: the headers count. And a run of reclaims
            // that freed nothing ends after a quarter of the log, whatever the estimate says.
            let barren = st.barren_since.is_some_and(|since| head >= since + self.layout.log_blocks / 4);
            let ahead_end = (cut + LAP_LOOKAHEAD_SEGMENTS * u64::from(self.layout.segment_blocks)).min(st.tail);
            let over_the_lap = !barren && ahead_end > cut && {
                let ahead_dirty = self.live_between(st, cut, ahead_end).filter(|p| p.entry.dirty).count() as u64;
                let unfreeable = (ahead_dirty + ahead_dirty.div_ceil(max as u64)).min(ahead_end - cut);
                st.costs.copy_through_is_cheaper(judge, dirty, whole, unfreeable, ahead_end - cut)
            };
            over_the_lap.then_some(true)
        };
        match copy {
            Some(over_the_lap) => DenseChoice::Copy { cut, over_the_lap },
            None => DenseChoice::WriteBack,
        }
    }

    /// The window is mostly dirty: the cache is full of data not yet written back, and the
    /// pre-cleaner is behind. Writes it back now, with the dirty blocks of the next few
    /// segments in the same batch (one backing flush for all of them, and the next reclaims
    /// find them clean): this is the backpressure a writer feels when write-back has fallen
    /// behind, paid in large batches rather than a flush per segment. The segments ahead
    /// join whole, as many as a batch's size takes besides the window's own (`write_back_batch_blocks`,
    /// sized by time): a batch ending inside a segment would leave the next reclaim a window
    /// part clean, which it copies forward instead of freeing; and a window as dirty as a
    /// whole batch must not leave the segments after it to a backing flush each.
    fn write_back_for_reclaim(&self, mut dirty: Vec<Picked>, new_head: u64) -> Result<()> {
        let waited = std::time::Instant::now();
        let _destage = self.lock_destage_for_reclaim();
        let waited_us = waited.elapsed().as_micros() as u64;
        let batch = self.write_back_batch_blocks();
        {
            let st = self.lock();
            let picked = dirty.len();
            // The batch this writer waited for may have written the window back (the
            // pre-cleaner takes the dense windows at the head first): then nothing here is
            // left to write, and the segments after it are the pre-cleaner's to write, not
            // this writer's to wait for (MariaDB over an emulated HDD: a writer that had
            // waited 1.2 s for two pre-clean batches then wrote 250 blocks ahead, 0.3 s more).
            // (No other dirty block lies in the window: a position turns dirty only when its
            // record is installed, and the window lies behind the tail.)
            dirty.retain(|p| self.still_dirty_at(&st, p));
            // (Why a writer writes back: the pre-cleaner had not reached the window, or had
            // judged it a copy (`precleaned_until` past it); and what it waited for first.)
            tracing::debug!(
                picked,
                still_dirty = dirty.len(),
                waited_us,
                new_head,
                precleaned_until = st.precleaned_until,
                "reclaim write-back"
            );
            if dirty.is_empty() {
                return Ok(());
            }
            let segment = u64::from(self.layout.segment_blocks);
            let until = (new_head + PRECLEAN_SEGMENTS * segment).min(st.tail);
            let mut from = new_head;
            let mut ahead = 0;
            while from < until {
                let to = (from + segment).min(until);
                let more: Vec<Picked> = self.live_between(&st, from, to).filter(|p| p.entry.dirty).collect();
                if ahead + more.len() > batch {
                    break;
                }
                ahead += more.len();
                dirty.extend(more);
                from = to;
            }
        }
        self.destage_blocks(dirty, Pace::Full)?;
        Ok(())
    }

    /// The clean blocks of the window that the eviction policy keeps (read since cached or
    /// last kept), in log order, at most `room` (the copies the record has left after
    /// `dirty` dirty ones). When the window holds more, it ends before the first one that
    /// does not fit: a block whose count keeps it is not evicted for want of room in this
    /// record (the next reclaim copies it). The shorter window must still free a block
    /// besides its record; where kept blocks lie so densely that it cannot, the least-read
    /// of them are evicted.
    ///
    /// While a write or flush is under way, it must free `room / 16` blocks instead: a head
    /// dense with blocks read again would otherwise make a writer wait for a hundred records
    /// of copies (CLOCK's hand sweeping a hot cache), where this costs it a few and evicts
    /// the least-read of a dense window. Without a writer waiting, reclaim makes room only
    /// for the read misses being admitted, which no reader waits for: there the head passes
    /// every kept block as CLOCK does. On the shared traces (all reads) that took the
    /// replay from 1.97 % above the best published policy on average to 1.25 %, at 2-10 %
    /// more SSD bytes written per access.
    fn reinsertions(
        &self,
        head: u64,
        new_head: &mut u64,
        live: &mut Vec<Picked>,
        dirty: &mut Vec<Picked>,
        room: usize,
    ) -> Vec<Picked> {
        let mut kept: Vec<Picked> = live.iter().filter(|p| self.keeps(p)).copied().collect();
        if kept.len() <= room {
            return kept;
        }
        let least_read_out = |kept: &mut Vec<Picked>, n: usize| {
            kept.sort_by_key(|p| (std::cmp::Reverse(p.entry.freq), p.position));
            kept.truncate(n);
            kept.sort_by_key(|p| p.position);
        };
        let cut = kept[room].position;
        let writer_waits = self.foreground.load(Ordering::Relaxed) > 0;
        let min_progress = if writer_waits { (room as u64 / 16).max(1) } else { 1 };
        // (The copies that fit a window ending at `cut` while it frees `min_progress`. Dirty
        // blocks after the cut stay where they are, for a later window, as kept ones do: a
        // window that took them all instead evicted every kept block past its room, 124 of
        // a 127-block window of blocks read again.)
        let dirty_before_cut = dirty.iter().filter(|p| p.position < cut).count() as u64;
        let fits = (cut - head).saturating_sub(1 + dirty_before_cut + min_progress) as usize;
        if room == 0 || fits == 0 {
            // (The whole window: it frees at least a segment less half of one.)
            least_read_out(&mut kept, room);
            return kept;
        }
        *new_head = cut;
        live.retain(|p| p.position < cut);
        dirty.retain(|p| p.position < cut);
        kept.truncate(room);
        if kept.len() > fits {
            least_read_out(&mut kept, fits);
        }
        kept
    }

    /// Whether the eviction policy keeps a clean block the head reaches.
    fn keeps(&self, p: &Picked) -> bool {
        !p.entry.dirty && p.entry.freq > 0 && self.options.eviction != Eviction::Fifo
    }

    /// Reads the live dirty blocks to copy forward, then the clean ones to reinsert, into the
    /// reclaim record's buffer (cache bandwidth only; the backing device is not touched) and
    /// verifies each: returns the ones that verified, packed to the front of the record in
    /// order. A dirty copy that fails its checksum is lost, or repaired if the backing device
    /// holds that version; a clean one is evicted.
    fn read_copies(&self, io: &mut IoBuffers, dirty: Vec<Picked>, clean: Vec<Picked>) -> Result<Vec<Picked>> {
        let bs = self.bs;
        let mut dirty = dirty;
        dirty.extend(clean);
        let mut copies: Vec<Picked> = Vec::with_capacity(dirty.len());
        let slots: Vec<u32> = dirty.iter().map(|p| p.entry.slot).collect();
        let read = self.read_slots(&slots, &mut io.copy[bs..(1 + dirty.len()) * bs]);
        self.cache_io("reading blocks to copy forward", read)?;
        for (i, p) in dirty.into_iter().enumerate() {
            let k = copies.len();
            if k != i {
                io.copy.copy_within((1 + i) * bs..(2 + i) * bs, (1 + k) * bs);
            }
            let out = &mut io.copy[(1 + k) * bs..(2 + k) * bs];
            if checksum(out) == p.entry.crc {
                copies.push(p);
                continue;
            }
            if !p.entry.dirty {
                continue; // (the backing device holds it; seal evicts it with the window)
            }
            // (io -> destage is the lock order; a write-back batch never waits for the io lock.)
            let _destage = self.lock_destage();
            let on_backing = self.backing_holds(p.block, p.entry.crc, out);
            let mut st = self.lock();
            // (Still dirty: the batch waited for may have written this very version back;
            // then the bad copy is a clean one, evicted below.)
            if self.still_dirty_at(&st, &p) {
                self.settle_bad_dirty_copy(&mut st, p, on_backing);
            }
        }
        Ok(copies)
    }

    /// Evicts the window's clean blocks and seals the reclaim record into `io.copy`: the
    /// losses it must log, queued metadata, the copies, and the new head, which the record
    /// makes durable before any of the window is overwritten. It lands in the reserve the
    /// writer keeps free. Returns its position and length.
    fn seal_reclaim_record(
        &self,
        io: &mut IoBuffers,
        live: &[Picked],
        copies: &mut Vec<Picked>,
        head: u64,
        new_head: u64,
    ) -> (u64, u64) {
        // The window's blocks not copied leave the index, a segment's worth per state-lock
        // hold (a window of 32,768 blocks under one hold stalled readers and writers for
        // 2-6 ms). Clean all of them (a copy that went stale since it was read, dropped
        // below, names a slot its block no longer has, so `remove_if_slot` leaves it), and no
        // record can be written meanwhile (the caller holds the io lock): a reader that misses
        // on one between two holds reads the backing device's copy, the same data.
        let copied: HashSet<u64> = copies.iter().map(|p| p.block).collect();
        for chunk in live.chunks(self.layout.segment_blocks as usize) {
            let mut st = self.lock();
            for p in chunk {
                if copied.contains(&p.block) {
                    continue;
                }
                if let Some(old) = st.index.remove_if_slot(p.block, p.entry.slot) {
                    assert!(!old.dirty, "block {} still dirty at reclaim", p.block);
                    st.counters.evicted_blocks += 1;
                    // (With the probation ring, the ghost queue remembers what left the ring:
                    // S3-FIFO's; a block the log let go re-enters through the ring.)
                    if !st.probation.enabled() {
                        st.ghosts.insert(p.block);
                    }
                    // (Replayed until this record is durable: see `Around`.)
                    st.around.dropped_without_record(p.block, p.position);
                }
            }
        }
        let mut st = self.lock();
        self.drop_stale_reinsertions(&st, io, copies);
        st.counters.reclaimed_blocks += new_head - head;
        let reinserted = copies.iter().filter(|p| !p.entry.dirty).count() as u64;
        st.counters.copied_forward_blocks += copies.len() as u64 - reinserted;
        st.counters.reinserted_blocks += reinserted;
        let mut entries = Vec::with_capacity(RECORD_ENTRIES);
        if !sabotaged!(self, LostInRamOnly) {
            entries.extend(Self::reclaim_loss_entries(&mut st, RECORD_ENTRIES - copies.len(), new_head));
        }
        while entries.len() + copies.len() < RECORD_ENTRIES {
            match st.pending_meta.pop_front() {
                Some(m) => entries.push(m),
                None => break,
            }
        }
        entries.extend(copies.iter().map(|p| RecordEntry {
            kind: if p.entry.dirty { EntryKind::DataDirty } else { EntryKind::DataClean },
            backing_block: p.block,
            data_crc: p.entry.crc,
            ref_position: 0,
        }));
        let pos = st.tail;
        let blocks = 1 + copies.len() as u64;
        assert!(pos + blocks <= head + self.layout.log_blocks, "the copy record fits in the reserve");
        let header = self.record_header(&st, new_head, entries);
        let crc = header.encode(self.uuid_low, &mut io.copy[..self.bs]);
        Self::advance_tail(&mut st, blocks, crc);
        (pos, blocks)
    }

    /// Drops the clean copies whose block left the index, or moved, since reclaim read them
    /// (a TRIM; a rewrite, whose newer copy is in a later record anyway): replayed, such a
    /// copy would bring back data the volume no longer holds. (A dirty copy stays: it is the
    /// newest version until a later record says otherwise.) Packs the rest to the front of
    /// the record, in order.
    fn drop_stale_reinsertions(&self, st: &State, io: &mut IoBuffers, copies: &mut Vec<Picked>) {
        let bs = self.bs;
        let mut k = 0;
        for i in 0..copies.len() {
            let p = copies[i];
            let current = st.index.get(p.block);
            if !p.entry.dirty && current.is_none_or(|c| c.slot != p.entry.slot || c.dirty) {
                continue;
            }
            if k != i {
                io.copy.copy_within((1 + i) * bs..(2 + i) * bs, (1 + k) * bs);
                copies[k] = p;
            }
            k += 1;
        }
        copies.truncate(k);
    }

    /// The Lost entries the reclaim record carries (at most `room`), marked logged. Losses
    /// inside the window the head is about to pass first: those must be in this record. More
    /// losses may have been declared during a checkpoint just taken (readers, the destager);
    /// the ones that do not fit stay unlogged, which is safe as long as they lie beyond the
    /// window (a later record or checkpoint logs them before the head reaches them).
    fn reclaim_loss_entries(st: &mut State, room: usize, new_head: u64) -> Vec<RecordEntry> {
        let mut pending: Vec<(u64, u64, u32)> =
            st.lost.iter().filter(|(_, l)| l.logged != Logged::Yes).map(|(&b, l)| (b, l.position, l.crc)).collect();
        pending.sort_by_key(|&(b, position, _)| (position >= new_head, b));
        // (Losses inside the window beyond `room` can only be blocks a reader declared lost
        // after their copy, read good above, went into this record: the copy supersedes
        // them on replay.)
        pending.truncate(room);
        pending
            .into_iter()
            .map(|(block, position, crc)| {
                st.lost.get_mut(&block).expect("listed").logged = Logged::Yes;
                RecordEntry { kind: EntryKind::Lost, backing_block: block, data_crc: crc, ref_position: position }
            })
            .collect()
    }

    /// The reclaim record is durable: the head moves, and each copied block that is still
    /// where reclaim read it now lives at its new slot.
    fn finish_reclaim(&self, st: &mut State, head: u64, new_head: u64, copies: &[Picked], pos: u64) {
        st.head = new_head;
        st.around.head_moved(new_head);
        st.admission.note_reclaim();
        // (Its copies enter the index only now, behind a record written at the tail before:
        // the search for a dense dirty segment may have passed those positions meanwhile.)
        st.dense_dirty_from = st.dense_dirty_from.min(pos);
        for (k, p) in copies.iter().enumerate() {
            if let Some(current) = st.index.get(p.block) {
                if current.slot == p.entry.slot {
                    let slot = self.layout.slot(pos + 1 + k as u64);
                    // (A reinserted copy spent one read of its count on this lap.)
                    let freq = if p.entry.dirty { current.freq } else { current.freq.saturating_sub(1) };
                    st.index.insert(p.block, IndexEntry { slot, dirty: current.dirty, freq, crc: p.entry.crc });
                    continue;
                }
            }
            // The copy left the index, or moved, after the record was sealed (a TRIM, a reader
            // that found the old copy rotten, a rewrite): the copy is durable beyond the new
            // head, and recovery would bring it back. Until the head passes it, the block may
            // not be written around (write_around.rs, `resurrectable`); the position the
            // TRIM or reader noted is behind the new head already.
            st.around.dropped_without_record(p.block, pos + 1 + k as u64);
        }
        // The head passed the window: nothing in the index may still name a slot in it.
        assert!(
            self.live_between(st, head, new_head).next().is_none(),
            "reclaim left a live block behind the head in [{head}, {new_head})"
        );
    }
}

impl Volume {
    /// Gives the writer its reclaim reserve back when the recovered log leaves less free
    /// (open calls it before its checkpoint). The engine never writes such a log (every
    /// record leaves `reclaim_reserve` free), but recovery accepts any record that fits in
    /// the log: one written by an engine that kept a smaller reserve, or forged. Reclaim
    /// could not write its record there, so the head moves without one: the live dirty
    /// blocks of the window are written back, every live block of it leaves the index, and
    /// a checkpoint (at the tail, carrying the new head) makes that durable. A crash before it
    /// recovers the same log again, and this runs again.
    pub(crate) fn restore_reclaim_reserve(&self) -> Result<()> {
        let _io = self.lock_io();
        let (head, tail) = {
            let st = self.lock();
            (st.head, st.tail)
        };
        let free = head + self.layout.log_blocks - tail;
        if free >= self.reclaim_reserve() {
            return Ok(());
        }
        let seg = u64::from(self.layout.segment_blocks);
        let new_head = (head + (self.reclaim_reserve() - free).div_ceil(seg) * seg).min(tail);
        tracing::warn!(
            head,
            tail,
            new_head,
            "the recovered log leaves reclaim no room: moving the head by a checkpoint"
        );
        let dirty: Vec<Picked> = {
            let st = self.lock();
            self.live_between(&st, head, new_head).filter(|p| p.entry.dirty).collect()
        };
        if !dirty.is_empty() {
            let _destage = self.lock_destage();
            self.destage_blocks(dirty, Pace::Full)?;
        }
        {
            let mut st = self.lock();
            let live: Vec<Picked> = self.live_between(&st, head, new_head).collect();
            let still_dirty = live.iter().filter(|p| p.entry.dirty).count() as u64;
            if still_dirty > 0 {
                // (A copy that failed its checksum was declared lost or repaired by the
                // write-back, and left the index; what is still dirty could not be written.)
                return Err(EngineError::WriteBackStuck { count: still_dirty });
            }
            for p in live {
                st.index.remove(p.block);
                st.counters.evicted_blocks += 1;
            }
            // The MarkClean entries of this write-back name positions behind the new head:
            // the checkpoint's index says evicted for them.
            st.pending_meta.retain(|m| !(m.kind == EntryKind::MarkClean && (head..new_head).contains(&m.ref_position)));
            st.head = new_head;
        }
        self.checkpoint_locked()
    }
}
