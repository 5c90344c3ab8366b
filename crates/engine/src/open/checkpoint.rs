//! Reading the checkpoint areas and choosing the one recovery starts from (docs/format.md,
//! 2.3 and the checkpoint rows of 4.6).

use crate::error::{Corruption, EngineError, Result};
use tiercache_device::{AlignedBuf, BlockDevice};
use tiercache_format::constants::*;
use tiercache_format::{checksum, CheckpointEntry, CheckpointHeader, Layout, Superblock};

/// The checkpoint recovery starts from: its header and its entries (index entries and
/// tombstones).
pub(super) struct Checkpoint {
    pub header: CheckpointHeader,
    pub entries: Vec<CheckpointEntry>,
}

/// The valid area with the higher sequence (area 0 on a tie), or the only valid one. Refuses
/// to open when neither is valid (dirty data could not be located) or when the chosen one
/// names a block beyond the backing device.
pub(super) fn newest_checkpoint(cache: &dyn BlockDevice, sb: &Superblock, uuid_low: u64) -> Result<Checkpoint> {
    let layout = &sb.layout;
    let candidates = [read_checkpoint(cache, layout, uuid_low, 0)?, read_checkpoint(cache, layout, uuid_low, 1)?];
    let chosen = match candidates {
        [Ok(a), Ok(b)] => {
            if b.header.sequence > a.header.sequence {
                b
            } else {
                a
            }
        }
        [Ok(a), Err(_)] => a,
        [Err(_), Ok(b)] => b,
        [Err(ea), Err(eb)] => {
            let (area0, area1) = (ea.to_string(), eb.to_string());
            return Err(EngineError::Corrupt(Corruption::NoValidCheckpoint { area0, area1 }));
        }
    };
    let backing_blocks = sb.backing_size_bytes / u64::from(layout.block_size);
    if let Some(e) = chosen.entries.iter().find(|e| e.backing_block >= backing_blocks) {
        return Err(EngineError::Corrupt(Corruption::CheckpointBeyondBacking { block: e.backing_block }));
    }
    Ok(chosen)
}

/// Reads one checkpoint area; the inner `Err` says why it is not usable.
fn read_checkpoint(
    cache: &dyn BlockDevice,
    layout: &Layout,
    uuid_low: u64,
    area: usize,
) -> Result<Result<Checkpoint, String>> {
    let bs = layout.block_size as usize;
    let start = layout.checkpoint_area_start[area] * bs as u64;
    let mut head = AlignedBuf::new(bs);
    cache.read_at(start, &mut head).map_err(EngineError::cache)?;
    let header = match CheckpointHeader::decode(&head, uuid_low, layout.checkpoint_capacity()) {
        Ok(h) => h,
        Err(e) => return Ok(Err(e.to_string())),
    };
    let entry_bytes = header.entry_count as usize * CHECKPOINT_ENTRY_SIZE;
    let blocks = entry_bytes.div_ceil(bs);
    let mut entries = Vec::with_capacity(header.entry_count as usize);
    if blocks > 0 {
        let mut buf = AlignedBuf::new(blocks * bs);
        cache.read_at(start + bs as u64, &mut buf).map_err(EngineError::cache)?;
        if checksum(&buf[..entry_bytes]) != header.entries_crc {
            return Ok(Err(format!("checkpoint area {area}: entries checksum mismatch (torn checkpoint)")));
        }
        for chunk in buf[..entry_bytes].chunks(CHECKPOINT_ENTRY_SIZE) {
            match CheckpointEntry::decode(chunk) {
                Ok(e) if u64::from(e.slot) < layout.log_blocks || e.lost => entries.push(e),
                Ok(e) => return Ok(Err(format!("checkpoint area {area}: slot {} beyond the log", e.slot))),
                Err(e) => return Ok(Err(e.to_string())),
            }
        }
    } else if checksum(&[]) != header.entries_crc {
        return Ok(Err(format!("checkpoint area {area}: entries checksum mismatch")));
    }
    Ok(Ok(Checkpoint { header, entries }))
}
