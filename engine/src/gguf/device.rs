//! Quantized matrices on a device and their GEMV launches
//! ([`crate::kernels_quant`]): what the decoder, the tests and the bandwidth benchmark
//! share.

use tilefuse_dsl::half::{bf16, f16};
use tilefuse_dsl::runtime::{Buffer, Device, KernelArg, KernelDef, LaunchConfig};

use super::quant::{GgmlType, PackedMatrix};
use crate::error::Result;
use crate::kernels_quant::{
    DEQUANTIZE_Q4_K, DEQUANTIZE_Q6_K, DEQUANTIZE_Q8_0, Q4_K_GEMV, Q4_K_GEMV_TOKENS, Q4_K_Q6_K_GEMV,
    Q6_K_GEMV, Q6_K_GEMV_TOKENS, Q8_0_GEMV, Q8_0_GEMV_TOKENS, QUANTIZE_ACT, QUANTIZE_SILU_MUL_ROWS,
};

/// Whether the decode step quantizes the RMSNorm input of a quantized QKV or gate/up
/// GEMV over a `[rows, cols]` matrix (every run) inside the GEMV
/// ([`DeviceQuantMatrix::gemv_norm_fused`]) rather than in a quantizer launch before it.
/// Every program then quantizes the whole input again, which costs less than a launch
/// only where the rows are short: up to [`FUSED_NORM_MAX_COLS`] columns (docs/perf.md,
/// "The norm inside the quantized GEMV"). The environment's `TILEFUSE_QUANT_NORM_FUSED`
/// overrides it: `1` always, `0` never, or `ROWSxCOLS` shapes separated by `,` for
/// exactly those matrices. A malformed value is an error that quotes it.
pub fn fuses_norm(rows: usize, cols: usize) -> Result<bool> {
    match std::env::var("TILEFUSE_QUANT_NORM_FUSED") {
        Ok(v) => norm_fused_policy(&v, rows, cols),
        Err(_) => Ok(cols <= FUSED_NORM_MAX_COLS),
    }
}

/// [`fuses_norm`] under the override `v`.
fn norm_fused_policy(v: &str, rows: usize, cols: usize) -> Result<bool> {
    match v.trim() {
        "1" => return Ok(true),
        "0" => return Ok(false),
        _ => {}
    }
    let mut hit = false;
    for shape in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let parsed = shape.split_once('x').and_then(|(r, c)| {
            Some((
                r.trim().parse::<usize>().ok()?,
                c.trim().parse::<usize>().ok()?,
            ))
        });
        match parsed {
            Some(rc) => hit |= rc == (rows, cols),
            None => {
                return Err(crate::error::EngineError::Option {
                    message: format!(
                        "TILEFUSE_QUANT_NORM_FUSED=`{v}`: expected 1, 0 or ROWSxCOLS shapes separated by `,` (`{shape}`)"
                    ),
                })
            }
        }
    }
    Ok(hit)
}

/// Whether a Q4_K GEMV of `block_n` rows a program may run its unmasked variant
/// (`EVEN = 1`, [`DeviceQuantMatrix::reads_unmasked`]) where the shape allows and the
/// variant is compiled (4- and 8-row tiles: docs/perf.md, "Loads without masks").
/// `TILEFUSE_QUANT_EVEN` restricts it for measurements: `0` never, `1` wherever
/// compiled, or the row counts separated by `,`. A malformed value reads as unset.
/// The environment is read once a process: every launch asks.
pub fn unmasked_rows_allowed(block_n: usize) -> bool {
    static OVERRIDE: std::sync::OnceLock<Option<String>> = std::sync::OnceLock::new();
    let v = OVERRIDE.get_or_init(|| std::env::var("TILEFUSE_QUANT_EVEN").ok());
    even_policy(v.as_deref(), block_n)
}

/// [`unmasked_rows_allowed`] under the override `v` (`None`: unset).
fn even_policy(v: Option<&str>, block_n: usize) -> bool {
    match v.map(str::trim) {
        None | Some("1") => true,
        Some("0") => false,
        Some(list) => {
            let rows: Option<Vec<usize>> = list.split(',').map(|r| r.trim().parse().ok()).collect();
            rows.is_none_or(|rows| rows.contains(&block_n))
        }
    }
}

/// Rows and 32-element blocks a program of the dequantization kernels writes for a
/// matrix of type `ty` ([`DeviceQuantMatrix::dequantize_into`]): the fastest compiled
/// tile alone on an H100 at Qwen3-0.6B's and Qwen3-8B's shapes, or within 2% of it
/// (`examples/quant_bandwidth.rs --dequant`, docs/perf.md "Batched prefill of quantized
/// weights"): Q4_K one row of 32 blocks (and Q5_K, Q4_0 and Q5_0, which its kernel
/// reads), Q6_K and Q8_0 four rows.
pub fn dequant_tile(ty: GgmlType) -> (usize, usize) {
    if read_by_q4_k_kernels(ty) {
        (1, 32)
    } else {
        (4, 32)
    }
}

/// Whether the Q4_K kernels read matrices of device type `ty` (their `LAYOUT`s: Q4_K,
/// Q5_K, Q4_0 and Q5_0 in nibble words, IQ4_XS in table-index words).
fn read_by_q4_k_kernels(ty: GgmlType) -> bool {
    [
        GgmlType::Q4_K,
        GgmlType::Q5_K,
        GgmlType::Q4_0,
        GgmlType::Q5_0,
        GgmlType::IQ4_XS,
    ]
    .contains(&ty)
}

/// Which GEMVs of the decode step over two runs of rows (Q4_K_M's QKV where `v` takes
/// more bits, Q5_K_M's, Q3_K_M's) launch both runs as one ([`launch_q4_k_q6_k`]) where
/// the tiles are compiled for that kernel.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MergeRuns {
    /// Neither: two launches.
    Never,
    /// Only the GEMV that quantizes its normed input itself ([`fuses_norm`]), both runs
    /// at its tile (docs/perf.md, "Q4_K and Q6_K runs in one launch").
    Fused,
    /// That one, and the GEMV over an input quantized before it where a Q6_K run comes
    /// second: it takes `rows` rows of `cols`-column tiles at the first run's warps. A
    /// Q3_K run first (Q3_K_M) merges only where the GEMV quantizes its input itself:
    /// its second run would take the first's tile, which cost Q4_K_M's 8B step 1.2%
    /// (docs/perf.md, "Q3_K_M's QKV in one launch").
    Both {
        /// Rows a program of the Q6_K run.
        rows: usize,
        /// Columns a tile of the Q6_K run.
        cols: usize,
    },
    /// Every GEMV of two runs, both at the first run's tile (its fused tile where the
    /// GEMV quantizes its input itself): for measuring the merges `Both` leaves out.
    Shared,
}

/// The Q6_K run's tile (rows, columns) of [`merge_runs`]' default for a GEMV over an
/// input quantized before it: Qwen3-8B Q4_K_M's `v` (1024 rows) in 2 rows of 2048
/// columns beside the `[q; k]` run's 8 rows of 1024 (docs/perf.md, "Q4_K and Q6_K runs
/// in one launch").
pub const MERGED_V_TILE: (usize, usize) = (2, 2048);

/// Which GEMVs launch a Q4_K and a Q6_K run as one ([`MergeRuns`]); by default
/// [`MergeRuns::Both`] with [`MERGED_V_TILE`] (Qwen3-8B Q4_K_M on an H200: 579-580
/// tokens/s against 575-576 with [`MergeRuns::Fused`]; docs/perf.md, "Q4_K and Q6_K
/// runs in one launch"). The environment's `TILEFUSE_QUANT_MERGE_RUNS` overrides it:
/// `0` never, `fused`, `shared` ([`MergeRuns::Shared`]), or `ROWS,COLS` for the Q6_K
/// run's tile when the input is quantized before (compiled: 2 or 4 rows of 2048
/// columns). A malformed value is an error that quotes it.
pub fn merge_runs() -> Result<MergeRuns> {
    match std::env::var("TILEFUSE_QUANT_MERGE_RUNS") {
        Ok(v) => merge_runs_policy(&v),
        Err(_) => Ok(MergeRuns::Both {
            rows: MERGED_V_TILE.0,
            cols: MERGED_V_TILE.1,
        }),
    }
}

/// [`merge_runs`] under the override `v`.
fn merge_runs_policy(v: &str) -> Result<MergeRuns> {
    match v.trim() {
        "0" => return Ok(MergeRuns::Never),
        "fused" => return Ok(MergeRuns::Fused),
        "shared" => return Ok(MergeRuns::Shared),
        _ => {}
    }
    let tile = v.split_once(',').and_then(|(r, c)| {
        Some((
            r.trim().parse::<usize>().ok()?,
            c.trim().parse::<usize>().ok()?,
        ))
    });
    match tile {
        Some((rows, cols)) if rows > 0 && cols > 0 => Ok(MergeRuns::Both { rows, cols }),
        _ => Err(crate::error::EngineError::Option {
            message: format!(
                "TILEFUSE_QUANT_MERGE_RUNS=`{v}`: expected 0, fused, shared or ROWS,COLS (the Q6_K run's tile)"
            ),
        }),
    }
}

/// The tile of the normed `[gate; up]` GEMV that writes the down projection's int8
/// input itself ([`DeviceQuantMatrix::gemv_norm_silu_quantized`]) when it quantizes its
/// normed input itself (`fused`, [`fuses_norm`]) or not, or `None` where the step keeps
/// a quantizer launch between gate/up and down. With the norm inside, by default 64
/// rows of 1024-column tiles over 8 warps (docs/perf.md, "`silu(gate) * up` quantized
/// by the gate/up GEMV"); the environment's `TILEFUSE_QUANT_SILU_GATE_UP` overrides
/// it: `0` for none, or `64,COLS,WARPS`. Without, by default none;
/// `TILEFUSE_QUANT_SILU_GATE_UP_UNFUSED` takes the same values. A malformed value is an
/// error that quotes it.
pub fn silu_quantized_tile(fused: bool) -> Result<Option<QuantGemvConfig>> {
    let var = if fused {
        "TILEFUSE_QUANT_SILU_GATE_UP"
    } else {
        "TILEFUSE_QUANT_SILU_GATE_UP_UNFUSED"
    };
    match std::env::var(var) {
        Ok(v) => silu_tile_policy(var, &v),
        Err(_) => Ok(fused.then_some(SILU_GATE_UP_TILE)),
    }
}

/// The default tile of [`silu_quantized_tile`].
pub const SILU_GATE_UP_TILE: QuantGemvConfig = QuantGemvConfig {
    block_n: 64,
    block_k: 1024,
    num_warps: 8,
};

/// [`silu_quantized_tile`] under the override `v` of the variable `var`.
fn silu_tile_policy(var: &str, v: &str) -> Result<Option<QuantGemvConfig>> {
    if v.trim() == "0" {
        return Ok(None);
    }
    match QuantGemvConfig::parse(v) {
        Some(cfg) if cfg.block_n == 64 => Ok(Some(cfg)),
        _ => Err(crate::error::EngineError::Option {
            message: format!(
                "{var}=`{v}`: expected 0 or 64,COLS,WARPS (COLS 512 with WARPS 4 or 8, or 1024 with 8)"
            ),
        }),
    }
}

