"""BFS vs DFS slice scheduling on plain-op attention (issue 4), side by side in one process.

    python benchmarks/slicing.py [--b 4 --h 16 --s 4096 --d 128] [--device cuda] [--dtype float16]
    python benchmarks/slicing.py --device cpu --b 1 --h 4 --s 256 --d 32 --reps 2   # smoke check
    python benchmarks/slicing.py --region flex        # the same region written with flex_attention
    python benchmarks/slicing.py --region flex-learned --dtype bfloat16   # a learned relative bias (grad)

Region: q @ k^T * scale, softmax in fp32, @ v, in a hinted_context region, bf16 (or --dtype float16); or
(--region flex) flex_attention with a relative-position score_mod; or (--region flex-learned) flex_attention
with a learned relative bias lb[q - kv + S - 1, h] (an fp32 table whose gradient the backward scatters): its
score_mod reads the head index, so plain dfs slices along batch only and slice_dims=[0, 1] has each slice read
its global head from an index table (docs/scheduling.md). The plain region also runs BFS and DFS without
row-softmax-fusion ("no row kernels": the softmax and its gradient as ATen ops, one pass over the S x S scores
per op), to show what the row kernels change. Prints per schedule: median ms per call and peak memory above
the inputs (CUDA only), for forward (no_grad) and forward+backward, with ratios against BFS. In the fw+bw rows
the `partition` column says how hintbackend's partition (python/hintbackend/partition.py) split the training
graph: `recompute` (the forward saves the region's inputs and the backward recomputes the region slice by
slice) or `default` (torch's default partition: bfs, or a fallback whose reason hintbackend logs).
"""

from __future__ import annotations

import argparse
import logging
import time

import torch

from hintbackend import hinted_context

from attention_shape import add_shape_args


def attention(q, k, v):
    s = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    return s.float().softmax(-1).to(q.dtype) @ v


def relative_bias(score, b, h, q_idx, kv_idx):
    return score + (q_idx - kv_idx) * 0.01


def flex(q, k, v):
    from torch.nn.attention.flex_attention import flex_attention
    return flex_attention(q, k, v, score_mod=relative_bias)


LEARNED = {}  # the flex-learned region's table, made in main()


def flex_learned(q, k, v):
    lb, S = LEARNED["lb"], q.shape[-2]

    def score_mod(score, b, h, q_idx, kv_idx):
        return score + lb[q_idx - kv_idx + S - 1, h]

    if q.device.type == "cpu":  # torch 2.11's public API refuses a CPU backward: the op it calls
        from hintbackend.flex import flex_attention_hop_call
        return flex_attention_hop_call(q, k, v, score_mod)
    from torch.nn.attention.flex_attention import flex_attention
    return flex_attention(q, k, v, score_mod=score_mod)


REGIONS = {"plain": attention, "flex": flex, "flex-learned": flex_learned}


def make(region, schedule, row_kernels=True, **hints):
    body = REGIONS[region]
    if schedule == "eager":
        return body

    def f(q, k, v):
        with hinted_context(schedule=schedule, **hints):
            return body(q, k, v)

    options = {"strict": True}
    if not row_kernels:
        options["disable_passes"] = ["row-softmax-fusion"]
    return torch.compile(f, backend="hintbackend", options=options)


