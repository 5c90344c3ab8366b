//! The write path: whole blocks into staging (complete on return, durable after the next
//! FLUSH), byte ranges by read-modify-write of their edge blocks, write-zeroes.

use super::*;

impl Volume {
    /// Writes whole blocks. Complete on return; durable after the next `flush`.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.check_request(offset, data.len() as u64)?;
        let _foreground = self.foreground();
        if self.try_write_around(offset, data)? {
            return Ok(());
        }
        self.backpressure();
        let first = offset / self.bs as u64;
        let chunks: Vec<&[u8]> = data.chunks(self.bs).collect();
        let mut crcs: Vec<u32> = Vec::with_capacity(chunks.len());
        let mut noted = false;
        // Stages as many blocks as staging takes in one hold of the state lock: a request's
        // blocks then lie in consecutive log slots (a later read of them is one I/O per
        // record), however many writers stage at once. Their checksums are computed first,
        // outside the lock, as far ahead as one hold can take.
        let mut stage = |i: &mut usize| -> Result<()> {
            let ahead = (*i + self.staging_limit).min(chunks.len());
            while crcs.len() < ahead {
                crcs.push(checksum(chunks[crcs.len()]));
            }
            let mut st = self.lock();
            st.check_poisoned()?;
            let now = self.clock.now_ns();
            if !noted {
                // (Once per request: a first hold that finds staging full stages nothing.)
                st.write_streams.note(first, chunks.len() as u64, now);
                noted = true;
            }
            while *i < ahead {
                let block = first + *i as u64;
                st.cancel_fill(block);
                // An older copy left by a write-around is ended by a Trim in this very
                // record (metadata first): the Trim needs room too.
                let owes_trim = st.around.owes_trim(block);
                let room = !owes_trim || st.staging.entries() + 2 <= st.staging.limit;
                // A lost block stays lost until this write is in a written record (see
                // `Lost`).
                if !(room && st.staging.put(block, EntryKind::DataDirty, chunks[*i], crcs[*i], now)) {
                    break;
                }
                if owes_trim {
                    st.around.trim_staged(block);
                    st.staging.meta.push(write_around::trim_entry(block));
                }
                st.admission.note_write(block);
                st.counters.written_blocks += 1;
                *i += 1;
            }
            Ok(())
        };
        let mut i = 0;
        loop {
            stage(&mut i)?;
            if i == chunks.len() {
                break;
            }
            // Staging is full: it is sealed and written, and the rest of this request is
            // staged (and checksummed) while that record is in flight, so that a lone large
            // writer keeps the cache device busy (issue 13: a 1 MiB write at queue depth 1 ran
            // at 0.74-0.78 of the raw device with the two done one after the other).
            if chunks.len() - i < Staging::data_limit_of(self.staging_limit) / 2 {
                // (Too little left to pay for the overlap: an asynchronous write costs the
                // device layer more than staging a few blocks.)
                self.commit(None)?;
                continue;
            }
            let mut staged = Ok(());
            self.commit(Some(&mut || {
                if staged.is_ok() && i < chunks.len() {
                    staged = stage(&mut i);
                }
                // Staging full again: the next record goes out too, if that needs no waiting,
                // so that two of this request's records are in flight at once.
                if staged.is_ok() && i < chunks.len() {
                    let nested = self.try_commit_nested(&mut || {
                        if staged.is_ok() && i < chunks.len() {
                            staged = stage(&mut i);
                        }
                    });
                    if let Err(e) = nested {
                        staged = Err(e);
                    }
                }
            }))?;
            staged?;
        }
        self.lock().counters.write_requests += 1;
        Ok(())
    }

    /// A write that is durable on return (Force Unit Access): a write, then a flush.
    pub fn write_fua(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write(offset, data)?;
        self.flush()
    }

    /// Writes any byte range: partial first and last blocks are read, modified and written
    /// (serialised among themselves; overlapping concurrent writes have no defined order on a
    /// disk either).
    pub fn write_bytes(&self, offset: u64, data: &[u8]) -> Result<()> {
        let (start, end) = self.aligned_span(offset, data.len() as u64)?;
        if start == offset && end == offset + data.len() as u64 {
            return self.write(offset, data);
        }
        let _rmw = lock_order::ranked(self.lock_owner(), lock_order::Rank::Rmw, || self.rmw.lock().expect("rmw lock"));
        let mut whole = vec![0u8; (end - start) as usize];
        let bs = self.bs as u64;
        // (Not admitted: the write replaces the blocks at once.)
        self.read_admitting(start, &mut whole[..self.bs], false)?;
        if end - start > bs {
            let last = whole.len() - self.bs;
            self.read_admitting(end - bs, &mut whole[last..], false)?;
        }
        let at = (offset - start) as usize;
        whole[at..at + data.len()].copy_from_slice(data);
        self.write(start, &whole)
    }

    /// Writes zeroes over any byte range (NBD WRITE_ZEROES): ordinary writes of zero blocks.
    pub fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        self.aligned_span(offset, len)?;
        // Any byte range: partial edge blocks are read-modified-written by `write_bytes`.
        let chunk = (RECORD_ENTRIES * self.bs) as u64;
        let zeroes = vec![0u8; chunk.min(len) as usize];
        let mut done = 0;
        while done < len {
            let n = chunk.min(len - done);
            self.write_bytes(offset + done, &zeroes[..n as usize])?;
            done += n;
        }
        Ok(())
    }
}
