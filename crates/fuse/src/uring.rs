//! FUSE over io_uring (Linux 6.14+, `/sys/module/fuse/parameters/enable_uring`): the kernel
//! hands requests to the server through io_uring commands on `/dev/fuse` instead of read(2)
//! and write(2).
//!
//! Why: with `/dev/fuse`, a request costs a read that wakes one of the server's threads,
//! wherever it sleeps, and a write for the reply. Here the kernel routes each request to the
//! queue of the CPU that issued it, whose threads are pinned to that CPU: the thread that
//! serves it wakes where the requester just went to sleep (on a virtual machine, waking
//! another CPU is an interrupt through the hypervisor), and the reply and the wait for the
//! next request are one `io_uring_enter`.
//!
//! fuser, which mounts and answers INIT, does not speak this protocol, so it is written here
//! against the kernel's uapi (`include/uapi/linux/fuse.h`, `fs/fuse/dev_uring.c`, protocol
//! 7.42+). fuser keeps serving `/dev/fuse` beside it: what the kernel never sends through the
//! ring (FORGET, INTERRUPT) and everything if registration fails (the kernel then falls back
//! to `/dev/fuse` for good).
//!
//! Shape: one queue per possible CPU (the kernel's), `threads_per_queue` threads on each,
//! pinned to it. Each thread owns a small ring and one ring entry (a 288-byte header buffer
//! and a payload buffer of `max_write`): it registers the entry, and then waits for a
//! request, serves it through [`crate::VolumeFile`] (the same code as the `/dev/fuse` path),
//! and commits the reply together with the wait for the next. A request therefore never
//! changes threads, and several requests of one CPU (a loop device's queue, 16 database
//! committers) are served side by side, as group commit needs.

use crate::VolumeFile;
use fuser::{Errno, FileAttr, FileType, INodeNo};
use io_uring::{opcode, squeue, types, IoUring};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant, UNIX_EPOCH};

/// The uapi's command codes (`enum fuse_uring_cmd`).
const CMD_REGISTER: u32 = 1;
const CMD_COMMIT_AND_FETCH: u32 = 2;
/// `struct fuse_uring_req_header`: `in_out` (128), `op_in` (128), `ring_ent_in_out` (32).
const HEADER_BYTES: usize = 288;
const OP_IN: usize = 128;
/// `ring_ent_in_out.payload_sz`.
const PAYLOAD_SZ: usize = 256 + 16;
/// INIT's `max_write` (lib.rs); the kernel refuses a payload buffer below
/// max(8 KiB, max_write, max_pages pages), and fuser asks max_pages of max_write.
pub(crate) const PAYLOAD_BYTES: usize = 1 << 20;

// FUSE opcodes (`enum fuse_opcode`) this file system answers through the ring.
const LOOKUP: u32 = 1;
const GETATTR: u32 = 3;
const SETATTR: u32 = 4;
const SYMLINK: u32 = 6;
const LINK: u32 = 13;
const OPEN: u32 = 14;
const READ: u32 = 15;
const WRITE: u32 = 16;
const STATFS: u32 = 17;
const RELEASE: u32 = 18;
const FSYNC: u32 = 20;
const FLUSH: u32 = 25;
const OPENDIR: u32 = 27;
const READDIR: u32 = 28;
const RELEASEDIR: u32 = 29;
const FSYNCDIR: u32 = 30;
const DESTROY: u32 = 38;
const NOTIFY_REPLY: u32 = 41;
const FALLOCATE: u32 = 43;
const READDIRPLUS: u32 = 44;
/// `fuse_setattr_in.valid`: the size is to change.
const FATTR_SIZE: u32 = 1 << 3;
/// `fuse_open_out.open_flags`.
const FOPEN_DIRECT_IO: u32 = 1;

/// Whether this kernel offers FUSE over io_uring to new mounts.
pub fn kernel_enables() -> bool {
    std::fs::read_to_string("/sys/module/fuse/parameters/enable_uring").is_ok_and(|s| s.trim() == "Y")
}

/// Whether this process can set up the io_uring each ring entry needs (128-byte entries): not
/// where io_uring is forbidden (a seccomp filter such as a container runtime's default
/// profile, `kernel.io_uring_disabled`). Asked before mounting, so that a transport that
/// cannot work is never asked for: a mount whose INIT asked for io_uring holds every request
/// until each queue has an entry, and one that never gets them cannot be unmounted while
/// something waits in it.
pub(crate) fn can_set_up() -> io::Result<()> {
    IoUring::<squeue::Entry128>::builder()
        .build(2)
        .map(drop)
        .map_err(|e| io::Error::new(e.kind(), format!("FUSE over io_uring: setting up an io_uring: {e}")))
}

