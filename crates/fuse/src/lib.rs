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
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};
use tiercache_frontend::{ByteIo, CommitPattern, RequestKind};

mod uring;
pub use uring::kernel_enables as io_uring_enabled;

/// The name of the one file in the mount.
pub const FILE_NAME: &str = "volume";
const FILE_INO: INodeNo = INodeNo(2);
/// Threads reading FUSE requests from `/dev/fuse` (each on its own cloned descriptor).
const FUSE_THREADS: usize = 16;
/// Asynchronous requests the kernel keeps in flight to us.
const MAX_BACKGROUND: u16 = 64;
/// Attributes never change (size is fixed), so the kernel may cache them.
const TTL: Duration = Duration::from_secs(3600);

/// How requests reach the server (`serve --fuse-transport`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Transport {
    /// io_uring where the kernel enables it (`uring::kernel_enables`), else `/dev/fuse`.
    #[default]
    Auto,
    /// FUSE over io_uring, or an error.
    IoUring,
    /// read(2) and write(2) on `/dev/fuse`.
    Dev,
}

/// The one-file file system's answers, whichever transport carries the requests.
pub(crate) struct VolumeFile {
    volume: Arc<dyn ByteIo>,
    uid: u32,
    gid: u32,
    /// Who mounted it: fuser lets only this uid's requests in (a few kinds excepted).
    owner: u32,
    mounted_at: SystemTime,
    /// Whether the file's writers commit one write at a time (write, fsync: a loop device
    /// under a database's fdatasync at queue depth 1), from the requests of all threads.
    commits: CommitPattern,
}

impl VolumeFile {
    fn new(volume: Arc<dyn ByteIo>) -> VolumeFile {
        // SAFETY: getuid/getgid/geteuid have no preconditions and touch no memory.
        let (uid, gid, owner) = unsafe { (libc::getuid(), libc::getgid(), libc::geteuid()) };
        VolumeFile { volume, uid, gid, owner, mounted_at: SystemTime::now(), commits: CommitPattern::default() }
    }

    /// Notes a request for the commit pattern; whether to write a write ahead once its reply
    /// is sent (`write_ahead`).
    fn note(&self, kind: RequestKind) -> bool {
        self.commits.note(kind)
    }

