//! Runtime and launch errors.

use cudarc::driver::DriverError;

use crate::interp::InterpError;

/// An error creating a device, allocating or copying memory.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The CUDA driver library could not be loaded.
    #[error("no CUDA driver found (libcuda.so.1): {detail}")]
    NoDriver {
        /// What the loader said.
        detail: String,
    },
    /// The driver loaded but there is no usable device with that ordinal.
    #[error("no CUDA device{}: {detail}", .ordinal.map(|o| format!(" with ordinal {o}")).unwrap_or_default())]
    NoDevice {
        /// The ordinal asked for, when one was.
        ordinal: Option<usize>,
        /// Why (device count, driver error).
        detail: String,
    },
    /// A CUDA driver call failed.
    #[error("CUDA driver error while {what}: {source}")]
    Driver {
        /// The operation that failed.
        what: String,
        /// The driver's error code.
        #[source]
        source: DriverError,
    },
    /// The CUDA bindings panicked (for example on a driver missing an entry point);
    /// caught so that callers see an error instead.
    #[error("the CUDA driver bindings failed while {what}: {message}")]
    DriverPanic {
        /// The operation that failed.
        what: String,
        /// The panic message.
        message: String,
    },
    /// A copy between host and buffer with mismatched lengths.
    #[error("length mismatch: buffer holds {buffer} elements, host data has {host}")]
    LengthMismatch {
        /// Elements in the buffer.
        buffer: usize,
        /// Elements in the host slice.
        host: usize,
    },
    /// Two objects that must share a device do not.
    #[error("{what} live on different devices")]
    WrongDevice {
        /// The two objects.
        what: String,
    },
}

impl RuntimeError {
    pub(crate) fn driver(what: impl Into<String>) -> impl FnOnce(DriverError) -> RuntimeError {
        let what = what.into();
        move |source| RuntimeError::Driver { what, source }
    }
}

/// An error launching a kernel; every variant names the kernel.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// No variant was compiled for the requested constants and warp count.
    #[error(
        "kernel `{kernel}`: no compiled variant for {requested}; compiled variants: {available}"
    )]
    NoVariant {
        /// The kernel.
        kernel: String,
        /// What was asked for (`BLOCK=512, num_warps=4`).
        requested: String,
        /// Every compiled combination.
        available: String,
    },
    /// No compiled value of a constant is at least the value asked for
    /// ([`KernelDef::pick_at_least`](super::KernelDef::pick_at_least)).
    #[error(
        "kernel `{kernel}`: no compiled {name} is at least {wanted}; compiled values: {compiled:?}"
    )]
    NoFit {
        /// The kernel.
        kernel: String,
        /// The constant.
        name: String,
        /// The value asked for.
        wanted: i64,
        /// The compiled values, ascending.
        compiled: Vec<i64>,
    },
    /// The launch configuration is invalid (zero or oversized grid, wrong number of
    /// compile-time constants).
    #[error("kernel `{kernel}`: invalid launch configuration: {message}")]
    Config {
        /// The kernel.
        kernel: String,
        /// What is wrong.
        message: String,
    },
    /// A buffer cannot be seen as elements of another type
    /// ([`KernelArg::read_as`](super::KernelArg::read_as)): its bytes are not a whole
    /// number of them.
    #[error("{message}")]
    Reinterpret {
        /// The buffer's length and types.
        message: String,
    },
    /// The number of arguments does not match the kernel's parameters.
    #[error("kernel `{kernel}` takes {expected} arguments ({params}), got {got}")]
    ArgCount {
        /// The kernel.
        kernel: String,
        /// Parameters in the signature.
        expected: usize,
        /// Parameter names, for the message.
        params: String,
        /// Arguments passed.
        got: usize,
    },
    /// One argument does not fit its parameter.
    #[error("kernel `{kernel}`, parameter `{param}`: {message}")]
    Arg {
        /// The kernel.
        kernel: String,
        /// The parameter's name.
        param: String,
        /// What is wrong, with the expected and given values.
        message: String,
    },
    /// Compiling the kernel's source for the interpreter failed.
    #[error("kernel `{kernel}`: compiling for the interpreter failed: {message}")]
    Compile {
        /// The kernel.
        kernel: String,
        /// The compiler's message.
        message: String,
    },
    /// The interpreter reported an error (it names the kernel itself).
    #[error(transparent)]
    Interp(#[from] InterpError),
    /// A CUDA driver call failed while loading or launching.
    #[error("kernel `{kernel}`: CUDA driver error while {what}: {source}")]
    Driver {
        /// The kernel.
        kernel: String,
        /// The operation that failed.
        what: String,
        /// The driver's error code.
        #[source]
        source: DriverError,
    },
}
