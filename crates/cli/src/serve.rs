//! `tiercache serve`: one long-running process that opens (recovers) the volume, runs its
//! background write-back, serves it through the chosen frontends, answers `tiercache status`
//! on a control socket, and on SIGTERM or SIGINT disconnects clients, makes everything
//! durable and exits. SIGKILL at any moment loses nothing that was flushed.

use crate::control::{
    self, ErrorReply, FlushReply, LatencyWindow, Rates, Request, ServerReport, StatusReply, TraceReply,
};
use crate::devices::DeviceSpec;
use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::HumanBytes;
use sd_notify::NotifyState;
use std::io::{BufRead, BufReader};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tiercache_device::MonotonicClock;
use tiercache_engine::{Background, Counters, Volume, VolumeOptions};

#[derive(Debug, Args)]
#[command(group = clap::ArgGroup::new("frontend").args(["nbd", "fuse", "ublk"]).multiple(true))]
#[command(after_help = "\
Examples:
  tiercache serve --cache /dev/nvme0n1p1 --backing /dev/md0 --nbd unix:/run/tc.sock
  tiercache serve --cache c.img --backing b.img --nbd tcp:10809        (127.0.0.1:10809)
  tiercache serve --config /etc/tiercache/db.toml                      (see docs/operations.md)
  tiercache serve --config /etc/tiercache/db.toml --dirty-high 50      (a flag overrides the file)
  tiercache serve --passthrough /dev/nvme0n1p1 --nbd unix:/run/raw.sock (no cache: a baseline)
  tiercache serve --cache /dev/nvme0n1p1 --backing /dev/md0 --ublk --ublk-id 0   (/dev/ublkb0)
  qemu-io -f raw -r 'nbd+unix:///tiercache?socket=/run/tc.sock' -c 'read -v 0 512'   (read-only)

A config file is TOML with the flags' names as keys, e.g.:
  cache = \"/dev/nvme0n1p1\"
  backing = \"/dev/md0\"
  nbd = [\"unix:/run/tiercache/db.sock\"]
  fuse = \"/run/tiercache/db\"
  dirty_high = 70

Stop with SIGTERM or Ctrl-C: clients are disconnected and everything is made durable.
Under systemd (Type=notify) it reports READY=1 once recovered and serving.
`tiercache status` and `tiercache flush` work while this runs (through the control socket).")]
pub struct ServeArgs {
    /// A TOML file with any of the settings below (keys: cache, backing, nbd, fuse,
    /// fuse_transport, export_name, control, metrics, record_trace, sequential_bypass, eviction,
    /// dirty_low, dirty_high; ublk and passthrough are flags only); flags given as well
    /// override it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,
    /// The cache device: PATH, or emulated:PROFILE:PATH.
    #[arg(long, value_name = "DEVICE")]
    cache: Option<String>,
    /// The backing device.
    #[arg(long, value_name = "DEVICE")]
    backing: Option<String>,
    /// Serve DEVICE itself through --fuse, --nbd and/or --ublk, with no cache: the baseline a
    /// benchmark compares the hybrid volume with, through the very same frontend.
    #[arg(long, value_name = "DEVICE", conflicts_with_all = ["cache", "backing", "config"], requires = "frontend")]
    passthrough: Option<String>,
    /// Serve over NBD: unix:SOCKET, tcp:PORT (loopback), or tcp:HOST:PORT. Repeatable.
    #[arg(long, value_name = "ENDPOINT")]
    nbd: Vec<String>,
    /// Serve the volume as the file MOUNTDIR/volume through FUSE (for losetup --direct-io=on).
    #[arg(long, value_name = "MOUNTDIR")]
    fuse: Option<PathBuf>,
    /// With --fuse: how the kernel hands requests over. io-uring (Linux 6.14+, with
    /// `echo Y > /sys/module/fuse/parameters/enable_uring`) serves each on the CPU that sent
    /// it, through io_uring; dev reads and writes /dev/fuse; auto takes io-uring where the
    /// kernel enables it (the default).
    #[arg(long, value_enum, value_name = "HOW", requires = "fuse")]
    fuse_transport: Option<FuseTransport>,
    /// Serve the volume as the block device /dev/ublkbN (Linux 6.0+, `modprobe ublk_drv`):
    /// the fastest frontend, no socket in the path. FLUSH and FUA reach the volume's flush.
    #[arg(long)]
    ublk: bool,
    /// With --ublk: the device number N (default: the next free one). If /dev/ublkbN was left
    /// by a server killed without removing it, this server re-attaches to it, and requests
    /// queued meanwhile run (a file system mounted on it survives the restart).
    #[arg(long, value_name = "N", requires = "ublk")]
    ublk_id: Option<u32>,
    /// With --ublk: hardware queues, one serving thread each (default: one per core).
    #[arg(long, value_name = "N", requires = "ublk", value_parser = clap::value_parser!(u16).range(1..=64))]
    ublk_queues: Option<u16>,
    /// With --ublk: requests in flight per queue (default 64).
    #[arg(long, value_name = "N", requires = "ublk", value_parser = clap::value_parser!(u16).range(1..=4096))]
    ublk_depth: Option<u16>,
    /// The NBD export name (clients may also ask for ""). Default: tiercache.
    #[arg(long)]
    export_name: Option<String>,
    /// Control socket for `tiercache status` and `flush` (default: derived from the volume's
    /// UUID).
    #[arg(long, value_name = "PATH")]
    control: Option<PathBuf>,
    /// Serve Prometheus metrics (counters, gauges, request latency histograms) at
    /// http://ADDR/metrics, e.g. 127.0.0.1:9560 (port 0: any free port, reported at start).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// Record every request the frontends pass on into FILE (gzip'd CSV,
    /// `time_ns,op,offset_bytes,length_bytes`, for `tiercache replay`), from start to stop.
    /// Recording never delays a request: if the writer falls behind, requests are left out
    /// of the trace and counted in the log.
    #[arg(long, value_name = "FILE")]
    record_trace: Option<PathBuf>,
    /// A sequential read stream's misses past this size are not admitted into the cache
    /// (scans, backups and dumps do not push the hot set out). 0 admits whatever the stream.
    /// Default: 2M.
    #[arg(long, value_name = "SIZE", value_parser = crate::devices::parse_size)]
    sequential_bypass: Option<u64>,
    /// The read cache's eviction policy: `adaptive` (the default: `s3fifo`, plus misses
    /// filling the log until it first wraps, and a miss of a block evicted lately refused
    /// the log unless read more often than the block it would push out, whenever a small
    /// simulation of both rules says the refusal misses less), `s3fifo` (a miss waits in the
    /// probation ring and moves into the log only if read again there; blocks read again
    /// since they entered the log are kept when it wraps), `reinsert` (the log alone, as
    /// before the ring: every admitted miss enters the log; the ring stays unused) or `fifo`
    /// (the log alone, every clean block evicted when it wraps; kept to measure against).
    #[arg(long, value_name = "POLICY")]
    eviction: Option<tiercache_engine::Eviction>,
    /// Write-back stops when dirty data falls to this percentage of the cache's log (default: the
    /// value given at create, 30).
    #[arg(long, value_name = "PERCENT")]
    dirty_low: Option<f64>,
    /// Write-back starts when dirty data exceeds this percentage of the cache's log (default: the
    /// value given at create, 70).
    #[arg(long, value_name = "PERCENT")]
    dirty_high: Option<f64>,
}

/// A size in the config file: a string with a unit ("2M") or a bare number of bytes.
#[derive(Debug, serde::Deserialize)]
#[serde(untagged)]
enum SizeValue {
    Bytes(u64),
    Text(String),
}

/// `serve --fuse-transport` (and `fuse_transport` in a config file).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum FuseTransport {
    Auto,
    IoUring,
    Dev,
}

