//! Adversarial review of concurrent write-arounds (commit 2942a9b, "write-around:
//! write-arounds run concurrently"), of 2281d8b (a block rewritten through the cache while
//! it went around, whose record is still in flight when the write-around ends, owes no Trim)
//! and of e6945ee (threshold 64 KiB). Each test is one suspicion, made deterministic with a
//! device wrapper (`Dev`, below) that holds any number of chosen I/Os at once, each until the
//! test lets it go; the comment above each says whether the suspicion held (BUG) or was
//! refuted. Every wait is bounded: a deadlock fails the test instead of hanging it.
//!
//! Results (on 2942a9b): three tests fail.
//! - `a_copy_staged_before_a_write_around_and_sealed_during_it_does_not_come_back` and
//!   `a_rewrite_carrying_a_trim_staged_before_a_second_write_around_does_not_come_back`: a
//!   dirty copy staged before a write-around began and sealed during its backing write is in
//!   flight when it ends; `end_write_around` takes it for a rewrite made during the
//!   write-around (2281d8b) and keeps it: reads, and after FLUSH a power cut, return the older
//!   version over a completed write-around. Both predate the concurrency (they fail on acd3bfe
//!   too, where the first one's power cut read the new data while live reads did not: 2281d8b
//!   made the crash state wrong as well).
//! - `an_overlapping_write_around_is_not_starved_by_write_arounds_of_other_blocks`: liveness
//!   only; an overlapping write-around waits until no write-around at all is under way.
//!
//! `tiercache torture` (seeds 1000..1040 and 2000..2200): no violation, but only 18
//! concurrent write-arounds in all.
//!
//! Blocks used: 40 and up (the backing device's fingerprint blocks are 0, 1, 16 and the last).
//! Versions: 0 is the backing device's initial content, then increasing per write.

use std::sync::Arc;
use std::time::Duration;
use tiercache_device::{FailMode, OpKind};
use tiercache_engine::EngineError;

mod common;
use common::holds::*;
use common::*;

// ------------------------------------------------------------------------------------------
// Devices and volumes.

// ------------------------------------------------------------------------------------------
// 1. The in-flight rule (2281d8b) meets a copy staged *before* the write-around.

// Suspicion: `end_write_around` treats any copy of the block in a record in flight as "a
// rewrite sealed while this write went around" (2281d8b), and nothing drops such a copy from
// the record in flight. But `begin_write_around` (`may_write_around`) only refuses blocks
// already in flight: a dirty copy still in *staging* when the write-around begins is allowed,
// and another client's write that fills staging seals it during the backing write. That copy
// is older than the write-around (its write returned before the write-around was issued),
// yet when the write-around ends it is in flight: it survives, is served by reads at once
// and enters the index when its record is written; no Trim is owed (2281d8b), so after FLUSH
// and a power cut it replays over the written-around data too.
//
// BUG (fixed below): one client writes block 40 (version 2, staged), then writes blocks 40..42 (version 3,
// around); a second client's writes through the cache seal staging during the backing write.
// Reads of block 40 then return version 2, and so does the recovered volume after FLUSH: the
// completed write of version 3 is lost (the backing device holds it, and write-back later
// puts version 2 over it). (Before 2281d8b the live read was already wrong; the Trim owed
// then at least made the recovered volume read 3.)
#[test]
fn a_copy_staged_before_a_write_around_and_sealed_during_it_does_not_come_back() {
    // Fixed (and the simulator's stream seeds hit it too: seed 174): a block with a dirty
    // copy in staging is not written around (`may_write_around`), so the interleaving above
    // cannot begin; the write goes through the cache, after the staged copy.
    let (cache, backing) = wa_devices(32, 256); // staging: 24 data blocks
    let v = Arc::new(open_wa(cache.clone(), backing.clone()));
    dirty_durable(&v, 40, 2, 1);
    write(&v, 40, 2); // staged; returned before the write below is issued
    write_n(&v, 40, 2, 3).unwrap();
    assert_eq!(around(&v), 0, "a block with a dirty copy in staging was written around");
    let filler = on_thread(&v, |v| {
        for b in 100..124 {
            write(v, b, 1);
        }
    });
    join_within(filler, 30, "the filler");
    let live = (ver(&v, 40), ver(&v, 41));
    v.flush().unwrap();
    let r = crash_and_recover(&cache, &backing);
    let recovered = (ver(&r, 40), ver(&r, 41));
    assert_eq!((live, recovered), ((3, 3), (3, 3)), "blocks 40, 41: (live, after FLUSH and a power cut)");
}

