//! `tiercache bench randwrite`: write-back throughput. Random 4 KiB writes over a span with a
//! flush every N writes, on the raw cache device and on the hybrid volume, side by side.
//! The hybrid turns each batch of random writes into one sequential log record.

use super::fsync::{preconditioned_temp_file, temp_file};
use crate::report::{latency_histogram, quantile_us, round1, thousands, Table};
use anyhow::{Context, Result};
use clap::Args;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiercache_device::{AlignedBuf, BlockDevice, EmulatedDevice, FileDevice, MonotonicClock, Profile};
use tiercache_engine::{create, Background, CreateOptions, Volume, VolumeOptions};

#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  tiercache bench randwrite                                emulated optane cache over emulated usb-disk
  tiercache bench randwrite --flush-every 1 --json         fsync after every write
  tiercache bench randwrite --cache /mnt/fast/c.img --backing /mnt/slow/b.img   real files (overwritten)

Files holding anything (a file system, a partition table, a tiercache cache) need --destructive;
a tiercache cache holding dirty data is never overwritten.")]
pub struct RandwriteArgs {
    /// Seconds per target.
    #[arg(long, default_value_t = 5.0)]
    seconds: f64,
    /// Flush after this many writes.
    #[arg(long, default_value_t = 32)]
    flush_every: u64,
    /// Bytes of the volume the random writes fall into.
    #[arg(long, default_value = "64M", value_parser = crate::devices::parse_size)]
    span: u64,
    /// Profile of the emulated cache device.
    #[arg(long, default_value = "optane")]
    cache_profile: String,
    /// Profile of the emulated backing device.
    #[arg(long, default_value = "usb-disk")]
    backing_profile: String,
    /// Real cache file instead of an emulated one (formatted; needs --backing).
    #[arg(long, requires = "backing")]
    cache: Option<PathBuf>,
    /// Real backing file (its first --span bytes are overwritten by write-back).
    #[arg(long, requires = "cache")]
    backing: Option<PathBuf>,
    /// Allow --cache and --backing to be overwritten when they hold something (a file
    /// system, a partition table, a tiercache cache without dirty data) or are block devices.
    #[arg(long)]
    destructive: bool,
    /// Print the result as JSON (for scripts) instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct RandwriteResult {
    target: String,
    writes_per_second: f64,
    mib_per_second: f64,
    write_latency_us_p50: f64,
    write_latency_us_p99: f64,
    write_latency_us_p999: f64,
    write_latency_us_max: f64,
    flush_latency_us_p50: f64,
    flush_latency_us_p99: f64,
    flush_latency_us_max: f64,
    flushes: u64,
    writes: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    ratio_to_raw_cache: Option<f64>,
}

/// Hybrid cache size: room for the span many times over, so the destager is not what is measured.
const HYBRID_CACHE_BYTES: u64 = 512 << 20;

