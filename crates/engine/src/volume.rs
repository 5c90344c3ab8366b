//! The hybrid volume: a write-back cache on a log-structured cache device in front of a
//! backing device. docs/format.md is the authoritative description of the commit protocol
//! and the crash argument; this header is the map of the code.
//!
//! Data path:
//! - `write` stages blocks in RAM (the volume is a disk with a volatile write cache); a full
//!   staging buffer is sealed into a log record (header + data, one sequential write).
//! - `flush` seals what is staged, writes it, and flushes the cache device once; concurrent
//!   callers share that flush (group commit). The backing device is not touched.
//! - `read` serves staging, the record being written, the cache device (checksum-verified),
//!   or the backing device (admitting small misses into the cache as clean blocks).
//!
//! Locks, always taken in this order: `io` (the log writer: one record write, reclaim or
//! checkpoint at a time, in sequence order), `destage` (one write-back batch at a time, so a
//! block is never written back twice concurrently), `state` (index, staging, positions;
//! never held across I/O).
//!
//! Invariants (asserted where they are relied on):
//! - every index entry names a slot whose position is in `[head, tail)`;
//! - `tail + 1 <= head + log_blocks` after every record write: one block is always free for
//!   the reclaim marker, which must land in space that recovery no longer points into;
//! - `head <= checkpoint position`: replay always starts at or after the head;
//! - records are written in sequence order; `durable_sealed` only grows, and only after a
//!   cache-device flush that started after those records were written (it counts sealed
//!   staging buffers, not sequence numbers, which reclaim markers also consume).

use crate::constants::*;
use crate::error::{EngineError, Result};
use crate::index::{Index, IndexEntry};
use crate::sabotage::sabotaged;
use serde::Serialize;
use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, MutexGuard};
// The engine's locks yield to the simulator's scheduler inside a simulation (and are plain
// std mutexes otherwise): see tiercache-sched.
use tiercache_device::{AlignedBuf, BlockDevice, Clock};
use tiercache_format::{
    checksum, uuid_low64, CheckpointEntry, CheckpointHeader, EntryKind, Fingerprint, Layout, RecordEntry, RecordHeader,
    Superblock, FINGERPRINT_BLOCKS,
};
use tiercache_sched::Mutex;

/// Run-time options of an open volume.
#[derive(Debug, Clone, Copy)]
pub struct VolumeOptions {
    /// Read requests larger than this are not admitted into the cache.
    pub admit_max_request_bytes: u64,
    /// Checkpoint when this share of the log (per mille) was written since the last one.
    pub checkpoint_interval_permille: u64,
    /// Dirty watermarks (low, high) in per mille of the log for this run, instead of the ones
    /// recorded at format (`serve --dirty-low/--dirty-high` or its config file).
    pub dirty_watermarks_permille: Option<(u16, u16)>,
    /// Test machinery: a deliberately broken commit order (the `sabotage` feature).
    #[cfg(feature = "sabotage")]
    pub sabotage: crate::Sabotage,
}

impl Default for VolumeOptions {
    fn default() -> Self {
        VolumeOptions {
            admit_max_request_bytes: ADMIT_MAX_REQUEST_BYTES,
            checkpoint_interval_permille: CHECKPOINT_INTERVAL_PERMILLE,
            dirty_watermarks_permille: None,
            #[cfg(feature = "sabotage")]
            sabotage: crate::Sabotage::None,
        }
    }
}

/// Blocks written into RAM and not yet sealed into a record. Its buffer is laid out as the
/// record will be: block 0 for the header, then one block per data entry.
struct Staging {
    buf: AlignedBuf,
    /// Data entries in record order: (backing block, kind, crc).
    data: Vec<(u64, EntryKind, u32)>,
    /// Backing block -> index into `data`.
    map: HashMap<u64, usize>,
    meta: Vec<RecordEntry>,
    /// Clock time of the first block staged (for the background writer's age limit).
    first_staged_ns: Option<u64>,
    /// Most entries a record may hold: `RECORD_ENTRIES`, or less on a small log so that a
    /// record always fits in the space reclaim can free.
    limit: usize,
}

impl Staging {
    fn new(bs: usize, limit: usize) -> Staging {
        assert!((1..=RECORD_ENTRIES).contains(&limit));
        Staging {
            limit,
            buf: AlignedBuf::new(bs * MAX_RECORD_BLOCKS as usize),
            data: Vec::with_capacity(RECORD_ENTRIES),
            map: HashMap::with_capacity(RECORD_ENTRIES),
            meta: Vec::new(),
            first_staged_ns: None,
        }
    }

    fn is_empty(&self) -> bool {
        self.data.is_empty() && self.meta.is_empty()
    }

    fn entries(&self) -> usize {
        self.data.len() + self.meta.len()
    }

    fn data_limit(&self) -> usize {
        (self.limit * 3 / 4).max(1)
    }

    fn has_dirty(&self) -> bool {
        self.data.iter().any(|(_, k, _)| *k == EntryKind::DataDirty)
    }

    fn block(&self, i: usize, bs: usize) -> &[u8] {
        &self.buf[(1 + i) * bs..(2 + i) * bs]
    }

    /// Stages a block (replacing a staged copy in place). False if there is no room.
    fn put(&mut self, block: u64, kind: EntryKind, data: &[u8], crc: u32, now_ns: u64) -> bool {
        let bs = data.len();
        let i = match self.map.get(&block) {
            Some(&i) => {
                // A dirty write replaces a staged clean fill, never the other way round.
                if kind == EntryKind::DataDirty || self.data[i].1 == EntryKind::DataClean {
                    self.data[i] = (block, kind, crc);
                } else {
                    return true;
                }
                i
            }
            None => {
                // A quarter of each record is kept for metadata, so MarkClean entries are
                // never starved by a stream of writes.
                if self.entries() >= self.limit || self.data.len() >= self.data_limit() {
                    return false;
                }
                self.data.push((block, kind, crc));
                self.map.insert(block, self.data.len() - 1);
                self.data.len() - 1
            }
        };
        self.buf[(1 + i) * bs..(2 + i) * bs].copy_from_slice(data);
        self.first_staged_ns.get_or_insert(now_ns);
        true
    }

    /// Drops a staged block (TRIM), moving the last data block into its place.
    fn remove(&mut self, block: u64, bs: usize) -> bool {
        let Some(i) = self.map.remove(&block) else { return false };
        let last = self.data.len() - 1;
        if i != last {
            self.buf.copy_within((1 + last) * bs..(2 + last) * bs, (1 + i) * bs);
            self.data[i] = self.data[last];
            self.map.insert(self.data[i].0, i);
        }
        self.data.pop();
        true
    }
}

/// The log writer's buffers, owned by its lock: the next staging buffer, and the buffer in
/// which reclaim assembles the record of blocks it copies forward.
struct IoBuffers {
    spare: Option<AlignedBuf>,
    copy: AlignedBuf,
}

/// A sealed record whose write is in progress (or failed): reads are served from it.
struct Inflight {
    buf: Arc<AlignedBuf>,
    /// The sealed data entries (recycled into staging once written).
    data: Vec<(u64, EntryKind, u32)>,
    /// Backing block -> data index.
    map: HashMap<u64, usize>,
}

/// Counters, reported by `status`.
#[derive(Debug, Clone, Copy, Default, Serialize, serde::Deserialize)]
pub struct Counters {
    pub read_requests: u64,
    pub write_requests: u64,
    pub flush_requests: u64,
    pub read_hit_blocks: u64,
    pub read_miss_blocks: u64,
    pub admitted_blocks: u64,
    pub written_blocks: u64,
    pub records_written: u64,
    pub cache_flushes: u64,
    pub destaged_blocks: u64,
    pub backing_flushes: u64,
    pub reclaimed_blocks: u64,
    /// Live dirty blocks that reclaim moved to the tail instead of writing them back.
    pub copied_forward_blocks: u64,
    pub evicted_blocks: u64,
    pub checkpoints: u64,
    pub repaired_blocks: u64,
    pub throttled_writes: u64,
}

struct State {
    index: Index,
    staging: Staging,
    inflight: Option<Inflight>,
    /// Oldest live log position (everything below it may be overwritten).
    head: u64,
    /// Next log position to write (a record boundary).
    tail: u64,
    next_seq: u64,
    last_header_crc: u32,
    /// Staging buffers sealed into records so far, and how many of those are durable. FLUSH
    /// compares these (not sequence numbers, which reclaim markers also consume).
    sealed: u64,
    durable_sealed: u64,
    /// The highest record sequence known durable (written before a completed cache flush);
    /// each record carries it (`durable_back`) as evidence for recovery.
    durable_seq: u64,
    /// Where the last completed record write ends: log walkers never read past it (a record
    /// between here and `tail` is still being written).
    written_tail: u64,
    /// The background pre-cleaner has looked at every record before this position.
    precleaned_until: u64,
    checkpoint_position: u64,
    /// The position of the checkpoint before it (in the other area): recovery falls back to
    /// it if the newest one is unreadable.
    older_checkpoint_position: u64,
    checkpoint_seq: u64,
    pending_meta: VecDeque<RecordEntry>,
    /// Emptied containers of the last written record, reused by the next seal.
    spare_data: Vec<(u64, EntryKind, u32)>,
    spare_map: HashMap<u64, usize>,
    /// Read-miss fills in flight: block -> (readers, cancelled by a write or trim).
    fills: HashMap<u64, (u32, bool)>,
    /// Dirty blocks whose only copy failed its checksum: reads fail until a record holding
    /// newer data of the block is written (see `Lost`).
    lost: BTreeMap<u64, Lost>,
    /// The epoch of the records this run writes (one more than recovery found).
    epoch: u64,
    poisoned: Option<String>,
    /// (log position, clock ns) of recent records, to date the oldest dirty block.
    age_samples: VecDeque<(u64, u64)>,
    counters: Counters,
    destaging: bool,
}

impl State {
    fn check_poisoned(&self) -> Result<()> {
        match &self.poisoned {
            Some(reason) => Err(EngineError::Poisoned { reason: reason.clone() }),
            None => Ok(()),
        }
    }

    fn poison(&mut self, reason: String) {
        if self.poisoned.is_none() {
            tracing::error!(%reason, "volume failed; writes refused from now on");
            self.poisoned = Some(reason);
        }
    }

    fn cancel_fill(&mut self, block: u64) {
        if let Some(f) = self.fills.get_mut(&block) {
            f.1 = true;
        }
    }

