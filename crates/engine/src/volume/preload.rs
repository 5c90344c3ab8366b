//! Preload: warming the cache with a byte range on purpose (`tiercache preload`: a table's
//! files, found through FIEMAP, or ranges). The range is read from the backing device in large
//! sequential requests, admitted whatever its size or the stream it makes (the read path would
//! leave a long sequential read out), and kept as hot: every block enters with the highest read
//! count, so reclaim keeps it the next three times the log's head reaches it even if nothing
//! reads it meanwhile (the head comes round sooner when most of the cache is hot: keeping a
//! block frees nothing). Blocks already cached are marked hot without being read.
//!
//! Admission goes through staging like a reader's, with the same guards (a write or loss of a
//! block meanwhile cancels its fill; nothing clean is admitted while a write-around is
//! unflushed), and each chunk is sealed into a record at once: a preload never leaves its
//! blocks waiting in RAM for the background thread.

use super::read::{Admit, Source};
use super::*;

/// What `preload` did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct PreloadReport {
    /// Blocks of the range (whole blocks).
    pub blocks: u64,
    /// Read from the backing device and admitted.
    pub admitted_blocks: u64,
    /// Cached already (now marked hot), in the index or still staged.
    pub cached_blocks: u64,
    /// Not admitted: written or declared lost while the preload read them, refused while a
    /// write-around was unflushed, or no room in staging.
    pub left_out_blocks: u64,
}

impl Volume {
    /// Reads `[offset, offset + len)`, widened to whole blocks, into the cache as hot data,
    /// calling `progress(bytes done)` after each chunk (returning false stops the preload:
    /// what was loaded stays). Chunks are a record's worth of blocks. Two threads: one reads
    /// chunks from the backing device while the caller's admits and writes the one before
    /// (so the backing device streams: a preload runs at its sequential speed).
    pub fn preload(&self, offset: u64, len: u64, mut progress: impl FnMut(u64) -> bool) -> Result<PreloadReport> {
        // (An operator waits for it: reclaim makes room for its records as for a writer's.)
        let _foreground = self.foreground();
        let (start, end) = self.aligned_span(offset, len)?;
        if len == 0 {
            return Ok(PreloadReport::default());
        }
        let bs = self.bs as u64;
        let chunk = self.lock().staging.data_limit() as u64;
        let mut report = PreloadReport { blocks: (end - start) / bs, ..PreloadReport::default() };
        let mut done = 0;
        // Admits one chunk read; whether to go on.
        let mut admit = |c: Chunk, report: &mut PreloadReport| -> Result<(AlignedBuf, bool)> {
            report.cached_blocks += c.counted.0;
            report.left_out_blocks += c.counted.1;
            // (Blocks cached already count as preloaded: they were marked hot.)
            self.lock().counters.preloaded_blocks += c.counted.0;
            self.preload_admit(c.first, &c.plan, &c.buf[..(c.n * bs) as usize], report)?;
            done += c.n * bs;
            Ok((c.buf, progress(done)))
        };
        // Reads one chunk (its plan and its blocks from the backing device).
        let read_chunk = |first: u64, mut buf: AlignedBuf| -> Result<Chunk> {
            let n = (end / bs - first).min(chunk);
            let (plan, counted) = self.preload_read(first, &mut buf[..(n * bs) as usize])?;
            Ok(Chunk { first, buf, n, plan, counted })
        };
        let starts = (start / bs..end / bs).step_by(chunk as usize);
        let new_buf = || AlignedBuf::new((chunk * bs) as usize);
        let result = if tiercache_sched::in_simulation() {
            // (The simulator runs one thread at a time, its own: no read-ahead thread.)
            let mut buf = Some(new_buf());
            let mut outcome = Ok(());
            for first in starts {
                match read_chunk(first, buf.take().expect("given back")).and_then(|c| admit(c, &mut report)) {
                    Ok((b, go_on)) => {
                        buf = Some(b);
                        if !go_on {
                            break;
                        }
                    }
                    Err(e) => {
                        outcome = Err(e);
                        break;
                    }
                }
            }
            outcome
        } else {
            let stop = AtomicBool::new(false);
            std::thread::scope(|scope| {
                // (Depth 1: one chunk read ahead while one is admitted; two buffers in all.)
                let (read_tx, read_rx) = std::sync::mpsc::sync_channel::<Result<Chunk>>(1);
                let (buf_tx, buf_rx) = std::sync::mpsc::channel::<AlignedBuf>();
                for _ in 0..2 {
                    buf_tx.send(new_buf()).expect("receiver alive");
                }
                let (stop, read_chunk) = (&stop, &read_chunk);
                scope.spawn(move || {
                    for first in starts {
                        if stop.load(Ordering::Relaxed) {
                            return;
                        }
                        let Ok(buf) = buf_rx.recv() else { return };
                        let read = read_chunk(first, buf);
                        let failed = read.is_err();
                        if read_tx.send(read).is_err() || failed {
                            return;
                        }
                    }
                });
                let mut outcome = Ok(());
                for read in read_rx.iter() {
                    match read.and_then(|c| admit(c, &mut report)) {
                        Ok((buf, go_on)) => {
                            let _ = buf_tx.send(buf);
                            if !go_on {
                                break;
                            }
                        }
                        Err(e) => {
                            outcome = Err(e);
                            break;
                        }
                    }
                }
                // Stopped, failed or done: the read-ahead thread ends (no more buffers, and
                // told to), and the fills of a chunk it read that was never admitted are ended,
                // or a write of one of those blocks would cancel its every later admission.
                stop.store(true, Ordering::Relaxed);
                drop(buf_tx);
                for c in read_rx.iter().flatten() {
                    self.end_fills(c.first, &c.plan);
                }
                outcome
            })
        };
        // (Marks of blocks whose staged copy went without a record: TRIM, write-around.)
        {
            let mut st = self.lock();
            let State { hot_on_install, staging, inflight, .. } = &mut *st;
            hot_on_install.retain(|b| staging.map.contains_key(b) || inflight.iter().any(|r| r.map.contains_key(b)));
        }
        result.map(|()| report)
    }

