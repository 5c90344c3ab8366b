//! One test per row of recovery's decision table (docs/format.md 4.6), in the table's order.
//! Each builds exactly the row's situation on simulated devices (the engine writes what it
//! can; the format crate's encoders forge what it never writes), opens the volume, and checks
//! which records were replayed, where replay ended and why (`OpenReport::replay_end`), and
//! what reads return. Block versions are stamps: version 0 is the backing device's content.

use std::sync::Arc;
use tiercache_device::{BlockDevice, SimDevice};
use tiercache_engine::{Corruption, EngineError, OpenReport, ReplayEnd, ReplayStop, Volume};
use tiercache_format::{checksum, CheckpointEntry, EntryKind, RecordEntry, RecordHeader};

mod common;
use common::*;

const LOG_BLOCKS: u64 = 128;
const BACKING_BLOCKS: u64 = 256;
/// Written by the engine in the last record it wrote.
const A: u64 = 1;
/// The first data block of the forged record R2, and the block of R3 (the record after it).
const X: u64 = 100;
const Y: u64 = 90;
/// Blocks the warm-up rewrites until the log laps; one more written just before the checkpoint.
const WARM: std::ops::Range<u64> = 240..252;
const BEFORE_CHECKPOINT: u64 = 239;

/// A 128-block log over a 256-block backing device.
fn small_devices() -> (Arc<SimDevice>, Arc<SimDevice>) {
    let (cache, backing) = devices_seg(LOG_BLOCKS / 8, 8, BACKING_BLOCKS, log_only());
    assert_eq!(layout_of(&cache).0.log_blocks, LOG_BLOCKS);
    (cache, backing)
}

/// A volume whose log has lapped and whose head has moved (reclaim ran), then a record, a
/// checkpoint, and A = 1 in the last record the engine wrote. Dropped without a shutdown, as
/// by a crash with everything flushed: recovery replays `records` from the checkpoint. Tests
/// append forged records after them.
struct Chain {
    cache: Arc<SimDevice>,
    backing: Arc<SimDevice>,
    /// The records after the checkpoint: the engine's, then the forged ones.
    records: Vec<Rec>,
    /// How many of `records` the engine wrote.
    engine_records: usize,
}

impl Chain {
    fn new() -> Chain {
        let (cache, backing) = small_devices();
        let v = open(cache.clone(), backing.clone());
        for version in 1..=16 {
            for b in WARM {
                write(&v, b, version);
            }
            v.flush().unwrap();
        }
        write(&v, BEFORE_CHECKPOINT, 1);
        v.flush().unwrap();
        v.checkpoint().unwrap();
        write(&v, A, 1);
        v.flush().unwrap();
        let (head, _, tail) = v.log_window();
        assert!(head > 0 && tail > LOG_BLOCKS, "the log lapped and the head moved: {head}..{tail}");
        drop(v);
        let records = records_after_checkpoint(&cache);
        assert!(!records.is_empty());
        Chain { cache, backing, engine_records: records.len(), records }
    }

    fn last(&self) -> &Rec {
        self.records.last().unwrap()
    }

    fn engine_last(&self) -> &Rec {
        &self.records[self.engine_records - 1]
    }

    /// The next sound record after the last one: `meta` entries, then one data entry per
    /// `(kind, block, version)` with its stamped block.
    fn forge(&self, meta: Vec<RecordEntry>, data: &[(EntryKind, u64, u64)]) -> (RecordHeader, Vec<Vec<u8>>) {
        let mut header = next_header(self.last());
        header.entries = meta;
        let blocks: Vec<Vec<u8>> = data.iter().map(|&(_, b, v)| stamp(b, v)).collect();
        for (&(kind, block, _), d) in data.iter().zip(&blocks) {
            header.entries.push(RecordEntry { kind, backing_block: block, data_crc: checksum(d), ref_position: 0 });
        }
        (header, blocks)
    }

    /// Writes a record after the last one (with `patch` applied to its header block).
    fn append(&mut self, header: &RecordHeader, data: &[Vec<u8>], patch: impl FnOnce(&mut [u8])) -> Rec {
        let rec = write_record(&self.cache, self.last().end(), header, data, patch);
        self.records.push(rec.clone());
        rec
    }

    /// `forge`, then `append` unchanged.
    fn append_sound(&mut self, meta: Vec<RecordEntry>, data: &[(EntryKind, u64, u64)]) -> Rec {
        let (h, d) = self.forge(meta, data);
        self.append(&h, &d, |_| {})
    }

    fn try_open(&self) -> Result<(Volume, OpenReport), EngineError> {
        try_open_report(self.cache.clone(), self.backing.clone())
    }

    fn open(&self) -> (Volume, OpenReport) {
        self.try_open().expect("open")
    }
}

fn meta(kind: EntryKind, block: u64, ref_position: u64, data_crc: u32) -> RecordEntry {
    RecordEntry { kind, backing_block: block, data_crc, ref_position }
}

