//! A device wrapper that holds any number of chosen I/Os at once (`Dev`), and the volumes on
//! it that the write-around and write-path reviews use: writes of two blocks or more go around
//! whatever the dirty level, on a backing device that never tears a block.

use super::*;
use std::sync::{Condvar, Mutex};
use std::time::Duration;
use tiercache_device::{BlockDevice, MonotonicClock, SimDevice};
use tiercache_engine::{create, CreateOptions, EngineError, Volume, VolumeOptions, WriteAroundPolicy};
use tiercache_format::Layout;

/// A volume of `log_segments` segments whose cache device is a `Dev` (any of its I/Os can be
/// held), with the default options.
pub fn held_volume(log_segments: u64) -> (Arc<Dev>, Arc<SimDevice>, Arc<SimDevice>, Arc<Volume>) {
    let (cache, backing) = devices(log_segments, 4096);
    let dev = Dev::new(&cache);
    let v = Arc::new(open(Arc::clone(&dev) as Arc<dyn BlockDevice>, Arc::clone(&backing) as Arc<dyn BlockDevice>));
    (dev, cache, backing, v)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    Flush,
}

pub type Pred = Box<dyn FnMut(Op, u64, usize) -> bool + Send>;

pub struct Hold {
    pred: Pred,
    /// An I/O matched it (only the first does).
    taken: bool,
    open: bool,
}

/// A SimDevice wrapper holding several I/Os at once: each `hold` catches the first I/O its
/// predicate accepts and keeps it until `release`. Forwards `atomic_write_bytes`, so a
/// volume on it may write around.
pub struct Dev {
    inner: Arc<SimDevice>,
    holds: Mutex<Vec<Hold>>,
    cv: Condvar,
}

pub fn covers(offset: u64, len: usize, block: u64) -> bool {
    let at = block * BS as u64;
    offset <= at && at < offset + len as u64
}

impl Dev {
    pub fn new(inner: &Arc<SimDevice>) -> Arc<Dev> {
        Arc::new(Dev { inner: Arc::clone(inner), holds: Mutex::new(Vec::new()), cv: Condvar::new() })
    }

    pub fn hold(&self, pred: impl FnMut(Op, u64, usize) -> bool + Send + 'static) -> usize {
        let mut g = self.holds.lock().unwrap();
        g.push(Hold { pred: Box::new(pred), taken: false, open: false });
        g.len() - 1
    }

    pub fn hold_write_of(&self, block: u64) -> usize {
        self.hold(move |op, off, len| op == Op::Write && covers(off, len, block))
    }

    /// Starts a FLUSH of `v` on a thread of its own and returns once this device holds its
    /// cache flush: (the hold, the FLUSH's thread).
    pub fn flush_held(&self, v: &Arc<Volume>) -> (usize, std::thread::JoinHandle<Result<(), EngineError>>) {
        let held = self.hold(|op, _, _| op == Op::Flush);
        let flush = on_thread(v, |v| v.flush());
        self.wait_held(held);
        (held, flush)
    }

    /// Waits until hold `id` caught its I/O (panics after 30 s).
    pub fn wait_held(&self, id: usize) {
        let mut g = self.holds.lock().unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !g[id].taken {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            assert!(!left.is_zero(), "held I/O {id} never came");
            g = self.cv.wait_timeout(g, left).unwrap().0;
        }
    }

    pub fn release(&self, id: usize) {
        let mut g = self.holds.lock().unwrap();
        g[id].open = true;
        g[id].taken = true; // (a hold never caught is disarmed)
        self.cv.notify_all();
    }

    pub fn release_all(&self) {
        let mut g = self.holds.lock().unwrap();
        for h in g.iter_mut() {
            h.open = true;
            h.taken = true;
        }
        self.cv.notify_all();
    }

    pub fn gate(&self, op: Op, offset: u64, len: usize) {
        let mut g = self.holds.lock().unwrap();
        let Some(id) = g.iter_mut().position(|h| !h.taken && (h.pred)(op, offset, len)) else { return };
        g[id].taken = true;
        self.cv.notify_all();
        while !g[id].open {
            g = self.cv.wait(g).unwrap();
        }
    }
}

