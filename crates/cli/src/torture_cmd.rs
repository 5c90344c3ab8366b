//! `tiercache torture`: the crash simulator from the command line.

use crate::report::progress;
use anyhow::{bail, Result};
use clap::Args;
use serde::Serialize;
use tiercache_engine::Sabotage;
use tiercache_sim::serial::{run, TortureConfig, TortureReport};

#[derive(Debug, Args)]
#[command(after_help = "\
Two simulators, both deterministic (one seed replays one run exactly):

--mode concurrent (the default): client actors (writes, identical rewrites, FUA, unaligned
read-modify-write writes, write-zeroes, discards, reads checked exactly, flushes; after a crash
they redo their unflushed writes), a destager, a background worker and checkpoints run as
threads interleaved by the seed at every engine lock and device I/O; the backing device is
slow (milliseconds per write, up to hundreds per flush) so the log laps during one
write-back; power is cut at a random step or while several cache writes wait unflushed,
sometimes during recovery; some cycles corrupt cached data silently, inject latent read errors
or make a device fail; some run a circular redo log (a commit per write, each block rewritten
into the cache slot its last version held); half the seeds replay a journal after every crash,
rebuilding a record the crash dropped byte for byte. After each crash every
block must read as its last flushed content or a newer completed one, or as an I/O error only
if its data was corrupted.

--mode serial: the original single-threaded simulator. Each cycle runs random writes, FUA writes, reads (checked exactly), flushes, trims, write-back
batches and checkpoints on a small simulated cache (so reclaim and log wrap-around happen
often), then crashes: every unflushed write on both devices is dropped, applied or torn
sector by sector; in some cycles a device fails for good mid-run first. After recovery every
block must read as its last flushed version or a newer completed one.

Examples:
  tiercache torture --seeds 1000                   1000 random concurrent seeds, all cores
  tiercache torture --seed 42                      replay concurrent seed 42 exactly
  tiercache torture --mode serial --cycles 10000   one serial seed, 10000 crash cycles
  tiercache torture --seeds 16 --json              a JSON summary for scripts")]
