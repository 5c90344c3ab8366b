//! Adversarial review of "rewrite in write order" (issue 13: the pre-cleaner leaves dense
//! dirty windows that an active sequential write stream is about to supersede, the write
//! stream table, and the read fill's free room). Each test is one suspicion; see the names.
//! Two found a bug, fixed since (`Stream::advanced_at_block`): a stream whose requests only
//! fill in behind its `next` (a journal written round and round, a writer going backwards)
//! stayed a "sweeper" of the blocks after `next`, so the pre-cleaner left the dirty head to a
//! writer that never came and reclaim wrote it back on the writer's path:
//! `a_circular_writer_just_before_the_dirty_head_does_not_make_the_writer_wait` and
//! `a_backward_writer_below_the_dirty_head_is_no_sweeper`. The rest were refuted.

use std::sync::Arc;
use tiercache_device::{BlockDevice, Clock, SimClock, SimDevice, SimLatency};
use tiercache_engine::constants::WRITE_STREAM_ACTIVE_MS;
use tiercache_engine::{Counters, CreateOptions, Eviction, Volume, VolumeOptions};

mod common;
use common::rewrite_rig::*;
use common::*;

fn delta(a: &Counters, b: &Counters) -> String {
    format!(
        "destaged {} copied_forward {} reclaim_write_backs {} swept {} dense_copy_forwards {} evicted {} reclaimed {}",
        b.destaged_blocks - a.destaged_blocks,
        b.copied_forward_blocks - a.copied_forward_blocks,
        b.reclaim_write_backs - a.reclaim_write_backs,
        b.preclean_swept_blocks - a.preclean_swept_blocks,
        b.dense_copy_forwards - a.dense_copy_forwards,
        b.evicted_blocks - a.evicted_blocks,
        b.reclaimed_blocks - a.reclaimed_blocks,
    )
}

// ---------------------------------------------------------------------------------------
// Liveness: streams judged active that never supersede the head.
// ---------------------------------------------------------------------------------------

/// A writer that rewrites a small region over and over (a circular journal, 16 MiB) right
/// before, in block space, dirty data written earlier (which now sits at the log head). Each
/// wrap of the journal lands within the write table's reorder distance behind the stream's
/// `next` and "fills in behind" it: one stream, forever active, share 1, whose `next` is the
/// journal's end, i.e. the first block of the dirty data. The pre-cleaner then leaves the
/// dirty data's windows at the head (all of them "within reach" while the free room exceeds
/// the reserve) until the log is all but full, and the writer meets them dirty: it waits for
/// the backing device. Before the change the pre-cleaner wrote them back from a quarter of
/// the log ahead (its horizon), off the writer's path.
fn circular_journal(backing: SimLatency) -> (Counters, Counters, Waits, u64) {
    let mut r = Rig::on_backing(backing);
    let log = r.log_blocks();
    let journal = 4096; // blocks 0..4096
    let data = log * 3 / 16; // blocks 4096..4096 + data, written once, dirty
    r.write((journal..journal + data).step_by(REQUEST as usize), 1);
    r.idle(3 * WRITE_STREAM_ACTIVE_MS);
    let s0 = r.v.status();
    assert!(s0.dirty_blocks >= data * 9 / 10, "{} dirty", s0.dirty_blocks);
    r.waits = Waits::default();
    // A database's pattern: the journal written circularly (a log lap), then a checkpoint
    // of the data in order (which supersedes the last one: the sweeping the change is for),
    // four times over.
    let mut version = 2;
    let mut b = 0;
    for lap in 0..4 {
        for _ in 0..log / REQUEST {
            r.write1(b, version);
            b += REQUEST;
            if b == journal {
                b = 0;
                version += 1;
            }
        }
        if lap < 3 {
            for d in (journal..journal + data).step_by(REQUEST as usize) {
                r.write1(d, 1000 + lap);
            }
        }
    }
    r.v.flush().unwrap();
    let s1 = r.v.status();
    eprintln!(
        "circular journal: {}; dirty {} -> {}; writer {:?}",
        delta(&s0.counters, &s1.counters),
        s0.dirty_blocks,
        s1.dirty_blocks,
        r.waits
    );
    for b in (journal..journal + data).step_by(11) {
        assert_eq!(read_version(&r.v, b).unwrap(), Some(1002), "block {b}");
    }
    (s0.counters, s1.counters, r.waits, data)
}

