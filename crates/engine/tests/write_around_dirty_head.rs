//! Write-around at a dirty head (issue 13, "writes meeting dirty data below the high
//! watermark"): a large write of blocks the cache does not hold, when the log has no room
//! for it without a reclaim and the head holds densely dirty segments, goes straight to the
//! backing device, below the high watermark too, and the dirty data stays cached. Pinned by
//! counting I/Os and by a power cut:
//! - `new_data_meeting_a_dirty_head_goes_around_and_the_dirty_data_stays`: no cache I/O, one
//!   backing write, no write-back; a rewrite of cached blocks still goes through the log;
//!   after a FLUSH and a power cut, every block reads its newest version;
//! - `with_room_or_a_clean_head_large_writes_go_through_the_cache`: the cases that must not
//!   go around (a dirty head with room in the log; a log full of clean data, evicted at no
//!   I/O cost);
//! - `the_pre_cleaner_leaves_the_dirty_head_while_writes_go_around_it`: for
//!   `WRITE_AROUND_YIELD_MS` after such a write, the pre-cleaner does not write the head back;
//! - `the_pre_cleaner_yields_no_longer_once_a_block_goes_through_the_log`: a writer through
//!   the log needs the room, so the yield ends;
//! - `a_write_meeting_a_head_the_pre_cleaner_just_cleaned_goes_around`: the room at the tail
//!   was just bought with write-back, so the write goes around although the head it meets is
//!   clean; with no write-back lately, through the log.

use std::sync::Arc;
use tiercache_device::{BlockDevice, SimClock, SimDevice};
use tiercache_engine::{create, CreateOptions, Volume, VolumeOptions};
use tiercache_format::Layout;

mod common;
use common::*;

const SEG: u32 = 16;
const LOG_BLOCKS: u64 = 512;
const BACKING_BLOCKS: u64 = 4096;
/// The shipped policy's smallest write-around: 64 KiB.
const LARGE: u64 = 16;
/// Blocks written dirty first (59 % of the log: below the 70 % high watermark).
const DIRTY: std::ops::Range<u64> = 96..400;

/// The cache (`SEG`-block segments, a `LOG_BLOCKS` log) and a backing device stamped with
/// version 0 that never tears a block (else nothing goes around), on `clock`.
fn devices(clock: &SimClock) -> (Arc<SimDevice>, Arc<SimDevice>) {
    let ck = Layout::checkpoint_blocks_for(LOG_BLOCKS, BS as u32);
    let cache = SimDevice::new((2 + 2 * ck + LOG_BLOCKS) * BS as u64, BS as u32).with_name("cache");
    let backing = SimDevice::from_image(stamps(0, BACKING_BLOCKS, 0), BS as u32).with_name("backing");
    let cache = Arc::new(cache.with_clock(clock.clone(), FAST));
    let backing = Arc::new(backing.with_atomic_write(BS as u32).with_clock(clock.clone(), FAST));
    create(&*cache, &*backing, &CreateOptions { segment_blocks: SEG, ..log_only() }).expect("create");
    (cache, backing)
}

fn open(cache: &Arc<SimDevice>, backing: &Arc<SimDevice>, clock: &SimClock) -> Volume {
    let c: Arc<dyn BlockDevice> = cache.clone();
    let b: Arc<dyn BlockDevice> = backing.clone();
    Volume::open(c, b, Arc::new(clock.clone()), VolumeOptions::default()).expect("open").0
}

fn free(v: &Volume) -> u64 {
    let s = v.status();
    s.log_head + s.log_bytes / BS as u64 - s.log_tail
}

/// Reads 8-block runs from `from` on (each admitted into the log, then written out) until
/// the log has fewer than `below` blocks free; returns the first block not read.
fn fill_with_clean(v: &Volume, from: u64, below: u64) -> u64 {
    let mut b = from;
    let mut buf = vec![0u8; 8 * BS];
    while free(v) >= below {
        v.read(b * BS as u64, &mut buf).unwrap();
        v.flush().unwrap();
        b += 8;
        assert!(b < BACKING_BLOCKS, "the log never filled");
    }
    assert_eq!(v.status().counters.reclaimed_blocks, 0, "the fill wrapped the log");
    b
}

