//! Reclaim meeting a window dense in dirty blocks (more than one reclaim record copies
//! forward) below the high watermark: it copies them forward in a shorter window when that
//! was measured cheaper than writing them back (volume/costs.rs), so a writer in front of a
//! slow backing device never waits for it. Time is the simulated devices' latencies on a
//! shared virtual clock, so every choice here is exact. What is proven:
//! - `over_a_slow_backing_device_dense_windows_are_copied_forward`: after one write-back (which
//!   times itself) and one timed copy, reclaim copies the dense windows forward (it writes back
//!   only the copies' own records, too dense to copy again, when the head comes round to them);
//!   every version reads back, and a power cut after every 16th FLUSH recovers every flushed
//!   version;
//! - `over_a_backing_device_as_fast_as_the_cache_they_are_written_back`: where writing back is
//!   cheaper, it still writes back (one tried copy at most);
//! - `a_log_dense_everywhere_is_written_back`: where the whole log is whole records of dirty
//!   blocks, copying frees too little (a block per 15 copies): written back however slow the
//!   backing device is;
//! - `a_window_too_dense_to_free_an_eighth_is_copied_while_the_log_has_room`: the same dense
//!   window, with half the log free to take: copied, lap after lap, judged over the lap;
//! - `above_the_high_watermark_dense_windows_are_written_back`: copying keeps dirty data in
//!   the cache; while dirty data is above the watermark, write-back is what brings it down
//!   (checked step by step);
//! - `the_pre_cleaner_leaves_windows_reclaim_will_copy`: below the watermark the background
//!   pre-cleaner does not spend backing I/O on a dense stretch that reclaim will copy;
//! - `the_pre_cleaner_judges_the_head_again_each_round`: yet each round starts at the head, so
//!   above the watermark its oldest dirty blocks, which reclaim would write back in a writer's
//!   path, are written back first.

use std::sync::Arc;
use tiercache_device::{BlockDevice, SimClock, SimDevice, SimLatency};
use tiercache_engine::{Volume, VolumeOptions};

mod common;
use common::*;

const SEGMENT: u32 = 16;
const LOG_BLOCKS: u64 = 1024;
const BACKING_BLOCKS: u64 = 2048;

struct Rig {
    cache: Arc<SimDevice>,
    backing: Arc<SimDevice>,
    volume: Volume,
}

/// A 1024-block log in 16-block segments (a reclaim record copies 8 dirty blocks) on a cache
/// device with `cache` latencies, over a backing device with `backing` latencies, both on one
/// virtual clock that the volume reads too. No background thread.
fn rig(cache_latency: SimLatency, backing_latency: SimLatency, watermarks: Option<(u16, u16)>) -> Rig {
    rig_seg(SEGMENT, cache_latency, backing_latency, watermarks)
}

/// `rig` with segments of `segment` blocks (a reclaim record copies half a segment).
fn rig_seg(
    segment: u32,
    cache_latency: SimLatency,
    backing_latency: SimLatency,
    watermarks: Option<(u16, u16)>,
) -> Rig {
    let clock = SimClock::new();
    let (cache, backing) =
        devices_on_clock(segment, LOG_BLOCKS, BACKING_BLOCKS, &clock, cache_latency, backing_latency);
    let c: Arc<dyn BlockDevice> = cache.clone();
    let b: Arc<dyn BlockDevice> = backing.clone();
    let options = VolumeOptions { dirty_watermarks_permille: watermarks, ..VolumeOptions::default() };
    let volume = Volume::open(c, b, Arc::new(clock.clone()), options).expect("open").0;
    Rig { cache, backing, volume }
}

/// Writes blocks `first..first + n` at `version`, `per` blocks a request, each followed by a
/// FLUSH (so each is a record of a header and `per` blocks: windows `per / (per + 1)` dirty).
fn write_flushed(v: &Volume, first: u64, n: u64, per: u64, version: u64, mut after_flush: impl FnMut(u64)) {
    let mut b = first;
    while b < first + n {
        let k = per.min(first + n - b);
        v.write(b * BS as u64, &stamps(b, k, version)).unwrap();
        v.flush().unwrap();
        b += k;
        after_flush(b);
    }
}

/// The model: block -> version last written (0: the backing device's initial content).
fn check_all(v: &Volume, model: &[u64]) {
    for (b, &version) in model.iter().enumerate() {
        assert_eq!(read_version(v, b as u64).unwrap(), Some(version), "block {b}");
    }
}

/// The densely dirty log of these tests: blocks 0..540 in 2-block records (two thirds of
/// each window dirty, 53 % of the log), then blocks 400..540 rewritten `passes` times (their
/// older copies go stale, so the log wraps while the head meets the dense records of
/// 0..400). Calls `after_flush` after every FLUSH of the rewrites.
fn dense_workload(r: &Rig, model: &mut [u64], passes: u64, mut after_flush: impl FnMut(&Rig, &[u64])) {
    write_flushed(&r.volume, 0, 540, 2, 1, |_| {});
    model[..540].fill(1);
    for pass in 0..passes {
        let version = 2 + pass;
        let mut done = 400;
        write_flushed(&r.volume, 400, 140, 2, version, |b| {
            model[done as usize..b as usize].fill(version);
            done = b;
            after_flush(r, model);
        });
    }
}

