//! `tiercache bench seq`: large-request bandwidth of the hybrid volume against the raw devices
//! it is made of, in one run (issue 13). Each request size and queue depth runs every case in
//! turn, round after round, so a machine whose speed drifts drifts for all of them alike; the
//! figure reported is the median round.
//!
//! The cases, each on a freshly formatted cache:
//! - write into an empty cache, then read it back (every block a hit), then read data never
//!   written (every block a miss);
//! - write while the cache is full of clean data (reads filled it);
//! - write while the log head holds dirty data below the high watermark (the writer reaches
//!   it: write-back or copy-forward, never a per-segment stall);
//! - a destage-bound write: more new data than the cache holds, measured once the cache is
//!   full, so the backing device's write rate is the limit.
//!
//! Reference rows: the raw cache device and the raw backing device, written and read the same
//! way (same request size and queue depth). A queue depth of N is N threads, each taking the
//! next request of one sequential stream.

use super::fsync::progress_bar;
use crate::report::{latency_histogram, round1, Table};
use anyhow::{bail, Context, Result};
use clap::Args;
use hdrhistogram::Histogram;
use serde::Serialize;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiercache_device::{AlignedBuf, BlockDevice, EmulatedDevice, FileDevice, MonotonicClock, Profile};
use tiercache_engine::{create, Background, CreateOptions, Volume, VolumeOptions};

#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  tiercache bench seq                                   plain files in $TMPDIR, about 2 minutes
  tiercache bench seq --request-sizes 1M --queue-depths 16 --rounds 5
  tiercache bench seq --emulated nvme:hdd --bytes 32M   emulated devices (docs/devices.md)
  tiercache bench seq --cache /dev/nvme0n1p4 --backing /dev/md0 --cache-size 8G --bytes 2G --destructive
  tiercache bench seq --json > seq.json

Every case writes or reads --bytes per round; the cache is --cache-size (a fresh format for
each case) and the backing device four times that. The ratio column compares each hybrid
row with its reference: the raw cache device for writes into room and for hits, the raw
backing device for misses and destage-bound writes, the hybrid's own empty-cache write for
writes meeting a full cache. The goal column is issue 13's bar for that ratio.")]
pub struct SeqArgs {
    /// Request sizes, comma-separated (multiples of 4 KiB).
    #[arg(long, value_delimiter = ',', default_value = "64K,256K,1M", value_parser = crate::devices::parse_size)]
    request_sizes: Vec<u64>,
    /// Queue depths (requests in flight), comma-separated.
    #[arg(long, value_delimiter = ',', default_value = "1,16")]
    queue_depths: Vec<u32>,
    /// Bytes each case moves per round.
    #[arg(long, default_value = "64M", value_parser = crate::devices::parse_size)]
    bytes: u64,
    /// Size of the hybrid volume's cache; the backing device is four times as large.
    #[arg(long, default_value = "128M", value_parser = crate::devices::parse_size)]
    cache_size: u64,
    /// Interleaved rounds; each row reports the median round.
    #[arg(long, default_value_t = 3)]
    rounds: u32,
    /// Directory for the temporary device files (default: $TMPDIR or /tmp, on disk).
    #[arg(long, value_name = "DIR", conflicts_with = "cache")]
    dir: Option<PathBuf>,
    /// Emulated devices instead of plain files: CACHE_PROFILE:BACKING_PROFILE (e.g. nvme:hdd).
    #[arg(long, value_name = "CACHE:BACKING", conflicts_with = "cache")]
    emulated: Option<String>,
    /// A real cache device or file (formatted for each case; needs --destructive).
    #[arg(long, value_name = "PATH", requires_all = ["backing", "destructive"])]
    cache: Option<PathBuf>,
    /// A real backing device or file (its first 4 x --cache-size bytes are overwritten).
    #[arg(long, value_name = "PATH", requires = "cache")]
    backing: Option<PathBuf>,
    /// Allow --cache and --backing to be overwritten.
    #[arg(long)]
    destructive: bool,
    /// Run only these cases, comma-separated (ratios need their reference case too):
    /// raw-cache-write, raw-cache-read, raw-backing-write, raw-backing-read, write-empty,
    /// read-hits, read-cold, write-over-clean, write-over-dirty, write-destage-bound.
    #[arg(long, value_delimiter = ',', value_enum)]
    cases: Vec<Case>,
    /// Print one JSON object instead of a table.
    #[arg(long)]
    json: bool,
}