/// The ring's threads: they end when the mount goes away (every entry completes with
/// ENOTCONN).
pub(crate) struct Ring {
    threads: Vec<JoinHandle<()>>,
}

impl Ring {
    /// Registers `threads_per_queue` entries on every queue of the connection behind `fd`
    /// (whose INIT reply asked for io_uring). Err if the ring could not be made ready (some
    /// queue without an entry): the threads that did register are in the Err too, for the
    /// caller to join once the mount is gone (they end with it; until then they hold a
    /// descriptor of /dev/fuse, an io_uring and their buffers). Entries that fail after every
    /// queue has one (the pinned wave) only cost locality: the ring serves without them.
    pub(crate) fn start(
        fd: OwnedFd,
        file: Arc<VolumeFile>,
        threads_per_queue: usize,
    ) -> Result<Ring, (io::Error, Ring)> {
        let fd = Arc::new(fd);
        let queues = possible_cpus();
        // A quarter pinned: measured on 2 CPUs with 8 a queue (`bench fsync --through fuse`),
        // 2 pinned served 4 KiB reads at QD1 at 0.66 of ext4 on a raw loop device against 0.54
        // unpinned, and at QD16 at 0.56-0.60 against 0.59-0.62; all 8 pinned, 0.47-0.50 at
        // QD16 (a CPU's burst cannot spill over to the other).
        let pinned = (threads_per_queue / 4).max(1);
        let mut threads = Vec::new();
        // Unpinned entries register first, the pinned ones last: the kernel hands a request
        // to the entry registered or committed last, so a lone requester is served by a
        // thread on its own CPU, and more requests at once spill over to threads free to run
        // on any CPU.
        for (wave, pin) in [(threads_per_queue - pinned, false), (pinned, true)] {
            let (tx, rx) = mpsc::channel();
            let mut started = 0;
            let mut first_error = None;
            'spawn: for qid in 0..queues {
                for n in 0..wave {
                    let (fd, file, tx) = (Arc::clone(&fd), Arc::clone(&file), tx.clone());
                    let spawned = std::thread::Builder::new()
                        .name(format!("fuse-ring-{qid}"))
                        .spawn(move || entry_thread(&fd, qid as u16, pin, &file, &tx));
                    match spawned {
                        Ok(t) => threads.push(t),
                        Err(e) => {
                            first_error = Some(io::Error::new(e.kind(), format!("FUSE ring thread {qid}.{n}: {e}")));
                            break 'spawn;
                        }
                    }
                    started += 1;
                }
            }
            drop(tx);
            for _ in 0..started {
                match rx.recv() {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => first_error = first_error.or(Some(e)),
                    Err(_) => {
                        first_error =
                            first_error.or(Some(io::Error::other("a FUSE ring thread ended before registering")))
                    }
                }
            }
            match first_error {
                None => {}
                // Every queue has its entries from the first wave: the ring is ready.
                Some(e) if pin => {
                    tracing::warn!(error = %e, "FUSE ring: a pinned entry failed; serving without it");
                    break;
                }
                Some(e) => return Err((e, Ring { threads })),
            }
        }
        Ok(Ring { threads })
    }

    /// Waits (a bounded time) for the threads to see the unmount.
    pub(crate) fn join(self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        for t in self.threads {
            while !t.is_finished() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(5));
            }
            if t.is_finished() {
                let _ = t.join();
            }
        }
    }
}

/// The kernel's queue count: one per possible CPU (`num_possible_cpus`, the CPUs listed in
/// /sys/devices/system/cpu/possible, e.g. "0-1" or "0-3,8-11").
pub(crate) fn possible_cpus() -> usize {
    let list = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap_or_default();
    let count = |range: &str| -> Option<usize> {
        let (a, b) = range.split_once('-').unwrap_or((range, range));
        Some(b.trim().parse::<usize>().ok()? + 1 - a.trim().parse::<usize>().ok()?)
    };
    list.trim()
        .split(',')
        .map(count)
        .sum::<Option<usize>>()
        .filter(|&n| n > 0)
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from))
}

