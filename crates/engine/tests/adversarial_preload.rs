//! Adversarial review of `Volume::preload` and the eviction switch (commit f871095): a range
//! read from the backing device a record's worth at a time (a read-ahead thread), admitted
//! through the read path's guards, sealed at once, installed hot (`hot_on_install`, `set_freq`),
//! and `VolumeOptions.eviction: Fifo`. Each test is one suspicion, made deterministic by holding
//! a chosen I/O (`Dev`) or injecting one fault, and acting meanwhile; the comment above each
//! says what it attacks. `BUG:` marks the ones that fail on f871095.
//!
//! Two kinds of volume:
//! - `plain`: log of 16 segments of 64 blocks (1,024 blocks, records of 128 entries, preload
//!   chunks of 96 blocks, `copy_forward_max` 32), backing device of 16,384 blocks;
//! - `wa`: log of 64 segments of 8 blocks (512 blocks, preload chunks of 48), a backing device
//!   of 4,096 blocks that never tears a block; writes of two blocks or more go around.
//!
//! Version 0 is the backing device's initial content (what a clean copy holds).
//!
//! Failing on f871095 (each marked `BUG:` above its test), all fixed since: marks are made
//! only when a chunk is admitted and dropped with the staged copy; a preload settles an
//! unflushed write-around first; an empty range loads nothing; the counter counts admitted and
//! marked blocks; the documentation says what the three passes are (and that test pins it):
//! - a preload that fails keeps the hot marks of the blocks it found staged; once the staged
//!   copy goes without a record (TRIM), a later one-time read miss of the block enters with
//!   the highest count (`hot_on_install` outlives the copy it was for);
//! - one unflushed write-around anywhere makes a preload admit nothing (and succeed);
//! - an empty range at an unaligned offset preloads a block (minor);
//! - `Counters.preloaded_blocks` counts blocks left out (minor);
//! - the "three laps of the log" a preloaded block is kept for are laps of the log's head:
//!   a preload of most of the cache loses half of itself to one log's worth of one-time reads
//!   (design/documentation).
//!
//! Refuted (pass): writes (FUA, partial, around), TRIM, rot, FLUSH and reclaim racing the
//! preload's read or admission never let its stale read win, live or after a power cut; dirty,
//! staged, in-flight and lost blocks are not read; faults end fills; no hang when stopping.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tiercache_device::{BlockDevice, FailMode, MonotonicClock, OpKind, SimDevice};
use tiercache_engine::{EngineError, Eviction, PreloadReport, Role, Volume, VolumeOptions};

mod common;
use common::holds::*;
use common::*;

const SEGMENT: u32 = 64;
const LOG_SEGMENTS: u64 = 16; // 1,024 blocks
const BACKING_BLOCKS: u64 = 16_384;
/// Preload chunk on the plain volume: three quarters of a 128-entry record.
const CHUNK: u64 = 96;

struct Rig {
    cache: Arc<SimDevice>,
    backing: Arc<SimDevice>,
    cdev: Arc<Dev>,
    bdev: Arc<Dev>,
    v: Arc<Volume>,
}

fn plain_with(options: VolumeOptions) -> Rig {
    let (cache, backing) = devices_seg(LOG_SEGMENTS, SEGMENT, BACKING_BLOCKS, log_only());
    let cdev = Dev::new(&cache);
    let bdev = Dev::new(&backing);
    let c: Arc<dyn BlockDevice> = cdev.clone();
    let b: Arc<dyn BlockDevice> = bdev.clone();
    let v = Arc::new(Volume::open(c, b, Arc::new(MonotonicClock::new()), options).expect("open").0);
    Rig { cache, backing, cdev, bdev, v }
}

fn plain() -> Rig {
    plain_with(VolumeOptions::default())
}

fn wa() -> Rig {
    let (cache, backing) = wa_devices(64, 4096);
    let cdev = Dev::new(&cache);
    let bdev = Dev::new(&backing);
    let v = Arc::new(open_wa(cdev.clone(), bdev.clone()));
    Rig { cache, backing, cdev, bdev, v }
}

/// The plain volume recovered from the durable images (a power cut now).
fn cut(r: &Rig) -> Volume {
    open(durable_copy(&r.cache), durable_copy(&r.backing))
}

fn blocks(n: u64) -> u64 {
    n * BS as u64
}

fn hot_in_index(v: &Volume) -> u64 {
    v.index_snapshot().iter().filter(|(_, e)| e.freq > 0).count() as u64
}

fn cold(n: u64) -> u64 {
    4_000 + (n * 7) % 12_000
}

