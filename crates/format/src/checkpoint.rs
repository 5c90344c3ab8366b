//! Checkpoints: the whole index written out, so that recovery reads it plus the log tail
//! instead of the whole log. Two areas used in turn; the valid one with the higher sequence
//! wins. A checkpoint is valid iff its header decodes here and the CRC of its entry bytes
//! matches `entries_crc` (so a torn checkpoint is refused and the other area used).

use crate::constants::*;
use crate::error::FormatError;
use zerocopy::little_endian::{U32, U64};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// The fixed part of a checkpoint header (first block of the area; the rest of it is zero).
#[derive(Debug, Clone, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct CheckpointHeaderDisk {
    /// CRC-32C of the header block's bytes [4, block_size).
    pub checksum: U32,
    /// CRC-32C of the entry bytes (entry_count * 16 bytes from the area's second block).
    pub entries_crc: U32,
    /// `CHECKPOINT_MAGIC ^ uuid_low64`.
    pub magic: U64,
    pub version: U32,
    /// Zero (reserved).
    pub flags: U32,
    /// Increases by one per checkpoint written.
    pub sequence: U64,
    /// Replay starts at this log position: every record before it is reflected in the entries.
    pub log_position: U64,
    /// The sequence number the record at `log_position` must carry.
    pub next_record_sequence: U64,
    /// The log head when the checkpoint was taken.
    pub head_position: U64,
    pub entry_count: U64,
    /// The checksum of the header of the last record before `log_position` (0 if none): the
    /// first replayed record must carry it as its `prev_checksum`.
    pub prev_record_checksum: U32,
    /// Zero; keeps `epoch` 8-byte aligned.
    pub padding: U32,
    /// The epoch of the records written after this checkpoint (see `RecordHeaderDisk::epoch`):
    /// recovery writes a checkpoint with a new epoch before the volume serves anything.
    pub epoch: U64,
    /// Zero.
    pub reserved: [u8; 48],
}

/// One index entry as checkpointed.
#[derive(Debug, Clone, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned)]
#[repr(C)]
pub struct CheckpointEntryDisk {
    pub backing_block: U64,
    /// Bits 0-29: the log slot holding the block's data; bit 31: dirty; bit 30: lost (a
    /// tombstone: the block's only dirty copy failed its checksum; the slot is zero and the
    /// CRC is the lost version's, so a backing device holding it ends the loss).
    pub slot_and_flags: U32,
    /// CRC-32C of the data block (a reference to a block carries its checksum).
    pub data_crc: U32,
}

const _: () = assert!(std::mem::size_of::<CheckpointHeaderDisk>() == CHECKPOINT_HEADER_SIZE);
const _: () = assert!(std::mem::size_of::<CheckpointEntryDisk>() == CHECKPOINT_ENTRY_SIZE);

const DIRTY_BIT: u32 = 1 << 31;
const LOST_BIT: u32 = 1 << 30;
const SLOT_BITS: u32 = LOST_BIT - 1;
const _: () = assert!(MAX_LOG_BLOCKS <= SLOT_BITS as u64 + 1);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointHeader {
    pub sequence: u64,
    pub log_position: u64,
    pub next_record_sequence: u64,
    pub head_position: u64,
    pub entry_count: u64,
    pub entries_crc: u32,
    pub prev_record_checksum: u32,
    pub epoch: u64,
}

/// A checkpointed index entry, or (with `lost`) a lost block's tombstone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckpointEntry {
    pub backing_block: u64,
    pub slot: u32,
    pub dirty: bool,
    pub lost: bool,
    pub data_crc: u32,
}

impl CheckpointEntry {
    pub fn encode(&self, out: &mut [u8]) {
        assert!(self.slot <= SLOT_BITS);
        assert!(!self.lost || (self.slot == 0 && !self.dirty), "a tombstone names no slot");
        let flags = if self.dirty { DIRTY_BIT } else { 0 } | if self.lost { LOST_BIT } else { 0 };
        let d = CheckpointEntryDisk {
            backing_block: U64::new(self.backing_block),
            slot_and_flags: U32::new(self.slot | flags),
            data_crc: U32::new(self.data_crc),
        };
        out[..CHECKPOINT_ENTRY_SIZE].copy_from_slice(d.as_bytes());
    }

    pub fn decode(bytes: &[u8]) -> Result<CheckpointEntry, FormatError> {
        let d = CheckpointEntryDisk::read_from_bytes(&bytes[..CHECKPOINT_ENTRY_SIZE]).expect("size");
        if d.backing_block.get() > MAX_BACKING_BLOCKS {
            return Err(FormatError::Invalid {
                what: "checkpoint entry",
                field: "backing_block",
                why: d.backing_block.get().to_string(),
            });
        }
        let v = d.slot_and_flags.get();
        let e = CheckpointEntry {
            backing_block: d.backing_block.get(),
            slot: v & SLOT_BITS,
            dirty: v & DIRTY_BIT != 0,
            lost: v & LOST_BIT != 0,
            data_crc: d.data_crc.get(),
        };
        if e.lost && (e.slot != 0 || e.dirty) {
            return Err(FormatError::Invalid {
                what: "checkpoint entry",
                field: "slot_and_flags",
                why: format!("block {}: a lost tombstone with data", e.backing_block),
            });
        }
        Ok(e)
    }
}

