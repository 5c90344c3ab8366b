//! Record handoff (`volume/commit.rs`): with a record writer registered, a writer that fills
//! staging seals it and goes on; the record writer thread writes the record. Each test pins
//! one promise: the writer does not wait for the write, the data is readable meanwhile, a
//! FLUSH (or anything that needs the log quiet) writes a record nobody has begun instead of
//! waiting for the record writer, at most one record waits for the record writer at a time,
//! a failed handed-off write fails the next FLUSH, and a power cut before the FLUSH loses only
//! what was never flushed.

mod common;

use common::*;
use std::sync::Arc;
use tiercache_device::{BlockDevice, FailMode, OpKind};
use tiercache_engine::Volume;

/// One more block than a record holds: the last one finds staging full and seals it.
const FILL: u64 = 127;

fn write_run(v: &Volume, first: u64, n: u64, version: u64) {
    v.write(first * BS as u64, &stamps(first, n, version)).unwrap();
}

/// A volume whose records are handed off to a record writer that never runs (this test's
/// own thread, which only ever calls `write_handed_off_records` when it says so).
fn handing_off(log_segments: u64) -> (Arc<tiercache_device::SimDevice>, Arc<tiercache_device::SimDevice>, Volume) {
    let (cache, backing) = devices(log_segments, 4096);
    let v = open(Arc::clone(&cache) as Arc<dyn BlockDevice>, Arc::clone(&backing) as Arc<dyn BlockDevice>);
    v.set_record_writer(Some(std::thread::current()));
    (cache, backing, v)
}

#[test]
fn a_writer_that_fills_staging_goes_on_without_writing_the_record() {
    let (cache, _backing, v) = handing_off(256);
    let before = cache.stats();
    write_run(&v, 0, FILL, 1);
    let c = v.status().counters;
    assert_eq!(c.handed_off_records, 1, "{c:?}");
    assert_eq!(c.records_written, 0, "the writer wrote its record itself");
    assert_eq!(delta(cache.stats(), before).1, 0, "the cache device was written before the record writer ran");
    // The data reads back meanwhile (from the sealed record's buffer, and from staging).
    for b in [0, 77, 125, 126] {
        assert_eq!(read_version(&v, b).unwrap(), Some(1), "block {b}");
    }
    assert_eq!(v.write_handed_off_records().unwrap(), 1);
    let c = v.status().counters;
    assert_eq!((c.records_written, c.handed_off_records_written_by_waiters), (1, 0), "{c:?}");
    assert_eq!(read_version(&v, 3).unwrap(), Some(1), "read from the cache device now");
}

#[test]
fn a_flush_writes_a_handed_off_record_nobody_began() {
    let (cache, backing, v) = handing_off(256);
    write_run(&v, 0, FILL, 1);
    // The record writer never runs: the FLUSH writes the record itself rather than wait.
    bounded("flush with the record writer asleep", 10, move || {
        v.flush().unwrap();
        let c = v.status().counters;
        assert_eq!(c.handed_off_records_written_by_waiters, 1, "{c:?}");
        assert_eq!(c.records_written, 2, "the handed-off record and the FLUSH's own");
    });
    let recovered = recover_image(cache.durable_image(), &backing);
    for b in 0..FILL {
        assert_eq!(read_version(&recovered, b).unwrap(), Some(1), "block {b}: flushed, then lost");
    }
}

#[test]
fn a_power_cut_before_the_flush_loses_only_what_was_never_flushed() {
    let (cache, backing, v) = handing_off(256);
    write_run(&v, 0, 10, 1);
    v.flush().unwrap();
    write_run(&v, 0, FILL, 2);
    // Cut before the record writer ran and before any FLUSH: version 1 of the first ten
    // blocks, and the backing device's version 0 of the rest.
    let recovered = recover_image(cache.durable_image(), &backing);
    for b in 0..10 {
        assert_eq!(read_version(&recovered, b).unwrap(), Some(1), "block {b}");
    }
    for b in 10..FILL {
        assert_eq!(read_version(&recovered, b).unwrap(), Some(0), "block {b}: never flushed, still the backing's");
    }
    // The same cut after the record writer ran: either version, each block whole.
    assert_eq!(v.write_handed_off_records().unwrap(), 1);
    let recovered = recover_image(cache.durable_image(), &backing);
    for b in 0..FILL - 1 {
        let got = read_version(&recovered, b).unwrap();
        let allowed: &[u64] = if b < 10 { &[1, 2] } else { &[0, 2] };
        assert!(got.is_some_and(|g| allowed.contains(&g)), "block {b}: {got:?}");
    }
}

#[test]
fn at_most_one_record_waits_for_the_record_writer() {
    let (cache, _backing, v) = handing_off(256);
    let before = cache.stats();
    // Three records' worth: the first is handed off; the second and third find it not
    // begun and are written by their own writer (in flight behind it: records enter the
    // index in sequence order, so none is in yet).
    write_run(&v, 0, 3 * 126 + 1, 1);
    let c = v.status().counters;
    assert_eq!(c.handed_off_records, 1, "{c:?}");
    assert_eq!(c.records_written, 0, "{c:?}");
    assert_eq!(delta(cache.stats(), before).1, 2, "the second and third records were written");
    for b in [0, 130, 300, 378] {
        assert_eq!(read_version(&v, b).unwrap(), Some(1), "block {b}");
    }
    assert_eq!(v.write_handed_off_records().unwrap(), 1);
    assert_eq!(v.status().counters.records_written, 3, "all three in the index once the first is written");
    v.flush().unwrap();
    assert_eq!(v.status().counters.handed_off_records_written_by_waiters, 0);
}

