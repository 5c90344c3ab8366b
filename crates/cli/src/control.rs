//! The control socket of `tiercache serve`: its messages, where it lives, and the client side
//! that `status`, `check` and `flush` use. The server side (answering) is in `serve`.
//!
//! The protocol: the client sends one request line, a bare word (`status` or `flush`, at most
//! 4 KiB); the server answers with JSON lines, every one encoded by serde from the types
//! below, so that whatever a request carries (quotes, backslashes, control characters,
//! invalid UTF-8) the reply is valid JSON.
//! - `status`: one `StatusReply` line.
//! - `flush`: a `FlushReply::Progress` line per write-back batch, then `FlushReply::Finished`
//!   or `FlushReply::Failed` (see `serve` for what an online flush does).
//! - `trace-start`, then a second line with the trace file's absolute path: start recording
//!   the volume's requests there (`serve --record-trace`); one `TraceReply` or `ErrorReply`.
//! - `trace-stop`: stop recording and finish the file; one `TraceReply` or `ErrorReply`.
//! - `preload`, then a second line with a `PreloadRequest` (JSON, at most 4 MiB): read those
//!   byte ranges into the cache as hot data; a `PreloadReply::Progress` line per chunk, then
//!   `PreloadReply::Finished` or `PreloadReply::Failed`.
//! - anything else: one `ErrorReply` line naming the requests there are.

use crate::devices::DeviceSpec;
use anyhow::{bail, Context, Result};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// What a client asks on the control socket; on the wire, the variant's name in lower case.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Request {
    /// The volume's status and the server's own (`StatusReply`).
    Status,
    /// Write back everything dirty now, online (`FlushReply` lines).
    Flush,
    /// Start recording a trace into the file named on the next line (`TraceReply`).
    #[serde(rename = "trace-start")]
    TraceStart,
    /// Stop recording the trace (`TraceReply`).
    #[serde(rename = "trace-stop")]
    TraceStop,
    /// Read the byte ranges on the next line into the cache as hot data (`PreloadReply`).
    Preload,
}

impl Request {
    /// The request a line holds (white space around the word ignored). The error, serde's,
    /// names the word and the requests there are.
    pub fn parse(line: &str) -> Result<Request, String> {
        use serde::de::IntoDeserializer;
        let word: serde::de::value::StrDeserializer<'_, serde::de::value::Error> = line.trim().into_deserializer();
        Request::deserialize(word).map_err(|e| e.to_string())
    }

    /// The request's line, without the newline.
    pub fn word(self) -> &'static str {
        match self {
            Request::Status => "status",
            Request::Flush => "flush",
            Request::TraceStart => "trace-start",
            Request::TraceStop => "trace-stop",
            Request::Preload => "preload",
        }
    }
}

/// The reply to `status`: the volume's status, with the server's part under `server`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusReply {
    #[serde(flatten)]
    pub volume: tiercache_engine::Status,
    pub server: ServerReport,
}

/// What `status` shows of the server itself: who, since when, where, and the rates of the
/// last 10 s and minute (none until counters were sampled at least half a second apart).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ServerReport {
    pub pid: u32,
    pub uptime_seconds: u64,
    pub endpoints: Vec<String>,
    pub control_socket: String,
    /// Log records replayed when the server opened the volume: more than 0 when the stop
    /// before it was not clean (a crash, SIGKILL, power loss). Absent from older servers.
    #[serde(default)]
    pub replayed_at_start: u64,
    pub nbd_clients: usize,
    pub rates_10s: Option<Rates>,
    pub rates_1min: Option<Rates>,
}

/// Request rates over a window (values rounded to one decimal).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Rates {
    pub seconds: f64,
    pub read_requests_per_second: f64,
    pub write_requests_per_second: f64,
    pub flush_requests_per_second: f64,
    pub read_mib_per_second: f64,
    pub write_mib_per_second: f64,
    pub written_back_mib_per_second: f64,
    pub read_hit_ratio: Option<f64>,
    /// By request kind (read, write, flush); none for a kind without requests in the window.
    pub latency_us: BTreeMap<String, Option<LatencyWindow>>,
}

/// Latency percentiles of one request kind over a window, in microseconds.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct LatencyWindow {
    pub count: u64,
    pub p50: u64,
    pub p99: u64,
    pub p999: u64,
}

/// One line of the reply to `flush`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum FlushReply {
    /// After each batch: `{"done":N,"remaining":M}`.
    Progress { done: u64, remaining: u64 },
    /// The end: `{"ok":true,"written_back":N}` (`ok` is always true).
    Finished { ok: bool, written_back: u64 },
    /// The end, failed: `{"error":"...","lost_blocks":[...]}`.
    Failed(ErrorReply),
}

/// A failure: what went wrong, and the lost blocks when that is what it was.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ErrorReply {
    pub error: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lost_blocks: Option<Vec<u64>>,
}

impl ErrorReply {
    pub fn new(error: impl Into<String>) -> ErrorReply {
        ErrorReply { error: error.into(), lost_blocks: None }
    }
}

