//! `tiercache bench fsync`: SEEDS.md §2 as a command. Each target runs "write 4 KiB at
//! offset 0, flush" in a loop for `--seconds`; every iteration's latency goes into a
//! histogram. The rate is iterations divided by the loop's wall time.

use crate::report::{latency_histogram, quantile_us, round1, thousands, Table};
use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};
use serde::Serialize;
use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiercache_device::{
    AlignedBuf, BlockDevice, DeviceError, EmulatedDevice, FileDevice, MonotonicClock, OpenOptions, Profile,
};
use tiercache_engine::{create, Background, CreateOptions, Volume, VolumeOptions};

/// The write size of the loop: one 4 KiB block, as in the seed measurements.
const WRITE_BYTES: usize = 4096;
/// Size of the sparse temporary file behind an emulated target (and a hybrid's backing).
const EMULATED_FILE_BYTES: u64 = 1 << 30;
/// Size of a hybrid target's cache device.
const HYBRID_CACHE_BYTES: u64 = 256 << 20;
/// The default matrix: the seed table's fast device, a NAND NVMe, the slow USB disk, and the
/// hybrid volume made of the first and the last (compared with the raw fast device).
const DEFAULT_TARGETS: &[&str] = &["emulated:optane", "emulated:nvme", "emulated:usb-disk", "hybrid"];

#[derive(Debug, Args)]
pub struct FsyncArgs {
    /// How long to run the loop on each target, in seconds.
    #[arg(long, default_value_t = 3.0, value_parser = parse_seconds, allow_negative_numbers = true)]
    seconds: f64,
    /// A target: PATH (an existing file or block device), emulated:PROFILE, or hybrid
    /// (a hybrid volume: emulated optane cache over emulated usb-disk backing), or
    /// hybrid:CACHE_PROFILE:BACKING_PROFILE. Repeatable. Without any, runs emulated:optane,
    /// emulated:nvme, emulated:usb-disk and hybrid.
    #[arg(long = "target", value_name = "TARGET")]
    targets: Vec<String>,
    /// With --backing: also measure a hybrid volume on these real files (the cache file is
    /// formatted, the backing file's first blocks are overwritten), and the raw cache file.
    #[arg(long, value_name = "PATH", requires = "backing")]
    cache: Option<PathBuf>,
    /// The backing file for --cache.
    #[arg(long, value_name = "PATH", requires = "cache")]
    backing: Option<PathBuf>,
    /// Allow PATH targets that are block devices (their first 4 KiB are overwritten).
    #[arg(long)]
    destructive: bool,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

fn parse_seconds(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("'{s}' is not a number of seconds"))?;
    if !(v > 0.0 && v <= 86_400.0) {
        return Err(format!("{s} seconds is out of range (0 < seconds <= 86400)"));
    }
    Ok(v)
}

