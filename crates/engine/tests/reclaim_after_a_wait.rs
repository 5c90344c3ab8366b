//! A writer's reclaim that meets a dense dirty window at the head writes it back, with the
//! dirty blocks of the segments after it (`write_back_for_reclaim`), once it has the destage
//! lock. A write-back batch under way holds that lock, and the pre-cleaner's batches take the
//! head's dense windows first: when the batch the writer waited for wrote its window back,
//! nothing is left for the writer to write, and the segments after it are not its to wait for
//! (MariaDB over an emulated HDD: a writer that had waited 1.2 s for two pre-clean batches
//! then wrote 250 blocks ahead, 0.3 s more).

use std::sync::Arc;
use tiercache_device::{BlockDevice, MonotonicClock};
use tiercache_engine::{Volume, VolumeOptions};

mod common;
use common::holds::{thread_id, wait_until_blocked, Dev};
use common::*;

#[test]
fn a_writer_whose_window_the_batch_it_waited_for_wrote_back_writes_nothing_ahead() {
    // A 256-block log of 16-block segments (reclaim copies up to 8 dirty blocks forward), its
    // records of 15 dirty blocks each: every window at the head is dense. No write-back was
    // timed yet, so reclaim writes dense windows back rather than copy them.
    let (cache, backing) = devices_seg(16, 16, 4096, log_only());
    let held = Dev::new(&backing);
    let c: Arc<dyn BlockDevice> = cache.clone();
    let b: Arc<dyn BlockDevice> = held.clone();
    let v = Arc::new(Volume::open(c, b, Arc::new(MonotonicClock::new()), VolumeOptions::default()).expect("open").0);
    let mut model = Model::new();
    let mut next = 0;
    while v.log_window().2 + 16 < 256 {
        write_flush(&v, &mut model, next, 15, 1);
        next += 15;
    }
    let (head, _, _) = v.log_window();
    assert_eq!(head, 0);
    // The first window's write-back (blocks 0..15, the oldest dirty data: where the
    // pre-cleaner starts) is held at its backing write, with the destage lock.
    let hold = held.hold_write_of(0);
    let batch = on_thread(&v, |v| v.destage_oldest(15));
    held.wait_held(hold);
    // A writer needs room: its reclaim meets the same window, dense, and waits for the lock.
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let writer = on_thread(&v, move |v| {
        tid_tx.send(thread_id()).unwrap();
        // (One block at a time, until the head moves: one reclaim, the one that waited.)
        let mut m = Model::new();
        let mut b = 2000;
        while v.log_window().0 == 0 {
            write_flush(v, &mut m, b, 1, 2);
            b += 1;
        }
        m
    });
    wait_until_blocked(tid_rx.recv().unwrap());
    held.release(hold);
    assert_eq!(batch.join().unwrap().unwrap(), 15);
    model.extend(writer.join().unwrap());
    // The window is free, and the writer wrote nothing back: the second window's blocks are
    // still dirty (with the segments ahead taken, they were written back).
    let dirty: Vec<u64> = v.index_snapshot().into_iter().filter(|(_, e)| e.dirty).map(|(b, _)| b).collect();
    assert!(v.log_window().0 >= 16, "the head moved past the first window");
    for b in 15..30 {
        assert!(dirty.contains(&b), "block {b} written back by the writer that waited: {dirty:?}");
    }
    for (&b, &version) in &model {
        assert_eq!(read_version(&v, b).unwrap(), Some(version), "block {b}");
    }
    let recovered = open(durable_copy(&cache), durable_copy(&backing));
    for (&b, &version) in &model {
        assert_eq!(read_version(&recovered, b).unwrap(), Some(version), "block {b} after a power cut");
    }
}
