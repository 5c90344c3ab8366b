//! `create`, `status`, `check` and `flush`: the commands that format and inspect a cache.

use crate::control::{self, ServerReport, StatusReply};
use crate::devices::{parse_percent, parse_size, DeviceSpec};
use crate::report::progress;
use crate::safety::{self, Contents};
use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::HumanBytes;
use std::sync::Arc;
use tiercache_device::MonotonicClock;
use tiercache_engine::{create, read_superblock, CreateOptions, Volume, VolumeOptions};

#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  tiercache create --cache /dev/nvme0n1p1 --backing /dev/md0
  tiercache create --cache /var/cache.img --cache-size 16G --backing /dev/sdb
  tiercache create --cache emulated:optane:/tmp/c.img --cache-size 1G --backing emulated:usb-disk:/tmp/b.img

Only the cache device is written: the backing device keeps its data and layout (bolt-on).")]
pub struct CreateArgs {
    /// The cache device: PATH, or emulated:PROFILE:PATH. A missing file is created with --cache-size.
    #[arg(long, value_name = "DEVICE")]
    cache: String,
    /// The backing device holding the data of record (never written by create).
    #[arg(long, value_name = "DEVICE")]
    backing: String,
    /// Create the cache file with this size if it does not exist (e.g. 16G).
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    cache_size: Option<u64>,
    /// The cache block size in bytes (a power of two, 4096 to 65536).
    #[arg(long, default_value_t = 4096)]
    block_size: u32,
    /// Reclaim granularity (e.g. 1M).
    #[arg(long, value_name = "SIZE", default_value = "1M", value_parser = parse_size)]
    segment_size: u64,
    /// The destager stops writing back below this much dirty data (percent of the cache's log:
    /// the cache less its probation ring and checkpoints, as `status` shows).
    #[arg(long, value_name = "PERCENT", default_value = "30", value_parser = parse_percent)]
    dirty_low: u16,
    /// The destager starts writing back above this much dirty data (percent of the cache's log).
    #[arg(long, value_name = "PERCENT", default_value = "70", value_parser = parse_percent)]
    dirty_high: u16,
    /// The share of the cache given to the read cache's probation ring, where a block read
    /// once waits and only a block read again there moves on into the log (S3-FIFO's small
    /// queue: one-time reads never push out the blocks read again). 0: none.
    #[arg(long, value_name = "PERCENT", default_value = "10", value_parser = parse_percent)]
    probation_percent: u16,
    /// Format the cache device even though it holds something (a file system, a partition
    /// table, a tiercache cache: all of it is lost), and accept a backing device that looks
    /// like a swapped argument (it holds a tiercache cache, or is no larger than the cache).
    #[arg(long)]
    force: bool,
    /// Leave a cache file created by --cache-size sparse instead of writing it in full once
    /// (faster to create; its first pass through the log then pays file-system allocation).
    #[arg(long)]
    sparse: bool,
    /// Print the result as JSON (for scripts) instead of text.
    #[arg(long)]
    json: bool,
}

