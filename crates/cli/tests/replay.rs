//! `tiercache replay` as a user runs it: a trace file in, a table or JSON out, precise errors.

mod common;
use common::*;

/// A plain-CSV trace: a loop of 100 blocks read 10 times (4 KiB requests), and a few writes.
fn trace(dir: &std::path::Path) -> std::path::PathBuf {
    let mut s = String::from("time_ns,op,offset_bytes,length_bytes\n");
    let mut t = 0;
    for _ in 0..10 {
        for b in 0..100u64 {
            s.push_str(&format!("{t},R,{},4096\n", b * 4096));
            t += 1;
        }
    }
    for b in 0..10u64 {
        s.push_str(&format!("{t},W,{},8192\n", b * 8192));
        t += 1;
    }
    let p = dir.join("loop.csv");
    std::fs::write(&p, s).unwrap();
    p
}

#[test]
fn replay_reports_each_size_as_json_and_as_a_table() {
    let dir = tempfile::tempdir().unwrap();
    let p = trace(dir.path());
    let out = tiercache(&["replay", "--trace", p.to_str().unwrap(), "--cache-size", "50%,400%", "--json"]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["requests"], 1010);
    assert_eq!(v["footprint_blocks"], 100);
    let sizes = v["sizes"].as_array().unwrap();
    assert_eq!(sizes.len(), 2);
    assert_eq!(sizes[0]["read_block_accesses"], 1000);
    assert_eq!(sizes[1]["write_block_accesses"], 20);
    // The loop fits in the larger cache, not in the smaller. In the larger, its first pass
    // misses, and so do some blocks of its second: the first pass enters the probation ring (a
    // tenth of the cache, 40 blocks: too small for the loop's 100), and each block the ring
    // dropped enters the log at its next miss.
    let (small, big) = (sizes[0]["read_miss_ratio"].as_f64().unwrap(), sizes[1]["read_miss_ratio"].as_f64().unwrap());
    assert!(big <= 0.2 && small > big, "miss ratios {small} and {big}");
    assert_eq!(sizes[1]["probation_blocks"], 40, "a tenth of the cache by default");
    // Another ring, as `create --probation-percent` would give it. A cache of the loop's
    // size: with the default ring (8 blocks) the misses of each pass wait there and the log
    // keeps part of the loop; with none, every miss enters the log and pushes out the block
    // the loop reads next, more often.
    let at_footprint = |ring: Option<&str>| {
        let mut a = vec!["replay", "--trace", p.to_str().unwrap(), "--cache-size", "100%", "--json"];
        a.extend(ring.map(|r| ["--probation-percent", r]).into_iter().flatten());
        let out = tiercache(&a);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()["sizes"][0].clone()
    };
    let (ring, none) = (at_footprint(None), at_footprint(Some("0")));
    assert!(ring["probation_blocks"].as_u64().unwrap() > 0 && ring["probation_admitted_blocks"].as_u64().unwrap() > 0);
    assert_eq!((none["probation_blocks"].as_u64(), none["probation_admitted_blocks"].as_u64()), (Some(0), Some(0)));
    let (with, without) = (ring["read_miss_ratio"].as_f64().unwrap(), none["read_miss_ratio"].as_f64().unwrap());
    assert!(with < without, "miss ratio with the ring {with}, without {without}");
    let out = tiercache(&["replay", "--trace", p.to_str().unwrap(), "--probation-percent", "60"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--probation-percent 60: the ring takes at most 50 %"), "{err}");
    let svg = dir.path().join("mrc.svg");
    let out = tiercache(&[
        "replay",
        "--trace",
        p.to_str().unwrap(),
        "--cache-size",
        "1M,50%",
        "--plot",
        svg.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("1010 requests, footprint 100 blocks") && table.contains("miss ratio"), "{table}");
    let svg = std::fs::read_to_string(svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("miss-ratio curve") && svg.contains("tiercache"), "{svg:.200}");
}

#[test]
fn a_bad_trace_or_size_is_a_precise_error() {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("bad.csv");
    std::fs::write(&p, "time_ns,op,offset_bytes,length_bytes\n0,R,0,4096\n1,Q,0,4096\n").unwrap();
    let out = tiercache(&["replay", "--trace", p.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.csv:3: op is neither R nor W"), "{err}");
    let good = trace(dir.path());
    let out = tiercache(&["replay", "--trace", good.to_str().unwrap(), "--cache-size", "150x"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--cache-size 150x"));
    let out = tiercache(&["replay", "--trace", dir.path().join("missing.csv").to_str().unwrap()]);
    assert!(String::from_utf8_lossy(&out.stderr).contains("opening the trace"));
}

/// `tiercache serve` of `vol` over NBD on the Unix socket `sock`, with `extra` arguments,
/// waited for until nbdinfo gets an answer; the process and the NBD URI.
fn serve(vol: &TempVolume, sock: &std::path::Path, extra: &[&str]) -> (std::process::Child, String) {
    let child = tiercache_cmd()
        .args(["serve", "--cache", p(&vol.cache), "--backing", p(&vol.backing)])
        .args(["--nbd", &format!("unix:{}", sock.display())])
        .args(extra)
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let uri = format!("nbd+unix:///tiercache?socket={}", sock.display());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    while !tool("nbdinfo").arg("--size").arg(&uri).output().is_ok_and(|o| o.status.success()) {
        assert!(std::time::Instant::now() < deadline, "the server did not come up");
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    (child, uri)
}

/// `serve --record-trace`: a real NBD client's requests land in the trace file at stop, in
/// the shared format, and `tiercache replay` reads it back.
#[test]
fn serve_records_a_trace_that_replay_reads() {
    let vol = TempVolume::created(64 << 20, "16M");
    let sock = vol.path("nbd.sock");
    let trace = vol.path("trace.csv.gz");
    let (mut child, uri) = serve(&vol, &sock, &["--record-trace", p(&trace)]);
    qemu_io(&uri, &["write -P 0xab 1M 256k", "read -P 0xab 1M 256k", "write -P 0xcd 8M 4k", "flush"]);
    sigterm(&child);
    assert!(child.wait().unwrap().success());
    let mut text = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(std::fs::File::open(&trace).unwrap()), &mut text)
        .unwrap();
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some("time_ns,op,offset_bytes,length_bytes"));
    let requests: Vec<(String, u64, u64)> = lines
        .map(|l| {
            let f: Vec<&str> = l.split(',').collect();
            (f[1].to_string(), f[2].parse().unwrap(), f[3].parse().unwrap())
        })
        .collect();
    for want in [("W", 1 << 20, 256 << 10), ("R", 1 << 20, 256 << 10), ("W", 8 << 20, 4096)] {
        assert!(requests.contains(&(want.0.to_string(), want.1, want.2)), "{want:?} not in {requests:?}");
    }
    let out = ok_json(&["replay", "--trace", p(&trace), "--cache-size", "1M", "--json"]);
    assert_eq!(out["requests"].as_u64().unwrap(), requests.len() as u64);
}

/// `tiercache trace start|stop` through the control socket of a running server.
#[test]
fn a_trace_starts_and_stops_through_the_control_socket() {
    let vol = TempVolume::created(64 << 20, "16M");
    let sock = vol.path("nbd.sock");
    let control = vol.path("control.sock");
    let (mut child, uri) = serve(&vol, &sock, &["--control", p(&control)]);
    let cache = p(&vol.cache);
    let ctl = ["--control", p(&control)];
    // Nothing to stop yet: a precise error.
    fails_with(&[&["trace", "--cache", cache], &ctl[..], &["stop"]].concat(), "no trace is being recorded");
    qemu_io(&uri, &["write -P 0x11 0 64k"]); // before the recording: not in the trace
    let trace = vol.path("t.csv.gz");
    let started = ok_json(&[&["trace", "--cache", cache], &ctl[..], &["--json", "start", p(&trace)]].concat());
    assert_eq!(started["recording"], true);
    qemu_io(&uri, &["write -P 0xab 2M 128k", "read -P 0xab 2M 128k"]);
    let stopped = ok_json(&[&["trace", "--cache", cache], &ctl[..], &["--json", "stop"]].concat());
    assert_eq!((stopped["recording"].as_bool(), stopped["path"].as_str()), (Some(false), Some(p(&trace))));
    let mut text = String::new();
    std::io::Read::read_to_string(&mut flate2::read::GzDecoder::new(std::fs::File::open(&trace).unwrap()), &mut text)
        .unwrap();
    let lines: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(lines.len() as u64, stopped["requests"].as_u64().unwrap());
    assert!(lines.iter().any(|l| l.ends_with(",W,2097152,131072")), "{lines:?}");
    assert!(lines.iter().any(|l| l.ends_with(",R,2097152,131072")), "{lines:?}");
    assert!(!lines.iter().any(|l| l.contains(",W,0,65536")), "a request before the start: {lines:?}");
    sigterm(&child);
    assert!(child.wait().unwrap().success());
}

/// `tiercache preload --range` through a running server: the range comes in hot (a later read
/// of it is all hits), the report says what was loaded, and bad requests are precise errors.
#[test]
fn preload_loads_a_range_through_the_control_socket() {
    let vol = TempVolume::created(64 << 20, "32M");
    let sock = vol.path("nbd.sock");
    let control = vol.path("control.sock");
    let (mut child, uri) = serve(&vol, &sock, &["--control", p(&control)]);
    let cache = p(&vol.cache);
    let ctl = ["--control", p(&control)];
    // More than the log holds: refused, nothing read (an operator audit: it reported success).
    let out = tiercache(&[&["preload", "--cache", cache], &ctl[..], &["--range", "0:60M"]].concat());
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("more than the cache's log"), "{out:?}");
    let out = ok_json(&[&["preload", "--cache", cache], &ctl[..], &["--range", "1M:2M", "--json"]].concat());
    assert_eq!(out["bytes"], 2 << 20, "{out}");
    assert_eq!(out["report"]["admitted_blocks"], 512, "{out}");
    let status = ok_json(&[&["status", "--cache", cache], &ctl[..], &["--json"]].concat());
    assert_eq!(status["counters"]["preloaded_blocks"], 512, "{status}");
    assert!(status["hot_blocks"].as_u64().unwrap() >= 512, "{status}");
    let hits = status["counters"]["read_hit_blocks"].as_u64().unwrap();
    qemu_io(&uri, &["read 1M 2M"]);
    let status = ok_json(&[&["status", "--cache", cache], &ctl[..], &["--json"]].concat());
    assert_eq!(status["counters"]["read_hit_blocks"].as_u64().unwrap() - hits, 512, "every block a hit: {status}");
    // Again: everything is cached already.
    let again = ok_json(&[&["preload", "--cache", cache], &ctl[..], &["--range", "1M:2M", "--json"]].concat());
    assert_eq!(
        (again["report"]["admitted_blocks"].as_u64(), again["report"]["cached_blocks"].as_u64()),
        (Some(0), Some(512))
    );
    fails_with(&[&["preload", "--cache", cache], &ctl[..], &["--range", "63M:2M"]].concat(), "beyond the volume");
    fails_with(&[&["preload", "--cache", cache], &ctl[..], &["--range", "12"]].concat(), "OFFSET:LENGTH");
    fails_with(&[&["preload", "--cache", cache], &ctl[..]].concat(), "nothing to preload");
    let outside = vol.path("not-on-the-volume");
    std::fs::write(&outside, b"x").unwrap();
    fails_with(
        &[&["preload", "--cache", cache], &ctl[..], &[p(&outside)]].concat(),
        "is its file system on this volume",
    );
    sigterm(&child);
    assert!(child.wait().unwrap().success());
}

/// A server started with `--control PATH`, asked without it (a new-user audit, 2026-11-30:
/// `status` said no server answered "on its control socket" without naming it, and `flush`
/// claimed the server "was asked to write back"): both name the socket they tried and point at
/// --control; a second `serve` of the volume names the process holding it.
#[test]
fn commands_that_miss_a_servers_own_control_socket_say_which_they_tried() {
    let vol = TempVolume::created(64 << 20, "16M");
    let sock = vol.path("nbd.sock");
    let control = vol.path("control.sock");
    let (mut child, _uri) = serve(&vol, &sock, &["--control", p(&control)]);
    let cache = p(&vol.cache);
    for cmd in ["status", "flush"] {
        let out = fails_with(&[cmd, "--cache", cache], "is in use, but no tiercache server answers on /");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains("give it with --control") && !stderr.contains("was asked"), "{cmd}: {stderr}");
    }
    ok_json(&["status", "--cache", cache, "--control", p(&control), "--json"]);
    let other = vol.path("other.sock");
    let second =
        tiercache(&["serve", "--cache", cache, "--backing", p(&vol.backing), "--nbd", &format!("unix:{}", p(&other))]);
    let stderr = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success());
    assert!(stderr.contains(&format!("its lock is held by pid {} (tiercache serve)", child.id())), "{stderr}");
    sigterm(&child);
    assert!(child.wait().unwrap().success());
}

/// A server that fails after binding its sockets (here: a trace file it cannot create) leaves
/// neither its NBD socket nor its control socket behind (an operator audit, 2026-11-30: the
/// control socket stayed).
#[test]
fn a_server_that_fails_to_come_up_leaves_no_socket_behind() {
    let vol = TempVolume::created(64 << 20, "16M");
    let (sock, control) = (vol.path("nbd.sock"), vol.path("control.sock"));
    let out = tiercache(&[
        "serve",
        "--cache",
        p(&vol.cache),
        "--backing",
        p(&vol.backing),
        "--nbd",
        &format!("unix:{}", p(&sock)),
        "--control",
        p(&control),
        "--record-trace",
        p(&vol.path("no-such-dir/trace.csv.gz")),
    ]);
    assert!(!out.status.success(), "{out:?}");
    assert!(!sock.exists() && !control.exists(), "a socket stayed: {out:?}");
}
