//! Adversarial review of f500dc5 ("NBD write ahead": `Volume::write_ahead`, which seals
//! staging and writes its record right after a write was acknowledged, without a cache flush,
//! where that waits for nothing). Each test is one suspicion, made deterministic by holding
//! chosen I/Os (`common::holds::Dev`), by seeded power cuts (`SimDevice::crash`) or by a
//! countdown of device failures; the comment above each says whether it held (CONFIRMED) or
//! was refuted. Every wait is bounded.
//!
//! Results (on f500dc5): one test failed,
//! `write_ahead_and_flush_alone_take_the_checkpoints_that_fall_due` (CONFIRMED: with no
//! background thread, a workload of write, write ahead, FLUSH never checkpointed until reclaim
//! forced one, so the replay window grew to the whole log; `serve` runs a background thread,
//! whose tick takes the checkpoint, so the shipped server was not affected). Fixed since:
//! `write_ahead` takes a checkpoint it makes due, as a pipelined commit does. The others pass;
//! two of them are controls (a sabotaged engine, which their checks must catch), and one pins
//! a cost seen on the way (`a_flush_waiting_at_the_gate_drains_a_write_ahead_beside_it`: a
//! FLUSH covered by the cache flush under way still waits for an unrelated record written
//! ahead meanwhile, one record write, as behind any record in the pipeline).
//!
//! Blocks used: 40 and up (the backing device's fingerprint blocks are 0, 1, 16 and the last).
//! Versions: 0 is the backing device's initial content.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::sync::Arc;
use tiercache_device::{FailMode, MonotonicClock, OpKind, SimDevice};
use tiercache_engine::{Sabotage, Volume, VolumeOptions};

mod common;
use common::holds::*;
use common::*;

/// The default checkpoint interval (`CHECKPOINT_INTERVAL_PERMILLE`), in per mille of the log.
const CHECKPOINT_PERMILLE: u64 = 250;

// ------------------------------------------------------------------------------------------
// 1. Write ahead against FLUSH: the flush gate, the target, poisoning.

// Suspicion: a write ahead runs while another FLUSH's cache flush is under way (the io lock is
// free then, the flush gate held). It seals the next write into a record and bumps `sealed`.
// A FLUSH begun after that write must not count the record as covered by the cache flush
// under way (`flushing_sealed`), nor as durable (`durable_sealed`): it must wait for the gate
// and then issue a cache flush of its own. Refuted (passes): its target counts the record the
// write ahead sealed, above what the flush under way covers.
#[test]
fn a_write_ahead_during_another_flushs_cache_flush_is_covered_only_by_a_later_one() {
    let (dev, cache, backing, v) = held_volume(256);
    write(&v, 40, 1);
    // FLUSH A: its record written, its cache flush held (the io lock let go).
    let (held, a) = dev.flush_held(&v);
    write(&v, 41, 1);
    assert!(v.write_ahead().unwrap(), "the io lock is free and nothing is in flight during A's cache flush");
    let flushes = cache.stats().flushes;
    let b = on_thread(&v, |v| v.flush());
    assert!(!finishes_within(&b, 1), "FLUSH B returned while the only cache flush under way predates its write");
    // (A power cut now: B has not returned, so nothing of block 41 is owed.)
    dev.release(held);
    join_within(a, 30, "FLUSH A").unwrap();
    join_within(b, 30, "FLUSH B").unwrap();
    assert!(cache.stats().flushes >= flushes + 2, "B issued no cache flush of its own");
    let r = open(durable_copy(&cache), durable_copy(&backing));
    assert_eq!((read_version(&r, 40).unwrap(), read_version(&r, 41).unwrap()), (Some(1), Some(1)));
}

