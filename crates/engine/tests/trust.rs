//! The three data-loss bugs of the adversarial review (issue 7), each as a small test against
//! the engine's public API, plus the backing-device mix-up. Each failed on the engine before
//! its fix:
//! - `write_back_marks_clean_only_the_version_it_wrote`: a write-back whose backing flush is
//!   slow while the log laps and the same block lands in the same slot again must not mark
//!   the newer version clean (it used to, and reclaim then dropped it: a flushed write lost
//!   with no crash at all);
//! - `a_lost_block_stays_lost_across_flush_checkpoint_and_restart`: a dirty block whose only
//!   copy fails its checksum stays lost (EIO) through `flush_all`, a checkpoint and a
//!   restart, instead of coming back as the stale backing copy;
//! - `a_record_discarded_by_a_crash_never_comes_back`: after a crash drops record k while
//!   k+1 survives, a byte-identical record k written after recovery must not let the old
//!   k+1 chain on again at the next crash;
//! - `a_backing_device_with_other_first_blocks_is_refused`: two backing devices of the same
//!   size and last block are told apart by their first blocks.

use std::sync::Arc;
use tiercache_device::{BlockDevice, MonotonicClock, SimDevice};
use tiercache_engine::{create, CreateOptions, EngineError, Volume, VolumeOptions};
use tiercache_format::Layout;

mod common;
use common::*;

#[test]
fn write_back_marks_clean_only_the_version_it_wrote() {
    let (cache, backing) = devices(8, 64);
    let gated = Gate::new(Arc::clone(&backing));
    let volume = Arc::new(open(cache.clone(), gated.clone()));
    const B: u64 = 5;
    volume.write(B * BS as u64, &stamp(B, 1)).unwrap();
    volume.flush().unwrap();
    let (slot_v1, _) = slot_of(&volume, B).unwrap();

    // The write-back of version 1 reaches the backing flush and is held there.
    gated.hold_flush(0);
    let destager = {
        let volume = Arc::clone(&volume);
        std::thread::spawn(move || volume.destage_step(64))
    };
    gated.wait_until_held();

    // Meanwhile B is rewritten until a newer version lands in version 1's slot (the log laps).
    let mut version = 1;
    loop {
        version += 1;
        assert!(version < 2000, "B never came back to slot {slot_v1}");
        // Shift the record's alignment now and then (another block first), so that B's
        // data block visits every slot as the log laps.
        if version % 3 == 0 {
            volume.write(20 * BS as u64, &stamp(20, version)).unwrap();
        }
        volume.write(B * BS as u64, &stamp(B, version)).unwrap();
        volume.flush().unwrap();
        if slot_of(&volume, B) == Some((slot_v1, true)) && version > 2 {
            break;
        }
    }
    gated.open_gate();
    destager.join().unwrap().unwrap();

    // Version 1 was written back; the newest version is still only in the cache: dirty.
    assert_eq!(slot_of(&volume, B), Some((slot_v1, true)), "the write-back marked a newer version clean");
    // And after the log laps past it again (reclaim drops clean blocks), B still reads newest.
    for i in 0..200u64 {
        let other = 40 + i % 8;
        volume.write(other * BS as u64, &stamp(other, 10_000 + i)).unwrap();
        volume.flush().unwrap();
    }
    assert_eq!(read_version(&volume, B).unwrap(), Some(version));
    // Also after a restart: the MarkClean entry on disk must not name the newer version.
    drop(volume);
    let volume = open(cache.clone(), backing.clone());
    assert_eq!(read_version(&volume, B).unwrap(), Some(version));
}

/// Overwrites the cache device's copy of `block`, which must be dirty, durably with garbage.
fn corrupt_dirty_block(cache: &SimDevice, volume: &Volume, block: u64) {
    assert!(slot_of(volume, block).expect("cached").1);
    corrupt_cached_block(cache, volume, block);
}

