//! The NBD server writes a write ahead of its FLUSH (`ByteIo::write_ahead`) only for a client
//! that commits one write at a time and waits for each reply (a database's commit at queue
//! depth 1), only after the write's reply, and never for a stream of writes, FUA writes or a
//! client that pipelines.

use std::io::Write;
use std::os::unix::net::UnixStream;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tiercache_frontend::{ByteIo, Errno};
use tiercache_nbd::proto::*;

mod common;
use common::*;

const SIZE: u64 = 1 << 20;

/// A RAM disk that counts writes and the write aheads after them, noting for each write
/// ahead how many writes had completed.
#[derive(Default)]
struct Disk {
    data: Mutex<Vec<u8>>,
    writes: AtomicU64,
    aheads: Mutex<Vec<u64>>,
}

impl ByteIo for Disk {
    fn size_bytes(&self) -> u64 {
        SIZE
    }
    fn block_size(&self) -> u32 {
        4096
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), Errno> {
        let d = self.data.lock().unwrap();
        buf.copy_from_slice(&d[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8], _fua: bool) -> Result<(), Errno> {
        self.data.lock().unwrap()[offset as usize..offset as usize + data.len()].copy_from_slice(data);
        self.writes.fetch_add(1, Ordering::SeqCst);
        Ok(())
    }
    fn flush(&self) -> Result<(), Errno> {
        Ok(())
    }
    fn trim(&self, _offset: u64, _len: u64) -> Result<(), Errno> {
        Ok(())
    }
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), Errno> {
        self.write(offset, &vec![0; len as usize], fua)
    }
    fn write_ahead(&self) {
        self.aheads.lock().unwrap().push(self.writes.load(Ordering::SeqCst));
    }
}

/// Runs `client` against a fresh server; returns the disk's write aheads.
fn aheads_of(client: impl FnOnce(&mut UnixStream)) -> Vec<u64> {
    let dir = tempfile::tempdir().unwrap();
    let disk = Arc::new(Disk { data: Mutex::new(vec![0; SIZE as usize]), ..Disk::default() });
    let (stop, t) = start_in(Arc::clone(&disk) as Arc<dyn ByteIo>, dir.path());
    let mut c = connect_in(dir.path());
    client(&mut c);
    c.write_all(&request(CMD_DISC, 0, 0, 0)).unwrap();
    drop(c);
    stop.store(true, Ordering::SeqCst);
    t.join().unwrap();
    let a = disk.aheads.lock().unwrap().clone();
    a
}

fn write_and_wait(c: &mut UnixStream, cookie: u64, block: u64, flags: u16) {
    let mut req = request_flags(CMD_WRITE, flags, cookie, block * 4096, 4096);
    req.extend_from_slice(&[cookie as u8; 4096]);
    c.write_all(&req).unwrap();
    assert_eq!(reply_header(c), (0, cookie));
}

fn flush_and_wait(c: &mut UnixStream, cookie: u64) {
    c.write_all(&request(CMD_FLUSH, cookie, 0, 0)).unwrap();
    assert_eq!(reply_header(c), (0, cookie));
}

/// Write, FLUSH, write, FLUSH...: from the third write on (two commits seen), each write is
/// written ahead, after it completed.
#[test]
fn a_client_committing_one_write_at_a_time_has_its_writes_written_ahead() {
    let aheads = aheads_of(|c| {
        for i in 0..10 {
            write_and_wait(c, 2 * i, i, 0);
            flush_and_wait(c, 2 * i + 1);
        }
    });
    assert_eq!(aheads, (3..=10).collect::<Vec<_>>(), "a write ahead after each write from the third on");
}

/// Writes with no FLUSH after each (a copy, a bulk load), FUA writes, writes followed by a
/// read before their FLUSH: none is written ahead.
#[test]
fn writes_no_flush_follows_at_once_are_never_written_ahead() {
    let aheads = aheads_of(|c| {
        for i in 0..8 {
            write_and_wait(c, 3 * i, 2 * i, 0);
            write_and_wait(c, 3 * i + 1, 2 * i + 1, 0);
            flush_and_wait(c, 3 * i + 2);
        }
        for i in 0..6 {
            write_and_wait(c, 100 + 2 * i, i, CMD_FLAG_FUA);
            flush_and_wait(c, 101 + 2 * i);
        }
        for i in 0..6 {
            write_and_wait(c, 200 + 3 * i, i, 0);
            c.write_all(&request(CMD_READ, 201 + 3 * i, 0, 4096)).unwrap();
            assert_eq!(reply_header(c), (0, 201 + 3 * i));
            read_payload(c, 4096);
            flush_and_wait(c, 202 + 3 * i);
        }
    });
    assert!(aheads.is_empty(), "written ahead: {aheads:?}");
}

/// A client that pipelines (sends its FLUSH before the write's reply came): its requests
/// overlap anyway and group commit merges their records; no write is written ahead once
/// the server has seen it pipeline.
#[test]
fn a_pipelining_client_is_not_written_ahead() {
    let aheads = aheads_of(|c| {
        // Two commits at queue depth 1 start the pattern, then a READ sent with a FLUSH
        // behind it shows the pipelining.
        for i in 0..2 {
            write_and_wait(c, 2 * i, i, 0);
            flush_and_wait(c, 2 * i + 1);
        }
        let mut both = request(CMD_READ, 10, 0, 4096);
        both.extend(request(CMD_FLUSH, 11, 0, 0));
        c.write_all(&both).unwrap();
        let mut seen = Vec::new();
        for _ in 0..2 {
            let (err, cookie) = reply_header(c);
            assert_eq!(err, 0);
            if cookie == 10 {
                read_payload(c, 4096);
            }
            seen.push(cookie);
        }
        seen.sort_unstable();
        assert_eq!(seen, [10, 11]);
        for i in 0..10u64 {
            let mut req = request_flags(CMD_WRITE, 0, 100 + 2 * i, i * 4096, 4096);
            req.extend_from_slice(&[1; 4096]);
            req.extend(request(CMD_FLUSH, 101 + 2 * i, 0, 0));
            c.write_all(&req).unwrap();
            let mut got: Vec<u64> = (0..2).map(|_| reply_header(c)).map(|(e, k)| (assert_eq!(e, 0), k).1).collect();
            got.sort_unstable();
            assert_eq!(got, [100 + 2 * i, 101 + 2 * i]);
        }
    });
    assert!(aheads.is_empty(), "written ahead: {aheads:?}");
}
