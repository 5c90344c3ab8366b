//! Adversarial review of 8f10894 (large cache hits cost less CPU): `Index::moves` lets
//! `admit_and_confirm` skip the per-block "is this hit still current" lookups when no index
//! entry was replaced or removed since the plan; `Index::warm` touches the table before the
//! plan loop; the engine's block-keyed maps hash with foldhash (random per map) instead of
//! SipHash (also random per map).
//!
//! The claim under attack: a hit's log position changes only with its index entry (the tail
//! cannot lap a live slot before reclaim removed or replaced it), so an unchanged `moves`
//! means every planned hit is current. Each test below puts a reader's cache read on hold
//! *after* it read the medium (`LateRead`: the data is the slot's content then), changes the
//! block or its slot in one way, then lets the reader confirm. Where the slot still holds a
//! good copy of the *old* version, only the confirmation can send the reader back for the new
//! one: those tests fail if that change did not bump `moves`. (Checked: with `moves += 1`
//! deleted from `Index::remove`, or from `Index::insert`'s replace arm, the tests naming that
//! path fail; restored, all pass.)
//!
//! Results at 8f10894: 12 tests, 11 pass, 1 fails.
//! - The claim held everywhere tried: replace (rewrite, reinsertion), remove (TRIM, FIFO
//!   eviction with three laps over the slot, write-around) all bump `moves`; mark-clean and
//!   new keys (promotion from the ring) are no moves and the data stays right; a 3 s stress
//!   of warmed large reads against writes, TRIMs, write-arounds and reclaim saw nothing stale.
//!   Mutation check: with `moves += 1` deleted from `Index::remove`, the TRIM, eviction and
//!   write-around tests fail; from `insert`'s replace arm, the rewrite, large-rewrite and
//!   reinsertion tests fail.
//! - `warm` cannot panic: every read is bounded by the superblock's backing size, itself
//!   capped at `MAX_BACKING_BLOCKS`.
//! - `a_trim_of_gathered_ring_copies_leaves_the_ring_the_same_whatever_the_hash_seed` FAILS:
//!   `Probation::forget_range` (a TRIM wider than the ring's population) walks
//!   `gathering.map.keys()`, a hash map's order, and `Batch::remove` swap-removes, so the
//!   batch's layout, and hence which copies the ring evicts first, follows the per-map hash
//!   seed (8 fresh volumes, 8 different eviction sets). Pre-existing: it fails the same way at
//!   eaa4328 (std's `RandomState` is random per map too); foldhash neither causes nor fixes
//!   it. Clean copies only, so no wrong data, but it breaks "one seed replays exactly" for any
//!   run that meets it. Fixed since: `forget_range` forgets in block order; all 12 pass.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiercache_device::{BlockDevice, SimClock, SimDevice};
use tiercache_engine::{Background, CreateOptions, EngineError, Eviction, Volume, VolumeOptions};

mod common;
use common::holds::{around, join_within, open_wa, wa_devices, write_n, LateRead};
use common::*;

/// A volume on `cache` seen through a `LateRead` (each read covering an armed device block is
/// held after it read the medium).
fn late_volume(
    cache: &Arc<SimDevice>,
    backing: &Arc<SimDevice>,
    options: VolumeOptions,
) -> (Arc<LateRead>, Arc<Volume>) {
    let late = LateRead::new(cache);
    let c: Arc<dyn BlockDevice> = late.clone();
    let b: Arc<dyn BlockDevice> = backing.clone();
    let v = Volume::open(c, b, Arc::new(tiercache_device::MonotonicClock::new()), options).expect("open").0;
    (late, Arc::new(v))
}

/// The cache device block holding `block`'s cached copy.
fn device_block_of(v: &Volume, block: u64) -> u64 {
    let (slot, _) = slot_of(v, block).expect("cached");
    v.superblock().layout.log_offset(u64::from(slot)) / BS as u64
}

/// Seals staging (a FLUSH seals only staging holding dirty data): a write of a far block, then
/// FLUSH.
fn seal(v: &Volume, far: u64) {
    write(v, far, 1);
    v.flush().unwrap();
}

/// Starts a one-block read of `block` on its own thread, held once it has read the cache
/// device's copy; returns the thread (its result: the version read).
fn held_read(
    late: &LateRead,
    v: &Arc<Volume>,
    block: u64,
) -> std::thread::JoinHandle<Result<Option<u64>, EngineError>> {
    late.arm(device_block_of(v, block));
    let h = on_thread(v, move |v| read_version(v, block));
    late.wait_held();
    h
}

