//! Opening a volume: formatting a cache device, recovery (from the cache device alone, the
//! whole index, clean and dirty, from the newest valid checkpoint plus the valid log tail),
//! the backing device's identity check, and `Volume::open` / `Volume::inspect`.
//!
//! - `format.rs`: `create` and `CreateOptions` (formatting a cache device);
//! - `superblock.rs`: `read_superblock` (reading and choosing a copy);
//! - `checkpoint.rs`: reading the checkpoint areas and choosing the newest valid one;
//! - `scan.rs`: recovery's pass 1, the log scan, and why it stops (`ReplayStop`, `ReplayEnd`);
//! - `rebuild.rs`: recovery's pass 2, the index and the lost set;
//! - `recover.rs`: `recover`, the two passes over the superblock and checkpoint;
//! - `backing.rs`: the backing device's fingerprints and identity check, `NoBacking`;
//! - this file: `Volume::open` (recover, attach, flush, recheck lost blocks against the
//!   backing device, new epoch, restore the reclaim reserve, checkpoint) and
//!   `Volume::inspect` (recover, and with a backing device attach and the recheck in RAM;
//!   writes nothing).
//!
//! docs/format.md 4.6 is the decision table recovery implements, one row per case.

mod backing;
mod checkpoint;
mod format;
mod rebuild;
mod recover;
mod scan;
mod superblock;

pub use format::{create, CreateOptions};
pub use scan::{ReplayEnd, ReplayStop};
pub use superblock::read_superblock;

use crate::error::{EngineError, Result};
use crate::volume::{Volume, VolumeOptions};
use backing::{check_backing, NoBacking};
use recover::recover;
use std::sync::Arc;
use tiercache_device::{BlockDevice, Clock};

/// What `open` found, for logs and benchmarks.
#[derive(Debug, Clone, Copy)]
pub struct OpenReport {
    pub replayed_records: u64,
    pub recovered_blocks: u64,
    pub recovered_dirty_blocks: u64,
    /// Where log replay ended and why.
    pub replay_end: ReplayEnd,
}

impl Volume {
    /// Opens (recovers) a volume: the cache is warm immediately, clean and dirty blocks alike.
    pub fn open(
        cache: Arc<dyn BlockDevice>,
        backing: Arc<dyn BlockDevice>,
        clock: Arc<dyn Clock>,
        options: VolumeOptions,
    ) -> Result<(Volume, OpenReport)> {
        let (recovered, replay_end) = recover(&*cache)?;
        check_backing(&recovered.superblock, &recovered, &*backing)?;
        let report = OpenReport {
            replayed_records: recovered.replayed_records,
            recovered_blocks: recovered.index.len() as u64,
            recovered_dirty_blocks: recovered.index.dirty_len() as u64,
            replay_end,
        };
        let volume = Volume::assemble(cache, backing, clock, recovered, options);
        // What was replayed may sit in the device's volatile cache only (after a process
        // kill); a later FLUSH must not return before it is durable. So flush, then write a
        // checkpoint carrying a new epoch before serving anything: records written from now
        // on differ from every record written before this recovery, so none of those left
        // beyond the recovered tail can ever chain onto them (docs/format.md, "the
        // post-recovery chain rule"). The checkpoint also starts the next recovery here.
        volume.cache.flush().map_err(EngineError::cache)?;
        volume.recheck_lost_against_backing();
        volume.begin_epoch();
        volume.restore_reclaim_reserve()?;
        volume.checkpoint()?;
        Ok((volume, report))
    }

    /// Recovers the index without writing anything, for `status` and `check`. With a backing
    /// device, checks that it is the right one; without, any backing I/O fails.
    pub fn inspect(
        cache: Arc<dyn BlockDevice>,
        backing: Option<Arc<dyn BlockDevice>>,
        clock: Arc<dyn Clock>,
    ) -> Result<Volume> {
        let (recovered, _) = recover(&*cache)?;
        let checked = backing.is_some();
        let backing: Arc<dyn BlockDevice> = match backing {
            Some(b) => {
                check_backing(&recovered.superblock, &recovered, &*b)?;
                b
            }
            None => Arc::new(NoBacking {
                size_bytes: recovered.superblock.backing_size_bytes,
                block_size: recovered.superblock.layout.block_size,
            }),
        };
        let volume = Volume::assemble(cache, backing, clock, recovered, VolumeOptions::default());
        if checked {
            // Read-only: only the RAM view changes (what the next open would also conclude).
            volume.recheck_lost_against_backing();
        }
        Ok(volume)
    }
}
