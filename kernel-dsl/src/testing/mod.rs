//! Shared test machinery: a kernel from source text as a [`KernelDef`] compiled by the PTX
//! backend, typed host data for every buffer dtype, one launch on any device, a
//! [`Backend`] that runs a hand-built kernel (`crate::ir::builder`) on the interpreter or
//! a GPU, and seeded inputs ([`Rng`]).
//!
//! Used by the GPU-against-interpreter tests (`back::ptx::gpu_tests`), the op × dtype
//! matrix (`op_matrix`), the tests written once for every backend (`each_backend`) and
//! the interpreter's tests.

mod bitcast;
mod byte_perm;
mod dot4;
pub(crate) mod each_backend;
mod op_matrix;

use half::{bf16, f16};

use crate::back::ptx::{compile, Target};
use crate::interp::{self, Scalar};
use crate::ir::Kernel;
use crate::runtime::testing::{gpu_or_skip, gpu_turn};
use crate::runtime::{Buffer, Device, KernelArg, KernelDef, ParamDef, Ptx, Variant};
use crate::Specialization;

fn leak<T>(v: Vec<T>) -> &'static [T] {
    Box::leak(v.into_boxed_slice())
}

fn leak_str(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

/// The IR of `src`'s kernel at `B = block` over 4 warps: the op tests' kernels
/// (`bitcast`, `byte_perm`, `dot4`), which run on every backend.
fn block_kernel(src: &str, block: usize) -> crate::ir::Kernel {
    let spec = Specialization {
        consts: vec![("B".into(), block as i64)],
        num_warps: 4,
        num_stages: None,
    };
    crate::compile_source(src, &spec).unwrap_or_else(|e| panic!("{e}"))
}

/// A kernel description with one variant compiled by the PTX backend, assembled with
/// `ptxas` when one is available.
pub fn def(src: &str, consts: &[(&str, i64)], warps: u32) -> &'static KernelDef {
    def_with(src, consts, warps, true)
}

/// [`def`], choosing whether to assemble the sm_80 PTX (ptxas costs a process per call).
pub fn def_with(
    src: &str,
    consts: &[(&str, i64)],
    warps: u32,
    assemble: bool,
) -> &'static KernelDef {
    def_attr(src, consts, warps, assemble, "")
}

/// [`def_with`] with more attribute entries (`"cluster(y = 4)"`). A clustered kernel
/// gets no sm_80 PTX.
pub fn def_attr(
    src: &str,
    consts: &[(&str, i64)],
    warps: u32,
    assemble: bool,
    extra_attr: &str,
) -> &'static KernelDef {
    let spec = Specialization {
        consts: consts.iter().map(|(n, v)| (n.to_string(), *v)).collect(),
        num_warps: warps,
        num_stages: None,
    };
    let mut attr: Vec<String> = consts.iter().map(|(n, v)| format!("{n} = [{v}]")).collect();
    attr.push(format!("num_warps = [{warps}]"));
    if !extra_attr.is_empty() {
        attr.push(extra_attr.to_string());
    }
    let src = leak_str(format!("#[kernel({})]\n{src}", attr.join(", ")));
    let k = crate::compile_source(src, &spec).unwrap_or_else(|e| panic!("front end: {e}\n{src}"));
    def_of(&k, src, consts, assemble)
}

