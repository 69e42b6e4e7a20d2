#!/usr/bin/env python3
"""Batch-1 greedy decode in PyTorch + Hugging Face transformers, for comparison
with `tilefuse bench` on the same device in the same run.

The model is one of tilefuse's presets, built from a config with seeded random
weights (no download). A random prompt of `--context` tokens is prefilled into
the KV cache, then `--tokens` greedy decode steps of batch 1 are timed, per mode:

  eager    the model's forward with a DynamicCache, token by token
  static   the forward with a StaticCache and static input buffers, not captured
           (the graph mode's step, run eagerly: a correctness check, not default)
  graph    that step captured once in a CUDA graph and replayed per token
  compile  torch.compile(model.forward, mode="reduce-overhead", fullgraph=True)
           with a StaticCache

For each mode it prints tokens/s, the median ms/token, the bytes a step reads
(weights + KV cache), the bandwidth floor from a device-to-device copy measured
in the same run, and the percentage of that floor reached.

Needs only torch and transformers (4.4x through 5.x). On a machine without CUDA,
`--preset tiny --device cpu` exercises everything except the CUDA-only modes.

    python benches/peers/hf_decode.py --preset qwen3-0.6b --json peers.json
"""

import argparse
import datetime
import gc
import importlib
import inspect
import json
import math
import platform
import statistics
import sys
import time
import traceback

import torch
import transformers

# ---------------------------------------------------------------------------
# Presets (the shapes of tilefuse's presets of the same names)
# ---------------------------------------------------------------------------


def _preset(arch, hidden, layers, heads, kv_heads, head_dim, inter, vocab, **extra):
    """One preset's shape and hyperparameters, with the Qwen3 defaults."""
    spec = dict(
        arch=arch,
        hidden_size=hidden,
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=inter,
        vocab_size=vocab,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        rope_scaling=None,
        tie_word_embeddings=True,
        qkv_bias=False,
        qk_norm=arch == "qwen3",
        max_position_embeddings=40960,
    )
    spec.update(extra)
    return spec


def _llama3_scaling(original):
    """The Llama 3 RoPE frequency scaling used by Llama 3.1 / 3.2."""
    return dict(
        rope_type="llama3",
        factor=32.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=original,
    )


PRESETS = {
    "qwen3-0.6b": _preset("qwen3", 1024, 28, 16, 8, 128, 3072, 151936),
    "llama-3.2-1b": _preset(
        "llama", 2048, 16, 32, 8, 64, 8192, 128256,
        rms_norm_eps=1e-5, rope_theta=500_000.0, rope_scaling=_llama3_scaling(8192),
        max_position_embeddings=131072,
    ),
    "tiny-qwen3": _preset("qwen3", 64, 2, 4, 2, 32, 128, 1000),
    "tiny-llama3": _preset(
        "llama", 64, 2, 2, 1, 32, 128, 1000,
        rms_norm_eps=1e-5, rope_theta=500_000.0, rope_scaling=_llama3_scaling(64),
        max_position_embeddings=4096,
    ),
    "tiny-qwen2": _preset(
        "qwen2", 64, 2, 4, 2, 16, 160, 997,
        tie_word_embeddings=False, qkv_bias=True, max_position_embeddings=32768,
    ),
}
PRESETS["tiny"] = PRESETS["tiny-qwen3"]

ALL_MODES = ("eager", "static", "graph", "compile")
DEFAULT_MODES = "eager,graph,compile"

# Standard deviation of random matrices, embeddings and biases; norm weights
# are 1 + N(0, WEIGHT_STD). The same scale as tilefuse's presets.
WEIGHT_STD = 0.02

# ---------------------------------------------------------------------------
# Model
# ---------------------------------------------------------------------------


def _accepts(fn, name):
    """Whether callable `fn` takes a parameter called `name` (not via **kwargs)."""
    try:
        return name in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


def build_config(spec):
    """The transformers config for preset `spec`, for the installed transformers.

    transformers 5 takes RoPE settings as `rope_parameters`; 4.x takes
    `rope_theta` and `rope_scaling`. Whichever the config class accepts is used.
    """
    arch = spec["arch"]
    if arch == "qwen3":
        if not hasattr(transformers, "Qwen3Config"):
            raise RuntimeError(
                f"transformers {transformers.__version__} has no Qwen3 (needs >= 4.51)")
        cfg_cls = transformers.Qwen3Config
    elif arch == "qwen2":
        cfg_cls = transformers.Qwen2Config
    else:
        cfg_cls = transformers.LlamaConfig
    kw = dict(
        hidden_size=spec["hidden_size"],
        num_hidden_layers=spec["num_layers"],
        num_attention_heads=spec["num_heads"],
        num_key_value_heads=spec["num_kv_heads"],
        intermediate_size=spec["intermediate_size"],
        vocab_size=spec["vocab_size"],
        rms_norm_eps=spec["rms_norm_eps"],
        max_position_embeddings=spec["max_position_embeddings"],
        tie_word_embeddings=spec["tie_word_embeddings"],
        hidden_act="silu",
        use_cache=True,
        attn_implementation="sdpa",
    )
    if spec["head_dim"] != spec["hidden_size"] // spec["num_heads"] or arch != "qwen2":
        kw["head_dim"] = spec["head_dim"]
    if arch == "qwen3":
        kw["attention_bias"] = spec["qkv_bias"]
    if arch == "llama":
        kw["attention_bias"] = False
        kw["mlp_bias"] = False
    if arch in ("qwen2", "qwen3"):
        kw["use_sliding_window"] = False
    rope = dict(spec["rope_scaling"] or {"rope_type": "default"})
    if _accepts(cfg_cls.__init__, "rope_parameters"):
        rope["rope_theta"] = spec["rope_theta"]
        kw["rope_parameters"] = rope
    else:
        kw["rope_theta"] = spec["rope_theta"]
        if spec["rope_scaling"] is not None:
            kw["rope_scaling"] = rope
    return cfg_cls(**kw)


