//! Quantized matrices on a device and their GEMV launches
//! ([`crate::kernels_quant`]): what the decoder, the tests and the bandwidth benchmark
//! share.

use tilefuse_dsl::half::{bf16, f16};
use tilefuse_dsl::runtime::{Buffer, Device, KernelArg, KernelDef, LaunchConfig};

use super::quant::{GgmlType, PackedMatrix};
use crate::error::Result;
use crate::kernels_quant::{Q4_K_GEMV, Q6_K_GEMV, Q8_0_GEMV};

/// A launch configuration of a quantized GEMV: rows and columns per tile, warps.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuantGemvConfig {
    /// Rows per program (`BLOCK_N`).
    pub block_n: usize,
    /// Columns per tile (`BLOCK_K`).
    pub block_k: usize,
    /// Warps per program.
    pub num_warps: u32,
}

impl QuantGemvConfig {
    /// Every compiled configuration (the kernels share one list).
    pub fn all() -> Vec<QuantGemvConfig> {
        let mut v = Vec::new();
        for block_n in [1, 2, 4, 8] {
            for block_k in [256, 512, 1024, 2048, 4096] {
                for num_warps in [4, 8] {
                    // Long tiles: few rows, and more warps for more (as compiled).
                    if block_k > 1024 && block_n * block_k > num_warps as usize * 1024 {
                        continue;
                    }
                    v.push(QuantGemvConfig {
                        block_n,
                        block_k,
                        num_warps,
                    });
                }
            }
        }
        v
    }

    /// The decode step's configuration for a `[rows, cols]` matrix of type `ty`.
    ///
    /// 8 rows of 1024-column tiles over 4 warps, the best or within 10% of the best of
    /// every compiled configuration at Qwen3-0.6B's and Qwen3-8B's shapes (H200,
    /// docs/perf.md "Quantized GEMVs"), except the small wide matrices (O and down of
    /// 1024 rows), where 4 rows of 2048-column tiles over 8 warps keep the grid over the
    /// SMs. Many rows a program also amortize the `SILU_MUL` prologue, which every
    /// program computes for the whole activation.
    pub fn for_shape(_ty: GgmlType, rows: usize, cols: usize) -> QuantGemvConfig {
        if rows < 2048 && cols > 1024 {
            QuantGemvConfig {
                block_n: 4,
                block_k: 2048,
                num_warps: 8,
            }
        } else {
            QuantGemvConfig {
                block_n: 8,
                block_k: 1024,
                num_warps: 4,
            }
        }
    }

    /// Programs for `n` rows.
    pub fn grid(&self, n: usize) -> u32 {
        n.div_ceil(self.block_n) as u32
    }
}

impl Default for QuantGemvConfig {
    /// 4 rows of 512-column tiles over 4 warps: a middle of the compiled range, not a
    /// measured optimum (`examples/quant_bandwidth.rs` sweeps them all).
    fn default() -> Self {
        QuantGemvConfig {
            block_n: 4,
            block_k: 512,
            num_warps: 4,
        }
    }
}

/// The device arrays of one quantized matrix (see [`PackedMatrix`] for the layout).
#[derive(Debug)]
pub enum QuantBuffers {
    /// Q8_0: quant words and block scales.
    Q8_0 {
        /// `[rows, cols / 4]`.
        q: Buffer<u32>,
        /// `[rows, cols / 32]`.
        d: Buffer<f16>,
    },
    /// Q4_K: quant words, sub-block scales and mins, super-block scales.
    Q4K {
        /// `[rows, cols / 8]`.
        q: Buffer<u32>,
        /// `[rows, cols / 32]`.
        scales: Buffer<u8>,
        /// `[rows, cols / 32]`.
        mins: Buffer<u8>,
        /// `[rows, cols / 256]`.
        d: Buffer<f16>,
        /// `[rows, cols / 256]`.
        dmin: Buffer<f16>,
    },
    /// Q6_K: low-nibble and high-bit words, sub-block scales, super-block scales.
    Q6K {
        /// `[rows, cols / 8]`.
        ql: Buffer<u32>,
        /// `[rows, cols / 16]`.
        qh: Buffer<u32>,
        /// `[rows, cols / 16]`.
        scales: Buffer<u8>,
        /// `[rows, cols / 256]`.
        d: Buffer<f16>,
    },
}

/// A quantized `[rows, cols]` matrix uploaded to a device.
#[derive(Debug)]
pub struct DeviceQuantMatrix {
    /// Rows (output features).
    pub rows: usize,
    /// Columns (input features).
    pub cols: usize,
    /// Bytes the GEMV reads from the arrays.
    pub bytes: usize,
    /// The arrays.
    pub buffers: QuantBuffers,
}

