//! Adversarial review of 5d7fdc7 (state-lock holds cut: the elevator's plan, `status`'s
//! chunked oldest-dirty scan, the checkpoint's cloned index, reclaim's per-segment holds).
//!
//! Suspicions, each a test below (PASS: refuted; FAIL: bug found):
//!
//! Both FAILs are fixed (each scan chunk runs on to the end of its run of full buckets,
//! `Index::run_end`, in `Volume::scan_index`); all 9 pass since. 4's Err is restored too
//! (`destage_step` checks the poison first). For CI time, 1 and 2 run seeds 0..12 (the review
//! ran 0..24: 77 s for 2 alone on a loaded 2-core machine), 7 runs 4 seeds.
//!
//! 1. FAIL `status_oldest_dirty_age_survives_a_backward_shift_across_a_chunk`: a TRIM between
//!    two chunks of `status`' scan moves the only dirty entry (probed from the bucket before
//!    16,384 into the second chunk) back into the chunk already scanned; the scan finds no
//!    dirty block, and status reports the tail's age (1.0 s) for a copy written 3601 s ago
//!    (7 of seeds 0..24). The comment's claim "when the scan found none, what is dirty now was
//!    written since it began" is false: a deletion's backward shift, not only a write.
//! 2. FAIL `destage_step_finds_a_dirty_block_moved_back_across_a_chunk`: the same shift during
//!    the elevator's sweep: `destage_step` returns Ok(0) with one dirty block left that
//!    nobody touched (seeds 4 and 18 of 0..24). The background round stops its write-back for
//!    that period on the 0; the old code (one atomic scan) could not miss it. The next call's
//!    sweep finds it (checked), so it is a delay, not a loss.
//!    Fix for both: let each chunk of `scan_index` run on past its end to the first EMPTY
//!    bucket (wrapping for the last chunk). An entry can only shift back below a chunk's end
//!    if its home is below it, and linear probing leaves no EMPTY between an entry's home and
//!    its bucket, so every such entry lies in that run and is seen (perhaps twice: the plan
//!    dedups, status takes a min). Runs are short at 85 % load.
//! 3. PASS `an_entry_seen_twice_at_the_table_wrap_is_written_back_once`: the wrap (an entry at
//!    bucket 0 homed at the last bucket, shifted back there mid-scan) is deduplicated.
//! 4. PASS (behaviour change noted, since undone) `destage_step_on_a_poisoned_clean_volume_reports_the_poison`:
//!    `plan_sweep` checks no poison and `take_planned` checks it only with a plan, so a
//!    poisoned volume with nothing dirty now returns Ok(0) (before: Err(Poisoned)). Every
//!    caller checks the poison elsewhere (background_tick, flush); the test accepts both.
//! 5. PASS `destage_step_with_zero_or_one_block_and_the_top_of_the_address_space`.
//! 6. PASS `planned_blocks_copied_forward_or_written_back_by_reclaim_go_back_at_the_newest`.
//! 7. PASS `reclaim_evictions_in_chunks_race_readers_trims_and_the_destager` (Sched, 4
//!    seeds; 12 in the review, 80 s on 2 cores, too long for CI: readers of never-written
//!    blocks always read version 0, writers' blocks read their last version, no assertion
//!    (the `!old.dirty` one, finish_reclaim's window check) fires; then a power cut
//!    recovers the model).
//! 8. PASS `checkpoint_clone_races_trims_writes_and_destage` (Sched: checkpoints taken while
//!    others TRIM, write and write back; the recovered volume holds the model).
//! 9. PASS `take_planned_never_spins_on_an_all_clean_plan`: a plan gone wholly clean costs one
//!    fresh sweep, and destage_step returns > 0 while untouched dirty blocks remain.
//!
//! Refuted by reading (no test of their own; 7 and the sim's batch test cover them):
//! - seal_reclaim_record now evicts before `drop_stale_reinsertions` with `copied` taken before
//!   the drop: a stale copy's block now skips eviction where before it was `remove_if_slot`ed
//!   with a slot it no longer had (a no-op): same outcome. With the io lock held and records
//!   drained (`lock_io` -> `drain_records`), no slot changes during reclaim, so a clean entry
//!   cannot turn dirty at the same slot between holds (`assert!(!old.dirty)` holds).
//! - Write-arounds cannot run between eviction chunks (the around lock is held across seal).
//! - `dirty_in_buckets` skips EMPTY (u32::MAX, dirty bit set) explicitly.
//! - `keep_nearest` with duplicates (the wrap's seen-twice) can only shorten a plan.
//! - `elevator.cursor = block + 1` cannot overflow (keys are u32 below MAX_BACKING_BLOCKS).
//! - A plan's tail end gives one short batch per plan (e.g. 536 blocks when batches are
//!   1000 and the plan 65,536): a small cost, no spin.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex as StdMutex};
use tiercache_device::{BlockDevice, SimClock, SimDevice};
use tiercache_engine::{EngineError, Volume, VolumeOptions};
use tiercache_sched::{Joined, Sched};

