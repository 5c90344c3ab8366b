//! The NBD server's request threads (leader and followers: the connection's threads take turns
//! reading a request, and each runs the one it read; a READ's reply is one `writev`), from the
//! adversarial review of its first form (a reader thread running requests inline):
//! - `a_client_waiting_for_each_reply_gets_every_reply_from_the_connections_threads`: QD1,
//!   write, FLUSH and read back, each request run by a connection thread;
//! - `a_flush_covers_every_write_replied_before_it_was_sent`: FLUSH against writes still
//!   running on other threads;
//! - `every_pipelined_request_of_every_kind_gets_one_reply_with_its_cookie`: errors included;
//! - `a_backend_error_on_the_reader_thread_and_on_a_worker_is_an_error_reply`;
//! - `the_in_flight_budget_balances_after_errors_disconnects_and_disc`: the shared budget of
//!   256 MiB is whole again after every kind of request, error, DISC and a client vanishing
//!   mid-payload and mid-reply (8 READs of 32 MiB then hold it all, a ninth waits);
//! - `a_32mib_read_reply_reaches_a_slow_reader_intact` (the `writev` advancing);
//! - `a_client_that_half_closes_after_disc_gets_every_reply`;
//! - `replies_racing_the_readers_busy_check_keep_their_order_and_data`;
//! - `a_request_sent_while_the_reader_runs_a_slow_one_is_not_held_behind_it` (failed with the
//!   inline reader: a request arriving while it ran a lone slow one waited for all of it).

use std::collections::{HashMap, HashSet};
use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};
use tiercache_frontend::{ByteIo, Errno};
use tiercache_nbd::proto::*;
use tiercache_nbd::{serve, Config, Listener};

mod common;
use common::*;

/// 40 MiB: room for a 32 MiB read at `GATE`.
const SIZE: u64 = 40 << 20;
/// Reads at this offset wait while the gate is shut.
const GATE: u64 = 8 << 20;
/// Reads at this offset fail with EIO.
const FAILING: u64 = 4 << 20;
/// Reads at this offset take `SLOW` (a cache miss on a disk).
const SLOW_AT: u64 = 6 << 20;
const SLOW: Duration = Duration::from_millis(400);

/// A RAM disk: reads at `GATE` wait while the gate is shut (counted when they start), reads
/// at `FAILING` fail, writes take a pseudo-random few hundred microseconds (so workers finish
/// out of order) and are logged in completion order; a flush notes how much of that log it
/// covers (everything completed before it began).
struct Disk {
    data: Mutex<Vec<u8>>,
    gate_open: Mutex<bool>,
    gate: Condvar,
    gated: AtomicUsize,
    completed: Mutex<Vec<u64>>,
    durable_upto: AtomicUsize,
    writes: AtomicU64,
}

impl Disk {
    fn new() -> Arc<Disk> {
        let data: Vec<u8> = (0..SIZE).map(|i| (i / 4096 % 251) as u8 ^ (i % 7) as u8).collect();
        Arc::new(Disk {
            data: Mutex::new(data),
            gate_open: Mutex::new(true),
            gate: Condvar::new(),
            gated: AtomicUsize::new(0),
            completed: Mutex::new(Vec::new()),
            durable_upto: AtomicUsize::new(0),
            writes: AtomicU64::new(0),
        })
    }

    fn shut_gate(&self) {
        *self.gate_open.lock().unwrap() = false;
    }

    fn open_gate(&self) {
        *self.gate_open.lock().unwrap() = true;
        self.gate.notify_all();
    }

    fn expected(&self, offset: u64, len: usize) -> Vec<u8> {
        self.data.lock().unwrap()[offset as usize..offset as usize + len].to_vec()
    }
}

