//! `tiercache serve` as a systemd `Type=notify` service, without systemd: the test listens on
//! the `$NOTIFY_SOCKET` datagram socket the way the service manager does and checks the
//! protocol: STATUS while recovering, READY=1 only once every endpoint accepts connections,
//! STOPPING=1 on SIGTERM, and a clean exit. And the shipped units pass `systemd-analyze verify`.

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
    // Started the way the shipped unit starts it: from a config file.
    let config = dir.path().join("volume.toml");
    let control = dir.path().join("control.sock");
    std::fs::write(
        &config,
        format!(
            "# a volume\ncache = \"{}\"\nbacking = \"{}\"\nnbd = [\"unix:{}\"]\ncontrol = \"{}\"\ndirty_high = 50\n",
            cache.display(),
            backing.display(),
            nbd.display(),
            control.display()
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_tiercache"))
        .args(["serve", "--config", p(&config), "--dirty-low", "20"])
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
    // The watermarks: the file's high one, the flag's low one.
    let out = Command::new(env!("CARGO_BIN_EXE_tiercache"))
        .args(["status", "--cache", p(&cache), "--control", p(&control), "--json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let st: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!((st["dirty_low_permille"].as_u64(), st["dirty_high_permille"].as_u64()), (Some(200), Some(500)), "{st}");

    // SAFETY: kill(2) on the PID of a child we own; no memory is passed.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let stopping = next(&notify);
    assert!(stopping.lines().any(|l| l == "STOPPING=1"), "after SIGTERM: {stopping:?}");
    let status = child.wait().unwrap();
    assert!(status.success(), "serve exited with {status}");
}

#[test]
fn a_bad_config_file_is_refused_with_its_line() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("volume.toml");
    for (text, expected) in [
        ("cache = \"/c\"\nbackign = \"/b\"\n", "line 2"),
        ("cache = \"/c\"\nbacking = \"/b\"\nnbd = \"unix:/x\"\n", "line 3"),
        ("nbd = [\"unix:/x\"]\n", "give the cache and backing devices"),
    ] {
        std::fs::write(&config, text).unwrap();
        let out =
            Command::new(env!("CARGO_BIN_EXE_tiercache")).args(["serve", "--config", p(&config)]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(expected), "config {text:?}: {err}");
    }
}

/// The units in contrib/systemd, as instance `db` with the binary this build made.
#[test]
fn the_shipped_systemd_units_verify() {
    let dir = tempfile::tempdir().unwrap();
    let units = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../contrib/systemd");
    let mut instances = Vec::new();
    for entry in std::fs::read_dir(&units).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_string();
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains("/usr/local/bin/tiercache") || !name.starts_with("tiercache@"), "{name}");
        let instance = dir.path().join(name.replace("@.", "@db."));
        std::fs::write(&instance, text.replace("/usr/local/bin/tiercache", env!("CARGO_BIN_EXE_tiercache"))).unwrap();
        instances.push(instance);
    }
    assert!(instances.len() >= 2, "units in {}", units.display());
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .args(&instances)
        .output()
        .expect("systemd-analyze is missing: install systemd (scripts/test does)");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success() && text.trim().is_empty(), "systemd-analyze verify: {text}");
}
