//! Adversarial review of d3690f3: background write-back batches (the pre-cleaner's, the
//! destager's above the high watermark, `write_back_all`'s) get their own floor of 64 blocks
//! (`DESTAGE_BACKGROUND_BATCH_MIN_BLOCKS`; a writer's reclaim batch keeps 256), and the
//! background starts no batch while a writer's reclaim waits for the destage lock
//! (`reclaims_at_destage`, `reclaim_waits_for_destage`).
//!
//! Rigs: a fast cache and a slow backing device on one virtual clock (`SimLatency`), so every
//! measured cost, every batch size and every wait (`reclaim_destage_wait_max_us`, measured on
//! the volume's clock) is exact: at 1 ms a backing write and 1 ms a flush, a background batch
//! is 64 blocks (about 65 ms of virtual time) and a writer's reclaim batch 256. Waits are
//! measured under the deterministic scheduler (`tiercache_sched::Sched`) and with real threads
//! (a real `std::sync::Mutex`, whose releasing thread can take it again ahead of the thread it
//! wakes: the commit's own reason for the yield), a backing write held by a `Dev` there.
//!
//! Each test's doc comment says what it attacks (ATTACK) and what it found (FOUND). Tests that
//! FAIL on d3690f3 are findings; the others stay as regression tests. In short:
//! - fairness holds for the background thread's own batches (Sched, 24 runs, and a real
//!   mutex), but not for `write_back_all`, which never checks `reclaim_waits_for_destage`
//!   (5 batches under Sched, 13 with a real mutex and `flush_all`), nor where the online flush
//!   (busy share 0.5) already waits for the lock when a reclaim comes (2 batches, shipped
//!   callers only);
//! - at the 64 floor the pre-cleaner writes back only part of each dense default-size window
//!   and leaves the rest for the writer's reclaim to copy forward (128 of 247 blocks);
//! - an offline flush and the destager above the watermark pay the 64 floor where no writer
//!   waits (+38 % / +29 % virtual time on a backing device with a 15 ms flush);
//! - error paths (a failing batch a reclaim waits for, a panic at the destage lock) do not
//!   starve a working volume, though the count leaks on a panic; power cuts at every I/O of
//!   interleaved 64- and 256-block batches recover every flushed version.
//!
//! Not here (it is the simulator's crate): `cargo test --release -p tiercache-sim` FAILS on
//! d3690f3 (`tests::dense_windows_copied_over_the_lap_pass`: "no dense window copied over the
//! lap in seeds 34 and 63: the test proves nothing"; every other test there passes, and both
//! seeds' runs pass their checks). It passes on the parent 7e93211; with only the yield disabled
//! (`reclaim_waits_for_destage` always false) it passes again, with only the floor reverted to
//! 256 it still fails: the yield moved the scheduler's interleavings off the two seeds that
//! reached a copy over the lap.
//!
//! Fixed since (the tests below now pass, and pin the fixes): every write-back that is not a
//! writer's reclaim (the background, `write_back_all`, the elevator) takes the destage lock
//! through `lock_destage_behind_reclaims`, which lets a waiting reclaim go first even where it
//! came after the thread (findings 1 and 2); `write_back_all` keeps a writer's reclaim's floor
//! (256), not the background's (finding 4, for the flush; the destager's drain keeps the 64
//! floor: the trade for shorter waits); the count is a guard, counted down on a panic too
//! (finding 5); the simulator's seeds were chosen again (finding 6). Finding 3 is a trade the
//! floor makes, pinned by `a_dense_window_the_pre_cleaner_begins_is_left_to_the_writers_copy`
//! with `the_background_floor_over_two_lanes_of_virtual_time`: more copies, not more time.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tiercache_device::{BlockDevice, Clock, FailMode, OpKind, SimClock, SimDevice, SimLatency, SimStats};
use tiercache_engine::{EngineError, Volume, VolumeOptions};
use tiercache_sched::{Joined, Sched};

mod common;
use common::holds::{thread_id, wait_until_blocked, Dev, Op};
use common::*;

// ------------------------------------------------------------------------------------ rigs

/// 1 ms a backing write (a scattered block on an HDD), 1 ms a backing flush: timed at about
/// 1 ms a block, so background batches sit at their floor (64) and reclaim's at 256.
const HDD: SimLatency = SimLatency { read_ns: 100_000, write_ns: 1_000_000, flush_ns: 1_000_000 };

/// One background batch at the floor on `HDD`: 64 backing writes and the flushes (~65 ms).
const ONE_BATCH_US: u64 = 64_000;
/// One batch of `write_back_all` in virtual time (256 blocks: it keeps a writer's reclaim's
/// floor, not the background's 64).
const FLUSH_BATCH_US: u64 = 257_100;

struct Rig {
    clock: SimClock,
    cache: Arc<SimDevice>,
    backing: Arc<SimDevice>,
    v: Volume,
}

fn options(wm: (u16, u16), bounds: Option<(usize, usize)>) -> VolumeOptions {
    VolumeOptions {
        dirty_watermarks_permille: Some(wm),
        sequential_bypass_bytes: 0,
        write_back_batch_bounds: bounds,
        ..VolumeOptions::default()
    }
}

fn open_on(cache: &Arc<SimDevice>, backing: Arc<dyn BlockDevice>, clock: &SimClock, o: VolumeOptions) -> Volume {
    let c: Arc<dyn BlockDevice> = cache.clone();
    Volume::open(c, backing, Arc::new(clock.clone()), o).expect("open").0
}

/// A log of `log_blocks` in segments of `seg` over `backing_blocks`, on `HDD`; `bounds` the
/// testing override of both floors (`None`: the commit's 64 and 256).
fn rig(
    seg: u32,
    log_blocks: u64,
    backing_blocks: u64,
    lat: SimLatency,
    wm: (u16, u16),
    bounds: Option<(usize, usize)>,
) -> Rig {
    let clock = SimClock::new();
    let (cache, backing) = devices_on_clock(seg, log_blocks, backing_blocks, &clock, FAST, lat);
    let v = open_on(&cache, backing.clone(), &clock, options(wm, bounds));
    Rig { clock, cache, backing, v }
}

