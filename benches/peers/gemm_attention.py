#!/usr/bin/env python3
"""Compute-bound peers for `cargo bench --bench gemm`: the same GEMM shapes with
torch.matmul (cuBLAS) and with Triton's tutorial matmul kernel (autotuned over the
tutorial's configurations), and causal attention with torch SDPA restricted to the
flash backend, on one device in one run.

GEMM: C[M, N] = A[M, K] @ B[K, N], both operands bf16 and row-major (B is [K, N],
the layout of Triton's tutorial and of the tilefuse GEMM), f32 accumulation, bf16
output. Shapes: 4096^3, 8192^3, and Qwen3-0.6B's prefill projections at M = 512 and
2048 tokens (QKV 4096 x 1024, O 1024 x 2048, gate+up 6144 x 1024, down 1024 x 3072,
LM head 151936 x 1024, as N x K).

Attention: causal, 16 query heads over 8 KV heads (GQA), head_dim 128, bf16, at 1k,
4k and 16k tokens; tensors are [tokens, heads, head_dim] (tilefuse's layout), handed
to SDPA as transposed views. FLOPs = 2 * 2 * S^2 * D * HQ / 2.

Timing: CUDA events around each call, after a warm-up, with the L2 cache flushed
(a 256 MB write) before every call, as triton.testing.do_bench does; the median of
the repetitions. Inputs are seeded random normals (never zeros).

    python benches/peers/gemm_attention.py --json peers-gemm.json
"""

import argparse
import json
import math
import platform
import statistics
import sys

import torch

try:
    import triton
    import triton.language as tl
except ImportError:  # the torch columns still run
    triton = None
    tl = None

QWEN3_PREFILL = [
    ("qkv", 4096, 1024),
    ("o", 1024, 2048),
    ("gate_up", 6144, 1024),
    ("down", 1024, 3072),
    ("lm_head", 151936, 1024),
]


def gemm_shapes():
    """(name, M, N, K) in the order `cargo bench --bench gemm` prints them."""
    shapes = [("square", 4096, 4096, 4096), ("square", 8192, 8192, 8192)]
    for m in (512, 2048):
        for name, n, k in QWEN3_PREFILL:
            shapes.append((name, m, n, k))
    return shapes


# ---------------------------------------------------------------------------
# Triton's tutorial matmul (03-matrix-multiplication), written from its algorithm:
# grouped program ordering for L2 reuse, one BLOCK_M x BLOCK_N tile of C per
# program, a loop over K in BLOCK_K steps with masked loads, f32 accumulator.
# ---------------------------------------------------------------------------


def tutorial_configs():
    """The tutorial's CUDA autotuning space (its fp16 list and its fp8 list)."""
    if triton is None:
        return []
    c = triton.Config
    space = [
        # (BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, stages, warps)
        (128, 256, 64, 8, 3, 8),
        (64, 256, 32, 8, 4, 4),
        (128, 128, 32, 8, 4, 4),
        (128, 64, 32, 8, 4, 4),
        (64, 128, 32, 8, 4, 4),
        (128, 32, 32, 8, 4, 4),
        (64, 32, 32, 8, 5, 2),
        (32, 64, 32, 8, 5, 2),
        (128, 256, 128, 8, 3, 8),
        (256, 128, 128, 8, 3, 8),
        (256, 64, 128, 8, 4, 4),
        (64, 256, 128, 8, 4, 4),
        (128, 128, 128, 8, 4, 4),
        (128, 64, 64, 8, 4, 4),
        (64, 128, 64, 8, 4, 4),
        (128, 32, 64, 8, 4, 4),
    ]
    return [
        c(
            {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": g},
            num_stages=s,
            num_warps=w,
        )
        for bm, bn, bk, g, s, w in space
    ]


if triton is not None:

    @triton.autotune(configs=tutorial_configs(), key=["M", "N", "K"])
    @triton.jit
    def tutorial_matmul_kernel(
        a_ptr, b_ptr, c_ptr, M, N, K,
        stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
        GROUP_M: tl.constexpr,
    ):
        pid = tl.program_id(0)
        tiles_m = tl.cdiv(M, BLOCK_M)
        tiles_n = tl.cdiv(N, BLOCK_N)
        # Programs walk GROUP_M rows of tiles column by column, so consecutive programs
        # share B tiles (and A tiles within the group) in L2.
        per_group = GROUP_M * tiles_n
        group = pid // per_group
        first_m = group * GROUP_M
        group_rows = min(tiles_m - first_m, GROUP_M)
        pid_m = first_m + ((pid % per_group) % group_rows)
        pid_n = (pid % per_group) // group_rows

        # Rows and columns wrap modulo the size: edge tiles read valid (repeated)
        # data and the store is masked instead.
        rm = (pid_m * BLOCK_M + tl.arange(0, BLOCK_M)) % M
        rn = (pid_n * BLOCK_N + tl.arange(0, BLOCK_N)) % N
        rk = tl.arange(0, BLOCK_K)
        a_ptrs = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak
        b_ptrs = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kt in range(0, tl.cdiv(K, BLOCK_K)):
            k_left = K - kt * BLOCK_K
            a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=rk[:, None] < k_left, other=0.0)
            acc = tl.dot(a, b, acc)
            a_ptrs += BLOCK_K * stride_ak
            b_ptrs += BLOCK_K * stride_bk
        c = acc.to(tl.bfloat16)
        cm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        cn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        c_ptrs = c_ptr + cm[:, None] * stride_cm + cn[None, :] * stride_cn
        tl.store(c_ptrs, c, mask=(cm[:, None] < M) & (cn[None, :] < N))


