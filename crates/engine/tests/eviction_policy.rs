//! The read cache's eviction policy (volume/reclaim.rs): FIFO over the log with reinsertion.
//! A clean block read since it was cached (or last kept) is copied forward by reclaim with
//! its read count one less; a block read once is evicted when the head reaches it; a missed
//! block that reclaim evicted lately (the ghost queue) enters with a count of one.
//! - `a_block_read_again_outlives_blocks_read_once`: a hot set read between laps of one-time
//!   reads stays cached lap after lap (plain FIFO drops it after the first lap), and the
//!   one-time blocks leave;
//! - `a_re_missed_block_is_kept_for_one_lap_without_a_hit`: the ghost queue's credit;
//! - `reinserted_blocks_are_cached_after_a_power_cut`: the reclaim record's clean copies are
//!   replayed as cached clean blocks with the right data;
//! - `a_block_trimmed_while_reclaim_copies_it_does_not_come_back`: TRIM between reclaim's
//!   read of a kept block and the sealing of its record, then a write-around of the block
//!   once the head passed its old copy, FLUSH, power cut: the new data survives (the copy was
//!   dropped from the record; replayed, it would have shadowed the written-around data);
//! - `a_corrupt_kept_block_is_evicted_not_copied`: a kept block that fails its checksum when
//!   reclaim reads it is evicted, and reads return the backing device's data;
//! - `a_sequential_re_read_past_2_mib_marks_nothing_hot`: a scan read again counts as reads
//!   only for its first 2 MiB (SEQUENTIAL_REREAD_BYTES), even with the admission bypass off;
//!   random re-reads of the same blocks count;
//! - `a_short_scan_read_again_is_all_hot`: a scan under 2 MiB (a small table) read again
//!   counts whole.

use std::sync::Arc;
use tiercache_device::SimDevice;
use tiercache_engine::{Volume, VolumeOptions};

mod common;
use common::holds::*;
use common::*;

const SEGMENT: u32 = 64; // (reclaim keeps up to 32 blocks per record)
const LOG_SEGMENTS: u64 = 16; // 1,024 blocks
const BACKING_BLOCKS: u64 = 16_384;

/// A 1,024-block log over a 16,384-block backing device (version 0), no background thread,
/// sequential reads admitted however long (these tests read one block per request anyway).
fn volume() -> (Arc<SimDevice>, Arc<SimDevice>, Volume) {
    let options = VolumeOptions { sequential_bypass_bytes: 0, ..VolumeOptions::default() };
    volume_seg(LOG_SEGMENTS, SEGMENT, BACKING_BLOCKS, options)
}

/// The `n`-th one-time block: distinct, far from the hot set, not consecutive.
fn cold(n: u64) -> u64 {
    1_000 + (n * 7) % 15_000
}

fn hits(v: &Volume) -> u64 {
    v.status().counters.read_hit_blocks
}

#[test]
fn a_block_read_again_outlives_blocks_read_once() {
    // A hot set of 24 blocks (fewer than a reclaim record keeps), and one of 96 (three
    // records' worth, in consecutive slots: each reclaim that keeps such a run pays a record
    // header for it, so a few of the run may go per lap, and come back with their next read).
    for (hot, at_least) in [(24u64, 24u64), (96, 90)] {
        let (_c, _b, v) = volume();
        read_once(&v, 0..hot); // (admitted; the staging is sealed by the reads below)
        let mut next = 0;
        for lap in 0..6 {
            // 512 one-time blocks: half the log; two of these push the head a full lap.
            read_once(&v, (next..next + 512).map(cold));
            next += 512;
            let before = hits(&v);
            read_once(&v, 0..hot);
            let got = hits(&v) - before;
            if lap > 0 {
                assert!(got >= at_least, "hot set of {hot}, lap {lap}: {got} hits");
            }
        }
        let c = v.status().counters;
        assert!(c.reinserted_blocks >= hot, "reclaim kept the hot set: {} reinserted", c.reinserted_blocks);
        // The first one-time blocks are long gone (read once, evicted at their first lap).
        let cached: Vec<u64> = (0..64).map(cold).filter(|&b| slot_of(&v, b).is_some()).collect();
        assert!(cached.is_empty(), "one-time blocks still cached: {cached:?}");
    }
}