    /// One reader is done with its fill of `block`; returns whether the fill was cancelled.
    fn end_fill(&mut self, block: u64) -> bool {
        let f = self.fills.get_mut(&block).expect("registered fill");
        f.0 -= 1;
        let cancelled = f.1;
        if f.0 == 0 {
            self.fills.remove(&block);
        }
        cancelled
    }
}

/// A lost block: its only dirty copy (at `position`) failed its checksum. It reads as an I/O
/// error until a record holding newer data of it is written; then the entry goes.
///
/// Durability (docs/format.md, "lost blocks"): the loss is written as a `Lost` entry into the
/// next record sealed (`logged`), and as a tombstone into every checkpoint while the entry
/// exists, so it survives the head passing `position` and any restart. A `Lost` entry is
/// never written after a record holding newer data of the block: the entry leaves this map
/// exactly when such a record is written, and a record never carries both (its own data
/// supersedes the loss).
#[derive(Debug, Clone, Copy)]
struct Lost {
    position: u64,
    /// The CRC of the lost version: if the backing device turns out to hold exactly it (a
    /// write-back whose MarkClean a crash dropped), the block is not lost after all.
    crc: u32,
    logged: Logged,
}

/// How far a loss has reached the medium.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Logged {
    /// Only in RAM.
    No,
    /// A `Lost` entry is in the staging record being sealed, not yet written: reclaim (which
    /// runs before that record is written) must still log it itself.
    Staged,
    /// A `Lost` entry is in a written record, or a checkpoint holds its tombstone.
    Yes,
}

/// A block picked for write-back, with the exact version it names: the log position of its
/// copy when the batch was taken. Positions never repeat (slots do, a lap later), so
/// "still current" is "the index still names this position".
#[derive(Debug, Clone, Copy)]
pub(crate) struct Picked {
    block: u64,
    entry: IndexEntry,
    position: u64,
}

/// Where a block's data was found when a read was planned.
enum Source {
    Copied,
    /// The index entry and its log position.
    Cache(IndexEntry, u64),
    Backing,
}

/// A hybrid volume. Cheap to share: wrap in an `Arc` and call from many threads.
pub struct Volume {
    pub(crate) cache: Arc<dyn BlockDevice>,
    pub(crate) backing: Arc<dyn BlockDevice>,
    clock: Arc<dyn Clock>,
    pub(crate) layout: Layout,
    uuid_low: u64,
    bs: usize,
    backing_blocks: u64,
    options: VolumeOptions,
    /// The log writer's lock; holds its buffers.
    io: Mutex<IoBuffers>,
    /// Most entries in a record (see `Staging::limit`).
    staging_limit: usize,
    /// The destager's lock; holds the elevator cursor.
    destage: Mutex<u64>,
    state: Mutex<State>,
    superblock: Mutex<Superblock>,
    /// Serialises read-modify-write of partial blocks (`write_bytes`).
    rmw: Mutex<()>,
    /// Dirty watermarks in blocks (fixed while open; copied so that no path takes the
    /// superblock lock while holding the state lock).
    dirty_low_blocks: u64,
    dirty_high_blocks: u64,
    /// The same in per mille of the log (for `status`).
    watermarks_permille: (u16, u16),
    background: AtomicBool,
    /// The background thread, woken when readers' admissions fill staging. (A std mutex: the
    /// simulator runs no background thread.)
    background_thread: std::sync::Mutex<Option<std::thread::Thread>>,
}

/// What recovery produced, handed to `Volume::assemble`.
pub(crate) struct Recovered {
    pub superblock: Superblock,
    pub index: Index,
    pub head: u64,
    pub tail: u64,
    pub next_seq: u64,
    pub last_header_crc: u32,
    pub checkpoint_position: u64,
    pub checkpoint_seq: u64,
    pub replayed_records: u64,
    /// Lost blocks (tombstones and Lost entries not superseded): block, position, CRC.
    pub lost: Vec<(u64, u64, u32)>,
    /// The highest epoch in the checkpoint and the replayed records.
    pub epoch: u64,
}

impl Volume {
    pub(crate) fn assemble(
        cache: Arc<dyn BlockDevice>,
        backing: Arc<dyn BlockDevice>,
        clock: Arc<dyn Clock>,
        r: Recovered,
        options: VolumeOptions,
    ) -> Volume {
        let layout = r.superblock.layout;
        let bs = layout.block_size as usize;
        assert!(layout.log_blocks <= tiercache_format::constants::MAX_LOG_BLOCKS);
        // A record, plus reclaim's reserve, must fit in a small part of the log.

        let staging_limit = RECORD_ENTRIES.min((layout.log_blocks / 8) as usize).max(2);
        let watermarks = options
            .dirty_watermarks_permille
            .unwrap_or((r.superblock.dirty_low_permille, r.superblock.dirty_high_permille));
        assert!(watermarks.0 <= watermarks.1 && watermarks.1 <= 1000, "dirty watermarks {watermarks:?}");
        Volume {
            cache,
            backing,
            clock,
            layout,
            uuid_low: uuid_low64(&r.superblock.uuid),
            bs,
            backing_blocks: r.superblock.backing_size_bytes / bs as u64,
            options,
            io: Mutex::new(IoBuffers {
                spare: Some(AlignedBuf::new(bs * MAX_RECORD_BLOCKS as usize)),
                copy: AlignedBuf::new(bs * MAX_RECORD_BLOCKS as usize),
            }),
            staging_limit,
            destage: Mutex::new(0),
            state: Mutex::new(State {
                index: r.index,
                staging: Staging::new(bs, staging_limit),
                inflight: None,
                head: r.head,
                tail: r.tail,
                next_seq: r.next_seq,
                last_header_crc: r.last_header_crc,
                sealed: 0,
                durable_sealed: 0,
                durable_seq: 0,
                written_tail: r.tail,
                precleaned_until: r.head,
                checkpoint_position: r.checkpoint_position,
                older_checkpoint_position: 0,
                checkpoint_seq: r.checkpoint_seq,
                pending_meta: VecDeque::new(),
                spare_data: Vec::with_capacity(RECORD_ENTRIES),
                spare_map: HashMap::with_capacity(RECORD_ENTRIES),
                fills: HashMap::new(),
                lost: r
                    .lost
                    .iter()
                    .map(|&(b, position, crc)| (b, Lost { position, crc, logged: Logged::Yes }))
                    .collect(),
                epoch: r.epoch,
                poisoned: None,
                age_samples: VecDeque::new(),
                counters: Counters::default(),
                destaging: false,
            }),
            dirty_low_blocks: layout.log_blocks * u64::from(watermarks.0) / 1000,
            dirty_high_blocks: layout.log_blocks * u64::from(watermarks.1) / 1000,
            watermarks_permille: watermarks,
            superblock: Mutex::new(r.superblock),
            rmw: Mutex::new(()),
            background: AtomicBool::new(false),
            background_thread: std::sync::Mutex::new(None),
        }
    }

    /// Ends the losses the backing device turns out to hold (open calls it, with the backing
    /// device attached): a lost version that a write-back had already put there.
    pub(crate) fn recheck_lost_against_backing(&self) {
        let candidates: Vec<(u64, u32)> = self.lock().lost.iter().map(|(&b, l)| (b, l.crc)).collect();
        let mut buf = AlignedBuf::new(self.bs);
        for (block, crc) in candidates {
            if self.backing_holds(block, crc, &mut buf) {
                tracing::warn!(block, "a lost block's version is on the backing device: readable again");
                self.lock().lost.remove(&block);
            }
        }
    }

    /// Starts the epoch of this run (recovery calls it before its checkpoint).
    pub(crate) fn begin_epoch(&self) {
        if !sabotaged!(self, NoRecoveryEpoch) {
            self.lock().epoch += 1;
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().expect("volume state lock poisoned by a panic")
    }

    /// The volume's size: the backing device's.
    pub fn size_bytes(&self) -> u64 {
        self.backing_blocks * self.bs as u64
    }

    /// The volume's block size (requests must be aligned to it).
    pub fn block_size(&self) -> u32 {
        self.layout.block_size
    }

    pub fn superblock(&self) -> Superblock {
        self.superblock.lock().expect("superblock lock").clone()
    }

    fn check_request(&self, offset: u64, len: u64) -> Result<()> {
        let bs = self.bs as u64;
        if !offset.is_multiple_of(bs) || !len.is_multiple_of(bs) {
            return Err(EngineError::Misaligned { offset, len, block_size: self.layout.block_size });
        }
        match offset.checked_add(len) {
            Some(end) if end <= self.size_bytes() => Ok(()),
            _ => Err(EngineError::OutOfRange { offset, len, size_bytes: self.size_bytes() }),
        }
    }

    // ---------------------------------------------------------------- log I/O helpers

    /// Writes whole blocks at a logical log position, splitting at the physical end.
    fn write_log(&self, pos: u64, buf: &[u8]) -> std::result::Result<(), tiercache_device::DeviceError> {
        let first = self.layout.blocks_before_wrap(pos, (buf.len() / self.bs) as u64) as usize * self.bs;
        self.cache.write_at(self.layout.log_offset(pos), &buf[..first])?;
        if first < buf.len() {
            self.cache.write_at(self.layout.log_offset(pos + (first / self.bs) as u64), &buf[first..])?;
        }
        Ok(())
    }

    /// Reads the blocks in log slots `slots` into `out` (block `k` from `slots[k]`), with one
    /// I/O per run of consecutive slots, in slot order whatever order `slots` is in: write-back
    /// batches and copy-forward read whole stretches of the log, not 4 KiB at a time.
    fn read_slots(&self, slots: &[u32], out: &mut [u8]) -> std::result::Result<(), tiercache_device::DeviceError> {
        let bs = self.bs;
        let mut order: Vec<usize> = (0..slots.len()).collect();
        order.sort_unstable_by_key(|&k| slots[k]);
        let mut scratch: Option<AlignedBuf> = None;
        let mut i = 0;
        while i < order.len() {
            let start = i;
            i += 1;
            while i < order.len() && slots[order[i]] == slots[order[start]] + (i - start) as u32 {
                i += 1;
            }
            let run = &order[start..i];
            let offset = self.layout.log_offset(u64::from(slots[run[0]]));
            if run.windows(2).all(|w| w[1] == w[0] + 1) {
                // Laid out in `out` as on the device: read in place.
                self.cache.read_at(offset, &mut out[run[0] * bs..(run[0] + run.len()) * bs])?;
                continue;
            }
            if scratch.as_ref().is_none_or(|b| b.len() < run.len() * bs) {
                scratch = Some(AlignedBuf::new(run.len() * bs));
            }
            let scratch = scratch.as_mut().expect("allocated above");
            self.cache.read_at(offset, &mut scratch[..run.len() * bs])?;
            for (j, &k) in run.iter().enumerate() {
                out[k * bs..(k + 1) * bs].copy_from_slice(&scratch[j * bs..(j + 1) * bs]);
            }
        }
        Ok(())
    }

    /// Reads whole blocks at a logical log position, splitting at the physical end.
    pub(crate) fn read_log(&self, pos: u64, buf: &mut [u8]) -> Result<()> {
        read_log(&*self.cache, &self.layout, pos, buf)
    }

    // ---------------------------------------------------------------- write path

    /// Writes whole blocks. Complete on return; durable after the next `flush`.
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.check_request(offset, data.len() as u64)?;
        self.backpressure();
        let first = offset / self.bs as u64;
        for (i, chunk) in data.chunks(self.bs).enumerate() {
            let block = first + i as u64;
            let crc = checksum(chunk);
            loop {
                let mut st = self.lock();
                st.check_poisoned()?;
                let now = self.clock.now_ns();
                st.cancel_fill(block);
                // A lost block stays lost until this write is in a written record (see `Lost`).
                if st.staging.put(block, EntryKind::DataDirty, chunk, crc, now) {
                    st.counters.written_blocks += 1;
                    break;
                }
                drop(st);
                self.commit()?;
            }
        }
        self.lock().counters.write_requests += 1;
        Ok(())
    }

