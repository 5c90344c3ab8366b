//! Proves the FUSE frontend under a real file system, as a user would stack it: the volume as
//! a FUSE file, `losetup --direct-io=on`, ext4, files written and fsynced, unmounted; then the
//! server is killed with SIGKILL, restarted, and the file system remounted: every file's
//! sha256 matches. A clean SIGTERM unmounts FUSE. Needs root, /dev/fuse and fuse3 (installed
//! by scripts/test), e2fsprogs and util-linux.

mod common;

use common::{ok_json, p, sigterm, tiercache_cmd, TempVolume};
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

/// The file's sha256, from coreutils' sha256sum (no hashing crate needed for a test).
fn sha256_file(path: &Path) -> String {
    run("sha256sum", &[p(path)]).split_whitespace().next().unwrap().to_string()
}

fn run(cmd: &str, args: &[&str]) -> String {
    let out = Command::new(cmd).args(args).output().unwrap_or_else(|e| panic!("{cmd}: {e}"));
    assert!(out.status.success(), "{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

struct Stack {
    vol: TempVolume,
    /// `serve --fuse-transport`.
    transport: &'static str,
    server: Option<Child>,
    loop_dev: Option<String>,
    mounted: bool,
}

impl Stack {
    fn path(&self, name: &str) -> PathBuf {
        self.vol.path(name)
    }

    fn start_server(&mut self) {
        let child = tiercache_cmd()
            .args(["serve", "--cache", p(&self.vol.cache), "--backing", p(&self.vol.backing)])
            .args(["--fuse", p(&self.path("fuse")), "--fuse-transport", self.transport])
            // Logs go to a file, as under a service manager (checked at the clean stop).
            .stderr(std::fs::File::create(self.path("serve.log")).unwrap())
            .spawn()
            .unwrap();
        self.server = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while !self.path("fuse/volume").exists() {
            assert!(Instant::now() < deadline, "the FUSE file did not appear");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn attach_and_mount(&mut self, mkfs: bool) {
        let dev = run("losetup", &["--direct-io=on", "--show", "-f", p(&self.path("fuse/volume"))]);
        self.loop_dev = Some(dev.clone());
        if mkfs {
            run("mkfs.ext4", &["-q", "-E", "nodiscard", &dev]);
        }
        run("mount", &[&dev, p(&self.path("ext"))]);
        self.mounted = true;
    }

    fn unmount_and_detach(&mut self) {
        if self.mounted {
            run("umount", &[p(&self.path("ext"))]);
            self.mounted = false;
        }
        if let Some(dev) = self.loop_dev.take() {
            let _ = Command::new("losetup").args(["-d", &dev]).status();
        }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if self.mounted {
            let _ = Command::new("umount").args(["-l", p(&self.path("ext"))]).status();
        }
        if let Some(dev) = self.loop_dev.take() {
            let _ = Command::new("losetup").args(["-d", &dev]).status();
        }
        if let Some(mut c) = self.server.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = Command::new("umount").args(["-l", p(&self.path("fuse"))]).status();
    }
}

#[test]
fn ext4_on_loop_on_the_fuse_file_survives_sigkill_of_the_server() {
    survives_sigkill("dev", "/dev/fuse");
}

#[test]
fn ext4_on_loop_on_the_fuse_file_survives_sigkill_of_the_server_through_io_uring() {
    if common::enable_fuse_uring() {
        survives_sigkill("io-uring", "io_uring");
    }
}

/// `tiercache preload FILE` of a file on ext4 on the FUSE file, the way the README and
/// bench/preload-bench.sh use it: `status` lists the FUSE file among the endpoints (it was left
/// out, and `preload` then refused the file: "the server serves no FUSE file", a new-user
/// audit, 2026-11-30), and the file's blocks are preloaded.
#[test]
fn a_file_on_ext4_on_the_fuse_file_is_preloaded_by_name() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test mounts file systems: run it as root (CI does)");
    let vol = TempVolume::created(256 << 20, "64M");
    for d in ["fuse", "ext"] {
        std::fs::create_dir(vol.path(d)).unwrap();
    }
    let mut st = Stack { vol, transport: "dev", server: None, loop_dev: None, mounted: false };
    st.start_server();
    st.attach_and_mount(true);
    let table = st.path("ext/table.ibd");
    run("dd", &["if=/dev/urandom", &format!("of={}", p(&table)), "bs=1M", "count=4", "conv=fsync", "status=none"]);
    let cache = p(&st.vol.cache).to_string();
    let status = ok_json(&["status", "--cache", &cache, "--json"]);
    let fuse = format!("FUSE {}", p(&st.path("fuse/volume")));
    assert!(
        status["server"]["endpoints"].as_array().unwrap().iter().any(|e| e.as_str().unwrap().starts_with(&fuse)),
        "no {fuse} among the endpoints: {status}"
    );
    let out = ok_json(&["preload", "--cache", &cache, p(&table), "--json"]);
    assert_eq!(out["bytes"], 4 << 20, "{out}");
    let status = ok_json(&["status", "--cache", &cache, "--json"]);
    assert!(status["counters"]["preloaded_blocks"].as_u64().unwrap() >= 1024, "{status}");
    st.unmount_and_detach();
    let mut c = st.server.take().unwrap();
    sigterm(&c);
    assert!(c.wait().unwrap().success());
}

/// The whole story with the server's FUSE requests coming `--fuse-transport TRANSPORT`; its
/// log must name `shown` as the way they came.
fn survives_sigkill(transport: &'static str, shown: &str) {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test mounts file systems: run it as root (CI does)");
    let vol = TempVolume::created(256 << 20, "64M");
    for d in ["fuse", "ext"] {
        std::fs::create_dir(vol.path(d)).unwrap();
    }
    let mut st = Stack { vol, transport, server: None, loop_dev: None, mounted: false };
    st.start_server();
    st.attach_and_mount(true);
    // Files of many sizes, each fsynced (dd conv=fsync), plus a directory tree.
    let mut sums = Vec::new();
    for i in 0..40u64 {
        let f = st.path("ext").join(format!("f{i}"));
        let data: Vec<u8> = (0..(i * 7919 + 1)).map(|b| (b.wrapping_mul(i + 3) >> 3) as u8).collect();
        std::fs::write(&f, &data).unwrap();
        std::fs::File::open(&f).unwrap().sync_all().unwrap();
        sums.push((f, sha256_file(&st.path("ext").join(format!("f{i}")))));
    }
    run(
        "dd",
        &[
            "if=/dev/urandom",
            &format!("of={}", p(&st.path("ext/big.bin"))),
            "bs=1M",
            "count=16",
            "conv=fsync",
            "status=none",
        ],
    );
    sums.push((st.path("ext/big.bin"), sha256_file(&st.path("ext/big.bin"))));
    st.unmount_and_detach();

    // SIGKILL the server with the file system cleanly unmounted, then bring everything back.
    let mut c = st.server.take().unwrap();
    c.kill().unwrap();
    c.wait().unwrap();
    // The same command again, with the dead mount still there: it says what to do (an
    // operator audit, 2026-11-30: "not a directory").
    let again = tiercache_cmd()
        .args(["serve", "--cache", p(&st.vol.cache), "--backing", p(&st.vol.backing)])
        .args(["--fuse", p(&st.path("fuse")), "--fuse-transport", st.transport])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(
        !again.status.success() && err.contains("a FUSE mount whose server is gone") && err.contains("umount -l"),
        "{err}"
    );
    let _ = Command::new("umount").args(["-l", p(&st.path("fuse"))]).status();
    st.start_server();
    st.attach_and_mount(false);
    for (f, sum) in &sums {
        assert_eq!(&sha256_file(f), sum, "{} changed across SIGKILL", f.display());
    }
    // O_DIRECT straight on the FUSE file works too.
    st.unmount_and_detach();
    run(
        "dd",
        &[
            "if=/dev/zero",
            &format!("of={}", p(&st.path("fuse/volume"))),
            "bs=4k",
            "count=1",
            "seek=60000",
            "oflag=direct",
            "conv=notrunc,fsync",
            "status=none",
        ],
    );

    // SIGTERM: clean stop, FUSE unmounted.
    let mut c = st.server.take().unwrap();
    sigterm(&c);
    assert!(c.wait().unwrap().success());
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap();
    assert!(!mounts.contains(p(&st.path("fuse"))), "FUSE still mounted after SIGTERM");
    // Logs written to a file: no terminal escape codes, and a clean stop warns of nothing.
    let log = std::fs::read_to_string(st.path("serve.log")).unwrap();
    assert!(log.contains("stopped cleanly"), "{log}");
    assert!(log.contains(&format!("/volume ({shown})")), "not served through {shown}: {log}");
    assert!(!log.contains('\x1b'), "escape codes in a log file: {log:?}");
    // (This server started after the SIGKILL above, and says so, once.)
    let unclean = log.lines().filter(|l| l.contains("WARN") && l.contains("the last stop was not clean")).count();
    assert_eq!(unclean, 1, "the start after a SIGKILL names the unclean stop: {log}");
    let others = log
        .lines()
        .filter(|l| (l.contains("WARN") || l.contains("ERROR")) && !l.contains("the last stop was not clean"));
    assert_eq!(others.count(), 0, "a clean stop logged a warning: {log}");
}
