//! Proves the NBD frontend with real clients only (qemu-io, nbdinfo, nbdcopy from the
//! packages qemu-utils and libnbd-bin, which scripts/test installs) against a real
//! `tiercache serve` process: every command qemu-io can send, patterns surviving SIGKILL and a
//! restart, a volume-sized copy in and out, TCP on loopback, a clean SIGTERM, and hostile raw
//! clients (bad magic, out-of-range and unknown requests) that get error replies or a
//! disconnect while the server keeps serving; `tiercache flush` on the served volume under a
//! write load, interrupted and run again; and `serve --passthrough` (the raw device, no cache)
//! over the same NBD server.

mod common;

use common::{ok_json, p, qemu_io, tiercache_cmd, tool, Server};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

const VOLUME: u64 = 64 << 20;

#[test]
fn qemu_io_nbdinfo_nbdcopy_sigkill_restart_and_sigterm() {
    let mut s = Server::start(None);
    let info = tool("nbdinfo").args(["--json", &s.uri()]).output().unwrap();
    let v: serde_json::Value = serde_json::from_slice(&info.stdout).unwrap();
    let export = &v["exports"][0];
    assert_eq!(export["export-size"], VOLUME);
    for flag in ["can_flush", "can_fua", "can_trim", "can_zero", "can_multi_conn"] {
        assert_eq!(export[flag], true, "{flag}: {export}");
    }
    assert_eq!(export["block_size_minimum"], 512);
    assert_eq!(export["block_size_preferred"], 4096);

    qemu_io(
        &s.uri(),
        &[
            "write -P 0xab 0 1M",
            "write -P 0xcd 1M 64k",
            "write -P 0x11 2100k 3000", // not block-aligned: read-modify-write
            "write -P 0x22 -f 3M 8k",   // FUA
            "flush",
            "read -P 0xab 0 1M",
            "read -P 0x11 2100k 3000",
            "discard 8M 1M",
            "write -z 16M 128k",
            "read -P 0 16M 128k",
            "aio_write -P 0x77 32M 256k",
            "aio_write -P 0x78 33M 256k",
            "aio_flush",
            "read -P 0x77 32M 256k",
            "flush",
        ],
    );
    // The status command reaches the running server through its control socket.
    let st = tiercache_cmd().args(["status", "--json", "--cache", p(&s.cache())]).output().unwrap();
    assert!(st.status.success(), "{}", String::from_utf8_lossy(&st.stderr));
    let st: serde_json::Value = serde_json::from_slice(&st.stdout).unwrap();
    assert!(st["dirty_blocks"].as_u64().unwrap() > 0, "{st}");
    // `check` does not run under a live volume, and says who holds it.
    let check =
        tiercache_cmd().args(["check", "--cache", p(&s.cache()), "--backing", p(&s.vol.backing)]).output().unwrap();
    let err = String::from_utf8_lossy(&check.stderr);
    let pid = s.pid();
    assert!(!check.status.success() && err.contains(&format!("is served by tiercache (pid {pid})")), "{err}");

    s.kill9();
    s.spawn();
    qemu_io(
        &s.uri(),
        &[
            "read -P 0xab 0 1M",
            "read -P 0xcd 1M 64k",
            "read -P 0x11 2100k 3000",
            "read -P 0x22 3M 8k",
            "read -P 0 16M 128k",
            "read -P 0x77 32M 256k",
            "read -P 0x78 33M 256k",
        ],
    );

    // A volume-sized random file in and out.
    let input = s.vol.path("in.img");
    let output = s.vol.path("out.img");
    let data: Vec<u8> = (0..VOLUME).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8).collect();
    std::fs::write(&input, &data).unwrap();
    assert!(tool("nbdcopy").args([p(&input), &s.uri()]).status().unwrap().success());
    assert!(tool("nbdcopy").args([&s.uri(), p(&output)]).status().unwrap().success());
    assert!(std::fs::read(&output).unwrap() == data, "nbdcopy out differs from what went in");

    let status = s.terminate();
    assert!(status.success(), "SIGTERM shutdown failed: {status:?}");
    assert!(!s.socket().exists(), "the socket is removed on shutdown");
    // Everything was made durable: the data is there after a restart.
    s.spawn();
    assert!(tool("nbdcopy").args([&s.uri(), p(&output)]).status().unwrap().success());
    assert!(std::fs::read(&output).unwrap() == data);
}

