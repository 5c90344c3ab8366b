//! Adversarial review of "write-back and copy-forward read a stretch of the log in one
//! scatter I/O through gaps of up to `MAX_READ_THROUGH_SLOTS` slots" (`Volume::read_slots`,
//! crates/engine/src/volume/log_io.rs). The skipped slots are read into scratch blocks and
//! never looked at; these tests check that they really do not matter, whatever they hold
//! and whether or not they can be read, and that every block the batch wants lands in its
//! own place:
//! - `an_unreadable_stale_slot_inside_a_write_back_stretch_does_not_fail_the_write_back`
//! - `an_unreadable_header_slot_between_two_records_does_not_fail_the_write_back`
//! - `an_unreadable_stale_slot_inside_a_copy_forward_stretch_does_not_poison_the_volume`
//! - `a_transient_read_error_in_a_write_back_stretch_loses_nothing`
//! - `garbage_in_skipped_slots_is_never_looked_at`
//! - `blocks_whose_slots_descend_as_their_numbers_ascend_land_in_their_own_places`
//! - `write_back_of_records_that_wrap_at_the_physical_end_of_the_log`
//! - `a_stretch_of_more_than_1024_buffers_on_a_file_cache_writes_back_every_block`
//! - `writers_and_destagers_racing_on_a_small_wrapping_log_lose_nothing`
//!
//! (A duplicate slot cannot be reached through the public API: every batch is built from the
//! index or from disjoint windows of it.)

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tiercache_device::{BlockDevice, DeviceError, FailMode, FileDevice, MonotonicClock, OpKind, SimDevice};
use tiercache_engine::{create, CreateOptions, Volume, VolumeOptions, VolumeState};
use tiercache_format::Layout;

mod common;
use common::*;

const BACKING_BLOCKS: u64 = 4096;

/// A simulated cache with bad sectors: a read touching one fails (EIO, as a medium error
/// does), and a write over one repairs it (a disk remaps a sector on write). Counts reads and
/// records the largest scatter list it was handed.
struct Media {
    inner: Arc<SimDevice>,
    bad: Mutex<Vec<u64>>,
    reads: AtomicU64,
    max_bufs: AtomicU64,
}

impl Media {
    fn touches_bad(&self, offset: u64, len: u64) -> bool {
        self.bad.lock().unwrap().iter().any(|&b| offset <= b && b < offset + len)
    }

    fn mark_bad(&self, offset: u64) {
        self.bad.lock().unwrap().push(offset);
    }

    fn still_bad(&self) -> usize {
        self.bad.lock().unwrap().len()
    }
}

fn medium_error() -> DeviceError {
    DeviceError::Injected { device: "media".into(), op: "read" }
}

impl BlockDevice for Media {
    forward_to_inner!(inner: size_bytes, logical_block_size, flush, discard);
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> tiercache_device::Result<()> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        if self.touches_bad(offset, buf.len() as u64) {
            return Err(medium_error());
        }
        self.inner.read_at(offset, buf)
    }
    fn read_vectored_at(&self, offset: u64, bufs: &mut [&mut [u8]]) -> tiercache_device::Result<()> {
        self.reads.fetch_add(1, Ordering::SeqCst);
        self.max_bufs.fetch_max(bufs.len() as u64, Ordering::SeqCst);
        let len: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        if self.touches_bad(offset, len) {
            return Err(medium_error());
        }
        self.inner.read_vectored_at(offset, bufs)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> tiercache_device::Result<()> {
        self.inner.write_at(offset, buf)?;
        self.bad.lock().unwrap().retain(|&b| !(offset <= b && b < offset + buf.len() as u64));
        Ok(())
    }
    fn write_fua_at(&self, offset: u64, buf: &[u8]) -> tiercache_device::Result<()> {
        self.inner.write_fua_at(offset, buf)?;
        self.bad.lock().unwrap().retain(|&b| !(offset <= b && b < offset + buf.len() as u64));
        Ok(())
    }
    fn describe(&self) -> String {
        "media".into()
    }
}

