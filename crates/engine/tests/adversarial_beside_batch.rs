//! Adversarial review of 1624197 ("write-around: a write of blocks with no copy in the cache
//! begins beside a write-back batch instead of waiting for it"). A write-back batch
//! (`destage_blocks`) publishes its blocks in `Around::batch`; `try_write_around` try-locks
//! the destage lock and, if a batch holds it, begins without it when no block of the write
//! has an index entry or a staged copy and none is in the batch.
//!
//! One test per suspicion, made exact with `Dev` (holds chosen backing I/Os until released);
//! the comment above each says what was suspected and whether it held (BUG) or was refuted.
//! Every wait is bounded (`finishes_within`, `join_within`): a deadlock fails, never hangs.
//!
//! Results on 1624197: every suspicion below was refuted (no test fails). Refuted by reading
//! alone (no public way to reach them, see the report): a second `destage_blocks` while one is
//! published (every caller holds the destage lock across exactly one call); a publication
//! left set by a `?` return (the guard clears it; only an unwinding panic leaves it, and that
//! panic poisons the destage mutex, which every later taker, `try_lock` included, turns into a
//! panic); a stale pick (`write_back_all`, `write_back_for_reclaim`, `restore_reclaim_reserve`
//! pick before taking the lock) is published before it is written and re-verified by
//! position (`still_dirty_at`), and a picked block can only lose its index entry to things
//! that refuse the write-around anyway (loss, repair/`resurrectable`, a write-around's end,
//! which the lock's wait orders before the pick).
//!
//! Blocks used: 40 and up (the backing device's fingerprint blocks are 0, 1, 16 and the last),
//! but 16 where the fingerprint update is the point. Versions: 0 is the backing device's
//! initial content.

use std::sync::Arc;
use std::time::Duration;
use tiercache_device::{BlockDevice, FailMode, OpKind, SimDevice};
use tiercache_engine::{create, CreateOptions, EngineError, Volume};
use tiercache_format::Layout;

mod common;
use common::holds::*;
use common::*;

fn beside(v: &Volume) -> u64 {
    v.status().counters.written_around_beside_write_back
}

struct Rig {
    cache: Arc<SimDevice>,
    backing: Arc<SimDevice>,
    dev: Arc<Dev>,
    v: Arc<Volume>,
}

/// A 256-block log over a 256-block backing device behind a `Dev`; writes of 2+ blocks go
/// around.
fn rig() -> Rig {
    let (cache, backing) = wa_devices(32, 256);
    let dev = Dev::new(&backing);
    let v = Arc::new(open_wa(Arc::clone(&cache) as Arc<dyn BlockDevice>, Arc::clone(&dev) as Arc<dyn BlockDevice>));
    Rig { cache, backing, dev, v }
}

type Batch = std::thread::JoinHandle<Result<usize, EngineError>>;

/// `destage_step(max)` on a thread of its own, held at the backing I/O `op` covering `block`.
fn batch_held_at(r: &Rig, op: Op, block: u64, max: usize) -> (usize, Batch) {
    let held = r.dev.hold(move |o, off, len| o == op && covers(off, len, block));
    let batch = on_thread(&r.v, move |v| v.destage_step(max));
    r.dev.wait_held(held);
    (held, batch)
}

/// A write of `n` blocks from `first` on a thread of its own, its backing write held.
fn around_held(r: &Rig, first: u64, n: u64, version: u64) -> (usize, std::thread::JoinHandle<Result<(), EngineError>>) {
    let held = r.dev.hold_write_of(first);
    let w = on_thread(&r.v, move |v| write_n(v, first, n, version));
    r.dev.wait_held(held);
    (held, w)
}

/// utime + stime of thread `tid`, in clock ticks.
fn cpu_ticks(tid: u64) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/self/task/{tid}/stat")).expect("the thread's stat");
    let fields: Vec<&str> = stat.rsplit(')').next().unwrap().split_whitespace().collect();
    // (After the command: state is field 3, utime 14, stime 15.)
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

// ------------------------------------------------------------------------------------------
// 1. A batch whose verification declares a loss, with a write-around beside it.