/// The DIRTY blocks written at version 1 in 8-block writes (through the log: below the
/// write-around size), flushed, then clean blocks read in until the log is nearly full.
fn dirty_head(clock: &SimClock) -> (Arc<SimDevice>, Arc<SimDevice>, Volume) {
    let (cache, backing) = devices(clock);
    let v = open(&cache, &backing, clock);
    for b in DIRTY.step_by(8) {
        v.write(b * BS as u64, &stamps(b, 8, 1)).unwrap();
    }
    v.flush().unwrap();
    fill_with_clean(&v, 1000, 100);
    assert_eq!(v.status().dirty_blocks, DIRTY.end - DIRTY.start);
    (cache, backing, v)
}

fn versions(v: &Volume, blocks: std::ops::Range<u64>) -> Vec<Option<u64>> {
    blocks.map(|b| read_version(v, b).unwrap()).collect()
}

#[test]
fn new_data_meeting_a_dirty_head_goes_around_and_the_dirty_data_stays() {
    let clock = SimClock::new();
    let (cache, backing, v) = dirty_head(&clock);
    let before = v.status().counters;
    let (c0, b0) = (cache.stats(), backing.stats());
    v.write(3000 * BS as u64, &stamps(3000, 2 * LARGE, 2)).unwrap();
    assert_eq!(delta(cache.stats(), c0), (0, 0, 0), "around the cache: no cache I/O");
    assert_eq!(delta(backing.stats(), b0), (0, 1, 0), "one backing write, no flush yet");
    let after = v.status().counters;
    assert_eq!(after.written_around_at_dirty_head - before.written_around_at_dirty_head, 1);
    assert_eq!(after.written_around_blocks - before.written_around_blocks, 2 * LARGE);
    assert_eq!(after.destaged_blocks, before.destaged_blocks, "nothing written back");
    assert_eq!(after.reclaimed_blocks, before.reclaimed_blocks, "no reclaim");
    assert_eq!(v.status().dirty_blocks, DIRTY.end - DIRTY.start, "the dirty data stays cached");
    assert_eq!(versions(&v, 3000..3000 + 2 * LARGE), vec![Some(2); 2 * LARGE as usize]);

    // A large rewrite of cached (dirty) blocks goes through the log: it supersedes them there.
    v.write(DIRTY.start * BS as u64, &stamps(DIRTY.start, LARGE, 3)).unwrap();
    let rewritten = v.status().counters;
    assert_eq!(rewritten.written_around_blocks, after.written_around_blocks, "a rewrite of cached blocks");
    // A write partly over a cached block, likewise.
    v.write((DIRTY.end - 1) * BS as u64, &stamps(DIRTY.end - 1, LARGE, 3)).unwrap();
    assert_eq!(v.status().counters.written_around_blocks, after.written_around_blocks, "one block cached");

    v.flush().unwrap();
    let (c, b) = (durable_copy(&cache), durable_copy(&backing));
    let recovered = open(&c, &b, &SimClock::new());
    let mut want = vec![Some(3); LARGE as usize];
    want.extend(vec![Some(1); (DIRTY.end - DIRTY.start - LARGE - 1) as usize]);
    want.push(Some(3));
    assert_eq!(versions(&recovered, DIRTY), want);
    assert_eq!(versions(&recovered, DIRTY.end..DIRTY.end + LARGE - 1), vec![Some(3); LARGE as usize - 1]);
    assert_eq!(versions(&recovered, 3000..3000 + 2 * LARGE), vec![Some(2); 2 * LARGE as usize]);
}