fn preload_on(v: &Arc<Volume>, first: u64, n: u64) -> std::thread::JoinHandle<Result<PreloadReport, EngineError>> {
    on_thread(v, move |v| v.preload(blocks(first), blocks(n), |_| true))
}

fn count_read_hits(v: &Volume, range: std::ops::Range<u64>) -> u64 {
    let before = v.status().counters.read_hit_blocks;
    let mut buf = vec![0u8; BS];
    for b in range {
        v.read(b * BS as u64, &mut buf).unwrap();
    }
    v.status().counters.read_hit_blocks - before
}

// ------------------------------------------------------------------------------------------
// 1. Races with the preload's backing read.

/// A FUA write (and a plain write of another block of the chunk) while the preload's backing
/// read of the chunk is in flight: neither the live volume nor a power cut may return the
/// preload's stale read.
#[test]
fn fua_write_during_the_preload_read_wins_after_a_power_cut() {
    let r = plain();
    let held = r.bdev.hold(|op, off, len| op == Op::Read && covers(off, len, 40));
    let p = preload_on(&r.v, 0, 2 * CHUNK);
    r.bdev.wait_held(held);
    r.v.write_fua(blocks(40), &stamp(40, 7)).unwrap();
    write(&r.v, 41, 8);
    r.v.flush().unwrap();
    r.bdev.release(held);
    let rep = join_within(p, 30, "the preload").unwrap();
    assert_eq!(rep.left_out_blocks, 2, "{rep:?}");
    assert_eq!((ver(&r.v, 40), ver(&r.v, 41), ver(&r.v, 42)), (7, 8, 0));
    let after = cut(&r);
    assert_eq!((ver(&after, 40), ver(&after, 41), ver(&after, 42)), (7, 8, 0));
}

/// A partial-block write (read-modify-write through `write_bytes`, whose own read of the
/// block is a second fill of it) while the preload's read of the block is in flight.
#[test]
fn partial_block_write_during_the_preload_read_wins() {
    let r = plain();
    let held = r.bdev.hold(|op, off, len| op == Op::Read && covers(off, len, 40));
    let p = preload_on(&r.v, 0, CHUNK);
    r.bdev.wait_held(held);
    r.v.write_bytes(blocks(40) + 100, b"hello").unwrap();
    r.v.flush().unwrap();
    r.bdev.release(held);
    join_within(p, 30, "the preload").unwrap();
    let mut want = stamp(40, 0);
    want[100..105].copy_from_slice(b"hello");
    let mut got = vec![0u8; BS];
    r.v.read(blocks(40), &mut got).unwrap();
    assert!(got == want, "live: block 40 lost the partial write");
    let after = cut(&r);
    after.read(blocks(40), &mut got).unwrap();
    assert!(got == want, "after a power cut: block 40 lost the partial write");
}

/// A write-around (flushed) of blocks whose preload read is in flight: the fills are
/// cancelled, nothing stale is admitted, live or after a power cut.
#[test]
fn flushed_write_around_during_the_preload_read_wins() {
    let r = wa();
    let held = r.bdev.hold(|op, off, len| op == Op::Read && covers(off, len, 120));
    let p = preload_on(&r.v, 100, 96);
    r.bdev.wait_held(held);
    write_n(&r.v, 120, 4, 5).unwrap();
    assert_eq!(around(&r.v), 4, "went around");
    r.v.flush().unwrap();
    r.bdev.release(held);
    join_within(p, 30, "the preload").unwrap();
    assert_eq!(vers(&r.v, 119..125), vec![0, 5, 5, 5, 5, 0]);
    let after = crash_and_recover(&r.cache, &r.backing);
    assert_eq!(vers(&after, 119..125), vec![0, 5, 5, 5, 5, 0]);
}

/// A preload that runs entirely while a write-around's backing write is in progress (it
/// reads the old data): nothing of it may be admitted; the write-around wins.
#[test]
fn preload_during_a_write_around_in_progress_admits_nothing_stale() {
    let r = wa();
    let held = r.bdev.hold(|op, off, len| op == Op::Write && covers(off, len, 120));
    let w = on_thread(&r.v, |v| write_n(v, 120, 4, 5));
    r.bdev.wait_held(held);
    let rep = join_within(preload_on(&r.v, 100, 96), 30, "the preload").unwrap();
    assert!(rep.left_out_blocks >= 4, "{rep:?}");
    r.bdev.release(held);
    join_within(w, 30, "the write-around").unwrap();
    assert_eq!(vers(&r.v, 119..125), vec![0, 5, 5, 5, 5, 0], "live");
    r.v.flush().unwrap();
    let after = crash_and_recover(&r.cache, &r.backing);
    assert_eq!(vers(&after, 119..125), vec![0, 5, 5, 5, 5, 0], "after a power cut");
}

