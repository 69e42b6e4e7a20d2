//! ggml's element and block types: sizes, host dequantization (the reference the
//! kernels are checked against) and the device layout the quantized GEMVs read.
//!
//! Supported for weights: Q8_0, Q4_K, Q5_K and Q6_K blocks, Q4_0 and Q5_0 blocks (in
//! Q4_K's nibble words, or read as Q8_0 in rows that are no multiple of 256 elements),
//! IQ4_NL blocks (read as Q8_0, below), Q4_1 and Q5_1 blocks (read as Q8_0 with offsets),
//! Q3_K blocks (by the Q6_K kernels), IQ4_XS blocks (by the Q4_K kernels, their indices
//! looked up with `byte_perm`), and F32, F16, BF16 elements. Block layouts, as llama.cpp
//! writes them (little-endian):
//!
//! - **Q8_0**, 32 elements in 34 bytes: `f16 d`, `i8 q[32]`; `x = d * q`.
//! - **Q4_0**, 32 elements in 18 bytes: `f16 d`, `u8 qs[16]`; byte `l` holds element
//!   `l` in its low nibble and `16 + l` in its high one; `x = d * (q - 8)`.
//! - **Q5_0**, 32 elements in 22 bytes: `f16 d`, `u32 qh` (bit `e` is element `e`'s
//!   fifth bit), `u8 qs[16]` (the low four bits, as Q4_0's); `x = d * (q - 16)`.
//! - **IQ4_NL**, 32 elements in 18 bytes, Q4_0's layout; `x = d * K[q]` for a fixed
//!   table `K` of 16 signed bytes ([`IQ4_NL_VALUES`]).
//! - **IQ4_XS**, 256 elements in 136 bytes: `f16 d`, `u16 scales_h`, `u8 scales_l[4]`,
//!   `u8 qs[128]`; block `j` (32 elements, `qs[16 j..16 j + 16]` in Q4_0's order) has
//!   the scale `ls` of four bits from `scales_l[j / 2]` (nibble `j % 2`) and two from
//!   `scales_h` (bits `2 j..`), and `x = d * (ls - 32) * K[q]`. The device layout
//!   ([`PackedMatrix::IQ4XS`], 138 bytes) moves the indices so that each half of a
//!   word is four `byte_perm` selectors ([`table_nibble_at`]).
//! - **Q4_1** (20 bytes) and **Q5_1** (24): Q4_0's and Q5_0's with an `f16 m` after `d`;
//!   `x = d * q + m`, `q` unsigned.
//! - **Q4_K**, 256 elements in 144 bytes: `f16 d`, `f16 dmin`, `u8 scales[12]` (eight
//!   6-bit scales and eight 6-bit mins, packed), `u8 qs[128]`. Sub-block `j` (32
//!   elements) has `x = d * sc[j] * q - dmin * m[j]`; byte `c * 32 + l` of `qs` holds
//!   element `c * 64 + l` in its low nibble and `c * 64 + 32 + l` in its high one.
//! - **Q5_K**, 256 elements in 176 bytes: Q4_K's `d`, `dmin` and `scales`, then `u8
//!   qh[32]`, then Q4_K's `qs[128]`; `q` gains a fifth bit, element `32 j + l`'s at bit
//!   `j` of `qh[l]`.
//! - **Q6_K**, 256 elements in 210 bytes: `u8 ql[128]` (low 4 bits), `u8 qh[64]` (high
//!   2 bits), `i8 scales[16]` (one per 16 elements), `f16 d`; `x = d * sc * (q - 32)`.
//!   In each half `h` of 128 elements, element `h * 128 + g * 32 + l` (`g` in 0..4) has
//!   its low bits in `ql[h * 64 + (g % 2) * 32 + l]` (nibble `g / 2`) and its high bits
//!   in `qh[h * 32 + l]` at bit `2 * g`.
//! - **Q3_K**, 256 elements in 110 bytes: `u8 hmask[32]` (high bits), `u8 qs[64]` (low 2
//!   bits), `u8 scales[12]` (sixteen 6-bit scales, packed), `f16 d`;
//!   `x = d * (sc - 32) * q` with `q` in `-4..4`. Element `h * 128 + g * 32 + l` has its
//!   low bits in `qs[h * 32 + l]` at bit `2 * g` and its high bit at bit `4 * h + g` of
//!   `hmask[l]` (clear: `q` loses 4), and scale `8 h + 2 g + l / 16`: Q6_K's element
//!   order and scale order.
//!
//! # Device layout ([`PackedMatrix`])
//!
//! At load the blocks of a `[rows, cols]` matrix are split into separate row-major
//! arrays: the quants as `u32` words (the kernels load them as 16-byte vectors), the
//! scales as small arrays of their own. The quants are laid out for the kernels' byte
//! dot products (`dot4`, docs/language.md) against int8 activations packed four to a
//! word in element order (word `j` holds elements `4 j .. 4 j + 4`, byte `b` element
//! `4 j + b`; see [`crate::kernels_quant`]): every byte lane of a weight word, once
//! its field is masked out, lines up with the activation word of the same four
//! elements, so no weight or activation is moved between lanes.
//!
//! | type | arrays (per row) | per 32-element block | bytes per 256 elements (file) |
//! |---|---|---|---|
//! | Q8_0 | `q: u32[cols / 4]` (`i8` bytes in element order), `d: f16[cols / 32]` | 8 words: word `w` byte `b` is element `4 w + b` | 272 (272) |
//! | Q4_K | `q: u32[cols / 8]` (nibbles), `scales: u8[cols / 32]`, `mins: u8[cols / 32]` (6-bit values unpacked), `d: f16[cols / 256]`, `dmin: f16[cols / 256]` | 4 words: word `w` byte `b` holds element `4 w + b` in its low nibble and `16 + 4 w + b` in its high one | 148 (144) |
//! | Q5_K | Q4_K's arrays and `qh: u32[cols / 32]` (fifth bits) | Q4_K's 4 words; 1 `qh` word: bit `i` is element `i`'s fifth bit | 180 (176) |
//! | Q4_0 | `q: u32[cols / 8]` (nibbles, as Q4_K's), `d: f16[cols / 32]` | Q4_K's 4 words: the file's `qs` bytes as they stand | 144 (144) |
//! | Q5_0 | Q4_0's arrays and `qh: u32[cols / 32]` (fifth bits, as Q5_K's): the file's `qh` | Q5_K's 5 words | 176 (176) |
//! | Q6_K | `ql: u32[cols / 8]` (low nibbles, as Q4_K's), `qh: u32[cols / 16]` (high 2 bits), `scales: u8[cols / 16]` (`i8` with the sign bit flipped), `d: f16[cols / 256]` | 4 `ql` words as Q4_K's; 2 `qh` words: word `p` byte `b` holds, at bit `2 (2 i + h)`, the high bits of element `16 h + 4 (2 p + i) + b` | 210 (210) |
//! | Q3_K | `q: u32[cols / 8]` (four words a block), `d: f16[cols / 256]` | words 0 and 1: word `c` byte `b` holds, at bit `2 j`, element `16 c + 4 j + b`'s low 2 bits of `q + 4`; word 2: byte `b` bit `i` is element `4 i + b`'s high bit; word 3: the halves' scales `sc - 32` (bytes 0 and 1, `i8`) | 130 (110) |
//!
//! So a Q4_K word's low nibbles (`w & 0x0F0F0F0F`) are activation word `w` of the
//! block and its high nibbles activation word `4 + w`; a Q6_K `ql` word `2 p + i` gets
//! its high bits from `qh` word `p` shifted left by `4 - 4 i` (low nibbles, masked with
//! `0x30303030`) or that shifted right by 2 (high nibbles). A Q6_K block's low nibbles
//! are its first 16 elements and its high nibbles the second 16, one scale each.
//!
//! So a Q3_K block's word 0 or 1, field `j` (`(w >> 2 j) & 0x03030303`), is activation
//! word `j` of the block's first or second half, and its high bits, `(w2 >> j) &
//! 0x01010101` or `>> (4 + j)`, go to bit 2 of each byte: Q6_K's scheme with two low
//! bits and one high bit instead of four and two, an offset of 4 instead of 32, and the
//! same integer sums (the Q6_K kernels' `LAYOUT = 1` variants). The block's 12 bytes of
//! quants and 2 of scales take one 16-byte load, as a Q6_K block's low nibbles do:
//! with the 12 bytes alone (114 bytes a super-block) the tile's layout split a block's
//! words over threads and the activation loads went from two 16-byte vectors a block
//! to eight words (docs/perf.md, "Q3_K at 130 bytes a super-block").
//!
//! Q4_K's unpacked scales cost 4 bytes a super-block (2.8%) and spare each thread the
//! 6-bit unpacking (three gathers and a dozen bit operations per sub-block).
//!
//! A Q5_K matrix is a Q4_K one with a fifth bit plane (`PackedMatrix::Q4K`'s `qh`), read
//! by the same kernels' `LAYOUT = 1` variants: the four bits of a nibble word's bytes move
//! to bit 4 of each byte with one multiplication (`crate::kernels_quant`).
//!
//! # Q4_0 and Q5_0 in nibble words
//!
//! A Q4_0 block's 16 bytes of quants are already a Q4_K block's four nibble words
//! (byte `l` holds elements `l` and `16 + l`), and Q5_0's `qh` is Q5_K's fifth-bit
//! word, so in rows of a multiple of 256 elements they pack as they stand beside one
//! f16 scale a block ([`PackedMatrix::Q4_0`]) and the Q4_K kernels' `LAYOUT` 2 and 3
//! variants read them at the file's 18 and 22 bytes a block: `Σ (q - 8) x` (or `q -
//! 16`) is the integer `dot4` sum less 8 (16) times the activation block's sum, then
//! scaled once, exactly what the Q8_0 kernel computes from the same values as bytes.
//!
//! # IQ4_NL, and Q4_0 and Q5_0 in other rows, read as Q8_0
//!
//! A Q4_0, Q5_0 or IQ4_NL block is a Q8_0 block with fewer bits: one f16 scale for 32
//! elements and a signed byte each (`q - 8` in `-8..8`, `q - 16` in `-16..16`, `K[q]`).
//! So they pack into the Q8_0 layout with the same scale and those bytes as its quants,
//! exactly: [`PackedMatrix::dequantize`] gives what [`dequantize`] gives on the file's
//! blocks, value for value, and the Q8_0 kernels compute on them unchanged. The GEMVs
//! then read 34 bytes a block instead of 18 or 22: IQ4_NL's table has no `dot4` form,
//! and the Q4_K kernels take whole super-blocks of rows (their row starts aligned for
//! 16-byte loads). llama.cpp writes these types where a
//! K-quant does not fit: a Q4_K_M file's matrices whose rows are not a multiple of 256
//! elements (Qwen2.5-0.5B's hidden size of 896) fall back to Q5_0 (and Q6_K ones to
//! Q8_0; the I-quants and Q2_K/Q3_K to IQ4_NL), and whole files come as Q4_0 or IQ4_NL.
//! At those sizes the decode step is bound by its launches rather than its bytes
//! (docs/perf.md, "The launch floor of the decode step").
//!
//! Q4_1 and Q5_1 add an offset a block, `x = d * q + m` with `q` in `0..16` or `0..32`:
//! the unsigned quants pack as Q8_0's bytes and the offsets go in an array of their own
//! (`PackedMatrix::Q8_0`'s `m`; the device type [`GgmlType::Q5_1`] for both), which the
//! Q8_0 kernels' `MIN = 1` variants add as `m` times the block's sum of the activation.
//! llama.cpp's Q5_K_M falls back to Q5_1 where Q4_K_M falls back to Q5_0.

