#!/usr/bin/env python3
"""Writes a random-weight Qwen3 model at a `tilefuse bench` preset's shape as an F16 GGUF
file, for llama.cpp's `llama-quantize` and `llama-bench` (scripts/device/llama_cpp_peer.sh):
the peer measurement (docs/gpu-testing.md, "Peers on the same machine").

    python3 llama_cpp_model.py qwen3-0.6b OUT.gguf

Matrices are N(0, 0.02) (the presets' `WEIGHT_STD`), norms ones. The tokenizer is
llama.cpp's `none` model with `qwen3.vocab_size` dummy tokens: `llama-bench` draws random
token ids and needs no text. Uses llama.cpp's own `gguf` package (gguf-py).
"""

import sys

import numpy as np
import gguf

# hidden, layers, heads, kv heads, head dim, intermediate, vocab, tied embeddings
# (engine/src/preset.rs).
PRESETS = {
    "qwen3-0.6b": (1024, 28, 16, 8, 128, 3072, 151936, True),
    "qwen3-8b": (4096, 36, 32, 8, 128, 12288, 151936, False),
}


def main():
    name, path = sys.argv[1], sys.argv[2]
    hidden, layers, heads, kv, hd, inter, vocab, tied = PRESETS[name]
    rng = np.random.default_rng(27)

    def matrix(rows, cols):
        # Drawn in f32 row blocks to bound host memory at 8B.
        out = np.empty((rows, cols), dtype=np.float16)
        step = max(1, (1 << 24) // cols)
        for r in range(0, rows, step):
            n = min(step, rows - r)
            out[r : r + n] = (rng.standard_normal((n, cols), dtype=np.float32) * 0.02).astype(np.float16)
        return out

    ones = lambda n: np.ones(n, dtype=np.float32)  # noqa: E731
    w = gguf.GGUFWriter(path, "qwen3")
    w.add_block_count(layers)
    w.add_context_length(40960)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(inter)
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_key_length(hd)
    w.add_value_length(hd)
    w.add_rope_freq_base(1000000.0)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_vocab_size(vocab)
    w.add_tokenizer_model("none")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    w.add_tensor("token_embd.weight", matrix(vocab, hidden))
    for i in range(layers):
        p = f"blk.{i}"
        w.add_tensor(f"{p}.attn_norm.weight", ones(hidden))
        w.add_tensor(f"{p}.attn_q.weight", matrix(heads * hd, hidden))
        w.add_tensor(f"{p}.attn_k.weight", matrix(kv * hd, hidden))
        w.add_tensor(f"{p}.attn_v.weight", matrix(kv * hd, hidden))
        w.add_tensor(f"{p}.attn_q_norm.weight", ones(hd))
        w.add_tensor(f"{p}.attn_k_norm.weight", ones(hd))
        w.add_tensor(f"{p}.attn_output.weight", matrix(hidden, heads * hd))
        w.add_tensor(f"{p}.ffn_norm.weight", ones(hidden))
        w.add_tensor(f"{p}.ffn_gate.weight", matrix(inter, hidden))
        w.add_tensor(f"{p}.ffn_up.weight", matrix(inter, hidden))
        w.add_tensor(f"{p}.ffn_down.weight", matrix(hidden, inter))
    w.add_tensor("output_norm.weight", ones(hidden))
    if not tied:
        w.add_tensor("output.weight", matrix(vocab, hidden))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


if __name__ == "__main__":
    main()
