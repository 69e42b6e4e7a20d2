//! GEMVs over quantized weights (Q8_0, Q4_K, Q6_K), written in tilefuse's kernel
//! language: the weights stream in the device layout of
//! [`PackedMatrix`](crate::gguf::quant::PackedMatrix) and are dequantized in registers,
//! with f32 accumulation.
//!
//! Each type has one kernel with two variants (the `RESIDUAL` constant), the two shapes
//! of projection the decode step needs that do not fuse a norm (see [`crate::kernels`]):
//!
//! - `RESIDUAL = 0`: `y = bf16(W · a + bias)`;
//! - `RESIDUAL = 1`: `x = bf16(x + bf16(W · a + bias))`, as
//!   [`gemv_residual`](crate::kernels::gemv_residual).
//!
//! Tiles are rank 3 or 4 so that the block structure is a tile axis and no reshape is
//! needed: a Q8_0 tile is `[BLOCK_N, BLOCK_K / 32, 32]` (rows, blocks, elements) with
//! the block scales `[BLOCK_N, BLOCK_K / 32]`; a K-quant tile is
//! `[BLOCK_N, BLOCK_K / 64, 2, 32]` (rows, 64-element chunks, nibble, byte), so the
//! quant bytes load as `[BLOCK_N, BLOCK_K / 64, 1, 32]` and the nibble axis comes from
//! a shift, and the sub-block scales (one per 32 elements) are `[BLOCK_N, BLOCK_K / 64,
//! 2]`. Each block's dot product is summed first and scaled once: `d * Σ q·a` (Q8_0),
//! `d·sc * Σ q·a − dmin·m * Σ a` (Q4_K), `d * Σ sc·q·a` (Q6_K). The columns `k` must be
//! a multiple of 256 (of 32 for Q8_0), as the formats require; `BLOCK_K` may exceed `k`.
//!
//! As in the bf16 kernels, the first weight tile is requested before
//! `wait_for_prior_kernels()`, so with programmatic launch it overlaps the previous
//! kernel's tail.

use tilefuse_macros::kernel;

/// Every kernel description in this module, for tooling (offline assembly, inspection).
pub fn all() -> [&'static tilefuse_dsl::runtime::KernelDef; 1] {
    [&Q8_0_GEMV]
}

/// `y = bf16(W · a + bias)` for a Q8_0 matrix `W` of shape `[n, k]` (`q: u8[n, k]`,
/// `d: f16[n, k / 32]`); with `RESIDUAL = 1`, `x = bf16(x + bf16(W · a + bias))` with
/// `x` in place of `y`.
#[kernel(
    crate = tilefuse_dsl,
    BLOCK_N = [1, 2, 4, 8],
    BLOCK_K = [256, 512, 1024],
    num_warps = [4, 8],
    RESIDUAL = [0, 1]
)]
pub fn q8_0_gemv<const BLOCK_N: usize, const BLOCK_K: usize, const RESIDUAL: usize>(
    q: Ptr<u8>,
    d: Ptr<f16>,
    a: Ptr<bf16>,
    bias: Ptr<bf16>,
    y: Ptr<bf16>,
    n: i32,
    #[multiple_of(32)] k: i32,
) {
    let rows = program_id(0) * BLOCK_N + arange(0, BLOCK_N);
    let row_ok = rows < n;
    let blk = arange(0, BLOCK_K / 32);
    let lane = arange(0, 32);
    // Offsets of a tile's elements from its first column: [BLOCK_K / 32, 32].
    let offs = blk.expand_dims(1) * 32 + lane.expand_dims(0);
    let q_rows = (rows * k).expand_dims(1).expand_dims(2);
    let d_rows = (rows * (k / 32)).expand_dims(1);
    let ok3 = row_ok.expand_dims(1).expand_dims(2);
    let ok2 = row_ok.expand_dims(1);

    let q_first = load(
        q + q_rows + offs.expand_dims(0),
        ok3 & (offs < k).expand_dims(0),
        128,
    );
    let d_first = load(
        d + d_rows + blk.expand_dims(0),
        ok2 & (blk * 32 < k).expand_dims(0),
        0.0,
    );
    let b = load(bias + rows, row_ok, 0.0) as f32;
    wait_for_prior_kernels();
    let mut old = zeros::<f32>([BLOCK_N]);
    if RESIDUAL == 1 {
        old = load(y + rows, row_ok, 0.0) as f32;
    }
    let av = load(a + offs, offs < k, 0.0) as f32;
    let dots = (((q_first as i32) - 128) as f32 * av.expand_dims(0)).sum(2);
    let mut sums = (dots * (d_first as f32)).sum(1);
    for k0 in (BLOCK_K..k).step_by(BLOCK_K) {
        let cols = k0 + offs;
        let col_ok = cols < k;
        let qt = load(
            q + q_rows + cols.expand_dims(0),
            ok3 & col_ok.expand_dims(0),
            128,
        );
        let blocks = k0 / 32 + blk;
        let dt = load(
            d + d_rows + blocks.expand_dims(0),
            ok2 & (blocks * 32 < k).expand_dims(0),
            0.0,
        );
        let av = load(a + cols, col_ok, 0.0) as f32;
        let dots = (((qt as i32) - 128) as f32 * av.expand_dims(0)).sum(2);
        sums += (dots * (dt as f32)).sum(1);
    }
    let proj = (sums + b) as bf16;
    if RESIDUAL == 1 {
        store(y + rows, (old + proj as f32) as bf16, row_ok);
    } else {
        store(y + rows, proj, row_ok);
    }
}
