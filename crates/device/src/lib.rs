//! tiercache's device layer: the only crate that issues syscalls on devices.
//!
//! Everything above this crate (the engine, the frontends, the CLI) sees storage through the
//! [`BlockDevice`] trait: positioned reads and writes of whole logical blocks, FUA writes,
//! flushes and discards. Three families implement it:
//!
//! - [`FileDevice`]: a regular file or a block device, O_DIRECT with aligned buffers by
//!   default, flush as `fdatasync`, FUA as `pwritev2(RWF_DSYNC)`.
//! - [`EmulatedDevice`]: any device plus a latency/bandwidth/queueing model ([`Profile`]), so a
//!   slow disk or a fast Optane can be reproduced on any machine with accurate timing.
//! - [`SimDevice`]: in-memory durable bytes plus completed-but-unflushed writes; `crash(seed)`
//!   drops, applies or tears each unflushed write. The base of every crash test.
//!
//! Invariants (asserted by every implementation through [`check_request`]):
//! - requests are aligned to `logical_block_size()` in offset and length, and lie inside
//!   `size_bytes()`; a bad request is an error, never a partial I/O;
//! - a write that completed is visible to every later read; it is durable only after a later
//!   `flush()` completes, or on completion if it was written with `write_fua_at`.

mod aligned;
mod clock;
mod emulated;
mod error;
mod file;
mod sim;
mod uring;

pub use aligned::{AlignedBuf, HUGE_PAGE};
pub use clock::{Clock, MonotonicClock, SimClock};
pub use emulated::EmulatedStats;
pub use emulated::{precise_wait_until, EmulatedDevice, Profile, SeekModel, PROFILES};
pub use error::{DeviceError, Result};
pub use file::{FileDevice, OpenOptions};
pub use sim::{CrashReport, FailMode, OpKind, SimDevice, SimFaults, SimLatency, SimStats};
pub use uring::ring_reads_on_this_thread;

use std::sync::Arc;

/// One range of a batch read ([`BlockDevice::read_batch`]): `bufs` filled in order from
/// `offset`, as one scatter read.
pub struct ReadRange<'a> {
    pub offset: u64,
    pub bufs: Vec<&'a mut [u8]>,
}

/// What `BlockDevice::read_batch_each` calls with each range as it is read: its index in the
/// batch, the range, its result.
pub type EachRange<'f> = dyn FnMut(usize, &ReadRange<'_>, &Result<()>) + 'f;

