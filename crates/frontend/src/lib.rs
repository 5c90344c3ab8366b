//! What every tiercache frontend (NBD, FUSE, and ublk when it comes) serves, defined once.
//!
//! A frontend speaks a protocol; what it serves is a range of bytes. Before this crate the NBD
//! server and the FUSE file each defined their own trait over `Volume`, mapped engine errors
//! to errno values each in its own way, and only FUSE had a passthrough device (with its own
//! zeroing and read-modify-write). Here there is one of each:
//!
//! - [`ByteIo`]: byte-range I/O at any alignment (read, write with FUA, flush, trim, write
//!   zeroes with FUA), implemented for [`Volume`](tiercache_engine::Volume) and for
//!   [`Passthrough`];
//! - [`Errno`]: the errno a failed request is answered with, made from an
//!   [`EngineError`](tiercache_engine::EngineError) or a
//!   [`DeviceError`](tiercache_device::DeviceError) in one place (NBD narrows it further to
//!   the values its protocol defines);
//! - [`Passthrough`]: a plain device with no cache behind the same trait, so that every
//!   frontend can serve the raw fast device as the baseline a benchmark compares the hybrid
//!   volume with, through the very same stack.
//!
//! Frontends validate requests (bounds, sizes) before calling [`ByteIo`]; the implementations
//! check them again, so neither relies on the other for safety.

#![forbid(unsafe_code)]

mod errno;
mod passthrough;
mod volume;

pub use errno::Errno;
pub use passthrough::Passthrough;

use tiercache_device::{AlignedBuf, HUGE_PAGE};

/// A range of bytes a frontend serves: the hybrid volume, or a plain device. Every method
/// takes `&self` and may be called from several threads at once; errors are the errno to
/// reply with.
pub trait ByteIo: Send + Sync + 'static {
    /// Size in bytes; fixed while served.
    fn size_bytes(&self) -> u64;
    /// The preferred request unit in bytes: requests aligned to it need no read-modify-write.
    fn block_size(&self) -> u32;
    /// Reads `buf.len()` bytes at `offset` (any alignment). On success every byte of `buf` is
    /// written (frontends reuse read buffers without zeroing them: `read_buffer`).
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), Errno>;
    /// Writes `data` at `offset` (any alignment: partial blocks are read, modified and written
    /// whole). With `fua` the write is durable on return: a write, then a flush.
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), Errno>;
    /// Makes every write completed before this call durable.
    fn flush(&self) -> Result<(), Errno>;
    /// A hint that a byte range holds nothing useful: only the whole blocks inside it are
    /// discarded, and they read afterwards as their old data or as zeroes.
    fn trim(&self, offset: u64, len: u64) -> Result<(), Errno>;
    /// Writes zeroes over `len` bytes at `offset` (any alignment; they read as zeroes
    /// afterwards, which a trim does not promise). With `fua`, durable on return.
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), Errno>;
    /// Called after a write was acknowledged to a client expected to FLUSH next
    /// ([`CommitPattern`]): starts making that write durable meanwhile, where that costs
    /// nothing the FLUSH would not pay anyway (the volume writes its staged record:
    /// `Volume::write_ahead`). Durability still comes from the FLUSH alone. A failure is
    /// reported by the requests after it (a failed record write poisons the volume).
    fn write_ahead(&self) {}
}

/// A request's kind, as [`CommitPattern`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestKind {
    /// A write without FUA (a write with FUA is a commit of its own: `Other`).
    Write,
    Flush,
    Other,
}

/// Whether a client commits one write at a time, "write, FLUSH, write, FLUSH" (a database's
/// commit at queue depth 1), judged from its last requests on one connection: then each of
/// its writes is followed by `ByteIo::write_ahead` once acknowledged. Two such commits in a
/// row start it; a write with no FLUSH since the write before it stops it (two writes in a
/// row, or with reads or trims between them), so a stream of writes with no FLUSH between
/// them (a copy, a bulk load) pays a record for one write at most. Shared by the threads
/// that serve one client (its own lock: a few nanoseconds a request).
#[derive(Debug, Default)]
pub struct CommitPattern(std::sync::Mutex<Commits>);

#[derive(Debug, Default)]
struct Commits {
    last_was_write: bool,
    /// A write came with no FLUSH after it yet.
    unflushed_write: bool,
    commits_in_a_row: u8,
}

