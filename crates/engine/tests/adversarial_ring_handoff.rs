//! Adversarial review of a13cb50 ("Probation ring batches go to the record writer thread"):
//! with a record writer registered, the reader whose admission fills the probation ring's RAM
//! batch wakes the record writer instead of writing the batch; the record writer
//! (`Background`'s thread, or whoever calls `write_handed_off_records`) writes it; a reader
//! still writes it with no record writer, or when "more than a batch" is gathered
//! (`Probation::batch_overdue`, read as "the record writer is behind").
//!
//! Each test is one suspicion; its doc comment says what it attacks and whether it held
//! (FINDING) or was refuted (expected to pass). Races are made deterministic by holding a
//! chosen device I/O (`common::holds::Dev`, `LateRead`); every wait is bounded.
//!
//! Results on a13cb50: 10 pass, 3 fail, all three one finding. No stale read, no copy
//! installed after its block changed, no stranded batch, no FLUSH or shutdown held up by a
//! ring write, no lock-order or ring-invariant panic on the record writer's thread, nothing
//! of the ring recovered at open (the simulator, `cargo test -p tiercache-sim`, passes too).
//! The finding (performance): `batch_overdue` as it was ("more than a batch gathered") is no
//! test of "the record writer is behind": a request that fills the batch past `BATCH` (a
//! 4 KiB miss then a 256 KiB read; every batch of 12 KiB reads, 63 -> 66; two concurrent
//! 4 KiB readers both admitting before either checks) made its reader write the batch
//! synchronously, though the record writer was never woken for it:
//! - `a_request_that_fills_the_batch_past_its_size_hands_it_off_too`;
//! - `reads_whose_size_does_not_divide_the_batch_still_hand_it_off`;
//! - `with_background_the_record_writer_writes_the_batches_of_12k_reads_too`.
//!
//! Fixed in e24c6ad: overdue is half the slack beyond a batch gathered too (96 of the
//! batch's 128); all 13 pass.
//!
//! Blocks: 100..999 are the blocks under test, 1000.. one-time fillers (`cold`), 20_000.. and
//! 30_000.. the multi-block readers' blocks; the backing device's fingerprint blocks (0, 1, 16,
//! the last) are never written around. Version 0 is the backing device's initial content.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Once};
use std::time::Duration;
use tiercache_device::{BlockDevice, MonotonicClock, SimDevice};
use tiercache_engine::{create, Background, CreateOptions, Volume, VolumeOptions, WriteAroundPolicy};

mod common;
use common::holds::{around, covers, crash_and_recover, finishes_within, join_within, ver, write_n, Dev, LateRead, Op};
use common::*;

const SEG: u32 = 16;
const LOG_SEGMENTS: u64 = 160; // 2,560 blocks: a ring of 256 (10 %), the log 2,304
const RING: u64 = 256;
const BATCH: u64 = 64; // PROBATION_BATCH_BLOCKS
const BLOCKS: u64 = 65_536;

// ------------------------------------------------------------------------------------------
// Devices, volumes, helpers.

/// A cache with a ring of 10 % of its log, and a backing device stamped with version 0 that
/// never tears a block (so that write-around is allowed).
fn make_devices() -> (Arc<SimDevice>, Arc<SimDevice>) {
    let log_blocks = LOG_SEGMENTS * u64::from(SEG);
    let ck = tiercache_format::Layout::checkpoint_blocks_for(log_blocks, BS as u32);
    let cache = Arc::new(SimDevice::new((2 + 2 * ck + log_blocks) * BS as u64, BS as u32).with_name("cache"));
    let backing = Arc::new(
        SimDevice::from_image(stamps(0, BLOCKS, 0), BS as u32).with_name("backing").with_atomic_write(BS as u32),
    );
    create(
        &*cache,
        &*backing,
        &CreateOptions { segment_blocks: SEG, probation_permille: 100, ..CreateOptions::default() },
    )
    .expect("create");
    (cache, backing)
}

fn open_on(cache: Arc<dyn BlockDevice>, backing: Arc<dyn BlockDevice>, options: VolumeOptions) -> Volume {
    Volume::open(cache, backing, Arc::new(MonotonicClock::new()), options).expect("open").0
}

/// S3-FIFO, no sequential bypass (the tests read blocks in order at times).
fn opts() -> VolumeOptions {
    VolumeOptions { sequential_bypass_bytes: 0, ..s3fifo() }
}