/// Mounts `target` as MOUNTDIR/volume; the endpoint, named with its transport, goes to
/// `endpoints`.
fn mount_fuse(
    target: &Arc<dyn tiercache_frontend::ByteIo>,
    dir: &Path,
    how: FuseTransport,
    endpoints: &mut Vec<String>,
) -> Result<tiercache_fuse::Mounted> {
    let transport = match how {
        FuseTransport::Auto => tiercache_fuse::Transport::Auto,
        FuseTransport::IoUring => tiercache_fuse::Transport::IoUring,
        FuseTransport::Dev => tiercache_fuse::Transport::Dev,
    };
    let hint = if how == FuseTransport::IoUring { "" } else { " (is fuse3 installed?)" };
    let mounted = tiercache_fuse::mount(Arc::clone(target), dir, transport)
        .with_context(|| format!("mounting FUSE at {}{hint}", dir.display()))?;
    endpoints.push(format!("FUSE {}/{} ({})", dir.display(), tiercache_fuse::FILE_NAME, mounted.transport()));
    Ok(mounted)
}

/// `serve --config FILE`: the same settings as the flags (unknown keys are errors).
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct ServeConfig {
    cache: Option<String>,
    backing: Option<String>,
    #[serde(default)]
    nbd: Vec<String>,
    fuse: Option<PathBuf>,
    /// "auto", "io-uring" or "dev".
    fuse_transport: Option<FuseTransport>,
    export_name: Option<String>,
    control: Option<PathBuf>,
    metrics: Option<String>,
    record_trace: Option<PathBuf>,
    /// A size: "2M", or a number of bytes (0 admits everything).
    sequential_bypass: Option<SizeValue>,
    /// "adaptive", "s3fifo", "reinsert" or "fifo".
    eviction: Option<tiercache_engine::Eviction>,
    dirty_low: Option<f64>,
    dirty_high: Option<f64>,
}

