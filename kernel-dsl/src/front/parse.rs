//! Syntax: a `#[kernel(..)]` attribute and its `fn` item to a [`KernelAst`].
//!
//! This stage checks the signature (constants, parameters, attribute values) and keeps
//! the body as `syn` syntax for [`mod@super::lower`], which builds the IR one specialization
//! at a time.

use proc_macro2::{Span, TokenStream};
use syn::parse::{Parse, ParseStream};
use syn::punctuated::Punctuated;
use syn::spanned::Spanned;
use syn::{Expr, FnArg, GenericParam, Ident, ItemFn, Lit, Pat, ReturnType, Token, Type};

use crate::ir::{DType, ParamKind};

/// Warps per program when the attribute lists none.
pub const DEFAULT_NUM_WARPS: u32 = 4;

/// Pipeline depth of `dot` operand loads when the attribute gives no `num_stages`:
/// double buffering (one copy in flight while the tensor cores work on the other).
/// Kernels without `dot` in a loop are unaffected.
pub const DEFAULT_NUM_STAGES: u32 = 2;

/// A compile-time constant (`const BLOCK: usize`) and the values to compile it for.
#[derive(Clone, Debug)]
pub struct ConstDecl {
    /// The name.
    pub name: String,
    /// The values listed in the attribute.
    pub values: Vec<i64>,
    /// Where it was declared.
    pub span: Span,
}

/// A run-time parameter.
#[derive(Clone, Debug)]
pub struct ParamDecl {
    /// The name.
    pub name: String,
    /// Pointer or scalar.
    pub kind: ParamKind,
    /// Where it was declared.
    pub span: Span,
    /// The type parameter naming its element type (`x: Ptr<T>` in a kernel generic over
    /// `T`), whose dtype `kind` takes once bound ([`KernelAst::bind_types`]).
    pub generic: Option<String>,
    /// Whether `#[kernel]` may compile a form that assumes this integer a multiple of 16
    /// (`false` under `#[do_not_specialize]`; see [`crate::specialize`]).
    pub specialize: bool,
}

/// An element-type parameter (`T` in `fn softmax<T: Float, ..>`) and the dtypes to
/// compile it for (`T = [f32, bf16]` in the attribute).
#[derive(Clone, Debug)]
pub struct TypeDecl {
    /// The name.
    pub name: String,
    /// The dtypes listed in the attribute.
    pub values: Vec<DType>,
    /// Where it was declared.
    pub span: Span,
}

/// A parsed kernel: its checked signature, the values to specialize for, and its body.
#[derive(Clone, Debug)]
pub struct KernelAst {
    /// The function's name.
    pub name: Ident,
    /// Compile-time constants in declaration order.
    pub consts: Vec<ConstDecl>,
    /// Element-type parameters in declaration order (each compiled for every listed
    /// dtype: one kernel per combination, see [`KernelAst::type_combinations`]).
    pub types: Vec<TypeDecl>,
    /// The dtypes of the type parameters this AST was bound to (empty until
    /// [`KernelAst::bind_types`]).
    pub bound_types: Vec<(String, DType)>,
    /// The `#[tile_fn]` helpers the body may call (gathered by `#[kernel]`).
    pub helpers: Vec<super::helpers::TileFn>,
    /// `num_warps` values to compile for.
    pub num_warps: Vec<u32>,
    /// Software-pipelining depths of `dot` operand loads in loops to compile for
    /// (`num_stages = [3, 4]`, a variant axis like `num_warps`; [`DEFAULT_NUM_STAGES`]
    /// alone when absent). Never empty.
    pub num_stages: Vec<u32>,
    /// Combinations left out of the product (`skip(NAME = v, .., num_warps = w)`), each
    /// a list of `(name, value)` pairs that together exclude every specialization they
    /// all match (`num_warps` and `num_stages` by those names).
    pub skips: Vec<Vec<(String, i64)>>,
    /// Register limits (`max_registers(N, NAME = v, ..)`): a specialization that every
    /// pair of an entry matches (as `skip` matches) is compiled with at most `N`
    /// registers a thread; the first matching entry applies.
    pub register_caps: Vec<(u32, Vec<(String, i64)>)>,
    /// Run-time parameters in order.
    pub params: Vec<ParamDecl>,
    /// The body.
    pub body: syn::Block,
    /// The path generated code uses to reach `tilefuse_dsl` (`crate = path` in the
    /// attribute); `None` for the default, `::tilefuse::dsl`.
    pub crate_path: Option<syn::Path>,
    /// Programs per thread-block cluster along x, y and z (`cluster(y = C)`): an
    /// integer or a const generic's name each, 1 where not given.
    pub cluster: [ClusterExtent; 3],
}

