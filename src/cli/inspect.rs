//! `tilefuse inspect FILE.rs`: compiles the `#[kernel]` functions of a source file (without
//! building its crate) and shows what the backend chose for one specialization.

use std::collections::HashMap;
use std::fmt::Write;
use std::path::PathBuf;

use anyhow::{anyhow, bail, Context};
use clap::{Args, ValueEnum};
use syn::spanned::Spanned;
use syn::visit::Visit;

use crate::dsl::back::ptx::{self, occupancy, ptxas, AccessKind, PtxKernel, Target};
use crate::dsl::front::{find_kernels_with, tile_fns, FoundKernel, SpanTable};
use crate::dsl::ir::{Kernel, Loc};
use crate::dsl::{specialize, Specialization};

/// Arguments of `tilefuse inspect`.
#[derive(Args, Clone, Debug)]
pub struct InspectArgs {
    /// A Rust source file with `#[kernel]` functions.
    pub file: PathBuf,
    /// The kernel to inspect (default: every kernel in the file). A kernel over dtypes
    /// is named per binding, `matmul<f32>`; its bare name selects every binding.
    #[arg(long, value_name = "NAME")]
    pub kernel: Option<String>,
    /// A compile-time constant's value (default: the first listed value); repeatable.
    #[arg(long = "const", value_name = "NAME=V", value_parser = parse_const)]
    pub consts: Vec<(String, i64)>,
    /// Warps per program (default: the first listed value).
    #[arg(long, value_name = "W")]
    pub num_warps: Option<u32>,
    /// Pipelining depth of `dot` operand loads (default: the first listed value).
    #[arg(long, value_name = "S")]
    pub num_stages: Option<u32>,
    /// The target whose layouts and PTX are shown (ptxas reports cover both); kernels
    /// with thread-block clusters are shown for sm_90.
    #[arg(long, value_enum, default_value_t = TargetArg::Sm80)]
    pub target: TargetArg,
    /// Print the PTX.
    #[arg(long)]
    pub ptx: bool,
    /// Print the layout of every tile value, rematerialized ones included.
    #[arg(long)]
    pub layouts: bool,
    /// Print ptxas' full report for sm_80, sm_90 and (kernels whose `dot` takes `wgmma`)
    /// sm_90a (an error when ptxas is missing).
    #[arg(long)]
    pub ptxas: bool,
    /// The GPU whose SM the occupancy lines count, as its compute capability (`8.9` for
    /// an RTX 4090, `8.6` for an RTX 3090); default: the A100 (8.0) for sm_80 modules
    /// and the H100 (9.0) for sm_90 ones.
    #[arg(long, value_name = "MAJOR.MINOR", value_parser = parse_part)]
    pub sm: Option<(u32, u32)>,
}

/// `--target`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum TargetArg {
    /// `sm_80` (Ampere and newer through the driver's JIT).
    Sm80,
    /// `sm_90` (Hopper).
    Sm90,
    /// `sm_90a` (Hopper, compute capability 9.0 only: `dot` on `wgmma`).
    Sm90a,
}

impl From<TargetArg> for Target {
    fn from(t: TargetArg) -> Target {
        match t {
            TargetArg::Sm80 => Target::Sm80,
            TargetArg::Sm90 => Target::Sm90,
            TargetArg::Sm90a => Target::Sm90a,
        }
    }
}

