//! Every limit and magic number of the on-disk format, in one place, with their relations
//! asserted at compile time.

/// The format version this build writes and reads. Bump on any incompatible change, and
/// record the change in docs/format.md's version history.
pub const FORMAT_VERSION: u32 = 2;

/// Identifies a tiercache superblock ("TIERCACH" as little-endian bytes).
pub const SUPERBLOCK_MAGIC: u64 = u64::from_le_bytes(*b"TIERCACH");
/// Log record headers carry `RECORD_MAGIC ^ uuid_low64`, so a record of another volume (or
/// of an earlier format of the same device) never validates.
pub const RECORD_MAGIC: u64 = u64::from_le_bytes(*b"TCRECORD");
/// Checkpoint headers carry `CHECKPOINT_MAGIC ^ uuid_low64`.
pub const CHECKPOINT_MAGIC: u64 = u64::from_le_bytes(*b"TCCHKPNT");

/// Cache block sizes the format supports.
pub const MIN_BLOCK_SIZE: u32 = 4096;
pub const MAX_BLOCK_SIZE: u32 = 65536;
pub const DEFAULT_BLOCK_SIZE: u32 = 4096;

/// Size of the superblock structure (it lives at the start of its own cache block, inside
/// one 512-byte sector, so a torn superblock write cannot mix two versions).
pub const SUPERBLOCK_SIZE: usize = 512;
/// Size of a log record header's fixed part; entries follow it in the same block.
pub const RECORD_HEADER_SIZE: usize = 64;
/// Size of one log record entry.
pub const RECORD_ENTRY_SIZE: usize = 24;
/// Size of a checkpoint header's fixed part (it fills the area's first block).
pub const CHECKPOINT_HEADER_SIZE: usize = 128;
/// Size of one checkpoint entry.
pub const CHECKPOINT_ENTRY_SIZE: usize = 16;

/// Entries that fit in one record header at the smallest block size; larger blocks still use
/// this limit so that a record's shape does not depend on the block size.
pub const MAX_RECORD_ENTRIES: usize = (MIN_BLOCK_SIZE as usize - RECORD_HEADER_SIZE) / RECORD_ENTRY_SIZE;

/// Backing block numbers are 32-bit in RAM (the index key); `u32::MAX` is the index's empty
/// marker. At 4 KiB blocks that is 16 TiB of backing device; larger blocks reach further.
pub const MAX_BACKING_BLOCKS: u64 = u32::MAX as u64 - 1;
/// The most log blocks a cache uses: the RAM index keeps slots in 29 bits (2 TiB of cache at
/// 4 KiB blocks, 32 TiB at 64 KiB). A larger device is formatted with this many; the rest
/// stays unused. (Checkpoint entries have room for 30 bits.)
pub const MAX_LOG_BLOCKS: u64 = 1 << 29;

/// Default reclaim granularity, in blocks (1 MiB at 4 KiB blocks).
pub const DEFAULT_SEGMENT_BLOCKS: u32 = 256;
/// The log must hold at least this many segments (reclaim needs room to work).
pub const MIN_LOG_SEGMENTS: u64 = 8;

/// The largest share of the log, in per mille, that `Layout::with_probation` gives the
/// probation ring (and `create` accepts).
pub const MAX_PROBATION_PERMILLE: u16 = 500;

/// Superblock copies live in cache blocks 0 and 1.
pub const SUPERBLOCK_COPIES: u64 = 2;

const _: () = assert!(MAX_RECORD_ENTRIES == 168);
const _: () = assert!(SUPERBLOCK_SIZE <= MIN_BLOCK_SIZE as usize && SUPERBLOCK_SIZE <= 512);
const _: () = assert!(RECORD_HEADER_SIZE + MAX_RECORD_ENTRIES * RECORD_ENTRY_SIZE <= MIN_BLOCK_SIZE as usize);
const _: () = assert!(MIN_BLOCK_SIZE.is_power_of_two() && MAX_BLOCK_SIZE.is_power_of_two());
const _: () = assert!(MAX_RECORD_ENTRIES < u16::MAX as usize);
