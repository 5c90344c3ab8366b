//! Several reads in flight at once from one thread, through a small io_uring per thread
//! ([`FileDevice::read_batch`](crate::FileDevice)): a large cached read whose blocks sit in
//! several runs of log slots (or a read that misses in several places) is as many scatter
//! reads, and issuing them one after another made a 1 MiB cache hit take about the time of
//! its runs added up (issue 13: 0.59 of the raw device at queue depth 1).
//!
//! Why io_uring and not a thread pool: the kernel overlaps the requests with no thread
//! handoff, wake-up or copy, and the calling thread stays the one that waits (the engine's
//! lock-order and scheduling rules see no new thread). Why a ring per thread: a shared ring
//! would need a lock around submit-and-wait, serialising exactly the readers it should
//! overlap. The ring is created on a thread's first batch; where io_uring is unavailable
//! (an old kernel, a seccomp filter), the first failure is remembered and every batch falls
//! back to one read after another.
//!
//! A record write goes through the same ring (`write_while`): the writer stages the next
//! record's blocks while it is in flight. So do write-back's runs (`writev_batch`,
//! [`FileDevice::write_batch`](crate::FileDevice)): a batch of dirty blocks lands on the
//! backing device as many writes at scattered addresses, and one after another they ran at
//! the device's queue-depth-1 rate (about 8,700 4 KiB writes/s on this machine's disk),
//! which bounded every write-heavy workload larger than the cache (issue 13).
//!
//! A caller that checks what it read (the engine verifies a large cache hit's checksums)
//! can have each read handed over as it completes (`readv_batch_each`), checking the first
//! while the rest are still being read: the wait is then for one completion at a time.
//!
//! The one hazard: requests in flight own the caller's buffers until they complete. So
//! `readv_batch` never returns while any is in flight; an error from the ring itself with
//! requests in flight aborts the process rather than return and let the kernel write into
//! memory that is no longer the buffer it was given.

use std::cell::RefCell;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};

use io_uring::{opcode, types, IoUring};

/// Entries of each thread's ring: the most requests one call keeps in flight (a batch with
/// more is issued in groups this size).
pub(crate) const RING_ENTRIES: usize = 32;

/// Set once creating a ring failed: io_uring is not available to this process.
pub(crate) static UNAVAILABLE: AtomicBool = AtomicBool::new(false);

thread_local! {
    static RING: RefCell<Option<IoUring>> = const { RefCell::new(None) };
    /// A second ring, kept for a write whose work issues a write of its own (the engine's
    /// nested record, `write_while` inside `write_while`): the outer one holds the first
    /// ring meanwhile, and without a spare every nested write created a ring.
    static SPARE: RefCell<Option<IoUring>> = const { RefCell::new(None) };
}

/// What `readv_batch_each` calls with each read as it completes: its index, its result.
pub(crate) type Completed<'f> = dyn FnMut(usize, &io::Result<usize>) + 'f;

/// One scatter read (`iovecs` filled in order from `offset`) or gather write (`iovecs` written
/// in order from `offset`).
pub(crate) struct Vectored {
    pub offset: u64,
    pub iovecs: Vec<libc::iovec>,
}

/// Issues every read together (in groups of `RING_ENTRIES`) on `fd` and waits for all of
/// them. Returns each one's byte count or error in order, or `None` (nothing issued) where
/// io_uring is not available, for the caller to read one after another instead. A read the
/// ring could not issue (the ring itself failed with nothing in flight) comes back as
/// `EAGAIN`, which the caller retries on its own.
///
/// # Safety
/// Every iovec must point at memory valid for writes of its length, not otherwise accessed
/// until this returns.
pub(crate) unsafe fn readv_batch(fd: i32, reads: &[Vectored]) -> Option<Vec<io::Result<usize>>> {
    // SAFETY: this function's contract is `rw_batch`'s for reads.
    unsafe { rw_batch(fd, reads, false, None) }
}

/// `readv_batch`, calling `each(k, result)` for read `k` as soon as it completes (in
/// completion order, on this thread), while the others may still be in flight: the caller
/// can check what has arrived while the rest is read. `each` sees each read exactly once,
/// and only reads the ring completed (not those it never issued: they come back as `EAGAIN`).
///
/// # Safety
/// `readv_batch`'s; and `each` must not touch the memory of any read but read `k`.
pub(crate) unsafe fn readv_batch_each(
    fd: i32,
    reads: &[Vectored],
    each: &mut Completed<'_>,
) -> Option<Vec<io::Result<usize>>> {
    // SAFETY: this function's contract is `rw_batch`'s for reads.
    unsafe { rw_batch(fd, reads, false, Some(each)) }
}