pub fn create_cmd(args: CreateArgs) -> Result<()> {
    let cache_spec = DeviceSpec::parse(&args.cache)?;
    let backing_spec = DeviceSpec::parse(&args.backing)?;
    let backing = backing_spec.open("backing")?;
    // Options checked before anything is created: a cache file of --cache-size is written in
    // full, which for a large one takes minutes.
    if !args.block_size.is_power_of_two() || !(4096..=65536).contains(&args.block_size) {
        bail!("--block-size {} is not a power of two from 4096 to 65536", args.block_size);
    }
    if args.dirty_low > args.dirty_high {
        bail!(
            "--dirty-low {} % is above --dirty-high {} %: write-back starts above the high watermark and stops at the low one",
            f64::from(args.dirty_low) / 10.0,
            f64::from(args.dirty_high) / 10.0
        );
    }
    if !args.segment_size.is_multiple_of(u64::from(args.block_size)) {
        bail!("--segment-size {} is not a multiple of --block-size {}", args.segment_size, args.block_size);
    }
    let segment_blocks = u32::try_from(args.segment_size / u64::from(args.block_size)).context("--segment-size")?;
    let path = cache_spec.path();
    // A likely swap of arguments, refused before anything is created or written.
    let backing_name = backing_spec.path().display();
    if !args.force {
        if let found @ (Contents::Tiercache { .. } | Contents::TiercacheUnreadable { .. }) =
            safety::probe(&*backing, backing_spec.path())?
        {
            bail!(
                "backing device {backing_name} holds {}: are --cache and --backing swapped? (pass --force if it really is the backing device)",
                found.describe()
            );
        }
        let cache_bytes = match (std::fs::metadata(path), args.cache_size) {
            (Err(_), Some(size)) => Some(size),
            (Ok(_), _) => Some(cache_spec.open("cache")?.size_bytes()),
            (Err(_), None) => None,
        };
        if let Some(cache_bytes) = cache_bytes.filter(|&c| backing.size_bytes() <= c) {
            bail!(
                "backing device {backing_name} ({}) is no larger than the cache ({}): are --cache and --backing swapped? (pass --force to cache it anyway)",
                HumanBytes(backing.size_bytes()),
                HumanBytes(cache_bytes)
            );
        }
    }
    let mut created = false;
    match (std::fs::metadata(path), args.cache_size) {
        (Err(_), Some(size)) => {
            // Check the layout before creating anything.
            tiercache_format::Layout::compute(size, args.block_size, segment_blocks)
                .map_err(|e| anyhow::anyhow!("--cache-size {size}: {e}"))?;
            let f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .open(path)
                .with_context(|| format!("creating {}", path.display()))?;
            created = true;
            if let Err(e) = f.set_len(size) {
                drop(f);
                let _ = std::fs::remove_file(path); // leave nothing behind
                return Err(e).with_context(|| format!("--cache-size {size}: sizing {}", path.display()));
            }
            drop(f);
            if !args.sparse {
                if let Err(e) = crate::devices::precondition_file(path, size, args.json) {
                    let _ = std::fs::remove_file(path);
                    return Err(e);
                }
            }
        }
        (Err(_), None) => {
            bail!("cache device {}: no such file; give --cache-size to create a file of that size", path.display())
        }
        (Ok(m), Some(size)) if m.is_file() && m.len() != size => bail!(
            "--cache-size {size} given, but {} exists with {} bytes; omit --cache-size to use it as it is",
            path.display(),
            m.len()
        ),
        _ => {}
    }
    let result = (|| -> Result<_> {
        let cache = cache_spec.open("cache")?;
        // (A file this command just created holds nothing yet.)
        let found = if created { Contents::Unrecognized } else { safety::probe(&*cache, path)? };
        match found {
            _ if args.force => {}
            Contents::Tiercache { .. } => bail!(
                "cache device {} already holds {}; formatting it loses its cached data, including dirty blocks never written back; run `tiercache flush` first, or pass --force",
                path.display(),
                found.describe()
            ),
            // A cache of another format version (or with a damaged superblock) may still hold
            // dirty data: formatting it needs the same explicit --force.
            Contents::TiercacheUnreadable { .. } => bail!(
                "cache device {} holds {}; formatting it loses whatever it caches; pass --force to format it anyway",
                path.display(),
                found.describe()
            ),
            Contents::Foreign { .. } => bail!(
                "cache device {} holds {}; formatting it as a cache destroys it; pass --force to format it anyway",
                path.display(),
                found.describe()
            ),
            Contents::Unrecognized => {}
        }
        let options = CreateOptions {
            block_size: args.block_size,
            segment_blocks,
            dirty_low_permille: args.dirty_low,
            dirty_high_permille: args.dirty_high,
            probation_permille: args.probation_percent,
            // Absolute, so that `status` from another directory names it (symbolic links such
            // as /dev/disk/by-id/... are kept: they are the stable names).
            backing_path: std::path::absolute(backing_spec.path())
                .unwrap_or_else(|_| backing_spec.path().to_path_buf())
                .display()
                .to_string(),
            uuid: None,
            created_unix_secs: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        };
        Ok(create(&*cache, &*backing, &options)?)
    })();
    let sb = match result {
        Ok(sb) => sb,
        Err(e) => {
            if created {
                let _ = std::fs::remove_file(path); // leave nothing behind
            }
            return Err(e);
        }
    };
    let l = sb.layout;
    let log_bytes = l.log_blocks * u64::from(l.block_size);
    let index_bytes = tiercache_engine::index_ram_bytes(l.log_blocks);
    if args.json {
        let v = serde_json::json!({
            "cache": path.display().to_string(),
            "backing": backing_spec.path().display().to_string(),
            "uuid": tiercache_format::uuid_hex(&sb.uuid),
            "block_size": l.block_size,
            "cache_size_bytes": sb.cache_size_bytes,
            "log_bytes": log_bytes,
            "probation_ring_bytes": l.probation_blocks * u64::from(l.block_size),
            "backing_size_bytes": sb.backing_size_bytes,
            "index_ram_bytes": index_bytes,
        });
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else {
        println!(
            "formatted {} as a write-back cache for {}: {} of cache blocks ({} blocks of {} bytes) and a {} probation ring for blocks read once, index RAM about {}",
            path.display(),
            backing_spec.path().display(),
            HumanBytes(log_bytes),
            l.log_blocks,
            l.block_size,
            HumanBytes(l.probation_blocks * u64::from(l.block_size)),
            HumanBytes(index_bytes)
        );
    }
    Ok(())
}

#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  tiercache status --cache /var/tc/cache.img               cached, dirty, hit ratio, lost blocks
  tiercache status --cache /dev/nvme0n1p4 --watch 2        a served volume, again every 2 s
  tiercache status --cache /dev/nvme0n1p4 --json | jq .dirty_bytes
  tiercache status --cache c.img --control /run/tc/ctl.sock   a server started with --control

Reads the cache device only, read-only; while a server holds it, asks the server.")]
pub struct StatusArgs {
    #[command(flatten)]
    target: control::CacheArgs,
    /// Print the result as JSON (for scripts) instead of text (with --watch: one JSON
    /// object per line).
    #[arg(long)]
    json: bool,
    /// Show it again every SECONDS until interrupted (a served volume's rates move).
    #[arg(long, value_name = "SECONDS", num_args = 0..=1, default_missing_value = "2")]
    watch: Option<f64>,
}

pub fn status_cmd(args: StatusArgs) -> Result<()> {
    let Some(period) = args.watch else {
        return print_or_quit(&status_once(&args, false)?).map(|_| ());
    };
    if !(0.1..=3600.0).contains(&period) {
        bail!("--watch {period}: the period must be between 0.1 and 3600 seconds");
    }
    let tty = std::io::IsTerminal::is_terminal(&std::io::stdout());
    loop {
        let mut out = String::new();
        if tty && !args.json {
            out.push_str("\x1b[2J\x1b[H"); // clear the screen, cursor home
        }
        // A server stopping between two rounds holds the device for a moment after its control
        // socket is gone: asked again once the device is free, the volume reads offline.
        let report = status_once(&args, true).or_else(|e| {
            std::thread::sleep(std::time::Duration::from_millis(500));
            status_once(&args, true).map_err(|_| e.context("while watching: the server stopped or went away"))
        })?;
        out.push_str(&report);
        if !tty && !args.json {
            out.push('\n');
        }
        if !print_or_quit(&out)? {
            return Ok(()); // the reader went away (`| head`)
        }
        std::thread::sleep(std::time::Duration::from_secs_f64(period));
    }
}

/// Writes to stdout; false if the reader went away (a closed pipe is not an error here).
fn print_or_quit(text: &str) -> Result<bool> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(false),
        Err(e) => Err(e.into()),
    }
}

