//! Causal attention forward (prefill), the FlashAttention-2 algorithm, written in the
//! kernel language.
//!
//! One program computes one tile of `BLOCK_M` query rows of one query head. Its Q tile
//! is re-read from L2 next to every key tile (both operands of the first `dot` then
//! stream through the `cp.async` ring); the keys and values of its KV head stream
//! through in tiles of
//! `BLOCK_N` rows. For each key tile the program computes the scores with `dot`
//! (bf16 operands, f32 accumulation), keeps a running row maximum `m` and a running sum
//! `l` of the exponentials (the *online softmax*), rescales its f32 accumulator by
//! `2^(m_old - m_new)` and adds `P V` with a second `dot`. The output is divided by `l`
//! once, at the end.
//!
//! - **Causal.** Query row `i` attends to keys `j <= i`. The key loop runs in two parts:
//!   the tiles entirely below the diagonal (no mask at all: every key precedes every
//!   query row of the tile and lies inside the sequence), then the tiles on the diagonal
//!   (masked), and it stops there: a program never touches a key after its last row.
//! - **GQA.** Query head `h` reads KV head `h / (num_heads / num_kv_heads)`.
//! - **Scale.** Scores are scaled by `sm_scale` (use `1 / sqrt(D)`) with `log2(e)` folded
//!   in, so the exponentials are `exp2`, as in FlashAttention-2.
//! - **K transposed without a transpose.** The first `dot` needs K as a `[D, BLOCK_N]`
//!   tile; the program loads it that way directly, with the pointer arithmetic of a
//!   transposed view (`docs/language.md`, "Idioms").
//! - **Rounding.** Q, K, V and the output are bf16; scores, softmax statistics and the
//!   accumulator are f32. The probabilities are rounded to bf16 for the `P V` product
//!   (as FlashAttention-2 and Triton's tutorial do); `l` sums them unrounded.
//!
//! # Layouts (row-major, no padding)
//!
//! | tensor | shape | element `[t, h, d]` at |
//! |---|---|---|
//! | `q`, `out` | `[seq, num_heads, D]` | `(t * num_heads + h) * D + d` |
//! | `k`, `v` | `[seq, num_kv_heads, D]` | `(t * num_kv_heads + h) * D + d` |
//!
//! This is the layout a fused QKV projection produces once split (`[tokens, heads,
//! head_dim]`); `D` is 128.
//!
//! # Example
//!
//! ```
//! use tilefuse::kernels::flash_attention::{self, AttentionShape, FlashConfig};
//! use tilefuse::prelude::*;
//!
//! let dev = Device::cpu();
//! let shape = AttentionShape { seq: 3, num_heads: 2, num_kv_heads: 1, head_dim: 128 };
//! let q = dev.upload(&vec![bf16::from_f32(0.5); 3 * 2 * 128]).unwrap();
//! let k = dev.upload(&vec![bf16::from_f32(0.25); 3 * 128]).unwrap();
//! // Value rows 1, 2, 3: with equal scores, row t averages the first t + 1 of them.
//! let v: Vec<bf16> = (0..3 * 128).map(|i| bf16::from_f32((i / 128 + 1) as f32)).collect();
//! let v = dev.upload(&v).unwrap();
//! let mut out = dev.alloc_filled(3 * 2 * 128, bf16::NAN).unwrap();
//! flash_attention::launch(&dev, &q, &k, &v, &mut out, shape, FlashConfig::SMALL).unwrap();
//! let out = out.to_vec().unwrap();
//! assert_eq!(out[0].to_f32(), 1.0); // token 0, head 0
//! assert_eq!(out[128].to_f32(), 1.0); // token 0, head 1 (same KV head)
//! assert_eq!(out[2 * 256].to_f32(), 2.0); // token 2: (1 + 2 + 3) / 3
//! ```

use tilefuse_dsl::half::bf16;
use tilefuse_dsl::runtime::{Buffer, Device, LaunchConfig, LaunchError};
use tilefuse_macros::kernel;

