//! The read path: each block from staging, the record being written, the cache device
//! (checksum-verified, then confirmed still current under the lock) or the backing device
//! (misses, admitted into staging as clean blocks when the request is small). Cached blocks
//! in consecutive log slots are read with one I/O per run, misses in runs of consecutive
//! blocks; a reader never waits for the admission of what it read.

use super::*;
use admission::Route;

/// Whether a read's misses are admitted, and if not, why (counted by reason).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Admit {
    /// As the policy decides. `scan`: the read continues a sequential stream past
    /// `SEQUENTIAL_REREAD_BYTES` (admitted only with the sequential bypass off or higher):
    /// its misses of ghosts are no sign of reuse either (`route`).
    Yes {
        scan: bool,
    },
    /// Into the log whatever the policy (preload: the blocks are hot by request, and a copy
    /// in the probation ring would only be dropped at its next lap).
    Log,
    No(Bypass),
    /// Not at all, and not counted: the read of a read-modify-write (`write_bytes`), whose
    /// write replaces the block at once.
    Never,
}

#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Bypass {
    /// The read is larger than `admit_max_request_bytes`.
    Size,
    /// The read continues a long sequential stream.
    Sequential,
}

/// Where a block's data was found when a read was planned.
pub(super) enum Source {
    /// Copied from staging or the record in flight, under the lock.
    Copied,
    /// The index entry and its log position.
    Cache(IndexEntry, u64),
    /// A copy in the probation ring (`probation.rs`), and whether this read counts as a read
    /// of it for the eviction policy.
    Probation(IndexEntry, bool),
    Backing,
}

/// Reads of at least this many blocks warm the index's memory for their lookups first
/// (`Index::warm`).
const WARM_INDEX_BLOCKS: usize = 16;

