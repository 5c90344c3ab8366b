//! tiercache's concurrent crash simulator (`tiercache torture`, the default mode).
//!
//! One seed drives one whole run, replayed exactly: the geometry, every actor's choices, the
//! device latencies, the faults, the crash points and the thread interleaving (a
//! deterministic cooperative scheduler, `tiercache-sched`: one OS thread per actor, one runs
//! at a time, switching at every engine lock and every device I/O).
//!
//! Each cycle, on a small log (so reclaim, checkpoints and wrap-around happen constantly):
//! - client actors (1 to 3, each owning a range of blocks, as a database owns its files):
//!   full-block writes, identical rewrites, FUA writes, partial-block and unaligned writes
//!   (read-modify-write), write-zeroes (aligned and not), discards, reads checked exactly,
//!   flushes, back to back; or, in some cycles, writes only (a bulk load), writes and
//!   flushes paced slower than the staging age (each write sealed into its own record), or
//!   a circular redo log: one FLUSH per write, each block read and rewritten when the log's
//!   tail comes back to the cache slot its last version landed in (a white-box adversary
//!   for anything that names a slot where it means a version), while the backing device's
//!   flushes run 5 to 10 times slower so that one write-back spans laps of the log;
//!   after a crash a client may first redo its writes not known durable, byte for byte, all
//!   of them then a FLUSH, or a run of them cut anywhere and then new work (a journal
//!   replayed from the database's own checkpoint, its end torn);
//! - a destager actor (write-back batches, the head pre-cleaner; in some cycles it starts
//!   late) and a background actor (background ticks, forced checkpoints at a rate drawn per
//!   cycle, none in some);
//! - in some cycles, a corrupter: silent corruption of durable cache blocks holding data
//!   (clean or dirty), and latent read errors; and device failures at a random I/O;
//! - a crasher: power is cut (both devices at once, mid-operation) at a random step of the
//!   run, or at the first moment after it at which the cache device holds several written
//!   but unflushed blocks (records between two FLUSHes: a crash can drop one and keep the
//!   next); in some recoveries too, so crashes land inside recovery and its checkpoint.
//!
//! Half the seeds are journal-replay seeds (swarm testing: most actors left out, so that a
//! rare shape becomes common): one client bulk-loads without FLUSH, power is cut when the
//! first one to three records of a run wait unflushed, and after every crash the client redoes a prefix of the writes it lost. A
//! crash that drops a run's first record and keeps the next leaves a stale record exactly
//! where the redo rebuilds the dropped one byte for byte.
//!
//! After a crash the oracle reads every block back, one request per block or in requests
//! too large to be admitted to the cache (so the first record written after recovery is
//! the clients' own again).
//!
//! Devices run on virtual time: the cache fast, the backing device slow (milliseconds per
//! write and up to hundreds per flush), so the log laps several times during one write-back.
//! After the crash every unflushed write on both devices is dropped, applied or torn.
//!
//! The oracle knows, for every block, which contents a read may return: live, exactly the
//! client's last completed write (or an I/O error once its only dirty copy was corrupted);
//! after a crash, the last flushed content or any content completed (or attempted) after it,
//! or an I/O error if corruption hit it. It counts lost writes, stale reads, corrupt reads
//! (never written), wrongly lost blocks (EIO without corruption), unexpected errors,
//! recovery failures, panics and deadlocks.

#![forbid(unsafe_code)]

pub mod serial;
pub mod stamp;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;
use std::collections::hash_map::DefaultHasher;
use std::collections::HashMap;
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tiercache_device::{BlockDevice, Clock, FailMode, OpKind, ReadRange, SimClock, SimDevice};
use tiercache_engine::{
    create, CreateOptions, EngineError, Eviction, Role, Sabotage, Volume, VolumeOptions, WriteAroundPolicy,
};
use tiercache_format::Layout;
use tiercache_sched::{yield_now, Joined, Sched};

const BS: usize = 4096;
/// Virtual time that passes at each scheduling point.
const QUANTUM_NS: u64 = 100_000;
/// Scheduling points one seed may take before it is declared stuck (a deadlock or livelock).
const MAX_STEPS: u64 = 20_000_000;
/// Scheduling steps as long as the engine's staging age (virtual time passes per step).
const PACED_PAUSE_STEPS: u64 = tiercache_engine::constants::STAGING_MAX_AGE_MS * 1_000_000 / QUANTUM_NS;
/// Blocks per read request when the oracle reads the volume back without admitting it to
/// the cache (larger than `ADMIT_MAX_REQUEST_BYTES`).
const WHOLE_READ_BLOCKS: u64 = 2 * tiercache_engine::constants::ADMIT_MAX_REQUEST_BYTES / BS as u64;
/// The share of journal-replay seeds (see `run_in`), and how many more cycles they run (each
/// is short: power is cut within the first few records).
const QUIET_SHARE: f64 = 0.5;
const QUIET_CYCLES_FACTOR: u64 = 4;

/// What to run.
#[derive(Debug, Clone, Copy)]
pub struct SimConfig {
    pub seed: u64,
    /// Crash cycles.
    pub cycles: u64,
    /// Most operations per client per cycle.
    pub ops: u64,
    pub sabotage: Sabotage,
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig { seed: 1, cycles: 5, ops: 40, sabotage: Sabotage::None }
    }
}

/// Kinds of contract violation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ViolationKind {
    /// After a crash, a block reads older than its last flushed content.
    LostWrite,
    /// Live, a block reads other than its last completed write.
    StaleRead,
    /// Data that was never written to that block (torn, garbage, another block's).
    CorruptRead,
    /// An I/O error "lost block" for a block whose data was never corrupted.
    WronglyLost,
    UnexpectedError,
    RecoveryFailed,
    Panic,
    /// The run stopped making progress (deadlock or livelock).
    Stuck,
}

impl ViolationKind {
    /// The kind's name, as in the JSON report.
    pub fn name(self) -> &'static str {
        match self {
            ViolationKind::LostWrite => "lost_write",
            ViolationKind::StaleRead => "stale_read",
            ViolationKind::CorruptRead => "corrupt_read",
            ViolationKind::WronglyLost => "wrongly_lost",
            ViolationKind::UnexpectedError => "unexpected_error",
            ViolationKind::RecoveryFailed => "recovery_failed",
            ViolationKind::Panic => "panic",
            ViolationKind::Stuck => "stuck",
        }
    }
}

impl std::fmt::Display for ViolationKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One violation, with what is needed to replay it.
#[derive(Debug, Clone, Serialize)]
pub struct Violation {
    pub seed: u64,
    pub cycle: u64,
    pub kind: ViolationKind,
    pub block: Option<u64>,
    pub detail: String,
}

#[derive(Debug, Clone, Default, Serialize)]
pub struct SimReport {
    pub seed: u64,
    pub cycles: u64,
    pub operations: u64,
    pub crashes: u64,
    pub crashes_during_recovery: u64,
    pub clean_shutdowns: u64,
    pub device_failures: u64,
    pub corruptions: u64,
    pub latent_read_errors: u64,
    pub lost_block_errors: u64,
    pub scheduling_steps: u64,
    pub records_written: u64,
    /// Records sealed while an older one's write was in progress (the record pipeline).
    pub overlapped_record_writes: u64,
    /// Records a lone writer wrote while staging the rest of its request, and of those, the
    /// next ones it sealed and wrote while its previous was still in flight.
    pub staged_during_record_writes: u64,
    pub nested_record_writes: u64,
    /// Records handed to the record writer, and of those, written by a thread that needed
    /// them written before the record writer began them (`hands_off_records_for`).
    pub handed_off_records: u64,
    pub handed_off_records_written_by_waiters: u64,
    /// Of the records handed off, those a reader sealed (`Volume::try_hand_off_staging`).
    pub handed_off_by_readers: u64,
    /// Dirty blocks the pre-cleaner left to a sequential writer about to supersede them
    /// (`Streams::sweeping`; the stream clients' laps).
    pub preclean_swept_blocks: u64,
    /// Dirty blocks the pre-cleaner wrote back beyond its horizon (`preclean_idle_age_ms_for`).
    pub preclean_idle_blocks: u64,
    /// Write-back batches the pre-cleaner ran at the gentle pace (`Pace::Gentle`).
    pub gentle_write_back_batches: u64,
    pub destaged_blocks: u64,
    pub reclaimed_blocks: u64,
    pub copied_forward_blocks: u64,
    /// Reclaims that copied a window dense in dirty blocks forward instead of writing it
    /// back (measured cheaper), and reclaims that wrote dirty blocks back themselves.
    pub dense_copy_forwards: u64,
    /// Of those, windows too dense to free an eighth, copied because the log had room.
    pub dense_copy_throughs: u64,
    pub reclaim_write_backs: u64,
    /// Reads whose cache hits lay in several runs, read in flight together (in an order the
    /// cache device's seed draws).
    pub batched_cache_reads: u64,
    /// Clean blocks read since cached that reclaim kept (the eviction policy's reinsertion).
    pub reinserted_blocks: u64,
    /// Misses admitted into the probation ring, and those read again there and staged into
    /// the log.
    pub probation_admitted_blocks: u64,
    pub promoted_blocks: u64,
    /// Probation batches the record writer actor wrote (a reader handed them off).
    pub probation_batches_by_record_writer: u64,
    /// Blocks the clients wrote around the cache, straight to the backing device.
    pub written_around_blocks: u64,
    /// Write-arounds that began while another was under way.
    pub concurrent_write_arounds: u64,
    /// Write-arounds below the high watermark because the log's head was densely dirty.
    pub written_around_at_dirty_head: u64,
    /// Write-arounds begun beside a write-back batch, not waiting for it.
    pub written_around_beside_write_back: u64,
    /// Records written right after a write was acknowledged (`Volume::write_ahead`).
    pub records_written_ahead: u64,
    pub checkpoints: u64,
    pub log_laps: u64,
    pub violations: Vec<Violation>,
}

impl SimReport {
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }
}

/// A device on virtual time: each I/O is a scheduling point and waits (yielding) for its
/// latency, drawn from the device's range, before it takes effect.
struct TimedDevice {
    inner: Arc<SimDevice>,
    clock: SimClock,
    read_ns: (u64, u64),
    write_ns: (u64, u64),
    flush_ns: (u64, u64),
    /// Chance that an I/O stalls ten times longer (a slow device's hiccup).
    stall: f64,
    /// Flushes take this many times longer (set per cycle: a RAID5 rebuilding, say).
    flush_scale: Arc<AtomicU64>,
    rng: Mutex<ChaCha8Rng>,
    /// Where a write's overlapped work runs (`write_at_while`): a stream of its own, so that
    /// drawing it leaves the latencies' stream as it was.
    overlap_rng: Mutex<ChaCha8Rng>,
}

impl TimedDevice {
    fn wait(&self, (lo, hi): (u64, u64)) {
        yield_now();
        let ns = {
            let mut rng = self.rng.lock().expect("rng");
            let ns = rng.gen_range(lo..=hi);
            if rng.gen_bool(self.stall) {
                ns * 10
            } else {
                ns
            }
        };
        let deadline = self.clock.now_ns() + ns;
        while self.clock.now_ns() < deadline {
            yield_now();
        }
    }
}

