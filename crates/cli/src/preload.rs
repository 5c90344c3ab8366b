//! `tiercache preload`: warm a served volume's cache with byte ranges, or with the files of a
//! file system that lives on the volume (their extents, through FIEMAP, are volume offsets),
//! read at the backing device's sequential speed and kept as hot (volume/preload.rs).
//!
//! A file's offsets are the volume's only if its file system sits on the volume: on a loop
//! device over the served FUSE file (the way this machine reaches a volume), whose backing file
//! and offset sysfs names, possibly in a partition of it. That is checked; a file system on a
//! device this tool cannot trace back (the kernel's NBD client, ublk) needs
//! `--device-is-volume`, the operator's word for it.

use crate::control;
use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{HumanBytes, ProgressBar, ProgressStyle};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

#[derive(Debug, Args)]
#[command(after_help = "\
Examples:
  tiercache preload --cache cache.img /mnt/db/mysql/sbtest/sbtest1.ibd /mnt/db/mysql/ibdata1
  tiercache preload --cache cache.img /mnt/db/postgresql/base/16384      (a directory: every file in it)
  tiercache preload --cache cache.img --range 0:1G --range 10G:256M

The file system must be on the served volume: a loop device over its FUSE file (checked), or,
with --device-is-volume, any device that is the volume (NBD, ublk). The blocks are read from the
backing device in large sequential requests and enter the cache hot: reclaim keeps each of them
the next three times the log's head reaches it, even if nothing reads it meanwhile (the head
comes round sooner when most of the cache is hot). Preload less than the cache holds.")]
pub struct PreloadArgs {
    #[command(flatten)]
    target: control::CacheArgs,
    /// A byte range of the volume, OFFSET:LENGTH with units (0:1G, 512M:64K); repeatable.
    #[arg(long, value_name = "OFFSET:LENGTH")]
    range: Vec<String>,
    /// Files (or directories: every file under them) on a file system that lives on the volume.
    files: Vec<PathBuf>,
    /// Trust that the device the files' file system sits on is this volume, with volume offset
    /// = device offset (for the kernel's NBD client or ublk, which cannot be traced back).
    #[arg(long)]
    device_is_volume: bool,
    /// Print the result as JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, serde::Serialize)]
struct PreloadOutput {
    ranges: usize,
    bytes: u64,
    seconds: f64,
    mib_per_second: f64,
    report: tiercache_engine::PreloadReport,
}

pub fn preload_cmd(args: PreloadArgs) -> Result<()> {
    if args.range.is_empty() && args.files.is_empty() {
        bail!("nothing to preload: name files (or directories) on the volume, or --range OFFSET:LENGTH");
    }
    let spec = args.target.spec()?;
    let socket = args.target.socket(&spec)?;
    let status = control::query_status(&socket).with_context(|| {
        format!(
            "no tiercache server answers on {} (control socket of {}): preload works through the running server",
            socket.display(),
            spec.path().display()
        )
    })?;
    let mut ranges = Vec::new();
    for r in &args.range {
        ranges.push(parse_range(r)?);
    }
    if !args.files.is_empty() {
        let fuse_files: Vec<PathBuf> = status
            .server
            .endpoints
            .iter()
            .filter_map(|e| e.strip_prefix("FUSE "))
            // "FUSE PATH (TRANSPORT)": the path without the transport the server names after it.
            .map(|e| e.strip_suffix(')').and_then(|e| e.rsplit_once(" (")).map_or(e, |(path, _)| path))
            .filter_map(|p| std::fs::canonicalize(p).ok())
            .collect();
        for f in &args.files {
            let dev = std::fs::metadata(f).with_context(|| format!("{}", f.display()))?.dev();
            ranges.extend(file_ranges(f, dev, &fuse_files, args.device_is_volume)?);
        }
    }
    let ranges = merge(ranges);
    let total: u64 = ranges.iter().map(|r| r.1).sum();
    if total > status.volume.log_bytes {
        bail!(
            "the ranges hold {}, more than the cache's log ({}): the blocks preloaded last would evict those preloaded first; preload less (the hottest tables, indexes)",
            HumanBytes(total),
            HumanBytes(status.volume.log_bytes)
        );
    }
    let bar = if args.json { ProgressBar::hidden() } else { ProgressBar::new(total) };
    bar.set_style(
        ProgressStyle::with_template("{bar:40} {bytes}/{total_bytes} {binary_bytes_per_sec} eta {eta}")
            .expect("a valid template"),
    );
    let (report, bytes, seconds) = control::request_preload(&socket, &ranges, |done, _| bar.set_position(done))
        .with_context(|| {
            format!("preloading through the server of {} (control socket {})", spec.path().display(), socket.display())
        })?;
    bar.finish_and_clear();
    let mib_per_second = if seconds > 0.0 { bytes as f64 / seconds / (1 << 20) as f64 } else { 0.0 };
    let out = PreloadOutput { ranges: ranges.len(), bytes, seconds, mib_per_second, report };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        println!(
            "preloaded {} in {} range{} in {:.1} s ({:.0} MiB/s): {} blocks read and admitted, {} cached already (now hot), {} left out",
            HumanBytes(bytes),
            out.ranges,
            if out.ranges == 1 { "" } else { "s" },
            seconds,
            mib_per_second,
            report.admitted_blocks,
            report.cached_blocks,
            report.left_out_blocks
        );
    }
    Ok(())
}

/// OFFSET:LENGTH with units.
fn parse_range(s: &str) -> Result<(u64, u64)> {
    let (o, l) = s.split_once(':').with_context(|| format!("--range {s}: expected OFFSET:LENGTH, e.g. 0:1G"))?;
    let o = crate::devices::parse_size(o).map_err(|e| anyhow::anyhow!("--range {s}: offset: {e}"))?;
    let l = crate::devices::parse_size(l).map_err(|e| anyhow::anyhow!("--range {s}: length: {e}"))?;
    if l == 0 {
        bail!("--range {s}: an empty range");
    }
    Ok((o, l))
}