    /// A write that is durable on return (Force Unit Access): a write, then a flush.
    pub fn write_fua(&self, offset: u64, data: &[u8]) -> Result<()> {
        self.write(offset, data)?;
        self.flush()
    }

    /// Reads any byte range (frontends whose clients may send sub-block requests): whole
    /// blocks are read and the requested bytes copied out.
    pub fn read_bytes(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        let (start, end) = self.aligned_span(offset, buf.len() as u64)?;
        if start == offset && end == offset + buf.len() as u64 {
            return self.read(offset, buf);
        }
        let mut whole = vec![0u8; (end - start) as usize];
        self.read(start, &mut whole)?;
        let at = (offset - start) as usize;
        buf.copy_from_slice(&whole[at..at + buf.len()]);
        Ok(())
    }

    /// Writes any byte range: partial first and last blocks are read, modified and written
    /// (serialised among themselves; overlapping concurrent writes have no defined order on a
    /// disk either).
    pub fn write_bytes(&self, offset: u64, data: &[u8]) -> Result<()> {
        let (start, end) = self.aligned_span(offset, data.len() as u64)?;
        if start == offset && end == offset + data.len() as u64 {
            return self.write(offset, data);
        }
        let _rmw = self.rmw.lock().expect("rmw lock");
        let mut whole = vec![0u8; (end - start) as usize];
        let bs = self.bs as u64;
        self.read(start, &mut whole[..self.bs])?;
        if end - start > bs {
            let last = whole.len() - self.bs;
            self.read(end - bs, &mut whole[last..])?;
        }
        let at = (offset - start) as usize;
        whole[at..at + data.len()].copy_from_slice(data);
        self.write(start, &whole)
    }

    /// The block-aligned span covering a byte range, checked against the volume's size.
    fn aligned_span(&self, offset: u64, len: u64) -> Result<(u64, u64)> {
        let bs = self.bs as u64;
        let end = offset.checked_add(len).filter(|&e| e <= self.size_bytes());
        let Some(end) = end else {
            return Err(EngineError::OutOfRange { offset, len, size_bytes: self.size_bytes() });
        };
        Ok((offset / bs * bs, end.div_ceil(bs) * bs))
    }

    /// Writes zeroes over any byte range (NBD WRITE_ZEROES): ordinary writes of zero blocks.
    pub fn write_zeroes(&self, offset: u64, len: u64) -> Result<()> {
        self.aligned_span(offset, len)?;
        // Any byte range: partial edge blocks are read-modified-written by `write_bytes`.
        let chunk = (RECORD_ENTRIES * self.bs) as u64;
        let zeroes = vec![0u8; chunk.min(len) as usize];
        let mut done = 0;
        while done < len {
            let n = chunk.min(len - done);
            self.write_bytes(offset + done, &zeroes[..n as usize])?;
            done += n;
        }
        Ok(())
    }

    /// Makes every write completed before this call durable. Concurrent callers share one
    /// record write and one cache-device flush (group commit).
    pub fn flush(&self) -> Result<()> {
        let target = {
            let mut st = self.lock();
            st.check_poisoned()?;
            st.counters.flush_requests += 1;
            st.sealed + u64::from(st.staging.has_dirty())
        };
        let mut io = self.io.lock().expect("io lock");
        {
            let st = self.lock();
            st.check_poisoned()?;
            if st.durable_sealed >= target {
                return Ok(()); // a flush that started after our writes already covered them
            }
        }
        self.write_out(&mut io)?;
        self.flush_cache(sabotaged!(self, FlushSkipsCacheFlush))
    }

    /// Flushes the cache device; afterwards every record written so far is durable.
    /// Called with the io lock held.
    fn flush_cache(&self, skip: bool) -> Result<()> {
        // With the io lock held no record write is in progress: every sequence below
        // `next_seq` has been written and this flush covers it.
        let (upto, written_seq) = {
            let st = self.lock();
            (st.sealed, st.next_seq - 1)
        };
        if !skip {
            if let Err(e) = self.cache.flush() {
                let e = EngineError::cache(e);
                self.lock().poison(format!("flushing the cache device failed: {e}"));
                return Err(e);
            }
        }
        let mut st = self.lock();
        // Another thread's failed write or flush poisons the volume: a later successful flush
        // must not report durability (no retried fsync).
        st.check_poisoned()?;
        st.durable_sealed = st.durable_sealed.max(upto);
        if !skip {
            st.durable_seq = st.durable_seq.max(written_seq);
        }
        st.counters.cache_flushes += 1;
        Ok(())
    }

    /// Seals and writes whatever is staged (no flush).
    fn commit(&self) -> Result<()> {
        let mut io = self.io.lock().expect("io lock");
        self.write_out(&mut io)
    }

    /// Seals the staging buffer into a record and writes it at the tail, reclaiming space
    /// first if needed. Called with the io lock held (`io` is the lock's content).
    fn write_out(&self, io: &mut IoBuffers) -> Result<()> {
        let bs = self.bs;
        let log_blocks = self.layout.log_blocks;
        let mut st = loop {
            let mut st = self.lock();
            st.check_poisoned()?;
            self.stage_lost_entries(&mut st);
            while st.staging.entries() < st.staging.limit {
                match st.pending_meta.pop_front() {
                    Some(m) => st.staging.meta.push(m),
                    None => break,
                }
            }
            if st.staging.is_empty() {
                return Ok(());
            }
            let blocks = 1 + st.staging.data.len() as u64;
            let need = blocks + self.reclaim_reserve();
            if st.tail + need <= st.head + log_blocks {
                break st;
            }
            drop(st);
            self.reclaim(io, need)?;
        };
        let blocks = 1 + st.staging.data.len() as u64;
        let pos = st.tail;
        let header = RecordHeader {
            sequence: st.next_seq,
            position: pos,
            head_position: st.head,
            prev_checksum: st.last_header_crc,
            epoch: st.epoch,
            durable_back: RecordHeader::durable_back_for(st.next_seq, st.durable_seq),
            // Metadata first: a TRIM or MarkClean was queued before any data of the same block
            // staged after it, and replay applies entries in order.
            entries: st
                .staging
                .meta
                .iter()
                .copied()
                .chain(st.staging.data.iter().map(|&(b, kind, crc)| RecordEntry {
                    kind,
                    backing_block: b,
                    data_crc: crc,
                    ref_position: 0,
                }))
                .collect(),
        };
        let crc = header.encode(self.uuid_low, &mut st.staging.buf[..bs]);
        let header_losses: Vec<u64> =
            header.entries.iter().filter(|e| e.kind == EntryKind::Lost).map(|e| e.backing_block).collect();
        // Swap the sealed buffer out for the spare one; staging starts empty.
        let fresh = io.spare.take().expect("spare record buffer present while not poisoned");
        let buf = Arc::new(std::mem::replace(&mut st.staging.buf, fresh)); // The containers swap with the previous record's (recycled, so no allocation here).

        let (spare_data, spare_map) = (std::mem::take(&mut st.spare_data), std::mem::take(&mut st.spare_map));
        let data = std::mem::replace(&mut st.staging.data, spare_data);
        let map = std::mem::replace(&mut st.staging.map, spare_map);
        st.staging.meta.clear();
        st.staging.first_staged_ns = None;
        st.inflight = Some(Inflight { buf: Arc::clone(&buf), data, map });
        st.tail = pos + blocks;
        st.next_seq += 1;
        st.sealed += 1;
        st.last_header_crc = crc;
        let now = self.clock.now_ns();
        if st.age_samples.back().is_none_or(|&(_, t)| now > t + 1_000_000) {
            if st.age_samples.len() == AGE_SAMPLES {
                st.age_samples.pop_front();
            }
            st.age_samples.push_back((pos, now));
        }
        debug_assert!(st.tail + self.reclaim_reserve() <= st.head + log_blocks, "the reclaim reserve stays free");
        drop(st);

        let result = self.write_log(pos, &buf[..blocks as usize * bs]);
        let mut st = self.lock();
        if let Err(e) = result {
            // The record stays in `inflight`: reads keep seeing its data; nothing more is written.

            let e = EngineError::cache(e);
            st.poison(format!("writing a log record failed: {e}"));
            return Err(e);
        }
        st.written_tail = pos + blocks;
        for e in header_losses {
            if let Some(l) = st.lost.get_mut(&e) {
                if l.logged == Logged::Staged {
                    l.logged = Logged::Yes;
                }
            }
        }
        let mut inflight = st.inflight.take().expect("inflight record");
        for (k, &(block, kind, crc)) in inflight.data.iter().enumerate() {
            if inflight.map.get(&block) == Some(&k) {
                let slot = self.layout.slot(pos + 1 + k as u64);
                st.index
                    .insert(block, IndexEntry { slot, dirty: kind == EntryKind::DataDirty, referenced: false, crc });
                if kind == EntryKind::DataDirty {
                    // Newer data of a lost block is now in a written record: the loss is over,
                    // and no Lost entry for it may be written after this record.
                    st.lost.remove(&block);
                }
            }
        }
        st.counters.records_written += 1;
        inflight.data.clear();
        inflight.map.clear();
        st.spare_data = std::mem::take(&mut inflight.data);
        st.spare_map = std::mem::take(&mut inflight.map);
        drop(inflight);
        io.spare = Some(Arc::try_unwrap(buf).expect("no other owner of a written record buffer"));
        let due = st.tail - st.checkpoint_position > log_blocks * self.options.checkpoint_interval_permille / 1000;
        drop(st);
        if due {
            self.checkpoint_locked()?;
        }
        Ok(())
    }

