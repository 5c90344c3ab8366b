//! A writer rewriting, in the order it was written, data that sits dirty at the log head
//! (issue 13, nbdcopy's "rewrite after the reads" row: a backup restored twice, a file
//! rewritten in place). Pinned by counting blocks, on virtual time:
//! - `a_rewrite_in_write_order_supersedes_the_dirty_head_instead_of_writing_it_back`: a read
//!   that fills the cache leaves a 16th of the log free at the tail (`FILL_LEAVES_FREE_DIVISOR`), so the writer
//!   runs that far ahead of the head; the pre-cleaner leaves the windows it is about to
//!   supersede (`Streams::sweeping`), and reclaim finds them superseded. Almost nothing is
//!   written back or copied forward, and a power cut after the FLUSH keeps every block;
//! - `a_second_pass_of_the_read_keeps_the_room`: the same read again misses the blocks the
//!   probation ring let go (ghosts); a scan's ghosts are no sign of reuse, so they go to the
//!   ring again instead of wrapping the log onto the dirty data;
//! - `a_writer_that_stops_leaves_the_head_to_the_pre_cleaner_again`: a stream that stops is
//!   no reason to leave dirty data at the head: once it has been idle for
//!   `WRITE_STREAM_ACTIVE_MS`, the pre-cleaner writes back what it left;
//! - `a_sequential_writer_of_other_data_gets_the_head_written_back_ahead_of_it`: a writer of
//!   new data supersedes nothing at the head; the pre-cleaner writes it back as before.

use tiercache_engine::constants::WRITE_STREAM_ACTIVE_MS;
use tiercache_engine::{CreateOptions, Eviction};

mod common;
use common::rewrite_rig::*;
use common::*;

#[test]
fn a_rewrite_in_write_order_supersedes_the_dirty_head_instead_of_writing_it_back() {
    let mut r = Rig::new();
    let half = r.dirty_head_then_cache_filling_read();
    let s0 = r.v.status();
    let log_blocks = s0.log_bytes / BS as u64;
    assert_eq!(s0.log_head, 0, "the reads made the log wrap");
    let free = log_blocks - s0.log_tail;
    // (Less the admissions staged when the fill stopped: up to two records.)
    assert!(free >= log_blocks / 16 - 2 * 127, "the read fill left {free} blocks free");
    assert!(s0.dirty_blocks > half / 4, "{} of {half} blocks still dirty", s0.dirty_blocks);
    r.idle(50);

    r.write((0..half).step_by(REQUEST as usize), 2);
    let s1 = r.v.status();
    let (c0, c1) = (&s0.counters, &s1.counters);
    assert!(s1.log_head > 0, "the rewrite made the log wrap");
    let wasted = (c1.destaged_blocks - c0.destaged_blocks) + (c1.copied_forward_blocks - c0.copied_forward_blocks);
    let swept = c1.preclean_swept_blocks - c0.preclean_swept_blocks;
    assert!(
        wasted <= s0.dirty_blocks / 20,
        "the rewrite wrote back or copied {wasted} of the {} dirty blocks it superseded (pre-cleaner left {swept})",
        s0.dirty_blocks
    );
    assert!(swept > 0, "the pre-cleaner never left a window to the writer");
    for b in (0..half).step_by(7) {
        assert_eq!(read_version(&r.v, b).unwrap(), Some(2), "block {b}");
    }
    // A power cut now: the rewrite was flushed, so every block is its new version.
    let (cache, backing) = (durable_copy(&r.cache), durable_copy(&r.backing));
    let v = Rig::open(&r.clock, &cache, &backing, bypass_off(Eviction::Adaptive));
    for b in (0..half).step_by(5) {
        assert_eq!(read_version(&v, b).unwrap(), Some(2), "block {b} after the power cut");
    }
}

