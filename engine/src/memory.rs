//! Device memory a model needs, checked against what the GPU has free before
//! anything is allocated (or, for a preset, generated), so that a model that
//! does not fit fails at once with the sizes, not halfway through an upload.
//!
//! The counts follow what [`crate::Decoder::new`] allocates: the weights in the
//! kernels' layout (fused `[q; k; v]` and `[gate; up]` rows; a zero bias and unit
//! QK-norm weights where the model has none), the KV cache, RoPE tables and the
//! step's scratch buffers, the batched prefill's chunk activations
//! ([`crate::prefill::Prefiller`]), plus [`RESERVE_BYTES`] for what is not counted
//! (kernel images, CUDA graphs, the prefill's split-K partials, allocation
//! granularity).

use tilefuse_dsl::runtime::Device;

use crate::config::ModelConfig;
use crate::decode::QuantWeights;
use crate::error::{EngineError, Result};
use crate::tp::TpPlan;
use crate::tuning;

/// Bytes set aside beyond the counted buffers: loaded kernel images, graphs, the
/// device sampler, allocation rounding.
pub const RESERVE_BYTES: u64 = 256 << 20;

const GIB: f64 = (1u64 << 30) as f64;

/// Device memory one decoder needs, in bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemoryNeed {
    /// Weights in the decoder's layout (bf16).
    pub weights: u64,
    /// The KV cache (bf16 keys and values of every layer and position).
    pub kv_cache: u64,
    /// RoPE tables, step buffers, and [`RESERVE_BYTES`].
    pub workspace: u64,
    /// The batched prefill's activations for a chunk of
    /// [`crate::prefill::DEFAULT_CHUNK`] tokens (at most `max_seq_len`), and, with
    /// quantized matrices, the short chunks' int8 rows; 0 for a tensor-parallel rank,
    /// which has no batched prefill.
    pub prefill: u64,
    /// KV-cache positions counted.
    pub max_seq_len: usize,
}

impl MemoryNeed {
    /// A single-GPU decoder of `cfg` with a KV cache of `max_seq_len` positions.
    pub fn for_decoder(cfg: &ModelConfig, max_seq_len: usize) -> MemoryNeed {
        MemoryNeed {
            prefill: prefill_need(cfg, max_seq_len),
            ..decoder_need(cfg, cfg.vocab_size, max_seq_len)
        }
    }

    /// Rank `r`'s decoder under `plan`: its shard of every layer, its KV heads, its
    /// LM-head rows, and the whole embedding.
    pub fn for_rank(cfg: &ModelConfig, plan: &TpPlan, r: usize, max_seq_len: usize) -> MemoryNeed {
        let local = plan.rank_config(cfg, r);
        decoder_need(&local, cfg.vocab_size, max_seq_len)
    }

