//! The hybrid volume: a write-back cache on a log-structured cache device in front of a
//! backing device. docs/format.md is the authoritative description of the commit protocol
//! and the crash argument; this header is the map of the code.
//!
//! The files of this module, in the order a write travels:
//! - `staging.rs`: blocks written into RAM, laid out as the record they will be sealed into;
//! - `write.rs`: the write path (`write`, byte-range writes, write-zeroes);
//! - `commit.rs`: the record writer and group commit (`flush`, sealing a record, writing it
//!   at the tail, the cache-device flush that makes it durable);
//! - `reclaim.rs`: making room at the head of the log (evict clean, write back or copy
//!   forward dirty, the reclaim record that moves the head);
//! - `costs.rs`: the measured cost of writing back against copying forward, which decides
//!   what reclaim does with a window dense in dirty blocks;
//! - `checkpoint.rs`: the index written whole, so that recovery replays only what follows;
//! - `read.rs`: the read path (staging, the record in flight, the cache, the backing device;
//!   admission of misses);
//! - `lost.rs`: dirty copies that fail their checksum: lost, or repaired from the backing
//!   device;
//! - `discard.rs`: TRIM;
//! - `writeback.rs`: write-back (destage) in batches, the head pre-cleaner, `write_back_all`;
//! - `write_around.rs`: large writes straight to the backing device while destage-bound, and
//!   what they owe (a backing flush, Trim entries) before anything records the drop of the
//!   older copies;
//! - `background.rs`: the background round (staging age, watermarks, pre-cleaning) and write
//!   backpressure;
//! - `log_io.rs`: reading and writing log positions (wrap-around, runs of slots);
//! - `status.rs`: what `status`, `check` and the simulators see;
//! - `lock_order.rs`: the lock order below, checked.
//!
//! Recovery and `Volume::open` are in `crate::open` (its own map in `open/mod.rs`).
//!
//! Data path:
//! - `write` stages blocks in RAM (the volume is a disk with a volatile write cache); a full
//!   staging buffer is sealed into a log record (header + data, one sequential write).
//! - `flush` seals what is staged, writes it, and flushes the cache device once; concurrent
//!   callers share that flush (group commit). The backing device is not touched.
//! - a writer that finds staging full seals it and writes the record without holding the io
//!   lock, so up to `RECORD_PIPELINE_DEPTH` record writes are in flight (`commit.rs`).
//! - `read` serves staging, the records being written, the cache device (checksum-verified),
//!   or the backing device (admitting small misses into the cache as clean blocks).
//!
//! Locks, always taken in this order: `rmw` (read-modify-write of partial blocks),
//! `io` (the log writer: records sealed in sequence order; reclaim, checkpoints and FLUSH
//! with no record write in progress), `flush gate` (a FLUSH's cache flush under way, taken
//! under the io lock and held after it: `Volume::flush`), `record` (a record write in the pipeline, held by its
//! writer from the seal to the end of the write: `lock_io` waits on it), `around`
//! (write-arounds begin under it; its other holders wait for those under way, so none runs
//! between the backing flush that settles them and the checkpoint or reclaim record relying
//! on it: `write_around.rs`), `destage` (one write-back batch at a time, so a block is never
//! written back twice concurrently; write-arounds begin under it too, and its other holders
//! wait for them), `around-write` (a write-around under way, held by its writer across the
//! backing write), `state` (index, staging, positions; never held across I/O, nor across
//! a walk of the whole index: `scan_index` takes it a chunk of buckets at a time). The
//! superblock's lock is a leaf: taken last (the destager takes it under the destage lock),
//! never held while another is taken.
//! (Debug builds and the `testing` feature check the order per volume: `lock_order.rs`.)
//!
//! Invariants (the O(1) ones asserted at the exits of the record writer, reclaim and
//! checkpoint, in `check_invariants`: the reserve, `head <= checkpoint position <= tail`,
//! `written_tail <= tail`, `durable_sealed <= sealed`; `finish_reclaim` asserts the first one
//! for the window it freed):
//! - every index entry names a slot whose position is in `[head, tail)`;
//! - `tail + reclaim_reserve <= head + log_blocks` after every record write, where the
//!   reserve is `1 + copy_forward_max`: the reclaim record (its header and the blocks it
//!   copies forward) always fits, in space that recovery no longer points into (open restores
//!   it when a recovered log leaves less: `restore_reclaim_reserve`);
//! - `head <= checkpoint position`: replay always starts at or after the head (after a
//!   recovery that fell back to the older checkpoint, true again once open's checkpoint is
//!   written);
//! - records are written in sequence order; `durable_sealed <= sealed`, and `durable_sealed`
//!   only grows, and only after a cache-device flush that started after those records were
//!   written (it counts sealed staging buffers, not sequence numbers, which reclaim records
//!   also consume).

mod admission;
mod background;
mod checkpoint;
mod commit;
mod costs;
mod discard;
mod lock_order;
mod log_io;
mod lost;
mod preload;
mod probation;
mod read;
mod reclaim;
mod staging;
mod status;
mod streams;
mod write;
mod write_around;
mod writeback;

pub use preload::PreloadReport;

pub use write_around::WriteAroundPolicy;

pub(crate) use log_io::read_log;
use writeback::{Elevator, Pace};

/// The state lock's guard (see `lock_order`).
type StateGuard<'a> = lock_order::Ranked<MutexGuard<'a, State>>;
/// The io lock's guard.
type IoGuard<'a> = lock_order::Ranked<MutexGuard<'a, IoBuffers>>;

use crate::constants::*;
use crate::error::{Corruption, EngineError, Result};
use crate::index::{Index, IndexEntry, FREQ_MAX};
use crate::sabotage::sabotaged;
use foldhash::{HashMap, HashMapExt, HashSet, HashSetExt};
use serde::Serialize;
use staging::Staging;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, MutexGuard};
use tiercache_device::{AlignedBuf, BlockDevice, Clock, DeviceError, ReadRange};
use tiercache_format::{
    checksum, uuid_low64, CheckpointEntry, CheckpointHeader, EntryKind, Fingerprint, Layout, RecordEntry, RecordHeader,
    Superblock, FINGERPRINT_BLOCKS,
};
// The engine's locks yield to the simulator's scheduler inside a simulation (and are plain
// std mutexes otherwise): see tiercache-sched.
use tiercache_sched::Mutex;

