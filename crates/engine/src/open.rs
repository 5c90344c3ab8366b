//! Formatting a cache device, and recovery: from the cache device alone, rebuild the whole
//! index (clean and dirty) from the newest valid checkpoint plus the valid log tail.
//!
//! Recovery is a decision table (docs/format.md, "Recovery"):
//!
//! | step | finding | decision |
//! | --- | --- | --- |
//! | superblock | both copies valid | the higher sequence |
//! | | one valid | that one |
//! | | none valid, magic absent in both | not formatted |
//! | | none valid otherwise | the most telling error (checksum, newer version) |
//! | checkpoint | both areas valid | the higher sequence |
//! | | one valid | that one |
//! | | none valid | corrupt (create always writes one) |
//! | each record from the checkpoint's position | header invalid, wrong sequence, wrong position, broken chain, epoch lower than the previous, beyond head + log | stop: the chain ends here |
//! | | a data CRC mismatch | keep walking; see "the tail" |
//! | | all checks pass | keep it, continue |
//! | the tail | the first damaged record with a sequence above every durable sequence the chain vouches for (`durable_back`) | cut there: a torn write, never acknowledged |
//! | | a damaged record some record vouches for | keep it: its damaged dirty entries are lost blocks (corruption of acknowledged data) |
//! | building the index | checkpoint entry whose position (relative to the checkpoint) is below the final head, or whose slot the replayed tail reused | skip it |
//! | | checkpoint tombstone, or a `Lost` entry | the block is lost |
//! | | replayed dirty data entry | ends a loss of that block |
//! | | MarkClean naming a lost block's position | ends that loss (the backing device holds it) |
//! | | replayed data entry below the final head | skip it (and forget older copies) |
//! | | more lost blocks than the checkpoint can remember | refuse to open (the device is failing) |
//! | open | every run | flush, recheck lost blocks against the backing device by CRC, new epoch, checkpoint, serve |

use crate::error::{Corruption, EngineError, Result};
use crate::index::{Index, IndexEntry};
use crate::volume::{read_log, Recovered, Volume, VolumeOptions};
use std::collections::BTreeMap;
use std::sync::Arc;
use tiercache_device::{AlignedBuf, BlockDevice, Clock};
use tiercache_format::constants::*;
use tiercache_format::{
    checksum, fingerprint_blocks, uuid_low64, CheckpointEntry, CheckpointHeader, EntryKind, Fingerprint, FormatError,
    Layout, RecordHeader, Superblock, VolumeMode, FINGERPRINT_BLOCKS,
};

/// How to format a cache device.
#[derive(Debug, Clone)]
pub struct CreateOptions {
    pub block_size: u32,
    pub segment_blocks: u32,
    pub dirty_low_permille: u16,
    pub dirty_high_permille: u16,
    /// Recorded for information (`status` shows it).
    pub backing_path: String,
    /// Volume UUID; random when `None`.
    pub uuid: Option<[u8; 16]>,
    /// Seconds since the epoch, recorded for information.
    pub created_unix_secs: u64,
}

impl Default for CreateOptions {
    fn default() -> Self {
        CreateOptions {
            block_size: DEFAULT_BLOCK_SIZE,
            segment_blocks: DEFAULT_SEGMENT_BLOCKS,
            dirty_low_permille: crate::constants::DEFAULT_DIRTY_LOW_PERMILLE,
            dirty_high_permille: crate::constants::DEFAULT_DIRTY_HIGH_PERMILLE,
            backing_path: String::new(),
            uuid: None,
            created_unix_secs: 0,
        }
    }
}

/// The CRCs of the backing device's fingerprint blocks (`Superblock::fingerprint_blocks`).
fn backing_fingerprints(backing: &dyn BlockDevice, block_size: u32) -> Result<[u32; FINGERPRINT_BLOCKS]> {
    let bs = u64::from(block_size);
    let mut block = AlignedBuf::new(block_size as usize);
    let mut crcs = [0u32; FINGERPRINT_BLOCKS];
    for (crc, b) in crcs.iter_mut().zip(fingerprint_blocks(backing.size_bytes() / bs * bs, block_size)) {
        backing.read_at(b * bs, &mut block).map_err(EngineError::backing)?;
        *crc = checksum(&block);
    }
    Ok(crcs)
}

