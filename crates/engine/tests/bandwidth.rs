//! The mechanisms behind large-request bandwidth (issue 13), pinned by counting I/Os through
//! the device layer instead of timing them:
//! - `consecutive_cached_blocks_are_read_with_one_io_per_run`: a large read of blocks that sit
//!   in consecutive log slots issues one cache read, not one per 4 KiB block nor one per
//!   record (the record headers between are skipped inside one scatter read);
//! - `a_writer_meeting_clean_data_at_the_head_touches_no_backing_device`: evicting clean data
//!   costs no backing I/O, and the reclaim record's cache flush is paid once for many segments;
//! - `the_pre_cleaner_writes_back_the_head_before_the_writer_needs_it`: below the high
//!   watermark, the background round writes back the dirty blocks the writer is about to
//!   reach, so the writer then reclaims them with no backing I/O of its own;
//! - `the_pre_cleaner_ahead_of_the_writers_writes_back_gently`: while the writers have more
//!   than half the pre-cleaner's horizon to write before they meet what it has not judged,
//!   its batches read the log `GENTLE_READ_BLOCKS` slots at a time and keep at most
//!   `GENTLE_WRITES_IN_FLIGHT` backing writes in flight (a log write or cache flush then
//!   queues behind little); closer, the same batch reads and writes all at once;
//! - `a_writer_that_must_write_back_does_it_in_batches`: when nobody pre-cleaned, reclaim's
//!   own write-back covers the next segments too: one backing flush for several segments,
//!   not one per segment;
//! - `a_sequential_scan_leaves_the_hot_set_cached`: a scan of the whole volume (a long
//!   sequential read stream) is not admitted past `sequential_bypass_bytes`, so the hot set's
//!   hit ratio afterwards is what it was before (and with the bypass off, it is not);
//! - `a_write_back_reads_the_log_through_small_gaps_in_one_io`: write-back reads a stretch
//!   of the log holding its blocks between stale slots and record headers with one scatter
//!   read, not one read per run of consecutive slots;
//! - `a_write_back_issues_its_scattered_runs_together`: the runs of a write-back batch go to
//!   the backing device as one batch of writes in flight together (`write_batch`), not one
//!   write after another at queue depth 1;
//! - `concurrent_writers_requests_land_in_consecutive_slots`: a request's blocks are staged
//!   together, so they lie in consecutive log slots however many writers stage at once (and a
//!   later read of them is one I/O per record).

use std::sync::Arc;
use tiercache_device::{BlockDevice, MonotonicClock, SimDevice};
use tiercache_engine::{create, CreateOptions, Volume, VolumeOptions};
use tiercache_format::Layout;

mod common;
use common::*;

const SEGMENT: u64 = 16;
const LOG_BLOCKS: u64 = 1024;
const BACKING_BLOCKS: u64 = 4096;

/// A 1024-block log in 16-block segments over a 4096-block backing device stamped with
/// version 0, opened without a background thread (the tests run its rounds themselves).
/// Sequential reads are admitted however long (`sequential_bypass_bytes` 0): these tests
/// fill the log with clean data by reading the backing device in order.
fn volume() -> (Arc<SimDevice>, Arc<SimDevice>, Volume) {
    volume_with(VolumeOptions { sequential_bypass_bytes: 0, ..VolumeOptions::default() })
}

fn volume_with(options: VolumeOptions) -> (Arc<SimDevice>, Arc<SimDevice>, Volume) {
    let ck = Layout::checkpoint_blocks_for(LOG_BLOCKS, BS as u32);
    let cache = Arc::new(SimDevice::new((2 + 2 * ck + LOG_BLOCKS) * BS as u64, BS as u32).with_name("cache"));
    let backing = Arc::new(SimDevice::from_image(stamps(0, BACKING_BLOCKS, 0), BS as u32).with_name("backing"));
    let opts = CreateOptions { segment_blocks: SEGMENT as u32, ..log_only() };
    create(&*cache, &*backing, &opts).expect("create");
    let c: Arc<dyn BlockDevice> = cache.clone();
    let b: Arc<dyn BlockDevice> = backing.clone();
    let volume = Volume::open(c, b, Arc::new(MonotonicClock::new()), options).expect("open").0;
    (cache, backing, volume)
}

