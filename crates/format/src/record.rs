//! Log records: one header block followed by the data blocks it describes, written as one
//! sequential I/O. A record is valid iff its header decodes here (magic, version, checksum,
//! counts) AND the engine finds every data block's CRC matching its entry: a torn record is
//! thus detected without any extra commit write.

use crate::constants::*;
use crate::error::FormatError;
use zerocopy::little_endian::{U16, U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// The fixed part of a record header, at the start of the header block.
#[derive(Debug, Clone, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RecordHeaderDisk {
    /// CRC-32C of bytes [4, 64 + 24 * entry_count): the fixed part and the entries. The rest
    /// of the block must be zero (checked on decode, not summed: a FLUSH pays for one record
    /// header, so the checksum covers only what carries meaning).
    pub checksum: U32,
    /// Entries following this fixed part.
    pub entry_count: U16,
    /// Data blocks following the header block (= entries of a data kind).
    pub data_blocks: U16,
    /// `RECORD_MAGIC ^ uuid_low64`.
    pub magic: U64,
    pub version: U32,
    /// Zero (reserved).
    pub flags: U32,
    /// Consecutive per record: replay stops at the first gap.
    pub sequence: U64,
    /// The logical log position of this header block: a stale record of an earlier lap at the
    /// same place carries an older position and is refused.
    pub position: U64,
    /// The log head when this record was written: recovery forgets everything below the
    /// head of the last record it replays.
    pub head_position: U64,
    /// The checksum of the previous record's header (or the checkpoint's
    /// `prev_record_checksum` for the first record after it): a hash chain, so that a stale
    /// record left beyond a torn tail can never be taken for the next one after new records
    /// were written over the tear.
    pub prev_checksum: U32,
    /// The writer's epoch: one more than the highest epoch recovery found, made durable in
    /// the recovery checkpoint before any record is written. Covered by the header checksum,
    /// so a record written after a recovery is never byte-identical to one written before it
    /// at the same position, and a stale record left beyond a discarded one cannot chain onto
    /// its successor (docs/format.md, "the post-recovery chain rule").
    pub epoch: U64,
    /// `sequence` minus the highest record sequence known durable (written, then covered by
    /// a completed cache flush) when this record was sealed; saturates at `u32::MAX`, which
    /// only understates. Evidence for recovery: a record whose data fails its checksums but
    /// which a later record vouches for was durable, so the damage is corruption of
    /// acknowledged data (those blocks are lost, replay goes on), not a torn tail (replay
    /// stops there). See docs/format.md, "torn or corrupt".
    pub durable_back: U32,
}

/// One entry of a record header.
#[derive(Debug, Clone, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct RecordEntryDisk {
    /// The backing device block this entry is about.
    pub backing_block: U64,
    /// `MarkClean`: the log position of the data block that is now clean (so that a newer
    /// version of the same block is not marked clean by mistake). `Lost`: the position of the
    /// copy that failed its checksum. Zero otherwise.
    pub ref_position: U64,
    /// Data kinds: CRC-32C of the data block. `Lost`: the CRC of the lost version. Zero
    /// otherwise.
    pub data_crc: U32,
    /// `EntryKind` as a number.
    pub kind: u8,
    /// Zero.
    pub padding: [u8; 3],
}

const _: () = assert!(std::mem::size_of::<RecordHeaderDisk>() == RECORD_HEADER_SIZE);
const _: () = assert!(std::mem::size_of::<RecordEntryDisk>() == RECORD_ENTRY_SIZE);

/// What an entry says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EntryKind {
    /// A data block follows; it is newer than the backing device's copy.
    DataDirty = 1,
    /// A data block follows; it equals the backing device's copy (a read-miss fill).
    DataClean = 2,
    /// The block at `ref_position` has been written back and flushed on the backing device.
    MarkClean = 3,
    /// The block was discarded: forget any cached copy.
    Trim = 4,
    /// The block's only dirty copy (at `ref_position`) failed its checksum: it reads as an
    /// I/O error until it is written again. Never written after a record holding newer data
    /// of the block (docs/format.md, "lost blocks").
    Lost = 5,
}

impl EntryKind {
    pub fn has_data(self) -> bool {
        matches!(self, EntryKind::DataDirty | EntryKind::DataClean)
    }

