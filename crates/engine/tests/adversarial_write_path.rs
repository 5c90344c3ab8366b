//! Adversarial review of 25ac7a0 ("write: a request's blocks are staged under one hold of the
//! state lock") and 3ab0531 ("write-around: a block with a dirty copy in staging is not
//! written around; an overlapping write-around waits only for the one it overlaps"). Each
//! test is one suspicion, made deterministic with `Dev` (holds chosen I/Os until released);
//! every wait is bounded. Results are in the comment above each test.
//!
//! Results (on 25ac7a0): all 6 pass; no bug found. `commit()`'s early return implies `put`
//! succeeds (and the Trim's room), and the staging limit is at least 2, so no writer spins;
//! the partial-fit loop keeps each block's Trim with its data; a poisoned volume mid-request
//! fails the request and FLUSH. Overlap waits pick up a write-around begun meanwhile.
//! `tiercache torture --seed 5000 --seeds 120`: no failed seed.
//!
//! Blocks used: 40 and up (the backing device's fingerprint blocks are 0, 1, 16 and the last).
//! Versions: 0 is the backing device's initial content, then increasing per write.

use std::sync::Arc;
use tiercache_device::{BlockDevice, FailMode, MonotonicClock, OpKind};
use tiercache_engine::{Volume, VolumeOptions, WriteAroundPolicy};

mod common;
use common::holds::*;
use common::*;

// Devices and volumes.

fn open_with(cache: Arc<dyn BlockDevice>, backing: Arc<dyn BlockDevice>, record_entries: usize) -> Volume {
    let o = VolumeOptions { record_entries: Some(record_entries), ..wa_options() };
    Volume::open(cache, backing, Arc::new(MonotonicClock::new()), o).expect("open").0
}

// ------------------------------------------------------------------------------------------
// 1. 25ac7a0: a request staged under one hold, as many blocks as fit.

// Suspicion: on tiny records (2, 3, 4 entries: data_limit 1, 2, 3) a request through the cache
// whose every block owes a write-around's Trim (room check `entries + 2 <= limit`) while
// another writer fills staging spins forever (commit() finds "room" that put() refuses), or
// a block's Trim lands in a record after its data, or a block is skipped/counted twice when
// the loop breaks mid-request. Refuted (passes): done, all blocks right live and after FLUSH
// and a power cut, counters exact.
#[test]
fn a_request_owing_trims_on_tiny_records_finishes_and_lands_whole() {
    for n in [2usize, 3, 4] {
        // (A large log: no checkpoint makes block 40's rewrite durable, which would let the
        // request go around legitimately.)
        let (cache, backing) = wa_devices(256, 256);
        let v = Arc::new(open_with(cache.clone(), backing.clone(), n));
        dirty_durable(&v, 40, 8, 1);
        write_n(&v, 40, 8, 2).unwrap();
        assert_eq!(around(&v), 8, "n {n}");
        write(&v, 40, 3); // staged with its Trim: the next request cannot go around
        let before = v.status().counters;
        let x = on_thread(&v, |v| write_n(v, 40, 8, 4));
        let other = on_thread(&v, |v| {
            for i in 0..40u64 {
                write(v, 100 + i, 7);
            }
        });
        join_within(x, 30, "the request owing Trims").unwrap();
        join_within(other, 30, "the other writer");
        let after = v.status().counters;
        assert_eq!(around(&v), 8, "n {n}: went around over a staged copy");
        assert_eq!(after.written_blocks - before.written_blocks, 48, "n {n}");
        assert_eq!(after.write_requests - before.write_requests, 41, "n {n}");
        assert_eq!(vers(&v, 40..48), vec![4; 8], "n {n} live");
        v.flush().unwrap();
        let r = crash_and_recover(&cache, &backing);
        assert_eq!(vers(&r, 40..48), vec![4; 8], "n {n} after FLUSH and a power cut");
        assert_eq!(vers(&r, 100..140), vec![7; 40], "n {n}");
    }
}

