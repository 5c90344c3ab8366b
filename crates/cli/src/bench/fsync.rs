//! `tiercache bench fsync`: docs/seeds.md §2 as a command. Each target runs "write 4 KiB at
//! offset 0, flush" in a loop for `--seconds`; every iteration's latency goes into a
//! histogram. The rate is iterations divided by the loop's wall time.

use crate::report::{latency_histogram, quantile_us, round1, thousands, Table};
use anyhow::{Context, Result};
use clap::Args;
use hdrhistogram::Histogram;
use serde::Serialize;
use std::path::{Path, PathBuf};
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
/// Size of the preconditioned file the raw comparison of --cache/--backing runs on.
const RAW_FILE_BYTES: u64 = 64 << 20;
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
    /// With --backing: also measure a hybrid volume on these real files or block devices (the
    /// cache is formatted, the backing's first blocks are overwritten), and the raw cache: a
    /// preconditioned file beside a cache file, or a cache block device itself, measured
    /// alone before the hybrid formats it. Ones that hold anything (a file system, a partition
    /// table, a tiercache cache) need --destructive; a tiercache cache holding dirty data is
    /// never formatted.
    #[arg(long, value_name = "PATH", requires = "backing")]
    cache: Option<PathBuf>,
    /// The backing file for --cache.
    #[arg(long, value_name = "PATH", requires = "cache")]
    backing: Option<PathBuf>,
    /// Interleaved rounds: each target runs --seconds/ROUNDS per round, in turn; the rate
    /// reported is the median round (robust to a machine whose speed drifts).
    #[arg(long, default_value_t = 5)]
    rounds: u32,
    /// Allow writing targets that are block devices or hold something (a file system, a
    /// partition table, a tiercache cache without dirty data): their first blocks are
    /// overwritten.
    #[arg(long)]
    destructive: bool,
    /// Measure end to end instead, the way a database sees the volume: ext4 on a loop device
    /// over the FUSE file (`fuse`), over NBD through nbdfuse (`nbd`), or on /dev/ublkbN
    /// (`ublk`) of a `tiercache serve` this command starts, against ext4 on a loop device over
    /// a raw file on the same disk;
    /// write 4 KiB + fdatasync by 1 and 16 committers, and 4 KiB random reads at QD1 and 16,
    /// with device flushes per fsync. Needs root; everything is torn down afterwards.
    #[arg(long, value_enum, conflicts_with_all = ["targets", "cache", "backing"])]
    through: Option<super::through::Through>,
    /// With --through fuse: how the kernel hands the FUSE file's requests to the server
    /// (`serve --fuse-transport`: auto, the default, io-uring or dev).
    #[arg(long, value_enum, value_name = "HOW", requires = "through")]
    fuse_transport: Option<crate::serve::FuseTransport>,
    /// With --through: where the work directory goes (default /var/tmp); its files are about
    /// 2 GiB, one disk (the reference and the cache file share it).
    #[arg(long, value_name = "DIR", requires = "through")]
    dir: Option<PathBuf>,
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
    /// Each target ran this many interleaved slices; rates are the median slice.
    rounds: u32,
    results: Vec<FsyncResult>,
}

/// Parses a target; a PATH is checked for what it holds (`effect`: what the benchmark does
/// to it) before anything is written anywhere.
fn parse_target(s: &str, destructive: bool, effect: &str) -> Result<Target> {
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
    let dev: Arc<dyn BlockDevice> =
        Arc::new(FileDevice::open_with(&path, OpenOptions { direct: false, lock: true, read_only: false })?);
    // (Refuses a block device or a file holding anything, unless --destructive.)
    crate::safety::check_benchmark_target(dev, &path, effect, destructive)?;
    Ok(Target::Path(path))
}