    /// Puts the Lost entries not yet logged into the staging record being sealed (metadata
    /// goes first in a record). A block with data in this same record is skipped: that data
    /// supersedes the loss, and its entry leaves `lost` when the record is written.
    fn stage_lost_entries(&self, st: &mut State) {
        if sabotaged!(self, LostInRamOnly) || st.lost.values().all(|l| l.logged != Logged::No) {
            return;
        }
        let State { lost, staging, .. } = st;
        for (&block, l) in lost.iter_mut() {
            if staging.entries() >= staging.limit {
                break;
            }
            let superseded = staging.map.get(&block).is_some_and(|&i| staging.data[i].1 == EntryKind::DataDirty);
            if l.logged != Logged::No || superseded {
                continue;
            }
            staging.meta.push(RecordEntry {
                kind: EntryKind::Lost,
                backing_block: block,
                data_crc: l.crc,
                ref_position: l.position,
            });
            l.logged = Logged::Staged;
        }
    }

    /// The log position of an index entry's copy (entries name slots in `[head, tail)`).
    fn position_of(&self, st: &State, e: &IndexEntry) -> u64 {
        self.layout.position_of_slot(e.slot, st.tail)
    }

    /// Declares the copy of `block` at `position` lost: its checksum failed and it was the
    /// only copy of dirty data. The caller checked, under this same lock, that the index
    /// still names that position and that no newer data of the block is in flight. The
    /// block reads as an I/O error until rewritten (unless staging already holds newer data).
    fn declare_lost(&self, st: &mut State, block: u64, position: u64, crc: u32) {
        debug_assert!(st.inflight.as_ref().is_none_or(|f| !f.map.contains_key(&block)));
        st.index.remove(block);
        st.cancel_fill(block);
        tracing::error!(block, position, "dirty block failed its checksum on the cache device: lost");
        st.lost.insert(block, Lost { position, crc, logged: Logged::No });
        let limit = Layout::max_lost_blocks_for(self.layout.log_blocks) as usize;
        if st.lost.len() > limit {
            st.poison(format!("more than {limit} blocks lost to checksum failures: the cache device is failing"));
        }
    }

    /// Whether the backing device durably holds exactly the version with CRC `crc` of
    /// `block` (then a dirty copy that fails its checksum is not a loss: it was written back,
    /// and a crash dropped the MarkClean entry that said so). A read sees the backing
    /// device's volatile cache too: the version read may be a write-back still waiting for
    /// its backing flush, which a crash would drop, so a match is flushed before it counts
    /// (the copy is forgotten on the strength of it). Reads into `buf`.
    ///
    /// Callers that act on the answer hold the destage lock from this check until they have
    /// acted: otherwise a write-back batch that took an older version of the block could
    /// write it after the check (a rewrite with the backing device's own content, zeroes
    /// say, makes the check succeed), and the forgotten block would read the older data.
    fn backing_holds(&self, block: u64, crc: u32, buf: &mut [u8]) -> bool {
        self.backing.read_at(block * self.bs as u64, buf).is_ok()
            && checksum(buf) == crc
            && self.backing.flush().is_ok()
    }

    /// A dirty copy failed its checksum but the backing device holds that very version:
    /// forget the copy (reads go to the backing device). No record is needed: after a crash
    /// the copy is found bad and checked against the backing device again.
    fn repaired_from_backing(&self, st: &mut State, block: u64, position: u64) {
        st.index.remove(block);
        st.counters.repaired_blocks += 1;
        tracing::warn!(block, position, "dirty block failed its checksum but the backing device holds that version");
    }

    /// Frees at least `need` blocks at the head of the log (io lock held).
    fn reclaim(&self, io: &mut IoBuffers, need: u64) -> Result<()> {
        let bs = self.bs;
        let started = std::time::Instant::now();
        let (head, tail, mut checkpoint) = {
            let st = self.lock();
            (st.head, st.tail, st.checkpoint_position)
        };
        let free = head + self.layout.log_blocks - tail;
        assert!(free >= self.reclaim_reserve(), "the writer keeps {} blocks free for reclaim", self.reclaim_reserve());
        let want = u64::from(self.layout.segment_blocks).max(need.saturating_sub(free));
        let target = (head + want).min(tail);
        if target > checkpoint {
            // The head may not pass the durable checkpoint: replay starts there.
            self.checkpoint_locked()?;
            checkpoint = self.lock().checkpoint_position;
        }
        assert!(target <= checkpoint, "checkpoint at {checkpoint} behind reclaim target {target}");

        // Every slot in [head, target) still named by the index holds a live block (the index's
        // reverse map: no I/O).

        // (No record write can run meanwhile: this thread holds the io lock. So the index
        // entries below keep naming the same positions until this function changes them.)
        let picked = |st: &State, from: u64, until: u64| self.live_between(st, from, until).collect::<Vec<_>>();
        let (new_head, live) = {
            let st = self.lock();
            let mut target = target;
            // Whole segments beyond the target that hold no dirty block are reclaimed too, up
            // to an eighth of the log: evicting clean data costs no I/O but this reclaim's
            // record and cache flush, and a wider window pays that once for many segments (a
            // writer meeting a cache full of clean data runs at the empty-cache rate).
            let seg = u64::from(self.layout.segment_blocks);
            let limit = (head + self.layout.log_blocks / 8).min(tail).min(checkpoint);
            while target + seg <= limit && picked(&st, target, target + seg).iter().all(|p| !p.entry.dirty) {
                target += seg;
            }
            (target, picked(&st, head, target))
        };
        let mut dirty: Vec<Picked> = live.iter().filter(|p| p.entry.dirty).copied().collect();
        if dirty.len() > self.copy_forward_max() {
            // Mostly dirty: the cache is full of data not yet written back, and the pre-cleaner
            // is behind. Write it back now, with the dirty blocks of the next few segments in
            // the same batch (one backing flush for all of them, and the next reclaims find
            // them clean): this is the backpressure a writer feels when write-back has fallen
            // behind, paid in large batches rather than a flush per segment.

            let _destage = self.destage.lock().expect("destage lock");
            let ahead = {
                let st = self.lock();
                let until = (new_head + PRECLEAN_SEGMENTS * u64::from(self.layout.segment_blocks)).min(st.tail);
                picked(&st, new_head, until)
            };
            let room = DESTAGE_BATCH_BLOCKS.saturating_sub(dirty.len());
            dirty.extend(ahead.into_iter().filter(|p| p.entry.dirty).take(room));
            self.destage_blocks(dirty.clone())?;
            dirty.clear();
        }
        // Copy the live dirty blocks forward (cache bandwidth only; the backing device is not
        // touched): read and verify them into the copy record's buffer.

        let mut copies: Vec<Picked> = Vec::with_capacity(dirty.len());
        let slots: Vec<u32> = dirty.iter().map(|p| p.entry.slot).collect();
        if let Err(err) = self.read_slots(&slots, &mut io.copy[bs..(1 + dirty.len()) * bs]) {
            let err = EngineError::cache(err);
            self.lock().poison(format!("reading blocks to copy forward failed: {err}"));
            return Err(err);
        }
        for (i, p) in dirty.into_iter().enumerate() {
            // Verified blocks are packed to the front of the record as they are kept.
            let k = copies.len();
            if k != i {
                io.copy.copy_within((1 + i) * bs..(2 + i) * bs, (1 + k) * bs);
            }
            let out = &mut io.copy[(1 + k) * bs..(2 + k) * bs];
            if checksum(out) == p.entry.crc {
                copies.push(p);
                continue;
            }
            // (io -> destage is the lock order; a write-back batch never waits for the io lock.)
            let _destage = self.destage.lock().expect("destage lock");
            let on_backing = self.backing_holds(p.block, p.entry.crc, out);
            let mut st = self.lock();
            // (Still dirty: the batch waited for may have written this very version back;
            // then the bad copy is a clean one, evicted below.)
            if st.index.get(p.block).is_some_and(|c| c.dirty && self.position_of(&st, &c) == p.position) {
                if on_backing {
                    self.repaired_from_backing(&mut st, p.block, p.position);
                } else {
                    self.declare_lost(&mut st, p.block, p.position, p.entry.crc);
                }
            }
        }
        // Every loss not yet in a written record goes into the copy record (below), because
        // the head is about to pass blocks that recovery would otherwise replay as dirty (or,
        // once passed, forget, serving the stale backing copy). If they do not all fit, a
        // checkpoint (which holds every loss as a tombstone) makes them durable first.
        let unlogged = self.lock().lost.values().filter(|l| l.logged != Logged::Yes).count();
        if unlogged + copies.len() > RECORD_ENTRIES && !sabotaged!(self, LostInRamOnly) {
            self.checkpoint_locked()?;
        }
        let copied: HashSet<u64> = copies.iter().map(|p| p.block).collect();
        // The copy record also carries the new head: made durable before any of the reclaimed
        // space is overwritten. It lands in the reserve the writer keeps free.

        let (pos, blocks) = {
            let mut st = self.lock();
            for p in &live {
                if copied.contains(&p.block) {
                    continue;
                }
                if let Some(old) = st.index.remove_if_slot(p.block, p.entry.slot) {
                    assert!(!old.dirty, "block {} still dirty at reclaim", p.block);
                    st.counters.evicted_blocks += 1;
                }
            }
            st.counters.reclaimed_blocks += new_head - head;
            st.counters.copied_forward_blocks += copies.len() as u64;
            let mut entries = Vec::with_capacity(RECORD_ENTRIES);
            if !sabotaged!(self, LostInRamOnly) {
                // Losses inside the window the head is about to pass first: those must be in
                // this record. More losses may have been declared during the checkpoint above
                // (readers, the destager); the ones that do not fit stay unlogged, which is
                // safe as long as they lie beyond the window (a later record or checkpoint
                // logs them before the head reaches them).
                let room = RECORD_ENTRIES - copies.len();
                let mut pending: Vec<(u64, u64, u32)> = st
                    .lost
                    .iter()
                    .filter(|(_, l)| l.logged != Logged::Yes)
                    .map(|(&b, l)| (b, l.position, l.crc))
                    .collect();
                pending.sort_by_key(|&(b, position, _)| (position >= new_head, b));
                // (Losses inside the window beyond `room` can only be blocks a reader declared
                // lost after their copy, read good above, went into this record: the copy
                // supersedes them on replay.)
                pending.truncate(room);
                for (block, position, crc) in pending {
                    entries.push(RecordEntry {
                        kind: EntryKind::Lost,
                        backing_block: block,
                        data_crc: crc,
                        ref_position: position,
                    });
                    st.lost.get_mut(&block).expect("listed").logged = Logged::Yes;
                }
            }
            while entries.len() + copies.len() < RECORD_ENTRIES {
                match st.pending_meta.pop_front() {
                    Some(m) => entries.push(m),
                    None => break,
                }
            }
            entries.extend(copies.iter().map(|p| RecordEntry {
                kind: EntryKind::DataDirty,
                backing_block: p.block,
                data_crc: p.entry.crc,
                ref_position: 0,
            }));
            let pos = st.tail;
            let blocks = 1 + copies.len() as u64;
            assert!(pos + blocks <= head + self.layout.log_blocks, "the copy record fits in the reserve");
            let header = RecordHeader {
                sequence: st.next_seq,
                position: pos,
                head_position: new_head,
                prev_checksum: st.last_header_crc,
                epoch: st.epoch,
                durable_back: RecordHeader::durable_back_for(st.next_seq, st.durable_seq),
                entries,
            };
            st.last_header_crc = header.encode(self.uuid_low, &mut io.copy[..bs]);
            st.tail += blocks;
            st.next_seq += 1;
            (pos, blocks)
        };
        if let Err(e) = self.write_log(pos, &io.copy[..blocks as usize * bs]) {
            let e = EngineError::cache(e);
            self.lock().poison(format!("writing a reclaim record failed: {e}"));
            return Err(e);
        }
        self.lock().written_tail = pos + blocks;
        self.flush_cache(sabotaged!(self, ReclaimSkipsMarkerFlush))?;
        tracing::debug!(
            head,
            new_head,
            live = live.len(),
            copied = copies.len(),
            elapsed_us = started.elapsed().as_micros() as u64,
            "reclaim"
        );
        let mut st = self.lock();
        st.head = new_head;
        for (k, p) in copies.iter().enumerate() {
            if let Some(current) = st.index.get(p.block) {
                if current.slot == p.entry.slot {
                    let slot = self.layout.slot(pos + 1 + k as u64);
                    st.index.insert(
                        p.block,
                        IndexEntry { slot, dirty: current.dirty, referenced: current.referenced, crc: p.entry.crc },
                    );
                }
            }
        }
        Ok(())
    }