/// One axis of `cluster(..)` in the attribute.
#[derive(Clone, Debug)]
pub enum ClusterExtent {
    /// A literal extent.
    Lit(i64, Span),
    /// A const generic's name, resolved per specialization.
    Const(String, Span),
}

impl ClusterExtent {
    /// The extent under a specialization's constants (`None`: an unknown name).
    pub fn resolve(&self, consts: &[(String, i64)]) -> Option<i64> {
        match self {
            ClusterExtent::Lit(v, _) => Some(*v),
            ClusterExtent::Const(name, _) => {
                consts.iter().find(|(n, _)| n == name).map(|(_, v)| *v)
            }
        }
    }

    /// Where it was written.
    pub fn span(&self) -> Span {
        match self {
            ClusterExtent::Lit(_, s) | ClusterExtent::Const(_, s) => *s,
        }
    }
}

impl KernelAst {
    /// Every combination of the type parameters' dtypes, in declaration order (one
    /// empty combination for a kernel without type parameters).
    pub fn type_combinations(&self) -> Vec<Vec<(String, DType)>> {
        let mut combos: Vec<Vec<(String, DType)>> = vec![vec![]];
        for t in &self.types {
            combos = combos
                .into_iter()
                .flat_map(|prefix| {
                    t.values.iter().map(move |d| {
                        let mut next = prefix.clone();
                        next.push((t.name.clone(), *d));
                        next
                    })
                })
                .collect();
        }
        combos
    }

    /// This kernel with its type parameters bound to `binding` (one of
    /// [`KernelAst::type_combinations`]): generic parameters take their dtypes, and the
    /// body's `T` means the bound dtype.
    pub fn bind_types(&self, binding: &[(String, DType)]) -> KernelAst {
        let mut ast = self.clone();
        for p in &mut ast.params {
            let Some(g) = &p.generic else { continue };
            let Some((_, d)) = binding.iter().find(|(n, _)| n == g) else {
                continue;
            };
            p.kind = match p.kind {
                ParamKind::Ptr(_) => ParamKind::Ptr(*d),
                ParamKind::Scalar(_) => ParamKind::Scalar(*d),
                ParamKind::ScalarMultipleOf(_, m) => ParamKind::ScalarMultipleOf(*d, m),
            };
        }
        for t in &mut ast.types {
            if let Some((_, d)) = binding.iter().find(|(n, _)| *n == t.name) {
                t.values = vec![*d];
            }
        }
        ast.bound_types = binding.to_vec();
        ast
    }

    /// Every combination of constant values, `num_warps` and `num_stages`, constants
    /// varying slowest in declaration order, then `num_warps`, `num_stages` fastest, less
    /// the ones a `skip(..)` matches.
    pub fn specializations(&self) -> Vec<crate::Specialization> {
        let mut all = self.product();
        all.retain(|spec| !self.skips.iter().any(|skip| skip_matches(skip, spec)));
        all
    }

