"""Column sums on CUDA: ATen's one-pass `x.sum(0)` against two float32 sums as ATen ops (what
split-column-sum, passes/SplitColumnSum.h, wrote until the sixteenth session) and hintbackend::column_sum
(what it writes now: the same sums in two kernels of ours), side by side in one process. Prints, per shape and dtype, the memory
each allocates beyond its result (torch.cuda.max_memory_allocated above what was allocated before), the
time per call, and the error against float64.

    python benchmarks/column_sum.py [--iters 50]
"""

from __future__ import annotations

import argparse
import time

import torch

import hintbackend


def split_rows(n: int) -> int:
    """The pass's rule: the smallest r of 32 .. 256 dividing n with at most 1024 rows per partial sum."""
    for r in (32, 64, 128, 256):
        if n % r == 0 and n // r <= 1024:
            return r
    return 0


def two_sums(x: torch.Tensor, r: int) -> torch.Tensor:
    n, c = x.shape
    part = x.view(r, n // r, c).sum(1, dtype=torch.float32)
    return part.sum(0, keepdim=True, dtype=torch.float32).to(x.dtype)


def extra_mib(fn) -> float:
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base - out.numel() * out.element_size()) / 2**20


def ms(fn, iters: int) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / iters * 1e3


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--iters", type=int, default=50)
    args = p.parse_args()
    hintbackend._core()  # registers hintbackend::column_sum
    torch.manual_seed(0)
    print(f"column sums on {torch.cuda.get_device_name()}, torch {torch.__version__}: extra MiB / ms per call / "
          "relative error against float64")
    print(f"{'dtype':9} {'rows x cols':>14} {'one-pass':>28} {'two sums (r)':>34} {'column_sum':>28}")
    for dtype in (torch.bfloat16, torch.float32):
        for n, c in [(2048, 512), (2048, 2048), (4096, 512), (4096, 2048), (8192, 4096), (16384, 1024),
                     (4096, 30522)]:
            x = torch.randn(n, c, device="cuda", dtype=dtype)
            ref = x.double().sum(0, keepdim=True)
            r = split_rows(n)

            def err(y):
                return ((y.double() - ref).norm() / ref.norm()).item()

            one = lambda: x.sum(0, keepdim=True)  # noqa: E731
            two = lambda: two_sums(x, r)  # noqa: E731
            ours = lambda: torch.ops.hintbackend.column_sum(x, 1, True, r, x.dtype)  # noqa: E731
            print(f"{str(dtype)[6:]:9} {n:>7} x {c:<6} {extra_mib(one):7.2f} / {ms(one, args.iters):.4f} / {err(one()):.1e}"
                  f"   {extra_mib(two):7.2f} / {ms(two, args.iters):.4f} / {err(two()):.1e} ({r})"
                  f"   {extra_mib(ours):7.2f} / {ms(ours, args.iters):.4f} / {err(ours()):.1e}")


if __name__ == "__main__":
    main()