    /// A single-GPU decoder of `cfg` that reads `quant`'s matrices quantized
    /// ([`crate::Decoder::with_quant`]): [`MemoryNeed::for_decoder`] with each matrix
    /// it covers ([`QuantWeights::covers`], and a quantized LM head) at its quantized
    /// size instead of bf16's, plus the batched prefill's scratch for the largest of
    /// them dequantized (`prefill::PrefillWeight`).
    pub fn for_quant_decoder(
        cfg: &ModelConfig,
        quant: &QuantWeights,
        max_seq_len: usize,
    ) -> MemoryNeed {
        let mut need = MemoryNeed::for_decoder(cfg, max_seq_len);
        let (h, qd, kvd, im, v) = (
            cfg.hidden_size as u64,
            cfg.q_dim() as u64,
            cfg.kv_dim() as u64,
            cfg.intermediate_size as u64,
            cfg.vocab_size as u64,
        );
        let (mut dense, mut packed, mut scratch) = (0u64, 0u64, 0u64);
        for (i, l) in quant.layers.iter().enumerate() {
            let covers = quant.covers(i);
            // Fused projections: (first part, elements, parts).
            let fused = [
                (0, (qd + 2 * kvd) * h, [&l.q, &l.k, &l.v].to_vec()),
                (3, h * qd, vec![&l.o]),
                (4, 2 * im * h, vec![&l.gate, &l.up]),
                (6, h * im, vec![&l.down]),
            ];
            for (part, elements, parts) in fused {
                if covers[part] {
                    dense += 2 * elements;
                    packed += parts
                        .iter()
                        .filter_map(|m| m.as_ref().map(|m| m.device_bytes() as u64))
                        .sum::<u64>();
                    scratch = scratch.max(2 * elements);
                }
            }
        }
        if let Some(head) = &quant.lm_head {
            // A tied head keeps the bf16 table for the embedding rows.
            if !cfg.tie_word_embeddings {
                dense += 2 * v * h;
            }
            packed += head.device_bytes() as u64;
        }
        need.weights = need.weights - dense + packed;
        need.workspace += scratch;
        if scratch > 0 {
            // The short chunks' room (`gguf::device::QuantRows`: a byte a value and an
            // f32 scale a block), their gate/up output and its zero bias.
            let rows = crate::prefill::QUANT_GEMV_TOKENS.min(max_seq_len) as u64;
            let cols = h.max(qd).max(im).next_multiple_of(32);
            need.prefill += rows * cols + rows * cols / 8 + 2 * rows * 2 * im + 2 * 2 * im;
        }
        need
    }

    /// Everything, in bytes.
    pub fn total(&self) -> u64 {
        self.weights + self.kv_cache + self.workspace + self.prefill
    }

    /// `weights 15.26 GiB + KV cache 576.0 MiB (4096 positions) + workspace 262.3 MiB +
    /// prefill 283.0 MiB`.
    pub fn breakdown(&self) -> String {
        format!(
            "weights {} + KV cache {} ({} positions) + workspace {} + prefill {}",
            human(self.weights),
            human(self.kv_cache),
            self.max_seq_len,
            human(self.workspace),
            human(self.prefill)
        )
    }
}

/// Bytes in GiB (two decimals) from 1 GiB up, else in MiB.
fn human(bytes: u64) -> String {
    if bytes as f64 >= GIB {
        format!("{:.2} GiB", bytes as f64 / GIB)
    } else {
        format!("{:.1} MiB", bytes as f64 / (1u64 << 20) as f64)
    }
}

/// The batched prefill's chunk activations ([`crate::prefill::Prefiller::new`]): for
/// each of a chunk's tokens its id, the residual stream and its norm, the fused QKV
/// output, the rotated queries, the attention output and the MLP's activation, bf16.
fn prefill_need(cfg: &ModelConfig, max_seq_len: usize) -> u64 {
    let chunk = crate::prefill::DEFAULT_CHUNK.min(max_seq_len) as u64;
    let (h, qd, im) = (
        cfg.hidden_size as u64,
        cfg.q_dim() as u64,
        cfg.intermediate_size as u64,
    );
    let qkv = qd + 2 * cfg.kv_dim() as u64;
    chunk * (4 + 2 * (2 * h + qkv + 2 * qd + im))
}

/// The decoder's allocations for `cfg` (whose `vocab_size` is the LM head's rows)
/// with an embedding of `embed_vocab` rows.
fn decoder_need(cfg: &ModelConfig, embed_vocab: usize, max_seq_len: usize) -> MemoryNeed {
    let u = |n: usize| n as u64;
    let (h, hd, im, v) = (
        u(cfg.hidden_size),
        u(cfg.head_dim),
        u(cfg.intermediate_size),
        u(cfg.vocab_size),
    );
    let (heads, qd, kvd) = (u(cfg.num_heads), u(cfg.q_dim()), u(cfg.kv_dim()));
    let qkv = qd + 2 * kvd;
    let seq = u(max_seq_len);
    // Per layer: norms, fused QKV and its bias, QK-norm weights, O and its bias,
    // fused gate/up, down.
    let layer = 2 * h + qkv * h + qkv + 2 * hd + h * qd + h + 2 * im * h + h * im;
    let head = if cfg.tie_word_embeddings && u(embed_vocab) == v {
        0
    } else {
        v * h
    };
    let weights = 2 * (u(cfg.num_layers) * layer + u(embed_vocab) * h + head + h);
    let kv_cache = 2 * 2 * u(cfg.num_layers) * kvd * seq;
    let splits = u(tuning::MAX_SPLITS);
    let rope = 2 * 4 * seq * (hd / 2);
    let activations = 2 * (h + qkv + 2 * qd + im + qkv.max(h));
    let attention_parts = 4 * heads * splits * (2 + hd);
    let lm_head = 3 * 4 * v;
    let stamps = 8 * 4 * (qkv + heads * splits + heads * hd.div_ceil(32) + 2 * h + im);
    MemoryNeed {
        weights,
        kv_cache,
        workspace: rope + activations + attention_parts + lm_head + stamps + RESERVE_BYTES,
        prefill: 0,
        max_seq_len,
    }
}

