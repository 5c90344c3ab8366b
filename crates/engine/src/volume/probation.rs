//! The read cache's probation ring: S3-FIFO's small queue, on a log-structured cache.
//!
//! Why a second ring. In one log every cached block lives a whole lap of the log's head,
//! however useless it turns out to be; a block read once (most misses of a database's random
//! reads) takes a slot for a lap that a block read again could have used. S3-FIFO's answer is
//! a small FIFO (10 % of the cache) that new blocks pass through: one read again while there
//! moves into the main queue, the rest leave after the small queue's short lap into the ghost
//! queue, and a miss of a ghost enters the main queue directly. On the shared traces that is
//! the best published policy at half the points; on the log alone the engine missed 13.5 %
//! more than the best on average, with this ring 4-5 % (bench/policy-model.py models both).
//!
//! So a miss that is no ghost is admitted here, not into the log: a ring of
//! `Layout::probation_blocks` slots after the log, written in batches of
//! `PROBATION_BATCH_BLOCKS` (gathered in RAM and served from there meanwhile), its oldest
//! slots simply reused when it is full (an eviction is free: the copies are clean). A block
//! hit `PROBATION_PROMOTE_READS` times while here is staged into the log as a clean block with
//! the data the reader just read and checked (no I/O of its own), and leaves the ring. Misses
//! of ghosts, preloads and every write go into the log as before.
//!
//! What keeps it correct. The ring holds clean copies only, each equal to the backing
//! device's block: a write, a write-around, a loss or a TRIM of a block forgets its copy here
//! under the state lock (`State::cancel_fill`, `discard`), in the same hold that stages the
//! new data, also while the copy waits in a batch or is being written (it is then written
//! but not installed); an admission enters only if its fill was not cancelled and no
//! write-around is under way (`Around::admissible`), as into the log; a TRIM cancels the
//! fills of its range too. A reader confirms under the lock that the entry still names the
//! slot it read with the same CRC, and the data its checksum; a copy that fails its checksum
//! or its read is forgotten. Nothing here is recovered: an open starts with the ring empty
//! (the log's recovery never looks at it), so a crash can bring back no stale copy.

use super::*;

/// Admissions gathered in RAM before one write, laid out in ring order.
pub(super) struct Batch {
    pub buf: AlignedBuf,
    /// (backing block, crc, still current). A block forgotten while gathered leaves (the last
    /// one takes its place: a database that reads a page and then rewrites it costs the ring
    /// nothing); one forgotten while its batch is written stays, written but not installed.
    pub blocks: Vec<(u64, u32, bool)>,
    pub map: HashMap<u64, usize>,
    bs: usize,
}

impl Batch {
    fn new(bs: usize, capacity: usize) -> Batch {
        Batch::on(AlignedBuf::new(bs * capacity), bs, capacity)
    }

    fn on(buf: AlignedBuf, bs: usize, capacity: usize) -> Batch {
        Batch { buf, blocks: Vec::with_capacity(capacity), map: HashMap::new(), bs }
    }

    /// Takes `block` out, moving the last block into its place.
    fn remove(&mut self, block: u64) {
        let Some(i) = self.map.remove(&block) else { return };
        let last = self.blocks.len() - 1;
        if i != last {
            let bs = self.bs;
            self.buf.copy_within(last * bs..(last + 1) * bs, i * bs);
            self.blocks[i] = self.blocks[last];
            self.map.insert(self.blocks[i].0, i);
        }
        self.blocks.pop();
    }
}

/// A batch whose write is in progress: still read from RAM.
pub(super) struct Writing {
    pub position: u64,
    pub buf: Arc<AlignedBuf>,
    pub blocks: Vec<(u64, u32, bool)>,
    pub map: HashMap<u64, usize>,
}

pub(super) struct Probation {
    /// Ring slots (0: no ring, every admission goes into the log).
    pub blocks: u64,
    /// Oldest position whose slot may still be named, and the next position to write.
    pub head: u64,
    pub tail: u64,
    /// The copies in the ring: block -> slot (`position % blocks`), CRC and reads since
    /// admitted (the log's compact index, reused: about 12.7 bytes per ring slot, and its
    /// reverse map of slots is eviction's).
    index: Index,
    pub gathering: Batch,
    pub writing: Option<Writing>,
    /// Blocks that make a batch due for writing: `PROBATION_BATCH_BLOCKS`, at most a quarter of
    /// the ring.
    pub batch_blocks: usize,
    /// Blocks a batch may hold: a batch's worth more than `batch_blocks` (the largest request
    /// admitted, 256 KiB, whatever the batch held before it), at most half the ring (a write
    /// never reaches the copies of the one before).
    capacity: usize,
    /// The last written batch's buffer, for the next batch (when its writer let go of it).
    spare: Option<AlignedBuf>,
}