/// The longest rows whose norm [`fuses_norm`] moves into the GEMV by default.
pub const FUSED_NORM_MAX_COLS: usize = 2048;

/// A launch configuration of the multi-token GEMVs
/// ([`crate::kernels_quant::q4_k_gemv_tokens`] and its twins): rows and columns per
/// tile, tokens per program.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TokensTile {
    /// Rows per program (`BLOCK_N`: 4, 8 or 16).
    pub block_n: usize,
    /// Columns per tile (`BLOCK_K`: 512 or 1024).
    pub block_k: usize,
    /// Tokens per program (`T`: 2, 4 or 8).
    pub tokens: usize,
}

impl TokensTile {
    /// The tile for a chunk of `tokens` over a matrix of `rows` rows, read off the
    /// fastest tiles alone on an H200 at Qwen3-0.6B's and Qwen3-8B's shapes
    /// (`examples/quant_bandwidth.rs --tokens`, docs/perf.md "Short prompts of
    /// quantized models"): matrices of fewer than 2048 rows take more programs (4 or 8
    /// rows, 2 tokens a program) up to 8 tokens; the others 16 rows of 1024 columns and
    /// the fewest compiled tokens a program that cover the chunk, at most 8.
    pub fn for_shape(rows: usize, tokens: usize) -> TokensTile {
        let covering = [2, 4, 8].into_iter().find(|&t| t >= tokens).unwrap_or(8);
        let (block_n, tokens) = match (rows < 2048, tokens) {
            (true, 0..=4) => (4, 2),
            (true, 5..=8) => (8, 2),
            _ => (16, covering),
        };
        TokensTile {
            block_n,
            block_k: 1024,
            tokens,
        }
    }

    /// Whether the kernels are compiled for this tile.
    pub fn compiled(&self) -> bool {
        [4, 8, 16].contains(&self.block_n)
            && [512, 1024].contains(&self.block_k)
            && [2, 4, 8].contains(&self.tokens)
    }
}

/// `tokens` rows of int8 activations, each `cols` long (a multiple of 32), as
/// [`crate::kernels_quant::quantize_act`] writes them: the input of the multi-token
/// GEMVs ([`DeviceQuantMatrix::gemv_tokens`]).
#[derive(Debug)]
pub struct QuantRows {
    /// Rows the buffers hold room for, at [`QuantRows::cols`] each.
    capacity: usize,
    /// Columns a row has room for.
    cols: usize,
    /// Rows written by the last quantization.
    rows: usize,
    /// Columns of each written row.
    width: usize,
    /// `[capacity * cols / 4]` int8 values, four a word.
    xq: Buffer<i32>,
    /// `[capacity * cols / 32]` block scales.
    xd: Buffer<f32>,
    /// The quantizer's timeline stamps, never written (`stamp_at` is -1).
    no_stamps: Buffer<i64>,
    /// The quantizer's prefetch range, never read (its length is 0).
    no_words: Buffer<u32>,
}

impl QuantRows {
    /// Room for `rows` rows of up to `cols` columns (rounded up to 32) on `dev`.
    pub fn new(dev: &Device, rows: usize, cols: usize) -> Result<Self> {
        let cols = cols.div_ceil(32) * 32;
        Ok(QuantRows {
            capacity: rows,
            cols,
            rows: 0,
            width: 0,
            no_stamps: dev.zeros(4)?,
            no_words: dev.zeros(1)?,
            xq: dev.zeros((rows * cols / 4).max(1))?,
            xd: dev.zeros((rows * cols / 32).max(1))?,
        })
    }

    /// Rows and columns of room.
    pub fn room(&self) -> (usize, usize) {
        (self.capacity, self.cols)
    }

    /// Rows the last quantization wrote.
    pub fn rows(&self) -> usize {
        self.rows
    }

    fn check(&self, rows: usize, cols: usize, what: &str) -> Result<()> {
        if rows == 0 || rows > self.capacity || cols > self.cols || cols % 32 != 0 {
            return Err(crate::error::EngineError::Option {
                message: format!(
                    "quantizing {rows} rows of {cols} columns ({what}) into room for {} rows of {} (columns a multiple of 32)",
                    self.capacity, self.cols
                ),
            });
        }
        Ok(())
    }

