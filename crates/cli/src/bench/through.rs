//! `tiercache bench fsync --through fuse|nbd|ublk`: the fsync loop and 4 KiB random reads measured
//! the way a database sees them, inside ext4 on the served volume, against the same ext4 on the
//! raw fast file (issue 9's end-to-end benchmark).
//!
//! Two stacks, built and torn down by this command (root, `losetup`, `mkfs.ext4`):
//! - reference: a plain file (the "fast device") -> `losetup --direct-io=on` -> ext4;
//! - served: `tiercache serve` (a cache file beside the reference file, on the same disk, over
//!   an emulated slow backing device) -> the FUSE file (`--through fuse`) or NBD through
//!   libnbd's `nbdfuse` (`--through nbd`: this kernel may have no NBD client) -> loop -> ext4.
//!
//! Each round runs every loop on both stacks in turn (interleaved slices), and each row reports
//! the median slice: O_DIRECT write 4 KiB + fdatasync by 1 and by 16 committers (a file each),
//! and O_DIRECT 4 KiB random reads at queue depth 1 and 16. Device flushes per fsync come from
//! the loop device's counters (reference) and the engine's cache-device flushes (served): group
//! commit turns many committers' fsyncs into fewer device flushes.

use crate::report::{latency_histogram, round1, thousands, Table};
use crate::serve::FuseTransport;
use anyhow::{bail, Context, Result};
use hdrhistogram::Histogram;
use serde::Serialize;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiercache_device::AlignedBuf;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Through {
    /// The FUSE file of `serve --fuse`, on a loop device.
    Fuse,
    /// `serve --nbd unix:` through libnbd's nbdfuse (a file), on a loop device.
    Nbd,
    /// `serve --ublk`: the block device /dev/ublkbN itself (Linux 6.0+, ublk_drv loaded).
    Ublk,
}

/// Size of the reference file.
const FAST_BYTES: u64 = 512 << 20;
/// Size of the served volume's cache: the test files (400 MiB) stay below its high watermark,
/// so the loops measure the frontend and the log, not write-back to the emulated disk.
const CACHE_BYTES: u64 = 1 << 30;
/// Each committer's file, and the file the reads sample.
const COMMIT_FILE_BYTES: u64 = 16 << 20;
const READ_FILE_BYTES: u64 = 128 << 20;
const COMMITTERS: usize = 16;

pub struct Options {
    pub through: Through,
    pub fuse_transport: FuseTransport,
    pub seconds: f64,
    pub rounds: u32,
    pub dir: Option<PathBuf>,
    pub json: bool,
}

#[derive(Debug, Serialize)]
struct Row {
    test: &'static str,
    threads: usize,
    reference_per_second: f64,
    served_per_second: f64,
    ratio: f64,
    reference_p99_us: f64,
    served_p99_us: f64,
    /// Device flushes per fsync: the loop device's (reference), the cache device's (served).
    #[serde(skip_serializing_if = "Option::is_none")]
    reference_flushes_per_fsync: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    served_flushes_per_fsync: Option<f64>,
    reference_rounds: Vec<f64>,
    served_rounds: Vec<f64>,
}

#[derive(Debug, Serialize)]
struct Report {
    through: Through,
    reference: String,
    served: String,
    seconds_per_slice: f64,
    rounds: u32,
    rows: Vec<Row>,
}

