//! The `tiercache` command. Thin: parses arguments, calls the library crates, prints reports.
//! Operating errors become one line on stderr and a non-zero exit code.
//!
//! The modules depend on each other in one direction only (no cycles); `a -> b` means `a`
//! uses `b`:
//!
//! ```text
//! volume_cmds -> control, devices, report, safety
//! serve       -> control, devices, metrics, trace_record
//! bench       -> devices, report, safety
//! torture_cmd -> report
//! debug_load  -> devices
//! replay      -> devices          (a block trace through the engine, on devices in RAM)
//! control     -> devices          (the control socket's messages and client side)
//! devices     -> report
//! metrics     -> trace_record     (the frontends' view of the volume notes each request)
//! report, safety, trace_record    (use no other module)
//! ```

mod bench;
mod control;
#[cfg(feature = "simulator")]
mod debug_load;
mod devices;
mod metrics;
mod preload;
mod replay;
mod report;
mod safety;
mod serve;
#[cfg(feature = "simulator")]
mod torture_cmd;
mod trace_record;
mod volume_cmds;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// tiercache: a user-space SSD cache that turns a small fast device and a big slow one into
/// one hybrid volume that databases can live on.
#[derive(Debug, Parser)]
#[command(name = "tiercache", version, about, long_about = None, after_help = "\
Start here:
  tiercache bench fsync                  the seed fsync table on emulated devices, plus the hybrid volume
  tiercache create --cache FAST --backing SLOW [--cache-size 16G]
  tiercache status --cache FAST          what the cache holds, how dirty it is, its hit ratio
  tiercache flush --cache FAST --backing SLOW   write everything back (then SLOW alone is complete)
  tiercache torture --seeds 20           the crash simulator (about 10 s; --help for more)

A DEVICE is a file or block device path, or emulated:PROFILE:PATH for a file with the timing
of optane, nvme, sata-raid5, hdd or usb-disk. `tiercache <COMMAND> --help` has examples.")]
struct Cli {
    /// How log lines on stderr look: text (coloured only on a terminal, and never with
    /// NO_COLOR set) or json (one object per line, for log collectors). TIERCACHE_LOG sets
    /// the level (e.g. TIERCACHE_LOG=debug).
    // (Listed last in every command's help, not among its own options.)
    #[arg(long, global = true, value_enum, default_value_t = LogFormat::Text, display_order = 1000)]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Format a cache device for a backing device (only the cache device is written).
    Create(volume_cmds::CreateArgs),
    /// Show what a cache holds: sizes, dirty data, hit ratio, index RAM.
    Status(volume_cmds::StatusArgs),
    /// Check a cache offline: log chain, every block's checksum, clean blocks against backing.
    Check(volume_cmds::CheckArgs),
    /// Serve the volume over NBD, FUSE and/or ublk until SIGTERM (`status` works meanwhile).
    Serve(serve::ServeArgs),
    /// Write every dirty block back; afterwards the backing device alone holds all data.
    Flush(volume_cmds::FlushArgs),
    /// Run the crash simulator: random I/O, crashes with torn writes, recovery, checks.
    #[cfg(feature = "simulator")]
    Torture(torture_cmd::TortureArgs),
    /// Warm a served volume's cache with files on it (FIEMAP) or byte ranges, kept as hot.
    Preload(preload::PreloadArgs),
    /// Start or stop recording a trace of a served volume's requests (for `replay`).
    Trace(volume_cmds::TraceArgs),
    /// Replay a block trace through the engine at several cache sizes: miss ratio, SSD writes.
    Replay(replay::ReplayArgs),
    /// Measure devices and volumes side by side (fsync rate, write-back throughput).
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// A deterministic writer for crash tests (prints `flushed N` after each FLUSH).
    #[command(hide = true)]
    #[cfg(feature = "simulator")]
    DebugLoad(debug_load::DebugLoadArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    // The simulator injects device failures on purpose: their error logs are noise there.
    let default_filter = match cli.command {
        #[cfg(feature = "simulator")]
        Command::Torture(_) => "off",
        // fuser warns when its own unmount finds the mount gone, which is what a clean stop
        // does (serve unmounts first, to see whether the file is still in use).
        // And it logs an error for every reply the kernel no longer wants: its ENOSYS to each
        // FUSE_INTERRUPT (a signal to a process waiting on the FUSE file) is sent where the
        // kernel cannot find the request (the review counted 2,400 lines in 3 s); a reply that
        // matters failing shows as the requester's error, not here.
        Command::Serve(_) => "info,fuser::mnt=error,fuser::reply=off",
        _ => "warn",
    };
    let filter = tracing_subscriber::EnvFilter::try_from_env("TIERCACHE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default_filter));
    let logs = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    match cli.log_format {
        LogFormat::Json => logs.json().init(),
        LogFormat::Text => {
            use std::io::IsTerminal;
            let colour = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty());
            logs.with_ansi(colour).init()
        }
    }
    let result = match cli.command {
        Command::Create(a) => volume_cmds::create_cmd(a),
        Command::Status(a) => volume_cmds::status_cmd(a),
        Command::Check(a) => volume_cmds::check_cmd(a),
        Command::Flush(a) => volume_cmds::flush_cmd(a),
        Command::Serve(a) => serve::serve_cmd(a),
        #[cfg(feature = "simulator")]
        Command::Torture(a) => torture_cmd::torture_cmd(a),
        Command::Bench(cmd) => bench::run(cmd),
        Command::Replay(a) => replay::replay_cmd(a),
        Command::Trace(a) => volume_cmds::trace_cmd(a),
        Command::Preload(a) => preload::preload_cmd(a),
        #[cfg(feature = "simulator")]
        Command::DebugLoad(a) => debug_load::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // `{:#}` prints the context chain on one line: "cache device: X: no such file".
            eprintln!("tiercache: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
