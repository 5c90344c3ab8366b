//! Pass 1 of recovery: the log scan (docs/format.md 4.1 and 4.6). From the checkpoint's
//! position it follows the chain of records through valid headers, reads each record's data
//! blocks and notes the damaged ones, and keeps the evidence (`durable_back`) of what was
//! durable; then it cuts the chain at the torn tail. It ends with a [`ReplayEnd`]: where the
//! first record not replayed lies, and why it is not replayed ([`ReplayStop`]).

use crate::error::Result;
use crate::volume::read_log;
use std::fmt;
use tiercache_device::{AlignedBuf, BlockDevice};
use tiercache_format::constants::MAX_RECORD_ENTRIES;
use tiercache_format::{checksum, CheckpointHeader, FormatError, Layout, RecordHeader};

/// Why recovery's log scan stopped: the reason the first record not replayed is not replayed.
/// One variant per rule of docs/format.md 4.1, in the order they are checked (room for a
/// header, checks 1-8, then the torn tail); the first rule a record breaks names the stop.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReplayStop {
    /// The next header would start at or beyond the previous head + `log_blocks` (`limit`):
    /// the chain fills the whole live log, so there is nothing more to read.
    LogFull { limit: u64 },
    /// The block there does not carry this volume's record magic: never written in this lap
    /// (or zeroed by format), a data block, another volume's, or a header torn in its first
    /// sector. The usual end of a log.
    NoHeader { found_magic: u64 },
    /// The header's checksum fails: a torn or corrupt header.
    HeaderChecksum { stored: u32, computed: u32 },
    /// The header is of another format version.
    HeaderVersion { found: u32 },
    /// A header field is refused by the decoder (`entry_count`, the zero `tail` of the block,
    /// an entry's `kind`, `padding` or `backing_block`, `reserved` flags, `data_blocks`,
    /// `head_position` beyond the record): a header that is not a sound record.
    HeaderField { field: &'static str },
    /// A valid header written for another position: a record of an earlier lap.
    WrongPosition { found: u64 },
    /// A valid header at the right position with another sequence.
    WrongSequence { expected: u64, found: u64 },
    /// `prev_checksum` is not the previous header's checksum: the hash chain is broken (a
    /// stale record beyond a torn tail, written over since).
    BrokenChain { expected: u32, found: u32 },
    /// The record's `head_position` is below the previous record's: the head only moves
    /// forward.
    HeadMovedBack { previous: u64, found: u64 },
    /// The record's epoch is below the previous record's or the checkpoint's: a record
    /// written before the last recovery (the post-recovery chain rule, 4.9).
    EpochDecreased { previous: u64, found: u64 },
    /// The record would end at `end`, beyond its own head + `log_blocks` (`limit`): it would
    /// have overwritten live log.
    OverlapsLiveLog { end: u64, limit: u64 },
    /// An entry names a block beyond the backing device.
    BlockBeyondBacking { block: u64 },
    /// Its header chained, but its data fails its CRC and no record vouches that
    /// it was durable (its sequence is above `evidence`, the highest sequence known durable):
    /// a torn write. It and the `dropped - 1` records after it are not replayed.
    TornTail { evidence: u64, dropped: u64 },
}

impl ReplayStop {
    /// The stop for a header that does not decode.
    fn from_header_error(e: FormatError) -> ReplayStop {
        match e {
            FormatError::BadMagic { found, .. } => ReplayStop::NoHeader { found_magic: found },
            FormatError::BadChecksum { stored, computed, .. } => ReplayStop::HeaderChecksum { stored, computed },
            FormatError::UnsupportedVersion { found, .. }
            | FormatError::NewerVersion { found, .. }
            | FormatError::OlderVersion { found, .. } => ReplayStop::HeaderVersion { found },
            FormatError::Invalid { field, .. } => ReplayStop::HeaderField { field },
            // The scan always hands the decoder a whole block, at least 4 KiB.
            FormatError::TooShort { .. } => ReplayStop::HeaderField { field: "length" },
        }
    }
}