/// The cases, in the order they run within a round.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
enum Case {
    RawCacheWrite,
    RawCacheRead,
    RawBackingWrite,
    RawBackingRead,
    WriteEmpty,
    ReadHits,
    ReadCold,
    WriteOverClean,
    WriteOverDirty,
    WriteDestageBound,
}

impl Case {
    const ALL: [Case; 10] = [
        Case::RawCacheWrite,
        Case::RawCacheRead,
        Case::RawBackingWrite,
        Case::RawBackingRead,
        Case::WriteEmpty,
        Case::ReadHits,
        Case::ReadCold,
        Case::WriteOverClean,
        Case::WriteOverDirty,
        Case::WriteDestageBound,
    ];

    fn label(self) -> &'static str {
        match self {
            Case::RawCacheWrite => "raw cache device, write",
            Case::RawCacheRead => "raw cache device, read",
            Case::RawBackingWrite => "raw backing device, write",
            Case::RawBackingRead => "raw backing device, read",
            Case::WriteEmpty => "hybrid, write into an empty cache",
            Case::ReadHits => "hybrid, read cached data (hits)",
            Case::ReadCold => "hybrid, read cold (misses)",
            Case::WriteOverClean => "hybrid, write, cache full of clean data",
            Case::WriteOverDirty => "hybrid, write, dirty data at the log head",
            Case::WriteDestageBound => "hybrid, write, destage-bound",
        }
    }

    /// The row this one is compared with, and issue 13's bar for the ratio.
    fn reference(self) -> Option<(Case, f64)> {
        match self {
            Case::WriteEmpty => Some((Case::RawCacheWrite, 0.8)),
            Case::ReadHits => Some((Case::RawCacheRead, 0.8)),
            Case::ReadCold => Some((Case::RawBackingRead, 0.8)),
            Case::WriteOverClean => Some((Case::WriteEmpty, 0.8)),
            // (Or 0.8 of the backing device's write rate where that is lower: see `goal_met`.)
            Case::WriteOverDirty => Some((Case::WriteEmpty, 0.5)),
            Case::WriteDestageBound => Some((Case::RawBackingWrite, 0.8)),
            _ => None,
        }
    }
}

/// One pass of one case: its rate and every request's latency.
struct Pass {
    mib_per_second: f64,
    latency: Histogram<u64>,
    /// Cold reads: the share of the blocks read that were admitted into the cache.
    admitted: Option<f64>,
}

#[derive(Debug, Serialize)]
struct Row {
    case: Case,
    label: &'static str,
    request_bytes: u64,
    queue_depth: u32,
    /// The median round.
    mib_per_second: f64,
    rounds_mib_per_second: Vec<f64>,
    latency_ms_p99: f64,
    latency_ms_max: f64,
    #[serde(skip_serializing_if = "Option::is_none")]
    reference: Option<Case>,
    #[serde(skip_serializing_if = "Option::is_none")]
    ratio: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    goal: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    goal_met: Option<bool>,
    /// When the cache and backing files share one disk, the rate that disk allows, from the
    /// same run. Writes meeting dirty data: each block written costs a log write, a log read
    /// and a backing write there, `1 / (1/E + 1/Rc + 1/Wb)`, E the empty-cache write at this
    /// size and depth, Rc and Wb the best raw cache read and backing write of the run. Cold
    /// reads: each block read costs a backing read and, if admitted, a cache write,
    /// `1 / (1/Rb + a/Wc)`, Rb the raw backing read at this size and depth, a the share
    /// admitted (`admitted_share`), Wc the best raw cache write.
    #[serde(skip_serializing_if = "Option::is_none")]
    shared_disk_bound_mib_per_second: Option<f64>,
    /// Cold reads: the share of the blocks read that the cache admitted (median round).
    #[serde(skip_serializing_if = "Option::is_none")]
    admitted_share: Option<f64>,
}

