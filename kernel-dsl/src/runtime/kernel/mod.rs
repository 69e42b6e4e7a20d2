//! Kernel descriptions, launch configurations, arguments and the launch itself.

use std::collections::HashMap;
use std::ffi::c_void;
use std::fmt::{self, Write as _};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::CudaFunction;
use cudarc::nvrtc::Ptx as CudaPtx;

use super::device::{CudaDevice, Device, ErasedBuffer};
use super::element::Element;
use super::error::LaunchError;
use super::Buffer;
use crate::back::ptx::Target;
use crate::interp::{self, Scalar};
use crate::ir::{self, DType, ParamKind};
use crate::Specialization;

/// Most parameters a kernel may take (launch arguments live in a fixed-size array so a
/// GPU launch allocates nothing).
pub const MAX_PARAMS: usize = 64;

/// Largest grid extents CUDA accepts in x, y and z.
const MAX_GRID: [u32; 3] = [i32::MAX as u32, 65535, 65535];

/// Grid size and warps per program for one launch.
///
/// Converts from `u32` (a 1-D grid), `(u32, u32)`, `(u32, u32, u32)` and `[u32; 3]`;
/// `num_warps: None` picks the first compiled `num_warps` value, `num_stages: None` the
/// first compiled `num_stages` value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LaunchConfig {
    /// Programs along x, y and z.
    pub grid: [u32; 3],
    /// Warps per program; `None` for the kernel's first listed value.
    pub num_warps: Option<u32>,
    /// Pipelining depth (`num_stages` in `#[kernel(..)]`); `None` for the first value
    /// compiled with the constants and warp count.
    pub num_stages: Option<u32>,
    /// No programmatic overlap: the launch starts only after every earlier launch on
    /// the stream has finished (see [`LaunchConfig::serialized`]).
    pub serialized: bool,
}

impl LaunchConfig {
    /// A configuration for this grid and the default warp count.
    pub fn grid(grid: [u32; 3]) -> LaunchConfig {
        LaunchConfig {
            grid,
            num_warps: None,
            num_stages: None,
            serialized: false,
        }
    }

    /// Sets the warps per program.
    pub fn num_warps(self, num_warps: u32) -> LaunchConfig {
        LaunchConfig {
            num_warps: Some(num_warps),
            ..self
        }
    }

    /// Sets the pipelining depth: the variant compiled with this `num_stages` value
    /// (a kernel lists several as `num_stages = [3, 4]`).
    pub fn num_stages(self, num_stages: u32) -> LaunchConfig {
        LaunchConfig {
            num_stages: Some(num_stages),
            ..self
        }
    }

    /// Starts the launch only after every earlier launch on the stream has finished.
    ///
    /// With programmatic dependent launch (Hopper), a kernel's programs may start while
    /// earlier kernels still run, and what they load before `wait_for_prior_kernels()`
    /// may be read before those kernels' stores land; since each kernel in a chain may
    /// start early, that holds for every launch back to the last serialized one, not only
    /// the one just before. Serialize the first launch of a unit of work (a decode step)
    /// so that data the previous unit wrote may be read before the wait.
    pub fn serialized(self) -> LaunchConfig {
        LaunchConfig {
            serialized: true,
            ..self
        }
    }
}

impl From<u32> for LaunchConfig {
    fn from(x: u32) -> LaunchConfig {
        LaunchConfig::grid([x, 1, 1])
    }
}

impl From<(u32, u32)> for LaunchConfig {
    fn from((x, y): (u32, u32)) -> LaunchConfig {
        LaunchConfig::grid([x, y, 1])
    }
}

impl From<(u32, u32, u32)> for LaunchConfig {
    fn from((x, y, z): (u32, u32, u32)) -> LaunchConfig {
        LaunchConfig::grid([x, y, z])
    }
}

impl From<[u32; 3]> for LaunchConfig {
    fn from(grid: [u32; 3]) -> LaunchConfig {
        LaunchConfig::grid(grid)
    }
}

/// One run-time parameter of a [`KernelDef`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ParamDef {
    /// The name, as written in the kernel.
    pub name: &'static str,
    /// Pointer or scalar, and its dtype.
    pub kind: ParamKind,
    /// Whether the kernel stores or atomically updates through this pointer.
    pub written: bool,
}

/// PTX text as a binary embeds it: plain, or deflated, as `#[kernel]` emits it (PTX is
/// most of a binary's size, and deflates about tenfold) and inflated on first use.
#[derive(Clone, Copy)]
pub struct Ptx(PtxRepr);