/// The status report as text (or JSON), for `status_cmd` to print.
fn status_once(args: &StatusArgs, compact: bool) -> Result<String> {
    let spec = args.target.spec()?;
    let print_json = |v: &serde_json::Value| -> Result<String> {
        Ok(if compact { format!("{v}\n") } else { format!("{}\n", serde_json::to_string_pretty(v)?) })
    };
    let (s, server) = match spec.open_read_only("cache") {
        Ok(cache) => (
            Volume::inspect(cache, None, Arc::new(MonotonicClock::new()))
                .map_err(|e| safety::explain_not_a_cache(e.into(), spec.path(), None))?
                .status(),
            None,
        ),
        Err(e) if is_locked(&e) => {
            // A server holds the device: ask it.
            let socket = args.target.socket(&spec)?;
            let reply = control::query_status(&socket).with_context(|| args.target.unanswered(&spec, &socket))?;
            if args.json {
                return print_json(&serde_json::to_value(&reply)?);
            }
            let StatusReply { volume, server } = reply;
            (volume, Some(server))
        }
        Err(e) => return Err(e),
    };
    if args.json {
        return print_json(&serde_json::to_value(&s)?);
    }
    // Key-value lines, values left-aligned after the longest key.
    let mut rows: Vec<(&str, String)> = server.as_ref().map(server_rows).unwrap_or_default();
    let pct =
        |a: u64, b: u64| if b == 0 { "0.0 %".to_string() } else { format!("{:.1} %", 100.0 * a as f64 / b as f64) };
    rows.extend([
        ("mode", s.mode.to_string()),
        ("state", s.failure.clone().map_or(s.state.to_string(), |f| format!("{}: {f}", s.state))),
        ("backing (at format)", s.backing_path.clone()),
        (
            "backing identified by",
            match s.fingerprint_hash.as_str() {
                "crc32c" => "CRC-32C of its signature blocks (made before 2026-11-30: blind to an ext4 superblock changed outside the cache; flush, then create --force, for XXH3)".to_string(),
                "" => "-".to_string(),
                h => format!("{} of its signature blocks", h.to_uppercase()),
            },
        ),
        ("cache size", HumanBytes(s.cache_size_bytes).to_string()),
        (
            "log size",
            format!(
                "{} (what data is cached in, and the watermarks' base; the rest: the probation ring, checkpoints)",
                HumanBytes(s.log_bytes)
            ),
        ),
        ("backing size", HumanBytes(s.backing_size_bytes).to_string()),
        ("block size", s.block_size.to_string()),
        (
            "cached",
            format!(
                "{} ({} blocks, {} of the log)",
                HumanBytes(s.cached_bytes),
                s.cached_blocks,
                pct(s.cached_bytes, s.log_bytes)
            ),
        ),
        (
            "dirty",
            format!(
                "{} ({} blocks, {} of the log)",
                HumanBytes(s.dirty_bytes),
                s.dirty_blocks,
                pct(s.dirty_bytes, s.log_bytes)
            ),
        ),
        (
            "occupancy",
            format!(
                "{} clean, {} dirty; {} hot (read again since cached, or preloaded: {})",
                pct(s.cached_blocks - s.dirty_blocks, s.log_bytes / u64::from(s.block_size)),
                pct(s.dirty_blocks, s.log_bytes / u64::from(s.block_size)),
                pct(s.hot_blocks, s.log_bytes / u64::from(s.block_size)),
                match s.eviction {
                    tiercache_engine::Eviction::Fifo => "the fifo policy does not keep them".to_string(),
                    other => format!("the {} policy keeps them", other.name()),
                },
            ),
        ),
        (
            "probation ring",
            if s.probation_ring_blocks == 0 {
                "none (misses enter the log)".to_string()
            } else {
                format!(
                    "{} of {} blocks hold blocks read once lately ({} read again moved on into the log)",
                    s.probation_blocks, s.probation_ring_blocks, s.counters.promoted_blocks
                )
            },
        ),
        (
            "dirty watermarks",
            format!(
                "{:.1} % / {:.1} %",
                f64::from(s.dirty_low_permille) / 10.0,
                f64::from(s.dirty_high_permille) / 10.0
            ),
        ),
        (
            "oldest dirty",
            match s.oldest_dirty_age_seconds {
                Some(a) => format!("{a:.1} s"),
                None if s.dirty_blocks > 0 => "unknown (written before this process opened the cache)".into(),
                None => "-".into(),
            },
        ),
        (
            "admission",
            match s.frequency_gate {
                None => "the policy admits every ghost's miss into the log".to_string(),
                Some(gate) => format!(
                    "{}; {} misses entered the log while it filled; {} ghosts refused for a victim read as often; the choice changed {} times",
                    if gate { "frequency gate on (a simulation of both rules says it misses less now)" } else { "frequency gate off" },
                    s.counters.filling_admitted_blocks,
                    s.counters.gate_refused_blocks,
                    s.policy_switches
                ),
            },
        ),
        ("read hit ratio", s.read_hit_ratio.map_or("-".into(), |r| format!("{:.1} % since start", 100.0 * r))),
        (
            "batched hit reads",
            format!("{} reads found their hits in several runs of the log and read them together", s.counters.batched_cache_reads),
        ),
        (
            "read misses",
            format!(
                "{} blocks admitted; left out: {} of long sequential streams, {} of reads over the admission limit, {} while staging was full",
                s.counters.admitted_blocks,
                s.counters.bypassed_blocks_sequential,
                s.counters.bypassed_blocks_size,
                s.counters.bypassed_blocks_busy
            ),
        ),
        ("lost blocks", s.lost_blocks.to_string()),
        (
            "dirty at the head",
            format!(
                "{} reclaims copied dense dirty windows forward ({} judged over the lap), {} wrote them back (longest wait for a batch under way: {:.1} ms; batches of {} blocks now, {} in the background, {} when gentle; {} batches ran gently, yielding the devices to writers); per block: write-back {}, copy {}",
                s.counters.dense_copy_forwards,
                s.counters.dense_copy_throughs,
                s.counters.reclaim_write_backs,
                s.counters.reclaim_destage_wait_max_us as f64 / 1000.0,
                s.write_back_batch_blocks,
                s.background_batch_blocks,
                s.gentle_batch_blocks,
                s.counters.gentle_write_back_batches,
                s.reclaim_write_back_us_per_block.map_or("not yet measured".into(), |us| format!("{us:.1} µs")),
                s.reclaim_copy_us_per_block.map_or("not yet measured".into(), |us| format!("{us:.1} µs")),
            ),
        ),
        (
            "index RAM",
            format!(
                "{} ({:.1} bytes per cached block), and {} for the eviction policy's ghost queue{}",
                HumanBytes(s.index_ram_bytes),
                s.index_ram_bytes_per_cached_block,
                HumanBytes(s.ghost_ram_bytes),
                if s.admission_ram_bytes > 0 {
                    format!(", {} for its frequency sketch and simulations", HumanBytes(s.admission_ram_bytes))
                } else {
                    String::new()
                }
            ),
        ),
        ("log used", format!("{:.1} %", s.log_used_permille as f64 / 10.0)),
    ]);
    let width = rows.iter().map(|(k, _)| k.len()).max().unwrap_or(0);
    Ok(rows.iter().map(|(k, v)| format!("{k:<width$}  {v}\n")).collect())
}

