//! `dot4(a, b, acc)`: the four byte products of each 32-bit element pair added to an
//! `i32` accumulator, for every signedness pair (`i32`: signed bytes, `u32`: unsigned),
//! with broadcasting and wrapping, on the interpreter and on the GPU, against a host
//! reference that takes the bytes apart; the PTX one `dp4a` per element, assembled by
//! `ptxas`.

use super::{on_each_backend, Backend, Data, Rng};
use crate::back::ptx::{compile, Target};
use crate::interp::Scalar;
use crate::ir::Kernel;

const BLOCK: usize = 256;

/// Every signedness pair, a scalar accumulator broadcast over a tile, a literal operand
/// and a tile of words reduced the way a quantized GEMV reduces them.
const SRC: &str = "
#[kernel(B = [256], num_warps = [4])]
fn dot4s<const B: usize>(
    xi: Ptr<i32>,
    yi: Ptr<i32>,
    xu: Ptr<u32>,
    yu: Ptr<u32>,
    acc: Ptr<i32>,
    ss: Ptr<i32>,
    su: Ptr<i32>,
    us: Ptr<i32>,
    uu: Ptr<i32>,
    lit: Ptr<i32>,
    row: Ptr<i32>,
    c: i32,
    n: i32,
) {
    let offs = program_id(0) * B + arange(0, B);
    let ok = offs < n;
    let a = load(xi + offs, ok, 0);
    let b = load(yi + offs, ok, 0);
    let ua = load(xu + offs, ok, 0);
    let ub = load(yu + offs, ok, 0);
    let s = load(acc + offs, ok, 0);
    store(ss + offs, dot4(a, b, s), ok);
    store(su + offs, dot4(a, ub, s), ok);
    store(us + offs, dot4(ua, b, c), ok);
    store(uu + offs, dot4(ua, ub, s), ok);
    // Byte sums: a literal word of four ones, a literal accumulator.
    store(lit + offs, dot4(a, 0x0101_0101, 0), ok);
    // Masked lanes load zeros, so the whole tile reduces to the valid elements.
    store(row + program_id(0), dot4(ua, b, 0).sum(0));
}
";

fn kernel() -> Kernel {
    super::block_kernel(SRC, BLOCK)
}

/// The host's `dot4`: bytes taken apart by shifts, widened by their signedness.
fn host_dot4(a: u32, a_signed: bool, b: u32, b_signed: bool, acc: i32) -> i32 {
    let byte = |w: u32, j: u32, signed: bool| -> i32 {
        let v = (w >> (8 * j)) & 0xFF;
        if signed && v >= 128 {
            v as i32 - 256
        } else {
            v as i32
        }
    };
    (0..4).fold(acc, |s, j| {
        s.wrapping_add(byte(a, j, a_signed) * byte(b, j, b_signed))
    })
}

/// Words that matter to a byte dot product (extreme bytes in every position), then
/// seeded random ones.
fn words(n: usize, rng: &mut Rng) -> Vec<u32> {
    let special = [
        0x8080_8080,
        0x7F7F_7F7F,
        0xFFFF_FFFF,
        0x0000_0000,
        0x0180_7FFF,
        0x8000_0001,
    ];
    let mut v: Vec<u32> = special.to_vec();
    v.extend((special.len()..n).map(|_| rng.next_u64() as u32));
    v.truncate(n);
    v
}

#[test]
fn dot4_multiplies_bytes_by_signedness() {
    let k = kernel();
    on_each_backend("dot4_multiplies_bytes_by_signedness", |be: &Backend| {
        let mut rng = Rng(44);
        for n in [1000usize, 256, 7] {
            let x = words(n, &mut rng);
            let y = words(n, &mut rng);
            // Accumulators near the ends of i32, so that the sums wrap.
            let mut acc: Vec<i32> = (0..n).map(|_| rng.next_u64() as i32).collect();
            acc[0] = i32::MAX;
            acc[1] = i32::MIN;
            let c = -123_456;
            let programs = n.div_ceil(BLOCK);
            let poison = 0x5EED_0001;
            let out = || Data::I32(vec![poison; n + 1]);
            let data = [
                Data::I32(x.iter().map(|&w| w as i32).collect()),
                Data::I32(y.iter().map(|&w| w as i32).collect()),
                Data::U32(x.clone()),
                Data::U32(y.clone()),
                Data::I32(acc.clone()),
                out(),
                out(),
                out(),
                out(),
                out(),
                Data::I32(vec![poison; programs]),
                Data::S(Scalar::I32(c)),
                Data::S(Scalar::I32(n as i32)),
            ];
            let got = be.run(&k, [programs as u32, 1, 1], &data);
            let ints = |d: &Data| -> Vec<i32> {
                match d {
                    Data::I32(v) => v.clone(),
                    other => panic!("unexpected {other:?}"),
                }
            };
            let cases: [(usize, &str, bool, bool, bool); 4] = [
                (5, "i32 x i32", true, true, false),
                (6, "i32 x u32", true, false, false),
                (7, "u32 x i32, scalar acc", false, true, true),
                (8, "u32 x u32", false, false, false),
            ];
            for (arg, what, sa, sb, scalar_acc) in cases {
                let out = ints(&got[arg]);
                for j in 0..n {
                    let s = if scalar_acc { c } else { acc[j] };
                    let want = host_dot4(x[j], sa, y[j], sb, s);
                    assert_eq!(
                        out[j], want,
                        "{be}: {what}, n={n}, element {j}: {:#x} . {:#x} + {s}",
                        x[j], y[j]
                    );
                }
                assert_eq!(out[n], poison, "{be}: {what} wrote past n={n}");
            }
            let lit = ints(&got[9]);
            for j in 0..n {
                let want = host_dot4(x[j], true, 0x0101_0101, true, 0);
                assert_eq!(lit[j], want, "{be}: byte sum, n={n}, element {j}");
            }
            let rows = ints(&got[10]);
            for (p, &r) in rows.iter().enumerate() {
                let want = (p * BLOCK..((p + 1) * BLOCK).min(n)).fold(0i32, |s, j| {
                    s.wrapping_add(host_dot4(x[j], false, y[j], true, 0))
                });
                assert_eq!(r, want, "{be}: program {p}'s sum, n={n}");
            }
        }
    });
}

#[test]
fn dot4_is_a_dp4a_in_ptx() {
    let k = kernel();
    for t in [Target::Sm80, Target::Sm90] {
        let p = compile(&k, t).unwrap_or_else(|e| panic!("{}: {e}", t.name()));
        crate::back::ptx::tests::assemble(&p, t);
        for form in [
            "dp4a.s32.s32",
            "dp4a.s32.u32",
            "dp4a.u32.s32",
            "dp4a.u32.u32",
        ] {
            assert!(p.ptx.contains(form), "{}: no {form}:\n{}", t.name(), p.ptx);
        }
    }
}
