//! PTX backend: typed tile IR to one PTX `.entry` per kernel.
//!
//! Passes, one file each:
//! - `layout.rs`: a distributed (blocked) layout for every tile value; reductions give
//!   slice layouts so `reduce` -> `expand_dims` -> `broadcast` moves no data; loads take the
//!   layout their consumer needs (or, next to a reduction's result in an elementwise op,
//!   that result's layout) and loop-carried zeros take their update's layout.
//!   Splats, aranges, broadcasts and arithmetic on them are *rematerialized* in whatever
//!   layout a user needs instead of being moved.
//! - `contract.rs`: the `f32` products whose only uses are sums, which `reduce.rs`
//!   folds into the sum as fused multiply-adds.
//! - `axis.rs`: contiguity / divisibility / constancy (Triton's AxisInfo) for vector
//!   accesses and provably uniform masks.
//! - `emit.rs`: registers, thread coordinates per layout (computed once at entry),
//!   materialization of a value in a layout (rematerialization, else a shared-memory
//!   conversion), statements and structured control flow (`for` stays a loop, `if`
//!   branches, merges by moves).
//! - `elementwise.rs`, `memory.rs` (vectorized `ld.global.nc` / `st.global`, owner-only
//!   stores and atomics, L2 prefetches), `reduce.rs` (in-thread, `shfl.sync.bfly`, shared memory across
//!   warps), `dot.rs` (`mma.sync` for f16/bf16, FMA otherwise).
//!
//! Every tile element lives in a scalar register with a compile-time name; code is fully
//! unrolled per element, so kernels need no local memory. 16-bit elements loaded together
//! stay halves of their 32-bit word: widening reads the word, a store of both halves
//! stores it, and loops carry such tiles as words (ptxas gives every 16-bit register a
//! full one, so split halves would double a bf16 tile's registers). Elements replicated over threads
//! (tiles smaller than the program) are stored and atomically updated by one owner thread.

mod axis;
mod cluster;
mod contract;
mod dot;
mod elementwise;
mod emit;
mod layout;
mod magic;
mod memory;
mod more_ops;
pub mod occupancy;
mod pipeline;
pub mod ptxas;
mod reduce;
mod regs;

#[cfg(test)]
mod gpu_tests;
#[cfg(test)]
pub(crate) mod tests;

use std::fmt::Write;

use crate::error::CompileError;
use crate::ir::{DType, Kernel, Loc, ParamKind, Type, ValueId};

pub use layout::Layout;
pub use memory::FLAG_WAIT_LIMIT_NS;

/// The GPU architecture to generate for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Target {
    /// `sm_80`, PTX ISA 7.8: runs on Ampere, Ada and Hopper through the driver's JIT.
    Sm80,
    /// `sm_90`, PTX ISA 7.8 (8.0 for a kernel with `prefetch_range`).
    Sm90,
    /// `sm_90a`, PTX ISA 8.0: Hopper's architecture-specific features (`wgmma`). Such
    /// PTX runs on compute capability 9.0 only, so it is generated beside the portable
    /// modules, for kernels whose `dot` takes the `wgmma` path, and the runtime picks
    /// it on 9.0 devices.
    Sm90a,
}

/// Shared memory a program may use without opting in (static `.shared` arrays).
pub const STATIC_SHARED_LIMIT: u32 = 48 * 1024;

impl Target {
    /// The most shared memory one program may use on this target, opted in per kernel at
    /// load time: 163 KiB on sm_80 (A100), 227 KiB on sm_90 (H100/H200), per the CUDA
    /// programming guide's compute-capability table. (sm_86/sm_89 parts allow less,
    /// 99 KiB; there the driver refuses the launch and the error names the kernel.)
    pub fn max_shared_bytes(self) -> u32 {
        match self {
            Target::Sm80 => 163 * 1024,
            Target::Sm90 | Target::Sm90a => 227 * 1024,
        }
    }

    /// Whether the target is Hopper (sm_90 or sm_90a): clusters, programmatic
    /// dependent launch, bulk prefetches.
    pub fn hopper(self) -> bool {
        matches!(self, Target::Sm90 | Target::Sm90a)
    }

    /// Whether `dot` may lower to `wgmma` (sm_90a only).
    pub fn wgmma(self) -> bool {
        self == Target::Sm90a
    }

    /// The `.target` name.
    pub fn name(self) -> &'static str {
        match self {
            Target::Sm80 => "sm_80",
            Target::Sm90 => "sm_90",
            Target::Sm90a => "sm_90a",
        }
    }
}

