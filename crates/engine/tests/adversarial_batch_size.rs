//! Adversarial review of commit 49ec301: write-back batches sized by time
//! (`ReclaimCosts::write_back_batch_blocks`: about `DESTAGE_BATCH_MS` = 25 ms at the measured
//! cost per block, clamped to 256..=4096, 1024 until timed), used by the background
//! destager/pre-cleaner, by reclaim's own write-back (window + whole segments ahead while they
//! fit) and by `write_back_all`; and the `reclaim_destage_wait_max_us` counter.
//!
//! Rigs: a fast cache and a backing device on one virtual clock (`SimLatency`), so every
//! measured cost, and so every batch size, is exact. "Dense" logs are records of 32 scattered
//! dirty blocks and a header (each block its own backing write), so reclaim's windows are 97 %
//! dirty and `dense_choice` writes them back (the lap ahead is too dirty to copy through).
//! `status().write_back_batch_blocks` shows the batch size.
//!
//! Since then the background's batches (the pre-cleaner's, the destager's) have a floor of
//! their own, 64 (`DESTAGE_BACKGROUND_BATCH_MIN_BLOCKS`,
//! `status().background_batch_blocks`); a writer's reclaim batch keeps 256. The attacks below
//! on the background's batches assert the lower floor.
//!
//! Each test's doc comment says what it attacks and what it found. Tests whose name starts
//! with `perf_` failed on 49ec301 (performance findings, fixed since: the batch's fixed cost,
//! its flushes, is timed apart from its cost per block, which is weighted by blocks; reclaim's
//! segments ahead have a batch's allowance of their own; the dense pre-clean holds the batch
//! size, a window denser than a batch written back a batch at a time).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tiercache_device::{BlockDevice, Clock, FailMode, SimClock, SimDevice, SimLatency};
use tiercache_engine::{Counters, EngineError, Volume, VolumeOptions};

mod common;
use common::*;

// ------------------------------------------------------------------------------------ rigs

/// 1 ms a backing write (a scattered block on an HDD), 1 ms a backing flush: measured at about
/// 1 ms a block, so batches sit at the floor of 256.
const HDD: SimLatency = SimLatency { read_ns: 100_000, write_ns: 1_000_000, flush_ns: 1_000_000 };

struct Rig {
    clock: SimClock,
    cache: Arc<SimDevice>,
    backing: Arc<SimDevice>,
    v: Volume,
}

fn rig(seg: u32, log_blocks: u64, backing_blocks: u64, backing: SimLatency, wm: Option<(u16, u16)>) -> Rig {
    let clock = SimClock::new();
    let (cache, backing) = devices_on_clock(seg, log_blocks, backing_blocks, &clock, FAST, backing);
    let v = open_rig(&cache, &backing, Arc::new(clock.clone()), wm);
    Rig { clock, cache, backing, v }
}

fn open_rig(cache: &Arc<SimDevice>, backing: &Arc<SimDevice>, clock: Arc<dyn Clock>, wm: Option<(u16, u16)>) -> Volume {
    let c: Arc<dyn BlockDevice> = cache.clone();
    let b: Arc<dyn BlockDevice> = backing.clone();
    let options =
        VolumeOptions { dirty_watermarks_permille: wm, sequential_bypass_bytes: 0, ..VolumeOptions::default() };
    Volume::open(c, b, clock, options).expect("open").0
}

/// The batch size `write_back_batch_blocks` picks now (`status` shows it).
fn batch_now(v: &Volume) -> usize {
    v.status().write_back_batch_blocks as usize
}

/// The dense-log rig used by several tests: 512-block segments (a window holds about 496
/// dirty blocks: more than the 256-block floor, and than `copy_forward_max` = 168), a 4096-block
/// log, 12288 backing blocks, watermarks high enough (95 %/99 %) that the log stays below them
/// (the dense choice, not the watermark, makes reclaim write back).
const SEG: u32 = 512;
const LOG: u64 = 4096;
const BACKING: u64 = 12288;

/// Fills the log with dense dirty records (3700 scattered blocks from 0), then times one
/// write-back of one block (1 ms write + 1 ms flush: about 2 ms a block): the batch is at the
/// floor.
fn dense_log_at_the_floor(r: &Rig, model: &mut [u64]) {
    write_scattered_flushed(&r.v, model, 0, 3700, 1);
    assert_eq!(r.v.destage_step(1).unwrap(), 1);
    assert_eq!(batch_now(&r.v), 256, "timed at {:?} us a block", r.v.status().reclaim_write_back_us_per_block);
}