// Suspicion: the record written ahead fails while a FLUSH of its write waits for it in
// `lock_io`'s drain. The FLUSH must fail (no retried fsync), and so must every FLUSH after;
// reads must still return the write (the record stays in flight). Refuted (passes).
#[test]
fn a_flush_waiting_for_a_held_write_ahead_fails_when_that_write_fails() {
    let (dev, cache, backing, v) = held_volume(256);
    write(&v, 40, 1);
    v.flush().unwrap();
    write(&v, 41, 1);
    let held = dev.hold(|op, _, _| op == Op::Write);
    let ahead = on_thread(&v, |v| v.write_ahead());
    dev.wait_held(held);
    // The held write fails when it reaches the medium.
    cache.fail_after(Some(OpKind::Write), 0, FailMode::Once);
    let flush = on_thread(&v, |v| v.flush());
    assert!(!finishes_within(&flush, 1), "the FLUSH returned before the record holding its write ended");
    dev.release(held);
    assert!(join_within(ahead, 30, "write ahead").is_err(), "the failed record write was not reported");
    assert!(join_within(flush, 30, "FLUSH").is_err(), "a FLUSH succeeded over a failed record write");
    assert!(v.flush().is_err(), "a later FLUSH succeeded: a retried fsync");
    assert_eq!(read_version(&v, 41).unwrap(), Some(1), "the newest completed write is no longer read");
    let r = open(durable_copy(&cache), durable_copy(&backing));
    assert_eq!(read_version(&r, 40).unwrap(), Some(1), "the write a FLUSH acknowledged was lost");
}

// Suspicion: the write ahead succeeds but the FLUSH's cache flush (the only I/O left to it)
// fails: that FLUSH and every later one must fail, and writes are refused. Refuted (passes).
#[test]
fn a_failed_cache_flush_after_a_write_ahead_fails_every_later_flush() {
    let (cache, backing) = devices(16, 256);
    let v = open(cache.clone(), backing.clone());
    write(&v, 40, 1);
    assert!(v.write_ahead().unwrap());
    cache.fail_after(Some(OpKind::Flush), 0, FailMode::Once);
    assert!(v.flush().is_err());
    assert!(v.flush().is_err(), "a retried fsync");
    assert!(v.write(41 * BS as u64, &stamp(41, 1)).is_err() || v.flush().is_err());
    assert!(v.write_ahead().is_err(), "a write ahead on a poisoned volume reported no error");
}

// ------------------------------------------------------------------------------------------
// 2. What a write ahead makes wait, and what it waits for.

// Suspicion: the write ahead holds its record's write lock for the whole record write; a
// writer that fills staging meanwhile, a small writer and a reader of the block written ahead
// must not wait for it (the io lock is let go once the record is sealed). Refuted (passes):
// the large writer seals and writes its own records in the pipeline beside it, the reader is
// served from the record in flight.
#[test]
fn writers_and_readers_do_not_wait_for_a_held_record_written_ahead() {
    let (dev, cache, backing, v) = held_volume(256);
    write(&v, 40, 1);
    let held = dev.hold(|op, _, _| op == Op::Write);
    let ahead = on_thread(&v, |v| v.write_ahead());
    dev.wait_held(held);
    // A writer of 200 blocks (more than a record holds: staging fills, twice).
    let large = on_thread(&v, |v| v.write(300 * BS as u64, &stamps(300, 200, 1)));
    assert!(finishes_within(&large, 10), "a writer filling staging waited for the record written ahead");
    join_within(large, 1, "the large writer").unwrap();
    let small = on_thread(&v, |v| v.write(41 * BS as u64, &stamp(41, 1)));
    join_within(small, 10, "a small writer").unwrap();
    let read = on_thread(&v, |v| read_version(v, 40));
    assert_eq!(join_within(read, 10, "a reader of the block written ahead").unwrap(), Some(1));
    dev.release(held);
    assert!(join_within(ahead, 30, "write ahead").unwrap());
    v.flush().unwrap();
    let r = open(durable_copy(&cache), durable_copy(&backing));
    assert_eq!(read_version(&r, 40).unwrap(), Some(1));
    assert_eq!(read_version(&r, 41).unwrap(), Some(1));
    for b in 300..500 {
        assert_eq!(read_version(&r, b).unwrap(), Some(1), "block {b}");
    }
}

