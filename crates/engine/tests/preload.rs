//! `Volume::preload` (volume/preload.rs): a range read into the cache as hot data.
//! - `a_preloaded_range_is_hot_and_outlives_laps_of_one_time_reads`: a range larger than the
//!   read path admits (and sequential) is admitted, enters with the highest read count, and is
//!   still cached after one-time reads pushed the head through the log twice;
//! - `blocks_cached_already_are_marked_hot_without_a_read`;
//! - `a_write_during_the_preload_read_wins`: a block written while the preload's backing read
//!   of it is in flight keeps the written data (live and after a power cut);
//! - `a_stopped_preload_leaves_no_fill_behind`: the chunk read ahead when the caller stops is
//!   released, so a later write and read of its blocks are admitted as usual;
//! - `a_range_beyond_the_volume_is_refused`.

use std::sync::Arc;
use tiercache_device::{BlockDevice, MonotonicClock, SimDevice};
use tiercache_engine::{EngineError, Volume, VolumeOptions};

mod common;
use common::holds::*;
use common::*;

const SEGMENT: u32 = 64;
const LOG_SEGMENTS: u64 = 16; // 1,024 blocks
const BACKING_BLOCKS: u64 = 16_384;

fn volume() -> (Arc<SimDevice>, Arc<SimDevice>, Volume) {
    volume_seg(LOG_SEGMENTS, SEGMENT, BACKING_BLOCKS, VolumeOptions::default())
}

fn cold(n: u64) -> u64 {
    4_000 + (n * 7) % 12_000
}

#[test]
fn a_preloaded_range_is_hot_and_outlives_laps_of_one_time_reads() {
    let (_c, _b, v) = volume();
    let r = v.preload(0, 300 * BS as u64, |_| true).unwrap();
    assert_eq!((r.blocks, r.admitted_blocks, r.cached_blocks, r.left_out_blocks), (300, 300, 0, 0));
    for b in [0, 150, 299] {
        assert_eq!(freq(&v, b), Some(3), "block {b} entered hot");
    }
    assert_eq!(v.status().counters.preloaded_blocks, 300);
    // Two laps of one-time reads (the log holds 1,024 blocks). A run of hot blocks in
    // consecutive slots costs each reclaim record that keeps them a header and a little
    // progress for the writer (reclaim.rs, `reinsertions`): a few go per lap, the rest stay.
    read_once(&v, (0..2_000).map(cold));
    let hits = v.status().counters.read_hit_blocks;
    read_once(&v, 0..300);
    let got = v.status().counters.read_hit_blocks - hits;
    assert!(got >= 240, "{got} of 300 preloaded blocks still cached after two laps");
}

#[test]
fn blocks_cached_already_are_marked_hot_without_a_read() {
    let (cache, _b, v) = volume();
    read_once(&v, 0..8);
    read_once(&v, (0..300).map(cold)); // (their record is sealed)
    assert_eq!(freq(&v, 3), Some(0));
    let reads = cache.stats().reads;
    let r = v.preload(0, 8 * BS as u64, |_| true).unwrap();
    assert_eq!((r.admitted_blocks, r.cached_blocks), (0, 8));
    assert_eq!(cache.stats().reads, reads, "no cache read for blocks cached already");
    assert_eq!(freq(&v, 3), Some(3));
}

#[test]
fn a_write_during_the_preload_read_wins() {
    let (cache, backing) = devices_seg(LOG_SEGMENTS, SEGMENT, BACKING_BLOCKS, log_only());
    let gate = Dev::new(&backing);
    let c: Arc<dyn BlockDevice> = cache.clone();
    let b: Arc<dyn BlockDevice> = gate.clone();
    let v = Arc::new(Volume::open(c, b, Arc::new(MonotonicClock::new()), VolumeOptions::default()).expect("open").0);
    const X: u64 = 40;
    let held = gate.hold(|op, off, len| op == Op::Read && covers(off, len, X));
    let preload = {
        let v = Arc::clone(&v);
        std::thread::spawn(move || v.preload(0, 100 * BS as u64, |_| true))
    };
    gate.wait_held(held);
    write(&v, X, 7);
    v.flush().unwrap();
    gate.release(held);
    let r = join_within(preload, 30, "the preload").unwrap();
    assert_eq!(r.left_out_blocks, 1, "the block written meanwhile is not admitted from the old read");
    assert_eq!(read_version(&v, X).unwrap(), Some(7));
    let recovered = open(durable_copy(&cache), durable_copy(&backing));
    assert_eq!(read_version(&recovered, X).unwrap(), Some(7));
}

#[test]
fn a_stopped_preload_leaves_no_fill_behind() {
    let (cache, backing) = devices_seg(LOG_SEGMENTS, SEGMENT, BACKING_BLOCKS, log_only());
    let gate = Dev::new(&backing);
    let c: Arc<dyn BlockDevice> = cache.clone();
    let bk: Arc<dyn BlockDevice> = gate.clone();
    let v = Volume::open(c, bk, Arc::new(MonotonicClock::new()), VolumeOptions::default()).expect("open").0;
    // Chunks are 96 blocks here (three quarters of a 128-entry record). The read-ahead of the
    // second chunk is caught (its fills registered) before the caller stops after the first.
    let b = 100;
    let second = gate.hold(move |op, off, len| op == Op::Read && covers(off, len, b));
    let mut chunks = 0;
    v.preload(0, 600 * BS as u64, |_| {
        chunks += 1;
        gate.wait_held(second);
        gate.release(second);
        false
    })
    .unwrap();
    assert_eq!(chunks, 1);
    assert!(slot_of(&v, b).is_none());
    // A write of it (which would cancel a fill left registered), written back and evicted...
    write(&v, b, 3);
    v.write_back_all(1.0, |_, _| true).unwrap();
    read_once(&v, (0..2_000).map(cold));
    assert!(slot_of(&v, b).is_none(), "evicted");
    // ...then a read miss of it is admitted as usual.
    let admitted = v.status().counters.admitted_blocks;
    let mut buf = vec![0u8; BS];
    v.read(b * BS as u64, &mut buf).unwrap();
    assert_eq!(version_of(b, &buf), Some(3));
    assert_eq!(v.status().counters.admitted_blocks - admitted, 1, "the miss was admitted");
}

#[test]
fn a_range_beyond_the_volume_is_refused() {
    let (_c, _b, v) = volume();
    let e = v.preload((BACKING_BLOCKS - 1) * BS as u64, 2 * BS as u64, |_| true).unwrap_err();
    assert!(matches!(e, EngineError::OutOfRange { .. }), "{e:?}");
}