// --------------------------------------------------------- attack 1: reclaim at the floor

/// ATTACK: reclaim meets windows whose dirty blocks (~496) exceed the batch size (the 256
/// floor). Does it write back the whole window (not just a batch's worth), free it, never
/// report WriteBackStuck, and keep every version?
/// FOUND: holds (REFUTED). Every reclaim write-back covers its whole window; the head moves
/// past every dense window; all 5,700 blocks read back. (It also shows the performance cost
/// pinned by `perf_reclaim_at_the_floor_writes_back_one_segment_per_backing_flush`: no
/// segment ahead ever joins, so one backing flush per window.)
#[test]
fn reclaim_writes_back_a_window_dirtier_than_the_floor_batch() {
    let r = rig(SEG, LOG, BACKING, HDD, Some((950, 990)));
    let mut model = vec![0u64; BACKING as usize];
    dense_log_at_the_floor(&r, &mut model);
    let head0 = r.v.status().log_head;
    let before = r.v.status().counters;
    write_scattered_flushed(&r.v, &mut model, 7400, 2000, 1);
    let after = r.v.status();
    let wbs = after.counters.reclaim_write_backs - before.reclaim_write_backs;
    assert!(wbs >= 3, "reclaims wrote dense windows back: {wbs}");
    assert!(after.log_head >= head0 + 3 * u64::from(SEG), "the head passed the dense windows");
    assert_eq!(batch_now(&r.v), 256, "still at the floor");
    check_versions(&r.v, &model, "after reclaims at the floor");
    r.v.flush_all(|_, _| {}).unwrap();
    assert_eq!(r.v.status().dirty_blocks, 0);
    let mut buf = vec![0u8; BS];
    for (b, v) in model.iter().enumerate() {
        r.backing.read_at(b as u64 * BS as u64, &mut buf).unwrap();
        assert_eq!(version_of(b as u64, &buf), Some(*v), "backing block {b}");
    }
}

// ------------------------------------------------------------- attack 2: pathological clocks

/// A clock that never moves: every write-back costs 0 ns (batch 4,096).
struct Frozen;
impl Clock for Frozen {
    fn now_ns(&self) -> u64 {
        7
    }
}

/// A clock that runs backwards by about a second each reading (saturating_sub: cost 0).
struct Backwards(AtomicU64);
impl Clock for Backwards {
    fn now_ns(&self) -> u64 {
        self.0.fetch_sub(1_000_000_007, Ordering::Relaxed)
    }
}

/// A clock that leaps about 18 minutes each reading (cost per block enormous: the floor; the
/// EWMA saturates rather than overflows).
struct Leaping(AtomicU64);
impl Clock for Leaping {
    fn now_ns(&self) -> u64 {
        self.0.fetch_add(1 << 40, Ordering::Relaxed)
    }
}

/// A clock that jumps forwards and backwards at random (xorshift), by up to ~1 s.
struct Jitter(AtomicU64, AtomicU64);
impl Clock for Jitter {
    fn now_ns(&self) -> u64 {
        let mut x = self.1.load(Ordering::Relaxed);
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        self.1.store(x, Ordering::Relaxed);
        let step = (x % 2_000_000_000) as i64 - 1_000_000_000;
        let now = self.0.load(Ordering::Relaxed) as i64 + step;
        let now = now.max(0) as u64;
        self.0.store(now, Ordering::Relaxed);
        now
    }
}