// Suspicion: a record handed off to the record writer and not yet begun (unclaimed, `done`
// unset) is in flight: a write ahead must not seal behind it (it would write its record while
// an older one is not even begun, and a record writer that never runs would leave it for the
// FLUSH anyway), and the FLUSH must write both. Refuted (passes): the in-flight check counts
// unclaimed records; the FLUSH's drain writes the handed-off record itself.
#[test]
fn no_write_ahead_beside_a_record_handed_off_and_not_begun() {
    let (cache, backing) = devices(256, 4096);
    let v = open(cache.clone(), backing.clone());
    // A record writer that never writes (this thread): sealed records wait unclaimed.
    v.set_record_writer(Some(std::thread::current()));
    // 130 blocks: staging's data (126 blocks) fills, its record is handed off, 4 stay staged.
    v.write(300 * BS as u64, &stamps(300, 130, 1)).unwrap();
    assert_eq!(v.status().counters.handed_off_records, 1);
    write(&v, 40, 1);
    let writes = cache.stats().writes;
    assert!(!v.write_ahead().unwrap(), "written ahead beside a record handed off and not begun");
    assert_eq!(cache.stats().writes, writes);
    v.flush().unwrap();
    v.set_record_writer(None);
    let r = open(durable_copy(&cache), durable_copy(&backing));
    assert_eq!(read_version(&r, 40).unwrap(), Some(1));
    for b in 300..430 {
        assert_eq!(read_version(&r, b).unwrap(), Some(1), "block {b}");
    }
}

// Suspicion: `shutdown` (FLUSH, then a checkpoint) while the record written ahead is held must
// wait for it and leave a log that replays nothing. Refuted (passes).
#[test]
fn shutdown_during_a_held_write_ahead_waits_and_leaves_nothing_to_replay() {
    let (dev, cache, backing, v) = held_volume(256);
    write(&v, 40, 1);
    let held = dev.hold(|op, _, _| op == Op::Write);
    let ahead = on_thread(&v, |v| v.write_ahead());
    dev.wait_held(held);
    let shutdown = on_thread(&v, |v| v.shutdown());
    assert!(!finishes_within(&shutdown, 1), "shutdown returned before the record written ahead ended");
    dev.release(held);
    assert!(join_within(ahead, 30, "write ahead").unwrap());
    join_within(shutdown, 30, "shutdown").unwrap();
    let (r, report) = try_open_report(durable_copy(&cache), durable_copy(&backing)).unwrap();
    assert_eq!(report.replayed_records, 0, "a clean shutdown left records to replay");
    assert_eq!(read_version(&r, 40).unwrap(), Some(1));
}

// ------------------------------------------------------------------------------------------
// 3. What a record written ahead carries: MarkClean and Lost entries, clean admissions, TRIM.

// Suspicion: the write ahead moves queued MarkClean entries (a write-back's) into staging and
// seals them with the write; if it dropped or reordered them, recovery would bring the
// written-back blocks back dirty. Refuted (passes).
#[test]
fn a_write_ahead_carries_the_mark_clean_entries_of_a_write_back() {
    let (cache, backing) = devices(16, 256);
    let v = open(cache.clone(), backing.clone());
    for b in 40..45 {
        write(&v, b, 1);
    }
    v.flush().unwrap();
    for _ in 0..10 {
        if dirty_blocks(&v).is_empty() {
            break;
        }
        v.destage_step(64).unwrap();
    }
    assert!(dirty_blocks(&v).is_empty(), "the write-back left {:?} dirty", dirty_blocks(&v));
    write(&v, 50, 1);
    assert!(v.write_ahead().unwrap());
    v.flush().unwrap();
    let r = open(durable_copy(&cache), durable_copy(&backing));
    assert_eq!(dirty_blocks(&r), vec![50], "the MarkClean entries did not reach the log");
    for b in (40..45).chain([50]) {
        assert_eq!(read_version(&r, b).unwrap(), Some(1), "block {b}");
    }
}

