//! Adversarial review of the bandwidth commits (5225a38, 5604b12): run reads of consecutive
//! log slots, `read_slots` in write-back and copy-forward (packing around failed blocks),
//! reclaim's wide clean windows and its write-back of the next segments, the rate-based
//! pre-cleaner, and readers waking the background thread instead of writing admissions.
//! Each test is one suspicion; the comment above it says what it attacks.

use rand::{Rng, SeedableRng};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;
use tiercache_device::{BlockDevice, MonotonicClock, SimDevice};
use tiercache_engine::{Background, CreateOptions, EngineError, Volume};

mod common;
use common::*;

// ------------------------------------------------------------------------------ devices

/// A SimDevice wrapper that sleeps now and then before reads (widening the window between a
/// read's plan and its I/O) and before flushes and writes (a slow backing device).
struct Jitter {
    inner: Arc<SimDevice>,
    n: AtomicU64,
    read_us: u64,
    flush_us: u64,
}

impl Jitter {
    fn new(inner: Arc<SimDevice>, read_us: u64, flush_us: u64) -> Arc<Jitter> {
        Arc::new(Jitter { inner, n: AtomicU64::new(0), read_us, flush_us })
    }
    fn nap(&self, max_us: u64) {
        if max_us == 0 {
            return;
        }
        let k = self.n.fetch_add(1, SeqCst).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 40;
        if k.is_multiple_of(3) {
            std::thread::sleep(Duration::from_micros(k % max_us));
        }
    }
}

impl BlockDevice for Jitter {
    forward_to_inner!(inner: size_bytes, logical_block_size, discard);
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> tiercache_device::Result<()> {
        self.nap(self.read_us);
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> tiercache_device::Result<()> {
        self.nap(self.flush_us / 4);
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> tiercache_device::Result<()> {
        self.nap(self.flush_us);
        self.inner.flush()
    }
    fn describe(&self) -> String {
        format!("jitter:{}", self.inner.describe())
    }
}

/// Runs `f` on its own thread and waits at most `secs` for it: a deadlock fails the test
/// instead of hanging it.
fn within<T: Send + 'static>(secs: u64, what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs)).unwrap_or_else(|_| panic!("{what}: no progress in {secs} s (deadlock?)"))
}

/// Admits clean blocks with reads of `n` blocks from `*next` on until `done` says stop.
fn admit_while(volume: &Volume, next: &mut u64, n: u64, limit: u64, mut more: impl FnMut(&Volume) -> bool) {
    let mut buf = vec![0u8; n as usize * BS];
    while more(volume) {
        assert!(*next + n <= limit, "ran out of blocks to admit");
        volume.read(*next * BS as u64, &mut buf).unwrap();
        for (i, b) in buf.chunks(BS).enumerate() {
            assert_eq!(version_of(*next + i as u64, b), Some(0), "admitted block {}", *next + i as u64);
        }
        *next += n;
    }
}

// ------------------------------------------------------------------------------------------
// Suspicion 1: a run read is planned under the lock, then issued as ONE cache read without
// any lock. If the reader stalls before its read reaches the medium, reclaim may write back
// and evict the run's blocks and writers reuse the slots. Each block is then checked by CRC and
// by position under the lock; a miss must fall back to the slow path, never return the
// foreign data that now sits in the slot.

#[test]
fn a_run_read_stalled_while_its_slots_are_reclaimed_and_reused_returns_current_data() {
    let (cache, backing) = devices(16, 512);
    let gate = Gate::new(cache.clone());
    let volume = Arc::new(open(gate.clone(), backing.clone()));
    volume.write(0, &stamps(0, 12, 1)).unwrap();
    volume.flush().unwrap();
    let s0 = slot_of(&volume, 0).unwrap().0;
    for b in 0..12 {
        assert_eq!(slot_of(&volume, b).unwrap().0, s0 + b as u32, "blocks 0..12 in consecutive slots");
    }
    gate.arm(Hold::ReadBefore(2));
    let reader = {
        let v = volume.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 12 * BS];
            v.read(0, &mut buf).map(|()| buf)
        })
    };
    gate.wait_until_held();
    // Half the run is rewritten; then the log laps twice: every slot the reader planned to
    // read now holds other data.
    volume.write(6 * BS as u64, &stamps(6, 6, 2)).unwrap();
    volume.flush().unwrap();
    let tail0 = volume.status().log_tail;
    let mut i = 0u64;
    while volume.status().log_tail < tail0 + 2 * 128 {
        write(&volume, 200 + i % 8, 100 + i);
        volume.flush().unwrap();
        i += 1;
    }
    gate.open_gate();
    let buf = reader.join().unwrap().expect("the stalled read");
    for (b, block) in buf.chunks(BS).enumerate() {
        let b = b as u64;
        let v = version_of(b, block);
        if b < 6 {
            assert_eq!(v, Some(1), "block {b}: the run read returned foreign or stale data");
        } else {
            assert!(matches!(v, Some(1) | Some(2)), "block {b}: the run read returned {v:?}");
        }
    }
    for b in 0..12 {
        assert_eq!(read_version(&volume, b).unwrap(), Some(if b < 6 { 1 } else { 2 }), "block {b} afterwards");
    }
}

// Same stall, but with CLEAN admitted blocks that are discarded and re-admitted into other
// slots while the read is held (a discard drops clean copies without any record).
#[test]
fn a_run_read_stalled_across_discard_and_readmission_returns_backing_data() {
    let (cache, backing) = devices(16, 512);
    let gate = Gate::new(cache.clone());
    let volume = Arc::new(open(gate.clone(), backing.clone()));
    let mut buf = vec![0u8; 12 * BS];
    volume.read(40 * BS as u64, &mut buf).unwrap(); // admitted: a full staging buffer, written out
    volume.flush().unwrap();
    assert!(slot_of(&volume, 40).is_some(), "the read was admitted");
    gate.arm(Hold::ReadBefore(2));
    let reader = {
        let v = volume.clone();
        std::thread::spawn(move || {
            let mut buf = vec![0u8; 12 * BS];
            v.read(40 * BS as u64, &mut buf).map(|()| buf)
        })
    };
    gate.wait_until_held();
    volume.discard(40 * BS as u64, 12 * BS as u64).unwrap();
    // Fill the old slots with other blocks (clean admissions and dirty writes), lap once.
    let tail0 = volume.status().log_tail;
    let mut next = 100;
    let mut w = 0;
    while volume.status().log_tail < tail0 + 160 {
        let mut b = vec![0u8; 12 * BS];
        volume.read(next * BS as u64, &mut b).unwrap();
        next = if next + 12 > 400 { 100 } else { next + 12 };
        write(&volume, 450 + w % 4, 10 + w);
        volume.flush().unwrap();
        w += 1;
    }
    gate.open_gate();
    let buf = reader.join().unwrap().expect("the stalled read");
    for (i, block) in buf.chunks(BS).enumerate() {
        let b = 40 + i as u64;
        assert_eq!(version_of(b, block), Some(0), "block {b}");
    }
}

