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
use std::time::{Duration, Instant};
use tiercache_device::{AlignedBuf, BlockDevice, DeviceError, EmulatedDevice, FileDevice, OpenOptions, Profile};

/// The write size of the loop: one 4 KiB block, as in the seed measurements.
const WRITE_BYTES: usize = 4096;
/// Size of the sparse temporary file behind an emulated target.
const EMULATED_FILE_BYTES: u64 = 1 << 30;
/// The default matrix: the seed table's fast device, a NAND NVMe and the slow USB disk.
const DEFAULT_PROFILES: &[&str] = &["optane", "nvme", "usb-disk"];

#[derive(Debug, Args)]
pub struct FsyncArgs {
    /// How long to run the loop on each target, in seconds.
    #[arg(long, default_value_t = 3.0, value_parser = parse_seconds, allow_negative_numbers = true)]
    seconds: f64,
    /// A target: PATH (an existing file or block device), or emulated:PROFILE. Repeatable.
    /// Without any, runs emulated:optane, emulated:nvme and emulated:usb-disk.
    #[arg(long = "target", value_name = "TARGET")]
    targets: Vec<String>,
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
}

#[derive(Debug, Serialize)]
struct FsyncReport {
    results: Vec<FsyncResult>,
}

fn parse_target(s: &str, destructive: bool) -> Result<Target> {
    if let Some(name) = s.strip_prefix("emulated:") {
        return Ok(Target::Emulated(Profile::by_name(name)?));
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
    let specs: Vec<String> = if args.targets.is_empty() {
        DEFAULT_PROFILES.iter().map(|p| format!("emulated:{p}")).collect()
    } else {
        args.targets.clone()
    };
    let targets = specs.iter().map(|s| parse_target(s, args.destructive)).collect::<Result<Vec<_>>>()?;
    let duration = Duration::from_secs_f64(args.seconds);
    let mut results = Vec::new();
    for target in &targets {
        match target {
            Target::Emulated(profile) => {
                let file = tempfile::NamedTempFile::new().context("creating the emulated device's temporary file")?;
                file.as_file().set_len(EMULATED_FILE_BYTES).context("sizing the temporary file")?;
                let dev = EmulatedDevice::open(file.path(), profile)?;
                let name = format!("emulated:{}", profile.name);
                let mut r = measure(&dev, &name, "emulated", duration, args.json)?;
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
                    results.push(measure(&dev, &path.display().to_string(), mode, duration, args.json)?);
                }
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

fn render_table(report: &FsyncReport) -> String {
    let mut t =
        Table::new(&["target", "mode", "fsyncs/s", "p50 us", "p99 us", "p99.9 us", "documented", "measured/doc"]);
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
        ]);
    }
    t.render()
}

/// Runs the write+flush loop on `dev` for `duration`.
fn measure(
    dev: &dyn BlockDevice,
    name: &str,
    io_mode: &'static str,
    duration: Duration,
    quiet: bool,
) -> Result<FsyncResult> {
    let mut buf = AlignedBuf::new(WRITE_BYTES);
    buf.fill(0x5a);
    let progress = progress_bar(name, duration, quiet);
    // One warm-up iteration: opens the path through the kernel and the model's queues.
    dev.write_at(0, &buf).with_context(|| format!("{name}: writing"))?;
    dev.flush().with_context(|| format!("{name}: flushing"))?;
    let mut hist = latency_histogram();
    let start = Instant::now();
    let mut iterations: u64 = 0;
    let mut last_tick = start;
    while start.elapsed() < duration {
        let t0 = Instant::now();
        buf[0] = buf[0].wrapping_add(1); // every write carries new data
        dev.write_at(0, &buf).with_context(|| format!("{name}: writing"))?;
        dev.flush().with_context(|| format!("{name}: flushing"))?;
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
    })
}

fn progress_bar(name: &str, duration: Duration, quiet: bool) -> ProgressBar {
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