impl BlockDevice for Dev {
    forward_to_inner!(inner: size_bytes, logical_block_size, discard, atomic_write_bytes);
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> tiercache_device::Result<()> {
        self.gate(Op::Read, offset, buf.len());
        self.inner.read_at(offset, buf)
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> tiercache_device::Result<()> {
        self.gate(Op::Write, offset, buf.len());
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> tiercache_device::Result<()> {
        self.gate(Op::Flush, 0, 0);
        self.inner.flush()
    }
    fn describe(&self) -> String {
        format!("dev:{}", self.inner.describe())
    }
}

/// A cache of `log_segments` segments of 8 blocks and a backing device of `blocks` blocks
/// (stamped version 0) that never tears a 4 KiB block (so that write-around is allowed).
pub fn wa_devices(log_segments: u64, blocks: u64) -> (Arc<SimDevice>, Arc<SimDevice>) {
    let log_blocks = log_segments * 8;
    let ck = Layout::checkpoint_blocks_for(log_blocks, BS as u32);
    let cache = Arc::new(SimDevice::new((2 + 2 * ck + log_blocks) * BS as u64, BS as u32).with_name("cache"));
    let backing = Arc::new(atomic_backing(stamps(0, blocks, 0)));
    create(&*cache, &*backing, &CreateOptions { segment_blocks: 8, ..log_only() }).expect("create");
    (cache, backing)
}

pub fn atomic_backing(image: Vec<u8>) -> SimDevice {
    SimDevice::from_image(image, BS as u32).with_name("backing").with_atomic_write(BS as u32)
}

/// Writes of two blocks or more go around, whatever the dirty level.
pub fn wa_options() -> VolumeOptions {
    VolumeOptions {
        write_around: WriteAroundPolicy { min_bytes: 2 * BS as u64, only_when_destage_bound: false },
        ..VolumeOptions::default()
    }
}

pub fn open_wa(cache: Arc<dyn BlockDevice>, backing: Arc<dyn BlockDevice>) -> Volume {
    Volume::open(cache, backing, Arc::new(MonotonicClock::new()), wa_options()).expect("open").0
}

/// A power cut now: the volume recovered from both devices' durable images.
pub fn crash_and_recover(cache: &SimDevice, backing: &SimDevice) -> Volume {
    let c = Arc::new(SimDevice::from_image(cache.durable_image(), BS as u32).with_name("cache"));
    let b = Arc::new(atomic_backing(backing.durable_image()));
    open_wa(c, b)
}

pub fn around(v: &Volume) -> u64 {
    v.status().counters.written_around_blocks
}

/// Writes blocks `first..first + n` stamped with `version` in one request.
pub fn write_n(v: &Volume, first: u64, n: u64, version: u64) -> Result<(), EngineError> {
    v.write(first * BS as u64, &stamps(first, n, version))
}

/// The version a read of `block` returns (panics on an error or a torn or foreign block).
pub fn ver(v: &Volume, block: u64) -> u64 {
    match read_version(v, block) {
        Ok(Some(x)) => x,
        other => panic!("block {block}: read {other:?}"),
    }
}

pub fn vers(v: &Volume, blocks: std::ops::Range<u64>) -> Vec<u64> {
    blocks.map(|b| ver(v, b)).collect()
}

/// Blocks `first..first + n` cached dirty with `version`, durable (flushed).
pub fn dirty_durable(v: &Volume, first: u64, n: u64, version: u64) {
    for b in first..first + n {
        write(v, b, version);
    }
    v.flush().unwrap();
    assert_eq!(slot_of(v, first).map(|s| s.1), Some(true));
}

/// Waits at most `secs` for `h` to finish; whether it did.
pub fn finishes_within<T>(h: &std::thread::JoinHandle<T>, secs: u64) -> bool {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    while !h.is_finished() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(5));
    }
    h.is_finished()
}

/// Joins `h`, failing (not hanging) if it does not finish within `secs` (a deadlock).
pub fn join_within<T>(h: std::thread::JoinHandle<T>, secs: u64, what: &str) -> T {
    assert!(finishes_within(&h, secs), "{what}: not done within {secs} s (deadlock?)");
    h.join().unwrap_or_else(|_| panic!("{what}: panicked"))
}

/// A device that holds the first read covering `block` *after* it read the medium (its
/// data is what the medium held then), until `release`: a reader delayed between its read
/// and its admission.
pub struct LateRead {
    inner: Arc<SimDevice>,
    block: std::sync::atomic::AtomicU64,
    st: std::sync::Mutex<(bool, bool)>, // (held, released)
    cv: std::sync::Condvar,
}