#[derive(Debug)]
enum Target {
    Emulated(&'static Profile),
    Path(PathBuf),
    /// A hybrid volume on emulated devices (temporary files).
    HybridEmulated {
        cache: &'static Profile,
        backing: &'static Profile,
    },
    /// A hybrid volume on real files.
    HybridFiles {
        cache: PathBuf,
        backing: PathBuf,
    },
}

#[derive(Debug, Serialize)]
struct FsyncResult {
    target: String,
    /// "emulated", "o_direct" or "buffered".
    io_mode: &'static str,
    fsyncs_per_second: f64,
    latency_us_p50: f64,
    latency_us_p99: f64,
    latency_us_p999: f64,
    latency_us_max: f64,
    iterations: u64,
    seconds: f64,
    /// For emulated targets: the rate the profile is documented to reproduce.
    #[serde(skip_serializing_if = "Option::is_none")]
    documented_fsyncs_per_second: Option<f64>,
    /// For hybrid targets: the raw cache device measured in the same run, and this rate as a
    /// share of it.
    #[serde(skip_serializing_if = "Option::is_none")]
    raw_cache_target: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ratio_to_raw_cache: Option<f64>,
}

#[derive(Debug, Serialize)]
struct FsyncReport {
    results: Vec<FsyncResult>,
}

fn parse_target(s: &str, destructive: bool) -> Result<Target> {
    if let Some(name) = s.strip_prefix("emulated:") {
        return Ok(Target::Emulated(Profile::by_name(name)?));
    }
    if s == "hybrid" {
        return Ok(Target::HybridEmulated {
            cache: Profile::by_name("optane")?,
            backing: Profile::by_name("usb-disk")?,
        });
    }
    if let Some(rest) = s.strip_prefix("hybrid:") {
        let (c, b) = rest
            .split_once(':')
            .with_context(|| format!("'{s}': write hybrid:CACHE_PROFILE:BACKING_PROFILE, e.g. hybrid:nvme:hdd"))?;
        return Ok(Target::HybridEmulated { cache: Profile::by_name(c)?, backing: Profile::by_name(b)? });
    }
    let path = PathBuf::from(s);
    // Open once now to refuse bad input before anything is written anywhere.
    drop(FileDevice::open_with(&path, OpenOptions { direct: false, lock: true })?);
    let meta = std::fs::metadata(&path).with_context(|| format!("{s}: stat"))?;
    if meta.file_type().is_block_device() && !destructive {
        bail!("{s}: is a block device and the benchmark overwrites its first 4 KiB; pass --destructive to allow it");
    }
    Ok(Target::Path(path))
}

pub fn run(args: FsyncArgs) -> Result<()> {
    let specs: Vec<String> = if args.targets.is_empty() && args.cache.is_none() {
        DEFAULT_TARGETS.iter().map(|s| s.to_string()).collect()
    } else {
        args.targets.clone()
    };
    let mut targets = specs.iter().map(|s| parse_target(s, args.destructive)).collect::<Result<Vec<_>>>()?;
    if let (Some(cache), Some(backing)) = (&args.cache, &args.backing) {
        for p in [cache, backing] {
            parse_target(&p.display().to_string(), args.destructive)?;
        }
        targets.push(Target::Path(cache.clone()));
        targets.push(Target::HybridFiles { cache: cache.clone(), backing: backing.clone() });
    }
    let duration = Duration::from_secs_f64(args.seconds);
    let mut results: Vec<FsyncResult> = Vec::new();
    for target in &targets {
        match target {
            Target::Emulated(profile) => {
                let file = temp_file(EMULATED_FILE_BYTES)?;
                let dev = EmulatedDevice::open(file.path(), profile)?;
                let name = format!("emulated:{}", profile.name);
                let mut r = measure_device(&dev, &name, "emulated", duration, args.json)?;
                r.documented_fsyncs_per_second = Some(profile.documented_fsyncs_per_second);
                results.push(r);
            }
            Target::Path(path) => {
                for (direct, mode) in [(true, "o_direct"), (false, "buffered")] {
                    let dev = match FileDevice::open_with(path, OpenOptions { direct, lock: true }) {
                        Err(e @ DeviceError::DirectIoUnsupported { .. }) => {
                            eprintln!("tiercache: skipping the O_DIRECT run: {e}");
                            continue;
                        }
                        r => r?,
                    };
                    results.push(measure_device(&dev, &path.display().to_string(), mode, duration, args.json)?);
                }
            }
            Target::HybridEmulated { cache, backing } => {
                let cache_file = preconditioned_temp_file(HYBRID_CACHE_BYTES)?;
                let backing_file = temp_file(EMULATED_FILE_BYTES)?;
                let c: Arc<dyn BlockDevice> = Arc::new(EmulatedDevice::open(cache_file.path(), cache)?);
                let b: Arc<dyn BlockDevice> = Arc::new(EmulatedDevice::open(backing_file.path(), backing)?);
                let name = format!("hybrid:{}:{}", cache.name, backing.name);
                let mut r = measure_hybrid(c, b, &name, duration, args.json)?;
                let raw = format!("emulated:{}", cache.name);
                compare_with_raw(&mut r, &results, &raw, "emulated");
                results.push(r);
            }
            Target::HybridFiles { cache, backing } => {
                let c: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(cache)?);
                let b: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(backing)?);
                let name = format!("hybrid ({} over {})", cache.display(), backing.display());
                let mut r = measure_hybrid(c, b, &name, duration, args.json)?;
                compare_with_raw(&mut r, &results, &cache.display().to_string(), "o_direct");
                results.push(r);
            }
        }
    }
    let report = FsyncReport { results };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render_table(&report));
    }
    Ok(())
}