/// Run-time options of an open volume.
#[derive(Debug, Clone, Copy)]
pub struct VolumeOptions {
    /// Read requests larger than this are not admitted into the cache.
    pub admit_max_request_bytes: u64,
    /// A sequential read stream's misses past this many bytes are not admitted into the
    /// cache (0: admit whatever the stream).
    pub sequential_bypass_bytes: u64,
    /// Checkpoint when this share of the log (per mille) was written since the last one.
    pub checkpoint_interval_permille: u64,
    /// Dirty watermarks (low, high) in per mille of the log for this run, instead of the ones
    /// recorded at format (`serve --dirty-low/--dirty-high` or its config file).
    pub dirty_watermarks_permille: Option<(u16, u16)>,
    /// When writes bypass the cache and go straight to the backing device (write-around).
    pub write_around: WriteAroundPolicy,
    /// The read cache's eviction policy.
    pub eviction: Eviction,
    /// Test machinery: a deliberately broken commit order (the `testing` feature).
    #[cfg(feature = "testing")]
    pub sabotage: crate::Sabotage,
    /// Test machinery: at most this many entries per record (the `testing` feature). The
    /// simulator's logs are tiny, and with full-size records every seal there needs a
    /// reclaim, which waits for the record writes in progress: smaller records let several
    /// be in flight between reclaims, as on a real log.
    #[cfg(feature = "testing")]
    pub record_entries: Option<usize>,
    /// Test machinery: the write-back batch size's bounds (fewest, most blocks) instead of
    /// `DESTAGE_BATCH_MIN_BLOCKS` and `DESTAGE_BATCH_BLOCKS` (the `testing` feature). The
    /// simulators' logs (64 to 256 blocks) never hold a full-size batch's worth of dirty
    /// blocks: scaled down, batches there are cut short by their size as on a real cache.
    #[cfg(feature = "testing")]
    pub write_back_batch_bounds: Option<(usize, usize)>,
    /// Test machinery: the pre-cleaner's idle reach takes data this old instead of
    /// `PRECLEAN_IDLE_AGE_MS` (the `testing` feature): the simulators run for seconds of
    /// virtual time, so the shipped age never comes there.
    #[cfg(feature = "testing")]
    pub preclean_idle_age_ms: Option<u64>,
    /// Test machinery: the pre-cleaner turns gentle while the writers have half its horizon
    /// (at most a quarter of the log) to write, not half of what they wrote in the last
    /// second (the `testing` feature). Tests write a whole small log within milliseconds, a
    /// pace the shipped rule keeps at full speed; this lets them look at the gentle pace's
    /// mechanics on such a log.
    #[cfg(feature = "testing")]
    pub gentle_pace_by_horizon: bool,
}

impl Default for VolumeOptions {
    fn default() -> Self {
        VolumeOptions {
            admit_max_request_bytes: ADMIT_MAX_REQUEST_BYTES,
            sequential_bypass_bytes: SEQUENTIAL_BYPASS_BYTES,
            checkpoint_interval_permille: CHECKPOINT_INTERVAL_PERMILLE,
            dirty_watermarks_permille: None,
            write_around: WriteAroundPolicy::default(),
            eviction: Eviction::default(),
            #[cfg(feature = "testing")]
            sabotage: crate::Sabotage::None,
            #[cfg(feature = "testing")]
            record_entries: None,
            #[cfg(feature = "testing")]
            write_back_batch_bounds: None,
            #[cfg(feature = "testing")]
            preclean_idle_age_ms: None,
            #[cfg(feature = "testing")]
            gentle_pace_by_horizon: false,
        }
    }
}

/// The read cache's eviction policy (reclaim.rs).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Eviction {
    /// S3-FIFO with two additions (the default; `admission.rs`): misses fill the log until
    /// it first wraps (an empty log costs nothing to fill), and a miss of a ghost enters the
    /// log only if read more often lately than the log's next victim, when a miniature
    /// simulation of both rules says that refusal misses less now (`duel.rs`); refused, it
    /// enters the probation ring. On a cache formatted without a ring, `Reinsert`.
    #[default]
    Adaptive,
    /// S3-FIFO on the cache device: a miss enters the probation ring (`probation.rs`), moves
    /// into the log when read again there, and leaves into the ghost queue otherwise; a miss
    /// of a ghost enters the log; the log keeps clean blocks read since cached (reinsertion).
    /// On a cache formatted without a ring, `Reinsert`. (The default before `Adaptive`.)
    S3fifo,
    /// FIFO with reinsertion over the log alone: reclaim keeps clean blocks read since
    /// cached, a miss of a block evicted lately enters with a read counted (the default
    /// before the probation ring).
    Reinsert,
    /// Plain FIFO over the log: reclaim evicts every clean block it passes (the policy
    /// before issue 10, kept to measure against).
    Fifo,
}

impl Eviction {
    /// The policy's name, as `--eviction` takes it.
    pub fn name(self) -> &'static str {
        match self {
            Eviction::Adaptive => "adaptive",
            Eviction::S3fifo => "s3fifo",
            Eviction::Reinsert => "reinsert",
            Eviction::Fifo => "fifo",
        }
    }

    /// Whether the policy uses the probation ring (where the cache has one).
    pub fn has_ring(self) -> bool {
        matches!(self, Eviction::Adaptive | Eviction::S3fifo)
    }
}

impl std::str::FromStr for Eviction {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Eviction, String> {
        match s {
            "adaptive" => Ok(Eviction::Adaptive),
            "s3fifo" => Ok(Eviction::S3fifo),
            "reinsert" => Ok(Eviction::Reinsert),
            "fifo" => Ok(Eviction::Fifo),
            _ => Err(format!("unknown eviction policy {s:?}: adaptive (the default), s3fifo, reinsert or fifo")),
        }
    }
}

/// The log writer's buffer, owned by its lock: where reclaim assembles the record of blocks
/// it copies forward.
struct IoBuffers {
    copy: AlignedBuf,
}

/// A sealed record not yet in the index: its write is in progress, or done but waiting for
/// an older record's (records enter the index in sequence order), or failed. Reads are
/// served from it meanwhile.
struct Inflight {
    position: u64,
    blocks: u64,
    buf: Arc<AlignedBuf>,
    /// The sealed data entries (recycled into staging once written).
    data: Vec<(u64, EntryKind, u32)>,
    /// Backing block -> data index.
    map: HashMap<u64, usize>,
    /// Blocks whose Lost entry this record carries.
    losses: Vec<u64>,
    /// Held by the record's writer from the seal to the end of the write: the io lock's
    /// holders wait on it (`drain_records`).
    writing: Arc<Mutex<()>>,
    /// The write returned: `Some(true)` written, `Some(false)` failed (the volume is
    /// poisoned and the record stays here, so reads keep seeing its data).
    done: Option<bool>,
    /// A thread has begun its write, holding `writing` (set under the state lock). False
    /// only for a record handed off (`commit.rs`) whose write nobody has begun: a thread that
    /// needs it written writes it instead of waiting on `writing`.
    claimed: bool,
}

