//! The volume as a Linux block device, `/dev/ublkbN`, through ublk (Linux 6.0+, `ublk_drv`):
//! the kernel queues block requests to this process over io_uring, with no socket and no
//! extra thread hop in between.
//!
//! - One queue per core by default, each served by its own thread that runs each request to
//!   completion against the volume (`ByteIo`): a database's synchronous write and flush costs
//!   one round trip through the ublk driver and the engine, nothing more.
//! - READ, WRITE (FUA as a write then the volume's FLUSH), FLUSH, DISCARD (TRIM) and
//!   WRITE_ZEROES. The device advertises 4 KiB logical and physical blocks (no read-modify-
//!   write below the engine), a volatile write cache and FUA, so the kernel sends flushes.
//! - Stopping (`stop` set, e.g. by SIGTERM): the volume is flushed, then the device removed.
//! - With user recovery (`UBLK_F_USER_RECOVERY_REISSUE`, Linux 6.0+; the reissue variant
//!   requeues what was in flight) a server killed with SIGKILL leaves `/dev/ublkbN` in place
//!   with its I/O queued; a new server started with the same `--ublk-id` re-attaches to it
//!   (`serve --ublk --ublk-id N`), so a file system mounted on it survives the restart.
//!
//! The server must not share a mount namespace with users of its own device in ways that make
//! it wait on them (it never touches file systems on the device itself).

use libublk::ctrl::{UblkCtrl, UblkCtrlBuilder};
use libublk::io::{BufDescList, UblkDev, UblkIOCtx, UblkQueue};
use libublk::{sys, BufDesc, UblkFlags, UblkIORes};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tiercache_frontend::{ByteIo, CommitPattern, Errno, RequestKind};

/// Settings of the block device.
#[derive(Debug, Clone)]
pub struct Options {
    /// Device number N of `/dev/ublkbN`: `None` lets the driver choose (a new device). If
    /// device N exists, left by a server that died (quiesced, its I/O queued), this server
    /// re-attaches to it (user recovery) instead of adding a new one.
    pub id: Option<u32>,
    /// Hardware queues (one serving thread each).
    pub queues: u16,
    /// Requests in flight per queue.
    pub depth: u16,
    /// What is served (the volume's UUID), recorded with the device: a server re-attaches
    /// only to a device that served the same thing, never hands a mounted file system
    /// another volume's blocks.
    pub identity: String,
}

impl Default for Options {
    fn default() -> Self {
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
        Options { id: None, queues: cores.clamp(1, 16) as u16, depth: 64, identity: String::new() }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("ublk: {0} (is the ublk_drv module loaded? `modprobe ublk_drv`; Linux 6.0 or later)")]
    Driver(String),
    #[error("ublk: the volume's size ({0} bytes) is not a multiple of 4 KiB")]
    Size(u64),
    #[error(
        "ublk: /dev/ublkb{id} was left by a server of {served}, not {this}: refusing to re-attach (the file system on it \
         belongs to the other volume; serve that one with --ublk-id {id}, or give this one another --ublk-id)"
    )]
    OtherVolume { id: u32, served: String, this: String },
    #[error(
        "ublk: /dev/ublkb{id} is served by another running server; give another --ublk-id (or none: the next free one)"
    )]
    InUse { id: u32 },
}

/// Largest request the device takes (the kernel splits larger ones).
const MAX_IO_BYTES: u32 = 1 << 20;
const BLOCK_SHIFT: u8 = 12;