/// ATTACK: batch sizes from clocks that stop, run backwards, leap by 2^40 ns per reading, or
/// jitter both ways (ns = 0 -> 4,096; huge ns -> 256; the EWMA's saturating arithmetic), under
/// the dense-log workload (reclaim write-backs of windows larger than the batch), background
/// rounds and a full flush. Must not panic, loop, return WriteBackStuck or lose a version.
/// FOUND: holds (REFUTED) for all four clocks.
#[test]
fn pathological_clocks_size_batches_safely() {
    let clocks: Vec<(&str, Arc<dyn Clock>, usize)> = vec![
        ("frozen", Arc::new(Frozen), 4096),
        ("backwards", Arc::new(Backwards(AtomicU64::new(u64::MAX / 2))), 4096),
        ("leaping", Arc::new(Leaping(AtomicU64::new(0))), 256),
        ("jitter", Arc::new(Jitter(AtomicU64::new(1 << 50), AtomicU64::new(0x9E37_79B9_7F4A_7C15))), 0),
    ];
    for (name, clock, expect_batch) in clocks {
        let sim = SimClock::new();
        let (cache, backing) = devices_on_clock(SEG, LOG, BACKING, &sim, FAST, HDD);
        let v = open_rig(&cache, &backing, clock, Some((950, 990)));
        let mut model = vec![0u64; BACKING as usize];
        write_scattered_flushed(&v, &mut model, 0, 3700, 1);
        assert_eq!(v.destage_step(1).unwrap(), 1);
        if expect_batch != 0 {
            assert_eq!(batch_now(&v), expect_batch, "{name}");
        }
        let before = v.status().counters.reclaim_write_backs;
        for round in 0..4u64 {
            write_scattered_flushed(&v, &mut model, 7400 + round * 1000, 500, 2);
            v.background_tick().unwrap();
        }
        assert!(v.status().counters.reclaim_write_backs + v.status().counters.destaged_blocks > before, "{name}");
        check_versions(&v, &model, name);
        v.write_back_all(0.5, |_, _| true).unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_eq!(v.status().dirty_blocks, 0, "{name}");
        check_versions(&v, &model, name);
    }
}

// ------------------------------------------------- attack 3: write_back_all at the floor

/// ATTACK: the online flush (`write_back_all`) with batches at the 256 floor and busy_share
/// pacing (0.25): more, smaller batches, each paying a backing flush; does it still finish,
/// report monotonic progress ending at (total, 0), and leave everything clean on the backing
/// device? Also: one batch per `write_back_batch_blocks()` worth, never larger.
/// FOUND: holds (REFUTED): 3,700 blocks in 15 batches of <= 256.
#[test]
fn write_back_all_at_the_floor_with_pacing_finishes() {
    let r = rig(SEG, LOG, BACKING, HDD, Some((950, 990)));
    let mut model = vec![0u64; BACKING as usize];
    dense_log_at_the_floor(&r, &mut model);
    let dirty = r.v.status().dirty_blocks;
    let flushes = r.backing.stats().flushes;
    let mut seen: Vec<(u64, u64)> = Vec::new();
    let done =
        r.v.write_back_all(0.25, |d, rem| {
            seen.push((d, rem));
            true
        })
        .unwrap();
    assert_eq!(done, dirty);
    assert_eq!(seen.last(), Some(&(dirty, 0)));
    assert!(seen.windows(2).all(|w| w[0].0 <= w[1].0), "progress is monotonic: {seen:?}");
    let batches = r.backing.stats().flushes - flushes;
    // (write_back_all keeps a writer's reclaim's floor, 256, not the background's 64.)
    assert_eq!(batches, dirty.div_ceil(256), "one backing flush per 256-block batch");
    assert_eq!(r.v.status().dirty_blocks, 0);
    check_versions(&r.v, &model, "after the flush");
    for (b, v) in model.iter().enumerate() {
        let mut buf = vec![0u8; BS];
        r.backing.read_at(b as u64 * BS as u64, &mut buf).unwrap();
        assert_eq!(version_of(b as u64, &buf), Some(*v), "backing block {b}");
    }
}

// ------------------------------------------- attack 4: dense pre-clean with max < window

/// ATTACK: the dense-window pre-clean (`preclean(batch, dense_only=true)` from the background
/// round below the watermark) with a batch (256) smaller than one window's dirty blocks (~496):
/// does it still write the whole window back (a partial window would leave reclaim a part-clean
/// window to copy), advance `precleaned_until`, and keep the writer from writing back itself?
/// FOUND: holds (REFUTED) on 49ec301, where each pre-clean took one whole window (~496
/// blocks, above the batch). Since then (the review's fourth finding) a window denser than a
/// batch is written back a batch at a time, from its start: every batch holds the size, and
/// still, with a background round before each 160-block write burst, the writer's reclaims
/// meet clean windows (no reclaim write-back at all).
#[test]
fn dense_preclean_takes_whole_windows_larger_than_the_batch() {
    let r = rig(SEG, LOG, BACKING, HDD, Some((950, 990)));
    let mut model = vec![0u64; BACKING as usize];
    dense_log_at_the_floor(&r, &mut model);
    let (d0, f0) = (r.v.status().dirty_blocks, r.backing.stats().flushes);
    r.v.background_tick().unwrap();
    let (d1, batches) = (r.v.status().dirty_blocks, r.backing.stats().flushes - f0);
    // (The background's batches: at their own floor, 64, since DESTAGE_BACKGROUND_BATCH_MIN_BLOCKS.)
    let batch = r.v.status().background_batch_blocks;
    assert_eq!(batch, 64);
    assert!(d0 - d1 > batch, "a pre-clean round went on past one batch: {} blocks", d0 - d1);
    assert!(d0 - d1 <= batch * batches, "{} blocks in {batches} batches of at most {batch}", d0 - d1);
    let before = r.v.status().counters.reclaim_write_backs;
    for round in 0..10u64 {
        write_scattered_flushed(&r.v, &mut model, 7400 + round * 320, 160, 2);
        r.v.background_tick().unwrap();
    }
    assert_eq!(r.v.status().counters.reclaim_write_backs, before, "the pre-cleaner kept ahead of the writer");
    check_versions(&r.v, &model, "after pre-clean");
}

