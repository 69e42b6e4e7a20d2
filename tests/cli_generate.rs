//! `tilefuse generate` and `tilefuse bench` as a user runs them (on the interpreter).

use std::process::Command;

fn tilefuse(args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_tilefuse"))
        .args(args)
        .env("TILEFUSE_DEVICE", "cpu")
        .output()
        .expect("run tilefuse")
}

#[test]
fn generate_writes_tokens_and_logits_json() {
    let dir = std::env::temp_dir().join(format!("tilefuse-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let logits = dir.join("logits.json");
    let out = tilefuse(&[
        "generate",
        "--preset",
        "tiny-qwen3",
        "--prompt-ids",
        "5,6,7",
        "--max-new-tokens",
        "4",
        "--ignore-eos",
        "--device",
        "cpu",
        "--logits-out",
        logits.to_str().unwrap(),
    ]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("tokens/s"), "summary line: {stderr}");
    let printed: Vec<u32> = String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .map(|t| t.parse().unwrap())
        .collect();
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(&logits).unwrap()).unwrap();
    let tokens: Vec<u32> = json["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap() as u32)
        .collect();
    assert_eq!(printed, tokens);
    assert_eq!(json["prompt_ids"], serde_json::json!([5, 6, 7]));
    let rows = json["logits"].as_array().unwrap();
    assert_eq!(rows.len(), 4);
    for (row, &t) in rows.iter().zip(&tokens) {
        let row: Vec<f64> = row
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        assert_eq!(row.len(), 1000);
        let best = (0..row.len()).fold(0, |b, i| if row[i] > row[b] { i } else { b });
        assert_eq!(
            best as u32, t,
            "greedy token is the argmax of its logits row"
        );
    }
}

/// Runs `tilefuse generate` with `args` after the preset; it must fail, without a panic,
/// with a message naming `needle`.
fn generate_fails_with(args: &[&str], needle: &str) {
    let mut all = vec!["generate", "--preset", "tiny-qwen3"];
    all.extend_from_slice(args);
    let out = tilefuse(&all);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{all:?} succeeded");
    assert!(
        err.contains(needle) && !err.contains("panicked"),
        "{all:?}: {err}"
    );
}

#[test]
fn bad_arguments_are_clear_errors() {
    generate_fails_with(&["--prompt-ids", "5,99999", "--device", "cpu"], "99999");
    // A preset has no tokenizer: text prompts need one.
    generate_fails_with(&["--prompt", "hi", "--device", "cpu"], "tokenizer");
    generate_fails_with(&["--prompt-ids", "1", "--device", "tpu"], "--device tpu");
    if !tilefuse::dsl::runtime::cuda_available() {
        generate_fails_with(&["--prompt-ids", "1", "--device", "cuda"], "CUDA");
    }
    let out = tilefuse(&[
        "generate",
        "--model",
        "/nonexistent/dir",
        "--prompt-ids",
        "1",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/dir"));
    // A quantized step's timeline lists each launch, its quantizers and GEMVs apart.
    let out = tilefuse(&[
        "bench",
        "--preset",
        "tiny-qwen3",
        "--weights",
        "q8_0",
        "--timeline",
        "--device",
        "cpu",
        "--tokens",
        "2",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains("timeline of layer")
            && text.contains("quantize_act")
            && text.contains("q8_0_gemv"),
        "{text}"
    );
}

#[test]
fn bench_runs_on_the_interpreter() {
    let out = tilefuse(&[
        "bench",
        "--preset",
        "tiny-qwen3",
        "--context",
        "8",
        "--tokens",
        "4",
        "--device",
        "cpu",
        "--sampled",
        "--prompt",
        "12",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("tokens/s") && text.contains("eager"),
        "{text}"
    );
    // The sampled row: a positive rate.
    let row = text
        .lines()
        .find(|l| l.starts_with("sampled"))
        .unwrap_or_else(|| panic!("no sampled row: {text}"));
    let rate: f64 = row.split_whitespace().nth(1).unwrap().parse().unwrap();
    assert!(rate > 0.0, "{row}");
    // `--prompt`: the batched prefill's time to first token.
    assert!(
        text.lines().any(|l| l.starts_with("prefill")
            && l.contains("12 tokens")
            && l.contains("time to first token")),
        "{text}"
    );
}

/// `bench --weights q8_0 --prompt N`: the quantized model's batched prefill (its
/// matrices dequantized before each GEMM: one more launch a matrix and layer) after
/// the bf16 one, in the same process.
#[test]
fn bench_times_a_quantized_models_prefill_beside_bf16() {
    let out = tilefuse(&[
        "bench",
        "--preset",
        "tiny-qwen3",
        "--weights",
        "q8_0",
        "--prompt",
        "12",
        "--prefill-only",
        "--device",
        "cpu",
    ]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let launches = |label: &str| -> usize {
        let line = text
            .lines()
            .find(|l| l.starts_with(label) && l.contains("12 tokens"))
            .unwrap_or_else(|| panic!("no `{label}` line: {text}"));
        let (_, rest) = line.split_once('(').unwrap();
        rest.split_whitespace().next().unwrap().parse().unwrap()
    };
    let layers = tilefuse::engine::preset::config("tiny-qwen3")
        .unwrap()
        .num_layers;
    assert_eq!(
        launches("q8_0 prefill"),
        launches("bf16 prefill") + 4 * layers
    );
}

#[test]
fn generate_reports_the_prompt_path_and_time_to_first_token() {
    for (flag, path) in [
        (None, "batched prefill"),
        (Some("--no-batched-prefill"), "token by token"),
    ] {
        let mut args = vec![
            "generate",
            "--preset",
            "tiny-qwen3",
            "--prompt-ids",
            "5,6,7,8,9",
            "--max-new-tokens",
            "2",
            "--device",
            "cpu",
        ];
        args.extend(flag);
        let out = tilefuse(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{stderr}");
        assert!(
            stderr.contains("5 prompt tokens")
                && stderr.contains(path)
                && stderr.contains("time to first token"),
            "{flag:?}: summary line: {stderr}"
        );
    }
}

/// `--tp 2` on interpreter ranks: `bench` reports both runs and their agreement,
/// `generate` decodes the one-device tokens.
#[test]
fn split_bench_and_generate_run_on_the_interpreter() {
    let out = tilefuse(&[
        "bench",
        "--tp",
        "2",
        "--preset",
        "tiny-qwen3",
        "--context",
        "3",
        "--tokens",
        "2",
        "--check-tokens",
        "4",
        "--device",
        "cpu",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("tp 1: eager")
            && text.contains("tp 2 host: eager")
            && text.contains("speed-up over tp 1")
            && text.contains("5 of 5 equal"),
        "{text}"
    );
    let tokens = |tp: &str| {
        let out = tilefuse(&[
            "generate",
            "--preset",
            "tiny-qwen3",
            "--device",
            "cpu",
            "--tp",
            tp,
            "--prompt-ids",
            "1,2,3",
            "--max-new-tokens",
            "6",
            "--ignore-eos",
        ]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    };
    let one = tokens("1");
    assert_eq!(one.split_whitespace().count(), 6, "{one}");
    assert_eq!(tokens("2"), one);
}