/// A log of `log_blocks` in segments of `seg` over a backing device of `BACKING_BLOCKS`
/// stamped with version 0; the cache seen through `Media`. No background thread: the tests
/// run write-back themselves. Reads of any length are admitted (clean filler).
fn media_volume(log_blocks: u64, seg: u32) -> (Arc<Media>, Arc<SimDevice>, Volume) {
    let ck = Layout::checkpoint_blocks_for(log_blocks, BS as u32);
    let inner = Arc::new(SimDevice::new((2 + 2 * ck + log_blocks) * BS as u64, BS as u32).with_name("cache"));
    let backing = Arc::new(SimDevice::from_image(stamps(0, BACKING_BLOCKS, 0), BS as u32).with_name("backing"));
    create(&*inner, &*backing, &CreateOptions { segment_blocks: seg, ..log_only() }).expect("create");
    let media =
        Arc::new(Media { inner, bad: Mutex::new(Vec::new()), reads: AtomicU64::new(0), max_bufs: AtomicU64::new(0) });
    let c: Arc<dyn BlockDevice> = media.clone();
    let b: Arc<dyn BlockDevice> = backing.clone();
    let options = VolumeOptions { sequential_bypass_bytes: 0, ..VolumeOptions::default() };
    let volume = Volume::open(c, b, Arc::new(MonotonicClock::new()), options).expect("open").0;
    (media, backing, volume)
}

/// The byte offset of log slot `slot` on the cache device.
fn slot_offset(v: &Volume, slot: u32) -> u64 {
    v.superblock().layout.log_offset(u64::from(slot))
}

fn live_slots(v: &Volume) -> Vec<u32> {
    v.index_snapshot().into_iter().map(|(_, e)| e.slot).collect()
}

fn assert_healthy(v: &Volume) {
    let s = v.status();
    assert_eq!(s.state, VolumeState::Ok, "the volume failed: {:?}", s.failure);
    assert_eq!(s.lost_blocks, 0, "blocks lost: {:?}", s.lost_block_numbers);
}

/// Blocks 0..10 in one record, then 1..=8 rewritten: the first record holds block 0, eight
/// stale slots, block 9 (a gap of exactly `MAX_READ_THROUGH_SLOTS`). Returns the slot of a
/// stale one in the middle.
fn record_with_a_stale_middle(v: &Volume) -> u32 {
    v.write(0, &stamps(0, 10, 1)).unwrap();
    v.flush().unwrap();
    let (s0, s9) = (slot_of(v, 0).unwrap().0, slot_of(v, 9).unwrap().0);
    assert_eq!(s9, s0 + 9, "one record: consecutive slots");
    v.write(BS as u64, &stamps(1, 8, 2)).unwrap();
    v.flush().unwrap();
    let stale = s0 + 4;
    assert!(!live_slots(v).contains(&stale), "slot {stale} is stale");
    stale
}

/// A medium error in a slot nobody needs (a stale copy between two live dirty blocks) must
/// not fail the write-back of those blocks: before the scatter read, they were read as two
/// separate runs and the stale slot was never touched. The foreground read path already
/// has this property (`an_unreadable_skipped_header_slot_does_not_fail_the_read`).
#[test]
fn an_unreadable_stale_slot_inside_a_write_back_stretch_does_not_fail_the_write_back() {
    let (media, backing, v) = media_volume(1024, 16);
    let stale = record_with_a_stale_middle(&v);
    media.mark_bad(slot_offset(&v, stale) + 512);
    let written = v.destage_step(4096);
    assert_healthy(&v);
    assert_eq!(written.expect("write-back of 10 readable dirty blocks"), 10);
    assert_eq!(backing_version(&backing, 0), Some(1));
    assert_eq!(backing_version(&backing, 9), Some(1));
    for b in 1..=8 {
        assert_eq!(backing_version(&backing, b), Some(2), "block {b}");
    }
}