    /// The blocks whose current copy lies at log positions `[from, until)`, in position order
    /// (the index's reverse map: no I/O).
    fn live_between<'a>(&'a self, st: &'a State, from: u64, until: u64) -> impl Iterator<Item = Picked> + 'a {
        (from..until).filter_map(move |position| {
            let (block, entry) = st.index.owner(self.layout.slot(position))?;
            Some(Picked { block, entry, position })
        })
    }

    /// The most live dirty blocks a reclaim copies forward instead of writing them back: half
    /// a segment (more means the cache is mostly dirty, and writing back is the right cost),
    /// and no more than a record holds.
    fn copy_forward_max(&self) -> usize {
        (self.layout.segment_blocks as usize / 2).min(self.staging_limit)
    }

    /// Blocks the writer keeps free at the tail for reclaim's copy record.
    fn reclaim_reserve(&self) -> u64 {
        1 + self.copy_forward_max() as u64
    }

    /// Reads record headers from `from` (a record boundary) until reaching `until`; calls
    /// `visit` for each; returns the first boundary at or after `until`.
    pub(crate) fn walk_records(&self, from: u64, until: u64, mut visit: impl FnMut(u64, &RecordHeader)) -> Result<u64> {
        let mut pos = from;
        let mut block = AlignedBuf::new(self.bs);
        while pos < until {
            self.read_log(pos, &mut block).inspect_err(|e| {
                self.lock().poison(format!("reading a log record header failed: {e}"));
            })?;
            let header = match RecordHeader::decode(&block, self.uuid_low) {
                Ok(h) if h.position == pos => h,
                Ok(h) => {
                    return Err(self.corrupt(format!("record at log position {pos} claims position {}", h.position)))
                }
                Err(e) => return Err(self.corrupt(format!("record header at log position {pos}: {e}"))),
            };
            visit(pos, &header);
            pos += header.total_blocks();
        }
        Ok(pos)
    }

    fn corrupt(&self, what: String) -> EngineError {
        self.lock().poison(format!("cache metadata is corrupt: {what}"));
        EngineError::Corrupt(what)
    }

    // ---------------------------------------------------------------- checkpoint

    /// Writes a checkpoint (call with the io lock held, so no record write is in flight).
    pub(crate) fn checkpoint_locked(&self) -> Result<()> {
        // The records the checkpoint summarises must be durable before it is: otherwise the
        // device could keep the checkpoint and drop a record whose data it points at.
        self.flush_cache(false)?;
        let (snapshot, tombstones, mut header) = {
            let st = self.lock();
            st.check_poisoned()?;
            let snapshot: Vec<(u64, IndexEntry)> = st.index.iter().collect();
            // Every lost block, logged or not: a checkpoint replaces the records before it.
            let tombstones: Vec<(u64, u32)> = if sabotaged!(self, LostInRamOnly) {
                Vec::new()
            } else {
                st.lost.iter().map(|(&b, l)| (b, l.crc)).collect()
            };
            let header = CheckpointHeader {
                sequence: st.checkpoint_seq + 1,
                log_position: st.tail,
                next_record_sequence: st.next_seq,
                head_position: st.head,
                entry_count: (snapshot.len() + tombstones.len()) as u64,
                entries_crc: 0,
                prev_record_checksum: st.last_header_crc,
                epoch: st.epoch,
            };
            (snapshot, tombstones, header)
        };
        assert!(header.entry_count <= self.layout.checkpoint_capacity(), "checkpoint over capacity");
        let bs = self.bs;
        let entry_bytes = header.entry_count as usize * tiercache_format::constants::CHECKPOINT_ENTRY_SIZE;
        let blocks = 1 + entry_bytes.div_ceil(bs);
        assert!(blocks as u64 <= self.layout.checkpoint_area_blocks);
        let mut buf = AlignedBuf::new(blocks * bs);
        let entries = snapshot
            .iter()
            .map(|(block, e)| CheckpointEntry {
                backing_block: *block,
                slot: e.slot,
                dirty: e.dirty,
                lost: false,
                data_crc: e.crc,
            })
            .chain(tombstones.iter().map(|&(block, crc)| CheckpointEntry {
                backing_block: block,
                slot: 0,
                dirty: false,
                lost: true,
                data_crc: crc,
            }));
        for (i, entry) in entries.enumerate() {
            let at = bs + i * tiercache_format::constants::CHECKPOINT_ENTRY_SIZE;
            entry.encode(&mut buf[at..]);
        }
        header.entries_crc = checksum(&buf[bs..bs + entry_bytes]);
        header.encode(self.uuid_low, &mut buf[..bs]);
        let area = self.layout.checkpoint_area_start[(header.sequence % 2) as usize];
        if let Err(e) = self.cache.write_at(area * bs as u64, &buf) {
            let e = EngineError::cache(e);
            self.lock().poison(format!("writing a checkpoint failed: {e}"));
            return Err(e);
        }
        self.flush_cache(false)?;
        let mut st = self.lock();
        st.older_checkpoint_position = st.checkpoint_position;
        st.checkpoint_position = header.log_position;
        st.checkpoint_seq = header.sequence;
        st.counters.checkpoints += 1;
        for (block, _) in tombstones {
            if let Some(l) = st.lost.get_mut(&block) {
                l.logged = Logged::Yes;
            }
        }
        Ok(())
    }

    /// Writes a checkpoint now (after writing out what is staged).
    pub fn checkpoint(&self) -> Result<()> {
        let mut io = self.io.lock().expect("io lock");
        self.write_out(&mut io)?;
        self.checkpoint_locked()
    }

    // ---------------------------------------------------------------- read path