mod common;
use common::*;

/// `INDEX_SCAN_CHUNK` (constants.rs): the first bucket of the scan's second chunk.
const CHUNK: usize = 16_384;

/// The index's bucket count for a log of `log_blocks` (index.rs `with_capacity`).
fn bucket_count(log_blocks: u64) -> usize {
    ((log_blocks * 100).div_ceil(85)).max(log_blocks + 1) as usize
}

/// The index's home bucket of `key` (index.rs `home`).
fn home(key: u32, n: usize) -> usize {
    let h = u64::from(key.wrapping_mul(0x9E37_79B1));
    ((h * n as u64) >> 32) as usize
}

/// A shape of the table around bucket `boundary` (the first bucket of a scan chunk: 16,384,
/// or 0 for the wrap): clean entries `clean` (inserted in that order) homed in the 40
/// buckets before it, then the dirty `d`, homed before it too but probed past it, and `c`,
/// one of `clean` before the boundary whose removal shifts `d` back across it; `far`, homed
/// far away. Found by running the index's own probing (linear, backward-shift deletion).
struct Shape {
    log_blocks: u64,
    n: usize,
    clean: Vec<u64>,
    c: u64,
    d: u64,
    far: u64,
    /// The keys' buckets after the inserts (for checking against `index_snapshot`'s order).
    buckets: Vec<(usize, u64)>,
}

fn insert(table: &mut std::collections::HashMap<usize, u64>, n: usize, key: u64) -> usize {
    let mut i = home(key as u32, n);
    while table.contains_key(&i) {
        i = (i + 1) % n;
    }
    table.insert(i, key);
    i
}

fn remove(table: &mut std::collections::HashMap<usize, u64>, n: usize, key: u64) {
    let mut hole = *table.iter().find(|(_, &k)| k == key).unwrap().0;
    table.remove(&hole);
    let mut j = hole;
    loop {
        j = (j + 1) % n;
        let Some(&k) = table.get(&j) else { break };
        let h = home(k as u32, n);
        let in_range = if hole <= j { h > hole && h <= j } else { h > hole || h <= j };
        if !in_range {
            table.remove(&j);
            table.insert(hole, k);
            hole = j;
        }
    }
}

/// Signed distance of bucket `b` from `boundary` on the ring of `n`.
fn side(b: usize, boundary: usize, n: usize) -> i64 {
    let d = (b + n - boundary) % n;
    if d > n / 2 {
        d as i64 - n as i64
    } else {
        d as i64
    }
}

fn shape(blocks: u64, boundary: impl Fn(usize) -> usize) -> Shape {
    let log_blocks = 14_400u64;
    let n = bucket_count(log_blocks);
    let b = boundary(n);
    let near: Vec<u64> = (0..blocks).filter(|&k| (-40..0).contains(&side(home(k as u32, n), b, n))).collect();
    let far = (0..blocks).find(|&k| side(home(k as u32, n), b, n).abs() > 1000).unwrap();
    for &d in near.iter().rev() {
        let clean: Vec<u64> = near.iter().copied().filter(|&k| k != d).collect();
        let mut table = std::collections::HashMap::new();
        for &k in &clean {
            insert(&mut table, n, k);
        }
        let at = insert(&mut table, n, d);
        if !(0..8).contains(&side(at, b, n)) {
            continue;
        }
        for &c in &clean {
            let pos_c = *table.iter().find(|(_, &k)| k == c).unwrap().0;
            if side(pos_c, b, n) >= 0 {
                continue;
            }
            let mut t2 = table.clone();
            remove(&mut t2, n, c);
            let now = *t2.iter().find(|(_, &k)| k == d).unwrap().0;
            if side(now, b, n) < 0 {
                insert(&mut table, n, far);
                let mut buckets: Vec<(usize, u64)> = table.iter().map(|(&i, &k)| (i, k)).collect();
                buckets.sort_unstable();
                return Shape { log_blocks, n, clean, c, d, far, buckets };
            }
        }
    }
    panic!("no shape found");
}