#[test]
fn tcp_on_loopback() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let s = Server::start(Some(format!("tcp:{port}")));
    qemu_io(&s.uri(), &["write -P 0x5a 0 64k", "flush", "read -P 0x5a 0 64k"]);
}

/// A raw client past the handshake (NBD_OPT_GO on the default export).
fn raw_client(sock: &Path) -> UnixStream {
    let mut c = UnixStream::connect(sock).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut hello = [0u8; 18];
    c.read_exact(&mut hello).unwrap();
    assert_eq!(&hello[..8], b"NBDMAGIC");
    c.write_all(&3u32.to_be_bytes()).unwrap(); // fixed newstyle, no zeroes
    let mut opt = Vec::new();
    opt.extend_from_slice(b"IHAVEOPT");
    opt.extend_from_slice(&7u32.to_be_bytes()); // GO
    opt.extend_from_slice(&6u32.to_be_bytes());
    opt.extend_from_slice(&0u32.to_be_bytes()); // name ""
    opt.extend_from_slice(&0u16.to_be_bytes()); // no info requests
    c.write_all(&opt).unwrap();
    loop {
        let mut h = [0u8; 20];
        c.read_exact(&mut h).unwrap();
        let kind = u32::from_be_bytes(h[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(h[16..20].try_into().unwrap());
        let mut d = vec![0u8; len as usize];
        c.read_exact(&mut d).unwrap();
        if kind == 1 {
            return c; // ACK: transmission
        }
        assert_eq!(kind, 3, "only INFO replies before the ACK");
    }
}

fn request(c: &mut UnixStream, kind: u16, offset: u64, len: u32) -> u32 {
    request_with_flags(c, 0, kind, offset, len)
}

fn request_with_flags(c: &mut UnixStream, flags: u16, kind: u16, offset: u64, len: u32) -> u32 {
    let mut r = Vec::new();
    r.extend_from_slice(&0x2560_9513u32.to_be_bytes());
    r.extend_from_slice(&flags.to_be_bytes());
    r.extend_from_slice(&kind.to_be_bytes());
    r.extend_from_slice(&42u64.to_be_bytes());
    r.extend_from_slice(&offset.to_be_bytes());
    r.extend_from_slice(&len.to_be_bytes());
    c.write_all(&r).unwrap();
    let mut reply = [0u8; 16];
    c.read_exact(&mut reply).unwrap();
    assert_eq!(u32::from_be_bytes(reply[..4].try_into().unwrap()), 0x6744_6698);
    assert_eq!(u64::from_be_bytes(reply[8..].try_into().unwrap()), 42, "cookie echoed");
    u32::from_be_bytes(reply[4..8].try_into().unwrap())
}

#[test]
fn hostile_clients_get_errors_or_a_disconnect_and_the_server_keeps_serving() {
    let s = Server::start(None);
    let mut c = raw_client(&s.socket());
    assert_eq!(request(&mut c, 0, VOLUME - 4096, 8192), 22, "read past the end: EINVAL");
    assert_eq!(request(&mut c, 0, u64::MAX - 10, 4096), 22, "offset overflow: EINVAL");
    assert_eq!(request(&mut c, 4, VOLUME, 4096), 22, "trim past the end: EINVAL");
    assert_eq!(request(&mut c, 6, VOLUME, 4096), 28, "write-zeroes past the end: ENOSPC");
    assert_eq!(request(&mut c, 99, 0, 0), 22, "unknown command: EINVAL");
    assert_eq!(request_with_flags(&mut c, 1 << 7, 0, 0, 4096), 22, "unknown command flag: EINVAL");
    assert_eq!(request(&mut c, 0, 0, 64 << 20), 75, "read larger than the maximum: EOVERFLOW");
    // Bad magic: the server drops the connection.
    c.write_all(&[0xde; 28]).unwrap();
    let mut b = [0u8; 1];
    assert!(matches!(c.read(&mut b), Ok(0) | Err(_)), "connection closed after garbage");
    // Garbage during the handshake, and an oversized write: disconnects too.
    let mut g = UnixStream::connect(s.socket()).unwrap();
    g.write_all(&[0xff; 64]).unwrap();
    let mut c = raw_client(&s.socket());
    let mut r = Vec::new();
    r.extend_from_slice(&0x2560_9513u32.to_be_bytes());
    r.extend_from_slice(&[0, 0, 0, 1]); // WRITE
    r.extend_from_slice(&[0; 16]);
    r.extend_from_slice(&u32::MAX.to_be_bytes());
    c.write_all(&r).unwrap();
    assert!(matches!(c.read(&mut b), Ok(0) | Err(_)));
    // The server is unharmed.
    qemu_io(&s.uri(), &["write -P 0x42 0 4k", "read -P 0x42 0 4k"]);
}

/// `tiercache flush` while the volume is served: the server writes back every block dirty
/// when the flush began while a client keeps writing; a flush whose client goes away stops
/// after its batch, keeps what it wrote back, and the next flush continues from there.
#[test]
fn flush_of_a_served_volume_under_load_interrupted_and_resumed() {
    const MIB: u64 = 1 << 20;
    let s = Server::start_sized(None, "192M", 256 * MIB, true);
    let (cache, control) = (s.cache(), s.control());
    let status = || ok_json(&["status", "--cache", p(&cache), "--control", p(&control), "--json"]);
    // 80 MiB dirty, below the 70 % high watermark: several write-back batches (sized by their
    // measured cost: 1,024 blocks until one was timed, then 256 to 4,096).
    qemu_io(&s.uri(), &["write -P 0x11 0 80M", "flush"]);
    const DIRTY: u64 = 20480;
    let st = status();
    assert_eq!(st["dirty_blocks"], DIRTY);
    // The server's own part: who serves, where, for how many clients, at what rates.
    assert_eq!(st["server"]["pid"], s.pid(), "{st}");
    assert_eq!(st["server"]["endpoints"][0], s.endpoint.as_str(), "{st}");
    assert_eq!(st["server"]["nbd_clients"], 0, "{st}");
    // (Rates need counters sampled at least half a second apart.)
    let deadline = Instant::now() + Duration::from_secs(10);
    while status()["server"]["rates_1min"].is_null() && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(200));
    }
    let st = status();
    assert!(st["server"]["rates_1min"]["write_mib_per_second"].as_f64().unwrap() > 0.0, "{st}");
    let write_latency = &st["server"]["rates_1min"]["latency_us"]["write"];
    assert!(write_latency["count"].as_u64().unwrap() > 0 && write_latency["p99"].as_u64().unwrap() > 0, "{st}");

    // A flush whose client goes away after the first batch's progress line.
    let batch = status()["write_back_batch_blocks"].as_u64().unwrap();
    assert_eq!(batch, 1024, "no write-back timed yet: {}", status());
    let mut c = UnixStream::connect(s.control()).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    c.write_all(b"flush\n").unwrap();
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while byte[0] != b'\n' {
        c.read_exact(&mut byte).unwrap();
        line.push(byte[0]);
    }
    let first: serde_json::Value = serde_json::from_slice(&line).unwrap();
    assert_eq!(first["done"], batch, "first progress line: {first}");
    drop(c);
    // The server notices at its next progress line (after the batch it is in) and stops,
    // keeping what it wrote back. (Wait until the count stops moving.)
    let mut left = status()["dirty_blocks"].as_u64().unwrap();
    loop {
        std::thread::sleep(Duration::from_millis(1000));
        let d = status()["dirty_blocks"].as_u64().unwrap();
        if d == left {
            break;
        }
        left = d;
    }
    // (Batches after the first are sized by its measured cost: at most 4,096 blocks each.)
    assert!(
        left > 0 && DIRTY - left >= batch && DIRTY - left <= batch + 2 * 4096,
        "an abandoned flush left {left} of {DIRTY} dirty blocks: it should stop after a whole batch or two"
    );

    // A client writing meanwhile (another region), and the flush run again: it writes back
    // the rest, the writes go on, and nothing is lost.
    let uri = s.uri();
    let load = std::thread::spawn(move || {
        let cmds: Vec<String> = (0..200)
            .flat_map(|i| [format!("write -P 0x22 {} 64k", 96 * MIB + (i % 128) * 65536), "flush".to_string()])
            .collect();
        let cmds: Vec<&str> = cmds.iter().map(String::as_str).collect();
        qemu_io(&uri, &cmds);
    });
    std::thread::sleep(Duration::from_millis(100));
    let r = ok_json(&["flush", "--cache", p(&cache), "--control", p(&control), "--json"]);
    assert_eq!(r["online"], true);
    // What the first one left, and the load's blocks dirty when it began (at most its 2048):
    // not everything again.
    let written = r["written_back_blocks"].as_u64().unwrap();
    assert!((left..=left + 2048).contains(&written), "the second flush did not continue where the first stopped: {r}");
    load.join().unwrap();
    let dirty = status()["dirty_blocks"].as_u64().unwrap();
    assert!(dirty <= 2048, "{dirty} dirty blocks: only the load's 8 MiB may be");
    qemu_io(&s.uri(), &["read -P 0x11 0 80M", "read -P 0x22 96M 8M"]);

    // With the load stopped, a flush leaves nothing dirty.
    let r = ok_json(&["flush", "--cache", p(&cache), "--control", p(&control), "--json"]);
    assert_eq!(r["dirty_blocks"], 0, "{r}");
    assert_eq!(status()["dirty_blocks"], 0);
}

