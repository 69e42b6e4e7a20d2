//! Launch configurations for the decode kernels: which compiled variant, and how many
//! programs, for a given shape.
//!
//! The defaults come from measurements on an H100 (and, for the LM head, an H200):
//! `tilefuse bench --sweep` times every compiled variant inside the captured decode step
//! and `examples/bandwidth.rs --sweep` each kernel alone; each function below says which
//! run chose it (the figures are in docs/perf.md and docs/gpu-results.md). Each thread
//! reads 16-byte vectors (8 bf16), so `BLOCK_K = 8 × threads` gives one vector per row
//! per iteration, and `BLOCK_N` rows give that many independent loads in flight. Rerun
//! the sweeps on other GPUs before trusting these there.

use crate::kernels;

/// The Hopper SM count (H100 SXM, H200) assumed when no device is at hand.
pub const DEFAULT_SM_COUNT: usize = 132;

/// A GEMV-family launch: the variant's constants and warp count.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct GemvConfig {
    /// Rows per program.
    pub block_n: usize,
    /// Columns per loop iteration.
    pub block_k: usize,
    /// Warps per program.
    pub num_warps: u32,
    /// `STAGES`: 1 requests each weight tile when its iteration starts, 2 one
    /// iteration ahead (twice the bytes in flight, one more tile of registers).
    pub stages: usize,
    /// [`kernels::lm_head_argmax`] only: its `STREAM` (1 requests the next row block's
    /// first tile before reducing this one).
    pub stream: usize,
    /// [`kernels::lm_head_argmax`] only: the grid, each program taking consecutive row
    /// blocks; 0 for one program per block. Other kernels need one per block.
    pub programs: usize,
    /// `REDUCE_EACH` (every GEMV kernel has it): 1 reduces each weight tile into the row
    /// sums as it arrives instead of carrying a `[block_n, block_k]` f32 tile to the
    /// end; compiled for some whole-row tiles (1024 columns; 4096 for
    /// [`kernels::gemv_residual`]).
    pub reduce_each: usize,
}

impl GemvConfig {
    /// Programs for `n` rows: one per `block_n` rows, or at most `programs` when set.
    pub fn grid(&self, n: usize) -> u32 {
        let blocks = n.div_ceil(self.block_n).max(1);
        (if self.programs > 0 {
            blocks.min(self.programs)
        } else {
            blocks
        }) as u32
    }

    /// `block_n` rows a program over `num_warps` warps in `block_k`-column steps: single
    /// buffered, one program per row block, the accumulator carried to the end.
    pub const fn tile(block_n: usize, block_k: usize, num_warps: u32) -> Self {
        GemvConfig {
            block_n,
            block_k,
            num_warps,
            stages: 1,
            stream: 0,
            programs: 0,
            reduce_each: 0,
        }
    }

    /// The field holding `def`'s compile-time constant `name`.
    fn constant(&mut self, def: &tilefuse_dsl::runtime::KernelDef, name: &str) -> &mut usize {
        match name {
            "BLOCK_N" => &mut self.block_n,
            "BLOCK_K" => &mut self.block_k,
            "STAGES" => &mut self.stages,
            "STREAM" => &mut self.stream,
            "REDUCE_EACH" => &mut self.reduce_each,
            other => unreachable!("`{}` has no GEMV constant `{other}`", def.name),
        }
    }

    /// The values of `def`'s compile-time constants, in its declaration order
    /// (`BLOCK_N`, `BLOCK_K`, `STAGES`, and `STREAM` or `REDUCE_EACH` where the kernel has
    /// them), for `launch_dyn` and [`KernelDef::variant`](tilefuse_dsl::runtime::KernelDef::variant).
    pub fn consts_for(&self, def: &tilefuse_dsl::runtime::KernelDef) -> Vec<i64> {
        let mut c = *self;
        def.const_names
            .iter()
            .map(|&name| *c.constant(def, name) as i64)
            .collect()
    }

    /// The configuration of `def`'s compiled variant with constants `consts` (in
    /// declaration order) and `num_warps` warps; one program per row block.
    pub fn of_variant(
        def: &tilefuse_dsl::runtime::KernelDef,
        consts: &[i64],
        num_warps: u32,
    ) -> Self {
        let mut c = GemvConfig::tile(0, 0, num_warps);
        for (&name, &v) in def.const_names.iter().zip(consts) {
            *c.constant(def, name) = v as usize;
        }
        c
    }
}

