//! tiercache's engine: the hybrid volume.
//!
//! A small fast cache device in front of a big slow backing device, as one volume that
//! behaves like a disk with a volatile write cache (docs/design.md, "Semantics"):
//! writes land in a log on the cache device, a FLUSH costs one record write and one
//! cache-device flush, a destager writes dirty blocks back in address order, and after any
//! crash the whole index (clean and dirty) is rebuilt from the cache device alone.
//!
//! Architecture invariant: this crate knows nothing of NBD, FUSE, ublk, async runtimes or
//! metrics exporters; it does no syscalls (devices come through `tiercache_device`), and it
//! runs on any [`Clock`], so the simulator drives it on virtual time.
//!
//! Entry points: [`create`] formats a cache device; [`Volume::open`] recovers and attaches;
//! [`Volume::read`], [`Volume::write`], [`Volume::flush`], [`Volume::discard`] serve I/O;
//! [`Background`] runs the destager and the staging writer. The crash simulators live in
//! the `tiercache-sim` crate; the deliberately broken commit orders they must catch are
//! compiled in only with this crate's `testing` feature.

#![forbid(unsafe_code)]

mod check;
pub mod constants;
mod duel;
mod error;
mod frequency;
mod ghost;
mod index;
mod open;
mod sabotage;
mod volume;

pub use check::CheckReport;
pub use error::{Corruption, EngineError, Result, Role};
pub use index::{index_ram_bytes, IndexEntry};
pub use open::{create, read_superblock, CreateOptions, OpenReport, ReplayEnd, ReplayStop};
#[cfg(feature = "testing")]
pub use sabotage::Sabotage;
pub use volume::{Counters, Eviction, PreloadReport, Volume, VolumeOptions, WriteAroundPolicy};

use serde::Serialize;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::thread::JoinHandle;
pub use tiercache_device::Clock;

/// What `tiercache status` reports.
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub struct Status {
    pub mode: String,
    /// `ok`, or `failed` after a cache-device write or flush error.
    pub state: VolumeState,
    pub failure: Option<String>,
    pub uuid: String,
    pub backing_path: String,
    /// How the backing device's fingerprint blocks are hashed: "xxh3", or "crc32c" in caches
    /// formatted before 2026-11-30 (blind to an ext4 superblock changed outside the cache:
    /// docs/format.md 3). Empty from a server before the field.
    #[serde(default)]
    pub fingerprint_hash: String,
    pub block_size: u32,
    pub cache_size_bytes: u64,
    pub log_bytes: u64,
    pub backing_size_bytes: u64,
    pub cached_blocks: u64,
    pub cached_bytes: u64,
    pub dirty_blocks: u64,
    pub dirty_bytes: u64,
    /// Cached blocks read since they were cached or last kept: the eviction policy keeps
    /// them when the log's head reaches them (clean or dirty).
    #[serde(default)]
    pub hot_blocks: u64,
    /// The read cache's eviction policy this run.
    #[serde(default)]
    pub eviction: Eviction,
    /// Slots of the probation ring in use this run (0: none: formatted without one, or a
    /// policy other than s3fifo), and the copies it holds (blocks read once lately).
    #[serde(default)]
    pub probation_ring_blocks: u64,
    #[serde(default)]
    pub probation_blocks: u64,
    /// Written but not yet in a log record (lost by a crash unless flushed).
    pub staged_blocks: u64,
    pub dirty_low_permille: u16,
    pub dirty_high_permille: u16,
    /// How long ago the oldest dirty copy was written, dated by the records this process
    /// wrote; None with nothing dirty, or when the process has written none yet (a cache only
    /// inspected, a server that has taken no write since it recovered the dirty data).
    pub oldest_dirty_age_seconds: Option<f64>,
    /// Dirty blocks whose only copy failed its checksum: they read as I/O errors until
    /// rewritten, across restarts.
    pub lost_blocks: u64,
    /// The first lost blocks, in address order (at most `STATUS_LOST_BLOCKS_LISTED`).
    #[serde(default)]
    pub lost_block_numbers: Vec<u64>,
    pub read_hit_ratio: Option<f64>,
    pub index_ram_bytes: u64,
    /// Index RAM divided by the blocks the cache can hold.
    pub index_ram_bytes_per_cached_block: f64,
    /// RAM of the eviction policy's ghost queue (about 4 bytes per cache block).
    #[serde(default)]
    pub ghost_ram_bytes: u64,
    /// The adaptive policy only (`null` otherwise): whether the frequency gate refuses
    /// infrequent ghosts now (the duel's choice, off until it finds the gate misses less),
    /// how often that choice changed, and the RAM of the frequency sketch and the duel's two
    /// simulations.
    #[serde(default)]
    pub frequency_gate: Option<bool>,
    #[serde(default)]
    pub policy_switches: u64,
    #[serde(default)]
    pub admission_ram_bytes: u64,
    /// Measured cost of freeing a dirty block at the log's head by writing it back, and by
    /// copying it forward, in microseconds per block (smoothed; null until measured): what
    /// reclaim compares when it meets a window dense in dirty blocks.
    #[serde(default)]
    pub reclaim_write_back_us_per_block: Option<f64>,
    #[serde(default)]
    pub reclaim_copy_us_per_block: Option<f64>,
    /// Blocks a writer's reclaim write-back batch takes now: about 25 ms of write-back at the
    /// measured costs (256 to 4,096).
    #[serde(default)]
    pub write_back_batch_blocks: u64,
    /// Blocks a background write-back batch (the pre-cleaner's, the destager's: the batch a
    /// writer's reclaim may find under way and wait for) takes now: sized the same way, 64 to
    /// 4,096.
    #[serde(default)]
    pub background_batch_blocks: u64,
    /// Blocks a background batch at the gentle pace takes now (`Pace::Gentle`): sized by the
    /// gentle batches' own timing; an eighth of the full-pace one until one was timed.
    #[serde(default)]
    pub gentle_batch_blocks: u64,
    pub log_head: u64,
    pub log_tail: u64,
    pub log_used_permille: u64,
    pub checkpoint_position: u64,
    pub next_sequence: u64,
    pub counters: Counters,
}

