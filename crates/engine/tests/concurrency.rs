//! Proves the FLUSH contract under concurrency: several writer threads (each owning its own
//! blocks), a background thread destaging and pre-cleaning, a log small enough that reclaim
//! and checkpoints run inside other threads' flushes, and the cache or backing device failing
//! for good at a random I/O. After the crash and recovery, every block reads as a version at
//! least as new as the last one whose FLUSH returned Ok, and never anything not written.
//!
//! The single-threaded simulator (crates/sim/src/serial.rs) cannot see races between group commit,
//! reclaim markers and the background thread; this test exists for them.

use rand::{Rng, SeedableRng};
use std::sync::{Arc, Mutex};
use tiercache_device::{BlockDevice, FailMode, MonotonicClock, SimDevice};
use tiercache_engine::{create, Background, CreateOptions, Volume, VolumeOptions};
use tiercache_format::Layout;
use tiercache_sim::stamp::{stamped as stamp, version_of as unstamp};

const BS: usize = 4096;
const THREADS: u64 = 4;
const BLOCKS_PER_THREAD: u64 = 48;
/// The threads' blocks start here: blocks 0, 1 and 16 and the last block are the backing
/// device's fingerprint blocks, and leaving them alone keeps the oracle's two non-atomic
/// snapshots (cache image, then backing image) consistent with each other.
const FIRST: u64 = 17;

/// Per block: the last version acknowledged by a FLUSH, and every version written.
#[derive(Default, Clone)]
struct Model {
    flushed: u64,
    written: Vec<u64>,
}

/// The durability oracle: recovers a copy of what is durable right now (the crash in which
/// every pending write is lost) and checks `acked` (block, version) pairs against it. The
/// cache image is taken first: write-back only ever makes the backing device newer.
fn assert_durable(seed: u64, cache: &SimDevice, backing: &SimDevice, acked: &[(u64, u64)]) {
    let c: Arc<dyn BlockDevice> = Arc::new(SimDevice::from_image(cache.durable_image(), BS as u32));
    let b: Arc<dyn BlockDevice> = Arc::new(SimDevice::from_image(backing.durable_image(), BS as u32));
    let copy = Volume::inspect(c, Some(b), Arc::new(MonotonicClock::new()))
        .unwrap_or_else(|e| panic!("seed {seed}: durable state does not recover: {e}"));
    let mut buf = vec![0u8; BS];
    for &(block, version) in acked {
        copy.read(block * BS as u64, &mut buf).unwrap();
        let v = unstamp(block, &buf).unwrap_or_else(|| panic!("seed {seed}: block {block}: garbage in durable state"));
        assert!(v >= version, "seed {seed}: FLUSH returned Ok but block {block} is durable at version {v} < {version}");
    }
}

