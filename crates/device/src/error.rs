//! The device layer's one error enum. Every variant names the device and the problem in one
//! line, and maps to the errno a block frontend (NBD, ublk, FUSE) should report.

use std::io;
use std::path::PathBuf;

pub type Result<T, E = DeviceError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("{}: no such file or device", path.display())]
    NotFound { path: PathBuf },
    #[error("{}: is a directory; expected a regular file or a block device", path.display())]
    IsDirectory { path: PathBuf },
    #[error("{}: is neither a regular file nor a block device", path.display())]
    NotFileOrBlockDevice { path: PathBuf },
    #[error("{}: is read-only ({reason}); tiercache needs to write to it", path.display())]
    ReadOnly { path: PathBuf, reason: String },
    #[error("{}: is empty (0 bytes){hint}", path.display())]
    Empty { path: PathBuf, hint: String },
    #[error(
        "{}: size {size_bytes} bytes is not a multiple of the {block_size}-byte block size",
        path.display()
    )]
    MisalignedSize { path: PathBuf, size_bytes: u64, block_size: u32 },
    #[error("{}: is already open by another process or another tiercache device (its lock is held{})", path.display(),
        holder.map(|pid| format!(" by pid {pid}{}", process_name(pid))).unwrap_or_default())]
    AlreadyOpen { path: PathBuf, holder: Option<u32> },
    #[error("{}: the file system does not support O_DIRECT (tmpfs?); use a file on ext4/xfs or a block device", path.display())]
    DirectIoUnsupported { path: PathBuf },
    #[error("{}: {op} failed: {source}", path.display())]
    Io { path: PathBuf, op: &'static str, source: io::Error },
    #[error("request at offset {offset} of {len} bytes is not aligned to the {block_size}-byte block size")]
    Misaligned { offset: u64, len: u64, block_size: u64 },
    #[error("request at offset {offset} of {len} bytes ends beyond the device's {size_bytes} bytes")]
    OutOfRange { offset: u64, len: u64, size_bytes: u64 },
    #[error("{device}: injected {op} error (fault injection)")]
    Injected { device: String, op: &'static str },
    #[error("unknown device profile '{name}'; known profiles: {known}")]
    UnknownProfile { name: String, known: String },
}

impl DeviceError {
    /// The errno a block frontend reports for this error.
    pub fn errno(&self) -> i32 {
        match self {
            DeviceError::NotFound { .. } => libc::ENOENT,
            DeviceError::IsDirectory { .. } => libc::EISDIR,
            DeviceError::NotFileOrBlockDevice { .. } => libc::ENODEV,
            DeviceError::ReadOnly { .. } => libc::EROFS,
            DeviceError::Empty { .. } | DeviceError::MisalignedSize { .. } => libc::EINVAL,
            DeviceError::AlreadyOpen { .. } => libc::EBUSY,
            DeviceError::DirectIoUnsupported { .. } => libc::EINVAL,
            DeviceError::Io { source, .. } => source.raw_os_error().unwrap_or(libc::EIO),
            DeviceError::Misaligned { .. } => libc::EINVAL,
            DeviceError::OutOfRange { .. } => libc::ENOSPC,
            DeviceError::Injected { .. } => libc::EIO,
            DeviceError::UnknownProfile { .. } => libc::EINVAL,
        }
    }
}

/// ": tiercache serve ..." for a process, from its command line (nothing if it is gone).
fn process_name(pid: u32) -> String {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .ok()
        .map(|c| {
            c.split(|&b| b == 0)
                .filter(|a| !a.is_empty())
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect::<Vec<_>>()
        })
        .filter(|args| !args.is_empty())
        .map(|args| {
            let name = std::path::Path::new(&args[0])
                .file_name()
                .map_or(args[0].clone(), |n| n.to_string_lossy().into_owned());
            format!(
                " ({})",
                std::iter::once(name).chain(args.into_iter().skip(1).take(1)).collect::<Vec<_>>().join(" ")
            )
        })
        .unwrap_or_default()
}
