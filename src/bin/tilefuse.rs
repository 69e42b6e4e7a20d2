//! The `tilefuse` command line; the subcommands live in `tilefuse::cli`.

use clap::Parser;

fn main() {
    let cli = tilefuse::cli::Cli::parse();
    if let Err(e) = tilefuse::cli::run(cli) {
        eprintln!("error: {e:#}");
        std::process::exit(1);
    }
}
