//! Proves the volume commands work end to end and refuse bad input with one precise line,
//! changing nothing: create, status, check and flush on real files; a wrong backing device
//! (by size and by content), a corrupted superblock, a newer format version, a device that is
//! not a cache, and a reformat without --force. After `flush`, the backing file alone holds
//! every block's newest data.

mod common;

use common::{
    debug_load_blocks, fails_with, ok, ok_json, p, spawn_until_line, stamped_version, tiercache, tiercache_cmd,
    TempVolume,
};
use std::path::Path;
use std::process::Command;

const BS: usize = 4096;
const BACKING_BYTES: u64 = 64 << 20;

/// Argument errors come from clap: the precise message on the first line, then a hint.
fn usage_error(args: &[&str], expected: &str) {
    let out = tiercache(args);
    assert_eq!(out.status.code(), Some(2), "{args:?}");
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(stderr.lines().next().unwrap().contains(expected), "{args:?}: {stderr:?} lacks {expected:?}");
}

/// A temporary directory with a 64 MiB backing file: larger than the 32 MiB caches below (a
/// backing device no larger than its cache is refused as a likely swap of arguments).
fn files() -> TempVolume {
    TempVolume::new(BACKING_BYTES)
}

fn create(f: &TempVolume) {
    f.create("32M");
}

/// `files()` with a 32 MiB cache created for them.
fn created() -> TempVolume {
    let f = files();
    create(&f);
    f
}

#[test]
fn create_status_check_flush_life_cycle() {
    let f = files();
    let v = ok_json(&["create", "--cache", p(&f.cache), "--cache-size", "32M", "--backing", p(&f.backing), "--json"]);
    assert_eq!(v["cache_size_bytes"], 32 << 20);
    assert_eq!(std::fs::metadata(&f.cache).unwrap().len(), 32 << 20);
    // Write through the volume: 3000 stamped random writes, flushed, then a clean shutdown.
    f.debug_load(&["--blocks", "2048", "--writes", "3000", "--seed", "9"]);
    let st = ok_json(&["status", "--cache", p(&f.cache), "--json"]);
    assert_eq!(st["mode"], "write-back");
    assert_eq!(st["state"], "ok");
    assert!(st["cached_blocks"].as_u64().unwrap() > 0, "{st}");
    assert!(st["dirty_blocks"].as_u64().unwrap() > 0, "{st}");
    let ram = st["index_ram_bytes_per_cached_block"].as_f64().unwrap();
    assert!(ram > 0.0 && ram <= 16.0, "index RAM per cached block {ram}");
    assert_eq!(st["fingerprint_hash"], "xxh3", "{st}");
    let human = ok(&["status", "--cache", p(&f.cache)]);
    assert!(human.contains("index RAM") && human.contains("dirty"), "{human}");
    assert!(human.contains("backing identified by  XXH3 of its signature blocks"), "{human}");
    // Offline, the dirty data's age is unknown (it was shown as 0.0 s: a new-user audit).
    assert!(st["oldest_dirty_age_seconds"].is_null(), "{st}");
    assert!(human.contains("oldest dirty           unknown (written before this process opened the cache)"), "{human}");
    let check = ok_json(&["check", "--cache", p(&f.cache), "--backing", p(&f.backing), "--json"]);
    assert_eq!(check["bad_dirty_blocks"], 0);
    assert_eq!(check["clean_blocks_differing_from_backing"], 0);
    // (No --backing: the cache records its backing device's absolute path.)
    let out = ok(&["flush", "--cache", p(&f.cache)]);
    assert!(out.contains("the backing device now holds all data"), "{out}");
    let st = ok_json(&["status", "--cache", p(&f.cache), "--json"]);
    assert_eq!(st["dirty_blocks"], 0, "{st}");
    // The backing file alone now holds the newest version of every block written.
    let mut newest = vec![0u64; 2048];
    for (i, block) in debug_load_blocks(9, 2048).take(3000).enumerate() {
        newest[block as usize] = i as u64 + 1;
    }
    let backing = std::fs::read(&f.backing).unwrap();
    for (block, &version) in newest.iter().enumerate() {
        let data = &backing[block * BS..(block + 1) * BS];
        // (0: never written, all zeroes.)
        assert_eq!(stamped_version(block as u64, data, &format!("block {block}")), version, "block {block}");
    }
}

