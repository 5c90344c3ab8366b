//! `AlignedBuf::new_huge` from the adversarial review of ab21ba3 (huge-page I/O buffers):
//! - `huge_buffers_unmap_exactly_what_they_keep`: lengths on both sides of each rounding
//!   (1, a huge page less one, one, one plus one, three) made and dropped a few hundred times
//!   leave the address space as it was (a head or tail left mapped, or a kept stretch not
//!   unmapped, would leak 2 MiB or more a round: gigabytes);
//! - `huge_buffers_made_and_dropped_on_many_threads_never_overlap`: a trim that cut into
//!   the kept stretch (or a drop that unmapped a neighbour's) would let another thread's
//!   mapping land inside a live buffer: each thread's pattern survives the others' churn,
//!   and buffers dropped on another thread than the one that made them (`Send`);
//! - `impossible_lengths_panic_rather_than_map_something_smaller`: lengths whose rounding
//!   overflows, or beyond what a mapping may be, panic (a wrapped size would give a buffer
//!   whose slice is longer than its mapping).

use std::sync::{mpsc, Mutex};
use tiercache_device::{AlignedBuf, HUGE_PAGE};

/// The address-space test measures the whole process: the tests run one at a time.
static SERIAL: Mutex<()> = Mutex::new(());

/// The process's virtual size in KiB (`VmSize`).
fn vm_size_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmSize:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn huge_buffers_unmap_exactly_what_they_keep() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let lens = [1, HUGE_PAGE - 1, HUGE_PAGE, HUGE_PAGE + 1, 3 * HUGE_PAGE];
    // A first round, so that the allocator's and the test harness's own growth is done.
    for len in lens {
        drop(AlignedBuf::new_huge(len));
    }
    let before = vm_size_kb();
    for _ in 0..300 {
        for len in lens {
            let mut b = AlignedBuf::new_huge(len);
            assert_eq!(b.as_ptr() as usize % HUGE_PAGE, 0);
            assert_eq!(b.len(), len);
            // First and last bytes writable: the kept stretch covers the whole length.
            b[0] = 1;
            b[len - 1] = 2;
        }
    }
    let after = vm_size_kb();
    // 1,500 buffers: one leaked huge page each would be 3 GiB. (A new thread's malloc arena
    // reserves 64 MiB of address space: a margin of 256.)
    assert!(after < before + 256 * 1024, "the address space grew from {before} kB to {after} kB");
}

#[test]
fn huge_buffers_made_and_dropped_on_many_threads_never_overlap() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (to_dropper, dropped) = mpsc::channel::<AlignedBuf>();
    let dropper = std::thread::spawn(move || {
        let mut n = 0;
        for b in dropped {
            // Still the pattern its maker left: nobody else's mapping landed in it.
            let tag = b[0];
            assert!(b.iter().step_by(4096).all(|&x| x == tag), "a buffer changed after it was sent");
            drop(b);
            n += 1;
        }
        n
    });
    let makers: Vec<_> = (0..4u8)
        .map(|t| {
            let to_dropper = to_dropper.clone();
            std::thread::spawn(move || {
                for i in 0..150usize {
                    let len = [4096, HUGE_PAGE - 4096, HUGE_PAGE, HUGE_PAGE + 4096][(i + t as usize) % 4];
                    let mut b = AlignedBuf::new_huge(len);
                    let tag = t * 60 + (i % 60) as u8 + 1;
                    for x in b.iter_mut().step_by(4096) {
                        assert_eq!(*x, 0, "a new huge buffer is zero");
                        *x = tag;
                    }
                    std::thread::yield_now();
                    assert!(b.iter().step_by(4096).all(|&x| x == tag), "another thread wrote into a live buffer");
                    if i % 3 == 0 {
                        to_dropper.send(b).unwrap();
                    }
                }
            })
        })
        .collect();
    drop(to_dropper);
    for m in makers {
        m.join().unwrap();
    }
    assert_eq!(dropper.join().unwrap(), 4 * 50);
}

#[test]
fn impossible_lengths_panic_rather_than_map_something_smaller() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    for len in [usize::MAX, usize::MAX - HUGE_PAGE, usize::MAX - 3 * HUGE_PAGE, isize::MAX as usize + 1] {
        let r = std::panic::catch_unwind(|| AlignedBuf::new_huge(len).len());
        assert!(r.is_err(), "new_huge({len}) returned a buffer of {:?} bytes", r.ok());
    }
}
