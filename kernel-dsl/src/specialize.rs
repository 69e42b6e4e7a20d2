//! Divisibility specialization: the build-time form of Triton's "divisible by 16" key.
//!
//! Triton compiles a kernel again for each new combination of integer arguments that are
//! (or are not) multiples of 16, because that fact decides whether row strides keep
//! 16-byte accesses aligned. Kernels here are compiled at build time, so `#[kernel]`
//! asks, per specialization of the constants: would assuming the integer parameters that
//! declare no divisibility (no `#[multiple_of(d)]`, no `#[do_not_specialize]`) to be
//! multiples of 16 make any global access wider? If so it compiles that *divisible
//! form* too, assuming as few parameters as give the same widths, and the launch picks
//! it whenever those arguments are multiples of 16 (`runtime::Variant::divisible_form`).
//! Kernels whose accesses do not depend on such a parameter get no second form, so the
//! cost (one more compile for the test, a few for the smallest set) is paid only where
//! it buys vector accesses.

use crate::back::ptx::{self, Target};
use crate::front::KernelAst;
use crate::ir::ParamKind;
use crate::Specialization;

/// The divisor a divisible form assumes (Triton's: 16 elements).
pub const DIVISOR: u32 = 16;

/// The parameters a divisible form may assume divisible: integer scalars with no
/// declared `#[multiple_of(d)]` and no `#[do_not_specialize]`, by position.
pub fn candidates(ast: &KernelAst) -> Vec<usize> {
    ast.params
        .iter()
        .enumerate()
        .filter(|(_, p)| p.specialize && matches!(p.kind, ParamKind::Scalar(d) if d.is_int()))
        .map(|(i, _)| i)
        .collect()
}

/// `ast` with the parameters at `params` declared `#[multiple_of(16)]`.
pub fn assume_divisible(ast: &KernelAst, params: &[usize]) -> KernelAst {
    let mut out = ast.clone();
    for &i in params {
        if let ParamKind::Scalar(d) = out.params[i].kind {
            out.params[i].kind = ParamKind::ScalarMultipleOf(d, DIVISOR);
        }
    }
    out
}

/// Elements per instruction of each global access (program order) of `ast` compiled for
/// `spec` on sm_90; `None` if it does not compile.
fn access_widths(ast: &KernelAst, spec: &Specialization) -> Option<Vec<usize>> {
    let kernel = crate::compile(ast, spec).ok()?;
    let ptx = ptx::compile(&kernel, Target::Sm90).ok()?;
    Some(ptx.accesses.iter().map(|a| a.width).collect())
}

/// Whether accesses of widths `a` move more elements per instruction than `b`: wider
/// somewhere and narrower nowhere.
fn wider(a: &[usize], b: &[usize]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x >= y) && a != b
}

/// The smallest set of [`candidates`] whose divisibility by 16 widens global accesses of
/// `spec` as much as all of them together do, by position; `None` when no assumption
/// widens any access (no divisible form is worth compiling).
///
/// The set is found by dropping candidates one at a time while the widths stay those
/// of the full assumption, so a kernel with a stride `k` and a position `pos` gets a
/// form that assumes `k` only and runs whatever `pos` is.
pub fn divisible_params(ast: &KernelAst, spec: &Specialization) -> Option<Vec<usize>> {
    if candidates(ast).is_empty() {
        return None;
    }
    divisible_params_over(ast, spec, &access_widths(ast, spec)?)
}