/// A write-around completed (not yet flushed) before the preload; a FLUSH settles it while the
/// preload's read is held: the preload read the new data, which may then be admitted (it is
/// durable on the backing device). Correct either way: new data live and after a power cut.
#[test]
fn flush_settling_a_write_around_while_the_preload_reads() {
    let r = wa();
    write_n(&r.v, 120, 4, 5).unwrap();
    let held = r.bdev.hold(|op, off, len| op == Op::Read && covers(off, len, 120));
    let p = preload_on(&r.v, 100, 48);
    r.bdev.wait_held(held);
    r.v.flush().unwrap();
    r.bdev.release(held);
    let rep = join_within(p, 30, "the preload").unwrap();
    assert_eq!(rep.admitted_blocks, 48, "settled before admission: {rep:?}");
    assert_eq!(vers(&r.v, 119..125), vec![0, 5, 5, 5, 5, 0]);
    r.v.flush().unwrap();
    let after = crash_and_recover(&r.cache, &r.backing);
    assert_eq!(vers(&after, 119..125), vec![0, 5, 5, 5, 5, 0]);
}

/// BUG (design gap): one unflushed write-around anywhere on the volume makes a preload admit
/// nothing at all (`around.admissible` is false for every block until the next FLUSH), and
/// the preload reports success. A preload is a deliberate bulk warm-up: it should settle the
/// write-arounds itself (one backing flush) instead of reading the whole range for nothing.
#[test]
fn an_unrelated_unflushed_write_around_starves_a_preload() {
    let r = wa();
    write_n(&r.v, 3000, 2, 1).unwrap();
    assert_eq!(around(&r.v), 2);
    let rep = r.v.preload(blocks(100), blocks(96), |_| true).unwrap();
    assert_eq!(
        rep.admitted_blocks, 96,
        "a write-around of blocks 3000-3001 (far from the range) left the whole preload out: {rep:?}"
    );
}

/// A TRIM of the whole range while the preload's read is held: clean copies marked hot are
/// dropped, and what the preload read before the TRIM is left out (a TRIM cancels the fills
/// of its range: after it the volume promises nothing of the old data, and the backing device
/// may change under the range). Then dirty data written over it survives a cut.
#[test]
fn trim_during_the_preload_read() {
    let r = plain();
    read_once(&r.v, 10..20);
    read_once(&r.v, (0..200).map(cold)); // (their record is sealed and installed)
    assert!(slot_of(&r.v, 15).is_some());
    let held = r.bdev.hold(|op, off, len| op == Op::Read && covers(off, len, 0));
    let p = preload_on(&r.v, 0, CHUNK);
    r.bdev.wait_held(held);
    r.v.discard(0, blocks(CHUNK)).unwrap();
    r.bdev.release(held);
    let rep = join_within(p, 30, "the preload").unwrap();
    assert_eq!((rep.cached_blocks, rep.admitted_blocks, rep.left_out_blocks), (10, 0, 86), "{rep:?}");
    assert!(slot_of(&r.v, 15).is_none(), "trimmed");
    assert_eq!(freq(&r.v, 50), None, "read before the TRIM: not admitted");
    assert_eq!(r.v.status().hot_blocks, hot_in_index(&r.v));
    for b in 5..25 {
        write(&r.v, b, 3);
    }
    r.v.flush().unwrap();
    let after = cut(&r);
    assert_eq!(vers(&after, 4..26), [vec![0], vec![3; 20], vec![0]].concat());
}

/// A dirty block whose only copy rots, found by a reader while the preload's read of its
/// chunk is in flight: it is declared lost, and the preload (which planned it as cached) must
/// not bring the backing device's stale copy in, live or after a power cut.
#[test]
fn a_reader_finds_a_rotten_dirty_copy_while_the_preload_reads() {
    let r = plain();
    write(&r.v, 40, 6);
    r.v.flush().unwrap();
    corrupt_cached_block(&r.cache, &r.v, 40);
    let held = r.bdev.hold(|op, off, len| op == Op::Read && covers(off, len, 0));
    let p = preload_on(&r.v, 0, CHUNK);
    r.bdev.wait_held(held);
    assert!(is_lost(&read_version(&r.v, 40), 40));
    r.bdev.release(held);
    join_within(p, 30, "the preload").unwrap();
    assert!(is_lost(&read_version(&r.v, 40), 40), "live: {:?}", read_version(&r.v, 40));
    r.v.flush().unwrap();
    let after = cut(&r);
    assert!(is_lost(&read_version(&after, 40), 40), "after a cut: {:?}", read_version(&after, 40));
    // A lost block preloaded is skipped (left out), and stays lost.
    let rep = r.v.preload(blocks(40), blocks(1), |_| true).unwrap();
    assert_eq!(rep.left_out_blocks, 1, "{rep:?}");
    assert!(is_lost(&read_version(&r.v, 40), 40));
}