// Suspicion: `verify_batch` settles a bad copy of one of the batch's blocks
// (`settle_bad_dirty_copy`, checking the backing device with `backing_holds`, which the
// header says must run under the destage lock with no write-around able to interfere) while a
// write-around runs beside it; the lost block, now without an index entry, could then be
// written around beside the same batch, or the loss could be lost.
// Refuted: the lost block stays in the published list (and `may_write_around` refuses lost
// blocks anyway); the write-around of other blocks completes beside the batch; the loss holds
// live and after a power cut; a later write of the lost block goes through the cache and ends
// the loss.
#[test]
fn a_loss_declared_by_the_batch_beside_a_write_around_holds() {
    let r = rig();
    dirty_durable(&r.v, 40, 4, 1);
    corrupt_cached_block(&r.cache, &r.v, 41);
    // Held at `backing_holds`' read of block 41: published, verifying.
    let (held, batch) = batch_held_at(&r, Op::Read, 41, 64);
    let w = on_thread(&r.v, |v| write_n(v, 100, 2, 2));
    let went_beside = finishes_within(&w, 10);
    r.dev.release(held);
    assert_eq!(join_within(batch, 30, "the batch").unwrap(), 3, "40, 42, 43 written back; 41 lost");
    join_within(w, 30, "the write-around").unwrap();
    assert!(is_lost(&read_version(&r.v, 41), 41), "block 41 not lost after the batch");
    write(&r.v, 41, 9); // (one block: through the cache, which ends the loss)
    assert!(went_beside, "the write-around did not begin beside the verifying batch");
    assert_eq!(beside(&r.v), 1);
    assert_eq!(vers(&r.v, 100..102), vec![2, 2]);
    assert_eq!(ver(&r.v, 41), 9);
    r.v.flush().unwrap();
    let rec = crash_and_recover(&r.cache, &r.backing);
    assert_eq!(vers(&rec, 40..44), vec![1, 9, 1, 1], "after FLUSH and a power cut");
    assert_eq!(vers(&rec, 100..102), vec![2, 2], "after FLUSH and a power cut");
}

// Same, the lost block written around (2 blocks, 41 and 42, both in the batch) once the
// batch has declared 41 lost and left the index (so that only the published list stands
// between it and a write-around beside the batch).
// Refuted: a lost block is never written around (its loss ends through a record): the write
// goes through the cache at once (`Refused` comes before the beside test, so it need not wait
// for the batch; a copy through the cache is safe beside a batch: marking clean is by
// position), ends the loss, and wins live, after a cut and on the backing device.
#[test]
fn a_block_the_batch_declared_lost_is_not_written_around_beside_it() {
    let r = rig();
    dirty_durable(&r.v, 40, 4, 1);
    corrupt_cached_block(&r.cache, &r.v, 41);
    // Held at the batch's backing write (verification done: 41 is lost, out of the index).
    let (held, batch) = batch_held_at(&r, Op::Write, 40, 64);
    assert!(is_lost(&read_version(&r.v, 41), 41), "block 41 not lost while the batch is held");
    let w = on_thread(&r.v, |v| write_n(v, 41, 2, 2));
    let _ = finishes_within(&w, 1);
    r.dev.release(held);
    join_within(batch, 30, "the batch").unwrap();
    join_within(w, 30, "the write").unwrap();
    assert_eq!((beside(&r.v), around(&r.v)), (0, 0), "a lost block was written around");
    assert_eq!(vers(&r.v, 40..44), vec![1, 2, 2, 1]);
    r.v.flush().unwrap();
    let rec = crash_and_recover(&r.cache, &r.backing);
    assert_eq!(vers(&rec, 40..44), vec![1, 2, 2, 1], "after FLUSH and a power cut");
    r.v.write_back_all(1.0, |_, _| true).unwrap();
    assert_eq!((backing_version(&r.backing, 41), backing_version(&r.backing, 42)), (Some(2), Some(2)));
}

// ------------------------------------------------------------------------------------------
// 2. The batch's fingerprint update (superblock, phase 1 then 3) beside a write-around.

