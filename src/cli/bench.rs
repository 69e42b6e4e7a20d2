//! `tilefuse bench`: decode throughput on a preset against the bandwidth floor.

use std::path::PathBuf;

use clap::Args;

use crate::engine::bench::{self, DecodeBenchOptions};

/// Arguments of `tilefuse bench`.
#[derive(Debug, Args)]
pub struct BenchArgs {
    /// The preset (random weights at real shape), or the path of a config.json.
    #[arg(long, default_value = "qwen3-0.6b")]
    pub preset: String,
    /// The weights' format: `bf16`, or random blocks in GGUF's formats at the preset's
    /// shapes, read by the quantized GEMVs: `q8_0` (every matrix), `q4_k_m`
    /// (llama.cpp's mix of Q4_K and Q6_K), `q5_k_m` (Q5_K and Q6_K), `q3_k_m` (Q3_K
    /// beside Q4_K and Q5_K), `iq4_xs` (IQ4_XS beside Q5_K) or `q4_0` (Q4_0, a Q6_K
    /// head). A quantized
    /// run first times bf16 in the same
    /// process and prints the two side by side.
    #[arg(long, default_value = "bf16")]
    pub weights: String,
    /// Split the model over this many GPUs (tensor parallelism, GPUs 0..N, NCCL or, for
    /// two GPUs with peer access, their memory between them; with `--device cpu`, interpreter ranks) and compare with one GPU in the
    /// same run: tokens/s, % of the combined floor (the slowest GPU's bytes over its
    /// copy bandwidth), time in the collectives, speed-up, and `--check-tokens`
    /// greedy tokens against one GPU. Weights are drawn on the GPUs.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub tp: u16,
    /// With `--tp`: greedy tokens compared between one GPU and the split (0: none).
    #[arg(long, default_value_t = 64)]
    pub check_tokens: usize,
    /// With `--tp`: the all-reduces to time, each a split run of its own: `nccl`,
    /// `peer` (two GPUs over peer memory, no NCCL), or `all` (every one the GPUs
    /// support, compared in the same run).
    #[arg(long, default_value = "all")]
    pub all_reduce: String,
    /// With `--tp`: skip the one-GPU run (no speed-up, no agreement check).
    #[arg(long)]
    pub no_baseline: bool,
    /// Tokens of KV already in the cache.
    #[arg(long, default_value_t = 1024)]
    pub context: usize,
    /// Decode steps to time per mode.
    #[arg(long, default_value_t = 128)]
    pub tokens: usize,
    /// `cpu`, `cuda` or `cuda:K`; default: the GPU if there is one.
    #[arg(long)]
    pub device: Option<String>,
    /// Seed of the random weights.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Time eager launches only (also: TILEFUSE_CUDA_GRAPH=0).
    #[arg(long)]
    pub no_graph: bool,
    /// Skip the eager comparison.
    #[arg(long)]
    pub no_eager: bool,
    /// Time each block of a step on its own, and what the step loses to it (the step's
    /// graph with and without the block's launches, interleaved).
    #[arg(long)]
    pub profile: bool,
    /// Try every compiled variant of each launch inside the captured step, each in
    /// interleaved pairs with the best plan so far, and print the best plan (GPU only;
    /// a few hundred graph captures; `--tokens` replays a timing).
    #[arg(long)]
    pub sweep: bool,
    /// Also time sampled decoding (temperature 0.8, top-p 0.9), drawn on the device
    /// after each step.
    #[arg(long)]
    pub sampled: bool,
    /// Stamp one layer's launches (the middle one unless `--timeline-layer`) and print
    /// when their programs start, get past their wait and finish (20 graph replays on a
    /// GPU, medians), launch by launch (a quantized block's quantizer and GEMVs apart).
    #[arg(long)]
    pub timeline: bool,
    /// The layer `--timeline` stamps.
    #[arg(long, requires = "timeline")]
    pub timeline_layer: Option<usize>,
    /// Also time the batched prefill of a random prompt of this many tokens (time to
    /// first token and prompt tokens/s; 0: off).
    #[arg(long, default_value_t = 0)]
    pub prompt: usize,
    /// Tokens per prefill chunk (default: the engine's).
    #[arg(long, requires = "prompt")]
    pub prefill_chunk: Option<usize>,
    /// Also time the prefill with these tiles (repeatable; `qkv=128x64x64/8,o=..,
    /// gate_up=..,down=..,attention=128x64/8`, `/P` after a GEMM tile's warps picks
    /// the variant pipelined P stages deep, `:S` after a qkv, o or down tile splits K
    /// into at most S slices, e.g. `o=128x64x64/8/4:2`; launches left out keep the
    /// default: `PrefillPlan::with_tiles`), each after the default plan.
    #[arg(long, requires = "prompt")]
    pub prefill_tiles: Vec<String>,
    /// Time the prefill only (no decode modes).
    #[arg(long, requires = "prompt")]
    pub prefill_only: bool,
    /// With quantized `--weights`: chunks of up to this many tokens read the quantized
    /// matrices with the multi-token GEMVs (default: the engine's, or the environment's
    /// `TILEFUSE_QUANT_PREFILL_TOKENS`; 0: every chunk dequantizes them for the GEMMs).
    /// When the prompt takes them, the prefill with every matrix dequantized is timed
    /// after it, in the same process.
    #[arg(long, requires = "prompt")]
    pub quant_gemv_tokens: Option<usize>,
    /// With quantized `--weights`: also time these variants of the step against its
    /// default inside the captured graph, interleaved over rounds (repeatable; `;`-
    /// separated entries: `head=quant` or `head=bf16` for the LM head's format,
    /// `prefetch=KiB` for the quantized gate/up words the attention asks L2 for,
    /// `qprefetch=KiB` for the next GEMV's words each quantizer launch asks for,
    /// `splits=N`, `min_chunk=N` and `combine_dc=N` for the attention's splits and merge,
    /// `ROWSxCOLS=n,k,warps` for the quantized GEMVs of that shape, `norm:ROWSxCOLS=..`
    /// for those that quantize their normed input themselves, a type before the shape
    /// for runs of that type only (`Q6_K:4096x12288=8,1024,8`), e.g.
    /// `head=quant;151936x1024=16,1024,4`). `TILEFUSE_QUANT_TILES` sets the default's.
    #[arg(long)]
    pub quant_tiles: Vec<String>,
    /// Also write the report as JSON.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Runs `tilefuse bench`.
pub fn run(args: &BenchArgs) -> anyhow::Result<()> {
    let device = super::generate::parse_device(args.device.as_deref())?;
    let weights: bench::WeightFormat = args.weights.parse()?;
    // Fail before generating weights when the model does not fit (or cannot be split).
    let cfg = crate::engine::preset::config(&args.preset)?;
    crate::engine::engine::check_placement(
        &args.preset,
        &cfg,
        &crate::engine::EngineOptions {
            device: device.clone(),
            max_seq_len: Some(args.context + args.tokens + 8),
            tp: usize::from(args.tp),
            ..Default::default()
        },
    )?;
    let timeline = if args.timeline {
        let layers = crate::engine::preset::config(&args.preset)?.num_layers;
        Some(args.timeline_layer.unwrap_or(layers / 2))
    } else {
        None
    };
    let graph = !args.no_graph && std::env::var("TILEFUSE_CUDA_GRAPH").map_or(true, |v| v != "0");
    if args.tp > 1 {
        anyhow::ensure!(
            weights == bench::WeightFormat::Bf16,
            "--weights {} with --tp {}: split models read bf16 weights only",
            args.weights,
            args.tp
        );
        let report = bench::tp::run(&bench::tp::TpBenchOptions {
            preset: args.preset.clone(),
            tp: usize::from(args.tp),
            cpu: !device.is_cuda(),
            context: args.context,
            tokens: args.tokens,
            seed: args.seed,
            graph,
            baseline: !args.no_baseline,
            check_tokens: if args.no_baseline {
                0
            } else {
                args.check_tokens
            },
            all_reduce: if args.all_reduce.trim() == "all" {
                Vec::new()
            } else {
                vec![crate::engine::decode::tp::AllReduce::parse(
                    &args.all_reduce,
                )?]
            },
        })?;
        super::write_stdout(&report.to_string())?;
        if let Some(path) = &args.json {
            std::fs::write(path, serde_json::to_string_pretty(&report.to_json())?)?;
        }
        return Ok(());
    }
    if args.prompt > 0 {
        let (cfg, dense_weights) = crate::engine::preset::load(&args.preset, args.seed)?;
        let mut rng = crate::engine::bench::Rng::new(args.seed ^ 0x9E1F);
        let prompt: Vec<u32> = (0..args.prompt)
            .map(|_| rng.next_u32() % cfg.vocab_size as u32)
            .collect();
        let reps = if device.is_cuda() { 10 } else { 1 };
        let new_decoder = |quant: &crate::engine::decode::QuantWeights| {
            let mut dec = crate::engine::Decoder::with_quant(
                &cfg,
                &dense_weights,
                quant,
                &device,
                args.prompt,
            )?;
            if let Some(chunk) = args.prefill_chunk {
                dec.set_prefill_chunk(chunk)?;
            }
            if let Some(tokens) = args.quant_gemv_tokens {
                dec.prefiller()?.set_quant_gemv_tokens(tokens);
            }
            anyhow::Ok(dec)
        };
        // Quantized weights (drawn first: a preset whose shapes the format cannot
        // hold fails before any timing): the bf16 prefill first, in the same process,
        // then the quantized model's (its matrices dequantized before each GEMM).
        let quant = weights.random_weights(&cfg, args.seed)?;
        if weights != bench::WeightFormat::Bf16 {
            let mut dense = new_decoder(&Default::default())?;
            let timing = crate::engine::prefill::time_prefill(&mut dense, &prompt, reps)?;
            super::write_stdout(&format!("bf16 {timing}\n"))?;
        }
        let mut dec = new_decoder(&quant)?;
        drop(quant);
        drop(dense_weights);
        let default = dec.prefiller()?.plan().clone();
        let timing = crate::engine::prefill::time_prefill(&mut dec, &prompt, reps)?;
        // A quantized run names both formats.
        let label = if weights == bench::WeightFormat::Bf16 {
            String::new()
        } else {
            format!("{weights} ")
        };
        super::write_stdout(&format!("{label}{timing}\n  tiles {default}\n"))?;
        // A chunk short enough for the multi-token GEMVs: the same prompt with every
        // matrix dequantized for the GEMMs, for comparison.
        let p = dec.prefiller()?;
        let (short, chunk) = (p.quant_gemv_tokens(), p.chunk());
        let last = args.prompt - (args.prompt.div_ceil(chunk) - 1) * chunk;
        if weights != bench::WeightFormat::Bf16 && short > 0 && last.min(chunk) <= short {
            p.set_quant_gemv_tokens(0);
            let timing = crate::engine::prefill::time_prefill(&mut dec, &prompt, reps)?;
            super::write_stdout(&format!(
                "{label}{timing}\n  every matrix dequantized for the GEMMs (multi-token GEMVs: chunks of up to {short} tokens above)\n"
            ))?;
            dec.prefiller()?.set_quant_gemv_tokens(short);
        }
        for spec in &args.prefill_tiles {
            let plan = default.with_tiles(spec)?;
            dec.prefiller()?.set_plan(plan.clone())?;
            let timing = crate::engine::prefill::time_prefill(&mut dec, &prompt, reps)?;
            super::write_stdout(&format!("{timing}\n  tiles {plan}\n"))?;
        }
        dec.prefiller()?.set_plan(default)?;
        if args.prefill_only {
            return Ok(());
        }
    }
    let opts = DecodeBenchOptions {
        preset: args.preset.clone(),
        weights,
        context: args.context,
        tokens: args.tokens,
        device,
        seed: args.seed,
        eager: !args.no_eager,
        graph,
        profile: args.profile,
        sweep: args.sweep,
        sampled: args.sampled,
        timeline,
        quant_tiles: args.quant_tiles.clone(),
    };
    // The bf16 baseline of a quantized run, timed first in the same process.
    let baseline = if weights == bench::WeightFormat::Bf16 {
        None
    } else {
        let report = bench::run(&DecodeBenchOptions {
            weights: bench::WeightFormat::Bf16,
            profile: false,
            sweep: false,
            sampled: false,
            timeline: None,
            quant_tiles: Vec::new(),
            ..opts.clone()
        })?;
        super::write_stdout(&format!("{report}\n"))?;
        Some(report)
    };
    let report = bench::run(&opts)?;
    super::write_stdout(&report.to_string())?;
    if let Some(base) = &baseline {
        super::write_stdout(&format!("\n{}\n", bench::report::compare(base, &report)))?;
    }
    if let Some(path) = &args.json {
        let modes: Vec<_> = report
            .modes
            .iter()
            .map(|m| {
                serde_json::json!({
                    "mode": m.mode,
                    "tokens_per_s": m.tokens_per_s,
                    "median_tokens_per_s": m.median_tokens_per_s(),
                    "stalled": m.stalled(),
                    "ms_per_token": m.ms_per_token,
                    "host_us_per_token": m.host_us_per_token,
                    "pct_of_floor": report.floor_ms().map(|f| 100.0 * f / m.ms_per_token),
                })
            })
            .collect();
        let blocks: Vec<_> = report
            .blocks
            .iter()
            .map(|b| serde_json::json!({"block": format!("{:?}", b.block), "launches": b.launches, "us": b.us, "in_step_us": b.in_step_us}))
            .collect();
        let json = serde_json::json!({
            "device": report.device,
            "preset": report.preset,
            "weights": report.weights.to_string(),
            "bf16_baseline": baseline.as_ref().map(|b| serde_json::json!({
                "weight_bytes": b.weight_bytes,
                "floor_ms": b.floor_ms(),
                "modes": b.modes.iter().map(|m| serde_json::json!({
                    "mode": m.mode,
                    "tokens_per_s": m.tokens_per_s,
                    "ms_per_token": m.ms_per_token,
                })).collect::<Vec<_>>(),
            })),
            "context": report.context,
            "tokens": report.tokens,
            "weight_bytes": report.weight_bytes,
            "kv_bytes": report.kv_bytes,
            "copy_bytes_per_s": report.copy_bytes_per_s,
            "floor_ms": report.floor_ms(),
            "kernels_per_step": report.kernels_per_step,
            "modes": modes,
            "blocks": blocks,
            "timeline": report.timeline.as_ref().map(|t| serde_json::json!({
                "layer": t.layer,
                "steps": t.steps,
                "clock_step_ns": t.clock_step_ns,
                "launches": t.rows.iter().map(|r| serde_json::json!({
                    "block": format!("{:?}", r.block),
                    "kernel": r.kernel,
                    "programs": r.programs,
                    "entry_us": [r.entry.0, r.entry.1],
                    "past_wait_us": [r.past_wait.0, r.past_wait.1, r.past_wait.2],
                    "exit_us": [r.exit.0, r.exit.1, r.exit.2],
                    "early": r.early,
                })).collect::<Vec<_>>(),
                // One step's stamps, ns from the layer's first entry: [entry, past wait,
                // exit, SM] a program, in linear program order.
                "sample": t.sample.launches.iter().map(|l| serde_json::json!({
                    "block": format!("{:?}", l.block),
                    "kernel": l.kernel,
                    "programs": l.programs.iter().map(|p| [p.entry, p.past_wait, p.exit, i64::from(p.sm)]).collect::<Vec<_>>(),
                })).collect::<Vec<_>>(),
            })),
        });
        std::fs::write(path, serde_json::to_string_pretty(&json)?)?;
    }
    Ok(())
}
