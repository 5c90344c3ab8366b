//! Adversarial review of f839a2f ("FLUSH: the cache flush with the io lock let go (pipelined
//! group commit), a flush gate for the FLUSHes it covers"). Each test is one suspicion, made
//! deterministic with `common::holds::Dev` (holds chosen I/Os until the test lets them go);
//! the comment above each says whether it held (BUG) or was refuted. Every wait is bounded.
//!
//! Results (on f839a2f): one test fails, `a_flush_does_not_return_before_the_trim_record_
//! another_flush_is_flushing` (BUG: a FLUSH acknowledges a write-around whose Trim record
//! another FLUSH is still flushing; it passes on f839a2f^, where that FLUSH held the io lock
//! across its cache flush). The others pass on f839a2f (most of them need the pipelined FLUSH
//! and fail or time out on f839a2f^ by design). Fixed since: `trims_sealed` (commit.rs `flush`).
//! `tiercache torture`: seeds 1..151, 50000..50150, 777000..777100 and `--mode serial` seeds
//! 1..31 pass; `cargo test --release -p tiercache-sim every_broken_variant_is_caught` passes.
//!
//! Blocks used: 40 and up (the backing device's fingerprint blocks are 0, 1, 16 and the last).

use std::sync::Arc;
use tiercache_device::{FailMode, OpKind, SimDevice};
use tiercache_engine::Volume;

mod common;
use common::holds::*;
use common::*;

fn flush_requests(v: &Volume) -> u64 {
    v.status().counters.flush_requests
}

// ------------------------------------------------------------------------------------------
// 1. The early return `durable_sealed >= target` while another FLUSH's record is unflushed.

// Suspicion: FLUSH's early return ("a flush that started after our writes already covered
// them") counts only sealed staging buffers, and its write-around check only looks at what is
// still owed (`stage_write_around_trims`) or still staged (`staged_trims`). Before f839a2f the
// Trim entries another FLUSH staged were flushed before that FLUSH let the io lock go; now the
// io lock is free during its cache flush. A FLUSH B that began after a write-around completed,
// but before FLUSH C (already holding the io lock, settling that write-around) sealed the
// write-around's Trim entries, has a target of the old `sealed` (its write left no dirty data
// in staging), which `durable_sealed` already reaches: when C lets the io lock go, B finds
// nothing owed and nothing staged, and returns Ok while C's Trim record is not yet durable.
// A power cut then replays the older copy on the log over the written-around data.
//
// HELD (BUG): on f839a2f, B returns Ok within 2 s while C's cache flush is held, and the
// volume recovered from the durable images reads blocks 40..42 as version 1, not 2:
//   assertion `left == right` failed: FLUSH B returned Ok while the Trim record of a
//   write-around completed before it began was not durable: after a power cut ...
//   left: [1, 1]  right: [2, 2]
// Fixed: a FLUSH's target counts the newest record holding Trim entries (`trims_sealed`).
#[test]
fn a_flush_does_not_return_before_the_trim_record_another_flush_is_flushing() {
    let (cache, backing) = wa_devices(32, 256);
    let cdev = Dev::new(&cache);
    let bdev = Dev::new(&backing);
    let v = Arc::new(open_wa(cdev.clone(), bdev.clone()));
    dirty_durable(&v, 40, 2, 1);
    write_n(&v, 40, 2, 2).unwrap();
    assert_eq!(around(&v), 2, "blocks 40..42 went around");
    // FLUSH C takes the io lock and settles the write-around: its backing flush is held.
    let (settle, c) = bdev.flush_held(&v);
    // FLUSH B begins now (after the write-around completed): its target is taken at entry,
    // then it waits for the io lock.
    let requests = flush_requests(&v);
    let b = on_thread(&v, |v| v.flush());
    wait_until("FLUSH B began", || flush_requests(&v) > requests);
    // C seals the Trim entries into a record and writes it, lets the io lock go, and flushes
    // the cache device: held.
    let cflush = cdev.hold(|op, _, _| op == Op::Flush);
    bdev.release(settle);
    cdev.wait_held(cflush);
    let returned_early = finishes_within(&b, 2);
    // (The power cut at this instant: C's cache flush has not run.)
    let image = (cache.durable_image(), backing.durable_image());
    cdev.release(cflush);
    join_within(c, 30, "FLUSH C").unwrap();
    let b = join_within(b, 30, "FLUSH B");
    if returned_early {
        assert!(b.is_ok(), "{b:?}");
        let r = open_wa(
            Arc::new(SimDevice::from_image(image.0, BS as u32).with_name("cache")),
            Arc::new(atomic_backing(image.1)),
        );
        assert_eq!(
            vers(&r, 40..42),
            vec![2, 2],
            "FLUSH B returned Ok while the Trim record of a write-around completed before it began \
             was not durable: after a power cut the older copy on the log came back"
        );
    }
    b.unwrap();
    let r = crash_and_recover(&cache, &backing);
    assert_eq!(vers(&r, 40..42), vec![2, 2]);
}

