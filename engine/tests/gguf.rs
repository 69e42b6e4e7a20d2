//! The GGUF reader and the Q8_0 / Q3_K / Q4_K / Q5_K / Q6_K / Q4_0 / Q5_0 / IQ4_NL / Q4_1 /
//! Q5_1 dequantizers against llama.cpp's `gguf` Python package (`tests/fixtures/gguf/`, made by `scripts/make_gguf_fixtures.py`),
//! and malformed files: every one an error naming what is wrong, never a panic.

mod common;

use std::path::{Path, PathBuf};

use tilefuse_engine::gguf::quant::{self, GgmlType, PackedMatrix};
use tilefuse_engine::gguf::{self, GgufFile, MetaValue};
use tilefuse_engine::{Arch, EngineError, RopeScaling};

fn fixture(name: &str) -> PathBuf {
    common::fixtures_dir().join("gguf").join(name)
}

/// The tiny fixture, its config and its quantized matrices, the Q6_K head included
/// (whatever `quant::head_reads_quantized` says for `Engine::load`).
fn tiny_quant_weights() -> (
    GgufFile,
    tilefuse_engine::ModelConfig,
    tilefuse_engine::decode::QuantWeights,
) {
    let f = GgufFile::open(fixture("tiny_qwen3.gguf")).unwrap();
    let cfg = f.config().unwrap();
    let mut qw = f.quant_weights(&cfg).unwrap();
    qw.lm_head = f
        .packed_matrix("lm_head.weight", cfg.vocab_size, cfg.hidden_size, &cfg)
        .unwrap();
    (f, cfg, qw)
}

/// The interpreter, and the GPU when there is one (`gpu_or_skip`: required where
/// `TILEFUSE_REQUIRE_GPU` is set), for test `test`.
fn cpu_and_gpu(test: &str) -> Vec<tilefuse_dsl::runtime::Device> {
    let mut devices = vec![tilefuse_dsl::runtime::Device::cpu()];
    devices.extend(tilefuse_dsl::runtime::testing::gpu_or_skip(test));
    devices
}

/// What `scripts/make_gguf_fixtures.py` recorded for model fixture `name`
/// (`tiny_qwen3`, `tiny_qwen2`, `tiny_qwen3_q5_k`, `tiny_qwen3_q3_k`, `tiny_qwen3_q4_0`).
fn expected_model(name: &str) -> serde_json::Value {
    let path = fixture(&format!("{name}.json"));
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

#[test]
fn dequantizes_blocks_like_the_gguf_package() {
    let f = GgufFile::open(fixture("blocks.gguf")).unwrap();
    for (name, ty) in [
        ("q8_0", GgmlType::Q8_0),
        ("q3_k", GgmlType::Q3_K),
        ("q4_k", GgmlType::Q4_K),
        ("q5_k", GgmlType::Q5_K),
        ("q6_k", GgmlType::Q6_K),
        ("q4_0", GgmlType::Q4_0),
        ("q5_0", GgmlType::Q5_0),
        ("iq4_nl", GgmlType::IQ4_NL),
        ("iq4_xs", GgmlType::IQ4_XS),
        ("q4_1", GgmlType::Q4_1),
        ("q5_1", GgmlType::Q5_1),
    ] {
        let blocks = f.tensor(&format!("{name}.blocks")).unwrap();
        let expected = f.tensor(&format!("{name}.expected")).unwrap();
        assert_eq!(blocks.ggml_type, ty);
        assert_eq!(expected.ggml_type, GgmlType::F32);
        assert_eq!(blocks.ne, expected.ne);
        let want = quant::dequantize(
            GgmlType::F32,
            f.tensor_bytes(expected),
            expected.numel() as usize,
            "expected",
        )
        .unwrap();
        let got =
            quant::dequantize(ty, f.tensor_bytes(blocks), blocks.numel() as usize, name).unwrap();
        // Bit for bit: the same f32 operations in the same order as the package.
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.to_bits(), w.to_bits(), "{name} element {i}: {g} vs {w}");
        }
        // The extreme scales are there: the largest f16 makes some values huge.
        assert!(
            want.iter().any(|v| v.abs() > 1e5),
            "{name}: no extreme block"
        );
        // The device layout dequantizes to the same values (IQ4_NL in Q8_0's, Q4_0 and
        // Q5_0 in Q8_0's or, in rows of 256, in nibble words): the file's rows, and the
        // same blocks as rows of 256 where they make whole rows.
        let (rows, cols) = (blocks.ne[1] as usize, blocks.ne[0] as usize);
        let mut shapes = vec![(rows, cols)];
        if cols % 256 != 0 && (rows * cols) % 256 == 0 {
            shapes.push((rows * cols / 256, 256));
        }
        for (rows, cols) in shapes {
            let packed = PackedMatrix::pack(ty, f.tensor_bytes(blocks), rows, cols, name).unwrap();
            assert_eq!(packed.ggml_type(), ty.device_type(cols));
            let from_packed = packed.dequantize();
            for (i, (g, w)) in from_packed.iter().zip(&want).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    w.to_bits(),
                    "{name} packed as [{rows}, {cols}], element {i}: {g} vs {w}"
                );
            }
        }
    }
}

#[test]
fn reads_the_tiny_model_config() {
    let f = GgufFile::open(fixture("tiny_qwen3.gguf")).unwrap();
    assert_eq!(f.version, 3);
    assert_eq!(f.alignment, 32);
    let cfg = f.config().unwrap();
    let e = &expected_model("tiny_qwen3")["config"];
    assert_eq!(cfg.arch, Arch::Qwen3);
    assert_eq!(cfg.hidden_size, e["hidden_size"].as_u64().unwrap() as usize);
    assert_eq!(cfg.num_layers, e["num_layers"].as_u64().unwrap() as usize);
    assert_eq!(cfg.num_heads, e["num_heads"].as_u64().unwrap() as usize);
    assert_eq!(
        cfg.num_kv_heads,
        e["num_kv_heads"].as_u64().unwrap() as usize
    );
    assert_eq!(cfg.head_dim, e["head_dim"].as_u64().unwrap() as usize);
    assert_eq!(
        cfg.intermediate_size,
        e["intermediate_size"].as_u64().unwrap() as usize
    );
    assert_eq!(cfg.vocab_size, e["vocab_size"].as_u64().unwrap() as usize);
    assert!((cfg.rms_norm_eps - e["rms_norm_eps"].as_f64().unwrap()).abs() < 1e-12);
    assert_eq!(cfg.rope_theta, e["rope_theta"].as_f64().unwrap());
    assert_eq!(cfg.rope_scaling, RopeScaling::None);
    assert_eq!(
        cfg.max_position_embeddings,
        e["max_position_embeddings"].as_u64().unwrap() as usize
    );
    assert!(!cfg.tie_word_embeddings);
    assert!(cfg.qk_norm && !cfg.qkv_bias && !cfg.o_bias);
    assert_eq!(cfg.bos_token_id, Some(1));
    assert_eq!(cfg.eos_token_ids, vec![0]);
    // Metadata arrays come through whole.
    let tokens = f.get("tokenizer.ggml.tokens").unwrap().as_array().unwrap();
    assert_eq!(tokens.len(), cfg.vocab_size);
    assert_eq!(tokens[0], MetaValue::String("<|endoftext|>".into()));
}

/// A Qwen2.5-0.5B-like file: rows that are no multiple of 256 (Q5_0, Q8_0, Q4_0 as
/// llama.cpp's Q4_K_M stores them), q/k/v biases, tied embeddings and no
/// `attention.key_length` (the head size from the hidden size and the heads).
#[test]
fn reads_a_qwen2_model_with_rows_no_k_quant_fits() {
    let f = GgufFile::open(fixture("tiny_qwen2.gguf")).unwrap();
    let cfg = f.config().unwrap();
    let e = &expected_model("tiny_qwen2")["config"];
    assert_eq!(cfg.arch, Arch::Qwen2);
    for (got, key) in [
        (cfg.hidden_size, "hidden_size"),
        (cfg.num_layers, "num_layers"),
        (cfg.num_heads, "num_heads"),
        (cfg.num_kv_heads, "num_kv_heads"),
        (cfg.head_dim, "head_dim"),
        (cfg.intermediate_size, "intermediate_size"),
        (cfg.vocab_size, "vocab_size"),
        (cfg.max_position_embeddings, "max_position_embeddings"),
    ] {
        assert_eq!(got, e[key].as_u64().unwrap() as usize, "{key}");
    }
    assert_ne!(cfg.hidden_size % 256, 0);
    assert!(cfg.tie_word_embeddings && cfg.qkv_bias && !cfg.o_bias && !cfg.qk_norm);
    check_every_tensor(&f, "tiny_qwen2");
    // The tied head is the Q5_0 table, read as Q8_0 by the step.
    let qw = f.quant_weights(&cfg).unwrap();
    let head = qw.lm_head.as_ref().expect("a Q5_0 head is read quantized");
    assert_eq!(head.ggml_type(), GgmlType::Q8_0);
    assert_eq!(head.shape(), (cfg.vocab_size, cfg.hidden_size));
    let types: Vec<(String, GgmlType)> = f.matrix_types();
    for (name, ty) in [
        ("token_embd.weight", GgmlType::Q5_0),
        ("blk.0.attn_output.weight", GgmlType::Q4_0),
        ("blk.0.attn_v.weight", GgmlType::Q8_0),
        ("blk.0.ffn_down.weight", GgmlType::Q6_K),
    ] {
        assert!(types.contains(&(name.to_string(), ty)), "{name}: {types:?}");
    }
}

#[test]
fn reads_every_tensor_of_the_tiny_model() {
    let f = GgufFile::open(fixture("tiny_qwen3.gguf")).unwrap();
    check_every_tensor(&f, "tiny_qwen3");
}

/// A Q5_K_M-like file (`tiny_qwen3_q5_k.gguf`): every tensor against the package's
/// values, the Q5_K matrices read quantized as Q5_K (the Q4_K kernel's `Q5` variants),
/// the Q6_K ones beside them, and the Q5_K embedding table dequantized for lookups.
#[test]
fn reads_a_q5_k_m_model() {
    let f = GgufFile::open(fixture("tiny_qwen3_q5_k.gguf")).unwrap();
    check_every_tensor(&f, "tiny_qwen3_q5_k");
    let cfg = f.config().unwrap();
    assert_eq!(cfg.num_layers, 2);
    let qw = f.quant_weights(&cfg).unwrap();
    let l = &qw.layers[1];
    for m in [&l.q, &l.k, &l.o, &l.gate, &l.up, &l.down] {
        assert_eq!(m.as_ref().unwrap().ggml_type(), GgmlType::Q5_K);
    }
    assert_eq!(l.v.as_ref().unwrap().ggml_type(), GgmlType::Q6_K);
    let down0 = qw.layers[0].down.as_ref().unwrap();
    assert_eq!(down0.ggml_type(), GgmlType::Q6_K);
    // 180 bytes a super-block: Q4_K's 148 and a word of fifth bits a sub-block.
    let q = l.q.as_ref().unwrap();
    assert_eq!(q.device_bytes(), q.shape().0 * q.shape().1 / 256 * 180);
    let types = f.matrix_types();
    assert!(types.contains(&("token_embd.weight".to_string(), GgmlType::Q5_K)));
}