/// `readv_batch` for writes: every write issued together (in groups of `RING_ENTRIES`), all
/// waited for; each one's byte count or error in order, or `None` where io_uring is not
/// available. The writes may land in any order: they must not overlap.
///
/// # Safety
/// Every iovec must point at memory valid for reads of its length, aligned for this file as
/// `pwrite` would need, and not written until this returns.
pub(crate) unsafe fn writev_batch(fd: i32, writes: &[Vectored]) -> Option<Vec<io::Result<usize>>> {
    // SAFETY: this function's contract is `rw_batch`'s for writes.
    unsafe { rw_batch(fd, writes, true, None) }
}

/// `readv_batch` (`write` false) and `writev_batch` (`write` true); with `each`,
/// `readv_batch_each` (waiting for one completion at a time, not for all at once).
///
/// # Safety
/// Every iovec must point at memory valid for the transfer's direction, not otherwise
/// accessed until this returns, except by `each` for an operation that has completed.
unsafe fn rw_batch(
    fd: i32,
    ops: &[Vectored],
    write: bool,
    mut each: Option<&mut Completed<'_>>,
) -> Option<Vec<io::Result<usize>>> {
    if UNAVAILABLE.load(Ordering::Relaxed) {
        return None;
    }
    // (Taken out of the thread's slot while the batch runs: `each` may issue a batch of its
    // own, which then takes the spare or a new ring.)
    let mut slot: Option<IoUring> = RING.with(|cell| {
        let mut slot = cell.borrow_mut();
        if has_ring(&mut slot) {
            slot.take()
        } else {
            None
        }
    });
    slot.as_ref()?;
    {
        let mut results: Vec<io::Result<usize>> = Vec::with_capacity(ops.len());
        let mut panicked: Option<Box<dyn std::any::Any + Send>> = None;
        for (g, group) in ops.chunks(RING_ENTRIES).enumerate() {
            let Some(ring) = slot.as_mut() else {
                // The ring failed in an earlier group: the rest are left to the caller.
                results.extend(group.iter().map(|_| Err(io::Error::from_raw_os_error(libc::EAGAIN))));
                continue;
            };
            let base = g * RING_ENTRIES;
            {
                let mut sq = ring.submission();
                for (k, r) in group.iter().enumerate() {
                    let (iov, n) = (r.iovecs.as_ptr(), r.iovecs.len() as u32);
                    let entry = if write {
                        opcode::Writev::new(types::Fd(fd), iov, n).offset(r.offset).build()
                    } else {
                        opcode::Readv::new(types::Fd(fd), iov, n).offset(r.offset).build()
                    }
                    .user_data((base + k) as u64);
                    // SAFETY: the iovecs (held by `ops`, alive until this returns) point at
                    // buffers the caller lends for the call (this function's contract), and
                    // the loop below waits for every request the kernel took before returning.
                    unsafe { sq.push(&entry) }.expect("the ring holds a whole group");
                }
            }
            let mut done: Vec<Option<io::Result<usize>>> = (0..group.len()).map(|_| None).collect();
            let mut reaped = 0;
            let progressive = each.is_some();
            let mut reap = |ring: &mut IoUring, done: &mut [Option<io::Result<usize>>], reaped: &mut usize| {
                for cqe in ring.completion() {
                    let k = cqe.user_data() as usize - base;
                    let res = cqe.result();
                    let result = if res < 0 { Err(io::Error::from_raw_os_error(-res)) } else { Ok(res as usize) };
                    if let (Some(each), None) = (each.as_mut(), &panicked) {
                        // (A panic waits until nothing is in flight: unwinding now would give
                        // back buffers the kernel still writes into.)
                        let called = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| each(base + k, &result)));
                        panicked = called.err();
                    }
                    done[k] = Some(result);
                    *reaped += 1;
                }
            };
            while reaped < group.len() {
                let wait_for = if progressive { 1 } else { group.len() - reaped };
                if let Err(e) = ring.submit_and_wait(wait_for) {
                    if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)) {
                        continue;
                    }
                    // The kernel takes entries off the submission queue as it issues them:
                    // those still on it were never issued; those issued and not yet reaped
                    // are in flight.
                    reap(ring, &mut done, &mut reaped);
                    let in_flight = group.len() - reaped - ring.submission().len();
                    if in_flight > 0 {
                        // Requests in flight own the caller's buffers: returning would let the
                        // kernel write into memory given back (see the module header).
                        let what = if write { "writes" } else { "reads" };
                        eprintln!("tiercache: io_uring failed with {in_flight} {what} in flight ({e}); aborting");
                        std::process::abort();
                    }
                    // Nothing in flight: the ring goes (with the entries it never issued, which
                    // must not be issued later), and so does io_uring for this process.
                    note_unavailable(&e);
                    UNAVAILABLE.store(true, Ordering::Relaxed);
                    slot = None;
                    break;
                }
                reap(ring, &mut done, &mut reaped);
            }
            // (Only what the ring served: a read it never issued is retried as a syscall.)
            if !write {
                READS.with(|n| n.set(n.get() + reaped as u64));
            }
            results
                .extend(done.into_iter().map(|r| r.unwrap_or_else(|| Err(io::Error::from_raw_os_error(libc::EAGAIN)))));
        }
        if let Some(ring) = slot {
            give_back(ring);
        }
        if let Some(panic) = panicked {
            std::panic::resume_unwind(panic);
        }
        Some(results)
    }
}

