//! Helpers shared by the engine's test files: stamped blocks, small simulated devices, a
//! volume opened on them, power cuts, reading, locating and rotting one block, reading and
//! forging the log's records and the checkpoint areas, and the `Gate` device that holds an
//! I/O until the test lets it go.
// (Each test file is its own crate and uses a different subset of these.)
#![allow(dead_code)]

use std::sync::atomic::{AtomicU64, Ordering as AtomicOrdering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use tiercache_device::{BlockDevice, DeviceError, MonotonicClock, SimClock, SimDevice, SimLatency, SimStats};
use tiercache_engine::{create, CreateOptions, EngineError, Eviction, OpenReport, Volume, VolumeOptions};
use tiercache_format::constants::{CHECKPOINT_ENTRY_SIZE, RECORD_ENTRY_SIZE, RECORD_HEADER_SIZE};
use tiercache_format::{checksum, uuid_low64, CheckpointEntry, CheckpointHeader, Layout, RecordHeader};

pub const BS: usize = 4096;

/// Writes out, inside an `impl BlockDevice for Wrapper { ... }` block, the listed
/// `BlockDevice` methods as pure forwards to the device in field `$field`:
/// `forward_to_inner!(inner: size_bytes, flush, discard);` is `fn size_bytes(&self) -> u64 {
/// self.inner.size_bytes() }` and so on, with the trait's exact signatures.
///
/// Why: the test wrappers (fault injection, counting, delays, holds) each change one or two
/// I/Os and passed the rest through by hand, a dozen lines of identical forwarding apiece;
/// here the forwarding is written once, and a wrapper writes out only what it changes.
/// Only the methods listed are defined: one left out keeps the trait's default (which may
/// call the wrapper's own `read_at` or `write_at`, so a fault there applies to it too), so
/// list exactly those the wrapper passes through untouched.
macro_rules! forward_to_inner {
    (@one $f:tt size_bytes) => {
        fn size_bytes(&self) -> u64 {
            self.$f.size_bytes()
        }
    };
    (@one $f:tt logical_block_size) => {
        fn logical_block_size(&self) -> u32 {
            self.$f.logical_block_size()
        }
    };
    (@one $f:tt read_at) => {
        fn read_at(&self, offset: u64, buf: &mut [u8]) -> ::tiercache_device::Result<()> {
            self.$f.read_at(offset, buf)
        }
    };
    (@one $f:tt read_vectored_at) => {
        fn read_vectored_at(&self, offset: u64, bufs: &mut [&mut [u8]]) -> ::tiercache_device::Result<()> {
            self.$f.read_vectored_at(offset, bufs)
        }
    };
    (@one $f:tt read_batch) => {
        fn read_batch(&self, ranges: &mut [::tiercache_device::ReadRange<'_>]) -> Vec<::tiercache_device::Result<()>> {
            self.$f.read_batch(ranges)
        }
    };
    (@one $f:tt read_batch_each) => {
        fn read_batch_each(
            &self,
            ranges: &mut [::tiercache_device::ReadRange<'_>],
            each: &mut ::tiercache_device::EachRange<'_>,
        ) -> Vec<::tiercache_device::Result<()>> {
            self.$f.read_batch_each(ranges, each)
        }
    };
    (@one $f:tt write_at) => {
        fn write_at(&self, offset: u64, buf: &[u8]) -> ::tiercache_device::Result<()> {
            self.$f.write_at(offset, buf)
        }
    };
    (@one $f:tt write_batch) => {
        fn write_batch(&self, writes: &[(u64, &[u8])]) -> Vec<::tiercache_device::Result<()>> {
            self.$f.write_batch(writes)
        }
    };
    (@one $f:tt write_at_while) => {
        fn write_at_while(&self, offset: u64, buf: &[u8], during: &mut dyn FnMut()) -> ::tiercache_device::Result<()> {
            self.$f.write_at_while(offset, buf, during)
        }
    };
    (@one $f:tt write_fua_at) => {
        fn write_fua_at(&self, offset: u64, buf: &[u8]) -> ::tiercache_device::Result<()> {
            self.$f.write_fua_at(offset, buf)
        }
    };
    (@one $f:tt flush) => {
        fn flush(&self) -> ::tiercache_device::Result<()> {
            self.$f.flush()
        }
    };
    (@one $f:tt discard) => {
        fn discard(&self, offset: u64, len: u64) -> ::tiercache_device::Result<()> {
            self.$f.discard(offset, len)
        }
    };
    (@one $f:tt describe) => {
        fn describe(&self) -> String {
            self.$f.describe()
        }
    };
    (@one $f:tt identity) => {
        fn identity(&self) -> Option<String> {
            self.$f.identity()
        }
    };
    (@one $f:tt atomic_write_bytes) => {
        fn atomic_write_bytes(&self) -> u32 {
            self.$f.atomic_write_bytes()
        }
    };
    (@one $f:tt $other:ident) => {
        compile_error!(concat!("forward_to_inner!: `", stringify!($other), "` is not a BlockDevice method"));
    };
    ($field:tt: $($method:ident),+ $(,)?) => {
        $(forward_to_inner!(@one $field $method);)+
    };
}
// (Defined before the submodules below, which see it in textual scope; the test files that
// `use common::*;` import it by path through this re-export, unused in those that wrap no
// device.)
#[allow(unused_imports)]
pub(crate) use forward_to_inner;

pub mod holds;
pub mod idle_rig;
pub mod race_rig;
pub mod rewrite_rig;

/// A block carrying its number and a version (the simulators' encoding), and the version
/// of `block` a read returned if the data is intact and is that block's.
pub use tiercache_sim::stamp::{stamped as stamp, version_of};

/// Blocks `first..first + n`, each stamped with `version`.
pub fn stamps(first: u64, n: u64, version: u64) -> Vec<u8> {
    (first..first + n).flat_map(|b| stamp(b, version)).collect()
}

/// Block 0 as ext4 lays it out with 4 KiB blocks: 1,024 zero bytes, the 1,024-byte superblock
/// whose last 4 bytes are `s_checksum` (the kernel's `crc32c(~0, sb, 1020)`: CRC-32C without
/// its final inversion, little-endian), then zeroes. `seed` varies the superblock's fields (its
/// UUID, mount count and times, free counts).
pub fn ext4_block0(seed: u64) -> Vec<u8> {
    let mut block = vec![0u8; BS];
    let sb = &mut block[1024..2048];
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    for b in sb[..1020].iter_mut() {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let s_checksum = !tiercache_format::checksum(&sb[..1020]);
    sb[1020..].copy_from_slice(&s_checksum.to_le_bytes());
    block
}

/// Create options for the log alone, with no probation ring: most tests here pin the log's own
/// mechanics, with read misses admitted into it (`tests/probation.rs` and the simulators cover
/// the ring, and the log behind it).
pub fn log_only() -> CreateOptions {
    CreateOptions { probation_permille: 0, ..CreateOptions::default() }
}

/// Volume options with the plain `s3fifo` policy: every miss that is no ghost enters the
/// probation ring from the start. The tests that pin the ring's own mechanics use it; the
/// default `adaptive` policy sends misses into the log until the log first wraps
/// (`tests/adaptive.rs`).
pub fn s3fifo() -> VolumeOptions {
    VolumeOptions { eviction: Eviction::S3fifo, ..VolumeOptions::default() }
}

/// A cache of `log_segments` segments of `seg` blocks, and a backing device of `blocks`
/// blocks stamped with version 0.
pub fn devices_seg(log_segments: u64, seg: u32, blocks: u64, opts: CreateOptions) -> (Arc<SimDevice>, Arc<SimDevice>) {
    let log_blocks = log_segments * u64::from(seg);
    let ck = Layout::checkpoint_blocks_for(log_blocks, BS as u32);
    let cache = Arc::new(SimDevice::new((2 + 2 * ck + log_blocks) * BS as u64, BS as u32).with_name("cache"));
    let backing = Arc::new(SimDevice::from_image(stamps(0, blocks, 0), BS as u32).with_name("backing"));
    create(&*cache, &*backing, &CreateOptions { segment_blocks: seg, ..opts }).expect("create");
    (cache, backing)
}

/// The dense-window tests' devices: a fast cache (tens of microseconds an I/O) and a slow
/// backing device (milliseconds, an HDD's order), so that copying forward is measured cheaper
/// than writing back.
pub const FAST: SimLatency = SimLatency { read_ns: 10_000, write_ns: 20_000, flush_ns: 50_000 };
pub const SLOW: SimLatency = SimLatency { read_ns: 5_000_000, write_ns: 8_000_000, flush_ns: 20_000_000 };

/// A cache of `log_blocks` blocks in segments of `seg`, and a backing device of `blocks`
/// blocks stamped with version 0, each advancing `clock` by its latencies at every I/O (give
/// the volume the same clock, and its timings follow the devices': virtual time, exact).
pub fn devices_on_clock(
    seg: u32,
    log_blocks: u64,
    blocks: u64,
    clock: &SimClock,
    cache_latency: SimLatency,
    backing_latency: SimLatency,
) -> (Arc<SimDevice>, Arc<SimDevice>) {
    let ck = Layout::checkpoint_blocks_for(log_blocks, BS as u32);
    let cache = Arc::new(
        SimDevice::new((2 + 2 * ck + log_blocks) * BS as u64, BS as u32)
            .with_name("cache")
            .with_clock(clock.clone(), cache_latency),
    );
    let backing = Arc::new(
        SimDevice::from_image(stamps(0, blocks, 0), BS as u32)
            .with_name("backing")
            .with_clock(clock.clone(), backing_latency),
    );
    create(&*cache, &*backing, &CreateOptions { segment_blocks: seg, ..log_only() }).expect("create");
    (cache, backing)
}

/// A power cut's survivors: fresh devices holding the durable images `cache` and `backing`,
/// on a fresh `clock` with the same latencies (the volume recovered on them is the caller's).
pub fn devices_from_images_on_clock(
    cache: Vec<u8>,
    backing: Vec<u8>,
    clock: &SimClock,
    cache_latency: SimLatency,
    backing_latency: SimLatency,
) -> (Arc<SimDevice>, Arc<SimDevice>) {
    let cache =
        Arc::new(SimDevice::from_image(cache, BS as u32).with_name("cache").with_clock(clock.clone(), cache_latency));
    let backing = Arc::new(
        SimDevice::from_image(backing, BS as u32).with_name("backing").with_clock(clock.clone(), backing_latency),
    );
    (cache, backing)
}

/// `devices_seg` for the log alone, and the volume on them opened with `options`.
pub fn volume_seg(
    log_segments: u64,
    seg: u32,
    blocks: u64,
    options: VolumeOptions,
) -> (Arc<SimDevice>, Arc<SimDevice>, Volume) {
    let (cache, backing) = devices_seg(log_segments, seg, blocks, log_only());
    let c: Arc<dyn BlockDevice> = cache.clone();
    let b: Arc<dyn BlockDevice> = backing.clone();
    let volume = Volume::open(c, b, Arc::new(MonotonicClock::new()), options).expect("open").0;
    (cache, backing, volume)
}

/// `devices_seg` with segments of 8 blocks, for the log alone.
pub fn devices(log_segments: u64, blocks: u64) -> (Arc<SimDevice>, Arc<SimDevice>) {
    devices_seg(log_segments, 8, blocks, log_only())
}

pub fn try_open(cache: Arc<dyn BlockDevice>, backing: Arc<dyn BlockDevice>) -> Result<Volume, EngineError> {
    try_open_report(cache, backing).map(|(v, _)| v)
}

/// `try_open`, with what open found (how many records it replayed, where replay ended and why).
pub fn try_open_report(
    cache: Arc<dyn BlockDevice>,
    backing: Arc<dyn BlockDevice>,
) -> Result<(Volume, OpenReport), EngineError> {
    Volume::open(cache, backing, Arc::new(MonotonicClock::new()), VolumeOptions::default())
}

pub fn open(cache: Arc<dyn BlockDevice>, backing: Arc<dyn BlockDevice>) -> Volume {
    try_open(cache, backing).expect("open")
}

/// A power cut now: fresh devices holding only what is durable.
pub fn durable_copy(dev: &SimDevice) -> Arc<SimDevice> {
    Arc::new(SimDevice::from_image(dev.durable_image(), BS as u32))
}

pub fn read_version(v: &Volume, block: u64) -> Result<Option<u64>, EngineError> {
    let mut buf = vec![0u8; BS];
    v.read(block * BS as u64, &mut buf)?;
    Ok(version_of(block, &buf))
}

/// What a test wrote: block -> version last flushed.
pub type Model = std::collections::BTreeMap<u64, u64>;

/// Writes blocks `first..first + n` at `version` in one request, FLUSHes, and notes them in
/// `model`.
pub fn write_flush(v: &Volume, model: &mut Model, first: u64, n: u64, version: u64) {
    v.write(first * BS as u64, &stamps(first, n, version)).unwrap();
    v.flush().unwrap();
    for b in first..first + n {
        model.insert(b, version);
    }
}

/// Every block of `model` reads back at its version (`what` names the moment in a failure).
pub fn check_model(v: &Volume, model: &Model, what: &str) {
    for (&b, &version) in model {
        assert_eq!(read_version(v, b).unwrap(), Some(version), "{what}: block {b}");
    }
}

/// Checks that the backing device itself (not the volume) holds each `(block, version)`:
/// after `write_back_all`, every newest version has reached it.
pub fn assert_backing_holds<'a>(backing: &SimDevice, versions: impl IntoIterator<Item = (&'a u64, &'a u64)>) {
    let mut buf = vec![0u8; BS];
    for (&b, &version) in versions {
        backing.read_at(b * BS as u64, &mut buf).unwrap();
        assert_eq!(version_of(b, &buf), Some(version), "backing block {b}");
    }
}

pub fn is_lost(r: &Result<Option<u64>, EngineError>, block: u64) -> bool {
    matches!(r, Err(EngineError::LostBlock { block: b }) if *b == block)
}

/// Reads each block once, one block per request, and checks it holds version 0 (the backing
/// device's initial content): the eviction policy's one-time reads.
pub fn read_once(v: &Volume, blocks: impl Iterator<Item = u64>) {
    let mut buf = vec![0u8; BS];
    for b in blocks {
        v.read(b * BS as u64, &mut buf).unwrap();
        assert_eq!(version_of(b, &buf), Some(0), "block {b}");
    }
}

/// The version of `block` the backing device itself holds (not the volume).
pub fn backing_version(backing: &SimDevice, block: u64) -> Option<u64> {
    let mut buf = vec![0u8; BS];
    backing.read_at(block * BS as u64, &mut buf).unwrap();
    version_of(block, &buf)
}

/// The blocks whose cached copy is dirty, in address order.
pub fn dirty_blocks(v: &Volume) -> Vec<u64> {
    let mut d: Vec<u64> = v.index_snapshot().into_iter().filter(|(_, e)| e.dirty).map(|(b, _)| b).collect();
    d.sort_unstable();
    d
}

/// The read count of `block`'s index entry (the eviction policy's), if it is cached.
pub fn freq(v: &Volume, block: u64) -> Option<u8> {
    v.index_snapshot().into_iter().find(|(b, _)| *b == block).map(|(_, e)| e.freq)
}

/// The slot and dirty flag of `block`'s cached copy.
pub fn slot_of(v: &Volume, block: u64) -> Option<(u32, bool)> {
    v.index_snapshot().into_iter().find(|(b, _)| *b == block).map(|(_, e)| (e.slot, e.dirty))
}

/// Overwrites the cache device's copy of `block` durably with garbage (bad media).
pub fn corrupt_cached_block(cache: &SimDevice, volume: &Volume, block: u64) {
    let (slot, _) = slot_of(volume, block).expect("cached");
    let offset = volume.superblock().layout.log_offset(u64::from(slot));
    cache.write_at(offset, &vec![0xEEu8; BS]).unwrap();
    cache.flush().unwrap();
}

/// Writes `block` stamped with `version`.
pub fn write(v: &Volume, block: u64, version: u64) {
    v.write(block * BS as u64, &stamp(block, version)).unwrap();
}

/// The (reads, writes, flushes) a device issued between two snapshots of its counters.
pub fn delta(after: SimStats, before: SimStats) -> (u64, u64, u64) {
    (after.reads - before.reads, after.writes - before.writes, after.flushes - before.flushes)
}

/// The volume recovered from a power-cut image of the cache device, with the backing
/// device's durable content.
pub fn recover_image(image: Vec<u8>, backing: &SimDevice) -> Volume {
    open(Arc::new(SimDevice::from_image(image, BS as u32)), durable_copy(backing))
}

// ------------------------------------------------------------------------------ the gate

/// What a `Gate` holds (once) until opened.
#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub enum Hold {
    /// The next read of at least this many blocks, before it reaches the medium.
    ReadBefore(usize),
    /// The `n`-th flush from now (0 = the next one), before it reaches the medium.
    Flush(u32),
    /// The next write of at least this many blocks, before it reaches the medium.
    WriteOf(usize),
}

#[derive(Default)]
struct GateState {
    hold: Option<Hold>,
    held: bool,
    open: bool,
    /// Snapshot the durable image at the first write after this many more flushes.
    snap_after_flushes: Option<u32>,
    snapshot: Option<Vec<u8>>,
    /// Names of the threads that issued writes (when recording).
    record_writers: bool,
    writers: Vec<String>,
}

/// A SimDevice wrapper for deterministic races: it can hold one read or flush at a gate
/// until the test opens it, snapshot the durable image at an exact point (a power cut
/// there), record which threads write, and report a kernel identity.
pub struct Gate {
    inner: Arc<SimDevice>,
    identity: Option<String>,
    st: Mutex<GateState>,
    cv: Condvar,
}

impl Gate {
    pub fn new(inner: Arc<SimDevice>) -> Arc<Gate> {
        Arc::new(Gate { inner, identity: None, st: Mutex::new(GateState::default()), cv: Condvar::new() })
    }

    pub fn with_identity(inner: Arc<SimDevice>, id: &str) -> Arc<Gate> {
        Arc::new(Gate {
            inner,
            identity: Some(id.to_string()),
            st: Mutex::new(GateState::default()),
            cv: Condvar::new(),
        })
    }

    /// Holds the next operation `hold` names.
    pub fn arm(&self, hold: Hold) {
        let mut g = self.st.lock().unwrap();
        g.hold = Some(hold);
        g.held = false;
        g.open = false;
    }

    /// Holds the `n`-th flush from now (0 = the next one).
    pub fn hold_flush(&self, n: u32) {
        self.arm(Hold::Flush(n));
    }

    pub fn wait_until_held(&self) {
        let mut g = self.st.lock().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        while !g.held {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            assert!(!left.is_zero(), "the gate was never reached");
            g = self.cv.wait_timeout(g, left).unwrap().0;
        }
    }

    pub fn open_gate(&self) {
        let mut g = self.st.lock().unwrap();
        g.open = true;
        self.cv.notify_all();
    }

    pub fn snapshot_at_first_write_after_flushes(&self, n: u32) {
        let mut g = self.st.lock().unwrap();
        g.snap_after_flushes = Some(n);
        g.snapshot = None;
    }

    pub fn take_snapshot(&self) -> Option<Vec<u8>> {
        self.st.lock().unwrap().snapshot.take()
    }

    pub fn record_writers(&self, on: bool) {
        let mut g = self.st.lock().unwrap();
        g.record_writers = on;
        g.writers.clear();
    }

    pub fn writers(&self) -> Vec<String> {
        self.st.lock().unwrap().writers.clone()
    }

    fn maybe_hold(&self, op: Hold) {
        let mut g = self.st.lock().unwrap();
        let matches = match (g.hold, op) {
            (Some(Hold::ReadBefore(min)), Hold::ReadBefore(n)) => n >= min,
            (Some(Hold::WriteOf(min)), Hold::WriteOf(n)) => n >= min,
            (Some(Hold::Flush(0)), Hold::Flush(_)) => true,
            (Some(Hold::Flush(k)), Hold::Flush(_)) => {
                g.hold = Some(Hold::Flush(k - 1));
                false
            }
            _ => false,
        };
        if !matches {
            return;
        }
        g.hold = None;
        g.held = true;
        self.cv.notify_all();
        while !g.open {
            g = self.cv.wait(g).unwrap();
        }
    }
}

impl BlockDevice for Gate {
    forward_to_inner!(inner: size_bytes, logical_block_size, discard);
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> tiercache_device::Result<()> {
        self.maybe_hold(Hold::ReadBefore(buf.len() / BS));
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> tiercache_device::Result<()> {
        self.maybe_hold(Hold::WriteOf(buf.len() / BS));
        {
            let mut g = self.st.lock().unwrap();
            if g.snap_after_flushes == Some(0) {
                g.snapshot = Some(self.inner.durable_image());
                g.snap_after_flushes = None;
            }
            if g.record_writers {
                let name = std::thread::current().name().unwrap_or("?").to_string();
                g.writers.push(name);
            }
        }
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> tiercache_device::Result<()> {
        self.maybe_hold(Hold::Flush(0));
        let r = self.inner.flush();
        let mut g = self.st.lock().unwrap();
        if let Some(n) = g.snap_after_flushes {
            if n > 0 {
                g.snap_after_flushes = Some(n - 1);
            }
        }
        r
    }
    fn describe(&self) -> String {
        format!("gate:{}", self.inner.describe())
    }
    fn identity(&self) -> Option<String> {
        self.identity.clone()
    }
}

/// Waits (at most 30 s, polling every 2 ms) until `cond` holds; fails the test naming `what`.
pub fn wait_until(what: &str, mut cond: impl FnMut() -> bool) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while !cond() {
        assert!(std::time::Instant::now() < deadline, "never: {what}");
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Runs `f` on the volume in a thread of its own (a client or the destager).
pub fn on_thread<T: Send + 'static>(
    volume: &Arc<Volume>,
    f: impl FnOnce(&Volume) -> T + Send + 'static,
) -> std::thread::JoinHandle<T> {
    let volume = Arc::clone(volume);
    std::thread::spawn(move || f(&volume))
}

// ------------------------------------------------------------------------------------------
// The log and the checkpoint areas, read and forged directly on the cache device (the format
// crate's encoders; docs/format.md section 2).

/// The layout of the volume on `cache` and its magic key (`uuid_low64`).
pub fn layout_of(cache: &SimDevice) -> (Layout, u64) {
    let sb = tiercache_engine::read_superblock(cache).unwrap();
    (sb.layout, uuid_low64(&sb.uuid))
}

/// A record on the cache device: the position of its header, the header, its stored checksum.
#[derive(Debug, Clone)]
pub struct Rec {
    pub pos: u64,
    pub header: RecordHeader,
    pub crc: u32,
}

impl Rec {
    /// The position after its last data block.
    pub fn end(&self) -> u64 {
        self.pos + self.header.total_blocks()
    }
}

/// The record whose header is at log position `pos`, if a header of this volume decodes there.
pub fn record_at(cache: &SimDevice, pos: u64) -> Option<Rec> {
    let (layout, uuid) = layout_of(cache);
    let mut block = vec![0u8; BS];
    cache.read_at(layout.log_offset(pos), &mut block).unwrap();
    let header = RecordHeader::decode(&block, uuid).ok()?;
    Some(Rec { pos, header, crc: RecordHeader::stored_checksum(&block) })
}

/// The records from the newest checkpoint's position onwards, following only positions and
/// sequences (no chain or data checks): what a test builds on, not an oracle for recovery.
pub fn records_after_checkpoint(cache: &SimDevice) -> Vec<Rec> {
    let (_, ck, _) = newest_checkpoint(cache);
    let (mut pos, mut seq) = (ck.log_position, ck.next_record_sequence);
    let mut records = Vec::new();
    while let Some(r) = record_at(cache, pos).filter(|r| r.header.position == pos && r.header.sequence == seq) {
        (pos, seq) = (r.end(), seq + 1);
        records.push(r);
    }
    records
}

/// The header of a record that would follow `prev` soundly: at its end, the next sequence,
/// chained to it, with its head and epoch, vouching for it (`durable_back` 1); no entries.
pub fn next_header(prev: &Rec) -> RecordHeader {
    RecordHeader {
        sequence: prev.header.sequence + 1,
        position: prev.end(),
        head_position: prev.header.head_position,
        prev_checksum: prev.crc,
        epoch: prev.header.epoch,
        durable_back: 1,
        entries: Vec::new(),
    }
}

/// Writes a record whose header goes at log position `at` (normally `header.position`): the
/// encoded header, changed by `patch` (to forge a bad one), then `data` as its data blocks
/// (the log wraps block by block). Not flushed, as a record in the device's volatile cache.
pub fn write_record(
    cache: &SimDevice,
    at: u64,
    header: &RecordHeader,
    data: &[Vec<u8>],
    patch: impl FnOnce(&mut [u8]),
) -> Rec {
    let (layout, uuid) = layout_of(cache);
    let mut block = vec![0u8; BS];
    header.encode(uuid, &mut block);
    patch(&mut block);
    cache.write_at(layout.log_offset(at), &block).unwrap();
    for (i, d) in data.iter().enumerate() {
        cache.write_at(layout.log_offset(at + 1 + i as u64), d).unwrap();
    }
    Rec { pos: at, header: header.clone(), crc: RecordHeader::stored_checksum(&block) }
}

/// Recomputes a record header block's checksum after a patch, as its writer would have.
pub fn reseal_header(block: &mut [u8]) {
    let entries = usize::from(u16::from_le_bytes([block[4], block[5]]));
    let crc = checksum(&block[4..RECORD_HEADER_SIZE + entries * RECORD_ENTRY_SIZE]);
    block[..4].copy_from_slice(&crc.to_le_bytes());
}

/// Each checkpoint area's byte offset and header, if it decodes.
pub fn checkpoint_areas(cache: &SimDevice) -> [(u64, Option<CheckpointHeader>); 2] {
    let (layout, uuid) = layout_of(cache);
    [0, 1].map(|area| {
        let mut block = vec![0u8; BS];
        let start = layout.checkpoint_area_start[area] * BS as u64;
        cache.read_at(start, &mut block).unwrap();
        (start, CheckpointHeader::decode(&block, uuid, layout.checkpoint_capacity()).ok())
    })
}

/// The byte offset and sequence of the checkpoint area whose header decodes with the higher
/// sequence (the second area on a tie).
pub fn checkpoint_area_with_higher_sequence(cache: &SimDevice) -> (u64, u64) {
    let (start, ck, _) = newest_checkpoint(cache);
    (start, ck.sequence)
}

/// The newest checkpoint whose header decodes: its area's byte offset, header and entries
/// (the entries as stored, even if torn).
pub fn newest_checkpoint(cache: &SimDevice) -> (u64, CheckpointHeader, Vec<CheckpointEntry>) {
    let (start, ck) = checkpoint_areas(cache)
        .into_iter()
        .filter_map(|(start, h)| h.map(|h| (start, h)))
        .max_by_key(|(_, h)| h.sequence)
        .expect("a checkpoint header decodes");
    let mut bytes = vec![0u8; (ck.entry_count as usize * CHECKPOINT_ENTRY_SIZE).div_ceil(BS) * BS];
    cache.read_at(start + BS as u64, &mut bytes).unwrap();
    let entries = bytes
        .chunks(CHECKPOINT_ENTRY_SIZE)
        .take(ck.entry_count as usize)
        .map(|e| CheckpointEntry::decode(e).unwrap())
        .collect();
    (start, ck, entries)
}

/// Rewrites the newest checkpoint in place, durably and valid (checksums recomputed), after
/// `change` edited its header and entries.
pub fn rewrite_newest_checkpoint(
    cache: &SimDevice,
    change: impl FnOnce(&mut CheckpointHeader, &mut Vec<CheckpointEntry>),
) {
    let (_, uuid) = layout_of(cache);
    let (start, mut ck, mut entries) = newest_checkpoint(cache);
    change(&mut ck, &mut entries);
    let mut bytes = vec![0u8; (entries.len() * CHECKPOINT_ENTRY_SIZE).div_ceil(BS) * BS];
    for (e, out) in entries.iter().zip(bytes.chunks_mut(CHECKPOINT_ENTRY_SIZE)) {
        e.encode(out);
    }
    ck.entry_count = entries.len() as u64;
    ck.entries_crc = checksum(&bytes[..entries.len() * CHECKPOINT_ENTRY_SIZE]);
    let mut block = vec![0u8; BS];
    ck.encode(uuid, &mut block);
    cache.write_at(start, &block).unwrap();
    if !bytes.is_empty() {
        cache.write_at(start + BS as u64, &bytes).unwrap();
    }
    cache.flush().unwrap();
}

// ------------------------------------------------------------------------------------------
// A cache device with a bad sector.

/// A simulated cache whose reads fail if they touch byte `bad` (a bad sector), and which
/// records the largest scatter list it was given and counts reads and the blocks they cover.
pub struct BadSector {
    pub inner: Arc<SimDevice>,
    /// The bad byte (`u64::MAX`: none).
    pub bad: AtomicU64,
    pub max_bufs: AtomicU64,
    pub reads: AtomicU64,
    pub blocks: AtomicU64,
}

impl BadSector {
    pub fn new(inner: Arc<SimDevice>) -> Arc<BadSector> {
        Arc::new(BadSector {
            inner,
            bad: AtomicU64::new(u64::MAX),
            max_bufs: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            blocks: AtomicU64::new(0),
        })
    }
}

impl BlockDevice for BadSector {
    forward_to_inner!(inner: size_bytes, logical_block_size, write_at, write_fua_at, flush, discard);
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> tiercache_device::Result<()> {
        self.reads.fetch_add(1, AtomicOrdering::SeqCst);
        self.blocks.fetch_add(buf.len() as u64 / BS as u64, AtomicOrdering::SeqCst);
        let bad = self.bad.load(AtomicOrdering::SeqCst);
        if offset <= bad && bad < offset + buf.len() as u64 {
            return Err(DeviceError::Injected { device: "bad-sector".into(), op: "read" });
        }
        self.inner.read_at(offset, buf)
    }
    fn read_vectored_at(&self, offset: u64, bufs: &mut [&mut [u8]]) -> tiercache_device::Result<()> {
        self.max_bufs.fetch_max(bufs.len() as u64, AtomicOrdering::SeqCst);
        let len: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        self.reads.fetch_add(1, AtomicOrdering::SeqCst);
        self.blocks.fetch_add(len / BS as u64, AtomicOrdering::SeqCst);
        let bad = self.bad.load(AtomicOrdering::SeqCst);
        if offset <= bad && bad < offset + len {
            return Err(DeviceError::Injected { device: "bad-sector".into(), op: "read" });
        }
        self.inner.read_vectored_at(offset, bufs)
    }
    fn describe(&self) -> String {
        "bad-sector".into()
    }
}

// ------------------------------------------------------------------------------------------
// Counting a read's device I/Os on a file cache.

/// The read syscalls this thread has made so far.
pub fn syscr() -> u64 {
    let s = std::fs::read_to_string("/proc/thread-self/io").expect("task io accounting");
    s.lines().find_map(|l| l.strip_prefix("syscr: ")).expect("syscr").trim().parse().unwrap()
}

/// Device reads `f` issued on this thread: read syscalls (the sampling's own subtracted) plus
/// reads through its io_uring (which are not syscalls).
pub fn reads_by(f: impl FnOnce()) -> u64 {
    let a = syscr();
    let b = syscr();
    let overhead = b - a;
    let ring = tiercache_device::ring_reads_on_this_thread();
    f();
    let c = syscr();
    c - b - overhead + tiercache_device::ring_reads_on_this_thread() - ring
}

/// Runs `f` on its own thread and waits at most `secs` for it (a deadlock fails the test
/// instead of hanging it).
pub fn bounded<T: Send + 'static>(what: &str, secs: u64, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    rx.recv_timeout(Duration::from_secs(secs))
        .unwrap_or_else(|_| panic!("{what}: no answer within {secs} s (deadlock?)"))
}

/// Writes every other block of `from..from + 2 * n` at `version` (each block a backing write
/// of its own), one block a request, a FLUSH every 32: records of 32 dirty blocks and a
/// header, a dense log. Notes each in `model` (block -> version) once flushed.
pub fn write_scattered_flushed(v: &Volume, model: &mut [u64], from: u64, n: u64, version: u64) {
    let mut since = Vec::new();
    for k in 0..n {
        let b = from + 2 * k;
        v.write(b * BS as u64, &stamp(b, version)).unwrap();
        since.push(b);
        if k % 32 == 31 || k + 1 == n {
            v.flush().unwrap();
            for &b in &since {
                model[b as usize] = version;
            }
            since.clear();
        }
    }
}

/// Every block of `model` reads back at its version (`what` names the moment).
pub fn check_versions(v: &Volume, model: &[u64], what: &str) {
    let mut buf = vec![0u8; BS];
    for (b, &version) in model.iter().enumerate() {
        v.read(b as u64 * BS as u64, &mut buf).unwrap_or_else(|e| panic!("{what}: block {b}: {e}"));
        assert_eq!(version_of(b as u64, &buf), Some(version), "{what}: block {b}");
    }
}
