//! [`FileDevice`]: a regular file or a block device.
//!
//! - O_DIRECT by default, so the page cache neither hides nor adds latency; misaligned user
//!   buffers go through a bounce buffer (data-path callers pass [`AlignedBuf`]s and never pay).
//! - flush is `fdatasync`; a FUA write is `pwritev2(RWF_DSYNC)`, which makes that write (and
//!   only what the file system needs for it) durable.
//! - The device is locked with `flock(LOCK_EX | LOCK_NB)` at open, so two tiercache processes
//!   (or two devices in one process) never drive the same file at once.
//! - Opening never writes: every bad input is refused before the first byte moves.
//!
//! - Writes and flushes are plain `pwritev2`/`fdatasync`: the engine issues one large
//!   sequential write per log record plus one flush per group commit, so syscall count is not
//!   the bottleneck. A record write with work to overlap (`write_at_while`) goes through the
//!   thread's io_uring. Batched reads ([`BlockDevice::read_batch`]) go through a per-thread
//!   io_uring (uring.rs), so the runs of one large read are in flight together.

use crate::aligned::AlignedBuf;
use crate::error::{DeviceError, Result};
use crate::uring;
use crate::{check_request, write_one_after_another, BlockDevice, EachRange, ReadRange};
use std::fs::File;
use std::io;
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt, PermissionsExt};
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};

/// The logical block size assumed for regular files: the page size, which every Linux file
/// system accepts for O_DIRECT.
pub const FILE_LOGICAL_BLOCK_SIZE: u32 = 4096;

/// How to open a [`FileDevice`].
#[derive(Debug, Clone, Copy)]
pub struct OpenOptions {
    /// Bypass the page cache (O_DIRECT). Off gives the "buffered" variant of the benchmarks.
    pub direct: bool,
    /// Take an exclusive `flock` so nobody else drives the device at the same time.
    pub lock: bool,
    /// Open for reading only (commands that only look: a read-only copy, a read-only file
    /// system or a write-protected device is fine then). Writes fail.
    pub read_only: bool,
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions { direct: true, lock: true, read_only: false }
    }
}

/// A regular file or a block device opened for I/O.
#[derive(Debug)]
pub struct FileDevice {
    file: File,
    path: PathBuf,
    size_bytes: u64,
    logical_block_size: u32,
    direct: bool,
    /// The kernel's stable identity of a block device (see `BlockDevice::identity`).
    identity: Option<String>,
    /// See `BlockDevice::atomic_write_bytes`.
    atomic_write_bytes: u32,
}

impl FileDevice {
    /// Opens an existing file or block device with the default options (O_DIRECT, locked).
    pub fn open(path: impl AsRef<Path>) -> Result<Self> {
        Self::open_with(path, OpenOptions::default())
    }

    pub fn open_with(path: impl AsRef<Path>, options: OpenOptions) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let meta = std::fs::metadata(&path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => DeviceError::NotFound { path: path.clone() },
            _ => DeviceError::Io { path: path.clone(), op: "stat", source: e },
        })?;
        let ftype = meta.file_type();
        if ftype.is_dir() {
            return Err(DeviceError::IsDirectory { path });
        }
        let is_block = ftype.is_block_device();
        if !ftype.is_file() && !is_block {
            return Err(DeviceError::NotFileOrBlockDevice { path });
        }
        // Root bypasses permission bits, so an explicit read-only mode is checked here: a
        // file marked read-only is a user's statement that it must not change.
        let mode = meta.permissions().mode();
        if mode & 0o222 == 0 && !options.read_only {
            return Err(DeviceError::ReadOnly {
                path,
                reason: format!("mode {:04o} has no write permission", mode & 0o7777),
            });
        }
        let mut open = std::fs::OpenOptions::new();
        open.read(true).write(!options.read_only);
        let mut flags = libc::O_CLOEXEC;
        if options.direct {
            flags |= libc::O_DIRECT;
        }
        open.custom_flags(flags);
        let file = open.open(&path).map_err(|e| match e.raw_os_error() {
            Some(libc::EROFS) => DeviceError::ReadOnly { path: path.clone(), reason: "read-only file system".into() },
            Some(libc::EACCES) | Some(libc::EPERM) => {
                DeviceError::ReadOnly { path: path.clone(), reason: format!("permission denied: {e}") }
            }
            Some(libc::EINVAL) if options.direct => DeviceError::DirectIoUnsupported { path: path.clone() },
            _ => DeviceError::Io { path: path.clone(), op: "open", source: e },
        })?;
        if options.lock {
            // SAFETY: flock on a valid, owned file descriptor; no memory is passed.
            let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
            if rc != 0 {
                let e = io::Error::last_os_error();
                return Err(match e.raw_os_error() {
                    Some(libc::EWOULDBLOCK) => {
                        let holder = lock_holder(&file);
                        DeviceError::AlreadyOpen { path, holder }
                    }
                    _ => DeviceError::Io { path, op: "flock", source: e },
                });
            }
        }
        let (size_bytes, logical_block_size) = if is_block {
            (block_device_size(&file, &path)?, block_device_sector_size(&file, &path)?)
        } else {
            (meta.len(), FILE_LOGICAL_BLOCK_SIZE)
        };
        if size_bytes == 0 {
            let hint = if is_block {
                "; is it an unconfigured loop device?".to_string()
            } else {
                format!("; give it a size first, e.g. `truncate -s 1G {}`", path.display())
            };
            return Err(DeviceError::Empty { path, hint });
        }
        if size_bytes % u64::from(logical_block_size) != 0 {
            return Err(DeviceError::MisalignedSize { path, size_bytes, block_size: logical_block_size });
        }
        let identity = if is_block { block_device_identity(&meta) } else { None };
        let atomic_write_bytes = physical_block_size(&meta, is_block).unwrap_or(512).max(512);
        Ok(FileDevice {
            file,
            path,
            size_bytes,
            logical_block_size,
            direct: options.direct,
            identity,
            atomic_write_bytes,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn is_direct(&self) -> bool {
        self.direct
    }

    fn io_err(&self, op: &'static str, source: io::Error) -> DeviceError {
        DeviceError::Io { path: self.path.clone(), op, source }
    }

    /// `read_batch` (`each` None: one wait for the whole batch) and `read_batch_each`.
    fn read_batch_inner(&self, ranges: &mut [ReadRange<'_>], each: Option<&mut EachRange<'_>>) -> Vec<Result<()>> {
        let valid = ranges.iter().all(|r| {
            let len = r.bufs.iter().map(|b| b.len() as u64).sum::<u64>();
            len > 0 && r.bufs.len() <= MAX_IOVECS && check_request(self, r.offset, len).is_ok()
        });
        let mut ignore = |_: usize, _: &ReadRange<'_>, _: &Result<()>| {};
        let progressive = each.is_some();
        let each = each.unwrap_or(&mut ignore);
        let one_by_one = |ranges: &mut [ReadRange<'_>], each: &mut EachRange<'_>| {
            ranges
                .iter_mut()
                .enumerate()
                .map(|(k, r)| {
                    let result = self.read_vectored_at(r.offset, &mut r.bufs);
                    each(k, r, &result);
                    result
                })
                .collect()
        };
        if ranges.len() < 2 || !valid {
            // (One range gains nothing from the ring; a bad one gets its precise error there.)
            return one_by_one(ranges, each);
        }
        // A range with a misaligned buffer is read into an aligned bounce buffer (one per such
        // range), copied out afterwards.
        let mut bounces: Vec<Option<AlignedBuf>> = ranges
            .iter()
            .map(|r| {
                r.bufs
                    .iter()
                    .any(|b| self.needs_bounce(b.as_ptr()))
                    .then(|| AlignedBuf::new(r.bufs.iter().map(|b| b.len()).sum::<usize>()))
            })
            .collect();
        let reads: Vec<uring::Vectored> = ranges
            .iter_mut()
            .zip(bounces.iter_mut())
            .map(|(r, bounce)| {
                let iovecs = match bounce {
                    Some(b) => vec![libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() }],
                    None => r
                        .bufs
                        .iter_mut()
                        .map(|b| libc::iovec { iov_base: b.as_mut_ptr().cast(), iov_len: b.len() })
                        .collect(),
                };
                uring::Vectored { offset: r.offset, iovecs }
            })
            .collect();
        let lens: Vec<usize> = ranges.iter().map(|r| r.bufs.iter().map(|b| b.len()).sum()).collect();
        // Ranges read whole into their own buffers are handed over as they complete; the
        // rest (a bounce to copy out, a short read or an error to redo) after the batch.
        let mut handed = vec![false; ranges.len()];
        let counts = {
            let ranges = &*ranges;
            let mut early = |k: usize, count: &std::io::Result<usize>| {
                if bounces[k].is_none() && matches!(count, Ok(n) if *n == lens[k]) {
                    each(k, &ranges[k], &Ok(()));
                    handed[k] = true;
                }
            };
            // SAFETY: every iovec points into a buffer exclusively borrowed by `ranges` or
            // owned by `bounces`, both alive and untouched until the batch returns, except by
            // `early` for a range whose read has completed.
            unsafe {
                if progressive {
                    uring::readv_batch_each(self.file.as_raw_fd(), &reads, &mut early)
                } else {
                    uring::readv_batch(self.file.as_raw_fd(), &reads)
                }
            }
        };
        drop(reads);
        let Some(counts) = counts else {
            return one_by_one(ranges, each);
        };
        ranges
            .iter_mut()
            .zip(bounces)
            .zip(counts)
            .enumerate()
            .map(|(k, ((r, bounce), count))| {
                if handed[k] {
                    return Ok(());
                }
                let result = match count {
                    Ok(n) if n == lens[k] => {
                        if let Some(b) = bounce {
                            scatter(&b, &mut r.bufs);
                        }
                        Ok(())
                    }
                    // A short read or any error: the range again, on its own (the synchronous
                    // path resumes short reads, retries EINTR, and reports an error as the
                    // device gives it to `preadv`, where a file system refused the ring's).
                    _ => self.read_vectored_at(r.offset, &mut r.bufs),
                };
                each(k, r, &result);
                result
            })
            .collect()
    }

    fn needs_bounce(&self, ptr: *const u8) -> bool {
        self.direct && !AlignedBuf::is_aligned(ptr)
    }

    fn pwrite_all(&self, mut offset: u64, mut buf: &[u8], rwf_flags: libc::c_int) -> Result<()> {
        while !buf.is_empty() {
            let iov = libc::iovec { iov_base: buf.as_ptr() as *mut libc::c_void, iov_len: buf.len() };
            let off = libc::off_t::try_from(offset).expect("offset fits off_t");
            // SAFETY: iov points into `buf`, which is live and not mutated for the call's
            // duration; the kernel only reads from it.
            let n = unsafe { libc::pwritev2(self.file.as_raw_fd(), &iov, 1, off, rwf_flags) };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(self.io_err("write", e));
            }
            let n = usize::try_from(n).expect("non-negative");
            if n == 0 {
                return Err(self.io_err("write", io::Error::new(io::ErrorKind::WriteZero, "wrote 0 bytes")));
            }
            buf = &buf[n..];
            offset += n as u64;
        }
        Ok(())
    }

    fn write_impl(&self, offset: u64, buf: &[u8], rwf_flags: libc::c_int) -> Result<()> {
        check_request(self, offset, buf.len() as u64)?;
        if buf.is_empty() {
            // (Nothing to write; an empty slice's dangling pointer would be "misaligned", and
            // a zero-length bounce buffer cannot be made.)
            return Ok(());
        }
        if self.needs_bounce(buf.as_ptr()) {
            let bounce = AlignedBuf::from_slice(buf);
            self.pwrite_all(offset, &bounce, rwf_flags)
        } else {
            self.pwrite_all(offset, buf, rwf_flags)
        }
    }

    /// `preadv` until every buffer is full (a short read resumes where it stopped; empty
    /// buffers are passed over).
    fn preadv_all(&self, mut offset: u64, bufs: &mut [&mut [u8]]) -> Result<()> {
        use std::os::fd::AsRawFd;
        let (mut first, mut skip) = (0usize, 0usize);
        loop {
            while first < bufs.len() && bufs[first].len() == skip {
                first += 1;
                skip = 0;
            }
            if first == bufs.len() {
                return Ok(());
            }
            let iov: Vec<libc::iovec> = bufs[first..]
                .iter_mut()
                .enumerate()
                .map(|(k, b)| {
                    let from = if k == 0 { skip } else { 0 };
                    libc::iovec { iov_base: b[from..].as_mut_ptr().cast(), iov_len: b.len() - from }
                })
                .collect();
            // SAFETY: every iovec points into a live, exclusively borrowed buffer of the
            // length given; the kernel writes at most that much into each.
            let n = unsafe {
                libc::preadv(self.file.as_raw_fd(), iov.as_ptr(), iov.len() as libc::c_int, offset as libc::off_t)
            };
            if n < 0 {
                let e = io::Error::last_os_error();
                if e.kind() == io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(self.io_err("read", e));
            }
            if n == 0 {
                return Err(self.io_err("read", io::Error::new(io::ErrorKind::UnexpectedEof, "device shrank under us")));
            }
            offset += n as u64;
            let mut n = n as usize;
            while first < bufs.len() && n >= bufs[first].len() - skip {
                n -= bufs[first].len() - skip;
                first += 1;
                skip = 0;
            }
            skip += n;
        }
    }

    fn pread_all(&self, mut offset: u64, mut buf: &mut [u8]) -> Result<()> {
        use std::os::unix::fs::FileExt;
        while !buf.is_empty() {
            match self.file.read_at(buf, offset) {
                Ok(0) => {
                    return Err(
                        self.io_err("read", io::Error::new(io::ErrorKind::UnexpectedEof, "device shrank under us"))
                    )
                }
                Ok(n) => {
                    buf = &mut buf[n..];
                    offset += n as u64;
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(self.io_err("read", e)),
            }
        }
        Ok(())
    }
}

/// Copies `from` (a bounce buffer) out into `bufs`, in order.
fn scatter(from: &[u8], bufs: &mut [&mut [u8]]) {
    let mut at = 0;
    for buf in bufs.iter_mut() {
        buf.copy_from_slice(&from[at..at + buf.len()]);
        at += buf.len();
    }
}

/// The most buffers one `preadv` takes here (Linux's `IOV_MAX` is 1024).
const MAX_IOVECS: usize = 1024;

impl BlockDevice for FileDevice {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }

    fn logical_block_size(&self) -> u32 {
        self.logical_block_size
    }

    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        check_request(self, offset, buf.len() as u64)?;
        if buf.is_empty() {
            return Ok(()); // (as `write_impl`)
        }
        if self.needs_bounce(buf.as_ptr()) {
            let mut bounce = AlignedBuf::new(buf.len());
            self.pread_all(offset, &mut bounce)?;
            buf.copy_from_slice(&bounce);
            Ok(())
        } else {
            self.pread_all(offset, buf)
        }
    }

    fn read_vectored_at(&self, offset: u64, bufs: &mut [&mut [u8]]) -> Result<()> {
        let len: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        check_request(self, offset, len)?;
        if len == 0 {
            return Ok(());
        }
        if bufs.iter().any(|b| self.needs_bounce(b.as_ptr())) {
            // A misaligned buffer cannot take an O_DIRECT read (frontends' buffers seldom are
            // aligned): the whole range in one read into an aligned buffer, then copied out.
            let mut bounce = AlignedBuf::new(len as usize);
            self.pread_all(offset, &mut bounce)?;
            scatter(&bounce, bufs);
            return Ok(());
        }
        // At most `MAX_IOVECS` buffers per `preadv` (a 4 MiB read is 1,024 blocks and the
        // record headers between them).
        let mut at = offset;
        for chunk in bufs.chunks_mut(MAX_IOVECS) {
            self.preadv_all(at, chunk)?;
            at += chunk.iter().map(|b| b.len() as u64).sum::<u64>();
        }
        Ok(())
    }

    fn read_batch(&self, ranges: &mut [ReadRange<'_>]) -> Vec<Result<()>> {
        self.read_batch_inner(ranges, None)
    }

    fn read_batch_each(&self, ranges: &mut [ReadRange<'_>], each: &mut EachRange<'_>) -> Vec<Result<()>> {
        self.read_batch_inner(ranges, Some(each))
    }

    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
        self.write_impl(offset, buf, 0)
    }

    fn write_batch(&self, writes: &[(u64, &[u8])]) -> Vec<Result<()>> {
        let valid = writes
            .iter()
            .all(|&(offset, buf)| !buf.is_empty() && check_request(self, offset, buf.len() as u64).is_ok());
        if writes.len() < 2 || !valid {
            // (One write gains nothing from the ring; a bad one gets its precise error there.)
            return write_one_after_another(self, writes);
        }
        // A misaligned buffer is written from an aligned copy.
        let bounces: Vec<Option<AlignedBuf>> = writes
            .iter()
            .map(|&(_, buf)| self.needs_bounce(buf.as_ptr()).then(|| AlignedBuf::from_slice(buf)))
            .collect();
        let ops: Vec<uring::Vectored> = writes
            .iter()
            .zip(&bounces)
            .map(|(&(offset, buf), bounce)| {
                let from = bounce.as_deref().unwrap_or(buf);
                uring::Vectored {
                    offset,
                    iovecs: vec![libc::iovec { iov_base: from.as_ptr() as *mut libc::c_void, iov_len: from.len() }],
                }
            })
            .collect();
        // SAFETY: every iovec points into a buffer borrowed by `writes` or owned by `bounces`,
        // aligned for this file, both alive and unchanged until `writev_batch` returns; the
        // writes do not overlap (this method's contract).
        let Some(counts) = (unsafe { uring::writev_batch(self.file.as_raw_fd(), &ops) }) else {
            return write_one_after_another(self, writes);
        };
        drop(ops);
        writes
            .iter()
            .zip(counts)
            .map(|(&(offset, buf), count)| match count {
                Ok(n) if n == buf.len() => Ok(()),
                // A short write or any error: the write again, on its own (the synchronous path
                // resumes short writes, retries EINTR, and reports an error as the device
                // gives it to `pwrite`).
                _ => self.write_impl(offset, buf, 0),
            })
            .collect()
    }

    fn write_at_while(&self, offset: u64, buf: &[u8], during: &mut dyn FnMut()) -> Result<()> {
        if buf.is_empty() || self.needs_bounce(buf.as_ptr()) || check_request(self, offset, buf.len() as u64).is_err() {
            // (The syscall path gives a bad request its precise error, and bounces.)
            let written = self.write_impl(offset, buf, 0);
            during();
            return written;
        }
        // SAFETY: `buf` is borrowed for the call and aligned for this file (checked above).
        match unsafe { uring::write_while(self.file.as_raw_fd(), offset, buf, during) } {
            Some(Ok(n)) if n == buf.len() => Ok(()),
            // (A short write: the rest by syscall.)
            Some(Ok(n)) => self.pwrite_all(offset + n as u64, &buf[n..], 0),
            Some(Err(e)) if e.kind() == io::ErrorKind::Interrupted => self.pwrite_all(offset, buf, 0),
            Some(Err(e)) => Err(self.io_err("write", e)),
            None => {
                let written = self.write_impl(offset, buf, 0);
                during();
                written
            }
        }
    }

    fn write_fua_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
        self.write_impl(offset, buf, libc::RWF_DSYNC)
    }

    fn flush(&self) -> Result<()> {
        loop {
            match self.file.sync_data() {
                Ok(()) => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(self.io_err("fdatasync", e)),
            }
        }
    }

    fn discard(&self, offset: u64, len: u64) -> Result<()> {
        check_request(self, offset, len)?;
        if len == 0 {
            return Ok(());
        }
        let fd = self.file.as_raw_fd();
        let meta = self.file.metadata().map_err(|e| self.io_err("stat", e))?;
        let rc = if meta.file_type().is_block_device() {
            let range: [u64; 2] = [offset, len];
            // SAFETY: BLKDISCARD reads a [u64; 2] (start, length) from the pointer, which
            // points to a live local array.
            unsafe { libc::ioctl(fd, BLKDISCARD, range.as_ptr()) }
        } else {
            let off = libc::off_t::try_from(offset).expect("offset fits off_t");
            let l = libc::off_t::try_from(len).expect("len fits off_t");
            // SAFETY: fallocate on a valid fd with plain integer arguments.
            unsafe { libc::fallocate(fd, libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, off, l) }
        };
        if rc != 0 {
            let e = io::Error::last_os_error();
            // Discard is a hint: a device or file system that cannot do it loses nothing.
            if matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP) | Some(libc::ENOTTY)) {
                return Ok(());
            }
            return Err(self.io_err("discard", e));
        }
        Ok(())
    }

    fn describe(&self) -> String {
        self.path.display().to_string()
    }

    fn identity(&self) -> Option<String> {
        self.identity.clone()
    }

    fn atomic_write_bytes(&self) -> u32 {
        self.atomic_write_bytes
    }
}