/// A Q3_K_M-like file (`tiny_qwen3_q3_k.gguf`): every tensor against the package's
/// values, the Q3_K matrices in their own layout at 130 bytes a super-block, with Q4_K O,
/// Q5_K and Q4_K v and down beside them, and the Q3_K embedding table dequantized for
/// lookups.
#[test]
fn reads_a_q3_k_m_model() {
    let f = GgufFile::open(fixture("tiny_qwen3_q3_k.gguf")).unwrap();
    check_every_tensor(&f, "tiny_qwen3_q3_k");
    let cfg = f.config().unwrap();
    let qw = f.quant_weights(&cfg).unwrap();
    let ty = |m: &Option<PackedMatrix>| m.as_ref().unwrap().ggml_type();
    for (i, l) in qw.layers.iter().enumerate() {
        for m in [&l.q, &l.k, &l.gate, &l.up] {
            assert_eq!(ty(m), GgmlType::Q3_K);
        }
        assert_eq!(ty(&l.o), GgmlType::Q4_K);
        let first = [GgmlType::Q5_K, GgmlType::Q4_K][i];
        assert_eq!((ty(&l.v), ty(&l.down)), (first, first), "layer {i}");
    }
    // 130 bytes a super-block: the file's 110 in whole 16-byte groups a block.
    let q = qw.layers[0].q.as_ref().unwrap();
    assert_eq!(q.device_bytes(), q.shape().0 * q.shape().1 / 256 * 130);
    let types = f.matrix_types();
    assert!(types.contains(&("token_embd.weight".to_string(), GgmlType::Q3_K)));
    assert!(types.contains(&("blk.1.ffn_up.weight".to_string(), GgmlType::Q3_K)));
}

/// A Q4_0 file (`tiny_qwen3_q4_0.gguf`): every tensor against the package's values,
/// every matrix in Q4_0's own nibble layout (rows of 256 and 512) at the file's 18
/// bytes a block, the Q4_0 embedding table dequantized for lookups, a Q6_K head.
#[test]
fn reads_a_q4_0_model() {
    let f = GgufFile::open(fixture("tiny_qwen3_q4_0.gguf")).unwrap();
    check_every_tensor(&f, "tiny_qwen3_q4_0");
    let cfg = f.config().unwrap();
    let qw = f.quant_weights(&cfg).unwrap();
    for l in &qw.layers {
        for m in [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down] {
            let m = m.as_ref().unwrap();
            assert_eq!(m.ggml_type(), GgmlType::Q4_0);
            assert_eq!(m.device_bytes(), m.shape().0 * m.shape().1 / 32 * 18);
        }
    }
    assert_eq!(
        qw.lm_head.as_ref().map(PackedMatrix::ggml_type),
        Some(GgmlType::Q6_K)
    );
    let types = f.matrix_types();
    assert!(types.contains(&("token_embd.weight".to_string(), GgmlType::Q4_0)));
}

/// An IQ4_XS file (`tiny_qwen3_iq4_xs.gguf`): every tensor against the package's values,
/// every IQ4_XS matrix in its table-index layout at 138 bytes a super-block (the file's
/// 136), the first layer's Q5_K down projection beside them, the IQ4_XS embedding table
/// dequantized for lookups, a Q6_K head.
#[test]
fn reads_an_iq4_xs_model() {
    let f = GgufFile::open(fixture("tiny_qwen3_iq4_xs.gguf")).unwrap();
    check_every_tensor(&f, "tiny_qwen3_iq4_xs");
    let cfg = f.config().unwrap();
    let qw = f.quant_weights(&cfg).unwrap();
    for (i, l) in qw.layers.iter().enumerate() {
        for m in [&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down] {
            let m = m.as_ref().unwrap();
            if i == 0 && std::ptr::eq(m, l.down.as_ref().unwrap()) {
                assert_eq!(m.ggml_type(), GgmlType::Q5_K);
                continue;
            }
            assert_eq!(m.ggml_type(), GgmlType::IQ4_XS);
            assert_eq!(m.device_bytes(), m.shape().0 * m.shape().1 / 256 * 138);
        }
    }
    assert_eq!(
        qw.lm_head.as_ref().map(PackedMatrix::ggml_type),
        Some(GgmlType::Q6_K)
    );
    let types = f.matrix_types();
    assert!(types.contains(&("token_embd.weight".to_string(), GgmlType::IQ4_XS)));
}

/// Every tensor of model fixture `name` (open as `f`) against what the package
/// recorded: type, shape, sums and sampled values, the device layout of every matrix,
/// and the whole model as the dense decoder reads it.
fn check_every_tensor(f: &GgufFile, name: &str) {
    let cfg = f.config().unwrap();
    let expected = expected_model(name);
    let tensors = expected["tensors"].as_object().unwrap();
    assert_eq!(tensors.len(), f.tensors.len());
    for (hf, e) in tensors {
        let shape: Vec<usize> = e["shape"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as usize)
            .collect();
        let g = gguf::model::gguf_name(hf).unwrap();
        assert_eq!(g, e["gguf_name"].as_str().unwrap());
        assert_eq!(gguf::model::hf_name(&g).as_deref(), Some(hf.as_str()));
        assert_eq!(
            f.tensor(&g).unwrap().ggml_type.name(),
            e["type"].as_str().unwrap()
        );
        let v = f.tensor_f32(hf, &shape, &cfg).unwrap();
        let sum: f64 = v.iter().map(|&x| x as f64).sum();
        let sum_sq: f64 = v.iter().map(|&x| (x as f64) * (x as f64)).sum();
        let (ws, wq) = (e["sum"].as_f64().unwrap(), e["sum_sq"].as_f64().unwrap());
        assert!(
            (sum - ws).abs() <= 1e-9 * wq.sqrt().max(1.0) * (v.len() as f64),
            "{hf}: sum {sum} vs {ws}"
        );
        assert!(
            (sum_sq - wq).abs() <= 1e-9 * wq,
            "{hf}: sum of squares {sum_sq} vs {wq}"
        );
        for (at, want) in e["at"]
            .as_array()
            .unwrap()
            .iter()
            .zip(e["values"].as_array().unwrap())
        {
            let at = at.as_u64().unwrap() as usize;
            // The package's f32 values, printed as f64: equal once back in f32.
            assert_eq!(v[at], want.as_f64().unwrap() as f32, "{hf}[{at}]");
        }
        if shape.len() == 2 {
            let packed = f.packed_matrix(hf, shape[0], shape[1], &cfg).unwrap();
            match packed {
                Some(p) => {
                    assert_eq!(p.shape(), (shape[0], shape[1]));
                    assert_eq!(p.dequantize(), v, "{hf}: packed layout");
                }
                None => panic!("{hf}: every matrix of the fixture is quantized"),
            }
        }
    }
    // The whole model as the dense decoder reads it, checked against the config.
    let weights = f.model_weights(&cfg).unwrap();
    weights.validate(&cfg).unwrap();
}

#[test]
fn builds_the_tokenizer_from_metadata() {
    let f = GgufFile::open(fixture("tiny_qwen3.gguf")).unwrap();
    let tok = f.tokenizer_from_metadata().unwrap().unwrap();
    assert_eq!(tok.token_to_id("<|endoftext|>"), Some(0));
    common::check_tokenizer_cases(
        &tok,
        &common::fixtures_dir().join("tokenizer/expected.json"),
    );
}

/// A SentencePiece BPE vocabulary (`tokenizer.ggml.model = "llama"`, as Llama 2 and
/// TinyLlama files carry) encodes as SentencePiece itself does: the ids, bos first,
/// and the decoding `scripts/make_spm_fixture.py` got from the `sentencepiece` package,
/// byte fallback included.
#[test]
fn builds_a_sentencepiece_tokenizer_from_metadata() {
    let f = GgufFile::open(fixture("tiny_spm.gguf")).unwrap();
    let tok = f.tokenizer_from_metadata().unwrap().unwrap();
    let path = common::fixtures_dir().join("gguf/tiny_spm.json");
    let expected: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    assert_eq!(
        tok.vocab_size(),
        expected["vocab_size"].as_u64().unwrap() as usize
    );
    let ids_of = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|i| i.as_u64().unwrap() as u32)
            .collect()
    };
    let bos = expected["bos"].as_u64().unwrap() as u32;
    let mut byte_fallback = 0;
    for case in expected["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let ids = ids_of(&case["ids"]);
        assert_eq!(ids[0], bos);
        assert_eq!(tok.encode(text, true).unwrap(), ids, "encoding {text:?}");
        assert_eq!(
            tok.encode(text, false).unwrap(),
            ids[1..],
            "{text:?} without bos"
        );
        assert_eq!(
            tok.decode(&ids[1..], false).unwrap(),
            case["decoded"].as_str().unwrap(),
            "decoding {text:?}"
        );
        byte_fallback += case["pieces"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p.as_str().unwrap().starts_with("<0x")) as usize;
    }
    assert!(
        byte_fallback >= 2,
        "the fixture exercises the byte fallback"
    );
}

/// Tokenizer metadata the builder cannot use is an error naming the key or value.
#[test]
fn tokenizer_metadata_it_cannot_build_is_a_clear_error() {
    let strings = |items: &[&str]| {
        let mut v = 8u32.to_le_bytes().to_vec();
        v.extend_from_slice(&(items.len() as u64).to_le_bytes());
        for s in items {
            v.extend(string_bytes(s));
        }
        v
    };
    let f32s = |items: &[f32]| {
        let mut v = 6u32.to_le_bytes().to_vec();
        v.extend_from_slice(&(items.len() as u64).to_le_bytes());
        for x in items {
            v.extend_from_slice(&x.to_le_bytes());
        }
        v
    };
    let base = |model: &str| {
        Builder::new()
            .kv("general.architecture", 8, string_bytes("llama"))
            .kv("tokenizer.ggml.model", 8, string_bytes(model))
            .kv(
                "tokenizer.ggml.tokens",
                9,
                strings(&["<unk>", "a", "b", "ab"]),
            )
    };
    let error = |b: Builder| {
        let f = GgufFile::open(write_temp("tok.gguf", &b.bytes())).unwrap();
        f.tokenizer_from_metadata().unwrap_err().to_string()
    };
    let e = error(base("t5"));
    assert!(
        e.contains("tokenizer.ggml.model is `t5`") && e.contains("(`llama`)"),
        "{e}"
    );
    let e = error(base("llama"));
    assert!(e.contains("needs `tokenizer.ggml.scores`"), "{e}");
    let e = error(base("llama").kv("tokenizer.ggml.scores", 9, f32s(&[0.0, -1.0])));
    assert!(e.contains("scores has 2 entries for 4 tokens"), "{e}");
    let ok = base("llama").kv("tokenizer.ggml.scores", 9, f32s(&[0.0, -1.0, -2.0, -3.0]));
    let e = error(ok.kv(
        "tokenizer.ggml.unknown_token_id",
        4,
        9u32.to_le_bytes().to_vec(),
    ));
    assert!(e.contains("unknown_token_id 9 is past the 4 tokens"), "{e}");
    // Without types every piece is normal: "ab" is one merge of "a" and "b", and a
    // character outside the vocabulary (no byte tokens here) is the unknown token.
    let ok = base("llama")
        .kv("tokenizer.ggml.scores", 9, f32s(&[0.0, -1.0, -2.0, -3.0]))
        .kv("tokenizer.ggml.add_space_prefix", 7, vec![0])
        .kv(
            "tokenizer.ggml.unknown_token_id",
            4,
            0u32.to_le_bytes().to_vec(),
        );
    let f = GgufFile::open(write_temp("tok.gguf", &ok.bytes())).unwrap();
    let tok = f.tokenizer_from_metadata().unwrap().unwrap();
    assert_eq!(tok.encode("ab", false).unwrap(), [3]);
    assert_eq!(tok.encode("bac", false).unwrap(), [2, 1, 0]);
}

/// A GGUF file built by hand: metadata and tensors (name, ne, type, data).
struct Builder {
    kv: Vec<(String, u32, Vec<u8>)>,
    tensors: Vec<(String, Vec<u64>, u32, Vec<u8>)>,
    version: u32,
}

fn string_bytes(s: &str) -> Vec<u8> {
    let mut b = (s.len() as u64).to_le_bytes().to_vec();
    b.extend_from_slice(s.as_bytes());
    b
}