/// Replace (`Index::insert` over an existing key): the block is rewritten and the new record
/// installed while a reader holds the old copy, which still checks good in its slot. Only the
/// confirmation sends the reader to the new version. HELD: the replace bumps `moves`.
#[test]
fn a_rewrite_installed_while_a_hit_is_read_is_what_the_read_returns() {
    let (cache, backing) = devices(16, 4096);
    let (late, v) = late_volume(&cache, &backing, VolumeOptions::default());
    write(&v, 100, 1);
    v.flush().unwrap();
    let old = device_block_of(&v, 100);
    let h = held_read(&late, &v, 100);
    write(&v, 100, 2);
    v.flush().unwrap(); // installed: the index names the new slot
    assert_ne!(device_block_of(&v, 100), old, "the new copy is elsewhere");
    let mut buf = vec![0u8; BS];
    cache.read_at(old * BS as u64, &mut buf).unwrap();
    assert_eq!(version_of(100, &buf), Some(1), "the old slot still holds a good copy of version 1");
    late.release();
    assert_eq!(join_within(h, 30, "reader").unwrap(), Some(2), "the reader kept the copy that moved");
}

/// Remove by TRIM (`discard`, `Index::remove`): a clean hit dropped while its read is held.
/// Its old slot still holds the same (clean) data, so the result is the same either way; the
/// evidence is the backing read of the slow path, which only a confirmation that saw the
/// removal issues. HELD.
#[test]
fn a_trim_while_a_hit_is_read_sends_the_reader_to_the_backing_device() {
    let (cache, backing) = devices(16, 4096);
    let (late, v) = late_volume(&cache, &backing, VolumeOptions::default());
    read_once(&v, [200u64].into_iter()); // a miss, admitted clean
    seal(&v, 4000);
    assert_eq!(slot_of(&v, 200).map(|s| s.1), Some(false), "clean in the log");
    let h = held_read(&late, &v, 200);
    v.discard(200 * BS as u64, BS as u64).unwrap();
    assert!(slot_of(&v, 200).is_none());
    let before = backing.stats().reads;
    late.release();
    assert_eq!(join_within(h, 30, "reader").unwrap(), Some(0));
    assert_eq!(backing.stats().reads - before, 1, "the removal was seen: the block read again from backing");
}

/// Remove by reclaim (`remove_if_slot`, FIFO: every clean copy the head passes is evicted),
/// then the tail laps the slot three times with other blocks (clean read misses: new keys, so
/// nothing but the evictions moves) while the reader holds the copy it read before. Reclaim
/// and the record writer never overwrite a slot without removing its entry first, so the
/// confirmation sees the eviction and the reader reads the block again. HELD.
#[test]
fn reclaim_evicting_and_laps_over_the_slot_while_a_hit_is_read_are_seen() {
    let (cache, backing) = devices(16, 4096); // a log of 128 blocks
    let opts = VolumeOptions { eviction: Eviction::Fifo, ..VolumeOptions::default() };
    let (late, v) = late_volume(&cache, &backing, opts);
    read_once(&v, [300u64].into_iter());
    seal(&v, 4000);
    v.write_back_all(1.0, |_, _| true).unwrap(); // (no dirty block for reclaim to copy forward)
    let slot = slot_of(&v, 300).unwrap().0;
    let h = held_read(&late, &v, 300);
    read_once(&v, 1000..1400); // three laps of the log in clean admissions
    assert!(slot_of(&v, 300).is_none(), "evicted");
    let mut buf = vec![0u8; BS];
    let layout = v.superblock().layout;
    cache.read_at(layout.log_offset(u64::from(slot)), &mut buf).unwrap();
    assert_ne!(version_of(300, &buf), Some(0), "the slot was overwritten");
    let (cr, br) = (cache.stats().reads, backing.stats().reads);
    late.release();
    assert_eq!(join_within(h, 30, "reader").unwrap(), Some(0));
    assert_eq!((cache.stats().reads - cr, backing.stats().reads - br), (0, 1), "the eviction was seen: read again");
}