/// The physical block size sysfs reports for a block device, or for the disk a regular file's
/// file system lives on (an aligned write of that size is not torn by a power loss: 4096 on
/// 4Kn and 512e disks). `None` where there is no such disk (tmpfs, overlay over one).
fn physical_block_size(meta: &std::fs::Metadata, is_block: bool) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let dev = if is_block { meta.rdev() } else { meta.dev() };
    let dir = PathBuf::from(format!("/sys/dev/block/{}:{}", libc::major(dev), libc::minor(dev)));
    let read = |p: PathBuf| std::fs::read_to_string(p).ok()?.trim().parse::<u32>().ok();
    read(dir.join("queue/physical_block_size")).or_else(|| read(dir.join("../queue/physical_block_size")))
}

/// The stable identity of a block device as sysfs reports it: the WWID (NVMe, and SCSI/SATA
/// disks with a WWN), else the serial number; for a partition, its disk's identity plus the
/// partition number. `None` for loop devices and whatever reports neither. Read from sysfs
/// rather than /dev/disk/by-id, which only exists where udev runs.
fn block_device_identity(meta: &std::fs::Metadata) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    let rdev = meta.rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let dir = PathBuf::from(format!("/sys/dev/block/{major}:{minor}"));
    let read = |p: PathBuf| std::fs::read_to_string(p).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty());
    let (disk, partition) = match read(dir.join("partition")) {
        Some(n) => (dir.join(".."), Some(n)),
        None => (dir.clone(), None),
    };
    let id = ["wwid", "device/wwid", "device/serial", "serial"].iter().find_map(|f| read(disk.join(f)))?;
    Some(match partition {
        Some(n) => format!("{id}-part{n}"),
        None => id,
    })
}

/// The process holding the `flock` on `file`'s inode, from /proc/locks (a FLOCK line's pid and
/// its device "MAJ:MIN:INODE", the numbers in hex, hex and decimal); None where it cannot tell.
fn lock_holder(file: &File) -> Option<u32> {
    use std::os::unix::fs::MetadataExt;
    let m = file.metadata().ok()?;
    let (major, minor) = (libc::major(m.dev()), libc::minor(m.dev()));
    let id = format!("{major:02x}:{minor:02x}:{}", m.ino());
    let locks = std::fs::read_to_string("/proc/locks").ok()?;
    locks.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        // "1: FLOCK  ADVISORY  WRITE 4242 fd:01:1234 0 EOF" ("->" marks a waiter).
        (f.get(1) == Some(&"FLOCK") && f.get(5) == Some(&id.as_str())).then(|| f.get(4)?.parse().ok()).flatten()
    })
}

// ioctl numbers from <linux/fs.h>; libc does not export them.
const BLKSSZGET: libc::c_ulong = 0x1268;
const BLKGETSIZE64: libc::c_ulong = 0x8008_1272;
const BLKDISCARD: libc::c_ulong = 0x1277;

fn block_device_size(file: &File, path: &Path) -> Result<u64> {
    let mut size: u64 = 0;
    // SAFETY: BLKGETSIZE64 writes one u64 through the pointer, which points to a live local.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKGETSIZE64, &mut size as *mut u64) };
    if rc != 0 {
        return Err(DeviceError::Io {
            path: path.into(),
            op: "ioctl(BLKGETSIZE64)",
            source: io::Error::last_os_error(),
        });
    }
    Ok(size)
}