/// The most registers a thread of a `threads`-thread program may use so that one
/// program fits an SM (65536 registers, at most 255 a thread, in steps of 8): the
/// `.maxnreg` a kernel gets unless `max_registers` asks for fewer.
pub fn register_ceiling(threads: u32) -> u32 {
    (65536 / threads.max(1)).min(255) / 8 * 8
}

/// A compiled kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PtxKernel {
    /// The PTX module text.
    pub ptx: String,
    /// The `.entry` name.
    pub entry: String,
    /// Shared memory the kernel uses, in bytes: static up to [`STATIC_SHARED_LIMIT`],
    /// dynamic (`.extern .shared`, sized at launch) above it.
    pub shared_bytes: u32,
    /// A human-readable report of the layout chosen for each tile value.
    pub layouts: String,
    /// The layout chosen for each tile value, in value order (what `layouts` prints).
    pub value_layouts: Vec<ValueLayout>,
    /// Every global memory access, in program order, with its vector width.
    pub accesses: Vec<Access>,
    /// Whether a `dot` was lowered to `wgmma` (only on [`Target::Sm90a`]).
    pub uses_wgmma: bool,
    /// Tensor maps the launch passes after the kernel's parameters, one per box shape of
    /// a descriptor load the copy engine moves (only on [`Target::Sm90a`]).
    pub tma_maps: Vec<crate::ir::TmaMap>,
}

/// The layout the backend chose for one tile value.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ValueLayout {
    /// The value.
    pub value: ValueId,
    /// Its type.
    pub ty: Type,
    /// Where it comes from in the source.
    pub loc: Loc,
    /// Its layout.
    pub layout: Layout,
    /// Recomputed in whatever layout a user needs (splats, aranges, broadcasts and their
    /// arithmetic) rather than computed once in `layout`.
    pub rematerialized: bool,
}

/// What a global memory access does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum AccessKind {
    /// `load` (cache path per `emit::load_qualifiers`).
    Load,
    /// `store`.
    Store,
    /// `atomic_*` (always one element per instruction).
    Atomic,
}

/// One global memory access of the kernel.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Access {
    /// Load, store or atomic.
    pub kind: AccessKind,
    /// The pointer value.
    pub ptr: ValueId,
    /// The source location of the access.
    pub loc: Loc,
    /// The element type.
    pub dtype: DType,
    /// Elements per instruction (1 = scalar, up to 16 bytes' worth).
    pub width: usize,
    /// Why `width` is narrower than the elements a thread holds side by side (up to 16
    /// bytes) allow, in words a user can act on; `None` when it is not.
    pub narrowed: Option<String>,
    /// Elements per thread.
    pub elements: usize,
}

/// Whether `#[kernel]` builds an sm_80 module for `kernel` beside `sm90`, its sm_90
/// module: not for thread-block clusters, nor where the sm_90 module needs more shared
/// memory than sm_80 gives a program (a deep ring of large tiles). Such variants are
/// Hopper-only; launching one on an older GPU is an error naming the reason
/// (`Variant::needs_newer_gpu`).
pub fn has_sm80_module(kernel: &Kernel, sm90: &PtxKernel) -> bool {
    kernel.cluster_size() == 1 && sm90.shared_bytes <= Target::Sm80.max_shared_bytes()
}