/// Writes one message as a JSON line.
pub fn write_line(mut w: impl Write, message: &impl Serialize) -> std::io::Result<()> {
    let mut line = serde_json::to_vec(message)?;
    line.push(b'\n');
    w.write_all(&line)
}

/// Where the control socket of the volume with this UUID lives by default.
pub fn default_path(uuid: &str) -> PathBuf {
    let dir = if is_root() { PathBuf::from("/run/tiercache") } else { std::env::temp_dir().join("tiercache") };
    dir.join(format!("{uuid}.sock"))
}

fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and touches no memory.
    unsafe { libc::geteuid() == 0 }
}

/// The control socket of the server that holds `spec` (the superblock, read without the
/// lock, names it by the volume's UUID), or `explicit`.
pub fn socket_of(spec: &DeviceSpec, explicit: Option<&Path>) -> Result<PathBuf> {
    if let Some(p) = explicit {
        return Ok(p.to_path_buf());
    }
    let dev = tiercache_device::FileDevice::open_with(
        spec.path(),
        tiercache_device::OpenOptions { direct: false, lock: false, read_only: true },
    )?;
    let sb = tiercache_engine::read_superblock(&dev)?;
    Ok(default_path(&tiercache_format::uuid_hex(&sb.uuid)))
}

/// `--cache DEVICE [--control PATH]`, flattened into every command that works on a cache a
/// server may hold (status, flush, trace, preload): the device, and the control socket of the
/// server holding it.
#[derive(Debug, clap::Args)]
pub struct CacheArgs {
    /// The cache device: PATH, or emulated:PROFILE:PATH.
    #[arg(long, value_name = "DEVICE")]
    pub cache: String,
    /// The control socket of a server started with `serve --control PATH` (the default
    /// one is found from the cache device's UUID).
    #[arg(long, value_name = "PATH")]
    pub control: Option<PathBuf>,
}

impl CacheArgs {
    pub fn spec(&self) -> Result<DeviceSpec> {
        DeviceSpec::parse(&self.cache)
    }

    /// The control socket of the server holding `spec` (this command's cache device).
    pub fn socket(&self, spec: &DeviceSpec) -> Result<PathBuf> {
        socket_of(spec, self.control.as_deref())
    }

    /// The device is in use and `socket` did not answer: which socket was tried and, if it was
    /// the default one, that a server started with `--control PATH` is asked through the same
    /// `--control PATH`.
    pub fn unanswered(&self, spec: &DeviceSpec, socket: &Path) -> String {
        let hint = if self.control.is_none() {
            " (its default control socket; a server started with --control PATH answers on that PATH: give it with --control)"
        } else {
            ""
        };
        format!("{} is in use, but no tiercache server answers on {}{hint}", spec.path().display(), socket.display())
    }
}

/// Asks a running server to write back everything dirty, calling `progress(done, remaining)`
/// for each batch it reports; returns how many blocks it wrote back.
pub fn request_flush(socket: &Path, mut progress: impl FnMut(u64, u64)) -> Result<u64> {
    let mut conn = UnixStream::connect(socket).with_context(|| format!("connecting to {}", socket.display()))?;
    writeln!(conn, "{}", Request::Flush.word())?;
    for line in BufReader::new(&conn).lines() {
        match serde_json::from_str(&line?).context("decoding the server's reply")? {
            FlushReply::Progress { done, remaining } => progress(done, remaining),
            FlushReply::Finished { written_back, .. } => return Ok(written_back),
            FlushReply::Failed(ErrorReply { error, lost_blocks: Some(blocks) }) => {
                bail!("the server's flush failed: {error}; lost blocks: {blocks:?}")
            }
            FlushReply::Failed(ErrorReply { error, lost_blocks: None }) => bail!("the server's flush failed: {error}"),
        }
    }
    bail!("the server closed the control connection before the flush ended (did it stop?)")
}

/// The reply to `trace-start` and `trace-stop`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TraceReply {
    /// Whether a trace is being recorded now.
    pub recording: bool,
    /// The trace file.
    pub path: String,
    /// After `trace-stop`: the requests the file holds.
    pub requests: Option<u64>,
}

/// Asks a running server to start recording a trace into `file` (made absolute here: the
/// server's working directory is not the caller's), or with `None` to stop.
pub fn request_trace(socket: &Path, file: Option<&Path>) -> Result<TraceReply> {
    let mut conn = UnixStream::connect(socket).with_context(|| format!("connecting to {}", socket.display()))?;
    conn.set_read_timeout(Some(Duration::from_secs(30)))?;
    match file {
        Some(f) => {
            let f = std::path::absolute(f).with_context(|| format!("{}", f.display()))?;
            let f = f.to_str().with_context(|| format!("{}: not UTF-8", f.display()))?;
            write!(conn, "{}\n{f}\n", Request::TraceStart.word())?;
        }
        None => writeln!(conn, "{}", Request::TraceStop.word())?,
    }
    let mut line = String::new();
    BufReader::new(&conn).read_line(&mut line).context("reading the server's reply")?;
    if let Ok(reply) = serde_json::from_str::<TraceReply>(&line) {
        return Ok(reply);
    }
    let e: ErrorReply = serde_json::from_str(&line).context("decoding the server's reply")?;
    bail!("{}", e.error)
}