/// `opts`, and writes of two blocks or more go around whatever the dirty level.
fn wa_opts() -> VolumeOptions {
    VolumeOptions {
        write_around: WriteAroundPolicy { min_bytes: 2 * BS as u64, only_when_destage_bound: false },
        ..opts()
    }
}

/// The `n`-th one-time block: distinct, far from the blocks under test, not consecutive.
fn cold(n: u64) -> u64 {
    1_000 + (n * 7) % 60_000
}

/// Reads `n` one-time blocks, one per request, from `*next` on.
fn read_cold(v: &Volume, next: &mut u64, n: u64) {
    read_once(v, (*next..*next + n).map(cold));
    *next += n;
}

/// Reads blocks `first..first + n` in one request and checks they hold version 0.
fn read_run(v: &Volume, first: u64, n: u64) {
    let mut buf = vec![0u8; n as usize * BS];
    v.read(first * BS as u64, &mut buf).unwrap();
    for (i, b) in buf.chunks(BS).enumerate() {
        assert_eq!(version_of(first + i as u64, b), Some(0), "block {}", first + i as u64);
    }
}

/// The cache block of ring position `pos`.
fn ring_block(v: &Volume, pos: u64) -> u64 {
    v.superblock().layout.probation_block(pos).expect("a ring")
}

/// Whether the cache device's ring slot of position `pos` holds `block` at `version`.
fn slot_holds(cache: &SimDevice, v: &Volume, pos: u64, block: u64, version: u64) -> bool {
    let mut buf = vec![0u8; BS];
    cache.read_at(ring_block(v, pos) * BS as u64, &mut buf).unwrap();
    version_of(block, &buf) == Some(version)
}

/// A hold of the first write reaching the ring's slot of position 0.
fn hold_ring_write(cache: &Dev, v: &Volume) -> usize {
    let first = ring_block(v, 0);
    cache.hold(move |op, off, len| op == Op::Write && covers(off, len, first))
}

/// Writes `block` straight to the backing device (no volume), durably.
fn change_backing(backing: &SimDevice, block: u64, version: u64) {
    backing.write_at(block * BS as u64, &stamp(block, version)).unwrap();
    backing.flush().unwrap();
}

/// Seals staging into a record: a write of the last block (a fingerprint block: never
/// written around), then FLUSH.
fn seal(v: &Volume) {
    write(v, BLOCKS - 1, 1);
    v.flush().unwrap();
}

/// Panics on `Background`'s threads (the record writer's, the background's) since the
/// process started: such a thread dies silently (`Background::drop` ignores its join's
/// result), and with it the record writer's work (the flag stays set, nobody is woken).
static BACKGROUND_PANICS: AtomicU64 = AtomicU64::new(0);

fn watch_background_panics() {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if matches!(std::thread::current().name(), Some("tiercache-rec" | "tiercache-bg")) {
                BACKGROUND_PANICS.fetch_add(1, Ordering::SeqCst);
            }
            previous(info);
        }));
    });
}

// ------------------------------------------------------------------------------------------
// 1. The hand-off rule.

/// Attacks `batch_overdue` as the test of "the record writer is behind": a single request
/// that takes the batch from below `BATCH` to past it (here 1 -> 65: one 4 KiB miss, then one
/// 256 KiB read of 64 misses) is the first to fill the batch; the record writer was never
/// woken for it, so it is not behind, yet "more than a batch is gathered" and the reader
/// writes the batch itself, synchronously: the very latency the commit removes.
/// FINDING (performance; contradicts the commit's rule "a reader still writes it when there
/// is no record writer or it is a batch behind"). Fails on a13cb50.
#[test]
fn a_request_that_fills_the_batch_past_its_size_hands_it_off_too() {
    let (c, b) = make_devices();
    let v = open_on(c.clone(), b.clone(), opts());
    v.set_record_writer(Some(std::thread::current()));
    read_once(&v, [cold(0)].into_iter());
    let writes = c.stats().writes;
    read_run(&v, 20_000, BATCH);
    assert_eq!(v.status().probation_blocks, BATCH + 1, "all admitted into the ring's batch");
    assert_eq!(
        c.stats().writes,
        writes,
        "the reader whose one request first filled the batch (1 -> {}) wrote it itself, though the record writer was never woken for it",
        BATCH + 1
    );
    assert_eq!(v.write_handed_off_records().unwrap(), 0);
    assert_eq!(c.stats().writes, writes + 1, "the record writer wrote the batch");
}