impl CommitPattern {
    /// Commits in a row that make the next write go ahead.
    const COMMITS: u8 = 2;

    /// Notes a request in the order the client sent it; returns whether to write it ahead
    /// once acknowledged.
    pub fn note(&self, kind: RequestKind) -> bool {
        let mut p = self.0.lock().expect("commit pattern");
        let ahead = match kind {
            RequestKind::Write => {
                if p.unflushed_write {
                    p.commits_in_a_row = 0;
                }
                p.unflushed_write = true;
                p.commits_in_a_row >= Self::COMMITS
            }
            RequestKind::Flush => {
                if p.last_was_write {
                    p.commits_in_a_row = (p.commits_in_a_row + 1).min(Self::COMMITS);
                }
                p.unflushed_write = false;
                false
            }
            RequestKind::Other => false,
        };
        p.last_was_write = kind == RequestKind::Write;
        ahead
    }
}

/// A buffer for a READ reply of `len` bytes: page-aligned, as the devices read with O_DIRECT (a
/// misaligned buffer cost them a bounce buffer and a copy of the whole reply: 17 % of the NBD
/// server's CPU time in a profile of 256 KiB cached reads), and in huge pages
/// (`AlignedBuf::new_huge`: one I/O segment per 2 MiB, not per 4 KiB page).
///
/// From `REUSED_READ_MIN_BYTES` to `HUGE_PAGE` bytes, each thread reuses one buffer from read
/// to read (mapping and zeroing a huge page per request would cost more than it saves), so its
/// contents are **not zeroed**: a previous read's bytes are there until overwritten. Hand it
/// only to a read that fills what it returns (`ByteIo::read` fills all of `buf` on success). A
/// thread that has served such a read keeps that buffer (2 MiB of RAM) while it lives; larger
/// reads get a huge buffer of their own, smaller ones an ordinary one (a few pages: one I/O
/// segment or a handful anyway).
pub fn read_buffer(len: usize) -> ReadBuffer {
    let buf = if len < REUSED_READ_MIN_BYTES {
        AlignedBuf::new(len.max(1))
    } else if len <= HUGE_PAGE {
        THREAD_READ_BUFFER.with(|b| b.take()).unwrap_or_else(|| AlignedBuf::new_huge(HUGE_PAGE))
    } else {
        AlignedBuf::new_huge(len)
    };
    ReadBuffer { buf: Some(buf), len }
}

/// Reads smaller than this get an ordinary buffer of their own (`read_buffer`): a connection
/// that only ever reads a few blocks at a time (a database's page reads) holds no huge page.
/// (Without it, eight idle NBD connections held 64 MiB after 4 KiB reads: a 4 KiB read into
/// the reused buffer faults in its whole huge page, in each of a connection's four threads;
/// `crates/nbd/tests/adversarial_read_buffer_ram.rs`.)
pub const REUSED_READ_MIN_BYTES: usize = 64 << 10;

thread_local! {
    /// The calling thread's reused read buffer (`read_buffer`), while no read holds it.
    static THREAD_READ_BUFFER: std::cell::Cell<Option<AlignedBuf>> = const { std::cell::Cell::new(None) };
}

/// A read's payload buffer (`read_buffer`): derefs to its `len` bytes.
pub struct ReadBuffer {
    buf: Option<AlignedBuf>,
    len: usize,
}

impl std::ops::Deref for ReadBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.buf.as_ref().expect("held until dropped")[..self.len]
    }
}

impl std::ops::DerefMut for ReadBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.buf.as_mut().expect("held until dropped")[..self.len]
    }
}

impl Drop for ReadBuffer {
    fn drop(&mut self) {
        // (Given back to whichever thread drops it; a thread that holds one already drops it.)
        if let Some(buf) = self.buf.take().filter(|b| b.len() == HUGE_PAGE) {
            let _ = THREAD_READ_BUFFER.try_with(|b| {
                let kept = b.take().unwrap_or(buf);
                b.set(Some(kept));
            });
        }
    }
}