// Suspicion: with no room at the tail, the write ahead returns without writing but leaves the
// metadata it moved into staging there, a loss among it (`Logged::Staged`). The FLUSH that
// follows must reclaim first; reclaim must still log that loss itself (the head may pass the
// lost copy before the staged record is written), or a power cut after the FLUSH would replay
// the rotten copy's block as readable, or forget the loss. The write ahead must not wait for
// the reclaim either. Refuted (passes).
#[test]
fn a_write_ahead_with_no_room_leaves_a_staged_loss_that_the_flush_logs() {
    let (cache, backing) = devices(16, 256); // a 128-block log: 16-entry records, reserve 5
    let v = Arc::new(open(cache.clone(), backing.clone()));
    write(&v, 60, 1);
    v.flush().unwrap();
    // Records of one block until the tail is 111 blocks past the head (a reclaim comes only
    // past 121): a record of up to 12 blocks then finds no room without one.
    let mut k = 0;
    loop {
        let (head, _, tail) = v.log_window();
        if tail - head >= 111 {
            break;
        }
        k += 1;
        write(&v, 70 + k % 20, k);
        v.flush().unwrap();
    }
    assert_eq!(v.log_window().0, 0, "no reclaim yet");
    // Block 60's only copy rots: a read declares it lost (not yet logged).
    corrupt_cached_block(&cache, &v, 60);
    assert!(is_lost(&read_version(&v, 60), 60));
    let (head, _, tail) = v.log_window();
    let n = 123 - (tail - head); // 1 + n + 5 > head + 128 - tail
    assert!((1..=12).contains(&n), "{n} blocks");
    v.write(100 * BS as u64, &stamps(100, n, 1)).unwrap();
    let ahead = on_thread(&v, |v| v.write_ahead());
    assert!(!join_within(ahead, 10, "a write ahead with no room").unwrap(), "written ahead with no room");
    v.flush().unwrap();
    assert!(v.log_window().0 > 0, "the FLUSH reclaimed");
    let r = open(durable_copy(&cache), durable_copy(&backing));
    assert!(is_lost(&read_version(&r, 60), 60), "the loss was forgotten: {:?}", read_version(&r, 60));
    for b in 100..100 + n {
        assert_eq!(read_version(&r, b).unwrap(), Some(1), "block {b}");
    }
}

// Suspicion: a record written ahead holds a write and a clean admission; a TRIM of the
// admitted block while the record is held must drop the clean copy from it (it may not enter
// the index when the write ends), keep the dirty one, and recovery must agree. Refuted
// (passes).
#[test]
fn a_trim_during_a_held_write_ahead_drops_only_its_clean_admission() {
    let (dev, cache, backing, v) = held_volume(256);
    // Block 90's miss is admitted into staging (clean), then block 91 is written.
    assert_eq!(read_version(&v, 90).unwrap(), Some(0));
    assert!(v.status().staged_blocks > 0, "the miss was admitted");
    write(&v, 91, 1);
    let held = dev.hold(|op, _, _| op == Op::Write);
    let ahead = on_thread(&v, |v| v.write_ahead());
    dev.wait_held(held);
    v.discard(90 * BS as u64, 2 * BS as u64).unwrap();
    dev.release(held);
    assert!(join_within(ahead, 30, "write ahead").unwrap());
    assert!(slot_of(&v, 90).is_none(), "the trimmed clean copy entered the index");
    assert_eq!(slot_of(&v, 91).map(|s| s.1), Some(true), "the write is not cached dirty");
    assert_eq!((read_version(&v, 90).unwrap(), read_version(&v, 91).unwrap()), (Some(0), Some(1)));
    v.flush().unwrap();
    let r = open(durable_copy(&cache), durable_copy(&backing));
    assert_eq!((read_version(&r, 90).unwrap(), read_version(&r, 91).unwrap()), (Some(0), Some(1)));
}

// ------------------------------------------------------------------------------------------
// 4. Write-arounds.

// Suspicion: a rewrite of a block written around carries its Trim in the same record
// (`trim_with_data`); the write ahead seals that record before any backing flush has settled
// the write-around. A FLUSH after it must still settle the write-around and Trim the other
// block; a power cut before the FLUSH may lose either write, never bring back something older
// than the last FLUSH. Refuted (passes).
#[test]
fn a_write_ahead_of_a_rewrite_carrying_a_write_arounds_trim() {
    let (cache, backing) = wa_devices(32, 256);
    let v = open_wa(cache.clone(), backing.clone());
    dirty_durable(&v, 40, 2, 1);
    write_n(&v, 40, 2, 2).unwrap();
    assert_eq!(around(&v), 2, "blocks 40..42 went around");
    write(&v, 40, 3);
    assert!(v.write_ahead().unwrap());
    // A power cut before the FLUSH: versions 1 (flushed) to the newest written.
    let cut = crash_and_recover(&cache, &backing);
    let (x, y) = (ver(&cut, 40), ver(&cut, 41));
    assert!((1..=3).contains(&x) && (1..=2).contains(&y), "before the FLUSH: {x} {y}");
    drop(cut);
    v.flush().unwrap();
    assert_eq!(vers(&v, 40..42), [3, 2]);
    let r = crash_and_recover(&cache, &backing);
    assert_eq!(vers(&r, 40..42), [3, 2], "after the FLUSH and a power cut");
}