    fn product(&self) -> Vec<crate::Specialization> {
        let mut combos: Vec<Vec<(String, i64)>> = vec![vec![]];
        for c in &self.consts {
            combos = combos
                .into_iter()
                .flat_map(|prefix| {
                    c.values.iter().map(move |v| {
                        let mut next = prefix.clone();
                        next.push((c.name.clone(), *v));
                        next
                    })
                })
                .collect();
        }
        combos
            .into_iter()
            .flat_map(|consts| {
                self.num_warps.iter().flat_map(move |&num_warps| {
                    let consts = consts.clone();
                    self.num_stages
                        .iter()
                        .map(move |&stages| crate::Specialization {
                            consts: consts.clone(),
                            num_warps,
                            num_stages: Some(stages),
                        })
                })
            })
            .collect()
    }
}

impl KernelAst {
    /// The register limit of `spec` (`max_registers(..)` in the attribute), if any.
    pub fn register_cap(&self, spec: &crate::Specialization) -> Option<u32> {
        self.register_caps
            .iter()
            .find(|(_, pairs)| skip_matches(pairs, spec))
            .map(|(n, _)| *n)
    }
}

fn skip_matches(skip: &[(String, i64)], spec: &crate::Specialization) -> bool {
    skip.iter().all(|(name, v)| {
        if name == "num_warps" {
            i64::from(spec.num_warps) == *v
        } else if name == "num_stages" {
            spec.num_stages.is_some_and(|s| i64::from(s) == *v)
        } else {
            spec.consts.iter().any(|(n, c)| n == name && c == v)
        }
    })
}

/// One `NAME = [v, ..]` or `NAME = v` entry of the attribute, `crate = path`,
/// `skip(NAME = v, ..)` or `cluster(y = C, ..)`.
struct AttrEntry {
    name: Ident,
    values: Vec<(i64, Span)>,
    crate_path: Option<syn::Path>,
    skip: Option<Vec<SkipPair>>,
    /// `max_registers(N, NAME = v, ..)`: the limit, its span and the variants it is for.
    cap: Option<(i64, Span, Vec<SkipPair>)>,
    cluster: Option<Vec<(Ident, ClusterExtent)>>,
    /// `T = [f32, bf16]`: the dtypes of a type parameter.
    dtypes: Option<Vec<(DType, Span)>>,
}

/// `x = 2` or `y = SPLITS` inside `cluster(..)`.
struct ClusterPair {
    axis: Ident,
    extent: ClusterExtent,
}

impl Parse for ClusterPair {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let axis: Ident = input.parse()?;
        input.parse::<Token![=]>()?;
        let expr: Expr = input.parse()?;
        let extent = match &expr {
            Expr::Path(p) if p.path.get_ident().is_some() => {
                ClusterExtent::Const(p.path.get_ident().unwrap().to_string(), expr.span())
            }
            other => ClusterExtent::Lit(int_literal(other)?, expr.span()),
        };
        Ok(ClusterPair { axis, extent })
    }
}

/// `NAME = v` or `NAME = [v1, v2, ..]` (any of the values) inside `skip(..)`.
struct SkipPair {
    name: Ident,
    values: Vec<(i64, Span)>,
}

impl Parse for SkipPair {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        let name: Ident = input.parse()?;
        input.parse::<Token![=]>()?;
        let values = int_list(input.parse()?)?;
        if values.is_empty() {
            return Err(syn::Error::new(
                name.span(),
                format!("`skip` lists no values for `{name}`"),
            ));
        }
        Ok(SkipPair { name, values })
    }
}