impl Builder {
    fn new() -> Self {
        Builder {
            kv: Vec::new(),
            tensors: Vec::new(),
            version: 3,
        }
    }
    fn kv(mut self, key: &str, ty: u32, value: Vec<u8>) -> Self {
        self.kv.push((key.into(), ty, value));
        self
    }
    fn tensor(mut self, name: &str, ne: &[u64], ty: u32, data: Vec<u8>) -> Self {
        self.tensors.push((name.into(), ne.to_vec(), ty, data));
        self
    }
    fn bytes(&self) -> Vec<u8> {
        let mut b = b"GGUF".to_vec();
        b.extend_from_slice(&self.version.to_le_bytes());
        b.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        b.extend_from_slice(&(self.kv.len() as u64).to_le_bytes());
        for (k, ty, v) in &self.kv {
            b.extend(string_bytes(k));
            b.extend_from_slice(&ty.to_le_bytes());
            b.extend_from_slice(v);
        }
        let mut offset = 0u64;
        for (name, ne, ty, data) in &self.tensors {
            b.extend(string_bytes(name));
            b.extend_from_slice(&(ne.len() as u32).to_le_bytes());
            for d in ne {
                b.extend_from_slice(&d.to_le_bytes());
            }
            b.extend_from_slice(&ty.to_le_bytes());
            b.extend_from_slice(&offset.to_le_bytes());
            offset += (data.len() as u64).div_ceil(32) * 32;
        }
        while b.len() % 32 != 0 {
            b.push(0);
        }
        for (_, _, _, data) in &self.tensors {
            b.extend_from_slice(data);
            while b.len() % 32 != 0 {
                b.push(0);
            }
        }
        b
    }
}

fn parse_err(bytes: &[u8]) -> String {
    match gguf::parse_bytes(bytes, Path::new("bad.gguf")) {
        Ok(_) => panic!("parsed a malformed file"),
        Err(e @ EngineError::Gguf { .. }) => e.to_string(),
        Err(other) => panic!("wrong error kind: {other}"),
    }
}

fn small_file() -> Builder {
    Builder::new()
        .kv("general.architecture", 8, string_bytes("qwen3"))
        .kv("some.u8", 0, vec![7])
        .kv("some.i16", 3, (-2i16).to_le_bytes().to_vec())
        .kv("some.f64", 12, 1.5f64.to_le_bytes().to_vec())
        .kv("some.bool", 7, vec![1])
        .kv("some.array", 9, {
            let mut v = 5u32.to_le_bytes().to_vec(); // i32 elements
            v.extend_from_slice(&2u64.to_le_bytes());
            v.extend_from_slice(&(-1i32).to_le_bytes());
            v.extend_from_slice(&3i32.to_le_bytes());
            v
        })
        .tensor("a", &[4, 2], 0, vec![0u8; 32])
        .tensor("b", &[32], 8, vec![0u8; 34])
}

#[test]
fn parses_every_value_type_of_a_hand_built_file() {
    let bytes = small_file().bytes();
    let h = gguf::parse_bytes(&bytes, Path::new("ok.gguf")).unwrap();
    let (meta, tensors) = (h.metadata, h.tensors);
    assert_eq!(h.version, 3);
    let get = |k: &str| {
        meta.iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.clone())
    };
    assert_eq!(get("some.u8"), Some(MetaValue::U8(7)));
    assert_eq!(get("some.i16"), Some(MetaValue::I16(-2)));
    assert_eq!(get("some.f64"), Some(MetaValue::F64(1.5)));
    assert_eq!(get("some.bool"), Some(MetaValue::Bool(true)));
    assert_eq!(
        get("some.array"),
        Some(MetaValue::Array(vec![
            MetaValue::I32(-1),
            MetaValue::I32(3)
        ]))
    );
    assert_eq!(tensors[0].shape(), vec![2, 4]);
    assert_eq!(tensors[1].ggml_type, GgmlType::Q8_0);
    assert_eq!(tensors[1].offset, 32);
}

/// Where the last tensor's data ends in the file `bytes`.
fn data_end(bytes: &[u8]) -> usize {
    let h = gguf::parse_bytes(bytes, Path::new("ok.gguf")).unwrap();
    h.tensors
        .iter()
        .map(|t| (h.data_start + t.offset + t.size) as usize)
        .max()
        .unwrap()
}

#[test]
fn every_truncation_is_an_error() {
    for bytes in [
        small_file().bytes(),
        std::fs::read(fixture("blocks.gguf")).unwrap(),
    ] {
        // Up to the end of the last tensor's data (the padding after it is optional).
        for len in 0..data_end(&bytes) {
            let msg = parse_err(&bytes[..len]);
            assert!(
                msg.contains("truncated")
                    || msg.contains("past the end")
                    || msg.contains("left in the file"),
                "cut at {len}: {msg}"
            );
        }
    }
    // The tiny model's header (its tokenizer makes it several KiB), every byte.
    let model = std::fs::read(fixture("tiny_qwen3.gguf")).unwrap();
    let f = GgufFile::open(fixture("tiny_qwen3.gguf")).unwrap();
    let end = data_end(&model);
    for len in (0..f.data_start as usize).chain((f.data_start as usize..end).step_by(997)) {
        let msg = parse_err(&model[..len]);
        assert!(msg.contains("bad.gguf"), "{msg}");
    }
}

#[test]
fn malformed_headers_are_named() {
    let good = small_file().bytes();
    let mut b = good.clone();
    b[0] = b'X';
    assert!(parse_err(&b).contains("not a GGUF file"));
    let mut f = small_file();
    f.version = 4;
    assert!(parse_err(&f.bytes()).contains("unsupported GGUF version 4"));
    let f = small_file().kv("weird", 13, vec![]);
    assert!(parse_err(&f.bytes()).contains("`weird` has unknown value type 13"));
    let f = small_file().kv("flag", 7, vec![2]);
    assert!(parse_err(&f.bytes()).contains("bool holding 2"));
    let f = small_file().tensor("c", &[32], 99, vec![0u8; 32]);
    let msg = parse_err(&f.bytes());
    assert!(
        msg.contains("tensor `c`") && msg.contains("unknown ggml type 99"),
        "{msg}"
    );
    let f = small_file().tensor("d", &[33], 8, vec![0u8; 64]);
    assert!(parse_err(&f.bytes()).contains("multiple of its block of 32"));
    let f = small_file().kv("general.alignment", 4, 24u32.to_le_bytes().to_vec());
    assert!(parse_err(&f.bytes()).contains("general.alignment"));
    let f = small_file().tensor("e", &[1, 1, 1, 1, 1], 0, vec![0u8; 4]);
    assert!(parse_err(&f.bytes()).contains("tensor `e` has 5 dimensions"));
    let f = small_file().kv("general.architecture", 8, string_bytes("qwen3"));
    assert!(parse_err(&f.bytes()).contains("appears twice"));
    // A huge array length cannot make the parser allocate it.
    let f = small_file().kv("big", 9, {
        let mut v = 4u32.to_le_bytes().to_vec();
        v.extend_from_slice(&(u64::MAX / 2).to_le_bytes());
        v
    });
    assert!(parse_err(&f.bytes()).contains("length of array `big`"));
    // A tensor whose data starts past the end.
    let mut b = good.clone();
    let mut entry = string_bytes("b");
    entry.extend_from_slice(&1u32.to_le_bytes());
    let at = b.windows(entry.len()).position(|w| w == entry).unwrap(); // tensor "b"
    let off = at + entry.len() + 8 + 4; // ne[0], type
    b[off..off + 8].copy_from_slice(&(1u64 << 20).to_le_bytes());
    let msg = parse_err(&b);
    assert!(
        msg.contains("tensor `b`") && msg.contains("past the end"),
        "{msg}"
    );
}

/// Dimensions and layer counts past anything the file's tensors could hold are errors
/// naming the key (a corrupt `block_count` once asked for a terabyte of layer slots).
#[test]
fn impossible_dimensions_name_the_key() {
    let model = std::fs::read(fixture("tiny_qwen3.gguf")).unwrap();
    for (key, value, want) in [
        (
            "qwen3.block_count",
            1u64 << 40,
            "more layers than the file has tensors",
        ),
        (
            "qwen3.embedding_length",
            1 << 33,
            "larger than any tensor dimension",
        ),
        (
            "qwen3.feed_forward_length",
            1 << 20,
            "larger than any tensor dimension",
        ),
    ] {
        let mut bytes = model.clone();
        let name = key.as_bytes();
        let at = bytes.windows(name.len()).position(|w| w == name).unwrap() + name.len();
        let ty = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
        // Widen to the value's type where it is stored as u32 (type 4) or u64 (10).
        match ty {
            4 if value <= u32::MAX as u64 => {
                bytes[at + 4..at + 8].copy_from_slice(&(value as u32).to_le_bytes())
            }
            4 => {
                bytes[at..at + 4].copy_from_slice(&10u32.to_le_bytes());
                bytes.splice(at + 4..at + 8, value.to_le_bytes());
            }
            10 => bytes[at + 4..at + 12].copy_from_slice(&value.to_le_bytes()),
            other => panic!("{key} has type {other}"),
        }
        let path = write_temp("dims.gguf", &bytes);
        let msg = match GgufFile::open(&path).and_then(|f| f.config()) {
            Ok(_) => panic!("{key} = {value}: no error"),
            Err(e) => e.to_string(),
        };
        assert!(msg.contains(key) && msg.contains(want), "{msg}");
        let _ = std::fs::remove_file(&path);
    }
}

