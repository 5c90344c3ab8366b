//! The read cache's probation ring (volume/probation.rs): S3-FIFO's small queue on the cache
//! device. A miss that is no ghost waits in the ring; read twice more there, it moves into the
//! log; otherwise the ring drops it (into the ghost queue) when it laps.
//! - `a_block_read_once_waits_in_the_ring_and_two_reads_there_move_it_into_the_log`;
//! - `one_time_reads_leave_the_hot_set_alone`: laps and laps of one-time reads go through
//!   the ring, and a hot set that earned the log keeps every hit;
//! - `a_miss_of_a_block_the_ring_dropped_enters_the_log`: the ghost queue's route;
//! - `writes_trims_and_write_arounds_forget_the_ring_copy`: every change of a block's data
//!   takes its copy out of the ring, in RAM batches and on the device alike;
//! - `an_open_starts_with_the_ring_empty`: nothing in the ring is recovered, even after a
//!   power cut, and the ring's old slots are never read;
//! - `a_failed_ring_write_drops_its_batch_and_reads_stay_right`: and its blocks become ghosts,
//!   so their next miss enters the log;
//! - `a_ring_copy_gone_bad_is_read_from_the_backing_device`;
//! - `reinsert_and_fifo_leave_the_ring_unused`;
//! - `with_a_record_writer_the_reader_that_fills_a_batch_does_not_write_it`: the record
//!   writer does, and a reader writes it only when the record writer is a batch behind.

use std::sync::Arc;
use tiercache_device::{BlockDevice, FailMode, OpKind, SimDevice};
use tiercache_engine::{create, CreateOptions, Eviction, Volume, VolumeOptions, WriteAroundPolicy};
use tiercache_format::Layout;

mod common;
use common::*;

const SEGMENT: u32 = 16;
const LOG_SEGMENTS: u64 = 160; // 2,560 blocks: a ring of 256 (10 %), the log 2,304
const RING: u64 = 256;
const BATCH: u64 = 64; // PROBATION_BATCH_BLOCKS
const BACKING_BLOCKS: u64 = 65_536;

fn devices_with_ring() -> (Arc<SimDevice>, Arc<SimDevice>) {
    devices_seg(LOG_SEGMENTS, SEGMENT, BACKING_BLOCKS, CreateOptions::default())
}

fn open_with(cache: &Arc<SimDevice>, backing: &Arc<SimDevice>, options: VolumeOptions) -> Volume {
    let c: Arc<dyn BlockDevice> = cache.clone();
    let b: Arc<dyn BlockDevice> = backing.clone();
    Volume::open(c, b, Arc::new(tiercache_device::MonotonicClock::new()), options).expect("open").0
}

fn volume() -> (Arc<SimDevice>, Arc<SimDevice>, Volume) {
    let (c, b) = devices_with_ring();
    let v = open_with(&c, &b, VolumeOptions { sequential_bypass_bytes: 0, ..s3fifo() });
    (c, b, v)
}

/// The `n`-th one-time block: distinct, far from the hot set, not consecutive.
fn cold(n: u64) -> u64 {
    1_000 + (n * 7) % 60_000
}

/// Seals staging into a record (a FLUSH seals only staging holding dirty data): a write of a
/// block far from the others, then FLUSH.
fn seal(v: &Volume) {
    write(v, BACKING_BLOCKS - 1, 1);
    v.flush().unwrap();
}

fn in_log(v: &Volume, block: u64) -> bool {
    slot_of(v, block).is_some()
}

fn ring(v: &Volume) -> (u64, u64) {
    let s = v.status();
    (s.probation_blocks, s.probation_ring_blocks)
}

