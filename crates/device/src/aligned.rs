//! Heap buffers aligned for O_DIRECT. Data-path buffers are allocated once at start-up and
//! reused, so this type has no growth operations.

use std::alloc::{alloc_zeroed, dealloc, Layout};
use std::ops::{Deref, DerefMut};
use std::ptr::NonNull;

/// The alignment of every [`AlignedBuf`]: the page size, which satisfies O_DIRECT on every
/// Linux file system and block device (their requirement is 512 or 4096 bytes).
pub const BUFFER_ALIGNMENT: usize = 4096;

/// A zero-initialised byte buffer whose start is aligned to [`BUFFER_ALIGNMENT`].
pub struct AlignedBuf {
    ptr: NonNull<u8>,
    len: usize,
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
        AlignedBuf { ptr, len }
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
        // SAFETY: ptr was allocated in `new` with exactly this layout and is freed only here.
        unsafe { dealloc(self.ptr.as_ptr(), Self::layout(self.len)) }
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
}
