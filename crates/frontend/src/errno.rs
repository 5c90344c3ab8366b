//! The errno a failed request is answered with: the one conversion from the errors of the
//! layers below. Which errno each error kind means is said once, by the error enums
//! themselves (`EngineError::errno`, `DeviceError::errno`); every frontend gets it from here,
//! with the failure logged the same way. FUSE replies with it as is; NBD narrows it to the
//! values its protocol defines (`tiercache_nbd::proto::reply_error`).

use tiercache_device::DeviceError;
use tiercache_engine::EngineError;

/// A positive errno value (Linux numbering).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Errno(i32);

impl Errno {
    pub const EIO: Errno = Errno(libc::EIO);

    /// `value`, or EIO if it is not an errno (zero or negative).
    pub fn new(value: i32) -> Errno {
        if value > 0 {
            Errno(value)
        } else {
            Errno::EIO
        }
    }

    /// The errno value.
    pub fn get(self) -> i32 {
        self.0
    }
}

impl std::fmt::Display for Errno {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "errno {} ({})", self.0, std::io::Error::from_raw_os_error(self.0))
    }
}

impl From<EngineError> for Errno {
    fn from(e: EngineError) -> Errno {
        tracing::debug!(error = %e, "request failed");
        Errno::new(e.errno())
    }
}

impl From<DeviceError> for Errno {
    fn from(e: DeviceError) -> Errno {
        tracing::debug!(error = %e, "request failed");
        Errno::new(e.errno())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io;
    use std::path::PathBuf;
    use tiercache_engine::Role;
    use tiercache_format::FormatError;

    fn path() -> PathBuf {
        PathBuf::from("/dev/x")
    }

    fn io_error(op: &'static str, source: io::Error) -> DeviceError {
        DeviceError::Io { path: path(), op, source }
    }

    /// Every device error kind, with the errno a frontend replies with.
    fn device_errors() -> Vec<(DeviceError, i32)> {
        vec![
            (DeviceError::NotFound { path: path() }, libc::ENOENT),
            (DeviceError::IsDirectory { path: path() }, libc::EISDIR),
            (DeviceError::NotFileOrBlockDevice { path: path() }, libc::ENODEV),
            (DeviceError::ReadOnly { path: path(), reason: "mode".into() }, libc::EROFS),
            (DeviceError::Empty { path: path(), hint: String::new() }, libc::EINVAL),
            (DeviceError::MisalignedSize { path: path(), size_bytes: 1000, block_size: 512 }, libc::EINVAL),
            (DeviceError::AlreadyOpen { path: path(), holder: None }, libc::EBUSY),
            (DeviceError::DirectIoUnsupported { path: path() }, libc::EINVAL),
            // An I/O error is answered with the errno the kernel gave, EIO if it gave none.
            (io_error("pwrite", io::Error::from_raw_os_error(libc::EIO)), libc::EIO),
            (io_error("pwrite", io::Error::from_raw_os_error(libc::ENOSPC)), libc::ENOSPC),
            (io_error("fdatasync", io::Error::from_raw_os_error(libc::EROFS)), libc::EROFS),
            (io_error("pread", io::Error::other("no os error")), libc::EIO),
            (DeviceError::Misaligned { offset: 1, len: 512, block_size: 512 }, libc::EINVAL),
            (DeviceError::OutOfRange { offset: 0, len: 512, size_bytes: 0 }, libc::ENOSPC),
            (DeviceError::Injected { device: "sim".into(), op: "write" }, libc::EIO),
            (DeviceError::UnknownProfile { name: "x".into(), known: "hdd".into() }, libc::EINVAL),
        ]
    }

    #[test]
    fn every_device_error_kind_has_its_errno() {
        for (e, expected) in device_errors() {
            let what = e.to_string();
            assert_eq!(Errno::from(e), Errno::new(expected), "{what}");
        }
    }

    #[test]
    fn every_engine_error_kind_has_its_errno() {
        let format = FormatError::Invalid { what: "superblock", field: "x", why: "y".into() };
        let mut cases = vec![
            (EngineError::Format { device: "c".into(), source: format }, libc::EIO),
            (EngineError::NotFormatted { device: "c".into() }, libc::EIO),
            (EngineError::WrongBacking { backing: "b".into(), reason: "r".into() }, libc::EIO),
            (EngineError::CacheShrunk { device: "c".into(), actual: 1, formatted: 2 }, libc::EIO),
            (EngineError::Config("x".into()), libc::EINVAL),
            (EngineError::Misaligned { offset: 1, len: 4096, block_size: 4096 }, libc::EINVAL),
            (EngineError::OutOfRange { offset: 0, len: 4096, size_bytes: 0 }, libc::ENOSPC),
            (EngineError::Poisoned { reason: "cache write failed".into() }, libc::EIO),
            (EngineError::LostBlock { block: 7 }, libc::EIO),
            (EngineError::LostBlocks { count: 1, blocks: vec![7] }, libc::EIO),
            (
                EngineError::Corrupt(tiercache_engine::Corruption::RecordMisplaced { position: 1, claimed: 2 }),
                libc::EIO,
            ),
            (EngineError::WriteBackStuck { count: 3 }, libc::EIO),
        ];
        // A device error on either device is answered as the device error itself.
        for role in [Role::Cache, Role::Backing] {
            for (source, expected) in device_errors() {
                cases.push((EngineError::Device { role, source }, expected));
            }
        }
        for (e, expected) in cases {
            let what = e.to_string();
            assert_eq!(Errno::from(e), Errno::new(expected), "{what}");
        }
    }

    #[test]
    fn an_errno_is_positive() {
        assert_eq!(Errno::new(libc::ENOSPC).get(), libc::ENOSPC);
        assert_eq!(Errno::new(0), Errno::EIO);
        assert_eq!(Errno::new(-5), Errno::EIO);
        assert!(Errno::new(libc::ENOSPC).to_string().starts_with("errno 28 ("));
    }
}