// Suspicion: the same hole through the other path that stages a dirty copy of a block
// written around: a rewrite after a first write-around carries that write-around's Trim in
// staging (`trim_with_data`). A second write-around of the block begins (the rewrite is
// staged, not in flight: allowed); the rewrite and its Trim are sealed during the backing
// write (the seal clears `trim_with_data`), so at the end `end_write_around` neither drops the
// staged Trim nor owes one, and the sealed rewrite, older than the second write-around,
// survives.
//
// BUG (fixed below): reads return version 3 (the rewrite) after the write-around of version 4 completed,
// and so does the recovered volume after FLUSH.
#[test]
fn a_rewrite_carrying_a_trim_staged_before_a_second_write_around_does_not_come_back() {
    // Fixed: the staged rewrite keeps the second write out of the write-around path (see the
    // test above); it goes through the cache, after the rewrite and its Trim.
    let (cache, backing) = wa_devices(32, 256);
    let v = Arc::new(open_wa(cache.clone(), backing.clone()));
    dirty_durable(&v, 40, 2, 1);
    write_n(&v, 40, 2, 2).unwrap(); // first write-around: blocks 40, 41 owe a Trim
    assert_eq!(around(&v), 2);
    write(&v, 40, 3); // staged with block 40's Trim
    write_n(&v, 40, 2, 4).unwrap();
    assert_eq!(around(&v), 2, "the second write went around over a staged rewrite");
    let filler = on_thread(&v, |v| {
        for b in 100..124 {
            write(v, b, 1);
        }
    });
    join_within(filler, 30, "the filler");
    let live = (ver(&v, 40), ver(&v, 41));
    v.flush().unwrap();
    let r = crash_and_recover(&cache, &backing);
    let recovered = (ver(&r, 40), ver(&r, 41));
    assert_eq!((live, recovered), ((4, 4), (4, 4)), "blocks 40, 41: (live, after FLUSH and a power cut)");
}

// Suspicion (2281d8b's own case, kept as a control): a rewrite issued *during* the backing
// write and in flight at the end wins, live and after FLUSH and a power cut, and it is the
// same version both ways. Refuted (passes).
#[test]
fn a_rewrite_during_the_backing_write_in_flight_at_the_end_is_one_version_throughout() {
    let (cache, backing) = wa_devices(32, 256);
    let cdev = Dev::new(&cache);
    let bdev = Dev::new(&backing);
    let v = Arc::new(open_wa(cdev.clone(), bdev.clone()));
    dirty_durable(&v, 40, 2, 1);
    let wa = bdev.hold_write_of(40);
    let a = on_thread(&v, |v| write_n(v, 40, 2, 2));
    bdev.wait_held(wa);
    // A concurrent write-around of other blocks under way too (it ends last).
    let wb = bdev.hold_write_of(80);
    let b = on_thread(&v, |v| write_n(v, 80, 4, 2));
    bdev.wait_held(wb);
    let rec = cdev.hold(|op, _, len| op == Op::Write && len >= 2 * BS);
    let filler = on_thread(&v, |v| {
        write(v, 40, 3);
        for b in 100..124 {
            write(v, b, 1);
        }
    });
    cdev.wait_held(rec);
    bdev.release(wa);
    join_within(a, 30, "write-around A").unwrap();
    cdev.release(rec);
    join_within(filler, 30, "the filler");
    bdev.release(wb);
    join_within(b, 30, "write-around B").unwrap();
    let live = ver(&v, 40);
    assert!(live == 2 || live == 3);
    v.flush().unwrap();
    assert_eq!(ver(&v, 40), live);
    let r = crash_and_recover(&cache, &backing);
    assert_eq!((ver(&r, 40), ver(&r, 41)), (live, 2));
    assert_eq!(vers(&r, 80..84), vec![2; 4]);
}

