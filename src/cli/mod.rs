//! The `tilefuse` command line: one module per subcommand, so each can grow on its own.

pub mod bench;
pub mod device;
pub mod generate;
pub mod inspect;

use clap::{Parser, Subcommand};

/// The `tilefuse` command line.
#[derive(Debug, Parser)]
#[command(
    name = "tilefuse",
    version,
    about = "tilefuse: tile kernels for Rust, and a decode engine"
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Print the device kernels run on (the GPU if a driver and device are found,
    /// otherwise the CPU interpreter; TILEFUSE_DEVICE=cpu forces the CPU).
    Device,
    /// Compile the #[kernel] functions of a Rust file and show what the compiler chose:
    /// layouts, vector widths, shared memory, ptxas' register and spill report, PTX.
    // The text is `--help` output, where `#[kernel]` stays as written.
    #[allow(rustdoc::broken_intra_doc_links)]
    Inspect(inspect::InspectArgs),
    /// Generate text (or token ids) from a Hugging Face model directory or a preset,
    /// streaming it, with a tokens/s summary at the end.
    Generate(generate::GenerateArgs),
    /// Decode throughput of a random-weight preset against the bandwidth floor
    /// measured in the same run (graph and eager).
    Bench(bench::BenchArgs),
}

/// Writes `text` to stdout; a reader that went away (`tilefuse inspect .. | head`) is
/// not an error.
pub fn write_stdout(text: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(e.into()),
        _ => Ok(()),
    }
}

/// Runs one command, printing to stdout.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Device => device::run(),
        Command::Inspect(args) => {
            write_stdout(&inspect::run(&args)?)?;
            Ok(())
        }
        Command::Generate(args) => generate::run(&args),
        Command::Bench(args) => bench::run(&args),
    }
}
