//! tiercache's NBD server: exports a volume to any NBD client (qemu-io, nbdcopy, nbdfuse, the
//! kernel's nbd-client) over a Unix socket or TCP.
//!
//! Fixed newstyle handshake with NBD_OPT_EXPORT_NAME, INFO, GO (export size, flags, block size
//! constraints), LIST and ABORT; TLS and structured replies are answered "unsupported".
//! Transmission: READ, WRITE (with FUA), FLUSH, TRIM, WRITE_ZEROES, DISC; several requests in
//! flight per connection (leader and followers: the connection's threads take turns reading a
//! request, and each runs the request it read, so none is handed to another thread; a READ's
//! reply is one `writev`), several connections
//! (CAN_MULTI_CONN: a FLUSH on any connection covers writes completed on all of them, because
//! they share one volume).
//!
//! Hostile input: every request is validated here (magic, command, bounds, length) and again by
//! the engine; a malformed request gets the protocol's error reply; a client that breaks
//! framing (bad magic, oversized payload) is disconnected. No request can reach outside the
//! volume, and request and reply payloads in memory are bounded by a budget shared by all
//! connections (`INFLIGHT_BUDGET_BYTES`): a client that does not read its replies is slowed
//! down, not given RAM.

#![forbid(unsafe_code)]

pub mod proto;

use proto::*;
use std::io::{self, Read, Write};
use std::net::TcpListener;
use std::os::unix::net::UnixListener;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tiercache_frontend::{ByteIo, CommitPattern, RequestKind};

/// Server settings.
#[derive(Debug, Clone)]
pub struct Config {
    /// The export's name ("" also selects it).
    pub export_name: String,
    pub description: String,
    /// Threads per connection (leader and followers): requests run in parallel per connection.
    pub workers_per_connection: usize,
    /// Most client connections at once (counted across every listener sharing `connections`).
    pub max_connections: usize,
    /// Open client connections, kept by `serve` (clones of a config share it: `status`
    /// reports it).
    pub connections: Arc<AtomicUsize>,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            export_name: "tiercache".into(),
            description: "tiercache hybrid volume".into(),
            workers_per_connection: 4,
            max_connections: 64,
            connections: Arc::new(AtomicUsize::new(0)),
        }
    }
}

/// A listening socket.
pub enum Listener {
    Unix(UnixListener),
    Tcp(TcpListener),
}

trait Stream: Read + Write + Send + 'static {
    fn try_clone_box(&self) -> io::Result<Box<dyn Stream>>;
    fn shutdown_both(&self);
    fn set_timeout(&self, t: Option<Duration>) -> io::Result<()>;
    /// Bytes the client has sent that are not read yet (0 if the socket cannot say).
    fn pending_bytes(&self) -> u64;
}

// Unix and TCP streams have the same inherent methods but no common trait for them.
macro_rules! impl_stream {
    ($t:ty) => {
        impl Stream for $t {
            fn try_clone_box(&self) -> io::Result<Box<dyn Stream>> {
                Ok(Box::new(self.try_clone()?))
            }
            fn shutdown_both(&self) {
                let _ = self.shutdown(std::net::Shutdown::Both);
            }
            fn set_timeout(&self, t: Option<Duration>) -> io::Result<()> {
                self.set_read_timeout(t)
            }
            fn pending_bytes(&self) -> u64 {
                rustix::io::ioctl_fionread(self).unwrap_or(0)
            }
        }
    };
}
impl_stream!(std::os::unix::net::UnixStream);
impl_stream!(std::net::TcpStream);

/// Bytes of request and reply payloads all connections together may hold in memory; a client
/// that sends large requests without reading replies is slowed down, not given RAM.
const INFLIGHT_BUDGET_BYTES: u64 = 256 << 20;

/// A counting budget of in-flight payload bytes, shared by all connections.
struct Budget {
    free: Mutex<u64>,
    freed: std::sync::Condvar,
}

impl Budget {
    fn take(&self, n: u64) {
        let mut free = self.free.lock().expect("budget");
        while *free < n {
            free = self.freed.wait(free).expect("budget");
        }
        *free -= n;
    }

