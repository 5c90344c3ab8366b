//! The crash simulator (`tiercache torture`): the volume on two [`SimDevice`]s, driven by one
//! seed, checked against a model after every crash.
//!
//! Each cycle: open (recover) the volume; verify every block against the model; run a random
//! number of operations (writes, FUA writes, reads checked exactly, flushes, trims, destage
//! batches, head pre-cleaning, checkpoints, background ticks) on a small log, so that
//! reclaim, checkpoints and log wrap-around happen every few dozen writes; then crash: every
//! unflushed write on both devices is dropped, applied or torn sector by sector. In some
//! cycles a device fails for good at a random I/O first, so crashes also land inside the
//! commit protocol's steps (between a record write and its flush, between a reclaim marker
//! and the overwrite, between a backing write and its flush...).
//!
//! The oracle (docs/design.md's contract): before a crash a read returns exactly the newest
//! completed write; after a crash each block reads as its last flushed version or a newer
//! completed one. Every block carries its block number and a version stamp, so a read of
//! another block's data, a torn block or garbage is told apart from a stale version.
//!
//! Single-threaded and deterministic (`--mode serial`; the concurrent simulator is this
//! crate's root module): a failure is replayed exactly from its seed and cycle.

use crate::stamp::{stamp, unstamp};
use crate::{Violation, ViolationKind};
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::sync::Arc;
use tiercache_device::{BlockDevice, FailMode, SimClock, SimDevice};
use tiercache_engine::{create, CreateOptions, Sabotage, Volume, VolumeOptions};
use tiercache_format::Layout;

const BS: usize = 4096;

#[derive(Debug, Clone, Copy)]
pub struct TortureConfig {
    pub seed: u64,
    pub cycles: u64,
    /// Most operations between two crashes.
    pub max_ops_per_cycle: u64,
    pub sabotage: Sabotage,
}

impl Default for TortureConfig {
    fn default() -> Self {
        TortureConfig { seed: 1, cycles: 100, max_ops_per_cycle: 200, sabotage: Sabotage::None }
    }
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct TortureReport {
    pub seed: u64,
    pub cycles: u64,
    pub operations: u64,
    pub crashes: u64,
    pub clean_shutdowns: u64,
    pub injected_device_failures: u64,
    pub lost_blocks: u64,
    pub stale_reads: u64,
    pub corrupt_reads: u64,
    pub unexpected_errors: u64,
    pub recovery_failures: u64,
    /// Engine activity exercised across all cycles.
    pub records_written: u64,
    /// Records handed to the record writer, and of those, written by a FLUSH, reclaim or a
    /// seal short of a buffer before the record writer's step began them.
    pub handed_off_records: u64,
    pub handed_off_records_written_by_waiters: u64,
    pub reclaimed_blocks: u64,
    pub destaged_blocks: u64,
    pub checkpoints: u64,
    pub log_wraps: u64,
    /// The first violations (at most 20).
    pub violations: Vec<Violation>,
}

impl TortureReport {
    pub fn passed(&self) -> bool {
        self.lost_blocks + self.stale_reads + self.corrupt_reads + self.unexpected_errors + self.recovery_failures == 0
    }
}

/// What the model knows of one block.
#[derive(Debug, Clone, Default)]
struct BlockModel {
    /// The version that survives any crash.
    floor: u64,
    /// Versions completed after `floor`, oldest first; the last is the current one.
    newer: Vec<u64>,
    /// Every version ever written (to tell "stale" from "garbage").
    all: Vec<u64>,
}

impl BlockModel {
    fn current(&self) -> u64 {
        *self.newer.last().unwrap_or(&self.floor)
    }
}

struct Harness {
    seed: u64,
    cycle: u64,
    rng: ChaCha8Rng,
    cache: Arc<SimDevice>,
    backing: Arc<SimDevice>,
    clock: SimClock,
    blocks: u64,
    model: Vec<BlockModel>,
    next_version: u64,
    options: VolumeOptions,
    max_ops: u64,
    /// Sealed records go to a record writer (this thread, at random steps): `hands_off_records_for`.
    hands_off: bool,
    report: TortureReport,
}

impl Harness {
    fn violation(&mut self, kind: ViolationKind, block: Option<u64>, detail: String) {
        match kind {
            ViolationKind::LostWrite => self.report.lost_blocks += 1,
            ViolationKind::StaleRead => self.report.stale_reads += 1,
            ViolationKind::CorruptRead => self.report.corrupt_reads += 1,
            ViolationKind::RecoveryFailed => self.report.recovery_failures += 1,
            _ => self.report.unexpected_errors += 1,
        }
        if self.report.violations.len() < 20 {
            self.report.violations.push(Violation { seed: self.seed, cycle: self.cycle, kind, block, detail });
        }
    }

