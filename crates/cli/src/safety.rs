//! Nothing destroyed by mistake: what a device holds, looked at before a command writes a
//! device it did not create.
//!
//! Foreign signatures (partition tables, file systems, LVM2, MD RAID, LUKS, swap, ...) come
//! from libblkid's low-level probe through the util-linux `blkid` program (`blkid -p`),
//! which every Linux distribution ships: the Rust bindings to libblkid need its headers and
//! libclang at build time for a one-call use. tiercache's own superblock is probed here.

use anyhow::{bail, Context, Result};
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use tiercache_device::{BlockDevice, MonotonicClock};
use tiercache_engine::{read_superblock, EngineError, Volume};

/// What a device was found to hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Contents {
    /// No signature libblkid knows, and no tiercache superblock.
    Unrecognized,
    /// A tiercache cache (for the backing device it names).
    Tiercache { backing_path: String },
    /// A tiercache superblock this build cannot read (another format version, or damaged).
    TiercacheUnreadable { reason: String },
    /// A foreign signature, described for a person ("an ext4 file system").
    Foreign { what: String },
}

impl Contents {
    /// Whether anything was recognized at all.
    pub fn holds_data(&self) -> bool {
        *self != Contents::Unrecognized
    }

    /// "an ext4 file system", "a tiercache cache (for backing /dev/sdb)", ...
    pub fn describe(&self) -> String {
        match self {
            Contents::Unrecognized => "nothing recognizable".into(),
            Contents::Tiercache { backing_path } if backing_path.is_empty() => "a tiercache cache".into(),
            Contents::Tiercache { backing_path } => format!("a tiercache cache (for backing {backing_path})"),
            Contents::TiercacheUnreadable { reason } => {
                format!("a tiercache superblock this build cannot use ({reason})")
            }
            Contents::Foreign { what } => what.clone(),
        }
    }
}

/// Probes `dev` (opened) and its `path` for what they hold: tiercache's superblock first,
/// then libblkid's signatures.
pub fn probe(dev: &dyn BlockDevice, path: &Path) -> Result<Contents> {
    match read_superblock(dev) {
        Ok(sb) => return Ok(Contents::Tiercache { backing_path: sb.backing_path }),
        Err(EngineError::Format { source, .. }) => {
            return Ok(Contents::TiercacheUnreadable { reason: source.to_string() })
        }
        Err(_) => {}
    }
    blkid(path)
}

/// libblkid's low-level probe of `path` (superblocks and partition tables).
pub fn blkid(path: &Path) -> Result<Contents> {
    let out = Command::new("blkid")
        .args(["-p", "-o", "export", "--"])
        .arg(path)
        .output()
        .context("running blkid (util-linux) to check for a file system or partition table")?;
    // 0: something found; 2: nothing found; anything else: the probe itself failed (8: two
    // file systems claim the device, which is no less a reason to stop).
    match out.status.code() {
        Some(2) => return Ok(Contents::Unrecognized),
        Some(0) => {}
        Some(8) => return Ok(Contents::Foreign { what: "more than one file-system signature".into() }),
        _ => bail!(
            "blkid could not check {} for a file system or partition table: {}",
            path.display(),
            String::from_utf8_lossy(&out.stderr).trim()
        ),
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let field = |name: &str| {
        text.lines().find_map(|l| l.strip_prefix(name).and_then(|v| v.strip_prefix('='))).map(str::to_string)
    };
    let what = match (field("PTTYPE"), field("TYPE"), field("USAGE")) {
        (Some(pt), _, _) => format!("a {pt} partition table"),
        (None, Some(t), Some(u)) if u == "filesystem" => format!("{} {t} file system", article(&t)),
        (None, Some(t), Some(u)) if u == "raid" => format!("{} {t} RAID member (LVM, MD RAID or similar)", article(&t)),
        (None, Some(t), Some(u)) if u == "crypto" => format!("{} {t} encrypted volume", article(&t)),
        (None, Some(t), Some(u)) if u == "other" && t == "swap" => "a Linux swap area".into(),
        (None, Some(t), Some(u)) => format!("{} {t} signature ({u})", article(&t)),
        (None, Some(t), None) => format!("{} {t} signature", article(&t)),
        (None, None, _) => "a signature blkid reports without a type".into(),
    };
    Ok(Contents::Foreign { what })
}

fn article(word: &str) -> &'static str {
    match word.chars().next().map(|c| c.to_ascii_lowercase()) {
        Some('a' | 'e' | 'i' | 'o' | 'u' | 'x') => "an", // "an xfs", "an ext4"
        _ => "a",
    }
}