/// Attacks the same rule with a steady stream of 12 KiB reads at queue depth 1 (3 blocks a
/// request: 64 is no multiple of 3, so the request that fills each batch overshoots it,
/// 63 -> 66): every batch is then written by a reader, never handed off, although the
/// record writer is idle all along. FINDING (performance), as above. Fails on a13cb50.
#[test]
fn reads_whose_size_does_not_divide_the_batch_still_hand_it_off() {
    let (c, b) = make_devices();
    let v = open_on(c.clone(), b.clone(), opts());
    v.set_record_writer(Some(std::thread::current()));
    let writes = c.stats().writes;
    // 22 reads of 3 blocks: 63 gathered after 21, the 22nd takes the batch to 66.
    for k in 0..22 {
        read_run(&v, 30_000 + 100 * k, 3);
    }
    assert_eq!(v.status().probation_blocks, 66);
    assert_eq!(c.stats().writes, writes, "a reader wrote the batch: 12 KiB reads never hand a batch off");
}

/// A cache device that counts the writes reaching the probation ring by the thread issuing
/// them: `Background`'s record writer ("tiercache-rec") or another (a reader).
struct RingWriters {
    inner: Arc<SimDevice>,
    ring: std::ops::Range<u64>,
    by_record_writer: AtomicU64,
    by_others: AtomicU64,
}

impl RingWriters {
    fn new(inner: &Arc<SimDevice>) -> Arc<RingWriters> {
        let l = tiercache_engine::read_superblock(&**inner).unwrap().layout;
        let start = (l.log_start + l.log_blocks) * BS as u64;
        Arc::new(RingWriters {
            inner: Arc::clone(inner),
            ring: start..start + l.probation_blocks * BS as u64,
            by_record_writer: AtomicU64::new(0),
            by_others: AtomicU64::new(0),
        })
    }
    fn counts(&self) -> (u64, u64) {
        (self.by_record_writer.load(Ordering::SeqCst), self.by_others.load(Ordering::SeqCst))
    }
}

impl BlockDevice for RingWriters {
    forward_to_inner!(inner: size_bytes, logical_block_size, read_at, flush, discard);
    fn write_at(&self, offset: u64, buf: &[u8]) -> tiercache_device::Result<()> {
        if offset < self.ring.end && self.ring.start < offset + buf.len() as u64 {
            let ours = std::thread::current().name() == Some("tiercache-rec");
            if ours { &self.by_record_writer } else { &self.by_others }.fetch_add(1, Ordering::SeqCst);
        }
        self.inner.write_at(offset, buf)
    }
    fn describe(&self) -> String {
        "ring-writers".into()
    }
}

/// The same finding with the real record writer thread (`Background`) and a client at queue
/// depth 1 that waits 5 ms between requests (a slow backing device's latency; the record
/// writer has all the time it needs, even on a loaded machine): with 4 KiB reads the record writer writes the batches; with
/// 12 KiB reads every batch is written by the reader whose request overshot it, none by the
/// idle record writer. FINDING (performance), as above. Fails on a13cb50 (on the 12 KiB
/// phase).
#[test]
fn with_background_the_record_writer_writes_the_batches_of_12k_reads_too() {
    watch_background_panics();
    let (c, b) = make_devices();
    let dev = RingWriters::new(&c);
    let v = Arc::new(open_on(dev.clone(), b.clone(), opts()));
    let bg = Background::start(&v);
    let pace = || std::thread::sleep(Duration::from_millis(5));
    let mut next = 0;
    for _ in 0..4 * BATCH {
        read_cold(&v, &mut next, 1);
        pace();
    }
    wait_until("the last 4 KiB batch written", || dev.counts().0 + dev.counts().1 >= 4);
    let four_k = dev.counts();
    assert!(four_k.0 >= 3, "4 KiB reads: (record writer, readers) wrote {four_k:?} batches");
    // 12 KiB: 64 is no multiple of 3. 86 reads: 258 blocks, four batches' worth.
    for k in 0..86 {
        read_run(&v, 30_000 + 100 * k, 3);
        pace();
    }
    std::thread::sleep(Duration::from_millis(100));
    let twelve_k = (dev.counts().0 - four_k.0, dev.counts().1 - four_k.1);
    drop(bg);
    assert_eq!(BACKGROUND_PANICS.load(Ordering::SeqCst), 0, "a background thread panicked");
    assert!(
        twelve_k.1 <= 1,
        "12 KiB reads at queue depth 1 with an idle record writer: (record writer, readers) wrote {twelve_k:?} batches"
    );
}