/// Counters, reported by `status`.
#[derive(Debug, Clone, Copy, Default, Serialize, serde::Deserialize)]
pub struct Counters {
    pub read_requests: u64,
    pub write_requests: u64,
    pub flush_requests: u64,
    pub read_hit_blocks: u64,
    pub read_miss_blocks: u64,
    pub admitted_blocks: u64,
    /// Missed blocks not admitted because their read was larger than the admission limit.
    #[serde(default)]
    pub bypassed_blocks_size: u64,
    /// Missed blocks not admitted because their read continued a long sequential stream.
    #[serde(default)]
    pub bypassed_blocks_sequential: u64,
    /// Missed blocks not admitted because staging was full when their read ended: the
    /// record writer (the background thread) had not yet written out the readers' earlier
    /// admissions, and a read never waits for that.
    #[serde(default)]
    pub bypassed_blocks_busy: u64,
    pub written_blocks: u64,
    pub records_written: u64,
    /// Reads whose cache hits were read as several runs of log slots in flight together
    /// (`BlockDevice::read_batch_each`): hits in several stretches of the log, or more than
    /// `VERIFY_CHUNK_BLOCKS` of them, cut into pieces even where they lie in one stretch.
    #[serde(default)]
    pub batched_cache_reads: u64,
    /// Records sealed while an older record's write was still in progress (the pipeline).
    #[serde(default)]
    pub overlapped_record_writes: u64,
    /// Records written alone by a writer that staged the rest of its request meanwhile
    /// (`BlockDevice::write_at_while`).
    #[serde(default)]
    pub staged_during_record_writes: u64,
    /// Records a lone writer sealed and wrote while its previous record's write was still in
    /// flight (`try_commit_nested`): two of one request's records in flight at once.
    #[serde(default)]
    pub nested_record_writes: u64,
    /// Records sealed by a writer that went on at once, their write handed to the record
    /// writer thread (`commit.rs`, handoff).
    #[serde(default)]
    pub handed_off_records: u64,
    /// Of those, records a reader sealed when its admissions filled staging
    /// (`try_hand_off_staging`).
    #[serde(default)]
    pub handed_off_by_readers: u64,
    /// Of those, records written by a thread that needed them written (a FLUSH, reclaim, a
    /// seal short of a record buffer) before the record writer began them.
    #[serde(default)]
    pub handed_off_records_written_by_waiters: u64,
    /// Records written right after a write was acknowledged, ahead of the FLUSH a committing
    /// client sends next (`Volume::write_ahead`).
    #[serde(default)]
    pub records_written_ahead: u64,
    pub cache_flushes: u64,
    pub destaged_blocks: u64,
    pub backing_flushes: u64,
    pub reclaimed_blocks: u64,
    /// Live dirty blocks that reclaim moved to the tail instead of writing them back.
    pub copied_forward_blocks: u64,
    /// Reclaims that met more dirty blocks than one record holds and copied them forward in
    /// a shorter window instead of writing them back, because that was measured cheaper
    /// (`costs.rs`).
    #[serde(default)]
    pub dense_copy_forwards: u64,
    /// Of those, the windows too dense to free an eighth of themselves, copied because the
    /// log as a whole had room (judged over the lap of the head, `costs.rs`).
    #[serde(default)]
    pub dense_copy_throughs: u64,
    /// Reclaims that wrote dirty blocks back themselves while a writer waited for room.
    #[serde(default)]
    pub reclaim_write_backs: u64,
    /// Dirty blocks the pre-cleaner left at the log head because a sequential writer was about
    /// to supersede them (counted each round it passed them; `writeback.rs`).
    #[serde(default)]
    pub preclean_swept_blocks: u64,
    /// Dirty blocks the pre-cleaner wrote back beyond its horizon, over data not rewritten
    /// for `PRECLEAN_IDLE_AGE_MS`, when nothing within the horizon needed it (`Reach::Idle`).
    #[serde(default)]
    pub preclean_idle_blocks: u64,
    /// Write-back batches run at the gentle pace (`Pace::Gentle`: small log reads, few backing
    /// writes in flight), nothing waiting for them.
    #[serde(default)]
    pub gentle_write_back_batches: u64,
    /// The longest a reclaim waited for the destage lock (the write-back batch under way) before
    /// its own write-back, in microseconds of the volume's clock: batches sized by time bound it
    /// (`DESTAGE_BATCH_MS`).
    #[serde(default)]
    pub reclaim_destage_wait_max_us: u64,
    /// Clean blocks read since they were cached that reclaim moved to the tail instead of
    /// evicting them (the eviction policy's reinsertion).
    #[serde(default)]
    pub reinserted_blocks: u64,
    /// Read misses admitted into the probation ring (also counted in `admitted_blocks`).
    #[serde(default)]
    pub probation_admitted_blocks: u64,
    /// Blocks read again in the probation ring and staged into the log.
    #[serde(default)]
    pub promoted_blocks: u64,
    /// Blocks the probation ring dropped unread (into the ghost queue).
    #[serde(default)]
    pub probation_evicted_blocks: u64,
    /// Admissions into the probation ring left out because its batch was full while the last
    /// one was still being written.
    #[serde(default)]
    pub probation_busy_blocks: u64,
    /// Probation batches written by the record writer thread, not by the reader whose
    /// admission filled them (`write_or_hand_off_probation`).
    #[serde(default)]
    pub probation_batches_by_record_writer: u64,
    /// Read misses admitted into the log, not the probation ring, because the log had not yet
    /// wrapped since the volume was opened (`admission.rs`).
    #[serde(default)]
    pub filling_admitted_blocks: u64,
    /// Misses of ghosts that the frequency gate sent to the probation ring instead of the log
    /// (no more frequent than the log's next victim; `admission.rs`).
    #[serde(default)]
    pub gate_refused_blocks: u64,
    /// Blocks `preload` admitted, or found cached already and marked hot.
    #[serde(default)]
    pub preloaded_blocks: u64,
    pub evicted_blocks: u64,
    pub checkpoints: u64,
    pub repaired_blocks: u64,
    pub throttled_writes: u64,
    /// Blocks written straight to the backing device (write-around).
    #[serde(default)]
    pub written_around_blocks: u64,
    /// Write-arounds that began while another was under way (they run concurrently).
    #[serde(default)]
    pub concurrent_write_arounds: u64,
    /// Large writes of uncached blocks sent around the cache below the high watermark,
    /// because the log's head held dirty data they would have displaced (decisions: a write
    /// refused afterwards by a block's state is counted too).
    #[serde(default)]
    pub written_around_at_dirty_head: u64,
    /// Write-arounds begun beside a write-back batch, without waiting for it (blocks with no
    /// copy in the cache and not in the batch: `write_around.rs`).
    #[serde(default)]
    pub written_around_beside_write_back: u64,
}

