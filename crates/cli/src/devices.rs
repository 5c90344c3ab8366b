//! Device specifications on the command line: `PATH` (a file or block device, O_DIRECT) or
//! `emulated:PROFILE:PATH` (the same file with a device profile's timing, see docs/devices.md).

use anyhow::{Context, Result};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use tiercache_device::{BlockDevice, DeviceError, EmulatedDevice, FileDevice, OpenOptions, Profile};

/// A parsed device specification.
#[derive(Debug, Clone)]
pub struct DeviceSpec {
    pub path: PathBuf,
    pub profile: Option<&'static Profile>,
}

impl DeviceSpec {
    pub fn parse(spec: &str) -> Result<DeviceSpec> {
        if let Some(rest) = spec.strip_prefix("emulated:") {
            let (name, path) = rest.split_once(':').with_context(|| {
                format!(
                    "'{spec}': an emulated device is written emulated:PROFILE:PATH, e.g. emulated:hdd:/tmp/slow.img"
                )
            })?;
            return Ok(DeviceSpec { path: PathBuf::from(path), profile: Some(Profile::by_name(name)?) });
        }
        Ok(DeviceSpec { path: PathBuf::from(spec), profile: None })
    }

    /// Opens the device. Real devices use O_DIRECT, falling back to buffered I/O (still
    /// flushed with fdatasync) on a file system without O_DIRECT such as tmpfs.
    pub fn open(&self, role: &str) -> Result<Arc<dyn BlockDevice>> {
        let dev: Arc<dyn BlockDevice> = match self.profile {
            Some(p) => Arc::new(EmulatedDevice::open(&self.path, p).with_context(|| format!("{role} device"))?),
            None => match FileDevice::open(&self.path) {
                Err(DeviceError::DirectIoUnsupported { .. }) => {
                    tracing::warn!(path = %self.path.display(), "no O_DIRECT on this file system; using buffered I/O");
                    Arc::new(
                        FileDevice::open_with(&self.path, OpenOptions { direct: false, lock: true, read_only: false })
                            .with_context(|| format!("{role} device"))?,
                    )
                }
                r => Arc::new(r.with_context(|| format!("{role} device"))?),
            },
        };
        Ok(dev)
    }

    /// Opens the device for reading only (commands that only look at it): a read-only copy,
    /// file system or device works. An emulated device is opened as `open` does.
    pub fn open_read_only(&self, role: &str) -> Result<Arc<dyn BlockDevice>> {
        if self.profile.is_some() {
            return self.open(role);
        }
        let ro = |direct| OpenOptions { direct, lock: true, read_only: true };
        let dev = match FileDevice::open_with(&self.path, ro(true)) {
            Err(DeviceError::DirectIoUnsupported { .. }) => FileDevice::open_with(&self.path, ro(false)),
            r => r,
        };
        Ok(Arc::new(dev.with_context(|| format!("{role} device"))?))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// Writes zeroes over the whole of a regular file and syncs it, so that the file system has
/// allocated and written every block: without this, the first write to each block of a
/// sparse or fallocated file costs a journal commit at the next fdatasync (an extent
/// conversion), which a cache file would pay on every FLUSH until its log wrapped once.
pub fn precondition_file(path: &Path, len: u64, quiet: bool) -> Result<()> {
    use std::io::Write;
    let mut f =
        std::fs::OpenOptions::new().write(true).open(path).with_context(|| format!("opening {}", path.display()))?;
    let pb = crate::report::progress("allocating", quiet);
    pb.set_length(len);
    let chunk = vec![0u8; 4 << 20];
    let mut done = 0u64;
    while done < len {
        let n = (len - done).min(chunk.len() as u64) as usize;
        f.write_all(&chunk[..n]).with_context(|| format!("writing {}", path.display()))?;
        done += n as u64;
        pb.set_position(done);
    }
    f.sync_all().with_context(|| format!("syncing {}", path.display()))?;
    pb.finish_and_clear();
    Ok(())
}

/// Parses a size such as 4096, 64M, 1.5GiB (binary units either way).
pub fn parse_size(s: &str) -> Result<u64, String> {
    parse_size::Config::new()
        .with_binary()
        .parse_size(s)
        .map_err(|e| format!("'{s}' is not a size ({e}); examples: 4096, 64M, 1G, 2TiB"))
}

/// Parses a percentage such as 30 or 30% into per mille.
pub fn parse_percent(s: &str) -> Result<u16, String> {
    let v: f64 = s.trim_end_matches('%').parse().map_err(|_| format!("'{s}' is not a percentage"))?;
    if !(0.0..=100.0).contains(&v) {
        return Err(format!("{s} is not between 0 and 100 %"));
    }
    Ok((v * 10.0).round() as u16)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_sizes_and_percentages() {
        let d = DeviceSpec::parse("emulated:hdd:/tmp/x.img").unwrap();
        assert_eq!((d.profile.unwrap().name, d.path.to_str().unwrap()), ("hdd", "/tmp/x.img"));
        assert!(DeviceSpec::parse("emulated:hdd").unwrap_err().to_string().contains("emulated:PROFILE:PATH"));
        assert!(DeviceSpec::parse("emulated:floppy:/x").is_err());
        assert_eq!(parse_size("64M").unwrap(), 64 << 20);
        assert_eq!(parse_size("1GiB").unwrap(), 1 << 30);
        assert!(parse_size("lots").is_err());
        assert_eq!(parse_percent("30%").unwrap(), 300);
        assert!(parse_percent("130").is_err());
    }
}