/// Seeded random bytes of the tiny model's header overwritten (its metadata, tokenizer
/// and tensor table): opening it, its config, its weights and its tokenizer each give
/// a value or an error, never a panic.
#[test]
fn corrupted_headers_never_panic() {
    let model = std::fs::read(fixture("tiny_qwen3.gguf")).unwrap();
    let header = GgufFile::open(fixture("tiny_qwen3.gguf"))
        .unwrap()
        .data_start as usize;
    let mut state = 0x2545_f491_4f6c_dd1du64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let (mut opened, mut loaded) = (0, 0);
    let rounds: usize = std::env::var("FUZZ_ROUNDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300);
    for round in 0..rounds {
        let mut bytes = model.clone();
        let mut changed = Vec::new();
        for _ in 0..1 + next() % 4 {
            // A third of the changes in the first KiB (the counts and the first keys), a
            // third in the last 4 KiB (the tensor table), the rest anywhere.
            let at = match next() % 3 {
                0 => next() as usize % 1024.min(header),
                1 => header - 1 - next() as usize % 4096.min(header),
                _ => next() as usize % header,
            };
            if round % 2 == 0 {
                bytes[at] = next() as u8;
            } else {
                // A count, length, dimension or type field overwritten with an extreme.
                const EXTREMES: [u64; 8] = [
                    0,
                    1,
                    255,
                    1 << 31,
                    u32::MAX as u64,
                    1 << 32,
                    1 << 62,
                    u64::MAX,
                ];
                let v = EXTREMES[(next() % 8) as usize].to_le_bytes();
                let n = (header - at).min(if next() % 2 == 0 { 4 } else { 8 });
                bytes[at..at + n].copy_from_slice(&v[..n]);
            }
            changed.push(at);
        }
        let path = write_temp("corrupt.gguf", &bytes);
        let outcome = std::panic::catch_unwind(|| {
            let Ok(f) = GgufFile::open(&path) else {
                return (false, false);
            };
            let _ = f.tokenizer();
            let Ok(cfg) = f.config() else {
                return (true, false);
            };
            let quant = f.quant_weights(&cfg);
            let dense = f.model_weights(&cfg);
            (true, quant.is_ok() && dense.is_ok())
        });
        let _ = std::fs::remove_file(&path);
        match outcome {
            Ok((o, l)) => {
                opened += usize::from(o);
                loaded += usize::from(l);
            }
            Err(_) => panic!("round {round}: bytes {changed:?} of the header changed: a panic"),
        }
    }
    // Most single-byte changes land in token strings and still load; some must not.
    assert!(
        loaded > 0 && opened < rounds,
        "opened {opened}, loaded {loaded}"
    );
}

fn write_temp(name: &str, bytes: &[u8]) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("tilefuse-gguf-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    // Tests run in parallel threads: every file gets its own name.
    static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let p = dir.join(format!("{n}-{name}"));
    std::fs::write(&p, bytes).unwrap();
    p
}

#[test]
fn unsupported_types_and_shapes_name_the_tensor() {
    // The tiny model with its q projection's type changed to Q2_K: the file still
    // opens, and asking for the tensor names it and its type.
    let mut bytes = std::fs::read(fixture("tiny_qwen3.gguf")).unwrap();
    let name = b"blk.0.attn_q.weight";
    let at = bytes.windows(name.len()).position(|w| w == name).unwrap() + name.len();
    let ty_at = at + 4 + 2 * 8;
    assert_eq!(
        u32::from_le_bytes(bytes[ty_at..ty_at + 4].try_into().unwrap()),
        12
    );
    // Q2_K's 84-byte blocks are smaller than Q4_K's 144: the data stays in the file.
    bytes[ty_at..ty_at + 4].copy_from_slice(&10u32.to_le_bytes());
    let path = write_temp("q2k.gguf", &bytes);
    let f = GgufFile::open(&path).unwrap();
    let cfg = f.config().unwrap();
    let msg = f.model_weights(&cfg).unwrap_err().to_string();
    assert!(
        msg.contains("blk.0.attn_q.weight") && msg.contains("Q2_K"),
        "{msg}"
    );
    let msg = quant::dequantize(GgmlType(10), &[0u8; 84], 256, "t")
        .unwrap_err()
        .to_string();
    assert!(msg.contains("`t`") && msg.contains("Q2_K"), "{msg}");

    // A config that disagrees with a tensor's shape.
    let f = GgufFile::open(fixture("tiny_qwen3.gguf")).unwrap();
    let mut cfg = f.config().unwrap();
    cfg.intermediate_size = 512;
    let msg = f.model_weights(&cfg).unwrap_err().to_string();
    assert!(
        msg.contains("blk.0.ffn_gate.weight") && msg.contains("[512, 256]"),
        "{msg}"
    );

    // An architecture the engine does not implement.
    let mut bytes = std::fs::read(fixture("tiny_qwen3.gguf")).unwrap();
    let at = bytes.windows(5).position(|w| w == b"qwen3").unwrap();
    bytes[at..at + 5].copy_from_slice(b"gemma");
    let msg = config_error("gemma.gguf", &bytes);
    assert!(msg.contains("unsupported architecture `gemma`"), "{msg}");
}

/// The error reading the config of a file holding `bytes` (written as `name`).
fn config_error(name: &str, bytes: &[u8]) -> String {
    let path = write_temp(name, bytes);
    let msg = GgufFile::open(&path)
        .unwrap()
        .config()
        .unwrap_err()
        .to_string();
    let _ = std::fs::remove_file(&path);
    msg
}

#[test]
fn hf_and_gguf_names_round_trip() {
    for hf in [
        "model.embed_tokens.weight",
        "model.norm.weight",
        "lm_head.weight",
        "model.layers.0.self_attn.q_proj.bias",
        "model.layers.31.mlp.down_proj.weight",
        "model.layers.2.self_attn.k_norm.weight",
    ] {
        let g = gguf::model::gguf_name(hf).unwrap();
        assert_eq!(gguf::model::hf_name(&g).as_deref(), Some(hf));
    }
    assert_eq!(
        gguf::model::gguf_name("model.layers.7.post_attention_layernorm.weight").as_deref(),
        Some("blk.7.ffn_norm.weight")
    );
    assert_eq!(gguf::model::hf_name("blk.x.attn_q.weight"), None);
}

#[test]
fn engine_loads_a_gguf_file_and_decodes_like_the_reference() {
    let rel = decodes_like_the_reference("tiny_qwen3.gguf", GgmlType::Q6_K);
    // The quantized GEMVs multiply int8 activations (llama.cpp's q8_1 scheme,
    // `kernels_quant`), and this short prompt went through the multi-token GEMVs,
    // int8 rows too (as llama.cpp's MMVQ / MMQ take a prompt): measured 1.4-5.3%
    // from the f32 reference on this file's steps with the Q6_K head read
    // quantized; 1.3-2.3% with the prompt through dequantized GEMMs
    // (`TILEFUSE_QUANT_PREFILL_TOKENS=0`), 2.0-2.8% with every token a decode step.
    assert!(rel.generated < 6e-2, "{rel:?}");
    assert!(rel.stepped < 4e-2, "{rel:?}");
}

/// A Qwen2.5-0.5B-like Q4_K_M file (`tiny_qwen2.gguf`): Q5_0 and Q4_0 matrices read as
/// Q8_0, biases, a tied Q5_0 head; rows of 320, no multiple of the GEMVs' tiles.
#[test]
fn a_qwen2_file_with_q5_0_and_q4_0_matrices_decodes_like_the_reference() {
    let rel = decodes_like_the_reference("tiny_qwen2.gguf", GgmlType::Q5_0);
    // Measured on the interpreter: 1.9-2.2% from the f32 reference with the prompt
    // through the multi-token GEMVs, 2.0-2.3% as decode steps alone (the int8
    // activations, as for the K-quant file above).
    assert!(rel.generated < 5e-2, "{rel:?}");
    assert!(rel.stepped < 4e-2, "{rel:?}");
}

/// A Q5_K_M-like file (`tiny_qwen3_q5_k.gguf`: Q5_K and Q6_K matrices over two
/// layers, a Q5_K embedding table, an untied Q6_K head).
#[test]
fn a_q5_k_m_file_decodes_like_the_reference() {
    let rel = decodes_like_the_reference("tiny_qwen3_q5_k.gguf", GgmlType::Q6_K);
    // Measured on the interpreter: 1.3-1.8% from the f32 reference with the prompt
    // through the multi-token GEMVs, 1.3-1.7% as decode steps alone.
    assert!(rel.generated < 5e-2, "{rel:?}");
    assert!(rel.stepped < 4e-2, "{rel:?}");
}

/// A Q3_K_M-like file (`tiny_qwen3_q3_k.gguf`: Q3_K matrices beside Q4_K
/// and Q5_K ones, a Q3_K embedding table, an untied Q6_K head).
#[test]
fn a_q3_k_m_file_decodes_like_the_reference() {
    let rel = decodes_like_the_reference("tiny_qwen3_q3_k.gguf", GgmlType::Q6_K);
    // Measured on the interpreter: 1.4-2.6% from the f32 reference with the prompt
    // through the multi-token GEMVs, 1.6-3.2% as decode steps alone.
    assert!(rel.generated < 5e-2, "{rel:?}");
    assert!(rel.stepped < 4e-2, "{rel:?}");
}

/// A Q4_0 file (`tiny_qwen3_q4_0.gguf`: every matrix Q4_0, read in nibble words by the
/// Q4_K kernels' Q4_0 variants, a Q4_0 embedding table, an untied Q6_K head).
#[test]
fn a_q4_0_file_decodes_like_the_reference() {
    let rel = decodes_like_the_reference("tiny_qwen3_q4_0.gguf", GgmlType::Q6_K);
    // Measured on the interpreter: 2.4-3.0% from the f32 reference with the prompt
    // through the multi-token GEMVs, 2.1-2.4% as decode steps alone.
    assert!(rel.generated < 5e-2, "{rel:?}");
    assert!(rel.stepped < 4e-2, "{rel:?}");
}

/// An IQ4_XS file (`tiny_qwen3_iq4_xs.gguf`: every matrix IQ4_XS but a Q5_K down
/// projection, read by the Q4_K kernels' IQ4_XS variants, an IQ4_XS embedding table, an
/// untied Q6_K head).
#[test]
fn an_iq4_xs_file_decodes_like_the_reference() {
    let rel = decodes_like_the_reference("tiny_qwen3_iq4_xs.gguf", GgmlType::Q6_K);
    // Measured on the interpreter: 1.8-2.4% from the f32 reference with the prompt
    // through the multi-token GEMVs, 2.1-3.4% as decode steps alone.
    assert!(rel.generated < 5e-2, "{rel:?}");
    assert!(rel.stepped < 4e-2, "{rel:?}");
}

/// The largest relative logit errors of [`decodes_like_the_reference`].
#[derive(Debug)]
struct DecodeErrors {
    /// `Engine::generate`'s logits (prompt through the batched prefill).
    generated: f64,
    /// The same positions as decode steps alone.
    stepped: f64,
}

/// Loads model fixture `file` into an engine, generates 4 tokens after a prompt, and
/// compares every step's logits with the host reference decoder on the same
/// (dequantized) weights; then the same positions as decode steps alone. The file's
/// matrices must be read quantized, its head (stored as `head`) as
/// `quant::head_reads_quantized` says, and the prompt through the batched prefill.
fn decodes_like_the_reference(file: &str, head: GgmlType) -> DecodeErrors {
    use std::ops::ControlFlow;
    use tilefuse_dsl::runtime::Device;
    use tilefuse_engine::{Engine, EngineOptions, GenerateOptions, Reference};

    let mut errors = DecodeErrors {
        generated: 0.0,
        stepped: 0.0,
    };
    let path = fixture(file);
    let mut engine = Engine::load(
        &path,
        EngineOptions {
            device: Device::cpu(),
            max_seq_len: Some(32),
            cuda_graph: false,
            ..EngineOptions::default()
        },
    )
    .unwrap();
    let prompt = engine.encode("The quick brown fox").unwrap();
    assert!(prompt.len() > 2);
    let opts = GenerateOptions {
        max_new_tokens: 4,
        stop_at_eos: false,
        keep_logits: true,
        ..GenerateOptions::default()
    };
    let out = engine
        .generate(&prompt, &opts, |_| ControlFlow::Continue(()))
        .unwrap();
    // The host reference decoder on the same (dequantized) weights.
    let f = GgufFile::open(&path).unwrap();
    let cfg = f.config().unwrap();
    let mut reference = Reference::new(cfg.clone(), f.model_weights(&cfg).unwrap()).unwrap();
    let mut logits = Vec::new();
    let mut pos = 0;
    for &t in &prompt[..prompt.len() - 1] {
        reference.forward(t, pos).unwrap();
        pos += 1;
    }
    let mut token = *prompt.last().unwrap();
    for step in 0..4 {
        let l = reference.forward(token, pos).unwrap();
        pos += 1;
        let rel = common::rel_err(&out.logits[step], &l);
        eprintln!("{file} step {step}: generated logits {rel:.4} from the reference");
        errors.generated = errors.generated.max(rel as f64);
        token = out.tokens[step];
        logits.push(l);
    }
    // The same tokens as decode steps alone, int8 activations at every position.
    let dec = engine.decoder().expect("one device");
    for (pos, &t) in prompt[..prompt.len() - 1].iter().enumerate() {
        dec.forward(t, pos).unwrap();
    }
    let generated = out.tokens[..3].iter();
    let inputs = std::iter::once(prompt.last().unwrap()).chain(generated);
    for (step, &t) in inputs.enumerate() {
        let l = dec.forward(t, prompt.len() - 1 + step).unwrap();
        let rel = common::rel_err(&l, &logits[step]);
        eprintln!("{file} decode step {step}: logits {rel:.4} from the reference");
        errors.stepped = errors.stepped.max(rel as f64);
    }
    assert_eq!(out.tokens.len(), 4);
    // The file's matrices are read quantized, its head too
    // (`quant::head_reads_quantized`); its prompt went through the batched prefill.
    let dec = engine.decoder().expect("one device");
    assert!(dec.is_quantized());
    assert_eq!(dec.has_quant_head(), quant::head_reads_quantized(head));
    assert!(out.batched_prefill);
    errors
}

/// The batched prefill of a quantized model (its matrices dequantized to bf16 before
/// each GEMM, `PrefillWeight`) is bit for bit the dense model's prefill over the same
/// weights dequantized on the host (both GEMMs read the same bf16 values): the logits of
/// the last prompt position (the dense LM head in both) and the greedy token and
/// position, over chunks that split the prompt unevenly. Decoding then continues from
/// the prefilled cache with the quantized GEMVs (within the quantized step's tolerance
/// of the dense step). On the interpreter, and on the GPU when there is one.
#[test]
fn a_quantized_models_prefill_is_the_dense_prefill_on_dequantized_weights() {
    use tilefuse_dsl::runtime::testing::{gpu_or_skip, gpu_turn};
    use tilefuse_dsl::runtime::Device;
    use tilefuse_engine::decode::QuantWeights;
    use tilefuse_engine::Decoder;

    let f = GgufFile::open(fixture("tiny_qwen3.gguf")).unwrap();
    let cfg = f.config().unwrap();
    let mw = f.model_weights(&cfg).unwrap();
    let mut qw = f.quant_weights(&cfg).unwrap();
    qw.lm_head = None;
    assert!(qw.layers.iter().all(|l| l.q.is_some() && l.down.is_some()));
    let prompt: Vec<u32> = (0..11)
        .map(|i| (i * 37 + 3) % cfg.vocab_size as u32)
        .collect();
    let mut devices = vec![Device::cpu()];
    devices.extend(gpu_or_skip(
        "a_quantized_models_prefill_is_the_dense_prefill_on_dequantized_weights",
    ));
    // This process's tests share one stream: another's graph capture must not
    // overlap this test's work.
    let _turn = (devices.len() > 1).then(gpu_turn);
    for dev in devices {
        let mut dense = Decoder::with_quant(&cfg, &mw, &QuantWeights::default(), &dev, 16).unwrap();
        let mut quant = Decoder::with_quant(&cfg, &mw, &qw, &dev, 16).unwrap();
        assert!(quant.is_quantized() && !dense.is_quantized());
        // Four runs of one type a layer (QKV: Q4_K, Q8_0, Q6_K; gate/up: Q4_K, Q8_0; O
        // and down one each): the dequantization launches a chunk.
        assert!(quant.prefill_dequant_launches() >= 4 * cfg.num_layers);
        assert_eq!(dense.prefill_dequant_launches(), 0);
        for chunk in [4, 16] {
            let what = format!("{dev}, chunks of {chunk}");
            dense.set_prefill_chunk(chunk).unwrap();
            quant.set_prefill_chunk(chunk).unwrap();
            // Every chunk dequantizes its matrices for the GEMMs (short chunks would
            // take the multi-token GEMVs: the next test).
            quant.prefiller().unwrap().set_quant_gemv_tokens(0);
            dense.prefill(&prompt).unwrap();
            quant.prefill(&prompt).unwrap();
            let want = dense.read_logits().unwrap();
            let got = quant.read_logits().unwrap();
            assert!(want.iter().all(|v| v.is_finite()), "{what}");
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_eq!(g.to_bits(), w.to_bits(), "{what}: logit {i}: {g} vs {w}");
            }
            let state = quant.read_state().unwrap();
            assert_eq!(state, dense.read_state().unwrap(), "{what}");
            assert_eq!(state.1, prompt.len(), "{what}");
            // The next step decodes from the prefilled cache.
            let token = state.0;
            let want = dense.forward(token, prompt.len()).unwrap();
            let got = quant.forward(token, prompt.len()).unwrap();
            let rel = common::rel_err(&got, &want);
            assert!(
                rel < 8e-2,
                "{what}: the step after the prefill differs by {rel}"
            );
        }
    }
}