/// After a power cut: every block reads a version at least the one flushed (`model`) and at
/// most `newest` (a write not yet flushed may or may not have survived).
fn check_recovered(v: &Volume, model: &[u64], newest: u64, what: &str) {
    let mut buf = vec![0u8; BS];
    for (b, &want) in model.iter().enumerate() {
        v.read(b as u64 * BS as u64, &mut buf).unwrap_or_else(|e| panic!("{what}: block {b}: {e}"));
        let got = version_of(b as u64, &buf).unwrap_or_else(|| panic!("{what}: block {b}: garbage"));
        assert!(got >= want && got <= want.max(newest), "{what}: block {b} reads {got}, {want} was flushed");
    }
}

fn total_ops(s: SimStats) -> u64 {
    s.reads + s.writes + s.flushes + s.fua_writes
}

// --------------------------------- rig: a background batch held at its first backing write

struct Held {
    clock: SimClock,
    cache: Arc<SimDevice>,
    backing: Arc<SimDevice>,
    dev: Arc<Dev>,
    v: Arc<Volume>,
    model: Vec<u64>,
}

/// 16-block segments (every window at the head is dense: 15-16 dirty blocks, more than the 8
/// reclaim copies), a 1,024-block log over 4,096 backing blocks behind a `Dev` (any backing
/// I/O can be held), on one clock. 840 scattered dirty blocks (the head's at 2000.., then
/// 0..), one write-back timed: background batches of 64, reclaim's of 256; the log is nearly
/// full, so a writer's next records need reclaim.
fn held_rig(wm: (u16, u16)) -> Held {
    let clock = SimClock::new();
    let (cache, backing) = devices_on_clock(16, 1024, 4096, &clock, FAST, HDD);
    let dev = Dev::new(&backing);
    let v = open_on(&cache, dev.clone(), &clock, options(wm, None));
    let mut model = vec![0u64; 4096];
    write_scattered_flushed(&v, &mut model, 2000, 420, 1);
    write_scattered_flushed(&v, &mut model, 0, 420, 1);
    assert_eq!(v.destage_step(1).unwrap(), 1);
    assert_eq!(v.status().background_batch_blocks, 64);
    assert_eq!(v.status().write_back_batch_blocks, 256);
    assert_eq!(v.log_window().0, 0, "no reclaim yet");
    Held { clock, cache, backing, dev, v: Arc::new(v), model }
}

/// A writer: blocks 3900.. at version 2, each written and flushed, until its reclaim has
/// moved the log head. Returns the blocks it wrote and flushed, and the error that stopped it.
fn write_until_the_head_moves(v: &Volume) -> (Vec<u64>, Option<EngineError>) {
    let head = v.log_window().0;
    let mut wrote = Vec::new();
    let mut blk = 3900;
    while v.log_window().0 == head {
        if let Err(e) = v.write(blk * BS as u64, &stamp(blk, 2)).and_then(|()| v.flush()) {
            return (wrote, Some(e));
        }
        wrote.push(blk);
        blk += 1;
    }
    (wrote, None)
}

/// `batch` runs on a thread of its own and its first backing write is held (with the destage
/// lock); a writer then writes single blocks (3900.., version 2, each flushed) until the head
/// moves: its reclaim meets the dense head window and waits for the destage lock. Once the
/// writer is seen blocked, `before_release` runs and the held write goes on. Returns what
/// `batch` returned, the blocks the writer wrote and flushed, and the error that stopped it.
fn behind_a_held<T: Send + 'static>(
    h: &Held,
    batch: impl FnOnce(&Volume) -> T + Send + 'static,
    before_release: impl FnOnce(),
) -> (T, Vec<u64>, Option<EngineError>) {
    let hold = h.dev.hold(|op, _, _| op == Op::Write);
    let b = on_thread(&h.v, batch);
    h.dev.wait_held(hold);
    let (tx, rx) = std::sync::mpsc::channel();
    let writer = on_thread(&h.v, move |v| {
        tx.send(thread_id()).unwrap();
        write_until_the_head_moves(v)
    });
    let tid = rx.recv().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert!(!writer.is_finished(), "the writer's reclaim never waited for the held batch");
    wait_until_blocked(tid);
    before_release();
    h.dev.release(hold);
    let r = b.join().unwrap();
    let (wrote, error) = writer.join().unwrap();
    (r, wrote, error)
}

fn wait_us(v: &Volume) -> u64 {
    v.status().counters.reclaim_destage_wait_max_us
}

// ------------------------------------------- attack 1: fairness with a real std mutex

/// ATTACK: the yield with a real `std::sync::Mutex`: the background round's first batch is
/// held at its backing write (destage lock held) above the high watermark, a writer's reclaim
/// meets a dense window and blocks on the destage lock; once the batch goes on, does the
/// background's round (up to 4 batches) release the lock and re-take it ahead of the woken
/// writer (what the commit says happened before), or does the writer wait for that one batch
/// only? Measured on the volume's virtual clock (only backing and cache I/O advance it).
/// FOUND: holds (REFUTED): the writer waited 65.0 ms, the one 64-block batch, and every
/// version reads back, before and after a power cut. (On this machine the woken writer won
/// the lock even with the yield disabled: the background's path from one batch to the next
/// is long enough. The Sched test below pins the yield; `flush_all`'s shorter path does
/// barge, two tests below.)
#[test]
fn a_reclaim_behind_a_held_background_batch_waits_for_that_batch_only() {
    let h = held_rig((100, 200));
    let (bg, wrote, error) = behind_a_held(&h, |v| v.background_tick(), || {});
    bg.unwrap();
    assert!(error.is_none(), "{error:?}");
    let waited = wait_us(&h.v);
    assert!(waited > ONE_BATCH_US / 2, "the writer waited for the held batch: {waited} us");
    assert!(waited < ONE_BATCH_US * 3 / 2, "a reclaim waited {waited} us: more than the one 64-block batch");
    let mut model = h.model.clone();
    for b in wrote {
        model[b as usize] = 2;
    }
    check_versions(&h.v, &model, "after the wait");
    let recovered = open(durable_copy(&h.cache), durable_copy(&h.backing));
    check_recovered(&recovered, &model, 2, "after a power cut");
}