// Suspicion (2281d8b): the rewrite in flight that made the write-around owe no Trim fails
// to reach the log (its record write fails). Nothing then ends the older copy but the
// rewrite that never landed: a FLUSH must not succeed, and after a power cut the block must
// read the older copy or the written-around data (no FLUSH covered either write), whole,
// never version 0. Refuted (passes): the failed record poisons the volume.
#[test]
fn a_failed_record_of_the_rewrite_in_flight_at_the_end_poisons() {
    let (cache, backing) = wa_devices(32, 256);
    let cdev = Dev::new(&cache);
    let bdev = Dev::new(&backing);
    let v = Arc::new(open_wa(cdev.clone(), bdev.clone()));
    dirty_durable(&v, 40, 2, 1);
    let wa = bdev.hold_write_of(40);
    let a = on_thread(&v, |v| write_n(v, 40, 2, 2));
    bdev.wait_held(wa);
    let rec = cdev.hold(|op, _, len| op == Op::Write && len >= 2 * BS);
    let filler = on_thread(&v, |v| {
        write(v, 40, 3);
        for b in 100..124 {
            write(v, b, 1);
        }
    });
    cdev.wait_held(rec);
    bdev.release(wa);
    join_within(a, 30, "the write-around").unwrap();
    cache.fail_after(Some(OpKind::Write), 0, FailMode::Once);
    cdev.release(rec);
    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| join_within(filler, 30, "the filler")));
    assert!(v.flush().is_err(), "FLUSH after a failed record write");
    let r = crash_and_recover(&cache, &backing);
    for b in 40..42 {
        let x = ver(&r, b);
        assert!(x == 1 || x == 2, "block {b} read {x} after the power cut");
    }
}

// ------------------------------------------------------------------------------------------
// 2. Settles, FLUSH and the Around bookkeeping with two write-arounds under way.

// Suspicion: two write-arounds ending in the reverse of the order they began (generations
// assigned at the end), with a FLUSH issued between the two ends, lose one of them: the
// FLUSH's settle covers a generation but not the other's blocks, or `admissible` lets a clean
// copy in while one is unflushed. After that FLUSH, the write-around that ended before it
// must survive a power cut; after a second FLUSH both must. Refuted (passes): FLUSH waits for
// the one under way (its settle needs the around lock with none under way).
#[test]
fn write_arounds_ending_in_either_order_around_a_flush() {
    for a_first in [false, true] {
        let (cache, backing) = wa_devices(32, 256);
        let bdev = Dev::new(&backing);
        let v = Arc::new(open_wa(cache.clone(), bdev.clone()));
        dirty_durable(&v, 40, 4, 1);
        dirty_durable(&v, 80, 4, 1);
        let wa = bdev.hold_write_of(40);
        let a = on_thread(&v, |v| write_n(v, 40, 4, 2));
        bdev.wait_held(wa);
        let wb = bdev.hold_write_of(80);
        let b = on_thread(&v, |v| write_n(v, 80, 4, 3));
        bdev.wait_held(wb);
        assert_eq!(v.status().counters.concurrent_write_arounds, 1);
        let (first, second, first_range, first_ver) = if a_first { (wa, wb, 40..44, 2) } else { (wb, wa, 80..84, 3) };
        bdev.release(first);
        let (h1, h2) = if a_first { (a, b) } else { (b, a) };
        join_within(h1, 30, "the first write-around to end").unwrap();
        // A read of a block never cached meanwhile: no clean admission while one is unflushed.
        assert_eq!(ver(&v, 200), 0);
        let f = on_thread(&v, |v| v.flush());
        let done_early = finishes_within(&f, 1);
        // (A power cut while FLUSH waits: the first write-around has no FLUSH yet; the
        // blocks read version 1 or the new one, never 0.)
        let mid = crash_and_recover(&cache, &backing);
        for blk in first_range.clone() {
            let x = ver(&mid, blk);
            assert!(x == 1 || x == first_ver, "block {blk} read {x} mid-FLUSH");
        }
        bdev.release(second);
        join_within(h2, 30, "the second write-around").unwrap();
        join_within(f, 30, "the FLUSH").unwrap();
        assert!(!done_early, "FLUSH returned while a write-around was under way");
        let r = crash_and_recover(&cache, &backing);
        assert_eq!(vers(&r, first_range.clone()), vec![first_ver; 4], "a_first {a_first}");
        v.flush().unwrap();
        let r2 = crash_and_recover(&cache, &backing);
        assert_eq!(vers(&r2, 40..44), vec![2; 4], "a_first {a_first}");
        assert_eq!(vers(&r2, 80..84), vec![3; 4], "a_first {a_first}");
        assert_eq!(ver(&v, 200), 0);
    }
}

