//! Adversarial review of 5d162cb ("Write-back yields to writers when nothing waits for it"):
//! the pre-cleaner below the high watermark, while the writers have more than half its
//! horizon ahead of them (or at its idle reach), writes back at `Pace::Gentle`: the log read
//! `GENTLE_READ_BLOCKS` (32) slots at a time (`read_slots_paced`) and at most
//! `GENTLE_WRITES_IN_FLIGHT` (4) backing writes per `write_batch` (`write_runs`); gentle
//! batches are not timed for reclaim's cost model (`note_write_back_batch`).
//!
//! Each test's comment says what it attacks (ATTACK) and what it found (FOUND). Rigs:
//! - `Rec`, a cache device that records every read (offset, length) and can have bad
//!   sectors (a read touching one fails; a write over one repairs it);
//! - `Queued`, a backing device on the virtual clock that models a queue depth: a
//!   `write_batch` of n writes costs `ceil(n / depth)` write latencies (the plain
//!   `SimDevice` charges every write of a batch one after another, so there the gentle pace
//!   costs nothing more and its cost cannot be seen), optionally holding its first batch;
//! - `Snap`, a backing device that snapshots both devices' images before each `write_batch`
//!   (a power cut between two groups of a gentle batch).
//!
//! Findings (tests that failed on 5d162cb; each now passes, fixed as its FIXED line says):
//! - `a_transient_read_error_in_a_gentle_batch_is_survived_as_at_full_pace`: one transient
//!   cache read error fails the volume at the gentle pace where full pace reads the stretch
//!   again run by run and goes on (the cap cuts gap-free stretches, which are not retried);
//! - `a_reclaim_behind_a_gentle_batch_waits_no_longer_than_behind_a_full_one`: a writer's
//!   reclaim waits 184 ms behind a gentle batch, 24 ms behind the same batch at full pace, on a
//!   backing device with 32 writes in flight at 1 ms (batches are sized by time at full pace;
//!   the pace is not revisited when a reclaim starts waiting);
//! - `gentle_batches_alone_leave_background_batches_untimed`: gentle batches are not timed, and
//!   that same timing sizes background batches: while every batch is gentle, batches stay at
//!   `DESTAGE_BATCH_UNTIMED_BLOCKS` (1,024 blocks, ~1 s on a 1 ms-a-write disk) instead of 64;
//! - `the_gentle_pace_over_two_lanes_of_virtual_time`: on the wide device, the writers'
//!   reclaims write back about twice as often, and the writer's busy time grows 23-26 %
//!   (with the fixes, unchanged where the writer leaves the device idle 4 ms a burst; a
//!   known cost, bounded, where it saturates it: see the test).
//!
//! The stretch splitting, the failure of any group of a gentle batch and power cuts between
//! the groups hold (the other tests).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use tiercache_device::{
    BlockDevice, Clock, DeviceError, FailMode, MonotonicClock, OpKind, SimClock, SimDevice, SimLatency,
};
use tiercache_engine::{create, CreateOptions, EngineError, Volume, VolumeOptions, VolumeState};
use tiercache_format::Layout;

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

mod common;
use common::holds::{thread_id, wait_until_blocked};
use common::*;

const GENTLE_READ_BLOCKS: u64 = tiercache_engine::constants::GENTLE_READ_BLOCKS as u64;
const GENTLE_WRITES_IN_FLIGHT: u64 = tiercache_engine::constants::GENTLE_WRITES_IN_FLIGHT as u64;
const MAX_READ_THROUGH_SLOTS: u64 = tiercache_engine::constants::MAX_READ_THROUGH_SLOTS as u64;

// ------------------------------------------------------------------------------------ rigs

/// A cache device that records its reads and can have bad sectors.
struct Rec {
    inner: Arc<SimDevice>,
    /// Byte offsets of bad sectors.
    bad: Mutex<Vec<u64>>,
    /// Every read: (offset, bytes).
    reads: Mutex<Vec<(u64, u64)>>,
}

impl Rec {
    fn new(inner: Arc<SimDevice>) -> Arc<Rec> {
        Arc::new(Rec { inner, bad: Mutex::new(Vec::new()), reads: Mutex::new(Vec::new()) })
    }
    fn read_check(&self, offset: u64, len: u64) -> tiercache_device::Result<()> {
        self.reads.lock().unwrap().push((offset, len));
        if self.bad.lock().unwrap().iter().any(|&b| offset <= b && b < offset + len) {
            return Err(DeviceError::Injected { device: "rec".into(), op: "read" });
        }
        Ok(())
    }
    fn repair(&self, offset: u64, len: u64) {
        self.bad.lock().unwrap().retain(|&b| !(offset <= b && b < offset + len));
    }
    fn take_reads(&self) -> Vec<(u64, u64)> {
        std::mem::take(&mut *self.reads.lock().unwrap())
    }
}

