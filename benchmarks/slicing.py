"""BFS vs DFS slice scheduling on plain-op attention (issue 4), side by side in one process.

    python benchmarks/slicing.py [--b 4 --h 16 --s 4096 --d 128] [--device cuda]

Region: q @ k^T * scale, softmax in fp32, @ v, in a hinted_context region, bf16. Prints per schedule:
median ms per call and peak memory above the inputs, for forward (no_grad) and forward+backward,
with ratios against BFS.
"""

from __future__ import annotations

import argparse

import torch

from hintbackend import hinted_context


def attention(q, k, v):
    s = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    return s.float().softmax(-1).to(q.dtype) @ v


def make(schedule, **hints):
    if schedule == "eager":
        return attention

    def f(q, k, v):
        with hinted_context(schedule=schedule, **hints):
            return attention(q, k, v)

    return torch.compile(f, backend="hintbackend", options={"strict": True})


def measure(fn, q, k, v, train: bool, reps: int = 10):
    def step():
        if train:
            out = fn(q, k, v)
            out.backward(torch.ones_like(out))
        else:
            with torch.no_grad():
                fn(q, k, v)

    step()  # compile and warm up
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    step()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2], peak


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--b", type=int, default=4)
    p.add_argument("--h", type=int, default=16)
    p.add_argument("--s", type=int, default=4096)
    p.add_argument("--d", type=int, default=128)
    args = p.parse_args()
    torch.manual_seed(0)
    shape = (args.b, args.h, args.s, args.d)
    q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    configs = [("eager", {}), ("bfs", {}), ("dfs", {"slices": 16}), ("dfs", {"slices": 64}),
               ("auto", {"memory_budget": "2GB"})]
    print(f"plain-op attention B,H,S,D={shape} bf16 on {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{'schedule':<18} {'mode':<8} {'ms':>9} {'peak MB':>10} {'time/BFS':>9} {'peak/BFS':>9}")
    for train in (False, True):
        bfs = None
        for sched, hints in configs:
            torch._dynamo.reset()
            try:
                ms, peak = measure(make(sched, **hints), q, k, v, train)
            except Exception as e:  # report, keep going
                print(f"{sched + str(hints):<18} {'fw+bw' if train else 'fw':<8} failed: {str(e).splitlines()[0][:80]}")
                continue
            q.grad = k.grad = v.grad = None
            if sched == "bfs":
                bfs = (ms, peak)
            label = sched + ("" if not hints else " " + ",".join(f"{k_}={v_}" for k_, v_ in hints.items()))
            rt = f"{bfs[0] / ms:>9.2f}" if bfs else f"{'-':>9}"
            rp = f"{peak / bfs[1]:>9.3f}" if bfs else f"{'-':>9}"
            print(f"{label:<18} {'fw+bw' if train else 'fw':<8} {ms:>9.2f} {peak / 2**20:>10.0f} {rt} {rp}")
    print("time/BFS is BFS time over this time (throughput ratio); peak/BFS is this peak over BFS's.")


if __name__ == "__main__":
    main()