def _model_class(spec):
    """The *ForCausalLM class for the preset's architecture."""
    return {
        "qwen3": "Qwen3ForCausalLM",
        "qwen2": "Qwen2ForCausalLM",
        "llama": "LlamaForCausalLM",
    }[spec["arch"]]


def expected_param_count(spec):
    """Number of parameters the preset has (tied embedding counted once)."""
    h, hd, im, v = spec["hidden_size"], spec["head_dim"], spec["intermediate_size"], spec["vocab_size"]
    qd, kvd = spec["num_heads"] * hd, spec["num_kv_heads"] * hd
    per_layer = 2 * h * qd + 2 * h * kvd + 3 * h * im + 2 * h
    if spec["qkv_bias"]:
        per_layer += qd + 2 * kvd
    if spec["qk_norm"]:
        per_layer += 2 * hd
    total = spec["num_layers"] * per_layer + v * h + h
    if not spec["tie_word_embeddings"]:
        total += v * h
    return total


@torch.no_grad()
def init_random_weights(model, seed):
    """Overwrite every parameter with seeded random values at a realistic scale.

    Matrices, embeddings and biases get N(0, WEIGHT_STD); norm weights get
    1 + N(0, WEIGHT_STD). Done here rather than left to the library's own
    initialisation so that the weights do not depend on the transformers version.
    Tied parameters appear once in `named_parameters()`, so are drawn once.
    """
    first = next(model.parameters())
    gen = torch.Generator(device=first.device)
    gen.manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.empty(p.shape, dtype=torch.float32, device=p.device)
        noise.normal_(0.0, WEIGHT_STD, generator=gen)
        if p.dim() == 1 and "norm" in name:
            noise += 1.0
        p.copy_(noise)


def build_model(spec, device, dtype, seed):
    """The preset's *ForCausalLM on `device` in `dtype`, with seeded random weights.

    The model is built in float32 on the target device, re-initialised by
    `init_random_weights`, then its parameters (not its buffers: the RoPE
    frequencies stay float32, as when a checkpoint is loaded in bf16) are cast
    to `dtype`.
    """
    torch.manual_seed(seed)
    config = build_config(spec)
    cls = getattr(transformers, _model_class(spec))
    with torch.device(device):
        model = cls(config)
    model.eval()
    init_random_weights(model, seed)
    with torch.no_grad():
        for p in model.parameters():
            p.data = p.data.to(dtype)
    check_model(model, spec)
    return model


def _rotary_inv_freq(model):
    """The inverse RoPE frequencies the model uses (first rotary module found)."""
    for name, mod in model.named_modules():
        if name.endswith("rotary_emb") and hasattr(mod, "inv_freq"):
            scale = float(getattr(mod, "attention_scaling", 1.0))
            return mod.inv_freq.detach().float().cpu(), scale
    return None, 1.0