fn parse_const(s: &str) -> Result<(String, i64), String> {
    let (name, value) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}`: expected NAME=VALUE, e.g. BLOCK=1024"))?;
    let value = value
        .trim()
        .parse()
        .map_err(|_| format!("`{s}`: `{value}` is not an integer"))?;
    Ok((name.trim().to_string(), value))
}

fn parse_part(s: &str) -> Result<(u32, u32), String> {
    let known = || {
        occupancy::SmLimits::known_parts()
            .map(|(a, b)| format!("{a}.{b}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let part = s
        .split_once('.')
        .and_then(|(a, b)| Some((a.trim().parse().ok()?, b.trim().parse().ok()?)))
        .ok_or_else(|| format!("`{s}`: expected a compute capability MAJOR.MINOR, e.g. 8.9"))?;
    occupancy::SmLimits::of_part(part.0, part.1)
        .map(|_| part)
        .ok_or_else(|| format!("`{s}`: no SM figures for this part (known: {})", known()))
}

/// Runs the inspection and returns what `tilefuse inspect` prints.
///
/// Without `--ptx`, `--layouts` or `--ptxas` the result is a summary of every selected
/// kernel; with any of them, just those sections.
pub fn run(args: &InspectArgs) -> anyhow::Result<String> {
    let file = args.file.display().to_string();
    let src = std::fs::read_to_string(&args.file).with_context(|| format!("cannot read {file}"))?;
    let elsewhere = crate_helpers(&args.file);
    let found = find_kernels_with(&src, &elsewhere).map_err(|e| anyhow!("{file}: {e}"))?;
    if found.is_empty() {
        bail!("{file}: no #[kernel] functions");
    }
    let selected: Vec<&FoundKernel> = match &args.kernel {
        Some(name) => {
            // A kernel over dtypes is found once per binding (`matmul<bf16>`,
            // `matmul<f32>`): its bare name selects every binding.
            let bound = format!("{name}<");
            let matching: Vec<&FoundKernel> = found
                .iter()
                .filter(|k| &k.name == name || k.name.starts_with(&bound))
                .collect();
            if matching.is_empty() {
                bail!(
                    "{file}: no kernel `{name}`; the file has: {}",
                    names(&found)
                );
            }
            matching
        }
        None => found.iter().collect(),
    };
    for (name, _) in &args.consts {
        if !selected
            .iter()
            .any(|k| k.ast.consts.iter().any(|c| &c.name == name))
        {
            bail!(
                "{file}: no constant `{name}` in {}",
                describe_consts(&selected)
            );
        }
    }
    let summary = !(args.ptx || args.layouts || args.ptxas);
    let lines: Vec<&str> = src.lines().collect();
    let mut out = String::new();
    for k in selected {
        inspect_one(args, &file, &lines, k, summary, &mut out)?;
    }
    Ok(out)
}

/// The `#[tile_fn]` helpers of the crate `file` belongs to (every `.rs` file under the
/// nearest directory holding a `Cargo.toml`, `target/` left out, in path order), so that
/// kernels calling helpers of other modules compile as `#[kernel]` compiles them. Files
/// that do not read or parse are skipped: only the inspected file's errors are reported.
fn crate_helpers(file: &std::path::Path) -> Vec<syn::ItemFn> {
    let start = std::fs::canonicalize(file).unwrap_or_else(|_| file.to_path_buf());
    let Some(root) = start
        .ancestors()
        .skip(1)
        .find(|d| d.join("Cargo.toml").is_file())
    else {
        return Vec::new();
    };
    let mut files = Vec::new();
    rust_files(root, &mut files);
    files.sort();
    files
        .iter()
        .filter(|f| **f != start)
        .filter_map(|f| std::fs::read_to_string(f).ok())
        .filter(|src| src.contains("tile_fn"))
        .filter_map(|src| tile_fns(&src).ok())
        .flatten()
        .collect()
}

/// Every `.rs` file under `dir`, skipping `target` and hidden directories.
fn rust_files(dir: &std::path::Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let name = e.file_name();
        let name = name.to_string_lossy();
        if p.is_dir() {
            if name != "target" && !name.starts_with('.') {
                rust_files(&p, out);
            }
        } else if name.ends_with(".rs") {
            out.push(p);
        }
    }
}

fn names(found: &[FoundKernel]) -> String {
    found
        .iter()
        .map(|k| format!("`{}` (line {})", k.name, k.line))
        .collect::<Vec<_>>()
        .join(", ")
}