impl ServeArgs {
    /// The settings: flags first, then the config file.
    fn merged(mut self) -> Result<ServeArgs> {
        let Some(path) = &self.config else { return Ok(self) };
        let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        // (toml's message names the line and column, and quotes it.)
        let c: ServeConfig = toml::from_str(&text).map_err(|e| anyhow::anyhow!("{}: {e}", path.display()))?;
        // Values the file gives that parse but cannot be used, refused naming the file, the
        // key and its line (flags given as well are checked as flags, later).
        let at = |key: &str| {
            let line = text
                .lines()
                .position(|l| l.trim_start().strip_prefix(key).is_some_and(|r| r.trim_start().starts_with('=')));
            format!("{}{}: {key}", path.display(), line.map_or(String::new(), |n| format!(" line {}", n + 1)))
        };
        self.cache = self.cache.or(c.cache);
        self.backing = self.backing.or(c.backing);
        if self.nbd.is_empty() {
            if let Some(bad) = c.nbd.iter().find(|e| !e.starts_with("unix:") && !e.starts_with("tcp:")) {
                bail!("{}: {bad:?} is no NBD endpoint (unix:SOCKET, tcp:PORT or tcp:HOST:PORT)", at("nbd"));
            }
            self.nbd = c.nbd;
        }
        self.fuse = self.fuse.or(c.fuse);
        self.fuse_transport = self.fuse_transport.or(c.fuse_transport);
        self.export_name = self.export_name.or(c.export_name);
        self.control = self.control.or(c.control);
        self.record_trace = self.record_trace.or(c.record_trace);
        if self.sequential_bypass.is_none() {
            self.sequential_bypass = match &c.sequential_bypass {
                Some(SizeValue::Bytes(n)) => Some(*n),
                Some(SizeValue::Text(s)) => Some(
                    crate::devices::parse_size(s)
                        .map_err(|e| anyhow::anyhow!("{} = {s:?}: {e}", at("sequential_bypass")))?,
                ),
                None => None,
            };
        }
        self.eviction = self.eviction.or(c.eviction);
        for (key, value) in [("dirty_low", c.dirty_low), ("dirty_high", c.dirty_high)] {
            if let Some(v) = value.filter(|v| !(0.0..=100.0).contains(v)) {
                bail!("{} = {v}: a percentage of the cache's log between 0 and 100", at(key));
            }
        }
        if let (None, None, Some(low), Some(high)) = (self.dirty_low, self.dirty_high, c.dirty_low, c.dirty_high) {
            if low > high {
                bail!("{} = {low} is above dirty_high = {high} (low <= high)", at("dirty_low"));
            }
        }
        if let (None, Some(m)) = (&self.metrics, &c.metrics) {
            check_metrics_address(m).map_err(|e| anyhow::anyhow!("{}: {e}", at("metrics")))?;
        }
        self.metrics = self.metrics.or(c.metrics);
        self.dirty_low = self.dirty_low.or(c.dirty_low);
        self.dirty_high = self.dirty_high.or(c.dirty_high);
        Ok(self)
    }

    /// The watermarks to run with, per mille, if any was given (the other one from `sb`).
    fn watermarks(&self, sb_low: u16, sb_high: u16) -> Result<Option<(u16, u16)>> {
        if self.dirty_low.is_none() && self.dirty_high.is_none() {
            return Ok(None);
        }
        let permille = |name: &str, v: Option<f64>, recorded: u16| -> Result<u16> {
            match v {
                None => Ok(recorded),
                Some(p) if (0.0..=100.0).contains(&p) => Ok((p * 10.0).round() as u16),
                Some(p) => bail!("--{name} {p}: a percentage of the cache's log between 0 and 100"),
            }
        };
        let (low, high) =
            (permille("dirty-low", self.dirty_low, sb_low)?, permille("dirty-high", self.dirty_high, sb_high)?);
        if low > high {
            bail!(
                "dirty watermarks: low {:.1} % is above high {:.1} % (give both, low <= high)",
                f64::from(low) / 10.0,
                f64::from(high) / 10.0
            );
        }
        Ok(Some((low, high)))
    }
}

/// Tells the service manager (systemd's `Type=notify`, through `$NOTIFY_SOCKET`) how far the
/// server got; nothing happens without that variable. A failure to tell is logged, never fatal.
fn notify(states: &[NotifyState]) {
    if let Err(e) = sd_notify::notify(false, states) {
        tracing::warn!(error = %e, "telling the service manager (NOTIFY_SOCKET) failed");
    }
}

/// Binds a Unix socket, replacing a stale socket file (one nobody listens on).
fn bind_unix(path: &Path) -> Result<UnixListener> {
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        use std::os::unix::fs::FileTypeExt;
        if !meta.file_type().is_socket() {
            bail!("{}: exists and is not a socket; refusing to replace it", path.display());
        }
        if UnixStream::connect(path).is_ok() {
            bail!("{}: another server is listening on this socket", path.display());
        }
        std::fs::remove_file(path).with_context(|| format!("removing the stale socket {}", path.display()))?;
    }
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    UnixListener::bind(path).with_context(|| format!("listening on {}", path.display()))
}

/// Binds an NBD endpoint; returns the listener and the endpoint as bound (tcp:0 becomes the
/// port the kernel chose, so that it can be told).
/// Binds every NBD endpoint: the listeners, what each is shown as, and the Unix socket files
/// made (removed when that guard drops: at the end of serving, or when anything after the
/// binding fails, so a server that did not come up leaves no socket behind).
fn bind_endpoints(endpoints: &[String]) -> Result<(Vec<tiercache_nbd::Listener>, Vec<String>, SocketFiles)> {
    let (mut listeners, mut shown, mut files) = (Vec::new(), Vec::new(), SocketFiles(Vec::new()));
    for e in endpoints {
        let (l, s) = parse_endpoint(e)?;
        if let Some(path) = e.strip_prefix("unix:") {
            files.0.push(PathBuf::from(path));
        }
        listeners.push(l);
        shown.push(s);
    }
    Ok((listeners, shown, files))
}

/// Unix socket files this server made, removed on drop.
struct SocketFiles(Vec<PathBuf>);