/// What the ring holds of a block.
pub(super) enum Found {
    /// In a batch not yet written: copied out.
    Copied,
    /// In the ring (its slot, CRC and reads so far).
    Ring(IndexEntry),
    Absent,
}

impl Probation {
    pub(super) fn new(blocks: u64, bs: usize) -> Probation {
        let batch_blocks = PROBATION_BATCH_BLOCKS.min((blocks / 4) as usize).max(1);
        let request = (ADMIT_MAX_REQUEST_BYTES / bs as u64) as usize;
        let capacity = (batch_blocks + request).min((blocks / 2) as usize).max(batch_blocks);
        Probation {
            blocks,
            head: 0,
            tail: 0,
            index: Index::with_capacity(blocks as usize),
            gathering: Batch::new(bs, capacity),
            writing: None,
            batch_blocks,
            capacity,
            spare: None,
        }
    }

    pub(super) fn enabled(&self) -> bool {
        self.blocks > 0
    }

    /// Live copies (in the ring and in RAM batches).
    pub(super) fn len(&self) -> usize {
        self.index.len()
            + self.gathering.map.len()
            + self.writing.as_ref().map_or(0, |w| w.blocks.iter().filter(|b| b.2).count())
    }

    /// Looks `block` up for a read: a copy in RAM is copied into `out`; a copy in the ring is
    /// returned for the reader to read. (Reads of a copy still in RAM do not count, as in the
    /// log's staging: they follow the miss closely, the correlated references 2Q ignores.)
    pub(super) fn find(&self, block: u64, out: &mut [u8]) -> Found {
        let bs = out.len();
        if let Some(&i) = self.gathering.map.get(&block) {
            out.copy_from_slice(&self.gathering.buf[i * bs..(i + 1) * bs]);
            return Found::Copied;
        }
        if let Some(w) = &self.writing {
            if let Some(&i) = w.map.get(&block) {
                out.copy_from_slice(&w.buf[i * bs..(i + 1) * bs]);
                return Found::Copied;
            }
        }
        match self.index.get(block) {
            Some(e) => Found::Ring(e),
            None => Found::Absent,
        }
    }

    /// Whether `block`'s copy is still `e` (the same slot and CRC: a slot reused meanwhile
    /// for another block, or for newer data, fails one or the other; reused for the same
    /// data, it is as good).
    pub(super) fn still(&self, block: u64, e: &IndexEntry) -> bool {
        self.index.get(block).is_some_and(|c| c.slot == e.slot && c.crc == e.crc)
    }

    /// A read of the copy `e` checked good: counts it (when `counts`), and says whether it is
    /// due for the log. None if the ring no longer holds that copy.
    pub(super) fn confirm(&mut self, block: u64, e: &IndexEntry, counts: bool) -> Option<bool> {
        if !self.still(block, e) {
            return None;
        }
        if counts {
            self.index.touch(block);
        }
        Some(self.index.get(block).is_some_and(|c| c.freq >= PROBATION_PROMOTE_READS))
    }

    /// The block's data changed (or it left for the log): its copy here is no longer current.
    pub(super) fn forget(&mut self, block: u64) {
        if !self.enabled() {
            return;
        }
        self.index.remove(block);
        self.gathering.remove(block);
        if let Some(w) = &mut self.writing {
            if let Some(i) = w.map.remove(&block) {
                w.blocks[i].2 = false;
            }
        }
    }

    /// Forgets every copy of a block in `range` (TRIM).
    pub(super) fn forget_range(&mut self, range: std::ops::Range<u64>) {
        let mut held: Vec<u64> = if range.end - range.start > self.len() as u64 {
            let writing = self.writing.iter().flat_map(|w| w.map.keys().copied());
            let ring = self.index.iter().map(|(b, _)| b);
            ring.chain(self.gathering.map.keys().copied()).chain(writing).filter(|b| range.contains(b)).collect()
        } else {
            range.collect()
        };
        // In block order, not the maps' hash order: a block forgotten from the gathering batch
        // takes the last one into its place (`Batch::remove`), so the order decides where the
        // survivors land in the ring, and which of them its head evicts first; a replay must
        // not depend on the hash seed.
        held.sort_unstable();
        held.dedup();
        held.into_iter().for_each(|b| self.forget(b));
    }