/// Writes blocks `first..first + n` at `version` in 32-block requests, a FLUSH after each.
fn write_run(volume: &Volume, first: u64, n: u64, version: u64) {
    let mut b = first;
    while b < first + n {
        let k = 32.min(first + n - b);
        volume.write(b * BS as u64, &stamps(b, k, version)).unwrap();
        volume.flush().unwrap();
        b += k;
    }
}

/// Reads blocks in 16-block requests (small enough to be admitted as clean cache blocks)
/// from `first` until the log's tail reaches `until` (or the blocks run out).
fn admit_until(volume: &Volume, first: u64, until: u64) -> u64 {
    let mut buf = vec![0u8; 16 * BS];
    let mut b = first;
    while volume.status().log_tail < until && b + 16 <= BACKING_BLOCKS {
        volume.read(b * BS as u64, &mut buf).unwrap();
        b += 16;
    }
    b
}

#[test]
fn consecutive_cached_blocks_are_read_with_one_io_per_run() {
    let (cache, _backing, volume) = volume();
    // A sequential write, one FLUSH at the end: records as full as they get.
    for b in (100..356).step_by(32) {
        volume.write(b * BS as u64, &stamps(b, 32, 1)).unwrap();
    }
    volume.flush().unwrap();
    let before = cache.stats();
    let mut buf = vec![0u8; 256 * BS];
    volume.read(100 * BS as u64, &mut buf).unwrap();
    let (reads, _, _) = delta(cache.stats(), before);
    for (i, block) in buf.chunks(BS).enumerate() {
        assert_eq!(block, stamp(100 + i as u64, 1).as_slice(), "block {}", 100 + i);
    }
    // The 256 blocks sit in a handful of records (a record holds at most 96 data blocks on
    // this log), each record's blocks in consecutive slots, one header between records: one
    // scatter read per `VERIFY_CHUNK_BLOCKS` slots (the headers land in a scratch block), all
    // in one batch, so that the first pieces are verified while the last are read.
    let pieces = 260usize.div_ceil(tiercache_engine::constants::VERIFY_CHUNK_BLOCKS) as u64;
    assert!(reads <= pieces, "reading 256 consecutive cached blocks took {reads} cache reads");
    assert_eq!(volume.status().counters.batched_cache_reads, 1, "one batch");
    assert_eq!(volume.status().counters.read_hit_blocks, 256);
}

#[test]
fn a_writer_meeting_clean_data_at_the_head_touches_no_backing_device() {
    let (cache, backing, volume) = volume();
    // Reads fill the log with clean blocks, several laps.
    let mut buf = vec![0u8; 16 * BS];
    for b in (0..BACKING_BLOCKS).step_by(16) {
        volume.read(b * BS as u64, &mut buf).unwrap();
    }
    assert!(volume.status().log_tail > 2 * LOG_BLOCKS, "the reads lapped the log");
    assert_eq!(volume.status().dirty_blocks, 0);
    let (b0, c0) = (backing.stats(), cache.stats());
    let reclaimed0 = volume.status().counters.reclaimed_blocks;
    write_run(&volume, 0, 512, 1);
    assert_eq!(delta(backing.stats(), b0), (0, 0, 0), "writes over clean data touched the backing device");
    let reclaimed = volume.status().counters.reclaimed_blocks - reclaimed0;
    assert!(reclaimed >= 512, "the writes reclaimed {reclaimed} blocks");
    // One cache flush per FLUSH request (16) plus the reclaim records' flushes, which the
    // wider window over clean segments pays once per eighth of the log, not once per segment.
    let (_, _, flushes) = delta(cache.stats(), c0);
    let segments = reclaimed / SEGMENT;
    assert!(flushes <= 16 + segments / 4, "{flushes} cache flushes for 16 FLUSHes and {segments} segments reclaimed");
    let mut one = vec![0u8; BS];
    for b in 0..512 {
        volume.read(b * BS as u64, &mut one).unwrap();
        assert_eq!(one, stamp(b, 1), "block {b}");
    }
}

