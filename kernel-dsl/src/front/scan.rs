//! Finding `#[kernel]` functions in Rust source text, without compiling the crate.
//!
//! Tools (`tilefuse inspect`, the repository-wide `ptxas` test) use this to compile the
//! kernels of a file the way `#[kernel]` would, with errors pointing at the file's lines.

use proc_macro2::{Span, TokenStream};
use syn::visit::Visit;

use super::{parse_kernel, KernelAst, SpanTable};
use crate::error::CompileError;
use crate::{ir, Specialization};

/// A `#[kernel]` function found in a source file.
#[derive(Clone, Debug)]
pub struct FoundKernel {
    /// The function's name.
    pub name: String,
    /// The line of its `fn` (1-based).
    pub line: usize,
    /// The parsed kernel.
    pub ast: KernelAst,
}

impl FoundKernel {
    /// Lowers and type-checks one specialization; errors carry the line and column in
    /// the file the kernel was found in.
    pub fn compile(&self, spec: &Specialization) -> Result<(ir::Kernel, SpanTable), CompileError> {
        let (result, spans) = crate::compile_with_spans(&self.ast, spec);
        match result {
            Ok(k) => Ok((k, spans)),
            Err(e) => {
                let mut located = located(spans.span(e.loc), &e.message);
                located.loc = e.loc;
                Err(located)
            }
        }
    }
}

fn located(span: Span, msg: &str) -> CompileError {
    let start = span.start();
    CompileError::new(
        ir::Loc::default(),
        format!("line {}, column {}: {msg}", start.line, start.column + 1),
    )
}

/// Every `#[kernel]` function in `src` (a whole Rust file), in source order, including
/// those inside inline modules and function bodies.
///
/// A file that does not parse, or a kernel whose attribute or signature is invalid, is an
/// error with its line and column.
pub fn find_kernels(src: &str) -> Result<Vec<FoundKernel>, CompileError> {
    find_kernels_with(src, &[])
}

/// The `#[tile_fn]` helpers defined in `src` (a whole Rust file), for
/// [`find_kernels_with`] to offer the kernels of the crate's other files.
pub fn tile_fns(src: &str) -> Result<Vec<syn::ItemFn>, CompileError> {
    let file = syn::parse_file(src).map_err(|e| located(e.span(), &e.to_string()))?;
    let mut finder = Finder::default();
    finder.visit_file(&file);
    Ok(finder.helpers)
}

/// [`find_kernels`], where the kernels may also call the helpers `elsewhere` (those of the
/// crate's other files, from [`tile_fns`]), as `#[kernel]` resolves a helper path
/// (`crate::kernels::merge(..)`) in another module. Helpers are found by name: the
/// file's own helper wins over one of the same name from elsewhere, and among those the
/// first listed wins.
pub fn find_kernels_with(
    src: &str,
    elsewhere: &[syn::ItemFn],
) -> Result<Vec<FoundKernel>, CompileError> {
    let file = syn::parse_file(src).map_err(|e| located(e.span(), &e.to_string()))?;
    let mut finder = Finder::default();
    finder.visit_file(&file);
    let own = super::helpers::parse_tile_fns(
        &finder
            .helpers
            .into_iter()
            .map(syn::Item::Fn)
            .collect::<Vec<_>>(),
    )
    .map_err(|e| located(e.span(), &e.to_string()))?;
    // Helpers from other files that parse on their own (their errors belong to their
    // files), under names this file does not define.
    let mut helpers = own;
    for f in elsewhere {
        if helpers.iter().any(|h| f.sig.ident == h.name) {
            continue;
        }
        if let Ok(mut parsed) = super::helpers::parse_tile_fns(&[syn::Item::Fn(f.clone())]) {
            helpers.append(&mut parsed);
        }
    }
    let mut out = Vec::new();
    for (attr, item) in finder.found {
        let mut ast = parse_kernel(attr, &item)
            .map_err(|e| located(e.span(), &format!("kernel `{}`: {e}", item.sig.ident)))?;
        ast.helpers = helpers.clone();
        let line = item.sig.fn_token.span.start().line;
        let combos = ast.type_combinations();
        for combo in combos {
            // A dtype-generic kernel is one kernel per dtype: `softmax<bf16>`.
            let name = if combo.is_empty() {
                item.sig.ident.to_string()
            } else {
                let dtypes: Vec<&str> = combo.iter().map(|(_, d)| d.name()).collect();
                format!("{}<{}>", item.sig.ident, dtypes.join(", "))
            };
            out.push(FoundKernel {
                name,
                line,
                ast: ast.bind_types(&combo),
            });
        }
    }
    Ok(out)
}

/// Whether an attribute is `#[kernel]` (also as a path, `#[tilefuse::kernel]`).
fn is_kernel_attr(a: &syn::Attribute) -> bool {
    a.path()
        .segments
        .last()
        .is_some_and(|s| s.ident == "kernel")
}

