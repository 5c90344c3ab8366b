//! Adversarial review of e7fc281 ("Read cache: the adaptive policy (new default)"): misses
//! fill the log until the first reclaim after open, then go to the probation ring unless a
//! ghost, and a ghost's miss goes to the log unless the frequency gate (when the duel picks
//! it) refuses it; reclaim may reinsert up to a segment (a record) of read blocks, and the
//! writer's reclaim reserve grew to match. Each test is one suspicion; the comment above it
//! says whether it held (FINDING) or was refuted (expected to pass). Races are made
//! deterministic by holding a chosen device I/O; every wait is bounded.
//!
//! The private parts (the sketch, the duel's simulations) are attacked in
//! `adversarial_adaptive_units.rs`.
//!
//! Results on e7fc281 (19 run by default, 2 ignored simulator runs): 14 passed, 5 failed; all
//! but the pre-existing one pass since the fixes that followed (the log fills only while the
//! record and the next fit without a reclaim; the gate's victim falls back to the head's first
//! clean block). Below, as found: No
//! stale read, no wrong data after a power cut, no panic, no stall in the engine.
//! - `one_time_reads_after_open_leave_the_hot_set_alone` (118 of 192 hot hits after one lap;
//!   S3-FIFO 192) and `one_time_reads_after_open_leave_a_counted_hot_set_alone` (143 of 192,
//!   every block at the highest count; S3-FIFO 192) and
//!   `preloaded_blocks_stay_cached_through_the_filling_lap` (497 of 512): right after open,
//!   one lap of one-time reads fills the log and wraps it (S3-FIFO would have kept them in the
//!   ring, and the log would not wrap); the head meets the hot set first. Blocks re-read while
//!   staged count nothing and are evicted; in windows dense with kept blocks reclaim evicts the
//!   least read to free a block per record. A prototype (`filling-fix-prototype.patch` in the
//!   worktree's root: the log fills only while this record and the next fit without a reclaim,
//!   as the model's `Mini::filling` does) makes all three pass.
//! - `the_duel_keeps_the_gate_on_for_a_loop_larger_than_the_cache`: the gate is on in 10 % of
//!   the samples on the loop it is meant for (the duel's own unit test fails the same way).
//!   The policy still hits far more than S3-FIFO there (`a_loop_larger...hits_more_than_s3fifo`).
//! - `pre_existing_a_trimmed_clean_copy_comes_back_after_a_power_cut`: predates the commit.
//!
//! The simulators (ignored here): 600 concurrent and 150 serial seeds pass; the concurrent
//! one's probation-ring coverage fell by more than half (seeds 0..300: 9,524 ring admissions
//! and 42 promotions, against 21,695 and 95 with `S3fifo` as the default), since every cycle
//! reopens and a reopened log takes misses until its first reclaim. (Since the fix, a reopened
//! full log takes none.)
//!
//! Blocks: 100..999 for the blocks under test, 1000.. for one-time fillers (`cold`); the
//! backing device's fingerprint blocks (0, 1, 16, the last) are never written around.
//! Version 0 is the backing device's initial content.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiercache_device::{BlockDevice, MonotonicClock, SimDevice};
use tiercache_engine::{create, CreateOptions, Eviction, Volume, VolumeOptions, WriteAroundPolicy};
use tiercache_format::Layout;

mod common;
use common::holds::{join_within, ver, vers, write_n, LateRead};
use common::*;

const SEG: u32 = 16;
const LOG_SEGMENTS: u64 = 160; // 2,560 blocks: a ring of 256 (10 %), the log 2,304
const CACHE: u64 = 2560;
const BLOCKS: u64 = 65_536;

// ------------------------------------------------------------------------------------------
// Devices and volumes.

/// A cache of `segments` segments of `seg` blocks with `permille` of it as the ring, and a
/// backing device of `blocks` blocks stamped with version 0 (never tearing a 4 KiB block if
/// `atomic`, so that write-around is allowed).
fn devices(seg: u32, segments: u64, permille: u16, blocks: u64, atomic: bool) -> (Arc<SimDevice>, Arc<SimDevice>) {
    let log_blocks = segments * u64::from(seg);
    let ck = Layout::checkpoint_blocks_for(log_blocks, BS as u32);
    let cache = Arc::new(SimDevice::new((2 + 2 * ck + log_blocks) * BS as u64, BS as u32).with_name("cache"));
    let mut b = SimDevice::from_image(stamps(0, blocks, 0), BS as u32).with_name("backing");
    if atomic {
        b = b.with_atomic_write(BS as u32);
    }
    let backing = Arc::new(b);
    create(
        &*cache,
        &*backing,
        &CreateOptions { segment_blocks: seg, probation_permille: permille, ..CreateOptions::default() },
    )
    .expect("create");
    (cache, backing)
}

/// The review's usual geometry: 160 segments of 16 blocks, a ring of 10 %.
fn std_devices(atomic: bool) -> (Arc<SimDevice>, Arc<SimDevice>) {
    devices(SEG, LOG_SEGMENTS, 100, BLOCKS, atomic)
}

fn open_on(cache: Arc<dyn BlockDevice>, backing: Arc<dyn BlockDevice>, options: VolumeOptions) -> Volume {
    Volume::open(cache, backing, Arc::new(MonotonicClock::new()), options).expect("open").0
}

/// No sequential bypass (the tests read blocks one at a time, often in order).
fn opts() -> VolumeOptions {
    VolumeOptions { sequential_bypass_bytes: 0, ..VolumeOptions::default() }
}

fn opts_with(eviction: Eviction) -> VolumeOptions {
    VolumeOptions { eviction, ..opts() }
}

/// `opts`, and writes of two blocks or more go around whatever the dirty level.
fn wa_opts() -> VolumeOptions {
    VolumeOptions {
        write_around: WriteAroundPolicy { min_bytes: 2 * BS as u64, only_when_destage_bound: false },
        ..opts()
    }
}