#[derive(Clone, Copy)]
enum PtxRepr {
    Text(&'static str),
    Deflated(&'static [u8], &'static OnceLock<String>),
}

impl Ptx {
    /// Plain PTX text.
    pub const fn text(text: &'static str) -> Ptx {
        Ptx(PtxRepr::Text(text))
    }

    /// PTX deflated by [`deflate_ptx`]; `cache` holds the text once inflated (each
    /// variant's own static).
    pub const fn deflated(bytes: &'static [u8], cache: &'static OnceLock<String>) -> Ptx {
        Ptx(PtxRepr::Deflated(bytes, cache))
    }

    /// The text, inflated on the first call. Bytes that do not inflate to UTF-8 (never
    /// from `#[kernel]`, which checks the round trip) read as empty, which launching
    /// reports as a missing PTX module.
    pub fn as_str(&self) -> &'static str {
        match self.0 {
            PtxRepr::Text(text) => text,
            PtxRepr::Deflated(bytes, cache) => cache
                .get_or_init(|| inflate_ptx(bytes).unwrap_or_default())
                .as_str(),
        }
    }

    /// Whether there is no PTX (none generated for the target).
    pub fn is_empty(&self) -> bool {
        match self.0 {
            PtxRepr::Text(text) => text.is_empty(),
            PtxRepr::Deflated(bytes, _) => bytes.is_empty(),
        }
    }
}

impl fmt::Debug for Ptx {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            PtxRepr::Text(text) => write!(f, "Ptx({} bytes of text)", text.len()),
            PtxRepr::Deflated(bytes, _) => write!(f, "Ptx({} bytes deflated)", bytes.len()),
        }
    }
}

impl PartialEq for Ptx {
    fn eq(&self, other: &Ptx) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for Ptx {}

/// Deflates PTX text for [`Ptx::deflated`] (what `#[kernel]` embeds).
pub fn deflate_ptx(text: &str) -> Vec<u8> {
    miniz_oxide::deflate::compress_to_vec(text.as_bytes(), 6)
}

/// The text [`deflate_ptx`] deflated, if `bytes` inflate to UTF-8.
pub fn inflate_ptx(bytes: &[u8]) -> Option<String> {
    let raw = miniz_oxide::inflate::decompress_to_vec(bytes).ok()?;
    String::from_utf8(raw).ok()
}

/// One compiled specialization of a kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Variant {
    /// A value for every compile-time constant, in declaration order.
    pub consts: &'static [i64],
    /// Warps per program.
    pub num_warps: u32,
    /// Software-pipelining depth of `dot` operand loads it was compiled with.
    pub num_stages: u32,
    /// PTX for `sm_80` (runs on Ampere and newer through the driver's JIT).
    pub ptx_sm80: Ptx,
    /// PTX for `sm_90`; empty when not generated.
    pub ptx_sm90: Ptx,
    /// PTX for `sm_90a` (`wgmma`; runs on compute capability 9.0 only); empty when the
    /// kernel has no `dot` that takes the `wgmma` path.
    pub ptx_sm90a: Ptx,
    /// The `.entry` name in both modules.
    pub entry: &'static str,
    /// Shared memory the kernel uses, in bytes. Above 48 KiB it is dynamic: the
    /// function is opted in to that much at load and the size is passed at launch.
    pub shared_bytes: u32,
    /// Programs per thread-block cluster along x, y and z (`[1, 1, 1]`: none). A
    /// clustered variant launches only on sm_90 and newer, on grids that are a multiple
    /// of it.
    pub cluster: [u32; 3],
    /// The parameters this form assumes to be multiples of 16 beyond what they declare
    /// (bit `i`: parameter `i`); 0 for the form that assumes nothing.
    pub assumes_divisible: u64,
    /// The same constants compiled assuming some integer parameters are multiples of 16
    /// (its [`Variant::assumes_divisible`]), where that widens global accesses; a launch
    /// takes it when those arguments are (Triton's divisibility key, decided at build
    /// time: `crate::specialize`).
    pub divisible_form: Option<&'static Variant>,
    /// Tensor maps the sm_90a PTX takes after the kernel's parameters (descriptor loads
    /// the copy engine moves); empty when it takes none. The launch encodes them from
    /// its arguments, or runs the sm_90 PTX where they cannot be encoded.
    pub tma_maps: &'static [crate::ir::TmaMap],
}