// Control for (1): the same with B beginning after C sealed the Trim record (C's backing flush
// not held): B's target is then C's sealed count, which `flushing_sealed` covers, and B waits
// at the gate. Refuted (passes).
#[test]
fn a_flush_begun_after_the_trim_record_was_sealed_waits_at_the_gate() {
    let (cache, backing) = wa_devices(32, 256);
    let cdev = Dev::new(&cache);
    let v = Arc::new(open_wa(cdev.clone(), backing.clone()));
    dirty_durable(&v, 40, 2, 1);
    write_n(&v, 40, 2, 2).unwrap();
    let (cflush, c) = cdev.flush_held(&v);
    let b = on_thread(&v, |v| v.flush());
    assert!(!finishes_within(&b, 2), "FLUSH B returned while the cache flush covering the Trims was held");
    cdev.release(cflush);
    join_within(c, 30, "FLUSH C").unwrap();
    join_within(b, 30, "FLUSH B").unwrap();
    let r = crash_and_recover(&cache, &backing);
    assert_eq!(vers(&r, 40..42), vec![2, 2]);
}

// ------------------------------------------------------------------------------------------
// 2. A power cut with the next leader's record written during the cache flush before it.

// Suspicion: FLUSH A's cache flush is held; FLUSH B writes its record meanwhile (the io lock is
// free), carrying `durable_back` from before A's flush. A power cut that keeps any subset of
// the unflushed writes (SimDevice::crash, 24 seeds: dropped, applied, torn) must recover a
// prefix: block 10 reads 1, 2 or 3 (3 only if B's record survived, and then block 20 reads 1),
// and open must not call the log corrupt. Refuted (passes).
#[test]
fn a_power_cut_during_the_cache_flush_with_the_next_record_written_recovers_a_prefix() {
    for seed in 0..24 {
        let (dev, cache, backing, v) = held_volume(256);
        write(&v, 10, 1);
        v.flush().unwrap();
        write(&v, 10, 2);
        let (held, a) = dev.flush_held(&v);
        let writes = cache.stats().writes;
        write(&v, 10, 3);
        write(&v, 20, 1);
        let b = on_thread(&v, |v| v.flush());
        wait_until("B's record written", || cache.stats().writes > writes);
        assert!(!finishes_within(&b, 1));
        cache.crash(seed);
        let image = cache.durable_image();
        dev.release(held);
        // (The volume runs on over the crashed device: whatever it does now does not count.)
        assert!(finishes_within(&a, 30) && finishes_within(&b, 30), "seed {seed}: a FLUSH hung");
        let _ = (a.join(), b.join());
        drop(v);
        let r = try_open(Arc::new(SimDevice::from_image(image, BS as u32)), durable_copy(&backing))
            .unwrap_or_else(|e| panic!("seed {seed}: open after the power cut: {e}"));
        let (x, y) = (read_version(&r, 10).unwrap(), read_version(&r, 20).unwrap());
        assert!(matches!(x, Some(1..=3)), "seed {seed}: block 10 read {x:?}");
        assert!(y == Some(0) || y == Some(1), "seed {seed}: block 20 read {y:?}");
        assert_eq!(x == Some(3), y == Some(1), "seed {seed}: not a prefix: block 10 {x:?}, block 20 {y:?}");
    }
}

// ------------------------------------------------------------------------------------------
// 3. Poisoning.

// Suspicion: FLUSH A's cache flush fails while FLUSH B has written its own record and waits at
// the gate with the io lock held (B's target is above what A covers). B's own cache flush then
// succeeds; B must still fail (the volume is poisoned, no retried fsync), and so must any
// FLUSH after. Refuted (passes): `flush_covered` checks the poison after the flush.
#[test]
fn a_failed_cache_flush_fails_the_next_leader_with_its_own_record() {
    let (dev, cache, _backing, v) = held_volume(256);
    write(&v, 10, 1);
    cache.fail_after(Some(OpKind::Flush), 0, FailMode::Once);
    let (held, a) = dev.flush_held(&v);
    let writes = cache.stats().writes;
    write(&v, 20, 1);
    let b = on_thread(&v, |v| v.flush());
    wait_until("B's record written", || cache.stats().writes > writes);
    assert!(!finishes_within(&b, 1));
    dev.release(held);
    assert!(join_within(a, 30, "FLUSH A").is_err());
    assert!(join_within(b, 30, "FLUSH B").is_err(), "B succeeded after the failed cache flush before it");
    assert!(v.flush().is_err());
    assert!(v.write(30 * BS as u64, &stamps(30, 1, 1)).is_err(), "a write accepted after the poison");
    assert!(v.flush().is_err());
}

