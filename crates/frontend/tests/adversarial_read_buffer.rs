//! `read_buffer`'s per-thread huge buffer (not zeroed between reads) from the adversarial
//! review of ab21ba3:
//! - `a_volume_read_into_a_dirty_buffer_returns_only_its_own_bytes`: the buffer is first
//!   filled with another request's bytes (0xEE), then the volume reads into it every shape of
//!   request (aligned, unaligned, sub-block, the volume's last bytes, larger than a huge page,
//!   staged, cached, from the backing device) with random read errors and corrupted cache
//!   blocks on the cache device: every read that succeeds holds exactly the model's bytes;
//! - `a_passthrough_read_into_a_dirty_buffer_returns_only_its_own_bytes`: the same for the
//!   plain device;
//! - `read_buffers_left_in_thread_locals_at_thread_exit_are_unmapped`: a thread that ends
//!   while thread-locals (destroyed before and after the reused buffer's own) hold read
//!   buffers, and a thread holding two, leak nothing (500 threads: 1 GiB if they did);
//! - `a_read_buffer_dropped_on_another_thread_becomes_that_threads_and_is_never_shared`.

use std::cell::RefCell;
use std::sync::Arc;
use tiercache_device::{MonotonicClock, SimDevice, HUGE_PAGE};
use tiercache_engine::{create, CreateOptions, Volume, VolumeOptions};
use tiercache_frontend::{read_buffer, ByteIo, Passthrough, ReadBuffer, REUSED_READ_MIN_BYTES as REUSED};

const BS: u64 = 4096;
const STALE: u8 = 0xEE;

/// This thread's reused buffer, full of another request's bytes.
fn dirty_the_threads_buffer() {
    let mut b = read_buffer(HUGE_PAGE);
    b.fill(STALE);
}

/// Byte `i` of the test images: never `STALE`.
fn pattern(i: usize, salt: u8) -> u8 {
    let b = (i / 7 % 239) as u8 ^ salt;
    if b == STALE {
        0
    } else {
        b
    }
}

/// A small xorshift, for request shapes.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// Reads of every shape at random, each into a freshly dirtied buffer: a read that succeeds
/// holds the model's bytes only.
fn check_reads(io: &dyn ByteIo, model: &[u8], seed: u64, rounds: usize, mut between: impl FnMut(usize)) -> usize {
    let size = model.len() as u64;
    let mut rng = Rng(seed);
    let mut ok = 0;
    for round in 0..rounds {
        between(round);
        let (offset, len) = match rng.below(6) {
            0 => (rng.below(size / BS) * BS, (1 + rng.below(16)) * BS),
            1 => (rng.below(size - 1), 1 + rng.below(3 * BS)),
            2 => (size - 1 - rng.below(2 * BS), 0),
            3 => (rng.below(size - HUGE_PAGE as u64 - BS), HUGE_PAGE as u64 + rng.below(BS)),
            4 => (rng.below(size / BS) * BS + rng.below(BS), rng.below(BS)),
            _ => (0, size.min(HUGE_PAGE as u64)),
        };
        // Clamped to the volume; case 2 reads its last bytes.
        let len = if len == 0 { size - offset } else { len.min(size - offset) };
        dirty_the_threads_buffer();
        let mut buf = read_buffer(len as usize);
        if io.read(offset, &mut buf).is_ok() {
            let want = &model[offset as usize..(offset + len) as usize];
            if let Some(at) = (0..buf.len()).find(|&i| buf[i] != want[i]) {
                panic!(
                    "round {round}: read of {len} bytes at {offset} returned {:#x} at byte {at} where {:#x} is",
                    buf[at], want[at]
                );
            }
            ok += 1;
        }
    }
    ok
}

#[test]
fn a_volume_read_into_a_dirty_buffer_returns_only_its_own_bytes() {
    let blocks = 2048u64; // 8 MiB: reads larger than a huge page fit several times
    let image: Vec<u8> = (0..(blocks * BS) as usize).map(|i| pattern(i, 0x11)).collect();
    let backing = Arc::new(SimDevice::from_image(image.clone(), BS as u32));
    let log_blocks = 64 * 64;
    let ck = tiercache_format::Layout::checkpoint_blocks_for(log_blocks, BS as u32);
    let cache = Arc::new(SimDevice::new((2 + 2 * ck + log_blocks) * BS, BS as u32));
    create(&*cache, &*backing, &CreateOptions { segment_blocks: 64, ..CreateOptions::default() }).unwrap();
    let (v, _) = Volume::open(
        Arc::clone(&cache) as _,
        Arc::clone(&backing) as _,
        Arc::new(MonotonicClock::new()),
        VolumeOptions::default(),
    )
    .unwrap();
    let io: &dyn ByteIo = &v;
    let mut model = image;
    // Writes (staged, then in records after flushes), reads that admit misses, then reads
    // with cache-device read errors and corrupted log blocks.
    let mut rng = Rng(0x5eed);
    for w in 0..200u64 {
        let offset = rng.below(blocks * BS - 3 * BS);
        let len = 1 + rng.below(3 * BS) as usize;
        let data: Vec<u8> = (0..len).map(|i| pattern(i + w as usize, 0x60)).collect();
        io.write(offset, &data, w % 17 == 0).unwrap();
        model[offset as usize..offset as usize + len].copy_from_slice(&data);
        if w % 40 == 39 {
            io.flush().unwrap();
        }
    }
    let ok = check_reads(io, &model, 1, 300, |_| {});
    assert_eq!(ok, 300, "reads without faults all succeed");
    cache.set_error_rates(7, 0.2, 0.0, 0.0);
    let ok = check_reads(io, &model, 2, 300, |round| {
        if round % 50 == 0 {
            // A log block full of garbage: its checksum fails, the block is read again.
            let at = (2 + 2 * ck + (round as u64 * 37) % log_blocks) * BS;
            cache.corrupt(at, &[STALE; BS as usize]);
        }
    });
    assert!(ok > 0, "some reads succeed despite the errors");
}

