"""Data-parallel training with hintbackend: the demo's TinyGPT under DDP or FSDP2 (``fully_shard`` per
block), compiled with ``backend="hintbackend"``, against the same model in eager in the same processes.

    torchrun --standalone --nproc-per-node 2 -m hintbackend.distributed_demo --device cpu      # gloo
    torchrun --standalone --nproc-per-node 2 -m hintbackend.distributed_demo --device cuda     # nccl
    torchrun ... -m hintbackend.distributed_demo --device cuda --bench --layers 4 --dim 512 --heads 8 \\
        --seq 1024 --batch 4 --attn-dtype bfloat16      # step time and per-rank peak: eager/Inductor/hintbackend

Default (check): trains --steps steps under each --modes wrapper, eager and hintbackend side by side
(same initial parameters, same data per rank), and prints per step the losses and their difference,
then the largest difference of the final parameters (FSDP2: over every rank's shards); exits 1 on a
mismatch. With --dfs the attention runs in a hinted_context(schedule="dfs") region (dfs_hints); the check
then also says whether every graph hintbackend compiled that holds the attention (DDP's optimizer
splits the graph at bucket boundaries, FSDP2's hooks break it per block) carried the region's hints.

--bench: median step time (forward, backward, optimizer step) and each rank's peak memory above
the model, for eager, Inductor and hintbackend, with and without the dfs hint.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, List

import torch
import torch.distributed as dist
import torch.nn as nn

from .demo import TinyGPT

def dfs_hints(args) -> dict:
    """The --dfs region's hints: per sample and head, or per sample only where the learned relative
    bias's score_mod reads the head index (slicing along heads would change it)."""
    return {"schedule": "dfs", "slice_dims": [0] if not args.no_rel_bias else [0, 1]}


def _wrap(model: nn.Module, mode: str, dev: torch.device, bucket_mb: float) -> nn.Module:
    if mode == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        return DDP(model, device_ids=[dev.index] if dev.type == "cuda" else None, bucket_cap_mb=bucket_mb)
    from torch.distributed.fsdp import fully_shard

    for blk in model.blocks:
        fully_shard(blk)
    fully_shard(model)
    return model


def _local_params(model: nn.Module) -> List[torch.Tensor]:
    """This rank's parameters: whole under DDP, its shards under FSDP2 (the check's all-reduce then
    covers every shard, with no all-gather)."""
    out = []
    for p in model.parameters():
        t = p.detach()
        if hasattr(t, "to_local"):  # FSDP2: a DTensor
            t = t.to_local()
        out.append(t.float().cpu())
    return out


class HintRecorder:
    """Records, for every graph hintbackend compiles, how many attention nodes it has and how many of them
    carry a hinted_context region (wraps hintbackend.backend._compile while active; a compile cache hit
    compiles no FX graph, so the check turns the cache off)."""

    ATTENTION = ("flex_attention", "flex_attention_backward", "slice_loop")

    def __init__(self) -> None:
        self.graphs: List[Dict[str, Any]] = []

    @contextlib.contextmanager
    def active(self):
        from . import backend

        original = backend._compile

        def recording(gm, example_inputs, opts, kind, *args, **kwargs):
            nodes = [n for n in gm.graph.nodes if n.op == "call_function"
                     and getattr(n.target, "__name__", str(n.target)).split(".")[0] in self.ATTENTION]
            hinted = [n for n in nodes if ((n.meta.get("custom") or {}).get("hintbackend"))]
            self.graphs.append({"kind": kind, "attention": len(nodes), "hinted": len(hinted)})
            return original(gm, example_inputs, opts, kind, *args, **kwargs)

        backend._compile = recording
        try:
            yield self
        finally:
            backend._compile = original

    def summary(self) -> str:
        with_attn = [g for g in self.graphs if g["attention"]]
        hinted = sum(g["hinted"] for g in with_attn)
        total = sum(g["attention"] for g in with_attn)
        kinds = [g["kind"] for g in self.graphs]
        return (f"{kinds.count('forward')} forward and {kinds.count('backward')} backward graphs compiled, "
                f"{len(with_attn)} with attention; {hinted} of {total} attention nodes carry the hints")

    def all_hinted(self) -> bool:
        with_attn = [g for g in self.graphs if g["attention"]]
        return bool(with_attn) and all(g["hinted"] == g["attention"] for g in with_attn)