impl BlockDevice for Rec {
    forward_to_inner!(inner: size_bytes, logical_block_size, flush, discard);
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> tiercache_device::Result<()> {
        self.read_check(offset, buf.len() as u64)?;
        self.inner.read_at(offset, buf)
    }
    fn read_vectored_at(&self, offset: u64, bufs: &mut [&mut [u8]]) -> tiercache_device::Result<()> {
        let len: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        self.read_check(offset, len)?;
        self.inner.read_vectored_at(offset, bufs)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> tiercache_device::Result<()> {
        self.inner.write_at(offset, buf)?;
        self.repair(offset, buf.len() as u64);
        Ok(())
    }
    fn write_fua_at(&self, offset: u64, buf: &[u8]) -> tiercache_device::Result<()> {
        self.inner.write_fua_at(offset, buf)?;
        self.repair(offset, buf.len() as u64);
        Ok(())
    }
    fn describe(&self) -> String {
        "rec".into()
    }
}

/// A 1024-block log in 16-block segments (the pre-cleaner's horizon is a quarter of it, 256
/// blocks, while everything was written within the last second: gentle with at least 128
/// blocks free) over `backing_blocks` stamped with version 0, the cache seen through `Rec`.
fn rec_volume(backing_blocks: u64, options: VolumeOptions) -> (Arc<Rec>, Arc<SimDevice>, Volume) {
    const LOG: u64 = 1024;
    let ck = Layout::checkpoint_blocks_for(LOG, BS as u32);
    let inner = Arc::new(SimDevice::new((2 + 2 * ck + LOG) * BS as u64, BS as u32).with_name("cache"));
    let backing = Arc::new(SimDevice::from_image(stamps(0, backing_blocks, 0), BS as u32).with_name("backing"));
    create(&*inner, &*backing, &CreateOptions { segment_blocks: 16, ..log_only() }).expect("create");
    let rec = Rec::new(inner);
    let c: Arc<dyn BlockDevice> = rec.clone();
    let b: Arc<dyn BlockDevice> = backing.clone();
    let v = Volume::open(c, b, Arc::new(MonotonicClock::new()), options).expect("open").0;
    (rec, backing, v)
}

/// (Gentle by the horizon, `gentle_pace_by_horizon`: these rigs write their whole log within
/// milliseconds, a pace the shipped rule keeps at full speed.)
fn plain_options() -> VolumeOptions {
    VolumeOptions { sequential_bypass_bytes: 0, gentle_pace_by_horizon: true, ..VolumeOptions::default() }
}

/// Reads 16-block requests (admitted clean) from `*next` on, cycling over `from..to`, until
/// the log's tail reaches `until`.
fn fill_until(v: &Volume, next: &mut u64, from: u64, to: u64, until: u64) {
    let mut buf = vec![0u8; 16 * BS];
    let mut guard = 0;
    while v.status().log_tail < until {
        if *next + 16 > to {
            *next = from;
        }
        v.read(*next * BS as u64, &mut buf).unwrap();
        *next += 16;
        guard += 1;
        assert!(guard < 100_000, "the filler never reached {until}");
    }
}

/// The stretches `read_slots_paced` must read for a batch whose blocks sit in `slots`: sorted
/// by slot, a stretch goes on through gaps of at most `MAX_READ_THROUGH_SLOTS` slots, and
/// (with `span`) spans at most `span` slots, skipped ones included. (slot, slots spanned).
fn expected_stretches(mut slots: Vec<u32>, span: u64) -> Vec<(u32, u64)> {
    slots.sort_unstable();
    let mut out = Vec::new();
    let mut i = 0;
    while i < slots.len() {
        let start = slots[i];
        let mut end = start;
        i += 1;
        while i < slots.len() {
            let next = slots[i];
            if next == end || u64::from(next - end - 1) > MAX_READ_THROUGH_SLOTS {
                break;
            }
            if u64::from(next - start) + 1 > span {
                break;
            }
            end = next;
            i += 1;
        }
        out.push((start, u64::from(end - start) + 1));
    }
    out
}

fn assert_healthy(v: &Volume) {
    let s = v.status();
    assert_eq!(s.state, VolumeState::Ok, "the volume failed: {:?}", s.failure);
    assert_eq!(s.lost_blocks, 0, "blocks lost: {:?}", s.lost_block_numbers);
}

// ----------------------------------------------- attack 1: the stretches of a gentle read

/// ATTACK: `read_slots_paced` at the gentle pace: for whatever slots a batch holds (random
/// single-block writes over 2,000 blocks, so slot order is unrelated to block order; stale
/// copies, record headers and clean filler between them: gaps of 0 to 8 slots and more; the
/// log lapping, so batches hold slots at both physical ends; records of up to 48 blocks, so
/// stretches of exactly 32 and 33 slots), every block must land in its own place and the
/// reads must be exactly the stretches the rule gives: at most 32 slots each (skipped ones
/// included) at the gentle pace, as long as the gaps allow at full pace. 400 rounds of a
/// background tick, each checked against an independent model of the rule (batches whose
/// blocks were written back are told by the index before and after the round), the backing
/// device against the model of versions after every round, and everything at the end.
/// FOUND: holds (PASS): 8 seeds x 400 rounds, ~340 batches compared a seed (~185 gentle,
/// ~155 full), ~110 gentle batches a seed cut by the cap, ~190 stretches of exactly 32 slots,
/// 6-10 batches with slots at both physical ends; every read is the rule's stretch, every
/// block written back holds its version.
#[test]
fn gentle_reads_split_at_32_slots_and_land_every_block_in_its_place() {
    for seed in 0..8u64 {
        one_random_layout_run(seed);
    }
}

fn one_random_layout_run(seed: u64) {
    const LOG: u64 = 1024;
    const BLOCKS: u64 = 8192;
    // (One batch a round: the whole horizon in one batch, no idle reach.)
    let options = VolumeOptions {
        write_back_batch_bounds: Some((4096, 4096)),
        preclean_idle_age_ms: Some(1_000_000_000),
        ..plain_options()
    };
    let (rec, backing, v) = rec_volume(BLOCKS, options);
    let log0 = v.superblock().layout.log_offset(0);
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut model: HashMap<u64, u64> = HashMap::new();
    let mut version = 0u64;
    let mut filler = 2000u64;
    let (mut gentle_rounds, mut full_rounds, mut compared, mut capped, mut exactly_32, mut wrapped) =
        (0, 0, 0, 0, 0, 0);
    for round in 0..400u64 {
        for _ in 0..rng.gen_range(1..=4) {
            let n = rng.gen_range(1..=48u64);
            version += 1;
            let mut blocks: Vec<u64> = Vec::new();
            while (blocks.len() as u64) < n {
                let b = rng.gen_range(0..2000u64);
                if !blocks.contains(&b) {
                    blocks.push(b);
                }
            }
            for &b in &blocks {
                v.write(b * BS as u64, &stamp(b, version)).unwrap();
                model.insert(b, version);
            }
            v.flush().unwrap();
        }
        let tail = v.status().log_tail;
        let until = tail + rng.gen_range(0..=6u64) * 17;
        fill_until(&v, &mut filler, 2000, BLOCKS, until);

        let before: HashMap<u64, (u32, bool)> =
            v.index_snapshot().into_iter().map(|(b, e)| (b, (e.slot, e.dirty))).collect();
        let (g0, f0) = (v.status().counters.gentle_write_back_batches, backing.stats().flushes);
        rec.take_reads();
        v.background_tick().unwrap();
        let reads: Vec<(u32, u64)> = rec
            .take_reads()
            .into_iter()
            .filter(|&(o, _)| o >= log0 && o < log0 + LOG * BS as u64)
            .map(|(o, len)| (((o - log0) / BS as u64) as u32, len / BS as u64))
            .collect();
        let after: HashMap<u64, (u32, bool)> =
            v.index_snapshot().into_iter().map(|(b, e)| (b, (e.slot, e.dirty))).collect();
        let batch: Vec<(u64, u32)> = before
            .iter()
            .filter(|(b, &(slot, dirty))| dirty && after.get(b) == Some(&(slot, false)))
            .map(|(&b, &(slot, _))| (b, slot))
            .collect();
        let gentle = v.status().counters.gentle_write_back_batches - g0;
        let batches = backing.stats().flushes - f0;
        for &(b, slot) in &batch {
            assert_eq!(
                backing_version(&backing, b),
                Some(model[&b]),
                "seed {seed} round {round}: block {b} (slot {slot}) written back wrong (gentle batches {gentle})"
            );
        }
        if batch.is_empty() || batches != 1 {
            continue;
        }
        let slots: Vec<u32> = batch.iter().map(|&(_, s)| s).collect();
        let span = if gentle == 1 { GENTLE_READ_BLOCKS } else { u64::MAX };
        let mut want = expected_stretches(slots.clone(), span);
        let mut got = reads.clone();
        want.sort_unstable();
        got.sort_unstable();
        assert_eq!(
            got,
            want,
            "seed {seed} round {round}: the reads of a batch of {} blocks (gentle {gentle}) against the rule",
            batch.len()
        );
        compared += 1;
        if gentle == 1 {
            gentle_rounds += 1;
            let uncapped = expected_stretches(slots.clone(), u64::MAX);
            if uncapped.len() < want.len() {
                capped += 1;
            }
            exactly_32 += want.iter().filter(|s| s.1 == GENTLE_READ_BLOCKS).count();
            if slots.iter().any(|&s| u64::from(s) >= LOG - 32) && slots.iter().any(|&s| s < 32) {
                wrapped += 1;
            }
            assert!(got.iter().all(|r| r.1 <= GENTLE_READ_BLOCKS), "seed {seed} round {round}: {got:?}");
        } else {
            full_rounds += 1;
        }
    }
    eprintln!(
        "seed {seed}: {compared} batches compared ({gentle_rounds} gentle, {full_rounds} full); gentle: {capped} cut by the cap, {exactly_32} stretches of exactly 32 slots, {wrapped} with slots at both ends of the log"
    );
    assert_healthy(&v);
    for (&b, &ver) in &model {
        assert_eq!(read_version(&v, b).unwrap(), Some(ver), "seed {seed}: block {b}");
    }
    v.flush_all(|_, _| {}).unwrap();
    for (&b, &ver) in &model {
        assert_eq!(backing_version(&backing, b), Some(ver), "seed {seed}: backing block {b} after flush_all");
    }
    assert!(gentle_rounds >= 20 && capped >= 5 && exactly_32 >= 1 && wrapped >= 1, "seed {seed}: coverage too thin");
}

// ------------------------------------------------- attack 1b: errors in a gentle stretch

/// Six records of 32 blocks two apart on the backing device (0, 2, .. 382, version 1): a
/// header before each record's 32 consecutive slots; clean filler until `free` blocks are
/// left. (rec, backing, volume, the model's versions by block.)
fn six_records(free: u64) -> (Arc<Rec>, Arc<SimDevice>, Volume, HashMap<u64, u64>) {
    let (rec, backing, v) = rec_volume(4096, plain_options());
    let mut model = HashMap::new();
    for r in 0..6u64 {
        for b in (r * 64..r * 64 + 64).step_by(2) {
            v.write(b * BS as u64, &stamp(b, 1)).unwrap();
            model.insert(b, 1);
        }
        v.flush().unwrap();
    }
    let mut next = 1024;
    fill_until(&v, &mut next, 1024, 4096, 1024 - free);
    assert_eq!(v.status().log_head, 0, "nothing reclaimed yet");
    (rec, backing, v, model)
}

/// ATTACK: the medium-error fallback with the cap: a bad sector in a slot nobody needs (the
/// stale copy of a block rewritten since) inside a gentle stretch: the stretch fails, is read
/// again run by run, and the write-back goes on; every block written back holds its version.
/// FOUND: holds (PASS): the round succeeds at the gentle pace, the volume stays healthy, every
/// block written back holds its version.
#[test]
fn a_bad_stale_slot_inside_a_gentle_stretch_is_read_around() {
    let (rec, backing, v, mut model) = six_records(160);
    // Blocks 74 and 200 rewritten (their old slots stale, inside records 1 and 3), then the
    // filler again to 160 free.
    for b in [74u64, 200] {
        let (slot, _) = slot_of(&v, b).unwrap();
        v.write(b * BS as u64, &stamp(b, 2)).unwrap();
        v.flush().unwrap();
        model.insert(b, 2);
        rec.bad.lock().unwrap().push(v.superblock().layout.log_offset(u64::from(slot)) + 512);
    }
    let g0 = v.status().counters.gentle_write_back_batches;
    v.background_tick().unwrap();
    assert_healthy(&v);
    assert!(v.status().counters.gentle_write_back_batches > g0, "the round ran at the gentle pace");
    let written = 192 - v.status().dirty_blocks;
    assert!(written >= 96, "{written} written back");
    for (b, e) in v.index_snapshot() {
        if !e.dirty && model.contains_key(&b) {
            assert_eq!(backing_version(&backing, b), Some(model[&b]), "block {b}");
        }
    }
    for (&b, &ver) in &model {
        assert_eq!(read_version(&v, b).unwrap(), Some(ver), "block {b}");
    }
}

/// ATTACK: a transient cache read error (the next read fails once) during a write-back of
/// the six records: at full pace the batch's one stretch has gaps (the headers), so it is read
/// again run by run and survives (`adversarial_gap_read`'s
/// `a_transient_read_error_in_a_write_back_stretch_is_read_again_run_by_run`). At the gentle
/// pace the first stretch is the first record's 32 data slots exactly, with no gap: its
/// failure is not retried (`Err(e) if skipped == 0 => return Err(e)`) and `cache_io`
/// poisons the volume. Does the gentle split turn an error full pace survives into a failed
/// volume?
/// FOUND: BUG (FAILS): full pace (80 free): the round succeeds, the volume is Ok. Gentle pace
/// (160 free): the round returns the cache read error and the volume is Failed ("reading
/// dirty blocks from the cache device failed"). The cap makes gap-free stretches out of what
/// full pace reads as one stretch with gaps, and only a stretch with gaps is read again.
/// Nothing is lost (every block reads version 1 after a power cut).
/// FIXED: a stretch the cap cut short is read again run by run too (`read_slots_paced`).
#[test]
fn a_transient_read_error_in_a_gentle_batch_is_survived_as_at_full_pace() {
    let mut outcomes = Vec::new();
    for free in [80u64, 160] {
        let (rec, backing, v, model) = six_records(free);
        rec.inner.fail_after(Some(OpKind::Read), 0, FailMode::Once);
        let r = v.background_tick();
        let gentle = free == 160;
        let state = v.status().state;
        eprintln!("{free} free (gentle {gentle}): round {r:?}, volume {state:?} ({:?})", v.status().failure);
        outcomes.push((free, r.is_ok(), state));
        if state == VolumeState::Ok {
            for (b, e) in v.index_snapshot() {
                if !e.dirty && model.contains_key(&b) {
                    assert_eq!(backing_version(&backing, b), Some(model[&b]), "block {b}");
                }
            }
        }
        // Whatever happened, nothing is lost: after a power cut every block reads version 1.
        drop(v);
        let recovered = open(durable_copy(&rec.inner), durable_copy(&backing));
        for (&b, &ver) in &model {
            assert_eq!(read_version(&recovered, b).unwrap(), Some(ver), "{free} free: block {b} after recovery");
        }
    }
    assert!(outcomes[0].1 && outcomes[0].2 == VolumeState::Ok, "full pace: {:?}", outcomes[0]);
    assert!(
        outcomes[1].1 && outcomes[1].2 == VolumeState::Ok,
        "gentle pace: a transient read error the full pace survives failed the volume: {:?}",
        outcomes[1]
    );
}

// ------------------------------------- attack 2: a backing write failing in group k

/// ATTACK: a backing write fails in group k of a gentle batch (192 scattered blocks, one run
/// each: 4 writes a `write_batch`): the round must report the error, issue no group after it,
/// mark nothing clean, flush nothing, leave the volume working (as a failed full batch does,
/// `adversarial_write_batch`'s `a_failed_run_marks_nothing_clean_and_a_later_write_back_lands_all`),
/// and the next round must write everything back. Compared with the same failure at full
/// pace (80 free).
/// FOUND: holds (PASS): the gentle batch issues exactly k/4 + 1 `write_batch` calls (none after
/// the failing group), reports `EngineError::Device` like the full batch (1 call), marks
/// nothing clean, flushes nothing, leaves the volume Ok; the next rounds write every block
/// back.
#[test]
fn a_backing_write_failing_in_any_group_of_a_gentle_batch_marks_nothing_clean() {
    for free in [160u64, 80] {
        for k in [0u64, 1, 3, 4, 5, 7, 8, 30, 63] {
            let (_rec, backing, v, model) = six_records(free);
            let (s0, g0) = (backing.stats(), v.status().counters.gentle_write_back_batches);
            backing.fail_after(Some(OpKind::Write), k, FailMode::Once);
            let r = v.background_tick();
            let s1 = backing.stats();
            let gentle = free == 160;
            assert!(
                matches!(r, Err(EngineError::Device { .. })),
                "{free} free, k {k}: the round reports the backing error: {r:?}"
            );
            assert_eq!(v.status().dirty_blocks, 192, "{free} free, k {k}: marked clean after a failed write");
            assert_eq!(s1.flushes, s0.flushes, "{free} free, k {k}: the backing device was flushed");
            let groups = s1.write_batches - s0.write_batches;
            let want = if gentle { k / GENTLE_WRITES_IN_FLIGHT + 1 } else { 1 };
            assert_eq!(groups, want, "{free} free, k {k}: write_batch calls up to the failure");
            assert_eq!(v.status().state, VolumeState::Ok, "{free} free, k {k}: {:?}", v.status().failure);
            for (&b, &ver) in &model {
                assert_eq!(read_version(&v, b).unwrap(), Some(ver), "{free} free, k {k}: block {b}");
            }
            // The device works again: the next rounds land everything.
            for _ in 0..4 {
                v.background_tick().unwrap();
            }
            let g = v.status().counters.gentle_write_back_batches - g0;
            assert!(g > 0 || !gentle, "{free} free, k {k}: no gentle batch");
            for (b, e) in v.index_snapshot() {
                if !e.dirty && model.contains_key(&b) {
                    assert_eq!(backing_version(&backing, b), Some(model[&b]), "{free} free, k {k}: block {b}");
                }
            }
            assert!(v.status().dirty_blocks <= 96, "{free} free, k {k}: {} still dirty", v.status().dirty_blocks);
            v.flush_all(|_, _| {}).unwrap();
            for (&b, &ver) in &model {
                assert_eq!(backing_version(&backing, b), Some(ver), "{free} free, k {k}: backing block {b}");
            }
        }
    }
}

/// Images taken before a `write_batch`: (cache durable, backing durable, backing current).
type Images = (Vec<u8>, Vec<u8>, Vec<u8>);

/// A backing device that snapshots the cache's and its own images before each `write_batch`.
struct Snap {
    inner: Arc<SimDevice>,
    cache: Arc<SimDevice>,
    /// The images before each batch.
    snaps: Mutex<Vec<Images>>,
}

impl BlockDevice for Snap {
    forward_to_inner!(inner: size_bytes, logical_block_size, read_at, read_vectored_at, write_at, flush, discard);
    fn write_batch(&self, writes: &[(u64, &[u8])]) -> Vec<tiercache_device::Result<()>> {
        self.snaps.lock().unwrap().push((
            self.cache.durable_image(),
            self.inner.durable_image(),
            self.inner.current_image(),
        ));
        self.inner.write_batch(writes)
    }
    fn describe(&self) -> String {
        "snap".into()
    }
}

/// The 96 blocks of the power-cut tests: two apart, in three groups of 32.
fn blocks_96() -> Vec<u64> {
    (0..96u64).map(|i| (i / 32) * 64 + (i % 32) * 2).collect()
}

/// A 1,024-block log in 16-block segments over a backing device whose 96 blocks hold version
/// 1 (as if written back), the rest version 0.
fn devices_96() -> (Arc<SimDevice>, Arc<SimDevice>) {
    const LOG: u64 = 1024;
    let mut image = stamps(0, 4096, 0);
    for b in blocks_96() {
        let at = b as usize * BS;
        image[at..at + BS].copy_from_slice(&stamp(b, 1));
    }
    let ck = Layout::checkpoint_blocks_for(LOG, BS as u32);
    let cache = Arc::new(SimDevice::new((2 + 2 * ck + LOG) * BS as u64, BS as u32).with_name("cache"));
    let backing = Arc::new(SimDevice::from_image(image, BS as u32).with_name("backing"));
    create(&*cache, &*backing, &CreateOptions { segment_blocks: 16, ..log_only() }).expect("create");
    (cache, backing)
}

/// The 96 blocks dirty at version 2 (the backing device holds 1: a batch cut short mixes the
/// two), 32 to a record; clean filler until 160 blocks are free (gentle). No write-back timed
/// yet: every dense window is written back, the batch is all 96 (24 groups of 4).
fn rewritten_96(backing: Arc<dyn BlockDevice>, cache: Arc<SimDevice>) -> Volume {
    let c: Arc<dyn BlockDevice> = cache;
    let v = Volume::open(c, backing, Arc::new(MonotonicClock::new()), plain_options()).expect("open").0;
    for r in 0..3u64 {
        for b in (r * 64..r * 64 + 64).step_by(2) {
            v.write(b * BS as u64, &stamp(b, 2)).unwrap();
        }
        v.flush().unwrap();
    }
    let mut next = 1024;
    fill_until(&v, &mut next, 1024, 4096, 1024 - 160);
    assert_eq!(v.status().log_head, 0);
    v
}

/// ATTACK: power cuts between the groups of a gentle batch (before each `write_batch`: the
/// groups before it issued, not flushed), with the backing device's pending writes all lost
/// or all landed; and the backing device vanishing at write k of the batch, then a power cut
/// that drops, lands or tears its pending writes (several crash seeds). Recovery must serve
/// version 2 of every block, and a flush afterwards must leave it on the backing device.
/// FOUND: holds (PASS): 24 groups, each cut recovered with the pending backing writes lost and
/// with them landed; the device vanishing at writes 0, 3, 4, 17, 50, 90 with 4 crash seeds
/// each: every block reads version 2 and reaches the backing device after a flush.
#[test]
fn power_cuts_between_the_groups_of_a_gentle_batch_lose_nothing() {
    let blocks = blocks_96();
    let check = |v: &Volume, what: &str| {
        for &b in &blocks {
            assert_eq!(read_version(v, b).unwrap(), Some(2), "{what}: block {b}");
        }
    };
    // Between the groups.
    let (cache, backing) = devices_96();
    let snap = Arc::new(Snap { inner: backing.clone(), cache: cache.clone(), snaps: Mutex::new(Vec::new()) });
    let v = rewritten_96(snap.clone(), cache.clone());
    snap.snaps.lock().unwrap().clear();
    let g0 = v.status().counters.gentle_write_back_batches;
    v.background_tick().unwrap();
    assert!(v.status().counters.gentle_write_back_batches > g0, "gentle");
    let snaps = std::mem::take(&mut *snap.snaps.lock().unwrap());
    eprintln!("{} groups in the gentle round", snaps.len());
    assert!(snaps.len() >= 20, "{} groups", snaps.len());
    for (j, (c, b_durable, b_current)) in snaps.into_iter().enumerate() {
        for (which, b) in [("lost", b_durable), ("landed", b_current)] {
            let recovered = open(
                Arc::new(SimDevice::from_image(c.clone(), BS as u32)),
                Arc::new(SimDevice::from_image(b, BS as u32)),
            );
            check(&recovered, &format!("cut before group {j}, pending writes {which}"));
        }
    }
    check(&v, "after the batch");
    // The backing device vanishing at write k, then a power cut.
    for k in [0u64, 3, 4, 17, 50, 90] {
        for seed in 0..4u64 {
            let (cache, backing) = devices_96();
            let v = rewritten_96(backing.clone(), cache.clone());
            backing.fail_after(Some(OpKind::Write), k, FailMode::Forever);
            let r = v.background_tick();
            assert!(r.is_err(), "k {k}: {r:?}, {} dirty", v.status().dirty_blocks);
            drop(v);
            cache.crash(seed);
            backing.crash(seed * 7919 + k);
            let b2 = durable_copy(&backing);
            let recovered = open(durable_copy(&cache), b2.clone());
            check(&recovered, &format!("vanished at write {k}, crash seed {seed}"));
            recovered.flush_all(|_, _| {}).unwrap();
            for &b in &blocks {
                assert_eq!(backing_version(&b2, b), Some(2), "k {k} seed {seed}: backing block {b} after flush_all");
            }
        }
    }
}

// ------------------------------------------ attack 3: a reclaim behind a gentle batch

/// A backing device on the virtual clock with a queue: a `write_batch` of n writes costs
/// `ceil(n / depth)` write latencies, a lone write one latency; reads and flushes as the
/// `SimDevice` underneath (on the same clock) charges them. `overlapped`: a `write_batch` of
/// at most `GENTLE_WRITES_IN_FLIGHT` writes (a gentle batch's group) costs only its share of
/// the queue, `n / depth` latencies, charged at the next flush: a gentle batch then costs what
/// the same batch costs at full pace (the timing before 5d162cb), every other I/O the same as
/// in the queued model. Its first `write_batch` after `arm` is held until `release`.
struct Queued {
    inner: Arc<SimDevice>,
    clock: SimClock,
    write_ns: u64,
    depth: u64,
    overlapped: bool,
    /// (armed, held, open)
    hold: Mutex<(bool, bool, bool)>,
    cv: Condvar,
    batches: AtomicU64,
    /// (`overlapped`) writes issued since the last flush, not charged yet.
    pending: AtomicU64,
    /// Writes in the held `write_batch` (at the gentle pace at most 4).
    held_writes: AtomicU64,
}

impl Queued {
    fn arm(&self) {
        *self.hold.lock().unwrap() = (true, false, false);
    }
    fn wait_held(&self) {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        let mut g = self.hold.lock().unwrap();
        while !g.1 {
            assert!(std::time::Instant::now() < deadline, "the batch never came");
            g = self.cv.wait_timeout(g, std::time::Duration::from_millis(50)).unwrap().0;
        }
    }
    fn release(&self) {
        let mut g = self.hold.lock().unwrap();
        g.2 = true;
        self.cv.notify_all();
    }
    fn gate(&self, writes: usize) {
        let mut g = self.hold.lock().unwrap();
        if g.0 && !g.1 {
            self.held_writes.store(writes as u64, Ordering::SeqCst);
            g.1 = true;
            self.cv.notify_all();
            while !g.2 {
                g = self.cv.wait(g).unwrap();
            }
        }
    }
}

impl BlockDevice for Queued {
    forward_to_inner!(inner: size_bytes, logical_block_size, read_at, read_vectored_at, discard);
    fn flush(&self) -> tiercache_device::Result<()> {
        let pending = self.pending.swap(0, Ordering::SeqCst);
        self.clock.advance_ns((pending * self.write_ns).div_ceil(self.depth));
        self.inner.flush()
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> tiercache_device::Result<()> {
        self.clock.advance_ns(self.write_ns);
        self.inner.write_at(offset, buf)
    }
    fn write_batch(&self, writes: &[(u64, &[u8])]) -> Vec<tiercache_device::Result<()>> {
        self.gate(writes.len());
        self.batches.fetch_add(1, Ordering::Relaxed);
        let n = writes.len() as u64;
        if self.overlapped && n <= GENTLE_WRITES_IN_FLIGHT {
            self.pending.fetch_add(n, Ordering::SeqCst);
        } else {
            self.clock.advance_ns(n.div_ceil(self.depth) * self.write_ns);
        }
        self.inner.write_batch(writes)
    }
    fn describe(&self) -> String {
        "queued".into()
    }
}

/// A fast cache, and a backing device of `blocks` blocks, 1 ms a write, `depth` in flight,
/// 1 ms a flush, 0.1 ms a read (a RAID or a network volume: slow per I/O, wide), on one clock.
fn queued_rig(
    seg: u32,
    log: u64,
    blocks: u64,
    depth: u64,
    overlapped: bool,
    options: VolumeOptions,
) -> (SimClock, Arc<SimDevice>, Arc<Queued>, Arc<Volume>) {
    let clock = SimClock::new();
    let ck = Layout::checkpoint_blocks_for(log, BS as u32);
    let cache = Arc::new(
        SimDevice::new((2 + 2 * ck + log) * BS as u64, BS as u32).with_name("cache").with_clock(clock.clone(), FAST),
    );
    let inner = Arc::new(
        SimDevice::from_image(stamps(0, blocks, 0), BS as u32)
            .with_name("backing")
            .with_clock(clock.clone(), SimLatency { read_ns: 100_000, write_ns: 0, flush_ns: 1_000_000 }),
    );
    create(&*cache, &*inner, &CreateOptions { segment_blocks: seg, ..log_only() }).expect("create");
    let q = Arc::new(Queued {
        inner,
        clock: clock.clone(),
        write_ns: 1_000_000,
        depth,
        overlapped,
        hold: Mutex::new((false, false, false)),
        cv: Condvar::new(),
        batches: AtomicU64::new(0),
        pending: AtomicU64::new(0),
        held_writes: AtomicU64::new(0),
    });
    let c: Arc<dyn BlockDevice> = cache.clone();
    let b: Arc<dyn BlockDevice> = q.clone();
    let v = Arc::new(Volume::open(c, b, Arc::new(clock.clone()), options).expect("open").0);
    (clock, cache, q, v)
}

#[derive(Debug)]
#[allow(dead_code)]
struct Waited {
    free: u64,
    /// Writes in the held batch's first `write_batch` (4: gentle).
    first_group: u64,
    gentle_batches: u64,
    batch_blocks: u64,
    wait_ms: f64,
}

/// 256 scattered blocks written back first (a full batch, timed: about 31 µs a block at
/// depth 32, so background batches of ~760 blocks: 25 ms), then 1,200 scattered dirty blocks
/// in records of 32 (every window dense, too dense to copy over the lap), clean filler until
/// `free` blocks are left on a 4,096-block log (horizon 1,024: gentle from 512 free). The
/// background round's first `write_batch` is held (the destage lock with it); a writer then
/// writes single blocks, each FLUSHed, until its reclaim has passed the first dense window:
/// it waits for the destage lock. Then the batch goes on. Returns the writer's wait.
fn wait_behind_a_held_batch(free: u64) -> Waited {
    const LOG: u64 = 4096;
    let (_clock, _cache, q, v) = queued_rig(16, LOG, 16384, 32, false, plain_options());
    let mut model = vec![0u64; 16384];
    write_scattered_flushed(&v, &mut model, 8000, 256, 1);
    assert_eq!(v.destage_step(256).unwrap(), 256);
    let batch_blocks = v.status().background_batch_blocks;
    write_scattered_flushed(&v, &mut model, 0, 1200, 1);
    let mut next = 12000;
    fill_until(&v, &mut next, 12000, 16384, LOG - free);
    assert_eq!(v.status().log_head, 0);
    let g0 = v.status().counters.gentle_write_back_batches;
    q.arm();
    let bg = on_thread(&v, |v| v.background_tick());
    q.wait_held();
    let (tx, rx) = std::sync::mpsc::channel();
    let writer = on_thread(&v, move |v| {
        tx.send(thread_id()).unwrap();
        let mut b = 14000u64;
        while v.log_window().0 < 300 {
            v.write(b * BS as u64, &stamp(b, 2)).unwrap();
            v.flush().unwrap();
            b += 1;
        }
        b
    });
    let tid = rx.recv().unwrap();
    std::thread::sleep(std::time::Duration::from_millis(20));
    assert!(!writer.is_finished(), "the writer's reclaim never waited for the held batch");
    wait_until_blocked(tid);
    q.release();
    bg.join().unwrap().unwrap();
    let last = writer.join().unwrap();
    for b in 14000..last {
        model[b as usize] = 2;
    }
    let c = v.status().counters;
    assert!(c.reclaim_write_backs > 0, "the writer's reclaim wrote back");
    check_versions(&v, &model, "after the wait");
    Waited {
        free,
        first_group: q.held_writes.load(Ordering::SeqCst),
        gentle_batches: c.gentle_write_back_batches - g0,
        batch_blocks,
        wait_ms: c.reclaim_destage_wait_max_us as f64 / 1000.0,
    }
}

/// ATTACK: the pace is chosen once, when the batch is taken (`!self.reclaim_waits_for_destage()`
/// in `preclean`); a writer's reclaim that comes while a gentle batch is under way waits for
/// all of it at the gentle pace. Batches are sized by time at the full pace (DESTAGE_BATCH_MS,
/// 25 ms: "a writer whose reclaim needs the destage lock waits for the batch under way";
/// issue 13 allows no wait above 100 ms). On a backing device that serves 32 writes at once
/// at 1 ms each, how long does a reclaim wait behind a gentle batch, against the same batch
/// at full pace (300 free instead of 600)?
/// FOUND: BUG (FAILS): the reclaim waited 184.1 ms behind the gentle batch (729 blocks, 183
/// groups of 4 at 1 ms) against 24.1 ms behind the same batch at full pace: 7.6 times as
/// long, over issue 13's 100 ms. The batch is sized for full pace (765 blocks = 25 ms), runs
/// at the gentle pace, and keeps that pace after a reclaim starts waiting for it.
/// FIXED: a gentle batch looks again before each group of writes and each log read, and runs
/// the rest at full pace once a reclaim waits; and it is sized by the gentle batches' own
/// timing (an eighth of a full one until timed).
#[test]
fn a_reclaim_behind_a_gentle_batch_waits_no_longer_than_behind_a_full_one() {
    let gentle = wait_behind_a_held_batch(600);
    let full = wait_behind_a_held_batch(300);
    eprintln!("gentle: {gentle:?}\nfull:   {full:?}");
    assert!(
        gentle.first_group == GENTLE_WRITES_IN_FLIGHT && full.first_group > GENTLE_WRITES_IN_FLIGHT,
        "the paces of the held batches: {gentle:?} {full:?}"
    );
    assert!(
        gentle.wait_ms <= 2.0 * full.wait_ms.max(25.0),
        "a writer's reclaim waited {:.1} ms behind a gentle batch of ~{} blocks, {:.1} ms behind the same batch at full pace",
        gentle.wait_ms,
        gentle.batch_blocks,
        full.wait_ms
    );
}

// --------------------------------------- attack 4: gentle batches and the cost model

/// ATTACK: gentle batches are not timed (`note_write_back_batch` only at `Pace::Full`), and
/// the same call is what sizes background batches (`batch_fixed_ns`, `batch_io`). Where the
/// pre-cleaner keeps ahead of the writers, every batch is gentle: is the batch then ever sized
/// by time, or does it stay `DESTAGE_BATCH_UNTIMED_BLOCKS` (1,024) for good? On an HDD-like
/// backing device (1 ms a scattered write, one at a time: the gentle pace costs nothing
/// more there), 1,024 blocks hold the destage lock about a second, where a timed batch is 64
/// (`DESTAGE_BACKGROUND_BATCH_MIN_BLOCKS`, chosen because 256-block batches stalled MariaDB's
/// writers on an HDD). Control: the same log with the writers within half the horizon (full
/// pace).
/// FOUND: BUG (FAILS): after a gentle batch the background batch is still 1,024 blocks (no
/// write-back timed: `reclaim_write_back_us_per_block` None); that batch held the destage lock
/// 1,025 ms of virtual time. Control at full pace: the same first batch (1,025 ms), then 64
/// blocks (1.0 ms a block measured). While every batch is gentle, the batches stay at 1,024.
/// FIXED: gentle batches are timed apart (`ReclaimCosts::note_gentle_batch`) and size the
/// next gentle batch (`Status::gentle_batch_blocks`, checked here); reclaim's cost per block
/// still comes from full-pace batches only.
#[test]
fn gentle_batches_alone_leave_background_batches_untimed() {
    const HDD: SimLatency = SimLatency { read_ns: 100_000, write_ns: 1_000_000, flush_ns: 1_000_000 };
    const LOG: u64 = 8192;
    let mut seen = Vec::new();
    for free in [1200u64, 800] {
        let clock = SimClock::new();
        let (cache, backing) = devices_on_clock(16, LOG, 16384, &clock, FAST, HDD);
        let c: Arc<dyn BlockDevice> = cache.clone();
        let b: Arc<dyn BlockDevice> = backing.clone();
        let v = Volume::open(c, b, Arc::new(clock.clone()), plain_options()).expect("open").0;
        let mut model = vec![0u64; 16384];
        write_scattered_flushed(&v, &mut model, 0, 1600, 1);
        let mut next = 4000;
        fill_until(&v, &mut next, 4000, 16384, LOG - free);
        assert_eq!(v.status().log_head, 0);
        let mut rounds = Vec::new();
        for _ in 0..1 {
            let (t, g, d, f) = (
                clock.now_ns(),
                v.status().counters.gentle_write_back_batches,
                v.status().dirty_blocks,
                backing.stats().flushes,
            );
            v.background_tick().unwrap();
            let s = v.status();
            rounds.push((
                (clock.now_ns() - t) / 1_000_000,
                d - s.dirty_blocks,
                s.counters.gentle_write_back_batches - g,
                backing.stats().flushes - f,
                // (The batch the next round takes at its pace.)
                if s.counters.gentle_write_back_batches > g {
                    s.gentle_batch_blocks
                } else {
                    s.background_batch_blocks
                },
                s.reclaim_write_back_us_per_block,
            ));
        }
        eprintln!(
            "{free} free: rounds (virtual ms, blocks written back, gentle batches, batches, background batch blocks after, write-back us/block): {rounds:?}"
        );
        check_versions(&v, &model, "after the rounds");
        seen.push(rounds);
    }
    let (gentle, full) = (&seen[0], &seen[1]);
    assert!(gentle[0].2 > 0 && full[0].2 == 0, "the paces: {gentle:?} {full:?}");
    assert!(full[0].4 <= 64, "the control's batches are sized by time: {full:?}");
    assert!(
        gentle[0].4 <= 64,
        "after {} gentle batch(es) the background batch is still untimed: {} blocks (the round took {} ms of virtual time), against {} after one full batch",
        gentle[0].2,
        gentle[0].4,
        gentle[0].0,
        full[0].4
    );
}

// ---------------------------------------- attack 5: liveness over two lanes of time

#[derive(Debug, Clone, Copy)]
#[allow(dead_code)]
struct Lanes {
    /// The writer's busy time (its bursts, with its reclaims), think time left out.
    writer_ms: u64,
    worst_burst_ms: u64,
    reclaim_write_backs: u64,
    copied: u64,
    gentle_batches: u64,
    batches: u64,
    wait_max_ms: u64,
}

/// A writer and the background as two lanes of virtual time (as
/// `adversarial_background_batches`'s `two_lanes`): before each burst of the writer (32
/// scattered blocks and a FLUSH), background rounds run until the background lane has spent
/// as much time as the writer's. Backing device: 1 ms a write, 32 in flight (`overlapped`:
/// the gentle pace as cheap as the full one, see `Queued`).
fn two_lanes(overlapped: bool, bursts: u64, think_ns: u64) -> Lanes {
    let (clock, _cache, q, v) = queued_rig(16, 4096, 16384, 32, overlapped, plain_options());
    let mut model = vec![0u64; 16384];
    write_scattered_flushed(&v, &mut model, 8000, 256, 1);
    assert_eq!(v.destage_step(256).unwrap(), 256);
    write_scattered_flushed(&v, &mut model, 0, 1800, 1);
    let (c0, b0) = (v.status().counters, q.inner.stats().flushes);
    let (mut lane, mut busy, mut background, mut worst) = (0u64, 0u64, 0u64, 0u64);
    for k in 0..bursts {
        while background < lane {
            let t = clock.now_ns();
            v.background_tick().unwrap();
            let d = clock.now_ns() - t;
            background = if d < 1_000_000 { lane } else { background + d };
        }
        let t = clock.now_ns();
        write_scattered_flushed(&v, &mut model, 3700 + (k * 64) % 1000, 32, 2 + k);
        let d = clock.now_ns() - t;
        worst = worst.max(d);
        busy += d;
        // The writer's think time: the background lane's to use.
        clock.advance_ns(think_ns);
        lane += d + think_ns;
    }
    let writer = busy;
    check_versions(&v, &model, "two lanes");
    let c = v.status().counters;
    Lanes {
        writer_ms: writer / 1_000_000,
        worst_burst_ms: worst / 1_000_000,
        reclaim_write_backs: c.reclaim_write_backs - c0.reclaim_write_backs,
        copied: c.copied_forward_blocks - c0.copied_forward_blocks,
        gentle_batches: c.gentle_write_back_batches - c0.gentle_write_back_batches,
        batches: q.inner.stats().flushes - b0,
        wait_max_ms: c.reclaim_destage_wait_max_us / 1000,
    }
}

/// ATTACK: does the gentle pace make the pre-cleaner fall behind, so that the writers'
/// reclaims write back in their path more often (and their lane takes longer) than when the
/// gentle pace costs nothing more (the overlapped device: the timing before 5d162cb), or does
/// the pace oscillate without the pre-cleaner ever catching up?
/// FOUND: BUG (FAILS for 0 and 2 ms of think time): writer busy time 179 ms against 142
/// (+26 %), reclaim write-backs 21 against 10; with 2 ms: 148 against 120 (+23 %), 12 against
/// 5; with 4 ms: 128 against 120, 7 against 5 (within the bounds). There are only 1-2 gentle
/// batches in each run: the first, ~730 blocks sized for full pace, takes 7.6 times as long,
/// the background lane is spent on it, and the writers meet dense windows that the
/// pre-cleaner has not reached (the pace only goes back to full between batches). No
/// oscillation: once behind, the batches run at full pace.
/// FIXED in part, with the gentle batch sized by its own timing (an eighth of a full one until
/// timed) and the pace looked at again within the batch: with 4 ms of think time the lanes
/// are now the same (120 ms, 5 reclaim write-backs both); with 2 ms 129 against 120 ms, 9
/// against 5; with none (a writer saturating a device that takes 32 writes at once, the
/// gentle pace's worst case: it then does them 4 at a time) 194 against 142 ms, 25 against
/// 10. The lost ground is the first few gentle batches', before the writers come within half
/// the horizon: a lane that never idles does not win it back (a back-off to full pace after a
/// writer's reclaim wrote back, tried, changed nothing: all gentle batches come before it).
/// A known cost, kept within these bounds: where the writer idles the lanes must match; where
/// it does not, its lane may grow by half at most and no burst may take more than twice the
/// longest at full pace (ARCHITECTURE.md, the pre-cleaner's pace).
#[test]
fn the_gentle_pace_over_two_lanes_of_virtual_time() {
    let mut failures = Vec::new();
    for think_ms in [0u64, 2, 4] {
        let queued = two_lanes(false, 1500, think_ms * 1_000_000);
        let overlapped = two_lanes(true, 1500, think_ms * 1_000_000);
        eprintln!("think {think_ms} ms a burst:\n  depth-32 queue: {queued:?}\n  overlapped:     {overlapped:?}");
        let grew = if think_ms >= 4 {
            queued.writer_ms * 100 > overlapped.writer_ms * 110 + 100
                || queued.reclaim_write_backs > overlapped.reclaim_write_backs * 11 / 10 + 3
        } else {
            // (A burst that reclaims with a write-back of its own takes 4 ms here, at either
            // pace.)
            queued.writer_ms * 2 > overlapped.writer_ms * 3
                || queued.worst_burst_ms > 2 * overlapped.worst_burst_ms.max(4)
        };
        if grew {
            failures.push(format!("think {think_ms} ms: {queued:?} against {overlapped:?}"));
        }
    }
    assert!(failures.is_empty(), "the writer's lane (busy ms) or its reclaims' write-backs grew: {failures:#?}");
}