fn describe_consts(kernels: &[&FoundKernel]) -> String {
    kernels
        .iter()
        .map(|k| {
            let cs: Vec<&str> = k.ast.consts.iter().map(|c| c.name.as_str()).collect();
            if cs.is_empty() {
                format!("`{}` (no constants)", k.name)
            } else {
                format!("`{}` (constants: {})", k.name, cs.join(", "))
            }
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// The specialization `args` asks for: given values, else the first listed ones.
fn specialization(args: &InspectArgs, k: &FoundKernel) -> anyhow::Result<Specialization> {
    let consts = k
        .ast
        .consts
        .iter()
        .map(|c| {
            let v = args
                .consts
                .iter()
                .rev()
                .find(|(n, _)| *n == c.name)
                .map(|(_, v)| *v)
                .or_else(|| c.values.first().copied())
                .ok_or_else(|| {
                    anyhow!("kernel `{}`: constant `{}` lists no values", k.name, c.name)
                })?;
            Ok((c.name.clone(), v))
        })
        .collect::<anyhow::Result<_>>()?;
    let num_warps = match args.num_warps.or_else(|| k.ast.num_warps.first().copied()) {
        Some(w) => w,
        None => bail!("kernel `{}`: no num_warps listed; pass --num-warps", k.name),
    };
    Ok(Specialization {
        consts,
        num_warps,
        num_stages: args.num_stages,
    })
}

fn spec_text(spec: &Specialization) -> String {
    let mut parts: Vec<String> = spec
        .consts
        .iter()
        .map(|(n, v)| format!("{n} = {v}"))
        .collect();
    parts.push(format!("num_warps = {}", spec.num_warps));
    if let Some(stages) = spec.num_stages {
        parts.push(format!("num_stages = {stages}"));
    }
    parts.join(", ")
}

fn inspect_one(
    args: &InspectArgs,
    file: &str,
    lines: &[&str],
    k: &FoundKernel,
    summary: bool,
    out: &mut String,
) -> anyhow::Result<()> {
    let spec = specialization(args, k)?;
    // Unnamed, the depth is the first listed one (as the compiler takes it).
    let resolved = Specialization {
        num_stages: spec
            .num_stages
            .or_else(|| k.ast.num_stages.first().copied()),
        ..spec.clone()
    };
    let listed = k.ast.specializations().contains(&resolved);
    let (kernel, spans) = k.compile(&spec).map_err(|e| {
        anyhow!(
            "{file}: kernel `{}` ({}): {}",
            k.name,
            spec_text(&spec),
            e.message
        )
    })?;
    let compile = |t: Target| {
        ptx::compile(&kernel, t).map_err(|e| {
            let at = src_pos(&spans, e.loc);
            anyhow!(
                "{file}:{at}: kernel `{}` ({}, {}): {}",
                k.name,
                spec_text(&spec),
                t.name(),
                e.message
            )
        })
    };
    // Clustered kernels, and those whose shared memory only sm_90 holds, have no sm_80
    // PTX (as `#[kernel]` builds them): they are shown for sm_90.
    let target = match Target::from(args.target) {
        Target::Sm80 if hopper_only(&kernel) => Target::Sm90,
        t => t,
    };
    let p = compile(target)?;
    let names = binding_names(&k.ast.body);
    let src = Src {
        lines,
        spans: &spans,
        names: &names,
    };

    if summary {
        let _ = writeln!(out, "kernel `{}` ({file}:{})", k.name, k.line);
        let _ = writeln!(
            out,
            "  specialization: {}{}",
            spec_text(&spec),
            if listed {
                ""
            } else {
                "  (not a listed specialization: #[kernel] does not build it)"
            }
        );
        let all = k.ast.specializations();
        let _ = writeln!(
            out,
            "  listed: {} specialization(s); threads per program: {}",
            all.len(),
            kernel.threads_per_program()
        );
        let _ = writeln!(out, "  target: {}", target.name());
        let kind = if p.shared_bytes > ptx::STATIC_SHARED_LIMIT {
            "dynamic, opted in at load"
        } else {
            "static"
        };
        let _ = writeln!(
            out,
            "  shared memory: {} bytes ({kind}, from the compiler)",
            p.shared_bytes
        );
        write_layouts(out, &src, &kernel, &p, false);
        write_accesses(out, &src, &kernel, &p);
        write_divisible_form(out, k, &spec, target, &p);
        write_ptxas(out, &kernel, &compile, args.sm, false)?;
        out.push('\n');
        return Ok(());
    }
    if args.layouts {
        let _ = writeln!(
            out,
            "kernel `{}` ({}, {}):",
            k.name,
            spec_text(&spec),
            target.name()
        );
        write_layouts(out, &src, &kernel, &p, true);
    }
    if args.ptxas {
        let _ = writeln!(out, "kernel `{}` ({}):", k.name, spec_text(&spec));
        write_ptxas(out, &kernel, &compile, args.sm, true)?;
    }
    if args.ptx {
        out.push_str(&p.ptx);
    }
    Ok(())
}

/// What the source says about a location: its line and column, the variable it is bound
/// to (if a `let` or an assignment names it), and its text.
struct Src<'a> {
    lines: &'a [&'a str],
    spans: &'a SpanTable,
    names: &'a HashMap<SpanKey, String>,
}

type SpanKey = (usize, usize, usize, usize);

fn key(span: proc_macro2::Span) -> SpanKey {
    let (s, e) = (span.start(), span.end());
    (s.line, s.column, e.line, e.column)
}

fn src_pos(spans: &SpanTable, loc: Loc) -> String {
    let s = spans.span(loc).start();
    format!("{}:{}", s.line, s.column + 1)
}

impl Src<'_> {
    /// `name (line:col)` or `` `text` (line:col) ``.
    fn describe(&self, loc: Loc) -> String {
        let span = self.spans.span(loc);
        let pos = src_pos(self.spans, loc);
        if let Some(n) = self.names.get(&key(span)) {
            return format!("{n} ({pos})");
        }
        let (s, e) = (span.start(), span.end());
        let text = match self.lines.get(s.line.wrapping_sub(1)) {
            Some(l) if s.line == e.line => {
                l.chars().skip(s.column).take(e.column - s.column).collect()
            }
            Some(l) => l.chars().skip(s.column).collect::<String>() + " ..",
            None => String::new(),
        };
        let text = if text.chars().count() > 40 {
            text.chars().take(37).collect::<String>() + "..."
        } else {
            text
        };
        format!("`{}` ({pos})", text.trim())
    }
}