impl Drop for SocketFiles {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

fn parse_endpoint(e: &str) -> Result<(tiercache_nbd::Listener, String)> {
    if let Some(path) = e.strip_prefix("unix:") {
        return Ok((tiercache_nbd::Listener::Unix(bind_unix(Path::new(path))?), e.to_string()));
    }
    if let Some(rest) = e.strip_prefix("tcp:") {
        // tcp:PORT listens on loopback; tcp:HOST:PORT (or tcp:[v6]:PORT) where told.
        let addr = if rest.contains(':') { rest.to_string() } else { format!("127.0.0.1:{rest}") };
        let l = std::net::TcpListener::bind(&addr).with_context(|| format!("listening on {addr}"))?;
        let bound = l.local_addr().map_or_else(|_| e.to_string(), |a| format!("tcp:{a}"));
        return Ok((tiercache_nbd::Listener::Tcp(l), bound));
    }
    bail!("'{e}': an NBD endpoint is unix:SOCKET, tcp:PORT or tcp:HOST:PORT")
}

/// The ublk frontend's thread, while /dev/ublkbN is served.
struct Ublk {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<std::result::Result<(), tiercache_ublk::Error>>>,
    /// /dev/ublkbN while served.
    device: Option<String>,
}

impl Ublk {
    /// With --ublk: creates (or re-attaches to) /dev/ublkbN serving `backend` and waits until
    /// it exists (adding it to `endpoints`); without, nothing.
    fn start(
        args: &ServeArgs,
        backend: &Arc<dyn tiercache_frontend::ByteIo>,
        identity: String,
        endpoints: &mut Vec<String>,
    ) -> Result<Ublk> {
        let stop = Arc::new(AtomicBool::new(false));
        if !args.ublk {
            return Ok(Ublk { stop, thread: None, device: None });
        }
        let defaults = tiercache_ublk::Options::default();
        let options = tiercache_ublk::Options {
            id: args.ublk_id,
            queues: args.ublk_queues.unwrap_or(defaults.queues),
            depth: args.ublk_depth.unwrap_or(defaults.depth),
            identity,
        };
        let (tx, rx) = std::sync::mpsc::channel::<String>();
        let (backend, stop2) = (Arc::clone(backend), Arc::clone(&stop));
        let thread = std::thread::Builder::new().name("ublk".into()).spawn(move || {
            tiercache_ublk::serve(backend, &options, stop2, move |path| {
                let _ = tx.send(path.to_string());
            })
        })?;
        match rx.recv_timeout(Duration::from_secs(30)) {
            Ok(path) => {
                tracing::info!(device = %path, "serving ublk");
                endpoints.push(format!("ublk {path}"));
                Ok(Ublk { stop, thread: Some(thread), device: Some(path) })
            }
            Err(_) => {
                stop.store(true, Ordering::Relaxed);
                match thread.join() {
                    Ok(Err(e)) => Err(e.into()),
                    Ok(Ok(())) => Err(anyhow::anyhow!("the ublk device did not come up within 30 s")),
                    Err(_) => Err(anyhow::anyhow!("the ublk frontend failed while starting (see the message above)")),
                }
            }
        }
    }

    /// Whether a stop must wait: /dev/ublkbN has a file system mounted on it (or is held open
    /// exclusively), and removing it would fail that file system's writes. Says so, and clears
    /// `stop` so that the server keeps serving (a SIGKILL instead leaves the device for a
    /// restart to re-attach).
    fn refuses_to_stop(&self, stop: &AtomicBool) -> bool {
        let Some(dev) = self.device.as_deref().filter(|d| tiercache_ublk::in_use(d)) else { return false };
        tracing::error!(device = %dev, "not stopping: the device is in use (unmount it, then signal again)");
        stop.store(false, Ordering::Relaxed);
        true
    }

    /// Flushes the volume, then removes /dev/ublkbN.
    fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread {
            match t.join() {
                Ok(Err(e)) => tracing::warn!(error = %e, "ublk"),
                Err(_) => tracing::warn!("the ublk thread panicked"),
                Ok(Ok(())) => tracing::info!("ublk device removed"),
            }
        }
    }
}

/// A FUSE mount directory must exist and be empty: mounting over files hides them.
fn check_mount_dir(dir: &Path) -> Result<()> {
    // ENOTCONN, ECONNABORTED or ECANCELED: a FUSE mount whose server is gone (killed,
    // crashed), met by stat or by the listing.
    let dead_mount = |e: &std::io::Error| {
        matches!(e.raw_os_error(), Some(libc::ENOTCONN) | Some(libc::ECONNABORTED) | Some(libc::ECANCELED))
    };
    let dead = |e: std::io::Error| {
        anyhow::anyhow!(
            "--fuse {}: a FUSE mount whose server is gone is still there ({e}): after a crash, detach the loop device over it and `umount -l {}`",
            dir.display(),
            dir.display()
        )
    };
    match std::fs::metadata(dir) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => bail!("--fuse {}: not a directory", dir.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            bail!("--fuse {}: no such directory (create it: mkdir -p {})", dir.display(), dir.display())
        }
        Err(e) if dead_mount(&e) => return Err(dead(e)),
        Err(e) => return Err(e).with_context(|| format!("--fuse {}", dir.display())),
    }
    let mut entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if dead_mount(&e) => return Err(dead(e)),
        Err(e) => return Err(e).with_context(|| format!("--fuse {}", dir.display())),
    };
    if entries.next().is_some() {
        bail!("--fuse {}: not empty (mounting there would hide its files); give an empty directory", dir.display());
    }
    Ok(())
}

/// Refuses a `--metrics` address that cannot be listened on before the volume is opened and
/// recovered (it is bound only once the volume is up).
fn check_metrics_address(addr: &str) -> Result<()> {
    use std::net::ToSocketAddrs;
    let resolved = addr
        .to_socket_addrs()
        .map_err(|e| anyhow::anyhow!("--metrics {addr}: {e} (an address is HOST:PORT, e.g. 127.0.0.1:9561)"))?;
    for a in resolved {
        // (Bound and let go at once: a port another process holds is refused now, not after recovery.)
        match std::net::TcpListener::bind(a) {
            Ok(_) => return Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::AddrInUse => bail!("--metrics {addr}: {e}"),
            Err(_) => continue,
        }
    }
    bail!("--metrics {addr}: no address it names can be listened on")
}