/// A writer forcing reclaim (the log wraps several times) while preloads run over the blocks
/// it writes: every block reads its last acknowledged version, live and after a power cut.
/// (The interleaving is free; the outcome is the same for every interleaving.)
#[test]
fn preloads_racing_a_writer_that_wraps_the_log() {
    let r = plain();
    let stop = Arc::new(AtomicBool::new(false));
    let preloader = {
        let stop = Arc::clone(&stop);
        on_thread(&r.v, move |v| {
            let mut n = 0;
            while !stop.load(Ordering::Relaxed) {
                v.preload(0, blocks(600), |_| true).unwrap();
                n += 1;
            }
            n
        })
    };
    let mut last: HashMap<u64, u64> = HashMap::new();
    for i in 0..4000u64 {
        let b = (i * 37) % 600;
        write(&r.v, b, i + 1);
        last.insert(b, i + 1);
        if i % 500 == 499 {
            r.v.flush().unwrap();
        }
    }
    stop.store(true, Ordering::Relaxed);
    let rounds = join_within(preloader, 60, "the preloads");
    r.v.flush().unwrap();
    assert!(r.v.status().counters.reclaimed_blocks > 2048, "the log wrapped");
    for b in 0..600 {
        assert_eq!(ver(&r.v, b), last.get(&b).copied().unwrap_or(0), "live block {b} ({rounds} preloads)");
    }
    let after = cut(&r);
    for b in 0..600 {
        assert_eq!(ver(&after, b), last.get(&b).copied().unwrap_or(0), "block {b} after a power cut");
    }
}

// ------------------------------------------------------------------------------------------
// 2. What the preload finds: dirty, staged, in flight, lost blocks; ranges; faults.

/// Dirty blocks, durable or only staged, are marked hot and never read from the backing
/// device; their data survives (staged ones go into the preload's first record).
#[test]
fn dirty_and_staged_blocks_are_not_read_and_keep_their_data() {
    let r = plain();
    for b in 10..20 {
        write(&r.v, b, 4);
    }
    r.v.flush().unwrap();
    for b in 20..30 {
        write(&r.v, b, 5);
    }
    let reads = r.backing.stats().reads;
    let rep = r.v.preload(0, blocks(CHUNK), |_| true).unwrap();
    assert_eq!((rep.cached_blocks, rep.admitted_blocks), (20, 76), "{rep:?}");
    assert_eq!(r.backing.stats().reads - reads, 2, "two runs read: 0-9 and 30-95");
    assert_eq!((freq(&r.v, 15), freq(&r.v, 25)), (Some(3), Some(3)));
    assert_eq!((slot_of(&r.v, 15).unwrap().1, slot_of(&r.v, 25).unwrap().1), (true, true), "still dirty");
    assert_eq!(vers(&r.v, 9..31), [vec![0], vec![4; 10], vec![5; 10], vec![0]].concat());
    r.v.flush().unwrap();
    assert_eq!(vers(&cut(&r), 9..31), [vec![0], vec![4; 10], vec![5; 10], vec![0]].concat());
}

/// Blocks in a record whose write is held (slow cache device): they are marked hot when the
/// record installs, the preload's own records install after it, and the preload finishes
/// without waiting for it (three records of its own fit the pipeline).
#[test]
fn blocks_in_a_record_in_flight_enter_hot_when_it_installs() {
    let r = plain();
    let held = r.cdev.hold(|op, _, _| op == Op::Write);
    // 97 blocks: the first 96 fill staging and are sealed by the writer itself (pipelined).
    let w = on_thread(&r.v, |v| v.write(blocks(40), &stamps(40, 97, 2)));
    r.cdev.wait_held(held);
    let rep = join_within(preload_on(&r.v, 0, 200), 30, "the preload behind a held record").unwrap();
    assert_eq!((rep.cached_blocks, rep.admitted_blocks), (96, 104), "{rep:?}");
    r.cdev.release(held);
    join_within(w, 30, "the writer").unwrap();
    r.v.flush().unwrap();
    for b in [0, 39, 40, 100, 135, 136, 137, 199] {
        assert_eq!(freq(&r.v, b), Some(3), "block {b} hot");
    }
    assert_eq!(vers(&r.v, 38..139), [vec![0; 2], vec![2; 97], vec![0; 2]].concat());
    assert_eq!(r.v.status().hot_blocks, hot_in_index(&r.v));
    assert_eq!(vers(&cut(&r), 38..139), [vec![0; 2], vec![2; 97], vec![0; 2]].concat());
}