/// Sorted, overlapping and touching ranges joined.
fn merge(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (o, l) in ranges {
        match out.last_mut() {
            // (Saturating: the server refuses a range beyond the volume, with a message.)
            Some((lo, ll)) if o <= lo.saturating_add(*ll) => *ll = (*ll).max(o.saturating_add(l) - *lo),
            _ => out.push((o, l)),
        }
    }
    out
}

/// The volume ranges holding a file's data (or every file's under a directory; symbolic
/// links and whatever lies on another file system than `dev`, the one named, are skipped).
fn file_ranges(path: &Path, dev: u64, fuse_files: &[PathBuf], trusted: bool) -> Result<Vec<(u64, u64)>> {
    let meta = std::fs::metadata(path).with_context(|| format!("{}", path.display()))?;
    if meta.is_dir() {
        let mut out = Vec::new();
        for entry in std::fs::read_dir(path).with_context(|| format!("listing {}", path.display()))? {
            let p = entry?.path();
            let m = std::fs::symlink_metadata(&p)?;
            if m.file_type().is_symlink() {
                continue;
            }
            if m.dev() != dev {
                eprintln!("tiercache preload: skipping {}: on another file system", p.display());
                continue;
            }
            out.extend(file_ranges(&p, dev, fuse_files, trusted)?);
        }
        return Ok(out);
    }
    if !meta.is_file() {
        return Ok(Vec::new());
    }
    let base = device_offset(meta.dev(), fuse_files, trusted)
        .with_context(|| format!("{}: is its file system on this volume?", path.display()))?;
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut out = Vec::new();
    // (SYNC: delayed allocations get their blocks first, so recent writes have extents.)
    for extent in fiemap::Fiemap::with_flags(&file, fiemap::FiemapFlags::SYNC) {
        let e = extent.with_context(|| format!("FIEMAP of {}", path.display()))?;
        use fiemap::FiemapExtentFlags as F;
        // Unwritten extents read as zeroes from the file system, never from the device;
        // encoded, inline or unknown ones have no plain device offset.
        if e.fe_flags.intersects(F::UNWRITTEN | F::UNKNOWN | F::ENCODED | F::DATA_INLINE | F::NOT_ALIGNED) {
            continue;
        }
        out.push((base + e.fe_physical, e.fe_length));
    }
    Ok(out)
}

/// Where the device `dev` (a file's `st_dev`) starts in the volume: the loop device's offset
/// into the served FUSE file, plus the partition's start if it is a partition.
fn device_offset(dev: u64, fuse_files: &[PathBuf], trusted: bool) -> Result<u64> {
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let sys = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    if trusted && !sys.exists() {
        bail!(
            "its file system has no block device of its own (device {major}:{minor}: btrfs, a network or \
             in-memory file system): FIEMAP's offsets there are not a device's"
        );
    }
    let read = |p: PathBuf| -> Result<String> {
        Ok(std::fs::read_to_string(&p).with_context(|| format!("reading {}", p.display()))?.trim().to_string())
    };
    let (whole, start) = if sys.join("partition").exists() {
        let start: u64 = read(sys.join("start"))?.parse().context("a partition's start")?;
        (std::fs::canonicalize(sys.join(".."))?, start * 512)
    } else {
        (std::fs::canonicalize(&sys).with_context(|| format!("{} (device {major}:{minor})", sys.display()))?, 0)
    };
    let name = whole.file_name().map(|n| n.to_string_lossy().to_string()).unwrap_or_default();
    if whole.join("dm").exists() {
        // (An LVM volume or dm target maps its offsets: they are not the volume's.)
        bail!("it is on /dev/{name}, a device-mapper device: its offsets are not the volume's, and preload cannot map them");
    }
    if trusted {
        return Ok(start);
    }
    let backing_file = whole.join("loop/backing_file");
    if !backing_file.exists() {
        bail!(
            "it is on /dev/{name} (device {major}:{minor}), not a loop device over the volume's FUSE file; \
             if /dev/{name} is this volume itself (the kernel's NBD client, ublk), pass --device-is-volume"
        );
    }
    let file = PathBuf::from(read(backing_file)?);
    let file = std::fs::canonicalize(&file).unwrap_or(file);
    if !fuse_files.contains(&file) {
        bail!(
            "it is on /dev/{name}, a loop device over {}, which is not this server's FUSE file ({})",
            file.display(),
            if fuse_files.is_empty() {
                "the server serves no FUSE file".to_string()
            } else {
                fuse_files.iter().map(|f| f.display().to_string()).collect::<Vec<_>>().join(", ")
            }
        );
    }
    let offset: u64 = read(whole.join("loop/offset"))?.parse().context("the loop device's offset")?;
    Ok(offset + start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_parse_with_units_and_merge() {
        assert_eq!(parse_range("0:1G").unwrap(), (0, 1 << 30));
        assert_eq!(parse_range("512M:64K").unwrap(), (512 << 20, 64 << 10));
        assert!(parse_range("12").unwrap_err().to_string().contains("OFFSET:LENGTH"));
        assert!(parse_range("0:0").unwrap_err().to_string().contains("empty"));
        assert_eq!(merge(vec![(100, 50), (0, 100), (400, 10), (120, 100)]), vec![(0, 220), (400, 10)]);
        // (No overflow however absurd: the server refuses ranges beyond the volume.)
        assert_eq!(merge(vec![(8 << 60, 8 << 60), (15 << 60, 1)]), vec![(8 << 60, 8 << 60)]);
    }
}
