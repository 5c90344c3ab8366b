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
    // The loop fits in the larger cache (only the first pass misses), not in the smaller.
    let (small, big) = (sizes[0]["read_miss_ratio"].as_f64().unwrap(), sizes[1]["read_miss_ratio"].as_f64().unwrap());
    assert!(big <= 0.11 && small > big, "miss ratios {small} and {big}");
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