/// A copy of both devices as they are now (volatile content included): the same volume for a
/// second policy to run on.
fn twin(cache: &SimDevice, backing: &SimDevice) -> (Arc<SimDevice>, Arc<SimDevice>) {
    (
        Arc::new(SimDevice::from_image(cache.durable_image(), BS as u32).with_name("cache")),
        Arc::new(SimDevice::from_image(backing.durable_image(), BS as u32).with_name("backing")),
    )
}

/// The `n`-th one-time block: distinct, far from the blocks under test, not consecutive.
fn cold(n: u64) -> u64 {
    1_000 + (n * 7) % 60_000
}

fn read_cold(v: &Volume, next: &mut u64, n: u64) {
    read_once(v, (*next..*next + n).map(cold));
    *next += n;
}

fn hits(v: &Volume) -> u64 {
    v.status().counters.read_hit_blocks
}

/// Hits among reads of `blocks` (each read once, checked for version 0).
fn hits_of(v: &Volume, blocks: impl Iterator<Item = u64>) -> u64 {
    let before = hits(v);
    read_once(v, blocks);
    hits(v) - before
}

fn in_log(v: &Volume, block: u64) -> bool {
    slot_of(v, block).is_some()
}

/// Seals staging into a record: a write of the last block (a fingerprint block: never written
/// around, and far from everything), then FLUSH.
fn seal(v: &Volume) {
    write(v, BLOCKS - 1, 1);
    v.flush().unwrap();
}

/// Writes `block` straight to the backing device (no volume). Durable.
fn change_backing(backing: &SimDevice, block: u64, version: u64) {
    backing.write_at(block * BS as u64, &stamp(block, version)).unwrap();
    backing.flush().unwrap();
}

/// The volume recovered from the durable images of both devices (a power cut now).
fn power_cut(
    cache: &SimDevice,
    backing: &SimDevice,
    options: VolumeOptions,
) -> (Arc<SimDevice>, Arc<SimDevice>, Volume) {
    let c = Arc::new(SimDevice::from_image(cache.durable_image(), BS as u32).with_name("cache"));
    let b = Arc::new(
        SimDevice::from_image(backing.durable_image(), BS as u32).with_name("backing").with_atomic_write(BS as u32),
    );
    let v = open_on(c.clone(), b.clone(), options);
    (c, b, v)
}

/// A fresh volume of the usual geometry whose backing device is a `LateRead`.
fn late_rig(atomic: bool, options: VolumeOptions) -> (Arc<SimDevice>, Arc<SimDevice>, Arc<LateRead>, Arc<Volume>) {
    let (c, b) = std_devices(atomic);
    let late = LateRead::new(&b);
    let v = Arc::new(open_on(c.clone(), late.clone(), options));
    (c, b, late, v)
}

// ------------------------------------------------------------------------------------------
// 0. The new default is what the tests below attack.

// The default policy is `Adaptive`, a fresh volume's misses go into the log (the filling
// phase), and the gate is off while filling. Expected to pass.
#[test]
fn the_default_is_adaptive_and_a_fresh_volume_fills_the_log() {
    let (_c, _b, _late, v) = late_rig(false, opts());
    let s = v.status();
    assert_eq!(s.eviction, Eviction::Adaptive);
    assert_eq!(s.frequency_gate, Some(false));
    read_once(&v, [200u64, 201].into_iter());
    seal(&v);
    assert!(in_log(&v, 200) && in_log(&v, 201), "a fresh volume's misses enter the log");
    let c = v.status().counters;
    assert_eq!((c.filling_admitted_blocks, c.probation_admitted_blocks), (2, 0));
}

// ------------------------------------------------------------------------------------------
// 1. Stale data while the log fills: misses go straight to staging (DataClean), not to the
// ring. Both admissions pass the same guards; these pin that the filling route keeps them.

// Suspicion (1): a miss read from the backing device, then a write of the block completing
// before the miss is admitted: the filling route must see the fill cancelled and stage
// nothing (else the older data sits in staging over the write... or, if sealed after it, in
// a later record). Refuted: expected to pass.
#[test]
fn a_filling_miss_racing_a_write_never_admits_the_older_data() {
    let (c, b, late, v) = late_rig(false, opts());
    let x = 200;
    late.arm(x);
    let reader = on_thread(&v, move |v| read_version(v, x));
    late.wait_held();
    write(&v, x, 1);
    late.release();
    let raced = join_within(reader, 30, "the reader").unwrap();
    assert!(matches!(raced, Some(0) | Some(1)), "the racing read returned {raced:?}");
    assert_eq!(v.status().counters.filling_admitted_blocks, 0, "the cancelled miss was admitted");
    for _ in 0..3 {
        assert_eq!(ver(&v, x), 1, "after the write completed");
    }
    v.flush().unwrap();
    seal(&v);
    assert_eq!(ver(&v, x), 1, "after a seal");
    let (_c2, _b2, r) = power_cut(&c, &b, opts());
    assert_eq!(ver(&r, x), 1, "after FLUSH and a power cut");
}

// Suspicion (1): as above with a TRIM, then a change of the backing device under the cache:
// the miss (read before the TRIM) must not come back over the backing device's new data.
// Refuted: expected to pass.
#[test]
fn a_filling_miss_racing_a_trim_never_admits_the_older_data() {
    let (c, b, late, v) = late_rig(false, opts());
    let x = 210;
    late.arm(x);
    let reader = on_thread(&v, move |v| read_version(v, x));
    late.wait_held();
    v.discard(x * BS as u64, BS as u64).unwrap();
    change_backing(&b, x, 3);
    late.release();
    let raced = join_within(reader, 30, "the reader").unwrap();
    assert!(matches!(raced, Some(0) | Some(3)), "the racing read returned {raced:?}");
    for _ in 0..3 {
        assert_eq!(ver(&v, x), 3, "after the TRIM and the backing device's change");
    }
    seal(&v);
    assert_eq!(ver(&v, x), 3, "after a seal");
    let (_c2, _b2, r) = power_cut(&c, &b, opts());
    assert_eq!(ver(&r, x), 3, "after a power cut");
}