fn crc_of(block: u64, version: u64) -> u32 {
    checksum(&stamp(block, version))
}

fn dirty_in_index(v: &Volume, block: u64) -> Option<bool> {
    slot_of(v, block).map(|(_, dirty)| dirty)
}

// ------------------------------------------------------------------------------------------
// Superblock

#[test]
fn superblock_with_one_copy_damaged_opens_from_the_other() {
    for copy in 0..2u64 {
        let chain = Chain::new();
        chain.cache.write_at(copy * BS as u64, &vec![0x5Au8; BS]).unwrap();
        chain.cache.flush().unwrap();
        let (v, report) = chain.open();
        assert_eq!(report.replayed_records, chain.records.len() as u64, "copy {copy} damaged");
        assert_eq!(read_version(&v, A).unwrap(), Some(1));
    }
}

#[test]
fn superblock_with_no_copy_is_not_formatted() {
    let chain = Chain::new();
    chain.cache.write_at(0, &vec![0u8; 2 * BS]).unwrap();
    assert!(matches!(chain.try_open(), Err(EngineError::NotFormatted { .. })));
}

#[test]
fn superblock_on_a_cache_device_smaller_than_formatted_is_refused() {
    let chain = Chain::new();
    let mut image = chain.cache.durable_image();
    image.truncate(image.len() - BS);
    let cache = Arc::new(SimDevice::from_image(image, BS as u32));
    match try_open_report(cache, chain.backing.clone()) {
        Err(EngineError::CacheShrunk { actual, formatted, .. }) => assert_eq!(actual + BS as u64, formatted),
        other => panic!("{:?}", other.map(|(_, r)| r)),
    }
}

// ------------------------------------------------------------------------------------------
// Checkpoint areas and entries

#[test]
fn checkpoint_both_valid_the_higher_sequence_is_used() {
    let chain = Chain::new();
    let [(_, a), (_, b)] = checkpoint_areas(&chain.cache);
    let (a, b) = (a.expect("area 0 valid"), b.expect("area 1 valid"));
    let (newer, older) = if a.sequence > b.sequence { (a, b) } else { (b, a) };
    assert!(older.log_position < newer.log_position);
    let (v, report) = chain.open();
    // Replay starts at the newer checkpoint: exactly the records after it.
    assert_eq!(chain.records[0].pos, newer.log_position);
    assert_eq!(report.replayed_records, chain.records.len() as u64);
    assert_eq!(read_version(&v, A).unwrap(), Some(1));
}

#[test]
fn checkpoint_only_one_valid_that_one_is_used() {
    let chain = Chain::new();
    let (newest, _) = checkpoint_area_with_higher_sequence(&chain.cache);
    chain.cache.write_at(newest, &vec![0x55u8; BS]).unwrap();
    let (v, report) = chain.open();
    // From the older checkpoint: the records before the newer one are replayed too.
    assert!(report.replayed_records > chain.records.len() as u64, "{report:?}");
    assert_eq!(report.replay_end.position, chain.last().end());
    assert_eq!(read_version(&v, A).unwrap(), Some(1));
    assert_eq!(read_version(&v, BEFORE_CHECKPOINT).unwrap(), Some(1));
    for b in WARM {
        assert_eq!(read_version(&v, b).unwrap(), Some(16));
    }
}

#[test]
fn checkpoint_none_valid_is_refused_naming_both_areas() {
    let chain = Chain::new();
    for (start, _) in checkpoint_areas(&chain.cache) {
        chain.cache.write_at(start, &vec![0x55u8; BS]).unwrap();
    }
    match chain.try_open() {
        Err(EngineError::Corrupt(m @ Corruption::NoValidCheckpoint { .. })) => {
            let m = m.to_string();
            assert!(m.contains("no valid checkpoint") && m.contains("area 0") && m.contains("area 1"), "{m}")
        }
        other => panic!("{:?}", other.map(|(_, r)| r)),
    }
}

#[test]
fn checkpoint_with_torn_or_malformed_entries_is_an_invalid_area() {
    // Torn entries (entries_crc fails), and an entry naming a slot beyond the log (with valid
    // checksums): either way the area is invalid and the older one is used.
    for case in 0..2 {
        let chain = Chain::new();
        if case == 0 {
            let (start, _) = checkpoint_area_with_higher_sequence(&chain.cache);
            chain.cache.write_at(start + BS as u64, &vec![0x77u8; BS]).unwrap();
        } else {
            rewrite_newest_checkpoint(&chain.cache, |_, entries| entries[0].slot = LOG_BLOCKS as u32);
        }
        let (v, report) = chain.open();
        assert!(report.replayed_records > chain.records.len() as u64, "case {case}: {report:?}");
        assert_eq!(read_version(&v, A).unwrap(), Some(1), "case {case}");
        assert_eq!(read_version(&v, WARM.start).unwrap(), Some(16), "case {case}");
    }
}

