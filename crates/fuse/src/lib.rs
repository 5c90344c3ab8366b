//! The volume as a file: `MOUNTDIR/volume`, of the volume's size, through FUSE (the fuser
//! crate, no libfuse needed at build time; mounting uses fusermount3 from the fuse3 package).
//!
//! - read, write (any alignment: partial blocks are read-modified-written by the engine);
//! - fsync is the volume's FLUSH; writes with O_SYNC/O_DSYNC flush too;
//! - fallocate: PUNCH_HOLE and ZERO_RANGE write zeroes (a punched range must read as zeroes,
//!   which a TRIM hint does not promise), plain allocation is a no-op;
//! - the file is opened with FOPEN_DIRECT_IO: the kernel keeps no page cache of it, so
//!   O_DIRECT works and `losetup --direct-io=on` passes every request straight through.
//!
//! The frontend validates requests (bounds) and the engine checks them again.

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, KernelConfig, LockOwner,
    OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, WriteFlags,
};
use std::ffi::OsStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tiercache_engine::Volume;

/// The name of the one file in the mount.
pub const FILE_NAME: &str = "volume";
const FILE_INO: INodeNo = INodeNo(2);
/// Attributes never change (size is fixed), so the kernel may cache them.
const TTL: Duration = Duration::from_secs(3600);

/// What the FUSE file exposes: the hybrid volume, or (for side-by-side benchmarks) a plain
/// device with no cache. Errors are errno values.
pub trait FileBackend: Send + Sync + 'static {
    fn size_bytes(&self) -> u64;
    fn block_size(&self) -> u32;
    fn read_bytes(&self, offset: u64, buf: &mut [u8]) -> Result<(), i32>;
    fn write_bytes(&self, offset: u64, data: &[u8]) -> Result<(), i32>;
    fn flush(&self) -> Result<(), i32>;
}

fn errno(e: tiercache_engine::EngineError) -> i32 {
    tracing::debug!(error = %e, "FUSE request failed");
    e.errno()
}

impl FileBackend for Volume {
    fn size_bytes(&self) -> u64 {
        Volume::size_bytes(self)
    }
    fn block_size(&self) -> u32 {
        Volume::block_size(self)
    }
    fn read_bytes(&self, offset: u64, buf: &mut [u8]) -> Result<(), i32> {
        Volume::read_bytes(self, offset, buf).map_err(errno)
    }
    fn write_bytes(&self, offset: u64, data: &[u8]) -> Result<(), i32> {
        Volume::write_bytes(self, offset, data).map_err(errno)
    }
    fn flush(&self) -> Result<(), i32> {
        Volume::flush(self).map_err(errno)
    }
}

/// A plain device behind the FUSE file, with no cache: the baseline of a benchmark.
pub struct Passthrough {
    dev: Arc<dyn tiercache_device::BlockDevice>,
    rmw: std::sync::Mutex<()>,
}

impl Passthrough {
    pub fn new(dev: Arc<dyn tiercache_device::BlockDevice>) -> Passthrough {
        Passthrough { dev, rmw: std::sync::Mutex::new(()) }
    }

    /// The block-aligned span around a byte range.
    fn span(&self, offset: u64, len: usize) -> (u64, u64) {
        let bs = u64::from(self.dev.logical_block_size());
        (offset / bs * bs, (offset + len as u64).div_ceil(bs) * bs)
    }
}

impl FileBackend for Passthrough {
    fn size_bytes(&self) -> u64 {
        self.dev.size_bytes()
    }
    fn block_size(&self) -> u32 {
        self.dev.logical_block_size()
    }
    fn read_bytes(&self, offset: u64, buf: &mut [u8]) -> Result<(), i32> {
        let (start, end) = self.span(offset, buf.len());
        let mut whole = tiercache_device::AlignedBuf::new((end - start).max(1) as usize);
        self.dev.read_at(start, &mut whole[..(end - start) as usize]).map_err(|e| e.errno())?;
        let at = (offset - start) as usize;
        buf.copy_from_slice(&whole[at..at + buf.len()]);
        Ok(())
    }
    fn write_bytes(&self, offset: u64, data: &[u8]) -> Result<(), i32> {
        let (start, end) = self.span(offset, data.len());
        if start == offset && end == offset + data.len() as u64 {
            return self.dev.write_at(offset, data).map_err(|e| e.errno());
        }
        let _rmw = self.rmw.lock().expect("rmw lock");
        let mut whole = vec![0u8; (end - start) as usize];
        self.read_bytes(start, &mut whole)?;
        let at = (offset - start) as usize;
        whole[at..at + data.len()].copy_from_slice(data);
        self.dev.write_at(start, &whole).map_err(|e| e.errno())
    }
    fn flush(&self) -> Result<(), i32> {
        self.dev.flush().map_err(|e| e.errno())
    }
}

pub struct VolumeFs {
    volume: Arc<dyn FileBackend>,
    uid: u32,
    gid: u32,
    mounted_at: SystemTime,
}

impl VolumeFs {
    pub fn new(volume: Arc<dyn FileBackend>) -> VolumeFs {
        // SAFETY: getuid/getgid have no preconditions and touch no memory.
        let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
        VolumeFs { volume, uid, gid, mounted_at: SystemTime::now() }
    }

    fn attr(&self, ino: INodeNo) -> Option<FileAttr> {
        let (kind, perm, size, nlink) = match ino {
            INodeNo::ROOT => (FileType::Directory, 0o755, 0, 2),
            FILE_INO => (FileType::RegularFile, 0o600, self.volume.size_bytes(), 1),
            _ => return None,
        };
        let t = self.mounted_at;
        Some(FileAttr {
            ino,
            size,
            blocks: size / 512,
            atime: t,
            mtime: t,
            ctime: t,
            crtime: t,
            kind,
            perm,
            nlink,
            uid: self.uid,
            gid: self.gid,
            rdev: 0,
            blksize: self.volume.block_size(),
            flags: 0,
        })
    }