/// The spans of the expressions that `let` statements and assignments name.
fn binding_names(body: &syn::Block) -> HashMap<SpanKey, String> {
    #[derive(Default)]
    struct Names(HashMap<SpanKey, String>);
    impl<'a> Visit<'a> for Names {
        fn visit_local(&mut self, l: &'a syn::Local) {
            if let (syn::Pat::Ident(pi), Some(init)) = (&l.pat, &l.init) {
                self.0.insert(key(init.expr.span()), pi.ident.to_string());
            }
            syn::visit::visit_local(self, l);
        }
        fn visit_expr_assign(&mut self, a: &'a syn::ExprAssign) {
            if let syn::Expr::Path(p) = &*a.left {
                if let Some(id) = p.path.get_ident() {
                    self.0.insert(key(a.right.span()), id.to_string());
                }
            }
            syn::visit::visit_expr_assign(self, a);
        }
        fn visit_expr_binary(&mut self, b: &'a syn::ExprBinary) {
            // `x += e` lowers to one value spanning the whole statement.
            if let syn::Expr::Path(p) = &*b.left {
                if let (Some(id), true) = (p.path.get_ident(), is_compound(&b.op)) {
                    self.0.insert(key(b.span()), id.to_string());
                }
            }
            syn::visit::visit_expr_binary(self, b);
        }
    }
    let mut n = Names::default();
    n.visit_block(body);
    n.0
}

fn is_compound(op: &syn::BinOp) -> bool {
    use syn::BinOp::*;
    matches!(
        op,
        AddAssign(_)
            | SubAssign(_)
            | MulAssign(_)
            | DivAssign(_)
            | RemAssign(_)
            | BitAndAssign(_)
            | BitOrAssign(_)
            | BitXorAssign(_)
            | ShlAssign(_)
            | ShrAssign(_)
    )
}

fn dims(v: &[usize]) -> String {
    let v: Vec<String> = v.iter().map(|x| x.to_string()).collect();
    format!("[{}]", v.join(", "))
}

