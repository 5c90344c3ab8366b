//! The two scans of the whole index that no longer hold the state lock throughout
//! (`Volume::scan_index`, a chunk of buckets per hold): the elevator's plan (`destage_step`
//! takes its batches from a plan one scan fills, and looks each block up again as it takes
//! it) and `status`'s oldest dirty block. What changes between the plan and the batch
//! (rewrites, TRIMs, write-back by other paths, blocks dirtied behind the cursor) is what
//! these tests do to it.

use std::sync::Arc;
use tiercache_device::{BlockDevice, SimClock, SimDevice};
use tiercache_engine::{Volume, VolumeOptions};

mod common;
use common::*;

/// A volume of 64 segments of 8 blocks (512 slots) over 4096 backing blocks, on a clock the
/// test moves; no background thread.
fn rig() -> (Arc<SimDevice>, SimClock, Volume) {
    let clock = SimClock::new();
    let (cache, backing) = devices_on_clock(8, 512, 4096, &clock, FAST, SLOW);
    let c: Arc<dyn BlockDevice> = cache;
    let b: Arc<dyn BlockDevice> = backing.clone();
    let v = Volume::open(c, b, Arc::new(clock.clone()), VolumeOptions::default()).expect("open").0;
    (backing, clock, v)
}

fn write_one(v: &Volume, block: u64, version: u64) {
    v.write(block * BS as u64, &stamp(block, version)).unwrap();
}

/// Writes each of `blocks` at `version`, one request each (so they land in the index in no
/// address order), then FLUSHes.
fn write_each_flush(v: &Volume, blocks: impl IntoIterator<Item = u64>, version: u64) {
    for b in blocks {
        write_one(v, b, version);
    }
    v.flush().unwrap();
}

/// Scattered dirty blocks, written in no particular order: each batch takes the next ones by
/// address from where the last stopped, and the sweep wraps to the lowest.
#[test]
fn batches_take_dirty_blocks_in_address_order_from_the_cursor() {
    let (backing, _clock, v) = rig();
    let blocks: Vec<u64> = vec![3000, 17, 905, 2, 44, 1999, 600, 601, 3500, 12, 77, 1234];
    write_each_flush(&v, blocks.iter().copied(), 1);
    let mut sorted = blocks.clone();
    sorted.sort_unstable();
    let mut cleaned: Vec<u64> = Vec::new();
    while !dirty_blocks(&v).is_empty() {
        let before = dirty_blocks(&v);
        let n = v.destage_step(5).unwrap();
        let after = dirty_blocks(&v);
        assert!(n > 0, "dirty blocks are left, yet a batch wrote none: {after:?}");
        cleaned.extend(before.iter().filter(|b| !after.contains(b)).copied());
    }
    assert_eq!(cleaned, sorted, "one sweep, in address order");
    for &b in &blocks {
        assert_eq!(backing_version(&backing, b), Some(1), "block {b}");
    }
    // Dirtied again: the next sweep begins where the last batch stopped (past the highest),
    // so it wraps to the lowest.
    write_each_flush(&v, [5, 50, 3600], 2);
    assert_eq!(v.destage_step(1).unwrap(), 1);
    assert_eq!(dirty_blocks(&v), vec![5, 50], "3600, after the cursor, came first");
}

/// A block the plan holds is rewritten before its batch: the batch writes back the newest
/// version (its entry looked up afresh), never the one the scan saw.
#[test]
fn a_planned_block_rewritten_meanwhile_goes_back_at_its_newest_version() {
    let (backing, _clock, v) = rig();
    write_each_flush(&v, 0..20, 1);
    assert_eq!(v.destage_step(4).unwrap(), 4); // the plan now holds 4..20
    write_one(&v, 10, 2);
    v.flush().unwrap();
    while v.destage_step(4).unwrap() > 0 {}
    assert!(dirty_blocks(&v).is_empty());
    assert_eq!(backing_version(&backing, 10), Some(2));
    assert_eq!(read_version(&v, 10).unwrap(), Some(2));
    for b in (0..20).filter(|&b| b != 10) {
        assert_eq!(backing_version(&backing, b), Some(1), "block {b}");
    }
}

/// A TRIM over the blocks the plan holds, before their batches: dirty copies stay (a TRIM
/// drops clean copies only), so the sweep writes every one of them back, at the version last
/// written, and the trimmed range reads that version still.
#[test]
fn a_trim_over_planned_dirty_blocks_leaves_them_to_the_sweep() {
    let (backing, _clock, v) = rig();
    write_each_flush(&v, 0..12, 1);
    assert_eq!(v.destage_step(2).unwrap(), 2);
    v.discard(4 * BS as u64, 4 * BS as u64).unwrap();
    v.flush().unwrap();
    let mut written = 0;
    loop {
        let n = v.destage_step(3).unwrap();
        if n == 0 {
            break;
        }
        written += n;
    }
    assert_eq!(written, 10, "blocks 2..12");
    for b in 0..12 {
        assert_eq!(backing_version(&backing, b), Some(1), "block {b}");
        assert_eq!(read_version(&v, b).unwrap(), Some(1), "block {b}");
    }
}

