//! Proves the commit protocol step by step:
//! - countdown error injection: a fixed workload (writes, FUA writes, flushes, reclaim with
//!   copy-forward, checkpoints, write-back) is run once per I/O it issues, with the cache
//!   device (then the backing device) failing for good at exactly that I/O; each time the
//!   devices crash, the volume is recovered, and every block must read as a version at least
//!   as new as its last acknowledged FLUSH;
//! - torn and corrupted log tails on real files: the damaged record is dropped by its
//!   checksums, everything flushed before it survives, and nothing damaged is served.

use std::sync::Arc;
use tiercache_device::{BlockDevice, FailMode, FileDevice, MonotonicClock, OpenOptions, SimDevice};
use tiercache_engine::{create, CreateOptions, Volume, VolumeOptions};
use tiercache_format::Layout;
use tiercache_sim::stamp::{stamped as stamp, version_of};

const BS: usize = 4096;
const BLOCKS: u64 = 96;

fn open(cache: &Arc<SimDevice>, backing: &Arc<SimDevice>) -> Volume {
    let c: Arc<dyn BlockDevice> = cache.clone();
    let b: Arc<dyn BlockDevice> = backing.clone();
    Volume::open(c, b, Arc::new(MonotonicClock::new()), VolumeOptions::default()).expect("recovery").0
}

/// Runs the fixed workload until an operation fails. Returns, per block, the version its last
/// acknowledged FLUSH (or FUA write) made durable.
fn workload(volume: &Volume) -> Vec<u64> {
    let mut durable = vec![0u64; BLOCKS as usize];
    let mut pending: Vec<(u64, u64)> = Vec::new();
    let mut version = 0;
    for round in 0..60u64 {
        for i in 0..6u64 {
            let block = (round * 7 + i * 13) % BLOCKS;
            version += 1;
            let fua = i == 5 && round % 3 == 0;
            let r = if fua {
                volume.write_fua(block * BS as u64, &stamp(block, version))
            } else {
                volume.write(block * BS as u64, &stamp(block, version))
            };
            if r.is_err() {
                return durable;
            }
            if fua {
                durable[block as usize] = version;
            } else {
                pending.push((block, version));
            }
        }
        if volume.flush().is_err() {
            return durable;
        }
        for (b, v) in pending.drain(..) {
            durable[b as usize] = v;
        }
        let extra = match round % 5 {
            0 => volume.destage_step(8).map(|_| ()),
            1 => volume.checkpoint(),
            2 => volume.destage_oldest(4).map(|_| ()),
            _ => Ok(()),
        };
        if extra.is_err() {
            return durable;
        }
    }
    durable
}

fn fresh() -> (Arc<SimDevice>, Arc<SimDevice>) {
    // A small log (16 segments of 8 blocks), so that the workload wraps it several times.
    let log = 128u64;
    let cache =
        Arc::new(SimDevice::new((2 + 2 * Layout::checkpoint_blocks_for(log, BS as u32) + log) * BS as u64, BS as u32));
    let image: Vec<u8> = (0..BLOCKS).flat_map(|b| stamp(b, 0)).collect();
    let backing = Arc::new(SimDevice::from_image(image, BS as u32));
    create(&*cache, &*backing, &CreateOptions { segment_blocks: 8, probation_permille: 0, ..Default::default() })
        .unwrap();
    (cache, backing)
}