struct State {
    index: Index,
    staging: Staging,
    /// Sealed records not yet in the index, oldest first (at most `RECORD_PIPELINE_DEPTH`).
    inflight: VecDeque<Inflight>,
    /// Record buffers free for the next seal (the pipeline's depth: a seal waits for the
    /// oldest record in flight when there is none).
    spare_bufs: Vec<AlignedBuf>,
    /// Oldest live log position (everything below it may be overwritten).
    head: u64,
    /// Next log position to write (a record boundary).
    tail: u64,
    next_seq: u64,
    last_header_crc: u32,
    /// Staging buffers sealed into records so far, and how many of those are durable. FLUSH
    /// compares these (not sequence numbers, which reclaim markers also consume).
    sealed: u64,
    durable_sealed: u64,
    /// The `sealed` count the FLUSH whose cache flush is under way covers (`flush`, which
    /// holds the `flush_gate` across that cache flush): a FLUSH it covers waits for it instead
    /// of issuing one more.
    flushing_sealed: u64,
    /// The `sealed` count of the newest record holding Trim entries (a write-around's, or a
    /// rewrite's of a block written around): a FLUSH owes the Trims of the write-arounds
    /// completed before it began, which another FLUSH may have sealed after this one's target
    /// was taken, and waits until that record is durable too (`flush`).
    trims_sealed: u64,
    /// The highest record sequence known durable (written before a completed cache flush);
    /// each record carries it (`durable_back`) as evidence for recovery.
    durable_seq: u64,
    /// Where the last completed record write ends: log walkers never read past it (a record
    /// between here and `tail` is still being written).
    written_tail: u64,
    /// Every record before this position is durable (a cache flush completed after it was
    /// written).
    durable_tail: u64,
    /// The background pre-cleaner has looked at every record before this position.
    precleaned_until: u64,
    /// Clock time of the last pre-clean batch within the horizon that wrote something back
    /// (`goes_around_now`: the log's room is being bought with write-back).
    precleaned_ns: Option<u64>,
    /// The idle reach (`Reach::Idle`) has looked at every record before this position: its
    /// own cursor, so that the horizon's rounds still judge a window when it comes within
    /// their horizon, with the costs and watermark of then.
    idle_precleaned_until: u64,
    /// Where the run of reclaims that freed nothing began (copies of windows dense to the
    /// last block); `None` once one frees a block. Copying over the lap stops after a quarter
    /// of the log of it (`dense_choice`): the guaranteed end of a writer's reclaim loop.
    barren_since: Option<u64>,
    checkpoint_position: u64,
    /// The position of the checkpoint before it (in the other area): recovery falls back to
    /// it if the newest one is unreadable.
    older_checkpoint_position: u64,
    checkpoint_seq: u64,
    pending_meta: VecDeque<RecordEntry>,
    /// Emptied containers of the last written record, reused by the next seal.
    spare_data: Vec<(u64, EntryKind, u32)>,
    spare_map: HashMap<u64, usize>,
    /// Read-miss fills in flight: block -> (readers, cancelled by a write or a loss).
    /// (A TRIM of the block cancels it too: `discard`.)
    fills: HashMap<u64, (u32, bool)>,
    /// Dirty blocks whose only copy failed its checksum: reads fail until a record holding
    /// newer data of the block is written (see `Lost`).
    lost: BTreeMap<u64, Lost>,
    /// The epoch of the records this run writes (one more than recovery found).
    epoch: u64,
    poisoned: Option<String>,
    /// (log position, clock ns) of recent records, to date the oldest dirty block.
    age_samples: VecDeque<(u64, u64)>,
    counters: Counters,
    /// What freeing dirty blocks at the head has cost so far, each way (`costs.rs`).
    costs: costs::ReclaimCosts,
    destaging: bool,
    /// Writes that went around the cache and what they still owe (see `write_around.rs`).
    around: write_around::Around,
    /// Sequential read streams (`streams.rs`).
    streams: streams::Streams,
    /// Sequential write streams (`streams.rs`, the pre-cleaner's `sweeping` check).
    write_streams: streams::Streams,
    /// The blocks reclaim evicted lately (`ghost.rs`): the eviction policy's memory of the
    /// blocks it let go.
    ghosts: crate::ghost::Ghosts,
    /// Where the frequency gate's search for the log's next victim resumes
    /// (`admission.rs`, `victim_frequency`): no block between the head and here was one.
    victim_cursor: std::cell::Cell<u64>,
    /// Where the search for a densely dirty segment near the head resumes
    /// (`dirty_head_in_the_way`): no segment before it holds more dirty blocks than a reclaim
    /// copies forward. Positions gain dirty entries only when a record's entries enter the
    /// index (`install_record`, a reclaim's copies in `finish_reclaim`), and those move it
    /// back to the record; a write-back, a rewrite or a TRIM only makes them fewer.
    dense_dirty_from: u64,
    /// The read cache's probation ring (`probation.rs`).
    probation: probation::Probation,
    /// How often blocks were read lately, the duel of admission rules, and whether the log
    /// has wrapped since open (`admission.rs`).
    admission: admission::Admission,
    /// Blocks a preload staged (or found staged): they enter the index hot
    /// (`freq_at_install`). Pruned at the end of each preload.
    hot_on_install: HashSet<u64>,
}

impl State {
    /// The newest copy of `block` in a sealed record not yet in the index.
    fn in_flight(&self, block: u64, bs: usize) -> Option<&[u8]> {
        self.inflight.iter().rev().find_map(|r| r.map.get(&block).map(|&k| &r.buf[(1 + k) * bs..(2 + k) * bs]))
    }

    /// The lock of the oldest record whose write has begun and not returned.
    fn oldest_record_writing(&self) -> Option<Arc<Mutex<()>>> {
        self.inflight.iter().find(|r| r.done.is_none() && r.claimed).map(|r| Arc::clone(&r.writing))
    }

    /// Whether a record handed off waits for its write to begin.
    fn has_unclaimed_record(&self) -> bool {
        self.inflight.iter().any(|r| !r.claimed)
    }

    /// Whether a sealed record not yet in the index holds `block`.
    fn is_in_flight(&self, block: u64) -> bool {
        self.inflight.iter().any(|r| r.map.contains_key(&block))
    }

    /// Whether the newest copy of `block` in a sealed record not yet in the index is clean.
    fn is_in_flight_clean(&self, block: u64) -> bool {
        self.inflight.iter().rev().find_map(|r| r.map.get(&block).map(|&k| r.data[k].1 == EntryKind::DataClean))
            == Some(true)
    }

    fn check_poisoned(&self) -> Result<()> {
        match &self.poisoned {
            Some(reason) => Err(EngineError::Poisoned { reason: reason.clone() }),
            None => Ok(()),
        }
    }

    fn poison(&mut self, reason: String) {
        if self.poisoned.is_none() {
            tracing::error!(%reason, "volume failed; writes refused from now on");
            self.poisoned = Some(reason);
        }
    }

    /// The block's data changes (a write, a write-around, a loss): a read of it in flight
    /// must not admit what it read, and the probation ring's copy is no longer current.
    fn cancel_fill(&mut self, block: u64) {
        if let Some(f) = self.fills.get_mut(&block) {
            f.1 = true;
        }
        self.probation.forget(block);
    }