// Suspicion (1): as above with a write-around (straight to the backing device).
// Refuted: expected to pass.
#[test]
fn a_filling_miss_racing_a_write_around_never_admits_the_older_data() {
    let (c, b, late, v) = late_rig(true, wa_opts());
    let x = 220;
    late.arm(x);
    let reader = on_thread(&v, move |v| read_version(v, x));
    late.wait_held();
    write_n(&v, x, 2, 2).unwrap();
    assert_eq!(v.status().counters.written_around_blocks, 2, "the write went around");
    late.release();
    let raced = join_within(reader, 30, "the reader").unwrap();
    assert!(matches!(raced, Some(0) | Some(2)), "the racing read returned {raced:?}");
    for _ in 0..3 {
        assert_eq!(vers(&v, x..x + 2), vec![2, 2], "after the write-around");
    }
    v.flush().unwrap();
    seal(&v);
    assert_eq!(vers(&v, x..x + 2), vec![2, 2], "after FLUSH");
    let (_c2, _b2, r) = power_cut(&c, &b, wa_opts());
    assert_eq!(vers(&r, x..x + 2), vec![2, 2], "after FLUSH and a power cut");
}

// Suspicion (1, the route changing under a reader): two readers miss the same block; the
// first is held after its backing read while the second admits the block into the log
// (filling), then the log wraps (the first reclaim), then the first admits it too, now into
// the ring: the block has a copy in the log and one in the ring. A write, then a
// write-around, then laps of the ring and the log: every read must return the newest data,
// live and after a power cut. Refuted: expected to pass.
#[test]
fn a_miss_admitted_before_and_after_the_first_reclaim_leaves_no_stale_twin() {
    let (c, b, late, v) = late_rig(true, wa_opts());
    let x = 230;
    late.arm(x);
    let first = on_thread(&v, move |v| read_version(v, x));
    late.wait_held();
    assert_eq!(read_version(&v, x).unwrap(), Some(0), "the second reader");
    assert_eq!(v.status().counters.filling_admitted_blocks, 1, "the second reader's miss entered the log");
    // Wrap the log: one-time reads (into the log while it fills) and writes (flushed) until
    // reclaim runs.
    let mut next = 0;
    let mut w = 0;
    while v.status().counters.reclaimed_blocks == 0 {
        read_cold(&v, &mut next, 64);
        for _ in 0..16 {
            write(&v, 61_000 + w % 4000, 1);
            w += 1;
        }
        v.flush().unwrap();
        assert!(next < 4 * CACHE, "the log never wrapped");
    }
    let probation_before = v.status().counters.probation_admitted_blocks;
    late.release();
    assert_eq!(join_within(first, 30, "the first reader").unwrap(), Some(0));
    let twin_in_ring = v.status().counters.probation_admitted_blocks > probation_before;
    eprintln!("the first reader's admission went to the ring: {twin_in_ring}");
    // A write through the cache (x has a copy on the log: it may not be written around).
    write(&v, x, 1);
    for _ in 0..3 {
        assert_eq!(ver(&v, x), 1, "after the write");
    }
    v.flush().unwrap();
    for _ in 0..4 {
        read_cold(&v, &mut next, CACHE / 2);
        assert_eq!(ver(&v, x), 1, "after laps of one-time reads");
    }
    let (_c2, _b2, r) = power_cut(&c, &b, wa_opts());
    assert_eq!(ver(&r, x), 1, "after a power cut");
    drop(r);
    // Written back (clean now), then a TRIM (which drops clean copies: the log's and the
    // ring's) and a change of the backing device under the cache: no copy may come back
    // live. (After a power cut it can: see the last test, which predates this commit.)
    v.write_back_all(1.0, |_, _| true).unwrap();
    v.discard(x * BS as u64, BS as u64).unwrap();
    change_backing(&b, x, 3);
    for _ in 0..3 {
        assert_eq!(ver(&v, x), 3, "after write-back, TRIM and a change of the backing device");
    }
    for _ in 0..8 {
        read_cold(&v, &mut next, CACHE / 2);
        assert_eq!(ver(&v, x), 3, "after laps of one-time reads");
    }
}

// Suspicion (1, crash during filling, reopen): dirty writes (flushed) and misses admitted
// while the log fills, a power cut half way, recovery; the reopened volume fills again
// (its flag resets on open) over a log holding recovered data, wraps, and is cut again.
// Every flushed write must read back, before and after each cut, and every other block as
// the backing device holds it. Refuted: expected to pass.
#[test]
fn power_cuts_while_the_log_fills_and_after_reopen_lose_nothing() {
    let (c, b) = std_devices(true);
    let mut v = open_on(c.clone(), b.clone(), opts());
    let (mut c, mut b) = (c, b);
    let mut model = Model::new();
    let mut next = 0;
    let mut version = 1;
    for round in 0..3 {
        // Half a log's worth: misses (first: a write's record may need the first reclaim)
        // and writes of 100..400 (flushed).
        for i in 0..8u64 {
            read_cold(&v, &mut next, 128);
            let first = 100 + (i * 37 + round * 11) % 300;
            write_flush(&v, &mut model, first, 3, version);
            version += 1;
        }
        let s = v.status();
        eprintln!("round {round}: {} misses admitted as filling", s.counters.filling_admitted_blocks);
        assert!(round > 0 || s.counters.filling_admitted_blocks > 0, "a fresh volume fills the log");
        check_model(&v, &model, &format!("round {round}, live"));
        // An unflushed write: may or may not survive, but must not corrupt anything.
        write(&v, 999, version);
        let (c2, b2, v2) = power_cut(&c, &b, opts());
        (c, b, v) = (c2, b2, v2);
        check_model(&v, &model, &format!("round {round}, after a power cut"));
        // Blocks never written read as the backing device holds them (version 0).
        read_once(&v, (0..next).step_by(13).map(cold));
        assert_eq!(v.status().frequency_gate, Some(false), "reopened: the gate waits for a reclaim");
    }
    // Now many laps, then a clean reopen of a full log: filling admits only until the first
    // reclaim (a few records at most: the log is full).
    for _ in 0..4 {
        read_cold(&v, &mut next, CACHE);
    }
    check_model(&v, &model, "after laps");
    v.shutdown().unwrap();
    drop(v);
    let v = open_on(c.clone(), b.clone(), opts());
    let (head, _, tail) = v.log_window();
    read_cold(&v, &mut next, CACHE);
    let filled = v.status().counters.filling_admitted_blocks;
    let free = head + v.superblock().layout.log_blocks - tail;
    eprintln!("reopened a full log (free {free}): {filled} misses admitted as filling");
    assert!(filled <= free + 168, "{filled} misses entered the log as 'filling' a log with {free} free blocks");
    check_model(&v, &model, "after reopening a full log");
}

