//! The rig of the idle reach's tests (`tests/preclean_idle_reach.rs`,
//! `tests/adversarial_idle_reach.rs`): a 1024-block log of 16-block segments on one virtual
//! clock, its backing device behind a `Dev` (any I/O can be held) and a `Knob` (extra latency,
//! and a count of backing writes per block); log positions counted from `base`, where the
//! tail stood once a first lap of dead data had wrapped the log (the head then follows the
//! tail a log behind, less the little room reclaim keeps free: the pre-cleaner works where
//! the writers are short of room, as on a volume in use).

use super::holds::Dev;
use super::*;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tiercache_device::{BlockDevice, SimClock, SimDevice};
use tiercache_engine::{Volume, VolumeOptions};

pub const SEGMENT: u32 = 16;
pub const LOG_BLOCKS: u64 = 1024;
pub const BACKING_BLOCKS: u64 = 4096;
/// Past the shipped `PRECLEAN_IDLE_AGE_MS` (10 s).
pub const OLD_NS: u64 = 11_000_000_000;

/// A device adding `extra_write_ns` to each write and `extra_flush_ns` to each flush on the
/// volume's clock (a backing device that turns slow or fast mid-test), and counting the
/// writes that cover each block.
pub struct Knob {
    pub inner: Arc<dyn BlockDevice>,
    pub clock: SimClock,
    pub extra_write_ns: AtomicU64,
    pub extra_flush_ns: AtomicU64,
    pub writes_of: std::sync::Mutex<std::collections::HashMap<u64, u64>>,
}

impl Knob {
    pub fn new(inner: Arc<dyn BlockDevice>, clock: &SimClock) -> Arc<Knob> {
        Arc::new(Knob {
            inner,
            clock: clock.clone(),
            extra_write_ns: AtomicU64::new(0),
            extra_flush_ns: AtomicU64::new(0),
            writes_of: Default::default(),
        })
    }
    pub fn set(&self, write_ns: u64, flush_ns: u64) {
        self.extra_write_ns.store(write_ns, Ordering::SeqCst);
        self.extra_flush_ns.store(flush_ns, Ordering::SeqCst);
    }
    pub fn writes_of(&self, block: u64) -> u64 {
        self.writes_of.lock().unwrap().get(&block).copied().unwrap_or(0)
    }
}

impl BlockDevice for Knob {
    forward_to_inner!(inner: size_bytes, logical_block_size, read_at, discard, atomic_write_bytes);
    fn write_at(&self, offset: u64, buf: &[u8]) -> tiercache_device::Result<()> {
        self.clock.advance_ns(self.extra_write_ns.load(Ordering::SeqCst));
        {
            let mut w = self.writes_of.lock().unwrap();
            for b in offset / BS as u64..(offset + buf.len() as u64) / BS as u64 {
                *w.entry(b).or_default() += 1;
            }
        }
        self.inner.write_at(offset, buf)
    }
    fn flush(&self) -> tiercache_device::Result<()> {
        self.clock.advance_ns(self.extra_flush_ns.load(Ordering::SeqCst));
        self.inner.flush()
    }
    fn describe(&self) -> String {
        format!("knob:{}", self.inner.describe())
    }
}

pub struct Rig {
    pub clock: SimClock,
    pub cache: Arc<SimDevice>,
    pub backing: Arc<SimDevice>,
    pub held: Arc<Dev>,
    pub knob: Arc<Knob>,
    pub v: Arc<Volume>,
    pub options: VolumeOptions,
    pub model: Vec<u64>,
    pub base: u64,
}

pub fn options(idle_age_ms: Option<u64>, bounds: Option<(usize, usize)>) -> VolumeOptions {
    VolumeOptions { write_back_batch_bounds: bounds, preclean_idle_age_ms: idle_age_ms, ..VolumeOptions::default() }
}

/// The idle reach off: an age no virtual clock here reaches (1e9 ms, 11.6 days).
pub const IDLE_OFF: Option<u64> = Some(1_000_000_000);

impl Rig {
    pub fn new(options: VolumeOptions) -> Rig {
        Self::with_backing_latency(options, FAST)
    }

    pub fn with_backing_latency(options: VolumeOptions, backing_latency: tiercache_device::SimLatency) -> Rig {
        let clock = SimClock::new();
        let (cache, backing) = devices_on_clock(SEGMENT, LOG_BLOCKS, BACKING_BLOCKS, &clock, FAST, backing_latency);
        let backing = if options.write_around.min_bytes > 0 {
            // (A backing device that never tears a block: write-around allowed.)
            let image = backing.durable_image();
            Arc::new(
                SimDevice::from_image(image, BS as u32)
                    .with_name("backing")
                    .with_clock(clock.clone(), backing_latency)
                    .with_atomic_write(BS as u32),
            )
        } else {
            backing
        };
        let held = Dev::new(&backing);
        let knob = Knob::new(held.clone(), &clock);
        let v = Arc::new(Self::open_on(&clock, &cache, &knob, options));
        let mut r =
            Rig { clock, cache, backing, held, knob, v, options, model: vec![0; BACKING_BLOCKS as usize], base: 0 };
        r.churn_until(LOG_BLOCKS + 100);
        r.base = r.v.log_window().2;
        r
    }

    pub fn open_on(clock: &SimClock, cache: &Arc<SimDevice>, knob: &Arc<Knob>, options: VolumeOptions) -> Volume {
        let c: Arc<dyn BlockDevice> = cache.clone();
        let b: Arc<dyn BlockDevice> = knob.clone();
        Volume::open(c, b, Arc::new(clock.clone()), options).expect("open").0
    }