class PartitionLog(logging.Handler):
    """Collects what hintbackend's partition logs (which graphs recompute their dfs/auto regions)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.messages: list = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("partition:"):
            self.messages.append(record.getMessage())


def make_step(fn, q, k, v, train: bool):
    """One call: forward and backward (train) or forward under no_grad."""
    def step():
        if train:
            if "lb" in LEARNED:
                LEARNED["lb"].grad = None
            out = fn(q, k, v)
            out.backward(torch.ones_like(out))
        else:
            with torch.no_grad():
                fn(q, k, v)

    return step


def measure(fn, q, k, v, train: bool, reps: int = 10):
    cuda = q.device.type == "cuda"
    step = make_step(fn, q, k, v, train)
    step()  # compile and warm up
    peak = None
    if cuda:
        torch.cuda.synchronize()
        base = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        step()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - base
    times = []
    for _ in range(reps):
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            step()
            b.record()
            torch.cuda.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2], peak


def main() -> None:
    p = argparse.ArgumentParser()
    add_shape_args(p)
    p.add_argument("--device", default="cuda", help="cuda (the measurement) or cpu (a smoke check: no peaks)")
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"],
                   help="q, k, v dtype (float16 on CUDA: the softmax reads it directly, fold-softmax-upcast)")
    p.add_argument("--region", default="plain", choices=sorted(REGIONS),
                   help="plain: attention as plain ops; flex: flex_attention with a relative-position "
                        "score_mod; flex-learned: with a learned relative bias (its gradient included)")
    args = p.parse_args()
    torch.manual_seed(0)
    shape = (args.b, args.h, args.s, args.d)
    dtype = getattr(torch, args.dtype)
    q, k, v = (torch.randn(shape, device=args.device, dtype=dtype, requires_grad=True) for _ in range(3))
    configs = [("eager", {}), ("bfs", {}), ("dfs", {"slices": 16}), ("dfs", {"slices": 64}),
               ("auto", {"memory_budget": "2GB"})]
    if args.region == "flex-learned":
        LEARNED["lb"] = (0.1 * torch.randn(2 * args.s - 1, args.h, device=args.device)).requires_grad_(True)
        both = [0, 1]
        configs = [("eager", {}), ("bfs", {}), ("dfs", {}), ("dfs", {"slice_dims": both, "slices": 8}),
                   ("dfs", {"slice_dims": both, "slices": 16}), ("dfs", {"slice_dims": both}),
                   ("auto", {"memory_budget": "2GB", "slice_dims": both})]
    if args.region == "plain":  # the same without row-softmax-fusion's kernels (the ATen op chain)
        configs += [("bfs", {"row_kernels": False}), ("dfs", {"slices": 16, "row_kernels": False})]
    extent = args.b * args.h
    configs = [(s_, h_) for s_, h_ in configs if h_.get("slices", 1) <= extent]  # small smoke shapes
    if args.region == "flex-learned":
        configs = [(s_, h_) for s_, h_ in configs if h_.get("slices", 1) <= extent and (
            h_.get("slices") is None or extent % h_["slices"] == 0)]
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else args.device
    what = {"plain": "plain-op attention", "flex": "flex_attention (relative bias)",
            "flex-learned": "flex_attention (learned relative bias, fp32 table with grad)"}[args.region]
    print(f"{what} B,H,S,D={shape} {args.dtype} on {name}, torch {torch.__version__}")
    print(f"{'schedule':<42} {'mode':<8} {'ms':>9} {'TFLOP/s':>8} {'peak MB':>10} {'time/BFS':>9} {'peak/BFS':>9} "
          f"{'partition':>10}")
    # Attention's matmul work: 4*B*H*S^2*D forward, 3.5 times that for forward+backward (no recompute counted).
    flops_fw = 4 * args.b * args.h * args.s * args.s * args.d
    plog = PartitionLog()
    hb_log = logging.getLogger("hintbackend")
    hb_log.addHandler(plog)
    hb_log.setLevel(logging.INFO)
    for train in (False, True):
        bfs = None
        for sched, hints in configs:
            torch._dynamo.reset()
            plog.messages.clear()
            try:
                ms, peak = measure(make(args.region, sched, **hints), q, k, v, train, args.reps)
            except Exception as e:  # report, keep going
                print(f"{sched + str(hints):<42} {'fw+bw' if train else 'fw':<8} failed: {str(e).splitlines()[0][:80]}")
                continue
            q.grad = k.grad = v.grad = None
            if sched == "bfs":
                bfs = (ms, peak)
            label = sched + ("" if not hints else " " + ",".join(
                "no row kernels" if k_ == "row_kernels" else f"{k_}={v_}".replace(" ", "") for k_, v_ in hints.items()))
            rt = f"{bfs[0] / ms:>9.2f}" if bfs else f"{'-':>9}"
            rp = f"{peak / bfs[1]:>9.3f}" if bfs and peak is not None else f"{'-':>9}"
            mb = f"{peak / 2**20:>10.0f}" if peak is not None else f"{'-':>10}"
            part = "-"
            if train and sched != "eager":
                part = "recompute" if any("backward recomputes" in m for m in plog.messages) else "default"
            tflops = flops_fw * (3.5 if train else 1.0) / (ms * 1e-3) / 1e12
            print(f"{label:<42} {'fw+bw' if train else 'fw':<8} {ms:>9.2f} {tflops:>8.1f} {mb} {rt} {rp} {part:>10}")
            for m in plog.messages:
                if "keeps the default partition" in m:
                    print(f"  {m[:160]}")
    print("TFLOP/s counts attention's matmuls (4*B*H*S^2*D forward, 3.5x that with the backward; DFS's "
          "recompute not counted). time/BFS is BFS time over this time (throughput ratio); peak/BFS is this "
          "peak over BFS's. "
          "The 'no row kernels' rows compare with the BFS row above them, also without row kernels.")


if __name__ == "__main__":
    main()