/// `serve --passthrough DEVICE --nbd`: the raw device behind the same NBD server, with no
/// cache (the baseline a benchmark compares the hybrid volume with); every write lands in the
/// device file itself, partial blocks read-modified-written. A passthrough needs a frontend.
#[test]
fn a_passthrough_device_over_nbd() {
    let dir = tempfile::tempdir().unwrap();
    let raw = dir.path().join("raw.img");
    let mut model = vec![0x5au8; 16 << 20];
    std::fs::write(&raw, &model).unwrap();
    let out = tiercache_cmd().args(["serve", "--passthrough", p(&raw)]).output().unwrap();
    assert!(!out.status.success() && String::from_utf8_lossy(&out.stderr).contains("--nbd"), "{out:?}");

    let sock = dir.path().join("nbd.sock");
    let mut child = tiercache_cmd()
        .args(["serve", "--passthrough", p(&raw), "--nbd", &format!("unix:{}", sock.display())])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let uri = format!("nbd+unix:///tiercache?socket={}", sock.display());
    let deadline = Instant::now() + Duration::from_secs(20);
    let info = loop {
        let out = tool("nbdinfo").args(["--json", &uri]).output().unwrap();
        if out.status.success() {
            break serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap();
        }
        assert!(Instant::now() < deadline, "the passthrough server did not come up");
        std::thread::sleep(Duration::from_millis(50));
    };
    let export = &info["exports"][0];
    assert_eq!(export["export-size"], model.len());
    for flag in ["can_flush", "can_fua", "can_trim", "can_zero"] {
        assert_eq!(export[flag], true, "{flag}: {export}");
    }
    qemu_io(
        &uri,
        &[
            "write -P 0xab 0 64k",
            "write -P 0x11 100k 3000", // not block-aligned: read-modify-write
            "write -P 0x22 -f 1M 8k",  // FUA
            "write -z 2M 128k",
            "discard 8M 1M",
            "flush",
            "read -P 0xab 0 64k",
            "read -P 0x11 100k 3000",
            "read -P 0 2M 128k",
            "read -P 0x5a 4M 1M",
        ],
    );
    // SAFETY: kill(2) on the PID of a child we own; no memory is passed.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
    assert!(!sock.exists(), "the NBD socket outlived the server");

    let on_disk = std::fs::read(&raw).unwrap();
    model[..64 << 10].fill(0xab);
    model[100 << 10..(100 << 10) + 3000].fill(0x11);
    model[1 << 20..(1 << 20) + (8 << 10)].fill(0x22);
    model[2 << 20..(2 << 20) + (128 << 10)].fill(0);
    // A trim leaves old data or (a punched hole) zeroes.
    let trimmed = 8 << 20..9 << 20;
    assert!(on_disk[trimmed.clone()].iter().all(|&b| b == 0x5a) || on_disk[trimmed.clone()].iter().all(|&b| b == 0));
    model[trimmed.clone()].copy_from_slice(&on_disk[trimmed]);
    assert!(
        on_disk == model,
        "the device file differs at byte {:?}",
        on_disk.iter().zip(&model).position(|(a, b)| a != b)
    );
}
