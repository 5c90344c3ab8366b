//! Reading and writing the log by position: logical positions grow without end, the device
//! holds them modulo the log's size, so a stretch may wrap at the physical end.

use super::*;

impl Volume {
    /// Writes whole blocks at a logical log position, splitting at the physical end, running
    /// `during` (if any) while the (last) write is in flight (`BlockDevice::write_at_while`;
    /// it may not run if the first part of a split write fails). Without `during`, a plain
    /// write: the asynchronous one costs more where there is nothing to overlap.
    pub(super) fn write_log(
        &self,
        pos: u64,
        buf: &[u8],
        during: Option<&mut dyn FnMut()>,
    ) -> std::result::Result<(), DeviceError> {
        let first = self.layout.blocks_before_wrap(pos, (buf.len() / self.bs) as u64) as usize * self.bs;
        let (offset, rest) = if first == buf.len() {
            (self.layout.log_offset(pos), buf)
        } else {
            self.cache.write_at(self.layout.log_offset(pos), &buf[..first])?;
            (self.layout.log_offset(pos + (first / self.bs) as u64), &buf[first..])
        };
        match during {
            Some(during) => self.cache.write_at_while(offset, rest, during),
            None => self.cache.write_at(offset, rest),
        }
    }

    /// Reads the blocks in log slots `slots` into `out` (block `k` from `slots[k]`), in slot
    /// order whatever order `slots` is in, with one scatter I/O per stretch of slots whose
    /// gaps are at most `MAX_READ_THROUGH_SLOTS` (a record header, a few blocks not wanted):
    /// write-back batches and copy-forward read whole stretches of the log, not one I/O per
    /// record. A skipped slot is read into a scratch block and never looked at; if the stretch
    /// fails, its wanted runs are read again without the gaps, so a medium error in a slot
    /// nobody needs (a stale copy, a header) costs nothing more than it did before.
    pub(super) fn read_slots(&self, slots: &[u32], out: &mut [u8]) -> std::result::Result<(), DeviceError> {
        self.read_slots_paced(slots, out, Pace::Full)
    }

