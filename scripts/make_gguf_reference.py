#!/usr/bin/env python3
"""transformers' float32 logits for the GGUF model fixtures, on their dequantized weights.

For each of tests/fixtures/gguf/tiny_qwen3.gguf, tiny_qwen2.gguf, tiny_qwen3_q5_k.gguf,
tiny_qwen3_q3_k.gguf and tiny_qwen3_q4_0.gguf:
every tensor is dequantized by llama.cpp's `gguf` package (`gguf.quants.dequantize`, the
reference for the engine's Q8_0 / Q3_K / Q4_K / Q5_K / Q6_K / Q4_0 / Q5_0 readers), saved as a float32 Hugging Face
checkpoint (config from the file's metadata), loaded fresh with
`from_pretrained(..., dtype=torch.float32)`, and run teacher-forced over a seeded
random prompt and its greedy continuation. Written to `<fixture>.reference.json`:

    {"prompt_ids": [...], "tokens": [greedy tokens], "logits": [[vocab] per token],
     "torch_version", "transformers_version", "gguf_version", "dtype": "float32"}

`logits[i]` are the logits `tokens[i]` was chosen from (the last prompt position's
first). `hf_bf16_rel_err[i]`: transformers' own bfloat16 run (the same checkpoint loaded
fresh with `dtype=torch.bfloat16`, teacher-forced on the same tokens) against those
logits, `|bf16 - f32| / |f32|`: the yardstick for the engine's bf16 paths. Checked by `engine/tests/gguf.rs`. Needs torch, transformers, safetensors and
gguf (the GPU machine has the first three; `pip install gguf`); the CPU is enough.

Usage, from the repository root: `python3 scripts/make_gguf_reference.py [--out DIR]
[--only NAME]` (`--only tiny_qwen2`: that fixture alone; each keeps its own seed).
"""

import argparse
import importlib.metadata
import json
import os
import tempfile

import numpy as np
import torch
import transformers
from gguf import GGUFReader
from gguf.quants import dequantize
from safetensors.torch import save_file

FIXTURES = os.path.join("tests", "fixtures", "gguf")
PROMPT, NEW_TOKENS = 12, 4

# GGUF tensor name -> Hugging Face name (the layer's part after `blk.N.`).
LAYER = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
TOP = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}


def hf_name(name):
    if name in TOP:
        return TOP[name]
    _, layer, module, kind = name.split(".")
    return f"model.layers.{layer}.{LAYER[module]}.{kind}"


def field(reader, key):
    f = reader.fields[key]
    v = f.parts[f.data[0]]
    if f.types[0].name == "STRING":
        return bytes(v).decode()
    return v.tolist()[0]


def checkpoint(path, out_dir):
    """The dequantized float32 checkpoint of GGUF file `path` in `out_dir`; returns the
    model class."""
    r = GGUFReader(path)
    arch = field(r, "general.architecture")
    key = lambda k: f"{arch}.{k}"
    hidden = field(r, key("embedding_length"))
    heads = field(r, key("attention.head_count"))
    tensors = {}
    for t in r.tensors:
        shape = [int(d) for d in reversed(t.shape.tolist())]
        values = dequantize(t.data, t.tensor_type).astype(np.float32).reshape(shape)
        tensors[hf_name(t.name)] = torch.from_numpy(np.ascontiguousarray(values))
    tied = "lm_head.weight" not in tensors
    common = dict(
        hidden_size=hidden,
        num_hidden_layers=field(r, key("block_count")),
        num_attention_heads=heads,
        num_key_value_heads=field(r, key("attention.head_count_kv")),
        intermediate_size=field(r, key("feed_forward_length")),
        vocab_size=tensors["model.embed_tokens.weight"].shape[0],
        tie_word_embeddings=tied,
        rope_theta=float(field(r, key("rope.freq_base"))),
        rms_norm_eps=float(field(r, key("attention.layer_norm_rms_epsilon"))),
        max_position_embeddings=field(r, key("context_length")),
    )
    if arch == "qwen3":
        config = transformers.Qwen3Config(head_dim=field(r, key("attention.key_length")), **common)
        model = transformers.Qwen3ForCausalLM
    elif arch == "qwen2":
        config = transformers.Qwen2Config(**common)
        model = transformers.Qwen2ForCausalLM
    else:
        raise SystemExit(f"{path}: architecture {arch} is not covered")
    config.save_pretrained(out_dir)
    save_file(tensors, os.path.join(out_dir, "model.safetensors"))
    return model


def reference(path, seed):
    with tempfile.TemporaryDirectory() as tmp:
        cls = checkpoint(path, tmp)
        model = cls.from_pretrained(tmp, dtype=torch.float32, attn_implementation="eager")
        model.eval()
        vocab = model.config.vocab_size
        g = torch.Generator().manual_seed(seed)
        ids = torch.randint(2, vocab, (PROMPT,), generator=g).tolist()
        prompt = list(ids)
        tokens, logits = [], []
        with torch.no_grad():
            for _ in range(NEW_TOKENS):
                out = model(torch.tensor([ids])).logits[0, -1]
                t = int(out.argmax())
                tokens.append(t)
                logits.append([float(f"{v:.6g}") for v in out.tolist()])
                ids.append(t)
        bf16 = cls.from_pretrained(tmp, dtype=torch.bfloat16, attn_implementation="eager")
        bf16.eval()
        with torch.no_grad():
            all_logits = bf16(torch.tensor([ids[:-1]])).logits[0].float()
        bf16_err = []
        for i, want in enumerate(logits):
            got = all_logits[len(prompt) - 1 + i]
            want = torch.tensor(want)
            bf16_err.append(float((got - want).norm() / want.norm()))
    return {
        "prompt_ids": prompt,
        "tokens": tokens,
        "logits": logits,
        "hf_bf16_rel_err": bf16_err,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "gguf_version": importlib.metadata.version("gguf"),
        "dtype": "float32",
    }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=FIXTURES)
    ap.add_argument("--only")
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    for seed, name in enumerate(["tiny_qwen3", "tiny_qwen2", "tiny_qwen3_q5_k", "tiny_qwen3_q3_k",
                                      "tiny_qwen3_q4_0"],
                                 start=1):
        if args.only not in (None, name):
            continue
        ref = reference(os.path.join(FIXTURES, f"{name}.gguf"), seed)
        out = os.path.join(args.out, f"{name}.reference.json")
        with open(out, "w") as f:
            json.dump(ref, f)
        print(out, os.path.getsize(out), ref["tokens"], ref["hf_bf16_rel_err"])


if __name__ == "__main__":
    main()