/// [`divisible_params`] given the widths of the plain form's global accesses on sm_90
/// (`PtxKernel::accesses`, in program order), for a caller that compiled it already
/// (`#[kernel]`), so the plain form is not compiled twice.
pub fn divisible_params_over(
    ast: &KernelAst,
    spec: &Specialization,
    base: &[usize],
) -> Option<Vec<usize>> {
    let all = candidates(ast);
    if all.is_empty() {
        return None;
    }
    let full = access_widths(&assume_divisible(ast, &all), spec)?;
    if !wider(&full, base) {
        return None;
    }
    let mut set = all.clone();
    for p in all {
        let trial: Vec<usize> = set.iter().copied().filter(|&q| q != p).collect();
        if access_widths(&assume_divisible(ast, &trial), spec).as_deref() == Some(&full[..]) {
            set = trial;
        }
    }
    Some(set)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ast(src: &str) -> KernelAst {
        crate::parse_source(src).unwrap()
    }

    fn spec(ast: &KernelAst) -> Specialization {
        ast.specializations().remove(0)
    }

    /// Triton's tutorial row copy: the stride `n` decides whether each row's 16-byte
    /// pieces are aligned; `rows` only bounds the rows (it never touches alignment).
    const ROW_COPY: &str = r#"
        #[kernel(BLOCK = [256], num_warps = [4])]
        fn row_copy<const BLOCK: usize>(x: Ptr<bf16>, y: Ptr<bf16>, rows: i32, n: i32) {
            let r = program_id(0) * 4 + arange(0, 4);
            let c = arange(0, BLOCK);
            let offs = r.expand_dims(1) * n + c.expand_dims(0);
            let mask = (r < rows).expand_dims(1);
            store(y + offs, load(x + offs, mask, 0.0), mask);
        }
    "#;

    #[test]
    fn the_stride_alone_is_assumed_and_the_accesses_widen() {
        let a = ast(ROW_COPY);
        let s = spec(&a);
        assert_eq!(candidates(&a), vec![2, 3]);
        assert_eq!(divisible_params(&a, &s), Some(vec![3]));
        let plain = access_widths(&a, &s).unwrap();
        let divisible = access_widths(&assume_divisible(&a, &[3]), &s).unwrap();
        // 16-byte accesses (8 bf16) only where the stride is known divisible.
        assert!(plain.iter().all(|&w| w < 8), "{plain:?}");
        assert!(divisible.iter().all(|&w| w == 8), "{divisible:?}");
    }

    #[test]
    fn no_form_where_nothing_widens() {
        // Contiguous over the whole tile already: `n` only bounds the mask by a
        // multiple of the tile's run, and the accesses are as wide without it.
        let a = ast(r#"
            #[kernel(BLOCK = [256], num_warps = [4])]
            fn scale<const BLOCK: usize>(x: Ptr<f32>, y: Ptr<f32>, n: i32) {
                let offs = program_id(0) * BLOCK + arange(0, BLOCK);
                store(y + offs, load(x + offs) * 2.0);
            }
        "#);
        assert_eq!(candidates(&a), vec![2]);
        assert_eq!(divisible_params(&a, &spec(&a)), None);
    }

    #[test]
    fn declared_and_opted_out_parameters_are_not_candidates() {
        let a = ast(r#"
            #[kernel(BLOCK = [64], num_warps = [4])]
            fn row_copy<const BLOCK: usize>(
                x: Ptr<bf16>,
                y: Ptr<bf16>,
                #[do_not_specialize] rows: i32,
                #[multiple_of(16)] n: i32,
                scale: f32,
            ) {
                let r = program_id(0) * 4 + arange(0, 4);
                let c = arange(0, BLOCK);
                let offs = r.expand_dims(1) * n + c.expand_dims(0);
                let mask = (r < rows).expand_dims(1);
                store(y + offs, load(x + offs, mask, 0.0) * scale, mask);
            }
        "#);
        assert!(candidates(&a).is_empty());
        assert_eq!(divisible_params(&a, &spec(&a)), None);
    }

    #[test]
    fn opting_out_a_stride_keeps_its_accesses_scalar() {
        let src = ROW_COPY.replace("n: i32)", "#[do_not_specialize] n: i32)");
        let a = ast(&src);
        assert_eq!(candidates(&a), vec![2]);
        assert_eq!(divisible_params(&a, &spec(&a)), None);
    }

    #[test]
    fn misplaced_opt_outs_are_errors_at_the_parameter() {
        let err = |params: &str| {
            let src = format!("#[kernel] fn k({params}) {{ store(x, 1.0); }}");
            crate::parse_source(&src).unwrap_err().to_string()
        };
        assert!(err("x: Ptr<f32>, #[do_not_specialize] s: f32").contains("integer scalars"));
        assert!(err("#[do_not_specialize] x: Ptr<f32>").contains("integer scalars"));
        assert!(
            err("x: Ptr<f32>, #[do_not_specialize(1)] n: i32").contains("expected"),
            "{}",
            err("x: Ptr<f32>, #[do_not_specialize(1)] n: i32")
        );
        for params in [
            "x: Ptr<f32>, #[do_not_specialize] #[multiple_of(16)] n: i32",
            "x: Ptr<f32>, #[multiple_of(16)] #[do_not_specialize] n: i32",
        ] {
            assert!(
                err(params).contains("contradict"),
                "{params}: {}",
                err(params)
            );
        }
    }

    /// Triton's tutorial matmul as a new user writes it, without `#[multiple_of(16)]`:
    /// the divisible form assumes the strides `n` and `k` (not `m`, which only bounds
    /// rows), and with them both operands go through the `cp.async` ring 16 bytes a copy.
    #[test]
    fn the_tutorial_matmul_gets_its_strides_assumed() {
        let a = ast(r#"
            #[kernel(BM = [64], BN = [64], BK = [32], num_warps = [4], num_stages = [3])]
            fn matmul<const BM: usize, const BN: usize, const BK: usize>(
                a: Ptr<bf16>, b: Ptr<bf16>, c: Ptr<bf16>, m: i32, n: i32, k: i32,
            ) {
                let rm = program_id(0) * BM + arange(0, BM);
                let rn = program_id(1) * BN + arange(0, BN);
                let rk = arange(0, BK);
                let mut pa = a + rm.expand_dims(1) * k + rk.expand_dims(0);
                let mut pb = b + rk.expand_dims(1) * n + rn.expand_dims(0);
                let mut acc = zeros::<f32>([BM, BN]);
                for k0 in (0..k).step_by(BK) {
                    let kk = (rk < k - k0);
                    let x = load(pa, (rm < m).expand_dims(1) & kk.expand_dims(0), 0.0);
                    let y = load(pb, kk.expand_dims(1) & (rn < n).expand_dims(0), 0.0);
                    acc = dot(x, y, acc);
                    pa += BK;
                    pb += BK * n;
                }
                let mask = (rm < m).expand_dims(1) & (rn < n).expand_dims(0);
                store(c + rm.expand_dims(1) * n + rn.expand_dims(0), acc as bf16, mask);
            }
        "#);
        let s = spec(&a);
        assert_eq!(divisible_params(&a, &s), Some(vec![4, 5]));
        let plain = access_widths(&a, &s).unwrap();
        let divisible = access_widths(&assume_divisible(&a, &[4, 5]), &s).unwrap();
        // Two `cp.async` copies (8 bf16 each) and the store of the accumulator (moved
        // out of the MMA layout to store 8 bf16 a vector).
        assert_eq!(plain, [1, 1, 1]);
        assert_eq!(divisible, [8, 8, 8]);
    }
}
