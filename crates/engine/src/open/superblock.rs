//! Reading and choosing the superblock (docs/format.md, section 3, "Choosing a copy").

use crate::error::{EngineError, Result};
use tiercache_device::{AlignedBuf, BlockDevice};
use tiercache_format::constants::*;
use tiercache_format::{FormatError, Superblock};

/// Reads and chooses the superblock. Copy A is at byte 0; copy B at the start of block 1,
/// whose size is read from copy A or, if copy A is unreadable, tried for every block size.
pub fn read_superblock(cache: &dyn BlockDevice) -> Result<Superblock> {
    let device = cache.describe();
    let unit = (cache.logical_block_size() as usize).max(SUPERBLOCK_SIZE);
    let mut buf = AlignedBuf::new(unit);
    let a = read_copy(cache, unit, 0, &mut buf)?;
    let b = match &a {
        Ok(sb) => read_copy(cache, unit, u64::from(sb.layout.block_size), &mut buf)?,
        Err(_) => find_copy_b(cache, unit, &mut buf)?,
    };
    match Superblock::choose(a, b) {
        Ok(sb) => {
            if cache.size_bytes() < sb.cache_size_bytes {
                return Err(EngineError::CacheShrunk {
                    device,
                    actual: cache.size_bytes(),
                    formatted: sb.cache_size_bytes,
                });
            }
            Ok(sb)
        }
        Err(FormatError::BadMagic { .. }) | Err(FormatError::TooShort { .. }) => {
            Err(EngineError::NotFormatted { device })
        }
        Err(source) => Err(EngineError::Format { device, source }),
    }
}

/// One copy at `offset`, read in `unit` bytes; the outer `Err` is an I/O error, the inner one
/// says why the copy does not decode (a device too short for it is `TooShort`).
fn read_copy(
    cache: &dyn BlockDevice,
    unit: usize,
    offset: u64,
    buf: &mut AlignedBuf,
) -> Result<Result<Superblock, FormatError>> {
    if offset + unit as u64 > cache.size_bytes() {
        return Ok(Err(FormatError::TooShort { what: "superblock", len: 0, need: SUPERBLOCK_SIZE }));
    }
    cache.read_at(offset, buf).map_err(EngineError::cache)?;
    Ok(Superblock::decode(buf))
}

/// Copy B when copy A gives no block size: the first block size from 4 KiB to 64 KiB at which
/// a copy decodes and names that very block size. Otherwise the last error seen other than
/// "no magic here" and "device too short" (a checksum, version or field error), else `BadMagic`.
fn find_copy_b(cache: &dyn BlockDevice, unit: usize, buf: &mut AlignedBuf) -> Result<Result<Superblock, FormatError>> {
    let mut found = Err(FormatError::BadMagic { what: "superblock", found: 0 });
    let mut size = MIN_BLOCK_SIZE;
    while size <= MAX_BLOCK_SIZE {
        match read_copy(cache, unit, u64::from(size), buf)? {
            Ok(sb) if sb.layout.block_size == size => {
                found = Ok(sb);
                break;
            }
            Ok(_) => {}
            Err(e) => {
                if !matches!(e, FormatError::BadMagic { .. } | FormatError::TooShort { .. }) {
                    found = Err(e);
                }
            }
        }
        size *= 2;
    }
    Ok(found)
}