    /// One reader is done with its fill of `block`; returns whether the fill was cancelled.
    fn end_fill(&mut self, block: u64) -> bool {
        let f = self.fills.get_mut(&block).expect("registered fill");
        f.0 -= 1;
        let cancelled = f.1;
        if f.0 == 0 {
            self.fills.remove(&block);
        }
        cancelled
    }
}

/// A lost block: its only dirty copy (at `position`) failed its checksum. It reads as an I/O
/// error until a record holding newer data of it is written; then the entry goes.
///
/// Durability (docs/format.md, "lost blocks"): the loss is written as a `Lost` entry into the
/// next record sealed (`logged`), and as a tombstone into every checkpoint while the entry
/// exists, so it survives the head passing `position` and any restart. A `Lost` entry is
/// never written after a record holding newer data of the block: the entry leaves this map
/// exactly when such a record is written, and an ordinary record never carries both (its own
/// data supersedes the loss). Reclaim's record may carry a loss of a block it copies forward
/// (declared after reclaim read the copy good); the copy comes after it in that record and
/// supersedes it on replay. A loss also ends when a write-back of that very version
/// completes, or when open finds the version on the backing device.
#[derive(Debug, Clone, Copy)]
struct Lost {
    position: u64,
    /// The CRC of the lost version: if the backing device turns out to hold exactly it (a
    /// write-back whose MarkClean a crash dropped), the block is not lost after all.
    crc: u32,
    logged: Logged,
}

/// How far a loss has reached the medium.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Logged {
    /// Only in RAM.
    No,
    /// A `Lost` entry is in the staging record being sealed, not yet written: reclaim (which
    /// runs before that record is written) must still log it itself.
    Staged,
    /// A `Lost` entry is in a written record, or a checkpoint holds its tombstone.
    Yes,
}

/// A block picked for write-back, with the exact version it names: the log position of its
/// copy when the batch was taken. Positions never repeat (slots do, a lap later), so
/// "still current" is "the index still names this position".
#[derive(Debug, Clone, Copy)]
pub(crate) struct Picked {
    block: u64,
    entry: IndexEntry,
    position: u64,
}

/// A hybrid volume. Cheap to share: wrap in an `Arc` and call from many threads.
pub struct Volume {
    pub(crate) cache: Arc<dyn BlockDevice>,
    pub(crate) backing: Arc<dyn BlockDevice>,
    clock: Arc<dyn Clock>,
    pub(crate) layout: Layout,
    uuid_low: u64,
    bs: usize,
    backing_blocks: u64,
    /// The backing device's fingerprint blocks (fixed by its size and the block size).
    fingerprint_blocks: [u64; FINGERPRINT_BLOCKS],
    options: VolumeOptions,
    /// The log writer's lock; holds its buffers.
    io: Mutex<IoBuffers>,
    /// Held by a FLUSH across its cache-device flush, taken with the `io` lock held and kept
    /// after letting it go: the next FLUSH writes its record meanwhile, and a FLUSH covered by
    /// the one under way waits here (`flush`).
    flush_gate: Mutex<()>,
    /// Most entries in a record (see `Staging::limit`).
    staging_limit: usize,
    /// The destager's lock; holds the elevator (`destage_step`).
    destage: Mutex<Elevator>,
    /// The write-around lock (see `lock_around`).
    around: Mutex<()>,
    state: Mutex<State>,
    superblock: Mutex<Superblock>,
    /// Serialises read-modify-write of partial blocks (`write_bytes`).
    rmw: Mutex<()>,
    /// Dirty watermarks in blocks (fixed while open; copied so that no path takes the
    /// superblock lock while holding the state lock).
    dirty_low_blocks: u64,
    dirty_high_blocks: u64,
    /// The same in per mille of the log (for `status`).
    watermarks_permille: (u16, u16),
    background: AtomicBool,
    /// The background thread, woken when readers' admissions fill staging. (A std mutex: the
    /// simulator runs no background thread.)
    background_thread: std::sync::Mutex<Option<std::thread::Thread>>,
    /// Sealed records are handed to a record writer thread (`commit.rs`, handoff), woken
    /// through `record_writer_thread`; without one, a writer writes its own records.
    record_writer: AtomicBool,
    record_writer_thread: std::sync::Mutex<Option<std::thread::Thread>>,
    /// Writes and flushes under way: while any is, reclaim keeps fewer blocks for the
    /// eviction policy where that would make them wait (`reclaim.rs`, `reinsertions`).
    foreground: AtomicUsize,
    /// Writers' reclaims waiting for the destage lock (`lock_destage_for_reclaim`): the
    /// background starts no batch while any does. A mutex lets the thread that releases it
    /// take it again at once, ahead of the thread it wakes: a writer's reclaim waited for the
    /// pre-cleaner's next batches as well as the one under way (1.2 s behind two of them,
    /// MariaDB over an emulated HDD).
    reclaims_at_destage: AtomicUsize,
}