    /// After a write's reply, for a file whose writers commit one write at a time: the volume
    /// writes its staged record while the fsync that follows is on its way
    /// (`ByteIo::write_ahead`; NBD does the same).
    fn write_ahead(&self) {
        self.volume.write_ahead();
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

    fn lookup(&self, parent: INodeNo, name: &[u8]) -> Result<FileAttr, Errno> {
        match (parent, name) {
            (INodeNo::ROOT, n) if n == FILE_NAME.as_bytes() => Ok(self.attr(FILE_INO).expect("file")),
            _ => Err(Errno::ENOENT),
        }
    }

    fn setattr(&self, ino: INodeNo, size: Option<u64>) -> Result<FileAttr, Errno> {
        // The volume's size is the backing device's: it cannot be truncated or grown.
        if size.is_some_and(|s| s != self.volume.size_bytes()) {
            return Err(Errno::EPERM);
        }
        self.attr(ino).ok_or(Errno::ENOENT)
    }

    fn open(&self, ino: INodeNo) -> Result<(), Errno> {
        if ino != FILE_INO {
            return Err(Errno::EISDIR);
        }
        Ok(())
    }

    /// Reads up to `buf.len()` bytes at `offset` into the start of `buf`; how many (short
    /// at the end of the volume, 0 past it: end of file).
    fn read(&self, ino: INodeNo, offset: u64, buf: &mut [u8]) -> Result<usize, Errno> {
        if ino != FILE_INO {
            return Err(Errno::EISDIR);
        }
        self.note(RequestKind::Other);
        let len = self.clamp(offset, buf.len() as u64) as usize;
        if len > 0 {
            self.volume.read(offset, &mut buf[..len]).map_err(Self::errno)?;
        }
        Ok(len)
    }

    /// Writes `data` at `offset`; `open_flags` (the file's) with O_SYNC or O_DSYNC make it
    /// a FUA write. Returns how many bytes, and whether to write it ahead once replied to
    /// (`write_ahead`).
    fn write(&self, ino: INodeNo, offset: u64, data: &[u8], open_flags: i32) -> Result<(u32, bool), Errno> {
        if ino != FILE_INO {
            return Err(Errno::EISDIR);
        }
        if offset.checked_add(data.len() as u64).is_none_or(|end| end > self.volume.size_bytes()) {
            return Err(Errno::from_i32(libc::ENOSPC));
        }
        let sync = open_flags & (libc::O_SYNC | libc::O_DSYNC) != 0;
        let ahead = self.note(if sync { RequestKind::Other } else { RequestKind::Write });
        self.volume.write(offset, data, sync).map_err(Self::errno)?;
        Ok((data.len() as u32, ahead))
    }

    fn fsync(&self) -> Result<(), Errno> {
        self.note(RequestKind::Flush);
        self.volume.flush().map_err(Self::errno)
    }

    fn fallocate(&self, ino: INodeNo, offset: u64, length: u64, mode: i32) -> Result<(), Errno> {
        self.note(RequestKind::Other);
        if ino != FILE_INO {
            return Err(Errno::EISDIR);
        }
        let len = self.clamp(offset, length);
        let past_end = offset.checked_add(length).is_none_or(|end| end > self.volume.size_bytes());
        if past_end && mode & libc::FALLOC_FL_KEEP_SIZE == 0 {
            return Err(Errno::from_i32(libc::ENOSPC)); // the file cannot grow
        }
        let zero = mode & (libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE) != 0;
        if mode & !(libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE) != 0 {
            return Err(Errno::from_i32(libc::EOPNOTSUPP));
        }
        if !zero || len == 0 {
            return Ok(()); // allocation: every byte of the volume already exists
        }
        self.volume.write_zeroes(offset, len, false).map_err(Self::errno)
    }

    fn entries(&self, ino: INodeNo) -> Result<[(INodeNo, FileType, &'static str); 3], Errno> {
        if ino != INodeNo::ROOT {
            return Err(Errno::ENOTDIR);
        }
        Ok([
            (INodeNo::ROOT, FileType::Directory, "."),
            (INodeNo::ROOT, FileType::Directory, ".."),
            (FILE_INO, FileType::RegularFile, FILE_NAME),
        ])
    }

    /// Blocks and block size.
    fn statfs(&self) -> (u64, u32) {
        let bs = self.volume.block_size();
        (self.volume.size_bytes() / u64::from(bs), bs)
    }
}

/// The file system of one file, as fuser serves it through `/dev/fuse`.
pub struct VolumeFs {
    file: Arc<VolumeFile>,
    /// Set when io_uring is to be asked for at INIT; then whether the kernel granted it.
    uring: Option<Arc<AtomicBool>>,
}

impl VolumeFs {
    pub fn new(volume: Arc<dyn ByteIo>) -> VolumeFs {
        VolumeFs { file: Arc::new(VolumeFile::new(volume)), uring: None }
    }
}

impl Filesystem for VolumeFs {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        let _ = config.set_max_write(uring::PAYLOAD_BYTES as u32);
        // A loop device with direct I/O submits asynchronous reads and writes: with ASYNC_DIO
        // the kernel sends each to us at once instead of one at a time per submitter, and up
        // to `max_background` of them may wait here together, so the volume sees the queue
        // depth the file system above it has.
        let _ = config.add_capabilities(fuser::InitFlags::FUSE_ASYNC_DIO);
        let _ = config.set_max_background(MAX_BACKGROUND);
        let _ = config.set_congestion_threshold(MAX_BACKGROUND * 3 / 4);
        if let Some(granted) = &self.uring {
            // Err: this kernel does not offer it (before 6.14, or enable_uring off).
            granted.store(config.add_capabilities(fuser::InitFlags::FUSE_OVER_IO_URING).is_ok(), Ordering::Release);
        }
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
        match self.file.lookup(parent, name.as_bytes()) {
            Ok(a) => reply.entry(&TTL, &a, Generation(0)),
            Err(e) => reply.error(e),
        }
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        match self.file.attr(ino) {
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
        match self.file.setattr(ino, size) {
            Ok(a) => reply.attr(&TTL, &a),
            Err(e) => reply.error(e),
        }
    }

    fn open(&self, _req: &Request, ino: INodeNo, _flags: OpenFlags, reply: ReplyOpen) {
        match self.file.open(ino) {
            Ok(()) => reply.opened(FileHandle(0), FopenFlags::FOPEN_DIRECT_IO),
            Err(e) => reply.error(e),
        }
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
        let len = self.file.clamp(offset, u64::from(size)) as usize;
        let mut buf = tiercache_frontend::read_buffer(len);
        match self.file.read(ino, offset, &mut buf) {
            Ok(n) => reply.data(&buf[..n]),
            Err(e) => reply.error(e),
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
        match self.file.write(ino, offset, data, flags.0) {
            Ok((n, ahead)) => {
                reply.written(n);
                if ahead {
                    self.file.write_ahead();
                }
            }
            Err(e) => reply.error(e),
        }
    }

    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        // close(2): no durability is promised by close, only by fsync.
        reply.ok();
    }

    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        match self.file.fsync() {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
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
        match self.file.fallocate(ino, offset, length, mode) {
            Ok(()) => reply.ok(),
            Err(e) => reply.error(e),
        }
    }

    fn readdir(&self, _req: &Request, ino: INodeNo, _fh: FileHandle, offset: u64, mut reply: ReplyDirectory) {
        let entries = match self.file.entries(ino) {
            Ok(e) => e,
            Err(e) => return reply.error(e),
        };
        for (i, (ino, kind, name)) in entries.iter().enumerate().skip(offset as usize) {
            if reply.add(*ino, (i + 1) as u64, *kind, name) {
                break;
            }
        }
        reply.ok();
    }

    fn statfs(&self, _req: &Request, _ino: INodeNo, reply: ReplyStatfs) {
        let (blocks, bs) = self.file.statfs();
        reply.statfs(blocks, 0, 0, 2, 0, bs, 255, bs);
    }
}

/// A mounted volume file: fuser's session on `/dev/fuse`, and the io_uring queues when they
/// carry the requests. Unmounted by `umount_and_join`, or by someone else (`join` then waits
/// for the threads to see it).
pub struct Mounted {
    session: fuser::BackgroundSession,
    ring: Option<uring::Ring>,
}

impl Mounted {
    /// How requests reach the server: "io_uring" or "/dev/fuse".
    pub fn transport(&self) -> &'static str {
        if self.ring.is_some() {
            "io_uring"
        } else {
            "/dev/fuse"
        }
    }

    /// Waits for the session to end after an unmount made elsewhere.
    pub fn join(self) -> std::io::Result<()> {
        let r = self.session.join();
        if let Some(ring) = self.ring {
            ring.join();
        }
        r
    }

    /// Unmounts and waits for the session to end.
    pub fn umount_and_join(self) -> std::io::Result<()> {
        let r = self.session.umount_and_join();
        if let Some(ring) = self.ring {
            ring.join();
        }
        r
    }
}

/// Mounts the volume at `mountdir`, its requests carried as `transport` says; unmounted by
/// the returned `Mounted`.
pub fn mount(volume: Arc<dyn ByteIo>, mountdir: &std::path::Path, transport: Transport) -> std::io::Result<Mounted> {
    let want_uring = match transport {
        Transport::Dev => false,
        Transport::Auto => uring::kernel_enables(),
        Transport::IoUring => {
            if !uring::kernel_enables() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::Unsupported,
                    "FUSE over io_uring is off in this kernel: it needs Linux 6.14+ built with \
                     CONFIG_FUSE_IO_URING, enabled with `echo Y > /sys/module/fuse/parameters/enable_uring` \
                     (or --fuse-transport dev)",
                ));
            }
            true
        }
    };
    // Where this process may not set up an io_uring (a seccomp filter, io_uring_disabled),
    // asking for it at INIT would only make a mount that holds every request until it is
    // torn down again, which something waiting in it (a stat as it comes up) prevents.
    if want_uring {
        if let Err(e) = uring::can_set_up() {
            if transport == Transport::IoUring {
                return Err(e);
            }
            tracing::warn!(error = %e, "FUSE over io_uring unavailable; serving through /dev/fuse");
            return mount(volume, mountdir, Transport::Dev);
        }
    }
    let mut config = fuser::Config::default();
    config.mount_options = vec![
        fuser::MountOption::FSName("tiercache".into()),
        fuser::MountOption::Subtype("tiercache".into()),
        fuser::MountOption::DefaultPermissions,
    ];
    // Requests block in the volume (a cache-device read, a FLUSH): one thread per request in
    // flight, up to the queue depth a loop device or a database's committers bring. (With
    // io_uring these only read what the ring never carries: FORGET, INTERRUPT.)
    config.n_threads = Some(if want_uring { 1 } else { FUSE_THREADS });
    config.clone_fd = true;
    let mut fs = VolumeFs::new(Arc::clone(&volume));
    let granted = Arc::new(AtomicBool::new(false));
    if want_uring {
        fs.uring = Some(Arc::clone(&granted));
    }
    let file = Arc::clone(&fs.file);
    // (INIT is answered before this returns.)
    let session = fuser::Session::new(fs, mountdir, &config)?;
    let ring = if granted.load(Ordering::Acquire) {
        let fd = session.as_fd().try_clone_to_owned()?;
        // The kernel holds every request until each CPU's queue has an entry: a ring that
        // fails to register falls back to /dev/fuse (the kernel's doing), but one that cannot
        // be set up at all would leave the mount hanging, so that unmounts (the session,
        // dropped, does) and fails.
        let threads_per_queue = FUSE_THREADS.div_ceil(uring::possible_cpus()).max(4);
        match uring::Ring::start(fd, Arc::clone(&file), threads_per_queue) {
            Ok(ring) => Some(ring),
            Err((e, registered)) => {
                // The session, dropped, unmounts; the entries that did register end with the
                // mount, and release its /dev/fuse descriptor, their rings and buffers: wait
                // for that before mounting again.
                drop(session);
                registered.join();
                if transport != Transport::Auto {
                    return Err(e);
                }
                tracing::warn!(error = %e, "FUSE over io_uring failed; mounting again through /dev/fuse");
                return mount(volume, mountdir, Transport::Dev);
            }
        }
    } else if transport == Transport::IoUring {
        return Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "the kernel did not offer FUSE over io_uring at INIT (needs protocol 7.42, Linux 6.14+)",
        ));
    } else {
        if want_uring {
            // The switch was on when `kernel_enables` read it and off at INIT: the session
            // was made with one thread for io_uring, and requests may already wait in it, so
            // it is not mounted again (an unmount would find them busy).
            tracing::warn!(
                "the kernel did not grant FUSE over io_uring at INIT (enable_uring turned off meanwhile?): \
                 serving through /dev/fuse with one thread; restart the server for all {FUSE_THREADS}"
            );
        }
        None
    };
    Ok(Mounted { session: session.spawn()?, ring })
}
