#!/usr/bin/env python3
"""Prefill of one prompt in PyTorch + Hugging Face transformers: time to first token,
for comparison with `tilefuse bench --prompt N` on the same device in the same run.

The model is one of tilefuse's presets with seeded random weights, built as
`hf_decode.py` builds it (no download). For each prompt length, one forward over a
random prompt into a fresh DynamicCache (SDPA attention, logits for the last position
only), then the greedy token on the host: that is the time to first token. Modes:

  eager    the model's forward as is
  compile  torch.compile(model.forward) (default mode; one compilation per length,
           not timed)

Timing: CUDA events around each prefill, `--warmup` untimed runs, the median of
`--reps`; the prompt is drawn once per length (seeded).

    python benches/peers/hf_prefill.py --preset qwen3-0.6b --prompts 1024 8192 --json out.json
"""

import argparse
import json
import os
import statistics
import sys

import torch
import transformers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_decode  # noqa: E402  (the presets and the model builder)


def time_prefill(fn, prompt, warmup, reps):
    """Median and min milliseconds of `fn(prompt)` (which returns the next token)."""
    for _ in range(warmup):
        fn(prompt)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        tok = fn(prompt)
        tok.item()  # the token on the host, as a generation loop needs it
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times), min(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", default="qwen3-0.6b", choices=sorted(hf_decode.PRESETS))
    ap.add_argument("--prompts", type=int, nargs="+", default=[1024, 8192])
    ap.add_argument("--modes", nargs="+", default=["eager", "compile"])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", metavar="FILE")
    args = ap.parse_args()

    device = "cuda"
    spec = hf_decode.PRESETS[args.preset]
    model = hf_decode.build_model(spec, device, torch.bfloat16, args.seed)
    fargs = hf_decode.ForwardArgs(model)
    rows = []
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"transformers {transformers.__version__}, preset {args.preset}")
    for mode in args.modes:
        fwd = model.forward if mode == "eager" else torch.compile(model.forward)

        def run(prompt, fwd=fwd):
            kw = dict(input_ids=prompt, past_key_values=transformers.DynamicCache(), use_cache=True)
            if fargs.keep:
                kw[fargs.keep] = 1
            with torch.no_grad():
                out = fwd(**kw)
            return out.logits[:, -1, :].argmax(dim=-1)

        for n in args.prompts:
            gen = torch.Generator(device="cpu").manual_seed(args.seed + n)
            prompt = torch.randint(0, spec["vocab_size"], (1, n), generator=gen).to(device)
            try:
                med, best = time_prefill(run, prompt, args.warmup, args.reps)
            except Exception as e:  # a mode that fails is reported, not fatal
                print(f"{mode:8} {n:6} tokens: failed: {type(e).__name__}: {e}")
                rows.append(dict(mode=mode, tokens=n, error=str(e)))
                continue
            print(f"{mode:8} {n:6} tokens: time to first token {med:8.2f} ms (min {best:.2f}), "
                  f"{n / med * 1e3:9.0f} tokens/s")
            rows.append(dict(mode=mode, tokens=n, ttft_ms=med, min_ms=best))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                           transformers=transformers.__version__, preset=args.preset, rows=rows), fh, indent=1)


if __name__ == "__main__":
    main()
