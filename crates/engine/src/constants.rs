//! The engine's limits and default tunables, in one place, with their relations asserted.

use tiercache_format::constants::MAX_RECORD_ENTRIES;

/// Entries (data and metadata) in one record; a record holds at most this many data blocks.
pub const RECORD_ENTRIES: usize = MAX_RECORD_ENTRIES;
/// Blocks of the largest record: its header plus one data block per entry.
pub const MAX_RECORD_BLOCKS: u64 = 1 + RECORD_ENTRIES as u64;

/// Records whose writes may be in progress at once (the record writer's pipeline): a writer
/// that fills staging seals it and writes it without waiting for the records before it, so
/// a stream of large writes keeps this many record writes in flight on the cache device.
/// Each costs one record buffer (`MAX_RECORD_BLOCKS` blocks) of RAM.
pub const RECORD_PIPELINE_DEPTH: usize = 8;

/// Take a checkpoint when the log written since the last one exceeds this share of the log
/// (per mille). Smaller: faster recovery, more checkpoint writes.
pub const CHECKPOINT_INTERVAL_PERMILLE: u64 = 250;

/// Default dirty watermarks, per mille of the log: the destager starts above `HIGH` and stops
/// below `LOW` (FlashCache's lesson: a high threshold keeps write-back effective).
pub const DEFAULT_DIRTY_LOW_PERMILLE: u16 = 300;
pub const DEFAULT_DIRTY_HIGH_PERMILLE: u16 = 700;

/// Most blocks a write-back batch takes (sorted and merged).
pub const DESTAGE_BATCH_BLOCKS: usize = 4096;

/// A write-back batch is sized to take about this long at the measured write-back cost
/// (`costs.rs`), between `DESTAGE_BATCH_MIN_BLOCKS` and `DESTAGE_BATCH_BLOCKS`: a writer whose
/// reclaim needs the destage lock waits for the batch under way, then its own. With
/// 16 MiB batches on an HDD (180 MB/s) writers met 140 ms batches and waited up to 290 ms
/// (`bench seq --emulated nvme:hdd`, writes meeting dirty data at the log head); issue 13
/// allows no wait above 100 ms.
pub const DESTAGE_BATCH_MS: u64 = 25;

/// The fewest blocks a write-back batch takes, however slow the backing device (a backing
/// flush per batch, and a sort over fewer blocks, cost more per block below it).
pub const DESTAGE_BATCH_MIN_BLOCKS: usize = 256;

/// The fewest blocks a background write-back batch takes (the pre-cleaner's, the destager's
/// above the high watermark). A writer whose reclaim needs the destage
/// lock waits for the batch under way: on a slow disk a batch of `DESTAGE_BATCH_MIN_BLOCKS`
/// scattered blocks takes about 0.5 s (the hdd profile, 4 ms a block, mostly rotation),
/// and MariaDB's writers stood still behind them (`bench/seeds.py dirty`, 20 % high
/// watermark: 6-15 seconds at zero tps in 150 s over four runs; 0-4 with this floor). A
/// quarter of the batch is a quarter of the wait; the blocks cost the same each, as the disk's
/// rotation, not its seeks, dominates. A writer's own reclaim batch keeps the larger floor:
/// it is paid by the writer that needs the room, and it takes the segments ahead along so
/// that the next reclaims find them clean; and `write_back_all`, which no writer waits for
/// (a backing flush per 64 blocks made a flush 38 % slower over a disk whose flush takes 15
/// ms). The trade: a dense window of about 247 dirty blocks (a 256-block segment) is written
/// back 64 at a time until the rest is sparse (`copy_forward_max`), which the writer's
/// reclaim then copies forward: more copies on the fast device, not more time for the writer
/// (`adversarial_background_batches.rs`).
pub const DESTAGE_BACKGROUND_BATCH_MIN_BLOCKS: usize = 64;