/// BUG (minor): an empty range at an unaligned offset is "widened" to a whole block and
/// preloaded (`aligned_span(100, 0)` is block 0).
#[test]
fn an_empty_range_preloads_nothing() {
    let r = plain();
    let rep = r.v.preload(100, 0, |_| true).unwrap();
    assert_eq!(rep.blocks, 0, "{rep:?}");
    assert!(slot_of(&r.v, 0).is_none(), "block 0 was loaded for an empty range");
}

/// Unaligned ranges widen to whole blocks; the volume's last block; ranges that overflow.
#[test]
fn unaligned_last_block_and_overflowing_ranges() {
    let r = plain();
    let rep = r.v.preload(blocks(5) + 100, BS as u64, |_| true).unwrap();
    assert_eq!((rep.blocks, rep.admitted_blocks), (2, 2), "{rep:?}");
    let last = BACKING_BLOCKS - 1;
    let rep = r.v.preload(blocks(BACKING_BLOCKS) - 1, 1, |_| true).unwrap();
    assert_eq!((rep.blocks, rep.admitted_blocks), (1, 1), "{rep:?}");
    assert_eq!(freq(&r.v, last), Some(3));
    assert_eq!(ver(&r.v, last), 0);
    assert_eq!(r.v.preload(blocks(BACKING_BLOCKS), 0, |_| true).unwrap().blocks, 0);
    for (o, l) in [(blocks(BACKING_BLOCKS), 1), (u64::MAX - 10, 20), (0, u64::MAX), (blocks(last), blocks(2))] {
        let e = r.v.preload(o, l, |_| true).unwrap_err();
        assert!(matches!(e, EngineError::OutOfRange { .. }), "{o}+{l}: {e:?}");
    }
}

/// Two overlapping preloads, one held at its first backing read while the other runs to the
/// end: the data stays right and every block is hot once; the counters stay consistent.
#[test]
fn overlapping_preloads_from_two_threads() {
    let r = plain();
    let held = r.bdev.hold(|op, off, len| op == Op::Read && covers(off, len, 0));
    let p1 = preload_on(&r.v, 0, 300);
    r.bdev.wait_held(held);
    let rep2 = join_within(preload_on(&r.v, 50, 300), 30, "the second preload").unwrap();
    r.bdev.release(held);
    let rep1 = join_within(p1, 30, "the first preload").unwrap();
    eprintln!("first {rep1:?}\nsecond {rep2:?}");
    for rep in [rep1, rep2] {
        assert_eq!(rep.blocks, rep.admitted_blocks + rep.cached_blocks + rep.left_out_blocks, "{rep:?}");
    }
    for b in 0..350 {
        assert_eq!(freq(&r.v, b), Some(3), "block {b}");
    }
    assert_eq!(r.v.status().hot_blocks, hot_in_index(&r.v));
    assert_eq!(vers(&r.v, 0..350), vec![0; 350]);
}

/// A preload on a volume poisoned by a cache write error fails at once, without hanging.
#[test]
fn a_preload_on_a_poisoned_volume_fails() {
    let r = plain();
    r.cache.fail_after(Some(OpKind::Write), 0, FailMode::Forever);
    write(&r.v, 7, 1);
    assert!(r.v.flush().is_err());
    let e = join_within(preload_on(&r.v, 0, 300), 30, "the preload").unwrap_err();
    assert!(matches!(e, EngineError::Poisoned { .. }), "{e:?}");
    assert_eq!(ver(&r.v, 7), 1, "the failed record still serves reads");
}

/// A cache write error at the preload's second record: the preload fails without hanging or
/// panicking (the chunk read ahead has its fills ended), reads still return right data.
#[test]
fn a_cache_write_error_mid_preload() {
    let r = plain();
    r.cache.fail_after(Some(OpKind::Write), 1, FailMode::Once);
    let e = join_within(preload_on(&r.v, 0, 400), 30, "the preload").unwrap_err();
    assert!(matches!(e, EngineError::Device { role: Role::Cache, .. } | EngineError::Poisoned { .. }), "{e:?}");
    assert_eq!(vers(&r.v, 0..400), vec![0; 400]);
}

