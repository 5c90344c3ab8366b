//! Proves the volume commands work end to end and refuse bad input with one precise line,
//! changing nothing: create, status, check and flush on real files; a wrong backing device
//! (by size and by content), a corrupted superblock, a newer format version, a device that is
//! not a cache, and a reformat without --force. After `flush`, the backing file alone holds
//! every block's newest data.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BS: usize = 4096;

fn tiercache(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tiercache")).args(args).output().expect("run tiercache")
}

fn ok(args: &[&str]) -> String {
    let out = tiercache(args);
    assert!(out.status.success(), "{args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

fn fails_with(args: &[&str], expected: &str) {
    let out = tiercache(args);
    assert!(!out.status.success(), "{args:?} succeeded");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{args:?}: not one line: {stderr:?}");
    assert!(stderr.contains(expected), "{args:?}: {stderr:?} lacks {expected:?}");
}

/// Argument errors come from clap: the precise message on the first line, then a hint.
fn usage_error(args: &[&str], expected: &str) {
    let out = tiercache(args);
    assert_eq!(out.status.code(), Some(2), "{args:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.lines().next().unwrap().contains(expected), "{args:?}: {stderr:?} lacks {expected:?}");
}

struct Files {
    _dir: tempfile::TempDir,
    cache: PathBuf,
    backing: PathBuf,
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

fn files() -> Files {
    let dir = tempfile::tempdir().unwrap();
    let cache = dir.path().join("cache.img");
    let backing = dir.path().join("backing.img");
    std::fs::write(&backing, vec![0u8; 8 << 20]).unwrap();
    Files { _dir: dir, cache, backing }
}

fn create(f: &Files) {
    ok(&["create", "--cache", s(&f.cache), "--cache-size", "32M", "--backing", s(&f.backing)]);
}

#[test]
fn create_status_check_flush_life_cycle() {
    let f = files();
    let out = ok(&["create", "--cache", s(&f.cache), "--cache-size", "32M", "--backing", s(&f.backing), "--json"]);
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["cache_size_bytes"], 32 << 20);
    assert_eq!(std::fs::metadata(&f.cache).unwrap().len(), 32 << 20);
    // Write through the volume: 3000 stamped random writes, flushed, then a clean shutdown.
    ok(&[
        "debug-load",
        "--cache",
        s(&f.cache),
        "--backing",
        s(&f.backing),
        "--blocks",
        "2048",
        "--writes",
        "3000",
        "--seed",
        "9",
    ]);
    let st: serde_json::Value = serde_json::from_str(&ok(&["status", "--cache", s(&f.cache), "--json"])).unwrap();
    assert_eq!(st["mode"], "write-back");
    assert_eq!(st["state"], "ok");
    assert!(st["cached_blocks"].as_u64().unwrap() > 0, "{st}");
    assert!(st["dirty_blocks"].as_u64().unwrap() > 0, "{st}");
    let ram = st["index_ram_bytes_per_cached_block"].as_f64().unwrap();
    assert!(ram > 0.0 && ram <= 16.0, "index RAM per cached block {ram}");
    let human = ok(&["status", "--cache", s(&f.cache)]);
    assert!(human.contains("index RAM") && human.contains("dirty"), "{human}");
    let check: serde_json::Value =
        serde_json::from_str(&ok(&["check", "--cache", s(&f.cache), "--backing", s(&f.backing), "--json"])).unwrap();
    assert_eq!(check["bad_dirty_blocks"], 0);
    assert_eq!(check["clean_blocks_differing_from_backing"], 0);
    ok(&["flush", "--cache", s(&f.cache), "--backing", s(&f.backing)]);
    let st: serde_json::Value = serde_json::from_str(&ok(&["status", "--cache", s(&f.cache), "--json"])).unwrap();
    assert_eq!(st["dirty_blocks"], 0, "{st}");
    // The backing file alone now holds the newest version of every block written.
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(9);
    let mut newest = vec![0u64; 2048];
    for i in 0..3000u64 {
        newest[rng.gen_range(0..2048usize)] = i + 1;
    }
    let backing = std::fs::read(&f.backing).unwrap();
    for (block, &version) in newest.iter().enumerate() {
        let data = &backing[block * BS..(block + 1) * BS];
        if version == 0 {
            assert!(data.iter().all(|&b| b == 0), "block {block} was never written");
        } else {
            assert_eq!(tiercache_engine::torture::unstamp(data), Some((block as u64, version)), "block {block}");
        }
    }
}

#[test]
fn create_refuses_bad_input_and_writes_nothing() {
    let f = files();
    let missing = f.backing.with_file_name("nope.img");
    fails_with(&["create", "--cache", s(&f.cache), "--cache-size", "32M", "--backing", s(&missing)], "no such file");
    assert!(!f.cache.exists(), "a cache file was created for a bad backing");
    fails_with(&["create", "--cache", s(&f.cache), "--backing", s(&f.backing)], "give --cache-size");
    fails_with(&["create", "--cache", s(&f.cache), "--cache-size", "1M", "--backing", s(&f.backing)], "too small");
    assert!(!f.cache.exists());
    usage_error(
        &["create", "--cache", s(&f.cache), "--cache-size", "lots", "--backing", s(&f.backing)],
        "is not a size",
    );
    create(&f);
    let before = std::fs::read(&f.cache).unwrap();
    fails_with(
        &["create", "--cache", s(&f.cache), "--cache-size", "64M", "--backing", s(&f.backing)],
        "exists with 33554432 bytes",
    );
    fails_with(&["create", "--cache", s(&f.cache), "--backing", s(&f.backing)], "already holds a tiercache cache");
    assert_eq!(before, std::fs::read(&f.cache).unwrap(), "a refused create changed the cache");
    ok(&["create", "--cache", s(&f.cache), "--backing", s(&f.backing), "--force"]);
}

#[test]
fn a_wrong_backing_device_is_refused_and_nothing_changes() {
    let f = files();
    create(&f);
    ok(&["debug-load", "--cache", s(&f.cache), "--backing", s(&f.backing), "--blocks", "64", "--writes", "200"]);
    let other_size = f.backing.with_file_name("other-size.img");
    std::fs::write(&other_size, vec![0u8; 4 << 20]).unwrap();
    let other_content = f.backing.with_file_name("other-content.img");
    let mut data = vec![0u8; 8 << 20];
    *data.last_mut().unwrap() = 1; // same size, different last block
    std::fs::write(&other_content, &data).unwrap();
    let before = (std::fs::read(&f.cache).unwrap(), std::fs::read(&other_content).unwrap());
    for (other, why) in [
        (&other_size, "its size is 4194304 bytes"),
        (&other_content, "its block 2047 (bytes 8384512..8388608) has checksum"),
    ] {
        for cmd in ["flush", "check"] {
            fails_with(&[cmd, "--cache", s(&f.cache), "--backing", s(other)], why);
        }
    }
    assert_eq!(
        before,
        (std::fs::read(&f.cache).unwrap(), std::fs::read(&other_content).unwrap()),
        "a refused attach wrote"
    );
    ok(&["check", "--cache", s(&f.cache), "--backing", s(&f.backing)]);
}

#[test]
fn corrupted_foreign_or_newer_superblocks_are_refused_by_name() {
    use std::os::unix::fs::FileExt;
    let f = files();
    create(&f);
    let file = || std::fs::OpenOptions::new().read(true).write(true).open(&f.cache).unwrap();
    // One damaged copy: the other one is used.
    file().write_all_at(&[0xff; 64], 100).unwrap();
    ok(&["status", "--cache", s(&f.cache)]);
    // Both damaged: a checksum error, not a crash and not "unformatted".
    file().write_all_at(&[0xff; 64], BS as u64 + 100).unwrap();
    fails_with(&["status", "--cache", s(&f.cache)], "checksum mismatch");
    // A newer format version (valid checksum): refused by name.
    let g = files();
    create(&g);
    let gf = std::fs::OpenOptions::new().read(true).write(true).open(&g.cache).unwrap();
    for copy in [0u64, BS as u64] {
        let mut sb = vec![0u8; 512];
        gf.read_exact_at(&mut sb, copy).unwrap();
        sb[16..20].copy_from_slice(&(tiercache_format::constants::FORMAT_VERSION + 1).to_le_bytes());
        let crc = tiercache_format::checksum(&sb[4..]);
        sb[..4].copy_from_slice(&crc.to_le_bytes());
        gf.write_all_at(&sb, copy).unwrap();
    }
    fails_with(&["status", "--cache", s(&g.cache)], "newer than this build supports");
    // An older format version: refused by name, with what to do.
    for copy in [0u64, BS as u64] {
        let mut sb = vec![0u8; 512];
        gf.read_exact_at(&mut sb, copy).unwrap();
        sb[16..20].copy_from_slice(&1u32.to_le_bytes());
        let crc = tiercache_format::checksum(&sb[4..]);
        sb[..4].copy_from_slice(&crc.to_le_bytes());
        gf.write_all_at(&sb, copy).unwrap();
    }
    fails_with(&["status", "--cache", s(&g.cache)], "written by an older tiercache");
    // ... and `create` does not format over it without --force (it may hold dirty data).
    let before = std::fs::read(&g.cache).unwrap();
    fails_with(&["create", "--cache", s(&g.cache), "--backing", s(&g.backing)], "pass --force");
    assert_eq!(before, std::fs::read(&g.cache).unwrap(), "a refused create wrote");
    // Not a cache at all.
    fails_with(&["status", "--cache", s(&g.backing)], "is not a tiercache cache");
}
