//! Adversarial review of commit 9d0dca9 ("Read cache: reclaim passes every block read again
//! while no write waits ..."): reclaim's `min_progress` of 1 without a writer (the
//! `foreground` count), the frequency gate's victim searched 1,024 slots deep from a cursor,
//! the duel's miniature mirroring both, and a ghost queue of a whole log per generation.
//! Each test is one suspicion; the comment above it says whether it held (BUG) or was
//! refuted.
//!
//! Failed on 9d0dca9: `a_log_of_more_than_2_28_blocks_does_not_overflow_the_ghost_filters`
//! (the ghost filters' range reduction overflowed for logs above 2^28 blocks: a panic under
//! the state lock on a read miss; ghost.rs now reduces in 128 bits). The other three passed
//! (refuted suspicions about `min_progress` 1).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tiercache_device::{BlockDevice, MonotonicClock};
use tiercache_engine::{create, CreateOptions, Volume, VolumeOptions};
use tiercache_format::Layout;

mod common;
use common::*;

// ------------------------------------------------------------------------------------------
// A sparse device: only blocks written with something other than zeroes take RAM, so a cache
// device of more than a TiB can be formatted and opened.

struct Sparse {
    size: u64,
    blocks: Mutex<HashMap<u64, Box<[u8]>>>,
}

impl Sparse {
    fn new(size: u64) -> Arc<Sparse> {
        Arc::new(Sparse { size, blocks: Mutex::new(HashMap::new()) })
    }
}