    /// Quantizes the `rows` rows of the row-major `[rows, cols]` bf16 matrix `a`
    /// ([`crate::kernels_quant::quantize_act`] `MODE = 0` over `rows * cols` values: no
    /// block straddles two rows).
    pub fn quantize(
        &mut self,
        dev: &Device,
        a: &Buffer<bf16>,
        rows: usize,
        cols: usize,
    ) -> Result<()> {
        self.check(rows, cols, "a bf16 input")?;
        if a.len() < rows * cols {
            return Err(crate::error::EngineError::Option {
                message: format!(
                    "quantizing {rows} rows of {cols} columns from a buffer of {}",
                    a.len()
                ),
            });
        }
        const B: usize = 256;
        let len = rows * cols;
        let launch = LaunchConfig::from(len.div_ceil(B) as u32).num_warps(4);
        let mut args: Vec<KernelArg<'_>> = vec![
            a.into(),
            a.into(),
            (&mut self.xq).into(),
            (&mut self.xd).into(),
            (len as i32).into(),
            0.0f32.into(),
            (&self.no_words).into(),
            0i32.into(),
            0i32.into(),
            (&mut self.no_stamps).into(),
            (-1i32).into(),
        ];
        QUANTIZE_ACT.launch_dyn(dev, launch, &[B as i64, 0, 0], &mut args)?;
        (self.rows, self.width) = (rows, cols);
        Ok(())
    }

    /// Quantizes `bf16(bf16(silu(g)) * u)` of each of the `rows` rows of `gu`
    /// (`[rows, 2 * inter]`, `[g; u]` a row: a gate/up projection's output), `inter`
    /// columns a row ([`crate::kernels_quant::quantize_silu_mul_rows`]).
    pub fn quantize_silu_mul(
        &mut self,
        dev: &Device,
        gu: &Buffer<bf16>,
        rows: usize,
        inter: usize,
    ) -> Result<()> {
        self.check(rows, inter, "a SiLU product")?;
        if gu.len() < rows * 2 * inter {
            return Err(crate::error::EngineError::Option {
                message: format!(
                    "the SiLU product of {rows} rows of 2 x {inter} columns from a buffer of {}",
                    gu.len()
                ),
            });
        }
        const B: usize = 256;
        let launch = LaunchConfig::from([inter.div_ceil(B) as u32, rows as u32, 1]).num_warps(4);
        let mut args: Vec<KernelArg<'_>> = vec![
            gu.into(),
            (&mut self.xq).into(),
            (&mut self.xd).into(),
            (inter as i32).into(),
        ];
        QUANTIZE_SILU_MUL_ROWS.launch_dyn(dev, launch, &[B as i64], &mut args)?;
        (self.rows, self.width) = (rows, inter);
        Ok(())
    }

    /// The activation buffers (`xq`, `xd`), for reading back in tests.
    pub fn activation(&self) -> (&Buffer<i32>, &Buffer<f32>) {
        (&self.xq, &self.xd)
    }
}

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
        for block_n in [1, 2, 4, 8, 16, 32] {
            for block_k in [256, 512, 1024, 2048] {
                for num_warps in [4, 8] {
                    // Long tiles for few rows, many rows for short tiles (as compiled).
                    if (block_k == 2048 && block_n >= 8) || (block_k == 1024 && block_n == 32) {
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

    /// The decode step's configuration for a `[rows, cols]` matrix of type `ty`
    /// (measured inside the step, docs/perf.md "The quantized LM head and the step's
    /// tiles"; the kernels alone, "Scale loads in the weight tile's layout"):
    ///
    /// - fewer than 2048 rows (Qwen3-0.6B's O and down, a K/V run): 4 rows of
    ///   2048-column tiles over 8 warps when the rows are longer than 1024 (the grid
    ///   stays over the SMs), else 8 rows of 1024 columns over 4 warps;
    /// - 16384 rows or more (Qwen3-8B's gate/up): 16 rows of 1024 columns over 4 warps
    ///   (1.9% off the 8B step; at 0.6B's 6144 rows, +0.4%);
    /// - as long as tall or longer (8B's O and down, residual GEMVs): Q4_K longer than
    ///   tall (down) 4 rows of 2048 columns over 4 warps, at 64 registers (one wave of
    ///   1024 programs at 4096 rows, docs/perf.md "Register limits by tile"); Q4_K
    ///   square (O) 8 rows of 1024 columns over 4 warps (1.1% off the 8B step on an
    ///   H100, noise on an H200: docs/perf.md "The O projection's tile on an H100");
    ///   Q6_K 16 rows of 1024 columns over 8 warps, whose residual variant keeps the
    ///   next tile in flight (docs/perf.md "Prefetching loops unrolled by two"); Q8_0 4
    ///   rows of 2048 columns over 4 warps;
    /// - else (QKV) 8 rows of 1024 columns over 4 warps (Q8_0 with 2048 columns or more:
    ///   4 rows of 2048 columns over 4 warps).
    ///
    /// Q5_K, Q4_0 and Q5_0 (in nibble words) take Q4_K's tiles: the Q4_K kernel reads
    /// them. The environment's overrides are applied by [`QuantGemvConfig::for_step`].
    pub fn for_shape(ty: GgmlType, rows: usize, cols: usize) -> QuantGemvConfig {
        // Q5_K, Q4_0 and Q5_0 run Q4_K's kernel (its `LAYOUT` variants), at Q4_K's
        // tiles.
        let k_mins = read_by_q4_k_kernels(ty);
        let (block_n, block_k, num_warps) = if rows < 2048 {
            if cols > 1024 {
                (4, 2048, 8)
            } else {
                (8, 1024, 4)
            }
        } else if (ty == GgmlType::Q8_0 || ty == GgmlType::Q5_1) && cols >= 2048 {
            (4, 2048, 4)
        } else if rows >= 16384 {
            (16, 1024, 4)
        } else if cols > rows && k_mins {
            (4, 2048, 4)
        } else if cols == rows && k_mins {
            (8, 1024, 4)
        } else if cols >= rows {
            (16, 1024, 8)
        } else {
            (8, 1024, 4)
        };
        QuantGemvConfig {
            block_n,
            block_k,
            num_warps,
        }
    }

    /// The configuration of a GEMV that quantizes its normed input itself
    /// ([`DeviceQuantMatrix::gemv_norm_fused`]): 16 rows of 1024-column tiles over 4
    /// warps for 2048 rows or more, which halves the programs that each quantize the
    /// whole input (Qwen3-0.6B on an H200: Q4_K_M 1931 tokens/s against 1884 with
    /// [`QuantGemvConfig::for_shape`]'s 8 rows, Q8_0 2043 against 1979; 8 warps, 8 or
    /// 4 rows and 512-column tiles were slower, docs/perf.md "The norm inside the
    /// quantized GEMV"), else [`QuantGemvConfig::for_shape`]'s.
    pub fn for_norm_fused(ty: GgmlType, rows: usize, cols: usize) -> QuantGemvConfig {
        if rows >= 2048 {
            QuantGemvConfig {
                block_n: 16,
                block_k: 1024,
                num_warps: 4,
            }
        } else {
            Self::for_shape(ty, rows, cols)
        }
    }

    /// An LM head's configuration: 16 rows of 1024-column tiles over 4 warps, the best
    /// of the head's compiled configurations inside the step at Qwen3-0.6B's and
    /// Qwen3-8B's vocabulary (151936 rows; 8 rows: 1.2% slower at 0.6B, 8 warps
    /// 2-5%), with half the greedy candidates of 8 rows for `argmax_finish`.
    pub const HEAD: QuantGemvConfig = QuantGemvConfig {
        block_n: 16,
        block_k: 1024,
        num_warps: 4,
    };

    /// [`QuantGemvConfig::for_shape`]'s choice (`head`: for an LM head), unless the
    /// environment overrides it, for measuring configurations inside the decode step:
    /// `TILEFUSE_QUANT_TILES` ([`QuantTiles`]: per shape, first) or
    /// `TILEFUSE_QUANT_TILE=n,k,warps` (every matrix of 2048 rows or more). A malformed
    /// or uncompiled override is an error naming it.
    pub fn for_step(ty: GgmlType, rows: usize, cols: usize, head: bool) -> Result<QuantGemvConfig> {
        let base = if head {
            Self::HEAD
        } else {
            Self::for_shape(ty, rows, cols)
        };
        Self::overridden(ty, rows, cols, head, false, base)
    }

    /// [`QuantGemvConfig::for_norm_fused`]'s choice, unless the environment overrides
    /// it as for [`QuantGemvConfig::for_step`] (`TILEFUSE_QUANT_TILES` by its `norm:`
    /// entries).
    pub fn for_step_norm_fused(ty: GgmlType, rows: usize, cols: usize) -> Result<QuantGemvConfig> {
        Self::overridden(
            ty,
            rows,
            cols,
            false,
            true,
            Self::for_norm_fused(ty, rows, cols),
        )
    }

    /// `base`, or the environment's override for a `[rows, cols]` matrix (`norm_fused`:
    /// for the GEMV that quantizes its normed input itself).
    fn overridden(
        ty: GgmlType,
        rows: usize,
        cols: usize,
        head: bool,
        norm_fused: bool,
        base: QuantGemvConfig,
    ) -> Result<QuantGemvConfig> {
        if let Some(tiles) = QuantTiles::from_env()? {
            let given = if norm_fused {
                tiles.get_norm_fused(ty, rows, cols)
            } else {
                tiles.get(ty, rows, cols)
            };
            if let Some(cfg) = given {
                cfg.check(head)?;
                return Ok(cfg);
            }
        }
        if rows >= 2048 {
            if let Ok(v) = std::env::var("TILEFUSE_QUANT_TILE") {
                let cfg = Self::parse(&v).ok_or_else(|| crate::error::EngineError::Option {
                    message: format!("TILEFUSE_QUANT_TILE=`{v}`: expected `n,k,warps`"),
                })?;
                cfg.check(head)?;
                return Ok(cfg);
            }
        }
        Ok(base)
    }

    /// Whether [`launch_q4_k_q6_k`] is compiled for a run of type `types.0` at this
    /// configuration followed by a run of type `types.1` at `second` (`norm_fused`: the
    /// variant that quantizes its normed input itself): a Q4_K or Q5_K run in 8 or 16
    /// rows of 512- or 1024-column tiles, then a Q6_K run at the same tile, or, over an
    /// input quantized before, in 2 or 4 rows of 2048 columns beside 8 rows of 1024; or
    /// a Q3_K run then a Q4_K or Q5_K run, both at one such tile; both at the same
    /// warps.
    pub fn merged_runs_compiled(
        &self,
        second: &QuantGemvConfig,
        types: (GgmlType, GgmlType),
        norm_fused: bool,
    ) -> bool {
        self.num_warps == second.num_warps
            && merged_consts(types, *self, *second, norm_fused, 0).is_some_and(|consts| {
                Q4_K_Q6_K_GEMV
                    .variant(&consts, Some(self.num_warps))
                    .is_ok()
            })
    }

    /// An error unless this configuration is compiled (for an LM head: and its
    /// tiles are at most 1024 columns, the head variant's longest).
    pub fn check(&self, head: bool) -> Result<()> {
        if !Self::all().contains(self) || (head && self.block_k > 1024) {
            return Err(crate::error::EngineError::Option {
                message: format!(
                    "quantized GEMV configuration {},{},{}{} is not compiled (QuantGemvConfig::all)",
                    self.block_n,
                    self.block_k,
                    self.num_warps,
                    if head { " for an LM head" } else { "" }
                ),
            });
        }
        Ok(())
    }

    /// `n,k,warps` as a configuration.
    fn parse(v: &str) -> Option<QuantGemvConfig> {
        let p: Vec<usize> = v
            .split(',')
            .map(|x| x.trim().parse().ok())
            .collect::<Option<_>>()?;
        match p.as_slice() {
            &[block_n, block_k, num_warps] => Some(QuantGemvConfig {
                block_n,
                block_k,
                num_warps: u32::try_from(num_warps).ok()?,
            }),
            _ => None,
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

/// Launch configurations per matrix shape, for measuring choices inside the decode
/// step: `ROWSxCOLS=n,k,warps` entries separated by `;` (e.g.
/// `4096x4096=8,1024,8;151936x4096=16,1024,4`), each for every quantized matrix (or
/// run of rows of one type) of that shape. An entry written `norm:ROWSxCOLS=n,k,warps`
/// is for the GEMV that quantizes its RMSNorm input itself
/// ([`DeviceQuantMatrix::gemv_norm_fused`], the QKV and gate/up projections where
/// [`fuses_norm`]), a plain one for the GEMV over an activation quantized before it: the
/// two variants are tuned apart. A type before the shape (`Q6_K:4096x12288=..`, after
/// `norm:` if both) limits an entry to runs of that type, so that the Q4_K and Q6_K
/// matrices of one shape (a Q4_K_M model's down projections) are tuned apart. The
/// environment's `TILEFUSE_QUANT_TILES` ([`QuantGemvConfig::for_step`]), and `tilefuse
/// bench --quant-tiles`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct QuantTiles {
    /// The plain entries, in the order given (the first match wins).
    pub entries: Vec<TileEntry>,
    /// The same for the `norm:` entries.
    pub norm_fused: Vec<TileEntry>,
}

/// One entry of [`QuantTiles`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TileEntry {
    /// The type it is limited to (`None`: every type).
    pub ty: Option<GgmlType>,
    /// Rows of the matrix (or run).
    pub rows: usize,
    /// Columns of the matrix.
    pub cols: usize,
    /// The configuration it takes.
    pub cfg: QuantGemvConfig,
}

impl QuantTiles {
    /// Parses `[norm:][TYPE:]ROWSxCOLS=n,k,warps[;...]` (empty entries are skipped;
    /// `TYPE` is `Q8_0`, `Q4_K`, `Q5_K`, `Q6_K`, `Q4_0`, `Q5_0` or `Q3_K`, in any case); an error names the entry that
    /// does not parse.
    pub fn parse(spec: &str) -> Result<QuantTiles> {
        let mut tiles = QuantTiles::default();
        for entry in spec.split(';').map(str::trim).filter(|e| !e.is_empty()) {
            let bad = || {
                crate::error::EngineError::Option {
                message: format!(
                    "quantized tile `{entry}`: expected `[norm:][TYPE:]ROWSxCOLS=n,k,warps` (TYPE: Q8_0, Q4_K, Q5_K, Q6_K, Q4_0, Q5_0, Q3_K or IQ4_XS)"
                ),
            }
            };
            let (list, body) = match entry.strip_prefix("norm:") {
                Some(body) => (&mut tiles.norm_fused, body),
                None => (&mut tiles.entries, entry),
            };
            let (ty, body) = match body.split_once(':') {
                Some((name, rest)) => {
                    let ty = [
                        GgmlType::Q8_0,
                        GgmlType::Q4_K,
                        GgmlType::Q5_K,
                        GgmlType::Q6_K,
                        GgmlType::Q4_0,
                        GgmlType::Q5_0,
                        GgmlType::Q3_K,
                        GgmlType::IQ4_XS,
                    ]
                    .into_iter()
                    .find(|t| t.name().eq_ignore_ascii_case(name.trim()))
                    .ok_or_else(bad)?;
                    (Some(ty), rest)
                }
                None => (None, body),
            };
            let (shape, cfg) = body.split_once('=').ok_or_else(bad)?;
            let (rows, cols) = shape.split_once('x').ok_or_else(bad)?;
            let rows: usize = rows.trim().parse().map_err(|_| bad())?;
            let cols: usize = cols.trim().parse().map_err(|_| bad())?;
            let cfg = QuantGemvConfig::parse(cfg).ok_or_else(bad)?;
            list.push(TileEntry {
                ty,
                rows,
                cols,
                cfg,
            });
        }
        Ok(tiles)
    }

    /// `TILEFUSE_QUANT_TILES`, parsed, if set.
    pub fn from_env() -> Result<Option<QuantTiles>> {
        match std::env::var("TILEFUSE_QUANT_TILES") {
            Ok(v) => {
                QuantTiles::parse(&v)
                    .map(Some)
                    .map_err(|e| crate::error::EngineError::Option {
                        message: format!("TILEFUSE_QUANT_TILES: {e}"),
                    })
            }
            Err(_) => Ok(None),
        }
    }

    /// The configuration given for a `[rows, cols]` run of type `ty` (a plain entry),
    /// if any.
    pub fn get(&self, ty: GgmlType, rows: usize, cols: usize) -> Option<QuantGemvConfig> {
        Self::find(&self.entries, ty, rows, cols)
    }

    /// The configuration given for the normed GEMV over a `[rows, cols]` run of type
    /// `ty` that quantizes its input itself (a `norm:` entry), if any.
    pub fn get_norm_fused(
        &self,
        ty: GgmlType,
        rows: usize,
        cols: usize,
    ) -> Option<QuantGemvConfig> {
        Self::find(&self.norm_fused, ty, rows, cols)
    }

    fn find(list: &[TileEntry], ty: GgmlType, rows: usize, cols: usize) -> Option<QuantGemvConfig> {
        list.iter()
            .find(|e| e.rows == rows && e.cols == cols && e.ty.is_none_or(|t| t == ty))
            .map(|e| e.cfg)
    }
}

/// The device arrays of one quantized matrix (see [`PackedMatrix`] for the layout).
#[derive(Debug)]
pub enum QuantBuffers {
    /// Q8_0: quant words and block scales; Q4_1 and Q5_1 (`Q5_1` as the type): the
    /// same and block offsets.
    Q8_0 {
        /// `[rows, cols / 4]`.
        q: Buffer<u32>,
        /// `[rows, cols / 32]`.
        d: Buffer<f16>,
        /// Q4_1 and Q5_1: `[rows, cols / 32]` offsets.
        m: Option<Buffer<f16>>,
    },
    /// Q4_K: quant words, sub-block scales and mins, super-block scales; Q5_K: the
    /// same and its fifth bits.
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
        /// Q5_K: `[rows, cols / 32]` fifth-bit words.
        qh: Option<Buffer<u32>>,
    },
    /// Q4_0: Q4_K's nibble words and a scale a block; Q5_0: the same and its fifth
    /// bits (read by the Q4_K kernels' `LAYOUT` 2 and 3 variants).
    Q4_0 {
        /// `[rows, cols / 8]`.
        q: Buffer<u32>,
        /// `[rows, cols / 32]`.
        d: Buffer<f16>,
        /// Q5_0: `[rows, cols / 32]` fifth-bit words.
        qh: Option<Buffer<u32>>,
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
    /// IQ4_XS: table-index words, block scales, super-block scales (read by the Q4_K
    /// kernels' `LAYOUT = 4` variants).
    IQ4XS {
        /// `[rows, cols / 8]`.
        q: Buffer<u32>,
        /// `[rows, cols / 32]`.
        scales: Buffer<u8>,
        /// `[rows, cols / 256]`.
        d: Buffer<f16>,
    },
    /// Q3_K: four words a block (quants and the block's scales), super-block scales
    /// (read by the Q6_K kernels' `LAYOUT = 1` variants).
    Q3K {
        /// `[rows, cols / 8]`.
        q: Buffer<u32>,
        /// `[rows, cols / 256]`.
        d: Buffer<f16>,
    },
}

/// Q6_K's high-bits words as the kernels read them: each block's two 32-bit words as
/// one `i64` (`q6_k_high`), one 8-byte load instead of the same word loaded twice. The
/// array holds `rows * cols / 16` words, an even count for whole 256-value blocks (an
/// odd count is an error that says so).
fn qh64(qh: &Buffer<u32>) -> Result<KernelArg<'_>> {
    Ok(KernelArg::read_as::<i64, u32>(qh)?)
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
    /// The packed quant words, the bulk of the matrix's bytes (Q8_0's, Q4_K's and
    /// Q3_K's `q`, Q6_K's low nibbles `ql`), `[rows, ..]` row-major.
    pub fn words(&self) -> &Buffer<u32> {
        match &self.buffers {
            QuantBuffers::Q8_0 { q, .. }
            | QuantBuffers::Q4K { q, .. }
            | QuantBuffers::Q4_0 { q, .. }
            | QuantBuffers::Q3K { q, .. }
            | QuantBuffers::IQ4XS { q, .. } => q,
            QuantBuffers::Q6K { ql, .. } => ql,
        }
    }

    /// Uploads `m`'s arrays to `dev`.
    pub fn upload(dev: &Device, m: &PackedMatrix) -> Result<Self> {
        let (rows, cols) = m.shape();
        let buffers = match m {
            PackedMatrix::Q8_0 { q, d, m, .. } => QuantBuffers::Q8_0 {
                q: dev.upload(q)?,
                d: dev.upload(d)?,
                m: m.as_ref().map(|m| dev.upload(m)).transpose()?,
            },
            PackedMatrix::Q4K {
                q,
                scales,
                mins,
                d,
                dmin,
                qh,
                ..
            } => QuantBuffers::Q4K {
                q: dev.upload(q)?,
                scales: dev.upload(scales)?,
                mins: dev.upload(mins)?,
                d: dev.upload(d)?,
                dmin: dev.upload(dmin)?,
                qh: qh.as_ref().map(|qh| dev.upload(qh)).transpose()?,
            },
            PackedMatrix::Q4_0 { q, d, qh, .. } => QuantBuffers::Q4_0 {
                q: dev.upload(q)?,
                d: dev.upload(d)?,
                qh: qh.as_ref().map(|qh| dev.upload(qh)).transpose()?,
            },
            PackedMatrix::Q6K {
                ql, qh, scales, d, ..
            } => QuantBuffers::Q6K {
                ql: dev.upload(ql)?,
                qh: dev.upload(qh)?,
                scales: dev.upload(scales)?,
                d: dev.upload(d)?,
            },
            PackedMatrix::Q3K { q, d, .. } => QuantBuffers::Q3K {
                q: dev.upload(q)?,
                d: dev.upload(d)?,
            },
            PackedMatrix::IQ4XS { q, scales, d, .. } => QuantBuffers::IQ4XS {
                q: dev.upload(q)?,
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
            QuantBuffers::Q8_0 { m: None, .. } => GgmlType::Q8_0,
            QuantBuffers::Q8_0 { m: Some(_), .. } => GgmlType::Q5_1,
            QuantBuffers::Q4K { qh: None, .. } => GgmlType::Q4_K,
            QuantBuffers::Q4K { qh: Some(_), .. } => GgmlType::Q5_K,
            QuantBuffers::Q4_0 { qh: None, .. } => GgmlType::Q4_0,
            QuantBuffers::Q4_0 { qh: Some(_), .. } => GgmlType::Q5_0,
            QuantBuffers::Q6K { .. } => GgmlType::Q6_K,
            QuantBuffers::Q3K { .. } => GgmlType::Q3_K,
            QuantBuffers::IQ4XS { .. } => GgmlType::IQ4_XS,
        }
    }

    /// The kernel that reads this matrix.
    pub fn kernel(&self) -> &'static KernelDef {
        match self.buffers {
            QuantBuffers::Q8_0 { .. } => &Q8_0_GEMV,
            QuantBuffers::Q4K { .. } | QuantBuffers::Q4_0 { .. } | QuantBuffers::IQ4XS { .. } => {
                &Q4_K_GEMV
            }
            QuantBuffers::Q6K { .. } | QuantBuffers::Q3K { .. } => &Q6_K_GEMV,
        }
    }

    /// Programs of the plain GEMV (`residual`: the residual one) at `cfg` one SM of
    /// `dev` holds at once, and the waves its grid over this matrix takes on `sms` SMs
    /// (`None` on the interpreter): a grid just past a whole wave pays a mostly empty
    /// second one (docs/perf.md, "Register limits by tile").
    pub fn waves(
        &self,
        dev: &Device,
        cfg: QuantGemvConfig,
        residual: bool,
        sms: usize,
    ) -> Result<Option<(u32, f64)>> {
        let consts = self.gemv_consts(cfg, residual, false, false, false, false);
        let per_sm = self
            .kernel()
            .programs_per_sm(dev, &consts, Some(cfg.num_warps))?;
        Ok(per_sm.map(|p| {
            let slots = f64::from(p.max(1)) * sms.max(1) as f64;
            (p, f64::from(cfg.grid(self.rows)) / slots)
        }))
    }

    /// Whether this matrix's GEMV is compiled at `cfg` for the variant asked: the LM
    /// head (`head`), the norm inside (`act`), or the plain one with or without a
    /// `residual`. Q5_K's and Q5_1's variants cover the step's tiles, not every one
    /// [`QuantGemvConfig::all`] lists (4 to 16 rows of 512 to 2048 columns).
    pub fn gemv_compiled(
        &self,
        cfg: QuantGemvConfig,
        residual: bool,
        head: bool,
        act: bool,
    ) -> bool {
        let consts = self.gemv_consts(cfg, residual && !head, head, act, false, false);
        self.kernel().variant(&consts, Some(cfg.num_warps)).is_ok()
    }

    /// Whether the GEMV over this matrix at `cfg` (no norm, no LM head) runs the
    /// variant whose loads take no masks (`EVEN = 1` of [`crate::kernels_quant::q4_k_gemv`]).
    pub fn reads_unmasked(&self, cfg: QuantGemvConfig, residual: bool) -> bool {
        self.q4_k_kernel() && self.gemv_consts(cfg, residual, false, false, false, false)[5] == 1
    }

    /// The compile-time constants of this matrix's GEMV variant at `cfg`: `BLOCK_N`,
    /// `BLOCK_K`, `RESIDUAL`, `HEAD`, `ACT`; for Q4_K and Q5_K `EVEN`, 1 where every row
    /// of every program exists and the rows are whole tiles long (then the kernel's
    /// loads take no masks: docs/perf.md, "Loads without masks") and that variant is
    /// compiled, `SILU_Q` and `LAYOUT`; last `STAMPS`, 1 for a launch that writes timeline
    /// stamps.
    fn gemv_consts(
        &self,
        cfg: QuantGemvConfig,
        residual: bool,
        head: bool,
        act: bool,
        silu_q: bool,
        stamps: bool,
    ) -> Vec<i64> {
        let mut consts = vec![
            cfg.block_n as i64,
            cfg.block_k as i64,
            i64::from(residual),
            i64::from(head),
            i64::from(act),
        ];
        let k_mins = self.q4_k_kernel();
        if k_mins {
            consts.extend([1, i64::from(silu_q)]);
        }
        consts.push(self.layout_const());
        consts.push(i64::from(stamps));
        if k_mins {
            let whole = self.rows % cfg.block_n == 0 && self.cols % cfg.block_k == 0;
            let allowed = unmasked_rows_allowed(cfg.block_n);
            if !whole || !allowed || Q4_K_GEMV.variant(&consts, Some(cfg.num_warps)).is_err() {
                consts[5] = 0;
            }
        }
        consts
    }

    /// `silu(gate) * up` of `y = bf16(W · rmsnorm(a) + bias)` over this `[gate; up]`
    /// matrix (gate the first half of its rows), written as the down projection's int8
    /// input into `spare` ([`QuantSpare::activation`]): the Q4_K GEMV's `SILU_Q = 1`
    /// variant, each program 32 gate rows and the same 32 up rows (`cfg.block_n` 64).
    /// With `fused` it quantizes the normed input itself as
    /// [`DeviceQuantMatrix::gemv_norm_fused`] does (one launch); else a quantizer
    /// launch first writes it into `spare`. Either way the GEMV writes down's input
    /// into the spare's second pair of buffers, which then trades places with the first. The
    /// same int8 blocks as that GEMV followed by [`QuantSpare::quantize`] with
    /// [`QuantVariant::SiluMulResidual`], but for the row sums' order. An error unless
    /// [`DeviceQuantMatrix::silu_quantized_compiled`] and the half is a multiple of 32.
    #[allow(clippy::too_many_arguments)]
    pub fn gemv_norm_silu_quantized(
        &self,
        dev: &Device,
        cfg: QuantGemvConfig,
        fused: bool,
        a: &Buffer<bf16>,
        norm_w: &Buffer<bf16>,
        eps: f32,
        bias: &Buffer<bf16>,
        spare: &mut QuantSpare,
        serialized: bool,
    ) -> Result<()> {
        let half = self.rows / 2;
        if !self.silu_quantized_compiled(cfg, fused)
            || self.rows % 64 != 0
            || half > spare.cols
            || a.len() < self.cols
            || norm_w.len() < self.cols
            || bias.len() < self.rows
        {
            return Err(crate::error::EngineError::Option {
                message: format!(
                    "a [gate; up] GEMV writing down's int8 input over a {} {}x{} matrix at {cfg:?} (norm inside: {fused}; compiled: {}; rows a multiple of 64) with activation buffers for {}, an input of {}, norm weights of {} and a bias of {}",
                    self.ggml_type().name(),
                    self.rows,
                    self.cols,
                    self.silu_quantized_compiled(cfg, fused),
                    spare.cols,
                    a.len(),
                    norm_w.len(),
                    bias.len()
                ),
            });
        }
        let out = QuantOut::DownInput { bias };
        if fused {
            let norm = Some((a, norm_w, eps));
            return self.launch_kernel(dev, cfg, false, norm, out, spare, serialized);
        }
        let variant = QuantVariant::Norm { norm_w, eps };
        self.launch(dev, cfg, variant, a, out, spare, serialized)
    }

    /// Whether [`DeviceQuantMatrix::gemv_norm_silu_quantized`]'s variant is compiled
    /// for this matrix at `cfg` (Q4_K; 64 rows of 512 or 1024 columns, 4 or 8 warps,
    /// but 1024 columns over 8 only), with the norm inside (`fused`) or not.
    pub fn silu_quantized_compiled(&self, cfg: QuantGemvConfig, fused: bool) -> bool {
        self.q4_k_kernel()
            && Q4_K_GEMV
                .variant(
                    &self.gemv_consts(cfg, false, false, fused, true, false),
                    Some(cfg.num_warps),
                )
                .is_ok()
    }

    /// Whether the Q4_K kernels read this matrix (Q4_K, Q5_K, Q4_0, Q5_0 and IQ4_XS).
    fn q4_k_kernel(&self) -> bool {
        read_by_q4_k_kernels(self.ggml_type())
    }

    /// The arrays every kernel over this matrix takes first, in the device layout's
    /// order, and `k_words`: the 32-bit words of quantized values a row (Q8_0 four
    /// values a word, Q4_K and Q6_K eight). `wide_qh`: Q6_K's `qh` as the GEMVs read it
    /// ([`qh64`]), else as 32-bit words (the dequantizer, which reads a word an element).
    fn weight_args(&self, wide_qh: bool) -> Result<(Vec<KernelArg<'_>>, i32)> {
        let (args, per_word): (Vec<KernelArg<'_>>, usize) = match &self.buffers {
            // Without offsets (Q8_0) the kernels' `m` is not read.
            QuantBuffers::Q8_0 { q, d, m } => {
                (vec![q.into(), d.into(), m.as_ref().unwrap_or(d).into()], 4)
            }
            QuantBuffers::Q4K {
                q,
                scales,
                mins,
                d,
                dmin,
                qh,
            } => (
                // Without fifth bits (Q4_K) the kernels' `qh` is not read.
                vec![
                    q.into(),
                    qh.as_ref().unwrap_or(q).into(),
                    scales.into(),
                    mins.into(),
                    d.into(),
                    dmin.into(),
                ],
                8,
            ),
            // The Q4_K kernels' `scales`, `mins` and `dmin`, not read for these types,
            // point at the quant words and the scales.
            QuantBuffers::Q4_0 { q, d, qh } => (
                vec![
                    q.into(),
                    qh.as_ref().unwrap_or(q).into(),
                    KernelArg::read_as::<u8, u32>(q)?,
                    KernelArg::read_as::<u8, u32>(q)?,
                    d.into(),
                    d.into(),
                ],
                8,
            ),
            // The Q4_K kernels' `qh`, `mins` and `dmin`, not read for IQ4_XS, point at
            // the index words, the scales and `d`.
            QuantBuffers::IQ4XS { q, scales, d } => (
                vec![
                    q.into(),
                    q.into(),
                    scales.into(),
                    scales.into(),
                    d.into(),
                    d.into(),
                ],
                8,
            ),
            QuantBuffers::Q6K { ql, qh, scales, d } => (
                vec![
                    ql.into(),
                    if wide_qh { qh64(qh)? } else { qh.into() },
                    scales.into(),
                    d.into(),
                ],
                8,
            ),
            // The Q6_K kernels' `ql` takes the words; their `qh` and `scales` are not
            // read (the scales are in the words) and point at them.
            QuantBuffers::Q3K { q, d } => (
                vec![
                    q.into(),
                    if wide_qh { qh64(q)? } else { q.into() },
                    KernelArg::read_as::<u8, u32>(q)?,
                    d.into(),
                ],
                8,
            ),
        };
        Ok((args, (self.cols / per_word) as i32))
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
    /// `a = bf16(bf16(silu(g)) * u)` computed as the activation is quantized.
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

    /// For each row `t` of `x` (quantized rows of this matrix's `cols`, see
    /// [`QuantRows`]): `y[t] = bf16(W · x[t] + bias)` into rows `row0..row0 + rows` of
    /// the row-major `y` (`ldy` elements a token; `bias` indexed like one row of `y`);
    /// with `residual`, `y[t] = bf16(y[t] + bf16(W · x[t] + bias))`. One launch, `tile`
    /// tokens a program ([`crate::kernels_quant::q4_k_gemv_tokens`] and its twins).
    #[allow(clippy::too_many_arguments)]
    pub fn gemv_tokens(
        &self,
        dev: &Device,
        tile: TokensTile,
        x: &QuantRows,
        bias: &Buffer<bf16>,
        y: &mut Buffer<bf16>,
        row0: usize,
        ldy: usize,
        residual: bool,
    ) -> Result<()> {
        let tokens = x.rows;
        if !tile.compiled()
            || x.width != self.cols
            || tokens == 0
            || row0 + self.rows > ldy
            || y.len() < tokens * ldy
            || bias.len() < row0 + self.rows
        {
            return Err(crate::error::EngineError::Option {
                message: format!(
                    "a multi-token GEMV of a {}x{} matrix at {} rows, {} columns, {} tokens a program (compiled: 4, 8 or 16; 512 or 1024; 2, 4 or 8) over {} quantized rows of {} columns into rows {row0}.. of {} elements, {ldy} a token, bias of {}",
                    self.rows, self.cols, tile.block_n, tile.block_k, tile.tokens, tokens, x.width, y.len(), bias.len()
                ),
            });
        }
        let grid = [
            self.rows.div_ceil(tile.block_n) as u32,
            tokens.div_ceil(tile.tokens) as u32,
            1,
        ];
        let launch = LaunchConfig::from(grid).num_warps(4);
        let kernel = match self.buffers {
            QuantBuffers::Q8_0 { .. } => &Q8_0_GEMV_TOKENS,
            QuantBuffers::Q4K { .. } | QuantBuffers::Q4_0 { .. } | QuantBuffers::IQ4XS { .. } => {
                &Q4_K_GEMV_TOKENS
            }
            QuantBuffers::Q6K { .. } | QuantBuffers::Q3K { .. } => &Q6_K_GEMV_TOKENS,
        };
        let (mut args, k_words) = self.weight_args(true)?;
        args.extend([
            (&x.xq).into(),
            (&x.xd).into(),
            bias.into(),
            y.into(),
            (self.rows as i32).into(),
            (row0 as i32).into(),
            (ldy as i32).into(),
            k_words.into(),
            (tokens as i32).into(),
        ]);
        let mut consts = vec![
            tile.block_n as i64,
            tile.block_k as i64,
            tile.tokens as i64,
            i64::from(residual),
        ];
        consts.push(self.layout_const());
        kernel.launch_dyn(dev, launch, &consts, &mut args)?;
        Ok(())
    }

    /// The layout's constant of every kernel over this matrix (the GEMV's before
    /// `STAMPS`, the multi-token GEMV's and the dequantizer's last): `LAYOUT` of the
    /// Q4_K kernels (0 Q4_K, 1 Q5_K, 2 Q4_0, 3 Q5_0, 4 IQ4_XS), `MIN` of the Q8_0 ones (1 for Q4_1
    /// and Q5_1), `LAYOUT` of the Q6_K ones (0 Q6_K, 1 Q3_K).
    fn layout_const(&self) -> i64 {
        match &self.buffers {
            QuantBuffers::Q4K { qh, .. } => i64::from(qh.is_some()),
            QuantBuffers::Q4_0 { qh, .. } => 2 + i64::from(qh.is_some()),
            QuantBuffers::Q8_0 { m, .. } => i64::from(m.is_some()),
            QuantBuffers::Q6K { .. } => 0,
            QuantBuffers::Q3K { .. } => 1,
            QuantBuffers::IQ4XS { .. } => 4,
        }
    }

    /// Writes the matrix as bf16 into rows `row0..row0 + rows` of the row-major `[..,
    /// cols]` matrix `out` ([`crate::kernels_quant::dequantize_q4_k`] and its twins:
    /// [`PackedMatrix::dequantize`]'s values, rounded to bf16), for the batched prefill's
    /// GEMMs. The launch waits for the kernels before it.
    pub fn dequantize_into(&self, dev: &Device, out: &mut Buffer<bf16>, row0: usize) -> Result<()> {
        let tile = dequant_tile(self.ggml_type());
        self.dequantize_tile(dev, out, row0, tile)
    }

    /// [`DeviceQuantMatrix::dequantize_into`] with `(rows, blocks)` a program (compiled:
    /// rows 1 or 4; blocks of 32 elements 8 or 32; 16 rows of 32 blocks spilled), for
    /// measuring them
    /// (`examples/quant_bandwidth.rs --dequant`).
    pub fn dequantize_tile(
        &self,
        dev: &Device,
        out: &mut Buffer<bf16>,
        row0: usize,
        (r, blocks): (usize, usize),
    ) -> Result<()> {
        if ![1, 4].contains(&r) || ![8, 32].contains(&blocks) {
            return Err(crate::error::EngineError::Option {
                message: format!(
                    "a dequantization tile of {r} rows and {blocks} blocks (compiled: 1 or 4 rows; 8 or 32 blocks)"
                ),
            });
        }
        if out.len() < (row0 + self.rows) * self.cols {
            return Err(crate::error::EngineError::Option {
                message: format!(
                    "dequantizing a {}x{} matrix into rows {row0}.. of a buffer of {} elements",
                    self.rows,
                    self.cols,
                    out.len()
                ),
            });
        }
        let grid = [
            self.rows.div_ceil(r) as u32,
            (self.cols / 32).div_ceil(blocks) as u32,
            1,
        ];
        let launch = LaunchConfig::from(grid).num_warps(4);
        let (n, row0) = (self.rows as i32, row0 as i32);
        let kernel = match self.buffers {
            QuantBuffers::Q8_0 { .. } => &DEQUANTIZE_Q8_0,
            QuantBuffers::Q4K { .. } | QuantBuffers::Q4_0 { .. } | QuantBuffers::IQ4XS { .. } => {
                &DEQUANTIZE_Q4_K
            }
            QuantBuffers::Q6K { .. } | QuantBuffers::Q3K { .. } => &DEQUANTIZE_Q6_K,
        };
        let (mut args, k_words) = self.weight_args(false)?;
        args.extend([out.into(), n.into(), row0.into(), k_words.into()]);
        let mut consts = vec![r as i64, blocks as i64];
        consts.push(self.layout_const());
        kernel.launch_dyn(dev, launch, &consts, &mut args)?;
        Ok(())
    }

    /// Quantizes `a` in `variant` into `spare` ([`QuantSpare::quantize`]), then
    /// launches the GEMV over it ([`DeviceQuantMatrix::launch_quantized`]). An LM head
    /// ([`QuantOut::Head`]) takes [`QuantVariant::Norm`] (the final norm).
    /// `serialized`: the first launch waits for all earlier work (the first of a decode
    /// step; see `LaunchConfig::serialized`).
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
        spare.quantize(dev, variant, a, self.cols, head, serialized, None)?;
        self.launch_quantized(dev, cfg, variant.residual(), out, spare, false)
    }

    /// The GEMV over the activation [`QuantSpare::quantize`] left in `spare` (of this
    /// matrix's `cols`), writing `out`; with `residual`, added into `y`.
    pub fn launch_quantized(
        &self,
        dev: &Device,
        cfg: QuantGemvConfig,
        residual: bool,
        out: QuantOut<'_>,
        spare: &mut QuantSpare,
        serialized: bool,
    ) -> Result<()> {
        self.launch_kernel(dev, cfg, residual, None, out, spare, serialized)
    }

    /// `y = bf16(W · rmsnorm(a) + bias)` in one launch: each program quantizes the
    /// normed input of its own tile (`ACT = 1` in [`crate::kernels_quant`]: the blocks
    /// of `a * norm_w`, with `inv_rms` scaling the row sums), so no quantizer runs
    /// before it. Where it pays is the step's choice ([`fuses_norm`]).
    #[allow(clippy::too_many_arguments)]
    pub fn gemv_norm_fused(
        &self,
        dev: &Device,
        cfg: QuantGemvConfig,
        a: &Buffer<bf16>,
        norm_w: &Buffer<bf16>,
        eps: f32,
        out: QuantOut<'_>,
        spare: &mut QuantSpare,
        serialized: bool,
    ) -> Result<()> {
        if matches!(out, QuantOut::Head { .. }) {
            return Err(crate::error::EngineError::Option {
                message: "the LM head's final norm is quantized by its own launch".into(),
            });
        }
        if a.len() < self.cols || norm_w.len() < self.cols {
            return Err(crate::error::EngineError::Option {
                message: format!(
                    "a normed quantized GEMV over {} columns with an input of {} and norm weights of {}",
                    self.cols,
                    a.len(),
                    norm_w.len()
                ),
            });
        }
        self.launch_kernel(
            dev,
            cfg,
            false,
            Some((a, norm_w, eps)),
            out,
            spare,
            serialized,
        )
    }

    /// The GEMV kernel over the activation in `spare`, or with `norm = Some((a, norm_w,
    /// eps))` over RMSNorm of `a`, quantized in the kernel.
    #[allow(clippy::too_many_arguments)]
    fn launch_kernel(
        &self,
        dev: &Device,
        cfg: QuantGemvConfig,
        residual: bool,
        norm: Option<(&Buffer<bf16>, &Buffer<bf16>, f32)>,
        out: QuantOut<'_>,
        spare: &mut QuantSpare,
        serialized: bool,
    ) -> Result<()> {
        let head = matches!(out, QuantOut::Head { .. });
        if self.cols > spare.cols {
            return Err(crate::error::EngineError::Option {
                message: format!(
                    "a quantized GEMV over {} columns with activation buffers for {}",
                    self.cols, spare.cols
                ),
            });
        }
        // The `SILU_Q` variant writes down's input into the spare's other pair of
        // buffers (its own input may be in `xq`/`xd`), and the pairs trade places after
        // the launch, so down reads it from `xq`/`xd`.
        let silu_q = matches!(out, QuantOut::DownInput { .. });
        let mut launch = LaunchConfig::from(cfg.grid(self.rows)).num_warps(cfg.num_warps);
        if serialized {
            launch = launch.serialized();
        }
        let n = self.rows as i32;
        let (mut args, k_words) = self.weight_args(true)?;
        // The Q4_K kernel's `out_q`/`out_d` are written by its `SILU_Q` variant only,
        // but a kernel's parameters are declared once.
        args.extend([(&spare.xq).into(), (&spare.xd).into()]);
        if self.q4_k_kernel() {
            args.extend([(&mut spare.out_q).into(), (&mut spare.out_d).into()]);
        }
        // Without the norm prologue `a` and `norm_w` are not read.
        let (a, norm_w, eps) = norm.unwrap_or((&spare.bias, &spare.bias, 0.0));
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
                    (&spare.bias).into(),
                    (&mut spare.y).into(),
                    logits.into(),
                    part_val.into(),
                    part_idx.into(),
                ]);
                0
            }
            QuantOut::DownInput { bias } => {
                args.extend([
                    bias.into(),
                    (&mut spare.y).into(),
                    (&mut spare.logits).into(),
                    (&mut spare.part_val).into(),
                    (&mut spare.part_idx).into(),
                ]);
                0
            }
        };
        let stamp_at = spare.stamps.take(self.kernel().name, cfg.grid(self.rows))?;
        args.extend([n.into(), row0.into(), k_words.into(), eps.into()]);
        args.extend([(&mut spare.stamps.buf).into(), stamp_at.into()]);
        let act = norm.is_some();
        let consts = self.gemv_consts(cfg, residual && !head, head, act, silu_q, stamp_at >= 0);
        self.kernel().launch_dyn(dev, launch, &consts, &mut args)?;
        if silu_q {
            std::mem::swap(&mut spare.xq, &mut spare.out_q);
            std::mem::swap(&mut spare.xd, &mut spare.out_d);
        }
        Ok(())
    }
}