/// The same with the unreadable slot a record header (the commonest skipped slot: one lies
/// between every two records of a sequential write).
#[test]
fn an_unreadable_header_slot_between_two_records_does_not_fail_the_write_back() {
    let (media, backing, v) = media_volume(1024, 16);
    v.write(0, &stamps(0, 8, 1)).unwrap();
    v.flush().unwrap();
    v.write(8 * BS as u64, &stamps(8, 8, 1)).unwrap();
    v.flush().unwrap();
    let (s7, s8) = (slot_of(&v, 7).unwrap().0, slot_of(&v, 8).unwrap().0);
    assert_eq!(s8, s7 + 2, "the second record's header between");
    media.mark_bad(slot_offset(&v, s7 + 1));
    let written = v.destage_step(4096);
    assert_healthy(&v);
    assert_eq!(written.expect("write-back of 16 readable dirty blocks"), 16);
    for b in 0..16 {
        assert_eq!(backing_version(&backing, b), Some(1), "block {b}");
    }
}

/// Copy-forward: reclaim meets a window with two live dirty blocks around eight stale
/// slots, one of them unreadable. It needs only the two; the volume must go on taking
/// writes for several laps of the log (the bad sector is repaired when the log overwrites
/// it). With the scatter read, reclaim's read fails as a whole and poisons the volume, and
/// because every later reclaim of that window reads through the same slot, a reopened
/// volume fails the same way: one bad sector in dead space stops the write path for good.
#[test]
fn an_unreadable_stale_slot_inside_a_copy_forward_stretch_does_not_poison_the_volume() {
    let (media, _backing, v) = media_volume(256, 16);
    // One record: block 0 written, blocks 1..=8 read (admitted clean), block 9 written.
    write(&v, 0, 1);
    read_once(&v, 1..9);
    write(&v, 9, 1);
    v.flush().unwrap();
    let s0 = slot_of(&v, 0).unwrap().0;
    assert_eq!(slot_of(&v, 9), Some((s0 + 9, true)), "one record: consecutive slots");
    // Blocks 1..=8 dropped (TRIM): their slots are stale, and the window holds only 2 dirty
    // blocks (at most half a segment: reclaim copies them forward rather than write back).
    v.discard(BS as u64, 8 * BS as u64).unwrap();
    let stale = s0 + 4;
    assert!(!live_slots(&v).contains(&stale));
    media.mark_bad(slot_offset(&v, stale));
    // Clean filler (read misses admitted) for three laps of the log: reclaim passes the
    // window with blocks 0 and 9 and copies them forward.
    let mut buf = vec![0u8; 16 * BS];
    let mut b = 100;
    while v.status().log_tail < 3 * 256 {
        let r = v.read(b * BS as u64, &mut buf);
        assert_healthy(&v);
        r.unwrap();
        b = if b + 16 >= BACKING_BLOCKS { 100 } else { b + 16 };
    }
    assert!(v.status().counters.copied_forward_blocks >= 2, "reclaim copied blocks 0 and 9 forward");
    assert_eq!(media.still_bad(), 0, "the log overwrote the bad sector");
    assert_eq!(read_version(&v, 0).unwrap(), Some(1));
    assert_eq!(read_version(&v, 9).unwrap(), Some(1));
}

/// A transient read error in the middle of a write-back stretch: the stretch is read again
/// without its gaps (run by run), so the write-back succeeds and nothing is lost.
#[test]
fn a_transient_read_error_in_a_write_back_stretch_is_read_again_run_by_run() {
    let (cache, _backing, v) = dirty_stretch();
    let r0 = cache.stats().reads;
    cache.fail_after(Some(OpKind::Read), 0, FailMode::Once);
    assert_eq!(v.destage_step(4096).unwrap(), 288, "the retry without gaps read every block");
    assert!(cache.stats().reads - r0 > 2, "the failed stretch was read again run by run");
    assert_healthy(&v);
    assert_eq!(v.status().lost_blocks, 0);
    for b in 0..288 {
        assert_eq!(read_version(&v, b).unwrap(), Some(if b % 4 == 0 { 2 } else { 1 }), "block {b}");
    }
}

