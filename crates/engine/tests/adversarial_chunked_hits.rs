//! Adversarial review of 2c84e7f: a cache hit of more than `VERIFY_CHUNK_BLOCKS` blocks read
//! in runs of at most that many slots, each run's checksums verified as it arrives
//! (`BlockDevice::read_batch_each`), and checksums computed by crc-fast instead of crc32c.
//! Each test's comment states the suspicion and the outcome.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tiercache_device::{AlignedBuf, BlockDevice, FileDevice, MonotonicClock, ReadRange};
use tiercache_engine::constants::VERIFY_CHUNK_BLOCKS;
use tiercache_engine::{EngineError, Volume, VolumeOptions};

mod common;
use common::race_rig::*;
use common::*;

// ------------------------------------------------------------------------------------------
// Set-up.

/// Overwrites `block`'s cached copy on the device with junk; returns the slot's offset.
fn corrupt(s: &Setup, block: u64) -> u64 {
    let (slot, _) = slot_of(&s.v, block).expect("cached");
    let offset = s.v.superblock().layout.log_offset(u64::from(slot));
    let mut junk = AlignedBuf::new(BS);
    junk.fill(0xEE);
    s.cache.write_at(offset, &junk).unwrap();
    s.cache.flush().unwrap();
    offset
}

/// Reads `first..first + n` into an aligned or a misaligned buffer (bounced on a file cache).
fn read_into(v: &Volume, first: u64, n: u64, misaligned: bool) -> (Result<(), EngineError>, Vec<u8>) {
    let mut raw = AlignedBuf::new(n as usize * BS + 512);
    let off = if misaligned { 512 } else { 0 };
    let buf = &mut raw[off..off + n as usize * BS];
    let r = v.read(first * BS as u64, buf);
    (r, buf.to_vec())
}

fn check_all(buf: &[u8], first: u64, want: impl Fn(u64) -> u64, what: &str) {
    for (i, block) in buf.chunks(BS).enumerate() {
        let b = first + i as u64;
        assert_eq!(version_of(b, block), Some(want(b)), "{what}: block {b}");
    }
}

/// The positions of a hit of `n` blocks next to the cuts between its runs.
fn near_cuts(n: u64) -> Vec<u64> {
    let c = VERIFY_CHUNK_BLOCKS as u64;
    let mut at = vec![0, c - 2, c - 1, c, c + 1, 2 * c - 1, 2 * c, 2 * c + 1, n / 2, n - 2, n - 1];
    at.retain(|&b| b < n);
    at.sort_unstable();
    at.dedup();
    at
}

// ------------------------------------------------------------------------------------------
// The checksum.

/// CRC-32C (Castagnoli, reflected, init and final XOR !0), a byte at a time from a table:
/// what the crc32c crate computed.
fn crc32c_reference(bytes: &[u8]) -> u32 {
    static TABLE: std::sync::OnceLock<[u32; 256]> = std::sync::OnceLock::new();
    let table = TABLE.get_or_init(|| {
        let mut t = [0u32; 256];
        for (i, e) in t.iter_mut().enumerate() {
            let mut c = i as u32;
            for _ in 0..8 {
                c = if c & 1 != 0 { (c >> 1) ^ 0x82F6_3B78 } else { c >> 1 };
            }
            *e = c;
        }
        t
    });
    !bytes.iter().fold(!0u32, |c, &b| table[((c ^ u32::from(b)) & 0xFF) as usize] ^ (c >> 8))
}

