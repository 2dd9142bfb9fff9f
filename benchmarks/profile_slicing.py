"""Where the time of BFS and DFS goes: the CUDA kernels of one step of the slicing benchmark's region
(benchmarks/slicing.py), summed by kernel name, side by side, then by kind (matrix products, row
kernels, the rest) with the GPU's idle time inside the step (the span from the first kernel's start
to the last one's end, less the time some kernel ran).

    python benchmarks/profile_slicing.py [--slices 16] [--b 4 --h 16 --s 4096 --d 128] [--region plain]
                                         [--forward-only]
"""

from __future__ import annotations

import argparse
import collections

import torch
from torch.profiler import ProfilerActivity, profile

from attention_shape import add_shape_args
from slicing import REGIONS, make, make_step


def kind(name: str) -> str:
    low = name.lower()
    if any(k in low for k in ("gemm", "xmma", "cutlass", "nvjet", "sm90_", "cublas")):
        return "matmul"
    if "hb::cuda" in name or "forward_kernel" in name or "backward_kernel" in name:
        return "row kernels"
    return "other"


def kernel_times(fn, q, k, v, train):
    step = make_step(fn, q, k, v, train)
    step()
    step()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step()
        torch.cuda.synchronize()
    totals, counts, spans = collections.Counter(), collections.Counter(), []
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            name = e.name[:60]
            t = e.device_time_total if hasattr(e, "device_time_total") else e.cuda_time_total
            totals[name] += t
            counts[name] += 1
            totals["[" + kind(e.name) + "]"] += t
            spans.append((e.time_range.start, e.time_range.end))
    if spans:
        totals["[idle inside the step]"] = (max(e for _, e in spans) - min(s for s, _ in spans)) - busy_time(spans)
    return totals, counts


def busy_time(spans) -> float:
    """The length of the union of (start, end) intervals: the time some kernel ran."""
    busy, end = 0.0, None
    for s, e in sorted(spans):
        if end is None or s > end:
            busy += e - s
            end = e
        elif e > end:
            busy += e - end
            end = e
    return busy


def main():
    p = argparse.ArgumentParser()
    add_shape_args(p)
    p.add_argument("--slices", type=int, default=16)
    p.add_argument("--region", default="plain", choices=sorted(REGIONS))
    p.add_argument("--forward-only", action="store_true")
    args = p.parse_args()
    torch.manual_seed(0)
    q, k, v = (torch.randn(args.b, args.h, args.s, args.d, device="cuda", dtype=torch.bfloat16,
                           requires_grad=True) for _ in range(3))
    train = not args.forward_only
    runs = {}
    for label, sched, hints in (("bfs", "bfs", {}), (f"dfs{args.slices}", "dfs", {"slices": args.slices})):
        torch._dynamo.reset()
        runs[label] = kernel_times(make(args.region, sched, **hints), q, k, v, train)
        q.grad = k.grad = v.grad = None
    print("forward" if args.forward_only else "forward+backward", f"B,H,S,D={args.b},{args.h},{args.s},{args.d}")
    names = [n for n in set().union(*(t for t, _ in runs.values())) if not n.startswith("[")]
    names.sort(key=lambda n: -max(t[n] for t, _ in runs.values()))
    print(f"{'kernel':<62}" + "".join(f"{l + ' ms':>12}{'n':>6}" for l in runs))
    for n in names:
        print(f"{n:<62}" + "".join(f"{t[n] / 1e3:>12.3f}{c[n]:>6}" for t, c in runs.values()))
    for n in ("[matmul]", "[row kernels]", "[other]", "[idle inside the step]"):
        print(f"{n:<62}" + "".join(f"{t[n] / 1e3:>12.3f}{'':>6}" for t, _ in runs.values()))
    print(f"{'total kernel time':<62}" + "".join(
        f"{sum(t[n] for n in names) / 1e3:>12.3f}{sum(c.values()):>6}" for t, c in runs.values()))


if __name__ == "__main__":
    main()
