//! TRIM: dropping clean cached copies of a range the client no longer uses.

use super::*;

impl Volume {
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
            if let Some(e) = st.index.get(b) {
                let position = self.position_of(&st, &e);
                st.around.dropped_without_record(b, position);
            }
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
            st.hot_on_install.remove(&b);
        }
        // Clean fills in records sealed and not yet in the index (being written, or handed
        // off to the record writer by a reader: `try_hand_off_staging`) leave the record's
        // map, so neither a read nor the record's install serves them; like a dropped index
        // entry, a crash may bring one back from the record (`dropped_without_record`). Else
        // a read after the TRIM served the old data from the record, and its install put it
        // in the index (`tests/adversarial_reader_handoff.rs`).
        let mut in_flight_clean: Vec<(u64, u64)> = Vec::new();
        for r in st.inflight.iter_mut() {
            let (position, data) = (r.position, &r.data);
            r.map.retain(|&b, &mut k| {
                let drop = data[k].1 == EntryKind::DataClean && (first..end).contains(&b);
                if drop {
                    in_flight_clean.push((b, position + 1 + k as u64));
                }
                !drop
            });
        }
        for (b, position) in in_flight_clean {
            st.around.dropped_without_record(b, position);
            st.hot_on_install.remove(&b);
            st.counters.evicted_blocks += 1;
        }
        st.probation.forget_range(first..end);
        // A read of the range in flight must not admit what it read before the TRIM: after a
        // TRIM the volume promises nothing of the old data, and the backing device may change
        // under the range (a discard passed down, a restore) with no write through the cache.
        let reading: Vec<u64> = st.fills.keys().copied().filter(|b| (first..end).contains(b)).collect();
        for b in reading {
            st.cancel_fill(b);
        }
        Ok(())
    }
}
