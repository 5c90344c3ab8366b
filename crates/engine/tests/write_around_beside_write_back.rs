//! Write-arounds beside a write-back batch (`try_write_around`, `Around::batch`): a write of
//! blocks with no copy in the cache goes to the backing device while a write-back batch holds
//! the destage lock, instead of waiting for the whole batch (tens of milliseconds; in `bench
//! seq`'s dirty-head case every writer whose reclaim settles the write-arounds waited behind
//! it too). A block the batch holds, or any block with a copy in the cache, still waits; so
//! does the next batch, for the write-arounds begun beside the last one.
//!
//! Each test holds chosen backing I/Os (`Dev`) to make the interleaving exact; every wait is
//! bounded, so a deadlock fails the test instead of hanging it. Blocks used: 40 and up (the
//! backing device's fingerprint blocks are 0, 1, 16 and the last).

use std::collections::BTreeMap;
use std::sync::Arc;

mod common;
use common::holds::*;
use common::*;

fn beside(v: &tiercache_engine::Volume) -> u64 {
    v.status().counters.written_around_beside_write_back
}

/// A volume whose backing device is a `Dev`, and a write-back batch held at its backing write.
struct Held {
    cache: Arc<SimDevice>,
    backing: Arc<SimDevice>,
    dev: Arc<Dev>,
    v: Arc<Volume>,
    /// The batch's held write.
    held: usize,
    batch: std::thread::JoinHandle<Result<usize, EngineError>>,
}

/// Blocks 40..44 cached dirty (version 1, durable), and a write-back batch of them on a
/// thread of its own, held at its backing write.
fn batch_held() -> Held {
    let (cache, backing) = wa_devices(32, 256);
    let dev = Dev::new(&backing);
    let v = Arc::new(open_wa(Arc::clone(&cache) as Arc<dyn BlockDevice>, Arc::clone(&dev) as Arc<dyn BlockDevice>));
    dirty_durable(&v, 40, 4, 1);
    let held = dev.hold(|op, off, len| op == Op::Write && covers(off, len, 40));
    let batch = on_thread(&v, |v| v.destage_step(64));
    dev.wait_held(held);
    Held { cache, backing, dev, v, held, batch }
}

use tiercache_device::{BlockDevice, SimDevice};
use tiercache_engine::{EngineError, Volume};

// A write of blocks the cache does not hold completes while the batch is held at its
// backing write: it went around beside the batch. Before, it waited for the destage lock,
// which the held batch never let go (the test timed out there).
#[test]
fn a_write_around_of_uncached_blocks_does_not_wait_for_a_write_back_batch() {
    let Held { cache, backing, dev, v, held, batch } = batch_held();
    let w = on_thread(&v, |v| write_n(v, 100, 4, 2));
    let went_beside = finishes_within(&w, 10);
    dev.release(held);
    assert_eq!(join_within(batch, 30, "the batch").unwrap(), 4, "the batch wrote back blocks 40..44");
    join_within(w, 30, "the write-around").unwrap();
    assert!(went_beside, "the write-around waited for the write-back batch");
    assert_eq!((around(&v), beside(&v)), (4, 1), "(blocks written around, write-arounds beside a batch)");
    assert_eq!(vers(&v, 100..104), vec![2; 4]);
    assert_eq!(vers(&v, 40..44), vec![1; 4]);
    assert!(dirty_blocks(&v).is_empty(), "the batch marked its blocks clean");
    v.flush().unwrap();
    assert_backing_holds(
        &backing,
        &(40..44).map(|b| (b, 1)).chain((100..104).map(|b| (b, 2))).collect::<BTreeMap<u64, u64>>(),
    );
    let r = crash_and_recover(&cache, &backing);
    assert_eq!((vers(&r, 40..44), vers(&r, 100..104)), (vec![1; 4], vec![2; 4]), "after FLUSH and a power cut");
}

