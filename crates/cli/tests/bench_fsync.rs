//! Proves that `tiercache bench fsync` refuses every bad input with one precise line on
//! stderr, a non-zero exit code and nothing written, and that its JSON report has the
//! documented shape. Speeds are not asserted here (the machine is shared): they are the
//! benchmark's output, not its test.

mod common;

use common::{fails_with, tiercache};
use std::os::unix::fs::PermissionsExt;

/// One line on stderr (see `common::fails_with`), and no report on stdout.
fn assert_one_line_error(args: &[&str], expected: &str) {
    let out = fails_with(args, expected);
    assert!(out.stdout.is_empty(), "{args:?} printed a report");
}

#[test]
fn bad_targets_get_one_line_errors_and_nothing_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("missing.img");
    let odd = dir.path().join("odd.img");
    std::fs::write(&odd, vec![7u8; 4096 + 512]).unwrap();
    let ro = dir.path().join("ro.img");
    std::fs::write(&ro, vec![9u8; 8192]).unwrap();
    std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o444)).unwrap();
    let before = (std::fs::read(&odd).unwrap(), std::fs::read(&ro).unwrap());

    let s = |p: &std::path::Path| p.to_str().unwrap().to_string();
    let cases = [
        (s(&missing), "no such file or device"),
        (s(dir.path()), "is a directory"),
        (s(&ro), "is read-only (mode 0444"),
        (s(&odd), "size 4608 bytes is not a multiple of the 4096-byte block size"),
        ("emulated:floppy".to_string(), "unknown device profile 'floppy'; known profiles: optane"),
        ("/dev/null".to_string(), "neither a regular file nor a block device"),
    ];
    for (target, expected) in &cases {
        assert_one_line_error(&["bench", "fsync", "--seconds", "0.1", "--target", target], expected);
    }
    assert!(!missing.exists(), "a missing target was created");
    assert_eq!(before, (std::fs::read(&odd).unwrap(), std::fs::read(&ro).unwrap()), "a refused target changed");
}

#[test]
fn a_bad_target_among_good_ones_stops_before_any_measurement() {
    let dir = tempfile::tempdir().unwrap();
    let good = dir.path().join("good.img");
    std::fs::write(&good, vec![1u8; 65536]).unwrap();
    let good_s = good.to_str().unwrap();
    assert_one_line_error(
        &["bench", "fsync", "--seconds", "0.1", "--target", good_s, "--target", "emulated:nope"],
        "unknown device profile 'nope'",
    );
    assert_eq!(std::fs::read(&good).unwrap(), vec![1u8; 65536], "the good target was written");
}

#[test]
fn seconds_must_be_positive() {
    let out = tiercache(&["bench", "fsync", "--seconds", "-1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("out of range"));
}

#[test]
fn json_report_has_the_documented_shape() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bench.img");
    std::fs::write(&file, vec![0u8; 1 << 20]).unwrap();
    let out = tiercache(&[
        "bench",
        "fsync",
        "--seconds",
        "0.2",
        "--json",
        "--target",
        "emulated:optane",
        "--target",
        file.to_str().unwrap(),
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let results = v["results"].as_array().unwrap();
    // emulated + buffered always; O_DIRECT too unless TMPDIR is tmpfs.
    assert!(results.len() == 2 || results.len() == 3, "{v}");
    assert_eq!(results[0]["target"], "emulated:optane");
    assert_eq!(results[0]["documented_fsyncs_per_second"], 20000.0);
    for r in results {
        for key in ["fsyncs_per_second", "latency_us_p50", "latency_us_p99", "latency_us_p999"] {
            let x = r[key].as_f64().unwrap_or_else(|| panic!("{key} missing in {r}"));
            assert!(x > 0.0, "{key} = {x}");
        }
        assert!(r["latency_us_p50"].as_f64() <= r["latency_us_p99"].as_f64());
        assert!(r["latency_us_p99"].as_f64() <= r["latency_us_p999"].as_f64());
    }
    assert_eq!(results.last().unwrap()["io_mode"], "buffered");
}

/// `--cache` on a block device: the raw row is that device itself, measured before the hybrid
/// formats it, not a file named after it (which landed in /dev, in RAM, and made the hybrid
/// look 100x slower than the "raw cache device"). A loop device stands in for the NVMe.
#[test]
fn a_block_device_cache_is_measured_raw_itself_first() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test attaches a loop device: run it as root (CI does)");
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let (cache_file, backing) = (dir.path().join("cache.img"), dir.path().join("backing.img"));
    std::fs::File::create(&cache_file).unwrap().set_len(256 << 20).unwrap();
    std::fs::File::create(&backing).unwrap().set_len(1 << 30).unwrap();
    let attach = std::process::Command::new("losetup")
        .args(["--direct-io=on", "--show", "-f", cache_file.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(attach.status.success(), "losetup: {}", String::from_utf8_lossy(&attach.stderr));
    let dev = String::from_utf8(attach.stdout).unwrap().trim().to_string();
    struct Detach(String);
    impl Drop for Detach {
        fn drop(&mut self) {
            let _ = std::process::Command::new("losetup").args(["-d", &self.0]).status();
        }
    }
    let _detach = Detach(dev.clone());
    let out = tiercache(&[
        "bench",
        "fsync",
        "--seconds",
        "0.3",
        "--json",
        "--cache",
        &dev,
        "--backing",
        backing.to_str().unwrap(),
        "--destructive",
    ]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let raw_file = format!("{dev}.raw-bench");
    assert!(!std::path::Path::new(&raw_file).exists(), "{raw_file} was created");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let results = v["results"].as_array().unwrap();
    let targets: Vec<&str> = results.iter().map(|r| r["target"].as_str().unwrap()).collect();
    assert_eq!(targets.first(), Some(&dev.as_str()), "the raw device first: {targets:?}");
    let hybrid = results.iter().find(|r| r["target"].as_str().unwrap().starts_with("hybrid (")).expect("a hybrid row");
    assert_eq!(hybrid["raw_cache_target"], format!("{dev} (o_direct)"), "{hybrid}");
    assert!(hybrid["ratio_to_raw_cache"].as_f64().unwrap() > 0.0, "{hybrid}");
}