// ------------------------------------------------------ attack 5: power cuts at every I/O

/// The crash workload, from the durable images of a dense log: reopen (untimed), time a
/// one-block write-back (floor), then write 1,200 new scattered blocks (reclaim writes back
/// dense windows of ~496 > 256 blocks), a background round every 320. Returns the flushed
/// model; stops at the first error (the injected failure).
fn crash_workload(v: &Volume, model: &mut [u64]) -> Result<(), EngineError> {
    v.destage_step(1)?;
    for k in 0..1200u64 {
        let b = 7400 + 2 * k;
        v.write(b * BS as u64, &stamp(b, 2))?;
        if k % 32 == 31 {
            v.flush()?;
            for j in k - 31..=k {
                model[(7400 + 2 * j) as usize] = 2;
            }
        }
        if k % 320 == 319 {
            v.background_tick()?;
        }
    }
    Ok(())
}

/// ATTACK: power cut at every I/O (every cache I/O; every 5th backing I/O and every backing
/// flush, of ~3,000) while reclaim writes back windows larger than the floor batch and the
/// pre-cleaner runs: after recovery every flushed version must read back (none older, none
/// garbage), the first write-back batches after the reopen being untimed (1,024) and then at
/// the floor.
/// FOUND: holds (REFUTED).
#[test]
fn power_cut_at_every_io_during_floor_sized_write_backs() {
    let (cache_img, backing_img, base_model) = {
        let r = rig(SEG, LOG, BACKING, HDD, Some((950, 990)));
        let mut model = vec![0u64; BACKING as usize];
        write_scattered_flushed(&r.v, &mut model, 0, 3700, 1);
        r.v.flush().unwrap();
        (r.cache.durable_image(), r.backing.durable_image(), model)
    };
    let fresh = || {
        let clock = SimClock::new();
        let (c, b) = devices_from_images_on_clock(cache_img.clone(), backing_img.clone(), &clock, FAST, HDD);
        let v = open_rig(&c, &b, Arc::new(clock), Some((950, 990)));
        (c, b, v)
    };
    // The I/O counts of a full run.
    let (c, b, v) = fresh();
    let (c0, b0) = (c.stats(), b.stats());
    let mut m = base_model.clone();
    crash_workload(&v, &mut m).unwrap();
    assert!(v.status().counters.reclaim_write_backs >= 1, "reclaim wrote back windows: {:?}", v.status().counters);
    let total = |s: tiercache_device::SimStats| s.reads + s.writes + s.flushes + s.fua_writes;
    let cache_ops = total(c.stats()) - total(c0);
    let backing_ops = total(b.stats()) - total(b0);
    drop(v);
    let mut runs = 0;
    for failing_cache in [true, false] {
        let ops = if failing_cache { cache_ops } else { backing_ops };
        for n in 0..ops {
            if !failing_cache && n % 5 != 0 && n % 257 > 2 {
                // (Backing: every 5th I/O, and the ones around each flush of a 256-block batch.)
                continue;
            }
            let (c, b, v) = fresh();
            let failing = if failing_cache { &c } else { &b };
            failing.fail_after(None, n, FailMode::Forever);
            let mut model = base_model.clone();
            let _ = crash_workload(&v, &mut model);
            drop(v);
            c.clear_faults();
            b.clear_faults();
            c.crash(n);
            b.crash(n.wrapping_mul(7919));
            let clock = SimClock::new();
            let v = open_rig(&c, &b, Arc::new(clock), None);
            let mut buf = vec![0u8; BS];
            for block in (0..BACKING).filter(|b| b % 2 == 0) {
                v.read(block * BS as u64, &mut buf)
                    .unwrap_or_else(|e| panic!("cache {failing_cache} I/O {n}: block {block}: {e}"));
                let got = version_of(block, &buf)
                    .unwrap_or_else(|| panic!("cache {failing_cache} I/O {n}: block {block}: garbage"));
                let want = model[block as usize];
                assert!(
                    got >= want && got <= want.max(2),
                    "cache {failing_cache} I/O {n}: block {block} reads {got}, {want} was flushed"
                );
                if block < 7400 {
                    assert_eq!(got, 1, "cache {failing_cache} I/O {n}: block {block}");
                }
            }
            runs += 1;
        }
    }
    // (About 390 since the background's batches are 64 blocks: its four a round write back
    // a quarter of what they did, and the workload does fewer I/Os.)
    assert!(runs > 350, "{runs} power cuts");
}