/// The 80 bytes of a command: `struct fuse_uring_cmd_req` (flags, commit_id, qid), zeroes.
fn command(commit_id: u64, qid: u16) -> [u8; 80] {
    let mut c = [0u8; 80];
    c[8..16].copy_from_slice(&commit_id.to_ne_bytes());
    c[16..18].copy_from_slice(&qid.to_ne_bytes());
    c
}

/// `sqe->len`, which REGISTER requires to be 2 (the iovecs: header and payload) and the
/// io-uring crate's `UringCmd80` builder does not set.
fn with_len(e: squeue::Entry128, len: u32) -> squeue::Entry128 {
    const _: () = assert!(std::mem::size_of::<squeue::Entry128>() == 128);
    // SAFETY: Entry128 is #[repr(C)]: a 64-byte struct io_uring_sqe (built from zeroed
    // memory, so every byte is initialised) followed by 64 bytes of command; any bytes are a
    // valid [u8; 128], and `len` is the sqe's u32 at offset 24 (uapi io_uring.h), so the
    // result is that sqe with `len` set.
    let mut raw: [u8; 128] = unsafe { std::mem::transmute(e) };
    raw[24..28].copy_from_slice(&len.to_ne_bytes());
    // SAFETY: the same layout back; every field of an sqe is a plain integer.
    unsafe { std::mem::transmute(raw) }
}

fn pin_to(cpu: usize) {
    // SAFETY: a zeroed cpu_set_t is an empty set; CPU_SET writes within it (cpu is below
    // the possible-CPU count, itself below CPU_SETSIZE on any machine this runs on, and
    // CPU_SET ignores larger values); sched_setaffinity(0) reads the set for this thread.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(cpu, &mut set);
        // A CPU that is offline refuses: the thread then runs anywhere, which only costs
        // locality.
        let _ = libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// One ring entry's life: register it on queue `qid`, report whether that worked, then serve
/// requests until the connection ends.
fn entry_thread(fd: &OwnedFd, qid: u16, pin: bool, file: &VolumeFile, registered: &mpsc::Sender<io::Result<()>>) {
    if pin {
        pin_to(usize::from(qid));
    }
    let fail = |e: io::Error| {
        let _ = registered.send(Err(e));
    };
    let mut header = vec![0u8; HEADER_BYTES];
    // Page-aligned: a READ is read from the volume straight into it, with O_DIRECT below; in
    // huge pages, one I/O segment per 2 MiB (`AlignedBuf::new_huge`).
    let mut payload_buf = tiercache_device::AlignedBuf::new_huge(PAYLOAD_BYTES);
    let payload = &mut payload_buf[..];
    // (Made after the buffers, so dropped before them: the ring, closed, cancels the entry's
    // command before the memory it points at is freed.)
    let mut ring: IoUring<squeue::Entry128> = match IoUring::<squeue::Entry128>::builder().build(2) {
        Ok(r) => r,
        Err(e) => return fail(io::Error::new(e.kind(), format!("io_uring with 128-byte entries: {e}"))),
    };
    // The kernel keeps these addresses for the entry's life: neither buffer moves or is
    // freed before the thread ends, and the thread ends only once the kernel has completed
    // the entry's last command (or the ring, dropped with them, cancels it).
    let iov = [
        libc::iovec { iov_base: header.as_mut_ptr().cast(), iov_len: HEADER_BYTES },
        libc::iovec { iov_base: payload.as_mut_ptr().cast(), iov_len: PAYLOAD_BYTES },
    ];
    let register = with_len(
        opcode::UringCmd80::new(types::Fd(fd.as_raw_fd()), CMD_REGISTER)
            .cmd(command(0, qid))
            .addr(Some(iov.as_ptr() as u64))
            .build(),
        2,
    );
    // A registration fails at once (a completion with an error) or stays pending until the
    // first request (whose completion may be here already: then it is served first); EAGAIN:
    // the kernel has not seen the INIT reply yet.
    let mut have_request = false;
    for attempt in 0.. {
        // SAFETY: the entry points at `iov` and the two buffers, alive until the thread
        // ends (above).
        if let Err(e) = unsafe { ring.submission().push(&register) } {
            return fail(io::Error::other(format!("FUSE ring: {e}")));
        }
        if let Err(e) = ring.submit() {
            return fail(e);
        }
        match ring.completion().next().map(|c| c.result()) {
            Some(r) if r == -libc::EAGAIN && attempt < 1000 => std::thread::sleep(Duration::from_millis(1)),
            Some(r) if r < 0 => {
                return fail(io::Error::new(
                    io::Error::from_raw_os_error(-r).kind(),
                    format!("registering a FUSE ring entry on queue {qid}: {}", io::Error::from_raw_os_error(-r)),
                ))
            }
            Some(_) => {
                have_request = true;
                break;
            }
            None => break,
        }
    }
    let _ = registered.send(Ok(()));
    loop {
        if !have_request {
            match ring.submit_and_wait(1) {
                Ok(_) => {}
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => continue,
                Err(e) => {
                    tracing::warn!(error = %e, qid, "FUSE ring");
                    return;
                }
            }
            let Some(cqe) = ring.completion().next() else { continue };
            let r = cqe.result();
            if r < 0 {
                // ENOTCONN: unmounted (or the server's end); ECONNABORTED: aborted.
                if r != -libc::ENOTCONN && r != -libc::ECONNABORTED && r != -libc::ECANCELED {
                    tracing::warn!(error = %io::Error::from_raw_os_error(-r), qid, "FUSE ring entry");
                }
                return;
            }
        }
        have_request = false;
        let (commit_id, ahead) = serve_one(file, &mut header, payload);
        let commit = opcode::UringCmd80::new(types::Fd(fd.as_raw_fd()), CMD_COMMIT_AND_FETCH)
            .cmd(command(commit_id, qid))
            .build();
        // SAFETY: a commit carries no pointers (the kernel reads the reply from the buffers
        // registered above).
        if let Err(e) = unsafe { ring.submission().push(&commit) } {
            tracing::warn!(error = %e, qid, "FUSE ring");
            return;
        }
        if ahead {
            // The reply goes out now, not with the wait for the next request, and the write's
            // record is written while its fsync is on the way. (A failed submit is seen by the
            // wait below.)
            let _ = ring.submit();
            file.write_ahead();
        }
    }
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}

/// Writes little pieces of a reply, in order.
struct Out<'a> {
    buf: &'a mut [u8],
    len: usize,
}