impl ByteIo for Disk {
    fn size_bytes(&self) -> u64 {
        SIZE
    }
    fn block_size(&self) -> u32 {
        4096
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), Errno> {
        if offset == FAILING {
            return Err(Errno::EIO);
        }
        if offset == SLOW_AT {
            std::thread::sleep(SLOW);
        }
        if offset == GATE {
            self.gated.fetch_add(1, Ordering::SeqCst);
            let open = self.gate_open.lock().unwrap();
            let (open, _) = self.gate.wait_timeout_while(open, Duration::from_secs(60), |o| !*o).unwrap();
            assert!(*open, "the gate stayed shut for a minute");
        }
        let d = self.data.lock().unwrap();
        buf.copy_from_slice(&d[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> Result<(), Errno> {
        let n = self.writes.fetch_add(1, Ordering::SeqCst);
        std::thread::sleep(Duration::from_micros(n.wrapping_mul(2_654_435_761) % 400));
        self.data.lock().unwrap()[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        self.completed.lock().unwrap().push(offset);
        Ok(())
    }
    fn flush(&self) -> Result<(), Errno> {
        let covered = self.completed.lock().unwrap().len();
        self.durable_upto.fetch_max(covered, Ordering::SeqCst);
        Ok(())
    }
    fn trim(&self, _offset: u64, _len: u64) -> Result<(), Errno> {
        Ok(())
    }
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), Errno> {
        self.write(offset, &vec![0; len as usize], fua)
    }
}

struct Server {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
    connections: Arc<AtomicUsize>,
    sock: PathBuf,
    _dir: tempfile::TempDir,
}

impl Server {
    fn start(disk: Arc<Disk>) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("s");
        let listener = UnixListener::bind(&sock).unwrap();
        let stop = Arc::new(AtomicBool::new(false));
        let config = Config::default();
        let connections = Arc::clone(&config.connections);
        let s2 = Arc::clone(&stop);
        let thread = std::thread::spawn(move || serve(Listener::Unix(listener), disk, config, s2).unwrap());
        Server { stop, thread: Some(thread), connections, sock, _dir: dir }
    }

    fn connect(&self) -> UnixStream {
        connect(&self.sock)
    }

    /// Waits until the server has no client connection left (their threads ended).
    fn wait_idle(&self) {
        let deadline = Instant::now() + Duration::from_secs(30);
        while self.connections.load(Ordering::SeqCst) != 0 {
            assert!(Instant::now() < deadline, "connections never ended");
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// A client past the handshake, with a read timeout.
fn connect(sock: &Path) -> UnixStream {
    let c = UnixStream::connect(sock).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    handshake(c)
}

#[test]
fn a_client_waiting_for_each_reply_gets_every_reply_from_the_connections_threads() {
    let disk = Disk::new();
    let server = Server::start(Arc::clone(&disk));
    let mut c = connect(&server.sock);
    for i in 0..20u64 {
        c.write_all(&write_request(i, i * 4096, &[i as u8; 4096])).unwrap();
        assert_eq!(reply_header(&mut c), (0, i));
        c.write_all(&request(CMD_FLUSH, 100 + i, 0, 0)).unwrap();
        assert_eq!(reply_header(&mut c), (0, 100 + i));
        c.write_all(&request(CMD_READ, 200 + i, i * 4096, 4096)).unwrap();
        assert_eq!(reply_header(&mut c), (0, 200 + i));
        assert_eq!(read_payload(&mut c, 4096), vec![i as u8; 4096], "read back block {i}");
    }
    assert_eq!(disk.durable_upto.load(Ordering::SeqCst), 20, "each FLUSH covered the writes before it");
}

/// A FLUSH must cover every write whose reply the client had received when it sent the
/// FLUSH, whether the FLUSH runs on the reader (nothing else under way) or on a worker beside
/// writes still running. A sender pipelines writes and, now and then, a FLUSH naming the
/// writes replied so far; the receiver checks them against what the flush covered.
#[test]
fn a_flush_covers_every_write_replied_before_it_was_sent() {
    let disk = Disk::new();
    let server = Server::start(Arc::clone(&disk));
    let c = server.connect();
    let mut rx = c.try_clone().unwrap();
    let mut tx = c;
    let replied: Arc<Mutex<HashSet<u64>>> = Arc::default();
    let flushes: Arc<Mutex<HashMap<u64, Vec<u64>>>> = Arc::default();
    let outstanding = Arc::new(AtomicUsize::new(0));
    const WRITES: u64 = 600;
    let sender = {
        let (replied, flushes, outstanding) = (Arc::clone(&replied), Arc::clone(&flushes), Arc::clone(&outstanding));
        std::thread::spawn(move || {
            let mut flush_cookie = 1u64 << 40;
            for i in 0..WRITES {
                outstanding.fetch_add(1, Ordering::SeqCst);
                tx.write_all(&write_request(i, i * 4096, &[i as u8; 4096])).unwrap();
                if i % 10 == 9 {
                    if i % 30 == 29 {
                        // Everything replied first: this FLUSH runs on the reader thread.
                        while outstanding.load(Ordering::SeqCst) != 0 {
                            std::thread::yield_now();
                        }
                    }
                    let covered: Vec<u64> = replied.lock().unwrap().iter().copied().collect();
                    flushes.lock().unwrap().insert(flush_cookie, covered);
                    outstanding.fetch_add(1, Ordering::SeqCst);
                    tx.write_all(&request(CMD_FLUSH, flush_cookie, 0, 0)).unwrap();
                    flush_cookie += 1;
                }
            }
        })
    };
    let mut flushes_checked = 0;
    let total = WRITES + WRITES / 10;
    for _ in 0..total {
        let (error, cookie) = reply_header(&mut rx);
        assert_eq!(error, 0, "request {cookie}");
        if cookie >= 1 << 40 {
            // Several FLUSHes may be outstanding: each covers at least its own snapshot.
            let covered = flushes.lock().unwrap().remove(&cookie).expect("a FLUSH sent");
            let durable: HashSet<u64> = {
                let log = disk.completed.lock().unwrap();
                log[..disk.durable_upto.load(Ordering::SeqCst)].iter().copied().collect()
            };
            for w in covered {
                assert!(
                    durable.contains(&(w * 4096)),
                    "write {w} was replied before FLUSH {cookie} was sent, not covered"
                );
            }
            flushes_checked += 1;
        } else {
            replied.lock().unwrap().insert(cookie);
        }
        outstanding.fetch_sub(1, Ordering::SeqCst);
    }
    sender.join().unwrap();
    assert_eq!(flushes_checked, WRITES / 10);
    for i in (0..WRITES).step_by(37) {
        assert_eq!(disk.expected(i * 4096, 4096), vec![i as u8; 4096], "block {i}");
    }
}

/// Hundreds of requests of every kind, valid and not, sent in one go: each gets exactly one
/// reply, with its cookie and the right error, and a READ's data is its own.
#[test]
fn every_pipelined_request_of_every_kind_gets_one_reply_with_its_cookie() {
    let disk = Disk::new();
    let server = Server::start(Arc::clone(&disk));
    let mut c = server.connect();
    // (cookie -> (expected error, READ length, READ offset))
    let mut expect: HashMap<u64, (u32, usize, u64)> = HashMap::new();
    let mut all = Vec::new();
    let region = 16u64 << 20; // writes go to 16 MiB..., reads read 0.. (never written)
    for i in 0..400u64 {
        let cookie = i + 1;
        let k = i % 12;
        match k {
            0 => {
                all.extend(request(CMD_READ, cookie, i * 512, 8192));
                expect.insert(cookie, (0, 8192, i * 512));
            }
            1 => {
                all.extend(write_request(cookie, region + i * 4096, &[i as u8; 4096]));
                expect.insert(cookie, (0, 0, 0));
            }
            2 => {
                all.extend(request(CMD_FLUSH, cookie, 0, 0));
                expect.insert(cookie, (0, 0, 0));
            }
            3 => {
                all.extend(request(CMD_TRIM, cookie, region + i * 4096, 4096));
                expect.insert(cookie, (0, 0, 0));
            }
            4 => {
                all.extend(request(CMD_WRITE_ZEROES, cookie, region + i * 4096, 4096));
                expect.insert(cookie, (0, 0, 0));
            }
            5 => {
                all.extend(request(CMD_READ, cookie, SIZE - 4096, 8192));
                expect.insert(cookie, (EINVAL, 0, 0));
            }
            6 => {
                all.extend(request(CMD_READ, cookie, 0, MAX_REQUEST_BYTES + 1));
                expect.insert(cookie, (EOVERFLOW, 0, 0));
            }
            7 => {
                all.extend(write_request(cookie, SIZE - 512, &[1u8; 4096]));
                expect.insert(cookie, (ENOSPC, 0, 0));
            }
            8 => {
                let mut r = request_flags(CMD_WRITE, 1 << 7, cookie, region, 4096);
                r.extend_from_slice(&[9u8; 4096]);
                all.extend(r);
                expect.insert(cookie, (EINVAL, 0, 0));
            }
            9 => {
                all.extend(request(99, cookie, 0, 0));
                expect.insert(cookie, (EINVAL, 0, 0));
            }
            10 => {
                all.extend(request(CMD_READ, cookie, FAILING, 4096));
                expect.insert(cookie, (EIO, 0, 0));
            }
            _ => {
                all.extend(request_flags(CMD_WRITE_ZEROES, CMD_FLAG_FUA, cookie, region + i * 4096, 8192));
                expect.insert(cookie, (0, 0, 0));
            }
        }
    }
    let mut tx = c.try_clone().unwrap();
    let sender = std::thread::spawn(move || tx.write_all(&all).unwrap());
    for _ in 0..400 {
        let (error, cookie) = reply_header(&mut c);
        let (want, len, offset) =
            expect.remove(&cookie).unwrap_or_else(|| panic!("a second or unknown reply {cookie}"));
        assert_eq!(error, want, "request {cookie}");
        if error == 0 && len > 0 {
            assert_eq!(read_payload(&mut c, len), disk.expected(offset, len), "READ {cookie}'s data");
        }
    }
    sender.join().unwrap();
    assert!(expect.is_empty());
    c.write_all(&request(CMD_READ, 7777, 0, 4096)).unwrap();
    assert_eq!(reply_header(&mut c), (0, 7777), "the connection still works");
    assert_eq!(read_payload(&mut c, 4096), disk.expected(0, 4096));
}

/// A backend error on the reader thread (a lone request) and on a worker (pipelined) is an
/// error reply without data, and the connection carries on.
#[test]
fn a_backend_error_on_the_reader_thread_and_on_a_worker_is_an_error_reply() {
    let disk = Disk::new();
    let server = Server::start(Arc::clone(&disk));
    let mut c = server.connect();
    for round in 0..50u64 {
        c.write_all(&request(CMD_READ, round, FAILING, 65536)).unwrap();
        assert_eq!(reply_header(&mut c), (EIO, round));
        let mut both = request(CMD_READ, 1000 + round, FAILING, 4096);
        both.extend(request(CMD_READ, 2000 + round, 4096, 4096));
        c.write_all(&both).unwrap();
        let mut got = HashMap::new();
        for _ in 0..2 {
            let (e, cookie) = reply_header(&mut c);
            if e == 0 {
                assert_eq!(read_payload(&mut c, 4096), disk.expected(4096, 4096));
            }
            got.insert(cookie, e);
        }
        assert_eq!(got, HashMap::from([(1000 + round, EIO), (2000 + round, 0)]));
    }
}

/// The in-flight budget (256 MiB shared by every connection) must be whole again after
/// every kind of request has come and gone: errors, DISC with requests queued, a client that
/// vanishes in the middle of a WRITE's payload or before reading a 32 MiB reply, on the
/// reader thread and on workers. A leak would slowly block every connection. Measured at
/// the end: 8 READs of 32 MiB (on 8 connections) must all start, a ninth must wait.
#[test]
fn the_in_flight_budget_balances_after_errors_disconnects_and_disc() {
    let disk = Disk::new();
    let server = Server::start(Arc::clone(&disk));
    let big = MAX_REQUEST_BYTES;
    for round in 0..3u64 {
        // Errors of every kind, lone and pipelined, then DISC with the rest still queued.
        let mut c = server.connect();
        let mut all = Vec::new();
        all.extend(request(CMD_READ, 1, SIZE, 4096));
        all.extend(request(CMD_READ, 2, 0, big + 4096));
        all.extend(write_request(3, SIZE - 4096, &vec![0u8; 8192]));
        all.extend({
            let mut r = request_flags(CMD_WRITE, 1 << 9, 4, 0, 4096);
            r.extend_from_slice(&[0u8; 4096]);
            r
        });
        all.extend(request(42, 5, 0, 0));
        all.extend(request(CMD_READ, 6, FAILING, 1 << 20));
        for i in 0..20u64 {
            all.extend(request(CMD_READ, 10 + i, i << 20, 1 << 20));
            all.extend(write_request(100 + i, (16 << 20) + (i << 16), &vec![i as u8; 1 << 16]));
        }
        all.extend(request(CMD_DISC, 999, 0, 0));
        // (Sent from another thread: a client that reads no reply until it has sent 20 MiB
        // of requests would deadlock against the replies filling the socket.)
        let mut tx = c.try_clone().unwrap();
        let sender = std::thread::spawn(move || tx.write_all(&all).unwrap());
        for _ in 0..46 {
            let (e, cookie) = reply_header(&mut c);
            if e == 0 && (10..30).contains(&cookie) {
                read_payload(&mut c, 1 << 20);
            }
        }
        sender.join().unwrap();
        let mut rest = Vec::new();
        c.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty(), "nothing after the replies, and no reply to DISC");
        // Lone requests on the reader thread, each kind, one by one.
        let mut c = server.connect();
        for (k, r) in [
            request(CMD_READ, 1, 0, 1 << 20),
            write_request(2, 16 << 20, &[5u8; 4096]),
            request(CMD_FLUSH, 3, 0, 0),
            request(CMD_TRIM, 4, 16 << 20, 4096),
            request(CMD_WRITE_ZEROES, 5, 16 << 20, 4096),
            request(CMD_READ, 6, FAILING, 4096),
            request(CMD_READ, 7, SIZE, 4096),
        ]
        .into_iter()
        .enumerate()
        {
            c.write_all(&r).unwrap();
            let (e, cookie) = reply_header(&mut c);
            assert_eq!(cookie, k as u64 + 1);
            if k == 0 {
                read_payload(&mut c, 1 << 20);
            }
            assert_eq!(e != 0, k >= 5, "request {cookie}: error {e}");
        }
        c.write_all(&request(CMD_DISC, 8, 0, 0)).unwrap();
        drop(c);
        // A client gone in the middle of a 32 MiB WRITE's payload.
        let mut c = server.connect();
        let mut r = request(CMD_WRITE, 1, 0, big);
        r.extend(vec![7u8; 1 << 20]);
        c.write_all(&r).unwrap();
        drop(c);
        // A client gone before reading a lone 32 MiB READ's reply (reader thread), and one
        // gone with 4 pipelined 8 MiB READs (workers).
        let mut c = server.connect();
        c.write_all(&request(CMD_READ, 1, 0, big)).unwrap();
        std::thread::sleep(Duration::from_millis(20 * round));
        drop(c);
        let mut c = server.connect();
        let mut all = Vec::new();
        for i in 0..4 {
            all.extend(request(CMD_READ, i, i << 23, 8 << 20));
        }
        c.write_all(&all).unwrap();
        let _ = reply_header(&mut c);
        drop(c);
        // A client that breaks framing with requests still queued.
        let mut c = server.connect();
        let mut all = Vec::new();
        for i in 0..6 {
            all.extend(request(CMD_READ, i, i << 20, 1 << 20));
        }
        all.extend([0xFFu8; 28]);
        c.write_all(&all).unwrap();
        drop(c);
    }
    server.wait_idle();
    // All 256 MiB: eight 32 MiB READs held at the gate at once, on eight connections.
    disk.shut_gate();
    let before = disk.gated.load(Ordering::SeqCst);
    let mut held: Vec<UnixStream> = Vec::new();
    for i in 0..8u64 {
        let mut c = server.connect();
        c.write_all(&request(CMD_READ, i, GATE, big)).unwrap();
        held.push(c);
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while disk.gated.load(Ordering::SeqCst) - before < 8 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(10));
    }
    let started = disk.gated.load(Ordering::SeqCst) - before;
    // (The test measures the budget: a ninth does not fit.)
    let mut ninth = server.connect();
    ninth.write_all(&request(CMD_READ, 8, GATE, big)).unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let with_ninth = disk.gated.load(Ordering::SeqCst) - before;
    disk.open_gate();
    held.push(ninth);
    let want = disk.expected(GATE, big as usize);
    for (i, c) in held.iter_mut().enumerate() {
        assert_eq!(reply_header(c), (0, i as u64));
        assert!(read_payload(c, big as usize) == want, "READ {i}'s data");
    }
    assert_eq!(started, 8, "only {started} of 8 READs of 32 MiB fit in the 256 MiB budget: it leaked");
    assert_eq!(with_ninth, 8, "a ninth 32 MiB READ started: the budget is not 256 MiB");
}

/// A 32 MiB READ reply to a client that reads it slowly, in small pieces, through a small
/// socket buffer: the `writev` is taken a piece at a time and every byte arrives in order.
/// On the reader thread (a lone READ) and on a worker (two pipelined).
#[test]
fn a_32mib_read_reply_reaches_a_slow_reader_intact() {
    let disk = Disk::new();
    let server = Server::start(Arc::clone(&disk));
    let mut c = server.connect();
    let big = MAX_REQUEST_BYTES as usize;
    let slow_read = |c: &mut UnixStream, n: usize| {
        let mut out = vec![0u8; n];
        let mut at = 0;
        let mut k = 0u64;
        while at < n {
            let piece = (1 + (k * 7919) % 6000) as usize;
            let got = c.read(&mut out[at..(at + piece).min(n)]).unwrap();
            assert!(got > 0, "EOF inside a reply");
            at += got;
            k += 1;
            if k.is_multiple_of(512) {
                std::thread::sleep(Duration::from_millis(1));
            }
        }
        out
    };
    c.write_all(&request(CMD_READ, 1, 1234, big as u32)).unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(reply_header(&mut c), (0, 1));
    assert!(slow_read(&mut c, big) == disk.expected(1234, big), "lone READ's data");
    let mut two = request(CMD_READ, 2, 0, big as u32);
    two.extend(request(CMD_READ, 3, 5 << 20, big as u32));
    c.write_all(&two).unwrap();
    for _ in 0..2 {
        let (e, cookie) = reply_header(&mut c);
        assert_eq!(e, 0);
        let offset = if cookie == 2 { 0 } else { 5 << 20 };
        assert!(slow_read(&mut c, big) == disk.expected(offset, big), "READ {cookie}'s data");
    }
}

/// A client that sends its requests, then DISC, then shuts down its sending side and reads:
/// every request is done and replied to, then the server closes.
#[test]
fn a_client_that_half_closes_after_disc_gets_every_reply() {
    let disk = Disk::new();
    let server = Server::start(Arc::clone(&disk));
    for round in 0..20u64 {
        let mut c = server.connect();
        let mut all = Vec::new();
        let n = 1 + round % 5 * 10;
        for i in 0..n {
            all.extend(write_request(i, (16 << 20) + i * 4096, &[(round + i) as u8; 4096]));
        }
        all.extend(request(CMD_DISC, 0, 0, 0));
        c.write_all(&all).unwrap();
        c.shutdown(std::net::Shutdown::Write).unwrap();
        let mut seen = HashSet::new();
        for _ in 0..n {
            let (e, cookie) = reply_header(&mut c);
            assert_eq!(e, 0);
            assert!(seen.insert(cookie));
        }
        let mut rest = Vec::new();
        c.read_to_end(&mut rest).unwrap();
        assert!(rest.is_empty());
        for i in 0..n {
            assert_eq!(disk.expected((16 << 20) + i * 4096, 1)[0], (round + i) as u8, "round {round} write {i}");
        }
    }
}

/// A worker's `busy` decrement races the reader's check: pipelined pairs (on workers), each
/// followed at once by a lone request (on the reader, or on a worker if one is still
/// finishing), thousands of times; every reply carries its own cookie and data.
#[test]
fn replies_racing_the_readers_busy_check_keep_their_order_and_data() {
    let disk = Disk::new();
    let server = Server::start(Arc::clone(&disk));
    let mut c = server.connect();
    for i in 0..1500u64 {
        let b = i % 1000;
        let mut pair = write_request(2 * i, (16 << 20) + b * 4096, &[i as u8; 4096]);
        pair.extend(request(CMD_READ, 2 * i + 1, b * 4096, 4096));
        c.write_all(&pair).unwrap();
        let mut got = HashSet::new();
        for _ in 0..2 {
            let (e, cookie) = reply_header(&mut c);
            assert_eq!(e, 0);
            if cookie == 2 * i + 1 {
                assert_eq!(read_payload(&mut c, 4096), disk.expected(b * 4096, 4096));
            }
            got.insert(cookie);
        }
        assert_eq!(got, HashSet::from([2 * i, 2 * i + 1]));
        c.write_all(&request(CMD_READ, (1 << 32) | i, (16 << 20) + b * 4096, 4096)).unwrap();
        assert_eq!(reply_header(&mut c), (0, (1 << 32) | i));
        assert_eq!(read_payload(&mut c, 4096), vec![i as u8; 4096], "the write replied before is read back");
    }
}

/// A lone slow request (a 400 ms read: a cache miss on a busy disk) runs on the reader
/// thread; a request the client sends 50 ms later, while it runs (a client at queue depth 2
/// whose requests arrive a little apart, as blk-mq sends them), must not wait for it: the
/// server's own rule is that "requests a client pipelines run side by side", and before the
/// fast path a worker took it at once. With the fast path the reader does not read it until
/// the slow one is done: it waits about 350 ms for a 4 KiB read of RAM.
///
/// (Since the followers join only once a client is seen pipelining, this holds from then on:
/// the client here first sends two READs together. The very first overlap of a connection
/// whose client had waited for every reply until then waits once, as
/// `the_first_overlap_waits_once_then_the_followers_join` shows.)
#[test]
fn a_request_sent_while_the_reader_runs_a_slow_one_is_not_held_behind_it() {
    let disk = Disk::new();
    let server = Server::start(Arc::clone(&disk));
    let mut c = server.connect();
    pipeline_two_reads(&mut c, &disk);
    c.write_all(&request(CMD_READ, 1, SLOW_AT, 4096)).unwrap();
    std::thread::sleep(Duration::from_millis(50));
    let sent = Instant::now();
    c.write_all(&request(CMD_READ, 2, 0, 4096)).unwrap();
    let mut order = Vec::new();
    let mut quick_took = Duration::ZERO;
    for _ in 0..2 {
        let (e, cookie) = reply_header(&mut c);
        assert_eq!(e, 0);
        let offset = if cookie == 1 { SLOW_AT } else { 0 };
        assert_eq!(read_payload(&mut c, 4096), disk.expected(offset, 4096));
        if cookie == 2 {
            quick_took = sent.elapsed();
        }
        order.push(cookie);
    }
    eprintln!("replies in order {order:?}; the quick READ sent during the slow one took {quick_took:?}");
    assert!(
        quick_took < Duration::from_millis(150),
        "a READ sent while a slow lone request ran on the reader thread waited {quick_took:?} for it"
    );
}

/// Two READs sent together (the client pipelines), both replies read.
fn pipeline_two_reads(c: &mut std::os::unix::net::UnixStream, disk: &Disk) {
    let mut pair = request(CMD_READ, 100, 4096, 4096);
    pair.extend(request(CMD_READ, 101, 8192, 4096));
    c.write_all(&pair).unwrap();
    for _ in 0..2 {
        let (e, cookie) = reply_header(c);
        assert_eq!(e, 0);
        assert_eq!(read_payload(c, 4096), disk.expected(if cookie == 100 { 4096 } else { 8192 }, 4096));
    }
}

/// A connection whose client has waited for every reply is served by its first thread alone
/// (no hand-off to a follower that would wake for nothing). The first request it sends while
/// another runs is therefore read only when that one is done; the connection then counts as
/// pipelining for good, and a request sent during the next slow one is not held behind it.
#[test]
fn the_first_overlap_waits_once_then_the_followers_join() {
    let disk = Disk::new();
    let server = Server::start(Arc::clone(&disk));
    let mut c = server.connect();
    let mut quick_took = Vec::new();
    for round in 0..2u64 {
        c.write_all(&request(CMD_READ, 10 * round + 1, SLOW_AT, 4096)).unwrap();
        std::thread::sleep(Duration::from_millis(50));
        let sent = Instant::now();
        c.write_all(&request(CMD_READ, 10 * round + 2, 0, 4096)).unwrap();
        for _ in 0..2 {
            let (e, cookie) = reply_header(&mut c);
            assert_eq!(e, 0);
            let offset = if cookie == 10 * round + 1 { SLOW_AT } else { 0 };
            assert_eq!(read_payload(&mut c, 4096), disk.expected(offset, 4096));
            if cookie == 10 * round + 2 {
                quick_took.push(sent.elapsed());
            }
        }
    }
    eprintln!("the quick READ sent during the slow one took {quick_took:?} (first overlap, then the next)");
    assert!(quick_took[0] >= Duration::from_millis(200), "the first overlap was not held: {quick_took:?}");
    assert!(quick_took[1] < Duration::from_millis(150), "the second overlap was held too: {quick_took:?}");
}