#[test]
fn checkpoint_naming_a_block_beyond_the_backing_device_is_refused() {
    let chain = Chain::new();
    rewrite_newest_checkpoint(&chain.cache, |_, entries| {
        entries.push(CheckpointEntry { backing_block: BACKING_BLOCKS, slot: 0, dirty: false, lost: false, data_crc: 0 })
    });
    match chain.try_open() {
        Err(EngineError::Corrupt(Corruption::CheckpointBeyondBacking { block })) => assert_eq!(block, BACKING_BLOCKS),
        other => panic!("{:?}", other.map(|(_, r)| r)),
    }
}

// ------------------------------------------------------------------------------------------
// The log scan: each record from the checkpoint's position

#[test]
fn scan_replays_sound_records_in_order() {
    let mut chain = Chain::new();
    chain.append_sound(vec![], &[(EntryKind::DataDirty, X, 1)]);
    let r3 = chain.append_sound(vec![], &[(EntryKind::DataDirty, Y, 1), (EntryKind::DataDirty, X, 2)]);
    let (v, report) = chain.open();
    assert_eq!(report.replayed_records, chain.records.len() as u64);
    assert_eq!((report.replay_end.position, report.replay_end.sequence), (r3.end(), r3.header.sequence + 1));
    assert_eq!(read_version(&v, A).unwrap(), Some(1));
    assert_eq!(read_version(&v, X).unwrap(), Some(2), "applied in order");
    assert_eq!(read_version(&v, Y).unwrap(), Some(1));
}

/// R2 (X = 1) is forged with a defect (`header` changed before encoding, then `bytes` after),
/// written where the next record belongs, with a sound R3 (Y = 1) chained onto it as written.
/// Replay must stop at R2 for the reason `expected` gives (from R2 as written and its header
/// block), replaying neither.
fn assert_replay_stops_at_r2(
    header: impl FnOnce(&mut RecordHeader),
    bytes: impl FnOnce(&mut [u8]),
    expected: impl FnOnce(&Rec, &[u8]) -> ReplayStop,
) {
    let mut chain = Chain::new();
    let (mut h2, d2) = chain.forge(vec![], &[(EntryKind::DataDirty, X, 1)]);
    header(&mut h2);
    let r2 = chain.append(&h2, &d2, bytes);
    chain.append_sound(vec![], &[(EntryKind::DataDirty, Y, 1)]);
    let mut block = vec![0u8; BS];
    chain.cache.read_at(layout_of(&chain.cache).0.log_offset(r2.pos), &mut block).unwrap();
    let stop = expected(&r2, &block);
    let (v, report) = chain.open();
    let sequence = chain.engine_last().header.sequence + 1;
    assert_eq!(report.replay_end, ReplayEnd { position: r2.pos, sequence, stop });
    assert_eq!(report.replayed_records, chain.engine_records as u64);
    assert_eq!(read_version(&v, A).unwrap(), Some(1));
    assert_eq!(read_version(&v, X).unwrap(), Some(0), "the defective record was replayed");
    assert_eq!(read_version(&v, Y).unwrap(), Some(0), "a record after the stop was replayed");
}

#[test]
fn scan_stops_where_the_log_is_full() {
    // R2 ends exactly at its head + log_blocks: no header can follow it.
    let mut chain = Chain::new();
    let last = chain.last().clone();
    let head = last.header.head_position;
    let n = LOG_BLOCKS - 1 - (last.end() - head);
    assert!((1..=100).contains(&n), "{n}");
    let data: Vec<_> = (X..X + n).map(|b| (EntryKind::DataDirty, b, 1)).collect();
    let r2 = chain.append_sound(vec![], &data);
    assert_eq!(r2.end(), head + LOG_BLOCKS);
    let (v, report) = chain.open();
    let stop = ReplayStop::LogFull { limit: head + LOG_BLOCKS };
    assert_eq!(report.replay_end, ReplayEnd { position: r2.end(), sequence: r2.header.sequence + 1, stop });
    assert_eq!(report.replayed_records, chain.records.len() as u64);
    for b in X..X + n {
        assert_eq!(read_version(&v, b).unwrap(), Some(1));
    }
    // The engine never leaves the log this full (reclaim keeps a reserve for its record):
    // open moved the head by a checkpoint, writing the window's dirty blocks back first, so
    // writes that need reclaim work (they used to panic it) and nothing was lost.
    let (head_now, _, tail_now) = v.log_window();
    assert!(head_now > head && tail_now < head_now + LOG_BLOCKS - 1, "head {head_now} tail {tail_now}");
    for round in 2..6 {
        for b in X..X + n {
            write(&v, b, round);
        }
        v.flush().unwrap();
    }
    drop(v);
    let (v, _) = chain.open();
    for b in X..X + n {
        assert_eq!(read_version(&v, b).unwrap(), Some(5));
    }
}

