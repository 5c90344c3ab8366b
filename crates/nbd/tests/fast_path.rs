//! The NBD server's request threads (issue 9): leader and followers. Each of a connection's
//! threads reads a request and runs it itself (no hand-off), so a client waiting for each
//! reply is answered by whichever thread read its request, and requests a client pipelines
//! run side by side.

use std::io::{Read, Write};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Condvar, Mutex};
use std::time::Duration;
use tiercache_frontend::{ByteIo, Errno};
use tiercache_nbd::{serve, Config, Listener};

const SIZE: u64 = 1 << 20;

/// A RAM disk that notes which thread ran each request, and can hold a read at offset 0 until
/// a read at offset 4096 has begun (a request that only completes if another runs beside it).
#[derive(Default)]
struct Probe {
    data: Mutex<Vec<u8>>,
    threads: Mutex<Vec<String>>,
    second_started: Mutex<bool>,
    started: Condvar,
    hold_first_read: AtomicBool,
}

impl Probe {
    fn note(&self) {
        let name = std::thread::current().name().unwrap_or("").to_string();
        self.threads.lock().unwrap().push(name);
    }
}

impl ByteIo for Probe {
    fn size_bytes(&self) -> u64 {
        SIZE
    }
    fn block_size(&self) -> u32 {
        4096
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), Errno> {
        self.note();
        if offset == 4096 {
            *self.second_started.lock().unwrap() = true;
            self.started.notify_all();
        }
        if offset == 0 && self.hold_first_read.load(std::sync::atomic::Ordering::SeqCst) {
            let started = self.second_started.lock().unwrap();
            let (started, _) = self.started.wait_timeout_while(started, Duration::from_secs(5), |s| !*s).unwrap();
            if !*started {
                return Err(Errno::EIO);
            }
        }
        let d = self.data.lock().unwrap();
        buf.copy_from_slice(&d[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> Result<(), Errno> {
        self.note();
        self.data.lock().unwrap()[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        Ok(())
    }
    fn flush(&self) -> Result<(), Errno> {
        self.note();
        Ok(())
    }
    fn trim(&self, _offset: u64, _len: u64) -> Result<(), Errno> {
        self.note();
        Ok(())
    }
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), Errno> {
        self.write(offset, &vec![0; len as usize], fua)
    }
}

/// A server on a Unix socket in a temporary directory, and a client past the handshake.
fn start(probe: Arc<Probe>) -> (UnixStream, Arc<AtomicBool>, std::thread::JoinHandle<()>, tempfile::TempDir) {
    probe.data.lock().unwrap().resize(SIZE as usize, 0);
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s");
    let listener = UnixListener::bind(&sock).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let s2 = Arc::clone(&stop);
    let server = std::thread::spawn(move || serve(Listener::Unix(listener), probe, Config::default(), s2).unwrap());
    let mut c = UnixStream::connect(&sock).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut hello = [0u8; 18];
    c.read_exact(&mut hello).unwrap();
    c.write_all(&3u32.to_be_bytes()).unwrap(); // fixed newstyle, no zeroes
    let mut opt = b"IHAVEOPT".to_vec();
    opt.extend_from_slice(&7u32.to_be_bytes()); // GO
    opt.extend_from_slice(&6u32.to_be_bytes());
    opt.extend_from_slice(&[0; 6]); // name "", no info requests
    c.write_all(&opt).unwrap();
    loop {
        let mut h = [0u8; 20];
        c.read_exact(&mut h).unwrap();
        let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let mut d = vec![0u8; u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize];
        c.read_exact(&mut d).unwrap();
        if kind == 1 {
            return (c, stop, server, dir);
        }
    }
}

fn request(kind: u16, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut r = 0x2560_9513u32.to_be_bytes().to_vec();
    r.extend_from_slice(&0u16.to_be_bytes());
    r.extend_from_slice(&kind.to_be_bytes());
    r.extend_from_slice(&cookie.to_be_bytes());
    r.extend_from_slice(&offset.to_be_bytes());
    r.extend_from_slice(&len.to_be_bytes());
    r
}

/// Reads one simple reply (and `data` bytes after it): (error, cookie).
fn reply(c: &mut UnixStream, data: usize) -> (u32, u64, Vec<u8>) {
    let mut h = [0u8; 16];
    c.read_exact(&mut h).unwrap();
    assert_eq!(u32::from_be_bytes(h[..4].try_into().unwrap()), 0x6744_6698);
    let error = u32::from_be_bytes(h[4..8].try_into().unwrap());
    let mut d = vec![0u8; if error == 0 { data } else { 0 }];
    c.read_exact(&mut d).unwrap();
    (error, u64::from_be_bytes(h[8..].try_into().unwrap()), d)
}

#[test]
fn a_client_waiting_for_each_reply_gets_every_reply_from_the_connections_threads() {
    let probe = Arc::new(Probe::default());
    let (mut c, stop, server, _dir) = start(Arc::clone(&probe));
    for i in 0..20u64 {
        let mut w = request(1, i, i * 4096, 4096);
        w.extend_from_slice(&[i as u8; 4096]);
        c.write_all(&w).unwrap();
        assert_eq!(reply(&mut c, 0), (0, i, vec![]));
        c.write_all(&request(3, 100 + i, 0, 0)).unwrap(); // FLUSH
        assert_eq!(reply(&mut c, 0).0, 0);
        c.write_all(&request(0, 200 + i, i * 4096, 4096)).unwrap();
        let (e, cookie, data) = reply(&mut c, 4096);
        assert_eq!((e, cookie), (0, 200 + i));
        assert_eq!(data, vec![i as u8; 4096], "read back block {i}");
    }
    let threads = probe.threads.lock().unwrap().clone();
    assert_eq!(threads.len(), 60);
    assert!(threads.iter().all(|t| t == "nbd-conn"), "requests ran outside the connection's threads: {threads:?}");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    drop(c);
    server.join().unwrap();
}

#[test]
fn requests_a_client_pipelines_still_run_side_by_side() {
    let probe = Arc::new(Probe::default());
    probe.hold_first_read.store(true, std::sync::atomic::Ordering::SeqCst);
    let (mut c, stop, server, _dir) = start(Arc::clone(&probe));
    // Both requests in one write: the first completes only once the second has begun, so
    // running the first on the connection's thread before reading the second would fail it.
    let mut both = request(0, 1, 0, 4096);
    both.extend_from_slice(&request(0, 2, 4096, 4096));
    c.write_all(&both).unwrap();
    let mut cookies = [reply(&mut c, 4096), reply(&mut c, 4096)];
    cookies.sort_by_key(|r| r.1);
    assert_eq!((cookies[0].0, cookies[0].1), (0, 1), "the first read failed: it waited alone");
    assert_eq!((cookies[1].0, cookies[1].1), (0, 2));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    drop(c);
    server.join().unwrap();
}