const BLOCKS: u64 = 20_000;

struct Rig {
    clock: SimClock,
    backing: Arc<SimDevice>,
    v: Arc<Volume>,
}

fn rig_for(log_blocks: u64) -> Rig {
    let clock = SimClock::new();
    let (cache, backing) = devices_on_clock(8, log_blocks, BLOCKS, &clock, FAST, FAST);
    let (layout, _) = layout_of(&cache);
    assert_eq!(layout.log_blocks, log_blocks, "the layout's log is the one asked for");
    let c: Arc<dyn BlockDevice> = cache;
    let b: Arc<dyn BlockDevice> = backing.clone();
    let v = Volume::open(c, b, Arc::new(clock.clone()), VolumeOptions::default()).expect("open").0;
    Rig { clock, backing, v: Arc::new(v) }
}

/// The shape built: `clean` written and written back, then `d` written (dirty), an hour
/// before a later record (`far`, a read miss admitted clean); the table order checked
/// against the shape's simulated buckets.
fn build(r: &Rig, sh: &Shape) {
    for &k in &sh.clean {
        write(&r.v, k, 1);
    }
    r.v.flush().unwrap();
    while r.v.destage_step(256).unwrap() > 0 {}
    assert!(dirty_blocks(&r.v).is_empty());
    write(&r.v, sh.d, 1);
    r.v.flush().unwrap();
    r.clock.advance_ns(3_600_000_000_000);
    assert_eq!(read_version(&r.v, sh.far).unwrap(), Some(0));
    r.v.checkpoint().unwrap();
    let order: Vec<u64> = r.v.index_snapshot().into_iter().map(|(b, _)| b).collect();
    let expected: Vec<u64> = sh.buckets.iter().map(|&(_, k)| k).collect();
    assert_eq!(order, expected, "the table as simulated (n = {})", sh.n);
    r.clock.advance_ns(1_000_000_000);
    assert_eq!(dirty_blocks(&r.v), vec![sh.d]);
}

/// Runs `main_op` on thread 0 and `other` on a simulated thread, interleaved by `seed`.
fn race<T: Send + 'static>(seed: u64, main_op: impl FnOnce() -> T, other: impl FnOnce() + Send + 'static) -> T {
    tiercache_sched::quiet_stuck_panics();
    Sched::run(
        seed,
        10_000_000,
        || {},
        |s| {
            let h = s.spawn(other);
            let out = main_op();
            match s.join(h) {
                Joined::Returned(()) => {}
                Joined::Panicked(m) => panic!("the other thread panicked: {m}"),
                Joined::Stuck => panic!("stuck"),
            }
            out
        },
    )
    .unwrap_or_else(|_| panic!("seed {seed}: stuck"))
}

// ------------------------------------------------------------------------------------------
// 1. status' oldest dirty age, a TRIM between two chunks of its scan.

#[test]
fn status_oldest_dirty_age_survives_a_backward_shift_across_a_chunk() {
    let sh = shape(BLOCKS, |_| CHUNK);
    let (c, d) = (sh.c, sh.d);
    let mut wrong = Vec::new();
    for seed in 0..12 {
        let r = rig_for(sh.log_blocks);
        build(&r, &sh);
        let v = Arc::clone(&r.v);
        let v2 = Arc::clone(&r.v);
        let age = race(
            seed,
            move || v.status().oldest_dirty_age_seconds,
            move || {
                v2.discard(c * BS as u64, BS as u64).unwrap();
            },
        );
        assert_eq!(dirty_blocks(&r.v), vec![d]);
        let age = age.expect("dirty data");
        if age < 3600.0 {
            wrong.push((seed, age));
        }
    }
    assert!(
        wrong.is_empty(),
        "block {d}, dirty for 3601 s and the only dirty block, reported younger by status (seed, age): {wrong:?}"
    );
}

// ------------------------------------------------------------------------------------------
// 2. The elevator's sweep, the same shift.

