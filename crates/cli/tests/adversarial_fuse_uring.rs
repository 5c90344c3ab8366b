//! An adversarial review of FUSE over io_uring (`serve --fuse --fuse-transport io-uring`,
//! crates/fuse/src/uring.rs): every suspicion a test.
//!
//! - Every answer the kernel can ask for (stat, readdir with small buffers and offsets,
//!   truncate, chmod, xattrs, creating things, statfs, lseek, fallocate modes, ioctls, ...) is
//!   the same through io_uring as through /dev/fuse (fuser's answers).
//! - Many threads on both CPUs with unaligned reads and writes from 1 byte to 1.5 MiB (split
//!   by the kernel), O_DIRECT, O_DSYNC, ZERO_RANGE, PUNCH_HOLE, reads across the end, batches
//!   of writes in flight together into shared blocks, and signals: the file equals a byte
//!   model, through either transport.
//! - Requests from one CPU beyond its queue's ring entries all complete (no starvation).
//! - Teardown: a SIGTERM refused while the file is in use leaves the ring serving; SIGKILL
//!   mid-write loses no fsynced block and the server comes back on the same directory; an
//!   aborted connection ends the writers and the server still stops cleanly.
//! - Fallback: where io_uring is forbidden (a seccomp filter, as in a container's default
//!   profile), `auto` serves through /dev/fuse and `io-uring` fails cleanly, even while
//!   something polls the mount as it comes up, with no mount left behind.
//!
//! - Few descriptors (RLIMIT_NOFILE just what /dev/fuse needs): `auto` still serves.
//!
//! What these found (fixed in crates/fuse with them): symlink(2) failed with ENOSYS through
//! the ring and EPERM through /dev/fuse; where io_uring is forbidden, a mount asked for it at
//! INIT held every request, a stat waiting in it made the unmount before the fallback fail
//! (EBUSY), and `auto` then died on the dead mount (ENOTCONN) and `io-uring` left it behind;
//! with few descriptors, `auto` mounted again through /dev/fuse while the ring's threads still
//! held theirs, and fuser's threads, short of descriptors, left the new mount unserved (every
//! access hung) although the log said "serving". (And in crates/fuse/src/uring.rs's unit
//! tests: a request whose handling panics was never answered.)
//!
//! Needs root, /dev/fuse and a kernel with FUSE over io_uring (else the tests skip). Every
//! wait is bounded: a request stuck in the kernel is ended by aborting the FUSE connection.

mod common;

use common::{p, TempVolume};
use rand::{Rng, SeedableRng};
use std::fs::{File, OpenOptions};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileExt, MetadataExt, OpenOptionsExt};
use std::os::unix::io::AsRawFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The tests of this file one at a time: they load both CPUs and time their waits.
static SERIAL: Mutex<()> = Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

fn uring_or_skip() -> bool {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test mounts file systems: run it as root (CI does)");
    common::enable_fuse_uring()
}

fn cstr(path: &Path) -> std::ffi::CString {
    std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap()
}

/// Whether `dir` is a mount point (listed in /proc/self/mountinfo).
fn mounted_at(dir: &Path) -> bool {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    std::fs::read_to_string("/proc/self/mountinfo").unwrap().lines().any(|l| l.split(' ').nth(4) == Some(p(&dir)))
}

/// The FUSE connection mounted at `dir` (its number under /sys/fs/fuse/connections: the
/// kernel's dev_t of the mount, (major << 20) | minor), from /proc/self/mountinfo.
fn connection_of(dir: &Path) -> Option<u64> {
    let dir = dir.canonicalize().ok()?;
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let line = info.lines().rfind(|l| l.split(' ').nth(4) == Some(p(&dir)))?;
    let (major, minor) = line.split(' ').nth(2)?.split_once(':')?;
    Some((major.parse::<u64>().ok()? << 20) | minor.parse::<u64>().ok()?)
}

/// Aborts the FUSE connection `conn` (its number under /sys/fs/fuse/connections): every
/// request waiting in it ends with an error. Mounts fusectl for it if it is not mounted (and
/// unmounts it again).
fn abort_connection(conn: u64) {
    let dir = Path::new("/sys/fs/fuse/connections");
    let mounted_here = !dir.join(conn.to_string()).exists()
        && Command::new("mount").args(["-t", "fusectl", "fusectl", p(dir)]).status().is_ok_and(|s| s.success());
    let _ = std::fs::write(dir.join(conn.to_string()).join("abort"), "1");
    if mounted_here {
        let _ = Command::new("umount").arg(dir).status();
    }
}

/// Runs `f`; if it takes more than `secs`, the FUSE connection `conn` is aborted (which ends
/// any request stuck in it) and the test fails.
fn bounded<T>(secs: u64, conn: u64, what: &str, f: impl FnOnce() -> T) -> T {
    let done = AtomicBool::new(false);
    std::thread::scope(|s| {
        let dog = s.spawn(|| {
            let deadline = Instant::now() + Duration::from_secs(secs);
            while !done.load(Ordering::Acquire) {
                if Instant::now() > deadline {
                    abort_connection(conn);
                    return true;
                }
                std::thread::sleep(Duration::from_millis(10));
            }
            false
        });
        struct Done<'a>(&'a AtomicBool);
        impl Drop for Done<'_> {
            fn drop(&mut self) {
                self.0.store(true, Ordering::Release);
            }
        }
        let r = {
            let _done = Done(&done);
            f()
        };
        assert!(!dog.join().unwrap(), "{what} took more than {secs} s (the FUSE connection was aborted to end it)");
        r
    })
}

/// Waits up to `secs` for a child to exit; SIGKILL and None if it does not.
fn wait_bounded(child: &mut Child, secs: u64) -> Option<ExitStatus> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A `tiercache serve --fuse MNT --fuse-transport T` of a volume in `vol`, its log in
/// `vol/serve.log`; killed, its connection aborted and its mount lazily unmounted when dropped.
struct Served {
    child: Option<Child>,
    mnt: PathBuf,
    log: PathBuf,
    /// The FUSE connection's number (under /sys/fs/fuse/connections).
    conn: u64,
}

impl Served {
    fn command(vol: &TempVolume, transport: &str) -> Command {
        let mnt = vol.path("fuse");
        let _ = std::fs::create_dir(&mnt);
        let mut c = common::tiercache_cmd();
        c.args(["serve", "--cache", p(&vol.cache), "--backing", p(&vol.backing)])
            .args(["--fuse", p(&mnt), "--fuse-transport", transport])
            .stderr(File::create(vol.path("serve.log")).unwrap());
        c
    }

    fn start(vol: &TempVolume, transport: &str) -> Served {
        Served::spawn(Served::command(vol, transport), vol)
    }

