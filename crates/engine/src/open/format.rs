//! Formatting a cache device (`create`): the layout, the superblock, and an empty checkpoint
//! that recovery of a fresh cache starts from (docs/format.md, section 3 and 4.6).

use super::backing::backing_fingerprints;
use crate::error::{EngineError, Result};
use tiercache_device::{AlignedBuf, BlockDevice};
use tiercache_format::constants::*;
use tiercache_format::{
    checksum, uuid_low64, CheckpointHeader, Fingerprint, FingerprintHash, Layout, Superblock, VolumeMode,
};

/// How to format a cache device.
#[derive(Debug, Clone)]
pub struct CreateOptions {
    pub block_size: u32,
    pub segment_blocks: u32,
    pub dirty_low_permille: u16,
    pub dirty_high_permille: u16,
    /// Per mille of the log given to the read cache's probation ring (`Layout::with_probation`;
    /// 0: none, every admitted miss goes into the log as before).
    pub probation_permille: u16,
    /// Recorded for information (`status` shows it).
    pub backing_path: String,
    /// Volume UUID; random when `None`.
    pub uuid: Option<[u8; 16]>,
    /// Seconds since the epoch, recorded for information.
    pub created_unix_secs: u64,
}

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions {
            block_size: DEFAULT_BLOCK_SIZE,
            segment_blocks: DEFAULT_SEGMENT_BLOCKS,
            dirty_low_permille: crate::constants::DEFAULT_DIRTY_LOW_PERMILLE,
            dirty_high_permille: crate::constants::DEFAULT_DIRTY_HIGH_PERMILLE,
            probation_permille: crate::constants::DEFAULT_PROBATION_PERMILLE,
            backing_path: String::new(),
            uuid: None,
            created_unix_secs: 0,
        }
    }
}

/// Formats `cache` as a cache for `backing`. Writes the cache device only: the backing device
/// is read (its size and fingerprint blocks) but never written.
pub fn create(cache: &dyn BlockDevice, backing: &dyn BlockDevice, options: &CreateOptions) -> Result<Superblock> {
    let layout = check_options(cache, backing, options)?;
    let sb = new_superblock(cache, backing, options, layout)?;
    write_empty_volume(cache, &sb)?;
    Ok(sb)
}

/// Refuses options and devices that cannot make a volume; returns the layout of the cache.
fn check_options(cache: &dyn BlockDevice, backing: &dyn BlockDevice, options: &CreateOptions) -> Result<Layout> {
    let bs = options.block_size;
    if options.dirty_low_permille > options.dirty_high_permille || options.dirty_high_permille > 1000 {
        return Err(EngineError::Config(format!(
            "dirty watermarks must satisfy low <= high <= 1000 per mille (got {} and {})",
            options.dirty_low_permille, options.dirty_high_permille
        )));
    }
    if options.probation_permille > MAX_PROBATION_PERMILLE {
        return Err(EngineError::Config(format!(
            "the probation ring takes at most {MAX_PROBATION_PERMILLE} per mille of the log (got {})",
            options.probation_permille
        )));
    }
    let layout = Layout::compute(cache.size_bytes(), bs, options.segment_blocks)
        .map_err(|source| EngineError::Format { device: cache.describe(), source })?
        .with_probation(options.probation_permille);
    for (dev, role) in [(cache, "cache"), (backing, "backing")] {
        if !(bs as u64).is_multiple_of(u64::from(dev.logical_block_size())) {
            return Err(EngineError::Config(format!(
                "block size {bs} is not a multiple of the {role} device's {}-byte logical block size",
                dev.logical_block_size()
            )));
        }
    }
    let backing_size = backing.size_bytes() / u64::from(bs) * u64::from(bs);
    if backing_size != backing.size_bytes() {
        return Err(EngineError::Config(format!(
            "backing device size {} is not a multiple of the {bs}-byte block size",
            backing.size_bytes()
        )));
    }
    if backing_size / u64::from(bs) > MAX_BACKING_BLOCKS {
        return Err(EngineError::Config(format!(
            "backing device of {backing_size} bytes has more than {MAX_BACKING_BLOCKS} blocks of {bs} bytes; use a larger --block-size"
        )));
    }
    Ok(layout)
}

/// The superblock of a new volume: sequence 1, a UUID, the backing device's identity.
fn new_superblock(
    cache: &dyn BlockDevice,
    backing: &dyn BlockDevice,
    options: &CreateOptions,
    layout: Layout,
) -> Result<Superblock> {
    let uuid = options.uuid.unwrap_or_else(|| {
        use rand::RngCore;
        let mut u = [0u8; 16];
        rand::thread_rng().fill_bytes(&mut u);
        u
    });
    Ok(Superblock {
        sequence: 1,
        uuid,
        cache_size_bytes: cache.size_bytes(),
        layout,
        mode: VolumeMode::WriteBack,
        // `check_options` refused a size that is not a multiple of the block size.
        backing_size_bytes: backing.size_bytes(),
        backing_fingerprints: backing_fingerprints(backing, options.block_size, FingerprintHash::Xxh3)?
            .map(|crc| Fingerprint { crc, next: None }),
        fingerprint_hash: FingerprintHash::Xxh3,
        dirty_low_permille: options.dirty_low_permille,
        dirty_high_permille: options.dirty_high_permille,
        created_unix_secs: options.created_unix_secs,
        backing_path: options.backing_path.clone(),
        backing_id: backing.identity().map(|id| tiercache_format::superblock::fit_backing_id(&id)).unwrap_or_default(),
    })
}

/// Writes the empty volume: checkpoints and the log's first block, then the superblock.
fn write_empty_volume(cache: &dyn BlockDevice, sb: &Superblock) -> Result<()> {
    let layout = sb.layout;
    let bs = layout.block_size;
    // An empty checkpoint in area 1 (sequence 1), and area 0 cleared, so that recovery of a
    // fresh cache starts from a known state; then the log's first block cleared, so that no
    // record of a previous format can follow it.
    let mut block = AlignedBuf::new(bs as usize);
    let empty = CheckpointHeader {
        sequence: 1,
        log_position: 0,
        next_record_sequence: 1,
        head_position: 0,
        entry_count: 0,
        entries_crc: checksum(&[]),
        prev_record_checksum: 0,
        epoch: 0,
    };
    let write = |offset: u64, buf: &[u8]| cache.write_at(offset, buf).map_err(EngineError::cache);
    write(layout.checkpoint_area_start[0] * u64::from(bs), &block)?;
    write(layout.log_offset(0), &block)?;
    empty.encode(uuid_low64(&sb.uuid), &mut block);
    write(layout.checkpoint_area_start[1] * u64::from(bs), &block)?;
    cache.flush().map_err(EngineError::cache)?;
    // The superblock last, in both copies: until it is durable the device is not a cache.
    sb.encode(&mut block);
    write(u64::from(bs), &block)?;
    write(0, &block)?;
    cache.flush().map_err(EngineError::cache)
}
