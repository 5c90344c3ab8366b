//! Heap buffers aligned for O_DIRECT. Data-path buffers are allocated once at start-up and
//! reused, so this type has no growth operations.
//!
//! Long-lived buffers of large I/Os (record buffers, frontends' request buffers) are mapped in
//! transparent huge pages where the kernel allows (`AlignedBuf::new_huge`): an O_DIRECT I/O
//! from 4 KiB pages is one segment per page (169 for a full record), from a huge page one
//! per 2 MiB. On this project's virtual machine (virtio disk) that moved a lone writer's
//! records from 1,324-1,438 MiB/s to 1,426-1,829 (`bench seq`, 256 KiB and 1 MiB writes into
//! an empty cache, alternating builds) and nbdcopy's scan of uncached data through NBD from
//! 0.82-0.95 of nbdkit's file plugin to 1.0-1.3; fio on the same file, 256 KiB O_DIRECT reads
//! at QD16: 824-1,042 MiB/s from ordinary pages, 1,088-1,124 from huge ones.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// The alignment of every [`AlignedBuf`]: the page size, which satisfies O_DIRECT on every
/// Linux file system and block device (their requirement is 512 or 4096 bytes).
pub const BUFFER_ALIGNMENT: usize = 4096;

/// A transparent huge page (x86-64 and arm64 with 4 KiB base pages).
pub const HUGE_PAGE: usize = 2 << 20;

/// A zero-initialised byte buffer whose start is aligned to [`BUFFER_ALIGNMENT`].
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
    /// Bytes mapped with `mmap` (`new_huge`), 0 for a heap allocation.
    mapped: usize,
}

// SAFETY: AlignedBuf owns its allocation exclusively, like a Vec<u8>; no interior mutability.
unsafe impl Send for AlignedBuf {}
// SAFETY: shared references only give out &[u8], like Vec<u8>.
unsafe impl Sync for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes (`len` > 0).
    pub fn new(len: usize) -> Self {
        assert!(len > 0, "AlignedBuf of zero length");
        let layout = Self::layout(len);
        // SAFETY: layout has non-zero size (asserted above) and a valid power-of-two alignment.
        let raw = unsafe { alloc_zeroed(layout) };
        let ptr = NonNull::new(raw).unwrap_or_else(|| std::alloc::handle_alloc_error(layout));
        AlignedBuf { ptr, len, mapped: 0 }
    }

    /// A zeroed buffer of `len` bytes (`len` > 0), mapped on its own in whole huge pages
    /// (`HUGE_PAGE`-aligned, its size rounded up to them) that the kernel is asked to back
    /// with transparent huge pages (`MADV_HUGEPAGE`; with THP off, ordinary pages). For
    /// long-lived buffers of large O_DIRECT I/Os (the module's header says why): a buffer of
    /// 676 KiB takes 2 MiB of RAM once touched.
    pub fn new_huge(len: usize) -> Self {
        assert!(len > 0, "AlignedBuf of zero length");
        let mapped = len.checked_next_multiple_of(HUGE_PAGE).expect("AlignedBuf length overflows");
        // Mapped with a huge page of slack, then trimmed to the aligned stretch: mmap only
        // promises the base page's alignment.
        let slack = mapped.checked_add(HUGE_PAGE).expect("AlignedBuf length overflows");
        // SAFETY: a new private anonymous mapping; no existing memory is affected.
        let raw = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                slack,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if raw == libc::MAP_FAILED {
            std::alloc::handle_alloc_error(Layout::from_size_align(mapped, HUGE_PAGE).expect("layout"));
        }
        let start = (raw as usize).next_multiple_of(HUGE_PAGE);
        let (head, tail) = (start - raw as usize, raw as usize + slack - (start + mapped));
        // SAFETY: both ranges lie inside the mapping just made and outside [start, start + mapped).
        unsafe {
            if head > 0 {
                libc::munmap(raw, head);
            }
            if tail > 0 {
                libc::munmap((start + mapped) as *mut libc::c_void, tail);
            }
            // Advice only: an error (THP compiled out) leaves ordinary pages. Anonymous memory
            // is zero until written, so nothing is touched here.
            libc::madvise(start as *mut libc::c_void, mapped, libc::MADV_HUGEPAGE);
        }
        let ptr = NonNull::new(start as *mut u8).expect("mmap returned a null mapping");
        AlignedBuf { ptr, len, mapped }
    }

    /// A buffer holding a copy of `data`.
    pub fn from_slice(data: &[u8]) -> Self {
        let mut buf = Self::new(data.len());
        buf.copy_from_slice(data);
        buf
    }

    fn layout(len: usize) -> Layout {
        Layout::from_size_align(len, BUFFER_ALIGNMENT).expect("AlignedBuf layout")
    }

    /// Whether `ptr` is aligned enough for O_DIRECT without a bounce buffer.
    pub fn is_aligned(ptr: *const u8) -> bool {
        (ptr as usize).is_multiple_of(BUFFER_ALIGNMENT)
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        if self.mapped > 0 {
            // SAFETY: ptr..ptr + mapped is the mapping `new_huge` kept, unmapped only here.
            unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.mapped) };
        } else {
            // SAFETY: ptr was allocated in `new` with exactly this layout and is freed only here.
            unsafe { dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
        }
    }
}