impl LateRead {
    pub fn new(inner: &Arc<SimDevice>) -> Arc<LateRead> {
        Arc::new(LateRead {
            inner: Arc::clone(inner),
            block: std::sync::atomic::AtomicU64::new(u64::MAX),
            st: std::sync::Mutex::new((false, false)),
            cv: std::sync::Condvar::new(),
        })
    }
    pub fn arm(&self, block: u64) {
        self.block.store(block, std::sync::atomic::Ordering::SeqCst);
    }
    pub fn wait_held(&self) {
        let mut g = self.st.lock().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
        while !g.0 {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            assert!(!left.is_zero(), "the late read never came");
            g = self.cv.wait_timeout(g, left).unwrap().0;
        }
    }
    pub fn release(&self) {
        self.st.lock().unwrap().1 = true;
        self.cv.notify_all();
    }
}

impl BlockDevice for LateRead {
    forward_to_inner!(inner: size_bytes, logical_block_size, write_at, flush, discard, atomic_write_bytes);
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> tiercache_device::Result<()> {
        let r = self.inner.read_at(offset, buf);
        let block = self.block.load(std::sync::atomic::Ordering::SeqCst);
        if block != u64::MAX && covers(offset, buf.len(), block) {
            self.block.store(u64::MAX, std::sync::atomic::Ordering::SeqCst);
            let mut g = self.st.lock().unwrap();
            g.0 = true;
            self.cv.notify_all();
            while !g.1 {
                g = self.cv.wait(g).unwrap();
            }
        }
        r
    }
    fn describe(&self) -> String {
        format!("late:{}", self.inner.describe())
    }
}

/// This thread's id, as /proc names it.
pub fn thread_id() -> u64 {
    let link = std::fs::read_link("/proc/thread-self").expect("/proc/thread-self");
    link.file_name().unwrap().to_str().unwrap().parse().unwrap()
}

/// Waits until thread `tid` of this process has been asleep (blocked) for several looks in a
/// row (panics after 30 s): for a test whose thread can block in one place only.
pub fn wait_until_blocked(tid: u64) {
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let mut asleep = 0;
    while asleep < 5 {
        assert!(std::time::Instant::now() < deadline, "thread {tid} never blocked");
        let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).expect("the thread's stat");
        let state = stat.rsplit(')').next().unwrap().split_whitespace().next().unwrap();
        asleep = if state == "S" || state == "D" { asleep + 1 } else { 0 };
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The reclaim-after-a-wait tests' volume: a 256-block log of 16-block segments over a backing
/// device behind a `Dev` (any backing I/O can be held), filled with records of 15 dirty blocks
/// (blocks 0.., version 1), so that every window at the head is dense; no write-back timed
/// yet, so reclaim writes dense windows back. (cache, backing, held, volume, model).
pub fn dense_head_volume() -> (Arc<SimDevice>, Arc<SimDevice>, Arc<Dev>, Arc<Volume>, Model) {
    let (cache, backing) = devices_seg(16, 16, 4096, log_only());
    let held = Dev::new(&backing);
    let c: Arc<dyn BlockDevice> = cache.clone();
    let b: Arc<dyn BlockDevice> = held.clone();
    let v = Arc::new(Volume::open(c, b, Arc::new(MonotonicClock::new()), VolumeOptions::default()).expect("open").0);
    let mut model = Model::new();
    let mut next = 0;
    while v.log_window().2 + 16 < 256 {
        write_flush(&v, &mut model, next, 15, 1);
        next += 15;
    }
    assert_eq!(v.log_window().0, 0);
    (cache, backing, held, v, model)
}

/// A write-back batch of `batch` blocks from the head (`destage_oldest`) held at its backing
/// write of block 0, with the destage lock; `while_held` runs then; a writer then writes one
/// block at a time (blocks 2000.., version 2) until the head moves, its one reclaim meeting the
/// dense head window and waiting for the destage lock; once it is seen blocked, the batch goes
/// on. Returns what the batch wrote and what the writer wrote.
pub fn reclaim_behind_a_held_batch(
    v: &Arc<Volume>,
    held: &Dev,
    batch: usize,
    while_held: impl FnOnce(),
) -> (usize, Model) {
    let hold = held.hold_write_of(0);
    let batch = on_thread(v, move |v| v.destage_oldest(batch));
    held.wait_held(hold);
    while_held();
    let (tid_tx, tid_rx) = std::sync::mpsc::channel();
    let writer = on_thread(v, move |v| {
        tid_tx.send(thread_id()).unwrap();
        let mut m = Model::new();
        let mut b = 2000;
        while v.log_window().0 == 0 {
            write_flush(v, &mut m, b, 1, 2);
            b += 1;
        }
        m
    });
    wait_until_blocked(tid_rx.recv().unwrap());
    held.release(hold);
    let written = batch.join().unwrap().unwrap();
    (written, writer.join().unwrap())
}