impl Variant {
    /// The form to launch with these arguments: [`Variant::divisible_form`] when every
    /// parameter it assumes divisible gets a multiple of 16, else this one.
    /// `TILEFUSE_SPECIALIZE=0` in the environment keeps this one (to measure the two
    /// against each other).
    pub fn for_args(&'static self, args: &[KernelArg<'_>]) -> &'static Variant {
        let Some(form) = self.divisible_form.filter(|_| specialize_enabled()) else {
            return self;
        };
        let divisor = i64::from(crate::specialize::DIVISOR);
        let holds = args.iter().enumerate().all(|(i, arg)| {
            i >= 64
                || form.assumes_divisible & (1 << i) == 0
                || match arg.0 {
                    ArgRepr::Scalar(Scalar::I32(v)) => i64::from(v) % divisor == 0,
                    ArgRepr::Scalar(Scalar::U32(v)) => i64::from(v) % divisor == 0,
                    ArgRepr::Scalar(Scalar::I64(v)) => v % divisor == 0,
                    _ => false,
                }
        });
        if holds {
            form
        } else {
            self
        }
    }

    /// The PTX text for a target (empty if none was generated for it).
    pub fn ptx(&self, target: Target) -> &'static str {
        match target {
            Target::Sm80 => self.ptx_sm80.as_str(),
            Target::Sm90 => self.ptx_sm90.as_str(),
            Target::Sm90a => self.ptx_sm90a.as_str(),
        }
    }

    /// The target whose PTX runs on a device of compute capability `(major, minor)`:
    /// sm_90a on 9.0 where generated (arch-specific PTX runs on that exact version
    /// only), sm_90 on 9.0 and newer, sm_80 otherwise.
    pub fn target_for(&self, major: i32, minor: i32) -> Target {
        if (major, minor) == (9, 0) && !self.ptx_sm90a.is_empty() {
            Target::Sm90a
        } else if major >= 9 && !self.ptx_sm90.is_empty() {
            Target::Sm90
        } else {
            Target::Sm80
        }
    }

    /// Why this variant cannot run on a device of compute capability `major.x`, if it
    /// cannot: thread-block clusters and shared memory above sm_80's 163 KiB need 9.0
    /// or newer (`#[kernel]` embeds no sm_80 PTX for such variants).
    pub fn needs_newer_gpu(&self, major: i32) -> Option<String> {
        if major >= 9 {
            return None;
        }
        if self.cluster != [1, 1, 1] {
            return Some(format!(
                "uses thread-block clusters of {:?}, which need compute capability 9.0 or newer (this device: {major}.x)",
                self.cluster
            ));
        }
        (self.shared_bytes > Target::Sm80.max_shared_bytes()).then(|| {
            format!(
                "needs {} bytes of shared memory, which only compute capability 9.0 or newer provides (this device: {major}.x); pick a smaller tile or fewer stages",
                self.shared_bytes
            )
        })
    }

    /// The constants, warp count and (where `stages` says the kernel has several)
    /// pipelining depth in words.
    fn describe(&self, const_names: &[&str], stages: bool) -> String {
        describe(
            const_names,
            self.consts,
            self.num_warps,
            stages.then_some(self.num_stages),
        )
    }

    /// Dynamic shared memory to pass at launch: the whole use above the static limit
    /// (where the PTX declares `.extern .shared`), else none.
    fn dynamic_shared_bytes(&self) -> u32 {
        if self.shared_bytes > crate::back::ptx::STATIC_SHARED_LIMIT {
            self.shared_bytes
        } else {
            0
        }
    }
}

fn describe(
    const_names: &[&str],
    consts: &[i64],
    num_warps: u32,
    num_stages: Option<u32>,
) -> String {
    let mut s = String::new();
    for (i, v) in consts.iter().enumerate() {
        let name = const_names.get(i).copied().unwrap_or("?");
        let _ = write!(s, "{name}={v}, ");
    }
    let _ = write!(s, "num_warps={num_warps}");
    if let Some(stages) = num_stages {
        let _ = write!(s, ", num_stages={stages}");
    }
    s
}