#[test]
fn the_pre_cleaner_writes_back_the_head_before_the_writer_needs_it() {
    let (_cache, backing, volume) = volume();
    // The head of the log: 320 dirty blocks (31 % of the log, below the 70 % watermark).
    write_run(&volume, 0, 320, 1);
    // Then clean blocks until free space is short of the pre-cleaner's horizon.
    let next = admit_until(&volume, 1024, LOG_BLOCKS - 80);
    assert_eq!(volume.status().log_head, 0, "nothing reclaimed yet");
    assert_eq!(volume.status().dirty_blocks, 320);

    let b0 = backing.stats();
    volume.background_tick().unwrap();
    let (_, writes, flushes) = delta(backing.stats(), b0);
    let dirty = volume.status().dirty_blocks;
    assert!(writes > 0 && flushes > 0, "the background round wrote nothing back");
    assert!(dirty <= 320 - 200, "the head's dirty blocks were not written back: {dirty} left");
    assert!(dirty > 0, "the pre-cleaner wrote back everything, far beyond the head: dirty data stays cached");

    // The writer now reaches the head and finds it clean: no backing I/O of its own.
    let b1 = backing.stats();
    let free = LOG_BLOCKS - volume.status().log_tail;
    write_run(&volume, 2048, free + 160, 2);
    assert!(volume.status().log_head > 0, "the writes reclaimed the head");
    assert_eq!(delta(backing.stats(), b1), (0, 0, 0), "the writer wrote back blocks itself");
    let mut one = vec![0u8; BS];
    for b in (0..320).chain(1024..next).chain(2048..2048 + free + 160) {
        volume.read(b * BS as u64, &mut one).unwrap();
        let version = if b < 320 {
            1
        } else if b < 2048 {
            0
        } else {
            2
        };
        assert_eq!(one, stamp(b, version), "block {b}");
    }
}

/// A log holding 192 dirty blocks two apart on the backing device (so each is a run of its
/// own there), written 32 to a record, then clean blocks until `free` blocks are left at the
/// tail; returns the volume after one background round, with the devices' I/O counts over
/// that round.
fn one_preclean_round(free: u64, options: VolumeOptions) -> (Volume, Round) {
    one_preclean_round_after(free, options, std::time::Duration::ZERO)
}

/// `one_preclean_round`, the round run `idle` after the log was filled.
fn one_preclean_round_after(free: u64, options: VolumeOptions, idle: std::time::Duration) -> (Volume, Round) {
    let (cache, backing, volume) = volume_with(options);
    for r in 0..6u64 {
        for b in (r * 64..r * 64 + 64).step_by(2) {
            volume.write(b * BS as u64, &stamp(b, 1)).unwrap();
        }
        volume.flush().unwrap();
    }
    admit_until(&volume, 1024, LOG_BLOCKS - free);
    assert_eq!(volume.status().log_head, 0, "nothing reclaimed yet");
    std::thread::sleep(idle);
    let (c0, b0) = (cache.stats(), backing.stats());
    volume.background_tick().unwrap();
    let (c1, b1) = (cache.stats(), backing.stats());
    let round = Round {
        cache_reads: c1.reads - c0.reads,
        writes: b1.writes - b0.writes,
        write_batches: b1.write_batches - b0.write_batches,
        flushes: b1.flushes - b0.flushes,
    };
    (volume, round)
}

/// The I/O of one background round: cache reads, backing writes, `write_batch` calls and
/// flushes.
struct Round {
    cache_reads: u64,
    writes: u64,
    write_batches: u64,
    flushes: u64,
}

