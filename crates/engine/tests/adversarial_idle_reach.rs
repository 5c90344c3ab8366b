//! Review of c4d41b0, the pre-cleaner's idle reach (`Reach::Idle`, `preclean_idle_reach`,
//! age samples one per 10 ms): attacks on its age computation, its write-back racing
//! writers, TRIM, write-around, the online flush, reclaims waiting for the destage lock, bad
//! media and power cuts, and on what it leaves in `precleaned_until` for the rounds after it.
//! Virtual time (the devices' latencies on one clock, advanced by hand), no background thread:
//! each `background_tick` is one round. The rig is `tests/preclean_idle_reach.rs`'s (a
//! 1024-block log of 16-block segments), its backing device behind a `Dev` (any I/O can be
//! held) and a `Knob` (extra latency, and a count of backing writes per block).
//!
//! One attack failed on c4d41b0: `windows_the_idle_pass_left_are_judged_again_by_the_horizon`
//! (the idle pass advanced the `precleaned_until` the horizon's rounds resume from, so the
//! windows it left were not judged again until 4 segments from the head; the writers' reclaims
//! then wrote them back in their own path: 736 blocks over 26 of 61 round cadences, 63 over 1
//! with the idle reach off). Fixed: the idle reach has its own cursor
//! (`idle_precleaned_until`). The rest passed. The half-log walk held the state lock 3-18 ms
//! on a 1 GiB cache (the ignored test measures it): an idle round now walks at most
//! `PRECLEAN_IDLE_WALK_BLOCKS` (16,384) past where it resumes, 1.7 ms there.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tiercache_device::{BlockDevice, Clock, SimClock, SimDevice};
use tiercache_engine::{Volume, VolumeOptions, WriteAroundPolicy};

mod common;
use common::holds::{covers, join_within, thread_id, Op};
use common::idle_rig::*;
use common::*;

// ------------------------------------------------------------------------------------------
// The age computation's edges.

/// Attack: the age samples live in RAM only and restart empty at open. After a power cut and
/// a reopen on the same clock (well past 10 s), records written before the cut are of
/// unknown age: does the idle reach take them at once (dated by nothing), or, worse, date
/// them by a sample taken since? And does it take them once the first sample since the
/// reopen is 10 s old (they are older than it)?
/// Result on c4d41b0: PASSED (nothing until a sample 10 s old exists; then the pre-cut
/// stretch is written back; every block at its flushed version throughout).
#[test]
fn after_a_reopen_the_idle_reach_waits_for_a_sample_ten_seconds_old() {
    let mut r = Rig::old_stretch(VolumeOptions::default());
    let stretch = r.dirty_of(1000..1096);
    assert_eq!(stretch.len(), 96, "{stretch:?}");
    r.crash_and_reopen(7);
    // (The stretch's blocks only: hits. Reading all 4,096 admits the misses, and the log
    // laps four times.)
    r.check_stretch("after the reopen");
    assert_eq!(r.dirty_of(1000..1096).len(), 96, "recovery kept the stretch dirty");
    // Short of room (the horizon is its floor with no samples), no samples: nothing.
    r.settle();
    r.v.background_tick().unwrap();
    assert_eq!(r.idle_blocks(), 0, "the idle reach took records of unknown age");
    assert_eq!(r.dirty_of(1000..1096).len(), 96);
    // Samples since the reopen, 5 s old: still nothing.
    r.clock.advance_ns(3_000_000_000);
    r.settle();
    r.v.background_tick().unwrap();
    assert_eq!(r.idle_blocks(), 0, "the idle reach took records dated by a sample younger than 10 s");
    // The first sample since the reopen is 10 s old: the stretch, written before it, is.
    r.clock.advance_ns(OLD_NS);
    r.settle();
    r.v.background_tick().unwrap();
    assert!(r.idle_blocks() > 0, "the stretch written before the reopen was never taken");
    assert!(r.dirty_of(1000..1096).len() <= 64, "{:?}", r.dirty_of(1000..1096));
    r.check_all("after the rounds");
}