/// Short chunks of a quantized model take the multi-token GEMVs (int8 activations, as
/// the decode step's GEMVs): the prefill then agrees with the quantized model's own
/// token-by-token steps and with the dense prefill on the dequantized weights within
/// the quantization of the activations, over chunks that split the prompt unevenly and
/// a chunk longer than the multi-token GEMVs take (which dequantizes), and decodes on.
#[test]
fn a_quantized_models_short_chunks_take_the_multi_token_gemvs() {
    use tilefuse_dsl::runtime::testing::{gpu_or_skip, gpu_turn};
    use tilefuse_dsl::runtime::Device;
    use tilefuse_engine::decode::QuantWeights;
    use tilefuse_engine::Decoder;

    let f = GgufFile::open(fixture("tiny_qwen3.gguf")).unwrap();
    let cfg = f.config().unwrap();
    let mw = f.model_weights(&cfg).unwrap();
    let mut qw = f.quant_weights(&cfg).unwrap();
    qw.lm_head = None;
    let prompt: Vec<u32> = (0..13)
        .map(|i| (i * 53 + 5) % cfg.vocab_size as u32)
        .collect();
    let mut devices = vec![Device::cpu()];
    devices.extend(gpu_or_skip(
        "a_quantized_models_short_chunks_take_the_multi_token_gemvs",
    ));
    // This process's tests share one stream: another's graph capture must not
    // overlap this test's work.
    let _turn = (devices.len() > 1).then(gpu_turn);
    for dev in devices {
        let mut dense = Decoder::with_quant(&cfg, &mw, &QuantWeights::default(), &dev, 32).unwrap();
        let mut quant = Decoder::with_quant(&cfg, &mw, &qw, &dev, 32).unwrap();
        // The quantized model token by token (decode steps).
        let mut steps = Vec::new();
        for (pos, &t) in prompt.iter().enumerate() {
            steps = quant.forward(t, pos).unwrap();
        }
        dense.set_prefill_chunk(8).unwrap();
        dense.prefill(&prompt).unwrap();
        let dense_logits = dense.read_logits().unwrap();
        // (chunk, longest chunk for the multi-token GEMVs): chunks of 8 and 5, both
        // short; the 8 dequantized and the 5 short; one chunk of 13, dequantized; chunks
        // of 5, 5 and 3, short (4 and 8 tokens a program); one short chunk of 13, longer
        // than the room the first short chunks allocated.
        let mut all_short: Option<Vec<f32>> = None;
        for (chunk, short) in [(8, 32), (8, 5), (13, 0), (5, 32), (13, 32)] {
            let what = format!("{dev}, chunks of {chunk}, multi-token GEMVs up to {short}");
            quant.set_prefill_chunk(chunk).unwrap();
            quant.prefiller().unwrap().set_quant_gemv_tokens(short);
            quant.prefill(&prompt).unwrap();
            let got = quant.read_logits().unwrap();
            assert!(got.iter().all(|v| v.is_finite()), "{what}");
            let vs_steps = common::rel_err(&got, &steps);
            let vs_dense = common::rel_err(&got, &dense_logits);
            assert!(
                vs_steps < 3e-2,
                "{what}: against the quantized steps {vs_steps}"
            );
            assert!(
                vs_dense < 8e-2,
                "{what}: against the dense prefill {vs_dense}"
            );
            // A token's sums do not depend on the chunk it is in.
            if short >= 8 {
                match &all_short {
                    None => all_short = Some(got.clone()),
                    Some(first) => assert!(
                        got.iter()
                            .zip(first)
                            .all(|(g, f)| g.to_bits() == f.to_bits()),
                        "{what}: not the logits of the other short chunks"
                    ),
                }
            }
            let state = quant.read_state().unwrap();
            assert_eq!(state.1, prompt.len(), "{what}");
            // The next step decodes from the prefilled cache.
            let next = quant.forward(state.0, prompt.len()).unwrap();
            assert!(next.iter().all(|v| v.is_finite()), "{what}");
            eprintln!("{what}: relative error against the steps {vs_steps:.2e}, against the dense prefill {vs_dense:.2e}");
        }
    }
}

#[test]
fn llama_q_and_k_rows_are_permuted_back() {
    let (heads, kv_heads, head_dim, cols) = (2usize, 1usize, 4usize, 2usize);
    // Hugging Face rows: element (r, c) = 10 r + c.
    let hf = |rows: usize| -> Vec<f32> {
        (0..rows * cols)
            .map(|i| ((i / cols) * 10 + i % cols) as f32)
            .collect()
    };
    // llama.cpp's converter: `w.reshape(n_head, 2, rows / n_head / 2, cols)
    // .swapaxes(1, 2).reshape(rows, cols)`.
    let permute = |w: &[f32], n_head: usize| -> Vec<f32> {
        let rows = w.len() / cols;
        let half = rows / n_head / 2;
        let mut out = vec![0.0; w.len()];
        for h in 0..n_head {
            for i in 0..half {
                for j in 0..2 {
                    let dst = (h * half + i) * 2 + j; // [n_head, half, 2]
                    let src = (h * 2 + j) * half + i; // [n_head, 2, half]
                    out[dst * cols..(dst + 1) * cols]
                        .copy_from_slice(&w[src * cols..(src + 1) * cols]);
                }
            }
        }
        out
    };
    let bytes = |v: &[f32]| -> Vec<u8> { v.iter().flat_map(|x| x.to_le_bytes()).collect() };
    let u32v = |v: u32| v.to_le_bytes().to_vec();
    let (q_rows, k_rows) = (heads * head_dim, kv_heads * head_dim);
    let file = Builder::new()
        .kv("general.architecture", 8, string_bytes("llama"))
        .kv("llama.embedding_length", 4, u32v(cols as u32))
        .kv("llama.block_count", 4, u32v(1))
        .kv("llama.feed_forward_length", 4, u32v(8))
        .kv("llama.attention.head_count", 4, u32v(heads as u32))
        .kv("llama.attention.head_count_kv", 4, u32v(kv_heads as u32))
        .kv("llama.attention.key_length", 4, u32v(head_dim as u32))
        .kv("llama.vocab_size", 4, u32v(3))
        .tensor(
            "blk.0.attn_q.weight",
            &[cols as u64, q_rows as u64],
            0,
            bytes(&permute(&hf(q_rows), heads)),
        )
        .tensor(
            "blk.0.attn_k.weight",
            &[cols as u64, k_rows as u64],
            0,
            bytes(&permute(&hf(k_rows), kv_heads)),
        )
        .tensor(
            "blk.0.attn_v.weight",
            &[cols as u64, k_rows as u64],
            0,
            bytes(&permute(&hf(k_rows), kv_heads)),
        );
    let path = write_temp("llama.gguf", &file.bytes());
    let f = GgufFile::open(&path).unwrap();
    let cfg = f.config().unwrap();
    assert_eq!(cfg.arch, Arch::Llama);
    assert_eq!(
        (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim),
        (heads, kv_heads, head_dim)
    );
    let q = f
        .tensor_f32(
            "model.layers.0.self_attn.q_proj.weight",
            &[q_rows, cols],
            &cfg,
        )
        .unwrap();
    assert_eq!(q, hf(q_rows));
    let k = f
        .tensor_f32(
            "model.layers.0.self_attn.k_proj.weight",
            &[k_rows, cols],
            &cfg,
        )
        .unwrap();
    assert_eq!(k, hf(k_rows));
    // v is not permuted by the converter, so it comes back as stored.
    let v = f
        .tensor_f32(
            "model.layers.0.self_attn.v_proj.weight",
            &[k_rows, cols],
            &cfg,
        )
        .unwrap();
    assert_eq!(v, permute(&hf(k_rows), kv_heads));
    assert_ne!(v, hf(k_rows));
}

