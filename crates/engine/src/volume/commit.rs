//! The record writer and group commit: staging sealed into a record (one header block, then
//! the data blocks), written at the tail in sequence order under the io lock, and FLUSH,
//! which makes every record written so far durable with one cache-device flush shared by
//! every caller waiting (docs/format.md §4.2).

use super::*;

/// What a cache flush covers: the sealed staging buffers, the record sequence and the log
/// tail written before it was issued.
#[derive(Clone, Copy)]
struct FlushCoverage {
    sealed: u64,
    seq: u64,
    tail: u64,
}

/// A sealed record, between its seal and the end of its write (its `Inflight` entry holds
/// the rest).
struct Sealed {
    position: u64,
    blocks: u64,
    buf: Arc<AlignedBuf>,
    writing: Arc<Mutex<()>>,
}

impl Volume {
    /// Makes every write completed before this call durable. Concurrent callers share one
    /// record write and one cache-device flush (group commit). The cache flush runs with the
    /// io lock let go (the flush gate held instead): the next FLUSH seals and writes its record
    /// meanwhile, and one that the flush under way covers waits for it instead of issuing
    /// another.
    pub fn flush(&self) -> Result<()> {
        let _foreground = self.foreground();
        let target = {
            let mut st = self.lock();
            st.check_poisoned()?;
            st.counters.flush_requests += 1;
            st.sealed + u64::from(st.staging.has_dirty())
        };
        loop {
            let mut io =
                if sabotaged!(self, FlushIgnoresRecordPipeline) { self.lock_io_to_seal() } else { self.lock_io() };
            // Writes that went around the cache: a backing flush, then their Trim entries.
            let trims = self.stage_write_around_trims(&mut io)?;
            {
                let st = self.lock();
                st.check_poisoned()?;
                // (A Trim staged with a rewrite of a block written around before this FLUSH
                // began ends that block's older copy: it must be durable too.)
                let staged_trims = st.staging.meta.iter().any(|m| m.kind == EntryKind::Trim);
                // (The Trims of write-arounds completed before this FLUSH began may have been
                // settled and sealed since its target was taken, by another FLUSH whose cache
                // flush, run with the io lock let go, may not have ended: the record holding
                // the newest Trims counts too. Found by the review of the pipelined FLUSH.)
                let target = target.max(st.trims_sealed);
                if !trims && !staged_trims {
                    if st.durable_sealed >= target {
                        return Ok(()); // a flush that started after our writes already covered them
                    }
                    if st.flushing_sealed >= target {
                        // The cache flush under way covers them: wait for it (it holds the gate).
                        drop(st);
                        drop(io);
                        drop(self.lock_flush_gate());
                        continue;
                    }
                }
            }
            self.write_out(&mut io)?;
            let covered = self.flush_coverage();
            // (Taken with the io lock held: cache flushes begin in the order of what they
            // cover, and wait for the one before to end.)
            let gate = self.lock_flush_gate();
            {
                let mut st = self.lock();
                st.flushing_sealed = st.flushing_sealed.max(covered.sealed);
            }
            drop(io);
            let flushed = self.flush_covered(covered, sabotaged!(self, FlushSkipsCacheFlush));
            drop(gate);
            return flushed;
        }
    }

    /// Flushes the cache device; afterwards every record written so far is durable.
    /// Called with the io lock held.
    pub(super) fn flush_cache(&self, skip: bool) -> Result<()> {
        let covered = self.flush_coverage();
        self.flush_covered(covered, skip)
    }

    /// What a cache flush issued now covers: every record written so far, with the io lock
    /// held and the pipeline drained (asserted).
    fn flush_coverage(&self) -> FlushCoverage {
        // With the io lock held no record write is in progress: every sequence below
        // `next_seq` has been written and a flush issued after this covers it.
        let (covered, drained) = {
            let st = self.lock();
            let covered = FlushCoverage { sealed: st.sealed, seq: st.next_seq - 1, tail: st.written_tail };
            (covered, st.inflight.iter().all(|r| r.done.is_some()))
        };
        // The pipeline is drained: a flush issued while a sealed record is still being
        // written would not cover it, and `durable_sealed` below would count it. (Asserted
        // with the state lock released, so the panic does not poison it.)
        assert!(drained, "a cache flush with a record write in progress");
        covered
    }