fn block_device_sector_size(file: &File, path: &Path) -> Result<u32> {
    let mut size: libc::c_int = 0;
    // SAFETY: BLKSSZGET writes one int through the pointer, which points to a live local.
    let rc = unsafe { libc::ioctl(file.as_raw_fd(), BLKSSZGET, &mut size as *mut libc::c_int) };
    if rc != 0 {
        return Err(DeviceError::Io { path: path.into(), op: "ioctl(BLKSSZGET)", source: io::Error::last_os_error() });
    }
    let size = u32::try_from(size).expect("positive sector size");
    assert!(size.is_power_of_two() && size >= 512, "odd sector size {size}");
    Ok(size)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sized_file(dir: &tempfile::TempDir, name: &str, len: u64) -> PathBuf {
        let p = dir.path().join(name);
        let f = File::create(&p).unwrap();
        f.set_len(len).unwrap();
        p
    }

    #[test]
    fn write_read_flush_fua_discard_roundtrip() {
        let dir = tempfile::tempdir().unwrap();
        let p = sized_file(&dir, "dev", 1 << 20);
        for direct in [true, false] {
            let dev = match FileDevice::open_with(&p, OpenOptions { direct, lock: true, read_only: false }) {
                Err(DeviceError::DirectIoUnsupported { .. }) => continue, // tmpfs TMPDIR
                r => r.unwrap(),
            };
            assert_eq!(dev.size_bytes(), 1 << 20);
            let data = AlignedBuf::from_slice(&[0xab; 8192]);
            dev.write_at(4096, &data).unwrap();
            dev.write_fua_at(16384, &data[..4096]).unwrap();
            dev.flush().unwrap();
            // A misaligned user buffer still works (bounce buffer).
            let mut v = vec![0u8; 4096 + 1];
            dev.read_at(4096, &mut v[1..]).unwrap();
            assert!(v[1..].iter().all(|&b| b == 0xab));
            dev.discard(4096, 4096).unwrap();
            let mut back = AlignedBuf::new(4096);
            dev.read_at(4096, &mut back).unwrap();
            assert!(back.iter().all(|&b| b == 0), "punched hole reads as zeroes");
            drop(dev);
        }
    }

    /// A write with work to overlap (`write_at_while`, io_uring where available): the work
    /// runs exactly once and the data lands, direct or buffered, aligned or bounced; a bad
    /// request runs the work too and gets its precise error; a panic in the work waits for
    /// the write, whose data is then on the device, and goes on.
    #[test]
    fn a_write_with_work_meanwhile_lands_and_runs_the_work_once() {
        let dir = tempfile::tempdir().unwrap();
        let p = sized_file(&dir, "dev", 1 << 20);
        for direct in [true, false] {
            let dev = match FileDevice::open_with(&p, OpenOptions { direct, lock: true, read_only: false }) {
                Err(DeviceError::DirectIoUnsupported { .. }) => continue, // tmpfs TMPDIR
                r => r.unwrap(),
            };
            let read = |offset: u64, len: usize| {
                let mut back = AlignedBuf::new(len);
                dev.read_at(offset, &mut back).unwrap();
                back.to_vec()
            };
            let mut runs = 0;
            let data = AlignedBuf::from_slice(&[0x5a; 65536]);
            dev.write_at_while(8192, &data, &mut || runs += 1).unwrap();
            assert_eq!((runs, read(8192, 65536)), (1, data.to_vec()));
            let mut odd = vec![0x77u8; 4097];
            dev.write_at_while(0, &odd[1..], &mut || runs += 1).unwrap();
            assert_eq!((runs, read(0, 4096)), (2, odd.split_off(1)));
            let e = dev.write_at_while(1 << 20, &data[..4096], &mut || runs += 1);
            assert!(matches!(e, Err(DeviceError::OutOfRange { .. })), "{e:?}");
            assert_eq!(runs, 3);
            let fresh = AlignedBuf::from_slice(&[0x33; 4096]);
            let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                dev.write_at_while(4096 * 40, &fresh, &mut || panic!("the work failed"))
            }));
            assert!(panicked.is_err());
            assert_eq!(read(4096 * 40, 4096), fresh.to_vec());
        }
    }

    #[test]
    fn bad_requests_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let p = sized_file(&dir, "dev", 1 << 16);
        let dev = FileDevice::open_with(&p, OpenOptions { direct: false, lock: true, read_only: false }).unwrap();
        let buf = AlignedBuf::new(4096);
        assert!(matches!(dev.write_at(100, &buf), Err(DeviceError::Misaligned { .. })));
        assert!(matches!(dev.write_at(1 << 16, &buf), Err(DeviceError::OutOfRange { .. })));
        assert!(matches!(dev.write_at(u64::MAX - 4095, &buf), Err(DeviceError::OutOfRange { .. })));
        assert!(matches!(dev.write_at(0, &buf[..100]), Err(DeviceError::Misaligned { .. })));
    }

    #[test]
    fn bad_paths_get_precise_errors() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("missing");
        assert!(matches!(FileDevice::open(&missing), Err(DeviceError::NotFound { .. })));
        assert!(matches!(FileDevice::open(dir.path()), Err(DeviceError::IsDirectory { .. })));
        let odd = sized_file(&dir, "odd", 4096 + 100);
        let e = FileDevice::open_with(&odd, OpenOptions { direct: false, lock: true, read_only: false }).unwrap_err();
        assert!(matches!(e, DeviceError::MisalignedSize { size_bytes: 4196, .. }), "{e}");
        let empty = sized_file(&dir, "empty", 0);
        let e = FileDevice::open_with(&empty, OpenOptions { direct: false, lock: true, read_only: false }).unwrap_err();
        assert!(matches!(e, DeviceError::Empty { .. }), "{e}");
        let ro = sized_file(&dir, "ro", 4096);
        std::fs::set_permissions(&ro, std::fs::Permissions::from_mode(0o444)).unwrap();
        let e = FileDevice::open_with(&ro, OpenOptions { direct: false, lock: true, read_only: false }).unwrap_err();
        assert!(matches!(e, DeviceError::ReadOnly { .. }), "{e}");
        assert!(e.to_string().contains("0444"), "{e}");
        assert!(matches!(FileDevice::open("/dev/null"), Err(DeviceError::NotFileOrBlockDevice { .. })));
    }

    #[test]
    fn a_device_cannot_be_opened_twice() {
        let dir = tempfile::tempdir().unwrap();
        let p = sized_file(&dir, "dev", 1 << 16);
        let opts = OpenOptions { direct: false, lock: true, read_only: false };
        let first = FileDevice::open_with(&p, opts).unwrap();
        let e = FileDevice::open_with(&p, opts).unwrap_err();
        assert!(matches!(e, DeviceError::AlreadyOpen { .. }), "{e}");
        // The holder named (/proc/locks): this process, by its pid and name.
        let pid = std::process::id();
        assert!(matches!(e, DeviceError::AlreadyOpen { holder: Some(h), .. } if h == pid), "{e}");
        assert!(e.to_string().contains(&format!("its lock is held by pid {pid} (")), "{e}");
        assert_eq!(e.errno(), libc::EBUSY);
        drop(first);
        FileDevice::open_with(&p, opts).unwrap();
    }

    #[test]
    fn a_scatter_read_fills_each_buffer_in_order_aligned_or_not() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("dev");
        let data: Vec<u8> = (0..16 * 4096u32).map(|i| (i / 4096 * 7 + i % 251) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        for direct in [true, false] {
            let dev = match FileDevice::open_with(&p, OpenOptions { direct, lock: true, read_only: false }) {
                Ok(d) => d,
                Err(DeviceError::DirectIoUnsupported { .. }) => continue,
                Err(e) => panic!("{e}"),
            };
            // Aligned buffers (one preadv), then a misaligned one among them (read one by one).
            let (mut a, mut b, mut c) = (AlignedBuf::new(4096), AlignedBuf::new(2 * 4096), AlignedBuf::new(4096));
            dev.read_vectored_at(4096, &mut [&mut a[..], &mut b[..], &mut c[..]]).unwrap();
            assert_eq!(&a[..], &data[4096..8192]);
            assert_eq!(&b[..], &data[8192..16384]);
            assert_eq!(&c[..], &data[16384..20480]);
            let mut odd = vec![0u8; 4096 + 1];
            dev.read_vectored_at(0, &mut [&mut a[..], &mut odd[1..]]).unwrap();
            assert_eq!((&a[..], &odd[1..]), (&data[..4096], &data[4096..8192]));
        }
    }

    // ---- adversarial review of read_vectored_at (review-4)

    /// The read syscalls this thread has made so far (/proc/thread-self/io).
    fn syscr() -> u64 {
        let s = std::fs::read_to_string("/proc/thread-self/io").expect("task io accounting");
        s.lines().find_map(|l| l.strip_prefix("syscr: ")).expect("syscr").trim().parse().unwrap()
    }

    /// A file of `blocks` 4 KiB blocks, each with its own bytes, and those bytes (shared by
    /// the adversarial test modules below).
    pub(super) fn patterned(dir: &tempfile::TempDir, blocks: u32) -> (PathBuf, Vec<u8>) {
        let p = dir.path().join("dev");
        let data: Vec<u8> = (0..blocks * 4096).map(|i| (i / 4096 * 7 + i % 251) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        (p, data)
    }

    /// Zero-length buffers are a valid (empty) scatter list entry; a list of only empty
    /// buffers reads nothing and must succeed, as the default (one `read_at` each) does.
    #[test]
    fn a_scatter_read_of_only_empty_buffers_succeeds() {
        let dir = tempfile::tempdir().unwrap();
        let (p, _) = patterned(&dir, 4);
        let dev = FileDevice::open_with(&p, OpenOptions { direct: false, lock: true, read_only: false }).unwrap();
        let (mut a, mut b) = ([0u8; 0], [0u8; 0]);
        dev.read_at(4096, &mut a).expect("an empty read_at succeeds");
        dev.read_vectored_at(4096, &mut [&mut a[..], &mut b[..]]).expect("an empty scatter read succeeds");
    }

    /// Empty buffers among full ones are skipped and the others land in order.
    #[test]
    fn empty_buffers_among_full_ones_keep_the_order() {
        let dir = tempfile::tempdir().unwrap();
        let (p, data) = patterned(&dir, 4);
        let dev = FileDevice::open_with(&p, OpenOptions { direct: false, lock: true, read_only: false }).unwrap();
        let (mut a, mut b) = (AlignedBuf::new(4096), AlignedBuf::new(4096));
        let (mut e1, mut e2, mut e3) = ([0u8; 0], [0u8; 0], [0u8; 0]);
        dev.read_vectored_at(4096, &mut [&mut e1[..], &mut a[..], &mut e2[..], &mut b[..], &mut e3[..]]).unwrap();
        assert_eq!((&a[..], &b[..]), (&data[4096..8192], &data[8192..12288]));
    }

    /// A file that shrank under the device (size taken at open): the range past its end is
    /// an error, never zeroes or stale buffer contents.
    #[test]
    fn a_scatter_read_past_a_shrunk_files_end_is_an_error() {
        for direct in [false, true] {
            let dir = tempfile::tempdir().unwrap();
            let (p, _) = patterned(&dir, 8);
            let dev = match FileDevice::open_with(&p, OpenOptions { direct, lock: true, read_only: false }) {
                Ok(d) => d,
                Err(DeviceError::DirectIoUnsupported { .. }) => continue,
                Err(e) => panic!("{e}"),
            };
            std::fs::OpenOptions::new().write(true).open(&p).unwrap().set_len(5 * 4096 + 100).unwrap();
            let mut bufs: Vec<AlignedBuf> = (0..4).map(|_| AlignedBuf::new(4096)).collect();
            let mut refs: Vec<&mut [u8]> = bufs.iter_mut().map(|b| &mut b[..]).collect();
            let r = dev.read_vectored_at(3 * 4096, &mut refs);
            assert!(r.is_err(), "direct={direct}: a read past the file's end succeeded");
        }
    }

    /// More than IOV_MAX buffers: the fallback is one pread per buffer (1025 syscalls for
    /// 1025 blocks) instead of, e.g., two preadv calls of at most 1024 buffers each.
    #[test]
    fn more_than_1024_buffers_are_read_in_a_few_syscalls() {
        let dir = tempfile::tempdir().unwrap();
        let (p, data) = patterned(&dir, 1025);
        let dev = match FileDevice::open_with(&p, OpenOptions::default()) {
            Ok(d) => d,
            Err(DeviceError::DirectIoUnsupported { .. }) => return,
            Err(e) => panic!("{e}"),
        };
        let mut whole = AlignedBuf::new(1025 * 4096);
        let before = syscr();
        let mid = syscr();
        {
            let mut refs: Vec<&mut [u8]> = whole.chunks_mut(4096).collect();
            dev.read_vectored_at(0, &mut refs).unwrap();
        }
        let after = syscr();
        assert_eq!(&whole[..], &data[..]);
        let calls = after - mid - (mid - before);
        assert!(calls <= 2, "a 1025-buffer scatter read took {calls} read syscalls");
    }

    /// One misaligned buffer among 64: the fallback reads all 64 one by one (bounced), where
    /// one bounced read of the whole range would do.
    #[test]
    fn one_misaligned_buffer_does_not_split_a_scatter_read_per_buffer() {
        let dir = tempfile::tempdir().unwrap();
        let (p, data) = patterned(&dir, 64);
        let dev = match FileDevice::open_with(&p, OpenOptions::default()) {
            Ok(d) => d,
            Err(DeviceError::DirectIoUnsupported { .. }) => return,
            Err(e) => panic!("{e}"),
        };
        let mut raw = AlignedBuf::new(65 * 4096);
        let before = syscr();
        let mid = syscr();
        {
            let mut refs: Vec<&mut [u8]> = raw[1..1 + 64 * 4096].chunks_mut(4096).collect();
            dev.read_vectored_at(0, &mut refs).unwrap();
        }
        let after = syscr();
        assert_eq!(&raw[1..1 + 64 * 4096], &data[..]);
        let calls = after - mid - (mid - before);
        assert!(calls <= 2, "a 64-buffer misaligned scatter read took {calls} read syscalls");
    }

    /// A batch larger than a ring (RING_ENTRIES) of ranges of every shape (one buffer,
    /// several, a misaligned one, gaps between them), O_DIRECT and buffered: every byte lands
    /// where its range says, whatever order the kernel completed them in.
    #[test]
    fn a_batch_reads_every_range_into_place() {
        let dir = tempfile::tempdir().unwrap();
        let (p, data) = patterned(&dir, 512);
        for direct in [true, false] {
            let dev = match FileDevice::open_with(&p, OpenOptions { direct, lock: true, read_only: false }) {
                Err(DeviceError::DirectIoUnsupported { .. }) => continue,
                r => r.unwrap(),
            };
            let n = 3 * crate::uring::RING_ENTRIES + 5;
            let mut bufs: Vec<AlignedBuf> = (0..n).map(|i| AlignedBuf::new((1 + i % 3) * 4096 + 1)).collect();
            let mut ranges: Vec<ReadRange<'_>> = bufs
                .iter_mut()
                .enumerate()
                .map(|(i, b)| {
                    let offset = ((i * 5) % 500) as u64 * 4096;
                    let len = (1 + i % 3) * 4096;
                    let bufs = match i % 4 {
                        0 => vec![&mut b[..len]],
                        1 => b[..len].chunks_mut(4096).collect(),
                        2 => vec![&mut b[1..1 + len]], // misaligned: bounced
                        _ => {
                            let (x, y) = b[..len].split_at_mut(len.min(4096));
                            vec![x, y]
                        }
                    };
                    ReadRange { offset, bufs }
                })
                .collect();
            let results = dev.read_batch(&mut ranges);
            drop(ranges);
            assert_eq!(results.len(), n);
            for (i, (r, b)) in results.into_iter().zip(&bufs).enumerate() {
                r.unwrap_or_else(|e| panic!("range {i}: {e}"));
                let offset = (i * 5) % 500 * 4096;
                let len = (1 + i % 3) * 4096;
                let got = if i % 4 == 2 { &b[1..1 + len] } else { &b[..len] };
                assert_eq!(got, &data[offset..offset + len], "range {i} (direct {direct})");
            }
        }
    }

    /// `read_batch_each`: every range of a batch larger than a ring, of every shape (bounced
    /// ones too), and one out of the device, is handed over exactly once, with its final
    /// result, and with its data already in place when it is handed over (the engine checks
    /// checksums then); the results returned are the ones handed over. A panic in the
    /// callback comes back once nothing is in flight.
    #[test]
    fn a_batch_hands_each_range_over_once_with_its_data_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let (p, data) = patterned(&dir, 512);
        for direct in [true, false] {
            let dev = match FileDevice::open_with(&p, OpenOptions { direct, lock: true, read_only: false }) {
                Err(DeviceError::DirectIoUnsupported { .. }) => continue,
                r => r.unwrap(),
            };
            let n = 2 * crate::uring::RING_ENTRIES + 3;
            let bad = 7;
            let mut bufs: Vec<AlignedBuf> = (0..n).map(|i| AlignedBuf::new((1 + i % 3) * 4096 + 1)).collect();
            let mut ranges: Vec<ReadRange<'_>> = bufs
                .iter_mut()
                .enumerate()
                .map(|(i, b)| {
                    let offset = if i == bad { 512 * 4096 } else { ((i * 5) % 500) as u64 * 4096 };
                    let len = (1 + i % 3) * 4096;
                    let bufs = match i % 3 {
                        0 => vec![&mut b[..len]],
                        1 => b[..len].chunks_mut(4096).collect(),
                        _ => vec![&mut b[1..1 + len]], // misaligned: bounced
                    };
                    ReadRange { offset, bufs }
                })
                .collect();
            let mut handed: Vec<Option<bool>> = vec![None; n];
            let results = dev.read_batch_each(&mut ranges, &mut |k, range, result| {
                assert!(handed[k].is_none(), "range {k} handed over twice");
                handed[k] = Some(result.is_ok());
                if result.is_ok() {
                    let got: Vec<u8> = range.bufs.iter().flat_map(|b| b.iter().copied()).collect();
                    let offset = range.offset as usize;
                    assert_eq!(got, &data[offset..offset + got.len()], "range {k} (direct {direct}) when handed over");
                }
            });
            assert_eq!(results.len(), n);
            for (k, r) in results.iter().enumerate() {
                assert_eq!(handed[k], Some(r.is_ok()), "range {k}: handed over as returned");
                assert_eq!(r.is_ok(), k != bad, "range {k}: {r:?}");
            }
            let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                dev.read_batch_each(&mut ranges, &mut |k, _, _| assert_ne!(k, 3, "a callback's panic"))
            }));
            assert!(caught.is_err(), "the callback's panic comes back");
            drop(ranges);
            for (i, b) in bufs.iter().enumerate().filter(|&(i, _)| i != bad) {
                let offset = (i * 5) % 500 * 4096;
                let len = (1 + i % 3) * 4096;
                let got = if i % 3 == 2 { &b[1..1 + len] } else { &b[..len] };
                assert_eq!(got, &data[offset..offset + len], "range {i} (direct {direct})");
            }
        }
    }

    /// A bad range (out of the device, misaligned) gets its own precise error; the others of
    /// the batch are read all the same.
    #[test]
    fn a_bad_range_in_a_batch_fails_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (p, data) = patterned(&dir, 16);
        let dev = match FileDevice::open_with(&p, OpenOptions::default()) {
            Err(DeviceError::DirectIoUnsupported { .. }) => return,
            r => r.unwrap(),
        };
        let (mut a, mut b, mut c) = (AlignedBuf::new(4096), AlignedBuf::new(4096), AlignedBuf::new(4096));
        let mut ranges = vec![
            ReadRange { offset: 0, bufs: vec![&mut a[..]] },
            ReadRange { offset: 16 * 4096, bufs: vec![&mut b[..]] },
            ReadRange { offset: 4096, bufs: vec![&mut c[..]] },
        ];
        let results = dev.read_batch(&mut ranges);
        drop(ranges);
        assert!(results[0].is_ok() && results[2].is_ok());
        assert!(matches!(results[1], Err(DeviceError::OutOfRange { .. })), "{:?}", results[1]);
        assert_eq!(&a[..], &data[..4096]);
        assert_eq!(&c[..], &data[4096..8192]);
    }

    /// Several ranges go to the kernel together through the thread's io_uring, not as one
    /// read syscall each (where io_uring is available: elsewhere the batch falls back to one
    /// read after another, which the tests above cover).
    #[test]
    fn a_batch_is_not_one_read_syscall_per_range() {
        let dir = tempfile::tempdir().unwrap();
        let (p, data) = patterned(&dir, 64);
        let dev = match FileDevice::open_with(&p, OpenOptions::default()) {
            Err(DeviceError::DirectIoUnsupported { .. }) => return,
            r => r.unwrap(),
        };
        let mut whole = AlignedBuf::new(64 * 4096);
        let before = syscr();
        let mid = syscr();
        let results = {
            let mut ranges: Vec<ReadRange<'_>> = whole
                .chunks_mut(8 * 4096)
                .enumerate()
                .map(|(i, b)| ReadRange { offset: i as u64 * 8 * 4096, bufs: vec![b] })
                .collect();
            dev.read_batch(&mut ranges)
        };
        let after = syscr();
        assert!(results.iter().all(|r| r.is_ok()));
        assert_eq!(&whole[..], &data[..]);
        let calls = after - mid - (mid - before);
        if crate::uring::UNAVAILABLE.load(std::sync::atomic::Ordering::Relaxed) {
            eprintln!("io_uring unavailable here: {calls} read syscalls for 8 ranges");
        } else {
            assert_eq!(calls, 0, "8 ranges through io_uring took {calls} read syscalls");
        }
    }
    fn syscw() -> u64 {
        let s = std::fs::read_to_string("/proc/thread-self/io").expect("task io accounting");
        s.lines().find_map(|l| l.strip_prefix("syscw: ")).expect("syscw").trim().parse().unwrap()
    }

    /// A batch of writes larger than a ring (RING_ENTRIES), some from misaligned buffers, at
    /// scattered offsets, O_DIRECT and buffered: every byte lands where its write says, and
    /// nothing else changes.
    #[test]
    fn a_batch_writes_every_range_into_place() {
        let dir = tempfile::tempdir().unwrap();
        let (p, mut expect) = patterned(&dir, 512);
        for direct in [true, false] {
            let dev = match FileDevice::open_with(&p, OpenOptions { direct, lock: true, read_only: false }) {
                Err(DeviceError::DirectIoUnsupported { .. }) => continue,
                r => r.unwrap(),
            };
            let n = 3 * crate::uring::RING_ENTRIES + 5;
            let bufs: Vec<AlignedBuf> = (0..n)
                .map(|i| {
                    let len = (1 + i % 3) * 4096;
                    let fill: Vec<u8> = (0..len + 1).map(|k| (i * 31 + k + usize::from(direct)) as u8).collect();
                    AlignedBuf::from_slice(&fill)
                })
                .collect();
            // (Offsets 4 blocks apart, each write at most 3 blocks: none overlaps.)
            let writes: Vec<(u64, &[u8])> = bufs
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    let len = (1 + i % 3) * 4096;
                    let offset = ((i * 4 * 37) % 508) as u64 / 4 * 4 * 4096;
                    let data = if i % 4 == 2 { &b[1..1 + len] } else { &b[..len] }; // misaligned: bounced
                    (offset, data)
                })
                .collect();
            let mut offsets: Vec<u64> = writes.iter().map(|w| w.0).collect();
            offsets.sort_unstable();
            offsets.dedup();
            assert_eq!(offsets.len(), n, "the test's writes overlap");
            let results = dev.write_batch(&writes);
            assert_eq!(results.len(), n);
            for (i, r) in results.into_iter().enumerate() {
                r.unwrap_or_else(|e| panic!("write {i}: {e}"));
            }
            for &(offset, data) in &writes {
                expect[offset as usize..offset as usize + data.len()].copy_from_slice(data);
            }
            assert!(read_back(&dev, 0, 512 * 4096) == expect, "the file after the batch (direct {direct})");
        }
    }

    /// A bad write (out of the device, misaligned) gets its own precise error; the others of
    /// the batch land all the same.
    #[test]
    fn a_bad_write_in_a_batch_fails_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (p, _) = patterned(&dir, 16);
        let dev = match FileDevice::open_with(&p, OpenOptions::default()) {
            Err(DeviceError::DirectIoUnsupported { .. }) => return,
            r => r.unwrap(),
        };
        let (a, b, c) = (
            AlignedBuf::from_slice(&[1; 4096]),
            AlignedBuf::from_slice(&[2; 4096]),
            AlignedBuf::from_slice(&[3; 4096]),
        );
        let results = dev.write_batch(&[(0, &a[..]), (16 * 4096, &b[..]), (4096 + 512, &c[..]), (8192, &c[..])]);
        assert!(results[0].is_ok() && results[3].is_ok(), "{results:?}");
        assert!(matches!(results[1], Err(DeviceError::OutOfRange { .. })), "{:?}", results[1]);
        assert!(matches!(results[2], Err(DeviceError::Misaligned { .. })), "{:?}", results[2]);
        assert_eq!(read_back(&dev, 0, 4096), vec![1; 4096]);
        assert_eq!(read_back(&dev, 8192, 4096), vec![3; 4096]);
    }

    /// Several writes go to the kernel together through the thread's io_uring, not as one
    /// write syscall each (where io_uring is available: elsewhere the batch falls back to one
    /// write after another, which the tests above cover).
    #[test]
    fn a_batch_is_not_one_write_syscall_per_range() {
        let dir = tempfile::tempdir().unwrap();
        let (p, _) = patterned(&dir, 64);
        let dev = match FileDevice::open_with(&p, OpenOptions::default()) {
            Err(DeviceError::DirectIoUnsupported { .. }) => return,
            r => r.unwrap(),
        };
        let whole = AlignedBuf::from_slice(&[9; 64 * 4096]);
        let writes: Vec<(u64, &[u8])> =
            whole.chunks(8 * 4096).enumerate().map(|(i, b)| (i as u64 * 8 * 4096, b)).collect();
        let before = syscw();
        let mid = syscw();
        let results = dev.write_batch(&writes);
        let after = syscw();
        assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
        assert_eq!(read_back(&dev, 0, 64 * 4096), vec![9; 64 * 4096]);
        let calls = after - mid - (mid - before);
        if crate::uring::UNAVAILABLE.load(std::sync::atomic::Ordering::Relaxed) {
            eprintln!("io_uring unavailable here: {calls} write syscalls for 8 writes");
        } else {
            assert_eq!(calls, 0, "8 writes through io_uring took {calls} write syscalls");
        }
    }

    // ------------------------------------------------------------------------------------------
    // Adversarial review of d04ffd7 (`write_at_while` through the thread's io_uring). Each test
    // is one suspicion; the comment says whether it held (BUG) or was refuted.

    /// Held by the tests below that switch io_uring off for the process or count its rings.
    static RING_TESTS: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// The io_uring instances this process has open.
    fn io_uring_fds() -> usize {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|l| l.to_string_lossy().contains("io_uring"))
            .count()
    }

    /// The devices to try: direct if the file system takes O_DIRECT, and buffered.
    fn both_modes(p: &Path) -> Vec<FileDevice> {
        [true, false]
            .into_iter()
            .filter_map(|direct| {
                match FileDevice::open_with(p, OpenOptions { direct, lock: false, read_only: false }) {
                    Err(DeviceError::DirectIoUnsupported { .. }) => None,
                    r => Some(r.unwrap()),
                }
            })
            .collect()
    }

    fn read_back(dev: &FileDevice, offset: u64, len: usize) -> Vec<u8> {
        let mut back = AlignedBuf::new(len);
        dev.read_at(offset, &mut back).unwrap();
        back.to_vec()
    }

    /// Two ranges read together (`read_batch` goes through the ring for two or more).
    fn batch_read(dev: &FileDevice, a: u64, b: u64, len: usize) -> (Vec<u8>, Vec<u8>) {
        let (mut x, mut y) = (AlignedBuf::new(len), AlignedBuf::new(len));
        let results = dev.read_batch(&mut [
            ReadRange { offset: a, bufs: vec![&mut x[..]] },
            ReadRange { offset: b, bufs: vec![&mut y[..]] },
        ]);
        assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
        (x.to_vec(), y.to_vec())
    }

    // Suspicion: the engine's nested record write is a `write_at_while` issued from inside
    // another's work, on the same thread, while the outer write holds the thread's ring out of
    // its slot; the work may also read through `read_batch` on that thread. The nested call
    // creates a ring and leaves it in the slot, the outer one puts its own back over it: a
    // completion reaped by the wrong call (a write reported done before its data landed), a
    // work run twice or not at all, data not landed, or the thread's ring unusable after.
    //
    // Refuted (passes): every work runs once, every write lands, reads inside and after work.
    #[test]
    fn nested_writes_with_work_and_batched_reads_on_one_thread() {
        let dir = tempfile::tempdir().unwrap();
        let p = sized_file(&dir, "dev", 4 << 20);
        for dev in both_modes(&p) {
            let a = AlignedBuf::from_slice(&[0x11; 1 << 20]);
            let b = AlignedBuf::from_slice(&[0x22; 1 << 20]);
            let c = AlignedBuf::from_slice(&[0x33; 8192]);
            dev.write_at(3 << 20, &c).unwrap();
            dev.write_at((3 << 20) + 65536, &c).unwrap();
            let (mut outer, mut nested) = (0, 0);
            dev.write_at_while(0, &a, &mut || {
                outer += 1;
                dev.write_at_while(1 << 20, &b, &mut || {
                    nested += 1;
                    // A batched read inside the innermost work (the thread's slot is empty).
                    let (x, y) = batch_read(&dev, 3 << 20, (3 << 20) + 65536, 8192);
                    assert_eq!((x, y), (c.to_vec(), c.to_vec()));
                })
                .unwrap();
                // The nested write has landed when it returns.
                assert_eq!(read_back(&dev, 1 << 20, 1 << 20), b.to_vec());
            })
            .unwrap();
            assert_eq!((outer, nested), (1, 1));
            assert_eq!(read_back(&dev, 0, 1 << 20), a.to_vec());
            // The thread's ring after all that: batches and writes with work still work.
            let (x, y) = batch_read(&dev, 0, 1 << 20, 4096);
            assert_eq!((x, y), (vec![0x11; 4096], vec![0x22; 4096]));
            let d = AlignedBuf::from_slice(&[0x44; 4096]);
            let mut runs = 0;
            dev.write_at_while(2 << 20, &d, &mut || runs += 1).unwrap();
            assert_eq!((runs, read_back(&dev, 2 << 20, 4096)), (1, d.to_vec()));
        }
    }

    // Suspicion: a panic in the nested work unwinds through two writes in flight: the nested
    // write_while waits for its write, puts its ring in the slot and resumes; the outer one
    // catches that, waits for its own, puts its ring back and resumes. A write returning (or
    // unwinding) before its data landed would let the kernel read freed memory; a ring left
    // half-used would break the thread's next batch.
    //
    // Refuted (passes).
    #[test]
    fn a_panic_in_a_nested_work_waits_for_both_writes() {
        let dir = tempfile::tempdir().unwrap();
        let p = sized_file(&dir, "dev", 4 << 20);
        for dev in both_modes(&p) {
            let a = AlignedBuf::from_slice(&[0x55; 1 << 20]);
            let b = AlignedBuf::from_slice(&[0x66; 1 << 20]);
            let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                dev.write_at_while(0, &a, &mut || {
                    let _ = dev.write_at_while(1 << 20, &b, &mut || panic!("the nested work failed"));
                })
            }));
            assert!(panicked.is_err());
            assert_eq!(read_back(&dev, 0, 1 << 20), a.to_vec());
            assert_eq!(read_back(&dev, 1 << 20, 1 << 20), b.to_vec());
            let (x, y) = batch_read(&dev, 0, 1 << 20, 4096);
            assert_eq!((x, y), (vec![0x55; 4096], vec![0x66; 4096]));
        }
    }

    // Suspicion: where io_uring is unavailable (`UNAVAILABLE`, an old kernel or a seccomp
    // filter) `write_while` returns None and the syscall path must still run the work exactly
    // once, after landing the data; a nested call likewise.
    //
    // Refuted (passes).
    #[test]
    fn writes_with_work_without_io_uring() {
        let dir = tempfile::tempdir().unwrap();
        let p = sized_file(&dir, "dev", 4 << 20);
        let _serial = RING_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        let was = uring::UNAVAILABLE.swap(true, std::sync::atomic::Ordering::SeqCst);
        let run = || {
            for dev in both_modes(&p) {
                let a = AlignedBuf::from_slice(&[0x77; 65536]);
                let b = AlignedBuf::from_slice(&[0x78; 65536]);
                let (mut outer, mut nested) = (0, 0);
                dev.write_at_while(0, &a, &mut || {
                    outer += 1;
                    // (The fallback writes, then runs the work: the data is there already.)
                    assert_eq!(read_back(&dev, 0, 65536), a.to_vec());
                    dev.write_at_while(65536, &b, &mut || nested += 1).unwrap();
                })
                .unwrap();
                assert_eq!((outer, nested), (1, 1));
                assert_eq!(read_back(&dev, 65536, 65536), b.to_vec());
            }
        };
        let r = std::panic::catch_unwind(run);
        uring::UNAVAILABLE.store(was, std::sync::atomic::Ordering::SeqCst);
        r.unwrap();
    }

    // Suspicion (cost, not correctness): the thread's ring is taken out of its slot while the
    // work runs, so the engine's nested record write (a `write_at_while` inside the work, on
    // the same thread) finds no ring and creates a new io_uring instance (io_uring_setup and
    // its mmaps), which it leaves in the slot, where the outer write then puts its own ring
    // back and drops it (munmap, close, the kernel's asynchronous ring teardown): a ring
    // created and destroyed for every nested record, i.e. on every large lone write, on the
    // path whose point was to save time. uring.rs promises "a small io_uring per thread",
    // created on the thread's first batch.
    //
    // BUG (cost; fails on d04ffd7): inside the nested work the process has one io_uring more
    // than before the outer write, at every try: "a nested write_at_while created an io_uring
    // of its own each time (before -> inside): [(2, 3), (2, 3), (2, 3), (1, 2), (3, 4)]".
    // Correctness holds (the tests above); the cost measured here was modest (2,000 nested
    // pairs of 4 KiB O_DIRECT writes: 174-209 ms, against 285-328 ms one after the other), so
    // a ring set up and torn down per nested record, some tens of microseconds at most.
    // (Tried five times: a ring another test creates meanwhile cannot make all five fail once
    // fixed.) Fixed: a second, spare ring per thread (uring.rs `SPARE`).
    #[test]
    fn a_nested_write_with_work_reuses_a_ring_instead_of_creating_one() {
        let _serial = RING_TESTS.lock().unwrap_or_else(|e| e.into_inner());
        if uring::UNAVAILABLE.load(std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let p = sized_file(&dir, "dev", 4 << 20);
        let dev = both_modes(&p).into_iter().next().unwrap();
        let a = AlignedBuf::from_slice(&[0x11; 1 << 20]);
        let b = AlignedBuf::from_slice(&[0x22; 1 << 20]);
        // This thread's ring exists (a first write with work creates it).
        dev.write_at_while(0, &a, &mut || {}).unwrap();
        let mut seen = Vec::new();
        for _ in 0..5 {
            let before = io_uring_fds();
            let mut inside = 0;
            dev.write_at_while(0, &a, &mut || {
                dev.write_at_while(1 << 20, &b, &mut || inside = io_uring_fds()).unwrap();
            })
            .unwrap();
            seen.push((before, inside));
        }
        assert!(
            seen.iter().any(|&(before, inside)| inside <= before),
            "a nested write_at_while created an io_uring of its own each time (before -> inside): {seen:?}"
        );
    }
}