#[test]
fn over_a_slow_backing_device_dense_windows_are_copied_forward() {
    let r = rig(FAST, SLOW, None);
    let mut model = vec![0u64; BACKING_BLOCKS as usize];
    let mut flushes = 0u64;
    dense_workload(&r, &mut model, 5, |r, model| {
        flushes += 1;
        // A power cut after every 16th FLUSH: every flushed version is there.
        if flushes.is_multiple_of(16) {
            let recovered = open(durable_copy(&r.cache), durable_copy(&r.backing));
            check_all(&recovered, model);
        }
    });
    let c = r.volume.status().counters;
    // Written back: the first dense window (which times the write-back), and once more the
    // reclaim records of copies when the head reaches them again (8 dirty blocks and a
    // header: too dense to copy again). Everything else was copied forward.
    assert!(c.dense_copy_forwards >= 40, "{} dense windows copied forward", c.dense_copy_forwards);
    assert!(c.reclaim_write_backs <= 2, "{} reclaim write-backs", c.reclaim_write_backs);
    let status = r.volume.status();
    assert!(status.reclaim_write_back_us_per_block.unwrap() > 10.0 * status.reclaim_copy_us_per_block.unwrap());
    check_all(&r.volume, &model);
    let recovered = open(durable_copy(&r.cache), durable_copy(&r.backing));
    check_all(&recovered, &model);
}

#[test]
fn over_a_backing_device_as_fast_as_the_cache_they_are_written_back() {
    let r = rig(FAST, FAST, None);
    let mut model = vec![0u64; BACKING_BLOCKS as usize];
    dense_workload(&r, &mut model, 5, |_, _| {});
    let c = r.volume.status().counters;
    assert!(
        c.dense_copy_forwards <= 1,
        "{} dense windows copied forward over a fast backing device",
        c.dense_copy_forwards
    );
    assert!(c.reclaim_write_backs >= 3, "{} reclaim write-backs", c.reclaim_write_backs);
    check_all(&r.volume, &model);
    let recovered = open(durable_copy(&r.cache), durable_copy(&r.backing));
    check_all(&recovered, &model);
}

#[test]
fn a_log_dense_everywhere_is_written_back() {
    // 64-block segments (a reclaim record copies 32 blocks) and 16-block records of blocks
    // never written before: 16 of every 17 blocks dirty, no stale copy to thin a window out.
    // Copying 32 frees 2 blocks of a 35-block window, and when the head comes round the
    // whole log is that dense: copying would free a block per 15 copies. (High watermark
    // 95 %: the write-backs are reclaim's, not the watermark's. A backing device ten times
    // slower than SLOW: by cost alone, copying would win.)
    let glacial = SimLatency { read_ns: 50_000_000, write_ns: 80_000_000, flush_ns: 200_000_000 };
    let r = rig_seg(64, FAST, glacial, Some((900, 950)));
    let mut model = vec![0u64; BACKING_BLOCKS as usize];
    write_flushed(&r.volume, 0, 2000, 16, 1, |_| {});
    model[..2000].fill(1);
    let c = r.volume.status().counters;
    // (One window may be copied: where a write-back batch, which covers the segments after
    // its window too, ended inside a record, the window there is part clean.)
    assert!(c.dense_copy_forwards <= 1, "{} dense windows copied forward", c.dense_copy_forwards);
    assert!(c.reclaim_write_backs >= 2, "{} reclaim write-backs", c.reclaim_write_backs);
    check_all(&r.volume, &model);
}

#[test]
fn a_window_too_dense_to_free_an_eighth_is_copied_while_the_log_has_room() {
    // The same dense records (2 blocks freed per 35 copied), but only 480 dirty blocks of them,
    // below them a hot set of 64 blocks rewritten lap after lap: about half the log is dirty,
    // so over a lap the head frees a block for about one copy. After the one write-back that
    // times itself, the dense windows are copied (and their copies, as dense, copied again on
    // the next lap), never written back: the writer never waits for the slow device.
    let r = rig_seg(64, FAST, SLOW, Some((900, 950)));
    let mut model = vec![0u64; BACKING_BLOCKS as usize];
    write_flushed(&r.volume, 0, 480, 16, 1, |_| {});
    model[..480].fill(1);
    let mut flushes = 0u64;
    for version in 2..60 {
        let mut done = 1000;
        write_flushed(&r.volume, 1000, 64, 16, version, |b| {
            model[done as usize..b as usize].fill(version);
            done = b;
            flushes += 1;
            if flushes.is_multiple_of(24) {
                let recovered = open(durable_copy(&r.cache), durable_copy(&r.backing));
                check_all(&recovered, &model);
            }
        });
    }
    let c = r.volume.status().counters;
    assert_eq!(c.reclaim_write_backs, 1, "only the write-back that times itself: {c:?}");
    assert!(c.dense_copy_throughs >= 12, "{} windows copied over the lap: {c:?}", c.dense_copy_throughs);
    assert!(r.volume.status().dirty_blocks >= 480 - 300, "the first write-back took at most its batch");
    check_all(&r.volume, &model);
    let recovered = open(durable_copy(&r.cache), durable_copy(&r.backing));
    check_all(&recovered, &model);
}