/// The constants of [`crate::kernels_quant::q4_k_q6_k_gemv`] for a run of type
/// `types.0` at `cfg` followed by one of type `types.1` at `cfg2` (`None` for a pair it
/// does not take): the Q4_K kernel's run (Q4_K or Q5_K) then a Q6_K run, or a Q3_K run
/// then a Q4_K or Q5_K run (`SIX_FIRST = 1`).
fn merged_consts(
    types: (GgmlType, GgmlType),
    cfg: QuantGemvConfig,
    cfg2: QuantGemvConfig,
    norm_fused: bool,
    stamps: i64,
) -> Option<[i64; 9]> {
    let q4_layout = |ty| match ty {
        GgmlType::Q4_K => Some(0),
        GgmlType::Q5_K => Some(1),
        _ => None,
    };
    let (cfg4, cfg6, layout, layout6, six_first) = match types {
        (ty, GgmlType::Q6_K) => (cfg, cfg2, q4_layout(ty)?, 0, 0),
        (GgmlType::Q3_K, ty) => (cfg2, cfg, q4_layout(ty)?, 1, 1),
        _ => return None,
    };
    Some([
        cfg4.block_n as i64,
        cfg4.block_k as i64,
        cfg6.block_n as i64,
        cfg6.block_k as i64,
        i64::from(norm_fused),
        layout,
        layout6,
        six_first,
        stamps,
    ])
}