/// One thing to measure: how to write a block and flush, plus what its row reports.
struct Runner {
    name: String,
    io_mode: &'static str,
    documented: Option<f64>,
    /// (target name, io mode) of the raw cache device row this one is compared with.
    compare_with: Option<(String, &'static str)>,
    write: WriteFn,
    flush: FlushFn,
}

type WriteFn = Box<dyn Fn(&[u8]) -> Result<()>>;
type FlushFn = Box<dyn Fn() -> Result<()>>;

/// Removes a file when dropped (the raw-comparison file beside a real cache file).
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn device_runner(dev: Arc<dyn BlockDevice>, name: String, io_mode: &'static str) -> Runner {
    let d2 = Arc::clone(&dev);
    Runner {
        name,
        io_mode,
        documented: None,
        compare_with: None,
        write: Box::new(move |buf| Ok(dev.write_at(0, buf)?)),
        flush: Box::new(move || Ok(d2.flush()?)),
    }
}

/// Formats a fresh hybrid volume on `cache` and `backing` (recorded as `backing_path`, so
/// that the cache left behind names it); the volume and its background thread live as long
/// as the runner.
fn hybrid_runner(
    cache: Arc<dyn BlockDevice>,
    backing: Arc<dyn BlockDevice>,
    backing_path: String,
    name: String,
) -> Result<Runner> {
    let options = CreateOptions { backing_path, ..CreateOptions::default() };
    create(&*cache, &*backing, &options).with_context(|| format!("{name}: formatting"))?;
    let (volume, _) = Volume::open(cache, backing, Arc::new(MonotonicClock::new()), VolumeOptions::default())?;
    let volume = Arc::new(volume);
    let background = Arc::new(Background::start(&volume));
    let v2 = Arc::clone(&volume);
    Ok(Runner {
        name,
        io_mode: "hybrid",
        documented: None,
        compare_with: None,
        write: Box::new(move |buf| Ok(volume.write(0, buf)?)),
        flush: Box::new(move || {
            let _background = &background;
            Ok(v2.flush()?)
        }),
    })
}

fn path_runners(path: &Path) -> Result<Vec<Runner>> {
    let mut runners = Vec::new();
    for (direct, mode) in [(true, "o_direct"), (false, "buffered")] {
        let dev = match FileDevice::open_with(path, OpenOptions { direct, lock: false, read_only: false }) {
            Err(e @ DeviceError::DirectIoUnsupported { .. }) => {
                eprintln!("tiercache: skipping the O_DIRECT run: {e}");
                continue;
            }
            r => r?,
        };
        runners.push(device_runner(Arc::new(dev), path.display().to_string(), mode));
    }
    Ok(runners)
}

pub fn run(args: FsyncArgs) -> Result<()> {
    if let Some(through) = args.through {
        return super::through::run_through(super::through::Options {
            through,
            fuse_transport: args.fuse_transport.unwrap_or(crate::serve::FuseTransport::Auto),
            seconds: args.seconds,
            rounds: args.rounds,
            dir: args.dir,
            json: args.json,
        });
    }
    let specs: Vec<String> = if args.targets.is_empty() && args.cache.is_none() {
        DEFAULT_TARGETS.iter().map(|s| s.to_string()).collect()
    } else {
        args.targets.clone()
    };
    let targets = specs
        .iter()
        .map(|s| parse_target(s, args.destructive, "the benchmark overwrites its first 4 KiB"))
        .collect::<Result<Vec<_>>>()?;
    if let (Some(cache), Some(backing)) = (&args.cache, &args.backing) {
        parse_target(&cache.display().to_string(), args.destructive, "the benchmark formats it as a cache")?;
        parse_target(&backing.display().to_string(), args.destructive, "the benchmark overwrites its first blocks")?;
    }
    let mut keep: Vec<tempfile::NamedTempFile> = Vec::new();
    let mut cleanup: Vec<RemoveOnDrop> = Vec::new();
    let mut runners: Vec<Runner> = Vec::new();
    for target in targets {
        match target {
            Target::Emulated(profile) => {
                let file = temp_file(EMULATED_FILE_BYTES)?;
                let dev = Arc::new(EmulatedDevice::open(file.path(), profile)?);
                keep.push(file);
                let mut r = device_runner(dev, format!("emulated:{}", profile.name), "emulated");
                r.documented = Some(profile.documented_fsyncs_per_second);
                runners.push(r);
            }
            Target::Path(path) => runners.extend(path_runners(&path)?),
            Target::HybridEmulated { cache, backing } => {
                let cache_file = preconditioned_temp_file(HYBRID_CACHE_BYTES)?;
                let backing_file = temp_file(EMULATED_FILE_BYTES)?;
                let c: Arc<dyn BlockDevice> = Arc::new(EmulatedDevice::open(cache_file.path(), cache)?);
                let b: Arc<dyn BlockDevice> = Arc::new(EmulatedDevice::open(backing_file.path(), backing)?);
                keep.extend([cache_file, backing_file]);
                let mut r = hybrid_runner(c, b, String::new(), format!("hybrid:{}:{}", cache.name, backing.name))?;
                r.compare_with = Some((format!("emulated:{}", cache.name), "emulated"));
                runners.push(r);
            }
        }
    }
    let rounds = args.rounds.max(1);
    let slice = Duration::from_secs_f64(args.seconds / f64::from(rounds));
    // Rows measured before the others (a raw cache block device, which the hybrid formats
    // next), with their rounds.
    let mut measured_first: Vec<(Runner, Measured)> = Vec::new();
    if let (Some(cache), Some(backing)) = (&args.cache, &args.backing) {
        let raw = if std::fs::metadata(cache)?.is_file() {
            // The cache file is formatted and in use by the hybrid, so the raw comparison runs
            // on a preconditioned file beside it: same file system, same device.
            let raw = PathBuf::from(format!("{}.raw-bench", cache.display()));
            std::fs::File::create(&raw)
                .with_context(|| format!("creating {}", raw.display()))?
                .set_len(RAW_FILE_BYTES)?;
            cleanup.push(RemoveOnDrop(raw.clone()));
            crate::devices::precondition_file(&raw, RAW_FILE_BYTES, args.json)?;
            runners.extend(path_runners(&raw)?);
            // Formatted anyway: written in full first, as a deployed cache file would be.
            crate::devices::precondition_file(cache, std::fs::metadata(cache)?.len(), args.json)?;
            raw
        } else {
            // A block device: nothing can sit beside it (a file named after it would land in
            // /dev, in RAM), so the device itself is measured, alone and first, before the
            // hybrid formats it; its rounds are not interleaved with the others'.
            let first = path_runners(cache)?;
            let m = measure(&first, rounds, slice, args.json)?;
            measured_first.extend(first.into_iter().zip(m));
            cache.clone()
        };
        let c: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(cache)?);
        let b: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(backing)?);
        let recorded = std::path::absolute(backing).unwrap_or_else(|_| backing.clone()).display().to_string();
        let mut r = hybrid_runner(c, b, recorded, format!("hybrid ({} over {})", cache.display(), backing.display()))?;
        r.compare_with = Some((raw.display().to_string(), "o_direct"));
        runners.push(r);
    }

    let measured = measure(&runners, rounds, slice, args.json)?;
    let (runners, mut measured): (Vec<Runner>, Vec<Measured>) =
        measured_first.into_iter().chain(runners.into_iter().zip(measured)).unzip();
    let mut results: Vec<FsyncResult> = runners
        .iter()
        .zip(&mut measured)
        .map(|(r, Measured { rates, hist: h, iterations, seconds })| FsyncResult {
            target: r.name.clone(),
            io_mode: r.io_mode,
            fsyncs_per_second: round1(median(rates)),
            latency_us_p50: round1(quantile_us(h, 0.50)),
            latency_us_p99: round1(quantile_us(h, 0.99)),
            latency_us_p999: round1(quantile_us(h, 0.999)),
            latency_us_max: round1(h.max() as f64 / 1000.0),
            iterations: *iterations,
            seconds: (*seconds * 1000.0).round() / 1000.0,
            documented_fsyncs_per_second: r.documented,
            raw_cache_target: None,
            ratio_to_raw_cache: None,
        })
        .collect();
    for (i, r) in runners.iter().enumerate() {
        if let Some((raw, mode)) = &r.compare_with {
            let base = results.iter().find(|x| &x.target == raw && x.io_mode == *mode).map(|x| x.fsyncs_per_second);
            if let Some(base) = base {
                results[i].raw_cache_target = Some(format!("{raw} ({mode})"));
                results[i].ratio_to_raw_cache = Some((results[i].fsyncs_per_second / base * 1000.0).round() / 1000.0);
            }
        }
    }
    drop(runners);
    drop(cleanup);
    drop(keep);
    let report = FsyncReport { rounds, results };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", render_table(&report));
    }
    Ok(())
}