#[derive(Default)]
struct Finder {
    found: Vec<(TokenStream, syn::ItemFn)>,
    helpers: Vec<syn::ItemFn>,
}

impl<'ast> Visit<'ast> for Finder {
    fn visit_item_fn(&mut self, f: &'ast syn::ItemFn) {
        if f.attrs.iter().any(super::helpers::is_tile_fn_attr) {
            let mut item = f.clone();
            item.attrs.clear();
            self.helpers.push(item);
        }
        if let Some(a) = f.attrs.iter().find(|a| is_kernel_attr(a)) {
            let attr = match &a.meta {
                syn::Meta::List(l) => l.tokens.clone(),
                _ => TokenStream::new(),
            };
            // What the attribute macro receives: the item without its own attribute.
            let mut item = f.clone();
            item.attrs.retain(|a| !is_kernel_attr(a));
            self.found.push((attr, item));
        }
        syn::visit::visit_item_fn(self, f);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SRC: &str = r#"
use tilefuse::prelude::*;

/// Doubles.
#[kernel(BLOCK = [64, 128], num_warps = [1, 2])]
pub fn double<const BLOCK: usize>(x: Ptr<f32>, n: i32) {
    let offs = arange(0, BLOCK);
    store(x + offs, load(x + offs, offs < n, 0.0) * 2.0, offs < n);
}

fn not_a_kernel() {}

#[tile_fn]
fn twice(v: Tile<f32>) -> Tile<f32> {
    v * 2.0
}

#[kernel(T = [f32, bf16], num_warps = [1])]
fn generic<T>(x: Ptr<T>) {
    store(x, twice(load(x) as f32) as T);
}

mod inner {
    fn host() {
        #[tilefuse::kernel(num_warps = [4])]
        fn nested(x: Ptr<i32>) {
            store(x, 1);
        }
    }
}
"#;

    #[test]
    fn finds_kernels_in_modules_and_bodies() {
        let found = find_kernels(SRC).unwrap();
        let names: Vec<&str> = found.iter().map(|k| k.name.as_str()).collect();
        assert_eq!(names, ["double", "generic<f32>", "generic<bf16>", "nested"]);
        for k in &found[1..3] {
            let (ir, _) = k.compile(&k.ast.specializations()[0]).unwrap();
            assert_eq!(ir.name, "generic");
        }
        assert_eq!(found[0].line, 6);
        assert_eq!(found[0].ast.specializations().len(), 4);
        let spec = &found[0].ast.specializations()[0];
        let (k, _) = found[0].compile(spec).unwrap();
        assert_eq!(k.name, "double");
    }

    #[test]
    fn errors_carry_the_file_line() {
        let bad = SRC.replace("offs < n, 0.0", "offs < m, 0.0");
        let found = find_kernels(&bad).unwrap();
        let spec = &found[0].ast.specializations()[0];
        let err = found[0].compile(spec).unwrap_err();
        assert!(err.message.starts_with("line 8,"), "{}", err.message);
        assert!(err.message.contains('m'), "{}", err.message);
        let err = find_kernels("fn broken(").unwrap_err();
        assert!(err.message.starts_with("line 1,"), "{}", err.message);
    }
}

#[cfg(test)]
mod elsewhere_tests {
    use super::*;

    const HELPERS: &str = r#"
        #[tile_fn]
        pub fn twice(x: Tile<f32>) -> Tile<f32> {
            x * 2.0
        }
    "#;

    const KERNEL: &str = r#"
        #[kernel(num_warps = [4])]
        fn k(x: Ptr<f32>) {
            let offs = arange(0, 128);
            store(x + offs, crate::helpers::twice(load(x + offs)));
        }
    "#;

    fn spec() -> Specialization {
        Specialization {
            consts: vec![],
            num_warps: 4,
            num_stages: None,
        }
    }

    #[test]
    fn helpers_of_other_files_resolve_by_name() {
        let alone = find_kernels(KERNEL).unwrap();
        let err = alone[0].compile(&spec()).unwrap_err().message;
        assert!(err.contains("unknown op `twice`"), "{err}");
        let found = find_kernels_with(KERNEL, &tile_fns(HELPERS).unwrap()).unwrap();
        assert!(found[0].compile(&spec()).is_ok());
    }

    #[test]
    fn the_files_own_helper_wins() {
        let own = format!("{KERNEL}\n#[tile_fn] fn twice(x: Tile<f32>) -> Tile<f32> {{ x + x }}");
        let found = find_kernels_with(&own, &tile_fns(HELPERS).unwrap()).unwrap();
        let helpers = &found[0].ast.helpers;
        assert_eq!(helpers.len(), 1);
        assert!(found[0].compile(&spec()).is_ok());
        // A foreign helper that does not parse is left out, not an error of this file.
        let broken: syn::ItemFn = syn::parse_quote! { fn twice((a, b): (i32, i32)) -> i32 { a } };
        let found = find_kernels_with(KERNEL, &[broken]).unwrap();
        assert!(found[0].ast.helpers.is_empty());
    }
}