// ----------------------------------------------------- attack 6: concurrency (Sched)

/// ATTACK: under the deterministic scheduler (16 seeds x 2 watermark settings: below the
/// watermark, dense pre-clean; above it, destage_oldest + elevator), a writer whose reclaims
/// write back dense windows larger than the floor batch, the background thread's rounds, an
/// online flush (`write_back_all`, paced) and a reader of the already-written blocks, all at
/// once: no deadlock, no WriteBackStuck, no wrong read, everything clean and correct after,
/// and a reclaim never waits for more than one batch.
/// FOUND: holds (REFUTED): 48 reclaim write-backs over 32 runs, longest destage-lock wait
/// 20 us of virtual time. (The seeds rarely land a reclaim behind a running batch here; the
/// commit's own `a_writers_reclaim_waits_for_a_batch_sized_by_time` covers that wait.)
#[test]
fn writers_background_flush_and_readers_at_once_at_the_floor() {
    let (mut reclaim_wbs, mut worst_wait_us, mut runs) = (0, 0, 0);
    for (seed, wm) in (0..16u64).flat_map(|s| [(s, (950, 990)), (s, (100, 200))]) {
        runs += 1;
        let r = rig(SEG, LOG, BACKING, HDD, Some(wm));
        let seed_wm = format!("{seed} {wm:?}");
        let mut model = vec![0u64; BACKING as usize];
        dense_log_at_the_floor(&r, &mut model);
        let v = Arc::new(r.v);
        let base = model.clone();
        let written = tiercache_sched::Sched::run(
            seed,
            200_000_000,
            || {},
            |sched| {
                let started = Arc::new(std::sync::atomic::AtomicBool::new(false));
                let go = Arc::clone(&started);
                let w = Arc::clone(&v);
                let writer = sched.spawn(move || {
                    let mut m = vec![0u64; BACKING as usize];
                    // (The flush starts once the writer's reclaims have met the dense head.)
                    write_scattered_flushed(&w, &mut m, 7400, 200, 2);
                    go.store(true, Ordering::SeqCst);
                    write_scattered_flushed(&w, &mut m, 7800, 1000, 2);
                    m
                });
                let bg = Arc::clone(&v);
                let bg_go = Arc::clone(&started);
                let background = sched.spawn(move || {
                    while !bg_go.load(Ordering::SeqCst) {
                        let _ = bg.status();
                    }
                    for _ in 0..6 {
                        bg.background_tick().unwrap();
                    }
                });
                let f = Arc::clone(&v);
                let flusher = sched.spawn(move || {
                    while !started.load(Ordering::SeqCst) {
                        let _ = f.status(); // (a lock: a scheduling point)
                    }
                    f.write_back_all(0.5, |_, _| true).unwrap()
                });
                let rd = Arc::clone(&v);
                let reader = sched.spawn(move || {
                    let mut buf = vec![0u8; BS];
                    for k in 0..200u64 {
                        let b = (k * 37 % 3700) * 2;
                        rd.read(b * BS as u64, &mut buf).unwrap();
                        assert_eq!(version_of(b, &buf), Some(base[b as usize]), "reader: block {b}");
                    }
                });
                let m = match sched.join(writer) {
                    tiercache_sched::Joined::Returned(m) => m,
                    other => panic!("seed {seed_wm}: writer {:?}", matches!(other, tiercache_sched::Joined::Stuck)),
                };
                for (name, j) in [("background", sched.join(background)), ("reader", sched.join(reader))] {
                    assert!(matches!(j, tiercache_sched::Joined::Returned(())), "seed {seed_wm}: {name}");
                }
                assert!(matches!(sched.join(flusher), tiercache_sched::Joined::Returned(_)), "seed {seed_wm}: flusher");
                m
            },
        )
        .unwrap_or_else(|_| panic!("seed {seed_wm}: stuck"));
        for (b, &ver) in written.iter().enumerate() {
            if ver != 0 {
                model[b] = ver;
            }
        }
        check_versions(&v, &model, &format!("seed {seed_wm}"));
        let c = v.status().counters;
        reclaim_wbs += c.reclaim_write_backs;
        worst_wait_us = worst_wait_us.max(c.reclaim_destage_wait_max_us);
        v.flush_all(|_, _| {}).unwrap();
        assert_eq!(v.status().dirty_blocks, 0);
    }
    eprintln!("{reclaim_wbs} reclaim write-backs over {runs} runs; longest reclaim wait for the destage lock {worst_wait_us} us");
    assert!(reclaim_wbs > runs, "reclaims wrote windows back while the others ran");
    // One batch under way at most (256 blocks at ~1 ms, its flush, and the cache I/O of the
    // others meanwhile), never two.
    assert!(worst_wait_us < 2 * 256_000, "a reclaim waited {worst_wait_us} us for the destage lock");
}