// Suspicion: concurrent overlapping multi-block writers on tiny records (each request split
// over several holds and commits, `commit()` returning early when another sealed) leave a
// block whose live read differs from what a FLUSH and a power cut bring back, or deadlock.
// Refuted (passes).
#[test]
fn overlapping_split_requests_on_tiny_records_agree_live_and_after_a_power_cut() {
    let (cache, backing) = wa_devices(32, 256);
    let o = VolumeOptions { record_entries: Some(3), ..VolumeOptions::default() };
    let v = Arc::new(Volume::open(cache.clone(), backing.clone(), Arc::new(MonotonicClock::new()), o).expect("open").0);
    let hs: Vec<_> = (1..=4u64)
        .map(|t| {
            on_thread(&v, move |v| {
                for i in 0..40u64 {
                    let first = 40 + (t * 7 + i * 3) % 30;
                    v.write(first * BS as u64, &stamps(first, 5, t * 1000 + i)).unwrap();
                }
            })
        })
        .collect();
    for h in hs {
        join_within(h, 60, "a writer");
    }
    let c = v.status().counters;
    assert_eq!((c.written_blocks, c.write_requests), (4 * 40 * 5, 160));
    let live = vers(&v, 40..75);
    v.flush().unwrap();
    let r = crash_and_recover(&cache, &backing);
    assert_eq!(vers(&r, 40..75), live);
}

// Suspicion: a request through the cache split by a commit (staging full) lets a write-around
// of its later blocks begin between its holds (those blocks were not staged yet); its later
// blocks are staged during that write-around and dropped at its end. Acceptable as two
// concurrent writes, but the outcome must be one version per block, the same live and after
// FLUSH and a power cut. Refuted (passes): 64..68 read the write-around, the rest the request.
#[test]
fn a_write_around_between_the_holds_of_a_split_request() {
    let (cache, backing) = wa_devices(32, 256); // staging: 24 data blocks
    let cdev = Dev::new(&cache);
    let bdev = Dev::new(&backing);
    let v = Arc::new(open_wa(cdev.clone(), bdev.clone()));
    write(&v, 40, 4); // staged: the request below goes through the cache
    let rec = cdev.hold(|op, _, len| op == Op::Write && len >= 2 * BS);
    let x = on_thread(&v, |v| write_n(v, 40, 30, 5));
    cdev.wait_held(rec); // 40..64 sealed; 64..70 not staged yet
    let hw = bdev.hold_write_of(64);
    let w = on_thread(&v, |v| write_n(v, 64, 4, 6));
    bdev.wait_held(hw);
    cdev.release(rec);
    join_within(x, 30, "the split request").unwrap();
    bdev.release(hw);
    join_within(w, 30, "the write-around").unwrap();
    assert_eq!(around(&v), 4);
    let live = vers(&v, 40..70);
    for (i, &x) in live.iter().enumerate() {
        assert!(x == 5 || (x == 6 && (24..28).contains(&i)), "block {}: {x}", 40 + i);
    }
    v.flush().unwrap();
    let r = crash_and_recover(&cache, &backing);
    assert_eq!(vers(&r, 40..70), live);
}

// Suspicion: a record write failing in the middle of a split request (the volume poisoned
// between two holds): the request must fail, FLUSH too, and after a power cut every block is
// whole, the older version (nothing of the request was flushed). Refuted (passes).
#[test]
fn a_failed_record_in_the_middle_of_a_split_request() {
    let (cache, backing) = wa_devices(32, 256);
    let o = VolumeOptions {
        write_around: WriteAroundPolicy { min_bytes: 0, only_when_destage_bound: true },
        ..VolumeOptions::default()
    };
    let v = Volume::open(cache.clone(), backing.clone(), Arc::new(MonotonicClock::new()), o).expect("open").0;
    dirty_durable(&v, 40, 30, 1);
    cache.fail_after(Some(OpKind::Write), 0, FailMode::Once);
    assert!(write_n(&v, 40, 30, 2).is_err(), "a request whose record write failed");
    assert!(v.flush().is_err());
    let r = crash_and_recover(&cache, &backing);
    assert_eq!(vers(&r, 40..70), vec![1; 30]);
}