/// One row's rounds: the rate of each, the latency histogram, iterations and seconds in all.
struct Measured {
    rates: Vec<f64>,
    hist: Histogram<u64>,
    iterations: u64,
    seconds: f64,
}

/// Interleaved rounds: every target runs a slice per round, so a machine whose speed drifts
/// affects all of them alike; the rate reported is the median round.
fn measure(runners: &[Runner], rounds: u32, slice: Duration, json: bool) -> Result<Vec<Measured>> {
    let total = Duration::from_secs_f64(slice.as_secs_f64() * f64::from(rounds) * runners.len() as f64);
    let progress = progress_bar("measuring", total, json);
    let mut out: Vec<Measured> = runners
        .iter()
        .map(|_| Measured { rates: Vec::new(), hist: latency_histogram(), iterations: 0, seconds: 0.0 })
        .collect();
    for _ in 0..rounds {
        for (r, m) in runners.iter().zip(&mut out) {
            progress.set_prefix(r.name.clone());
            let (n, secs) = measure_slice(r, slice, &mut m.hist)?;
            m.rates.push(n as f64 / secs);
            m.iterations += n;
            m.seconds += secs;
            progress.inc(slice.as_millis() as u64);
        }
    }
    progress.finish_and_clear();
    Ok(out)
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Runs the "write 4 KiB at offset 0, flush" loop for `duration`; returns (iterations, seconds).
fn measure_slice(r: &Runner, duration: Duration, hist: &mut Histogram<u64>) -> Result<(u64, f64)> {
    let mut buf = AlignedBuf::new(WRITE_BYTES);
    buf.fill(0x5a);
    // One warm-up iteration per slice, not counted.
    (r.write)(&buf).with_context(|| format!("{}: writing", r.name))?;
    (r.flush)().with_context(|| format!("{}: flushing", r.name))?;
    let start = Instant::now();
    let mut n: u64 = 0;
    while start.elapsed() < duration {
        let t0 = Instant::now();
        buf[0] = buf[0].wrapping_add(1); // every write carries new data
        (r.write)(&buf).with_context(|| format!("{}: writing", r.name))?;
        (r.flush)().with_context(|| format!("{}: flushing", r.name))?;
        hist.saturating_record(u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX).max(1));
        n += 1;
    }
    Ok((n, start.elapsed().as_secs_f64()))
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
    let file = temp_file(len)?;
    crate::devices::precondition_file(file.path(), len, true)?;
    Ok(file)
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

/// A progress bar over a duration (see `report::progress_bar`).
pub(crate) fn progress_bar(name: &str, duration: Duration, quiet: bool) -> indicatif::ProgressBar {
    crate::report::progress_bar(name, duration.as_millis() as u64, crate::report::Progress::Time, quiet)
}