    fn from_u8(v: u8) -> Option<EntryKind> {
        Some(match v {
            1 => EntryKind::DataDirty,
            2 => EntryKind::DataClean,
            3 => EntryKind::MarkClean,
            4 => EntryKind::Trim,
            5 => EntryKind::Lost,
            _ => return None,
        })
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecordEntry {
    pub kind: EntryKind,
    pub backing_block: u64,
    pub data_crc: u32,
    pub ref_position: u64,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordHeader {
    pub sequence: u64,
    pub position: u64,
    pub head_position: u64,
    pub prev_checksum: u32,
    pub epoch: u64,
    /// See `RecordHeaderDisk::durable_back`.
    pub durable_back: u32,
    pub entries: Vec<RecordEntry>,
}

impl RecordHeader {
    /// Data blocks that follow the header.
    pub fn data_blocks(&self) -> usize {
        self.entries.iter().filter(|e| e.kind.has_data()).count()
    }

    /// The highest record sequence this record vouches was durable before it was sealed.
    pub fn durable_sequence(&self) -> u64 {
        self.sequence.saturating_sub(u64::from(self.durable_back))
    }

    /// The `durable_back` value for a record of `sequence` when `durable` is the highest
    /// sequence known durable.
    pub fn durable_back_for(sequence: u64, durable: u64) -> u32 {
        u32::try_from(sequence.saturating_sub(durable)).unwrap_or(u32::MAX)
    }

    /// Blocks the whole record occupies in the log.
    pub fn total_blocks(&self) -> u64 {
        1 + self.data_blocks() as u64
    }

    /// Encodes into `block` (one whole cache block); returns the header's checksum (the next
    /// record's `prev_checksum`).
    pub fn encode(&self, uuid_low: u64, block: &mut [u8]) -> u32 {
        assert!(self.entries.len() <= MAX_RECORD_ENTRIES, "{} entries", self.entries.len());
        assert!(block.len() >= MIN_BLOCK_SIZE as usize);
        block.fill(0);
        let fixed = RecordHeaderDisk {
            checksum: U32::new(0),
            entry_count: U16::new(self.entries.len() as u16),
            data_blocks: U16::new(self.data_blocks() as u16),
            magic: U64::new(RECORD_MAGIC ^ uuid_low),
            version: U32::new(FORMAT_VERSION),
            flags: U32::new(0),
            sequence: U64::new(self.sequence),
            position: U64::new(self.position),
            head_position: U64::new(self.head_position),
            prev_checksum: U32::new(self.prev_checksum),
            epoch: U64::new(self.epoch),
            durable_back: U32::new(self.durable_back),
        };
        block[..RECORD_HEADER_SIZE].copy_from_slice(fixed.as_bytes());
        for (i, e) in self.entries.iter().enumerate() {
            let d = RecordEntryDisk {
                backing_block: U64::new(e.backing_block),
                ref_position: U64::new(e.ref_position),
                data_crc: U32::new(e.data_crc),
                kind: e.kind as u8,
                padding: [0; 3],
            };
            let at = RECORD_HEADER_SIZE + i * RECORD_ENTRY_SIZE;
            block[at..at + RECORD_ENTRY_SIZE].copy_from_slice(d.as_bytes());
        }
        let used = RECORD_HEADER_SIZE + self.entries.len() * RECORD_ENTRY_SIZE;
        let crc = crate::checksum(&block[4..used]);
        block[..4].copy_from_slice(&crc.to_le_bytes());
        crc
    }

    /// The checksum stored in an encoded header block.
    pub fn stored_checksum(block: &[u8]) -> u32 {
        u32::from_le_bytes(block[..4].try_into().expect("4 bytes"))
    }

    /// Decodes and validates a header block. Data CRCs are the caller's to check.
    pub fn decode(block: &[u8], uuid_low: u64) -> Result<RecordHeader, FormatError> {
        const WHAT: &str = "log record header";
        if block.len() < MIN_BLOCK_SIZE as usize {
            return Err(FormatError::TooShort { what: WHAT, len: block.len(), need: MIN_BLOCK_SIZE as usize });
        }
        let fixed = RecordHeaderDisk::read_from_bytes(&block[..RECORD_HEADER_SIZE]).expect("size");
        if fixed.magic.get() != RECORD_MAGIC ^ uuid_low {
            return Err(FormatError::BadMagic { what: WHAT, found: fixed.magic.get() });
        }
        let invalid = |field, why: String| FormatError::Invalid { what: WHAT, field, why };
        let count = usize::from(fixed.entry_count.get());
        if count > MAX_RECORD_ENTRIES {
            return Err(invalid("entry_count", format!("{count} > {MAX_RECORD_ENTRIES}")));
        }
        let used = RECORD_HEADER_SIZE + count * RECORD_ENTRY_SIZE;
        let computed = crate::checksum(&block[4..used]);
        if computed != fixed.checksum.get() {
            return Err(FormatError::BadChecksum { what: WHAT, stored: fixed.checksum.get(), computed });
        }
        if fixed.version.get() != FORMAT_VERSION {
            return Err(FormatError::UnsupportedVersion {
                what: WHAT,
                found: fixed.version.get(),
                supported: FORMAT_VERSION,
            });
        }
        if block[used..].iter().any(|&b| b != 0) {
            return Err(invalid("tail", "bytes after the last entry are not zero".into()));
        }
        let mut entries = Vec::with_capacity(count);
        for i in 0..count {
            let at = RECORD_HEADER_SIZE + i * RECORD_ENTRY_SIZE;
            let d = RecordEntryDisk::read_from_bytes(&block[at..at + RECORD_ENTRY_SIZE]).expect("size");
            let kind = EntryKind::from_u8(d.kind).ok_or_else(|| invalid("kind", format!("entry {i}: {}", d.kind)))?;
            if d.padding != [0; 3] {
                return Err(invalid("padding", format!("entry {i}: non-zero")));
            }
            if d.backing_block.get() > MAX_BACKING_BLOCKS {
                return Err(invalid("backing_block", format!("entry {i}: {}", d.backing_block.get())));
            }
            entries.push(RecordEntry {
                kind,
                backing_block: d.backing_block.get(),
                data_crc: d.data_crc.get(),
                ref_position: d.ref_position.get(),
            });
        }
        let header = RecordHeader {
            sequence: fixed.sequence.get(),
            position: fixed.position.get(),
            head_position: fixed.head_position.get(),
            prev_checksum: fixed.prev_checksum.get(),
            epoch: fixed.epoch.get(),
            durable_back: fixed.durable_back.get(),
            entries,
        };
        if fixed.flags.get() != 0 {
            return Err(invalid("reserved", "non-zero reserved bits".into()));
        }
        if header.data_blocks() != usize::from(fixed.data_blocks.get()) {
            return Err(invalid(
                "data_blocks",
                format!("{} but {} data entries", fixed.data_blocks.get(), header.data_blocks()),
            ));
        }
        if header.head_position > header.position {
            return Err(invalid(
                "head_position",
                format!("{} beyond the record's own position {}", header.head_position, header.position),
            ));
        }
        Ok(header)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> RecordHeader {
        RecordHeader {
            sequence: 99,
            position: 12345,
            head_position: 10000,
            prev_checksum: 0x5555,
            epoch: 3,
            durable_back: 2,
            entries: vec![
                RecordEntry { kind: EntryKind::DataDirty, backing_block: 5, data_crc: 0xabc, ref_position: 0 },
                RecordEntry { kind: EntryKind::MarkClean, backing_block: 6, data_crc: 0, ref_position: 12000 },
                RecordEntry { kind: EntryKind::DataClean, backing_block: 7, data_crc: 0xdef, ref_position: 0 },
                RecordEntry { kind: EntryKind::Trim, backing_block: 8, data_crc: 0, ref_position: 0 },
                RecordEntry { kind: EntryKind::Lost, backing_block: 9, data_crc: 0, ref_position: 12001 },
            ],
        }
    }

    #[test]
    fn round_trip_and_counts() {
        let h = sample();
        let mut block = vec![0u8; 4096];
        let crc = h.encode(77, &mut block);
        assert_eq!(RecordHeader::stored_checksum(&block), crc);
        let d = RecordHeader::decode(&block, 77).unwrap();
        assert_eq!(d, h);
        assert_eq!(d.data_blocks(), 2);
        assert_eq!(d.total_blocks(), 3);
    }

    #[test]
    fn another_volume_or_any_flipped_bit_is_refused() {
        let mut block = vec![0u8; 4096];
        sample().encode(77, &mut block);
        assert!(matches!(RecordHeader::decode(&block, 78), Err(FormatError::BadMagic { .. })));
        for bit in (0..4096 * 8).step_by(7) {
            let mut b = block.clone();
            b[bit / 8] ^= 1 << (bit % 8);
            assert!(RecordHeader::decode(&b, 77).is_err(), "bit {bit}");
        }
    }

    #[test]
    fn a_full_header_fits() {
        let mut h = sample();
        h.entries = (0..MAX_RECORD_ENTRIES as u64)
            .map(|i| RecordEntry { kind: EntryKind::DataDirty, backing_block: i, data_crc: i as u32, ref_position: 0 })
            .collect();
        let mut block = vec![0u8; 4096];
        h.encode(1, &mut block);
        assert_eq!(RecordHeader::decode(&block, 1).unwrap().data_blocks(), MAX_RECORD_ENTRIES);
    }
}