/// The FlashAttention-2 forward kernel: see the [module documentation](self) for the
/// algorithm and the layouts, and [`launch`] for the checked entry point.
///
/// Grid: `(num_heads, cdiv(seq, BLOCK_M))`. `BLOCK_N` divides `BLOCK_M` (both powers of
/// two, `BLOCK_N <= BLOCK_M`), so the unmasked part of the key loop ends exactly at the
/// program's first query row. `num_heads` is a multiple of `num_kv_heads`.
#[kernel(
    crate = tilefuse_dsl,
    BLOCK_M = [128, 64, 16],
    BLOCK_N = [64, 32, 16],
    D = [128],
    num_warps = [4, 8],
    skip(BLOCK_M = 16, BLOCK_N = 64),
    skip(BLOCK_M = 16, BLOCK_N = 32),
    skip(BLOCK_M = 16, num_warps = 8),
    skip(BLOCK_N = 16, num_warps = 8),
    skip(BLOCK_M = 128, BLOCK_N = 32),
    skip(BLOCK_M = 128, BLOCK_N = 16),
    skip(BLOCK_M = 128, num_warps = 4),
    skip(BLOCK_N = 64, num_warps = 4)
)]
#[allow(clippy::too_many_arguments)]
pub fn flash_attention_fwd<const BLOCK_M: usize, const BLOCK_N: usize, const D: usize>(
    q: Ptr<bf16>,
    k: Ptr<bf16>,
    v: Ptr<bf16>,
    out: Ptr<bf16>,
    seq: i32,
    num_heads: i32,
    num_kv_heads: i32,
    sm_scale: f32,
) {
    // Heads along x (fastest in launch order) and query tiles along y in reverse: every
    // head's longest tiles (the last rows, the most keys) start first, the short ones
    // fill the tail of the grid.
    let head = program_id(0);
    let start_m = num_programs(1) - 1 - program_id(1);
    let kv_head = head / (num_heads / num_kv_heads);
    let q_stride = num_heads * D;
    let kv_stride = num_kv_heads * D;
    let rows = start_m * BLOCK_M + arange(0, BLOCK_M);
    let row_ok = rows < seq;
    let dims = arange(0, D);
    // The Q tile is loaded inside the key loops, next to the key tile: both operands of
    // `q k^T` are then plain loads and stream through the `cp.async` ring into shared
    // memory (from L2 after the first step), where the tensor cores read them, instead
    // of sitting in registers and being stored to shared memory before every product.
    let q_ptrs = q + head * D + rows.expand_dims(1) * q_stride + dims.expand_dims(0);
    // Scores in base 2: exp(x * sm_scale) = exp2(x * sm_scale * log2(e)).
    let qk_scale = sm_scale * 1.442_695_f32;
    let k_head = k + kv_head * D;
    let v_head = v + kv_head * D;
    let mut m_i = full([BLOCK_M], f32::NEG_INFINITY);
    let mut l_i = zeros::<f32>([BLOCK_M]);
    let mut acc = zeros::<f32>([BLOCK_M, D]);

    // Key tiles strictly below the diagonal: no masks.
    let lo = start_m * BLOCK_M;
    for start_n in (0..lo).step_by(BLOCK_N) {
        let keys = start_n + arange(0, BLOCK_N);
        // K^T as a [D, BLOCK_N] tile: column j is key row `keys[j]`.
        let q_tile = load(q_ptrs, row_ok.expand_dims(1), 0.0);
        let k_t = load(k_head + keys.expand_dims(0) * kv_stride + dims.expand_dims(1));
        let s = dot(q_tile, k_t) * qk_scale;
        let m_new = maximum(m_i, s.max(1));
        let p = exp2(s - m_new.expand_dims(1));
        let alpha = exp2(m_i - m_new);
        l_i = l_i * alpha + p.sum(1);
        let v_tile = load(v_head + keys.expand_dims(1) * kv_stride + dims.expand_dims(0));
        acc = dot(p as bf16, v_tile, acc * alpha.expand_dims(1));
        m_i = m_new;
    }

    // Key tiles on the diagonal, masked, up to the tile's last row (or the sequence's
    // end). Every query row has seen at least key 0 by its first masked tile, so `m_i`
    // is finite there and a fully masked row gets `p = 0`, never NaN.
    let hi = minimum(lo + BLOCK_M, seq);
    for start_n in (lo..hi).step_by(BLOCK_N) {
        let keys = start_n + arange(0, BLOCK_N);
        let key_ok = keys < seq;
        let q_tile = load(q_ptrs, row_ok.expand_dims(1), 0.0);
        let k_t = load(
            k_head + keys.expand_dims(0) * kv_stride + dims.expand_dims(1),
            key_ok.expand_dims(0),
            0.0,
        );
        let causal = keys.expand_dims(0) <= rows.expand_dims(1);
        let s = select(causal, dot(q_tile, k_t) * qk_scale, f32::NEG_INFINITY);
        let m_new = maximum(m_i, s.max(1));
        let p = exp2(s - m_new.expand_dims(1));
        let alpha = exp2(m_i - m_new);
        l_i = l_i * alpha + p.sum(1);
        let v_tile = load(
            v_head + keys.expand_dims(1) * kv_stride + dims.expand_dims(0),
            key_ok.expand_dims(1),
            0.0,
        );
        acc = dot(p as bf16, v_tile, acc * alpha.expand_dims(1));
        m_i = m_new;
    }

    let o = acc / l_i.expand_dims(1);
    store(
        out + head * D + rows.expand_dims(1) * q_stride + dims.expand_dims(0),
        o as bf16,
        row_ok.expand_dims(1),
    );
}

