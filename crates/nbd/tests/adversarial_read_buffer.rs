//! The NBD server's READ replies from reused, unzeroed huge buffers (`read_buffer`), from the
//! adversarial review of ab21ba3. The backend fills half a buffer with another client's bytes
//! and then fails (a device error mid-read) at `FAILS_MIDWAY`:
//! - `a_failed_read_replies_no_data_and_the_next_reply_carries_only_its_own_bytes`: at queue
//!   depth 1, a read larger than a huge page, small ones after it, the failing read (an error
//!   reply with no payload: the stream stays in step), the export's last byte, a read of 0
//!   bytes and one past the end;
//! - `pipelined_reads_on_every_connection_thread_never_carry_stale_bytes`: 300 pipelined reads
//!   of every size up to 3 MiB on the connection's threads, failing ones among them: every
//!   reply is matched by its cookie and holds exactly its range.

use std::collections::HashMap;
use std::io::Write;
use std::sync::Arc;
use tiercache_frontend::{ByteIo, Errno};
use tiercache_nbd::proto::*;

mod common;
use common::*;

const SIZE: u64 = 16 << 20;
/// Reads starting here write `STALE` over half their buffer, then fail.
const FAILS_MIDWAY: u64 = 5 << 20;
const STALE: u8 = 0xEE;

fn byte_at(i: u64) -> u8 {
    let b = (i / 3 % 241) as u8;
    if b == STALE {
        1
    } else {
        b
    }
}

/// Reads the pattern, except that a read at `FAILS_MIDWAY` scribbles and fails.
fn disk() -> Arc<dyn ByteIo> {
    Arc::new(ReadOnly {
        size: SIZE,
        read: |offset: u64, buf: &mut [u8]| {
            if offset == FAILS_MIDWAY {
                let half = buf.len() / 2;
                buf[..half].fill(STALE);
                return Err(Errno::EIO);
            }
            for (i, b) in buf.iter_mut().enumerate() {
                *b = byte_at(offset + i as u64);
            }
            Ok(())
        },
    })
}

fn expected(offset: u64, len: u32) -> Vec<u8> {
    (0..u64::from(len)).map(|i| byte_at(offset + i)).collect()
}

#[test]
fn a_failed_read_replies_no_data_and_the_next_reply_carries_only_its_own_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (stop, server) = start_in(disk(), dir.path());
    let mut c = connect_in(dir.path());
    // (offset, length, expected error)
    let reads: [(u64, u32, u32); 9] = [
        (4096, (3 << 20) + 512, 0),
        (1, 4096, 0),
        (FAILS_MIDWAY, 1 << 20, EIO),
        (8192, 1 << 20, 0),
        (FAILS_MIDWAY, 3 << 20, EIO),
        (SIZE - 1, 1, 0),
        (77, 0, 0),
        (SIZE - 10, 20, EINVAL),
        (12345, 2 << 20, 0),
    ];
    for (cookie, (offset, len, error)) in reads.into_iter().enumerate() {
        c.write_all(&request(CMD_READ, cookie as u64, offset, len)).unwrap();
        assert_eq!(reply_header(&mut c), (error, cookie as u64), "read of {len} at {offset}");
        if error == 0 {
            let got = read_payload(&mut c, len as usize);
            assert!(got == expected(offset, len), "read of {len} at {offset}: wrong bytes");
        }
    }
    c.write_all(&request(CMD_DISC, 99, 0, 0)).unwrap();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    server.join().unwrap();
}

#[test]
fn pipelined_reads_on_every_connection_thread_never_carry_stale_bytes() {
    let dir = tempfile::tempdir().unwrap();
    let (stop, server) = start_in(disk(), dir.path());
    let mut c = connect_in(dir.path());
    let mut sent: HashMap<u64, (u64, u32)> = HashMap::new();
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut batch = Vec::new();
    for cookie in 0..300u64 {
        let len = match next() % 4 {
            0 => 1 + next() % 8192,
            1 => 4096 * (1 + next() % 512),
            2 => (2 << 20) + next() % (1 << 20),
            _ => 1 + next() % (2 << 20),
        } as u32;
        let offset = if cookie % 7 == 3 { FAILS_MIDWAY } else { next() % (SIZE - u64::from(len)) };
        sent.insert(cookie, (offset, len));
        batch.extend_from_slice(&request(CMD_READ, cookie, offset, len));
    }
    // All at once: the followers join, and each thread's buffer serves many sizes.
    let mut w = c.try_clone().unwrap();
    let writer = std::thread::spawn(move || w.write_all(&batch).unwrap());
    for _ in 0..300 {
        let (error, cookie) = reply_header(&mut c);
        let (offset, len) = sent.remove(&cookie).expect("a reply for a request sent, once");
        if offset == FAILS_MIDWAY {
            assert_eq!(error, EIO);
            continue;
        }
        assert_eq!(error, 0);
        let got = read_payload(&mut c, len as usize);
        if got != expected(offset, len) {
            let at = (0..got.len()).find(|&i| got[i] != byte_at(offset + i as u64)).unwrap();
            panic!("read {cookie} of {len} at {offset}: byte {at} is {:#x}", got[at]);
        }
    }
    writer.join().unwrap();
    c.write_all(&request(CMD_DISC, 1000, 0, 0)).unwrap();
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    server.join().unwrap();
}