#[test]
fn a_block_read_once_waits_in_the_ring_and_two_reads_there_move_it_into_the_log() {
    let (_c, _b, v) = volume();
    let (_, slots) = ring(&v);
    assert_eq!(slots, RING, "the ring is 10 % of the log, in whole segments");
    assert_eq!(v.superblock().layout.log_blocks, 2560 - RING);
    read_once(&v, [7u64].into_iter());
    assert!(!in_log(&v, 7), "a miss goes to the ring, not the log");
    assert_eq!(ring(&v).0, 1);
    // Reads of it while its batch waits in RAM are hits that do not count.
    read_once(&v, [7u64, 7].into_iter());
    // Its batch fills and is written.
    read_once(&v, (0..BATCH - 1).map(cold));
    let c = v.status().counters;
    assert_eq!((c.probation_admitted_blocks, c.admitted_blocks, c.read_hit_blocks), (BATCH, BATCH, 2));
    // Two reads in the ring (the policy's 2) move it; each hit is served right.
    read_once(&v, [7u64].into_iter());
    assert!(!in_log(&v, 7), "one read again is not yet enough");
    read_once(&v, [7u64].into_iter());
    assert_eq!(v.status().counters.promoted_blocks, 1);
    assert_eq!(ring(&v).0, BATCH - 1, "it left the ring");
    seal(&v);
    assert!(in_log(&v, 7), "read again in the ring: into the log");
    read_once(&v, [7u64].into_iter());
}

#[test]
fn one_time_reads_leave_the_hot_set_alone() {
    let (_c, _b, v) = volume();
    let hot: Vec<u64> = (0..3 * BATCH).collect();
    // The hot set earns the log, 64 blocks (a batch) at a time: missed (the batch fills and
    // is written to the ring), then read twice in the ring.
    for group in hot.chunks(BATCH as usize) {
        read_once(&v, group.iter().copied());
        read_once(&v, group.iter().copied());
        read_once(&v, group.iter().copied());
    }
    seal(&v);
    assert_eq!(v.status().counters.promoted_blocks, hot.len() as u64);
    let hot_in_log = hot.iter().filter(|&&b| in_log(&v, b)).count();
    assert_eq!(hot_in_log, hot.len(), "the hot set moved into the log");
    // Six laps of the whole cache of one-time reads (each through the ring), the hot set read
    // between them: every read of it hits.
    let mut next = 10_000;
    for lap in 0..6 {
        read_once(&v, (next..next + 2560).map(cold));
        next += 2560;
        let before = v.status().counters.read_hit_blocks;
        read_once(&v, hot.iter().copied());
        let got = v.status().counters.read_hit_blocks - before;
        assert_eq!(got, hot.len() as u64, "lap {lap}: the hot set lost hits to one-time reads");
    }
    let c = v.status().counters;
    assert!(c.probation_evicted_blocks > 5 * 2560, "the one-time reads left through the ring: {c:?}");
    // (The log never filled: nothing read once entered it, so reclaim had nothing to do.)
    assert_eq!(v.status().cached_blocks, hot.len() as u64 + 1, "nothing read once entered the log");
}

#[test]
fn a_miss_of_a_block_the_ring_dropped_enters_the_log() {
    let (_c, _b, v) = volume();
    read_once(&v, [5u64].into_iter());
    // Two laps of the ring of one-time reads: 5 is dropped, unread, into the ghost queue.
    read_once(&v, (0..2 * RING).map(cold));
    assert!(ring(&v).0 <= RING + BATCH);
    let c = v.status().counters;
    assert!(c.probation_evicted_blocks >= RING, "{c:?}");
    assert!(!in_log(&v, 5));
    let before = v.status().counters.read_miss_blocks;
    read_once(&v, [5u64].into_iter());
    assert_eq!(v.status().counters.read_miss_blocks, before + 1, "it was dropped: a miss");
    seal(&v);
    assert!(in_log(&v, 5), "a ghost's miss enters the log, not the ring");
}