#[test]
fn the_pre_cleaner_ahead_of_the_writers_writes_back_gently() {
    // The horizon is a quarter of the log here (256 blocks: everything was written within
    // the last second). 160 blocks free (less a read's admissions): more than half of it
    // ahead of the writers.
    let by_horizon =
        VolumeOptions { sequential_bypass_bytes: 0, gentle_pace_by_horizon: true, ..VolumeOptions::default() };
    let (volume, r) = one_preclean_round(160, by_horizon);
    let s = volume.status();
    let written = 192 - s.dirty_blocks;
    assert!(written >= 96 && r.flushes > 0, "the round wrote back {written} blocks");
    assert!(s.counters.gentle_write_back_batches > 0, "{:?}", s.counters);
    assert_eq!(r.writes, written, "one backing write per block (none adjacent)");
    // 32 slots per read at most (the records' headers lie between the blocks); 4 writes in
    // flight at most.
    assert!(r.cache_reads >= written.div_ceil(32), "{} cache reads for {written} blocks", r.cache_reads);
    assert!(r.write_batches >= written.div_ceil(4), "{} write batches for {written} scattered blocks", r.write_batches);

    // 80 blocks free: the writers are within half the horizon, the batch runs at full pace.
    let (volume, r) = one_preclean_round(80, by_horizon);
    let s = volume.status();
    let written = 192 - s.dirty_blocks;
    assert!(written >= 96 && r.flushes > 0, "the round wrote back {written} blocks");
    assert_eq!(s.counters.gentle_write_back_batches, 0, "{:?}", s.counters);
    assert_eq!(r.writes, written);
    assert!(r.cache_reads <= r.flushes, "{} cache reads in {} batches: one per batch", r.cache_reads, r.flushes);
    assert_eq!(r.write_batches, r.flushes, "every write of a batch in flight together");

    // The shipped rule measures the writers' pace over the last second: these writers wrote
    // the whole log within milliseconds, so with 160 blocks free the writers are within half
    // a second of what the pre-cleaner has not judged, and it runs at full pace.
    let shipped = VolumeOptions { sequential_bypass_bytes: 0, ..VolumeOptions::default() };
    let (volume, r) = one_preclean_round(160, shipped);
    assert!(r.flushes > 0, "the round wrote nothing back");
    assert_eq!(volume.status().counters.gentle_write_back_batches, 0, "gentle ahead of a fast writer");
    assert_eq!(r.write_batches, r.flushes);
    // A second later the writers have written nothing lately: the horizon is its floor (4
    // segments, 64 blocks), 60 free blocks are short of it, and more than half of it lies
    // ahead of the writers: gentle.
    let (volume, r) = one_preclean_round_after(60, shipped, std::time::Duration::from_millis(1100));
    let written = 192 - volume.status().dirty_blocks;
    assert!(written > 0 && r.flushes > 0, "the round wrote nothing back");
    assert!(volume.status().counters.gentle_write_back_batches > 0, "full pace with the writers idle");
    assert!(r.write_batches >= written.div_ceil(4), "{} write batches for {written} scattered blocks", r.write_batches);
}

#[test]
fn a_writer_that_must_write_back_does_it_in_batches() {
    let (_cache, backing, volume) = volume();
    // A log whose first 600 blocks are dirty (59 %), then clean data to the end: nothing
    // pre-cleaned (no background rounds), so the writer must write back the head itself.
    write_run(&volume, 0, 600, 1);
    admit_until(&volume, 1024, LOG_BLOCKS - 40);
    let b0 = backing.stats();
    let reclaimed0 = volume.status().counters.reclaimed_blocks;
    write_run(&volume, 2048, 400, 2);
    let (_, writes, flushes) = delta(backing.stats(), b0);
    let segments = (volume.status().counters.reclaimed_blocks - reclaimed0) / SEGMENT;
    assert!(writes > 0, "the writer never had to write back");
    // Each write-back batch covers its window and the 4 segments after it.
    assert!(
        flushes * 4 <= segments + 4,
        "{flushes} backing flushes to reclaim {segments} segments of dirty data: one per segment"
    );
    let mut one = vec![0u8; BS];
    for b in (0..600).chain(2048..2448) {
        volume.read(b * BS as u64, &mut one).unwrap();
        assert_eq!(one, stamp(b, if b < 600 { 1 } else { 2 }), "block {b}");
    }
}