#[test]
fn a_lost_block_stays_lost_across_flush_checkpoint_and_restart() {
    let (cache, backing) = devices(16, 64);
    let volume = open(cache.clone(), backing.clone());
    const B: u64 = 9;
    volume.write(B * BS as u64, &stamp(B, 1)).unwrap();
    volume.write(10 * BS as u64, &stamp(10, 1)).unwrap();
    volume.flush().unwrap();
    corrupt_dirty_block(&cache, &volume, B);
    assert!(matches!(read_version(&volume, B), Err(EngineError::LostBlock { block: B })));

    // Writing everything back must not report success while a block is lost.
    match volume.flush_all(|_, _| {}) {
        Err(EngineError::LostBlocks { blocks, .. }) => assert_eq!(blocks, vec![B]),
        other => panic!("flush_all with a lost block returned {other:?}"),
    }
    assert_eq!(volume.status().lost_blocks, 1);
    assert!(matches!(read_version(&volume, B), Err(EngineError::LostBlock { block: B })));
    volume.checkpoint().unwrap();
    drop(volume);

    // After a restart the loss is still known: EIO, never the stale backing copy.
    let volume = open(cache.clone(), backing.clone());
    assert!(matches!(read_version(&volume, B), Err(EngineError::LostBlock { block: B })));
    assert_eq!(volume.status().lost_blocks, 1);
    assert_eq!(read_version(&volume, 10).unwrap(), Some(1));

    // An overwrite ends the loss, durably.
    volume.write(B * BS as u64, &stamp(B, 2)).unwrap();
    assert_eq!(read_version(&volume, B).unwrap(), Some(2));
    volume.flush().unwrap();
    drop(volume);
    let volume = open(cache.clone(), backing.clone());
    assert_eq!(read_version(&volume, B).unwrap(), Some(2));
    assert_eq!(volume.status().lost_blocks, 0);
    volume.flush_all(|_, _| {}).unwrap();
}

#[test]
fn a_lost_block_is_remembered_when_the_log_laps_past_it() {
    // The loss is found by write-back (no reader), then the log laps: the dirty entry the
    // record still names is reclaimed, so only a durable loss record can keep it lost.
    let (cache, backing) = devices(8, 64);
    let volume = open(cache.clone(), backing.clone());
    const B: u64 = 3;
    volume.write(B * BS as u64, &stamp(B, 1)).unwrap();
    volume.flush().unwrap();
    corrupt_dirty_block(&cache, &volume, B);
    volume.destage_step(64).unwrap();
    for i in 0..300u64 {
        let other = 40 + i % 8;
        volume.write(other * BS as u64, &stamp(other, 100 + i)).unwrap();
        volume.flush().unwrap();
    }
    assert!(matches!(read_version(&volume, B), Err(EngineError::LostBlock { block: B })));
    drop(volume); // no shutdown: as after a crash, with everything flushed
    let volume = open(cache.clone(), backing.clone());
    assert!(matches!(read_version(&volume, B), Err(EngineError::LostBlock { block: B })));
}

#[test]
fn a_record_discarded_by_a_crash_never_comes_back() {
    let (cache, backing) = devices(32, 64);
    const B: u64 = 4;
    const C: u64 = 7;
    let volume = open(cache.clone(), backing.clone());
    volume.write(C * BS as u64, &stamp(C, 1)).unwrap();
    volume.flush().unwrap();
    // Record k: B = X. Record k+1: C = 2.
    let (_, _, pos_k) = volume.log_window();
    volume.write(B * BS as u64, &stamp(B, 1)).unwrap();
    volume.flush().unwrap();
    volume.write(C * BS as u64, &stamp(C, 2)).unwrap();
    volume.flush().unwrap();
    let sb = volume.superblock();
    drop(volume);

    // Crash 1 loses record k (its header never reached the medium) and keeps record k+1.
    cache.write_at(sb.layout.log_offset(pos_k), &vec![0u8; BS]).unwrap();
    cache.flush().unwrap();
    let volume = open(cache.clone(), backing.clone());
    assert_eq!(read_version(&volume, B).unwrap(), Some(0));
    assert_eq!(read_version(&volume, C).unwrap(), Some(1), "record k+1 must not replay after a gap");

    // After recovery the same data is written again: record k is rebuilt byte for byte.
    volume.write(B * BS as u64, &stamp(B, 1)).unwrap();
    volume.flush().unwrap();
    drop(volume);

    // Crash 2 (nothing pending): C was read as version 1 after crash 1; version 2 stays gone.
    let volume = open(cache.clone(), backing.clone());
    assert_eq!(read_version(&volume, B).unwrap(), Some(1));
    assert_eq!(read_version(&volume, C).unwrap(), Some(1), "a write discarded by crash 1 came back after crash 2");
}

