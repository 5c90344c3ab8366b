//! `serve --metrics ADDR`: the volume's counters, gauges and request latency histograms in the
//! Prometheus/OpenMetrics text format at `http://ADDR/metrics`, encoded by the
//! `prometheus-client` crate and served by `tiny_http` (a scrape endpoint needs nothing more
//! than one GET). Counters and gauges are read from `Volume::status()` at each scrape (a
//! collector); latencies are observed by `Observed`, the frontends' view of the volume.

use anyhow::{Context, Result};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::Instant;
use tiercache_engine::Volume;
use tiercache_frontend::{ByteIo, Errno};

/// The request kinds a latency is recorded for.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Op {
    op: &'static str,
}

/// Request latencies, by kind: 10 µs to about 10 s.
pub type Latencies = Family<Op, Histogram>;

fn new_latencies() -> Latencies {
    Family::new_with_constructor(|| Histogram::new(exponential_buckets(10e-6, 2.0, 21)))
}

/// Cumulative latency histograms (µs) of reads, writes and flushes, which `status` turns into
/// percentiles over its windows by subtracting an older snapshot.
pub struct RecentLatency {
    kinds: [std::sync::Mutex<hdrhistogram::Histogram<u64>>; 3],
}

impl RecentLatency {
    pub const KINDS: [&'static str; 3] = ["read", "write", "flush"];

    fn new() -> RecentLatency {
        let h =
            || std::sync::Mutex::new(hdrhistogram::Histogram::new_with_bounds(1, 3_600_000_000, 2).expect("bounds"));
        RecentLatency { kinds: [h(), h(), h()] }
    }

    fn record(&self, op: &str, micros: u64) {
        if let Some(k) = Self::KINDS.iter().position(|&o| o == op) {
            self.kinds[k].lock().expect("latency histogram").saturating_record(micros.max(1));
        }
    }

    /// Copies of the three histograms now.
    pub fn snapshot(&self) -> [hdrhistogram::Histogram<u64>; 3] {
        std::array::from_fn(|k| self.kinds[k].lock().expect("latency histogram").clone())
    }
}

/// The volume as the frontends use it, timing every request: always for `status`, and into
/// Prometheus histograms with `--metrics`.
pub struct Observed {
    volume: Arc<Volume>,
    latency: Option<Latencies>,
    /// Requests that failed, by kind (with `--metrics`).
    errors: Option<Family<Op, prometheus_client::metrics::counter::Counter>>,
    pub recent: RecentLatency,
    /// `serve --record-trace`: the requests, as a trace file.
    pub trace: crate::trace_record::TraceRecorder,
}

impl Observed {
    /// Without metrics.
    pub fn new(volume: &Arc<Volume>) -> Arc<Observed> {
        Arc::new(Observed {
            volume: Arc::clone(volume),
            latency: None,
            errors: None,
            recent: RecentLatency::new(),
            trace: Default::default(),
        })
    }

    fn time<E>(&self, op: &'static str, f: impl FnOnce(&Volume) -> Result<(), E>) -> Result<(), E> {
        let t = Instant::now();
        let r = f(&self.volume);
        let elapsed = t.elapsed();
        if let Some(l) = &self.latency {
            l.get_or_create(&Op { op }).observe(elapsed.as_secs_f64());
        }
        if let (Err(_), Some(errors)) = (&r, &self.errors) {
            errors.get_or_create(&Op { op }).inc();
        }
        self.recent.record(op, elapsed.as_micros() as u64);
        r
    }
}

impl ByteIo for Observed {
    fn size_bytes(&self) -> u64 {
        self.volume.size_bytes()
    }
    fn block_size(&self) -> u32 {
        self.volume.block_size()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), Errno> {
        self.trace.note(false, offset, buf.len() as u64);
        self.time("read", |v| ByteIo::read(v, offset, buf))
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), Errno> {
        self.trace.note(true, offset, data.len() as u64);
        self.time("write", |v| ByteIo::write(v, offset, data, fua))
    }
    fn flush(&self) -> Result<(), Errno> {
        self.time("flush", ByteIo::flush)
    }
    fn write_ahead(&self) {
        ByteIo::write_ahead(&*self.volume)
    }
    fn trim(&self, offset: u64, len: u64) -> Result<(), Errno> {
        self.time("trim", |v| ByteIo::trim(v, offset, len))
    }
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), Errno> {
        self.trace.note(true, offset, len);
        self.time("write_zeroes", |v| ByteIo::write_zeroes(v, offset, len, fua))
    }
}