/// `y = bf16(W · x + bias)` over the matrix of two runs of rows, `first` and `second`
/// stacked under it (rows `first.rows..` of `y` and `bias`), in one launch
/// ([`crate::kernels_quant::q4_k_q6_k_gemv`]): a Q4_K or Q5_K run then a Q6_K one
/// (Q4_K_M's and Q5_K_M's QKV where `v` takes more bits), or a Q3_K run then a Q4_K or
/// Q5_K one (Q3_K_M's), at `cfg` and `cfg2` (see
/// [`QuantGemvConfig::merged_runs_compiled`]): over the activation in `spare`, or with
/// `norm = Some((a, norm_w, eps))` over RMSNorm of `a` quantized in the kernel
/// ([`DeviceQuantMatrix::gemv_norm_fused`]). The same rows as the two GEMVs one after
/// the other at those configurations. `serialized`: the launch waits for all earlier
/// work.
#[allow(clippy::too_many_arguments)]
pub fn launch_q4_k_q6_k(
    dev: &Device,
    cfg: QuantGemvConfig,
    cfg2: QuantGemvConfig,
    first: &DeviceQuantMatrix,
    second: &DeviceQuantMatrix,
    norm: Option<(&Buffer<bf16>, &Buffer<bf16>, f32)>,
    bias: &Buffer<bf16>,
    y: &mut Buffer<bf16>,
    spare: &mut QuantSpare,
    serialized: bool,
) -> Result<()> {
    let types = (first.ggml_type(), second.ggml_type());
    let (q4, q6) = match types.0 {
        GgmlType::Q3_K => (second, first),
        _ => (first, second),
    };
    let wrong_types = || {
        crate::error::EngineError::Option {
        message: format!(
            "one launch for two runs takes a Q4_K or Q5_K run then a Q6_K run, or a Q3_K run then a Q4_K or Q5_K run, not {} then {}",
            types.0, types.1
        ),
    }
    };
    let (
        QuantBuffers::Q4K {
            q,
            scales,
            mins,
            d,
            dmin,
            qh: qh5,
        },
        Some(_),
    ) = (&q4.buffers, merged_consts(types, cfg, cfg2, false, 0))
    else {
        return Err(wrong_types());
    };
    let (ql, qh6, scales6, d6) = match &q6.buffers {
        QuantBuffers::Q6K { ql, qh, scales, d } => (ql, qh64(qh)?, scales.into(), d),
        // The Q6_K kernel's `qh` and `scales` are not read for Q3_K and point at `q`.
        QuantBuffers::Q3K { q, d } => (q, qh64(q)?, KernelArg::read_as::<u8, u32>(q)?, d),
        _ => return Err(wrong_types()),
    };
    let cols = first.cols;
    let rows = first.rows + second.rows;
    let fits = second.cols == cols
        && cols <= spare.cols
        && y.len() >= rows
        && bias.len() >= rows
        && norm.is_none_or(|(a, w, _)| a.len() >= cols && w.len() >= cols);
    if !fits || !cfg.merged_runs_compiled(&cfg2, types, norm.is_some()) {
        return Err(crate::error::EngineError::Option {
            message: format!(
                "one launch for a {}x{} {} run at {},{},{} and a {}x{} {} run at {},{},{} (compiled: a Q4_K or Q5_K run in 8 or 16 rows of 512 or 1024 columns, then a Q6_K run at the same tile or in 2 or 4 rows of 2048 beside 8 of 1024 without the norm inside; or a Q3_K run then a Q4_K or Q5_K run at one such tile; the same warps) into {} outputs",
                first.rows, cols, types.0, cfg.block_n, cfg.block_k, cfg.num_warps, second.rows, second.cols, types.1, cfg2.block_n, cfg2.block_k, cfg2.num_warps, y.len()
            ),
        });
    }
    let first_programs = cfg.grid(first.rows);
    let grid = first_programs + cfg2.grid(second.rows);
    let mut launch = LaunchConfig::from(grid).num_warps(cfg.num_warps);
    if serialized {
        launch = launch.serialized();
    }
    let stamp_at = spare.stamps.take(Q4_K_Q6_K_GEMV.name, grid)?;
    let consts = merged_consts(types, cfg, cfg2, norm.is_some(), stamps_const(stamp_at))
        .ok_or_else(wrong_types)?;
    let (a, norm_w, eps) = norm.unwrap_or((&spare.bias, &spare.bias, 0.0));
    let mut args: Vec<KernelArg<'_>> = vec![
        q.into(),
        // Q4_K reads no fifth bits; the pointer is `q`'s.
        qh5.as_ref().unwrap_or(q).into(),
        scales.into(),
        mins.into(),
        d.into(),
        dmin.into(),
        ql.into(),
        qh6,
        scales6,
        d6.into(),
        (&spare.xq).into(),
        (&spare.xd).into(),
        a.into(),
        norm_w.into(),
        bias.into(),
        y.into(),
        (q4.rows as i32).into(),
        (q6.rows as i32).into(),
        (first_programs as i32).into(),
        ((cols / 8) as i32).into(),
        eps.into(),
        (&mut spare.stamps.buf).into(),
        stamp_at.into(),
    ];
    Q4_K_Q6_K_GEMV.launch_dyn(dev, launch, &consts, &mut args)?;
    Ok(())
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
    /// `a = [g; u]` (`2 * cols` long) becomes `bf16(bf16(silu(g)) * u)` as it is
    /// quantized; with the residual.
    SiluMulResidual,
}