// Suspicion: the batch writes the superblock (`begin_fingerprint_update`) while a write-around
// runs beside it; a power cut with the superblock's "next" fingerprint set and a write-around
// in flight could fail the attach check, or the write-around could touch a fingerprint block.
// Refuted: fingerprint blocks are never written around; the recovered volume attaches at
// both cuts and reads the batch's blocks and the write-around's as it must.
#[test]
fn a_fingerprint_update_beside_a_write_around_survives_power_cuts() {
    let r = rig();
    dirty_durable(&r.v, 16, 2, 1); // block 16: a fingerprint block
    let (held, batch) = batch_held_at(&r, Op::Write, 16, 64);
    let (held_w, w) = around_held(&r, 100, 2, 2);
    assert_eq!(beside(&r.v), 1);
    {
        let rec = crash_and_recover(&r.cache, &r.backing); // (opens: the attach check passed)
        assert_eq!(vers(&rec, 16..18), vec![1, 1], "cut during the batch");
        for b in 100..102 {
            let x = ver(&rec, b);
            assert!(x == 0 || x == 2, "block {b}: version {x} after a cut during the write-around");
        }
    }
    r.dev.release(held_w);
    join_within(w, 30, "the write-around").unwrap();
    {
        let rec = crash_and_recover(&r.cache, &r.backing);
        assert_eq!(vers(&rec, 16..18), vec![1, 1], "cut after the write-around, batch held");
    }
    r.dev.release(held);
    assert_eq!(join_within(batch, 30, "the batch").unwrap(), 2);
    let rec = crash_and_recover(&r.cache, &r.backing);
    assert_eq!(vers(&rec, 16..18), vec![1, 1], "cut after the batch");
    drop(rec);
    r.v.flush().unwrap();
    let rec = crash_and_recover(&r.cache, &r.backing);
    assert_eq!((vers(&rec, 16..18), vers(&rec, 100..102)), (vec![1, 1], vec![2, 2]), "after FLUSH and a cut");
}

// ------------------------------------------------------------------------------------------
// 3. FLUSH and checkpoint racing a write-around begun beside a batch.

// Suspicion: a FLUSH (or checkpoint) while a write-around runs beside a held batch either
// returns before settling it (the write-around's completion is not covered: fine) or, worse,
// settles nothing and the completed write-around is not durable after the FLUSH that follows
// it; or FLUSH deadlocks between the batch (destage lock) and the write-around (its lock).
// Refuted: FLUSH waits for the write-around (`lock_around`), does not need the batch, and
// after it the write-around's data survives a power cut while the batch is still held.
#[test]
fn a_flush_beside_a_held_batch_waits_for_the_write_around_and_makes_it_durable() {
    let r = rig();
    dirty_durable(&r.v, 40, 4, 1);
    let (held, batch) = batch_held_at(&r, Op::Write, 40, 64);
    let (held_w, w) = around_held(&r, 100, 2, 2);
    assert_eq!(beside(&r.v), 1);
    let f = on_thread(&r.v, |v| v.flush());
    let c = on_thread(&r.v, |v| v.checkpoint());
    let early = finishes_within(&f, 1) || finishes_within(&c, 0);
    r.dev.release(held_w);
    join_within(w, 30, "the write-around").unwrap();
    // (The batch is still held: neither may need it.)
    join_within(f, 10, "the FLUSH beside the held batch").unwrap();
    join_within(c, 10, "the checkpoint beside the held batch").unwrap();
    assert!(!early, "FLUSH or checkpoint returned while a write-around was under way");
    r.v.flush().unwrap();
    let rec = crash_and_recover(&r.cache, &r.backing);
    assert_eq!((vers(&rec, 40..44), vers(&rec, 100..102)), (vec![1; 4], vec![2, 2]), "cut, batch still held");
    drop(rec);
    r.dev.release(held);
    join_within(batch, 30, "the batch").unwrap();
    r.v.flush().unwrap();
    let rec = crash_and_recover(&r.cache, &r.backing);
    assert_eq!((vers(&rec, 40..44), vers(&rec, 100..102)), (vec![1; 4], vec![2, 2]), "after the batch");
}

// ------------------------------------------------------------------------------------------
// 4. A write-around beside a batch that fails; a batch that fails.