    /// `read_slots`; at `Pace::Gentle` no I/O spans more than `GENTLE_READ_BLOCKS` slots
    /// (skipped ones included) while no writer's reclaim waits for the batch.
    pub(super) fn read_slots_paced(
        &self,
        slots: &[u32],
        out: &mut [u8],
        pace: Pace,
    ) -> std::result::Result<(), DeviceError> {
        let bs = self.bs;
        debug_assert_eq!(out.len(), slots.len() * bs);
        let mut order: Vec<usize> = (0..slots.len()).collect();
        order.sort_unstable_by_key(|&k| slots[k]);
        let mut blocks: Vec<Option<&mut [u8]>> = out.chunks_mut(bs).map(Some).collect();
        let mut i = 0;
        while i < order.len() {
            // (A writer's reclaim that comes to wait for the batch meanwhile gets the rest of
            // its reads at full pace.)
            let span =
                if pace == Pace::Gentle && !self.reclaim_waits_for_destage() { GENTLE_READ_BLOCKS } else { usize::MAX };
            let start = i;
            let mut skipped = 0usize;
            let mut capped = false;
            i += 1;
            while i < order.len() {
                let (prev, next) = (slots[order[i - 1]], slots[order[i]]);
                // (A slot never repeats among live blocks; the stretch ends there if it did.)
                if next == prev || (next - prev - 1) as usize > MAX_READ_THROUGH_SLOTS {
                    break;
                }
                if i - start + skipped + (next - prev) as usize > span {
                    capped = true;
                    break;
                }
                skipped += (next - prev - 1) as usize;
                i += 1;
            }
            let mut scratch = (skipped > 0).then(|| AlignedBuf::new(skipped * bs));
            let mut skip_blocks = scratch.iter_mut().flat_map(|s| s.chunks_mut(bs));
            // Each buffer of the scatter read, with the slot it is wanted for (None: skipped).
            let mut bufs: Vec<&mut [u8]> = Vec::with_capacity(i - start + skipped);
            let mut wanted_slot: Vec<Option<u32>> = Vec::with_capacity(i - start + skipped);
            for j in start..i {
                if j > start {
                    for _ in slots[order[j - 1]] + 1..slots[order[j]] {
                        bufs.push(skip_blocks.next().expect("one scratch block per skipped slot"));
                        wanted_slot.push(None);
                    }
                }
                bufs.push(blocks[order[j]].take().expect("each block is read once"));
                wanted_slot.push(Some(slots[order[j]]));
            }
            let offset = self.layout.log_offset(u64::from(slots[order[start]]));
            let read = if bufs.len() == 1 {
                self.cache.read_at(offset, bufs[0])
            } else {
                self.cache.read_vectored_at(offset, &mut bufs)
            };
            match read {
                Ok(()) => {}
                // (A stretch the gentle pace cut short is read again too: at full pace it would
                // have gone on through the gap after it, and a transient error there is
                // survived. Found by the review of the gentle pace.)
                Err(e) if skipped == 0 && !capped => return Err(e),
                Err(_) => {
                    let mut wanted: Vec<(u32, &mut [u8])> =
                        bufs.into_iter().zip(wanted_slot).filter_map(|(b, s)| s.map(|s| (s, b))).collect();
                    let mut k = 0;
                    while k < wanted.len() {
                        let run = k;
                        k += 1;
                        while k < wanted.len() && wanted[k].0 == wanted[k - 1].0 + 1 {
                            k += 1;
                        }
                        let at = self.layout.log_offset(u64::from(wanted[run].0));
                        let mut run_bufs: Vec<&mut [u8]> = wanted[run..k].iter_mut().map(|(_, b)| &mut **b).collect();
                        self.cache.read_vectored_at(at, &mut run_bufs)?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Reads whole blocks at a logical log position, splitting at the physical end.
    pub(crate) fn read_log(&self, pos: u64, buf: &mut [u8]) -> Result<()> {
        read_log(&*self.cache, &self.layout, pos, buf)
    }

    /// Reads record headers from `from` (a record boundary) until reaching `until`; calls
    /// `visit` for each; returns the first boundary at or after `until`.
    pub(crate) fn walk_records(&self, from: u64, until: u64, mut visit: impl FnMut(u64, &RecordHeader)) -> Result<u64> {
        let mut pos = from;
        let mut block = AlignedBuf::new(self.bs);
        while pos < until {
            self.read_log(pos, &mut block).inspect_err(|e| {
                self.lock().poison(format!("reading a log record header failed: {e}"));
            })?;
            let header = match RecordHeader::decode(&block, self.uuid_low) {
                Ok(h) if h.position == pos => h,
                Ok(h) => return Err(self.corrupt(Corruption::RecordMisplaced { position: pos, claimed: h.position })),
                Err(e) => return Err(self.corrupt(Corruption::RecordHeader { position: pos, reason: e.to_string() })),
            };
            visit(pos, &header);
            pos += header.total_blocks();
        }
        Ok(pos)
    }
}

/// Reads whole blocks at a logical log position of `cache`, splitting at the physical end.
pub(crate) fn read_log(cache: &dyn BlockDevice, layout: &Layout, pos: u64, buf: &mut [u8]) -> Result<()> {
    let bs = layout.block_size as usize;
    let first = layout.blocks_before_wrap(pos, (buf.len() / bs) as u64) as usize * bs;
    cache.read_at(layout.log_offset(pos), &mut buf[..first]).map_err(EngineError::cache)?;
    if first < buf.len() {
        cache.read_at(layout.log_offset(pos + (first / bs) as u64), &mut buf[first..]).map_err(EngineError::cache)?;
    }
    Ok(())
}