/// A read error that persists: the write-back fails (and the volume with it, as any failed
/// cache read of a write-back does), but no block is declared lost, and after a power cut
/// every dirty block is still there and writes back.
#[test]
fn a_persistent_read_error_in_a_write_back_stretch_loses_nothing() {
    let (cache, backing, v) = dirty_stretch();
    cache.fail_after(Some(OpKind::Read), 0, FailMode::Forever);
    assert!(v.destage_step(4096).is_err(), "the failed reads fail the write-back");
    assert_eq!(v.status().lost_blocks, 0, "a failed read is not a bad copy: nothing is lost");
    drop(v);
    let v = open(durable_copy(&cache), durable_copy(&backing));
    assert_healthy(&v);
    assert_eq!(v.status().dirty_blocks, 288);
    assert_eq!(v.destage_step(4096).unwrap(), 288);
    for b in 0..288 {
        assert_eq!(read_version(&v, b).unwrap(), Some(if b % 4 == 0 { 2 } else { 1 }), "block {b}");
    }
}

/// 288 dirty blocks in nine records, every fourth rewritten: one stretch of the log with a
/// stale slot or a header every few slots, and the rewritten blocks after it.
fn dirty_stretch() -> (Arc<SimDevice>, Arc<SimDevice>, Volume) {
    let (cache, backing, v) = volume_seg(64, 16, BACKING_BLOCKS, VolumeOptions::default());
    for r in 0..9 {
        v.write(r * 32 * BS as u64, &stamps(r * 32, 32, 1)).unwrap();
        v.flush().unwrap();
    }
    for b in (0..288).step_by(4) {
        v.write(b * BS as u64, &stamp(b, 2)).unwrap();
    }
    v.flush().unwrap();
    (cache, backing, v)
}

/// Garbage (torn writes, bit rot) in every skipped slot of a stretch, headers included: the
/// blocks wanted verify, nothing is declared lost, the write-back carries every block.
#[test]
fn garbage_in_skipped_slots_is_never_looked_at() {
    let (cache, backing, v) = volume_seg(64, 16, BACKING_BLOCKS, VolumeOptions::default());
    for r in 0..4 {
        v.write(r * 16 * BS as u64, &stamps(r * 16, 16, 1)).unwrap();
        v.flush().unwrap();
    }
    for b in (0..64).filter(|b| b % 3 == 1) {
        v.write(b * BS as u64, &stamp(b, 2)).unwrap();
    }
    v.flush().unwrap();
    let live = live_slots(&v);
    let (lo, hi) = (*live.iter().min().unwrap(), *live.iter().max().unwrap());
    let mut rotted = 0;
    for slot in lo..hi {
        if !live.contains(&slot) {
            cache.corrupt(slot_offset(&v, slot), &vec![0xA5u8; BS]);
            rotted += 1;
        }
    }
    assert!(rotted > 20, "{rotted} skipped slots rotted");
    assert_eq!(v.destage_step(4096).unwrap(), 64);
    assert_healthy(&v);
    for b in 0..64 {
        assert_eq!(backing_version(&backing, b), Some(if b % 3 == 1 { 2 } else { 1 }), "block {b}");
    }
}

