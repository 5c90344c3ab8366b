//! `tiercache serve` as a systemd `Type=notify` service, without systemd: the test listens on
//! the `$NOTIFY_SOCKET` datagram socket the way the service manager does and checks the
//! protocol: STATUS while recovering, READY=1 only once every endpoint accepts connections,
//! STOPPING=1 on SIGTERM, and a clean exit.

use std::os::unix::net::{UnixDatagram, UnixStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// The next notification (a datagram of `KEY=VALUE` lines), within 30 s.
fn next(sock: &UnixDatagram) -> String {
    let mut buf = [0u8; 4096];
    let n = sock.recv(&mut buf).expect("a notification within 30 s");
    String::from_utf8_lossy(&buf[..n]).into_owned()
}

#[test]
fn serve_tells_the_service_manager_when_it_is_ready_and_when_it_stops() {
    let dir = tempfile::tempdir().unwrap();
    let (cache, backing) = (dir.path().join("cache.img"), dir.path().join("backing.img"));
    std::fs::File::create(&backing).unwrap().set_len(64 << 20).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_tiercache"))
        .args(["create", "--cache", p(&cache), "--cache-size", "16M", "--backing", p(&backing)])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    let notify_path = dir.path().join("notify.sock");
    let notify = UnixDatagram::bind(&notify_path).unwrap();
    notify.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let nbd = dir.path().join("nbd.sock");
    let mut child = Command::new(env!("CARGO_BIN_EXE_tiercache"))
        .args(["serve", "--cache", p(&cache), "--backing", p(&backing)])
        .args(["--nbd", &format!("unix:{}", nbd.display()), "--control", p(&dir.path().join("control.sock"))])
        .env("NOTIFY_SOCKET", &notify_path)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();

    let first = next(&notify);
    assert!(first.starts_with("STATUS=") && first.contains("recovering"), "first notification: {first:?}");
    let ready = next(&notify);
    assert!(ready.lines().any(|l| l == "READY=1"), "second notification: {ready:?}");
    assert!(ready.contains("STATUS=serving"), "{ready:?}");
    // Ready means ready: the endpoint accepts a client at once.
    UnixStream::connect(&nbd).expect("the NBD socket accepts a client as soon as READY=1 is sent");

    // SAFETY: kill(2) on the PID of a child we own; no memory is passed.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let stopping = next(&notify);
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "after SIGTERM: {stopping:?}");
    let status = child.wait().unwrap();
    assert!(status.success(), "serve exited with {status}");
}