// ------------------------------------------------------------------------------------------
// 2. The larger reinsertion room and reclaim reserve: tiny caches, the simulator's geometry,
// small records, dense hot heads. No deadlock, no panic (the reserve assertion in reclaim,
// the record-fits assertion in seal), exact data.

/// Writers each own blocks and write increasing versions (some around the cache), readers
/// read everything and check that each block reads at least its last completed version and
/// at most its last started one; all within `secs`. Returns the volume's counters.
fn stress(v: &Arc<Volume>, blocks: u64, hot: u64, ops: u64, secs: u64) -> tiercache_engine::Counters {
    let started: Arc<Vec<AtomicU64>> = Arc::new((0..blocks).map(|_| AtomicU64::new(0)).collect());
    let completed: Arc<Vec<AtomicU64>> = Arc::new((0..blocks).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for w in 0..2u64 {
        let (v, started, completed, stop) = (Arc::clone(v), started.clone(), completed.clone(), stop.clone());
        handles.push(std::thread::spawn(move || {
            let mut rng = w * 7919 + 1;
            for i in 0..ops {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                // Writer w owns half of the blocks (0 and 1, and the last, are fingerprint
                // blocks: never written); every fifth write is of two adjacent blocks, which
                // goes around the cache where the options say so.
                let half = (blocks - 4) / 2;
                let n = if i % 5 == 0 { 2 } else { 1 };
                let first = 2 + w * half + (rng >> 33) % (half - 2);
                let bs: Vec<u64> = (first..first + n).collect();
                let version = i + 1 + w * 1_000_000;
                for &b in &bs {
                    started[b as usize].store(version, Ordering::SeqCst);
                }
                v.write(first * BS as u64, &stamps(first, n, version)).unwrap();
                for &b in &bs {
                    completed[b as usize].store(version, Ordering::SeqCst);
                }
                if i % 17 == 0 {
                    v.flush().unwrap();
                }
            }
        }));
    }
    for r in 0..2u64 {
        let (v, started, completed, stop) = (Arc::clone(v), started.clone(), completed.clone(), stop.clone());
        handles.push(std::thread::spawn(move || {
            let mut rng = r * 104_729 + 5;
            let mut buf = vec![0u8; BS];
            for i in 0..ops * 2 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let b = if i % 3 == 0 { (rng >> 33) % blocks } else { 2 + (rng >> 33) % hot };
                let low = completed[b as usize].load(Ordering::SeqCst);
                v.read(b * BS as u64, &mut buf).unwrap();
                let high = started[b as usize].load(Ordering::SeqCst);
                let got = version_of(b, &buf).unwrap_or_else(|| panic!("block {b}: foreign or torn data"));
                // (Version 0 is the initial content; a writer's versions only grow.)
                assert!(
                    (got == 0 && low == 0) || (low <= got && got <= high),
                    "block {b}: read version {got}, last completed {low}, last started {high}"
                );
            }
        }));
    }
    let deadline = Instant::now() + Duration::from_secs(secs);
    for h in handles {
        while !h.is_finished() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(5));
        }
        if !h.is_finished() {
            stop.store(true, Ordering::SeqCst);
            panic!("not done within {secs} s (a writer or reader starved or deadlocked): {:?}", v.status().counters);
        }
        h.join().expect("a stress thread panicked");
    }
    v.flush().unwrap();
    for b in 2..blocks - 1 {
        let want = completed[b as usize].load(Ordering::SeqCst);
        assert_eq!(ver(v, b), want, "block {b} after the stress");
    }
    v.status().counters
}

// Suspicion (2): the smallest caches the format allows with a ring (segments of 4, 8 and 16
// blocks; the ring two segments, the log eight or more), records limited to 2..6 entries by
// the testing option or not at all: the reclaim reserve is now a whole segment plus one. No
// writer may starve, no reader stall, no assertion fire. Refuted: expected to pass.
#[test]
fn tiny_caches_with_a_ring_and_small_records_neither_stall_nor_panic() {
    let geometries = [(4u32, 10u64), (4, 12), (8, 11), (8, 16), (16, 11), (16, 16)];
    for (seg, segments) in geometries {
        for record_entries in [Some(2usize), Some(3), Some(6), None] {
            let (c, b) = devices(seg, segments, 250, 512, true);
            let options = VolumeOptions {
                record_entries,
                write_around: WriteAroundPolicy { min_bytes: 2 * BS as u64, only_when_destage_bound: false },
                ..opts()
            };
            let v = Arc::new(open_on(c.clone(), b.clone(), options));
            let l = v.superblock().layout;
            assert!(l.probation_blocks > 0, "seg {seg} x {segments}: a ring");
            let counters = stress(&v, 512, 48, 1500, 120);
            assert!(counters.reclaimed_blocks > 0, "seg {seg} x {segments}, {record_entries:?}: reclaim never ran");
            // And after a power cut (everything flushed by `stress`).
            let want: Vec<u64> = (2..511).map(|blk| ver(&v, blk)).collect();
            let (_c2, _b2, r) = power_cut(&c, &b, options);
            let got: Vec<u64> = (2..511).map(|blk| ver(&r, blk)).collect();
            assert_eq!(got, want, "seg {seg} x {segments}, {record_entries:?}: after a power cut");
        }
    }
}