pub fn run(args: RandwriteArgs) -> Result<()> {
    let duration = Duration::from_secs_f64(args.seconds);
    let bs = 4096u64;
    let span_blocks = (args.span / bs).max(1);
    let mut results = Vec::new();
    let mut keep = Vec::new();
    let (raw_name, raw, cache_dev, backing_dev): (String, Dev, Dev, Dev) = match (&args.cache, &args.backing) {
        (Some(c), Some(b)) => {
            // What the files hold, before anything is written.
            for (path, effect) in
                [(c, "the benchmark formats it as a cache"), (b, "the benchmark overwrites its first blocks")]
            {
                let probe: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(path)?);
                crate::safety::check_benchmark_target(probe, path, effect, args.destructive)?;
            }
            let raw: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(c)?);
            (c.display().to_string(), raw, Arc::new(FileDevice::open(c)?), Arc::new(FileDevice::open(b)?))
        }
        _ => {
            let cp = Profile::by_name(&args.cache_profile)?;
            let bp = Profile::by_name(&args.backing_profile)?;
            let raw_file = preconditioned_temp_file(args.span.max(bs))?;
            let cache_file = preconditioned_temp_file(HYBRID_CACHE_BYTES)?;
            let backing_file = temp_file(args.span.max(bs) * 4)?;
            let raw: Arc<dyn BlockDevice> = Arc::new(EmulatedDevice::open(raw_file.path(), cp)?);
            let c: Arc<dyn BlockDevice> = Arc::new(EmulatedDevice::open(cache_file.path(), cp)?);
            let b: Arc<dyn BlockDevice> = Arc::new(EmulatedDevice::open(backing_file.path(), bp)?);
            keep.extend([raw_file, cache_file, backing_file]);
            (format!("emulated:{}", cp.name), raw, c, b)
        }
    };
    // The raw device is measured first, then dropped (a real file is locked while open).
    let raw_result = measure(
        &raw_name,
        span_blocks.min(raw.size_bytes() / bs),
        args.flush_every,
        duration,
        args.json,
        &|o, b| Ok(raw.write_at(o, b)?),
        &|| Ok(raw.flush()?),
    )?;
    drop(raw);
    results.push(raw_result);
    create(&*cache_dev, &*backing_dev, &CreateOptions::default()).context("formatting the hybrid volume")?;
    let name = format!("hybrid ({} over {})", cache_dev.describe(), backing_dev.describe());
    let (volume, _) = Volume::open(cache_dev, backing_dev, Arc::new(MonotonicClock::new()), VolumeOptions::default())?;
    let volume = Arc::new(volume);
    let _background = Background::start(&volume);
    let span = span_blocks.min(volume.size_bytes() / bs);
    let mut h = measure(&name, span, args.flush_every, duration, args.json, &|o, b| Ok(volume.write(o, b)?), &|| {
        Ok(volume.flush()?)
    })?;
    h.ratio_to_raw_cache = Some((h.writes_per_second / results[0].writes_per_second * 1000.0).round() / 1000.0);
    results.push(h);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({ "flush_every": args.flush_every, "span_bytes": args.span, "results": results })
            )?
        );
    } else {
        let mut t = Table::new(&[
            "target",
            "writes/s",
            "MiB/s",
            "write p50 us",
            "p99 us",
            "p99.9 us",
            "flush p99 us",
            "vs raw cache",
        ]);
        for r in &results {
            t.row(vec![
                r.target.clone(),
                thousands(r.writes_per_second),
                format!("{:.1}", r.mib_per_second),
                format!("{:.1}", r.write_latency_us_p50),
                format!("{:.1}", r.write_latency_us_p99),
                format!("{:.1}", r.write_latency_us_p999),
                format!("{:.1}", r.flush_latency_us_p99),
                r.ratio_to_raw_cache.map_or("-".into(), |x| format!("{:.1} %", 100.0 * x)),
            ]);
        }
        print!("{}", t.render());
    }
    Ok(())
}

type Dev = Arc<dyn BlockDevice>;
type WriteFn<'a> = &'a dyn Fn(u64, &[u8]) -> Result<()>;
type FlushFn<'a> = &'a dyn Fn() -> Result<()>;

fn measure(
    name: &str,
    span_blocks: u64,
    flush_every: u64,
    duration: Duration,
    quiet: bool,
    write: WriteFn<'_>,
    flush: FlushFn<'_>,
) -> Result<RandwriteResult> {
    let pb = super::fsync::progress_bar(name, duration, quiet);
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(42);
    let mut buf = AlignedBuf::new(4096);
    let (mut wh, mut fh) = (latency_histogram(), latency_histogram());
    let start = Instant::now();
    let mut writes = 0u64;
    while start.elapsed() < duration {
        let block = rng.gen_range(0..span_blocks);
        buf[..8].copy_from_slice(&writes.to_le_bytes());
        let t = Instant::now();
        write(block * 4096, &buf).with_context(|| format!("{name}: writing"))?;
        wh.saturating_record(t.elapsed().as_nanos() as u64 + 1);
        writes += 1;
        if writes.is_multiple_of(flush_every.max(1)) {
            let t = Instant::now();
            flush().with_context(|| format!("{name}: flushing"))?;
            fh.saturating_record(t.elapsed().as_nanos() as u64 + 1);
        }
        if writes.is_multiple_of(256) {
            pb.set_position(start.elapsed().as_millis() as u64);
        }
    }
    let secs = start.elapsed().as_secs_f64();
    pb.finish_and_clear();
    let rate = writes as f64 / secs;
    Ok(RandwriteResult {
        target: name.to_string(),
        writes_per_second: round1(rate),
        mib_per_second: round1(rate * 4096.0 / (1 << 20) as f64),
        write_latency_us_p50: round1(quantile_us(&wh, 0.5)),
        write_latency_us_p99: round1(quantile_us(&wh, 0.99)),
        write_latency_us_p999: round1(quantile_us(&wh, 0.999)),
        write_latency_us_max: round1(wh.max() as f64 / 1000.0),
        flush_latency_us_p50: round1(quantile_us(&fh, 0.5)),
        flush_latency_us_p99: round1(quantile_us(&fh, 0.99)),
        flush_latency_us_max: round1(fh.max() as f64 / 1000.0),
        flushes: fh.len(),
        writes,
        ratio_to_raw_cache: None,
    })
}
