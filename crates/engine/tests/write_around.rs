//! Write-around (issue 13): a large write while the cache is destage-bound goes straight to
//! the backing device. Pinned by counting I/Os and by power cuts at the durable images:
//! - `a_large_write_while_destage_bound_goes_around_the_cache`: no cache I/O, one backing
//!   write, the new data read back; below the high watermark the same write goes through the
//!   cache;
//! - `a_flush_after_a_write_around_flushes_the_backing_device_then_logs_trims`: before the
//!   FLUSH a power cut leaves the older flushed version; after it, the new data, although the
//!   log still holds the older dirty copy (the Trim ends it);
//! - `blocks_with_a_clean_copy_fingerprint_blocks_and_tearing_devices_go_through_the_cache`:
//!   the cases the feature must refuse;
//! - `a_checkpoint_after_a_write_around_flushes_the_backing_device_first`: the checkpoint
//!   omits the dropped copy, so the data it leaves to the backing device must be durable.

use std::sync::Arc;
use tiercache_device::{BlockDevice, MonotonicClock, SimDevice};
use tiercache_engine::{create, CreateOptions, Volume, VolumeOptions, WriteAroundPolicy};
use tiercache_format::Layout;

mod common;
use common::*;

const SEGMENT: u64 = 16;
const LOG_BLOCKS: u64 = 512;
const BACKING_BLOCKS: u64 = 4096;
/// Writes of at least 16 blocks go around (in these tests).
const AROUND: u64 = 16;

/// A 512-block log over a 4096-block backing device stamped with version 0 that never
/// tears a block (`atomic` bytes), write-around from 16 blocks up, whatever the dirty level
/// unless `only_when_destage_bound`.
fn volume_with(atomic: u32, only_when_destage_bound: bool) -> (Arc<SimDevice>, Arc<SimDevice>, Volume) {
    let ck = Layout::checkpoint_blocks_for(LOG_BLOCKS, BS as u32);
    let cache = Arc::new(SimDevice::new((2 + 2 * ck + LOG_BLOCKS) * BS as u64, BS as u32).with_name("cache"));
    let backing = Arc::new(
        SimDevice::from_image(stamps(0, BACKING_BLOCKS, 0), BS as u32).with_name("backing").with_atomic_write(atomic),
    );
    let opts = CreateOptions { segment_blocks: SEGMENT as u32, ..log_only() };
    create(&*cache, &*backing, &opts).expect("create");
    let volume = reopen(&cache, &backing, only_when_destage_bound);
    (cache, backing, volume)
}

fn reopen(cache: &Arc<SimDevice>, backing: &Arc<SimDevice>, only_when_destage_bound: bool) -> Volume {
    let c: Arc<dyn BlockDevice> = cache.clone();
    let b: Arc<dyn BlockDevice> = backing.clone();
    let write_around = WriteAroundPolicy { min_bytes: AROUND * BS as u64, only_when_destage_bound };
    let options = VolumeOptions { write_around, ..VolumeOptions::default() };
    Volume::open(c, b, Arc::new(MonotonicClock::new()), options).expect("open").0
}

/// The volume recovered from both devices' durable images (a power cut now).
fn power_cut(cache: &SimDevice, backing: &SimDevice) -> Volume {
    reopen(&durable_copy(cache), &durable_copy(backing), false)
}

fn versions(volume: &Volume, first: u64, n: u64) -> Vec<Option<u64>> {
    (first..first + n).map(|b| read_version(volume, b).unwrap()).collect()
}

#[test]
fn a_large_write_while_destage_bound_goes_around_the_cache() {
    let (cache, backing, volume) = volume_with(4096, true);
    // Below the high watermark: through the cache.
    volume.write(1000 * BS as u64, &stamps(1000, AROUND, 1)).unwrap();
    assert_eq!(volume.status().counters.written_around_blocks, 0);
    // Dirty data above the high watermark (70 % of the log), no background to drain it.
    let mut b = 2000;
    while volume.status().dirty_blocks * 1000 <= LOG_BLOCKS * 700 {
        volume.write(b * BS as u64, &stamps(b, 8, 1)).unwrap();
        volume.flush().unwrap();
        b += 8;
    }
    let (c0, b0) = (cache.stats(), backing.stats());
    volume.write(3000 * BS as u64, &stamps(3000, 64, 2)).unwrap();
    let (cd, bd) = (delta(cache.stats(), c0), delta(backing.stats(), b0));
    assert_eq!(cd, (0, 0, 0), "a write-around touches no cache device");
    assert_eq!(bd, (0, 1, 0), "one backing write, no flush yet");
    assert_eq!(volume.status().counters.written_around_blocks, 64);
    assert_eq!(versions(&volume, 3000, 64), vec![Some(2); 64]);
    // A small write still goes through the cache.
    volume.write(3100 * BS as u64, &stamps(3100, 1, 2)).unwrap();
    assert_eq!(volume.status().counters.written_around_blocks, 64);
}