    fn give(&self, n: u64) {
        *self.free.lock().expect("budget") += n;
        self.freed.notify_all();
    }
}

/// How long a client may take to finish the handshake.
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(30);

/// Serves `backend` (the volume, or a passthrough device: any `ByteIo`) to the clients of
/// `listener`. Accepts connections until `stop` is set, then disconnects every client and
/// returns once their in-flight requests have completed. A failed request is answered with
/// its errno, narrowed to the protocol's values (`proto::reply_error`).
pub fn serve(listener: Listener, backend: Arc<dyn ByteIo>, config: Config, stop: Arc<AtomicBool>) -> io::Result<()> {
    match &listener {
        Listener::Unix(l) => l.set_nonblocking(true)?,
        Listener::Tcp(l) => l.set_nonblocking(true)?,
    }
    let active = Arc::clone(&config.connections);
    let budget = Arc::new(Budget { free: Mutex::new(INFLIGHT_BUDGET_BYTES), freed: std::sync::Condvar::new() });
    let mut clients: Vec<(Box<dyn Stream>, std::thread::JoinHandle<()>)> = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let accepted: io::Result<Box<dyn Stream>> = match &listener {
            Listener::Unix(l) => l.accept().map(|(s, _)| Box::new(s) as Box<dyn Stream>),
            Listener::Tcp(l) => l.accept().map(|(s, _)| {
                let _ = s.set_nodelay(true);
                Box::new(s) as Box<dyn Stream>
            }),
        };
        let stream = match accepted {
            Ok(s) => s,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                std::thread::sleep(Duration::from_millis(20));
                clients.retain(|(_, h)| !h.is_finished());
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        if active.load(Ordering::Relaxed) >= config.max_connections {
            tracing::warn!(max = config.max_connections, "too many connections; refusing one");
            stream.shutdown_both();
            continue;
        }
        let handle = stream.try_clone_box()?;
        let (backend, config, active2, budget) =
            (Arc::clone(&backend), config.clone(), Arc::clone(&active), Arc::clone(&budget));
        active.fetch_add(1, Ordering::Relaxed);
        let thread = std::thread::Builder::new().name("nbd-conn".into()).spawn(move || {
            struct Uncount(Arc<AtomicUsize>);
            impl Drop for Uncount {
                fn drop(&mut self) {
                    self.0.fetch_sub(1, Ordering::Relaxed);
                }
            }
            let _uncount = Uncount(active2);
            match connection(stream, &*backend, &config, &budget) {
                // A client that broke the protocol is worth the operator's eye: its device
                // sees the connection drop.
                Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                    tracing::warn!(error = %e, "NBD client disconnected: it broke the protocol")
                }
                Err(e) => tracing::debug!(error = %e, "connection ended"),
                Ok(()) => {}
            }
        })?;
        clients.push((handle, thread));
    }
    for (s, _) in &clients {
        s.shutdown_both();
    }
    for (_, t) in clients {
        let _ = t.join();
    }
    Ok(())
}

fn read_exact_or_eof(s: &mut dyn Stream, buf: &mut [u8]) -> io::Result<bool> {
    match s.read_exact(buf) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Ok(false),
        Err(e) => Err(e),
    }
}

fn protocol_error(what: impl std::fmt::Display) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_string())
}

fn transmission_flags() -> u16 {
    TFLAG_HAS_FLAGS
        | TFLAG_SEND_FLUSH
        | TFLAG_SEND_FUA
        | TFLAG_SEND_TRIM
        | TFLAG_SEND_WRITE_ZEROES
        | TFLAG_CAN_MULTI_CONN
}

