//! The pre-cleaner below the high watermark looks beyond its horizon when nothing within it
//! needs writing back (`Reach::Idle`): over data written at least `PRECLEAN_IDLE_AGE_MS` ago
//! (10 s; not rewritten since), at most `PRECLEAN_IDLE_REACH_PERMILLE` of the log (half) past
//! the head. The backing device works while it would stand idle, and the dense windows the
//! head reaches next are clean by then instead of written back in a writer's reclaim. Virtual
//! time (the devices' latencies on one clock, advanced by hand to age the data), no background
//! thread: each `background_tick` is one round.
//! - `old_dense_data_past_the_horizon_is_written_back_when_the_horizon_holds_nothing`: a dense
//!   stretch past the horizon and within half the log, 11 s old, is written back by one round
//!   (but the windows the judge leaves to reclaim's copy-forward), and the writers' reclaims
//!   then write back less of it than without the round; dirty blocks past half the log stay
//!   dirty. Fails on the pre-cleaner before (the round wrote back nothing).
//! - `young_dense_data_past_the_horizon_stays_dirty`: the same stretch written less than 10 s
//!   before the round stays dirty, while an older one before it is written back. (A workload
//!   still rewriting a stretch thins it out before the head comes: the first version of the
//!   idle reach, with no age, wrote back windows that reclaim then copied for less, and broke
//!   three tests that pin that.)
//! - `within_its_horizon_the_pre_cleaner_goes_no_further`: where the horizon holds a dense
//!   stretch, a round's batches take it first and nothing beyond, however old.
//! - `the_idle_reach_keeps_every_flushed_block_through_power_cuts`: the cache or the backing
//!   device gone after each of the round's operations in turn, then a power cut: every block
//!   recovers to its flushed version.
//!
//! The rig (`tests/common/idle_rig.rs`) is shared with the review's attacks
//! (`tests/adversarial_idle_reach.rs`).

mod common;
use common::idle_rig::*;

/// The first scenario: blocks 1000..1096 dense and 11 s old past the horizon, within half
/// the log; blocks 2000..2064 dense and old past half the log.
fn old_stretch_past_the_horizon(bounds: Option<(usize, usize)>) -> Rig {
    let mut r = Rig::new(options(None, bounds));
    r.clean_head_then_dense_stretch(96);
    r.churn_until(700);
    r.write_dense(2000, 64, 3);
    r.clock.advance_ns(OLD_NS);
    r.churn_and_settle(1000);
    r
}

#[test]
fn old_dense_data_past_the_horizon_is_written_back_when_the_horizon_holds_nothing() {
    let mut r = old_stretch_past_the_horizon(None);
    let near = r.dirty_of(1000..1096);
    let far = r.dirty_of(2000..2064);
    assert!(
        near.len() == 96 && near[0] > 256 && near[95] < 512,
        "the stretch lies past the horizon, within half the log: {near:?}"
    );
    assert!(far.len() == 64 && far[0] >= 512, "the other lies past half the log: {far:?}");
    let writes = r.backing.stats().writes;
    r.v.background_tick().unwrap();
    assert!(r.backing.stats().writes > writes, "the round wrote nothing back");
    // (What is left: windows the pre-cleaner judged reclaim would copy forward for less,
    // with the costs measured so far; about one in three here.)
    let left = r.dirty_of(1000..1096);
    assert!(left.len() <= 64, "{} of 96 dirty after a round: {left:?}", left.len());
    assert_eq!(r.dirty_of(2000..2064), far, "the stretch past half the log stays dirty");
    assert!(r.v.status().counters.preclean_idle_blocks >= 32, "{:?}", r.v.status().counters);
    // The writers' reclaims pass the stretch (no background round meanwhile: as when the
    // pre-cleaner falls behind) and write back less of it than without the round before.
    let passed = |r: &mut Rig| {
        let destaged = r.v.status().counters.destaged_blocks;
        r.churn_past(near[95]);
        r.check_all("after the head passed");
        r.v.status().counters.destaged_blocks - destaged
    };
    let with_round = passed(&mut r);
    let without = passed(&mut old_stretch_past_the_horizon(None));
    assert!(
        without >= 64 && with_round + 32 <= without,
        "reclaim wrote back {with_round} blocks after the round, {without} without it"
    );
}