impl Volume {
    /// Reads whole blocks: the newest completed write of each.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.read_admitting(offset, buf, true)
    }

    /// `read`, admitting the misses as the policy says, or (`admits` false) not at all.
    pub(super) fn read_admitting(&self, offset: u64, buf: &mut [u8], admits: bool) -> Result<()> {
        self.check_request(offset, buf.len() as u64)?;
        let first = offset / self.bs as u64;
        let (plan, admit, moves) = self.plan_read(first, buf)?;
        let admit = if admits { admit } else { Admit::Never };
        let backing_result = self.read_backing_runs(first, &plan, buf);
        let mut retry = self.read_cache_runs(&plan, buf);
        retry.extend(self.read_probation_copies(&plan, buf));
        self.admit_and_confirm(first, &plan, buf, admit, backing_result.is_ok(), Some(moves), &mut retry);
        self.write_or_hand_off_probation();
        backing_result?;
        let bs = self.bs;
        for i in retry {
            self.read_block_again(first + i as u64, &mut buf[i * bs..(i + 1) * bs])?;
        }
        self.commit_if_staging_full();
        Ok(())
    }

    /// Plans a read under the lock: copies what is in RAM (staging, the record in flight),
    /// notes where the rest lives, and registers the misses as fills (a write of the block,
    /// or its loss, or a TRIM, meanwhile cancels its admission).
    /// Also decides whether this read's misses are admitted: not if the read is larger than
    /// the admission limit, nor if it continues a sequential stream that had already read
    /// `sequential_bypass_bytes` (`streams.rs`); `admit_and_confirm` counts what is left out.
    /// Returns the plan, the admission decision and the index's `moves` at planning.
    fn plan_read(&self, first: u64, buf: &mut [u8]) -> Result<(Vec<Source>, Admit, u64)> {
        let bs = self.bs;
        let nblocks = buf.len() / bs;
        let mut plan: Vec<Source> = Vec::with_capacity(nblocks);
        let mut st = self.lock();
        st.counters.read_requests += 1;
        // (The read table keeps no time: only write streams go idle, `Streams::for_writes`.)
        let streamed = st.streams.note(first, nblocks as u64, 0) * bs as u64;
        // (A long sequential stream's hits are not re-reads for the eviction policy.)
        let counts_as_reads = streamed < SEQUENTIAL_REREAD_BYTES;
        if nblocks >= WARM_INDEX_BLOCKS {
            st.index.warm(first..first + nblocks as u64);
        }
        for i in 0..nblocks {
            let block = first + i as u64;
            let out = &mut buf[i * bs..(i + 1) * bs];
            if let Some(&k) = st.staging.map.get(&block) {
                out.copy_from_slice(st.staging.block(k, bs));
                plan.push(Source::Copied);
                st.counters.read_hit_blocks += 1;
            } else if let Some(data) = st.in_flight(block, bs) {
                out.copy_from_slice(data);
                plan.push(Source::Copied);
                st.counters.read_hit_blocks += 1;
            } else if st.lost.contains_key(&block) {
                // Staging and the record in flight (newer data) were looked at first.
                for (j, src) in plan.iter().enumerate() {
                    if matches!(src, Source::Backing) {
                        st.end_fill(first + j as u64);
                    }
                }
                return Err(EngineError::LostBlock { block });
            } else if let Some(e) = st.index.get(block) {
                if counts_as_reads {
                    st.index.touch(block);
                }
                let position = self.position_of(&st, &e);
                plan.push(Source::Cache(e, position));
                st.counters.read_hit_blocks += 1;
            } else if let found @ (probation::Found::Copied | probation::Found::Ring(_)) = st.probation.find(block, out)
            {
                plan.push(match found {
                    probation::Found::Ring(e) => Source::Probation(e, counts_as_reads),
                    _ => Source::Copied,
                });
                st.counters.read_hit_blocks += 1;
            } else {
                st.fills.entry(block).or_insert((0, false)).0 += 1;
                plan.push(Source::Backing);
                st.counters.read_miss_blocks += 1;
            }
        }
        let bypass = self.options.sequential_bypass_bytes;
        let admit = if buf.len() as u64 > self.options.admit_max_request_bytes {
            Admit::No(Bypass::Size)
        } else if bypass > 0 && streamed >= bypass {
            Admit::No(Bypass::Sequential)
        } else {
            Admit::Yes { scan: !counts_as_reads }
        };
        st.admission.note_reads(first..first + nblocks as u64, counts_as_reads, matches!(admit, Admit::Yes { .. }));
        Ok((plan, admit, st.index.moves()))
    }

    /// Reads the misses from the backing device, merged into runs of consecutive blocks, all
    /// runs in flight together (`BlockDevice::read_batch`).
    pub(super) fn read_backing_runs(&self, first: u64, plan: &[Source], buf: &mut [u8]) -> Result<()> {
        let bs = self.bs;
        let mut ranges: Vec<ReadRange<'_>> = Vec::new();
        let mut rest = buf;
        let mut at = 0;
        let mut i = 0;
        while i < plan.len() {
            if !matches!(plan[i], Source::Backing) {
                i += 1;
                continue;
            }
            let start = i;
            while i < plan.len() && matches!(plan[i], Source::Backing) {
                i += 1;
            }
            take(&mut rest, (start - at) * bs);
            let run = take(&mut rest, (i - start) * bs);
            at = i;
            ranges.push(ReadRange { offset: (first + start as u64) * bs as u64, bufs: vec![run] });
        }
        self.backing.read_batch(&mut ranges).into_iter().try_for_each(|r| r.map_err(EngineError::backing))
    }

    /// Reads the cache hits: one I/O per run of the request's blocks in ascending log slots,
    /// whatever their order in the request (concurrent writers interleave their requests in
    /// the log, so a large read's blocks lie in a few stretches of slots, not always in its
    /// own order: each block's buffer goes where its slot falls in the scatter read). A run
    /// reads through gaps of up to `MAX_GAP_SLOTS` slots, `MAX_SKIPPED_SLOTS` in all (record
    /// headers, a few blocks of other requests) into scratch blocks, so it is one I/O however
    /// many records it spans. All runs are in flight together (`BlockDevice::read_batch`),
    /// and each block is verified on its own. Returns the blocks to read again (I/O error or
    /// checksum failure).
    fn read_cache_runs(&self, plan: &[Source], buf: &mut [u8]) -> Vec<usize> {
        let bs = self.bs;
        if let Some((k, n, slot)) = one_piece(plan).filter(|p| p.1 <= VERIFY_CHUNK_BLOCKS) {
            // (The common case, a request whose hits lie in consecutive slots in its own
            // order: one read straight into its place, nothing to sort or allocate.)
            let read = self.cache.read_at(self.layout.log_offset(u64::from(slot)), &mut buf[k * bs..(k + n) * bs]);
            return self.unverified(plan, buf, k..k + n, read.is_ok()).collect();
        }
        // The hits in slot order, then the runs: ranges of `hits` and the slots each skips.
        let mut hits: Vec<(u32, usize)> = plan
            .iter()
            .enumerate()
            .filter_map(|(k, src)| match src {
                Source::Cache(e, _) => Some((e.slot, k)),
                _ => None,
            })
            .collect();
        if hits.is_empty() {
            return Vec::new();
        }
        hits.sort_unstable();
        // (A large read's runs end every `VERIFY_CHUNK_BLOCKS` slots, so that its first pieces
        // are verified while the last are read.)
        let chunk = if hits.len() > VERIFY_CHUNK_BLOCKS { VERIFY_CHUNK_BLOCKS } else { usize::MAX };
        let mut runs: Vec<(std::ops::Range<usize>, usize)> = Vec::new();
        let mut start = 0;
        let mut skipped = 0;
        for j in 1..=hits.len() {
            // (Two hits never share a slot: the index maps a slot to one block.)
            let gap = hits.get(j).map(|h| h.0.saturating_sub(hits[j - 1].0 + 1) as usize);
            let fits = |g: usize| j - start + skipped + g < chunk;
            match gap {
                Some(0) if hits[j].0 > hits[j - 1].0 && fits(0) => {}
                Some(g) if g > 0 && g <= MAX_GAP_SLOTS && skipped + g <= MAX_SKIPPED_SLOTS && fits(g) => skipped += g,
                _ => {
                    runs.push((start..j, skipped));
                    start = j;
                    skipped = 0;
                }
            }
        }
        // The pieces: stretches of a run whose blocks follow each other in the request too
        // (one buffer each; the whole run where the layout is sequential), as (first block,
        // blocks, first slot, slots skipped before it), in slot order; each run's are
        // `pieces[run_pieces[r]]`.
        let mut pieces: Vec<(usize, usize, u32, usize)> = Vec::new();
        let mut run_pieces: Vec<std::ops::Range<usize>> = Vec::with_capacity(runs.len());
        for (run, _) in &runs {
            let from = pieces.len();
            for j in run.clone() {
                let (slot, k) = hits[j];
                let joins = j > run.start && slot == hits[j - 1].0 + 1 && k == hits[j - 1].1 + 1;
                if joins {
                    pieces.last_mut().expect("a piece to extend").1 += 1;
                } else {
                    let skipped = if j > run.start { (slot - hits[j - 1].0 - 1) as usize } else { 0 };
                    pieces.push((k, 1, slot, skipped));
                }
            }
            run_pieces.push(from..pieces.len());
        }
        // Pieces whose checksums were verified as they arrived, and their blocks that failed.
        let mut verified = vec![false; pieces.len()];
        let mut mismatched: Vec<usize> = Vec::new();
        let results = {
            let scratch_blocks: usize = runs.iter().map(|r| r.1).sum();
            let mut scratch = (scratch_blocks > 0).then(|| AlignedBuf::new(scratch_blocks * bs));
            let mut scratch = scratch.iter_mut().flat_map(|s| s.chunks_mut(bs));
            let mut slices = carve(buf, bs, pieces.iter().map(|p| (p.0, p.1)));
            let mut ranges: Vec<ReadRange<'_>> = Vec::with_capacity(runs.len());
            for ps in &run_pieces {
                let mut bufs: Vec<&mut [u8]> = Vec::with_capacity(2 * ps.len());
                for p in ps.clone() {
                    for _ in 0..pieces[p].3 {
                        bufs.push(scratch.next().expect("a scratch block per skipped slot"));
                    }
                    bufs.push(slices[p].take().expect("each piece in one run"));
                }
                ranges.push(ReadRange { offset: self.layout.log_offset(u64::from(pieces[ps.start].2)), bufs });
            }
            if ranges.len() > 1 {
                self.lock().counters.batched_cache_reads += 1;
            }
            // Each run's pieces verified as the run arrives: its buffers are, per piece, the
            // scratch blocks skipped before it, then the piece.
            let mut verify = |r: usize, range: &ReadRange<'_>, read: &tiercache_device::Result<()>| {
                if read.is_err() {
                    return;
                }
                let mut bufs = range.bufs.iter();
                for p in run_pieces[r].clone() {
                    let (k, n, _, skipped) = pieces[p];
                    let piece = bufs.nth(skipped).expect("a buffer per piece");
                    for (j, data) in piece.chunks(bs).enumerate().take(n) {
                        let Source::Cache(e, _) = plan[k + j] else { unreachable!("a piece holds cache hits only") };
                        if checksum(data) != e.crc {
                            mismatched.push(k + j);
                        }
                    }
                    verified[p] = true;
                }
            };
            self.cache.read_batch_each(&mut ranges, &mut verify)
        };
        // A run read through skipped slots that failed: its pieces again, each on its own,
        // before any block goes to the one-block slow path (a bad sector in a slot read only
        // as scratch, a dead one, must not cost every read nearby a read per block).
        let mut piece_ok: Vec<bool> = vec![true; pieces.len()];
        let again: Vec<usize> = runs
            .iter()
            .zip(&run_pieces)
            .zip(&results)
            .filter(|((run, _), read)| read.is_err() && run.1 > 0)
            .flat_map(|((_, ps), _)| ps.clone())
            .collect();
        for ((_, ps), read) in runs.iter().zip(&run_pieces).zip(&results) {
            if read.is_err() {
                ps.clone().for_each(|p| piece_ok[p] = false);
            }
        }
        if !again.is_empty() {
            let mut slices = carve(buf, bs, again.iter().map(|&p| (pieces[p].0, pieces[p].1)));
            let mut ranges: Vec<ReadRange<'_>> = again
                .iter()
                .zip(slices.iter_mut())
                .map(|(&p, slice)| ReadRange {
                    offset: self.layout.log_offset(u64::from(pieces[p].2)),
                    bufs: vec![slice.take().expect("each piece once")],
                })
                .collect();
            for (&p, read) in again.iter().zip(self.cache.read_batch(&mut ranges)) {
                piece_ok[p] = read.is_ok();
            }
        }
        let mut retry: Vec<usize> = mismatched;
        for (p, &(k, n, _, _)) in pieces.iter().enumerate() {
            if !verified[p] {
                retry.extend(self.unverified(plan, buf, k..k + n, piece_ok[p]));
            }
        }
        retry
    }

    /// The blocks of `blocks` (all cache hits of `plan`, read into `buf`) to read again: all
    /// of them if their read failed, else those whose checksum does not match.
    fn unverified<'a>(
        &self,
        plan: &'a [Source],
        buf: &'a [u8],
        blocks: std::ops::Range<usize>,
        read_ok: bool,
    ) -> impl Iterator<Item = usize> + 'a {
        let bs = self.bs;
        blocks.filter(move |&k| !read_ok || mismatch(plan, k, &buf[k * bs..(k + 1) * bs]))
    }

    /// Under the lock: admits the misses read (if `admit`, no write or loss cancelled the
    /// fill, and the block is not lost), and confirms each cache hit is still current, adding
    /// those that are not to `retry` (a slot can hold another copy of the same block a lap
    /// later; a position cannot, so "still current" is "the index names the same position").
    /// `planned_moves`, the index's `moves` when the plan was made: if no entry has been
    /// replaced or removed since, every hit is still current without a lookup per block (a
    /// hit's position changes only with its entry: the tail cannot lap a live entry's slot
    /// before reclaim has moved or evicted it).
    #[allow(clippy::too_many_arguments)]
    pub(super) fn admit_and_confirm(
        &self,
        first: u64,
        plan: &[Source],
        buf: &[u8],
        admit: Admit,
        read_ok: bool,
        planned_moves: Option<u64>,
        retry: &mut Vec<usize>,
    ) {
        let bs = self.bs;
        let mut st = self.lock();
        let hits_current = planned_moves == Some(st.index.moves());
        let now = self.clock.now_ns();
        for (i, src) in plan.iter().enumerate() {
            let block = first + i as u64;
            match src {
                Source::Backing => {
                    let cancelled = st.end_fill(block);
                    if read_ok && !cancelled && !st.lost.contains_key(&block) && st.around.admissible(block) {
                        // (Counted by reason only where admission would have taken it.)
                        // A block evicted lately enters the log; any other, the probation
                        // ring, where it must be read again to earn the log (`admission.rs`).
                        let route = match admit {
                            Admit::Yes { scan } if st.probation.enabled() => self.route(&st, block, scan),
                            _ => Route::Log,
                        };
                        match admit {
                            Admit::Yes { .. } if matches!(route, Route::Ring | Route::RingRefused) => {
                                if st.probation.gather(block, &buf[i * bs..(i + 1) * bs]) {
                                    st.counters.admitted_blocks += 1;
                                    st.counters.probation_admitted_blocks += 1;
                                    st.counters.gate_refused_blocks += u64::from(route == Route::RingRefused);
                                } else {
                                    st.counters.probation_busy_blocks += 1;
                                }
                            }
                            Admit::Yes { .. } | Admit::Log => {
                                let data = &buf[i * bs..(i + 1) * bs];
                                if st.staging.put(block, EntryKind::DataClean, data, checksum(data), now) {
                                    st.counters.admitted_blocks += 1;
                                    st.counters.filling_admitted_blocks += u64::from(route == Route::LogFilling);
                                    st.probation.forget(block);
                                } else {
                                    st.counters.bypassed_blocks_busy += 1;
                                }
                            }
                            Admit::No(Bypass::Size) => st.counters.bypassed_blocks_size += 1,
                            Admit::No(Bypass::Sequential) => st.counters.bypassed_blocks_sequential += 1,
                            Admit::Never => {}
                        }
                    }
                }
                Source::Cache(..) if hits_current => {}
                Source::Cache(_, position) => {
                    let current = st.index.get(block).map(|c| self.position_of(&st, &c));
                    if current != Some(*position) && !retry.contains(&i) {
                        retry.push(i); // moved or evicted while we read: read again
                    }
                }
                Source::Probation(e, counts) => {
                    if retry.contains(&i) {
                        // Its read failed or its checksum did not match: if the ring still
                        // names that copy, the copy is bad. Forgotten, as the log forgets a
                        // bad clean copy (else every read of it would read it again).
                        if st.probation.still(block, e) {
                            st.probation.forget(block);
                            st.counters.repaired_blocks += 1;
                        }
                        continue;
                    }
                    match st.probation.confirm(block, e, *counts) {
                        None => retry.push(i), // evicted or forgotten while we read: read again
                        Some(true) => {
                            // Read again in the ring: into the log, with the data just checked.
                            let data = &buf[i * bs..(i + 1) * bs];
                            if st.staging.put(block, EntryKind::DataClean, data, e.crc, now) {
                                st.probation.forget(block);
                                st.counters.promoted_blocks += 1;
                            }
                        }
                        Some(false) => {}
                    }
                }
                Source::Copied => {}
            }
        }
    }

    /// Reads the hits in the probation ring, all in flight together; returns those to read
    /// again (I/O error or checksum failure: the slot may have been reused meanwhile).
    fn read_probation_copies(&self, plan: &[Source], buf: &mut [u8]) -> Vec<usize> {
        let bs = self.bs;
        let hits: Vec<(usize, u64, u32)> = plan
            .iter()
            .enumerate()
            .filter_map(|(k, src)| match src {
                Source::Probation(e, _) => Some((k, u64::from(e.slot), e.crc)),
                _ => None,
            })
            .collect();
        if hits.is_empty() {
            return Vec::new();
        }
        let results = {
            let mut slices = carve(buf, bs, hits.iter().map(|h| (h.0, 1)));
            let mut ranges: Vec<ReadRange<'_>> = hits
                .iter()
                .zip(slices.iter_mut())
                .map(|(h, slice)| ReadRange {
                    offset: self.layout.probation_block(h.1).expect("a ring") * bs as u64,
                    bufs: vec![slice.take().expect("each hit once")],
                })
                .collect();
            self.cache.read_batch(&mut ranges)
        };
        hits.iter()
            .zip(results)
            .filter(|((k, _, crc), read)| read.is_err() || checksum(&buf[k * bs..(k + 1) * bs]) != *crc)
            .map(|((k, _, _), _)| *k)
            .collect()
    }

    /// A full probation batch goes to the record writer thread where there is one, so that
    /// the reader whose admission filled it does not wait for a 256 KiB cache write (4 KiB
    /// random misses at QD1 over NBD: p99 354-485 us when readers wrote it, 81-117 us handed
    /// off). The reader writes it itself when there is no record writer, or when the record
    /// writer is behind (`batch_overdue`: half the slack beyond a full batch gathered too;
    /// past the slack admissions are dropped, `gather`).
    fn write_or_hand_off_probation(&self) {
        if self.record_writer.load(Ordering::Relaxed) {
            let behind = {
                let st = self.lock();
                if !st.probation.batch_full() {
                    return;
                }
                st.probation.batch_overdue()
            };
            if !behind {
                self.wake_record_writer();
                return;
            }
        }
        self.write_probation_if_full(false);
    }

    /// Writes the probation ring's batch if it is full (no lock held across the write; the
    /// batch is read from RAM meanwhile): by the reader that filled it, or by the record
    /// writer (`write_or_hand_off_probation`). One that finds a write in progress leaves it
    /// to its writer, and further admissions wait out (`gather`).
    pub(crate) fn write_probation_if_full(&self, by_record_writer: bool) {
        loop {
            let started = {
                let mut st = self.lock();
                if !st.probation.batch_full() {
                    return;
                }
                let st = &mut *st;
                let started = st.probation.start_write(&mut st.ghosts, &mut st.counters.probation_evicted_blocks);
                st.counters.probation_batches_by_record_writer += u64::from(by_record_writer && started.is_some());
                started
            };
            let Some((position, n, data)) = started else { return };
            let bs = self.bs;
            let ring = self.layout.probation_blocks;
            let first = (ring - position % ring).min(n as u64) as usize;
            let at = |pos: u64| self.layout.probation_block(pos).expect("a ring") * bs as u64;
            let mut written = self.cache.write_at(at(position), &data[..first * bs]);
            if written.is_ok() && first < n {
                written = self.cache.write_at(at(0), &data[first * bs..n * bs]);
            }
            if let Err(e) = &written {
                tracing::warn!(error = %e, "writing the probation ring failed; its batch is dropped (clean copies)");
            }
            drop(data); // (its buffer is the next batch's: `finish_write`)
            let mut st = self.lock();
            let st = &mut *st;
            st.probation.finish_write(written.is_ok(), &mut st.ghosts);
            #[cfg(any(debug_assertions, feature = "testing"))]
            st.probation.check();
        }
    }

    /// The slow path for one block whose cached copy moved or failed its checksum.
    fn read_block_again(&self, block: u64, out: &mut [u8]) -> Result<()> {
        let bs = self.bs;
        loop {
            let (entry, position) = {
                let st = self.lock();
                if let Some(&k) = st.staging.map.get(&block) {
                    out.copy_from_slice(st.staging.block(k, bs));
                    return Ok(());
                }
                if let Some(data) = st.in_flight(block, bs) {
                    out.copy_from_slice(data);
                    return Ok(());
                }
                if st.lost.contains_key(&block) {
                    return Err(EngineError::LostBlock { block });
                }
                match st.index.get(block) {
                    Some(e) => (e, self.position_of(&st, &e)),
                    None => {
                        drop(st);
                        return self.backing.read_at(block * bs as u64, out).map_err(EngineError::backing);
                    }
                }
            };
            let read = self.cache.read_at(self.layout.log_offset(u64::from(entry.slot)), out);
            let bad_dirty = read.is_ok() && entry.dirty && checksum(out) != entry.crc;
            // The check and what follows from it under the destage lock (`backing_holds`).
            // (This thread holds no other lock: reads are served outside all of them.)
            let _destage = bad_dirty.then(|| self.lock_destage());
            let on_backing = bad_dirty && self.backing_holds(block, entry.crc, out);
            let mut st = self.lock();
            let current = st.index.get(block).map(|c| (self.position_of(&st, &c), c.dirty));
            let newer_in_ram = st.staging.map.contains_key(&block) || st.is_in_flight(block);
            if current != Some((position, entry.dirty)) || newer_in_ram {
                // Moved, rewritten, or written back (now clean, by the batch waited for)
                // meanwhile: look again.
                continue;
            }
            if let Err(e) = read {
                // An I/O error is reported as such; the block is not declared lost for it.
                return Err(EngineError::cache(e));
            }
            let picked = Picked { block, entry, position };
            if on_backing {
                self.settle_bad_dirty_copy(&mut st, picked, true);
                return Ok(()); // `out` holds the backing device's copy, that very version
            }
            if !bad_dirty && checksum(out) == entry.crc {
                return Ok(());
            }
            if entry.dirty {
                // The only copy is bad: report, never serve.
                self.settle_bad_dirty_copy(&mut st, picked, false);
                return Err(EngineError::LostBlock { block });
            }
            // A bad clean copy: forget it and read the backing device (repair by re-admission
            // happens on a later miss). Its record still holds it, and where the medium is
            // good (the corruption was in transit) a crash brings it back as clean: like any
            // clean copy dropped without a record, it keeps the block from being written
            // around until the head passes it (`tests/write_around_after_a_bad_clean_copy.rs`:
            // written around, the new data read as the old copy after FLUSH and a power cut).
            st.around.dropped_without_record(block, position);
            st.index.remove(block);
            st.counters.repaired_blocks += 1;
            tracing::warn!(block, "clean block failed its checksum on the cache device; re-read from backing");
        }
    }

    /// Readers that filled staging with clean blocks write it out, so admission continues.
    /// With a record writer thread, the reader seals it and hands it off where that needs no
    /// waiting (`try_hand_off_staging`); else, with a background thread, that one is woken to
    /// write the record: a reader never waits for the admission of what it read (the staging
    /// buffer is swapped out at seal time, so admission goes on while the record is written).
    fn commit_if_staging_full(&self) {
        let full = {
            let st = self.lock();
            st.staging.data_full()
        };
        if full && !self.try_hand_off_staging() && !self.wake_background() {
            if let Some(mut io) = self.try_lock_io() {
                let _ = self.write_out(&mut io);
            }
        }
    }

    /// Reads any byte range (frontends whose clients may send sub-block requests): whole
    /// blocks are read and the requested bytes copied out.
    pub fn read_bytes(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let (start, end) = self.aligned_span(offset, buf.len() as u64)?;
        if start == offset && end == offset + buf.len() as u64 {
            return self.read(offset, buf);
        }
        let mut whole = vec![0u8; (end - start) as usize];
        self.read(start, &mut whole)?;
        let at = (offset - start) as usize;
        buf.copy_from_slice(&whole[at..at + buf.len()]);
        Ok(())
    }
}

