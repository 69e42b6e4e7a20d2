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
    expand(attr, item).into()
}

fn expand(attr: TokenStream2, item: ItemFn) -> TokenStream2 {
    let ast = match tilefuse_dsl::front::parse_kernel(attr.clone(), &item) {
        Ok(ast) => ast,
        Err(e) => return e.to_compile_error(),
    };
    let krate = ast
        .crate_path
        .as_ref()
        .map(|p| quote!(#p))
        .unwrap_or_else(|| quote!(::tilefuse::dsl));

    // The fn text the interpreter re-parses at run time (without doc comments).
    let mut bare = item.clone();
    bare.attrs.retain(|a| !a.path().is_ident("doc"));
    let source = quote!(#[kernel(#attr)] #bare).to_string();

    let mut errors: Vec<syn::Error> = Vec::new();
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
        let (result, spans) = tilefuse_dsl::compile_with_spans(&ast, spec);
        let kernel = match result {
            Ok(k) => k,
            Err(e) => {
                push_error(spans.span(e.loc), e.message);
                continue;
            }
        };
        for p in kernel.written_params() {
            if !written.contains(&p) {
                written.push(p);
            }
        }
        let mut ptx_text = Vec::new();
        let mut entry = String::new();
        let mut shared = 0u32;
        for target in [Target::Sm80, Target::Sm90] {
            if target == Target::Sm80 && kernel.cluster_size() > 1 {
                // Thread-block clusters need sm_90: no sm_80 PTX (launching the variant
                // on an older GPU is a clear run-time error).
                ptx_text.push(String::new());
                continue;
            }
            match ptx::compile(&kernel, target) {
                Ok(p) => {
                    entry = p.entry;
                    shared = shared.max(p.shared_bytes);
                    ptx_text.push(p.ptx);
                }
                Err(e) => {
                    push_error(spans.span(e.loc), e.message);
                    ptx_text.push(String::new());
                }
            }
        }
        let consts: Vec<i64> = spec.consts.iter().map(|(_, v)| *v).collect();
        let (sm80, sm90) = (
            embedded_ptx(&krate, &ptx_text[0]),
            embedded_ptx(&krate, &ptx_text[1]),
        );
        let num_warps = spec.num_warps;
        let [cx, cy, cz] = kernel.cluster;
        variants.push(quote! {
            #krate::runtime::Variant {
                consts: &[#(#consts),*],
                num_warps: #num_warps,
                ptx_sm80: #sm80,
                ptx_sm90: #sm90,
                entry: #entry,
                shared_bytes: #shared,
                cluster: [#cx, #cy, #cz],
            }
        });
    }

    let vis = &item.vis;
    let name = &ast.name;
    let name_str = name.to_string();
    let def_name = format_ident!("{}", name_str.to_uppercase());
    let const_names: Vec<&String> = ast.consts.iter().map(|c| &c.name).collect();
    let const_idents: Vec<syn::Ident> = ast
        .consts
        .iter()
        .map(|c| format_ident!("{}", c.name))
        .collect();
    let docs: Vec<&syn::Attribute> = item
        .attrs
        .iter()
        .filter(|a| a.path().is_ident("doc"))
        .collect();

    let params = ast.params.iter().enumerate().map(|(i, p)| {
        let pname = &p.name;
        let kind = param_kind_tokens(&krate, p.kind);
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
                let t = rust_type(&krate, d);
                if written.contains(&i) {
                    arg_decls.push(quote!(#ident: &mut #krate::runtime::Buffer<#t>));
                    arg_exprs.push(quote!(#krate::runtime::KernelArg::write(#ident)));
                } else {
                    arg_decls.push(quote!(#ident: &#krate::runtime::Buffer<#t>));
                    arg_exprs.push(quote!(#krate::runtime::KernelArg::read(#ident)));
                }
            }
            ParamKind::Scalar(d) | ParamKind::ScalarMultipleOf(d, _) => {
                let t = rust_type(&krate, d);
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
        let generics = if consts.is_empty() {
            quote!()
        } else {
            let lits = consts.iter().map(|v| {
                let v = *v as usize;
                quote!(#v)
            });
            quote!(<#(#lits),*>)
        };
        let warps: Vec<u32> = specs
            .iter()
            .filter(|s| s.consts.iter().map(|(_, v)| *v).collect::<Vec<_>>() == consts)
            .map(|s| s.num_warps)
            .collect();
        let doc = format!(
            "Launches `{name_str}` with {} on `dev` (compiled num_warps: {warps:?}; the first is the default).",
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

    let struct_generics = if const_idents.is_empty() {
        quote!()
    } else {
        quote!(<#(const #const_idents: usize),*>)
    };
    let struct_doc = format!(
        "The tilefuse kernel `{name_str}`: call `launch` on a compiled specialization; `{def_name}` describes every variant."
    );
    let def_doc = format!(
        "Description of the kernel `{name_str}`: its signature, source and compiled variants (PTX)."
    );
    let typed = typed_items(&krate, vis, &ast, &written, &def_name);
    let errors = errors.iter().map(|e| e.to_compile_error());
    quote! {
        #(#docs)*
        #[doc = #struct_doc]
        #[allow(non_camel_case_types)]
        #vis struct #name #struct_generics;

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
        #(#errors)*
    }
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
         `cfg`'s `num_warps`, else the first compiled for them); an error names the \
         compiled variants when there is none."
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