#[test]
fn a_write_back_reads_the_log_through_small_gaps_in_one_io() {
    let (cache, backing, volume) = volume();
    // 288 dirty blocks in nine records (a FLUSH after each 32, so a header between records),
    // then every fourth of them rewritten: the first stretch of the log holds the batch's
    // blocks with a stale slot or a header between every few.
    write_run(&volume, 0, 288, 1);
    for b in (0..288).step_by(4) {
        volume.write(b * BS as u64, &stamp(b, 2)).unwrap();
    }
    volume.flush().unwrap();
    let c0 = cache.stats();
    assert_eq!(volume.destage_step(4096).unwrap(), 288);
    let (reads, _, _) = delta(cache.stats(), c0);
    // One scatter read for the first stretch (216 blocks, 81 slots skipped), one for the
    // rewritten 72 blocks; one per run of consecutive slots would be about a hundred.
    assert!(reads <= 2, "writing back 288 dirty blocks took {reads} cache reads");
    let mut one = vec![0u8; BS];
    for b in 0..288 {
        backing.read_at(b * BS as u64, &mut one).unwrap();
        assert_eq!(one, stamp(b, if b % 4 == 0 { 2 } else { 1 }), "block {b} on the backing device");
    }
    assert_eq!(volume.status().dirty_blocks, 0);
}

#[test]
fn a_write_back_issues_its_scattered_runs_together() {
    let (_cache, backing, volume) = volume();
    // 100 dirty blocks two apart: 100 runs of one block each on the backing device.
    for b in (0..200).step_by(2) {
        volume.write(b * BS as u64, &stamp(b, 1)).unwrap();
    }
    volume.flush().unwrap();
    let b0 = backing.stats();
    assert_eq!(volume.destage_step(4096).unwrap(), 100);
    let b1 = backing.stats();
    assert_eq!(b1.writes - b0.writes, 100, "one backing write per run");
    assert_eq!(b1.write_batches - b0.write_batches, 1, "the runs issued one after another, not together");
    let mut one = vec![0u8; BS];
    for b in 0..200 {
        backing.read_at(b * BS as u64, &mut one).unwrap();
        assert_eq!(one, stamp(b, if b % 2 == 0 { 1 } else { 0 }), "block {b} on the backing device");
    }
    assert_eq!(volume.status().dirty_blocks, 0);
}

#[test]
fn concurrent_writers_requests_land_in_consecutive_slots() {
    // Four writers at once, interleaved by the simulator's scheduler (every lock acquisition
    // is a point where another writer may run: seeded, so each seed is one interleaving).
    for seed in 0..8 {
        let (_cache, _backing, volume) = volume();
        let volume = Arc::new(volume);
        let v = Arc::clone(&volume);
        tiercache_sched::Sched::run(
            seed,
            10_000_000,
            || {},
            move |sched| {
                let writers: Vec<_> = (0..4u64)
                    .map(|w| {
                        let v = Arc::clone(&v);
                        sched.spawn(move || {
                            // 10 requests of 16 blocks each (640 blocks in all: the log holds them).
                            for r in 0..10u64 {
                                let first = (w * 10 + r) * 16;
                                v.write(first * BS as u64, &stamps(first, 16, 1)).unwrap();
                            }
                        })
                    })
                    .collect();
                for w in writers {
                    assert!(matches!(sched.join(w), tiercache_sched::Joined::Returned(())));
                }
                v.flush().unwrap();
            },
        )
        .expect("no deadlock");
        let positions: std::collections::HashMap<u64, u64> =
            volume.index_snapshot().into_iter().map(|(b, e)| (b, u64::from(e.slot))).collect();
        for request in 0..40u64 {
            let slots: Vec<u64> = (request * 16..request * 16 + 16).map(|b| positions[&b]).collect();
            // Runs of consecutive slots: one, or two where a record boundary (its header)
            // cuts the request; never interleaved block by block with other writers'.
            let runs = 1 + slots.windows(2).filter(|w| w[1] != w[0] + 1).count();
            assert!(runs <= 2, "seed {seed}: request {request} lies in {runs} runs of slots: {slots:?}");
        }
    }
}

/// The hot set's hit ratio over one pass of 4 KiB reads of blocks `0..HOT` in a scattered
/// order.
fn hot_pass_hit_ratio(volume: &Volume, hot: u64) -> f64 {
    let before = volume.status().counters;
    let mut buf = vec![0u8; BS];
    for k in 0..hot {
        let b = (k * 37) % hot;
        volume.read(b * BS as u64, &mut buf).unwrap();
    }
    let after = volume.status().counters;
    let hits = after.read_hit_blocks - before.read_hit_blocks;
    hits as f64 / (hits + after.read_miss_blocks - before.read_miss_blocks) as f64
}