/// The decode step over the file's quantized matrices (the quantized GEMVs, the fused
/// QKV and gate/up split into runs of one type: the fixture's q, k, v are Q4_K, Q8_0,
/// Q6_K; gate, up Q4_K, Q8_0; the untied head Q6_K) against the dense step over the
/// same weights dequantized to bf16, token by token: logits within the tolerance the
/// dense path keeps to the host reference, and greedy tokens that are the argmax of the
/// step's logits and the dense step's but for near-ties. On the interpreter, and on the GPU when there is one.
#[test]
fn quantized_step_matches_the_dense_step_on_dequantized_weights() {
    use tilefuse_dsl::runtime::testing::gpu_turn;
    use tilefuse_engine::gguf::quant::GgmlType;
    use tilefuse_engine::{Decoder, Engine, EngineOptions};

    let path = fixture("tiny_qwen3.gguf");
    let devices = cpu_and_gpu("quantized_step_matches_the_dense_step_on_dequantized_weights");
    // This process's tests share one stream: another's graph capture must not
    // overlap this test's work.
    let _turn = (devices.len() > 1).then(gpu_turn);
    for dev in devices {
        let opts = EngineOptions {
            device: dev.clone(),
            max_seq_len: Some(16),
            cuda_graph: false,
            ..EngineOptions::default()
        };
        let mut dense = Engine::load_gguf_as(&path, opts.clone(), false).unwrap();
        assert!(!dense.decoder().expect("one device").is_quantized());
        let (f, cfg, qw) = tiny_quant_weights();
        assert_eq!(
            qw.lm_head.as_ref().map(|m| m.ggml_type()),
            Some(GgmlType::Q6_K)
        );
        let mut quant =
            Decoder::with_quant(&cfg, &f.model_weights(&cfg).unwrap(), &qw, &dev, 16).unwrap();
        assert!(quant.is_quantized());
        // Of a layer's four quantized GEMV inputs only down's is quantized by a launch
        // of its own: the QKV and gate/up GEMVs quantize their normed inputs themselves
        // at these short rows (`gguf::device::fuses_norm`), O's is written by the
        // attention combine as it merges the splits (`attention_combine_quant`). QKV
        // takes two more launches and gate/up one more (runs of one type).
        let qkv_rows = (cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim;
        assert!(tilefuse_engine::gguf::device::fuses_norm(qkv_rows, cfg.hidden_size).unwrap());
        assert_eq!(
            quant.kernels_per_step(),
            dense.decoder().expect("one device").kernels_per_step() + 4 * cfg.num_layers
        );
        assert!(
            quant.weight_bytes_per_step()
                < dense.decoder().expect("one device").weight_bytes_per_step() / 2
        );
        if dev.is_cuda() {
            quant.capture().unwrap();
        }
        let mut token = 17u32;
        for pos in 0..10 {
            let want = dense
                .decoder()
                .expect("one device")
                .forward(token, pos)
                .unwrap();
            let got = quant.forward(token, pos).unwrap();
            let rel = common::rel_err(&got, &want);
            // Each path rounds every projection to bf16 in its own summation order, and
            // the quantized one multiplies int8 activations (llama.cpp's q8_1 scheme,
            // `kernels_quant`): measured 1.4-5.4% on the interpreter over these ten
            // positions (0.8-1.4% with bf16 activations); logits of rms 2.2 move by up
            // to 0.72.
            assert!(rel < 8e-2, "{dev} position {pos}: logits differ by {rel}");
            let (dense_next, _) = dense.decoder().expect("one device").read_state().unwrap();
            let (quant_next, next_pos) = quant.read_state().unwrap();
            assert_eq!(next_pos, pos + 1);
            // The greedy token is the argmax of the step's own logits.
            let argmax = tilefuse_engine::reference::argmax(&got);
            assert_eq!(quant_next as usize, argmax, "{dev} position {pos}");
            if dense_next != quant_next {
                // Only a near-tie may flip the greedy token: closer in the dense logits
                // than the two paths' largest logit difference at this step.
                let gap = (want[dense_next as usize] - want[quant_next as usize]).abs();
                let moved = got
                    .iter()
                    .zip(&want)
                    .fold(0f32, |m, (a, b)| m.max((a - b).abs()));
                assert!(
                    gap <= moved,
                    "{dev} position {pos}: tokens {dense_next} vs {quant_next} (gap {gap}, logits moved up to {moved})"
                );
            }
            token = quant_next;
        }
        // Sampling on the device reads the quantized head's logits: at a temperature
        // of 1e-4 the draw is a largest logit (the logits are bf16: any other is at
        // least 2^-7 below a largest one over 1, so e^-78 times as likely or less).
        let got = quant.forward(token, 10).unwrap();
        let params = tilefuse_engine::Sampling {
            temperature: 1e-4,
            top_k: 0,
            top_p: 1.0,
            seed: 7,
        };
        let drawn = quant.sample_on_device(&params).unwrap();
        let drawn = drawn.expect("no top-k or top-p: the device's draw is accepted");
        let max = got.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        assert_eq!(got[drawn as usize], max, "{dev}: drew {drawn}");
        assert_eq!(quant.read_state().unwrap(), (drawn, 11), "{dev}");
    }
}

/// The Qwen2.5-0.5B-like file (`tiny_qwen2.gguf`: Q5_0, Q4_0 and Q8_0 rows of 320
/// read as Q8_0, q/k/v biases, the tied Q5_0 head) through `Engine::load`'s quantized
/// step against the dense step over the same weights dequantized to bf16, token by
/// token, and the greedy token the argmax of the step's own logits. On the
/// interpreter, and on the GPU (the step captured as a graph) when there is one.
#[test]
fn a_qwen2_files_quantized_step_matches_its_dense_step() {
    quantized_file_step_matches_its_dense_step(
        "tiny_qwen2.gguf",
        "a_qwen2_files_quantized_step_matches_its_dense_step",
    );
}

/// The Q5_K_M-like file (`tiny_qwen3_q5_k.gguf`) as the Qwen2 one above: the Q5_K
/// GEMVs (QKV and gate/up with the norm inside or not, O and down with the residual)
/// and the Q6_K head inside the captured step.
#[test]
fn a_q5_k_m_files_quantized_step_matches_its_dense_step() {
    quantized_file_step_matches_its_dense_step(
        "tiny_qwen3_q5_k.gguf",
        "a_q5_k_m_files_quantized_step_matches_its_dense_step",
    );
}

/// The Q3_K_M-like file (`tiny_qwen3_q3_k.gguf`) as the Qwen2 one above: its Q3_K
/// matrices through the Q6_K GEMVs' Q3_K variants (QKV, with a Q5_K or Q4_K `v`, in one
/// launch), the Q4_K O, Q5_K and Q4_K down projections and the Q6_K head inside the
/// captured step.
#[test]
fn a_q3_k_m_files_quantized_step_matches_its_dense_step() {
    quantized_file_step_matches_its_dense_step(
        "tiny_qwen3_q3_k.gguf",
        "a_q3_k_m_files_quantized_step_matches_its_dense_step",
    );
    // Each layer's QKV, `[q; k]` Q3_K and `v` Q5_K or Q4_K, is one launch
    // (`q4_k_q6_k_gemv`'s `SIX_FIRST = 1` variants); the one launch a layer more than
    // the dense step is the quantizer of down's input (Q3_K gate/up rows do not write it).
    use tilefuse_engine::{Engine, EngineOptions};
    let path = fixture("tiny_qwen3_q3_k.gguf");
    let layers = GgufFile::open(&path).unwrap().config().unwrap().num_layers;
    let opts = EngineOptions {
        device: tilefuse_dsl::runtime::Device::cpu(),
        max_seq_len: Some(16),
        ..EngineOptions::default()
    };
    let mut dense = Engine::load_gguf_as(&path, opts.clone(), false).unwrap();
    let mut quant = Engine::load(&path, opts).unwrap();
    assert_eq!(
        quant.decoder().expect("one device").kernels_per_step(),
        dense.decoder().expect("one device").kernels_per_step() + layers
    );
}

/// The Q4_0 file (`tiny_qwen3_q4_0.gguf`) as the Qwen2 one above: the Q4_0 GEMVs (QKV
/// and gate/up, the latter writing down's int8 input itself, O and down with the
/// residual) and the Q6_K head inside the captured step.
#[test]
fn a_q4_0_files_quantized_step_matches_its_dense_step() {
    quantized_file_step_matches_its_dense_step(
        "tiny_qwen3_q4_0.gguf",
        "a_q4_0_files_quantized_step_matches_its_dense_step",
    );
}

/// The IQ4_XS file (`tiny_qwen3_iq4_xs.gguf`) as the Qwen2 one above: the IQ4_XS GEMVs
/// (QKV, gate/up writing down's int8 input itself, O and down with the residual), the
/// first layer's Q5_K down and the Q6_K head inside the captured step.
#[test]
fn an_iq4_xs_files_quantized_step_matches_its_dense_step() {
    quantized_file_step_matches_its_dense_step(
        "tiny_qwen3_iq4_xs.gguf",
        "an_iq4_xs_files_quantized_step_matches_its_dense_step",
    );
}

/// Model fixture `file` through `Engine::load`'s quantized step against the dense step
/// over the same weights dequantized to bf16, token by token, and the greedy token the
/// argmax of the step's own logits. On the interpreter, and on the GPU (the step
/// captured as a graph) when there is one (`test` names the test for the skip notice).
fn quantized_file_step_matches_its_dense_step(file: &str, test: &str) {
    use tilefuse_dsl::runtime::testing::gpu_turn;
    use tilefuse_engine::{Engine, EngineOptions};

    let path = fixture(file);
    let devices = cpu_and_gpu(test);
    let _turn = (devices.len() > 1).then(gpu_turn);
    for dev in devices {
        let opts = EngineOptions {
            device: dev.clone(),
            max_seq_len: Some(16),
            cuda_graph: dev.is_cuda(),
            ..EngineOptions::default()
        };
        let mut dense = Engine::load_gguf_as(&path, opts.clone(), false).unwrap();
        let mut quant = Engine::load(&path, opts).unwrap();
        let (dense, quant) = (
            dense.decoder().expect("one device"),
            quant.decoder().expect("one device"),
        );
        assert!(quant.is_quantized() && quant.has_quant_head());
        assert!(quant.weight_bytes_per_step() < dense.weight_bytes_per_step() * 2 / 3);
        let mut token = 23u32;
        for pos in 0..8 {
            let want = dense.forward(token, pos).unwrap();
            let got = quant.forward(token, pos).unwrap();
            let rel = common::rel_err(&got, &want);
            eprintln!("{file} on {dev}, position {pos}: logits {rel:.4} from the dense step");
            // Measured on the interpreter: 1.5-2.9% (the int8 activations; tiny_qwen2),
            // 1.3-2.0% (tiny_qwen3_q5_k), 1.5-3.2% (tiny_qwen3_q3_k) and 1.8-3.2%
            // (tiny_qwen3_q4_0), 1.4-3.0% (tiny_qwen3_iq4_xs).
            assert!(rel < 5e-2, "{dev} position {pos}: logits differ by {rel}");
            let (next, next_pos) = quant.read_state().unwrap();
            assert_eq!(next_pos, pos + 1);
            let argmax = tilefuse_engine::reference::argmax(&got);
            assert_eq!(next as usize, argmax, "{dev} position {pos}");
            token = next;
        }
    }
}

/// Random Q4_K blocks for a `[rows, cols]` matrix from `byte`: f16 `d` and `dmin`
/// (small), 12 scale bytes and 128 quant bytes a block of 256.
fn random_q4_k(
    rows: usize,
    cols: usize,
    byte: &mut impl FnMut() -> u8,
    name: &str,
) -> PackedMatrix {
    use tilefuse_dsl::half::f16;
    let mut bytes = Vec::new();
    for _ in 0..rows * cols / 256 {
        let d = f16::from_f32((byte() as f32 - 128.0) * 1e-4);
        let dmin = f16::from_f32(byte() as f32 * 1e-4);
        bytes.extend(d.to_le_bytes());
        bytes.extend(dmin.to_le_bytes());
        bytes.extend((0..140).map(|_| byte()));
    }
    PackedMatrix::pack(GgmlType::Q4_K, &bytes, rows, cols, name).unwrap()
}

/// The decode step with Q4_K_M's layouts: QKV as `[q; k]` Q4_K and a Q6_K `v` (the
/// fixture's Q8_0 `k` replaced by random Q4_K blocks), whose two runs launch as one
/// (`gguf::device::launch_q4_k_q6_k`), and `[gate; up]` as one Q4_K run (random blocks
/// for both), each replaced matrix dequantized for the dense side. The logits stay
/// within `quantized_step_matches_the_dense_step_on_dequantized_weights`' tolerance of
/// the dense step over the same weights, on the interpreter and on the GPU (graph
/// replays). Run in child processes of this test binary (the settings are the process's
/// environment), one a setting: the default, where `[gate; up]` writes the down
/// projection's int8 input itself (`DeviceQuantMatrix::gemv_norm_silu_quantized`) and
/// the step takes no launch more than the dense step's; with the quantizer launch
/// between them; with the norms quantized by launches before the GEMVs (as at 8B's
/// sizes), the `v` run in its own tile of the merged launch, or in the `[q; k]` run's;
/// with those two runs in two launches; and with the norms quantized before the GEMVs
/// and `[gate; up]` writing down's input (the spare's two pairs of activation buffers
/// trading places).
/// Each child checks its launch count against the settings.
#[test]
fn q4_k_m_layouts_in_fused_launches_match_the_dense_step() {
    const CHILD: &str = "TILEFUSE_GGUF_TEST_CHILD";
    if std::env::var_os(CHILD).is_some() {
        return q4_k_m_layouts_match_the_dense_step();
    }
    let name = "q4_k_m_layouts_in_fused_launches_match_the_dense_step";
    let settings: [&[(&str, &str)]; 8] = [
        &[],
        &[("TILEFUSE_QUANT_SILU_GATE_UP", "0")],
        // Every layer's quantized gate/up words prefetched during attention (the
        // interpreter checks the ranges against the buffer).
        &[("TILEFUSE_PREFETCH_WORDS", "64")],
        // And the next GEMV's words prefetched by each quantizer launch (with the
        // quantizers before QKV and gate/up).
        &[
            ("TILEFUSE_QUANT_NORM_FUSED", "0"),
            ("TILEFUSE_PREFETCH_WORDS", "1"),
            ("TILEFUSE_QUANTIZER_PREFETCH", "64"),
        ],
        &[("TILEFUSE_QUANT_NORM_FUSED", "0")],
        &[
            ("TILEFUSE_QUANT_NORM_FUSED", "0"),
            ("TILEFUSE_QUANT_MERGE_RUNS", "fused"),
        ],
        // Both runs at the `[q; k]` run's tile.
        &[
            ("TILEFUSE_QUANT_NORM_FUSED", "0"),
            ("TILEFUSE_QUANT_MERGE_RUNS", "shared"),
        ],
        &[
            ("TILEFUSE_QUANT_NORM_FUSED", "0"),
            ("TILEFUSE_QUANT_SILU_GATE_UP_UNFUSED", "64,512,8"),
        ],
    ];
    for vars in settings {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([name, "--exact", "--test-threads=1", "--nocapture"])
            .env(CHILD, "1")
            .envs(vars.iter().copied())
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout) + String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success() && text.contains("1 passed"),
            "{vars:?}:\n{text}"
        );
    }
}