// ----------------------------------------------------- attack 7: the status counter

/// ATTACK: `Counters` from an older engine (no `reclaim_destage_wait_max_us` field) must still
/// deserialize (`#[serde(default)]`); the new field must not be required. Found by asking
/// serde's own derive which fields it requires (no serde_json in this crate's dev-deps).
/// FOUND: holds (REFUTED): the field is optional, defaults to 0.
#[test]
fn counters_without_the_new_field_deserialize() {
    use serde::de::value::{Error, MapDeserializer};
    use serde::Deserialize;
    let mut fields: Vec<String> = Vec::new();
    loop {
        let map = fields.iter().map(|f| (f.as_str(), 0u64));
        let de: MapDeserializer<'_, _, Error> = MapDeserializer::new(map);
        match Counters::deserialize(de) {
            Ok(c) => {
                assert_eq!(c.reclaim_destage_wait_max_us, 0);
                break;
            }
            Err(e) => {
                let msg = e.to_string();
                let name = msg.split('`').nth(1).unwrap_or_else(|| panic!("{msg}")).to_string();
                assert_ne!(name, "reclaim_destage_wait_max_us", "the new counter is required: {msg}");
                assert!(!fields.contains(&name), "{msg}");
                fields.push(name);
            }
        }
    }
}

/// ATTACK: the counter's meaning on the volume's (virtual) clock. With no other thread, a
/// reclaim never waits for the destage lock: the counter must stay 0 even though the reclaim's
/// own write-back takes ~500 ms of virtual time (it must time the wait, not the write-back).
/// FOUND: holds (REFUTED).
#[test]
fn an_uncontended_reclaim_records_no_destage_wait() {
    let r = rig(SEG, LOG, BACKING, HDD, Some((950, 990)));
    let mut model = vec![0u64; BACKING as usize];
    dense_log_at_the_floor(&r, &mut model);
    let t0 = r.clock.now_ns();
    write_scattered_flushed(&r.v, &mut model, 7400, 1000, 1);
    let c = r.v.status().counters;
    assert!(c.reclaim_write_backs >= 1);
    assert!(r.clock.now_ns() - t0 > 400_000_000);
    assert_eq!(c.reclaim_destage_wait_max_us, 0, "{c:?}");
}

// ----------------------------------------------------- performance findings (FAIL)

/// Scattered-block backing device with an expensive flush and cheap writes: a RAID5 or an
/// HDD with its write cache on (flush 40 ms), writes 20 us each.
const FLUSH_HEAVY: SimLatency = SimLatency { read_ns: 100_000, write_ns: 20_000, flush_ns: 40_000_000 };