/// Runs the handshake; returns whether to go on to transmission.
fn handshake(s: &mut dyn Stream, backend: &dyn ByteIo, config: &Config) -> io::Result<bool> {
    let mut hello = Vec::with_capacity(18);
    hello.extend_from_slice(&NBDMAGIC.to_be_bytes());
    hello.extend_from_slice(&IHAVEOPT.to_be_bytes());
    hello.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    s.write_all(&hello)?;
    let mut cf = [0u8; 4];
    if !read_exact_or_eof(s, &mut cf)? {
        return Ok(false);
    }
    let client_flags = u32::from_be_bytes(cf);
    if client_flags & FLAG_C_FIXED_NEWSTYLE == 0 || client_flags & !(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES) != 0 {
        return Err(protocol_error(format!("unsupported client flags {client_flags:#x}")));
    }
    let no_zeroes = client_flags & FLAG_C_NO_ZEROES != 0;
    let known = |name: &str| name.is_empty() || name == config.export_name;
    let started = std::time::Instant::now();
    loop {
        // One deadline for the whole handshake (the socket's timeout is per read).
        if started.elapsed() > HANDSHAKE_TIMEOUT {
            return Err(protocol_error("handshake took too long"));
        }
        let mut h = [0u8; 16];
        if !read_exact_or_eof(s, &mut h)? {
            return Ok(false);
        }
        let header = decode_option_header(&h).map_err(protocol_error)?;
        let mut payload = vec![0u8; header.length as usize];
        s.read_exact(&mut payload)?;
        let reply =
            |s: &mut dyn Stream, kind: u32, data: &[u8]| s.write_all(&encode_option_reply(header.option, kind, data));
        match header.option {
            OPT_EXPORT_NAME => {
                let name = String::from_utf8_lossy(&payload);
                if !known(&name) {
                    return Err(protocol_error(format!("unknown export '{name}'")));
                }
                let mut v = Vec::with_capacity(134);
                v.extend_from_slice(&backend.size_bytes().to_be_bytes());
                v.extend_from_slice(&transmission_flags().to_be_bytes());
                if !no_zeroes {
                    v.extend_from_slice(&[0u8; 124]);
                }
                s.write_all(&v)?;
                return Ok(true);
            }
            OPT_ABORT => {
                let _ = reply(s, REP_ACK, &[]);
                return Ok(false);
            }
            OPT_LIST => {
                if !payload.is_empty() {
                    reply(s, REP_ERR_INVALID, b"NBD_OPT_LIST takes no data")?;
                    continue;
                }
                let mut d = (config.export_name.len() as u32).to_be_bytes().to_vec();
                d.extend_from_slice(config.export_name.as_bytes());
                d.extend_from_slice(config.description.as_bytes());
                reply(s, REP_SERVER, &d)?;
                reply(s, REP_ACK, &[])?;
            }
            OPT_INFO | OPT_GO => {
                let req = match decode_info_request(&payload) {
                    Ok(r) => r,
                    Err(e) => {
                        reply(s, REP_ERR_INVALID, e.to_string().as_bytes())?;
                        continue;
                    }
                };
                if !known(&req.name) {
                    reply(s, REP_ERR_UNKNOWN, format!("no export named '{}'", req.name).as_bytes())?;
                    continue;
                }
                let mut export = INFO_EXPORT.to_be_bytes().to_vec();
                export.extend_from_slice(&backend.size_bytes().to_be_bytes());
                export.extend_from_slice(&transmission_flags().to_be_bytes());
                reply(s, REP_INFO, &export)?;
                let mut block = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
                // Minimum: a sector. Any alignment works (partial blocks are read-modified-
                // written), and strict clients (libnbd, behind a 512-byte loop device) refuse
                // requests finer than the minimum. Preferred: the volume's block.
                block.extend_from_slice(&MIN_BLOCK_BYTES.to_be_bytes()); // minimum
                block.extend_from_slice(&backend.block_size().to_be_bytes()); // preferred
                block.extend_from_slice(&MAX_REQUEST_BYTES.to_be_bytes()); // maximum
                reply(s, REP_INFO, &block)?;
                if req.infos.contains(&INFO_NAME) {
                    let mut d = INFO_NAME.to_be_bytes().to_vec();
                    d.extend_from_slice(config.export_name.as_bytes());
                    reply(s, REP_INFO, &d)?;
                }
                if req.infos.contains(&INFO_DESCRIPTION) {
                    let mut d = INFO_DESCRIPTION.to_be_bytes().to_vec();
                    d.extend_from_slice(config.description.as_bytes());
                    reply(s, REP_INFO, &d)?;
                }
                reply(s, REP_ACK, &[])?;
                if header.option == OPT_GO {
                    return Ok(true);
                }
            }
            OPT_STARTTLS => reply(s, REP_ERR_POLICY, b"TLS is not supported by this server")?,
            _ => reply(s, REP_ERR_UNSUP, b"option not supported")?,
        }
    }
}