    /// A power cut now (pending writes dropped, applied or torn), and the volume recovered on
    /// the survivors, on the same clock (time goes on).
    pub fn crash_and_reopen(&mut self, seed: u64) {
        self.held.release_all();
        let v = std::mem::replace(&mut self.v, Arc::new(Self::placeholder()));
        drop(v);
        self.cache.crash(seed * 2 + 1);
        self.backing.crash(seed * 2 + 2);
        self.held = Dev::new(&self.backing);
        let knob = Knob::new(self.held.clone(), &self.clock);
        knob.set(self.knob.extra_write_ns.load(Ordering::SeqCst), self.knob.extra_flush_ns.load(Ordering::SeqCst));
        self.knob = knob;
        self.v = Arc::new(Self::open_on(&self.clock, &self.cache, &self.knob, self.options));
    }

    /// A volume to stand in while the real one is dropped (never used).
    pub fn placeholder() -> Volume {
        let (c, b) = devices_seg(16, 16, 64, log_only());
        let c: Arc<dyn BlockDevice> = c;
        let b: Arc<dyn BlockDevice> = b;
        Volume::open(c, b, Arc::new(SimClock::new()), VolumeOptions::default()).unwrap().0
    }

    /// Blocks `first..first + n` at `version`, 16 a request, each followed by a FLUSH: records
    /// of a header and 16 blocks, windows 16/17 dirty.
    pub fn write_dense(&mut self, first: u64, n: u64, version: u64) {
        for b in (first..first + n).step_by(16) {
            self.v.write(b * BS as u64, &stamps(b, 16, version)).unwrap();
            self.v.flush().unwrap();
            self.model[b as usize..b as usize + 16].fill(version);
        }
    }

    /// One churn record (4 one-block writes of blocks 3000..3004, a FLUSH).
    pub fn churn1(&mut self) {
        let version = 100 + self.model[3000];
        for b in 3000..3004 {
            self.v.write(b * BS as u64, &stamp(b, version)).unwrap();
        }
        self.v.flush().unwrap();
        self.model[3000..3004].fill(version);
    }

    /// The churn record until the log's tail reaches `until` past `base`.
    pub fn churn_until(&mut self, until: u64) {
        while self.v.log_window().2 < self.base + until {
            self.churn1();
        }
    }

    /// Churns until the writers are short of room (free log space less than 40 blocks), then
    /// 2 s with no writes: the horizon is its floor (64 blocks) and longer than the free room.
    pub fn settle(&mut self) {
        self.churn1();
        loop {
            let (head, _, tail) = self.v.log_window();
            if head + LOG_BLOCKS - tail < 40 {
                break;
            }
            self.churn1();
        }
        self.clock.advance_ns(2_000_000_000);
    }

    pub fn churn_and_settle(&mut self, until: u64) {
        self.churn_until(until);
        self.settle();
    }

    /// The log positions (past the head) of the dirty blocks of `blocks`, sorted.
    pub fn dirty_of(&self, blocks: std::ops::Range<u64>) -> Vec<u64> {
        let (head, _, _) = self.v.log_window();
        let mut pos: Vec<u64> = self
            .v
            .index_snapshot()
            .into_iter()
            .filter(|(b, e)| e.dirty && blocks.contains(b))
            .map(|(_, e)| (u64::from(e.slot) + LOG_BLOCKS - head % LOG_BLOCKS) % LOG_BLOCKS)
            .collect();
        pos.sort_unstable();
        pos
    }

    /// A clean stretch at the head (written, then written back), then the dense stretch under
    /// test (blocks 1000..1000 + n) from position 357 past `base`.
    /// Rewrites the churn block until the head has passed `pos` (a position past the head
    /// now), with no background round between.
    pub fn churn_past(&mut self, pos: u64) {
        let target = self.v.log_window().0 + pos;
        while self.v.log_window().0 <= target {
            self.churn1();
        }
    }

    pub fn clean_head_then_dense_stretch(&mut self, n: u64) {
        self.write_dense(0, 336, 1);
        self.v.flush_all(|_, _| {}).unwrap();
        self.write_dense(1000, n, 2);
    }

    /// The first scenario of `tests/preclean_idle_reach.rs`: blocks 1000..1096 dense and
    /// 11 s old past the horizon, within half the log, the writers short of room.
    pub fn old_stretch(options: VolumeOptions) -> Rig {
        Self::old_stretch_then(options, |_| {})
    }

    /// `old_stretch`, with `young` written once the stretch is old, before the writers get
    /// short of room.
    pub fn old_stretch_then(options: VolumeOptions, young: impl FnOnce(&mut Rig)) -> Rig {
        let mut r = Rig::new(options);
        r.clean_head_then_dense_stretch(96);
        r.churn_until(700);
        r.clock.advance_ns(OLD_NS);
        young(&mut r);
        r.churn_and_settle(1000);
        r
    }

    pub fn idle_blocks(&self) -> u64 {
        self.v.status().counters.preclean_idle_blocks
    }

    /// The stretch's blocks (cached: read hits, nothing admitted) at their versions.
    pub fn check_stretch(&self, what: &str) {
        for b in 1000..1096u64 {
            assert_eq!(read_version(&self.v, b).unwrap(), Some(self.model[b as usize]), "{what}: block {b}");
        }
    }

    pub fn check_all(&self, what: &str) {
        check_versions(&self.v, &self.model, what);
    }
}
