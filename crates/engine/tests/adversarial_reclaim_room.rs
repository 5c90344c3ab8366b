//! Adversarial review of commit 8435036 ("Reclaim: clean copies per reclaim record bounded by
//! a record's entries, not a segment"): `reclaim` now lets one reclaim record carry up to
//! `staging_limit` copies (at most 168 and at most `log_blocks / 8`) where it carried at most
//! `min(segment_blocks, staging_limit)`, still bounded by `free - 2` and by the window
//! (`window_room`). That changes anything only where a segment is smaller than a record:
//! logs of more than 8 segments whose segments are small. Each test is one suspicion; the
//! comment above it says what it attacks and whether the suspicion held (BUG) or was refuted.
//!
//! Every volume here sits on a `Tap`: a cache-device wrapper that decodes each record header
//! written to the log and takes a record whose `head_position` moves the head for a reclaim
//! record (only reclaim moves the head; it drains the records before it). For each it checks,
//! from the device's side alone, what the engine promises (docs/format.md 4.5): the record
//! lands in the room the old head left (`pos + blocks <= old head + log`), it takes no more
//! room than its window frees (`blocks <= new head - old head`), the writer's reserve
//! (`1 + copy_forward_max`) is free after it, at most `copy_forward_max` dirty copies, at most
//! `staging_limit` copies and 168 entries. It can also capture power-cut images at a chosen
//! reclaim record (its write torn among the writes not yet flushed, and just after its flush)
//! and hold one reclaim record's write while the test acts.
//!
//! A reach argument that bounds what the change can do: reclaim runs only when
//! `free < need = 1 + data + reserve`, and its window's kept blocks lie in
//! `[head, head + max(segment, need - free))` (the widening takes only segments with none), so
//! a reclaim record copies at most `min(free - 2, max(segment, need - free))` blocks: more
//! than a segment only where `need > 2 * segment + 2`, i.e. where `staging_limit > 2 *
//! segment` (a log of more than 16 segments), and never more than about `need / 2` (65 at
//! most with segments of 4 or 8 blocks, against 168 entries). The simulator (crates/sim)
//! formats 8 to 16 segments of 8 or 16 blocks (`staging_limit <= 2 * segment` exactly), so it
//! never writes a reclaim record of more copies than a segment: an assertion of that put in
//! `reclaim` for the purpose fired in none of seeds 1-400 (and one of half a segment fired at
//! once, the control).
//!
//! Outcome on 8435036: every suspicion about the arithmetic, losses, checkpoints, power cuts
//! and readers was refuted (those tests pass; on the parent f657ec2 the coverage checks fail,
//! since no reclaim record there carries more than a segment). One test fails, and is ignored as a known limit:
//! `a_writer_over_a_hot_head_with_small_segments_waits_for_at_most_24_reclaim_records`, with
//! 4- and 8-block segments a writer waits for 39 and 34 reclaim records where
//! tests/hot_head.rs's pin (64-block segments, 13 here) allows 24; it waited for 46 and 48 on
//! the parent, so the commit did not cause it (it did raise the copies the writer waits for,
//! 93 -> 667 and 275 -> 702).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Condvar, Mutex};
use tiercache_device::{BlockDevice, MonotonicClock, SimDevice};
use tiercache_engine::{Eviction, Volume, VolumeOptions};
use tiercache_format::{EntryKind, RecordHeader};

mod common;
use common::*;

// ------------------------------------------------------------------------------------------
// Geometry: what the engine derives from a log of `segments` segments of `seg` blocks
// (volume/mod.rs: `staging_limit`, `copy_forward_max`, `reclaim_reserve`).

#[derive(Clone, Copy, Debug)]
struct Geo {
    seg: u64,
    segments: u64,
}

impl Geo {
    const fn new(seg: u64, segments: u64) -> Geo {
        Geo { seg, segments }
    }
    fn log(&self) -> u64 {
        self.seg * self.segments
    }
    fn staging_limit(&self) -> u64 {
        (self.log() / 8).clamp(2, 168)
    }
    fn data_limit(&self) -> u64 {
        (self.staging_limit() * 3 / 4).max(1)
    }
    fn copy_forward_max(&self) -> u64 {
        (self.seg / 2).min(self.staging_limit())
    }
    fn reserve(&self) -> u64 {
        1 + self.copy_forward_max()
    }
}

// ------------------------------------------------------------------------------------------
// What the test wrote: flushed versions, and versions written since the last FLUSH.

#[derive(Default, Clone, Debug)]
struct Truth {
    flushed: BTreeMap<u64, u64>,
    unflushed: BTreeMap<u64, Vec<u64>>,
    /// Blocks whose only dirty copy the test rotted: they must read as lost.
    lost: BTreeSet<u64>,
}

impl Truth {
    /// What a read of `b` on the running volume must return (the newest version).
    fn newest(&self, b: u64) -> u64 {
        self.unflushed.get(&b).and_then(|v| v.last().copied()).unwrap_or(*self.flushed.get(&b).unwrap_or(&0))
    }
    /// Whether a recovered volume may return `got` for `b` after a power cut: the version last
    /// flushed, or one written since.
    fn accepts_after_cut(&self, b: u64, got: Option<u64>) -> bool {
        let want = *self.flushed.get(&b).unwrap_or(&0);
        got == Some(want) || got.is_some_and(|g| self.unflushed.get(&b).is_some_and(|vs| vs.contains(&g)))
    }
}

struct Driver {
    v: Arc<Volume>,
    truth: Arc<Mutex<Truth>>,
    next_version: u64,
}

impl Driver {
    fn new(v: &Arc<Volume>) -> Driver {
        Driver { v: Arc::clone(v), truth: Arc::new(Mutex::new(Truth::default())), next_version: 1 }
    }
    /// Blocks `first..first + n` at a new version, in one request.
    fn write(&mut self, first: u64, n: u64) -> u64 {
        let version = self.next_version;
        self.next_version += 1;
        {
            let mut t = self.truth.lock().unwrap();
            for b in first..first + n {
                t.unflushed.entry(b).or_default().push(version);
            }
        }
        self.v.write(first * BS as u64, &stamps(first, n, version)).unwrap();
        version
    }
    fn flush(&mut self) {
        self.v.flush().unwrap();
        let mut t = self.truth.lock().unwrap();
        let un = std::mem::take(&mut t.unflushed);
        for (b, vs) in un {
            t.flushed.insert(b, *vs.last().unwrap());
        }
    }
    fn read(&self, b: u64) {
        let want = self.truth.lock().unwrap().newest(b);
        assert_eq!(read_version(&self.v, b).unwrap(), Some(want), "block {b}");
    }
    /// Every block of `blocks` reads its newest version (lost ones as lost).
    fn check(&self, blocks: impl Iterator<Item = u64>, what: &str) {
        let t = self.truth.lock().unwrap().clone();
        for b in blocks {
            let r = read_version(&self.v, b);
            if t.lost.contains(&b) && !t.unflushed.contains_key(&b) {
                assert!(is_lost(&r, b), "{what}: block {b} is lost, read {r:?}");
            } else {
                assert_eq!(r.unwrap(), Some(t.newest(b)), "{what}: block {b}");
            }
        }
    }
}