/// Attack: a volume whose clock has not yet run 10 s (`now < age`: `checked_sub` None), and
/// samples all younger than the age (`partition_point` 0), and the testing age 0 (every
/// record old: `before == now`, the reach to the written tail).
/// Result on c4d41b0: PASSED.
#[test]
fn a_young_clock_reaches_nothing_and_age_zero_reaches_everything_within_half_the_log() {
    // The clock at about 2 s: nothing, however dense the stretch past the horizon.
    let mut r = Rig::new(VolumeOptions::default());
    r.clean_head_then_dense_stretch(96);
    r.churn_and_settle(1000);
    assert!(r.clock.now_ns() < 10_000_000_000);
    r.v.background_tick().unwrap();
    assert_eq!(r.idle_blocks(), 0);
    assert_eq!(r.dirty_of(1000..1096).len(), 96);
    // Age 0: the same stretch, written back at once.
    let mut r = Rig::new(options(Some(0), None));
    r.clean_head_then_dense_stretch(96);
    r.churn_and_settle(1000);
    r.v.background_tick().unwrap();
    assert!(r.idle_blocks() >= 32, "{}", r.idle_blocks());
    r.check_all("age 0");
}

/// Attack: the sample ring full and wrapped (4,096 samples, one per 10 ms, 41 s), the dense
/// stretch written before its first sample: is it dated (old, records before the ring's
/// first sample are older than it), and is the young data written since left alone?
/// Result on c4d41b0: PASSED.
#[test]
fn records_older_than_the_whole_sample_ring_are_old() {
    // A larger log here (16,384 blocks), so that 4,200 one-block records fit after the
    // stretch in the first lap.
    const LOG: u64 = 16_384;
    let clock = SimClock::new();
    let (cache, backing) = devices_on_clock(16, LOG, 8192, &clock, FAST, FAST);
    let c: Arc<dyn BlockDevice> = cache.clone();
    let b: Arc<dyn BlockDevice> = backing.clone();
    let v = Volume::open(c, b, Arc::new(clock.clone()), VolumeOptions::default()).unwrap().0;
    let mut model = vec![0u64; 8192];
    let mut version = 10;
    let write16 = |v: &Volume, model: &mut Vec<u64>, first: u64, version: u64| {
        v.write(first * BS as u64, &stamps(first, 16, version)).unwrap();
        v.flush().unwrap();
        model[first as usize..first as usize + 16].fill(version);
    };
    // Dead data (one 16-block range rewritten) past the horizon, then the stretch.
    while v.log_window().2 < 500 {
        write16(&v, &mut model, 8000, version);
        version += 1;
    }
    for b in (1000..1096).step_by(16) {
        write16(&v, &mut model, b, 2);
    }
    // 4,200 one-block records 10 ms apart: the ring wraps, its first sample 1 s and more
    // after the stretch, its last 42 s after.
    for _ in 0..4200 {
        clock.advance_ns(10_000_000);
        v.write(8100 * BS as u64, &stamp(8100, version)).unwrap();
        v.flush().unwrap();
        model[8100] = version;
        version += 1;
    }
    // Dense young data (blocks 2000..2064), then dead data until short of room.
    for b in (2000..2064).step_by(16) {
        write16(&v, &mut model, b, 3);
    }
    loop {
        let (head, _, tail) = v.log_window();
        if head + LOG - tail < 40 {
            break;
        }
        write16(&v, &mut model, 8000, version);
        version += 1;
    }
    clock.advance_ns(2_000_000_000);
    let dirty = |lo: u64, hi: u64| dirty_blocks(&v).into_iter().filter(|&b| (lo..hi).contains(&b)).count();
    assert_eq!(dirty(1000, 1096), 96);
    assert_eq!(dirty(2000, 2064), 64);
    for _ in 0..8 {
        v.background_tick().unwrap();
    }
    let s = v.status().counters;
    println!(
        "ring wrapped: log {:?}, idle {} old stretch dirty {} young {}",
        v.log_window(),
        s.preclean_idle_blocks,
        dirty(1000, 1096),
        dirty(2000, 2064)
    );
    assert!(dirty(1000, 1096) <= 64, "the stretch older than the sample ring was not taken");
    assert_eq!(dirty(2000, 2064), 64, "young data was taken");
    check_versions(&v, &model, "after the rounds");
}

