//! What the volume shows of itself: `status`, and the views `check` and the simulators
//! read (the log window, the index).

use super::*;

impl Volume {
    /// The volume's state, sizes, dirty data, log position and counters (`tiercache status`).
    pub fn status(&self) -> crate::Status {
        let sb = self.superblock();
        // The oldest dirty copy's log position, by a scan in chunks (`scan_index`): the
        // whole index under one hold stalled every reader and writer, once a second.
        let mut oldest_dirty: Option<u64> = None;
        self.scan_index(|st, buckets| {
            let oldest =
                st.index.dirty_in_buckets(buckets).map(|(_, slot)| self.layout.position_of_slot(slot, st.tail));
            oldest_dirty = oldest_dirty.into_iter().chain(oldest).min();
        });
        let st = self.lock();
        // (A copy found oldest but reclaimed since is no older than the head; when the scan
        // found none, what is dirty now was written since it began (`scan_index` visits
        // every entry present throughout): the tail.)
        let oldest_dirty = (st.index.dirty_len() > 0).then(|| oldest_dirty.map_or(st.tail, |pos| pos.max(st.head)));
        let bs = self.bs as u64;
        let now = self.clock.now_ns();
        // (Dated by the records this process wrote: with none yet, as when a cache is only
        // inspected, the age is unknown, not zero.)
        let oldest_dirty_age_seconds = oldest_dirty.and_then(|pos| {
            let i = st.age_samples.partition_point(|&(p, _)| p <= pos);
            let t = if i == 0 { st.age_samples.front() } else { st.age_samples.get(i - 1) };
            t.map(|&(_, t)| now.saturating_sub(t) as f64 / 1e9)
        });
        let c = st.counters;
        let (write_back_ns, copy_ns) = st.costs.get();
        let lookups = c.read_hit_blocks + c.read_miss_blocks;
        crate::Status {
            mode: sb.mode.name().to_string(),
            state: if st.poisoned.is_some() { crate::VolumeState::Failed } else { crate::VolumeState::Ok },
            failure: st.poisoned.clone(),
            block_size: self.layout.block_size,
            cache_size_bytes: sb.cache_size_bytes,
            log_bytes: self.layout.log_blocks * bs,
            backing_size_bytes: sb.backing_size_bytes,
            cached_blocks: st.index.len() as u64,
            cached_bytes: st.index.len() as u64 * bs,
            dirty_blocks: st.index.dirty_len() as u64,
            dirty_bytes: st.index.dirty_len() as u64 * bs,
            hot_blocks: st.index.hot_len() as u64,
            eviction: self.options.eviction,
            probation_ring_blocks: st.probation.blocks,
            probation_blocks: st.probation.len() as u64,
            staged_blocks: st.staging.data.len() as u64,
            dirty_low_permille: self.watermarks_permille.0,
            dirty_high_permille: self.watermarks_permille.1,
            oldest_dirty_age_seconds,
            lost_blocks: st.lost.len() as u64,
            lost_block_numbers: st.lost.keys().copied().take(crate::constants::STATUS_LOST_BLOCKS_LISTED).collect(),
            read_hit_ratio: if lookups == 0 { None } else { Some(c.read_hit_blocks as f64 / lookups as f64) },
            index_ram_bytes: st.index.memory_bytes() as u64,
            index_ram_bytes_per_cached_block: st.index.bytes_per_cached_block(),
            ghost_ram_bytes: st.ghosts.memory_bytes() as u64,
            frequency_gate: st.admission.gate(),
            policy_switches: st.admission.switches(),
            admission_ram_bytes: st.admission.memory_bytes() as u64,
            reclaim_write_back_us_per_block: write_back_ns.map(|ns| ns as f64 / 1e3),
            reclaim_copy_us_per_block: copy_ns.map(|ns| ns as f64 / 1e3),
            write_back_batch_blocks: st.costs.write_back_batch_blocks(self.batch_bounds(DESTAGE_BATCH_MIN_BLOCKS))
                as u64,
            background_batch_blocks: st
                .costs
                .write_back_batch_blocks(self.batch_bounds(DESTAGE_BACKGROUND_BATCH_MIN_BLOCKS))
                as u64,
            gentle_batch_blocks: st.costs.gentle_batch_blocks(self.batch_bounds(DESTAGE_BACKGROUND_BATCH_MIN_BLOCKS))
                as u64,
            log_head: st.head,
            log_tail: st.tail,
            log_used_permille: (st.tail - st.head) * 1000 / self.layout.log_blocks,
            checkpoint_position: st.checkpoint_position,
            next_sequence: st.next_seq,
            counters: c,
            backing_path: sb.backing_path,
            fingerprint_hash: sb.fingerprint_hash.name().to_string(),
            uuid: tiercache_format::uuid_hex(&sb.uuid),
        }
    }

    /// The counters alone (one short state-lock hold: what a sampler polling every second
    /// should take instead of `status`, whose scans take several).
    pub fn counters(&self) -> crate::Counters {
        self.lock().counters
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
