//! The NBD wire format as these tests speak it: requests framed by hand, replies parsed by
//! hand (the server's own encoder is what they check).
#![allow(dead_code)]

use std::io::{Read, Write};
use tiercache_nbd::proto::*;

pub fn request_flags(kind: u16, flags: u16, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
    let mut r = REQUEST_MAGIC.to_be_bytes().to_vec();
    r.extend_from_slice(&flags.to_be_bytes());
    r.extend_from_slice(&kind.to_be_bytes());
    r.extend_from_slice(&cookie.to_be_bytes());
    r.extend_from_slice(&offset.to_be_bytes());
    r.extend_from_slice(&len.to_be_bytes());
    r
}

pub fn request(kind: u16, cookie: u64, offset: u64, len: u32) -> Vec<u8> {
    request_flags(kind, 0, cookie, offset, len)
}

pub fn write_request(cookie: u64, offset: u64, data: &[u8]) -> Vec<u8> {
    let mut r = request(CMD_WRITE, cookie, offset, data.len() as u32);
    r.extend_from_slice(data);
    r
}

/// One simple reply header: (error, cookie).
pub fn reply_header(c: &mut impl Read) -> (u32, u64) {
    let mut h = [0u8; 16];
    c.read_exact(&mut h).unwrap();
    assert_eq!(u32::from_be_bytes(h[..4].try_into().unwrap()), SIMPLE_REPLY_MAGIC);
    (u32::from_be_bytes(h[4..8].try_into().unwrap()), u64::from_be_bytes(h[8..].try_into().unwrap()))
}

pub fn read_payload(c: &mut impl Read, n: usize) -> Vec<u8> {
    let mut d = vec![0u8; n];
    c.read_exact(&mut d).unwrap();
    d
}

/// A client past the handshake (fixed newstyle, no zeroes, GO on the default export).
pub fn handshake<S: Read + Write>(mut c: S) -> S {
    let mut hello = [0u8; 18];
    c.read_exact(&mut hello).unwrap();
    c.write_all(&3u32.to_be_bytes()).unwrap();
    let mut opt = b"IHAVEOPT".to_vec();
    opt.extend_from_slice(&OPT_GO.to_be_bytes());
    opt.extend_from_slice(&6u32.to_be_bytes());
    opt.extend_from_slice(&[0; 6]);
    c.write_all(&opt).unwrap();
    loop {
        let mut h = [0u8; 20];
        c.read_exact(&mut h).unwrap();
        let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let mut d = vec![0u8; u32::from_be_bytes(h[16..20].try_into().unwrap()) as usize];
        c.read_exact(&mut d).unwrap();
        if kind == REP_ACK {
            return c;
        }
    }
}

/// Serves `backend` with the default configuration on a Unix socket `s` in `dir` until the
/// returned flag is set (then join the thread).
pub fn start_in(
    backend: std::sync::Arc<dyn tiercache_frontend::ByteIo>,
    dir: &std::path::Path,
) -> (std::sync::Arc<std::sync::atomic::AtomicBool>, std::thread::JoinHandle<()>) {
    use tiercache_nbd::{serve, Config, Listener};
    let listener = std::os::unix::net::UnixListener::bind(dir.join("s")).unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s2 = std::sync::Arc::clone(&stop);
    let t = std::thread::spawn(move || serve(Listener::Unix(listener), backend, Config::default(), s2).unwrap());
    (stop, t)
}

/// A client of the server `start_in` started in `dir`, past the handshake, with a read
/// timeout of 30 s.
pub fn connect_in(dir: &std::path::Path) -> std::os::unix::net::UnixStream {
    let c = std::os::unix::net::UnixStream::connect(dir.join("s")).unwrap();
    c.set_read_timeout(Some(std::time::Duration::from_secs(30))).unwrap();
    handshake(c)
}

/// A backend of `size` bytes whose reads are `read` and whose writes, flushes, trims and
/// zeroings succeed and do nothing: for tests of the read path alone. (A test type: a real
/// `ByteIo` must never acknowledge a write it dropped.)
pub struct ReadOnly<F> {
    pub size: u64,
    pub read: F,
}

impl<F> tiercache_frontend::ByteIo for ReadOnly<F>
where
    F: Fn(u64, &mut [u8]) -> Result<(), tiercache_frontend::Errno> + Send + Sync + 'static,
{
    fn size_bytes(&self) -> u64 {
        self.size
    }
    fn block_size(&self) -> u32 {
        4096
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), tiercache_frontend::Errno> {
        (self.read)(offset, buf)
    }
    fn write(&self, _offset: u64, _data: &[u8], _fua: bool) -> Result<(), tiercache_frontend::Errno> {
        Ok(())
    }
    fn flush(&self) -> Result<(), tiercache_frontend::Errno> {
        Ok(())
    }
    fn trim(&self, _offset: u64, _len: u64) -> Result<(), tiercache_frontend::Errno> {
        Ok(())
    }
    fn write_zeroes(&self, _offset: u64, _len: u64, _fua: bool) -> Result<(), tiercache_frontend::Errno> {
        Ok(())
    }
}