/// The GEMV kernels' typed constants from a [`GemvConfig`], so that launches take the
/// configuration itself.
macro_rules! gemv_consts {
    ($($consts:ident),*) => {$(
        impl From<GemvConfig> for kernels::$consts {
            fn from(c: GemvConfig) -> Self {
                kernels::$consts {
                    block_n: c.block_n,
                    block_k: c.block_k,
                    stages: c.stages,
                    reduce_each: c.reduce_each,
                }
            }
        }
    )*};
}
gemv_consts!(RmsNormGemvConsts, GemvResidualConsts, RmsNormGateUpConsts);

impl From<GemvConfig> for kernels::LmHeadArgmaxConsts {
    fn from(c: GemvConfig) -> Self {
        kernels::LmHeadArgmaxConsts {
            block_n: c.block_n,
            block_k: c.block_k,
            stages: c.stages,
            stream: c.stream,
            reduce_each: c.reduce_each,
        }
    }
}

/// The default configuration of [`kernels::rms_norm_gemv`] and
/// [`kernels::gemv_residual`] for a `[n, k]` weight (for `rms_norm_gate_up`, pass
/// `n = inter`: each program reads `2 × block_n` rows), on a GPU with
/// [`DEFAULT_SM_COUNT`] SMs.
pub fn gemv_config(n: usize, k: usize) -> GemvConfig {
    gemv_config_for(n, k, DEFAULT_SM_COUNT)
}

/// [`gemv_config`] for a GPU with `sm_count` SMs.
///
/// From `tilefuse bench --sweep` (every compiled variant timed inside the captured
/// decode step, each against the best plan so far in interleaved pairs; Qwen3-0.6B and
/// Llama-3.2-1B, H100 and H200; docs/perf.md, "Decode kernels: results"). Inside the step every
/// projection prefers *fewer, fatter* programs (128–384 a launch, 4–16 rows each) than
/// it does alone, where 1-row programs (1024 a launch) rank first: between its
/// neighbours in a graph a kernel's launch overlaps their tails, and with an idle GPU
/// around it, it does not. Why fewer programs win there is not measured yet.
pub fn gemv_config_for(n: usize, k: usize, sm_count: usize) -> GemvConfig {
    let (block_n, block_k, num_warps, reduce_each) = match (tall(n, sm_count), k) {
        (true, _) => (8, 512, 4, 0),
        // Qwen3-0.6B's O projection (1024 x 2048): 8 whole rows a program, 128
        // programs (one a SM) over 8 warps. Llama-3.2-1B's (2048 x 2048): 8 rows in
        // 1024-column steps over 4 warps. 2 x 2048 over 8 warps (512 programs, 4 a SM)
        // was slower in the step for both (docs/perf.md, "Decode kernels: results").
        (false, 2048) if n <= 1024 => (8, 2048, 8, 0),
        (false, 2048) => (8, 1024, 4, 0),
        // From 3072 columns (Qwen3-0.6B's down projection, 1024 x 3072, and Llama-3.2-1B's,
        // 2048 x 8192): 4 rows in 4096-column tiles (a whole Qwen3 row) reduced as they
        // arrive, over 8 warps.
        (false, 3072..) => (4, 4096, 8, 1),
        (false, 2049..) => (2, 2048, 8, 0),
        (false, _) => (8, 1024, 8, 0),
    };
    GemvConfig {
        reduce_each,
        ..GemvConfig::tile(block_n, block_k, num_warps)
    }
}

/// Whether `n` rows make a tall matrix (at least 16 per SM, as a QKV or gate+up
/// projection), for the rules above.
fn tall(n: usize, sm_count: usize) -> bool {
    n >= 8 * 2 * sm_count.max(1)
}

/// The default configuration of [`kernels::rms_norm_gemv`] (the QKV projection): 16
/// rows a program over 8 warps for the tall matrices, in 512-column steps when a row
/// is 1024 wide (Qwen3-0.6B, 4096 x 1024) and in 1024-column tiles reduced as they
/// arrive when it is wider (Llama-3.2-1B, 3072 x 2048); otherwise as [`gemv_config`],
/// with column steps of at most 1024 (the widest it is compiled for). From the in-step
/// sweeps (see [`gemv_config_for`]), which preferred them to 8 rows in 512-column steps
/// over 4 warps.
pub fn norm_gemv_config(n: usize, k: usize) -> GemvConfig {
    if tall(n, DEFAULT_SM_COUNT) {
        return match k {
            ..=1024 => GemvConfig::tile(16, 512, 8),
            _ => GemvConfig {
                reduce_each: 1,
                ..GemvConfig::tile(16, 1024, 8)
            },
        };
    }
    gemv_config(n, k.min(1024))
}