impl Parse for AttrEntry {
    fn parse(input: ParseStream) -> syn::Result<Self> {
        if input.peek(Token![crate]) {
            let tok: Token![crate] = input.parse()?;
            input.parse::<Token![=]>()?;
            let path: syn::Path = input.parse()?;
            return Ok(AttrEntry {
                name: Ident::new("crate", tok.span),
                values: Vec::new(),
                crate_path: Some(path),
                skip: None,
                cap: None,
                cluster: None,
                dtypes: None,
            });
        }
        let name: Ident = input.parse()?;
        if name == "cluster" && input.peek(syn::token::Paren) {
            let inner;
            syn::parenthesized!(inner in input);
            let pairs: Punctuated<ClusterPair, Token![,]> =
                inner.parse_terminated(ClusterPair::parse, Token![,])?;
            return Ok(AttrEntry {
                name,
                values: Vec::new(),
                crate_path: None,
                skip: None,
                cap: None,
                cluster: Some(pairs.into_iter().map(|p| (p.axis, p.extent)).collect()),
                dtypes: None,
            });
        }
        if name == "max_registers" && input.peek(syn::token::Paren) {
            let inner;
            syn::parenthesized!(inner in input);
            let limit: Expr = inner.parse()?;
            let n = int_literal(&limit)?;
            let mut pairs = Vec::new();
            while inner.parse::<Option<Token![,]>>()?.is_some() && !inner.is_empty() {
                pairs.push(inner.parse::<SkipPair>()?);
            }
            if !inner.is_empty() {
                return Err(inner.error("expected `max_registers(N, NAME = v, ..)`"));
            }
            return Ok(AttrEntry {
                name,
                values: Vec::new(),
                crate_path: None,
                skip: None,
                cap: Some((n, limit.span(), pairs)),
                cluster: None,
                dtypes: None,
            });
        }
        if name == "skip" && input.peek(syn::token::Paren) {
            let inner;
            syn::parenthesized!(inner in input);
            let pairs: Punctuated<SkipPair, Token![,]> =
                inner.parse_terminated(SkipPair::parse, Token![,])?;
            if pairs.is_empty() {
                return Err(syn::Error::new(
                    name.span(),
                    "`skip(..)` names no values: write `skip(NAME = v, num_warps = w)`",
                ));
            }
            return Ok(AttrEntry {
                name,
                values: Vec::new(),
                crate_path: None,
                skip: Some(pairs.into_iter().collect()),
                cap: None,
                cluster: None,
                dtypes: None,
            });
        }
        input.parse::<Token![=]>()?;
        let expr: Expr = input.parse()?;
        if let Some(dtypes) = dtype_list(&expr)? {
            return Ok(AttrEntry {
                name,
                values: Vec::new(),
                crate_path: None,
                skip: None,
                cap: None,
                cluster: None,
                dtypes: Some(dtypes),
            });
        }
        let values = int_list(expr)?;
        if values.is_empty() {
            return Err(syn::Error::new(
                name.span(),
                format!("`{name}` lists no values: write `{name} = [v1, v2, ..]`"),
            ));
        }
        Ok(AttrEntry {
            name,
            values,
            crate_path: None,
            skip: None,
            cap: None,
            cluster: None,
            dtypes: None,
        })
    }
}

/// `f32` or `[f32, bf16, ..]`: the dtypes of a type parameter, or `None` when the
/// entry is not a list of names (integers are then parsed by [`int_list`]).
fn dtype_list(expr: &Expr) -> syn::Result<Option<Vec<(DType, Span)>>> {
    let items: Vec<&Expr> = match expr {
        Expr::Array(a) => a.elems.iter().collect(),
        other => vec![other],
    };
    if items.is_empty() || !items.iter().all(|e| matches!(e, Expr::Path(_))) {
        return Ok(None);
    }
    items
        .iter()
        .map(|e| {
            let name = match e {
                Expr::Path(p) => p.path.get_ident().map(|i| i.to_string()),
                _ => None,
            };
            match name.as_deref().and_then(DType::from_name) {
                Some(d) if d != DType::Bool => Ok((d, e.span())),
                _ => Err(syn::Error::new(
                    e.span(),
                    "expected an element type: u8, i32, u32, i64, f16, bf16 or f32",
                )),
            }
        })
        .collect::<syn::Result<Vec<_>>>()
        .map(Some)
}

/// `v` or `[v1, v2, ..]`: the integer literals with their spans (possibly none).
fn int_list(expr: Expr) -> syn::Result<Vec<(i64, Span)>> {
    let items: Vec<Expr> = match expr {
        Expr::Array(a) => a.elems.into_iter().collect(),
        other => vec![other],
    };
    items
        .iter()
        .map(|item| Ok((int_literal(item)?, item.span())))
        .collect()
}