    /// Spawns `cmd` and waits (20 s at most) until it says it serves, and (20 s more) until
    /// its file can be stat()ed. (The file is not touched before: a mount that nobody serves
    /// would hold the stat for good.)
    fn spawn(mut cmd: Command, vol: &TempVolume) -> Served {
        let child = cmd.spawn().unwrap();
        let mut s = Served { child: Some(child), mnt: vol.path("fuse"), log: vol.path("serve.log"), conn: 0 };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !s.log_text().contains("tiercache: serving") {
            if let Some(st) = s.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("serve ended ({st}) before serving: {}", s.log_text());
            }
            assert!(Instant::now() < deadline, "serve did not start serving: {}", s.log_text());
            std::thread::sleep(Duration::from_millis(10));
        }
        s.conn = connection_of(&s.mnt).unwrap_or_else(|| panic!("nothing mounted: {}", s.log_text()));
        let m = bounded(20, s.conn, "stat of the served file", || std::fs::metadata(s.file()));
        let m = m.unwrap_or_else(|e| panic!("the FUSE file: {e}: {}", s.log_text()));
        assert!(m.is_file(), "{}", s.log_text());
        s
    }

    fn file(&self) -> PathBuf {
        self.mnt.join("volume")
    }

    fn open(&self, flags: i32) -> File {
        OpenOptions::new().read(true).write(true).custom_flags(flags).open(self.file()).unwrap()
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGTERM; the exit status (within 30 s) and the log.
    fn stop(&mut self) -> (ExitStatus, String) {
        let mut c = self.child.take().unwrap();
        common::sigterm(&c);
        let st = wait_bounded(&mut c, 30);
        let log = self.log_text();
        (st.unwrap_or_else(|| panic!("serve did not stop within 30 s of SIGTERM: {log}")), log)
    }

    fn kill9(&mut self) {
        let mut c = self.child.take().unwrap();
        c.kill().unwrap();
        c.wait().unwrap();
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if self.conn != 0 && mounted_at(&self.mnt) {
            abort_connection(self.conn);
        }
        if mounted_at(&self.mnt) {
            let _ = Command::new("umount").args(["-l", p(&self.mnt)]).status();
        }
    }
}

/// A stop that must be clean: exit 0, the log saying so, naming `shown` as the transport,
/// no warning; the mount gone.
fn stop_cleanly(s: &mut Served, shown: &str) -> String {
    let (st, log) = s.stop();
    assert!(st.success(), "serve did not stop cleanly ({st}): {log}");
    assert!(log.contains("stopped cleanly"), "{log}");
    assert!(log.contains(&format!("/volume ({shown})")), "not served through {shown}: {log}");
    // (A server started after a SIGKILL says once that the last stop was not clean.)
    let warned = log
        .lines()
        .filter(|l| (l.contains(" WARN ") || l.contains(" ERROR ")) && !l.contains("the last stop was not clean"));
    assert_eq!(warned.count(), 0, "a warning: {log}");
    assert!(!mounted_at(&s.mnt), "FUSE still mounted after the stop");
    log
}

fn transports() -> [(&'static str, &'static str); 2] {
    [("io-uring", "io_uring"), ("dev", "/dev/fuse")]
}

/// Pins the calling thread to `cpu`; false where that CPU is not usable.
fn pin(cpu: usize) -> bool {
    // SAFETY: a zeroed cpu_set_t is empty; CPU_SET writes within it (cpu < CPU_SETSIZE);
    // sched_setaffinity(0) reads it for the calling thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set) == 0
    }
}

fn cpus() -> usize {
    std::thread::available_parallelism().map_or(1, usize::from)
}

/// A page-aligned buffer of `len` bytes (O_DIRECT).
struct Aligned {
    buf: Vec<u8>,
    at: usize,
    len: usize,
}

impl Aligned {
    fn new(len: usize) -> Aligned {
        let buf = vec![0u8; len + 4096];
        let at = buf.as_ptr().align_offset(4096);
        Aligned { buf, at, len }
    }
    fn get(&mut self) -> &mut [u8] {
        &mut self.buf[self.at..self.at + self.len]
    }
}