// Suspicion: a write-around of blocks 50..52 is under way when block 50 is rewritten through
// the cache and that rewrite written ahead. When the write-around ends, the rewrite's record
// is either still in flight (the rewrite wins: no Trim owed) or already written and in the
// index (the write-around wins: its copy leaves the index and a Trim is owed). Before the
// write ahead, a one-block rewrite stayed staged until a FLUSH or a full staging; now the
// second order is the common one. Either order may win (the writes overlapped), but what
// reads return must be what a power cut after the next FLUSH recovers. Refuted (passes).
#[test]
fn a_write_around_ending_beside_a_record_written_ahead_agrees_with_recovery() {
    for in_flight_at_the_end in [true, false] {
        let (live, recovered) = around_beside_write_ahead(in_flight_at_the_end, wa_options());
        assert_eq!(recovered, live, "record in flight at the end {in_flight_at_the_end}: reads then recovery");
    }
}

// The control of the test above: with a settle that skips the backing flush
// (`Sabotage::WriteAroundSkipsBackingFlush`), the record written before the write-around ended
// has its Trim flushed over written-around data a power cut drops, and the check sees it.
#[test]
fn the_write_around_check_catches_a_settle_that_skips_the_backing_flush() {
    let options = VolumeOptions { sabotage: Sabotage::WriteAroundSkipsBackingFlush, ..wa_options() };
    let (live, recovered) = around_beside_write_ahead(false, options);
    assert_ne!(recovered, live, "the sabotage went unseen");
}

/// Blocks 50..52 written around (version 2) while block 50, dirty and durable at version 1, is
/// rewritten through the cache (version 3) and written ahead; the record written ahead is
/// still in flight when the write-around ends (`in_flight_at_the_end`) or already in the
/// index. Returns what reads return after the next FLUSH, and after a power cut then.
fn around_beside_write_ahead(in_flight_at_the_end: bool, options: VolumeOptions) -> (Vec<u64>, Vec<u64>) {
    let (cache, backing) = wa_devices(32, 256);
    let (cdev, bdev) = (Dev::new(&cache), Dev::new(&backing));
    let v = Arc::new(Volume::open(cdev.clone(), bdev.clone(), Arc::new(MonotonicClock::new()), options).unwrap().0);
    dirty_durable(&v, 50, 1, 1);
    let around_write = bdev.hold(|op, _, _| op == Op::Write);
    let wa = on_thread(&v, |v| write_n(v, 50, 2, 2));
    bdev.wait_held(around_write);
    write(&v, 50, 3);
    let record = in_flight_at_the_end.then(|| cdev.hold(|op, _, _| op == Op::Write));
    let ahead = on_thread(&v, |v| v.write_ahead());
    match record {
        Some(record) => cdev.wait_held(record),
        None => wait_until("the record written ahead", || ahead.is_finished()),
    }
    bdev.release(around_write);
    join_within(wa, 30, "the write-around").unwrap();
    if let Some(record) = record {
        cdev.release(record);
    }
    assert!(join_within(ahead, 30, "write ahead").unwrap());
    assert_eq!(around(&v), 2, "blocks 50..52 went around");
    let live = vers(&v, 50..52);
    v.flush().unwrap();
    assert_eq!(vers(&v, 50..52), live, "the FLUSH changed what reads return");
    let c = Arc::new(SimDevice::from_image(cache.durable_image(), BS as u32).with_name("cache"));
    let b = Arc::new(atomic_backing(backing.durable_image()));
    let r = Volume::open(c, b, Arc::new(MonotonicClock::new()), wa_options()).unwrap().0;
    let recovered = (50..52).map(|b| read_version(&r, b).unwrap().unwrap_or(u64::MAX)).collect();
    (live, recovered)
}