#[test]
fn above_the_high_watermark_dense_windows_are_written_back() {
    // High watermark 30 % (307 blocks): the dense log (540 dirty blocks) starts above it, and
    // reclaim's write-backs bring it down; no dense window is copied while it stays above.
    let r = rig(FAST, SLOW, Some((200, 300)));
    let high = LOG_BLOCKS * 300 / 1000;
    let mut model = vec![0u64; BACKING_BLOCKS as usize];
    let mut last = (r.volume.status().dirty_blocks, 0);
    let mut above = 0;
    dense_workload(&r, &mut model, 3, |r, _| {
        let s = r.volume.status();
        // (A step stages 2 blocks: if dirty data is above high + 2 after it, it was above
        // the watermark whenever reclaim looked during the step.)
        if last.0 > high + 2 && s.dirty_blocks > high + 2 {
            above += 1;
            assert_eq!(s.counters.dense_copy_forwards, last.1, "a dense window copied forward above the watermark");
        }
        last = (s.dirty_blocks, s.counters.dense_copy_forwards);
    });
    assert!(above > 50, "only {above} steps above the watermark: the test proves little");
    assert!(r.volume.status().counters.reclaim_write_backs > 0);
    check_all(&r.volume, &model);
}

#[test]
fn the_pre_cleaner_leaves_windows_reclaim_will_copy() {
    let r = rig(FAST, SLOW, None);
    let mut model = vec![0u64; BACKING_BLOCKS as usize];
    // Learn the costs on the first pass, then let background rounds run between the writes
    // of the next passes: below the watermark they would pre-clean the dense head.
    dense_workload(&r, &mut model, 3, |_, _| {});
    assert!(r.volume.status().counters.dense_copy_forwards > 0);
    let before = r.backing.stats().writes;
    let mut done = 400;
    for version in 10..14 {
        write_flushed(&r.volume, 400, 140, 2, version, |b| {
            r.volume.background_tick().unwrap();
            model[done as usize..b as usize].fill(version);
            done = if b >= 540 { 400 } else { b };
        });
    }
    assert_eq!(r.backing.stats().writes, before, "the pre-cleaner wrote back what reclaim copies for less");
    check_all(&r.volume, &model);
}

/// The dirty blocks of the log in log order from the head: (position past the head, block).
fn dirty_from_head(v: &Volume) -> Vec<(u64, u64)> {
    let (head, _, _) = v.log_window();
    let mut dirty: Vec<(u64, u64)> = v
        .index_snapshot()
        .into_iter()
        .filter(|(_, e)| e.dirty)
        .map(|(b, e)| ((u64::from(e.slot) + LOG_BLOCKS - head % LOG_BLOCKS) % LOG_BLOCKS, b))
        .collect();
    dirty.sort_unstable();
    dirty
}

#[test]
fn the_pre_cleaner_judges_the_head_again_each_round() {
    // Below the watermark the pre-cleaner passes the dense windows that reclaim will copy,
    // and its next rounds resume after them. Once dirty data goes above the watermark,
    // reclaim writes such a window back instead, in a writer's path. So every round starts
    // at the head again: write-back above the watermark (`destage_oldest`, what the
    // background thread runs there) takes the head's dirty blocks, the oldest, first, not
    // the ones after where the last round stopped.
    let r = rig(FAST, SLOW, None);
    let mut model = vec![0u64; BACKING_BLOCKS as usize];
    dense_workload(&r, &mut model, 3, |_, _| {});
    // Rewrites with a background round after each FLUSH, until the head window is dense
    // right after a round (which judged it one to copy, and went on).
    let mut dense_head = None;
    'rounds: for version in 10..30 {
        for b in (400..540).step_by(2) {
            r.volume.write(b * BS as u64, &stamps(b, 2, version)).unwrap();
            r.volume.flush().unwrap();
            model[b as usize..b as usize + 2].fill(version);
            r.volume.background_tick().unwrap();
            let dirty = dirty_from_head(&r.volume);
            if dirty.iter().take_while(|&&(pos, _)| pos < u64::from(SEGMENT)).count() > 8 {
                dense_head = Some(dirty);
                break 'rounds;
            }
        }
    }
    let before = dense_head.expect("the head never met a dense window right after a round");
    let writes = r.backing.stats().writes;
    assert_eq!(r.volume.destage_oldest(8).unwrap(), 8);
    assert!(r.backing.stats().writes > writes);
    let after: Vec<u64> = dirty_from_head(&r.volume).into_iter().map(|(_, b)| b).collect();
    let expected: Vec<u64> = before.iter().skip(8).map(|&(_, b)| b).collect();
    assert_eq!(after, expected, "the 8 dirty blocks nearest the head were written back, and only they");
    check_all(&r.volume, &model);
    let recovered = open(durable_copy(&r.cache), durable_copy(&r.backing));
    check_all(&recovered, &model);
}
