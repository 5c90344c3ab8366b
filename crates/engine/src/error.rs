//! The engine's one error enum, with the errno a block frontend reports for each.

use tiercache_device::DeviceError;
use tiercache_format::FormatError;

pub type Result<T, E = EngineError> = std::result::Result<T, E>;

/// Which device an error happened on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    Cache,
    Backing,
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Role::Cache => "cache device",
            Role::Backing => "backing device",
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    #[error("{role}: {source}")]
    Device { role: Role, source: DeviceError },
    #[error("cache device {device}: {source}")]
    Format { device: String, source: FormatError },
    #[error("cache device {device} is not a tiercache cache (no superblock); format it with `tiercache create`")]
    NotFormatted { device: String },
    #[error("backing device {backing} does not belong to this cache: {reason}")]
    WrongBacking { backing: String, reason: String },
    #[error("cache device {device} is {actual} bytes, smaller than the {formatted} bytes it was formatted with")]
    CacheShrunk { device: String, actual: u64, formatted: u64 },
    #[error("invalid configuration: {0}")]
    Config(String),
    #[error("request at byte {offset} of {len} bytes is not aligned to the volume's {block_size}-byte blocks")]
    Misaligned { offset: u64, len: u64, block_size: u32 },
    #[error("request at byte {offset} of {len} bytes ends beyond the volume's {size_bytes} bytes")]
    OutOfRange { offset: u64, len: u64, size_bytes: u64 },
    #[error("the volume is failed (read-only for clean data) since: {reason}")]
    Poisoned { reason: String },
    #[error("block {block} is lost: its only copy (dirty, on the cache device) failed its checksum")]
    LostBlock { block: u64 },
    #[error("{count} block(s) lost: their only copy (dirty, on the cache device) failed its checksum, and the backing device holds an older version; they read as I/O errors until rewritten. Blocks: {}", fmt_blocks(blocks))]
    LostBlocks { count: u64, blocks: Vec<u64> },
    #[error("cache metadata is corrupt: {0}")]
    Corrupt(Corruption),
    #[error("{count} dirty blocks could not be written back: they kept moving or failing (see the log for errors)")]
    WriteBackStuck { count: u64 },
}

/// What is corrupt in the cache's metadata (`EngineError::Corrupt`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Corruption {
    #[error("no valid checkpoint: area 0: {area0}; area 1: {area1} (if a `tiercache create` of this device was cut short, run it again: it had not finished)")]
    NoValidCheckpoint { area0: String, area1: String },
    #[error("checkpoint names block {block} beyond the backing device")]
    CheckpointBeyondBacking { block: u64 },
    #[error("{count} blocks are lost to checksum failures, more than the {max} this cache can remember: the cache device is failing")]
    TooManyLost { count: u64, max: u64 },
    #[error("record at log position {position} claims position {claimed}")]
    RecordMisplaced { position: u64, claimed: u64 },
    #[error("record header at log position {position}: {reason}")]
    RecordHeader { position: u64, reason: String },
}

impl EngineError {
    /// The errno a block frontend (NBD, FUSE, ublk) reports for this error.
    pub fn errno(&self) -> i32 {
        match self {
            EngineError::Device { source, .. } => source.errno(),
            EngineError::Misaligned { .. } | EngineError::Config(_) => libc_einval(),
            EngineError::OutOfRange { .. } => libc_enospc(),
            _ => libc_eio(),
        }
    }

    pub(crate) fn cache(source: DeviceError) -> EngineError {
        EngineError::Device { role: Role::Cache, source }
    }

    pub(crate) fn backing(source: DeviceError) -> EngineError {
        EngineError::Device { role: Role::Backing, source }
    }
}

/// The first 32 block numbers, comma-separated, with "..." when there are more.
pub(crate) fn fmt_blocks(blocks: &[u64]) -> String {
    let mut s = blocks.iter().take(32).map(u64::to_string).collect::<Vec<_>>().join(", ");
    if blocks.len() > 32 {
        s.push_str(", ...");
    }
    s
}

// The engine does no syscalls, so it takes errno values as constants instead of the libc crate.
const fn libc_eio() -> i32 {
    5
}
const fn libc_einval() -> i32 {
    22
}
const fn libc_enospc() -> i32 {
    28
}
