#!/usr/bin/env python3
"""Writes tests/fixtures/gguf/tiny_spm.gguf and tiny_spm.json: a SentencePiece BPE
tokenizer (Llama 1/2, TinyLlama and Mistral v0.1 GGUF files carry one,
`tokenizer.ggml.model = "llama"`) stored as GGUF metadata the way llama.cpp's
`convert_hf_to_gguf.py` stores it, and what SentencePiece itself makes of some texts.

- The tokenizer is trained here by the `sentencepiece` package (PyPI, tested with
  0.2.x) on a seeded synthetic corpus, with Llama 2's trainer settings: BPE, byte
  fallback, digits split, identity normalization, extra whitespace kept, a dummy
  prefix. Characters the corpus holds too rarely stay out of the vocabulary, so texts
  with them take the byte fallback.
- `tiny_spm.gguf` has no tensors: `tokenizer.ggml.tokens` / `scores` / `token_type`
  (normal 1, unknown 2, control 3, byte 6), the bos / eos / unk ids,
  `add_bos_token = true`, `add_space_prefix = true`, written by llama.cpp's `gguf`
  package (PyPI `gguf`, tested with 0.19.0).
- `tiny_spm.json`: per text, SentencePiece's ids with the bos id first (what
  llama.cpp's and transformers' Llama tokenizers produce with special tokens on), and
  SentencePiece's decoding of the ids after the bos.

Run from the repository root: `python3 scripts/make_spm_fixture.py`. Seeded: a rerun
with the same package versions writes the same bytes.
"""

import io
import json
import os
import random

import gguf
import sentencepiece as spm

OUT = os.path.join("tests", "fixtures", "gguf")
rng = random.Random(27)

WORDS = (
    "the of and to in is that for it as with was on be by this are from at or an "
    "decode token kernel tile program launch graph layer weight matrix block scale "
    "tensor memory bandwidth floor prefill cache attention query key value head "
    "model file format quantized byte word loop thread warp register shared global "
    "hello world tokenizer piece merge score vocabulary prefix space digit number"
).split()
# Rare characters: a few occur too seldom for the character coverage and are left to
# the byte fallback.
RARE = ["café", "naïve", "über", "日本", "語", "🦀", "ß", "ø"]


def corpus():
    lines = []
    for _ in range(3000):
        n = rng.randint(3, 14)
        words = [rng.choice(WORDS) for _ in range(n)]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words) + 1), str(rng.randint(0, 99999)))
        if rng.random() < 0.1:
            words[0] = words[0].capitalize()
        sep = "  " if rng.random() < 0.05 else " "
        line = sep.join(words)
        if rng.random() < 0.2:
            line += rng.choice([".", ",", "!", "?", ":", ";"])
        lines.append(line)
    # The rare words once each, so the coverage drops some of their characters.
    lines += RARE[:3]
    return lines


def train():
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus()),
        model_writer=model,
        model_type="bpe",
        vocab_size=512,
        byte_fallback=True,
        split_digits=True,
        allow_whitespace_only_pieces=True,
        remove_extra_whitespaces=False,
        normalization_rule_name="identity",
        add_dummy_prefix=True,
        character_coverage=0.9995,
        unk_id=0,
        bos_id=1,
        eos_id=2,
        pad_id=-1,
        num_threads=1,
        minloglevel=2,
    )
    return spm.SentencePieceProcessor(model_proto=model.getvalue())


def token_type(sp, i):
    # As convert_hf_to_gguf.py's `_create_vocab_sentencepiece` sets them.
    if sp.IsUnknown(i):
        return gguf.TokenType.UNKNOWN
    if sp.IsControl(i):
        return gguf.TokenType.CONTROL
    if sp.IsUnused(i):
        return gguf.TokenType.UNUSED
    if sp.IsByte(i):
        return gguf.TokenType.BYTE
    return gguf.TokenType.NORMAL


TEXTS = [
    "hello world",
    "Hello World",
    "the kernel decodes a token",
    "  two leading spaces and  a double space",
    "digits 12345 and 007",
    "tabs\tand\nnewlines\n",
    "punctuation: yes, no! maybe? (parens) [brackets]",
    "café naïve über",
    "日本語 and a crab 🦀",
    "unseen letters ßø",
    "quantizedtensorbandwidth",
    " ",
    "a",
]


def main():
    sp = train()
    n = sp.GetPieceSize()
    path = os.path.join(OUT, "tiny_spm.gguf")
    w = gguf.GGUFWriter(path, "llama")
    w.add_name("tiny-spm")
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list([sp.IdToPiece(i) for i in range(n)])
    w.add_token_scores([sp.GetScore(i) for i in range(n)])
    w.add_token_types([token_type(sp, i) for i in range(n)])
    w.add_unk_token_id(sp.unk_id())
    w.add_bos_token_id(sp.bos_id())
    w.add_eos_token_id(sp.eos_id())
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_add_space_prefix(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()

    cases = []
    for text in TEXTS:
        ids = sp.encode(text)
        cases.append(
            {
                "text": text,
                "ids": [sp.bos_id()] + ids,
                "pieces": [sp.IdToPiece(i) for i in ids],
                "decoded": sp.decode(ids),
            }
        )
    byte_fallback = sum(any(sp.IsByte(i) for i in c["ids"]) for c in cases)
    assert byte_fallback >= 2, "the texts should exercise the byte fallback"
    meta = {
        "vocab_size": n,
        "bos": sp.bos_id(),
        "eos": sp.eos_id(),
        "unk": sp.unk_id(),
        "sentencepiece_version": spm.__version__,
        "gguf_version": __import__("importlib.metadata").metadata.version("gguf"),
        "cases": cases,
    }
    with open(os.path.join(OUT, "tiny_spm.json"), "w") as f:
        json.dump(meta, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"{path}: {n} tokens, {len(cases)} cases ({byte_fallback} with byte fallback)")


if __name__ == "__main__":
    main()
