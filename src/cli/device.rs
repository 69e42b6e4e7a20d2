//! `tilefuse device`: which device kernels would run on.

use crate::dsl::runtime::Device;

/// Prints the device kernels run on.
pub fn run() -> anyhow::Result<()> {
    let dev = Device::auto();
    println!("{dev}: {}", dev.name());
    Ok(())
}
