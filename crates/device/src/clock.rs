//! Clocks. The engine is generic over a [`Clock`] so that the simulator can run it on virtual
//! time (deterministic, no sleeping) and production on the monotonic clock.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

/// A monotonic source of time in nanoseconds since an arbitrary origin.
pub trait Clock: Send + Sync {
    fn now_ns(&self) -> u64;
}

/// The process's monotonic clock.
#[derive(Debug, Clone, Copy)]
pub struct MonotonicClock {
    origin: Instant,
}

impl MonotonicClock {
    pub fn new() -> Self {
        MonotonicClock { origin: Instant::now() }
    }
}

impl Default for MonotonicClock {
    fn default() -> Self {
        Self::new()
    }
}

impl Clock for MonotonicClock {
    fn now_ns(&self) -> u64 {
        u64::try_from(self.origin.elapsed().as_nanos()).expect("584 years of uptime")
    }
}

/// Virtual time: advances only when told (by a [`crate::SimDevice`] per operation, or by a
/// test). Clones share the same time.
#[derive(Debug, Clone, Default)]
pub struct SimClock {
    ns: Arc<AtomicU64>,
}

impl SimClock {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn advance_ns(&self, ns: u64) {
        self.ns.fetch_add(ns, Ordering::Relaxed);
    }
}

impl Clock for SimClock {
    fn now_ns(&self) -> u64 {
        self.ns.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sim_clock_is_shared_and_only_moves_when_told() {
        let a = SimClock::new();
        let b = a.clone();
        assert_eq!(a.now_ns(), 0);
        b.advance_ns(1500);
        assert_eq!(a.now_ns(), 1500);
    }

    #[test]
    fn monotonic_clock_moves_forward() {
        let c = MonotonicClock::new();
        let t0 = c.now_ns();
        std::thread::sleep(std::time::Duration::from_millis(1));
        assert!(c.now_ns() >= t0 + 1_000_000);
    }
}
