//! A projection's weights on the device: dense bf16 rows read by the kernels of
//! [`crate::kernels`], or quantized rows (GGUF's K-quants and 32-element types) read by those of
//! [`crate::kernels_quant`], chosen per weight from the file's type. The step
//! (`step.rs`) launches the dense kernel for [`Matrix::Dense`] and hands a
//! [`Matrix::Quant`] to [`QuantMatrix::gemv`] / [`QuantMatrix::lm_head`], which launch
//! the same variant of the quantized GEMV for each run of rows of one type.

use half::bf16;
use tilefuse_dsl::runtime::{Buffer, Device, LaunchConfig};

use crate::error::{EngineError, Result};
use crate::gguf::device::{
    launch_q4_k_q6_k, stamps_const, DeviceQuantMatrix, MergeRuns, QuantGemvConfig, QuantOut,
    QuantRows, QuantSpare, QuantTiles, QuantVariant, StampSlots, TokensTile,
};
use crate::gguf::quant::{GgmlType, PackedMatrix};

/// A projection's weights, `[rows, cols]` row-major.
#[derive(Debug)]
pub(crate) enum Matrix {
    /// bf16 rows.
    Dense(Buffer<bf16>),
    /// Quantized rows, in runs of one type.
    Quant(QuantMatrix),
}

impl Matrix {
    /// Bytes one GEMV over the matrix reads.
    pub(crate) fn bytes(&self) -> usize {
        match self {
            Matrix::Dense(w) => 2 * w.len(),
            Matrix::Quant(q) => q.bytes(),
        }
    }

    /// The matrix as the batched prefill reads it.
    pub(crate) fn prefill_weight(&self) -> crate::prefill::PrefillWeight<'_> {
        match self {
            Matrix::Dense(w) => crate::prefill::PrefillWeight::dense(w),
            Matrix::Quant(q) => crate::prefill::PrefillWeight::quant(q),
        }
    }

    /// Whether a normed GEMV over this `[gate; up]` matrix writes the down projection's
    /// int8 input itself ([`QuantMatrix::silu_quantizes`]; never for dense rows).
    pub(crate) fn silu_quantizes(&self) -> bool {
        match self {
            Matrix::Dense(_) => false,
            Matrix::Quant(q) => q.silu_quantizes(),
        }
    }

    /// The dense rows, or `None` for a quantized matrix.
    pub(crate) fn dense(&self) -> Option<&Buffer<bf16>> {
        match self {
            Matrix::Dense(w) => Some(w),
            Matrix::Quant(_) => None,
        }
    }

    /// A quantized matrix's first run's packed words (most of its bytes, its first rows
    /// first: what the GEMV's first programs read), or `None` for dense rows.
    pub(crate) fn quant_words(&self) -> Option<&Buffer<u32>> {
        match self {
            Matrix::Dense(_) => None,
            Matrix::Quant(q) => Some(q.parts[0].m.words()),
        }
    }

    /// Whether the words of [`Matrix::quant_words`] are Q8_0 (the prefetch budgets differ
    /// by type: [`crate::tuning::Q8_0_ATTENTION_PREFETCH_WORDS_BYTES`]).
    pub(crate) fn is_q8_0(&self) -> bool {
        match self {
            Matrix::Dense(_) => false,
            Matrix::Quant(q) => q.parts[0].m.ggml_type() == GgmlType::Q8_0,
        }
    }

    /// Kernel launches one GEMV over the matrix takes (quantized: the activation's
    /// quantization, unless the GEMV quantizes a normed input itself (`normed`,
    /// [`QuantMatrix::fuses_norm`]), then one per run of rows of one type).
    pub(crate) fn launches(&self, normed: bool) -> usize {
        match self {
            Matrix::Dense(_) => 1,
            Matrix::Quant(q) => {
                let fused = normed && q.fuses_norm();
                // Only the normed GEMVs (QKV, gate/up) merge runs: the merged kernel
                // has no residual.
                let runs = if normed && q.merged.is_some() {
                    1
                } else {
                    q.parts.len()
                };
                usize::from(!fused) + runs
            }
        }
    }
}