/// fallocate(2), retried on EINTR.
fn fallocate(f: &File, mode: i32, offset: u64, len: u64) -> std::io::Result<()> {
    loop {
        // SAFETY: fallocate on an open descriptor; no memory is passed.
        if unsafe { libc::fallocate(f.as_raw_fd(), mode, offset as i64, len as i64) } == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
}

fn retry<T>(mut f: impl FnMut() -> std::io::Result<T>) -> std::io::Result<T> {
    loop {
        match f() {
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            r => return r,
        }
    }
}

// ---------------------------------------------------------------------------------------
// 1. The answers.
// ---------------------------------------------------------------------------------------

/// What a syscall returned: "ok N" or "err ERRNO".
fn said(r: i64) -> String {
    if r < 0 {
        format!("err {}", std::io::Error::last_os_error())
    } else {
        format!("ok {r}")
    }
}

fn io_said<T: std::fmt::Debug>(r: std::io::Result<T>) -> String {
    match r {
        Ok(v) => format!("ok {v:?}"),
        Err(e) => format!("err {e}"),
    }
}

fn stat_said(path: &Path) -> String {
    io_said(
        std::fs::symlink_metadata(path)
            .map(|m| (m.mode(), m.nlink(), m.uid(), m.gid(), m.len(), m.blocks(), m.blksize(), m.ino(), m.mtime() > 0)),
    )
}

/// getdents64 on the mount's root with a buffer of `size` bytes, from `seek`: the entries
/// (name, inode, offset, type) or the error.
fn getdents(mnt: &Path, size: usize, seek: i64) -> String {
    let fd = File::open(mnt).unwrap();
    // SAFETY: lseek on an open descriptor.
    unsafe { libc::lseek(fd.as_raw_fd(), seek, libc::SEEK_SET) };
    let mut buf = vec![0u8; size];
    let mut out = Vec::new();
    loop {
        // SAFETY: getdents64 writes at most `size` bytes into buf.
        let n = unsafe { libc::syscall(libc::SYS_getdents64, fd.as_raw_fd(), buf.as_mut_ptr(), size) };
        if n < 0 {
            return format!("{out:?} then {}", said(-1));
        }
        if n == 0 {
            return format!("{out:?}");
        }
        let mut at = 0;
        while at < n as usize {
            let ino = u64::from_ne_bytes(buf[at..at + 8].try_into().unwrap());
            let off = i64::from_ne_bytes(buf[at + 8..at + 16].try_into().unwrap());
            let reclen = u16::from_ne_bytes(buf[at + 16..at + 18].try_into().unwrap()) as usize;
            let kind = buf[at + 18];
            let name = buf[at + 19..at + reclen].split(|&b| b == 0).next().unwrap().to_vec();
            out.push((String::from_utf8(name).unwrap(), ino, off, kind));
            at += reclen;
        }
        if out.len() > 10 {
            return format!("{out:?} and more");
        }
    }
}

/// Everything a program can ask of the mount, and what it was told, in order.
fn probe(mnt: &Path) -> Vec<(String, String)> {
    let f = mnt.join("volume");
    let (cf, cm) = (cstr(&f), cstr(mnt));
    let size = std::fs::metadata(&f).unwrap().len();
    let mut out: Vec<(String, String)> = Vec::new();
    let mut say = |what: &str, r: String| out.push((what.to_string(), r));
    let rw = || OpenOptions::new().read(true).write(true).open(&f).unwrap();
    // SAFETY: libc calls on NUL-terminated paths that live across each call, on descriptors
    // open across it, and on buffers of (at least) the sizes passed; mmap's mapping is read
    // within its 8192 bytes and unmapped.
    unsafe {
        say("stat file", stat_said(&f));
        say("stat root", stat_said(mnt));
        say("stat missing", stat_said(&mnt.join("missing")));
        let mut stx: libc::statx = std::mem::zeroed();
        let r = libc::statx(libc::AT_FDCWD, cf.as_ptr(), 0, libc::STATX_ALL | libc::STATX_BTIME, &mut stx);
        say("statx btime", format!("{} mask {:#x} size {}", said(r.into()), stx.stx_mask, stx.stx_size));
        let r = libc::statx(libc::AT_FDCWD, cf.as_ptr(), libc::AT_STATX_FORCE_SYNC, libc::STATX_BASIC_STATS, &mut stx);
        say("statx sync", format!("{} size {} mode {:o}", said(r.into()), stx.stx_size, stx.stx_mode));
        let mut names: Vec<String> =
            std::fs::read_dir(mnt).unwrap().map(|e| e.unwrap().file_name().into_string().unwrap()).collect();
        names.sort();
        say("readdir", format!("{names:?}"));
        for (size, seek) in [(24, 0), (32, 0), (48, 0), (4096, 0), (4096, 1), (4096, 2), (4096, 3), (4096, 9)] {
            say(&format!("getdents {size} from {seek}"), getdents(mnt, size, seek));
        }
        say("truncate to its size", said(libc::truncate(cf.as_ptr(), size as i64).into()));
        say("truncate smaller", said(libc::truncate(cf.as_ptr(), 4096).into()));
        say("truncate larger", said(libc::truncate(cf.as_ptr(), (size * 2) as i64).into()));
        say("open O_TRUNC", said(libc::open(cf.as_ptr(), libc::O_WRONLY | libc::O_TRUNC).into()));
        say("chmod", said(libc::chmod(cf.as_ptr(), 0o644).into()));
        say("chown", said(libc::chown(cf.as_ptr(), 1000, 1000).into()));
        let times = [libc::timespec { tv_sec: 1, tv_nsec: 2 }, libc::timespec { tv_sec: 3, tv_nsec: 4 }];
        say("utimensat", said(libc::utimensat(libc::AT_FDCWD, cf.as_ptr(), times.as_ptr(), 0).into()));
        say("stat after setattr", stat_said(&f));
        let mut xb = [0u8; 64];
        let user_x = c"user.x";
        say("getxattr", said(libc::getxattr(cf.as_ptr(), user_x.as_ptr(), xb.as_mut_ptr().cast(), 64) as i64));
        say("listxattr", said(libc::listxattr(cf.as_ptr(), xb.as_mut_ptr().cast(), 64) as i64));
        say("setxattr", said(libc::setxattr(cf.as_ptr(), user_x.as_ptr(), xb.as_ptr().cast(), 1, 0).into()));
        say("removexattr", said(libc::removexattr(cf.as_ptr(), user_x.as_ptr()).into()));
        say("getxattr root", said(libc::getxattr(cm.as_ptr(), user_x.as_ptr(), xb.as_mut_ptr().cast(), 64) as i64));
        say("access R", said(libc::access(cf.as_ptr(), libc::R_OK).into()));
        say("access X", said(libc::access(cf.as_ptr(), libc::X_OK).into()));
        let new = |n: &str| cstr(&mnt.join(n));
        say("mkdir", said(libc::mkdir(new("d").as_ptr(), 0o755).into()));
        say("create", said(libc::open(new("new").as_ptr(), libc::O_CREAT | libc::O_WRONLY, 0o600).into()));
        say("mknod", said(libc::mknod(new("node").as_ptr(), libc::S_IFREG | 0o600, 0).into()));
        say("mkfifo", said(libc::mkfifo(new("fifo").as_ptr(), 0o600).into()));
        say("unlink missing", said(libc::unlink(new("missing").as_ptr()).into()));
        say("unlink file", said(libc::unlink(cf.as_ptr()).into()));
        say("rmdir missing", said(libc::rmdir(new("d").as_ptr()).into()));
        say("rename", said(libc::rename(cf.as_ptr(), new("v2").as_ptr()).into()));
        say("rename onto itself", said(libc::rename(cf.as_ptr(), cf.as_ptr()).into()));
        say(
            "renameat2 exchange",
            said(libc::syscall(
                libc::SYS_renameat2,
                libc::AT_FDCWD,
                cf.as_ptr(),
                libc::AT_FDCWD,
                new("v2").as_ptr(),
                libc::RENAME_NOREPLACE,
            )),
        );
        say("link", said(libc::link(cf.as_ptr(), new("v3").as_ptr()).into()));
        say("symlink", said(libc::symlink(c"volume".as_ptr(), new("s").as_ptr()).into()));
        say("readlink", said(libc::readlink(cf.as_ptr(), xb.as_mut_ptr().cast(), 64) as i64));
        say("O_TMPFILE", said(libc::open(cm.as_ptr(), libc::O_TMPFILE | libc::O_WRONLY, 0o600).into()));
        let mut sv: libc::statvfs = std::mem::zeroed();
        let r = libc::statvfs(cm.as_ptr(), &mut sv);
        say(
            "statvfs",
            format!(
                "{} bsize {} frsize {} blocks {} bfree {} bavail {} files {} ffree {} namemax {}",
                said(r.into()),
                sv.f_bsize,
                sv.f_frsize,
                sv.f_blocks,
                sv.f_bfree,
                sv.f_bavail,
                sv.f_files,
                sv.f_ffree,
                sv.f_namemax
            ),
        );
        let file = rw();
        let fd = file.as_raw_fd();
        say("fsync", said(libc::fsync(fd).into()));
        say("fdatasync", said(libc::fdatasync(fd).into()));
        say("syncfs", said(libc::syncfs(fd).into()));
        let dir = File::open(mnt).unwrap();
        say("fsync root", said(libc::fsync(dir.as_raw_fd()).into()));
        say("fsync root again", said(libc::fsync(dir.as_raw_fd()).into()));
        say("SEEK_DATA", said(libc::lseek(fd, 4096, libc::SEEK_DATA)));
        say("SEEK_HOLE", said(libc::lseek(fd, 4096, libc::SEEK_HOLE)));
        say("SEEK_END", said(libc::lseek(fd, 0, libc::SEEK_END)));
        say("pwrite", said(libc::pwrite(fd, c"hello".as_ptr().cast(), 5, 100) as i64));
        let mut rb = [0u8; 16];
        let r = libc::pread(fd, rb.as_mut_ptr().cast(), 7, 99);
        say("pread", format!("{} {:?}", said(r as i64), &rb[..7]));
        let r = libc::pread(fd, rb.as_mut_ptr().cast(), 10, (size - 3) as i64);
        say("pread across the end", format!("{} {:?}", said(r as i64), &rb[..3]));
        say("pread past the end", said(libc::pread(fd, rb.as_mut_ptr().cast(), 10, (size + 3) as i64) as i64));
        say("pwrite across the end", said(libc::pwrite(fd, rb.as_ptr().cast(), 4, (size - 2) as i64) as i64));
        say("pwrite past the end", said(libc::pwrite(fd, rb.as_ptr().cast(), 4, (size + 2) as i64) as i64));
        say("pwrite of nothing", said(libc::pwrite(fd, rb.as_ptr().cast(), 0, 7) as i64));
        let (mut from, mut to) = (100i64, 8192i64);
        say(
            "copy_file_range",
            said(libc::syscall(libc::SYS_copy_file_range, fd, &mut from, fd, &mut to, 5usize, 0u32)),
        );
        let r = libc::pread(fd, rb.as_mut_ptr().cast(), 5, 8192);
        say("pread copied", format!("{} {:?}", said(r as i64), &rb[..5]));
        let mut off = 100i64;
        say("sendfile", said(libc::sendfile(fd, fd, &mut off, 5) as i64));
        for (name, mode, o, l) in [
            ("fallocate", 0, 0, 4096),
            ("fallocate punch", libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, 99, 3),
            ("fallocate zero", libc::FALLOC_FL_ZERO_RANGE, 8190, 4),
            ("fallocate collapse", libc::FALLOC_FL_COLLAPSE_RANGE, 0, 4096),
            ("fallocate insert", libc::FALLOC_FL_INSERT_RANGE, 0, 4096),
            ("fallocate unshare", libc::FALLOC_FL_UNSHARE_RANGE, 0, 4096),
            ("fallocate punch across the end", libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, size - 10, 100),
            ("fallocate across the end", 0, size - 10, 100),
            ("fallocate keep size across the end", libc::FALLOC_FL_KEEP_SIZE, size - 10, 100),
            ("fallocate zero across the end", libc::FALLOC_FL_ZERO_RANGE, size - 10, 100),
        ] {
            say(name, said(libc::fallocate(fd, mode, o as i64, l as i64).into()));
        }
        let r = libc::pread(fd, rb.as_mut_ptr().cast(), 16, 96);
        say("pread punched", format!("{} {:?}", said(r as i64), &rb[..16]));
        let r = libc::pread(fd, rb.as_mut_ptr().cast(), 8, 8188);
        say("pread zeroed", format!("{} {:?}", said(r as i64), &rb[..8]));
        say("flock", said(libc::flock(fd, libc::LOCK_EX).into()));
        let lock = libc::flock { l_type: libc::F_WRLCK as i16, l_whence: 0, l_start: 0, l_len: 10, l_pid: 0 };
        say("fcntl F_SETLK", said(libc::fcntl(fd, libc::F_SETLK, &lock).into()));
        let mut n = 0i32;
        say("ioctl FIONREAD", format!("{} {n}", said(libc::ioctl(fd, libc::FIONREAD, &mut n).into())));
        let mut fiemap = [0u8; 64];
        say("ioctl FIEMAP", said(libc::ioctl(fd, 0xC020_660B, fiemap.as_mut_ptr()).into()));
        let mut flags = 0i64;
        say("ioctl GETFLAGS", said(libc::ioctl(fd, 0x8008_6601, &mut flags).into()));
        let mut pfd = libc::pollfd { fd, events: libc::POLLIN | libc::POLLOUT, revents: 0 };
        say("poll", format!("{} {:#x}", said(libc::poll(&mut pfd, 1, 0).into()), pfd.revents));
        let m = libc::mmap(std::ptr::null_mut(), 8192, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, fd, 0);
        say("mmap shared", if m == libc::MAP_FAILED { said(-1) } else { "ok".into() });
        let m = libc::mmap(std::ptr::null_mut(), 8192, libc::PROT_READ, libc::MAP_PRIVATE, fd, 0);
        if m == libc::MAP_FAILED {
            say("mmap private", said(-1));
        } else {
            let s = std::slice::from_raw_parts(m.cast::<u8>().add(96), 16).to_vec();
            libc::munmap(m, 8192);
            say("mmap private", format!("ok {s:?}"));
        }
        drop(file);
        let direct = OpenOptions::new().read(true).custom_flags(libc::O_DIRECT).open(&f).unwrap();
        let mut a = Aligned::new(8192);
        say(
            "O_DIRECT pread aligned",
            said(libc::pread(direct.as_raw_fd(), a.get().as_mut_ptr().cast(), 8192, 0) as i64),
        );
        let r = libc::pread(direct.as_raw_fd(), rb.as_mut_ptr().add(1).cast(), 5, 101);
        say("O_DIRECT pread unaligned", format!("{} {:?}", said(r as i64), &rb[1..6]));
        say("open root O_RDWR", said(libc::open(cm.as_ptr(), libc::O_RDWR).into()));
        say("open file O_DIRECTORY", said(libc::open(cf.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY).into()));
        let app = libc::open(cf.as_ptr(), libc::O_WRONLY | libc::O_APPEND);
        say("O_APPEND write", said(libc::write(app, c"x".as_ptr().cast(), 1) as i64));
        libc::close(app);
        say(
            "open O_CREAT|O_EXCL",
            said(libc::open(cf.as_ptr(), libc::O_CREAT | libc::O_EXCL | libc::O_RDWR, 0o600).into()),
        );
        let c = libc::open(cf.as_ptr(), libc::O_CREAT | libc::O_RDWR, 0o600);
        say("open O_CREAT existing", said(c.into()));
        libc::close(c);
        say("stat file at the end", stat_said(&f));
        say("stat root at the end", stat_said(mnt));
    }
    // (Descriptors of the opens that succeed are left open: a few, until the test ends.)
    out
}

/// Every answer through io_uring equals the one through /dev/fuse (fuser's), on fresh volumes.
#[test]
fn every_answer_through_io_uring_is_the_one_through_dev_fuse() {
    let _s = serial();
    if !uring_or_skip() {
        return;
    }
    let mut answers = Vec::new();
    for (transport, shown) in transports() {
        let vol = TempVolume::created(32 << 20, "16M");
        let mut s = Served::start(&vol, transport);
        let got = bounded(60, s.conn, "the probe", || probe(&s.mnt));
        // (fuser warns of each request it has no answer for: not checked here.)
        let (st, log) = s.stop();
        assert!(st.success() && log.contains(&format!("/volume ({shown})")), "{st}: {log}");
        answers.push(got);
    }
    let (uring, dev) = (&answers[0], &answers[1]);
    assert_eq!(uring.len(), dev.len());
    let differ: Vec<String> = uring
        .iter()
        .zip(dev)
        .filter(|(u, d)| u != d)
        .map(|(u, d)| format!("{}: io_uring {:?}, /dev/fuse {:?}", u.0, u.1, d.1))
        .collect();
    assert!(differ.is_empty(), "the transports answer differently:\n{}", differ.join("\n"));
    // And a few answers on their own merits.
    let get = |what: &str| dev.iter().find(|(w, _)| w == what).unwrap().1.clone();
    assert!(get("truncate to its size").starts_with("ok"), "{}", get("truncate to its size"));
    assert!(get("truncate smaller").contains("os error 1)"), "{}", get("truncate smaller"));
    assert!(get("pread across the end").starts_with("ok 3"), "{}", get("pread across the end"));
    assert!(get("pread past the end").starts_with("ok 0"), "{}", get("pread past the end"));
    assert!(get("pwrite across the end").contains("os error 28)"), "{}", get("pwrite across the end"));
    assert!(get("symlink").contains("os error 1)"), "{}", get("symlink"));
}

// ---------------------------------------------------------------------------------------
// 2. Data under concurrency.
// ---------------------------------------------------------------------------------------

const MODEL_BYTES: u64 = 32 << 20;
const WORKERS: usize = 8;
const STRIPES: usize = 16;

/// One worker's day on its own stripes (`stripes`: offset and the model's bytes): random
/// unaligned writes of 1 byte to 1.5 MiB through plain, O_DIRECT and O_DSYNC descriptors,
/// ZERO_RANGE, PUNCH_HOLE, batches of writes in flight together through io_uring into
/// neighbouring bytes, reads checked against the model, fsyncs; and, for the worker with
/// the last stripe, reads across the end of the file.
fn worker(file: &Path, id: usize, stripes: &mut [(u64, &mut [u8])], ops: usize) {
    pin(id % cpus());
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0x5eed + id as u64);
    let open = |flags| OpenOptions::new().read(true).write(true).custom_flags(flags).open(file).unwrap();
    let (plain, direct, dsync) = (open(0), open(libc::O_DIRECT), open(libc::O_DSYNC));
    let mut ring = io_uring::IoUring::new(32).unwrap();
    let mut big = Aligned::new(3 << 19);
    for op in 0..ops {
        let s = rng.gen_range(0..stripes.len());
        let (base, model) = (stripes[s].0, &mut *stripes[s].1);
        let cap = model.len();
        let len = match rng.gen_range(0..10) {
            0..=6 => rng.gen_range(1..=8192),
            7..=8 => rng.gen_range(1..=256 << 10),
            _ => rng.gen_range(1 << 20..=3 << 19),
        }
        .min(cap);
        let at = rng.gen_range(0..=cap - len);
        let what = format!("worker {id} op {op} at {} len {len}", base + at as u64);
        match rng.gen_range(0..10) {
            kind @ 0..=2 => {
                let data = &mut big.get()[..len];
                rng.fill(data);
                let f = [&plain, &direct, &dsync][kind];
                retry(|| f.write_at(data, base + at as u64)).map(|n| assert_eq!(n, len, "{what}")).unwrap();
                model[at..at + len].copy_from_slice(data);
            }
            3 => {
                fallocate(&plain, libc::FALLOC_FL_ZERO_RANGE, base + at as u64, len as u64).expect(&what);
                model[at..at + len].fill(0);
            }
            4 => {
                let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
                fallocate(&plain, mode, base + at as u64, len as u64).expect(&what);
                model[at..at + len].fill(0);
            }
            5 => {
                // 16 writes in flight at once, back to back from `at`: neighbours share blocks.
                let mut pieces = Vec::new();
                let mut o = at;
                while pieces.len() < 16 && o < cap {
                    let l = rng.gen_range(1..=3000).min(cap - o);
                    let data: Vec<u8> = (0..l).map(|_| rng.gen()).collect();
                    pieces.push((o, data));
                    o += l;
                }
                for (i, (o, data)) in pieces.iter().enumerate() {
                    let e = io_uring::opcode::Write::new(
                        io_uring::types::Fd(direct.as_raw_fd()),
                        data.as_ptr(),
                        data.len() as u32,
                    )
                    .offset(base + *o as u64)
                    .build()
                    .user_data(i as u64);
                    // SAFETY: the buffers live in `pieces` until every completion is reaped.
                    unsafe { ring.submission().push(&e).unwrap() };
                }
                let mut left = pieces.len();
                while left > 0 {
                    retry(|| ring.submit_and_wait(1)).unwrap();
                    for c in ring.completion() {
                        let (o, data) = &pieces[c.user_data() as usize];
                        assert_eq!(c.result(), data.len() as i32, "{what}: in-flight write at {}", base + *o as u64);
                        left -= 1;
                    }
                }
                for (o, data) in &pieces {
                    model[*o..*o + data.len()].copy_from_slice(data);
                }
            }
            kind @ 6..=7 => {
                let buf = &mut big.get()[..len];
                let f = if kind == 6 { &plain } else { &direct };
                retry(|| f.read_exact_at(buf, base + at as u64)).expect(&what);
                if buf[..] != model[at..at + len] {
                    let i = buf.iter().zip(&model[at..at + len]).position(|(a, b)| a != b).unwrap();
                    panic!("{what}: differs from the model at byte {}", base + (at + i) as u64);
                }
            }
            8 => retry(|| plain.sync_all()).expect(&what),
            _ => {
                // Across the end of the file: short, then nothing.
                if base + cap as u64 == MODEL_BYTES {
                    let tail = rng.gen_range(1..=cap.min(5000));
                    let buf = &mut big.get()[..tail + 777];
                    let n = retry(|| plain.read_at(buf, MODEL_BYTES - tail as u64)).expect(&what);
                    assert_eq!(n, tail, "{what}: a read across the end");
                    assert!(buf[..tail] == model[cap - tail..], "{what}: the last bytes");
                    assert_eq!(retry(|| plain.read_at(buf, MODEL_BYTES)).unwrap(), 0, "{what}: past the end");
                }
            }
        }
    }
}