#[test]
fn a_backing_device_with_other_first_blocks_is_refused() {
    let blocks = 256u64; // 1 MiB
    let log_blocks = 64;
    let ck = Layout::checkpoint_blocks_for(log_blocks, BS as u32);
    let cache = Arc::new(SimDevice::new((2 + 2 * ck + log_blocks) * BS as u64, BS as u32));
    let blank = Arc::new(SimDevice::new(blocks * BS as u64, BS as u32).with_name("blank"));
    let mut image = vec![0u8; (blocks * BS as u64) as usize];
    let mut x: u64 = 0x9e3779b97f4a7c15;
    for byte in image[..(blocks as usize - 1) * BS].iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *byte = x as u8;
    }
    let random = Arc::new(SimDevice::from_image(image, BS as u32).with_name("random"));
    create(&*cache, &*blank, &CreateOptions { segment_blocks: 8, ..log_only() }).unwrap();
    let c: Arc<dyn BlockDevice> = cache.clone();
    match Volume::open(c.clone(), random, Arc::new(MonotonicClock::new()), VolumeOptions::default()) {
        Err(EngineError::WrongBacking { reason, .. }) => assert!(reason.contains("block 0"), "{reason}"),
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a backing device with different first blocks was accepted"),
    }
    open(c, blank);
}

/// Found by the concurrent simulator (seed 209401 at f79a0c8): a dirty copy fails its
/// checksum while a write-back of that very version sits in the backing device's volatile
/// cache, not yet flushed. The engine saw the version on the backing device, forgot its
/// copy, the log moved on past it, and a crash then dropped the unflushed backing write: a
/// flushed write read back as the version before it, without an error.
#[test]
fn a_repair_from_the_backing_device_survives_a_crash() {
    let (cache, backing) = devices(8, 64);
    const B: u64 = 20;
    let volume = open(cache.clone(), backing.clone());
    volume.write(B * BS as u64, &stamp(B, 1)).unwrap();
    volume.flush().unwrap();
    let (slot, dirty) = slot_of(&volume, B).expect("cached");
    assert!(dirty);
    // A write-back of version 1 is in flight: on the backing device, not yet flushed.
    backing.write_at(B * BS as u64, &stamp(B, 1)).unwrap();
    // Bit rot hits the cache copy.
    let layout = volume.superblock().layout;
    cache.corrupt(layout.log_offset(u64::from(slot)), &vec![0xA5u8; BS]);
    assert_eq!(read_version(&volume, B).unwrap(), Some(1), "the backing device holds version 1");
    // The log moves on past the bad copy (reclaim, checkpoints).
    for i in 0..48u64 {
        volume.write((30 + i % 16) * BS as u64, &stamp(30 + i % 16, 1 + i)).unwrap();
        volume.flush().unwrap();
    }
    drop(volume);
    // Power fails: every unflushed write on either device is lost.
    let cache = Arc::new(SimDevice::from_image(cache.durable_image(), BS as u32).with_name("cache"));
    let backing = Arc::new(SimDevice::from_image(backing.durable_image(), BS as u32).with_name("backing"));
    let volume = open(cache, backing);
    match read_version(&volume, B) {
        Ok(v) => assert_eq!(v, Some(1), "a flushed write came back as an older version"),
        Err(e) => assert!(matches!(e, EngineError::LostBlock { .. }), "{e}"),
    }
}