/// One run of rows of one type, and its launch configuration.
#[derive(Debug)]
struct Part {
    /// The first row of the run in the whole matrix (and in the output).
    row0: usize,
    m: DeviceQuantMatrix,
    cfg: QuantGemvConfig,
    /// The configuration when the GEMV quantizes its normed input itself.
    fused_cfg: QuantGemvConfig,
}

/// A quantized matrix on the device: consecutive runs of rows, each of one type.
#[derive(Debug)]
pub(crate) struct QuantMatrix {
    parts: Vec<Part>,
    /// Whether this is an LM head (its configurations are those of the head variant).
    head: bool,
    /// Whether a normed GEMV over it quantizes its input inside its launches
    /// ([`crate::gguf::device::fuses_norm`], decided once at upload so that the step's
    /// launches and its launch count agree).
    fuses_norm: bool,
    /// The tile at which a normed GEMV over this matrix (as `[gate; up]`) writes the
    /// down projection's int8 input itself, where it may
    /// ([`crate::gguf::device::silu_quantized_tile`], decided at upload).
    silu_tile: Option<QuantGemvConfig>,
    /// Which GEMVs over a Q4_K run followed by a Q6_K run launch them as one
    /// ([`crate::gguf::device::merge_runs`], decided at upload for the same reason).
    merge: MergeRuns,
    /// The tiles of the two runs where a normed GEMV over this matrix launches them as
    /// one ([`QuantMatrix::merged_tiles`], found when the tiles are set rather than at
    /// each launch).
    merged: Option<(QuantGemvConfig, QuantGemvConfig)>,
}

impl QuantMatrix {
    /// Uploads the row blocks `blocks` (stacked in order, equal columns), merging
    /// neighbours of one type into one run; each run launches as
    /// [`QuantGemvConfig::for_step`] says (`head`: the LM head).
    pub(crate) fn upload(
        dev: &Device,
        blocks: &[&PackedMatrix],
        head: bool,
    ) -> Result<QuantMatrix> {
        let mut parts = Vec::new();
        let mut row0 = 0;
        let mut i = 0;
        while i < blocks.len() {
            let ty = blocks[i].ggml_type();
            let run = blocks[i..]
                .iter()
                .take_while(|b| b.ggml_type() == ty)
                .count();
            let merged = PackedMatrix::concat_rows(&blocks[i..i + run])?;
            let (rows, cols) = merged.shape();
            parts.push(Part {
                row0,
                m: DeviceQuantMatrix::upload(dev, &merged)?,
                cfg: QuantGemvConfig::for_step(ty, rows, cols, head)?,
                fused_cfg: QuantGemvConfig::for_step_norm_fused(ty, rows, cols)?,
            });
            row0 += rows;
            i += run;
        }
        if parts.is_empty() {
            return Err(EngineError::Option {
                message: "a quantized matrix needs at least one block of rows".into(),
            });
        }
        let rows = parts.iter().map(|p| p.m.rows).sum();
        let fuses_norm = !head && crate::gguf::device::fuses_norm(rows, parts[0].m.cols)?;
        // One run (gate and up rows of one program share it).
        let silu_tile = match parts.as_slice() {
            [p] if !head => crate::gguf::device::silu_quantized_tile(fuses_norm)?
                .filter(|&cfg| p.m.silu_quantized_compiled(cfg, fuses_norm) && p.m.rows % 64 == 0),
            _ => None,
        };
        let mut m = QuantMatrix {
            parts,
            head,
            fuses_norm,
            silu_tile,
            merge: if head {
                MergeRuns::Never
            } else {
                crate::gguf::device::merge_runs()?
            },
            merged: None,
        };
        m.merged = m.merged_tiles();
        Ok(m)
    }

    /// Gives each run the configurations `tiles` names for its shape (its `norm:`
    /// entries for the GEMV that quantizes its normed input itself), else
    /// [`QuantGemvConfig::for_step`]'s and [`QuantGemvConfig::for_step_norm_fused`]'s.
    pub(crate) fn set_tiles(&mut self, tiles: &QuantTiles) -> Result<()> {
        for p in &mut self.parts {
            let (ty, rows, cols) = (p.m.ggml_type(), p.m.rows, p.m.cols);
            p.cfg = match tiles.get(ty, rows, cols) {
                Some(cfg) => {
                    cfg.check(self.head)?;
                    cfg
                }
                None => QuantGemvConfig::for_step(ty, rows, cols, self.head)?,
            };
            p.fused_cfg = match tiles.get_norm_fused(ty, rows, cols) {
                Some(cfg) => {
                    cfg.check(self.head)?;
                    cfg
                }
                None => QuantGemvConfig::for_step_norm_fused(ty, rows, cols)?,
            };
        }
        self.merged = self.merged_tiles();
        Ok(())
    }