pub struct TortureArgs {
    /// Which simulator: `concurrent` (actors interleaved by the seed) or `serial`.
    #[arg(long, value_enum, default_value_t = Mode::Concurrent)]
    mode: Mode,
    /// The first seed (random if not given; printed so a run can be replayed).
    #[arg(long)]
    seed: Option<u64>,
    /// How many seeds to run, from --seed upwards.
    #[arg(long, default_value_t = 1)]
    seeds: u64,
    /// Crash cycles per seed (default: 5 concurrent, 1000 serial).
    #[arg(long)]
    cycles: Option<u64>,
    /// Most operations between two crashes (per client in the concurrent mode; default 40
    /// concurrent, 200 serial).
    #[arg(long)]
    ops: Option<u64>,
    /// Break the engine on purpose, to see the simulator catch it: flush-skips-cache-flush,
    /// reclaim-skips-marker-flush, destage-skips-backing-flush, mark-clean-by-slot,
    /// lost-in-ram-only, no-recovery-epoch, write-around-skips-backing-flush or
    /// flush-ignores-record-pipeline (never on real devices: the simulator only).
    #[arg(long, value_parser = parse_sabotage)]
    sabotage: Option<Sabotage>,
    /// Print the result as JSON (for scripts) instead of text.
    #[arg(long)]
    json: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Mode {
    Concurrent,
    Serial,
}

fn parse_sabotage(s: &str) -> Result<Sabotage, String> {
    Sabotage::ALL
        .into_iter()
        .find(|x| x.name() == s)
        .ok_or_else(|| format!("unknown sabotage '{s}'; known: {}", Sabotage::ALL.map(|x| x.name()).join(", ")))
}

#[derive(Debug, Default, Serialize)]
struct Summary {
    seeds: Vec<u64>,
    cycles: u64,
    operations: u64,
    crashes: u64,
    lost_blocks: u64,
    stale_reads: u64,
    corrupt_reads: u64,
    unexpected_errors: u64,
    recovery_failures: u64,
    injected_device_failures: u64,
    reclaimed_blocks: u64,
    destaged_blocks: u64,
    checkpoints: u64,
    log_wraps: u64,
    handed_off_records: u64,
    handed_off_records_written_by_waiters: u64,
    violations: Vec<tiercache_sim::Violation>,
}

impl Summary {
    fn add(&mut self, r: &TortureReport) {
        self.seeds.push(r.seed);
        self.cycles += r.cycles;
        self.operations += r.operations;
        self.crashes += r.crashes;
        self.lost_blocks += r.lost_blocks;
        self.stale_reads += r.stale_reads;
        self.corrupt_reads += r.corrupt_reads;
        self.unexpected_errors += r.unexpected_errors;
        self.recovery_failures += r.recovery_failures;
        self.injected_device_failures += r.injected_device_failures;
        self.reclaimed_blocks += r.reclaimed_blocks;
        self.destaged_blocks += r.destaged_blocks;
        self.checkpoints += r.checkpoints;
        self.log_wraps += r.log_wraps;
        self.handed_off_records += r.handed_off_records;
        self.handed_off_records_written_by_waiters += r.handed_off_records_written_by_waiters;
        self.violations.extend(r.violations.iter().take(5).cloned());
    }
}

/// Runs `work` for every seed on all cores; results in seed order.
fn run_seeds<R: Send>(seeds: &[u64], work: impl Fn(u64) -> R + Sync) -> Vec<R> {
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get()).min(seeds.len()).max(1);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let results = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&seed) = seeds.get(i) else { break };
                let r = work(seed);
                results.lock().expect("results lock").push((i, r));
            });
        }
    });
    let mut results = results.into_inner().expect("results lock");
    results.sort_by_key(|(i, _)| *i);
    results.into_iter().map(|(_, r)| r).collect()
}

#[derive(Debug, Default, Serialize)]
struct ConcurrentSummary {
    mode: &'static str,
    first_seed: u64,
    seeds: u64,
    failed_seeds: Vec<u64>,
    cycles: u64,
    operations: u64,
    crashes: u64,
    crashes_during_recovery: u64,
    clean_shutdowns: u64,
    corruptions: u64,
    lost_block_errors: u64,
    scheduling_steps: u64,
    records_written: u64,
    overlapped_record_writes: u64,
    staged_during_record_writes: u64,
    nested_record_writes: u64,
    handed_off_records: u64,
    handed_off_by_readers: u64,
    handed_off_records_written_by_waiters: u64,
    preclean_swept_blocks: u64,
    preclean_idle_blocks: u64,
    gentle_write_back_batches: u64,
    destaged_blocks: u64,
    copied_forward_blocks: u64,
    dense_copy_forwards: u64,
    dense_copy_throughs: u64,
    reclaim_write_backs: u64,
    batched_cache_reads: u64,
    reinserted_blocks: u64,
    probation_admitted_blocks: u64,
    promoted_blocks: u64,
    written_around_blocks: u64,
    concurrent_write_arounds: u64,
    written_around_at_dirty_head: u64,
    written_around_beside_write_back: u64,
    records_written_ahead: u64,
    checkpoints: u64,
    log_laps: u64,
    violations: Vec<tiercache_sim::Violation>,
}