// ------------------------------------------------------------------------------------------
// The idle round's write-back racing the rest.

/// Holds the idle round's first backing write of a block of the stretch (the round runs on a
/// thread of its own, the destage lock held); returns the hold and the round's thread.
fn idle_round_held(r: &Rig) -> (usize, std::thread::JoinHandle<tiercache_engine::Result<()>>) {
    let hold = r.held.hold(|op, off, len| op == Op::Write && (1000..1096).any(|b| covers(off, len, b)));
    let round = on_thread(&r.v, |v| v.background_tick());
    r.held.wait_held(hold);
    (hold, round)
}

/// Attack (the mark-clean rule, docs/format.md): the idle round's batch, read and verified,
/// is held at its backing write while a writer rewrites every block of the stretch and
/// FLUSHes; the batch then completes. It must mark clean only the versions it wrote (the
/// positions captured when it was taken), never the newer ones: all stay dirty, read back
/// new, survive a power cut (one while the batch is held, one after it), and the online
/// flush then puts them on the backing device.
/// Result on c4d41b0: PASSED.
#[test]
fn an_idle_batch_superseded_during_its_backing_write_marks_nothing_newer_clean() {
    let mut r = Rig::old_stretch(options(None, Some((16, 16))));
    let (hold, round) = idle_round_held(&r);
    r.write_dense(1000, 96, 5);
    // A power cut here (the batch read, the newer versions flushed, the batch's backing write
    // not yet done): the survivors recover the newer versions.
    {
        let (c, b) =
            devices_from_images_on_clock(r.cache.durable_image(), r.backing.durable_image(), &r.clock, FAST, FAST);
        let (c, b): (Arc<dyn BlockDevice>, Arc<dyn BlockDevice>) = (c, b);
        let v = Volume::open(c, b, Arc::new(r.clock.clone()), VolumeOptions::default()).unwrap().0;
        for blk in 1000..1096u64 {
            assert_eq!(read_version(&v, blk).unwrap(), Some(5), "power cut during the held batch: block {blk}");
        }
    }
    r.held.release(hold);
    round.join().unwrap().unwrap();
    assert!(r.idle_blocks() > 0, "the idle round wrote nothing back");
    assert_eq!(r.dirty_of(1000..1096).len(), 96, "a newer version was marked clean by the idle batch");
    r.check_all("after the round");
    r.crash_and_reopen(3);
    r.check_all("after a power cut");
    r.v.flush_all(|_, _| {}).unwrap();
    let m: Model = r.model.iter().enumerate().map(|(b, &v)| (b as u64, v)).collect();
    assert_backing_holds(&r.backing, &m);
}

/// Attack (TRIM): the whole stretch TRIMmed while the idle batch is held (its blocks dirty:
/// TRIM keeps dirty copies), and again after the round (the copies it marked clean are
/// dropped, reads go to the backing device). A TRIM must never expose a version older than
/// the last written: every block reads v2, before and after a power cut.
/// Result on c4d41b0: PASSED.
#[test]
fn trims_around_an_idle_batch_expose_no_older_version() {
    let mut r = Rig::old_stretch(options(None, Some((16, 16))));
    let (hold, round) = idle_round_held(&r);
    r.v.discard(1000 * BS as u64, 96 * BS as u64).unwrap();
    r.held.release(hold);
    round.join().unwrap().unwrap();
    assert!(r.idle_blocks() > 0, "the idle round wrote nothing back");
    let dirty = r.dirty_of(1000..1096).len();
    r.v.discard(1000 * BS as u64, 96 * BS as u64).unwrap();
    assert_eq!(r.dirty_of(1000..1096).len(), dirty, "TRIM dropped a dirty copy");
    r.check_stretch("after the TRIMs");
    r.crash_and_reopen(13);
    r.check_all("after a power cut");
}