// Suspicion: a write-around begun beside a batch whose backing write fails leaves itself
// registered (`under_way`, `writing`), so the next holder of the destage lock waits forever,
// or poisons the volume, or leaves its blocks unwritable.
// Refuted: the error is returned, nothing stays under way, the next batch and a retried
// write-around of the same blocks go on, and the data survives FLUSH and a power cut.
#[test]
fn a_failed_write_around_beside_a_batch_leaves_nothing_under_way() {
    let r = rig();
    dirty_durable(&r.v, 40, 4, 1);
    let (held, batch) = batch_held_at(&r, Op::Write, 40, 4);
    let (held_w, w) = around_held(&r, 100, 2, 2);
    r.backing.fail_after(Some(OpKind::Write), 0, FailMode::Once);
    r.dev.release(held_w);
    let failed = join_within(w, 30, "the failing write-around");
    assert!(failed.is_err(), "the write-around's backing write failed, yet it returned {failed:?}");
    r.dev.release(held);
    assert_eq!(join_within(batch, 30, "the batch").unwrap(), 4);
    write(&r.v, 60, 1);
    r.v.flush().unwrap();
    let next = on_thread(&r.v, |v| v.destage_step(64));
    assert_eq!(join_within(next, 10, "the next batch (waits for nothing under way)").unwrap(), 1);
    write_n(&r.v, 100, 2, 3).unwrap();
    assert_eq!(vers(&r.v, 100..102), vec![3, 3]);
    r.v.flush().unwrap();
    let rec = crash_and_recover(&r.cache, &r.backing);
    assert_eq!(vers(&rec, 100..102), vec![3, 3]);
}

/// Block 50 cached dirty and corrupted, and a reader of it held inside its loss check
/// (`read_block_again`: destage lock held, no batch published) at its backing read.
fn loss_check_held(r: &Rig) -> (usize, std::thread::JoinHandle<Result<Option<u64>, EngineError>>) {
    write(&r.v, 50, 1);
    r.v.flush().unwrap();
    corrupt_cached_block(&r.cache, &r.v, 50);
    let held = r.dev.hold(|op, off, len| op == Op::Read && covers(off, len, 50));
    let reader = on_thread(&r.v, |v| read_version(v, 50));
    r.dev.wait_held(held);
    (held, reader)
}

// Suspicion: a batch that returns early with an error (`?`: here its backing write fails)
// leaves its blocks published, so later write-arounds begin "beside a batch" next to any
// holder of the destage lock, e.g. a reader's loss check, which relies on no write-around
// running meanwhile.
// Refuted: the guard clears the publication on every return; the write-around waits (polls)
// while the loss check holds the lock, and proceeds once it lets go.
#[test]
fn a_failed_batch_leaves_no_publication_behind() {
    let r = rig();
    dirty_durable(&r.v, 40, 4, 1);
    r.backing.fail_after(Some(OpKind::Write), 0, FailMode::Once);
    assert!(r.v.destage_step(64).is_err(), "the batch's backing write failed");
    let (held, reader) = loss_check_held(&r);
    let w = on_thread(&r.v, |v| write_n(v, 100, 2, 2));
    let early = finishes_within(&w, 1);
    r.dev.release(held);
    join_within(w, 10, "the write-around after the loss check").unwrap();
    assert!(is_lost(&join_within(reader, 10, "the reader"), 50));
    assert!(!early, "a write-around began beside a loss check: the failed batch's publication was left set");
    assert_eq!(beside(&r.v), 0);
    assert_eq!(vers(&r.v, 100..102), vec![2, 2]);
}

// ------------------------------------------------------------------------------------------
// 5. Liveness of the polling loop (`NotBeside { eligible: true }`).

// Suspicion: a write-around of eligible blocks that finds the destage lock held by a holder
// that publishes nothing (a reader's loss check) spins; it could starve, never begin once
// the holder lets go, or burn a core meanwhile.
// Refuted: it waits while the loss check holds the lock and begins once it lets go. (It does
// poll: the thread's CPU time over the second of waiting is printed; measured on a 2-core
// machine: a few percent of a core, 50 us sleeps between tries.)
#[test]
fn a_write_around_polling_beside_a_loss_check_begins_once_it_ends() {
    let r = rig();
    dirty_durable(&r.v, 40, 4, 1);
    let (held, reader) = loss_check_held(&r);
    let (tx, rx) = std::sync::mpsc::channel();
    let w = on_thread(&r.v, move |v| {
        tx.send(thread_id()).unwrap();
        write_n(v, 100, 2, 2)
    });
    let tid = rx.recv().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    let before = cpu_ticks(tid);
    let early = finishes_within(&w, 1);
    let spent = cpu_ticks(tid) - before;
    eprintln!("the polling write-around spent {spent} clock ticks (1/100 s) of CPU in 1 s");
    r.dev.release(held);
    join_within(w, 10, "the write-around after the loss check").unwrap();
    assert!(is_lost(&join_within(reader, 10, "the reader"), 50));
    assert!(!early, "a write-around began beside a loss check (no batch published)");
    assert!(spent < 50, "the polling write-around burnt {spent}/100 of a core for one second");
    assert_eq!(vers(&r.v, 100..102), vec![2, 2]);
}