    /// Flushes the cache device, then records `covered` as durable (unless the volume was
    /// poisoned meanwhile: no retried fsync).
    fn flush_covered(&self, covered: FlushCoverage, skip: bool) -> Result<()> {
        if !skip {
            self.cache_io("flushing the cache device", self.cache.flush())?;
        }
        let mut st = self.lock();
        // Another thread's failed write or flush poisons the volume: a later successful flush
        // must not report durability (no retried fsync).
        st.check_poisoned()?;
        st.durable_sealed = st.durable_sealed.max(covered.sealed);
        if !skip {
            st.durable_seq = st.durable_seq.max(covered.seq);
            st.durable_tail = st.durable_tail.max(covered.tail);
        }
        st.counters.cache_flushes += 1;
        Ok(())
    }

    /// Makes room in staging for a writer that found it full: seals it into a record and
    /// writes it without waiting for the records before it (up to `RECORD_PIPELINE_DEPTH`
    /// writes in flight), so that a stream of large writes keeps the cache device busy
    /// instead of one record write at a time; `during` runs while the record is in flight (the
    /// writer stages the rest of its request: a lone large writer then keeps the device busy
    /// too). A writer that finds staging already sealed by another meanwhile returns at once
    /// (sealing a few blocks would waste a record), without running `during`.
    pub(super) fn commit(&self, during: Option<&mut dyn FnMut()>) -> Result<()> {
        let io = self.lock_io_to_seal();
        {
            let st = self.lock();
            st.check_poisoned()?;
            if st.staging.entries() + 2 <= st.staging.limit && !st.staging.data_full() {
                return Ok(());
            }
        }
        self.write_out_pipelined_while(io, during)
    }

    /// `write_out` in the pipeline: seals what is staged and writes it, letting the io lock
    /// (`io`, taken with `lock_io_to_seal`) go during the write.
    pub(super) fn write_out_pipelined(&self, io: IoGuard<'_>) -> Result<()> {
        self.write_out_pipelined_while(io, None)
    }

    /// `write_out_pipelined`, running `during` while the record is in flight (not at all if
    /// nothing was staged). `during` runs with this record's write lock held: it may take the
    /// state lock, never the io lock.
    fn write_out_pipelined_while(&self, mut io: IoGuard<'_>, during: Option<&mut dyn FnMut()>) -> Result<()> {
        let Some(mut st) = self.staged_with_room(&mut io)? else { return Ok(()) };
        if self.record_writer.load(Ordering::Relaxed) && !st.has_unclaimed_record() {
            // Handoff: the record writer thread writes it, and this writer goes on at once
            // (a lone writer waited for about one record write per request otherwise: 0.57-0.70
            // of the raw device at queue depth 1, issue 13). Its data is served from the record
            // buffer meanwhile, and whoever needs it written first writes it itself. One record
            // at most waits for the record writer to begin it: a seal behind that one writes
            // its own record, so many writers keep several record writes in flight, as the
            // pipeline lets them (one thread writing them one after another ran 16 writers of
            // 64 KiB at 0.60 of the raw device instead of 0.93).
            st.counters.handed_off_records += 1;
            drop(self.seal_staging(&mut st, false));
            drop(st);
            drop(io);
            self.wake_record_writer();
            return self.checkpoint_if_due();
        }
        // (Only a record written alone: with others in flight the device has work queued
        // anyway, and staging meanwhile, contended by the other writers, held this record's
        // buffer past its write, leaving fewer in flight: 16 writers of 1 MiB went from 0.81
        // of the raw device to 0.78.)
        // (A record handed off and not begun is no write in progress.)
        let alone = st.inflight.iter().all(|r| r.done.is_some() || !r.claimed);
        let during = during.filter(|_| alone);
        st.counters.staged_during_record_writes += u64::from(during.is_some());
        self.seal_and_write(st, io, false, during)?;
        self.checkpoint_if_due()
    }