#[test]
fn destage_step_finds_a_dirty_block_moved_back_across_a_chunk() {
    let sh = shape(BLOCKS, |_| CHUNK);
    let (c, d) = (sh.c, sh.d);
    let mut zero = Vec::new();
    for seed in 0..12 {
        let r = rig_for(sh.log_blocks);
        build(&r, &sh);
        let v = Arc::clone(&r.v);
        let v2 = Arc::clone(&r.v);
        let n = race(
            seed,
            move || v.destage_step(64).unwrap(),
            move || {
                v2.discard(c * BS as u64, BS as u64).unwrap();
            },
        );
        if n == 0 {
            assert_eq!(dirty_blocks(&r.v), vec![d], "seed {seed}");
            zero.push(seed);
            // (The next call's fresh sweep finds it.)
            assert_eq!(r.v.destage_step(64).unwrap(), 1, "seed {seed}");
        }
        assert!(dirty_blocks(&r.v).is_empty());
        assert_eq!(backing_version(&r.backing, d), Some(1));
    }
    assert!(zero.is_empty(), "destage_step returned 0 with block {d} dirty and untouched, seeds {zero:?}");
}

// ------------------------------------------------------------------------------------------
// 3. The wrap: an entry at bucket 0 homed at the last bucket, moved back there mid-scan
// (seen twice): written back once, status sane.

#[test]
fn an_entry_seen_twice_at_the_table_wrap_is_written_back_once() {
    let sh = shape(BLOCKS, |_| 0);
    let c = sh.c;
    for seed in 0..16 {
        let r = rig_for(sh.log_blocks);
        build(&r, &sh);
        let v = Arc::clone(&r.v);
        let v2 = Arc::clone(&r.v);
        let before = r.backing.stats();
        let n = race(
            seed,
            move || v.destage_step(64).unwrap(),
            move || {
                v2.discard(c * BS as u64, BS as u64).unwrap();
            },
        );
        assert_eq!(n, 1, "seed {seed}");
        let after = r.backing.stats();
        assert_eq!(delta(after, before).1, 1, "seed {seed}: one backing write");
        assert!(dirty_blocks(&r.v).is_empty());
        // (status over the same shapes: nothing dirty.)
        assert_eq!(r.v.status().oldest_dirty_age_seconds, None);
    }
}

// ------------------------------------------------------------------------------------------
// 4. destage_step on a poisoned volume with nothing dirty.

/// Before 5d7fdc7, `destage_step` took the state lock and checked the poison first; 5d7fdc7
/// returned Ok(0) for a volume with an empty plan and nothing dirty. The check is first again:
/// a poisoned volume's elevator says so.
#[test]
fn destage_step_on_a_poisoned_clean_volume_reports_the_poison() {
    let clock = SimClock::new();
    let (cache, backing) = devices_on_clock(8, 512, 4096, &clock, FAST, FAST);
    let c: Arc<dyn BlockDevice> = cache.clone();
    let b: Arc<dyn BlockDevice> = backing;
    let v = Volume::open(c, b, Arc::new(clock), VolumeOptions::default()).expect("open").0;
    write(&v, 5, 1);
    v.flush().unwrap();
    while v.destage_step(8).unwrap() > 0 {}
    cache.vanish();
    assert!(v.checkpoint().is_err());
    assert!(v.status().failure.is_some(), "poisoned");
    let r = v.destage_step(8);
    assert!(matches!(r, Err(EngineError::Poisoned { .. })), "{r:?}");
    let s = v.status();
    assert!(s.failure.is_some());
    assert_eq!(s.oldest_dirty_age_seconds, None);
}

// ------------------------------------------------------------------------------------------
// 5. max_blocks 0 and 1, the top of the address space.

