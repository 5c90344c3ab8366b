//! Adversarial review of the engine split (commits 03d8eb2, 902309f): the assertions it added
//! (`check_invariants` at the exits of the record writer, reclaim and checkpoint, and
//! `finish_reclaim`'s "no live block behind the head") must never fire on a legal state, and
//! the per-thread lock-order bookkeeping (`lock_order.rs`) must not go stale after a panic
//! that a caller catches, nor fire on two volumes' locks (one volume as another's device).
//! Each test is one suspicion. `a_volume_stacked_on_another_volume_writes_back` failed on
//! 902309f (the check was per thread, not per volume) and passes since the fix.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, Weak};
use std::time::Duration;
use tiercache_device::{BlockDevice, FailMode, MonotonicClock, OpKind, SimDevice};
use tiercache_engine::{CreateOptions, EngineError, Volume, VolumeOptions};
use tiercache_format::{uuid_low64, CheckpointHeader};

mod common;
use common::*;

// ------------------------------------------------------------------------------------------
// A device that, at a chosen I/O, runs an action on another thread while the engine thread
// waits inside that I/O (holding whatever engine locks it holds: the io lock during a record
// write, reclaim or checkpoint, the destage lock during a write-back). The action gets a
// short time to finish; if it needs a lock the waiting thread holds, the I/O goes on and the
// action finishes concurrently (no deadlock either way).

type Action = Box<dyn FnOnce() + Send>;

struct HookDev {
    inner: Arc<SimDevice>,
    ops: AtomicU64,
    armed: Mutex<Option<(u64, Action)>>,
}

impl HookDev {
    fn new(inner: Arc<SimDevice>) -> Arc<HookDev> {
        Arc::new(HookDev { inner, ops: AtomicU64::new(0), armed: Mutex::new(None) })
    }

    /// Runs `action` at the `after`-th cache I/O from now.
    fn arm(&self, after: u64, action: Action) {
        let now = self.ops.load(Ordering::SeqCst);
        *self.armed.lock().unwrap() = Some((now + after, action));
    }

    fn tick(&self) {
        let n = self.ops.fetch_add(1, Ordering::SeqCst);
        let action = {
            let mut a = self.armed.lock().unwrap();
            match a.as_ref() {
                Some((at, _)) if *at <= n => a.take().map(|(_, f)| f),
                _ => None,
            }
        };
        if let Some(f) = action {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::spawn(move || {
                f();
                let _ = tx.send(());
            });
            let _ = rx.recv_timeout(Duration::from_millis(20));
        }
    }
}