/// A kernel description for a typed kernel: one variant compiled by the PTX backend (the
/// sm_80 PTX assembled when `assemble`), with `src` as its source text and `consts` as its
/// constants.
fn def_of(
    k: &Kernel,
    src: &'static str,
    consts: &[(&str, i64)],
    assemble: bool,
) -> &'static KernelDef {
    let p90 = compile(k, Target::Sm90).unwrap_or_else(|e| panic!("{}: {e}", k.name));
    let p90a = k
        .has_dot()
        .then(|| compile(k, Target::Sm90a).unwrap_or_else(|e| panic!("{}: {e}", k.name)))
        .filter(|p| p.uses_wgmma);
    if assemble {
        if let Some(p) = &p90a {
            crate::back::ptx::tests::assemble(p, Target::Sm90a);
        }
    }
    // As `#[kernel]` does: no sm_80 module for a clustered variant or one whose shared
    // memory only Hopper provides.
    let p80 = crate::back::ptx::has_sm80_module(k, &p90)
        .then(|| compile(k, Target::Sm80).unwrap_or_else(|e| panic!("{}: {e}", k.name)));
    if assemble {
        match &p80 {
            Some(p) => crate::back::ptx::tests::assemble(p, Target::Sm80),
            None => crate::back::ptx::tests::assemble(&p90, Target::Sm90),
        }
    }
    let written = k.written_params();
    let params = k
        .params
        .iter()
        .enumerate()
        .map(|(i, p)| ParamDef {
            name: leak_str(p.name.clone()),
            kind: p.kind,
            written: written.contains(&i),
        })
        .collect();
    // The launch passes the largest module's need (an sm_90a ring may hold a buffer
    // more), as `#[kernel]` does.
    let shared_bytes = [&p80, &p90a]
        .iter()
        .filter_map(|p| p.as_ref().map(|p| p.shared_bytes))
        .fold(p90.shared_bytes, u32::max);
    let variant = Variant {
        consts: leak(consts.iter().map(|c| c.1).collect()),
        num_warps: k.num_warps,
        num_stages: k.num_stages,
        ptx_sm80: Ptx::text(leak_str(p80.map(|p| p.ptx).unwrap_or_default())),
        ptx_sm90: Ptx::text(leak_str(p90.ptx)),
        tma_maps: leak(
            p90a.as_ref()
                .map(|p| p.tma_maps.clone())
                .unwrap_or_default(),
        ),
        ptx_sm90a: Ptx::text(leak_str(p90a.map(|p| p.ptx).unwrap_or_default())),
        entry: leak_str(p90.entry),
        shared_bytes,
        cluster: k.cluster,
        assumes_divisible: 0,
        divisible_form: None,
    };
    Box::leak(Box::new(KernelDef {
        name: leak_str(k.name.clone()),
        source: src,
        const_names: leak(consts.iter().map(|c| leak_str(c.0.to_string())).collect()),
        params: leak(params),
        variants: leak(vec![variant]),
    }))
}

macro_rules! typed_data {
    ($($var:ident($t:ty)),* $(,)?) => {
        /// Host data for one kernel argument: a buffer of one element type, or a scalar.
        #[derive(Clone, Debug, PartialEq)]
        pub enum Data {
            $(
                #[doc = concat!("A buffer of `", stringify!($t), "`.")]
                $var(Vec<$t>),
            )*
            /// A scalar argument.
            S(Scalar),
        }

        enum Buf {
            $($var(Buffer<$t>),)*
            S(Scalar),
        }

        fn upload(dev: &Device, d: &Data) -> Buf {
            match d {
                $(Data::$var(v) => Buf::$var(dev.upload(v).unwrap()),)*
                Data::S(s) => Buf::S(*s),
            }
        }

        fn arg(b: &mut Buf, written: bool) -> KernelArg<'_> {
            match b {
                $(Buf::$var(b) => {
                    if written {
                        KernelArg::write(b)
                    } else {
                        KernelArg::read(b)
                    }
                })*
                Buf::S(s) => KernelArg::scalar(*s),
            }
        }

        /// A buffer's little-endian bytes, as the interpreter reads them (nothing for a
        /// scalar).
        fn to_bytes(d: &Data) -> Vec<u8> {
            match d {
                $(Data::$var(v) => v.iter().flat_map(|x| x.to_le_bytes()).collect(),)*
                Data::S(_) => vec![],
            }
        }

        /// `bytes` read back as a buffer of the same element type as `like`.
        fn from_bytes(like: &Data, bytes: &[u8]) -> Data {
            match like {
                $(Data::$var(_) => Data::$var(
                    bytes
                        .chunks_exact(std::mem::size_of::<$t>())
                        .map(|c| <$t>::from_le_bytes(c.try_into().unwrap()))
                        .collect(),
                ),)*
                Data::S(s) => Data::S(*s),
            }
        }

        fn download(b: &Buf) -> Data {
            match b {
                $(Buf::$var(b) => Data::$var(b.to_vec().unwrap()),)*
                Buf::S(s) => Data::S(*s),
            }
        }
    };
}