// ------------------------------------------------------------------------------------------
// 2. 3ab0531: dirty staged copies and overlapping write-arounds.

// Suspicion: a rewrite through the cache staged *during* a second write-around's backing
// write carries the first write-around's Trim (`trim_with_data`, or on its own after a
// checkpoint's settle: `untrimmed`) and is still staged at its end. `end_write_around` drops
// the rewrite; the Trim is dropped and owed again (first case) or stays staged (second). Live
// reads and the volume after FLUSH and a power cut must agree on the second write-around's
// data; a power cut without FLUSH must not bring back version 0. Refuted (passes).
#[test]
fn a_rewrite_staged_during_a_second_write_around_and_still_staged_at_its_end() {
    for settled in [false, true] {
        let (cache, backing) = wa_devices(32, 256);
        let bdev = Dev::new(&backing);
        let v = Arc::new(open_wa(cache.clone(), bdev.clone()));
        dirty_durable(&v, 40, 2, 1);
        write_n(&v, 40, 2, 2).unwrap();
        if settled {
            v.checkpoint().unwrap(); // settles: the Trims are owed on their own
        }
        let hw = bdev.hold_write_of(40);
        let a = on_thread(&v, |v| write_n(v, 40, 2, 4));
        bdev.wait_held(hw);
        assert_eq!(around(&v), 2, "settled {settled}: the second went around");
        write(&v, 40, 3);
        assert_eq!(ver(&v, 40), 3);
        bdev.release(hw);
        join_within(a, 30, "the second write-around").unwrap();
        let live = vers(&v, 40..42);
        assert_eq!(live, vec![4, 4], "settled {settled}");
        let mid = crash_and_recover(&cache, &backing);
        for b in 40..42 {
            assert_ne!(ver(&mid, b), 0, "settled {settled}: block {b} without FLUSH");
        }
        v.flush().unwrap();
        let r = crash_and_recover(&cache, &backing);
        assert_eq!(vers(&r, 40..42), live, "settled {settled}: after FLUSH and a power cut");
        // A fill of the block written around stays out until flushed (it was).
        assert_eq!(vers(&v, 40..42), live);
    }
}

// Suspicion: overlapping chain A <- B <- C. B (42..46) overlaps A (40..44) and waits for it
// only; C (44..48) does not overlap A and begins meanwhile. When A ends B must not begin
// while C (which it overlaps) is under way, and its data must end up over C's on 44, 45 in
// the order they actually ran, live and after a power cut. Refuted (passes).
#[test]
fn an_overlap_chain_waits_for_the_write_around_that_began_meanwhile() {
    let (cache, backing) = wa_devices(32, 256);
    let bdev = Dev::new(&backing);
    let v = Arc::new(open_wa(cache.clone(), bdev.clone()));
    let ha = bdev.hold_write_of(40);
    let a = on_thread(&v, |v| write_n(v, 40, 4, 2));
    bdev.wait_held(ha);
    let b = on_thread(&v, |v| write_n(v, 42, 4, 3));
    assert!(!finishes_within(&b, 1), "B overlaps A: it waits");
    let hc = bdev.hold_write_of(44);
    let c = on_thread(&v, |v| write_n(v, 44, 4, 4));
    bdev.wait_held(hc);
    bdev.release(ha);
    join_within(a, 30, "A").unwrap();
    assert!(!finishes_within(&b, 1), "B began while C, which it overlaps, was under way");
    bdev.release(hc);
    join_within(c, 30, "C").unwrap();
    join_within(b, 30, "B").unwrap();
    assert_eq!(around(&v), 12);
    let expect = vec![2, 2, 3, 3, 3, 3, 4, 4];
    assert_eq!(vers(&v, 40..48), expect);
    v.flush().unwrap();
    let r = crash_and_recover(&cache, &backing);
    assert_eq!(vers(&r, 40..48), expect);
}