/// The server's rows of `status`: pid, uptime, endpoints, clients, recent rates.
fn server_rows(v: &ServerReport) -> Vec<(&'static str, String)> {
    let up = v.uptime_seconds;
    let mut rows = vec![
        (
            "served by",
            format!(
                "pid {}, up {}h{:02}m{:02}s{}",
                v.pid,
                up / 3600,
                up / 60 % 60,
                up % 60,
                if v.replayed_at_start > 0 {
                    format!(
                        "; started after an unclean stop ({} log records replayed, every flushed write back)",
                        v.replayed_at_start
                    )
                } else {
                    String::new()
                }
            ),
        ),
        ("endpoints", v.endpoints.join(", ")),
        ("NBD clients", v.nbd_clients.to_string()),
    ];
    for (r, name) in [(&v.rates_10s, "last 10 s"), (&v.rates_1min, "last minute")] {
        let Some(r) = r else {
            rows.push((name, "-".to_string()));
            continue;
        };
        // (The rates are rounded to one decimal.)
        rows.push((
            name,
            format!(
                "read {:.1} req/s ({:.1} MiB/s, hits {}), write {:.1} req/s ({:.1} MiB/s), flush {:.1}/s, written back {:.1} MiB/s",
                r.read_requests_per_second,
                r.read_mib_per_second,
                r.read_hit_ratio.map_or("-".into(), |h| format!("{:.1} %", 100.0 * h)),
                r.write_requests_per_second,
                r.write_mib_per_second,
                r.flush_requests_per_second,
                r.written_back_mib_per_second,
            ),
        ));
        let lat: Vec<String> = ["read", "write", "flush"]
            .iter()
            .filter_map(|k| {
                let l = r.latency_us.get(*k)?.as_ref()?;
                Some(format!("{k} p50 {} µs, p99 {} µs", l.p50, l.p99))
            })
            .collect();
        if !lat.is_empty() {
            rows.push(("  latency", lat.join("; ")));
        }
    }
    rows
}

