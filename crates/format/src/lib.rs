//! tiercache's on-disk format: the structures on the cache device, their encoding and their
//! checksums. No I/O happens here (an architecture invariant): the engine reads and writes
//! blocks, this crate turns blocks into validated structures and back.
//!
//! The cache device, in cache blocks (docs/format.md has the byte diagrams):
//!
//! ```text
//! | superblock A | superblock B | checkpoint area 0 | checkpoint area 1 | log ......... |
//! ```
//!
//! Conventions: on-disk structs end in `Disk`, are little-endian with explicit
//! zeroed padding and a compile-time size assertion, and open with checksum, magic, version
//! and sequence. Record and checkpoint magics are XORed with the volume UUID.

#![forbid(unsafe_code)]

pub mod checkpoint;
pub mod constants;
mod error;
pub mod layout;
pub mod record;
pub mod superblock;

pub use checkpoint::{CheckpointEntry, CheckpointHeader};
pub use error::FormatError;
pub use layout::Layout;
pub use record::{EntryKind, RecordEntry, RecordHeader};
pub use superblock::{fingerprint_blocks, Fingerprint, FingerprintHash, Superblock, VolumeMode, FINGERPRINT_BLOCKS};

/// The CRC used everywhere on disk: CRC-32C (Castagnoli), hardware-accelerated on x86 and ARM.
/// (crc-fast, not the crc32c crate: a 1 MiB cache hit checksums every block it read after the
/// read, on data fresh from DMA and so not in the CPU's cache, and crc-fast's folding with
/// carry-less multiplies ran at 10 GB/s there against crc32c's 6.5, 3.3x as fast on one
/// 4 KiB block in cache, and faster at every size down to 16 bytes; the same values.)
pub fn checksum(bytes: &[u8]) -> u32 {
    crc_fast::checksum(crc_fast::CrcAlgorithm::Crc32Iscsi, bytes) as u32
}

/// The low 64 bits of a volume UUID, XORed into record and checkpoint magics.
pub fn uuid_low64(uuid: &[u8; 16]) -> u64 {
    u64::from_le_bytes(uuid[..8].try_into().expect("8 bytes"))
}

/// A volume UUID as 32 lowercase hex digits, as `status` shows it and the default control
/// socket is named after it.
///
/// ```
/// assert_eq!(tiercache_format::uuid_hex(&[0xab; 16]), "ab".repeat(16));
/// ```
pub fn uuid_hex(uuid: &[u8; 16]) -> String {
    uuid.iter().map(|b| format!("{b:02x}")).collect()
}