def triton_matmul(a, b, c):
    m, k = a.shape
    _, n = b.shape

    def grid(meta):
        return (triton.cdiv(m, meta["BLOCK_M"]) * triton.cdiv(n, meta["BLOCK_N"]),)

    tutorial_matmul_kernel[grid](
        a, b, c, m, n, k,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
    )
    return c


# ---------------------------------------------------------------------------
# Timing
# ---------------------------------------------------------------------------


class Timer:
    """CUDA events around single calls, L2 flushed before each, median of reps."""

    def __init__(self, warmup, reps):
        self.warmup = warmup
        self.reps = reps
        self.flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")

    def median_ms(self, fn):
        for _ in range(self.warmup):
            fn()
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(self.reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(self.reps)]
        for s, e in zip(starts, ends):
            self.flush.zero_()
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def tflops(flops, ms):
    return flops / (ms * 1e-3) / 1e12


# ---------------------------------------------------------------------------
# GEMM
# ---------------------------------------------------------------------------


def run_gemms(timer, use_triton, only):
    rows = []
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name, m, n, k in gemm_shapes():
        label = f"{name} {m}x{n}x{k}"
        if only and only not in label:
            continue
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16, generator=gen)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16, generator=gen)
        a /= math.sqrt(k)
        flops = 2.0 * m * n * k
        row = {"name": name, "m": m, "n": n, "k": k, "flops": flops}
        c_torch = torch.matmul(a, b)
        ms = timer.median_ms(lambda: torch.matmul(a, b))
        row["torch_ms"] = ms
        row["torch_tflops"] = tflops(flops, ms)
        if use_triton:
            c = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
            try:
                triton_matmul(a, b, c)  # autotunes once per (M, N, K)
                torch.cuda.synchronize()
                err = ((c.float() - c_torch.float()).abs().max()
                       / c_torch.float().abs().max().clamp_min(1e-6)).item()
                row["triton_rel_err"] = err
                if not err < 2e-2:
                    raise RuntimeError(f"Triton result differs from torch: {err:.3e}")
                ms = timer.median_ms(lambda: triton_matmul(a, b, c))
                row["triton_ms"] = ms
                row["triton_tflops"] = tflops(flops, ms)
                best = tutorial_matmul_kernel.best_config
                row["triton_config"] = (
                    f"{best.kwargs['BLOCK_M']}x{best.kwargs['BLOCK_N']}x"
                    f"{best.kwargs['BLOCK_K']} s{best.num_stages} w{best.num_warps}"
                )
            except Exception as e:  # keep the torch column
                row["triton_error"] = f"{type(e).__name__}: {e}"
        rows.append(row)
        del a, b, c_torch
        torch.cuda.empty_cache()
        print_gemm_row(row)
    return rows