impl BlockDevice for HookDev {
    forward_to_inner!(inner: size_bytes, logical_block_size, discard);
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> tiercache_device::Result<()> {
        self.tick();
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> tiercache_device::Result<()> {
        self.tick();
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> tiercache_device::Result<()> {
        self.tick();
        self.inner.flush()
    }
    fn describe(&self) -> String {
        format!("hook:{}", self.inner.describe())
    }
}

// ------------------------------------------------------------------------------------------
// The model: per block, every version ever handed to `write` (versions grow globally), the
// newest completed write, the newest flushed one, and whether its dirty copy was rotted since
// its last write (then LostBlock is an allowed answer).

#[derive(Default)]
struct Model {
    history: Vec<Vec<u64>>,
    latest: Vec<u64>,
    /// A write of this version is in progress (a concurrent read may see it).
    pending: Vec<Option<u64>>,
    floor: Vec<u64>,
    rotted: Vec<bool>,
    ever_rotted: Vec<bool>,
    faults: bool,
    /// What happened to each block (printed when a check fails).
    events: Vec<Vec<String>>,
}

impl Model {
    fn new(n: usize) -> Model {
        Model {
            history: vec![vec![0]; n],
            latest: vec![0; n],
            pending: vec![None; n],
            floor: vec![0; n],
            rotted: vec![false; n],
            ever_rotted: vec![false; n],
            faults: false,
            events: vec![Vec::new(); n],
        }
    }

    /// A read during the run; `since` is the newest completed write when the read began (a
    /// read racing the main thread's writes may return anything written since).
    fn check_read(&self, what: &str, b: u64, r: &Result<Option<u64>, EngineError>, since: Option<u64>) {
        let i = b as usize;
        let lenient = since.is_some();
        match r {
            Ok(Some(v)) if *v == self.latest[i] || Some(*v) == self.pending[i] => {}
            Ok(Some(v)) if self.history[i].contains(v) && since.is_some_and(|s| *v >= s) => {}
            Ok(Some(v)) if self.faults && self.history[i].contains(v) => {}
            Err(EngineError::LostBlock { .. })
                if self.rotted[i] || (self.ever_rotted[i] && (self.faults || lenient)) => {}
            Err(_) if self.faults => {}
            other => panic!(
                "{what}: block {b} read {other:?}; latest {} pending {:?} rotted {}; events {:?}",
                self.latest[i], self.pending[i], self.rotted[i], self.events[i]
            ),
        }
    }

    /// A read after a power cut and recovery.
    fn check_recovered(&mut self, what: &str, b: u64, r: &Result<Option<u64>, EngineError>) {
        let i = b as usize;
        match r {
            Ok(Some(v)) if self.history[i].contains(v) && *v >= self.floor[i] => {
                self.latest[i] = *v;
                self.floor[i] = *v;
                self.events[i].push(format!("recovered {v}"));
            }
            Err(EngineError::LostBlock { .. }) if self.ever_rotted[i] => {
                self.rotted[i] = true;
                self.events[i].push("recovered lost".into());
            }
            other => panic!(
                "{what}: block {b} read {other:?} after recovery; floor {} history {:?}; events {:?}",
                self.floor[i], self.history[i], self.events[i]
            ),
        }
        self.pending[i] = None;
    }

    fn flushed(&mut self) {
        for i in 0..self.latest.len() {
            if self.floor[i] != self.latest[i] {
                self.floor[i] = self.latest[i];
                let v = self.latest[i];
                self.events[i].push(format!("flushed {v}"));
            }
        }
    }
}

/// Rots `block`'s cached copy on the medium (no flush) if it lies before both checkpoints'
/// positions (as the simulator's corrupter does: rot in the newest records is a torn write to
/// recovery, which legitimately cuts the log there): returns whether it was dirty.
fn rot(inner: &SimDevice, volume: &Volume, block: u64) -> Option<bool> {
    let (_, e, _) = volume.checkpointed_entries().into_iter().find(|(b, _, _)| *b == block)?;
    let offset = volume.superblock().layout.log_offset(u64::from(e.slot));
    inner.corrupt(offset, &vec![0xA5u8; BS]);
    Some(e.dirty)
}

fn trace(what: &str, op: &str, e: &EngineError) {
    if std::env::var("REVIEW_TRACE").is_ok() {
        eprintln!("{what}: {op}: {e}");
    }
}

fn options(checkpoint_interval_permille: u64) -> VolumeOptions {
    VolumeOptions { checkpoint_interval_permille, ..VolumeOptions::default() }
}

fn open_with(cache: Arc<dyn BlockDevice>, backing: Arc<dyn BlockDevice>, opts: VolumeOptions) -> Volume {
    Volume::open(cache, backing, Arc::new(MonotonicClock::new()), opts).expect("open").0
}

/// One random run on a tiny log: the main thread issues random operations; at random cache
/// I/Os a helper thread writes back, pre-cleans, reads, discards or rots a cached block while
/// the main thread waits inside the I/O (often inside reclaim or its checkpoint); with
/// `faults`, a device fails once now and then (a poisoned volume goes on being called);
/// power is cut now and then and the volume recovered. Any panic (an assertion of the split,
/// the lock-order check) fails the test; so does a read the model does not allow.
fn tiny_log_run(seed: u64, seg: u32, segments: u64, faults: bool) -> tiercache_engine::Counters {
    let mut total = tiercache_engine::Counters::default();
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let nblocks: u64 = segments * u64::from(seg) * 2;
    let (sim_cache, backing) = devices_seg(segments, seg, nblocks, log_only());
    let model = Arc::new(Mutex::new(Model::new(nblocks as usize)));
    // Checkpoints mostly from reclaim (the head may not pass the checkpoint) with a large
    // interval; sometimes often.
    let interval = if rng.gen_bool(0.5) { 100_000 } else { rng.gen_range(50..600) };
    let mut version = 0u64;
    let mut cache_dev = Arc::clone(&sim_cache);
    let mut backing_dev = Arc::clone(&backing);
    for epoch in 0..4u64 {
        let hook = HookDev::new(Arc::clone(&cache_dev));
        let volume = Arc::new(open_with(hook.clone(), backing_dev.clone(), options(interval)));
        let weak: Arc<OnceLock<Weak<Volume>>> = Arc::new(OnceLock::new());
        let _ = weak.set(Arc::downgrade(&volume));
        let mut injected = false;
        for step in 0..400u64 {
            let what = format!("seed {seed} seg {seg}x{segments} epoch {epoch} step {step}");
            if rng.gen_bool(0.15) && hook.armed.lock().unwrap().is_none() {
                let (w, m, inner) = (Arc::clone(&weak), Arc::clone(&model), Arc::clone(&cache_dev));
                let which = rng.gen_range(0..6u8);
                let b = rng.gen_range(0..nblocks);
                let what = what.clone();
                hook.arm(
                    rng.gen_range(0..6),
                    Box::new(move || {
                        let Some(v) = w.get().and_then(Weak::upgrade) else { return };
                        match which {
                            0 => drop(v.destage_step(4)),
                            1 => drop(v.destage_oldest(8)),
                            2 => {
                                let since = m.lock().unwrap().latest[b as usize];
                                let r = read_version(&v, b);
                                m.lock().unwrap().check_read(&format!("{what} (hook)"), b, &r, Some(since));
                            }
                            3 => drop(v.discard(b * BS as u64, BS as u64 * 4.min(nblocks - b))),
                            4 => {
                                let mut m = m.lock().unwrap();
                                let r = rot(&inner, &v, b);
                                if r.is_some() {
                                    m.events[b as usize].push(format!("{what}: hook rot dirty={r:?}"));
                                }
                                if r == Some(true) {
                                    m.rotted[b as usize] = true;
                                    m.ever_rotted[b as usize] = true;
                                }
                            }
                            _ => drop(v.background_tick()),
                        }
                    }),
                );
            }
            if faults && !injected && rng.gen_bool(0.01) {
                injected = true;
                model.lock().unwrap().faults = true;
                let kind = [Some(OpKind::Write), Some(OpKind::Flush), Some(OpKind::Read), None][rng.gen_range(0..4)];
                let n = rng.gen_range(0..8);
                // (Not a failed backing write: the simulated device lets a failed write land at
                // any later crash, even over a newer version written back and flushed since,
                // which no write-back cache can defend against; the engine's old and new code
                // alike then serve the older version.)
                let on_cache = rng.gen_bool(0.7) || kind == Some(OpKind::Write) || kind.is_none();
                if std::env::var("REVIEW_TRACE").is_ok() {
                    eprintln!("{what}: inject {kind:?} after {n} on {}", if on_cache { "cache" } else { "backing" });
                }
                if on_cache {
                    cache_dev.fail_after(kind, n, FailMode::Once);
                } else {
                    backing_dev.fail_after(kind, n, FailMode::Once);
                }
            }
            let b = rng.gen_range(0..nblocks);
            match rng.gen_range(0..100u32) {
                0..=44 => {
                    version += 1;
                    {
                        let mut m = model.lock().unwrap();
                        m.history[b as usize].push(version);
                        m.pending[b as usize] = Some(version);
                    }
                    let r = volume.write(b * BS as u64, &stamp(b, version));
                    let mut m = model.lock().unwrap();
                    m.pending[b as usize] = None;
                    m.events[b as usize].push(format!("{what}: write {version} {:?}", r.as_ref().err()));
                    match r {
                        Ok(()) => {
                            m.latest[b as usize] = version;
                            m.rotted[b as usize] = false;
                        }
                        Err(e) => {
                            trace(&what, "write", &e);
                            assert!(m.faults, "{what}: write: {e}")
                        }
                    }
                }
                45..=64 => {
                    let r = read_version(&volume, b);
                    model.lock().unwrap().check_read(&what, b, &r, None);
                }
                65..=72 => match volume.flush() {
                    Ok(()) => model.lock().unwrap().flushed(),
                    Err(e) => {
                        trace(&what, "flush", &e);
                        assert!(model.lock().unwrap().faults, "{what}: flush: {e}")
                    }
                },
                73..=76 => {
                    if let Err(e) = volume.checkpoint() {
                        {
                            trace(&what, "checkpoint", &e);
                            assert!(model.lock().unwrap().faults, "{what}: checkpoint: {e}")
                        };
                    }
                }
                77..=81 => {
                    if let Err(e) = volume.destage_step(rng.gen_range(1..16)) {
                        {
                            trace(&what, "destage", &e);
                            assert!(model.lock().unwrap().faults, "{what}: destage: {e}")
                        };
                    }
                }
                82..=85 => {
                    if let Err(e) = volume.background_tick() {
                        {
                            trace(&what, "tick", &e);
                            assert!(model.lock().unwrap().faults, "{what}: tick: {e}")
                        };
                    }
                }
                86..=88 => {
                    let n = rng.gen_range(1..8).min(nblocks - b);
                    if let Err(e) = volume.discard(b * BS as u64, n * BS as u64) {
                        {
                            trace(&what, "discard", &e);
                            assert!(model.lock().unwrap().faults, "{what}: discard: {e}")
                        };
                    }
                }
                89..=92 => {
                    // A large read: misses admitted as clean blocks, staging fills.
                    let n = rng.gen_range(1..12).min(nblocks - b);
                    let mut buf = vec![0u8; n as usize * BS];
                    let r = volume.read(b * BS as u64, &mut buf);
                    let m = model.lock().unwrap();
                    match r {
                        Ok(()) => {
                            for k in 0..n {
                                let got = version_of(b + k, &buf[k as usize * BS..(k as usize + 1) * BS]);
                                m.check_read(&what, b + k, &Ok(got), None);
                            }
                        }
                        Err(e) => {
                            let lost = matches!(e, EngineError::LostBlock { block } if m.rotted[block as usize]);
                            if let (false, EngineError::LostBlock { block }) = (lost || m.faults, &e) {
                                panic!("{what}: read of {n}: {e}; events {:?}", m.events[*block as usize]);
                            }
                            assert!(lost || m.faults, "{what}: read of {n}: {e}");
                        }
                    }
                }
                93..=94 => {
                    let r = volume.write_back_all(1.0, |_, _| true);
                    let m = model.lock().unwrap();
                    match r {
                        Ok(_) | Err(EngineError::LostBlocks { .. }) => {}
                        Err(e) => {
                            trace(&what, "write_back_all", &e);
                            assert!(m.faults, "{what}: write_back_all: {e}")
                        }
                    }
                }
                95..=97 => {
                    // Rot a cached block (from the main thread).
                    let entries = volume.checkpointed_entries();
                    if !entries.is_empty() {
                        let (blk, _, _) = entries[rng.gen_range(0..entries.len())];
                        let r = rot(&cache_dev, &volume, blk);
                        let mut m = model.lock().unwrap();
                        if r.is_some() {
                            m.events[blk as usize].push(format!("{what}: rot dirty={r:?}"));
                        }
                        if r == Some(true) {
                            m.rotted[blk as usize] = true;
                            m.ever_rotted[blk as usize] = true;
                        }
                    }
                }
                _ if b >= 1 && b + 1 < nblocks => {
                    // Unaligned write over block b and the edges of its neighbours (rewritten
                    // with the content they hold): read-modify-write under the rmw lock.
                    version += 1;
                    let data = {
                        let mut m = model.lock().unwrap();
                        m.history[b as usize].push(version);
                        m.pending[b as usize] = Some(version);
                        let mut d = stamp(b - 1, m.latest[b as usize - 1])[BS - 50..].to_vec();
                        d.extend(stamp(b, version));
                        d.extend(&stamp(b + 1, m.latest[b as usize + 1])[..50]);
                        d
                    };
                    let r = volume.write_bytes(b * BS as u64 - 50, &data);
                    let mut m = model.lock().unwrap();
                    m.pending[b as usize] = None;
                    match r {
                        Ok(()) => {
                            m.latest[b as usize] = version;
                            m.rotted[b as usize] = false;
                        }
                        Err(EngineError::LostBlock { block }) if m.rotted[block as usize] => {}
                        Err(e) => {
                            trace(&what, "write_bytes", &e);
                            assert!(m.faults, "{what}: write_bytes: {e}")
                        }
                    }
                }
                _ => {}
            }
        }
        let c = volume.status().counters;
        total.reclaimed_blocks += c.reclaimed_blocks;
        total.copied_forward_blocks += c.copied_forward_blocks;
        total.evicted_blocks += c.evicted_blocks;
        total.checkpoints += c.checkpoints;
        total.destaged_blocks += c.destaged_blocks;
        total.repaired_blocks += c.repaired_blocks;
        // Let any hook still running finish, then cut the power (or shut down cleanly).
        *hook.armed.lock().unwrap() = None;
        std::thread::sleep(Duration::from_millis(30));
        let clean = !injected && rng.gen_bool(0.3);
        if clean {
            volume.shutdown().unwrap_or_else(|e| panic!("seed {seed} epoch {epoch}: shutdown: {e}"));
            model.lock().unwrap().flushed();
        }
        drop(volume);
        cache_dev.clear_faults();
        backing_dev.clear_faults();
        cache_dev.crash(seed * 31 + epoch);
        backing_dev.crash(seed * 37 + epoch);
        cache_dev = Arc::new(SimDevice::from_image(cache_dev.durable_image(), BS as u32));
        backing_dev = Arc::new(SimDevice::from_image(backing_dev.durable_image(), BS as u32));
        if let Ok(b) = std::env::var("REVIEW_BLOCK") {
            let b: u64 = b.parse().unwrap();
            let copy = Arc::new(SimDevice::from_image(cache_dev.durable_image(), BS as u32));
            let v = Volume::inspect(copy, None, Arc::new(MonotonicClock::new())).unwrap();
            let mut buf = vec![0u8; BS];
            backing_dev.read_at(b * BS as u64, &mut buf).unwrap();
            eprintln!(
                "after epoch {epoch}: window {:?} block {b} index {:?} backing {:?} lost {:?}",
                v.log_window(),
                slot_of(&v, b),
                version_of(b, &buf),
                v.lost_blocks()
            );
        }
        let volume = open_with(cache_dev.clone(), backing_dev.clone(), options(interval));
        let mut m = model.lock().unwrap();
        m.faults = false;
        for b in 0..nblocks {
            let r = read_version(&volume, b);
            m.check_recovered(&format!("seed {seed} seg {seg}x{segments} after epoch {epoch}"), b, &r);
        }
    }
    total
}

fn exercised(c: &[tiercache_engine::Counters]) {
    let sum = |f: fn(&tiercache_engine::Counters) -> u64| c.iter().map(f).sum::<u64>();
    eprintln!(
        "reclaimed {} copied forward {} evicted {} checkpoints {} destaged {} repaired {}",
        sum(|c| c.reclaimed_blocks),
        sum(|c| c.copied_forward_blocks),
        sum(|c| c.evicted_blocks),
        sum(|c| c.checkpoints),
        sum(|c| c.destaged_blocks),
        sum(|c| c.repaired_blocks)
    );
    assert!(sum(|c| c.reclaimed_blocks) > 0 && sum(|c| c.copied_forward_blocks) > 0 && sum(|c| c.evicted_blocks) > 0);
}

#[test]
fn tiny_logs_with_races_inside_reclaim_never_trip_the_new_assertions() {
    for (seg, segments) in [(4u32, 8u64), (4, 9), (8, 8), (16, 8), (4, 16)] {
        let c: Vec<_> = (0..12u64).map(|seed| tiny_log_run(seed, seg, segments, false)).collect();
        exercised(&c);
    }
}

/// Replays one run: `REVIEW_SEED=seed,seg,segments,faults(0|1)`, with `REVIEW_TRACE=1` for
/// the faults and errors, `REVIEW_BLOCK=b` for block b's recovered state after each epoch.
#[test]
#[ignore = "a replay helper: set REVIEW_SEED"]
fn one_seed() {
    let v: Vec<u64> = std::env::var("REVIEW_SEED").unwrap().split(',').map(|x| x.parse().unwrap()).collect();
    tiny_log_run(v[0], v[1] as u32, v[2], v[3] == 1);
}

#[test]
fn tiny_logs_with_device_failures_never_trip_the_new_assertions() {
    for (seg, segments) in [(4u32, 8u64), (8, 8), (4, 12)] {
        let c: Vec<_> = (100..116u64).map(|seed| tiny_log_run(seed, seg, segments, true)).collect();
        exercised(&c);
    }
}

// ------------------------------------------------------------------------------------------
// Suspicion: `check_invariants` asserts head <= checkpoint position. Recovery takes the head
// from the last replayed record; when the newest checkpoint is unreadable it replays from the
// older one, whose position the head may have passed since (reclaim only keeps the head
// behind the newest). The first `check_invariants` would then fire at open.

fn checkpoint_positions(cache: &SimDevice) -> Vec<(u64, u64, u64)> {
    // (sequence, log position, area start in bytes) of each valid area.
    let sb = tiercache_engine::read_superblock(cache).unwrap();
    let uuid = uuid_low64(&sb.uuid);
    let mut out = Vec::new();
    for area in 0..2 {
        let mut block = vec![0u8; BS];
        let start = sb.layout.checkpoint_area_start[area] * BS as u64;
        cache.read_at(start, &mut block).unwrap();
        if let Ok(h) = CheckpointHeader::decode(&block, uuid, sb.layout.checkpoint_capacity()) {
            out.push((h.sequence, h.log_position, start));
        }
    }
    out.sort();
    out
}

#[test]
fn recovery_from_the_older_checkpoint_with_the_head_past_it_opens_and_serves() {
    let mut reached = 0;
    for seed in 0..40u64 {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let (cache, backing) = devices_seg(8, 4, 64, log_only());
        let volume = open_with(cache.clone(), backing.clone(), options(100_000));
        let log_blocks = volume.superblock().layout.log_blocks;
        let mut latest = vec![0u64; 64];
        let mut version = 0;
        for _ in 0..400 {
            let b = rng.gen_range(0..64u64);
            version += 1;
            write(&volume, b, version);
            latest[b as usize] = version;
            volume.flush().unwrap();
            if rng.gen_bool(0.1) {
                volume.destage_step(8).unwrap();
            }
            let cks = checkpoint_positions(&cache);
            let (head, _, tail) = volume.log_window();
            if cks.len() == 2 && cks[0].1 < head && tail < cks[0].1 + log_blocks {
                break;
            }
        }
        let cks = checkpoint_positions(&cache);
        let (head, _, tail) = volume.log_window();
        if !(cks.len() == 2 && cks[0].1 < head && tail < cks[0].1 + log_blocks) {
            continue;
        }
        drop(volume);
        // The newest checkpoint rots.
        cache.corrupt(cks[1].2, &vec![0x55u8; BS]);
        let copy = Arc::new(SimDevice::from_image(cache.durable_image(), BS as u32));
        let inspected = Volume::inspect(copy, Some(backing.clone()), Arc::new(MonotonicClock::new())).unwrap();
        let (rhead, rck, _) = inspected.log_window();
        drop(inspected);
        if rhead > rck {
            reached += 1;
        }
        // Open must not panic (its checkpoint restores head <= checkpoint before any check).
        let volume = open_with(cache.clone(), backing.clone(), options(100_000));
        for b in 0..64u64 {
            assert_eq!(read_version(&volume, b).unwrap(), Some(latest[b as usize]), "seed {seed} block {b}");
        }
        // And it keeps working through more reclaims.
        for k in 0..200u64 {
            let b = (k * 7) % 64;
            version += 1;
            write(&volume, b, version);
            latest[b as usize] = version;
            if k % 5 == 0 {
                volume.flush().unwrap();
            }
        }
        volume.flush().unwrap();
        for b in 0..64u64 {
            assert_eq!(read_version(&volume, b).unwrap(), Some(latest[b as usize]), "seed {seed} block {b} later");
        }
    }
    assert!(reached > 0, "no seed recovered a head beyond its checkpoint: the suspicion was not exercised");
}

// ------------------------------------------------------------------------------------------
// Suspicion: the lock-order bookkeeping is a thread-local stack. A panic inside an engine
// call (here: the cache device panics during a record write, with the io lock held), caught
// by the caller as the simulators and servers do, must not leave a stale rank behind: a
// later call on the same OS thread that takes the rmw lock first would then panic falsely.

struct PanicDev {
    inner: Arc<SimDevice>,
    writes_left: AtomicU64,
}

impl BlockDevice for PanicDev {
    forward_to_inner!(inner: size_bytes, logical_block_size, read_at, flush, discard);
    fn write_at(&self, offset: u64, buf: &[u8]) -> tiercache_device::Result<()> {
        if self.writes_left.fetch_sub(1, Ordering::SeqCst) == 0 {
            panic!("the device driver panicked");
        }
        self.inner.write_at(offset, buf)
    }
    fn describe(&self) -> String {
        "panicky".into()
    }
}

#[test]
fn a_caught_panic_with_engine_locks_held_leaves_no_stale_lock_rank() {
    let (cache, backing) = devices(8, 64);
    let dev = Arc::new(PanicDev { inner: cache, writes_left: AtomicU64::new(u64::MAX) });
    let volume = open(dev.clone(), backing);
    write(&volume, 3, 1);
    dev.writes_left.store(0, Ordering::SeqCst);
    let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| volume.flush()));
    assert!(caught.is_err(), "the device's panic reaches the caller");
    // The same OS thread, another volume: rmw -> (read) -> io -> state, and destage.
    let (cache2, backing2) = devices(8, 64);
    let other = open(cache2, backing2);
    other.write_bytes(10 * BS as u64 + 7, b"unaligned").unwrap();
    other.flush().unwrap();
    other.destage_step(8).unwrap();
    other.checkpoint().unwrap();
    let mut buf = vec![0u8; 9];
    other.read_bytes(10 * BS as u64 + 7, &mut buf).unwrap();
    assert_eq!(&buf, b"unaligned");
    // And a panic inside the simulator's scheduler (thread 0 runs on this OS thread).
    let r = tiercache_sched::Sched::run(
        1,
        1_000_000,
        || {},
        |_| {
            let (cache3, backing3) = devices(8, 64);
            let dev3 = Arc::new(PanicDev { inner: cache3, writes_left: AtomicU64::new(u64::MAX) });
            let v = open(dev3.clone(), backing3);
            write(&v, 1, 1);
            dev3.writes_left.store(0, Ordering::SeqCst);
            std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| v.flush())).is_err()
        },
    );
    assert_eq!(r.ok(), Some(true));
    other.write_bytes(11 * BS as u64 + 1, b"again").unwrap();
    other.flush().unwrap();
}