#[test]
fn create_refuses_bad_input_and_writes_nothing() {
    let f = files();
    let missing = f.backing.with_file_name("nope.img");
    fails_with(&["create", "--cache", p(&f.cache), "--cache-size", "32M", "--backing", p(&missing)], "no such file");
    assert!(!f.cache.exists(), "a cache file was created for a bad backing");
    fails_with(&["create", "--cache", p(&f.cache), "--backing", p(&f.backing)], "give --cache-size");
    fails_with(&["create", "--cache", p(&f.cache), "--cache-size", "1M", "--backing", p(&f.backing)], "too small");
    assert!(!f.cache.exists());
    // Refused before the file is created (it would be written in full first), in the units given.
    let sized = ["create", "--cache", p(&f.cache), "--cache-size", "32M", "--backing", p(&f.backing)];
    fails_with(
        &[&sized[..], &["--dirty-low", "80", "--dirty-high", "20"]].concat(),
        "--dirty-low 80 % is above --dirty-high 20 %",
    );
    fails_with(&[&sized[..], &["--block-size", "1000"]].concat(), "--block-size 1000 is not a power of two");
    assert!(!f.cache.exists(), "a cache file was created for bad options");
    usage_error(
        &["create", "--cache", p(&f.cache), "--cache-size", "lots", "--backing", p(&f.backing)],
        "is not a size",
    );
    create(&f);
    let before = std::fs::read(&f.cache).unwrap();
    fails_with(
        &["create", "--cache", p(&f.cache), "--cache-size", "64M", "--backing", p(&f.backing)],
        "exists with 33554432 bytes",
    );
    fails_with(&["create", "--cache", p(&f.cache), "--backing", p(&f.backing)], "already holds a tiercache cache");
    assert_eq!(before, std::fs::read(&f.cache).unwrap(), "a refused create changed the cache");
    ok(&["create", "--cache", p(&f.cache), "--backing", p(&f.backing), "--force"]);
}

#[test]
fn a_wrong_backing_device_is_refused_and_nothing_changes() {
    let f = created();
    f.debug_load(&["--blocks", "64", "--writes", "200"]);
    let other_size = f.backing.with_file_name("other-size.img");
    std::fs::write(&other_size, vec![0u8; 4 << 20]).unwrap();
    let other_content = f.backing.with_file_name("other-content.img");
    let mut data = vec![0u8; BACKING_BYTES as usize];
    *data.last_mut().unwrap() = 1; // same size, different last block
    std::fs::write(&other_content, &data).unwrap();
    let before = (std::fs::read(&f.cache).unwrap(), std::fs::read(&other_content).unwrap());
    for (other, why) in [
        (&other_size, "its size is 4194304 bytes"),
        (&other_content, "its block 16383 (bytes 67104768..67108864) has fingerprint"),
    ] {
        for cmd in ["flush", "check"] {
            fails_with(&[cmd, "--cache", p(&f.cache), "--backing", p(other)], why);
        }
    }
    assert_eq!(
        before,
        (std::fs::read(&f.cache).unwrap(), std::fs::read(&other_content).unwrap()),
        "a refused attach wrote"
    );
    ok(&["check", "--cache", p(&f.cache), "--backing", p(&f.backing)]);
}