/// The default configuration of [`kernels::rms_norm_gate_up`] for `inter` rows of gate
/// (and as many of up) over `k` columns: compiled with 4 warps only, since two f32
/// accumulators at 8 warps exceed ptxas' register budget and spill.
///
/// Rows of 1024 columns (Qwen3-0.6B's 3072 × 1024): 8 rows a program in 512-column
/// steps (156 registers on sm_90, three programs a SM; whole rows reduced as they
/// arrive took 195, two a SM). Wider rows (Llama-3.2-1B's 8192 × 2048): 4 rows a program
/// in 1024-column tiles reduced as they arrive. Both from the in-step sweeps (see
/// [`gemv_config_for`]).
pub fn gate_up_config(_inter: usize, k: usize) -> GemvConfig {
    if k > 1024 {
        return GemvConfig {
            reduce_each: 1,
            ..GemvConfig::tile(4, 1024, 4)
        };
    }
    GemvConfig::tile(8, 512, 4)
}

/// The default configuration of [`kernels::lm_head_argmax`] for a `[vocab, k]` head,
/// on a GPU with [`DEFAULT_SM_COUNT`] SMs.
pub fn lm_head_config(vocab: usize, k: usize) -> GemvConfig {
    lm_head_config_for(vocab, k, DEFAULT_SM_COUNT)
}

/// Programs a SM of the streaming LM head (see [`lm_head_config_for`]).
pub const LM_HEAD_PROGRAMS_PER_SM: usize = 2;

/// [`lm_head_config`] for a GPU with `sm_count` SMs.
///
/// Large vocabularies take 16 rows a program, each whole 1024-column row block one tile
/// reduced as it arrives (`REDUCE_EACH`), over a fixed grid of
/// [`LM_HEAD_PROGRAMS_PER_SM`] programs a SM, each streaming consecutive row blocks and
/// requesting the next block (32 KiB at k = 1024) before reducing the current one.
/// Qwen3-0.6B's 151936 × 1024 alone (`examples/bandwidth.rs --sweep`): H200 81.06 ->
/// 76.38 µs (97.5% of the copy ceiling, 1.00× cuBLAS; the earlier 16 × 256 tiles, 4
/// programs a SM, were 0.95×), see docs/perf.md, "Decode kernels: results" (GEMV
/// variants that reduce each weight tile as it arrives). Small vocabularies keep a
/// program per block of 4 rows.
pub fn lm_head_config_for(vocab: usize, _k: usize, sm_count: usize) -> GemvConfig {
    let large = vocab >= 32 * 1024;
    GemvConfig {
        block_n: if large { 16 } else { 4 },
        block_k: if large { 1024 } else { 256 },
        num_warps: 4,
        stages: 1,
        stream: usize::from(large),
        programs: if large {
            LM_HEAD_PROGRAMS_PER_SM * sm_count.max(1)
        } else {
            0
        },
        reduce_each: usize::from(large),
    }
}

/// The `B` and warp count of [`kernels::argmax_finish`] for `parts` candidates: the
/// candidates in one pass up to 16384 (each pass is a dependent load and reduction of
/// the single program, on the critical path of every step).
pub fn argmax_finish_config(parts: usize) -> (usize, u32) {
    match parts {
        0..=256 => (256, 4),
        257..=1024 => (1024, 4),
        1025..=4096 => (4096, 8),
        _ => (16384, 16),
    }
}

/// Positions per iteration of [`kernels::attention_split`] in the decode step.
pub const ATTENTION_BS: usize = 64;

/// Fewest cache positions per attention split by default (see
/// [`kernels::attention_split`]'s `min_chunk`): one whole tile, so that at short
/// contexts each busy program loads one full tile and the rest have nothing to do
/// (`tilefuse bench --sweep`, H100, context 1024: 64 beat 1 and 32 by 1-5%).
pub const ATTENTION_MIN_CHUNK: usize = ATTENTION_BS;

/// A split-K attention launch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AttentionConfig {
    /// Programs along the sequence per KV head (`attention_split`'s grid y).
    pub splits: usize,
    /// Positions per loop iteration of `attention_split`.
    pub bs: usize,
    /// `attention_combine`'s `S`: a compiled power of two ≥ `splits`.
    pub s: usize,
    /// Fewest positions per split.
    pub min_chunk: usize,
    /// `attention_combine`'s `DC`: head columns per combine program (at most the head
    /// size: larger values mean whole heads).
    pub dc: usize,
    /// `attention_split`'s `STAGES`: 1 requests the next tile once a tile is used, 2
    /// while it is used (double buffering).
    pub stages: usize,
    /// Warps per `attention_split` program.
    pub num_warps: u32,
    /// `attention_split`'s `CLUSTER`: 1 writes partials for `attention_combine`; more
    /// merges the splits of a KV head in one thread-block cluster (then `splits ==
    /// cluster` and no combine runs).
    pub cluster: usize,
}