#[test]
fn scan_stops_where_no_header_is() {
    // A data block where the next header would be (what a header torn in its first sector,
    // or a log never written that far, leaves).
    let chain = Chain::new();
    let junk = stamp(7, 9);
    let (layout, _) = layout_of(&chain.cache);
    chain.cache.write_at(layout.log_offset(chain.last().end()), &junk).unwrap();
    let (v, report) = chain.open();
    let found_magic = u64::from_le_bytes(junk[8..16].try_into().unwrap());
    let stop = ReplayStop::NoHeader { found_magic };
    let sequence = chain.last().header.sequence + 1;
    assert_eq!(report.replay_end, ReplayEnd { position: chain.last().end(), sequence, stop });
    assert_eq!(report.replayed_records, chain.records.len() as u64);
    assert_eq!(read_version(&v, A).unwrap(), Some(1));
}

#[test]
fn scan_stops_at_a_header_failing_its_checksum() {
    // A torn header: a byte of its entry differs from what was summed.
    assert_replay_stops_at_r2(
        |_| {},
        |b| b[70] ^= 0x01,
        |r2, b| ReplayStop::HeaderChecksum { stored: r2.crc, computed: checksum(&b[4..64 + 24]) },
    );
}

#[test]
fn scan_stops_at_a_header_of_another_version() {
    let version_3 = |b: &mut [u8]| {
        b[16..20].copy_from_slice(&3u32.to_le_bytes());
        reseal_header(b);
    };
    assert_replay_stops_at_r2(|_| {}, version_3, |_, _| ReplayStop::HeaderVersion { found: 3 });
}

#[test]
fn scan_stops_at_a_header_with_a_refused_field() {
    // Entries intact and summed, but the rest of the block is not zero (the checksum does
    // not cover it): a header written over an older block and torn.
    assert_replay_stops_at_r2(|_| {}, |b| b[BS - 1] = 0xFF, |_, _| ReplayStop::HeaderField { field: "tail" });
}

#[test]
fn scan_stops_at_a_record_of_an_earlier_lap() {
    // At the expected slot, a sound record written one lap earlier (lower position, sequence
    // and head): its position names the lap.
    let earlier_lap = |h: &mut RecordHeader| {
        h.position -= LOG_BLOCKS;
        h.sequence -= 10;
        h.head_position = h.position.saturating_sub(60);
    };
    assert_replay_stops_at_r2(earlier_lap, |_| {}, |r2, _| ReplayStop::WrongPosition { found: r2.header.position });
}

#[test]
fn scan_stops_at_a_record_with_another_sequence() {
    let expected =
        |r2: &Rec, _: &[u8]| ReplayStop::WrongSequence { expected: r2.header.sequence - 1, found: r2.header.sequence };
    assert_replay_stops_at_r2(|h| h.sequence += 1, |_| {}, expected);
}

#[test]
fn scan_stops_where_the_hash_chain_breaks() {
    // A stale record beyond an old torn tail: everything matches but `prev_checksum`.
    let expected = |r2: &Rec, _: &[u8]| ReplayStop::BrokenChain {
        expected: r2.header.prev_checksum ^ 1,
        found: r2.header.prev_checksum,
    };
    assert_replay_stops_at_r2(|h| h.prev_checksum ^= 1, |_| {}, expected);
}

#[test]
fn scan_stops_where_the_head_moves_back() {
    let expected = |r2: &Rec, _: &[u8]| ReplayStop::HeadMovedBack {
        previous: r2.header.head_position + 1,
        found: r2.header.head_position,
    };
    assert_replay_stops_at_r2(|h| h.head_position -= 1, |_| {}, expected);
}

#[test]
fn scan_stops_where_the_epoch_decreases() {
    // A record written before the last recovery (the post-recovery chain rule, 4.9).
    let expected =
        |r2: &Rec, _: &[u8]| ReplayStop::EpochDecreased { previous: r2.header.epoch + 1, found: r2.header.epoch };
    assert_replay_stops_at_r2(|h| h.epoch -= 1, |_| {}, expected);
}

#[test]
fn scan_stops_at_a_record_overlapping_live_log() {
    // R2 would end one block past its head + log_blocks.
    let mut chain = Chain::new();
    let last = chain.last().clone();
    let head = last.header.head_position;
    let n = LOG_BLOCKS - (last.end() - head);
    let data: Vec<_> = (X..X + n).map(|b| (EntryKind::DataDirty, b, 1)).collect();
    let r2 = chain.append_sound(vec![], &data);
    assert_eq!(r2.end(), head + LOG_BLOCKS + 1);
    let (v, report) = chain.open();
    let stop = ReplayStop::OverlapsLiveLog { end: r2.end(), limit: head + LOG_BLOCKS };
    assert_eq!(report.replay_end, ReplayEnd { position: r2.pos, sequence: r2.header.sequence, stop });
    assert_eq!(report.replayed_records, chain.engine_records as u64);
    assert_eq!(read_version(&v, X).unwrap(), Some(0));
}