/// Adversarial review of `FileDevice::read_batch` / uring.rs (commit 394453e).
#[cfg(test)]
mod adversarial_batch_tests {
    use super::tests::patterned;
    use super::*;
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::Arc;

    /// `p` opened unlocked, O_DIRECT or not (None where the file system refuses O_DIRECT).
    pub(super) fn open(p: &Path, direct: bool) -> Option<FileDevice> {
        match FileDevice::open_with(p, OpenOptions { direct, lock: false, read_only: false }) {
            Err(DeviceError::DirectIoUnsupported { .. }) => None,
            r => Some(r.unwrap()),
        }
    }

    /// One range of more than IOV_MAX buffers sends the whole batch to the sequential path;
    /// a range of exactly 1024 goes through the ring. Every byte in place either way.
    #[test]
    fn adv_more_than_1024_iovecs_and_exactly_1024() {
        let dir = tempfile::tempdir().unwrap();
        let (p, data) = patterned(&dir, 3000);
        for direct in [true, false] {
            let Some(dev) = open(&p, direct) else { continue };
            for (n0, n1) in [(1500usize, 1024usize), (1024, 1), (1025, 3)] {
                let mut a = AlignedBuf::new(n0 * 4096);
                let mut b = AlignedBuf::new(n1 * 4096);
                let off1 = 1600 * 4096u64;
                let results = {
                    let mut ranges = vec![
                        ReadRange { offset: 4096, bufs: a.chunks_mut(4096).collect() },
                        ReadRange { offset: off1, bufs: b.chunks_mut(4096).collect() },
                    ];
                    dev.read_batch(&mut ranges)
                };
                assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
                assert_eq!(&a[..], &data[4096..4096 + n0 * 4096], "({n0},{n1}) direct {direct}");
                assert_eq!(&b[..], &data[off1 as usize..off1 as usize + n1 * 4096], "({n0},{n1}) direct {direct}");
            }
        }
    }