fn int_literal(e: &Expr) -> syn::Result<i64> {
    match e {
        Expr::Lit(l) => match &l.lit {
            Lit::Int(i) => i.base10_parse::<i64>(),
            _ => Err(syn::Error::new(e.span(), "expected an integer literal")),
        },
        Expr::Group(g) => int_literal(&g.expr),
        _ => Err(syn::Error::new(e.span(), "expected an integer literal")),
    }
}

/// Parses `T = bf16, U = f32` (the `#[bind_types(..)]` of a dtype-generic kernel's
/// embedded source) into `(name, dtype)` pairs.
pub fn parse_type_binding(tokens: TokenStream) -> syn::Result<Vec<(String, DType)>> {
    struct Pair(String, DType);
    impl Parse for Pair {
        fn parse(input: ParseStream) -> syn::Result<Self> {
            let name: Ident = input.parse()?;
            input.parse::<Token![=]>()?;
            let ty: Ident = input.parse()?;
            match DType::from_name(&ty.to_string()) {
                Some(d) => Ok(Pair(name.to_string(), d)),
                None => Err(syn::Error::new(ty.span(), "expected an element type")),
            }
        }
    }
    let pairs: Punctuated<Pair, Token![,]> =
        syn::parse::Parser::parse2(Punctuated::parse_terminated, tokens)?;
    Ok(pairs.into_iter().map(|Pair(n, d)| (n, d)).collect())
}