use half::{bf16, f16};

use crate::error::{EngineError, Result};

/// A ggml type id (`GGML_TYPE_*`), as stored in a GGUF tensor entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct GgmlType(pub u32);

impl GgmlType {
    /// 32-bit floats.
    pub const F32: GgmlType = GgmlType(0);
    /// IEEE half floats.
    pub const F16: GgmlType = GgmlType(1);
    /// 32-element blocks of 4-bit quants and an f16 scale.
    pub const Q4_0: GgmlType = GgmlType(2);
    /// 32-element blocks of 5-bit quants and an f16 scale.
    pub const Q5_0: GgmlType = GgmlType(6);
    /// 32-element blocks of 4-bit quants, an f16 scale and an f16 offset.
    pub const Q4_1: GgmlType = GgmlType(3);
    /// 32-element blocks of 5-bit quants, an f16 scale and an f16 offset.
    pub const Q5_1: GgmlType = GgmlType(7);
    /// 32-element blocks of 4-bit indices into a fixed table and an f16 scale.
    pub const IQ4_NL: GgmlType = GgmlType(20);
    /// 256-element super-blocks of 4-bit indices into IQ4_NL's table and 6-bit scales.
    pub const IQ4_XS: GgmlType = GgmlType(23);
    /// 32-element blocks of 8-bit quants and an f16 scale.
    pub const Q8_0: GgmlType = GgmlType(8);
    /// 256-element super-blocks of 4-bit quants, 6-bit scales and mins.
    pub const Q4_K: GgmlType = GgmlType(12);
    /// 256-element super-blocks of 3-bit quants and 6-bit scales.
    pub const Q3_K: GgmlType = GgmlType(11);
    /// Q4_K with a fifth bit a quant.
    pub const Q5_K: GgmlType = GgmlType(13);
    /// 256-element super-blocks of 6-bit quants and 8-bit scales.
    pub const Q6_K: GgmlType = GgmlType(14);
    /// bfloat16.
    pub const BF16: GgmlType = GgmlType(30);

    /// ggml's name for the type (`Q4_K`), or `type N` for an unknown id.
    pub fn name(self) -> String {
        match self.info() {
            Some((name, _, _)) => name.to_string(),
            None => format!("type {}", self.0),
        }
    }

    /// `(elements per block, bytes per block)`, for every type ggml defines.
    pub fn block(self) -> Option<(u64, u64)> {
        self.info().map(|(_, b, s)| (b, s))
    }

    /// Whether the engine reads tensors of this type.
    pub fn is_supported(self) -> bool {
        [
            Self::F32,
            Self::F16,
            Self::BF16,
            Self::Q4_0,
            Self::Q5_0,
            Self::IQ4_NL,
            Self::IQ4_XS,
            Self::Q4_1,
            Self::Q5_1,
            Self::Q8_0,
            Self::Q3_K,
            Self::Q4_K,
            Self::Q5_K,
            Self::Q6_K,
        ]
        .contains(&self)
    }

    /// Whether this is one of the block-quantized types the GEMV kernels read (some in
    /// another type's layout: [`GgmlType::device_type`]).
    pub fn is_quantized(self) -> bool {
        self.is_supported() && self.block().is_some_and(|(n, _)| n > 1)
    }

    /// The type whose device layout and kernels read this one's blocks in rows of
    /// `cols` elements: Q8_0 for IQ4_NL, and for Q4_0 and Q5_0 rows that are no
    /// multiple of 256 (else their own nibble layout), Q5_1 (Q8_0's layout with block
    /// offsets) for Q4_1, Q6_K for Q3_K (each exactly, see the module docs), else the
    /// type itself.
    pub fn device_type(self, cols: usize) -> GgmlType {
        if [Self::Q4_0, Self::Q5_0].contains(&self) && cols % 256 == 0 {
            self
        } else if [Self::Q4_0, Self::Q5_0, Self::IQ4_NL].contains(&self) {
            Self::Q8_0
        } else if self == Self::Q4_1 {
            Self::Q5_1
        } else {
            self
        }
    }

    fn info(self) -> Option<(&'static str, u64, u64)> {
        Some(match self.0 {
            0 => ("F32", 1, 4),
            1 => ("F16", 1, 2),
            2 => ("Q4_0", 32, 18),
            3 => ("Q4_1", 32, 20),
            6 => ("Q5_0", 32, 22),
            7 => ("Q5_1", 32, 24),
            8 => ("Q8_0", 32, 34),
            9 => ("Q8_1", 32, 40),
            10 => ("Q2_K", 256, 84),
            11 => ("Q3_K", 256, 110),
            12 => ("Q4_K", 256, 144),
            13 => ("Q5_K", 256, 176),
            14 => ("Q6_K", 256, 210),
            15 => ("Q8_K", 256, 292),
            16 => ("IQ2_XXS", 256, 66),
            17 => ("IQ2_XS", 256, 74),
            18 => ("IQ3_XXS", 256, 98),
            19 => ("IQ1_S", 256, 50),
            20 => ("IQ4_NL", 32, 18),
            21 => ("IQ3_S", 256, 110),
            22 => ("IQ2_S", 256, 82),
            23 => ("IQ4_XS", 256, 136),
            24 => ("I8", 1, 1),
            25 => ("I16", 1, 2),
            26 => ("I32", 1, 4),
            27 => ("I64", 1, 8),
            28 => ("F64", 1, 8),
            29 => ("IQ1_M", 256, 56),
            30 => ("BF16", 1, 2),
            34 => ("TQ1_0", 256, 54),
            35 => ("TQ2_0", 256, 66),
            39 => ("MXFP4", 32, 17),
            _ => return None,
        })
    }
}

impl std::fmt::Display for GgmlType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

/// The types [`dequantize`] reads, for messages.
pub const SUPPORTED: &str =
    "F32, F16, BF16, Q4_0, Q5_0, IQ4_NL, IQ4_XS, Q4_1, Q5_1, Q8_0, Q3_K, Q4_K, Q5_K, Q6_K";

/// IQ4_NL's table: the value of each 4-bit index (llama.cpp's `kvalues_iq4nl`).
pub const IQ4_NL_VALUES: [i8; 16] = [
    -127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113,
];

fn f16_at(b: &[u8], at: usize) -> f32 {
    f16::from_le_bytes([b[at], b[at + 1]]).to_f32()
}

/// Q4_K's eight 6-bit scales and mins from the 12 packed bytes.
pub fn q4k_scale_min(packed: &[u8]) -> ([u8; 8], [u8; 8]) {
    let mut sc = [0u8; 8];
    let mut m = [0u8; 8];
    for j in 0..8 {
        if j < 4 {
            sc[j] = packed[j] & 63;
            m[j] = packed[j + 4] & 63;
        } else {
            sc[j] = (packed[j + 4] & 0x0f) | ((packed[j - 4] >> 6) << 4);
            m[j] = (packed[j + 4] >> 4) | ((packed[j] >> 6) << 4);
        }
    }
    (sc, m)
}

/// Dequantizes one Q8_0 block (34 bytes) into 32 values: `d * q` in f32.
pub fn dequantize_q8_0(block: &[u8], out: &mut [f32]) {
    dequantize_scaled_ints(GgmlType::Q8_0, block, out)
}

/// Dequantizes one Q4_0 block (18 bytes) into 32 values: `d * (q - 8)` in f32.
pub fn dequantize_q4_0(block: &[u8], out: &mut [f32]) {
    dequantize_scaled_ints(GgmlType::Q4_0, block, out)
}

/// Dequantizes one Q5_0 block (22 bytes) into 32 values: `d * (q - 16)` in f32.
pub fn dequantize_q5_0(block: &[u8], out: &mut [f32]) {
    dequantize_scaled_ints(GgmlType::Q5_0, block, out)
}

/// Dequantizes one IQ4_NL block (18 bytes) into 32 values: `d * K[q]` in f32.
pub fn dequantize_iq4_nl(block: &[u8], out: &mut [f32]) {
    dequantize_scaled_ints(GgmlType::IQ4_NL, block, out)
}

/// IQ4_XS's scale of block `j` (of 8) from a super-block's bytes: `ls` in `0..64`,
/// four low bits from `scales_l` (byte 4 + j / 2) and two high from `scales_h` (the
/// `u16` at byte 2); the block's values are `d * (ls - 32) * K[q]`.
pub fn iq4_xs_scale(block: &[u8], j: usize) -> u8 {
    let high = u16::from_le_bytes([block[2], block[3]]);
    let low = (block[4 + j / 2] >> (4 * (j % 2))) & 15;
    low | (((high >> (2 * j)) & 3) as u8) << 4
}

/// Element `e`'s table index in an IQ4_XS super-block (136 bytes: `d`, the scales, then
/// 16 bytes of `qs` a 32-element block, element `l` in the low nibble of byte `l` and
/// `l + 16` in its high one).
fn iq4_xs_index(block: &[u8], e: usize) -> u8 {
    let (j, i) = (e / 32, e % 32);
    (block[8 + 16 * j + i % 16] >> (4 * (i / 16))) & 15
}

/// Dequantizes one IQ4_XS super-block (136 bytes) into 256 values: `(d * (ls - 32)) *
/// K[q]` in f32, as llama.cpp's `dequantize_row_iq4_xs` rounds it.
pub fn dequantize_iq4_xs(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 0);
    for (e, o) in out[..256].iter_mut().enumerate() {
        let dl = d * (iq4_xs_scale(block, e / 32) as i32 - 32) as f32;
        *o = dl * IQ4_NL_VALUES[iq4_xs_index(block, e) as usize] as f32;
    }
}

