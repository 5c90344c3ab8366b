//! A plain device with no cache as [`ByteIo`]: the baseline a benchmark compares the hybrid
//! volume with, served by the very same frontend (`tiercache serve --passthrough DEVICE`).
//! A device takes whole logical blocks only, so partial blocks are read, modified and written
//! here, and zeroes are written in bounded chunks.

use crate::{whole_blocks_inside, ByteIo, Errno};
use std::sync::{Arc, Mutex};
use tiercache_device::{AlignedBuf, BlockDevice, DeviceError};

/// Zeroes are written in chunks of at most this many bytes (bounded memory).
const ZERO_CHUNK_BYTES: u64 = 1 << 20;

/// A device served as it is, with no cache.
pub struct Passthrough {
    dev: Arc<dyn BlockDevice>,
    /// Serialises the read-modify-writes of partial blocks among themselves (overlapping
    /// concurrent writes have no defined order on a disk either).
    rmw: Mutex<()>,
}

impl Passthrough {
    pub fn new(dev: Arc<dyn BlockDevice>) -> Passthrough {
        Passthrough { dev, rmw: Mutex::new(()) }
    }

    /// The block-aligned span around a byte range, refused if the range leaves the device
    /// (before any I/O, so a refused request changes nothing).
    fn span(&self, offset: u64, len: u64) -> Result<(u64, u64), DeviceError> {
        let size_bytes = self.dev.size_bytes();
        let end = offset.checked_add(len).filter(|&end| end <= size_bytes);
        let Some(end) = end else { return Err(DeviceError::OutOfRange { offset, len, size_bytes }) };
        let bs = u64::from(self.dev.logical_block_size());
        Ok((offset / bs * bs, end.div_ceil(bs) * bs))
    }
}

