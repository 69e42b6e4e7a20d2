//! The `tilefuse` command line.
//!
//! `tilefuse device` reports the device kernels would run on. The decode commands
//! (`generate`, `bench`) arrive with the engine's kernel-based decode path.

use tilefuse::dsl::runtime::Device;

const USAGE: &str = "usage: tilefuse <command>

commands:
  device    print the device kernels run on (the GPU if a driver and device are found,
            otherwise the CPU interpreter; TILEFUSE_DEVICE=cpu forces the CPU)
  help      print this message";

fn main() -> anyhow::Result<()> {
    let cmd = std::env::args().nth(1);
    match cmd.as_deref() {
        Some("device") => {
            let dev = Device::auto();
            println!("{dev}: {}", dev.name());
            Ok(())
        }
        None | Some("help" | "--help" | "-h") => {
            println!("{USAGE}");
            Ok(())
        }
        Some(other) => anyhow::bail!("unknown command `{other}`\n\n{USAGE}"),
    }
}