#[test]
fn scan_stops_at_a_record_naming_a_block_beyond_the_backing_device() {
    let beyond = |h: &mut RecordHeader| h.entries.push(meta(EntryKind::Trim, BACKING_BLOCKS, 0, 0));
    assert_replay_stops_at_r2(beyond, |_| {}, |_, _| ReplayStop::BlockBeyondBacking { block: BACKING_BLOCKS });
}

/// Writes R2 with X's data damaged (X = 1 named, something else stored), then R3 (Y = 1)
/// with `r3_durable_back`: 1 vouches for R2 (R2 was durable when R3 was sealed), 2 does not.
fn damaged_r2_then_r3(r3_durable_back: u32) -> (Chain, Rec, Rec) {
    let mut chain = Chain::new();
    let (h2, mut d2) = chain.forge(vec![], &[(EntryKind::DataDirty, X, 1)]);
    d2[0] = stamp(X, 2);
    let r2 = chain.append(&h2, &d2, |_| {});
    let (mut h3, d3) = chain.forge(vec![], &[(EntryKind::DataDirty, Y, 1)]);
    h3.durable_back = r3_durable_back;
    let r3 = chain.append(&h3, &d3, |_| {});
    (chain, r2, r3)
}

#[test]
fn scan_keeps_a_damaged_record_a_later_record_vouches_for() {
    let (chain, r2, r3) = damaged_r2_then_r3(1);
    assert_eq!(r3.header.durable_sequence(), r2.header.sequence);
    let (v, report) = chain.open();
    assert_eq!(report.replayed_records, chain.records.len() as u64);
    assert_eq!((report.replay_end.position, report.replay_end.sequence), (r3.end(), r3.header.sequence + 1));
    assert!(is_lost(&read_version(&v, X), X), "X's acknowledged version rotted: lost, not stale");
    assert_eq!(read_version(&v, Y).unwrap(), Some(1), "acknowledged records after it are kept");
}

#[test]
fn scan_cuts_a_damaged_record_nothing_vouches_for_as_the_torn_tail() {
    let (chain, r2, r3) = damaged_r2_then_r3(2);
    assert!(r3.header.durable_sequence() < r2.header.sequence);
    let (v, report) = chain.open();
    let evidence = chain.engine_last().header.sequence;
    let stop = ReplayStop::TornTail { evidence, dropped: 2 };
    assert_eq!(report.replay_end, ReplayEnd { position: r2.pos, sequence: r2.header.sequence, stop });
    assert_eq!(report.replayed_records, chain.engine_records as u64);
    assert_eq!(read_version(&v, X).unwrap(), Some(0), "torn data is never served, nor lost");
    assert_eq!(read_version(&v, Y).unwrap(), Some(0), "records after the torn tail are dropped with it");
    assert_eq!(v.status().lost_blocks, 0);
}

// ------------------------------------------------------------------------------------------
// Building the index: the checkpoint's entries, then the replayed records' entries in order

#[test]
fn index_checkpoint_tombstone_makes_the_block_lost_with_no_position() {
    // B's only dirty copy rots and is found lost; the checkpoint after it holds a tombstone.
    // MarkCleans naming the rotted copy's position, or the position the tombstone's slot field
    // (0) would give, do not end that loss: a tombstone keeps no position.
    const B: u64 = 5;
    let (cache, backing) = small_devices();
    let v = open(cache.clone(), backing.clone());
    write(&v, B, 1);
    v.flush().unwrap();
    let (slot, _) = slot_of(&v, B).unwrap();
    let position = v.superblock().layout.position_of_slot(slot, v.log_window().2);
    corrupt_cached_block(&cache, &v, B);
    assert!(is_lost(&read_version(&v, B), B));
    v.checkpoint().unwrap();
    write(&v, A, 1);
    v.flush().unwrap();
    drop(v);
    let (_, ck, entries) = newest_checkpoint(&cache);
    assert!(entries.iter().any(|e| e.lost && e.slot == 0 && e.backing_block == B), "a tombstone for B");
    let slot_zero = layout_of(&cache).0.position_of_slot(0, ck.log_position);
    let last = records_after_checkpoint(&cache).pop().unwrap();
    let mut h = next_header(&last);
    h.entries.push(meta(EntryKind::MarkClean, B, position, 0));
    h.entries.push(meta(EntryKind::MarkClean, B, slot_zero, 0));
    write_record(&cache, h.position, &h, &[], |_| {});
    let (v, report) = try_open_report(cache.clone(), backing.clone()).unwrap();
    assert_eq!(report.replayed_records, 2);
    assert!(is_lost(&read_version(&v, B), B));
    assert_eq!(read_version(&v, A).unwrap(), Some(1));
}