#[test]
fn destage_step_with_zero_or_one_block_and_the_top_of_the_address_space() {
    let clock = SimClock::new();
    let (cache, backing) = devices_on_clock(8, 512, 4096, &clock, FAST, FAST);
    let c: Arc<dyn BlockDevice> = cache;
    let b: Arc<dyn BlockDevice> = backing.clone();
    let v = Volume::open(c, b, Arc::new(clock), VolumeOptions::default()).expect("open").0;
    for blk in [4095u64, 0, 4094, 1] {
        write(&v, blk, 1);
    }
    v.flush().unwrap();
    assert_eq!(v.destage_step(0).unwrap(), 0);
    assert_eq!(dirty_blocks(&v).len(), 4);
    // One at a time, in address order from 0; the cursor past the last block wraps.
    let mut order: Vec<u64> = Vec::new();
    for _ in 0..4 {
        let before = dirty_blocks(&v);
        assert_eq!(v.destage_step(1).unwrap(), 1);
        let after = dirty_blocks(&v);
        order.extend(before.iter().filter(|x| !after.contains(x)));
    }
    assert_eq!(order, vec![0, 1, 4094, 4095]);
    assert_eq!(v.destage_step(1).unwrap(), 0);
    // The cursor is now past the highest block (4096): the next sweep wraps to the lowest.
    for blk in [4095u64, 2] {
        write(&v, blk, 2);
    }
    v.flush().unwrap();
    assert_eq!(v.destage_step(1).unwrap(), 1);
    assert_eq!(dirty_blocks(&v), vec![4095], "wrapped to the lowest");
    assert_eq!(v.destage_step(0).unwrap(), 0);
    assert_eq!(v.destage_step(1).unwrap(), 1);
    assert_eq!(backing_version(&backing, 4095), Some(2));
    assert_eq!(backing_version(&backing, 2), Some(2));
}

// ------------------------------------------------------------------------------------------
// 6. Blocks the plan holds, copied forward (or written back) by reclaim before their batch.

#[test]
fn planned_blocks_copied_forward_or_written_back_by_reclaim_go_back_at_the_newest() {
    let clock = SimClock::new();
    let (cache, backing) = devices_on_clock(8, 512, 4096, &clock, FAST, FAST);
    let c: Arc<dyn BlockDevice> = cache.clone();
    let b: Arc<dyn BlockDevice> = backing.clone();
    let v = Volume::open(c, b, Arc::new(clock.clone()), VolumeOptions::default()).expect("open").0;
    let planned: Vec<u64> = (0..40).map(|i| 100 + i * 3).collect();
    for &blk in &planned {
        write(&v, blk, 1);
        v.flush().unwrap();
    }
    assert_eq!(v.destage_step(2).unwrap(), 2); // the plan holds the other 38
    let positions = |v: &Volume| -> Vec<(u64, u32)> {
        let mut p: Vec<(u64, u32)> =
            v.index_snapshot().into_iter().filter(|(b, _)| planned.contains(b)).map(|(b, e)| (b, e.slot)).collect();
        p.sort_unstable();
        p
    };
    let before = positions(&v);
    // Laps of the log with a few hot blocks rewritten: reclaim passes the planned ones.
    for round in 0..700u64 {
        write(&v, 3000 + round % 5, round + 1);
        v.flush().unwrap();
    }
    let (head, _, _) = v.log_window();
    assert!(head > 512, "the log lapped: head {head}");
    let after = positions(&v);
    assert_ne!(before, after, "reclaim moved (or wrote back and evicted) the planned blocks");
    let mut calls = 0;
    while !dirty_blocks(&v).is_empty() {
        let n = v.destage_step(3).unwrap();
        assert!(n > 0, "dirty blocks left, nobody else running, yet 0: {:?}", dirty_blocks(&v));
        calls += 1;
        assert!(calls < 1000);
    }
    for &blk in &planned {
        assert_eq!(backing_version(&backing, blk), Some(1), "block {blk}");
        assert_eq!(read_version(&v, blk).unwrap(), Some(1), "block {blk}");
    }
    for k in 0..5u64 {
        let last = (0..700u64).filter(|r| r % 5 == k).max().unwrap() + 1;
        assert_eq!(read_version(&v, 3000 + k).unwrap(), Some(last));
        assert_eq!(backing_version(&backing, 3000 + k), Some(last));
    }
    // And the recovered volume agrees.
    let (ci, bi) = (cache.durable_image(), backing.durable_image());
    drop(v);
    let clock = SimClock::new();
    let (cache, backing) = devices_from_images_on_clock(ci, bi, &clock, FAST, FAST);
    let c: Arc<dyn BlockDevice> = cache;
    let b: Arc<dyn BlockDevice> = backing;
    let r = Volume::open(c, b, Arc::new(clock), VolumeOptions::default()).expect("recover").0;
    for &blk in &planned {
        assert_eq!(read_version(&r, blk).unwrap(), Some(1), "block {blk} after recovery");
    }
}