/// Attacks liveness when the record writer goes away with a batch handed off
/// (`set_record_writer(None)`, as `Background::drop` does): the batch must not wait in RAM
/// for an admission that may never come; the next read of any kind (here a hit in the very
/// batch, which admits nothing) writes it. Refuted: expected to pass.
#[test]
fn a_batch_handed_off_to_a_record_writer_that_went_away_is_written_by_the_next_read() {
    let (c, b) = make_devices();
    let v = open_on(c.clone(), b.clone(), opts());
    v.set_record_writer(Some(std::thread::current()));
    let mut next = 0;
    let writes = c.stats().writes;
    read_cold(&v, &mut next, BATCH);
    assert_eq!(c.stats().writes, writes, "handed off");
    v.set_record_writer(None);
    read_once(&v, [cold(0)].into_iter()); // a hit in RAM: no admission
    assert_eq!(c.stats().writes, writes + 1, "the next read wrote the batch");
    assert!(slot_holds(&c, &v, 0, cold(0), 0) && slot_holds(&c, &v, BATCH - 1, cold(BATCH - 1), 0));
    let reads = c.stats().reads;
    read_once(&v, [cold(1)].into_iter());
    assert_eq!(c.stats().reads, reads + 1, "read from its ring slot");
    let counters = v.status().counters;
    assert_eq!((counters.probation_admitted_blocks, counters.probation_busy_blocks), (BATCH, 0));
}

/// Attacks `write_handed_off_records` (the simulator's record writer) on a failing device: a
/// handed-off record's write fails (the volume is poisoned) and the `?` returns before
/// `write_probation_if_full`, so the batch handed off at the same time is skipped. It must not
/// be stranded: reads still serve it right, and the record writer's next turn writes it
/// (there is no unclaimed record left to fail on). Refuted: expected to pass.
#[test]
fn a_batch_handed_off_beside_a_failing_record_write_is_written_on_the_next_turn() {
    let (c, b) = make_devices();
    let v = open_on(c.clone(), b.clone(), opts());
    v.set_record_writer(Some(std::thread::current()));
    let mut k = 0;
    while v.status().counters.handed_off_records == 0 {
        assert!(k < 1000, "no record was ever handed off");
        write(&v, 400 + k, 1);
        k += 1;
    }
    let mut next = 0;
    read_cold(&v, &mut next, BATCH);
    let writes = c.stats().writes;
    c.fail_after(Some(tiercache_device::OpKind::Write), 0, tiercache_device::FailMode::Once);
    assert!(v.write_handed_off_records().is_err(), "the record's write failed");
    assert_eq!(c.stats().writes, writes, "the ring batch was written past the failure");
    assert_eq!(v.status().state, tiercache_engine::VolumeState::Failed);
    read_once(&v, [cold(0)].into_iter());
    assert_eq!(v.write_handed_off_records().unwrap(), 0);
    assert!(slot_holds(&c, &v, 0, cold(0), 0), "the batch stranded in RAM");
    let reads = c.stats().reads;
    read_once(&v, [cold(1)].into_iter());
    assert_eq!(c.stats().reads, reads + 1, "read from its ring slot");
    assert_eq!(ver(&v, 400), 1, "the failed record's data still served");
}

// ------------------------------------------------------------------------------------------
// 2. Stale data: copies changed while their batch is handed off, or written by the record
// writer.