/// Serves a plain device with no cache through the frontends asked for, until SIGTERM (no
/// control socket, no metrics): the baseline of a benchmark.
fn passthrough_cmd(spec: &str, args: &ServeArgs) -> Result<()> {
    if let Some(dir) = &args.fuse {
        check_mount_dir(dir)?;
    }
    let dev = DeviceSpec::parse(spec)?.open("passthrough")?;
    let (listeners, mut endpoints, _socket_files) = bind_endpoints(&args.nbd)?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, Arc::clone(&stop)).context("installing signal handlers")?;
    }
    let target: Arc<dyn tiercache_frontend::ByteIo> = Arc::new(tiercache_frontend::Passthrough::new(dev));
    let config = tiercache_nbd::Config {
        export_name: args.export_name.clone().unwrap_or_else(|| tiercache_nbd::Config::default().export_name),
        description: format!("{spec} without a cache (tiercache passthrough)"),
        ..Default::default()
    };
    let nbd_stop = Arc::new(AtomicBool::new(false));
    let threads: Vec<_> = listeners
        .into_iter()
        .map(|listener| {
            let (target, config, stop) = (Arc::clone(&target), config.clone(), Arc::clone(&nbd_stop));
            std::thread::spawn(move || tiercache_nbd::serve(listener, target, config, stop))
        })
        .collect();
    let ublk = Ublk::start(args, &target, format!("passthrough {spec}"), &mut endpoints)?;
    let session = match &args.fuse {
        Some(dir) => {
            Some(mount_fuse(&target, dir, args.fuse_transport.unwrap_or(FuseTransport::Auto), &mut endpoints)?)
        }
        None => None,
    };
    eprintln!("tiercache: serving {spec} without a cache on {}", endpoints.join(", "));
    loop {
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
        }
        if !ublk.refuses_to_stop(&stop) {
            break;
        }
    }
    if let Some(session) = session {
        session.umount_and_join().context("unmounting FUSE")?;
    }
    ublk.stop();
    nbd_stop.store(true, Ordering::Relaxed);
    for t in threads {
        if let Ok(Err(e)) = t.join() {
            tracing::warn!(error = %e, "NBD listener");
        }
    }
    Ok(())
}