// ------------------------------------------------------------------------------------------
// Suspicion 2: copy-forward now reads all dirty blocks of the window first, then packs the
// verified ones to the front of the copy record with copy_within; a failed one runs
// `backing_holds`, which reads the backing copy INTO the record buffer at the packing slot.
// If packing, the backing read or the `copies` indices used for the new index entries were
// off by one, a copied block would point at a neighbour's data (CRC mismatch -> lost, or the
// wrong block served), live or after recovery.

#[derive(Clone, Copy, Debug, PartialEq)]
enum Fate {
    Good,
    /// Corrupted, its version not on the backing device: lost.
    Lost,
    /// Corrupted, but the backing device holds exactly that version: repaired.
    Repaired,
}

fn copy_forward_packing(fates: [Fate; 4]) {
    let (cache, backing) = devices(16, 512);
    let volume = open(cache.clone(), backing.clone());
    // One record of 4 dirty blocks at the log's start: slots 1..=4 (copy_forward_max is 4 on
    // this log, so reclaim copies them forward instead of writing them back).
    let first = 10u64;
    let mut data = Vec::new();
    for (i, fate) in fates.iter().enumerate() {
        let b = first + i as u64;
        // A "repaired" block is written with the backing device's own content (version 0).
        data.extend(stamp(b, if *fate == Fate::Repaired { 0 } else { 1 }));
    }
    volume.write(first * BS as u64, &data).unwrap();
    volume.flush().unwrap();
    for i in 0..4u64 {
        assert_eq!(slot_of(&volume, first + i), Some((1 + i as u32, true)), "layout of the test");
    }
    for (i, fate) in fates.iter().enumerate() {
        if *fate != Fate::Good {
            corrupt_cached_block(&cache, &volume, first + i as u64);
        }
    }
    let copied0 = volume.status().counters.copied_forward_blocks;
    let mut next = 100;
    admit_while(&volume, &mut next, 12, 512, |v| v.status().log_head < 8);
    let st = volume.status();
    let good = fates.iter().filter(|f| **f == Fate::Good).count() as u64;
    assert_eq!(st.counters.copied_forward_blocks - copied0, good, "{fates:?}: copies");
    assert_eq!(st.counters.repaired_blocks, fates.iter().filter(|f| **f == Fate::Repaired).count() as u64);
    let check = |v: &Volume, what: &str| {
        for (i, fate) in fates.iter().enumerate() {
            let b = first + i as u64;
            let r = read_version(v, b);
            match fate {
                Fate::Good => assert_eq!(r.unwrap(), Some(1), "{fates:?} {what}: block {b}"),
                Fate::Repaired => assert_eq!(r.unwrap(), Some(0), "{fates:?} {what}: block {b}"),
                Fate::Lost => assert!(is_lost(&r, b), "{fates:?} {what}: block {b}: {r:?}"),
            }
        }
    };
    // The copies sit in consecutive slots of the copy record, in the order kept.
    let slots: Vec<u32> = (0..4)
        .filter(|&i| fates[i] == Fate::Good)
        .map(|i| slot_of(&volume, first + i as u64).expect("copied").0)
        .collect();
    assert!(slots.windows(2).all(|w| w[1] == w[0] + 1), "{fates:?}: copies at {slots:?}");
    // A crash right now (the copy record is durable: reclaim flushed it).
    let (c, b) = (durable_copy(&cache), durable_copy(&backing));
    check(&volume, "live");
    let recovered = open(c, b);
    check(&recovered, "recovered");
    // And after the head passes the copies' old record too, then a restart.
    let mut next2 = next;
    admit_while(&recovered, &mut next2, 12, 512, |v| v.status().log_head < 8 + 128);
    check(&recovered, "a lap later");
    drop(recovered);
    drop(volume);
}

#[test]
fn copy_forward_packs_verified_blocks_around_lost_and_repaired_ones() {
    use Fate::*;
    for fates in [
        [Good, Lost, Repaired, Good],
        [Lost, Good, Good, Good],
        [Good, Good, Good, Lost],
        [Repaired, Good, Lost, Good],
        [Lost, Lost, Good, Repaired],
        [Lost, Repaired, Lost, Repaired],
        [Good, Good, Good, Good],
    ] {
        copy_forward_packing(fates);
    }
}

// ------------------------------------------------------------------------------------------
// Suspicion 3: when the window is mostly dirty, reclaim's own write-back now also takes the
// dirty blocks of the next PRECLEAN_SEGMENTS segments, beyond the new head, and does not evict
// them. A bad copy among those is declared lost (or repaired) at a position BEYOND the new
// head: its Lost entry must still become durable before the head reaches it, and the blocks
// written back must stay cached and readable; nothing may be dropped early.