#[test]
fn a_seal_short_of_a_record_buffer_writes_the_oldest_handed_off_record() {
    let (_cache, _backing, v) = handing_off(256);
    // Many records with the record writer asleep: the pipeline's buffers run out, and the
    // writer that needs one writes the oldest record handed off rather than wait for ever.
    bounded("writes with the record writer asleep", 20, move || {
        for k in 0..12u64 {
            write_run(&v, k * 126, 126, 1);
        }
        let c = v.status().counters;
        assert!(c.records_written >= 4, "{c:?}");
        assert!(c.handed_off_records_written_by_waiters >= 1, "{c:?}");
        v.flush().unwrap();
        for b in (0..12 * 126).step_by(97) {
            assert_eq!(read_version(&v, b).unwrap(), Some(1), "block {b}");
        }
    });
}

#[test]
fn a_failed_handed_off_write_fails_the_next_flush_and_reads_still_see_the_data() {
    let (cache, _backing, v) = handing_off(256);
    write_run(&v, 0, FILL, 1);
    cache.fail_after(Some(OpKind::Write), 0, FailMode::Once);
    assert!(v.write_handed_off_records().is_err(), "the record's write failed");
    assert!(v.flush().is_err(), "a FLUSH after a lost record write reports it");
    assert_eq!(read_version(&v, 5).unwrap(), Some(1), "the failed record's data is still served");
    assert!(v.write(0, &stamps(0, 1, 2)).is_err(), "writes refused once the volume failed");
}

#[test]
fn with_the_record_writer_gone_writers_write_their_own_records_again() {
    let (cache, backing, v) = handing_off(256);
    write_run(&v, 0, FILL, 1);
    v.set_record_writer(None);
    write_run(&v, 200, FILL, 1);
    let c = v.status().counters;
    assert_eq!(c.handed_off_records, 1, "{c:?}");
    // The second record was written by its writer; it enters the index behind the first,
    // which waits for whoever needs it written: here the FLUSH.
    assert_eq!(c.records_written, 0, "{c:?}");
    v.flush().unwrap();
    let c = v.status().counters;
    assert_eq!((c.records_written, c.handed_off_records_written_by_waiters), (3, 1), "{c:?}");
    let recovered = recover_image(cache.durable_image(), &backing);
    for b in (0..FILL).chain(200..200 + FILL) {
        assert_eq!(read_version(&recovered, b).unwrap(), Some(1), "block {b}");
    }
}

#[test]
fn the_background_record_writer_writes_what_is_handed_off() {
    let (cache, backing) = devices(256, 4096);
    let v = Arc::new(open(Arc::clone(&cache) as Arc<dyn BlockDevice>, Arc::clone(&backing) as Arc<dyn BlockDevice>));
    let bg = tiercache_engine::Background::start(&v);
    for k in 0..8u64 {
        write_run(&v, k * 126, 126, 1);
    }
    wait_until("the record writer wrote every handed-off record", || {
        let c = v.status().counters;
        c.handed_off_records >= 1 && c.records_written >= c.handed_off_records
    });
    drop(bg);
    v.flush().unwrap();
    let recovered = recover_image(cache.durable_image(), &backing);
    for b in (0..8 * 126).step_by(31) {
        assert_eq!(read_version(&recovered, b).unwrap(), Some(1), "block {b}");
    }
}

/// Reads `n` blocks from `first` in requests of 8 (small enough to be admitted), checking
/// each holds version 0.
fn read_run(v: &Volume, first: u64, n: u64) {
    let mut buf = vec![0u8; 8 * BS];
    for at in (first..first + n).step_by(8) {
        let k = (first + n - at).min(8) as usize;
        v.read(at * BS as u64, &mut buf[..k * BS]).unwrap();
        for (i, block) in buf[..k * BS].chunks(BS).enumerate() {
            assert_eq!(version_of(at + i as u64, block), Some(0), "block {}", at + i as u64);
        }
    }
}

#[test]
fn a_reader_whose_admissions_fill_staging_hands_the_record_off() {
    // (The log is filling: every miss is admitted into it, 126 data blocks to a record.)
    let (cache, _backing, v) = handing_off(256);
    let before = cache.stats();
    read_run(&v, 1000, 126);
    let c = v.status().counters;
    assert_eq!((c.handed_off_records, c.handed_off_by_readers), (1, 1), "{c:?}");
    assert_eq!(c.records_written, 0, "the reader wrote the record itself");
    assert_eq!(delta(cache.stats(), before).1, 0, "the cache device was written before the record writer ran");
    // Admission goes on into the emptied staging: nothing refused for want of room.
    read_run(&v, 2000, 64);
    let c = v.status().counters;
    assert_eq!((c.admitted_blocks, c.bypassed_blocks_busy), (190, 0), "{c:?}");
    assert_eq!(v.write_handed_off_records().unwrap(), 1);
    let hits = v.status().counters.read_hit_blocks;
    read_run(&v, 1000, 126);
    assert_eq!(v.status().counters.read_hit_blocks - hits, 126, "the admitted blocks are hits");
}

#[test]
fn a_reader_hands_off_no_second_record_while_one_waits() {
    // Without a background thread, a reader that finds staging full and a record already
    // waiting for the record writer writes out staging itself, as before handoff (the
    // handed-off record first: the log is written in order).
    let (cache, _backing, v) = handing_off(256);
    read_run(&v, 1000, 126);
    let before = cache.stats();
    read_run(&v, 2000, 126);
    let c = v.status().counters;
    assert_eq!(c.handed_off_by_readers, 1, "{c:?}");
    assert_eq!((c.records_written, c.handed_off_records_written_by_waiters), (2, 1), "{c:?}");
    assert!(delta(cache.stats(), before).1 >= 2, "both records written");
    assert_eq!(c.bypassed_blocks_busy, 0, "{c:?}");
}