impl QuantVariant<'_> {
    /// Whether the GEMV adds its projection into `y`.
    pub fn residual(&self) -> bool {
        matches!(self, QuantVariant::Residual | QuantVariant::SiluMulResidual)
    }
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
    /// The down projection's int8 input, written into the [`QuantSpare`]'s activation
    /// buffers by the normed `[gate; up]` GEMV
    /// ([`DeviceQuantMatrix::gemv_norm_silu_quantized`]): `silu(gate) * up` of the
    /// projection plus `bias` (indexed like the `[gate; up]` rows).
    DownInput {
        /// The bias, `[rows]`.
        bias: &'a Buffer<bf16>,
    },
}

/// A quantized GEMV's activation buffers (the int8 input that
/// [`QuantSpare::quantize`] writes, see [`crate::kernels_quant`]), and small buffers
/// that stand in for the outputs a launch does not write (each kernel takes the LM
/// head's outputs and the rows' output).
#[derive(Debug)]
pub struct QuantSpare {
    /// Columns the activation buffers hold.
    cols: usize,
    /// `[cols / 4]` int8 values, four a word.
    xq: Buffer<i32>,
    /// `[cols / 32]` block scales.
    xd: Buffer<f32>,
    /// A second pair like `xq` and `xd`: where the `[gate; up]` GEMV writes the down
    /// projection's input, the two pairs then trading places
    /// ([`DeviceQuantMatrix::gemv_norm_silu_quantized`]).
    out_q: Buffer<i32>,
    out_d: Buffer<f32>,
    logits: Buffer<f32>,
    part_val: Buffer<f32>,
    part_idx: Buffer<i32>,
    y: Buffer<bf16>,
    bias: Buffer<bf16>,
    /// A stand-in for packed words that a launch is told to read none of (the
    /// attention's prefetch range before dense gate/up weights).
    pub(crate) no_words: Buffer<u32>,
    /// Where the launches that take this spare write their timeline stamps.
    pub(crate) stamps: StampSlots,
}