/// The elevator's plan (`destage_step`): the next dirty blocks in address order from its
/// cursor, found by one scan of the index and taken batch by batch. At most this many are
/// kept (8 bytes each), so the scan runs once per this many blocks written back, not once a
/// batch: a scan of a 1 GiB cache's index took about 10 ms, and ran before every batch.
pub const ELEVATOR_PLAN_BLOCKS: usize = 65_536;

/// Index buckets a scan of the whole index looks at per state-lock hold (`Volume::
/// scan_index`: the elevator's plan, `status`'s oldest dirty block): a few hundred
/// microseconds, and readers and writers take the lock between two holds. Whole, the scan of
/// a 1 GiB cache's index held it 3-10 ms (up to 86 ms when the thread was preempted in it),
/// once a second for `serve`'s rate sampler. The elevator looks its plan's blocks up again
/// this many per hold as it takes them.
pub const INDEX_SCAN_CHUNK: usize = 16_384;

/// The batch size until a write-back has been timed.
pub const DESTAGE_BATCH_UNTIMED_BLOCKS: usize = 1024;

/// The background pre-cleaner writes back dirty blocks at least this many segments ahead of
/// the log head, so reclaim finds them clean; reclaim's own write-back (when the pre-cleaner
/// is behind) takes this many segments beyond its window in the same batch.
pub const PRECLEAN_SEGMENTS: u64 = 4;

/// Beyond that floor, the pre-cleaner's horizon is what the writers wrote in this long: write
/// back starts as far ahead of them as their own pace (at most a quarter of the log).
pub const PRECLEAN_HORIZON_MS: u64 = 1000;

/// While the log first fills (the adaptive policy), read misses enter it only while this
/// share of the log (a 16th: 57 MiB of a 1 GiB cache) stays free at the tail; later misses go
/// to the probation ring. A read fill then never makes the log wrap onto the dirty data
/// written before it, and that room is what lets writers who then rewrite that data in the
/// order it was written run ahead of the head: reclaim finds each segment superseded, free
/// to take. The room must cover a segment, a record, the reclaim records the rewrite adds
/// and the drift between concurrent writers' paces (nbdcopy's two threads each rewrite a
/// region; a block of the slower one still live at the head is copied forward, which eats
/// the room). nbdcopy's rewrite of 512 MiB after a cache-filling read (bench/nbdcopy-table.py)
/// wrote back 0 MiB with a 16th, 100-170 MiB with a 64th and 300-410 MiB with a record's room
/// (as before: 0.27-0.44 of its empty-cache rate). On the shared traces the replay's miss
/// ratios moved by -0.3 to +0.9 % per point (1.93 % above the best published policy on
/// average, 1.97 % with a 16th).
pub const FILL_LEAVES_FREE_DIVISOR: u64 = 16;

/// A sequential write stream continued within this long counts as active: the pre-cleaner
/// leaves the dirty blocks it is about to supersede (`Streams::sweeping`).
pub const WRITE_STREAM_ACTIVE_MS: u64 = 100;

/// A sequential writer's requests may arrive this many requests out of order and still
/// continue its stream: nbdcopy keeps 64 requests in flight on each connection, and the
/// server's request threads take them in any order. (Reads allow one: a scan is judged on
/// its first few requests.) Streams far apart, such as nbdcopy's threads' 128 MiB regions,
/// stay apart.
pub const WRITE_STREAM_REORDER_REQUESTS: u64 = 64;

/// Write-back batches the pre-cleaner may run in one background round while free space is
/// short of its horizon (it catches up with a fast writer without waiting a period each).
pub const PRECLEAN_BATCHES_PER_TICK: usize = 4;

