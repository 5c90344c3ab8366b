//! The read path: each block from staging, the record being written, the cache device
//! (checksum-verified, then confirmed still current under the lock) or the backing device
//! (misses, admitted into staging as clean blocks when the request is small). Cached blocks
//! in consecutive log slots are read with one I/O per run, misses in runs of consecutive
//! blocks; a reader never waits for the admission of what it read.

use super::*;

/// Whether a read's misses are admitted, and if not, why (counted by reason).
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Admit {
    Yes,
    No(Bypass),
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
    Backing,
}

impl Volume {
    /// Reads whole blocks: the newest completed write of each.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check_request(offset, buf.len() as u64)?;
        let first = offset / self.bs as u64;
        let (plan, admit) = self.plan_read(first, buf)?;
        let backing_result = self.read_backing_runs(first, &plan, buf);
        let mut retry = self.read_cache_runs(&plan, buf);
        self.admit_and_confirm(first, &plan, buf, admit, backing_result.is_ok(), &mut retry);
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
    /// or its loss, meanwhile cancels its admission; a trim does not need to).
    /// Also decides whether this read's misses are admitted: not if the read is larger than
    /// the admission limit, nor if it continues a sequential stream that had already read
    /// `sequential_bypass_bytes` (`streams.rs`); `admit_and_confirm` counts what is left out.
    fn plan_read(&self, first: u64, buf: &mut [u8]) -> Result<(Vec<Source>, Admit)> {
        let bs = self.bs;
        let nblocks = buf.len() / bs;
        let mut plan: Vec<Source> = Vec::with_capacity(nblocks);
        let mut st = self.lock();
        st.counters.read_requests += 1;
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
                st.index.touch(block);
                let position = self.position_of(&st, &e);
                plan.push(Source::Cache(e, position));
                st.counters.read_hit_blocks += 1;
            } else {
                st.fills.entry(block).or_insert((0, false)).0 += 1;
                plan.push(Source::Backing);
                st.counters.read_miss_blocks += 1;
            }
        }
        let streamed = st.streams.note(first, nblocks as u64) * bs as u64;
        let bypass = self.options.sequential_bypass_bytes;
        let admit = if buf.len() as u64 > self.options.admit_max_request_bytes {
            Admit::No(Bypass::Size)
        } else if bypass > 0 && streamed >= bypass {
            Admit::No(Bypass::Sequential)
        } else {
            Admit::Yes
        };
        Ok((plan, admit))
    }

    /// Reads the misses from the backing device, merged into runs of consecutive blocks.
    pub(super) fn read_backing_runs(&self, first: u64, plan: &[Source], buf: &mut [u8]) -> Result<()> {
        let bs = self.bs;
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
            let offset = (first + start as u64) * bs as u64;
            self.backing.read_at(offset, &mut buf[start * bs..i * bs]).map_err(EngineError::backing)?;
        }
        Ok(())
    }

    /// Reads the cache hits: one I/O per run of blocks in ascending log slots with at most
    /// one slot between neighbours (a sequential write or admission put them there, the next
    /// record's header between two records' data), each block verified on its own. A skipped
    /// slot is read into a scratch block in the same scatter read (`read_vectored_at`), so a
    /// large request is one I/O however many records it spans. Returns the blocks to read
    /// again (I/O error or checksum failure).
    fn read_cache_runs(&self, plan: &[Source], buf: &mut [u8]) -> Vec<usize> {
        let bs = self.bs;
        let mut retry: Vec<usize> = Vec::new();
        let mut scratch: Option<AlignedBuf> = None;
        let mut i = 0;
        while i < plan.len() {
            let Source::Cache(e, _) = plan[i] else {
                i += 1;
                continue;
            };
            let start = i;
            let (mut last, mut gaps) = (e.slot, 0usize);
            i += 1;
            while let Some(Source::Cache(n, _)) = plan.get(i) {
                if n.slot == last + 1 || (n.slot == last + 2 && gaps < MAX_SKIPPED_SLOTS) {
                    gaps += (n.slot - last - 1) as usize;
                    last = n.slot;
                    i += 1;
                } else {
                    break;
                }
            }
            let offset = self.layout.log_offset(u64::from(e.slot));
            let read = if gaps == 0 {
                self.cache.read_at(offset, &mut buf[start * bs..i * bs])
            } else {
                // One buffer per block, a scratch block for each skipped slot (never looked at).
                let skipped = scratch.get_or_insert_with(|| AlignedBuf::new(MAX_SKIPPED_SLOTS * bs));
                let mut skip_blocks = skipped.chunks_mut(bs);
                let mut blocks = buf[start * bs..i * bs].chunks_mut(bs);
                let mut bufs: Vec<&mut [u8]> = Vec::with_capacity(i - start + gaps);
                let mut prev = e.slot;
                for (k, src) in plan.iter().enumerate().take(i).skip(start) {
                    let Source::Cache(n, _) = src else { unreachable!("a run holds cache blocks only") };
                    if k > start && n.slot == prev + 2 {
                        bufs.push(skip_blocks.next().expect("at most MAX_SKIPPED_SLOTS skipped"));
                    }
                    bufs.push(blocks.next().expect("one block per plan entry"));
                    prev = n.slot;
                }
                self.cache.read_vectored_at(offset, &mut bufs)
            };
            for k in start..i {
                let Source::Cache(e, _) = plan[k] else { unreachable!("a run holds cache blocks only") };
                if read.is_err() || checksum(&buf[k * bs..(k + 1) * bs]) != e.crc {
                    retry.push(k);
                }
            }
        }
        retry
    }

    /// Under the lock: admits the misses read (if `admit`, no write or loss cancelled the
    /// fill, and the block is not lost), and confirms each cache hit is still current, adding
    /// those that are not to `retry` (a slot can hold another copy of the same block a lap
    /// later; a position cannot, so "still current" is "the index names the same position").
    pub(super) fn admit_and_confirm(
        &self,
        first: u64,
        plan: &[Source],
        buf: &[u8],
        admit: Admit,
        read_ok: bool,
        retry: &mut Vec<usize>,
    ) {
        let bs = self.bs;
        let mut st = self.lock();
        let now = self.clock.now_ns();
        for (i, src) in plan.iter().enumerate() {
            let block = first + i as u64;
            match src {
                Source::Backing => {
                    let cancelled = st.end_fill(block);
                    if read_ok && !cancelled && !st.lost.contains_key(&block) && st.around.admissible(block) {
                        // (Counted by reason only where admission would have taken it.)
                        match admit {
                            Admit::Yes => {
                                let data = &buf[i * bs..(i + 1) * bs];
                                if st.staging.put(block, EntryKind::DataClean, data, checksum(data), now) {
                                    st.counters.admitted_blocks += 1;
                                }
                            }
                            Admit::No(Bypass::Size) => st.counters.bypassed_blocks_size += 1,
                            Admit::No(Bypass::Sequential) => st.counters.bypassed_blocks_sequential += 1,
                        }
                    }
                }
                Source::Cache(_, position) => {
                    let current = st.index.get(block).map(|c| self.position_of(&st, &c));
                    if current != Some(*position) && !retry.contains(&i) {
                        retry.push(i); // moved or evicted while we read: read again
                    }
                }
                Source::Copied => {}
            }
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
            // happens on a later miss).
            st.index.remove(block);
            st.counters.repaired_blocks += 1;
            tracing::warn!(block, "clean block failed its checksum on the cache device; re-read from backing");
        }
    }

    /// Readers that filled staging with clean blocks write it out, so admission continues.
    /// With a background thread, it is woken to write the record instead: a reader never
    /// waits for the admission of what it read (the staging buffer is swapped out at seal
    /// time, so admission goes on while the record is written).
    fn commit_if_staging_full(&self) {
        let full = {
            let st = self.lock();
            st.staging.data.len() >= st.staging.data_limit()
        };
        if full && !self.wake_background() {
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