// ------------------------------------------------------------------------------------------
// 7. Reclaim's chunked evictions (and window collection) against readers, TRIMs and the
// destager, under the deterministic scheduler.

/// Writers rewrite blocks 0..64 (each its own version sequence, recorded when acknowledged);
/// readers read 2000..2400 (never written: version 0 always, admitted as clean misses, so
/// the windows reclaim evicts are full of clean blocks read once and clean ones not read) and
/// the written blocks (a version at least the last acknowledged before the read began);
/// a TRIM thread drops clean copies over both ranges; a destager writes back.
#[test]
fn reclaim_evictions_in_chunks_race_readers_trims_and_the_destager() {
    for seed in 0..4u64 {
        let clock = SimClock::new();
        let (cache, backing) = devices_on_clock(8, 256, 4096, &clock, FAST, FAST);
        let c: Arc<dyn BlockDevice> = cache.clone();
        let b: Arc<dyn BlockDevice> = backing.clone();
        let v = Arc::new(Volume::open(c, b, Arc::new(clock.clone()), VolumeOptions::default()).expect("open").0);
        let acked: Arc<StdMutex<Vec<u64>>> = Arc::new(StdMutex::new(vec![0; 64]));
        let stop = Arc::new(AtomicBool::new(false));
        let failures: Arc<StdMutex<Vec<String>>> = Arc::new(StdMutex::new(Vec::new()));
        let out = Sched::run(
            seed,
            50_000_000,
            || {},
            |s| {
                tiercache_sched::quiet_stuck_panics();
                let mut hs = Vec::new();
                // Readers.
                for t in 0..2u64 {
                    let (v, stop, acked, failures) = (v.clone(), stop.clone(), acked.clone(), failures.clone());
                    let s2 = s.clone();
                    hs.push(s.spawn(move || {
                        while !stop.load(Ordering::Relaxed) {
                            let x = s2.gen_range(0..1000);
                            if x < 700 {
                                let first = 2000 + s2.gen_range(0..400);
                                let n = 1 + s2.gen_range(0..4).min(2400 - first);
                                let mut buf = vec![0u8; n as usize * BS];
                                match v.read(first * BS as u64, &mut buf) {
                                    Ok(()) => {
                                        for i in 0..n {
                                            let got =
                                                version_of(first + i, &buf[i as usize * BS..(i as usize + 1) * BS]);
                                            if got != Some(0) {
                                                failures.lock().unwrap().push(format!(
                                                    "reader {t}: block {} read {got:?}, never written",
                                                    first + i
                                                ));
                                            }
                                        }
                                    }
                                    Err(e) => failures.lock().unwrap().push(format!("reader {t}: {e}")),
                                }
                            } else {
                                let blk = s2.gen_range(0..64);
                                let floor = acked.lock().unwrap()[blk as usize];
                                match read_version(&v, blk) {
                                    Ok(Some(got)) if got >= floor => {}
                                    other => failures
                                        .lock()
                                        .unwrap()
                                        .push(format!("reader {t}: block {blk} read {other:?}, acknowledged {floor}")),
                                }
                            }
                        }
                    }));
                }
                // TRIM.
                {
                    let (v, stop, failures) = (v.clone(), stop.clone(), failures.clone());
                    let s2 = s.clone();
                    hs.push(s.spawn(move || {
                        while !stop.load(Ordering::Relaxed) {
                            let first =
                                if s2.gen_range(0..2) == 0 { 2000 + s2.gen_range(0..400) } else { s2.gen_range(0..64) };
                            let n = 1 + s2.gen_range(0..8);
                            if let Err(e) = v.discard(first * BS as u64, n * BS as u64) {
                                failures.lock().unwrap().push(format!("trim: {e}"));
                            }
                            for _ in 0..20 {
                                tiercache_sched::yield_now();
                            }
                        }
                    }));
                }
                // Destager.
                {
                    let (v, stop, failures) = (v.clone(), stop.clone(), failures.clone());
                    let s2 = s.clone();
                    hs.push(s.spawn(move || {
                        while !stop.load(Ordering::Relaxed) {
                            if let Err(e) = v.destage_step(1 + s2.gen_range(0..16) as usize) {
                                failures.lock().unwrap().push(format!("destage: {e}"));
                            }
                            for _ in 0..10 {
                                tiercache_sched::yield_now();
                            }
                        }
                    }));
                }
                // Writer (thread 0): small writes, flushed now and then: the log laps many times.
                let mut version = vec![0u64; 64];
                for i in 0..1500u64 {
                    let blk = s.gen_range(0..64);
                    version[blk as usize] += 1;
                    if let Err(e) = v.write(blk * BS as u64, &stamp(blk, version[blk as usize])) {
                        failures.lock().unwrap().push(format!("write: {e}"));
                        break;
                    }
                    if i % 4 == 0 {
                        if let Err(e) = v.flush() {
                            failures.lock().unwrap().push(format!("flush: {e}"));
                            break;
                        }
                        let mut a = acked.lock().unwrap();
                        for k in 0..64 {
                            a[k] = version[k];
                        }
                    }
                }
                v.flush().unwrap();
                stop.store(true, Ordering::Relaxed);
                for h in hs {
                    match s.join(h) {
                        Joined::Returned(()) => {}
                        Joined::Panicked(m) => failures.lock().unwrap().push(format!("panicked: {m}")),
                        Joined::Stuck => failures.lock().unwrap().push("stuck".into()),
                    }
                }
                version
            },
        );
        let version = match out {
            Ok(v) => v,
            Err(_) => panic!("seed {seed}: stuck"),
        };
        let f = failures.lock().unwrap().clone();
        assert!(f.is_empty(), "seed {seed}: {f:?}");
        let st = v.status();
        assert!(st.counters.evicted_blocks > 0 && st.log_head > 256, "seed {seed}: reclaim ran: {:?}", st.log_head);
        eprintln!(
            "seed {seed}: head {} evicted {} reclaimed {} copied {} reinserted {} admitted {}",
            st.log_head,
            st.counters.evicted_blocks,
            st.counters.reclaimed_blocks,
            st.counters.copied_forward_blocks,
            st.counters.reinserted_blocks,
            st.counters.admitted_blocks
        );
        for blk in 0..64u64 {
            assert_eq!(read_version(&v, blk).unwrap(), Some(version[blk as usize]), "seed {seed} block {blk}");
        }
        for blk in 2000..2400u64 {
            assert_eq!(read_version(&v, blk).unwrap(), Some(0), "seed {seed} block {blk}");
        }
        // A power cut now: the recovered volume holds the same.
        let (ci, bi) = (cache.durable_image(), backing.durable_image());
        drop(v);
        let clock = SimClock::new();
        let (cache2, backing2) = devices_from_images_on_clock(ci, bi, &clock, FAST, FAST);
        let c: Arc<dyn BlockDevice> = cache2;
        let b: Arc<dyn BlockDevice> = backing2;
        let r = Volume::open(c, b, Arc::new(clock), VolumeOptions::default()).expect("recover").0;
        for blk in 0..64u64 {
            assert_eq!(
                read_version(&r, blk).unwrap(),
                Some(version[blk as usize]),
                "seed {seed} block {blk} recovered"
            );
        }
        for blk in 2000..2400u64 {
            assert_eq!(read_version(&r, blk).unwrap(), Some(0), "seed {seed} block {blk} recovered");
        }
    }
}

