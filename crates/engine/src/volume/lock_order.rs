//! The lock order the module header states (`rmw -> io -> destage -> state`, the superblock's
//! lock a leaf), checked: in debug builds and with the `testing` feature (which the
//! simulators and the engine's tests turn on), each thread keeps the ranks of the locks it
//! holds, and taking a lock whose rank is not above all of them panics before it can
//! deadlock. Release builds without the feature keep only the guard (no bookkeeping).

use std::ops::{Deref, DerefMut};

/// The volume's locks, in the order they are taken.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(super) enum Rank {
    Rmw,
    Io,
    Destage,
    State,
    Superblock,
}

/// A lock guard that keeps its rank in the thread's held set until dropped.
pub(super) struct Ranked<G> {
    guard: G,
    #[cfg(any(debug_assertions, feature = "testing"))]
    rank: Rank,
}

#[cfg(any(debug_assertions, feature = "testing"))]
mod held {
    use super::Rank;
    use std::cell::RefCell;

    thread_local! {
        static HELD: RefCell<Vec<Rank>> = const { RefCell::new(Vec::new()) };
    }

    pub(super) fn check(rank: Rank) {
        HELD.with(|h| {
            let h = h.borrow();
            if let Some(&top) = h.iter().max() {
                assert!(top < rank, "lock order: taking the {rank:?} lock while holding {h:?} (rmw -> io -> destage -> state -> superblock)");
            }
        });
    }

    pub(super) fn push(rank: Rank) {
        HELD.with(|h| h.borrow_mut().push(rank));
    }

    pub(super) fn pop(rank: Rank) {
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            let at = h.iter().rposition(|&r| r == rank).expect("a held lock's rank is recorded");
            h.remove(at);
        });
    }
}

/// Takes a lock through `acquire`, checking that its rank comes after every lock held.
pub(super) fn ranked<G>(rank: Rank, acquire: impl FnOnce() -> G) -> Ranked<G> {
    #[cfg(any(debug_assertions, feature = "testing"))]
    held::check(rank);
    let guard = acquire();
    #[cfg(any(debug_assertions, feature = "testing"))]
    held::push(rank);
    #[cfg(not(any(debug_assertions, feature = "testing")))]
    let _ = rank;
    Ranked {
        guard,
        #[cfg(any(debug_assertions, feature = "testing"))]
        rank,
    }
}

/// A `try_lock`: cannot deadlock, so the order is not checked, but a lock it takes counts as
/// held for the locks taken after it.
pub(super) fn try_ranked<G>(rank: Rank, acquire: impl FnOnce() -> Option<G>) -> Option<Ranked<G>> {
    let guard = acquire()?;
    #[cfg(any(debug_assertions, feature = "testing"))]
    held::push(rank);
    #[cfg(not(any(debug_assertions, feature = "testing")))]
    let _ = rank;
    Some(Ranked {
        guard,
        #[cfg(any(debug_assertions, feature = "testing"))]
        rank,
    })
}

impl<G> Drop for Ranked<G> {
    fn drop(&mut self) {
        #[cfg(any(debug_assertions, feature = "testing"))]
        held::pop(self.rank);
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
            let _io = ranked(Rank::Io, || io.lock().unwrap());
            let _st = ranked(Rank::State, || state.lock().unwrap());
        }
        let taken = std::thread::spawn(move || {
            let _st = ranked(Rank::State, || state.lock().unwrap());
            let _io = ranked(Rank::Io, || io.lock().unwrap());
        })
        .join();
        assert!(taken.is_err(), "taking io while holding state must panic");
    }

    #[test]
    fn a_released_lock_no_longer_counts() {
        let (destage, io) = (Mutex::new(()), Mutex::new(()));
        drop(ranked(Rank::Destage, || destage.lock().unwrap()));
        let _io = ranked(Rank::Io, || io.lock().unwrap());
    }
}
