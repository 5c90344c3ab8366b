//! RAM held by idle NBD connections (adversarial review of ab21ba3, huge-page read buffers):
//! there, each connection thread that ran a READ kept a 2 MiB huge read buffer
//! (`read_buffer`) until the connection ended, outside the server's in-flight budget, however
//! small its reads were: 8 connections that pipelined 64 reads of 4 KiB each and then idled
//! held 64 MiB of resident memory (4 workers x 2 MiB each). Reads below
//! `tiercache_frontend::REUSED_READ_MIN_BYTES` now get ordinary buffers of their own.

use std::io::Write;
use std::sync::Arc;
use tiercache_frontend::ByteIo;
use tiercache_nbd::proto::*;

mod common;
use common::*;

/// 1 GiB of zeroes, each read taking 200 us.
fn zeroes() -> Arc<dyn ByteIo> {
    Arc::new(ReadOnly {
        size: 1 << 30,
        read: |_offset: u64, buf: &mut [u8]| {
            buf.fill(0);
            std::thread::sleep(std::time::Duration::from_micros(200));
            Ok(())
        },
    })
}

fn rss_kb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// (Failed on ab21ba3, 65,924 kB: each connection thread kept a 2 MiB read buffer while the
/// connection lived, whatever the read's size. Small reads now get ordinary buffers:
/// `tiercache_frontend::REUSED_READ_MIN_BYTES`.)
#[test]
fn idle_connections_hold_little_ram_after_small_reads() {
    let dir = tempfile::tempdir().unwrap();
    let (stop, server) = start_in(zeroes(), dir.path());
    let before = rss_kb();
    let mut conns = Vec::new();
    for _ in 0..8 {
        let mut c = connect_in(dir.path());
        let batch: Vec<u8> = (0..64u64).flat_map(|k| request(CMD_READ, k, k * 4096, 4096)).collect();
        c.write_all(&batch).unwrap();
        for _ in 0..64 {
            assert_eq!(reply_header(&mut c).0, 0);
            read_payload(&mut c, 4096);
        }
        conns.push(c); // idle, connected
    }
    let held = rss_kb().saturating_sub(before);
    for mut c in conns {
        c.write_all(&request(CMD_DISC, 0, 0, 0)).unwrap();
    }
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    server.join().unwrap();
    // 8 idle connections after reads of 4 KiB: a few MiB at most (thread stacks, sockets).
    assert!(held < 16 * 1024, "8 idle connections hold {held} kB of RAM after 4 KiB reads");
}