/// The largest split count `attention_combine` is compiled for.
pub const MAX_SPLITS: usize = 64;

/// The smallest compiled `S` of `attention_combine` that holds `splits`.
pub fn combine_s(splits: usize) -> usize {
    splits.next_power_of_two().clamp(8, MAX_SPLITS)
}

/// The default attention launch for `seq` cached positions: [`attention_splits`] splits
/// of [`ATTENTION_BS`]-position tiles merged by `attention_combine`.
pub fn attention_config(seq: usize) -> AttentionConfig {
    let bs = ATTENTION_BS;
    let splits = attention_splits(seq, bs);
    AttentionConfig {
        splits,
        bs,
        s: combine_s(splits),
        min_chunk: ATTENTION_MIN_CHUNK,
        dc: 128,
        stages: ATTENTION_STAGES,
        num_warps: 4,
        cluster: 1,
    }
}

/// `attention_split`'s `STAGES`: 1, the next tile requested once a tile is used.
///
/// Double buffering (2) won at long shares while the compiler moved a carried bf16
/// tile half by half (32k positions alone 54.5 against 57.7 µs, H100). With tiles
/// carried as packed words the single buffer is faster everywhere (H100; docs/perf.md,
/// "Decode kernels: results", 16-bit tiles packed in 32-bit words):
/// alone at 4k 12.76 against 13.22 µs and at 32k 52.52 against 53.80 (`examples/
/// bandwidth.rs --sweep`), inside the step 3.5% (4k) and 2.5% (16k) a token
/// (`tilefuse bench --sweep`). `STAGES = 2` stays compiled for comparisons.
pub const ATTENTION_STAGES: usize = 1;

/// Bytes of each layer's gate/up weights (at most all of them) that the decode step's
/// attention launch asks L2 to fetch (`prefetch_range`) while its arithmetic leaves HBM
/// idle (only when every split holds at most one tile, as at context 1024), so that the
/// gate/up projection two launches later reads them from L2. A budget in bytes, not a
/// share: the idle window is a few microseconds whatever the model.
/// `TILEFUSE_PREFETCH=KiB` overrides it (0 turns it off).
///
/// H100, Qwen3-0.6B preset (12 MiB of gate/up a layer), context 1024 (docs/perf.md,
/// "Decode kernels: results", L2 prefetch), interleaved with the build before
/// (1608.9 tok/s): 2.4 MiB 1625.6, 3 MiB 1627.1,
/// 4 MiB 1633.0; in other builds 6 MiB and all 12 MiB were slower than none (the
/// prefetch then competes with the O projection's weights), and so was a third of
/// Llama-3.2-1B's 64 MiB.
pub const ATTENTION_PREFETCH_BYTES: usize = 4 << 20;

/// [`ATTENTION_PREFETCH_BYTES`], or `TILEFUSE_PREFETCH` (KiB) when set.
pub fn attention_prefetch_bytes() -> usize {
    env_kib("TILEFUSE_PREFETCH").unwrap_or(ATTENTION_PREFETCH_BYTES)
}

/// The environment variable `name` read as KiB, in bytes (`None` when unset or not a
/// whole number).
fn env_kib(name: &str) -> Option<usize> {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .map(|kib| kib << 10)
}

/// A prefetch's bytes of `words_bytes` of packed words: `budget` when one is set, else
/// `default` for words of at least `min_words` and none for fewer.
fn words_budget(
    words_bytes: usize,
    budget: Option<usize>,
    default: usize,
    min_words: usize,
) -> usize {
    match budget {
        Some(b) => b,
        None if words_bytes >= min_words => default,
        None => 0,
    }
}