impl BlockDevice for Sparse {
    fn size_bytes(&self) -> u64 {
        self.size
    }
    fn logical_block_size(&self) -> u32 {
        BS as u32
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> tiercache_device::Result<()> {
        assert!(
            offset.is_multiple_of(BS as u64) && buf.len().is_multiple_of(BS) && offset + buf.len() as u64 <= self.size
        );
        let m = self.blocks.lock().unwrap();
        for (i, chunk) in buf.chunks_mut(BS).enumerate() {
            match m.get(&(offset / BS as u64 + i as u64)) {
                Some(b) => chunk.copy_from_slice(b),
                None => chunk.fill(0),
            }
        }
        Ok(())
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> tiercache_device::Result<()> {
        assert!(
            offset.is_multiple_of(BS as u64) && buf.len().is_multiple_of(BS) && offset + buf.len() as u64 <= self.size
        );
        let mut m = self.blocks.lock().unwrap();
        for (i, chunk) in buf.chunks(BS).enumerate() {
            let k = offset / BS as u64 + i as u64;
            if chunk.iter().all(|&b| b == 0) {
                m.remove(&k);
            } else {
                m.insert(k, chunk.to_vec().into_boxed_slice());
            }
        }
        Ok(())
    }
    fn flush(&self) -> tiercache_device::Result<()> {
        Ok(())
    }
    fn discard(&self, _offset: u64, _len: u64) -> tiercache_device::Result<()> {
        Ok(())
    }
    fn describe(&self) -> String {
        "sparse".into()
    }
}

/// The first probe of `block` in the ghost queue's Bloom filters (ghost.rs, `probes`, i = 0):
/// the high half of one 64-bit mix.
fn ghost_probe0_hash(block: u64) -> u64 {
    let h = (block ^ 0x5851_F42D_4C95_7F2D).wrapping_mul(0x9E37_79B9_7F4A_7C15);
    h >> 32
}

/// BUG: the ghost queue's filters are now sized for a whole log (`Ghosts::new(log_blocks)`,
/// was half). A filter then has `16 * log_blocks` bits, more than 2^32 once the log exceeds
/// 2^28 blocks (1 TiB of 4 KiB blocks; MAX_LOG_BLOCKS is 2^29), and the probe's range
/// reduction `(hash32 * bits) >> 32` overflows u64. The release profile keeps overflow checks
/// on, so the first read miss of about one block in 256 panics in `Ghosts::contains` under the
/// state lock (log only: `freq_at_install`; with the ring: `route`, on every miss). Before the
/// commit a filter had at most 2^32 bits and the product fit.
#[test]
fn a_log_of_more_than_2_28_blocks_does_not_overflow_the_ghost_filters() {
    // A log of 2^28 + 2^20 blocks: 2^32 + 2^24 bits per filter.
    let seg = 256u32;
    let log_blocks = (1u64 << 28) + (1 << 20);
    let ck = Layout::checkpoint_blocks_for(log_blocks, BS as u32);
    let cache = Sparse::new((2 + 2 * ck + log_blocks) * BS as u64);
    let backing = Sparse::new((1u64 << 20) * BS as u64);
    create(&*cache, &*backing, &CreateOptions { segment_blocks: seg, ..log_only() }).expect("create");
    let options = VolumeOptions { sequential_bypass_bytes: 0, record_entries: Some(2), ..VolumeOptions::default() };
    let c: Arc<dyn BlockDevice> = cache.clone();
    let b: Arc<dyn BlockDevice> = backing.clone();
    let v = Volume::open(c, b, Arc::new(MonotonicClock::new()), options).expect("open").0;
    let layout = v.superblock().layout;
    assert_eq!(layout.log_blocks, log_blocks);
    // Blocks whose first probe overflows with filters of this size: (hash32 * bits) >= 2^64.
    let bits = (log_blocks * 16).next_multiple_of(64) as u128;
    let overflowing: Vec<u64> =
        (1000..1u64 << 20).filter(|&b| u128::from(ghost_probe0_hash(b)) * bits >= 1u128 << 64).take(8).collect();
    assert_eq!(overflowing.len(), 8, "blocks whose probe overflows");
    // Read misses of them, staging a record of two blocks each time: its install asks the
    // ghost queue whether each block was evicted lately.
    let mut buf = vec![0u8; BS];
    for &block in &overflowing {
        // (On 9d0dca9: "attempt to multiply with overflow" in ghost.rs, under the state lock.)
        v.read(block * BS as u64, &mut buf).unwrap_or_else(|e| panic!("a read miss of block {block}: {e}"));
    }
    v.checkpoint().expect("checkpoint");
    assert_eq!(v.status().cached_blocks, overflowing.len() as u64, "every miss admitted");
}

// ------------------------------------------------------------------------------------------
// Reclaim over a head dense with blocks read again.

/// Segments of 64 blocks: `copy_forward_max` 32, the reclaim reserve 33; a reclaim record may
/// take up to a whole segment of clean copies, so `room / 16` is 4 with a writer waiting and
/// `min_progress` 1 without.
const SEG: u32 = 64;
const SEGMENTS: u64 = 32;
const RESERVE: u64 = 33;

fn hot_options() -> VolumeOptions {
    VolumeOptions { sequential_bypass_bytes: 0, checkpoint_interval_permille: 1000, ..VolumeOptions::default() }
}

/// Block `i` of a set of `n` from 100, in a scattered order (a stride no stream detector
/// takes for a scan).
fn scattered(n: u64, i: u64) -> u64 {
    100 + (i * 389) % n
}

/// A volume (log only) whose whole log holds blocks read four times (counts at 3), each
/// still cached; its cache device behind a `Gate`.
fn hot_volume() -> (Arc<tiercache_device::SimDevice>, Arc<Gate>, Arc<Volume>, u64) {
    let (cache, backing) = devices_seg(SEGMENTS, SEG, 1 << 16, log_only());
    let gate = Gate::new(cache.clone());
    let c: Arc<dyn BlockDevice> = gate.clone();
    let b: Arc<dyn BlockDevice> = backing.clone();
    let v = Arc::new(Volume::open(c, b, Arc::new(MonotonicClock::new()), hot_options()).expect("open").0);
    let log_blocks = v.superblock().layout.log_blocks;
    // A working set of 7/8 of the log (what fits beside staging and the reserve), read 4 times.
    let n = log_blocks * 7 / 8;
    for _ in 0..4 {
        read_once(&v, (0..n).map(|i| scattered(n, i)));
    }
    v.checkpoint().unwrap();
    let s = v.status();
    eprintln!(
        "hot volume: log {log_blocks}, set {n}, cached {}, hot {}, free {}, window {:?}",
        s.cached_blocks,
        s.hot_blocks,
        free_of(&v),
        v.log_window()
    );
    (cache, gate, v, n)
}

fn free_of(v: &Volume) -> u64 {
    let (head, _, tail) = v.log_window();
    head + v.superblock().layout.log_blocks - tail
}

/// REFUTED (expected to pass): with no writer, reclaim over a hot head frees only one block
/// beyond its record (`min_progress` 1), yet each reclaim still frees something, the reserve
/// holds after every request (`check_invariants` and the asserts in reclaim.rs run at each
/// reclaim), and every block reads back intact while the log turns over several times.
#[test]
fn a_hot_head_without_a_writer_keeps_the_reserve_and_moves_on() {
    let (cache, _gate, v, n) = hot_volume();
    let log_blocks = v.superblock().layout.log_blocks;
    let before = v.status().counters;
    let flushes_before = cache.stats().flushes;
    let (head0, _, _) = v.log_window();
    // New blocks read once, while the hot set is read again in between (its counts stay up).
    let mut fresh = 20_000u64;
    for round in 0..6 * log_blocks {
        read_once(&v, std::iter::once(fresh));
        fresh += 3;
        if round % 4 == 0 {
            read_once(&v, std::iter::once(scattered(n, round / 4)));
        }
        assert!(free_of(&v) >= RESERVE, "round {round}: the reclaim reserve is free");
    }
    let after = v.status().counters;
    let (head1, _, _) = v.log_window();
    let reclaims = cache.stats().flushes - flushes_before;
    eprintln!(
        "no writer: head moved {}, {} reclaim flushes, {} reinserted, {} evicted, {} admitted",
        head1 - head0,
        reclaims,
        after.reinserted_blocks - before.reinserted_blocks,
        after.evicted_blocks - before.evicted_blocks,
        6 * log_blocks
    );
    assert!(head1 - head0 >= log_blocks, "the head went round the log at least once");
    // Every block of the hot set that is still cached reads intact (read_once checks).
    read_once(&v, (0..n).map(|i| scattered(n, i)));
}

/// REFUTED (expected to pass): a writer meeting the same hot head is served by reclaims
/// that free `room / 16` each, as before the commit; only a record nobody waits for (read
/// misses) is made room for by reclaims that free one block each. Two fresh hot volumes:
/// one takes two records of read misses, the other two records of writes; the writer's
/// needs at most about (need / 4) reclaims.
#[test]
fn a_writer_meeting_a_hot_head_waits_for_few_reclaims() {
    const DATA: u64 = 126; // a staging's data blocks (3/4 of 168 entries)
                           // Read misses.
    let (cache, _gate, v, _n) = hot_volume();
    let f0 = cache.stats().flushes;
    let r0 = v.status().counters.reinserted_blocks;
    read_once(&v, (0..2 * DATA + 1).map(|i| 20_000 + 3 * i));
    let reader_flushes = cache.stats().flushes - f0;
    let reader_copies = v.status().counters.reinserted_blocks - r0;
    // Writes.
    let (cache, _gate, v, _n) = hot_volume();
    let f0 = cache.stats().flushes;
    let r0 = v.status().counters.reinserted_blocks;
    for k in 0..2 * DATA + 1 {
        write(&v, 20_000 + 3 * k, 1);
    }
    let writer_flushes = cache.stats().flushes - f0;
    let writer_copies = v.status().counters.reinserted_blocks - r0;
    eprintln!(
        "two records over a hot head: read misses {reader_flushes} cache flushes, {reader_copies} copies; \
         writes {writer_flushes} cache flushes, {writer_copies} copies"
    );
    // The second record needs 127 + 33 free where 241 - 127 are: 46 blocks, at least 2 a
    // reclaim (room is 32 to 64 copies with the tail near the reserve: room / 16 >= 2).
    assert!(writer_flushes <= 46usize.div_ceil(2) as u64 + 3, "{writer_flushes} reclaims for the writer");
    for k in 0..2 * DATA + 1 {
        assert_eq!(read_version(&v, 20_000 + 3 * k).unwrap(), Some(1));
    }
}

/// REFUTED (expected to pass): a writer that arrives while a reader's record waits for a
/// chain of one-block reclaims (held at one of their cache flushes) waits for the reclaim
/// under way and then for reclaims that free `room / 16` each: bounded as before the commit.
/// (The writer's arrival is ordered by a pause before the gate opens; had it come later, it
/// would only have had less to wait for.)
#[test]
fn a_writer_arriving_mid_chain_waits_for_a_bounded_number_of_reclaims() {
    const DATA: u64 = 126;
    let (cache, gate, v, _n) = hot_volume();
    // One record of misses fits without a reclaim; the next one's seal needs 46 blocks.
    read_once(&v, (0..DATA).map(|i| 20_000 + 3 * i));
    read_once(&v, (DATA..2 * DATA - 1).map(|i| 20_000 + 3 * i));
    let f0 = cache.stats().flushes;
    gate.hold_flush(3);
    let reader = on_thread(&v, move |v| read_once(v, std::iter::once(20_000 + 3 * (2 * DATA - 1))));
    gate.wait_until_held();
    let flushes_at_arrival = cache.stats().flushes;
    eprintln!("held at cache flush {} of the reader's chain", flushes_at_arrival - f0 + 1);
    let writer = on_thread(&v, |v| {
        v.write(60_000 * BS as u64, &stamps(60_000, 2 * DATA, 2)).unwrap();
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    gate.open_gate();
    writer.join().unwrap();
    let reclaims = cache.stats().flushes - flushes_at_arrival;
    reader.join().unwrap();
    let total = cache.stats().flushes - f0;
    eprintln!("writer arriving mid-chain: {reclaims} cache flushes until its write returned ({total} in all)");
    // The reclaim under way, the rest of the reader's 46 blocks and the writer's 127 + 33 at
    // 4 a reclaim, a few checkpoints.
    let bound = 1 + (46 + 127 + RESERVE).div_ceil(4) + 4;
    assert!(reclaims <= bound, "{reclaims} reclaims for a writer arriving mid-chain (bound {bound})");
    for b in 60_000..60_000 + 2 * DATA {
        assert_eq!(read_version(&v, b).unwrap(), Some(2));
    }
}
