//! `tiercache torture`: the crash simulator from the command line.

use crate::volume_cmds::progress;
use anyhow::{bail, Result};
use clap::Args;
use serde::Serialize;
use tiercache_engine::torture::{run, TortureConfig, TortureReport};
use tiercache_engine::Sabotage;

#[derive(Debug, Args)]
#[command(after_help = "\
Each cycle runs random writes, FUA writes, reads (checked exactly), flushes, trims, write-back
batches and checkpoints on a small simulated cache (so reclaim and log wrap-around happen
often), then crashes: every unflushed write on both devices is dropped, applied or torn
sector by sector; in some cycles a device fails for good mid-run first. After recovery every
block must read as its last flushed version or a newer completed one.

Examples:
  tiercache torture --cycles 10000                 one random seed
  tiercache torture --seed 42 --cycles 10000       replay a seed exactly
  tiercache torture --seeds 16 --cycles 2000       16 seeds, 2 at a time")]
pub struct TortureArgs {
    /// The first seed (random if not given; printed so a run can be replayed).
    #[arg(long)]
    seed: Option<u64>,
    /// How many seeds to run, from --seed upwards.
    #[arg(long, default_value_t = 1)]
    seeds: u64,
    /// Crash cycles per seed.
    #[arg(long, default_value_t = 1000)]
    cycles: u64,
    /// Most operations between two crashes.
    #[arg(long, default_value_t = 200)]
    ops: u64,
    /// Break the commit protocol on purpose, to see the simulator catch it.
    #[arg(long, hide = true, value_parser = parse_sabotage)]
    sabotage: Option<Sabotage>,
    /// Print the result as JSON (for scripts) instead of text.
    #[arg(long)]
    json: bool,
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
    violations: Vec<tiercache_engine::torture::Violation>,
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
        self.violations.extend(r.violations.iter().take(5).cloned());
    }
}

pub fn torture_cmd(args: TortureArgs) -> Result<()> {
    let first = args.seed.unwrap_or_else(|| u64::from(rand::random::<u32>()));
    let seeds: Vec<u64> = (first..first + args.seeds.max(1)).collect();
    let jobs = std::thread::available_parallelism().map_or(1, |n| n.get()).min(seeds.len());
    let pb = progress("crash cycles", args.json);
    pb.set_length(args.cycles * seeds.len() as u64);
    let sabotage = args.sabotage.unwrap_or_default();
    let next = std::sync::atomic::AtomicUsize::new(0);
    let reports = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|s| {
        for _ in 0..jobs {
            s.spawn(|| loop {
                let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let Some(&seed) = seeds.get(i) else { break };
                let config = TortureConfig { seed, cycles: args.cycles, max_ops_per_cycle: args.ops, sabotage };
                let r = run(config, |_| pb.inc(1));
                reports.lock().expect("reports lock").push(r);
            });
        }
    });
    pb.finish_and_clear();
    let mut reports = reports.into_inner().expect("reports lock");
    reports.sort_by_key(|r| r.seed);
    let mut summary = Summary::default();
    for r in &reports {
        summary.add(r);
    }
    let failed: Vec<&TortureReport> = reports.iter().filter(|r| !r.passed()).collect();
    if args.json {
        println!("{}", serde_json::to_string_pretty(&summary)?);
    } else {
        println!(
            "seeds {:?}: {} cycles, {} operations, {} crashes ({} with a device failing mid-run); {} blocks reclaimed, {} written back, {} checkpoints, {} log laps",
            summary.seeds,
            summary.cycles,
            summary.operations,
            summary.crashes,
            summary.injected_device_failures,
            summary.reclaimed_blocks,
            summary.destaged_blocks,
            summary.checkpoints,
            summary.log_wraps
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
            "the contract was violated (seed {} cycle {}: {}); replay with `tiercache torture --seed {} --cycles {}`",
            v.seed,
            v.cycle,
            v.kind,
            v.seed,
            v.cycle + 1
        );
    }
    Ok(())
}