    /// `(rows, cols)` of the whole matrix (every run).
    pub(crate) fn shape(&self) -> (usize, usize) {
        let rows = self.parts.iter().map(|p| p.m.rows).sum();
        (rows, self.parts[0].m.cols)
    }

    /// Runs of rows of one type (one dequantization launch each).
    pub(crate) fn runs(&self) -> usize {
        self.parts.len()
    }

    /// The whole matrix as bf16 rows into the row-major `out` (`[rows, cols]` or more),
    /// one launch a run ([`DeviceQuantMatrix::dequantize_into`]).
    pub(crate) fn dequantize_into(&self, dev: &Device, out: &mut Buffer<bf16>) -> Result<()> {
        for p in &self.parts {
            p.m.dequantize_into(dev, out, p.row0)?;
        }
        Ok(())
    }

    /// The multi-token GEMV over every run ([`DeviceQuantMatrix::gemv_tokens`], each
    /// at [`TokensTile::for_shape`]'s tile): `y[t] = bf16(W · x[t] + bias)` for each
    /// quantized row `t` of `x`, `ldy` elements a token; with `residual`, added into
    /// `y[t]`.
    pub(crate) fn gemv_tokens(
        &self,
        dev: &Device,
        x: &QuantRows,
        bias: &Buffer<bf16>,
        y: &mut Buffer<bf16>,
        ldy: usize,
        residual: bool,
    ) -> Result<()> {
        for p in &self.parts {
            let tile = TokensTile::for_shape(p.m.rows, x.rows());
            p.m.gemv_tokens(dev, tile, x, bias, y, p.row0, ldy, residual)?;
        }
        Ok(())
    }

    /// Bytes one GEMV reads from the quantized arrays.
    pub(crate) fn bytes(&self) -> usize {
        self.parts.iter().map(|p| p.m.bytes).sum()
    }