    /// Empty buffers inside a range (one with an aligned pointer, one dangling), and a batch
    /// with an all-empty range.
    #[test]
    fn adv_empty_buffers_in_a_batch() {
        let dir = tempfile::tempdir().unwrap();
        let (p, data) = patterned(&dir, 64);
        for direct in [true, false] {
            let Some(dev) = open(&p, direct) else { continue };
            let mut a = AlignedBuf::new(3 * 4096);
            let mut c = AlignedBuf::new(4096);
            let mut empty: [u8; 0] = [];
            let results = {
                let (x, rest) = a.split_at_mut(4096);
                let (e, rest) = rest.split_at_mut(0);
                let mut ranges = vec![
                    ReadRange { offset: 8 * 4096, bufs: vec![x, e, &mut empty[..], rest] },
                    ReadRange { offset: 40 * 4096, bufs: vec![&mut c[..]] },
                ];
                dev.read_batch(&mut ranges)
            };
            assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
            assert_eq!(&a[..], &data[8 * 4096..11 * 4096]);
            assert_eq!(&c[..], &data[40 * 4096..41 * 4096]);
            // A batch with a range of nothing at all.
            let mut d = AlignedBuf::new(4096);
            let results = {
                let mut ranges =
                    vec![ReadRange { offset: 0, bufs: vec![] }, ReadRange { offset: 4096, bufs: vec![&mut d[..]] }];
                dev.read_batch(&mut ranges)
            };
            assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
            assert_eq!(&d[..], &data[4096..8192]);
        }
    }

    /// io_uring unavailable: every batch one read after another, still right.
    #[test]
    fn adv_unavailable_falls_back_sequentially() {
        let dir = tempfile::tempdir().unwrap();
        let (p, data) = patterned(&dir, 256);
        crate::uring::UNAVAILABLE.store(true, Ordering::Relaxed);
        for direct in [true, false] {
            let Some(dev) = open(&p, direct) else { continue };
            let n = 40;
            let mut bufs: Vec<AlignedBuf> = (0..n).map(|_| AlignedBuf::new(2 * 4096 + 1)).collect();
            let results = {
                let mut ranges: Vec<ReadRange<'_>> = bufs
                    .iter_mut()
                    .enumerate()
                    .map(|(i, b)| {
                        let bufs =
                            if i % 2 == 0 { vec![&mut b[1..1 + 8192]] } else { b[..8192].chunks_mut(4096).collect() };
                        ReadRange { offset: (i as u64 * 3 % 250) * 4096, bufs }
                    })
                    .collect();
                dev.read_batch(&mut ranges)
            };
            for (i, (r, b)) in results.iter().zip(&bufs).enumerate() {
                assert!(r.is_ok(), "{i}: {r:?}");
                let off = (i * 3 % 250) * 4096;
                let got = if i % 2 == 0 { &b[1..1 + 8192] } else { &b[..8192] };
                assert_eq!(got, &data[off..off + 8192], "range {i}");
            }
        }
        crate::uring::UNAVAILABLE.store(false, Ordering::Relaxed);
    }

    /// The file shrank under the device: the ring returns a short read (or 0) for the
    /// ranges at and past the new end; they must fail (not return stale/zero data as Ok),
    /// and the range before the end must be right.
    #[test]
    fn adv_short_reads_when_the_file_shrank() {
        let dir = tempfile::tempdir().unwrap();
        let (p, data) = patterned(&dir, 64);
        for direct in [true, false] {
            std::fs::write(&p, &data).unwrap();
            let Some(dev) = open(&p, direct) else { continue };
            std::fs::OpenOptions::new().write(true).open(&p).unwrap().set_len(32 * 4096).unwrap();
            let (mut a, mut b, mut c, mut m) = (
                AlignedBuf::new(4096),
                AlignedBuf::new(2 * 4096),
                AlignedBuf::new(4096),
                AlignedBuf::new(2 * 4096 + 1),
            );
            let results = {
                let mut ranges = vec![
                    ReadRange { offset: 0, bufs: vec![&mut a[..]] },
                    ReadRange { offset: 31 * 4096, bufs: vec![&mut b[..]] },
                    ReadRange { offset: 40 * 4096, bufs: vec![&mut c[..]] },
                    ReadRange { offset: 31 * 4096, bufs: vec![&mut m[1..]] },
                ];
                dev.read_batch(&mut ranges)
            };
            assert!(results[0].is_ok(), "{:?}", results[0]);
            assert_eq!(&a[..], &data[..4096]);
            assert!(results[1].is_err(), "a range across the new end must fail (direct {direct}): {:?}", results[1]);
            assert!(results[2].is_err(), "a range past the new end must fail (direct {direct}): {:?}", results[2]);
            assert!(results[3].is_err(), "a bounced range across the new end must fail (direct {direct})");
        }
    }

    extern "C" fn on_signal(_: libc::c_int) {}