// Suspicion (2, dense hot heads): a log whose every clean block is read again and again
// (counts at 3) while a writer writes: each reclaim may now copy up to a segment of them and
// must still free room; the writer must finish. Measures what it costs: cache blocks written
// per block the writer wrote (reinsertions of a hot head are pure cache bandwidth).
// Refuted as a hang (expected to pass); the cost is reported.
#[test]
fn a_log_of_hot_blocks_still_takes_writes() {
    for (seg, segments) in [(4u32, 10u64), (8, 16), (16, 16), (16, 64)] {
        let (c, b) = devices(seg, segments, 250, BLOCKS, false);
        let v = Arc::new(open_on(c.clone(), b.clone(), opts()));
        let log_blocks = v.superblock().layout.log_blocks;
        // Every log block hot: a working set of the log's size read four times.
        let set: Vec<u64> = (100..100 + log_blocks).collect();
        for _ in 0..4 {
            read_once(&v, set.iter().copied());
        }
        seal(&v);
        let reader_stop = Arc::new(AtomicBool::new(false));
        let reader = {
            let (v, stop, set) = (Arc::clone(&v), reader_stop.clone(), set.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    read_once(&v, set.iter().copied());
                }
            })
        };
        let written_before = c.stats().writes;
        let reinserted_before = v.status().counters.reinserted_blocks;
        let writer = on_thread(&v, move |v| {
            for i in 0..(2 * log_blocks) {
                write(v, 3000 + i % 1000, i + 1);
                if i % 8 == 0 {
                    v.flush().unwrap();
                }
            }
            v.flush().unwrap();
        });
        join_within(writer, 120, &format!("seg {seg} x {segments}: the writer over a hot log"));
        reader_stop.store(true, Ordering::SeqCst);
        join_within(reader, 60, "the reader");
        let s = v.status().counters;
        eprintln!(
            "seg {seg} x {segments}: {} user blocks written, {} reinserted, {} cache writes, {} reclaims' worth reclaimed",
            2 * log_blocks,
            s.reinserted_blocks - reinserted_before,
            c.stats().writes - written_before,
            s.reclaimed_blocks
        );
        for i in (0..2 * log_blocks).rev().take(1000.min(2 * log_blocks) as usize) {
            let blk = 3000 + i % 1000;
            let newest = (0..2 * log_blocks).filter(|j| j % 1000 == i % 1000).max().unwrap() + 1;
            assert_eq!(ver(&v, blk), newest, "block {blk}");
        }
    }
}

// ------------------------------------------------------------------------------------------
// 3. The gate end to end, and the victim scan over many laps (headers, copies of other laps,
// the slot index wrapping at the end of the log).

/// The `i`-th block of a loop of `len` blocks (from 100), in an order no stream detector
/// takes for a scan (a stride of 389 blocks: its reads count as reads).
fn loop_block(len: u64, i: u64) -> u64 {
    100 + (i * 389) % len
}

/// Reads `passes` passes of a loop of `len` blocks (from 100), one block a request; returns
/// the hits of the last `measure` passes.
fn loop_reads(v: &Volume, len: u64, passes: u64, measure: u64) -> u64 {
    assert!(!len.is_multiple_of(389));
    let mut got = 0;
    for p in 0..passes {
        let h = hits_of(v, (0..len).map(|i| loop_block(len, i)));
        if p >= passes - measure {
            got += h;
        }
    }
    got
}

// Suspicion (3, 7): a loop over 1.5 x the cache (the gate's case, arc_P6 at 10 %): the
// policy must hit more than S3-FIFO, the victim scan must not panic at the log's physical
// end after many laps, and every read must be right, also with writes in the loop while the
// gate may be on. Expected to pass.
#[test]
fn a_loop_larger_than_the_cache_hits_more_than_s3fifo() {
    let (c, b) = std_devices(false);
    let (c2, b2) = twin(&c, &b);
    let adaptive = open_on(c, b, opts());
    let s3fifo = open_on(c2, b2, opts_with(Eviction::S3fifo));
    let len = CACHE * 3 / 2;
    let (a, s) = (loop_reads(&adaptive, len, 30, 10), loop_reads(&s3fifo, len, 30, 10));
    let st = adaptive.status();
    eprintln!(
        "loop of {len}: last 10 passes' hits adaptive {a}, s3fifo {s}; gate {:?}, switches {}, refused {}, laps {}",
        st.frequency_gate,
        st.policy_switches,
        st.counters.gate_refused_blocks,
        st.log_tail / adaptive.superblock().layout.log_blocks
    );
    assert!(st.log_tail > 3 * adaptive.superblock().layout.log_blocks, "the log lapped (the victim scan wrapped)");
    assert!(a > s, "adaptive hit {a}, s3fifo {s}, on the loop");
    // Writes inside the loop: every block reads its newest version.
    let mut model = Model::new();
    for (i, blk) in (100..100 + len).step_by(97).enumerate() {
        write_flush(&adaptive, &mut model, blk, 1, i as u64 + 1);
    }
    loop_reads_checked(&adaptive, len, 3, &model);
    check_model(&adaptive, &model, "after the loop with writes");
}