/// Counters and gauges read from the volume at each scrape.
#[derive(Debug)]
struct VolumeCollector {
    volume: Weak<Volume>,
    nbd_clients: Arc<AtomicUsize>,
}

impl Collector for VolumeCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(volume) = self.volume.upgrade() else { return Ok(()) };
        let s = volume.status();
        let c = s.counters;
        let bs = u64::from(s.block_size);
        let counters: [(&str, &str, u64); 34] = [
            ("read_requests", "Read requests served", c.read_requests),
            ("write_requests", "Write requests served", c.write_requests),
            (
                "flush_requests",
                "FLUSH requests served; a FUA write counts one too (it is a write and a flush: the latency histogram files it under write)",
                c.flush_requests,
            ),
            ("read_hit_blocks", "Blocks read from the cache (RAM or cache device)", c.read_hit_blocks),
            ("read_miss_blocks", "Blocks read from the backing device", c.read_miss_blocks),
            ("admitted_blocks", "Blocks read from the backing device and admitted into the cache", c.admitted_blocks),
            (
                "bypassed_blocks_size",
                "Missed blocks not admitted: their read was larger than the admission limit",
                c.bypassed_blocks_size,
            ),
            (
                "bypassed_blocks_busy",
                "Missed blocks not admitted: staging was full, the record writer behind the readers",
                c.bypassed_blocks_busy,
            ),
            (
                "bypassed_blocks_sequential",
                "Missed blocks not admitted: their read continued a long sequential stream",
                c.bypassed_blocks_sequential,
            ),
            ("evicted_blocks", "Clean blocks evicted by reclaim", c.evicted_blocks),
            ("written_back_blocks", "Dirty blocks written back to the backing device", c.destaged_blocks),
            ("copied_forward_blocks", "Dirty blocks reclaim moved to the log tail instead", c.copied_forward_blocks),
            (
                "reinserted_blocks",
                "Clean blocks read since cached that reclaim kept (moved to the log tail)",
                c.reinserted_blocks,
            ),
            (
                "written_around_blocks",
                "Blocks written straight to the backing device (write-around: while destage-bound, or large new data meeting a dirty log head)",
                c.written_around_blocks,
            ),
            (
                "written_around_at_dirty_head",
                "Large writes of uncached blocks sent around the cache below the high watermark because the log head held dirty data",
                c.written_around_at_dirty_head,
            ),
            ("concurrent_write_arounds", "Write-arounds begun while another was under way", c.concurrent_write_arounds),
            (
                "written_around_beside_write_back",
                "Write-arounds begun beside a write-back batch instead of waiting for it (blocks with no copy in the cache and not in the batch)",
                c.written_around_beside_write_back,
            ),
            ("records_written", "Log records written to the cache device", c.records_written),
            (
                "records_written_ahead",
                "Log records written right after a write was acknowledged, ahead of the FLUSH a client committing one write at a time sends next",
                c.records_written_ahead,
            ),
            (
                "overlapped_record_writes",
                "Log records whose write began while an older record's was in progress (the pipeline)",
                c.overlapped_record_writes,
            ),
            (
                "staged_during_record_writes",
                "Log records written alone while their writer staged the rest of its request",
                c.staged_during_record_writes,
            ),
            (
                "nested_record_writes",
                "Log records a lone writer wrote while its previous record's write was in flight",
                c.nested_record_writes,
            ),
            (
                "handed_off_records",
                "Log records sealed by a writer that went on at once, their write handed to the record writer thread",
                c.handed_off_records,
            ),
            (
                "handed_off_by_readers",
                "Of those, log records a reader sealed when its read misses' admissions filled staging",
                c.handed_off_by_readers,
            ),
            (
                "handed_off_records_written_by_waiters",
                "Handed-off log records written by a thread that needed them (a FLUSH, reclaim) before the record writer began them",
                c.handed_off_records_written_by_waiters,
            ),
            (
                "preclean_swept_blocks",
                "Dirty blocks the pre-cleaner left at the log head for a sequential writer about to supersede them",
                c.preclean_swept_blocks,
            ),
            (
                "preclean_idle_blocks",
                "Dirty blocks the pre-cleaner wrote back beyond its horizon, over data not rewritten for 10 s, while nothing nearer needed it",
                c.preclean_idle_blocks,
            ),
            (
                "gentle_write_back_batches",
                "Write-back batches run at the gentle pace (small log reads, few backing writes in flight) while nothing waited for them",
                c.gentle_write_back_batches,
            ),
            ("cache_flushes", "Flushes of the cache device", c.cache_flushes),
            ("backing_flushes", "Flushes of the backing device", c.backing_flushes),
            ("checkpoints", "Checkpoints written", c.checkpoints),
            ("repaired_blocks", "Cached copies found bad and replaced from the backing device", c.repaired_blocks),
            ("throttled_writes", "Writes delayed because dirty data was above the high watermark", c.throttled_writes),
            ("written_blocks", "Blocks written by clients", c.written_blocks),
        ];
        for (name, help, v) in counters {
            let m = ConstCounter::new(v);
            m.encode(encoder.encode_descriptor(&format!("tiercache_{name}"), help, None, m.metric_type())?)?;
        }
        let gauges: [(&str, &str, Option<&Unit>, i64); 6] = [
            ("cached", "Data in the cache", Some(&Unit::Bytes), (s.cached_blocks * bs) as i64),
            ("dirty", "Data in the cache not yet written back", Some(&Unit::Bytes), (s.dirty_blocks * bs) as i64),
            ("cache_capacity", "Size of the cache's log", Some(&Unit::Bytes), s.log_bytes as i64),
            ("lost_blocks", "Blocks whose only copy failed its checksum (must be 0)", None, s.lost_blocks as i64),
            ("failed", "1 if the volume failed and refuses writes", None, i64::from(s.failure.is_some())),
            ("nbd_clients", "Open NBD client connections", None, self.nbd_clients.load(Ordering::Relaxed) as i64),
        ];
        for (name, help, unit, v) in gauges {
            let m = ConstGauge::new(v);
            m.encode(encoder.encode_descriptor(&format!("tiercache_{name}"), help, unit, m.metric_type())?)?;
        }
        Ok(())
    }
}

