//! The volume as a file: `MOUNTDIR/volume`, of the volume's size, through FUSE (the fuser
//! crate, no libfuse needed at build time; mounting uses fusermount3 from the fuse3 package).
//!
//! - read, write (any alignment: partial blocks are read-modified-written below, in the
//!   engine or the passthrough);
//! - fsync is the volume's FLUSH; writes with O_SYNC/O_DSYNC are FUA writes (flushed too);
//! - fallocate: PUNCH_HOLE and ZERO_RANGE write zeroes (a punched range must read as zeroes,
//!   which a TRIM hint does not promise: `ByteIo::write_zeroes`), plain allocation is a no-op;
//! - the file is opened with FOPEN_DIRECT_IO: the kernel keeps no page cache of it, so
//!   O_DIRECT works and `losetup --direct-io=on` passes every request straight through.
//!
//! It serves any `tiercache_frontend::ByteIo`: the volume, or a passthrough device (the
//! baseline of a benchmark). The frontend validates requests (bounds) and the volume or the
//! device checks them again.

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, Generation, INodeNo, KernelConfig, LockOwner,
    OpenFlags, ReplyAttr, ReplyData, ReplyDirectory, ReplyEmpty, ReplyEntry, ReplyOpen, ReplyStatfs, ReplyWrite,
    ReplyXattr, Request, WriteFlags,
};
use std::ffi::OsStr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tiercache_frontend::ByteIo;

/// The name of the one file in the mount.
pub const FILE_NAME: &str = "volume";
const FILE_INO: INodeNo = INodeNo(2);
/// Threads reading FUSE requests (each on its own cloned /dev/fuse descriptor).
const FUSE_THREADS: usize = 16;
/// Asynchronous requests the kernel keeps in flight to us.
const MAX_BACKGROUND: u16 = 64;
/// Attributes never change (size is fixed), so the kernel may cache them.
const TTL: Duration = Duration::from_secs(3600);

/// The file system of one file: what `mount` serves.
pub struct VolumeFs {
    volume: Arc<dyn ByteIo>,
    uid: u32,
    gid: u32,
    mounted_at: SystemTime,
}

impl VolumeFs {
    pub fn new(volume: Arc<dyn ByteIo>) -> VolumeFs {
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

    fn errno(e: tiercache_frontend::Errno) -> Errno {
        Errno::from_i32(e.get())
    }

    /// Clamps a request to the volume: reads past the end are short (file semantics).
    fn clamp(&self, offset: u64, len: u64) -> u64 {
        self.volume.size_bytes().saturating_sub(offset).min(len)
    }
}

impl Filesystem for VolumeFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(1 << 20);
        // A loop device with direct I/O submits asynchronous reads and writes: with ASYNC_DIO
        // the kernel sends each to us at once instead of one at a time per submitter, and up
        // to `max_background` of them may wait here together, so the volume sees the queue
        // depth the file system above it has.
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_ASYNC_DIO);
        let _ = config.set_max_background(MAX_BACKGROUND);
        let _ = config.set_congestion_threshold(MAX_BACKGROUND * 3 / 4);
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
        let (mut buf, at) = tiercache_frontend::read_buffer(len as usize);
        let data = &mut buf[at..at + len as usize];
        match self.volume.read(offset, data) {
            Ok(()) => reply.data(data),
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
        match self.volume.write(offset, data, sync) {
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
        match self.volume.write_zeroes(offset, len, false) {
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
pub fn mount(volume: Arc<dyn ByteIo>, mountdir: &std::path::Path) -> std::io::Result<fuser::BackgroundSession> {
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName("tiercache".into()),
        fuser::MountOption::Subtype("tiercache".into()),
        fuser::MountOption::DefaultPermissions,
    ];
    // Requests block in the volume (a cache-device read, a FLUSH): one thread per request in
    // flight, up to the queue depth a loop device or a database's committers bring.
    config.n_threads = Some(FUSE_THREADS);
    config.clone_fd = true;
    fuser::spawn_mount(VolumeFs::new(volume), mountdir, &config)
}