typed_data!(
    F32(f32),
    F16(f16),
    Bf16(bf16),
    I32(i32),
    U32(u32),
    I64(i64),
    U8(u8),
);

/// Launches `d` on `dev` with `data` (one entry per parameter) and returns every
/// argument afterwards (written buffers hold the kernel's results).
pub fn run_on(dev: &Device, d: &KernelDef, grid: [u32; 3], data: &[Data]) -> Vec<Data> {
    let mut bufs: Vec<Buf> = data.iter().map(|x| upload(dev, x)).collect();
    {
        let mut args: Vec<KernelArg<'_>> = bufs
            .iter_mut()
            .zip(d.params)
            .map(|(b, p)| arg(b, p.written))
            .collect();
        let consts = d.variants[0].consts;
        d.launch_dyn(dev, grid, consts, &mut args)
            .unwrap_or_else(|e| panic!("{} on {dev}: {e}", d.name));
    }
    dev.synchronize().unwrap();
    bufs.iter().map(download).collect()
}

/// Where a hand-built kernel (`crate::ir::builder`) runs: the reference interpreter, or a
/// CUDA device through the PTX backend. A test written once against a `Backend` runs on
/// each ([`on_each_backend`]).
pub enum Backend {
    /// The CPU interpreter, the reference semantics.
    Interp,
    /// A CUDA device running the PTX backend's code.
    Gpu(Device),
}

impl std::fmt::Display for Backend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Backend::Interp => f.write_str("the interpreter"),
            Backend::Gpu(d) => write!(f, "{d}"),
        }
    }
}

impl Backend {
    /// Runs `k` over `grid` with `data` (one entry per parameter) and returns every
    /// argument afterwards (written buffers hold the kernel's results).
    ///
    /// On the interpreter the kernel is also compiled for both PTX targets (not
    /// assembled), so a kernel the backend cannot lower fails without a GPU too.
    pub fn run(&self, k: &Kernel, grid: [u32; 3], data: &[Data]) -> Vec<Data> {
        match self {
            Backend::Interp => {
                for t in [Target::Sm80, Target::Sm90] {
                    compile(k, t).unwrap_or_else(|e| panic!("{} ({}): {e}", k.name, t.name()));
                }
                let written = k.written_params();
                let mut bytes: Vec<Vec<u8>> = data.iter().map(to_bytes).collect();
                let mut args: Vec<interp::Arg<'_>> = bytes
                    .iter_mut()
                    .zip(data)
                    .enumerate()
                    .map(|(i, (b, d))| match d {
                        Data::S(s) => interp::Arg::Scalar(*s),
                        _ if written.contains(&i) => interp::Arg::Write(b),
                        _ => interp::Arg::Read(b),
                    })
                    .collect();
                interp::run(k, grid, &mut args).unwrap_or_else(|e| panic!("{e}"));
                data.iter()
                    .zip(&bytes)
                    .map(|(d, b)| from_bytes(d, b))
                    .collect()
            }
            Backend::Gpu(dev) => run_on(dev, def_of(k, "", &[], false), grid, data),
        }
    }
}

/// Runs `test` on the interpreter, then on the GPU when there is one (skipped without a
/// GPU; a failure with `TILEFUSE_REQUIRE_GPU=1`): one test, every backend.
pub fn on_each_backend(name: &str, test: impl Fn(&Backend)) {
    test(&Backend::Interp);
    let _turn = gpu_turn();
    if let Some(gpu) = gpu_or_skip(name) {
        test(&Backend::Gpu(gpu));
    }
}

/// splitmix64: a tiny seeded generator for test inputs.
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `[-1, 1)`.
    pub fn f32(&mut self) -> f32 {
        (self.next_u64() >> 40) as f32 / (1u64 << 23) as f32 - 1.0
    }

    /// `n` values uniform in `[-1, 1)`.
    pub fn f32s(&mut self, n: usize) -> Vec<f32> {
        (0..n).map(|_| self.f32()).collect()
    }

    /// Uniform in `[0, n)` (with a negligible bias).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n
    }
}

/// Little-endian bytes of `v`.
pub fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// `f32`s from little-endian bytes.
pub fn bytes_f32(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

/// Little-endian bytes of `v`.
pub fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// `i32`s from little-endian bytes.
pub fn bytes_i32(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}