/// A validated request, with its data for WRITE, and the payload bytes of the in-flight
/// budget it holds (given back once replied).
struct Job {
    req: Request,
    data: Vec<u8>,
    budget: u64,
}

/// Whether a connection's client pipelines (sends a request before the reply to the one
/// before): its follower threads wait here until it does.
struct Pipelining {
    seen: AtomicBool,
    lock: Mutex<()>,
    cv: std::sync::Condvar,
}

impl Pipelining {
    fn seen(&self) -> bool {
        self.seen.load(Ordering::Acquire)
    }

    /// Sets it (for the connection's life) and lets the followers in.
    fn see(&self) {
        if !self.seen.swap(true, Ordering::AcqRel) {
            let _g = self.lock.lock().expect("pipelining");
            self.cv.notify_all();
        }
    }

    /// The connection is over: followers waiting to join leave.
    fn end(&self) {
        let _g = self.lock.lock().expect("pipelining");
        self.cv.notify_all();
    }

    /// Waits until the client pipelines or the connection is `done`; true if it pipelines.
    fn wait(&self, done: &AtomicBool) -> bool {
        let mut g = self.lock.lock().expect("pipelining");
        while !self.seen() && !done.load(Ordering::Acquire) {
            g = self.cv.wait(g).expect("pipelining");
        }
        self.seen() && !done.load(Ordering::Acquire)
    }
}

fn connection(mut stream: Box<dyn Stream>, backend: &dyn ByteIo, config: &Config, budget: &Budget) -> io::Result<()> {
    stream.set_timeout(Some(HANDSHAKE_TIMEOUT))?;
    if !handshake(&mut *stream, backend, config)? {
        return Ok(());
    }
    stream.set_timeout(None)?;
    let writer = Mutex::new(stream.try_clone_box()?);
    let reader = Mutex::new(stream);
    let done = AtomicBool::new(false);
    let pipelining = Pipelining { seen: AtomicBool::new(false), lock: Mutex::new(()), cv: std::sync::Condvar::new() };
    // Leader and followers: every thread of the connection takes turns reading one request
    // (the reader lock) and then runs that request itself, after letting the next thread read.
    // A request is never handed to another thread (whose wake-up costs as much as a small
    // request: a database's write and flush at queue depth 1), and requests a client
    // pipelines, however far apart they arrive, run side by side. The followers join only
    // once the client is seen pipelining (`serve_requests`); until then the leader alone
    // reads, runs and replies, as a client waiting for each reply needs nothing more.
    let threads = config.workers_per_connection.max(1);
    let commits = CommitPattern::default();
    let c = Conn {
        reader: &reader,
        writer: &writer,
        backend,
        budget,
        done: &done,
        pipelining: &pipelining,
        commits: &commits,
    };
    std::thread::scope(|scope| -> io::Result<()> {
        // However the leader leaves (its return, a failed spawn's `?`, a panic in the engine),
        // the connection is over for the followers, parked ones included.
        let end = EndOnDrop(&c);
        let followers = (1..threads)
            .map(|_| {
                std::thread::Builder::new().name("nbd-conn".into()).spawn_scoped(scope, || {
                    if c.pipelining.wait(c.done) {
                        serve_requests(&c)
                    } else {
                        Ok(())
                    }
                })
            })
            .collect::<io::Result<Vec<_>>>()?;
        let mut result = serve_requests(&c);
        // (The leader's end is the connection's: followers still waiting to join leave.)
        drop(end);
        for f in followers {
            let r = f.join().expect("an NBD connection thread panicked");
            if result.is_ok() {
                result = r;
            }
        }
        result
    })
}

struct EndOnDrop<'a, 'b>(&'a Conn<'b>);

impl Drop for EndOnDrop<'_, '_> {
    fn drop(&mut self) {
        self.0.end();
    }
}

