//! Shared test machinery: a kernel from source text as a [`KernelDef`] compiled by the PTX
//! backend, typed host data for every buffer dtype, and one launch on any device.
//!
//! Used by the GPU-against-interpreter tests (`back::ptx::gpu_tests`) and by the op ×
//! dtype matrix (`op_matrix`).

mod op_matrix;

use half::{bf16, f16};

use crate::back::ptx::{compile, Target};
use crate::interp::Scalar;
use crate::runtime::{Buffer, Device, KernelArg, KernelDef, ParamDef, Ptx, Variant};
use crate::Specialization;

fn leak<T>(v: Vec<T>) -> &'static [T] {
    Box::leak(v.into_boxed_slice())
}

fn leak_str(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
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
    };
    let mut attr: Vec<String> = consts.iter().map(|(n, v)| format!("{n} = [{v}]")).collect();
    attr.push(format!("num_warps = [{warps}]"));
    if !extra_attr.is_empty() {
        attr.push(extra_attr.to_string());
    }
    let src = leak_str(format!("#[kernel({})]\n{src}", attr.join(", ")));
    let k = crate::compile_source(src, &spec).unwrap_or_else(|e| panic!("front end: {e}\n{src}"));
    let p90 = compile(&k, Target::Sm90).unwrap_or_else(|e| panic!("{}: {e}", k.name));
    let p90a = k
        .has_dot()
        .then(|| compile(&k, Target::Sm90a).unwrap_or_else(|e| panic!("{}: {e}", k.name)))
        .filter(|p| p.uses_wgmma);
    if assemble {
        if let Some(p) = &p90a {
            crate::back::ptx::tests::assemble(p, Target::Sm90a);
        }
    }
    let p80 = if k.cluster_size() > 1 {
        None
    } else {
        Some(compile(&k, Target::Sm80).unwrap_or_else(|e| panic!("{}: {e}", k.name)))
    };
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
        num_warps: warps,
        ptx_sm80: Ptx::text(leak_str(p80.map(|p| p.ptx).unwrap_or_default())),
        ptx_sm90: Ptx::text(leak_str(p90.ptx)),
        ptx_sm90a: Ptx::text(leak_str(p90a.map(|p| p.ptx).unwrap_or_default())),
        entry: leak_str(p90.entry),
        shared_bytes,
        cluster: k.cluster,
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