/// The two devices of a volume, as the commands that attach both take them.
#[derive(Debug, Args)]
pub struct VolumeDevices {
    /// The cache device: PATH, or emulated:PROFILE:PATH.
    #[arg(long, value_name = "DEVICE")]
    cache: String,
    /// The backing device the cache was created for.
    #[arg(long, value_name = "DEVICE")]
    backing: String,
}

impl VolumeDevices {
    /// Both devices, read-only (what `check` needs: it writes nothing).
    fn open_read_only(
        &self,
    ) -> Result<(Arc<dyn tiercache_device::BlockDevice>, Arc<dyn tiercache_device::BlockDevice>)> {
        Ok((
            DeviceSpec::parse(&self.cache)?.open_read_only("cache")?,
            DeviceSpec::parse(&self.backing)?.open_read_only("backing")?,
        ))
    }
}

#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  tiercache check --cache /var/tc/cache.img --backing /dev/sdb
  tiercache check --cache /var/tc/cache.img --backing /dev/sdb --json

Verifies the log chain, every cached block's checksum, and clean blocks against the backing
device; exits non-zero naming the problems. Opens both devices read-only and writes nothing;
needs them to itself (stop the server).")]
pub struct CheckArgs {
    #[command(flatten)]
    devices: VolumeDevices,
    /// Print the result as JSON (for scripts) instead of text.
    #[arg(long)]
    json: bool,
}