/// Everything the plan holds went clean by another path (the online flush's write-back):
/// the next batch does not come back empty while other blocks are dirty; a fresh scan
/// finds them.
#[test]
fn a_plan_gone_clean_is_replaced_by_a_fresh_scan() {
    let (_backing, _clock, v) = rig();
    write_each_flush(&v, 0..16, 1);
    assert_eq!(v.destage_step(4).unwrap(), 4); // the plan holds 4..16
    v.write_back_all(1.0, |_, _| true).unwrap();
    assert!(dirty_blocks(&v).is_empty());
    write_each_flush(&v, 100..103, 2);
    assert_eq!(v.destage_step(4).unwrap(), 3, "the new dirty blocks, found by a fresh scan");
    assert!(dirty_blocks(&v).is_empty());
}

/// A block dirtied behind the cursor while a plan is being taken waits for the next sweep;
/// one dirtied ahead of it but after the scan does too: the plan is what the scan found. Both
/// are written back once the plan runs out.
#[test]
fn blocks_dirtied_after_the_scan_wait_for_the_next_sweep() {
    let (_backing, _clock, v) = rig();
    write_each_flush(&v, 10..20, 1);
    assert_eq!(v.destage_step(4).unwrap(), 4); // 10..14; the plan holds 14..20
    write_one(&v, 5, 1); // behind the cursor
    write_one(&v, 30, 1); // ahead of it, after the scan
    v.flush().unwrap();
    assert_eq!(v.destage_step(4).unwrap(), 4); // 14..18
    assert_eq!(v.destage_step(4).unwrap(), 2, "the plan's last two"); // 18, 19
    assert_eq!(dirty_blocks(&v), vec![5, 30]);
    assert_eq!(v.destage_step(4).unwrap(), 2, "a fresh scan: 30, then 5");
    assert!(dirty_blocks(&v).is_empty());
}

/// A crash between batches of one plan loses nothing: the blocks not yet taken are still
/// dirty in the recovered cache, and write-back after recovery finishes them.
#[test]
fn a_power_cut_mid_plan_recovers_the_rest_dirty() {
    let clock = SimClock::new();
    let (cache, backing) = devices_on_clock(8, 512, 4096, &clock, FAST, SLOW);
    let c: Arc<dyn BlockDevice> = cache.clone();
    let b: Arc<dyn BlockDevice> = backing.clone();
    let v = Volume::open(c, b, Arc::new(clock.clone()), VolumeOptions::default()).expect("open").0;
    let mut model = Model::new();
    for b in (0..200).step_by(7) {
        write_flush(&v, &mut model, b, 1, 3);
    }
    assert!(v.destage_step(8).unwrap() > 0);
    let (cache_image, backing_image) = (cache.durable_image(), backing.durable_image());
    drop(v);
    let clock = SimClock::new();
    let (cache, backing) = devices_from_images_on_clock(cache_image, backing_image, &clock, FAST, SLOW);
    let c: Arc<dyn BlockDevice> = cache;
    let b: Arc<dyn BlockDevice> = backing.clone();
    let v = Volume::open(c, b, Arc::new(clock), VolumeOptions::default()).expect("recover").0;
    check_model(&v, &model, "after the power cut");
    let dirty = dirty_blocks(&v);
    assert!(!dirty.is_empty(), "the plan's untaken blocks are dirty still");
    while v.destage_step(5).unwrap() > 0 {}
    assert!(dirty_blocks(&v).is_empty());
    assert_backing_holds(&backing, &model);
}

/// `status`' oldest dirty age is the age of the oldest dirty copy in the log, scanned in
/// chunks: it follows write-back of the oldest, and is gone with the last dirty block.
#[test]
fn status_reports_the_oldest_dirty_copys_age() {
    let (_backing, clock, v) = rig();
    assert_eq!(v.status().oldest_dirty_age_seconds, None);
    write_one(&v, 7, 1);
    v.flush().unwrap();
    clock.advance_ns(30_000_000_000);
    write_one(&v, 3000, 1);
    v.flush().unwrap();
    clock.advance_ns(10_000_000_000);
    let age = v.status().oldest_dirty_age_seconds.expect("dirty data");
    assert!((39.0..=41.0).contains(&age), "block 7, written 40 s ago: {age}");
    // The elevator from block 0 takes block 7 first.
    assert_eq!(v.destage_step(1).unwrap(), 1);
    assert_eq!(dirty_blocks(&v), vec![3000]);
    let age = v.status().oldest_dirty_age_seconds.expect("dirty data");
    assert!((9.0..=11.0).contains(&age), "block 3000, written 10 s ago: {age}");
    assert_eq!(v.destage_step(1).unwrap(), 1);
    assert_eq!(v.status().oldest_dirty_age_seconds, None);
}