/// Whether `data`, read for the request's block `k` (a cache hit of `plan`), fails its checksum.
fn mismatch(plan: &[Source], k: usize, data: &[u8]) -> bool {
    let Source::Cache(e, _) = plan[k] else { unreachable!("a piece holds cache hits only") };
    checksum(data) != e.crc
}

/// The request's cache hits when they are one piece: consecutive blocks of the request in
/// consecutive log slots, (first block, blocks, first slot).
fn one_piece(plan: &[Source]) -> Option<(usize, usize, u32)> {
    let mut piece: Option<(usize, usize, u32)> = None;
    for (k, src) in plan.iter().enumerate() {
        let Source::Cache(e, _) = src else { continue };
        piece = match piece {
            None => Some((k, 1, e.slot)),
            Some((k0, n, slot0)) if k == k0 + n && e.slot == slot0 + n as u32 => Some((k0, n + 1, slot0)),
            Some(_) => return None,
        };
    }
    piece
}

/// `buf` cut into the given disjoint (first block, blocks) pieces, in the order given.
fn carve(buf: &mut [u8], bs: usize, pieces: impl Iterator<Item = (usize, usize)>) -> Vec<Option<&mut [u8]>> {
    let pieces: Vec<(usize, usize)> = pieces.collect();
    let mut order: Vec<usize> = (0..pieces.len()).collect();
    order.sort_unstable_by_key(|&p| pieces[p].0);
    let mut slices: Vec<Option<&mut [u8]>> = (0..pieces.len()).map(|_| None).collect();
    let (mut rest, mut at) = (buf, 0);
    for p in order {
        let (k, n) = pieces[p];
        take(&mut rest, (k - at) * bs);
        slices[p] = Some(take(&mut rest, n * bs));
        at = k + n;
    }
    slices
}

/// Splits the first `n` bytes off `rest` (the buffers of a batch read are disjoint parts of
/// one request's buffer, handed out in order).
fn take<'a>(rest: &mut &'a mut [u8], n: usize) -> &'a mut [u8] {
    let (head, tail) = std::mem::take(rest).split_at_mut(n);
    *rest = tail;
    head
}
