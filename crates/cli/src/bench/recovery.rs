//! `tiercache bench recovery`: how long a restart after SIGKILL takes. A child process fills
//! a cache on real files (O_DIRECT) with `--cached` bytes of blocks, writes back all but
//! `--dirty-percent` of them, keeps writing, and is killed with SIGKILL; then the volume is
//! opened (recovery: superblock, checkpoint, log tail) and timed.
//!
//! How it scales: the checkpoint is 16 bytes per cached block (0.4 % of the cache), and the
//! replayed tail is at most the log written since the last checkpoint (at most a quarter of
//! the log); both are sequential reads. A linear projection of one small run says little.

use crate::report::Table;
use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;
use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tiercache_device::{BlockDevice, FileDevice, MonotonicClock};
use tiercache_engine::{Volume, VolumeOptions};

#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  tiercache bench recovery --cached 1G --dirty-percent 50      files in the temporary directory
  tiercache bench recovery --dir /mnt/fast --json")]
pub struct RecoveryArgs {
    /// Bytes of blocks the cache holds when the writer is killed.
    #[arg(long, default_value = "1G", value_parser = crate::devices::parse_size)]
    cached: u64,
    /// Share of the cached blocks left dirty.
    #[arg(long, default_value_t = 50)]
    dirty_percent: u64,
    /// Directory for the cache and backing files (real files, O_DIRECT).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Print the result as JSON (for scripts) instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Serialize)]
struct RecoveryResult {
    cached_bytes: u64,
    cache_size_bytes: u64,
    recovered_blocks: u64,
    recovered_dirty_blocks: u64,
    replayed_records: u64,
    recovery_seconds: f64,
    /// Bytes recovery read: the checkpoint's entries plus the replayed log tail (an estimate
    /// from the replayed records, whose size the open report does not give).
    checkpoint_bytes: u64,
}

pub fn run(args: RecoveryArgs) -> Result<()> {
    let dir = match &args.dir {
        Some(d) => tempfile::tempdir_in(d)?,
        None => tempfile::tempdir()?,
    };
    let bs = 4096u64;
    let fill = args.cached / bs;
    // Room for the filled blocks plus the log the writer keeps producing.
    let cache_size = (args.cached * 3 / 2).max(64 << 20) / (1 << 20) * (1 << 20);
    let cache = dir.path().join("cache.img");
    let backing = dir.path().join("backing.img");
    std::fs::File::create(&cache)?.set_len(cache_size)?;
    std::fs::File::create(&backing)?.set_len(args.cached * 2)?;
    let progress = super::fsync::progress_bar("filling the cache", Duration::from_secs(1), args.json);
    progress.set_length(0);
    progress.enable_steady_tick(Duration::from_millis(200));
    let mut child = Command::new(std::env::current_exe()?)
        .args([
            "debug-load",
            "--create",
            "--fill",
            &fill.to_string(),
            "--dirty-percent",
            &args.dirty_percent.to_string(),
        ])
        .args(["--blocks", &fill.to_string(), "--flush-every", "32"])
        .args(["--cache", cache.to_str().context("path")?, "--backing", backing.to_str().context("path")?])
        .stdout(Stdio::piped())
        .spawn()
        .context("starting the writer")?;
    let mut lines = BufReader::new(child.stdout.take().context("stdout")?).lines();
    let ready = lines.next().transpose()?.unwrap_or_default();
    if !ready.starts_with("ready") {
        let _ = child.kill();
        bail!("the writer did not get ready (it printed {ready:?})");
    }
    // Let it write (and flush) a little more, so the log tail holds fresh records.
    std::thread::sleep(Duration::from_millis(300));
    child.kill().context("SIGKILL")?;
    child.wait()?;
    progress.finish_and_clear();

    let c: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(&cache)?);
    let b: Arc<dyn BlockDevice> = Arc::new(FileDevice::open(&backing)?);
    let started = Instant::now();
    let (volume, report) = Volume::open(c, b, Arc::new(MonotonicClock::new()), VolumeOptions::default())?;
    let seconds = started.elapsed().as_secs_f64();
    drop(volume);
    let result = RecoveryResult {
        cached_bytes: args.cached,
        cache_size_bytes: cache_size,
        recovered_blocks: report.recovered_blocks,
        recovered_dirty_blocks: report.recovered_dirty_blocks,
        replayed_records: report.replayed_records,
        recovery_seconds: (seconds * 1000.0).round() / 1000.0,
        checkpoint_bytes: report.recovered_blocks * tiercache_format::constants::CHECKPOINT_ENTRY_SIZE as u64,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&result)?);
    } else {
        let mut t = Table::new(&["", ""]);
        for (k, v) in [
            ("cached when killed", indicatif::HumanBytes(result.cached_bytes).to_string()),
            ("recovered blocks", format!("{} ({} dirty)", result.recovered_blocks, result.recovered_dirty_blocks)),
            ("log records replayed", result.replayed_records.to_string()),
            ("recovery time", format!("{:.3} s", result.recovery_seconds)),
            ("checkpoint read", indicatif::HumanBytes(result.checkpoint_bytes).to_string()),
        ] {
            t.row(vec![k.to_string(), v]);
        }
        print!("{}", t.render().lines().skip(1).map(|l| format!("{l}\n")).collect::<String>());
    }
    Ok(())
}