// ------------------------------------------------------------------------------------------
// 5. Checkpoints and the log under a pure write-ahead workload.

// Suspicion: `write_ahead` leaves the checkpoint its record makes due "to the next FLUSH or
// commit (`write_out`)". But a FLUSH after a write ahead finds nothing staged, and
// `write_out` returns before its checkpoint check when it seals nothing. With no background
// thread, a client that commits one write at a time (write, write ahead, FLUSH) then never
// checkpoints until reclaim needs the head to pass the checkpoint: the replay window, which
// checkpoints every quarter of the log bound (docs/format.md 7.1), grows to the whole log.
// The same workload without the write ahead keeps it within a quarter (checked first, so the
// test measures only the write ahead).
//
// CONFIRMED (failed on f500dc5):
//   with write ahead: the log from the checkpoint to the tail reached 80 blocks (a checkpoint
//   is due past 32)
// (The shipped server runs a background thread, whose tick takes due checkpoints; the library
// API and the doc comment promised more.) Fixed: `write_ahead` takes the checkpoint it makes
// due after its record, as the pipelined commit does.
#[test]
fn write_ahead_and_flush_alone_take_the_checkpoints_that_fall_due() {
    let log_blocks = 128;
    let interval = log_blocks * CHECKPOINT_PERMILLE / 1000;
    for ahead in [false, true] {
        let what = if ahead { "with write ahead" } else { "without write ahead" };
        let (cache, backing) = devices(16, 256);
        let v = open(cache.clone(), backing.clone());
        let mut window_max = 0;
        // 40 commits of one block: 80 blocks, no reclaim (a 128-block log, reserve 5).
        for k in 0..40 {
            write(&v, 40 + k % 8, k + 1);
            if ahead {
                assert!(v.write_ahead().unwrap(), "{what}: commit {k}");
            }
            v.flush().unwrap();
            let (head, checkpoint, tail) = v.log_window();
            assert_eq!(head, 0, "{what}: no reclaim");
            window_max = window_max.max(tail - checkpoint);
        }
        assert!(
            window_max <= interval + 2,
            "{what}: the log from the checkpoint to the tail reached {window_max} blocks (a checkpoint is due past {interval})"
        );
    }
}

// Suspicion: a pure write-ahead workload over several laps of the log (the write ahead never
// reclaims, the FLUSH after it does when it must) breaks the log's invariants: the tail runs
// into reclaim's reserve, or the head passes the checkpoint (both asserted by the engine, a
// panic here), or data is lost across laps. Refuted (passes).
#[test]
fn laps_of_commits_written_ahead_keep_the_log_sound() {
    let (cache, backing) = devices(16, 256);
    let v = open(cache.clone(), backing.clone());
    let mut model = Model::new();
    let mut written_ahead = 0;
    for k in 0..400u64 {
        let b = 40 + (k * 7) % 24;
        write(&v, b, k + 1);
        written_ahead += u64::from(v.write_ahead().unwrap());
        v.flush().unwrap();
        model.insert(b, k + 1);
        let (head, checkpoint, tail) = v.log_window();
        assert!(
            head <= checkpoint && checkpoint <= tail,
            "commit {k}: head {head} checkpoint {checkpoint} tail {tail}"
        );
        assert!(tail + 5 <= head + 128, "commit {k}: the tail ran into the reserve: head {head} tail {tail}");
    }
    assert!(v.log_window().2 > 4 * 128, "four laps");
    assert!(written_ahead > 300, "{written_ahead} records written ahead of 400");
    check_model(&v, &model, "live");
    let r = open(durable_copy(&cache), durable_copy(&backing));
    check_model(&r, &model, "after a power cut");
}

// ------------------------------------------------------------------------------------------
// 6. Power cuts and failing devices.

