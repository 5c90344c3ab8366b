//! `tiercache replay`: a block trace driven through the real engine, on devices in RAM and a
//! virtual clock, once per cache size, reporting what the cache did with it (miss ratio, SSD
//! bytes written per block accessed, backing I/Os, time per request).
//!
//! The trace format is the shared one (`time_ns,op,offset_bytes,length_bytes`, gzip'd or
//! plain CSV, a header line). Sizes in percent are of the trace's footprint (distinct 4 KiB
//! blocks), and a request touching n blocks is n block accesses, so the numbers compare
//! directly with libCacheSim's (`--anchors` prints them beside).
//!
//! The cache device is a buffer in RAM (the engine checks every block it reads back), the
//! backing device a bit bucket of the trace's extent (reads return zeroes, writes are counted
//! and dropped): a trace of a 2 TB volume replays in the RAM of its cache size only.

use anyhow::{bail, Context, Result};
use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use tiercache_device::{check_request, BlockDevice, SimClock};
use tiercache_engine::{create, CreateOptions, Volume, VolumeOptions};
use tiercache_format::constants::MAX_PROBATION_PERMILLE;
use tiercache_format::Layout;

const BS: u64 = 4096;

#[derive(Debug, clap::Args)]
#[command(after_help = "\
Examples:
  tiercache replay --trace ../shared/traces/arc_P3.csv.gz
  tiercache replay --trace arc_P3.csv.gz --cache-size 1%,5%,10%,25% --anchors missratio-anchors.tsv
  tiercache replay --trace mydb.csv.gz --cache-size 256M,1G --json
  tiercache replay --trace mydb.csv.gz --cache-size 1G --probation-percent 5

The trace: `time_ns,op,offset_bytes,length_bytes` per line (op R or W), gzip'd or plain, with a
header line. Each size runs the engine on a fresh cache in RAM; a percent size is a share of
the trace's footprint (its distinct 4 KiB blocks). The miss ratio counts read block accesses
(a request touching n blocks is n accesses) that the cache did not serve.")]
pub struct ReplayArgs {
    /// The trace file (gzip'd or plain CSV).
    #[arg(long)]
    trace: PathBuf,
    /// Cache sizes, comma-separated: percent of the footprint (5%) or bytes (256M, 1G).
    #[arg(long, value_delimiter = ',', default_value = "1%,5%,10%,25%")]
    cache_size: Vec<String>,
    /// Replay only the first N requests.
    #[arg(long)]
    max_requests: Option<usize>,
    /// libCacheSim's reference miss ratios (the shared `missratio-anchors.tsv`): prints LRU,
    /// FIFO and the best published policy beside each size of this trace.
    #[arg(long)]
    anchors: Option<PathBuf>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
    /// Draw the miss-ratio curve (miss ratio by cache size, with the anchors' LRU, FIFO and
    /// best policy where `--anchors` lists them) into this SVG file.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// The eviction policy to replay with: adaptive (the default), s3fifo, reinsert or fifo
    /// (the policies before, to measure against; `serve --eviction` explains each).
    #[arg(long, default_value = "adaptive")]
    eviction: tiercache_engine::Eviction,
    /// Admit sequential read streams past this size too (0: admit every stream; the default
    /// is the server's, 2M).
    #[arg(long, value_name = "SIZE", value_parser = crate::devices::parse_size)]
    sequential_bypass: Option<u64>,
    /// The share of each cache given to the probation ring, as `create --probation-percent`
    /// gives it (default 10; 0: none): to see what another ring would do for this trace
    /// before formatting a cache with it.
    #[arg(long, value_name = "PERCENT", value_parser = crate::devices::parse_percent)]
    probation_percent: Option<u16>,
}

/// One request of a trace.
#[derive(Debug, Clone, Copy)]
struct Request {
    write: bool,
    offset: u64,
    len: u64,
}

