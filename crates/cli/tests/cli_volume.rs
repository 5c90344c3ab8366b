//! Proves the volume commands work end to end and refuse bad input with one precise line,
//! changing nothing: create, status, check and flush on real files; a wrong backing device
//! (by size and by content), a corrupted superblock, a newer format version, a device that is
//! not a cache, and a reformat without --force. After `flush`, the backing file alone holds
//! every block's newest data.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const BS: usize = 4096;
const BACKING_BYTES: u64 = 64 << 20;

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
    // Larger than the 32 MiB caches below: a backing device no larger than its cache is
    // refused as a likely swap of arguments.
    std::fs::File::create(&backing).unwrap().set_len(BACKING_BYTES).unwrap();
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
    // (No --backing: the cache records its backing device's absolute path.)
    let out = ok(&["flush", "--cache", s(&f.cache)]);
    assert!(out.contains("the backing device now holds all data"), "{out}");
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
    let mut data = vec![0u8; BACKING_BYTES as usize];
    *data.last_mut().unwrap() = 1; // same size, different last block
    std::fs::write(&other_content, &data).unwrap();
    let before = (std::fs::read(&f.cache).unwrap(), std::fs::read(&other_content).unwrap());
    for (other, why) in [
        (&other_size, "its size is 4194304 bytes"),
        (&other_content, "its block 16383 (bytes 67104768..67108864) has checksum"),
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

/// A checksum of a whole file (to show that a refused command left it unchanged).
fn sha(path: &Path) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    std::fs::read(path).unwrap().hash(&mut h);
    h.finish()
}

/// Issue 14's mistakes, played as a tired operator would: each is refused with one line
/// naming what was found and the flag that overrides it, and the target's bytes are
/// unchanged; the flags still work where they should.
#[test]
fn mistakes_that_would_destroy_data_are_refused_and_change_nothing() {
    let f = files();
    let dir = f.cache.parent().unwrap();
    // An ext4 file system, an MBR partition table, a swap area.
    let fs = dir.join("fs.img");
    std::fs::File::create(&fs).unwrap().set_len(32 << 20).unwrap();
    let mkfs = Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&fs).status().expect("mkfs.ext4 (e2fsprogs)");
    assert!(mkfs.success());
    let pt = dir.join("pt.img");
    let mut mbr = vec![0u8; 1 << 20];
    mbr[446 + 4] = 0x83; // a Linux partition
    mbr[446 + 8..446 + 12].copy_from_slice(&2048u32.to_le_bytes());
    mbr[446 + 12..446 + 16].copy_from_slice(&100_000u32.to_le_bytes());
    mbr[510] = 0x55;
    mbr[511] = 0xaa;
    std::fs::write(&pt, &mbr).unwrap();
    std::fs::File::options().write(true).open(&pt).unwrap().set_len(32 << 20).unwrap();
    let swap = dir.join("swap.img");
    std::fs::File::create(&swap).unwrap().set_len(16 << 20).unwrap();
    assert!(Command::new("mkswap").arg("-q").arg(&swap).status().expect("mkswap (util-linux)").success());
    let before = [sha(&fs), sha(&pt), sha(&swap), sha(&f.backing)];

    for (target, what) in [(&fs, "an ext4 file system"), (&pt, "a dos partition table"), (&swap, "a Linux swap area")] {
        fails_with(
            &["create", "--cache", s(target), "--backing", s(&f.backing)],
            &format!("holds {what}; formatting it as a cache destroys it; pass --force"),
        );
        fails_with(
            &["bench", "fsync", "--target", s(target), "--seconds", "0.1"],
            &format!("holds {what}, and the benchmark overwrites its first 4 KiB; pass --destructive"),
        );
    }
    fails_with(
        &["bench", "fsync", "--cache", s(&fs), "--backing", s(&pt), "--seconds", "0.1"],
        "holds an ext4 file system, and the benchmark formats it as a cache; pass --destructive",
    );
    fails_with(
        &["bench", "randwrite", "--cache", s(&fs), "--backing", s(&pt), "--seconds", "0.1"],
        "holds an ext4 file system, and the benchmark formats it as a cache; pass --destructive",
    );
    fails_with(
        &["bench", "randwrite", "--cache", s(&swap), "--backing", s(&pt), "--seconds", "0.1"],
        "holds a Linux swap area, and the benchmark formats it as a cache; pass --destructive",
    );
    // (bench seq takes real devices only with --destructive, and still refuses a dirty cache.)
    usage_error(&["bench", "seq", "--cache", s(&fs), "--backing", s(&pt)], "required arguments were not provided");
    fails_with(
        &[
            "bench",
            "seq",
            "--cache",
            s(&fs),
            "--backing",
            s(&pt),
            "--destructive",
            "--cache-size",
            "32M",
            "--bytes",
            "4M",
        ],
        "--cache needs",
    );
    assert_eq!(before, [sha(&fs), sha(&pt), sha(&swap), sha(&f.backing)], "a refused command wrote");

    // A tiercache cache as the backing device (swapped arguments); a backing device no
    // larger than the cache; an absurd size: refused, and no cache file left behind.
    create(&f);
    let cache_before = sha(&f.cache);
    let other = dir.join("other-cache.img");
    fails_with(
        &["create", "--cache", s(&other), "--cache-size", "16M", "--backing", s(&f.cache)],
        "holds a tiercache cache (for backing",
    );
    fails_with(&["create", "--cache", s(&other), "--cache-size", "16M", "--backing", s(&f.cache)], "swapped");
    fails_with(
        &["create", "--cache", s(&other), "--cache-size", "64M", "--backing", s(&f.backing)],
        "(64.00 MiB) is no larger than the cache (64.00 MiB): are --cache and --backing swapped? (pass --force",
    );
    fails_with(&["create", "--cache", s(&other), "--cache-size", "10P", "--backing", s(&f.backing)], "no larger");
    fails_with(
        &["create", "--cache", s(&other), "--cache-size", "10P", "--backing", s(&f.backing), "--force"],
        "--cache-size 11258999068426240: sizing",
    );
    assert!(!other.exists(), "a refused create left a cache file behind");
    assert_eq!(cache_before, sha(&f.cache), "a refused create wrote the cache used as backing");

    // The backing path is stored absolute: `status` names it from any directory.
    let st: serde_json::Value = serde_json::from_str(&ok(&["status", "--cache", s(&f.cache), "--json"])).unwrap();
    assert!(st.to_string().contains(&format!("\"{}\"", s(&f.backing))), "{st}");

    // A cache holding dirty data is never formatted by a benchmark, whatever the flag.
    ok(&["debug-load", "--cache", s(&f.cache), "--backing", s(&f.backing), "--blocks", "64", "--writes", "100"]);
    let dirty_before = sha(&f.cache);
    for extra in [&[][..], &["--destructive"][..]] {
        let mut args = vec!["bench", "fsync", "--cache", s(&f.cache), "--backing", s(&fs), "--seconds", "0.1"];
        args.extend_from_slice(extra);
        fails_with(&args, "dirty blocks found nowhere else");
        let mut args = vec!["bench", "fsync", "--target", s(&f.cache), "--seconds", "0.1"];
        args.extend_from_slice(extra);
        fails_with(&args, "--destructive does not override this");
    }
    assert_eq!(dirty_before, sha(&f.cache), "a refused benchmark wrote a dirty cache");

    // The flags still work where they should.
    ok(&["bench", "fsync", "--target", s(&swap), "--seconds", "0.1", "--rounds", "1", "--destructive", "--json"]);
    ok(&["create", "--cache", s(&fs), "--backing", s(&f.backing), "--force", "--json"]);
    let st: serde_json::Value = serde_json::from_str(&ok(&["status", "--cache", s(&fs), "--json"])).unwrap();
    assert_eq!(st["state"], "ok");
}