/// Bytes of each layer's quantized gate/up words (at most all of them) that the decode
/// step's attention launch asks L2 to fetch, as [`ATTENTION_PREFETCH_BYTES`] does for
/// dense weights, where the words are at least [`PREFETCH_WORDS_MIN_MATRIX`] bytes.
///
/// H100, in the captured step (`tilefuse bench --quant-tiles prefetch=KiB`, seven
/// interleaved rounds; docs/perf.md, "Quantized gate/up words prefetched during
/// attention"): Qwen3-8B Q4_K_M at context 512 (50 MiB of gate/up words a layer) 2 MiB
/// -0.49%, 4 MiB -0.92%, 8 MiB -1.21%, 16 MiB -0.89%, 24 MiB -0.84% a step; Qwen3-0.6B
/// (3.4 MiB) 1 MiB +0.14%, 2 MiB +0.32%, all of it +0.35%. With the quantizers'
/// prefetch ([`QUANTIZER_PREFETCH_BYTES`]) beside it, 6 MiB and 1.5 MiB there beat 8 MiB
/// and 1 MiB by 0.29-0.31% a step, while Qwen3-8B Q8_0 ran 0.63% slower with them
/// ([`Q8_0_ATTENTION_PREFETCH_WORDS_BYTES`]; docs/perf.md, "The two prefetch budgets
/// together").
pub const ATTENTION_PREFETCH_WORDS_BYTES: usize = 6 << 20;

/// [`ATTENTION_PREFETCH_WORDS_BYTES`] for Q8_0 words: Qwen3-8B Q8_0 at context 512 on
/// the H100 ran 0.63% faster with 8 MiB and 1 MiB than with the K-quants' 6 MiB and 1.5
/// MiB (6 MiB alone: +0.37%, 1.5 MiB alone: +0.22%; docs/perf.md, "The two prefetch
/// budgets together").
pub const Q8_0_ATTENTION_PREFETCH_WORDS_BYTES: usize = 8 << 20;

/// The smallest quantized gate/up words (bytes) that [`attention_prefetch_words`]
/// prefetches by default: where the whole matrix is a few of the GEMV's first waves,
/// its programs request as much before their wait themselves, and the prefetch only
/// competes with the O projection (Qwen3-0.6B above).
pub const PREFETCH_WORDS_MIN_MATRIX: usize = 32 << 20;

/// `TILEFUSE_PREFETCH_WORDS` (KiB) when set: a budget for every quantized gate/up
/// matrix whatever its size (0 turns the prefetch off). `None`: the default policy,
/// [`attention_prefetch_words`].
pub fn attention_prefetch_words_override() -> Option<usize> {
    env_kib("TILEFUSE_PREFETCH_WORDS")
}

/// Bytes of a quantized gate/up matrix's `words_bytes` of packed words that the
/// attention launch before it asks L2 for: `budget` when one is set, else
/// [`ATTENTION_PREFETCH_WORDS_BYTES`] (`q8_0`: Q8_0 words,
/// [`Q8_0_ATTENTION_PREFETCH_WORDS_BYTES`]) for matrices of at least
/// [`PREFETCH_WORDS_MIN_MATRIX`] and none for smaller ones; never more than the words.
pub fn attention_prefetch_words(words_bytes: usize, budget: Option<usize>, q8_0: bool) -> usize {
    let default = if q8_0 {
        Q8_0_ATTENTION_PREFETCH_WORDS_BYTES
    } else {
        ATTENTION_PREFETCH_WORDS_BYTES
    };
    words_budget(words_bytes, budget, default, PREFETCH_WORDS_MIN_MATRIX).min(words_bytes)
}

/// Bytes of the next GEMV's quantized words that a quantizer launch (`quantize_act`,
/// before the QKV, gate/up and down GEMVs) asks L2 for once the GEMV before it has
/// finished, past any the attention already asked for, where those words are at least
/// [`QUANTIZER_PREFETCH_MIN_MATRIX`].
///
/// H100, in the captured step (`tilefuse bench --quant-tiles qprefetch=KiB`, seven
/// interleaved rounds; docs/perf.md, "Quantized gate/up words prefetched during
/// attention"): Qwen3-8B Q4_K_M at context 512, 512 KiB +0.08%, 1 MiB -0.41%, -0.43%
/// and -0.45%, 1.5 MiB -0.60%, 2 MiB -0.23%, 4 MiB +1.64% a step (the window between
/// two GEMVs is short: past a MiB or two the prefetch delays the next GEMV's own
/// loads); Qwen3-0.6B Q8_0 (a 3 MiB down matrix) 1 MiB +1.55%, 512 KiB +0.55%. 1.5
/// MiB with the attention's 6 MiB: docs/perf.md, "The two prefetch budgets together".
pub const QUANTIZER_PREFETCH_BYTES: usize = 3 << 19;

/// [`QUANTIZER_PREFETCH_BYTES`] for Q8_0 words (with
/// [`Q8_0_ATTENTION_PREFETCH_WORDS_BYTES`]).
pub const Q8_0_QUANTIZER_PREFETCH_BYTES: usize = 1 << 20;