fn concurrent(args: &TortureArgs, first: u64) -> Result<()> {
    let seeds: Vec<u64> = (first..first + args.seeds.max(1)).collect();
    let pb = progress("seeds", args.json);
    pb.set_length(seeds.len() as u64);
    let defaults = tiercache_sim::SimConfig::default();
    let config = |seed| tiercache_sim::SimConfig {
        seed,
        cycles: args.cycles.unwrap_or(defaults.cycles),
        ops: args.ops.unwrap_or(defaults.ops),
        sabotage: args.sabotage.unwrap_or_default(),
    };
    let reports = run_seeds(&seeds, |seed| {
        let r = tiercache_sim::run(config(seed));
        pb.inc(1);
        r
    });
    pb.finish_and_clear();
    let mut s =
        ConcurrentSummary { mode: "concurrent", first_seed: first, seeds: seeds.len() as u64, ..Default::default() };
    for r in &reports {
        if !r.passed() {
            s.failed_seeds.push(r.seed);
        }
        s.cycles += r.cycles;
        s.operations += r.operations;
        s.crashes += r.crashes;
        s.crashes_during_recovery += r.crashes_during_recovery;
        s.clean_shutdowns += r.clean_shutdowns;
        s.corruptions += r.corruptions;
        s.lost_block_errors += r.lost_block_errors;
        s.scheduling_steps += r.scheduling_steps;
        s.records_written += r.records_written;
        s.overlapped_record_writes += r.overlapped_record_writes;
        s.staged_during_record_writes += r.staged_during_record_writes;
        s.nested_record_writes += r.nested_record_writes;
        s.handed_off_records += r.handed_off_records;
        s.handed_off_records_written_by_waiters += r.handed_off_records_written_by_waiters;
        s.handed_off_by_readers += r.handed_off_by_readers;
        s.preclean_swept_blocks += r.preclean_swept_blocks;
        s.preclean_idle_blocks += r.preclean_idle_blocks;
        s.gentle_write_back_batches += r.gentle_write_back_batches;
        s.destaged_blocks += r.destaged_blocks;
        s.copied_forward_blocks += r.copied_forward_blocks;
        s.dense_copy_forwards += r.dense_copy_forwards;
        s.dense_copy_throughs += r.dense_copy_throughs;
        s.reclaim_write_backs += r.reclaim_write_backs;
        s.batched_cache_reads += r.batched_cache_reads;
        s.reinserted_blocks += r.reinserted_blocks;
        s.probation_admitted_blocks += r.probation_admitted_blocks;
        s.promoted_blocks += r.promoted_blocks;
        s.written_around_blocks += r.written_around_blocks;
        s.concurrent_write_arounds += r.concurrent_write_arounds;
        s.written_around_at_dirty_head += r.written_around_at_dirty_head;
        s.written_around_beside_write_back += r.written_around_beside_write_back;
        s.records_written_ahead += r.records_written_ahead;
        s.checkpoints += r.checkpoints;
        s.log_laps += r.log_laps;
        if s.violations.len() < 20 {
            s.violations.extend(r.violations.iter().take(3).cloned());
        }
    }
    if args.json {
        println!("{}", serde_json::to_string_pretty(&s)?);
    } else {
        println!(
            "{} seeds from {}: {} crash cycles ({} crashes during recovery, {} clean shutdowns), {} operations, {} scheduling steps",
            s.seeds, s.first_seed, s.cycles, s.crashes_during_recovery, s.clean_shutdowns, s.operations, s.scheduling_steps
        );
        println!(
            "engine: {} records ({} written while their writer staged the rest of its request, {} more sealed and written while its previous one was in flight; {} handed to the record writer, {} of them sealed by readers, {} written by a thread that needed them first, {} written ahead of a FLUSH), {} blocks written back ({} left by the pre-cleaner to a sequential writer about to supersede them, {} written back beyond its horizon over old data; {} batches at the gentle pace), {} copied forward ({} reclaims copied dense dirty windows ({} judged over the lap), {} wrote them back), {} clean blocks reinserted, {} misses into the probation ring ({} read again there, into the log), {} written around ({} writes at a dirty head below the watermark, {} beside a write-back batch), {} checkpoints, {} log laps, {} reads of several runs in one batch; media: {} corruptions, {} lost-block errors (all on corrupted blocks)",
            s.records_written, s.staged_during_record_writes, s.nested_record_writes, s.handed_off_records, s.handed_off_by_readers, s.handed_off_records_written_by_waiters, s.records_written_ahead, s.destaged_blocks, s.preclean_swept_blocks, s.preclean_idle_blocks, s.gentle_write_back_batches, s.copied_forward_blocks, s.dense_copy_forwards, s.dense_copy_throughs, s.reclaim_write_backs, s.reinserted_blocks, s.probation_admitted_blocks, s.promoted_blocks, s.written_around_blocks, s.written_around_at_dirty_head, s.written_around_beside_write_back, s.checkpoints, s.log_laps, s.batched_cache_reads, s.corruptions, s.lost_block_errors
        );
        println!("{} seeds passed, {} failed", s.seeds - s.failed_seeds.len() as u64, s.failed_seeds.len());
        for v in &s.violations {
            println!("violation: seed {} cycle {}: {} block {:?}: {}", v.seed, v.cycle, v.kind, v.block, v.detail);
        }
    }
    if let Some(&seed) = s.failed_seeds.first() {
        bail!("the contract was violated (seed {seed}); replay with `tiercache torture --seed {seed}`");
    }
    Ok(())
}