/// Formats `cache` as a cache for `backing`. Writes the cache device only: the backing device
/// is read (its size and last block) but never written.
pub fn create(cache: &dyn BlockDevice, backing: &dyn BlockDevice, options: &CreateOptions) -> Result<Superblock> {
    let bs = options.block_size;
    if options.dirty_low_permille > options.dirty_high_permille || options.dirty_high_permille > 1000 {
        return Err(EngineError::Config(format!(
            "dirty watermarks must satisfy low <= high <= 1000 per mille (got {} and {})",
            options.dirty_low_permille, options.dirty_high_permille
        )));
    }
    let layout = Layout::compute(cache.size_bytes(), bs, options.segment_blocks)
        .map_err(|source| EngineError::Format { device: cache.describe(), source })?;
    for (dev, role) in [(cache, "cache"), (backing, "backing")] {
        if !(bs as u64).is_multiple_of(u64::from(dev.logical_block_size())) {
            return Err(EngineError::Config(format!(
                "block size {bs} is not a multiple of the {role} device's {}-byte logical block size",
                dev.logical_block_size()
            )));
        }
    }
    let backing_size = backing.size_bytes() / u64::from(bs) * u64::from(bs);
    if backing_size != backing.size_bytes() {
        return Err(EngineError::Config(format!(
            "backing device size {} is not a multiple of the {bs}-byte block size",
            backing.size_bytes()
        )));
    }
    if backing_size / u64::from(bs) > MAX_BACKING_BLOCKS {
        return Err(EngineError::Config(format!(
            "backing device of {backing_size} bytes has more than {MAX_BACKING_BLOCKS} blocks of {bs} bytes; use a larger --block-size"
        )));
    }
    let uuid = options.uuid.unwrap_or_else(|| {
        use rand::RngCore;
        let mut u = [0u8; 16];
        rand::thread_rng().fill_bytes(&mut u);
        u
    });
    let sb = Superblock {
        sequence: 1,
        uuid,
        cache_size_bytes: cache.size_bytes(),
        layout,
        mode: VolumeMode::WriteBack,
        backing_size_bytes: backing_size,
        backing_fingerprints: backing_fingerprints(backing, bs)?.map(|crc| Fingerprint { crc, next: None }),
        dirty_low_permille: options.dirty_low_permille,
        dirty_high_permille: options.dirty_high_permille,
        created_unix_secs: options.created_unix_secs,
        backing_path: options.backing_path.clone(),
        backing_id: backing.identity().map(|id| tiercache_format::superblock::fit_backing_id(&id)).unwrap_or_default(),
    };
    let bsz = bs as usize;
    let uuid_low = uuid_low64(&uuid);
    // An empty checkpoint in area 1 (sequence 1), and area 0 cleared, so that recovery of a
    // fresh cache starts from a known state; then the log's first block cleared, so that no
    // record of a previous format can follow it.
    let mut block = AlignedBuf::new(bsz);
    let empty = CheckpointHeader {
        sequence: 1,
        log_position: 0,
        next_record_sequence: 1,
        head_position: 0,
        entry_count: 0,
        entries_crc: checksum(&[]),
        prev_record_checksum: 0,
        epoch: 0,
    };
    let write = |offset: u64, buf: &[u8]| cache.write_at(offset, buf).map_err(EngineError::cache);
    write(layout.checkpoint_area_start[0] * u64::from(bs), &block)?;
    write(layout.log_offset(0), &block)?;
    empty.encode(uuid_low, &mut block);
    write(layout.checkpoint_area_start[1] * u64::from(bs), &block)?;
    cache.flush().map_err(EngineError::cache)?;
    // The superblock last, in both copies: until it is durable the device is not a cache.
    sb.encode(&mut block);
    write(u64::from(bs), &block)?;
    write(0, &block)?;
    cache.flush().map_err(EngineError::cache)?;
    Ok(sb)
}

