//! Recovery: rebuilds the whole index (clean and dirty) and the lost blocks from the cache
//! device alone: the superblock, the newest valid checkpoint, the valid log tail after it
//! (pass 1, `scan`), then the index (pass 2, `rebuild`). docs/format.md 4.6 is its decision
//! table.

use super::checkpoint::newest_checkpoint;
use super::rebuild::{rebuild_index, ChainEnd};
use super::scan::{scan_log, ReplayEnd, Scan};
use super::superblock::read_superblock;
use crate::error::{Corruption, EngineError, Result};
use crate::volume::Recovered;
use tiercache_device::BlockDevice;
use tiercache_format::{uuid_low64, Layout};

/// Rebuilds the index from the cache device alone (no backing device needed); also says where
/// replay ended and why.
pub(crate) fn recover(cache: &dyn BlockDevice) -> Result<(Recovered, ReplayEnd)> {
    let sb = read_superblock(cache)?;
    let layout = sb.layout;
    let uuid_low = uuid_low64(&sb.uuid);
    let ck = newest_checkpoint(cache, &sb, uuid_low)?;
    let backing_blocks = sb.backing_size_bytes / u64::from(layout.block_size);
    let scan = scan_log(cache, &layout, uuid_low, backing_blocks, &ck.header)?;
    log_replay_end(&scan, ck.header.log_position);
    let end = ChainEnd::of(&scan.records, &ck.header);
    let (index, lost) = rebuild_index(&layout, &ck, &scan.records, &end);
    let max_lost = Layout::max_lost_blocks_for(layout.log_blocks) as usize;
    if lost.len() > max_lost {
        return Err(EngineError::Corrupt(Corruption::TooManyLost { count: lost.len() as u64, max: max_lost as u64 }));
    }
    let recovered = Recovered {
        superblock: sb,
        index,
        head: end.head,
        tail: end.tail,
        next_seq: end.next_seq,
        last_header_crc: end.last_header_crc,
        checkpoint_position: ck.header.log_position,
        checkpoint_seq: ck.header.sequence,
        replayed_records: scan.records.len() as u64,
        lost: lost.into_iter().map(|(b, (position, crc))| (b, position, crc)).collect(),
        epoch: end.epoch,
    };
    Ok((recovered, scan.end))
}

/// One line per recovery: where replay ended and why (and, when the torn tail was cut, where
/// the walk itself had stopped).
fn log_replay_end(scan: &Scan, from: u64) {
    let end = &scan.end;
    tracing::info!(
        from,
        position = end.position,
        sequence = end.sequence,
        replayed = scan.records.len(),
        reason = %end.stop,
        "recovery: log replay ends"
    );
    if scan.walk_end != scan.end {
        tracing::info!(
            position = scan.walk_end.position,
            reason = %scan.walk_end.stop,
            "recovery: the scan had read on past the torn tail"
        );
    }
}