#[test]
fn a_passthrough_read_into_a_dirty_buffer_returns_only_its_own_bytes() {
    let size = 6 * HUGE_PAGE + 3 * BS as usize;
    let image: Vec<u8> = (0..size).map(|i| pattern(i, 0x33)).collect();
    let dev = Arc::new(SimDevice::from_image(image.clone(), BS as u32));
    let p = Passthrough::new(Arc::clone(&dev) as _);
    assert_eq!(check_reads(&p, &image, 3, 200, |_| {}), 200);
    dev.set_error_rates(9, 0.3, 0.0, 0.0);
    assert!(check_reads(&p, &image, 4, 200, |_| {}) > 0);
}

/// The process's virtual size in KiB (`VmSize`).
fn vm_size_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmSize:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

thread_local! {
    static HELD_BEFORE: RefCell<Vec<ReadBuffer>> = const { RefCell::new(Vec::new()) };
    static HELD_AFTER: RefCell<Vec<ReadBuffer>> = const { RefCell::new(Vec::new()) };
}

#[test]
fn read_buffers_left_in_thread_locals_at_thread_exit_are_unmapped() {
    let round = |n: usize| {
        for t in 0..n {
            std::thread::spawn(move || {
                // (Registered before the reused buffer's thread-local: destroyed after it, on
                // glibc, whose thread-local destructors run last registered first.)
                HELD_BEFORE.with(|h| h.borrow_mut().clear());
                let a = read_buffer(REUSED);
                let b = read_buffer(REUSED + 100);
                let large = read_buffer(HUGE_PAGE + 1);
                match t % 3 {
                    0 => HELD_BEFORE.with(|h| h.borrow_mut().extend([a, b, large])),
                    1 => HELD_AFTER.with(|h| h.borrow_mut().extend([a, b, large])),
                    _ => {
                        HELD_BEFORE.with(|h| h.borrow_mut().push(a));
                        HELD_AFTER.with(|h| h.borrow_mut().extend([b, large]));
                    }
                }
            })
            .join()
            .unwrap();
        }
    };
    round(20);
    let before = vm_size_kb();
    round(500);
    let after = vm_size_kb();
    // Three buffers a thread (two of 2 MiB, one of 4 MiB): 500 threads leaking even one
    // would be 1 GiB.
    assert!(after < before + 256 * 1024, "the address space grew from {before} kB to {after} kB");
}

#[test]
fn a_read_buffer_dropped_on_another_thread_becomes_that_threads_and_is_never_shared() {
    let (tx, rx) = std::sync::mpsc::channel::<ReadBuffer>();
    let taker = std::thread::spawn(move || {
        let mut b = read_buffer(REUSED);
        b.fill(1);
        let at = b.as_ptr() as usize;
        tx.send(b).unwrap();
        // The buffer went with the request: this thread gets a new one.
        let c = read_buffer(REUSED);
        assert_ne!(c.as_ptr() as usize, at);
        at
    });
    let given = rx.recv().unwrap();
    let at = taker.join().unwrap();
    std::thread::spawn(move || {
        let mine = read_buffer(REUSED);
        // The slot is empty (`mine` holds its buffer): the given one goes into it.
        drop(given);
        let next = read_buffer(REUSED);
        assert_eq!(next.as_ptr() as usize, at, "the dropping thread adopts the buffer");
        assert_ne!(mine.as_ptr(), next.as_ptr(), "two live read buffers never alias");
        drop((mine, next));
        // Both given back: one is kept, the other unmapped; the next two reads get two.
        let (x, y) = (read_buffer(REUSED), read_buffer(REUSED));
        assert_ne!(x.as_ptr(), y.as_ptr());
    })
    .join()
    .unwrap();
}