/// Reads a trace (gzip'd or plain): its requests, each checked, with the line of any bad one.
fn read_trace(path: &Path) -> Result<Vec<Request>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening the trace {}", path.display()))?;
    let mut head = BufReader::new(file);
    let gz = head.fill_buf()?.starts_with(&[0x1f, 0x8b]);
    let reader: Box<dyn Read> = if gz { Box::new(flate2::read::MultiGzDecoder::new(head)) } else { Box::new(head) };
    let mut requests = Vec::new();
    for (i, line) in BufReader::new(reader).lines().enumerate() {
        let line = line.with_context(|| format!("{}: reading line {}", path.display(), i + 1))?;
        let line = line.trim();
        if line.is_empty() || (i == 0 && line.starts_with("time")) {
            continue;
        }
        let bad = |why: &str| anyhow::anyhow!("{}:{}: {why}: {line:?}", path.display(), i + 1);
        let f: Vec<&str> = line.split(',').collect();
        if f.len() != 4 {
            return Err(bad("expected time_ns,op,offset_bytes,length_bytes"));
        }
        let write = match f[1] {
            "R" | "r" => false,
            "W" | "w" => true,
            _ => return Err(bad("op is neither R nor W")),
        };
        let offset: u64 = f[2].parse().map_err(|_| bad("offset_bytes is not a number"))?;
        let len: u64 = f[3].parse().map_err(|_| bad("length_bytes is not a number"))?;
        if len == 0 {
            continue;
        }
        requests.push(Request { write, offset, len });
    }
    if requests.is_empty() {
        bail!("{}: no requests in the trace", path.display());
    }
    Ok(requests)
}

/// The 4 KiB blocks a request touches.
fn blocks_of(r: &Request) -> std::ops::Range<u64> {
    r.offset / BS..(r.offset + r.len).div_ceil(BS)
}

/// The cache device: a buffer in RAM, counting what is written to it.
struct MemDevice {
    data: Mutex<Vec<u8>>,
    bytes_written: AtomicU64,
}