impl Out<'_> {
    fn put(&mut self, bytes: &[u8]) -> &mut Self {
        self.buf[self.len..self.len + bytes.len()].copy_from_slice(bytes);
        self.len += bytes.len();
        self
    }
    fn u32(&mut self, v: u32) -> &mut Self {
        self.put(&v.to_ne_bytes())
    }
    fn u64(&mut self, v: u64) -> &mut Self {
        self.put(&v.to_ne_bytes())
    }
}

/// `struct fuse_attr` (88 bytes).
fn put_attr(o: &mut Out<'_>, a: &FileAttr) {
    let secs = |t: std::time::SystemTime| t.duration_since(UNIX_EPOCH).unwrap_or_default();
    let (at, mt, ct) = (secs(a.atime), secs(a.mtime), secs(a.ctime));
    let kind = match a.kind {
        FileType::Directory => libc::S_IFDIR,
        _ => libc::S_IFREG,
    };
    o.u64(a.ino.0).u64(a.size).u64(a.blocks).u64(at.as_secs()).u64(mt.as_secs()).u64(ct.as_secs());
    o.u32(at.subsec_nanos()).u32(mt.subsec_nanos()).u32(ct.subsec_nanos());
    o.u32(kind | u32::from(a.perm)).u32(a.nlink).u32(a.uid).u32(a.gid).u32(a.rdev).u32(a.blksize).u32(a.flags);
}

/// `struct fuse_attr_out` (104 bytes).
fn put_attr_out(o: &mut Out<'_>, a: &FileAttr) {
    o.u64(crate::TTL.as_secs()).u32(crate::TTL.subsec_nanos()).u32(0);
    put_attr(o, a);
}

/// `struct fuse_open_out` (16 bytes).
fn put_open_out(o: &mut Out<'_>, open_flags: u32) {
    o.u64(0).u32(open_flags).u32(0);
}