// Suspicion (4): the duel is meant to pick the gate on exactly this workload (its own unit
// test, `a_loop_larger_than_the_cache_chooses_the_gate`, says so, and the commit credits the
// gate with arc_P6 at 10 %). On the real volume the choice flips back and forth and is off
// most of the time; the miniature simulation with the gate misses more than the one without
// after a few passes (the unit test fails too: 5,772 against 4,981), also with exact counts
// and no ageing (checked outside the tree), so this is not the sketch's noise.
// FINDING: failed on e7fc281, fixed since.
#[test]
fn the_duel_keeps_the_gate_on_for_a_loop_larger_than_the_cache() {
    let (c, b) = std_devices(false);
    let v = open_on(c, b, opts());
    let len = CACHE * 3 / 2;
    let (mut on, mut samples) = (0u64, 0u64);
    for p in 0..30 {
        for i in 0..len {
            read_once(&v, [loop_block(len, i)].into_iter());
            if p >= 10 && i % 64 == 0 {
                on += u64::from(v.status().frequency_gate == Some(true));
                samples += 1;
            }
        }
    }
    let s = v.status();
    eprintln!("gate on in {on} of {samples} samples (passes 10-29); switches {}", s.policy_switches);
    assert!(on * 10 >= samples * 9, "the gate was on in only {on} of {samples} samples on a loop of 1.5 x the cache");
}

fn loop_reads_checked(v: &Volume, len: u64, passes: u64, model: &Model) {
    for _ in 0..passes {
        for blk in 100..100 + len {
            let want = model.get(&blk).copied().unwrap_or(0);
            assert_eq!(ver(v, blk), want, "block {blk}");
        }
    }
}

// Suspicion (3): small records (many headers between head and tail, copies of other laps in
// slots the victim scan looks at) and a tiny log whose 64-slot scan covers the whole log and
// wraps past its physical end: the gate's victim scan must not panic or read a stale owner.
// Run on the simulator's geometry with the gate's workload. Refuted: expected to pass.
#[test]
fn the_victim_scan_survives_headers_and_wraparound_in_a_tiny_log() {
    for (seg, segments, entries) in [(4u32, 12u64, Some(2usize)), (8, 16, Some(3)), (16, 16, None)] {
        let (c, b) = devices(seg, segments, 250, 4096, false);
        let options = VolumeOptions { record_entries: entries, ..opts() };
        let v = open_on(c, b, options);
        let cache = v.superblock().layout.log_blocks + v.superblock().layout.probation_blocks;
        // A loop of 1.5 x the cache, and writes now and then (headers, dirty blocks at the head).
        for p in 0..40u64 {
            for blk in 100..100 + cache * 3 / 2 {
                if (blk + p) % 29 == 0 {
                    write(&v, blk, p + 1);
                } else {
                    let got = ver(&v, blk);
                    assert!(got <= p, "block {blk}: version {got} in pass {p}");
                }
            }
        }
        let s = v.status();
        eprintln!(
            "seg {seg} x {segments} ({entries:?}): gate {:?}, switches {}, refused {}, laps {}",
            s.frequency_gate,
            s.policy_switches,
            s.counters.gate_refused_blocks,
            s.log_tail / v.superblock().layout.log_blocks
        );
    }
}

// ------------------------------------------------------------------------------------------
// 4. Policy regressions a user would see.

// Suspicion (7): a hot set read three times right after open, then laps of one-time reads
// (each lap the whole cache, one block a request, no stream), the hot set read between them.
// Under S3-FIFO the one-time reads pass through the ring and the log never wraps: every hot
// read hits. With the new default the first lap fills the log with the one-time blocks and
// wraps it, and the head meets the hot set, which entered first: blocks whose reads came
// while they waited in staging count nothing (freq 0) and are evicted, and in windows dense
// with hot blocks reclaim evicts the least read to free a block per record.
// FINDING: failed on e7fc281, fixed since (adaptive keeps 118 of 192 after the first lap; S3-FIFO
// all 192 on every lap).
#[test]
fn one_time_reads_after_open_leave_the_hot_set_alone() {
    let (c, b) = std_devices(false);
    let (c2, b2) = twin(&c, &b);
    let mut laps = Vec::new();
    for (name, v) in [("adaptive", open_on(c, b, opts())), ("s3fifo", open_on(c2, b2, opts_with(Eviction::S3fifo)))] {
        let hot: Vec<u64> = (100..100 + 192).collect();
        for _ in 0..3 {
            read_once(&v, hot.iter().copied());
        }
        seal(&v);
        let freqs: Vec<u8> = hot.iter().map(|&h| freq(&v, h).unwrap_or(9)).collect();
        let per = |f: u8| freqs.iter().filter(|&&x| x == f).count();
        eprintln!(
            "{name}: hot set read counts 0: {}, 1: {}, 2: {}, 3: {}, not in the log: {}",
            per(0),
            per(1),
            per(2),
            per(3),
            per(9)
        );
        let mut next = 0;
        let mut got = Vec::new();
        for _ in 0..6 {
            read_cold(&v, &mut next, CACHE);
            got.push(hits_of(&v, hot.iter().copied()));
        }
        let c = v.status().counters;
        eprintln!(
            "{name}: hot hits per lap {got:?} of 192 (filling admissions {}, reinserted {}, evicted {})",
            c.filling_admitted_blocks, c.reinserted_blocks, c.evicted_blocks
        );
        laps.push(got);
    }
    assert_eq!(laps[1], vec![192; 6], "s3fifo");
    assert_eq!(laps[0], vec![192; 6], "adaptive lost hot hits to one-time reads right after open");
}