impl BlockDevice for MemDevice {
    fn size_bytes(&self) -> u64 {
        self.data.lock().expect("mem device").len() as u64
    }
    fn logical_block_size(&self) -> u32 {
        BS as u32
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> tiercache_device::Result<()> {
        check_request(self, offset, buf.len() as u64)?;
        let d = self.data.lock().expect("mem device");
        buf.copy_from_slice(&d[offset as usize..offset as usize + buf.len()]);
        Ok(())
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> tiercache_device::Result<()> {
        check_request(self, offset, buf.len() as u64)?;
        self.data.lock().expect("mem device")[offset as usize..offset as usize + buf.len()].copy_from_slice(buf);
        self.bytes_written.fetch_add(buf.len() as u64, Ordering::Relaxed);
        Ok(())
    }
    fn flush(&self) -> tiercache_device::Result<()> {
        Ok(())
    }
    fn discard(&self, _offset: u64, _len: u64) -> tiercache_device::Result<()> {
        Ok(())
    }
    fn describe(&self) -> String {
        "replay cache (RAM)".into()
    }
}

/// The backing device: reads return zeroes, writes are counted and dropped. It never tears
/// a block, like a device that reports 4 KiB atomic writes.
struct NullDevice {
    size: u64,
    reads: AtomicU64,
    writes: AtomicU64,
}

impl BlockDevice for NullDevice {
    fn size_bytes(&self) -> u64 {
        self.size
    }
    fn logical_block_size(&self) -> u32 {
        BS as u32
    }
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> tiercache_device::Result<()> {
        check_request(self, offset, buf.len() as u64)?;
        buf.fill(0);
        self.reads.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn write_at(&self, offset: u64, buf: &[u8]) -> tiercache_device::Result<()> {
        check_request(self, offset, buf.len() as u64)?;
        self.writes.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
    fn flush(&self) -> tiercache_device::Result<()> {
        Ok(())
    }
    fn discard(&self, _offset: u64, _len: u64) -> tiercache_device::Result<()> {
        Ok(())
    }
    fn describe(&self) -> String {
        "replay backing (bit bucket)".into()
    }
    fn atomic_write_bytes(&self) -> u32 {
        BS as u32
    }
}

/// What one size's replay measured.
#[derive(Debug, serde::Serialize)]
struct SizeResult {
    /// As given (`5%`, `256M`).
    size: String,
    /// The cache's log, in 4 KiB blocks (what the engine can hold, metadata aside).
    cache_blocks: u64,
    /// Of `cache_blocks`, the probation ring's.
    probation_blocks: u64,
    read_block_accesses: u64,
    read_hit_blocks: u64,
    read_miss_ratio: f64,
    write_block_accesses: u64,
    /// Bytes written to the cache device (records: admissions, writes, copy-forward,
    /// metadata; checkpoints) per block accessed.
    ssd_bytes_written_per_block_access: f64,
    backing_reads: u64,
    backing_writes: u64,
    /// Missed blocks the cache admitted, and the ones it left out (long sequential streams,
    /// reads over the admission limit).
    admitted_blocks: u64,
    bypassed_blocks: u64,
    /// Clean blocks reclaim kept (copied forward, read again since cached), and evicted.
    reinserted_blocks: u64,
    evicted_blocks: u64,
    /// Of the admitted, those that entered the probation ring; of those, the ones read again
    /// there and moved into the log, and the ones the ring dropped unread.
    probation_admitted_blocks: u64,
    promoted_blocks: u64,
    probation_evicted_blocks: u64,
    /// The adaptive policy (`serve --eviction`): misses admitted into the log while it first
    /// filled, ghosts the frequency gate sent to the ring, how often the duel changed its
    /// choice, and the share of the replay (sampled 1,000 times) with the gate on.
    filling_admitted_blocks: u64,
    gate_refused_blocks: u64,
    policy_switches: u64,
    gate_on_share: f64,
    /// Ordinary records written (each costs a header block of the log besides its data;
    /// reclaim's records, one per reclaim, are not counted here).
    records_written: u64,
    /// Blocks cached, on average over the replay's second half (about 500 samples): what the
    /// log's headers, reserve and reclaim windows leave for data (the probation ring's
    /// copies included).
    mean_cached_blocks: u64,
    microseconds_per_request: f64,
    /// libCacheSim's miss ratios for this trace and size (from `--anchors`), if listed.
    #[serde(skip_serializing_if = "Option::is_none")]
    anchors: Option<Anchors>,
}

#[derive(Debug, Clone, serde::Serialize)]
struct Anchors {
    lru: Option<f64>,
    fifo: Option<f64>,
    best: Option<(String, f64)>,
}

#[derive(Debug, serde::Serialize)]
struct ReplayReport {
    trace: String,
    requests: usize,
    footprint_blocks: u64,
    eviction: tiercache_engine::Eviction,
    sequential_bypass_bytes: u64,
    sizes: Vec<SizeResult>,
}

/// The segment size for a log of about `blocks` blocks: the largest power of two at most a
/// 64th of it, 4 to 256 blocks (so rounding the log down to a segment loses under 2 %).
fn segment_blocks_for(blocks: u64) -> u32 {
    let s = (blocks / 64).clamp(4, 256);
    1 << (63 - s.leading_zeros())
}

/// A cache of about `blocks` log blocks, in segments of `segment_blocks_for(blocks)`.
fn cache_device(blocks: u64) -> Result<Arc<MemDevice>> {
    let seg = segment_blocks_for(blocks);
    let log = blocks.max(8 * u64::from(seg)) / u64::from(seg) * u64::from(seg);
    // The superblock copies, two checkpoint areas and the log: grown until the layout gives
    // the log all of `log` (Layout::compute's estimate of the metadata may take a segment).
    let mut total = 8 + 2 * Layout::checkpoint_blocks_for(log, BS as u32) + log;
    while Layout::compute(total * BS, BS as u32, seg).map_or(0, |l| l.log_blocks) < log {
        total += u64::from(seg);
    }
    Ok(Arc::new(MemDevice { data: Mutex::new(vec![0u8; (total * BS) as usize]), bytes_written: AtomicU64::new(0) }))
}

fn replay_one(
    requests: &[Request],
    extent: u64,
    size: &str,
    blocks: u64,
    options: VolumeOptions,
    probation_permille: Option<u16>,
) -> Result<SizeResult> {
    let cache = cache_device(blocks)?;
    let backing = Arc::new(NullDevice { size: extent, reads: AtomicU64::new(0), writes: AtomicU64::new(0) });
    let mut format = CreateOptions { segment_blocks: segment_blocks_for(blocks), ..CreateOptions::default() };
    format.probation_permille = probation_permille.unwrap_or(format.probation_permille);
    create(&*cache, &*backing, &format).with_context(|| format!("formatting a {blocks}-block cache"))?;
    let clock = SimClock::new();
    let c: Arc<dyn BlockDevice> = cache.clone();
    let b: Arc<dyn BlockDevice> = backing.clone();
    let (volume, _) = Volume::open(c, b, Arc::new(clock.clone()), options)?;
    let probation_blocks = volume.superblock().layout.probation_blocks;
    let cache_blocks = volume.superblock().layout.log_blocks + probation_blocks;
    let written_at_open = cache.bytes_written.load(Ordering::Relaxed);
    let (reads0, writes0) = (backing.reads.load(Ordering::Relaxed), backing.writes.load(Ordering::Relaxed));
    let mut buf = tiercache_device::AlignedBuf::new(BS as usize);
    let mut write_blocks = 0u64;
    let (mut cached_sum, mut samples) = (0u64, 0u64);
    let (mut gate_on, mut gate_samples) = (0u64, 0u64);
    let sample_every = (requests.len() / 1000).max(1);
    let started = std::time::Instant::now();
    for (i, r) in requests.iter().enumerate() {
        let blocks = blocks_of(r);
        let len = ((blocks.end - blocks.start) * BS) as usize;
        if buf.len() < len {
            buf = tiercache_device::AlignedBuf::new(len);
        }
        let offset = blocks.start * BS;
        if r.write {
            volume.write(offset, &buf[..len])?;
            write_blocks += blocks.end - blocks.start;
        } else {
            volume.read(offset, &mut buf[..len])?;
        }
        // Virtual time: a millisecond per 100 requests, a background round every 500.
        clock.advance_ns(10_000);
        if i % 500 == 499 {
            volume.background_tick()?;
        }
        if i % sample_every == sample_every - 1 {
            let st = volume.status();
            gate_on += u64::from(st.frequency_gate == Some(true));
            gate_samples += 1;
            if i >= requests.len() / 2 {
                cached_sum += st.cached_blocks + st.probation_blocks;
                samples += 1;
            }
        }
    }
    let elapsed = started.elapsed();
    let status = volume.status();
    let c = status.counters;
    let reads = c.read_hit_blocks + c.read_miss_blocks;
    let accesses = (reads + write_blocks).max(1);
    Ok(SizeResult {
        size: size.to_string(),
        cache_blocks,
        probation_blocks,
        read_block_accesses: reads,
        read_hit_blocks: c.read_hit_blocks,
        read_miss_ratio: if reads == 0 { 0.0 } else { c.read_miss_blocks as f64 / reads as f64 },
        write_block_accesses: write_blocks,
        ssd_bytes_written_per_block_access: (cache.bytes_written.load(Ordering::Relaxed) - written_at_open) as f64
            / accesses as f64,
        backing_reads: backing.reads.load(Ordering::Relaxed) - reads0,
        backing_writes: backing.writes.load(Ordering::Relaxed) - writes0,
        admitted_blocks: c.admitted_blocks,
        bypassed_blocks: c.bypassed_blocks_sequential + c.bypassed_blocks_size + c.bypassed_blocks_busy,
        reinserted_blocks: c.reinserted_blocks,
        evicted_blocks: c.evicted_blocks,
        probation_admitted_blocks: c.probation_admitted_blocks,
        promoted_blocks: c.promoted_blocks,
        probation_evicted_blocks: c.probation_evicted_blocks,
        filling_admitted_blocks: c.filling_admitted_blocks,
        gate_refused_blocks: c.gate_refused_blocks,
        policy_switches: status.policy_switches,
        gate_on_share: gate_on as f64 / gate_samples.max(1) as f64,
        records_written: c.records_written,
        mean_cached_blocks: cached_sum / samples.max(1),
        microseconds_per_request: elapsed.as_secs_f64() * 1e6 / requests.len() as f64,
        anchors: None,
    })
}

/// The anchors of `trace` at `cache_blocks` (the tsv's columns: trace, footprint_blocks,
/// algorithm, cache_blocks, block_accesses, miss_ratio).
fn anchors_for(tsv: &str, trace: &str, cache_blocks: u64) -> Option<Anchors> {
    let rows: Vec<(String, f64)> = tsv
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split('\t').collect();
            (f.len() == 6 && f[0] == trace && f[3].parse::<u64>().ok() == Some(cache_blocks))
                .then(|| Some((f[2].to_string(), f[5].parse::<f64>().ok()?)))
                .flatten()
        })
        .collect();
    if rows.is_empty() {
        return None;
    }
    let get = |name: &str| rows.iter().find(|(a, _)| a == name).map(|(_, m)| *m);
    let best = rows.iter().filter(|(a, _)| a != "Belady").min_by(|a, b| a.1.total_cmp(&b.1)).cloned();
    Some(Anchors { lru: get("LRU"), fifo: get("FIFO"), best })
}

pub fn replay_cmd(args: ReplayArgs) -> Result<()> {
    let mut requests = read_trace(&args.trace)?;
    if let Some(n) = args.max_requests {
        requests.truncate(n);
    }
    let footprint: HashSet<u64> = requests.iter().flat_map(blocks_of).collect();
    let footprint_blocks = footprint.len() as u64;
    drop(footprint);
    let extent = requests.iter().map(|r| blocks_of(r).end).max().unwrap_or(1) * BS;
    let trace_name = args
        .trace
        .file_name()
        .and_then(|n| n.to_str())
        .map(|n| n.trim_end_matches(".gz").trim_end_matches(".csv").to_string())
        .unwrap_or_default();
    let anchors_tsv = match &args.anchors {
        Some(p) => Some(std::fs::read_to_string(p).with_context(|| format!("reading {}", p.display()))?),
        None => None,
    };
    if !args.json {
        println!(
            "{}: {} requests, footprint {} blocks of 4 KiB ({})",
            args.trace.display(),
            requests.len(),
            footprint_blocks,
            indicatif::HumanBytes(footprint_blocks * BS)
        );
    }
    let options = VolumeOptions {
        eviction: args.eviction,
        sequential_bypass_bytes: args.sequential_bypass.unwrap_or(tiercache_engine::constants::SEQUENTIAL_BYPASS_BYTES),
        ..VolumeOptions::default()
    };
    if let Some(p) = args.probation_percent.filter(|&p| p > MAX_PROBATION_PERMILLE) {
        bail!(
            "--probation-percent {}: the ring takes at most {} % of the cache",
            f64::from(p) / 10.0,
            f64::from(MAX_PROBATION_PERMILLE) / 10.0
        );
    }
    let mut sizes = Vec::new();
    for s in &args.cache_size {
        let blocks = match s.strip_suffix('%') {
            Some(p) => {
                let pct: f64 = p.parse().with_context(|| format!("--cache-size {s}: not a percentage"))?;
                if !(pct > 0.0 && pct.is_finite()) {
                    bail!("--cache-size {s}: a positive percentage of the footprint");
                }
                ((footprint_blocks as f64 * pct / 100.0).round() as u64).max(1)
            }
            None => crate::devices::parse_size(s).map_err(|e| anyhow::anyhow!("--cache-size {s}: {e}"))? / BS,
        };
        let mut r = replay_one(&requests, extent, s, blocks, options, args.probation_percent)?;
        // (The anchors are listed at the footprint's exact percentages.)
        r.anchors = anchors_tsv.as_deref().and_then(|t| anchors_for(t, &trace_name, blocks));
        if !args.json {
            let a = r.anchors.as_ref().map_or(String::new(), |a| {
                let f = |x: Option<f64>| x.map_or("-".to_string(), |v| format!("{v:.4}"));
                format!(
                    "   LRU {} FIFO {} best {}",
                    f(a.lru),
                    f(a.fifo),
                    a.best.as_ref().map_or("-".into(), |(n, m)| format!("{m:.4} {n}"))
                )
            });
            println!(
                "{:>6} ({:>7} blocks): miss ratio {:.4}, SSD bytes written per access {:>6.0}, backing reads {}, {:.1} us/request{a}",
                r.size,
                r.cache_blocks,
                r.read_miss_ratio,
                r.ssd_bytes_written_per_block_access,
                r.backing_reads,
                r.microseconds_per_request
            );
        }
        sizes.push(r);
    }
    if let Some(path) = &args.plot {
        plot_mrc(path, &trace_name, footprint_blocks, &sizes)?;
        if !args.json {
            println!("miss-ratio curve: {}", path.display());
        }
    }
    if args.json {
        let report = ReplayReport {
            trace: args.trace.display().to_string(),
            requests: requests.len(),
            footprint_blocks,
            eviction: options.eviction,
            sequential_bypass_bytes: options.sequential_bypass_bytes,
            sizes,
        };
        println!("{}", serde_json::to_string_pretty(&report)?);
    }
    Ok(())
}

/// The miss-ratio curve as an SVG: x the cache size in percent of the footprint, y the read
/// miss ratio; tiercache's points, and the anchors' LRU, FIFO and best published policy.
fn plot_mrc(path: &Path, trace: &str, footprint: u64, sizes: &[SizeResult]) -> Result<()> {
    use plotters::prelude::*;
    let pct = |blocks: u64| 100.0 * blocks as f64 / footprint.max(1) as f64;
    let x_max = sizes.iter().map(|s| pct(s.cache_blocks)).fold(1.0f64, f64::max) * 1.1;
    let root = SVGBackend::new(path, (800, 500)).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("miss-ratio curve: {trace} (replayed through the engine)"), ("sans-serif", 20))
        .margin(15)
        .x_label_area_size(45)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..x_max, 0.0..1.0)?;
    chart
        .configure_mesh()
        .x_desc("cache size (% of the footprint, 4 KiB blocks)")
        .y_desc("read miss ratio (block accesses)")
        .draw()?;
    let of = |f: &dyn Fn(&Anchors) -> Option<f64>| -> Vec<(f64, f64)> {
        sizes.iter().filter_map(|s| Some((pct(s.cache_blocks), f(s.anchors.as_ref()?)?))).collect()
    };
    let lines = [
        ("tiercache", RGBColor(200, 30, 30), sizes.iter().map(|s| (pct(s.cache_blocks), s.read_miss_ratio)).collect()),
        ("LRU (libCacheSim)", RGBColor(40, 90, 200), of(&|a| a.lru)),
        ("FIFO (libCacheSim)", RGBColor(120, 120, 120), of(&|a| a.fifo)),
        ("best published (libCacheSim)", RGBColor(30, 150, 60), of(&|a| a.best.as_ref().map(|b| b.1))),
    ];
    for (name, color, points) in lines {
        if points.is_empty() {
            continue;
        }
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2)));
        chart.draw_series(points.into_iter().map(|p| Circle::new(p, 3, color.filled())))?;
    }
    chart.configure_series_labels().background_style(WHITE.mix(0.8)).border_style(BLACK).draw()?;
    root.present().with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn trace_file(dir: &Path, lines: &str, gz: bool) -> PathBuf {
        let p = dir.join(if gz { "t.csv.gz" } else { "t.csv" });
        let body = format!("time_ns,op,offset_bytes,length_bytes\n{lines}");
        if gz {
            use std::io::Write;
            let mut e = flate2::write::GzEncoder::new(std::fs::File::create(&p).unwrap(), flate2::Compression::fast());
            e.write_all(body.as_bytes()).unwrap();
            e.finish().unwrap();
        } else {
            std::fs::write(&p, body).unwrap();
        }
        p
    }

    #[test]
    fn traces_read_gzipped_or_plain_and_bad_lines_are_named() {
        let dir = tempfile::tempdir().unwrap();
        for gz in [false, true] {
            let p = trace_file(dir.path(), "0,R,4096,8192\n1,W,0,512\n", gz);
            let r = read_trace(&p).unwrap();
            assert_eq!(r.len(), 2);
            assert_eq!((r[0].write, blocks_of(&r[0])), (false, 1..3));
            assert_eq!((r[1].write, blocks_of(&r[1])), (true, 0..1));
        }
        let p = trace_file(dir.path(), "0,R,4096,8192\n1,X,0,512\n", false);
        let e = read_trace(&p).unwrap_err().to_string();
        assert!(e.contains(":3: op is neither R nor W"), "{e}");
        let p = trace_file(dir.path(), "0,R,4096\n", false);
        assert!(read_trace(&p).unwrap_err().to_string().contains("expected time_ns,op"));
    }

    #[test]
    fn a_loop_that_fits_hits_and_one_that_does_not_misses() {
        // 200 distinct blocks read 20 times over in order: in a cache of 400 blocks only the
        // first two passes miss (the first enters the probation ring, 40 blocks: too small to
        // keep the loop, so the second enters the log from the ghost queue); in one of 50
        // (FIFO over a loop larger than the cache) every access misses.
        let requests: Vec<Request> =
            (0..20).flat_map(|_| (0..200u64).map(|b| Request { write: false, offset: b * BS, len: BS })).collect();
        let big = replay_one(&requests, 1 << 20, "big", 400, VolumeOptions::default(), None).unwrap();
        assert_eq!(big.read_block_accesses, 4000);
        assert!(big.read_miss_ratio <= 0.1, "{big:?}");
        let small = replay_one(&requests, 1 << 20, "small", 50, VolumeOptions::default(), None).unwrap();
        assert!(small.read_miss_ratio > 0.9, "{small:?}");
    }

    #[test]
    fn anchors_are_found_by_trace_and_size() {
        let tsv = "trace\tfootprint_blocks\talgorithm\tcache_blocks\tblock_accesses\tmiss_ratio\n\
                   t\t100\tLRU\t10\t1000\t0.5\nt\t100\tFIFO\t10\t1000\t0.6\nt\t100\tS3-FIFO\t10\t1000\t0.4\n\
                   t\t100\tBelady\t10\t1000\t0.2\nu\t100\tLRU\t10\t1000\t0.1\n";
        let a = anchors_for(tsv, "t", 10).unwrap();
        assert_eq!((a.lru, a.fifo, a.best), (Some(0.5), Some(0.6), Some(("S3-FIFO".to_string(), 0.4))));
        assert!(anchors_for(tsv, "t", 11).is_none());
    }
}