// ------------------------------------------------------------------------------------------
// The tap.

#[derive(Clone, Debug)]
struct ReclaimRec {
    pos: u64,
    blocks: u64,
    old_head: u64,
    new_head: u64,
    dirty: u64,
    clean: u64,
    lost: u64,
    meta: u64,
    entries: usize,
    copied: Vec<u64>,
}

impl ReclaimRec {
    fn copies(&self) -> u64 {
        self.dirty + self.clean
    }
}

struct CrashState {
    what: String,
    cache: Vec<u8>,
    backing: Vec<u8>,
    truth: Truth,
}

struct Capture {
    /// Capture at reclaim records of more copies than this...
    min_copies: u64,
    /// ... and at least this many dirty ones.
    min_dirty: u64,
    max_states: usize,
    seed: u64,
    backing: Arc<SimDevice>,
    truth: Arc<Mutex<Truth>>,
}

#[derive(Default)]
struct TapState {
    head: u64,
    records: u64,
    reclaims: Vec<ReclaimRec>,
    violations: Vec<String>,
    capture: Option<Capture>,
    /// Writes since the last flush (for torn power-cut images).
    pending: Vec<(u64, Vec<u8>)>,
    after_flush: Option<String>,
    states: Vec<CrashState>,
    /// Hold the first reclaim record of more copies than this.
    hold_over: Option<u64>,
    held: Option<ReclaimRec>,
    open: bool,
}

struct Tap {
    inner: Arc<SimDevice>,
    geo: Geo,
    log_start: u64,
    uuid: u64,
    st: Mutex<TapState>,
    cv: Condvar,
}

impl Tap {
    fn new(inner: &Arc<SimDevice>, geo: Geo) -> Arc<Tap> {
        let (layout, uuid) = layout_of(inner);
        assert_eq!(layout.log_blocks, geo.log());
        Arc::new(Tap {
            inner: Arc::clone(inner),
            geo,
            log_start: layout.log_start,
            uuid,
            st: Mutex::new(TapState::default()),
            cv: Condvar::new(),
        })
    }

    fn reclaims(&self) -> Vec<ReclaimRec> {
        self.st.lock().unwrap().reclaims.clone()
    }

    fn assert_sound(&self, what: &str) {
        let st = self.st.lock().unwrap();
        assert!(
            st.violations.is_empty(),
            "{what}: {} violations, first: {:#?}",
            st.violations.len(),
            &st.violations[..st.violations.len().min(5)]
        );
    }

    fn capture(&self, c: Capture) {
        self.st.lock().unwrap().capture = Some(c);
    }

    fn take_states(&self) -> Vec<CrashState> {
        let mut st = self.st.lock().unwrap();
        st.capture = None;
        st.after_flush = None;
        st.pending.clear();
        std::mem::take(&mut st.states)
    }

    fn hold_over(&self, copies: u64) {
        let mut st = self.st.lock().unwrap();
        st.hold_over = Some(copies);
        st.held = None;
        st.open = false;
    }

    fn wait_held(&self) -> ReclaimRec {
        let mut st = self.st.lock().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while st.held.is_none() {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            assert!(!left.is_zero(), "no reclaim record of more than a segment of copies came");
            st = self.cv.wait_timeout(st, left).unwrap().0;
        }
        st.held.clone().unwrap()
    }

    fn release(&self) {
        let mut st = self.st.lock().unwrap();
        st.open = true;
        self.cv.notify_all();
    }

    /// Checks a reclaim record against the engine's promises, from the device's side.
    fn note_reclaim(&self, st: &mut TapState, h: &RecordHeader) -> ReclaimRec {
        let g = self.geo;
        let count = |k: EntryKind| h.entries.iter().filter(|e| e.kind == k).count() as u64;
        let copied: Vec<u64> = h
            .entries
            .iter()
            .filter(|e| matches!(e.kind, EntryKind::DataDirty | EntryKind::DataClean))
            .map(|e| e.backing_block)
            .collect();
        let r = ReclaimRec {
            pos: h.position,
            blocks: 1 + copied.len() as u64,
            old_head: st.head,
            new_head: h.head_position,
            dirty: count(EntryKind::DataDirty),
            clean: count(EntryKind::DataClean),
            lost: count(EntryKind::Lost),
            meta: count(EntryKind::MarkClean) + count(EntryKind::Trim),
            entries: h.entries.len(),
            copied,
        };
        let log = g.log();
        let mut bad = |why: String| {
            st.violations
                .push(format!("{why}: {r:?}", r = (&r.pos, r.blocks, r.old_head, r.new_head, r.dirty, r.clean)))
        };
        if r.pos + r.blocks > r.old_head + log {
            bad(format!("the record does not fit the room the old head left (log {log})"));
        }
        if r.blocks > r.new_head - r.old_head {
            bad("the record takes more room than its window frees".into());
        }
        if r.new_head + log < r.pos + r.blocks + g.reserve() {
            bad(format!("the reserve ({}) is not free after the record", g.reserve()));
        }
        if r.dirty > g.copy_forward_max() {
            bad(format!("more dirty copies than copy_forward_max ({})", g.copy_forward_max()));
        }
        if r.copies() > g.staging_limit() {
            bad(format!("more copies than staging_limit ({})", g.staging_limit()));
        }
        if r.entries > 168 {
            bad("more than 168 entries".into());
        }
        st.head = h.head_position;
        r
    }

    fn crash_image(&self, st: &TapState, offset: u64, buf: &[u8], seed: u64) -> Vec<u8> {
        let shadow = SimDevice::from_image(self.inner.durable_image(), BS as u32);
        for (o, d) in &st.pending {
            shadow.write_at(*o, d).unwrap();
        }
        shadow.write_at(offset, buf).unwrap();
        shadow.crash(seed);
        shadow.durable_image()
    }
}