    fn open(&mut self) -> Option<Volume> {
        let cache: Arc<dyn BlockDevice> = self.cache.clone();
        let backing: Arc<dyn BlockDevice> = self.backing.clone();
        match Volume::open(cache, backing, Arc::new(self.clock.clone()), self.options) {
            Ok((v, _)) => {
                if self.hands_off {
                    // (This thread is the record writer: a step of `run_cycle`.)
                    v.set_record_writer(Some(std::thread::current()));
                }
                Some(v)
            }
            Err(e) => {
                self.violation(ViolationKind::RecoveryFailed, None, e.to_string());
                None
            }
        }
    }

    /// Checks one block read after a crash, then makes what was read the model's truth.
    fn check_after_crash(&mut self, block: u64, data: &[u8]) {
        let m = &self.model[block as usize];
        match unstamp(data) {
            Some((b, v)) if b == block => {
                let allowed = v == m.floor || m.newer.contains(&v);
                if !allowed {
                    if m.all.contains(&v) {
                        let detail = format!("read version {v}, last flushed {}, newer {:?}", m.floor, m.newer);
                        self.violation(ViolationKind::LostWrite, Some(block), detail);
                    } else {
                        self.violation(
                            ViolationKind::CorruptRead,
                            Some(block),
                            format!("version {v} was never written here"),
                        );
                    }
                }
                let m = &mut self.model[block as usize];
                m.floor = v;
                m.newer.clear();
            }
            Some((b, v)) => {
                self.violation(
                    ViolationKind::CorruptRead,
                    Some(block),
                    format!("holds block {b}'s data (version {v})"),
                );
            }
            None => self.violation(ViolationKind::CorruptRead, Some(block), "torn or garbage data served".into()),
        }
    }

    /// Checks one block read during a run: exactly the current version.
    fn check_live(&mut self, block: u64, data: &[u8]) {
        let m = &self.model[block as usize];
        let expect = m.current();
        match unstamp(data) {
            Some((b, v)) if b == block && v == expect => {}
            Some((b, v)) if b == block && m.all.contains(&v) => {
                self.violation(ViolationKind::StaleRead, Some(block), format!("read version {v}, expected {expect}"));
            }
            Some((b, v)) => {
                self.violation(ViolationKind::CorruptRead, Some(block), format!("read block {b} version {v}"))
            }
            None => self.violation(ViolationKind::CorruptRead, Some(block), "torn or garbage data".into()),
        }
    }

    fn verify_all(&mut self, volume: &Volume) {
        let mut buf = vec![0u8; BS];
        for block in 0..self.blocks {
            match volume.read(block * BS as u64, &mut buf) {
                Ok(()) => self.check_after_crash(block, &buf),
                Err(e) => {
                    self.violation(ViolationKind::LostWrite, Some(block), format!("read after recovery failed: {e}"))
                }
            }
        }
    }

    fn pick_block(&mut self) -> u64 {
        // Skewed: most writes go to a hot quarter, so blocks are overwritten often.
        if self.rng.gen_bool(0.7) {
            self.rng.gen_range(0..(self.blocks / 4).max(1))
        } else {
            self.rng.gen_range(0..self.blocks)
        }
    }

    /// Failed device operations so far (both devices; the counters never reset).
    fn failed_ops(&self) -> u64 {
        self.cache.stats().failed_ops + self.backing.stats().failed_ops
    }