/// Attack (bad media): copies of the old stretch rot on the cache device before the idle round
/// reads them. The round must not write a rotten block to the backing device nor mark it
/// clean; the block is lost (reads fail), never the backing device's older version served
/// silently, before and after a power cut; the rest of the stretch is written back.
/// Result on c4d41b0: PASSED.
#[test]
fn rotten_copies_in_the_idle_reach_are_lost_not_written_back() {
    let mut r = Rig::old_stretch(VolumeOptions::default());
    let rotten: Vec<u64> = (1000..1096).step_by(7).collect();
    for &b in &rotten {
        corrupt_cached_block(&r.cache, &r.v, b);
    }
    for _ in 0..3 {
        r.v.background_tick().unwrap();
    }
    assert!(r.idle_blocks() > 0, "the idle round wrote nothing back");
    let check = |v: &Volume, what: &str| {
        for b in 1000..1096u64 {
            let got = read_version(v, b);
            if rotten.contains(&b) {
                assert!(is_lost(&got, b), "{what}: rotten block {b} read {got:?}");
            } else {
                assert_eq!(got.unwrap(), Some(2), "{what}: block {b}");
            }
        }
    };
    check(&r.v, "after the rounds");
    for &b in &rotten {
        assert_ne!(backing_version(&r.backing, b), Some(2), "rotten block {b} reached the backing device as v2?");
        assert_eq!(r.knob.writes_of(b), 0, "the rotten copy of block {b} was written to the backing device");
    }
    r.crash_and_reopen(5);
    check(&r.v, "after a power cut");
}

/// Attack (write-around): while the idle batch is held, two large writes begin: one over
/// young dirty blocks (2000..2032), which goes around the cache once it has the destage lock
/// (it waits for the batch to begin, then writes the backing device and drops the dirty
/// copies), one over the last records of the old stretch, which the round's further batches
/// may have marked clean by then (a clean cached copy is never written around,
/// `may_write_around`: then it goes through the cache). Afterwards, and after a power cut,
/// every block reads its newest version, and the backing device ends with it.
/// Result on c4d41b0: PASSED.
#[test]
fn write_arounds_begun_over_a_held_idle_batch_keep_the_newest_version() {
    let o = VolumeOptions {
        write_around: WriteAroundPolicy { min_bytes: 32 * BS as u64, only_when_destage_bound: false },
        ..options(None, Some((16, 16)))
    };
    let mut r = Rig::old_stretch_then(o, |r| r.write_dense(2000, 32, 3));
    let (hold, round) = idle_round_held(&r);
    let young = on_thread(&r.v, |v| v.write(2000 * BS as u64, &stamps(2000, 32, 7)));
    let old = on_thread(&r.v, |v| v.write(1064 * BS as u64, &stamps(1064, 32, 7)));
    // (Both wait for the destage lock the held batch holds; give them time to get there.)
    std::thread::sleep(std::time::Duration::from_millis(100));
    r.held.release(hold);
    round.join().unwrap().unwrap();
    young.join().unwrap().unwrap();
    old.join().unwrap().unwrap();
    r.v.flush().unwrap();
    r.model[1064..1096].fill(7);
    r.model[2000..2032].fill(7);
    let around = r.v.status().counters.written_around_blocks;
    println!("written around: {around}");
    assert!(around >= 32, "the write over young dirty blocks went through the cache");
    r.check_stretch("after the write-arounds");
    for b in 2000..2032u64 {
        assert_eq!(read_version(&r.v, b).unwrap(), Some(7), "block {b}");
    }
    r.crash_and_reopen(9);
    r.check_all("after a power cut");
    r.v.flush_all(|_, _| {}).unwrap();
    for b in (1000..1096u64).chain(2000..2032) {
        assert_eq!(backing_version(&r.backing, b), Some(r.model[b as usize]), "backing block {b}");
    }
}

