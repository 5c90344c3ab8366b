//! The rig of the rewrite-in-order tests (`tests/rewrite_in_order.rs`, its review in
//! `tests/adversarial_sweep.rs`): a 256 MiB cache (the default probation ring and policy, or
//! those given) over a 512 MiB backing device on virtual time, requests of 256 KiB (nbdcopy's),
//! background rounds every 5 ms of virtual time or 8 requests, and the time each write took.

use super::*;
use tiercache_device::{BlockDevice, Clock, SimClock, SimDevice, SimLatency};
use tiercache_engine::{create, CreateOptions, Eviction, Volume, VolumeOptions};

/// The default options with the sequential bypass off (reads admitted however long, as
/// nbdcopy's table runs it) and the eviction policy given.
pub fn bypass_off(eviction: Eviction) -> VolumeOptions {
    VolumeOptions { sequential_bypass_bytes: 0, eviction, ..VolumeOptions::default() }
}

pub const SEG: u32 = 128;
pub const CACHE_BLOCKS: u64 = 65536;
pub const BACKING_BLOCKS: u64 = 131072;
/// A request's blocks (256 KiB, nbdcopy's).
pub const REQUEST: u64 = 64;
pub const LAT: SimLatency = SimLatency { read_ns: 20_000, write_ns: 20_000, flush_ns: 100_000 };
/// The background period's order (5 ms), in virtual time.
pub const TICK_NS: u64 = 5_000_000;

pub struct Rig {
    pub clock: SimClock,
    pub cache: Arc<SimDevice>,
    pub backing: Arc<SimDevice>,
    pub v: Volume,
    pub options: VolumeOptions,
    pub last_tick: u64,
    pub requests: u64,
    pub waits: Waits,
}

/// The virtual time the test's writes took, one request each.
#[derive(Debug, Default, Clone, Copy)]
pub struct Waits {
    pub requests: u64,
    pub total_ns: u64,
    pub max_ns: u64,
    /// Requests that took more than 5 ms (a backing device's I/O, on the writer's path).
    pub slow: u64,
}

impl Rig {
    /// With the create and volume options given (segments of 128 blocks, the cache's size).
    pub fn with(create_options: CreateOptions, options: VolumeOptions) -> Rig {
        Self::sized(CACHE_BLOCKS, create_options, options)
    }

    pub fn sized(cache_blocks: u64, create_options: CreateOptions, options: VolumeOptions) -> Rig {
        Self::sized_on(cache_blocks, LAT, create_options, options)
    }

    /// `sized`, with the backing device's latencies given.
    pub fn sized_on(
        cache_blocks: u64,
        backing_lat: SimLatency,
        create_options: CreateOptions,
        options: VolumeOptions,
    ) -> Rig {
        let clock = SimClock::new();
        let cache = Arc::new(SimDevice::new(cache_blocks * BS as u64, BS as u32).with_clock(clock.clone(), LAT));
        let backing = Arc::new(
            SimDevice::from_image(stamps(0, BACKING_BLOCKS, 0), BS as u32).with_clock(clock.clone(), backing_lat),
        );
        create(&*cache, &*backing, &CreateOptions { segment_blocks: SEG, ..create_options }).unwrap();
        let v = Self::open(&clock, &cache, &backing, options);
        Rig { clock, cache, backing, v, options, last_tick: 0, requests: 0, waits: Waits::default() }
    }

    pub fn new() -> Rig {
        Self::with(CreateOptions::default(), bypass_off(Eviction::Adaptive))
    }

    /// `new`, with the backing device's latencies given.
    pub fn on_backing(backing_lat: SimLatency) -> Rig {
        Self::sized_on(CACHE_BLOCKS, backing_lat, CreateOptions::default(), bypass_off(Eviction::Adaptive))
    }

    pub fn open(clock: &SimClock, cache: &Arc<SimDevice>, backing: &Arc<SimDevice>, options: VolumeOptions) -> Volume {
        let c: Arc<dyn BlockDevice> = cache.clone();
        let b: Arc<dyn BlockDevice> = backing.clone();
        Volume::open(c, b, Arc::new(clock.clone()), options).expect("open").0
    }

    pub fn log_blocks(&self) -> u64 {
        self.v.status().log_bytes / BS as u64
    }

    pub fn tick(&mut self) {
        self.requests += 1;
        if self.clock.now_ns() >= self.last_tick + TICK_NS || self.requests.is_multiple_of(8) {
            self.last_tick = self.clock.now_ns();
            self.v.background_tick().unwrap();
        }
    }

    pub fn idle(&mut self, ms: u64) {
        for _ in 0..ms * 1_000_000 / TICK_NS {
            self.clock.advance_ns(TICK_NS);
            self.tick();
        }
    }

    /// One request of `REQUEST` blocks at `b`, version `version`, and a tick.
    pub fn write1(&mut self, b: u64, version: u64) {
        let t0 = self.clock.now_ns();
        self.v.write(b * BS as u64, &stamps(b, REQUEST, version)).unwrap();
        let ns = self.clock.now_ns() - t0;
        self.waits.requests += 1;
        self.waits.total_ns += ns;
        self.waits.max_ns = self.waits.max_ns.max(ns);
        self.waits.slow += u64::from(ns > 5_000_000);
        self.tick();
    }

    pub fn write(&mut self, requests: impl Iterator<Item = u64>, version: u64) {
        for b in requests {
            self.write1(b, version);
        }
        self.v.flush().unwrap();
    }

    pub fn read1(&mut self, b: u64) {
        let mut buf = vec![0u8; (REQUEST * BS as u64) as usize];
        self.v.read(b * BS as u64, &mut buf).unwrap();
        self.tick();
    }

    /// Three eighths of the cache written (dirty), then the whole backing device read: the
    /// reads fill the rest of the log and go to the probation ring once it is full; the
    /// pre-cleaner writes back the first quarter of the log meanwhile (its horizon). (The
    /// free room the fill leaves, 3,686 blocks, covers a segment, a record and the reclaim
    /// records of the rewrite on these 128-block segments.)
    pub fn dirty_head_then_cache_filling_read(&mut self) -> u64 {
        let half = CACHE_BLOCKS * 3 / 8;
        self.write((0..half).step_by(REQUEST as usize), 1);
        let mut buf = vec![0u8; (REQUEST * BS as u64) as usize];
        for b in (0..BACKING_BLOCKS).step_by(REQUEST as usize) {
            self.v.read(b * BS as u64, &mut buf).unwrap();
            self.tick();
        }
        half
    }
}