/// Whether the volume serves writes (`status` prints it as `ok` or `failed`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum VolumeState {
    Ok,
    /// A cache-device write or flush failed: writes are refused, clean data still reads.
    Failed,
}

impl std::fmt::Display for VolumeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            VolumeState::Ok => "ok",
            VolumeState::Failed => "failed",
        })
    }
}

/// The background workers of a volume: one thread writes out staged data after a while,
/// destages between the watermarks and pre-cleans the head of the log; another, the record
/// writer, writes the records writers seal, so that a writer goes on staging instead of
/// waiting for its record's write (`Volume::set_record_writer`), and the probation ring's
/// batches readers' admissions fill, so that a reader does not wait for one. Stop when dropped.
pub struct Background {
    stop: Arc<AtomicBool>,
    handle: Option<JoinHandle<()>>,
    record_writer: Option<JoinHandle<()>>,
    volume: Weak<Volume>,
}

impl Background {
    pub fn start(volume: &Arc<Volume>) -> Background {
        let stop = Arc::new(AtomicBool::new(false));
        let weak: Weak<Volume> = Arc::downgrade(volume);
        let stop2 = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name("tiercache-bg".into())
            .spawn(move || {
                let period = std::time::Duration::from_millis(constants::BACKGROUND_PERIOD_MS);
                let mut last_error: Option<String> = None;
                while !stop2.load(Ordering::Relaxed) {
                    // Every period, or at once when readers' admissions fill staging.
                    std::thread::park_timeout(period);
                    let Some(v) = weak.upgrade() else { break };
                    if let Err(e) = v.background_tick() {
                        let msg = e.to_string();
                        if last_error.as_ref() != Some(&msg) {
                            tracing::warn!(error = %msg, "background work failed; will retry");
                            last_error = Some(msg);
                        }
                        std::thread::sleep(period * 20);
                    }
                }
            })
            .expect("spawn background thread");
        volume.set_background(Some(handle.thread().clone()));
        let record_writer = Self::start_record_writer(volume, &stop);
        Background { stop, handle: Some(handle), record_writer: Some(record_writer), volume: Arc::downgrade(volume) }
    }

    /// The record writer: woken by each seal (and every period, in case a wake-up was
    /// missed), writes what was handed off. A failed write poisons the volume (logged there);
    /// the records after it are still written, as the failing write's own writer would have.
    fn start_record_writer(volume: &Arc<Volume>, stop: &Arc<AtomicBool>) -> JoinHandle<()> {
        let weak: Weak<Volume> = Arc::downgrade(volume);
        let stop = Arc::clone(stop);
        let handle = std::thread::Builder::new()
            .name("tiercache-rec".into())
            .spawn(move || {
                let period = std::time::Duration::from_millis(constants::BACKGROUND_PERIOD_MS);
                while !stop.load(Ordering::Relaxed) {
                    let Some(v) = weak.upgrade() else { break };
                    v.write_every_handed_off_record(false);
                    v.write_probation_if_full(true);
                    drop(v);
                    std::thread::park_timeout(period);
                }
            })
            .expect("spawn record writer thread");
        volume.set_record_writer(Some(handle.thread().clone()));
        handle
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(v) = self.volume.upgrade() {
            v.set_background(None);
            // (What it was handed and has not begun is written by whoever needs it next.)
            v.set_record_writer(None);
        }
        for h in [self.handle.take(), self.record_writer.take()].into_iter().flatten() {
            h.thread().unpark();
            let _ = h.join();
        }
    }
}