/// Where nothing within the pre-cleaner's horizon needs writing back, it looks further ahead
/// of the head for dense windows, over data written at least `PRECLEAN_IDLE_AGE_MS` ago and
/// at most this far (per mille of the log), so that the backing device works while it would
/// stand idle. MariaDB write-only over an emulated HDD (`bench/seeds.py dirty`, 80 % high
/// watermark): the backing device was idle 38 s of the last 100, the horizon holding no
/// dense window; then dense stretches reached the head faster than the pre-cleaner's batches
/// cleaned them, and writers wrote them back in their reclaims, 0.3-0.7 s each, 70 times.
/// With the idle reach (six runs of each binary) the writers' reclaims wrote back as often,
/// while seconds at zero tps fell from a median of 9.5 to 5.5 (ARCHITECTURE.md).
pub const PRECLEAN_IDLE_REACH_PERMILLE: u64 = 500;

/// The idle reach takes only data this old: not rewritten for this long, as FlashCache's
/// idle cleaning (`fallow_delay`) takes blocks dirty and untouched for long. Younger data
/// that a workload is still rewriting thins out before the head reaches it: written back
/// now, much of it would be written again.
pub const PRECLEAN_IDLE_AGE_MS: u64 = 10_000;

/// The most log positions one idle-reach round walks past where the last stopped, under one
/// state-lock hold (review: half of a 1 GiB log walked at once held readers 16 ms).
pub const PRECLEAN_IDLE_WALK_BLOCKS: u64 = 16_384;

/// Writes of at least this many bytes go around the cache, straight to the backing device,
/// while the cache holds more dirty data than its high watermark (write-around). 64 KiB: a
/// destage-bound writer of 64 KiB requests otherwise runs at the write-back's pace, a fifth of
/// the backing device's (`bench seq`); smaller writes, a database's pages and commits, stay
/// in the cache, where rewrites of the same blocks coalesce.
pub const WRITE_AROUND_MIN_BYTES: u64 = 64 * 1024;
/// While a write went around in the last this many milliseconds, background write-back above
/// the high watermark pauses (the backing device is the writer's)...
pub const WRITE_AROUND_YIELD_MS: u64 = 100;
/// ...unless dirty data fills more than this share of the log (per mille).
pub const WRITE_AROUND_YIELD_MAX_PERMILLE: u64 = 900;
/// A cached read is one scatter I/O across at most this many skipped log slots in all (the
/// record headers between the runs of a request's blocks, and the few blocks of other
/// requests that concurrent writers put between them): reading 32 unwanted blocks costs
/// less than a second I/O.
pub const MAX_SKIPPED_SLOTS: usize = 32;
/// ...and at most this many in one place.
pub const MAX_GAP_SLOTS: usize = 8;
/// A cached read of more blocks than this is read in pieces of at most this many slots, all
/// in flight together, and each piece's checksums are verified as soon as it arrives, while
/// the device reads the rest: one 1 MiB read then verified took its transfer plus 0.1-0.16 ms
/// of checksums on data fresh from DMA (0.74 of the raw cache device at queue depth 1 here).
pub const VERIFY_CHUNK_BLOCKS: usize = 64;
/// Write-back and copy-forward read a stretch of log slots in one scatter I/O through gaps
/// of up to this many slots they do not need (record headers, clean or stale blocks): 32 KiB
/// more transfer costs less than another I/O's latency on every device profile.
pub const MAX_READ_THROUGH_SLOTS: usize = 8;

/// A gentle write-back (`Pace::Gentle`: the pre-cleaner, while the writers are more than half
/// a second from what it has not judged) reads
/// the log in scatter I/Os of at most this many slots (128 KiB) and keeps at most
/// `GENTLE_WRITES_IN_FLIGHT` backing writes in flight, so that a log write or a cache flush
/// arriving meanwhile queues behind little on a device the two share. A whole 4 MiB batch
/// read in one I/O and 32 writes in flight held every FLUSH behind them: fio's nbd engine, 16
/// jobs of 4 KiB random write + FLUSH over 4 GiB through a 1 GiB cache on one disk, the
/// engine's FLUSH p99 was 4.2-4.5 ms; with reads of 32 slots and 4 writes in flight 2.6, with 1
/// write 2.7-2.8 (with 8 slots and 1 write 2.4, with 64 slots 2.9; reads whole and 4 writes
/// 3.6-3.8), the pre-cleaner keeping up as before.
pub const GENTLE_READ_BLOCKS: usize = 32;
/// See `GENTLE_READ_BLOCKS`.
pub const GENTLE_WRITES_IN_FLIGHT: usize = 4;