#[test]
fn a_re_missed_block_is_kept_for_one_lap_without_a_hit() {
    let (_c, _b, v) = volume();
    // Block 5 is read, pushed out by a lap of one-time reads, and read again: a miss of a
    // block the ghost queue remembers, so it enters with a count of one.
    read_once(&v, [5].into_iter());
    read_once(&v, (0..2_048).map(cold));
    assert!(slot_of(&v, 5).is_none(), "block 5 was evicted after its lap");
    read_once(&v, [5].into_iter());
    let e = v.index_snapshot().into_iter().find(|(b, _)| *b == 5);
    let e = e.map(|(_, e)| e);
    if let Some(e) = e {
        assert_eq!(e.freq, 1, "a re-missed block enters with a count of one");
    }
    // Whether it was installed yet or still staged, one more lap of one-time reads (no hit on
    // block 5) leaves it cached: reclaim kept it once.
    read_once(&v, (2_048..2_048 + 900).map(cold));
    assert!(slot_of(&v, 5).is_some(), "block 5 survived a lap without being read");
    let before = hits(&v);
    read_once(&v, [5].into_iter());
    assert_eq!(hits(&v) - before, 1);
}

#[test]
fn reinserted_blocks_are_cached_after_a_power_cut() {
    const HOT: u64 = 24;
    let (cache, backing, v) = volume();
    read_once(&v, 0..HOT);
    read_once(&v, (0..200).map(cold)); // (the admissions' record is sealed)
    read_once(&v, 0..HOT); // (count one)
    read_once(&v, 0..HOT); // (count two)
    read_once(&v, (200..1_400).map(cold)); // more than a lap: the hot set was copied forward
    assert!(v.status().counters.reinserted_blocks >= HOT);
    v.flush().unwrap();
    let positions: Vec<(u64, u32)> = (0..HOT).map(|b| (b, slot_of(&v, b).expect("cached").0)).collect();
    let recovered = open(durable_copy(&cache), durable_copy(&backing));
    for (b, slot) in positions {
        assert_eq!(slot_of(&recovered, b), Some((slot, false)), "block {b}: cached clean where reclaim put it");
    }
    let before = hits(&recovered);
    read_once(&recovered, 0..HOT);
    assert_eq!(hits(&recovered) - before, HOT, "the hot set is warm after the power cut");
}

/// The log offset (bytes, on the cache device) of `block`'s cached copy.
fn cache_offset(v: &Volume, block: u64) -> u64 {
    let (slot, _) = slot_of(v, block).expect("cached");
    v.superblock().layout.log_offset(u64::from(slot))
}