/// What a connection's threads share.
struct Conn<'a> {
    reader: &'a Mutex<Box<dyn Stream>>,
    writer: &'a Mutex<Box<dyn Stream>>,
    backend: &'a dyn ByteIo,
    budget: &'a Budget,
    done: &'a AtomicBool,
    pipelining: &'a Pipelining,
    /// Whether the client commits one write at a time (noted while it does not pipeline).
    commits: &'a CommitPattern,
}

impl Conn<'_> {
    /// The connection is over: its threads stop after the requests they are running, and
    /// followers still waiting to join leave.
    fn end(&self) {
        self.done.store(true, Ordering::Release);
        self.pipelining.end();
    }
}

/// One thread of a connection: read a request (holding the reader lock), run it, reply;
/// until DISC, EOF or a broken connection (`done` then stops the other threads, after the
/// requests they are running).
fn serve_requests(c: &Conn<'_>) -> io::Result<()> {
    loop {
        let mut r = c.reader.lock().expect("reader");
        if c.done.load(Ordering::Acquire) {
            return Ok(());
        }
        let job = match next_request(&mut **r, c.backend, c.writer, c.budget) {
            Ok(Some(job)) => job,
            Ok(None) => {
                c.end();
                return Ok(());
            }
            Err(e) => {
                c.end();
                // Wake the other threads' replies and reads: the connection is over.
                r.shutdown_both();
                return Err(e);
            }
        };
        // A write without FUA only fills the volume's staging (microseconds): it runs before
        // the next thread is let in to read, which would cost a wake-up as long as the write.
        // Anything that may wait for a device (a READ, a FLUSH, a FUA write) lets the next
        // thread read first, so a request sent meanwhile is not held behind it, once the
        // client has shown it sends requests without waiting for replies: bytes of a next
        // request were waiting when this one was read, or arrived while it ran (then that
        // request waited, once; from then on, for the connection's life, the followers read
        // too). A client that waits for each reply (a database's commit at queue depth 1,
        // fio's jobs) never does, and there the hand-off cost two context switches a request
        // for nothing (the next thread woke to take the lock only to sleep in its read): on
        // this 2-core machine, fio's 16 jobs of 4 KiB write + FLUSH ran one job 30 % slower
        // and their FLUSH p99 at 1.9-3.0x nbdkit's with it, 1.1-2.4x without.
        let quick =
            matches!(job.req.kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES) && job.req.flags & CMD_FLAG_FUA == 0;
        if !quick && !c.pipelining.seen() && r.pending_bytes() > 0 {
            c.pipelining.see();
        }
        let mut r = if !quick && c.pipelining.seen() {
            drop(r);
            None
        } else {
            Some(r)
        };
        let held = job.budget;
        // A client that waits for each reply and commits one write at a time (write, FLUSH):
        // its write's record goes out once the write is acknowledged, while the client sends
        // its FLUSH (`ByteIo::write_ahead`). Not once it pipelines: its requests overlap
        // anyway, and group commit merges their records.
        let ahead = !c.pipelining.seen() && {
            let kind = match job.req.kind {
                CMD_WRITE if job.req.flags & CMD_FLAG_FUA == 0 => RequestKind::Write,
                CMD_FLUSH => RequestKind::Flush,
                _ => RequestKind::Other,
            };
            c.commits.note(kind)
        };
        // (Asked before the reply goes out: after it, a client at queue depth 1 may already
        // have sent its next request.)
        let result = execute(job, c.backend, c.writer, || {
            if let Some(r) = r.take() {
                if !quick && !c.pipelining.seen() && r.pending_bytes() > 0 {
                    // The client sent more while this ran with the reader lock held.
                    c.pipelining.see();
                }
            }
        });
        c.budget.give(held);
        if ahead && result.is_ok() {
            c.backend.write_ahead();
        }
        if let Err(e) = result {
            // The client went away: stop reading and discard the rest.
            c.end();
            c.writer.lock().expect("writer").shutdown_both();
            return Err(e);
        }
    }
}