#[test]
fn a_circular_writer_just_before_the_dirty_head_does_not_make_the_writer_wait() {
    let (c0, c1, waits, _) = circular_journal(SLOW);
    let d = delta(&c0, &c1);
    assert!(
        c1.reclaim_write_backs - c0.reclaim_write_backs == 0 && waits.slow == 0,
        "the writer waited for the backing device: {waits:?} ({d})"
    );
}

/// Sequential rewrite in order, with concurrent read misses admitted into the log (a cache
/// without a probation ring: every miss enters the log) at three times the writer's pace.
/// The stream's share is measured among the writes only; the reads fill the log room the
/// pre-cleaner counts as the writer's. The head reaches the windows it left well before the
/// writer supersedes them.
#[test]
fn read_admissions_into_the_log_do_not_count_as_the_rewriters_room() {
    let mut r = Rig::sized_on(
        CACHE_BLOCKS,
        SLOW,
        log_only(),
        VolumeOptions { sequential_bypass_bytes: 0, ..VolumeOptions::default() },
    );
    let log = r.log_blocks();
    let data = log / 4;
    r.write((0..data).step_by(REQUEST as usize), 1);
    // Reads of other data fill the log (clean), up to 15/16, slowly (the pre-cleaner's
    // horizon stays short of the free room: it leaves the dirty head alone meanwhile).
    let mut rb = BACKING_BLOCKS / 2;
    while r.v.status().log_tail + log / 16 < log {
        r.clock.advance_ns(50_000_000);
        r.read1(rb);
        rb += REQUEST;
    }
    r.idle(3 * WRITE_STREAM_ACTIVE_MS);
    let s0 = r.v.status();
    assert!(s0.dirty_blocks >= data / 2, "{} of {data} dirty", s0.dirty_blocks);
    r.waits = Waits::default();
    // The rewrite, three read requests of new blocks per write request.
    for b in (0..data).step_by(REQUEST as usize) {
        r.write1(b, 2);
        for _ in 0..3 {
            r.read1(rb);
            rb = if rb + REQUEST >= BACKING_BLOCKS { data } else { rb + REQUEST };
        }
    }
    r.v.flush().unwrap();
    let s1 = r.v.status();
    let d = delta(&s0.counters, &s1.counters);
    eprintln!("rewrite with reads: {d}; writer {:?}", r.waits);
    let (c0, c1) = (&s0.counters, &s1.counters);
    assert!(
        c1.reclaim_write_backs - c0.reclaim_write_backs <= 2,
        "reclaim wrote back on the writer's path: the pre-cleaner left windows the reads made the head reach first ({d})"
    );
    assert!(r.waits.slow <= 2, "the writer waited for the backing device: {:?} ({d})", r.waits);
    for b in (0..data).step_by(7) {
        assert_eq!(read_version(&r.v, b).unwrap(), Some(2), "block {b}");
    }
}

/// A writer going backwards through the blocks just below dirty data at the log head: each
/// request "fills in behind" the stream, whose `next` stays at the dirty data's first block.
/// It never writes there.
#[test]
fn a_backward_writer_below_the_dirty_head_is_no_sweeper() {
    let mut r = Rig::on_backing(SLOW);
    let log = r.log_blocks();
    let start = 16384; // dirty data at 16384.., the writer goes down from 16384
    let data = log * 3 / 16;
    r.write((start..start + data).step_by(REQUEST as usize), 1);
    r.idle(3 * WRITE_STREAM_ACTIVE_MS);
    // Fill the log with the backward writer's own new data down from `start` (and over
    // again, at a new version, so it stays below the watermark).
    let s0 = r.v.status();
    r.waits = Waits::default();
    let mut version = 2;
    let mut b = start;
    for _ in 0..2 * log / REQUEST {
        if b == 0 {
            b = start;
            version += 1;
        }
        b -= REQUEST;
        r.write1(b, version);
    }
    r.v.flush().unwrap();
    let s1 = r.v.status();
    let d = delta(&s0.counters, &s1.counters);
    eprintln!("backward writer: {d}; dirty {} -> {}; writer {:?}", s0.dirty_blocks, s1.dirty_blocks, r.waits);
    let (c0, c1) = (&s0.counters, &s1.counters);
    assert!(
        c1.reclaim_write_backs - c0.reclaim_write_backs == 0
            && c1.copied_forward_blocks - c0.copied_forward_blocks <= data / 4,
        "reclaim met the data the pre-cleaner left to a backward writer ({d}; writer {:?})",
        r.waits
    );
    assert!(r.waits.slow == 0, "the writer waited for the backing device: {:?} ({d})", r.waits);
}