#[test]
fn a_block_trimmed_while_reclaim_copies_it_does_not_come_back() {
    // A 128-block log in 8-block segments (reclaim keeps up to 4 blocks per record), writes
    // of two blocks or more going around whatever the dirty level.
    let (cache, backing) = wa_devices(16, 4_096);
    let dev = Dev::new(&cache);
    let v = Arc::new(open_wa(dev.clone(), backing.clone()));
    const X: u64 = 40; // (not one of the backing device's fingerprint blocks, which never go around)
    read_once(&v, [X].into_iter());
    read_once(&v, (0..20).map(|n| 2_000 + n * 3)); // (X's record is sealed: X is in the index)
    read_once(&v, [X].into_iter()); // (count one: reclaim will keep it)
    let at = cache_offset(&v, X);
    // Hold reclaim's read of X's copy (nothing else reads that slot: X is not read again).
    let held = dev.hold(move |op, off, len| op == Op::Read && off <= at && at < off + len as u64);
    // One-time reads until the reclaim that keeps X has run (and no more: later laps would
    // take the head past that reclaim's record too).
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let reader = {
        let (v, stop) = (Arc::clone(&v), Arc::clone(&stop));
        std::thread::spawn(move || {
            for n in 0..400 {
                if stop.load(std::sync::atomic::Ordering::SeqCst) {
                    break;
                }
                read_once(&v, [100 + n * 3].into_iter());
            }
        })
    };
    dev.wait_held(held);
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    v.discard(X * BS as u64, BS as u64).unwrap();
    dev.release(held);
    join_within(reader, 30, "the reads that drove reclaim");
    assert!(slot_of(&v, X).is_none(), "TRIM dropped X");
    // The head has passed X's old copy: X may be written around now. Block X + 1 was never
    // cached, so the two-block write goes around.
    let around0 = around(&v);
    write_n(&v, X, 2, 1).unwrap();
    assert_eq!(around(&v) - around0, 2, "the write went around the cache");
    v.flush().unwrap();
    let recovered = crash_and_recover(&cache, &backing);
    assert_eq!(ver(&recovered, X), 1, "the written-around data, not the copy reclaim read before the TRIM");
    assert_eq!(ver(&recovered, X + 1), 1);
}

#[test]
fn a_corrupt_kept_block_is_evicted_not_copied() {
    let (cache, _backing, v) = volume();
    read_once(&v, 0..8);
    read_once(&v, (0..200).map(cold)); // (the admissions' record is sealed)
    read_once(&v, 0..8); // (count one: reclaim will keep them)
    corrupt_cached_block(&cache, &v, 3);
    read_once(&v, (200..1_400).map(cold)); // a lap: reclaim reads the kept blocks to copy them
    assert!(slot_of(&v, 3).is_none(), "the rotten copy was evicted");
    for b in [0, 1, 2, 4, 5, 6, 7] {
        assert!(slot_of(&v, b).is_some(), "block {b} was kept");
    }
    read_once(&v, 0..8); // (asserts version 0: the backing device's copy of block 3)
}

#[test]
fn a_sequential_re_read_past_2_mib_marks_nothing_hot() {
    let (_c, _b, v) = volume(); // (the admission bypass off: the scan is admitted)
    let read = |first: u64, n: u64| {
        let mut buf = vec![0u8; n as usize * BS];
        v.read(first * BS as u64, &mut buf).unwrap();
    };
    for pass in 0..2 {
        for k in 0..24 {
            read(k * 32, 32); // 768 blocks (3 MiB) in 128 KiB requests
        }
        let hot = v.status().hot_blocks;
        if pass == 0 {
            assert_eq!(hot, 0, "a first read marks nothing hot");
        } else {
            // The second scan's first 2 MiB (512 blocks) count as re-reads; the rest do not.
            assert_eq!(hot, 512, "hot blocks after the scan read again");
        }
    }
    assert!((512..768).all(|b| freq(&v, b) == Some(0)), "the scan's hits past 2 MiB count no read");
    // Random re-reads of the same blocks (single blocks apart, and short of the scan's last
    // requests: a read within two requests of where a scan stands continues it) do count.
    for b in [600u64, 520, 571, 544, 590, 623, 530, 612] {
        read(b, 1);
    }
    assert_eq!(v.status().hot_blocks, 512 + 8);
    assert_eq!(freq(&v, 600), Some(1));
}

#[test]
fn a_short_scan_read_again_is_all_hot() {
    let (_c, _b, v) = volume();
    let read = |first: u64, n: u64| {
        let mut buf = vec![0u8; n as usize * BS];
        v.read(first * BS as u64, &mut buf).unwrap();
    };
    // A 192-block table (768 KiB: under the 2 MiB a stream's hits count for) scanned twice.
    for _ in 0..2 {
        for k in 0..6 {
            read(2000 + k * 32, 32);
        }
    }
    assert_eq!(v.status().hot_blocks, 192, "every hit of the short scan counts");
}