    /// Reads whole blocks: the newest completed write of each.
    pub fn read(&self, offset: u64, buf: &mut [u8]) -> Result<()> {
        self.check_request(offset, buf.len() as u64)?;
        let bs = self.bs;
        let first = offset / bs as u64;
        let nblocks = buf.len() / bs;
        let admit = buf.len() as u64 <= self.options.admit_max_request_bytes;
        // Plan under the lock: copy what is in RAM, note where the rest lives.

        let mut plan: Vec<Source> = Vec::with_capacity(nblocks);
        {
            let mut st = self.lock();
            st.counters.read_requests += 1;
            for i in 0..nblocks {
                let block = first + i as u64;
                let out = &mut buf[i * bs..(i + 1) * bs];
                if let Some(&k) = st.staging.map.get(&block) {
                    out.copy_from_slice(st.staging.block(k, bs));
                    plan.push(Source::Copied);
                    st.counters.read_hit_blocks += 1;
                } else if let Some(k) = st.inflight.as_ref().and_then(|f| f.map.get(&block).copied()) {
                    let f = st.inflight.as_ref().expect("checked");
                    out.copy_from_slice(&f.buf[(1 + k) * bs..(2 + k) * bs]);
                    plan.push(Source::Copied);
                    st.counters.read_hit_blocks += 1;
                } else if st.lost.contains_key(&block) {
                    // Staging and the record in flight (newer data) were looked at first.
                    for (j, src) in plan.iter().enumerate() {
                        if matches!(src, Source::Backing) {
                            st.end_fill(first + j as u64);
                        }
                    }
                    return Err(EngineError::LostBlock { block });
                } else if let Some(e) = st.index.get(block) {
                    st.index.touch(block);
                    let position = self.position_of(&st, &e);
                    plan.push(Source::Cache(e, position));
                    st.counters.read_hit_blocks += 1;
                } else {
                    st.fills.entry(block).or_insert((0, false)).0 += 1;
                    plan.push(Source::Backing);
                    st.counters.read_miss_blocks += 1;
                }
            }
        }
        // Backing reads, merged into runs of consecutive blocks.

        let mut backing_result = Ok(());
        let mut i = 0;
        while i < nblocks {
            if !matches!(plan[i], Source::Backing) {
                i += 1;
                continue;
            }
            let start = i;
            while i < nblocks && matches!(plan[i], Source::Backing) {
                i += 1;
            }
            if let Err(e) = self.backing.read_at((first + start as u64) * bs as u64, &mut buf[start * bs..i * bs]) {
                backing_result = Err(EngineError::backing(e));
                break;
            }
        }
        // Cache reads: one I/O per run of blocks in consecutive log slots (a sequential write
        // or admission put them there), each block verified on its own, then confirmed still
        // current under the lock below.

        let mut retry: Vec<usize> = Vec::new();
        let mut i = 0;
        while i < nblocks {
            let Source::Cache(e, _) = plan[i] else {
                i += 1;
                continue;
            };
            let start = i;
            i += 1;
            while i < nblocks && matches!(plan[i], Source::Cache(n, _) if n.slot == e.slot + (i - start) as u32) {
                i += 1;
            }
            let run = &mut buf[start * bs..i * bs];
            let read = self.cache.read_at(self.layout.log_offset(u64::from(e.slot)), run);
            for k in start..i {
                let Source::Cache(e, _) = plan[k] else { unreachable!("a run holds cache blocks only") };
                if read.is_err() || checksum(&buf[k * bs..(k + 1) * bs]) != e.crc {
                    retry.push(k);
                }
            }
        }
        // Admit misses and confirm cache hits.
        {
            let mut st = self.lock();
            let now = self.clock.now_ns();
            for (i, src) in plan.iter().enumerate() {
                let block = first + i as u64;
                match src {
                    Source::Backing => {
                        let cancelled = st.end_fill(block);
                        if backing_result.is_ok() && admit && !cancelled && !st.lost.contains_key(&block) {
                            let data = &buf[i * bs..(i + 1) * bs];
                            if st.staging.put(block, EntryKind::DataClean, data, checksum(data), now) {
                                st.counters.admitted_blocks += 1;
                            }
                        }
                    }
                    Source::Cache(_, position) => {
                        // Still current iff the index names the same position (a slot can hold
                        // another copy of the same block a lap later; a position cannot).
                        let current = st.index.get(block).map(|c| self.position_of(&st, &c));
                        if current != Some(*position) && !retry.contains(&i) {
                            retry.push(i); // moved or evicted while we read: read again
                        }
                    }
                    Source::Copied => {}
                }
            }
        }
        backing_result?;
        for i in retry {
            self.read_block_again(first + i as u64, &mut buf[i * bs..(i + 1) * bs])?;
        }
        self.commit_if_staging_full();
        Ok(())
    }

    /// The slow path for one block whose cached copy moved or failed its checksum.
    fn read_block_again(&self, block: u64, out: &mut [u8]) -> Result<()> {
        let bs = self.bs;
        loop {
            let (entry, position) = {
                let st = self.lock();
                if let Some(&k) = st.staging.map.get(&block) {
                    out.copy_from_slice(st.staging.block(k, bs));
                    return Ok(());
                }
                if let Some(f) = &st.inflight {
                    if let Some(&k) = f.map.get(&block) {
                        out.copy_from_slice(&f.buf[(1 + k) * bs..(2 + k) * bs]);
                        return Ok(());
                    }
                }
                if st.lost.contains_key(&block) {
                    return Err(EngineError::LostBlock { block });
                }
                match st.index.get(block) {
                    Some(e) => (e, self.position_of(&st, &e)),
                    None => {
                        drop(st);
                        return self.backing.read_at(block * bs as u64, out).map_err(EngineError::backing);
                    }
                }
            };
            let read = self.cache.read_at(self.layout.log_offset(u64::from(entry.slot)), out);
            let bad_dirty = read.is_ok() && entry.dirty && checksum(out) != entry.crc;
            // The check and what follows from it under the destage lock (`backing_holds`).
            // (This thread holds no other lock: reads are served outside all of them.)
            let _destage = bad_dirty.then(|| self.destage.lock().expect("destage lock"));
            let on_backing = bad_dirty && self.backing_holds(block, entry.crc, out);
            let mut st = self.lock();
            let current = st.index.get(block).map(|c| (self.position_of(&st, &c), c.dirty));
            let newer_in_ram =
                st.staging.map.contains_key(&block) || st.inflight.as_ref().is_some_and(|f| f.map.contains_key(&block));
            if current != Some((position, entry.dirty)) || newer_in_ram {
                // Moved, rewritten, or written back (now clean, by the batch waited for)
                // meanwhile: look again.
                continue;
            }
            if let Err(e) = read {
                // An I/O error is reported as such; the block is not declared lost for it.
                return Err(EngineError::cache(e));
            }
            if on_backing {
                self.repaired_from_backing(&mut st, block, position);
                return Ok(()); // `out` holds the backing device's copy, that very version
            }
            if !bad_dirty && checksum(out) == entry.crc {
                return Ok(());
            }
            if entry.dirty {
                // The only copy is bad: report, never serve.
                self.declare_lost(&mut st, block, position, entry.crc);
                return Err(EngineError::LostBlock { block });
            }
            // A bad clean copy: forget it and read the backing device (repair by re-admission
            // happens on a later miss).
            st.index.remove(block);
            st.counters.repaired_blocks += 1;
            tracing::warn!(block, "clean block failed its checksum on the cache device; re-read from backing");
        }
    }

    /// Readers that filled staging with clean blocks write it out, so admission continues.
    /// With a background thread, it is woken to write the record instead: a reader never
    /// waits for the admission of what it read (the staging buffer is swapped out at seal
    /// time, so admission goes on while the record is written).
    fn commit_if_staging_full(&self) {
        let full = {
            let st = self.lock();
            st.staging.data.len() >= st.staging.data_limit()
        };
        if full && !self.wake_background() {
            if let Ok(mut io) = self.io.try_lock() {
                let _ = self.write_out(&mut io);
            }
        }
    }

    /// Wakes the background thread, if there is one.
    fn wake_background(&self) -> bool {
        match &*self.background_thread.lock().expect("background thread handle") {
            Some(t) => {
                t.unpark();
                true
            }
            None => false,
        }
    }

    // ---------------------------------------------------------------- discard

    /// A hint that a range is unused (NBD TRIM, FUSE punch-hole): drops its clean cached
    /// copies to make room. Dirty blocks stay and are written back as usual, so a read after a
    /// TRIM returns the last data written, never a half-written block of the backing device
    /// (which a write-back interrupted by a crash may have left torn, while the cache held
    /// the good copy). Dropping a clean copy needs no log record: if a crash resurrects it,
    /// it equals the backing device's copy.
    pub fn discard(&self, offset: u64, len: u64) -> Result<()> {
        self.check_request(offset, len)?;
        let bs = self.bs as u64;
        let (first, end) = (offset / bs, (offset + len) / bs);
        let mut st = self.lock();
        st.check_poisoned()?;
        let clean: Vec<u64> = if end - first > st.index.len() as u64 {
            st.index.iter().filter(|(b, e)| !e.dirty && (first..end).contains(b)).map(|(b, _)| b).collect()
        } else {
            (first..end).filter(|&b| st.index.get(b).is_some_and(|e| !e.dirty)).collect()
        };
        for b in clean {
            st.index.remove(b);
            st.counters.evicted_blocks += 1;
        }
        let staged_clean: Vec<u64> = st
            .staging
            .data
            .iter()
            .filter(|(b, kind, _)| *kind == EntryKind::DataClean && (first..end).contains(b))
            .map(|(b, _, _)| *b)
            .collect();
        for b in staged_clean {
            st.staging.remove(b, self.bs);
        }
        Ok(())
    }

    // ---------------------------------------------------------------- destage

    /// Writes back one batch of dirty blocks in backing-address order, continuing from where
    /// the last batch stopped (an elevator). Returns how many blocks were written back.
    pub fn destage_step(&self, max_blocks: usize) -> Result<usize> {
        let mut cursor = self.destage.lock().expect("destage lock");
        let mut dirty: Vec<Picked> = {
            let st = self.lock();
            st.check_poisoned()?;
            st.index
                .iter()
                .filter(|(_, e)| e.dirty)
                .map(|(block, entry)| Picked { block, entry, position: self.position_of(&st, &entry) })
                .collect()
        };
        if dirty.is_empty() {
            return Ok(0);
        }
        dirty.sort_unstable_by_key(|p| p.block);
        let start = dirty.partition_point(|p| p.block < *cursor);
        let batch: Vec<Picked> = dirty[start..].iter().chain(dirty[..start].iter()).take(max_blocks).copied().collect();
        *cursor = if start + max_blocks < dirty.len() { dirty[start + max_blocks].block } else { 0 };
        self.destage_blocks(batch)
    }

    /// Writes back the dirty blocks in the next reclaim window (the few segments after the
    /// head), so that reclaim finds them clean and writes never wait for the backing device.
    /// Incremental: each slot is looked at once (in RAM, through the index's reverse map).
    /// Returns how many blocks were written back.
    pub fn destage_oldest(&self, max_blocks: usize) -> Result<usize> {
        self.preclean(max_blocks, false)
    }

    /// `destage_oldest`; with `dense_only`, a segment-sized stretch is written back only if
    /// it holds more dirty blocks than reclaim would copy forward: a sparsely dirty stretch
    /// costs reclaim one cache read and write of its few dirty blocks, less than a write-back
    /// (the pre-cleaner below the watermark chooses the cheaper of the two this way).
    fn preclean(&self, max_blocks: usize, dense_only: bool) -> Result<usize> {
        let _cursor = self.destage.lock().expect("destage lock");
        let (batch, until) = {
            let st = self.lock();
            st.check_poisoned()?;
            let window_end = st.head + self.preclean_horizon(&st);
            let (from, until) = (st.precleaned_until.max(st.head), window_end.min(st.written_tail));
            let stretch = if dense_only { u64::from(self.layout.segment_blocks) } else { 1 };
            let mut batch = Vec::new();
            let mut pos = from;
            while pos < until && batch.len() < max_blocks {
                let end = (pos + stretch).min(until);
                let dirty: Vec<Picked> = self.live_between(&st, pos, end).filter(|p| p.entry.dirty).collect();
                if !dense_only || dirty.len() > self.copy_forward_max() {
                    batch.extend(dirty);
                }
                pos = end;
            }
            (batch, pos)
        };
        let written = if batch.is_empty() { 0 } else { self.destage_blocks(batch)? };
        let mut st = self.lock();
        st.precleaned_until = st.precleaned_until.max(until);
        Ok(written)
    }