#[derive(Debug, Serialize)]
struct SeqReport {
    cache: String,
    backing: String,
    cache_bytes: u64,
    backing_bytes: u64,
    bytes_per_case: u64,
    rounds: u32,
    /// Both devices are files on the same disk (their I/O shares its bandwidth).
    shared_disk: bool,
    rows: Vec<Row>,
}

type Dev = Arc<dyn BlockDevice>;

/// Where the two devices live and how to open them (each case reopens them: a file device
/// holds an exclusive lock while open).
struct Devices {
    cache: PathBuf,
    backing: PathBuf,
    emulated: Option<(&'static Profile, &'static Profile)>,
    _temp: Vec<tempfile::NamedTempFile>,
}

impl Devices {
    fn open(&self, path: &Path, profile: Option<&'static Profile>) -> Result<Dev> {
        Ok(match profile {
            Some(p) => Arc::new(EmulatedDevice::open(path, p)?),
            None => Arc::new(FileDevice::open(path)?),
        })
    }
    fn cache(&self) -> Result<Dev> {
        self.open(&self.cache, self.emulated.map(|e| e.0))
    }
    fn backing(&self) -> Result<Dev> {
        self.open(&self.backing, self.emulated.map(|e| e.1))
    }
}

pub fn run(args: SeqArgs) -> Result<()> {
    const BS: u64 = 4096;
    for &r in &args.request_sizes {
        if r == 0 || !r.is_multiple_of(BS) || r > 64 << 20 {
            bail!("--request-sizes: {r} bytes is not a multiple of 4 KiB between 4 KiB and 64 MiB");
        }
    }
    if args.queue_depths.iter().any(|&q| q == 0 || q > 256) {
        bail!("--queue-depths: each must be between 1 and 256");
    }
    if args.rounds == 0 {
        bail!("--rounds must be at least 1");
    }
    let max_request = *args.request_sizes.iter().max().expect("at least one size");
    if args.cache_size < 32 << 20 || args.bytes < max_request || !args.bytes.is_multiple_of(BS) {
        bail!(
            "--cache-size must be at least 32 MiB and --bytes a multiple of 4 KiB no smaller than the largest request"
        );
    }
    if args.bytes > args.cache_size / 2 {
        bail!(
            "--bytes ({}) must be at most half of --cache-size ({}): the cases that measure a full cache need room to set it up",
            args.bytes,
            args.cache_size
        );
    }
    let backing_bytes = 4 * args.cache_size;
    let devices = match (&args.cache, &args.backing) {
        (Some(c), Some(b)) => {
            for (path, what) in [(c, "is formatted for each case"), (b, "has its first bytes overwritten")] {
                let dev: Dev = Arc::new(FileDevice::open(path)?);
                crate::safety::check_benchmark_target(dev, path, what, args.destructive)?;
            }
            let (cs, bs) = (FileDevice::open(c)?.size_bytes(), FileDevice::open(b)?.size_bytes());
            if cs < args.cache_size || bs < backing_bytes {
                bail!(
                    "--cache needs {} bytes (has {cs}) and --backing {} bytes (has {bs}); lower --cache-size",
                    args.cache_size,
                    backing_bytes
                );
            }
            Devices { cache: c.clone(), backing: b.clone(), emulated: None, _temp: Vec::new() }
        }
        _ => {
            let dir = args.dir.clone().unwrap_or_else(std::env::temp_dir);
            let emulated = match &args.emulated {
                Some(spec) => {
                    let (c, b) = spec
                        .split_once(':')
                        .with_context(|| format!("--emulated {spec}: write CACHE_PROFILE:BACKING_PROFILE"))?;
                    Some((Profile::by_name(c)?, Profile::by_name(b)?))
                }
                None => None,
            };
            let mut temp = Vec::new();
            for len in [args.cache_size, backing_bytes] {
                let f = tempfile::NamedTempFile::new_in(&dir)
                    .with_context(|| format!("creating a temporary device file in {}", dir.display()))?;
                f.as_file().set_len(len)?;
                // Written in full once: reads of a sparse file's holes cost nothing, and first
                // writes pay block allocation that a device does not.
                crate::devices::precondition_file(f.path(), len, args.json)?;
                temp.push(f);
            }
            Devices {
                cache: temp[0].path().to_path_buf(),
                backing: temp[1].path().to_path_buf(),
                emulated,
                _temp: temp,
            }
        }
    };
    let describe = |p: &Path, prof: Option<&Profile>| match prof {
        Some(p2) => format!("emulated:{} on {}", p2.name, p.display()),
        None => p.display().to_string(),
    };

    let shared_disk = devices.emulated.is_none() && same_disk(&devices.cache, &devices.backing);
    let selected = |c: &Case| args.cases.is_empty() || args.cases.contains(c);
    let combos: Vec<(u64, u32)> =
        args.request_sizes.iter().flat_map(|&r| args.queue_depths.iter().map(move |&q| (r, q))).collect();
    // passes[combo][case] = one Pass per round.
    let mut passes: Vec<Vec<Vec<Pass>>> =
        combos.iter().map(|_| Case::ALL.iter().map(|_| Vec::new()).collect()).collect();
    for round in 0..args.rounds {
        for (k, &(request, qd)) in combos.iter().enumerate() {
            let name = format!("round {}/{} {} KiB QD{qd}", round + 1, args.rounds, request / 1024);
            let pb = progress_bar(&name, Duration::from_secs(60), args.json);
            for (c, case) in Case::ALL.iter().enumerate().filter(|(_, c)| selected(c)) {
                pb.set_message(case.label());
                let pass = run_case(*case, &devices, &args, request, qd)
                    .with_context(|| format!("{} ({} KiB, QD{qd})", case.label(), request / 1024))?;
                passes[k][c].push(pass);
            }
            pb.finish_and_clear();
        }
    }

    // The best raw cache read and backing write of the run, at any size and depth: write-back
    // reads the log and writes the backing device in batches of many MiB.
    let best = |case: Case| {
        let c = Case::ALL.iter().position(|x| *x == case).expect("listed");
        passes.iter().filter_map(|p| median_rate(&p[c])).max_by(f64::total_cmp)
    };
    let best_raw = best(Case::RawCacheRead).zip(best(Case::RawBackingWrite));
    let best_cache_write = best(Case::RawCacheWrite);
    let mut rows = Vec::new();
    for (k, &(request, qd)) in combos.iter().enumerate() {
        let median_of = |c: usize| median_rate(&passes[k][c]);
        for (c, case) in Case::ALL.iter().enumerate().filter(|(_, c)| selected(c)) {
            let mut latency = latency_histogram();
            for p in &passes[k][c] {
                latency.add(&p.latency).expect("same histogram bounds");
            }
            let mib = median_of(c).expect("ran");
            let index_of = |r: Case| Case::ALL.iter().position(|x| *x == r).expect("listed");
            let (reference, ratio, goal) = match case.reference() {
                Some((r, goal)) => match median_of(index_of(r)) {
                    Some(base) => (Some(r), Some((mib / base * 1000.0).round() / 1000.0), Some(goal)),
                    None => (None, None, None),
                },
                None => (None, None, None),
            };
            let backing_write = median_of(index_of(Case::RawBackingWrite));
            let admitted_share = {
                let mut v: Vec<f64> = passes[k][c].iter().filter_map(|p| p.admitted).collect();
                v.sort_by(f64::total_cmp);
                v.get(v.len() / 2).map(|a| (a * 1000.0).round() / 1000.0)
            };
            let shared_disk_bound = match (case, shared_disk, median_of(index_of(Case::WriteEmpty)), best_raw) {
                (Case::WriteOverDirty, true, Some(empty), Some((rc, wb))) => {
                    Some(round1(1.0 / (1.0 / empty + 1.0 / rc + 1.0 / wb)))
                }
                (Case::ReadCold, true, _, _) => {
                    match (median_of(index_of(Case::RawBackingRead)), best_cache_write, admitted_share) {
                        (Some(rb), Some(wc), Some(a)) => Some(round1(1.0 / (1.0 / rb + a / wc))),
                        _ => None,
                    }
                }
                _ => None,
            };
            let goal_met = match (case, ratio, goal) {
                // The bar for writes meeting dirty data: half the empty-cache rate, or 0.8 of
                // the backing device's write rate where that is lower.
                (Case::WriteOverDirty, Some(r), Some(g)) => {
                    Some(r >= g || backing_write.is_some_and(|b| mib >= 0.8 * b))
                }
                (_, Some(r), Some(g)) => Some(r >= g),
                _ => None,
            };
            rows.push(Row {
                case: *case,
                label: case.label(),
                request_bytes: request,
                queue_depth: qd,
                mib_per_second: round1(mib),
                rounds_mib_per_second: passes[k][c].iter().map(|p| round1(p.mib_per_second)).collect(),
                latency_ms_p99: round1(latency.value_at_quantile(0.99) as f64 / 1e6 * 10.0) / 10.0,
                latency_ms_max: round1(latency.max() as f64 / 1e6 * 10.0) / 10.0,
                reference,
                ratio,
                goal,
                goal_met,
                shared_disk_bound_mib_per_second: shared_disk_bound,
                admitted_share,
            });
        }
    }
    let report = SeqReport {
        cache: describe(&devices.cache, devices.emulated.map(|e| e.0)),
        backing: describe(&devices.backing, devices.emulated.map(|e| e.1)),
        cache_bytes: args.cache_size,
        backing_bytes,
        bytes_per_case: args.bytes,
        rounds: args.rounds,
        shared_disk,
        rows,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
        return Ok(());
    }
    println!(
        "cache {} ({} MiB), backing {} ({} MiB); {} MiB per case, median of {} rounds",
        report.cache,
        args.cache_size >> 20,
        report.backing,
        backing_bytes >> 20,
        args.bytes >> 20,
        args.rounds
    );
    let mut t = Table::new(&["case", "request", "QD", "MiB/s", "ratio", "goal", "p99 ms", "max ms"]);
    for r in &report.rows {
        t.row(vec![
            r.label.to_string(),
            format!("{} KiB", r.request_bytes / 1024),
            r.queue_depth.to_string(),
            format!("{:.0}", r.mib_per_second),
            r.ratio.map_or(String::new(), |x| format!("{x:.2}")),
            match (r.goal, r.goal_met) {
                (Some(g), Some(true)) => format!(">= {g} ok"),
                (Some(g), _) => format!(">= {g} MISSED"),
                _ => String::new(),
            },
            format!("{:.1}", r.latency_ms_p99),
            format!("{:.1}", r.latency_ms_max),
        ]);
    }
    print!("{}", t.render());
    let bounds = |case: Case| -> Vec<String> {
        report
            .rows
            .iter()
            .filter(|r| r.case == case)
            .filter_map(|r| {
                let bound = r.shared_disk_bound_mib_per_second?;
                let admitted = r.admitted_share.map_or(String::new(), |a| format!(" ({:.0} % admitted)", a * 100.0));
                Some(format!(
                    "{} KiB QD{}{admitted}: {:.0} MiB/s, {:.2} of the bound",
                    r.request_bytes / 1024,
                    r.queue_depth,
                    bound,
                    r.mib_per_second / bound
                ))
            })
            .collect()
    };
    let explain = |case: Case, text: &str, needs: &str| {
        if !report.shared_disk || !report.rows.iter().any(|r| r.case == case) {
            return;
        }
        println!("\n{text}");
        let lines = bounds(case);
        if lines.is_empty() {
            println!("  (run the {needs} cases to see it)");
        }
        for b in lines {
            println!("  {b}");
        }
    };
    explain(
        Case::WriteOverDirty,
        "The cache and backing files share one disk. A write meeting dirty data at the log head\n\
         costs a log write, a log read and a backing write of the block it replaces, all on that\n\
         disk. The run bounds it at 1 / (1/E + 1/Rc + 1/Wb), E the empty-cache write at that size\n\
         and depth, Rc and Wb the best raw cache read and backing write:",
        "write-empty, raw-cache-read and raw-backing-write",
    );
    explain(
        Case::ReadCold,
        "A cold read reads the backing file and writes what the cache admits to the cache file,\n\
         on that same disk. The run bounds it at 1 / (1/Rb + a/Wc), Rb the raw backing read at\n\
         that size and depth, a the share admitted (reads up to 256 KiB are), Wc the best raw\n\
         cache write:",
        "raw-backing-read and raw-cache-write",
    );
    Ok(())
}

