"""The row softmax kernels (backend/runtime/RowSoftmax.h) against the ATen op chains they replace, at
attention's shapes, side by side: ms, GB/s (bytes each must move: one read of every input, one write
of every result) and the chain/kernel time ratio.

    python benchmarks/row_softmax.py [--rows 262144 --n 4096] [--dtype bfloat16]
"""

from __future__ import annotations

import argparse

import torch

import hintbackend


def timed(fn, reps=20):
    fn()
    torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) / reps


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--rows", type=int, default=4 * 4 * 4096, help="rows (a DFS slice of 4 heads of B=4: 65536)")
    p.add_argument("--n", type=int, default=4096)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    args = p.parse_args()
    hintbackend._core()
    ops = torch.ops.hintbackend
    dt = getattr(torch, args.dtype)
    x = torch.randn(args.rows, args.n, device="cuda").to(dt)
    g = torch.randn(args.rows, args.n, device="cuda").to(dt)
    y = ops.row_softmax(x, 0.125, torch.float32)
    gw, xw = g.clone(), x.clone()
    e, f = x.element_size(), 4
    cases = {
        "forward, T out (row_softmax)": (
            lambda: ops.row_softmax(x, 0.125, dt),
            lambda: torch._softmax((x * 0.125).float(), -1, False).to(dt), 2 * e),
        "forward, f32 + T out (row_softmax2)": (
            lambda: ops.row_softmax2(x, 0.125),
            lambda: (lambda s: (s, s.to(dt)))(torch._softmax((x * 0.125).float(), -1, False)), 2 * e + f),
        "backward, saved y (row_softmax_backward)": (
            lambda: ops.row_softmax_backward(g, y, 0.125, dt),
            lambda: torch._softmax_backward_data(g.float(), y, -1, torch.float32).to(dt) * 0.125, 2 * e + f),
        # In place: grad becomes ds and x becomes P (repeated on the same work copies: still finite).
        "backward, recomputed y + P, in place (recompute_backward_)": (
            lambda: ops.row_softmax_recompute_backward_(gw, xw, 0.125, 0.125),
            lambda: (torch._softmax_backward_data(
                g.float(), torch._softmax((x * 0.125).float(), -1, False), -1, torch.float32).to(dt) * 0.125,
                torch._softmax((x * 0.125).float(), -1, False).to(dt)), 4 * e),
    }
    print(f"row softmax kernels, {args.rows} rows x {args.n} {args.dtype} on {torch.cuda.get_device_name()}")
    print(f"{'op':<50} {'kernel ms':>10} {'GB/s':>8} {'chain ms':>10} {'chain/kernel':>13}")
    for name, (kernel, chain, bytes_per) in cases.items():
        k, c = timed(kernel), timed(chain)
        print(f"{name:<50} {k:>10.3f} {args.rows * args.n * bytes_per / k / 1e6:>8.0f} {c:>10.3f} {c / k:>13.2f}")
    # Accuracy on 4096 fresh rows: each result against a float64 reference of the chain it replaces.
    xs, gs = (torch.randn(4096, args.n, device="cuda").mul(4).to(dt) for _ in range(2))
    v64 = (xs * 0.125).double()  # x * scale rounds to the input dtype first, in the chain as in the kernel
    y64 = torch.softmax(v64, -1)
    ys = ops.row_softmax(xs, 0.125, torch.float32)
    g64 = gs.double()
    r64 = ys.double() * (g64 - (g64 * ys.double()).sum(-1, keepdim=True))
    checks = {
        "row_softmax, float32 result": (ops.row_softmax(xs, 0.125, torch.float32),
                                        torch._softmax((xs * 0.125).float(), -1, False), y64),
        f"row_softmax, {args.dtype} result": (ops.row_softmax(xs, 0.125, dt),
                                              torch._softmax((xs * 0.125).float(), -1, False).to(dt), y64),
        "row_softmax_backward, float32 gradient": (
            ops.row_softmax_backward(gs, ys, None, torch.float32),
            torch._softmax_backward_data(gs.float(), ys, -1, torch.float32), r64),
    }
    print(f"{'max |error| against float64':<50} {'kernel':>10} {'chain':>10}")
    for name, (k, c, ref) in checks.items():
        print(f"{name:<50} {(k.double() - ref).abs().max().item():>10.2e} {(c.double() - ref).abs().max().item():>10.2e}")


if __name__ == "__main__":
    main()