/// Compiles a typed kernel to PTX.
pub fn compile(kernel: &Kernel, target: Target) -> Result<PtxKernel, CompileError> {
    if kernel.num_warps == 0 || !kernel.num_warps.is_power_of_two() || kernel.num_warps > 32 {
        return Err(CompileError::new(
            Default::default(),
            format!(
                "kernel `{}`: num_warps must be a power of two in 1..=32, not {}",
                kernel.name, kernel.num_warps
            ),
        ));
    }
    for v in &kernel.values {
        if let Some(ty) = &v.ty {
            if ty.shape.iter().any(|&n| n == 0 || !n.is_power_of_two()) {
                return Err(CompileError::new(
                    v.loc,
                    format!(
                        "kernel `{}`: tile shape {ty} is not made of powers of two",
                        kernel.name
                    ),
                ));
            }
        }
    }
    // Inference guarantees the invariants the passes rely on; should one be broken
    // anyway, report it as an error rather than take the build down.
    let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let axis = axis::analyze(kernel);
        let lay = layout::assign(kernel, &axis, target.wgmma())?;
        let mut e = emit::Emitter::new(kernel, lay, axis, target);
        e.block(&kernel.body)?;
        Ok(e)
    }));
    let mut e = match run {
        Ok(r) => r?,
        Err(_) => {
            return Err(CompileError::new(
                Default::default(),
                format!(
                    "kernel `{}`: internal error in the PTX backend (malformed typed IR?)",
                    kernel.name
                ),
            ))
        }
    };

    let mut ptx = String::new();
    let _ = writeln!(ptx, "// kernel `{}`, generated by tilefuse", kernel.name);
    // Bulk prefetches (`prefetch_range` on sm_90) need PTX ISA 8.0.
    let mut bulk = false;
    kernel
        .body
        .visit(&mut |s| bulk |= matches!(s, crate::ir::Stmt::PrefetchRange { .. }));
    let version = if (bulk && target.hopper()) || target == Target::Sm90a {
        "8.0"
    } else {
        "7.8"
    };
    let _ = writeln!(
        ptx,
        ".version {version}\n.target {}\n.address_size 64\n",
        target.name()
    );
    let _ = writeln!(ptx, ".visible .entry {}(", kernel.name);
    let params: Vec<String> = kernel
        .params
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let ty = match p.kind {
                ParamKind::Ptr(_) => Some("u64"),
                ParamKind::Scalar(t) | ParamKind::ScalarMultipleOf(t, _) => {
                    elementwise::param_ty(t)
                }
            };
            ty.map(|t| format!("\t.param .{t} p{i}")).ok_or_else(|| {
                CompileError::new(p.loc, format!("parameter `{}`: unsupported type", p.name))
            })
        })
        .collect::<Result<_, _>>()?;
    let mut params = params;
    for i in 0..e.tma_maps.len() {
        // Tensor maps are passed by value (a 64-byte aligned opaque struct), after the
        // kernel's own parameters.
        params.push(format!("\t.param .align 64 .b8 {}[128]", tma_param_name(i)));
    }
    let _ = writeln!(ptx, "{}\n)", params.join(",\n"));
    // Without `.maxnreg`, ptxas sometimes caps a kernel at 64 registers and spills to
    // reach an occupancy it guesses; allow what one program per SM can use instead.
    let threads = kernel.threads_per_program();
    let _ = writeln!(
        ptx,
        ".maxntid {threads}, 1, 1\n.maxnreg {}\n{{",
        register_ceiling(threads).min(kernel.max_registers.unwrap_or(255))
    );
    ptx.push_str(&e.decls());
    if target.hopper() && e.code.contains(emit::WAIT_MARKER) {
        ptx.push_str("\t.reg .pred %tfw_p;\n\t.reg .b32 %tfw_r;\n\t.reg .b64 %tfw_d;\n");
    }
    e.ring_bytes = e.ring_bytes.max(e.ring_scratch);
    if e.wgmma_used {
        // The scratch space after the ring starts 1024-byte aligned too.
        e.ring_bytes = e.ring_bytes.next_multiple_of(1024);
    }
    let smem = e.ring_bytes + e.smem.next_multiple_of(16);
    if e.ring_bytes > 0 {
        // The ring of pipelined loops comes first; the scratch space follows it.
        let s = e.smem_base.clone();
        e.pro = e.pro.replacen(
            &format!("mov.u32 {s}, tf_smem;"),
            &format!(
                "mov.u32 {s}, tf_smem;\n\tadd.u32 {s}, {s}, {};",
                e.ring_bytes
            ),
            1,
        );
    }
    let cluster_smem = e.cluster_smem.next_multiple_of(16);
    let limit = target.max_shared_bytes();
    if smem + cluster_smem > STATIC_SHARED_LIMIT && (cluster_smem > 0 || smem > limit) {
        let (cap, what) = if cluster_smem > 0 {
            (STATIC_SHARED_LIMIT, format!(", {cluster_smem} of them for `cluster_gather` (clustered kernels keep to static shared memory)"))
        } else {
            (limit, String::new())
        };
        return Err(CompileError::new(
            Default::default(),
            format!(
                "kernel `{}`: needs {} bytes of shared memory, more than the {cap} bytes ({} KiB) one program may use on {}{what}; use smaller tiles or fewer stages",
                kernel.name,
                smem + cluster_smem,
                cap / 1024,
                target.name(),
            ),
        ));
    }
    if cluster_smem > 0 {
        let _ = writeln!(ptx, "\t.shared .align 16 .b8 tf_cluster[{cluster_smem}];");
    }
    if smem > STATIC_SHARED_LIMIT {
        // Above 48 KiB shared memory must be dynamic: the runtime opts the function in
        // (`CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES`) and passes the size at
        // launch, for every variant whose `shared_bytes` exceeds the static limit.
        let at = ptx.find(".visible .entry").expect("the entry was written");
        let align = if e.wgmma_used { 1024 } else { 128 };
        ptx.insert_str(
            at,
            &format!(".extern .shared .align {align} .b8 tf_smem[];\n\n"),
        );
    } else if smem > 0 {
        // Swizzled tiles are laid out for 128-byte lines.
        let align = match (e.wgmma_used, e.swizzled) {
            (true, _) => 1024,
            (false, true) => 128,
            (false, false) => 16,
        };
        let _ = writeln!(ptx, "\t.shared .align {align} .b8 tf_smem[{smem}];");
    } else {
        // No shared memory: drop the buffer's address from the prologue.
        e.pro = e
            .pro
            .lines()
            .filter(|l| !l.contains("tf_smem"))
            .map(|l| format!("{l}\n"))
            .collect();
    }
    for (i, p) in kernel.params.iter().enumerate() {
        let _ = writeln!(ptx, "\t// p{i}: {} {:?}", p.name, p.kind);
    }
    ptx.push_str(&e.pro);
    let explicit_wait = e.code.contains(emit::WAIT_MARKER);
    let explicit_trigger = e.code.contains(emit::LAUNCH_MARKER);
    if target.hopper() {
        // Programmatic dependent launch (Hopper): let the next kernel of the stream be
        // scheduled now, and wait for the previous kernel's completion (and memory)
        // before touching global memory, at entry unless the kernel placed
        // `wait_for_prior_kernels()` itself (after loads of data no prior kernel
        // writes, such as weights). The kernel may move the trigger itself with
        // `launch_dependents()`. Launched without the PDL attribute, both are no-ops.
        if !explicit_trigger {
            ptx.push_str("\tgriddepcontrol.launch_dependents;\n");
        }
        if !explicit_wait {
            ptx.push_str("\tgriddepcontrol.wait;\n");
        }
        let mut code = e
            .code
            .replace(emit::LAUNCH_MARKER, "\tgriddepcontrol.launch_dependents;\n");
        let mut n = 0;
        while let Some(at) = code.find(emit::WAIT_MARKER) {
            let wait = pinned_wait(kernel, n);
            code.replace_range(at..at + emit::WAIT_MARKER.len(), &wait);
            n += 1;
        }
        ptx.push_str(&code);
    } else {
        ptx.push_str(&e.code);
    }
    if e.gathers_remote {
        // No program may exit while another can still read its shared memory.
        ptx.push_str("\tbarrier.cluster.arrive.aligned;\n\tbarrier.cluster.wait.aligned;\n");
    }
    ptx.push_str("\tret;\n}\n");
    Ok(PtxKernel {
        ptx,
        entry: kernel.name.clone(),
        shared_bytes: smem + cluster_smem,
        layouts: e.report(),
        value_layouts: e.value_layouts(),
        accesses: e.accesses,
        uses_wgmma: e.wgmma_used,
        tma_maps: e.tma_maps,
    })
}

