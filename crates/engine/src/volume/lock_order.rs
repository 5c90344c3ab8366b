//! The lock order the module header states (`rmw -> io -> flush gate -> record -> around -> destage ->
//! around-write -> state`, the superblock's lock a leaf), checked: in debug builds and with the `testing` feature (which the
//! simulators and the engine's tests turn on), each thread keeps the ranks of the locks it
//! holds, per volume, and taking a lock of a volume whose rank is not above all of that
//! volume's locks it holds panics before it can deadlock. (Per volume: one volume may be
//! another's device, and its write-back then takes the lower volume's io lock while holding
//! its own destage lock, which is a different lock.) Release builds without the feature keep
//! only the guard (no bookkeeping).

use std::ops::{Deref, DerefMut};

/// The volume's locks, in the order they are taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Rank {
    Rmw,
    Io,
    /// A FLUSH's cache-device flush under way (`Volume::flush`): taken with the io lock held,
    /// kept after letting it go.
    FlushGate,
    /// A record write in progress (`commit.rs`): its writer holds it from the seal to the
    /// end of the write, and the io lock's holders wait on it to drain the pipeline.
    Record,
    Around,
    Destage,
    /// A write-around under way (`write_around.rs`): its writer holds it across the backing
    /// write; the around and destage locks' holders wait on it.
    AroundWrite,
    State,
    Superblock,
}

/// A lock guard that keeps its rank in the thread's held set until dropped.
pub(super) struct Ranked<G> {
    guard: G,
    #[cfg(any(debug_assertions, feature = "testing"))]
    held: (usize, Rank),
}

#[cfg(any(debug_assertions, feature = "testing"))]
mod held {
    use super::Rank;
    use std::cell::RefCell;

    thread_local! {
        /// (owner, rank) of every lock this thread holds.
        static HELD: RefCell<Vec<(usize, Rank)>> = const { RefCell::new(Vec::new()) };
    }

    pub(super) fn check(owner: usize, rank: Rank) {
        HELD.with(|h| {
            let h = h.borrow();
            let top = h.iter().filter(|&&(o, _)| o == owner).map(|&(_, r)| r).max();
            if let Some(top) = top {
                assert!(
                    top < rank,
                    "lock order: taking the {rank:?} lock while holding the {top:?} lock of the same volume (rmw -> io -> flush gate -> record -> around -> destage -> around-write -> state -> superblock)"
                );
            }
        });
    }

    pub(super) fn push(held: (usize, Rank)) {
        HELD.with(|h| h.borrow_mut().push(held));
    }

    pub(super) fn pop(held: (usize, Rank)) {
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            let at = h.iter().rposition(|&x| x == held).expect("a held lock's rank is recorded");
            h.remove(at);
        });
    }
}

/// Takes a lock of `owner` (the volume's address) through `acquire`, checking that its rank
/// comes after every lock of the same owner this thread holds.
pub(super) fn ranked<G>(owner: usize, rank: Rank, acquire: impl FnOnce() -> G) -> Ranked<G> {
    #[cfg(any(debug_assertions, feature = "testing"))]
    held::check(owner, rank);
    let guard = acquire();
    #[cfg(any(debug_assertions, feature = "testing"))]
    held::push((owner, rank));
    #[cfg(not(any(debug_assertions, feature = "testing")))]
    let _ = (owner, rank);
    Ranked {
        guard,
        #[cfg(any(debug_assertions, feature = "testing"))]
        held: (owner, rank),
    }
}

/// A `try_lock`: cannot deadlock, so the order is not checked, but a lock it takes counts as
/// held for the locks taken after it.
pub(super) fn try_ranked<G>(owner: usize, rank: Rank, acquire: impl FnOnce() -> Option<G>) -> Option<Ranked<G>> {
    let guard = acquire()?;
    #[cfg(any(debug_assertions, feature = "testing"))]
    held::push((owner, rank));
    #[cfg(not(any(debug_assertions, feature = "testing")))]
    let _ = (owner, rank);
    Some(Ranked {
        guard,
        #[cfg(any(debug_assertions, feature = "testing"))]
        held: (owner, rank),
    })
}

impl<G> Drop for Ranked<G> {
    fn drop(&mut self) {
        #[cfg(any(debug_assertions, feature = "testing"))]
        held::pop(self.held);
    }
}

impl<G: Deref> Deref for Ranked<G> {
    type Target = G::Target;
    fn deref(&self) -> &G::Target {
        &self.guard
    }
}

impl<G: DerefMut> DerefMut for Ranked<G> {
    fn deref_mut(&mut self) -> &mut G::Target {
        &mut self.guard
    }
}

#[cfg(all(test, any(debug_assertions, feature = "testing")))]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn locks_in_order_pass_and_out_of_order_panics() {
        let (io, state) = (Mutex::new(()), Mutex::new(()));
        {
            let _io = ranked(1, Rank::Io, || io.lock().unwrap());
            let _st = ranked(1, Rank::State, || state.lock().unwrap());
        }
        let taken = std::thread::spawn(move || {
            let _st = ranked(1, Rank::State, || state.lock().unwrap());
            let _io = ranked(1, Rank::Io, || io.lock().unwrap());
        })
        .join();
        assert!(taken.is_err(), "taking io while holding state must panic");
    }

    #[test]
    fn a_released_lock_no_longer_counts() {
        let (destage, io) = (Mutex::new(()), Mutex::new(()));
        drop(ranked(1, Rank::Destage, || destage.lock().unwrap()));
        let _io = ranked(1, Rank::Io, || io.lock().unwrap());
    }

    #[test]
    fn another_volumes_locks_are_another_order() {
        // A volume whose device is another volume: its write-back holds its destage lock
        // and the lower volume's flush takes that volume's io lock.
        let (destage, io) = (Mutex::new(()), Mutex::new(()));
        let _upper = ranked(1, Rank::Destage, || destage.lock().unwrap());
        let _lower = ranked(2, Rank::Io, || io.lock().unwrap());
    }
}