/// A backing read error at the second chunk: the preload fails, the first chunk stays cached
/// and hot, and no fill of the failed chunk is left registered: a block of it written, written
/// back and evicted is admitted again by a later read miss (a leaked fill, cancelled by the
/// write, would refuse it for ever).
#[test]
fn a_backing_read_error_mid_preload_releases_its_fills() {
    let r = plain();
    r.backing.fail_after(Some(OpKind::Read), 1, FailMode::Once);
    let e = r.v.preload(0, blocks(300), |_| true).unwrap_err();
    assert!(matches!(e, EngineError::Device { role: Role::Backing, .. }), "{e:?}");
    assert_eq!(freq(&r.v, 50), Some(3), "the first chunk is cached, hot");
    let b = 150;
    assert!(slot_of(&r.v, b).is_none());
    write(&r.v, b, 3);
    r.v.write_back_all(1.0, |_, _| true).unwrap();
    read_once(&r.v, (0..2_500).map(cold));
    assert!(slot_of(&r.v, b).is_none(), "evicted");
    let admitted = r.v.status().counters.admitted_blocks;
    assert_eq!(ver(&r.v, b), 3);
    assert_eq!(r.v.status().counters.admitted_blocks - admitted, 1, "the miss of block {b} was admitted");
}

// ------------------------------------------------------------------------------------------
// 3. `hot_on_install` and the hot counter.

/// BUG: a preload that fails (here: its first backing read) leaves the hot marks of the blocks
/// it found staged in `hot_on_install` (the prune keeps a block still staged). The staged copy
/// then goes without a record (TRIM), and a later one-time read miss of the block is installed
/// with the highest count: the mark outlives the copy it was for, until some later preload
/// prunes it.
#[test]
fn a_failed_preload_leaves_no_hot_mark_behind() {
    let r = plain();
    read_once(&r.v, 5..6); // staged clean, not sealed
    assert_eq!(r.v.status().staged_blocks, 1);
    r.backing.fail_after(Some(OpKind::Read), 0, FailMode::Once);
    assert!(r.v.preload(0, blocks(CHUNK), |_| true).is_err());
    r.v.discard(blocks(5), blocks(1)).unwrap(); // the staged copy goes, no record
    assert_eq!(r.v.status().staged_blocks, 0);
    read_once(&r.v, 5..6); // a one-time read miss
    write(&r.v, 3000, 1);
    r.v.flush().unwrap(); // sealed and installed
    assert_eq!(freq(&r.v, 5), Some(0), "a one-time read installed hot by a failed preload's stale mark");
}

/// A block preloaded (staged clean, marked) and rewritten before its record is sealed: the
/// dirty copy enters hot. Judged acceptable (a rewrite keeps a hot block's count anyway);
/// checked here so the behaviour is pinned: the data is the rewrite's, and it is dirty.
#[test]
fn a_block_rewritten_before_its_preloaded_copy_is_sealed() {
    let r = plain();
    let held = r.cdev.hold(|op, _, _| op == Op::Write);
    let p = preload_on(&r.v, 0, 10);
    r.cdev.wait_held(held); // the preload's record is sealed; its write is held
    write(&r.v, 5, 9); // a rewrite, staged after the preload's record
    r.cdev.release(held);
    join_within(p, 30, "the preload").unwrap();
    r.v.flush().unwrap();
    assert_eq!(slot_of(&r.v, 5).map(|s| s.1), Some(true), "dirty");
    assert_eq!(ver(&r.v, 5), 9);
    assert_eq!(freq(&r.v, 5), Some(3));
    assert_eq!(ver(&cut(&r), 5), 9);
}

/// `Status.hot_blocks` equals the index entries whose count is not zero through preloads
/// (set_freq), reads (touch), rewrites, TRIMs, write-back and reclaim laps (reinsertion).
#[test]
fn the_hot_counter_matches_the_index() {
    let r = plain();
    let check = |what: &str| assert_eq!(r.v.status().hot_blocks, hot_in_index(&r.v), "after {what}");
    r.v.preload(0, blocks(200), |_| true).unwrap();
    check("a preload");
    read_once(&r.v, 300..400);
    read_once(&r.v, 300..350);
    check("reads");
    for b in 100..150 {
        write(&r.v, b, 1);
    }
    r.v.flush().unwrap();
    check("rewrites");
    r.v.discard(0, blocks(50)).unwrap();
    check("a TRIM");
    r.v.preload(0, blocks(400), |_| true).unwrap();
    check("a preload over cached blocks");
    r.v.write_back_all(1.0, |_, _| true).unwrap();
    check("write-back");
    read_once(&r.v, (0..3_000).map(cold));
    check("three laps of one-time reads");
    assert!(r.v.status().counters.reinserted_blocks > 0);
}

// ------------------------------------------------------------------------------------------
// 4. The FIFO switch.

/// With `Eviction::Fifo`, reclaim keeps nothing, hot or not (preloaded blocks included), and
/// the laps evict the preloaded range.
#[test]
fn fifo_keeps_nothing() {
    let r = plain_with(VolumeOptions { eviction: Eviction::Fifo, ..VolumeOptions::default() });
    assert_eq!(r.v.status().eviction, Eviction::Fifo);
    r.v.preload(0, blocks(300), |_| true).unwrap();
    read_once(&r.v, 0..300); // read again: still nothing kept
    read_once(&r.v, (0..2_000).map(cold));
    assert_eq!(r.v.status().counters.reinserted_blocks, 0);
    assert_eq!(count_read_hits(&r.v, 0..300), 0, "every preloaded block evicted after two laps");
}