/// Dequantizes one Q4_1 block (20 bytes) into 32 values: `d * q + m` in f32.
pub fn dequantize_q4_1(block: &[u8], out: &mut [f32]) {
    dequantize_scaled_ints(GgmlType::Q4_1, block, out)
}

/// Dequantizes one Q5_1 block (24 bytes) into 32 values: `d * q + m` in f32.
pub fn dequantize_q5_1(block: &[u8], out: &mut [f32]) {
    dequantize_scaled_ints(GgmlType::Q5_1, block, out)
}

/// `d * q` (and `+ m` for Q4_1 and Q5_1) in f32 for each of a [`scaled_ints`] block's
/// 32 elements, as the `gguf` package rounds it.
fn dequantize_scaled_ints(ty: GgmlType, block: &[u8], out: &mut [f32]) {
    let (d, m, q) = scaled_ints(ty, block);
    for (o, q) in out[..32].iter_mut().zip(q) {
        *o = match m {
            Some(m) => q as f32 * d.to_f32() + m.to_f32(),
            None => q as f32 * d.to_f32(),
        };
    }
}

/// Element `e`'s quant in a Q4_0, Q4_1, Q5_0 or Q5_1 block (`e < 32`): the low nibble of
/// `qs[e % 16]` for `e < 16`, else its high nibble, with `five_bits` the fifth bit from
/// `qh`.
fn small_quant(qs: &[u8], qh: u32, five_bits: bool, e: usize) -> u8 {
    let nibble = (qs[e % 16] >> (4 * (e / 16))) & 15;
    if five_bits {
        nibble | (((qh >> e) & 1) as u8) << 4
    } else {
        nibble
    }
}

/// The scale, the offset (Q4_1 and Q5_1 only) and the 32 integers of a Q8_0 (34 bytes),
/// Q4_0 (18), Q5_0 (22), IQ4_NL (18), Q4_1 (20) or Q5_1 (24) block of type `ty`:
/// `x = d * q` (`+ m`) for each, so all share Q8_0's device layout (the last two with
/// their offsets beside it).
fn scaled_ints(ty: GgmlType, block: &[u8]) -> (f16, Option<f16>, [i8; 32]) {
    let d = f16::from_le_bytes([block[0], block[1]]);
    let m = f16::from_le_bytes([block[2], block[3]]);
    let word =
        |at: usize| u32::from_le_bytes([block[at], block[at + 1], block[at + 2], block[at + 3]]);
    let ints = |qs: &[u8], qh, five, offset: i8| -> [i8; 32] {
        std::array::from_fn(|e| small_quant(qs, qh, five, e) as i8 - offset)
    };
    match ty {
        GgmlType::Q5_0 => (d, None, ints(&block[6..22], word(2), true, 16)),
        GgmlType::Q4_0 => (d, None, ints(&block[2..18], 0, false, 8)),
        GgmlType::IQ4_NL => {
            let idx = ints(&block[2..18], 0, false, 0);
            (d, None, idx.map(|i| IQ4_NL_VALUES[i as usize]))
        }
        GgmlType::Q4_1 => (d, Some(m), ints(&block[4..20], 0, false, 0)),
        GgmlType::Q5_1 => (d, Some(m), ints(&block[8..24], word(4), true, 0)),
        _ => (d, None, std::array::from_fn(|e| block[2 + e] as i8)),
    }
}

/// Dequantizes one Q4_K block (144 bytes) into 256 values, with llama.cpp's rounding:
/// `(d * sc) * q - dmin * m` in f32.
pub fn dequantize_q4_k(block: &[u8], out: &mut [f32]) {
    dequantize_k_mins(block, None, &block[16..144], out)
}

/// Dequantizes one Q5_K block (176 bytes) into 256 values, as [`dequantize_q4_k`] with
/// each quant's fifth bit from `qh`.
pub fn dequantize_q5_k(block: &[u8], out: &mut [f32]) {
    dequantize_k_mins(block, Some(&block[16..48]), &block[48..176], out)
}

/// Q4_K's and Q5_K's `(d * sc) * q - dmin * m`: `d`, `dmin` and the packed scales lead
/// `block`; `qs` holds the low nibbles, `qh` (Q5_K) the fifth bits.
fn dequantize_k_mins(block: &[u8], qh: Option<&[u8]>, qs: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 0);
    let dmin = f16_at(block, 2);
    let (sc, m) = q4k_scale_min(&block[4..16]);
    for c in 0..4 {
        for nib in 0..2 {
            let j = c * 2 + nib;
            let scale = d * sc[j] as f32;
            let min = dmin * m[j] as f32;
            for l in 0..32 {
                let high = qh.map_or(0, |qh| ((qh[l] >> j) & 1) << 4);
                let q = ((qs[c * 32 + l] >> (4 * nib)) & 15) | high;
                out[c * 64 + nib * 32 + l] = scale * q as f32 - min;
            }
        }
    }
}

/// Dequantizes one Q6_K block (210 bytes) into 256 values: `(d * sc) * (q - 32)` in f32.
pub fn dequantize_q6_k(block: &[u8], out: &mut [f32]) {
    let (ql, rest) = block.split_at(128);
    let (qh, rest) = rest.split_at(64);
    let (scales, d) = rest.split_at(16);
    let d = f16_at(d, 0);
    for h in 0..2 {
        for g in 0..4 {
            for l in 0..32 {
                let lo = (ql[h * 64 + (g % 2) * 32 + l] >> (4 * (g / 2))) & 15;
                let hi = (qh[h * 32 + l] >> (2 * g)) & 3;
                let q = (lo | (hi << 4)) as i32 - 32;
                let e = h * 128 + g * 32 + l;
                let scale = d * scales[e / 16] as i8 as f32;
                out[e] = scale * q as f32;
            }
        }
    }
}

/// Q3_K's sixteen 6-bit scales from the 12 packed bytes, less 32: scale `k` has its
/// low four bits in byte `k % 8` (the low nibble for `k < 8`, else the high one) and its
/// high two at bit `2 (k / 4)` of byte `8 + k % 4`.
pub fn q3k_scales(packed: &[u8]) -> [i8; 16] {
    std::array::from_fn(|k| {
        let low = (packed[k % 8] >> (4 * (k / 8))) & 15;
        let high = (packed[8 + k % 4] >> (2 * (k / 4))) & 3;
        (low | (high << 4)) as i8 - 32
    })
}

/// Element `e`'s quant in a Q3_K block, in `-4..4` (see the module docs).
fn q3k_quant(block: &[u8], e: usize) -> i8 {
    let (h, g, l) = (e / 128, (e / 32) % 4, e % 32);
    let low = (block[32 + h * 32 + l] >> (2 * g)) & 3;
    let high = (block[l] >> (4 * h + g)) & 1;
    low as i8 - if high == 1 { 0 } else { 4 }
}

/// Dequantizes one Q3_K block (110 bytes) into 256 values: `(d * (sc - 32)) * q` in
/// f32, as llama.cpp's `dequantize_row_q3_K` rounds it.
pub fn dequantize_q3_k(block: &[u8], out: &mut [f32]) {
    let d = f16_at(block, 108);
    let sc = q3k_scales(&block[96..108]);
    for (e, o) in out[..256].iter_mut().enumerate() {
        *o = (d * sc[e / 16] as f32) * q3k_quant(block, e) as f32;
    }
}