/// Serves the request in `header` and `payload` and writes its reply there; returns the
/// commit id (the request's unique) and whether the request is a write to write ahead once
/// its reply is committed (`VolumeFile::write_ahead`).
fn serve_one(file: &VolumeFile, header: &mut [u8], payload: &mut [u8]) -> (u64, bool) {
    let opcode = u32_at(header, 4);
    let unique = u64_at(header, 8);
    let ino = INodeNo(u64_at(header, 16));
    let uid = u32_at(header, 24);
    let mut op = [0u8; 128];
    op.copy_from_slice(&header[OP_IN..OP_IN + 128]);
    let input = (u32_at(header, PAYLOAD_SZ) as usize).min(payload.len());
    let mut ahead = false;
    let result = if uid != file.owner && !without_uid(opcode) {
        // fuser's check for the same mount (its default access rule, the mount's owner only).
        Err(Errno::EACCES)
    } else {
        // A panic (an assertion, kept on in production) is answered EIO, as fuser's dropped
        // reply answers it through /dev/fuse: unanswered, a request already sent holds its
        // requester for good, and the queue would lose this entry.
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            dispatch(file, opcode, ino, &op, input, payload, &mut ahead)
        }))
        .unwrap_or_else(|_| {
            tracing::error!(opcode, "a FUSE request panicked; answered with EIO");
            Err(Errno::EIO)
        })
    };
    let (error, n) = match result {
        Ok(n) => (0, n),
        Err(e) => (-e.code(), 0),
    };
    header[0..4].copy_from_slice(&(16 + n as u32).to_ne_bytes());
    header[4..8].copy_from_slice(&error.to_ne_bytes());
    header[8..16].copy_from_slice(&unique.to_ne_bytes());
    header[PAYLOAD_SZ..PAYLOAD_SZ + 4].copy_from_slice(&(n as u32).to_ne_bytes());
    (unique, ahead && error == 0)
}

/// What fuser lets through from any uid (the kernel may send these with no uid of the
/// mount's owner: a loop device's reads and writes, the release of a file it had open).
fn without_uid(opcode: u32) -> bool {
    matches!(opcode, READ | WRITE | FSYNC | FSYNCDIR | RELEASE | RELEASEDIR | READDIR | READDIRPLUS | DESTROY)
}