/// The whole blocks of `block_size` bytes inside a byte range, as (offset, length), if any:
/// what a trim may discard.
fn whole_blocks_inside(offset: u64, len: u64, block_size: u32) -> Option<(u64, u64)> {
    let bs = u64::from(block_size);
    let start = offset.div_ceil(bs) * bs;
    let end = offset.saturating_add(len) / bs * bs;
    (end > start).then(|| (start, end - start))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_read_buffer_is_page_aligned_and_of_the_length_asked() {
        for len in [1, 4095, 4096, 65536, 256 << 10, (1 << 20) + 512, (2 << 20) + 4096] {
            let buf = super::read_buffer(len);
            assert_eq!(buf.len(), len);
            assert_eq!(buf.as_ptr() as usize % 4096, 0, "{len}");
        }
    }

    #[test]
    fn a_thread_reuses_its_read_buffer_and_only_up_to_a_huge_page() {
        let first = super::read_buffer(super::REUSED_READ_MIN_BYTES);
        let at = first.as_ptr();
        drop(first);
        let again = super::read_buffer(256 << 10);
        assert_eq!(again.as_ptr(), at, "the thread's buffer is reused");
        // A small read gets an ordinary buffer of its own, even while the thread's is free.
        drop(again);
        let small = super::read_buffer(4096);
        assert_ne!(small.as_ptr(), at);
        drop(small);
        let again = super::read_buffer(1 << 20);
        assert_eq!(again.as_ptr(), at);
        // While it is held, another read gets another buffer.
        let other = super::read_buffer(1 << 20);
        assert_ne!(other.as_ptr(), at);
        drop((again, other));
        // A read larger than a huge page gets a buffer of its own, never kept.
        let large = super::read_buffer((2 << 20) + 4096);
        let large_at = large.as_ptr();
        drop(large);
        let next = super::read_buffer(64 << 10);
        assert_ne!(next.as_ptr(), large_at);
        assert_eq!(next.as_ptr(), at, "the kept buffer is still the thread's");
    }

    #[test]
    fn a_client_committing_one_write_at_a_time_has_its_writes_written_ahead() {
        use super::{CommitPattern, RequestKind::*};
        let p = CommitPattern::default();
        // Two commits start it: the third write goes ahead, and every one after it.
        let seen: Vec<bool> = [Write, Flush, Write, Flush, Write, Flush, Write].iter().map(|&k| p.note(k)).collect();
        assert_eq!(seen, [false, false, false, false, true, false, true]);
        // Two writes in a row stop it, until two commits again.
        assert!(!p.note(Write));
        for (k, ahead) in [(Flush, false), (Write, false), (Flush, false), (Write, true)] {
            assert_eq!(p.note(k), ahead, "{k:?}");
        }
    }

    #[test]
    fn writes_with_no_flush_between_them_never_go_ahead() {
        use super::{CommitPattern, RequestKind::*};
        let p = CommitPattern::default();
        // A bulk load with a FLUSH now and then, reads and FUA writes (Other) in between.
        let kinds = [Write, Write, Write, Flush, Write, Write, Other, Flush, Write, Other, Flush, Write, Write, Flush];
        assert!(kinds.iter().all(|&k| !p.note(k)));
        // A FLUSH after something other than a write is no commit of a write.
        let p = CommitPattern::default();
        let kinds = [Write, Other, Flush, Write, Other, Flush, Write];
        assert!(kinds.iter().all(|&k| !p.note(k)));
        // Once started, writes with reads between them and no FLUSH: the first goes ahead (it
        // could be a commit's), the next ones do not.
        let p = CommitPattern::default();
        for k in [Write, Flush, Write, Flush] {
            p.note(k);
        }
        let seen: Vec<bool> = [Write, Other, Write, Other, Write].iter().map(|&k| p.note(k)).collect();
        assert_eq!(seen, [true, false, false, false, false]);
    }

    #[test]
    fn a_trim_covers_only_whole_blocks() {
        use super::whole_blocks_inside as inside;
        assert_eq!(inside(0, 8192, 4096), Some((0, 8192)));
        assert_eq!(inside(1, 8192, 4096), Some((4096, 4096)));
        assert_eq!(inside(1, 8190, 4096), None);
        assert_eq!(inside(4096, 4095, 4096), None);
        assert_eq!(inside(100, 0, 4096), None);
        assert_eq!(inside(4095, 4097, 4096), Some((4096, 4096)));
    }
}