def expected_inv_freq(spec):
    """The inverse RoPE frequencies the preset calls for (default or Llama 3)."""
    hd, theta = spec["head_dim"], spec["rope_theta"]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float64) / hd))
    rs = spec["rope_scaling"]
    if rs is None:
        return inv.float()
    factor, low, high = rs["factor"], rs["low_freq_factor"], rs["high_freq_factor"]
    orig = rs["original_max_position_embeddings"]
    out = []
    for f in inv.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < orig / high:
            out.append(f)
        elif wavelen > orig / low:
            out.append(f / factor)
        else:
            smooth = (orig / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return torch.tensor(out, dtype=torch.float32)


def check_model(model, spec):
    """Fail loudly if the built model is not the preset: parameter count, tying,
    non-zero weights, dtype; and check the RoPE frequencies took the preset's values."""
    n = sum(p.numel() for p in model.parameters())
    want = expected_param_count(spec)
    if n != want:
        raise RuntimeError(f"built model has {n} parameters, preset calls for {want}")
    tied = _is_tied(model)
    if tied != spec["tie_word_embeddings"]:
        raise RuntimeError(f"embeddings tied = {tied}, preset says {spec['tie_word_embeddings']}")
    for name, p in model.named_parameters():
        if p.dim() == 2 and not bool((p != 0).any()):
            raise RuntimeError(f"parameter {name} is all zero")
    inv, scale = _rotary_inv_freq(model)
    if inv is None:
        raise RuntimeError("no rotary embedding module with inv_freq found")
    want_inv = expected_inv_freq(spec)
    if inv.shape != want_inv.shape or not torch.allclose(inv, want_inv, rtol=1e-4, atol=0):
        raise RuntimeError(
            f"RoPE frequencies differ from the preset's (rope config not applied?): "
            f"got {inv[:4].tolist()}..., want {want_inv[:4].tolist()}...")
    if abs(scale - 1.0) > 1e-6:
        raise RuntimeError(f"RoPE attention scaling is {scale}, preset calls for 1.0")


def _is_tied(model):
    """Whether the LM head shares the embedding table's storage."""
    emb = model.get_input_embeddings().weight
    head = model.get_output_embeddings().weight
    return emb.data_ptr() == head.data_ptr()


# ---------------------------------------------------------------------------
# Bytes and bandwidth
# ---------------------------------------------------------------------------


def weight_bytes_per_token(model):
    """Bytes of the weight tensors one decode step reads.

    Every parameter counts once. The embedding table counts only when tied
    (the LM head reads all of it); an untied table is left out, since a step
    reads one row of it (negligible, not counted).
    """
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    if not _is_tied(model):
        emb = model.get_input_embeddings().weight
        total -= emb.numel() * emb.element_size()
    return total


def kv_bytes_per_token(spec, context, dtype):
    """Bytes of K and V one step reads at `context` cached tokens:
    2 * layers * kv_heads * head_dim * context * element size."""
    elem = torch.empty((), dtype=dtype).element_size()
    return 2 * spec["num_layers"] * spec["num_kv_heads"] * spec["head_dim"] * context * elem


def measure_copy_bandwidth(device, nbytes, reps=10):
    """Device-to-device copy bandwidth in bytes/s, counting read + write (2x the
    buffer) per copy; the median of `reps` copies, timed with CUDA events (on CPU,
    with a wall clock). Returns (bandwidth, median seconds, buffer bytes)."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    src.fill_(1)
    dst = torch.empty_like(src)
    for _ in range(2):
        dst.copy_(src)
    secs = []
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(reps)]
        for a, b in events:
            a.record()
            dst.copy_(src)
            b.record()
        torch.cuda.synchronize(device)
        secs = [a.elapsed_time(b) / 1e3 for a, b in events]
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            dst.copy_(src)
            secs.append(time.perf_counter() - t0)
    med = statistics.median(secs)
    del src, dst
    return 2 * nbytes / med, med, nbytes


# ---------------------------------------------------------------------------
# Caches, inputs and host-sync detection
# ---------------------------------------------------------------------------


def make_static_cache(model, max_len, device, dtype):
    """A transformers StaticCache for batch 1 and `max_len` positions.

    The constructor's parameters changed across versions (`max_batch_size` vs
    `batch_size`, `device`/`dtype` vs lazy allocation), so only the ones the
    installed version names are passed.
    """
    from transformers import StaticCache

    params = inspect.signature(StaticCache.__init__).parameters
    kw = {}
    if "config" in params:
        kw["config"] = model.config
    if "batch_size" in params:
        kw["batch_size"] = 1
    elif "max_batch_size" in params:
        kw["max_batch_size"] = 1
    kw["max_cache_len"] = max_len
    if "device" in params:
        kw["device"] = device
    if "dtype" in params:
        kw["dtype"] = dtype
    return StaticCache(**kw)


def make_dynamic_cache():
    """An empty transformers DynamicCache."""
    from transformers import DynamicCache

    return DynamicCache()


class ForwardArgs:
    """Which optional forward arguments the installed transformers takes.

    `cache_position` is passed where the forward has it (4.x, early 5.x): without
    it, older versions derive it from the cache, which reads a device value on
    the host. `logits_to_keep` (older: `num_logits_to_keep`) keeps prefill from
    computing logits for every prompt position.
    """

    def __init__(self, model):
        fwd = model.forward
        self.cache_position = _accepts(fwd, "cache_position") or _accepts(
            model.model.forward, "cache_position")
        self.keep = None
        for name in ("logits_to_keep", "num_logits_to_keep"):
            if _accepts(fwd, name):
                self.keep = name
                break


def prefill(model, fargs, prompt, cache):
    """Run the prompt through the model into `cache` in one forward; returns the
    greedy next token, shape (1, 1)."""
    n = prompt.shape[1]
    kw = dict(input_ids=prompt, past_key_values=cache, use_cache=True)
    if not isinstance(cache, transformers.DynamicCache):
        kw["position_ids"] = torch.arange(n, device=prompt.device).unsqueeze(0)
        if fargs.cache_position:
            kw["cache_position"] = torch.arange(n, device=prompt.device)
    if fargs.keep:
        kw[fargs.keep] = 1
    out = model(**kw)
    return out.logits[:, -1, :].argmax(dim=-1, keepdim=True)


class StaticInputs:
    """The static buffers one decode step reads and advances in place.

    ids (1, 1) the input token; cache_pos (1,) its position; pos_ids (1, 1) the
    same position for RoPE; mask (1, 1, 1, max_len) an additive attention mask
    (0 up to cache_pos, the dtype's minimum after); history (max_len,) the token
    chosen at each position.
    """

    def __init__(self, max_len, device, dtype):
        self.ids = torch.zeros((1, 1), dtype=torch.long, device=device)
        self.cache_pos = torch.zeros((1,), dtype=torch.long, device=device)
        self.pos_ids = torch.zeros((1, 1), dtype=torch.long, device=device)
        self.kv_idx = torch.arange(max_len, device=device)
        self.mask = torch.zeros((1, 1, 1, max_len), dtype=dtype, device=device)
        self.zero = torch.zeros((), dtype=dtype, device=device)
        self.neg = torch.full((), torch.finfo(dtype).min, dtype=dtype, device=device)
        self.history = torch.zeros((max_len + 1,), dtype=torch.long, device=device)

    def set(self, token, pos):
        """Point the buffers at `token` (a (1, 1) tensor) at position `pos`."""
        self.ids.copy_(token)
        self.cache_pos.fill_(pos)
        self.pos_ids.fill_(pos)


def static_step_fn(model, fargs, cache, bufs, explicit_mask):
    """One greedy decode step on the static buffers, advancing them in place.

    With `explicit_mask` the step writes its own 4D additive mask and passes it
    (transformers returns a 4D mask unchanged in every version, so the library's
    mask construction, which differs between versions and in some of them reads
    device values on the host, is not in the step). Without it the library
    builds the mask, as in its own compiled generation.
    """

    def step():
        kw = dict(input_ids=bufs.ids, position_ids=bufs.pos_ids,
                  past_key_values=cache, use_cache=True)
        if fargs.cache_position:
            kw["cache_position"] = bufs.cache_pos
        if explicit_mask:
            bufs.mask.copy_(torch.where(bufs.kv_idx <= bufs.cache_pos, bufs.zero, bufs.neg))
            kw["attention_mask"] = bufs.mask
        logits = model(**kw).logits
        nxt = logits[:, -1, :].argmax(dim=-1)
        bufs.history.index_copy_(0, bufs.cache_pos, nxt)
        bufs.ids.copy_(nxt.view(1, 1))
        bufs.cache_pos.add_(1)
        bufs.pos_ids.add_(1)

    return step


# Operators that make the host wait for the device (or produce shapes that
# depend on device values): a CUDA graph capture fails on them.
_SYNC_OPS = {
    "_local_scalar_dense", "item", "is_nonzero", "equal", "nonzero", "masked_select",
    "_unique", "_unique2", "unique_dim", "unique_consecutive", "repeat_interleave",
}


def find_host_syncs(fn):
    """Run `fn` once under a dispatch mode that records operators which would
    synchronise with the device (illegal inside a CUDA graph capture), plus
    copies between host and device. Returns a sorted list of operator names,
    or None where the dispatch-mode API is unavailable."""
    try:
        from torch.utils._python_dispatch import TorchDispatchMode
        from torch.utils._pytree import tree_flatten
    except ImportError:
        return None
    hits = set()

    class _Recorder(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            name = func.overloadpacket.__name__
            if name in _SYNC_OPS:
                hits.add(name)
            elif name == "index":
                idx = args[1] if len(args) > 1 else []
                if any(isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in idx or []):
                    hits.add("index(bool mask)")
            elif name in ("_to_copy", "copy_"):
                flat, _ = tree_flatten((args, kwargs))
                devs = {t.device.type for t in flat if isinstance(t, torch.Tensor)}
                dst = kwargs.get("device")
                if dst is not None:
                    devs.add(torch.device(dst).type)
                if "cpu" in devs and len(devs) > 1:
                    hits.add(f"{name}(host<->device)")
            return func(*args, **kwargs)

    try:
        with _Recorder():
            fn()
    except Exception as e:  # the check is advisory; never let it fail a mode
        print(f"    (host-sync check unavailable: {type(e).__name__}: {e})", flush=True)
        return None
    return sorted(hits)


# ---------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------


class StepTimer:
    """Per-step times: CUDA events on a GPU, a wall clock on the CPU."""

    def __init__(self, device, n):
        self.cuda = device.type == "cuda"
        self.n = n
        if self.cuda:
            self.ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                       for _ in range(n)]
        else:
            self.t = [[0.0, 0.0] for _ in range(n)]

    def start(self, i):
        """Mark the start of step `i`."""
        if self.cuda:
            self.ev[i][0].record()
        else:
            self.t[i][0] = time.perf_counter()

    def stop(self, i):
        """Mark the end of step `i`."""
        if self.cuda:
            self.ev[i][1].record()
        else:
            self.t[i][1] = time.perf_counter()

    def result(self):
        """(per-step ms list, total ms from the first start to the last stop)."""
        if self.cuda:
            torch.cuda.synchronize()
            steps = [a.elapsed_time(b) for a, b in self.ev]
            total = self.ev[0][0].elapsed_time(self.ev[-1][1])
        else:
            steps = [(b - a) * 1e3 for a, b in self.t]
            total = (self.t[-1][1] - self.t[0][0]) * 1e3
        return steps, total


def _sync(device):
    """Wait for the device."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


# ---------------------------------------------------------------------------
# Modes
# ---------------------------------------------------------------------------


class SkipMode(Exception):
    """A mode that cannot run here (reason in the message)."""


def _require_cuda(ctx):
    """Skip the mode unless it runs on a CUDA device."""
    if ctx["device"].type != "cuda":
        raise SkipMode("needs CUDA")


def run_eager(ctx):
    """eager: the forward with a DynamicCache, one token per call."""
    model, prompt, dev = ctx["model"], ctx["prompt"], ctx["device"]

    def decode(n, timer=None):
        cache = make_dynamic_cache()
        tok = prefill(model, ctx["fargs"], prompt, cache)
        out = []
        for i in range(n):
            if timer:
                timer.start(i)
            res = model(input_ids=tok, past_key_values=cache, use_cache=True)
            cache = res.past_key_values
            tok = res.logits[:, -1:, :].argmax(dim=-1)
            if timer:
                timer.stop(i)
            out.append(tok)
        _sync(dev)
        return torch.cat(out, dim=1).view(-1).tolist()

    decode(ctx["warmup"])
    timer = StepTimer(dev, ctx["tokens"])
    tokens = decode(ctx["tokens"], timer)
    return timer, tokens, {}


def _static_setup(ctx):
    """A StaticCache, the static input buffers, and a function that resets the
    cache and re-prefills it, leaving the buffers at the first decode position."""
    model, prompt, dev, dtype = ctx["model"], ctx["prompt"], ctx["device"], ctx["dtype"]
    cache = make_static_cache(model, ctx["max_len"], dev, dtype)
    bufs = StaticInputs(ctx["max_len"], dev, dtype)
    context = prompt.shape[1]
    state = {"first": True}

    def restart():
        if not state["first"]:
            cache.reset()
        state["first"] = False
        tok = prefill(model, ctx["fargs"], prompt, cache)
        bufs.set(tok, context)
        return tok

    return cache, bufs, restart


def _history_tokens(bufs, context, n):
    """The n tokens the static steps chose, starting at position `context`."""
    return bufs.history[context:context + n].tolist()


def run_static(ctx):
    """static: the graph mode's step run without capture; also reports whether
    the step would synchronise with the host (which a capture cannot)."""
    model, dev = ctx["model"], ctx["device"]
    cache, bufs, restart = _static_setup(ctx)
    step = static_step_fn(model, ctx["fargs"], cache, bufs, explicit_mask=not ctx["hf_mask"])
    restart()
    syncs = find_host_syncs(step)
    for _ in range(ctx["warmup"]):
        step()
    restart()
    timer = StepTimer(dev, ctx["tokens"])
    for i in range(ctx["tokens"]):
        timer.start(i)
        step()
        timer.stop(i)
    _sync(dev)
    extra = {"host_syncs": syncs, "mask": "library" if ctx["hf_mask"] else "explicit"}
    return timer, _history_tokens(bufs, ctx["context"], ctx["tokens"]), extra


def run_graph(ctx):
    """graph: one decode step with a StaticCache captured in a CUDA graph, replayed
    per token. The step advances its own buffers, so a token is one replay."""
    _require_cuda(ctx)
    model, dev = ctx["model"], ctx["device"]
    cache, bufs, restart = _static_setup(ctx)
    explicit = not ctx["hf_mask"]
    step = static_step_fn(model, ctx["fargs"], cache, bufs, explicit_mask=explicit)
    restart()
    syncs = find_host_syncs(step)
    if syncs:
        # A capture would fail; try the other way of building the mask.
        other = static_step_fn(model, ctx["fargs"], cache, bufs, explicit_mask=not explicit)
        restart()
        other_syncs = find_host_syncs(other)
        if other_syncs == []:
            print(f"    graph: step syncs with the host ({', '.join(syncs)}); "
                  f"using the {'library' if explicit else 'explicit'} mask instead", flush=True)
            step, syncs, explicit = other, other_syncs, not explicit
        restart()
    # Warm up on a side stream before capture (allocator, library handles).
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    restart()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            step()
    except Exception as e:
        hint = f" (host syncs in the step: {', '.join(syncs)})" if syncs else ""
        raise RuntimeError(f"CUDA graph capture failed: {e}{hint}") from e
    restart()
    for _ in range(ctx["warmup"]):
        graph.replay()
    restart()
    timer = StepTimer(dev, ctx["tokens"])
    for i in range(ctx["tokens"]):
        timer.start(i)
        graph.replay()
        timer.stop(i)
    _sync(dev)
    tokens = _history_tokens(bufs, ctx["context"], ctx["tokens"])
    del graph
    return timer, tokens, {"host_syncs": syncs, "mask": "explicit" if explicit else "library"}


def _mark_step_begin():
    """torch.compiler.cudagraph_mark_step_begin where it exists (older: under
    torch._inductor)."""
    fn = getattr(getattr(torch, "compiler", None), "cudagraph_mark_step_begin", None)
    if fn is None:
        inductor = importlib.import_module("torch._inductor")
        fn = getattr(inductor, "cudagraph_mark_step_begin", None)
    return fn or (lambda: None)


def run_compile(ctx):
    """compile: torch.compile(model.forward, mode=reduce-overhead, fullgraph=True)
    with a StaticCache; the library builds the attention mask (unless --explicit-mask)."""
    mode = ctx["compile_mode"]
    if mode == "reduce-overhead":
        _require_cuda(ctx)
    model, dev, fargs = ctx["model"], ctx["device"], ctx["fargs"]
    dynamo = importlib.import_module("torch._dynamo")
    dynamo.reset()
    try:
        importlib.import_module("torch._dynamo.utils").counters.clear()
    except Exception:
        pass
    opts = dict(fullgraph=True, backend=ctx["compile_backend"])
    if ctx["compile_backend"] == "inductor":
        opts["mode"] = None if mode == "default" else mode
    compiled = torch.compile(model.forward, **opts)
    mark = _mark_step_begin()
    cache, bufs, restart = _static_setup(ctx)
    explicit = ctx["explicit_mask_compile"]
    kw = dict(input_ids=bufs.ids, position_ids=bufs.pos_ids, past_key_values=cache, use_cache=True)
    if fargs.cache_position:
        kw["cache_position"] = bufs.cache_pos
    if explicit:
        kw["attention_mask"] = bufs.mask

    def step():
        if explicit:
            bufs.mask.copy_(torch.where(bufs.kv_idx <= bufs.cache_pos, bufs.zero, bufs.neg))
        mark()
        logits = compiled(**kw).logits
        nxt = logits[:, -1, :].argmax(dim=-1)
        bufs.history.index_copy_(0, bufs.cache_pos, nxt)
        bufs.ids.copy_(nxt.view(1, 1))
        bufs.cache_pos.add_(1)
        bufs.pos_ids.add_(1)

    restart()
    t0 = time.perf_counter()
    step()
    _sync(dev)
    compile_s = time.perf_counter() - t0
    for _ in range(max(ctx["warmup"], 3)):
        step()
    restart()
    timer = StepTimer(dev, ctx["tokens"])
    for i in range(ctx["tokens"]):
        timer.start(i)
        step()
        timer.stop(i)
    _sync(dev)
    tokens = _history_tokens(bufs, ctx["context"], ctx["tokens"])
    extra = {"first_call_s": round(compile_s, 2), "mask": "explicit" if explicit else "library"}
    try:
        from torch._dynamo.utils import counters

        extra["dynamo_unique_graphs"] = int(counters["stats"]["unique_graphs"])
    except Exception:
        pass
    return timer, tokens, extra




RUNNERS = {"eager": run_eager, "static": run_static, "graph": run_graph, "compile": run_compile}


def run_mode(name, ctx, floor_bytes, copy_bw):
    """Run one mode, catching its failure; returns its result record."""
    rec = {"mode": name}
    t0 = time.perf_counter()
    try:
        with torch.no_grad():
            timer, tokens, extra = RUNNERS[name](ctx)
        steps, total = timer.result()
        med = statistics.median(steps)
        q = sorted(steps)
        rec.update(
            status="ok",
            tokens_per_s=ctx["tokens"] / (total / 1e3),
            ms_per_token_median=med,
            ms_per_token_p10=q[int(0.1 * (len(q) - 1))],
            ms_per_token_p90=q[int(0.9 * (len(q) - 1))],
            total_ms=total,
            tokens=tokens,
        )
        if copy_bw:
            floor_ms = floor_bytes / copy_bw * 1e3
            rec["floor_ms"] = floor_ms
            rec["pct_of_floor"] = 100.0 * floor_ms / med
        rec.update(extra)
    except SkipMode as e:
        rec.update(status="skipped", error=f"skipped: {e}")
    except Exception as e:  # a failing mode must not stop the others
        tb = traceback.format_exc().strip().splitlines()
        rec.update(status="error", error=f"{type(e).__name__}: {e}".strip(),
                   traceback=tb[-12:])
    rec["wall_s"] = round(time.perf_counter() - t0, 2)
    gc.collect()
    if ctx["device"].type == "cuda":
        try:
            torch.cuda.synchronize()
            torch.cuda.empty_cache()
        except Exception:
            pass
    return rec


# ---------------------------------------------------------------------------
# Reporting
# ---------------------------------------------------------------------------


def _gb(n):
    """Bytes as a GB (1e9) string, or MB / kB when small."""
    if n >= 1e8:
        return f"{n / 1e9:.3f} GB"
    if n >= 1e5:
        return f"{n / 1e6:.2f} MB"
    return f"{n / 1e3:.1f} kB"


def print_preset_report(r, out=sys.stdout):
    """The human-readable table for one preset's results."""
    p = out.write
    p(f"\npreset {r['preset']}: {r['params'] / 1e6:.1f}M params, {r['arch']}, "
      f"tied={r['tied']}, attn={r['attn_implementation']}, context {r['context']}, "
      f"{r['tokens']} tokens, batch 1, greedy, {r['dtype']}\n")
    p(f"  bytes/token: weights {_gb(r['weight_bytes'])} + KV {_gb(r['kv_bytes'])} "
      f"= {_gb(r['bytes_per_token'])}\n")
    if r.get("floor_ms"):
        p(f"  floor: {r['floor_ms']:.3f} ms/token ({1e3 / r['floor_ms']:.0f} tok/s) "
          f"at the measured copy bandwidth\n")
    hdr = (f"  {'mode':<8} {'tok/s':>9} {'ms/tok':>8} {'p10':>7} {'p90':>7} "
           f"{'floor ms':>9} {'% floor':>8} {'= ' + r['reference_mode']:>10}  notes\n")
    p(hdr)
    ref = r["reference_tokens"]
    for m in r["modes"]:
        if m["status"] != "ok":
            p(f"  {m['mode']:<8} {m['error']}\n")
            continue
        agree = _leading_agreement(ref, m["tokens"]) if ref else None
        agree_s = f"{agree}/{len(m['tokens'])}" if agree is not None else "-"
        floor = f"{m['floor_ms']:.3f}" if "floor_ms" in m else "-"
        pct = f"{m['pct_of_floor']:.1f}" if "pct_of_floor" in m else "-"
        notes = []
        if "first_call_s" in m:
            notes.append(f"first call {m['first_call_s']}s")
        if m.get("dynamo_unique_graphs", 1) > 1:
            notes.append(f"{m['dynamo_unique_graphs']} graphs (recompiled)")
        if "mask" in m:
            notes.append(f"{m['mask']} mask")
        if m.get("host_syncs"):
            notes.append("host syncs: " + ",".join(m["host_syncs"]))
        notes.append(f"wall {m['wall_s']}s")
        p(f"  {m['mode']:<8} {m['tokens_per_s']:>9.1f} {m['ms_per_token_median']:>8.3f} "
          f"{m['ms_per_token_p10']:>7.3f} {m['ms_per_token_p90']:>7.3f} {floor:>9} {pct:>8} "
          f"{agree_s:>10}  {'; '.join(notes)}\n")


def _leading_agreement(a, b):
    """How many leading tokens two greedy sequences share."""
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def environment(device):
    """Device and library versions, for the report header and the JSON."""
    env = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC"),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "host": platform.node(),
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env["device"] = torch.cuda.get_device_name(device)
        env["cuda"] = torch.version.cuda
        env["device_memory_gib"] = round(props.total_memory / 2**30, 1)
        env["sm"] = f"{props.major}.{props.minor}"
        env["cudnn"] = torch.backends.cudnn.version()
    else:
        env["device"] = f"cpu ({platform.processor() or platform.machine()}, "\
                        f"{torch.get_num_threads()} threads)"
    return env


# ---------------------------------------------------------------------------
# Main
# ---------------------------------------------------------------------------


def parse_args(argv=None):
    """Command-line options."""
    ap = argparse.ArgumentParser(
        description="Batch-1 greedy decode of a tilefuse preset in PyTorch + transformers.")
    ap.add_argument("--preset", default="qwen3-0.6b",
                    help="preset name, or several separated by commas; one of: "
                         + ", ".join(PRESETS))
    ap.add_argument("--context", type=int, default=1024,
                    help="tokens in the KV cache before the timed steps (default 1024)")
    ap.add_argument("--tokens", type=int, default=128, help="timed decode steps (default 128)")
    ap.add_argument("--warmup", type=int, default=8,
                    help="untimed decode steps per mode before timing (default 8)")
    ap.add_argument("--modes", default=DEFAULT_MODES,
                    help=f"comma-separated, from {', '.join(ALL_MODES)} (default {DEFAULT_MODES})")
    ap.add_argument("--device", default=None, help="cuda (default when available) or cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--copy-mib", type=int, default=None,
                    help="copy-bandwidth buffer in MiB (default 1024 on CUDA, 256 on CPU)")
    ap.add_argument("--json", metavar="FILE", help="also write the results as JSON")
    ap.add_argument("--hf-mask", action="store_true",
                    help="static/graph modes: let transformers build the attention mask "
                         "instead of passing an explicit 4D mask")
    ap.add_argument("--explicit-mask-compile", action="store_true",
                    help="compile mode: pass an explicit 4D mask instead of letting "
                         "transformers build it")
    ap.add_argument("--compile-mode", default="reduce-overhead",
                    help="torch.compile mode (default reduce-overhead; 'default' lets the "
                         "compile mode run on CPU, for testing)")
    ap.add_argument("--compile-backend", default="inductor",
                    help="torch.compile backend (default inductor; eager/aot_eager for testing)")
    args = ap.parse_args(argv)
    args.presets = [p.strip() for p in args.preset.split(",") if p.strip()]
    for p in args.presets:
        if p not in PRESETS:
            ap.error(f"unknown preset {p!r}; choose from {', '.join(PRESETS)}")
    args.mode_list = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in args.mode_list:
        if m not in ALL_MODES:
            ap.error(f"unknown mode {m!r}; choose from {', '.join(ALL_MODES)}")
    if args.context < 1 or args.tokens < 1 or args.warmup < 0:
        ap.error("--context and --tokens must be >= 1, --warmup >= 0")
    return args


def bench_preset(name, args, device, dtype, copy_bw):
    """Build one preset and run every requested mode on it; returns its record."""
    spec = PRESETS[name]
    t0 = time.perf_counter()
    model = build_model(spec, device, dtype, args.seed)
    build_s = time.perf_counter() - t0
    wbytes = weight_bytes_per_token(model)
    kvbytes = kv_bytes_per_token(spec, args.context, dtype)
    gen = torch.Generator(device="cpu").manual_seed(args.seed + 1)
    prompt = torch.randint(0, spec["vocab_size"], (1, args.context), generator=gen).to(device)
    # Positions the static cache must hold: the prompt, then the longer of the
    # warm-up (at most max(warmup, 3) steps between restarts) and the timed run.
    need = args.context + max(args.tokens, args.warmup, 3) + 8
    max_len = -(-need // 16) * 16
    if max_len > spec["max_position_embeddings"]:
        raise SystemExit(f"context + tokens exceeds the preset's {spec['max_position_embeddings']}")
    ctx = dict(
        model=model, prompt=prompt, device=device, dtype=dtype, context=args.context,
        tokens=args.tokens, warmup=args.warmup, max_len=max_len, fargs=ForwardArgs(model),
        hf_mask=args.hf_mask, explicit_mask_compile=args.explicit_mask_compile,
        compile_mode=args.compile_mode, compile_backend=args.compile_backend,
    )
    rec = dict(
        preset=name, arch=_model_class(spec), params=sum(p.numel() for p in model.parameters()),
        tied=_is_tied(model), attn_implementation=getattr(model.config, "_attn_implementation", "?"),
        context=args.context, tokens=args.tokens, warmup=args.warmup, static_cache_len=max_len,
        dtype=str(dtype).replace("torch.", ""), seed=args.seed, build_s=round(build_s, 2),
        weight_bytes=wbytes, kv_bytes=kvbytes, bytes_per_token=wbytes + kvbytes,
        passes_cache_position=ctx["fargs"].cache_position,
        spec={k: v for k, v in spec.items()},
    )
    if copy_bw:
        rec["floor_ms"] = (wbytes + kvbytes) / copy_bw * 1e3
    rec["modes"] = []
    for m in args.mode_list:
        r = run_mode(m, ctx, wbytes + kvbytes, copy_bw)
        rec["modes"].append(r)
        status = r["status"] if r["status"] != "ok" else f"{r['ms_per_token_median']:.3f} ms/token"
        print(f"  [{name}] {m}: {status} ({r['wall_s']}s)", flush=True)
        if r["status"] == "error":
            print("    " + r["error"], flush=True)
    ok = [m for m in rec["modes"] if m["status"] == "ok"]
    rec["reference_mode"] = ok[0]["mode"] if ok else "-"
    rec["reference_tokens"] = ok[0]["tokens"] if ok else None
    for m in ok:
        m["agree_with_reference"] = _leading_agreement(rec["reference_tokens"], m["tokens"])
    del model, ctx
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rec


def main(argv=None):
    """Run the benchmark and print (and optionally save) the results."""
    args = parse_args(argv)
    try:
        transformers.logging.set_verbosity_error()
    except Exception:
        pass
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    if device.type == "cuda":
        # An index is required by set_device on some torch versions.
        if device.index is None:
            device = torch.device("cuda", 0)
        torch.cuda.set_device(device)
    dtype = getattr(torch, args.dtype)
    env = environment(device)
    print(f"tilefuse peers: transformers decode | {env['device']} | torch {env['torch']}"
          f"{' (CUDA ' + env['cuda'] + ')' if env.get('cuda') else ''} | "
          f"transformers {env['transformers']} | {env['date']}", flush=True)

    mib = args.copy_mib or (1024 if device.type == "cuda" else 256)
    copy_bw = None
    try:
        copy_bw, copy_s, nbytes = measure_copy_bandwidth(device, mib * 2**20)
        env["copy_bandwidth_gbs"] = copy_bw / 1e9
        env["copy_buffer_bytes"] = nbytes
        env["copy_median_ms"] = copy_s * 1e3
        print(f"copy bandwidth: {copy_bw / 1e9:.1f} GB/s (read+write, {mib} MiB buffer, "
              f"median {copy_s * 1e3:.3f} ms)", flush=True)
    except Exception as e:
        print(f"copy bandwidth: failed ({type(e).__name__}: {e}); no floor", flush=True)
        env["copy_bandwidth_error"] = str(e)
        gc.collect()

    results = []
    for name in args.presets:
        try:
            results.append(bench_preset(name, args, device, dtype, copy_bw))
        except Exception as e:
            tb = traceback.format_exc().strip().splitlines()
            print(f"  [{name}] failed: {type(e).__name__}: {e}", flush=True)
            results.append(dict(preset=name, error=f"{type(e).__name__}: {e}", traceback=tb[-12:]))

    for r in results:
        if "error" in r:
            print(f"\npreset {r['preset']}: failed: {r['error']}")
        else:
            print_preset_report(r)
    if args.json:
        doc = {"tool": "tilefuse benches/peers/hf_decode.py", "environment": env,
               "args": {k: v for k, v in vars(args).items() if k not in ("presets", "mode_list")},
               "results": results}
        with open(args.json, "w") as f:
            json.dump(doc, f, indent=1)
        print(f"\nwrote {args.json}")
    failed = any("error" in r for r in results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