pub fn serve_cmd(args: ServeArgs) -> Result<()> {
    if let Some(spec) = &args.passthrough {
        return passthrough_cmd(spec, &args);
    }
    let args = args.merged()?;
    let (Some(cache_spec), Some(backing_spec)) = (args.cache.clone(), args.backing.clone()) else {
        bail!("give the cache and backing devices: --cache DEVICE --backing DEVICE (or cache and backing in --config FILE)");
    };
    if args.nbd.is_empty() && args.fuse.is_none() && !args.ublk {
        bail!("nothing to serve: give --nbd ENDPOINT, --fuse MOUNTDIR and/or --ublk");
    }
    if args.ublk {
        tiercache_ublk::check_driver()?;
    }
    if let Some(addr) = &args.metrics {
        check_metrics_address(addr)?;
    }
    notify(&[NotifyState::Status("opening the devices and recovering the volume")]);
    let (cache_device, backing_device) = (DeviceSpec::parse(&cache_spec)?, DeviceSpec::parse(&backing_spec)?);
    let cache = cache_device.open("cache")?;
    let backing = backing_device.open("backing")?;
    // (After the devices: a volume another server holds is named as such, with its pid, before
    // its FUSE directory is found in use.)
    if let Some(dir) = &args.fuse {
        check_mount_dir(dir)?;
    }
    let (listeners, bound, _socket_files) = bind_endpoints(&args.nbd)?;
    let sb = tiercache_engine::read_superblock(&*cache).map_err(|e| {
        crate::safety::explain_not_a_cache(e.into(), &cache_device.path, Some((&backing_device.path, &*backing)))
    })?;
    let options = VolumeOptions {
        dirty_watermarks_permille: args.watermarks(sb.dirty_low_permille, sb.dirty_high_permille)?,
        sequential_bypass_bytes: args.sequential_bypass.unwrap_or(tiercache_engine::constants::SEQUENTIAL_BYPASS_BYTES),
        eviction: args.eviction.unwrap_or_default(),
        ..VolumeOptions::default()
    };
    let (volume, report) = Volume::open(cache, backing, Arc::new(MonotonicClock::new()), options)?;
    tracing::info!(
        replayed_records = report.replayed_records,
        cached_blocks = report.recovered_blocks,
        dirty_blocks = report.recovered_dirty_blocks,
        "volume recovered"
    );
    if report.replayed_records > 0 {
        // (A clean stop checkpoints the whole log: records to replay mean it did not get there.)
        tracing::warn!(
            replayed_records = report.replayed_records,
            "the last stop was not clean (a crash, SIGKILL or power loss): the log was replayed from the last checkpoint; every flushed write is back"
        );
    }
    let volume = Arc::new(volume);
    let background = Background::start(&volume);
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, Arc::clone(&stop)).context("installing signal handlers")?;
    }
    let status = volume.status();
    let control_path = args.control.clone().unwrap_or_else(|| control::default_path(&status.uuid));
    let control = bind_unix(&control_path)?;
    // (Removed if anything after this fails, and at the end: a server that did not come up
    // leaves no control socket behind.)
    let control_file = SocketFiles(vec![control_path.clone()]);
    control.set_nonblocking(true)?;
    let config = tiercache_nbd::Config {
        export_name: args.export_name.clone().unwrap_or_else(|| tiercache_nbd::Config::default().export_name),
        ..Default::default()
    };
    let mut endpoints = bound.clone();
    // The frontends' view of the volume: every request timed (for `status`, and for the
    // Prometheus histograms when metrics are served).
    let observed = match &args.metrics {
        Some(addr) => {
            let (observed, bound) =
                crate::metrics::start(addr, &volume, Arc::clone(&config.connections), Arc::clone(&stop))?;
            tracing::info!(address = %bound, "serving metrics");
            endpoints.push(format!("metrics http://{bound}/metrics"));
            observed
        }
        None => crate::metrics::Observed::new(&volume),
    };
    if let Some(path) = &args.record_trace {
        observed.trace.start(path)?;
        endpoints.push(format!("trace {}", path.display()));
    }
    let backend: Arc<dyn tiercache_frontend::ByteIo> = Arc::clone(&observed) as _;
    let ublk = Ublk::start(&args, &backend, format!("tiercache volume {}", status.uuid), &mut endpoints)?;
    let server = Arc::new(ServerInfo {
        pid: std::process::id(),
        started: std::time::Instant::now(),
        endpoints: std::sync::Mutex::new(endpoints.clone()),
        replayed_at_start: report.replayed_records,
        control: control_path.clone(),
        nbd_clients: Arc::clone(&config.connections),
        samples: std::sync::Mutex::new(std::collections::VecDeque::new()),
        observed: Arc::clone(&observed),
    });
    {
        // Counters sampled every second (the last minute kept), for the rates `status` shows.
        // The first before any client can connect.
        server.sample(volume.counters());
        let (server, volume, stop) = (Arc::clone(&server), Arc::downgrade(&volume), Arc::clone(&stop));
        std::thread::Builder::new().name("tiercache-rates".into()).spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(Duration::from_secs(1));
                let Some(v) = volume.upgrade() else { break };
                server.sample(v.counters());
            }
        })?;
    }
    let mut threads = Vec::new();
    let nbd_stop = Arc::new(AtomicBool::new(false));
    for (endpoint, listener) in bound.iter().zip(listeners) {
        let (backend, config, stop) = (Arc::clone(&backend), config.clone(), Arc::clone(&nbd_stop));
        tracing::info!(%endpoint, export = %config.export_name, "serving NBD");
        threads.push(std::thread::spawn(move || tiercache_nbd::serve(listener, backend, config, stop)));
    }
    let mut fuse_session = match &args.fuse {
        Some(dir) => {
            let session =
                mount_fuse(&backend, dir, args.fuse_transport.unwrap_or(FuseTransport::Auto), &mut endpoints)?;
            // (`status` lists it, and `preload` of a file finds the FUSE file there.)
            *server.endpoints.lock().expect("endpoints") = endpoints.clone();
            Some(session)
        }
        None => None,
    };
    let serving = format!(
        "serving {} ({} cached, {} dirty) on {}; control socket {}",
        cache_spec,
        HumanBytes(status.cached_bytes),
        HumanBytes(status.dirty_bytes),
        endpoints.join(", "),
        control_path.display()
    );
    eprintln!("tiercache: {serving}");
    // Recovered, every endpoint bound, FUSE mounted: a unit ordered after this one may start.
    notify(&[NotifyState::Ready, NotifyState::Status(&serving)]);
    loop {
        while !stop.load(Ordering::Relaxed) {
            match control.accept() {
                Ok((conn, _)) => {
                    // Answered on its own thread: a slow client never delays a shutdown.
                    let (v, server) = (Arc::clone(&volume), Arc::clone(&server));
                    std::thread::spawn(move || {
                        if let Err(e) = answer_control(conn, &v, &server) {
                            tracing::debug!(error = %e, "control connection");
                        }
                    });
                }
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(50)),
                Err(e) => {
                    tracing::warn!(error = %e, "control socket");
                    std::thread::sleep(Duration::from_millis(200));
                }
            }
        }
        if ublk.refuses_to_stop(&stop) {
            continue;
        }
        // FUSE first: if its file is still in use (a loop device attached, an open handle),
        // the volume must not be shut down under it. Keep serving and say why.
        if let (Some(session), Some(dir)) = (fuse_session.take(), &args.fuse) {
            match unmount(dir) {
                Ok(()) => {
                    tracing::info!("FUSE unmounted");
                    let _ = session.join();
                }
                Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
                    tracing::error!(
                        mount = %dir.display(),
                        "not stopping: the FUSE file is in use (unmount the file system and `losetup -d` the loop device, then signal again)"
                    );
                    fuse_session = Some(session);
                    stop.store(false, Ordering::Relaxed);
                    continue;
                }
                Err(e) => {
                    tracing::warn!(error = %e, "FUSE unmount; trying fusermount");
                    session.umount_and_join().context("unmounting FUSE")?;
                }
            }
        }
        break;
    }
    tracing::info!("stopping: disconnecting clients");
    notify(&[NotifyState::Stopping, NotifyState::Status("stopping: disconnecting clients, making everything durable")]);
    ublk.stop();
    nbd_stop.store(true, Ordering::Relaxed);
    for t in threads {
        if let Ok(Err(e)) = t.join() {
            tracing::warn!(error = %e, "NBD listener");
        }
    }
    drop(background);
    if let Some((path, n)) = observed.trace.stop()? {
        eprintln!("tiercache: trace of {n} requests written to {}", path.display());
    }
    volume.shutdown().context("making everything durable at shutdown")?;
    drop(control_file);
    drop(_socket_files);
    eprintln!("tiercache: stopped cleanly; everything is durable");
    Ok(())
}