#[test]
fn writes_trims_and_write_arounds_forget_the_ring_copy() {
    // (Write-around needs a backing device that never tears a block.)
    let log_blocks = LOG_SEGMENTS * u64::from(SEGMENT);
    let ck = Layout::checkpoint_blocks_for(log_blocks, BS as u32);
    let cache = Arc::new(SimDevice::new((2 + 2 * ck + log_blocks) * BS as u64, BS as u32));
    let backing = Arc::new(SimDevice::from_image(stamps(0, BACKING_BLOCKS, 0), BS as u32).with_atomic_write(BS as u32));
    create(&*cache, &*backing, &CreateOptions { segment_blocks: SEGMENT, ..CreateOptions::default() }).unwrap();
    let around = WriteAroundPolicy { min_bytes: 2 * BS as u64, only_when_destage_bound: false };
    let v = open_with(&cache, &backing, VolumeOptions { sequential_bypass_bytes: 0, write_around: around, ..s3fifo() });
    // Blocks 200..208 in a RAM batch, 300..308 written to the ring (a full batch after them).
    read_once(&v, 300..308);
    read_once(&v, (0..BATCH - 8).map(cold));
    read_once(&v, 200..208);
    assert_eq!(v.status().counters.probation_admitted_blocks, BATCH + 8);
    // A write: the new data reads back, for one block of each.
    write(&v, 200, 1);
    write(&v, 300, 1);
    assert_eq!(read_version(&v, 200).unwrap(), Some(1));
    assert_eq!(read_version(&v, 300).unwrap(), Some(1));
    // A write-around of 4 blocks (straight to the backing device): the ring's copies of
    // 201..205 and 301..305 hold the old data and must not be served.
    v.write(201 * BS as u64, &stamps(201, 4, 2)).unwrap();
    v.write(301 * BS as u64, &stamps(301, 4, 2)).unwrap();
    assert_eq!(v.status().counters.written_around_blocks, 8, "{:?}", v.status().counters);
    for b in (201..205).chain(301..305) {
        assert_eq!(read_version(&v, b).unwrap(), Some(2), "block {b} after its write-around");
    }
    // A TRIM of the rest, then the backing device changes under them (as a discard passed
    // down, or a restore onto the backing device while nothing caches them, would): a read
    // must see the backing device's data, not the ring's.
    v.discard(205 * BS as u64, 3 * BS as u64).unwrap();
    v.discard(305 * BS as u64, 3 * BS as u64).unwrap();
    for b in (205..208).chain(305..308) {
        backing.write_at(b * BS as u64, &stamp(b, 3)).unwrap();
        assert_eq!(read_version(&v, b).unwrap(), Some(3), "block {b} after its trim");
    }
    assert_eq!(v.status().probation_blocks, BATCH - 8, "only the one-time blocks are left in the ring");
}

#[test]
fn an_open_starts_with_the_ring_empty() {
    let (c, b, v) = volume();
    // (Past the backing device's fingerprint blocks, which open checks.)
    read_once(&v, 100..100 + 2 * BATCH); // two batches written to the ring
    assert!(ring(&v).0 >= 2 * BATCH);
    seal(&v);
    let image = c.durable_image();
    drop(v);
    // The backing device changes while the volume is down (the ring's copies are now stale,
    // as after a failover that wrote the backing device): nothing of the ring may be served.
    for blk in 100..100 + 2 * BATCH {
        b.write_at(blk * BS as u64, &stamp(blk, 5)).unwrap();
    }
    let v = open_with(&Arc::new(SimDevice::from_image(image, BS as u32)), &b, s3fifo());
    assert_eq!(ring(&v).0, 0, "the ring starts empty");
    for blk in 100..100 + 2 * BATCH {
        assert_eq!(read_version(&v, blk).unwrap(), Some(5), "block {blk}");
    }
}

#[test]
fn a_failed_ring_write_drops_its_batch_and_reads_stay_right() {
    let (c, _b, v) = volume();
    // The next cache write, the ring's first batch, fails.
    c.fail_after(Some(OpKind::Write), 0, FailMode::Once);
    read_once(&v, 0..BATCH);
    let s = v.status();
    assert_eq!(s.probation_blocks, 0, "the failed batch was dropped: {s:?}");
    assert!(s.failure.is_none(), "a failed ring write fails nothing: {s:?}");
    // Its blocks became ghosts: they miss again (the right data) and enter the log, so a ring
    // that cannot be written does not stop read caching.
    read_once(&v, 0..BATCH);
    let s = v.status();
    assert_eq!((s.staged_blocks, s.probation_blocks, s.counters.read_miss_blocks), (BATCH, 0, 2 * BATCH), "{s:?}");
    read_once(&v, 0..BATCH);
    assert_eq!(v.status().counters.read_hit_blocks, BATCH);
}