/// Attacks the longer life of a batch in RAM: copies in a batch handed off and not yet begun
/// are changed (a write-around of two, a write through the cache of a third, a TRIM of a
/// fourth followed by a change of the backing device). They must leave the batch (so it is
/// no longer full, and the record writer finds nothing to write), never be served, and never
/// be installed when the batch, filled again, is written. Refuted: expected to pass.
#[test]
fn copies_changed_while_their_batch_waits_for_the_record_writer_are_never_served() {
    let (c, b) = make_devices();
    let v = open_on(c.clone(), b.clone(), wa_opts());
    v.set_record_writer(Some(std::thread::current()));
    let (x, y, z) = (200, 210, 220);
    read_once(&v, [x, x + 1, y, z].into_iter());
    let mut next = 0;
    let writes = c.stats().writes;
    read_cold(&v, &mut next, BATCH - 4);
    assert_eq!((v.status().probation_blocks, c.stats().writes), (BATCH, writes), "a full batch, handed off");
    write_n(&v, x, 2, 2).unwrap();
    assert_eq!(around(&v), 2, "the write went around");
    write(&v, y, 1);
    v.discard(z * BS as u64, BS as u64).unwrap();
    change_backing(&b, z, 3);
    assert_eq!(v.status().probation_blocks, BATCH - 4, "the changed copies left the batch");
    // (Settles the write-around: until then no miss is admitted, `Around::admissible`.)
    v.flush().unwrap();
    let writes = c.stats().writes;
    assert_eq!(v.write_handed_off_records().unwrap(), 0);
    assert_eq!(c.stats().writes, writes, "the record writer wrote a batch no longer full");
    for _ in 0..3 {
        assert_eq!((ver(&v, x), ver(&v, x + 1), ver(&v, y), ver(&v, z)), (2, 2, 1, 3));
    }
    // (The reads of x, x + 1 and z re-admitted their current data.) Filled again and written.
    let missing = BATCH - v.status().probation_blocks;
    read_cold(&v, &mut next, missing);
    assert_eq!(v.status().probation_blocks, BATCH);
    v.write_handed_off_records().unwrap();
    assert_eq!(c.stats().writes, writes + 1, "the batch written");
    for _ in 0..3 {
        assert_eq!((ver(&v, x), ver(&v, x + 1), ver(&v, y), ver(&v, z)), (2, 2, 1, 3), "from the ring");
    }
    v.flush().unwrap();
    seal(&v);
    let r = crash_and_recover(&c, &b);
    assert_eq!((ver(&r, x), ver(&r, x + 1), ver(&r, y), ver(&r, z)), (2, 2, 1, 3), "after FLUSH and a power cut");
}

/// Attacks `finish_write` on the record writer's thread: the record writer's ring write is
/// held while a client changes copies of the batch (write-around, write, TRIM + backing
/// change) and readers miss them again (their new data gathers into the next batch while
/// the old copies are still in the batch being written). When the write returns, none of the
/// old copies may be installed; reads then and after a power cut are the new versions.
/// Refuted: expected to pass.
#[test]
fn copies_changed_while_the_record_writer_writes_their_batch_are_not_installed() {
    let (c, b) = make_devices();
    let cache = Dev::new(&c);
    let v = Arc::new(open_on(cache.clone(), b.clone(), wa_opts()));
    v.set_record_writer(Some(std::thread::current()));
    let hold = hold_ring_write(&cache, &v);
    let (x, y, z) = (200, 210, 220);
    read_once(&v, [x, x + 1, y, z].into_iter());
    let mut next = 0;
    read_cold(&v, &mut next, BATCH - 4);
    let rw = on_thread(&v, |v| v.write_handed_off_records());
    cache.wait_held(hold);
    assert_eq!((ver(&v, x), ver(&v, y), ver(&v, z)), (0, 0, 0), "served from RAM meanwhile");
    write_n(&v, x, 2, 2).unwrap();
    assert_eq!(around(&v), 2, "the write went around");
    write(&v, y, 1);
    v.discard(z * BS as u64, BS as u64).unwrap();
    change_backing(&b, z, 3);
    // Missed again while the old copies are in the batch being written: the new data gathers.
    assert_eq!((ver(&v, x), ver(&v, x + 1), ver(&v, y), ver(&v, z)), (2, 2, 1, 3), "during the ring write");
    cache.release(hold);
    assert_eq!(join_within(rw, 30, "the record writer").unwrap(), 0);
    for _ in 0..3 {
        assert_eq!((ver(&v, x), ver(&v, x + 1), ver(&v, y), ver(&v, z)), (2, 2, 1, 3), "after the ring write");
    }
    // The next batch (holding x, x + 1 and z at their new versions) written too.
    read_cold(&v, &mut next, BATCH);
    v.write_handed_off_records().unwrap();
    for _ in 0..3 {
        assert_eq!((ver(&v, x), ver(&v, x + 1), ver(&v, y), ver(&v, z)), (2, 2, 1, 3), "after the next batch");
    }
    v.flush().unwrap();
    seal(&v);
    let r = crash_and_recover(&c, &b);
    assert_eq!((ver(&r, x), ver(&r, x + 1), ver(&r, y), ver(&r, z)), (2, 2, 1, 3), "after FLUSH and a power cut");
}

