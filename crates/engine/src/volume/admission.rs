//! Where a read miss goes under the `adaptive` policy (the default): the log or the
//! probation ring. S3-FIFO's rule (`probation.rs`: a ghost's miss enters the log, any other
//! the ring) with two changes, each measured on the shared traces with the model
//! (`bench/policy-model.py`) and then with `tiercache replay`:
//!
//! 1. **The log fills first.** Until the log first wraps after open, every admitted miss
//!    enters the log: an empty log costs nothing to fill, and a miss held back in the ring
//!    while the log stands empty is a hit lost (libCacheSim's S3-FIFO does the same once its
//!    small queue is full). At 25 % of a trace's footprint, where filling takes a large share
//!    of the trace, this alone took the model from 10 % above the best published policy to
//!    2-5 %.
//!    The fill stops while a 16th of the log is free (`fill_leaves_free`): it never wraps the
//!    log onto dirty data, which a rewrite in order then supersedes (writeback.rs).
//! 2. **A frequency gate on ghosts, when it pays.** A ghost's miss enters the log only if the
//!    sketch (`frequency.rs`) counts it read more often lately than the first block from the
//!    log's head that reclaim would evict (TinyLFU's admission test); refused, it enters the
//!    ring like any miss. The gate applies only while the duel (`duel.rs`) finds it missing
//!    less than admitting: on a loop over more than the cache it keeps part of the loop, on
//!    a drifting working set it would keep blocks out that are about to be read again.
//!
//! Nothing here is persistent or touches data: it decides between two admissions that are
//! each already safe (`probation.rs`, `read.rs`), under the state lock.

use super::*;
use crate::duel::{Duel, VICTIM_SCAN_SLOTS};
use crate::frequency::Sketch;

/// How far from the head the gate looks for a clean block to compare with when none within
/// `VICTIM_SCAN_SLOTS` is unread (a head of blocks all read again, or dirty).
const VICTIM_FALLBACK_SLOTS: u64 = 64;

pub(super) struct Admission {
    /// The policy's state; `None` unless the policy is `adaptive` and the cache has a ring.
    adaptive: Option<Adaptive>,
}

struct Adaptive {
    sketch: Sketch,
    duel: Duel,
    /// Reclaim has run since open: the log is full.
    wrapped: bool,
}

/// Where an admitted miss goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Route {
    Log,
    /// The log, because it is still filling.
    LogFilling,
    Ring,
    /// The ring, because the frequency gate refused a ghost.
    RingRefused,
}

impl Admission {
    pub fn new(adaptive: bool, log_blocks: u64, ring_blocks: u64) -> Admission {
        Admission {
            adaptive: adaptive.then(|| Adaptive {
                sketch: Sketch::new(log_blocks + ring_blocks),
                duel: Duel::new(log_blocks, ring_blocks),
                wrapped: false,
            }),
        }
    }

    /// Reads of `blocks`: `counts` unless a long scan re-reads them, `admit` if their misses
    /// may be admitted.
    pub fn note_reads(&mut self, blocks: std::ops::Range<u64>, counts: bool, admit: bool) {
        if let Some(a) = &mut self.adaptive {
            for block in blocks {
                if counts {
                    a.sketch.increment(block);
                }
                a.duel.read(block, counts, admit);
            }
        }
    }

    pub fn note_write(&mut self, block: u64) {
        if let Some(a) = &mut self.adaptive {
            a.duel.write(block);
        }
    }

    /// Reclaim ran: the log has wrapped.
    pub fn note_reclaim(&mut self) {
        if let Some(a) = &mut self.adaptive {
            a.wrapped = true;
        }
    }

    /// Whether the frequency gate applies now (`None` without the adaptive policy): the
    /// duel's choice, the one `route` consults (a ghost's miss while the log fills enters it
    /// regardless).
    pub fn gate(&self) -> Option<bool> {
        self.adaptive.as_ref().map(|a| a.duel.gate())
    }

    /// Times the duel changed its choice.
    pub fn switches(&self) -> u64 {
        self.adaptive.as_ref().map_or(0, |a| a.duel.switches())
    }

    pub fn memory_bytes(&self) -> usize {
        self.adaptive.as_ref().map_or(0, |a| a.sketch.memory_bytes() + a.duel.memory_bytes())
    }
}