fn write_layouts(out: &mut String, src: &Src, kernel: &Kernel, p: &PtxKernel, all: bool) {
    let shown: Vec<_> = p
        .value_layouts
        .iter()
        .filter(|v| all || !v.rematerialized)
        .collect();
    let _ = writeln!(
        out,
        "  layouts ({} of {} tile values{}; per space dim, fastest dim first in `order`):",
        shown.len(),
        p.value_layouts.len(),
        if all {
            ""
        } else {
            ", rematerialized ones left out (see --layouts)"
        }
    );
    for v in shown {
        let l = &v.layout;
        let mut notes = Vec::new();
        if l.keep.len() < l.space_rank() {
            let gone: Vec<usize> = (0..l.space_rank())
                .filter(|s| !l.keep.contains(s))
                .collect();
            notes.push(format!("slice: space dims {} reduced away", dims(&gone)));
        } else if l.keep.iter().enumerate().any(|(t, &s)| t != s) {
            notes.push(format!("tile dims on space dims {}", dims(&l.keep)));
        }
        if l.replicated() {
            notes.push("replicated over threads".into());
        }
        if v.rematerialized {
            notes.push("rematerialized".into());
        }
        let _ = writeln!(
            out,
            "    {:<5} {:<16} {}\n          per thread {} x threads/warp {} x warps {}, order {}, {} regs/thread{}",
            v.value.to_string(),
            kernel.ty(v.value).to_string(),
            src.describe(v.loc),
            dims(&l.spt),
            dims(&l.tpw),
            dims(&l.wpc),
            dims(&l.order),
            l.nregs(),
            if notes.is_empty() {
                String::new()
            } else {
                format!(" ({})", notes.join("; "))
            }
        );
    }
}

fn write_accesses(out: &mut String, src: &Src, kernel: &Kernel, p: &PtxKernel) {
    let _ = writeln!(out, "  global memory accesses (per thread):");
    if p.accesses.is_empty() {
        let _ = writeln!(out, "    none");
    }
    for a in &p.accesses {
        let kind = match a.kind {
            AccessKind::Load => "load",
            AccessKind::Store => "store",
            AccessKind::Atomic => "atomic",
        };
        let names: Vec<&str> = kernel
            .root_params(a.ptr)
            .unwrap_or_default()
            .iter()
            .filter_map(|&i| kernel.params.get(i))
            .map(|p| p.name.as_str())
            .collect();
        let param = if names.is_empty() {
            "?".to_string()
        } else {
            names.join("|")
        };
        let bytes = a.width * a.dtype.size_bytes();
        let _ = writeln!(
            out,
            "    {kind:<6} {param:<8} {} x {}: {} instruction(s) of {} element(s) ({} bytes{}) at {}",
            a.elements,
            a.dtype,
            a.elements.div_ceil(a.width),
            a.width,
            bytes,
            if a.width > 1 {
                format!(", .v{}", a.width)
            } else {
                String::new()
            },
            src.describe(a.loc)
        );
        if let Some(why) = &a.narrowed {
            let _ = writeln!(out, "           narrower than the layout allows: {why}");
        }
    }
}

/// ptxas' report for both targets, or a line saying why there is none (an error with
/// `--ptxas`).
/// Whether `#[kernel]` embeds a divisible form beside this specialization
/// (`tilefuse_dsl::specialize`), what it assumes and which accesses it widens.
fn write_divisible_form(
    out: &mut String,
    k: &FoundKernel,
    spec: &Specialization,
    target: Target,
    p: &PtxKernel,
) {
    if specialize::candidates(&k.ast).is_empty() {
        return;
    }
    let Some(params) = specialize::divisible_params(&k.ast, spec) else {
        let _ = writeln!(
            out,
            "  divisible form: none (no integer parameter's divisibility by 16 widens an access)"
        );
        return;
    };
    let names: Vec<String> = params
        .iter()
        .map(|&i| format!("`{}`", k.ast.params[i].name))
        .collect();
    let assumed = specialize::assume_divisible(&k.ast, &params);
    let widths = crate::dsl::compile(&assumed, spec)
        .ok()
        .and_then(|ir| ptx::compile(&ir, target).ok())
        .map(|f| f.accesses.iter().map(|a| a.width).collect::<Vec<_>>())
        .unwrap_or_default();
    let widened: Vec<String> = p
        .accesses
        .iter()
        .zip(&widths)
        .filter(|(a, w)| **w > a.width)
        .map(|(a, w)| format!("{} -> {w}", a.width))
        .collect();
    let (what, when) = if names.len() == 1 {
        ("a multiple", "it is")
    } else {
        ("multiples", "they are")
    };
    let _ = writeln!(
        out,
        "  divisible form: also compiled assuming {} {what} of 16, launched when {when}: {} access(es) wider ({})",
        names.join(", "),
        widened.len(),
        widened.join(", ")
    );
}