/// Unmounts a directory with umount(2); EBUSY means something still uses the mount.
fn unmount(dir: &Path) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).map_err(std::io::Error::other)?;
    // SAFETY: umount2 reads the NUL-terminated path, which lives across the call.
    if unsafe { libc::umount2(c.as_ptr(), 0) } == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// Answers one control connection (the protocol is in `control`). A flush writes back every
/// block dirty now while the volume keeps serving (paced to half the devices' time, so the
/// foreground load keeps at least about half its rate), reporting each batch. A client that
/// goes away stops it; what was written back stays clean, and the next `flush` continues
/// from there.
fn answer_control(conn: UnixStream, volume: &Volume, server: &ServerInfo) -> Result<()> {
    use std::io::Read;
    conn.set_nonblocking(false)?;
    conn.set_read_timeout(Some(Duration::from_secs(5)))?;
    let mut line = Vec::new();
    let w = &conn;
    // (At most 4 KiB per line; the same reader for a second line, which `trace-start` has.)
    let mut reader = BufReader::new(&conn);
    if let Err(e) = (&mut reader).take(4096).read_until(b'\n', &mut line) {
        control::write_line(w, &ErrorReply::new(format!("reading the request: {e}")))?;
        return Ok(());
    }
    // (Not UTF-8: the request is wrong all the same, and the reply still names it.)
    match Request::parse(&String::from_utf8_lossy(&line)) {
        Ok(Request::Status) => {
            let status = volume.status();
            let server = server.report(status.counters, status.block_size);
            control::write_line(w, &StatusReply { volume: status, server })?
        }
        Ok(Request::Flush) => {
            tracing::info!("online flush requested through the control socket");
            let mut gone = false;
            let r = volume.write_back_all(ONLINE_FLUSH_BUSY_SHARE, |done, remaining| {
                notify(&[NotifyState::Status(&format!(
                    "serving; online flush: {done} blocks written back, {remaining} to go"
                ))]);
                gone = control::write_line(w, &FlushReply::Progress { done, remaining }).is_err();
                !gone
            });
            notify(&[NotifyState::Status("serving")]);
            let reply = match r {
                Ok(n) if gone => {
                    tracing::info!(
                        written_back = n,
                        "online flush stopped: its client went away (run it again to continue)"
                    );
                    return Ok(());
                }
                Ok(n) => FlushReply::Finished { ok: true, written_back: n },
                Err(tiercache_engine::EngineError::LostBlocks { blocks, .. }) => FlushReply::Failed(ErrorReply {
                    error: "some blocks are lost: their only copy failed its checksum, and the backing device holds stale data for them".into(),
                    lost_blocks: Some(blocks),
                }),
                Err(e) => FlushReply::Failed(ErrorReply::new(e.to_string())),
            };
            tracing::info!(result = %serde_json::to_string(&reply)?, "online flush ended");
            control::write_line(w, &reply)?;
        }
        Ok(Request::TraceStart) => {
            let mut path = Vec::new();
            (&mut reader).take(4096).read_until(b'\n', &mut path)?;
            let path = String::from_utf8_lossy(&path).trim().to_string();
            if path.is_empty() || !Path::new(&path).is_absolute() {
                control::write_line(
                    w,
                    &ErrorReply::new(format!("trace-start needs an absolute path on its second line, not {path:?}")),
                )?;
                return Ok(());
            }
            match server.observed.trace.start(Path::new(&path)) {
                Ok(()) => control::write_line(w, &TraceReply { recording: true, path, requests: None })?,
                Err(e) => control::write_line(w, &ErrorReply::new(format!("{e:#}")))?,
            }
        }
        Ok(Request::TraceStop) => match server.observed.trace.stop() {
            Ok(Some((path, n))) => control::write_line(
                w,
                &TraceReply { recording: false, path: path.display().to_string(), requests: Some(n) },
            )?,
            Ok(None) => control::write_line(w, &ErrorReply::new("no trace is being recorded".to_string()))?,
            Err(e) => control::write_line(w, &ErrorReply::new(format!("{e:#}")))?,
        },
        Ok(Request::Preload) => {
            let mut body = Vec::new();
            (&mut reader).take(control::PRELOAD_REQUEST_MAX_BYTES).read_until(b'\n', &mut body)?;
            let reply = match serde_json::from_slice::<control::PreloadRequest>(&body) {
                Ok(request) => preload(w, volume, &request.ranges),
                Err(e) => control::PreloadReply::Failed(ErrorReply::new(format!("preload: bad request line: {e}"))),
            };
            control::write_line(w, &reply)?;
        }
        Err(e) => control::write_line(w, &ErrorReply::new(format!("bad request: {e}")))?,
    }
    Ok(())
}

