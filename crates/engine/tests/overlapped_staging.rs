//! A lone writer of a request larger than a record (issue 13: a 1 MiB write at queue depth 1
//! ran at 0.74-0.78 of the raw cache device): it stages (and checksums) the rest of its
//! request while its record is written (`BlockDevice::write_at_while`), and when staging
//! fills again meanwhile it seals and writes that record too, without waiting
//! (`try_commit_nested`), so two of its records are in flight at once. Pinned without
//! timing: a device that counts the writes in flight and runs the writer's work before the
//! data lands.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use tiercache_device::{BlockDevice, DeviceError, SimDevice};
use tiercache_engine::Volume;

mod common;
use common::*;

/// The cache device: counts plain writes and writes with work to overlap, and how many
/// writes were in flight at most. `write_at_while` runs the work first and lands the data
/// after it (the device is slower than the writer), so a write the work issues is in flight
/// together with this one. `fail_next_while` fails the next write with work, after its work.
struct Overlap {
    inner: Arc<SimDevice>,
    in_flight: AtomicU64,
    max_in_flight: AtomicU64,
    plain: AtomicU64,
    with_work: AtomicU64,
    fail_next_while: AtomicBool,
}

impl Overlap {
    fn new(inner: &Arc<SimDevice>) -> Arc<Overlap> {
        Arc::new(Overlap {
            inner: Arc::clone(inner),
            in_flight: AtomicU64::new(0),
            max_in_flight: AtomicU64::new(0),
            plain: AtomicU64::new(0),
            with_work: AtomicU64::new(0),
            fail_next_while: AtomicBool::new(false),
        })
    }
}

impl BlockDevice for Overlap {
    forward_to_inner!(inner: size_bytes, logical_block_size, read_at, flush, discard);
    fn write_at(&self, offset: u64, buf: &[u8]) -> tiercache_device::Result<()> {
        self.plain.fetch_add(1, Ordering::SeqCst);
        self.inner.write_at(offset, buf)
    }
    fn write_at_while(&self, offset: u64, buf: &[u8], during: &mut dyn FnMut()) -> tiercache_device::Result<()> {
        self.with_work.fetch_add(1, Ordering::SeqCst);
        let now = self.in_flight.fetch_add(1, Ordering::SeqCst) + 1;
        self.max_in_flight.fetch_max(now, Ordering::SeqCst);
        // (Decided before the work: a write the work issues is the next one.)
        let fail = self.fail_next_while.swap(false, Ordering::SeqCst);
        during();
        let landed = if fail {
            Err(DeviceError::Injected { device: "overlap".into(), op: "write" })
        } else {
            self.inner.write_at(offset, buf)
        };
        self.in_flight.fetch_sub(1, Ordering::SeqCst);
        landed
    }
    fn describe(&self) -> String {
        "overlap".into()
    }
}

/// A log of 256 segments of 8 blocks (records of 126 data blocks, no reclaim), a backing
/// device of 4,096 blocks at version 0, and the volume on the counting cache.
fn volume() -> (Arc<Overlap>, Arc<SimDevice>, Arc<SimDevice>, Volume) {
    let (cache, backing) = devices(256, 4096);
    let dev = Overlap::new(&cache);
    let v = open(Arc::clone(&dev) as Arc<dyn BlockDevice>, Arc::clone(&backing) as Arc<dyn BlockDevice>);
    (dev, cache, backing, v)
}

fn versions(v: &Volume, first: u64, n: u64) -> Vec<Option<u64>> {
    (first..first + n).map(|b| read_version(v, b).unwrap()).collect()
}

/// 1 MiB in one request: 256 blocks, two full records and four blocks left staged. The
/// first record is written with the second's blocks staged meanwhile, and the second is
/// sealed and written while the first is still in flight. Everything reads back, live and
/// after FLUSH and a power cut.
#[test]
fn a_lone_large_write_keeps_two_of_its_records_in_flight() {
    let (dev, cache, backing, v) = volume();
    v.write(100 * BS as u64, &stamps(100, 256, 1)).unwrap();
    let c = v.status().counters;
    assert_eq!((c.staged_during_record_writes, c.nested_record_writes), (1, 1), "{c:?}");
    assert_eq!(dev.max_in_flight.load(Ordering::SeqCst), 2, "the two records were not in flight together");
    assert_eq!(versions(&v, 100, 256), vec![Some(1); 256]);
    v.flush().unwrap();
    drop(v);
    let r = open(durable_copy(&cache), durable_copy(&backing));
    assert_eq!(versions(&r, 100, 256), vec![Some(1); 256]);
}