    /// Installs a SIGUSR1 handler that does nothing, without SA_RESTART, and starts a thread
    /// sending SIGUSR1 to the calling thread every 5 µs until the flag is set (then join it
    /// for the count): io_uring_enter and the synchronous retries see EINTR over and over.
    pub(super) fn signal_storm() -> (Arc<AtomicBool>, std::thread::JoinHandle<u64>) {
        // SAFETY: a handler that does nothing, installed without SA_RESTART.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = on_signal as extern "C" fn(libc::c_int) as usize;
            sa.sa_flags = 0;
            libc::sigemptyset(&mut sa.sa_mask);
            assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
        }
        let stop = Arc::new(AtomicBool::new(false));
        // SAFETY: pthread_self has no preconditions.
        let me = unsafe { libc::pthread_self() } as usize;
        let killer = {
            let stop = Arc::clone(&stop);
            std::thread::spawn(move || {
                let mut sent = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    // SAFETY: the signalled thread outlives this loop (it joins this one
                    // after setting `stop`).
                    unsafe { libc::pthread_kill(me as libc::pthread_t, libc::SIGUSR1) };
                    sent += 1;
                    std::thread::sleep(std::time::Duration::from_micros(5));
                }
                sent
            })
        };
        (stop, killer)
    }

    /// Signals without SA_RESTART hammer the reading thread: io_uring_enter and the
    /// synchronous retries return EINTR; every batch must still be whole and right.
    #[test]
    fn adv_batches_survive_signals_eintr() {
        let dir = tempfile::tempdir().unwrap();
        let (p, data) = patterned(&dir, 512);
        for direct in [true, false] {
            let Some(dev) = open(&p, direct) else { continue };
            let (stop, killer) = signal_storm();
            for round in 0..1500usize {
                let n = 2 + round % 40;
                let mut bufs: Vec<AlignedBuf> = (0..n).map(|_| AlignedBuf::new(4 * 4096 + 1)).collect();
                let results = {
                    let mut ranges: Vec<ReadRange<'_>> = bufs
                        .iter_mut()
                        .enumerate()
                        .map(|(i, b)| {
                            let off = ((round * 13 + i * 17) % 500) as u64 * 4096;
                            let bufs = if i % 3 == 0 {
                                vec![&mut b[1..1 + 4 * 4096]]
                            } else {
                                b[..4 * 4096].chunks_mut(4096).collect()
                            };
                            ReadRange { offset: off, bufs }
                        })
                        .collect();
                    dev.read_batch(&mut ranges)
                };
                for (i, (r, b)) in results.iter().zip(&bufs).enumerate() {
                    assert!(r.is_ok(), "round {round} range {i}: {r:?}");
                    let off = ((round * 13 + i * 17) % 500) * 4096;
                    let got = if i % 3 == 0 { &b[1..1 + 4 * 4096] } else { &b[..4 * 4096] };
                    assert_eq!(got, &data[off..off + 4 * 4096], "round {round} range {i} direct {direct}");
                }
            }
            stop.store(true, Ordering::Relaxed);
            let sent = killer.join().unwrap();
            eprintln!("direct {direct}: {sent} signals");
        }
    }

    fn uring_fds() -> usize {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|t| t.to_string_lossy().contains("io_uring"))
            .count()
    }

    /// Many threads batch at once (a ring each); their rings close when they exit.
    #[test]
    fn adv_many_threads_rings_and_their_fds() {
        let dir = tempfile::tempdir().unwrap();
        let (p, data) = patterned(&dir, 256);
        let Some(dev) = open(&p, true).or_else(|| open(&p, false)) else { return };
        let dev = Arc::new(dev);
        let data = Arc::new(data);
        let before = uring_fds();
        let threads: Vec<_> = (0..48)
            .map(|t| {
                let (dev, data) = (Arc::clone(&dev), Arc::clone(&data));
                std::thread::spawn(move || {
                    for round in 0..50usize {
                        let mut bufs: Vec<AlignedBuf> = (0..5).map(|_| AlignedBuf::new(8192)).collect();
                        let offs: Vec<usize> = (0..5).map(|i| (t * 7 + round * 3 + i * 11) % 250).collect();
                        let results = {
                            let mut ranges: Vec<ReadRange<'_>> = bufs
                                .iter_mut()
                                .zip(&offs)
                                .map(|(b, &o)| ReadRange { offset: o as u64 * 4096, bufs: vec![&mut b[..]] })
                                .collect();
                            dev.read_batch(&mut ranges)
                        };
                        for ((r, b), &o) in results.iter().zip(&bufs).zip(&offs) {
                            assert!(r.is_ok());
                            assert_eq!(&b[..], &data[o * 4096..o * 4096 + 8192]);
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(uring_fds(), before, "rings of exited threads are closed");
    }

    /// The child half of `adv_io_uring_enter_denied_falls_back`: a seccomp filter makes
    /// io_uring_enter fail with EPERM (io_uring_setup still works, as under a sandbox that
    /// filters only the former), then one batch. (Does nothing unless run as the child.)
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn adv_child_enter_denied() {
        let Ok(path) = std::env::var("ADV_CHILD_PATH") else { return };
        let dev = open(Path::new(&path), false).unwrap();
        // SAFETY: installs a seccomp filter on this thread: io_uring_enter (426) -> EPERM.
        unsafe {
            let filter = [
                libc::sock_filter { code: 0x20, jt: 0, jf: 0, k: 0 },   // ld nr
                libc::sock_filter { code: 0x15, jt: 0, jf: 1, k: 426 }, // jeq io_uring_enter
                libc::sock_filter { code: 0x06, jt: 0, jf: 0, k: 0x0005_0000 | libc::EPERM as u32 },
                libc::sock_filter { code: 0x06, jt: 0, jf: 0, k: 0x7fff_0000 },
            ];
            let prog = libc::sock_fprog { len: filter.len() as u16, filter: filter.as_ptr() as *mut _ };
            assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
            assert_eq!(libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &prog as *const _), 0);
        }
        let (mut a, mut b) = (AlignedBuf::new(4096), AlignedBuf::new(4096));
        let results = {
            let mut ranges = vec![
                ReadRange { offset: 0, bufs: vec![&mut a[..]] },
                ReadRange { offset: 4096, bufs: vec![&mut b[..]] },
            ];
            dev.read_batch(&mut ranges)
        };
        assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
        println!("CHILD-OK");
    }

    /// io_uring_setup works but io_uring_enter is refused (nothing was ever submitted, so
    /// nothing is in flight): the batch should fall back to sequential reads, not abort.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn adv_io_uring_enter_denied_falls_back() {
        let dir = tempfile::tempdir().unwrap();
        let (p, _) = patterned(&dir, 16);
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "file::adversarial_batch_tests::adv_child_enter_denied",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("ADV_CHILD_PATH", &p)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stdout.contains("CHILD-OK"),
            "child: {:?}\nstdout: {stdout}\nstderr: {stderr}",
            out.status
        );
    }
}

/// Adversarial review of 5eb9482 (`BlockDevice::write_batch`: `FileDevice` through the thread's
/// io_uring, `EmulatedDevice` as concurrent bookings, `SimDevice` in a seeded order). Each test
/// is one suspicion; its comment says whether it held (BUG) or was refuted.
#[cfg(test)]
mod adversarial_write_batch_tests {
    use super::adversarial_batch_tests::open;
    use super::*;
    use crate::{EmulatedDevice, FailMode, OpKind, SimDevice, PROFILES};
    use std::sync::atomic::Ordering;
    use std::sync::{Arc, Mutex};

    /// Held by the tests here that switch io_uring off for the process or count its rings.
    static SERIAL: Mutex<()> = Mutex::new(());

    fn serial() -> std::sync::MutexGuard<'static, ()> {
        SERIAL.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn file(dir: &tempfile::TempDir, blocks: u64) -> PathBuf {
        let p = dir.path().join("dev");
        let data: Vec<u8> = (0..blocks * 4096).map(|i| (i / 4096 * 5 + i % 241) as u8).collect();
        std::fs::write(&p, data).unwrap();
        p
    }

    fn read_back(dev: &FileDevice, offset: u64, len: usize) -> Vec<u8> {
        let mut back = AlignedBuf::new(len);
        dev.read_at(offset, &mut back).unwrap();
        back.to_vec()
    }

    fn uring_fds() -> usize {
        std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
            .filter(|t| t.to_string_lossy().contains("io_uring"))
            .count()
    }

    /// `n` buffers of `len` bytes (+1 spare so a misaligned view fits), each filled with its
    /// own pattern (`salt` varies it between rounds).
    fn sources(n: usize, len: usize, salt: usize) -> Vec<AlignedBuf> {
        (0..n)
            .map(|i| {
                let fill: Vec<u8> = (0..len + 1).map(|k| (i * 131 + k * 7 + salt * 13 + k / 4096) as u8).collect();
                AlignedBuf::from_slice(&fill)
            })
            .collect()
    }

    // Suspicion: bounce buffers (`bounces`) or the iovecs (`ops`) are dropped, moved or
    // reallocated while the kernel still reads them; or a write is reported done before its
    // data landed (the caller reuses its buffer at once, as the engine reuses `data` for the
    // next batch). Large writes (256 KiB each, so each stays in flight a while), more than
    // three rings' worth, every second one from a misaligned (bounced) view; right after
    // `write_batch` returns, every source buffer is overwritten with garbage; the file must
    // hold the original data.
    //
    // Refuted (passes), O_DIRECT and buffered.
    #[test]
    fn adv_wb_sources_reused_at_once_and_bounces_dropped_after() {
        let dir = tempfile::tempdir().unwrap();
        let len = 64 * 4096;
        let n = 3 * uring::RING_ENTRIES + 7;
        let p = file(&dir, (n * 64 + 64) as u64);
        for direct in [true, false] {
            let Some(dev) = open(&p, direct) else { continue };
            for round in 0..3 {
                let mut bufs = sources(n, len, round + usize::from(direct));
                let expect: Vec<Vec<u8>> =
                    bufs.iter().enumerate().map(|(i, b)| b[i % 2..i % 2 + len].to_vec()).collect();
                let results = {
                    // Offsets in a scrambled order, 64 blocks apart: none overlaps.
                    let writes: Vec<(u64, &[u8])> = bufs
                        .iter()
                        .enumerate()
                        .map(|(i, b)| (((i * 37) % n) as u64 * len as u64, &b[i % 2..i % 2 + len]))
                        .collect();
                    dev.write_batch(&writes)
                };
                for b in bufs.iter_mut() {
                    b.fill(0xEE);
                }
                for (i, r) in results.iter().enumerate() {
                    assert!(r.is_ok(), "write {i}: {r:?}");
                }
                for (i, e) in expect.iter().enumerate() {
                    let off = ((i * 37) % n) as u64 * len as u64;
                    assert!(read_back(&dev, off, len) == *e, "write {i} at {off} (direct {direct}, round {round})");
                }
            }
        }
    }

    use super::adversarial_batch_tests::signal_storm;

    // Suspicion: signals interrupt io_uring_enter (EINTR) while writes are in flight; the
    // loop must go on waiting, never leave with requests in flight, never abort, never lose
    // or duplicate a completion (a write's result attributed to another: one reported done
    // that never ran).
    //
    // Refuted (passes): 1,500 batches of 2-41 writes under a stream of SIGUSR1 (no SA_RESTART).
    #[test]
    fn adv_wb_batches_survive_signals() {
        let dir = tempfile::tempdir().unwrap();
        let p = file(&dir, 512);
        for direct in [true, false] {
            let Some(dev) = open(&p, direct) else { continue };
            let mut expect = read_back(&dev, 0, 512 * 4096);
            let (stop, killer) = signal_storm();
            for round in 0..1500usize {
                let n = 2 + round % 40;
                let bufs = sources(n, 2 * 4096, round);
                let writes: Vec<(u64, &[u8])> = bufs
                    .iter()
                    .enumerate()
                    .map(|(i, b)| {
                        // Slots of 4 blocks, each write 2 blocks: disjoint; rotated per round.
                        let slot = ((i + round * 3) % 128) as u64;
                        (slot * 4 * 4096, if i % 3 == 0 { &b[1..1 + 8192] } else { &b[..8192] })
                    })
                    .collect();
                let results = dev.write_batch(&writes);
                for (i, r) in results.iter().enumerate() {
                    assert!(r.is_ok(), "round {round} write {i}: {r:?}");
                }
                for &(off, data) in &writes {
                    expect[off as usize..off as usize + data.len()].copy_from_slice(data);
                }
                if round % 100 == 99 {
                    assert!(read_back(&dev, 0, 512 * 4096) == expect, "round {round} direct {direct}");
                }
            }
            stop.store(true, Ordering::Relaxed);
            let sent = killer.join().unwrap();
            assert!(read_back(&dev, 0, 512 * 4096) == expect, "after all rounds, direct {direct}");
            eprintln!("direct {direct}: {sent} signals");
        }
    }

    // Suspicion: nested use of the thread's ring. `write_batch` inside `write_at_while`'s
    // work (the work holds the thread's ring out of its slot: the batch takes the spare or
    // creates a ring and leaves it in the slot), and inside a nested `write_at_while`'s work
    // (both rings out); then the outer writes put their rings back. A completion reaped by
    // the wrong call, a batch result attributed to the outer write, a ring leaked per call
    // (the process's io_uring count growing with every round), or data not landed.
    //
    // Refuted (passes): data right, works run once, io_uring count stable across 50 rounds.
    #[test]
    fn adv_wb_batch_inside_writes_with_work() {
        let _s = serial();
        let dir = tempfile::tempdir().unwrap();
        let p = file(&dir, 1024);
        for direct in [true, false] {
            let Some(dev) = open(&p, direct) else { continue };
            let mut counts = Vec::new();
            for round in 0..50usize {
                let a = AlignedBuf::from_slice(&vec![round as u8; 1 << 20]);
                let b = AlignedBuf::from_slice(&vec![round as u8 ^ 0x5A; 1 << 20]);
                let bufs = sources(8, 4096 * 4, round);
                let writes: Vec<(u64, &[u8])> =
                    bufs.iter().enumerate().map(|(i, x)| ((512 + i as u64 * 8) * 4096, &x[..4 * 4096])).collect();
                let bufs2 = sources(8, 4096 * 4, round + 1000);
                let writes2: Vec<(u64, &[u8])> =
                    bufs2.iter().enumerate().map(|(i, x)| ((768 + i as u64 * 8) * 4096, &x[1..1 + 4 * 4096])).collect();
                let (mut outer, mut inner) = (0, 0);
                dev.write_at_while(0, &a, &mut || {
                    outer += 1;
                    let r = dev.write_batch(&writes);
                    assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
                    dev.write_at_while(1 << 20, &b, &mut || {
                        inner += 1;
                        let r = dev.write_batch(&writes2);
                        assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
                    })
                    .unwrap();
                })
                .unwrap();
                assert_eq!((outer, inner), (1, 1));
                assert!(read_back(&dev, 0, 1 << 20) == a.to_vec(), "outer write, round {round}");
                assert!(read_back(&dev, 1 << 20, 1 << 20) == b.to_vec(), "inner write, round {round}");
                for &(off, data) in writes.iter().chain(&writes2) {
                    assert!(read_back(&dev, off, data.len()) == data, "batch write at {off}, round {round}");
                }
                // And a plain batch after, on the ring the calls left in the slot.
                let r = dev.write_batch(&writes);
                assert!(r.iter().all(|r| r.is_ok()), "{r:?}");
                counts.push(uring_fds());
            }
            // (The count is the process's: other tests' threads open and close rings meanwhile,
            // so it moves by a few either way; a ring leaked per call would add one a round.)
            let (lo, hi) = (counts[10..].iter().min().unwrap(), counts[10..].iter().max().unwrap());
            assert!(hi - lo <= 4, "io_uring instances per round: {counts:?}");
        }
    }

    // Suspicion: with io_uring unavailable (`UNAVAILABLE`) the batch must fall back to one
    // write after another, bouncing misaligned buffers, and report each result.
    //
    // Refuted (passes).
    #[test]
    fn adv_wb_unavailable_falls_back() {
        let _s = serial();
        let dir = tempfile::tempdir().unwrap();
        let p = file(&dir, 256);
        let was = uring::UNAVAILABLE.swap(true, Ordering::SeqCst);
        let run = || {
            for direct in [true, false] {
                let Some(dev) = open(&p, direct) else { continue };
                let bufs = sources(40, 8192, 3);
                let writes: Vec<(u64, &[u8])> =
                    bufs.iter().enumerate().map(|(i, b)| (i as u64 * 5 * 4096, &b[i % 2..i % 2 + 4096])).collect();
                let results = dev.write_batch(&writes);
                assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
                for &(off, data) in &writes {
                    assert_eq!(read_back(&dev, off, 4096), data, "at {off} direct {direct}");
                }
            }
        };
        let r = std::panic::catch_unwind(run);
        uring::UNAVAILABLE.store(was, Ordering::SeqCst);
        r.unwrap();
    }

    // Suspicion: a device opened read-only: the validity check before the ring does not look
    // at the mode, so every write goes to the ring, fails there (EBADF) and is redone by the
    // syscall path: each must come back as an error (none Ok), nothing written.
    //
    // Refuted (passes).
    #[test]
    fn adv_wb_read_only_device_fails_every_write() {
        let dir = tempfile::tempdir().unwrap();
        let p = file(&dir, 64);
        let before = std::fs::read(&p).unwrap();
        for direct in [true, false] {
            let dev = match FileDevice::open_with(&p, OpenOptions { direct, lock: false, read_only: true }) {
                Err(DeviceError::DirectIoUnsupported { .. }) => continue,
                r => r.unwrap(),
            };
            let bufs = sources(5, 4096, 1);
            let writes: Vec<(u64, &[u8])> =
                bufs.iter().enumerate().map(|(i, b)| (i as u64 * 8192, &b[..4096])).collect();
            let results = dev.write_batch(&writes);
            assert!(results.iter().all(|r| r.is_err()), "{results:?}");
        }
        assert!(std::fs::read(&p).unwrap() == before, "a read-only device was written");
    }

    // Suspicion: a batch holding an empty write (the engine never passes one, but the trait
    // allows it) and a write past the end: every other write lands, the empty one is Ok
    // (as `write_at` of nothing is), the one past the end fails OutOfRange.
    //
    // BUG (minor, pre-existing: `write_impl`, not new in 5eb9482; the batch routes an empty
    // write to it): on an O_DIRECT device an empty slice (`&[]`, whose pointer is dangling,
    // so "misaligned") is bounced through `AlignedBuf::from_slice(&[])`, which panics:
    // "O_DIRECT: the batch with an empty write panicked: AlignedBuf of zero length". The
    // same panic hits `write_at(off, &[])` and `write_at_while(off, &[], ..)` (both go to
    // `write_impl`), and `read_at` into an empty buffer. Buffered devices pass.
    // Fixed: `write_impl` and `read_at` return Ok for an empty buffer before bouncing.
    #[test]
    fn adv_wb_empty_and_out_of_range_writes_in_a_batch() {
        let dir = tempfile::tempdir().unwrap();
        let p = file(&dir, 32);
        let mut failures = Vec::new();
        for direct in [true, false] {
            let Some(dev) = open(&p, direct) else { continue };
            let bufs = sources(3, 4096, 9);
            let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                dev.write_batch(&[
                    (0, &bufs[0][..4096]),
                    (4096, &[][..]),
                    (8192, &bufs[1][1..4097]),
                    (32 * 4096, &bufs[2][..4096]),
                ])
            }));
            let results = match run {
                Ok(r) => r,
                Err(e) => {
                    let msg = e
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| e.downcast_ref::<String>().cloned())
                        .unwrap_or_default();
                    let mode = if direct { "O_DIRECT" } else { "buffered" };
                    failures.push(format!("{mode}: the batch with an empty write panicked: {msg}"));
                    continue;
                }
            };
            assert!(results[0].is_ok() && results[1].is_ok() && results[2].is_ok(), "{results:?}");
            assert!(matches!(results[3], Err(DeviceError::OutOfRange { .. })), "{:?}", results[3]);
            assert_eq!(read_back(&dev, 0, 4096), &bufs[0][..4096]);
            assert_eq!(read_back(&dev, 8192, 4096), &bufs[1][1..4097]);
        }
        assert!(failures.is_empty(), "{}", failures.join("; "));
    }

    /// The child half of `adv_wb_short_writes_are_errors_not_successes`: file-size limit of
    /// 40 blocks (SIGXFSZ ignored), then a batch with writes before, across and past it.
    #[test]
    fn adv_wb_child_fsize_limit() {
        let Ok(path) = std::env::var("ADV_WB_CHILD_PATH") else { return };
        let direct = std::env::var("ADV_WB_CHILD_DIRECT").as_deref() == Ok("1");
        let dev = open(Path::new(&path), direct).unwrap();
        // SAFETY: ignoring a signal and lowering this process's own resource limit.
        unsafe {
            libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
            let lim = libc::rlimit { rlim_cur: 40 * 4096, rlim_max: libc::RLIM_INFINITY };
            assert_eq!(libc::setrlimit(libc::RLIMIT_FSIZE, &lim), 0);
        }
        let bufs = sources(4, 4 * 4096, 5);
        let results = dev.write_batch(&[
            (0, &bufs[0][..4 * 4096]),
            (38 * 4096, &bufs[1][..4 * 4096]), // across the limit: short
            (48 * 4096, &bufs[2][..4 * 4096]), // past it: EFBIG
            (8 * 4096, &bufs[3][..4 * 4096]),
        ]);
        println!("RESULTS {:?}", results.iter().map(|r| r.is_ok()).collect::<Vec<_>>());
        assert!(results[0].is_ok() && results[3].is_ok(), "{results:?}");
        assert!(results[1].is_err(), "a short write reported whole: {:?}", results[1]);
        assert!(results[2].is_err(), "a refused write reported done: {:?}", results[2]);
        println!("CHILD-OK");
    }

    // Suspicion: a short write from the ring (here: a file-size limit cutting a write that
    // straddles it; a write past it refused with EFBIG) must not be reported as done; it is
    // redone synchronously, which must then give the error.
    //
    // Refuted (passes), O_DIRECT and buffered.
    #[test]
    fn adv_wb_short_writes_are_errors_not_successes() {
        let dir = tempfile::tempdir().unwrap();
        let p = file(&dir, 64);
        for direct in ["1", "0"] {
            let out = std::process::Command::new(std::env::current_exe().unwrap())
                .args([
                    "--exact",
                    "file::adversarial_write_batch_tests::adv_wb_child_fsize_limit",
                    "--nocapture",
                    "--test-threads=1",
                ])
                .env("ADV_WB_CHILD_PATH", &p)
                .env("ADV_WB_CHILD_DIRECT", direct)
                .output()
                .unwrap();
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                out.status.success() && stdout.contains("CHILD-OK"),
                "child (direct {direct}): {:?}\nstdout: {stdout}\nstderr: {stderr}",
                out.status
            );
        }
    }

    /// The child half of `adv_wb_io_uring_enter_denied_falls_back`.
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn adv_wb_child_enter_denied() {
        let Ok(path) = std::env::var("ADV_WB_ENTER_PATH") else { return };
        let dev = open(Path::new(&path), false).unwrap();
        // SAFETY: installs a seccomp filter on this thread: io_uring_enter (426) -> EPERM.
        unsafe {
            let filter = [
                libc::sock_filter { code: 0x20, jt: 0, jf: 0, k: 0 },
                libc::sock_filter { code: 0x15, jt: 0, jf: 1, k: 426 },
                libc::sock_filter { code: 0x06, jt: 0, jf: 0, k: 0x0005_0000 | libc::EPERM as u32 },
                libc::sock_filter { code: 0x06, jt: 0, jf: 0, k: 0x7fff_0000 },
            ];
            let prog = libc::sock_fprog { len: filter.len() as u16, filter: filter.as_ptr() as *mut _ };
            assert_eq!(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), 0);
            assert_eq!(libc::prctl(libc::PR_SET_SECCOMP, libc::SECCOMP_MODE_FILTER, &prog as *const _), 0);
        }
        let bufs = sources(40, 4096, 2);
        let writes: Vec<(u64, &[u8])> = bufs.iter().enumerate().map(|(i, b)| (i as u64 * 4096, &b[..4096])).collect();
        let results = dev.write_batch(&writes);
        assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
        for &(off, data) in &writes {
            assert_eq!(read_back(&dev, off, 4096), data);
        }
        // And again, now that the process knows io_uring is unavailable.
        let results = dev.write_batch(&writes);
        assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
        println!("CHILD-OK");
    }

    // Suspicion: io_uring_setup works but io_uring_enter is refused (a seccomp filter):
    // nothing is in flight, so the batch (more than one ring's worth) must fall back to
    // syscalls, not abort the process or report the writes never issued as done.
    //
    // Refuted (passes).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn adv_wb_io_uring_enter_denied_falls_back() {
        let dir = tempfile::tempdir().unwrap();
        let p = file(&dir, 64);
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "file::adversarial_write_batch_tests::adv_wb_child_enter_denied",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("ADV_WB_ENTER_PATH", &p)
            .output()
            .unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && stdout.contains("CHILD-OK"),
            "child: {:?}\nstdout: {stdout}\nstderr: {stderr}",
            out.status
        );
    }

    // Suspicion: many threads batching at once on one device (each its own ring): writes of
    // one thread reported with another's results, or lost.
    //
    // Refuted (passes).
    #[test]
    fn adv_wb_many_threads_batch_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let p = file(&dir, 16 * 64);
        let Some(dev) = open(&p, true).or_else(|| open(&p, false)) else { return };
        let dev = Arc::new(dev);
        let threads: Vec<_> = (0..16u64)
            .map(|t| {
                let dev = Arc::clone(&dev);
                std::thread::spawn(move || {
                    for round in 0..100usize {
                        let bufs = sources(12, 4096, round + t as usize * 1000);
                        // Thread t owns blocks [t*64, t*64+64); 12 of them, every fifth.
                        let writes: Vec<(u64, &[u8])> = bufs
                            .iter()
                            .enumerate()
                            .map(|(i, b)| ((t * 64 + (i as u64 * 5 + round as u64) % 64) * 4096, &b[..4096]))
                            .collect();
                        let results = dev.write_batch(&writes);
                        assert!(results.iter().all(|r| r.is_ok()), "{results:?}");
                        for &(off, data) in &writes {
                            assert_eq!(read_back(&dev, off, 4096), data, "thread {t} round {round} at {off}");
                        }
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
    }

    // Suspicion (EmulatedDevice accounting): a batch books each write once (stats as for
    // the same writes one after another), a bad write is neither booked nor counted and gets
    // its precise error, the batch marks the volatile cache dirty (the next flush costs
    // `flush_latency`), and it overlaps on a device with a queue (an NVMe profile: a batch of
    // 32 4 KiB writes booked as concurrent requests, read from the model's bookings) but not on a disk arm (HDD: queue depth 1,
    // no faster than one after another).
    //
    // Refuted (passes).
    #[test]
    fn adv_wb_emulated_books_each_write_once() {
        let nvme = PROFILES.iter().find(|p| p.name == "nvme").unwrap();
        let hdd = PROFILES.iter().find(|p| p.name == "hdd").unwrap();
        let data = vec![7u8; 4096];
        let writes: Vec<(u64, &[u8])> = (0..64u64).map(|i| (i * 3 * 4096, &data[..])).collect();
        // Stats: batch vs one after another.
        for profile in [nvme, hdd] {
            let a = EmulatedDevice::new(SimDevice::new(256 * 4096, 4096), profile);
            let b = EmulatedDevice::new(SimDevice::new(256 * 4096, 4096), profile);
            let n = if profile.name == "hdd" { 4 } else { 64 };
            let r = a.write_batch(&writes[..n]);
            assert!(r.iter().all(|r| r.is_ok()));
            for &(o, d) in &writes[..n] {
                b.write_at(o, d).unwrap();
            }
            assert_eq!(a.stats(), b.stats(), "{}", profile.name);
            assert_eq!(a.inner().current_image(), b.inner().current_image());
        }
        // A bad write: not booked, precise error, the others land.
        let e = EmulatedDevice::new(SimDevice::new(16 * 4096, 4096), nvme);
        let r = e.write_batch(&[(0, &data[..]), (16 * 4096, &data[..]), (4096 + 512, &data[..]), (8192, &data[..])]);
        assert!(r[0].is_ok() && r[3].is_ok(), "{r:?}");
        assert!(matches!(r[1], Err(DeviceError::OutOfRange { .. })), "{:?}", r[1]);
        assert!(matches!(r[2], Err(DeviceError::Misaligned { .. })), "{:?}", r[2]);
        assert_eq!(e.stats().writes, 2);
        assert_eq!(e.stats().bytes_written, 8192);
        // Overlap on NVMe, read from the model's bookings, not the wall clock (a loaded machine
        // stretches the waits, not the bookings): a batch books its group's writes as
        // concurrent requests, so the 32 slots they take complete within the bus transfers of
        // one another (31 x 2.2 us); the same writes one after another are booked each after
        // the last completed, at least 31 write latencies apart (620 us).
        let n = nvme.queue_depth as usize;
        assert!(n <= crate::emulated::BATCH_GROUP && n <= writes.len());
        let one_after_another = (n as u64 - 1) * nvme.write_latency_ns;
        let spread = |slots: Vec<u64>| slots.iter().max().unwrap() - slots.iter().min().unwrap();
        let e = EmulatedDevice::new(SimDevice::new(256 * 4096, 4096), nvme);
        let _ = e.write_batch(&writes[..n]);
        let batched = spread(e.booked_slots_ns());
        assert!(batched * 2 < one_after_another, "nvme: a batch's bookings {batched} ns apart");
        let e = EmulatedDevice::new(SimDevice::new(256 * 4096, 4096), nvme);
        for &(o, d) in &writes[..n] {
            e.write_at(o, d).unwrap();
        }
        let sequential = spread(e.booked_slots_ns());
        assert!(sequential >= one_after_another, "nvme: one after another {sequential} ns apart");
        // The batch dirtied the volatile cache: the flush pays flush_latency.
        let e = EmulatedDevice::new(SimDevice::new(256 * 4096, 4096), nvme);
        let _ = e.write_batch(&writes[..8]);
        let t = std::time::Instant::now();
        e.flush().unwrap();
        assert!(t.elapsed().as_nanos() as u64 >= nvme.flush_latency_ns, "flush after a batch: {:?}", t.elapsed());
        // HDD: a batch is no faster than its writes one after another (one arm).
        let e = EmulatedDevice::new(SimDevice::new(256 * 4096, 4096), hdd);
        let w: Vec<(u64, &[u8])> = (0..6u64).map(|i| (i * 40 * 4096, &data[..])).collect();
        let t = std::time::Instant::now();
        let _ = e.write_batch(&w);
        let batched = t.elapsed();
        let predicted: u64 = hdd.write_latency_ns * 6; // at least the fixed latencies, in a row
        assert!(batched.as_nanos() as u64 >= predicted, "hdd batch of 6 took {batched:?}");
    }

    // Suspicion (SimDevice): a countdown fault meets one write of the batch (which one is
    // the seed's order): exactly that one fails, it stays invisible, the others land and are
    // visible; a crash before a flush keeps any subset; after a flush every successful one is
    // durable.
    //
    // Refuted (passes).
    #[test]
    fn adv_wb_sim_fault_and_crash_in_a_batch() {
        let data: Vec<Vec<u8>> = (0..10u8).map(|i| vec![i + 1; 4096]).collect();
        let writes: Vec<(u64, &[u8])> = data.iter().enumerate().map(|(i, d)| (i as u64 * 2 * 4096, &d[..])).collect();
        for k in 0..10u64 {
            let dev = SimDevice::new(32 * 4096, 4096);
            dev.fail_after(Some(OpKind::Write), k, FailMode::Once);
            let r = dev.write_batch(&writes);
            let failed: Vec<usize> = (0..10).filter(|&i| r[i].is_err()).collect();
            assert_eq!(failed.len(), 1, "k {k}: {r:?}");
            let cur = dev.current_image();
            for (i, &(o, d)) in writes.iter().enumerate() {
                let got = &cur[o as usize..o as usize + 4096];
                if failed.contains(&i) {
                    assert!(got.iter().all(|&b| b == 0), "k {k}: the failed write {i} is visible");
                } else {
                    assert_eq!(got, d, "k {k}: write {i}");
                }
            }
            assert_eq!(dev.stats().write_batches, 1);
            assert_eq!(dev.stats().writes, 9);
            // After a flush, every write that succeeded is durable.
            dev.flush().unwrap();
            let durable = dev.durable_image();
            for (i, &(o, d)) in writes.iter().enumerate() {
                if !failed.contains(&i) {
                    assert_eq!(&durable[o as usize..o as usize + 4096], d, "k {k}: write {i} after the flush");
                }
            }
        }
        for seed in 0..40 {
            let dev = SimDevice::new(32 * 4096, 4096);
            let r = dev.write_batch(&writes);
            assert!(r.iter().all(|r| r.is_ok()));
            dev.crash(seed);
            let img = dev.current_image();
            for &(o, d) in &writes {
                for s in img[o as usize..o as usize + 4096].chunks(512).zip(d.chunks(512)) {
                    assert!(s.0.iter().all(|&b| b == 0) || s.0 == s.1, "seed {seed}: a sector neither old nor new");
                }
            }
        }
    }
}

/// Adversarial review of 2c84e7f's `read_batch_each` (ranges handed over as the ring completes
/// them). Each test's comment states the suspicion and the outcome.
#[cfg(test)]
mod adversarial_each_tests {
    use super::adversarial_batch_tests::open;
    use super::tests::patterned;
    use super::*;
    use std::sync::Mutex;

    /// Held by the tests here that send signals or count the thread's ring reads.
    static SERIAL: Mutex<()> = Mutex::new(());

    fn serial() -> std::sync::MutexGuard<'static, ()> {
        SERIAL.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// `n` ranges of 1-3 blocks at scattered offsets within `blocks`, shaped by `i % 3`:
    /// one aligned buffer, one buffer per block, one misaligned buffer (bounced under
    /// O_DIRECT). Returns (offset, len) of each and the buffers.
    fn shapes(n: usize, blocks: usize) -> (Vec<(u64, usize)>, Vec<AlignedBuf>) {
        let at: Vec<(u64, usize)> =
            (0..n).map(|i| (((i * 37) % (blocks - 3)) as u64 * 4096, (1 + i % 3) * 4096)).collect();
        let bufs = at.iter().map(|&(_, len)| AlignedBuf::new(len + 1)).collect();
        (at, bufs)
    }

    fn ranges<'a>(at: &[(u64, usize)], bufs: &'a mut [AlignedBuf]) -> Vec<ReadRange<'a>> {
        bufs.iter_mut()
            .enumerate()
            .map(|(i, b)| {
                let (offset, len) = at[i];
                let bufs = match i % 3 {
                    0 => vec![&mut b[..len]],
                    1 => b[..len].chunks_mut(4096).collect(),
                    _ => vec![&mut b[1..1 + len]],
                };
                ReadRange { offset, bufs }
            })
            .collect()
    }

    /// Suspicion: the commit's device test puts a range out of the device into its batch,
    /// which sends the whole batch to the one-by-one path (`valid` is false): the ring's
    /// progressive path (`readv_batch_each`, the early hand-over, `handed`, bounced ranges
    /// handed after the scatter) is never run by it. Here every range is valid, the batch
    /// spans three ring groups, and the ring must actually serve it: each range handed over
    /// exactly once, its data in place when handed over, with the result returned; ranges
    /// read whole into their own buffers before any bounced one (they are handed over as the
    /// ring completes them, the bounced after the batch).
    ///
    /// Outcome: passes (regression test).
    #[test]
    fn a_valid_batch_of_three_groups_goes_through_the_ring_and_hands_each_range_over_once() {
        let _s = serial();
        let dir = tempfile::tempdir().unwrap();
        let (p, data) = patterned(&dir, 1024);
        for direct in [true, false] {
            let Some(dev) = open(&p, direct) else { continue };
            let n = 2 * crate::uring::RING_ENTRIES + 5;
            let (at, mut bufs) = shapes(n, 1024);
            let mut rs = ranges(&at, &mut bufs);
            let mut order: Vec<usize> = Vec::new();
            let ring_before = crate::uring::ring_reads_on_this_thread();
            let results = dev.read_batch_each(&mut rs, &mut |k, range, result| {
                assert!(!order.contains(&k), "range {k} handed over twice");
                order.push(k);
                assert!(result.is_ok(), "range {k}: {result:?}");
                let got: Vec<u8> = range.bufs.iter().flat_map(|b| b.iter().copied()).collect();
                let o = range.offset as usize;
                assert_eq!(got, &data[o..o + got.len()], "range {k} (direct {direct}) when handed over");
            });
            let served = crate::uring::ring_reads_on_this_thread() - ring_before;
            assert!(results.iter().all(|r| r.is_ok()));
            assert_eq!(order.len(), n, "every range handed over");
            if !crate::uring::UNAVAILABLE.load(std::sync::atomic::Ordering::Relaxed) {
                assert_eq!(served, n as u64, "direct {direct}: the ring served the batch");
                if direct {
                    // Bounced (i % 3 == 2) only after every range read in place.
                    let first_bounced = order.iter().position(|&k| k % 3 == 2).unwrap();
                    assert!(
                        order[first_bounced..].iter().all(|&k| k % 3 == 2),
                        "direct: a range read in place handed over after a bounced one: {order:?}"
                    );
                }
            }
            drop(rs);
            for (i, b) in bufs.iter().enumerate() {
                let (o, len) = (at[i].0 as usize, at[i].1);
                let got = if i % 3 == 2 { &b[1..1 + len] } else { &b[..len] };
                assert_eq!(got, &data[o..o + len], "range {i} (direct {direct}) after");
            }
        }
    }

    /// Suspicion: a short read from the ring (the file shrank under the device after it was
    /// opened: the size checked is the one at open) is finalized after the batch by the
    /// synchronous path; a range must then be handed over once, with that final result (an
    /// error, or the data), never first as Ok early and then again; ranges wholly inside the
    /// file are handed over with their data. Over more than one ring group.
    ///
    /// Outcome: passes (regression test).
    #[test]
    fn short_reads_from_a_shrunk_file_are_handed_over_once_with_their_final_result() {
        let _s = serial();
        let dir = tempfile::tempdir().unwrap();
        let (p, data) = patterned(&dir, 512);
        for direct in [true, false] {
            std::fs::write(&p, &data).unwrap();
            let Some(dev) = open(&p, direct) else { continue };
            // The file shrinks to 300 blocks and a half: ranges past it read short or nothing.
            std::fs::OpenOptions::new().write(true).open(&p).unwrap().set_len(300 * 4096 + 2048).unwrap();
            let n = crate::uring::RING_ENTRIES + 9;
            let at: Vec<(u64, usize)> = (0..n).map(|i| ((i as u64 * 13) % 509 * 4096, (1 + i % 3) * 4096)).collect();
            let mut bufs: Vec<AlignedBuf> = at.iter().map(|&(_, len)| AlignedBuf::new(len + 1)).collect();
            let mut rs = ranges(&at, &mut bufs);
            let mut handed: Vec<Option<bool>> = vec![None; n];
            let results = dev.read_batch_each(&mut rs, &mut |k, range, result| {
                assert!(handed[k].is_none(), "range {k} handed over twice");
                handed[k] = Some(result.is_ok());
                if result.is_ok() {
                    let got: Vec<u8> = range.bufs.iter().flat_map(|b| b.iter().copied()).collect();
                    let o = range.offset as usize;
                    assert_eq!(got, &data[o..o + got.len()], "range {k} (direct {direct})");
                }
            });
            for (k, r) in results.iter().enumerate() {
                assert_eq!(handed[k], Some(r.is_ok()), "range {k}: handed over as returned ({r:?})");
                let (o, len) = at[k];
                let inside = o + len as u64 <= 300 * 4096;
                if inside {
                    assert!(r.is_ok(), "range {k} inside the file: {r:?}");
                } else {
                    assert!(r.is_err(), "range {k} past the end of the file returned Ok (direct {direct})");
                }
            }
        }
    }

    /// Suspicion: a panic in the callback on the ring path, in the first of three groups,
    /// must not unwind while reads are in flight, nor call the callback again, and must
    /// leave the thread's ring usable: afterwards every buffer holds its data (nothing was
    /// still being written into), and the next batch on this thread goes through the ring.
    ///
    /// Outcome: passes (regression test).
    #[test]
    fn a_panic_in_the_first_group_waits_for_every_group_and_leaves_the_ring_usable() {
        let _s = serial();
        let dir = tempfile::tempdir().unwrap();
        let (p, data) = patterned(&dir, 1024);
        for direct in [true, false] {
            let Some(dev) = open(&p, direct) else { continue };
            let n = 3 * crate::uring::RING_ENTRIES;
            let at: Vec<(u64, usize)> = (0..n).map(|i| ((i as u64 * 11) % 1000 * 4096, 4 * 4096)).collect();
            let mut bufs: Vec<AlignedBuf> = at.iter().map(|&(_, len)| AlignedBuf::new(len)).collect();
            let mut calls = 0;
            {
                let mut rs: Vec<ReadRange<'_>> = bufs
                    .iter_mut()
                    .zip(&at)
                    .map(|(b, &(offset, _))| ReadRange { offset, bufs: vec![&mut b[..]] })
                    .collect();
                let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    dev.read_batch_each(&mut rs, &mut |_, _, _| {
                        calls += 1;
                        if calls == 2 {
                            panic!("the callback's panic");
                        }
                    })
                }));
                assert!(caught.is_err(), "the panic comes back");
            }
            assert_eq!(calls, 2, "direct {direct}: the callback was called again after its panic");
            for (i, b) in bufs.iter().enumerate() {
                let o = at[i].0 as usize;
                assert_eq!(&b[..], &data[o..o + at[i].1], "direct {direct}: range {i} after the panic");
            }
            let ring_before = crate::uring::ring_reads_on_this_thread();
            let mut rs: Vec<ReadRange<'_>> = bufs
                .iter_mut()
                .zip(&at)
                .map(|(b, &(offset, _))| ReadRange { offset, bufs: vec![&mut b[..]] })
                .collect();
            let mut again = 0;
            let results = dev.read_batch_each(&mut rs, &mut |_, _, r| {
                assert!(r.is_ok());
                again += 1;
            });
            assert!(results.iter().all(|r| r.is_ok()) && again == n);
            if !crate::uring::UNAVAILABLE.load(std::sync::atomic::Ordering::Relaxed) {
                assert_eq!(crate::uring::ring_reads_on_this_thread() - ring_before, n as u64, "the ring still serves");
            }
        }
    }

    /// Suspicion: `rw_batch` holds the thread's ring (`RING`'s RefCell borrowed mutably) for
    /// the whole batch, and now runs the caller's callback inside it; a callback that does
    /// device I/O of its own on the same thread (a batch read of two ranges, which takes the
    /// ring) finds the RefCell borrowed: "already borrowed" panics, is caught, and comes back
    /// out of the outer `read_batch_each` once the batch is done. The trait's contract
    /// (`BlockDevice::read_batch_each`) says nothing against I/O in the callback; the
    /// default implementation (and `SimDevice`) allows it. Not reachable from the engine
    /// today (its callback only computes checksums), a trap for the next caller.
    ///
    /// Outcome: failed on 2c84e7f (the nested batch panicked with a RefCell BorrowMutError);
    /// passes since `rw_batch` takes the ring out of the thread's slot while the batch runs,
    /// as `write_while` does (a nested batch takes the spare or a new ring).
    #[test]
    fn a_callback_may_do_a_batch_read_of_its_own_on_the_same_device() {
        let _s = serial();
        let dir = tempfile::tempdir().unwrap();
        let (p, data) = patterned(&dir, 256);
        let Some(dev) = open(&p, false) else { return };
        let mut a = AlignedBuf::new(8192);
        let mut b = AlignedBuf::new(8192);
        let mut rs = vec![
            ReadRange { offset: 0, bufs: vec![&mut a[..]] },
            ReadRange { offset: 100 * 4096, bufs: vec![&mut b[..]] },
        ];
        let mut nested_ok = 0;
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            dev.read_batch_each(&mut rs, &mut |_, _, _| {
                let (mut x, mut y) = (AlignedBuf::new(4096), AlignedBuf::new(4096));
                let mut inner = vec![
                    ReadRange { offset: 4096, bufs: vec![&mut x[..]] },
                    ReadRange { offset: 8192, bufs: vec![&mut y[..]] },
                ];
                let r = dev.read_batch(&mut inner);
                assert!(r.iter().all(|r| r.is_ok()));
                assert_eq!(&x[..], &data[4096..8192]);
                nested_ok += 1;
            })
        }));
        let msg = outcome
            .as_ref()
            .err()
            .map(|e| e.downcast_ref::<String>().cloned().or(e.downcast_ref::<&str>().map(|s| s.to_string())));
        assert!(outcome.is_ok(), "a nested batch read in the callback panicked: {msg:?}");
        assert_eq!(nested_ok, 2);
    }

    extern "C" fn nothing(_: libc::c_int) {}

    /// Suspicion: waiting for one completion at a time means many more `io_uring_enter`
    /// waits per batch, each of which a signal can interrupt (EINTR; a handler installed
    /// without SA_RESTART, as a FUSE or NBD front end might); the loop must retry without
    /// reaping twice or losing a completion: every range handed over once, with its data.
    /// A thread sends the reader SIGUSR1 continuously through 200 batches of 40 ranges.
    ///
    /// Outcome: passes (regression test).
    #[test]
    fn signals_during_progressive_batches_lose_or_repeat_nothing() {
        let _s = serial();
        let dir = tempfile::tempdir().unwrap();
        let (p, data) = patterned(&dir, 2048);
        // SAFETY: installing a handler that does nothing, without SA_RESTART.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = nothing as *const () as usize;
            sa.sa_flags = 0;
            libc::sigemptyset(&mut sa.sa_mask);
            assert_eq!(libc::sigaction(libc::SIGUSR1, &sa, std::ptr::null_mut()), 0);
        }
        for direct in [true, false] {
            let Some(dev) = open(&p, direct) else { continue };
            // SAFETY: this thread's id, valid while it runs (the sender stops before it ends).
            let me = unsafe { libc::pthread_self() };
            let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
            let sender = {
                let stop = stop.clone();
                let me = me as usize;
                std::thread::spawn(move || {
                    let mut sent = 0u64;
                    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                        // SAFETY: the target thread outlives this loop (joined before it ends).
                        unsafe { libc::pthread_kill(me as libc::pthread_t, libc::SIGUSR1) };
                        sent += 1;
                        std::thread::sleep(std::time::Duration::from_micros(50));
                    }
                    sent
                })
            };
            let n = 40;
            for round in 0..200usize {
                let at: Vec<(u64, usize)> =
                    (0..n).map(|i| (((i * 53 + round * 7) % 2040) as u64 * 4096, 8 * 4096)).collect();
                let mut bufs: Vec<AlignedBuf> = at.iter().map(|&(_, len)| AlignedBuf::new(len)).collect();
                let mut rs: Vec<ReadRange<'_>> = bufs
                    .iter_mut()
                    .zip(&at)
                    .map(|(b, &(offset, _))| ReadRange { offset, bufs: vec![&mut b[..]] })
                    .collect();
                let mut handed = vec![0u32; n];
                let results = dev.read_batch_each(&mut rs, &mut |k, range, r| {
                    handed[k] += 1;
                    assert!(r.is_ok(), "range {k}: {r:?}");
                    let o = range.offset as usize;
                    assert_eq!(&range.bufs[0][..], &data[o..o + 8 * 4096], "round {round} range {k}");
                });
                assert!(results.iter().all(|r| r.is_ok()), "round {round}: {results:?}");
                assert!(handed.iter().all(|&h| h == 1), "round {round}: {handed:?}");
            }
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
            let sent = sender.join().unwrap();
            eprintln!("direct {direct}: {sent} signals sent");
        }
    }
}