/// Answers `preload`: each range read into the cache as hot data, a progress line per chunk
/// (a client that goes away stops it; what was loaded stays).
fn preload(w: &UnixStream, volume: &Volume, ranges: &[(u64, u64)]) -> control::PreloadReply {
    use control::PreloadReply;
    let size = volume.size_bytes();
    if let Some(&(o, l)) = ranges.iter().find(|&&(o, l)| o.checked_add(l).is_none_or(|e| e > size)) {
        return PreloadReply::Failed(ErrorReply::new(format!(
            "preload: the range at {o} of {l} bytes ends beyond the volume ({size} bytes)"
        )));
    }
    let Some(total) = ranges.iter().try_fold(0u64, |t, r| t.checked_add(r.1)) else {
        return PreloadReply::Failed(ErrorReply::new("preload: the ranges add up to more than 2^64 bytes".to_string()));
    };
    tracing::info!(ranges = ranges.len(), bytes = total, "preload requested through the control socket");
    let started = std::time::Instant::now();
    let (mut report, mut done) = (tiercache_engine::PreloadReport::default(), 0u64);
    for &(offset, len) in ranges {
        let mut gone = false;
        let r = volume.preload(offset, len, |d| {
            gone =
                control::write_line(w, &PreloadReply::Progress { done_bytes: done + d.min(len), total_bytes: total })
                    .is_err();
            !gone
        });
        match r {
            Ok(r) => {
                report.blocks += r.blocks;
                report.admitted_blocks += r.admitted_blocks;
                report.cached_blocks += r.cached_blocks;
                report.left_out_blocks += r.left_out_blocks;
            }
            Err(e) => return PreloadReply::Failed(ErrorReply::new(format!("preload at byte {offset}: {e}"))),
        }
        if gone {
            tracing::info!("preload stopped: its client went away");
            break;
        }
        done += len;
    }
    let seconds = started.elapsed().as_secs_f64();
    tracing::info!(bytes = done, seconds, admitted = report.admitted_blocks, "preload ended");
    PreloadReply::Finished { ok: true, report, bytes: done, seconds }
}

/// What the server knows of itself for `status` (`ServerReport`), with the counters sampled
/// every second that its rates come from.
struct ServerInfo {
    pid: u32,
    started: std::time::Instant,
    /// Where the volume is served; the FUSE file joins once mounted, after the rest started.
    endpoints: std::sync::Mutex<Vec<String>>,
    /// Records replayed when this server opened the volume (more than 0: the stop before was
    /// not clean).
    replayed_at_start: u64,
    control: PathBuf,
    nbd_clients: Arc<std::sync::atomic::AtomicUsize>,
    samples: std::sync::Mutex<std::collections::VecDeque<Sample>>,
    observed: Arc<crate::metrics::Observed>,
}

/// Counters and cumulative latency histograms at one moment.
type Sample = (std::time::Instant, Counters, [hdrhistogram::Histogram<u64>; 3]);

impl ServerInfo {
    fn sample(&self, c: Counters) {
        let latency = self.observed.recent.snapshot();
        let mut s = self.samples.lock().expect("rate samples");
        s.push_back((std::time::Instant::now(), c, latency));
        while s.len() > 61 {
            s.pop_front();
        }
    }

    /// The server's part of the status reply.
    fn report(&self, now: Counters, block_size: u32) -> ServerReport {
        let latency_now = self.observed.recent.snapshot();
        let samples = self.samples.lock().expect("rate samples");
        let at = std::time::Instant::now();
        let bs = f64::from(block_size);
        let rates = |window: u64| -> Option<Rates> {
            // The oldest sample within the window (or the oldest there is).
            let (t, then, latency_then) = samples.iter().find(|(t, _, _)| at.duration_since(*t).as_secs() <= window)?;
            let secs = at.duration_since(*t).as_secs_f64();
            if secs < 0.5 {
                return None;
            }
            let round = |x: f64| (x * 10.0).round() / 10.0;
            let per_s = |a: u64, b: u64| round(a.saturating_sub(b) as f64 / secs);
            let mib_per_s = |a: u64, b: u64| round(a.saturating_sub(b) as f64 * bs / secs / 1048576.0);
            let hits = now.read_hit_blocks.saturating_sub(then.read_hit_blocks);
            let misses = now.read_miss_blocks.saturating_sub(then.read_miss_blocks);
            let latency_us = latency_now
                .iter()
                .zip(latency_then)
                .zip(crate::metrics::RecentLatency::KINDS)
                .map(|((now, then), kind)| {
                    let mut h = now.clone();
                    // (Cumulative histograms: the window is the difference.)
                    let window = (h.subtract(then).is_ok() && !h.is_empty()).then(|| LatencyWindow {
                        count: h.len(),
                        p50: h.value_at_quantile(0.5),
                        p99: h.value_at_quantile(0.99),
                        p999: h.value_at_quantile(0.999),
                    });
                    (kind.to_string(), window)
                })
                .collect();
            Some(Rates {
                seconds: round(secs),
                read_requests_per_second: per_s(now.read_requests, then.read_requests),
                write_requests_per_second: per_s(now.write_requests, then.write_requests),
                flush_requests_per_second: per_s(now.flush_requests, then.flush_requests),
                read_mib_per_second: mib_per_s(hits + misses, 0),
                write_mib_per_second: mib_per_s(now.written_blocks, then.written_blocks),
                written_back_mib_per_second: mib_per_s(now.destaged_blocks, then.destaged_blocks),
                read_hit_ratio: (hits + misses > 0).then(|| hits as f64 / (hits + misses) as f64),
                latency_us,
            })
        };
        ServerReport {
            pid: self.pid,
            uptime_seconds: self.started.elapsed().as_secs(),
            endpoints: self.endpoints.lock().expect("endpoints").clone(),
            control_socket: self.control.display().to_string(),
            replayed_at_start: self.replayed_at_start,
            nbd_clients: self.nbd_clients.load(Ordering::Relaxed),
            rates_10s: rates(10),
            rates_1min: rates(60),
        }
    }
}

/// The share of time an online flush keeps the devices busy with write-back.
const ONLINE_FLUSH_BUSY_SHARE: f64 = 0.5;