/// Puts a ring taken out of this thread's slot back (or keeps it as the spare, if work done
/// meanwhile left a ring in the slot).
fn give_back(ring: IoUring) {
    RING.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(ring);
        } else {
            SPARE.with(|spare| {
                spare.borrow_mut().get_or_insert(ring);
            });
        }
    });
}

/// Gives this thread's ring to `slot` if it has none (the spare, else a new one); false if io_uring is
/// not available.
fn has_ring(slot: &mut Option<IoUring>) -> bool {
    if slot.is_none() {
        *slot = SPARE.with(|spare| spare.borrow_mut().take());
    }
    if slot.is_none() {
        match IoUring::new(RING_ENTRIES as u32) {
            Ok(ring) => *slot = Some(ring),
            Err(e) => {
                // (Only a refusal is for good; running short of memory or descriptors may
                // pass, and the next call tries again.)
                if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM | libc::EACCES)) {
                    note_unavailable(&e);
                    UNAVAILABLE.store(true, Ordering::Relaxed);
                }
                return false;
            }
        }
    }
    true
}

/// Issues one write of `buf` at `offset` on `fd`, runs `during` while it is in flight, waits
/// for it and returns its byte count or error; `None`, before anything was issued and
/// without running `during`, where io_uring is not available (the caller writes with a
/// syscall instead). `during` may panic: the write is waited for first, then the panic goes
/// on.
///
/// # Safety
/// `buf` must be valid for reads of its length and satisfy the file's alignment rules (the
/// same as for `pwrite` on it).
pub(crate) unsafe fn write_while(
    fd: i32,
    offset: u64,
    buf: &[u8],
    during: &mut dyn FnMut(),
) -> Option<io::Result<usize>> {
    if UNAVAILABLE.load(Ordering::Relaxed) {
        return None;
    }
    // (Taken out of the thread's slot while `during` runs, which may use the ring too.)
    let mut ring = RING.with(|cell| {
        let mut slot = cell.borrow_mut();
        if has_ring(&mut slot) {
            slot.take()
        } else {
            None
        }
    })?;
    let entry = opcode::Write::new(types::Fd(fd), buf.as_ptr(), buf.len() as u32).offset(offset).build().user_data(0);
    // SAFETY: `buf` is borrowed for this whole call, and the call neither returns nor unwinds
    // before the kernel has completed the write (below).
    unsafe { ring.submission().push(&entry) }.expect("an idle ring has room");
    loop {
        match ring.submit() {
            Ok(_) => break,
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)) => continue,
            // (Taken off the queue: issued after all; the wait below reaps it.)
            Err(_) if ring.submission().is_empty() => break,
            Err(e) => {
                // Never issued: the ring goes, with its entry, and so does io_uring.
                note_unavailable(&e);
                UNAVAILABLE.store(true, Ordering::Relaxed);
                return None;
            }
        }
    }
    let worked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(&mut *during));
    let result = loop {
        if let Some(cqe) = ring.completion().next() {
            let res = cqe.result();
            break if res < 0 { Err(io::Error::from_raw_os_error(-res)) } else { Ok(res as usize) };
        }
        if let Err(e) = ring.submit_and_wait(1) {
            if matches!(e.raw_os_error(), Some(libc::EINTR | libc::EAGAIN | libc::EBUSY)) {
                continue;
            }
            // The write owns `buf` until it completes: returning now would let the caller
            // reuse memory the kernel still reads (see the module header).
            eprintln!("tiercache: io_uring failed with a write in flight ({e}); aborting");
            std::process::abort();
        }
    };
    give_back(ring);
    if let Err(panic) = worked {
        std::panic::resume_unwind(panic);
    }
    Some(result)
}

thread_local! {
    static READS: std::cell::Cell<u64> = const { std::cell::Cell::new(0) };
}

/// Reads this thread has put through its io_uring (they are not read syscalls: tests that
/// count a read's device I/Os add these to /proc's `syscr`).
pub fn ring_reads_on_this_thread() -> u64 {
    READS.with(|n| n.get())
}

/// Says once, on stderr, why batches read one after another (no logging crate here: the
/// device layer stays dependency-light).
fn note_unavailable(e: &io::Error) {
    static SAID: AtomicBool = AtomicBool::new(false);
    if !SAID.swap(true, Ordering::Relaxed) {
        eprintln!("tiercache: io_uring unavailable ({e}); batched reads and writes run one after another");
    }
}