/// Attack (the online flush): `flush_all` starts while the idle batch is held, and a writer
/// rewrites part of the stretch meanwhile. `flush_all` must finish, write back what was dirty
/// when it began (or its newer version) and leave every block at its newest version.
/// Result on c4d41b0: PASSED.
#[test]
fn the_online_flush_during_a_held_idle_batch() {
    let mut r = Rig::old_stretch(options(None, Some((16, 16))));
    let (hold, round) = idle_round_held(&r);
    let flush = on_thread(&r.v, |v| v.flush_all(|_, _| {}));
    std::thread::sleep(std::time::Duration::from_millis(50));
    r.write_dense(1032, 32, 6);
    r.held.release(hold);
    round.join().unwrap().unwrap();
    join_within(flush, 60, "flush_all").unwrap();
    r.check_stretch("after the flush");
    // What was dirty when the flush began and not rewritten since is on the backing device.
    // (Blocks rewritten meanwhile are not its business, `write_back_all`: 1032..1064 may
    // still hold v0 there, their v6 dirty in the cache.)
    for b in (1000..1032u64).chain(1064..1096) {
        assert_eq!(backing_version(&r.backing, b), Some(2), "backing block {b}");
    }
    r.crash_and_reopen(11);
    r.check_all("after a power cut");
}

/// Attack (a writer's reclaim waiting for the destage lock, `lock_destage_for_reclaim`,
/// behind an idle batch): the idle batch is held; a writer churns until its head reaches the
/// stretch, whose dense windows its reclaim writes back, waiting for the held batch. Once the
/// batch goes on: no deadlock, every block at its version, and no block written to the
/// backing device twice (the reclaim drops what the batch wrote: `still_dirty_at`).
/// Result on c4d41b0: PASSED.
#[test]
fn a_reclaim_behind_a_held_idle_batch_writes_nothing_twice() {
    let mut r = Rig::old_stretch(options(None, Some((16, 16))));
    let near = r.dirty_of(1000..1096);
    let (hold, round) = idle_round_held(&r);
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let v = Arc::clone(&r.v);
    let target = r.v.log_window().0 + near[95];
    let writer = std::thread::spawn(move || {
        tid_tx.send(thread_id()).unwrap();
        let mut version = 5000;
        while v.log_window().0 <= target {
            for b in 3000..3004u64 {
                v.write(b * BS as u64, &stamp(b, version)).unwrap();
            }
            v.flush().unwrap();
            version += 1;
        }
        version - 1
    });
    // (Blocked: its reclaim waits for the destage lock. A writer that never needs it, its
    // reclaims copying the stretch forward, finishes instead.)
    let tid = tid_rx.recv().unwrap();
    let blocked = blocked_or_done(tid, &writer);
    r.held.release(hold);
    round.join().unwrap().unwrap();
    let last = join_within(writer, 60, "the writer");
    assert!(blocked, "the writer never waited for the held idle batch");
    r.model[3000..3004].fill(last);
    r.check_all("after the head passed the stretch");
    for b in 1000..1096u64 {
        assert!(r.knob.writes_of(b) <= 1, "block {b} written back {} times", r.knob.writes_of(b));
    }
    let c = r.v.status().counters;
    println!("reclaim write-backs {} idle {}", c.reclaim_write_backs, c.preclean_idle_blocks);
}