#[test]
fn young_dense_data_past_the_horizon_stays_dirty() {
    let mut r = Rig::new(options(None, None));
    // An old dense stretch (blocks 1000..1064 from position 357), then a young one right
    // after it (blocks 2000..2048), both within half the log.
    r.clean_head_then_dense_stretch(64);
    r.clock.advance_ns(OLD_NS);
    r.write_dense(2000, 48, 3);
    r.churn_and_settle(1000);
    let old = r.dirty_of(1000..1064);
    let young = r.dirty_of(2000..2048);
    assert!(old.len() == 64 && old[0] > 256, "{old:?}");
    assert!(young.len() == 48 && young[47] < 512, "the young stretch lies within half the log: {young:?}");
    r.v.background_tick().unwrap();
    assert!(r.dirty_of(1000..1064).len() <= 32, "the old stretch stays dirty: {:?}", r.dirty_of(1000..1064));
    assert_eq!(r.dirty_of(2000..2048), young, "the young stretch was written back");
    // Once it is old too, a round takes it.
    r.clock.advance_ns(OLD_NS);
    r.churn_and_settle(1050);
    r.v.background_tick().unwrap();
    assert!(r.dirty_of(2000..2048).len() <= 16, "{:?}", r.dirty_of(2000..2048));
    r.check_all("after the rounds");
}

#[test]
fn within_its_horizon_the_pre_cleaner_goes_no_further() {
    // Batches of 8 blocks (16 at most: whole windows), so a round's four hold less than the
    // head's stretch.
    let mut r = Rig::new(options(None, Some((8, 8))));
    // A dense stretch at the head, within the horizon; another past it; both old.
    r.write_dense(0, 160, 1);
    r.churn_until(400);
    r.write_dense(1000, 96, 2);
    r.clock.advance_ns(OLD_NS);
    r.churn_until(1000);
    let head_stretch = r.dirty_of(0..160);
    let beyond = r.dirty_of(1000..1096);
    // (The first reclaims took some of the head's stretch: more than a round's 64 are left.)
    assert!(head_stretch.len() > 80 && head_stretch.iter().all(|&p| p < 256), "{head_stretch:?}");
    assert!(beyond.len() == 96 && beyond[0] >= 256, "{beyond:?}");
    let writes = r.backing.stats().writes;
    r.v.background_tick().unwrap();
    assert!(r.backing.stats().writes > writes, "the round wrote nothing back");
    assert!(r.dirty_of(0..160).len() < head_stretch.len(), "the round wrote none of the head's stretch back");
    assert_eq!(r.dirty_of(1000..1096), beyond, "something past the horizon was written back before the head's stretch");
    r.check_all("after the round");
}

#[test]
fn the_idle_reach_keeps_every_flushed_block_through_power_cuts() {
    // The first scenario's round, its device (the cache or the backing device) gone after
    // its k-th operation of the round, then a power cut (pending writes dropped, applied or
    // torn), for every k until the round completes: the survivors recover every block at
    // its flushed version (every write here was flushed).
    use tiercache_device::FailMode;
    let mut cuts = 0;
    for on_cache in [false, true] {
        for k in 0.. {
            assert!(k < 10_000, "the round never completed");
            let mut r = Rig::old_stretch(options(None, Some((16, 16))));
            let dev = if on_cache { r.cache.clone() } else { r.backing.clone() };
            let failed = dev.stats().failed_ops;
            dev.fail_after(None, k, FailMode::Forever);
            let round = r.v.background_tick();
            let what = if on_cache { "cache" } else { "backing device" };
            if dev.stats().failed_ops == failed {
                round.unwrap();
                assert!(k > 2, "the round did next to nothing on the {what}");
                break;
            }
            cuts += 1;
            r.crash_and_reopen(k);
            r.check_all(&format!("cut after {k} operations on the {what}"));
        }
    }
    assert!(cuts >= 8, "only {cuts} cuts");
}