#[test]
fn a_second_pass_of_the_read_keeps_the_room() {
    // (Both policies with a ring; under plain S3-FIFO every ghost's miss enters the log,
    // under the adaptive one only those the frequency gate lets through.)
    for eviction in [Eviction::Adaptive, Eviction::S3fifo] {
        let mut r = Rig::with(CreateOptions::default(), bypass_off(eviction));
        r.dirty_head_then_cache_filling_read();
        let s0 = r.v.status();
        // The end of the read again (what the probation ring let go last, so ghosts still):
        // a scan's ghosts are no sign of reuse, so they go to the ring again, and the log
        // keeps its room.
        let mut buf = vec![0u8; (REQUEST * BS as u64) as usize];
        for b in (BACKING_BLOCKS * 7 / 8..BACKING_BLOCKS).step_by(REQUEST as usize) {
            r.v.read(b * BS as u64, &mut buf).unwrap();
            r.tick();
        }
        let s1 = r.v.status();
        assert_eq!(s1.log_head, 0, "{eviction:?}: the second pass made the log wrap");
        // (The pass's first 2 MiB, 512 blocks, are no scan yet: `SEQUENTIAL_REREAD_BYTES`.)
        assert!(
            s1.log_tail <= s0.log_tail + 512 + 2 * 127,
            "{eviction:?}: the second pass took {} blocks of the room",
            s1.log_tail - s0.log_tail
        );
        assert!(
            s1.counters.probation_admitted_blocks > s0.counters.probation_admitted_blocks,
            "the misses went nowhere"
        );
    }
}

#[test]
fn a_writer_that_stops_leaves_the_head_to_the_pre_cleaner_again() {
    let mut r = Rig::new();
    let half = r.dirty_head_then_cache_filling_read();
    // The rewrite stops half way through.
    r.write((0..half / 2).step_by(REQUEST as usize), 2);
    let s0 = r.v.status();
    assert!(s0.counters.preclean_swept_blocks > 0, "the pre-cleaner never left a window to the writer");
    // While the stream counts as active, the pre-cleaner still leaves the windows ahead of it
    // (looked at again every round)...
    r.idle(WRITE_STREAM_ACTIVE_MS / 2);
    let s1 = r.v.status();
    assert!(
        s1.counters.preclean_swept_blocks > s0.counters.preclean_swept_blocks,
        "the stream stopped counting at once"
    );
    // ...and once it has been idle that long, writes them back.
    r.idle(2 * WRITE_STREAM_ACTIVE_MS);
    let s2 = r.v.status();
    r.idle(2 * WRITE_STREAM_ACTIVE_MS);
    let s3 = r.v.status();
    assert_eq!(s3.counters.preclean_swept_blocks, s2.counters.preclean_swept_blocks, "a stopped stream still counts");
    assert!(
        s3.counters.destaged_blocks > s1.counters.destaged_blocks,
        "the head stayed dirty after the writer stopped: {} dirty",
        s3.dirty_blocks
    );
    for b in (0..half).step_by(7) {
        assert_eq!(read_version(&r.v, b).unwrap(), Some(if b < half / 2 { 2 } else { 1 }), "block {b}");
    }
}

#[test]
fn a_sequential_writer_of_other_data_gets_the_head_written_back_ahead_of_it() {
    let mut r = Rig::new();
    r.dirty_head_then_cache_filling_read();
    let s0 = r.v.status();
    // New data, as much as the rewrite above: it supersedes nothing at the head.
    let other = BACKING_BLOCKS / 2;
    r.write((other..other + CACHE_BLOCKS * 3 / 8).step_by(REQUEST as usize), 2);
    let s1 = r.v.status();
    assert_eq!(s1.counters.preclean_swept_blocks, s0.counters.preclean_swept_blocks, "nothing at the head was swept");
    let written_back = s1.counters.destaged_blocks - s0.counters.destaged_blocks;
    assert!(
        written_back >= s0.dirty_blocks * 9 / 10,
        "{written_back} of {} dirty blocks written back",
        s0.dirty_blocks
    );
    for b in (other..other + CACHE_BLOCKS * 3 / 8).step_by(7) {
        assert_eq!(read_version(&r.v, b).unwrap(), Some(2), "block {b}");
    }
}