/// Serves `backend` as a ublk block device until `stop` is set, then flushes the volume and
/// removes the device. `ready` is called with the device's path once it exists.
pub fn serve(
    backend: Arc<dyn ByteIo>,
    options: &Options,
    stop: Arc<AtomicBool>,
    ready: impl FnOnce(&str) + Send + Sync + 'static,
) -> Result<(), Error> {
    let size = backend.size_bytes();
    if !size.is_multiple_of(1 << BLOCK_SHIFT) {
        return Err(Error::Size(size));
    }
    check_driver()?;
    let driver = |what: &str, e: libublk::UblkError| Error::Driver(format!("{what}: {e:?}"));
    let id = options.id.map_or(-1, |i| i as i32);
    // A device with that number that is not waiting for recovery is another server's: asking
    // the driver to add it again would fail, and libublk would then delete the live device.
    let existing = options.id.and_then(|i| UblkCtrl::new_simple(i as i32).ok().map(|c| c.dev_info()));
    if let Some(info) = existing {
        if info.state != sys::UBLK_S_DEV_QUIESCED as u16 {
            return Err(Error::InUse { id: id as u32 });
        }
    }
    let recover = existing.is_some();
    // Recovery keeps the device's queues as the kernel has them.
    let (queues, depth) = match existing {
        Some(info) => (info.nr_hw_queues, info.queue_depth),
        None => (options.queues, options.depth),
    };
    if recover {
        tracing::info!(id, "re-attaching to /dev/ublkb{id}, left by a server that stopped without removing it");
        let old = UblkCtrl::new_simple(id).map_err(|e| driver("opening the device to recover", e))?;
        let served = old.get_target_data_from_json().and_then(|v| v["served"].as_str().map(str::to_string));
        if served.as_deref() != Some(options.identity.as_str()) {
            return Err(Error::OtherVolume {
                id: id as u32,
                served: served.unwrap_or_else(|| "something unrecorded".into()),
                this: options.identity.clone(),
            });
        }
        old.start_user_recover().map_err(|e| driver("starting user recovery", e))?;
    }
    let dev_flags = if recover { UblkFlags::UBLK_DEV_F_RECOVER_DEV } else { UblkFlags::UBLK_DEV_F_ADD_DEV };
    let ctrl = UblkCtrlBuilder::default()
        .name("tiercache")
        .id(id)
        .nr_queues(queues)
        .depth(depth)
        .io_buf_bytes(MAX_IO_BYTES)
        .ctrl_flags(u64::from(sys::UBLK_F_USER_RECOVERY | sys::UBLK_F_USER_RECOVERY_REISSUE))
        .dev_flags(dev_flags)
        .build()
        .map_err(|e| driver("creating the device", e))?;
    let identity = options.identity.clone();
    let tgt_init = move |dev: &mut UblkDev| {
        dev.set_target_json(serde_json::json!({ "served": identity }));
        dev.set_default_params(size);
        let p = &mut dev.tgt.params;
        p.types = sys::UBLK_PARAM_TYPE_BASIC | sys::UBLK_PARAM_TYPE_DISCARD;
        p.basic.attrs = sys::UBLK_ATTR_VOLATILE_CACHE | sys::UBLK_ATTR_FUA;
        p.basic.logical_bs_shift = BLOCK_SHIFT;
        p.basic.physical_bs_shift = BLOCK_SHIFT;
        p.basic.io_min_shift = BLOCK_SHIFT;
        p.basic.io_opt_shift = BLOCK_SHIFT;
        p.discard.discard_granularity = 1 << BLOCK_SHIFT;
        p.discard.max_discard_sectors = MAX_IO_BYTES >> 9;
        p.discard.max_write_zeroes_sectors = MAX_IO_BYTES >> 9;
        p.discard.max_discard_segments = 1;
        Ok(())
    };
    let queue_backend = Arc::clone(&backend);
    // (One for all queues: a committer's requests go to the queue of whichever CPU it runs on.)
    let commits = Arc::new(CommitPattern::default());
    let queue_fn = move |qid: u16, dev: &UblkDev| serve_queue(qid, dev, &*queue_backend, &commits);
    let flush_backend = Arc::clone(&backend);
    let device_fn = move |ctrl: &UblkCtrl| {
        ready(&ctrl.get_bdev_path());
        while !stop.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
        }
        // Everything acknowledged is durable before the device goes away.
        if let Err(e) = flush_backend.flush() {
            tracing::error!(error = %e, "flush before removing the ublk device failed");
        }
        let _ = ctrl.kill_dev();
    };
    ctrl.run_target(tgt_init, queue_fn, device_fn).map_err(|e| driver("running the device", e))?;
    ctrl.del_dev().map_err(|e| driver("removing the device", e))?;
    Ok(())
}