// Suspicion (7), the same with the hot set's reads spread out (sealed between passes, so each
// read again counts): what is left is reclaim's first lap through a log whose head is dense
// with hot blocks (it evicts the least read to free a block per record), which S3-FIFO never
// runs here. FINDING (smaller): failed on e7fc281, fixed since (184 of 192).
#[test]
fn one_time_reads_after_open_leave_a_counted_hot_set_alone() {
    let (c, b) = std_devices(false);
    let (c2, b2) = twin(&c, &b);
    let mut laps = Vec::new();
    for (name, v) in [("adaptive", open_on(c, b, opts())), ("s3fifo", open_on(c2, b2, opts_with(Eviction::S3fifo)))] {
        let hot: Vec<u64> = (100..100 + 192).collect();
        for _ in 0..4 {
            read_once(&v, hot.iter().copied());
            seal(&v);
        }
        let freqs: Vec<u8> = hot.iter().map(|&h| freq(&v, h).unwrap_or(9)).collect();
        let per = |f: u8| freqs.iter().filter(|&&x| x == f).count();
        eprintln!(
            "{name}: hot set read counts 0: {}, 1: {}, 2: {}, 3: {}, not in the log: {}",
            per(0),
            per(1),
            per(2),
            per(3),
            per(9)
        );
        let mut next = 0;
        let mut got = Vec::new();
        for _ in 0..6 {
            read_cold(&v, &mut next, CACHE);
            got.push(hits_of(&v, hot.iter().copied()));
        }
        eprintln!("{name}: hot hits per lap {got:?} of 192");
        laps.push(got);
    }
    assert_eq!(laps[1], vec![192; 6], "s3fifo");
    assert_eq!(laps[0], vec![192; 6], "adaptive lost hot hits to one-time reads right after open");
}

// Suspicion (7): the same right after a reopen of a log that lapped: the recovered blocks
// (counts reset to 0 by recovery) and the hot set read since are in the log; with the flag
// reset, the one-time reads enter the log until the first reclaim. The hot set (read again
// after reopen) must not lose more hits than under S3-FIFO. Expected to pass (adaptive 768 of
// 768, S3-FIFO 578: the blocks of the hot set not in the log at the reopen wait in the ring,
// which the one-time reads lap before they are read again).
#[test]
fn one_time_reads_after_a_reopen_leave_the_hot_set_alone() {
    let (c, b) = std_devices(false);
    {
        let v = open_on(c.clone(), b.clone(), opts());
        let mut next = 500_000; // (far from the hot set and from the later cold reads)
        for _ in 0..3 {
            read_cold(&v, &mut next, CACHE);
            read_once(&v, 100..292);
        }
        v.shutdown().unwrap();
    }
    let (c2, b2) = twin(&c, &b);
    let mut results = Vec::new();
    for (name, v) in [("adaptive", open_on(c, b, opts())), ("s3fifo", open_on(c2, b2, opts_with(Eviction::S3fifo)))] {
        // The hot set read twice after the reopen (its counts were lost).
        for _ in 0..2 {
            read_once(&v, 100..292);
        }
        let mut next = 0;
        let mut got = 0;
        for _ in 0..4 {
            read_cold(&v, &mut next, CACHE / 2);
            got += hits_of(&v, 100..292);
        }
        eprintln!("{name}: {got} of {} hot reads hit after the reopen", 4 * 192);
        results.push(got);
    }
    assert!(results[0] + 8 >= results[1], "adaptive {} hot hits, s3fifo {}", results[0], results[1]);
}

// Suspicion (7): a sequential scan of the whole volume in large requests (the default
// admission rules: the stream bypass, the size limit) while a random hot set is read: the
// hot set must stay cached. Expected to pass.
#[test]
fn a_whole_volume_scan_with_default_options_leaves_the_hot_set_cached() {
    let (c, b) = devices(SEG, LOG_SEGMENTS, 100, 16_384, false);
    let v = open_on(c, b, VolumeOptions::default());
    let hot: Vec<u64> = (0..256u64).map(|i| 2000 + i * 37 % 9000).collect();
    for _ in 0..3 {
        for &h in &hot {
            let mut buf = vec![0u8; BS];
            v.read(h * BS as u64, &mut buf).unwrap();
        }
    }
    let mut buf = vec![0u8; 64 * BS];
    for first in (0..16_384u64).step_by(64) {
        v.read(first * BS as u64, &mut buf).unwrap();
        if first % 2048 == 0 {
            // The hot set read between parts of the scan.
            for &h in &hot {
                let mut one = vec![0u8; BS];
                v.read(h * BS as u64, &mut one).unwrap();
            }
        }
    }
    let got = hits_of(&v, hot.iter().copied());
    assert!(got >= hot.len() as u64 * 95 / 100, "the hot set kept {got} of {} hits after a scan", hot.len());
}

// Suspicion (7): a preload on a fresh volume (its blocks installed hot), then laps of one-time
// reads: the first lap now goes into the log (filling) and laps it; preloaded blocks must still
// be cached afterwards, as under S3-FIFO (where the one-time reads never touched the log).
// Expected to pass.
#[test]
fn preloaded_blocks_stay_cached_through_the_filling_lap() {
    let (c, b) = std_devices(false);
    let (c2, b2) = twin(&c, &b);
    for (name, v) in [("adaptive", open_on(c, b, opts())), ("s3fifo", open_on(c2, b2, opts_with(Eviction::S3fifo)))] {
        let r = v.preload(100 * BS as u64, 512 * BS as u64, |_| true).unwrap();
        assert_eq!(r.admitted_blocks, 512, "{name}");
        let mut next = 0;
        for _ in 0..3 {
            read_cold(&v, &mut next, CACHE);
        }
        let got = hits_of(&v, 100..612);
        assert_eq!(got, 512, "{name}: preloaded blocks lost after three laps of one-time reads");
    }
}

// ------------------------------------------------------------------------------------------
// 5. CPU under the state lock: the sketch and the duel run for every block of every read in
// `plan_read`.

