//! Adversarial review of 5eb9482 ("Write-back issues a batch's runs together"): the engine's
//! write-back (`write_runs`) hands every run of a batch to the backing device in one
//! `BlockDevice::write_batch`, whose writes may land in any order. Each test is one
//! suspicion; its comment says whether it held (BUG) or was refuted.
//!
//! The backing device in most tests is `Watch`, a `SimDevice` wrapper that checks every
//! batch for overlapping or duplicate writes, checks that no write of one call is in flight
//! while another call writes the same bytes, and can hold a batch until the test lets it go.
//! It forwards batches to `SimDevice::write_batch` (a seeded, shuffled completion order).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use tiercache_device::{BlockDevice, FailMode, MonotonicClock, OpKind, SimDevice};
use tiercache_engine::{Volume, VolumeOptions, WriteAroundPolicy};

mod common;
use common::*;

#[derive(Default)]
struct WatchState {
    /// Writes in flight: (start, end, call id).
    in_flight: Vec<(u64, u64, u64)>,
    next_call: u64,
    violations: Vec<String>,
    batches: u64,
    batch_writes: u64,
    max_runs: usize,
    /// Hold the next batch of at least this many writes.
    hold: Option<usize>,
    held: bool,
    open: bool,
    /// Every batch's writes, when recording: (offset, len).
    recorded: Vec<Vec<(u64, u64)>>,
    record: bool,
}

struct Watch {
    inner: Arc<SimDevice>,
    st: Mutex<WatchState>,
    cv: Condvar,
    /// Sleep this long inside each write call (widens the windows of cross-call races).
    linger: Duration,
}

impl Watch {
    fn new(inner: Arc<SimDevice>, linger: Duration) -> Arc<Watch> {
        Arc::new(Watch { inner, st: Mutex::new(WatchState::default()), cv: Condvar::new(), linger })
    }

    /// Registers a call's writes as in flight, noting any overlap with another call's.
    fn begin(&self, what: &str, writes: &[(u64, u64)]) -> u64 {
        let mut g = self.st.lock().unwrap();
        let id = g.next_call;
        g.next_call += 1;
        let mut found = Vec::new();
        for &(s, e) in writes {
            for &(s2, e2, other) in &g.in_flight {
                if s < e2 && s2 < e {
                    found.push(format!(
                        "{what} writes bytes {s}..{e} while call {other} writes {s2}..{e2} (blocks {}..{})",
                        s / BS as u64,
                        e / BS as u64
                    ));
                }
            }
        }
        g.violations.extend(found);
        for &(s, e) in writes {
            g.in_flight.push((s, e, id));
        }
        id
    }

    fn end(&self, id: u64) {
        self.st.lock().unwrap().in_flight.retain(|w| w.2 != id);
    }

    fn hold_next_batch(&self, min_writes: usize) {
        let mut g = self.st.lock().unwrap();
        g.hold = Some(min_writes);
        g.held = false;
        g.open = false;
    }

    fn wait_until_held(&self) {
        let mut g = self.st.lock().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !g.held {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            assert!(!left.is_zero(), "no batch was held");
            g = self.cv.wait_timeout(g, left).unwrap().0;
        }
    }

    fn open_gate(&self) {
        let mut g = self.st.lock().unwrap();
        g.open = true;
        self.cv.notify_all();
    }

    fn violations(&self) -> Vec<String> {
        self.st.lock().unwrap().violations.clone()
    }
}