/// Reads each range of a batch on its own, in order (`read_batch`'s fallback).
pub(crate) fn read_one_after_another<D: BlockDevice + ?Sized>(
    dev: &D,
    ranges: &mut [ReadRange<'_>],
) -> Vec<Result<()>> {
    ranges.iter_mut().map(|r| dev.read_vectored_at(r.offset, &mut r.bufs)).collect()
}

/// Writes each of a batch on its own, in order (`write_batch`'s fallback).
pub(crate) fn write_one_after_another<D: BlockDevice + ?Sized>(dev: &D, writes: &[(u64, &[u8])]) -> Vec<Result<()>> {
    writes.iter().map(|&(offset, buf)| dev.write_at(offset, buf)).collect()
}

/// The size of the sector a write can tear into on every device this crate models: the
/// smallest unit a disk writes atomically.
pub const SECTOR_SIZE: u32 = 512;

/// A block device as the engine sees it. All methods take `&self`: implementations are
/// internally synchronised, so several threads may issue I/O at once (as a kernel queue would).
pub trait BlockDevice: Send + Sync {
    /// Size in bytes; always a multiple of `logical_block_size()`.
    fn size_bytes(&self) -> u64;
    /// The unit of addressing and alignment, in bytes (a power of two, at least 512).
    fn logical_block_size(&self) -> u32;
    /// Reads `buf.len()` bytes at `offset`.
    fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()>;
    /// Reads one contiguous range at `offset` into several buffers, in order (scatter: the
    /// engine reads a run of log slots whose record headers it skips into a scratch block,
    /// so a large cached read is one I/O, not one per record). The fallback reads each
    /// buffer on its own; devices that can do it in one I/O (`preadv`) override it.
    fn read_vectored_at(&self, offset: u64, bufs: &mut [&mut [u8]]) -> Result<()> {
        let mut at = offset;
        for buf in bufs.iter_mut() {
            self.read_at(at, buf)?;
            at += buf.len() as u64;
        }
        Ok(())
    }
    /// Reads several ranges with all of them in flight at once where the device can (a large
    /// cached read is one range per run of consecutive log slots): returns each range's
    /// result, in order. The fallback reads one range after another; [`FileDevice`] issues
    /// them together through io_uring, [`EmulatedDevice`] books them as concurrent requests.
    fn read_batch(&self, ranges: &mut [ReadRange<'_>]) -> Vec<Result<()>> {
        read_one_after_another(self, ranges)
    }
    /// `read_batch`, handing each range to `each` (its index, the range, its result) as soon
    /// as it is read, in the order the reads complete, while later ones may still be in
    /// flight: the caller checks what has arrived (the engine verifies a large cache hit's
    /// checksums) while the device reads the rest. Each range is handed over exactly once,
    /// with its final result. The fallback reads the whole batch, then hands the ranges over
    /// in order; [`FileDevice`] hands each over as the ring completes it.
    fn read_batch_each(&self, ranges: &mut [ReadRange<'_>], each: &mut EachRange<'_>) -> Vec<Result<()>> {
        let results = self.read_batch(ranges);
        for (k, (range, result)) in ranges.iter().zip(&results).enumerate() {
            each(k, range, result);
        }
        results
    }
    /// Writes `buf` at `offset`. Visible to reads on completion; durable after the next flush.
    fn write_at(&self, offset: u64, buf: &[u8]) -> Result<()>;
    /// Writes each `(offset, buf)` with all of them in flight at once where the device can
    /// (write-back's runs of dirty blocks, scattered over the backing device): returns each
    /// write's result, in order. They may land in any order, so they must not overlap; like
    /// any write, each is durable only after the next flush. The fallback writes one after
    /// another; [`FileDevice`] issues them together through io_uring, [`EmulatedDevice`] books
    /// them as concurrent requests.
    fn write_batch(&self, writes: &[(u64, &[u8])]) -> Vec<Result<()>> {
        write_one_after_another(self, writes)
    }
    /// `write_at`, running `during` on the calling thread while the write is in flight, and
    /// returning when both are done: a writer with more to prepare (the engine stages the
    /// next record's blocks while one record is written) keeps the device busy instead of
    /// leaving it idle while it computes. `during` runs exactly once, whatever the write's
    /// outcome, before or after the data lands (the caller may not assume either). The
    /// fallback writes, then runs `during`; [`FileDevice`] submits the write through io_uring
    /// and [`EmulatedDevice`] books it, then both run `during` before waiting.
    fn write_at_while(&self, offset: u64, buf: &[u8], during: &mut dyn FnMut()) -> Result<()> {
        let written = self.write_at(offset, buf);
        during();
        written
    }
    /// Writes `buf` at `offset` and makes it durable before returning (Force Unit Access).
    /// The fallback is a write then a flush, which is correct but also makes earlier writes
    /// durable; devices with a real FUA path override it.
    fn write_fua_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
        self.write_at(offset, buf)?;
        self.flush()
    }
    /// Makes every write that completed before this call durable.
    fn flush(&self) -> Result<()>;
    /// Tells the device that a range no longer holds useful data. Its content afterwards is
    /// unspecified (old data or zeroes); a device that cannot discard ignores the hint.
    fn discard(&self, offset: u64, len: u64) -> Result<()>;
    /// A short human-readable name for messages and reports (a path, `emulated:optane`...).
    fn describe(&self) -> String;
    /// The stable identity the kernel reports for the hardware behind a block device (its
    /// WWN or serial number), which survives renumbering (`/dev/sdb` becoming `/dev/sdc`).
    /// `None` for files, loop devices and anything that reports none.
    fn identity(&self) -> Option<String> {
        None
    }
    /// The largest aligned write a power loss cannot tear: each aligned unit of this many
    /// bytes of a write lands whole or not at all. 512 (a sector) unless the device says more.
    fn atomic_write_bytes(&self) -> u32 {
        512
    }
}

/// Validates a request against a device's geometry. Every implementation calls it first,
/// so a bad request never reaches the medium.
pub fn check_request(dev: &dyn BlockDevice, offset: u64, len: u64) -> Result<()> {
    let block = u64::from(dev.logical_block_size());
    if !offset.is_multiple_of(block) || !len.is_multiple_of(block) {
        return Err(DeviceError::Misaligned { offset, len, block_size: block });
    }
    let end = offset.checked_add(len).ok_or(DeviceError::OutOfRange { offset, len, size_bytes: dev.size_bytes() })?;
    if end > dev.size_bytes() {
        return Err(DeviceError::OutOfRange { offset, len, size_bytes: dev.size_bytes() });
    }
    Ok(())
}

macro_rules! forward_block_device {
    ($wrapper:ty) => {
        impl<T: BlockDevice + ?Sized> BlockDevice for $wrapper {
            fn size_bytes(&self) -> u64 {
                (**self).size_bytes()
            }
            fn logical_block_size(&self) -> u32 {
                (**self).logical_block_size()
            }
            fn read_at(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
                (**self).read_at(offset, buf)
            }
            fn read_vectored_at(&self, offset: u64, bufs: &mut [&mut [u8]]) -> Result<()> {
                (**self).read_vectored_at(offset, bufs)
            }
            fn read_batch(&self, ranges: &mut [ReadRange<'_>]) -> Vec<Result<()>> {
                (**self).read_batch(ranges)
            }
            fn read_batch_each(&self, ranges: &mut [ReadRange<'_>], each: &mut EachRange<'_>) -> Vec<Result<()>> {
                (**self).read_batch_each(ranges, each)
            }
            fn write_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
                (**self).write_at(offset, buf)
            }
            fn write_batch(&self, writes: &[(u64, &[u8])]) -> Vec<Result<()>> {
                (**self).write_batch(writes)
            }
            fn write_at_while(&self, offset: u64, buf: &[u8], during: &mut dyn FnMut()) -> Result<()> {
                (**self).write_at_while(offset, buf, during)
            }
            fn write_fua_at(&self, offset: u64, buf: &[u8]) -> Result<()> {
                (**self).write_fua_at(offset, buf)
            }
            fn flush(&self) -> Result<()> {
                (**self).flush()
            }
            fn discard(&self, offset: u64, len: u64) -> Result<()> {
                (**self).discard(offset, len)
            }
            fn describe(&self) -> String {
                (**self).describe()
            }
            fn identity(&self) -> Option<String> {
                (**self).identity()
            }
            fn atomic_write_bytes(&self) -> u32 {
                (**self).atomic_write_bytes()
            }
        }
    };
}
forward_block_device!(Arc<T>);
forward_block_device!(Box<T>);
forward_block_device!(&T);
