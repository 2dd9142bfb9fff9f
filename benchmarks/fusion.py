"""Fused pointwise kernels against eager, side by side in one process: accuracy against a float64
reference and time per call on a large tensor, for a chain of elementwise ops ending in each fusable op.

    python benchmarks/fusion.py [--device cuda] [--n 16777216]

f(x, b) = op(x * 1.25 + b) * 0.5 in float32 (4 ops, 3 of them fused with `op`). Columns: max abs error
of eager f32 and of hintbackend against the same function in float64; median ms per call of eager and
hintbackend; effective GB/s of hintbackend (bytes of x, b and the result once).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
from test_fusion import UNARY  # noqa: E402  (the tested ops)


def ms(fn, sync, reps=20) -> float:
    for _ in range(3):
        fn()
    sync()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    p.add_argument("--n", type=int, default=1 << 24)
    args = p.parse_args()
    dev = args.device
    sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
    torch.manual_seed(0)
    x = torch.randn(args.n // 1024, 1024, device=dev)
    b = torch.randn(1024, device=dev)
    rows = []
    for name in sorted(UNARY):
        op = UNARY[name]

        def f(x, b, op=op):
            return op(x * 1.25 + b) * 0.5

        torch._dynamo.reset()
        c = torch.compile(f, backend="hintbackend", options={"strict": True})
        with torch.no_grad():
            ref = f(x.double(), b.double())
            e_err = (f(x, b).double() - ref).abs().max().item()
            h_err = (c(x, b).double() - ref).abs().max().item()
            t_e = ms(lambda: f(x, b), sync)
            t_h = ms(lambda: c(x, b), sync)
        gbs = (x.numel() * 2 + b.numel()) * 4 / (t_h * 1e-3) / 1e9
        rows.append((name, e_err, h_err, t_e, t_h, gbs))
    print(f"fused pointwise, f(x, b) = op(x * 1.25 + b) * 0.5, x f32[{x.shape[0]}, 1024] on {dev}, "
          f"torch {torch.__version__}")
    print(f"{'op':<12} {'eager err':>10} {'hb err':>10} {'eager ms':>9} {'hb ms':>8} {'eager/hb':>8} {'hb GB/s':>8}")
    for name, ee, he, te, th, g in rows:
        print(f"{name:<12} {ee:>10.2e} {he:>10.2e} {te:>9.3f} {th:>8.3f} {te / th:>8.2f} {g:>8.0f}")


if __name__ == "__main__":
    main()