// Suspicion: a checkpoint, a reclaim (it holds the io lock, and waits in `lock_around` and
// `lock_destage`), a write-back batch, `write_back_all`, a reader's loss check, FLUSH and an
// overlapping write-around all waiting for a write-around under way deadlock (or trip the
// lock-order check, on in the tests) once it ends; or one of them slips in and writes an
// older version over it. Refuted (passes): all finish once it ends; every version is right
// live and after a power cut.
#[test]
fn everything_waiting_for_a_write_around_under_way_finishes_after_it() {
    let (cache, backing) = wa_devices(16, 512); // a small log: the writers below reclaim
    let cdev = Dev::new(&cache);
    let bdev = Dev::new(&backing);
    let v = Arc::new(open_wa(cdev.clone(), bdev.clone()));
    dirty_durable(&v, 40, 4, 1);
    dirty_durable(&v, 60, 2, 1);
    // Block 60's cached copy rots: a reader's loss check takes the destage lock.
    corrupt_cached_block(&cache, &v, 60);
    let wa = bdev.hold_write_of(40);
    let a = on_thread(&v, |v| write_n(v, 40, 4, 2));
    bdev.wait_held(wa);
    let mut waiters: Vec<(&str, std::thread::JoinHandle<Result<(), EngineError>>)> = Vec::new();
    waiters.push(("a checkpoint", on_thread(&v, |v| v.checkpoint())));
    waiters.push(("a write-back batch", on_thread(&v, |v| v.destage_step(64).map(|_| ()))));
    waiters.push(("FLUSH", on_thread(&v, |v| v.flush())));
    waiters.push(("an overlapping write-around", on_thread(&v, |v| write_n(v, 42, 4, 3))));
    waiters.push((
        "a reader's loss check",
        on_thread(&v, |v| match read_version(v, 60) {
            Ok(Some(1)) | Ok(Some(0)) => Ok(()),
            Err(EngineError::LostBlock { .. }) => Ok(()),
            other => panic!("block 60 read {other:?}"),
        }),
    ));
    // Writes through the cache until reclaim runs (io lock held while it waits).
    waiters.push((
        "writers through the cache (reclaim)",
        on_thread(&v, |v| {
            for i in 0..200u64 {
                write(v, 300 + i % 100, 10 + i);
                if i % 8 == 7 {
                    v.flush()?;
                }
            }
            Ok(())
        }),
    ));
    waiters.push(("write_back_all", on_thread(&v, |v| v.write_back_all(1.0, |_, _| true).map(|_| ()))));
    std::thread::sleep(Duration::from_millis(300));
    bdev.release(wa);
    join_within(a, 60, "the write-around").unwrap();
    for (what, h) in waiters {
        let r = join_within(h, 60, what);
        if what != "write_back_all" && what != "FLUSH" && what != "a checkpoint" {
            r.unwrap_or_else(|e| panic!("{what}: {e}"));
        }
    }
    let expect = [2, 2, 3, 3, 3, 3];
    assert_eq!(vers(&v, 40..46), expect);
    v.flush().unwrap();
    let r = crash_and_recover(&cache, &backing);
    assert_eq!(vers(&r, 40..46), expect);
    cdev.release_all();
}

// ------------------------------------------------------------------------------------------
// 3. Errors.

