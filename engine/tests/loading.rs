//! Checkpoint loading: dtype conversion, shards, presets written out and read
//! back, and every bad input turning into an error that names its culprit.

use std::path::{Path, PathBuf};

use half::{bf16, f16};
use safetensors::tensor::{Dtype, TensorView};
use serde_json::json;
use tilefuse_engine::model::write_checkpoint;
use tilefuse_engine::preset;
use tilefuse_engine::{Checkpoint, EngineError, ModelConfig, ModelWeights, Reference, Weights};

/// A fresh, empty scratch directory for one test.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tilefuse-engine-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// A tensor to write: name, dtype, shape, little-endian bytes.
type Raw = (String, Dtype, Vec<usize>, Vec<u8>);

fn bf16_bytes(v: &[bf16]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

fn write_safetensors(path: &Path, tensors: &[Raw]) {
    let views: Vec<(String, TensorView<'_>)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    safetensors::serialize_to_file(views, None, path).unwrap();
}

/// The tensors of `w` as bf16 safetensors entries.
fn raw_tensors(cfg: &ModelConfig, w: &ModelWeights<'_>) -> Vec<Raw> {
    w.named_tensors(cfg)
        .into_iter()
        .map(|(n, s, t)| (n, Dtype::BF16, s, bf16_bytes(t)))
        .collect()
}

/// A transformers-style config.json for `cfg`.
fn config_json(cfg: &ModelConfig) -> serde_json::Value {
    cfg.to_hf_json()
}

/// Writes preset `name` as a checkpoint directory; returns its config.
fn write_preset(dir: &Path, name: &str) -> ModelConfig {
    let (cfg, w) = preset::load(name, 7).unwrap();
    write_checkpoint(dir, &cfg, &w).unwrap();
    cfg
}

fn logits_of(cfg: &ModelConfig, w: ModelWeights<'_>, tokens: &[u32]) -> Vec<f32> {
    let mut r = Reference::new(cfg.clone(), w).unwrap();
    let mut out = Vec::new();
    for (p, &t) in tokens.iter().enumerate() {
        out = r.forward(t, p).unwrap();
    }
    out
}

#[test]
fn preset_written_and_loaded_gives_same_logits() {
    // tiny-qwen2 covers biases and an untied head, tiny-qwen3 QK-norm and
    // tying, tiny-llama3 rope scaling.
    for name in ["tiny-qwen2", "tiny-qwen3", "tiny-llama3"] {
        let dir = scratch(&format!("roundtrip-{name}"));
        let cfg = write_preset(&dir, name);
        let ckpt = Checkpoint::open(&dir).unwrap();
        assert_eq!(ckpt.config, cfg);
        let loaded = ckpt.model_weights().unwrap();
        // bf16 tensors are borrowed from the memory map, not copied.
        assert!(matches!(loaded.embed_tokens, std::borrow::Cow::Borrowed(_)));
        let (_, mem) = preset::load(name, 7).unwrap();
        let toks = [1, 5, 9, 200];
        assert_eq!(
            logits_of(&ckpt.config, loaded, &toks),
            logits_of(&cfg, mem, &toks)
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}

#[test]
fn sharded_checkpoint_loads_like_a_single_file() {
    let dir = scratch("sharded");
    let (cfg, w) = preset::load("tiny-qwen3", 7).unwrap();
    std::fs::write(dir.join("config.json"), config_json(&cfg).to_string()).unwrap();
    let raw = raw_tensors(&cfg, &w);
    let (a, b) = raw.split_at(raw.len() / 2);
    let files = [
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
    ];
    write_safetensors(&dir.join(files[0]), a);
    write_safetensors(&dir.join(files[1]), b);
    let mut map = serde_json::Map::new();
    for (part, file) in [(a, files[0]), (b, files[1])] {
        for (n, ..) in part {
            map.insert(n.clone(), json!(file));
        }
    }
    let index = json!({"metadata": {"total_size": 0}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();

    let ckpt = Checkpoint::open(&dir).unwrap();
    let name = "model.layers.1.mlp.up_proj.weight";
    assert_eq!(
        ckpt.weights.file_of(name).unwrap().file_name().unwrap(),
        files[1]
    );
    assert_eq!(ckpt.weights.names().len(), raw.len());
    let toks = [3, 1, 4, 1, 5];
    assert_eq!(
        logits_of(&ckpt.config, ckpt.model_weights().unwrap(), &toks),
        logits_of(&cfg, w.clone(), &toks)
    );

    // The index promises a tensor that no shard holds.
    map.insert("model.extra.weight".into(), json!(files[0]));
    let index = json!({"weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).unwrap();
    let e = Weights::from_dir(&dir).unwrap_err().to_string();
    assert!(
        e.contains("model.extra.weight") && e.contains(files[0]),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn f16_and_f32_convert_to_bf16() {
    let dir = scratch("dtypes");
    let vals = [0.0f32, 1.0, -2.5, 0.1, 3.0e4, -1.0e-3];
    let f32_bytes: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
    let f16_bytes: Vec<u8> = vals
        .iter()
        .flat_map(|v| f16::from_f32(*v).to_le_bytes())
        .collect();
    let i64_bytes = vec![0u8; 8 * 6];
    let path = dir.join("model.safetensors");
    write_safetensors(
        &path,
        &[
            ("a".into(), Dtype::F32, vec![2, 3], f32_bytes),
            ("b".into(), Dtype::F16, vec![6], f16_bytes),
            ("c".into(), Dtype::I64, vec![6], i64_bytes),
        ],
    );
    let w = Weights::from_dir(&dir).unwrap();
    let want: Vec<bf16> = vals.iter().map(|v| bf16::from_f32(*v)).collect();
    assert_eq!(&*w.tensor_bf16("a", &[2, 3]).unwrap(), &want[..]);
    let b = w.tensor_bf16("b", &[6]).unwrap();
    for (got, v) in b.iter().zip(vals) {
        assert_eq!(*got, bf16::from_f32(f16::from_f32(v).to_f32()));
    }
    let e = w.tensor_bf16("c", &[6]).unwrap_err().to_string();
    assert!(
        e.contains("`c`") && e.contains("I64") && e.contains("model.safetensors"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn missing_and_malformed_files_are_named() {
    let dir = scratch("files");
    let e = Checkpoint::open(&dir).unwrap_err();
    assert!(matches!(e, EngineError::Io { .. }));
    assert!(e.to_string().contains("config.json"), "{e}");

    std::fs::write(
        dir.join("config.json"),
        "{\"architectures\": [\"Qwen3ForCausalLM\",",
    )
    .unwrap();
    let e = Checkpoint::open(&dir).unwrap_err().to_string();
    assert!(
        e.contains("config.json") && e.contains("malformed JSON"),
        "{e}"
    );

    std::fs::write(
        dir.join("config.json"),
        json!({"architectures": ["MambaForCausalLM"]}).to_string(),
    )
    .unwrap();
    let e = Checkpoint::open(&dir).unwrap_err().to_string();
    assert!(
        e.contains("config.json") && e.contains("MambaForCausalLM"),
        "{e}"
    );

    // A valid config but no weights.
    let cfg = preset::config("tiny-qwen3").unwrap();
    std::fs::write(dir.join("config.json"), config_json(&cfg).to_string()).unwrap();
    let e = Checkpoint::open(&dir).unwrap_err().to_string();
    assert!(e.contains("model.safetensors"), "{e}");

    // Not a safetensors file.
    std::fs::write(dir.join("model.safetensors"), b"definitely not safetensors").unwrap();
    let e = Checkpoint::open(&dir).unwrap_err().to_string();
    assert!(
        e.contains("model.safetensors") && e.contains("invalid safetensors"),
        "{e}"
    );

    // Malformed generation_config.json.
    write_preset(&dir, "tiny-qwen3");
    std::fs::write(dir.join("generation_config.json"), "{eos}").unwrap();
    let e = Checkpoint::open(&dir).unwrap_err().to_string();
    assert!(
        e.contains("generation_config.json") && e.contains("malformed JSON"),
        "{e}"
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

/// A config whose sizes no checkpoint could hold (a corrupt or hostile config.json) is
/// an error naming what is missing, not an allocation of its size.
#[test]
fn impossible_config_sizes_are_errors() {
    let dir = scratch("huge");
    let (cfg, w) = preset::load("tiny-qwen3", 7).unwrap();
    write_safetensors(&dir.join("model.safetensors"), &raw_tensors(&cfg, &w));
    let huge = 1u64 << 40;
    for (key, want) in [
        // The first layer the checkpoint lacks is named.
        ("num_hidden_layers", "model.layers.2.".to_string()),
        // A tensor is named with the shape the config expected.
        ("hidden_size", format!("expected [{huge}]")),
        ("intermediate_size", format!("expected [{huge}, ")),
        ("vocab_size", format!("expected [{huge}, ")),
    ] {
        let value = huge;
        let mut json = config_json(&cfg);
        json[key] = json!(value);
        std::fs::write(dir.join("config.json"), json.to_string()).unwrap();
        let e = match Checkpoint::open(&dir).and_then(|c| c.model_weights().map(|_| ())) {
            Ok(()) => panic!("{key} = {value}: loaded"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(&want), "{key} = {value}: {e}");
    }
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn missing_tensor_and_wrong_shape_are_named() {
    let dir = scratch("tensors");
    let (cfg, w) = preset::load("tiny-qwen2", 7).unwrap();
    std::fs::write(dir.join("config.json"), config_json(&cfg).to_string()).unwrap();
    let raw = raw_tensors(&cfg, &w);

    let without: Vec<Raw> = raw
        .iter()
        .filter(|t| t.0 != "model.layers.1.self_attn.k_proj.bias")
        .cloned()
        .collect();
    write_safetensors(&dir.join("model.safetensors"), &without);
    let ckpt = Checkpoint::open(&dir).unwrap();
    let e = ckpt.model_weights().unwrap_err();
    assert!(matches!(e, EngineError::MissingTensor { .. }));
    assert!(
        e.to_string()
            .contains("model.layers.1.self_attn.k_proj.bias"),
        "{e}"
    );

    // Untied config but no lm_head.weight.
    let without: Vec<Raw> = raw
        .iter()
        .filter(|t| t.0 != "lm_head.weight")
        .cloned()
        .collect();
    write_safetensors(&dir.join("model.safetensors"), &without);
    let e = Checkpoint::open(&dir)
        .unwrap()
        .model_weights()
        .unwrap_err()
        .to_string();
    assert!(e.contains("lm_head.weight"), "{e}");

    // down_proj stored transposed: [intermediate, hidden] instead of [hidden, intermediate].
    let (h, qd) = (cfg.hidden_size, cfg.intermediate_size);
    assert_ne!(h, qd);
    let bad: Vec<Raw> = raw
        .iter()
        .map(|t| {
            let mut t = t.clone();
            if t.0 == "model.layers.0.mlp.down_proj.weight" {
                t.2 = vec![qd, h];
            }
            t
        })
        .collect();
    write_safetensors(&dir.join("model.safetensors"), &bad);
    let e = Checkpoint::open(&dir)
        .unwrap()
        .model_weights()
        .unwrap_err()
        .to_string();
    assert!(e.contains("model.layers.0.mlp.down_proj.weight"), "{e}");
    assert!(
        e.contains(&format!("expected [{h}, {qd}]")) && e.contains(&format!("shape [{qd}, {h}]")),
        "{e}"
    );
    assert!(e.contains("model.safetensors"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn reference_rejects_bad_tokens_positions_and_weights() {
    let (cfg, w) = preset::load("tiny-llama3", 1).unwrap();
    let mut r = Reference::new(cfg.clone(), w.clone()).unwrap();
    let e = r.forward(cfg.vocab_size as u32, 0).unwrap_err().to_string();
    assert!(e.contains(&cfg.vocab_size.to_string()), "{e}");
    let e = r.forward(1, 3).unwrap_err().to_string();
    assert!(e.contains("position 3"), "{e}");

    // Re-decoding an earlier position cuts the cache back.
    let a = r.forward(1, 0).unwrap();
    r.forward(2, 1).unwrap();
    assert_eq!(r.forward(1, 0).unwrap(), a);
    assert_eq!(r.cached_len(), 1);

    let mut short = w.clone();
    short.layers[1].up_proj = short.layers[1].up_proj[1..].to_vec().into();
    let e = Reference::new(cfg.clone(), short).unwrap_err().to_string();
    assert!(e.contains("model.layers.1.mlp.up_proj.weight"), "{e}");
    let mut extra = w;
    extra.layers[0].q_bias = Some(vec![bf16::ZERO; cfg.q_dim()].into());
    let e = Reference::new(cfg, extra).unwrap_err().to_string();
    assert!(e.contains("model.layers.0.self_attn.q_proj.bias"), "{e}");
}

#[test]
fn presets_have_real_shapes_and_are_seeded() {
    let q = preset::config("qwen3-0.6b").unwrap();
    assert_eq!(
        (
            q.hidden_size,
            q.num_layers,
            q.num_heads,
            q.num_kv_heads,
            q.head_dim
        ),
        (1024, 28, 16, 8, 128)
    );
    assert_eq!((q.intermediate_size, q.vocab_size), (3072, 151936));
    assert!(q.tie_word_embeddings && q.qk_norm);
    let l = preset::config("llama-3.2-1b").unwrap();
    assert_eq!(
        (
            l.hidden_size,
            l.num_layers,
            l.num_heads,
            l.num_kv_heads,
            l.head_dim
        ),
        (2048, 16, 32, 8, 64)
    );
    assert_eq!(
        (l.intermediate_size, l.vocab_size, l.rms_norm_eps),
        (8192, 128256, 1e-5)
    );
    let e = preset::config("gpt-5").unwrap_err().to_string();
    assert!(e.contains("gpt-5") && e.contains("qwen3-0.6b"), "{e}");

    for name in ["tiny-qwen3", "tiny-qwen2", "tiny-llama3"] {
        let (cfg, w) = preset::load(name, 42).unwrap();
        let (_, same) = preset::load(name, 42).unwrap();
        let (_, other) = preset::load(name, 43).unwrap();
        assert_eq!(w.embed_tokens, same.embed_tokens);
        assert_ne!(w.embed_tokens, other.embed_tokens);
        // Realistic scale: logits finite, spread but not huge, over a few steps.
        let mut r = Reference::new(cfg.clone(), w).unwrap();
        let out = r.generate_greedy(&[1, 2, 3], 4).unwrap();
        assert!(!out.is_empty());
        let logits = r.forward(5, r.cached_len()).unwrap();
        let max = logits.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        assert!(
            logits.iter().all(|x| x.is_finite()) && max > 1e-3 && max < 50.0,
            "{name}: max |logit| {max}"
        );
    }
}

/// Full-size presets: random weights at real shapes, a few decode steps.
/// Slow in debug; run with `cargo test -p tilefuse-engine --release -- --ignored`.
#[test]
#[ignore]
fn real_presets_decode() {
    for name in ["qwen3-0.6b", "llama-3.2-1b"] {
        let t = std::time::Instant::now();
        let (cfg, w) = preset::load(name, 0).unwrap();
        let gen = t.elapsed();
        let params: usize = w.named_tensors(&cfg).iter().map(|(_, _, t)| t.len()).sum();
        let mut r = Reference::new(cfg, w).unwrap();
        let t = std::time::Instant::now();
        let out = r.generate_greedy(&[1, 2, 3], 3).unwrap();
        let logits = r.forward(out[0], r.cached_len()).unwrap();
        let max = logits.iter().fold(0.0f32, |m, x| m.max(x.abs()));
        eprintln!(
            "{name}: {:.0}M params, weights in {gen:.1?}, 6 decode steps in {:.1?}, max |logit| {max:.2}",
            params as f64 / 1e6,
            t.elapsed()
        );
        assert!(logits.iter().all(|x| x.is_finite()) && max < 50.0);
    }
}