/// The workers on their stripes together, a thread sending them signals meanwhile; then
/// the whole file against the model.
fn concurrent_io_matches_a_byte_model(transport: &str, shown: &str) {
    let vol = TempVolume::created(MODEL_BYTES, "16M");
    let mut s = Served::start(&vol, transport);
    // Stripe edges off any block boundary, so neighbouring workers share blocks.
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(7);
    let stripe = MODEL_BYTES / STRIPES as u64;
    let mut edges: Vec<u64> = (1..STRIPES as u64).map(|k| (k * stripe + rng.gen_range(1..4096u64)) | 1).collect();
    edges.insert(0, 0);
    edges.push(MODEL_BYTES);
    let mut model = vec![0u8; MODEL_BYTES as usize];
    let mut rest: &mut [u8] = &mut model;
    let mut pieces = Vec::new();
    for w in edges.windows(2) {
        let (piece, tail) = rest.split_at_mut((w[1] - w[0]) as usize);
        pieces.push(Some((w[0], piece)));
        rest = tail;
    }
    // SIGUSR1 interrupts the workers' requests (the kernel then sends FUSE_INTERRUPT).
    // SAFETY: a handler that does nothing, installed without SA_RESTART.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = nothing as *const () as usize;
        libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut());
    }
    extern "C" fn nothing(_: i32) {}
    let file = s.file();
    bounded(120, s.conn, "the workers", || {
        std::thread::scope(|sc| {
            let tids = Arc::new(Mutex::new(Vec::new()));
            let running = Arc::new(AtomicU64::new(WORKERS as u64));
            let mut handles = Vec::new();
            for id in 0..WORKERS {
                let mut mine: Vec<(u64, &mut [u8])> =
                    (0..STRIPES).filter(|k| k % WORKERS == id).map(|k| pieces[k].take().unwrap()).collect();
                let (file, tids, running) = (&file, Arc::clone(&tids), Arc::clone(&running));
                handles.push(sc.spawn(move || {
                    // SAFETY: gettid has no preconditions.
                    tids.lock().unwrap().push(unsafe { libc::gettid() });
                    let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| worker(file, id, &mut mine, 150)));
                    running.fetch_sub(1, Ordering::Release);
                    if let Err(e) = r {
                        std::panic::resume_unwind(e);
                    }
                }));
            }
            sc.spawn(move || {
                while running.load(Ordering::Acquire) > 0 {
                    for &t in tids.lock().unwrap().iter() {
                        // SAFETY: tgkill to a thread of this process; a stale tid of this
                        // process's exited thread only fails (ESRCH).
                        unsafe { libc::syscall(libc::SYS_tgkill, libc::getpid(), t, libc::SIGUSR1) };
                    }
                    std::thread::sleep(Duration::from_millis(3));
                }
            });
            for h in handles {
                h.join().unwrap();
            }
        })
    });
    let f = s.open(0);
    let mut all = vec![0u8; MODEL_BYTES as usize];
    retry(|| f.read_exact_at(&mut all, 0)).unwrap();
    drop(f);
    if all != model {
        let i = all.iter().zip(&model).position(|(a, b)| a != b).unwrap();
        panic!("through {transport}: the file differs from the model at byte {i}");
    }
    let (st, log) = s.stop();
    assert!(st.success() && log.contains(&format!("/volume ({shown})")), "{st}: {log}");
}

