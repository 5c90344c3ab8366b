//! `tiercache debug-load` (hidden): a deterministic writer for process-level crash tests and
//! the recovery benchmark. It writes stamped blocks (block number + version) chosen by a
//! seeded generator, flushes every N writes and prints `flushed I` once writes 0..I are
//! durable, so a parent can SIGKILL it at any moment and know exactly what must survive.

use crate::devices::DeviceSpec;
use anyhow::Result;
use clap::Args;
use rand::{Rng, SeedableRng};
use std::io::Write;
use std::sync::Arc;
use tiercache_device::MonotonicClock;
use tiercache_engine::{create, Background, CreateOptions, Volume, VolumeOptions};
use tiercache_sim::stamp::stamp;

#[derive(Debug, Args)]
pub struct DebugLoadArgs {
    #[arg(long)]
    cache: String,
    #[arg(long)]
    backing: String,
    /// Format the cache first.
    #[arg(long)]
    create: bool,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Random writes fall into blocks [0, blocks).
    #[arg(long, default_value_t = 1024)]
    blocks: u64,
    #[arg(long, default_value_t = 8)]
    flush_every: u64,
    /// Before the random writes: write blocks [0, fill) sequentially, write back all but
    /// --dirty-percent of them, then print `ready CACHED DIRTY`.
    #[arg(long, default_value_t = 0)]
    fill: u64,
    #[arg(long, default_value_t = 50)]
    dirty_percent: u64,
    /// Stop after this many random writes (default: run until killed).
    #[arg(long)]
    writes: Option<u64>,
}

/// The version of random write `i` (fill writes use version 0x8000_0000_0000_0000 + block).
pub fn random_write(rng: &mut rand_chacha::ChaCha8Rng, blocks: u64, i: u64) -> (u64, u64) {
    (rng.gen_range(0..blocks), i + 1)
}

pub fn run(args: DebugLoadArgs) -> Result<()> {
    let cache = DeviceSpec::parse(&args.cache)?.open("cache")?;
    let backing = DeviceSpec::parse(&args.backing)?.open("backing")?;
    if args.create {
        create(&*cache, &*backing, &CreateOptions::default())?;
    }
    let (volume, _) = Volume::open(cache, backing, Arc::new(MonotonicClock::new()), VolumeOptions::default())?;
    let volume = Arc::new(volume);
    let _background = Background::start(&volume);
    let bs = volume.block_size() as usize;
    let mut out = std::io::stdout().lock();
    if args.fill > 0 {
        let chunk = 64u64;
        let mut buf = vec![0u8; chunk as usize * bs];
        let mut b = 0;
        while b < args.fill {
            let n = chunk.min(args.fill - b);
            for i in 0..n {
                stamp(b + i, (1 << 63) + b + i, &mut buf[i as usize * bs..(i as usize + 1) * bs]);
            }
            volume.write(b * bs as u64, &buf[..n as usize * bs])?;
            b += n;
        }
        volume.flush()?;
        let target = args.fill * args.dirty_percent / 100;
        while volume.status().dirty_blocks > target {
            if volume.destage_step(4096)? == 0 {
                break;
            }
        }
        // Make the clean/dirty split durable (the MarkClean entries and a checkpoint).
        volume.checkpoint()?;
        let s = volume.status();
        writeln!(out, "ready {} {}", s.cached_blocks, s.dirty_blocks)?;
        out.flush()?;
    }
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(args.seed);
    let mut block = vec![0u8; bs];
    let mut i = 0u64;
    while args.writes.is_none_or(|n| i < n) {
        let (b, v) = random_write(&mut rng, args.blocks, i);
        stamp(b, v, &mut block);
        volume.write(b * bs as u64, &block)?;
        i += 1;
        if i.is_multiple_of(args.flush_every) {
            volume.flush()?;
            writeln!(out, "flushed {i}")?;
            out.flush()?;
        }
    }
    volume.shutdown()?;
    Ok(())
}
