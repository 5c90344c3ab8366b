//! What freeing the log's head costs, measured: reclaim meets a window whose live dirty blocks
//! are too many for one reclaim record, and either writes them back (a backing write and
//! flush: seconds on an HDD or a RAID5 under load, while the writer that needs the room
//! waits) or copies them forward in a shorter window (a cache read, a record write and a cache
//! flush: tens of microseconds on the fast device, but the copies take log space again). The
//! cheaper of the two depends on the devices, so both are timed as they happen (the volume's
//! clock: virtual time in the simulators, so their choices replay exactly) and compared per
//! block the window frees (docs/format.md 4.5, "dense windows"); a window so dense that it
//! frees almost nothing by itself is judged over the lap of the head instead, by the share of
//! the whole log that is dirty.
//!
//! Invariant: the choice never decides what is correct, only what is cheaper; both paths
//! leave the index and the log as reclaim always has (a shorter window is the same shape as
//! the one the eviction policy's reinsertions already cut).

/// Exponentially weighted costs, in nanoseconds per block, of the two ways to free dirty
/// blocks at the head. `None` until first measured.
#[derive(Default, Debug, Clone, Copy)]
pub(crate) struct ReclaimCosts {
    /// A write-back batch (cache read, backing writes, backing flush, mark-clean) per block
    /// it wrote.
    write_back_ns_per_block: Option<u64>,
    /// A reclaim record with copies (cache read of the copies, the record write, the cache
    /// flush) per block it wrote.
    copy_ns_per_block: Option<u64>,
    /// What sizes a write-back batch at full pace (`write_back_batch_blocks`).
    batch: BatchTiming,
    /// What sizes one at the gentle pace (`gentle_batch_blocks`): the same batch takes longer
    /// when it yields the devices (`Pace::Gentle`), and the destage lock it holds meanwhile is
    /// one a writer's reclaim may come to wait for.
    gentle_batch: BatchTiming,
}

/// A write-back batch's timing at one pace: its fixed cost (its cache and backing flushes and
/// the fingerprint update), and the rest as smoothed totals (ns, blocks), so that a batch
/// weighs by its blocks: one tiny batch (a lone block's write-back) neither passes its flush
/// off as a cost per block nor outweighs a large one.
#[derive(Default, Debug, Clone, Copy)]
struct BatchTiming {
    fixed_ns: Option<u64>,
    io: Option<(u64, u64)>,
}

impl BatchTiming {
    fn note(&mut self, fixed_ns: u64, io_ns: u64, blocks: u64) {
        let smooth = |old: u64, new: u64| old.saturating_mul(3).saturating_add(new) / 4;
        self.fixed_ns = Some(self.fixed_ns.map_or(fixed_ns, |o| smooth(o, fixed_ns)));
        // (Blocks in 1/1024ths, so that smoothing a small count keeps its weight.)
        let scaled = blocks.saturating_mul(1024);
        self.io = Some(match self.io {
            None => (io_ns, scaled),
            Some((ns, b)) => (smooth(ns, io_ns), smooth(b, scaled).max(1)),
        });
    }

    /// `ReclaimCosts::write_back_batch_blocks` at this pace; `None` until a batch was timed.
    fn blocks(&self, (min, max): (usize, usize)) -> Option<usize> {
        use crate::constants::DESTAGE_BATCH_MS;
        let (Some(fixed), Some((io_ns, scaled_blocks))) = (self.fixed_ns, self.io) else {
            return None;
        };
        let budget = (DESTAGE_BATCH_MS * 1_000_000).saturating_sub(fixed).max(fixed);
        // budget / (io_ns / blocks), blocks in 1/1024ths.
        let fit = u128::from(budget) * u128::from(scaled_blocks) / 1024 / u128::from(io_ns.max(1));
        Some((fit.min(max as u128) as usize).max(min))
    }
}

/// A copy-forward must look this many times cheaper than the write-back it replaces: the
/// copies take log space that the write-back would have freed for good, and a timing is
/// noisy (a hiccup must not flip the choice back and forth).
const COPY_MARGIN: u64 = 2;

