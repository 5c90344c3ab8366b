//! Reading and writing the log by position: logical positions grow without end, the device
//! holds them modulo the log's size, so a stretch may wrap at the physical end.

use super::*;

impl Volume {
    /// Writes whole blocks at a logical log position, splitting at the physical end.
    pub(super) fn write_log(&self, pos: u64, buf: &[u8]) -> std::result::Result<(), DeviceError> {
        let first = self.layout.blocks_before_wrap(pos, (buf.len() / self.bs) as u64) as usize * self.bs;
        self.cache.write_at(self.layout.log_offset(pos), &buf[..first])?;
        if first < buf.len() {
            self.cache.write_at(self.layout.log_offset(pos + (first / self.bs) as u64), &buf[first..])?;
        }
        Ok(())
    }

    /// Reads the blocks in log slots `slots` into `out` (block `k` from `slots[k]`), with one
    /// I/O per run of consecutive slots, in slot order whatever order `slots` is in: write-back
    /// batches and copy-forward read whole stretches of the log, not 4 KiB at a time.
    pub(super) fn read_slots(&self, slots: &[u32], out: &mut [u8]) -> std::result::Result<(), DeviceError> {
        let bs = self.bs;
        let mut order: Vec<usize> = (0..slots.len()).collect();
        order.sort_unstable_by_key(|&k| slots[k]);
        let mut scratch: Option<AlignedBuf> = None;
        let mut i = 0;
        while i < order.len() {
            let start = i;
            i += 1;
            while i < order.len() && slots[order[i]] == slots[order[start]] + (i - start) as u32 {
                i += 1;
            }
            let run = &order[start..i];
            let offset = self.layout.log_offset(u64::from(slots[run[0]]));
            if run.windows(2).all(|w| w[1] == w[0] + 1) {
                // Laid out in `out` as on the device: read in place.
                self.cache.read_at(offset, &mut out[run[0] * bs..(run[0] + run.len()) * bs])?;
                continue;
            }
            if scratch.as_ref().is_none_or(|b| b.len() < run.len() * bs) {
                scratch = Some(AlignedBuf::new(run.len() * bs));
            }
            let scratch = scratch.as_mut().expect("allocated above");
            self.cache.read_at(offset, &mut scratch[..run.len() * bs])?;
            for (j, &k) in run.iter().enumerate() {
                out[k * bs..(k + 1) * bs].copy_from_slice(&scratch[j * bs..(j + 1) * bs]);
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