impl BlockDevice for Tap {
    forward_to_inner!(inner: size_bytes, logical_block_size, read_at, discard, atomic_write_bytes);
    fn write_at(&self, offset: u64, buf: &[u8]) -> tiercache_device::Result<()> {
        let bs = BS as u64;
        let in_log = offset >= self.log_start * bs && offset < (self.log_start + self.geo.log()) * bs;
        let header = if in_log { RecordHeader::decode(&buf[..BS], self.uuid).ok() } else { None };
        {
            let mut st = self.st.lock().unwrap();
            let mut hold = false;
            if let Some(h) = header {
                st.records += 1;
                if h.head_position > st.head {
                    let r = self.note_reclaim(&mut st, &h);
                    let n = st.reclaims.len() as u64;
                    let take = st.capture.as_ref().is_some_and(|c| {
                        r.copies() > c.min_copies && r.dirty >= c.min_dirty && st.states.len() < c.max_states
                    });
                    if take {
                        let c = st.capture.as_ref().unwrap();
                        let (seed, truth, backing) =
                            (c.seed, c.truth.lock().unwrap().clone(), c.backing.durable_image());
                        let cache = self.crash_image(&st, offset, buf, seed ^ n);
                        let what = format!(
                            "reclaim record {n} at {} ({} dirty + {} clean copies, head {} -> {})",
                            r.pos, r.dirty, r.clean, r.old_head, r.new_head
                        );
                        st.states.push(CrashState {
                            what: format!("{what}, cut during its write"),
                            cache,
                            backing,
                            truth,
                        });
                        st.after_flush = Some(format!("{what}, cut after its flush"));
                    }
                    if st.hold_over.is_some_and(|over| r.copies() > over) {
                        st.hold_over = None;
                        st.held = Some(r.clone());
                        hold = true;
                        self.cv.notify_all();
                    }
                    st.reclaims.push(r);
                } else if h.head_position < st.head {
                    let why = format!("record at {} carries head {} behind {}", h.position, h.head_position, st.head);
                    st.violations.push(why);
                }
            }
            if st.capture.is_some() {
                st.pending.push((offset, buf.to_vec()));
            }
            while hold && !st.open {
                st = self.cv.wait(st).unwrap();
            }
        }
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> tiercache_device::Result<()> {
        let r = self.inner.flush();
        let mut st = self.st.lock().unwrap();
        st.pending.clear();
        if let Some(what) = st.after_flush.take() {
            if r.is_ok() {
                let c = st.capture.as_ref().unwrap();
                let (truth, backing) = (c.truth.lock().unwrap().clone(), c.backing.durable_image());
                let cache = self.inner.durable_image();
                st.states.push(CrashState { what, cache, backing, truth });
            }
        }
        r
    }
    fn describe(&self) -> String {
        format!("tap:{}", self.inner.describe())
    }
}

fn options() -> VolumeOptions {
    VolumeOptions { sequential_bypass_bytes: 0, ..VolumeOptions::default() }
}

/// A fresh volume (log only) of `geo`, its cache device behind a `Tap`, on a backing device of
/// `backing_blocks` blocks stamped version 0.
fn tapped(
    geo: Geo,
    backing_blocks: u64,
    opts: VolumeOptions,
) -> (Arc<SimDevice>, Arc<SimDevice>, Arc<Tap>, Arc<Volume>) {
    let (cache, backing) = devices_seg(geo.segments, geo.seg as u32, backing_blocks, log_only());
    let tap = Tap::new(&cache, geo);
    let c: Arc<dyn BlockDevice> = tap.clone();
    let b: Arc<dyn BlockDevice> = backing.clone();
    let v = Arc::new(Volume::open(c, b, Arc::new(MonotonicClock::new()), opts).expect("open").0);
    assert_eq!(v.superblock().layout.log_blocks, geo.log());
    tap.st.lock().unwrap().head = v.log_window().0;
    (cache, backing, tap, v)
}

fn assert_reserve(v: &Volume, geo: Geo, what: &str) {
    let (head, ck, tail) = v.log_window();
    assert!(
        head + geo.log() >= tail + geo.reserve(),
        "{what}: head {head} tail {tail}: the reserve {} is not free",
        geo.reserve()
    );
    assert!(head <= ck && ck <= tail, "{what}: head {head} checkpoint {ck} tail {tail}");
}

/// Recovers each power-cut image and checks every block of `universe` against what was
/// flushed when it was taken.
fn verify_states(states: Vec<CrashState>, universe: &[u64], opts: impl Fn() -> VolumeOptions) -> usize {
    let n = states.len();
    for s in states {
        let c: Arc<dyn BlockDevice> = Arc::new(SimDevice::from_image(s.cache, BS as u32));
        let b: Arc<dyn BlockDevice> = Arc::new(SimDevice::from_image(s.backing, BS as u32));
        let v = Volume::open(c, b, Arc::new(MonotonicClock::new()), opts())
            .unwrap_or_else(|e| panic!("{}: recovery failed: {e}", s.what))
            .0;
        for &b in universe {
            let r = read_version(&v, b);
            if s.truth.lost.contains(&b) {
                continue;
            }
            let got = r.unwrap_or_else(|e| panic!("{}: block {b}: {e}", s.what));
            assert!(
                s.truth.accepts_after_cut(b, got),
                "{}: block {b} read {got:?}, flushed {:?}, written since {:?}",
                s.what,
                s.truth.flushed.get(&b),
                s.truth.unflushed.get(&b)
            );
        }
    }
    n
}

/// A permutation of `0..n` (a scattered order: no sequential stream).
fn shuffled(n: u64, rng: &mut ChaCha8Rng) -> Vec<u64> {
    let mut v: Vec<u64> = (0..n).collect();
    for i in (1..v.len()).rev() {
        let j = rng.gen_range(0..=i);
        v.swap(i, j);
    }
    v
}

/// Base of the hot set (clear of the backing device's fingerprint blocks 0, 1 and 16).
const HOT_BASE: u64 = 100;

/// Fills the log with a hot set of `hot` blocks read twice (counts at one), one block in
/// `dirty_every` of them rewritten in between (dirty blocks among the kept ones; 0: none),
/// then FLUSH. Returns the hot blocks.
fn hot_head(d: &mut Driver, hot: u64, dirty_every: u64, rng: &mut ChaCha8Rng) -> Vec<u64> {
    hot_head_at(d, HOT_BASE, hot, dirty_every, rng)
}

/// `hot_head` for the blocks from `base`.
fn hot_head_at(d: &mut Driver, base: u64, hot: u64, dirty_every: u64, rng: &mut ChaCha8Rng) -> Vec<u64> {
    let order = shuffled(hot, rng);
    let blocks: Vec<u64> = order.iter().map(|i| base + i).collect();
    for (k, &b) in blocks.iter().enumerate() {
        if dirty_every > 0 && k as u64 % dirty_every == dirty_every - 1 {
            d.write(b, 1);
        } else {
            d.read(b);
        }
    }
    for &b in &blocks {
        d.read(b);
    }
    // (A FLUSH writes no record of clean fills alone: a written block takes them out.)
    d.write(base + hot + 8, 1);
    d.flush();
    blocks
}

// ------------------------------------------------------------------------------------------
// 1. The arithmetic, over every small layout.

/// The churn's summary.
#[derive(Debug, Default)]
struct Churn {
    reclaims: usize,
    over_a_segment: usize,
    max_copies: u64,
    min_free_before: u64,
    at_reserve: usize,
    /// The least a reclaim's window freed beyond its record, over the records of more
    /// copies than a segment (None: there were none).
    min_slack_over_a_segment: Option<u64>,
}

/// A seeded mix over a hot head: read misses (no writer waiting), re-reads of the hot set,
/// writes of one block to a record's data (hot blocks rewritten among them), FLUSHes; the
/// reserve checked after every request, the data every lap.
fn churn(geo: Geo, seed: u64, opts: VolumeOptions) -> Churn {
    let log = geo.log();
    let backing_blocks = 8192u64.max(4 * log + 4096);
    let (_cache, _backing, tap, v) = tapped(geo, backing_blocks, opts);
    let mut d = Driver::new(&v);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let hot = (log * 5 / 8).max(4);
    let hot_blocks = hot_head(&mut d, hot, 20, &mut rng);
    let cold_base = HOT_BASE + hot + 64;
    let cold_end = backing_blocks - 8;
    let mut written: BTreeSet<u64> = hot_blocks.iter().copied().collect();
    for op in 0..6 * log {
        let what = format!("{geo:?} seed {seed} op {op}");
        match rng.gen_range(0..100u32) {
            0..=29 => {
                let b = rng.gen_range(cold_base..cold_end);
                d.read(b);
            }
            30..=59 => {
                let b = hot_blocks[rng.gen_range(0..hot_blocks.len())];
                d.read(b);
            }
            60..=69 => {
                let b = if rng.gen_bool(0.5) {
                    hot_blocks[rng.gen_range(0..hot_blocks.len())]
                } else {
                    rng.gen_range(cold_base..cold_end)
                };
                d.write(b, 1);
                written.insert(b);
            }
            70..=81 => {
                // (Half of them a whole record's data: a writer's reclaim then needs a whole
                // record of room, the widest windows.)
                let n = if rng.gen_bool(0.5) {
                    geo.data_limit().max(2)
                } else {
                    rng.gen_range(2..=geo.data_limit().max(2))
                };
                let b = rng.gen_range(cold_base..cold_end - n);
                d.write(b, n);
                written.extend(b..b + n);
            }
            82..=89 => d.flush(),
            _ => {
                let n = rng.gen_range(2..=8u64);
                let b = rng.gen_range(cold_base..cold_end - n);
                let mut buf = vec![0u8; n as usize * BS];
                v.read(b * BS as u64, &mut buf).unwrap();
                let t = d.truth.lock().unwrap();
                for i in 0..n {
                    let got = tiercache_sim::stamp::version_of(b + i, &buf[i as usize * BS..(i as usize + 1) * BS]);
                    assert_eq!(got, Some(t.newest(b + i)), "{what}: block {}", b + i);
                }
            }
        }
        assert_reserve(&v, geo, &what);
        if op % log == log - 1 {
            d.check(written.iter().copied(), &what);
        }
    }
    d.flush();
    d.check(written.iter().copied(), &format!("{geo:?} seed {seed} at the end"));
    tap.assert_sound(&format!("{geo:?} seed {seed}"));
    let reclaims = tap.reclaims();
    let mut c = Churn { reclaims: reclaims.len(), min_free_before: u64::MAX, ..Churn::default() };
    for r in &reclaims {
        let free_before = r.old_head + log - r.pos;
        c.min_free_before = c.min_free_before.min(free_before);
        c.at_reserve += usize::from(free_before <= geo.reserve() + 2);
        c.max_copies = c.max_copies.max(r.copies());
        c.over_a_segment += usize::from(r.copies() > geo.seg);
        if r.copies() > geo.seg {
            let slack = r.new_head - r.old_head - r.blocks;
            c.min_slack_over_a_segment = Some(c.min_slack_over_a_segment.map_or(slack, |m| m.min(slack)));
        }
    }
    c
}

/// REFUTED (expected to pass): with copies no longer bounded by a segment, every arithmetic
/// bound of `reclaim` (`window_room`, `copies_max` against `free - 2`, `reinsertions`' `fits`
/// and `min_progress`, the `copies_max - dirty` subtraction) keeps each reclaim record inside
/// the room the head left, no larger than its window, with the writer's reserve free after
/// it, in every small layout: 8 segments of 4 or 8 blocks (logs of exactly 8 records, where
/// `staging_limit` equals a segment), 16 (twice a segment), 17 and more segments (where a
/// record may now carry more copies than a segment), up to 256 segments of 4. Checked from
/// the device (the tap), after every request (`log_window`), and by the engine's own asserts
/// (`check_invariants`, the seal's fit, overflow checks in release). Each layout where the
/// reach argument allows it must actually write reclaim records of more copies than a
/// segment, and the small layouts must reclaim at a free room within 2 blocks of the reserve.
#[test]
fn every_small_layout_keeps_the_reserve_and_fits_each_reclaim_record_in_its_window() {
    let layouts = [
        Geo::new(4, 8),
        Geo::new(4, 16),
        Geo::new(4, 17),
        Geo::new(4, 24),
        Geo::new(4, 33),
        Geo::new(4, 64),
        Geo::new(4, 256),
        Geo::new(8, 8),
        Geo::new(8, 16),
        Geo::new(8, 17),
        Geo::new(8, 24),
        Geo::new(8, 40),
        Geo::new(8, 128),
        Geo::new(8, 168),
        Geo::new(16, 24),
        Geo::new(16, 40),
        Geo::new(16, 128),
    ];
    let mut near_reserve = 0;
    let mut missing = Vec::new();
    for geo in layouts {
        for seed in [1u64, 2] {
            let c = churn(geo, seed, options());
            eprintln!("{geo:?} seed {seed}: staging_limit {} reserve {}: {c:?}", geo.staging_limit(), geo.reserve());
            assert!(c.reclaims > 0, "{geo:?}: the churn reclaims");
            // (Where a record is at least five segments, the churn must reach the new regime.)
            if geo.staging_limit() >= 5 * geo.seg && c.over_a_segment == 0 {
                missing.push(format!("{geo:?} seed {seed}"));
            }
            assert!(c.max_copies <= geo.staging_limit());
            near_reserve += c.at_reserve;
        }
    }
    assert!(missing.is_empty(), "no reclaim record of more than a segment of copies in {missing:?}");
    assert!(near_reserve > 0, "no reclaim ran with the free room within 2 blocks of the reserve");
}

/// REFUTED (expected to pass): the same churn with the plain reinsertion policy and with
/// checkpoints only when reclaim needs one (`checkpoint_interval_permille` 1000: the head
/// reaches the checkpoint position at almost every lap, so `reclaim` checkpoints before its
/// window, with a window of more copies than a segment near the checkpoint position). The
/// engine asserts `head <= checkpoint` and `target <= checkpoint`; the test checks it after
/// every request.
#[test]
fn rare_checkpoints_and_plain_reinsertion_keep_the_head_behind_the_checkpoint() {
    for geo in [Geo::new(4, 64), Geo::new(8, 128)] {
        let opts = || VolumeOptions { checkpoint_interval_permille: 1000, eviction: Eviction::Reinsert, ..options() };
        let c = churn(geo, 7, opts());
        eprintln!("{geo:?} (rare checkpoints, reinsert): {c:?}");
        assert!(c.over_a_segment > 0, "{geo:?}: no reclaim record carried more than a segment of copies");
    }
}

// ------------------------------------------------------------------------------------------
// 2. Losses and queued metadata in a reclaim record of many copies.

/// REFUTED (expected to pass): a reclaim record of many more copies than a segment that must
/// also carry Lost entries (rotten dirty copies, declared lost by the reclaim that reads
/// them or by its write-back) and queued MarkClean entries (a write-back of 200 blocks just
/// before, more than the writer's record takes) stays within 168 entries and
/// `MAX_RECORD_BLOCKS` (the encoder, the io buffer and the loss truncation would panic or
/// drop a loss otherwise); and after a power cut every rotten block reads as lost (never the
/// stale backing copy) while every other block reads its flushed version. A log of 256
/// segments of 8 blocks: `staging_limit` 168, records of 126 data blocks, reserve 5; the
/// writer's first reclaim finds 47 blocks free. (On 8435036 its record carries 43 clean
/// copies, 2 Lost and 123 MarkClean entries: exactly 168; the next 39 copies, 1 Lost, 35
/// MarkClean; all rotten blocks read lost after the cut.)
#[test]
fn a_reclaim_record_of_many_copies_carries_its_losses_and_queued_mark_cleans() {
    let geo = Geo::new(8, 256);
    let log = geo.log();
    let data = geo.data_limit();
    let (cache, backing, tap, v) = tapped(geo, 16_384, options());
    let mut d = Driver::new(&v);
    let mut rng = ChaCha8Rng::seed_from_u64(11);
    const BASE: u64 = 1_000;
    let hot = log * 5 / 8;
    // (One block in 32 dirty: the writer's first window, 85 blocks, stays below
    // `copy_forward_max` dirty blocks, so it is not cut to a dense window's four copies.)
    let hot_blocks = hot_head_at(&mut d, BASE, hot, 32, &mut rng);
    // Four records of read misses, then 200 scratch blocks written and flushed (two records):
    // about 47 blocks free.
    let misses = |n: u64| 4_000 + 2 * n;
    read_once(&v, (0..4 * data).map(misses));
    const SCRATCH: u64 = 300;
    d.write(SCRATCH, 200);
    d.flush();
    let (head, _, tail) = v.log_window();
    eprintln!("free before the writer: {}", head + log - tail);
    // Write the scratch blocks back (the elevator starts at the lowest addresses): 200
    // MarkClean entries queued.
    let mut written_back = 0;
    while dirty_blocks(&v).iter().any(|&b| (SCRATCH..SCRATCH + 200).contains(&b)) {
        written_back += v.destage_step(200).unwrap();
    }
    assert!(dirty_blocks(&v).iter().any(|&b| b >= BASE), "the hot set's dirty blocks are still dirty");
    // Rot the hot set's dirty blocks near the head: reclaim reads them rotten.
    let layout = v.superblock().layout;
    let rotten: Vec<u64> = v
        .index_snapshot()
        .into_iter()
        .filter(|(b, e)| e.dirty && *b >= BASE)
        .filter(|(_, e)| (u64::from(e.slot) + log - u64::from(layout.slot(head))) % log < 400)
        .map(|(b, _)| b)
        .collect();
    assert!(rotten.len() >= 8, "dirty blocks to rot: {}", rotten.len());
    for &b in &rotten {
        corrupt_cached_block(&cache, &v, b);
        d.truth.lock().unwrap().lost.insert(b);
    }
    eprintln!("{written_back} written back, {} rotted", rotten.len());
    // Writes of whole records of new blocks, each flushed: the head passes the hot set.
    let cold_base = 8_000;
    for k in 0..8 {
        d.write(cold_base + k * data, data);
        d.flush();
    }
    tap.assert_sound("losses");
    let reclaims = tap.reclaims();
    let big: Vec<&ReclaimRec> = reclaims.iter().filter(|r| r.copies() > geo.seg).collect();
    let with_losses = big.iter().filter(|r| r.lost > 0).count();
    let with_meta = big.iter().filter(|r| r.meta > 0).count();
    let max_entries = reclaims.iter().map(|r| r.entries).max().unwrap_or(0);
    eprintln!(
        "{} reclaims, {} of more than a segment of copies ({} with losses, {} with MarkCleans), max {} entries, max {} copies",
        reclaims.len(),
        big.len(),
        with_losses,
        with_meta,
        max_entries,
        reclaims.iter().map(|r| r.copies()).max().unwrap_or(0)
    );
    for r in big.iter().take(12) {
        eprintln!(
            "  head {} -> {}: {} dirty + {} clean copies, {} lost, {} MarkClean/Trim, {} entries",
            r.old_head, r.new_head, r.dirty, r.clean, r.lost, r.meta, r.entries
        );
    }
    assert!(with_losses > 0, "a reclaim record of more than a segment of copies carried Lost entries");
    assert!(with_meta > 0, "a reclaim record of more than a segment of copies carried MarkClean entries");
    let universe: Vec<u64> =
        hot_blocks.iter().copied().chain(SCRATCH..SCRATCH + 200).chain(cold_base..cold_base + 8 * data).collect();
    // Power cut.
    let c: Arc<dyn BlockDevice> = durable_copy(&cache);
    let b: Arc<dyn BlockDevice> = durable_copy(&backing);
    let r = Volume::open(c, b, Arc::new(MonotonicClock::new()), options()).expect("recovery").0;
    let t = d.truth.lock().unwrap().clone();
    for &b in &universe {
        let got = read_version(&r, b);
        if rotten.contains(&b) {
            // (A rotten block the head has not reached is still cached rotten: the read finds
            // it so and declares it lost then; either way never the stale backing copy.)
            assert!(is_lost(&got, b), "rotten dirty block {b} after the cut: {got:?}");
        } else {
            assert_eq!(got.unwrap(), Some(t.newest(b)), "after the cut: block {b}");
        }
    }
    // And the volume that was cut reads the same.
    d.check(universe.iter().copied(), "the running volume");
}

/// Read misses (whole records of them, from `cold_base`, every other block), then a writer's
/// record of the rest, until half a writer's need (`1 + data + reserve`) is free: a writer's
/// record then waits for reclaims that find room for about that many copies each over a hot
/// head (tests/hot_head.rs's shape), the most a reclaim record can carry. Returns the first
/// block after those used.
fn fill_to_half_a_need(d: &mut Driver, geo: Geo, cold_base: u64) -> u64 {
    let log = geo.log();
    let target = (1 + geo.data_limit() + geo.reserve()) / 2;
    let (head, _, tail) = d.v.log_window();
    let room = head + log - tail;
    let misses = (room - target) / (geo.data_limit() + 1) * geo.data_limit();
    for k in 0..misses {
        d.read(cold_base + 2 * k);
    }
    // (A FLUSH writes no record of clean fills alone: whole records of misses, then a
    // writer's record of the rest.)
    let (head, _, tail) = d.v.log_window();
    let spacer = (head + log - tail).saturating_sub(target + 1);
    if spacer > 0 {
        d.write(cold_base + 2 * misses, spacer);
        d.flush();
    }
    let (head, _, tail) = d.v.log_window();
    assert_eq!(head + log - tail, target, "free before the writer");
    cold_base + 2 * misses + spacer
}

// ------------------------------------------------------------------------------------------
// 3. Power cuts at reclaim records of more than a segment of copies.

/// Writers and readers over a hot head with dirty blocks among the kept ones; power-cut
/// images captured at every reclaim record of more than a segment of copies (up to
/// `max_states`), each recovered and checked.
fn power_cuts(geo: Geo, seed: u64, opts: fn() -> VolumeOptions) {
    let log = geo.log();
    let (_cache, backing, tap, v) = tapped(geo, 4096, opts());
    let mut d = Driver::new(&v);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let hot = log * 5 / 8;
    // (One block in 24 dirty: a writer's window holds a few, below `copy_forward_max`.)
    let hot_blocks = hot_head(&mut d, hot, 24, &mut rng);
    tap.capture(Capture {
        min_copies: geo.seg,
        min_dirty: 1,
        max_states: 40,
        seed,
        backing: Arc::clone(&backing),
        truth: Arc::clone(&d.truth),
    });
    let cold_base = HOT_BASE + hot + 64;
    let cold_end = 4096 - 8;
    // Half a writer's need free, then a writer's whole record: its reclaims find room for
    // about that many copies each over the hot head, the most a reclaim record can carry.
    let first = fill_to_half_a_need(&mut d, geo, cold_base);
    d.write(first, geo.data_limit());
    d.flush();
    for round in 0..3 * log / geo.data_limit() {
        // A writer's request (a record's worth or less), hot blocks rewritten now and then, a
        // FLUSH; then read misses and re-reads (reclaims without a writer).
        let n = rng.gen_range(1..=geo.data_limit());
        let b = rng.gen_range(cold_base..cold_end - n);
        d.write(b, n);
        for _ in 0..rng.gen_range(0..4) {
            let h = hot_blocks[rng.gen_range(0..hot_blocks.len())];
            d.write(h, 1);
        }
        if round % 3 != 2 {
            d.flush();
        }
        for _ in 0..geo.data_limit() / 2 {
            if rng.gen_bool(0.5) {
                d.read(rng.gen_range(cold_base..cold_end));
            } else {
                d.read(hot_blocks[rng.gen_range(0..hot_blocks.len())]);
            }
        }
    }
    d.flush();
    tap.assert_sound("power cuts");
    let reclaims = tap.reclaims();
    let big_dirty = reclaims.iter().filter(|r| r.copies() > geo.seg && r.dirty > 0).count();
    let states = tap.take_states();
    eprintln!(
        "{geo:?} seed {seed}: {} reclaims, {} of more than a segment with dirty copies, max copies {}, {} power-cut images",
        reclaims.len(),
        big_dirty,
        reclaims.iter().map(|r| r.copies()).max().unwrap_or(0),
        states.len()
    );
    assert!(big_dirty > 0, "no reclaim record of more than a segment carried dirty copies");
    assert!(states.len() >= 8, "power-cut images: {}", states.len());
    for s in states.iter().step_by(2).take(6) {
        eprintln!("  cut at {}", s.what);
    }
    let universe: Vec<u64> = (HOT_BASE..cold_end).collect();
    verify_states(states, &universe, opts);
    d.check(universe.iter().copied(), "the running volume at the end");
}

/// REFUTED (expected to pass): a power cut during the write of a reclaim record that carries
/// more than a segment of copies, dirty ones among them (torn among the writes not yet
/// flushed, as `SimDevice::crash` tears), or just after its flush, recovers every flushed
/// block at its flushed version (a block written since may read either). 8-block segments
/// (records of 96 data blocks) and 4-block segments (records of 48).
#[test]
fn power_cuts_at_reclaim_records_of_more_than_a_segment_recover_every_flushed_block() {
    power_cuts(Geo::new(8, 128), 21, options);
    power_cuts(Geo::new(4, 128), 22, options);
}

/// REFUTED (expected to pass): the same with checkpoints only when reclaim needs one: the
/// reclaim records cut at are then replayed from a checkpoint far behind, next to the
/// checkpoint `reclaim` takes when its window would pass the last one.
#[test]
fn power_cuts_with_rare_checkpoints_recover_every_flushed_block() {
    fn rare() -> VolumeOptions {
        VolumeOptions { checkpoint_interval_permille: 1000, ..options() }
    }
    power_cuts(Geo::new(8, 128), 23, rare);
}

// ------------------------------------------------------------------------------------------
// 4. Readers of blocks being copied.

/// REFUTED (expected to pass): while a reclaim record of more than a segment of copies is
/// being written (held at its write, the io lock held), readers hit every block it copies at
/// its old slot (confirmed under the lock) and read the right data; a TRIM of two copied
/// clean blocks lands at once and a rewrite of a copied block waits (staging is full); once it
/// is let go, readers keep reading while the copies move to their new slots, and a power cut
/// afterwards recovers the flushed data (the TRIMmed blocks, clean, read their backing copy).
/// (On 8435036 the held record carries 4 dirty and 43 clean copies.)
#[test]
fn readers_hit_the_blocks_a_large_reclaim_record_copies() {
    let geo = Geo::new(8, 128);
    let log = geo.log();
    let (cache, backing, tap, v) = tapped(geo, 4096, options());
    let mut d = Driver::new(&v);
    let mut rng = ChaCha8Rng::seed_from_u64(31);
    let hot = log * 5 / 8;
    let hot_blocks = hot_head(&mut d, hot, 12, &mut rng);
    let cold_base = HOT_BASE + hot + 64;
    // Half a writer's need free, then a writer's record: its first reclaim record carries
    // about 45 copies.
    let writer_first = fill_to_half_a_need(&mut d, geo, cold_base) + 10;
    tap.hold_over(geo.seg);
    let truth = d.truth.lock().unwrap().clone();
    let writer = on_thread(&v, move |v| {
        v.write(writer_first * BS as u64, &stamps(writer_first, 96, 77)).unwrap();
        v.flush().unwrap();
    });
    let held = tap.wait_held();
    eprintln!(
        "held reclaim record: {} dirty + {} clean copies, head {} -> {}",
        held.dirty, held.clean, held.old_head, held.new_head
    );
    assert!(held.copies() > geo.seg);
    // Readers of every copied block and of the whole hot set, while the record is held.
    let readers: Vec<_> = (0..3)
        .map(|k| {
            let t = truth.clone();
            let mut blocks = held.copied.clone();
            blocks.extend(hot_blocks.iter().copied());
            on_thread(&v, move |v| {
                for (i, &b) in blocks.iter().enumerate() {
                    if (i + k) % 3 == 0 || i < 64 {
                        assert_eq!(read_version(v, b).unwrap(), Some(t.newest(b)), "held: block {b}");
                    }
                }
            })
        })
        .collect();
    for r in readers {
        r.join().expect("a reader while the reclaim record is held");
    }
    // A TRIM of two copied clean blocks and a rewrite of a copied block, while held.
    let clean_copied: Vec<u64> = held
        .copied
        .iter()
        .copied()
        .filter(|b| !truth.flushed.contains_key(b) && !truth.unflushed.contains_key(b))
        .collect();
    assert!(clean_copied.len() >= 3);
    v.discard(clean_copied[0] * BS as u64, BS as u64).unwrap();
    v.discard(clean_copied[1] * BS as u64, BS as u64).unwrap();
    let rewritten = clean_copied[2];
    let rewriter = on_thread(&v, move |v| {
        v.write(rewritten * BS as u64, &stamp(rewritten, 78)).unwrap();
        v.flush().unwrap();
    });
    // Readers running through the release.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let spinning: Vec<_> = (0..2)
        .map(|k| {
            let t = truth.clone();
            let blocks = held.copied.clone();
            let stop = Arc::clone(&stop);
            on_thread(&v, move |v| {
                let mut passes = 0;
                while !stop.load(std::sync::atomic::Ordering::SeqCst) || passes == 0 {
                    for &b in blocks.iter().skip(k) {
                        if b == rewritten {
                            continue;
                        }
                        assert_eq!(read_version(v, b).unwrap(), Some(t.newest(b)), "released: block {b}");
                    }
                    passes += 1;
                }
                passes
            })
        })
        .collect();
    std::thread::sleep(std::time::Duration::from_millis(50));
    tap.release();
    join_within_secs(writer, 60, "the writer");
    join_within_secs(rewriter, 60, "the rewriter");
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    for s in spinning {
        let passes = join_within_secs(s, 60, "a spinning reader");
        assert!(passes > 0);
    }
    tap.assert_sound("readers");
    assert_eq!(read_version(&v, rewritten).unwrap(), Some(78));
    for b in writer_first..writer_first + 96 {
        assert_eq!(read_version(&v, b).unwrap(), Some(77), "block {b}");
    }
    d.check(hot_blocks.iter().copied().filter(|&b| b != rewritten), "after the release");
    // Power cut.
    let r = Volume::open(durable_copy(&cache), durable_copy(&backing), Arc::new(MonotonicClock::new()), options())
        .expect("recovery")
        .0;
    assert_eq!(read_version(&r, rewritten).unwrap(), Some(78));
    for &b in hot_blocks.iter().filter(|&&b| b != rewritten) {
        assert_eq!(read_version(&r, b).unwrap(), Some(truth.newest(b)), "after the cut: block {b}");
    }
    for b in writer_first..writer_first + 96 {
        assert_eq!(read_version(&r, b).unwrap(), Some(77), "after the cut: block {b}");
    }
}

/// REFUTED (expected to pass): a TRIM of a clean block a large reclaim record carries (held at
/// its write: the copy is in the sealed record, the seal's `drop_stale_reinsertions` came
/// before the TRIM), then a write-around of it, FLUSH, power cut: recovery must not bring the
/// reinserted clean copy back over the written-around data (the block is `resurrectable`
/// until the head passes the copy; 9d61be1's review found this with small records). Also a
/// copied clean block written around with no TRIM. Read misses make the room here (no writer
/// waits: `min_progress` 1; the held record carries 48 clean copies), writes of two blocks or
/// more may go around, on a backing device that never tears a block. (On 8435036 neither
/// write goes around: a block with a clean copy on the log, or resurrectable, is refused and
/// written through the cache, so the resurrection cannot arise; the test pins the outcome.)
#[test]
fn a_block_trimmed_and_written_around_under_a_large_reclaim_record_is_not_resurrected() {
    use common::holds::{atomic_backing, wa_options};
    let geo = Geo::new(8, 128);
    let log = geo.log();
    let ck = tiercache_format::Layout::checkpoint_blocks_for(log, BS as u32);
    let cache = Arc::new(SimDevice::new((2 + 2 * ck + log) * BS as u64, BS as u32).with_name("cache"));
    let backing = Arc::new(atomic_backing(stamps(0, 4096, 0)));
    tiercache_engine::create(&*cache, &*backing, &tiercache_engine::CreateOptions { segment_blocks: 8, ..log_only() })
        .expect("create");
    let opts = || VolumeOptions { sequential_bypass_bytes: 0, ..wa_options() };
    let tap = Tap::new(&cache, geo);
    let c: Arc<dyn BlockDevice> = tap.clone();
    let b: Arc<dyn BlockDevice> = backing.clone();
    let v = Arc::new(Volume::open(c, b, Arc::new(MonotonicClock::new()), opts()).expect("open").0);
    let mut d = Driver::new(&v);
    let mut rng = ChaCha8Rng::seed_from_u64(41);
    let hot = log * 5 / 8;
    // (Single-block writes: they go through the cache.)
    let hot_blocks = hot_head(&mut d, hot, 0, &mut rng);
    let cold_base = HOT_BASE + hot + 64;
    // Whole records of misses, then single-block writes, until half a record's need is free:
    // the next record of misses waits for reclaims of about 45 copies each.
    let target = (1 + geo.data_limit() + geo.reserve()) / 2;
    let (head, _, tail) = v.log_window();
    let misses = (head + log - tail - target) / (geo.data_limit() + 1) * geo.data_limit();
    read_once(&v, (0..misses).map(|k| cold_base + 2 * k));
    let (head, _, tail) = v.log_window();
    let spacer = (head + log - tail).saturating_sub(target + 1);
    for k in 0..spacer {
        d.write(cold_base + 2 * misses + 2 * k, 1);
    }
    d.flush();
    let (head, _, tail) = v.log_window();
    assert_eq!(head + log - tail, target, "free before the misses");
    tap.hold_over(geo.seg);
    let next = cold_base + 2 * misses + 2 * spacer + 10;
    let reader = on_thread(&v, move |v| read_once(v, (0..geo.data_limit()).map(|k| next + 2 * k)));
    let held = tap.wait_held();
    eprintln!("held: {} dirty + {} clean copies, head {} -> {}", held.dirty, held.clean, held.old_head, held.new_head);
    let truth = d.truth.lock().unwrap().clone();
    let victim = *held
        .copied
        .iter()
        .find(|&&b| {
            !truth.flushed.contains_key(&b) && !truth.flushed.contains_key(&(b + 1)) && hot_blocks.contains(&(b + 1))
        })
        .expect("a clean copy whose next block is clean and hot");
    v.discard(victim * BS as u64, BS as u64).unwrap();
    let around = on_thread(&v, move |v| {
        v.write(victim * BS as u64, &stamps(victim, 2, 99)).unwrap();
        v.flush().unwrap();
    });
    // And a copied clean block written around with no TRIM before (the write-around itself
    // drops the cached copy the sealed record carries).
    let victim2 = *held
        .copied
        .iter()
        .find(|&&b| {
            b > victim + 2
                && !truth.flushed.contains_key(&b)
                && !truth.flushed.contains_key(&(b + 1))
                && hot_blocks.contains(&(b + 1))
        })
        .expect("a second clean copy");
    let before_around = v.status().counters.written_around_blocks;
    // (On a thread: it may wait for the reclaim under way.)
    let flush2 = on_thread(&v, move |v| {
        v.write(victim2 * BS as u64, &stamps(victim2, 2, 98)).unwrap();
        v.flush().unwrap();
    });
    std::thread::sleep(std::time::Duration::from_millis(100));
    let went_around = v.status().counters.written_around_blocks - before_around;
    eprintln!(
        "victim2 {victim2}: {went_around} blocks written around while the reclaim record was held (its FLUSH done: {})",
        flush2.is_finished()
    );
    std::thread::sleep(std::time::Duration::from_millis(100));
    tap.release();
    join_within_secs(reader, 60, "the reader");
    join_within_secs(around, 60, "the write-around");
    join_within_secs(flush2, 60, "the second FLUSH");
    tap.assert_sound("write-around");
    // (The engine sends the write through the cache while the block is resurrectable.)
    eprintln!("written around: {} blocks", v.status().counters.written_around_blocks);
    assert_eq!(read_version(&v, victim).unwrap(), Some(99));
    assert_eq!(read_version(&v, victim + 1).unwrap(), Some(99));
    assert_eq!(read_version(&v, victim2).unwrap(), Some(98));
    // Power cut.
    let r = Volume::open(
        durable_copy(&cache),
        Arc::new(atomic_backing(backing.durable_image())),
        Arc::new(MonotonicClock::new()),
        opts(),
    )
    .expect("recovery")
    .0;
    assert_eq!(read_version(&r, victim).unwrap(), Some(99), "the trimmed, written-around block after the cut");
    assert_eq!(read_version(&r, victim + 1).unwrap(), Some(99));
    assert_eq!(
        read_version(&r, victim2).unwrap(),
        Some(98),
        "the block written around under the held record, after the cut"
    );
    assert_eq!(read_version(&r, victim2 + 1).unwrap(), Some(98));
}

fn join_within_secs<T>(h: std::thread::JoinHandle<T>, secs: u64, what: &str) -> T {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while !h.is_finished() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(h.is_finished(), "{what}: not done within {secs} s (deadlock?)");
    h.join().unwrap_or_else(|_| panic!("{what}: panicked"))
}

// ------------------------------------------------------------------------------------------
// 5. A writer over a hot head, small segments.

/// tests/hot_head.rs's rig with segments of `seg` blocks: a log of 1,024 blocks whose first
/// eight records (768 blocks) were read twice, two records of read misses after them; then one
/// writer's record of 96 blocks and a FLUSH. Returns (reclaim records the writer waited for,
/// clean copies they made, hot blocks evicted, copies the third record of misses made on a
/// twin volume).
fn writer_over_a_hot_head(seg: u64) -> (u64, u64, u64, u64) {
    const HOT: u64 = 768;
    const RECORD_DATA: u64 = 96;
    let geo = Geo::new(seg, 1024 / seg);
    let cold = |n: u64| 2_000 + (n * 7) % 14_000;
    let hot_order = || (0..HOT).map(|i| i * 7 % HOT);
    let rig = || {
        let (_c, _b, tap, v) = tapped(geo, 16_384, options());
        read_once(&v, hot_order());
        read_once(&v, hot_order());
        read_once(&v, (0..2 * RECORD_DATA).map(cold));
        (tap, v)
    };
    let (_tap, misses) = rig();
    let base = misses.status().counters.reinserted_blocks;
    read_once(&misses, (2 * RECORD_DATA..3 * RECORD_DATA).map(cold));
    let by_misses = misses.status().counters.reinserted_blocks - base;

    let (tap, v) = rig();
    let before = (v.status().counters.reinserted_blocks, tap.reclaims().len());
    v.write(cold(10_000) * BS as u64, &stamps(cold(10_000), RECORD_DATA, 1)).unwrap();
    v.flush().unwrap();
    tap.assert_sound("writer over a hot head");
    let reclaims = tap.reclaims();
    let waited = (reclaims.len() - before.1) as u64;
    let copies = v.status().counters.reinserted_blocks - before.0;
    let cached_hot = v.index_snapshot().iter().filter(|(b, _)| *b < HOT).count() as u64;
    let sizes: Vec<u64> = reclaims[before.1..].iter().map(|r| r.copies()).collect();
    eprintln!(
        "segments of {seg}: the writer waited for {waited} reclaim records, {copies} copies ({sizes:?}), {} hot evicted; misses' record: {by_misses} copies",
        HOT - cached_hot
    );
    for b in 0..HOT {
        assert_eq!(read_version(&v, b).unwrap(), Some(0), "block {b}");
    }
    (waited, copies, HOT - cached_hot, by_misses)
}

/// HELD, but NOT caused by 8435036 (it improves it): tests/hot_head.rs pins "a writer waits
/// for a few records" over a hot head with 64-block segments only (at most 24 records' worth
/// of copies; the tap counts 13 reclaim records there). With 4- and 8-block segments the same
/// rig makes the writer's 96-block record wait for 39 and 34 reclaim records on 8435036
/// (46 and 48 with a segment's bound, on its parent): each reclaim frees `max(1, room / 16)`
/// blocks beyond its record (one to three here, room being at most the free room less 2, 44
/// at first) where the writer needs about 50 more than are free.
#[test]
#[ignore = "known limit, older than 8435036 (46 and 48 records before it): with segments of 4 and 8 blocks a writer over a hot head waits for 39 and 34 reclaim records, each freeing room / 16 besides its record"]
fn a_writer_over_a_hot_head_with_small_segments_waits_for_at_most_24_reclaim_records() {
    let mut failures = Vec::new();
    for seg in [4u64, 8, 64] {
        let (waited, copies, _evicted, _by_misses) = writer_over_a_hot_head(seg);
        if waited > 24 {
            failures
                .push(format!("segments of {seg}: the writer waited for {waited} reclaim records ({copies} copies)"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}

/// REFUTED on 8435036 (expected to pass; it FAILED on its parent f657ec2, where the writer
/// paid exactly the read misses' copies, 93 and 275): a writer over a hot head pays fewer
/// copies than a record of read misses does (`min_progress` `room / 16` evicts the least
/// read instead), with 4-, 8- and 64-block segments. But the copies the writer waits for grew
/// with this commit: 93 -> 667 (4-block segments) and 275 -> 702 (8-block), as with 64-block
/// segments (728): the bound is now the hot set the head passes, not a segment per record.
#[test]
fn a_writer_over_a_hot_head_with_small_segments_pays_fewer_copies_than_read_misses() {
    let mut failures = Vec::new();
    for seg in [4u64, 8, 64] {
        let (_waited, copies, _evicted, by_misses) = writer_over_a_hot_head(seg);
        if copies >= by_misses {
            failures.push(format!("segments of {seg}: the writer paid {copies} copies, the read misses {by_misses}"));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
}