#[test]
fn corrupted_foreign_or_newer_superblocks_are_refused_by_name() {
    use std::os::unix::fs::FileExt;
    let f = created();
    let file = || std::fs::OpenOptions::new().read(true).write(true).open(&f.cache).unwrap();
    // One damaged copy: the other one is used.
    file().write_all_at(&[0xff; 64], 100).unwrap();
    ok(&["status", "--cache", p(&f.cache)]);
    // Both damaged: a checksum error, not a crash and not "unformatted".
    file().write_all_at(&[0xff; 64], BS as u64 + 100).unwrap();
    fails_with(&["status", "--cache", p(&f.cache)], "checksum mismatch");
    // A newer format version (valid checksum): refused by name.
    let g = created();
    let gf = std::fs::OpenOptions::new().read(true).write(true).open(&g.cache).unwrap();
    for copy in [0u64, BS as u64] {
        let mut sb = vec![0u8; 512];
        gf.read_exact_at(&mut sb, copy).unwrap();
        sb[16..20].copy_from_slice(&(tiercache_format::constants::FORMAT_VERSION + 1).to_le_bytes());
        let crc = tiercache_format::checksum(&sb[4..]);
        sb[..4].copy_from_slice(&crc.to_le_bytes());
        gf.write_all_at(&sb, copy).unwrap();
    }
    fails_with(&["status", "--cache", p(&g.cache)], "newer than this build supports");
    // An older format version: refused by name, with what to do.
    for copy in [0u64, BS as u64] {
        let mut sb = vec![0u8; 512];
        gf.read_exact_at(&mut sb, copy).unwrap();
        sb[16..20].copy_from_slice(&1u32.to_le_bytes());
        let crc = tiercache_format::checksum(&sb[4..]);
        sb[..4].copy_from_slice(&crc.to_le_bytes());
        gf.write_all_at(&sb, copy).unwrap();
    }
    fails_with(&["status", "--cache", p(&g.cache)], "written by an older tiercache");
    // ... and `create` does not format over it without --force (it may hold dirty data).
    let before = std::fs::read(&g.cache).unwrap();
    fails_with(&["create", "--cache", p(&g.cache), "--backing", p(&g.backing)], "pass --force");
    assert_eq!(before, std::fs::read(&g.cache).unwrap(), "a refused create wrote");
    // Not a cache at all.
    fails_with(&["status", "--cache", p(&g.backing)], "is not a tiercache cache");
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
            &["create", "--cache", p(target), "--backing", p(&f.backing)],
            &format!("holds {what}; formatting it as a cache destroys it; pass --force"),
        );
        fails_with(
            &["bench", "fsync", "--target", p(target), "--seconds", "0.1"],
            &format!("holds {what}, and the benchmark overwrites its first 4 KiB; pass --destructive"),
        );
    }
    fails_with(
        &["bench", "fsync", "--cache", p(&fs), "--backing", p(&pt), "--seconds", "0.1"],
        "holds an ext4 file system, and the benchmark formats it as a cache; pass --destructive",
    );
    fails_with(
        &["bench", "randwrite", "--cache", p(&fs), "--backing", p(&pt), "--seconds", "0.1"],
        "holds an ext4 file system, and the benchmark formats it as a cache; pass --destructive",
    );
    fails_with(
        &["bench", "randwrite", "--cache", p(&swap), "--backing", p(&pt), "--seconds", "0.1"],
        "holds a Linux swap area, and the benchmark formats it as a cache; pass --destructive",
    );
    // (bench seq takes real devices only with --destructive, and still refuses a dirty cache.)
    usage_error(&["bench", "seq", "--cache", p(&fs), "--backing", p(&pt)], "required arguments were not provided");
    fails_with(
        &[
            "bench",
            "seq",
            "--cache",
            p(&fs),
            "--backing",
            p(&pt),
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
        &["create", "--cache", p(&other), "--cache-size", "16M", "--backing", p(&f.cache)],
        "holds a tiercache cache (for backing",
    );
    fails_with(&["create", "--cache", p(&other), "--cache-size", "16M", "--backing", p(&f.cache)], "swapped");
    fails_with(
        &["create", "--cache", p(&other), "--cache-size", "64M", "--backing", p(&f.backing)],
        "(64.00 MiB) is no larger than the cache (64.00 MiB): are --cache and --backing swapped? (pass --force",
    );
    fails_with(&["create", "--cache", p(&other), "--cache-size", "10P", "--backing", p(&f.backing)], "no larger");
    fails_with(
        &["create", "--cache", p(&other), "--cache-size", "10P", "--backing", p(&f.backing), "--force"],
        "--cache-size 11258999068426240: sizing",
    );
    assert!(!other.exists(), "a refused create left a cache file behind");
    assert_eq!(cache_before, sha(&f.cache), "a refused create wrote the cache used as backing");

    // The backing path is stored absolute: `status` names it from any directory.
    let st = ok_json(&["status", "--cache", p(&f.cache), "--json"]);
    assert!(st.to_string().contains(&format!("\"{}\"", p(&f.backing))), "{st}");

    // A cache holding dirty data is never formatted by a benchmark, whatever the flag.
    f.debug_load(&["--blocks", "64", "--writes", "100"]);
    let dirty_before = sha(&f.cache);
    for extra in [&[][..], &["--destructive"][..]] {
        let mut args = vec!["bench", "fsync", "--cache", p(&f.cache), "--backing", p(&fs), "--seconds", "0.1"];
        args.extend_from_slice(extra);
        fails_with(&args, "dirty blocks found nowhere else");
        let mut args = vec!["bench", "fsync", "--target", p(&f.cache), "--seconds", "0.1"];
        args.extend_from_slice(extra);
        fails_with(&args, "--destructive does not override this");
    }
    assert_eq!(dirty_before, sha(&f.cache), "a refused benchmark wrote a dirty cache");

    // The flags still work where they should.
    ok(&["bench", "fsync", "--target", p(&swap), "--seconds", "0.1", "--rounds", "1", "--destructive", "--json"]);
    ok(&["create", "--cache", p(&fs), "--backing", p(&f.backing), "--force", "--json"]);
    let st = ok_json(&["status", "--cache", p(&fs), "--json"]);
    assert_eq!(st["state"], "ok");
}