/// `(free, total)` bytes of a GPU's memory; `None` on the CPU (whose memory the
/// engine does not budget).
pub fn device_memory(dev: &Device) -> Result<Option<(u64, u64)>> {
    let Some(cuda) = dev.as_cuda() else {
        return Ok(None);
    };
    let (free, total) = cuda
        .context()
        .mem_get_info()
        .map_err(|e| EngineError::Option {
            message: format!("querying the free memory of {dev}: {e:?}"),
        })?;
    Ok(Some((free as u64, total as u64)))
}

/// Checks that `need` fits the free memory of `dev`; an error naming `model` and
/// both sizes in GiB (with a hint: a shorter KV cache, or more GPUs) if not. Always
/// fine on the CPU.
pub fn check_fits(dev: &Device, model: &str, cfg: &ModelConfig, need: &MemoryNeed) -> Result<()> {
    let Some((free, total)) = device_memory(dev)? else {
        return Ok(());
    };
    fits(model, &dev.name(), cfg, need, free, total)
}

/// [`check_fits`] with the device's memory given.
pub fn fits(
    model: &str,
    device: &str,
    cfg: &ModelConfig,
    need: &MemoryNeed,
    free: u64,
    total: u64,
) -> Result<()> {
    if need.total() <= free {
        return Ok(());
    }
    let hint = if need.weights + need.workspace + need.prefill <= free {
        // The weights fit; the cache is what is too long (a shorter cache's prefill
        // chunk takes no more than this one's).
        let per_position = need.kv_cache / need.max_seq_len.max(1) as u64;
        let rest = free - need.weights - need.workspace - need.prefill;
        let positions = rest / per_position.max(1);
        format!("; a KV cache of at most {positions} positions fits (--max-seq-len)")
    } else {
        // Split the model over enough GPUs of this size, if the shapes allow.
        (2..=8)
            .filter_map(|n| {
                let plan = TpPlan::new(cfg, n).ok()?;
                let worst = (0..n)
                    .map(|r| MemoryNeed::for_rank(cfg, &plan, r, need.max_seq_len).total())
                    .max()?;
                (worst <= free).then(|| {
                    format!(
                        "; split over {n} such GPUs (--tp {n}) each needs {:.2} GiB",
                        worst as f64 / GIB
                    )
                })
            })
            .next()
            .unwrap_or_default()
    };
    Err(EngineError::OutOfMemory {
        model: model.to_string(),
        device: device.to_string(),
        need_gib: need.total() as f64 / GIB,
        detail: need.breakdown(),
        free_gib: free as f64 / GIB,
        total_gib: total as f64 / GIB,
        hint,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preset;

    const GB80: u64 = 80 * 1_000_000_000;

    #[test]
    fn weights_are_the_parameters_plus_the_decoders_padding() {
        // Qwen3-8B: 8.19e9 parameters, 16.4 GB of bf16; the decoder adds zero
        // biases and the O bias per layer (a few MB).
        let cfg = preset::config("qwen3-8b").unwrap();
        let need = MemoryNeed::for_decoder(&cfg, 4096);
        let params: usize = preset::random_tensors(&cfg).iter().map(|t| t.len).sum();
        let padding = need.weights - 2 * params as u64;
        assert!(padding > 0 && padding < 1 << 20, "padding {padding}");
        // KV cache: 36 layers x 8 KV heads x 128 x 4096 positions x 2 (k, v) x 2 bytes.
        assert_eq!(need.kv_cache, 36 * 8 * 128 * 4096 * 2 * 2);
        assert!(need.total() < GB80);
    }

    #[test]
    fn a_model_too_big_for_one_gpu_names_both_sizes_and_the_split_that_fits() {
        let cfg = preset::config("llama-3.1-70b").unwrap();
        let need = MemoryNeed::for_decoder(&cfg, 4096);
        let free = GB80 - (1 << 30);
        let e = fits("llama-3.1-70b", "NVIDIA H100", &cfg, &need, free, GB80)
            .unwrap_err()
            .to_string();
        println!("{e}");
        assert!(
            e.contains("llama-3.1-70b needs 13") && e.contains("73.5") && e.contains("74.5"),
            "{e}"
        );
        assert!(
            e.contains("weights 131.") && e.contains("4096 positions"),
            "{e}"
        );
        assert!(e.contains("--tp 2"), "{e}");
        // Split in two, each rank fits.
        let plan = TpPlan::new(&cfg, 2).unwrap();
        for r in 0..2 {
            let rank = MemoryNeed::for_rank(&cfg, &plan, r, 4096);
            assert!(rank.total() < free, "{}", rank.breakdown());
            assert!(rank.weights < need.weights / 2 + (2 << 30));
        }
    }

    #[test]
    fn the_prefill_chunk_is_counted() {
        let cfg = preset::config("qwen3-8b").unwrap();
        // A token's id, x and its norm (4096 each), QKV (6144), queries and attention
        // output (4096 each), the MLP's activation (12288); chunks of 8192 tokens, or
        // the cache's length when shorter.
        let per_token = 4 + 2 * (2 * 4096 + 6144 + 2 * 4096 + 12288);
        let long = MemoryNeed::for_decoder(&cfg, 16384);
        assert_eq!(long.prefill, 8192 * per_token);
        assert_eq!(
            MemoryNeed::for_decoder(&cfg, 1000).prefill,
            1000 * per_token
        );
        assert!(
            long.breakdown().contains("+ prefill 544.0 MiB"),
            "{}",
            long.breakdown()
        );
        assert_eq!(
            long.total(),
            long.weights + long.kv_cache + long.workspace + long.prefill
        );
        // A split model has no batched prefill.
        let plan = TpPlan::new(&cfg, 2).unwrap();
        assert_eq!(MemoryNeed::for_rank(&cfg, &plan, 0, 16384).prefill, 0);
        // A GPU with room for everything but the chunk is refused, naming it.
        let free = long.total() - long.prefill / 2;
        let e = fits("qwen3-8b", "x", &cfg, &long, free, GB80)
            .unwrap_err()
            .to_string();
        assert!(e.contains("prefill 544.0 MiB"), "{e}");
        assert!(fits("qwen3-8b", "x", &cfg, &long, long.total(), GB80).is_ok());
    }

    #[test]
    fn a_cache_too_long_suggests_the_positions_that_fit() {
        let cfg = preset::config("qwen3-32b").unwrap();
        let need = MemoryNeed::for_decoder(&cfg, 131072);
        let e = fits("qwen3-32b", "NVIDIA H100", &cfg, &need, GB80, GB80)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--max-seq-len") && e.contains("131072 positions"),
            "{e}"
        );
        assert!(fits(
            "qwen3-32b",
            "x",
            &cfg,
            &MemoryNeed::for_decoder(&cfg, 4096),
            GB80,
            GB80
        )
        .is_ok());
    }

    #[test]
    fn the_cpu_is_not_budgeted() {
        let cfg = preset::config("llama-3.1-70b").unwrap();
        let need = MemoryNeed::for_decoder(&cfg, 4096);
        assert!(check_fits(&Device::cpu(), "m", &cfg, &need).is_ok());
    }
}