#[test]
fn with_room_or_a_clean_head_large_writes_go_through_the_cache() {
    let clock = SimClock::new();
    let (cache, backing) = devices(&clock);
    let v = open(&cache, &backing, &clock);
    // A dirty head, but room in the log for the write (and a segment and a record besides).
    for b in DIRTY.step_by(8) {
        v.write(b * BS as u64, &stamps(b, 8, 1)).unwrap();
    }
    v.flush().unwrap();
    assert!(free(&v) > 2 * LARGE + 100, "{} free", free(&v));
    v.write(3000 * BS as u64, &stamps(3000, 2 * LARGE, 1)).unwrap();
    v.flush().unwrap();
    assert_eq!(v.status().counters.written_around_blocks, 0, "room in the log");
    // Written back: the log holds clean data only; then filled with clean reads.
    v.write_back_all(1.0, |_, _| true).unwrap();
    let next = fill_with_clean(&v, 1000, 100);
    assert_eq!(v.status().dirty_blocks, 0);
    // A large write meets a clean head: evicting it costs no I/O, so through the log.
    let b0 = backing.stats();
    v.write(next * BS as u64, &stamps(next, 2 * LARGE, 1)).unwrap();
    v.flush().unwrap();
    assert_eq!(v.status().counters.written_around_blocks, 0, "a clean head");
    assert_eq!(delta(backing.stats(), b0).1, 0, "no backing write");
    assert_eq!(versions(&v, next..next + 2 * LARGE), vec![Some(1); 2 * LARGE as usize]);
}

#[test]
fn the_pre_cleaner_leaves_the_dirty_head_while_writes_go_around_it() {
    let clock = SimClock::new();
    let (_cache, _backing, v) = dirty_head(&clock);
    v.write(3000 * BS as u64, &stamps(3000, 2 * LARGE, 2)).unwrap();
    assert_eq!(v.status().counters.written_around_at_dirty_head, 1);
    // Right after: the pre-cleaner (the log is short of its horizon) leaves the head.
    v.background_tick().unwrap();
    assert_eq!(v.status().counters.destaged_blocks, 0, "the pre-cleaner yielded");
    // No write around it for longer than WRITE_AROUND_YIELD_MS (100 ms): it writes back the
    // head's dense segments again, ahead of writers through the log.
    clock.advance_ns(150_000_000);
    v.background_tick().unwrap();
    assert!(v.status().counters.destaged_blocks > 0, "the pre-cleaner runs again");
}

#[test]
fn the_pre_cleaner_yields_no_longer_once_a_block_goes_through_the_log() {
    let clock = SimClock::new();
    let (_cache, _backing, v) = dirty_head(&clock);
    v.write(3000 * BS as u64, &stamps(3000, 2 * LARGE, 2)).unwrap();
    v.background_tick().unwrap();
    assert_eq!(v.status().counters.destaged_blocks, 0, "the pre-cleaner yielded");
    // A small write, through the log, within the 100 ms: that writer needs the room.
    v.write(3500 * BS as u64, &stamps(3500, 1, 2)).unwrap();
    v.background_tick().unwrap();
    assert!(v.status().counters.destaged_blocks > 0, "the pre-cleaner runs for the writer through the log");
}

#[test]
fn a_write_meeting_a_head_the_pre_cleaner_just_cleaned_goes_around() {
    let clock = SimClock::new();
    let (_cache, _backing, v) = dirty_head(&clock);
    // The pre-cleaner (the log is short of its horizon) writes the dirty head back, as far
    // as its horizon reaches.
    v.background_tick().unwrap();
    assert!(v.status().dirty_blocks < DIRTY.end - DIRTY.start, "the pre-cleaner wrote the head back");
    // A large write of new data now meets a clean head, but the log's room was just bought
    // with write-back: around (and the pre-cleaner then yields to it).
    v.write(3000 * BS as u64, &stamps(3000, 2 * LARGE, 2)).unwrap();
    assert_eq!(v.status().counters.written_around_at_dirty_head, 1, "around while the pre-cleaner writes back");
    // Once the pre-cleaner has written nothing back for longer than WRITE_AROUND_YIELD_MS,
    // a clean head takes the next one through the log. (So the write above went around for
    // the pre-cleaner's write-back, not for dirty data it found at the head.)
    clock.advance_ns(150_000_000);
    v.write(4000 * BS as u64, &stamps(4000, 2 * LARGE, 2)).unwrap();
    let c = v.status().counters;
    assert_eq!(
        (c.written_around_at_dirty_head, c.written_around_blocks),
        (1, 2 * LARGE),
        "a clean head, no write-back lately"
    );
    assert_eq!(versions(&v, 3000..3000 + 2 * LARGE), vec![Some(2); 2 * LARGE as usize]);
    assert_eq!(versions(&v, 4000..4000 + 2 * LARGE), vec![Some(2); 2 * LARGE as usize]);
}