#[test]
fn a_sequential_scan_leaves_the_hot_set_cached() {
    const HOT: u64 = 256;
    for bypass in [true, false] {
        let options =
            VolumeOptions { sequential_bypass_bytes: if bypass { 2 << 20 } else { 0 }, ..VolumeOptions::default() };
        let (_cache, _backing, volume) = volume_with(options);
        // The hot set: read until cached (the first pass admits it).
        hot_pass_hit_ratio(&volume, HOT);
        volume.flush().unwrap();
        let before = hot_pass_hit_ratio(&volume, HOT);
        assert!(before > 0.99, "the hot set is cached: hit ratio {before}");
        // A scan of the rest of the volume, 64 KiB at a time: 3,840 blocks through a 1,024-
        // block log.
        let mut buf = vec![0u8; 16 * BS];
        for b in (HOT..BACKING_BLOCKS).step_by(16) {
            volume.read(b * BS as u64, &mut buf).unwrap();
        }
        volume.flush().unwrap();
        let after = hot_pass_hit_ratio(&volume, HOT);
        let bypassed = volume.status().counters.bypassed_blocks_sequential;
        if bypass {
            assert!(after >= before * 0.95, "the scan pushed the hot set out: {before} -> {after}");
            // (The first 2 MiB of the scan, 512 blocks, were admitted.)
            assert_eq!(bypassed, BACKING_BLOCKS - HOT - 512);
        } else {
            assert!(after < 0.5, "without the bypass the scan evicts the hot set: {before} -> {after}");
            assert_eq!(bypassed, 0);
        }
    }
}

/// A volume on a `log_blocks`-block log over a backing device of `backing_blocks`, both on
/// one virtual clock: a fast cache, and a backing device whose every write takes 1 ms (an
/// HDD's order for scattered blocks), so a write-back's measured cost is about 1 ms a block.
/// Watermarks 10 % and 20 %: what is written dirty beyond a fifth of the log is written back.
fn slow_backing_volume(log_blocks: u64, backing_blocks: u64) -> (Arc<SimDevice>, Arc<SimDevice>, Volume) {
    let clock = tiercache_device::SimClock::new();
    let slow = tiercache_device::SimLatency { read_ns: 100_000, write_ns: 1_000_000, flush_ns: 1_000_000 };
    let (cache, backing) = devices_on_clock(SEGMENT as u32, log_blocks, backing_blocks, &clock, FAST, slow);
    let c: Arc<dyn BlockDevice> = cache.clone();
    let b: Arc<dyn BlockDevice> = backing.clone();
    let options = VolumeOptions {
        dirty_watermarks_permille: Some((100, 200)),
        sequential_bypass_bytes: 0,
        ..VolumeOptions::default()
    };
    let volume = Volume::open(c, b, Arc::new(clock), options).expect("open").0;
    (cache, backing, volume)
}

/// Writes every other block of `from..from + 2 * n` (so each is a backing write of its own),
/// in requests of one block, a FLUSH every 32.
fn write_scattered(volume: &Volume, from: u64, n: u64, version: u64) {
    for k in 0..n {
        let b = from + 2 * k;
        volume.write(b * BS as u64, &stamp(b, version)).unwrap();
        if k % 32 == 31 {
            volume.flush().unwrap();
        }
    }
    volume.flush().unwrap();
}

#[test]
fn write_back_batches_are_sized_by_the_backing_devices_measured_pace() {
    // 3,000 scattered dirty blocks over a backing device that takes 1 ms a write: the first
    // batch (untimed) takes 1,024 blocks; once timed at about 1 ms a block, a batch meant to
    // last 25 ms is held to the floor of 256 blocks (not 4,096: a 4-second batch that a
    // writer's reclaim would wait behind).
    let (_cache, backing, volume) = slow_backing_volume(4096, 8192);
    write_scattered(&volume, 0, 3000, 1);
    // Per background round: (blocks written back, batches), one backing flush per batch.
    let mut rounds: Vec<(u64, u64)> = Vec::new();
    for _ in 0..40 {
        let (flushes, dirty) = (backing.stats().flushes, volume.status().dirty_blocks);
        volume.background_tick().unwrap();
        let written = dirty - volume.status().dirty_blocks;
        if written > 0 {
            rounds.push((written, backing.stats().flushes - flushes));
        }
    }
    assert!(rounds.len() >= 2, "write-back ran over several rounds: {rounds:?}");
    // The first round: the untimed batch, then batches at the background's floor (1,024 +
    // 3 x 64).
    assert!(rounds[0].0 > 1024, "the untimed first batch is larger: {rounds:?}");
    assert!(rounds[1..].iter().all(|&(n, b)| n <= 64 * b), "timed batches at the floor: {rounds:?}");
    assert!(volume.status().dirty_blocks <= 410, "down to the low watermark");
    for b in (0..6000).step_by(2) {
        let mut one = vec![0u8; BS];
        volume.read(b * BS as u64, &mut one).unwrap();
        assert_eq!(version_of(b, &one), Some(1), "block {b}");
    }
}