/// Attacks a block held twice by the ring: reader A misses x and is held after its backing
/// read; reader B misses x too and admits it, its batch fills and the record writer's write
/// of it is held; A's admission then puts x into the next batch (x is in the batch being
/// written and in the one gathering). A write of x must forget both: neither is installed
/// when its batch is written, and x reads its new version through laps of the ring.
/// Refuted: expected to pass.
#[test]
fn a_block_in_both_the_batch_being_written_and_the_next_is_forgotten_in_both() {
    let (c, b) = make_devices();
    let cache = Dev::new(&c);
    let backing = LateRead::new(&b);
    let v = Arc::new(open_on(cache.clone(), backing.clone(), opts()));
    v.set_record_writer(Some(std::thread::current()));
    let x = 300;
    backing.arm(x);
    let a = on_thread(&v, move |v| read_version(v, x));
    backing.wait_held();
    read_once(&v, [x].into_iter()); // B
    let mut next = 0;
    read_cold(&v, &mut next, BATCH - 1);
    let hold = hold_ring_write(&cache, &v);
    let rw = on_thread(&v, |v| v.write_handed_off_records());
    cache.wait_held(hold);
    backing.release();
    assert_eq!(join_within(a, 30, "reader A").unwrap(), Some(0));
    assert_eq!(v.status().probation_blocks, BATCH + 1, "x in the batch being written and in the next");
    write(&v, x, 1);
    assert_eq!(v.status().probation_blocks, BATCH - 1, "both copies forgotten");
    cache.release(hold);
    join_within(rw, 30, "the record writer").unwrap();
    assert_eq!(ver(&v, x), 1);
    seal(&v);
    for _ in 0..3 {
        read_cold(&v, &mut next, BATCH);
        v.write_handed_off_records().unwrap();
        assert_eq!(ver(&v, x), 1);
    }
    read_cold(&v, &mut next, 2 * RING);
    v.write_handed_off_records().unwrap();
    assert_eq!(ver(&v, x), 1, "after two laps of the ring");
}

// ------------------------------------------------------------------------------------------
// 3. The real record writer thread (`Background`): liveness, records, shutdown, crash.

/// Attacks the wake-up: with `Background` running, a batch filled exactly by one reader at
/// queue depth 1 and no read after it must still be written (the reader's unpark, or the
/// record writer's period), and its blocks then read from their ring slots.
/// Refuted: expected to pass.
#[test]
fn with_background_a_handed_off_batch_is_written_without_another_read() {
    watch_background_panics();
    let (c, b) = make_devices();
    let v = Arc::new(open_on(c.clone(), b.clone(), opts()));
    let bg = Background::start(&v);
    let mut next = 0;
    read_cold(&v, &mut next, BATCH);
    wait_until("the record writer wrote the batch", || {
        slot_holds(&c, &v, 0, cold(0), 0) && slot_holds(&c, &v, BATCH - 1, cold(BATCH - 1), 0)
    });
    // (`finish_write` may lag the device write by a moment.)
    wait_until("a read of the batch reads its ring slot", || {
        let reads = c.stats().reads;
        read_once(&v, [cold(3)].into_iter());
        c.stats().reads == reads + 1
    });
    drop(bg);
    assert_eq!(BACKGROUND_PANICS.load(Ordering::SeqCst), 0, "a background thread panicked");
}

/// Attacks "records delayed": the record writer thread is stuck in a ring write (held) while
/// a writer seals a record (handed off to that busy thread) and then FLUSHes. The FLUSH must
/// not wait for the ring write (it writes the record nobody began itself), and the record
/// is written even without a FLUSH (the background's tick takes records not begun).
/// Refuted: expected to pass.
#[test]
fn records_handed_off_while_the_record_writer_writes_the_ring_are_not_held_up() {
    watch_background_panics();
    let (c, b) = make_devices();
    let cache = Dev::new(&c);
    let v = Arc::new(open_on(cache.clone(), b.clone(), opts()));
    let hold = hold_ring_write(&cache, &v);
    let bg = Background::start(&v);
    let mut next = 0;
    read_cold(&v, &mut next, BATCH);
    cache.wait_held(hold);
    // 127 blocks in one request: the last finds staging full and seals it (handed off).
    let writes = c.stats().writes;
    v.write(400 * BS as u64, &stamps(400, 127, 1)).unwrap();
    assert!(v.status().counters.handed_off_records >= 1, "{:?}", v.status().counters);
    wait_until("the handed-off record is written while the ring write is held", || c.stats().writes > writes);
    write(&v, 600, 1);
    let flush = on_thread(&v, |v| v.flush());
    assert!(finishes_within(&flush, 20), "a FLUSH waited for the record writer's ring write");
    flush.join().unwrap().unwrap();
    assert_eq!(ver(&v, cold(0)), 0, "the held batch served from RAM");
    let image = c.durable_image();
    cache.release(hold);
    drop(bg);
    let r = recover_image(image, &b);
    assert_eq!((ver(&r, 400), ver(&r, 526), ver(&r, 600)), (1, 1, 1), "after the FLUSH and a power cut");
    assert_eq!(BACKGROUND_PANICS.load(Ordering::SeqCst), 0, "a background thread panicked");
}

