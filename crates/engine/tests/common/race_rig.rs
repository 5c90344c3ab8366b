//! The rig of the batched-read tests (`adversarial_read_batch.rs`, `adversarial_chunked_hits.rs`):
//! a volume on a simulated cache device or on an O_DIRECT file (io_uring batches), and a race of
//! writers (each owning a span of blocks, writing requests whole, block by block shuffled or in
//! reverse, flushing now and then, trimming now and then), a thread running write-back and
//! background rounds, and readers checking every block they read against the versions written:
//! no lower than the last write completed before the read began, no higher than the last one
//! begun by its end (no stale, torn or foreign block, whatever reclaim, write-back, trims and
//! write-arounds did meanwhile).

use super::*;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::atomic::AtomicBool;
use tiercache_device::{AlignedBuf, FileDevice};

/// A cache device of `log_blocks` log slots: simulated, or an O_DIRECT file (io_uring), in a
/// temporary directory (None where the file system refuses O_DIRECT).
pub fn cache_device(file: bool, log_blocks: u64) -> Option<(Option<tempfile::TempDir>, Arc<dyn BlockDevice>)> {
    let ck = Layout::checkpoint_blocks_for(log_blocks, BS as u32);
    let bytes = (2 + 2 * ck + log_blocks) * BS as u64;
    if !file {
        return Some((None, Arc::new(SimDevice::new(bytes, BS as u32).with_name("cache"))));
    }
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("cache");
    std::fs::File::create(&p).unwrap().set_len(bytes).unwrap();
    match FileDevice::open(&p) {
        Ok(d) => Some((Some(dir), Arc::new(d))),
        Err(DeviceError::DirectIoUnsupported { .. }) => None,
        Err(e) => panic!("{e}"),
    }
}

/// A volume (log only) on `cache_device`, over a simulated backing device holding version 0 of
/// every block (4 KiB atomic writes: write-around needs a backing device that never tears a
/// block).
pub struct Setup {
    pub _dir: Option<tempfile::TempDir>,
    pub cache: Arc<dyn BlockDevice>,
    pub _backing: Arc<SimDevice>,
    pub v: Volume,
}

pub fn setup(file: bool, log_blocks: u64, seg: u32, backing_blocks: u64) -> Option<Setup> {
    setup_with(file, log_blocks, seg, backing_blocks, VolumeOptions::default())
}

pub fn setup_with(file: bool, log_blocks: u64, seg: u32, backing_blocks: u64, options: VolumeOptions) -> Option<Setup> {
    let (dir, cache) = cache_device(file, log_blocks)?;
    Some(setup_on(dir, cache, seg, backing_blocks, options))
}

/// `setup` on a cache device of the caller's.
pub fn setup_on(
    dir: Option<tempfile::TempDir>,
    cache: Arc<dyn BlockDevice>,
    seg: u32,
    backing_blocks: u64,
    options: VolumeOptions,
) -> Setup {
    let backing = Arc::new(
        SimDevice::from_image(stamps(0, backing_blocks, 0), BS as u32)
            .with_name("backing")
            .with_atomic_write(BS as u32),
    );
    create(&*cache, &*backing, &CreateOptions { segment_blocks: seg, ..log_only() }).expect("create");
    let b: Arc<dyn BlockDevice> = backing.clone();
    let v = Volume::open(cache.clone(), b, Arc::new(MonotonicClock::new()), options).expect("open").0;
    Setup { _dir: dir, cache, _backing: backing, v }
}

/// What a race runs.
pub struct Race {
    /// Blocks of the volume the race touches (the readers read all of them).
    pub blocks: u64,
    pub writers: u64,
    /// Blocks each writer owns: writer w writes `[w * span, (w + 1) * span)`.
    pub span: u64,
    /// A write is large (`large` blocks) with this probability, else 1..=24 blocks.
    pub large_chance: f64,
    pub large: std::ops::RangeInclusive<u64>,
    /// A writer trims 40 blocks of its span after a write with this probability...
    pub trim_chance: f64,
    /// ...and at once rewrites them (a newer version: a read may see version 0, the backing
    /// device's, in between), or leaves them trimmed (a read must still see a version in
    /// bounds: the engine's TRIM keeps what it must).
    pub trim_then_rewrite: bool,
    /// Blocks per read.
    pub reads: std::ops::RangeInclusive<u64>,
    /// The writers' rngs are seeded `writer_seed + w`, the readers' `reader_seed + r`.
    pub writer_seed: u64,
    pub reader_seed: u64,
    pub seconds: u64,
}

/// Writes version `version` of blocks `first..first + n` as one request, or block by block in a
/// shuffled order, or block by block in reverse, as `rng` picks: a request's blocks in
/// consecutive log slots, or scattered, or in reverse slot order.
pub fn write_in_some_order(v: &Volume, rng: &mut impl Rng, first: u64, n: u64, version: u64) {
    match rng.gen_range(0..3) {
        0 => v.write(first * BS as u64, &stamps(first, n, version)).unwrap(),
        1 => {
            let mut bs: Vec<u64> = (first..first + n).collect();
            bs.shuffle(rng);
            for b in bs {
                write(v, b, version);
            }
        }
        _ => {
            for b in (first..first + n).rev() {
                write(v, b, version);
            }
        }
    }
}

