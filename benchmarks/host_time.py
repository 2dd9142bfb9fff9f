"""Where a small training step's host time goes, phase by phase: the test corpus's MLP and CNN (issue 12's
host-bound rows), eager against hintbackend and hintbackend on AOTAutograd's runtime, side by side in one
process.

    python benchmarks/host_time.py                              # CUDA: the MLP and the CNN at 8 rows (pure host time)
    python benchmarks/host_time.py --rows 262144 --models mlp   # at memory_models.py's size
    python benchmarks/host_time.py --profile                    # also torch.profiler's top ops by host time
    python benchmarks/host_time.py --cuda-graphs                # also with cuda_graphs=True (GraphReplay)

For each peer: the median host time of the forward call, the loss and the backward() call (each step
timed with the wall clock around each phase, the GPU synchronized every 20 steps so that no queue fills),
their sum, and "synced": 200 steps back to back over their count (throughput, the GPU's time included
where it is longer). With 8 rows the GPU's work is nothing, so the step is the host's: Dynamo's frame and
guards, the runtime around the compiled graphs, the executor, the ATen calls (docs/memory.md, "The lean
runtime's node in C++").
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Callable, Dict, List

import torch

from memory_models import corpus_models


def peers(cuda_graphs: bool = False) -> Dict[str, Callable[[torch.nn.Module], Callable]]:
    out = {"eager": lambda m: m,
           "hintbackend": lambda m: torch.compile(m, backend="hintbackend"),
           "hb-aot-runtime": lambda m: torch.compile(m, backend="hintbackend", options={"lean_runtime": False})}
    if cuda_graphs:  # the lean runtime's own replay (GraphReplay); the timed loop keeps `y` into the next step
        out["hb-cuda-graphs"] = lambda m: torch.compile(m, backend="hintbackend", options={"cuda_graphs": True})
    return out


def measure(make: Callable[[], torch.nn.Module], compile_fn: Callable, x: torch.Tensor, device: str,
            dtype: torch.dtype, steps: int, profile: bool) -> Dict[str, float]:
    """Median host us of each phase of `steps` steps, and the synced us a step over 200 steps."""
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = make().to(device=device, dtype=dtype).train()
    fn = compile_fn(model)
    params = list(model.parameters())

    def step() -> None:
        for p in params:
            p.grad = None
        fn(x).float().pow(2).mean().backward()

    for _ in range(6):  # compile (AOTAutograd compiles the backward at the first backward), warm up
        step()
    sync()
    phases: Dict[str, List[float]] = {"forward": [], "loss": [], "backward()": []}
    for i in range(steps):
        for p in params:
            p.grad = None
        t0 = time.perf_counter()
        y = fn(x)
        t1 = time.perf_counter()
        loss = y.float().pow(2).mean()
        t2 = time.perf_counter()
        loss.backward()
        t3 = time.perf_counter()
        phases["forward"].append(t1 - t0)
        phases["loss"].append(t2 - t1)
        phases["backward()"].append(t3 - t2)
        if i % 20 == 19:
            sync()
    sync()
    t0 = time.perf_counter()
    for _ in range(200):
        step()
    sync()
    out = {k: statistics.median(v) * 1e6 for k, v in phases.items()}
    out["sum"] = sum(out.values())
    out["synced"] = (time.perf_counter() - t0) / 200 * 1e6
    if profile:
        from torch.profiler import ProfilerActivity
        with torch.profiler.profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(30):
                step()
            sync()
        for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:25]:
            print(f"    {e.key[:60]:60s} calls/step {e.count / 30:5.1f}  self us/step {e.self_cpu_time_total / 30:8.1f}")
    return out


def main(argv: List[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--models", default="mlp,cnn", help="comma-separated: mlp, cnn")
    p.add_argument("--rows", type=int, default=8, help="the batch (rows of the MLP, images of the CNN)")
    p.add_argument("--steps", type=int, default=300, help="timed steps a peer")
    p.add_argument("--profile", action="store_true", help="also torch.profiler's top ops by host time a step")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="also hintbackend with cuda_graphs=True (its replays; each step keeps the last output)")
    args = p.parse_args(argv)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    models = {"mlp": "MLP", "cnn": "CNN"}
    wanted = [models[m.strip()] for m in args.models.split(",") if m.strip()]
    rows = []
    for name, make, _, shape in corpus_models(True, args.device):
        if not any(name.startswith(w) for w in wanted):
            continue
        x = torch.randn(args.rows, *shape[1:], device=args.device, dtype=dtype)
        for peer, compile_fn in peers(args.cuda_graphs).items():
            if args.profile:
                print(f"== {name}, {peer}: top ops by host time")
            try:
                rows.append((name, peer, measure(make, compile_fn, x, args.device, dtype, args.steps, args.profile)))
            except Exception as e:  # a peer that fails says why in its row
                rows.append((name, peer, f"fails: {type(e).__name__}: {str(e).splitlines()[0][:60] if str(e) else ''}"))
    print(f"host us a training step by phase, {args.rows} rows, {dtype}, on "
          f"{torch.cuda.get_device_name() if args.device == 'cuda' else 'CPU'}, torch {torch.__version__}")
    cols = ["forward", "loss", "backward()", "sum", "synced"]
    print(f"{'model':<30}{'peer':<16}" + "".join(f"{c:>12}" for c in cols))
    for name, peer, r in rows:
        cells = r if isinstance(r, str) else "".join(f"{r[c]:>12.1f}" for c in cols)
        print(f"{name:<30}{peer:<16}{cells}")


if __name__ == "__main__":
    main(sys.argv[1:])
