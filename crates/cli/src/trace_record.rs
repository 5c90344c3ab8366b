//! `serve --record-trace FILE`: every volume request the frontends pass on, written as the
//! shared trace format (`time_ns,op,offset_bytes,length_bytes`, gzip'd CSV) for
//! `tiercache replay`. The request path only hands a 32-byte tuple to a bounded channel
//! (`try_send`: it never waits, and never wakes the writer, which polls the channel every
//! 2 ms); the writer thread formats (itoa), compresses and writes. If the writer falls
//! behind, requests are dropped from the trace and counted, never delayed.

use anyhow::{Context, Result};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{sync_channel, SyncSender};
use std::sync::RwLock;
use std::time::Instant;

/// How long the writer sleeps when the queue is empty (the queue holds 2 s of 128k requests/s).
const POLL: std::time::Duration = std::time::Duration::from_millis(2);

/// Requests queued for the writer at most (about 8 MiB of tuples).
const QUEUE: usize = 1 << 18;

/// One request: (ns since the start, write?, offset, length).
type Entry = (u64, bool, u64, u64);

/// A recording in progress.
struct Recording {
    tx: SyncSender<Entry>,
    started: Instant,
    path: PathBuf,
    writer: std::thread::JoinHandle<Result<u64>>,
}

/// Where the frontends' requests go while a trace is being recorded (nothing otherwise).
#[derive(Default)]
pub struct TraceRecorder {
    recording: RwLock<Option<Recording>>,
    dropped: AtomicU64,
}

impl TraceRecorder {
    /// Starts recording into `path` (created or truncated).
    pub fn start(&self, path: &Path) -> Result<()> {
        let file =
            std::fs::File::create(path).with_context(|| format!("creating the trace file {}", path.display()))?;
        let (tx, rx) = sync_channel::<Entry>(QUEUE);
        let shown = path.display().to_string();
        let writer = std::thread::Builder::new().name("trace-writer".into()).spawn(move || -> Result<u64> {
            let gz = flate2::write::GzEncoder::new(std::io::BufWriter::new(file), flate2::Compression::fast());
            let mut out = std::io::BufWriter::new(gz);
            writeln!(out, "time_ns,op,offset_bytes,length_bytes")?;
            let mut n = 0;
            let mut line = Vec::with_capacity(64);
            let mut num = itoa::Buffer::new();
            // Polled, never waited on: a receiver blocked on the channel would make every send
            // a wake-up (a futex call on the request path); asleep between polls, it makes none.
            'recording: loop {
                loop {
                    let (t, write, offset, len) = match rx.try_recv() {
                        Ok(e) => e,
                        Err(std::sync::mpsc::TryRecvError::Empty) => break,
                        Err(std::sync::mpsc::TryRecvError::Disconnected) => break 'recording,
                    };
                    line.clear();
                    line.extend_from_slice(num.format(t).as_bytes());
                    line.extend_from_slice(if write { b",W," } else { b",R," });
                    line.extend_from_slice(num.format(offset).as_bytes());
                    line.push(b',');
                    line.extend_from_slice(num.format(len).as_bytes());
                    line.push(b'\n');
                    out.write_all(&line)?;
                    n += 1;
                }
                std::thread::sleep(POLL);
            }
            out.into_inner().map_err(|e| e.into_error())?.finish()?.flush()?;
            Ok(n)
        })?;
        tracing::info!(path = %shown, "recording a trace of the volume's requests");
        let old = self.recording.write().expect("trace recorder").replace(Recording {
            tx,
            started: Instant::now(),
            path: path.to_path_buf(),
            writer,
        });
        if let Some(old) = old {
            Self::finish(old, 0)?;
        }
        Ok(())
    }

    /// Notes a request (a no-op unless recording; never waits).
    pub fn note(&self, write: bool, offset: u64, len: u64) {
        let guard = self.recording.read().expect("trace recorder");
        if let Some(r) = guard.as_ref() {
            let t = r.started.elapsed().as_nanos() as u64;
            if r.tx.try_send((t, write, offset, len)).is_err() {
                self.dropped.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Stops recording (if it was): the writer finishes the file. Returns the file and how
    /// many requests it holds.
    pub fn stop(&self) -> Result<Option<(PathBuf, u64)>> {
        let Some(r) = self.recording.write().expect("trace recorder").take() else { return Ok(None) };
        let path = r.path.clone();
        let dropped = self.dropped.swap(0, Ordering::Relaxed);
        let n = Self::finish(r, dropped)?;
        Ok(Some((path, n)))
    }

    fn finish(r: Recording, dropped: u64) -> Result<u64> {
        drop(r.tx);
        let n = r
            .writer
            .join()
            .map_err(|_| anyhow::anyhow!("the trace writer panicked"))?
            .with_context(|| format!("writing the trace file {}", r.path.display()))?;
        if dropped > 0 {
            tracing::warn!(dropped, path = %r.path.display(), "the trace writer fell behind: requests left out of the trace");
        }
        tracing::info!(requests = n, path = %r.path.display(), "trace recorded");
        Ok(n)
    }
}