/// `out[k]` must be `slots[k]`'s block whatever order the slots come in: blocks written one
/// by one in descending order (so a batch sorted by block number has its slots in
/// descending order), with stale slots between them, and reclaim's copy-forward (dirty
/// blocks first, then kept clean ones: not in slot order either).
#[test]
fn blocks_whose_slots_descend_as_their_numbers_ascend_land_in_their_own_places() {
    let (media, backing, v) = media_volume(256, 16);
    for b in (0..40u64).rev() {
        v.write(b * BS as u64, &stamp(b, 1)).unwrap();
        if b % 7 == 0 {
            v.flush().unwrap();
        }
    }
    v.flush().unwrap();
    for b in (0..40u64).filter(|b| b % 5 == 2) {
        v.write(b * BS as u64, &stamp(b, 2)).unwrap();
    }
    v.flush().unwrap();
    let s: Vec<u32> = (0..40).map(|b| slot_of(&v, b).unwrap().0).collect();
    assert!(s[0] > s[1] && s[1] > s[3], "slots descend: {s:?}");
    let reads = media.reads.load(Ordering::SeqCst);
    assert_eq!(v.destage_step(4096).unwrap(), 40);
    assert!(media.reads.load(Ordering::SeqCst) - reads <= 3, "a few stretches, not a read per block");
    for b in 0..40 {
        assert_eq!(backing_version(&backing, b), Some(if b % 5 == 2 { 2 } else { 1 }), "block {b}");
    }
    // Copy-forward: a few dirty blocks in descending slots among clean ones read since
    // cached (reinserted), then laps of clean filler.
    for b in (200..206u64).rev() {
        write(&v, b, 3);
        v.flush().unwrap();
    }
    read_once(&v, 300..310);
    let mut buf = vec![0u8; 16 * BS];
    let mut b = 1000;
    while v.status().log_tail < 4 * 256 {
        v.read(b * BS as u64, &mut buf).unwrap();
        b = if b + 16 >= BACKING_BLOCKS { 1000 } else { b + 16 };
    }
    assert_healthy(&v);
    assert!(v.status().counters.copied_forward_blocks >= 6);
    for b in 200..206 {
        assert_eq!(read_version(&v, b).unwrap(), Some(3), "block {b} after copy-forward");
    }
    for b in 300..310 {
        assert_eq!(read_version(&v, b).unwrap(), Some(0), "block {b}");
    }
}

/// Records that wrap at the physical end of a small log, written back batch after batch:
/// the batch's slots near the end and near the start are separate stretches (sorted by slot,
/// a stretch never crosses the end), and every block reaches the backing device.
#[test]
fn write_back_of_records_that_wrap_at_the_physical_end_of_the_log() {
    let log = 128u64;
    let (_media, backing, v) = media_volume(log, 8);
    let mut model: HashMap<u64, u64> = HashMap::new();
    let mut wrapped_batches = 0;
    for round in 1..=200u64 {
        let first = (round * 13) % 300;
        let n = 1 + round % 7;
        v.write(first * BS as u64, &(first..first + n).flat_map(|b| stamp(b, round)).collect::<Vec<u8>>()).unwrap();
        v.flush().unwrap();
        for b in first..first + n {
            model.insert(b, round);
        }
        if round % 3 == 0 {
            let slots: Vec<u32> =
                v.index_snapshot().into_iter().filter(|(_, e)| e.dirty).map(|(_, e)| e.slot).collect();
            if slots.iter().any(|&s| u64::from(s) >= log - 4) && slots.iter().any(|&s| s < 4) {
                wrapped_batches += 1;
            }
            v.destage_step(4096).unwrap();
            assert_healthy(&v);
            assert_eq!(v.status().dirty_blocks, 0);
            for (&b, &ver) in &model {
                assert_eq!(backing_version(&backing, b), Some(ver), "block {b} after round {round}");
            }
        }
    }
    assert!(wrapped_batches >= 3, "only {wrapped_batches} batches held slots at both ends of the log");
    for (&b, &ver) in &model {
        assert_eq!(read_version(&v, b).unwrap(), Some(ver), "block {b}");
    }
}