impl Deref for AlignedBuf {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: ptr points to len initialised (zeroed at allocation) bytes owned by self.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl DerefMut for AlignedBuf {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in deref; &mut self guarantees exclusive access.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Clone for AlignedBuf {
    fn clone(&self) -> Self {
        Self::from_slice(self)
    }
}

impl std::fmt::Debug for AlignedBuf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AlignedBuf({} bytes)", self.len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aligned_and_zeroed() {
        for len in [512, 4096, 4096 * 3 + 512] {
            let buf = AlignedBuf::new(len);
            assert!(AlignedBuf::is_aligned(buf.as_ptr()));
            assert_eq!(buf.len(), len);
            assert!(buf.iter().all(|&b| b == 0));
        }
    }

    #[test]
    fn huge_buffers_are_aligned_zeroed_and_sized_as_asked() {
        for len in [1, 4096, 676 << 10, HUGE_PAGE, HUGE_PAGE + 4096] {
            let mut buf = AlignedBuf::new_huge(len);
            assert_eq!(buf.as_ptr() as usize % HUGE_PAGE, 0, "{len}");
            assert_eq!(buf.len(), len);
            assert!(buf.iter().all(|&b| b == 0));
            buf.fill(0xA5); // every byte writable
            assert!(buf.clone().iter().all(|&b| b == 0xA5));
        }
    }

    /// Where the kernel offers THP on request, a touched huge buffer is backed by huge pages
    /// (what the O_DIRECT segment count depends on).
    #[test]
    fn huge_buffers_get_huge_pages_where_thp_is_on_request() {
        let thp = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/enabled").unwrap_or_default();
        if !(thp.contains("[madvise]") || thp.contains("[always]")) {
            eprintln!("THP off here ({}): nothing to check", thp.trim());
            return;
        }
        let mut buf = AlignedBuf::new_huge(2 * HUGE_PAGE);
        buf.fill(1);
        let start = buf.as_ptr() as usize;
        let smaps = std::fs::read_to_string("/proc/self/smaps").expect("smaps");
        // The mapping's block of smaps: its header line starts with its address range.
        let header = format!("{start:x}-");
        let block: String = smaps
            .lines()
            .skip_while(|l| !l.starts_with(&header))
            .take_while(|l| l.starts_with(&header) || !l.contains('-') || l.contains(':'))
            .take(40)
            .collect::<Vec<_>>()
            .join("\n");
        let huge_kb: u64 = block
            .lines()
            .find_map(|l| l.strip_prefix("AnonHugePages:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0);
        // (MADV_HUGEPAGE regions are compacted for on the fault by default, `defrag`'s
        // "madvise": on a machine with free memory the fault gets its huge pages.)
        assert!(huge_kb >= 2048, "no huge page backs the buffer ({huge_kb} kB): {block}");
    }
}