/// Attacks `Background::drop` while its record writer writes the ring: the drop waits for
/// the write (joins), the volume keeps serving reads, writes and FLUSHes meanwhile (the
/// record writer is unset first), the batch is installed when the write returns, and the
/// next batch is written by its reader (no record writer any more). Refuted: expected to pass.
#[test]
fn dropping_background_while_its_record_writer_writes_the_ring_loses_nothing() {
    watch_background_panics();
    let (c, b) = make_devices();
    let cache = Dev::new(&c);
    let v = Arc::new(open_on(cache.clone(), b.clone(), opts()));
    let hold = hold_ring_write(&cache, &v);
    let bg = Background::start(&v);
    let mut next = 0;
    read_cold(&v, &mut next, BATCH);
    cache.wait_held(hold);
    let dropper = std::thread::spawn(move || drop(bg));
    std::thread::sleep(Duration::from_millis(50));
    write(&v, 500, 1);
    let flush = on_thread(&v, |v| v.flush());
    assert!(finishes_within(&flush, 20), "a FLUSH waited for the ring write");
    flush.join().unwrap().unwrap();
    assert_eq!((ver(&v, 500), ver(&v, cold(7))), (1, 0));
    cache.release(hold);
    join_within(dropper, 30, "Background's drop");
    let reads = c.stats().reads;
    read_once(&v, [cold(5)].into_iter());
    assert_eq!(c.stats().reads, reads + 1, "the batch was installed: read from its ring slot");
    let writes = c.stats().writes;
    read_cold(&v, &mut next, BATCH);
    assert_eq!(c.stats().writes, writes + 1, "without a record writer, the reader wrote the next batch");
    assert_eq!(BACKGROUND_PANICS.load(Ordering::SeqCst), 0, "a background thread panicked");
}

/// Attacks shutdown and the crash claim: `shutdown` (FLUSH and checkpoint) while the record
/// writer's ring write is held must complete, and neither a power cut then (the ring write
/// not durable) nor a reopen after the ring write landed may bring back a ring copy: an
/// open starts with the ring empty, and a block the ring held whose backing data changed
/// while closed reads the new data. Refuted: expected to pass.
#[test]
fn shutdown_and_reopen_around_a_ring_write_of_the_record_writer_bring_back_no_ring_copy() {
    watch_background_panics();
    let (c, b) = make_devices();
    let cache = Dev::new(&c);
    let v = Arc::new(open_on(cache.clone(), b.clone(), opts()));
    let hold = hold_ring_write(&cache, &v);
    let bg = Background::start(&v);
    for k in 0..8 {
        write(&v, 700 + k, 1);
    }
    let y = 250;
    read_once(&v, [y].into_iter());
    let mut next = 0;
    read_cold(&v, &mut next, BATCH - 1);
    cache.wait_held(hold);
    let shutdown = on_thread(&v, |v| v.shutdown());
    assert!(finishes_within(&shutdown, 20), "shutdown waited for the record writer's ring write");
    shutdown.join().unwrap().unwrap();
    let cut = c.durable_image();
    cache.release(hold);
    drop(bg);
    wait_until("the ring write landed", || slot_holds(&c, &v, 0, y, 0));
    c.flush().unwrap();
    drop(v);
    change_backing(&b, y, 5);
    for (what, image) in [("a power cut during the ring write", cut), ("a reopen after it", c.durable_image())] {
        let r = recover_image(image, &b);
        assert_eq!(r.status().probation_blocks, 0, "{what}: the ring is not empty at open");
        assert_eq!(ver(&r, y), 5, "{what}: the ring's older copy of {y} came back");
        for k in 0..8 {
            assert_eq!(ver(&r, 700 + k), 1, "{what}");
        }
    }
    assert_eq!(BACKGROUND_PANICS.load(Ordering::SeqCst), 0, "a background thread panicked");
}