impl BlockDevice for Watch {
    forward_to_inner!(inner: size_bytes, logical_block_size, read_at, read_vectored_at, read_batch, flush, discard);
    fn write_at(&self, offset: u64, buf: &[u8]) -> tiercache_device::Result<()> {
        let id = self.begin("write_at", &[(offset, offset + buf.len() as u64)]);
        if !self.linger.is_zero() {
            std::thread::sleep(self.linger);
        }
        let r = self.inner.write_at(offset, buf);
        self.end(id);
        r
    }
    fn write_batch(&self, writes: &[(u64, &[u8])]) -> Vec<tiercache_device::Result<()>> {
        let ranges: Vec<(u64, u64)> = writes.iter().map(|&(o, b)| (o, o + b.len() as u64)).collect();
        {
            let mut g = self.st.lock().unwrap();
            g.batches += 1;
            g.batch_writes += writes.len() as u64;
            g.max_runs = g.max_runs.max(writes.len());
            if g.record {
                g.recorded.push(ranges.iter().map(|&(s, e)| (s, e - s)).collect());
            }
            // Within the batch: no two writes may overlap (they land in any order).
            let mut sorted = ranges.clone();
            sorted.sort_unstable();
            for w in sorted.windows(2) {
                if w[1].0 < w[0].1 {
                    let msg = format!(
                        "one batch holds overlapping writes {}..{} and {}..{} (blocks {} and {})",
                        w[0].0,
                        w[0].1,
                        w[1].0,
                        w[1].1,
                        w[0].0 / BS as u64,
                        w[1].0 / BS as u64
                    );
                    g.violations.push(msg);
                }
            }
            for &(s, e) in &ranges {
                if s == e {
                    g.violations.push(format!("an empty write at {s} in a batch"));
                }
            }
        }
        let id = self.begin("write_batch", &ranges);
        {
            let mut g = self.st.lock().unwrap();
            if g.hold.is_some_and(|min| writes.len() >= min) {
                g.hold = None;
                g.held = true;
                self.cv.notify_all();
                while !g.open {
                    g = self.cv.wait(g).unwrap();
                }
            }
        }
        if !self.linger.is_zero() {
            std::thread::sleep(self.linger);
        }
        let r = self.inner.write_batch(writes);
        self.end(id);
        r
    }
    fn write_fua_at(&self, offset: u64, buf: &[u8]) -> tiercache_device::Result<()> {
        let id = self.begin("write_fua_at", &[(offset, offset + buf.len() as u64)]);
        let r = self.inner.write_fua_at(offset, buf);
        self.end(id);
        r
    }
    fn describe(&self) -> String {
        format!("watch:{}", self.inner.describe())
    }
}

fn open_with(cache: Arc<SimDevice>, backing: Arc<dyn BlockDevice>, options: VolumeOptions) -> Volume {
    let c: Arc<dyn BlockDevice> = cache;
    Volume::open(c, backing, Arc::new(MonotonicClock::new()), options).expect("open").0
}

/// The blocks every test here dirties: 20 blocks, two apart (20 runs of one block).
const SCATTERED: std::ops::Range<u64> = 0..20;
fn scattered(i: u64) -> u64 {
    i * 2
}

/// Writes the 20 scattered blocks at `version`, one request each, and FLUSHes.
fn dirty_scattered(v: &Volume, version: u64) {
    for i in SCATTERED {
        write(v, scattered(i), version);
    }
    v.flush().unwrap();
}

// Suspicion: the engine passes overlapping or duplicate runs to one `write_batch` (the
// same block twice in a batch: the elevator's wrap-around chain, reclaim's window plus the
// segments "ahead", the pre-cleaner's windows; or runs that touch), or a write-back batch is
// in flight while another backing write (a write-around, reclaim's own write-back, the
// destager) writes the same blocks, so that the landing order decides what the backing
// device holds. Churn: three writers on disjoint block ranges of a 128-block log over a
// 390-block volume (reclaim must write back), 1-6 block requests, FLUSHes, read-your-writes
// checks; a destager thread running `destage_step` and `destage_oldest` meanwhile; once with
// write-around of 4-block writes on. The `Watch` backing device records every violation.
// At the end every block reads its newest version and, after `flush_all`, the backing
// device holds it.
//
// Refuted (passes): no overlap within a batch, none across calls in flight, data right.
#[test]
fn no_batch_overlaps_and_nothing_races_it_under_churn() {
    for around in [false, true] {
        let (cache, backing) = devices_seg(16, 8, 390, log_only());
        let watch = Watch::new(Arc::clone(&backing), Duration::from_micros(30));
        let mut options = VolumeOptions::default();
        if around {
            options.write_around = WriteAroundPolicy { min_bytes: 4 * BS as u64, only_when_destage_bound: false };
        }
        let volume = Arc::new(open_with(cache, watch.clone(), options));
        let stop = Arc::new(AtomicBool::new(false));
        let destager = {
            let (v, stop) = (Arc::clone(&volume), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut n = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    n += v.destage_step(24).unwrap() as u64;
                    n += v.destage_oldest(24).unwrap() as u64;
                    std::thread::sleep(Duration::from_micros(200));
                }
                n
            })
        };
        let writers: Vec<_> = (0..3u64)
            .map(|t| {
                let v = Arc::clone(&volume);
                std::thread::spawn(move || {
                    let mut model: BTreeMap<u64, u64> = BTreeMap::new();
                    let (first, span) = (t * 130, 130u64);
                    let mut x = 0x9E37_79B9u64.wrapping_mul(t + 1);
                    for step in 1..=700u64 {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let n = 1 + x % 6;
                        let b = first + (x >> 8) % (span - n);
                        let data: Vec<u8> = (b..b + n).flat_map(|k| stamp(k, step)).collect();
                        v.write(b * BS as u64, &data).unwrap();
                        for k in b..b + n {
                            model.insert(k, step);
                        }
                        if step % 5 == 0 {
                            v.flush().unwrap();
                        }
                        if step % 7 == 0 {
                            let k = first + (x >> 20) % span;
                            let got = read_version(&v, k).unwrap();
                            assert_eq!(got, Some(model.get(&k).copied().unwrap_or(0)), "thread {t} block {k}");
                        }
                    }
                    v.flush().unwrap();
                    model
                })
            })
            .collect();
        let mut model = BTreeMap::new();
        for w in writers {
            model.extend(w.join().unwrap());
        }
        stop.store(true, Ordering::Relaxed);
        let destaged = destager.join().unwrap();
        check_model(&volume, &model, "after the churn");
        volume.flush_all(|_, _| {}).unwrap();
        assert_backing_holds(&backing, &model);
        let s = volume.status();
        let g = watch.st.lock().unwrap();
        eprintln!(
            "around {around}: {} batches, {} runs, at most {} in one; destager {destaged} blocks; reclaim \
             write-backs {}; destaged {}",
            g.batches, g.batch_writes, g.max_runs, s.counters.reclaim_write_backs, s.counters.destaged_blocks
        );
        assert!(g.violations.is_empty(), "around {around}: {:#?}", &g.violations[..g.violations.len().min(10)]);
        assert!(g.max_runs > 1, "no batch of more than one run: nothing was tested");
    }
}