/// Replace by reclaim's reinsertion alone (a clean block read since cached is copied forward,
/// `finish_reclaim`'s `insert`): every block at the head is hot, so reclaim evicts nothing,
/// and the tail advances with new keys only; the reader's old copy is good, yet its entry
/// moved. HELD: the reader reads it again at its new slot.
/// (The head's windows are made half dead by TRIMs before the read, so the record of copies
/// fits in what the window frees and nothing is evicted.)
#[test]
fn a_reinsertion_while_a_hit_is_read_is_seen() {
    let (cache, backing) = devices(16, 4096);
    let opts = VolumeOptions { eviction: Eviction::Reinsert, ..VolumeOptions::default() };
    let (late, v) = late_volume(&cache, &backing, opts);
    read_once(&v, 400..440);
    seal(&v, 4000);
    v.write_back_all(1.0, |_, _| true).unwrap();
    // Half of each window dead (TRIMmed before the read: no concern of it), so that reclaim
    // has room to keep every live block and evicts none.
    for b in (401..440).step_by(2) {
        v.discard(b * BS as u64, BS as u64).unwrap();
    }
    read_once(&v, (400..440).step_by(2)); // counted: reclaim keeps them all
    let mut buf = vec![0u8; BS];
    v.read(4000 * BS as u64, &mut buf).unwrap();
    let old = slot_of(&v, 400).unwrap().0;
    let h = held_read(&late, &v, 400);
    let evicted = v.status().counters.evicted_blocks;
    let mut next = 2000;
    while slot_of(&v, 400).map(|s| s.0) == Some(old) {
        read_once(&v, [next].into_iter()); // new keys only
        next += 1;
        assert!(next < 2200, "never reinserted");
    }
    let c = v.status().counters;
    assert!(slot_of(&v, 400).is_some() && c.reinserted_blocks > 0, "kept: reinserted");
    assert_eq!(c.evicted_blocks, evicted, "and nothing evicted meanwhile");
    let cr = cache.stats().reads;
    late.release();
    assert_eq!(join_within(h, 30, "reader").unwrap(), Some(0));
    assert_eq!(cache.stats().reads - cr, 1, "the reinsertion was seen: read again at its new slot");
}

/// Remove by write-around (`write_around.rs`: the cached copies of blocks written straight to
/// the backing device leave the index): the old slot still holds a good copy of version 1,
/// the backing device version 2. HELD: the reader returns 2.
#[test]
fn a_write_around_while_a_hit_is_read_is_what_the_read_returns() {
    let (cache, backing) = wa_devices(16, 4096);
    let late = LateRead::new(&cache);
    let v = Arc::new(open_wa(late.clone(), backing.clone()));
    write(&v, 500, 1);
    write(&v, 501, 1);
    v.flush().unwrap();
    let h = held_read(&late, &v, 500);
    let around_before = around(&v);
    write_n(&v, 500, 2, 2).unwrap(); // two blocks: around the cache
    assert!(around(&v) > around_before, "the write went around");
    late.release();
    assert_eq!(join_within(h, 30, "reader").unwrap(), Some(2), "the reader served the copy written around");
}

/// Index changes that are no move: write-back's `mark_clean` (same slot, same data). The fast
/// path applies (no lookup, no second read) and the data is right. HELD.
#[test]
fn write_back_marking_clean_during_a_hit_keeps_the_fast_path_and_the_data() {
    let (cache, backing) = devices(16, 4096);
    let (late, v) = late_volume(&cache, &backing, VolumeOptions::default());
    write(&v, 600, 1);
    v.flush().unwrap();
    let h = held_read(&late, &v, 600);
    v.write_back_all(1.0, |_, _| true).unwrap();
    assert_eq!(slot_of(&v, 600).map(|s| s.1), Some(false), "marked clean in place");
    let (cr, br) = (cache.stats().reads, backing.stats().reads);
    late.release();
    assert_eq!(join_within(h, 30, "reader").unwrap(), Some(1));
    assert_eq!((cache.stats().reads - cr, backing.stats().reads - br), (0, 0), "nothing read again");
}