/// ATTACK: `write_back_all` (its batches are background batches since d3690f3: "A writer
/// whose reclaim needs the destage lock waits for the background batch under way, and for no
/// other", ARCHITECTURE.md) run as `flush_all` (busy share 1: no pause between batches) while
/// a writer's reclaim waits for the destage lock, with a real std mutex. `write_back_all`
/// never looks at `reclaim_waits_for_destage` (writeback.rs, the `for batch in
/// pending.chunks(self.background_batch_blocks())` loop takes `lock_destage()` batch after
/// batch): does the releasing thread take the lock again ahead of the woken writer?
/// FIXED since (`lock_destage_behind_reclaims`).
/// FOUND: BUG (the commit's fairness claim does not hold for `write_back_all`): the writer's
/// reclaim waited 853.9 ms of virtual time (520.5 ms in one run), 13 (8) consecutive 64-block
/// batches of 65 ms, i.e. until the flush had written back nearly all of its 839 blocks. (With a
/// busy share of 0.5, the online flush's, the pause after each batch lets the writer in: see
/// the next test.) Shipped callers: the online flush uses 0.5 and the offline `tiercache
/// flush` has no writers, so only `Volume::flush_all` / `write_back_all(1.0)` called while
/// writers run (an embedding, the simulator) is exposed.
#[test]
fn a_reclaim_behind_flush_all_waits_for_one_batch_only() {
    // (Three runs, the longest wait: whether the flushing thread takes the lock again ahead of
    // the writer depends on the OS's scheduling of the two.)
    let mut waits = Vec::new();
    for _ in 0..3 {
        let h = held_rig((100, 200));
        let (flushed, wrote, error) = behind_a_held(&h, |v| v.write_back_all(1.0, |_, _| true), || {});
        flushed.unwrap();
        assert!(error.is_none(), "{error:?}");
        waits.push(wait_us(&h.v));
        let mut model = h.model.clone();
        for b in wrote {
            model[b as usize] = 2;
        }
        check_versions(&h.v, &model, "after the flush");
    }
    eprintln!("reclaim waits behind flush_all: {waits:?} us");
    let waited = *waits.iter().max().unwrap();
    assert!(
        waited < FLUSH_BATCH_US * 3 / 2,
        "a writer's reclaim waited {waited} us (one flush batch of 256 blocks is {FLUSH_BATCH_US}) behind flush_all's batches"
    );
}

/// ATTACK: the same with the online flush's pacing (`write_back_all(0.5, ..)`, serve's
/// `ONLINE_FLUSH_BUSY_SHARE`): it sleeps as long as each batch took before the next.
/// FOUND: holds (REFUTED): 65.1 ms, one batch (the pause, not the yield, lets the writer in).
/// (Since `write_back_all` keeps the 256 floor, one flush batch: 257 ms.)
#[test]
fn a_reclaim_behind_the_paced_online_flush_waits_for_one_batch() {
    let h = held_rig((100, 200));
    let (flushed, _, error) = behind_a_held(&h, |v| v.write_back_all(0.5, |_, _| true), || {});
    flushed.unwrap();
    assert!(error.is_none(), "{error:?}");
    let waited = wait_us(&h.v);
    assert!(waited < FLUSH_BATCH_US * 3 / 2, "a writer's reclaim waited {waited} us behind the paced flush");
}