/// The static description of a kernel that `#[kernel]` emits: its signature, source
/// text (for the interpreter) and one [`Variant`] per compiled specialization.
#[derive(Clone, Copy, Debug)]
pub struct KernelDef {
    /// The kernel's name.
    pub name: &'static str,
    /// The `fn` item's source text, as the front end parses it.
    pub source: &'static str,
    /// Compile-time constant names, in declaration order.
    pub const_names: &'static [&'static str],
    /// Run-time parameters, in launch order.
    pub params: &'static [ParamDef],
    /// Compiled specializations; for given constants, the first listed `num_warps` (and
    /// then `num_stages`) is the default.
    pub variants: &'static [Variant],
}

impl KernelDef {
    /// Constants and warp count in words, as errors name variants
    /// (`BLOCK=512, num_warps=4`).
    pub fn describe_variant(&self, consts: &[i64], num_warps: u32) -> String {
        describe(self.const_names, consts, num_warps, None)
    }

    /// Programs of the variant for `consts` and `num_warps` that one SM of `dev` holds
    /// at once (the driver's occupancy of the loaded module, so `max_registers` and
    /// `TILEFUSE_MAX_REGISTERS` count); `None` on the interpreter. A grid of more than
    /// this times the SM count runs in more than one wave.
    pub fn programs_per_sm(
        &self,
        dev: &Device,
        consts: &[i64],
        num_warps: Option<u32>,
    ) -> Result<Option<u32>, LaunchError> {
        self.ask_driver(dev, consts, num_warps, "the occupancy", |f, v| {
            f.occupancy_max_active_blocks_per_multiprocessor(
                v.num_warps * 32,
                v.dynamic_shared_bytes() as usize,
                None,
            )
        })
    }

    /// Registers a thread of the variant for `consts` and `num_warps` uses on `dev`
    /// (Triton's `n_regs`: ptxas' count for the loaded module, after `max_registers`
    /// and `TILEFUSE_MAX_REGISTERS`); `None` on the interpreter.
    pub fn registers_per_thread(
        &self,
        dev: &Device,
        consts: &[i64],
        num_warps: Option<u32>,
    ) -> Result<Option<u32>, LaunchError> {
        self.ask_driver(dev, consts, num_warps, "the registers", |f, _| {
            f.num_regs().map(|r| r.max(0) as u32)
        })
    }

    /// Whether the variants differ in `num_stages` (the attribute listed several): then
    /// descriptions of variants name it.
    pub fn has_stage_axis(&self) -> bool {
        self.variants
            .iter()
            .any(|v| v.num_stages != self.variants[0].num_stages)
    }

    /// The smallest compiled value of the constant `name` that is at least `wanted`
    /// (Triton's `BLOCK = triton.next_power_of_2(n)`, limited to what was compiled).
    /// The error lists the compiled values. `#[kernel]` generates a typed
    /// `pick_<name>(n)` on the kernel for each constant.
    ///
    /// ```
    /// use tilefuse_dsl::runtime::{KernelDef, LaunchError};
    /// fn block_for(def: &KernelDef, n: usize) -> Result<i64, LaunchError> {
    ///     def.pick_at_least("BLOCK", n as i64)
    /// }
    /// ```
    pub fn pick_at_least(&self, name: &str, wanted: i64) -> Result<i64, LaunchError> {
        let Some(index) = self.const_names.iter().position(|n| *n == name) else {
            return Err(LaunchError::Config {
                kernel: self.name.into(),
                message: format!(
                    "`{name}` is not a constant of this kernel (its constants: {})",
                    self.const_names.join(", ")
                ),
            });
        };
        let mut compiled: Vec<i64> = self.variants.iter().map(|v| v.consts[index]).collect();
        compiled.sort_unstable();
        compiled.dedup();
        compiled
            .iter()
            .copied()
            .find(|&v| v >= wanted)
            .ok_or_else(|| LaunchError::NoFit {
                kernel: self.name.into(),
                name: name.into(),
                wanted,
                compiled,
            })
    }