def print_gemm_row(r):
    label = f"{r['name']} {r['m']}x{r['n']}x{r['k']}"
    tri = (
        f"{r['triton_tflops']:8.1f} {100 * r['triton_tflops'] / r['torch_tflops']:6.1f}%"
        f"  {r.get('triton_config', '')}"
        if "triton_tflops" in r
        else f"  {r.get('triton_error', 'skipped')}"
    )
    print(f"{label:<28} {r['torch_ms']:9.3f} ms {r['torch_tflops']:8.1f} {tri}", flush=True)


# ---------------------------------------------------------------------------
# Attention
# ---------------------------------------------------------------------------


def run_attention(timer, only):
    from torch.nn.attention import SDPBackend, sdpa_kernel
    import torch.nn.functional as F

    rows = []
    hq, hkv, d = 16, 8, 128
    gen = torch.Generator(device="cuda").manual_seed(1)
    for seq in (1024, 4096, 16384):
        label = f"attention {seq}"
        if only and only not in label:
            continue
        # [tokens, heads, head_dim] as tilefuse stores them; SDPA takes [B, H, S, D]
        # views (the last dim stays contiguous, which the flash backend needs).
        q = torch.randn(1, seq, hq, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        k = torch.randn(1, seq, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        v = torch.randn(1, seq, hkv, d, device="cuda", dtype=torch.bfloat16, generator=gen)
        qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
        flops = 2.0 * 2.0 * seq * seq * d * hq / 2.0
        row = {"seq": seq, "num_heads": hq, "num_kv_heads": hkv, "head_dim": d,
               "flops": flops}
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            def gqa():
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True,
                                                      enable_gqa=True)
            try:
                gqa()
                fn, how = gqa, "enable_gqa"
            except (TypeError, RuntimeError):
                # Older torch, or a flash backend without GQA: expand K/V once, untimed.
                g = hq // hkv
                ke = kt.repeat_interleave(g, dim=1)
                ve = vt.repeat_interleave(g, dim=1)

                def fn():
                    return F.scaled_dot_product_attention(qt, ke, ve, is_causal=True)
                how = "repeat_interleave (K/V expanded before timing)"
            try:
                ms = timer.median_ms(fn)
                row.update(sdpa_ms=ms, sdpa_tflops=tflops(flops, ms), gqa=how)
            except Exception as e:
                row["sdpa_error"] = f"{type(e).__name__}: {e}"
        rows.append(row)
        if "sdpa_ms" in row:
            print(f"{label:<28} {row['sdpa_ms']:9.3f} ms {row['sdpa_tflops']:8.1f}  ({how})",
                  flush=True)
        else:
            print(f"{label:<28} {row['sdpa_error']}", flush=True)
        del q, k, v
        torch.cuda.empty_cache()
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--json", help="write the results to this file")
    p.add_argument("--warmup", type=int, default=10, help="untimed calls first")
    p.add_argument("--reps", type=int, default=50, help="timed calls (median)")
    p.add_argument("--only", default="",
                   help="substring of the row labels to run (e.g. 'lm_head', 'attention')")
    p.add_argument("--no-triton", action="store_true", help="skip the Triton column")
    p.add_argument("--no-attention", action="store_true")
    p.add_argument("--no-gemm", action="store_true")
    args = p.parse_args()
    if not torch.cuda.is_available():
        print("gemm_attention.py: skipped: no CUDA device")
        return 0
    use_triton = triton is not None and not args.no_triton
    dev = torch.cuda.get_device_name()
    print(f"device: {dev}; torch {torch.__version__}; "
          f"triton {triton.__version__ if triton else 'not installed'}")
    timer = Timer(args.warmup, args.reps)
    out = {"device": dev, "torch": torch.__version__,
           "triton": triton.__version__ if triton else None,
           "python": platform.python_version(),
           "timing": f"CUDA events, L2 flushed, median of {args.reps} after {args.warmup}"}
    if not args.no_gemm:
        print(f"{'GEMM (M x N x K)':<28} {'torch':>12} {'TFLOP/s':>8} "
              f"{'triton':>8} {'% torch':>7}  config")
        out["gemm"] = run_gemms(timer, use_triton, args.only)
    if not args.no_attention:
        print(f"{'attention (16q/8kv, d128)':<28} {'SDPA flash':>12} {'TFLOP/s':>8}")
        out["attention"] = run_attention(timer, args.only)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
