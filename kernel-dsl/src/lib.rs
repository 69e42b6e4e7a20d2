//! # tilefuse-dsl
//!
//! The tilefuse kernel language: Rust-like tile functions compiled to PTX at build time,
//! with a CPU interpreter as the reference semantics.
//!
//! The compiler is a short list of stages, one module each:
//!
//! 1. [`front`]: syntax (a `syn` function) to an AST, then IR construction for one
//!    specialization of the compile-time constants (SSA, structured control flow);
//! 2. [`valid`]: type and shape inference (explicit broadcasts, casts, literal types);
//! 3. [`back`]: layouts, axis analysis and PTX;
//! 4. [`interp`]: the reference interpreter over host buffers;
//! 5. [`runtime`]: devices, buffers and typed launches on the GPU or the interpreter.

#![warn(missing_docs)]

pub mod back;
pub mod error;
pub mod front;
pub mod interp;
pub mod ir;
pub mod runtime;
#[cfg(test)]
mod testing;
pub mod valid;

pub use error::CompileError;
pub use half;

/// One specialization of a kernel: a value for every compile-time constant, and the
/// number of warps per program.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Specialization {
    /// `(name, value)` for every const generic, in declaration order.
    pub consts: Vec<(String, i64)>,
    /// Warps per program.
    pub num_warps: u32,
}

/// Runs IR construction and type inference for one specialization.
///
/// Returns the span table with the result so that `#[kernel]` can point errors at the
/// user's code.
pub fn compile_with_spans(
    ast: &front::KernelAst,
    spec: &Specialization,
) -> (Result<ir::Kernel, CompileError>, front::SpanTable) {
    let (lowered, spans) = front::lower(ast, spec);
    (lowered.and_then(|k| valid::infer(&k)), spans)
}

/// Runs IR construction and type inference for one specialization.
pub fn compile(ast: &front::KernelAst, spec: &Specialization) -> Result<ir::Kernel, CompileError> {
    compile_with_spans(ast, spec).0
}

/// Compiles a kernel's source text (the `#[kernel(..)] fn` item, as `#[kernel]` embeds
/// it) for one specialization: parse, IR construction, type and shape inference.
///
/// This is the run-time path the interpreter uses; `#[kernel]` runs the same stages at
/// build time. Errors carry the line and column in `src`.
pub fn compile_source(src: &str, spec: &Specialization) -> Result<ir::Kernel, CompileError> {
    let located = |span: proc_macro2::Span, msg: &str| {
        let start = span.start();
        CompileError::new(
            ir::Loc::default(),
            format!("line {}, column {}: {msg}", start.line, start.column + 1),
        )
    };
    let item: syn::ItemFn = syn::parse_str(src).map_err(|e| located(e.span(), &e.to_string()))?;
    let attr = item
        .attrs
        .iter()
        .find(|a| a.path().is_ident("kernel"))
        .map(|a| match &a.meta {
            syn::Meta::List(l) => l.tokens.clone(),
            _ => proc_macro2::TokenStream::new(),
        })
        .unwrap_or_default();
    let mut bare = item.clone();
    bare.attrs.clear();
    let ast = front::parse_kernel(attr, &bare).map_err(|e| located(e.span(), &e.to_string()))?;
    let (result, spans) = compile_with_spans(&ast, spec);
    result.map_err(|e| {
        let loc = e.loc;
        let mut err = located(spans.span(loc), &e.message);
        err.loc = loc;
        err
    })
}