    /// How far ahead of the log head the pre-cleaner keeps the log clean: as many blocks as
    /// were written in the last `PRECLEAN_HORIZON_MS` (so write-back starts as far ahead of
    /// the writer as the writer's own pace), capped at a quarter of the log, and never less
    /// than `PRECLEAN_SEGMENTS` segments (on a log of fewer than 16 segments that floor is more
    /// than a quarter: a small log is pre-cleaned further ahead, as before the horizon).
    fn preclean_horizon(&self, st: &State) -> u64 {
        let since = self.clock.now_ns().saturating_sub(PRECLEAN_HORIZON_MS * 1_000_000);
        let k = st.age_samples.partition_point(|&(_, t)| t < since);
        let recent = st.age_samples.get(k).map_or(0, |&(pos, _)| st.tail.saturating_sub(pos));
        let floor = PRECLEAN_SEGMENTS * u64::from(self.layout.segment_blocks);
        recent.min(self.layout.log_blocks / 4).max(floor)
    }

    /// Writes `blocks` back to the backing device (destage lock held): read from the cache
    /// and verify; write in address order, merging neighbours; flush the backing device; only
    /// then mark clean and queue MarkClean entries.
    ///
    /// The rule (docs/format.md, "write-back and mark-clean"): a write-back marks clean
    /// exactly the versions it wrote, named by the log positions captured when the batch was
    /// taken, in RAM and in the MarkClean entry. The backing flush can take seconds, long
    /// enough for the log to lap and a newer version of the same block to land in the same
    /// slot; a position never repeats, so that newer version stays dirty.
    fn destage_blocks(&self, mut blocks: Vec<Picked>) -> Result<usize> {
        let bs = self.bs;
        let started = std::time::Instant::now();
        blocks.sort_unstable_by_key(|p| p.block);
        let mut data = AlignedBuf::new(blocks.len().max(1) * bs);
        let slots: Vec<u32> = blocks.iter().map(|p| p.entry.slot).collect();
        if let Err(e) = self.read_slots(&slots, &mut data[..blocks.len() * bs]) {
            let e = EngineError::cache(e);
            self.lock().poison(format!("reading dirty blocks from the cache device failed: {e}"));
            return Err(e);
        }
        // Keep only blocks whose index entry still names the position read (the read itself
        // raced nothing then: that position cannot be overwritten while it is live) and whose
        // data verifies.

        let mut keep = vec![false; blocks.len()];
        let mut suspects = Vec::new();
        {
            let st = self.lock();
            for (i, p) in blocks.iter().enumerate() {
                let current = st.index.get(p.block);
                let still = current.is_some_and(|c| c.dirty && self.position_of(&st, &c) == p.position);
                if !still {
                    continue; // overwritten or trimmed meanwhile: its newer version is handled later
                }
                if checksum(&data[i * bs..(i + 1) * bs]) != p.entry.crc {
                    suspects.push(*p);
                    continue;
                }
                keep[i] = true;
            }
        }
        // Copies that failed their checksum: lost, unless the backing device holds that version.
        let mut scratch = AlignedBuf::new(bs);
        for p in suspects {
            let on_backing = self.backing_holds(p.block, p.entry.crc, &mut scratch);
            let mut st = self.lock();
            let still = st.index.get(p.block).is_some_and(|c| c.dirty && self.position_of(&st, &c) == p.position);
            let newer_in_flight = st.inflight.as_ref().is_some_and(|f| f.map.contains_key(&p.block));
            if !still || newer_in_flight {
                continue;
            }
            if on_backing {
                self.repaired_from_backing(&mut st, p.block, p.position);
            } else {
                self.declare_lost(&mut st, p.block, p.position, p.entry.crc);
            }
        }
        if !keep.iter().any(|&k| k) {
            return Ok(0);
        }
        // The versions about to reach the backing device must be durable in the cache's log
        // first: otherwise a crash could keep them on the backing device while the cache
        // recovers an older version as clean, and the block would later change by itself.
        if let Err(e) = self.cache.flush() {
            let e = EngineError::cache(e);
            self.lock().poison(format!("flushing the cache device before write-back failed: {e}"));
            return Err(e);
        }
        // Fingerprint blocks among them: phase 1, an attach during or after the write accepts
        // the new content too. (Only the destager writes the superblock, under the destage lock.)
        let fingerprint_blocks = self.superblock().fingerprint_blocks();
        let mut new_fingerprints = [None; FINGERPRINT_BLOCKS];
        for (i, p) in blocks.iter().enumerate() {
            for (f, &fb) in fingerprint_blocks.iter().enumerate() {
                if keep[i] && p.block == fb {
                    new_fingerprints[f] = Some(checksum(&data[i * bs..(i + 1) * bs]));
                }
            }
        }
        let fingerprinted = new_fingerprints.iter().any(Option::is_some);
        if fingerprinted {
            let mut sb = self.superblock();
            for (f, new) in new_fingerprints.iter().enumerate() {
                if new.is_some() {
                    sb.backing_fingerprints[f].next = *new;
                }
            }
            self.write_superblock(sb)?;
        }
        let mut i = 0;
        let mut written = 0;
        while i < blocks.len() {
            if !keep[i] {
                i += 1;
                continue;
            }
            let start = i;
            while i + 1 < blocks.len() && keep[i + 1] && blocks[i + 1].block == blocks[i].block + 1 {
                i += 1;
            }
            i += 1;
            let offset = blocks[start].block * bs as u64;
            self.backing.write_at(offset, &data[start * bs..i * bs]).map_err(EngineError::backing)?;
            written += i - start;
        }
        if !sabotaged!(self, DestageSkipsBackingFlush) {
            self.backing.flush().map_err(EngineError::backing)?;
        }
        if fingerprinted {
            // Phase 3: the new content is the fingerprint. Written at once, so that the
            // "write-back in flight" allowance at attach does not stay set on disk.
            let mut sb = self.superblock();
            for (f, new) in new_fingerprints.iter().enumerate() {
                if let Some(crc) = new {
                    sb.backing_fingerprints[f] = Fingerprint { crc: *crc, next: None };
                }
            }
            self.write_superblock(sb)?;
        }
        let mut st = self.lock();
        st.counters.backing_flushes += 1;
        for (i, p) in blocks.iter().enumerate() {
            if !keep[i] {
                continue;
            }
            let (marked, ref_position) = if sabotaged!(self, MarkCleanBySlot) {
                // The old, broken rule: whatever now sits in the slot read, named by the
                // current tail.
                (st.index.mark_clean(p.block, p.entry.slot), self.layout.position_of_slot(p.entry.slot, st.tail))
            } else {
                let current = st.index.get(p.block);
                let same = current.is_some_and(|c| c.dirty && self.position_of(&st, &c) == p.position);
                // The copy read for this write-back verified, then rotted and was declared
                // lost meanwhile: the backing device now holds exactly that version, so the
                // loss is over (the MarkClean entry ends it on replay too).
                let rescued = st.lost.get(&p.block).is_some_and(|l| l.position == p.position);
                if rescued {
                    st.lost.remove(&p.block);
                    tracing::warn!(
                        block = p.block,
                        "a lost block's version reached the backing device: readable again"
                    );
                }
                ((same && st.index.mark_clean(p.block, p.entry.slot)) || rescued, p.position)
            };
            if marked {
                st.pending_meta.push_back(RecordEntry {
                    kind: EntryKind::MarkClean,
                    backing_block: p.block,
                    data_crc: 0,
                    ref_position,
                });
                st.counters.destaged_blocks += 1;
            }
        }
        tracing::debug!(
            picked = blocks.len(),
            written,
            elapsed_us = started.elapsed().as_micros() as u64,
            "write-back batch"
        );
        Ok(written)
    }

    /// Writes the next superblock copy and flushes the cache device, then makes it current.
    /// Holds no lock across the I/O.
    fn write_superblock(&self, mut sb: Superblock) -> Result<()> {
        sb.sequence += 1;
        let mut block = AlignedBuf::new(self.bs);
        sb.encode(&mut block);
        let at = (sb.sequence % 2) * self.bs as u64;
        let result = self.cache.write_at(at, &block).and_then(|()| self.cache.flush());
        if let Err(e) = result {
            let e = EngineError::cache(e);
            self.lock().poison(format!("writing the superblock failed: {e}"));
            return Err(e);
        }
        *self.superblock.lock().expect("superblock lock") = sb;
        Ok(())
    }

    /// Writes back every dirty block and checkpoints: the backing device then holds all data
    /// (`LostBlocks` if a lost block's stale copy is all it holds). `progress(done, remaining)`
    /// after each batch.
    pub fn flush_all(&self, mut progress: impl FnMut(u64, u64)) -> Result<()> {
        self.write_back_all(1.0, |done, remaining| {
            progress(done, remaining);
            true
        })
        .map(|_| ())
    }