// ------------------------------------------------------------------------------------------
// Suspicion: the lock ranks are per thread, not per volume. A volume used (through the public
// `BlockDevice` trait) as another volume's backing device is called from inside the outer
// volume's write-back, with the outer destage lock held: the inner volume's FLUSH then takes
// *its* io lock, a different mutex (no deadlock is possible: the inner volume never calls the
// outer one), which the checker reports as "io while holding destage" and panics. The engine
// before the split served this configuration.

struct VolumeAsDevice(Arc<Volume>);

impl BlockDevice for VolumeAsDevice {
    fn size_bytes(&self) -> u64 {
        self.0.size_bytes()
    }
    fn logical_block_size(&self) -> u32 {
        self.0.block_size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> tiercache_device::Result<()> {
        self.0
            .read_bytes(offset, buf)
            .map_err(|e| tiercache_device::DeviceError::Injected { device: format!("inner volume: {e}"), op: "read" })
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> tiercache_device::Result<()> {
        self.0
            .write_bytes(offset, buf)
            .map_err(|e| tiercache_device::DeviceError::Injected { device: format!("inner volume: {e}"), op: "write" })
    }
    fn flush(&self) -> tiercache_device::Result<()> {
        self.0
            .flush()
            .map_err(|e| tiercache_device::DeviceError::Injected { device: format!("inner volume: {e}"), op: "flush" })
    }
    fn discard(&self, _: u64, _: u64) -> tiercache_device::Result<()> {
        Ok(())
    }
    fn describe(&self) -> String {
        "inner volume".into()
    }
}

#[test]
fn a_volume_stacked_on_another_volume_writes_back() {
    let (cache_a, backing_a) = devices(8, 64);
    let inner = Arc::new(open(cache_a, backing_a));
    let backing_b: Arc<dyn BlockDevice> = Arc::new(VolumeAsDevice(Arc::clone(&inner)));
    let cache_b = {
        let log_blocks = 8 * 8;
        let ck = tiercache_format::Layout::checkpoint_blocks_for(log_blocks, BS as u32);
        Arc::new(SimDevice::new((2 + 2 * ck + log_blocks) * BS as u64, BS as u32))
    };
    tiercache_engine::create(&*cache_b, &*backing_b, &CreateOptions { segment_blocks: 8, ..log_only() }).unwrap();
    let outer = open(cache_b, backing_b);
    for b in 0..16u64 {
        write(&outer, b, 1);
    }
    outer.flush().unwrap();
    // The outer write-back writes and flushes the inner volume with the outer destage lock held.
    outer.write_back_all(1.0, |_, _| true).unwrap();
    for b in 0..16u64 {
        assert_eq!(read_version(&inner, b).unwrap(), Some(1));
    }
}

// ------------------------------------------------------------------------------------------
// Reclaim's own write-back path (a mostly dirty window), with checkpoints only from reclaim
// (the head may not pass the checkpoint), on the smallest segments: no destager runs, so
// every backing flush is reclaim's. The assertions at reclaim's and checkpoint's exits hold,
// and every block reads its newest version, before and after a power cut.

#[test]
fn reclaims_write_back_path_with_checkpoints_inside_reclaim() {
    for segments in [8u64, 9, 16] {
        let (cache, backing) = devices_seg(segments, 4, 256, log_only());
        let volume = open_with(cache.clone(), backing.clone(), options(100_000));
        let mut latest = vec![0u64; 256];
        let mut version = 0;
        let mut flushed = latest.clone();
        for round in 0..60u64 {
            for k in 0..7u64 {
                let b = (round * 13 + k * 37) % 256;
                version += 1;
                write(&volume, b, version);
                latest[b as usize] = version;
            }
            volume.flush().unwrap();
            flushed.clone_from(&latest);
        }
        let c = volume.status().counters;
        assert!(c.backing_flushes > 0, "reclaim never wrote back: {c:?}");
        assert!(c.checkpoints > 1, "no checkpoint inside reclaim: {c:?}");
        for b in 0..256u64 {
            assert_eq!(read_version(&volume, b).unwrap(), Some(latest[b as usize]), "block {b}");
        }
        drop(volume);
        cache.crash(segments);
        backing.crash(segments + 1);
        let volume = open(cache.clone(), backing.clone());
        for b in 0..256u64 {
            assert_eq!(read_version(&volume, b).unwrap(), Some(flushed[b as usize]), "block {b} after a crash");
        }
    }
}