// Suspicion: a backing write fails in the middle of a batch (the simulator completes the
// batch's writes in a seeded order, so the k-th to complete is any run): the write-back must
// report the error, mark nothing clean (the runs that did land are not flushed), keep every
// block dirty and readable at its newest version, and a later write-back must succeed and
// land everything. Tried for every k (the failing write's place in completion order).
//
// Refuted (passes).
#[test]
fn a_failed_run_marks_nothing_clean_and_a_later_write_back_lands_all() {
    for k in 0..20u64 {
        let (cache, backing) = devices_seg(16, 16, 512, log_only());
        let volume = open_with(cache, backing.clone(), VolumeOptions::default());
        dirty_scattered(&volume, 1);
        assert_eq!(volume.status().dirty_blocks, 20);
        let flushes = backing.stats().flushes;
        backing.fail_after(Some(OpKind::Write), k, FailMode::Once);
        let r = volume.destage_step(4096);
        assert!(r.is_err(), "k {k}: a failed run was not reported: {r:?}");
        assert_eq!(backing.stats().write_batches, 1, "k {k}");
        assert_eq!(volume.status().dirty_blocks, 20, "k {k}: blocks marked clean after a failed write-back");
        assert_eq!(backing.stats().flushes, flushes, "k {k}: the backing device was flushed after a failed write");
        for i in SCATTERED {
            assert_eq!(read_version(&volume, scattered(i)).unwrap(), Some(1), "k {k}: block {}", scattered(i));
        }
        // The device works again: the next write-back lands all of them.
        assert_eq!(volume.destage_step(4096).unwrap(), 20, "k {k}");
        assert_eq!(volume.status().dirty_blocks, 0, "k {k}");
        for i in SCATTERED {
            assert_eq!(backing_version(&backing, scattered(i)), Some(1), "k {k}: backing block {}", scattered(i));
        }
        let durable = SimDevice::from_image(backing.durable_image(), BS as u32);
        for i in SCATTERED {
            assert_eq!(backing_version(&durable, scattered(i)), Some(1), "k {k}: durable block {}", scattered(i));
        }
    }
}