    /// The GEMV of the decode step's projections: `y = variant(W · a) + bias` over
    /// every run: the activation quantized once (`launch` gives whether that launch is
    /// serialized), then each run's GEMV on its own grid. `prefetch`: the range of the
    /// first run's packed words, `(offset, length)` in bytes, that the quantizer launch
    /// asks L2 for (none where the GEMV quantizes its input itself).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gemv(
        &self,
        dev: &Device,
        launch: LaunchConfig,
        variant: QuantVariant<'_>,
        a: &Buffer<bf16>,
        y: &mut Buffer<bf16>,
        bias: &Buffer<bf16>,
        spare: &mut QuantSpare,
        (offset, bytes): (usize, usize),
    ) -> Result<()> {
        let cols = self.parts[0].m.cols;
        if let (QuantVariant::Norm { norm_w, eps }, true) = (variant, self.fuses_norm()) {
            if let ([p1, p2], Some((cfg, cfg2))) = (self.parts.as_slice(), self.merged) {
                let (norm, serialized) = (Some((a, norm_w, eps)), launch.serialized);
                return launch_q4_k_q6_k(
                    dev, cfg, cfg2, &p1.m, &p2.m, norm, bias, y, spare, serialized,
                );
            }
            for (i, p) in self.parts.iter().enumerate() {
                let out = QuantOut::Rows {
                    y: &mut *y,
                    row0: p.row0,
                    bias,
                };
                let serialized = launch.serialized && i == 0;
                p.m.gemv_norm_fused(dev, p.fused_cfg, a, norm_w, eps, out, spare, serialized)?;
            }
            return Ok(());
        }
        let prefetch = Some((self.parts[0].m.words(), offset, bytes));
        spare.quantize(dev, variant, a, cols, false, launch.serialized, prefetch)?;
        self.gemv_quantized_input(dev, variant, y, bias, spare)
    }

    /// The tiles of the two runs where a GEMV over this matrix launches both as one
    /// ([`crate::gguf::device::launch_q4_k_q6_k`]): exactly two runs, a Q4_K or Q5_K
    /// run then a Q6_K one or a Q3_K run then a Q4_K or Q5_K one, under [`MergeRuns`]
    /// (where the GEMV quantizes its normed input itself, `fuses_norm`, both runs at the
    /// first run's fused tile; a Q3_K run first merges only there, or under
    /// [`MergeRuns::Shared`]), where that kernel is compiled for them; else `None`. Kept in `merged`. The fused merge made
    /// Qwen3-0.6B Q4_K_M's step 4% faster; Qwen3-8B's QKV (its input quantized before)
    /// lost 1.2% with its `v` run at the `[q; k]` run's tile and gains 0.7% with `v` in
    /// its own ([`MergeRuns::Both`]; docs/perf.md, "Q4_K and Q6_K runs in one launch").
    fn merged_tiles(&self) -> Option<(QuantGemvConfig, QuantGemvConfig)> {
        let fused = self.fuses_norm;
        let [first, second] = self.parts.as_slice() else {
            return None;
        };
        let types = (first.m.ggml_type(), second.m.ggml_type());
        let tiles = match (self.merge, fused) {
            (MergeRuns::Never, _) => return None,
            (_, true) => (first.fused_cfg, first.fused_cfg),
            (MergeRuns::Fused, false) => return None,
            (MergeRuns::Shared, false) => (first.cfg, first.cfg),
            // Untimed with the second run at the first's tile (`MergeRuns::Both`).
            (MergeRuns::Both { .. }, false) if types.0 == GgmlType::Q3_K => return None,
            (MergeRuns::Both { rows, cols }, false) => {
                let cfg2 = QuantGemvConfig {
                    block_n: rows,
                    block_k: cols,
                    num_warps: first.cfg.num_warps,
                };
                (first.cfg, cfg2)
            }
        };
        tiles
            .0
            .merged_runs_compiled(&tiles.1, types, fused)
            .then_some(tiles)
    }

    /// Whether a normed GEMV over this matrix, as `[gate; up]` (gate the first half of
    /// its rows), writes `silu(gate) * up` as the down projection's int8 input itself
    /// ([`QuantMatrix::gemv_norm_silu_quantized`]) instead of its rows: one run of Q4_K,
    /// rows a multiple of 64, a tile from [`crate::gguf::device::silu_quantized_tile`]
    /// for its norm inside the GEMV or before it, and the variant compiled.
    pub(crate) fn silu_quantizes(&self) -> bool {
        self.silu_tile.is_some()
    }

    /// `silu(gate) * up` of the normed GEMV over this `[gate; up]` matrix plus `bias`,
    /// written as the down projection's int8 input into `spare`, in one launch or after
    /// the normed input's quantizer ([`DeviceQuantMatrix::gemv_norm_silu_quantized`]);
    /// an error unless
    /// [`QuantMatrix::silu_quantizes`].
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn gemv_norm_silu_quantized(
        &self,
        dev: &Device,
        launch: LaunchConfig,
        a: &Buffer<bf16>,
        norm_w: &Buffer<bf16>,
        eps: f32,
        bias: &Buffer<bf16>,
        spare: &mut QuantSpare,
    ) -> Result<()> {
        let (Some(cfg), [p]) = (self.silu_tile, self.parts.as_slice()) else {
            return Err(EngineError::Option {
                message: "this [gate; up] matrix does not write down's int8 input itself".into(),
            });
        };
        let serialized = launch.serialized;
        let fused = self.fuses_norm;
        p.m.gemv_norm_silu_quantized(dev, cfg, fused, a, norm_w, eps, bias, spare, serialized)
    }

    /// Whether a normed GEMV over this matrix quantizes its input inside the GEMV
    /// launches ([`crate::gguf::device::fuses_norm`]) instead of a quantizer before them.
    pub(crate) fn fuses_norm(&self) -> bool {
        self.fuses_norm
    }

    /// [`QuantMatrix::gemv`] over an activation already quantized into `spare` (by the
    /// kernel that produced it: `attention_combine_quant` before the O projection).
    pub(crate) fn gemv_quantized_input(
        &self,
        dev: &Device,
        variant: QuantVariant<'_>,
        y: &mut Buffer<bf16>,
        bias: &Buffer<bf16>,
        spare: &mut QuantSpare,
    ) -> Result<()> {
        let merged = self
            .merged
            .filter(|_| !variant.residual() && !self.fuses_norm);
        if let ([p1, p2], Some((cfg, cfg2))) = (self.parts.as_slice(), merged) {
            return launch_q4_k_q6_k(dev, cfg, cfg2, &p1.m, &p2.m, None, bias, y, spare, false);
        }
        for p in &self.parts {
            let out = QuantOut::Rows {
                y: &mut *y,
                row0: p.row0,
                bias,
            };
            p.m.launch_quantized(dev, p.cfg, variant.residual(), out, spare, false)?;
        }
        Ok(())
    }

    /// Programs of the LM head launch ([`QuantMatrix::lm_head`]), i.e. the greedy
    /// candidates it writes.
    pub(crate) fn head_programs(&self) -> usize {
        match self.parts.as_slice() {
            [p] => p.cfg.grid(p.m.rows) as usize,
            _ => 0,
        }
    }

    /// The final norm, the LM head and each program's greedy candidate (see
    /// [`QuantOut::Head`]). The head is one run (one type).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn lm_head(
        &self,
        dev: &Device,
        launch: LaunchConfig,
        x: &Buffer<bf16>,
        norm_w: &Buffer<bf16>,
        eps: f32,
        logits: &mut Buffer<f32>,
        part_val: &mut Buffer<f32>,
        part_idx: &mut Buffer<i32>,
        spare: &mut QuantSpare,
    ) -> Result<()> {
        let [p] = self.parts.as_slice() else {
            return Err(EngineError::Option {
                message: "a quantized LM head must be of one type".into(),
            });
        };
        let out = QuantOut::Head {
            logits,
            part_val,
            part_idx,
        };
        let variant = QuantVariant::Norm { norm_w, eps };
        p.m.launch(dev, p.cfg, variant, x, out, spare, launch.serialized)
    }
}

