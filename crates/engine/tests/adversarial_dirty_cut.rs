//! Adversarial review of commit 292637a ("Reclaim: a window cut short before a kept block that
//! does not fit its record leaves dirty blocks after the cut for a later window"). In
//! volume/reclaim.rs, `reinsertions` used to take the whole reclaim window whenever a dirty
//! block lay at or after the cut (evicting kept blocks past the record's room); now it cuts
//! the window anyway and keeps only the dirty copies before the cut (`dirty.retain(|p|
//! p.position < cut)`), counting only those in `fits`. `room` and `window_room` are still
//! computed from the dirty count of the whole window. Each test is one suspicion; the comment
//! above it says what it attacks and whether the suspicion held (BUG) or was refuted.
//!
//! Every volume here sits on a `Tap`: a cache-device wrapper that decodes each record header
//! written to the log and takes a record that moves the head for a reclaim record. For each it
//! checks from the device's side what the engine promises (docs/format.md 4.5): the record
//! lands in the room the old head left, takes no more room than its window frees, leaves the
//! writer's reserve free, carries at most `copy_forward_max` dirty copies. When the test lets
//! it (`Tap::probe`, single-threaded drivers only), it also looks at the volume's index at the
//! moment the reclaim record is written (the index still names the old slots then:
//! `finish_reclaim` runs after the record's flush) and lists the dirty blocks lying after the
//! new head yet inside the least the window can have reached (`reclaim`'s target: a segment,
//! or a whole record's need less the free room, short of the tail): a window cut before a
//! dirty block. Cut at a kept block with fewer copies than a dense window's record, it is the
//! path the commit changed (`reinsertion_cut_before_dirty`). No record may copy a dirty block
//! lying after its new head, and a record with clean copies must free at least one block
//! beyond itself. The tap also captures power-cut images at such records (torn among the
//! writes not yet flushed, as `SimDevice::crash` tears; and just after its flush) and can hold
//! one such record's write while the test acts.
//!
//! Outcome on 292637a: no bug found; every suspicion refuted (all six tests pass).
//! - Power cuts (torn reclaim record, or just after its flush) at windows cut before dirty
//!   blocks, with 64-, 16-, 8- and 4-block segments and rare checkpoints: every flushed block
//!   recovers; the recovered volume, driven past what the cut left and written back in full,
//!   puts exactly those versions on the backing device.
//! - Arithmetic: no record larger than its window, none with clean copies that frees nothing,
//!   none copying a dirty block after its new head, the reserve always free, over a churn of
//!   seven layouts and policies (plain reinsertion, a probation ring, write-around).
//! - Liveness: with the free room at the reserve and 31 dirty blocks after sparse kept ones
//!   (`room` 1, `min_progress` 1), the first records free only 4-10 blocks, but the room grows
//!   with the free room: a writer's record waits for 3-6 reclaim records (2 on the parent,
//!   which evicted the kept blocks instead), and no kept block is evicted.
//! - Rotten dirty copies before and after the cut, losses declared after the cut and not yet
//!   logged: logged by the cut record, read lost (never stale) before and after power cuts.
//! - A rewrite, TRIMs and a write-back racing a held cut record: every block intact.
//!
//! The tests that target the new path check that it ran (`reinsertion_cut_before_dirty`); on
//! the parent 4e8960f those coverage checks fail (the window there is taken whole), and with
//! two mutations of `reinsertions` (dropping `dirty.retain`; `fits` without the dirty copies
//! before the cut) the tap's checks or the engine's asserts fail in four to six of the tests.
//! Besides these tests: `tiercache torture` passed seeds 200-239 and 1000-1399 (concurrent),
//! 100-139 at 1,000 cycles each (serial); a temporary trace in `reinsertions` counted the path
//! 53 times in 100 concurrent seeds and 9,168 times in the serial run.
//!
//! Blocks used: 100 and up (the backing device's fingerprint blocks are 0, 1, 16 and the last).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Condvar, Mutex, Weak};
use tiercache_device::{BlockDevice, MonotonicClock, SimDevice};
use tiercache_engine::{Volume, VolumeOptions};
use tiercache_format::{EntryKind, RecordHeader};

mod common;
use common::*;

// ------------------------------------------------------------------------------------------
// Geometry (volume/mod.rs: `staging_limit`, `copy_forward_max`, `reclaim_reserve`).

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
    /// Blocks whose only dirty copy the test rotted: they must read as lost (or, once
    /// rewritten, the new version).
    lost: BTreeSet<u64>,
    /// Blocks TRIMmed (their content is then unspecified until rewritten).
    trimmed: BTreeSet<u64>,
}