/// Commands run for set-up and tear-down; a failure names the command.
fn run(cmd: &mut Command) -> Result<String> {
    let out = cmd.stderr(Stdio::piped()).stdout(Stdio::piped()).output().with_context(|| format!("running {cmd:?}"))?;
    if !out.status.success() {
        bail!("{cmd:?} failed: {}", String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

fn wait_for(path: &Path, what: &str, child: &mut Child) -> Result<()> {
    for _ in 0..200 {
        if path.exists() {
            return Ok(());
        }
        if let Some(status) = child.try_wait()? {
            bail!("{what} exited ({status}) before {} appeared", path.display());
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    bail!("{} did not appear within 10 s ({what})", path.display())
}

/// A file system mounted on a loop device over `file`, and the processes serving `file`;
/// everything is undone on drop (also after an error or Ctrl-C), in reverse order.
struct Stack {
    name: String,
    mount: PathBuf,
    loop_dev: Option<String>,
    mounted: bool,
    children: Vec<Child>,
    fuse_dirs: Vec<PathBuf>,
    /// The served volume's cache file and control socket.
    control: Option<(PathBuf, PathBuf)>,
}

impl Stack {
    fn new(name: &str, mount: PathBuf) -> Stack {
        Stack {
            name: name.into(),
            mount,
            loop_dev: None,
            mounted: false,
            children: Vec::new(),
            fuse_dirs: Vec::new(),
            control: None,
        }
    }

    /// Loop device (direct I/O) over `file` (or `file` itself if it is a block device), ext4
    /// on it, mounted, and the test files written.
    fn build_fs(&mut self, file: &Path) -> Result<()> {
        use std::os::unix::fs::FileTypeExt;
        let dev = if std::fs::metadata(file)?.file_type().is_block_device() {
            file.display().to_string()
        } else {
            let dev = run(Command::new("losetup").args(["--direct-io=on", "--show", "-f"]).arg(file))?;
            self.loop_dev = Some(dev.clone());
            dev
        };
        run(Command::new("mkfs.ext4").args([
            "-q",
            "-F",
            "-E",
            "nodiscard,lazy_itable_init=0,lazy_journal_init=0",
            &dev,
        ]))?;
        std::fs::create_dir_all(&self.mount)?;
        run(Command::new("mount").arg(&dev).arg(&self.mount))?;
        self.mounted = true;
        let chunk = vec![0x5au8; 1 << 20];
        let mut files: Vec<(PathBuf, u64)> =
            (0..COMMITTERS).map(|i| (self.mount.join(format!("commit{i}")), COMMIT_FILE_BYTES)).collect();
        files.push((self.mount.join("data"), READ_FILE_BYTES));
        for (path, len) in files {
            let f = std::fs::File::create(&path)?;
            for off in (0..len).step_by(chunk.len()) {
                f.write_all_at(&chunk, off)?;
            }
            f.sync_all()?;
        }
        Ok(())
    }

    /// Flush requests the loop device completed (its `stat`: the 16th field, kernel 5.5+).
    fn loop_flushes(&self) -> Option<u64> {
        let dev = self.loop_dev.as_ref()?;
        let name = Path::new(dev).file_name()?.to_str()?;
        let stat = std::fs::read_to_string(format!("/sys/block/{name}/stat")).ok()?;
        stat.split_whitespace().nth(15)?.parse().ok()
    }

    /// The served volume's cache-device flushes (`status --json` on its control socket).
    fn cache_flushes(&self) -> Option<u64> {
        let (cache, control) = self.control.as_ref()?;
        let exe = std::env::current_exe().ok()?;
        let out = Command::new(exe)
            .args(["status", "--json", "--cache"])
            .arg(cache)
            .arg("--control")
            .arg(control)
            .output()
            .ok()?;
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
        v["counters"]["cache_flushes"].as_u64()
    }

    /// Starts `cmd` (its stderr discarded), kept until the stack is dropped, and waits for
    /// `path`, which it serves, to appear.
    fn spawn_serving(&mut self, cmd: &mut Command, what: &str, path: &Path) -> Result<()> {
        let mut child = cmd.stderr(Stdio::null()).spawn().with_context(|| format!("starting {what}"))?;
        let waited = wait_for(path, what, &mut child);
        self.children.push(child);
        waited
    }

    fn flushes(&self) -> Option<u64> {
        if self.control.is_some() {
            self.cache_flushes()
        } else {
            self.loop_flushes()
        }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        if self.mounted {
            let _ = run(Command::new("umount").arg(&self.mount));
        }
        if let Some(dev) = self.loop_dev.take() {
            let _ = run(Command::new("losetup").args(["-d", &dev]));
        }
        for child in self.children.iter_mut().rev() {
            // SIGTERM: the server flushes and removes its FUSE mount; nbdfuse unmounts.
            let _ = Command::new("kill").arg(child.id().to_string()).status();
            let _ = child.wait();
        }
        for dir in &self.fuse_dirs {
            let _ = Command::new("umount").arg("-l").arg(dir).stderr(Stdio::null()).status();
        }
    }
}

/// One slice of a loop on a stack: operations per second, latencies, and fsyncs done.
struct Slice {
    per_second: f64,
    latency: Histogram<u64>,
    ops: u64,
}

fn open_direct(path: &Path) -> Result<std::fs::File> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_DIRECT)
        .open(path)
        .with_context(|| format!("opening {} with O_DIRECT", path.display()))
}

/// `threads` threads, each in a loop of "write 4 KiB at a random block of its own file,
/// fdatasync" (`commit`) or "read 4 KiB at a random block of the data file".
fn slice(stack: &Stack, commit: bool, threads: usize, seconds: f64) -> Result<Slice> {
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let results: Vec<Result<(u64, Histogram<u64>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let stop = Arc::clone(&stop);
                let (path, len) = if commit {
                    (stack.mount.join(format!("commit{t}")), COMMIT_FILE_BYTES)
                } else {
                    (stack.mount.join("data"), READ_FILE_BYTES)
                };
                s.spawn(move || -> Result<(u64, Histogram<u64>)> {
                    let f = open_direct(&path)?;
                    let mut buf = AlignedBuf::new(4096);
                    buf.fill(t as u8);
                    let mut h = latency_histogram();
                    let mut rng = 0x9e37_79b9_7f4a_7c15u64 ^ (t as u64 + 1);
                    let mut n = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        rng ^= rng << 13;
                        rng ^= rng >> 7;
                        rng ^= rng << 17;
                        let off = (rng % (len / 4096)) * 4096;
                        let t0 = Instant::now();
                        if commit {
                            f.write_all_at(&buf, off)?;
                            f.sync_data()?;
                        } else {
                            f.read_exact_at(&mut buf, off)?;
                        }
                        h.saturating_record(t0.elapsed().as_nanos() as u64 + 1);
                        n += 1;
                    }
                    Ok((n, h))
                })
            })
            .collect();
        std::thread::sleep(Duration::from_secs_f64(seconds));
        stop.store(true, Ordering::Relaxed);
        handles.into_iter().map(|h| h.join().expect("benchmark thread panicked")).collect()
    });
    let elapsed = start.elapsed().as_secs_f64();
    let mut latency = latency_histogram();
    let mut ops = 0;
    for r in results {
        let (n, h) = r?;
        ops += n;
        latency.add(&h).expect("same bounds");
    }
    Ok(Slice { per_second: ops as f64 / elapsed, latency, ops })
}