#[test]
fn concurrent_unaligned_io_through_io_uring_matches_a_byte_model() {
    let _s = serial();
    if uring_or_skip() {
        concurrent_io_matches_a_byte_model("io-uring", "io_uring");
    }
}

#[test]
fn concurrent_unaligned_io_through_dev_fuse_matches_a_byte_model() {
    let _s = serial();
    if uring_or_skip() {
        concurrent_io_matches_a_byte_model("dev", "/dev/fuse");
    }
}

// ---------------------------------------------------------------------------------------
// 3. Queues: one CPU's requests beyond its ring entries.
// ---------------------------------------------------------------------------------------

/// 24 threads pinned to one CPU (its queue has 8 ring entries) at once, each writing its
/// block, fsyncing, and reading 1 MiB; then the same on the other CPU while a lone thread
/// works on the first. Everything completes (bounded), every block reads back.
#[test]
fn requests_from_one_cpu_beyond_its_ring_entries_all_complete() {
    let _s = serial();
    if !uring_or_skip() {
        return;
    }
    let vol = TempVolume::created(64 << 20, "16M");
    let mut s = Served::start(&vol, "io-uring");
    let file = s.file();
    let last_cpu = cpus() - 1;
    for (crowd, lone) in [(last_cpu, 0), (0, last_cpu)] {
        bounded(60, s.conn, "24 threads on one CPU", || {
            std::thread::scope(|sc| {
                for t in 0..25u64 {
                    let file = &file;
                    sc.spawn(move || {
                        assert!(pin(if t == 24 { lone } else { crowd }));
                        let f = OpenOptions::new().read(true).write(true).open(file).unwrap();
                        let mut buf = vec![0u8; 1 << 20];
                        for round in 1..=10u64 {
                            let block = t * 64 + round;
                            f.write_all_at(&tiercache_sim::stamp::stamped(block, round), block * 4096).unwrap();
                            f.sync_data().unwrap();
                            f.read_exact_at(&mut buf, (round % 60) << 20).unwrap();
                        }
                    });
                }
            })
        });
    }
    let f = s.open(0);
    let mut b = vec![0u8; 4096];
    for t in 0..25u64 {
        for round in 1..=10u64 {
            let block = t * 64 + round;
            f.read_exact_at(&mut b, block * 4096).unwrap();
            assert_eq!(tiercache_sim::stamp::version_of(block, &b), Some(round), "block {block}");
        }
    }
    drop(f);
    stop_cleanly(&mut s, "io_uring");
}

