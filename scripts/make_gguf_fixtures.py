#!/usr/bin/env python3
"""Writes the GGUF fixtures under tests/fixtures/gguf/ with llama.cpp's `gguf` package
(PyPI `gguf`, tested with 0.19.0, numpy 2.x): the reference for the engine's GGUF reader
and its Q8_0 / Q3_K / Q4_K / Q5_K / Q6_K / Q4_0 / Q5_0 / IQ4_NL / IQ4_XS / Q4_1 / Q5_1
dequantization.

- `blocks.gguf`: random blocks of each type (including extreme f16 scales: the largest
  finite, subnormal, negative, zero) as tensors `<type>.blocks`, and the package's own
  dequantization of them (`gguf.quants.dequantize`) as F32 tensors `<type>.expected`.
- `tiny_qwen3.gguf`: a one-layer Qwen3-like model (hidden 256, 4/2 heads of 64,
  intermediate 256, the byte-level BPE tokenizer of tests/fixtures/tokenizer as
  `tokenizer.ggml.*`) whose matrices mix Q4_K, Q6_K and Q8_0 as Q4_K_M files do, norms
  in F32, BF16 and F16, and an untied Q6_K output matrix.
- `tiny_qwen3.json`: what the model file should yield: the config, and per tensor (by
  Hugging Face name) its ggml type, shape, the sum and sum of squares of its dequantized
  values and 32 values at seeded positions.
- `tiny_llama3_scaled.gguf`: the `llama3_scaled_long` Hugging Face fixture (Llama with
  llama3 RoPE scaling, bf16) as llama.cpp's converter writes a Llama 3.1 / 3.2 model:
  q and k rows permuted for its interleaved RoPE, and the scaling as a
  `rope_freqs.weight` tensor of per-frequency divisors (the converter's rule, with the
  config's own original context of 32: the converter reads that value from the
  config's top level, where Llama 3 configs do not put it, and falls back to 8192,
  which every real Llama 3.1 / 3.2 has). No tokenizer.
- `tiny_qwen2.gguf` / `tiny_qwen2.json`: a one-layer Qwen2-like model whose hidden size
  (320) is not a multiple of 256, as Qwen2.5-0.5B's 896 is not: llama.cpp's Q4_K_M then
  stores those rows as Q5_0 (for Q4_K) and Q8_0 (for Q6_K), and only the down
  projection (256 columns) as a K-quant (Q6_K). The O projection is Q4_0. Biases on q/k/v, tied
  embeddings (a Q5_0 table, so the LM head reads Q5_0), no `attention.key_length`.
- `tiny_qwen3_q5_k.gguf` / `tiny_qwen3_q5_k.json`: a two-layer Qwen3-like model laid out
  as llama.cpp's Q5_K_M: Q5_K q, k, O, gate and up (and down in the second layer), Q6_K v
  (and down in the first), a Q5_K embedding table and an untied Q6_K output matrix;
  intermediate 512, so that the down projections' rows hold two super-blocks.
- `tiny_qwen3_q3_k.gguf` / `tiny_qwen3_q3_k.json`: the same shapes laid out as llama.cpp's
  Q3_K_M: Q3_K q, k, gate and up, Q4_K O, v Q5_K in the first layer and Q4_K in the
  second, down Q5_K then Q4_K, a Q3_K embedding table and an untied Q6_K output matrix.
- `tiny_qwen3_iq4_xs.gguf` / `tiny_qwen3_iq4_xs.json`: the same shapes laid out as
  llama.cpp's IQ4_XS: every matrix IQ4_XS but the first layer's down projection (Q5_K),
  an IQ4_XS embedding table and an untied Q6_K output matrix.
- `tiny_qwen3_q4_0.gguf` / `tiny_qwen3_q4_0.json`: the same shapes laid out as llama.cpp's
  Q4_0: every matrix Q4_0 (rows of 256 and 512, which the engine reads in nibble words),
  the embedding table too, and an untied Q6_K output matrix.

Run from the repository root: `python3 scripts/make_gguf_fixtures.py`. Seeded: a rerun
with the same package versions writes the same bytes.
"""