    fn run_cycle(&mut self, volume: &Volume, faults_armed: bool, failed_before: u64) -> bool {
        let ops = self.rng.gen_range(1..=self.max_ops);
        for _ in 0..ops {
            self.report.operations += 1;
            if self.hands_off && self.rng.gen_bool(0.3) {
                // The record writer's turn: what writers handed off is written (or, not
                // taken, left for a FLUSH, reclaim or a seal short of a buffer).
                if let Err(e) = volume.write_handed_off_records() {
                    let injected = self.failed_ops() > failed_before;
                    if !(faults_armed && injected) {
                        self.violation(ViolationKind::UnexpectedError, None, e.to_string());
                    }
                    return false;
                }
            }
            let dice = self.rng.gen_range(0..100);
            let ok = match dice {
                0..=44 => {
                    let fua = dice >= 40;
                    let start = self.pick_block();
                    let n = self.rng.gen_range(1..=8).min(self.blocks - start);
                    let mut data = vec![0u8; n as usize * BS];
                    let versions: Vec<u64> = (0..n).map(|i| self.next_version + i).collect();
                    self.next_version += n;
                    for (i, v) in versions.iter().enumerate() {
                        stamp(start + i as u64, *v, &mut data[i * BS..(i + 1) * BS]);
                    }
                    let r = if fua {
                        volume.write_fua(start * BS as u64, &data)
                    } else {
                        volume.write(start * BS as u64, &data)
                    };
                    for (i, v) in versions.iter().enumerate() {
                        let m = &mut self.model[(start + i as u64) as usize];
                        m.newer.push(*v);
                        m.all.push(*v);
                        if r.is_ok() && fua {
                            m.floor = *v;
                            m.newer.clear();
                        }
                    }
                    r.map(|_| ())
                }
                45..=69 => {
                    let start = self.pick_block();
                    let n = self.rng.gen_range(1..=8).min(self.blocks - start);
                    let mut data = vec![0u8; n as usize * BS];
                    let r = volume.read(start * BS as u64, &mut data);
                    if r.is_ok() {
                        for i in 0..n {
                            let chunk = data[i as usize * BS..(i as usize + 1) * BS].to_vec();
                            self.check_live(start + i, &chunk);
                        }
                    }
                    r
                }
                70..=79 => {
                    let r = volume.flush();
                    if r.is_ok() {
                        for m in &mut self.model {
                            m.floor = m.current();
                            m.newer.clear();
                        }
                    }
                    r
                }
                80..=82 => {
                    let start = self.pick_block();
                    let n = self.rng.gen_range(1..=4).min(self.blocks - start);
                    // A TRIM is a hint: the block keeps reading as its last write.
                    volume.discard(start * BS as u64, n * BS as u64)
                }
                83..=89 => volume.destage_step(self.rng.gen_range(1..64)).map(|_| ()),
                90..=93 => volume.destage_oldest(self.rng.gen_range(1..32)).map(|_| ()),
                94..=95 => volume.checkpoint(),
                _ => volume.background_tick(),
            };
            if let Err(e) = ok {
                let injected = self.failed_ops() > failed_before;
                if !(faults_armed && injected) {
                    self.violation(ViolationKind::UnexpectedError, None, e.to_string());
                }
                return false; // stop and crash
            }
        }
        true
    }
}

/// Runs the simulator; `progress(cycle)` is called after each cycle.
pub fn run(config: TortureConfig, mut progress: impl FnMut(u64)) -> TortureReport {
    let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
    let segment_blocks = 8u32;
    let log_segments = rng.gen_range(8..=24u64);
    let log_blocks = log_segments * u64::from(segment_blocks);
    let ck = Layout::checkpoint_blocks_for(log_blocks, BS as u32);
    let cache_bytes = (2 + 2 * ck + log_blocks) * BS as u64;
    let blocks = rng.gen_range(64..=512u64);
    let clock = SimClock::new();
    let cache = Arc::new(SimDevice::new(cache_bytes, BS as u32).with_name("cache"));
    let backing_image: Vec<u8> = (0..blocks)
        .flat_map(|b| {
            let mut v = vec![0u8; BS];
            stamp(b, 0, &mut v);
            v
        })
        .collect();
    let backing = Arc::new(SimDevice::from_image(backing_image, BS as u32).with_name("backing"));
    let mut h = Harness {
        seed: config.seed,
        cycle: 0,
        rng,
        cache,
        backing,
        clock,
        blocks,
        model: vec![BlockModel { all: vec![0], ..BlockModel::default() }; blocks as usize],
        next_version: 1,
        options: VolumeOptions {
            sabotage: config.sabotage,
            eviction: crate::eviction_for(config.seed),
            write_back_batch_bounds: crate::write_back_batch_bounds_for(config.seed),
            preclean_idle_age_ms: crate::preclean_idle_age_ms_for(config.seed),
            ..VolumeOptions::default()
        },
        max_ops: config.max_ops_per_cycle.max(1),
        hands_off: crate::hands_off_records_for(config.seed),
        report: TortureReport { seed: config.seed, ..TortureReport::default() },
    };
    // The probation ring in three quarters of the seeds (their own stream; see lib.rs).
    let probation_permille = if ChaCha8Rng::seed_from_u64(config.seed ^ 0x960b_a710).gen_bool(0.75) { 250 } else { 0 };
    let opts = CreateOptions {
        segment_blocks,
        probation_permille,
        uuid: Some(config.seed.to_le_bytes().repeat(2).try_into().unwrap()),
        ..CreateOptions::default()
    };
    if let Err(e) = create(&*h.cache, &*h.backing, &opts) {
        h.violation(ViolationKind::RecoveryFailed, None, format!("create failed: {e}"));
        return h.report;
    }
    for cycle in 0..config.cycles {
        h.cycle = cycle;
        h.report.cycles = cycle + 1;
        let Some(volume) = h.open() else { break };
        if cycle > 0 {
            h.verify_all(&volume);
        }
        // Arm a device failure in some cycles, so that crashes land inside multi-step work.
        let failed_before = h.failed_ops();
        let mut armed = false;
        if h.rng.gen_bool(0.3) {
            let n = h.rng.gen_range(0..400);
            if h.rng.gen_bool(0.7) {
                h.cache.fail_after(None, n, FailMode::Forever);
            } else {
                h.backing.fail_after(None, n, FailMode::Forever);
            }
            armed = true;
        }
        let completed = h.run_cycle(&volume, armed, failed_before);
        let st = volume.status();
        h.report.records_written += st.counters.records_written;
        h.report.handed_off_records += st.counters.handed_off_records;
        h.report.handed_off_records_written_by_waiters += st.counters.handed_off_records_written_by_waiters;
        h.report.reclaimed_blocks += st.counters.reclaimed_blocks;
        h.report.destaged_blocks += st.counters.destaged_blocks;
        h.report.checkpoints += st.counters.checkpoints;
        h.report.log_wraps = st.log_tail / log_blocks;
        let injected = h.failed_ops() > failed_before;
        if injected {
            h.report.injected_device_failures += 1;
        }
        if completed && !armed && h.rng.gen_bool(0.1) {
            // A clean shutdown: everything flushed, nothing may be lost or replayed wrongly.
            if let Err(e) = volume.shutdown() {
                h.violation(ViolationKind::UnexpectedError, None, format!("shutdown: {e}"));
            } else {
                for m in &mut h.model {
                    m.floor = m.current();
                    m.newer.clear();
                }
            }
            drop(volume);
            h.report.clean_shutdowns += 1;
            h.cache.clear_faults();
            h.backing.clear_faults();
        } else {
            drop(volume);
            let (a, b) = (h.rng.gen(), h.rng.gen());
            h.cache.crash(a);
            h.backing.crash(b);
            h.report.crashes += 1;
        }
        progress(cycle);
        if h.report.violations.len() >= 20 {
            break;
        }
    }
    // A final recovery and check after the last cycle.
    if h.report.passed() {
        h.cycle = config.cycles;
        if let Some(volume) = h.open() {
            h.verify_all(&volume);
        }
    }
    h.report
}

#[cfg(test)]
mod seeds {
    //! Simulation seeds under `cargo test`: the contract holds, and each deliberately broken
    //! commit order is caught.
    use super::*;

