//! The backing device's fingerprints (docs/format.md, section 3) against block 0 of ext4, found
//! by a new-user audit: every ext4 file system's block 0 had one CRC-32C, because its superblock
//! ends in its own CRC-32C (`s_checksum`) with zeroes after it, so a backing device mounted and
//! changed outside the cache passed the check on that block. `create` now fingerprints with
//! XXH3; caches formatted with CRC-32C fingerprints keep them.

use std::sync::Arc;
use tiercache_device::{BlockDevice, SimDevice};
use tiercache_engine::{create, CreateOptions, EngineError};
use tiercache_format::{FingerprintHash, Layout, Superblock};

mod common;
use common::*;

const BLOCKS: u64 = 256;

fn backing_with_block0(block0: &[u8]) -> Arc<SimDevice> {
    let mut image = stamps(0, BLOCKS, 0);
    image[..BS].copy_from_slice(block0);
    Arc::new(SimDevice::from_image(image, BS as u32).with_name("backing"))
}

fn new_cache() -> Arc<SimDevice> {
    let log_blocks = 64;
    let ck = Layout::checkpoint_blocks_for(log_blocks, BS as u32);
    Arc::new(SimDevice::new((2 + 2 * ck + log_blocks) * BS as u64, BS as u32).with_name("cache"))
}

/// Rewrites both superblock copies as a cache formatted before `fingerprint_hash` existed has
/// them: field zero, CRC-32C fingerprints of `backing`.
fn as_formatted_with_crc32c(cache: &SimDevice, backing: &SimDevice) {
    for copy in 0..2u64 {
        let mut block = vec![0u8; BS];
        cache.read_at(copy * BS as u64, &mut block).unwrap();
        let mut sb = Superblock::decode(&block).unwrap();
        sb.fingerprint_hash = FingerprintHash::Crc32c;
        let blocks = sb.fingerprint_blocks();
        for (f, b) in sb.backing_fingerprints.iter_mut().zip(blocks) {
            let mut data = vec![0u8; BS];
            backing.read_at(b * BS as u64, &mut data).unwrap();
            f.crc = FingerprintHash::Crc32c.of(&data);
        }
        sb.encode(&mut block);
        assert_eq!(&block[368..372], &[0; 4], "the field of a cache formatted before it");
        cache.write_at(copy * BS as u64, &block).unwrap();
    }
    cache.flush().unwrap();
}

/// What made the audit's case pass unseen, pinned so that the reason stays true: two different
/// ext4 superblocks give block 0 the same CRC-32C, and different XXH3 fingerprints.
#[test]
fn crc32c_cannot_tell_two_ext4_superblocks_apart_and_xxh3_can() {
    let (a, b) = (ext4_block0(1), ext4_block0(2));
    assert_ne!(a, b);
    assert_eq!(FingerprintHash::Crc32c.of(&a), FingerprintHash::Crc32c.of(&b), "CRC-32C is blind here");
    assert_ne!(FingerprintHash::Xxh3.of(&a), FingerprintHash::Xxh3.of(&b));
    // The blindness needs the embedded CRC: with it off by one bit, CRC-32C tells them apart.
    let mut c = ext4_block0(3);
    c[2044] ^= 1;
    assert_ne!(FingerprintHash::Crc32c.of(&a), FingerprintHash::Crc32c.of(&c));
}

/// The audit's case: the backing device's ext4 superblock changed outside the cache (a mount
/// of the backing device itself rewrites its mount count and times, and the self-CRC with
/// them), nothing else. A cache `create` formats refuses it, naming block 0.
#[test]
fn a_backing_device_whose_ext4_superblock_changed_outside_the_cache_is_refused() {
    let cache = new_cache();
    let backing = backing_with_block0(&ext4_block0(1));
    create(&*cache, &*backing, &CreateOptions { segment_blocks: 8, ..log_only() }).unwrap();
    drop(open(cache.clone(), backing.clone()));
    backing.write_at(0, &ext4_block0(2)).unwrap();
    backing.flush().unwrap();
    match try_open(cache.clone(), backing.clone()) {
        Err(EngineError::WrongBacking { reason, .. }) => {
            assert!(reason.contains("block 0") && reason.contains("xxh3"), "{reason}")
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a backing device changed outside the cache was accepted"),
    }
    // Put back, it is the same device again.
    backing.write_at(0, &ext4_block0(1)).unwrap();
    drop(open(cache, backing));
}

/// A cache formatted with CRC-32C fingerprints opens as before, keeps CRC-32C for its
/// fingerprints (a write-back of block 0 updates them with it: the next open checks the new
/// content), and still refuses a change that CRC-32C sees.
#[test]
fn a_cache_with_crc32c_fingerprints_keeps_them() {
    let cache = new_cache();
    let backing = backing_with_block0(&ext4_block0(1));
    create(&*cache, &*backing, &CreateOptions { segment_blocks: 8, ..log_only() }).unwrap();
    as_formatted_with_crc32c(&cache, &backing);
    let volume = open(cache.clone(), backing.clone());
    assert_eq!(volume.superblock().fingerprint_hash, FingerprintHash::Crc32c);
    // Block 0 rewritten through the volume and written back: the fingerprint follows.
    volume.write(0, &stamp(0, 7)).unwrap();
    volume.flush().unwrap();
    volume.write_back_all(1.0, |_, _| true).unwrap();
    let sb = volume.superblock();
    assert_eq!(sb.fingerprint_hash, FingerprintHash::Crc32c);
    assert_eq!(sb.backing_fingerprints[0].crc, FingerprintHash::Crc32c.of(&stamp(0, 7)));
    assert_eq!(sb.backing_fingerprints[0].next, None);
    drop(volume);
    drop(open(cache.clone(), backing.clone()));
    // A change of block 0 that CRC-32C sees is refused.
    backing.write_at(0, &stamp(0, 8)).unwrap();
    match try_open(cache, backing) {
        Err(EngineError::WrongBacking { reason, .. }) => {
            assert!(reason.contains("block 0") && reason.contains("crc32c"), "{reason}")
        }
        Err(e) => panic!("wrong error: {e}"),
        Ok(_) => panic!("a changed block 0 was accepted"),
    }
}

/// A new cache's fingerprints are XXH3's, and a write-back of a fingerprint block keeps them
/// XXH3's.
#[test]
fn a_new_cache_fingerprints_with_xxh3_and_write_back_keeps_it() {
    let cache = new_cache();
    let backing = backing_with_block0(&ext4_block0(1));
    create(&*cache, &*backing, &CreateOptions { segment_blocks: 8, ..log_only() }).unwrap();
    let volume = open(cache.clone(), backing.clone());
    let sb = volume.superblock();
    assert_eq!(sb.fingerprint_hash, FingerprintHash::Xxh3);
    assert_eq!(sb.backing_fingerprints[0].crc, FingerprintHash::Xxh3.of(&ext4_block0(1)));
    volume.write(0, &ext4_block0(2)).unwrap();
    volume.flush().unwrap();
    volume.write_back_all(1.0, |_, _| true).unwrap();
    assert_eq!(volume.superblock().backing_fingerprints[0].crc, FingerprintHash::Xxh3.of(&ext4_block0(2)));
    drop(volume);
    drop(open(cache, backing));
}