/// `--fuse` over a directory with files in it is refused (it would hide them), and
/// `--nbd tcp:0` says which port it got.
#[test]
fn serve_refuses_a_non_empty_mount_directory_and_names_the_port_it_got() {
    let f = created();
    let dir = f.cache.parent().unwrap().join("mnt");
    std::fs::create_dir(&dir).unwrap();
    std::fs::write(dir.join("precious.txt"), b"keep me").unwrap();
    let before = sha(&f.cache);
    fails_with(
        &["serve", "--cache", p(&f.cache), "--backing", p(&f.backing), "--fuse", p(&dir)],
        "not empty (mounting there would hide its files)",
    );
    assert_eq!(before, sha(&f.cache), "a refused serve touched the cache");

    // (Stderr is drained to the end in a thread: the server writes more on its way out.)
    let (server, line) = spawn_until_line(
        tiercache_cmd()
            .args(["serve", "--cache", p(&f.cache), "--backing", p(&f.backing), "--nbd", "tcp:0"])
            .args(["--control", p(&f.cache.with_extension("sock"))])
            .env("TIERCACHE_LOG", "warn"),
        |l| l.contains("serving"),
    );
    let port: u16 = line
        .split("tcp:127.0.0.1:")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit()).next())
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {line:?}"));
    assert_ne!(port, 0, "{line}");
    std::net::TcpStream::connect(("127.0.0.1", port)).expect("the port it named accepts connections");
    assert!(server.terminate().success());
}

/// `status` only looks: it works on a read-only copy of a cache and changes nothing.
#[test]
fn status_and_check_read_a_read_only_copy_of_a_cache() {
    use std::os::unix::fs::PermissionsExt;
    let f = created();
    f.debug_load(&["--blocks", "64", "--writes", "100"]);
    let copy = f.cache.with_file_name("copy.img");
    std::fs::copy(&f.cache, &copy).unwrap();
    std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o444)).unwrap();
    let before = sha(&copy);
    let st = ok_json(&["status", "--cache", p(&copy), "--json"]);
    assert_eq!(st["state"], "ok");
    assert!(st["dirty_blocks"].as_u64().unwrap() > 0, "{st}");
    assert_eq!(before, sha(&copy), "status changed a read-only copy");
    // So does check, with the backing device read-only too.
    let backing_copy = f.backing.with_file_name("backing-copy.img");
    std::fs::copy(&f.backing, &backing_copy).unwrap();
    std::fs::set_permissions(&backing_copy, std::fs::Permissions::from_mode(0o444)).unwrap();
    let backing_before = sha(&backing_copy);
    let check = ok_json(&["check", "--cache", p(&copy), "--backing", p(&backing_copy), "--json"]);
    assert_eq!(check["bad_dirty_blocks"], 0, "{check}");
    assert_eq!((before, backing_before), (sha(&copy), sha(&backing_copy)), "check changed a read-only copy");
    // Writing commands still refuse it, by name.
    fails_with(&["flush", "--cache", p(&copy), "--backing", p(&f.backing)], "no write permission");
}

/// A device that is not a cache, named as the cache to the commands that open one (a new-user
/// audit, 2026-11-30: each answered "format it with `tiercache create`", for a file system and
/// for the backing device given in the cache's place alike): a file system there is named and
/// no format is suggested; swapped arguments are named as such; nothing changes.
#[test]
fn a_data_device_named_as_the_cache_is_named_not_offered_for_formatting() {
    let f = created();
    let fs = f.cache.with_file_name("fs.img");
    std::fs::File::create(&fs).unwrap().set_len(32 << 20).unwrap();
    let mkfs = Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&fs).status().expect("mkfs.ext4 (e2fsprogs)");
    assert!(mkfs.success());
    let before = (std::fs::read(&f.cache).unwrap(), std::fs::read(&f.backing).unwrap(), std::fs::read(&fs).unwrap());
    let (cache, backing, fs) = (p(&f.cache), p(&f.backing), p(&fs));
    let sock = f.path("s.sock");
    let nbd = format!("unix:{}", p(&sock));
    for args in [
        vec!["status", "--cache", fs],
        vec!["flush", "--cache", fs],
        vec!["flush", "--cache", fs, "--backing", backing],
        vec!["check", "--cache", fs, "--backing", backing],
        vec!["serve", "--cache", fs, "--backing", backing, "--nbd", &nbd],
    ] {
        let out = fails_with(&args, "it holds an ext4 file system; is it the device you meant?");
        assert!(!String::from_utf8_lossy(&out.stderr).contains("format it with"), "{args:?}");
    }
    for cmd in ["flush", "check"] {
        fails_with(&[cmd, "--cache", backing, "--backing", cache], "are --cache and --backing swapped?");
    }
    fails_with(&["serve", "--cache", backing, "--backing", cache, "--nbd", &nbd], "are --cache and --backing swapped?");
    // A server that did not come up leaves no socket behind (it bound it first).
    assert!(!sock.exists(), "a refused serve left its socket {}", sock.display());
    let after = (std::fs::read(&f.cache).unwrap(), std::fs::read(&f.backing).unwrap(), std::fs::read(fs).unwrap());
    assert!(before == after, "a refused command changed a device");
}