// A write-around of blocks the batch is writing back (they have a copy in the cache) may not
// begin beside it: the batch would write the older version over the new data once its held
// write lands. It waits for the batch (which leaves clean copies of them on the log, so the
// write then goes through the cache), and the new data wins, live, on the backing device
// after write-back and after a power cut.
#[test]
fn a_write_around_of_blocks_in_the_batch_waits_for_it() {
    let Held { cache, backing, dev, v, held, batch } = batch_held();
    let w = on_thread(&v, |v| write_n(v, 42, 4, 2)); // 42, 43 are in the batch
    let finished_early = finishes_within(&w, 1);
    dev.release(held);
    join_within(batch, 30, "the batch").unwrap();
    join_within(w, 30, "the write").unwrap();
    assert!(!finished_early, "a write of blocks in the batch completed while the batch was held");
    assert_eq!(beside(&v), 0, "it began beside the batch");
    assert_eq!(vers(&v, 40..46), vec![1, 1, 2, 2, 2, 2]);
    v.flush().unwrap();
    let r = crash_and_recover(&cache, &backing);
    assert_eq!(vers(&r, 40..46), vec![1, 1, 2, 2, 2, 2], "after FLUSH and a power cut");
    drop(r);
    v.write_back_all(1.0, |_, _| true).unwrap();
    assert_backing_holds(&backing, &(42..46).map(|b| (b, 2)).collect::<BTreeMap<u64, u64>>());
}

// A power cut while both the batch and a write-around beside it are held at their backing
// writes: the batch's blocks come back dirty from the log (nothing was marked clean), and the
// write-around, never flushed, left each of its blocks old or new, never torn or foreign.
#[test]
fn a_power_cut_during_a_batch_and_a_write_around_beside_it_loses_nothing_acknowledged() {
    let Held { cache, backing, dev, v, batch, .. } = batch_held();
    let held_around = dev.hold(|op, off, len| op == Op::Write && covers(off, len, 100));
    let w = on_thread(&v, |v| write_n(v, 100, 4, 2));
    dev.wait_held(held_around);
    let r = crash_and_recover(&cache, &backing);
    assert_eq!(vers(&r, 40..44), vec![1; 4], "the batch's blocks after the power cut");
    for b in 100..104 {
        let x = ver(&r, b);
        assert!(x == 0 || x == 2, "block {b} read version {x} after the power cut");
    }
    dev.release_all();
    join_within(batch, 30, "the batch").unwrap();
    join_within(w, 30, "the write-around").unwrap();
    assert_eq!(beside(&v), 1);
}

// The next batch waits for the write-arounds begun beside the last one (`lock_destage`):
// block 100 is rewritten through the cache (version 3) while its write-around (version 2) is
// held, and its record is written. The write-around ends last and wins (overlapping writes
// have no order; reads and the backing device must agree on one). A batch that did not wait
// could write version 3 back and mark it clean over a backing device that then takes
// version 2.
#[test]
fn the_next_batch_waits_for_a_write_around_begun_beside_the_last() {
    let Held { cache, backing, dev, v, held, batch } = batch_held();
    let held_around = dev.hold(|op, off, len| op == Op::Write && covers(off, len, 100));
    let w = on_thread(&v, |v| write_n(v, 100, 2, 2));
    dev.wait_held(held_around);
    dev.release(held);
    join_within(batch, 30, "the first batch").unwrap();
    write(&v, 100, 3); // one block: through the cache
    for b in 120..150 {
        write(&v, b, 1); // fills staging: block 100's record is written
    }
    let next = on_thread(&v, |v| v.destage_step(64));
    let next_waited = !finishes_within(&next, 1);
    dev.release(held_around);
    join_within(w, 30, "the write-around").unwrap();
    join_within(next, 30, "the next batch").unwrap();
    assert!(next_waited, "the next batch did not wait for the write-around under way");
    let live = vers(&v, 100..102);
    v.flush().unwrap();
    v.write_back_all(1.0, |_, _| true).unwrap();
    assert_eq!(backing_version(&backing, 100), Some(live[0]), "the backing device and reads disagree on block 100");
    let r = crash_and_recover(&cache, &backing);
    assert_eq!((live, vers(&r, 100..102)), (vec![2, 2], vec![2, 2]), "blocks 100, 101: (live, after a power cut)");
}