impl Truth {
    fn newest(&self, b: u64) -> u64 {
        self.unflushed.get(&b).and_then(|v| v.last().copied()).unwrap_or(*self.flushed.get(&b).unwrap_or(&0))
    }
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
    fn write(&mut self, first: u64, n: u64) -> u64 {
        let version = self.next_version;
        self.next_version += 1;
        {
            let mut t = self.truth.lock().unwrap();
            for b in first..first + n {
                t.unflushed.entry(b).or_default().push(version);
                t.lost.remove(&b);
                t.trimmed.remove(&b);
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
        let t = self.truth.lock().unwrap().clone();
        if t.lost.contains(&b) || t.trimmed.contains(&b) {
            return;
        }
        assert_eq!(read_version(&self.v, b).unwrap(), Some(t.newest(b)), "block {b}");
    }
    fn check(&self, blocks: impl Iterator<Item = u64>, what: &str) {
        let t = self.truth.lock().unwrap().clone();
        check_truth(&self.v, &t, blocks, what);
    }
}

/// Every block of `blocks` reads its newest version on a running volume (lost ones as lost).
fn check_truth(v: &Volume, t: &Truth, blocks: impl Iterator<Item = u64>, what: &str) {
    for b in blocks {
        if t.trimmed.contains(&b) {
            continue;
        }
        let r = read_version(v, b);
        if t.lost.contains(&b) {
            assert!(is_lost(&r, b), "{what}: block {b} is lost, read {r:?}");
        } else {
            assert_eq!(r.unwrap_or_else(|e| panic!("{what}: block {b}: {e}")), Some(t.newest(b)), "{what}: block {b}");
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
    /// Lost entries.
    lost: u64,
    copied: Vec<u64>,
    /// Dirty blocks (block, log position) the index named after the new head but inside the
    /// least the window reached when the record was written: the window was cut before them.
    after_cut: Vec<(u64, u64)>,
    /// The index named a clean block read since cached (a kept one) at the new head.
    kept_at_cut: bool,
}

impl ReclaimRec {
    fn cut_before_dirty(&self) -> bool {
        !self.after_cut.is_empty()
    }
    fn copies(&self) -> u64 {
        self.dirty + self.clean
    }
    /// Cut by `reinsertions` (at a kept block that did not fit) before a dirty block: the
    /// commit's path. (A dense window's cut, `dense_choice`, follows a record's worth of
    /// copies exactly; one of fewer copies at a kept block is `reinsertions`'.)
    fn reinsertion_cut_before_dirty(&self, geo: Geo) -> bool {
        self.cut_before_dirty() && self.kept_at_cut && self.copies() != geo.copy_forward_max()
    }
    fn freed(&self) -> i64 {
        (self.new_head - self.old_head) as i64 - self.blocks as i64
    }
}

struct CrashState {
    what: String,
    cache: Vec<u8>,
    backing: Vec<u8>,
    truth: Truth,
}

struct Capture {
    max_states: usize,
    seed: u64,
    backing: Arc<SimDevice>,
    truth: Arc<Mutex<Truth>>,
}

#[derive(Default)]
struct TapState {
    head: u64,
    reclaims: Vec<ReclaimRec>,
    violations: Vec<String>,
    capture: Option<Capture>,
    pending: Vec<(u64, Vec<u8>)>,
    after_flush: Option<String>,
    states: Vec<CrashState>,
    /// Hold the next reclaim record cut before a dirty block.
    hold_cut: bool,
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
    /// The volume whose index the tap probes at each reclaim record (single-threaded drivers).
    vol: Mutex<Option<Weak<Volume>>>,
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
            vol: Mutex::new(None),
        })
    }

    fn probe(&self, v: Option<&Arc<Volume>>) {
        *self.vol.lock().unwrap() = v.map(Arc::downgrade);
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

    fn hold_next_cut(&self) {
        let mut st = self.st.lock().unwrap();
        st.hold_cut = true;
        st.held = None;
        st.open = false;
    }

    fn wait_held(&self) -> ReclaimRec {
        let mut st = self.st.lock().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while st.held.is_none() {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            assert!(!left.is_zero(), "no reclaim record cut before a dirty block came");
            st = self.cv.wait_timeout(st, left).unwrap().0;
        }
        st.held.clone().unwrap()
    }

    fn release(&self) {
        let mut st = self.st.lock().unwrap();
        st.open = true;
        self.cv.notify_all();
    }

    /// The dirty blocks the volume's index names after the new head, inside the least the
    /// window can have reached: `[new_head, old_head + max(seg, need - free))` (`reclaim`'s
    /// target, the need at most a whole record's), short of the tail.
    fn dirty_after_cut(&self, old_head: u64, new_head: u64, tail: u64) -> (Vec<(u64, u64)>, bool) {
        let Some(v) = self.vol.lock().unwrap().as_ref().and_then(Weak::upgrade) else { return (Vec::new(), false) };
        let (g, log) = (self.geo, self.geo.log());
        let free = old_head + log - tail;
        let want = g.seg.max((1 + g.data_limit() + g.reserve()).saturating_sub(free));
        let end = (old_head + want).min(tail);
        let index = v.index_snapshot();
        let at = |slot: u32| old_head + (u64::from(slot) + log - old_head % log) % log;
        let kept_at_cut = index.iter().any(|(_, e)| !e.dirty && e.freq > 0 && at(e.slot) == new_head);
        let mut out: Vec<(u64, u64)> = index
            .into_iter()
            .filter(|(_, e)| e.dirty)
            .map(|(b, e)| (b, at(e.slot)))
            .filter(|&(_, p)| p >= new_head && p < end)
            .collect();
        out.sort_by_key(|&(_, p)| p);
        (out, kept_at_cut)
    }

    fn note_reclaim(
        &self,
        st: &mut TapState,
        h: &RecordHeader,
        (after_cut, kept_at_cut): (Vec<(u64, u64)>, bool),
    ) -> ReclaimRec {
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
            copied,
            after_cut,
            kept_at_cut,
        };
        let log = g.log();
        let brief = format!(
            "record at {} of {} blocks ({} dirty + {} clean), head {} -> {}, dirty after the cut {:?}",
            r.pos,
            r.blocks,
            r.dirty,
            r.clean,
            r.old_head,
            r.new_head,
            &r.after_cut[..r.after_cut.len().min(4)]
        );
        let mut bad = |why: &str| st.violations.push(format!("{why}: {brief}"));
        if r.pos + r.blocks > r.old_head + log {
            bad("the record does not fit the room the old head left");
        }
        if r.blocks > r.new_head - r.old_head {
            bad("the record takes more room than its window frees");
        }
        if r.new_head + log < r.pos + r.blocks + g.reserve() {
            bad("the reserve is not free after the record");
        }
        if r.dirty > g.copy_forward_max() {
            bad("more dirty copies than copy_forward_max");
        }
        // (Any record with a clean copy went through `reinsertions`, whose room and `fits`
        // leave at least a block freed: only a dense window's copy-through of a record of
        // dirty copies may free nothing.)
        if r.clean > 0 && r.freed() < 1 {
            bad("a window with clean copies frees no block beyond its record");
        }
        if r.after_cut.iter().any(|(b, _)| r.copied.contains(b)) {
            bad("the record copies a dirty block that lies after its new head");
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
        let log_bytes = self.log_start * bs..(self.log_start + self.geo.log()) * bs;
        let header = if log_bytes.contains(&offset) {
            RecordHeader::decode(&buf[..BS], self.uuid)
                .ok()
                .filter(|h| offset == (self.log_start + h.position % self.geo.log()) * bs)
        } else {
            None
        };
        let head = self.st.lock().unwrap().head;
        // (Probed with the tap's lock free: the index takes the volume's state lock.)
        let after_cut = match &header {
            Some(h) if h.head_position > head => self.dirty_after_cut(head, h.head_position, h.position),
            _ => (Vec::new(), false),
        };
        {
            let mut st = self.st.lock().unwrap();
            let mut hold = false;
            if let Some(h) = header {
                if h.head_position > st.head {
                    let r = self.note_reclaim(&mut st, &h, after_cut);
                    let n = st.reclaims.len() as u64;
                    let take = r.reinsertion_cut_before_dirty(self.geo)
                        && st.capture.as_ref().is_some_and(|c| st.states.len() < c.max_states);
                    if take {
                        let c = st.capture.as_ref().unwrap();
                        let (seed, truth, backing) =
                            (c.seed, c.truth.lock().unwrap().clone(), c.backing.durable_image());
                        let cache = self.crash_image(&st, offset, buf, seed ^ n);
                        let what = format!(
                            "reclaim record {n} at {} ({} dirty + {} clean copies, head {} -> {}, {} dirty after the cut)",
                            r.pos,
                            r.dirty,
                            r.clean,
                            r.old_head,
                            r.new_head,
                            r.after_cut.len()
                        );
                        st.states.push(CrashState {
                            what: format!("{what}, cut during its write"),
                            cache,
                            backing,
                            truth,
                        });
                        st.after_flush = Some(format!("{what}, cut after its flush"));
                    }
                    if st.hold_cut && r.reinsertion_cut_before_dirty(self.geo) {
                        st.hold_cut = false;
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

/// A fresh volume (log only, no background thread) of `geo`, its cache device behind a
/// probing `Tap`, on a backing device of `backing_blocks` blocks stamped version 0.
fn tapped(
    geo: Geo,
    backing_blocks: u64,
    opts: VolumeOptions,
) -> (Arc<SimDevice>, Arc<SimDevice>, Arc<Tap>, Arc<Volume>) {
    tapped_with(geo, backing_blocks, log_only(), opts)
}

/// `tapped`, formatted with `create` (a probation ring, say).
fn tapped_with(
    geo: Geo,
    backing_blocks: u64,
    create: tiercache_engine::CreateOptions,
    opts: VolumeOptions,
) -> (Arc<SimDevice>, Arc<SimDevice>, Arc<Tap>, Arc<Volume>) {
    // (A backing device that never tears a block where writes may go around the cache: the
    // volume refuses write-around otherwise.)
    let atomic = opts.write_around.min_bytes > 0 && !opts.write_around.only_when_destage_bound;
    let log_blocks = geo.log();
    let ck = tiercache_format::Layout::checkpoint_blocks_for(log_blocks, BS as u32);
    let cache = Arc::new(SimDevice::new((2 + 2 * ck + log_blocks) * BS as u64, BS as u32).with_name("cache"));
    let image = stamps(0, backing_blocks, 0);
    let backing = Arc::new(if atomic {
        common::holds::atomic_backing(image)
    } else {
        SimDevice::from_image(image, BS as u32).with_name("backing")
    });
    tiercache_engine::create(
        &*cache,
        &*backing,
        &tiercache_engine::CreateOptions { segment_blocks: geo.seg as u32, ..create },
    )
    .expect("create");
    // (A probation ring takes its share of the device from the log.)
    let geo = Geo::new(geo.seg, layout_of(&cache).0.log_blocks / geo.seg);
    let tap = Tap::new(&cache, geo);
    let c: Arc<dyn BlockDevice> = tap.clone();
    let b: Arc<dyn BlockDevice> = backing.clone();
    let v = Arc::new(Volume::open(c, b, Arc::new(MonotonicClock::new()), opts).expect("open").0);
    assert_eq!(v.superblock().layout.log_blocks, geo.log());
    tap.st.lock().unwrap().head = v.log_window().0;
    tap.probe(Some(&v));
    (cache, backing, tap, v)
}

fn assert_reserve(v: &Volume, geo: Geo, what: &str) {
    let (head, ck, tail) = v.log_window();
    assert!(head + geo.log() >= tail + geo.reserve(), "{what}: head {head} tail {tail}: the reserve is not free");
    assert!(head <= ck && ck <= tail, "{what}: head {head} checkpoint {ck} tail {tail}");
}

fn join_within_secs<T>(h: std::thread::JoinHandle<T>, secs: u64, what: &str) -> T {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while !h.is_finished() && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    assert!(h.is_finished(), "{what}: not done within {secs} s (deadlock?)");
    h.join().unwrap_or_else(|_| panic!("{what}: panicked"))
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

const HOT_BASE: u64 = 100;

/// Fills the log with a hot set of `hot` blocks from `HOT_BASE` read twice (counts at one),
/// with a dirty block of its own (from `dirty_base`) written after every `dirty_every`-th hot
/// block (tests/hot_head.rs's new test: dirty blocks among the kept ones, so that windows cut
/// short at a kept block have dirty blocks after the cut), then FLUSH. Returns the hot blocks
/// and the dirty ones.
fn hot_head(d: &mut Driver, hot: u64, dirty_every: u64, dirty_base: u64, rng: &mut ChaCha8Rng) -> (Vec<u64>, Vec<u64>) {
    let order = shuffled(hot, rng);
    let blocks: Vec<u64> = order.iter().map(|i| HOT_BASE + i).collect();
    let mut dirty = Vec::new();
    for (k, &b) in blocks.iter().enumerate() {
        d.read(b);
        if k as u64 % dirty_every == dirty_every - 1 {
            let x = dirty_base + 2 * dirty.len() as u64;
            d.write(x, 1);
            dirty.push(x);
        }
    }
    d.flush();
    for &b in &blocks {
        d.read(b);
    }
    (blocks, dirty)
}

/// Recovers each power-cut image, checks every block of `universe` against what was flushed
/// when it was taken; every `deep`-th one is then driven on (read misses of `more` blocks
/// from `misses_from`, pushing the head past whatever the cut left after it), checked again,
/// written back in full and the backing device checked.
fn verify_states(
    states: Vec<CrashState>,
    universe: &[u64],
    opts: impl Fn() -> VolumeOptions,
    deep: usize,
    misses_from: u64,
    more: u64,
) -> usize {
    let n = states.len();
    for (i, s) in states.into_iter().enumerate() {
        let cache = Arc::new(SimDevice::from_image(s.cache, BS as u32));
        let backing = Arc::new(SimDevice::from_image(s.backing, BS as u32));
        let c: Arc<dyn BlockDevice> = cache.clone();
        let b: Arc<dyn BlockDevice> = backing.clone();
        let v = Volume::open(c, b, Arc::new(MonotonicClock::new()), opts())
            .unwrap_or_else(|e| panic!("{}: recovery failed: {e}", s.what))
            .0;
        let mut settled = BTreeMap::new();
        for &b in universe {
            if s.truth.lost.contains(&b) || s.truth.trimmed.contains(&b) {
                continue;
            }
            let got = read_version(&v, b).unwrap_or_else(|e| panic!("{}: block {b}: {e}", s.what));
            assert!(
                s.truth.accepts_after_cut(b, got),
                "{}: block {b} read {got:?}, flushed {:?}, written since {:?}",
                s.what,
                s.truth.flushed.get(&b),
                s.truth.unflushed.get(&b)
            );
            settled.insert(b, got.unwrap());
        }
        if deep > 0 && i % deep == 0 {
            read_once(&v, (0..more).map(|k| misses_from + 3 * k));
            for (&b, &ver) in &settled {
                assert_eq!(read_version(&v, b).unwrap(), Some(ver), "{}: driven on: block {b}", s.what);
            }
            v.write_back_all(1.0, |_, _| true).unwrap();
            let dirty_left = dirty_blocks(&v);
            assert!(dirty_left.is_empty(), "{}: still dirty after write_back_all: {dirty_left:?}", s.what);
            for (&b, &ver) in &settled {
                assert_eq!(backing_version(&backing, b), Some(ver), "{}: backing block {b}", s.what);
            }
        }
    }
    n
}

// ------------------------------------------------------------------------------------------
// 1. Power cuts at reclaim records whose window was cut before a dirty block.

/// A hot head with dirty blocks among the kept ones (one every `dirty_every` hot blocks),
/// then rounds of read misses (no writer waiting), rewrites of the dirty blocks (some left
/// unflushed) and small writes; power-cut images captured at reclaim records cut before a
/// dirty block. Returns (reclaim records, records cut before a dirty block, images).
fn power_cuts(
    geo: Geo,
    seed: u64,
    dirty_every: u64,
    laps: u64,
    max_states: usize,
    opts: fn() -> VolumeOptions,
) -> (usize, usize, usize) {
    let log = geo.log();
    let (_cache, backing, tap, v) = tapped(geo, 32_768, opts());
    let mut d = Driver::new(&v);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let hot = log * 3 / 4;
    const DIRTY_BASE: u64 = 1_000;
    let (hot_blocks, dirty) = hot_head(&mut d, hot, dirty_every, DIRTY_BASE, &mut rng);
    tap.capture(Capture { max_states, seed, backing: Arc::clone(&backing), truth: Arc::clone(&d.truth) });
    let cold = |n: u64| 2_000 + 2 * n;
    let mut next_cold = 0;
    let mut written: BTreeSet<u64> = dirty.iter().copied().collect();
    for round in 0..laps * log / geo.data_limit() {
        // Read misses (2,000 and up, every other block): a record's data, in two halves with dirty rewrites between.
        for _ in 0..geo.data_limit() / 2 {
            d.read(cold(next_cold));
            next_cold += 1;
        }
        for _ in 0..rng.gen_range(0..3) {
            let x = dirty[rng.gen_range(0..dirty.len())];
            d.write(x, 1);
        }
        for _ in 0..geo.data_limit() / 2 {
            d.read(cold(next_cold));
            next_cold += 1;
        }
        // Re-reads of the hot set (counts earned again), and now and then a small write.
        for _ in 0..geo.data_limit() / 4 {
            d.read(hot_blocks[rng.gen_range(0..hot_blocks.len())]);
        }
        if round % 4 == 1 {
            let n = rng.gen_range(1..=4);
            let b = 15_000 + rng.gen_range(0..200) * 8;
            d.write(b, n);
            written.extend(b..b + n);
        }
        if round % 3 != 2 {
            d.flush();
        }
        assert_reserve(&v, geo, &format!("{geo:?} seed {seed} round {round}"));
    }
    d.flush();
    tap.assert_sound(&format!("{geo:?} seed {seed}"));
    let reclaims = tap.reclaims();
    let cuts = reclaims.iter().filter(|r| r.reinsertion_cut_before_dirty(geo)).count();
    let states = tap.take_states();
    tap.probe(None);
    let mut universe: Vec<u64> = hot_blocks.clone();
    universe.extend(written.iter().copied());
    universe.extend((0..next_cold).step_by(5).map(cold));
    d.check(universe.iter().copied(), "the running volume at the end");
    let n = verify_states(states, &universe, opts, 7, 17_000, 2 * log);
    eprintln!(
        "{geo:?} seed {seed}: {} reclaim records, {cuts} cut before a dirty block, {n} power-cut images",
        reclaims.len()
    );
    (reclaims.len(), cuts, n)
}

/// REFUTED (expected to pass): a power cut while a reclaim record whose window was cut before
/// a dirty block is being written (torn among the writes not yet flushed) or just after its
/// flush recovers every flushed block at its flushed version (one written since may read
/// either); the recovered volume, driven on until its head passes the blocks left after the
/// cut, still reads them so, and a full write-back puts exactly those versions on the backing
/// device (a dirty block left after the cut is never lost nor served stale from backing).
/// tests/hot_head.rs's layout (64-block segments, a log of 1,024).
#[test]
fn power_cuts_at_windows_cut_before_dirty_blocks_recover_every_flushed_block() {
    let (_, cuts, images) = power_cuts(Geo::new(64, 16), 1, 32, 6, 16, options);
    assert!(cuts >= 4, "too few windows cut before a dirty block to prove anything: {cuts}");
    assert!(images >= 8, "power-cut images: {images}");
}

/// REFUTED (expected to pass): the same with 8- and 4-block segments (`copy_forward_max` 4
/// and 2: the dense path, `dense_choice`, cuts windows too, and its cut meets this one) and
/// with checkpoints only when reclaim needs one (the records cut at replayed from a checkpoint
/// far behind).
#[test]
fn power_cuts_with_small_segments_and_rare_checkpoints_recover_every_flushed_block() {
    fn rare() -> VolumeOptions {
        VolumeOptions { checkpoint_interval_permille: 1000, ..options() }
    }
    let mut total = 0;
    for (geo, seed, every, opts) in [
        (Geo::new(8, 128), 2, 24, options as fn() -> VolumeOptions),
        (Geo::new(4, 128), 3, 16, options),
        (Geo::new(16, 64), 5, 20, rare),
    ] {
        total += power_cuts(geo, seed, every, 4, 6, opts).1;
    }
    assert!(total >= 4, "too few windows cut before a dirty block: {total}");
}

// ------------------------------------------------------------------------------------------
// 2. A log laid out for the cut: sparse kept blocks, then a cluster of dirty blocks.

/// A log whose records each hold, after their header, `lead` dirty blocks, clean blocks
/// (one kept, read again, every `kept_every`; the rest read once) and a cluster of `tail`
/// dirty blocks: `records` of them, then a write of `spacer` blocks, so that the free room is
/// at the reserve and the next record needs a reclaim whose window (a whole record) holds the
/// cluster after its kept blocks. With the whole window's dirty blocks counted against the
/// room and the free room at the reserve, the room is `copy_forward_max - lead - tail`: the
/// window is cut at the first kept blocks, before the cluster.
struct Clustered {
    kept: Vec<u64>,
    lead: Vec<u64>,
    tail: Vec<u64>,
    /// The first block after those used.
    next: u64,
}

fn clustered(d: &mut Driver, geo: Geo, kept_every: u64, lead: u64, tail: u64, records: u64, spacer: u64) -> Clustered {
    let mut c = Clustered { kept: Vec::new(), lead: Vec::new(), tail: Vec::new(), next: 0 };
    let mut next = 2_000u64;
    let mut next_dirty = 20_000u64;
    let clean = geo.data_limit() - lead - tail;
    for _ in 0..records {
        for _ in 0..lead {
            d.write(next_dirty, 1);
            c.lead.push(next_dirty);
            next_dirty += 2;
        }
        for k in 0..clean {
            d.read(next);
            if k % kept_every == 0 {
                c.kept.push(next);
            }
            next += 2;
        }
        for _ in 0..tail {
            d.write(next_dirty, 1);
            c.tail.push(next_dirty);
            next_dirty += 2;
        }
    }
    d.flush();
    if spacer > 0 {
        d.write(25_000, spacer);
        d.flush();
    }
    for &b in &c.kept {
        d.read(b);
    }
    c.next = next;
    c
}

/// Every block the layout used, and the spacer.
fn clustered_universe(c: &Clustered, spacer: u64) -> Vec<u64> {
    let mut u: Vec<u64> = (2_000..c.next).collect();
    u.extend(c.lead.iter().copied());
    u.extend(c.tail.iter().copied());
    u.extend(25_000..25_000 + spacer);
    u
}

const SPACER: u64 = 20;

// ------------------------------------------------------------------------------------------
// 3. How long a writer waits.

/// REFUTED (expected to pass): `room` still counts the dirty blocks after the cut, and a
/// writer waits only `room / 16`: with the free room at the reserve (`copies_max` =
/// `copy_forward_max` = 32) and a cluster of 31 dirty blocks after sparse kept blocks, the
/// room is 1 and the first window is cut after one or two kept blocks, freeing 4 blocks: does
/// the writer then wait for a reclaim per block? No: each record frees a block beyond itself,
/// the free room (and with it `copies_max`) grows with every record, and the room with it:
/// 4, 9, 27 blocks freed, then the head takes the cluster. The writer's record of 96 blocks
/// waits for 6 reclaim records (kept one in 3), 5 (one in 4) or 3 (one in 6), evicting no
/// kept block (the parent, 4e8960f, takes the whole first window and evicts the kept blocks
/// past its room of one: 2 records, freeing 63 and 42, for one in 3). Bound here: 12, and
/// every record frees a block beyond itself.
#[test]
fn a_writer_at_the_reserve_over_a_dirty_cluster_waits_for_a_few_records() {
    let geo = Geo::new(64, 16);
    for kept_every in [3u64, 4, 6] {
        let (_cache, _backing, tap, v) = tapped(geo, 32_768, options());
        let mut d = Driver::new(&v);
        let c = clustered(&mut d, geo, kept_every, 0, 31, 10, SPACER);
        let (head, _, tail) = v.log_window();
        assert!(
            head + geo.log() - tail <= geo.reserve() + 2,
            "the free room is at the reserve: head {head} tail {tail}"
        );
        let before = tap.reclaims().len();
        d.write(30_000, geo.data_limit());
        d.flush();
        let recs: Vec<ReclaimRec> = tap.reclaims().into_iter().skip(before).collect();
        tap.assert_sound("the writer");
        let freed: Vec<i64> = recs.iter().map(ReclaimRec::freed).collect();
        let cuts = recs.iter().filter(|r| r.reinsertion_cut_before_dirty(geo)).count();
        eprintln!(
            "kept one in {kept_every}: {} reclaim records ({cuts} cut before the cluster), freeing {freed:?}",
            recs.len()
        );
        assert!(cuts >= 1, "the first window is cut before the cluster");
        assert!(freed.iter().all(|&f| f >= 1), "a reclaim freed nothing: {freed:?}");
        assert!(recs.len() <= 12, "the writer waited for {} reclaim records: {freed:?}", recs.len());
        let index: BTreeSet<u64> = v.index_snapshot().into_iter().map(|(b, _)| b).collect();
        let evicted = c.kept.iter().filter(|b| !index.contains(b)).count();
        assert_eq!(evicted, 0, "kept blocks evicted");
        let mut u = clustered_universe(&c, SPACER);
        u.extend(30_000..30_000 + geo.data_limit());
        d.check(u.into_iter(), "after the writer");
    }
}

// ------------------------------------------------------------------------------------------
// 4. Rotten dirty copies on either side of the cut.

/// REFUTED (expected to pass): a dirty copy before the cut that fails its checksum when
/// reclaim reads it (`read_copies`: `settle_bad_dirty_copy`) is declared lost in the same
/// reclaim whose window was cut before the other dirty blocks, and its Lost entry is in that
/// record (the head passes its position); a rotten dirty copy after the cut stays where it is
/// for a later window, which declares it lost in turn. Neither ever reads the stale backing
/// copy: not on the running volume, not after a power cut right after the cut record's flush,
/// nor after the writer's FLUSH. Losses a reader declared after the cut before reclaim ran,
/// in no record yet, are logged by the cut record (a power cut just after it recovers them
/// lost). The layout: a dirty block leading each record, sparse kept
/// blocks (one in 3), a cluster of 30 dirty blocks; the free room at the reserve.
#[test]
fn rotten_dirty_copies_before_and_after_the_cut_read_lost_never_stale() {
    let geo = Geo::new(64, 16);
    let (cache, backing, tap, v) = tapped(geo, 32_768, options());
    let mut d = Driver::new(&v);
    let c = clustered(&mut d, geo, 3, 1, 30, 10, SPACER);
    let before_cut = c.lead[0];
    let after_cut = c.tail[5];
    // (Ten rotten blocks after the cut, five of them read first: declared lost by the reader,
    // not yet in any record when reclaim runs, so the cut record logs them.)
    let rotten: Vec<u64> = std::iter::once(before_cut).chain(c.tail[5..15].iter().copied()).collect();
    for &b in &rotten {
        corrupt_cached_block(&cache, &v, b);
        d.truth.lock().unwrap().lost.insert(b);
    }
    for &b in &c.tail[10..15] {
        let got = read_version(&v, b);
        assert!(is_lost(&got, b), "a reader finds rotten block {b} lost: {got:?}");
    }
    tap.capture(Capture { max_states: 4, seed: 7, backing: Arc::clone(&backing), truth: Arc::clone(&d.truth) });
    let before = tap.reclaims().len();
    d.write(30_000, geo.data_limit());
    d.flush();
    let recs: Vec<ReclaimRec> = tap.reclaims().into_iter().skip(before).collect();
    tap.assert_sound("rotten copies");
    let first = &recs[0];
    eprintln!("first reclaim record: {first:?}");
    assert!(first.reinsertion_cut_before_dirty(geo), "the first window is cut before the cluster");
    assert!(first.after_cut.iter().any(|&(b, _)| b == after_cut), "the rotten block after the cut stays after it");
    assert!(!first.copied.contains(&before_cut), "the rotten copy before the cut is not copied");
    assert!(first.lost >= 6, "the cut record logs the loss it found and the five a reader declared: {}", first.lost);
    let lost = v.lost_blocks();
    assert!(lost.contains(&before_cut), "the rotten copy before the cut is declared lost by its reclaim: {lost:?}");
    let mut u = clustered_universe(&c, SPACER);
    u.extend(30_000..30_000 + geo.data_limit());
    d.check(u.iter().copied(), "the running volume");
    let states = tap.take_states();
    assert!(!states.is_empty(), "a power-cut image at the cut record");
    // (Recovered at the cut record: the rotten copy after the cut is still on the log, rotten;
    // reading it declares it lost.)
    for s in states {
        let r = Volume::open(
            Arc::new(SimDevice::from_image(s.cache, BS as u32)),
            Arc::new(SimDevice::from_image(s.backing, BS as u32)),
            Arc::new(MonotonicClock::new()),
            options(),
        )
        .unwrap_or_else(|e| panic!("{}: recovery: {e}", s.what))
        .0;
        for &b in &rotten {
            let got = read_version(&r, b);
            assert!(is_lost(&got, b), "{}: rotten block {b} read {got:?}", s.what);
        }
        for &b in u.iter().filter(|b| !s.truth.lost.contains(b)) {
            let got = read_version(&r, b).unwrap();
            assert!(s.truth.accepts_after_cut(b, got), "{}: block {b} read {got:?}", s.what);
        }
    }
    // Drive the head past the cluster (read misses), power cut, recover.
    read_once(&v, (0..2 * geo.log()).map(|k| 4_000 + 2 * k));
    let r = Volume::open(durable_copy(&cache), durable_copy(&backing), Arc::new(MonotonicClock::new()), options())
        .expect("recovery")
        .0;
    let t = d.truth.lock().unwrap().clone();
    check_truth(&r, &t, u.iter().copied(), "after the head passed the cluster and a power cut");
}

// ------------------------------------------------------------------------------------------
// 5. Races with a held reclaim record cut before a dirty cluster.

/// REFUTED (expected to pass): while the reclaim record of a window cut before a cluster of
/// dirty blocks is being written (held at its write, the io lock held): readers hit every
/// dirty block of the cluster at its slot after the cut; a rewrite of one of them, a TRIM of a
/// kept block the record copies and of one after the cut, and a write-back (`destage_step`,
/// which takes the cluster first: the lowest addresses) of the cluster's blocks, all on their
/// own threads. Once it is let go: every block reads its newest version, the written-back
/// blocks are clean on a backing device that holds them, and after a power cut (and on the
/// recovered volume, once its head has passed the cluster and everything is written back)
/// every flushed block reads its flushed version. Run with each race alone and all together.
#[test]
fn races_with_a_held_record_cut_before_a_dirty_cluster_keep_every_block() {
    let geo = Geo::new(64, 16);
    for race in 0..4 {
        held_cut_race(geo, race, 0, 31);
    }
    // (A dirty block leading each record: the held record copies it, and it is rewritten too.)
    for race in [0, 3] {
        held_cut_race(geo, race, 1, 30);
    }
}

fn held_cut_race(geo: Geo, race: u32, lead: u64, tail: u64) {
    let (cache, backing, tap, v) = tapped(geo, 32_768, options());
    let mut d = Driver::new(&v);
    let c = clustered(&mut d, geo, 3, lead, tail, 10, SPACER);
    let mut u = clustered_universe(&c, SPACER);
    u.extend(30_000..30_000 + geo.data_limit());
    tap.hold_next_cut();
    {
        let mut t = d.truth.lock().unwrap();
        for b in 30_000..30_000 + geo.data_limit() {
            t.unflushed.entry(b).or_default().push(500);
        }
    }
    let writer = on_thread(&v, move |v| {
        v.write(30_000 * BS as u64, &stamps(30_000, 96, 500)).unwrap();
        v.flush().unwrap();
    });
    let held = tap.wait_held();
    eprintln!(
        "race {race} lead {lead}: held {} dirty + {} clean copies, head {} -> {}, {} dirty after the cut",
        held.dirty,
        held.clean,
        held.old_head,
        held.new_head,
        held.after_cut.len()
    );
    assert!(held.after_cut.len() >= 20, "the cluster lies after the cut");
    assert_eq!(held.dirty, lead, "the held record copies the dirty blocks before the cut");
    let truth = d.truth.lock().unwrap().clone();
    // Readers of the cluster and of the copied blocks, while held.
    let mut blocks: Vec<u64> = held.after_cut.iter().map(|&(b, _)| b).collect();
    blocks.extend(held.copied.iter().copied());
    let readers: Vec<_> = (0..2)
        .map(|k| {
            let (t, blocks) = (truth.clone(), blocks.clone());
            on_thread(&v, move |v| {
                for &b in blocks.iter().skip(k) {
                    assert_eq!(read_version(v, b).unwrap(), Some(t.newest(b)), "held: block {b}");
                }
            })
        })
        .collect();
    for r in readers {
        join_within_secs(r, 30, "a reader while held");
    }
    let rewritten = held.after_cut[3].0;
    let trim_copied = *held
        .copied
        .iter()
        .find(|b| !truth.unflushed.contains_key(b) && !truth.flushed.contains_key(b))
        .expect("a clean copy");
    let trim_after = c.kept.iter().copied().find(|&b| b > trim_copied + 40).expect("a kept block after the cut");
    let mut threads = Vec::new();
    if race == 0 || race == 3 {
        d.truth.lock().unwrap().unflushed.entry(rewritten).or_default().push(600);
        let copied_dirty = if lead > 0 { Some(c.lead[0]) } else { None };
        if let Some(b) = copied_dirty {
            d.truth.lock().unwrap().unflushed.entry(b).or_default().push(601);
        }
        threads.push(on_thread(&v, move |v| {
            v.write(rewritten * BS as u64, &stamp(rewritten, 600)).unwrap();
            if let Some(b) = copied_dirty {
                v.write(b * BS as u64, &stamp(b, 601)).unwrap();
            }
            0
        }));
    }
    if race == 1 || race == 3 {
        {
            let mut t = d.truth.lock().unwrap();
            t.trimmed.insert(trim_copied);
            t.trimmed.insert(trim_after);
        }
        v.discard(trim_copied * BS as u64, BS as u64).unwrap();
        v.discard(trim_after * BS as u64, BS as u64).unwrap();
    }
    if race == 2 || race == 3 {
        threads.push(on_thread(&v, move |v| v.destage_step(16).unwrap()));
    }
    std::thread::sleep(std::time::Duration::from_millis(30));
    tap.release();
    join_within_secs(writer, 60, "the writer");
    let mut written_back = 0;
    for t in threads {
        written_back += join_within_secs(t, 60, "a racer");
    }
    d.flush();
    tap.assert_sound(&format!("race {race}"));
    d.check(u.iter().copied(), &format!("race {race}: after the release"));
    let dirty_now: BTreeSet<u64> = dirty_blocks(&v).into_iter().collect();
    if race >= 2 {
        assert!(written_back > 0, "race {race}: the write-back wrote nothing");
        let t = d.truth.lock().unwrap().clone();
        for &(b, _) in &held.after_cut {
            if !dirty_now.contains(&b) {
                assert_eq!(backing_version(&backing, b), Some(t.newest(b)), "race {race}: written back: block {b}");
            }
        }
    }
    // Power cut; recovered, checked, driven past the cluster, written back.
    let rc = durable_copy(&cache);
    let rb = durable_copy(&backing);
    let r = Volume::open(rc.clone(), rb.clone(), Arc::new(MonotonicClock::new()), options()).expect("recovery").0;
    let t = d.truth.lock().unwrap().clone();
    check_truth(&r, &t, u.iter().copied(), &format!("race {race}: after a power cut"));
    read_once(&r, (0..2 * geo.log()).map(|k| 4_000 + 2 * k));
    check_truth(&r, &t, u.iter().copied(), &format!("race {race}: recovered, head driven on"));
    r.write_back_all(1.0, |_, _| true).unwrap();
    for &b in &u {
        if !t.trimmed.contains(&b) {
            assert_eq!(
                backing_version(&rb, b),
                Some(t.newest(b)),
                "race {race}: backing block {b} after write_back_all"
            );
        }
    }
}

// ------------------------------------------------------------------------------------------
// 6. The arithmetic and the data under a seeded churn, over layouts and policies.

/// A seeded mix over a hot head with dirty blocks among the kept ones: read misses, re-reads
/// of the hot set, rewrites of the dirty blocks and of hot ones, writes of up to a record,
/// FLUSHes, TRIMs of hot blocks, write-backs (`destage_step`); the reserve checked after every
/// request, the data every half lap, the tap's checks at every reclaim record. Returns
/// (reclaim records, those cut before a dirty block).
fn churn(geo: Geo, seed: u64, create: tiercache_engine::CreateOptions, opts: VolumeOptions) -> (usize, usize) {
    let (_cache, _backing, tap, v) = tapped_with(geo, 32_768, create, opts);
    let geo = tap.geo;
    let log = geo.log();
    let mut d = Driver::new(&v);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let hot = log * 5 / 8;
    const DIRTY_BASE: u64 = 1_000;
    let (hot_blocks, dirty) = hot_head(&mut d, hot, 12, DIRTY_BASE, &mut rng);
    let mut written: BTreeSet<u64> = dirty.iter().copied().collect();
    let (cold_base, cold_end) = (3_000u64, 32_000u64);
    for op in 0..2 * log {
        let what = format!("{geo:?} seed {seed} op {op}");
        match rng.gen_range(0..100u32) {
            0..=34 => d.read(rng.gen_range(cold_base..cold_end)),
            35..=59 => d.read(hot_blocks[rng.gen_range(0..hot_blocks.len())]),
            60..=71 => {
                let b = if rng.gen_bool(0.5) {
                    dirty[rng.gen_range(0..dirty.len())]
                } else {
                    hot_blocks[rng.gen_range(0..hot_blocks.len())]
                };
                d.write(b, 1);
                written.insert(b);
            }
            72..=79 => {
                let n = rng.gen_range(1..=geo.data_limit().max(2));
                let b = rng.gen_range(cold_base..cold_end - n);
                d.write(b, n);
                written.extend(b..b + n);
            }
            80..=89 => d.flush(),
            90..=92 => {
                let b = hot_blocks[rng.gen_range(0..hot_blocks.len())];
                d.truth.lock().unwrap().trimmed.insert(b);
                v.discard(b * BS as u64, BS as u64).unwrap();
            }
            93..=95 => {
                v.destage_step(rng.gen_range(1..=16)).unwrap();
            }
            _ => {
                let b = hot_blocks[rng.gen_range(0..hot_blocks.len())];
                d.read(b);
            }
        }
        assert_reserve(&v, geo, &what);
        if op % (log / 2) == log / 2 - 1 {
            d.check(written.iter().copied().chain(hot_blocks.iter().copied()), &what);
        }
    }
    d.flush();
    d.check(written.iter().copied().chain(hot_blocks.iter().copied()), &format!("{geo:?} seed {seed} at the end"));
    tap.assert_sound(&format!("{geo:?} seed {seed}"));
    let reclaims = tap.reclaims();
    let cuts = reclaims.iter().filter(|r| r.reinsertion_cut_before_dirty(geo)).count();
    let c = v.status().counters;
    eprintln!(
        "{geo:?} seed {seed}: {} reclaim records, {cuts} cut before a dirty block; written around {}, dense copy-forwards {}, reclaim write-backs {}, reinserted {}",
        reclaims.len(),
        c.written_around_blocks,
        c.dense_copy_forwards,
        c.reclaim_write_backs,
        c.reinserted_blocks
    );
    (reclaims.len(), cuts)
}

/// REFUTED (expected to pass): with the window cut before dirty blocks and `room` still
/// counting them, every reclaim record stays inside the room the old head left, takes no more
/// than its window frees (a block less where it copies a clean block), leaves the reserve free,
/// copies at most `copy_forward_max` dirty blocks and never a dirty block lying after its new
/// head; the engine's own asserts (`check_invariants`, the seal's fit, `finish_reclaim`'s "no
/// live block behind the head", the seal's "block still dirty at reclaim") hold; and every
/// block reads its newest version throughout. Layouts of 4- to 64-block segments; the plain
/// reinsertion policy; a volume with a probation ring under the default policy.
#[test]
fn churn_over_layouts_and_policies_keeps_the_arithmetic_and_the_data() {
    let mut total = 0;
    for (geo, seed, create, opts) in [
        (Geo::new(64, 16), 11, log_only(), options()),
        (Geo::new(16, 64), 12, log_only(), options()),
        (Geo::new(8, 128), 13, log_only(), options()),
        (Geo::new(4, 128), 14, log_only(), options()),
        (
            Geo::new(64, 16),
            15,
            log_only(),
            VolumeOptions { eviction: tiercache_engine::Eviction::Reinsert, ..options() },
        ),
        (
            Geo::new(32, 32),
            17,
            tiercache_engine::CreateOptions::default(),
            VolumeOptions { eviction: tiercache_engine::Eviction::S3fifo, ..options() },
        ),
        (Geo::new(16, 64), 18, log_only(), VolumeOptions { sequential_bypass_bytes: 0, ..common::holds::wa_options() }),
    ] {
        let (reclaims, cuts) = churn(geo, seed, create, opts);
        assert!(reclaims > 0, "{geo:?} seed {seed}: the churn reclaims");
        total += cuts;
    }
    assert!(total >= 10, "too few windows cut before a dirty block: {total}");
}