/// The dirty checkpoint entry at the highest position (relative to the checkpoint): block and
/// position.
fn newest_dirty_checkpoint_entry(cache: &SimDevice) -> (u64, u64) {
    let (layout, _) = layout_of(cache);
    let (_, ck, entries) = newest_checkpoint(cache);
    entries
        .iter()
        .filter(|e| e.dirty && !e.lost)
        .map(|e| (e.backing_block, layout.position_of_slot(e.slot, ck.log_position)))
        .max_by_key(|&(_, p)| p)
        .unwrap()
}

#[test]
fn index_skips_a_checkpoint_entry_below_the_final_head() {
    // A replayed record moves the head past Z's checkpointed copy: Z is no longer cached.
    let mut chain = Chain::new();
    let (z, position) = newest_dirty_checkpoint_entry(&chain.cache);
    assert!(position + 1 >= chain.last().header.head_position);
    let (mut h, d) = chain.forge(vec![], &[(EntryKind::DataDirty, X, 1)]);
    h.head_position = position + 1;
    chain.append(&h, &d, |_| {});
    let (v, report) = chain.open();
    assert_eq!(report.replayed_records, chain.records.len() as u64);
    assert_eq!(slot_of(&v, z), None);
    assert_eq!(read_version(&v, z).unwrap(), Some(0));
    assert_eq!(read_version(&v, X).unwrap(), Some(1));
}

#[test]
fn index_skips_a_checkpoint_entry_whose_slot_lies_at_or_beyond_the_checkpoint() {
    // Counted back from the final tail, the entry's slot holds a position at or after the
    // checkpoint's: the replayed tail reused it, or (as here, before the log's first lap) it
    // was never written before the checkpoint. When the replayed tail reuses a slot it has
    // also moved the head past the entry (checks 5 and 7), so only this early-log case tells
    // this rule from the head rule. The entry is forged into the checkpoint with good data in
    // its slot: loaded, Z would read 1.
    const Z: u64 = 50;
    const SLOT: u32 = 100;
    let (cache, backing) = small_devices();
    let v = open(cache.clone(), backing.clone());
    write(&v, A, 1);
    v.flush().unwrap();
    v.checkpoint().unwrap();
    let (_, checkpoint, _) = v.log_window();
    assert!(checkpoint < u64::from(SLOT));
    drop(v);
    let (layout, _) = layout_of(&cache);
    cache.write_at(layout.log_offset(u64::from(SLOT)), &stamp(Z, 1)).unwrap();
    rewrite_newest_checkpoint(&cache, |_, entries| {
        entries.push(CheckpointEntry { backing_block: Z, slot: SLOT, dirty: true, lost: false, data_crc: crc_of(Z, 1) })
    });
    let v = open(cache, backing);
    assert_eq!(slot_of(&v, Z), None);
    assert_eq!(read_version(&v, Z).unwrap(), Some(0));
    assert_eq!(read_version(&v, A).unwrap(), Some(1));
}

#[test]
fn index_damaged_dirty_entry_of_a_kept_record_is_lost_at_its_position() {
    // X's copy in R2 rots; R3 vouches for R2. X is lost at R2's data position: a MarkClean
    // naming exactly that position ends the loss (the backing device holds that version); one
    // naming the same slot a lap later does not.
    for (ref_position, still_lost) in [(None, true), (Some(0), false), (Some(LOG_BLOCKS), true)] {
        let (mut chain, r2, _) = damaged_r2_then_r3(1);
        if let Some(lap) = ref_position {
            chain.append_sound(vec![meta(EntryKind::MarkClean, X, r2.pos + 1 + lap, 0)], &[]);
        }
        let (v, report) = chain.open();
        assert_eq!(report.replayed_records, chain.records.len() as u64);
        let x = read_version(&v, X);
        assert_eq!(is_lost(&x, X), still_lost, "MarkClean at {ref_position:?}: {x:?}");
        assert_eq!(v.status().lost_blocks, u64::from(still_lost));
        assert_eq!(slot_of(&v, X), None);
    }
}

#[test]
fn index_damaged_clean_entry_of_a_kept_record_is_forgotten() {
    // R2 holds X = 1 (dirty), then a clean copy of X whose data rotted; R3 vouches. The clean
    // copy is forgotten with the entry before it, and X is not lost.
    let mut chain = Chain::new();
    let (h2, mut d2) = chain.forge(vec![], &[(EntryKind::DataDirty, X, 1), (EntryKind::DataClean, X, 0)]);
    d2[1] = stamp(X, 7);
    chain.append(&h2, &d2, |_| {});
    chain.append_sound(vec![], &[(EntryKind::DataDirty, Y, 1)]);
    let (v, report) = chain.open();
    assert_eq!(report.replayed_records, chain.records.len() as u64);
    assert_eq!(slot_of(&v, X), None);
    assert_eq!(read_version(&v, X).unwrap(), Some(0));
    assert_eq!(v.status().lost_blocks, 0);
    assert_eq!(read_version(&v, Y).unwrap(), Some(1));
}

