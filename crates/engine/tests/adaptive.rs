//! The `adaptive` policy (the default; engine volume/admission.rs, duel.rs, frequency.rs):
//! S3-FIFO, plus misses filling the log until it first wraps, plus a frequency gate on ghosts
//! that a duel of two miniature simulations switches on where it misses less.
//! - `misses_fill_the_log_until_it_wraps_then_wait_in_the_ring`: while the log has room for
//!   the staged record and the next, every admitted miss enters the log, none the ring; after
//!   that, a miss that is no ghost enters the ring; a reopened full log takes none; `s3fifo`
//!   never fills;
//! - `a_loop_larger_than_the_cache_is_kept_in_part`: a loop over 1.5x the cache, read in a
//!   fixed shuffled order, misses on every read under `s3fifo` once it laps; the duel turns
//!   the gate on and the log keeps a stable part of the loop;
//! - `a_drifting_working_set_keeps_the_gate_off`: blocks read a few times within a short
//!   span, then never: the gate would refuse what is about to be read again, and the duel
//!   leaves it off;
//! - `every_read_returns_the_newest_data_under_the_gate`: writes, TRIMs and reads mixed into
//!   the loop, every read checked against a model.

use std::sync::Arc;
use tiercache_device::{BlockDevice, SimDevice};
use tiercache_engine::{CreateOptions, Eviction, Volume, VolumeOptions};

mod common;
use common::*;

const SEGMENT: u32 = 16;
const LOG_SEGMENTS: u64 = 160; // 2,560 blocks: a ring of 256 (10 %), the log 2,304
const BACKING_BLOCKS: u64 = 65_536;

fn open_with(cache: &Arc<SimDevice>, backing: &Arc<SimDevice>, eviction: Eviction) -> Volume {
    let c: Arc<dyn BlockDevice> = cache.clone();
    let b: Arc<dyn BlockDevice> = backing.clone();
    let options = VolumeOptions { sequential_bypass_bytes: 0, eviction, ..VolumeOptions::default() };
    Volume::open(c, b, Arc::new(tiercache_device::MonotonicClock::new()), options).expect("open").0
}

fn volume(eviction: Eviction) -> (Arc<SimDevice>, Arc<SimDevice>, Volume) {
    let (c, b) = devices_seg(LOG_SEGMENTS, SEGMENT, BACKING_BLOCKS, CreateOptions::default());
    let v = open_with(&c, &b, eviction);
    (c, b, v)
}

fn read_block(v: &Volume, block: u64) -> Option<u64> {
    read_version(v, block).expect("read")
}

/// A fixed shuffle of `0..n` (xorshift; no two blocks of it adjacent in order often enough to
/// look like a scan).
fn shuffled(n: u64, seed: u64) -> Vec<u64> {
    let mut order: Vec<u64> = (0..n).collect();
    let mut x = seed | 1;
    for i in (1..order.len()).rev() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        order.swap(i, (x % (i as u64 + 1)) as usize);
    }
    order
}

#[test]
fn misses_fill_the_log_until_it_wraps_then_wait_in_the_ring() {
    let (c, b, v) = volume(Eviction::Adaptive);
    assert_eq!(v.status().frequency_gate, Some(false), "the gate is off while the log fills");
    let order = shuffled(8192, 7);
    let mut reads = order.iter();
    // Misses enter the log while the staged record and the next fit without a reclaim.
    while v.status().counters.probation_admitted_blocks == 0 {
        let &block = reads.next().expect("the log fills within 8,192 one-block misses");
        assert_eq!(read_block(&v, 1000 + block), Some(0));
        let s = v.status();
        assert_eq!(s.log_head, 0, "the log never wraps while misses fill it");
        if s.counters.probation_admitted_blocks == 0 {
            assert_eq!(s.counters.filling_admitted_blocks, s.counters.admitted_blocks);
        }
    }
    let filled = v.status().counters.filling_admitted_blocks;
    assert!((1700..2304).contains(&filled), "{filled} misses filled a log of 2,304 blocks");
    // Full: misses that are no ghosts wait in the ring now.
    for &block in reads.by_ref().take(3000) {
        read_block(&v, 1000 + block);
    }
    let s = v.status();
    assert_eq!(s.counters.filling_admitted_blocks, filled, "no more filling");
    assert!(s.counters.probation_admitted_blocks >= 2900, "{:?}", s.counters);
    drop(v);

    // A reopened volume whose log is full takes no misses into it: the ring from the start.
    let v = open_with(&c, &b, Eviction::Adaptive);
    for &block in reads.take(400) {
        read_block(&v, 1000 + block);
    }
    let s = v.status();
    assert_eq!(s.counters.filling_admitted_blocks, 0, "{:?}", s.counters);
    assert!(s.counters.probation_admitted_blocks >= 350, "{:?}", s.counters);

    // The plain s3fifo policy never fills: the ring from the first miss.
    let (_c, _b, v) = volume(Eviction::S3fifo);
    for block in shuffled(300, 9) {
        read_block(&v, 5000 + block);
    }
    let s = v.status();
    assert_eq!(s.frequency_gate, None);
    assert_eq!(s.counters.filling_admitted_blocks, 0);
    assert!(s.counters.probation_admitted_blocks >= 250, "{:?}", s.counters);
}