fn run(seed: u64) {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let log_blocks = 16 * 8u64;
    let ck = Layout::checkpoint_blocks_for(log_blocks, BS as u32);
    let cache = Arc::new(SimDevice::new((2 + 2 * ck + log_blocks) * BS as u64, BS as u32).with_name("cache"));
    let total = FIRST + THREADS * BLOCKS_PER_THREAD + 1;
    let image: Vec<u8> = (0..total).flat_map(|b| stamp(b, 0)).collect();
    let backing = Arc::new(SimDevice::from_image(image, BS as u32).with_name("backing"));
    create(
        &*cache,
        &*backing,
        &CreateOptions {
            segment_blocks: 8,
            dirty_low_permille: 100,
            dirty_high_permille: 300,
            probation_permille: 0,
            ..Default::default()
        },
    )
    .unwrap();
    let (volume, _) =
        Volume::open(cache.clone(), backing.clone(), Arc::new(MonotonicClock::new()), VolumeOptions::default())
            .unwrap();
    let volume = Arc::new(volume);
    let background = Background::start(&volume);
    // Either a device fails at a random I/O, or the cache device vanishes the instant the
    // K-th FLUSH returns Ok: then nothing more becomes durable, and a FLUSH that returned
    // before its writes were durable loses them at the crash.
    let vanish_after_flush: u64 = if rng.gen_bool(0.7) {
        rng.gen_range(5..150)
    } else {
        let failing: Arc<SimDevice> = if rng.gen_bool(0.8) { cache.clone() } else { backing.clone() };
        failing.fail_after(None, rng.gen_range(200..6000), FailMode::Forever);
        u64::MAX
    };
    let flushes = Arc::new(std::sync::atomic::AtomicU64::new(0));
    // Rare flushes let staging fill, so records are also sealed by writers (no flush) while
    // another thread waits to flush: the interleaving group commit must get right.
    let flush_probability = [0.02, 0.05, 0.2][rng.gen_range(0..3)];

    let models: Vec<Arc<Mutex<Vec<Model>>>> = (0..THREADS)
        .map(|_| Arc::new(Mutex::new(vec![Model { flushed: 0, written: vec![0] }; BLOCKS_PER_THREAD as usize])))
        .collect();
    let handles: Vec<_> = (0..THREADS)
        .map(|t| {
            let volume = Arc::clone(&volume);
            let model = Arc::clone(&models[t as usize]);
            let (cache, backing, flushes) = (Arc::clone(&cache), Arc::clone(&backing), Arc::clone(&flushes));
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed * 100 + t);
            std::thread::spawn(move || {
                let mut version = 1u64;
                let mut pending: Vec<(usize, u64)> = Vec::new();
                for _ in 0..3000 {
                    let i = rng.gen_range(0..BLOCKS_PER_THREAD);
                    let block = FIRST + t * BLOCKS_PER_THREAD + i;
                    version += 1;
                    model.lock().unwrap()[i as usize].written.push(version);
                    if volume.write(block * BS as u64, &stamp(block, version)).is_err() {
                        return;
                    }
                    pending.push((i as usize, version));
                    if rng.gen_bool(flush_probability) {
                        if volume.flush().is_err() {
                            return;
                        }
                        let n = flushes.fetch_add(1, std::sync::atomic::Ordering::SeqCst) + 1;
                        if n == vanish_after_flush {
                            cache.vanish();
                        }
                        let acked: Vec<(u64, u64)> =
                            pending.iter().map(|&(i, v)| (FIRST + t * BLOCKS_PER_THREAD + i as u64, v)).collect();
                        assert_durable(seed, &cache, &backing, &acked);
                        let mut m = model.lock().unwrap();
                        for (i, v) in pending.drain(..) {
                            m[i].flushed = m[i].flushed.max(v);
                        }
                    }
                    if rng.gen_bool(0.3) {
                        let j = rng.gen_range(0..BLOCKS_PER_THREAD);
                        let b = FIRST + t * BLOCKS_PER_THREAD + j;
                        let mut buf = vec![0u8; BS];
                        if volume.read(b * BS as u64, &mut buf).is_ok() {
                            let expect = *model.lock().unwrap()[j as usize].written.last().unwrap();
                            assert_eq!(unstamp(b, &buf), Some(expect), "seed {seed}: live read of block {b}");
                        }
                    }
                }
            })
        })
        .collect();
    for h in handles {
        h.join().expect("writer thread panicked");
    }
    drop(background);
    drop(volume);
    cache.clear_faults();
    cache.crash(rng.gen());
    backing.crash(rng.gen());
    let cache_dyn: Arc<dyn BlockDevice> = cache.clone();
    let (volume, _) =
        Volume::open(cache_dyn, backing.clone(), Arc::new(MonotonicClock::new()), VolumeOptions::default())
            .unwrap_or_else(|e| panic!("seed {seed}: recovery failed: {e}"));
    let mut buf = vec![0u8; BS];
    for t in 0..THREADS {
        let model = models[t as usize].lock().unwrap();
        for i in 0..BLOCKS_PER_THREAD {
            let block = FIRST + t * BLOCKS_PER_THREAD + i;
            volume.read(block * BS as u64, &mut buf).unwrap_or_else(|e| panic!("seed {seed}: block {block}: {e}"));
            let m = &model[i as usize];
            let v = unstamp(block, &buf).unwrap_or_else(|| panic!("seed {seed}: block {block}: garbage"));
            assert!(m.written.contains(&v), "seed {seed}: block {block}: version {v} never written");
            assert!(v >= m.flushed, "seed {seed}: block {block}: read version {v}, but {} was flushed", m.flushed);
        }
    }
}

#[test]
fn flushed_writes_survive_concurrent_writers_reclaim_and_a_vanishing_device() {
    for seed in 0..40 {
        run(seed);
    }
}