/// The quantized matrices of a model, beside its [`crate::model::ModelWeights`]:
/// [`crate::Decoder::with_quant`] reads these instead of the dense ones wherever
/// they are given.
#[derive(Clone, Debug, Default)]
pub struct QuantWeights {
    /// Per layer, in order (empty: every layer dense).
    pub layers: Vec<QuantLayer>,
    /// The LM head (for a tied head, the embedding table in the file's type; the
    /// embedding row is still read from the dense table).
    pub lm_head: Option<PackedMatrix>,
}

/// One layer's quantized matrices; `None` where the layer's matrix is dense. A fused
/// projection (`[q; k; v]`, `[gate; up]`) is quantized only when all its parts are.
#[derive(Clone, Debug, Default)]
pub struct QuantLayer {
    /// `q_proj`, `[q_dim, hidden]`.
    pub q: Option<PackedMatrix>,
    /// `k_proj`, `[kv_dim, hidden]`.
    pub k: Option<PackedMatrix>,
    /// `v_proj`, `[kv_dim, hidden]`.
    pub v: Option<PackedMatrix>,
    /// `o_proj`, `[hidden, q_dim]`.
    pub o: Option<PackedMatrix>,
    /// `gate_proj`, `[intermediate, hidden]`.
    pub gate: Option<PackedMatrix>,
    /// `up_proj`, `[intermediate, hidden]`.
    pub up: Option<PackedMatrix>,
    /// `down_proj`, `[hidden, intermediate]`.
    pub down: Option<PackedMatrix>,
}

impl QuantWeights {
    /// Which of layer `layer`'s dense matrices `[q, k, v, o, gate, up, down]` the
    /// decoder reads quantized instead (a fused projection only when all its parts are
    /// given): those it never needs in bf16.
    pub fn covers(&self, layer: usize) -> [bool; 7] {
        let Some(l) = self.layers.get(layer) else {
            return [false; 7];
        };
        let qkv = l.q.is_some() && l.k.is_some() && l.v.is_some();
        let gate_up = l.gate.is_some() && l.up.is_some();
        [
            qkv,
            qkv,
            qkv,
            l.o.is_some(),
            gate_up,
            gate_up,
            l.down.is_some(),
        ]
    }