/// Where emulated devices keep their data: memory (/dev/shm) when available, so that the
/// host's page-cache writeback and file-system block allocation (which the emulated device
/// does not have) never leak into the measured timing.
fn emulation_dir() -> PathBuf {
    let shm = PathBuf::from("/dev/shm");
    match std::fs::metadata(&shm) {
        Ok(m) if m.is_dir() && tempfile::tempfile_in(&shm).is_ok() => shm,
        _ => std::env::temp_dir(),
    }
}

pub(crate) fn temp_file(len: u64) -> Result<tempfile::NamedTempFile> {
    let file =
        tempfile::NamedTempFile::new_in(emulation_dir()).context("creating a temporary file for an emulated device")?;
    file.as_file().set_len(len).context("sizing the temporary file")?;
    Ok(file)
}

/// A temporary file written in full once, like preconditioning an SSD before a benchmark:
/// otherwise the first write to each page of a sparse file pays the host's page-cache and
/// block allocation, which the emulated device does not have and the raw-device runs (which
/// rewrite one block) never pay.
pub(crate) fn preconditioned_temp_file(len: u64) -> Result<tempfile::NamedTempFile> {
    use std::io::Write;
    let mut file =
        tempfile::NamedTempFile::new_in(emulation_dir()).context("creating a temporary file for an emulated device")?;
    let chunk = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let n = left.min(chunk.len() as u64) as usize;
        file.write_all(&chunk[..n]).context("preconditioning the temporary file")?;
        left -= n as u64;
    }
    file.flush()?;
    Ok(file)
}

/// Fills in the ratio of a hybrid row to the raw cache device's row of the same run.
fn compare_with_raw(r: &mut FsyncResult, earlier: &[FsyncResult], raw: &str, io_mode: &str) {
    if let Some(base) = earlier.iter().find(|x| x.target == raw && x.io_mode == io_mode) {
        r.raw_cache_target = Some(format!("{raw} ({io_mode})"));
        r.ratio_to_raw_cache = Some((r.fsyncs_per_second / base.fsyncs_per_second * 1000.0).round() / 1000.0);
    }
}

/// Formats a fresh hybrid volume on `cache` and `backing` and measures it.
fn measure_hybrid(
    cache: Arc<dyn BlockDevice>,
    backing: Arc<dyn BlockDevice>,
    name: &str,
    duration: Duration,
    quiet: bool,
) -> Result<FsyncResult> {
    create(&*cache, &*backing, &CreateOptions::default()).with_context(|| format!("{name}: formatting"))?;
    let (volume, _) = Volume::open(cache, backing, Arc::new(MonotonicClock::new()), VolumeOptions::default())?;
    let volume = Arc::new(volume);
    let _background = Background::start(&volume);
    measure(name, "hybrid", duration, quiet, &|buf| volume.write(0, buf).map_err(anyhow::Error::from), &|| {
        volume.flush().map_err(anyhow::Error::from)
    })
}