/// A sequential read stream's misses past this many bytes bypass admission (`streams.rs`):
/// 2 MiB lets a database's read-ahead of an extent or two in, and keeps a scan out.
pub const SEQUENTIAL_BYPASS_BYTES: u64 = 2 << 20;

/// A sequential read stream's hits past this many bytes do not count as reads for the
/// eviction policy (`plan_read`): a scan that reads the volume again (a second backup pass,
/// a re-run report) marks nothing hot, so reclaim does not copy it forward at the expense of
/// writers and of the blocks read at random. The same 2 MiB as the admission bypass, but not
/// turned off with it (`--sequential-bypass 0` admits scans; it does not make them hot).
pub const SEQUENTIAL_REREAD_BYTES: u64 = 2 << 20;

/// The share of the log `create` gives to the read cache's probation ring (per mille): S3-FIFO's
/// small queue, where a block read once waits and only one read again moves into the log
/// (`volume/probation.rs`). S3-FIFO's authors use 10 %; on the shared traces 5 % and 20 % did
/// no better (bench/policy-model.py).
pub const DEFAULT_PROBATION_PERMILLE: u16 = 100;

/// Reads of a copy in the probation ring (after the miss that admitted it; reads while it
/// still waits in RAM do not count) that move it into the log. Two, as S3-FIFO moves a block
/// read twice in its small queue: moving on the first read again made the shared traces miss
/// more (4.7 % above the best policy against 4.5 % in bench/policy-model.py).
pub const PROBATION_PROMOTE_READS: u8 = 2;

/// Blocks the probation ring's admissions gather in RAM before one write (they are served
/// from there meanwhile).
pub const PROBATION_BATCH_BLOCKS: usize = 64;

/// Read requests larger than this bypass admission (sequential scans do not flush the cache).
pub const ADMIT_MAX_REQUEST_BYTES: u64 = 256 * 1024;

/// The background thread's period.
pub const BACKGROUND_PERIOD_MS: u64 = 5;
/// Staged writes older than this are written out by the background thread even without a
/// FLUSH, bounding what a crash can take.
pub const STAGING_MAX_AGE_MS: u64 = 100;

/// At most this many metadata-only records are written per background round to drain the
/// MarkClean queue (each holds up to `RECORD_ENTRIES` entries in one block).
pub const META_RECORDS_PER_TICK: usize = 64;

/// Backpressure: above the high watermark, each write waits up to this long, in proportion
/// to how far dirty data is between the high watermark and a full log.
pub const MAX_WRITE_DELAY_US: u64 = 20_000;

/// `status` lists at most this many lost blocks by number (the count is always exact).
pub const STATUS_LOST_BLOCKS_LISTED: usize = 64;

/// How many (log position, time) samples are kept to date records: the oldest dirty block's
/// age (`status`), the pre-cleaner's horizon and its idle reach (`PRECLEAN_IDLE_AGE_MS`).
pub const AGE_SAMPLES: usize = 4096;

/// At most one age sample per this long: 4,096 of them span at least 41 s, past
/// `PRECLEAN_IDLE_AGE_MS` however busy the writers (at one a millisecond, a busy volume's
/// samples spanned 4 s).
pub const AGE_SAMPLE_INTERVAL_MS: u64 = 10;

const _: () = assert!(DEFAULT_DIRTY_LOW_PERMILLE < DEFAULT_DIRTY_HIGH_PERMILLE);
const _: () = assert!(DEFAULT_DIRTY_HIGH_PERMILLE <= 1000);
const _: () = assert!(CHECKPOINT_INTERVAL_PERMILLE > 0 && CHECKPOINT_INTERVAL_PERMILLE < 500);