def _batches(args, rank: int, dev: torch.device):
    g = torch.Generator().manual_seed(1000 + rank)  # each rank its own data
    for _ in range(args.steps):
        data = torch.randint(0, 256, (args.batch, args.seq + 1), generator=g).to(dev)
        yield data[:, :-1], data[:, 1:]


def _make_model(args, dev: torch.device, hints) -> nn.Module:
    torch.manual_seed(0)  # the same initial parameters on every rank and for every variant
    attn_dtype = None if args.attn_dtype == "float32" else getattr(torch, args.attn_dtype)
    return TinyGPT(d=args.dim, heads=args.heads, layers=args.layers, seq=args.seq, device=dev.type,
                   attn_dtype=attn_dtype, attn_hints=hints, rel_bias=not args.no_rel_bias).to(dev)


def check(args, mode: str, rank: int, dev: torch.device) -> bool:
    """Eager and hintbackend, trained side by side; True if losses and final parameters match."""
    hints = dfs_hints(args) if args.dfs else None
    eager = _wrap(_make_model(args, dev, hints), mode, dev, args.bucket_mb)
    base = _wrap(_make_model(args, dev, hints), mode, dev, args.bucket_mb)
    if dev.type == "cpu":
        # torch 2.11's public flex_attention API refuses CPU backward (the demo calls the op directly);
        # its reference on CPU is PyTorch's math implementation, torch.compile with aot_eager.
        eager = torch.compile(eager, backend="aot_eager")
    compiled = torch.compile(base, backend="hintbackend", options={"strict": True, "compile_cache": False})
    opts = [torch.optim.SGD(m.parameters(), lr=0.1) for m in (eager, base)]
    recorder = HintRecorder()
    worst = 0.0
    if rank == 0:
        print(f"[{mode}] {'step':>4} {'loss (eager)':>14} {'loss (hintbackend)':>20} {'|diff|':>10}")
    with recorder.active():
        for step, (idx, tgt) in enumerate(_batches(args, rank, dev)):
            losses = []
            for model, opt in zip((eager, compiled), opts):
                loss = model(idx, tgt)
                loss.backward()
                opt.step()
                opt.zero_grad()
                losses.append(loss.detach())
            diff = (losses[0] - losses[1]).abs().item()
            worst = max(worst, diff)
            if rank == 0:
                print(f"[{mode}] {step:>4} {losses[0].item():>14.6f} {losses[1].item():>20.6f} {diff:>10.2e}")
    pdiff = max(((a - b).abs().max().item() if a.numel() else 0.0)
                for a, b in zip(_local_params(eager), _local_params(base)))
    stats = torch.tensor([worst, pdiff, 0.0 if not args.dfs or recorder.all_hinted() else 1.0], device=dev)
    dist.all_reduce(stats, op=dist.ReduceOp.MAX)
    worst, pdiff, unhinted = stats.tolist()
    tol = 1e-4 if args.attn_dtype == "float32" else 2e-2
    ok = worst <= tol and pdiff <= tol and unhinted == 0
    if rank == 0:
        print(f"[{mode}] max |loss diff| = {worst:.3e}; max |parameter diff| after {args.steps} steps = {pdiff:.3e} "
              f"(all ranks; tolerance {tol:g})")
        if args.dfs:
            print(f"[{mode}] hints: rank 0: {recorder.summary()}" + ("" if unhinted == 0 else
                                                                    "; SOME ATTENTION NODE LOST ITS HINTS"))
        print(f"[{mode}] " + ("OK: hintbackend matches eager" if ok else "MISMATCH: hintbackend differs from eager"))
    return ok


def _time_steps(step: Callable[[], None], dev: torch.device, warmup: int, reps: int) -> float:
    for _ in range(warmup):
        step()
    times = []
    for _ in range(reps):
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        t0 = time.perf_counter()
        step()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        times.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(times)