// ------------------------------------------------------------------------------------------
// 6. `Overlaps` beside a batch.

// Suspicion: a write-around overlapping one under way beside a batch waits for it (Overlaps)
// and then asks again; it could lose its `beside` and wait for the whole batch, or go ahead
// of the earlier one (the earlier data winning).
// Refuted: it waits for the earlier one only, then begins beside the still-held batch; the
// later data wins live and after FLUSH and a power cut.
#[test]
fn overlapping_write_arounds_beside_a_batch_run_in_order() {
    let r = rig();
    dirty_durable(&r.v, 40, 4, 1);
    let (held, batch) = batch_held_at(&r, Op::Write, 40, 64);
    let (held_w, w1) = around_held(&r, 100, 4, 2);
    let w2 = on_thread(&r.v, |v| write_n(v, 102, 4, 3));
    let early = finishes_within(&w2, 1);
    r.dev.release(held_w);
    join_within(w1, 10, "the first write-around").unwrap();
    let beside_too = finishes_within(&w2, 10);
    r.dev.release(held);
    join_within(batch, 30, "the batch").unwrap();
    join_within(w2, 30, "the second write-around").unwrap();
    assert!(!early, "the overlapping write-around did not wait for the earlier one");
    assert!(beside_too, "the overlapping write-around waited for the batch too");
    assert_eq!(beside(&r.v), 2);
    assert_eq!(vers(&r.v, 100..106), vec![2, 2, 3, 3, 3, 3]);
    r.v.flush().unwrap();
    let rec = crash_and_recover(&r.cache, &r.backing);
    assert_eq!(vers(&rec, 100..106), vec![2, 2, 3, 3, 3, 3], "after FLUSH and a power cut");
}

// ------------------------------------------------------------------------------------------
// 7. `resurrectable` (a clean copy dropped without a record) beside a batch.

// Suspicion: a TRIM during a batch drops a clean copy without a record (`resurrectable`); the
// block, with no index entry now, passes the beside test and is written around; after FLUSH
// and a power cut, replay brings the clean copy back over the new data.
// Refuted: `may_write_around` refuses it before the beside test (the write goes through the
// cache at once, without waiting for the batch) and it reads the new data after a cut.
#[test]
fn a_block_trimmed_clean_during_a_batch_is_not_written_around_beside_it() {
    let r = rig();
    write(&r.v, 60, 1);
    write(&r.v, 61, 1);
    r.v.write_back_all(1.0, |_, _| true).unwrap();
    assert_eq!(slot_of(&r.v, 60).map(|s| s.1), Some(false), "block 60 cached clean");
    dirty_durable(&r.v, 40, 4, 1);
    let (held, batch) = batch_held_at(&r, Op::Write, 40, 64);
    r.v.discard(60 * 4096, 2 * 4096).unwrap();
    let w = on_thread(&r.v, |v| write_n(v, 60, 2, 2));
    let done = finishes_within(&w, 10);
    r.dev.release(held);
    join_within(batch, 30, "the batch").unwrap();
    join_within(w, 30, "the write").unwrap();
    assert!(done, "the write of trimmed blocks waited for the batch");
    assert_eq!(beside(&r.v), 0, "trimmed-clean blocks went around beside the batch");
    assert_eq!(vers(&r.v, 60..62), vec![2, 2]);
    r.v.flush().unwrap();
    let rec = crash_and_recover(&r.cache, &r.backing);
    assert_eq!(vers(&rec, 60..62), vec![2, 2], "after FLUSH and a power cut");
}

// ------------------------------------------------------------------------------------------
// 8. A rewrite through the cache beside the batch, then the same block written around.