#[test]
fn a_ring_copy_gone_bad_is_read_from_the_backing_device() {
    let (c, _b, v) = volume();
    read_once(&v, 0..BATCH); // one batch, written to ring positions 0..BATCH
    let layout = v.superblock().layout;
    let at = layout.probation_block(3).unwrap() * BS as u64;
    c.write_at(at, &vec![0xEE; BS]).unwrap();
    let misses = v.status().counters.read_miss_blocks;
    read_once(&v, 0..BATCH); // (read_once checks each block's data)
    assert_eq!(v.status().counters.read_miss_blocks, misses, "the bad copy was a hit, re-read from the backing device");
    let s = v.status();
    assert_eq!((s.counters.repaired_blocks, s.probation_blocks), (1, BATCH - 1), "and forgotten: {s:?}");
}

#[test]
fn reinsert_and_fifo_leave_the_ring_unused() {
    for eviction in [Eviction::Reinsert, Eviction::Fifo] {
        let (c, b) = devices_with_ring();
        let v = open_with(&c, &b, VolumeOptions { sequential_bypass_bytes: 0, eviction, ..s3fifo() });
        read_once(&v, 0..200);
        v.flush().unwrap();
        assert_eq!(ring(&v), (0, 0), "{eviction:?}");
        assert!(in_log(&v, 0), "{eviction:?}: misses enter the log");
    }
}

#[test]
fn with_a_record_writer_the_reader_that_fills_a_batch_does_not_write_it() {
    let (c, _b, v) = volume();
    // (This thread stands for the record writer: wake-ups unpark it, and it does the record
    // writer's work by calling `write_handed_off_records`.)
    v.set_record_writer(Some(std::thread::current()));
    let writes = || c.stats().writes;
    let before = writes();
    read_once(&v, (0..BATCH).map(cold));
    assert_eq!(writes(), before, "the reader that filled the batch wrote it");
    assert_eq!(ring(&v).0, BATCH, "its blocks wait in RAM");
    // Served from RAM meanwhile.
    let hits = v.status().counters.read_hit_blocks;
    read_once(&v, (0..BATCH).map(cold));
    assert_eq!(v.status().counters.read_hit_blocks, hits + BATCH);
    // The record writer writes it: one write, and a read there is a read of the ring.
    assert_eq!(v.write_handed_off_records().unwrap(), 0, "no record was handed off");
    assert_eq!(writes(), before + 1, "one write of the whole batch");
    let reads = c.stats().reads;
    read_once(&v, [cold(0)].into_iter());
    assert_eq!(c.stats().reads, reads + 1, "read from the ring slot");
    // A batch full, and half of the slack beyond it (a batch and a largest request, 64
    // blocks, before admissions are refused) gathered while nobody took it: the reader that
    // gathers that much writes it.
    let overdue = BATCH + BATCH / 2;
    read_once(&v, (BATCH..BATCH + overdue - 1).map(cold));
    assert_eq!(writes(), before + 1, "not yet overdue");
    read_once(&v, [cold(BATCH + overdue - 1)].into_iter());
    assert_eq!(writes(), before + 2, "the record writer is behind: the reader wrote the batch");
    assert_eq!(ring(&v).0, BATCH + overdue);
    // Without a record writer, the reader that fills a batch writes it at once.
    v.set_record_writer(None);
    let next = BATCH + overdue;
    read_once(&v, (next..next + BATCH - 1).map(cold));
    assert_eq!(writes(), before + 2, "one short of a batch");
    read_once(&v, [cold(next + BATCH - 1)].into_iter());
    assert_eq!(writes(), before + 3);
    assert_eq!(v.status().counters.probation_batches_by_record_writer, 1);
    let c = v.status().counters;
    assert_eq!((c.probation_admitted_blocks, c.probation_busy_blocks), (next + BATCH, 0), "{c:?}");
}