import importlib.metadata
import json
import math
import os

import numpy as np
import gguf
from gguf import GGMLQuantizationType as T
from gguf.quants import dequantize, quantize

OUT = os.path.join("tests", "fixtures", "gguf")
rng = np.random.default_rng(27)

BLOCK = {T.Q8_0: (32, 34), T.Q3_K: (256, 110), T.Q4_K: (256, 144), T.Q5_K: (256, 176), T.Q6_K: (256, 210),
         T.Q4_0: (32, 18), T.Q5_0: (32, 22), T.IQ4_NL: (32, 18), T.Q4_1: (32, 20),
         T.Q5_1: (32, 24), T.IQ4_XS: (256, 136)}
# The scale-led 32-element types: `f16 d` first.
SMALL = (T.Q8_0, T.Q4_0, T.Q5_0, T.IQ4_NL)
# f16 scales that stress the dequantizer: largest finite, smallest subnormal, smallest
# normal, negative, zero, one.
EXTREME_D = np.array([65504.0, 2.0**-24, 2.0**-14, -3.5, 0.0, 1.0], dtype=np.float16)


def random_blocks(qtype, n_blocks, d_scale, extreme=True, g=None):
    """Random block bytes with sane f16 scales (random bytes there could be NaN/inf);
    with `extreme`, the first blocks take the extreme scales. `g`: the generator
    (the module's by default)."""
    g = rng if g is None else g
    _, size = BLOCK[qtype]
    b = g.integers(0, 256, size=(n_blocks, size), dtype=np.uint8)
    d = (g.standard_normal(n_blocks) * d_scale).astype(np.float16)
    dmin = (np.abs(g.standard_normal(n_blocks)) * d_scale).astype(np.float16)
    k = min(len(EXTREME_D), n_blocks) if extreme else 0
    d[:k] = EXTREME_D[:k]
    dmin[:k] = EXTREME_D[::-1][:k]
    if qtype in SMALL or qtype == T.IQ4_XS:
        b[:, 0:2] = d.view(np.uint8).reshape(-1, 2)
    elif qtype in (T.Q4_K, T.Q5_K, T.Q4_1, T.Q5_1):
        b[:, 0:2] = d.view(np.uint8).reshape(-1, 2)
        b[:, 2:4] = dmin.view(np.uint8).reshape(-1, 2)
    elif qtype == T.Q3_K:
        b[:, 108:110] = d.view(np.uint8).reshape(-1, 2)
    elif qtype == T.Q6_K:
        b[:, 208:210] = d.view(np.uint8).reshape(-1, 2)
        if extreme:
            # Extreme i8 sub-block scales in the first block.
            b[0, 192:208] = np.array([0x80, 0x7F, 0, 1, 0xFF] + [0x80] * 11, dtype=np.uint8)
    return b


