//! A writer's reclaim that meets a dense dirty window at the head writes it back, with the
//! dirty blocks of the segments after it (`write_back_for_reclaim`), once it has the destage
//! lock. A write-back batch under way holds that lock, and the pre-cleaner's batches take the
//! head's dense windows first: when the batch the writer waited for wrote its window back,
//! nothing is left for the writer to write, and the segments after it are not its to wait for
//! (MariaDB over an emulated HDD: a writer that had waited 1.2 s for two pre-clean batches
//! then wrote 250 blocks ahead, 0.3 s more).

mod common;
use common::holds::{dense_head_volume, reclaim_behind_a_held_batch};
use common::*;

#[test]
fn a_writer_whose_window_the_batch_it_waited_for_wrote_back_writes_nothing_ahead() {
    // A 256-block log of 16-block segments (reclaim copies up to 8 dirty blocks forward), its
    // records of 15 dirty blocks each: every window at the head is dense. The first window's
    // write-back (blocks 0..15, the oldest dirty data: where the pre-cleaner starts) is held at
    // its backing write, with the destage lock; a writer needing room meets the same window,
    // dense, and waits for the lock (one reclaim, the one that waited).
    let (cache, backing, held, v, mut model) = dense_head_volume();
    let (written, wrote) = reclaim_behind_a_held_batch(&v, &held, 15, || {});
    assert_eq!(written, 15);
    model.extend(wrote);
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