/// Runs one request; its reply goes at the start of `payload` (Ok: how many bytes). `ahead`:
/// set for a write to write ahead once its reply is committed (`VolumeFile::write_ahead`).
fn dispatch(
    file: &VolumeFile,
    opcode: u32,
    ino: INodeNo,
    op: &[u8],
    input: usize,
    payload: &mut [u8],
    ahead: &mut bool,
) -> Result<usize, Errno> {
    let mut out = Out { buf: payload, len: 0 };
    match opcode {
        LOOKUP => {
            // The name, NUL-terminated, is the payload.
            let name = &out.buf[..input];
            let name = name.split(|&b| b == 0).next().unwrap_or_default().to_vec();
            let a = file.lookup(ino, &name)?;
            // struct fuse_entry_out (128 bytes).
            out.u64(a.ino.0).u64(0).u64(crate::TTL.as_secs()).u64(crate::TTL.as_secs());
            out.u32(crate::TTL.subsec_nanos()).u32(crate::TTL.subsec_nanos());
            put_attr(&mut out, &a);
        }
        GETATTR => put_attr_out(&mut out, &file.attr(ino).ok_or(Errno::ENOENT)?),
        SETATTR => {
            let size = (u32_at(op, 0) & FATTR_SIZE != 0).then(|| u64_at(op, 16));
            put_attr_out(&mut out, &file.setattr(ino, size)?);
        }
        OPEN => {
            file.open(ino)?;
            put_open_out(&mut out, FOPEN_DIRECT_IO);
        }
        OPENDIR => put_open_out(&mut out, 0),
        READ => {
            // struct fuse_read_in: fh, offset, size.
            let size = (u32_at(op, 16) as usize).min(out.buf.len());
            return file.read(ino, u64_at(op, 8), &mut out.buf[..size]);
        }
        WRITE => {
            // struct fuse_write_in: fh, offset, size, write_flags, lock_owner, flags; the data
            // is the payload.
            let size = (u32_at(op, 16) as usize).min(input);
            let n;
            (n, *ahead) = file.write(ino, u64_at(op, 8), &out.buf[..size], u32_at(op, 32) as i32)?;
            // struct fuse_write_out.
            out.u32(n).u32(0);
        }
        FSYNC => file.fsync()?,
        FLUSH | RELEASE | RELEASEDIR | DESTROY | NOTIFY_REPLY => {}
        FALLOCATE => {
            // struct fuse_fallocate_in: fh, offset, length, mode.
            file.fallocate(ino, u64_at(op, 8), u64_at(op, 16), u32_at(op, 24) as i32)?;
        }
        READDIR => {
            let (offset, size) = (u64_at(op, 8), (u32_at(op, 16) as usize).min(out.buf.len()));
            for (i, (entry, kind, name)) in file.entries(ino)?.iter().enumerate().skip(offset as usize) {
                // struct fuse_dirent, padded to 8 bytes.
                let len = (24 + name.len()).next_multiple_of(8);
                if out.len + len > size {
                    break;
                }
                let start = out.len;
                let dt = if *kind == FileType::Directory { libc::DT_DIR } else { libc::DT_REG };
                out.u64(entry.0).u64(i as u64 + 1).u32(name.len() as u32).u32(u32::from(dt)).put(name.as_bytes());
                out.put(&[0u8; 8][..start + len - out.len]);
            }
        }
        STATFS => {
            let (blocks, bs) = file.statfs();
            // struct fuse_kstatfs: blocks, bfree, bavail, files, ffree, bsize, namelen,
            // frsize, padding, spare[6].
            out.u64(blocks).u64(0).u64(0).u64(2).u64(0).u32(bs).u32(255).u32(bs).u32(0).put(&[0u8; 24]);
        }
        // fuser's default answers for links, which the /dev/fuse path gives (symlink(2) would
        // otherwise fail with ENOSYS through the ring and EPERM through /dev/fuse).
        SYMLINK | LINK => return Err(Errno::EPERM),
        // What fuser answers for what the file system does not implement (xattrs, access,
        // statx, creating files, locks, ...): the kernel then stops asking or falls back.
        _ => return Err(Errno::ENOSYS),
    }
    Ok(out.len)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A volume in memory.
    struct Mem(std::sync::Mutex<Vec<u8>>);

    impl tiercache_frontend::ByteIo for Mem {
        fn size_bytes(&self) -> u64 {
            self.0.lock().unwrap().len() as u64
        }
        fn block_size(&self) -> u32 {
            4096
        }
        fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), tiercache_frontend::Errno> {
            buf.copy_from_slice(&self.0.lock().unwrap()[offset as usize..offset as usize + buf.len()]);
            Ok(())
        }
        fn write(&self, offset: u64, data: &[u8], _fua: bool) -> Result<(), tiercache_frontend::Errno> {
            self.0.lock().unwrap()[offset as usize..offset as usize + data.len()].copy_from_slice(data);
            Ok(())
        }
        fn flush(&self) -> Result<(), tiercache_frontend::Errno> {
            Ok(())
        }
        fn trim(&self, _offset: u64, _len: u64) -> Result<(), tiercache_frontend::Errno> {
            Ok(())
        }
        fn write_zeroes(&self, offset: u64, len: u64, _fua: bool) -> Result<(), tiercache_frontend::Errno> {
            self.0.lock().unwrap()[offset as usize..(offset + len) as usize].fill(0);
            Ok(())
        }
    }

    /// One request through `serve_one`, as the kernel lays it out: opcode, node, uid, the
    /// op-specific struct at 128, the rest in the payload. The reply: (error, payload).
    fn ask(file: &VolumeFile, opcode: u32, ino: u64, uid: u32, op: &[u8], input: &[u8]) -> (i32, Vec<u8>) {
        ask_ahead(file, opcode, ino, uid, op, input).0
    }

    /// `ask`, and whether `serve_one` asked for a write ahead.
    fn ask_ahead(
        file: &VolumeFile,
        opcode: u32,
        ino: u64,
        uid: u32,
        op: &[u8],
        input: &[u8],
    ) -> ((i32, Vec<u8>), bool) {
        let mut header = vec![0xa5u8; HEADER_BYTES];
        header[4..8].copy_from_slice(&opcode.to_ne_bytes());
        header[8..16].copy_from_slice(&77u64.to_ne_bytes());
        header[16..24].copy_from_slice(&ino.to_ne_bytes());
        header[24..28].copy_from_slice(&uid.to_ne_bytes());
        header[OP_IN..OP_IN + op.len()].copy_from_slice(op);
        header[PAYLOAD_SZ..PAYLOAD_SZ + 4].copy_from_slice(&(input.len() as u32).to_ne_bytes());
        let mut payload = vec![0x5au8; 1 << 16];
        payload[..input.len()].copy_from_slice(input);
        let (unique, ahead) = serve_one(file, &mut header, &mut payload);
        assert_eq!(unique, 77, "the commit id is the unique");
        assert_eq!(u64_at(&header, 8), 77, "the reply's unique");
        let (len, error, n) = (u32_at(&header, 0), u32_at(&header, 4) as i32, u32_at(&header, PAYLOAD_SZ) as usize);
        assert_eq!(len as usize, 16 + n, "fuse_out_header.len");
        assert!(error == 0 || n == 0, "an error reply carries no payload");
        ((error, payload[..n].to_vec()), ahead)
    }

    /// Writes and fsyncs one at a time (a loop device under a database's fdatasync): from the
    /// third write on, each asks for a write ahead after its reply; a write with no fsync
    /// since the one before, a FUA write (the file opened O_DSYNC) and a refused write do not.
    #[test]
    fn a_file_committed_one_write_at_a_time_has_its_writes_written_ahead() {
        let file = VolumeFile::new(Arc::new(Mem(std::sync::Mutex::new(vec![0u8; 1 << 20]))));
        let me = file.owner;
        // fuse_write_in: fh, offset, size and write_flags, lock_owner, flags (the file's).
        let write_at =
            |offset: u64, flags: u64| ask_ahead(&file, WRITE, 2, me, &le(&[0, offset, 4, 0, flags]), b"data");
        let write = |flags: u64| write_at(0, flags).1;
        let fsync = || assert!(!ask_ahead(&file, FSYNC, 2, me, &[0; 16], &[]).1);
        let two_commits = || {
            for _ in 0..2 {
                write(0);
                fsync();
            }
        };
        let mut seen = Vec::new();
        for _ in 0..4 {
            seen.push(write(0));
            fsync();
        }
        assert_eq!(seen, [false, false, true, true]);
        assert!(write(0), "a fifth commit");
        assert!(!write(0), "a write with no fsync since the one before");
        fsync();
        two_commits();
        assert!(write(0), "two commits again");
        fsync();
        assert!(!write(libc::O_DSYNC as u64), "a FUA write is a commit of its own");
        two_commits();
        let past_end = write_at(1 << 20, 0);
        assert_eq!((past_end.0 .0, past_end.1), (-libc::ENOSPC, false), "a refused write");
    }

    fn le(parts: &[u64]) -> Vec<u8> {
        parts.iter().flat_map(|p| p.to_ne_bytes()).collect()
    }

    #[test]
    fn replies_have_the_sizes_and_answers_the_kernel_expects() {
        let file = VolumeFile::new(Arc::new(Mem(std::sync::Mutex::new(vec![0u8; 1 << 20]))));
        let me = file.owner;
        let (root, vol) = (1, 2);
        assert_eq!(ask(&file, GETATTR, vol, me, &[0; 16], &[]).1.len(), 104);
        let (e, entry) = ask(&file, LOOKUP, root, me, &[], b"volume\0");
        assert_eq!((e, entry.len(), u64_at(&entry, 0)), (0, 128, 2), "fuse_entry_out of the file");
        assert_eq!(ask(&file, LOOKUP, root, me, &[], b"nope\0"), (-libc::ENOENT, vec![]));
        let (e, open) = ask(&file, OPEN, vol, me, &[0; 8], &[]);
        assert_eq!((e, open.len(), u32_at(&open, 8)), (0, 16, FOPEN_DIRECT_IO));
        // fuse_write_in: fh, offset, size, write_flags, lock_owner, flags; then the data.
        let (e, w) = ask(&file, WRITE, vol, me, &le(&[0, 3, 5, 0, 0]), b"hello");
        assert_eq!((e, w.len(), u32_at(&w, 0)), (0, 8, 5));
        assert_eq!(ask(&file, READ, vol, me, &le(&[0, 2, 7]), &[]), (0, b"\0hello\0".to_vec()));
        assert_eq!(ask(&file, READ, vol, me, &le(&[0, (1 << 20) - 3, 10]), &[]).1.len(), 3, "short at the end");
        assert_eq!(ask(&file, READ, vol, me, &le(&[0, 1 << 20, 10]), &[]), (0, vec![]), "nothing past it");
        assert_eq!(ask(&file, STATFS, vol, me, &[], &[]).1.len(), 80);
        for op in [FSYNC, FLUSH, RELEASE, RELEASEDIR] {
            assert_eq!(ask(&file, op, vol, me, &[0; 16], &[]), (0, vec![]), "opcode {op}");
        }
        // fuse_setattr_in: valid, padding, fh, size.
        assert_eq!(ask(&file, SETATTR, vol, me, &le(&[u64::from(FATTR_SIZE), 0, 1 << 20]), &[]).1.len(), 104);
        assert_eq!(ask(&file, SETATTR, vol, me, &le(&[u64::from(FATTR_SIZE), 0, 4096]), &[]).0, -libc::EPERM);
        // READDIR with room for one entry, then from the third.
        let (e, d) = ask(&file, READDIR, root, me, &le(&[0, 0, 32]), &[]);
        assert_eq!((e, d.len(), &d[24..25]), (0, 32, &b"."[..]));
        let (e, d) = ask(&file, READDIR, root, me, &le(&[0, 2, 4096]), &[]);
        assert_eq!((e, d.len(), &d[24..30]), (0, 32, &b"volume"[..]));
        assert_eq!(ask(&file, READDIR, root, me, &le(&[0, 0, 16]), &[]), (0, vec![]), "no room for any");
        // What fuser's defaults answer for what the file system leaves out.
        assert_eq!(ask(&file, SYMLINK, root, me, &[], b"s\0volume\0").0, -libc::EPERM);
        assert_eq!(ask(&file, LINK, root, me, &le(&[2]), b"v2\0").0, -libc::EPERM);
        for op in [
            9,  /* MKDIR */
            10, /* UNLINK */
            12, /* RENAME */
            22, /* GETXATTR */
            35, /* CREATE */
            46,
        ] {
            assert_eq!(ask(&file, op, root, me, &[0; 64], b"x\0").0, -libc::ENOSYS, "opcode {op}");
        }
        // Another uid: only what the kernel sends without one (fuser's rule).
        let other = me.wrapping_add(1);
        assert_eq!(ask(&file, GETATTR, vol, other, &[0; 16], &[]).0, -libc::EACCES);
        assert_eq!(ask(&file, READ, vol, other, &le(&[0, 2, 7]), &[]).1.len(), 7);
    }

    /// A volume whose reads panic (an assertion of the engine's, kept on in production).
    struct PanicsOnRead(Mem);

    impl tiercache_frontend::ByteIo for PanicsOnRead {
        fn size_bytes(&self) -> u64 {
            self.0.size_bytes()
        }
        fn block_size(&self) -> u32 {
            4096
        }
        fn read(&self, _offset: u64, _buf: &mut [u8]) -> Result<(), tiercache_frontend::Errno> {
            panic!("an assertion in the volume");
        }
        fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), tiercache_frontend::Errno> {
            self.0.write(offset, data, fua)
        }
        fn flush(&self) -> Result<(), tiercache_frontend::Errno> {
            Ok(())
        }
        fn trim(&self, _offset: u64, _len: u64) -> Result<(), tiercache_frontend::Errno> {
            Ok(())
        }
        fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), tiercache_frontend::Errno> {
            self.0.write_zeroes(offset, len, fua)
        }
    }

    /// A request whose handling panics is answered EIO, as fuser answers it through /dev/fuse
    /// (its reply, dropped unsent, sends EIO), and the entry goes on serving. Unanswered, the
    /// requester would wait for good (uninterruptibly: the request was sent) and the queue
    /// would have lost an entry.
    #[test]
    fn a_request_that_panics_is_answered_eio_and_the_entry_goes_on() {
        let file = VolumeFile::new(Arc::new(PanicsOnRead(Mem(std::sync::Mutex::new(vec![0u8; 1 << 20])))));
        let me = file.owner;
        assert_eq!(ask(&file, READ, 2, me, &le(&[0, 0, 4096]), &[]), (-libc::EIO, vec![]));
        assert_eq!(ask(&file, GETATTR, 2, me, &[0; 16], &[]).1.len(), 104);
    }

    #[test]
    fn register_entries_carry_len_2_and_the_command() {
        let e = with_len(
            opcode::UringCmd80::new(types::Fd(7), CMD_REGISTER).cmd(command(0x1122, 1)).addr(Some(0xabc)).build(),
            2,
        );
        // SAFETY: as in with_len.
        let raw: [u8; 128] = unsafe { std::mem::transmute(e) };
        assert_eq!(raw[0], 46, "IORING_OP_URING_CMD");
        assert_eq!(u32_at(&raw, 4), 7, "fd");
        assert_eq!(u32_at(&raw, 8), CMD_REGISTER, "cmd_op");
        assert_eq!(u64_at(&raw, 16), 0xabc, "addr: the iovecs");
        assert_eq!(u32_at(&raw, 24), 2, "len: two iovecs");
        assert_eq!(u64_at(&raw, 48 + 8), 0x1122, "commit_id");
        assert_eq!(u16::from_ne_bytes([raw[64], raw[65]]), 1, "qid");
    }
}