impl fmt::Display for ReplayStop {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            ReplayStop::LogFull { limit } => write!(f, "the chain fills the live log (next header at or beyond {limit})"),
            // (The usual end of a log: said as such, not as a fault.)
            ReplayStop::NoHeader { found_magic: 0 } => write!(f, "the end of the log (a block never written follows)"),
            ReplayStop::NoHeader { found_magic } => {
                write!(f, "the end of the log (the next block is no record header of this volume: magic {found_magic:#018x})")
            }
            ReplayStop::HeaderChecksum { stored, computed } => {
                write!(f, "record header checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")
            }
            ReplayStop::HeaderVersion { found } => write!(f, "record header of format version {found}"),
            ReplayStop::HeaderField { field } => write!(f, "record header refused: invalid field {field}"),
            ReplayStop::WrongPosition { found } => write!(f, "a record written for position {found} (an earlier lap)"),
            ReplayStop::WrongSequence { expected, found } => {
                write!(f, "record sequence {found}, expected {expected}")
            }
            ReplayStop::BrokenChain { expected, found } => {
                write!(f, "hash chain broken (prev_checksum {found:#010x}, previous header {expected:#010x})")
            }
            ReplayStop::HeadMovedBack { previous, found } => {
                write!(f, "record head {found} below the previous head {previous}")
            }
            ReplayStop::EpochDecreased { previous, found } => {
                write!(f, "record epoch {found} below the previous epoch {previous} (written before a recovery)")
            }
            ReplayStop::OverlapsLiveLog { end, limit } => {
                write!(f, "record ends at {end}, beyond its head + log size {limit}")
            }
            ReplayStop::BlockBeyondBacking { block } => write!(f, "record names block {block} beyond the backing device"),
            ReplayStop::TornTail { evidence, dropped } => write!(
                f,
                "torn tail: damaged data nothing vouches for (durable up to sequence {evidence}); {dropped} records dropped"
            ),
        }
    }
}

/// Where replay ended and why.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplayEnd {
    /// The log position of the first record not replayed: the recovered tail, where writing
    /// resumes.
    pub position: u64,
    /// The sequence a record there had to carry: the next record's sequence.
    pub sequence: u64,
    pub stop: ReplayStop,
}

/// A record the scan accepted: where it lies, its header, which of its data entries (counted
/// among the data entries only) fail their CRC, and the header's stored checksum.
pub(super) struct ScannedRecord {
    pub position: u64,
    pub header: RecordHeader,
    pub damaged: Vec<usize>,
    pub checksum: u32,
}

impl ScannedRecord {
    pub fn end(&self) -> u64 {
        self.position + self.header.total_blocks()
    }
}

/// What the scan found: the records to replay, where replay ends, and where the walk itself
/// stopped (further on than `end` when the torn tail was cut).
pub(super) struct Scan {
    pub records: Vec<ScannedRecord>,
    pub end: ReplayEnd,
    pub walk_end: ReplayEnd,
}

/// A decoded record's data blocks fit the scan's buffer of `MAX_RECORD_BLOCKS` blocks: the
/// decoder refuses more than `MAX_RECORD_ENTRIES` entries, and data blocks are entries. (This
/// replaces a run-time check that could not fail.)
const _: () = assert!(MAX_RECORD_ENTRIES <= crate::constants::RECORD_ENTRIES);

/// What the next record must be: the previous record's (or the checkpoint's) successor.
struct Expected {
    position: u64,
    sequence: u64,
    prev_checksum: u32,
    head: u64,
    epoch: u64,
}

impl Expected {
    fn first(ck: &CheckpointHeader) -> Expected {
        Expected {
            position: ck.log_position,
            sequence: ck.next_record_sequence,
            prev_checksum: ck.prev_record_checksum,
            head: ck.head_position,
            epoch: ck.epoch,
        }
    }

    fn after(record: &ScannedRecord) -> Expected {
        Expected {
            position: record.end(),
            sequence: record.header.sequence + 1,
            prev_checksum: record.checksum,
            head: record.header.head_position,
            epoch: record.header.epoch,
        }
    }

    fn end(&self, stop: ReplayStop) -> ReplayEnd {
        ReplayEnd { position: self.position, sequence: self.sequence, stop }
    }

    /// Whether a header may start here at all: inside the previous head + `log_blocks`.
    fn check_room(&self, log_blocks: u64) -> std::result::Result<(), ReplayStop> {
        let limit = self.head + log_blocks;
        if self.position + 1 > limit {
            return Err(ReplayStop::LogFull { limit });
        }
        Ok(())
    }