/// Waits until thread `tid` has been asleep for several looks in a row (true) or `h` finished
/// (false).
fn blocked_or_done<T>(tid: u64, h: &std::thread::JoinHandle<T>) -> bool {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let mut asleep = 0;
    while asleep < 5 {
        if h.is_finished() {
            return false;
        }
        assert!(std::time::Instant::now() < deadline, "thread {tid} neither blocked nor finished");
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).unwrap_or_default();
        let state = stat.rsplit(')').next().unwrap_or("").split_whitespace().next().unwrap_or("");
        asleep = if state == "S" || state == "D" { asleep + 1 } else { 0 };
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    true
}

// ------------------------------------------------------------------------------------------
// What the idle round leaves in `precleaned_until` for the rounds after it.

/// What the writers' reclaims wrote back while the head passed the stretch (blocks written
/// back in their path, and reclaims that wrote back), and what the background rounds did.
#[derive(Debug, Default, Clone, Copy)]
struct Passage {
    writer_destaged: u64,
    writer_write_backs: u64,
    background_destaged: u64,
    idle_blocks: u64,
}

/// Churns (one record at a time) until the head passes log position `until`, a background
/// round every 5 ms of virtual time or `every` records, as the background thread would.
fn pass_with_rounds(r: &mut Rig, until: u64, every: u64) -> Passage {
    let mut p = Passage::default();
    let mut last_tick = r.clock.now_ns();
    let mut n = 0u64;
    while r.v.log_window().0 <= until {
        let c0 = r.v.status().counters;
        r.churn1();
        let c1 = r.v.status().counters;
        p.writer_destaged += c1.destaged_blocks - c0.destaged_blocks;
        p.writer_write_backs += c1.reclaim_write_backs - c0.reclaim_write_backs;
        n += 1;
        if r.clock.now_ns() >= last_tick + 5_000_000 || n.is_multiple_of(every) {
            last_tick = r.clock.now_ns();
            r.v.background_tick().unwrap();
            let c2 = r.v.status().counters;
            p.background_destaged += c2.destaged_blocks - c1.destaged_blocks;
        }
    }
    p.idle_blocks = r.v.status().counters.preclean_idle_blocks;
    p
}

/// The scenario of the re-judging attack, with the idle reach as given: the old stretch past
/// the horizon, one round (the idle pass, where on, judges the stretch with the costs
/// measured so far: no copy-forward timed yet, so "an untimed copy is tried once" and it
/// leaves the windows whose look-ahead is not too dirty, `copy_through_is_cheaper`); then
/// clean blocks at the head read twice (the eviction policy keeps them: reclaim's copies,
/// which time a copy-forward: the judgement turns, copies costing about what write-backs do
/// on these devices); then the writers pass the stretch with background rounds between.
fn rejudge_scenario(idle_age_ms: Option<u64>, every: u64) -> (Rig, Vec<u64>, Passage) {
    let mut r = Rig::new(options(idle_age_ms, None));
    r.clean_head_then_dense_stretch(64);
    r.churn_until(700);
    r.clock.advance_ns(OLD_NS);
    r.churn_and_settle(1000);
    let near = r.dirty_of(1000..1064);
    assert_eq!(near.len(), 64);
    assert!(near[0] > 200 && near[63] < 512, "{near:?}");
    r.v.background_tick().unwrap();
    let left = r.dirty_of(1000..1064);
    // Clean blocks of the head's stretch read: kept, so reclaim copies them (a copy timed).
    let mut buf = vec![0u8; BS];
    for b in 0..336u64 {
        if b % 3 == 0 {
            r.v.read(b * BS as u64, &mut buf).unwrap();
            r.v.read(b * BS as u64, &mut buf).unwrap();
        }
    }
    let until = r.v.log_window().0 + near[63];
    let p = pass_with_rounds(&mut r, until, every);
    r.check_all("after the head passed the stretch");
    (r, left, p)
}