    /// Writes back every block that is dirty when it is called, batch by batch in address
    /// order, then checkpoints; returns how many blocks it wrote back. Blocks written after
    /// the call began are not its business: a served volume keeps taking writes, and the
    /// call still ends. `busy_share` (0 < share <= 1) paces it: after each batch it pauses so
    /// that it works that share of the time, leaving the devices to the foreground load.
    /// `progress(done, remaining)` after each batch; returning false stops early. Everything
    /// written back so far stays clean (durably, through the MarkClean entries and the
    /// checkpoint), so a stopped call resumes where it left off when called again.
    pub fn write_back_all(&self, busy_share: f64, mut progress: impl FnMut(u64, u64) -> bool) -> Result<u64> {
        assert!(busy_share > 0.0 && busy_share <= 1.0, "busy share {busy_share} out of (0, 1]");
        self.flush()?;
        // The versions to write back: (block, crc) of every dirty block now. A version found
        // again at another position (copied forward meanwhile) is still this call's.
        let wanted: HashMap<u64, u32> = {
            let st = self.lock();
            st.check_poisoned()?;
            st.index.iter().filter(|(_, e)| e.dirty).map(|(b, e)| (b, e.crc)).collect()
        };
        let total = wanted.len() as u64;
        let mut done = 0u64;
        let mut idle_passes = 0;
        loop {
            // Still dirty with the version wanted: not yet written back, nor overwritten.
            let mut pending: Vec<Picked> = {
                let st = self.lock();
                st.check_poisoned()?;
                wanted
                    .iter()
                    .filter_map(|(&block, &crc)| {
                        let entry = st.index.get(block).filter(|e| e.dirty && e.crc == crc)?;
                        (!st.lost.contains_key(&block)).then(|| Picked {
                            block,
                            entry,
                            position: self.position_of(&st, &entry),
                        })
                    })
                    .collect()
            };
            if pending.is_empty() {
                break;
            }
            pending.sort_unstable_by_key(|p| p.block);
            let mut progressed = false;
            for batch in pending.chunks(DESTAGE_BATCH_BLOCKS) {
                let started = std::time::Instant::now();
                let n = {
                    let _destage = self.destage.lock().expect("destage lock");
                    self.destage_blocks(batch.to_vec())?
                };
                progressed |= n > 0;
                done = (done + n as u64).min(total);
                if !progress(done, total - done) {
                    self.checkpoint()?;
                    return Ok(done);
                }
                if busy_share < 1.0 {
                    std::thread::sleep(started.elapsed().mul_f64((1.0 - busy_share) / busy_share));
                }
            }
            if !progressed {
                // Every block of the pass moved or changed meanwhile (look again), or some
                // cannot be written back at all (give up after a while).
                idle_passes += 1;
                if idle_passes > 100 {
                    return Err(EngineError::Corrupt(format!(
                        "{} dirty blocks could not be written back",
                        pending.len()
                    )));
                }
                std::thread::sleep(std::time::Duration::from_millis(1));
            } else {
                idle_passes = 0;
            }
        }
        progress(total, 0);
        self.checkpoint()?;
        // Everything else is on the backing device now, but a lost block's backing copy is
        // stale: "the backing device holds all data" would be a lie.
        let lost = self.lost_blocks();
        if !lost.is_empty() {
            return Err(EngineError::LostBlocks { count: lost.len() as u64, blocks: lost });
        }
        Ok(done)
    }

    pub fn lost_blocks(&self) -> Vec<u64> {
        self.lock().lost.keys().copied().collect()
    }

    // ---------------------------------------------------------------- background work

    /// One round of background work: write out old staged data, destage between the
    /// watermarks, pre-clean the head when free space runs low.
    pub fn background_tick(&self) -> Result<()> {
        let (low, high) = (self.dirty_low_blocks, self.dirty_high_blocks);
        let (stale, dirty) = {
            let st = self.lock();
            st.check_poisoned()?;
            let now = self.clock.now_ns();
            let stale =
                st.staging.first_staged_ns.is_some_and(|t| now.saturating_sub(t) > STAGING_MAX_AGE_MS * 1_000_000);
            (stale, (st.index.dirty_len() + st.staging.data.len()) as u64)
        };
        // Write out staged data that has waited long enough or fills the buffer (readers'
        // admissions wake this thread for it), and a long MarkClean queue in
        // metadata-only records (a block holds 168 of them), so that a crash does not make
        // recovery write back again what was already written back.
        let (meta_backlog, full) = {
            let st = self.lock();
            (st.pending_meta.len() > RECORD_ENTRIES, st.staging.data.len() >= st.staging.data_limit())
        };
        if stale || meta_backlog || full {
            if let Ok(mut io) = self.io.try_lock() {
                for _ in 0..META_RECORDS_PER_TICK {
                    self.write_out(&mut io)?;
                    if self.lock().pending_meta.len() <= RECORD_ENTRIES {
                        break;
                    }
                }
            }
        }
        let active = {
            let mut st = self.lock();
            if dirty > high {
                st.destaging = true;
            } else if dirty <= low {
                st.destaging = false;
            }
            st.destaging
        };
        if active {
            // The oldest dirty blocks first (they are what reclaim would otherwise copy
            // forward again), then the elevator through the rest; batch after batch, so that
            // write-back runs at the backing device's pace, not one batch per period.
            for _ in 0..PRECLEAN_BATCHES_PER_TICK {
                if self.destage_oldest(DESTAGE_BATCH_BLOCKS)? == 0 && self.destage_step(DESTAGE_BATCH_BLOCKS)? == 0 {
                    break;
                }
                if (self.lock().index.dirty_len() as u64) <= low {
                    break;
                }
            }
            return Ok(());
        }
        // Below the watermark dirty data stays cached, except where the writer is about to
        // need its space: the head's densely dirty stretches within the horizon are written
        // back ahead of it (large sorted batches, off the writer's path), so reclaim finds
        // them clean instead of writing them back itself, segment by segment, while writers
        // wait; sparsely dirty ones are left to reclaim's copy-forward, which costs less.
        for _ in 0..PRECLEAN_BATCHES_PER_TICK {
            let short = {
                let st = self.lock();
                st.head + self.layout.log_blocks - st.tail < self.preclean_horizon(&st)
            };
            if !short || self.preclean(DESTAGE_BATCH_BLOCKS, true)? == 0 {
                break;
            }
        }
        Ok(())
    }

    /// Marks the volume as having a background thread (enables write backpressure), and
    /// names the thread to wake when staging fills.
    pub(crate) fn set_background(&self, thread: Option<std::thread::Thread>) {
        self.background.store(thread.is_some(), Ordering::Relaxed);
        *self.background_thread.lock().expect("background thread handle") = thread;
    }

    /// Above the high watermark, writes wait in proportion to how close the log is to full of
    /// dirty data, so the destager catches up smoothly instead of writes stalling at the end.
    fn backpressure(&self) {
        if !self.background.load(Ordering::Relaxed) {
            return;
        }
        let delay_us = {
            let mut st = self.lock();
            let log = self.layout.log_blocks;
            let high = self.dirty_high_blocks;
            let dirty = st.index.dirty_len() as u64;
            if dirty <= high || log <= high {
                return;
            }
            st.counters.throttled_writes += 1;
            MAX_WRITE_DELAY_US * (dirty - high) / (log - high)
        };
        std::thread::sleep(std::time::Duration::from_micros(delay_us));
    }

    /// Makes everything durable and writes a checkpoint, so the next open replays nothing.
    pub fn shutdown(&self) -> Result<()> {
        self.flush()?;
        self.checkpoint()
    }

    // ---------------------------------------------------------------- status

    pub fn status(&self) -> crate::Status {
        let sb = self.superblock();
        let st = self.lock();
        let bs = self.bs as u64;
        let now = self.clock.now_ns();
        let oldest_dirty =
            st.index.iter().filter(|(_, e)| e.dirty).map(|(_, e)| self.layout.position_of_slot(e.slot, st.tail)).min();
        let oldest_dirty_age_seconds = oldest_dirty.map(|pos| {
            let i = st.age_samples.partition_point(|&(p, _)| p <= pos);
            let t = if i == 0 { st.age_samples.front() } else { st.age_samples.get(i - 1) };
            t.map_or(0.0, |&(_, t)| now.saturating_sub(t) as f64 / 1e9)
        });
        let c = st.counters;
        let lookups = c.read_hit_blocks + c.read_miss_blocks;
        crate::Status {
            mode: sb.mode.name().to_string(),
            state: if st.poisoned.is_some() { "failed" } else { "ok" }.to_string(),
            failure: st.poisoned.clone(),
            block_size: self.layout.block_size,
            cache_size_bytes: sb.cache_size_bytes,
            log_bytes: self.layout.log_blocks * bs,
            backing_size_bytes: sb.backing_size_bytes,
            cached_blocks: st.index.len() as u64,
            cached_bytes: st.index.len() as u64 * bs,
            dirty_blocks: st.index.dirty_len() as u64,
            dirty_bytes: st.index.dirty_len() as u64 * bs,
            staged_blocks: st.staging.data.len() as u64,
            dirty_low_permille: self.watermarks_permille.0,
            dirty_high_permille: self.watermarks_permille.1,
            oldest_dirty_age_seconds,
            lost_blocks: st.lost.len() as u64,
            lost_block_numbers: st.lost.keys().copied().take(crate::constants::STATUS_LOST_BLOCKS_LISTED).collect(),
            read_hit_ratio: if lookups == 0 { None } else { Some(c.read_hit_blocks as f64 / lookups as f64) },
            index_ram_bytes: st.index.memory_bytes() as u64,
            index_ram_bytes_per_cached_block: st.index.bytes_per_cached_block(),
            log_head: st.head,
            log_tail: st.tail,
            log_used_permille: (st.tail - st.head) * 1000 / self.layout.log_blocks,
            checkpoint_position: st.checkpoint_position,
            next_sequence: st.next_seq,
            counters: c,
            backing_path: sb.backing_path,
            uuid: sb.uuid.iter().map(|b| format!("{b:02x}")).collect(),
        }
    }

    /// The log window: `(head, checkpoint position, tail)`. Records from the checkpoint
    /// position on are what recovery replays.
    pub fn log_window(&self) -> (u64, u64, u64) {
        let st = self.lock();
        (st.head, st.checkpoint_position, st.tail)
    }

    /// The index entries whose copy lies before both checkpoints' positions (whichever
    /// checkpoint recovery uses covers them), with their log positions, taken atomically (for
    /// the simulator's corrupter).
    pub fn checkpointed_entries(&self) -> Vec<(u64, IndexEntry, u64)> {
        let st = self.lock();
        st.index
            .iter()
            .map(|(b, e)| (b, e, self.position_of(&st, &e)))
            .filter(|&(_, _, position)| position < st.older_checkpoint_position.min(st.checkpoint_position))
            .collect()
    }

    /// Every (backing block, entry) in the index (for `check` and tests).
    pub fn index_snapshot(&self) -> Vec<(u64, IndexEntry)> {
        self.lock().index.iter().collect()
    }
}

/// Reads whole blocks at a logical log position of `cache`, splitting at the physical end.
pub(crate) fn read_log(cache: &dyn BlockDevice, layout: &Layout, pos: u64, buf: &mut [u8]) -> Result<()> {
    let bs = layout.block_size as usize;
    let first = layout.blocks_before_wrap(pos, (buf.len() / bs) as u64) as usize * bs;
    cache.read_at(layout.log_offset(pos), &mut buf[..first]).map_err(EngineError::cache)?;
    if first < buf.len() {
        cache.read_at(layout.log_offset(pos + (first / bs) as u64), &mut buf[first..]).map_err(EngineError::cache)?;
    }
    Ok(())
}