/// The smallest quantized words (bytes) that a quantizer launch prefetches by default
/// ([`quantizer_prefetch`]; Qwen3-8B's matrices have 12-48 MiB, Qwen3-0.6B's 1-3 MiB).
pub const QUANTIZER_PREFETCH_MIN_MATRIX: usize = 8 << 20;

/// `TILEFUSE_QUANTIZER_PREFETCH` (KiB) when set: a budget for every quantized matrix
/// whatever its size (0 turns the prefetch off). `None`: the default policy,
/// [`quantizer_prefetch`].
pub fn quantizer_prefetch_override() -> Option<usize> {
    env_kib("TILEFUSE_QUANTIZER_PREFETCH")
}

/// The range, `(offset, length)` in bytes, of a GEMV's `words_bytes` of packed words
/// that the quantizer launch before it asks L2 for, starting at `skip` (the bytes the
/// attention already asked for): `budget` when one is set, else
/// [`QUANTIZER_PREFETCH_BYTES`] (`q8_0`: Q8_0 words, [`Q8_0_QUANTIZER_PREFETCH_BYTES`])
/// for words of at least [`QUANTIZER_PREFETCH_MIN_MATRIX`] and none for fewer; never
/// past the words.
pub fn quantizer_prefetch(
    words_bytes: usize,
    skip: usize,
    budget: Option<usize>,
    q8_0: bool,
) -> (usize, usize) {
    let default = if q8_0 {
        Q8_0_QUANTIZER_PREFETCH_BYTES
    } else {
        QUANTIZER_PREFETCH_BYTES
    };
    let bytes = words_budget(words_bytes, budget, default, QUANTIZER_PREFETCH_MIN_MATRIX);
    (skip, bytes.min(words_bytes.saturating_sub(skip)))
}

/// The one rule for the attention's split count, for `seq` positions (the decode step
/// passes its KV cache's capacity: the graph fixes the count for every position) in
/// tiles of `bs`: one split per tile, at most [`STEP_SPLITS`]. With
/// [`ATTENTION_MIN_CHUNK`], shorter contexts leave the later splits empty.
pub fn attention_splits(seq: usize, bs: usize) -> usize {
    seq.max(1).div_ceil(bs.max(1)).clamp(1, STEP_SPLITS)
}

/// The cluster size of the decode step's attention on a GPU of compute capability
/// `cc`: 1, splits merged by `attention_combine`. Merging the splits of a KV head in a
/// thread-block cluster instead (one launch per layer fewer) measured slower on an
/// H100: each clustered launch costs several microseconds more than the combine it
/// saves (docs/perf.md). On sm_90 and newer, `TILEFUSE_ATTN_CLUSTER=8|16` selects it
/// for comparisons (the Qwen3 head shape, D = 128 with query-head pairs); other values
/// are ignored.
pub fn attention_cluster(cc: (i32, i32)) -> usize {
    if cc.0 < 9 {
        return 1;
    }
    std::env::var("TILEFUSE_ATTN_CLUSTER")
        .ok()
        .and_then(|v| v.parse::<usize>().ok())
        .filter(|c| STEP_CLUSTERS.contains(c))
        .unwrap_or(1)
}

/// The cluster sizes [`attention_cluster`] may select (compiled for D = 128, G = 2,
/// 64-position tiles).
pub const STEP_CLUSTERS: [usize; 2] = [8, 16];

/// The most splits the attention uses: 8 KV heads × 32 splits is two programs per SM of
/// an H100 (`examples/bandwidth.rs`, H100, 64-position tiles: 32 splits beat 64 at 4k and
/// 32k positions).
pub const STEP_SPLITS: usize = 32;

/// Logits per program of the device-sampling kernels (`B` of
/// [`crate::sampling::kernels::sample_draw`]): small, so that real vocabularies give one program or
/// more per SM (H100, Qwen3-0.6B: 4096 made a sampled token 17 µs slower).
pub const SAMPLE_BLOCK: usize = 1024;

/// The compiled reduction widths (`PB`) of [`crate::sampling::kernels::sample_check`] and
/// [`crate::sampling::kernels::sample_pick`].
pub const SAMPLE_REDUCE_WIDTHS: [usize; 3] = [64, 256, 1024];

/// The largest `top_k` the device draws with when top-p is set too (`KM` of
/// [`crate::sampling::kernels::sample_topk_part`]).
pub const SAMPLE_TOP_K_MAX: usize = 64;

