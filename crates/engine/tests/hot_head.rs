//! Reclaim at a head dense with blocks read again (volume/reclaim.rs, `reinsertions`). A
//! window holding more such blocks than its record copies ends early; how much it must still
//! free besides its record depends on who waits for the room:
//! - `read_misses_pass_every_hot_block_once`: only read misses wait (a reader's admission
//!   record; no reader waits for it): a window frees one block, so the head passes the whole
//!   hot set once, copying it, and evicts one hot block per record at most;
//! - `a_writer_waits_for_a_few_records`: a write is under way: each record frees a 16th of
//!   its room besides, evicting the least read of the window, so the writer's record waits
//!   for a bounded number of reclaims (no hundred records of copies per write);
//! - `the_hot_set_reads_back_intact`: after both, every block reads back the data last
//!   written, from cache or backing device;
//! - `segments_smaller_than_a_record_copy_a_record_each`: a reclaim record carries up to a
//!   record's entries of copies even where a segment is smaller (a header block per
//!   segment's worth of copies took slots from the cache, and evicted a hot block per
//!   record);
//! - `dirty_blocks_among_the_hot_ones_evict_none_of_them`: a window cut short with dirty
//!   blocks after the cut leaves them for a later window, as it leaves kept blocks.

use std::sync::Arc;
use tiercache_device::SimDevice;
use tiercache_engine::{Volume, VolumeOptions};

mod common;
use common::*;

const SEGMENT: u32 = 64;
const LOG_SEGMENTS: u64 = 16; // 1,024 blocks; records of 96 data blocks (a log of 1,024 / 8)
const BACKING_BLOCKS: u64 = 16_384;
/// Eight whole records of blocks read twice: 776 of the log's 1,024 slots.
const HOT: u64 = 768;
const RECORD_DATA: u64 = 96;

/// The log alone, no background thread (a reader whose admissions fill staging writes the
/// record itself, with no write under way), sequential reads admitted.
fn volume() -> (Arc<SimDevice>, Arc<SimDevice>, Volume) {
    let options = VolumeOptions { sequential_bypass_bytes: 0, ..VolumeOptions::default() };
    volume_seg(LOG_SEGMENTS, SEGMENT, BACKING_BLOCKS, options)
}

/// The `n`-th one-time block, far from the hot set, not consecutive.
fn cold(n: u64) -> u64 {
    2_000 + (n * 7) % 14_000
}

/// The hot set in a scattered order: no sequential stream (a scan read again would count
/// no read past 2 MiB).
fn hot_order() -> impl Iterator<Item = u64> {
    (0..HOT).map(|i| i * 7 % HOT)
}

/// A log whose first eight records hold `HOT` blocks, each read again since cached.
fn hot_log() -> (Arc<SimDevice>, Arc<SimDevice>, Volume) {
    let (c, b, v) = volume();
    read_once(&v, hot_order());
    read_once(&v, hot_order());
    let unread: Vec<u64> = (0..HOT).filter(|&b| freq(&v, b) != Some(1)).collect();
    assert!(unread.is_empty(), "the hot set is cached and read again: not {unread:?}");
    (c, b, v)
}

fn hot_cached(v: &Volume) -> u64 {
    let index = v.index_snapshot();
    index.iter().filter(|(b, _)| *b < HOT).count() as u64
}

#[test]
fn read_misses_pass_every_hot_block_once() {
    let (_c, _b, v) = hot_log();
    let before = v.status().counters;
    // Four records of one-time misses: the first two fit in the free room, the third and
    // fourth need the head to move past the hot set to the first one-time record.
    read_once(&v, (0..4 * RECORD_DATA).map(cold));
    let c = v.status().counters;
    let reinserted = c.reinserted_blocks - before.reinserted_blocks;
    let cached = hot_cached(&v);
    assert!(reinserted >= HOT - HOT / 16, "the head passed the hot set: {reinserted} of {HOT} copied");
    // (One block freed per window: at most one hot block per reclaim record, each record
    // carrying at least half a segment of copies.)
    let records = reinserted.div_ceil(u64::from(SEGMENT) / 2);
    assert!(cached >= HOT - records, "{cached} of {HOT} hot blocks cached after {reinserted} copies");
    // The first one-time record, read once, went instead.
    let first_cold = (0..RECORD_DATA).filter(|&n| slot_of(&v, cold(n)).is_some()).count();
    assert_eq!(first_cold, 0, "the first one-time record is evicted");
}

