//! `x.bitcast::<T>()`: the bits of every element kept exactly (NaN payloads, infinities,
//! negative zero, subnormals), on the interpreter and on the GPU, against `f32::from_bits`
//! and friends on the host; the PTX a `mov` at most, assembled by `ptxas`.

use half::{bf16, f16};

use super::{on_each_backend, Backend, Data, Rng};
use crate::back::ptx::{compile, Target};
use crate::interp::Scalar;
use crate::ir::Kernel;

const BLOCK: usize = 256;

/// Every bitcast the language has, and the exponent trick built on one.
const SRC: &str = "
#[kernel(B = [256], num_warps = [4])]
fn bitcasts<const B: usize>(
    xu: Ptr<u32>,
    xf: Ptr<f32>,
    xh: Ptr<f16>,
    xb: Ptr<bf16>,
    f: Ptr<f32>,
    g: Ptr<f32>,
    i: Ptr<i32>,
    u: Ptr<u32>,
    b: Ptr<bf16>,
    h: Ptr<f16>,
    e: Ptr<f32>,
    sc: Ptr<f32>,
    s: i32,
    n: i32,
) {
    let offs = program_id(0) * B + arange(0, B);
    let ok = offs < n;
    let bits = load(xu + offs, ok, 0);
    let x = load(xf + offs, ok, 0.0);
    store(f + offs, bits.bitcast::<f32>(), ok);
    store(g + offs, bits.bitcast::<i32>().bitcast::<f32>(), ok);
    store(i + offs, x.bitcast::<i32>(), ok);
    // The sign flipped on the bits, then back through f32.
    store(u + offs, (x.bitcast::<u32>() ^ 0x8000_0000).bitcast::<f32>().bitcast::<u32>(), ok);
    store(b + offs, load(xh + offs, ok, 0.0).bitcast::<bf16>(), ok);
    store(h + offs, load(xb + offs, ok, 0.0).bitcast::<f16>(), ok);
    // q as f32 for 0 <= q < 2^23, without a conversion.
    let q = bits & 0x7F_FFFF;
    store(e + offs, (q | 0x4B00_0000).bitcast::<f32>() - 8388608.0, ok);
    store(sc + program_id(0), s.bitcast::<f32>());
}
";

fn kernel() -> Kernel {
    super::block_kernel(SRC, BLOCK)
}

/// 32-bit patterns that matter to a bitcast, then seeded random ones.
fn patterns32(n: usize, rng: &mut Rng) -> Vec<u32> {
    let special = [
        0x7F80_0000, // +inf
        0xFF80_0000, // -inf
        0x8000_0000, // -0
        0x0000_0000,
        0x7FC0_0001, // quiet NaN with a payload
        0x7F80_0001, // signaling NaN
        0xFFFF_FFFF, // negative NaN, every payload bit
        0x0000_0001, // smallest subnormal
        0x807F_FFFF, // largest negative subnormal
        0x7F7F_FFFF, // largest finite
        0x4B00_0000,
        0x007F_FFFF,
    ];
    let mut v: Vec<u32> = special.to_vec();
    v.extend((special.len()..n).map(|_| rng.next_u64() as u32));
    v.truncate(n);
    v
}

/// 16-bit patterns (`f16` or `bf16`, by the exponent mask `exp`) that matter to a
/// bitcast, then seeded random ones: signaling and quiet NaNs with payloads, infinities,
/// negative zero, subnormals.
fn patterns16(n: usize, rng: &mut Rng, exp: u16) -> Vec<u16> {
    let special = [
        exp,
        exp | 0x8000,
        0x8000,
        0,
        exp | 1,
        0xFFFF,
        1,
        0x8001,
        0x7F9B,
    ];
    let mut v: Vec<u16> = special.to_vec();
    v.extend((special.len()..n).map(|_| rng.next_u64() as u16));
    v.truncate(n);
    v
}