/// Whether `#[kernel]` builds no sm_80 module for this kernel: it uses thread-block
/// clusters, or its sm_90 module needs more shared memory than sm_80 gives a program.
fn hopper_only(kernel: &Kernel) -> bool {
    kernel.cluster_size() > 1
        || ptx::compile(kernel, Target::Sm90).is_ok_and(|p| !ptx::has_sm80_module(kernel, &p))
}

/// What one SM of `part` (default: `t`'s data-center part) holds of `kernel` with
/// ptxas' register count (the larger of the compiler's and ptxas' shared memory), as
/// the line `inspect` prints.
fn occupancy_line(
    t: Target,
    part: Option<(u32, u32)>,
    registers: u32,
    kernel: &Kernel,
    p: &PtxKernel,
    r: &ptxas::Report,
) -> String {
    let (major, minor) = part.unwrap_or(occupancy::SmLimits::part(t));
    if t.hopper() && major < 9 {
        return format!(
            "on {major}.{minor}: none ({} modules need compute capability 9.0)",
            t.name()
        );
    }
    let sm = occupancy::SmLimits::of_part(major, minor).expect("parse_part checked the part");
    let o = occupancy::occupancy_on(
        sm,
        registers,
        kernel.threads_per_program(),
        p.shared_bytes.max(r.shared_bytes),
    );
    format!("on {major}.{minor}: {o}")
}

fn write_ptxas(
    out: &mut String,
    kernel: &Kernel,
    compile: &dyn Fn(Target) -> anyhow::Result<PtxKernel>,
    part: Option<(u32, u32)>,
    full: bool,
) -> anyhow::Result<()> {
    let bin = match ptxas::find() {
        Ok(b) => b,
        Err(e) if full => bail!("{e}"),
        Err(e) => {
            let _ = writeln!(out, "  ptxas: not available: {e}");
            return Ok(());
        }
    };
    let _ = writeln!(out, "  ptxas ({}):", bin.display());
    for t in [Target::Sm80, Target::Sm90, Target::Sm90a] {
        if t == Target::Sm90a && !kernel.has_dot() {
            continue;
        }
        if t == Target::Sm80 && kernel.cluster_size() > 1 {
            let _ = writeln!(out, "    sm_80: none (thread-block clusters need sm_90)");
            continue;
        }
        if t == Target::Sm80 && hopper_only(kernel) {
            let _ = writeln!(
                out,
                "    sm_80: none (more shared memory than sm_80's {} KiB: a Hopper-only variant)",
                Target::Sm80.max_shared_bytes() / 1024
            );
            continue;
        }
        let p = compile(t)?;
        if t == Target::Sm90a && !p.uses_wgmma {
            // No sm_90a module is made for it.
            continue;
        }
        let r =
            ptxas::assemble(&bin, &p, t).map_err(|e| anyhow!("kernel `{}`: {e}", kernel.name))?;
        let _ = writeln!(
            out,
            "    {r}{}",
            if r.is_clean() {
                ""
            } else {
                "  <- spills or a stack frame: local memory traffic"
            }
        );
        let occupancy = occupancy_line(t, part, r.registers, kernel, &p, &r);
        let _ = writeln!(out, "      {occupancy}");
        if full {
            for l in r.log.lines() {
                let _ = writeln!(out, "      | {l}");
            }
        }
    }
    Ok(())
}