impl Volume {
    /// Where a miss of `block` that may be admitted goes (the cache has a ring). A `scan`'s
    /// miss (a sequential stream past `SEQUENTIAL_REREAD_BYTES`, admitted because the
    /// sequential bypass is off or higher) is no ghost: a scan that reads the volume again
    /// meets the blocks the ring let go on its first pass, and promoting them made the second
    /// pass of a 2 GiB read through a 1 GiB cache wrap the log onto the dirty data written
    /// before it (nbdcopy's table, bench/nbdcopy-table.py), as its hits mark nothing hot.
    pub(super) fn route(&self, st: &State, block: u64, scan: bool) -> Route {
        let ghost = !scan && st.ghosts.contains(block);
        let Some(a) = &st.admission.adaptive else {
            return if ghost { Route::Log } else { Route::Ring };
        };
        // (Only while the staged record and one more fit without a reclaim: the misses that
        // would make the log wrap go to the ring, as in the model. Else a scan right after
        // open filled the log's last records, and its first reclaim met the hot set that
        // went in first, before its blocks had read counts: `adversarial_adaptive.rs`. On a
        // large log, a 16th of it is left free besides: `FILL_LEAVES_FREE_DIVISOR`.)
        if !a.wrapped && st.tail + self.fill_leaves_free() <= st.head + self.layout.log_blocks {
            return Route::LogFilling;
        }
        if !ghost {
            return Route::Ring;
        }
        if a.duel.gate() && a.sketch.estimate(block) <= self.victim_frequency(st, &a.sketch) {
            return Route::RingRefused;
        }
        Route::Log
    }

    /// The free room at the tail that read misses filling the log leave: a 16th of the log
    /// (`FILL_LEAVES_FREE_DIVISOR`), or the staged record, one more and reclaim's reserve
    /// where that is more.
    pub(super) fn fill_leaves_free(&self) -> u64 {
        let record = 1 + self.staging_limit as u64;
        (2 * record + self.reclaim_reserve()).max(self.layout.log_blocks / FILL_LEAVES_FREE_DIVISOR)
    }

    /// The sketch's count of the first block from the log's head that reclaim would evict
    /// (clean, not read since cached or last kept), looking up to `VICTIM_SCAN_SLOTS` slots
    /// ahead; if none is that near, of the first clean block (a head of blocks all read
    /// again: the one reclaim would evict after it passes them once more); 0 if no clean
    /// block is there.
    ///
    /// Why that far. Reclaim copies forward every block read since its last pass (when no
    /// writer waits), so the next victim is the first unread block however far it lies, as
    /// CLOCK's hand finds it; comparing with the head's block instead (64 slots ahead, as
    /// before) compared a ghost with a block that survives, and refused it. On the shared
    /// traces 1,024 slots took the replay from 1.25 % above the best published policy on
    /// average to 0.97 %, 8.4 % to 5.5 % at 10 % of arc_P6 (a model of the policy: 0.3735
    /// with 64, 0.3589 with 256, 0.3583 with 1,024, 0.3607 unbounded).
    ///
    /// The search resumes where the last one stopped (`State::victim_cursor`): the blocks it
    /// passed stay unfit until reclaim passes them (a read only raises a count; a write-back
    /// that cleans one moves the cursor back to it: `mark_written_clean`), so the cost per
    /// miss stays a few slots. The fallback looks 64 slots deep only: a head of dirty
    /// blocks would otherwise cost a thousand lookups per miss.
    fn victim_frequency(&self, st: &State, sketch: &Sketch) -> u8 {
        let end = st.tail.min(st.head + VICTIM_SCAN_SLOTS as u64);
        let from = st.victim_cursor.get().clamp(st.head, end);
        let victim = (from..end).find_map(|pos| {
            let (block, e) = st.index.owner(self.layout.slot(pos))?;
            (!e.dirty && e.freq == 0).then_some((pos, block))
        });
        st.victim_cursor.set(victim.map_or(end, |(pos, _)| pos));
        let block = victim.map(|(_, block)| block).or_else(|| {
            (st.head..st.tail.min(st.head + VICTIM_FALLBACK_SLOTS))
                .find_map(|pos| st.index.owner(self.layout.slot(pos)).filter(|(_, e)| !e.dirty).map(|(b, _)| b))
        });
        block.map_or(0, |block| sketch.estimate(block))
    }
}