/// A seeded workload of one-block writes to blocks 40..56, most written ahead, most followed
/// by a FLUSH, over several laps of a 128-block log; stops at the first error. Returns the
/// versions last acknowledged by a FLUSH, the versions last written, and the writes since the
/// last FLUSH that returned, in order.
#[allow(clippy::type_complexity)]
fn commits_written_ahead(v: &Volume, rng: &mut ChaCha8Rng, steps: u64) -> ([u64; 16], [u64; 16], Vec<(u64, u64)>) {
    let (mut durable, mut written) = ([0u64; 16], [0u64; 16]);
    let mut since = Vec::new();
    for _ in 0..steps {
        let i = rng.gen_range(0..16usize);
        let version = written[i] + 1;
        if v.write((40 + i as u64) * BS as u64, &stamp(40 + i as u64, version)).is_err() {
            break;
        }
        written[i] = version;
        since.push((i as u64, version));
        if rng.gen_bool(0.8) {
            let _ = v.write_ahead();
        }
        if rng.gen_bool(0.6) {
            if v.flush().is_err() {
                break;
            }
            durable = written;
            since.clear();
        }
    }
    (durable, written, since)
}

/// After a power cut: whether each block reads a version between its last flushed and its
/// last written one, and the writes since the last FLUSH that survived are a prefix of them
/// (the violation, if not).
fn prefix_violation(r: &Volume, durable: &[u64; 16], written: &[u64; 16], since: &[(u64, u64)]) -> Option<String> {
    let mut got = [0u64; 16];
    for i in 0..16 {
        let b = 40 + i as u64;
        let x = match read_version(r, b) {
            Ok(Some(x)) => x,
            other => return Some(format!("block {b} read {other:?}")),
        };
        if x < durable[i] || x > written[i] {
            return Some(format!("block {b} reads {x}, flushed {}, written {}", durable[i], written[i]));
        }
        got[i] = x;
    }
    let survived = |&(i, version): &(u64, u64)| got[i as usize] >= version;
    let cut = since.iter().position(|w| !survived(w)).unwrap_or(since.len());
    since[cut..]
        .iter()
        .find(|w| survived(w))
        .map(|w| format!("not a prefix: write {w:?} survived, write {:?} before it did not", since[cut]))
}

/// Runs the seeded write-ahead workload of `seed` with `options`, cuts the power, cuts it
/// again during the recovery at one of its first I/Os, recovers; returns the violation (if
/// any) and how many records were written ahead.
fn power_cut_run(seed: u64, options: VolumeOptions) -> (Option<String>, u64) {
    let (cache, backing) = devices(16, 256);
    let v = Volume::open(cache.clone(), backing.clone(), Arc::new(MonotonicClock::new()), options).unwrap().0;
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let steps = rng.gen_range(40..400);
    let (durable, written, since) = commits_written_ahead(&v, &mut rng, steps);
    let written_ahead = v.status().counters.records_written_ahead;
    drop(v);
    cache.crash(seed);
    backing.crash(seed.wrapping_mul(7919));
    let k = rng.gen_range(0..30);
    let recovering = Arc::new(SimDevice::from_image(cache.durable_image(), BS as u32));
    let recovering_backing = durable_copy(&backing);
    recovering.fail_after(None, k, FailMode::Forever);
    let _ = try_open(recovering.clone(), recovering_backing.clone());
    recovering.crash(seed ^ 0x5eed);
    recovering_backing.crash(seed ^ 0xbac);
    let r = open(recovering, recovering_backing);
    let violation = prefix_violation(&r, &durable, &written, &since)
        .map(|e| format!("seed {seed}, {steps} steps, recovery cut at its I/O {k}: {e}"));
    (violation, written_ahead)
}

// Suspicion: records written ahead are written without a cache flush, one per write; a power
// cut keeps, drops or tears each pending write independently (`SimDevice::crash`). Recovery
// must keep every write a FLUSH acknowledged and a prefix of the rest, across laps of the log
// (a dropped record exposes the previous lap's record at its position), and a second power cut
// during that recovery must change nothing. Refuted (passes).
#[test]
fn power_cuts_among_records_written_ahead_recover_a_prefix() {
    let mut written_ahead = 0;
    for seed in 0..48u64 {
        let (violation, n) = power_cut_run(seed, VolumeOptions::default());
        assert!(violation.is_none(), "{}", violation.unwrap());
        written_ahead += n;
    }
    assert!(written_ahead > 1000, "only {written_ahead} records written ahead");
}