/// The policy changes across restarts of the same cache (reinsert, fifo, reinsert), with dirty
/// and hot data in it: nothing is lost or stale.
#[test]
fn switching_the_eviction_policy_across_restarts() {
    let (cache, backing) = devices_seg(LOG_SEGMENTS, SEGMENT, BACKING_BLOCKS, log_only());
    let open_with = |eviction| {
        let c: Arc<dyn BlockDevice> = cache.clone();
        let b: Arc<dyn BlockDevice> = backing.clone();
        let o = VolumeOptions { eviction, ..VolumeOptions::default() };
        Volume::open(c, b, Arc::new(MonotonicClock::new()), o).expect("open").0
    };
    let mut last: HashMap<u64, u64> = HashMap::new();
    for (round, eviction) in
        [Eviction::Reinsert, Eviction::Fifo, Eviction::Reinsert, Eviction::Fifo].into_iter().enumerate()
    {
        let v = open_with(eviction);
        for (&b, &x) in &last {
            assert_eq!(ver(&v, b), x, "round {round}: block {b}");
        }
        v.preload(0, blocks(300), |_| true).unwrap();
        for i in 0..400u64 {
            let b = (i * 13 + round as u64 * 5) % 500;
            write(&v, b, 10 * round as u64 + 1 + i % 3);
            last.insert(b, 10 * round as u64 + 1 + i % 3);
        }
        read_once(&v, (0..1_500).map(|n| cold(n + 1_500 * round as u64)));
        v.shutdown().unwrap();
    }
    let v = open_with(Eviction::Reinsert);
    for b in 0..500 {
        assert_eq!(ver(&v, b), last.get(&b).copied().unwrap_or(0), "block {b}");
    }
}

// ------------------------------------------------------------------------------------------
// 5. Hangs.

/// The caller stops while the read-ahead thread is blocked in its backing read: the preload
/// waits for that read (bounded by it), then ends its fills and returns.
#[test]
fn stopping_while_the_read_ahead_is_blocked() {
    let r = plain();
    let held = r.bdev.hold(|op, off, len| op == Op::Read && covers(off, len, CHUNK));
    // (The caller stops only once the read-ahead's read is held: stopping sooner could win
    // the race to the read-ahead's stop check, and the read would never come.)
    let bdev = Arc::clone(&r.bdev);
    let p = on_thread(&r.v, move |v| {
        v.preload(0, blocks(600), |_| {
            bdev.wait_held(held);
            false
        })
    });
    r.bdev.wait_held(held);
    assert!(!finishes_within(&p, 1), "returned with its read-ahead still reading");
    r.bdev.release(held);
    let rep = join_within(p, 30, "the stopped preload").unwrap();
    assert_eq!(rep.admitted_blocks, CHUNK, "{rep:?}");
    assert!(slot_of(&r.v, CHUNK).is_none());
    // The read-ahead chunk's fills are gone: a write + read of one of its blocks is normal.
    write(&r.v, CHUNK + 4, 2);
    assert_eq!(ver(&r.v, CHUNK + 4), 2);
}

/// The progress callback works on the volume: it writes a block of the chunk read ahead
/// (whose fill must be cancelled), flushes, and runs a nested preload of another range.
#[test]
fn a_progress_callback_that_writes_flushes_and_preloads() {
    let r = plain();
    let held = r.bdev.hold(|op, off, len| op == Op::Read && covers(off, len, CHUNK + 10));
    let p = {
        let v = Arc::clone(&r.v);
        let bdev = Arc::clone(&r.bdev);
        std::thread::spawn(move || {
            let mut calls = 0;
            v.preload(0, blocks(3 * CHUNK), |_| {
                calls += 1;
                if calls == 1 {
                    bdev.wait_held(held); // the second chunk is planned, its read in flight
                    write(&v, CHUNK + 10, 9);
                    v.flush().unwrap();
                    bdev.release(held);
                    v.preload(blocks(1_000), blocks(200), |_| true).unwrap();
                }
                true
            })
        })
    };
    let rep = join_within(p, 60, "the preload").unwrap();
    assert_eq!(rep.left_out_blocks, 1, "{rep:?}");
    assert_eq!(ver(&r.v, CHUNK + 10), 9);
    assert_eq!(freq(&r.v, 1_100), Some(3));
    assert_eq!(ver(&cut(&r), CHUNK + 10), 9);
}