    /// A checkpoint, if the log written since the last one calls for it (io lock not held).
    pub(super) fn checkpoint_if_due(&self) -> Result<()> {
        if self.checkpoint_due() {
            let _io = self.lock_io();
            if self.checkpoint_due() {
                self.checkpoint_locked()?;
            }
        }
        Ok(())
    }

    /// Writes the oldest record handed off whose write nobody has begun (the record writer
    /// thread's work; `by_waiter`: a thread that needs it written, which writes it rather
    /// than wait). Returns whether there was one; an error is that record's failed write
    /// (the volume is poisoned).
    pub(super) fn write_handed_off_record(&self, by_waiter: bool) -> Result<bool> {
        let writing: Arc<Mutex<()>>;
        let write;
        let (position, blocks, buf) = {
            let mut st = self.lock();
            let Some(r) = st.inflight.iter_mut().find(|r| !r.claimed) else { return Ok(false) };
            writing = Arc::clone(&r.writing);
            // Claimed with its lock taken in one step under the state lock, so a waiter never
            // finds it claimed and unlocked (it would take the lock, find the write not done
            // and spin). A try that cannot fail: nobody takes an unclaimed record's lock.
            write = lock_order::try_ranked(self.lock_owner(), lock_order::Rank::Record, || writing.try_lock().ok())
                .expect("an unclaimed record's lock is free");
            r.claimed = true;
            let claim = (r.position, r.blocks, Arc::clone(&r.buf));
            st.counters.handed_off_records_written_by_waiters += u64::from(by_waiter);
            claim
        };
        let written = self.write_sealed(Sealed { position, blocks, buf, writing: Arc::clone(&writing) }, None);
        drop(write);
        written.map(|()| true)
    }

    /// Seals the staging buffer into a record and writes it at the tail, reclaiming space
    /// first if needed. Called with the io lock held and no record write in progress
    /// (`lock_io`; `io` is the lock's content).
    pub(super) fn write_out(&self, io: &mut IoBuffers) -> Result<()> {
        debug_assert!(
            self.oldest_record_writing().is_none() || sabotaged!(self, FlushIgnoresRecordPipeline),
            "write_out with a record write in progress"
        );
        let Some(mut st) = self.staged_with_room(io)? else { return Ok(()) };
        let sealed = self.seal_staging(&mut st, true);
        drop(st);
        self.write_sealed(sealed, None)?;
        if self.checkpoint_due() {
            self.checkpoint_locked()?;
        }
        Ok(())
    }

    /// Whether the log written since the last checkpoint calls for another.
    fn checkpoint_due(&self) -> bool {
        let st = self.lock();
        st.tail - st.checkpoint_position > self.layout.log_blocks * self.options.checkpoint_interval_permille / 1000
    }

    /// Writes a sealed record, then marks it written; the records written so far in
    /// sequence order enter the index (`install_record`: a record written before an older
    /// one waits in flight for it).
    fn write_sealed(&self, sealed: Sealed, during: Option<&mut dyn FnMut()>) -> Result<()> {
        let Sealed { position, blocks, buf, writing: _ } = sealed;
        let result = self.write_log(position, &buf[..blocks as usize * self.bs], during);
        drop(buf);
        let ok = result.is_ok();
        // (On failure the record stays in flight: reads keep seeing its data; nothing more
        // is written, and the records after it never enter the index.)
        let outcome = self.cache_io("writing a log record", result);
        let mut st = self.lock();
        let record = st.inflight.iter_mut().find(|r| r.position == position).expect("a sealed record is in flight");
        record.done = Some(ok);
        while st.inflight.front().is_some_and(|r| r.done == Some(true)) {
            let record = st.inflight.pop_front().expect("checked");
            self.install_record(&mut st, record);
        }
        self.check_invariants(&st);
        outcome
    }