    /// A chunk's plan and backing read (the read-ahead thread): marks what is in the index hot,
    /// registers fills for the blocks not cached, reads them. Returns the plan and (blocks
    /// cached already, blocks left out because lost). Blocks found staged or in flight are
    /// `Source::Copied` in the plan: `preload_admit` marks them, if the chunk gets that far.
    fn preload_read(&self, first: u64, buf: &mut [u8]) -> Result<(Vec<Source>, (u64, u64))> {
        let n = buf.len() / self.bs;
        let mut counted = (0, 0);
        let plan: Vec<Source> = {
            let mut st = self.lock();
            st.check_poisoned()?;
            (0..n as u64)
                .map(|i| {
                    let block = first + i;
                    if st.index.get(block).is_some() {
                        st.index.set_freq(block, FREQ_MAX);
                        counted.0 += 1;
                        Source::Copied
                    } else if st.staging.map.contains_key(&block) || st.is_in_flight(block) {
                        counted.0 += 1;
                        Source::Copied
                    } else if st.lost.contains_key(&block) {
                        counted.1 += 1;
                        Source::Copied
                    } else {
                        st.fills.entry(block).or_insert((0, false)).0 += 1;
                        Source::Backing
                    }
                })
                .collect()
        };
        if let Err(e) = self.read_backing_runs(first, &plan, buf) {
            self.end_fills(first, &plan);
            return Err(e);
        }
        Ok((plan, counted))
    }

    /// Ends the fills a chunk's plan registered, for a chunk that will not be admitted.
    fn end_fills(&self, first: u64, plan: &[Source]) {
        let mut st = self.lock();
        for (i, s) in plan.iter().enumerate() {
            if matches!(s, Source::Backing) {
                st.end_fill(first + i as u64);
            }
        }
    }

    /// A chunk read: admit it (to be installed hot) and seal it into a record.
    fn preload_admit(&self, first: u64, plan: &[Source], buf: &[u8], report: &mut PreloadReport) -> Result<()> {
        if self.lock().around.owes_a_settle() {
            // A write-around not yet flushed bars every clean admission (write_around.rs): a
            // preload asked for is worth the backing flush that settles it.
            let settled = {
                let _around = self.lock_around();
                self.settle_write_around()
            };
            if let Err(e) = settled {
                self.end_fills(first, plan);
                return Err(e);
            }
        }
        if !self.lock().staging.data.is_empty() {
            // (Room for the whole chunk: what others staged goes into a record first.)
            let io = self.lock_io_to_seal();
            if let Err(e) = self.write_out_pipelined(io) {
                self.end_fills(first, plan);
                return Err(e);
            }
        }
        self.admit_and_confirm(first, plan, buf, Admit::Log, true, None, &mut Vec::new());
        {
            // What this chunk staged, and what it found staged or in flight, enters hot. (Each
            // mark is dropped with its staged copy if a TRIM or write-around drops that.)
            let mut st = self.lock();
            let mut admitted = 0;
            for (i, s) in plan.iter().enumerate() {
                let block = first + i as u64;
                let staged_clean =
                    st.staging.map.get(&block).is_some_and(|&k| st.staging.data[k].1 == EntryKind::DataClean);
                match s {
                    Source::Backing if staged_clean => {
                        admitted += 1;
                        st.hot_on_install.insert(block);
                    }
                    // (Staged by `admit_and_confirm`, and sealed since it let go of the lock by
                    // another thread: a reader writing out a full staging, the background
                    // thread. Once counted as left out and entered cold: a preload through a
                    // running server saw 126 of 512 blocks "left out".)
                    Source::Backing if st.is_in_flight_clean(block) => {
                        admitted += 1;
                        st.hot_on_install.insert(block);
                    }
                    Source::Backing if st.index.get(block).is_some_and(|e| !e.dirty) => {
                        admitted += 1;
                        st.index.set_freq(block, FREQ_MAX);
                    }
                    Source::Backing => report.left_out_blocks += 1,
                    // (Found staged or in flight when planned: installed by now, perhaps by the
                    // seal above, or still to be.)
                    _ if st.staging.map.contains_key(&block) || st.is_in_flight(block) => {
                        st.hot_on_install.insert(block);
                    }
                    _ if st.index.get(block).is_some() => st.index.set_freq(block, FREQ_MAX),
                    _ => {}
                }
            }
            report.admitted_blocks += admitted;
            st.counters.preloaded_blocks += admitted;
        }
        // Sealed now, not when staging fills: the chunk is in the log when this returns (or in
        // a record whose write another writer is finishing).
        let io = self.lock_io_to_seal();
        self.write_out_pipelined(io)
    }
}

/// A chunk the read-ahead thread read.
struct Chunk {
    first: u64,
    buf: AlignedBuf,
    n: u64,
    plan: Vec<Source>,
    /// (Cached already, left out.)
    counted: (u64, u64),
}