/// The median rate of a case's rounds (None if it did not run).
fn median_rate(rounds: &[Pass]) -> Option<f64> {
    let mut v: Vec<f64> = rounds.iter().map(|p| p.mib_per_second).collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied()
}

/// Whether two files lie on the same disk (the same file system device): their I/O then
/// shares one device's bandwidth. Block devices are never "the same disk" here.
fn same_disk(a: &Path, b: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(x), Ok(y)) => x.is_file() && y.is_file() && x.dev() == y.dev(),
        _ => false,
    }
}

/// Runs one case on freshly opened devices (a fresh format for the hybrid cases).
fn run_case(case: Case, devices: &Devices, args: &SeqArgs, request: u64, qd: u32) -> Result<Pass> {
    let bytes = args.bytes;
    let cache_size = args.cache_size;
    match case {
        Case::RawCacheWrite | Case::RawCacheRead | Case::RawBackingWrite | Case::RawBackingRead => {
            let dev = match case {
                Case::RawCacheWrite | Case::RawCacheRead => devices.cache()?,
                _ => devices.backing()?,
            };
            let write = matches!(case, Case::RawCacheWrite | Case::RawBackingWrite);
            let (w, r, f) = (
                |o: u64, b: &mut [u8]| Ok(dev.write_at(o, b)?),
                |o: u64, b: &mut [u8]| Ok(dev.read_at(o, b)?),
                || Ok(dev.flush()?),
            );
            if case == Case::RawCacheRead {
                // The hits case reads data its set-up has just written; so does this one, the
                // same way. (On a virtual disk, data written moments ago reads at another speed
                // than data written long before, either way: the host's cache. Measured here,
                // the same hits read at 0.4 to 1.1 of a reference of older data, depending on
                // a pause before the read.)
                stream(4, 256 << 10, 0, bytes, true, &w, &r, &f)?;
            }
            return stream(qd, request, 0, bytes, write, &w, &r, &f);
        }
        _ => {}
    }
    let (cache, backing) = (devices.cache()?, devices.backing()?);
    create(&*cache, &*backing, &CreateOptions::default()).context("formatting the cache")?;
    // (Sequential reads admitted however long: the set-up fills the cache by reading in order,
    // and the cases measure the data path, not the read-cache policy's scan bypass.)
    let options = VolumeOptions { sequential_bypass_bytes: 0, ..VolumeOptions::default() };
    let volume = Arc::new(Volume::open(cache, backing, Arc::new(MonotonicClock::new()), options)?.0);
    let background = Background::start(&volume);
    let v = &*volume;
    let write = |o: u64, b: &mut [u8]| Ok(v.write(o, b)?);
    let read = |o: u64, b: &mut [u8]| Ok(v.read(o, b)?);
    let flush = || Ok(v.flush()?);
    // Setup steps move data in 256 KiB requests at QD 4 (reads that size are admitted).
    let setup = |from: u64, len: u64, is_write: bool| stream(4, 256 << 10, from, len, is_write, &write, &read, &flush);
    let pass = match case {
        Case::WriteEmpty => stream(qd, request, 0, bytes, true, &write, &read, &flush)?,
        Case::ReadHits => {
            setup(0, bytes, true)?;
            stream(qd, request, 0, bytes, false, &write, &read, &flush)?
        }
        Case::ReadCold => {
            let before = v.status().counters.admitted_blocks;
            let mut pass = stream(qd, request, 2 * cache_size, bytes, false, &write, &read, &flush)?;
            let admitted = v.status().counters.admitted_blocks - before;
            pass.admitted = Some(admitted as f64 / (bytes / u64::from(v.status().block_size)) as f64);
            pass
        }
        Case::WriteOverClean => {
            // Reads fill the whole log with clean blocks (and lap it).
            setup(cache_size, cache_size + cache_size / 4, false)?;
            stream(qd, request, 0, bytes, true, &write, &read, &flush)?
        }
        Case::WriteOverDirty => {
            // 45 % of the cache dirty at the head (below the 70 % high watermark), then reads
            // fill the rest with clean blocks; the measured write then reaches the dirty head.
            let dirty = (cache_size * 45 / 100) / (256 << 10) * (256 << 10);
            setup(0, dirty, true)?;
            setup(2 * cache_size, cache_size - dirty, false)?;
            stream(qd, request, 3 * cache_size, bytes, true, &write, &read, &flush)?
        }
        Case::WriteDestageBound => {
            // A whole cache of new data first, then the measured write: write-back is the limit.
            setup(0, cache_size, true)?;
            stream(qd, request, cache_size, bytes, true, &write, &read, &flush)?
        }
        _ => unreachable!("raw cases handled above"),
    };
    drop(background);
    Ok(pass)
}