// ---------------------------------------------------------------------------------------
// 4. Teardown.
// ---------------------------------------------------------------------------------------

/// Writers on both CPUs, each writing versions of its own blocks with O_DSYNC (acknowledged =
/// the write returned); `acked[w]` is writer w's last acknowledged version.
struct Writers {
    stop: Arc<AtomicBool>,
    acked: Arc<Vec<AtomicU64>>,
    handles: Vec<std::thread::JoinHandle<Option<std::io::Error>>>,
}

const WRITER_BLOCKS: u64 = 8;

impl Writers {
    fn start(file: &Path, n: usize) -> Writers {
        let stop = Arc::new(AtomicBool::new(false));
        let acked: Arc<Vec<AtomicU64>> = Arc::new((0..n).map(|_| AtomicU64::new(0)).collect());
        let handles = (0..n)
            .map(|w| {
                let (stop, acked, file) = (Arc::clone(&stop), Arc::clone(&acked), file.to_path_buf());
                std::thread::spawn(move || {
                    pin(w % cpus());
                    let f = OpenOptions::new().write(true).custom_flags(libc::O_DSYNC).open(&file).ok()?;
                    let mut v = 0;
                    while !stop.load(Ordering::Relaxed) {
                        v += 1;
                        let block = w as u64 * WRITER_BLOCKS + v % WRITER_BLOCKS;
                        let data = tiercache_sim::stamp::stamped(block, v);
                        if let Err(e) = retry(|| f.write_all_at(&data, block * 4096)) {
                            return Some(e);
                        }
                        acked[w].store(v, Ordering::Release);
                    }
                    None
                })
            })
            .collect();
        Writers { stop, acked, handles }
    }

