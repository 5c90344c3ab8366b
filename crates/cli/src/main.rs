//! The `tiercache` command. Thin: parses arguments, calls the library crates, prints reports.
//! Operating errors become one line on stderr and a non-zero exit code.

mod bench;
mod report;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// tiercache: a user-space SSD cache that turns a small fast device and a big slow one into
/// one hybrid volume that databases can live on.
#[derive(Debug, Parser)]
#[command(name = "tiercache", version, about, long_about = None, after_help = "\
Start here:
  tiercache bench fsync                 reproduce the fsync table of the seeds on emulated devices
  tiercache bench fsync --target FILE   measure a real file (O_DIRECT and buffered)
  tiercache <COMMAND> --help            what each command does, with examples")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Measure devices and volumes: fsync rate and latency percentiles, side by side.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench(cmd) => bench::run(cmd),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            // `{:#}` prints the context chain on one line: "opening X: X: no such file".
            eprintln!("tiercache: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