def bench(args, mode: str, rank: int, world: int, dev: torch.device) -> None:
    rows = []
    for hints_name, hints in (("none", None), ("dfs", dfs_hints(args))):
        for backend in args.backends.split(","):
            torch._dynamo.reset()
            model = _wrap(_make_model(args, dev, hints), mode, dev, args.bucket_mb)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            fn = model if backend == "eager" else torch.compile(
                model, backend=backend, options={"strict": True} if backend == "hintbackend" else None)
            idx, tgt = next(_batches(argparse.Namespace(**{**vars(args), "steps": 1}), rank, dev))

            def step():
                fn(idx, tgt).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

            error = ""
            try:
                step()  # compiles
                if dev.type == "cuda":
                    torch.cuda.synchronize(dev)
                    base = torch.cuda.memory_allocated(dev)
                    torch.cuda.reset_peak_memory_stats(dev)
                ms = _time_steps(step, dev, warmup=2, reps=args.reps)
                peak = (torch.cuda.max_memory_allocated(dev) - base) / 2**20 if dev.type == "cuda" else float("nan")
            except Exception as e:  # a row that fails says so and the table goes on
                ms, peak, error = float("nan"), float("nan"), f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"
            out = torch.tensor([ms, peak], device=dev)
            gathered = [torch.zeros_like(out) for _ in range(world)]
            dist.all_gather(gathered, out)
            rows.append((hints_name, backend, [g.tolist() for g in gathered], error))
            del fn, model, opt
            if dev.type == "cuda":
                torch.cuda.empty_cache()
    if rank == 0:
        print(f"\n[{mode}] {world} ranks, TinyGPT layers={args.layers} d={args.dim} heads={args.heads} seq={args.seq} "
              f"batch={args.batch} per rank, attention in {args.attn_dtype}; median of {args.reps} steps")
        print(f"[{mode}] {'hint':>5} {'backend':>12} {'ms/step (rank 0)':>17} {'ms/step (max)':>14} "
              f"{'peak MiB per rank':>24} {'ms vs eager':>12}")
        eager_ms = {h: per_rank[0][0] for h, b, per_rank, _ in rows if b == "eager"}
        for hints_name, backend, per_rank, error in rows:
            ms0 = per_rank[0][0]
            msmax = max(p[0] for p in per_rank)
            peaks = " / ".join(f"{p[1]:.0f}" for p in per_rank)
            ratio = ms0 / eager_ms[hints_name] if eager_ms.get(hints_name) else float("nan")
            print(f"[{mode}] {hints_name:>5} {backend:>12} {ms0:>17.2f} {msmax:>14.2f} {peaks:>24} {ratio:>12.2f}"
                  + (f"  {error}" if error else ""))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--modes", default="ddp,fsdp2", help="comma-separated: ddp, fsdp2")
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=32)
    p.add_argument("--dim", type=int, default=128, help="model width")
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--layers", type=int, default=3)
    p.add_argument("--attn-dtype", choices=["float32", "bfloat16", "float16"], default="float32")
    p.add_argument("--bucket-mb", type=float, default=1.0,
                   help="DDP bucket size (>= DDP's 1 MiB first bucket); Dynamo's DDP optimizer splits the graph at "
                        "bucket boundaries (the default model has 2.6 MB of parameters: three pieces)")
    p.add_argument("--no-rel-bias", action="store_true",
                   help="causal attention with no score_mod (default: the demo's learned relative bias)")
    p.add_argument("--backends", default="eager,inductor,hintbackend", help="--bench: which to time")
    p.add_argument("--dfs", action="store_true", help='the attention in hinted_context(schedule="dfs", slice_dims=[0])')
    p.add_argument("--dist-backend", default="nccl", help="the process group's backend on CUDA (gloo on CPU)")
    p.add_argument("--bench", action="store_true", help="time eager / Inductor / hintbackend instead of checking")
    p.add_argument("--reps", type=int, default=10)
    args = p.parse_args(argv)

    if "RANK" not in os.environ:
        p.error("launch with torchrun, e.g. torchrun --standalone --nproc-per-node 2 -m hintbackend.distributed_demo")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if args.device == "cuda":
        # More ranks than GPUs share them round robin (a check on one GPU: NCCL refuses two ranks on one
        # GPU, so give --dist-backend gloo).
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
        torch.cuda.set_device(dev)
        if args.dist_backend == "nccl":
            dist.init_process_group("nccl", device_id=dev)
        else:
            dist.init_process_group(args.dist_backend)
    else:
        dev = torch.device("cpu")
        dist.init_process_group("gloo")
    ok = True
    for mode in args.modes.split(","):
        if mode not in ("ddp", "fsdp2"):
            p.error(f"--modes: unknown mode {mode!r} (ddp, fsdp2)")
        torch._dynamo.reset()
        if args.bench:
            bench(args, mode, rank, world, dev)
        else:
            ok = check(args, mode, rank, dev) and ok
    # Tear the group down only once every rank is done with it. Without the barrier a CI run saw rank 1
    # abort in teardown ("terminate called without an active exception", gloo on CPU) after both checks
    # had passed; it did not recur in 42 local runs. A rank that raised skips this (a barrier would hang
    # the others); torchrun then ends them.
    dist.barrier()
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