/// Dequantizes `bytes` holding `numel` elements of type `ty` to f32. `name` (the tensor)
/// appears in errors; an unsupported type is an error naming the tensor and the type.
pub fn dequantize(ty: GgmlType, bytes: &[u8], numel: usize, name: &str) -> Result<Vec<f32>> {
    let unsupported = || EngineError::Unsupported {
        message: format!(
            "tensor `{name}` has ggml type {} (supported: {SUPPORTED})",
            ty.name()
        ),
    };
    let (block, block_bytes) = ty.block().ok_or_else(unsupported)?;
    let (block, block_bytes) = (block as usize, block_bytes as usize);
    if numel % block != 0 || bytes.len() != numel / block * block_bytes {
        return Err(EngineError::Unsupported {
            message: format!(
                "tensor `{name}` ({}): {} bytes do not hold {numel} elements",
                ty.name(),
                bytes.len()
            ),
        });
    }
    let mut out = vec![0f32; numel];
    let blocks = bytes
        .chunks_exact(block_bytes)
        .zip(out.chunks_exact_mut(block));
    match ty {
        GgmlType::F32 => {
            blocks.for_each(|(b, o)| o[0] = f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        }
        GgmlType::F16 => blocks.for_each(|(b, o)| o[0] = f16_at(b, 0)),
        GgmlType::BF16 => {
            blocks.for_each(|(b, o)| o[0] = bf16::from_le_bytes([b[0], b[1]]).to_f32())
        }
        GgmlType::Q4_0 => blocks.for_each(|(b, o)| dequantize_q4_0(b, o)),
        GgmlType::Q4_1 => blocks.for_each(|(b, o)| dequantize_q4_1(b, o)),
        GgmlType::Q5_1 => blocks.for_each(|(b, o)| dequantize_q5_1(b, o)),
        GgmlType::Q5_0 => blocks.for_each(|(b, o)| dequantize_q5_0(b, o)),
        GgmlType::IQ4_NL => blocks.for_each(|(b, o)| dequantize_iq4_nl(b, o)),
        GgmlType::IQ4_XS => blocks.for_each(|(b, o)| dequantize_iq4_xs(b, o)),
        GgmlType::Q8_0 => blocks.for_each(|(b, o)| dequantize_q8_0(b, o)),
        GgmlType::Q3_K => blocks.for_each(|(b, o)| dequantize_q3_k(b, o)),
        GgmlType::Q4_K => blocks.for_each(|(b, o)| dequantize_q4_k(b, o)),
        GgmlType::Q5_K => blocks.for_each(|(b, o)| dequantize_q5_k(b, o)),
        GgmlType::Q6_K => blocks.for_each(|(b, o)| dequantize_q6_k(b, o)),
        _ => return Err(unsupported()),
    }
    Ok(out)
}

/// Whether an LM head stored as `ty` (a quantized type) is read quantized by the
/// decode step, else dequantized to bf16 at load: [`head_policy`] with the
/// environment's `TILEFUSE_QUANT_HEAD`.
pub fn head_reads_quantized(ty: GgmlType) -> bool {
    head_policy(ty, std::env::var("TILEFUSE_QUANT_HEAD").ok().as_deref())
}

/// Whether an LM head stored as `ty` is read quantized, given the value of
/// `TILEFUSE_QUANT_HEAD` (`1`: every quantized type; `0`: none; else the default).
/// By default every type the GEMVs read ([`GgmlType::is_quantized`]) is: with int8
/// activations
/// and `dot4` the Q6_K head of a Q4_K_M file makes the step 7-9% faster than the same
/// rows dequantized to bf16 (Qwen3-0.6B and Qwen3-8B, docs/perf.md "The quantized LM
/// head and the step's tiles"; with the older GEMVs that dequantized to f32 it was
/// twice the bf16 head's time).
pub fn head_policy(ty: GgmlType, env: Option<&str>) -> bool {
    match env {
        Some("1") => true,
        Some("0") => false,
        _ => ty.is_quantized(),
    }
}

/// A quantized `[rows, cols]` matrix in the device layout (see the module docs).
#[derive(Clone, Debug, PartialEq)]
pub enum PackedMatrix {
    /// Q8_0.
    Q8_0 {
        /// Rows (output features).
        rows: usize,
        /// Columns (input features), a multiple of 32.
        cols: usize,
        /// `[rows, cols / 4]` words of four `i8` quants, in element order.
        q: Vec<u32>,
        /// `[rows, cols / 32]` block scales.
        d: Vec<f16>,
        /// Q4_1 and Q5_1 only: `[rows, cols / 32]` block offsets (`x = d * q + m`).
        m: Option<Vec<f16>>,
    },
    /// Q4_K, and Q5_K with its fifth bits in `qh`.
    Q4K {
        /// Rows (output features).
        rows: usize,
        /// Columns (input features), a multiple of 256.
        cols: usize,
        /// `[rows, cols / 8]` words of eight 4-bit quants.
        q: Vec<u32>,
        /// `[rows, cols / 32]` 6-bit sub-block scales.
        scales: Vec<u8>,
        /// `[rows, cols / 32]` 6-bit sub-block mins.
        mins: Vec<u8>,
        /// `[rows, cols / 256]` super-block scales.
        d: Vec<f16>,
        /// `[rows, cols / 256]` super-block min scales.
        dmin: Vec<f16>,
        /// Q5_K only: `[rows, cols / 32]` words of the quants' fifth bits, bit `i` of
        /// a sub-block's word its element `i`'s.
        qh: Option<Vec<u32>>,
    },
    /// Q4_0, and Q5_0 with its fifth bits in `qh`, in Q4_K's nibble words: rows of a
    /// multiple of 256 elements (see the module docs).
    Q4_0 {
        /// Rows (output features).
        rows: usize,
        /// Columns (input features), a multiple of 256.
        cols: usize,
        /// `[rows, cols / 8]` words of eight 4-bit quants, as Q4_K's (unsigned: `x = d *
        /// (q - 8)`, Q5_0 `d * (q + 16 h - 16)`).
        q: Vec<u32>,
        /// `[rows, cols / 32]` block scales.
        d: Vec<f16>,
        /// Q5_0 only: `[rows, cols / 32]` words of the quants' fifth bits, bit `i` of a
        /// block's word its element `i`'s.
        qh: Option<Vec<u32>>,
    },
    /// Q6_K.
    Q6K {
        /// Rows (output features).
        rows: usize,
        /// Columns (input features), a multiple of 256.
        cols: usize,
        /// `[rows, cols / 8]` words of eight low nibbles.
        ql: Vec<u32>,
        /// `[rows, cols / 16]` words of sixteen 2-bit high parts.
        qh: Vec<u32>,
        /// `[rows, cols / 16]` scales, `i8` with the sign bit flipped.
        scales: Vec<u8>,
        /// `[rows, cols / 256]` super-block scales.
        d: Vec<f16>,
    },
    /// IQ4_XS: 4-bit indices into IQ4_NL's table (read by the Q4_K kernels' `LAYOUT = 4`
    /// variants), a 6-bit scale a 32-element block and an f16 one a super-block.
    IQ4XS {
        /// Rows (output features).
        rows: usize,
        /// Columns (input features), a multiple of 256.
        cols: usize,
        /// `[rows, cols / 8]` words of eight indices: per block, word `w` holds elements
        /// `4 w..4 w + 4` in its low 16 bits and `16 + 4 w..` in its high ones, a nibble
        /// each ([`table_nibble_at`]), as `byte_perm` selectors.
        q: Vec<u32>,
        /// `[rows, cols / 32]` block scales `ls` in `0..64` (`x = d * (ls - 32) * K[q]`).
        scales: Vec<u8>,
        /// `[rows, cols / 256]` super-block scales.
        d: Vec<f16>,
    },
    /// Q3_K, four words a 32-element block (read by the Q6_K kernels' `LAYOUT = 1`
    /// variants): two of 2-bit fields, one of high bits, one of the block's two scales.
    Q3K {
        /// Rows (output features).
        rows: usize,
        /// Columns (input features), a multiple of 256.
        cols: usize,
        /// `[rows, cols / 8]`: per block, the 2-bit low parts of `q + 4` for elements
        /// `0..16` and `16..32`, their high bits, and the scales `sc - 32` of the two
        /// halves (bytes 0 and 1, `i8`).
        q: Vec<u32>,
        /// `[rows, cols / 256]` super-block scales.
        d: Vec<f16>,
    },
}

/// Where element `e` of a row sits among a Q4_K row's nibble words (also Q6_K's low
/// nibbles): `(word, bit)`; see the module docs.
fn nibble_at(e: usize) -> (usize, u32) {
    let (block, i) = (e / 32, e % 32);
    let (h, w, b) = (i / 16, (i % 16) / 4, i % 4);
    (block * 4 + w, (8 * b + 4 * h) as u32)
}

/// Where element `e` of a row sits among an IQ4_XS row's index words: `(word, bit)`.
/// Element `16 h + 4 w + b` of a block is nibble `4 h + b` of the block's word `w`, so
/// each half of a word is four `byte_perm` selectors for the elements of activation word
/// `w` (`h = 0`) or `4 + w` (`h = 1`), in element order.
pub fn table_nibble_at(e: usize) -> (usize, u32) {
    let (block, i) = (e / 32, e % 32);
    let (h, w, b) = (i / 16, (i % 16) / 4, i % 4);
    (block * 4 + w, (16 * h + 4 * b) as u32)
}

/// Where element `e` of a row sits among a Q6_K row's high-bit words: `(word, bit)`.
fn high_bits_at(e: usize) -> (usize, u32) {
    let (block, i) = (e / 32, e % 32);
    let (h, w, b) = (i / 16, (i % 16) / 4, i % 4);
    let (p, lane) = (w / 2, w % 2);
    (block * 2 + p, (8 * b + 2 * (2 * lane + h)) as u32)
}

/// Where element `e` of a row sits among a Q3_K row's words (four a block) as 2 low
/// bits: `(word, bit)`. A block's word `c` (0 or 1) holds its elements `16 c..16 c +
/// 16`, element `16 c + 4 j + b` at bit `8 b + 2 j`, so field `j` of each byte is
/// activation word `4 c + j`.
fn crumb_at(e: usize) -> (usize, u32) {
    let (block, i) = (e / 32, e % 32);
    (
        block * 4 + i / 16,
        (8 * (i % 4) + 2 * ((i % 16) / 4)) as u32,
    )
}

/// Where element `e` of a row sits among a Q3_K row's words as a high bit: word 2 of
/// its block, element `4 i + b` of the block at bit `8 b + i`.
fn high_bit_at(e: usize) -> (usize, u32) {
    let (block, i) = (e / 32, e % 32);
    (block * 4 + 2, (8 * (i % 4) + i / 4) as u32)
}

/// Packs field `value(e)` (below `1 << bits`) of each of a block's `n` elements into the
/// block's words, at the places `at(e)` gives. Every layout here repeats whole blocks
/// (a block's elements land in the block's own words), so the element index is the
/// block's own.
fn pack_block(
    out: &mut [u32],
    n: usize,
    bits: u32,
    at: fn(usize) -> (usize, u32),
    value: impl Fn(usize) -> u32,
) {
    debug_assert_eq!(out.len(), n * bits as usize / 32);
    out.fill(0);
    for e in 0..n {
        let (w, shift) = at(e);
        out[w] |= value(e) << shift;
    }
}

/// Super-blocks below which a matrix packs on one thread.
const PACK_BLOCKS_PER_THREAD: usize = 1 << 12;

/// Runs `pack(block, words, extra)` for each `block_bytes` block of `bytes`, with its own
/// `words.1` elements of `words.0` and `extra.1` of `extra.0`, spread over the machine's
/// threads in contiguous runs of blocks.
fn in_parallel<W: Send, E: Send>(
    bytes: &[u8],
    block_bytes: usize,
    words: (&mut [W], usize),
    extra: (&mut [E], usize),
    pack: impl Fn(&[u8], &mut [W], &mut [E]) + Sync,
) {
    let blocks = bytes.len() / block_bytes;
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
    let per = blocks.div_ceil(threads).max(PACK_BLOCKS_PER_THREAD).max(1);
    let run = |src: &[u8], w: &mut [W], x: &mut [E]| {
        let parts = src
            .chunks_exact(block_bytes)
            .zip(w.chunks_exact_mut(words.1))
            .zip(x.chunks_exact_mut(extra.1));
        for ((b, w), x) in parts {
            pack(b, w, x);
        }
    };
    if blocks <= per {
        return run(bytes, words.0, extra.0);
    }
    std::thread::scope(|s| {
        let runs = bytes
            .chunks(per * block_bytes)
            .zip(words.0.chunks_mut(per * words.1))
            .zip(extra.0.chunks_mut(per * extra.1));
        for ((src, w), x) in runs {
            let run = &run;
            s.spawn(move || run(src, w, x));
        }
    });
}

/// Field `e` (of `bits` bits) of the words packed by [`pack_block`] with `at`.
fn field(words: &[u32], e: usize, bits: u32, at: fn(usize) -> (usize, u32)) -> u32 {
    let (w, shift) = at(e);
    (words[w] >> shift) & ((1u32 << bits) - 1)
}

/// Element `e`'s byte in little-endian words.
fn byte_at(e: usize) -> (usize, u32) {
    (e / 4, (8 * (e % 4)) as u32)
}

impl PackedMatrix {
    /// Splits the blocks of a `[rows, cols]` tensor of type `ty` into the device
    /// layout. `name` appears in errors (unsupported type, size mismatch).
    pub fn pack(ty: GgmlType, bytes: &[u8], rows: usize, cols: usize, name: &str) -> Result<Self> {
        let (block, block_bytes) = match ty.block() {
            Some((b, s)) if ty.is_quantized() => (b as usize, s as usize),
            _ => {
                return Err(EngineError::Unsupported {
                    message: format!(
                        "tensor `{name}` has ggml type {}; the quantized GEMVs read Q8_0, Q4_K, Q5_K, Q6_K, Q4_0 and Q5_0 (IQ4_NL as Q8_0, Q4_1 and Q5_1 as Q8_0 with offsets, Q3_K by the Q6_K kernels, IQ4_XS by the Q4_K kernels)",
                        ty.name()
                    ),
                })
            }
        };
        if cols % block != 0 || bytes.len() != rows * cols / block * block_bytes {
            return Err(EngineError::Unsupported {
                message: format!(
                    "tensor `{name}` ({ty}): {} bytes do not hold [{rows}, {cols}] in blocks of {block}",
                    bytes.len()
                ),
            });
        }
        let blocks = bytes.len() / block_bytes;
        // The super-blocks are independent and each fills its own stretch of every
        // array, so they pack in parallel, each in its own elements' order.
        Ok(match ty.device_type(cols) {
            GgmlType::Q4_0 | GgmlType::Q5_0 => {
                let five = ty == GgmlType::Q5_0;
                // Per block: 4 nibble words, then (Q5_0) the fifth-bit word.
                let per_block = if five { 5 } else { 4 };
                let mut words = vec![0u32; blocks * per_block];
                let mut d = vec![f16::ZERO; blocks];
                in_parallel(
                    bytes,
                    block_bytes,
                    (words.as_mut_slice(), per_block),
                    (d.as_mut_slice(), 1),
                    |b, words, d| {
                        d[0] = f16::from_le_bytes([b[0], b[1]]);
                        // Byte `l` of `qs` holds element `l` (low nibble) and `l + 16`:
                        // Q4_K's nibble order (`nibble_at`), so the 16 bytes are the
                        // block's four words as they stand.
                        let qs = &b[block_bytes - 16..];
                        for (w, q) in words[..4].iter_mut().zip(qs.chunks_exact(4)) {
                            *w = u32::from_le_bytes([q[0], q[1], q[2], q[3]]);
                        }
                        if five {
                            words[4] = u32::from_le_bytes([b[2], b[3], b[4], b[5]]);
                        }
                    },
                );
                let (q, qh) = if five {
                    let mut q = Vec::with_capacity(blocks * 4);
                    let mut qh = Vec::with_capacity(blocks);
                    for w in words.chunks_exact(5) {
                        q.extend_from_slice(&w[..4]);
                        qh.push(w[4]);
                    }
                    (q, Some(qh))
                } else {
                    (words, None)
                };
                PackedMatrix::Q4_0 {
                    rows,
                    cols,
                    q,
                    d,
                    qh,
                }
            }
            GgmlType::Q8_0 | GgmlType::Q5_1 => {
                let mut q = vec![0u32; blocks * 8];
                // Per block: the scale and the offset (zero where the type has none).
                let mut dm = vec![[f16::ZERO; 2]; blocks];
                in_parallel(
                    bytes,
                    block_bytes,
                    (q.as_mut_slice(), 8),
                    (dm.as_mut_slice(), 1),
                    |b, q, dm| {
                        let (scale, offset, ints) = scaled_ints(ty, b);
                        dm[0] = [scale, offset.unwrap_or(f16::ZERO)];
                        pack_block(q, 32, 8, byte_at, |e| u32::from(ints[e] as u8));
                    },
                );
                let d = dm.iter().map(|p| p[0]).collect();
                let m = (ty.device_type(cols) == GgmlType::Q5_1)
                    .then(|| dm.iter().map(|p| p[1]).collect());
                PackedMatrix::Q8_0 {
                    rows,
                    cols,
                    q,
                    d,
                    m,
                }
            }
            GgmlType::Q4_K | GgmlType::Q5_K => {
                let five = ty == GgmlType::Q5_K;
                // Per super-block: 32 nibble words, then (Q5_K) 8 fifth-bit words.
                let per_block = if five { 40 } else { 32 };
                let mut words = vec![0u32; blocks * per_block];
                // Per super-block: 8 scales, 8 mins, then `d` and `dmin` (split below).
                let mut meta = vec![0u8; blocks * 20];
                in_parallel(
                    bytes,
                    block_bytes,
                    (words.as_mut_slice(), per_block),
                    (meta.as_mut_slice(), 20),
                    |b, words, meta| {
                        let (sc, m) = q4k_scale_min(&b[4..16]);
                        meta[..8].copy_from_slice(&sc);
                        meta[8..16].copy_from_slice(&m);
                        meta[16..20].copy_from_slice(&b[..4]);
                        let qs = &b[block_bytes - 128..];
                        let (q, high) = words.split_at_mut(32);
                        // Element order: chunk c of 64 is bytes c*32.. low nibbles, then high.
                        pack_block(q, 256, 4, nibble_at, |e| {
                            let (c, nib, i) = (e / 64, (e / 32) % 2, e % 32);
                            u32::from((qs[c * 32 + i] >> (4 * nib)) & 15)
                        });
                        if five {
                            // Element `32 j + i`'s fifth bit: bit `j` of `qh[i]`.
                            pack_block(
                                high,
                                256,
                                1,
                                |e| (e / 32, (e % 32) as u32),
                                |e| u32::from((b[16 + e % 32] >> (e / 32)) & 1),
                            );
                        }
                    },
                );
                let (q, qh) = if five {
                    let mut q = Vec::with_capacity(blocks * 32);
                    let mut qh = Vec::with_capacity(blocks * 8);
                    for w in words.chunks_exact(40) {
                        q.extend_from_slice(&w[..32]);
                        qh.extend_from_slice(&w[32..]);
                    }
                    (q, Some(qh))
                } else {
                    (words, None)
                };
                let (mut scales, mut mins) = (
                    Vec::with_capacity(blocks * 8),
                    Vec::with_capacity(blocks * 8),
                );
                let (mut d, mut dmin) = (Vec::with_capacity(blocks), Vec::with_capacity(blocks));
                for m in meta.chunks_exact(20) {
                    scales.extend_from_slice(&m[..8]);
                    mins.extend_from_slice(&m[8..16]);
                    d.push(f16::from_le_bytes([m[16], m[17]]));
                    dmin.push(f16::from_le_bytes([m[18], m[19]]));
                }
                PackedMatrix::Q4K {
                    rows,
                    cols,
                    q,
                    scales,
                    mins,
                    d,
                    dmin,
                    qh,
                }
            }
            GgmlType::IQ4_XS => {
                // Per super-block: 32 index words; 8 scales and `d`'s two bytes.
                let mut q = vec![0u32; blocks * 32];
                let mut meta = vec![0u8; blocks * 10];
                in_parallel(
                    bytes,
                    block_bytes,
                    (q.as_mut_slice(), 32),
                    (meta.as_mut_slice(), 10),
                    |b, words, meta| {
                        pack_block(words, 256, 4, table_nibble_at, |e| {
                            u32::from(iq4_xs_index(b, e))
                        });
                        for (j, s) in meta[..8].iter_mut().enumerate() {
                            *s = iq4_xs_scale(b, j);
                        }
                        meta[8..10].copy_from_slice(&b[..2]);
                    },
                );
                let mut scales = Vec::with_capacity(blocks * 8);
                let mut d = Vec::with_capacity(blocks);
                for m in meta.chunks_exact(10) {
                    scales.extend_from_slice(&m[..8]);
                    d.push(f16::from_le_bytes([m[8], m[9]]));
                }
                PackedMatrix::IQ4XS {
                    rows,
                    cols,
                    q,
                    scales,
                    d,
                }
            }
            GgmlType::Q3_K => {
                // Per super-block: four words a block, and `d`.
                let mut q = vec![0u32; blocks * 32];
                let mut d = vec![f16::ZERO; blocks];
                in_parallel(
                    bytes,
                    block_bytes,
                    (q.as_mut_slice(), 32),
                    (d.as_mut_slice(), 1),
                    |b, words, d| {
                        let quant = |e| (q3k_quant(b, e) + 4) as u32;
                        words.fill(0);
                        for e in 0..256 {
                            let (w, shift) = crumb_at(e);
                            words[w] |= (quant(e) & 3) << shift;
                            let (w, shift) = high_bit_at(e);
                            words[w] |= (quant(e) >> 2) << shift;
                        }
                        for (k, sc) in q3k_scales(&b[96..108]).into_iter().enumerate() {
                            words[(k / 2) * 4 + 3] |= u32::from(sc as u8) << (8 * (k % 2));
                        }
                        d[0] = f16::from_le_bytes([b[108], b[109]]);
                    },
                );
                PackedMatrix::Q3K { rows, cols, q, d }
            }
            GgmlType::Q6_K => {
                // Per super-block: 32 low-nibble words, then 16 high-bit words.
                let mut words = vec![0u32; blocks * 48];
                // Per super-block: 16 scales, then `d`.
                let mut meta = vec![0u8; blocks * 18];
                in_parallel(
                    bytes,
                    block_bytes,
                    (words.as_mut_slice(), 48),
                    (meta.as_mut_slice(), 18),
                    |b, words, meta| {
                        let (ql, qh) = (&b[..128], &b[128..192]);
                        let (lo, hi) = words.split_at_mut(32);
                        pack_block(lo, 256, 4, nibble_at, |e| {
                            let (h, g, l) = (e / 128, (e / 32) % 4, e % 32);
                            u32::from((ql[h * 64 + (g % 2) * 32 + l] >> (4 * (g / 2))) & 15)
                        });
                        pack_block(hi, 256, 2, high_bits_at, |e| {
                            let (h, g, l) = (e / 128, (e / 32) % 4, e % 32);
                            u32::from((qh[h * 32 + l] >> (2 * g)) & 3)
                        });
                        for (o, &v) in meta[..16].iter_mut().zip(&b[192..208]) {
                            *o = v ^ 0x80;
                        }
                        meta[16..18].copy_from_slice(&b[208..210]);
                    },
                );
                let (mut ql, mut qh) = (
                    Vec::with_capacity(blocks * 32),
                    Vec::with_capacity(blocks * 16),
                );
                for w in words.chunks_exact(48) {
                    ql.extend_from_slice(&w[..32]);
                    qh.extend_from_slice(&w[32..]);
                }
                let (mut scales, mut d) =
                    (Vec::with_capacity(blocks * 16), Vec::with_capacity(blocks));
                for m in meta.chunks_exact(18) {
                    scales.extend_from_slice(&m[..16]);
                    d.push(f16::from_le_bytes([m[16], m[17]]));
                }
                PackedMatrix::Q6K {
                    rows,
                    cols,
                    ql,
                    qh,
                    scales,
                    d,
                }
            }
            _ => unreachable!("checked by is_quantized above"),
        })
    }

    /// The ggml type of the matrix's device layout: [`GgmlType::device_type`] of the
    /// type it came from (Q8_0 for IQ4_NL ones).
    pub fn ggml_type(&self) -> GgmlType {
        match self {
            PackedMatrix::Q8_0 { m: None, .. } => GgmlType::Q8_0,
            PackedMatrix::Q8_0 { m: Some(_), .. } => GgmlType::Q5_1,
            PackedMatrix::Q4K { qh: None, .. } => GgmlType::Q4_K,
            PackedMatrix::Q4K { qh: Some(_), .. } => GgmlType::Q5_K,
            PackedMatrix::Q4_0 { qh: None, .. } => GgmlType::Q4_0,
            PackedMatrix::Q4_0 { qh: Some(_), .. } => GgmlType::Q5_0,
            PackedMatrix::Q6K { .. } => GgmlType::Q6_K,
            PackedMatrix::Q3K { .. } => GgmlType::Q3_K,
            PackedMatrix::IQ4XS { .. } => GgmlType::IQ4_XS,
        }
    }

    /// `(rows, cols)`.
    pub fn shape(&self) -> (usize, usize) {
        match *self {
            PackedMatrix::Q8_0 { rows, cols, .. }
            | PackedMatrix::Q4K { rows, cols, .. }
            | PackedMatrix::Q4_0 { rows, cols, .. }
            | PackedMatrix::Q6K { rows, cols, .. }
            | PackedMatrix::Q3K { rows, cols, .. }
            | PackedMatrix::IQ4XS { rows, cols, .. } => (rows, cols),
        }
    }

    /// The matrix as f32, row-major, read from the device layout: the host model of
    /// what the kernels compute (same rounding as [`dequantize`] on the file's blocks).
    pub fn dequantize(&self) -> Vec<f32> {
        let (rows, cols) = self.shape();
        let mut out = vec![0f32; rows * cols];
        match self {
            PackedMatrix::Q8_0 { q, d, m, .. } => {
                for (i, o) in out.iter_mut().enumerate() {
                    let v = field(q, i, 8, byte_at) as u8 as i8 as f32 * d[i / 32].to_f32();
                    *o = m.as_ref().map_or(v, |m| v + m[i / 32].to_f32());
                }
            }
            PackedMatrix::Q4K {
                q,
                scales,
                mins,
                d,
                dmin,
                qh,
                ..
            } => {
                for (i, o) in out.iter_mut().enumerate() {
                    let scale = d[i / 256].to_f32() * scales[i / 32] as f32;
                    let min = dmin[i / 256].to_f32() * mins[i / 32] as f32;
                    let high = qh
                        .as_ref()
                        .map_or(0, |qh| ((qh[i / 32] >> (i % 32)) & 1) << 4);
                    *o = scale * (field(q, i, 4, nibble_at) | high) as f32 - min;
                }
            }
            PackedMatrix::Q4_0 { q, d, qh, .. } => {
                let offset = if qh.is_some() { 16 } else { 8 };
                for (i, o) in out.iter_mut().enumerate() {
                    let high = qh
                        .as_ref()
                        .map_or(0, |qh| ((qh[i / 32] >> (i % 32)) & 1) << 4);
                    let qv = (field(q, i, 4, nibble_at) | high) as i32 - offset;
                    *o = d[i / 32].to_f32() * qv as f32;
                }
            }
            PackedMatrix::Q6K {
                ql, qh, scales, d, ..
            } => {
                for (i, o) in out.iter_mut().enumerate() {
                    let qv = (field(ql, i, 4, nibble_at) | (field(qh, i, 2, high_bits_at) << 4))
                        as i32
                        - 32;
                    let scale = d[i / 256].to_f32() * (scales[i / 16] as i32 - 128) as f32;
                    *o = scale * qv as f32;
                }
            }
            PackedMatrix::Q3K { q, d, .. } => {
                for (i, o) in out.iter_mut().enumerate() {
                    let qv =
                        (field(q, i, 2, crumb_at) | (field(q, i, 1, high_bit_at) << 2)) as i32 - 4;
                    let sc = (q[(i / 32) * 4 + 3] >> (8 * ((i / 16) % 2))) as u8 as i8;
                    let scale = d[i / 256].to_f32() * sc as f32;
                    *o = scale * qv as f32;
                }
            }
            PackedMatrix::IQ4XS { q, scales, d, .. } => {
                for (i, o) in out.iter_mut().enumerate() {
                    let k = IQ4_NL_VALUES[field(q, i, 4, table_nibble_at) as usize];
                    let scale = d[i / 256].to_f32() * (scales[i / 32] as i32 - 32) as f32;
                    *o = scale * k as f32;
                }
            }
        }
        out
    }

    /// The row blocks `parts` (one type, equal columns) stacked into one matrix: every
    /// array of the layout is row-major, so each is the concatenation of the parts'.
    pub fn concat_rows(parts: &[&PackedMatrix]) -> Result<PackedMatrix> {
        let Some(first) = parts.first() else {
            return Err(EngineError::Unsupported {
                message: "stacking no matrices".into(),
            });
        };
        let (ty, cols) = (first.ggml_type(), first.shape().1);
        if let Some(bad) = parts
            .iter()
            .find(|p| p.ggml_type() != ty || p.shape().1 != cols)
        {
            return Err(EngineError::Unsupported {
                message: format!(
                    "stacking a {} [{}, {}] matrix under {ty} [_, {cols}] ones",
                    bad.ggml_type(),
                    bad.shape().0,
                    bad.shape().1
                ),
            });
        }
        let rows = parts.iter().map(|p| p.shape().0).sum();
        fn cat<T: Clone>(parts: &[&PackedMatrix], f: impl Fn(&PackedMatrix) -> &[T]) -> Vec<T> {
            parts.iter().flat_map(|p| f(p).iter().cloned()).collect()
        }
        Ok(match first {
            PackedMatrix::Q8_0 { .. } => PackedMatrix::Q8_0 {
                rows,
                cols,
                q: cat(parts, |p| match p {
                    PackedMatrix::Q8_0 { q, .. } => q,
                    _ => &[],
                }),
                d: cat(parts, |p| match p {
                    PackedMatrix::Q8_0 { d, .. } => d,
                    _ => &[],
                }),
                // One type, checked above: all parts have offsets or none has.
                m: (ty == GgmlType::Q5_1).then(|| {
                    cat(parts, |p| match p {
                        PackedMatrix::Q8_0 { m: Some(m), .. } => m,
                        _ => &[],
                    })
                }),
            },
            PackedMatrix::Q4K { .. } => PackedMatrix::Q4K {
                rows,
                cols,
                q: cat(parts, |p| match p {
                    PackedMatrix::Q4K { q, .. } => q,
                    _ => &[],
                }),
                scales: cat(parts, |p| match p {
                    PackedMatrix::Q4K { scales, .. } => scales,
                    _ => &[],
                }),
                mins: cat(parts, |p| match p {
                    PackedMatrix::Q4K { mins, .. } => mins,
                    _ => &[],
                }),
                d: cat(parts, |p| match p {
                    PackedMatrix::Q4K { d, .. } => d,
                    _ => &[],
                }),
                dmin: cat(parts, |p| match p {
                    PackedMatrix::Q4K { dmin, .. } => dmin,
                    _ => &[],
                }),
                // One type, checked above: all parts have fifth bits or none has.
                qh: (ty == GgmlType::Q5_K).then(|| {
                    cat(parts, |p| match p {
                        PackedMatrix::Q4K { qh: Some(qh), .. } => qh,
                        _ => &[],
                    })
                }),
            },
            PackedMatrix::Q4_0 { .. } => PackedMatrix::Q4_0 {
                rows,
                cols,
                q: cat(parts, |p| match p {
                    PackedMatrix::Q4_0 { q, .. } => q,
                    _ => &[],
                }),
                d: cat(parts, |p| match p {
                    PackedMatrix::Q4_0 { d, .. } => d,
                    _ => &[],
                }),
                // One type, checked above: all parts have fifth bits or none has.
                qh: (ty == GgmlType::Q5_0).then(|| {
                    cat(parts, |p| match p {
                        PackedMatrix::Q4_0 { qh: Some(qh), .. } => qh,
                        _ => &[],
                    })
                }),
            },
            PackedMatrix::Q6K { .. } => PackedMatrix::Q6K {
                rows,
                cols,
                ql: cat(parts, |p| match p {
                    PackedMatrix::Q6K { ql, .. } => ql,
                    _ => &[],
                }),
                qh: cat(parts, |p| match p {
                    PackedMatrix::Q6K { qh, .. } => qh,
                    _ => &[],
                }),
                scales: cat(parts, |p| match p {
                    PackedMatrix::Q6K { scales, .. } => scales,
                    _ => &[],
                }),
                d: cat(parts, |p| match p {
                    PackedMatrix::Q6K { d, .. } => d,
                    _ => &[],
                }),
            },
            PackedMatrix::Q3K { .. } => PackedMatrix::Q3K {
                rows,
                cols,
                q: cat(parts, |p| match p {
                    PackedMatrix::Q3K { q, .. } => q,
                    _ => &[],
                }),
                d: cat(parts, |p| match p {
                    PackedMatrix::Q3K { d, .. } => d,
                    _ => &[],
                }),
            },
            PackedMatrix::IQ4XS { .. } => PackedMatrix::IQ4XS {
                rows,
                cols,
                q: cat(parts, |p| match p {
                    PackedMatrix::IQ4XS { q, .. } => q,
                    _ => &[],
                }),
                scales: cat(parts, |p| match p {
                    PackedMatrix::IQ4XS { scales, .. } => scales,
                    _ => &[],
                }),
                d: cat(parts, |p| match p {
                    PackedMatrix::IQ4XS { d, .. } => d,
                    _ => &[],
                }),
            },
        })
    }

    /// Bytes a GEMV reads from this matrix's arrays (the bandwidth floor's numerator).
    pub fn device_bytes(&self) -> usize {
        match self {
            PackedMatrix::Q8_0 { q, d, m, .. } => {
                4 * q.len() + 2 * (d.len() + m.as_ref().map_or(0, Vec::len))
            }
            PackedMatrix::Q4K {
                q,
                scales,
                mins,
                d,
                dmin,
                qh,
                ..
            } => {
                let high = qh.as_ref().map_or(0, Vec::len);
                4 * (q.len() + high) + scales.len() + mins.len() + 2 * (d.len() + dmin.len())
            }
            PackedMatrix::Q4_0 { q, d, qh, .. } => {
                4 * (q.len() + qh.as_ref().map_or(0, Vec::len)) + 2 * d.len()
            }
            PackedMatrix::Q6K {
                ql, qh, scales, d, ..
            } => 4 * (ql.len() + qh.len()) + scales.len() + 2 * d.len(),
            PackedMatrix::Q3K { q, d, .. } => 4 * q.len() + 2 * d.len(),
            PackedMatrix::IQ4XS { q, scales, d, .. } => 4 * q.len() + scales.len() + 2 * d.len(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A matrix large enough to be packed over several threads packs to the rows packed
    /// one by one (on one thread each) and stacked: the runs of blocks split anywhere.
    #[test]
    fn a_matrix_packed_over_threads_equals_its_rows_packed_alone() {
        let (rows, cols) = (96, 256 * 128);
        let mut state = 0x9E37_79B9_7F4A_7C15u64;
        for ty in [
            GgmlType::Q8_0,
            GgmlType::Q4_K,
            GgmlType::Q5_K,
            GgmlType::Q6_K,
            GgmlType::Q4_0,
            GgmlType::Q5_0,
            GgmlType::IQ4_NL,
            GgmlType::Q4_1,
            GgmlType::Q5_1,
            GgmlType::Q3_K,
        ] {
            let (block, size) = ty.block().unwrap();
            let row_bytes = cols / block as usize * size as usize;
            let bytes = random_blocks(ty, rows * cols / block as usize, &mut state);
            assert!(rows * cols / 256 > 2 * PACK_BLOCKS_PER_THREAD);
            let whole = PackedMatrix::pack(ty, &bytes, rows, cols, "whole").unwrap();
            let parts: Vec<PackedMatrix> = bytes
                .chunks(row_bytes)
                .map(|r| PackedMatrix::pack(ty, r, 1, cols, "row").unwrap())
                .collect();
            let stacked = PackedMatrix::concat_rows(&parts.iter().collect::<Vec<_>>()).unwrap();
            assert!(whole == stacked, "{ty}: packed whole and by rows differ");
        }
    }

    /// `blocks` random blocks of `ty` from an xorshift `state`, with finite scales (a
    /// NaN is unequal to itself) and random bytes everywhere else.
    fn random_blocks(ty: GgmlType, blocks: usize, state: &mut u64) -> Vec<u8> {
        let size = ty.block().unwrap().1 as usize;
        let mut bytes: Vec<u8> = (0..blocks * size)
            .map(|_| {
                *state ^= *state << 13;
                *state ^= *state >> 7;
                *state ^= *state << 17;
                (*state >> 24) as u8
            })
            .collect();
        let scale = f16::from_f32(0.01).to_le_bytes();
        for b in bytes.chunks_exact_mut(size) {
            match ty {
                GgmlType::Q4_K | GgmlType::Q5_K => {
                    b[..2].copy_from_slice(&scale);
                    b[2..4].copy_from_slice(&scale);
                }
                GgmlType::Q6_K => b[208..].copy_from_slice(&scale),
                GgmlType::Q3_K => b[108..].copy_from_slice(&scale),
                GgmlType::Q4_1 | GgmlType::Q5_1 => {
                    b[..2].copy_from_slice(&scale);
                    b[2..4].copy_from_slice(&f16::from_f32(-0.15).to_le_bytes());
                }
                _ => b[..2].copy_from_slice(&scale),
            }
        }
        bytes
    }

    /// Packs random `ty` blocks (from `state`) as a 5 x 96 matrix and checks the layout:
    /// device type `device`, `block_bytes` a 32-element block, and the file's values
    /// read back bit for bit, which it returns.
    fn packs_exactly(
        ty: GgmlType,
        device: GgmlType,
        block_bytes: usize,
        state: &mut u64,
    ) -> Vec<f32> {
        packs_exactly_at(ty, device, block_bytes, 96, state)
    }

    /// [`packs_exactly`] for a 5 x `cols` matrix.
    fn packs_exactly_at(
        ty: GgmlType,
        device: GgmlType,
        block_bytes: usize,
        cols: usize,
        state: &mut u64,
    ) -> Vec<f32> {
        let rows = 5;
        let bytes = random_blocks(ty, rows * cols / 32, state);
        let packed = PackedMatrix::pack(ty, &bytes, rows, cols, "w").unwrap();
        assert_eq!(packed.ggml_type(), device);
        assert_eq!(ty.device_type(cols), device);
        assert_eq!(packed.device_bytes(), rows * cols / 32 * block_bytes);
        let want = dequantize(ty, &bytes, rows * cols, "w").unwrap();
        let got = packed.dequantize();
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(
                g.to_bits(),
                w.to_bits(),
                "{ty} element {i}: {g} against {w}"
            );
        }
        want
    }

    /// Q4_0, Q5_0 and IQ4_NL matrices pack into the Q8_0 layout without changing a
    /// value: the device layout's host model reads back exactly the file's
    /// dequantization, and the layout's bytes are Q8_0's.
    #[test]
    fn q4_0_q5_0_and_iq4_nl_pack_exactly_as_q8_0() {
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        for ty in [GgmlType::Q4_0, GgmlType::Q5_0, GgmlType::IQ4_NL] {
            let want = packs_exactly(ty, GgmlType::Q8_0, 34, &mut state);
            // Every integer the type can hold turns up, its extremes included.
            let all: std::collections::BTreeSet<i32> = match ty {
                GgmlType::Q4_0 => (-8..=7).collect(),
                GgmlType::Q5_0 => (-16..=15).collect(),
                _ => IQ4_NL_VALUES.iter().map(|&v| v as i32).collect(),
            };
            let scale = f16::from_f32(0.01).to_f32();
            let ints: std::collections::BTreeSet<i32> =
                want.iter().map(|v| (v / scale).round() as i32).collect();
            assert_eq!(ints, all, "{ty}");
        }
    }

    /// In rows of a multiple of 256 elements Q4_0 and Q5_0 matrices keep their own
    /// types, in Q4_K's nibble words at the file's 18 and 22 bytes a block, without
    /// changing a value; element `l` and `16 + l` of a block share byte `l`.
    #[test]
    fn q4_0_and_q5_0_pack_exactly_in_nibble_words() {
        let mut state = 0x3C6E_F372_FE94_F82Bu64;
        for (ty, bytes, low) in [(GgmlType::Q4_0, 18, -8), (GgmlType::Q5_0, 22, -16)] {
            let want = packs_exactly_at(ty, ty, bytes, 512, &mut state);
            let scale = f16::from_f32(0.01).to_f32();
            let ints: std::collections::BTreeSet<i32> =
                want.iter().map(|v| (v / scale).round() as i32).collect();
            assert_eq!(ints, (low..-low).collect(), "{ty}");
        }
        // A hand-built Q5_0 row of 256: block 3's element 17 (fifth bit set, nibble 9)
        // and element 1 (nibble 3, fifth bit clear).
        let mut row = vec![0u8; 8 * 22];
        for b in row.chunks_exact_mut(22) {
            b[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        }
        let b = &mut row[3 * 22..4 * 22];
        b[2..6].copy_from_slice(&(1u32 << 17).to_le_bytes());
        b[6 + 1] = 3 | (9 << 4);
        let packed = PackedMatrix::pack(GgmlType::Q5_0, &row, 1, 256, "w").unwrap();
        let PackedMatrix::Q4_0 {
            q, qh: Some(qh), ..
        } = &packed
        else {
            panic!("Q5_0 in rows of 256 packs in nibble words");
        };
        assert_eq!((q[3 * 4], qh[3]), ((3 | (9 << 4)) << 8, 1 << 17));
        let v = packed.dequantize();
        assert_eq!(
            (v[96 + 1], v[96 + 17], v[96]),
            (0.5 * -13.0, 0.5 * 9.0, -8.0)
        );
    }

    /// Q4_1 and Q5_1 matrices pack into the Q8_0 layout with their offsets beside it
    /// (the device type Q5_1) without changing a value, their quants unsigned.
    #[test]
    fn q4_1_and_q5_1_pack_exactly_as_q8_0_with_offsets() {
        let mut state = 0x6A09_E667_F3BC_C908u64;
        for (ty, top) in [(GgmlType::Q4_1, 15), (GgmlType::Q5_1, 31)] {
            let want = packs_exactly(ty, GgmlType::Q5_1, 36, &mut state);
            // `x = 0.01 q - 0.15` for every q in 0..=top.
            let (d, m) = (f16::from_f32(0.01).to_f32(), f16::from_f32(-0.15).to_f32());
            let ints: std::collections::BTreeSet<i32> =
                want.iter().map(|v| ((v - m) / d).round() as i32).collect();
            assert_eq!(ints, (0..=top).collect(), "{ty}");
        }
        // A hand-built Q5_1 block: element 17's fifth bit and its high nibble.
        let mut block = vec![0u8; 24];
        block[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        block[2..4].copy_from_slice(&f16::from_f32(-2.0).to_le_bytes());
        block[4..8].copy_from_slice(&(1u32 << 17).to_le_bytes());
        block[8 + 1] = 9 << 4;
        let mut out = [0f32; 32];
        dequantize_q5_1(&block, &mut out);
        assert_eq!(out[17], 0.5 * 25.0 - 2.0);
        assert_eq!(out[1], -2.0);
    }

    /// A hand-built Q5_K block: element `32 j + l` takes its fifth bit from bit `j` of
    /// `qh[l]`, and the device layout reads back the file's values bit for bit.
    #[test]
    fn q5_k_takes_each_elements_fifth_bit_from_its_sub_blocks_bit() {
        let mut block = vec![0u8; 176];
        block[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        block[2..4].copy_from_slice(&f16::from_f32(0.25).to_le_bytes());
        // Scales 1..=8 and mins 8..=1 for sub-blocks 0..8 (6-bit packing: the first
        // four in the low bits of bytes 0..4 / 4..8, the rest in nibbles of 8..12).
        for j in 0..4 {
            block[4 + j] = 1 + j as u8;
            block[8 + j] = 8 - j as u8;
            block[12 + j] = (5 + j as u8) | ((4 - j as u8) << 4);
        }
        // qh[3]: bit 2 (element 64 + 3) and bit 7 (element 224 + 3).
        block[16 + 3] = (1 << 2) | (1 << 7);
        // qs[32 + 3]: chunk 1, element 64 + 3's low nibble 6, element 96 + 3's 9.
        block[48 + 32 + 3] = 6 | (9 << 4);
        let mut out = [0f32; 256];
        dequantize_q5_k(&block, &mut out);
        let (sc, m) = q4k_scale_min(&block[4..16]);
        assert_eq!(
            (sc, m),
            ([1, 2, 3, 4, 5, 6, 7, 8], [8, 7, 6, 5, 4, 3, 2, 1])
        );
        let value = |j: usize, q: u32| 0.5 * sc[j] as f32 * q as f32 - 0.25 * m[j] as f32;
        assert_eq!(out[64 + 3], value(2, 6 + 16));
        assert_eq!(out[96 + 3], value(3, 9));
        assert_eq!(out[224 + 3], value(7, 16));
        assert_eq!(out[224 + 4], value(7, 0));
        let mut state = 0x1234_5678_9ABC_DEF1u64;
        super_block_packs_exactly(GgmlType::Q5_K, &block, &out, 180, &mut state);
    }

    /// Super-block `block` of type `ty` (dequantized: `values`) packs into a layout of
    /// `device_bytes` that reads back `values` bit for bit, and so do 12 random blocks
    /// (from `state`) packed as a 3 x 1024 matrix, which it returns.
    fn super_block_packs_exactly(
        ty: GgmlType,
        block: &[u8],
        values: &[f32],
        device_bytes: usize,
        state: &mut u64,
    ) -> Vec<u8> {
        let same = |a: &[f32], b: &[f32]| a.iter().zip(b).all(|(a, b)| a.to_bits() == b.to_bits());
        let packed = PackedMatrix::pack(ty, block, 1, 256, "w").unwrap();
        assert_eq!(packed.ggml_type(), ty.device_type(256));
        assert_eq!(packed.device_bytes(), device_bytes);
        assert!(same(&packed.dequantize(), values), "{ty}: hand-built block");
        let bytes = random_blocks(ty, 12, state);
        let want = dequantize(ty, &bytes, 12 * 256, "w").unwrap();
        let got = PackedMatrix::pack(ty, &bytes, 3, 1024, "w").unwrap();
        assert!(same(&got.dequantize(), &want), "{ty}: random blocks");
        bytes
    }

    /// A hand-built Q3_K block, its scales unpacked as llama.cpp's `dequantize_row_q3_K`
    /// does (four little-endian words and its masks): element `128 h + 32 g + l` takes
    /// its low bits from `qs[32 h + l]` at bit `2 g`, loses 4 where bit `4 h + g` of
    /// `hmask[l]` is clear, and uses scale `8 h + 2 g + l / 16`. The device layout (130
    /// bytes) puts each `q + 4` and scale where the kernels look and reads back the same
    /// values bit for bit, random blocks too.
    #[test]
    fn q3_k_unpacks_like_llama_cpp_and_packs_exactly_at_130_bytes() {
        let mut block = vec![0u8; 110];
        for (i, b) in block[96..108].iter_mut().enumerate() {
            *b = (i as u8).wrapping_mul(37) ^ 0x5A;
        }
        block[108..].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        let word =
            |i: usize| u32::from_le_bytes(block[96 + 4 * i..100 + 4 * i].try_into().unwrap());
        let (k1, k2, tmp) = (0x0303_0303u32, 0x0f0f_0f0fu32, word(2));
        let aux = [
            (word(0) & k2) | ((tmp & k1) << 4),
            (word(1) & k2) | (((tmp >> 2) & k1) << 4),
            ((word(0) >> 4) & k2) | (((tmp >> 4) & k1) << 4),
            ((word(1) >> 4) & k2) | (((tmp >> 6) & k1) << 4),
        ];
        let want: Vec<i8> = aux
            .iter()
            .flat_map(|w| w.to_le_bytes())
            .map(|b| b as i8 - 32)
            .collect();
        assert_eq!(q3k_scales(&block[96..108]).to_vec(), want);
        // Element 128 + 64 + 5: low bits 3, high bit set (bit 6 of hmask[5]): q = 3.
        block[32 + 32 + 5] = 3 << 4;
        block[5] = 1 << 6;
        // Element 32 + 20: low bits 2, high bit clear: q = -2.
        block[32 + 20] = 2 << 2;
        let mut out = [0f32; 256];
        dequantize_q3_k(&block, &mut out);
        let sc = q3k_scales(&block[96..108]);
        assert_eq!(out[128 + 64 + 5], 0.5 * sc[12] as f32 * 3.0);
        assert_eq!(out[32 + 20], 0.5 * sc[3] as f32 * -2.0);
        assert_eq!(out[5], 0.5 * sc[0] as f32 * -4.0);
        let mut state = 0x0BAD_5EED_1234_5678u64;
        let packed = PackedMatrix::pack(GgmlType::Q3_K, &block, 1, 256, "w").unwrap();
        let PackedMatrix::Q3K { q, .. } = &packed else {
            panic!("Q3_K packs as Q3_K");
        };
        // Element 192 + 5 (block 6, element 4 * 1 + 1): `q + 4 = 7` in field 1 of byte 1
        // of the block's first word, its high bit at bit 8 + 1 of the block's third;
        // element 32 + 20 (block 1, 16 + 4 * 1 + 0): `q + 4 = 2`, field 1 of byte 0 of
        // its second word, no high bit. Block 6's scales in its fourth word.
        assert_eq!((q[6 * 4] >> 10) & 3, 3);
        assert_eq!((q[6 * 4 + 2] >> 9) & 1, 1);
        assert_eq!(((q[4 + 1] >> 2) & 3, (q[4 + 2] >> 4) & 1), (2, 0));
        let byte = |k: usize| u32::from(sc[k] as u8);
        assert_eq!(q[6 * 4 + 3], byte(12) | (byte(13) << 8));
        let bytes = super_block_packs_exactly(GgmlType::Q3_K, &block, &out, 130, &mut state);
        // Every quant and every scale Q3_K can hold turns up.
        let qs: std::collections::BTreeSet<i8> = (0..12 * 256)
            .map(|e| q3k_quant(&bytes[e / 256 * 110..], e % 256))
            .collect();
        assert_eq!(qs, (-4..4).collect());
    }

    /// A hand-built IQ4_XS super-block, unpacked as llama.cpp's `dequantize_row_iq4_xs`
    /// does: block `j`'s scale is the low or high nibble (`j % 2`) of `scales_l[j / 2]`
    /// with bits `2 j..2 j + 2` of `scales_h` above it, less 32; element `l` of a block
    /// is the low nibble of its `qs[l]`, `l + 16` the high one. The device layout (138
    /// bytes) puts each index where `byte_perm` selects it and reads back the same values
    /// bit for bit, random blocks too.
    #[test]
    fn iq4_xs_unpacks_like_llama_cpp_and_packs_exactly_at_138_bytes() {
        let mut block = vec![0u8; 136];
        block[..2].copy_from_slice(&f16::from_f32(0.25).to_le_bytes());
        // Block 5: ls = 0b10_0111 = 39 (scale 7): low nibble 7 in the high half of
        // scales_l[2], high bits 2 at bits 10..12 of scales_h.
        block[4 + 2] = 7 << 4;
        block[2..4].copy_from_slice(&(2u16 << 10).to_le_bytes());
        // Block 0: ls = 0 (scale -32).
        // Element 5 * 32 + 16 + 3: index 15 (113), the high nibble of qs[3] of block 5.
        block[8 + 5 * 16 + 3] = 15 << 4;
        // Element 2: index 1 (-104), the low nibble of block 0's qs[2].
        block[8 + 2] = 1;
        let mut out = [0f32; 256];
        dequantize_iq4_xs(&block, &mut out);
        assert_eq!(iq4_xs_scale(&block, 5), 39);
        assert_eq!(iq4_xs_scale(&block, 0), 0);
        assert_eq!(out[5 * 32 + 16 + 3], 0.25 * 7.0 * 113.0);
        assert_eq!(out[2], 0.25 * -32.0 * -104.0);
        assert_eq!(out[3], 0.25 * -32.0 * -127.0);
        let packed = PackedMatrix::pack(GgmlType::IQ4_XS, &block, 1, 256, "w").unwrap();
        let PackedMatrix::IQ4XS { q, scales, d, .. } = &packed else {
            panic!("IQ4_XS packs as IQ4_XS");
        };
        // Element 16 + 3 of block 5 (word 0 of the block, h = 1, b = 3): nibble 7, bits
        // 28..32 of the block's first word; element 2 of block 0: bits 8..12 of word 0.
        assert_eq!(q[5 * 4] >> 28, 15);
        assert_eq!((q[0] >> 8) & 15, 1);
        assert_eq!((scales[0], scales[5], d[0].to_f32()), (0, 39, 0.25));
        let mut state = 0x1A4_C0DE_5EED_0001u64;
        super_block_packs_exactly(GgmlType::IQ4_XS, &block, &out, 138, &mut state);
        // Every block scale the format can hold, in every block, packs and reads back.
        for ls in 0..64u8 {
            for j in 0..8 {
                let mut b = block.clone();
                let high = u16::from_le_bytes([b[2], b[3]]) & !(3 << (2 * j));
                b[2..4].copy_from_slice(&(high | u16::from(ls >> 4) << (2 * j)).to_le_bytes());
                b[4 + j / 2] = (b[4 + j / 2] & !(15 << (4 * (j % 2)))) | (ls & 15) << (4 * (j % 2));
                assert_eq!(iq4_xs_scale(&b, j), ls);
                let packed = PackedMatrix::pack(GgmlType::IQ4_XS, &b, 1, 256, "w").unwrap();
                let mut want = [0f32; 256];
                dequantize_iq4_xs(&b, &mut want);
                assert_eq!(packed.dequantize(), want.to_vec(), "ls {ls} in block {j}");
            }
        }
    }

    /// A hand-built Q5_0 block: the fifth bit of element `e` is bit `e` of `qh`, the
    /// low nibbles of elements 0..16 and 16..32 share bytes.
    #[test]
    fn q5_0_takes_each_elements_fifth_bit_from_its_own_bit() {
        let mut block = vec![0u8; 22];
        block[..2].copy_from_slice(&f16::from_f32(0.5).to_le_bytes());
        // qh: elements 1 and 17 have their fifth bit set.
        block[2..6].copy_from_slice(&((1u32 << 1) | (1u32 << 17)).to_le_bytes());
        // qs[1]: element 1's nibble 3, element 17's nibble 9.
        block[6 + 1] = 3 | (9 << 4);
        let mut out = [0f32; 32];
        dequantize_q5_0(&block, &mut out);
        assert_eq!(out[1], 0.5 * (3 + 16 - 16) as f32);
        assert_eq!(out[17], 0.5 * (9 + 16 - 16) as f32);
        assert_eq!(out[0], 0.5 * -16.0);
        assert_eq!(out[16], 0.5 * -16.0);
        let mut q4 = vec![0u8; 18];
        q4[..2].copy_from_slice(&f16::from_f32(2.0).to_le_bytes());
        q4[2 + 15] = 0xF0;
        let mut out = [0f32; 32];
        dequantize_q4_0(&q4, &mut out);
        assert_eq!((out[15], out[31], out[0]), (-16.0, 14.0, -16.0));
    }
}