impl DeviceQuantMatrix {
    /// Uploads `m`'s arrays to `dev`.
    pub fn upload(dev: &Device, m: &PackedMatrix) -> Result<Self> {
        let (rows, cols) = m.shape();
        let buffers = match m {
            PackedMatrix::Q8_0 { q, d, .. } => QuantBuffers::Q8_0 {
                q: dev.upload(q)?,
                d: dev.upload(d)?,
            },
            PackedMatrix::Q4K {
                q,
                scales,
                mins,
                d,
                dmin,
                ..
            } => QuantBuffers::Q4K {
                q: dev.upload(q)?,
                scales: dev.upload(scales)?,
                mins: dev.upload(mins)?,
                d: dev.upload(d)?,
                dmin: dev.upload(dmin)?,
            },
            PackedMatrix::Q6K {
                ql, qh, scales, d, ..
            } => QuantBuffers::Q6K {
                ql: dev.upload(ql)?,
                qh: dev.upload(qh)?,
                scales: dev.upload(scales)?,
                d: dev.upload(d)?,
            },
        };
        Ok(DeviceQuantMatrix {
            rows,
            cols,
            bytes: m.device_bytes(),
            buffers,
        })
    }

    /// The ggml type.
    pub fn ggml_type(&self) -> GgmlType {
        match self.buffers {
            QuantBuffers::Q8_0 { .. } => GgmlType::Q8_0,
            QuantBuffers::Q4K { .. } => GgmlType::Q4_K,
            QuantBuffers::Q6K { .. } => GgmlType::Q6_K,
        }
    }

    /// The kernel that reads this matrix.
    pub fn kernel(&self) -> &'static KernelDef {
        match self.buffers {
            QuantBuffers::Q8_0 { .. } => &Q8_0_GEMV,
            QuantBuffers::Q4K { .. } => &Q4_K_GEMV,
            QuantBuffers::Q6K { .. } => &Q6_K_GEMV,
        }
    }

    /// `y = bf16(W · a + bias)`; with `residual`, `y = bf16(y + bf16(W · a + bias))`;
    /// with `norm = Some((norm_w, eps))`, `a` goes through RMSNorm first (`a: [cols]`,
    /// `norm_w: [cols]`, `bias`, `y: [rows]`). A norm and a residual together are an
    /// error: the decode step never needs both.
    #[allow(clippy::too_many_arguments)]
    pub fn gemv(
        &self,
        dev: &Device,
        cfg: QuantGemvConfig,
        a: &Buffer<bf16>,
        norm: Option<(&Buffer<bf16>, f32)>,
        bias: &Buffer<bf16>,
        y: &mut Buffer<bf16>,
        residual: bool,
        spare: &mut QuantSpare,
    ) -> Result<()> {
        let variant = match (norm, residual) {
            (Some(_), true) => {
                return Err(crate::error::EngineError::Option {
                    message: "a quantized GEMV takes a norm prologue or a residual, not both"
                        .into(),
                })
            }
            (Some((norm_w, eps)), false) => QuantVariant::Norm { norm_w, eps },
            (None, true) => QuantVariant::Residual,
            (None, false) => QuantVariant::Plain,
        };
        let out = QuantOut::Rows { y, row0: 0, bias };
        self.launch(dev, cfg, variant, a, out, spare, false)
    }

    /// The MLP's down projection over `act = [g; u]` (each `cols` long, the output of a
    /// normed GEMV over the `[gate; up]` rows): `y = bf16(y + bf16(W · a + bias))` with
    /// `a = bf16(bf16(silu(g)) * u)` computed as it loads.
    pub fn gemv_silu_mul_residual(
        &self,
        dev: &Device,
        cfg: QuantGemvConfig,
        act: &Buffer<bf16>,
        bias: &Buffer<bf16>,
        y: &mut Buffer<bf16>,
        spare: &mut QuantSpare,
    ) -> Result<()> {
        let out = QuantOut::Rows { y, row0: 0, bias };
        self.launch(
            dev,
            cfg,
            QuantVariant::SiluMulResidual,
            act,
            out,
            spare,
            false,
        )
    }

    /// Launches the GEMV over `a` in `variant`, writing `out`; `spare` stands in for the
    /// outputs the launch does not write (the kernels take every output). An LM head
    /// ([`QuantOut::Head`]) takes [`QuantVariant::Norm`] (the final norm).
    /// `serialized`: the launch waits for all earlier work (the first of a decode step;
    /// see `LaunchConfig::serialized`).
    #[allow(clippy::too_many_arguments)]
    pub fn launch(
        &self,
        dev: &Device,
        cfg: QuantGemvConfig,
        variant: QuantVariant<'_>,
        a: &Buffer<bf16>,
        out: QuantOut<'_>,
        spare: &mut QuantSpare,
        serialized: bool,
    ) -> Result<()> {
        let head = matches!(out, QuantOut::Head { .. });
        let (residual, silu_mul, norm) = match variant {
            QuantVariant::Plain => (false, false, None),
            QuantVariant::Residual => (true, false, None),
            QuantVariant::Norm { norm_w, eps } => (false, false, Some((norm_w, eps))),
            QuantVariant::SiluMulResidual => (true, true, None),
        };
        if head && norm.is_none() {
            return Err(crate::error::EngineError::Option {
                message: "a quantized LM head takes the final norm (QuantVariant::Norm)".into(),
            });
        }
        let mut launch = LaunchConfig::from(cfg.grid(self.rows)).num_warps(cfg.num_warps);
        if serialized {
            launch = launch.serialized();
        }
        let consts = [
            cfg.block_n as i64,
            cfg.block_k as i64,
            i64::from(residual),
            i64::from(norm.is_some()),
            i64::from(silu_mul),
            i64::from(head),
        ];
        let (norm_w, eps) = norm.unwrap_or((a, 0.0));
        let n = self.rows as i32;
        let k = self.cols as i32;
        let mut args: Vec<KernelArg<'_>> = match &self.buffers {
            QuantBuffers::Q8_0 { q, d } => vec![q.into(), d.into()],
            QuantBuffers::Q4K {
                q,
                scales,
                mins,
                d,
                dmin,
            } => vec![q.into(), scales.into(), mins.into(), d.into(), dmin.into()],
            QuantBuffers::Q6K { ql, qh, scales, d } => {
                vec![ql.into(), qh.into(), scales.into(), d.into()]
            }
        };
        let k_words = match self.buffers {
            QuantBuffers::Q8_0 { .. } => k / 4,
            QuantBuffers::Q4K { .. } => k / 8,
            QuantBuffers::Q6K { .. } => k / 16,
        };
        args.extend([a.into(), norm_w.into()]);
        let row0 = match out {
            QuantOut::Rows { y, row0, bias } => {
                args.extend([
                    bias.into(),
                    y.into(),
                    (&mut spare.logits).into(),
                    (&mut spare.part_val).into(),
                    (&mut spare.part_idx).into(),
                ]);
                row0 as i32
            }
            QuantOut::Head {
                logits,
                part_val,
                part_idx,
            } => {
                args.extend([
                    a.into(),
                    (&mut spare.y).into(),
                    logits.into(),
                    part_val.into(),
                    part_idx.into(),
                ]);
                0
            }
        };
        args.extend([n.into(), row0.into(), k_words.into(), eps.into()]);
        self.kernel().launch_dyn(dev, launch, &consts, &mut args)?;
        Ok(())
    }
}