/// [`q4_k_m_layouts_in_fused_launches_match_the_dense_step`] under this process's
/// settings.
fn q4_k_m_layouts_match_the_dense_step() {
    use std::borrow::Cow;
    use tilefuse_dsl::half::bf16;
    use tilefuse_dsl::runtime::testing::{gpu_or_skip, gpu_turn};
    use tilefuse_dsl::runtime::Device;
    use tilefuse_engine::decode::QuantWeights;
    use tilefuse_engine::Decoder;

    let f = GgufFile::open(fixture("tiny_qwen3.gguf")).unwrap();
    let cfg = f.config().unwrap();
    let mut mw = f.model_weights(&cfg).unwrap();
    let mut qw = f.quant_weights(&cfg).unwrap();
    let (kv, h, im) = (
        cfg.num_kv_heads * cfg.head_dim,
        cfg.hidden_size,
        cfg.intermediate_size,
    );
    let mut state = 0x9e37_79b9_7f4a_7c15u64;
    let mut byte = || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 24) as u8
    };
    let dense =
        |m: &PackedMatrix| Cow::Owned(m.dequantize().into_iter().map(bf16::from_f32).collect());
    for (l, q) in mw.layers.iter_mut().zip(&mut qw.layers) {
        let k = random_q4_k(kv, h, &mut byte, "k");
        let (gate, up) = (
            random_q4_k(im, h, &mut byte, "gate"),
            random_q4_k(im, h, &mut byte, "up"),
        );
        (l.k_proj, l.gate_proj, l.up_proj) = (dense(&k), dense(&gate), dense(&up));
        (q.k, q.gate, q.up) = (Some(k), Some(gate), Some(up));
        assert_eq!(q.q.as_ref().map(|m| m.ggml_type()), Some(GgmlType::Q4_K));
        assert_eq!(q.v.as_ref().map(|m| m.ggml_type()), Some(GgmlType::Q6_K));
        assert!(q.down.is_some());
    }
    use tilefuse_engine::gguf::device::{fuses_norm, merge_runs, silu_quantized_tile, MergeRuns};
    // Launches a layer beyond the dense step's one a projection: a quantizer before
    // each projection whose input the GEMV does not quantize itself, and the `v` run's
    // own launch where the runs do not merge.
    let fused = fuses_norm(cfg.q_dim() + 2 * kv, h).unwrap();
    let merged = match merge_runs().unwrap() {
        MergeRuns::Never => false,
        MergeRuns::Fused => fused,
        MergeRuns::Both { .. } | MergeRuns::Shared => true,
    };
    let silu = silu_quantized_tile(fused).unwrap().is_some();
    let extra = 2 * usize::from(!fused) + usize::from(!merged) + usize::from(!silu);
    let mut devices = vec![Device::cpu()];
    devices.extend(gpu_or_skip(
        "q4_k_m_layouts_in_fused_launches_match_the_dense_step",
    ));
    // This process's tests share one stream: another's graph capture must not
    // overlap this test's work.
    let _turn = (devices.len() > 1).then(gpu_turn);
    for dev in devices {
        let mut dense = Decoder::with_quant(&cfg, &mw, &QuantWeights::default(), &dev, 16).unwrap();
        let mut quant = Decoder::with_quant(&cfg, &mw, &qw, &dev, 16).unwrap();
        assert_eq!(
            quant.kernels_per_step(),
            dense.kernels_per_step() + extra * cfg.num_layers,
            "{dev}: fused {fused}, merged {merged}, silu {silu}"
        );
        if dev.is_cuda() {
            dense.capture().unwrap();
            quant.capture().unwrap();
        }
        let mut token = 5u32;
        for pos in 0..6 {
            let want = dense.forward(token, pos).unwrap();
            let got = quant.forward(token, pos).unwrap();
            let rel = common::rel_err(&got, &want);
            assert!(rel < 8e-2, "{dev} position {pos}: logits differ by {rel}");
            token = quant.read_state().unwrap().0;
        }
    }
}

/// `timeline` stamps every launch of a quantized layer apart (each activation quantizer
/// and each run's GEMV), logged under its block with its kernel, in step order; every
/// program writes its stamps, and none gets past its wait before the last program of
/// the launch before it has exited (on the GPU too, where launches overlap). The
/// stamped steps leave the state, and the step, as they were.
#[test]
fn a_quantized_layer_timeline_stamps_each_launch() {
    use tilefuse_dsl::runtime::testing::{gpu_or_skip, gpu_turn};
    use tilefuse_dsl::runtime::Device;
    use tilefuse_engine::decode::Block;
    use tilefuse_engine::Decoder;

    let f = GgufFile::open(fixture("tiny_qwen3.gguf")).unwrap();
    let cfg = f.config().unwrap();
    let mw = f.model_weights(&cfg).unwrap();
    let qw = f.quant_weights(&cfg).unwrap();
    let mut devices = vec![Device::cpu()];
    devices.extend(gpu_or_skip("a_quantized_layer_timeline_stamps_each_launch"));
    // This process's tests share one stream: another's graph capture must not
    // overlap this test's work.
    let _turn = (devices.len() > 1).then(gpu_turn);
    for dev in devices {
        let mut dec = Decoder::with_quant(&cfg, &mw, &qw, &dev, 16).unwrap();
        dec.set_input(3, 5).unwrap();
        dec.step_eager().unwrap();
        let want = dec.read_logits().unwrap();
        let err = dec.timeline(cfg.num_layers, 1).unwrap_err().to_string();
        assert!(err.contains(&format!("layer {}", cfg.num_layers)), "{err}");

        dec.set_input(3, 5).unwrap();
        let layer = cfg.num_layers - 1;
        let runs = dec.timeline(layer, 3).unwrap();
        assert_eq!(runs.len(), 3, "{dev}");
        for run in &runs {
            assert_eq!(run.layer, layer);
            let mut blocks: Vec<Block> = run.launches.iter().map(|l| l.block).collect();
            let launches = blocks.len();
            blocks.dedup();
            assert_eq!(
                blocks,
                [
                    Block::Qkv,
                    Block::Attention,
                    Block::Combine,
                    Block::OProj,
                    Block::GateUp,
                    Block::Down
                ],
                "{dev}: the blocks in step order"
            );
            // The fixture's gate/up has a Q4_K and a Q8_0 run (two GEMVs), and its down
            // projection a quantizer before the GEMV: more launches than blocks.
            assert!(launches > blocks.len(), "{dev}: {launches} launches");
            let kernels: Vec<(Block, &str)> =
                run.launches.iter().map(|l| (l.block, l.kernel)).collect();
            assert!(
                kernels.contains(&(Block::Down, "quantize_act"))
                    && kernels.contains(&(Block::Combine, "attention_combine_quant"))
                    && kernels
                        .iter()
                        .filter(|(b, k)| *b == Block::GateUp && k.ends_with("_gemv"))
                        .count()
                        == 2,
                "{dev}: {kernels:?}"
            );
            common::check_timeline_order(run, &dev.to_string());
        }
        assert_eq!(dec.read_state().unwrap(), (3, 5), "{dev}: state restored");
        dec.step_eager().unwrap();
        assert_eq!(dec.read_logits().unwrap(), want, "{dev}: the same step");
    }
}

/// Loading a quantized model dequantizes only what the decoder reads in bf16:
/// `model_weights_for` leaves the matrices `QuantWeights::covers` (and the quantized
/// head) empty, the decoder built from them decodes bit for bit as one built from every
/// tensor dequantized, and a matrix left out that the decoder would read in bf16 is an
/// error naming it.
#[test]
fn a_quantized_model_is_loaded_without_dequantizing_its_quantized_matrices() {
    use tilefuse_dsl::runtime::Device;
    use tilefuse_engine::Decoder;

    let (f, cfg, qw) = tiny_quant_weights();
    assert!(qw.lm_head.is_some());
    let lean = f.model_weights_for(&cfg, &qw).unwrap();
    let full = f.model_weights(&cfg).unwrap();
    let mut left_out = 0;
    for (i, (l, w)) in lean.layers.iter().zip(&full.layers).enumerate() {
        let covers = qw.covers(i);
        let matrices = [
            (&l.q_proj, &w.q_proj),
            (&l.k_proj, &w.k_proj),
            (&l.v_proj, &w.v_proj),
            (&l.o_proj, &w.o_proj),
            (&l.gate_proj, &w.gate_proj),
            (&l.up_proj, &w.up_proj),
            (&l.down_proj, &w.down_proj),
        ];
        for (part, (got, all)) in matrices.into_iter().enumerate() {
            if covers[part] {
                assert!(got.is_empty(), "layer {i} part {part}");
                left_out += 1;
            } else {
                assert_eq!(got, all, "layer {i} part {part}");
            }
        }
        assert_eq!(l.input_norm, w.input_norm);
    }
    assert!(left_out >= 4 * cfg.num_layers, "{left_out}");
    assert!(lean.lm_head.as_ref().is_some_and(|h| h.is_empty()));
    assert_eq!(lean.embed_tokens, full.embed_tokens);

    let dev = Device::cpu();
    let mut a = Decoder::with_quant(&cfg, &lean, &qw, &dev, 8).unwrap();
    let mut b = Decoder::with_quant(&cfg, &full, &qw, &dev, 8).unwrap();
    let mut token = 11u32;
    for pos in 0..3 {
        let (x, y) = (
            a.forward(token, pos).unwrap(),
            b.forward(token, pos).unwrap(),
        );
        assert!(
            x.iter().zip(&y).all(|(p, q)| p.to_bits() == q.to_bits()),
            "position {pos}"
        );
        token = a.read_state().unwrap().0;
    }

    // Without its quantized `q`, layer 0's QKV is read in bf16, and its `q_proj` was
    // left out.
    let mut dense_q = qw.clone();
    dense_q.layers[0].q = None;
    let err = Decoder::with_quant(&cfg, &lean, &dense_q, &dev, 8)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("model.layers.0.self_attn.q_proj.weight"),
        "{err}"
    );
}