// Suspicion: a block written through the cache during the batch (a copy the batch did not
// pick, durable, so `may_write_around` allows it) is written around beside the same batch;
// the next batch, or this one, writes the older cached version over it.
// Refuted: an indexed copy keeps it from going beside (`NotBeside { eligible: false }`): it
// waits for the destage lock, goes around after the batch, and wins everywhere.
#[test]
fn a_block_rewritten_during_the_batch_waits_for_it() {
    let r = rig();
    dirty_durable(&r.v, 40, 4, 1);
    let (held, batch) = batch_held_at(&r, Op::Write, 40, 64);
    write(&r.v, 100, 3); // through the cache (not in the batch), durable: indexed dirty
    r.v.flush().unwrap();
    let w = on_thread(&r.v, |v| write_n(v, 100, 2, 4));
    let early = finishes_within(&w, 1);
    r.dev.release(held);
    join_within(batch, 30, "the batch").unwrap();
    join_within(w, 30, "the write-around").unwrap();
    assert!(!early, "a write of a block with a staged copy began beside the batch");
    assert_eq!(beside(&r.v), 0);
    assert_eq!(vers(&r.v, 100..102), vec![4, 4]);
    r.v.flush().unwrap();
    r.v.write_back_all(1.0, |_, _| true).unwrap();
    assert_eq!(backing_version(&r.backing, 100), Some(4));
    let rec = crash_and_recover(&r.cache, &r.backing);
    assert_eq!(vers(&rec, 100..102), vec![4, 4], "after FLUSH and a power cut");
}

// ------------------------------------------------------------------------------------------
// 9. Reclaim's own write-back batch (io lock held) with a write-around beside it.

/// A 256-block log of 16-block segments over a 4096-block backing device behind a `Dev`,
/// written around at 2+ blocks, filled with records of 15 dirty blocks (blocks 0.., version 1,
/// written one block at a time): every window at the head is dense.
fn dense_wa_rig() -> (Rig, Model) {
    let log_blocks = 256u64;
    let ck = Layout::checkpoint_blocks_for(log_blocks, BS as u32);
    let cache = Arc::new(SimDevice::new((2 + 2 * ck + log_blocks) * BS as u64, BS as u32).with_name("cache"));
    let backing = Arc::new(atomic_backing(stamps(0, 4096, 0)));
    create(&*cache, &*backing, &CreateOptions { segment_blocks: 16, ..log_only() }).expect("create");
    let dev = Dev::new(&backing);
    let v = Arc::new(open_wa(Arc::clone(&cache) as Arc<dyn BlockDevice>, Arc::clone(&dev) as Arc<dyn BlockDevice>));
    let mut model = Model::new();
    let mut next = 0;
    while v.log_window().2 + 16 < log_blocks {
        for b in next..next + 15 {
            write(&v, b, 1);
            model.insert(b, 1);
        }
        v.flush().unwrap();
        next += 15;
    }
    assert_eq!(v.log_window().0, 0);
    (Rig { cache, backing, dev, v }, model)
}

// Suspicion: a writer's reclaim writes the dense head back (`write_back_for_reclaim`, io lock
// held); a write-around begins beside that batch; the reclaim then seals its record (moving
// the head) without waiting for it, or deadlocks waiting for it (`lock_around` under the io
// lock), or the write-around's data is not durable before the record relies on the settle.
// Refuted: the write-around completes beside reclaim's batch; reclaim's seal waits for a
// write-around still under way (and only for it); data survive FLUSH and a power cut.
#[test]
fn reclaims_batch_with_a_write_around_beside_it_waits_before_its_record() {
    let (r, mut model) = dense_wa_rig();
    let held = r.dev.hold_write_of(0);
    let writer = on_thread(&r.v, |v| {
        let mut m = Model::new();
        let mut b = 2000;
        while v.log_window().0 == 0 {
            write_flush(v, &mut m, b, 1, 2);
            b += 1;
        }
        m
    });
    r.dev.wait_held(held);
    let (held_w, w) = around_held(&r, 3000, 2, 5);
    assert_eq!(beside(&r.v), 1, "the write-around did not begin beside reclaim's batch");
    r.dev.release(held);
    let early = finishes_within(&writer, 1);
    let head_before = r.v.log_window().0;
    r.dev.release(held_w);
    join_within(w, 30, "the write-around").unwrap();
    let m = join_within(writer, 30, "the writer's reclaim");
    assert!(!early && head_before == 0, "reclaim moved the head while a write-around was under way");
    model.extend(m);
    model.insert(3000, 5);
    model.insert(3001, 5);
    check_model(&r.v, &model, "live");
    r.v.flush().unwrap();
    let rec = crash_and_recover(&r.cache, &r.backing);
    check_model(&rec, &model, "after FLUSH and a power cut");
}