pub fn run_through(o: Options) -> Result<()> {
    // SAFETY: geteuid has no preconditions and touches no memory.
    if unsafe { libc::geteuid() } != 0 {
        bail!("--through needs root: it attaches loop devices and mounts ext4 (run with sudo)");
    }
    let mut tools = vec!["losetup", "mkfs.ext4", "mount", "umount"];
    if o.through == Through::Nbd {
        tools.push("nbdfuse");
    }
    for tool in tools {
        if which(tool).is_none() {
            bail!("{tool} is missing (apt-get install util-linux e2fsprogs fuse3 libnbd-bin)");
        }
    }
    let base = o.dir.clone().unwrap_or_else(|| PathBuf::from("/var/tmp"));
    let work = tempfile::Builder::new()
        .prefix("tiercache-e2e-")
        .tempdir_in(&base)
        .with_context(|| format!("creating a work directory in {}", base.display()))?;
    let w = work.path();
    let exe = std::env::current_exe()?;
    let quiet = o.json;
    let say = |m: &str| {
        if !quiet {
            eprintln!("{m}");
        }
    };

    say("setting up: ext4 on loop on the raw fast file");
    let raw = w.join("fast.img");
    std::fs::File::create(&raw)?.set_len(FAST_BYTES)?;
    crate::devices::precondition_file(&raw, FAST_BYTES, quiet)?;
    let mut reference = Stack::new("ext4 on loop on the raw fast file", w.join("mnt-ref"));
    reference.build_fs(&raw)?;

    let cache = w.join("cache.img");
    std::fs::File::create(&cache)?.set_len(CACHE_BYTES)?;
    crate::devices::precondition_file(&cache, CACHE_BYTES, quiet)?;
    let backing_file = w.join("backing.img");
    std::fs::File::create(&backing_file)?.set_len(2 * CACHE_BYTES)?;
    let backing = format!("emulated:hdd:{}", backing_file.display());
    run(Command::new(&exe).arg("create").arg("--cache").arg(&cache).args(["--backing", &backing]))?;
    let control = w.join("control.sock");
    let uring = match o.fuse_transport {
        FuseTransport::Auto => tiercache_fuse::io_uring_enabled(),
        FuseTransport::IoUring => true,
        FuseTransport::Dev => false,
    };
    let served_name = match o.through {
        Through::Fuse => format!(
            "ext4 on loop on the FUSE file through {} (hybrid: the cache file over emulated hdd)",
            if uring { "io_uring" } else { "/dev/fuse" }
        ),
        Through::Nbd => "ext4 on loop on nbdfuse over NBD (hybrid: the cache file over emulated hdd)".into(),
        Through::Ublk => "ext4 on /dev/ublkbN (hybrid: the cache file over emulated hdd)".into(),
    };
    say(&format!("setting up: {served_name}"));
    let mut served = Stack::new(&served_name, w.join("mnt-served"));
    served.control = Some((cache.clone(), control.clone()));
    let mut serve = Command::new(&exe);
    serve.arg("serve").arg("--cache").arg(&cache).args(["--backing", &backing]).arg("--control").arg(&control);
    let file = match o.through {
        Through::Fuse => {
            let dir = w.join("fuse");
            std::fs::create_dir_all(&dir)?;
            served.fuse_dirs.push(dir.clone());
            let file = dir.join("volume");
            let how = clap::ValueEnum::to_possible_value(&o.fuse_transport).expect("a value").get_name().to_string();
            serve.arg("--fuse").arg(&dir).args(["--fuse-transport", &how]);
            served.spawn_serving(&mut serve, "tiercache serve --fuse", &file)?;
            file
        }
        Through::Ublk => {
            // The first device number no other ublk device uses.
            let id = (0..1024).find(|n| !Path::new(&format!("/sys/block/ublkb{n}")).exists()).unwrap_or(0);
            let dev = PathBuf::from(format!("/dev/ublkb{id}"));
            served.spawn_serving(
                serve.arg("--ublk").arg("--ublk-id").arg(id.to_string()),
                "tiercache serve --ublk (is ublk_drv loaded?)",
                &dev,
            )?;
            dev
        }
        Through::Nbd => {
            let sock = w.join("nbd.sock");
            served.spawn_serving(
                serve.arg("--nbd").arg(format!("unix:{}", sock.display())),
                "tiercache serve --nbd",
                &sock,
            )?;
            let dir = w.join("nbdfuse");
            std::fs::create_dir_all(&dir)?;
            served.fuse_dirs.push(dir.clone());
            let file = dir.join("nbd");
            served.spawn_serving(
                Command::new("nbdfuse").arg(&dir).arg(format!("nbd+unix:///tiercache?socket={}", sock.display())),
                "nbdfuse",
                &file,
            )?;
            file
        }
    };
    served.build_fs(&file)?;

    // (test, committing?, threads)
    let tests: [(&'static str, bool, usize); 4] = [
        ("write 4 KiB + fdatasync", true, 1),
        ("write 4 KiB + fdatasync", true, COMMITTERS),
        ("4 KiB random read", false, 1),
        ("4 KiB random read", false, 16),
    ];
    let stacks = [&reference, &served];
    // slices[test][stack] and each stack's flushes and fsyncs per test.
    let mut slices: Vec<[Vec<Slice>; 2]> = tests.iter().map(|_| [Vec::new(), Vec::new()]).collect();
    let mut flushes = vec![[(0u64, 0u64, true); 2]; tests.len()];
    let slice_seconds = o.seconds / f64::from(o.rounds);
    for round in 0..o.rounds {
        say(&format!("round {}/{}", round + 1, o.rounds));
        for (k, &(_, commit, threads)) in tests.iter().enumerate() {
            for (s, stack) in stacks.iter().enumerate() {
                // (Flushes are counted around the commit loops only: each count is a `status`.)
                let before = if commit { stack.flushes() } else { None };
                let sl = slice(stack, commit, threads, slice_seconds)
                    .with_context(|| format!("the loop on {}", stack.name))?;
                match (before, if commit { stack.flushes() } else { None }) {
                    (Some(b), Some(a)) if commit => {
                        flushes[k][s].0 += a - b;
                        flushes[k][s].1 += sl.ops;
                    }
                    _ => flushes[k][s].2 = false,
                }
                slices[k][s].push(sl);
            }
        }
    }

    let mut rows = Vec::new();
    for (k, &(test, commit, threads)) in tests.iter().enumerate() {
        let med = |s: usize| {
            let mut v: Vec<f64> = slices[k][s].iter().map(|x| x.per_second).collect();
            v.sort_by(f64::total_cmp);
            v[v.len() / 2]
        };
        let p99 = |s: usize| {
            let mut h = latency_histogram();
            for x in &slices[k][s] {
                h.add(&x.latency).expect("same bounds");
            }
            round1(h.value_at_quantile(0.99) as f64 / 1e3)
        };
        let per_fsync = |s: usize| {
            let (f, n, ok) = flushes[k][s];
            (commit && ok && n > 0).then(|| (f as f64 / n as f64 * 1000.0).round() / 1000.0)
        };
        let (r, sv) = (med(0), med(1));
        rows.push(Row {
            test,
            threads,
            reference_per_second: round1(r),
            served_per_second: round1(sv),
            ratio: (sv / r * 1000.0).round() / 1000.0,
            reference_p99_us: p99(0),
            served_p99_us: p99(1),
            reference_flushes_per_fsync: per_fsync(0),
            served_flushes_per_fsync: per_fsync(1),
            reference_rounds: slices[k][0].iter().map(|x| round1(x.per_second)).collect(),
            served_rounds: slices[k][1].iter().map(|x| round1(x.per_second)).collect(),
        });
    }
    let report = Report {
        through: o.through,
        reference: reference.name.clone(),
        served: served.name.clone(),
        seconds_per_slice: slice_seconds,
        rounds: o.rounds,
        rows,
    };
    drop(served);
    drop(reference);
    if o.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!("reference: {}\nserved:    {}", report.reference, report.served);
    println!("median of {} interleaved slices of {:.1} s each", report.rounds, report.seconds_per_slice);
    let mut t = Table::new(&[
        "loop",
        "threads",
        "reference /s",
        "served /s",
        "ratio",
        "p99 ref us",
        "p99 served us",
        "flushes/fsync ref",
        "flushes/fsync served",
    ]);
    for r in &report.rows {
        let f = |x: Option<f64>| x.map_or(String::new(), |v| format!("{v:.2}"));
        t.row(vec![
            r.test.to_string(),
            r.threads.to_string(),
            thousands(r.reference_per_second),
            thousands(r.served_per_second),
            format!("{:.2}", r.ratio),
            format!("{:.0}", r.reference_p99_us),
            format!("{:.0}", r.served_p99_us),
            f(r.reference_flushes_per_fsync),
            f(r.served_flushes_per_fsync),
        ]);
    }
    print!("{}", t.render());
    Ok(())
}

fn which(tool: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .chain(["/sbin", "/usr/sbin"])
        .map(|d| Path::new(d).join(tool))
        .find(|p| p.is_file())
}