/// The head size the kernel is compiled for.
pub const HEAD_DIM: usize = 128;

/// The sizes of one attention call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AttentionShape {
    /// Tokens (query rows = key rows; causal prefill).
    pub seq: usize,
    /// Query heads.
    pub num_heads: usize,
    /// Key/value heads; divides `num_heads` (GQA: query head `h` reads KV head
    /// `h / (num_heads / num_kv_heads)`).
    pub num_kv_heads: usize,
    /// Head size; must be [`HEAD_DIM`].
    pub head_dim: usize,
}

impl AttentionShape {
    /// Elements of `q` and `out`: `seq × num_heads × head_dim`.
    pub fn q_len(&self) -> usize {
        self.seq * self.num_heads * self.head_dim
    }

    /// Elements of `k` and of `v`: `seq × num_kv_heads × head_dim`.
    pub fn kv_len(&self) -> usize {
        self.seq * self.num_kv_heads * self.head_dim
    }

    /// Floating-point operations of causal attention, counted the usual way (as the
    /// FlashAttention papers and Triton's tutorial do): two matrix products of
    /// `2 × seq² × head_dim` each per head, halved by the mask.
    pub fn causal_flops(&self) -> f64 {
        let (s, d, h) = (self.seq as f64, self.head_dim as f64, self.num_heads as f64);
        2.0 * 2.0 * s * s * d * h / 2.0
    }
}

/// Tile sizes and warps of one compiled variant of [`flash_attention_fwd`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FlashConfig {
    /// Query rows per program.
    pub block_m: usize,
    /// Keys per iteration.
    pub block_n: usize,
    /// Warps per program.
    pub num_warps: u32,
}

impl FlashConfig {
    /// The GPU default: 64 query rows, 32 keys per step, 4 warps.
    pub const DEFAULT: FlashConfig = FlashConfig {
        block_m: 64,
        block_n: 32,
        num_warps: 4,
    };

    /// Small tiles (16 × 16): more loop iterations on short sequences, and quick on the
    /// CPU interpreter.
    pub const SMALL: FlashConfig = FlashConfig {
        block_m: 16,
        block_n: 16,
        num_warps: 4,
    };

    /// 128 query rows, 64 keys per step, 8 warps (dynamic shared memory; on Hopper both
    /// products run on `wgmma`): long sequences. The fastest measured at 4k and 16k
    /// tokens on an H200, within 1% of the best at 1k (docs/perf.md, "Flash attention on
    /// `wgmma`").
    pub const LARGE: FlashConfig = FlashConfig {
        block_m: 128,
        block_n: 64,
        num_warps: 8,
    };

    /// Every compiled variant: the GPU candidates first, [`FlashConfig::SMALL`] last.
    pub const ALL: [FlashConfig; 6] = [
        FlashConfig::LARGE,
        FlashConfig {
            block_m: 64,
            block_n: 64,
            num_warps: 8,
        },
        FlashConfig::DEFAULT,
        FlashConfig {
            block_m: 64,
            block_n: 32,
            num_warps: 8,
        },
        FlashConfig {
            block_m: 64,
            block_n: 16,
            num_warps: 4,
        },
        FlashConfig::SMALL,
    ];
}

impl Default for FlashConfig {
    fn default() -> FlashConfig {
        FlashConfig::DEFAULT
    }
}

