//! The backing device at attach: its fingerprints, the identity check (docs/format.md,
//! section 3, "Backing identity"), and the stand-in used when only the cache is inspected.

use crate::error::{EngineError, Result};
use crate::volume::Recovered;
use tiercache_device::{AlignedBuf, BlockDevice};
use tiercache_format::{fingerprint_blocks, FingerprintHash, Superblock, FINGERPRINT_BLOCKS};

/// The fingerprints of the backing device's fingerprint blocks (`Superblock::fingerprint_blocks`),
/// hashed by `hash`.
pub(super) fn backing_fingerprints(
    backing: &dyn BlockDevice,
    block_size: u32,
    hash: FingerprintHash,
) -> Result<[u32; FINGERPRINT_BLOCKS]> {
    let bs = u64::from(block_size);
    let mut block = AlignedBuf::new(block_size as usize);
    let mut crcs = [0u32; FINGERPRINT_BLOCKS];
    for (crc, b) in crcs.iter_mut().zip(fingerprint_blocks(backing.size_bytes() / bs * bs, block_size)) {
        backing.read_at(b * bs, &mut block).map_err(EngineError::backing)?;
        *crc = hash.of(&block);
    }
    Ok(crcs)
}

/// Checks that `backing` is the device this cache was formatted for: its size, the stable
/// identity the kernel reports (where both sides have one), and the fingerprints of its
/// fingerprint blocks (kept current by write-back). A mismatch names what differs.
pub(super) fn check_backing(sb: &Superblock, recovered: &Recovered, backing: &dyn BlockDevice) -> Result<()> {
    let index = &recovered.index;
    let formatted_for = if sb.backing_path.is_empty() { "unrecorded".to_string() } else { sb.backing_path.clone() };
    let wrong = |reason: String| EngineError::WrongBacking {
        backing: backing.describe(),
        reason: format!("{reason} (backing path at format time: {formatted_for})"),
    };
    if backing.size_bytes() != sb.backing_size_bytes {
        return Err(wrong(format!(
            "its size is {} bytes, the cache was formatted for {} bytes",
            backing.size_bytes(),
            sb.backing_size_bytes
        )));
    }
    if let Some(id) = backing.identity() {
        // Compared as stored: the superblock keeps the first 63 bytes of a long identity.
        let id = tiercache_format::superblock::fit_backing_id(&id);
        if !sb.backing_id.is_empty() && id != sb.backing_id {
            return Err(wrong(format!("its device identity is {id}, the cache was formatted for {}", sb.backing_id)));
        }
    }
    let crcs = backing_fingerprints(backing, sb.layout.block_size, sb.fingerprint_hash)?;
    for ((f, crc), block) in sb.backing_fingerprints.iter().zip(crcs).zip(sb.fingerprint_blocks()) {
        // A crash while a fingerprint block was being written back can leave it torn
        // (matching neither CRC); the cache then still holds it dirty and rewrites it.
        // (Also when that dirty copy was lost since: the backing block stays torn until the
        // block is rewritten, and refusing the device would lock the volume out.)
        let in_flight = f.next.is_some()
            && (index.get(block).is_some_and(|e| e.dirty) || recovered.lost.iter().any(|&(b, _, _)| b == block));
        if crc != f.crc && Some(crc) != f.next && !in_flight {
            return Err(wrong(format!(
                "its block {block} (bytes {}..{}) has fingerprint {crc:#010x} ({}), the cache expects {:#010x}",
                block * u64::from(sb.layout.block_size),
                (block + 1) * u64::from(sb.layout.block_size),
                sb.fingerprint_hash.name(),
                f.crc
            )));
        }
    }
    Ok(())
}

/// Stands in for the backing device when only the cache device is inspected; any I/O is an error.
pub(super) struct NoBacking {
    pub size_bytes: u64,
    pub block_size: u32,
}

impl BlockDevice for NoBacking {
    fn size_bytes(&self) -> u64 {
        self.size_bytes
    }
    fn logical_block_size(&self) -> u32 {
        self.block_size
    }
    fn read_at(&self, _: u64, _: &mut [u8]) -> tiercache_device::Result<()> {
        Err(self.unavailable())
    }
    fn write_at(&self, _: u64, _: &[u8]) -> tiercache_device::Result<()> {
        Err(self.unavailable())
    }
    fn flush(&self) -> tiercache_device::Result<()> {
        Err(self.unavailable())
    }
    fn discard(&self, _: u64, _: u64) -> tiercache_device::Result<()> {
        Err(self.unavailable())
    }
    fn describe(&self) -> String {
        "(backing device not given)".into()
    }
}

impl NoBacking {
    fn unavailable(&self) -> tiercache_device::DeviceError {
        tiercache_device::DeviceError::Injected { device: self.describe(), op: "access" }
    }
}