#[test]
fn every_io_of_the_commit_protocol_can_fail_and_nothing_flushed_is_lost() {
    for failing_cache in [true, false] {
        // How many I/Os does the whole workload issue on the failing device?
        let (cache, backing) = fresh();
        let v = open(&cache, &backing);
        let before = if failing_cache { cache.stats() } else { backing.stats() };
        workload(&v);
        let after = if failing_cache { cache.stats() } else { backing.stats() };
        let ops = (after.reads + after.writes + after.flushes + after.fua_writes)
            - (before.reads + before.writes + before.flushes + before.fua_writes);
        let (_, _, tail) = v.log_window();
        assert!(tail > 2 * 128, "the workload should wrap the 128-block log at least twice (tail {tail})");
        drop(v);
        let mut failures_seen = 0;
        for n in 0..ops {
            let (cache, backing) = fresh();
            let volume = open(&cache, &backing);
            let failing = if failing_cache { &cache } else { &backing };
            failing.fail_after(None, n, FailMode::Forever);
            let durable = workload(&volume);
            failures_seen += u64::from(failing.stats().failed_ops > 0);
            drop(volume);
            cache.crash(n);
            backing.crash(n.wrapping_mul(7919));
            let volume = open(&cache, &backing);
            let mut buf = vec![0u8; BS];
            for block in 0..BLOCKS {
                volume.read(block * BS as u64, &mut buf).unwrap_or_else(|e| panic!("I/O {n}: block {block}: {e}"));
                let v = version_of(block, &buf).unwrap_or_else(|| panic!("I/O {n}: block {block}: garbage"));
                assert!(
                    v >= durable[block as usize],
                    "I/O {n} failed: block {block} reads version {v}, {} was flushed",
                    durable[block as usize]
                );
            }
        }
        assert!(failures_seen >= ops / 2, "the countdown should hit most I/Os ({failures_seen} of {ops})");
    }
}

/// A volume on real files, with its layout and a way to damage the cache file.
struct FileVolume {
    _dir: tempfile::TempDir,
    cache_path: std::path::PathBuf,
    backing_path: std::path::PathBuf,
}

impl FileVolume {
    fn new() -> FileVolume {
        let dir = tempfile::tempdir().unwrap();
        let cache_path = dir.path().join("cache.img");
        let backing_path = dir.path().join("backing.img");
        std::fs::File::create(&cache_path).unwrap().set_len(8 << 20).unwrap();
        std::fs::write(&backing_path, (0..BLOCKS).flat_map(|b| stamp(b, 0)).collect::<Vec<u8>>()).unwrap();
        let fv = FileVolume { _dir: dir, cache_path, backing_path };
        let (c, b) = fv.devices();
        create(&*c, &*b, &CreateOptions { segment_blocks: 8, probation_permille: 0, ..Default::default() }).unwrap();
        fv
    }

    fn devices(&self) -> (Arc<dyn BlockDevice>, Arc<dyn BlockDevice>) {
        let o = OpenOptions { direct: false, lock: true, read_only: false };
        (
            Arc::new(FileDevice::open_with(&self.cache_path, o).unwrap()),
            Arc::new(FileDevice::open_with(&self.backing_path, o).unwrap()),
        )
    }

    fn open(&self) -> Volume {
        let (c, b) = self.devices();
        Volume::open(c, b, Arc::new(MonotonicClock::new()), VolumeOptions::default()).unwrap().0
    }

    /// Overwrites `len` bytes at byte `offset` of the cache file with `byte`.
    fn damage(&self, offset: u64, len: usize, byte: u8) {
        use std::os::unix::fs::FileExt;
        let f = std::fs::OpenOptions::new().write(true).open(&self.cache_path).unwrap();
        f.write_all_at(&vec![byte; len], offset).unwrap();
    }
}

fn read_version(v: &Volume, block: u64) -> u64 {
    let mut buf = vec![0u8; BS];
    v.read(block * BS as u64, &mut buf).unwrap();
    version_of(block, &buf).expect("intact block")
}