/// The PTX name of the parameter holding tensor map `i` (`PtxKernel::tma_maps`).
pub fn tma_param_name(i: usize) -> String {
    format!("tf_tmap{i}")
}

/// `griddepcontrol.wait` at a place the kernel chose, kept there.
///
/// ptxas may hoist a lone wait above the loads before it (waiting earlier is always
/// allowed), which turned the weights a kernel requests "before the wait" into loads
/// issued after it: in the SASS of every GEMV the wait (`ACQBULK`) came first. A branch
/// on a kernel parameter, which ptxas cannot evaluate, with a wait on either side, puts
/// the wait in a block of its own after those loads, without waiting for their data.
fn pinned_wait(kernel: &Kernel, n: usize) -> String {
    let Some(first) = kernel.params.first() else {
        return "\tgriddepcontrol.wait;\n".into();
    };
    let wide = match first.kind {
        ParamKind::Ptr(_) => true,
        ParamKind::Scalar(t) | ParamKind::ScalarMultipleOf(t, _) => t.size_bytes() == 8,
    };
    let (reg, bits) = if wide { ("%tfw_d", 64) } else { ("%tfw_r", 32) };
    format!(
        "\t// Both ways wait: the branch only keeps the wait after the loads above.\n\
         \tld.param.b{bits} {reg}, [p0];\n\
         \tsetp.eq.b{bits} %tfw_p, {reg}, 0;\n\
         \t@%tfw_p bra $L_tfw{n}_a;\n\
         \tgriddepcontrol.wait;\n\
         \tbra.uni $L_tfw{n}_j;\n\
         $L_tfw{n}_a:\n\
         \tgriddepcontrol.wait;\n\
         $L_tfw{n}_j:\n"
    )
}