/// Reads and chooses the superblock. Copy A is at byte 0; copy B at the start of block 1,
/// whose size is read from copy A or, if copy A is unreadable, tried for every block size.
pub fn read_superblock(cache: &dyn BlockDevice) -> Result<Superblock> {
    let device = cache.describe();
    let unit = (cache.logical_block_size() as usize).max(SUPERBLOCK_SIZE);
    let mut buf = AlignedBuf::new(unit);
    let read = |offset: u64, buf: &mut AlignedBuf| -> Result<Result<Superblock, FormatError>> {
        if offset + unit as u64 > cache.size_bytes() {
            return Ok(Err(FormatError::TooShort { what: "superblock", len: 0, need: SUPERBLOCK_SIZE }));
        }
        cache.read_at(offset, buf).map_err(EngineError::cache)?;
        Ok(Superblock::decode(buf))
    };
    let a = read(0, &mut buf)?;
    let b = match &a {
        Ok(sb) => read(u64::from(sb.layout.block_size), &mut buf)?,
        Err(_) => {
            let mut found = Err(FormatError::BadMagic { what: "superblock", found: 0 });
            let mut size = MIN_BLOCK_SIZE;
            while size <= MAX_BLOCK_SIZE {
                match read(u64::from(size), &mut buf)? {
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
            found
        }
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

/// Reads one checkpoint area; `Err` says why it is not usable.
fn read_checkpoint(
    cache: &dyn BlockDevice,
    layout: &Layout,
    uuid_low: u64,
    area: usize,
) -> Result<Result<(CheckpointHeader, Vec<CheckpointEntry>), String>> {
    let bs = layout.block_size as usize;
    let start = layout.checkpoint_area_start[area] * bs as u64;
    let mut head = AlignedBuf::new(bs);
    cache.read_at(start, &mut head).map_err(EngineError::cache)?;
    let header = match CheckpointHeader::decode(&head, uuid_low, layout.checkpoint_capacity()) {
        Ok(h) => h,
        Err(e) => return Ok(Err(e.to_string())),
    };
    let entry_bytes = header.entry_count as usize * CHECKPOINT_ENTRY_SIZE;
    let blocks = entry_bytes.div_ceil(bs);
    let mut entries = Vec::with_capacity(header.entry_count as usize);
    if blocks > 0 {
        let mut buf = AlignedBuf::new(blocks * bs);
        cache.read_at(start + bs as u64, &mut buf).map_err(EngineError::cache)?;
        if checksum(&buf[..entry_bytes]) != header.entries_crc {
            return Ok(Err(format!("checkpoint area {area}: entries checksum mismatch (torn checkpoint)")));
        }
        for chunk in buf[..entry_bytes].chunks(CHECKPOINT_ENTRY_SIZE) {
            match CheckpointEntry::decode(chunk) {
                Ok(e) if u64::from(e.slot) < layout.log_blocks || e.lost => entries.push(e),
                Ok(e) => return Ok(Err(format!("checkpoint area {area}: slot {} beyond the log", e.slot))),
                Err(e) => return Ok(Err(e.to_string())),
            }
        }
    } else if checksum(&[]) != header.entries_crc {
        return Ok(Err(format!("checkpoint area {area}: entries checksum mismatch")));
    }
    Ok(Ok((header, entries)))
}

/// Rebuilds the index from the cache device alone (no backing device needed).
pub(crate) fn recover(cache: &dyn BlockDevice) -> Result<Recovered> {
    let sb = read_superblock(cache)?;
    let layout = sb.layout;
    let uuid_low = uuid_low64(&sb.uuid);
    let bs = layout.block_size as usize;
    let log_blocks = layout.log_blocks;

    let candidates = [read_checkpoint(cache, &layout, uuid_low, 0)?, read_checkpoint(cache, &layout, uuid_low, 1)?];
    let (ck, entries) = match candidates {
        [Ok(a), Ok(b)] => {
            if b.0.sequence > a.0.sequence {
                b
            } else {
                a
            }
        }
        [Ok(a), Err(_)] => a,
        [Err(_), Ok(b)] => b,
        [Err(ea), Err(eb)] => {
            return Err(EngineError::Corrupt(Corruption::NoValidCheckpoint {
                area0: ea.to_string(),
                area1: eb.to_string(),
            }));
        }
    };
    let backing_blocks = sb.backing_size_bytes / bs as u64;
    if let Some(e) = entries.iter().find(|e| e.backing_block >= backing_blocks) {
        return Err(EngineError::Corrupt(Corruption::CheckpointBeyondBacking { block: e.backing_block }));
    }

    // Pass 1: find the valid log tail, keeping the headers. The chain is followed through
    // valid headers; a record whose data fails its checksums ends the replay (a torn tail)
    // unless a record of the chain vouches it was durable before (`durable_back`): then the
    // damage is corruption of acknowledged data, its blocks are declared lost, and replay
    // goes on.
    // (position, header, damaged data entries, the header's stored checksum)
    let mut records: Vec<(u64, RecordHeader, Vec<usize>, u32)> = Vec::new();
    let mut evidence = ck.next_record_sequence.saturating_sub(1);
    let mut pos = ck.log_position;
    let mut seq = ck.next_record_sequence;
    let mut prev = ck.prev_record_checksum;
    let mut head = ck.head_position;
    let mut epoch = ck.epoch;
    let mut header_block = AlignedBuf::new(bs);
    let mut data = AlignedBuf::new(bs * crate::constants::MAX_RECORD_BLOCKS as usize);
    loop {
        if pos + 1 > head + log_blocks {
            break;
        }
        read_log(cache, &layout, pos, &mut header_block)?;
        let Ok(h) = RecordHeader::decode(&header_block, uuid_low) else { break };
        let end = pos + h.total_blocks();
        if h.sequence != seq
            || h.position != pos
            || h.prev_checksum != prev
            || h.head_position < head
            || h.epoch < epoch
            || end > h.head_position + log_blocks
            || h.data_blocks() > crate::constants::RECORD_ENTRIES
            || h.entries.iter().any(|e| e.backing_block >= backing_blocks)
        {
            break;
        }
        let nd = h.data_blocks();
        if nd > 0 {
            read_log(cache, &layout, pos + 1, &mut data[..nd * bs])?;
        }
        let bad: Vec<usize> = h
            .entries
            .iter()
            .filter(|e| e.kind.has_data())
            .enumerate()
            .filter(|(k, e)| checksum(&data[k * bs..(k + 1) * bs]) != e.data_crc)
            .map(|(k, _)| k)
            .collect();
        evidence = evidence.max(h.durable_sequence());
        head = h.head_position;
        epoch = h.epoch;
        prev = RecordHeader::stored_checksum(&header_block);
        seq += 1;
        records.push((pos, h, bad, prev));
        pos = end;
    }
    // The tail: the first damaged record nothing vouches for (a torn write that was never
    // acknowledged) ends the log; records after it are dropped with it.
    if let Some(cut) = records.iter().position(|(_, h, bad, _)| !bad.is_empty() && h.sequence > evidence) {
        records.truncate(cut);
    }
    let (tail, head, epoch, seq, prev) = match records.last() {
        Some((pos, h, _, crc)) => {
            (pos + h.total_blocks(), h.head_position, h.epoch.max(ck.epoch), h.sequence + 1, *crc)
        }
        None => (ck.log_position, ck.head_position, ck.epoch, ck.next_record_sequence, ck.prev_record_checksum),
    };

    // Pass 2: build the index, keeping only blocks whose position is live in [head, tail).
    // A checkpoint entry's position is taken relative to the checkpoint (its slot may have
    // been reused by the replayed tail, which a position relative to the final tail would
    // not show).
    let mut index = Index::with_capacity(log_blocks as usize);
    // Lost blocks: backing block -> the position of the copy that failed (0 for tombstones).
    let mut lost: BTreeMap<u64, (u64, u32)> = BTreeMap::new();
    for e in &entries {
        if e.lost {
            // A tombstone does not keep the position: u64::MAX matches no MarkClean.
            lost.insert(e.backing_block, (u64::MAX, e.data_crc));
            continue;
        }
        let position = layout.position_of_slot(e.slot, ck.log_position);
        let overwritten = layout.position_of_slot(e.slot, tail) >= ck.log_position;
        if position >= head && !overwritten {
            index.insert(
                e.backing_block,
                IndexEntry { slot: e.slot, dirty: e.dirty, referenced: false, crc: e.data_crc },
            );
        }
    }
    for (pos, h, bad, _) in &records {
        let mut k = 0u64;
        for e in &h.entries {
            match e.kind {
                EntryKind::DataDirty | EntryKind::DataClean => {
                    let position = pos + 1 + k;
                    let damaged = bad.contains(&(k as usize));
                    k += 1;
                    if damaged {
                        // Acknowledged data corrupted on the medium. A clean copy equals the
                        // backing device's: forget it. A dirty one was the newest version.
                        index.remove(e.backing_block);
                        if e.kind == EntryKind::DataDirty {
                            tracing::error!(
                                block = e.backing_block,
                                position,
                                "replayed dirty block fails its checksum: lost"
                            );
                            lost.insert(e.backing_block, (position, e.data_crc));
                        }
                        continue;
                    }
                    if e.kind == EntryKind::DataDirty {
                        lost.remove(&e.backing_block); // newer data ends a loss
                    }
                    if position >= head {
                        let entry = IndexEntry {
                            slot: layout.slot(position),
                            dirty: e.kind == EntryKind::DataDirty,
                            referenced: false,
                            crc: e.data_crc,
                        };
                        index.insert(e.backing_block, entry);
                    } else {
                        // Reclaimed later in the replayed tail; any older copy is older still.
                        index.remove(e.backing_block);
                    }
                }
                EntryKind::MarkClean => {
                    // The backing device holds exactly the version a loss named: it is over.
                    if lost.get(&e.backing_block).map(|l| l.0) == Some(e.ref_position) {
                        lost.remove(&e.backing_block);
                    }
                    // By position, not slot: a newer copy may sit in the same slot a lap later.
                    let current = index.get(e.backing_block).map(|c| layout.position_of_slot(c.slot, tail));
                    if current == Some(e.ref_position) {
                        index.mark_clean(e.backing_block, layout.slot(e.ref_position));
                    }
                }
                EntryKind::Trim => {
                    index.remove(e.backing_block);
                }
                EntryKind::Lost => {
                    // Never written after newer data of the block (see volume/mod.rs, `Lost`).
                    index.remove(e.backing_block);
                    lost.insert(e.backing_block, (e.ref_position, e.data_crc));
                }
            }
        }
    }
    let replayed = records.len() as u64;
    let max_lost = Layout::max_lost_blocks_for(log_blocks) as usize;
    if lost.len() > max_lost {
        return Err(EngineError::Corrupt(Corruption::TooManyLost { count: lost.len() as u64, max: max_lost as u64 }));
    }
    Ok(Recovered {
        superblock: sb,
        index,
        head,
        tail,
        next_seq: seq,
        last_header_crc: prev,
        checkpoint_position: ck.log_position,
        checkpoint_seq: ck.sequence,
        replayed_records: replayed,
        lost: lost.into_iter().map(|(b, (position, crc))| (b, position, crc)).collect(),
        epoch,
    })
}

/// Checks that `backing` is the device this cache was formatted for: its size, the stable
/// identity the kernel reports (where both sides have one), and the CRCs of its fingerprint
/// blocks (kept current by write-back). A mismatch names what differs.
fn check_backing(sb: &Superblock, recovered: &Recovered, backing: &dyn BlockDevice) -> Result<()> {
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
    let crcs = backing_fingerprints(backing, sb.layout.block_size)?;
    for ((f, crc), block) in sb.backing_fingerprints.iter().zip(crcs).zip(sb.fingerprint_blocks()) {
        // A crash while a fingerprint block was being written back can leave it torn
        // (matching neither CRC); the cache then still holds it dirty and rewrites it.
        // (Also when that dirty copy was lost since: the backing block stays torn until the
        // block is rewritten, and refusing the device would lock the volume out.)
        let in_flight = f.next.is_some()
            && (index.get(block).is_some_and(|e| e.dirty) || recovered.lost.iter().any(|&(b, _, _)| b == block));
        if crc != f.crc && Some(crc) != f.next && !in_flight {
            return Err(wrong(format!(
                "its block {block} (bytes {}..{}) has checksum {crc:#010x}, the cache expects {:#010x}",
                block * u64::from(sb.layout.block_size),
                (block + 1) * u64::from(sb.layout.block_size),
                f.crc
            )));
        }
    }
    Ok(())
}

/// What `open` found, for logs and benchmarks.
#[derive(Debug, Clone, Copy)]
pub struct OpenReport {
    pub replayed_records: u64,
    pub recovered_blocks: u64,
    pub recovered_dirty_blocks: u64,
}

impl Volume {
    /// Opens (recovers) a volume: the cache is warm immediately, clean and dirty blocks alike.
    pub fn open(
        cache: Arc<dyn BlockDevice>,
        backing: Arc<dyn BlockDevice>,
        clock: Arc<dyn Clock>,
        options: VolumeOptions,
    ) -> Result<(Volume, OpenReport)> {
        let recovered = recover(&*cache)?;
        check_backing(&recovered.superblock, &recovered, &*backing)?;
        let report = OpenReport {
            replayed_records: recovered.replayed_records,
            recovered_blocks: recovered.index.len() as u64,
            recovered_dirty_blocks: recovered.index.dirty_len() as u64,
        };
        let volume = Volume::assemble(cache, backing, clock, recovered, options);
        // What was replayed may sit in the device's volatile cache only (after a process
        // kill); a later FLUSH must not return before it is durable. So flush, then write a
        // checkpoint carrying a new epoch before serving anything: records written from now
        // on differ from every record written before this recovery, so none of those left
        // beyond the recovered tail can ever chain onto them (docs/format.md, "the
        // post-recovery chain rule"). The checkpoint also starts the next recovery here.
        volume.cache.flush().map_err(EngineError::cache)?;
        volume.recheck_lost_against_backing();
        volume.begin_epoch();
        volume.checkpoint()?;
        Ok((volume, report))
    }

    /// Recovers the index without writing anything, for `status` and `check`. With a backing
    /// device, checks that it is the right one; without, any backing I/O fails.
    pub fn inspect(
        cache: Arc<dyn BlockDevice>,
        backing: Option<Arc<dyn BlockDevice>>,
        clock: Arc<dyn Clock>,
    ) -> Result<Volume> {
        let recovered = recover(&*cache)?;
        let checked = backing.is_some();
        let backing: Arc<dyn BlockDevice> = match backing {
            Some(b) => {
                check_backing(&recovered.superblock, &recovered, &*b)?;
                b
            }
            None => Arc::new(NoBacking {
                size_bytes: recovered.superblock.backing_size_bytes,
                block_size: recovered.superblock.layout.block_size,
            }),
        };
        let volume = Volume::assemble(cache, backing, clock, recovered, VolumeOptions::default());
        if checked {
            // Read-only: only the RAM view changes (what the next open would also conclude).
            volume.recheck_lost_against_backing();
        }
        Ok(volume)
    }
}

/// Stands in for the backing device when only the cache device is inspected; any I/O is an error.
struct NoBacking {
    size_bytes: u64,
    block_size: u32,
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