    /// The chain rules of 4.1 (checks 2-8) for a header that decoded (check 1).
    fn check(&self, h: &RecordHeader, log_blocks: u64, backing_blocks: u64) -> std::result::Result<(), ReplayStop> {
        if h.position != self.position {
            return Err(ReplayStop::WrongPosition { found: h.position });
        }
        if h.sequence != self.sequence {
            return Err(ReplayStop::WrongSequence { expected: self.sequence, found: h.sequence });
        }
        if h.prev_checksum != self.prev_checksum {
            return Err(ReplayStop::BrokenChain { expected: self.prev_checksum, found: h.prev_checksum });
        }
        if h.head_position < self.head {
            return Err(ReplayStop::HeadMovedBack { previous: self.head, found: h.head_position });
        }
        if h.epoch < self.epoch {
            return Err(ReplayStop::EpochDecreased { previous: self.epoch, found: h.epoch });
        }
        let end = self.position + h.total_blocks();
        let limit = h.head_position + log_blocks;
        if end > limit {
            return Err(ReplayStop::OverlapsLiveLog { end, limit });
        }
        if let Some(e) = h.entries.iter().find(|e| e.backing_block >= backing_blocks) {
            return Err(ReplayStop::BlockBeyondBacking { block: e.backing_block });
        }
        Ok(())
    }
}

/// Scans the log from the checkpoint `ck`: the chain of valid records, cut at the torn tail.
/// An I/O error on the cache device fails the scan (and the open).
pub(super) fn scan_log(
    cache: &dyn BlockDevice,
    layout: &Layout,
    uuid_low: u64,
    backing_blocks: u64,
    ck: &CheckpointHeader,
) -> Result<Scan> {
    let bs = layout.block_size as usize;
    let mut next = Expected::first(ck);
    let mut evidence = ck.next_record_sequence.saturating_sub(1);
    let mut records = Vec::new();
    let mut header_block = AlignedBuf::new(bs);
    let mut data = AlignedBuf::new(bs * crate::constants::MAX_RECORD_BLOCKS as usize);
    let stop = loop {
        if let Err(stop) = next.check_room(layout.log_blocks) {
            break stop;
        }
        read_log(cache, layout, next.position, &mut header_block)?;
        let header = match RecordHeader::decode(&header_block, uuid_low) {
            Ok(h) => h,
            Err(e) => break ReplayStop::from_header_error(e),
        };
        if let Err(stop) = next.check(&header, layout.log_blocks, backing_blocks) {
            break stop;
        }
        // A damaged record does not end the walk: whether it is kept is decided at the end.
        let damaged = damaged_entries(cache, layout, &header, next.position, &mut data)?;
        evidence = evidence.max(header.durable_sequence());
        let checksum = RecordHeader::stored_checksum(&header_block);
        let record = ScannedRecord { position: next.position, header, damaged, checksum };
        next = Expected::after(&record);
        records.push(record);
    };
    Ok(cut_torn_tail(records, evidence, next.end(stop)))
}

/// Reads the record's data blocks; the indexes (among its data entries) of those whose CRC
/// does not match their entry's.
fn damaged_entries(
    cache: &dyn BlockDevice,
    layout: &Layout,
    h: &RecordHeader,
    position: u64,
    data: &mut AlignedBuf,
) -> Result<Vec<usize>> {
    let bs = layout.block_size as usize;
    let nd = h.data_blocks();
    if nd > 0 {
        read_log(cache, layout, position + 1, &mut data[..nd * bs])?;
    }
    Ok(h.entries
        .iter()
        .filter(|e| e.kind.has_data())
        .enumerate()
        .filter(|(k, e)| checksum(&data[k * bs..(k + 1) * bs]) != e.data_crc)
        .map(|(k, _)| k)
        .collect())
}

/// The tail: the first damaged record nothing vouches for (a torn write that was never
/// acknowledged) ends the log; records after it are dropped with it.
fn cut_torn_tail(mut records: Vec<ScannedRecord>, evidence: u64, walk_end: ReplayEnd) -> Scan {
    let Some(cut) = records.iter().position(|r| !r.damaged.is_empty() && r.header.sequence > evidence) else {
        return Scan { records, end: walk_end, walk_end };
    };
    let torn = &records[cut];
    let stop = ReplayStop::TornTail { evidence, dropped: (records.len() - cut) as u64 };
    let end = ReplayEnd { position: torn.position, sequence: torn.header.sequence, stop };
    records.truncate(cut);
    Scan { records, end, walk_end }
}