/// ATTACK: the estimator includes the per-batch fixed cost (the backing flush) in the cost
/// per block. Where one backing flush alone takes longer than the 25 ms target, no batch can
/// meet the target, yet the size settles at the 256 floor: a full flush of 4,096 scattered
/// blocks pays 14 backing flushes instead of 1, ~5x the virtual time, with no latency gain
/// (each batch still takes > 40 ms: the wait is the flush).
/// FOUND: BUG (perf). Fails on 49ec301: once settled, a flush of 4,096 scattered blocks pays 16
/// backing flushes, 723 ms virtual, where one 4,096-block batch takes 1 flush, ~125 ms (5.8x).
#[test]
fn perf_an_expensive_backing_flush_holds_batches_at_the_floor() {
    let r = rig(256, 8192, 16384, FLUSH_HEAVY, None);
    let mut model = vec![0u64; 16384];
    // Two full flushes first (the first untimed, at 1,024; the second at ~420): the estimate
    // then settles at the floor.
    for round in 0..2u64 {
        write_scattered_flushed(&r.v, &mut model, round, 4096, round + 1);
        r.v.flush_all(|_, _| {}).unwrap();
    }
    write_scattered_flushed(&r.v, &mut model, 0, 4096, 3);
    let (f0, t0) = (r.backing.stats().flushes, r.clock.now_ns());
    r.v.flush_all(|_, _| {}).unwrap();
    let (flushes, ms) = (r.backing.stats().flushes - f0, (r.clock.now_ns() - t0) / 1_000_000);
    eprintln!(
        "flush_all of 4096 scattered blocks: {flushes} backing flushes, {ms} ms virtual; batch now {}",
        batch_now(&r.v)
    );
    check_versions(&r.v, &model, "after flush");
    // Fixed 4,096-block batches: 1 flush, ~125 ms. Sized now so that a batch's writes take
    // as long as its 40 ms flush (2,000 blocks of 20 us): 3 flushes, not 16.
    assert!(flushes <= 3, "{flushes} backing flushes ({ms} ms) for 4,096 blocks");
}

/// A fast backing device with a 1 ms flush (an SSD RAID): a batch of 4,096 scattered blocks
/// takes ~9 ms, well inside the 25 ms target, so batches should stay at 4,096.
const SSD_RAID: SimLatency = SimLatency { read_ns: 20_000, write_ns: 2_000, flush_ns: 1_000_000 };

/// ATTACK: the estimate is an unweighted EWMA of per-batch ns/blocks: one tiny batch (the
/// write-back of one block: an fsync'd single write, the remainder chunk of `write_back_all`,
/// a pre-clean of a sparse head) counts as much as a 4,096-block one, and its fixed cost spread
/// over one block looks like 1 ms a block. After it, the next ~18 batches are held at the 256
/// floor on a device where 4,096 blocks take 9 ms.
/// FOUND: BUG (perf). Fails on 49ec301: a flush of 4,096 blocks right after a one-block
/// flush pays 16 backing flushes (~2.5x the virtual time) instead of 1.
#[test]
fn perf_one_tiny_write_back_shrinks_the_next_flush_to_the_floor() {
    let r = rig(256, 8192, 20000, SSD_RAID, None);
    let mut model = vec![0u64; 20000];
    // Timed on a large batch first: 4,096.
    write_scattered_flushed(&r.v, &mut model, 0, 2048, 1);
    r.v.flush_all(|_, _| {}).unwrap();
    assert_eq!(batch_now(&r.v), 4096, "a large batch timed: {:?}", r.v.status().reclaim_write_back_us_per_block);
    // One block written and flushed through (a tiny batch).
    write_scattered_flushed(&r.v, &mut model, 9001, 1, 1);
    r.v.flush_all(|_, _| {}).unwrap();
    let after_tiny = batch_now(&r.v);
    write_scattered_flushed(&r.v, &mut model, 10000, 4096, 1);
    let (f0, t0) = (r.backing.stats().flushes, r.clock.now_ns());
    r.v.flush_all(|_, _| {}).unwrap();
    let (flushes, us) = (r.backing.stats().flushes - f0, (r.clock.now_ns() - t0) / 1000);
    eprintln!("after one 1-block write-back: batch {after_tiny}; flush of 4096: {flushes} backing flushes, {us} us");
    check_versions(&r.v, &model, "after flush");
    assert!(
        flushes <= 2,
        "{flushes} backing flushes ({us} us) for 4,096 blocks (batch {after_tiny} after one tiny batch)"
    );
}