pub fn torture_cmd(args: TortureArgs) -> Result<()> {
    let first = args.seed.unwrap_or_else(|| u64::from(rand::random::<u32>()));
    if args.mode == Mode::Concurrent {
        return concurrent(&args, first);
    }
    let cycles = args.cycles.unwrap_or(1000);
    let ops = args.ops.unwrap_or(200);
    let seeds: Vec<u64> = (first..first + args.seeds.max(1)).collect();
    let pb = progress("crash cycles", args.json);
    pb.set_length(cycles * seeds.len() as u64);
    let sabotage = args.sabotage.unwrap_or_default();
    let reports =
        run_seeds(&seeds, |seed| run(TortureConfig { seed, cycles, max_ops_per_cycle: ops, sabotage }, |_| pb.inc(1)));
    pb.finish_and_clear();
    let mut summary = Summary::default();
    for r in &reports {
        summary.add(r);
    }
    let failed: Vec<&TortureReport> = reports.iter().filter(|r| !r.passed()).collect();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        println!(
            "seeds {:?}: {} cycles, {} operations, {} crashes ({} with a device failing mid-run); {} blocks reclaimed, {} written back, {} checkpoints, {} log laps; {} records handed to the record writer ({} written by a thread that needed them first)",
            summary.seeds,
            summary.cycles,
            summary.operations,
            summary.crashes,
            summary.injected_device_failures,
            summary.reclaimed_blocks,
            summary.destaged_blocks,
            summary.checkpoints,
            summary.log_wraps,
            summary.handed_off_records,
            summary.handed_off_records_written_by_waiters
        );
        println!(
            "lost blocks {}, stale reads {}, corrupt reads {}, unexpected errors {}, failed recoveries {}",
            summary.lost_blocks,
            summary.stale_reads,
            summary.corrupt_reads,
            summary.unexpected_errors,
            summary.recovery_failures
        );
        for v in &summary.violations {
            println!("violation: seed {} cycle {}: {} block {:?}: {}", v.seed, v.cycle, v.kind, v.block, v.detail);
        }
    }
    if let Some(r) = failed.first() {
        let v = &r.violations[0];
        bail!(
            "the contract was violated (seed {} cycle {}: {}); replay with `tiercache torture --mode serial --seed {} --cycles {}`",
            v.seed,
            v.cycle,
            v.kind,
            v.seed,
            v.cycle + 1
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    /// `--sabotage`'s help names every variant the simulator knows (it named 6 of 8).
    #[test]
    fn the_help_names_every_sabotage() {
        use clap::Args;
        let cmd = super::TortureArgs::augment_args(clap::Command::new("torture"));
        let arg = cmd.get_arguments().find(|a| a.get_id() == "sabotage").expect("--sabotage");
        let help = arg.get_help().expect("a help text").to_string();
        for s in tiercache_engine::Sabotage::ALL {
            assert!(help.contains(s.name()), "--sabotage's help leaves out {}: {help}", s.name());
        }
    }
}