    /// Bytes the quantized matrices hold in the device layout.
    pub fn device_bytes(&self) -> usize {
        let layer = |l: &QuantLayer| -> usize {
            [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down]
                .iter()
                .filter_map(|m| m.as_ref().map(PackedMatrix::device_bytes))
                .sum()
        };
        self.layers.iter().map(layer).sum::<usize>()
            + self.lm_head.as_ref().map_or(0, PackedMatrix::device_bytes)
    }
}

/// The device matrix of the fused rows `parts` (stacked): quantized when every part
/// is given in `quant`, else dense from `dense`.
pub(crate) fn fused(
    dev: &Device,
    quant: &[Option<&PackedMatrix>],
    dense: &[&[bf16]],
) -> Result<Matrix> {
    if !quant.is_empty() && quant.iter().all(Option::is_some) {
        let blocks: Vec<&PackedMatrix> = quant.iter().map(|m| m.expect("checked")).collect();
        return Ok(Matrix::Quant(QuantMatrix::upload(dev, &blocks, false)?));
    }
    Ok(Matrix::Dense(dev.upload(&dense.concat())?))
}

/// `act[..inter] = bf16(bf16(silu(g)) * u)` over `act = [g; u]` (what a quantized
/// gate/up GEMV leaves), in place, for a dense down projection. Never a step's first
/// launch.
pub(crate) fn silu_mul_in_place(
    dev: &Device,
    act: &mut Buffer<bf16>,
    inter: usize,
    stamps: &mut StampSlots,
) -> Result<()> {
    use crate::kernels_quant::{SiluMulInPlaceArgs, SiluMulInPlaceConsts, SILU_MUL_IN_PLACE};
    let programs = inter.div_ceil(1024) as u32;
    let cfg = LaunchConfig::grid([programs, 1, 1]).num_warps(4);
    let stamp_at = stamps.take(SILU_MUL_IN_PLACE.name, programs)?;
    SiluMulInPlaceArgs {
        act,
        inter: inter as i32,
        stamps: &mut stamps.buf,
        stamp_at,
    }
    .launch(
        dev,
        cfg,
        SiluMulInPlaceConsts {
            b: 1024,
            stamps: stamps_const(stamp_at) as usize,
        },
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::quant::GgmlType;

    /// `set_tiles` gives the plain GEMV its plain entry and the GEMV that quantizes its
    /// normed input its `norm:` entry; a shape without one keeps the step's choice.
    #[test]
    fn tiles_reach_each_variant_apart() {
        let dev = Device::cpu();
        let (rows, cols) = (2048, 256);
        // Q8_0 blocks: an f16 scale (zero) and 32 int8 values.
        let bytes = vec![0u8; rows * cols / 32 * 34];
        let packed = PackedMatrix::pack(GgmlType::Q8_0, &bytes, rows, cols, "w").unwrap();
        let mut m = QuantMatrix::upload(&dev, &[&packed], false).unwrap();
        let default_fused = m.parts[0].fused_cfg;
        let tiles = QuantTiles::parse("2048x256=2,512,8").unwrap();
        m.set_tiles(&tiles).unwrap();
        assert_eq!((m.parts[0].cfg.block_n, m.parts[0].cfg.num_warps), (2, 8));
        assert_eq!(m.parts[0].fused_cfg, default_fused);
        let tiles = QuantTiles::parse("norm:2048x256=32,512,4").unwrap();
        m.set_tiles(&tiles).unwrap();
        assert_eq!(m.parts[0].fused_cfg.block_n, 32);
        assert_eq!(
            m.parts[0].cfg,
            QuantGemvConfig::for_step(GgmlType::Q8_0, rows, cols, false).unwrap()
        );
        // An uncompiled configuration is an error naming it.
        let tiles = QuantTiles::parse("norm:2048x256=32,1024,4").unwrap();
        let e = m.set_tiles(&tiles).unwrap_err().to_string();
        assert!(e.contains("32,1024,4"), "{e}");
    }
}