def matrix(qtype, rows, cols, d_scale, g=None):
    """A [rows, cols] quantized matrix: Q8_0, Q4_0 and Q5_0 through the package's
    quantizer (from random normal weights), the K-quants as random blocks."""
    g = rng if g is None else g
    block, size = BLOCK[qtype]
    if qtype in SMALL:
        w = (g.standard_normal((rows, cols)) * d_scale * 40).astype(np.float32)
        return quantize(w, qtype)
    blocks = random_blocks(qtype, rows * cols // block, d_scale, extreme=False, g=g)
    return blocks.reshape(rows, cols // block * size)


def write_blocks():
    w = gguf.GGUFWriter(os.path.join(OUT, "blocks.gguf"), "blocks")
    for qtype, rows in [(T.Q8_0, 6), (T.Q4_K, 6), (T.Q6_K, 6)]:
        block, size = BLOCK[qtype]
        per_row = 2
        b = random_blocks(qtype, rows * per_row, 0.01).reshape(rows, per_row * size)
        name = qtype.name.lower()
        w.add_tensor(f"{name}.blocks", b, raw_dtype=qtype)
        w.add_tensor(f"{name}.expected", dequantize(b, qtype).astype(np.float32))
    # The types read as Q8_0 draw from a generator of their own, so that the blocks
    # above and tiny_qwen3.gguf keep their bytes.
    g = np.random.default_rng(270)
    for qtype in (T.Q4_0, T.Q5_0, T.IQ4_NL):
        _, size = BLOCK[qtype]
        b = random_blocks(qtype, 6 * 8, 0.01, g=g).reshape(6, 8 * size)
        name = qtype.name.lower()
        w.add_tensor(f"{name}.blocks", b, raw_dtype=qtype)
        w.add_tensor(f"{name}.expected", dequantize(b, qtype).astype(np.float32))
    # Q5_K from a third generator, for the same reason.
    g = np.random.default_rng(2705)
    b = random_blocks(T.Q5_K, 6 * 2, 0.01, g=g).reshape(6, 2 * BLOCK[T.Q5_K][1])
    w.add_tensor("q5_k.blocks", b, raw_dtype=T.Q5_K)
    w.add_tensor("q5_k.expected", dequantize(b, T.Q5_K).astype(np.float32))
    # Q4_1 and Q5_1 (`d`, then the offset `m`, which takes the `dmin` draw) from a fourth.
    g = np.random.default_rng(2751)
    for qtype in (T.Q4_1, T.Q5_1):
        _, size = BLOCK[qtype]
        b = random_blocks(qtype, 6 * 8, 0.01, g=g).reshape(6, 8 * size)
        name = qtype.name.lower()
        w.add_tensor(f"{name}.blocks", b, raw_dtype=qtype)
        w.add_tensor(f"{name}.expected", dequantize(b, qtype).astype(np.float32))
    # Q3_K from a fifth (its random scale bytes span every 6-bit scale).
    g = np.random.default_rng(2730)
    b = random_blocks(T.Q3_K, 6 * 2, 0.01, g=g).reshape(6, 2 * BLOCK[T.Q3_K][1])
    w.add_tensor("q3_k.blocks", b, raw_dtype=T.Q3_K)
    w.add_tensor("q3_k.expected", dequantize(b, T.Q3_K).astype(np.float32))
    # IQ4_XS from a sixth (random scale bytes: every 6-bit scale, `ls - 32` in -32..32).
    g = np.random.default_rng(2736)
    b = random_blocks(T.IQ4_XS, 6 * 2, 0.01, g=g).reshape(6, 2 * BLOCK[T.IQ4_XS][1])
    w.add_tensor("iq4_xs.blocks", b, raw_dtype=T.IQ4_XS)
    w.add_tensor("iq4_xs.expected", dequantize(b, T.IQ4_XS).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tokenizer():
    """The byte-level BPE tokenizer of tests/fixtures/tokenizer as GGUF metadata:
    tokens by id, token types, merges."""
    tok = json.load(open(os.path.join("tests", "fixtures", "tokenizer", "tokenizer.json")))
    vocab = dict(tok["model"]["vocab"])
    for a in tok["added_tokens"]:
        vocab[a["content"]] = a["id"]
    n_vocab = max(vocab.values()) + 1
    tokens = [None] * n_vocab
    for t, i in vocab.items():
        tokens[i] = t
    assert all(t is not None for t in tokens)
    special = {a["id"] for a in tok["added_tokens"] if a["special"]}
    types = [3 if i in special else 1 for i in range(n_vocab)]
    merges = [" ".join(m) if isinstance(m, list) else m for m in tok["model"]["merges"]]
    return tokens, types, merges


def add_metadata(w, layers, context, hidden, inter, heads, kv_heads, pre, tokens, types, merges,
                 head_dim=None):
    """The hyper-parameters (the head size only if given: Qwen2 files leave it out) and
    the byte-level BPE tokenizer's metadata."""
    w.add_block_count(layers)
    w.add_context_length(context)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    if head_dim is not None:
        w.add_key_length(head_dim)
        w.add_value_length(head_dim)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(1)
    w.add_eos_token_id(0)
    w.add_add_bos_token(False)


def record(w, expected, g, gguf_name, hf_name, data, qtype, shape):
    """Adds tensor `gguf_name` to `w` and what the engine should read of it (type,
    shape, sums and 32 values at positions drawn from `g`) to `expected[hf_name]`."""
    w.add_tensor(gguf_name, data, raw_dtype=qtype if qtype in BLOCK else None)
    if qtype in BLOCK:
        deq = dequantize(data, qtype).reshape(shape)
    else:
        deq = data.astype(np.float32).reshape(shape)
    flat = deq.reshape(-1).astype(np.float64)
    at = g.integers(0, flat.size, size=32)
    expected[hf_name] = {
        "gguf_name": gguf_name,
        "type": qtype.name,
        "shape": list(shape),
        "sum": float(flat.sum()),
        "sum_sq": float((flat * flat).sum()),
        "at": [int(i) for i in at],
        "values": [float(flat[i]) for i in at],
    }


def write_expected(name, config, expected):
    """`<name>.json`: the package's version, the config and the per-tensor records."""
    with open(os.path.join(OUT, f"{name}.json"), "w") as f:
        json.dump({"gguf_version": importlib.metadata.version("gguf"),
                   "config": config, "tensors": expected}, f, indent=1)


def finish(w, name, expected, arch, hidden, layers, heads, kv_heads, head_dim, inter, n_vocab,
           context, tied):
    """Writes model file `w` out and `<name>.json` with its config and `expected`."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    config = {
        "arch": arch, "hidden_size": hidden, "num_layers": layers, "num_heads": heads,
        "num_kv_heads": kv_heads, "head_dim": head_dim, "intermediate_size": inter,
        "vocab_size": n_vocab, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "max_position_embeddings": context, "tie_word_embeddings": tied,
        "bos_token_id": 1, "eos_token_ids": [0],
    }
    write_expected(name, config, expected)


def write_model():
    hidden, heads, kv_heads, head_dim, inter = 256, 4, 2, 64, 256
    tokens, types, merges = tokenizer()
    n_vocab = len(tokens)

    w = gguf.GGUFWriter(os.path.join(OUT, "tiny_qwen3.gguf"), "qwen3")
    add_metadata(w, 1, 4096, hidden, inter, heads, kv_heads, "gpt-2", tokens, types, merges,
                 head_dim=head_dim)

    expected = {}

    def put(gguf_name, hf_name, data, qtype, shape):
        record(w, expected, rng, gguf_name, hf_name, data, qtype, shape)

    def norm(n):
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    put("token_embd.weight", "model.embed_tokens.weight",
        matrix(T.Q8_0, n_vocab, hidden, 0.002), T.Q8_0, (n_vocab, hidden))
    p, h = "blk.0", "model.layers.0"
    put(f"{p}.attn_norm.weight", f"{h}.input_layernorm.weight",
        norm(hidden).astype(np.float32), T.F32, (hidden,))
    # BF16 through the writer: raw bytes of the bf16 rounding of random values.
    q_norm = norm(head_dim)
    q_norm_bf16 = (q_norm.view(np.uint32) >> 16).astype(np.uint16)
    w.add_tensor(f"{p}.attn_q_norm.weight", q_norm_bf16.view(np.uint8), raw_dtype=T.BF16)
    bf = (q_norm_bf16.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    at = rng.integers(0, head_dim, size=32)
    expected[f"{h}.self_attn.q_norm.weight"] = {
        "gguf_name": f"{p}.attn_q_norm.weight", "type": "BF16", "shape": [head_dim],
        "sum": float(bf.sum()), "sum_sq": float((bf * bf).sum()),
        "at": [int(i) for i in at], "values": [float(bf[i]) for i in at],
    }
    put(f"{p}.attn_k_norm.weight", f"{h}.self_attn.k_norm.weight",
        norm(head_dim).astype(np.float16), T.F16, (head_dim,))
    q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
    put(f"{p}.attn_q.weight", f"{h}.self_attn.q_proj.weight",
        matrix(T.Q4_K, q_dim, hidden, 0.0003), T.Q4_K, (q_dim, hidden))
    put(f"{p}.attn_k.weight", f"{h}.self_attn.k_proj.weight",
        matrix(T.Q8_0, kv_dim, hidden, 0.002), T.Q8_0, (kv_dim, hidden))
    put(f"{p}.attn_v.weight", f"{h}.self_attn.v_proj.weight",
        matrix(T.Q6_K, kv_dim, hidden, 0.0001), T.Q6_K, (kv_dim, hidden))
    put(f"{p}.attn_output.weight", f"{h}.self_attn.o_proj.weight",
        matrix(T.Q4_K, hidden, q_dim, 0.0003), T.Q4_K, (hidden, q_dim))
    put(f"{p}.ffn_norm.weight", f"{h}.post_attention_layernorm.weight",
        norm(hidden).astype(np.float32), T.F32, (hidden,))
    put(f"{p}.ffn_gate.weight", f"{h}.mlp.gate_proj.weight",
        matrix(T.Q4_K, inter, hidden, 0.0003), T.Q4_K, (inter, hidden))
    put(f"{p}.ffn_up.weight", f"{h}.mlp.up_proj.weight",
        matrix(T.Q8_0, inter, hidden, 0.002), T.Q8_0, (inter, hidden))
    put(f"{p}.ffn_down.weight", f"{h}.mlp.down_proj.weight",
        matrix(T.Q6_K, hidden, inter, 0.0001), T.Q6_K, (hidden, inter))
    put("output_norm.weight", "model.norm.weight", norm(hidden).astype(np.float32), T.F32, (hidden,))
    put("output.weight", "lm_head.weight",
        matrix(T.Q6_K, n_vocab, hidden, 0.0001), T.Q6_K, (n_vocab, hidden))

    finish(w, "tiny_qwen3", expected, arch="Qwen3", hidden=hidden, layers=1, heads=heads,
           kv_heads=kv_heads, head_dim=head_dim, inter=inter, n_vocab=n_vocab, context=4096,
           tied=False)


def write_qwen2_model():
    """Qwen2.5-0.5B's layout at a small size (see the module docs), from a generator of
    its own."""
    g = np.random.default_rng(2700)
    hidden, heads, kv_heads, inter, layers = 320, 5, 1, 256, 1
    head_dim = hidden // heads
    tokens, types, merges = tokenizer()
    n_vocab = len(tokens)

    w = gguf.GGUFWriter(os.path.join(OUT, "tiny_qwen2.gguf"), "qwen2")
    add_metadata(w, layers, 32768, hidden, inter, heads, kv_heads, "qwen2", tokens, types, merges)

    expected = {}

    def put(gguf_name, hf_name, qtype, shape, data):
        record(w, expected, g, gguf_name, hf_name, data, qtype, shape)

    def mat(gguf_name, hf_name, qtype, rows, cols, d_scale):
        put(gguf_name, hf_name, qtype, (rows, cols), matrix(qtype, rows, cols, d_scale, g=g))

    def vec(gguf_name, hf_name, n, mean, spread):
        put(gguf_name, hf_name, T.F32, (n,), (mean + spread * g.standard_normal(n)).astype(np.float32))

    q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
    mat("token_embd.weight", "model.embed_tokens.weight", T.Q5_0, n_vocab, hidden, 0.002)
    for i in range(layers):
        p, h = f"blk.{i}", f"model.layers.{i}"
        vec(f"{p}.attn_norm.weight", f"{h}.input_layernorm.weight", hidden, 1.0, 0.1)
        mat(f"{p}.attn_q.weight", f"{h}.self_attn.q_proj.weight", T.Q5_0, q_dim, hidden, 0.002)
        vec(f"{p}.attn_q.bias", f"{h}.self_attn.q_proj.bias", q_dim, 0.0, 0.5)
        mat(f"{p}.attn_k.weight", f"{h}.self_attn.k_proj.weight", T.Q5_0, kv_dim, hidden, 0.002)
        vec(f"{p}.attn_k.bias", f"{h}.self_attn.k_proj.bias", kv_dim, 0.0, 0.5)
        mat(f"{p}.attn_v.weight", f"{h}.self_attn.v_proj.weight", T.Q8_0, kv_dim, hidden, 0.002)
        vec(f"{p}.attn_v.bias", f"{h}.self_attn.v_proj.bias", kv_dim, 0.0, 0.1)
        # One Q4_0 matrix, as a Q4_0 file stores all of them.
        mat(f"{p}.attn_output.weight", f"{h}.self_attn.o_proj.weight", T.Q4_0, hidden, q_dim, 0.002)
        vec(f"{p}.ffn_norm.weight", f"{h}.post_attention_layernorm.weight", hidden, 1.0, 0.1)
        mat(f"{p}.ffn_gate.weight", f"{h}.mlp.gate_proj.weight", T.Q5_0, inter, hidden, 0.002)
        mat(f"{p}.ffn_up.weight", f"{h}.mlp.up_proj.weight", T.Q5_0, inter, hidden, 0.002)
        # Q4_K_M's down projections (rows of 256): Q6_K in some layers, Q4_K in others.
        mat(f"{p}.ffn_down.weight", f"{h}.mlp.down_proj.weight", T.Q6_K, hidden, inter, 0.0001)
    vec("output_norm.weight", "model.norm.weight", hidden, 1.0, 0.1)

    finish(w, "tiny_qwen2", expected, arch="Qwen2", hidden=hidden, layers=layers, heads=heads,
           kv_heads=kv_heads, head_dim=head_dim, inter=inter, n_vocab=n_vocab, context=32768,
           tied=True)


def write_q5_k_model():
    """A Q5_K_M-like Qwen3 file (see the module docs), from a generator of its own."""
    write_k_mix_model("tiny_qwen3_q5_k", np.random.default_rng(2750), embd=T.Q5_K,
                      q=T.Q5_K, v=[T.Q6_K, T.Q6_K], o=T.Q5_K, gate_up=T.Q5_K,
                      # Q5_K_M's down projections: Q6_K in some layers (llama.cpp's
                      # `use_more_bits`).
                      down=[T.Q6_K, T.Q5_K])


def write_q3_k_model():
    """A Q3_K_M-like Qwen3 file (see the module docs), from a generator of its own:
    llama.cpp's Q3_K_M gives v Q5_K in the first two layers and Q4_K after, down Q5_K in
    the first sixteenth of the layers and Q4_K after, O Q4_K."""
    write_k_mix_model("tiny_qwen3_q3_k", np.random.default_rng(2731), embd=T.Q3_K,
                      q=T.Q3_K, v=[T.Q5_K, T.Q4_K], o=T.Q4_K, gate_up=T.Q3_K,
                      down=[T.Q5_K, T.Q4_K])


def write_q4_0_model():
    """A Q4_0 Qwen3 file (see the module docs), from a generator of its own: llama.cpp's
    Q4_0 raises no matrix but the output one (Q6_K)."""
    write_k_mix_model("tiny_qwen3_q4_0", np.random.default_rng(2740), embd=T.Q4_0,
                      q=T.Q4_0, v=[T.Q4_0, T.Q4_0], o=T.Q4_0, gate_up=T.Q4_0,
                      down=[T.Q4_0, T.Q4_0])


def write_iq4_xs_model():
    """An IQ4_XS Qwen3 file (see the module docs), from a generator of its own: llama.cpp's
    IQ4_XS (without an importance matrix) gives the first eighth of the layers' down
    projections Q5_K (here the first of two) and the output matrix Q6_K."""
    write_k_mix_model("tiny_qwen3_iq4_xs", np.random.default_rng(2736), embd=T.IQ4_XS,
                      q=T.IQ4_XS, v=[T.IQ4_XS, T.IQ4_XS], o=T.IQ4_XS, gate_up=T.IQ4_XS,
                      down=[T.Q5_K, T.IQ4_XS])


def write_k_mix_model(name, g, embd, q, v, o, gate_up, down):
    """A two-layer Qwen3-like file `name` (hidden 256, intermediate 512) whose
    matrices take the given types (`v` and `down` one a layer), from generator `g`,
    with an untied Q6_K output matrix."""
    hidden, heads, kv_heads, head_dim, inter, layers = 256, 4, 2, 64, 512, 2
    tokens, types, merges = tokenizer()
    n_vocab = len(tokens)

    w = gguf.GGUFWriter(os.path.join(OUT, f"{name}.gguf"), "qwen3")
    add_metadata(w, layers, 4096, hidden, inter, heads, kv_heads, "gpt-2", tokens, types, merges,
                 head_dim=head_dim)

    expected = {}

    def put(gguf_name, hf_name, qtype, shape, data):
        record(w, expected, g, gguf_name, hf_name, data, qtype, shape)

    def mat(gguf_name, hf_name, qtype, rows, cols):
        d_scale = {T.Q3_K: 0.00175, T.Q4_K: 0.0003, T.Q5_K: 0.00015, T.Q6_K: 0.0001,
                   T.Q4_0: 0.002, T.IQ4_XS: 0.00005}[qtype]
        put(gguf_name, hf_name, qtype, (rows, cols), matrix(qtype, rows, cols, d_scale, g=g))

    def vec(gguf_name, hf_name, n):
        put(gguf_name, hf_name, T.F32, (n,), (1.0 + 0.1 * g.standard_normal(n)).astype(np.float32))

    q_dim, kv_dim = heads * head_dim, kv_heads * head_dim
    mat("token_embd.weight", "model.embed_tokens.weight", embd, n_vocab, hidden)
    for i in range(layers):
        p, h = f"blk.{i}", f"model.layers.{i}"
        vec(f"{p}.attn_norm.weight", f"{h}.input_layernorm.weight", hidden)
        vec(f"{p}.attn_q_norm.weight", f"{h}.self_attn.q_norm.weight", head_dim)
        vec(f"{p}.attn_k_norm.weight", f"{h}.self_attn.k_norm.weight", head_dim)
        mat(f"{p}.attn_q.weight", f"{h}.self_attn.q_proj.weight", q, q_dim, hidden)
        mat(f"{p}.attn_k.weight", f"{h}.self_attn.k_proj.weight", q, kv_dim, hidden)
        mat(f"{p}.attn_v.weight", f"{h}.self_attn.v_proj.weight", v[i], kv_dim, hidden)
        mat(f"{p}.attn_output.weight", f"{h}.self_attn.o_proj.weight", o, hidden, q_dim)
        vec(f"{p}.ffn_norm.weight", f"{h}.post_attention_layernorm.weight", hidden)
        mat(f"{p}.ffn_gate.weight", f"{h}.mlp.gate_proj.weight", gate_up, inter, hidden)
        mat(f"{p}.ffn_up.weight", f"{h}.mlp.up_proj.weight", gate_up, inter, hidden)
        mat(f"{p}.ffn_down.weight", f"{h}.mlp.down_proj.weight", down[i], hidden, inter)
    vec("output_norm.weight", "model.norm.weight", hidden)
    mat("output.weight", "lm_head.weight", T.Q6_K, n_vocab, hidden)

    finish(w, name, expected, arch="Qwen3", hidden=hidden, layers=layers, heads=heads,
           kv_heads=kv_heads, head_dim=head_dim, inter=inter, n_vocab=n_vocab, context=4096,
           tied=False)


def read_safetensors(path):
    """name -> (dtype, shape, raw bytes) of a safetensors file."""
    raw = open(path, "rb").read()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        a, b = t["data_offsets"]
        out[name] = (t["dtype"], t["shape"], raw[8 + n + a:8 + n + b])
    return out


def converter_permute(w, n_head):
    """llama.cpp's converter's q/k row order (`LlamaModel.permute`): each head's two
    halves interleaved."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def rope_divisors(theta, dim, factor, low, high, old):
    """The converter's `rope_freqs.weight` (`LlamaModel.generate_extra_tensors`), in f32
    as its torch tensors compute it."""
    f32 = np.float32
    freqs = f32(1.0) / (f32(theta) ** (np.arange(0, dim, 2, dtype=f32) / f32(dim)))
    out = []
    for freq in freqs:
        wavelen = f32(2 * math.pi) / freq
        if wavelen < f32(old / high):
            out.append(1.0)
        elif wavelen > f32(old / low):
            out.append(factor)
        else:
            smooth = (f32(old) / wavelen - f32(low)) / f32(high - low)
            out.append(f32(1) / ((f32(1) - smooth) / f32(factor) + smooth))
    return np.array(out, dtype=f32)


def write_llama3_scaled():
    src = os.path.join("tests", "fixtures", "llama3_scaled_long")
    cfg = json.load(open(os.path.join(src, "config.json")))
    rope = cfg["rope_parameters"]
    heads, kv_heads = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    head_dim = cfg["hidden_size"] // heads
    w = gguf.GGUFWriter(os.path.join(OUT, "tiny_llama3_scaled.gguf"), "llama")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv_heads)
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_rope_dimension_count(head_dim)
    w.add_vocab_size(cfg["vocab_size"])
    w.add_bos_token_id(cfg["bos_token_id"])
    w.add_eos_token_id(cfg["eos_token_id"][0])
    w.add_tensor("rope_freqs.weight", rope_divisors(
        rope["rope_theta"], head_dim, rope["factor"], rope["low_freq_factor"],
        rope["high_freq_factor"], rope["original_max_position_embeddings"]))
    hf_to_gguf = {
        "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
        "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
        "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
        "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
    }
    tensors = read_safetensors(os.path.join(src, "model.safetensors"))
    for name in sorted(tensors, key=lambda n: (n.count("."), n)):
        dtype, shape, raw = tensors[name]
        assert dtype == "BF16", name
        bits = np.frombuffer(raw, dtype=np.uint16).reshape(shape)
        if name == "model.embed_tokens.weight":
            g = "token_embd.weight"
        elif name == "model.norm.weight":
            g = "output_norm.weight"
        else:
            _, _, layer, rest = name.split(".", 3)
            module, kind = rest.rsplit(".", 1)
            g = f"blk.{layer}.{hf_to_gguf[module]}.{kind}"
            if module == "self_attn.q_proj":
                bits = converter_permute(bits, heads)
            elif module == "self_attn.k_proj":
                bits = converter_permute(bits, kv_heads)
        w.add_tensor(g, np.ascontiguousarray(bits).view(np.uint8).reshape(shape[:-1] + [2 * shape[-1]]),
                     raw_dtype=T.BF16)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    write_blocks()
    write_model()
    write_qwen2_model()
    write_llama3_scaled()
    write_q5_k_model()
    write_q3_k_model()
    write_q4_0_model()
    write_iq4_xs_model()
    for name in sorted(os.listdir(OUT)):
        print(name, os.path.getsize(os.path.join(OUT, name)))