#[test]
fn a_writers_reclaim_waits_for_a_batch_sized_by_time() {
    // Above the high watermark, the background thread writes back batch after batch; a
    // writer whose reclaim meets dirty blocks at the head needs the destage lock too, and
    // waits for the batch under way. Sized by its measured cost, that batch is 64 blocks at
    // 1 ms each here (the background's floor, `DESTAGE_BACKGROUND_BATCH_MIN_BLOCKS`), not the
    // 2,800 dirty blocks of the head (as many as a 4,096-block cap takes: 2.8 s), nor the
    // 256 of a writer's own reclaim batch. Measured in the volume's virtual time
    // (`reclaim_destage_wait_max_us`) over seeded interleavings.
    let mut worst_us = 0;
    let mut waited = 0;
    for seed in 0..24 {
        let (_cache, _backing, volume) = slow_backing_volume(4096, 16384);
        // The oldest dirty blocks (at the head) above the newest in address order, so that
        // the one batch timed first (the elevator's: the lowest addresses) leaves the head
        // dirty; then clean blocks fill the rest of the log: the writer's next record needs
        // reclaim, whose window at the head is dirty.
        write_scattered(&volume, 1024, 2800, 1);
        write_scattered(&volume, 0, 256, 1);
        volume.destage_step(256).unwrap();
        let mut buf = vec![0u8; 16 * BS];
        let mut b = 8192;
        while volume.status().log_tail < 4096 - 64 {
            volume.read(b * BS as u64, &mut buf).unwrap();
            b += 16;
        }
        let volume = Arc::new(volume);
        let v = Arc::clone(&volume);
        tiercache_sched::Sched::run(
            seed,
            50_000_000,
            || {},
            move |sched| {
                let bg = Arc::clone(&v);
                let background = sched.spawn(move || {
                    for _ in 0..12 {
                        bg.background_tick().unwrap();
                    }
                });
                let w = Arc::clone(&v);
                let writer = sched.spawn(move || {
                    for r in 0..4u64 {
                        let first = 12_000 + r * 64;
                        w.write(first * BS as u64, &stamps(first, 64, 2)).unwrap();
                    }
                    w.flush().unwrap();
                });
                assert!(matches!(sched.join(writer), tiercache_sched::Joined::Returned(())));
                assert!(matches!(sched.join(background), tiercache_sched::Joined::Returned(())));
            },
        )
        .expect("no deadlock");
        let counters = volume.status().counters;
        waited += u64::from(counters.reclaim_write_backs > 0);
        worst_us = worst_us.max(counters.reclaim_destage_wait_max_us);
        let mut buf = vec![0u8; 64 * BS];
        volume.read(12_000 * BS as u64, &mut buf).unwrap();
        assert_eq!(buf, stamps(12_000, 64, 2), "seed {seed}");
        for b in (1024..1024 + 5600).step_by(2) {
            let mut one = vec![0u8; BS];
            volume.read(b * BS as u64, &mut one).unwrap();
            assert_eq!(version_of(b, &one), Some(1), "seed {seed}: block {b}");
        }
    }
    assert!(waited > 4, "reclaims met dirty windows and wrote them back in {waited} of 24 runs");
    // One background batch under way (64 ms of backing writes and its flush, and the cache
    // I/O the writers meanwhile did), never two, nor one of 256 blocks.
    assert!(worst_us < 2 * 64_000, "a reclaim waited {worst_us} us for the destage lock");
}