#[test]
fn index_data_dirty_ends_a_loss_and_is_inserted_only_at_or_above_the_final_head() {
    // (a) X lost by a checkpoint tombstone; R2 writes X = 2: the loss ends, X is dirty.
    for rewrite in [false, true] {
        let mut chain = Chain::new();
        rewrite_newest_checkpoint(&chain.cache, |_, entries| {
            entries.push(CheckpointEntry { backing_block: X, slot: 0, dirty: false, lost: true, data_crc: 1 })
        });
        if rewrite {
            chain.append_sound(vec![], &[(EntryKind::DataDirty, X, 2)]);
        }
        let (v, _) = chain.open();
        if rewrite {
            assert_eq!(read_version(&v, X).unwrap(), Some(2));
            assert_eq!(dirty_in_index(&v, X), Some(true));
        } else {
            assert!(is_lost(&read_version(&v, X), X));
        }
    }
    // (b) R2 writes X = 1 at p; R3 moves the head past p: X is not cached.
    let mut chain = Chain::new();
    let r2 = chain.append_sound(vec![], &[(EntryKind::DataDirty, X, 1)]);
    let (mut h3, d3) = chain.forge(vec![], &[(EntryKind::DataDirty, Y, 1)]);
    h3.head_position = r2.pos + 2;
    chain.append(&h3, &d3, |_| {});
    let (v, report) = chain.open();
    assert_eq!(report.replayed_records, chain.records.len() as u64);
    assert_eq!(slot_of(&v, X), None);
    assert_eq!(read_version(&v, X).unwrap(), Some(0));
    assert_eq!(read_version(&v, Y).unwrap(), Some(1));
}

#[test]
fn index_data_clean_is_inserted_clean_only_at_or_above_the_final_head() {
    for below_head in [false, true] {
        let mut chain = Chain::new();
        let r2 = chain.append_sound(vec![], &[(EntryKind::DataClean, X, 0)]);
        if below_head {
            let (mut h3, d3) = chain.forge(vec![], &[(EntryKind::DataDirty, Y, 1)]);
            h3.head_position = r2.pos + 2;
            chain.append(&h3, &d3, |_| {});
        }
        let (v, report) = chain.open();
        assert_eq!(report.replayed_records, chain.records.len() as u64);
        assert_eq!(dirty_in_index(&v, X), if below_head { None } else { Some(false) });
        assert_eq!(read_version(&v, X).unwrap(), Some(0));
    }
}

#[test]
fn index_mark_clean_matches_by_position_for_copies_and_losses() {
    // A copy: R2 writes X = 1 at p; MarkClean(p) makes it clean, MarkClean(p + log_blocks)
    // (the same slot a lap later) does not.
    for (lap, clean) in [(0, true), (LOG_BLOCKS, false)] {
        let mut chain = Chain::new();
        let r2 = chain.append_sound(vec![], &[(EntryKind::DataDirty, X, 1)]);
        chain.append_sound(vec![meta(EntryKind::MarkClean, X, r2.pos + 1 + lap, 0)], &[]);
        let (v, _) = chain.open();
        assert_eq!(dirty_in_index(&v, X), Some(!clean), "MarkClean {lap} blocks later");
        assert_eq!(read_version(&v, X).unwrap(), Some(1));
    }
    // A loss: Lost(X at q); MarkClean(q) ends it, MarkClean(q + 1) does not.
    for (offset, lost) in [(0, false), (1, true)] {
        let mut chain = Chain::new();
        let q = chain.last().pos;
        chain.append_sound(vec![meta(EntryKind::Lost, X, q, crc_of(X, 1))], &[]);
        chain.append_sound(vec![meta(EntryKind::MarkClean, X, q + offset, 0)], &[]);
        let (v, _) = chain.open();
        assert_eq!(is_lost(&read_version(&v, X), X), lost, "MarkClean at q + {offset}");
    }
}

#[test]
fn index_trim_removes_the_blocks_entry() {
    let mut chain = Chain::new();
    chain.append_sound(vec![], &[(EntryKind::DataDirty, X, 1)]);
    chain.append_sound(vec![meta(EntryKind::Trim, X, 0, 0)], &[]);
    let (v, report) = chain.open();
    assert_eq!(report.replayed_records, chain.records.len() as u64);
    assert_eq!(slot_of(&v, X), None);
    assert_eq!(read_version(&v, X).unwrap(), Some(0));
}

#[test]
fn index_trim_ends_a_loss() {
    // R2 writes X = 1 at p; R3 says that copy is lost; R4 trims X (a write-around put newer
    // data on the backing device, flushed): X reads the backing device.
    let mut chain = Chain::new();
    let r2 = chain.append_sound(vec![], &[(EntryKind::DataDirty, X, 1)]);
    chain.append_sound(vec![meta(EntryKind::Lost, X, r2.pos + 1, crc_of(X, 1))], &[]);
    chain.backing.write_at(X * BS as u64, &stamp(X, 2)).unwrap();
    chain.append_sound(vec![meta(EntryKind::Trim, X, 0, 0)], &[]);
    let (v, _) = chain.open();
    assert_eq!(slot_of(&v, X), None);
    assert_eq!(read_version(&v, X).unwrap(), Some(2));
    assert!(v.lost_blocks().is_empty());
}

