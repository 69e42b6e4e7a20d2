//! Devices, buffers and launches.
//!
//! A [`Device`] is either the CPU (kernels run on the reference interpreter) or a CUDA
//! GPU (kernels run from the PTX that `#[kernel]` compiled at build time). A
//! [`Buffer`] holds elements on one device. A [`KernelDef`] is the static description
//! `#[kernel]` emits; its typed `launch` functions and [`KernelDef::launch_dyn`] check
//! every argument against the kernel's signature before anything runs; the generated
//! `<Name>Args` / `<Name>Consts` ([`KernelConsts`]) launch with constants chosen at run
//! time, by name. [`Device::capture`] records launches as a [`Graph`]; [`timing`] holds
//! the device facts and GPU timing that measurements need.
//!
//! GPU detection never panics: the CUDA driver library is probed with `dlopen` before
//! the driver API is touched, so binaries run (on the CPU) on machines without a GPU.

mod device;
mod element;
mod error;
mod graph;
mod kernel;
mod readback;
pub mod testing;
pub mod timing;
mod typed;

pub use device::{cuda_available, Buffer, CudaDevice, Device};
pub use element::{as_bytes, as_bytes_mut, Element};
pub use error::{LaunchError, RuntimeError};
pub use graph::Graph;
pub use kernel::{
    deflate_ptx, inflate_ptx, KernelArg, KernelDef, LaunchConfig, ParamDef, Ptx, Variant,
};
pub use readback::Readback;
pub use timing::DeviceInfo;
pub use typed::KernelConsts;

#[cfg(test)]
mod gpu_tests;