/// What a quantized GEMV does to its input before the dot products, and to its
/// output after.
#[derive(Clone, Copy, Debug)]
pub enum QuantVariant<'a> {
    /// `W · a + bias`.
    Plain,
    /// `y + bf16(W · a + bias)`.
    Residual,
    /// RMSNorm of `a` with weights `norm_w` first (folded into the row sums; for an LM
    /// head rounded as the reference's final norm).
    Norm {
        /// The norm's weights, `[cols]`.
        norm_w: &'a Buffer<bf16>,
        /// Its epsilon.
        eps: f32,
    },
    /// `a = [g; u]` (`2 * cols` long) becomes `bf16(bf16(silu(g)) * u)` as it loads;
    /// with the residual.
    SiluMulResidual,
}

/// Where a quantized GEMV writes.
#[derive(Debug)]
pub enum QuantOut<'a> {
    /// Rows `row0..row0 + rows` of `y` (and of `bias`): one part of a fused projection
    /// whose parts have different types (Q4_K_M's `[q; k; v]` with a Q6_K `v`).
    Rows {
        /// The output (and with a residual, its input).
        y: &'a mut Buffer<bf16>,
        /// The first row written.
        row0: usize,
        /// The bias, indexed like `y`.
        bias: &'a Buffer<bf16>,
    },
    /// An LM head: `bf16` logits stored as `f32`, and one greedy candidate (value and
    /// row) per program, `QuantGemvConfig::grid(rows)` of them, for `argmax_finish`.
    Head {
        /// `[rows]`.
        logits: &'a mut Buffer<f32>,
        /// `[programs]`.
        part_val: &'a mut Buffer<f32>,
        /// `[programs]`.
        part_idx: &'a mut Buffer<i32>,
    },
}

/// Small buffers that stand in for the outputs a launch does not write (each kernel
/// takes the LM head's outputs and the rows' output).
#[derive(Debug)]
pub struct QuantSpare {
    logits: Buffer<f32>,
    part_val: Buffer<f32>,
    part_idx: Buffer<i32>,
    y: Buffer<bf16>,
}

impl QuantSpare {
    /// One element each on `dev`.
    pub fn new(dev: &Device) -> Result<Self> {
        Ok(QuantSpare {
            logits: dev.zeros(1)?,
            part_val: dev.zeros(1)?,
            part_idx: dev.zeros(1)?,
            y: dev.zeros(1)?,
        })
    }
}