    fn errno(e: i32) -> Errno {
        Errno::from_i32(e)
    }

    /// Clamps a request to the volume: reads past the end are short (file semantics).
    fn clamp(&self, offset: u64, len: u64) -> u64 {
        self.volume.size_bytes().saturating_sub(offset).min(len)
    }
}

impl Filesystem for VolumeFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(1 << 20);
        Ok(())
    }

    // No extended attributes. ENOSYS (what fuser's defaults answer too, with a warning per
    // call) makes the kernel stop asking for the rest of the mount: the security.capability
    // lookup it would otherwise make before writes costs nothing after the first.
    fn getxattr(&self, _req: &Request, _ino: INodeNo, _name: &OsStr, _size: u32, reply: ReplyXattr) {
        reply.error(Errno::ENOSYS);
    }

    fn listxattr(&self, _req: &Request, _ino: INodeNo, _size: u32, reply: ReplyXattr) {
        reply.error(Errno::ENOSYS);
    }

    fn lookup(&self, _req: &Request, parent: INodeNo, name: &OsStr, reply: ReplyEntry) {
        match (parent, name.to_str()) {
            (INodeNo::ROOT, Some(FILE_NAME)) => reply.entry(&TTL, &self.attr(FILE_INO).expect("file"), Generation(0)),
            _ => reply.error(Errno::ENOENT),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.attr(ino) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        _mode: Option<u32>,
        _uid: Option<u32>,
        _gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<fuser::TimeOrNow>,
        _mtime: Option<fuser::TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        // The volume's size is the backing device's: it cannot be truncated or grown.
        if size.is_some_and(|s| s != self.volume.size_bytes()) {
            return reply.error(Errno::EPERM);
        }
        match self.attr(ino) {
            Some(a) => reply.attr(&TTL, &a),
            None => reply.error(Errno::ENOENT),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        if ino != FILE_INO {
            return reply.error(Errno::EISDIR);
        }
        reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO);
    }

    fn read(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        if ino != FILE_INO {
            return reply.error(Errno::EISDIR);
        }
        let len = self.clamp(offset, u64::from(size));
        if len == 0 {
            return reply.data(&[]); // at or past the end: end of file
        }
        let mut buf = vec![0u8; len as usize];
        match self.volume.read_bytes(offset, &mut buf) {
            Ok(()) => reply.data(&buf),
            Err(e) => reply.error(Self::errno(e)),
        }
    }

    fn write(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if ino != FILE_INO {
            return reply.error(Errno::EISDIR);
        }
        if offset.checked_add(data.len() as u64).is_none_or(|end| end > self.volume.size_bytes()) {
            return reply.error(Errno::from_i32(libc::ENOSPC));
        }
        let sync = flags.0 & (libc::O_SYNC | libc::O_DSYNC) != 0;
        let r = self.volume.write_bytes(offset, data).and_then(|()| if sync { self.volume.flush() } else { Ok(()) });
        match r {
            Ok(()) => reply.written(data.len() as u32),
            Err(e) => reply.error(Self::errno(e)),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        // close(2): no durability is promised by close, only by fsync.
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        match self.volume.flush() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(Self::errno(e)),
        }
    }

    fn fallocate(
        &self,
        _req: &Request,
        ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        length: u64,
        mode: i32,
        reply: ReplyEmpty,
    ) {
        if ino != FILE_INO {
            return reply.error(Errno::EISDIR);
        }
        let len = self.clamp(offset, length);
        let past_end = offset.checked_add(length).is_none_or(|end| end > self.volume.size_bytes());
        if past_end && mode & libc::FALLOC_FL_KEEP_SIZE == 0 {
            return reply.error(Errno::from_i32(libc::ENOSPC)); // the file cannot grow
        }
        let zero = mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) != 0;
        if mode & !(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE) != 0 {
            return reply.error(Errno::from_i32(libc::EOPNOTSUPP));
        }
        if !zero || len == 0 {
            return reply.ok(); // allocation: every byte of the volume already exists
        }
        // Zeroes written in chunks of at most 1 MiB (bounded memory).
        let chunk = 1u64 << 20;
        let zeroes = vec![0u8; chunk.min(len) as usize];
        let mut r = Ok(());
        let mut done = 0;
        while r.is_ok() && done < len {
            let n = chunk.min(len - done);
            r = self.volume.write_bytes(offset + done, &zeroes[..n as usize]);
            done += n;
        }
        match r {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(Self::errno(e)),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOTDIR);
        }
        let entries = [
            (INodeNo::ROOT, FileType::Directory, "."),
            (INodeNo::ROOT, FileType::Directory, ".."),
            (FILE_INO, FileType::RegularFile, FILE_NAME),
        ];
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(*ino, (i + 1) as u64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let bs = u64::from(self.volume.block_size());
        let blocks = self.volume.size_bytes() / bs;
        reply.statfs(blocks, 0, 0, 2, 0, bs as u32, 255, bs as u32);
    }
}

/// Mounts the volume at `mountdir`; unmounted when the returned session is dropped.
pub fn mount(volume: Arc<dyn FileBackend>, mountdir: &std::path::Path) -> std::io::Result<fuser::BackgroundSession> {
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName("tiercache".into()),
        fuser::MountOption::Subtype("tiercache".into()),
        fuser::MountOption::DefaultPermissions,
    ];
    config.n_threads = Some(4);
    config.clone_fd = true;
    fuser::spawn_mount(VolumeFs::new(volume), mountdir, &config)
}