#[test]
fn index_lost_entry_removes_the_block_and_makes_it_lost_with_its_crc() {
    // R2 writes X = 1 at p; R3 says that copy is lost. X reads as an I/O error, unless the
    // backing device holds exactly that version (open's recheck compares the entry's CRC).
    for backing_holds_it in [false, true] {
        let mut chain = Chain::new();
        let r2 = chain.append_sound(vec![], &[(EntryKind::DataDirty, X, 1)]);
        chain.append_sound(vec![meta(EntryKind::Lost, X, r2.pos + 1, crc_of(X, 1))], &[]);
        if backing_holds_it {
            chain.backing.write_at(X * BS as u64, &stamp(X, 1)).unwrap();
        }
        let (v, _) = chain.open();
        assert_eq!(slot_of(&v, X), None);
        let x = read_version(&v, X);
        if backing_holds_it {
            assert_eq!(x.unwrap(), Some(1));
        } else {
            assert!(is_lost(&x, X), "{x:?}");
        }
    }
}

#[test]
fn index_with_more_lost_blocks_than_the_checkpoint_holds_is_refused() {
    let max = tiercache_format::Layout::max_lost_blocks_for(LOG_BLOCKS);
    for count in [max, max + 1] {
        let mut chain = Chain::new();
        let q = chain.last().pos;
        let lost = (X..X + count).map(|b| meta(EntryKind::Lost, b, q, crc_of(b, 1))).collect();
        chain.append_sound(lost, &[]);
        match chain.try_open() {
            Ok((v, _)) => {
                assert_eq!(count, max, "{count} lost blocks accepted");
                assert_eq!(v.status().lost_blocks, max);
            }
            Err(EngineError::Corrupt(m @ Corruption::TooManyLost { .. })) => {
                assert_eq!(count, max + 1, "{m}");
                assert_eq!(m, Corruption::TooManyLost { count: max + 1, max }, "{m}");
                assert!(m.to_string().contains(&format!("more than the {max}")), "{m}");
            }
            Err(e) => panic!("{e}"),
        }
    }
}

// ------------------------------------------------------------------------------------------
// The backing device, and what open does before serving

#[test]
fn backing_device_not_the_formatted_one_is_refused_with_nothing_written() {
    let chain = Chain::new();
    let before = chain.cache.current_image();
    let other = Arc::new(SimDevice::from_image(stamps(0, BACKING_BLOCKS - 1, 0), BS as u32));
    match try_open_report(chain.cache.clone(), other) {
        Err(EngineError::WrongBacking { reason, .. }) => assert!(reason.contains("size"), "{reason}"),
        other => panic!("{:?}", other.map(|(_, r)| r)),
    }
    assert!(chain.cache.current_image() == before, "a refused attach wrote to the cache device");
    chain.open();
}

#[test]
fn open_flushes_rechecks_losses_starts_a_new_epoch_and_checkpoints_before_serving() {
    // R2 (X = 1) and R3 (Y lost, with the version the backing device holds) sit in the cache
    // device's volatile cache only, as after a process kill.
    let mut chain = Chain::new();
    let r2 = chain.append_sound(vec![], &[(EntryKind::DataDirty, X, 1)]);
    let r3 = chain.append_sound(vec![meta(EntryKind::Lost, Y, r2.pos, crc_of(Y, 0))], &[]);
    // Inspecting runs recovery and writes nothing.
    let before = chain.cache.current_image();
    let c: Arc<dyn BlockDevice> = chain.cache.clone();
    let b: Arc<dyn BlockDevice> = chain.backing.clone();
    let inspected = Volume::inspect(c, Some(b), Arc::new(tiercache_device::MonotonicClock::new())).unwrap();
    assert_eq!(inspected.log_window().2, r3.end());
    drop(inspected);
    assert!(chain.cache.current_image() == before, "inspect wrote to the cache device");

    let (v, report) = chain.open();
    assert_eq!(report.replay_end.position, r3.end());
    // Flushed: what was replayed is durable.
    let durable = durable_copy(&chain.cache);
    assert!(record_at(&durable, r3.pos).is_some_and(|r| r.header == r3.header), "the replayed records are durable");
    // The loss is over: the backing device holds exactly that version.
    assert_eq!(read_version(&v, Y).unwrap(), Some(0));
    assert_eq!(v.status().lost_blocks, 0);
    // A checkpoint at the tail with a new epoch, durable before open returned.
    let (_, ck, _) = newest_checkpoint(&durable);
    assert_eq!(ck.log_position, r3.end());
    assert_eq!(ck.epoch, r3.header.epoch + 1);
    assert_eq!(read_version(&v, X).unwrap(), Some(1));
}