    /// The variant for these constants and warp count (`None`: the first compiled for
    /// the constants), of the first compiled pipelining depth. The error lists every
    /// compiled combination.
    pub fn variant(
        &self,
        consts: &[i64],
        num_warps: Option<u32>,
    ) -> Result<&'static Variant, LaunchError> {
        self.variant_staged(consts, num_warps, None)
    }

    /// The variant for these constants, warp count and pipelining depth (each `None`:
    /// the first compiled with the others), as a launch with a [`LaunchConfig`] picks it.
    /// The error lists every compiled combination.
    pub fn variant_staged(
        &self,
        consts: &[i64],
        num_warps: Option<u32>,
        num_stages: Option<u32>,
    ) -> Result<&'static Variant, LaunchError> {
        let variants: &'static [Variant] = self.variants;
        if consts.len() != self.const_names.len() {
            return Err(LaunchError::Config {
                kernel: self.name.into(),
                message: format!(
                    "expected {} compile-time constant(s) ({}), got {}",
                    self.const_names.len(),
                    self.const_names.join(", "),
                    consts.len()
                ),
            });
        }
        variants
            .iter()
            .find(|v| {
                v.consts == consts
                    && num_warps.is_none_or(|w| w == v.num_warps)
                    && num_stages.is_none_or(|s| s == v.num_stages)
            })
            .ok_or_else(|| {
                let stages = self.has_stage_axis() || num_stages.is_some();
                let mut requested = describe(self.const_names, consts, 0, None);
                requested.truncate(requested.len() - "num_warps=0".len());
                match num_warps {
                    Some(w) => {
                        let _ = write!(requested, "num_warps={w}");
                    }
                    None => requested.push_str("any num_warps"),
                }
                match num_stages {
                    Some(s) => {
                        let _ = write!(requested, ", num_stages={s}");
                    }
                    None if stages => requested.push_str(", any num_stages"),
                    None => {}
                }
                let available = if variants.is_empty() {
                    "none".to_string()
                } else {
                    variants
                        .iter()
                        .map(|v| format!("[{}]", v.describe(self.const_names, stages)))
                        .collect::<Vec<_>>()
                        .join(", ")
                };
                LaunchError::NoVariant {
                    kernel: self.name.into(),
                    requested,
                    available,
                }
            })
    }

    /// The PTX text of one variant for one target, for introspection.
    pub fn ptx(
        &self,
        consts: &[i64],
        num_warps: Option<u32>,
        target: Target,
    ) -> Result<&'static str, LaunchError> {
        Ok(self.variant(consts, num_warps)?.ptx(target))
    }

    /// Launches the kernel with these compile-time constants and type-erased arguments.
    ///
    /// Checks the configuration and every argument against the signature first. On a GPU
    /// the launch is queued on the device's stream (no allocation, no synchronization once
    /// the kernel is loaded); on the CPU the interpreter runs it to completion.
    pub fn launch_dyn(
        &self,
        dev: &Device,
        cfg: impl Into<LaunchConfig>,
        consts: &[i64],
        args: &mut [KernelArg<'_>],
    ) -> Result<(), LaunchError> {
        let cfg = cfg.into();
        let variant = self.variant_staged(consts, cfg.num_warps, cfg.num_stages)?;
        self.check(dev, &cfg, variant.cluster, args)?;
        let variant = variant.for_args(args);
        match dev {
            Device::Cpu => self.run_cpu(variant, cfg.grid, args),
            Device::Cuda(d) => self.run_cuda(d, variant, cfg.grid, cfg.serialized, args),
        }
    }
}

/// Whether launches may take divisible forms (`TILEFUSE_SPECIALIZE=0` turns them off).
fn specialize_enabled() -> bool {
    static ENABLED: OnceLock<bool> = OnceLock::new();
    *ENABLED.get_or_init(|| std::env::var("TILEFUSE_SPECIALIZE").map_or(true, |v| v != "0"))
}

fn scalar_dtype(s: Scalar) -> DType {
    match s {
        Scalar::I32(_) => DType::I32,
        Scalar::U32(_) => DType::U32,
        Scalar::I64(_) => DType::I64,
        Scalar::F32(_) => DType::F32,
    }
}

fn scalar_text(s: Scalar) -> String {
    match s {
        Scalar::I32(v) => format!("{v}i32"),
        Scalar::U32(v) => format!("{v}u32"),
        Scalar::I64(v) => format!("{v}i64"),
        Scalar::F32(v) => format!("{v:?}f32"),
    }
}

enum ArgRepr<'a> {
    Read(&'a dyn ErasedBuffer),
    /// A read-only buffer seen as elements of another type.
    ReadAs(crate::runtime::device::Reinterpreted<'a>),
    Write(&'a mut dyn ErasedBuffer),
    Scalar(Scalar),
}

impl ArgRepr<'_> {
    /// The buffer and whether it was passed for writing; `None` for scalars.
    fn buffer(&self) -> Option<(&dyn ErasedBuffer, bool)> {
        match self {
            ArgRepr::Read(b) => Some((*b, false)),
            ArgRepr::ReadAs(b) => Some((b, false)),
            ArgRepr::Write(b) => Some((&**b, true)),
            ArgRepr::Scalar(_) => None,
        }
    }
}

/// One launch argument with its element type erased: a buffer the kernel reads, a
/// buffer it may write, or a scalar. Checked against the kernel's signature at launch.
pub struct KernelArg<'a>(ArgRepr<'a>);