/// A shortened window judged on its own must free at least this fraction (1/N) of its
/// length beyond its record. A denser one frees too little to tell what copying costs per
/// block freed; it is judged over the lap instead (`copy_through_is_cheaper`).
pub(crate) const DENSE_MIN_FREE_DIVISOR: u64 = 8;

/// Copying a window too dense to pay for itself must look this many times cheaper over the lap
/// than its write-back: such a copy frees almost nothing now and only defers the write-back
/// (the blocks stay dirty, and are copied again next lap unless overwritten first), so it pays
/// where a writer would otherwise wait for a backing device far slower per block than the
/// cache (an HDD: hundreds of times), not where the two are within an order of magnitude (a
/// RAID5 of SSDs, whose batched write-back keeps up with a stream better than copies do:
/// `bench seq`'s writes over dirty data ran at 0.28-0.37 of the empty-cache rate with a
/// margin of 2, 0.43-0.60 writing back).
const LAP_MARGIN: u64 = 16;

/// Copying a window too dense to pay for itself is never chosen while more than this share
/// (per mille) of what the head meets next is unfreeable (dirty, or headers for its copies):
/// a writer would copy `d / (1 - d)` blocks (7 here) for each one freed, and wait for all of
/// them. Above it the window is written back.
pub(crate) const COPY_THROUGH_MAX_DIRTY_PERMILLE: u64 = 875;

/// Who judges a dense window: reclaim, as the head takes it, or the pre-cleaner, ahead of the
/// head, leaving to reclaim what it judges reclaim will copy. The pre-cleaner asks more of a
/// copy (`AHEAD_MARGIN_FACTOR` times the margins, a cap of `AHEAD_MAX_DIRTY_PERMILLE`):
/// between its look and reclaim's, the stretch after the window fills with newer data and
/// the timings move, and a window it left that reclaim then judged a write-back was written
/// back in a writer's path, far slower than in the background (MariaDB write-only over an
/// emulated HDD, 80 % high watermark: the over-the-lap copy needed the write-back to cost
/// 40 times a copy per block freed, measured near that, and the two judgements differed;
/// writers waited 0.2-1 s in 39-49 reclaims of 150 s).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Judge {
    AtTheHead,
    Ahead,
}

/// The pre-cleaner's margins are this many times reclaim's (`Judge::Ahead`).
const AHEAD_MARGIN_FACTOR: u64 = 2;

/// The pre-cleaner's cap on the share of unfreeable blocks a copy over the lap may meet.
const AHEAD_MAX_DIRTY_PERMILLE: u64 = 750;

impl Judge {
    fn margin(self, margin: u64) -> u64 {
        match self {
            Judge::AtTheHead => margin,
            Judge::Ahead => margin * AHEAD_MARGIN_FACTOR,
        }
    }

    fn max_dirty_permille(self) -> u64 {
        match self {
            Judge::AtTheHead => COPY_THROUGH_MAX_DIRTY_PERMILLE,
            Judge::Ahead => AHEAD_MAX_DIRTY_PERMILLE,
        }
    }
}

impl ReclaimCosts {
    fn blend(old: Option<u64>, ns: u64, blocks: u64) -> Option<u64> {
        let sample = ns / blocks.max(1);
        // (Saturating: a clock that jumps must not panic the writer.)
        Some(old.map_or(sample, |o| o.saturating_mul(3).saturating_add(sample) / 4))
    }

    pub(crate) fn note_write_back(&mut self, ns: u64, blocks: u64) {
        if blocks > 0 {
            self.write_back_ns_per_block = Self::blend(self.write_back_ns_per_block, ns, blocks);
        }
    }

    /// A write-back batch of `blocks` blocks, timed in two parts: `fixed_ns` (its flushes and
    /// the fingerprint update, the same whatever its size) and `io_ns` (the rest).
    pub(crate) fn note_write_back_batch(&mut self, fixed_ns: u64, io_ns: u64, blocks: u64) {
        if blocks == 0 {
            return;
        }
        self.note_write_back(fixed_ns.saturating_add(io_ns), blocks);
        self.batch.note(fixed_ns, io_ns, blocks);
    }