/// A cache device with no tiercache superblock, explained for the command that met it:
/// whether `backing` (the other device the command was given, opened, and its path) holds the
/// cache, as when --cache and --backing are swapped, and else what the cache device holds
/// instead (a file system there means the wrong device was named, not a device to format).
/// Any other error is returned as it was.
pub fn explain_not_a_cache(
    e: anyhow::Error,
    cache: &Path,
    backing: Option<(&Path, &dyn BlockDevice)>,
) -> anyhow::Error {
    if !matches!(e.downcast_ref::<EngineError>(), Some(EngineError::NotFormatted { .. })) {
        return e;
    }
    if let Some((path, _)) = backing.filter(|(_, dev)| read_superblock(*dev).is_ok()) {
        return anyhow::anyhow!(
            "cache device {} is not a tiercache cache, and backing device {} is one: are --cache and --backing swapped?",
            cache.display(),
            path.display()
        );
    }
    match blkid(cache) {
        Ok(found @ Contents::Foreign { .. }) => anyhow::anyhow!(
            "cache device {} is not a tiercache cache: it holds {}; is it the device you meant? (`tiercache create` would format it and destroy that)",
            cache.display(),
            found.describe()
        ),
        _ => e,
    }
}

/// Dirty blocks in a tiercache cache, read without writing anything (recovery in RAM).
pub fn dirty_blocks(cache: Arc<dyn BlockDevice>) -> Result<u64> {
    let volume = Volume::inspect(cache, None, Arc::new(MonotonicClock::new()))?;
    Ok(volume.status().dirty_blocks)
}

/// Refuses to let a benchmark write `dev` (at `path`; `effect` says what it would do) if it
/// holds anything, unless `destructive`; and a tiercache cache holding dirty data whatever
/// the flag (its dirty blocks exist nowhere else).
pub fn check_benchmark_target(dev: Arc<dyn BlockDevice>, path: &Path, effect: &str, destructive: bool) -> Result<()> {
    use std::os::unix::fs::FileTypeExt;
    let block_device = std::fs::metadata(path).is_ok_and(|m| m.file_type().is_block_device());
    if block_device && !destructive {
        bail!("{}: is a block device and {effect}; pass --destructive to allow it", path.display());
    }
    let found = probe(&*dev, path)?;
    if let Contents::Tiercache { backing_path } = &found {
        let dirty =
            dirty_blocks(dev).with_context(|| format!("{}: reading the tiercache cache it holds", path.display()))?;
        if dirty > 0 {
            bail!(
                "{} holds a tiercache cache with {dirty} dirty block{} found nowhere else, and {effect}; write them back first with `tiercache flush --cache {} --backing {}` (--destructive does not override this)",
                path.display(),
                if dirty == 1 { "" } else { "s" },
                path.display(),
                if backing_path.is_empty() { "BACKING" } else { backing_path }
            );
        }
    }
    if found.holds_data() && !destructive {
        bail!("{} holds {}, and {effect}; pass --destructive to allow it", path.display(), found.describe());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn articles() {
        assert_eq!(article("ext4"), "an");
        assert_eq!(article("xfs"), "an");
        assert_eq!(article("btrfs"), "a");
        assert_eq!(article("LVM2_member"), "a");
    }
}
