//! FLUSH lets the io lock go during its cache-device flush (issue 13's fio row: 16 jobs of
//! 4 KiB write + FLUSH ran at 0.75-0.84 of nbdkit's file plugin, FLUSH p99 2.3-2.5x its):
//! the next FLUSH seals and writes its record meanwhile, then waits at the flush gate for the
//! cache flush before it to end and issues its own; a FLUSH that the cache flush under way
//! already covers waits for that one and issues none. Pinned with a device that holds the
//! cache flush at a gate.

use std::sync::Arc;
use tiercache_device::{FailMode, OpKind};
use tiercache_engine::Volume;

mod common;
use common::holds::{finishes_within, held_volume, join_within};
use common::*;

/// A FLUSH on a thread of its own.
fn flush_in_thread(v: &Arc<Volume>) -> std::thread::JoinHandle<Result<(), tiercache_engine::EngineError>> {
    on_thread(v, |v| v.flush())
}

/// The first FLUSH's cache flush is held. A second FLUSH, of a write made meanwhile, writes
/// its record during it (the io lock is free), but returns only after its own cache flush,
/// which waits for the first to end. Both writes are durable afterwards.
#[test]
fn the_next_flush_writes_its_record_during_the_cache_flush_before() {
    let (dev, cache, backing, v) = held_volume(256);
    write(&v, 10, 1);
    let before = v.status().counters.cache_flushes;
    let (held, first) = dev.flush_held(&v);
    let writes = cache.stats().writes;
    write(&v, 20, 1);
    let second = flush_in_thread(&v);
    wait_until("the second FLUSH's record written", || cache.stats().writes > writes);
    assert!(!finishes_within(&second, 1), "the second FLUSH returned before any cache flush covering its write");
    dev.release(held);
    join_within(first, 30, "first FLUSH").unwrap();
    join_within(second, 30, "second FLUSH").unwrap();
    let c = v.status().counters;
    assert_eq!((c.flush_requests, c.cache_flushes - before), (2, 2), "{c:?}");
    drop(v);
    let r = open(durable_copy(&cache), durable_copy(&backing));
    assert_eq!((read_version(&r, 10).unwrap(), read_version(&r, 20).unwrap()), (Some(1), Some(1)));
}

/// A FLUSH with nothing newer than what the held cache flush covers waits for it at the gate
/// and issues no cache flush of its own (group commit across the gate).
#[test]
fn a_flush_the_one_under_way_covers_waits_for_it() {
    let (dev, cache, backing, v) = held_volume(256);
    write(&v, 10, 1);
    let before = v.status().counters.cache_flushes;
    let (held, first) = dev.flush_held(&v);
    let second = flush_in_thread(&v);
    assert!(!finishes_within(&second, 1), "the second FLUSH returned before the cache flush covering it ended");
    dev.release(held);
    join_within(first, 30, "first FLUSH").unwrap();
    join_within(second, 30, "second FLUSH").unwrap();
    let c = v.status().counters;
    assert_eq!((c.flush_requests, c.cache_flushes - before), (2, 1), "{c:?}");
    drop(v);
    let r = open(durable_copy(&cache), durable_copy(&backing));
    assert_eq!(read_version(&r, 10).unwrap(), Some(1));
}

/// The held cache flush fails: the FLUSH that issued it and the one waiting for it both
/// report the error, and the volume acknowledges no FLUSH afterwards.
#[test]
fn a_failing_cache_flush_fails_the_flush_waiting_for_it() {
    let (dev, cache, _backing, v) = held_volume(256);
    write(&v, 10, 1);
    cache.fail_after(Some(OpKind::Flush), 0, FailMode::Once);
    let (held, first) = dev.flush_held(&v);
    let second = flush_in_thread(&v);
    assert!(!finishes_within(&second, 1));
    dev.release(held);
    assert!(join_within(first, 30, "first FLUSH").is_err());
    assert!(join_within(second, 30, "second FLUSH").is_err(), "a FLUSH covered by a failed cache flush succeeded");
    assert!(v.flush().is_err());
}