/// One stretch of more than IOV_MAX buffers (1024 dirty blocks with a stale slot between each
/// two, and the headers) on an O_DIRECT file cache: the device splits it, every block lands.
/// Shown first on the simulator, whose scatter list length is visible.
#[test]
fn a_stretch_of_more_than_1024_buffers_on_a_file_cache_writes_back_every_block() {
    fn scenario(v: &Volume) {
        for r in 0..64u64 {
            v.write(r * 32 * BS as u64, &stamps(r * 32, 32, 1)).unwrap();
            v.flush().unwrap();
        }
        for r in 0..32u64 {
            let blocks: Vec<u64> = (r * 64..r * 64 + 64).filter(|b| b % 2 == 1).collect();
            for &b in &blocks {
                v.write(b * BS as u64, &stamp(b, 2)).unwrap();
            }
            v.flush().unwrap();
        }
        assert_eq!(v.destage_step(4096).unwrap(), 2048);
        assert_healthy(v);
    }
    let (media, backing, v) = media_volume(8192, 64);
    scenario(&v);
    assert!(media.max_bufs.load(Ordering::SeqCst) > 1024, "{} buffers", media.max_bufs.load(Ordering::SeqCst));
    for b in 0..2048 {
        assert_eq!(backing_version(&backing, b), Some(1 + b % 2), "block {b} (simulator)");
    }

    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let p = dir.path().join("cache");
    let ck = Layout::checkpoint_blocks_for(8192, BS as u32);
    std::fs::File::create(&p).unwrap().set_len((2 + 2 * ck + 8192) * BS as u64).unwrap();
    let cache = match FileDevice::open(&p) {
        Ok(d) => Arc::new(d),
        Err(DeviceError::DirectIoUnsupported { .. }) => {
            eprintln!("no O_DIRECT on {}: file part skipped", p.display());
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let backing = Arc::new(SimDevice::from_image(stamps(0, BACKING_BLOCKS, 0), BS as u32));
    create(&*cache, &*backing, &CreateOptions { segment_blocks: 64, ..log_only() }).expect("create");
    let c: Arc<dyn BlockDevice> = cache;
    let b: Arc<dyn BlockDevice> = backing.clone();
    let v = Volume::open(c, b, Arc::new(MonotonicClock::new()), VolumeOptions::default()).expect("open").0;
    scenario(&v);
    for b in 0..2048 {
        assert_eq!(backing_version(&backing, b), Some(1 + b % 2), "block {b} (file cache)");
    }
}

/// Writers, a destager and the pre-cleaner at once on a log of 128 blocks that laps many
/// times: stretches cover the free slots the record writer is filling at the tail (the free
/// space between the tail and the head is a few slots when the log is full), stale slots,
/// headers and the physical end. Nothing may be lost or misplaced.
#[test]
fn writers_and_destagers_racing_on_a_small_wrapping_log_lose_nothing() {
    let (_media, backing, v) = media_volume(128, 8);
    let v = Arc::new(v);
    let model: Arc<Mutex<HashMap<u64, u64>>> = Arc::default();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writers: Vec<_> = (0..3u64)
        .map(|w| {
            let (v, model) = (Arc::clone(&v), Arc::clone(&model));
            std::thread::spawn(move || {
                let mut x = 0x9E37_79B9_7F4A_7C15u64 ^ w;
                for version in 1..=400u64 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    // Each writer owns blocks w, w + 3, w + 6, ... below 240.
                    let first = w + 3 * (x % 70);
                    let n = 1 + (x >> 20) % 3;
                    let blocks: Vec<u64> = (0..n).map(|i| first + 3 * i).collect();
                    for &b in &blocks {
                        v.write(b * BS as u64, &stamp(b, version)).unwrap();
                    }
                    if version % 4 == 0 {
                        v.flush().unwrap();
                    }
                    let mut m = model.lock().unwrap();
                    for b in blocks {
                        m.insert(b, version);
                    }
                }
            })
        })
        .collect();
    let destagers: Vec<_> = (0..2)
        .map(|d| {
            let (v, stop) = (Arc::clone(&v), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    if d == 0 {
                        v.destage_step(64).unwrap();
                    } else {
                        v.destage_oldest(64).unwrap();
                    }
                    std::thread::yield_now();
                }
            })
        })
        .collect();
    for w in writers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::SeqCst);
    for d in destagers {
        d.join().unwrap();
    }
    v.flush().unwrap();
    assert_healthy(&v);
    assert!(v.status().log_tail > 5 * 128, "the log lapped: tail {}", v.status().log_tail);
    let model = model.lock().unwrap().clone();
    for (&b, &ver) in &model {
        assert_eq!(read_version(&v, b).unwrap(), Some(ver), "block {b}");
    }
    v.flush_all(|_, _| {}).unwrap();
    for (&b, &ver) in &model {
        assert_eq!(backing_version(&backing, b), Some(ver), "block {b} on the backing device");
    }
}