    #[test]
    fn many_seeds_pass() {
        let (mut handed_off, mut by_waiters) = (0, 0);
        for seed in 0..24 {
            let r = run(TortureConfig { seed, cycles: 60, max_ops_per_cycle: 150, sabotage: Sabotage::None }, |_| {});
            assert!(r.passed(), "seed {seed}: {:#?}", r.violations);
            assert!(r.reclaimed_blocks > 0 && r.checkpoints > 0 && r.destaged_blocks > 0, "seed {seed}: {r:?}");
            handed_off += r.handed_off_records;
            by_waiters += r.handed_off_records_written_by_waiters;
        }
        // The record writer's seeds hand records off, and a FLUSH, reclaim or a seal short of
        // a buffer writes some before the record writer's step does.
        assert!(handed_off > 100 && by_waiters > 10, "handed off {handed_off}, written by waiters {by_waiters}");
    }

    #[test]
    fn every_broken_commit_order_is_caught() {
        for sabotage in &Sabotage::ALL[..3] {
            let sabotage = *sabotage;
            let caught = (0..40).any(|seed| {
                !run(TortureConfig { seed, cycles: 200, max_ops_per_cycle: 200, sabotage }, |_| {}).passed()
            });
            assert!(caught, "{} was not caught", sabotage.name());
        }
    }
}