impl CheckpointHeader {
    pub fn encode(&self, uuid_low: u64, block: &mut [u8]) {
        block.fill(0);
        let d = CheckpointHeaderDisk {
            checksum: U32::new(0),
            entries_crc: U32::new(self.entries_crc),
            magic: U64::new(CHECKPOINT_MAGIC ^ uuid_low),
            version: U32::new(FORMAT_VERSION),
            flags: U32::new(0),
            sequence: U64::new(self.sequence),
            log_position: U64::new(self.log_position),
            next_record_sequence: U64::new(self.next_record_sequence),
            head_position: U64::new(self.head_position),
            entry_count: U64::new(self.entry_count),
            prev_record_checksum: U32::new(self.prev_record_checksum),
            padding: U32::new(0),
            epoch: U64::new(self.epoch),
            reserved: [0; 48],
        };
        block[..CHECKPOINT_HEADER_SIZE].copy_from_slice(d.as_bytes());
        let crc = crate::checksum(&block[4..]);
        block[..4].copy_from_slice(&crc.to_le_bytes());
    }

    /// Decodes the header block; `max_entries` is what the area can hold.
    pub fn decode(block: &[u8], uuid_low: u64, max_entries: u64) -> Result<CheckpointHeader, FormatError> {
        const WHAT: &str = "checkpoint header";
        if block.len() < CHECKPOINT_HEADER_SIZE {
            return Err(FormatError::TooShort { what: WHAT, len: block.len(), need: CHECKPOINT_HEADER_SIZE });
        }
        let d = CheckpointHeaderDisk::read_from_bytes(&block[..CHECKPOINT_HEADER_SIZE]).expect("size");
        if d.magic.get() != CHECKPOINT_MAGIC ^ uuid_low {
            return Err(FormatError::BadMagic { what: WHAT, found: d.magic.get() });
        }
        let computed = crate::checksum(&block[4..]);
        if computed != d.checksum.get() {
            return Err(FormatError::BadChecksum { what: WHAT, stored: d.checksum.get(), computed });
        }
        if d.version.get() != FORMAT_VERSION {
            return Err(FormatError::UnsupportedVersion {
                what: WHAT,
                found: d.version.get(),
                supported: FORMAT_VERSION,
            });
        }
        let h = CheckpointHeader {
            sequence: d.sequence.get(),
            log_position: d.log_position.get(),
            next_record_sequence: d.next_record_sequence.get(),
            head_position: d.head_position.get(),
            entry_count: d.entry_count.get(),
            entries_crc: d.entries_crc.get(),
            prev_record_checksum: d.prev_record_checksum.get(),
            epoch: d.epoch.get(),
        };
        let invalid = |field, why: String| Err(FormatError::Invalid { what: WHAT, field, why });
        if d.flags.get() != 0 || d.padding.get() != 0 || d.reserved.iter().any(|&b| b != 0) {
            return invalid("reserved", "non-zero reserved bits".into());
        }
        if h.entry_count > max_entries {
            return invalid("entry_count", format!("{} > {max_entries}", h.entry_count));
        }
        if h.head_position > h.log_position {
            return invalid("head_position", format!("{} > log_position {}", h.head_position, h.log_position));
        }
        Ok(h)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_and_entries_round_trip() {
        let h = CheckpointHeader {
            sequence: 3,
            log_position: 5000,
            next_record_sequence: 812,
            head_position: 4000,
            entry_count: 2,
            entries_crc: 0x1234,
            prev_record_checksum: 0x77,
            epoch: 4,
        };
        let mut block = vec![0u8; 4096];
        h.encode(9, &mut block);
        assert_eq!(CheckpointHeader::decode(&block, 9, 10).unwrap(), h);
        assert!(CheckpointHeader::decode(&block, 8, 10).is_err());
        assert!(CheckpointHeader::decode(&block, 9, 1).is_err(), "more entries than the area holds");
        let e = CheckpointEntry { backing_block: 77, slot: 12, dirty: true, lost: false, data_crc: 0xfeed };
        let mut buf = [0u8; 16];
        e.encode(&mut buf);
        assert_eq!(CheckpointEntry::decode(&buf).unwrap(), e);
        let t = CheckpointEntry { backing_block: 78, slot: 0, dirty: false, lost: true, data_crc: 0 };
        t.encode(&mut buf);
        assert_eq!(CheckpointEntry::decode(&buf).unwrap(), t);
        buf[8] = 1; // a tombstone naming a slot
        assert!(CheckpointEntry::decode(&buf).is_err());
    }
}