pub fn check_cmd(args: CheckArgs) -> Result<()> {
    let (cache, backing) = match args.devices.open_read_only() {
        Ok(devices) => devices,
        Err(e) if is_locked(&e) => {
            // Say who holds it and what to do instead.
            let spec = DeviceSpec::parse(&args.devices.cache)?;
            let server = control::socket_of(&spec, None)
                .ok()
                .and_then(|socket| control::query_status(&socket))
                .map(|reply| reply.server.pid);
            match server {
                Some(pid) => bail!(
                    "{} is served by tiercache (pid {pid}): `check` reads every block and needs the devices to itself, so it does not run under a live volume; `tiercache status --cache {}` shows the live state (lost blocks included), and stopping the server first lets `check` run",
                    spec.path().display(),
                    args.devices.cache
                ),
                None => return Err(e),
            }
        }
        Err(e) => return Err(e),
    };
    let volume = Volume::inspect(Arc::clone(&cache), Some(Arc::clone(&backing)), Arc::new(MonotonicClock::new()))
        .map_err(|e| {
            let (c, b) = (DeviceSpec::parse(&args.devices.cache), DeviceSpec::parse(&args.devices.backing));
            match (c, b) {
                (Ok(c), Ok(b)) => safety::explain_not_a_cache(e.into(), &c.path, Some((&b.path, &*backing))),
                _ => e.into(),
            }
        })?;
    let pb = progress("checking", args.json);
    let report = volume.verify(true, |done, total| {
        pb.set_length(total);
        pb.set_position(done);
    })?;
    pb.finish_and_clear();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "{} log records, {} cached blocks ({} dirty): {} verified, {} bad clean, {} bad dirty, {} clean blocks differing from backing",
            report.log_records,
            report.cached_blocks,
            report.dirty_blocks,
            report.verified_blocks,
            report.bad_clean_blocks,
            report.bad_dirty_blocks,
            report.clean_blocks_differing_from_backing
        );
        for p in &report.problems {
            println!("problem: {p}");
        }
    }
    if !report.is_clean() {
        bail!("the cache is inconsistent ({} problems)", report.problems.len());
    }
    Ok(())
}

#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  tiercache flush --cache /dev/nvme0n1p4          the volume is served: the server writes back, online
  tiercache flush --cache cache.img --backing back.img   offline, naming the backing device
  tiercache flush --cache cache.img --json        machine-readable result

On a served volume the server writes back every block dirty when the flush starts, at about
half the devices' time, while it keeps serving; Ctrl-C stops it, and what was written back
stays clean (run it again to continue). Exits non-zero, naming them, if any block is lost.")]
pub struct FlushArgs {
    #[command(flatten)]
    target: control::CacheArgs,
    /// The backing device (default: the path recorded when the cache was created). Not
    /// needed when the volume is served.
    #[arg(long, value_name = "DEVICE")]
    backing: Option<String>,
    /// Print the result as JSON (for scripts) instead of text.
    #[arg(long)]
    json: bool,
}