impl<'a> KernelArg<'a> {
    /// A buffer the kernel only reads.
    pub fn read<T: Element>(buf: &'a Buffer<T>) -> KernelArg<'a> {
        KernelArg(ArgRepr::Read(buf))
    }

    /// A buffer the kernel only reads, seen as elements of `U`: its bytes, little-endian,
    /// `len * size_of::<T>() / size_of::<U>()` of them. An error where `U`'s size does not
    /// divide the buffer's bytes. For a kernel that reads an array of bytes a 32-bit
    /// word at a time (a load of 4 bytes a thread can be staged ahead with `cp.async`,
    /// one of a byte cannot: `.stages(n)` in docs/language.md).
    ///
    /// ```
    /// use tilefuse_dsl::runtime::{Device, KernelArg};
    /// let dev = Device::cpu();
    /// let bytes = dev.upload(&[1u8, 0, 0, 0, 2, 0, 0, 0]).unwrap();
    /// let words = KernelArg::read_as::<u32, u8>(&bytes).unwrap();
    /// assert_eq!(format!("{words:?}"), "&Buffer<u8>[8] as u32[2]");
    /// assert!(KernelArg::read_as::<u32, u8>(&dev.upload(&[1u8, 2, 3]).unwrap()).is_err());
    /// ```
    pub fn read_as<U: Element, T: Element>(
        buf: &'a Buffer<T>,
    ) -> Result<KernelArg<'a>, LaunchError> {
        let bytes = buf.len() * T::DTYPE.size_bytes();
        let size = U::DTYPE.size_bytes();
        if bytes % size != 0 {
            return Err(LaunchError::Reinterpret {
                message: format!(
                    "a buffer of {} {} ({bytes} bytes) cannot be read as {}: {size} does not divide {bytes}",
                    buf.len(),
                    T::DTYPE,
                    U::DTYPE
                ),
            });
        }
        Ok(KernelArg(ArgRepr::ReadAs(
            crate::runtime::device::Reinterpreted {
                inner: buf,
                dtype: U::DTYPE,
                len: bytes / size,
            },
        )))
    }

    /// A buffer the kernel may write.
    pub fn write<T: Element>(buf: &'a mut Buffer<T>) -> KernelArg<'a> {
        KernelArg(ArgRepr::Write(buf))
    }

    /// A scalar.
    pub fn scalar(value: Scalar) -> KernelArg<'a> {
        KernelArg(ArgRepr::Scalar(value))
    }
}

impl std::fmt::Debug for KernelArg<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            ArgRepr::Read(b) => write!(f, "&Buffer<{}>[{}]", b.dtype(), b.len()),
            ArgRepr::ReadAs(b) => write!(
                f,
                "&Buffer<{}>[{}] as {}[{}]",
                b.inner.dtype(),
                b.inner.len(),
                b.dtype,
                b.len
            ),
            ArgRepr::Write(b) => write!(f, "&mut Buffer<{}>[{}]", b.dtype(), b.len()),
            ArgRepr::Scalar(s) => f.write_str(&scalar_text(*s)),
        }
    }
}

impl<'a, T: Element> From<&'a Buffer<T>> for KernelArg<'a> {
    fn from(buf: &'a Buffer<T>) -> KernelArg<'a> {
        KernelArg::read(buf)
    }
}

impl<'a, T: Element> From<&'a mut Buffer<T>> for KernelArg<'a> {
    fn from(buf: &'a mut Buffer<T>) -> KernelArg<'a> {
        KernelArg::write(buf)
    }
}

macro_rules! scalar_arg {
    ($($t:ty => $v:ident),*) => {$(
        impl From<$t> for KernelArg<'_> {
            fn from(v: $t) -> Self {
                KernelArg::scalar(Scalar::$v(v))
            }
        }
    )*};
}

scalar_arg!(i32 => I32, u32 => U32, i64 => I64, f32 => F32);

mod check;
mod cpu;
mod cuda;
mod tma;

#[cfg(test)]
mod tests;