// ---------------------------------------------------------------------------------------
// Correctness: power cuts while the pre-cleaner leaves windows to a rewrite.
// ---------------------------------------------------------------------------------------

/// The rewrite of `tests/rewrite_in_order.rs` (dirty head, a cache-filling read, then the
/// rewrite in write order, the pre-cleaner leaving windows), with a FLUSH every few requests,
/// reads of the head between, and a power cut every 80 requests (the head mid-lap, reclaims
/// under way between FLUSHes): every block recovers to a version between the last flushed
/// and the last written, and the untouched blocks keep theirs.
#[test]
fn power_cuts_during_a_sweeping_rewrite_keep_every_flushed_block() {
    let mut r = Rig::new();
    let log = r.log_blocks();
    let half = r.dirty_head_then_cache_filling_read();
    let mut buf = vec![0u8; (REQUEST * BS as u64) as usize];
    let s0 = r.v.status();
    assert!(log - s0.log_tail >= log / 16 - 2 * 127 && s0.dirty_blocks > half / 4, "{s0:?}");
    r.idle(50);
    let mut flushed: Vec<u64> = vec![1; half as usize];
    let mut written: Vec<u64> = vec![1; half as usize];
    let mut cuts = 0;
    for (k, b) in (0..half).step_by(REQUEST as usize).enumerate() {
        r.write1(b, 2);
        for x in b..b + REQUEST {
            written[x as usize] = 2;
        }
        if k % 5 == 4 {
            r.v.flush().unwrap();
            flushed.copy_from_slice(&written);
        }
        if k % 3 == 0 {
            // A reader of the data still at the head.
            let h = (b + 4096).min(half - REQUEST);
            r.v.read(h * BS as u64, &mut buf).unwrap();
            for i in 0..REQUEST {
                let x = h + i;
                let got = version_of(x, &buf[(i * BS as u64) as usize..((i + 1) * BS as u64) as usize]);
                assert_eq!(got, Some(written[x as usize]), "read of block {x}");
            }
        }
        if k % 80 == 79 {
            cuts += 1;
            let clock = SimClock::new();
            let cache = Arc::new(durable_copy(&r.cache).as_ref().clone_on(&clock));
            let backing = Arc::new(durable_copy(&r.backing).as_ref().clone_on(&clock));
            let v = Rig::open(&clock, &cache, &backing, r.options);
            for x in (0..half).step_by(7) {
                let got = read_version(&v, x).unwrap();
                let (lo, hi) = (flushed[x as usize], written[x as usize]);
                assert!(
                    got.is_some_and(|g| g >= lo && g <= hi),
                    "cut {cuts} after request {k}: block {x} recovered {got:?}, flushed {lo}, written {hi}"
                );
            }
        }
    }
    r.v.flush().unwrap();
    let s1 = r.v.status();
    assert!(s1.counters.preclean_swept_blocks > s0.counters.preclean_swept_blocks, "no window was left");
    check_all(&r.v, &written);
}

fn check_all(v: &Volume, versions: &[u64]) {
    for (x, &version) in versions.iter().enumerate() {
        assert_eq!(read_version(v, x as u64).unwrap(), Some(version), "block {x}");
    }
}

trait CloneOn {
    fn clone_on(&self, clock: &SimClock) -> SimDevice;
}

impl CloneOn for SimDevice {
    /// The same image on `clock`, with the rig's latencies.
    fn clone_on(&self, clock: &SimClock) -> SimDevice {
        SimDevice::from_image(self.current_image(), BS as u32).with_clock(clock.clone(), LAT)
    }
}

// ---------------------------------------------------------------------------------------
// The write stream table's arithmetic, through the volume.
// ---------------------------------------------------------------------------------------

/// A clock that jumps backwards every few reads of it (a test's, or a buggy platform's).
struct Wobbly {
    ns: std::sync::atomic::AtomicU64,
}

impl Clock for Wobbly {
    fn now_ns(&self) -> u64 {
        use std::sync::atomic::Ordering;
        let n = self.ns.fetch_add(1, Ordering::Relaxed);
        // Forward 37 ms a call, back to 0 and far ahead (2^62 ns) now and then. (Not near
        // u64::MAX: the record pipeline's age samples add to the clock unchecked, commit.rs,
        // before this change.)
        match n % 13 {
            0 => (1 << 62) - n,
            6 => 0,
            _ => (n * 37_000_000) % 1_000_000_000_000,
        }
    }
}