/// Whether the ublk driver is there (`/dev/ublk-control`): checked before anything else, so
/// that a server without it fails at once, not after recovering the volume.
pub fn check_driver() -> Result<(), Error> {
    if std::path::Path::new("/dev/ublk-control").exists() {
        Ok(())
    } else {
        Err(Error::Driver("/dev/ublk-control does not exist".into()))
    }
}

/// Whether a block device is in use (mounted, or held open exclusively): an exclusive open
/// fails with EBUSY then. Removing a device in use would fail its file system's writes.
pub fn in_use(path: &str) -> bool {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_EXCL)
        .open(path)
        .is_err_and(|e| e.raw_os_error() == Some(libc::EBUSY))
}

/// One queue: fetch requests, run each against the volume, complete it with its result.
fn serve_queue(qid: u16, dev: &UblkDev, backend: &dyn ByteIo, commits: &CommitPattern) {
    let bufs = dev.alloc_queue_io_bufs();
    let queue = match UblkQueue::new(qid, dev)
        .and_then(|q| q.submit_fetch_commands_unified(BufDescList::Slices(Some(&bufs))))
    {
        Ok(q) => q,
        Err(e) => {
            tracing::error!(qid, error = ?e, "ublk queue setup failed");
            return;
        }
    };
    let mut bufs = bufs;
    let handler = move |q: &UblkQueue, tag: u16, _io: &UblkIOCtx| {
        let iod = q.get_iod(tag);
        let (op, fua) = (iod.op_flags & 0xff, iod.op_flags & sys::UBLK_IO_F_FUA != 0);
        let offset = iod.start_sector << 9;
        let bytes = (iod.nr_sectors as usize) << 9;
        let buf = bufs[tag as usize].as_mut_slice();
        let kind = match op {
            sys::UBLK_IO_OP_WRITE if !fua => RequestKind::Write,
            sys::UBLK_IO_OP_FLUSH => RequestKind::Flush,
            _ => RequestKind::Other,
        };
        let ahead = commits.note(kind);
        let result = if bytes > buf.len() {
            Err(Errno::new(libc::EINVAL))
        } else {
            match op {
                sys::UBLK_IO_OP_READ => backend.read(offset, &mut buf[..bytes]),
                sys::UBLK_IO_OP_WRITE => backend.write(offset, &buf[..bytes], fua),
                sys::UBLK_IO_OP_FLUSH => backend.flush(),
                sys::UBLK_IO_OP_DISCARD => backend.trim(offset, bytes as u64),
                sys::UBLK_IO_OP_WRITE_ZEROES => backend.write_zeroes(offset, bytes as u64, fua),
                _ => Err(Errno::new(libc::EINVAL)),
            }
        };
        let res = match result {
            Ok(()) => bytes as i32,
            Err(e) => -e.get(),
        };
        if let Err(e) = q.complete_io_cmd_unified(tag, BufDesc::Slice(&bufs[tag as usize]), Ok(UblkIORes::Result(res)))
        {
            tracing::error!(qid, tag, error = ?e, "completing a ublk request failed");
        }
        if ahead && res >= 0 {
            // A write of a committer that sends one write, then a FLUSH (`CommitPattern`): its
            // completion goes to the driver now rather than with the wait for the next request,
            // and the volume writes its record while the FLUSH is on its way
            // (`ByteIo::write_ahead`).
            if let Err(e) = libublk::io::with_task_io_ring(|r| r.submit()) {
                tracing::warn!(qid, error = %e, "submitting a ublk completion");
            }
            backend.write_ahead();
        }
    };
    queue.wait_and_handle_io(handler);
}