// Suspicion: the failed cache flush is FLUSH A's, and a record write by a pipelined writer is
// in progress when it fails (no io lock needed now). Its record may well succeed; every FLUSH
// after must fail, none may hang (the waiting loop must not spin on a poisoned volume whose
// `flushing_sealed` stays above `durable_sealed` for ever). Refuted (passes).
#[test]
fn a_failed_cache_flush_during_a_pipelined_record_write_poisons_without_a_spin() {
    let (dev, cache, _backing, v) = held_volume(256);
    write(&v, 10, 1);
    cache.fail_after(Some(OpKind::Flush), 0, FailMode::Once);
    let (held, a) = dev.flush_held(&v);
    // A writer fills staging: its record write (pipelined, io lock let go) is held.
    let rec = dev.hold(|op, _, len| op == Op::Write && len >= 2 * BS);
    let w = on_thread(&v, |v| {
        for b in 100..400u64 {
            if v.write(b * BS as u64, &stamps(b, 1, 1)).is_err() {
                return;
            }
        }
    });
    dev.wait_held(rec);
    // FLUSH W2 covered by nothing under way (the writes are newer) and FLUSH B covered by A.
    dev.release(held);
    assert!(join_within(a, 30, "FLUSH A").is_err());
    let b = on_thread(&v, |v| v.flush());
    dev.release(rec);
    join_within(w, 30, "the writer");
    assert!(join_within(b, 30, "FLUSH B").is_err());
    for _ in 0..3 {
        let f = on_thread(&v, |v| v.flush());
        assert!(join_within(f, 10, "a FLUSH after the failure (spin?)").is_err());
    }
}

// ------------------------------------------------------------------------------------------
// 4. Reclaim and checkpoints while a FLUSH's cache flush runs without the io lock.

// Suspicion: with FLUSH A's cache flush held (the io lock free), a writer fills the log so that
// reclaim moves the head, writes reclaim records and checkpoints, each flushing the cache
// device with the io lock held (no gate): none must wait for A (deadlock) or treat A's records
// as durable before their own flush. Then A returns, FLUSHes after it succeed, and a power cut
// recovers every flushed write. Refuted (passes).
#[test]
fn reclaim_and_checkpoints_during_a_held_flush_neither_deadlock_nor_lose_data() {
    let (dev, cache, backing, v) = held_volume(16);
    let mut model = Model::new();
    for b in 40..60 {
        write(&v, b, 1);
        model.insert(b, 1);
    }
    let (held, a) = dev.flush_held(&v);
    let before = v.status().counters;
    let w = on_thread(&v, |v| {
        for round in 2..12u64 {
            for b in 100..180u64 {
                v.write(b * BS as u64, &stamps(b, 1, round)).unwrap();
            }
        }
    });
    let w_done = finishes_within(&w, 30);
    let during = v.status().counters;
    dev.release(held);
    join_within(a, 30, "FLUSH A").unwrap();
    assert!(w_done, "the writer (reclaim, checkpoints) waited for the held FLUSH's cache flush");
    join_within(w, 30, "the writer");
    assert!(during.checkpoints > before.checkpoints, "no checkpoint ran meanwhile: {during:?}");
    for b in 100..180 {
        model.insert(b, 11);
    }
    v.flush().unwrap();
    drop(v);
    let r = open(durable_copy(&cache), durable_copy(&backing));
    for (&b, &x) in &model {
        assert_eq!(read_version(&r, b).unwrap(), Some(x), "block {b}");
    }
}

// ------------------------------------------------------------------------------------------
// 5. Counters and the waiting loop.

// Suspicion: many FLUSHes covered by the one under way all wait at the gate and loop; they
// must all return once it ends, issuing no cache flush of their own (one per FLUSH A), and
// none may spin (bounded). Refuted (passes).
#[test]
fn many_flushes_covered_by_the_one_under_way_issue_no_cache_flush() {
    let (dev, _cache, _backing, v) = held_volume(256);
    write(&v, 10, 1);
    let before = v.status().counters.cache_flushes;
    let (held, a) = dev.flush_held(&v);
    let waiters: Vec<_> = (0..8).map(|_| on_thread(&v, |v| v.flush())).collect();
    wait_until("8 FLUSHes began", || flush_requests(&v) == 9);
    for w in &waiters {
        assert!(!finishes_within(w, 0));
    }
    dev.release(held);
    join_within(a, 30, "FLUSH A").unwrap();
    for w in waiters {
        join_within(w, 30, "a waiting FLUSH").unwrap();
    }
    assert_eq!(v.status().counters.cache_flushes - before, 1);
}
