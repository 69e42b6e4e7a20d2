//! `byte_perm(a, b, sel)`: four bytes picked out of `b:a` by the selector's 3-bit
//! nibbles, for `i32` and `u32` words, with broadcasting and the selector's other bits
//! ignored, on the interpreter and on the GPU, against a host reference that takes the
//! bytes apart; the 16-entry table lookup the non-linear 4-bit quants decode with; the
//! PTX one `prmt` per element, assembled by `ptxas`.

use super::{on_each_backend, Backend, Data, Rng};
use crate::back::ptx::{compile, Target};
use crate::interp::Scalar;
use crate::ir::Kernel;

const BLOCK: usize = 256;

/// Both word dtypes, a scalar selector broadcast over a tile, a literal word, and a
/// 16-entry byte table (four words) looked up at the four indices of each `idx` word.
const SRC: &str = "
#[kernel(B = [256], num_warps = [4])]
fn perms<const B: usize>(
    xu: Ptr<u32>,
    yu: Ptr<u32>,
    xi: Ptr<i32>,
    yi: Ptr<i32>,
    sel: Ptr<u32>,
    table: Ptr<i32>,
    uu: Ptr<u32>,
    ii: Ptr<i32>,
    us: Ptr<u32>,
    lit: Ptr<i32>,
    looked: Ptr<i32>,
    s: u32,
    n: i32,
) {
    let offs = program_id(0) * B + arange(0, B);
    let ok = offs < n;
    let a = load(xu + offs, ok, 0);
    let b = load(yu + offs, ok, 0);
    let ia = load(xi + offs, ok, 0);
    let ib = load(yi + offs, ok, 0);
    let c = load(sel + offs, ok, 0);
    store(uu + offs, byte_perm(a, b, c), ok);
    store(ii + offs, byte_perm(ia, ib, c), ok);
    store(us + offs, byte_perm(a, b, s), ok);
    store(lit + offs, byte_perm(0x7654_3210, ib, c.bitcast::<i32>()), ok);
    // Sixteen signed entries; each selector nibble's low 4 bits index them.
    let t = load(table + arange(0, 4));
    let t0 = select(arange(0, 4) == 0, t, 0).sum(0);
    let t1 = select(arange(0, 4) == 1, t, 0).sum(0);
    let t2 = select(arange(0, 4) == 2, t, 0).sum(0);
    let t3 = select(arange(0, 4) == 3, t, 0).sum(0);
    let low = byte_perm(t0, t1, c);
    let high = byte_perm(t2, t3, c);
    let pick = 0x3210 | ((c & 0x8888) >> 1);
    store(looked + offs, byte_perm(low, high, pick.bitcast::<i32>()), ok);
}
";

fn kernel() -> Kernel {
    super::block_kernel(SRC, BLOCK)
}

/// An output's expected word at each element.
type Want<'a> = dyn Fn(usize) -> u32 + 'a;

/// The host's `byte_perm` (CUDA's `__byte_perm`): bytes taken apart by shifts.
fn host_byte_perm(a: u32, b: u32, sel: u32) -> u32 {
    let bytes = [a.to_le_bytes(), b.to_le_bytes()].concat();
    let out: Vec<u8> = (0..4)
        .map(|n| bytes[((sel >> (4 * n)) & 7) as usize])
        .collect();
    u32::from_le_bytes([out[0], out[1], out[2], out[3]])
}

#[test]
fn host_byte_perm_follows_cudas_examples() {
    // `__byte_perm(x, y, 0x3210)` is `x`, `0x7654` is `y`, `0x0123` reverses `x`'s bytes.
    let (x, y) = (0x4433_2211, 0x8877_6655);
    assert_eq!(host_byte_perm(x, y, 0x3210), x);
    assert_eq!(host_byte_perm(x, y, 0x7654), y);
    assert_eq!(host_byte_perm(x, y, 0x0123), 0x1122_3344);
    assert_eq!(host_byte_perm(x, y, 0x5140), 0x6622_5511);
    // Bit 3 of each nibble and bits 16.. are ignored.
    assert_eq!(
        host_byte_perm(x, y, 0xFFFF_BA98),
        host_byte_perm(x, y, 0x3210)
    );
}

