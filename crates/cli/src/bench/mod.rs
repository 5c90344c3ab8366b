//! `tiercache bench ...`: the experiments of docs/seeds.md as product features. Every benchmark
//! measures its targets side by side in one run, so ratios stay meaningful on a noisy machine.

mod fsync;
mod randwrite;
mod recovery;
mod seq;
mod through;

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// The fsync experiment (docs/seeds.md §2): "write 4 KiB, flush" in a loop on each target.
    ///
    /// Reports fsyncs per second and latency percentiles. With no --target it runs the
    /// default matrix on emulated devices (optane, nvme, usb-disk), reproducing the seed
    /// table in a few seconds with no special hardware.
    ///
    /// A PATH target is an existing regular file or block device; it is measured twice, with
    /// O_DIRECT and buffered (write then fdatasync), like the seed table's ext4 rows. The
    /// benchmark OVERWRITES the first 4 KiB of a PATH target; a block device is refused
    /// unless --destructive is given.
    #[command(after_help = "\
Examples:
  tiercache bench fsync                                  default matrix, 3 s per target
  tiercache bench fsync --seconds 5 --json               machine-readable results
  tiercache bench fsync --target emulated:hdd            one emulated profile
  fallocate -l 64M /mnt/fast/bench.img && tiercache bench fsync --target /mnt/fast/bench.img
  sudo tiercache bench fsync --through fuse --seconds 20   ext4 on the FUSE file vs on a raw file
  sudo tiercache bench fsync --through nbd --seconds 20    the same through NBD (nbdfuse)

Emulated profiles: optane, nvme, sata-raid5, hdd, usb-disk (see docs/devices.md).")]
    Fsync(fsync::FsyncArgs),
    /// Write-back throughput: random 4 KiB writes with a flush every N, raw cache device vs
    /// the hybrid volume in the same run.
    Randwrite(randwrite::RandwriteArgs),
    /// Restart time after SIGKILL: fill a cache on real files, kill the writer, time recovery.
    Recovery(recovery::RecoveryArgs),
    /// Large-request bandwidth: sequential writes and reads of the hybrid volume (into an
    /// empty cache, hits, misses, over a full cache, destage-bound) against the raw cache and
    /// backing devices, at several request sizes and queue depths, in one run.
    Seq(seq::SeqArgs),
}

pub fn run(cmd: BenchCommand) -> anyhow::Result<()> {
    match cmd {
        BenchCommand::Fsync(args) => fsync::run(args),
        BenchCommand::Randwrite(args) => randwrite::run(args),
        BenchCommand::Recovery(args) => recovery::run(args),
        BenchCommand::Seq(args) => seq::run(args),
    }
}