/// New entries are no move either: a block promoted from the probation ring enters the log
/// (`install_record`, an insert of a new key) while another block's hit is read. Its slot
/// was free, so the hit is current. HELD (no second read, right data).
#[test]
fn a_promotion_from_the_ring_during_a_hit_is_no_move() {
    let (cache, backing) = devices_seg(160, 16, 65_536, CreateOptions::default());
    let opts = VolumeOptions { sequential_bypass_bytes: 0, ..s3fifo() };
    let (late, v) = late_volume(&cache, &backing, opts);
    write(&v, 700, 1);
    v.flush().unwrap();
    // Block 7 into the ring: missed, then its batch of 64 filled and written.
    read_once(&v, [7u64].into_iter());
    read_once(&v, (0..63u64).map(|n| 10_000 + 7 * n));
    read_once(&v, [7u64].into_iter()); // one read in the ring
    let promoted = v.status().counters.promoted_blocks;
    let h = held_read(&late, &v, 700);
    read_once(&v, [7u64].into_iter()); // the second: promoted into staging
    assert_eq!(v.status().counters.promoted_blocks, promoted + 1);
    seal(&v, 60_000); // and into the log
    assert!(slot_of(&v, 7).is_some(), "promoted into the log");
    let (cr, br) = (cache.stats().reads, backing.stats().reads);
    late.release();
    assert_eq!(join_within(h, 30, "reader").unwrap(), Some(1));
    assert_eq!((cache.stats().reads - cr, backing.stats().reads - br), (0, 0), "nothing read again");
}

/// A large read (warmed, 64 blocks, one run) whose hits all move while it is held: a rewrite
/// of the whole range. The fast path must not apply to any of them. HELD.
#[test]
fn a_large_hit_rewritten_while_read_returns_the_new_range() {
    let (cache, backing) = devices(32, 4096);
    let (late, v) = late_volume(&cache, &backing, VolumeOptions::default());
    write_n(&v, 800, 64, 1).unwrap();
    v.flush().unwrap();
    late.arm(device_block_of(&v, 800));
    let h = on_thread(&v, |v| {
        let mut buf = vec![0u8; 64 * BS];
        v.read(800 * BS as u64, &mut buf)
            .map(|()| (0..64u64).map(|i| version_of(800 + i, &buf[i as usize * BS..][..BS])).collect::<Vec<_>>())
    });
    late.wait_held();
    write_n(&v, 800, 64, 2).unwrap();
    v.flush().unwrap();
    late.release();
    let got = join_within(h, 30, "reader").unwrap();
    assert!(got.iter().all(|&x| x == Some(2)), "{got:?}");
}

/// `Index::warm` runs before the plan loop's checks: a warmed read ending at the volume's last
/// block, one straddling the end (refused by `check_request` before any plan), and a warmed
/// read whose first block is lost (the loop's error, as before). HELD: errors, no panic.
/// (Blocks beyond `MAX_BACKING_BLOCKS` never reach it: the superblock caps the backing size
/// at that many blocks and `check_request` bounds every read by it.)
#[test]
fn warming_never_panics_at_the_volume_edges_or_before_a_lost_block() {
    let blocks = 4096u64;
    let (cache, _backing, v) = volume_seg(16, 8, blocks, VolumeOptions::default());
    let mut buf = vec![0u8; 64 * BS];
    v.read((blocks - 64) * BS as u64, &mut buf).unwrap();
    write_n(&v, blocks - 64, 64, 1).unwrap();
    v.flush().unwrap();
    v.read((blocks - 64) * BS as u64, &mut buf).unwrap();
    assert_eq!(version_of(blocks - 1, &buf[63 * BS..]), Some(1));
    let r = v.read((blocks - 32) * BS as u64, &mut buf);
    assert!(matches!(r, Err(EngineError::OutOfRange { .. })), "{r:?}");
    let r = v.read(u64::MAX - (u64::MAX % BS as u64) - 63 * BS as u64, &mut buf[..16 * BS]);
    assert!(matches!(r, Err(EngineError::OutOfRange { .. })), "{r:?}");
    // A lost block at the start of a warmed read.
    write(&v, 2000, 1);
    v.flush().unwrap();
    corrupt_cached_block(&cache, &v, 2000);
    assert!(is_lost(&read_version(&v, 2000), 2000));
    let r = v.read(2000 * BS as u64, &mut buf[..32 * BS]);
    assert!(matches!(r, Err(EngineError::LostBlock { block: 2000 })), "{r:?}");
}