#[test]
fn torn_or_corrupt_tail_records_on_real_files_are_dropped_and_the_rest_survives() {
    // Three cases of damage to the last record: a torn data block (second half old), a torn
    // header (its entries), and garbage over the whole record.
    for case in 0..3 {
        let fv = FileVolume::new();
        let v = fv.open();
        for b in 0..8 {
            v.write(b * BS as u64, &stamp(b, 1)).unwrap();
        }
        v.flush().unwrap();
        let (_, _, tail_before) = v.log_window();
        for b in 0..4 {
            v.write(b * BS as u64, &stamp(b, 2)).unwrap();
        }
        v.flush().unwrap(); // the record to damage: header at tail_before, 4 data blocks
        let layout = v.superblock().layout;
        drop(v);
        let header = layout.log_offset(tail_before);
        match case {
            0 => fv.damage(layout.log_offset(tail_before + 4) + 2048, 2048, 0xee),
            1 => fv.damage(header + 512, 512, 0x11),
            _ => fv.damage(header, 5 * BS, 0x00),
        }
        let v = fv.open();
        for b in 0..8 {
            // Blocks 0-3 fall back to version 1 (the damaged record is not replayed), never garbage.
            assert_eq!(read_version(&v, b), 1, "case {case}, block {b}");
        }
        // The volume keeps working over the damaged tail, and a reopen finds the new writes.
        v.write(0, &stamp(0, 3)).unwrap();
        v.flush().unwrap();
        drop(v);
        let v = fv.open();
        assert_eq!(read_version(&v, 0), 3, "case {case}");
        assert_eq!(read_version(&v, 1), 1, "case {case}");
    }
}

#[test]
fn a_corrupt_checkpoint_falls_back_to_the_other_one() {
    let fv = FileVolume::new();
    let v = fv.open();
    for b in 0..BLOCKS {
        v.write(b * BS as u64, &stamp(b, 5)).unwrap();
    }
    v.checkpoint().unwrap();
    v.write(0, &stamp(0, 6)).unwrap();
    v.checkpoint().unwrap();
    let layout = v.superblock().layout;
    let (_, checkpoint, _) = v.log_window();
    drop(v);
    // Damage the newest checkpoint's entries: its CRC fails; the older one plus the log
    // tail (which reclaim never cut below it) still give every block.
    let newest_area = (0..2)
        .map(|a| layout.checkpoint_area_start[a] * BS as u64)
        .find(|&off| {
            let data = std::fs::read(&fv.cache_path).unwrap();
            let h = tiercache_format::CheckpointHeader::decode(
                &data[off as usize..off as usize + BS],
                tiercache_format::uuid_low64(&tiercache_engine::read_superblock(&*fv.devices().0).unwrap().uuid),
                layout.log_blocks,
            );
            h.is_ok_and(|h| h.log_position == checkpoint)
        })
        .expect("newest checkpoint found");
    fv.damage(newest_area + BS as u64 + 8, 16, 0x77);
    let v = fv.open();
    assert_eq!(read_version(&v, 0), 6);
    for b in 1..BLOCKS {
        assert_eq!(read_version(&v, b), 5, "block {b}");
    }
}

#[test]
fn byte_granular_reads_and_writes_modify_only_their_bytes() {
    let (cache, backing) = fresh();
    let v = open(&cache, &backing);
    let mut model: Vec<u8> = (0..BLOCKS).flat_map(|b| stamp(b, 0)).collect();
    let mut rng = 12345u64;
    for _ in 0..300 {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        let offset = (rng >> 20) % (model.len() as u64 - 20_000);
        let len = 1 + (rng >> 44) % 12_000;
        let data: Vec<u8> = (0..len).map(|i| (i as u8) ^ (rng as u8)).collect();
        v.write_bytes(offset, &data).unwrap();
        model[offset as usize..(offset + len) as usize].copy_from_slice(&data);
        let mut back = vec![0u8; len as usize + 100];
        v.read_bytes(offset.saturating_sub(50), &mut back).unwrap();
        let from = offset.saturating_sub(50) as usize;
        assert_eq!(back, model[from..from + back.len()]);
    }
    let mut all = vec![0u8; model.len()];
    v.read(0, &mut all).unwrap();
    assert!(all == model, "volume differs from the byte model");
    assert!(v.read_bytes(model.len() as u64 - 10, &mut [0u8; 20]).is_err(), "beyond the end");
    // Zeroes over an unaligned range touch exactly that range.
    v.write_zeroes(5000, 10_000).unwrap();
    model[5000..15_000].fill(0);
    v.read(0, &mut all).unwrap();
    assert!(all == model, "write_zeroes over an unaligned range");
    assert!(v.write_zeroes(model.len() as u64 - 10, 20).is_err(), "zeroes beyond the end");
}