// The control of the test above: with a FLUSH that skips its cache flush
// (`Sabotage::FlushSkipsCacheFlush`), the same power cuts lose acknowledged writes, and the
// check sees it.
#[test]
fn the_power_cut_check_catches_a_flush_that_skips_the_cache_flush() {
    let options = VolumeOptions { sabotage: Sabotage::FlushSkipsCacheFlush, ..VolumeOptions::default() };
    let caught = (0..48u64).filter(|&seed| power_cut_run(seed, options).0.is_some()).count();
    assert!(caught > 0, "no seed caught the sabotage");
}

// Suspicion: the cache device fails at any one I/O of a write-ahead workload (the record
// written ahead, the FLUSH's cache flush, a reclaim's or checkpoint's I/O) and for ever after.
// No FLUSH may succeed after the failure (no retried fsync), so after a power cut every write
// acknowledged by a FLUSH reads back. Refuted (passes).
#[test]
fn a_cache_device_failing_at_any_io_of_a_write_ahead_workload_loses_no_flushed_write() {
    let ops = {
        let (cache, backing) = devices(16, 256);
        let v = open(cache.clone(), backing.clone());
        let before = cache.stats();
        let _ = commits_written_ahead(&v, &mut ChaCha8Rng::seed_from_u64(7), 250);
        let after = cache.stats();
        assert!(v.log_window().2 > 2 * 128, "two laps");
        (after.reads + after.writes + after.flushes) - (before.reads + before.writes + before.flushes)
    };
    let mut failures_seen = 0;
    for n in 0..ops {
        let (cache, backing) = devices(16, 256);
        let v = open(cache.clone(), backing.clone());
        cache.fail_after(None, n, FailMode::Forever);
        let (durable, written, since) = commits_written_ahead(&v, &mut ChaCha8Rng::seed_from_u64(7), 250);
        failures_seen += u64::from(v.status().failure.is_some());
        drop(v);
        cache.crash(n);
        backing.crash(n.wrapping_mul(7919));
        let r = open(cache, backing);
        if let Some(e) = prefix_violation(&r, &durable, &written, &since) {
            panic!("I/O {n} failed: {e}");
        }
    }
    assert!(failures_seen >= ops / 2, "the countdown should hit most I/Os ({failures_seen} of {ops})");
}

// Suspicion: the flush gate's covered path: FLUSH B, covered by FLUSH A's cache flush under
// way, waits at the gate with the io lock let go; a write ahead takes the io lock meanwhile
// and writes a record of a later write. B, once the gate opens, must neither hang nor fail.
// Refuted (passes). Observed: B, whose writes A's flush covers, still waits for that unrelated
// record's write once the gate opens (it asks for the io lock again, and `lock_io` drains the
// pipeline): one record write more, as behind any record in the pipeline; asserted so that a
// change of it is seen.
#[test]
fn a_flush_waiting_at_the_gate_drains_a_write_ahead_beside_it() {
    let (dev, _cache, _backing, v) = held_volume(256);
    write(&v, 40, 1);
    let (held, a) = dev.flush_held(&v);
    // B: covered by A (nothing new written since A sealed): waits at the gate.
    let requests = v.status().counters.flush_requests;
    let b = on_thread(&v, |v| v.flush());
    wait_until("FLUSH B began", || v.status().counters.flush_requests > requests);
    assert!(!finishes_within(&b, 1), "B returned before the cache flush covering it ended");
    write(&v, 41, 1);
    let record = dev.hold(|op, _, _| op == Op::Write);
    let ahead = on_thread(&v, |v| v.write_ahead());
    dev.wait_held(record);
    dev.release(held);
    join_within(a, 30, "FLUSH A").unwrap();
    assert!(!finishes_within(&b, 1), "B no longer waits for the record written ahead beside it");
    dev.release(record);
    assert!(join_within(ahead, 30, "write ahead").unwrap());
    join_within(b, 30, "FLUSH B").unwrap();
    v.flush().unwrap();
}