/// Parses the attribute arguments and the function into a [`KernelAst`].
pub fn parse_kernel(attr: TokenStream, item: &ItemFn) -> syn::Result<KernelAst> {
    let entries: Punctuated<AttrEntry, Token![,]> =
        syn::parse::Parser::parse2(Punctuated::parse_terminated, attr)?;
    let sig = &item.sig;
    if let Some(tok) = &sig.asyncness {
        return Err(syn::Error::new(tok.span(), "kernels cannot be `async`"));
    }
    if let ReturnType::Type(_, ty) = &sig.output {
        return Err(syn::Error::new(
            ty.span(),
            "kernels return nothing: write results with `store`",
        ));
    }

    let mut consts = Vec::new();
    let mut types: Vec<TypeDecl> = Vec::new();
    for g in &sig.generics.params {
        match g {
            GenericParam::Type(t) => types.push(TypeDecl {
                name: t.ident.to_string(),
                values: Vec::new(),
                span: t.ident.span(),
            }),
            GenericParam::Const(c) => {
                let ty = &c.ty;
                let ty_name = quote::quote!(#ty).to_string();
                if ty_name != "usize" {
                    return Err(syn::Error::new(
                        c.ty.span(),
                        "kernel constants are `const NAME: usize`",
                    ));
                }
                consts.push(ConstDecl {
                    name: c.ident.to_string(),
                    values: Vec::new(),
                    span: c.ident.span(),
                });
            }
            other => return Err(syn::Error::new(
                other.span(),
                "kernels take only const generics (`const BLOCK: usize`) and element types (`T`)",
            )),
        }
    }

    let mut num_warps = Vec::new();
    let mut num_stages: Vec<u32> = Vec::new();
    let mut crate_path = None;
    let mut skip_entries = Vec::new();
    let mut cap_entries: Vec<(u32, Vec<SkipPair>)> = Vec::new();
    let one = |span| ClusterExtent::Lit(1, span);
    let mut cluster = [
        one(sig.ident.span()),
        one(sig.ident.span()),
        one(sig.ident.span()),
    ];
    let mut cluster_seen = false;
    for entry in entries {
        if let Some(dtypes) = entry.dtypes {
            let name = entry.name.to_string();
            let Some(decl) = types.iter_mut().find(|t| t.name == name) else {
                return Err(syn::Error::new(
                    entry.name.span(),
                    format!("`{name}` is not a type parameter of this kernel (declare `fn k<{name}>(..)`)"),
                ));
            };
            if !decl.values.is_empty() {
                return Err(syn::Error::new(
                    entry.name.span(),
                    format!("values for `{name}` are listed twice"),
                ));
            }
            for (d, span) in dtypes {
                if decl.values.contains(&d) {
                    return Err(syn::Error::new(span, format!("`{d}` is listed twice")));
                }
                decl.values.push(d);
            }
            continue;
        }
        if entry.crate_path.is_some() {
            crate_path = entry.crate_path;
            continue;
        }
        if let Some(pairs) = entry.cluster {
            if cluster_seen {
                return Err(syn::Error::new(
                    entry.name.span(),
                    "`cluster(..)` is given twice",
                ));
            }
            cluster_seen = true;
            if pairs.is_empty() {
                return Err(syn::Error::new(
                    entry.name.span(),
                    "`cluster(..)` names no axis: write `cluster(y = 8)`",
                ));
            }
            let mut given = [false; 3];
            for (axis, extent) in pairs {
                let Some(a) = ["x", "y", "z"].iter().position(|n| axis == n) else {
                    return Err(syn::Error::new(
                        axis.span(),
                        format!("`cluster` axes are x, y and z, not `{axis}`"),
                    ));
                };
                if given[a] {
                    return Err(syn::Error::new(
                        axis.span(),
                        format!("`cluster` gives `{axis}` twice"),
                    ));
                }
                given[a] = true;
                if let ClusterExtent::Const(name, span) = &extent {
                    if !consts.iter().any(|c| c.name == *name) {
                        return Err(syn::Error::new(
                            *span,
                            format!("`{name}` is not a const generic of this kernel"),
                        ));
                    }
                }
                cluster[a] = extent;
            }
            continue;
        }
        if let Some(pairs) = entry.skip {
            skip_entries.push((entry.name.span(), pairs));
            continue;
        }
        if let Some((n, span, pairs)) = entry.cap {
            if !(16..=255).contains(&n) {
                return Err(syn::Error::new(
                    span,
                    format!("max_registers must be from 16 to 255, got {n}"),
                ));
            }
            cap_entries.push((n as u32, pairs));
            continue;
        }
        let name = entry.name.to_string();
        if name == "num_warps" {
            for (v, span) in entry.values {
                if !(1..=32).contains(&v) || (v as u64).count_ones() != 1 {
                    return Err(syn::Error::new(
                        span,
                        format!("num_warps must be a power of two from 1 to 32, got {v}"),
                    ));
                }
                num_warps.push(v as u32);
            }
            continue;
        }
        if name == "num_stages" {
            if !num_stages.is_empty() {
                return Err(syn::Error::new(
                    entry.name.span(),
                    "values for `num_stages` are listed twice",
                ));
            }
            for (v, span) in entry.values {
                if !(1..=8).contains(&v) {
                    return Err(syn::Error::new(
                        span,
                        format!("num_stages must be from 1 to 8, got {v}"),
                    ));
                }
                if num_stages.contains(&(v as u32)) {
                    return Err(syn::Error::new(
                        span,
                        format!("num_stages = {v} is listed twice"),
                    ));
                }
                num_stages.push(v as u32);
            }
            continue;
        }
        let Some(decl) = consts.iter_mut().find(|c| c.name == name) else {
            return Err(syn::Error::new(
                entry.name.span(),
                format!("`{name}` is not a const generic of this kernel (declare `const {name}: usize`)"),
            ));
        };
        if !decl.values.is_empty() {
            return Err(syn::Error::new(
                entry.name.span(),
                format!("values for `{name}` are listed twice"),
            ));
        }
        for (v, span) in entry.values {
            if v < 0 {
                return Err(syn::Error::new(span, "kernel constants are non-negative"));
            }
            decl.values.push(v);
        }
    }
    for c in &consts {
        if c.values.is_empty() {
            return Err(syn::Error::new(
                c.span,
                format!(
                    "constant `{}` has no listed values: add `{} = [..]` to `#[kernel(..)]`",
                    c.name, c.name
                ),
            ));
        }
    }
    for t in &types {
        if t.values.is_empty() {
            return Err(syn::Error::new(
                t.span,
                format!(
                    "type parameter `{}` has no listed dtypes: add `{} = [f32, bf16]` to `#[kernel(..)]`",
                    t.name, t.name
                ),
            ));
        }
    }
    if num_warps.is_empty() {
        num_warps.push(DEFAULT_NUM_WARPS);
    }
    if num_stages.is_empty() {
        num_stages.push(DEFAULT_NUM_STAGES);
    }
    // A list of values selects each of them: an entry expands into the product of
    // single-valued entries.
    let expand = |pairs: Vec<SkipPair>, what: &str| -> syn::Result<Vec<Vec<(String, i64)>>> {
        let mut expanded: Vec<Vec<(String, i64)>> = vec![Vec::new()];
        let mut named: Vec<String> = Vec::new();
        for SkipPair { name, values } in pairs {
            let key = name.to_string();
            for &(v, v_span) in &values {
                let listed = if key == "num_warps" {
                    num_warps.iter().any(|&w| i64::from(w) == v)
                } else if key == "num_stages" {
                    num_stages.iter().any(|&s| i64::from(s) == v)
                } else if let Some(c) = consts.iter().find(|c| c.name == key) {
                    c.values.contains(&v)
                } else {
                    return Err(syn::Error::new(
                        name.span(),
                        format!("`{what}` names `{key}`, which is neither a const generic of this kernel nor `num_warps` or `num_stages`"),
                    ));
                };
                if !listed {
                    return Err(syn::Error::new(
                        v_span,
                        format!(
                            "`{what}` {} {key} = {v}, which is not among the listed values",
                            if what == "skip" {
                                "excludes"
                            } else {
                                "selects"
                            }
                        ),
                    ));
                }
            }
            if named.contains(&key) {
                return Err(syn::Error::new(
                    name.span(),
                    format!("`{what}` names `{key}` twice"),
                ));
            }
            named.push(key.clone());
            expanded = expanded
                .into_iter()
                .flat_map(|partial| {
                    values.iter().map({
                        let key = key.clone();
                        move |&(v, _)| {
                            let mut s = partial.clone();
                            s.push((key.clone(), v));
                            s
                        }
                    })
                })
                .collect();
        }
        Ok(expanded)
    };
    let mut skips = Vec::new();
    for (span, pairs) in skip_entries {
        skips.extend(expand(pairs, "skip")?.into_iter().map(|skip| (span, skip)));
    }
    let mut register_caps = Vec::new();
    for (n, pairs) in cap_entries {
        register_caps.extend(expand(pairs, "max_registers")?.into_iter().map(|p| (n, p)));
    }
    let skips: Vec<Vec<(String, i64)>> = {
        let probe = KernelAst {
            name: sig.ident.clone(),
            consts: consts.clone(),
            num_warps: num_warps.clone(),
            num_stages: num_stages.clone(),
            skips: skips.iter().map(|(_, s)| s.clone()).collect(),
            register_caps: Vec::new(),
            types: Vec::new(),
            bound_types: Vec::new(),
            helpers: Vec::new(),
            params: Vec::new(),
            body: (*item.block).clone(),
            crate_path: None,
            cluster: cluster.clone(),
        };
        if probe.specializations().is_empty() {
            let span = skips.last().map_or(sig.ident.span(), |(s, _)| *s);
            return Err(syn::Error::new(
                span,
                "`skip(..)` leaves no combination of the listed values to compile",
            ));
        }
        probe.skips
    };

    let mut params = Vec::new();
    for arg in &sig.inputs {
        let FnArg::Typed(pt) = arg else {
            return Err(syn::Error::new(arg.span(), "kernels take no `self`"));
        };
        let Pat::Ident(pi) = &*pt.pat else {
            return Err(syn::Error::new(
                pt.pat.span(),
                "parameters are plain names (`x: Ptr<f32>`)",
            ));
        };
        let name = pi.ident.to_string();
        let (mut kind, generic) = param_kind(&pt.ty, &types)?;
        let mut specialize = true;
        for attr in &pt.attrs {
            if attr.path().is_ident("do_not_specialize") {
                attr.meta.require_path_only()?;
                if !matches!(kind, ParamKind::Scalar(dt) | ParamKind::ScalarMultipleOf(dt, _) if dt.is_int())
                {
                    return Err(syn::Error::new(
                        attr.span(),
                        "`#[do_not_specialize]` applies to integer scalars",
                    ));
                }
                specialize = false;
            } else if attr.path().is_ident("multiple_of") {
                let lit: syn::LitInt = attr.parse_args()?;
                let d: u32 = lit.base10_parse()?;
                match kind {
                    ParamKind::Scalar(dt) if dt.is_int() && d > 0 => {
                        kind = ParamKind::ScalarMultipleOf(dt, d)
                    }
                    _ => {
                        return Err(syn::Error::new(
                            attr.span(),
                            "`#[multiple_of(d)]` applies to integer scalars, with d > 0",
                        ))
                    }
                }
            } else {
                return Err(syn::Error::new(
                    attr.span(),
                    "unknown parameter attribute (only `#[multiple_of(d)]` and `#[do_not_specialize]`)",
                ));
            }
        }
        if !specialize && matches!(kind, ParamKind::ScalarMultipleOf(..)) {
            return Err(syn::Error::new(
                pi.ident.span(),
                "`#[do_not_specialize]` and `#[multiple_of(d)]` contradict each other: the divisibility is declared",
            ));
        }
        if params.iter().any(|p: &ParamDecl| p.name == name)
            || consts.iter().any(|c| c.name == name)
        {
            return Err(syn::Error::new(
                pi.ident.span(),
                format!("`{name}` is declared twice"),
            ));
        }
        params.push(ParamDecl {
            name,
            kind,
            span: pi.ident.span(),
            generic,
            specialize,
        });
    }

    Ok(KernelAst {
        name: sig.ident.clone(),
        consts,
        types,
        bound_types: Vec::new(),
        helpers: Vec::new(),
        num_warps,
        num_stages,
        skips,
        register_caps,
        params,
        body: (*item.block).clone(),
        crate_path,
        cluster,
    })
}

/// The kind of a parameter, and the type parameter naming its dtype if any (its kind
/// then holds `f32` until the kernel's types are bound).
fn param_kind(ty: &Type, types: &[TypeDecl]) -> syn::Result<(ParamKind, Option<String>)> {
    let generic = |name: &str| types.iter().any(|t| t.name == name);
    let err = || {
        syn::Error::new(
            ty.span(),
            "parameters are `Ptr<T>` (T in f32, f16, bf16, i32, u32, i64, u8) or scalars (i32, u32, i64, f32)",
        )
    };
    let Type::Path(tp) = ty else {
        return Err(err());
    };
    let seg = tp.path.segments.last().ok_or_else(err)?;
    let name = seg.ident.to_string();
    if name == "Ptr" {
        let syn::PathArguments::AngleBracketed(args) = &seg.arguments else {
            return Err(err());
        };
        let Some(syn::GenericArgument::Type(Type::Path(inner))) = args.args.first() else {
            return Err(err());
        };
        let inner_name = inner
            .path
            .segments
            .last()
            .map(|s| s.ident.to_string())
            .unwrap_or_default();
        if generic(&inner_name) {
            return Ok((ParamKind::Ptr(DType::F32), Some(inner_name)));
        }
        return match DType::from_name(&inner_name) {
            Some(d) if d != DType::Bool => Ok((ParamKind::Ptr(d), None)),
            _ => Err(err()),
        };
    }
    if generic(&name) {
        return Ok((ParamKind::Scalar(DType::F32), Some(name)));
    }
    match DType::from_name(&name) {
        Some(d @ (DType::I32 | DType::U32 | DType::I64 | DType::F32)) => {
            Ok((ParamKind::Scalar(d), None))
        }
        _ => Err(err()),
    }
}