// ------------------------------------------------------------------------------------------
// 8. The checkpoint's cloned index against concurrent TRIMs, writes and write-back.

#[test]
fn checkpoint_clone_races_trims_writes_and_destage() {
    for seed in 0..12u64 {
        let clock = SimClock::new();
        let (cache, backing) = devices_on_clock(8, 512, 4096, &clock, FAST, FAST);
        let c: Arc<dyn BlockDevice> = cache.clone();
        let b: Arc<dyn BlockDevice> = backing.clone();
        let v = Arc::new(Volume::open(c, b, Arc::new(clock.clone()), VolumeOptions::default()).expect("open").0);
        // Clean copies to TRIM, dirty ones to write back.
        for blk in 1000..1100u64 {
            assert_eq!(read_version(&v, blk).unwrap(), Some(0));
        }
        v.checkpoint().unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let failures: Arc<StdMutex<Vec<String>>> = Arc::new(StdMutex::new(Vec::new()));
        let out = Sched::run(
            seed,
            50_000_000,
            || {},
            |s| {
                tiercache_sched::quiet_stuck_panics();
                let mut hs = Vec::new();
                {
                    let (v, stop, failures) = (v.clone(), stop.clone(), failures.clone());
                    hs.push(s.spawn(move || {
                        while !stop.load(Ordering::Relaxed) {
                            if let Err(e) = v.checkpoint() {
                                failures.lock().unwrap().push(format!("checkpoint: {e}"));
                            }
                        }
                    }));
                }
                {
                    let (v, stop, failures) = (v.clone(), stop.clone(), failures.clone());
                    let s2 = s.clone();
                    hs.push(s.spawn(move || {
                        while !stop.load(Ordering::Relaxed) {
                            let first = 1000 + s2.gen_range(0..100);
                            if let Err(e) = v.discard(first * BS as u64, 3 * BS as u64) {
                                failures.lock().unwrap().push(format!("trim: {e}"));
                            }
                            let blk = 1000 + s2.gen_range(0..100);
                            if let Err(e) = read_version(&v, blk) {
                                failures.lock().unwrap().push(format!("read: {e}"));
                            }
                            if let Err(e) = v.destage_step(4) {
                                failures.lock().unwrap().push(format!("destage: {e}"));
                            }
                        }
                    }));
                }
                let mut version = vec![0u64; 200];
                for i in 0..400u64 {
                    let blk = s.gen_range(0..200);
                    version[blk as usize] += 1;
                    v.write(blk * BS as u64, &stamp(blk, version[blk as usize])).unwrap();
                    if i % 3 == 0 {
                        v.flush().unwrap();
                    }
                }
                v.flush().unwrap();
                stop.store(true, Ordering::Relaxed);
                for h in hs {
                    match s.join(h) {
                        Joined::Returned(()) => {}
                        Joined::Panicked(m) => failures.lock().unwrap().push(format!("panicked: {m}")),
                        Joined::Stuck => failures.lock().unwrap().push("stuck".into()),
                    }
                }
                version
            },
        );
        let version = out.unwrap_or_else(|_| panic!("seed {seed}: stuck"));
        let f = failures.lock().unwrap().clone();
        assert!(f.is_empty(), "seed {seed}: {f:?}");
        assert!(v.status().counters.checkpoints > 1);
        let (ci, bi) = (cache.durable_image(), backing.durable_image());
        drop(v);
        let clock = SimClock::new();
        let (cache2, backing2) = devices_from_images_on_clock(ci, bi, &clock, FAST, FAST);
        let c: Arc<dyn BlockDevice> = cache2;
        let b: Arc<dyn BlockDevice> = backing2;
        let r = Volume::open(c, b, Arc::new(clock), VolumeOptions::default()).expect("recover").0;
        for blk in 0..200u64 {
            assert_eq!(read_version(&r, blk).unwrap(), Some(version[blk as usize]), "seed {seed} block {blk}");
        }
        for blk in 1000..1100u64 {
            assert_eq!(read_version(&r, blk).unwrap(), Some(0), "seed {seed} block {blk}");
        }
    }
}

