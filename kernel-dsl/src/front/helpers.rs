//! Helper functions (`#[tile_fn]`): plain functions over tiles and scalars that kernels
//! and other helpers call, inlined at IR construction.
//!
//! This module parses a helper's signature ([`parse_tile_fn`]) and finds the calls of a
//! body that are not tile ops ([`helper_calls`]), which is how `#[kernel]` and
//! `#[tile_fn]` learn which helpers' source they must gather (see `docs/language.md`,
//! "Helper functions").

use proc_macro2::Span;
use syn::spanned::Spanned;
use syn::visit::Visit;
use syn::{FnArg, GenericParam, ItemFn, Pat};

/// Every name the language gives a meaning to as a free function (a call `name(..)` in a
/// kernel), statements included. The unknown-op error lists these, and `#[kernel]`
/// treats a call of any other name as a call of a `#[tile_fn]` helper.
pub const TILE_OPS: &[&str] = &[
    "program_id",
    "num_programs",
    "arange",
    "zeros",
    "full",
    "load",
    "make_tensor_descriptor",
    "store",
    "prefetch",
    "prefetch_range",
    "atomic_add",
    "atomic_max",
    "select",
    "where_",
    "maximum",
    "minimum",
    "exp",
    "exp2",
    "log",
    "log2",
    "sqrt",
    "rsqrt",
    "sin",
    "cos",
    "abs",
    "sigmoid",
    "tanh",
    "floor",
    "ceil",
    "sum",
    "max",
    "min",
    "argmax",
    "dot",
    "dot4",
    "byte_perm",
    "expand_dims",
    "bitcast",
    "broadcast_to",
    "cdiv",
    "cluster_gather",
    "global_timer",
    "sm_id",
    "wait_for_prior_kernels",
    "launch_dependents",
    "signal_flag",
    "wait_flag_at_least",
    "argmin",
    "cumsum",
    "cumprod",
    "trans",
    "permute",
    "reshape",
    "histogram",
    "rand",
    "randn",
    "randint",
];

/// Whether `name` is a tile op (see [`TILE_OPS`]).
pub fn is_tile_op(name: &str) -> bool {
    TILE_OPS.contains(&name)
}

/// A parsed `#[tile_fn]` helper.
#[derive(Clone, Debug)]
pub struct TileFn {
    /// The function's name.
    pub name: String,
    /// Generic parameters in order: `Ok(name)` a `const NAME: usize`, `Err(name)` a type
    /// parameter (an element type, bound by a turbofish or left unbound).
    pub generics: Vec<Result<String, String>>,
    /// Parameters: name, whether declared `mut`, and where.
    pub params: Vec<(String, bool, Span)>,
    /// Whether it declares a return type (its body's tail expression is the result).
    pub returns: bool,
    /// The body.
    pub body: syn::Block,
    /// Where the name was written.
    pub span: Span,
}

/// Whether an attribute is `#[tile_fn]` (also as a path, `#[tilefuse::tile_fn]`).
pub fn is_tile_fn_attr(a: &syn::Attribute) -> bool {
    a.path()
        .segments
        .last()
        .is_some_and(|s| s.ident == "tile_fn")
}

/// Parses a helper's signature and keeps its body for inlining.
pub fn parse_tile_fn(item: &ItemFn) -> syn::Result<TileFn> {
    let sig = &item.sig;
    let name = sig.ident.to_string();
    if is_tile_op(&name) {
        return Err(syn::Error::new(
            sig.ident.span(),
            format!("`{name}` is a tile op: name the helper differently"),
        ));
    }
    if let Some(tok) = &sig.asyncness {
        return Err(syn::Error::new(tok.span(), "helpers cannot be `async`"));
    }
    let mut generics = Vec::new();
    for g in &sig.generics.params {
        match g {
            GenericParam::Const(c) => generics.push(Ok(c.ident.to_string())),
            GenericParam::Type(t) => generics.push(Err(t.ident.to_string())),
            GenericParam::Lifetime(l) => {
                return Err(syn::Error::new(l.span(), "helpers take no lifetimes"))
            }
        }
    }
    let mut params = Vec::new();
    for arg in &sig.inputs {
        let FnArg::Typed(pt) = arg else {
            return Err(syn::Error::new(arg.span(), "helpers take no `self`"));
        };
        let Pat::Ident(pi) = &*pt.pat else {
            return Err(syn::Error::new(
                pt.pat.span(),
                "helper parameters are plain names (`x: Tile<f32>`)",
            ));
        };
        params.push((
            pi.ident.to_string(),
            pi.mutability.is_some(),
            pi.ident.span(),
        ));
    }
    Ok(TileFn {
        name,
        generics,
        params,
        returns: !matches!(sig.output, syn::ReturnType::Default),
        body: (*item.block).clone(),
        span: sig.ident.span(),
    })
}

/// The helpers a body calls: each call `f(..)` or `path::f(..)` whose last segment is not
/// a tile op, once per name, in order of first call, as the paths were written (so that
/// `#[kernel]` can resolve them where the body is written).
pub fn helper_calls(body: &syn::Block) -> Vec<syn::Path> {
    #[derive(Default)]
    struct Calls {
        found: Vec<syn::Path>,
    }
    impl<'ast> Visit<'ast> for Calls {
        fn visit_expr_call(&mut self, c: &'ast syn::ExprCall) {
            if let syn::Expr::Path(p) = &*c.func {
                if let Some(last) = p.path.segments.last() {
                    let name = last.ident.to_string();
                    let seen = self
                        .found
                        .iter()
                        .any(|f| f.segments.last().is_some_and(|s| s.ident == name));
                    if !is_tile_op(&name) && !seen && p.qself.is_none() {
                        // The path without generic arguments (`f::<B>` names macro `f`).
                        let mut path = p.path.clone();
                        for seg in path.segments.iter_mut() {
                            seg.arguments = syn::PathArguments::None;
                        }
                        self.found.push(path);
                    }
                }
            }
            syn::visit::visit_expr_call(self, c);
        }
    }
    let mut calls = Calls::default();
    calls.visit_block(body);
    calls.found
}

/// Helper items (`#[tile_fn] fn ..`) of a token stream holding zero or more items, as the
/// gathered helper sources arrive in `#[kernel]`'s expansion and in the interpreter.
pub fn parse_tile_fns(items: &[syn::Item]) -> syn::Result<Vec<TileFn>> {
    let mut out: Vec<TileFn> = Vec::new();
    // The text of each helper kept, to tell the same helper arriving twice (through two
    // callers) from two helpers sharing a name.
    let mut texts: Vec<String> = Vec::new();
    for item in items {
        let syn::Item::Fn(f) = item else {
            return Err(syn::Error::new(item.span(), "expected a `#[tile_fn] fn`"));
        };
        let parsed = parse_tile_fn(f)?;
        let text = quote::quote!(#f).to_string();
        if let Some(i) = out.iter().position(|h| h.name == parsed.name) {
            if texts[i] == text {
                continue;
            }
            return Err(syn::Error::new(
                parsed.span,
                format!(
                    "two different helpers named `{}` reach this kernel: helpers are found by name, so rename one",
                    parsed.name
                ),
            ));
        }
        out.push(parsed);
        texts.push(text);
    }
    Ok(out)
}