    /// Waits for the oldest record write in progress to end (io lock held): the record
    /// buffer it holds is free afterwards, or the volume is poisoned.
    fn wait_for_oldest_record(&self) {
        // (A record handed off and not begun is written here; a failure poisons the volume,
        // which the caller sees.)
        if let Ok(true) = self.write_handed_off_record(true) {
            return;
        }
        if let Some(writing) = self.oldest_record_writing() {
            drop(self.lock_record_write(&writing));
        }
    }

    /// Fills the staging record's metadata (unlogged losses, queued MarkClean entries: the
    /// only kind queued) and makes room for it at the tail, reclaiming as needed, with a
    /// record buffer free. Returns the state guard with room for the record, or `None` if
    /// there is nothing to write.
    fn staged_with_room(&self, io: &mut IoBuffers) -> Result<Option<StateGuard<'_>>> {
        loop {
            let mut st = self.lock();
            st.check_poisoned()?;
            self.stage_record_meta(&mut st);
            if st.staging.is_empty() {
                return Ok(None);
            }
            if st.spare_bufs.is_empty() {
                // The pipeline is full: the oldest record write frees a buffer.
                drop(st);
                self.wait_for_oldest_record();
                continue;
            }
            let blocks = 1 + st.staging.data.len() as u64;
            let need = blocks + self.reclaim_reserve();
            if st.tail + need <= st.head + self.layout.log_blocks {
                return Ok(Some(st));
            }
            drop(st);
            // Reclaim and its checkpoint need the log quiet.
            self.drain_records();
            self.reclaim(io, need)?;
        }
    }

    /// Fills the staging record's metadata: unlogged losses, then queued MarkClean entries
    /// (the only kind queued), while room is left.
    fn stage_record_meta(&self, st: &mut State) {
        self.stage_lost_entries(st);
        while st.staging.entries() < st.staging.limit {
            match st.pending_meta.pop_front() {
                Some(m) => st.staging.meta.push(m),
                None => break,
            }
        }
    }

    /// Called while this thread's own record write is in flight (its record lock held, so it
    /// may wait for nothing that waits for that write): seals what is staged and writes it
    /// too, running `during` meanwhile, if that needs no waiting: the io lock free, a record
    /// buffer spare and room at the tail without a reclaim. So a lone writer of a request
    /// larger than a record keeps two of its records in flight at once, as a raw device
    /// takes the whole request in one I/O. Returns whether it wrote a record.
    pub(super) fn try_commit_nested(&self, during: &mut dyn FnMut()) -> Result<bool> {
        // (A try: this thread holds a record lock, and a holder of the io lock may be
        // waiting for that record's write.)
        let Some(io) = self.try_lock_io_to_seal() else { return Ok(false) };
        let mut st = self.lock();
        st.check_poisoned()?;
        self.stage_record_meta(&mut st);
        if st.staging.is_empty() || !self.seals_without_waiting(&st) {
            // (Metadata moved in stays staged for the next record.)
            return Ok(false);
        }
        st.counters.nested_record_writes += 1;
        self.seal_and_write(st, io, true, Some(during)).map(|()| true)
    }

    /// Whether staging can be sealed now with nothing to wait for: a record buffer spare and
    /// room at the tail for its record and reclaim's reserve, without a reclaim (the tries of
    /// `try_commit_nested` and `try_hand_off_staging`; `staged_with_room` waits for both).
    fn seals_without_waiting(&self, st: &State) -> bool {
        let blocks = 1 + st.staging.data.len() as u64;
        !st.spare_bufs.is_empty() && st.tail + blocks + self.reclaim_reserve() <= st.head + self.layout.log_blocks
    }

    /// Writes what is staged now, in a record of its own and without a cache flush, where
    /// that waits for nothing: the io lock free, no record write in progress, a write staged,
    /// a record buffer spare and room at the tail without a reclaim. Returns whether it wrote
    /// a record.
    ///
    /// Why. A database commits at queue depth 1 as "write, FLUSH, write, FLUSH". Staged, the
    /// write is acknowledged at once, and its FLUSH then writes the record and flushes the
    /// cache device, one I/O after the other, after the client's round trip. A frontend that
    /// sees a client commit that way calls this right after acknowledging the write
    /// (`tiercache_frontend::CommitPattern`): the record write overlaps the round trip, and the
    /// FLUSH, which waits for record writes in progress (`lock_io`), only flushes. Through NBD
    /// with a libnbd client, write + FLUSH went from 0.63-0.71 of pwrite + fdatasync on a raw
    /// file to 0.71-0.80 (`bench/nbd-roundtrip.py`); through FUSE, ext4's fdatasync by one
    /// committer from 0.58-0.66 of a raw loop device to 0.70-0.78. Where no FLUSH follows, the cost is a
    /// record header per call, so a frontend calls it only after a pattern of commits.
    ///
    /// Nothing here differs from a record sealed because staging filled (`commit`): durable
    /// only once a FLUSH covers it, and a checkpoint it makes due is taken here, after the
    /// write. (Left to the FLUSH, it was never taken: that FLUSH finds nothing staged, and
    /// `write_out` looks for a due checkpoint only after a record; with no background thread,
    /// a loop of write, write ahead, FLUSH let the log past the checkpoint grow to the whole
    /// log: `adversarial_write_ahead.rs`.)
    pub fn write_ahead(&self) -> Result<bool> {
        let Some(io) = self.try_lock_io_to_seal() else { return Ok(false) };
        let mut st = self.lock();
        st.check_poisoned()?;
        if !st.staging.has_dirty() || st.inflight.iter().any(|r| r.done.is_none()) {
            return Ok(false);
        }
        self.stage_record_meta(&mut st);
        if !self.seals_without_waiting(&st) {
            // (Metadata moved in stays staged for the next record.)
            return Ok(false);
        }
        st.counters.records_written_ahead += 1;
        self.seal_and_write(st, io, false, None)?;
        self.checkpoint_if_due()?;
        Ok(true)
    }

    /// For a reader whose admissions filled staging: seals it and hands the record to the
    /// record writer thread, if that needs no waiting: a record writer, the io lock free, no
    /// record handed off and not yet begun, a record buffer spare and room at the tail
    /// without a reclaim. Returns whether it did. (Waking the background thread to seal it
    /// instead left staging full until that thread ran: on a 2-core machine busy with the
    /// readers themselves, nbdcopy's cold read of 768 MiB into a 1 GiB cache admitted 15 %
    /// of it, the rest refused as `bypassed_blocks_busy`.)
    pub(super) fn try_hand_off_staging(&self) -> bool {
        if !self.record_writer.load(Ordering::Relaxed) {
            return false;
        }
        // (A try: a reader never waits for the log writer's lock.)
        let Some(io) = self.try_lock_io_to_seal() else { return false };
        let mut st = self.lock();
        if st.check_poisoned().is_err() || !st.staging.data_full() || st.has_unclaimed_record() {
            return false;
        }
        self.stage_record_meta(&mut st);
        if !self.seals_without_waiting(&st) {
            // (Metadata moved in stays staged for the next record.)
            return false;
        }
        st.counters.handed_off_records += 1;
        st.counters.handed_off_by_readers += 1;
        drop(self.seal_staging(&mut st, false));
        drop(st);
        drop(io);
        self.wake_record_writer();
        if self.checkpoint_due() {
            // (The background thread writes it: a reader never waits for the log.)
            self.wake_background();
        }
        true
    }

    /// Seals staging (`st`, room made) and writes the record in the pipeline: its record lock
    /// is taken before the io lock (`io`) is let go, so that whoever takes the io lock next
    /// and needs the log quiet waits for this write (`drain_records`). `nested`: this thread
    /// already holds another record's lock (`try_commit_nested`); the new one is taken by a
    /// try, which cannot fail, since only holders of the io lock (this thread) wait on record
    /// locks.
    fn seal_and_write(
        &self,
        mut st: StateGuard<'_>,
        io: IoGuard<'_>,
        nested: bool,
        during: Option<&mut dyn FnMut()>,
    ) -> Result<()> {
        let sealed = self.seal_staging(&mut st, true);
        drop(st);
        let writing = Arc::clone(&sealed.writing);
        let write = if nested {
            lock_order::try_ranked(self.lock_owner(), lock_order::Rank::Record, || writing.try_lock().ok())
                .expect("a record just sealed is unlocked")
        } else {
            self.lock_record_write(&writing)
        };
        drop(io);
        let written = self.write_sealed(sealed, during);
        drop(write);
        written
    }

    /// The header of the next record at the tail, naming `head_position` as the head and
    /// carrying `entries` (shared by the record writer and reclaim).
    pub(super) fn record_header(&self, st: &State, head_position: u64, entries: Vec<RecordEntry>) -> RecordHeader {
        RecordHeader {
            sequence: st.next_seq,
            position: st.tail,
            head_position,
            prev_checksum: st.last_header_crc,
            epoch: st.epoch,
            durable_back: RecordHeader::durable_back_for(st.next_seq, st.durable_seq),
            entries,
        }
    }

    /// A record of `blocks` blocks whose header checksum is `crc` now follows at the tail.
    pub(super) fn advance_tail(st: &mut State, blocks: u64, crc: u32) {
        st.tail += blocks;
        st.next_seq += 1;
        st.last_header_crc = crc;
    }

    /// Seals staging into a record at the tail: encodes its header, swaps the buffer out for
    /// a spare one (staging starts empty) and adds it to the records in flight, which reads
    /// are served from until it is in the index. `claimed`: the caller writes it (else it is
    /// handed off, for the record writer or whoever needs it written first).
    fn seal_staging(&self, st: &mut State, claimed: bool) -> Sealed {
        let bs = self.bs;
        let blocks = 1 + st.staging.data.len() as u64;
        let position = st.tail;
        // Metadata first: a MarkClean or Lost entry was queued before any data of the same
        // block staged after it, and replay applies entries in order.
        let entries = st
            .staging
            .meta
            .iter()
            .copied()
            .chain(st.staging.data.iter().map(|&(b, kind, crc)| RecordEntry {
                kind,
                backing_block: b,
                data_crc: crc,
                ref_position: 0,
            }))
            .collect();
        let header = self.record_header(st, st.head, entries);
        let crc = header.encode(self.uuid_low, &mut st.staging.buf[..bs]);
        let losses = header.entries.iter().filter(|e| e.kind == EntryKind::Lost).map(|e| e.backing_block).collect();
        let fresh = st.spare_bufs.pop().expect("staged_with_room leaves a record buffer free");
        let buf = Arc::new(std::mem::replace(&mut st.staging.buf, fresh));
        // The containers swap with a written record's (recycled, so usually no allocation).
        let (spare_data, spare_map) = (std::mem::take(&mut st.spare_data), std::mem::take(&mut st.spare_map));
        let data = std::mem::replace(&mut st.staging.data, spare_data);
        let map = std::mem::replace(&mut st.staging.map, spare_map);
        let has_trims = st.staging.meta.iter().any(|m| m.kind == EntryKind::Trim);
        st.staging.meta.clear();
        st.staging.first_staged_ns = None;
        // The staged Trims are sealed with the data they came with.
        st.around.trim_with_data.clear();
        if st.inflight.iter().any(|r| r.done.is_none() && r.claimed) {
            // (Not behind a record handed off whose write nobody has begun.)
            st.counters.overlapped_record_writes += 1;
        }
        let writing = Arc::new(Mutex::new(()));
        st.inflight.push_back(Inflight {
            position,
            blocks,
            buf: Arc::clone(&buf),
            data,
            map,
            losses,
            writing: Arc::clone(&writing),
            done: None,
            claimed,
        });
        Self::advance_tail(st, blocks, crc);
        st.sealed += 1;
        if has_trims {
            st.trims_sealed = st.sealed;
        }
        let now = self.clock.now_ns();
        if st.age_samples.back().is_none_or(|&(_, t)| now >= t.saturating_add(AGE_SAMPLE_INTERVAL_MS * 1_000_000)) {
            if st.age_samples.len() == AGE_SAMPLES {
                st.age_samples.pop_front();
            }
            st.age_samples.push_back((position, now));
        }
        debug_assert!(
            st.tail + self.reclaim_reserve() <= st.head + self.layout.log_blocks,
            "the reclaim reserve stays free"
        );
        Sealed { position, blocks, buf, writing }
    }

    /// The read count a copy enters the index with (the eviction policy, reclaim.rs): a
    /// rewrite keeps the count of the copy it replaces (a hot block stays hot when written);
    /// a read miss admitted clean starts at one if reclaim evicted the block lately (the
    /// ghost queue: a re-reference the cache lost), so reclaim keeps it once even if it is
    /// not read again before the head reaches it; any other miss starts at zero.
    /// Reads while it waited in staging or in flight do not count: they follow the miss
    /// closely (the same request burst), the correlated references 2Q ignores, and counting
    /// them made the shared traces miss more (ARCHITECTURE.md, the read cache).
    /// A block a preload staged enters hot, with the highest count.
    fn freq_at_install(st: &mut State, block: u64, dirty: bool) -> u8 {
        if st.hot_on_install.remove(&block) {
            return FREQ_MAX;
        }
        match st.index.get(block) {
            Some(old) if dirty => old.freq,
            // (With the probation ring, a ghost's miss has already earned the log by skipping
            // the ring: it enters at zero, as S3-FIFO's main queue takes it.)
            _ if !dirty && !st.probation.enabled() && st.ghosts.contains(block) => 1,
            _ => 0,
        }
    }

    /// A record was written, and every record before it: its blocks enter the index, losses
    /// it logged or superseded are settled, and its buffer and containers go back to the
    /// spares.
    fn install_record(&self, st: &mut State, record: Inflight) {
        let Inflight { position: pos, blocks, buf, mut data, mut map, losses, .. } = record;
        st.written_tail = pos + blocks;
        // (The search for a dense dirty segment stops at records in flight; this one's
        // entries are in the index from now, so it is looked at again: `dense_dirty_from`.)
        st.dense_dirty_from = st.dense_dirty_from.min(pos);
        for e in losses {
            if let Some(l) = st.lost.get_mut(&e) {
                if l.logged == Logged::Staged {
                    l.logged = Logged::Yes;
                }
            }
        }
        for (k, &(block, kind, crc)) in data.iter().enumerate() {
            if map.get(&block) == Some(&k) {
                let slot = self.layout.slot(pos + 1 + k as u64);
                let dirty = kind == EntryKind::DataDirty;
                let freq = Self::freq_at_install(st, block, dirty);
                st.index.insert(block, IndexEntry { slot, dirty, freq, crc });
                if kind == EntryKind::DataDirty {
                    // Newer data of a lost block is now in a written record: the loss is over,
                    // and no Lost entry for it may be written after this record.
                    st.lost.remove(&block);
                }
            }
        }
        st.counters.records_written += 1;
        data.clear();
        map.clear();
        st.spare_data = data;
        st.spare_map = map;
        st.spare_bufs.push(Arc::try_unwrap(buf).expect("no other owner of a written record buffer"));
    }
}