#[test]
fn bitcast_keeps_every_bit() {
    let k = kernel();
    on_each_backend("bitcast_keeps_every_bit", |be: &Backend| {
        let mut rng = Rng(27);
        for n in [1000usize, 256, 7] {
            let bits = patterns32(n, &mut rng);
            let xs = patterns32(n, &mut rng);
            let hs = patterns16(n, &mut rng, 0x7C00);
            let bs = patterns16(n, &mut rng, 0x7F80);
            let s = rng.next_u64() as u32 | 0x7F80_0000; // a NaN or infinity
            let programs = n.div_ceil(BLOCK);
            // One poisoned element past the end of each output shows masked lanes write
            // nothing.
            let poison_f = f32::from_bits(0x7FBA_DBAD);
            let data = [
                Data::U32(bits.clone()),
                Data::F32(xs.iter().map(|&x| f32::from_bits(x)).collect()),
                Data::F16(hs.iter().map(|&x| f16::from_bits(x)).collect()),
                Data::Bf16(bs.iter().map(|&x| bf16::from_bits(x)).collect()),
                Data::F32(vec![poison_f; n + 1]),
                Data::F32(vec![poison_f; n + 1]),
                Data::I32(vec![-7; n + 1]),
                Data::U32(vec![7; n + 1]),
                Data::Bf16(vec![bf16::from_bits(0x7F99); n + 1]),
                Data::F16(vec![f16::from_bits(0x7E99); n + 1]),
                Data::F32(vec![poison_f; n + 1]),
                Data::F32(vec![poison_f; programs]),
                Data::S(Scalar::I32(s as i32)),
                Data::S(Scalar::I32(n as i32)),
            ];
            let got = be.run(&k, [programs as u32, 1, 1], &data);
            let f32_bits = |d: &Data| -> Vec<u32> {
                match d {
                    Data::F32(v) => v.iter().map(|x| x.to_bits()).collect(),
                    Data::I32(v) => v.iter().map(|&x| x as u32).collect(),
                    Data::U32(v) => v.clone(),
                    Data::F16(v) => v.iter().map(|x| x.to_bits() as u32).collect(),
                    Data::Bf16(v) => v.iter().map(|x| x.to_bits() as u32).collect(),
                    other => panic!("unexpected {other:?}"),
                }
            };
            let flip: Vec<u32> = xs.iter().map(|x| x ^ 0x8000_0000).collect();
            let trick: Vec<u32> = bits
                .iter()
                .map(|b| ((b & 0x7F_FFFF) as f32).to_bits())
                .collect();
            let want: [(usize, &str, Vec<u32>, u32); 7] = [
                (4, "u32 -> f32", bits.clone(), poison_f.to_bits()),
                (5, "u32 -> i32 -> f32", bits.clone(), poison_f.to_bits()),
                (6, "f32 -> i32", xs.clone(), -7i32 as u32),
                (7, "f32 -> u32 ^ sign -> f32 -> u32", flip, 7),
                (
                    8,
                    "f16 -> bf16",
                    hs.iter().map(|&x| x as u32).collect(),
                    0x7F99,
                ),
                (
                    9,
                    "bf16 -> f16",
                    bs.iter().map(|&x| x as u32).collect(),
                    0x7E99,
                ),
                (10, "exponent trick", trick, poison_f.to_bits()),
            ];
            for (arg, what, want, poison) in want {
                let out = f32_bits(&got[arg]);
                for j in 0..n {
                    assert_eq!(
                        out[j], want[j],
                        "{be}: {what}, n={n}, element {j}: {:#x} for {:#x}",
                        out[j], want[j]
                    );
                }
                assert_eq!(out[n], poison, "{be}: {what} wrote past n={n}");
            }
            let sc = f32_bits(&got[11]);
            assert!(
                sc.iter().all(|&x| x == s),
                "{be}: scalar i32 -> f32: {sc:x?}"
            );
        }
    });
}

#[test]
fn bitcast_is_a_mov_in_ptx() {
    let k = kernel();
    for t in [Target::Sm80, Target::Sm90] {
        let p = compile(&k, t).unwrap_or_else(|e| panic!("{}: {e}", t.name()));
        crate::back::ptx::tests::assemble(&p, t);
        assert!(p.ptx.contains("mov.b32"), "{}:\n{}", t.name(), p.ptx);
        // No conversion anywhere: every bitcast is a mov or the register itself, and the
        // exponent trick needs none.
        assert!(
            !p.ptx.contains("cvt.rn.f32"),
            "{}: a conversion in a kernel of bitcasts:\n{}",
            t.name(),
            p.ptx
        );
    }
}
