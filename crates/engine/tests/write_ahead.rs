//! `Volume::write_ahead`: a frontend that sees a client commit one write at a time (write,
//! FLUSH, write, FLUSH) writes the staged record right after acknowledging the write, so that
//! the record write overlaps the client's round trip and its FLUSH only flushes the cache
//! device (issue 9: a libnbd client's write + FLUSH from 0.63-0.71 of pwrite + fdatasync on a
//! raw file to 0.74-0.79). What is pinned here: it writes one record and flushes nothing; it
//! waits for nothing (a record in flight, nothing staged but clean admissions: no write); a
//! FLUSH after it waits for its record and makes it durable; a failed write ahead poisons
//! the volume like any failed record write.

use std::sync::Arc;
use tiercache_device::{BlockDevice, FailMode, OpKind};

mod common;
use common::holds::{finishes_within, join_within, Dev, Op};
use common::*;

/// The staged write goes out in a record of its own, with no cache flush; the FLUSH after
/// it writes nothing and flushes once, and the write is durable.
#[test]
fn a_write_ahead_writes_the_record_and_the_flush_only_flushes() {
    let (cache, backing) = devices(16, 256);
    let v = open(cache.clone(), backing.clone());
    write(&v, 10, 1);
    let before = cache.stats();
    assert!(v.write_ahead().unwrap(), "a write was staged and nothing was in flight");
    assert_eq!(delta(cache.stats(), before), (0, 1, 0), "one record write, no cache flush");
    assert_eq!(v.status().counters.records_written_ahead, 1);
    // Not durable yet: a power cut now may lose it (the contract allows either), and the
    // durable image does not have it.
    let cut = open(durable_copy(&cache), durable_copy(&backing));
    assert_eq!(read_version(&cut, 10).unwrap(), Some(0), "durable before any FLUSH");
    let before = cache.stats();
    v.flush().unwrap();
    assert_eq!(delta(cache.stats(), before), (0, 0, 1), "the FLUSH had only to flush");
    let r = open(durable_copy(&cache), durable_copy(&backing));
    assert_eq!(read_version(&r, 10).unwrap(), Some(1));
}

/// Nothing staged, or only clean blocks a read admitted: no record (a record of admissions
/// alone is no write a FLUSH waits for).
#[test]
fn no_write_ahead_without_a_staged_write() {
    let (cache, backing) = devices(16, 256);
    let v = open(cache.clone(), backing.clone());
    let before = cache.stats();
    assert!(!v.write_ahead().unwrap());
    // (The log fills first: a read miss is staged into it, clean.)
    assert_eq!(read_version(&v, 30).unwrap(), Some(0));
    assert!(v.status().staged_blocks > 0, "the miss was admitted into staging");
    assert!(!v.write_ahead().unwrap());
    assert_eq!(cache.stats().writes, before.writes, "no record written");
    assert_eq!(v.status().counters.records_written_ahead, 0);
}

/// A record write in progress: a write ahead waits for nothing and writes nothing; once the
/// log is idle again, the next one writes. Two cases: a FLUSH's record (it holds the io
/// lock), and a record a large write sealed when it filled staging (written with the io lock
/// let go, the pipeline).
#[test]
fn no_write_ahead_while_a_record_is_being_written() {
    for pipelined in [false, true] {
        let (cache, backing) = devices(64, 1024);
        let dev = Dev::new(&cache);
        let v = Arc::new(open(Arc::clone(&dev) as Arc<dyn BlockDevice>, backing.clone()));
        let held = dev.hold(|op, _, _| op == Op::Write);
        let first = if pipelined {
            // (More than a record's entries: staging fills and its record goes out.)
            on_thread(&v, |v| v.write(0, &stamps(0, 200, 1)))
        } else {
            write(&v, 10, 1);
            on_thread(&v, |v| v.flush())
        };
        dev.wait_held(held);
        write(&v, 300, 1);
        let ahead = on_thread(&v, |v| v.write_ahead());
        assert!(finishes_within(&ahead, 5), "pipelined {pipelined}: a write ahead waited for the record in flight");
        assert!(
            !join_within(ahead, 5, "write ahead").unwrap(),
            "pipelined {pipelined}: written ahead beside a record in flight"
        );
        assert_eq!(v.status().counters.records_written_ahead, 0);
        dev.release(held);
        join_within(first, 30, "the first request").unwrap();
        assert!(v.write_ahead().unwrap(), "pipelined {pipelined}: the log is idle again");
        v.flush().unwrap();
        let r = open(durable_copy(&cache), durable_copy(&backing));
        assert_eq!(read_version(&r, 300).unwrap(), Some(1), "pipelined {pipelined}");
    }
}

/// The write ahead's record write is held: a FLUSH of that write must not return before it
/// ends (it waits for record writes in progress), and covers it once it has.
#[test]
fn a_flush_waits_for_the_record_written_ahead() {
    let (cache, backing) = devices(16, 256);
    let dev = Dev::new(&cache);
    let v = Arc::new(open(Arc::clone(&dev) as Arc<dyn BlockDevice>, backing.clone()));
    write(&v, 10, 1);
    let held = dev.hold(|op, _, _| op == Op::Write);
    let ahead = on_thread(&v, |v| v.write_ahead());
    dev.wait_held(held);
    let flush = on_thread(&v, |v| v.flush());
    assert!(!finishes_within(&flush, 1), "the FLUSH returned before the record written ahead was written");
    dev.release(held);
    assert!(join_within(ahead, 30, "write ahead").unwrap());
    join_within(flush, 30, "FLUSH").unwrap();
    let c = v.status().counters;
    assert_eq!((c.records_written_ahead, c.records_written), (1, 1), "{c:?}");
    let r = open(durable_copy(&cache), durable_copy(&backing));
    assert_eq!(read_version(&r, 10).unwrap(), Some(1));
}

/// The record written ahead fails: the call reports it, the volume is poisoned, and no FLUSH
/// acknowledges the write afterwards (no retried fsync).
#[test]
fn a_failed_write_ahead_poisons_the_volume() {
    let (cache, backing) = devices(16, 256);
    let v = open(cache.clone(), backing.clone());
    write(&v, 10, 1);
    cache.fail_after(Some(OpKind::Write), 0, FailMode::Once);
    assert!(v.write_ahead().is_err());
    assert!(v.flush().is_err(), "a FLUSH succeeded after the record holding its write failed");
    assert!(v.write(20 * 4096, &stamp(20, 1)).is_err() || v.flush().is_err());
}
