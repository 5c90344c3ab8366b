//! Background work (one round per `BACKGROUND_PERIOD_MS`, or when woken): staged data
//! written out when old or full, write-back between the dirty watermarks, the head
//! pre-cleaned ahead of the writer; and the write backpressure above the high watermark.

use super::writeback::Reach;
use super::*;

impl Volume {
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
        self.write_out_in_background(stale)?;
        // A record handed off and still not begun (a record writer that died or stalls): the
        // background writes it, as it writes out stale staging.
        self.write_handed_off_record(false)?;
        // (Readers that hand off the records their admissions fill leave the checkpoint to
        // this thread: `try_hand_off_staging`.)
        self.checkpoint_if_due()?;
        let active = {
            let mut st = self.lock();
            if dirty > high {
                st.destaging = true;
            } else if dirty <= low {
                st.destaging = false;
            }
            st.destaging
        };
        if active && self.write_around_has_the_backing_device() {
            // Write-back above the high watermark makes room for writes; writes going around
            // need none, and the backing device is theirs (write_around.rs).
            Ok(())
        } else if active {
            self.write_back_above_watermark(low)
        } else {
            self.preclean_below_watermark()
        }
    }

    /// Writes out staged data that has waited long enough (`stale`) or fills the buffer
    /// (readers' admissions wake this thread for it), and a long MarkClean queue in
    /// metadata-only records (a block holds 168 of them), so that a crash does not make
    /// recovery write back again what was already written back.
    fn write_out_in_background(&self, stale: bool) -> Result<()> {
        // A long MarkClean queue, or a staging readers filled.
        let due = || {
            let st = self.lock();
            st.pending_meta.len() > RECORD_ENTRIES || st.staging.data_full()
        };
        if stale || due() {
            // (In the pipeline: writers sealing the next records need not wait for these.)
            let Some(mut io) = self.try_lock_io_to_seal() else { return Ok(()) };
            for _ in 0..META_RECORDS_PER_TICK {
                self.write_out_pipelined(io)?;
                // Again at once while the queue is long, or readers filled staging again
                // during that write: their further misses are not admitted until it is
                // written (`bypassed_blocks_busy`), so it is not left for the next wake-up.
                if !due() {
                    break;
                }
                io = self.lock_io_to_seal();
            }
        }
        Ok(())
    }

    /// Above the high watermark (until below the low one): the oldest dirty blocks first
    /// (they are what reclaim would otherwise copy forward again), then the elevator through
    /// the rest; batch after batch, so that write-back runs at the backing device's pace, not
    /// one batch per period.
    fn write_back_above_watermark(&self, low: u64) -> Result<()> {
        for _ in 0..PRECLEAN_BATCHES_PER_TICK {
            if self.reclaim_waits_for_destage() {
                break;
            }
            let batch = self.background_batch_blocks();
            if self.destage_oldest(batch)? == 0 && self.destage_step(batch)? == 0 {
                break;
            }
            if (self.lock().index.dirty_len() as u64) <= low {
                break;
            }
        }
        Ok(())
    }

    /// Below the watermark dirty data stays cached, except where the writer is about to need
    /// its space: the head's densely dirty stretches within the horizon are written back
    /// ahead of it (large sorted batches, off the writer's path), so reclaim finds them clean
    /// instead of writing them back itself, segment by segment, while writers wait; sparsely
    /// dirty ones are left to reclaim's copy-forward, which costs less.
    fn preclean_below_watermark(&self) -> Result<()> {
        for _ in 0..PRECLEAN_BATCHES_PER_TICK {
            let (short, yielding) = {
                let st = self.lock();
                let short = st.head + self.layout.log_blocks - st.tail < self.preclean_horizon(&st);
                (short, self.writes_go_around_the_dirty_head(&st))
            };
            if !short || yielding || self.reclaim_waits_for_destage() {
                break;
            }
            let batch = self.background_batch_blocks();
            if self.preclean(batch, true, Reach::Horizon)? == 0 && self.preclean(batch, true, Reach::Idle)? == 0 {
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

    /// Wakes the background thread, if there is one.
    pub(super) fn wake_background(&self) -> bool {
        match &*self.background_thread.lock().expect("background thread handle") {
            Some(t) => {
                t.unpark();
                true
            }
            None => false,
        }
    }

    /// Hands sealed records to `thread` (the record writer, which calls
    /// `write_handed_off_record` when woken), or, with `None`, lets each writer write its
    /// own again (what is handed off already is written by whoever needs it first).
    pub fn set_record_writer(&self, thread: Option<std::thread::Thread>) {
        self.record_writer.store(thread.is_some(), Ordering::Relaxed);
        *self.record_writer_thread.lock().expect("record writer thread handle") = thread;
    }

    /// Wakes the record writer thread, if there is one.
    pub(super) fn wake_record_writer(&self) {
        if let Some(t) = &*self.record_writer_thread.lock().expect("record writer thread handle") {
            t.unpark();
        }
    }

    /// The record writer thread's work: writes every record handed off whose write nobody has
    /// begun, oldest first, then a full probation batch readers handed off
    /// (`write_or_hand_off_probation`). Returns how many records it wrote; an error is a
    /// failed record write (the volume is poisoned).
    pub fn write_handed_off_records(&self) -> Result<usize> {
        let mut n = 0;
        while self.write_handed_off_record(false)? {
            n += 1;
        }
        self.write_probation_if_full(true);
        Ok(n)
    }

    /// Writes every record handed off whose write nobody has begun, failed or not: a failure
    /// poisons the volume (whoever needs durability sees it) and marks its record ended, as
    /// the pipeline's own writers do, so the records after it are still written. For the
    /// record writer thread, and for `drain_records` (`by_waiter`).
    pub(crate) fn write_every_handed_off_record(&self, by_waiter: bool) {
        while !matches!(self.write_handed_off_record(by_waiter), Ok(false)) {}
    }

    /// Above the high watermark, writes wait in proportion to how close the log is to full of
    /// dirty data, so the destager catches up smoothly instead of writes stalling at the end.
    pub(super) fn backpressure(&self) {
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
}