/// Reads the next request to run: validated, with its WRITE payload, and its payload bytes
/// taken from the budget. A request that fails validation is answered here with its error.
/// `None` at DISC or EOF.
fn next_request(
    s: &mut dyn Stream,
    backend: &dyn ByteIo,
    writer: &Mutex<Box<dyn Stream>>,
    budget: &Budget,
) -> io::Result<Option<Job>> {
    let size = backend.size_bytes();
    loop {
        let mut h = [0u8; 28];
        if !read_exact_or_eof(s, &mut h)? {
            return Ok(None);
        }
        let req = decode_request(&h).map_err(protocol_error)?;
        let mut data = Vec::new();
        if req.kind == CMD_WRITE {
            if req.length > MAX_REQUEST_BYTES {
                // The payload cannot be skipped safely: disconnect (the spec allows it).
                return Err(protocol_error(format!("write of {} bytes exceeds the maximum", req.length)));
            }
            budget.take(u64::from(req.length));
            data = vec![0u8; req.length as usize];
            if let Err(e) = s.read_exact(&mut data) {
                budget.give(u64::from(req.length));
                return Err(e);
            }
        }
        let in_range = req.offset.checked_add(u64::from(req.length)).is_some_and(|end| end <= size);
        let error = match req.kind {
            CMD_DISC => return Ok(None),
            _ if req.flags & !(CMD_FLAG_FUA | CMD_FLAG_NO_HOLE) != 0 => Some(EINVAL),
            CMD_READ if req.length > MAX_REQUEST_BYTES => Some(EOVERFLOW),
            CMD_READ if !in_range => Some(EINVAL),
            CMD_WRITE | CMD_WRITE_ZEROES if !in_range => Some(ENOSPC),
            CMD_TRIM if !in_range => Some(EINVAL),
            CMD_READ | CMD_WRITE | CMD_FLUSH | CMD_TRIM | CMD_WRITE_ZEROES => None,
            _ => Some(EINVAL),
        };
        let held = if req.kind == CMD_WRITE { u64::from(req.length) } else { 0 };
        if let Some(e) = error {
            budget.give(held);
            let mut w = writer.lock().expect("writer");
            w.write_all(&encode_simple_reply(e, req.cookie))?;
            continue;
        }
        // A READ's reply buffer is budgeted before the read runs.
        let held = if req.kind == CMD_READ {
            budget.take(u64::from(req.length));
            u64::from(req.length)
        } else {
            held
        };
        return Ok(Some(Job { req, data, budget: held }));
    }
}

/// Runs a request and replies; `before_reply` runs between the two.
fn execute(
    job: Job,
    backend: &dyn ByteIo,
    writer: &Mutex<Box<dyn Stream>>,
    before_reply: impl FnOnce(),
) -> io::Result<()> {
    let r = job.req;
    let fua = r.flags & CMD_FLAG_FUA != 0;
    let len = u64::from(r.length);
    let (result, data) = match r.kind {
        CMD_READ => {
            let mut buf = tiercache_frontend::read_buffer(r.length as usize);
            let res = backend.read(r.offset, &mut buf);
            (res, Some(buf))
        }
        CMD_WRITE => (backend.write(r.offset, &job.data, fua), None),
        CMD_FLUSH => (backend.flush(), None),
        CMD_TRIM => (backend.trim(r.offset, len), None),
        CMD_WRITE_ZEROES => (backend.write_zeroes(r.offset, len, fua), None),
        _ => unreachable!("validated by the reader"),
    };
    before_reply();
    let mut w = writer.lock().expect("writer");
    match (result, data) {
        (Ok(()), Some(buf)) => write_all_vectored(&mut **w, &encode_simple_reply(0, r.cookie), &buf),
        (Ok(()), None) => w.write_all(&encode_simple_reply(0, r.cookie)),
        (Err(e), _) => w.write_all(&encode_simple_reply(reply_error(e.get()), r.cookie)),
    }
}

/// A reply header and its data in one system call where the socket takes them at once.
fn write_all_vectored(w: &mut dyn Stream, header: &[u8], data: &[u8]) -> io::Result<()> {
    let mut slices = [io::IoSlice::new(header), io::IoSlice::new(data)];
    let mut bufs = &mut slices[..];
    while !bufs.is_empty() {
        match w.write_vectored(bufs) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => io::IoSlice::advance_slices(&mut bufs, n),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