/// Attacks everything at once with the real threads: `Background` running (its record
/// writer writes the ring batches), two readers (1- and 3-block reads of the blocks under
/// test and of one-time blocks, which keep batches filling, handed off and overshot) and a
/// writer (2-block writes that go around the cache, 1-block writes through it, FLUSHes).
/// Every read must return a version no older than the newest write completed before it began
/// and no newer than the newest begun (a stale ring copy fails the first); at the end every
/// block reads its last version, also after a power cut; no background thread panicked
/// (a lock-order or ring invariant check on the record writer's thread).
/// Refuted: expected to pass.
#[test]
fn readers_writers_and_the_record_writer_together_never_serve_a_stale_block() {
    watch_background_panics();
    const FIRST: u64 = 100;
    const N: u64 = 64;
    let (c, b) = make_devices();
    let v = Arc::new(open_on(c.clone(), b.clone(), wa_opts()));
    let bg = Background::start(&v);
    let started: Arc<Vec<AtomicU64>> = Arc::new((0..N).map(|_| AtomicU64::new(0)).collect());
    let done: Arc<Vec<AtomicU64>> = Arc::new((0..N).map(|_| AtomicU64::new(0)).collect());
    let stop = Arc::new(AtomicBool::new(false));
    let rng = |seed: u64| {
        let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        move |n: u64| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s % n
        }
    };
    let writer = {
        let (v, started, done, stop) = (Arc::clone(&v), Arc::clone(&started), Arc::clone(&done), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut r = rng(1);
            let mut version = 0;
            let mut ops = 0u64;
            while !stop.load(Ordering::Relaxed) {
                version += 1;
                let i = r(N - 1);
                let n = 1 + r(2); // 1: through the cache; 2: around it
                for k in i..i + n {
                    started[k as usize].store(version, Ordering::SeqCst);
                }
                v.write((FIRST + i) * BS as u64, &stamps(FIRST + i, n, version)).unwrap();
                for k in i..i + n {
                    done[k as usize].store(version, Ordering::SeqCst);
                }
                if r(16) == 0 {
                    v.flush().unwrap();
                }
                ops += 1;
                // (Space for the readers: each write-around waits for the backing device.)
                if ops.is_multiple_of(4) {
                    std::thread::yield_now();
                }
            }
            ops
        })
    };
    let readers: Vec<_> = (0..2u64)
        .map(|t| {
            let (v, started, done, stop) = (Arc::clone(&v), Arc::clone(&started), Arc::clone(&done), Arc::clone(&stop));
            std::thread::spawn(move || {
                let mut r = rng(10 + t);
                let mut next = 100_000 * (t + 1);
                let mut checked = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    match r(4) {
                        0 | 1 => {
                            let n = if r(2) == 0 { 1 } else { 3 };
                            let i = r(N - n + 1);
                            let lo: Vec<u64> = (i..i + n).map(|k| done[k as usize].load(Ordering::SeqCst)).collect();
                            let mut buf = vec![0u8; n as usize * BS];
                            v.read((FIRST + i) * BS as u64, &mut buf).unwrap();
                            for k in 0..n {
                                let block = FIRST + i + k;
                                let got = version_of(block, &buf[k as usize * BS..(k as usize + 1) * BS]);
                                let hi = started[(i + k) as usize].load(Ordering::SeqCst);
                                let lo = lo[k as usize];
                                assert!(
                                    got.is_some_and(|g| lo <= g && g <= hi),
                                    "block {block}: read {got:?}, completed {lo} before the read, begun {hi}"
                                );
                                checked += 1;
                            }
                        }
                        2 => {
                            read_once(&v, [cold(next)].into_iter());
                            next += 1;
                        }
                        _ => {
                            let n = 1 + r(3);
                            read_once(&v, (next..next + n).map(cold));
                            next += n;
                        }
                    }
                }
                checked
            })
        })
        .collect();
    std::thread::sleep(Duration::from_secs(3));
    stop.store(true, Ordering::SeqCst);
    let ops = join_within(writer, 60, "the writer");
    let checked: u64 = readers.into_iter().map(|h| join_within(h, 60, "a reader")).sum();
    assert!(ops > 100 && checked > 1000, "too little work: {ops} writes, {checked} reads checked");
    let s = v.status();
    assert!(s.counters.probation_admitted_blocks > 2 * BATCH, "the ring saw too little: {:?}", s.counters);
    for k in 0..N {
        assert_eq!(ver(&v, FIRST + k), done[k as usize].load(Ordering::SeqCst), "block {}", FIRST + k);
    }
    v.flush().unwrap();
    let r = crash_and_recover(&c, &b);
    for k in 0..N {
        assert_eq!(ver(&r, FIRST + k), done[k as usize].load(Ordering::SeqCst), "after a power cut: {}", FIRST + k);
    }
    drop(bg);
    assert_eq!(BACKGROUND_PANICS.load(Ordering::SeqCst), 0, "a background thread panicked");
}