    fn total(&self) -> u64 {
        self.acked.iter().map(|a| a.load(Ordering::Acquire)).sum()
    }

    /// Stops them; each one's error, if it ended with one.
    fn join(self) -> Vec<Option<std::io::Error>> {
        self.stop.store(true, Ordering::Relaxed);
        self.ended()
    }

    /// Waits for them to end on their own (each with its error, if any).
    fn ended(self) -> Vec<Option<std::io::Error>> {
        self.handles.into_iter().map(|h| h.join().unwrap()).collect()
    }
}

/// Every writer's blocks hold at least the versions acknowledged (the last
/// `WRITER_BLOCKS` versions of writer w, each in its block, or later ones).
fn check_acknowledged(file: &Path, acked: &[u64]) {
    let f = File::open(file).unwrap();
    let mut b = vec![0u8; 4096];
    for (w, &last) in acked.iter().enumerate() {
        for v in last.saturating_sub(WRITER_BLOCKS - 1).max(1)..=last {
            let block = w as u64 * WRITER_BLOCKS + v % WRITER_BLOCKS;
            f.read_exact_at(&mut b, block * 4096).unwrap();
            let got = tiercache_sim::stamp::version_of(block, &b);
            assert!(got.is_some_and(|g| g >= v), "writer {w} block {block}: version {v} acknowledged, read {got:?}");
        }
    }
}