/// Logits per program of [`crate::sampling::kernels::sample_topk_part`] (`B`): few lists to merge,
/// since the merge is serial (H100: 1024 took ~70 µs a token for top-k 20, mostly in
/// the merge of 149 lists).
pub const SAMPLE_TOP_K_BLOCK: usize = 4096;

/// Candidates [`crate::sampling::kernels::sample_topk_mass`] merges (`F`): programs × `SAMPLE_TOP_K_MAX`.
pub const SAMPLE_TOP_K_MERGE: usize = 4096;

/// The smallest compiled reduction width that covers `parts` programs of
/// [`SAMPLE_BLOCK`] logits (`None` past the widest).
pub fn sample_reduce_width(parts: usize) -> Option<usize> {
    SAMPLE_REDUCE_WIDTHS.into_iter().find(|&w| w >= parts)
}

/// Every compiled `(BLOCK_N, BLOCK_K, num_warps)` of a GEMV-family kernel, for sweeps.
pub fn gemv_variants(def: &tilefuse_dsl::runtime::KernelDef) -> Vec<GemvConfig> {
    def.variants
        .iter()
        .map(|v| GemvConfig::of_variant(def, v.consts, v.num_warps))
        .collect()
}

/// Whether the defaults name compiled variants (checked by tests).
pub fn defaults_are_compiled() -> bool {
    // Qwen3-0.6B's and Llama-3.2-1B's projections.
    let shapes = [
        (4096, 1024),
        (1024, 2048),
        (3072, 1024),
        (1024, 3072),
        (3072, 2048),
        (2048, 2048),
        (8192, 2048),
        (2048, 8192),
    ];
    let has = |def: &tilefuse_dsl::runtime::KernelDef, c: GemvConfig| {
        def.variant(&c.consts_for(def), Some(c.num_warps)).is_ok()
    };
    shapes.iter().all(|&(n, k)| {
        let c = gemv_config(n, k);
        has(&kernels::RMS_NORM_GEMV, norm_gemv_config(n, k))
            && has(&kernels::GEMV_RESIDUAL, c)
            && has(&kernels::RMS_NORM_GATE_UP, gate_up_config(n, k))
    }) && has(&kernels::LM_HEAD_ARGMAX, lm_head_config(151_936, 1024))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantized_words_are_prefetched_for_large_matrices_or_as_set() {
        // Qwen3-8B's Q4_K gate/up words (24576 x 4096 at 4 bits), Qwen3-0.6B's, and
        // Qwen3-8B's Q8_0 ones (8 bits).
        let (big, small, big_q8) = (24576 * 4096 / 2, 6144 * 1024 / 2, 24576 * 4096);
        let (a, a_q8) = (
            ATTENTION_PREFETCH_WORDS_BYTES,
            Q8_0_ATTENTION_PREFETCH_WORDS_BYTES,
        );
        assert!(a < big && a_q8 < big_q8);
        assert_eq!(attention_prefetch_words(big, None, false), a);
        assert_eq!(attention_prefetch_words(big_q8, None, true), a_q8);
        assert_eq!(attention_prefetch_words(small, None, false), 0);
        assert_eq!(attention_prefetch_words(small, None, true), 0);
        assert_eq!(
            attention_prefetch_words(small, Some(1 << 20), false),
            1 << 20
        );
        assert_eq!(attention_prefetch_words(small, Some(64 << 20), true), small);
        assert_eq!(attention_prefetch_words(big, Some(0), false), 0);
        // The quantizers: 8B's QKV words (6144 x 4096 at 4 bits), 0.6B's Q8_0 down.
        let (qkv, down) = (6144 * 4096 / 2, 1024 * 3072);
        let (q, q_q8) = (QUANTIZER_PREFETCH_BYTES, Q8_0_QUANTIZER_PREFETCH_BYTES);
        assert!(q < qkv && q_q8 < qkv);
        assert_eq!(quantizer_prefetch(qkv, 0, None, false), (0, q));
        assert_eq!(quantizer_prefetch(2 * qkv, 0, None, true), (0, q_q8));
        assert_eq!(quantizer_prefetch(down, 0, None, true), (0, 0));
        assert_eq!(
            quantizer_prefetch(down, 0, Some(512 << 10), true),
            (0, 512 << 10)
        );
        assert_eq!(quantizer_prefetch(big, a, None, false), (a, q));
        assert_eq!(quantizer_prefetch(big_q8, a_q8, None, true), (a_q8, q_q8));
        assert_eq!(
            quantizer_prefetch(qkv, qkv - 100, None, false),
            (qkv - 100, 100)
        );
        assert_eq!(quantizer_prefetch(qkv, 2 * qkv, None, false), (2 * qkv, 0));
    }

    #[test]
    fn device_sampling_has_a_variant_for_every_vocabulary() {
        // Fixtures' small vocabularies, Llama 3, Qwen, Gemma-sized, and the largest.
        for vocab in [1usize, 1000, 32_000, 128_256, 151_936, 262_144, 1_048_576] {
            let parts = vocab.div_ceil(SAMPLE_BLOCK);
            let pb = sample_reduce_width(parts).unwrap_or_else(|| panic!("vocab {vocab}"));
            assert!(pb >= parts);
            let (b, r, pb) = (SAMPLE_BLOCK as i64, 4, pb as i64);
            assert!(crate::sampling::kernels::SAMPLE_DRAW
                .variant(&[b, r], None)
                .is_ok());
            assert!(
                crate::sampling::kernels::SAMPLE_CHECK
                    .variant(&[b, r, pb], None)
                    .is_ok(),
                "vocab {vocab}"
            );
            assert!(
                crate::sampling::kernels::SAMPLE_PICK
                    .variant(&[r, pb], None)
                    .is_ok(),
                "vocab {vocab}"
            );
        }
        assert_eq!(sample_reduce_width(1025), None);
    }

    #[test]
    fn gemv_configs_map_every_variant_s_constants_by_name() {
        for def in [
            &kernels::RMS_NORM_GEMV,
            &kernels::GEMV_RESIDUAL,
            &kernels::RMS_NORM_GATE_UP,
            &kernels::LM_HEAD_ARGMAX,
        ] {
            let configs = gemv_variants(def);
            assert_eq!(configs.len(), def.variants.len());
            for (v, c) in def.variants.iter().zip(&configs) {
                assert_eq!(c.consts_for(def), v.consts, "{}", def.name);
                assert_eq!(c.num_warps, v.num_warps);
            }
            // Each kernel has whole-row variants that reduce each tile as it arrives.
            assert!(
                configs
                    .iter()
                    .any(|c| c.reduce_each == 1 && c.block_k >= 1024),
                "{}",
                def.name
            );
        }
    }

    #[test]
    fn defaults_name_compiled_variants() {
        assert!(defaults_are_compiled());
        for seq in [1, 3, 512, 4096, 32768] {
            let c = attention_config(seq);
            assert!(
                c.splits >= 1 && c.splits <= c.s && c.s <= MAX_SPLITS,
                "{c:?}"
            );
            assert!(kernels::ATTENTION_COMBINE
                .variant(&[128, c.s as i64, c.dc as i64], None)
                .is_ok());
            assert!(kernels::ATTENTION_SPLIT
                .variant(
                    &[128, 2, c.bs as i64, c.stages as i64, c.cluster as i64],
                    None
                )
                .is_ok());
            // The clustered variants the decode step may select.
            for stages in [1, 2] {
                for cluster in STEP_CLUSTERS {
                    assert!(kernels::ATTENTION_SPLIT
                        .variant(&[128, 2, ATTENTION_BS as i64, stages, cluster as i64], None)
                        .is_ok());
                }
            }
        }
        assert_eq!(attention_config(32768).splits, 32);
        assert_eq!(attention_config(1).splits, 1);
    }

    #[test]
    fn step_splits_give_each_a_tile_of_capacity() {
        for (seq, want) in [
            (1, 1),
            (64, 1),
            (65, 2),
            (1160, 19),
            (4096, 32),
            (1 << 20, 32),
        ] {
            assert_eq!(attention_splits(seq, ATTENTION_BS), want, "max_seq {seq}");
        }
    }

    #[test]
    fn gemv_defaults_give_every_sm_work() {
        // Qwen3-0.6B and Llama-3.2-1B projections: at least one program per SM.
        for (n, k) in [
            (4096, 1024),
            (1024, 2048),
            (1024, 3072),
            (2048, 8192),
            (3072, 2048),
        ] {
            let c = gemv_config(n, k);
            assert!(c.grid(n) as usize >= DEFAULT_SM_COUNT - 4, "{n}x{k}: {c:?}");
        }
        assert_eq!(argmax_finish_config(9496), (16384, 16));
        assert_eq!(argmax_finish_config(13), (256, 4));
        for parts in [1, 300, 2000, 9496, 40000] {
            let (b, w) = argmax_finish_config(parts);
            assert!(kernels::ARGMAX_FINISH.variant(&[b as i64], Some(w)).is_ok());
        }
    }
}