impl QuantSpare {
    /// Activation buffers for GEMVs of up to `max_cols` columns (a multiple of 32), and
    /// one element each of the stand-ins, on `dev`.
    pub fn new(dev: &Device, max_cols: usize) -> Result<Self> {
        let cols = max_cols.div_ceil(32) * 32;
        Ok(QuantSpare {
            cols,
            xq: dev.zeros(cols / 4)?,
            xd: dev.zeros(cols / 32)?,
            out_q: dev.zeros(cols / 4)?,
            out_d: dev.zeros(cols / 32)?,
            logits: dev.zeros(1)?,
            part_val: dev.zeros(1)?,
            part_idx: dev.zeros(1)?,
            y: dev.zeros(1)?,
            bias: dev.zeros(1)?,
            no_words: dev.zeros(1)?,
            stamps: StampSlots::new(dev, 1)?,
        })
    }

    /// [`QuantSpare::new`] with room for the timeline stamps of `programs` programs
    /// ([`crate::Decoder::timeline`]).
    pub(crate) fn with_stamp_room(dev: &Device, max_cols: usize, programs: usize) -> Result<Self> {
        let mut spare = Self::new(dev, max_cols)?;
        spare.stamps = StampSlots::new(dev, programs)?;
        Ok(spare)
    }

    /// Quantizes the GEMV input of `cols` columns computed from `a` by `variant` (with
    /// `head`, the LM head's final norm) into the activation buffers
    /// ([`crate::kernels_quant::quantize_act`]). `serialized`: the launch waits for all
    /// earlier work. `prefetch`: the next GEMV's packed words and the range of them,
    /// `(offset, length)` in bytes, that the launch asks L2 for once the launch before
    /// it has finished (clamped to the words).
    #[allow(clippy::too_many_arguments)]
    pub fn quantize(
        &mut self,
        dev: &Device,
        variant: QuantVariant<'_>,
        a: &Buffer<bf16>,
        cols: usize,
        head: bool,
        serialized: bool,
        prefetch: Option<(&Buffer<u32>, usize, usize)>,
    ) -> Result<()> {
        let (mode, norm_w, eps) = match variant {
            QuantVariant::Plain | QuantVariant::Residual => (0, a, 0.0),
            QuantVariant::Norm { norm_w, eps } => (if head { 3 } else { 1 }, norm_w, eps),
            QuantVariant::SiluMulResidual => (2, a, 0.0),
        };
        if head && mode != 3 {
            return Err(crate::error::EngineError::Option {
                message: "a quantized LM head takes the final norm (QuantVariant::Norm)".into(),
            });
        }
        if cols > self.cols || cols % 32 != 0 {
            return Err(crate::error::EngineError::Option {
                message: format!(
                    "quantizing an activation of {cols} columns into buffers for {} (a multiple of 32 is needed)",
                    self.cols
                ),
            });
        }
        const B: usize = 256;
        let programs = cols.div_ceil(B) as u32;
        let mut launch = LaunchConfig::from(programs).num_warps(4);
        if serialized {
            launch = launch.serialized();
        }
        let stamp_at = self.stamps.take(QUANTIZE_ACT.name, programs)?;
        let mut args: Vec<KernelArg<'_>> = vec![
            a.into(),
            norm_w.into(),
            (&mut self.xq).into(),
            (&mut self.xd).into(),
            (cols as i32).into(),
            eps.into(),
        ];
        // The prefetch range in words, inside the buffer.
        let (words, first, len) = match prefetch {
            Some((q, offset, bytes)) => {
                let first = (offset / 4).min(q.len());
                (q, first, (bytes / 4).min(q.len() - first))
            }
            None => (&self.no_words, 0, 0),
        };
        args.extend([
            KernelArg::from(words),
            (first as i32).into(),
            (len as i32).into(),
        ]);
        args.extend([(&mut self.stamps.buf).into(), stamp_at.into()]);
        QUANTIZE_ACT.launch_dyn(
            dev,
            launch,
            &[B as i64, mode, stamps_const(stamp_at)],
            &mut args,
        )?;
        Ok(())
    }

    /// The activation buffers (`xq`, `xd`), for reading back in tests.
    pub fn activation(&self) -> (&Buffer<i32>, &Buffer<f32>) {
        (&self.xq, &self.xd)
    }

    /// The activation buffers (`xq`, `xd`) and the timeline stamps, for a kernel that
    /// writes a GEMV's quantized input itself (`attention_combine_quant`).
    pub(crate) fn activation_and_stamps_mut(
        &mut self,
    ) -> (&mut Buffer<i32>, &mut Buffer<f32>, &mut StampSlots) {
        (&mut self.xq, &mut self.xd, &mut self.stamps)
    }
}

/// The `STAMPS` constant of a quantized kernel launched with `stamp_at`: 1 (the variant
/// that writes stamps) only for a launch that has slots, so that a graph without a
/// timeline runs kernels with no stamp code (`crate::kernels::stamp_now`).
pub(crate) fn stamps_const(stamp_at: i32) -> i64 {
    i64::from(stamp_at >= 0)
}

/// Where a step's launches write their programs' timeline stamps
/// ([`crate::Decoder::timeline`]): four values a program (entry, past the wait, exit,
/// SM; `crate::kernels::store_stamps`'s layout), the launches of the stamped layer one
/// after another in launch order. Outside a stamped layer every launch gets
/// `stamp_at = -1` and writes nothing.
#[derive(Debug)]
pub struct StampSlots {
    /// `[4 * programs]`.
    pub(crate) buf: Buffer<i64>,
    /// The next launch's first program while a layer is stamped.
    next: Option<usize>,
    /// What the next launches are logged under (the decode step's block).
    tag: usize,
    /// The launches stamped since [`StampSlots::start`], in launch order.
    log: Vec<StampedLaunch>,
}

/// One launch of a stamped layer: what [`StampSlots::take`] logged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StampedLaunch {
    /// The tag it was launched under ([`StampSlots::set_tag`]).
    pub tag: usize,
    /// The kernel launched.
    pub kernel: &'static str,
    /// Its programs, stamped from slot [`StampedLaunch::first`] on.
    pub programs: usize,
    /// Its first program's slot.
    pub first: usize,
}

impl StampSlots {
    /// Room for `programs` programs' stamps on `dev`, filled with -1 (unwritten).
    pub fn new(dev: &Device, programs: usize) -> Result<Self> {
        Ok(StampSlots {
            buf: dev.alloc_filled(4 * programs.max(1), -1i64)?,
            next: None,
            tag: 0,
            log: Vec::new(),
        })
    }

    /// Programs there is room for.
    pub fn capacity(&self) -> usize {
        self.buf.len() / 4
    }

    /// Starts stamping: the launches from here on take consecutive slots from 0, and the
    /// log starts empty.
    pub fn start(&mut self) {
        self.next = Some(0);
        self.log.clear();
    }

    /// Stops stamping (the log stays until the next [`StampSlots::start`]).
    pub fn stop(&mut self) {
        self.next = None;
    }

    /// The tag the next launches are logged under.
    pub fn set_tag(&mut self, tag: usize) {
        self.tag = tag;
    }

    /// The launches stamped since the last [`StampSlots::start`].
    pub fn log(&self) -> &[StampedLaunch] {
        &self.log
    }