#[test]
fn reclaims_write_back_of_the_next_segments_keeps_them_and_logs_their_losses() {
    let (cache, backing) = devices(16, 512);
    let volume = open(cache.clone(), backing.clone());
    // Five records of 7 dirty blocks: segments 0..5 entirely dirty.
    for s in 0..5u64 {
        let first = 20 + 10 * s;
        let mut data = stamps(first, 7, 1);
        if s == 3 {
            // Block 53 written with the backing device's content: "repaired" when it rots.
            data[3 * BS..4 * BS].copy_from_slice(&stamp(53, 0));
        }
        volume.write(first * BS as u64, &data).unwrap();
        volume.flush().unwrap();
    }
    let expect = |b: u64| if b == 53 { 0 } else { 1 };
    let blocks: Vec<u64> = (0..5u64).flat_map(|s| (20 + 10 * s)..(27 + 10 * s)).collect();
    assert_eq!(slot_of(&volume, 20).unwrap().0, 1, "layout of the test");
    corrupt_cached_block(&cache, &volume, 42); // segment 2: ahead of the first window
    corrupt_cached_block(&cache, &volume, 53); // segment 3
    let flushes0 = backing.stats().flushes;
    let mut next = 100;
    admit_while(&volume, &mut next, 12, 512, |v| v.status().log_head == 0);
    let head = volume.status().log_head;
    // The first reclaim wrote back [0, 8) and the 4 segments after it in one batch; the next
    // one (same record write) found [8, 16) clean and widened over [16, 24) (the lost block's
    // entry is gone): head 24.
    assert!(head <= 24, "head {head}");
    // One backing flush for the write-back batch, one by `backing_holds` confirming the
    // repaired block's version.
    assert_eq!(backing.stats().flushes - flushes0, 2, "one write-back batch for the window and the next segments");
    assert_eq!(volume.lost_blocks(), vec![42], "the rotten block ahead of the head is lost");
    // Written back but NOT evicted: still cached, clean.
    for &b in blocks.iter().filter(|&&b| b >= 50 && b != 53) {
        assert_eq!(slot_of(&volume, b).map(|s| s.1), Some(false), "block {b} ahead of the head: cached and clean");
    }
    let check = |v: &Volume, what: &str| {
        for &b in &blocks {
            let r = read_version(v, b);
            if b == 42 {
                assert!(is_lost(&r, b), "{what}: block 42: {r:?}");
            } else {
                assert_eq!(r.unwrap(), Some(expect(b)), "{what}: block {b}");
            }
        }
    };
    let (c, bk) = (durable_copy(&cache), durable_copy(&backing));
    check(&volume, "live");
    check(&open(c, bk), "recovered right after the reclaim");
    // The head now passes the lost block's position (and its record's).
    admit_while(&volume, &mut next, 12, 512, |v| v.status().log_head < 48);
    let (c, bk) = (durable_copy(&cache), durable_copy(&backing));
    check(&volume, "live, head past the loss");
    let recovered = open(c, bk);
    check(&recovered, "recovered, head past the loss");
    write(&recovered, 42, 7);
    recovered.flush().unwrap();
    assert_eq!(read_version(&recovered, 42).unwrap(), Some(7));
}

// ------------------------------------------------------------------------------------------
// Suspicion 4: the wide clean window. A segment whose only dirty block was just declared lost
// holds "no dirty block" by the index (a loss removes the entry), so reclaim widens its window
// over it. Its loss, not yet in any record, must be in THIS reclaim record: a crash right
// after it (before the next record) must not resurrect the stale backing version.

#[test]
fn a_wide_clean_window_over_a_fresh_loss_logs_the_loss_before_the_head_passes_it() {
    // 64 segments of 8: the window may widen to 64 blocks.
    let (cache, backing) = devices(64, 2048);
    let gate = Gate::new(cache.clone());
    let volume = open(gate.clone(), backing.clone());
    const L: u64 = 5;
    // Segment 0..: clean admissions; block L dirty in the third segment, among clean blocks.
    let mut buf = vec![0u8; 16 * BS];
    volume.read(100 * BS as u64, &mut buf).unwrap();
    volume.flush().unwrap();
    write(&volume, L, 1);
    volume.read(200 * BS as u64, &mut buf).unwrap();
    volume.flush().unwrap();
    let (slot_l, dirty) = slot_of(&volume, L).unwrap();
    assert!(dirty && (16..40).contains(&slot_l), "layout of the test: L at slot {slot_l}");
    // Clean data until the log is nearly full (no reclaim yet).
    let mut next = 300;
    admit_while(&volume, &mut next, 12, 2048, |v| v.status().log_tail < 512 - 60);
    assert_eq!(volume.status().log_head, 0);
    corrupt_cached_block(&cache, &volume, L);
    assert!(is_lost(&read_version(&volume, L), L), "declared lost by the read");
    // The next records need reclaim: its record is written and flushed, then the record of
    // staged data. Cut the power at that next write.
    gate.snapshot_at_first_write_after_flushes(1);
    admit_while(&volume, &mut next, 12, 2048, |v| v.status().log_head == 0);
    let head = volume.status().log_head;
    assert!(head > u64::from(slot_l), "the first reclaim passed the loss (head {head})");
    assert!(is_lost(&read_version(&volume, L), L), "live");
    let snap = gate.take_snapshot().expect("a write after the reclaim's flush");
    let recovered = recover_image(snap, &backing);
    let r = read_version(&recovered, L);
    assert!(is_lost(&r, L), "after a crash right after the wide reclaim, the lost block reads {r:?}");
}

// The wide window never passes the durable checkpoint, and a crash at any reclaim of a long
// clean run recovers everything: the window end, the checkpoint and the copies agree.
#[test]
fn wide_windows_never_pass_the_checkpoint_and_recover_at_every_reclaim() {
    let (cache, backing) = devices(32, 4096);
    let volume = open(cache.clone(), backing.clone());
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(4);
    let mut latest = std::collections::HashMap::new();
    let mut next = 1000u64;
    let mut buf = vec![0u8; 12 * BS];
    let mut last_head = 0;
    let mut crashes = 0;
    for step in 0..3000u64 {
        if rng.gen_bool(0.08) {
            let b = rng.gen_range(0..64u64);
            write(&volume, b, step + 1);
            latest.insert(b, step + 1);
            if rng.gen_bool(0.5) {
                volume.flush().unwrap();
            }
        } else {
            if next + 12 > 4096 {
                next = 1000;
            }
            volume.read(next * BS as u64, &mut buf).unwrap();
            next += 12;
        }
        let (head, checkpoint, tail) = volume.log_window();
        assert!(
            head <= checkpoint && checkpoint <= tail,
            "step {step}: head {head} checkpoint {checkpoint} tail {tail}"
        );
        if head != last_head {
            last_head = head;
            if crashes < 60 {
                crashes += 1;
                volume.flush().unwrap();
                let recovered = open(durable_copy(&cache), durable_copy(&backing));
                for (&b, &v) in &latest {
                    assert_eq!(read_version(&recovered, b).unwrap(), Some(v), "step {step}: block {b} after a crash");
                }
            }
        }
    }
    assert!(crashes > 20, "only {crashes} reclaims");
}