/// Wraps `volume` for the frontends (timing requests) and starts the HTTP endpoint at `addr`;
/// serves until `stop` is set.
pub fn start(
    addr: &str,
    volume: &Arc<Volume>,
    nbd_clients: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
) -> Result<(Arc<Observed>, String)> {
    let latency = new_latencies();
    let mut registry = Registry::default();
    registry.register_with_unit(
        "tiercache_request_latency",
        "Latency of client requests through the frontends, by kind",
        Unit::Seconds,
        latency.clone(),
    );
    let errors = Family::<Op, prometheus_client::metrics::counter::Counter>::default();
    registry.register(
        "tiercache_request_errors",
        "Client requests that failed (an I/O error, a lost block, a refused write), by kind",
        errors.clone(),
    );
    registry.register_collector(Box::new(VolumeCollector { volume: Arc::downgrade(volume), nbd_clients }));
    let server = tiny_http::Server::http(addr).map_err(|e| anyhow::anyhow!("--metrics {addr}: {e}"))?;
    let bound = server.server_addr().to_ip().map_or_else(|| addr.to_string(), |a| a.to_string());
    std::thread::Builder::new()
        .name("tiercache-metrics".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                let Ok(Some(request)) = server.recv_timeout(std::time::Duration::from_millis(200)) else { continue };
                let response = if request.url() == "/metrics" {
                    let mut body = String::new();
                    match prometheus_client::encoding::text::encode(&mut body, &registry) {
                        Ok(()) => tiny_http::Response::from_string(body).with_header(
                            "Content-Type: application/openmetrics-text; version=1.0.0; charset=utf-8"
                                .parse::<tiny_http::Header>()
                                .expect("a valid header"),
                        ),
                        Err(_) => tiny_http::Response::from_string("encoding failed").with_status_code(500),
                    }
                } else {
                    tiny_http::Response::from_string("tiercache: metrics are at /metrics\n").with_status_code(404)
                };
                let _ = request.respond(response);
            }
        })
        .context("starting the metrics thread")?;
    let observed = Observed {
        volume: Arc::clone(volume),
        latency: Some(latency),
        errors: Some(errors),
        recent: RecentLatency::new(),
        trace: Default::default(),
    };
    Ok((Arc::new(observed), bound))
}