/// Empty writes, requests of the volume's last blocks, one huge request, requests out of
/// order and overlapping, and a clock that jumps back and to u64::MAX: no panic, no
/// overflow, and every block reads back as written.
#[test]
fn the_write_stream_table_survives_edge_requests_and_a_wobbly_clock() {
    let (cache, backing) = devices_seg(64, 16, 8192, log_only());
    let c: Arc<dyn BlockDevice> = cache.clone();
    let b: Arc<dyn BlockDevice> = backing.clone();
    let clock = Arc::new(Wobbly { ns: 0.into() });
    let v = Volume::open(c, b, clock, VolumeOptions::default()).expect("open").0;
    let mut model = Model::new();
    let end = 8192u64;
    v.write(end * BS as u64, &[]).unwrap();
    v.write(0, &[]).unwrap();
    for round in 1..=6u64 {
        // Up to the last block, forward, backwards, overlapping.
        for k in (0..16).rev() {
            write_flush(&v, &mut model, end - 16 * (k + 1), 16, round);
        }
        for k in 0..16 {
            write_flush(&v, &mut model, end - 24 - 8 * k, 24, round);
        }
        write_flush(&v, &mut model, end - 1, 1, round);
        // A request of a quarter of the volume, ending at its last block.
        write_flush(&v, &mut model, end - 2048, 2048, round);
        for _ in 0..8 {
            v.background_tick().unwrap();
        }
    }
    assert!(v.write((end - 1) * BS as u64, &stamps(end - 1, 2, 9)).is_err(), "past the end");
    check_model(&v, &model, "wobbly clock");
}

// ---------------------------------------------------------------------------------------
// The read fill's room.
// ---------------------------------------------------------------------------------------

/// The fill's room on a small log (where the records' room is more than a 16th), with the
/// ring: the fill still admits into the log, stops short of wrapping, and the data is right.
/// With the s3fifo policy the fill does not apply. And a power cut mid-fill: reopened, the
/// fill goes on (the log has not wrapped) and leaves the same room.
#[test]
fn the_fill_room_on_small_logs_other_policies_and_after_a_power_cut_mid_fill() {
    for (eviction, segments) in [(Eviction::Adaptive, 64u64), (Eviction::Adaptive, 1024), (Eviction::S3fifo, 1024)] {
        let (cache, backing) = devices_seg(segments, 16, 65536, CreateOptions::default());
        let options = VolumeOptions { sequential_bypass_bytes: 0, eviction, ..VolumeOptions::default() };
        let open = |cache: &Arc<SimDevice>, backing: &Arc<SimDevice>| {
            let c: Arc<dyn BlockDevice> = cache.clone();
            let b: Arc<dyn BlockDevice> = backing.clone();
            Volume::open(c, b, Arc::new(SimClock::new()), options).expect("open").0
        };
        let v = open(&cache, &backing);
        let log = v.status().log_bytes / BS as u64;
        let mut model = Model::new();
        write_flush(&v, &mut model, 60000, 64, 1);
        // Read half the log's worth, then cut the power.
        read_once(&v, (0..log / 2).map(|b| b * 3 % 50000));
        v.flush().unwrap();
        let filled0 = v.status().counters.filling_admitted_blocks;
        let (cache2, backing2) = (durable_copy(&cache), durable_copy(&backing));
        drop(v);
        let v = open(&cache2, &backing2);
        check_model(&v, &model, "after the power cut mid-fill");
        // Then read twice the log's worth of other blocks.
        read_once(&v, (0..2 * log).map(|b| 50000 - 1 - (b * 3 % 49000)));
        v.flush().unwrap();
        let s = v.status();
        eprintln!(
            "{eviction:?} {segments} segments: log {log}, filled {filled0} then {}, tail {} head {}, ring {}",
            s.counters.filling_admitted_blocks, s.log_tail, s.log_head, s.counters.probation_admitted_blocks
        );
        match eviction {
            Eviction::Adaptive => {
                assert!(filled0 > 0, "the fill admitted nothing before the cut");
                assert!(s.log_head == 0, "the fill wrapped the log");
                assert!(s.counters.probation_admitted_blocks > 0, "the misses past the fill's room went nowhere");
            }
            _ => assert_eq!(s.counters.filling_admitted_blocks, 0),
        }
        check_model(&v, &model, "after the fill");
        // Writes now wrap the log; everything reads back.
        for k in 0..log / 32 {
            write_flush(&v, &mut model, 60000 + 64 * (k % 40), 64, 2 + k);
        }
        check_model(&v, &model, "after the writes");
    }
}