fn wait_for(what: &str, secs: u64, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(secs);
    while !cond() {
        assert!(Instant::now() < deadline, "{what}: not within {secs} s");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// SIGTERM while writers hold the file open: refused (the file is in use), and the ring keeps
/// serving: the writers go on, a new reader is served; once they are done, SIGTERM stops it.
#[test]
fn a_refused_sigterm_leaves_the_ring_serving_and_a_second_one_stops_cleanly() {
    let _s = serial();
    if !uring_or_skip() {
        return;
    }
    let vol = TempVolume::created(32 << 20, "16M");
    let mut s = Served::start(&vol, "io-uring");
    let writers = Writers::start(&s.file(), 4);
    wait_for("the writers' first writes", 20, || writers.total() >= 8);
    common::sigterm(s.child.as_ref().unwrap());
    wait_for("the refusal in the log", 20, || s.log_text().contains("not stopping"));
    let after = writers.total();
    wait_for("writes after the refusal", 20, || writers.total() >= after + 40);
    bounded(20, s.conn, "a new reader after the refusal", || {
        let f = File::open(s.file()).unwrap();
        let mut b = vec![0u8; 1 << 20];
        f.read_exact_at(&mut b, 0).unwrap();
    });
    let acked_handle = Arc::clone(&writers.acked);
    let errors = bounded(30, s.conn, "stopping the writers", || writers.join());
    assert!(errors.iter().all(Option::is_none), "{errors:?}");
    let acked: Vec<u64> = acked_handle.iter().map(|a| a.load(Ordering::Acquire)).collect();
    bounded(30, s.conn, "checking the acknowledged writes", || check_acknowledged(&s.file(), &acked));
    let (st, log) = s.stop();
    assert!(st.success(), "{st}: {log}");
    assert!(log.contains("stopped cleanly") && log.contains("/volume (io_uring)"), "{log}");
    assert!(!mounted_at(&s.mnt));
    let warnings: Vec<&str> = log.lines().filter(|l| l.contains(" WARN ") || l.contains(" ERROR ")).collect();
    assert!(warnings.len() == 1 && warnings[0].contains("not stopping"), "{warnings:?}");
}

/// SIGKILL while writers on both CPUs write with O_DSYNC: the writers end (with an error, in
/// bounded time), and a server started again on the same directory (through either
/// transport) has every acknowledged version.
#[test]
fn sigkill_mid_write_loses_no_acknowledged_write_and_the_server_comes_back_on_the_same_dir() {
    let _s = serial();
    if !uring_or_skip() {
        return;
    }
    let vol = TempVolume::created(32 << 20, "16M");
    for (round, again) in ["io-uring", "dev"].into_iter().enumerate() {
        let mut s = Served::start(&vol, "io-uring");
        let writers = Writers::start(&s.file(), 6);
        wait_for("the writers' first writes", 20, || writers.total() >= 60 * (round as u64 + 1));
        let acked_handle = Arc::clone(&writers.acked);
        s.kill9();
        let errors = bounded(30, s.conn, "the writers after SIGKILL", || writers.ended());
        assert!(errors.iter().all(Option::is_some), "a writer ended without an error after SIGKILL: {errors:?}");
        let acked: Vec<u64> = acked_handle.iter().map(|a| a.load(Ordering::Acquire)).collect();
        // The dead mount stays until unmounted (as after any SIGKILL of a FUSE server).
        let conn = s.conn;
        drop(s);
        assert!(!mounted_at(&vol.path("fuse")), "connection {conn} still mounted");
        let mut s = Served::start(&vol, again);
        bounded(30, s.conn, "checking the acknowledged writes", || check_acknowledged(&s.file(), &acked));
        stop_cleanly(&mut s, if again == "dev" { "/dev/fuse" } else { "io_uring" });
    }
}

/// The connection aborted (/sys/fs/fuse/connections/N/abort) under writers on both CPUs: the
/// writers end with errors in bounded time; SIGTERM then stops the server, which warns of
/// nothing but the ring ending, and a new server has every acknowledged write.
#[test]
fn an_aborted_connection_ends_the_writers_and_the_server_still_stops() {
    let _s = serial();
    if !uring_or_skip() {
        return;
    }
    let vol = TempVolume::created(32 << 20, "16M");
    let mut s = Served::start(&vol, "io-uring");
    let writers = Writers::start(&s.file(), 6);
    wait_for("the writers' first writes", 20, || writers.total() >= 60);
    let acked_handle = Arc::clone(&writers.acked);
    abort_connection(s.conn);
    let errors = bounded(30, s.conn, "the writers after the abort", || writers.ended());
    assert!(errors.iter().all(Option::is_some), "{errors:?}");
    let acked: Vec<u64> = acked_handle.iter().map(|a| a.load(Ordering::Acquire)).collect();
    let (st, log) = s.stop();
    assert!(st.success(), "{st}: {log}");
    assert!(!mounted_at(&s.mnt), "still mounted: {log}");
    let mut s = Served::start(&vol, "io-uring");
    bounded(30, s.conn, "checking the acknowledged writes", || check_acknowledged(&s.file(), &acked));
    stop_cleanly(&mut s, "io_uring");
}

// ---------------------------------------------------------------------------------------
// 5. Falling back when io_uring is forbidden.
// ---------------------------------------------------------------------------------------

/// Makes the command's process unable to set up an io_uring: io_uring_setup(2) fails with
/// EPERM (a seccomp filter, as Docker's default profile has had since 25.0).
fn forbid_io_uring(cmd: &mut Command) {
    let stmt = |code: u32, k: u32| libc::sock_filter { code: code as u16, jt: 0, jf: 0, k };
    let jeq =
        |k: u32, jf: u8| libc::sock_filter { code: (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16, jt: 0, jf, k };
    let filter = [
        // The syscall number (seccomp_data.nr, at offset 0).
        stmt(libc::BPF_LD | libc::BPF_W | libc::BPF_ABS, 0),
        jeq(libc::SYS_io_uring_setup as u32, 1),
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ERRNO | libc::EPERM as u32),
        stmt(libc::BPF_RET | libc::BPF_K, libc::SECCOMP_RET_ALLOW),
    ];
    // SAFETY: between fork and exec only prctl runs, on a filter copied into the closure.
    unsafe {
        cmd.pre_exec(move || {
            let prog = libc::sock_fprog { len: filter.len() as u16, filter: filter.as_ptr() as *mut _ };
            if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                || libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &prog as *const libc::sock_fprog) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Threads stat()ing the mount's file over and over, as a supervisor waiting for it does.
struct Pollers {
    stop: Arc<AtomicBool>,
    handles: Vec<std::thread::JoinHandle<()>>,
}

impl Pollers {
    fn start(file: PathBuf) -> Pollers {
        let stop = Arc::new(AtomicBool::new(false));
        let handles = (0..2)
            .map(|i| {
                let (stop, file) = (Arc::clone(&stop), file.clone());
                std::thread::spawn(move || {
                    pin(i % cpus());
                    while !stop.load(Ordering::Relaxed) {
                        let _ = std::fs::metadata(&file);
                    }
                })
            })
            .collect();
        Pollers { stop, handles }
    }

    /// Stops them: every stat returns within `secs` (else the test fails; a stat stuck in a
    /// FUSE connection that nobody serves is stuck for good, so they are left behind).
    fn stop(mut self, secs: u64) {
        self.stop.store(true, Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(secs);
        for h in std::mem::take(&mut self.handles) {
            while !h.is_finished() {
                assert!(Instant::now() < deadline, "a stat of the mount hung");
                std::thread::sleep(Duration::from_millis(10));
            }
            h.join().unwrap();
        }
    }
}

impl Drop for Pollers {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// `auto` where io_uring is forbidden: it serves through /dev/fuse, even while the mount is
/// polled as it comes up, and stops cleanly leaving nothing mounted.
#[test]
fn auto_serves_through_dev_fuse_where_io_uring_is_forbidden_even_while_polled() {
    let _s = serial();
    if !uring_or_skip() {
        return;
    }
    let vol = TempVolume::created(32 << 20, "16M");
    let pollers = Pollers::start(vol.path("fuse/volume"));
    let mut cmd = Served::command(&vol, "auto");
    forbid_io_uring(&mut cmd);
    let mut s = Served::spawn(cmd, &vol);
    bounded(20, s.conn, "writing and reading back", || {
        let f = s.open(0);
        f.write_all_at(b"through /dev/fuse", 12345).unwrap();
        f.sync_all().unwrap();
        let mut b = [0u8; 17];
        f.read_exact_at(&mut b, 12345).unwrap();
        assert_eq!(&b, b"through /dev/fuse");
    });
    pollers.stop(20);
    let (st, log) = s.stop();
    assert!(st.success(), "{st}: {log}");
    assert!(log.contains("/volume (/dev/fuse)"), "{log}");
    assert!(!mounted_at(&s.mnt), "still mounted: {log}");
}

/// `io-uring` where io_uring is forbidden: it fails, saying why, leaving nothing mounted and
/// nobody stuck, even while the mount is polled.
#[test]
fn io_uring_transport_fails_cleanly_where_io_uring_is_forbidden_even_while_polled() {
    let _s = serial();
    if !uring_or_skip() {
        return;
    }
    let vol = TempVolume::created(32 << 20, "16M");
    let pollers = Pollers::start(vol.path("fuse/volume"));
    let mut cmd = Served::command(&vol, "io-uring");
    forbid_io_uring(&mut cmd);
    let mut child = cmd.spawn().unwrap();
    let st = wait_bounded(&mut child, 30).expect("serve --fuse-transport io-uring did not end");
    let log = std::fs::read_to_string(vol.path("serve.log")).unwrap();
    let mnt = vol.path("fuse");
    let left = mounted_at(&mnt);
    if left {
        let _ = Command::new("umount").args(["-l", p(&mnt)]).status();
    }
    pollers.stop(20);
    assert!(!st.success(), "{log}");
    assert!(log.contains("io_uring"), "the error does not say what failed: {log}");
    assert!(!left, "a mount was left behind: {log}");
}

/// `auto` with only as many descriptors as /dev/fuse needs (RLIMIT_NOFILE): some ring
/// entries cannot get an io_uring. It must still serve (through either transport), and stop
/// cleanly. (Entries that did register hold a descriptor each until the mount they served is
/// gone: mounting again through /dev/fuse before they let go ran out of descriptors, and the
/// mount was left with nobody serving it.)
#[test]
fn auto_with_only_the_descriptors_dev_fuse_needs_still_serves() {
    let _s = serial();
    if !uring_or_skip() {
        return;
    }
    let vol = TempVolume::created(32 << 20, "16M");
    let mut s = Served::start(&vol, "dev");
    let pid = s.child.as_ref().unwrap().id();
    // Its highest descriptor of /dev/fuse (the 16 threads' cloned ones are its last; the
    // test harness may hand higher ones down, which a limit does not take away).
    let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap().map(|e| e.unwrap().path());
    let fuse = fds.filter(|fd| std::fs::read_link(fd).is_ok_and(|t| t == Path::new("/dev/fuse")));
    let highest = fuse.filter_map(|fd| fd.file_name()?.to_str()?.parse::<u64>().ok()).max().unwrap();
    stop_cleanly(&mut s, "/dev/fuse");
    for _ in 0..3 {
        let mut cmd = Served::command(&vol, "auto");
        let limit = libc::rlimit { rlim_cur: highest + 1, rlim_max: highest + 1 };
        // SAFETY: setrlimit between fork and exec, on a value copied into the closure.
        unsafe {
            cmd.pre_exec(move || match libc::setrlimit(libc::RLIMIT_NOFILE, &limit) {
                0 => Ok(()),
                _ => Err(std::io::Error::last_os_error()),
            });
        }
        let mut s = Served::spawn(cmd, &vol);
        bounded(20, s.conn, "writing and reading back", || {
            let f = s.open(libc::O_DSYNC);
            f.write_all_at(b"few descriptors", 4096).unwrap();
            let mut b = [0u8; 15];
            f.read_exact_at(&mut b, 4096).unwrap();
            assert_eq!(&b, b"few descriptors");
        });
        let (st, log) = s.stop();
        assert!(st.success() && log.contains("stopped cleanly"), "{st}: {log}");
        assert!(!mounted_at(&s.mnt), "still mounted: {log}");
    }
}