/// Passes of a loop over `n` blocks in one shuffled order: the hits of the last `measured`.
fn loop_hits(v: &Volume, n: u64, passes: usize, measured: usize) -> u64 {
    let order = shuffled(n, 11);
    let mut hits_before = 0;
    for pass in 0..passes {
        if pass == passes - measured {
            hits_before = v.status().counters.read_hit_blocks;
        }
        for &block in &order {
            assert_eq!(read_block(v, 20_000 + block), Some(0), "block {}", 20_000 + block);
        }
    }
    v.status().counters.read_hit_blocks - hits_before
}

#[test]
fn a_loop_larger_than_the_cache_is_kept_in_part() {
    // 1.5x the cache's 2,560 blocks.
    let n = 3840;
    let (_c, _b, plain) = volume(Eviction::S3fifo);
    let plain_hits = loop_hits(&plain, n, 24, 8);
    let (_c, _b, v) = volume(Eviction::Adaptive);
    let hits = loop_hits(&v, n, 24, 8);
    let s = v.status();
    eprintln!("last 8 passes' hits of {}: s3fifo {plain_hits}, adaptive {hits}; {:?}", 8 * n, s.counters);
    assert_eq!(s.frequency_gate, Some(true), "the duel chose the gate");
    assert!(s.counters.gate_refused_blocks > 1000, "{:?}", s.counters);
    // The log (2,304 blocks) could keep 60 % of the loop; the gate keeps most of that. S3-FIFO
    // keeps whatever its ghosts and reinsertion happen to hold.
    assert!(hits > 8 * n / 3, "adaptive hit {hits} of {}", 8 * n);
    assert!(hits as f64 > 1.3 * plain_hits as f64, "adaptive {hits} vs s3fifo {plain_hits}");
}

#[test]
fn a_drifting_working_set_keeps_the_gate_off() {
    let (_c, _b, v) = volume(Eviction::Adaptive);
    let mut x = 1u64;
    for step in 0..200_000u64 {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        // A window of 2,000 blocks sliding by one block every 8 reads.
        let block = step / 8 + (x >> 33) % 2000;
        read_block(&v, block);
    }
    let s = v.status();
    assert_eq!(s.frequency_gate, Some(false), "{:?}", s.counters);
}

#[test]
fn every_read_returns_the_newest_data_under_the_gate() {
    let (_c, _b, v) = volume(Eviction::Adaptive);
    let n = 3840u64;
    let order = shuffled(n, 13);
    let mut model = std::collections::HashMap::<u64, u64>::new();
    let mut version = 1;
    for pass in 0..16u64 {
        for (i, &k) in order.iter().enumerate() {
            let block = 20_000 + k;
            // Every 37th read of a pass after the fourth rewrites a block of the loop, every
            // 101st trims one (reads then return zeros: version None).
            if pass >= 4 && i % 37 == 0 {
                write(&v, block, version);
                model.insert(block, version);
                version += 1;
            } else if pass >= 4 && i % 101 == 0 {
                v.discard(block * BS as u64, BS as u64).unwrap();
                model.insert(block, u64::MAX);
            }
            let want = match model.get(&block) {
                None => Some(0),
                Some(&u64::MAX) => None,
                Some(&ver) => Some(ver),
            };
            let got = read_version(&v, block).expect("read");
            assert!(
                got == want || (want.is_none() && got == Some(0)),
                "pass {pass}: block {block}: {got:?}, want {want:?}"
            );
        }
        if pass % 4 == 3 {
            v.flush().unwrap();
        }
    }
    assert!(v.status().counters.gate_refused_blocks > 0, "{:?}", v.status().counters);
}

/// Misses that find staging full when their read ends are not admitted, and counted as such
/// (`bypassed_blocks_busy`): a read never waits for the record writer. Two reads of 64
/// missed blocks (the admission limit is 256 KiB) on a volume with no background thread:
/// the second fills staging's 126 data blocks with 62 of its own and leaves 2 out, then
/// writes the record itself.
#[test]
fn misses_finding_staging_full_are_counted_not_admitted() {
    let (_c, _b, v) = volume(Eviction::Adaptive);
    let mut buf = vec![0u8; 64 * BS];
    v.read(0, &mut buf).unwrap();
    v.read(1000 * BS as u64, &mut buf).unwrap();
    let c = v.status().counters;
    assert_eq!((c.admitted_blocks, c.bypassed_blocks_busy, c.records_written), (126, 2, 1), "{c:?}");
    assert_eq!(read_version(&v, 1063).unwrap(), Some(0));
}
