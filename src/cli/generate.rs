//! `tilefuse generate`: decode from a model directory (or a preset) and stream the
//! result.

use std::io::Write;
use std::ops::ControlFlow;
use std::path::PathBuf;

use anyhow::{bail, Context};
use clap::Args;

use crate::dsl::runtime::Device;
use crate::engine::{Engine, EngineOptions, GenerateOptions, Sampling};

/// Arguments of `tilefuse generate`.
#[derive(Debug, Args)]
pub struct GenerateArgs {
    /// A Hugging Face model directory (config.json, *.safetensors, tokenizer.json).
    #[arg(long, required_unless_present = "preset", conflicts_with = "preset")]
    pub model: Option<PathBuf>,
    /// A built-in preset with random weights instead of a directory (e.g. tiny-qwen3,
    /// qwen3-8b, llama-3.1-70b), or the path of a config.json to fill with random weights.
    #[arg(long)]
    pub preset: Option<String>,
    /// The prompt text (needs the model's tokenizer.json).
    #[arg(long, conflicts_with = "prompt_ids")]
    pub prompt: Option<String>,
    /// The prompt as comma-separated token ids.
    #[arg(long, value_delimiter = ',')]
    pub prompt_ids: Option<Vec<u32>>,
    /// Tokens to generate at most.
    #[arg(long, default_value_t = 64)]
    pub max_new_tokens: usize,
    /// `cpu` (the interpreter), `cuda` or `cuda:K`; default: the GPU if there is one.
    #[arg(long)]
    pub device: Option<String>,
    /// Write `{"prompt_ids", "tokens", "logits"}` as JSON to this file.
    #[arg(long)]
    pub logits_out: Option<PathBuf>,
    /// Sampling temperature; 0 (the default) is greedy.
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,
    /// Sample from the k most likely tokens only (0: all).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Sample from the smallest set of tokens reaching this probability.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Seed of the sampler (and of a preset's weights).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// KV-cache capacity; default: max_position_embeddings capped at 4096.
    #[arg(long)]
    pub max_seq_len: Option<usize>,
    /// Launch kernels one by one instead of replaying a CUDA graph per token
    /// (also: TILEFUSE_CUDA_GRAPH=0).
    #[arg(long)]
    pub no_graph: bool,
    /// Keep going after an end-of-sequence token.
    #[arg(long)]
    pub ignore_eos: bool,
    /// Split the model over this many GPUs (tensor parallelism; `--device cuda:K`
    /// starts at GPU K; with `--device cpu`, interpreter ranks). Needs NCCL for GPUs,
    /// except two that reach each other's memory (then the all-reduces read it
    /// directly; `TILEFUSE_ALLREDUCE=nccl` picks NCCL).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    pub tp: u16,
    /// Run the prompt through one decode step per token instead of the batched
    /// prefill (for bisecting).
    #[arg(long)]
    pub no_batched_prefill: bool,
}

/// Parses `cpu`, `cuda` or `cuda:K`; a GPU that is not there is an error.
pub fn parse_device(spec: Option<&str>) -> anyhow::Result<Device> {
    Ok(match spec {
        None => Device::auto(),
        Some("cpu") => Device::cpu(),
        Some("cuda") => Device::cuda(0)?,
        Some(s) => match s.strip_prefix("cuda:").map(str::parse::<usize>) {
            Some(Ok(k)) => Device::cuda(k)?,
            _ => bail!("--device {s}: expected cpu, cuda or cuda:K"),
        },
    })
}

/// Runs `tilefuse generate`.
pub fn run(args: &GenerateArgs) -> anyhow::Result<()> {
    let device = parse_device(args.device.as_deref())?;
    let opts = EngineOptions {
        device,
        max_seq_len: args.max_seq_len,
        cuda_graph: !args.no_graph && EngineOptions::default().cuda_graph,
        tp: usize::from(args.tp),
        progress: true,
    };
    let mut engine = match (&args.model, &args.preset) {
        (Some(dir), _) => Engine::load(dir, opts)?,
        (None, Some(name)) => Engine::from_preset(name, args.seed, opts)?,
        (None, None) => bail!("give --model DIR or --preset NAME"),
    };
    let prompt = match (&args.prompt, &args.prompt_ids) {
        (Some(text), _) => engine.encode(text)?,
        (None, Some(ids)) => ids.clone(),
        (None, None) => bail!("give --prompt TEXT or --prompt-ids 1,2,3"),
    };
    let gen = GenerateOptions {
        max_new_tokens: args.max_new_tokens,
        sampling: Sampling {
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
            seed: args.seed,
        },
        stop_at_eos: !args.ignore_eos,
        keep_logits: args.logits_out.is_some(),
        batched_prefill: !args.no_batched_prefill,
    };

    // Stream: text when there is a tokenizer (decode everything so far, print what is
    // new, so multi-token characters come out whole), token ids otherwise.
    let tokenizer = engine.tokenizer().cloned();
    let mut ids = Vec::new();
    let mut printed = String::new();
    let mut stdout = std::io::stdout();
    let mut failed = None;
    let out = engine.generate(&prompt, &gen, |token| {
        ids.push(token);
        let r = match &tokenizer {
            Some(t) => t.decode(&ids, true).map(|text| {
                let new = text
                    .strip_prefix(printed.as_str())
                    .unwrap_or(&text)
                    .to_string();
                printed = text;
                new
            }),
            None => Ok(format!("{token} ")),
        };
        match r {
            Ok(s) => {
                let _ = write!(stdout, "{s}");
                let _ = stdout.flush();
                ControlFlow::Continue(())
            }
            Err(e) => {
                failed = Some(e);
                ControlFlow::Break(())
            }
        }
    })?;
    let _ = writeln!(stdout);
    if let Some(e) = failed {
        return Err(e.into());
    }
    if let Some(path) = &args.logits_out {
        let json = serde_json::json!({
            "prompt_ids": out.prompt_ids,
            "tokens": out.tokens,
            "logits": out.logits,
        });
        std::fs::write(path, serde_json::to_vec(&json)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    let sampled = if args.temperature > 0.0 {
        format!(
            ", {} of {} tokens drawn on the host",
            out.host_draws,
            out.tokens.len()
        )
    } else {
        String::new()
    };
    eprintln!(
        "{} prompt tokens in {:.1} ms ({:.0} tokens/s, {}), time to first token {:.1} ms, \
         {} new tokens, {:.1} tokens/s, {:.3} ms/token, device {}, {}{sampled}",
        out.prompt_ids.len(),
        out.prompt_time.as_secs_f64() * 1e3,
        out.prompt_tokens_per_s(),
        if out.batched_prefill {
            "batched prefill"
        } else {
            "token by token"
        },
        out.first_token_time.as_secs_f64() * 1e3,
        out.tokens.len(),
        out.tokens_per_s(),
        out.ms_per_token(),
        engine.device_name(),
        if out.used_graph {
            "CUDA graph per token"
        } else {
            "eager launches"
        }
    );
    Ok(())
}