/// Attack: `precleaned_until` is shared by both reaches. An idle pass walks up to half the log
/// and leaves it there, so every later round (the horizon's, and `destage_oldest` above the
/// watermark) skips `[rejudged_until, precleaned_until)`: windows the idle pass judged
/// reclaim would copy, with the costs (and watermark) of that moment, are judged again only
/// once within `PRECLEAN_SEGMENTS` (4) segments of the head. Before, a window was first
/// judged when it came within the horizon (as far as the writers write in 1 s), with the
/// costs then. Here the judgement turns between the two looks (the idle pass judged with no
/// copy-forward timed yet, "an untimed copy is tried once"; the first reclaim then times
/// one, and on these devices a copy costs about what a write-back does): the horizon no
/// longer sees the windows the idle pass left, and unless a round happens to fall while they
/// are within 4 segments of the head, the writers' reclaims write them back in their own path.
/// Measured over background cadences of 4 to 64 records (a round every 5 ms of virtual time
/// or that many records, as the background thread runs): with the idle reach, the writers
/// wrote back 16-32 blocks in their path at 26 of the 61 cadences (736 blocks in all), the
/// background rounds the rest; without it, at 1 (63 blocks), and with the fix proposed in
/// the review (the idle reach keeps a cursor of its own, `idle_precleaned_until`, and leaves
/// `precleaned_until` to the horizon's rounds) at none.
/// Result on c4d41b0: FAILED (26 cadences worse, the first a round every 13 records: 32
/// blocks written back by a writer's reclaim with the idle reach, none without). Cause:
/// writeback.rs:233, `st.precleaned_until = st.precleaned_until.max(until)` for
/// `Reach::Idle` too, read back as `resume` (writeback.rs:144) by the next `Reach::Horizon`
/// round (and by `destage_oldest`). Passes with the proposed fix.
#[test]
fn windows_the_idle_pass_left_are_judged_again_by_the_horizon() {
    let mut worse = Vec::new();
    for every in 4u64..=64 {
        let (_, left, on) = rejudge_scenario(None, every);
        let (_, _, off) = rejudge_scenario(IDLE_OFF, every);
        assert!(!left.is_empty() && left.len() < 64, "the idle round left {} of 64", left.len());
        assert!(on.idle_blocks > 0);
        if on.writer_destaged > off.writer_destaged {
            worse.push((every, on.writer_destaged, off.writer_destaged));
        }
    }
    assert!(
        worse.is_empty(),
        "(a round every N records, blocks the writers wrote back with the idle reach, without): {worse:?}"
    );
}

// ------------------------------------------------------------------------------------------
// The half-log walk under the state lock.

