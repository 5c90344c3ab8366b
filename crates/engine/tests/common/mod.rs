//! Helpers shared by the engine's test files: stamped blocks, small simulated devices, a
//! volume opened on them, power cuts, and reading, locating and rotting one block.
// (Each test file is its own crate and uses a different subset of these.)
#![allow(dead_code)]

use std::sync::Arc;
use tiercache_device::{BlockDevice, MonotonicClock, SimDevice};
use tiercache_engine::{create, CreateOptions, EngineError, Volume, VolumeOptions};
use tiercache_format::Layout;

pub const BS: usize = 4096;

/// A block carrying its number and a version (the simulators' encoding), and the version
/// of `block` a read returned if the data is intact and is that block's.
pub use tiercache_sim::stamp::{stamped as stamp, version_of};

/// Blocks `first..first + n`, each stamped with `version`.
pub fn stamps(first: u64, n: u64, version: u64) -> Vec<u8> {
    (first..first + n).flat_map(|b| stamp(b, version)).collect()
}

/// A cache of `log_segments` segments of `seg` blocks, and a backing device of `blocks`
/// blocks stamped with version 0.
pub fn devices_seg(log_segments: u64, seg: u32, blocks: u64, opts: CreateOptions) -> (Arc<SimDevice>, Arc<SimDevice>) {
    let log_blocks = log_segments * u64::from(seg);
    let ck = Layout::checkpoint_blocks_for(log_blocks, BS as u32);
    let cache = Arc::new(SimDevice::new((2 + 2 * ck + log_blocks) * BS as u64, BS as u32).with_name("cache"));
    let backing = Arc::new(SimDevice::from_image(stamps(0, blocks, 0), BS as u32).with_name("backing"));
    create(&*cache, &*backing, &CreateOptions { segment_blocks: seg, ..opts }).expect("create");
    (cache, backing)
}

/// `devices_seg` with segments of 8 blocks and default options.
pub fn devices(log_segments: u64, blocks: u64) -> (Arc<SimDevice>, Arc<SimDevice>) {
    devices_seg(log_segments, 8, blocks, CreateOptions::default())
}

pub fn try_open(cache: Arc<dyn BlockDevice>, backing: Arc<dyn BlockDevice>) -> Result<Volume, EngineError> {
    Volume::open(cache, backing, Arc::new(MonotonicClock::new()), VolumeOptions::default()).map(|(v, _)| v)
}

pub fn open(cache: Arc<dyn BlockDevice>, backing: Arc<dyn BlockDevice>) -> Volume {
    try_open(cache, backing).expect("open")
}

/// A power cut now: fresh devices holding only what is durable.
pub fn durable_copy(dev: &SimDevice) -> Arc<SimDevice> {
    Arc::new(SimDevice::from_image(dev.durable_image(), BS as u32))
}

pub fn read_version(v: &Volume, block: u64) -> Result<Option<u64>, EngineError> {
    let mut buf = vec![0u8; BS];
    v.read(block * BS as u64, &mut buf)?;
    Ok(version_of(block, &buf))
}

pub fn is_lost(r: &Result<Option<u64>, EngineError>, block: u64) -> bool {
    matches!(r, Err(EngineError::LostBlock { block: b }) if *b == block)
}

/// The slot and dirty flag of `block`'s cached copy.
pub fn slot_of(v: &Volume, block: u64) -> Option<(u32, bool)> {
    v.index_snapshot().into_iter().find(|(b, _)| *b == block).map(|(_, e)| (e.slot, e.dirty))
}

/// Overwrites the cache device's copy of `block` durably with garbage (bad media).
pub fn corrupt_cached_block(cache: &SimDevice, volume: &Volume, block: u64) {
    let (slot, _) = slot_of(volume, block).expect("cached");
    let offset = volume.superblock().layout.log_offset(u64::from(slot));
    cache.write_at(offset, &vec![0xEEu8; BS]).unwrap();
    cache.flush().unwrap();
}

/// Writes `block` stamped with `version`.
pub fn write(v: &Volume, block: u64, version: u64) {
    v.write(block * BS as u64, &stamp(block, version)).unwrap();
}