/// Readers of 16-64 block ranges (warmed, mostly fast-path confirmations) against a writer
/// (single blocks and runs, some written around), TRIMs, FLUSHes, the background thread and a
/// log of 128 blocks that laps constantly. Every block read is intact, that block's, and no
/// older than the version whose write returned before the read began. HELD (3 s).
#[test]
fn large_reads_against_rewrites_trims_write_arounds_and_reclaim_are_never_stale() {
    const FIRST: u64 = 64;
    const N: u64 = 256;
    let (cache, backing) = wa_devices(16, 4096);
    let v = Arc::new(open_wa(cache.clone(), backing.clone()));
    let bg = Background::start(&v);
    let done: Arc<Vec<AtomicU64>> = Arc::new((0..N).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let deadline = Instant::now() + Duration::from_secs(3);
    let writer = {
        let (v, done, stop) = (Arc::clone(&v), Arc::clone(&done), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut rng = 0x1234_5678u64;
            let mut next = |n: u64| {
                rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                (rng >> 33) % n
            };
            let mut version = 0u64;
            let mut ops = 0u64;
            while !stop.load(Ordering::Relaxed) {
                version += 1;
                let first = next(N);
                let n = [1, 1, 1, 2, 4, 8][next(6) as usize].min(N - first);
                match next(10) {
                    0 => {
                        v.discard((FIRST + first) * BS as u64, n * BS as u64).unwrap();
                    }
                    1 => v.flush().unwrap(),
                    _ => {
                        write_n(&v, FIRST + first, n, version).unwrap();
                        for b in first..first + n {
                            done[b as usize].store(version, Ordering::SeqCst);
                        }
                    }
                }
                ops += 1;
                if ops.is_multiple_of(4) {
                    std::thread::yield_now();
                }
            }
            ops
        })
    };
    let readers: Vec<_> = (0..2u64)
        .map(|t| {
            let (v, done, stop) = (Arc::clone(&v), Arc::clone(&done), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut rng = 99 + t;
                let mut reads = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                    let n = 16 + (rng >> 40) % 49;
                    let first = (rng >> 20) % (N - n + 1);
                    let floor: Vec<u64> = (first..first + n).map(|b| done[b as usize].load(Ordering::SeqCst)).collect();
                    let mut buf = vec![0u8; n as usize * BS];
                    v.read((FIRST + first) * BS as u64, &mut buf).unwrap();
                    for i in 0..n {
                        let b = FIRST + first + i;
                        let got = version_of(b, &buf[i as usize * BS..][..BS])
                            .unwrap_or_else(|| panic!("block {b}: torn or foreign data"));
                        assert!(
                            got >= floor[i as usize],
                            "block {b}: read version {got}, {} was written before",
                            floor[i as usize]
                        );
                    }
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    while Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    stop.store(true, Ordering::Relaxed);
    let ops = join_within(writer, 60, "writer");
    let reads: u64 = readers.into_iter().map(|h| join_within(h, 60, "reader")).sum();
    drop(bg);
    let c = v.status().counters;
    assert!(ops > 1000 && reads > 100, "ops {ops}, reads {reads}");
    assert!(c.written_around_blocks > 0 && c.evicted_blocks + c.copied_forward_blocks > 0, "{c:?}");
}

/// A fixed single-threaded mix of reads, writes, TRIMs and FLUSHes on a fresh volume (a non-advancing clock, no
/// background thread): its counters and index. Everything here is deterministic but the hash
/// maps' per-map seeds.
fn run_workload(eviction: Eviction, probation_permille: u16) -> (String, Vec<(u64, tiercache_engine::IndexEntry)>) {
    let (cache, backing) = devices_seg(40, 16, 8192, CreateOptions { probation_permille, ..CreateOptions::default() });
    let c: Arc<dyn BlockDevice> = cache.clone();
    let b: Arc<dyn BlockDevice> = backing.clone();
    let clock = SimClock::new();
    let opts = VolumeOptions { eviction, sequential_bypass_bytes: 0, ..VolumeOptions::default() };
    let v = Volume::open(c, b, Arc::new(clock), opts).expect("open").0;
    let mut rng = 7u64;
    let mut next = |n: u64| {
        rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (rng >> 33) % n
    };
    let mut buf = vec![0u8; 64 * BS];
    for op in 0..6000u64 {
        let hot = next(4) != 0;
        let first = if hot { next(300) } else { 300 + next(7800) };
        let n = [1, 1, 1, 2, 4, 16, 32][next(7) as usize].min(8192 - first);
        match next(20) {
            0..=2 => write_n(&v, first, n, op).unwrap(),
            3 => v.discard(first * BS as u64, (n * 40).min(8192 - first) * BS as u64).unwrap(),
            4 => v.flush().unwrap(),
            _ => v.read(first * BS as u64, &mut buf[..n as usize * BS]).unwrap(),
        }
    }
    let mut counters = format!("{:?}", v.status().counters);
    counters.push_str(&format!(" probation {}", v.status().probation_blocks));
    (counters, v.index_snapshot())
}

/// The duel (adaptive), the ring and TRIMs over ranges wider than the ring's population, on
/// two volumes in one process: the same requests must make the same cache. Per-map hash seeds
/// differ between the volumes (foldhash's as SipHash's did), so any decision that follows a
/// hash map's iteration order shows here.
/// HELD (this mix does not meet `forget_range`'s order dependence: see the next test).
#[test]
fn the_same_requests_make_the_same_cache_on_two_volumes() {
    for (eviction, ring) in [(Eviction::Adaptive, 100), (Eviction::S3fifo, 100), (Eviction::Reinsert, 0)] {
        let a = run_workload(eviction, ring);
        for _ in 0..3 {
            let b = run_workload(eviction, ring);
            assert_eq!(a.0, b.0, "{eviction:?}: counters differ");
            assert!(a.1 == b.1, "{eviction:?}: index differs");
        }
    }
}

/// Which of a TRIMmed batch's survivors the ring evicts first, over `runs` fresh volumes.
/// Gathers 60 one-time misses (blocks 5000 + 3i), TRIMs the first 30 with a range of 90 blocks
/// (wider than the ring's 60 copies: `forget_range` then walks the gathered batch's hash map),
/// fills and writes the batch, writes batches until the ring's head evicts its first 15
/// positions, then reads each survivor once: the ones that miss are the evicted ones.
fn ring_evictions_after_trim(runs: usize) -> std::collections::BTreeSet<Vec<u64>> {
    let mut outcomes = std::collections::BTreeSet::new();
    for _ in 0..runs {
        let (cache, backing) = devices_seg(160, 16, 65_536, CreateOptions::default()); // ring 256
        let c: Arc<dyn BlockDevice> = cache.clone();
        let b: Arc<dyn BlockDevice> = backing.clone();
        let opts = VolumeOptions { sequential_bypass_bytes: 0, ..s3fifo() };
        let v = Volume::open(c, b, Arc::new(SimClock::new()), opts).expect("open").0;
        let g = |i: u64| 5000 + 3 * i;
        read_once(&v, (0..60).map(g));
        v.discard(5000 * BS as u64, 90 * BS as u64).unwrap();
        let mut cold = (0..).map(|n: u64| 20_000 + 5 * n);
        read_once(&v, cold.by_ref().take(34)); // batch 1: 64, positions 0..64
        assert_eq!(v.status().probation_blocks, 64);
        read_once(&v, cold.by_ref().take(63));
        let mut run = vec![0u8; 16 * BS];
        v.read(40_000 * BS as u64, &mut run).unwrap(); // batch 2: 79, positions 64..143
        read_once(&v, cold.by_ref().take(64)); // batch 3: 143..207
        read_once(&v, cold.by_ref().take(64)); // batch 4: evicts positions 0..15
        let mut evicted = Vec::new();
        for i in 30..60 {
            let before = v.status().counters.read_miss_blocks;
            read_once(&v, [g(i)].into_iter());
            if v.status().counters.read_miss_blocks > before {
                evicted.push(g(i));
            }
        }
        assert_eq!(evicted.len(), 15, "{evicted:?}");
        outcomes.insert(evicted);
    }
    outcomes
}

/// The same requests on fresh volumes must evict the same ring copies. FAILS at 8f10894 (and
/// at eaa4328, with SipHash): `Probation::forget_range` removes a TRIMmed range's gathered
/// copies in `gathering.map`'s iteration order, and `Batch::remove` moves the last copy into
/// each hole, so the survivors' ring positions, and which of them the ring drops first,
/// follow the per-map hash seed. Fix: collect the blocks to forget and sort them (or walk
/// `gathering.blocks`, a Vec in ring order, instead of the map) before forgetting.
#[test]
fn a_trim_of_gathered_ring_copies_leaves_the_ring_the_same_whatever_the_hash_seed() {
    let outcomes = ring_evictions_after_trim(8);
    assert_eq!(outcomes.len(), 1, "the same requests evicted different ring copies: {outcomes:#?}");
}