/// A 1 GiB cache (262,144 blocks, the default 256-block segments) whose first lap is full of
/// old data (`read_per_write` 0: all clean, written then written back; else 16 blocks
/// written dirty for every `16 * read_per_write` read, the misses admitted clean: windows
/// sparse in dirty blocks), the writers short of room, the data 11 s old; one background
/// round timed (wall clock), and the longest a reader's cache hit waited meanwhile; then a
/// second round timed. (µs of the first round, µs of the longest read, µs of the second
/// round, idle blocks written.)
fn time_rounds_on_a_1gib_cache(idle_age_ms: Option<u64>, read_per_write: u64) -> (u128, u128, u128, u64) {
    const LOG: u64 = 262_144;
    let clock = SimClock::new();
    let (cache, backing) = {
        let ck = tiercache_format::Layout::checkpoint_blocks_for(LOG, BS as u32);
        let cache = Arc::new(
            SimDevice::new((2 + 2 * ck + LOG) * BS as u64, BS as u32)
                .with_name("cache")
                .with_clock(clock.clone(), FAST),
        );
        let backing = Arc::new(
            SimDevice::new(2 * LOG * BS as u64, BS as u32).with_name("backing").with_clock(clock.clone(), FAST),
        );
        tiercache_engine::create(
            &*cache,
            &*backing,
            &tiercache_engine::CreateOptions { segment_blocks: 256, ..log_only() },
        )
        .unwrap();
        (cache, backing)
    };
    let c: Arc<dyn BlockDevice> = cache.clone();
    let b: Arc<dyn BlockDevice> = backing.clone();
    let o = VolumeOptions { sequential_bypass_bytes: 0, ..options(idle_age_ms, None) };
    let v = Arc::new(Volume::open(c, b, Arc::new(clock.clone()), o).unwrap().0);
    let data = vec![0x5au8; 64 * BS];
    let mut next = 0u64;
    if read_per_write == 0 {
        while v.log_window().2 + 65 < LOG - 600 {
            v.write(next * BS as u64, &data).unwrap();
            v.flush().unwrap();
            next += 64;
        }
        v.flush_all(|_, _| {}).unwrap();
    } else {
        let mut buf = vec![0u8; 16 * BS];
        while v.log_window().2 + 200 < LOG - 600 {
            v.write(next * BS as u64, &data[..16 * BS]).unwrap();
            v.flush().unwrap();
            next += 16;
            for _ in 0..read_per_write {
                v.read(next * BS as u64, &mut buf).unwrap();
                next += 16;
            }
        }
        v.flush().unwrap();
    }
    clock.advance_ns(11_000_000_000);
    let (head, _, tail) = v.log_window();
    assert!(head + LOG - tail < 1024, "short of room: {:?}", v.log_window());
    // A reader hitting the cache meanwhile.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let longest = Arc::new(AtomicU64::new(0));
    let reader = {
        let (v, stop, longest) = (Arc::clone(&v), Arc::clone(&stop), Arc::clone(&longest));
        std::thread::spawn(move || {
            let mut buf = vec![0u8; BS];
            let mut n = 0u64;
            while !stop.load(Ordering::SeqCst) {
                let t = std::time::Instant::now();
                v.read(((n * 97) % 100_000) * BS as u64, &mut buf).unwrap();
                longest.fetch_max(t.elapsed().as_nanos() as u64, Ordering::SeqCst);
                n += 1;
                std::thread::yield_now();
            }
        })
    };
    std::thread::sleep(std::time::Duration::from_millis(50));
    longest.store(0, Ordering::SeqCst);
    let t = std::time::Instant::now();
    v.background_tick().unwrap();
    let first = t.elapsed().as_micros();
    std::thread::sleep(std::time::Duration::from_millis(5));
    stop.store(true, Ordering::SeqCst);
    reader.join().unwrap();
    let idle = v.status().counters.preclean_idle_blocks;
    let t = std::time::Instant::now();
    v.background_tick().unwrap();
    let second = t.elapsed().as_micros();
    (first, u128::from(longest.load(Ordering::SeqCst)) / 1000, second, idle)
}

/// Measurement (no assertion on time): the idle pass walks up to half the log, 131,072
/// positions of a 1 GiB cache, under one state-lock hold (`preclean`), where nothing there is
/// dense enough to write back (the horizon's walk was capped at a quarter of the log). How
/// long is the round, how long does a reader's cache hit wait behind it, and does the next
/// round walk it again?
/// Result on c4d41b0 (`--ignored`: 2 GiB of simulated devices; 2-core machine, release,
/// five runs): the first idle round 3.3-18 ms (median about 5.5) where the same round with
/// the idle reach off took 0.3-1.2 ms; a concurrent reader's cache hit waited up to 16 ms
/// (3-5 ms typically); the next round 0.04-0.5 ms (it resumes where the walk stopped). With
/// the walk capped at 16,384 positions a round (the review's proposal): 1.7 ms and 1.9 ms.
#[test]
#[ignore]
fn the_half_log_walk_on_a_1gib_cache_is_measured() {
    for read_per_write in [0u64, 7] {
        for (name, age) in [("idle off", IDLE_OFF), ("idle on", None)] {
            let (first, read, second, idle) = time_rounds_on_a_1gib_cache(age, read_per_write);
            println!(
                "1 GiB, {read_per_write} read per write, {name}: first round {first} us (longest read \
                 {read} us), second round {second} us, idle blocks {idle}"
            );
        }
    }
}