fn measure_device(
    dev: &dyn BlockDevice,
    name: &str,
    io_mode: &'static str,
    duration: Duration,
    quiet: bool,
) -> Result<FsyncResult> {
    measure(name, io_mode, duration, quiet, &|buf| dev.write_at(0, buf).map_err(anyhow::Error::from), &|| {
        dev.flush().map_err(anyhow::Error::from)
    })
}

fn render_table(report: &FsyncReport) -> String {
    let mut t = Table::new(&[
        "target",
        "mode",
        "fsyncs/s",
        "p50 us",
        "p99 us",
        "p99.9 us",
        "documented",
        "measured/doc",
        "vs raw cache",
    ]);
    for r in &report.results {
        let (doc, ratio) = match r.documented_fsyncs_per_second {
            Some(d) => (thousands(d), format!("{:.1} %", 100.0 * r.fsyncs_per_second / d)),
            None => ("-".into(), "-".into()),
        };
        t.row(vec![
            r.target.clone(),
            r.io_mode.into(),
            thousands(r.fsyncs_per_second),
            format!("{:.1}", r.latency_us_p50),
            format!("{:.1}", r.latency_us_p99),
            format!("{:.1}", r.latency_us_p999),
            doc,
            ratio,
            r.ratio_to_raw_cache.map_or("-".into(), |x| format!("{:.1} %", 100.0 * x)),
        ]);
    }
    t.render()
}

type WriteFn<'a> = &'a dyn Fn(&[u8]) -> Result<()>;
type FlushFn<'a> = &'a dyn Fn() -> Result<()>;

/// Runs the "write 4 KiB at offset 0, flush" loop for `duration`.
fn measure(
    name: &str,
    io_mode: &'static str,
    duration: Duration,
    quiet: bool,
    write: WriteFn<'_>,
    flush: FlushFn<'_>,
) -> Result<FsyncResult> {
    let mut buf = AlignedBuf::new(WRITE_BYTES);
    buf.fill(0x5a);
    let progress = progress_bar(name, duration, quiet);
    // One warm-up iteration: opens the path through the kernel and the model's queues.
    write(&buf).with_context(|| format!("{name}: writing"))?;
    flush().with_context(|| format!("{name}: flushing"))?;
    let mut hist = latency_histogram();
    let start = Instant::now();
    let mut iterations: u64 = 0;
    let mut last_tick = start;
    while start.elapsed() < duration {
        let t0 = Instant::now();
        buf[0] = buf[0].wrapping_add(1); // every write carries new data
        write(&buf).with_context(|| format!("{name}: writing"))?;
        flush().with_context(|| format!("{name}: flushing"))?;
        let ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX).max(1);
        hist.saturating_record(ns);
        iterations += 1;
        if last_tick.elapsed() > Duration::from_millis(100) {
            progress.set_position(start.elapsed().as_millis() as u64);
            last_tick = Instant::now();
        }
    }
    let seconds = start.elapsed().as_secs_f64();
    progress.finish_and_clear();
    Ok(FsyncResult {
        target: name.to_string(),
        io_mode,
        fsyncs_per_second: round1(iterations as f64 / seconds),
        latency_us_p50: round1(quantile_us(&hist, 0.50)),
        latency_us_p99: round1(quantile_us(&hist, 0.99)),
        latency_us_p999: round1(quantile_us(&hist, 0.999)),
        latency_us_max: round1(hist.max() as f64 / 1000.0),
        iterations,
        seconds: (seconds * 1000.0).round() / 1000.0,
        documented_fsyncs_per_second: None,
        raw_cache_target: None,
        ratio_to_raw_cache: None,
    })
}

pub(crate) fn progress_bar(name: &str, duration: Duration, quiet: bool) -> ProgressBar {
    let pb = ProgressBar::new(duration.as_millis() as u64);
    if quiet {
        pb.set_draw_target(ProgressDrawTarget::hidden());
    }
    pb.set_style(
        ProgressStyle::with_template("{prefix:>28} [{bar:30}] {elapsed}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    pb.set_prefix(name.to_string());
    pb
}