    /// A write-back batch at the gentle pace, timed as `note_write_back_batch`'s: it sizes
    /// gentle batches only (it took longer than reclaim's own write-back would, so it says
    /// nothing of what writing back costs a writer).
    pub(crate) fn note_gentle_batch(&mut self, fixed_ns: u64, io_ns: u64, blocks: u64) {
        if blocks > 0 {
            self.gentle_batch.note(fixed_ns, io_ns, blocks);
        }
    }

    pub(crate) fn note_copy(&mut self, ns: u64, blocks: u64) {
        if blocks > 0 {
            self.copy_ns_per_block = Self::blend(self.copy_ns_per_block, ns, blocks);
        }
    }

    /// Whether copying `copies` blocks forward to free `freed` is cheaper than writing back
    /// `dirty` blocks to free `window`. Until a write-back has been timed, no (the write-back
    /// times itself); once it has, a copy-forward is tried if it has never been timed.
    pub(crate) fn copy_is_cheaper(&self, judge: Judge, copies: u64, freed: u64, dirty: u64, window: u64) -> bool {
        assert!(freed > 0 && window > 0, "a window that frees nothing: {freed} of {window}");
        match (self.write_back_ns_per_block, self.copy_ns_per_block) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(wb), Some(cp)) => {
                // Per block freed: (1 + copies) written by the record, against `dirty`
                // written back for the whole window.
                let copy = u128::from(cp)
                    * u128::from(1 + copies)
                    * u128::from(window)
                    * u128::from(judge.margin(COPY_MARGIN));
                let write_back = u128::from(wb) * u128::from(dirty) * u128::from(freed);
                copy < write_back
            }
        }
    }

    /// Whether copying a window too dense to free much on its own (`dirty` of its `window`
    /// blocks) is cheaper than writing it back, judged over a lap of the head: with
    /// `unfreeable` of the `stretch` blocks the head meets next unfreeable (dirty, or headers
    /// their copies need), the head passing a block copies it with chance
    /// `d = unfreeable / stretch` and frees it otherwise, so copying frees a block for
    /// `d / (1 - d)` copies on average, where writing this window back costs `dirty / window`
    /// write-backs per block freed; with a margin of `LAP_MARGIN`. Never while `d` is above
    /// `COPY_THROUGH_MAX_DIRTY_PERMILLE` (margin and cap stricter for the pre-cleaner: `Judge`).
    /// Like `copy_is_cheaper`: no until a write-back was timed, then an untimed copy is tried
    /// once.
    pub(crate) fn copy_through_is_cheaper(
        &self,
        judge: Judge,
        dirty: u64,
        window: u64,
        unfreeable: u64,
        stretch: u64,
    ) -> bool {
        assert!(window > 0 && stretch > 0, "an empty window or stretch: {window} of {stretch}");
        if unfreeable * 1000 > stretch * judge.max_dirty_permille() {
            return false;
        }
        match (self.write_back_ns_per_block, self.copy_ns_per_block) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(wb), Some(cp)) => {
                // cp * d / (1 - d) * margin < wb * dirty / window, multiplied out.
                let copy =
                    u128::from(cp) * u128::from(unfreeable) * u128::from(window) * u128::from(judge.margin(LAP_MARGIN));
                let write_back = u128::from(wb) * u128::from(dirty) * u128::from(stretch - unfreeable);
                copy < write_back
            }
        }
    }

    /// How many blocks a write-back batch takes: as many as its I/O takes `DESTAGE_BATCH_MS`
    /// less the batch's fixed cost (its flushes), at the measured cost per block; where the
    /// flushes alone take more than that, as many as take as long as the flushes (so they are
    /// at most half of a batch's time: a writer waits for a flush anyway). Within `min..=max`
    /// (`DESTAGE_BATCH_MIN_BLOCKS..=DESTAGE_BATCH_BLOCKS`); `DESTAGE_BATCH_UNTIMED_BLOCKS` until
    /// a batch was timed.
    pub(crate) fn write_back_batch_blocks(&self, bounds: (usize, usize)) -> usize {
        use crate::constants::DESTAGE_BATCH_UNTIMED_BLOCKS;
        self.batch.blocks(bounds).unwrap_or(DESTAGE_BATCH_UNTIMED_BLOCKS.clamp(bounds.0, bounds.1))
    }

    /// How many blocks a gentle batch takes: sized the same way by the gentle batches' own
    /// timing; until one was timed, an eighth of a batch at full pace (whose writes, up to 32
    /// in flight, go 4 at a time: up to 8 times as long. Sized as a full one, the first gentle
    /// batch held the destage lock 7.6 times as long, and writers overtook the pre-cleaner:
    /// the review's `the_gentle_pace_over_two_lanes_of_virtual_time`).
    pub(crate) fn gentle_batch_blocks(&self, bounds: (usize, usize)) -> usize {
        self.gentle_batch.blocks(bounds).unwrap_or_else(|| (self.write_back_batch_blocks(bounds) / 8).max(bounds.0))
    }

    /// (write-back, copy) in ns per block, for `status`.
    pub(crate) fn get(&self) -> (Option<u64>, Option<u64>) {
        (self.write_back_ns_per_block, self.copy_ns_per_block)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Costs with one write-back and one copy timed: `write_back_ns` and `copy_ns` a block.
    fn timed(write_back_ns: u64, copy_ns: u64) -> ReclaimCosts {
        let mut c = ReclaimCosts::default();
        c.note_write_back(write_back_ns, 1);
        c.note_copy(copy_ns, 1);
        c
    }

    #[test]
    fn nothing_is_copied_until_a_write_back_was_timed() {
        let mut c = ReclaimCosts::default();
        assert!(!c.copy_is_cheaper(Judge::AtTheHead, 100, 50, 150, 256));
        c.note_copy(1_000, 10);
        assert!(!c.copy_is_cheaper(Judge::AtTheHead, 100, 50, 150, 256));
        let mut c = ReclaimCosts::default();
        c.note_write_back(1_000_000, 100);
        assert!(c.copy_is_cheaper(Judge::AtTheHead, 100, 50, 150, 256), "an untimed copy is tried once");
    }

    #[test]
    fn the_cheaper_way_wins_with_a_margin() {
        // A slow backing device: 5 ms a block written back, 20 us a block copied.
        let c = timed(5_000_000, 20_000);
        assert!(c.copy_is_cheaper(Judge::AtTheHead, 128, 40, 150, 170));
        // Comparable devices: copying 128 blocks to free 40 is not worth it.
        let c = timed(20_000, 20_000);
        assert!(!c.copy_is_cheaper(Judge::AtTheHead, 128, 40, 150, 170));
        // Equal costs per block: 11 blocks written to free 100 (0.11 a freed block) against
        // 10 written back to free 120 (0.083): write back. Against 30 written back (0.25):
        // copying costs 0.44 of it, inside the margin of 2: copy. Against 20 (0.167): 0.66,
        // not cheap enough.
        let c = timed(10_000, 10_000);
        assert!(!c.copy_is_cheaper(Judge::AtTheHead, 10, 100, 10, 120));
        assert!(c.copy_is_cheaper(Judge::AtTheHead, 10, 100, 30, 120));
        assert!(!c.copy_is_cheaper(Judge::AtTheHead, 10, 100, 20, 120));
    }

    #[test]
    fn a_window_too_dense_to_judge_alone_is_judged_over_the_lap() {
        let mut c = ReclaimCosts::default();
        assert!(!c.copy_through_is_cheaper(Judge::AtTheHead, 128, 130, 100, 1000), "no write-back timed yet");
        c.note_write_back(5_000_000, 1);
        assert!(c.copy_through_is_cheaper(Judge::AtTheHead, 128, 130, 100, 1000), "an untimed copy is tried once");
        // An HDD against a fast cache (5 ms against 20 us a block): copied at any share the
        // cap allows, not above it.
        c.note_copy(20_000, 1);
        assert!(c.copy_through_is_cheaper(Judge::AtTheHead, 128, 130, 700, 1000));
        assert!(c.copy_through_is_cheaper(Judge::AtTheHead, 128, 130, 875, 1000));
        assert!(!c.copy_through_is_cheaper(Judge::AtTheHead, 128, 130, 876, 1000), "above the cap: written back");
        // A write-back 10x the copy's cost: with 30 % of the log dirty a freed block costs
        // 0.43 copies, 6.9 with the margin of 16, against 9.8 for writing this window back:
        // copied. With half the log dirty, 16 against 9.8: written back. At equal costs,
        // never.
        let c = timed(100_000, 10_000);
        assert!(c.copy_through_is_cheaper(Judge::AtTheHead, 128, 130, 300, 1000));
        assert!(!c.copy_through_is_cheaper(Judge::AtTheHead, 128, 130, 500, 1000));
        let c = timed(10_000, 10_000);
        assert!(!c.copy_through_is_cheaper(Judge::AtTheHead, 128, 130, 100, 1000));
    }

    #[test]
    fn the_pre_cleaner_leaves_to_reclaim_only_what_reclaim_copies_with_room_to_spare() {
        // A write-back 40 times the copy's cost per block (an emulated HDD behind an nvme
        // cache measured near that): with 55 % of what the head meets next unfreeable, a freed
        // block costs 1.22 copies, 19.6 with reclaim's margin of 16, against 33 for writing
        // back a window 82 % dirty: reclaim copies. The pre-cleaner, with twice the margin
        // (39), writes it back ahead of the head instead of leaving it to a copy that the
        // next look may turn into a write-back in a writer's path.
        let c = timed(800_000, 20_000);
        assert!(c.copy_through_is_cheaper(Judge::AtTheHead, 210, 256, 550, 1000));
        assert!(!c.copy_through_is_cheaper(Judge::Ahead, 210, 256, 550, 1000));
        // Far cheaper copies (250 times): both leave it to be copied, up to the pre-cleaner's
        // lower cap.
        let c = timed(5_000_000, 20_000);
        assert!(c.copy_through_is_cheaper(Judge::Ahead, 210, 256, 550, 1000));
        assert!(c.copy_through_is_cheaper(Judge::Ahead, 210, 256, 750, 1000));
        assert!(!c.copy_through_is_cheaper(Judge::Ahead, 210, 256, 751, 1000));
        assert!(c.copy_through_is_cheaper(Judge::AtTheHead, 210, 256, 751, 1000));
        // A window short enough to judge alone: the margin doubles from 2 to 4. Copying 128
        // blocks to free 40 of a 170-block window holding 150 dirty, with a write-back 10
        // times the copy's cost per block: 0.37 of the write-back's cost per block freed.
        let c = timed(200_000, 20_000);
        assert!(c.copy_is_cheaper(Judge::AtTheHead, 128, 40, 150, 170));
        assert!(!c.copy_is_cheaper(Judge::Ahead, 128, 40, 150, 170));
    }

    #[test]
    fn write_back_batches_are_sized_by_their_measured_cost() {
        use crate::constants::{DESTAGE_BATCH_BLOCKS, DESTAGE_BATCH_MIN_BLOCKS, DESTAGE_BATCH_UNTIMED_BLOCKS};
        const BOUNDS: (usize, usize) = (DESTAGE_BATCH_MIN_BLOCKS, DESTAGE_BATCH_BLOCKS);
        let mut c = ReclaimCosts::default();
        assert_eq!(c.write_back_batch_blocks(BOUNDS), DESTAGE_BATCH_UNTIMED_BLOCKS);
        // 24 us a block besides a 1 ms flush (an HDD writing sequentially, about 160 MB/s):
        // 1,000 blocks take the 24 ms left of 25.
        c.note_write_back_batch(1_000_000, 24_000 * 4096, 4096);
        assert_eq!(c.write_back_batch_blocks(BOUNDS), 1000);
        // A fast device: capped.
        let mut fast = ReclaimCosts::default();
        fast.note_write_back_batch(1_000_000, 1_000 * 4096, 4096);
        assert_eq!(fast.write_back_batch_blocks(BOUNDS), DESTAGE_BATCH_BLOCKS);
        // Random blocks on an HDD (5 ms each): the floor, not one block.
        let mut slow = ReclaimCosts::default();
        slow.note_write_back_batch(1_000_000, 5_000_000 * 256, 256);
        assert_eq!(slow.write_back_batch_blocks(BOUNDS), DESTAGE_BATCH_MIN_BLOCKS);
        // A flush slower than the target (40 ms) with 20 us a block: as much I/O as the flush
        // takes (2,000 blocks), not the floor that a cost per block including it would give.
        let mut flushy = ReclaimCosts::default();
        flushy.note_write_back_batch(40_000_000, 20_000 * 1000, 1000);
        assert_eq!(flushy.write_back_batch_blocks(BOUNDS), 2000);
        // One tiny batch after large ones: its flush is not a cost per block, and its one block
        // weighs as one.
        let mut tiny = ReclaimCosts::default();
        tiny.note_write_back_batch(1_000_000, 2_000 * 4096, 4096);
        tiny.note_write_back_batch(1_000_000, 20_000, 1);
        assert_eq!(tiny.write_back_batch_blocks(BOUNDS), DESTAGE_BATCH_BLOCKS);
        // A clock that does not move (zero cost) is no division by zero.
        let mut zero = ReclaimCosts::default();
        zero.note_write_back_batch(0, 0, 10);
        assert_eq!(zero.write_back_batch_blocks(BOUNDS), DESTAGE_BATCH_BLOCKS);
        // Other bounds (the simulators' scaled-down ones): the same rule within them.
        assert_eq!(ReclaimCosts::default().write_back_batch_blocks((4, 16)), 16);
        assert_eq!(c.write_back_batch_blocks((4, 16)), 16);
        assert_eq!(slow.write_back_batch_blocks((4, 16)), 4);
    }

    #[test]
    fn gentle_batches_are_sized_by_their_own_timing_and_never_time_reclaim() {
        const BOUNDS: (usize, usize) = (64, 4096);
        let mut c = ReclaimCosts::default();
        // Nothing timed: an eighth of the untimed full batch (1,024).
        assert_eq!(c.gentle_batch_blocks(BOUNDS), 128);
        // A full batch timed at 24 us a block (1,000 blocks): a gentle one an eighth of it.
        c.note_write_back_batch(1_000_000, 24_000 * 4096, 4096);
        assert_eq!(c.gentle_batch_blocks(BOUNDS), 125);
        let reclaim_cost = c.get().0;
        // A gentle batch at 96 us a block (4 writes in flight instead of 32): 250 blocks take
        // the 24 ms left; the full batch and reclaim's cost per block stay as they were.
        c.note_gentle_batch(1_000_000, 96_000 * 512, 512);
        assert_eq!(c.gentle_batch_blocks(BOUNDS), 250);
        assert_eq!(c.write_back_batch_blocks(BOUNDS), 1000);
        assert_eq!(c.get().0, reclaim_cost);
        // Never below the floor.
        let mut slow = ReclaimCosts::default();
        slow.note_gentle_batch(1_000_000, 5_000_000 * 64, 64);
        assert_eq!(slow.gentle_batch_blocks(BOUNDS), 64);
        assert_eq!(slow.get().0, None, "a gentle batch timed reclaim's write-back");
    }

    #[test]
    fn costs_are_smoothed() {
        let mut c = ReclaimCosts::default();
        c.note_write_back(4_000, 1);
        c.note_write_back(8_000, 1);
        assert_eq!(c.get().0, Some(5_000));
        c.note_write_back(0, 0);
        assert_eq!(c.get().0, Some(5_000), "an empty batch is no sample");
        c.note_write_back(u64::MAX, 1);
        c.note_write_back(u64::MAX, 1);
        assert!(c.get().0.unwrap() > 1 << 61, "a clock that jumps saturates instead of overflowing");
    }
}