// Suspicion (6): 1 MiB reads (256 blocks each, admitted: the size limit raised) cost the
// state lock 256 sketch increments and up to 512 simulated reads each. Compared with S3-FIFO
// on the same volume, the adaptive policy must not make such reads markedly slower.
// Measured; bounded loosely (3x). Expected to pass.
#[test]
fn huge_reads_are_not_much_slower_than_under_s3fifo() {
    // (160 x 16 blocks: every block simulated, rate 1; 256 x 256: 1 in 16.)
    for (seg, segments, backing_blocks) in [(SEG, LOG_SEGMENTS, BLOCKS), (256u32, 256u64, 4 * BLOCKS)] {
        let (c, b) = devices(seg, segments, 100, backing_blocks, false);
        let (c2, b2) = twin(&c, &b);
        let mut times = Vec::new();
        for (name, eviction) in [("adaptive", Eviction::Adaptive), ("s3fifo", Eviction::S3fifo)] {
            let (c, b) = if eviction == Eviction::Adaptive { (c.clone(), b.clone()) } else { (c2.clone(), b2.clone()) };
            let options = VolumeOptions { admit_max_request_bytes: 1 << 20, eviction, ..opts() };
            let v = open_on(c, b, options);
            let mut buf = vec![0u8; 256 * BS];
            let started = Instant::now();
            let mut x = 1u64;
            for _ in 0..2000 {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let first = (x >> 33) % (backing_blocks / 256 - 2) * 256 + 256;
                v.read(first * BS as u64, &mut buf).unwrap();
            }
            let t = started.elapsed();
            eprintln!(
                "cache of {} blocks, {name}: 2000 reads of 1 MiB in {t:?} ({:?} each)",
                u64::from(seg) * segments,
                t / 2000
            );
            times.push(t.as_secs_f64());
        }
        assert!(times[0] < 3.0 * times[1] + 0.5, "adaptive {:.2} s, s3fifo {:.2} s", times[0], times[1]);
    }
}

// Suspicion (6, RAM): the status reports the policy's RAM; the module promises about 4 bytes
// of sketch per cache block plus a few MiB at most for the simulations. On this volume's
// geometry (2,560 blocks: just over a power of two in half-blocks) the sketch table is
// rounded up to 2,048 words. Reported; bounded loosely. Expected to pass.
#[test]
fn the_policy_ram_is_reported_and_bounded() {
    let (c, b) = std_devices(false);
    let v = open_on(c, b, opts());
    let s = v.status();
    eprintln!(
        "admission RAM {} bytes for {CACHE} cache blocks ({:.1} per block); index {} bytes",
        s.admission_ram_bytes,
        s.admission_ram_bytes as f64 / CACHE as f64,
        s.index_ram_bytes
    );
    assert!(s.admission_ram_bytes > 0);
    assert!(s.admission_ram_bytes < 4 << 20);
}

// ------------------------------------------------------------------------------------------
// 6. The simulators with the new default (their `VolumeOptions::default()` is now adaptive).
// Ignored by default (slow); run with `--ignored`. Seeds from the environment:
// ADAPTIVE_SIM_FIRST (default 0), ADAPTIVE_SIM_SEEDS (default 40), ADAPTIVE_SERIAL_SEEDS
// (default 8).

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

#[test]
#[ignore]
fn concurrent_simulator_seeds_pass_with_the_adaptive_default() {
    let first = env("ADAPTIVE_SIM_FIRST", 0);
    let n = env("ADAPTIVE_SIM_SEEDS", 40);
    let mut failed = Vec::new();
    let (mut admitted, mut promoted, mut laps) = (0, 0, 0);
    for seed in first..first + n {
        let r = tiercache_sim::run(tiercache_sim::SimConfig { seed, ..tiercache_sim::SimConfig::default() });
        admitted += r.probation_admitted_blocks;
        promoted += r.promoted_blocks;
        laps += r.log_laps;
        if !r.passed() {
            eprintln!("seed {seed}: {:?}", r.violations.first());
            failed.push(seed);
        }
    }
    eprintln!("{n} seeds from {first}: ring admissions {admitted}, promotions {promoted}, laps {laps}");
    assert!(failed.is_empty(), "failing seeds: {failed:?}");
}

#[test]
#[ignore]
fn serial_simulator_seeds_pass_with_the_adaptive_default() {
    let first = env("ADAPTIVE_SIM_FIRST", 0);
    let n = env("ADAPTIVE_SERIAL_SEEDS", 8);
    let mut failed = Vec::new();
    for seed in first..first + n {
        let r = tiercache_sim::serial::run(
            tiercache_sim::serial::TortureConfig { seed, cycles: 300, ..Default::default() },
            |_| {},
        );
        if !r.passed() {
            eprintln!("serial seed {seed}: {:?}", r.violations.first());
            failed.push(seed);
        }
    }
    assert!(failed.is_empty(), "failing serial seeds: {failed:?}");
}

// ------------------------------------------------------------------------------------------
// 7. Found on the way; predates this commit (log only, the `reinsert` policy).

// Suspicion: `discard` drops a clean copy without a record ("if a crash resurrects it, it
// equals the backing device's copy"), yet its own comment allows the backing device to change
// under a trimmed range ("a discard passed down, a restore") and the read path cancels fills
// for that reason. After a power cut, replay brings the dropped clean copy back over the
// backing device's newer data. FINDING (pre-existing, outside this commit; arguably within
// "a TRIM promises nothing of the old data", but inconsistent with the live behaviour):
// it fails on e7fc281 and its parent, and is ignored
// (a known limit, outside the read cache's work: the closing note of issue 10 says so).
#[test]
#[ignore = "known limit: discard drops a clean copy without a record; a crash brings it back"]
fn pre_existing_a_trimmed_clean_copy_comes_back_after_a_power_cut() {
    let (c, b) = devices(8, 64, 0, 4096, true);
    let v = open_on(c.clone(), b.clone(), VolumeOptions { eviction: Eviction::Reinsert, ..opts() });
    let x = 240;
    write(&v, x, 1);
    v.flush().unwrap();
    v.write_back_all(1.0, |_, _| true).unwrap();
    v.discard(x * BS as u64, BS as u64).unwrap();
    change_backing(&b, x, 3);
    assert_eq!(ver(&v, x), 3, "live, after the TRIM and the change");
    let (_c2, _b2, r) = power_cut(&c, &b, opts());
    assert_eq!(ver(&r, x), 3, "after a power cut: the trimmed copy came back");
}