/// Checks the shape against the buffers and queues causal attention:
/// `out = softmax(q k^T * sm_scale + causal mask) v` per query head, with
/// `sm_scale = 1 / sqrt(head_dim)`.
///
/// Layouts are in the [module documentation](self). On a GPU the launch is queued on the
/// device's stream; on the CPU the interpreter runs it to completion.
///
/// # Errors
///
/// [`LaunchError::Config`] naming the offending size or tensor when `head_dim` is not
/// [`HEAD_DIM`], `num_kv_heads` is zero or does not divide `num_heads`, `seq` is zero or
/// the offsets would overflow 32 bits, or a buffer is shorter than the shape needs;
/// otherwise whatever the launch itself reports (for instance a `cfg` with no compiled
/// variant, listing the variants).
pub fn launch(
    dev: &Device,
    q: &Buffer<bf16>,
    k: &Buffer<bf16>,
    v: &Buffer<bf16>,
    out: &mut Buffer<bf16>,
    shape: AttentionShape,
    cfg: FlashConfig,
) -> Result<(), LaunchError> {
    let bad = |message: String| LaunchError::Config {
        kernel: "flash_attention_fwd".into(),
        message,
    };
    let AttentionShape {
        seq,
        num_heads,
        num_kv_heads,
        head_dim,
    } = shape;
    if head_dim != HEAD_DIM {
        return Err(bad(format!(
            "head_dim {head_dim}: only {HEAD_DIM} is compiled"
        )));
    }
    if num_kv_heads == 0 || num_heads == 0 || num_heads % num_kv_heads != 0 {
        return Err(bad(format!(
            "num_heads {num_heads} must be a positive multiple of num_kv_heads {num_kv_heads}"
        )));
    }
    if seq == 0 {
        return Err(bad("seq is 0: nothing to attend".into()));
    }
    if shape.q_len() > i32::MAX as usize {
        return Err(bad(format!(
            "seq {seq} x num_heads {num_heads} x head_dim {head_dim} elements overflow the kernel's 32-bit offsets"
        )));
    }
    for (name, len, need) in [
        ("q", q.len(), shape.q_len()),
        ("k", k.len(), shape.kv_len()),
        ("v", v.len(), shape.kv_len()),
        ("out", out.len(), shape.q_len()),
    ] {
        if len < need {
            return Err(bad(format!(
                "tensor `{name}` holds {len} elements; [seq {seq}, heads, head_dim {head_dim}] needs {need}"
            )));
        }
    }
    let grid_m = seq.div_ceil(cfg.block_m) as u32;
    FLASH_ATTENTION_FWD.launch_dyn(
        dev,
        LaunchConfig::from((num_heads as u32, grid_m)).num_warps(cfg.num_warps),
        &[cfg.block_m as i64, cfg.block_n as i64, HEAD_DIM as i64],
        &mut [
            q.into(),
            k.into(),
            v.into(),
            out.into(),
            (seq as i32).into(),
            (num_heads as i32).into(),
            (num_kv_heads as i32).into(),
            (1.0 / (head_dim as f32).sqrt()).into(),
        ],
    )
}

/// Host reference in f64 for one output row: token `t`, query head `h`, in the layouts
/// above (causal, GQA, scale `1 / sqrt(head_dim)`), from the bf16 inputs, unrounded.
///
/// Costs `t × head_dim` multiply-adds twice: cheap enough to spot-check rows of a long
/// sequence.
///
/// # Panics
///
/// If `t` or `h` is out of range or a slice is shorter than `shape` needs.
pub fn reference_row(
    q: &[bf16],
    k: &[bf16],
    v: &[bf16],
    shape: AttentionShape,
    t: usize,
    h: usize,
) -> Vec<f64> {
    let AttentionShape {
        seq,
        num_heads,
        num_kv_heads,
        head_dim: d,
    } = shape;
    assert!(t < seq && h < num_heads, "row ({t}, {h}) outside {shape:?}");
    let kvh = h / (num_heads / num_kv_heads);
    let scale = 1.0 / (d as f64).sqrt();
    let qr = &q[(t * num_heads + h) * d..][..d];
    let scores: Vec<f64> = (0..=t)
        .map(|j| {
            let kr = &k[(j * num_kv_heads + kvh) * d..][..d];
            let dot: f64 = qr
                .iter()
                .zip(kr)
                .map(|(a, b)| a.to_f64() * b.to_f64())
                .sum();
            dot * scale
        })
        .collect();
    let max = scores.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let weights: Vec<f64> = scores.iter().map(|s| (s - max).exp()).collect();
    let sum: f64 = weights.iter().sum();
    let mut o = vec![0.0f64; d];
    for (j, w) in weights.iter().enumerate() {
        let vr = &v[(j * num_kv_heads + kvh) * d..][..d];
        for (o, x) in o.iter_mut().zip(vr) {
            *o += w / sum * x.to_f64();
        }
    }
    o
}

/// The largest absolute difference between the output `out` (`[seq, num_heads,
/// head_dim]`) and [`reference_row`] over the `(t, h)` rows in `rows`; a NaN (an element
/// left unwritten in a poisoned output) counts as infinite.
///
/// # Panics
///
/// As [`reference_row`], or if `out` is shorter than `shape` needs.
pub fn max_error(
    out: &[bf16],
    q: &[bf16],
    k: &[bf16],
    v: &[bf16],
    shape: AttentionShape,
    rows: &[(usize, usize)],
) -> f64 {
    let d = shape.head_dim;
    let mut worst = 0.0f64;
    for &(t, h) in rows {
        let want = reference_row(q, k, v, shape, t, h);
        let row = &out[(t * shape.num_heads + h) * d..][..d];
        for (g, w) in row.iter().zip(&want) {
            let e = (g.to_f64() - w).abs();
            worst = if e.is_nan() {
                f64::INFINITY
            } else {
                worst.max(e)
            };
        }
    }
    worst
}
