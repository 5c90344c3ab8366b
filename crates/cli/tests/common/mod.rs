//! Helpers shared by the cli's integration tests: running the `tiercache` binary and judging
//! its output, temporary volumes, a served volume started and waited for, and the stamped
//! blocks `tiercache debug-load` writes. Each test file uses some of them.
#![allow(dead_code)]

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A path as a command-line argument.
pub fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// The binary under test, as a command to add arguments to.
pub fn tiercache_cmd() -> Command {
    Command::new(env!("CARGO_BIN_EXE_tiercache"))
}

pub fn tiercache(args: &[&str]) -> Output {
    tiercache_cmd().args(args).output().expect("run tiercache")
}

/// Runs `tiercache ARGS`, which must succeed; its stdout.
pub fn ok(args: &[&str]) -> String {
    let out = tiercache(args);
    assert!(out.status.success(), "{args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// Runs `tiercache ARGS` (with --json among them), which must succeed; its stdout as JSON.
pub fn ok_json(args: &[&str]) -> serde_json::Value {
    serde_json::from_str(&ok(args)).unwrap()
}

/// Runs `tiercache ARGS`, which must fail with one line on stderr containing `expected`.
pub fn fails_with(args: &[&str], expected: &str) -> Output {
    let out = tiercache(args);
    assert!(!out.status.success(), "{args:?} succeeded");
    let stderr = String::from_utf8(out.stderr.clone()).unwrap();
    assert_eq!(stderr.lines().count(), 1, "{args:?}: not one line: {stderr:?}");
    assert!(stderr.contains(expected), "{args:?}: {stderr:?} lacks {expected:?}");
    out
}

/// An external tool the test needs (installed by scripts/test).
pub fn tool(name: &str) -> Command {
    assert!(
        Command::new("which").arg(name).output().is_ok_and(|o| o.status.success()),
        "{name} is missing: install qemu-utils and libnbd-bin (scripts/test does)"
    );
    Command::new(name)
}

/// Runs qemu-io's commands on `uri`; they must all succeed (patterns verified). Its output.
pub fn qemu_io(uri: &str, cmds: &[&str]) -> String {
    let mut c = tool("qemu-io");
    c.args(["-f", "raw", uri]);
    for cmd in cmds {
        c.args(["-c", cmd]);
    }
    let out = c.output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(
        out.status.success() && !text.contains("Pattern verification failed") && !text.contains("failed"),
        "qemu-io {cmds:?}: {text}"
    );
    text
}

/// Sends SIGTERM to a child (a server: its clean stop).
pub fn sigterm(child: &Child) {
    // SAFETY: kill(2) on the PID of a child we own; no memory is passed.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
}

/// A temporary directory holding a sparse backing file `backing.img` and the place of a
/// cache file `cache.img` (created by `create`).
pub struct TempVolume {
    pub dir: tempfile::TempDir,
    pub cache: PathBuf,
    pub backing: PathBuf,
}

impl TempVolume {
    pub fn new(backing_bytes: u64) -> TempVolume {
        let dir = tempfile::tempdir().unwrap();
        let (cache, backing) = (dir.path().join("cache.img"), dir.path().join("backing.img"));
        std::fs::File::create(&backing).unwrap().set_len(backing_bytes).unwrap();
        TempVolume { dir, cache, backing }
    }

    /// With a cache of `cache_size` (e.g. "16M") created for it by `tiercache create`.
    pub fn created(backing_bytes: u64, cache_size: &str) -> TempVolume {
        let v = TempVolume::new(backing_bytes);
        v.create(cache_size);
        v
    }

    pub fn create(&self, cache_size: &str) {
        ok(&["create", "--cache", p(&self.cache), "--cache-size", cache_size, "--backing", p(&self.backing)]);
    }

    /// Runs `tiercache debug-load` on the volume with `args` (e.g. --blocks 64 --writes 100),
    /// which must succeed.
    pub fn debug_load(&self, args: &[&str]) {
        ok(&[&["debug-load", "--cache", p(&self.cache), "--backing", p(&self.backing)], args].concat());
    }

    /// A path in the directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
}

/// Spawns `serve` (or any command) with stderr piped and reads stderr until a line satisfies
/// `until`; returns the process and that line. A thread drains the rest of stderr (the server
/// writes more on its way out).
pub fn spawn_until_line(cmd: &mut Command, until: impl Fn(&str) -> bool) -> (Drained, String) {
    let mut child = cmd.stderr(Stdio::piped()).spawn().unwrap();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let line = loop {
        let mut line = String::new();
        assert!(stderr.read_line(&mut line).unwrap() > 0, "the command ended before printing the line awaited");
        if until(&line) {
            break line;
        }
    };
    let drain = std::thread::spawn(move || for _ in stderr.lines().map_while(Result::ok) {});
    (Drained { child, drain }, line)
}

/// A process whose stderr a thread reads to the end.
pub struct Drained {
    pub child: Child,
    drain: std::thread::JoinHandle<()>,
}

impl Drained {
    /// SIGTERM, then its exit status once it and its stderr ended.
    pub fn terminate(mut self) -> std::process::ExitStatus {
        sigterm(&self.child);
        let status = self.child.wait().unwrap();
        self.drain.join().unwrap();
        status
    }
}

/// A volume served over NBD by a real `tiercache serve` process, started and waited for
/// (until nbdinfo gets an answer); killed when dropped.
pub struct Server {
    pub vol: TempVolume,
    pub child: Option<Child>,
    pub endpoint: String,
    control: bool,
}

impl Server {
    /// A 64 MiB volume with a 32 MiB cache, on `endpoint` (default: a Unix socket in its directory).
    pub fn start(endpoint: Option<String>) -> Server {
        Server::start_sized(endpoint, "32M", 64 << 20, false)
    }

    /// With `control`, the server's control socket is `control()` (commands need --control).
    pub fn start_sized(endpoint: Option<String>, cache_size: &str, volume: u64, control: bool) -> Server {
        let vol = TempVolume::created(volume, cache_size);
        let endpoint = endpoint.unwrap_or_else(|| format!("unix:{}", vol.path("nbd.sock").display()));
        let mut s = Server { vol, child: None, endpoint, control };
        s.spawn();
        s
    }

    /// Starts the server (again) and waits until it serves.
    pub fn spawn(&mut self) {
        let child = tiercache_cmd()
            .args(["serve", "--cache", p(&self.vol.cache), "--backing", p(&self.vol.backing), "--nbd", &self.endpoint])
            .args(if self.control { vec!["--control".to_string(), p(&self.control()).to_string()] } else { vec![] })
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if tool("nbdinfo").arg("--size").arg(self.uri()).output().is_ok_and(|o| o.status.success()) {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("the server did not come up on {}", self.endpoint);
    }

    pub fn uri(&self) -> String {
        match self.endpoint.strip_prefix("unix:") {
            Some(sock) => format!("nbd+unix:///tiercache?socket={sock}"),
            None => {
                let rest = self.endpoint.strip_prefix("tcp:").unwrap();
                let addr = if rest.contains(':') { rest.to_string() } else { format!("127.0.0.1:{rest}") };
                format!("nbd://{addr}/tiercache")
            }
        }
    }

    pub fn control(&self) -> PathBuf {
        self.vol.path("control.sock")
    }

    pub fn cache(&self) -> PathBuf {
        self.vol.cache.clone()
    }

    /// The NBD Unix socket.
    pub fn socket(&self) -> PathBuf {
        PathBuf::from(self.endpoint.strip_prefix("unix:").unwrap())
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    pub fn kill9(&mut self) {
        let mut c = self.child.take().unwrap();
        c.kill().unwrap();
        c.wait().unwrap();
    }

    pub fn terminate(&mut self) -> std::process::ExitStatus {
        let mut c = self.child.take().unwrap();
        sigterm(&c);
        c.wait().unwrap()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The blocks of `tiercache debug-load --seed SEED --blocks BLOCKS`'s random writes, in
/// order: write `i` stamps its block with version `i + 1`.
pub fn debug_load_blocks(seed: u64, blocks: u64) -> impl Iterator<Item = u64> {
    use rand::{Rng, SeedableRng};
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    std::iter::repeat_with(move || rng.gen_range(0..blocks))
}

/// The version stamped into `data`, block `block`'s content: 0 if it is all zeroes (never
/// written). Garbage, or another block's stamp, fails the test (`what` names the block).
pub fn stamped_version(block: u64, data: &[u8], what: &str) -> u64 {
    if data.iter().all(|&b| b == 0) {
        return 0;
    }
    let (b, v) = tiercache_sim::stamp::unstamp(data).unwrap_or_else(|| panic!("{what}: garbage"));
    assert_eq!(b, block, "{what} holds another block's data");
    v
}

/// Turns on FUSE over io_uring for the mounts a test makes (the kernel reads the switch at
/// each mount's INIT; as root). False, with a note, where this kernel has no such switch
/// (before 6.14, or built without CONFIG_FUSE_IO_URING): the caller then skips.
pub fn enable_fuse_uring() -> bool {
    let param = Path::new("/sys/module/fuse/parameters/enable_uring");
    if !param.exists() {
        eprintln!("skipped: this kernel has no FUSE over io_uring ({} is missing)", param.display());
        return false;
    }
    std::fs::write(param, "Y").expect("turning on FUSE over io_uring (needs root)");
    true
}