/// Scattered-block backing device at 100 us a write with a 20 ms flush: per block about 180 us
/// at 256 blocks a batch, so the batch sits at the floor.
const RAID5_HDD: SimLatency = SimLatency { read_ns: 100_000, write_ns: 100_000, flush_ns: 20_000_000 };

/// ATTACK: reclaim's own write-back adds segments ahead only while the batch takes them whole.
/// At the floor (256) with the default 256-block segments, a dense window alone (~248 dirty)
/// fills the batch: no segment ahead ever joins, so every reclaim pays one backing flush per
/// segment, which ARCHITECTURE.md ("so a writer pays one backing flush per several segments,
/// not one per segment") and the doc comment of `write_back_for_reclaim` say it avoids. The
/// writer waits for 4 more backing flushes per 5 segments than before.
/// FOUND: BUG (perf / documented behaviour broken). Fails on 49ec301: every reclaim write-back
/// is one segment, one backing flush each.
#[test]
fn perf_reclaim_at_the_floor_writes_back_one_segment_per_backing_flush() {
    let r = rig(256, 4096, 12288, RAID5_HDD, Some((950, 990)));
    let mut model = vec![0u64; 12288];
    write_scattered_flushed(&r.v, &mut model, 0, 3700, 1);
    assert_eq!(r.v.destage_step(1).unwrap(), 1);
    assert_eq!(batch_now(&r.v), 256);
    let (c0, f0, h0, t0) = (r.v.status().counters, r.backing.stats().flushes, r.v.status().log_head, r.clock.now_ns());
    write_scattered_flushed(&r.v, &mut model, 7400, 2000, 2);
    let c = r.v.status().counters;
    let (wbs, flushes) = (c.reclaim_write_backs - c0.reclaim_write_backs, r.backing.stats().flushes - f0);
    let segments = (r.v.status().log_head - h0) / 256;
    let ms = (r.clock.now_ns() - t0) / 1_000_000;
    eprintln!(
        "{wbs} reclaim write-backs, {flushes} backing flushes, {} blocks written back, head passed {segments} segments, {ms} ms",
        c.destaged_blocks - c0.destaged_blocks
    );
    check_versions(&r.v, &model, "after");
    assert!(wbs >= 4);
    assert!(flushes * 2 <= segments, "{flushes} backing flushes for {segments} segments: one per segment");
}

/// ATTACK: the latency bound the change claims ("a writer's reclaim waits at most the batch
/// under way, which is sized by time") where a segment holds more dirty blocks than the batch.
/// `preclean(max, dense_only = true)` adds whole windows while `batch.len() < max`, so one
/// pre-clean batch is up to `max - 1 + a window's dirty blocks`; with `--segment-size 8M`
/// (2,048-block segments) a dense window is ~1,980 dirty blocks, so with the batch at the 256
/// floor (1 ms a block) each pre-clean batch takes ~2 s, not 25 ms; with the default 256-block
/// segments up to ~2x the batch (255 + 248). (Reclaim's own write-back of such a window is
/// just as long, but that is the writer's own, unavoidable work.)
/// FOUND: BUG (perf / claim). Fails on 49ec301: background pre-clean batches of ~1,980 blocks
/// (~2 s each) with the batch sized at 256; a writer's reclaim meeting one waits that long.
#[test]
fn perf_dense_preclean_batches_are_not_bounded_by_the_batch_size() {
    let seg = 2048u32;
    let r = rig(seg, 16384, 40000, HDD, Some((950, 990)));
    let mut model = vec![0u64; 40000];
    write_scattered_flushed(&r.v, &mut model, 0, 15000, 1);
    assert_eq!(r.v.destage_step(1).unwrap(), 1);
    let batch = batch_now(&r.v);
    assert_eq!(batch, 256);
    // One pre-clean batch: the blocks written back between two backing flushes.
    let (w0, f0) = (r.backing.stats().writes, r.backing.stats().flushes);
    r.v.background_tick().unwrap();
    let (writes, flushes) = (r.backing.stats().writes - w0, r.backing.stats().flushes - f0);
    assert!(flushes > 0, "the pre-cleaner ran");
    let per_batch = writes / flushes;
    eprintln!("batch size {batch}; pre-clean: {writes} blocks in {flushes} batches ({per_batch} a batch, ~{per_batch} ms each)");
    check_versions(&r.v, &model, "after");
    assert!(per_batch <= 2 * batch as u64, "pre-clean batches of {per_batch} blocks with the batch at {batch}");
}