// ------------------------------------------------------------------------------------------
// 9. A plan gone wholly clean: no spin, no false 0.

#[test]
fn take_planned_never_spins_on_an_all_clean_plan() {
    let clock = SimClock::new();
    let (cache, backing) = devices_on_clock(8, 512, 4096, &clock, FAST, FAST);
    let c: Arc<dyn BlockDevice> = cache;
    let b: Arc<dyn BlockDevice> = backing.clone();
    let v = Volume::open(c, b, Arc::new(clock), VolumeOptions::default()).expect("open").0;
    for blk in 0..100u64 {
        write(&v, blk, 1);
    }
    v.flush().unwrap();
    assert_eq!(v.destage_step(1).unwrap(), 1); // the plan holds 1..100
                                               // Everything in the plan goes clean by the pre-cleaner, and new dirty blocks appear
                                               // behind and ahead of the cursor.
    while v.destage_oldest(1000).unwrap() > 0 {}
    assert!(dirty_blocks(&v).is_empty());
    write(&v, 0, 2);
    write(&v, 3000, 2);
    v.flush().unwrap();
    let reads = backing.stats();
    assert_eq!(v.destage_step(10).unwrap(), 2, "one fresh sweep finds both");
    let _ = reads;
    assert_eq!(v.destage_step(10).unwrap(), 0);
    assert_eq!(v.destage_step(10).unwrap(), 0, "nothing dirty: 0, no spin");
    assert_eq!(backing_version(&backing, 0), Some(2));
    assert_eq!(backing_version(&backing, 3000), Some(2));
}
