//! Checkpoints: the whole index (and every lost block, as a tombstone) written to one of the
//! two checkpoint areas in turn, so that recovery replays only the records after it and the
//! head may pass everything before it (docs/format.md §4.4).

use super::*;

impl Volume {
    /// Writes a checkpoint (call with the io lock held, so no record write is in flight).
    pub(crate) fn checkpoint_locked(&self) -> Result<()> {
        // The records the checkpoint summarises must be durable before it is: otherwise the
        // device could keep the checkpoint and drop a record whose data it points at.
        self.flush_cache(false)?;
        let (snapshot, tombstones, header) = {
            // The checkpoint omits the blocks written around: those writes must be on the
            // backing device first, and none may slip in before the snapshot (write_around.rs).
            let _around = self.lock_around();
            self.settle_write_around()?;
            self.checkpoint_snapshot()?
        };
        let (buf, header) = self.encode_checkpoint(&snapshot, &tombstones, header);
        let area = self.layout.checkpoint_area_start[(header.sequence % 2) as usize];
        self.cache_io("writing a checkpoint", self.cache.write_at(area * self.bs as u64, &buf))?;
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
        self.check_invariants(&st);
        Ok(())
    }

    /// The index, the tombstones (every lost block, logged or not: a checkpoint replaces the
    /// records before it) and the header, taken atomically.
    ///
    /// The index is copied whole (two flat arrays, about 12.7 bytes per cached block) and
    /// decoded after the state lock is let go: decoding it under the lock held every reader
    /// and writer 3-10 ms per checkpoint on a 1 GiB cache.
    #[allow(clippy::type_complexity)]
    fn checkpoint_snapshot(&self) -> Result<(Index, Vec<(u64, u32)>, CheckpointHeader)> {
        let st = self.lock();
        st.check_poisoned()?;
        let snapshot = st.index.clone();
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
        Ok((snapshot, tombstones, header))
    }

    /// The checkpoint's blocks: its header (with the entries' CRC filled in), then the
    /// entries.
    fn encode_checkpoint(
        &self,
        snapshot: &Index,
        tombstones: &[(u64, u32)],
        mut header: CheckpointHeader,
    ) -> (AlignedBuf, CheckpointHeader) {
        assert!(header.entry_count <= self.layout.checkpoint_capacity(), "checkpoint over capacity");
        let bs = self.bs;
        let entry_bytes = header.entry_count as usize * tiercache_format::constants::CHECKPOINT_ENTRY_SIZE;
        let blocks = 1 + entry_bytes.div_ceil(bs);
        assert!(blocks as u64 <= self.layout.checkpoint_area_blocks);
        let mut buf = AlignedBuf::new(blocks * bs);
        let entries = snapshot
            .iter()
            .map(|(block, e)| CheckpointEntry {
                backing_block: block,
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
        (buf, header)
    }

    /// Writes a checkpoint now (after writing out what is staged).
    pub fn checkpoint(&self) -> Result<()> {
        let mut io = self.lock_io();
        self.write_out(&mut io)?;
        self.checkpoint_locked()
    }
}