// Suspicion: power fails during a write-back batch. (a) The backing device vanishes at the
// k-th write of the batch to complete (every later one fails, but a failed write may still
// land, whole or torn, at the crash); (b) all runs complete but the backing flush fails;
// (c) the flush succeeds and the crash comes before the MarkClean entries reach the log.
// Any subset of runs may be on the backing device, some torn. Recovery (from the durable
// images) must serve the newest version of every block, and a later `flush_all` must leave
// it on the backing device. Several crash seeds for each.
//
// Refuted (passes).
#[test]
fn a_crash_during_a_write_back_batch_loses_nothing() {
    #[derive(Debug, Clone, Copy)]
    enum When {
        Vanish(u64),
        FlushFails,
        BeforeMarkClean,
    }
    let mut cases: Vec<When> = (0..20).map(When::Vanish).collect();
    cases.push(When::FlushFails);
    cases.push(When::BeforeMarkClean);
    for when in cases {
        for seed in 0..6u64 {
            let (cache, backing) = devices_seg(16, 16, 512, log_only());
            let volume = open_with(Arc::clone(&cache), backing.clone(), VolumeOptions::default());
            // Version 1 written back and clean; then version 2 dirty (the backing device
            // holds 1: a torn run mixes 1 and 2).
            dirty_scattered(&volume, 1);
            volume.flush_all(|_, _| {}).unwrap();
            dirty_scattered(&volume, 2);
            // Some clean neighbours that must not change.
            volume.write(100 * BS as u64, &stamps(100, 4, 3)).unwrap();
            volume.flush().unwrap();
            match when {
                When::Vanish(k) => backing.fail_after(Some(OpKind::Write), k, FailMode::Forever),
                When::FlushFails => backing.fail_after(Some(OpKind::Flush), 0, FailMode::Forever),
                When::BeforeMarkClean => {}
            }
            let r = volume.destage_step(4096);
            match when {
                When::BeforeMarkClean => assert_eq!(r.unwrap(), 24),
                _ => assert!(r.is_err(), "{when:?}: {r:?}"),
            }
            drop(volume);
            cache.crash(seed);
            let report = backing.crash(seed);
            let recovered = open(durable_copy(&cache), durable_copy(&backing));
            for i in SCATTERED {
                let b = scattered(i);
                assert_eq!(
                    read_version(&recovered, b).unwrap(),
                    Some(2),
                    "{when:?} seed {seed} ({report:?}): block {b} after recovery"
                );
            }
            for b in 100..104 {
                assert_eq!(read_version(&recovered, b).unwrap(), Some(3), "{when:?} seed {seed}: block {b}");
            }
            // (The recovered volume's backing device is a copy: check the copy.)
            drop(recovered);
            let (c2, b2) = (durable_copy(&cache), durable_copy(&backing));
            let recovered = open(c2, b2.clone());
            recovered.flush_all(|_, _| {}).unwrap();
            for i in SCATTERED {
                assert_eq!(
                    backing_version(&b2, scattered(i)),
                    Some(2),
                    "{when:?} seed {seed}: backing after flush_all"
                );
            }
        }
    }
}

// Suspicion: a writer overwrites blocks whose older version is in flight in a write-back
// batch (held between issue and landing): the batch lands the older version on the backing
// device after the newer one is in the cache. The newer version must stay dirty (the
// mark-clean rule: positions, not slots), read back as the newest, survive a crash at that
// moment, and reach the backing device at the next write-back. The batch itself must not
// wait for the writer, nor the writer for the batch.
//
// Refuted (passes).
#[test]
fn an_overwrite_during_a_held_batch_stays_dirty() {
    let (cache, backing) = devices_seg(16, 16, 512, log_only());
    let watch = Watch::new(Arc::clone(&backing), Duration::ZERO);
    let volume = Arc::new(open_with(Arc::clone(&cache), watch.clone(), VolumeOptions::default()));
    dirty_scattered(&volume, 1);
    watch.hold_next_batch(2);
    let destager = on_thread(&volume, |v| v.destage_step(4096));
    watch.wait_until_held();
    // Blocks 0, 8 and 16 overwritten (and one neighbour of a run: block 1) while held.
    let v = Arc::clone(&volume);
    bounded("a write while a write-back batch is held", 30, move || {
        for b in [0u64, 8, 16, 1] {
            write(&v, b, 2);
        }
        v.flush().unwrap();
    });
    // A power cut now: the cache holds version 2, durably; the backing device is old.
    let cut_cache = cache.durable_image();
    let cut_backing = backing.durable_image();
    watch.open_gate();
    assert_eq!(destager.join().unwrap().unwrap(), 20);
    for b in [0u64, 8, 16, 1] {
        assert_eq!(read_version(&volume, b).unwrap(), Some(2), "block {b}");
    }
    let mut dirty: Vec<u64> = volume.index_snapshot().into_iter().filter(|(_, e)| e.dirty).map(|(b, _)| b).collect();
    dirty.sort_unstable();
    assert_eq!(dirty, vec![0, 1, 8, 16], "the blocks overwritten during the batch stay dirty, the rest are clean");
    assert_eq!(backing_version(&backing, 0), Some(1), "the batch landed the version it read");
    let recovered = recover_image(cut_cache, &SimDevice::from_image(cut_backing, BS as u32));
    for b in [0u64, 8, 16, 1] {
        assert_eq!(read_version(&recovered, b).unwrap(), Some(2), "after the cut: block {b}");
    }
    assert_eq!(volume.destage_step(4096).unwrap(), 4);
    for b in [0u64, 8, 16, 1] {
        assert_eq!(backing_version(&backing, b), Some(2), "backing block {b}");
    }
    assert!(watch.violations().is_empty(), "{:?}", watch.violations());
}