pub fn flush_cmd(args: FlushArgs) -> Result<()> {
    let spec = args.target.spec()?;
    let started = std::time::Instant::now();
    let cache = match spec.open("cache") {
        Ok(cache) => cache,
        Err(e) if is_locked(&e) => return flush_online(&args, &spec, started),
        Err(e) => return Err(e),
    };
    let backing_spec = match &args.backing {
        Some(b) => b.clone(),
        None => {
            let sb = read_superblock(&*cache).map_err(|e| safety::explain_not_a_cache(e.into(), spec.path(), None))?;
            if sb.backing_path.is_empty() {
                bail!("{} does not record its backing device; name it with --backing", spec.path().display());
            }
            sb.backing_path.clone()
        }
    };
    let backing_device = DeviceSpec::parse(&backing_spec)?;
    let backing = backing_device.open("backing")?;
    let (volume, _) =
        Volume::open(cache, Arc::clone(&backing), Arc::new(MonotonicClock::new()), VolumeOptions::default())
            .map_err(|e| safety::explain_not_a_cache(e.into(), spec.path(), Some((&backing_device.path, &*backing))))?;
    let dirty = volume.status().dirty_blocks;
    let pb = progress("writing back", args.json);
    pb.set_length(dirty);
    let r = volume.flush_all(|done, _remaining| pb.set_position(done));
    pb.finish_and_clear();
    r?;
    report_flush(&args, dirty, volume.status().dirty_blocks, started, false)
}

/// `flush` of a served volume: the server does it, this process shows its progress.
fn flush_online(args: &FlushArgs, spec: &DeviceSpec, started: std::time::Instant) -> Result<()> {
    let socket = args.target.socket(spec)?;
    if !socket.exists() {
        bail!("{}", args.target.unanswered(spec, &socket));
    }
    let pb = progress("writing back", args.json);
    let written = control::request_flush(&socket, |done, remaining| {
        pb.set_length(done + remaining);
        pb.set_position(done);
    })
    .with_context(|| {
        format!("{} is served; asking its server to write back through {}", spec.path().display(), socket.display())
    })?;
    pb.finish_and_clear();
    let dirty = control::query_status(&socket).map(|reply| reply.volume.dirty_blocks);
    report_flush(args, written, dirty.unwrap_or(0), started, true)
}

fn report_flush(
    args: &FlushArgs,
    written: u64,
    dirty_now: u64,
    started: std::time::Instant,
    online: bool,
) -> Result<()> {
    let seconds = started.elapsed().as_secs_f64();
    if args.json {
        let v = serde_json::json!({"written_back_blocks": written, "dirty_blocks": dirty_now, "seconds": seconds, "online": online});
        println!("{}", serde_json::to_string_pretty(&v)?);
    } else if online {
        println!(
            "wrote back {written} dirty blocks in {seconds:.1} s while serving; everything dirty when the flush began is on the backing device ({dirty_now} blocks written since are dirty)"
        );
    } else {
        println!("wrote back {written} dirty blocks in {seconds:.1} s; the backing device now holds all data");
    }
    Ok(())
}

fn is_locked(e: &anyhow::Error) -> bool {
    e.chain().any(|c| {
        matches!(
            c.downcast_ref::<tiercache_device::DeviceError>(),
            Some(tiercache_device::DeviceError::AlreadyOpen { .. })
        )
    })
}

#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  tiercache trace --cache /dev/nvme0n1p4 start /var/tmp/mysql.csv.gz
  tiercache trace --cache /dev/nvme0n1p4 stop
  tiercache replay --trace /var/tmp/mysql.csv.gz --cache-size 1%,5%,10%,25% --plot mrc.svg

The running server writes the file (gzip'd CSV, time_ns,op,offset_bytes,length_bytes), so its
path must be writable by the server. `serve --record-trace FILE` records from the start instead.")]
pub struct TraceArgs {
    #[command(flatten)]
    target: control::CacheArgs,
    /// Print the reply as JSON (before or after the action: `trace --cache C stop --json`).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    action: TraceAction,
}

#[derive(Debug, clap::Subcommand)]
enum TraceAction {
    /// Start recording every request into FILE (replacing a recording in progress).
    Start { file: std::path::PathBuf },
    /// Stop recording and finish the file.
    Stop,
}

pub fn trace_cmd(args: TraceArgs) -> Result<()> {
    let spec = args.target.spec()?;
    let socket = args.target.socket(&spec)?;
    let file = match &args.action {
        TraceAction::Start { file } => Some(file.as_path()),
        TraceAction::Stop => None,
    };
    let reply = control::request_trace(&socket, file).with_context(|| {
        format!("asking the server of {} (control socket {})", spec.path().display(), socket.display())
    })?;
    if args.json {
        println!("{}", serde_json::to_string_pretty(&reply)?);
    } else if reply.recording {
        println!("recording a trace into {}", reply.path);
    } else {
        println!("trace of {} requests written to {}", reply.requests.unwrap_or(0), reply.path);
    }
    Ok(())
}