    /// The `stamp_at` argument of a launch of `kernel` over `programs` programs: -1
    /// when not stamping, else its first slot (logged). An error when the buffer has no
    /// room left, naming the kernel.
    pub fn take(&mut self, kernel: &'static str, programs: u32) -> Result<i32> {
        let Some(first) = self.next else {
            return Ok(-1);
        };
        let programs = programs as usize;
        if first + programs > self.capacity() {
            return Err(crate::error::EngineError::Option {
                message: format!(
                    "timeline: the stamped layer's launch of `{kernel}` needs slots {first}..{} \
                     for its programs, more than the {} stamps have room for",
                    first + programs,
                    self.capacity()
                ),
            });
        }
        self.next = Some(first + programs);
        self.log.push(StampedLaunch {
            tag: self.tag,
            kernel,
            programs,
            first,
        });
        Ok(first as i32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_unmasked_override_lists_row_counts() {
        assert!(even_policy(None, 4) && even_policy(Some("1"), 8));
        assert!(!even_policy(Some("0"), 4) && !even_policy(Some("0"), 8));
        assert!(even_policy(Some("4, 16"), 4) && !even_policy(Some("4,16"), 8));
        // Malformed: as unset.
        assert!(even_policy(Some("x"), 8));
    }

    #[test]
    fn the_norm_fused_override_names_shapes_and_quotes_bad_ones() {
        assert!(norm_fused_policy("1", 6144, 4096).unwrap());
        assert!(!norm_fused_policy("0", 1024, 1024).unwrap());
        assert!(norm_fused_policy("6144x4096", 6144, 4096).unwrap());
        assert!(norm_fused_policy("4096x1024, 6144x4096", 6144, 4096).unwrap());
        assert!(!norm_fused_policy("6144x4096", 24576, 4096).unwrap());
        let err = norm_fused_policy("6144by4096", 6144, 4096)
            .unwrap_err()
            .to_string();
        assert!(err.contains("`6144by4096`"), "{err}");
    }

    #[test]
    fn the_merge_override_names_the_v_tile_and_quotes_bad_ones() {
        assert_eq!(merge_runs_policy("0").unwrap(), MergeRuns::Never);
        assert_eq!(merge_runs_policy(" fused ").unwrap(), MergeRuns::Fused);
        assert_eq!(merge_runs_policy("shared").unwrap(), MergeRuns::Shared);
        let both = MergeRuns::Both {
            rows: 4,
            cols: 2048,
        };
        assert_eq!(merge_runs_policy("4, 2048").unwrap(), both);
        for bad in ["1", "4x2048", "0,2048", "fused,"] {
            let err = merge_runs_policy(bad).unwrap_err().to_string();
            assert!(err.contains(&format!("`{bad}`")), "{err}");
        }
        // The Q4_K run's step tile at Qwen3-8B's `[q; k]` and the `v` tiles compiled
        // beside it, without the norm inside only; the same warps.
        let qk = QuantGemvConfig::for_shape(GgmlType::Q4_K, 5120, 4096);
        let q4_q6 = (GgmlType::Q4_K, GgmlType::Q6_K);
        for rows in [2, 4] {
            let v = QuantGemvConfig {
                block_n: rows,
                block_k: 2048,
                num_warps: qk.num_warps,
            };
            assert!(qk.merged_runs_compiled(&v, q4_q6, false), "{qk:?} {v:?}");
            assert!(!qk.merged_runs_compiled(&v, q4_q6, true), "{qk:?} {v:?}");
            let other_warps = QuantGemvConfig {
                num_warps: 12 - qk.num_warps,
                ..v
            };
            assert!(!qk.merged_runs_compiled(&other_warps, q4_q6, false));
            // A Q3_K run first takes one tile for both runs.
            let q3_q4 = (GgmlType::Q3_K, GgmlType::Q4_K);
            assert!(!qk.merged_runs_compiled(&v, q3_q4, false), "{qk:?} {v:?}");
        }
        for fused in [true, false] {
            for types in [
                q4_q6,
                (GgmlType::Q5_K, GgmlType::Q6_K),
                (GgmlType::Q3_K, GgmlType::Q4_K),
                (GgmlType::Q3_K, GgmlType::Q5_K),
            ] {
                assert!(qk.merged_runs_compiled(&qk, types, fused), "{types:?}");
            }
            // Pairs the kernel does not take.
            for types in [
                (GgmlType::Q6_K, GgmlType::Q4_K),
                (GgmlType::Q4_K, GgmlType::Q3_K),
                (GgmlType::Q4_K, GgmlType::Q5_K),
                (GgmlType::Q3_K, GgmlType::Q6_K),
                (GgmlType::Q8_0, GgmlType::Q6_K),
            ] {
                assert!(!qk.merged_runs_compiled(&qk, types, fused), "{types:?}");
            }
        }
    }

    #[test]
    fn the_silu_override_quotes_its_variable() {
        let var = "TILEFUSE_QUANT_SILU_GATE_UP_UNFUSED";
        assert_eq!(silu_tile_policy(var, "0").unwrap(), None);
        let tile = silu_tile_policy(var, "64,512,4").unwrap().unwrap();
        assert_eq!((tile.block_n, tile.block_k, tile.num_warps), (64, 512, 4));
        let err = silu_tile_policy(var, "32,512,4").unwrap_err().to_string();
        assert!(err.contains(var) && err.contains("`32,512,4`"), "{err}");
    }

    #[test]
    fn short_chunks_pick_compiled_tiles_that_cover_them() {
        for rows in [1, 8, 1024, 2047, 2048, 4096, 6144, 24576] {
            for tokens in 1..=40 {
                let tile = TokensTile::for_shape(rows, tokens);
                assert!(tile.compiled(), "{rows} rows, {tokens} tokens: {tile:?}");
                // A program takes as many tokens as cover the chunk, or 8 (more
                // programs along the tokens); small matrices take 2 up to 8 tokens.
                let want = if rows < 2048 && tokens <= 8 {
                    2
                } else {
                    tokens.next_power_of_two().clamp(2, 8)
                };
                assert_eq!(tile.tokens, want, "{rows} rows, {tokens} tokens");
            }
        }
        assert!(!TokensTile {
            block_n: 8,
            block_k: 1024,
            tokens: 3
        }
        .compiled());
    }

    #[test]
    fn the_step_picks_compiled_configurations() {
        // Qwen3-0.6B's and Qwen3-8B's shapes (and the runs of one type in them).
        let shapes = [
            (4096, 1024),
            (3072, 1024),
            (1024, 1024),
            (1024, 2048),
            (6144, 1024),
            (1024, 3072),
            (6144, 4096),
            (5120, 4096),
            (1024, 4096),
            (4096, 4096),
            (24576, 4096),
            (4096, 12288),
        ];
        for ty in [GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K] {
            for (rows, cols) in shapes {
                let cfg = QuantGemvConfig::for_shape(ty, rows, cols);
                assert!(cfg.check(false).is_ok(), "{ty} {rows}x{cols}: {cfg:?}");
            }
        }
        assert!(QuantGemvConfig::HEAD.check(true).is_ok());
        let tall = QuantGemvConfig::for_shape(GgmlType::Q4_K, 24576, 4096);
        assert_eq!((tall.block_n, tall.num_warps), (16, 4));
        // Down at 8B: Q4_K in one wave of 4-row programs, Q6_K 16 rows (the
        // prefetching residual loop).
        let wide = QuantGemvConfig::for_shape(GgmlType::Q4_K, 4096, 12288);
        assert_eq!((wide.block_n, wide.block_k, wide.num_warps), (4, 2048, 4));
        let square = QuantGemvConfig::for_shape(GgmlType::Q6_K, 4096, 4096);
        assert_eq!((square.block_n, square.num_warps), (16, 8));
        // 8B's O in Q4_K: 8 rows of 1024 columns (docs/perf.md, "The O projection's
        // tile on an H100").
        let o = QuantGemvConfig::for_shape(GgmlType::Q4_K, 4096, 4096);
        assert_eq!((o.block_n, o.block_k, o.num_warps), (8, 1024, 4));
        for (rows, cols) in [(4096, 12288), (24576, 4096), (6144, 4096)] {
            let cfg = QuantGemvConfig::for_shape(GgmlType::Q8_0, rows, cols);
            assert_eq!((cfg.block_n, cfg.block_k, cfg.num_warps), (4, 2048, 4));
        }
        // Qwen3-0.6B's shapes keep theirs: 1024 columns are one 2048-column tile's half.
        let qkv = QuantGemvConfig::for_shape(GgmlType::Q8_0, 4096, 1024);
        assert_eq!((qkv.block_n, qkv.block_k), (8, 1024));
        // Qwen3-0.6B's gate/up keeps 8 rows (16 measured 0.4% slower there).
        assert_eq!(
            QuantGemvConfig::for_shape(GgmlType::Q4_K, 6144, 1024).block_n,
            8
        );
        // Long tiles are not compiled for the head's variant, nor 32 rows of 1024.
        let long = QuantGemvConfig {
            block_n: 4,
            block_k: 2048,
            num_warps: 8,
        };
        assert!(long.check(false).is_ok());
        let e = long.check(true).unwrap_err().to_string();
        assert!(e.contains("4,2048,8") && e.contains("LM head"), "{e}");
        let e = QuantTiles::parse("100x100=32,1024,4").unwrap().entries[0]
            .cfg
            .check(false)
            .unwrap_err()
            .to_string();
        assert!(e.contains("32,1024,4"), "{e}");
    }

    #[test]
    fn tiles_per_shape_parse_or_name_the_bad_entry() {
        let t = QuantTiles::parse(
            " 4096x4096=8,1024,8 ; ;24576x4096=16,1024,4;norm:24576x4096=32,512,4",
        )
        .unwrap();
        let q4 = GgmlType::Q4_K;
        assert_eq!(t.entries.len(), 2);
        assert_eq!(t.get(q4, 24576, 4096).map(|c| c.block_n), Some(16));
        assert_eq!(t.get(q4, 4096, 4096).map(|c| c.num_warps), Some(8));
        assert_eq!(t.get(q4, 4096, 1024), None);
        // The normed GEMV that quantizes its own input is tuned apart.
        assert_eq!(
            t.get_norm_fused(q4, 24576, 4096).map(|c| c.block_n),
            Some(32)
        );
        assert_eq!(t.get_norm_fused(q4, 4096, 4096), None);
        for bad in [
            "4096x4096",
            "4096=8,1024,8",
            "4096x4096=8,1024",
            "4096x4096=8,x,4",
            "norm:4096x4096",
            "norm4096x4096=8,1024,8",
            "Q2_K:4096x4096=8,1024,8",
            "norm:q4_k:4096x4096",
        ] {
            let e = QuantTiles::parse(bad).unwrap_err().to_string();
            assert!(e.contains(bad), "{bad}: {e}");
        }
        // Q5_K's entries, tuned apart from Q4_K's of the same shape.
        let t = QuantTiles::parse("q5_k:4096x4096=8,1024,4").unwrap();
        assert!(t.get(GgmlType::Q5_K, 4096, 4096).is_some());
        assert!(t.get(GgmlType::Q4_K, 4096, 4096).is_none());
    }

    #[test]
    fn tiles_named_by_type_apply_to_that_type_only() {
        let t = QuantTiles::parse(
            "q6_k:4096x12288=8,1024,8;4096x12288=4,2048,4;norm:Q4_K:6144x1024=16,1024,4",
        )
        .unwrap();
        let (q4, q6, q8) = (GgmlType::Q4_K, GgmlType::Q6_K, GgmlType::Q8_0);
        // The first matching entry wins: the Q6_K one for Q6_K, the untyped one else.
        assert_eq!(t.get(q6, 4096, 12288).map(|c| c.block_n), Some(8));
        assert_eq!(t.get(q4, 4096, 12288).map(|c| c.block_n), Some(4));
        assert_eq!(t.get(q8, 4096, 12288).map(|c| c.block_n), Some(4));
        assert_eq!(
            t.get_norm_fused(q4, 6144, 1024).map(|c| c.block_n),
            Some(16)
        );
        assert_eq!(t.get_norm_fused(q6, 6144, 1024), None);
        assert_eq!(t.get(q4, 6144, 1024), None);
        // Q4_0 and Q5_0 (the Q4_K kernel's other layouts) are tuned by their own names.
        let t = QuantTiles::parse("Q4_0:4096x4096=8,1024,8").unwrap();
        assert_eq!(
            t.get(GgmlType::Q4_0, 4096, 4096).map(|c| c.num_warps),
            Some(8)
        );
        assert_eq!(t.get(q4, 4096, 4096), None);
    }

    #[test]
    fn quantized_heads_are_read_quantized_unless_the_environment_says_no() {
        use crate::gguf::quant::head_policy;
        for ty in [GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K] {
            assert!(head_policy(ty, None), "{ty}");
            assert!(head_policy(ty, Some("1")), "{ty}");
            assert!(!head_policy(ty, Some("0")), "{ty}");
        }
        assert!(!head_policy(GgmlType::F16, None));
    }
}