/// Per block: the newest version whose write completed, and the newest begun.
struct Versions {
    done: Vec<AtomicU64>,
    begun: Vec<AtomicU64>,
}

/// Runs `race` on `v` (two readers, into aligned and misaligned buffers alternately) and
/// returns the blocks checked. A reader panics (failing the test) on a block out of bounds.
pub fn run_race(v: &Arc<Volume>, race: &Race, what: &str) -> u64 {
    let n = race.blocks as usize;
    let vers = Arc::new(Versions {
        done: (0..n).map(|_| AtomicU64::new(0)).collect(),
        begun: (0..n).map(|_| AtomicU64::new(0)).collect(),
    });
    let stop = Arc::new(AtomicBool::new(false));
    let checked = Arc::new(AtomicU64::new(0));
    std::thread::scope(|s| {
        let mut threads = Vec::new();
        for w in 0..race.writers {
            let (v, vers, stop) = (Arc::clone(v), Arc::clone(&vers), Arc::clone(&stop));
            threads.push(s.spawn(move || {
                let mut rng = ChaCha8Rng::seed_from_u64(race.writer_seed + w);
                let base = w * race.span;
                let mut version = 0;
                let set = |to: &[AtomicU64], blocks: std::ops::Range<u64>, version: u64| {
                    for b in blocks {
                        to[b as usize].store(version, AtomicOrdering::SeqCst);
                    }
                };
                while !stop.load(AtomicOrdering::Relaxed) {
                    version += 1;
                    let n = if rng.gen_bool(race.large_chance) {
                        rng.gen_range(race.large.clone())
                    } else {
                        rng.gen_range(1..=24u64)
                    };
                    let first = base + rng.gen_range(0..race.span - n);
                    set(&vers.begun, first..first + n, version);
                    write_in_some_order(&v, &mut rng, first, n, version);
                    set(&vers.done, first..first + n, version);
                    if rng.gen_bool(0.2) {
                        v.flush().unwrap();
                    }
                    if rng.gen_bool(race.trim_chance) {
                        let t = base + rng.gen_range(0..race.span - 56);
                        if race.trim_then_rewrite {
                            version += 1;
                            set(&vers.begun, t..t + 40, version);
                            v.discard(t * BS as u64, 40 * BS as u64).unwrap();
                            v.write(t * BS as u64, &stamps(t, 40, version)).unwrap();
                            set(&vers.done, t..t + 40, version);
                        } else {
                            v.discard(t * BS as u64, 40 * BS as u64).unwrap();
                        }
                    }
                }
            }));
        }
        // Write-back and background rounds.
        {
            let (v, stop) = (Arc::clone(v), Arc::clone(&stop));
            threads.push(s.spawn(move || {
                while !stop.load(AtomicOrdering::Relaxed) {
                    let _ = v.destage_step(64).unwrap();
                    v.background_tick().unwrap();
                    std::thread::sleep(Duration::from_millis(1));
                }
            }));
        }
        for r in 0..2u64 {
            let (v, vers, stop, checked) = (Arc::clone(v), Arc::clone(&vers), Arc::clone(&stop), Arc::clone(&checked));
            threads.push(s.spawn(move || {
                let mut rng = ChaCha8Rng::seed_from_u64(race.reader_seed + r);
                let most = *race.reads.end();
                let mut raw = AlignedBuf::new(most as usize * BS + 512);
                while !stop.load(AtomicOrdering::Relaxed) {
                    let n = rng.gen_range(race.reads.clone());
                    let first = rng.gen_range(0..race.blocks - n);
                    let lo: Vec<u64> =
                        (first..first + n).map(|b| vers.done[b as usize].load(AtomicOrdering::SeqCst)).collect();
                    let off = if rng.gen_bool(0.5) { 0 } else { 512 };
                    let buf = &mut raw[off..off + n as usize * BS];
                    v.read(first * BS as u64, buf).unwrap();
                    for (i, block) in buf.chunks(BS).enumerate() {
                        let b = first + i as u64;
                        let hi = vers.begun[b as usize].load(AtomicOrdering::SeqCst);
                        let got = version_of(b, block);
                        // (A block trimmed then rewritten may read as the backing device's
                        // version 0 in between.)
                        let trimmed = race.trim_then_rewrite && got == Some(0);
                        assert!(
                            got.is_some_and(|g| lo[i] <= g && g <= hi) || trimmed,
                            "{what}: block {b} read {got:?}, want {}..={hi}",
                            lo[i]
                        );
                    }
                    checked.fetch_add(n, AtomicOrdering::Relaxed);
                }
            }));
        }
        std::thread::sleep(Duration::from_secs(race.seconds));
        stop.store(true, AtomicOrdering::Relaxed);
        for t in threads {
            t.join().unwrap();
        }
    });
    checked.load(AtomicOrdering::Relaxed)
}