// ------------------------------------------------------------------------------------------
// 6. Cost.

/// A preload of more than the cache holds makes every cached block hot (count 3): reclaim's
/// windows are then all "kept" blocks, and each reclaim record frees only its minimum
/// progress. A measurement, not a check (f871095: preloading 2,048 blocks into a 1,024-block
/// log reinserts 3,801 blocks, 1.9 extra cache block writes per block preloaded, leaves 938 of
/// them cached; the 2,048 block writes after it cost 1,574 more reinsertions and 91 cache
/// flushes). Neither the engine nor the CLI caps a preload at the cache's size.
#[test]
fn a_preload_larger_than_the_cache() {
    let r = plain();
    let log = 1024;
    let writes = r.cache.stats().writes;
    let t = std::time::Instant::now();
    let rep = r.v.preload(0, blocks(2 * log), |_| true).unwrap();
    let s = r.v.status();
    eprintln!(
        "preload of 2 logs: {rep:?} in {:?}; cache writes {}; reclaimed {} reinserted {} records {}",
        t.elapsed(),
        r.cache.stats().writes - writes,
        s.counters.reclaimed_blocks,
        s.counters.reinserted_blocks,
        s.counters.records_written
    );
    let cached = |v: &Volume| v.index_snapshot().iter().filter(|(b, _)| *b < 2 * log).count();
    eprintln!("cached of the preloaded range right after it: {}", cached(&r.v));
    let before = r.v.status().counters;
    let writes = r.cache.stats().writes;
    for i in 0..(2 * log) {
        write(&r.v, 5_000 + i, 1);
    }
    r.v.flush().unwrap();
    let after = r.v.status().counters;
    eprintln!(
        "then {} block writes: cache writes {}, reinserted {}, reclaimed {}, flushes {}",
        2 * log,
        r.cache.stats().writes - writes,
        after.reinserted_blocks - before.reinserted_blocks,
        after.reclaimed_blocks - before.reclaimed_blocks,
        after.cache_flushes - before.cache_flushes,
    );
}

/// Was a BUG (design/documentation): `tiercache preload --help` said the eviction policy keeps
/// preloaded blocks "for three laps of the log even if nothing reads them meanwhile". The laps
/// are the head's: with 800 of the log's 1,024 blocks hot, each reclaim frees little and the
/// head comes round every ~220 blocks of new data, so one log's worth of one-time reads evicts
/// half the preload (measured: 775, 725, 687, 566, 384 of 800 left after 200, 400, 600, 800,
/// 1,100 reads). The help, README and reclaim.rs now say so ("the next three times the log's
/// head reaches it ... the head comes round sooner when most of the cache is hot"); this test
/// pins that behaviour: about three passes of the head, i.e. about 3 x 224 new blocks.
#[test]
fn a_preload_of_most_of_the_cache_outlives_three_passes_of_the_head() {
    let r = plain();
    read_once(&r.v, (0..1_100).map(cold));
    let rep = r.v.preload(0, blocks(800), |_| true).unwrap();
    assert_eq!(rep.admitted_blocks, 800, "{rep:?}");
    assert_eq!(count_read_hits(&r.v, 0..800), 800, "right after the preload");
    let cached = |v: &Volume| v.index_snapshot().iter().filter(|(b, _)| *b < 800).count();
    let mut left = Vec::new();
    let mut n = 0;
    for step in [200, 200, 200, 200, 300] {
        read_once(&r.v, (n..n + step).map(|n| cold(n + 2_000)));
        n += step;
        left.push(cached(&r.v));
    }
    assert!(left[2] >= 640, "{} of 800 left after 600 one-time reads (about three passes)", left[2]);
    assert!(left[4] < left[2], "and they go after that: {left:?}");
}

/// BUG (minor): `Counters.preloaded_blocks` is documented as the blocks a preload "went
/// through (admitted, or cached already and marked hot)", but counts every block of each chunk,
/// including those left out (written meanwhile, lost).
#[test]
fn the_preloaded_counter_counts_admitted_and_cached_blocks_only() {
    let r = plain();
    write(&r.v, 40, 6);
    r.v.flush().unwrap();
    corrupt_cached_block(&r.cache, &r.v, 40);
    assert!(is_lost(&read_version(&r.v, 40), 40));
    let rep = r.v.preload(0, blocks(CHUNK), |_| true).unwrap();
    assert_eq!(rep.left_out_blocks, 1, "{rep:?}");
    assert_eq!(
        r.v.status().counters.preloaded_blocks,
        rep.admitted_blocks + rep.cached_blocks,
        "the lost block left out is counted as preloaded: {rep:?}"
    );
}
