//! Adversarial review of the `sequential_bypass` config-file key (serve.rs).
mod common;

use common::{p, tiercache_cmd};

// Suspicion: the key is a TOML string only; `sequential_bypass = 0` (the natural way to write
// "admit everything", and how a byte count is written) is refused as a type error.
// Expected: parsing gets past the key (to the missing devices). FAILS if refused.
#[test]
fn sequential_bypass_as_a_toml_integer_is_accepted() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("volume.toml");
    for text in ["sequential_bypass = 0\n", "sequential_bypass = 2097152\n"] {
        std::fs::write(&config, text).unwrap();
        let out = tiercache_cmd().args(["serve", "--config", p(&config)]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("give the cache and backing devices"), "config {text:?}: {err}");
    }
}

// A bad string names the file and the key; a string size parses. (passes)
#[test]
fn sequential_bypass_string_values() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("volume.toml");
    for (text, expected) in [
        ("sequential_bypass = \"2x\"\n", "sequential_bypass"),
        ("sequential_bypass = \"4M\"\n", "give the cache and backing devices"),
    ] {
        std::fs::write(&config, text).unwrap();
        let out = tiercache_cmd().args(["serve", "--config", p(&config)]).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success() && err.contains(expected), "config {text:?}: {err}");
    }
}
