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
            for block_k in [256, 512, 1024] {
                for num_warps in [4, 8] {
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
    ) -> Result<()> {
        self.gemv_any(dev, cfg, a, norm, bias, y, residual, false)
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
    ) -> Result<()> {
        self.gemv_any(dev, cfg, act, None, bias, y, true, true)
    }

    #[allow(clippy::too_many_arguments)]
    fn gemv_any(
        &self,
        dev: &Device,
        cfg: QuantGemvConfig,
        a: &Buffer<bf16>,
        norm: Option<(&Buffer<bf16>, f32)>,
        bias: &Buffer<bf16>,
        y: &mut Buffer<bf16>,
        residual: bool,
        silu_mul: bool,
    ) -> Result<()> {
        if norm.is_some() && residual {
            return Err(crate::error::EngineError::Option {
                message: "a quantized GEMV takes a norm prologue or a residual, not both".into(),
            });
        }
        let launch = LaunchConfig::from(cfg.grid(self.rows)).num_warps(cfg.num_warps);
        let consts = [
            cfg.block_n as i64,
            cfg.block_k as i64,
            i64::from(residual),
            i64::from(norm.is_some()),
            i64::from(silu_mul),
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
        args.extend([
            a.into(),
            norm_w.into(),
            bias.into(),
            y.into(),
            n.into(),
            k_words.into(),
            eps.into(),
        ]);
        self.kernel().launch_dyn(dev, launch, &consts, &mut args)?;
        Ok(())
    }
}