#[test]
fn a_writer_waits_for_a_few_records() {
    let (_c, _b, misses) = hot_log();
    read_once(&misses, (0..2 * RECORD_DATA).map(cold));
    let base = misses.status().counters.reinserted_blocks;
    read_once(&misses, (2 * RECORD_DATA..3 * RECORD_DATA).map(cold));
    let by_misses = misses.status().counters.reinserted_blocks - base;

    let (_c, _b, v) = hot_log();
    read_once(&v, (0..2 * RECORD_DATA).map(cold));
    let before = v.status().counters;
    // One record of writes, the same size as the third record of misses above.
    v.write(cold(10_000) * BS as u64, &stamps(cold(10_000), RECORD_DATA, 1)).unwrap();
    v.flush().unwrap();
    let c = v.status().counters;
    let by_writer = c.reinserted_blocks - before.reinserted_blocks;
    let evicted_hot = HOT - hot_cached(&v);
    // The writer's room came at most a 16th of each window's copies apart (at least two
    // blocks per record of up to a segment of copies): fewer copies than the misses paid,
    // and hot blocks evicted instead (the least read of each dense window).
    assert!(by_writer < by_misses, "a writer paid {by_writer} copies, read misses {by_misses}");
    assert!(evicted_hot >= 2, "a dense window under a writer evicts kept blocks: {evicted_hot}");
    let records = by_writer.div_ceil(u64::from(SEGMENT) / 2);
    assert!(records <= 24, "the writer waited for about {records} reclaim records ({by_writer} copies)");
}

#[test]
fn the_hot_set_reads_back_intact() {
    let (_c, _b, v) = hot_log();
    read_once(&v, (0..4 * RECORD_DATA).map(cold));
    v.write(0, &stamps(0, 64, 7)).unwrap();
    v.flush().unwrap();
    read_once(&v, (4 * RECORD_DATA..6 * RECORD_DATA).map(cold));
    for b in 0..HOT {
        let want = if b < 64 { 7 } else { 0 };
        assert_eq!(read_version(&v, b).unwrap(), Some(want), "block {b}");
    }
}

#[test]
fn segments_smaller_than_a_record_copy_a_record_each() {
    // The same log of 1,024 blocks in 128 segments of 8: records of up to 128 data blocks.
    let options = VolumeOptions { sequential_bypass_bytes: 0, ..VolumeOptions::default() };
    let (c, _b, v) = volume_seg(128, 8, BACKING_BLOCKS, options);
    read_once(&v, hot_order());
    read_once(&v, hot_order());
    let record = v.status().counters.records_written;
    let before = (v.status().counters, c.stats().writes);
    // Misses of one-time blocks until the head has passed the hot set once.
    read_once(&v, (0..4 * RECORD_DATA).map(cold));
    let after = v.status().counters;
    let reinserted = after.reinserted_blocks - before.0.reinserted_blocks;
    assert!(reinserted >= HOT - HOT / 16, "the head passed the hot set: {reinserted} of {HOT} copied");
    // (Device writes: the misses' records and the reclaim records, one write each. A
    // reclaim record's copies are bounded by the free room too, which is small on a full log:
    // 28 copies each here, against 5.6 with a segment's bound.)
    let reclaims = c.stats().writes - before.1 - (after.records_written - record);
    assert!(
        reclaims * 16 <= reinserted,
        "{reinserted} copies took {reclaims} reclaim records: at least 16 copies each, not a segment's 8"
    );
    // (A segment's bound evicted 190 of them: a header and a hot block per few copies.)
    let cached = hot_cached(&v);
    assert!(cached >= HOT - HOT / 8, "{cached} of {HOT} hot blocks cached after {reinserted} copies");
}

#[test]
fn dirty_blocks_among_the_hot_ones_evict_none_of_them() {
    // The hot set as in `hot_log`, with a dirty block staged after every 32nd hot block:
    // each record holds three, and a window cut short at the first hot block that does not
    // fit its record has dirty blocks after the cut. (Such a window took the whole record
    // and evicted every hot block beyond its room: 3 of a 127-block window kept.)
    let (_c, _b, v) = volume();
    let dirty = |n: u64| 15_000 + n;
    for (n, b) in hot_order().enumerate() {
        read_once(&v, std::iter::once(b));
        if n % 32 == 31 {
            write(&v, dirty(n as u64 / 32), 1);
        }
    }
    v.flush().unwrap();
    read_once(&v, hot_order());
    assert_eq!(hot_cached(&v), HOT, "the hot set is cached");
    let before = v.status().counters;
    // Three records of one-time misses: the head passes the hot set once (a fourth would
    // bring it to the copies, their counts spent, as the dirty blocks take 24 more slots).
    read_once(&v, (0..3 * RECORD_DATA).map(cold));
    let reinserted = v.status().counters.reinserted_blocks - before.reinserted_blocks;
    let cached = hot_cached(&v);
    assert!(reinserted >= HOT - HOT / 16, "the head passed the hot set: {reinserted} of {HOT} copied");
    // (As with no dirty block, at most one hot block evicted per reclaim record, and one for
    // each slot a dirty block takes from the log: 736 kept here, 690 when a window with a
    // dirty block after its cut took the whole window.)
    let records = reinserted.div_ceil(u64::from(SEGMENT) / 2);
    assert!(cached >= HOT - records - HOT / 32, "{cached} of {HOT} hot blocks cached after {reinserted} copies");
    // The dirty blocks were copied forward, never written back or lost.
    for n in 0..HOT / 32 {
        assert_eq!(slot_of(&v, dirty(n)).map(|(_, d)| d), Some(true), "dirty block {n} still cached dirty");
        assert_eq!(read_version(&v, dirty(n)).unwrap(), Some(1));
    }
}
