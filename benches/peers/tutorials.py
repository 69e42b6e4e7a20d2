"""Triton's tutorials 01, 02, 04 and 05 (vector add, fused softmax, low-memory dropout,
layer norm forward), timed the way tilefuse's `examples/tutorial_*.rs` time theirs, so
docs/perf.md ("Triton's tutorials") can list the ratios from one GPU run.

The kernels are written here from the tutorials' algorithms, at the same block sizes,
warps and problem sizes as the tilefuse examples:

    python benches/peers/tutorials.py [--json tutorials.json]

Each case: 10 warm-up launches, then the median of 50 samples of 20 back-to-back
launches between CUDA events (microseconds per launch), and GB/s of the bytes the
kernel must move (the same byte counts as the examples). Each result is checked against
PyTorch before it is timed.
"""

import argparse
import json

import torch
import triton
import triton.language as tl


@triton.jit
def add_kernel(x_ptr, y_ptr, out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    a = tl.load(x_ptr + offs, mask=mask, other=0.0)
    b = tl.load(y_ptr + offs, mask=mask, other=0.0)
    tl.store(out_ptr + offs, a + b, mask=mask)


@triton.jit
def softmax_kernel(x_ptr, out_ptr, stride, n_cols, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < n_cols
    v = tl.load(x_ptr + row * stride + cols, mask=mask, other=-float("inf"))
    e = tl.exp(v - tl.max(v, axis=0))
    tl.store(out_ptr + row * stride + cols, e / tl.sum(e, axis=0), mask=mask)


@triton.jit
def dropout_kernel(x_ptr, out_ptr, n, p, seed, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs, mask=mask, other=0.0)
    keep = tl.rand(seed, offs) > p
    tl.store(out_ptr + offs, tl.where(keep, v / (1 - p), 0.0), mask=mask)


@triton.jit
def layer_norm_kernel(x_ptr, y_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, n, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for off in range(0, n, BLOCK):
        c = off + cols
        acc += tl.load(x_ptr + row * n + c, mask=c < n, other=0.0).to(tl.float32)
    mean = tl.sum(acc, axis=0) / n
    var = tl.zeros([BLOCK], dtype=tl.float32)
    for off in range(0, n, BLOCK):
        c = off + cols
        d = tl.where(c < n, tl.load(x_ptr + row * n + c, mask=c < n, other=0.0).to(tl.float32) - mean, 0.0)
        var += d * d
    rstd = 1 / tl.sqrt(tl.sum(var, axis=0) / n + eps)
    tl.store(mean_ptr + row, mean)
    tl.store(rstd_ptr + row, rstd)
    for off in range(0, n, BLOCK):
        c = off + cols
        m = c < n
        v = tl.load(x_ptr + row * n + c, mask=m, other=0.0).to(tl.float32)
        g = tl.load(w_ptr + c, mask=m, other=0.0).to(tl.float32)
        h = tl.load(b_ptr + c, mask=m, other=0.0).to(tl.float32)
        tl.store(y_ptr + row * n + c, ((v - mean) * rstd * g + h).to(tl.float16), mask=m)


def time_us(launch):
    """Median microseconds per launch: 10 warm-ups, 50 samples of 20 launches."""
    for _ in range(10):
        launch()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    samples = []
    for _ in range(50):
        start.record()
        for _ in range(20):
            launch()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3 / 20)
    samples.sort()
    return samples[len(samples) // 2]


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args()
    dev = torch.device("cuda")
    torch.manual_seed(0)
    rows = []

    def report(what, size, us, nbytes):
        gbs = nbytes / (us * 1e-6) / 1e9
        print(f"{what:<12} {size:<14} {us:>9.2f} us  {gbs:>7.1f} GB/s")
        rows.append({"tutorial": what, "size": size, "us": us, "gb_per_s": gbs})

    for n in [1 << 12, 1 << 16, 1 << 20, 1 << 24, 1 << 26]:
        x, y = torch.rand(n, device=dev) * 2 - 1, torch.rand(n, device=dev) * 2 - 1
        out = torch.empty_like(x)
        grid = (triton.cdiv(n, 1024),)
        launch = lambda: add_kernel[grid](x, y, out, n, BLOCK=1024, num_warps=4)
        launch()
        torch.testing.assert_close(out, x + y)
        report("vector_add", f"n={n}", time_us(launch), 3 * 4 * n)

    for r, c in [(4096, 256), (4096, 781), (4096, 1024), (4096, 2048), (4096, 4096)]:
        x = (torch.rand(r, c, device=dev) * 2 - 1) * 8
        out = torch.empty_like(x)
        block = 256 if c <= 256 else 1024 if c <= 1024 else 4096
        launch = lambda: softmax_kernel[(r,)](x, out, c, c, BLOCK=block, num_warps=8)
        launch()
        torch.testing.assert_close(out, torch.softmax(x, dim=1))
        report("softmax", f"{r}x{c}", time_us(launch), 2 * 4 * r * c)

    for n in [1 << 16, 1 << 20, 1 << 24, 1 << 26]:
        x = torch.rand(n, device=dev) * 2 - 1
        out = torch.empty_like(x)
        grid = (triton.cdiv(n, 1024),)
        seed = 123456789
        launch = lambda: dropout_kernel[grid](x, out, n, 0.5, seed, BLOCK=1024, num_warps=4)
        launch()
        kept = (out != 0).float().mean().item()
        assert abs(kept - 0.5) < 0.05, kept
        torch.testing.assert_close(out[out != 0], (x / 0.5)[out != 0])
        report("dropout", f"n={n}", time_us(launch), 2 * 4 * n)

    for r, n in [(4096, 1024), (4096, 4096), (4096, 8192), (4096, 16384)]:
        x = ((torch.rand(r, n, device=dev) * 2 - 1) * 2 + 0.5).half()
        w = (1 + (torch.rand(n, device=dev) * 2 - 1) / 2).half()
        b = (torch.rand(n, device=dev) * 2 - 1).half()
        y = torch.empty_like(x)
        mean = torch.empty(r, device=dev)
        rstd = torch.empty(r, device=dev)
        launch = lambda: layer_norm_kernel[(r,)](x, y, w, b, mean, rstd, n, 1e-5, BLOCK=1024, num_warps=8)
        launch()
        ref = torch.nn.functional.layer_norm(x.float(), (n,), w.float(), b.float(), 1e-5).half()
        torch.testing.assert_close(y, ref, atol=5e-3, rtol=0)
        report("layer_norm", f"{r}x{n}", time_us(launch), 2 * 2 * r * n)

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "triton": triton.__version__, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