/// Suspicion: crc-fast's CRC-32C (`Crc32Iscsi`, SIMD folding with runtime dispatch on this
/// CPU: AVX-512/VPCLMULQDQ here) differs from crc32c's for some length or alignment (tails,
/// folding thresholds at 16/64/128/256 bytes, 4 KiB blocks, checkpoint entry arrays of any
/// count, record headers), which would make every cache formatted by the old binary fail
/// to open (superblock, checkpoint and record checksums) or report its blocks corrupt.
/// Checked against a table-driven reference: the standard check value, every length up to
/// 4,352 bytes at 16 alignments, longer lengths up to 1 MiB + 17, all-zero and all-one
/// blocks. (Only the code path this CPU dispatches to is exercised.)
///
/// Outcome: passes (regression test).
#[test]
fn crc_fast_gives_crc32c_values_for_every_length_and_alignment() {
    use tiercache_format::checksum;
    assert_eq!(checksum(b"123456789"), 0xE306_9283, "the CRC-32C check value");
    assert_eq!(crc32c_reference(b"123456789"), 0xE306_9283);
    assert_eq!(checksum(&[]), 0);
    let mut rng = ChaCha8Rng::seed_from_u64(1);
    let mut data = vec![0u8; (1 << 20) + 128];
    rng.fill(&mut data[..]);
    for len in 0..=4352usize {
        for align in 0..16 {
            let s = &data[align..align + len];
            assert_eq!(checksum(s), crc32c_reference(s), "length {len}, alignment {align}");
        }
    }
    let mut len = 4352;
    while len <= (1 << 20) + 17 {
        let align = len % 61;
        let s = &data[align..align + len];
        assert_eq!(checksum(s), crc32c_reference(s), "length {len}, alignment {align}");
        len += 4093;
    }
    for fill in [0u8, 0xFF, 0xEE] {
        let block = vec![fill; BS];
        assert_eq!(checksum(&block), crc32c_reference(&block), "a block of {fill:#x}");
    }
    // From several threads at once (crc-fast picks its implementation at first use).
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            std::thread::spawn(move || {
                let mut rng = ChaCha8Rng::seed_from_u64(10 + t);
                for _ in 0..2000 {
                    let len = rng.gen_range(0..9000);
                    let mut d = vec![0u8; len];
                    rng.fill(&mut d[..]);
                    assert_eq!(tiercache_format::checksum(&d), crc32c_reference(&d), "thread {t}, length {len}");
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
}

// ------------------------------------------------------------------------------------------
// The cut.

/// Suspicion: an off-by-one at the cut between runs (`fits`: a run of exactly 64 slots, or
/// 65) leaves a block of a piece unverified (read, never checked), or hands a run's buffers
/// to the wrong pieces; worst at the blocks next to a cut. Hits of 65 to 4,096 blocks (a
/// 16 MiB read: 64 runs, two ring groups), consecutive slots, corrupt clean copies next to
/// every cut, on a file and a simulated cache, into aligned and misaligned buffers: every
/// block must come back right (the corrupt ones from the backing device), and again on a
/// second read.
///
/// Outcome: passes (regression test).
#[test]
fn corrupt_clean_copies_next_to_every_cut_of_hits_of_65_to_4096_blocks() {
    for file in [false, true] {
        for &n in &[65u64, 66, 127, 128, 129, 193, 1024, 4096] {
            for misaligned in [false, true] {
                let what = format!("file {file}, {n} blocks, misaligned {misaligned}");
                let Some(s) = setup(file, 8192, 64, 8192) else { return };
                s.v.write(0, &stamps(0, n, 1)).unwrap();
                s.v.flush().unwrap();
                s.v.write_back_all(1.0, |_, _| true).unwrap();
                assert!((0..n).all(|b| slot_of(&s.v, b).is_some_and(|(_, d)| !d)), "{what}: all cached, clean");
                let bad = near_cuts(n);
                for &b in &bad {
                    corrupt(&s, b);
                }
                let before = s.v.status().counters;
                let (r, buf) = read_into(&s.v, 0, n, misaligned);
                r.unwrap_or_else(|e| panic!("{what}: {e}"));
                check_all(&buf, 0, |_| 1, &what);
                let after = s.v.status().counters;
                assert_eq!(after.batched_cache_reads - before.batched_cache_reads, 1, "{what}: one batch");
                let (r, buf) = read_into(&s.v, 0, n, !misaligned);
                r.unwrap_or_else(|e| panic!("{what} (again): {e}"));
                check_all(&buf, 0, |_| 1, &format!("{what} (again)"));
            }
        }
    }
}

/// Suspicion: as above, for dirty copies: one corrupt dirty copy next to a cut must fail
/// the read with `LostBlock` for exactly that block (a block left unverified would be
/// returned corrupt, Ok). A fresh volume per position.
///
/// Outcome: passes (regression test).
#[test]
fn a_corrupt_dirty_copy_next_to_a_cut_fails_the_read_with_its_block() {
    for file in [false, true] {
        for &n in &[65u64, 129, 256] {
            for (i, &p) in near_cuts(n).iter().enumerate() {
                let misaligned = i % 2 == 1;
                let what = format!("file {file}, {n} blocks, corrupt {p}, misaligned {misaligned}");
                let Some(s) = setup(file, 1024, 64, 1024) else { return };
                s.v.write(0, &stamps(0, n, 1)).unwrap();
                s.v.flush().unwrap();
                corrupt(&s, p);
                let (r, buf) = read_into(&s.v, 0, n, misaligned);
                assert!(matches!(r, Err(EngineError::LostBlock { block }) if block == p), "{what}: {r:?}");
                let _ = buf;
                if p > 0 {
                    let (r, buf) = read_into(&s.v, 0, p, misaligned);
                    r.unwrap_or_else(|e| panic!("{what}: before: {e}"));
                    check_all(&buf, 0, |_| 1, &what);
                }
                if p + 1 < n {
                    let (r, buf) = read_into(&s.v, p + 1, n - p - 1, misaligned);
                    r.unwrap_or_else(|e| panic!("{what}: after: {e}"));
                    check_all(&buf, p + 1, |_| 1, &what);
                }
            }
        }
    }
}

/// Suspicion: gaps (record headers, foreign blocks) near the cut: a gap that would cross
/// the 64-slot limit ends the run (`fits(g)`); the scratch blocks the remaining runs skip,
/// and the piece after a gap (`bufs.nth(skipped)` in the callback) must line up with what
/// was read. Layouts: blocks `0..k` in one record, `g` foreign blocks in another (g = 0:
/// just the headers), blocks `k..200` in a third, for k around the cut and g up to past
/// `MAX_GAP_SLOTS`; then every block written a second time in reverse order (pieces of one
/// block, request order against slot order) in a variant. Corrupt clean copies around
/// position k and the cut; every block must come back right.
///
/// Outcome: passes (regression test).
#[test]
fn gaps_and_reversed_pieces_next_to_the_cut_line_up() {
    const N: u64 = 200;
    for file in [false, true] {
        for k in 56..=72u64 {
            for &g in &[0u64, 1, 7, 8, 9] {
                for reversed in [false, true] {
                    if file && k % 4 != 0 && !reversed {
                        continue; // (a sample on the file cache)
                    }
                    let what = format!("file {file}, k {k}, gap {g}, reversed {reversed}");
                    let Some(s) = setup(file, 2048, 64, 4096) else { return };
                    if reversed {
                        for b in (0..N).rev() {
                            write(&s.v, b, 1);
                            if b == k || b == k / 2 {
                                write(&s.v, 3000 + b, 1);
                                s.v.flush().unwrap();
                            }
                        }
                    } else {
                        s.v.write(0, &stamps(0, k, 1)).unwrap();
                        s.v.flush().unwrap();
                        if g > 0 {
                            s.v.write(3000 * BS as u64, &stamps(3000, g, 1)).unwrap();
                            s.v.flush().unwrap();
                        }
                        s.v.write(k * BS as u64, &stamps(k, N - k, 1)).unwrap();
                    }
                    s.v.flush().unwrap();
                    s.v.write_back_all(1.0, |_, _| true).unwrap();
                    let (r, buf) = read_into(&s.v, 0, N, k % 2 == 1);
                    r.unwrap_or_else(|e| panic!("{what}: {e}"));
                    check_all(&buf, 0, |_| 1, &what);
                    let mut bad: Vec<u64> =
                        (k.saturating_sub(2)..k + 2).chain(near_cuts(N)).filter(|&b| b < N).collect();
                    bad.sort_unstable();
                    bad.dedup();
                    for &b in &bad {
                        corrupt(&s, b);
                    }
                    let (r, buf) = read_into(&s.v, 0, N, k % 2 == 0);
                    r.unwrap_or_else(|e| panic!("{what}: {e}"));
                    check_all(&buf, 0, |_| 1, &format!("{what} (corrupt {bad:?})"));
                }
            }
        }
    }
}

/// Suspicion: the bookkeeping of `verified` / `mismatched` / `unverified` / `again` over
/// random layouts: random writes (whole, shuffled, reversed, with flushes) on a log that
/// wraps, everything written back, then random clean copies corrupted on the device and
/// random reads of 65..=600 blocks (aligned and misaligned) checked against the model.
/// A corrupt copy returned, a block missed, or a panic in the slicing shows here.
///
/// Outcome: passes (regression test).
#[test]
fn random_layouts_with_corrupt_clean_copies_read_back_exactly() {
    const LOG: u64 = 1024;
    const BLOCKS: u64 = 2048;
    let mut chunked = 0;
    for file in [false, true] {
        for seed in 0..4u64 {
            let Some(s) = setup(file, LOG, 32, BLOCKS) else { continue };
            let v = &s.v;
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            let mut model = vec![0u64; BLOCKS as usize];
            let mut version = 0;
            for round in 0..40 {
                for _ in 0..30 {
                    version += 1;
                    let n = rng.gen_range(1..=80u64);
                    let first = rng.gen_range(0..BLOCKS - n);
                    write_in_some_order(v, &mut rng, first, n, version);
                    for b in first..first + n {
                        model[b as usize] = version;
                    }
                    if rng.gen_bool(0.3) {
                        v.flush().unwrap();
                    }
                }
                v.flush().unwrap();
                v.write_back_all(1.0, |_, _| true).unwrap();
                // Corrupt ~3% of the cached (clean) copies.
                for b in 0..BLOCKS {
                    if slot_of(v, b).is_some() && rng.gen_bool(0.03) {
                        corrupt(&s, b);
                    }
                }
                for _ in 0..8 {
                    let n = rng.gen_range(65..=600u64);
                    let first = rng.gen_range(0..BLOCKS - n);
                    let hits = (first..first + n).filter(|&b| slot_of(v, b).is_some()).count();
                    chunked += usize::from(hits > VERIFY_CHUNK_BLOCKS);
                    let (r, buf) = read_into(v, first, n, rng.gen_bool(0.5));
                    let what = format!("file {file}, seed {seed}, round {round}, read {first}+{n}");
                    r.unwrap_or_else(|e| panic!("{what}: {e}"));
                    check_all(&buf, first, |b| model[b as usize], &what);
                }
            }
        }
    }
    eprintln!("{chunked} reads of more than {VERIFY_CHUNK_BLOCKS} hits");
    assert!(chunked > 50);
}

// ------------------------------------------------------------------------------------------
// Failed reads.

/// Suspicion: a bad sector in one run of a chunked hit: with skipped slots in the run, its
/// pieces are read again one by one (`again`) and verified after the batch; without, its
/// blocks go to the one-block path. A bad sector in a block's slot next to the cut or in a
/// record header between pieces (read only as scratch): a bad block's slot fails the read
/// (an I/O error is reported, clean or dirty; never Ok with junk), and a bad header slot
/// costs nothing: every block right. On the simulated cache through `BadSector`, which overrides
/// `read_vectored_at` only (the default `read_batch` and `read_batch_each` reach it).
///
/// Outcome: passes (regression test).
#[test]
fn a_bad_sector_in_a_chunked_hit() {
    for dirty in [false, true] {
        // Blocks 0..200 in records of 20 (a header every 21 slots): runs with skipped slots.
        let probe = |bad_at: &dyn Fn(&Volume) -> u64, what: &str, expect_err: bool| {
            let (inner, backing) = devices_seg(64, 64, 4096, log_only());
            let cache = BadSector::new(inner.clone());
            let c: Arc<dyn BlockDevice> = cache.clone();
            let b: Arc<dyn BlockDevice> = backing.clone();
            let v = Volume::open(c, b, Arc::new(MonotonicClock::new()), VolumeOptions::default()).unwrap().0;
            for r in 0..10u64 {
                v.write(r * 20 * BS as u64, &stamps(r * 20, 20, 1)).unwrap();
                v.flush().unwrap();
            }
            if !dirty {
                v.write_back_all(1.0, |_, _| true).unwrap();
            }
            let off = bad_at(&v);
            cache.bad.store(off + 100, Ordering::SeqCst);
            let what = format!("dirty {dirty}: {what}");
            let (r, buf) = read_into(&v, 0, 200, false);
            if expect_err {
                // (An I/O error on a block's own copy is reported, clean or dirty:
                // `read_block_again` does not fall back to the backing device for it.)
                assert!(r.is_err(), "{what}: a block on a bad sector read Ok");
                let (r, buf) = read_into(&v, 0, 200, true);
                assert!(r.is_err(), "{what} (misaligned): a block on a bad sector read Ok");
                let _ = buf;
            } else {
                r.unwrap_or_else(|e| panic!("{what}: {e}"));
                check_all(&buf, 0, |_| 1, &what);
            }
        };
        for b in [62u64, 63, 64, 65, 66, 127, 128, 199] {
            probe(
                &|v: &Volume| v.superblock().layout.log_offset(u64::from(slot_of(v, b).unwrap().0)),
                &format!("bad slot of block {b}"),
                true,
            );
        }
        for b in [60u64, 80, 120] {
            // The header before block b (b a multiple of 20): the slot before its first block.
            probe(
                &|v: &Volume| v.superblock().layout.log_offset(u64::from(slot_of(v, b).unwrap().0 - 1)),
                &format!("bad header before block {b}"),
                false,
            );
        }
    }
}

/// A cache device whose `read_batch` (and only it, not `read_batch_each`) corrupts in
/// memory the data of any range covering `poison` after reading it (a fault injector of
/// the kind tests wrote before `read_batch_each` existed), over a FileDevice (the ring).
struct PoisonBatch {
    inner: FileDevice,
    poison: AtomicU64,
    batches: AtomicU64,
    /// One-block reads of the poisoned block (the engine's retry after a checksum failure).
    rereads: AtomicU64,
}

impl BlockDevice for PoisonBatch {
    forward_to_inner!(inner: size_bytes, logical_block_size, write_at, flush, discard);
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> tiercache_device::Result<()> {
        let poison = self.poison.load(Ordering::SeqCst);
        if offset <= poison && poison < offset + buf.len() as u64 {
            self.rereads.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.read_at(offset, buf)
    }
    fn read_batch(&self, ranges: &mut [ReadRange<'_>]) -> Vec<tiercache_device::Result<()>> {
        self.batches.fetch_add(1, Ordering::SeqCst);
        let results = self.inner.read_batch(ranges);
        let poison = self.poison.load(Ordering::SeqCst);
        for r in ranges.iter_mut() {
            let mut at = r.offset;
            for b in r.bufs.iter_mut() {
                if at <= poison && poison < at + b.len() as u64 {
                    b[(poison - at) as usize] ^= 0xFF;
                }
                at += b.len() as u64;
            }
        }
        results
    }
    fn describe(&self) -> String {
        "poison-batch".into()
    }
}

/// Suspicion: a wrapper that overrides `read_batch` but not `read_batch_each` (every test
/// wrapper in the tree) would be bypassed by the engine's new call, and its faults not
/// applied, if the default `read_batch_each` went to the inner device. It calls
/// `self.read_batch`: a byte flipped in memory in one block of a 256-block dirty hit must be
/// found by the checksum and that block read again on its own (`read_at`, unpoisoned: the
/// read then succeeds), and the wrapper must have seen the batch.
///
/// Outcome: passes (regression test).
#[test]
fn a_wrapper_overriding_only_read_batch_still_applies_its_faults() {
    let Some((dir, _)) = cache_device(true, 1024) else { return };
    let dir = dir.unwrap();
    let p = dir.path().join("cache");
    let dev = Arc::new(PoisonBatch {
        inner: FileDevice::open(&p).unwrap(),
        poison: AtomicU64::new(u64::MAX),
        batches: AtomicU64::new(0),
        rereads: AtomicU64::new(0),
    });
    let c: Arc<dyn BlockDevice> = dev.clone();
    let s = setup_on(Some(dir), c, 64, 1024, VolumeOptions::default());
    s.v.write(0, &stamps(0, 256, 1)).unwrap();
    s.v.flush().unwrap();
    let (slot, _) = slot_of(&s.v, 150).unwrap();
    dev.poison.store(s.v.superblock().layout.log_offset(u64::from(slot)) + 7, Ordering::SeqCst);
    let before = dev.batches.load(Ordering::SeqCst);
    let (r, _) = read_into(&s.v, 0, 256, false);
    assert!(dev.batches.load(Ordering::SeqCst) > before, "the wrapper's read_batch was bypassed");
    // (The one-block retry goes through read_at, unpoisoned: the block reads right then.)
    r.unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(dev.rereads.load(Ordering::SeqCst), 1, "the poisoned block was not found bad and read again");
    assert!(s.v.status().counters.batched_cache_reads > 0);
}

// ------------------------------------------------------------------------------------------
// Races.

/// Suspicion: the "still current under the lock" confirmation after a chunked read: the
/// first runs are verified (and their slots may be reclaimed and rewritten by another
/// block) long before the last lands; a block verified early against its old entry, then
/// moved, must still be caught by `admit_and_confirm`, and no stale or foreign block
/// returned. Writers (whole, shuffled, reversed) on a small log forcing reclaim, trims,
/// write-back and background rounds, against readers of 65..=768 blocks, aligned and
/// misaligned; every block read lies between the newest write finished before the read and
/// the newest begun after. 4 s on a file cache and on a simulated one.
///
/// Outcome: passes (regression test).
#[test]
fn chunked_readers_racing_writers_reclaim_writeback_and_trim_see_no_stale_block() {
    let race = Race {
        blocks: 1536,
        writers: 3,
        span: 512,
        large_chance: 0.1,
        large: 32..=128,
        trim_chance: 0.05,
        trim_then_rewrite: true,
        reads: 65..=768,
        writer_seed: 300,
        reader_seed: 400,
        seconds: 4,
    };
    for file in [true, false] {
        let Some(s) = setup(file, 1024, 32, race.blocks) else { continue };
        let v = Arc::new(s.v);
        let checked = run_race(&v, &race, &format!("file {file}"));
        let st = v.status();
        eprintln!(
            "file {file}: {checked} blocks checked, {} batched reads, {} reclaimed, {} destaged",
            st.counters.batched_cache_reads, st.counters.reclaimed_blocks, st.counters.destaged_blocks,
        );
        assert!(st.counters.batched_cache_reads > 0 && st.counters.reclaimed_blocks > 0);
    }
}