type IoFn<'a> = &'a (dyn Fn(u64, &mut [u8]) -> Result<()> + Sync);

/// Moves `len` bytes from `from` in `request`-byte requests, `qd` in flight (threads taking
/// the next request of the stream); a write pass ends with a flush, inside the timing.
#[allow(clippy::too_many_arguments)]
fn stream(
    qd: u32,
    request: u64,
    from: u64,
    len: u64,
    is_write: bool,
    write: IoFn<'_>,
    read: IoFn<'_>,
    flush: &(dyn Fn() -> Result<()> + Sync),
) -> Result<Pass> {
    let requests = len / request;
    let next = AtomicU64::new(0);
    // Each worker's buffer is allocated and filled before the clock starts, and the workers
    // start together (a barrier): at 16 workers of 1 MiB, filling the buffers took as long as
    // a 32 MiB round's I/O, and the rate measured that, not the device. In huge pages, as the
    // engine's record buffers and the frontends' read buffers are, for the raw devices' rows
    // too: the same I/O segments for both sides of a ratio.
    let buffers: Vec<AlignedBuf> = (0..qd)
        .map(|w| {
            let mut buf = AlignedBuf::new_huge(request as usize);
            for (i, b) in buf.iter_mut().enumerate() {
                *b = (i as u32).wrapping_mul(2_654_435_761).wrapping_add(w) as u8;
            }
            buf
        })
        .collect();
    let ready = std::sync::Barrier::new(qd as usize + 1);
    let mut start = Instant::now();
    let histograms: Vec<Result<Histogram<u64>>> = std::thread::scope(|s| {
        let workers: Vec<_> = buffers
            .into_iter()
            .map(|mut buf| {
                let (next, ready) = (&next, &ready);
                s.spawn(move || -> Result<Histogram<u64>> {
                    let mut h = latency_histogram();
                    ready.wait();
                    loop {
                        let k = next.fetch_add(1, Ordering::Relaxed);
                        if k >= requests {
                            return Ok(h);
                        }
                        let offset = from + k * request;
                        let t = Instant::now();
                        if is_write {
                            write(offset, &mut buf)?;
                        } else {
                            read(offset, &mut buf)?;
                        }
                        h.saturating_record(t.elapsed().as_nanos() as u64 + 1);
                    }
                })
            })
            .collect();
        ready.wait();
        start = Instant::now();
        workers.into_iter().map(|w| w.join().expect("benchmark worker panicked")).collect()
    });
    let mut latency = latency_histogram();
    for h in histograms {
        latency.add(&h?).expect("same histogram bounds");
    }
    if is_write {
        let t = Instant::now();
        flush()?;
        latency.saturating_record(t.elapsed().as_nanos() as u64 + 1);
    }
    let secs = start.elapsed().as_secs_f64();
    Ok(Pass { mib_per_second: (requests * request) as f64 / secs / (1 << 20) as f64, latency, admitted: None })
}