/// The second line of a `preload` request: byte ranges of the volume, `[offset, length]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreloadRequest {
    pub ranges: Vec<(u64, u64)>,
}

/// One line of the reply to `preload`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum PreloadReply {
    /// After each chunk: `{"done_bytes":N,"total_bytes":M}`.
    Progress { done_bytes: u64, total_bytes: u64 },
    /// The end: what was loaded, how long it took.
    Finished { ok: bool, report: tiercache_engine::PreloadReport, bytes: u64, seconds: f64 },
    /// The end, failed (what was loaded before the failure stays cached).
    Failed(ErrorReply),
}

/// The longest `preload` request line the server reads (a fragmented file's extents).
pub const PRELOAD_REQUEST_MAX_BYTES: u64 = 4 << 20;

/// Asks a running server to preload `ranges`, calling `progress(done, total)` per chunk.
pub fn request_preload(
    socket: &Path,
    ranges: &[(u64, u64)],
    mut progress: impl FnMut(u64, u64),
) -> Result<(tiercache_engine::PreloadReport, u64, f64)> {
    let mut conn = UnixStream::connect(socket).with_context(|| format!("connecting to {}", socket.display()))?;
    let request = serde_json::to_string(&PreloadRequest { ranges: ranges.to_vec() })?;
    write!(conn, "{}\n{request}\n", Request::Preload.word())?;
    for line in BufReader::new(&conn).lines() {
        match serde_json::from_str(&line?).context("decoding the server's reply")? {
            PreloadReply::Progress { done_bytes, total_bytes } => progress(done_bytes, total_bytes),
            PreloadReply::Finished { report, bytes, seconds, .. } => return Ok((report, bytes, seconds)),
            PreloadReply::Failed(e) => bail!("the server's preload failed: {}", e.error),
        }
    }
    bail!("the server closed the control connection before the preload ended (did it stop?)")
}

/// Asks a running server for the volume's status (`None` if no server answers).
pub fn query_status(socket: &Path) -> Option<StatusReply> {
    let mut conn = UnixStream::connect(socket).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    writeln!(conn, "{}", Request::Status.word()).ok()?;
    let mut line = String::new();
    BufReader::new(&conn).read_line(&mut line).ok()?;
    serde_json::from_str(&line).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_parse_by_name_and_odd_ones_are_refused_by_serde() {
        for r in [Request::Status, Request::Flush, Request::TraceStart, Request::TraceStop] {
            assert_eq!(Request::parse(r.word()), Ok(r));
            assert_eq!(Request::parse(&format!("  {}\r\n", r.word())), Ok(r));
        }
        let e = Request::parse("he said \"flush\"\\").unwrap_err();
        assert!(e.contains("he said \"flush\"\\") && e.contains("`status`") && e.contains("`flush`"), "{e}");
        assert!(Request::parse("").is_err());
        assert!(Request::parse("Flush").is_err());
    }

    /// Whatever a request carried, the reply naming it is valid JSON that says it again.
    #[test]
    fn error_replies_stay_valid_json_whatever_they_quote() {
        for odd in ["\"", "a\"b\\c", "}{\"ok\":true", "tab\tnew\nline\u{0}\u{1b}[2J", "\u{fffd}\u{fffd}", "é ✓"] {
            let error = Request::parse(odd).unwrap_err();
            let mut line = Vec::new();
            write_line(&mut line, &ErrorReply::new(format!("bad request: {error}"))).unwrap();
            assert_eq!(line.iter().filter(|&&b| b == b'\n').count(), 1, "one line: {line:?}");
            let back: ErrorReply = serde_json::from_slice(&line).unwrap();
            assert_eq!(back.error, format!("bad request: {error}"));
            assert!(back.error.contains(odd.trim()), "{back:?}");
            // ... and a flush client reads it as a failure, not as progress or success.
            let as_flush: FlushReply = serde_json::from_slice(&line).unwrap();
            assert!(matches!(as_flush, FlushReply::Failed(_)), "{as_flush:?}");
        }
    }

    #[test]
    fn flush_replies_keep_their_wire_shape() {
        let cases = [
            (FlushReply::Progress { done: 4096, remaining: 10 }, r#"{"done":4096,"remaining":10}"#),
            (FlushReply::Finished { ok: true, written_back: 7 }, r#"{"ok":true,"written_back":7}"#),
            (FlushReply::Failed(ErrorReply::new("x")), r#"{"error":"x"}"#),
            (
                FlushReply::Failed(ErrorReply { error: "lost".into(), lost_blocks: Some(vec![3, 9]) }),
                r#"{"error":"lost","lost_blocks":[3,9]}"#,
            ),
        ];
        for (reply, wire) in cases {
            assert_eq!(serde_json::to_string(&reply).unwrap(), wire);
            assert_eq!(serde_json::from_str::<FlushReply>(wire).unwrap(), reply);
        }
    }
}