// Suspicion: the backing write of one of two concurrent write-arounds fails: its waiters
// stay blocked (its entry stays in `under_way`), the other's bookkeeping is undone, the
// volume is poisoned, or the failed one's older copy is dropped. Refuted (passes).
#[test]
fn a_failed_backing_write_beside_a_concurrent_write_around() {
    let (cache, backing) = wa_devices(32, 256);
    let bdev = Dev::new(&backing);
    let v = Arc::new(open_wa(cache.clone(), bdev.clone()));
    dirty_durable(&v, 40, 2, 1);
    dirty_durable(&v, 80, 2, 1);
    let wa = bdev.hold_write_of(40);
    let a = on_thread(&v, |v| write_n(v, 40, 2, 2));
    bdev.wait_held(wa);
    // The next write reaching the backing device (B's; A's is held before it) fails.
    backing.fail_after(Some(OpKind::Write), 0, FailMode::Once);
    assert!(write_n(&v, 80, 2, 3).is_err(), "B's backing write failed");
    assert_eq!(vers(&v, 80..82), vec![1, 1], "B's older copy stays");
    let c = on_thread(&v, |v| v.checkpoint());
    let early = finishes_within(&c, 1);
    bdev.release(wa);
    join_within(a, 30, "write-around A").unwrap();
    join_within(c, 30, "the checkpoint").unwrap();
    assert!(!early, "the checkpoint ran during write-around A");
    assert_eq!(vers(&v, 40..42), vec![2, 2]);
    v.flush().unwrap();
    let r = crash_and_recover(&cache, &backing);
    assert_eq!((vers(&r, 40..42), vers(&r, 80..82)), (vec![2, 2], vec![1, 1]));
    // Not poisoned: B's blocks go around again, durably.
    write_n(&v, 80, 2, 4).unwrap();
    v.flush().unwrap();
    let r2 = crash_and_recover(&cache, &backing);
    assert_eq!(vers(&r2, 80..82), vec![4, 4]);
}

// ------------------------------------------------------------------------------------------
// 4. Liveness of the overlap loop.

// Suspicion: a write-around that overlaps one under way (`Begin::Overlaps`) waits, without
// the around lock, until *no* write-around at all is under way (`wait_for_write_arounds`),
// not just the one it overlaps, and holds no place in line. Write-arounds of other blocks keep
// beginning meanwhile (the around lock is free), so under a steady stream of them (QD > 1, a
// sequential writer) it waits for as long as the stream lasts, although its blocks are free.
//
// BUG (liveness, not safety; fixed: an overlapping write-around waits only for the one it
// overlaps): B (blocks 42..46) overlaps A (40..44). A ends while C (80..84)
// is under way; C ends while D (90..94) is under way: B does not begin at either point,
// although after A's end nothing under way overlaps it. It begins only when the stream pauses.
#[test]
fn an_overlapping_write_around_is_not_starved_by_write_arounds_of_other_blocks() {
    let (cache, backing) = wa_devices(32, 256);
    let bdev = Dev::new(&backing);
    let v = Arc::new(open_wa(cache.clone(), bdev.clone()));
    let ha = bdev.hold_write_of(40);
    let a = on_thread(&v, |v| write_n(v, 40, 4, 2));
    bdev.wait_held(ha);
    let b = on_thread(&v, |v| write_n(v, 42, 4, 3));
    assert!(!finishes_within(&b, 1), "B overlaps A: it waits");
    let hc = bdev.hold_write_of(80);
    let c = on_thread(&v, |v| write_n(v, 80, 4, 2));
    bdev.wait_held(hc);
    bdev.release(ha);
    join_within(a, 30, "A").unwrap();
    let began_after_a = finishes_within(&b, 3);
    let hd = bdev.hold_write_of(90);
    let d = on_thread(&v, |v| write_n(v, 90, 4, 2));
    bdev.wait_held(hd);
    bdev.release(hc);
    join_within(c, 30, "C").unwrap();
    let began_after_c = finishes_within(&b, 3);
    bdev.release(hd);
    join_within(d, 30, "D").unwrap();
    join_within(b, 30, "B once the stream paused").unwrap();
    assert_eq!(vers(&v, 40..46), vec![2, 2, 3, 3, 3, 3]);
    assert!(
        began_after_a || began_after_c,
        "B waited for write-arounds of other blocks: not after A ended (C under way), nor after C ended (D under way)"
    );
}