/// ATTACK: shipped callers only: the background's round holds the destage lock (its batch
/// held at a backing write), the online flush (`write_back_all(0.5, ..)`, serve's pacing) is
/// already waiting for the lock, then a writer's reclaim comes to wait too. The yield keeps the
/// background from starting another batch, but a thread that waits for the lock already (here
/// the flush; it checked nothing, and a check before `lock_destage` would be passed already)
/// is woken first: does the reclaim still wait for one batch only?
/// FIXED since (`lock_destage_behind_reclaims`: the flush, woken first, finds the reclaim
/// waiting and lets it go).
/// FOUND: BUG (the claim "waits for the background batch under way, and for no other" does not
/// hold): the reclaim waited 130.2 ms of virtual time in each of 3 runs: the background's
/// 64-block batch and then one of the flush's (65 ms each). (Bounded by two: the flush's
/// pause after its batch lets the writer in. 2 x 256 blocks before d3690f3.)
#[test]
fn a_reclaim_behind_a_background_batch_and_a_queued_online_flush() {
    let h = held_rig((100, 200));
    let hold = h.dev.hold(|op, _, _| op == Op::Write);
    let bg = on_thread(&h.v, |v| v.background_tick());
    h.dev.wait_held(hold);
    let (tx, rx) = std::sync::mpsc::channel();
    let flusher = on_thread(&h.v, move |v| {
        tx.send(thread_id()).unwrap();
        v.write_back_all(0.5, |_, _| true)
    });
    wait_until_blocked(rx.recv().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    let writer = on_thread(&h.v, move |v| {
        tx.send(thread_id()).unwrap();
        let (wrote, error) = write_until_the_head_moves(v);
        assert!(error.is_none(), "{error:?}");
        wrote
    });
    wait_until_blocked(rx.recv().unwrap());
    h.dev.release(hold);
    bg.join().unwrap().unwrap();
    let wrote = writer.join().unwrap();
    flusher.join().unwrap().unwrap();
    let mut model = h.model.clone();
    wrote.iter().for_each(|&b| model[b as usize] = 2);
    check_versions(&h.v, &model, "after the flush");
    let waited = wait_us(&h.v);
    assert!(
        waited < ONE_BATCH_US * 3 / 2,
        "a writer's reclaim waited {waited} us (about {} batches of 64 blocks, 65 ms each): the background's and the queued online flush's",
        (waited + 32_500) / 65_050
    );
}

// ------------------------------------------------- attack 2: fairness under Sched

/// bandwidth.rs's rig: 16-block segments, a 4,096-block log over 16,384 backing blocks, 3,056
/// scattered dirty blocks (the head's first), one batch timed (background 64, reclaim 256),
/// the rest of the log clean: the writers' next records need reclaim at a dense head.
fn sched_volume(wm: (u16, u16), head_high: bool) -> Arc<Volume> {
    let r = rig(16, 4096, 16384, HDD, wm, None);
    let mut model = vec![0u64; 16384];
    if head_high {
        // (The head's blocks at the highest addresses: `write_back_all`, in address order,
        // reaches them last, so the writer's reclaim meets them dirty while it runs.)
        write_scattered_flushed(&r.v, &mut model, 6000, 1400, 1);
        write_scattered_flushed(&r.v, &mut model, 1024, 1400, 1);
    } else {
        write_scattered_flushed(&r.v, &mut model, 1024, 2800, 1);
    }
    write_scattered_flushed(&r.v, &mut model, 0, 256, 1);
    r.v.destage_step(256).unwrap();
    assert_eq!(r.v.status().background_batch_blocks, 64);
    let mut buf = vec![0u8; 16 * BS];
    let mut b = 10_000;
    while r.v.status().log_tail < 4096 - 64 {
        r.v.read(b * BS as u64, &mut buf).unwrap();
        b += 16;
    }
    Arc::new(r.v)
}

/// ATTACK: under the deterministic scheduler, above the high watermark (the destager:
/// `destage_oldest` + elevator) and below it (the dense pre-clean), the background thread's
/// rounds, two writers whose reclaims meet dense dirty windows, and a reader of the dirty
/// data, all at once (12 seeds each): does a writer's reclaim ever wait for more than one
/// background batch (the yield checked between batches; the `destage_oldest` / `destage_step`
/// pair in one iteration; a reclaim arriving between the check and the lock)? No deadlock, no
/// error, every read right.
/// FOUND: holds (REFUTED): the longest wait 65.1 ms above the watermark, 78.1 ms below (one
/// pre-clean batch, which takes whole windows while short of 64: up to 127 blocks), over 40
/// seeds each when written. It pins the yield: with `reclaim_waits_for_destage` made always
/// false, seed 10 waits 130.1 ms above the watermark and 157.1 ms below, two batches.
#[test]
fn sched_background_writers_and_a_reader_wait_for_one_batch_at_most() {
    let (mut worst, mut waited) = (0u64, 0u64);
    for wm in [(100, 200), (950, 990)] {
        for seed in 0..12u64 {
            let v = sched_volume(wm, false);
            let vv = Arc::clone(&v);
            Sched::run(
                seed,
                100_000_000,
                || {},
                move |sched| {
                    let bg = Arc::clone(&vv);
                    let background = sched.spawn(move || {
                        for _ in 0..12 {
                            bg.background_tick().unwrap();
                        }
                    });
                    let writers: Vec<_> = (0..2u64)
                        .map(|w| {
                            let v = Arc::clone(&vv);
                            sched.spawn(move || {
                                for r in 0..4u64 {
                                    let first = 12_000 + w * 1000 + r * 64;
                                    v.write(first * BS as u64, &stamps(first, 64, 2)).unwrap();
                                }
                                v.flush().unwrap();
                            })
                        })
                        .collect();
                    let rd = Arc::clone(&vv);
                    let reader = sched.spawn(move || {
                        let mut buf = vec![0u8; BS];
                        for k in 0..64u64 {
                            let b = 1024 + (k * 37 % 2800) * 2;
                            rd.read(b * BS as u64, &mut buf).unwrap();
                            assert_eq!(version_of(b, &buf), Some(1), "reader: block {b}");
                        }
                    });
                    for h in writers {
                        assert!(matches!(sched.join(h), Joined::Returned(())), "seed {seed} {wm:?}: writer");
                    }
                    assert!(matches!(sched.join(background), Joined::Returned(())), "seed {seed} {wm:?}: background");
                    assert!(matches!(sched.join(reader), Joined::Returned(())), "seed {seed} {wm:?}: reader");
                },
            )
            .unwrap_or_else(|_| panic!("seed {seed} {wm:?}: stuck"));
            let mut buf = vec![0u8; 64 * BS];
            for w in 0..2u64 {
                for r in 0..4u64 {
                    let first = 12_000 + w * 1000 + r * 64;
                    v.read(first * BS as u64, &mut buf).unwrap();
                    assert_eq!(buf, stamps(first, 64, 2), "seed {seed} {wm:?}: blocks {first}..");
                }
            }
            let us = wait_us(&v);
            worst = worst.max(us);
            waited += u64::from(us > ONE_BATCH_US / 2);
        }
    }
    eprintln!("longest reclaim wait {worst} us; waited for a batch in {waited} of 24 runs");
    assert!(waited >= 4, "reclaims met batches under way in {waited} runs: the test proves nothing");
    assert!(worst < 2 * ONE_BATCH_US, "a reclaim waited {worst} us: more than one background batch");
}

/// ATTACK: the same scheduler with `write_back_all` (busy share 1) running while a writer's
/// reclaim needs the destage lock (the head's dirty blocks at the highest addresses, so the
/// flush, in address order, leaves them dirty till last). `write_back_all`'s batches are
/// background batches (64 blocks) but it never checks `reclaim_waits_for_destage`
/// (writeback.rs `write_back_all`, its `for batch in pending.chunks(..)` loop).
/// FIXED since (`lock_destage_behind_reclaims`).
/// FOUND: BUG: a reclaim waited for up to 5 consecutive `write_back_all` batches (325 ms of
/// virtual time; one batch is 65 ms), for 2 or more in 8 of 12 seeds (130-325 ms).
#[test]
fn sched_write_back_all_lets_a_waiting_reclaim_go_first() {
    let (mut worst, mut several) = (0u64, 0u64);
    for seed in 0..12u64 {
        let v = sched_volume((950, 990), true);
        let vv = Arc::clone(&v);
        Sched::run(
            seed,
            100_000_000,
            || {},
            move |sched| {
                let go = Arc::new(AtomicBool::new(false));
                let (f, g) = (Arc::clone(&vv), Arc::clone(&go));
                let flusher = sched.spawn(move || {
                    f.write_back_all(1.0, |_, _| {
                        g.store(true, Ordering::SeqCst);
                        true
                    })
                    .unwrap()
                });
                let w = Arc::clone(&vv);
                let writer = sched.spawn(move || {
                    // (Once the flush's first batch is done: its next ones are under way.)
                    while !go.load(Ordering::SeqCst) {
                        let _ = w.status(); // (a lock: a scheduling point)
                    }
                    for r in 0..4u64 {
                        let first = 12_000 + r * 64;
                        w.write(first * BS as u64, &stamps(first, 64, 2)).unwrap();
                    }
                    w.flush().unwrap();
                });
                assert!(matches!(sched.join(writer), Joined::Returned(())), "seed {seed}: writer");
                assert!(matches!(sched.join(flusher), Joined::Returned(_)), "seed {seed}: flusher");
            },
        )
        .unwrap_or_else(|_| panic!("seed {seed}: stuck"));
        let mut buf = vec![0u8; 256 * BS];
        v.read(12_000 * BS as u64, &mut buf).unwrap();
        assert_eq!(buf, stamps(12_000, 256, 2), "seed {seed}");
        let us = wait_us(&v);
        worst = worst.max(us);
        several += u64::from(us >= FLUSH_BATCH_US * 3 / 2);
    }
    eprintln!("longest reclaim wait behind write_back_all {worst} us; two batches or more in {several} of 12 seeds");
    assert!(
        worst < FLUSH_BATCH_US * 3 / 2,
        "a reclaim waited {worst} us (one write_back_all batch of 256 blocks is {FLUSH_BATCH_US}); more than one in {several} of 12 seeds"
    );
}

// ------------------------------- attack 3: the pre-cleaner's dense windows at a 64 floor

/// ATTACK: `preclean` writes a window denser than its batch "a batch at a time, from its
/// start, and looks at it again; once what is left is sparse it is left to reclaim's
/// copy-forward". With the default 256-block segments a dense window holds ~248 dirty blocks
/// (records of 32 and a header): at the old floor (256) it joined a batch whole; at 64 every
/// dense window is denser than the batch. The pre-cleaner judged the window a write-back
/// (`dense_choice`, `Judge::Ahead`); does it still write it back whole, or leave part of it
/// for the writer's reclaim to copy forward (the copies stay dirty and take log room)?
/// FOUND: the trade the floor makes (now pinned, and in `DESTAGE_BACKGROUND_BATCH_MIN_BLOCKS`'s
/// comment; the next test finds the writer no slower for it): at the 64 floor one
/// background round (4 batches of 64, 256 blocks) leaves the head window with 128 of its 247
/// dirty blocks (no longer more than `copy_forward_max` = 128, so "sparse", and left alone),
/// and the writer's reclaim then copies those 128 blocks forward (a 129-block record in the
/// writer's path; the copies stay dirty and come round again). With the 256 floor
/// (`write_back_batch_bounds: Some((256, 4096))`) the same round writes back 991 blocks, 4
/// windows whole, the head window is left clean and the writer copies nothing.
#[test]
fn a_dense_window_the_pre_cleaner_begins_is_left_to_the_writers_copy() {
    let mut seen = Vec::new();
    for bounds in [Some((256, 4096)), None] {
        let r = rig(256, 4096, 16384, HDD, (950, 990), bounds);
        let mut model = vec![0u64; 16384];
        write_scattered_flushed(&r.v, &mut model, 0, 3700, 1);
        assert_eq!(r.v.destage_step(1).unwrap(), 1);
        let floor = r.v.status().background_batch_blocks;
        assert_eq!(floor, if bounds.is_some() { 256 } else { 64 });
        assert_eq!(r.v.status().write_back_batch_blocks, 256);
        let window_dirty = |v: &Volume| v.index_snapshot().iter().filter(|(_, e)| e.dirty && e.slot < 256).count();
        let before = window_dirty(&r.v);
        let (d0, c0) = (r.v.status().dirty_blocks, r.v.status().counters);
        r.v.background_tick().unwrap();
        let (precleaned, left) = (d0 - r.v.status().dirty_blocks, window_dirty(&r.v));
        write_scattered_flushed(&r.v, &mut model, 7400, 160, 2);
        let c = r.v.status().counters;
        assert!(r.v.log_window().0 >= 256, "the writer's reclaims took the head window");
        check_versions(&r.v, &model, "after the writer");
        let copied = c.copied_forward_blocks - c0.copied_forward_blocks;
        eprintln!(
            "floor {floor}: the head window had {before} dirty, the round wrote back {precleaned} and left it {left}; the writer's reclaims copied {copied}, wrote back {}",
            c.reclaim_write_backs - c0.reclaim_write_backs
        );
        seen.push((floor, before, precleaned, left, copied));
    }
    // The trade, pinned: at 256 the round writes the head window back whole; at 64 it
    // leaves it sparse (at most what a reclaim record copies), and the writer copies it.
    let (old, new) = (seen[0], seen[1]);
    assert!(old.3 == 0 && old.4 == 0, "floor 256: {old:?}");
    assert!(new.3 > 0 && new.3 <= 128 && new.4 >= new.3 as u64, "floor 64: {new:?}");
}

/// (Printed whole: `destaged` and `backing_flushes` are read through `Debug` only.)
#[allow(dead_code)]
#[derive(Debug, Clone, Copy)]
struct Lanes {
    copied: u64,
    reclaim_write_backs: u64,
    destaged: u64,
    backing_flushes: u64,
    writer_ms: u64,
    worst_burst_ms: u64,
}

/// A writer and the background as two lanes of virtual time: before each burst of the writer
/// (32 scattered blocks and a FLUSH), background rounds run until the background lane has
/// spent as much time as the writer's (an idle round: it catches up at once). Below or above
/// the watermark `wm`, from a log full of dense dirty records.
fn two_lanes(bounds: Option<(usize, usize)>, wm: (u16, u16), bursts: u64) -> Lanes {
    let r = rig(256, 4096, 16384, HDD, wm, bounds);
    let mut model = vec![0u64; 16384];
    write_scattered_flushed(&r.v, &mut model, 0, 3700, 1);
    assert_eq!(r.v.destage_step(1).unwrap(), 1);
    let (c0, f0) = (r.v.status().counters, r.backing.stats().flushes);
    let (mut writer, mut background, mut worst) = (0u64, 0u64, 0u64);
    for k in 0..bursts {
        while background < writer {
            let t = r.clock.now_ns();
            r.v.background_tick().unwrap();
            let d = r.clock.now_ns() - t;
            background = if d < 1_000_000 { writer } else { background + d };
        }
        let t = r.clock.now_ns();
        write_scattered_flushed(&r.v, &mut model, 7400 + (k * 64) % 8000, 32, 2 + k);
        let d = r.clock.now_ns() - t;
        worst = worst.max(d);
        writer += d;
    }
    check_versions(&r.v, &model, "two lanes");
    let c = r.v.status().counters;
    Lanes {
        copied: c.copied_forward_blocks - c0.copied_forward_blocks,
        reclaim_write_backs: c.reclaim_write_backs - c0.reclaim_write_backs,
        destaged: c.destaged_blocks - c0.destaged_blocks,
        backing_flushes: r.backing.stats().flushes - f0,
        writer_ms: writer / 1_000_000,
        worst_burst_ms: worst / 1_000_000,
    }
}

/// ATTACK: quantify what the 64 floor does to the writer over a longer run: does the
/// pre-cleaner, a quarter of the batch, fall behind so that writers' reclaims write back
/// (`reclaim_write_backs`) more often, and does the writer spend more virtual time (its own
/// reclaims' copies and write-backs; waits are not modelled here, see the Sched tests)?
/// The commit's floors against `write_back_batch_bounds: Some((256, 4096))`, 200 bursts.
/// FOUND: holds for the writer (REFUTED): below the watermark (95 %/99 %) the writer's lane
/// took 2,915 ms at 64 against 3,495 ms at 256, reclaim write-backs 11 against 10, longest
/// burst ~500 ms in both; above it (30 %/70 %) 3,391 against 3,487 ms, 14 against 12. The
/// cost moves elsewhere: below the watermark the writer's reclaims copied 12,174 blocks forward
/// against 7,516 (+62 %: the partly written windows of the test above; SSD writes and log
/// room), the background wrote back 7,626 blocks against 8,931, and the backing device took
/// 46 flushes against 20 (70 against 28 above the watermark).
#[test]
fn the_background_floor_over_two_lanes_of_virtual_time() {
    for wm in [(950, 990), (300, 700)] {
        let new = two_lanes(None, wm, 200);
        let old = two_lanes(Some((256, 4096)), wm, 200);
        eprintln!("watermarks {wm:?}: floor 64/256 {new:?}; floor 256/256 {old:?}");
        assert!(new.writer_ms * 100 <= old.writer_ms * 105, "{wm:?}: the writer's lane {new:?} against {old:?}");
        assert!(
            new.reclaim_write_backs <= old.reclaim_write_backs + 3,
            "{wm:?}: writers' reclaims wrote back {} times against {}",
            new.reclaim_write_backs,
            old.reclaim_write_backs
        );
        assert!(new.worst_burst_ms <= old.worst_burst_ms * 11 / 10, "{wm:?}: {new:?} against {old:?}");
    }
}

/// An HDD whose cache flush is expensive (15 ms) and whose scattered writes cost 0.4 ms:
/// a batch sized by time is as long as its flushes, 37 blocks: the floor decides.
const FLUSH_15MS: SimLatency = SimLatency { read_ns: 100_000, write_ns: 400_000, flush_ns: 15_000_000 };

/// ATTACK: the 64 floor also applies where no writer can wait: the offline `tiercache flush`
/// (volume_cmds.rs `flush_cmd`: the command opens the volume itself and calls `flush_all`),
/// and the destager's throughput above the high watermark, where write throughput is what the
/// destager drains. Each 64-block batch pays the backing flush a 256-block one paid once.
/// FIXED since: `write_back_all` keeps the 256 floor (the flush now within 10 % of it); the
/// destager's drain keeps the background's 64, the trade for writers' shorter waits.
/// FOUND: BUG (perf): on a backing device at 0.4 ms a scattered write and 15 ms a flush, an
/// offline flush of 3,000 scattered blocks takes 1,908 ms of virtual time at the 64 floor
/// against 1,381 ms at 256 (+38 %, 47 backing flushes against 12); at 1 ms and 10 ms, 3,473
/// against 3,121 ms (+11 %); at 1 ms and 1 ms (the `HDD` rig), +1 %. The destager above the
/// high watermark drains 3,000 dirty blocks to the low one in 1,654 ms against 1,279 ms
/// (+29 %: a quarter less write throughput wherever writes outrun it).
#[test]
fn perf_a_flush_no_writer_waits_for_pays_the_background_floor() {
    let mut times = Vec::new();
    for bounds in [None, Some((256, 4096))] {
        let r = rig(256, 4096, 16384, FLUSH_15MS, (950, 990), bounds);
        let mut model = vec![0u64; 16384];
        write_scattered_flushed(&r.v, &mut model, 0, 1500, 1);
        r.v.flush_all(|_, _| {}).unwrap();
        write_scattered_flushed(&r.v, &mut model, 1, 3000, 2);
        let (t0, f0) = (r.clock.now_ns(), r.backing.stats().flushes);
        r.v.flush_all(|_, _| {}).unwrap();
        let (ms, flushes) = ((r.clock.now_ns() - t0) / 1_000_000, r.backing.stats().flushes - f0);
        check_versions(&r.v, &model, "after the flush");
        // The destager above the high watermark: 3,000 dirty blocks, watermarks 10 %/20 %.
        let d = rig(256, 4096, 16384, FLUSH_15MS, (100, 200), bounds);
        let mut dm = vec![0u64; 16384];
        write_scattered_flushed(&d.v, &mut dm, 0, 3000, 1);
        assert_eq!(d.v.destage_step(1).unwrap(), 1);
        let t1 = d.clock.now_ns();
        for _ in 0..200 {
            d.v.background_tick().unwrap();
            if d.v.status().dirty_blocks <= 410 {
                break;
            }
        }
        let drain_ms = (d.clock.now_ns() - t1) / 1_000_000;
        eprintln!(
            "background floor {}: offline flush of 3000 blocks {ms} ms, {flushes} backing flushes; destager drain to the low watermark {drain_ms} ms",
            r.v.status().background_batch_blocks
        );
        times.push((ms, flushes, drain_ms));
    }
    let ((new, nf, nd), (old, of, od)) = (times[0], times[1]);
    assert!(
        new * 100 <= old * 110,
        "an offline flush took {new} ms ({nf} backing flushes) at the 64 floor against {old} ms ({of}) at 256; the destager drained in {nd} against {od} ms"
    );
}

// --------------------------------- attack 4: failing backing writes while a reclaim waits

/// ATTACK: the background's batch fails at its (held) backing write while a writer's reclaim
/// waits for the destage lock (the failure once; then for good, the device gone until its
/// faults are cleared). The error path of the batch the reclaim waits for: is the destage lock
/// let go, `reclaims_at_destage` back to 0 (else the background would never write back
/// again), the writer's own write-back right (it succeeds, or fails with an error, never
/// hangs), and is every flushed version there, before and after a power cut?
/// FOUND: holds (REFUTED): the round returns the backing error; once, the writer's reclaim then
/// writes the window back itself and goes on; for good, its write fails with the backing
/// error at once. Either way the next background round writes back (836 -> 586 and 912 -> 586
/// dirty blocks: the counter was not left above 0), and every flushed version reads back,
/// before and after a power cut.
#[test]
fn a_backing_write_failing_in_the_batch_a_reclaim_waits_for() {
    for mode in [FailMode::Once, FailMode::Forever] {
        let h = held_rig((100, 200));
        let backing = Arc::clone(&h.backing);
        let (bg, wrote, error) = behind_a_held(
            &h,
            |v| v.background_tick(),
            move || {
                backing.fail_after(Some(OpKind::Write), 0, mode);
            },
        );
        assert!(matches!(bg, Err(EngineError::Device { .. })), "{mode:?}: the round reports the backing error: {bg:?}");
        match (mode, &error) {
            (FailMode::Once, None) | (FailMode::Forever, Some(EngineError::Device { .. })) => {}
            _ => panic!("{mode:?}: the writer wrote {} blocks, then {error:?}", wrote.len()),
        }
        let mut model = h.model.clone();
        wrote.iter().for_each(|&b| model[b as usize] = 2);
        h.backing.clear_faults();
        // (Flushed before the failure: FLUSH's answers. The writer's last block, written but
        // not flushed, may read either version.)
        let (d0, t0) = (h.v.status().dirty_blocks, h.clock.now_ns());
        h.v.background_tick().unwrap();
        let d1 = h.v.status().dirty_blocks;
        assert!(d1 + 64 <= d0, "{mode:?}: the background wrote back after the failure: {d0} -> {d1} dirty");
        assert!(h.clock.now_ns() > t0);
        check_recovered(&h.v, &model, 2, &format!("{mode:?}: after the failure"));
        let recovered = open(durable_copy(&h.cache), durable_copy(&h.backing));
        check_recovered(&recovered, &model, 2, &format!("{mode:?}: after a power cut"));
    }
}

/// A backing device whose next write panics once armed (a driver bug: the worst way a
/// backing write can fail).
struct Panicky {
    inner: Arc<SimDevice>,
    armed: AtomicBool,
}

impl BlockDevice for Panicky {
    forward_to_inner!(inner: size_bytes, logical_block_size, read_at, flush, discard);
    fn write_at(&self, offset: u64, buf: &[u8]) -> tiercache_device::Result<()> {
        if self.armed.swap(false, Ordering::SeqCst) {
            panic!("the backing device's driver panicked (injected)");
        }
        self.inner.write_at(offset, buf)
    }
    fn describe(&self) -> String {
        "panicky".into()
    }
}

/// ATTACK: `lock_destage_for_reclaim` increments `reclaims_at_destage`, takes the lock, then
/// decrements: no guard. Can the count leak above 0 and silence the background for good while
/// writers go on (dirty data past the high watermark, backpressure for ever)? `lock_destage`
/// never returns early (no `Result`); it panics on a poisoned destage lock (a write-back that
/// panicked), a poisoned write-around lock, or a lock-order violation. Here a background batch
/// panics in its backing write (poisoning the destage lock), then a writer's reclaim meets a
/// dense window.
/// FIXED since: the count is a guard (`Waiting`), counted down on the panic too; the round
/// after it panics on the poisoned lock again, as before d3690f3.
/// FOUND: the counter does leak (the reclaim panics inside `lock_destage` with the count at 1;
/// the background's rounds then return Ok(()) and write nothing back, where they panicked on
/// the poisoned lock before this commit: a silent background, low severity). Not a starvation
/// of a working volume (REFUTED): the only caller holds the io lock, which the panic poisons,
/// so every FLUSH after it panics, no write becomes durable, and the dirty count cannot grow.
#[test]
fn a_reclaim_panicking_at_the_destage_lock_cannot_starve_a_working_volume() {
    let clock = SimClock::new();
    let (cache, backing) = devices_on_clock(16, 1024, 4096, &clock, FAST, HDD);
    let p = Arc::new(Panicky { inner: backing, armed: AtomicBool::new(false) });
    let v = open_on(&cache, p.clone(), &clock, options((100, 200), None));
    let mut model = vec![0u64; 4096];
    write_scattered_flushed(&v, &mut model, 0, 840, 1);
    v.destage_step(1).unwrap();
    p.armed.store(true, Ordering::SeqCst);
    assert!(catch_unwind(AssertUnwindSafe(|| v.background_tick())).is_err(), "the batch panicked");
    let writer = catch_unwind(AssertUnwindSafe(|| write_until_the_head_moves(&v)));
    assert!(writer.is_err(), "the writer's reclaim panicked at the poisoned destage lock");
    let dirty = v.status().dirty_blocks;
    let tick = catch_unwind(AssertUnwindSafe(|| v.background_tick()));
    eprintln!(
        "the background round after the reclaim's panic: {}",
        match &tick {
            Ok(Ok(())) => "Ok(()), nothing written back (the leaked count)".to_string(),
            Ok(Err(e)) => format!("Err({e})"),
            Err(_) => "panicked".to_string(),
        }
    );
    assert!(tick.is_err(), "the count went back down: the round took the (poisoned) lock, as before the count");
    for k in 0..8u64 {
        let blk = 3000 + k;
        let r = catch_unwind(AssertUnwindSafe(|| v.write(blk * BS as u64, &stamp(blk, 3)).and_then(|()| v.flush())));
        assert!(!matches!(r, Ok(Ok(()))), "a write became durable on a volume whose background is silenced");
        let _ = catch_unwind(AssertUnwindSafe(|| v.background_tick()));
    }
    assert!(v.status().dirty_blocks <= dirty + 8, "dirty data grew");
}

// --------------------------------------------------------- attack 5: power cuts

/// The crash workload, from a log of 1,850 dense dirty blocks (0..3700, 2,048-block log in
/// 256-block segments, watermarks 95 %/99 %): time one write-back (background batches of 64,
/// reclaim's of 256), then 800 scattered writes (4000.., version 2) with a background round
/// every 100 from the 200th: 64-block pre-clean batches that leave windows part clean, the
/// writer's reclaims copying those forward and writing a dense window back with the segments
/// ahead (256). Stops at the first error (the injected failure).
fn crash_workload(v: &Volume, model: &mut [u64]) -> Result<(), EngineError> {
    v.destage_step(1)?;
    for k in 0..800u64 {
        let b = 4000 + 2 * k;
        v.write(b * BS as u64, &stamp(b, 2))?;
        if k % 32 == 31 {
            v.flush()?;
            for j in k - 31..=k {
                model[(4000 + 2 * j) as usize] = 2;
            }
        }
        if k >= 200 && k % 100 == 99 {
            v.background_tick()?;
        }
    }
    Ok(())
}

/// ATTACK: a power cut at every cache I/O, at every backing flush and at every 16th backing
/// I/O (the failing device fails for good from there; both then lose or tear what was not
/// flushed) while 64-block background batches and 256-block reclaim write-backs interleave
/// with reclaim's copies of the windows the pre-cleaner left part written: after recovery
/// every flushed version reads back (none older, none garbage).
/// FOUND: holds (REFUTED) at all 201 cuts (the full run: 107 cache and 1,278 backing I/Os;
/// 12 background batches of 64, 1 reclaim write-back of ~495 blocks, 384 blocks copied
/// forward from part-written windows).
#[test]
fn power_cut_at_every_io_with_background_and_reclaim_batches() {
    const BLOCKS: u64 = 5700;
    let o = options((950, 990), None);
    let (cache_img, backing_img, base) = {
        let r = rig(256, 2048, BLOCKS, HDD, (950, 990), None);
        let mut model = vec![0u64; BLOCKS as usize];
        write_scattered_flushed(&r.v, &mut model, 0, 1850, 1);
        r.v.flush().unwrap();
        (r.cache.durable_image(), r.backing.durable_image(), model)
    };
    let fresh = || {
        let clock = SimClock::new();
        let (c, b) = devices_from_images_on_clock(cache_img.clone(), backing_img.clone(), &clock, FAST, HDD);
        let v = open_on(&c, b.clone(), &clock, o);
        (c, b, v)
    };
    let (c, b, v) = fresh();
    let (c0, b0, k0) = (c.stats(), b.stats(), v.status().counters);
    let mut m = base.clone();
    crash_workload(&v, &mut m).unwrap();
    let k = v.status().counters;
    let (cache_ops, backing_ops) = (total_ops(c.stats()) - total_ops(c0), total_ops(b.stats()) - total_ops(b0));
    let backing_flushes = b.stats().flushes - b0.flushes;
    let (wbs, copied) =
        (k.reclaim_write_backs - k0.reclaim_write_backs, k.copied_forward_blocks - k0.copied_forward_blocks);
    eprintln!(
        "full run: {cache_ops} cache I/Os, {backing_ops} backing I/Os ({backing_flushes} flushes); {wbs} reclaim write-backs, {copied} blocks copied forward, {} written back",
        k.destaged_blocks - k0.destaged_blocks
    );
    assert!(wbs >= 1 && copied > 0 && backing_flushes >= 6, "the interleaving happened");
    drop(v);
    let mut cuts: Vec<(bool, Option<OpKind>, u64)> = (0..cache_ops).map(|n| (true, None, n)).collect();
    cuts.extend((0..backing_flushes).map(|n| (false, Some(OpKind::Flush), n)));
    cuts.extend((0..backing_ops).step_by(16).map(|n| (false, None, n)));
    let runs = cuts.len();
    for (failing_cache, kind, n) in cuts {
        let what = format!("cut at {} {kind:?} I/O {n}", if failing_cache { "cache" } else { "backing" });
        let (c, b, v) = fresh();
        (if failing_cache { &c } else { &b }).fail_after(kind, n, FailMode::Forever);
        let mut model = base.clone();
        let _ = crash_workload(&v, &mut model);
        drop(v);
        c.clear_faults();
        b.clear_faults();
        c.crash(n);
        b.crash(n.wrapping_mul(7919));
        let v = open_on(&c, b.clone(), &SimClock::new(), o);
        check_recovered(&v, &model, 2, &what);
    }
    eprintln!("{runs} power cuts");
    assert!(runs > 150, "{runs} power cuts");
}
