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