/// `--fuse` over a directory with files in it is refused (it would hide them), and
/// `--nbd tcp:0` says which port it got.
#[test]
fn serve_refuses_a_non_empty_mount_directory_and_names_the_port_it_got() {
    use std::io::BufRead;
    let f = files();
    create(&f);
    let dir = f.cache.parent().unwrap().join("mnt");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("precious.txt"), b"keep me").unwrap();
    let before = sha(&f.cache);
    fails_with(
        &["serve", "--cache", s(&f.cache), "--backing", s(&f.backing), "--fuse", s(&dir)],
        "not empty (mounting there would hide its files)",
    );
    assert_eq!(before, sha(&f.cache), "a refused serve touched the cache");

    let mut child = Command::new(env!("CARGO_BIN_EXE_tiercache"))
        .args(["serve", "--cache", s(&f.cache), "--backing", s(&f.backing), "--nbd", "tcp:0"])
        .args(["--control", s(&f.cache.with_extension("sock"))])
        .env("TIERCACHE_LOG", "warn")
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Drained to the end in a thread: the server writes more on its way out.
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let (tx, rx) = std::sync::mpsc::channel();
    let drain = std::thread::spawn(move || {
        for l in stderr.lines().map_while(Result::ok) {
            let _ = tx.send(l);
        }
    });
    let line = rx.iter().find(|l| l.contains("serving")).expect("a serving line");
    let port: u16 = line
        .split("tcp:127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"));
    assert_ne!(port, 0, "{line}");
    std::net::TcpStream::connect(("127.0.0.1", port)).expect("the port it named accepts connections");
    // SAFETY: kill(2) on a child we own.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    assert!(child.wait().unwrap().success());
    drain.join().unwrap();
}

/// `status` only looks: it works on a read-only copy of a cache and changes nothing.
#[test]
fn status_and_check_read_a_read_only_copy_of_a_cache() {
    use std::os::unix::fs::PermissionsExt;
    let f = files();
    create(&f);
    ok(&["debug-load", "--cache", s(&f.cache), "--backing", s(&f.backing), "--blocks", "64", "--writes", "100"]);
    let copy = f.cache.with_file_name("copy.img");
    std::fs::copy(&f.cache, &copy).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o444)).unwrap();
    let before = sha(&copy);
    let st: serde_json::Value = serde_json::from_str(&ok(&["status", "--cache", s(&copy), "--json"])).unwrap();
    assert_eq!(st["state"], "ok");
    assert!(st["dirty_blocks"].as_u64().unwrap() > 0, "{st}");
    assert_eq!(before, sha(&copy), "status changed a read-only copy");
    // So does check, with the backing device read-only too.
    let backing_copy = f.backing.with_file_name("backing-copy.img");
    std::fs::copy(&f.backing, &backing_copy).unwrap();
    std::fs::set_permissions(&backing_copy, std::fs::Permissions::from_mode(0o444)).unwrap();
    let backing_before = sha(&backing_copy);
    let check: serde_json::Value =
        serde_json::from_str(&ok(&["check", "--cache", s(&copy), "--backing", s(&backing_copy), "--json"])).unwrap();
    assert_eq!(check["bad_dirty_blocks"], 0, "{check}");
    assert_eq!((before, backing_before), (sha(&copy), sha(&backing_copy)), "check changed a read-only copy");
    // Writing commands still refuse it, by name.
    fails_with(&["flush", "--cache", s(&copy), "--backing", s(&f.backing)], "no write permission");
}