impl ByteIo for Passthrough {
    fn size_bytes(&self) -> u64 {
        self.dev.size_bytes()
    }
    fn block_size(&self) -> u32 {
        self.dev.logical_block_size()
    }
    fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), Errno> {
        let (start, end) = self.span(offset, buf.len() as u64)?;
        let mut whole = AlignedBuf::new((end - start).max(1) as usize);
        self.dev.read_at(start, &mut whole[..(end - start) as usize])?;
        let at = (offset - start) as usize;
        buf.copy_from_slice(&whole[at..at + buf.len()]);
        Ok(())
    }
    fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), Errno> {
        let (start, end) = self.span(offset, data.len() as u64)?;
        if start == offset && end == offset + data.len() as u64 {
            self.dev.write_at(offset, data)?;
        } else {
            let _rmw = self.rmw.lock().expect("rmw lock");
            let mut whole = vec![0u8; (end - start) as usize];
            self.read(start, &mut whole)?;
            let at = (offset - start) as usize;
            whole[at..at + data.len()].copy_from_slice(data);
            self.dev.write_at(start, &whole)?;
        }
        if fua {
            self.dev.flush()?;
        }
        Ok(())
    }
    fn flush(&self) -> Result<(), Errno> {
        Ok(self.dev.flush()?)
    }
    fn trim(&self, offset: u64, len: u64) -> Result<(), Errno> {
        self.span(offset, len)?;
        if let Some((start, len)) = whole_blocks_inside(offset, len, self.dev.logical_block_size()) {
            self.dev.discard(start, len)?;
        }
        Ok(())
    }
    fn write_zeroes(&self, offset: u64, len: u64, fua: bool) -> Result<(), Errno> {
        self.span(offset, len)?;
        if len > 0 {
            let zeroes = AlignedBuf::new(ZERO_CHUNK_BYTES.min(len) as usize);
            let mut done = 0;
            while done < len {
                let n = ZERO_CHUNK_BYTES.min(len - done);
                self.write(offset + done, &zeroes[..n as usize], false)?;
                done += n;
            }
        }
        if fua {
            self.dev.flush()?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, SeekFrom, Write};
    use tiercache_device::{FileDevice, OpenOptions};

    const SIZE: usize = 4 << 20;

    /// A temporary file of SIZE bytes, every byte its offset mod 251, behind a passthrough.
    fn file() -> (tempfile::NamedTempFile, Passthrough, Vec<u8>) {
        let mut f = tempfile::NamedTempFile::new().unwrap();
        let content: Vec<u8> = (0..SIZE).map(|i| (i % 251) as u8).collect();
        f.write_all(&content).unwrap();
        f.flush().unwrap();
        // Buffered: the temporary directory may be tmpfs, which has no O_DIRECT.
        let dev =
            FileDevice::open_with(f.path(), OpenOptions { direct: false, lock: false, read_only: false }).unwrap();
        (f, Passthrough::new(Arc::new(dev)), content)
    }

    /// What the file holds, read around the passthrough.
    fn on_disk(f: &mut tempfile::NamedTempFile) -> Vec<u8> {
        let mut v = Vec::new();
        f.as_file_mut().seek(SeekFrom::Start(0)).unwrap();
        f.as_file_mut().read_to_end(&mut v).unwrap();
        v
    }

    #[test]
    fn unaligned_writes_change_only_their_bytes() {
        let (mut f, p, mut model) = file();
        let bs = p.block_size() as usize;
        assert_eq!(p.size_bytes(), SIZE as u64);
        // Inside one block, across a block boundary, whole blocks plus both edges, one byte
        // at the very end, an aligned one, and one with FUA.
        let writes: [(usize, usize, bool); 6] = [
            (bs + 100, 50, false),
            (3 * bs - 7, 14, false),
            (5 * bs + 1, 3 * bs, false),
            (SIZE - 1, 1, false),
            (10 * bs, 2 * bs, false),
            (20 * bs + 3, 5, true),
        ];
        for (i, (offset, len, fua)) in writes.into_iter().enumerate() {
            let data: Vec<u8> = (0..len).map(|j| 0x80 ^ (i * 37 + j) as u8).collect();
            p.write(offset as u64, &data, fua).unwrap();
            model[offset..offset + len].copy_from_slice(&data);
        }
        assert_eq!(on_disk(&mut f), model);
        for (offset, len) in [(0, SIZE), (bs + 90, 70), (3 * bs - 10, 20), (SIZE - 3, 3), (17, 0)] {
            let mut buf = vec![0u8; len];
            p.read(offset as u64, &mut buf).unwrap();
            assert_eq!(buf, model[offset..offset + len], "read at {offset} of {len}");
        }
    }

    #[test]
    fn write_zeroes_zeroes_exactly_its_range() {
        let (mut f, p, mut model) = file();
        let bs = p.block_size() as usize;
        // Unaligned edges, several 1 MiB chunks, a partial block alone, and FUA.
        for (offset, len, fua) in [(bs / 2, 2 * ZERO_CHUNK_BYTES as usize + 3 * bs, false), (SIZE - bs + 1, 9, true)] {
            p.write_zeroes(offset as u64, len as u64, fua).unwrap();
            model[offset..offset + len].fill(0);
        }
        p.write_zeroes(123, 0, false).unwrap();
        assert_eq!(on_disk(&mut f), model);
        assert_ne!(model[bs / 2 - 1], 0);
    }

    #[test]
    fn requests_outside_the_device_are_refused_before_any_io() {
        let (mut f, p, model) = file();
        let size = p.size_bytes();
        for r in [
            p.write(size - 2, &[0; 4], false),
            p.write(u64::MAX, &[0; 4], true),
            p.write_zeroes(size - 4096, 8192, false),
            p.write_zeroes(1, u64::MAX, false),
            p.trim(size - 4096, 8192),
            p.read(size, &mut [0; 1]),
        ] {
            assert_eq!(r, Err(Errno::new(libc::ENOSPC)));
        }
        assert_eq!(on_disk(&mut f), model);
    }

    #[test]
    fn trim_discards_only_the_whole_blocks_inside() {
        let (mut f, p, mut model) = file();
        let bs = p.block_size() as usize;
        p.trim(bs as u64 + 1, 3 * bs as u64).unwrap();
        p.flush().unwrap();
        // Blocks 2 and 3 read as before or, where the file system punched a hole, as
        // zeroes; the partial edge blocks 1 and 4 and everything else are untouched.
        let after = on_disk(&mut f);
        let inner = 2 * bs..4 * bs;
        assert!(after[inner.clone()] == model[inner.clone()] || after[inner.clone()].iter().all(|&b| b == 0));
        model[inner.clone()].copy_from_slice(&after[inner]);
        assert_eq!(after, model);
    }
}