/// One more in a count for as long as it lives, counted down on every way out, a panic's
/// too: a write or flush under way (`Volume::foreground`), a writer's reclaim waiting for
/// the destage lock (`Volume::reclaims_at_destage`).
pub(super) struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    fn new(n: &'a AtomicUsize) -> Counted<'a> {
        n.fetch_add(1, Ordering::SeqCst);
        Counted(n)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// Lets another thread go before asking for a lock again: a scheduling point in the
/// simulators; on real threads, a sleep of `us` microseconds as well.
pub(super) fn pause_before_asking_again(us: u64) {
    tiercache_sched::yield_now();
    if !tiercache_sched::in_simulation() {
        std::thread::sleep(std::time::Duration::from_micros(us));
    }
}

impl Volume {
    /// A write or flush under way, for as long as the guard lives.
    pub(super) fn foreground(&self) -> Counted<'_> {
        Counted::new(&self.foreground)
    }
}

/// What recovery produced, handed to `Volume::assemble`.
pub(crate) struct Recovered {
    pub superblock: Superblock,
    pub index: Index,
    pub head: u64,
    pub tail: u64,
    pub next_seq: u64,
    pub last_header_crc: u32,
    pub checkpoint_position: u64,
    pub checkpoint_seq: u64,
    pub replayed_records: u64,
    /// Lost blocks (tombstones and Lost entries not superseded): block, position, CRC.
    pub lost: Vec<(u64, u64, u32)>,
    /// The highest epoch in the checkpoint and the replayed records.
    pub epoch: u64,
}

impl Volume {
    /// The volume over what recovery found (`open` calls it, then starts a new epoch and
    /// writes a checkpoint). Long only because it names every field of `Volume` and `State`.
    pub(crate) fn assemble(
        cache: Arc<dyn BlockDevice>,
        backing: Arc<dyn BlockDevice>,
        clock: Arc<dyn Clock>,
        r: Recovered,
        options: VolumeOptions,
    ) -> Volume {
        let layout = r.superblock.layout;
        let bs = layout.block_size as usize;
        assert!(layout.log_blocks <= tiercache_format::constants::MAX_LOG_BLOCKS);
        // A record, plus reclaim's reserve, must fit in a small part of the log.

        let staging_limit = RECORD_ENTRIES.min((layout.log_blocks / 8) as usize);
        #[cfg(feature = "testing")]
        let staging_limit = options.record_entries.map_or(staging_limit, |n| staging_limit.min(n));
        let staging_limit = staging_limit.max(2);
        let watermarks = options
            .dirty_watermarks_permille
            .unwrap_or((r.superblock.dirty_low_permille, r.superblock.dirty_high_permille));
        assert!(watermarks.0 <= watermarks.1 && watermarks.1 <= 1000, "dirty watermarks {watermarks:?}");
        Volume {
            cache,
            backing,
            clock,
            layout,
            uuid_low: uuid_low64(&r.superblock.uuid),
            bs,
            backing_blocks: r.superblock.backing_size_bytes / bs as u64,
            fingerprint_blocks: r.superblock.fingerprint_blocks(),
            options,
            // (Record buffers, the staging buffer they swap with and the copy buffer in huge
            // pages: a record's write is then one I/O segment, not one per 4 KiB page;
            // `AlignedBuf::new_huge` gives the figures. 20 MiB of RAM where 6.6 did.)
            io: Mutex::new(IoBuffers { copy: AlignedBuf::new_huge(bs * MAX_RECORD_BLOCKS as usize) }),
            staging_limit,
            destage: Mutex::new(Elevator::default()),
            around: Mutex::new(()),
            flush_gate: Mutex::new(()),
            state: Mutex::new(State {
                index: r.index,
                staging: Staging::new(bs, staging_limit),
                inflight: VecDeque::with_capacity(RECORD_PIPELINE_DEPTH),
                spare_bufs: (0..RECORD_PIPELINE_DEPTH)
                    .map(|_| AlignedBuf::new_huge(bs * MAX_RECORD_BLOCKS as usize))
                    .collect(),
                head: r.head,
                tail: r.tail,
                next_seq: r.next_seq,
                last_header_crc: r.last_header_crc,
                sealed: 0,
                durable_sealed: 0,
                flushing_sealed: 0,
                trims_sealed: 0,
                durable_seq: 0,
                written_tail: r.tail,
                durable_tail: r.tail,
                precleaned_until: r.head,
                precleaned_ns: None,
                idle_precleaned_until: r.head,
                barren_since: None,
                checkpoint_position: r.checkpoint_position,
                older_checkpoint_position: 0,
                checkpoint_seq: r.checkpoint_seq,
                pending_meta: VecDeque::new(),
                spare_data: Vec::with_capacity(RECORD_ENTRIES),
                spare_map: HashMap::with_capacity(RECORD_ENTRIES),
                fills: HashMap::new(),
                lost: r
                    .lost
                    .iter()
                    .map(|&(b, position, crc)| (b, Lost { position, crc, logged: Logged::Yes }))
                    .collect(),
                epoch: r.epoch,
                poisoned: None,
                age_samples: VecDeque::new(),
                counters: Counters::default(),
                costs: costs::ReclaimCosts::default(),
                destaging: false,
                around: write_around::Around::default(),
                streams: streams::Streams::default(),
                write_streams: streams::Streams::for_writes(
                    WRITE_STREAM_REORDER_REQUESTS,
                    WRITE_STREAM_ACTIVE_MS * 1_000_000,
                ),
                // (A log of evictions per generation, 4 bytes of RAM per cache block: the
                // queue remembers the last one to two logs' worth. With half a log per
                // generation, as S3-FIFO sizes its ghost queue, the replay missed 0.97 % more
                // than the best published policy on average over the shared traces, 4.25 % at
                // 25 % of arc_P3, where blocks come back after more than a lap; with a whole
                // log 0.89 % and 1.82 %.)
                ghosts: crate::ghost::Ghosts::new(layout.log_blocks as usize),
                victim_cursor: std::cell::Cell::new(0),
                dense_dirty_from: 0,
                hot_on_install: HashSet::new(),
                probation: probation::Probation::new(
                    if options.eviction.has_ring() { layout.probation_blocks } else { 0 },
                    bs,
                ),
                admission: admission::Admission::new(
                    options.eviction == Eviction::Adaptive && layout.probation_blocks > 0,
                    layout.log_blocks,
                    layout.probation_blocks,
                ),
            }),
            dirty_low_blocks: layout.log_blocks * u64::from(watermarks.0) / 1000,
            dirty_high_blocks: layout.log_blocks * u64::from(watermarks.1) / 1000,
            watermarks_permille: watermarks,
            superblock: Mutex::new(r.superblock),
            rmw: Mutex::new(()),
            background: AtomicBool::new(false),
            background_thread: std::sync::Mutex::new(None),
            record_writer: AtomicBool::new(false),
            foreground: AtomicUsize::new(0),
            reclaims_at_destage: AtomicUsize::new(0),
            record_writer_thread: std::sync::Mutex::new(None),
        }
    }

    /// Starts the epoch of this run (recovery calls it before its checkpoint).
    pub(crate) fn begin_epoch(&self) {
        if !sabotaged!(self, NoRecoveryEpoch) {
            self.lock().epoch += 1;
        }
    }

    /// Whose locks these are, for the lock-order check (the volume's address: locks of two
    /// volumes have no order between them).
    fn lock_owner(&self) -> usize {
        std::ptr::from_ref(self) as usize
    }

    /// The state lock (never held across I/O).
    fn lock(&self) -> StateGuard<'_> {
        lock_order::ranked(self.lock_owner(), lock_order::Rank::State, || {
            self.state.lock().expect("volume state lock poisoned by a panic")
        })
    }

    /// The log writer's lock, with no record write in progress: its holder alone writes the
    /// log (records, reclaim, checkpoints) until it lets go. It waits for the pipeline's
    /// writes to end (`drain_records`).
    fn lock_io(&self) -> IoGuard<'_> {
        let io = self.lock_io_to_seal();
        self.drain_records();
        io
    }

    /// The log writer's lock if it is free (a reader's or the background's opportunistic
    /// record write), drained as `lock_io`.
    fn try_lock_io(&self) -> Option<IoGuard<'_>> {
        let io = self.try_lock_io_to_seal()?;
        self.drain_records();
        Some(io)
    }

    /// `lock_io_to_seal` if the lock is free.
    fn try_lock_io_to_seal(&self) -> Option<IoGuard<'_>> {
        lock_order::try_ranked(self.lock_owner(), lock_order::Rank::Io, || self.io.try_lock().ok())
    }

    /// The log writer's lock, record writes possibly still in progress: enough to seal the
    /// next record (`commit`), not to reclaim, checkpoint or flush.
    fn lock_io_to_seal(&self) -> IoGuard<'_> {
        lock_order::ranked(self.lock_owner(), lock_order::Rank::Io, || self.io.lock().expect("io lock"))
    }

    /// Waits until no record write is in progress (io lock held, so no new one starts).
    /// A failed write counts as ended: the volume is poisoned, and its record stays in
    /// flight for reads. Records handed off whose write has not begun are written here,
    /// not waited for (a failure poisons the volume, which the caller sees).
    fn drain_records(&self) {
        self.write_every_handed_off_record(true);
        self.wait_for_each(lock_order::Rank::Record, State::oldest_record_writing);
    }

    /// The oldest record whose write has not returned.
    fn oldest_record_writing(&self) -> Option<Arc<Mutex<()>>> {
        self.lock().oldest_record_writing()
    }

    /// A record's write lock (see `Inflight::writing`).
    fn lock_record_write<'a>(&self, writing: &'a Mutex<()>) -> lock_order::Ranked<MutexGuard<'a, ()>> {
        self.lock_writers_own(lock_order::Rank::Record, writing)
    }

    /// The lock a writer holds across its own I/O (a record write, a write-around's backing
    /// write), at its rank.
    fn lock_writers_own<'a>(&self, rank: lock_order::Rank, m: &'a Mutex<()>) -> lock_order::Ranked<MutexGuard<'a, ()>> {
        lock_order::ranked(self.lock_owner(), rank, || m.lock().expect("a writer's own lock"))
    }

    /// Waits on writers' own locks (`rank`) until `next` finds none under way: each taken
    /// and let go at once, so the wait ends when that writer's I/O has.
    fn wait_for_each(&self, rank: lock_order::Rank, next: impl Fn(&State) -> Option<Arc<Mutex<()>>>) {
        loop {
            let m = next(&self.lock());
            match m {
                Some(m) => drop(self.lock_writers_own(rank, &m)),
                None => return,
            }
        }
    }

    /// The FLUSH gate (see `Volume::flush_gate`).
    fn lock_flush_gate(&self) -> lock_order::Ranked<MutexGuard<'_, ()>> {
        lock_order::ranked(self.lock_owner(), lock_order::Rank::FlushGate, || {
            self.flush_gate.lock().expect("flush gate")
        })
    }

    /// The write-around lock, with no write-around under way: none begins, and none ends,
    /// between the backing flush that settles them and the checkpoint or reclaim record that
    /// relies on it.
    fn lock_around(&self) -> lock_order::Ranked<MutexGuard<'_, ()>> {
        let around = self.lock_around_to_begin();
        self.wait_for_write_arounds();
        around
    }

    /// The destager's lock (its content is the elevator), with no write-around under
    /// way (none can begin while it is held, but beside a write-back batch that publishes
    /// its blocks: `Around::batch`).
    fn lock_destage(&self) -> lock_order::Ranked<MutexGuard<'_, Elevator>> {
        let destage = self.lock_destage_to_begin();
        self.wait_for_write_arounds();
        destage
    }

    /// The write-around lock as a write-around takes it to begin: write-arounds already
    /// under way may still be writing (they run concurrently; `write_around.rs`).
    fn lock_around_to_begin(&self) -> lock_order::Ranked<MutexGuard<'_, ()>> {
        lock_order::ranked(self.lock_owner(), lock_order::Rank::Around, || self.around.lock().expect("around lock"))
    }

    /// The destage lock as a writer's reclaim takes it, the wait measured for `status`
    /// (`reclaim_destage_wait_max_us`: at most the batch under way, which is sized by time;
    /// the background starts no other meanwhile, `reclaim_waits_for_destage`).
    fn lock_destage_for_reclaim(&self) -> lock_order::Ranked<MutexGuard<'_, Elevator>> {
        let started_ns = self.clock.now_ns();
        let destage = {
            // (A count left up would keep the background from writing back for good.)
            let _waiting = Counted::new(&self.reclaims_at_destage);
            self.lock_destage()
        };
        let waited_us = self.clock.now_ns().saturating_sub(started_ns) / 1000;
        let mut st = self.lock();
        st.counters.reclaim_destage_wait_max_us = st.counters.reclaim_destage_wait_max_us.max(waited_us);
        drop(st);
        destage
    }

    /// A writer's reclaim waits for the destage lock: the background's next batch waits for
    /// it (the background round ends; the next one comes a period later).
    pub(super) fn reclaim_waits_for_destage(&self) -> bool {
        self.reclaims_at_destage.load(Ordering::SeqCst) > 0
    }

    /// The destage lock for a write-back batch that no writer waits for (the background's,
    /// `write_back_all`'s, the elevator's): taken only when no writer's reclaim waits for it.
    /// A thread already queued on the lock when a reclaim came would otherwise take it first
    /// (the online flush queued behind a pre-clean batch: the reclaim waited for both, 130 ms
    /// where one batch took 65), and a thread writing back batch after batch would take it
    /// again at once each time (a flush of 13 batches while a reclaim waited, 854 ms).
    fn lock_destage_behind_reclaims(&self) -> lock_order::Ranked<MutexGuard<'_, Elevator>> {
        loop {
            let destage = self.lock_destage();
            if !self.reclaim_waits_for_destage() {
                return destage;
            }
            drop(destage);
            // (Time for the waiting reclaim, woken by the unlock, to take the lock.)
            pause_before_asking_again(50);
        }
    }

    /// Blocks a writer's reclaim write-back batch takes now (`ReclaimCosts::
    /// write_back_batch_blocks`).
    pub(super) fn write_back_batch_blocks(&self) -> usize {
        let costs = self.lock().costs;
        costs.write_back_batch_blocks(self.batch_bounds(DESTAGE_BATCH_MIN_BLOCKS))
    }

    /// Blocks a background write-back batch takes now: sized the same way, with the lower
    /// floor writers waiting behind it need (`DESTAGE_BACKGROUND_BATCH_MIN_BLOCKS`).
    pub(super) fn background_batch_blocks(&self) -> usize {
        let costs = self.lock().costs;
        costs.write_back_batch_blocks(self.batch_bounds(DESTAGE_BACKGROUND_BATCH_MIN_BLOCKS))
    }

    /// The fewest and most blocks a write-back batch takes: `floor` (a writer's reclaim's
    /// `DESTAGE_BATCH_MIN_BLOCKS`, the background's `DESTAGE_BACKGROUND_BATCH_MIN_BLOCKS`) to
    /// `DESTAGE_BATCH_BLOCKS`; the test bounds, where set, for both.
    pub(super) fn batch_bounds(&self, floor: usize) -> (usize, usize) {
        #[cfg(feature = "testing")]
        if let Some(bounds) = self.options.write_back_batch_bounds {
            return bounds;
        }
        (floor, DESTAGE_BATCH_BLOCKS)
    }

    /// The destage lock as a write-around takes it to begin.
    fn lock_destage_to_begin(&self) -> lock_order::Ranked<MutexGuard<'_, Elevator>> {
        lock_order::ranked(self.lock_owner(), lock_order::Rank::Destage, || self.destage.lock().expect("destage lock"))
    }

    /// The destage lock if it is free (a write-around asks whether it may begin beside the
    /// holder otherwise: `Around::batch`).
    fn try_lock_destage_to_begin(&self) -> Option<lock_order::Ranked<MutexGuard<'_, Elevator>>> {
        lock_order::try_ranked(self.lock_owner(), lock_order::Rank::Destage, || match self.destage.try_lock() {
            Ok(guard) => Some(guard),
            Err(std::sync::TryLockError::WouldBlock) => None,
            Err(std::sync::TryLockError::Poisoned(_)) => panic!("destage lock poisoned"),
        })
    }

    /// Waits until no write-around is under way (the around or the destage lock held, so
    /// none begins meanwhile): each holds its own lock across its backing write.
    fn wait_for_write_arounds(&self) {
        self.wait_for_each(lock_order::Rank::AroundWrite, |st| {
            st.around.under_way.first().map(|(_, _, m)| Arc::clone(m))
        });
    }

    /// A write-around's own lock (see `Around::under_way`).
    fn lock_write_around_write<'a>(&self, m: &'a Mutex<()>) -> lock_order::Ranked<MutexGuard<'a, ()>> {
        self.lock_writers_own(lock_order::Rank::AroundWrite, m)
    }

    /// The volume's size: the backing device's.
    pub fn size_bytes(&self) -> u64 {
        self.backing_blocks * self.bs as u64
    }

    /// The volume's block size (requests must be aligned to it).
    pub fn block_size(&self) -> u32 {
        self.layout.block_size
    }

    /// The superblock as last written (a copy).
    pub fn superblock(&self) -> Superblock {
        lock_order::ranked(self.lock_owner(), lock_order::Rank::Superblock, || {
            self.superblock.lock().expect("superblock lock")
        })
        .clone()
    }

    fn check_request(&self, offset: u64, len: u64) -> Result<()> {
        let bs = self.bs as u64;
        if !offset.is_multiple_of(bs) || !len.is_multiple_of(bs) {
            return Err(EngineError::Misaligned { offset, len, block_size: self.layout.block_size });
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.size_bytes() => Ok(()),
            _ => Err(EngineError::OutOfRange { offset, len, size_bytes: self.size_bytes() }),
        }
    }

    /// The block-aligned span covering a byte range, checked against the volume's size.
    fn aligned_span(&self, offset: u64, len: u64) -> Result<(u64, u64)> {
        let bs = self.bs as u64;
        let end = offset.checked_add(len).filter(|&e| e <= self.size_bytes());
        let Some(end) = end else {
            return Err(EngineError::OutOfRange { offset, len, size_bytes: self.size_bytes() });
        };
        Ok((offset / bs * bs, end.div_ceil(bs) * bs))
    }

    /// The log position of an index entry's copy (entries name slots in `[head, tail)`).
    fn position_of(&self, st: &State, e: &IndexEntry) -> u64 {
        self.layout.position_of_slot(e.slot, st.tail)
    }

    /// Whether `p`, picked from the log earlier, is still its block's dirty copy: not
    /// overwritten, moved, written back, lost, repaired or written around since.
    fn still_dirty_at(&self, st: &State, p: &Picked) -> bool {
        st.index.get(p.block).is_some_and(|c| c.dirty && self.position_of(st, &c) == p.position)
    }

    /// Visits the whole index a chunk of about `INDEX_SCAN_CHUNK` buckets at a time, each
    /// chunk under its own state-lock hold: `visit(state, buckets)`. Every entry present
    /// throughout is visited: a chunk runs on to the end of the run of full buckets it ends
    /// in (`Index::run_end`), so a deletion's backward shift between two holds cannot carry
    /// an entry back past the chunks already visited. (Without that, a TRIM between two
    /// holds hid a dirty block from the elevator and `status`: found by review.) An entry at
    /// the table's first buckets can shift back to its last and be visited twice; entries
    /// written between two holds may or may not be: callers look what they find up again.
    fn scan_index(&self, mut visit: impl FnMut(&State, std::ops::Range<usize>)) {
        let mut from = 0;
        loop {
            let st = self.lock();
            let n = st.index.bucket_count();
            let to = st.index.run_end((from + INDEX_SCAN_CHUNK).min(n));
            visit(&st, from..to);
            drop(st);
            if to >= n {
                return;
            }
            from = to;
        }
    }

    /// The blocks whose current copy lies at log positions `[from, until)`, in position order
    /// (the index's reverse map: no I/O).
    fn live_between<'a>(&'a self, st: &'a State, from: u64, until: u64) -> impl Iterator<Item = Picked> + 'a {
        (from..until).filter_map(move |position| {
            let (block, entry) = st.index.owner(self.layout.slot(position))?;
            Some(Picked { block, entry, position })
        })
    }

    /// The most live dirty blocks a reclaim copies forward instead of writing them back: half
    /// a segment (more means the cache is mostly dirty, and writing back is the right cost),
    /// and no more than a record holds.
    fn copy_forward_max(&self) -> usize {
        (self.layout.segment_blocks as usize / 2).min(self.staging_limit)
    }

    /// Blocks the writer keeps free at the tail for reclaim's copy record.
    fn reclaim_reserve(&self) -> u64 {
        1 + self.copy_forward_max() as u64
    }

    /// Corrupt metadata found while running: poisons the volume and returns the error.
    fn corrupt(&self, what: Corruption) -> EngineError {
        self.lock().poison(format!("cache metadata is corrupt: {what}"));
        EngineError::Corrupt(what)
    }

    /// A cache-device I/O's result: a failure poisons the volume ("`what` failed: ..."),
    /// after which nothing more is written and FLUSH reports the failure. Call with the
    /// state lock free.
    fn cache_io<T>(&self, what: &str, result: std::result::Result<T, DeviceError>) -> Result<T> {
        result.map_err(|e| {
            let e = EngineError::cache(e);
            self.lock().poison(format!("{what} failed: {e}"));
            e
        })
    }

    /// The invariants the record writer, reclaim and checkpoint leave behind (the module
    /// header lists them; `finish_reclaim` checks the index against the window it freed).
    /// Each is O(1): cheap enough to check in every build.
    fn check_invariants(&self, st: &State) {
        assert!(
            st.tail + self.reclaim_reserve() <= st.head + self.layout.log_blocks,
            "the reclaim reserve is not free: head {} tail {} log {}",
            st.head,
            st.tail,
            self.layout.log_blocks
        );
        assert!(st.head <= st.checkpoint_position, "head {} passed the checkpoint {}", st.head, st.checkpoint_position);
        assert!(st.checkpoint_position <= st.tail, "checkpoint {} beyond the tail {}", st.checkpoint_position, st.tail);
        assert!(st.written_tail <= st.tail, "written tail {} beyond the tail {}", st.written_tail, st.tail);
        assert!(st.durable_sealed <= st.sealed, "durable {} of {} sealed records", st.durable_sealed, st.sealed);
    }
}