#[test]
fn a_flush_after_a_write_around_flushes_the_backing_device_then_logs_trims() {
    let (cache, backing, volume) = volume_with(4096, false);
    const X: u64 = 100;
    // Version 1, flushed, cached dirty (the log holds it).
    volume.write(X * BS as u64, &stamps(X, AROUND / 2, 1)).unwrap();
    volume.flush().unwrap();
    // Version 2 around it (a 16-block write covering the 8 dirty blocks and 8 uncached).
    volume.write(X * BS as u64, &stamps(X, AROUND, 2)).unwrap();
    assert_eq!(volume.status().counters.written_around_blocks, AROUND);
    assert_eq!(volume.status().dirty_blocks, 0, "the older dirty copies left the index");
    assert_eq!(versions(&volume, X, AROUND), vec![Some(2); AROUND as usize]);
    // A power cut before the FLUSH: version 1 where it was flushed, the backing device's
    // version 0 (or 2, had the unflushed write landed) elsewhere; never torn.
    let before = power_cut(&cache, &backing);
    let v = versions(&before, X, AROUND);
    assert!(v[..8].iter().all(|&v| v == Some(1)), "{v:?}");
    assert!(v[8..].iter().all(|&v| v == Some(0) || v == Some(2)), "{v:?}");
    drop(before);
    let b0 = backing.stats();
    volume.flush().unwrap();
    assert_eq!(delta(backing.stats(), b0).2, 1, "the FLUSH flushed the backing device once");
    // After it: version 2 everywhere, though the log still holds the dirty version 1 (the
    // Trim entries end it on replay).
    let after = power_cut(&cache, &backing);
    assert_eq!(versions(&after, X, AROUND), vec![Some(2); AROUND as usize]);
    assert_eq!(after.status().dirty_blocks, 0);
    // A second FLUSH owes nothing to the backing device.
    let b1 = backing.stats();
    volume.flush().unwrap();
    assert_eq!(delta(backing.stats(), b1).2, 0);
}

#[test]
fn blocks_with_a_clean_copy_fingerprint_blocks_and_tearing_devices_go_through_the_cache() {
    let (_cache, _backing, volume) = volume_with(4096, false);
    // A clean copy (admitted by a small read, then written out) of one block of the range.
    let mut buf = vec![0u8; BS];
    volume.read(505 * BS as u64, &mut buf).unwrap();
    volume.checkpoint().unwrap();
    assert_eq!(slot_of(&volume, 505).map(|(_, dirty)| dirty), Some(false));
    volume.write(500 * BS as u64, &stamps(500, AROUND, 1)).unwrap();
    assert_eq!(volume.status().counters.written_around_blocks, 0, "a clean copy on the log");
    // The backing device's fingerprint blocks (0, 1, 16 and the last).
    volume.write(0, &stamps(0, AROUND + 1, 1)).unwrap();
    assert_eq!(volume.status().counters.written_around_blocks, 0, "fingerprint blocks");
    // A clean copy only staged (not yet on the log) is dropped and the write goes around.
    volume.read(605 * BS as u64, &mut buf).unwrap();
    // A range with neither goes around.
    volume.write(600 * BS as u64, &stamps(600, AROUND, 1)).unwrap();
    assert_eq!(volume.status().counters.written_around_blocks, AROUND);
    // A backing device that may tear a 4 KiB block: never.
    let (_c, _b, tearing) = volume_with(512, false);
    tearing.write(600 * BS as u64, &stamps(600, AROUND, 1)).unwrap();
    assert_eq!(tearing.status().counters.written_around_blocks, 0, "a backing device that tears sectors");
}

#[test]
fn a_checkpoint_after_a_write_around_flushes_the_backing_device_first() {
    let (cache, backing, volume) = volume_with(4096, false);
    const X: u64 = 700;
    volume.write(X * BS as u64, &stamps(X, AROUND, 1)).unwrap();
    volume.flush().unwrap();
    volume.write(X * BS as u64, &stamps(X, AROUND, 2)).unwrap();
    let b0 = backing.stats();
    volume.checkpoint().unwrap();
    assert!(
        delta(backing.stats(), b0).2 >= 1,
        "the checkpoint omits the dropped copies: the backing flush comes first"
    );
    // A power cut right after the checkpoint (no FLUSH, no Trim yet): the checkpoint no
    // longer names version 1, and version 2 is durable on the backing device.
    let after = power_cut(&cache, &backing);
    assert_eq!(versions(&after, X, AROUND), vec![Some(2); AROUND as usize]);
}
