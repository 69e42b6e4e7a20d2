//! `#[kernel]`: compiles a tile function to PTX at build time.
//!
//! A thin shell over `tilefuse-dsl`: this crate parses the attribute and the function,
//! runs the compiler for every listed specialization, turns compile errors into
//! `compile_error!`s at the user's spans, and generates the typed launch API
//! (see `docs/design.md`, "The launch contract").

use proc_macro::TokenStream;
use proc_macro2::{Span, TokenStream as TokenStream2};
use quote::{format_ident, quote};
use syn::ItemFn;

use tilefuse_dsl::back::ptx::{self, Target};
use tilefuse_dsl::front::KernelAst;
use tilefuse_dsl::ir::{DType, ParamKind};

/// Compiles a tile function to PTX at build time and generates its launch API.
///
/// ```ignore
/// #[kernel(BLOCK = [256, 1024], num_warps = [4])]
/// fn add<const BLOCK: usize>(x: Ptr<f32>, y: Ptr<f32>, out: Ptr<f32>, n: i32) {
///     let offs = program_id(0) * BLOCK + arange(0, BLOCK);
///     let mask = offs < n;
///     store(out + offs, load(x + offs, mask, 0.0) + load(y + offs, mask, 0.0), mask);
/// }
/// // add::<256>::launch(&dev, grid, &x, &y, &mut out, n)?;
/// ```
///
/// See the language guide (`docs/language.md`) for the ops and their semantics.
#[proc_macro_attribute]
pub fn kernel(attr: TokenStream, item: TokenStream) -> TokenStream {
    let attr: TokenStream2 = attr.into();
    let item = match syn::parse::<ItemFn>(item) {
        Ok(item) => item,
        Err(e) => return e.to_compile_error().into(),
    };
    let ast = match tilefuse_dsl::front::parse_kernel(attr.clone(), &item) {
        Ok(ast) => ast,
        Err(e) => return e.to_compile_error().into(),
    };
    let calls = tilefuse_dsl::front::helper_calls(&item.block);
    if calls.is_empty() {
        return expand(attr, item, ast, Vec::new()).into();
    }
    // The body calls helpers: gather their source through their macros (see `tile_fn`).
    let chain = chain_path(ast.crate_path.is_some());
    let state = quote! { kernel { (#attr) } { #item } };
    let fallbacks = unknown_helper_fallbacks(&ast.name, &calls);
    let chain = start_chain(&chain, state, calls);
    quote!(#fallbacks #chain).into()
}

/// For each helper a kernel calls by a plain name, a glob-imported `macro_rules!` of
/// that name whose expansion is the unknown-op error: a real `#[tile_fn]` in scope (an
/// explicit name) shadows the glob, so only a call of a function that is no helper
/// reaches it, and the user reads the language's error instead of "cannot find macro".
fn unknown_helper_fallbacks(kernel: &syn::Ident, calls: &[syn::Path]) -> TokenStream2 {
    let plain: Vec<&syn::Ident> = calls
        .iter()
        .filter(|p| p.leading_colon.is_none() && p.segments.len() == 1)
        .map(|p| &p.segments[0].ident)
        .collect();
    if plain.is_empty() {
        return quote!();
    }
    let module = format_ident!("__tilefuse_unknown_ops_of_{}", kernel);
    let defs = plain.iter().map(|name| {
        let msg = format!(
            "{} (no `#[tile_fn]` helper named `{name}` is in scope: bring it in with `use`, or call it by its path)",
            tilefuse_dsl::front::lower::unknown_op_message(&name.to_string())
        );
        // The error's span is the call's: `compile_error!` reports where it is written.
        let error = quote::quote_spanned!(name.span()=> ::core::compile_error! { #msg });
        quote! {
            macro_rules! #name {
                ($($t:tt)*) => { #error };
            }
            pub(crate) use #name;
        }
    });
    quote! {
        #[doc(hidden)]
        #[allow(non_snake_case, unused_macros, unused_imports)]
        mod #module {
            #(#defs)*
        }
        #[allow(unused_imports)]
        use #module::*;
    }
}

/// Marks a helper function that kernels (and other helpers) may call: a plain function
/// over tiles and scalars, inlined where it is called. It may take const generics
/// (`f::<BLOCK>(x)`) and element types (`f::<T>(x)`, needed where its body names `T`),
/// return a value (its tail expression) or nothing (a helper that stores), and live in
/// another module of the crate: bring it into scope with `use`, or call it by path.
///
/// ```ignore
/// #[tile_fn]
/// pub fn silu(x: Tile<f32>) -> Tile<f32> {
///     x * sigmoid(x)
/// }
///
/// #[kernel(BLOCK = [1024])]
/// fn act<const BLOCK: usize>(x: Ptr<f32>, out: Ptr<f32>, n: i32) {
///     let offs = program_id(0) * BLOCK + arange(0, BLOCK);
///     store(out + offs, silu(load(x + offs, offs < n, 0.0)), offs < n);
/// }
/// ```
///
/// The helper becomes a hidden `macro_rules!` of the same name that hands its source
/// (and that of the helpers it calls) to the kernels that call it; it is not a Rust
/// function the host can call. It is shared within its crate (`pub` acts as
/// `pub(crate)`). `crate = path` works as in `#[kernel]`, for crates that use
/// `tilefuse-dsl` and `tilefuse-macros` directly.
#[proc_macro_attribute]
pub fn tile_fn(attr: TokenStream, item: TokenStream) -> TokenStream {
    let attr: TokenStream2 = attr.into();
    let item = match syn::parse::<ItemFn>(item) {
        Ok(item) => item,
        Err(e) => return e.to_compile_error().into(),
    };
    let direct = match tile_fn_crate(attr.clone()) {
        Ok(d) => d,
        Err(e) => return e.to_compile_error().into(),
    };
    if let Err(e) = tilefuse_dsl::front::parse_tile_fn(&item) {
        return e.to_compile_error().into();
    }
    let mut calls = tilefuse_dsl::front::helper_calls(&item.block);
    calls.retain(|p| p.segments.last().is_none_or(|s| s.ident != item.sig.ident));
    if calls.is_empty() {
        return helper_macro(&item, &[]).into();
    }
    let chain = chain_path(direct);
    let state = quote! { tile_fn { (#attr) } { #item } };
    let fallbacks = unknown_helper_fallbacks(&item.sig.ident, &calls);
    let chain = start_chain(&chain, state, calls);
    quote!(#fallbacks #chain).into()
}

/// Whether `#[tile_fn(..)]` names `crate = path` (the only argument it takes).
fn tile_fn_crate(attr: TokenStream2) -> syn::Result<bool> {
    if attr.is_empty() {
        return Ok(false);
    }
    let parsed: syn::MetaNameValue = syn::parse2(attr)?;
    if !parsed.path.is_ident("crate") {
        return Err(syn::Error::new_spanned(
            parsed.path,
            "`#[tile_fn]` takes only `crate = path`",
        ));
    }
    Ok(true)
}

/// The path of [`__tile_chain`]: through the `tilefuse` facade, or straight from this
/// crate where the attribute names `crate = path` (crates that use `tilefuse-dsl` and
/// `tilefuse-macros` directly).
fn chain_path(direct: bool) -> TokenStream2 {
    if direct {
        quote!(::tilefuse_macros::__tile_chain)
    } else {
        quote!(::tilefuse::__tile_chain)
    }
}

/// Calls the first helper's macro with the chain's state; the rest are pending.
fn start_chain(chain: &TokenStream2, state: TokenStream2, calls: Vec<syn::Path>) -> TokenStream2 {
    let mut calls = calls.into_iter();
    let first = calls.next().expect("a chain starts with a helper");
    let rest: Vec<syn::Path> = calls.collect();
    quote! { #first! { [#chain] [#chain] #state pending { #(#rest;)* } } }
}

/// The `macro_rules!` a helper becomes: called with `[callback] state..`, it calls
/// `callback! { state.. { <its source and its helpers'> } }`.
fn helper_macro(item: &ItemFn, gathered: &[ItemFn]) -> TokenStream2 {
    let name = &item.sig.ident;
    let mut bare = item.clone();
    bare.attrs.clear();
    let mut sources = vec![quote!(#bare)];
    for g in gathered {
        if g.sig.ident != item.sig.ident {
            sources.push(quote!(#g));
        }
    }
    // Re-exported by path so that kernels anywhere in the crate can name it; `pub`
    // becomes `pub(crate)` (a `macro_rules!` leaves its crate only through
    // `#[macro_export]`, which a macro-generated macro cannot use by path).
    let vis = match &item.vis {
        syn::Visibility::Public(_) => quote!(pub(crate)),
        other => quote!(#other),
    };
    quote! {
        #[doc(hidden)]
        #[allow(unused_macros)]
        macro_rules! #name {
            ([$($cb:tt)*] $($state:tt)*) => { $($cb)*! { $($state)* { #(#sources)* } } };
        }
        #[doc(hidden)]
        #[allow(unused_imports)]
        #vis use #name;
    }
}

/// One step of gathering helper sources (generated by `#[kernel]` and `#[tile_fn]`, not
/// for direct use): `[self] kernel|tile_fn { (attr) } { item } pending { paths; }
/// { sources }..`. Calls the next pending helper's macro, or, when none is left,
/// expands the kernel (or defines the helper's macro) with every gathered source.
#[doc(hidden)]
#[proc_macro]
pub fn __tile_chain(input: TokenStream) -> TokenStream {
    match chain_step(input.into()) {
        Ok(t) => t.into(),
        Err(e) => e.to_compile_error().into(),
    }
}

fn chain_step(input: TokenStream2) -> syn::Result<TokenStream2> {
    use proc_macro2::TokenTree;
    let mut it = input.into_iter().peekable();
    let bad =
        |what: &str| syn::Error::new(Span::call_site(), format!("malformed helper chain: {what}"));
    let Some(TokenTree::Group(chain)) = it.next() else {
        return Err(bad("callback"));
    };
    let chain = chain.stream();
    let Some(TokenTree::Ident(target)) = it.next() else {
        return Err(bad("target"));
    };
    let Some(TokenTree::Group(attr)) = it.next() else {
        return Err(bad("attribute"));
    };
    let attr = match attr.stream().into_iter().next() {
        Some(TokenTree::Group(g)) => g.stream(),
        _ => TokenStream2::new(),
    };
    let Some(TokenTree::Group(item)) = it.next() else {
        return Err(bad("item"));
    };
    let item: ItemFn = syn::parse2(item.stream())?;
    let _pending_kw = it.next();
    let Some(TokenTree::Group(pending)) = it.next() else {
        return Err(bad("pending"));
    };
    let mut gathered: Vec<ItemFn> = Vec::new();
    for tt in it {
        let TokenTree::Group(g) = tt else {
            return Err(bad("sources"));
        };
        let file: syn::File = syn::parse2(g.stream())?;
        for i in file.items {
            let syn::Item::Fn(f) = i else {
                return Err(bad("a source that is not a fn"));
            };
            gathered.push(f);
        }
    }
    let pending: Vec<syn::Path> = syn::parse::Parser::parse2(
        syn::punctuated::Punctuated::<syn::Path, syn::Token![;]>::parse_terminated,
        pending.stream(),
    )?
    .into_iter()
    .collect();
    let state_item = &item;
    if let Some((next, rest)) = pending.split_first() {
        return Ok(quote! {
            #next! { [#chain] [#chain] #target { (#attr) } { #state_item } pending { #(#rest;)* }
                #({ #gathered })* }
        });
    }
    if target == "kernel" {
        let ast = tilefuse_dsl::front::parse_kernel(attr.clone(), &item)?;
        return Ok(expand(attr, item, ast, gathered));
    }
    Ok(helper_macro(&item, &gathered))
}

fn expand(
    attr: TokenStream2,
    item: ItemFn,
    ast: KernelAst,
    helper_items: Vec<ItemFn>,
) -> TokenStream2 {
    // Helpers are found by name: one body per name (the same helper may arrive through
    // several others).
    let mut helper_fns: Vec<ItemFn> = Vec::new();
    for h in helper_items {
        let mut h = h;
        h.attrs.clear();
        if !helper_fns
            .iter()
            .any(|g| quote!(#g).to_string() == quote!(#h).to_string())
        {
            helper_fns.push(h);
        }
    }
    let helper_syn: Vec<syn::Item> = helper_fns.iter().cloned().map(syn::Item::Fn).collect();
    let helpers = match tilefuse_dsl::front::helpers::parse_tile_fns(&helper_syn) {
        Ok(h) => h,
        Err(e) => return e.to_compile_error(),
    };
    let krate = ast
        .crate_path
        .as_ref()
        .map(|p| quote!(#p))
        .unwrap_or_else(|| quote!(::tilefuse::dsl));

    let vis = &item.vis;
    let name = &ast.name;
    let name_str = name.to_string();
    let docs: Vec<&syn::Attribute> = item
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("doc"))
        .collect();
    let mut bare = item.clone();
    bare.attrs.retain(|a| !a.path().is_ident("doc"));

    let combos = ast.type_combinations();
    let generic = !ast.types.is_empty();
    let mut out = Vec::new();
    let mut errors: Vec<syn::Error> = Vec::new();
    for combo in &combos {
        let mut bound = ast.bind_types(combo);
        bound.helpers = helpers.clone();
        // The text the interpreter re-parses at run time (without doc comments): the
        // kernel, its dtypes, then its helpers.
        let binding = combo.iter().map(|(n, d)| {
            let n = format_ident!("{}", n);
            let d = format_ident!("{}", d.name());
            quote!(#n = #d)
        });
        let binding = if generic {
            quote!(#[bind_types(#(#binding),*)])
        } else {
            quote!()
        };
        let source = quote!(#[kernel(#attr)] #binding #bare #(#helper_fns)*).to_string();
        let def_name = if generic {
            let suffix: Vec<String> = combo.iter().map(|(_, d)| d.name().to_uppercase()).collect();
            format_ident!("{}_{}", name_str.to_uppercase(), suffix.join("_"))
        } else {
            format_ident!("{}", name_str.to_uppercase())
        };
        let types: Vec<DType> = combo.iter().map(|(_, d)| *d).collect();
        let bad_scalar = bound.params.iter().find(|p| {
            p.generic.is_some()
                && matches!(p.kind, ParamKind::Scalar(d) | ParamKind::ScalarMultipleOf(d, _)
                    if !matches!(d, DType::I32 | DType::U32 | DType::I64 | DType::F32))
        });
        if let Some(p) = bad_scalar {
            let d = match p.kind {
                ParamKind::Scalar(d) | ParamKind::ScalarMultipleOf(d, _) => d,
                ParamKind::Ptr(d) => d,
            };
            errors.push(syn::Error::new(
                p.span,
                format!(
                    "scalar parameter `{}` would be {d}, but scalars are i32, u32, i64 or f32: take it as f32 and convert with `as`",
                    p.name
                ),
            ));
            continue;
        }
        out.push(expand_one(
            &bound,
            &krate,
            vis,
            &def_name,
            &source,
            &types,
            &mut errors,
        ));
    }

    let const_idents: Vec<syn::Ident> = ast
        .consts
        .iter()
        .map(|c| format_ident!("{}", c.name))
        .collect();
    let type_idents: Vec<syn::Ident> = ast
        .types
        .iter()
        .map(|t| format_ident!("{}", t.name))
        .collect();
    let struct_generics = if const_idents.is_empty() && type_idents.is_empty() {
        quote!()
    } else {
        quote!(<#(#type_idents,)* #(const #const_idents: usize),*>)
    };
    let struct_body = if type_idents.is_empty() {
        quote!(;)
    } else {
        quote!((::core::marker::PhantomData<(#(#type_idents,)*)>);)
    };
    let struct_doc = if generic {
        format!(
            "The tilefuse kernel `{name_str}`: call `launch` on a compiled specialization (`{name_str}::<dtype, ..>`); `{}_<DTYPE>` describes each dtype's variants.",
            name_str.to_uppercase()
        )
    } else {
        format!(
            "The tilefuse kernel `{name_str}`: call `launch` on a compiled specialization; `{}` describes every variant.",
            name_str.to_uppercase()
        )
    };
    let errors = errors.iter().map(|e| e.to_compile_error());
    quote! {
        #(#docs)*
        #[doc = #struct_doc]
        #[allow(non_camel_case_types)]
        #vis struct #name #struct_generics #struct_body

        #(#out)*
        #(#errors)*
    }
}

/// The kernel description, launches and picks of one binding of a kernel's dtypes (the
/// only one for a kernel without type parameters).
fn expand_one(
    ast: &KernelAst,
    krate: &TokenStream2,
    vis: &syn::Visibility,
    def_name: &syn::Ident,
    source: &str,
    types: &[DType],
    errors: &mut Vec<syn::Error>,
) -> TokenStream2 {
    let mut push_error = |span: Span, msg: String| {
        if !errors.iter().any(|e| e.to_string() == msg) {
            errors.push(syn::Error::new(span, msg));
        }
    };
    // A parameter is written if any variant writes it (a constant may select the
    // branch that stores).
    let mut written: Vec<usize> = Vec::new();
    let mut variants = Vec::new();
    let specs = ast.specializations();
    for spec in &specs {
        let Some((generic, widths)) =
            compile_variant(krate, ast, spec, 0, &mut written, &mut push_error)
        else {
            continue;
        };
        // The divisible form (Triton's divisibility key at build time), where assuming
        // integer parameters multiples of 16 widens accesses.
        let divisible = tilefuse_dsl::specialize::divisible_params_over(ast, spec, &widths);
        let form = divisible.and_then(|params| {
            let assumed = tilefuse_dsl::specialize::assume_divisible(ast, &params);
            let mask = params.iter().fold(0u64, |m, &i| m | (1u64 << i));
            compile_variant(krate, &assumed, spec, mask, &mut written, &mut push_error)
                .map(|(form, _)| form)
        });
        let form = match form {
            Some(f) => quote! {
                ::core::option::Option::Some(&#krate::runtime::Variant {
                    #f
                    divisible_form: ::core::option::Option::None,
                })
            },
            None => quote!(::core::option::Option::None),
        };
        variants.push(quote! {
            #krate::runtime::Variant {
                #generic
                divisible_form: #form,
            }
        });
    }

    let name = &ast.name;
    let name_str = name.to_string();
    let const_names: Vec<&String> = ast.consts.iter().map(|c| &c.name).collect();
    let type_args: Vec<TokenStream2> = types.iter().map(|d| rust_type(krate, *d)).collect();

    let params = ast.params.iter().enumerate().map(|(i, p)| {
        let pname = &p.name;
        let kind = param_kind_tokens(krate, p.kind);
        let w = written.contains(&i);
        quote! { #krate::runtime::ParamDef { name: #pname, kind: #kind, written: #w } }
    });

    // Typed arguments of `launch`.
    let mut arg_decls = Vec::new();
    let mut arg_exprs = Vec::new();
    for (i, p) in ast.params.iter().enumerate() {
        let ident = format_ident!("{}", p.name);
        match p.kind {
            ParamKind::Ptr(d) => {
                let t = rust_type(krate, d);
                if written.contains(&i) {
                    arg_decls.push(quote!(#ident: &mut #krate::runtime::Buffer<#t>));
                    arg_exprs.push(quote!(#krate::runtime::KernelArg::write(#ident)));
                } else {
                    arg_decls.push(quote!(#ident: &#krate::runtime::Buffer<#t>));
                    arg_exprs.push(quote!(#krate::runtime::KernelArg::read(#ident)));
                }
            }
            ParamKind::Scalar(d) | ParamKind::ScalarMultipleOf(d, _) => {
                let t = rust_type(krate, d);
                arg_decls.push(quote!(#ident: #t));
                arg_exprs.push(quote!(#krate::runtime::KernelArg::from(#ident)));
            }
        }
    }

    // One `launch` per distinct tuple of constants.
    let mut seen: Vec<Vec<i64>> = Vec::new();
    let mut impls = Vec::new();
    for spec in &specs {
        let consts: Vec<i64> = spec.consts.iter().map(|(_, v)| *v).collect();
        if seen.contains(&consts) {
            continue;
        }
        seen.push(consts.clone());
        let generics = if consts.is_empty() && type_args.is_empty() {
            quote!()
        } else {
            let lits = consts.iter().map(|v| {
                let v = *v as usize;
                quote!(#v)
            });
            quote!(<#(#type_args,)* #(#lits),*>)
        };
        let same_consts: Vec<&tilefuse_dsl::Specialization> = specs
            .iter()
            .filter(|s| s.consts.iter().map(|(_, v)| *v).collect::<Vec<_>>() == consts)
            .collect();
        let mut warps: Vec<u32> = same_consts.iter().map(|s| s.num_warps).collect();
        warps.dedup();
        let mut stages: Vec<u32> = same_consts.iter().filter_map(|s| s.num_stages).collect();
        stages.sort_unstable();
        stages.dedup();
        let stages_doc = if ast.num_stages.len() > 1 {
            format!("; num_stages: {stages:?}, chosen by `cfg`")
        } else {
            String::new()
        };
        let doc = format!(
            "Launches `{name_str}` with {} on `dev` (compiled num_warps: {warps:?}; the first is the default{stages_doc}).",
            if consts.is_empty() {
                "no constants".to_string()
            } else {
                spec.consts
                    .iter()
                    .map(|(n, v)| format!("{n} = {v}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            }
        );
        impls.push(quote! {
            impl #name #generics {
                #[doc = #doc]
                #[allow(clippy::too_many_arguments)]
                #vis fn launch(
                    dev: &#krate::runtime::Device,
                    cfg: impl ::core::convert::Into<#krate::runtime::LaunchConfig>,
                    #(#arg_decls),*
                ) -> ::core::result::Result<(), #krate::runtime::LaunchError> {
                    #def_name.launch_dyn(dev, cfg, &[#(#consts),*], &mut [#(#arg_exprs),*])
                }
            }
        });
    }

    // Run-time choice of the constants, typed (kernels without type parameters: a
    // dtype-generic kernel's launch types differ per dtype).
    if types.is_empty() && !ast.consts.is_empty() {
        let sentinel = ast.consts.iter().map(|_| quote!({ usize::MAX }));
        let n = ast.consts.len();
        let picks = ast.consts.iter().map(|c| {
            let f = format_ident!("pick_{}", c.name.to_lowercase());
            let cname = &c.name;
            let doc = format!(
                "The smallest compiled `{cname}` that is at least `n` (Triton's `{cname} = triton.next_power_of_2(n)`, among the compiled values); the error lists them. Launch with `launch_at`."
            );
            quote! {
                #[doc = #doc]
                #vis fn #f(n: usize) -> ::core::result::Result<usize, #krate::runtime::LaunchError> {
                    #def_name.pick_at_least(#cname, n as i64).map(|v| v as usize)
                }
            }
        });
        let launch_doc = format!(
            "Launches `{name_str}` with its constants ({}) chosen at run time (e.g. by the `pick_*` functions), typed like every `launch`; an uncompiled combination is an error that lists the compiled ones.",
            const_names.iter().map(|c| c.as_str()).collect::<Vec<_>>().join(", ")
        );
        impls.push(quote! {
            /// Run-time choice of the compile-time constants.
            impl #name<#(#sentinel),*> {
                #(#picks)*

                #[doc = #launch_doc]
                #[allow(clippy::too_many_arguments)]
                #vis fn launch_at(
                    dev: &#krate::runtime::Device,
                    cfg: impl ::core::convert::Into<#krate::runtime::LaunchConfig>,
                    consts: [usize; #n],
                    #(#arg_decls),*
                ) -> ::core::result::Result<(), #krate::runtime::LaunchError> {
                    let consts = consts.map(|c| c as i64);
                    #def_name.launch_dyn(dev, cfg, &consts, &mut [#(#arg_exprs),*])
                }
            }
        });
    }

    let def_doc = format!(
        "Description of the kernel `{name_str}`: its signature, source and compiled variants (PTX)."
    );
    // Named argument and constant structs (`<Name>Args`, `<Name>Consts`) for kernels
    // without dtype parameters; a dtype-generic kernel launches through its typed
    // `launch` per dtype.
    let typed = if types.is_empty() {
        typed_items(krate, vis, ast, &written, def_name)
    } else {
        quote!()
    };
    quote! {
        #[doc = #def_doc]
        #vis static #def_name: #krate::runtime::KernelDef = #krate::runtime::KernelDef {
            name: #name_str,
            source: #source,
            const_names: &[#(#const_names),*],
            params: &[#(#params),*],
            variants: &[#(#variants),*],
        };

        #(#impls)*
        #typed
    }
}

/// The fields of one compiled `Variant` of `ast` for `spec`, all but `divisible_form`
/// (`assumes_divisible`: the parameters `ast` was made to assume multiples of 16), and
/// the widths of its global accesses on sm_90 (what the divisible form is judged
/// against); `None` after pushing the compile error.
fn compile_variant(
    krate: &TokenStream2,
    ast: &KernelAst,
    spec: &tilefuse_dsl::Specialization,
    assumes_divisible: u64,
    written: &mut Vec<usize>,
    push_error: &mut impl FnMut(Span, String),
) -> Option<(TokenStream2, Vec<usize>)> {
    let (result, spans) = tilefuse_dsl::compile_with_spans(ast, spec);
    let kernel = match result {
        Ok(k) => k,
        Err(e) => {
            push_error(spans.span(e.loc), e.message);
            return None;
        }
    };
    // With several `num_stages` values, a back-end error (a ring that overflows shared
    // memory) names the depth it came from and how to leave that variant out.
    let back_error = |message: String| {
        if ast.num_stages.len() <= 1 {
            return message;
        }
        let at: Vec<String> = spec
            .consts
            .iter()
            .map(|(n, v)| format!("{n} = {v}"))
            .chain([format!("num_warps = {}", spec.num_warps)])
            .collect();
        format!(
            "{message} (with num_stages = {stages}: leave it out with `skip({}, num_stages = {stages})`)",
            at.join(", "),
            stages = kernel.num_stages,
        )
    };
    for p in kernel.written_params() {
        if !written.contains(&p) {
            written.push(p);
        }
    }
    let mut ptx_text = Vec::new();
    let mut entry = String::new();
    let mut shared = 0u32;
    let mut widths = Vec::new();
    // sm_90 first: a variant whose shared memory only Hopper provides (a deep ring of
    // large tiles) gets no sm_80 PTX, like a clustered one; launching either on an
    // older GPU is a clear run-time error.
    let mut hopper_only = kernel.cluster_size() > 1;
    let mut by_target = [String::new(), String::new()];
    let mut errors: [Option<tilefuse_dsl::CompileError>; 2] = [None, None];
    for (slot, target) in [(1, Target::Sm90), (0, Target::Sm80)] {
        if target == Target::Sm80 && hopper_only {
            continue;
        }
        match ptx::compile(&kernel, target) {
            Ok(p) => {
                if target == Target::Sm90 {
                    widths = p.accesses.iter().map(|a| a.width).collect();
                    hopper_only |= !ptx::has_sm80_module(&kernel, &p);
                }
                entry = p.entry;
                shared = shared.max(p.shared_bytes);
                by_target[slot] = p.ptx;
            }
            Err(e) => errors[slot] = Some(e),
        }
    }
    // Reported in target order, sm_80 first.
    for e in errors.into_iter().flatten() {
        push_error(spans.span(e.loc), back_error(e.message));
    }
    ptx_text.extend(by_target);
    // sm_90a PTX only where a `dot` takes the `wgmma` path (other kernels gain
    // nothing from it); the runtime picks it on compute capability 9.0.
    let mut sm90a_text = String::new();
    let mut tma_maps = Vec::new();
    if kernel.has_dot() {
        match ptx::compile(&kernel, Target::Sm90a) {
            Ok(p) if p.uses_wgmma => {
                shared = shared.max(p.shared_bytes);
                sm90a_text = p.ptx;
                tma_maps = p.tma_maps;
            }
            Ok(_) => {}
            Err(e) => push_error(spans.span(e.loc), back_error(e.message)),
        }
    }
    let consts: Vec<i64> = spec.consts.iter().map(|(_, v)| *v).collect();
    let (sm80, sm90, sm90a) = (
        embedded_ptx(krate, &ptx_text[0]),
        embedded_ptx(krate, &ptx_text[1]),
        embedded_ptx(krate, &sm90a_text),
    );
    let tma_maps: Vec<TokenStream2> = tma_maps.iter().map(|m| tma_map_tokens(krate, m)).collect();
    let num_warps = spec.num_warps;
    let num_stages = kernel.num_stages;
    let [cx, cy, cz] = kernel.cluster;
    let fields = quote! {
        consts: &[#(#consts),*],
        num_warps: #num_warps,
        num_stages: #num_stages,
        ptx_sm80: #sm80,
        ptx_sm90: #sm90,
        ptx_sm90a: #sm90a,
        entry: #entry,
        shared_bytes: #shared,
        cluster: [#cx, #cy, #cz],
        assumes_divisible: #assumes_divisible,
        tma_maps: &[#(#tma_maps),*],
    };
    Some((fields, widths))
}

/// `foo_bar` → `FooBar`.
fn camel_case(name: &str) -> String {
    name.split('_')
        .filter(|w| !w.is_empty())
        .map(|w| {
            let mut c = w.chars();
            c.next()
                .map(|f| f.to_uppercase().chain(c).collect::<String>())
                .unwrap_or_default()
        })
        .collect()
}

/// An identifier for `name`, raw where `name` is a keyword (a constant `TYPE` gives the
/// field `r#type`).
fn field_ident(name: &str) -> syn::Ident {
    if syn::parse_str::<syn::Ident>(name).is_ok() {
        format_ident!("{}", name)
    } else {
        syn::Ident::new_raw(name, Span::call_site())
    }
}

/// The typed-launch items of a kernel `foo`: `FooConsts` (its compile-time constants by
/// name, a `KernelConsts`) and `FooArgs` (its run-time arguments by name) with a
/// `launch` that takes the constants as a run-time value (see docs/design.md, "The
/// launch contract").
fn typed_items(
    krate: &TokenStream2,
    vis: &syn::Visibility,
    ast: &tilefuse_dsl::front::KernelAst,
    written: &[usize],
    def_name: &syn::Ident,
) -> TokenStream2 {
    let name_str = ast.name.to_string();
    let camel = camel_case(&name_str);
    let consts_name = format_ident!("{}Consts", camel);
    let args_name = format_ident!("{}Args", camel);

    let fields: Vec<syn::Ident> = ast
        .consts
        .iter()
        .map(|c| field_ident(&c.name.to_lowercase()))
        .collect();
    let field_docs = ast
        .consts
        .iter()
        .map(|c| format!("`{}` (compiled: {:?}).", c.name, c.values));
    let indices = 0..fields.len();
    let count = fields.len();
    let consts_doc = format!(
        "The compile-time constants of `{name_str}` by name, chosen at run time: pass them to \
         [`{args_name}::launch`]; a variant must have been compiled for them."
    );
    let consts_item = quote! {
        #[doc = #consts_doc]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
        #vis struct #consts_name {
            #(#[doc = #field_docs] pub #fields: usize,)*
        }

        impl #krate::runtime::KernelConsts for #consts_name {
            fn def() -> &'static #krate::runtime::KernelDef {
                &#def_name
            }
            fn values(&self) -> ::std::vec::Vec<i64> {
                ::std::vec![#(self.#fields as i64),*]
            }
            fn from_values(values: &[i64]) -> ::core::option::Option<Self> {
                if values.len() != #count {
                    return ::core::option::Option::None;
                }
                ::core::option::Option::Some(#consts_name {
                    #(#fields: usize::try_from(values[#indices]).ok()?,)*
                })
            }
        }
    };

    let has_ptr = ast
        .params
        .iter()
        .any(|p| matches!(p.kind, ParamKind::Ptr(_)));
    let lt = if has_ptr { quote!(<'a>) } else { quote!() };
    let mut arg_fields = Vec::new();
    let mut arg_idents = Vec::new();
    let mut arg_exprs = Vec::new();
    for (i, p) in ast.params.iter().enumerate() {
        let ident = field_ident(&p.name);
        match p.kind {
            ParamKind::Ptr(d) => {
                let t = rust_type(krate, d);
                if written.contains(&i) {
                    let doc = format!("`{}`, written.", p.name);
                    arg_fields.push(
                        quote!(#[doc = #doc] pub #ident: &'a mut #krate::runtime::Buffer<#t>),
                    );
                    arg_exprs.push(quote!(#krate::runtime::KernelArg::write(#ident)));
                } else {
                    let doc = format!("`{}`, read.", p.name);
                    arg_fields
                        .push(quote!(#[doc = #doc] pub #ident: &'a #krate::runtime::Buffer<#t>));
                    arg_exprs.push(quote!(#krate::runtime::KernelArg::read(#ident)));
                }
            }
            ParamKind::Scalar(d) | ParamKind::ScalarMultipleOf(d, _) => {
                let t = rust_type(krate, d);
                let doc = format!("`{}`.", p.name);
                arg_fields.push(quote!(#[doc = #doc] pub #ident: #t));
                arg_exprs.push(quote!(#krate::runtime::KernelArg::from(#ident)));
            }
        }
        arg_idents.push(ident);
    }
    let args_doc = format!(
        "The run-time arguments of `{name_str}` by name (written buffers by `&mut`): \
         [`{args_name}::launch`] runs the variant that [`{consts_name}`] names."
    );
    let launch_doc = format!(
        "Launches `{name_str}` on `dev` with the variant compiled for `consts` (and \
         `cfg`'s `num_warps` and `num_stages`, else the first compiled for them); an \
         error names the compiled variants when there is none."
    );
    let values = fields.iter().map(|f| quote!(consts.#f as i64));
    quote! {
        #consts_item

        #[doc = #args_doc]
        #vis struct #args_name #lt {
            #(#arg_fields,)*
        }

        impl #lt #args_name #lt {
            #[doc = #launch_doc]
            #vis fn launch(
                self,
                dev: &#krate::runtime::Device,
                cfg: impl ::core::convert::Into<#krate::runtime::LaunchConfig>,
                consts: impl ::core::convert::Into<#consts_name>,
            ) -> ::core::result::Result<(), #krate::runtime::LaunchError> {
                let consts: #consts_name = consts.into();
                let #args_name { #(#arg_idents),* } = self;
                #def_name.launch_dyn(dev, cfg, &[#(#values),*], &mut [#(#arg_exprs),*])
            }
        }
    }
}

fn param_kind_tokens(krate: &TokenStream2, kind: ParamKind) -> TokenStream2 {
    match kind {
        ParamKind::Ptr(d) => {
            let d = dtype_tokens(krate, d);
            quote!(#krate::ir::ParamKind::Ptr(#d))
        }
        ParamKind::Scalar(d) => {
            let d = dtype_tokens(krate, d);
            quote!(#krate::ir::ParamKind::Scalar(#d))
        }
        ParamKind::ScalarMultipleOf(d, m) => {
            let d = dtype_tokens(krate, d);
            quote!(#krate::ir::ParamKind::ScalarMultipleOf(#d, #m))
        }
    }
}

fn tma_map_tokens(krate: &TokenStream2, m: &tilefuse_dsl::ir::TmaMap) -> TokenStream2 {
    let dim = |d: tilefuse_dsl::ir::ViewDim| match d {
        tilefuse_dsl::ir::ViewDim::Param(i) => quote!(#krate::ir::ViewDim::Param(#i)),
        tilefuse_dsl::ir::ViewDim::Const(c) => quote!(#krate::ir::ViewDim::Const(#c)),
    };
    let v = &m.view;
    let (ptr, dtype) = (v.ptr, dtype_tokens(krate, v.dtype));
    let (rows, cols, stride) = (dim(v.rows), dim(v.cols), dim(v.stride));
    let col_major = v.col_major;
    let dims = m.dims.iter().map(|d| {
        let (r, st, sz) = (d.rows, d.step, d.size);
        quote!(#krate::ir::TmaDim { rows: #r, step: #st, size: #sz })
    });
    let (rank, sw) = (m.rank, m.swizzle_bytes);
    quote! {
        #krate::ir::TmaMap {
            view: #krate::ir::MatrixView { ptr: #ptr, dtype: #dtype, rows: #rows, cols: #cols, stride: #stride, col_major: #col_major },
            rank: #rank,
            dims: [#(#dims),*],
            swizzle_bytes: #sw,
        }
    }
}

fn dtype_tokens(krate: &TokenStream2, d: DType) -> TokenStream2 {
    let v = format_ident!("{}", format!("{d:?}"));
    quote!(#krate::ir::DType::#v)
}

fn rust_type(krate: &TokenStream2, d: DType) -> TokenStream2 {
    match d {
        DType::F16 => quote!(#krate::half::f16),
        DType::BF16 => quote!(#krate::half::bf16),
        DType::Bool => quote!(bool),
        other => {
            let t = format_ident!("{}", other.name());
            quote!(#t)
        }
    }
}

/// The PTX text of one variant as the binary embeds it: deflated (PTX is most of a
/// binary's size), with a static of its own for the text once inflated at run time.
fn embedded_ptx(krate: &TokenStream2, text: &str) -> TokenStream2 {
    if text.is_empty() {
        return quote! { #krate::runtime::Ptx::text("") };
    }
    let deflated = tilefuse_dsl::runtime::deflate_ptx(text);
    // The run time reads bytes that do not inflate as an empty module: should these
    // not round-trip, the text goes in plain.
    if tilefuse_dsl::runtime::inflate_ptx(&deflated).as_deref() != Some(text) {
        return quote! { #krate::runtime::Ptx::text(#text) };
    }
    let bytes = proc_macro2::Literal::byte_string(&deflated);
    quote! {
        #krate::runtime::Ptx::deflated(#bytes, {
            static TEXT: ::std::sync::OnceLock<::std::string::String> =
                ::std::sync::OnceLock::new();
            &TEXT
        })
    }
}