impl BlockDevice for TimedDevice {
    fn size_bytes(&self) -> u64 {
        self.inner.size_bytes()
    }
    fn logical_block_size(&self) -> u32 {
        self.inner.logical_block_size()
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> tiercache_device::Result<()> {
        self.wait(self.read_ns);
        self.inner.read_at(offset, buf)
    }
    fn read_vectored_at(&self, offset: u64, bufs: &mut [&mut [u8]]) -> tiercache_device::Result<()> {
        // One I/O, as the device's scatter read is (not one per buffer).
        self.wait(self.read_ns);
        self.inner.read_vectored_at(offset, bufs)
    }
    fn read_batch(&self, ranges: &mut [ReadRange<'_>]) -> Vec<tiercache_device::Result<()>> {
        // In flight together: one latency, then the device serves them in a seeded order.
        self.wait(self.read_ns);
        self.inner.read_batch(ranges)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> tiercache_device::Result<()> {
        self.wait(self.write_ns);
        self.inner.write_at(offset, buf)
    }
    fn write_batch(&self, writes: &[(u64, &[u8])]) -> Vec<tiercache_device::Result<()>> {
        // In flight together: one latency, then the device lands them in a seeded order.
        self.wait(self.write_ns);
        self.inner.write_batch(writes)
    }
    fn write_at_while(&self, offset: u64, buf: &[u8], during: &mut dyn FnMut()) -> tiercache_device::Result<()> {
        // In flight while `during` runs: it runs (seeded) before the latency, between the
        // latency and the data landing, or after, and other actors interleave around it.
        let at = self.overlap_rng.lock().expect("rng").gen_range(0..3u8);
        if at == 0 {
            during();
        }
        self.wait(self.write_ns);
        if at == 1 {
            during();
        }
        let written = self.inner.write_at(offset, buf);
        if at == 2 {
            during();
        }
        written
    }
    fn flush(&self) -> tiercache_device::Result<()> {
        let scale = self.flush_scale.load(Ordering::Relaxed);
        self.wait((self.flush_ns.0 * scale, self.flush_ns.1 * scale));
        self.inner.flush()
    }
    fn discard(&self, offset: u64, len: u64) -> tiercache_device::Result<()> {
        self.wait(self.write_ns);
        self.inner.discard(offset, len)
    }
    fn describe(&self) -> String {
        self.inner.describe()
    }
    fn atomic_write_bytes(&self) -> u32 {
        self.inner.atomic_write_bytes()
    }
}

/// Debugging aid: `SIM_TRACE_BLOCK=N` prints every event of block N, and the log on the
/// cache device after each crash. (It also takes an index snapshot after each recovery,
/// which is a scheduling point: a traced run can take another path than the untraced one.)
fn trace(block: u64, what: impl FnOnce() -> String) {
    static WATCH: std::sync::OnceLock<Option<u64>> = std::sync::OnceLock::new();
    let watch = WATCH.get_or_init(|| std::env::var("SIM_TRACE_BLOCK").ok().and_then(|s| s.parse().ok()));
    if *watch == Some(block) {
        eprintln!("[block {block}] {}", what());
    }
}

fn hash(data: &[u8]) -> u64 {
    let mut h = DefaultHasher::new();
    data.hash(&mut h);
    h.finish()
}

/// What the oracle knows of one block. Contents are hashes; `None` is "lost" (reads fail).
#[derive(Debug, Clone)]
struct BlockModel {
    /// The content that survives any crash.
    floor: Option<u64>,
    /// Contents completed after `floor`: (content, step when its write started, step when it
    /// completed). A FLUSH covers writes completed before it started; a corruption is
    /// superseded only by a write that started after it (a write in progress may already
    /// have put its data in the log where the corruption hit).
    newer: Vec<(u64, u64, u64)>,
    /// Contents of writes that failed or were cut: they may or may not have landed.
    maybe: Vec<u64>,
    /// The newest completed content's bytes (`None`: known lost).
    current: Option<Vec<u8>>,
    /// Every content ever written here (to tell stale from garbage).
    all: Vec<u64>,
    /// The content a "lost block" error hid: write-back may still have put exactly that
    /// version on the backing device, and then it reads again.
    lost_bytes: Option<Vec<u8>>,
    /// Set when a durable cache copy of this block's dirty data was corrupted: reads may fail
    /// with "lost block" until a write completed after it is flushed.
    corrupted_at: Option<u64>,
}

#[derive(Default)]
struct Counters {
    operations: AtomicU64,
    corruptions: AtomicU64,
    latent: AtomicU64,
    lost_errors: AtomicU64,
}

/// Everything the actors share. The model is behind a std mutex held only between
/// scheduling points, so it never interleaves.
struct World {
    seed: u64,
    cycle: AtomicU64,
    model: Mutex<Vec<BlockModel>>,
    violations: Mutex<Vec<Violation>>,
    next_version: AtomicU64,
    /// Power was cut (or a device failed) this cycle: errors are expected from then on.
    faulted: AtomicBool,
    counters: Counters,
    /// Per client: the writes since its last flush (offset, bytes), to redo after a crash.
    redo: Mutex<Vec<RedoLog>>,
    cache: Arc<SimDevice>,
    backing: Arc<SimDevice>,
    /// Content hash -> a readable name (for violation reports).
    names: Mutex<std::collections::HashMap<u64, String>>,
    /// Failed device operations when the cycle began: more means a fault was injected.
    failed_base: AtomicU64,
    /// The virtual clock the devices wait on, which the volume reads too: its timings (the
    /// staging age, the pre-cleaner's horizon, reclaim's measured costs) follow the devices'
    /// latencies, step by step, the same in every replay of a seed.
    clock: SimClock,
}

impl World {
    fn failed_ops(&self) -> u64 {
        self.cache.stats().failed_ops + self.backing.stats().failed_ops
    }

    /// Whether errors are to be expected: power was cut or a device operation failed.
    fn fault_seen(&self) -> bool {
        self.faulted.load(Ordering::Relaxed) || self.failed_ops() > self.failed_base.load(Ordering::Relaxed)
    }

    fn violation(&self, kind: ViolationKind, block: Option<u64>, detail: String) {
        let mut v = self.violations.lock().expect("violations");
        if v.len() < 20 {
            v.push(Violation { seed: self.seed, cycle: self.cycle.load(Ordering::Relaxed), kind, block, detail });
        }
    }

    /// A write of `data` at block `first`, started at `started`, completed at `step`.
    fn completed(&self, first: u64, data: &[u8], started: u64, step: u64, fua: bool) {
        let mut m = self.model.lock().expect("model");
        for (i, chunk) in data.chunks(BS).enumerate() {
            let b = &mut m[(first + i as u64) as usize];
            let h = hash(chunk);
            self.names.lock().expect("names").insert(h, describe(first + i as u64, chunk));
            trace(first + i as u64, || {
                format!("completed {} at step {step} fua {fua}", describe(first + i as u64, chunk))
            });
            b.all.push(h);
            b.current = Some(chunk.to_vec());
            if fua {
                b.floor = Some(h);
                b.newer.clear();
                if b.corrupted_at.is_some_and(|c| c < started) {
                    b.corrupted_at = None;
                }
            } else {
                b.newer.push((h, started, step));
            }
        }
    }

    fn attempted(&self, first: u64, data: &[u8]) {
        let mut m = self.model.lock().expect("model");
        for (i, chunk) in data.chunks(BS).enumerate() {
            let b = &mut m[(first + i as u64) as usize];
            let h = hash(chunk);
            self.names.lock().expect("names").insert(h, describe(first + i as u64, chunk));
            b.all.push(h);
            b.maybe.push(h);
        }
    }

    /// A FLUSH that started at `start` returned Ok: every write completed before it is
    /// durable, whichever client wrote it, and leaves the clients' redo logs.
    fn flushed(&self, start: u64) {
        for log in self.redo.lock().expect("redo").iter_mut() {
            log.retain(|&(_, _, step)| step >= start);
        }
        let mut m = self.model.lock().expect("model");
        for b in m.iter_mut() {
            if let Some(k) = b.newer.iter().rposition(|&(_, _, step)| step < start) {
                let (h, started, _) = b.newer[k];
                b.floor = Some(h);
                b.newer.drain(..=k);
                if b.corrupted_at.is_some_and(|c| c < started) {
                    b.corrupted_at = None;
                }
            }
        }
    }
}

/// A client's writes not known durable: (byte offset, data, step when it completed).
type RedoLog = Vec<(u64, Vec<u8>, u64)>;

/// One client's view: it owns blocks `lo..hi` and is their only writer.
struct Client {
    id: usize,
    lo: u64,
    hi: u64,
    rng: ChaCha8Rng,
    ops: u64,
    redo: Redo,
    profile: Profile,
    /// Ring profile: the ring's size in blocks, and commits per lap of the cache's log.
    ring: u64,
    lap_commits: u64,
    /// Stream profile: the next block to write.
    stream_next: u64,
    /// The last spans read (up to 16), which a later read may read again.
    recent_reads: std::collections::VecDeque<(u64, u64)>,
    /// In some cycles: after half its writes, the client writes the staged record ahead, as
    /// the NBD server does for a client committing one write at a time
    /// (`Volume::write_ahead`). Its own stream, so that a cycle's other choices stay as they
    /// were.
    ahead: Option<ChaCha8Rng>,
}

/// The shape of a cycle's client work.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Profile {
    /// Every kind of operation, back to back.
    Mixed,
    /// Writes only (a bulk load): records hold nothing but the clients' own blocks.
    Burst,
    /// Writes, identical rewrites and flushes with pauses longer than the staging age
    /// between them (a quiet database): the background writer seals each write into its own
    /// record, so records written before a crash are the easiest to write again after it.
    Paced,
    /// A circular redo log (InnoDB's log files): the client's first blocks written in turn,
    /// each write followed by a FLUSH (one commit per write), for several laps of the cache's
    /// log; then a lap of commits elsewhere and a read of the ring. A ring block's versions
    /// keep landing in the slots its older versions held, while the slow backing flush of a
    /// write-back is still running: the shape in which naming a slot instead of a version
    /// marks the wrong version clean, and the read after the lap finds it evicted.
    Ring,
    /// Large sequential writes through the client's range, a FLUSH every eight or so (a
    /// restore, a bulk load): write-arounds from several clients. (They seldom overlap in
    /// time here: on the simulator's tiny logs nearly every record needs a reclaim, whose
    /// settle waits for the write-arounds under way and lets none begin.)
    Stream,
}

/// What a client does first after a crash with the writes it completed but never flushed.
#[derive(Debug, Clone, Copy)]
enum Redo {
    /// Nothing: they are gone or not, as the volume decided.
    Nothing,
    /// All of them, byte for byte, then a FLUSH (a database replaying its journal).
    All,
    /// A run of them, byte for byte, then new work without a FLUSH (a journal replayed from
    /// the database's own checkpoint, its end torn): the log is rebuilt exactly up to some
    /// record, then diverges. A stale record left beyond one the crash discarded must not
    /// chain onto the rebuilt one.
    Part,
    /// As `Part`, always from the first write: the log is rebuilt from the first record the
    /// crash discarded (journal-replay seeds).
    Prefix,
}

/// Why an actor stopped early.
enum Stop {
    Error,
}

fn fresh(world: &World, block: u64) -> Vec<u8> {
    let v = world.next_version.fetch_add(1, Ordering::Relaxed);
    let mut out = vec![0u8; BS];
    stamp::stamp(block, v, &mut out);
    out
}

impl Client {
    fn run(mut self, world: &World, volume: &Volume, sched: &Sched, cache: &SimDevice, backing: &SimDevice) {
        if !matches!(self.redo, Redo::Nothing) {
            let mut redo = std::mem::take(&mut world.redo.lock().expect("redo")[self.id]);
            if matches!(self.redo, Redo::Part | Redo::Prefix) {
                // A run of blocks, cut anywhere, inside multi-block writes too (records hold
                // blocks, not writes); from the start, or from where the database's own
                // checkpoint left off.
                let total: usize = redo.iter().map(|(_, d, _)| d.len() / BS).sum::<usize>().max(1);
                let from_start = matches!(self.redo, Redo::Prefix) || self.rng.gen_bool(0.5);
                let mut skip = if from_start { 0 } else { self.rng.gen_range(0..total) };
                let mut keep = self.rng.gen_range(1..=total - skip);
                redo = redo
                    .into_iter()
                    .filter_map(|(offset, d, step)| {
                        let n = d.len() / BS;
                        let from = skip.min(n);
                        skip -= from;
                        let take = (n - from).min(keep);
                        keep -= take;
                        (take > 0)
                            .then(|| (offset + (from * BS) as u64, d[from * BS..(from + take) * BS].to_vec(), step))
                    })
                    .collect();
            }
            for (offset, data, _) in redo {
                self.pause(sched);
                if self.write(world, volume, sched, offset / BS as u64, data, false).is_err() {
                    return;
                }
            }
            if matches!(self.redo, Redo::All) && self.flush(world, volume, sched).is_err() {
                return;
            }
        }
        if self.profile == Profile::Ring {
            let _ = self.ring_run(world, volume, sched, cache);
            return;
        }
        for _ in 0..self.ops {
            world.counters.operations.fetch_add(1, Ordering::Relaxed);
            let failed_before = cache.stats().failed_ops + backing.stats().failed_ops;
            let op = match self.profile {
                Profile::Mixed | Profile::Ring => self.rng.gen_range(0..100),
                Profile::Burst => 0,
                // (Codes: a large sequential write, or a flush.)
                Profile::Stream => [0, 0, 0, 0, 0, 0, 0, 70][self.rng.gen_range(0..8)],
                // Codes of the table below: write, write, flush, identical rewrite.
                Profile::Paced => [0, 0, 70, 90][self.rng.gen_range(0..4)],
            };
            self.pause(sched);
            let r = match op {
                0 if self.profile == Profile::Stream => self.stream_op(world, volume, sched),
                0..=29 => self.write_op(world, volume, sched, false),
                30..=33 => self.write_op(world, volume, sched, true),
                34..=41 => self.partial_op(world, volume, sched, false),
                42..=45 => self.partial_op(world, volume, sched, true),
                46..=66 => self.read_op(world, volume, cache, failed_before),
                67..=69 => self.preload_op(world, volume),
                70..=81 => self.flush(world, volume, sched),
                82..=89 => self.discard_op(world, volume),
                _ => self.identical_rewrite(world, volume, sched),
            };
            if r.is_err() {
                return;
            }
        }
    }

    /// The ring profile's work (see `Profile::Ring`).
    fn ring_run(&mut self, world: &World, volume: &Volume, sched: &Sched, cache: &SimDevice) -> Result<(), Stop> {
        let laps = self.rng.gen_range(2..=3);
        let others = self.hi - self.lo - self.ring;
        let log_blocks = 2 * self.lap_commits;
        // Cache slot -> the ring block whose data last landed there. When the log's tail
        // comes back to a slot, the block that held it is the one rewritten (its data lands
        // right after the record header): each block's versions keep the same slot, lap
        // after lap, as a circular log sized to the cache would.
        let mut landed: HashMap<u64, u64> = HashMap::new();
        let mut next = 0;
        for _ in 0..laps * self.lap_commits {
            world.counters.operations.fetch_add(3, Ordering::Relaxed);
            let aim = (volume.status().log_tail + 1) % log_blocks;
            let block = landed.get(&aim).copied().unwrap_or_else(|| {
                next += 1;
                self.lo + (next - 1) % self.ring
            });
            // Read it first (a page read before it is changed): reclaim frees the slots just
            // ahead of the tail, so a version wrongly taken for clean is gone by now.
            let failed_before = cache.stats().failed_ops + world.backing.stats().failed_ops;
            self.read_span(world, volume, cache, failed_before, block, 1)?;
            self.write(world, volume, sched, block, fresh(world, block), false)?;
            self.flush(world, volume, sched)?;
            if let Some((_, e)) = volume.index_snapshot().into_iter().find(|&(b, _)| b == block) {
                landed.insert(u64::from(e.slot), block);
            }
        }
        for i in 0..self.lap_commits {
            world.counters.operations.fetch_add(2, Ordering::Relaxed);
            let block = self.lo + self.ring + i % others;
            self.write(world, volume, sched, block, fresh(world, block), false)?;
            self.flush(world, volume, sched)?;
        }
        for block in self.lo..self.lo + self.ring {
            world.counters.operations.fetch_add(1, Ordering::Relaxed);
            let failed_before = cache.stats().failed_ops + world.backing.stats().failed_ops;
            self.read_span(world, volume, cache, failed_before, block, 1)?;
        }
        Ok(())
    }

    /// In a paced cycle, waits longer than the staging age (in virtual time) or not at all.
    fn pause(&mut self, sched: &Sched) {
        if self.profile == Profile::Paced {
            let until = sched.steps() + self.rng.gen_range(0..3 * PACED_PAUSE_STEPS);
            while sched.steps() < until {
                yield_now();
            }
        }
    }

    fn span(&mut self, max: u64) -> (u64, u64) {
        let start = self.rng.gen_range(self.lo..self.hi);
        let n = self.rng.gen_range(1..=max).min(self.hi - start);
        (start, n)
    }

    /// An engine error: expected once a fault was injected, a violation otherwise.
    fn error(&self, world: &World, what: &str, e: &EngineError) -> Stop {
        if !world.fault_seen() {
            world.violation(ViolationKind::UnexpectedError, None, format!("client {}: {what}: {e}", self.id));
        }
        Stop::Error
    }

    fn write(
        &mut self,
        world: &World,
        volume: &Volume,
        sched: &Sched,
        first: u64,
        data: Vec<u8>,
        fua: bool,
    ) -> Result<(), Stop> {
        let offset = first * BS as u64;
        let started = sched.steps();
        let r = if fua { volume.write_fua(offset, &data) } else { volume.write(offset, &data) };
        match r {
            Ok(()) => {
                world.completed(first, &data, started, sched.steps(), fua);
                {
                    let mut redo = world.redo.lock().expect("redo");
                    if fua {
                        redo[self.id].clear();
                    } else {
                        redo[self.id].push((offset, data, sched.steps()));
                    }
                }
                if !fua && self.ahead.as_mut().is_some_and(|a| a.gen_bool(0.5)) {
                    // (Durable only once a FLUSH covers it, as any record: the crash checks
                    // hold it to that.)
                    volume.write_ahead().map_err(|e| self.error(world, "write ahead", &e))?;
                }
                Ok(())
            }
            Err(e) => {
                world.attempted(first, &data);
                Err(self.error(world, "write", &e))
            }
        }
    }

    fn write_op(&mut self, world: &World, volume: &Volume, sched: &Sched, fua: bool) -> Result<(), Stop> {
        let (start, n) = match self.rng.gen_range(0..100) {
            // A hot block, rewritten again and again (a database's log or index root): its
            // versions land in many slots, the same slot again laps later.
            0..=24 => (self.lo + self.rng.gen_range(0..4).min(self.hi - self.lo - 1), 1),
            // A large write: staging fills and seals records with no FLUSH between them, so
            // a crash can drop one and keep the next.
            25..=39 => self.span(32),
            _ => self.span(8),
        };
        let data: Vec<u8> = (start..start + n).flat_map(|b| fresh(world, b)).collect();
        self.write(world, volume, sched, start, data, fua)
    }

    /// The stream profile's write: the next 4 to 16 blocks of the client's range, wrapping.
    fn stream_op(&mut self, world: &World, volume: &Volume, sched: &Sched) -> Result<(), Stop> {
        let n = self.rng.gen_range(4..=16u64).min(self.hi - self.lo);
        if self.stream_next + n > self.hi || self.stream_next < self.lo {
            self.stream_next = self.lo;
        }
        let start = self.stream_next;
        self.stream_next += n;
        let data: Vec<u8> = (start..start + n).flat_map(|b| fresh(world, b)).collect();
        self.write(world, volume, sched, start, data, false)
    }

    /// Rewrites blocks with the content they hold (a database rewriting an unchanged page).
    fn identical_rewrite(&mut self, world: &World, volume: &Volume, sched: &Sched) -> Result<(), Stop> {
        let (start, n) = self.span(4);
        let current: Option<Vec<u8>> = {
            let m = world.model.lock().expect("model");
            (start..start + n).map(|b| m[b as usize].current.clone()).collect::<Option<Vec<_>>>().map(|v| v.concat())
        };
        match current {
            Some(data) => self.write(world, volume, sched, start, data, false),
            None => Ok(()), // a known-lost block has no content to repeat
        }
    }

    /// An unaligned write (or write-zeroes): the engine reads, modifies and writes the
    /// partially covered edge blocks. Contents are computed from the client's own bytes.
    fn partial_op(&mut self, world: &World, volume: &Volume, sched: &Sched, zeroes: bool) -> Result<(), Stop> {
        let (start, n) = self.span(3);
        let bytes = n * BS as u64;
        let skip = self.rng.gen_range(0..BS as u64 / 2);
        let cut = self.rng.gen_range(0..BS as u64 / 2);
        let len = bytes - skip - cut;
        let offset = start * BS as u64 + skip;
        // Per block: its current bytes, needed where the block is only partly covered.
        let before: Vec<Option<Vec<u8>>> = {
            let m = world.model.lock().expect("model");
            (start..start + n).map(|b| m[b as usize].current.clone()).collect()
        };
        let partly = |i: u64| (i == 0 && skip > 0) || (i == n - 1 && cut > 0);
        let needs_lost = (0..n).find(|&i| partly(i) && before[i as usize].is_none());
        let new_bytes: Vec<u8> = if zeroes {
            vec![0u8; len as usize]
        } else {
            let src: Vec<u8> = (start..start + n).flat_map(|b| fresh(world, b)).collect();
            src[skip as usize..(skip + len) as usize].to_vec()
        };
        let started = sched.steps();
        let r = if zeroes { volume.write_zeroes(offset, len) } else { volume.write_bytes(offset, &new_bytes) };
        if let Some(i) = needs_lost {
            // A partly covered block is known lost: the read-modify-write must refuse.
            return match r {
                Err(EngineError::LostBlock { .. }) => Ok(()),
                Err(e) => Err(self.error(world, "partial write", &e)),
                Ok(()) => {
                    world.violation(
                        ViolationKind::StaleRead,
                        Some(start + i),
                        "a partial write over a lost block succeeded".into(),
                    );
                    Err(Stop::Error)
                }
            };
        }
        let mut after: Vec<u8> = before.iter().flat_map(|b| b.clone().unwrap_or_else(|| vec![0u8; BS])).collect();
        after[skip as usize..(skip + len) as usize].copy_from_slice(&new_bytes);
        match r {
            Ok(()) => {
                world.completed(start, &after, started, sched.steps(), false);
                world.redo.lock().expect("redo")[self.id].push((start * BS as u64, after, sched.steps()));
                Ok(())
            }
            Err(EngineError::LostBlock { block }) => {
                self.check_lost(world, block);
                Ok(())
            }
            Err(e) => {
                world.attempted(start, &after);
                Err(self.error(world, "partial write", &e))
            }
        }
    }

    /// A "lost block" error is right only for a block whose dirty copy was corrupted.
    fn check_lost(&self, world: &World, block: u64) {
        world.counters.lost_errors.fetch_add(1, Ordering::Relaxed);
        let mut m = world.model.lock().expect("model");
        let b = &mut m[block as usize];
        if b.corrupted_at.is_none() {
            drop(m);
            world.violation(ViolationKind::WronglyLost, Some(block), "reported lost, never corrupted".into());
        } else if let Some(bytes) = b.current.take() {
            b.lost_bytes = Some(bytes);
        }
    }

    fn read_op(&mut self, world: &World, volume: &Volume, cache: &SimDevice, failed_before: u64) -> Result<(), Stop> {
        // Now and then a large read: its cached blocks are read a run of consecutive log slots
        // at a time, while reclaim and write-back move them.
        // And now and then a span read lately, again: a miss admitted into the probation ring
        // and read again there is promoted into the log (S3-FIFO), with crashes among both.
        let again = !self.recent_reads.is_empty() && self.rng.gen_bool(0.3);
        let (start, n) = if again {
            self.recent_reads[self.rng.gen_range(0..self.recent_reads.len())]
        } else if self.rng.gen_bool(0.25) {
            self.span(48)
        } else {
            self.span(8)
        };
        if self.recent_reads.len() == 16 {
            self.recent_reads.pop_front();
        }
        self.recent_reads.push_back((start, n));
        self.read_span(world, volume, cache, failed_before, start, n)
    }

    /// Reads blocks `start..start + n` and checks them exactly.
    fn read_span(
        &mut self,
        world: &World,
        volume: &Volume,
        cache: &SimDevice,
        failed_before: u64,
        start: u64,
        n: u64,
    ) -> Result<(), Stop> {
        let mut buf = vec![0u8; n as usize * BS];
        match volume.read(start * BS as u64, &mut buf) {
            Ok(()) => {
                let m = world.model.lock().expect("model");
                for i in 0..n {
                    let block = start + i;
                    let got = &buf[i as usize * BS..(i as usize + 1) * BS];
                    let b = &m[block as usize];
                    let detail = match &b.current {
                        Some(expect) if expect.as_slice() == got => continue,
                        None if b.lost_bytes.as_deref() == Some(got) => continue, // rescued by write-back
                        None => "a lost block served data".to_string(),
                        Some(_) => describe(block, got),
                    };
                    let kind = if b.all.contains(&hash(got)) || b.current.is_none() {
                        ViolationKind::StaleRead
                    } else {
                        ViolationKind::CorruptRead
                    };
                    drop(m);
                    world.violation(kind, Some(block), format!("client {} live read: {detail}", self.id));
                    return Err(Stop::Error);
                }
                Ok(())
            }
            Err(EngineError::LostBlock { block }) => {
                self.check_lost(world, block);
                Ok(())
            }
            Err(EngineError::Device { role: Role::Cache, .. }) if cache.stats().failed_ops > failed_before => {
                world.counters.latent.fetch_add(1, Ordering::Relaxed);
                Ok(()) // a latent read error of the cache device, reported as such
            }
            Err(e) => Err(self.error(world, "read", &e)),
        }
    }

    fn flush(&mut self, world: &World, volume: &Volume, sched: &Sched) -> Result<(), Stop> {
        let start = sched.steps();
        match volume.flush() {
            Ok(()) => {
                world.flushed(start);
                Ok(())
            }
            Err(e) => Err(self.error(world, "flush", &e)),
        }
    }

    /// `tiercache preload` of a span: its blocks admitted hot whatever the stream (later
    /// reads and crashes check that nothing stale came in with them).
    fn preload_op(&mut self, world: &World, volume: &Volume) -> Result<(), Stop> {
        let (start, n) = self.span(16);
        volume
            .preload(start * BS as u64, n * BS as u64, |_| true)
            .map(|_| ())
            .map_err(|e| self.error(world, "preload", &e))
    }

    fn discard_op(&mut self, world: &World, volume: &Volume) -> Result<(), Stop> {
        let (start, n) = self.span(4);
        volume.discard(start * BS as u64, n * BS as u64).map_err(|e| self.error(world, "discard", &e))
    }
}

fn describe(block: u64, data: &[u8]) -> String {
    match stamp::unstamp(data) {
        Some((b, v)) if b == block => format!("version {v}"),
        Some((b, v)) => format!("block {b}'s version {v}"),
        None => "unstamped data (torn, zeroed or merged)".into(),
    }
}

/// Runs one seed.
pub fn run(config: SimConfig) -> SimReport {
    tiercache_sched::quiet_stuck_panics();
    let clock = SimClock::new();
    let tick_clock = clock.clone();
    let mut report = SimReport { seed: config.seed, ..SimReport::default() };
    let outcome = Sched::run(
        config.seed,
        MAX_STEPS,
        move || tick_clock.advance_ns(QUANTUM_NS),
        |sched| run_in(sched, config, clock, &mut report),
    );
    if outcome.is_err() {
        report.violations.push(Violation {
            seed: config.seed,
            cycle: report.cycles,
            kind: ViolationKind::Stuck,
            block: None,
            detail: format!("no progress within {MAX_STEPS} scheduling steps (deadlock or livelock)"),
        });
    }
    report
}

fn run_in(sched: &Sched, config: SimConfig, clock: SimClock, report: &mut SimReport) {
    let mut rng = ChaCha8Rng::seed_from_u64(config.seed ^ 0x5eed_5eed);
    // A third of the seeds (their own stream) use 16-block segments: reclaim windows then
    // hold more than a record's worth of dirty blocks with room left over, so reclaim weighs
    // copying them forward against writing them back (volume/costs.rs) as it does on a real
    // log, where 8-block windows are nearly always too dense to copy.
    let wide_segments = ChaCha8Rng::seed_from_u64(config.seed ^ 0x5e65_e65e).gen_bool(0.33);
    let segment_blocks = if wide_segments { 16u32 } else { 8 };
    let log_blocks = rng.gen_range(8..=16u64) * u64::from(segment_blocks);
    // An eighth of the seeds (those 7 mod 8: no seed a test below names) cut the same log
    // into 4-block segments: a record (up to an eighth of the log) then spans two to eight
    // segments, and a reclaim record may carry more clean copies than a segment holds
    // (volume/reclaim.rs bounds them by the record), which 8- and 16-block segments never
    // reach here.
    let segment_blocks = if config.seed % 8 == 7 { 4 } else { segment_blocks };
    let ck = Layout::checkpoint_blocks_for(log_blocks, BS as u32);
    let blocks = rng.gen_range(48..=160u64);
    let mut clients = rng.gen_range(1..=3usize);
    // Journal-replay seeds (module header): one client, no destager, no checkpoints forced,
    // no corruption, read-back without admission, and a Prefix redo after every crash, so
    // that a record rebuilt after recovery is byte-identical to the one the crash dropped;
    // the chain must not let the stale record after it on. Drawn from its own stream.
    let quiet = ChaCha8Rng::seed_from_u64(config.seed ^ 0x9e37_79b9).gen_bool(QUIET_SHARE);
    let cycles = if quiet {
        clients = 1;
        config.cycles * QUIET_CYCLES_FACTOR
    } else {
        config.cycles
    };
    let cache_sim = Arc::new(SimDevice::new((2 + 2 * ck + log_blocks) * BS as u64, BS as u32).with_name("cache"));
    let image: Vec<u8> = (0..blocks)
        .flat_map(|b| {
            let mut v = vec![0u8; BS];
            stamp::stamp(b, 0, &mut v);
            v
        })
        .collect();
    let initial: Vec<BlockModel> = image
        .chunks(BS)
        .map(|c| BlockModel {
            floor: Some(hash(c)),
            newer: Vec::new(),
            maybe: Vec::new(),
            current: Some(c.to_vec()),
            all: vec![hash(c)],
            lost_bytes: None,
            corrupted_at: None,
        })
        .collect();
    // Write-around (large writes straight to the backing device, see below) needs a backing
    // device that never tears a block: in the seeds that use it, a crash tears at 4 KiB.
    let mut around_rng = ChaCha8Rng::seed_from_u64(config.seed ^ 0xa20d_a20d);
    let around = around_rng.gen_range(0..3u8);
    let backing_sim = SimDevice::from_image(image, BS as u32).with_name("backing");
    let backing_sim = Arc::new(if around == 0 { backing_sim } else { backing_sim.with_atomic_write(BS as u32) });
    let backing_flush_scale = Arc::new(AtomicU64::new(1));
    let timed = |inner: &Arc<SimDevice>, read, write, flush, stall, salt: u64, scale: &Arc<AtomicU64>| {
        Arc::new(TimedDevice {
            inner: Arc::clone(inner),
            clock: clock.clone(),
            read_ns: read,
            write_ns: write,
            flush_ns: flush,
            stall,
            flush_scale: Arc::clone(scale),
            rng: Mutex::new(ChaCha8Rng::seed_from_u64(config.seed ^ salt)),
            overlap_rng: Mutex::new(ChaCha8Rng::seed_from_u64(config.seed ^ salt ^ 0x0e71_a900)),
        }) as Arc<dyn BlockDevice>
    };
    // The cache: tens of microseconds. The backing device: an HDD or a RAID5 under load.
    // In half the seeds (their own stream) cache writes take 3 to 20 ms, a busy device: a
    // record write then spans many scheduling steps, and other writers fill and seal the
    // next records while it is in progress (the record pipeline, commit.rs).
    let slow_cache_writes = ChaCha8Rng::seed_from_u64(config.seed ^ 0x51c0_ca4e).gen_bool(0.5);
    let cache_write_ns = if slow_cache_writes { (3_000_000, 20_000_000) } else { (20_000, 100_000) };
    let unscaled = Arc::new(AtomicU64::new(1));
    let cache = timed(&cache_sim, (10_000, 50_000), cache_write_ns, (50_000, 200_000), 0.0, 1, &unscaled);
    let backing = timed(
        &backing_sim,
        (500_000, 5_000_000),
        (1_000_000, 10_000_000),
        (5_000_000, 60_000_000),
        0.1,
        2,
        &backing_flush_scale,
    );
    let world = Arc::new(World {
        cache: Arc::clone(&cache_sim),
        backing: Arc::clone(&backing_sim),
        names: Mutex::new(std::collections::HashMap::new()),
        failed_base: AtomicU64::new(0),
        clock: clock.clone(),
        seed: config.seed,
        cycle: AtomicU64::new(0),
        model: Mutex::new(initial),
        violations: Mutex::new(Vec::new()),
        next_version: AtomicU64::new(1),
        faulted: AtomicBool::new(false),
        counters: Counters::default(),
        redo: Mutex::new(vec![Vec::new(); clients]),
    });
    // The probation ring (engine volume/probation.rs): in three quarters of the seeds (their
    // own stream) a quarter of the log, so that the ring laps often: small rings and logs of
    // 11 segments or more get one (`Layout::with_probation`); the rest admit into the log.
    let probation_permille = if ChaCha8Rng::seed_from_u64(config.seed ^ 0x960b_a710).gen_bool(0.75) { 250 } else { 0 };
    let opts = CreateOptions {
        segment_blocks,
        probation_permille,
        dirty_low_permille: rng.gen_range(50..300),
        dirty_high_permille: rng.gen_range(300..700),
        uuid: Some(config.seed.to_le_bytes().repeat(2).try_into().expect("16 bytes")),
        ..CreateOptions::default()
    };
    if let Err(e) = create(&*cache, &*backing, &opts) {
        world.violation(ViolationKind::RecoveryFailed, None, format!("create failed: {e}"));
        finish(report, &world, sched);
        return;
    }
    // Write-around (large writes straight to the backing device): in a third of the seeds
    // never, in a third for writes of a few blocks and often regardless of the dirty level
    // (so the path is common), in the rest as shipped. Drawn from its own stream.
    let write_around = match around {
        0 => WriteAroundPolicy { min_bytes: 0, only_when_destage_bound: true },
        1 => WriteAroundPolicy {
            min_bytes: BS as u64 * around_rng.gen_range(2..=8),
            only_when_destage_bound: around_rng.gen_bool(0.3),
        },
        _ => WriteAroundPolicy::default(),
    };
    // Slow cache writes come with small records (3 to 6 entries), so that several fit between
    // two reclaims and the pipeline fills (see `VolumeOptions::record_entries`).
    let record_entries = slow_cache_writes.then(|| 3 + (config.seed % 4) as usize);
    let options = VolumeOptions {
        sabotage: config.sabotage,
        write_around,
        record_entries,
        eviction: eviction_for(config.seed),
        write_back_batch_bounds: write_back_batch_bounds_for(config.seed),
        preclean_idle_age_ms: preclean_idle_age_ms_for(config.seed),
        ..VolumeOptions::default()
    };
    for cycle in 0..cycles {
        world.cycle.store(cycle, Ordering::Relaxed);
        report.cycles = cycle + 1;
        world.faulted.store(false, Ordering::Relaxed);
        world.failed_base.store(world.failed_ops(), Ordering::Relaxed);
        let Some(volume) =
            recover(sched, &world, &cache, &backing, &cache_sim, &backing_sim, options, &mut rng, report)
        else {
            break;
        };
        let volume = Arc::new(volume);
        if cycle > 0 {
            let whole = rng.gen_bool(0.5) || quiet;
            verify_after_crash(&world, &volume, whole);
        }
        if !world.violations.lock().expect("v").is_empty() {
            break;
        }
        let layout = volume.superblock().layout;
        let shape = CycleShape { clients, blocks, quiet, backing_flush_scale: Arc::clone(&backing_flush_scale) };
        let clean = run_cycle(sched, &world, &volume, &cache_sim, &backing_sim, &mut rng, config, &shape);
        let st = volume.status();
        report.records_written += st.counters.records_written;
        report.overlapped_record_writes += st.counters.overlapped_record_writes;
        report.staged_during_record_writes += st.counters.staged_during_record_writes;
        report.nested_record_writes += st.counters.nested_record_writes;
        report.handed_off_records += st.counters.handed_off_records;
        report.handed_off_records_written_by_waiters += st.counters.handed_off_records_written_by_waiters;
        report.handed_off_by_readers += st.counters.handed_off_by_readers;
        report.preclean_swept_blocks += st.counters.preclean_swept_blocks;
        report.preclean_idle_blocks += st.counters.preclean_idle_blocks;
        report.gentle_write_back_batches += st.counters.gentle_write_back_batches;
        report.destaged_blocks += st.counters.destaged_blocks;
        report.reclaimed_blocks += st.counters.reclaimed_blocks;
        report.copied_forward_blocks += st.counters.copied_forward_blocks;
        report.dense_copy_forwards += st.counters.dense_copy_forwards;
        report.dense_copy_throughs += st.counters.dense_copy_throughs;
        report.reclaim_write_backs += st.counters.reclaim_write_backs;
        report.batched_cache_reads += st.counters.batched_cache_reads;
        report.reinserted_blocks += st.counters.reinserted_blocks;
        report.probation_admitted_blocks += st.counters.probation_admitted_blocks;
        report.promoted_blocks += st.counters.promoted_blocks;
        report.probation_batches_by_record_writer += st.counters.probation_batches_by_record_writer;
        report.written_around_blocks += st.counters.written_around_blocks;
        report.concurrent_write_arounds += st.counters.concurrent_write_arounds;
        report.written_around_at_dirty_head += st.counters.written_around_at_dirty_head;
        report.written_around_beside_write_back += st.counters.written_around_beside_write_back;
        report.records_written_ahead += st.counters.records_written_ahead;
        report.checkpoints += st.counters.checkpoints;
        report.log_laps = st.log_tail / layout.log_blocks;
        if clean && rng.gen_bool(0.15) {
            let start = sched.steps();
            match volume.shutdown() {
                Ok(()) => {
                    world.flushed(start); // empties the redo logs too: no client is running
                    report.clean_shutdowns += 1;
                }
                Err(e) if !world.fault_seen() => {
                    world.violation(ViolationKind::UnexpectedError, None, format!("shutdown: {e}"))
                }
                Err(_) => {}
            }
        }
        drop(volume);
        crash(&cache_sim, &backing_sim, &mut rng);
        report.crashes += 1;
        if !world.violations.lock().expect("v").is_empty() {
            break;
        }
    }
    // A last recovery and check.
    if world.violations.lock().expect("v").is_empty() {
        world.faulted.store(false, Ordering::Relaxed);
        if let Some(volume) =
            recover(sched, &world, &cache, &backing, &cache_sim, &backing_sim, options, &mut rng, report)
        {
            verify_after_crash(&world, &volume, rng.gen_bool(0.5));
        }
    }
    finish(report, &world, sched);
}

fn finish(report: &mut SimReport, world: &World, sched: &Sched) {
    report.violations = world.violations.lock().expect("v").clone();
    report.operations = world.counters.operations.load(Ordering::Relaxed);
    report.corruptions = world.counters.corruptions.load(Ordering::Relaxed);
    report.latent_read_errors = world.counters.latent.load(Ordering::Relaxed);
    report.lost_block_errors = world.counters.lost_errors.load(Ordering::Relaxed);
    report.scheduling_steps = sched.steps();
}

fn crash(cache: &SimDevice, backing: &SimDevice, rng: &mut ChaCha8Rng) {
    let (a, b) = (rng.gen(), rng.gen());
    cache.crash(a);
    backing.crash(b);
    dump_log(cache);
}

/// Debugging aid: with `SIM_TRACE_BLOCK=N`, prints the checkpoints and every decodable
/// record header on the cache device after a crash, marking entries of block N.
fn dump_log(cache: &SimDevice) {
    let Some(watch) = std::env::var("SIM_TRACE_BLOCK").ok().and_then(|s| s.parse::<u64>().ok()) else { return };
    let img = cache.durable_image();
    let Ok(sb) = tiercache_format::Superblock::decode(&img[..BS]) else { return };
    let l = sb.layout;
    let uuid_low = tiercache_format::uuid_low64(&sb.uuid);
    for area in 0..2 {
        let at = (l.checkpoint_area_start[area] * BS as u64) as usize;
        match tiercache_format::CheckpointHeader::decode(&img[at..at + BS], uuid_low, l.checkpoint_capacity()) {
            Ok(h) => eprintln!("  checkpoint {area}: {h:?}"),
            Err(e) => eprintln!("  checkpoint {area}: {e}"),
        }
    }
    for slot in 0..l.log_blocks {
        let at = l.log_offset(slot) as usize;
        if let Ok(h) = tiercache_format::RecordHeader::decode(&img[at..at + BS], uuid_low) {
            let mine: Vec<String> = {
                let mut k = 0;
                h.entries
                    .iter()
                    .filter_map(|e| {
                        let data_pos = if e.kind.has_data() {
                            k += 1;
                            Some(h.position + k)
                        } else {
                            None
                        };
                        (e.backing_block == watch).then(|| {
                            let d = data_pos.map(|p| {
                                let o = l.log_offset(p % l.log_blocks) as usize;
                                describe(watch, &img[o..o + BS])
                            });
                            format!("{:?}@{:?} ref {} {:?}", e.kind, data_pos, e.ref_position, d)
                        })
                    })
                    .collect()
            };
            let mut k = 0;
            let bad: Vec<u64> = h
                .entries
                .iter()
                .filter(|e| e.kind.has_data())
                .filter_map(|e| {
                    k += 1;
                    let o = l.log_offset((h.position + k) % l.log_blocks) as usize;
                    (tiercache_format::checksum(&img[o..o + BS]) != e.data_crc).then_some(h.position + k)
                })
                .collect();
            let kinds: Vec<String> = h.entries.iter().map(|e| format!("{:?}:{}", e.kind, e.backing_block)).collect();
            eprintln!("    kinds {kinds:?} bad data at {bad:?}");
            eprintln!(
                "  slot {slot}: pos {} seq {} epoch {} head {} n {} prev {:#x} crc {:#x} {}",
                h.position,
                h.sequence,
                h.epoch,
                h.head_position,
                h.entries.len(),
                h.prev_checksum,
                tiercache_format::RecordHeader::stored_checksum(&img[at..at + BS]),
                mine.join(" ")
            );
        }
    }
}

fn cut_power(world: &World, cache: &SimDevice, backing: &SimDevice) {
    // Both at once, between two scheduling points: nothing runs in between.
    cache.vanish();
    backing.vanish();
    world.faulted.store(true, Ordering::Relaxed);
}

/// Recovers the volume, with power cut during recovery in some attempts (crash after crash).
#[allow(clippy::too_many_arguments)]
fn recover(
    sched: &Sched,
    world: &Arc<World>,
    cache: &Arc<dyn BlockDevice>,
    backing: &Arc<dyn BlockDevice>,
    cache_sim: &Arc<SimDevice>,
    backing_sim: &Arc<SimDevice>,
    options: VolumeOptions,
    rng: &mut ChaCha8Rng,
    report: &mut SimReport,
) -> Option<Volume> {
    for attempt in 0..4 {
        let cut_at = (attempt < 3 && rng.gen_bool(0.25)).then(|| rng.gen_range(1..400u64));
        let (c, b) = (Arc::clone(cache), Arc::clone(backing));
        let clock: Arc<dyn Clock> = Arc::new(world.clock.clone());
        let opener = sched.spawn(move || Volume::open(c, b, clock, options).map(|(v, _)| v).map_err(|e| e.to_string()));
        let done = Arc::new(AtomicBool::new(false));
        let crasher = cut_at.map(|steps| {
            let (w, cs, bs, done) =
                (Arc::clone(world), Arc::clone(cache_sim), Arc::clone(backing_sim), Arc::clone(&done));
            sched.spawn(move || {
                for _ in 0..steps {
                    if done.load(Ordering::Relaxed) {
                        return false;
                    }
                    yield_now();
                }
                cut_power(&w, &cs, &bs);
                true
            })
        });
        let opened = sched.join(opener);
        done.store(true, Ordering::Relaxed);
        let cut = match crasher.map(|h| sched.join(h)) {
            Some(Joined::Returned(cut)) => cut,
            _ => false,
        };
        match opened {
            Joined::Returned(Ok(v)) if !cut => return Some(v),
            Joined::Returned(r) if cut => {
                // Power was cut during (or right after) recovery: crash and recover again.
                drop(r);
                crash(cache_sim, backing_sim, rng);
                report.crashes_during_recovery += 1;
                world.faulted.store(false, Ordering::Relaxed);
                world.failed_base.store(world.failed_ops(), Ordering::Relaxed);
            }
            Joined::Returned(Err(e)) => {
                world.violation(ViolationKind::RecoveryFailed, None, e);
                return None;
            }
            Joined::Returned(Ok(_)) => unreachable!("handled above"),
            Joined::Panicked(p) => {
                world.violation(ViolationKind::Panic, None, format!("recovery panicked: {p}"));
                return None;
            }
            Joined::Stuck => return None,
        }
    }
    None
}

/// After a crash: every block reads as its last flushed content or a newer completed (or
/// attempted) one, or fails as lost if its dirty copy was corrupted. What is read becomes the
/// new truth.
///
/// With `whole`, the volume is read in requests too large for the read cache to admit
/// (falling back to single blocks where one fails), so that the first record written after
/// recovery is the clients' own, as it was before the crash: a stale record beyond one the
/// crash discarded then has the best chance to chain on, if the engine lets it.
fn verify_after_crash(world: &World, volume: &Volume, whole: bool) {
    let mut m = world.model.lock().expect("model");
    let mut found = Vec::new();
    let reads = read_back(volume, m.len() as u64, whole);
    let snapshot = if std::env::var_os("SIM_TRACE_INDEX").is_some() { volume.index_snapshot() } else { Vec::new() };
    for ((block, b), read) in m.iter_mut().enumerate().zip(reads) {
        let block = block as u64;
        trace(block, || format!("after recovery: {:?}", snapshot.iter().find(|(x, _)| *x == block)));
        match read {
            Ok(buf) => {
                let h = hash(&buf);
                let rescued = b.floor.is_none() && b.lost_bytes.as_deref().map(hash) == Some(h);
                let allowed =
                    b.floor == Some(h) || b.newer.iter().any(|&(x, _, _)| x == h) || b.maybe.contains(&h) || rescued;
                if !allowed {
                    let name = |h: &u64| world.names.lock().expect("names").get(h).cloned().unwrap_or_default();
                    let detail = format!(
                        "after a crash read {}; allowed: flushed {}, completed since {:?}, attempted {:?}",
                        describe(block, &buf),
                        b.floor.as_ref().map_or("lost".into(), name),
                        b.newer.iter().map(|(h, _, _)| name(h)).collect::<Vec<_>>(),
                        b.maybe.iter().map(name).collect::<Vec<_>>(),
                    );
                    let kind = if b.all.contains(&h) { ViolationKind::LostWrite } else { ViolationKind::CorruptRead };
                    found.push((kind, block, detail));
                }
                b.floor = Some(h);
                b.current = Some(buf);
                b.corrupted_at = None; // its readable copy verified
            }
            Err(EngineError::LostBlock { .. }) => {
                world.counters.lost_errors.fetch_add(1, Ordering::Relaxed);
                if b.corrupted_at.is_none() {
                    found.push((ViolationKind::WronglyLost, block, "lost after a crash, never corrupted".into()));
                }
                b.floor = None;
                if let Some(bytes) = b.current.take() {
                    b.lost_bytes = Some(bytes);
                }
            }
            Err(e) => found.push((ViolationKind::UnexpectedError, block, format!("read after recovery: {e}"))),
        }
        b.newer.clear();
        b.maybe.clear();
    }
    drop(m);
    for (kind, block, detail) in found {
        world.violation(kind, Some(block), detail);
    }
}

/// Reads every block of the volume: one request per block, or (`whole`) requests of
/// `WHOLE_READ_BLOCKS`, which bypass read admission, retried block by block where one fails.
fn read_back(volume: &Volume, blocks: u64, whole: bool) -> Vec<Result<Vec<u8>, EngineError>> {
    let one = |block: u64| {
        let mut buf = vec![0u8; BS];
        volume.read(block * BS as u64, &mut buf).map(|()| buf)
    };
    let mut out = Vec::with_capacity(blocks as usize);
    let step = if whole { WHOLE_READ_BLOCKS } else { 1 };
    for first in (0..blocks).step_by(step as usize) {
        let n = step.min(blocks - first);
        let mut buf = vec![0u8; n as usize * BS];
        match volume.read(first * BS as u64, &mut buf) {
            Ok(()) => out.extend(buf.chunks(BS).map(|c| Ok(c.to_vec()))),
            Err(_) if n > 1 => out.extend((first..first + n).map(one)),
            Err(e) => out.push(Err(e)),
        }
    }
    out
}

/// What a seed fixes for all its cycles.
struct CycleShape {
    clients: usize,
    blocks: u64,
    /// A journal-replay seed (see `run_in`).
    quiet: bool,
    /// The backing device's flush latency multiplier, set per cycle.
    backing_flush_scale: Arc<AtomicU64>,
}

/// One cycle of concurrent work; returns whether it ended without any fault.
#[allow(clippy::too_many_arguments)]
fn run_cycle(
    sched: &Sched,
    world: &Arc<World>,
    volume: &Arc<Volume>,
    cache_sim: &Arc<SimDevice>,
    backing_sim: &Arc<SimDevice>,
    rng: &mut ChaCha8Rng,
    config: SimConfig,
    shape: &CycleShape,
) -> bool {
    let &CycleShape { clients, blocks, quiet, .. } = shape;
    let stop = Arc::new(AtomicBool::new(false));
    let per = blocks / clients as u64;
    let mut client_handles = Vec::new();
    let mut profile = [
        Profile::Mixed,
        Profile::Mixed,
        Profile::Mixed,
        Profile::Burst,
        Profile::Paced,
        Profile::Ring,
        Profile::Stream,
    ][rng.gen_range(0..7)];
    if quiet {
        profile = Profile::Burst;
    }
    // Ring: a ring of an eighth or a quarter of the log, one commit (a 2-block record) per
    // block: each block's versions come back near the same slots every lap or two.
    let log_blocks = volume.superblock().layout.log_blocks;
    let ring_size = log_blocks / [8, 4][rng.gen_range(0..2)];
    // A ring cycle's write-back flushes last several laps of the log (so a batch is still
    // running when the ring's last versions land where its first ones were).
    let scale = if profile == Profile::Ring { rng.gen_range(5..=10) } else { 1 };
    shape.backing_flush_scale.store(scale, Ordering::Relaxed);
    // Two cycles in five write ahead (`Client::ahead`), decided by a stream of their own.
    let cycle = world.cycle.load(Ordering::Relaxed);
    let mut ahead =
        ChaCha8Rng::seed_from_u64(config.seed ^ 0xA4EA_D5EE_D000_0000 ^ cycle.wrapping_mul(0x9E37_79B9_7F4A_7C15));
    let writes_ahead = ahead.gen_bool(0.4);
    for id in 0..clients {
        let lo = id as u64 * per;
        let hi = if id + 1 == clients { blocks } else { lo + per };
        let mut client = Client {
            id,
            lo,
            hi,
            rng: ChaCha8Rng::seed_from_u64(rng.gen()),
            ops: rng.gen_range(1..=config.ops),
            profile,
            redo: [Redo::Nothing, Redo::All, Redo::All, Redo::Part, Redo::Part][rng.gen_range(0..5)],
            ring: ring_size.min(hi - lo - 1),
            lap_commits: log_blocks / 2,
            stream_next: lo,
            recent_reads: std::collections::VecDeque::new(),
            ahead: writes_ahead.then(|| ChaCha8Rng::seed_from_u64(ahead.gen())),
        };
        if quiet {
            client.redo = Redo::Prefix;
        }
        let (w, v, c, b) = (Arc::clone(world), Arc::clone(volume), Arc::clone(cache_sim), Arc::clone(backing_sim));
        let s = sched.clone();
        client_handles.push(sched.spawn(move || client.run(&w, &v, &s, &c, &b)));
    }
    let mut helpers = Vec::new();
    // The destager: write-back batches in address order, and the head pre-cleaner.
    {
        let (w, v, stop) = (Arc::clone(world), Arc::clone(volume), Arc::clone(&stop));
        let mut r = ChaCha8Rng::seed_from_u64(rng.gen());
        // In some cycles write-back starts late: until then records hold only the clients'
        // writes, as after a recovery (no MarkClean entries), so redone writes can rebuild
        // a record exactly.
        let mut late = if rng.gen_bool(0.3) { rng.gen_range(0..20_000u64) } else { 0 };
        if quiet {
            late = u64::MAX; // never: reclaim alone writes back, when the log is full
        }
        let s = sched.clone();
        let from = s.steps().saturating_add(late);
        helpers.push(sched.spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if s.steps() < from {
                    yield_now();
                    continue;
                }
                let res = if r.gen_bool(0.02) {
                    // An operator's `tiercache flush` on the served volume: every block dirty
                    // now, written back while the clients go on (paced or not). Lost blocks
                    // make it fail by design.
                    let share = [1.0, 0.5][r.gen_range(0..2)];
                    match v.write_back_all(share, |_, _| true) {
                        Err(EngineError::LostBlocks { .. }) => Ok(()),
                        other => other.map(|_| ()),
                    }
                } else if r.gen_bool(0.6) {
                    v.destage_step(r.gen_range(1..64)).map(|_| ())
                } else {
                    v.destage_oldest(r.gen_range(1..32)).map(|_| ())
                };
                if let Err(e) = res {
                    if !w.fault_seen() {
                        w.violation(ViolationKind::UnexpectedError, None, format!("destager: {e}"));
                    }
                    return;
                }
                for _ in 0..r.gen_range(0..20) {
                    yield_now();
                }
            }
        }));
    }
    // The record writer, in half the seeds: writes the records writers handed off.
    if hands_off_records_for(config.seed) {
        volume.set_record_writer(Some(std::thread::current()));
        let (w, v, stop) = (Arc::clone(world), Arc::clone(volume), Arc::clone(&stop));
        let mut r = ChaCha8Rng::seed_from_u64(rng.gen());
        helpers.push(sched.spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Err(e) = v.write_handed_off_records() {
                    if !w.fault_seen() {
                        w.violation(ViolationKind::UnexpectedError, None, format!("record writer: {e}"));
                    }
                    return;
                }
                // (Slow at times, so that FLUSH, reclaim and seals short of a buffer find
                // records nobody began.)
                let most = [4, 60][r.gen_range(0..2)];
                for _ in 0..r.gen_range(0..most) {
                    yield_now();
                }
            }
        }));
    }
    // Background work: staging age, MarkClean backlog, watermarks; checkpoints.
    {
        let (w, v, stop) = (Arc::clone(world), Arc::clone(volume), Arc::clone(&stop));
        let mut r = ChaCha8Rng::seed_from_u64(rng.gen());
        // Forced checkpoints flush the cache device: frequent in some cycles, none in others
        // (then several records can wait unflushed, and a crash can split them).
        let forced = if quiet { 0.0 } else { [0.1, 0.02, 0.0][rng.gen_range(0..3)] };
        helpers.push(sched.spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let res = if r.gen_bool(forced) { v.checkpoint() } else { v.background_tick() };
                if let Err(e) = res {
                    if !w.fault_seen() {
                        w.violation(ViolationKind::UnexpectedError, None, format!("background: {e}"));
                    }
                    return;
                }
                for _ in 0..r.gen_range(0..40) {
                    yield_now();
                }
            }
        }));
    }
    // Corrupt media in some cycles: silent corruption of cached data, latent read errors.
    if rng.gen_bool(0.3) && !quiet {
        let (w, v, c, stop) = (Arc::clone(world), Arc::clone(volume), Arc::clone(cache_sim), Arc::clone(&stop));
        let mut r = ChaCha8Rng::seed_from_u64(rng.gen());
        let layout = volume.superblock().layout;
        let s = sched.clone();
        helpers.push(sched.spawn(move || {
            let mut budget = r.gen_range(1..4);
            while !stop.load(Ordering::Relaxed) && budget > 0 {
                for _ in 0..r.gen_range(50..800) {
                    yield_now();
                }
                if r.gen_bool(0.25) {
                    c.fail_after(Some(OpKind::Read), r.gen_range(0..20), FailMode::Once);
                    budget -= 1;
                    continue;
                }
                // Blocks whose record a durable checkpoint covers. (Damage to a record after
                // the checkpoint that no later record vouches for is a torn tail to recovery:
                // see docs/format.md, "torn or corrupt", for that window.)
                let snapshot = v.checkpointed_entries();
                if snapshot.is_empty() {
                    continue;
                }
                let (block, e, position) = snapshot[r.gen_range(0..snapshot.len())];
                trace(block, || format!("corrupted slot {} (position {position}) dirty {}", e.slot, e.dirty));
                // No scheduling point between the snapshot and the corruption.
                let mut garbage = vec![0u8; BS];
                r.fill(&mut garbage[..]);
                c.corrupt(layout.log_offset(u64::from(e.slot)), &garbage);
                w.counters.corruptions.fetch_add(1, Ordering::Relaxed);
                if e.dirty {
                    // A write completed after this step, once flushed, ends the allowance.
                    let step = s.steps();
                    let mut m = w.model.lock().expect("model");
                    let c = &mut m[block as usize].corrupted_at;
                    *c = Some(c.map_or(step, |old| old.max(step)));
                }
                budget -= 1;
            }
        }));
    }
    // A device failure at a random I/O in some cycles; a power cut at a random step in most.
    let mut faulted_by_design = false;
    if rng.gen_bool(0.15) && !quiet {
        let n = rng.gen_range(0..300);
        if rng.gen_bool(0.6) {
            cache_sim.fail_after(None, n, FailMode::Forever);
        } else {
            backing_sim.fail_after(None, n, FailMode::Forever);
        }
        faulted_by_design = true;
    }
    // The moment: a random step; or, in half the cycles, the first moment after a random
    // step at which the cache holds `n` written but unflushed blocks (records between two
    // FLUSHes, which a crash may drop, apply or tear independently: one record lost and the
    // next kept). Frequent FLUSHes and checkpoints make those moments too brief for a
    // random step to hit often.
    let crasher = (rng.gen_bool(0.5) || quiet).then(|| {
        let mut unflushed = rng.gen_bool(0.5).then(|| rng.gen_range(2..=4usize));
        // Steps of the whole run (every actor's), not of this actor's own turns.
        let mut at = sched.steps() + rng.gen_range(10..if unflushed.is_some() { 8_000 } else { 30_000u64 });
        if profile == Profile::Ring {
            // A ring cycle runs for hundreds of thousands of steps (a FLUSH per write):
            // cut power anywhere in it, mostly after several laps.
            at = sched.steps() + rng.gen_range(10..100_000);
        }
        if quiet {
            // The first records of the run: recovery leaves the chain as it was before them.
            unflushed = Some(rng.gen_range(1..=3usize));
            at = sched.steps() + 10;
        }
        let (w, c, b, stop, s) =
            (Arc::clone(world), Arc::clone(cache_sim), Arc::clone(backing_sim), Arc::clone(&stop), sched.clone());
        sched.spawn(move || {
            while s.steps() < at || unflushed.is_some_and(|n| c.pending_writes() < n) {
                if stop.load(Ordering::Relaxed) {
                    return;
                }
                yield_now();
            }
            cut_power(&w, &c, &b);
        })
    });
    let failed_before = cache_sim.stats().failed_ops + backing_sim.stats().failed_ops;
    let mut panicked = false;
    for h in client_handles {
        if let Joined::Panicked(p) = sched.join(h) {
            world.violation(ViolationKind::Panic, None, format!("client panicked: {p}"));
            panicked = true;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for h in helpers.into_iter().chain(crasher) {
        if let Joined::Panicked(p) = sched.join(h) {
            world.violation(ViolationKind::Panic, None, format!("actor panicked: {p}"));
            panicked = true;
        }
    }
    let failed = cache_sim.stats().failed_ops + backing_sim.stats().failed_ops > failed_before;
    if failed && faulted_by_design {
        world.faulted.store(true, Ordering::Relaxed);
    }
    !panicked && !world.faulted.load(Ordering::Relaxed) && !failed
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs each seed in the default configuration and asserts that it passed; yields
    /// (seed, report) for the test's own checks of what the seeds exercised.
    fn passing(seeds: impl IntoIterator<Item = u64>) -> impl Iterator<Item = (u64, SimReport)> {
        seeds.into_iter().map(|seed| {
            let r = run(SimConfig { seed, ..SimConfig::default() });
            assert!(r.passed(), "seed {seed}: {:#?}", r.violations);
            (seed, r)
        })
    }

    #[test]
    fn one_seed_replays_exactly() {
        let a = run(SimConfig { seed: 11, cycles: 3, ops: 30, sabotage: Sabotage::None });
        let b = run(SimConfig { seed: 11, cycles: 3, ops: 30, sabotage: Sabotage::None });
        assert_eq!(a.scheduling_steps, b.scheduling_steps);
        assert_eq!(a.operations, b.operations);
        assert_eq!(a.records_written, b.records_written);
        assert!(a.passed(), "{:#?}", a.violations);
    }

    #[test]
    fn a_batch_of_seeds_passes_and_exercises_the_engine() {
        let mut laps = 0;
        let mut crashes_in_recovery = 0;
        let mut corruptions = 0;
        let mut overlapped = 0;
        let mut reinserted = 0;
        let mut dense_copies = 0;
        let mut promoted = 0;
        let (mut handed_off, mut by_waiters) = (0, 0);
        let mut swept = 0;
        let mut idle = 0;
        let mut gentle = 0;
        for seed in 0..12 {
            let r = run(SimConfig { seed, ..SimConfig::default() });
            assert!(r.passed(), "seed {seed}: {:#?}", r.violations);
            laps += r.log_laps;
            crashes_in_recovery += r.crashes_during_recovery;
            corruptions += r.corruptions;
            overlapped += r.overlapped_record_writes;
            reinserted += r.reinserted_blocks;
            dense_copies += r.dense_copy_forwards;
            promoted += r.promoted_blocks;
            handed_off += r.handed_off_records;
            by_waiters += r.handed_off_records_written_by_waiters;
            swept += r.preclean_swept_blocks;
            idle += r.preclean_idle_blocks;
            gentle += r.gentle_write_back_batches;
        }
        // Dense dirty windows copied forward are rare in these seeds, and which seeds have
        // them moves with every change to where the engine takes its locks (each is a switch
        // of the scheduler): 2 when written, none after `scan_index` and reclaim's per-segment
        // holds. Then the seeds after these, up to 48 in all, until one has them (8 of 0..48
        // had them then, the first at 19).
        for seed in 12..48 {
            if dense_copies > 0 {
                break;
            }
            let r = run(SimConfig { seed, ..SimConfig::default() });
            assert!(r.passed(), "seed {seed}: {:#?}", r.violations);
            dense_copies += r.dense_copy_forwards;
        }
        // The pre-cleaner left dirty windows to a stream client lapping its range.
        assert!(swept > 0, "no window left to a sequential writer");
        // The pre-cleaner wrote back beyond its horizon, over old data, concurrently with the
        // writers, reclaims and crashes (`preclean_idle_age_ms_for`).
        assert!(idle > 0, "the pre-cleaner's idle reach wrote nothing back");
        // Write-back at the gentle pace (small log reads, few backing writes in flight) among
        // the same crashes, corruptions and concurrent writers.
        assert!(gentle > 0, "no write-back batch ran at the gentle pace");
        // Records handed to the record writer actor, some written by a thread that needed
        // them before it began them.
        assert!(handed_off > 0 && by_waiters > 0, "handed off {handed_off}, written by waiters {by_waiters}");
        // (47 laps and 18 crashes in recovery, 10 corruptions, 33 overlapped record writes
        // when written; the slow-cache seeds spend their virtual time writing, so fewer laps.
        // The eviction policy's reinsertions: clean blocks read again, kept by reclaim. Dense
        // dirty windows copied forward because that was measured cheaper than writing them
        // back: 2 when written, in the wide-segment seeds.)
        assert!(
            laps > 40
                && crashes_in_recovery > 0
                && corruptions > 0
                && overlapped > 0
                && reinserted > 100
                && dense_copies > 0
                && promoted > 0,
            "laps {laps}, crashes in recovery {crashes_in_recovery}, corruptions {corruptions}, overlapped record writes {overlapped}, reinserted {reinserted}, dense copies {dense_copies}, promoted from the probation ring {promoted}"
        );
    }

    /// Reclaim's copy over the lap (a dirty window too dense to judge alone, copied because
    /// what the head meets next has room: `dense_choice`) under the simulator's crashes,
    /// concurrency and corruption. It is rare here (a margin of 16 over the measured costs):
    /// `tiercache torture` finds it in seeds 3, 30, 33, 34 and 70 of 0..100, and in no other (35 and 54
    /// when written; 25, 30 and 65 after the simulated cache served scatter and batched reads
    /// as one I/O each, which changed the devices' random streams; 34, 45, 63 and 79 once the
    /// state lock was taken a chunk of the index or a segment of reclaim's window at a time,
    /// which moved the scheduler's switches; 35 and 44 since a write-back that is not a
    /// writer's reclaim lets a waiting reclaim take the destage lock first, which moved them
    /// again; 3, 30, 33, 34 and 70 since the pre-cleaner's idle reach, which runs in half the
    /// seeds, 3 and 30 among them); each passes.
    #[test]
    fn dense_windows_copied_over_the_lap_pass() {
        let throughs: u64 = passing([3, 30]).map(|(_, r)| r.dense_copy_throughs).sum();
        assert!(throughs > 0, "no dense window copied over the lap in seeds 3 and 30: the test proves nothing");
    }

    /// Reclaim records carrying more clean copies than a segment (volume/reclaim.rs bounds
    /// them by a record's entries), with crashes, readers and writers around them: seeds 31
    /// and 79 write some (7 and 2). The seeds that cut their log into 4-block segments (7 mod
    /// 8) are the only ones that can; a temporary trace in `reclaim` found them among 7, 15,
    /// .., 399: 31, 79, 167, 191, 223 and 247, all passing.
    #[test]
    fn reclaim_records_of_more_than_a_segment_pass() {
        for (seed, r) in passing([31, 79]) {
            assert!(r.reinserted_blocks > 0, "seed {seed} reinserted nothing: the test proves nothing");
        }
    }

    /// Reclaim windows cut short before a kept block that does not fit their record, with
    /// dirty blocks after the cut (volume/reclaim.rs, `reinsertions`: they stay for a later
    /// window, as kept blocks do; before, such a window was taken whole and evicted the
    /// kept blocks past its room). A temporary trace found it in 16 of seeds 0..60, with
    /// crashes, readers and writers around it: seeds 30 (4 windows) and 34 (5), passing.
    #[test]
    fn windows_cut_before_dirty_blocks_pass() {
        for (seed, r) in passing([30, 34]) {
            assert!(r.reinserted_blocks > 0, "seed {seed} reinserted nothing: the test proves nothing");
        }
    }

    /// Large writes of uncached blocks sent around the cache below the high watermark because
    /// the log's head was densely dirty (`goes_around_now`), while readers, writers, TRIMs,
    /// write-back and crashes go on: every read is checked exactly. Rare (a seed needs
    /// write-arounds from a few blocks that wait for the cache to be destage-bound, a full
    /// log and a dirty head): over seeds 0..120 it happened in 18, 21, 50, 54 (1 each), 61 (6)
    /// and 81 (2).
    #[test]
    fn writes_around_a_dirty_head_pass() {
        let around: u64 = passing([61, 81]).map(|(_, r)| r.written_around_at_dirty_head).sum();
        assert!(around > 0, "no write went around a dirty head in seeds 61 and 81: the test proves nothing");
    }

    /// Records written ahead of a FLUSH right after a write (`Volume::write_ahead`, as the NBD
    /// server does for a client committing one write at a time), in two cycles of five,
    /// while readers, writers, TRIMs, write-back and crashes go on: a crash before the FLUSH
    /// may keep or lose the write, one after it must keep it, and every read is checked
    /// exactly. Over seeds 0..10 in all but 5 and 8 (3 to 18 records each).
    #[test]
    fn records_written_ahead_pass() {
        let ahead: u64 = passing([0, 3]).map(|(_, r)| r.records_written_ahead).sum();
        assert!(ahead > 0, "no record written ahead in seeds 0 and 3: the test proves nothing");
    }

    /// Write-arounds begun beside a write-back batch (the destager's, the background's or a
    /// reclaim's) instead of waiting for it (`try_write_around`, `Around::batch`), while
    /// readers, writers, TRIMs and crashes go on: every read is checked exactly. Over seeds
    /// 0..30 it happened in 1 (16 write-arounds), 10 (9), 13 (2), 14 (5), 18 (10), 26 (1) and
    /// 28 (2).
    #[test]
    fn writes_around_beside_a_write_back_batch_pass() {
        let beside: u64 = passing([1, 18]).map(|(_, r)| r.written_around_beside_write_back).sum();
        assert!(
            beside > 0,
            "no write went around beside a write-back batch in seeds 1 and 18: the test proves nothing"
        );
    }

    /// Records a reader sealed when its admissions filled staging and handed to the record
    /// writer actor (`Volume::try_hand_off_staging`), while readers, writers, TRIMs and
    /// crashes go on: over seeds 0..120 in 12, 36 (14 records), 40, 47, 56, 76 (4), 109 and
    /// 112 (2), all passing.
    #[test]
    fn records_readers_hand_off_pass() {
        let by_readers: u64 = passing([36, 76]).map(|(_, r)| r.handed_off_by_readers).sum();
        assert!(by_readers > 0, "no reader handed off a record in seeds 36 and 76: the test proves nothing");
    }

    /// Probation batches a reader handed to the record writer actor (`Volume::
    /// write_handed_off_records`), written while readers, writers, TRIMs and crashes go on:
    /// every read is checked exactly. Rare (a seed needs both the ring and the record
    /// writer, and the actor must come before a reader finds the batch overdue): over seeds
    /// 12..90 it happened in 35 (3 batches), 41 (6), 47 (3), 53 (1) and 59 (4).
    #[test]
    fn probation_batches_the_record_writer_writes_pass() {
        let by_record_writer: u64 = passing([35, 41]).map(|(_, r)| r.probation_batches_by_record_writer).sum();
        assert!(
            by_record_writer > 0,
            "no probation batch written by the record writer in seeds 35 and 41: the test proves nothing"
        );
    }

    /// A read whose cache hits lie in several runs of log slots issues them as one batch
    /// (`read_batch`, served here in an order the cache's seed draws), while reclaim,
    /// write-back and crashes move the blocks under it: every read is checked exactly.
    #[test]
    fn reads_of_several_runs_in_one_batch_pass() {
        let batched: u64 = passing(0..4).map(|(_, r)| r.batched_cache_reads).sum();
        assert!(batched > 0, "no read of several runs in seeds 0..4: the test proves nothing");
    }

    /// A lone writer of a request larger than what staging holds stages the rest of it while
    /// its record is written (the device runs that work before the data lands, between the
    /// latency and the landing, or after, as the seed draws), and seals and writes the next
    /// record while its own previous one is still in flight: both happen, crashes and faults
    /// among them, and every read is checked exactly.
    #[test]
    fn writers_staging_during_their_record_writes_pass() {
        let (mut staged, mut nested) = (0, 0);
        for (_, r) in passing(0..6) {
            staged += r.staged_during_record_writes;
            nested += r.nested_record_writes;
        }
        assert!(staged > 0 && nested > 0, "staged {staged}, nested {nested} in seeds 0..6: the test proves nothing");
    }

    /// Each deliberately broken variant is caught within `SABOTAGE_SEEDS` seeds. The test
    /// stops at each variant's first catch. Measured over seeds 0..100 (seeds caught, first):
    /// destage-skips-backing-flush 94, seed 0; flush-skips-cache-flush 11, seed 8;
    /// lost-in-ram-only 9, seed 5; no-recovery-epoch 7, seed 16; reclaim-skips-marker-flush
    /// 1, seed 81 (the weakest: the copy record must be dropped while the record after it
    /// survives, over live dirty blocks); flush-ignores-record-pipeline 14, seed 2 (the
    /// engine's own assertion in `flush_cache` fires, in the slow-cache seeds whose record
    /// writes overlap). mark-clean-by-slot: 10 of 60, seed 18, until reclaim began copying
    /// dense dirty windows forward where that is cheaper and the volume read the devices'
    /// virtual clock (a slot reused under a write-back in flight is rarer when fewer windows
    /// are written back): since then 9 of 300, first seed 110, then 159, 175 (hence 200).
    /// (These counts predate the simulated cache serving scatter and batched reads as one I/O
    /// each, which changed the devices' random streams; every variant is still caught within
    /// the budget.)
    const SABOTAGE_SEEDS: u64 = 200;

    #[test]
    fn every_broken_variant_is_caught() {
        for sabotage in Sabotage::ALL {
            let caught =
                (0..SABOTAGE_SEEDS).find(|&seed| !run(SimConfig { seed, sabotage, ..SimConfig::default() }).passed());
            assert!(caught.is_some(), "{} was not caught within {SABOTAGE_SEEDS} seeds", sabotage.name());
        }
    }
}

#[cfg(test)]
mod explore {
    use super::*;

    /// A debugging aid, not a test: `SIM_SEEDS=N SIM_FROM=K cargo test --release -p
    /// tiercache-sim explore -- --ignored --nocapture` prints one line per seed.
    #[test]
    #[ignore = "a debugging aid; `tiercache torture` is the way to run many seeds"]
    fn explore() {
        let n: u64 = std::env::var("SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
        let from: u64 = std::env::var("SIM_FROM").ok().and_then(|s| s.parse().ok()).unwrap_or(0);
        let sabotage = std::env::var("SIM_SABOTAGE")
            .ok()
            .and_then(|s| Sabotage::ALL.into_iter().find(|x| x.name() == s))
            .unwrap_or(Sabotage::None);
        for seed in from..from + n {
            let t = std::time::Instant::now();
            let r = run(SimConfig { seed, sabotage, ..SimConfig::default() });
            println!(
                "seed {seed}: {:?} ops {} steps {} crashes {}+{} laps {} destaged {} copied {} corrupt {} lost {} ms {}",
                r.violations.first().map(|v| (v.kind, v.cycle, v.block, v.detail.clone())),
                r.operations,
                r.scheduling_steps,
                r.crashes,
                r.crashes_during_recovery,
                r.log_laps,
                r.destaged_blocks,
                r.copied_forward_blocks,
                r.corruptions,
                r.lost_block_errors,
                t.elapsed().as_millis()
            );
        }
    }
}

/// Adversarial review of 394453e: the simulator's cache device is a `TimedDevice` over a
/// `SimDevice`; unless it forwards `read_batch` (and `read_vectored_at`), the seeded order of
/// `SimDevice::read_batch` is never what the simulator's reads go through.
#[cfg(test)]
mod adversarial_batch_tests {
    use super::*;
    use tiercache_device::ReadRange;

    /// A `TimedDevice` over `inner` with no latency, no stalls and fixed seeds.
    pub(super) fn untimed(inner: Arc<SimDevice>, clock: &SimClock) -> TimedDevice {
        TimedDevice {
            inner,
            clock: clock.clone(),
            read_ns: (0, 0),
            write_ns: (0, 0),
            flush_ns: (0, 0),
            stall: 0.0,
            flush_scale: Arc::new(AtomicU64::new(1)),
            rng: Mutex::new(ChaCha8Rng::seed_from_u64(1)),
            overlap_rng: Mutex::new(ChaCha8Rng::seed_from_u64(2)),
        }
    }

    #[test]
    fn adv_timed_device_forwards_read_batch_to_the_sim_device() {
        let clock = SimClock::new();
        let inner = Arc::new(SimDevice::new(64 * 4096, 4096));
        let timed = untimed(Arc::clone(&inner), &clock);
        let (mut a, mut b) = (vec![0u8; 3 * 4096], vec![0u8; 3 * 4096]);
        let before = inner.stats().reads;
        {
            let mut ranges = vec![
                ReadRange { offset: 0, bufs: a.chunks_mut(4096).collect() },
                ReadRange { offset: 16 * 4096, bufs: b.chunks_mut(4096).collect() },
            ];
            assert!(timed.read_batch(&mut ranges).iter().all(|r| r.is_ok()));
        }
        let reads = inner.stats().reads - before;
        assert_eq!(reads, 2, "a batch of two 3-buffer ranges reached the SimDevice as {reads} reads");
    }
}

/// Write-back batch bounds scaled to the simulators' logs (64 to 256 blocks) in half the seeds,
/// so that batches are cut short by their size there (reclaim's segments ahead, the dense
/// pre-clean's windows, a window denser than a batch written back a batch at a time); the
/// shipped bounds (256 to 4,096 blocks, more than these logs hold) in the others. From the
/// seed alone: no draw of the seed's streams changes.
pub(crate) fn write_back_batch_bounds_for(seed: u64) -> Option<(usize, usize)> {
    let min = 2 + (seed / 2 % 4) as usize;
    (seed % 2 == 1).then_some((min, 4 * min))
}

/// The pre-cleaner's idle reach in half the seeds (a stream of its own): data 0, 2 or 20 ms
/// of virtual time old, so that it writes back far ahead of the head, concurrently with
/// writers, reclaims and crashes (the shipped `PRECLEAN_IDLE_AGE_MS`, 10 s, never comes in a
/// seed's few seconds of virtual time: the other half).
pub(crate) fn preclean_idle_age_ms_for(seed: u64) -> Option<u64> {
    let mut r = ChaCha8Rng::seed_from_u64(seed ^ 0x1d1e_a6e5);
    r.gen_bool(0.5).then(|| [0, 2, 20][r.gen_range(0..3)])
}

/// Whether a seed's volumes hand sealed records to a record writer (`Volume::set_record_writer`,
/// as `serve` does): an actor of its own in the concurrent simulator, a step among the others
/// in the serial one; writers then go on while their records wait, and FLUSH, reclaim and a
/// seal short of a buffer write what nobody began. Half the seeds, from a stream of its own.
pub(crate) fn hands_off_records_for(seed: u64) -> bool {
    ChaCha8Rng::seed_from_u64(seed ^ 0x4a4d_0ff5).gen_bool(0.5)
}

/// The eviction policy of a seed (its own stream): the default `adaptive` (misses fill the log
/// until it wraps, the frequency gate as its duel decides: engine volume/admission.rs) in
/// half the seeds, plain `s3fifo` (every miss that is no ghost into the ring) in the rest.
pub(crate) fn eviction_for(seed: u64) -> Eviction {
    if ChaCha8Rng::seed_from_u64(seed ^ 0xad47_71fe).gen_bool(0.5) {
        Eviction::Adaptive
    } else {
        Eviction::S3fifo
    }
}

/// Adversarial review of 5eb9482 (write-back's runs issued together, `write_batch`): the
/// simulator's backing device is a `TimedDevice` over a `SimDevice`.
#[cfg(test)]
mod adversarial_write_batch_tests {
    use super::adversarial_batch_tests::untimed;
    use super::*;

    // Suspicion: `TimedDevice` does not override `write_batch`, so the trait's fallback runs:
    // one `TimedDevice::write_at` after another, each a `SimDevice::write_at`. The crash
    // simulator then never goes through `SimDevice::write_batch` (its seeded completion order,
    // "which write a crash or a fault meets first is the seed's choice"), nor models the runs
    // as in flight together (one latency for the batch): the commit's new path is never
    // crash-simulated. (The same gap was found for `read_batch` in 394453e and fixed.)
    //
    // BUG (coverage of the crash simulator, not of the engine's data): "a batch of three
    // writes reached the SimDevice as 0 write_batch calls (3 writes)".
    // Fixed: `TimedDevice` forwards it, as it does `read_batch` (one latency, then the
    // SimDevice's seeded order).
    #[test]
    fn adv_timed_device_forwards_write_batch_to_the_sim_device() {
        let clock = SimClock::new();
        let inner = Arc::new(SimDevice::new(64 * 4096, 4096));
        let timed = untimed(Arc::clone(&inner), &clock);
        let data = vec![7u8; 4096];
        let before = inner.stats();
        let results = timed.write_batch(&[(0, &data[..]), (8 * 4096, &data[..]), (16 * 4096, &data[..])]);
        assert!(results.iter().all(|r| r.is_ok()));
        let after = inner.stats();
        assert_eq!(
            after.write_batches - before.write_batches,
            1,
            "a batch of three writes reached the SimDevice as {} write_batch calls ({} writes)",
            after.write_batches - before.write_batches,
            after.writes - before.writes
        );
    }
}