/// A request that ends a few blocks past a full staging has too little left to overlap: its
/// record is one plain write (the asynchronous one costs a device more than staging a few
/// blocks saves).
#[test]
fn a_few_blocks_past_a_full_staging_is_a_plain_write() {
    let (dev, _cache, _backing, v) = volume();
    v.write(0, &stamps(0, 124, 1)).unwrap();
    v.write(124 * BS as u64, &stamps(124, 8, 1)).unwrap();
    assert_eq!(v.status().counters.records_written, 1);
    assert_eq!(dev.with_work.load(Ordering::SeqCst), 0);
    assert_eq!(versions(&v, 0, 132), vec![Some(1); 132]);
}

/// 200 blocks: the first record is written with the other 74 staged meanwhile, which do
/// not fill staging, so nothing more goes out until the next request.
#[test]
fn a_request_of_one_record_and_a_part_overlaps_once() {
    let (dev, _cache, _backing, v) = volume();
    v.write(0, &stamps(0, 200, 1)).unwrap();
    let c = v.status().counters;
    assert_eq!((c.records_written, c.staged_during_record_writes, c.nested_record_writes), (1, 1, 0), "{c:?}");
    assert_eq!(dev.with_work.load(Ordering::SeqCst), 1);
    assert_eq!(versions(&v, 0, 200), vec![Some(1); 200]);
}

/// With another writer's record in flight the writer does not stage during its own record
/// writes, nor nest them: others keep the device busy, and staging meanwhile, contended by
/// them, held its record's buffer longer (16 writers of 1 MiB went from 0.81 of the raw
/// device to 0.78). Both requests read back whole.
#[test]
fn a_writer_overlaps_only_a_record_written_alone() {
    let (dev, _cache, _backing, v) = common::holds::held_volume(256);
    // The first record write (another writer's 126 blocks) is held in flight.
    let held = dev.hold(|op, _, len| op == common::holds::Op::Write && len == 127 * BS);
    let other = on_thread(&v, |v| v.write(0, &stamps(0, 127, 1)).unwrap());
    dev.wait_held(held);
    v.write(1000 * BS as u64, &stamps(1000, 256, 1)).unwrap();
    let c = v.status().counters;
    assert_eq!((c.staged_during_record_writes, c.nested_record_writes), (0, 0), "{c:?}");
    dev.release(held);
    other.join().unwrap();
    assert_eq!(versions(&v, 0, 127), vec![Some(1); 127]);
    assert_eq!(versions(&v, 1000, 256), vec![Some(1); 256]);
}

/// The first record's write fails after the writer staged, sealed and wrote the second
/// one meanwhile: the write reports the error, the volume refuses what follows, and after a
/// power cut that kept the second record but not the first, recovery stops at the gap
/// (the second record's blocks are not replayed without the first's) and the earlier
/// flushed data is intact.
#[test]
fn the_first_record_failing_under_the_second_loses_nothing_acknowledged() {
    let (dev, cache, backing, v) = volume();
    v.write(0, &stamps(0, 8, 1)).unwrap();
    v.flush().unwrap();
    dev.fail_next_while.store(true, Ordering::SeqCst);
    let e = v.write(100 * BS as u64, &stamps(100, 256, 2)).expect_err("the first record's write failed");
    assert!(e.to_string().contains("injected write error"), "{e}");
    assert_eq!(v.status().counters.nested_record_writes, 1, "the second record went out meanwhile");
    assert!(v.flush().is_err(), "a poisoned volume acknowledges no FLUSH");
    // Power cut with every completed write landed: the second record is on the medium, the
    // first is not.
    drop(v);
    let c = Arc::new(SimDevice::from_image(cache.current_image(), BS as u32));
    let r = open(c, durable_copy(&backing));
    assert_eq!(versions(&r, 0, 8), vec![Some(1); 8]);
    let after: Vec<Option<u64>> = versions(&r, 100, 256);
    assert!(after.iter().all(|&x| x == Some(0)), "blocks of records past the gap came back: {after:?}");
}