// ------------------------------------------------------------------------------------------
// Suspicion 5: the pre-cleaner now runs below the high watermark and holds the destage lock
// through a slow backing flush, while a writer's reclaim (io lock held) waits for the destage
// lock to write back the head itself. Nothing may deadlock; readers (no io lock) must not wait
// for either; and once the flush completes everything is where it should be.

#[test]
fn the_pre_cleaner_on_a_slow_backing_device_races_a_writer_in_reclaim() {
    let (cache, backing) = devices(16, 512);
    let slow = Gate::new(backing.clone());
    let volume = Arc::new(open(cache.clone(), slow.clone()));
    // The head: 3 segments of dirty blocks (19 %, below the 70 % watermark).
    for s in 0..3u64 {
        volume.write((20 + 10 * s) * BS as u64, &stamps(20 + 10 * s, 7, 1)).unwrap();
        volume.flush().unwrap();
    }
    // Clean data until free space is short of the pre-cleaner's horizon (4 segments).
    let mut next = 100;
    admit_while(&volume, &mut next, 12, 512, |v| v.status().log_tail < 128 - 20);
    assert_eq!(volume.status().dirty_blocks, 21);
    slow.arm(Hold::Flush(0));
    let pre = {
        let v = volume.clone();
        std::thread::spawn(move || v.background_tick())
    };
    slow.wait_until_held(); // the pre-cleaner's batch waits in its backing flush
    let done = Arc::new(AtomicBool::new(false));
    let writer = {
        let (v, done) = (volume.clone(), done.clone());
        std::thread::spawn(move || {
            for i in 0..40u64 {
                v.write((300 + i) * BS as u64, &stamp(300 + i, 1)).unwrap();
                v.flush().unwrap();
            }
            done.store(true, SeqCst);
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    // Readers hit cached dirty and clean blocks and miss: none needs the io or destage lock.
    let v = volume.clone();
    within(20, "reads while the pre-cleaner's backing flush is held", move || {
        for b in (20..27).chain(100..110).chain(480..490) {
            let expect = if b < 100 { 1 } else { 0 };
            assert_eq!(read_version(&v, b).unwrap(), Some(expect), "block {b}");
        }
        let mut big = vec![0u8; 40 * BS];
        v.read(20 * BS as u64, &mut big).unwrap();
    });
    slow.open_gate();
    within(60, "writer after the gate opened", move || writer.join().unwrap());
    pre.join().unwrap().unwrap();
    assert!(done.load(SeqCst));
    for s in 0..3u64 {
        for b in (20 + 10 * s)..(27 + 10 * s) {
            assert_eq!(read_version(&volume, b).unwrap(), Some(1), "block {b}");
        }
    }
    for i in 0..40u64 {
        assert_eq!(read_version(&volume, 300 + i).unwrap(), Some(1), "block {}", 300 + i);
    }
    let recovered = open(durable_copy(&cache), durable_copy(&backing));
    for b in (0..3u64).flat_map(|s| (20 + 10 * s)..(27 + 10 * s)).chain(300..340) {
        assert_eq!(read_version(&recovered, b).unwrap(), Some(1), "recovered block {b}");
    }
}

// ------------------------------------------------------------------------------------------
// Suspicion 6: readers whose admissions fill staging now only unpark the background thread.
// (a) With a background thread, a reader never writes to the cache device (its request never
// waits for a record), and the admission is written out soon by the woken thread.
// (b) Background started and dropped over and over while readers fill staging: no deadlock,
// no panic; after the last drop the readers write admissions themselves again (admission
// never stops for good with no thread to wake).

#[test]
fn with_a_background_thread_readers_never_write_and_admissions_still_land() {
    let (cache, backing) = devices(16, 2048);
    let gate = Gate::new(cache.clone());
    let volume = Arc::new(open(gate.clone(), backing.clone()));
    let background = Background::start(&volume);
    gate.record_writers(true);
    let records0 = volume.status().counters.records_written;
    let v = volume.clone();
    let reader = std::thread::Builder::new()
        .name("reader".into())
        .spawn(move || {
            let mut buf = vec![0u8; 12 * BS];
            for k in 0..60u64 {
                v.read((100 + 12 * k) * BS as u64, &mut buf).unwrap();
                for (i, b) in buf.chunks(BS).enumerate() {
                    assert_eq!(version_of(100 + 12 * k + i as u64, b), Some(0));
                }
            }
        })
        .unwrap();
    reader.join().unwrap();
    // The woken thread writes the full staging buffers out (generous: no timing asserted).
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while volume.status().counters.records_written == records0 && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    let writers = gate.writers();
    assert!(volume.status().counters.records_written > records0, "admissions never written out");
    assert!(!writers.iter().any(|w| w == "reader"), "a reader wrote to the cache device: {writers:?}");
    drop(background);
    // Without the thread, the reader writes again.
    gate.record_writers(true);
    let records1 = volume.status().counters.records_written;
    let v = volume.clone();
    std::thread::Builder::new()
        .name("reader".into())
        .spawn(move || {
            let mut buf = vec![0u8; 12 * BS];
            for k in 0..30u64 {
                v.read((1000 + 12 * k) * BS as u64, &mut buf).unwrap();
            }
        })
        .unwrap()
        .join()
        .unwrap();
    assert!(volume.status().counters.records_written > records1, "no background: admissions stopped for good");
    assert!(gate.writers().iter().any(|w| w == "reader"));
}

#[test]
fn background_started_and_dropped_while_readers_fill_staging() {
    let (cache, backing) = devices(16, 4096);
    let volume = Arc::new(open(cache.clone(), backing.clone()));
    let stop = Arc::new(AtomicBool::new(false));
    let reads = Arc::new(AtomicU64::new(0));
    let mut handles = Vec::new();
    for t in 0..2u64 {
        let (v, stop, reads) = (volume.clone(), stop.clone(), reads.clone());
        handles.push(std::thread::spawn(move || {
            let mut buf = vec![0u8; 12 * BS];
            let mut k = 0u64;
            while !stop.load(SeqCst) {
                let first = 100 + t * 1900 + (k * 12) % 1800;
                v.read(first * BS as u64, &mut buf).unwrap();
                for (i, b) in buf.chunks(BS).enumerate() {
                    let block = first + i as u64;
                    let ver = version_of(block, b);
                    assert!(ver.is_some(), "block {block}: garbage");
                }
                if k.is_multiple_of(7) {
                    v.write((4000 + t) * BS as u64, &stamp(4000 + t, k + 1)).unwrap();
                }
                reads.fetch_add(1, SeqCst);
                k += 1;
            }
        }));
    }
    let v = volume.clone();
    within(120, "Background start/drop churn", move || {
        for i in 0..60 {
            let bg = Background::start(&v);
            std::thread::sleep(Duration::from_millis(1 + i % 5));
            drop(bg);
        }
    });
    let r0 = reads.load(SeqCst);
    let admitted0 = volume.status().counters.admitted_blocks;
    std::thread::sleep(Duration::from_millis(300));
    assert!(reads.load(SeqCst) > r0, "readers stalled after the churn");
    stop.store(true, SeqCst);
    for h in handles {
        h.join().expect("reader panicked");
    }
    assert!(volume.status().counters.admitted_blocks > admitted0, "admission stopped with no thread to wake");
    volume.flush().unwrap();
    let recovered = open(durable_copy(&cache), durable_copy(&backing));
    for t in 0..2 {
        assert!(read_version(&recovered, 4000 + t).unwrap().is_some());
    }
}

// ------------------------------------------------------------------------------------------
// Suspicion 7: a tiny log (8 segments of 4 blocks: staging limit 4, copy_forward_max 2,
// reserve 3; the pre-cleaner's floor is half the log, the ahead segments the whole log).
// Concurrent writers with multi-block writes and run reads, a maintenance thread running
// background rounds, pre-clean and destage batches and checkpoints, rotting media; after
// every FLUSH the durable image recovers the flushed versions; at the end a crash.

fn tiny_stress(seed: u64, seg: u32, segments: u64, with_thread: bool) -> u64 {
    tiny_stress_jitter(seed, seg, segments, with_thread, 0, 0)
}

/// Returns how many cached copies it rotted.
fn tiny_stress_jitter(seed: u64, seg: u32, segments: u64, with_thread: bool, read_us: u64, flush_us: u64) -> u64 {
    const WRITERS: u64 = 2;
    const PER: u64 = 24;
    const FIRST: u64 = 20; // past the fingerprint blocks 0, 1, 16
    let (cache, backing) = devices_seg(
        segments,
        seg,
        256,
        CreateOptions { dirty_low_permille: 100, dirty_high_permille: 400, ..log_only() },
    );
    let volume = Arc::new(open(Jitter::new(cache.clone(), read_us, 0), Jitter::new(backing.clone(), 0, flush_us)));
    let background = with_thread.then(|| Background::start(&volume));
    let nblocks = WRITERS * PER;
    // Per block: versions written (in order), the last flushed, whether its dirty copy was hit.
    let written: Arc<Vec<Mutex<Vec<u64>>>> = Arc::new((0..nblocks).map(|_| Mutex::new(vec![0])).collect());
    let flushed: Arc<Vec<AtomicU64>> = Arc::new((0..nblocks).map(|_| AtomicU64::new(0)).collect());
    let hit: Arc<Vec<AtomicBool>> = Arc::new((0..nblocks).map(|_| AtomicBool::new(false)).collect());
    let gate = Arc::new(std::sync::RwLock::new(()));
    let stop = Arc::new(AtomicBool::new(false));
    let mut handles = Vec::new();
    for t in 0..WRITERS {
        let (v, written, flushed, hit, gate) =
            (volume.clone(), written.clone(), flushed.clone(), hit.clone(), gate.clone());
        let (cache, backing) = (cache.clone(), backing.clone());
        handles.push(std::thread::spawn(move || {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed * 100 + t);
            let mut version = 1u64;
            let mut pending: Vec<(u64, u64)> = Vec::new();
            for _ in 0..1500 {
                let _g = gate.read().unwrap();
                match rng.gen_range(0..10) {
                    0..=4 => {
                        let n = rng.gen_range(1..=6u64);
                        let i = rng.gen_range(0..PER - n + 1);
                        version += 1;
                        let first = FIRST + t * PER + i;
                        for k in 0..n {
                            let idx = (t * PER + i + k) as usize;
                            written[idx].lock().unwrap().push(version);
                            hit[idx].store(false, SeqCst);
                            pending.push((t * PER + i + k, version));
                        }
                        v.write(first * BS as u64, &stamps(first, n, version)).unwrap();
                    }
                    5 => {
                        v.flush().unwrap();
                        let acked = std::mem::take(&mut pending);
                        if rng.gen_bool(0.15) {
                            let c: Arc<dyn BlockDevice> =
                                Arc::new(SimDevice::from_image(cache.durable_image(), BS as u32));
                            let b: Arc<dyn BlockDevice> =
                                Arc::new(SimDevice::from_image(backing.durable_image(), BS as u32));
                            let copy = Volume::inspect(c, Some(b), Arc::new(MonotonicClock::new()))
                                .unwrap_or_else(|e| panic!("seed {seed}: durable state does not recover: {e}"));
                            let mut buf = vec![0u8; BS];
                            for &(idx, ver) in &acked {
                                let block = FIRST + idx;
                                match copy.read(block * BS as u64, &mut buf) {
                                    Ok(()) => {
                                        let got = version_of(block, &buf);
                                        assert!(
                                            got.is_some_and(|g| g >= ver),
                                            "seed {seed}: FLUSH ok but block {block} durable at {got:?} < {ver}"
                                        );
                                    }
                                    Err(EngineError::LostBlock { .. }) => {
                                        assert!(hit[idx as usize].load(SeqCst), "seed {seed}: block {block} lost")
                                    }
                                    Err(e) => panic!("seed {seed}: block {block}: {e}"),
                                }
                            }
                        }
                        for (idx, ver) in acked {
                            flushed[idx as usize].fetch_max(ver, SeqCst);
                        }
                    }
                    _ => {
                        // A run read of own blocks: exact latest versions (or a loss we caused).
                        let n = rng.gen_range(1..=PER);
                        let i = rng.gen_range(0..PER - n + 1);
                        let first = FIRST + t * PER + i;
                        let mut buf = vec![0u8; n as usize * BS];
                        match v.read(first * BS as u64, &mut buf) {
                            Ok(()) => {
                                for k in 0..n {
                                    let idx = (t * PER + i + k) as usize;
                                    let want = *written[idx].lock().unwrap().last().unwrap();
                                    let got = version_of(first + k, &buf[k as usize * BS..(k as usize + 1) * BS]);
                                    assert_eq!(got, Some(want), "seed {seed}: live run read of block {}", first + k);
                                }
                            }
                            Err(EngineError::LostBlock { block }) => {
                                assert!(hit[(block - FIRST) as usize].load(SeqCst), "seed {seed}: {block} lost")
                            }
                            Err(e) => panic!("seed {seed}: read: {e}"),
                        }
                    }
                }
            }
            let _g = gate.read().unwrap();
            v.flush().unwrap();
            for (idx, ver) in pending {
                flushed[idx as usize].fetch_max(ver, SeqCst);
            }
        }));
    }
    {
        let (v, stop, gate) = (volume.clone(), stop.clone(), gate.clone());
        handles.push(std::thread::spawn(move || {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed * 100 + 99);
            let ok = |e: &EngineError| matches!(e, EngineError::LostBlock { .. } | EngineError::LostBlocks { .. });
            while !stop.load(SeqCst) {
                let _g = gate.read().unwrap();
                let r = match rng.gen_range(0..8) {
                    0 | 1 => v.background_tick(),
                    2 => v.destage_oldest(rng.gen_range(1..64)).map(|_| ()),
                    3 => v.destage_step(rng.gen_range(1..64)).map(|_| ()),
                    4 if rng.gen_bool(0.2) => v.checkpoint(),
                    _ => {
                        // A big read across both writers' blocks and the admission area.
                        let n = rng.gen_range(8..80u64);
                        let first = rng.gen_range(FIRST..256 - n);
                        let mut buf = vec![0u8; n as usize * BS];
                        v.read(first * BS as u64, &mut buf).map(|()| {
                            for k in 0..n {
                                let b = first + k;
                                assert!(
                                    version_of(b, &buf[k as usize * BS..(k as usize + 1) * BS]).is_some(),
                                    "seed {seed}: big read of block {b}: garbage"
                                );
                            }
                        })
                    }
                };
                if let Err(e) = r {
                    assert!(ok(&e), "seed {seed}: maintenance: {e}");
                }
                let (head, checkpoint, tail) = v.log_window();
                assert!(head <= checkpoint && checkpoint <= tail, "seed {seed}: window {head} {checkpoint} {tail}");
            }
        }));
    }
    // Rot: a few cached copies of the writers' blocks (at most 4 dirty ones).
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut dirty_hits = 0;
    let mut rotted = 0u64;
    while !handles[..WRITERS as usize].iter().all(|h| h.is_finished()) {
        std::thread::sleep(Duration::from_millis(2));
        if dirty_hits >= 4 || !rng.gen_bool(0.3) {
            continue;
        }
        let _g = gate.write().unwrap();
        // Only copies before both checkpoints: rot inside the replay window that no later
        // record vouches for is taken for a torn tail at recovery, dropping that record's other
        // (acknowledged) blocks too: docs/format.md 7.1, a known limit (this stress hit it
        // when it rotted any cached copy).
        let cached: Vec<_> = volume
            .checkpointed_entries()
            .into_iter()
            .filter(|(b, _, _)| (FIRST..FIRST + nblocks).contains(b))
            .map(|(b, e, _)| (b, e))
            .collect();
        if cached.is_empty() || volume.lost_blocks().len() >= 4 {
            continue;
        }
        let (b, e) = cached[rng.gen_range(0..cached.len())];
        let offset = volume.superblock().layout.log_offset(u64::from(e.slot));
        cache.write_at(offset, &vec![0xEEu8; BS]).unwrap();
        cache.flush().unwrap();
        rotted += 1;
        if e.dirty {
            dirty_hits += 1;
            hit[(b - FIRST) as usize].store(true, SeqCst);
        }
        // (The background thread may have written a record meanwhile, and in a log this small
        // its reclaim may have moved the block and given its slot to another: a dirty block
        // there now is rotted too. The writers are held, so no one else moves.)
        for other in FIRST..FIRST + nblocks {
            if slot_of(&volume, other) == Some((e.slot, true)) {
                dirty_hits += 1;
                hit[(other - FIRST) as usize].store(true, SeqCst);
            }
        }
    }
    let writers: Vec<_> = handles.drain(..WRITERS as usize).collect();
    for h in writers {
        h.join().unwrap_or_else(|_| panic!("seed {seed}: a writer panicked"));
    }
    stop.store(true, SeqCst);
    for h in handles {
        h.join().unwrap_or_else(|_| panic!("seed {seed}: maintenance panicked"));
    }
    drop(background);
    let check = |v: &Volume, what: &str| {
        for idx in 0..nblocks {
            let block = FIRST + idx;
            match read_version(v, block) {
                Ok(got) => {
                    let got = got.unwrap_or_else(|| panic!("seed {seed} {what}: block {block}: garbage"));
                    let w = written[idx as usize].lock().unwrap();
                    assert!(w.contains(&got), "seed {seed} {what}: block {block}: version {got} never written");
                    assert!(
                        got >= flushed[idx as usize].load(SeqCst),
                        "seed {seed} {what}: block {block}: {got} older than the flushed {}",
                        flushed[idx as usize].load(SeqCst)
                    );
                }
                Err(EngineError::LostBlock { .. }) => {
                    assert!(hit[idx as usize].load(SeqCst), "seed {seed} {what}: block {block} lost, not hit")
                }
                Err(e) => panic!("seed {seed} {what}: block {block}: {e}"),
            }
        }
    };
    check(&volume, "quiesced");
    drop(volume);
    cache.crash(seed);
    backing.crash(seed + 1);
    let recovered = open(cache.clone(), backing.clone());
    check(&recovered, "after a crash");
    rotted
}

#[test]
fn tiny_log_concurrent_runs_reclaim_and_rot() {
    let rotted: u64 = (0..12).map(|seed| tiny_stress(seed, 4, 8, false)).sum();
    assert!(rotted > 0, "nothing rotted");
}

#[test]
fn tiny_log_with_a_background_thread() {
    let rotted: u64 = (100..110).map(|seed| tiny_stress(seed, 4, 8, true)).sum();
    assert!(rotted > 0, "nothing rotted");
}

#[test]
fn small_log_with_wide_windows_and_a_background_thread() {
    // 32 segments of 4: the window may widen to 32 blocks, the pre-cleaner's floor is 16.
    let rotted: u64 = (200..208).map(|seed| tiny_stress(seed, 4, 32, true)).sum();
    assert!(rotted > 0, "nothing rotted");
}

// ------------------------------------------------------------------------------------------
// Suspicion 8: a run read verifies each block on its own. One rotten block in the middle of
// a run must fail the request with LostBlock (dirty, version not on the backing device), be
// served from the backing device (clean, or dirty with that version on the backing device),
// and never make a neighbour fail or be served from the wrong offset of the run buffer.

#[test]
fn a_run_read_with_rotten_blocks_in_the_middle() {
    let (cache, backing) = devices(16, 512);
    let volume = open(cache.clone(), backing.clone());
    // Dirty run 0..12: block 5 rots (lost), block 8 was written with the backing device's
    // content (repaired when it rots).
    let mut data = stamps(0, 12, 1);
    data[8 * BS..9 * BS].copy_from_slice(&stamp(8, 0));
    volume.write(0, &data).unwrap();
    volume.flush().unwrap();
    // Clean run 100..112 (admitted).
    let mut buf = vec![0u8; 12 * BS];
    volume.read(100 * BS as u64, &mut buf).unwrap();
    assert!(slot_of(&volume, 100).is_some_and(|s| !s.1));
    corrupt_cached_block(&cache, &volume, 8);
    corrupt_cached_block(&cache, &volume, 106);
    // Repaired and clean-repaired blocks inside runs: the whole request succeeds.
    let before = cache.stats().reads;
    volume.read(100 * BS as u64, &mut buf).unwrap();
    for (i, b) in buf.chunks(BS).enumerate() {
        assert_eq!(version_of(100 + i as u64, b), Some(0), "clean run, block {}", 100 + i);
    }
    assert!(cache.stats().reads - before <= 3, "one run read plus the slow path for block 106");
    let mut nine = vec![0u8; 9 * BS];
    volume.read(0, &mut nine).unwrap();
    for (i, b) in nine.chunks(BS).enumerate() {
        assert_eq!(version_of(i as u64, b), Some(if i == 8 { 0 } else { 1 }), "dirty run, block {i}");
    }
    // A lost block in the middle fails the request, names the block, and its neighbours
    // still read.
    corrupt_cached_block(&cache, &volume, 5);
    let r = volume.read(0, &mut buf);
    assert!(matches!(r, Err(EngineError::LostBlock { block: 5 })), "{r:?}");
    let mut four = vec![0u8; 4 * BS];
    volume.read(BS as u64, &mut four).unwrap();
    volume.read(6 * BS as u64, &mut four).unwrap();
    for (i, b) in four.chunks(BS).enumerate() {
        let blk = 6 + i as u64;
        assert_eq!(version_of(blk, b), Some(if blk == 8 { 0 } else { 1 }));
    }
    let recovered = open(durable_copy(&cache), durable_copy(&backing));
    assert!(is_lost(&read_version(&recovered, 5), 5));
    for b in (0..12).filter(|&b| b != 5) {
        assert_eq!(read_version(&recovered, b).unwrap(), Some(if b == 8 { 0 } else { 1 }), "recovered {b}");
    }
}

// ------------------------------------------------------------------------------------------
// Suspicion 9: crash points inside the new paths. A fixed workload drives every mechanism of
// the two commits (wide clean windows, copy-forward with run reads, reclaim's write-back of
// the next segments, the pre-cleaner below the watermark, big run reads) and is run once per
// I/O it issues, with the cache device (then the backing device) failing for good at exactly
// that I/O; the devices then crash (unflushed writes dropped, applied or torn) and every block
// must read a version at least as new as its last acknowledged FLUSH, never garbage.

const CD_BLOCKS: u64 = 400;

fn countdown_workload(volume: &Volume, live: bool) -> Vec<u64> {
    let mut durable = vec![0u64; CD_BLOCKS as usize];
    let mut latest = vec![0u64; CD_BLOCKS as usize];
    let mut pending: Vec<(u64, u64)> = Vec::new();
    let mut version = 0;
    let mut next_admit = 200u64;
    for round in 0..24u64 {
        // A dirty run of 7 blocks (a segment's worth), sometimes two.
        for k in 0..(1 + round % 2) {
            let first = (round * 11 + k * 40) % 100;
            version += 1;
            if volume.write(first * BS as u64, &stamps(first, 7, version)).is_err() {
                return durable;
            }
            for b in first..first + 7 {
                pending.push((b, version));
                latest[b as usize] = version;
            }
        }
        if volume.flush().is_err() {
            return durable;
        }
        for (b, v) in pending.drain(..) {
            durable[b as usize] = v;
        }
        // Clean admissions: two records' worth.
        for _ in 0..2 {
            let mut buf = vec![0u8; 12 * BS];
            if volume.read(next_admit * BS as u64, &mut buf).is_err() {
                return durable;
            }
            next_admit = if next_admit + 12 > CD_BLOCKS - 12 { 200 } else { next_admit + 12 };
        }
        // A big run read over the dirty area, checked exactly while nothing failed.
        let mut big = vec![0u8; 100 * BS];
        match volume.read(0, &mut big) {
            Ok(()) if live => {
                for (i, b) in big.chunks(BS).enumerate() {
                    assert_eq!(version_of(i as u64, b), Some(latest[i]), "round {round}: live run read of block {i}");
                }
            }
            Ok(()) => {}
            Err(_) => return durable,
        }
        let extra = match round % 4 {
            1 => volume.background_tick(),
            3 => volume.destage_oldest(16).map(|_| ()),
            _ => Ok(()),
        };
        if extra.is_err() {
            return durable;
        }
    }
    durable
}

#[test]
fn every_io_of_the_bandwidth_paths_can_fail_and_nothing_flushed_is_lost() {
    for failing_cache in [true, false] {
        let (cache, backing) = devices(16, CD_BLOCKS);
        let v = open(cache.clone(), backing.clone());
        let before = if failing_cache { cache.stats() } else { backing.stats() };
        countdown_workload(&v, true);
        let after = if failing_cache { cache.stats() } else { backing.stats() };
        let c = v.status().counters;
        assert!(c.copied_forward_blocks > 0, "copy-forward ran");
        assert!(c.evicted_blocks > 0 && c.destaged_blocks > 0, "eviction and write-back ran");
        assert!(v.log_window().2 > 3 * 128, "the workload laps the log");
        let ops = (after.reads + after.writes + after.flushes + after.fua_writes)
            - (before.reads + before.writes + before.flushes + before.fua_writes);
        drop(v);
        for n in 0..ops {
            let (cache, backing) = devices(16, CD_BLOCKS);
            let volume = open(cache.clone(), backing.clone());
            let failing = if failing_cache { &cache } else { &backing };
            failing.fail_after(None, n, tiercache_device::FailMode::Forever);
            let durable = countdown_workload(&volume, false);
            drop(volume);
            cache.clear_faults();
            backing.clear_faults();
            cache.crash(n);
            backing.crash(n.wrapping_mul(7919));
            let volume = open(cache.clone(), backing.clone());
            let mut buf = vec![0u8; BS];
            for block in 0..CD_BLOCKS {
                volume
                    .read(block * BS as u64, &mut buf)
                    .unwrap_or_else(|e| panic!("cache {failing_cache} I/O {n}: block {block}: {e}"));
                let v = version_of(block, &buf)
                    .unwrap_or_else(|| panic!("cache {failing_cache} I/O {n}: block {block}: garbage"));
                assert!(
                    v >= durable[block as usize],
                    "cache {failing_cache} I/O {n} failed: block {block} reads version {v}, {} was flushed",
                    durable[block as usize]
                );
            }
        }
    }
}

#[test]
fn tiny_and_small_logs_with_slow_devices() {
    for seed in 300..306 {
        let _ = tiny_stress_jitter(seed, 4, 8, seed % 2 == 0, 200, 2000);
        let _ = tiny_stress_jitter(seed + 50, 4, 32, seed % 2 == 1, 200, 2000);
        let _ = tiny_stress_jitter(seed + 80, 8, 16, true, 300, 3000);
    }
}

// ------------------------------------------------------------------------------------------
// Suspicion 10: the run read's per-block CRC check alone cannot tell the planned version from
// other data with the same CRC in a reused slot; only the position confirmed under the lock
// can. (A mutant without that confirmation passes every other test here: foreign data almost
// never matches.) So forge it: block X's planned slot is reused, while X's read is held, by
// block Y whose content has exactly X's CRC. X must read X's data, not Y's.

/// `base` with its last 4 bytes changed so that its CRC-32C is `target` (CRC is affine over
/// GF(2): solve the 32x32 system of the last 32 bits' effects).
fn forge_crc(base: &[u8], target: u32) -> Vec<u8> {
    let crc = tiercache_format::checksum;
    let n = base.len();
    let c0 = crc(base);
    // Column j: the CRC change of flipping bit j of the last 4 bytes.
    let cols: Vec<u32> = (0..32)
        .map(|j| {
            let mut m = base.to_vec();
            m[n - 4 + j / 8] ^= 1 << (j % 8);
            crc(&m) ^ c0
        })
        .collect();
    // Gaussian elimination: rows are (combination mask of columns, value).
    let mut basis: Vec<(u32, u32)> = Vec::new(); // (value with leading bit, mask)
    for (j, &c) in cols.iter().enumerate() {
        let (mut v, mut m) = (c, 1u32 << j);
        for &(bv, bm) in &basis {
            if v ^ bv < v {
                v ^= bv;
                m ^= bm;
            }
        }
        if v != 0 {
            basis.push((v, m));
            basis.sort_by_key(|b| std::cmp::Reverse(b.0));
        }
    }
    assert_eq!(basis.len(), 32, "the last 4 bytes span every CRC");
    let (mut want, mut mask) = (c0 ^ target, 0u32);
    for &(bv, bm) in &basis {
        if want ^ bv < want {
            want ^= bv;
            mask ^= bm;
        }
    }
    assert_eq!(want, 0);
    let mut out = base.to_vec();
    for j in 0..32 {
        if mask & (1 << j) != 0 {
            out[n - 4 + j / 8] ^= 1 << (j % 8);
        }
    }
    assert_eq!(crc(&out), target);
    out
}

#[test]
fn a_stalled_read_never_serves_other_data_with_the_same_crc_from_a_reused_slot() {
    let (cache, backing) = devices(16, 512);
    let gate = Gate::new(cache.clone());
    let volume = Arc::new(open(gate.clone(), backing.clone()));
    const X: u64 = 40;
    const Y: u64 = 300;
    // X cached clean (admitted with its neighbours).
    let mut buf = vec![0u8; 12 * BS];
    volume.read(X * BS as u64, &mut buf).unwrap();
    let (s, dirty) = slot_of(&volume, X).expect("admitted");
    assert!(!dirty);
    let x_data = stamp(X, 0);
    let forged = forge_crc(&stamp(Y, 9), tiercache_format::checksum(&x_data));
    assert_ne!(forged, x_data);
    gate.arm(Hold::ReadBefore(1));
    let reader = {
        let v = volume.clone();
        std::thread::spawn(move || {
            let mut one = vec![0u8; BS];
            v.read(X * BS as u64, &mut one).map(|()| one)
        })
    };
    gate.wait_until_held();
    volume.discard(X * BS as u64, BS as u64).unwrap();
    // Lap once, then steer the tail so that the next record's data block lands in slot s.
    let log = 128u64;
    let tail0 = volume.log_window().2;
    let mut i = 0u64;
    let mut filler = |k: u64| {
        volume.write((200 + i % 8) * BS as u64, &stamps(200 + i % 8, 1, 1000 + i)).unwrap();
        if k == 2 {
            volume.write((210 + i % 8) * BS as u64, &stamps(210 + i % 8, 1, 1000 + i)).unwrap();
        }
        volume.flush().unwrap();
        i += 1;
    };
    while volume.log_window().2 < tail0 + log + 8 {
        filler(1);
    }
    loop {
        let tail = volume.log_window().2;
        let d = (u64::from(s) + log - 1 - tail % log) % log;
        if d == 0 {
            break;
        }
        filler(if d % 2 == 1 { 2 } else { 1 });
    }
    volume.write(Y * BS as u64, &forged).unwrap();
    volume.flush().unwrap();
    assert_eq!(slot_of(&volume, Y).map(|e| e.0), Some(s), "Y's forged block sits in X's old slot");
    gate.open_gate();
    let got = reader.join().unwrap().expect("the held read");
    assert!(got == x_data, "X read {:?} (Y's forged block with X's CRC)", version_of(Y, &got).map(|v| (Y, v)));
}