// Suspicion: on real files (O_DIRECT where the file system takes it, else buffered) a
// write-back batch of more runs than a ring holds (RING_ENTRIES = 32: here 300 one-block runs
// and some longer ones, issued in groups) goes through the destager thread's io_uring; the
// engine's `data` buffer is read by the kernel while in flight. A run landing in the wrong
// place, with another run's data, or not at all (reported done before it landed); then the
// volume reopened on the files must read everything, and the backing file must hold it.
// A second destager thread and writers run meanwhile (each thread its own ring).
//
// Refuted (passes).
#[test]
fn write_back_through_io_uring_on_files_lands_every_run() {
    use tiercache_device::{FileDevice, OpenOptions};
    use tiercache_engine::create;
    let dir = tempfile::tempdir().unwrap();
    let log_blocks = 4096u64;
    let backing_blocks = 2048u64;
    let ck = tiercache_format::Layout::checkpoint_blocks_for(log_blocks, BS as u32);
    let cache_path = dir.path().join("cache");
    let backing_path = dir.path().join("backing");
    std::fs::write(&cache_path, vec![0u8; ((2 + 2 * ck + log_blocks) * BS as u64) as usize]).unwrap();
    std::fs::write(&backing_path, stamps(0, backing_blocks, 0)).unwrap();
    let opener = |p: &std::path::Path| -> Arc<FileDevice> {
        for direct in [true, false] {
            match FileDevice::open_with(p, OpenOptions { direct, lock: true, read_only: false }) {
                Err(tiercache_device::DeviceError::DirectIoUnsupported { .. }) => continue,
                r => return Arc::new(r.unwrap()),
            }
        }
        unreachable!()
    };
    {
        let (c, b) = (opener(&cache_path), opener(&backing_path));
        create(&*c, &*b, &tiercache_engine::CreateOptions { segment_blocks: 64, ..log_only() }).unwrap();
    }
    let (c, b) = (opener(&cache_path), opener(&backing_path));
    let direct = b.is_direct();
    let v = Arc::new(Volume::open(c, b, Arc::new(MonotonicClock::new()), VolumeOptions::default()).unwrap().0);
    let mut model = BTreeMap::new();
    for round in 1..=4u64 {
        // 300 one-block runs (every third block), plus 10 runs of 7 blocks.
        for i in 0..300u64 {
            let blk = (i * 3 + round) % 900;
            write(&v, blk, round);
            model.insert(blk, round);
        }
        for i in 0..10u64 {
            let blk = 1000 + i * 20 + round;
            v.write(blk * BS as u64, &stamps(blk, 7, round)).unwrap();
            for k in blk..blk + 7 {
                model.insert(k, round);
            }
        }
        v.flush().unwrap();
        // Two destagers at once (they serialise on the destage lock, each on its own ring),
        // and a writer of other blocks meanwhile.
        let d1 = on_thread(&v, |v| v.destage_step(4096));
        let d2 = on_thread(&v, |v| v.destage_oldest(4096));
        let w = on_thread(&v, move |v| {
            for k in 1500..1600u64 {
                write(v, k, round);
            }
            v.flush().unwrap();
        });
        d1.join().unwrap().unwrap();
        d2.join().unwrap().unwrap();
        w.join().unwrap();
        for k in 1500..1600u64 {
            model.insert(k, round);
        }
        check_model(&v, &model, &format!("round {round}"));
    }
    v.flush_all(|_, _| {}).unwrap();
    let backing_now = std::fs::read(&backing_path).unwrap();
    for (&b, &version) in &model {
        let got = version_of(b, &backing_now[b as usize * BS..(b as usize + 1) * BS]);
        assert_eq!(got, Some(version), "backing file block {b} (direct {direct})");
    }
    drop(v);
    let (c, b) = (opener(&cache_path), opener(&backing_path));
    let r = Volume::open(c, b, Arc::new(MonotonicClock::new()), VolumeOptions::default()).unwrap().0;
    check_model(&r, &model, "reopened");
}