#[test]
fn byte_perm_picks_bytes_by_the_selector() {
    let k = kernel();
    on_each_backend("byte_perm_picks_bytes_by_the_selector", |be: &Backend| {
        let mut rng = Rng(0x5e1);
        // llama.cpp's IQ4_NL values: sixteen signed bytes.
        let values: [i8; 16] = [
            -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
        ];
        let table: Vec<i32> = values
            .chunks(4)
            .map(|c| i32::from_le_bytes([c[0] as u8, c[1] as u8, c[2] as u8, c[3] as u8]))
            .collect();
        for n in [1000usize, 256, 7] {
            let word = |rng: &mut Rng| rng.next_u64() as u32;
            let x: Vec<u32> = (0..n).map(|_| word(&mut rng)).collect();
            let y: Vec<u32> = (0..n).map(|_| word(&mut rng)).collect();
            // Random selectors, with bits past each nibble's index set as often.
            let mut sel: Vec<u32> = (0..n).map(|_| word(&mut rng)).collect();
            sel[0] = 0x3210;
            sel[1] = 0xFFFF_FFFF;
            let s = 0x0000_5140u32 | 0xFFFF_8888;
            let programs = n.div_ceil(BLOCK);
            let poison = 0x5EED_0001;
            let data = [
                Data::U32(x.clone()),
                Data::U32(y.clone()),
                Data::I32(x.iter().map(|&w| w as i32).collect()),
                Data::I32(y.iter().map(|&w| w as i32).collect()),
                Data::U32(sel.clone()),
                Data::I32(table.clone()),
                Data::U32(vec![poison; n + 1]),
                Data::I32(vec![poison as i32; n + 1]),
                Data::U32(vec![poison; n + 1]),
                Data::I32(vec![poison as i32; n + 1]),
                Data::I32(vec![poison as i32; n + 1]),
                Data::S(Scalar::U32(s)),
                Data::S(Scalar::I32(n as i32)),
            ];
            let got = be.run(&k, [programs as u32, 1, 1], &data);
            let words = |d: &Data| -> Vec<u32> {
                match d {
                    Data::U32(v) => v.clone(),
                    Data::I32(v) => v.iter().map(|&w| w as u32).collect(),
                    other => panic!("unexpected {other:?}"),
                }
            };
            let cases: [(usize, &str, &Want); 5] = [
                (6, "u32 words", &|j| host_byte_perm(x[j], y[j], sel[j])),
                (7, "i32 words", &|j| host_byte_perm(x[j], y[j], sel[j])),
                (8, "scalar selector", &|j| host_byte_perm(x[j], y[j], s)),
                (9, "literal word", &|j| {
                    host_byte_perm(0x7654_3210, y[j], sel[j])
                }),
                (10, "16-entry table", &|j| {
                    let v: Vec<u8> = (0..4)
                        .map(|i| values[((sel[j] >> (4 * i)) & 15) as usize] as u8)
                        .collect();
                    u32::from_le_bytes([v[0], v[1], v[2], v[3]])
                }),
            ];
            for (arg, what, want) in cases {
                let out = words(&got[arg]);
                for (j, &o) in out.iter().enumerate().take(n) {
                    assert_eq!(
                        o,
                        want(j),
                        "{be}: {what}, n={n}, element {j}: {:#x}:{:#x} by {:#x}",
                        y[j],
                        x[j],
                        sel[j]
                    );
                }
                assert_eq!(out[n], poison, "{be}: {what} wrote past n={n}");
            }
        }
    });
}

#[test]
fn byte_perm_is_a_prmt_in_ptx() {
    let k = kernel();
    for t in [Target::Sm80, Target::Sm90] {
        let p = compile(&k, t).unwrap_or_else(|e| panic!("{}: {e}", t.name()));
        crate::back::ptx::tests::assemble(&p, t);
        assert!(
            p.ptx.contains("prmt.b32"),
            "{}: no prmt:\n{}",
            t.name(),
            p.ptx
        );
    }
}