    /// Gathers an admission; false if the batch is full (a write of the last one is still in
    /// progress, and other readers filled this one meanwhile).
    pub(super) fn gather(&mut self, block: u64, data: &[u8]) -> bool {
        if self.gathering.blocks.len() >= self.capacity || self.gathering.map.contains_key(&block) {
            return false;
        }
        let bs = data.len();
        let i = self.gathering.blocks.len();
        self.gathering.buf[i * bs..(i + 1) * bs].copy_from_slice(data);
        self.gathering.blocks.push((block, checksum(data), true));
        self.gathering.map.insert(block, i);
        true
    }

    pub(super) fn batch_full(&self) -> bool {
        self.enabled() && self.gathering.blocks.len() >= self.batch_blocks
    }

    /// Whether the gathered batch is overdue: full, nobody has begun its write, and more than
    /// half of the slack beyond a batch (`capacity`, after which admissions are refused) is
    /// gathered too.
    pub(super) fn batch_overdue(&self) -> bool {
        self.enabled() && 2 * self.gathering.blocks.len() >= self.batch_blocks + self.capacity
    }

    /// Starts writing the gathered batch (none in progress): room is made by dropping the
    /// oldest copies (each into `ghosts`), positions reserved. Returns (position, blocks,
    /// buffer) to write outside the lock.
    pub(super) fn start_write(
        &mut self,
        ghosts: &mut crate::ghost::Ghosts,
        evicted: &mut u64,
    ) -> Option<(u64, usize, Arc<AlignedBuf>)> {
        if self.writing.is_some() || self.gathering.blocks.is_empty() {
            return None;
        }
        let n = self.gathering.blocks.len() as u64;
        while self.tail + n > self.head + self.blocks {
            if let Some((block, _)) = self.index.owner(self.slot(self.head)) {
                self.index.remove(block);
                ghosts.insert(block);
                *evicted += 1;
            }
            self.head += 1;
        }
        let position = self.tail;
        self.tail += n;
        let bs = self.gathering.bs;
        let next = match self.spare.take() {
            Some(buf) => Batch::on(buf, bs, self.capacity),
            None => Batch::new(bs, self.capacity),
        };
        let batch = std::mem::replace(&mut self.gathering, next);
        let buf = Arc::new(batch.buf);
        self.writing = Some(Writing { position, buf: Arc::clone(&buf), blocks: batch.blocks, map: batch.map });
        Some((position, n as usize, buf))
    }

    /// The batch's write returned: its copies still current enter the ring. If it failed,
    /// none does (they are clean: nothing is lost), and its blocks become ghosts, so that
    /// their next miss enters the log: a ring that cannot be written does not stop read
    /// caching. Returns how many entered.
    pub(super) fn finish_write(&mut self, ok: bool, ghosts: &mut crate::ghost::Ghosts) -> u64 {
        let w = self.writing.take().expect("a batch being written");
        let mut installed = 0;
        for (i, &(block, crc, current)) in w.blocks.iter().enumerate() {
            if !current {
                continue;
            }
            if ok {
                let slot = self.slot(w.position + i as u64);
                self.index.insert(block, IndexEntry { slot, dirty: false, freq: 0, crc });
                installed += 1;
            } else {
                ghosts.insert(block);
            }
        }
        self.spare = Arc::try_unwrap(w.buf).ok();
        installed
    }

    /// The slot of ring position `position`.
    fn slot(&self, position: u64) -> u32 {
        u32::try_from(position % self.blocks).expect("a ring of at most MAX_LOG_BLOCKS slots")
    }

    /// The invariants (debug builds and the simulator): every copy is clean, in a slot of the
    /// live part of the ring, `[head, tail)`.
    #[cfg(any(debug_assertions, feature = "testing"))]
    pub(super) fn check(&self) {
        if !self.enabled() {
            return;
        }
        assert!(
            self.head <= self.tail && self.tail <= self.head + self.blocks,
            "probation ring {}..{}",
            self.head,
            self.tail
        );
        for (block, e) in self.index.iter() {
            let from_head = (u64::from(e.slot) + self.blocks - self.head % self.blocks) % self.blocks;
            assert!(
                from_head < self.tail - self.head,
                "probation copy of {block} in slot {} outside {}..{}",
                e.slot,
                self.head,
                self.tail
            );
            assert!(!e.dirty, "a dirty copy of {block} in the probation ring");
        }
    }
}
