//! # tilefuse-dsl
//!
//! The tilefuse kernel language: Rust-like tile functions compiled to PTX at build time,
//! with a CPU interpreter as the reference semantics.
//!
//! The compiler is a short list of stages, one module each:
//!
//! 1. [`front`]: syntax (a `syn` function) to an AST, then IR construction for one
//!    specialization of the compile-time constants (SSA, structured control flow);
//! 2. [`valid`]: type and shape inference (explicit broadcasts, casts, literal types),
//!    then [`compact`]: values nothing needs are dropped and the arena renumbered;
//! 3. [`back`]: layouts, axis analysis and PTX;
//! 4. [`interp`]: the reference interpreter over host buffers;
//! 5. [`runtime`]: devices, buffers and typed launches on the GPU or the interpreter.

#![warn(missing_docs)]

pub mod back;
pub mod compact;
pub mod error;
pub mod front;
pub mod interp;
pub mod ir;
pub mod runtime;
pub mod specialize;
#[cfg(test)]
mod testing;
pub mod valid;

pub use error::CompileError;
pub use half;
pub use ir::Specialization;

/// Runs IR construction, type inference and [`compact`] for one specialization.
///
/// Returns the span table with the result so that `#[kernel]` can point errors at the
/// user's code.
pub fn compile_with_spans(
    ast: &front::KernelAst,
    spec: &Specialization,
) -> (Result<ir::Kernel, CompileError>, front::SpanTable) {
    let (lowered, spans) = front::lower(ast, spec);
    (
        lowered.and_then(|k| valid::infer(&k)).map(compact::compact),
        spans,
    )
}

/// Runs IR construction and type inference for one specialization.
pub fn compile(ast: &front::KernelAst, spec: &Specialization) -> Result<ir::Kernel, CompileError> {
    compile_with_spans(ast, spec).0
}

/// Compiles a kernel's source text (the `#[kernel(..)] fn` item, as `#[kernel]` embeds
/// it, followed by the `#[tile_fn]` helpers it calls) for one specialization: parse,
/// IR construction, type and shape inference.
///
/// A dtype-generic kernel's text carries its dtypes as `#[bind_types(T = bf16)]` after
/// `#[kernel(..)]`: `#[kernel]` embeds one text per combination of dtypes.
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
    let ast = parse_source(src).map_err(|e| located(e.span(), &e.to_string()))?;
    let (result, spans) = compile_with_spans(&ast, spec);
    result.map_err(|e| {
        let loc = e.loc;
        let mut err = located(spans.span(loc), &e.message);
        err.loc = loc;
        err
    })
}

/// The source text of the statement or expression at `loc` in a kernel compiled by
/// [`compile_source`] from `src` for `spec` (the same stages give the same locations),
/// with its whitespace collapsed; `None` if it cannot be recovered.
pub fn source_snippet(src: &str, spec: &Specialization, loc: ir::Loc) -> Option<String> {
    let ast = parse_source(src).ok()?;
    let (_, spans) = compile_with_spans(&ast, spec);
    let text = spans.span(loc).source_text()?;
    Some(text.split_whitespace().collect::<Vec<_>>().join(" "))
}

/// Parses a kernel's source text as [`compile_source`] takes it: the kernel (the first
/// function, its attribute `#[kernel(..)]`), then any `#[tile_fn]` helpers.
pub fn parse_source(src: &str) -> syn::Result<front::KernelAst> {
    let file: syn::File = syn::parse_str(src)?;
    let mut items = file.items.into_iter();
    let item = match items.next() {
        Some(syn::Item::Fn(f)) => f,
        Some(other) => {
            return Err(syn::Error::new_spanned(
                other,
                "expected the kernel's `fn` first",
            ))
        }
        None => {
            return Err(syn::Error::new(
                proc_macro2::Span::call_site(),
                "no kernel in the source",
            ))
        }
    };
    let attr_tokens = |name: &str| {
        item.attrs
            .iter()
            .find(|a| a.path().is_ident(name))
            .map(|a| match &a.meta {
                syn::Meta::List(l) => l.tokens.clone(),
                _ => proc_macro2::TokenStream::new(),
            })
    };
    let attr = attr_tokens("kernel").unwrap_or_default();
    let binding = attr_tokens("bind_types");
    let mut bare = item.clone();
    bare.attrs.clear();
    let mut ast = front::parse_kernel(attr, &bare)?;
    if let Some(tokens) = binding {
        let pairs = front::parse::parse_type_binding(tokens)?;
        ast = ast.bind_types(&pairs);
    }
    let helpers: Vec<syn::Item> = items.collect();
    ast.helpers = front::helpers::parse_tile_fns(&helpers)?;
    Ok(ast)
}