/// The memory a quantized model needs is counted at its quantized sizes (plus the
/// prefill's scratch for the largest matrix in bf16, and the short chunks' int8 rows):
/// the tiny file's decoder needs
/// less than the dense one by the bf16 bytes of the matrices it reads quantized, less
/// their quantized bytes, less the scratch, and a device with room for it but not for
/// the dense decoder is refused the dense one only.
#[test]
fn a_quantized_models_memory_is_counted_at_its_quantized_size() {
    use tilefuse_engine::memory::{fits, MemoryNeed};

    let (_, cfg, qw) = tiny_quant_weights();
    let dense = MemoryNeed::for_decoder(&cfg, 64);
    let quant = MemoryNeed::for_quant_decoder(&cfg, &qw, 64);
    let (h, qd, kvd, im, v) = (
        cfg.hidden_size,
        cfg.q_dim(),
        cfg.kv_dim(),
        cfg.intermediate_size,
        cfg.vocab_size,
    );
    // Every layer's projections and the untied head are quantized in this file.
    assert!(!cfg.tie_word_embeddings);
    assert!((0..cfg.num_layers).all(|i| qw.covers(i) == [true; 7]));
    let bf16_bytes = 2 * (cfg.num_layers * ((qd + 2 * kvd) * h + h * qd + 3 * im * h) + v * h);
    assert_eq!(
        quant.weights as usize,
        dense.weights as usize - bf16_bytes + qw.device_bytes()
    );
    let scratch = 2 * ((qd + 2 * kvd) * h).max(h * qd).max(2 * im * h);
    assert_eq!(quant.workspace as usize, dense.workspace as usize + scratch);
    // The short chunks' int8 rows (32 tokens, at most the cache's 64 positions) of the
    // widest input, their gate/up output and its zero bias.
    let (rows, cols) = (32, h.max(qd).max(im).next_multiple_of(32));
    let short = rows * cols + rows * cols / 8 + 4 * rows * im + 4 * im;
    assert_eq!(quant.prefill as usize, dense.prefill as usize + short);
    assert_eq!(quant.kv_cache, dense.kv_cache);
    assert!(quant.total() < dense.total());
    let free = quant.total();
    assert!(fits("q", "gpu", &cfg, &quant, free, 2 * free).is_ok());
    assert!(fits("d", "gpu", &cfg, &dense, free, 2 * free).is_err());
}

/// A quantized GGUF file on a split model is refused by name (split models read bf16),
/// and the same file dequantized for the dense kernels splits.
#[test]
fn a_quantized_gguf_is_not_split() {
    use tilefuse_dsl::runtime::Device;
    use tilefuse_engine::{Engine, EngineOptions};

    let opts = EngineOptions {
        device: Device::cpu(),
        max_seq_len: Some(16),
        cuda_graph: false,
        tp: 2,
        ..EngineOptions::default()
    };
    let path = fixture("tiny_qwen3.gguf");
    let err = Engine::load_gguf_as(&path, opts.clone(), true)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("split model (tp 2)") && err.contains("tiny_qwen3.gguf"),
        "{err}"
    );
    assert!(Engine::load_gguf_as(&path, opts, false).is_ok());
}

/// transformers' float32 logits on each model fixture's weights as the `gguf` package
/// dequantizes them (`<fixture>.reference.json`, `scripts/make_gguf_reference.py`),
/// teacher-forced over a seeded prompt and transformers' greedy continuation: the host
/// reference decoder (bf16-rounded weights), the quantized decode step and the
/// batched prefill's last position, on the interpreter.
#[test]
fn gguf_models_decode_like_transformers_on_their_dequantized_weights() {
    use tilefuse_dsl::runtime::Device;
    use tilefuse_engine::{Engine, EngineOptions, Reference};

    for name in [
        "tiny_qwen3",
        "tiny_qwen2",
        "tiny_qwen3_q5_k",
        "tiny_qwen3_q3_k",
        "tiny_qwen3_q4_0",
    ] {
        let json = common::Json::read(&fixture(&format!("{name}.reference.json")));
        let (prompt, tokens, want) = (
            json.u32s("prompt_ids"),
            json.u32s("tokens"),
            json.f32_rows("logits"),
        );
        // transformers' own bf16 run against its f32 logits, step by step.
        let hf_bf16 = json.f32s("hf_bf16_rel_err");
        assert_eq!(tokens.len(), want.len());
        assert_eq!(hf_bf16.len(), want.len());
        let path = fixture(&format!("{name}.gguf"));
        let f = GgufFile::open(&path).unwrap();
        let cfg = f.config().unwrap();
        let mut host = Reference::new(cfg.clone(), f.model_weights(&cfg).unwrap()).unwrap();
        let opts = EngineOptions {
            device: Device::cpu(),
            max_seq_len: Some(32),
            cuda_graph: false,
            ..EngineOptions::default()
        };
        let mut engine = Engine::load(&path, opts).unwrap();
        let dec = engine.decoder().expect("one device");
        assert!(dec.is_quantized());
        let inputs: Vec<u32> = prompt
            .iter()
            .chain(&tokens[..tokens.len() - 1])
            .copied()
            .collect();
        let (mut worst_host, mut worst_step) = (0f32, 0f32);
        for (pos, &t) in inputs.iter().enumerate() {
            let host_logits = host.forward(t, pos).unwrap();
            let step_logits = dec.forward(t, pos).unwrap();
            let Some(step) = (pos + 1).checked_sub(prompt.len()) else {
                continue;
            };
            let (h, s) = (
                common::rel_err(&host_logits, &want[step]),
                common::rel_err(&step_logits, &want[step]),
            );
            let bf16 = hf_bf16[step];
            eprintln!(
                "{name} step {step}: host reference {h:.4}, quantized step {s:.4}, transformers bf16 {bf16:.4}"
            );
            // The host reference rounds the weights and every projection to bf16 as
            // transformers' bf16 run does: as close to the f32 logits as that run
            // (measured equal to three digits: 0.6-1.0% on tiny_qwen3, 1.4-2.0% on
            // tiny_qwen2, 0.6-0.9% on tiny_qwen3_q5_k, 1.2-1.4% on tiny_qwen3_q3_k,
            // 1.5-2.2% on tiny_qwen3_q4_0).
            assert!(
                h <= 1.1 * bf16 + 1e-4,
                "{name} step {step}: host {h}, bf16 {bf16}"
            );
            // The quantized step adds its int8 activations (llama.cpp's q8_1
            // scheme): measured 1.2-1.5%, 2.4-4.3%, 1.3-1.8%, 2.2-3.9% and 2.4-3.1%
            // (tiny_qwen3_q4_0, at most 1.8 times bf16's), at most 3.0
            // times bf16's (tiny_qwen3_q3_k; other draws of its weights' scale gave
            // up to 4.2 times at one step, docs/perf.md "Q3_K read as Q6_K").
            assert!(s <= 3.0 * bf16, "{name} step {step}: step {s}, bf16 {bf16}");
            worst_host = worst_host.max(h);
            worst_step = worst_step.max(s);
        }
        assert!(worst_host < 3e-2, "{name}: host reference {worst_host}");
        assert!(worst_step < 6e-2, "{name}: quantized step {worst_step}");

        // The prompt through the batched prefill: its last position's logits.
        let opts = EngineOptions {
            device: Device::cpu(),
            max_seq_len: Some(32),
            cuda_graph: false,
            ..EngineOptions::default()
        };
        let mut engine = Engine::load(&path, opts).unwrap();
        let gen = tilefuse_engine::GenerateOptions {
            max_new_tokens: 1,
            stop_at_eos: false,
            keep_logits: true,
            ..tilefuse_engine::GenerateOptions::default()
        };
        let out = engine
            .generate(&prompt, &gen, |_| std::ops::ControlFlow::Continue(()))
            .unwrap();
        assert!(out.batched_prefill);
        let rel = common::rel_err(&out.logits[0], &want[0]);
        eprintln!("{name} prefill: {rel:.4}");
        assert!(rel < 6e-2, "{name}: prefill's last position {rel}");
    }
}

/// A Llama 3 model with llama3 RoPE scaling as llama.cpp's converter writes it
/// (`tiny_llama3_scaled.gguf`: the `llama3_scaled_long` fixture's bf16 weights, q/k
/// rows permuted, the scaling as `rope_freqs.weight` divisors): the config comes back
/// with the Hugging Face checkpoint's scaling exactly, and the host reference over the
/// GGUF file decodes the fixture's 300-token prompt and greedy tokens to the same
/// logits, bit for bit, as over the checkpoint, within the reference fixtures'
/// tolerance of transformers' own.
#[test]
fn llama3_rope_scaling_comes_from_the_rope_freqs_divisors() {
    use tilefuse_engine::{Checkpoint, Reference};

    let f = GgufFile::open(fixture("tiny_llama3_scaled.gguf")).unwrap();
    let cfg = f.config().unwrap();
    let dir = common::fixtures_dir().join("llama3_scaled_long");
    let ckpt = Checkpoint::open(&dir).unwrap();
    assert_eq!(cfg.arch, Arch::Llama);
    assert!(matches!(cfg.rope_scaling, RopeScaling::Llama3 { .. }));
    assert_eq!(cfg.rope_scaling, ckpt.config.rope_scaling);
    // GGUF holds the epsilon as an f32.
    assert_eq!(
        (cfg.rope_theta, cfg.head_dim, cfg.rms_norm_eps as f32),
        (
            ckpt.config.rope_theta,
            ckpt.config.head_dim,
            ckpt.config.rms_norm_eps as f32
        )
    );
    let mut from_gguf = Reference::new(cfg.clone(), f.model_weights(&cfg).unwrap()).unwrap();
    let mut from_hf = Reference::new(ckpt.config.clone(), ckpt.model_weights().unwrap()).unwrap();
    let r = common::read_reference(&dir);
    let inputs: Vec<u32> = r.prompt_ids.iter().chain(&r.tokens).copied().collect();
    let mut worst = 0f32;
    for (pos, &t) in inputs[..inputs.len() - 1].iter().enumerate() {
        let (g, h) = (
            from_gguf.forward(t, pos).unwrap(),
            from_hf.forward(t, pos).unwrap(),
        );
        assert!(g == h, "position {pos}: the GGUF file's logits differ");
        if let Some(step) = (pos + 1).checked_sub(r.prompt_ids.len()) {
            worst = worst.max(common::rel_err(&g, &r.logits[step]));
        }
    }
    // reference_fixtures.rs measured 1.4e-2 for this fixture (PyTorch's softmax `exp`).
    assert!(worst < 2e-2, "{worst}");

    // The divisors of another rule are an error naming the tensor.
    let mut bytes = std::fs::read(fixture("tiny_llama3_scaled.gguf")).unwrap();
    let info = f.tensor("rope_freqs.weight").unwrap();
    let data = f.tensor_bytes(info).to_vec();
    let pos = bytes.windows(data.len()).position(|w| w == data).unwrap();
    // The second divisor (blended band) 1% larger.
    let v = f32::from_le_bytes(bytes[pos + 4..pos + 8].try_into().unwrap()) * 1.01;
    bytes[pos + 4..pos + 8].copy_from_slice(&v.to_le_bytes());
    let msg = config_error("rope_freqs.gguf", &bytes);
    assert!(
        msg.contains("rope_freqs.weight") && msg.contains("llama3's rule"),
        "{msg}"
    );

    // Partial rotary (fewer rotated dimensions than a head has) is refused.
    let mut bytes = std::fs::read(fixture("tiny_llama3_scaled.gguf")).unwrap();
    let key = b"llama.rope.dimension_count";
    let at = bytes.windows(key.len()).position(|w| w == key).unwrap() + key.len();
    assert_eq!(u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap()), 4);
    bytes[at + 4..at + 8].copy_from_slice(&32u32.to_le_bytes());
    let msg = config_error("partial_rotary.gguf", &bytes);
    assert!(
        msg.contains("llama.rope.dimension_count") && msg.contains("= 32"),
        "{msg}"
    );
}
