"""Where a small training step's host time goes, phase by phase: the test corpus's MLP and CNN (issue 12's
host-bound rows), eager against hintbackend and hintbackend on AOTAutograd's runtime, side by side in one
process.

    python benchmarks/host_time.py                              # CUDA: the MLP and the CNN at 8 rows (pure host time)
    python benchmarks/host_time.py --rows 262144 --models mlp   # at memory_models.py's size
    python benchmarks/host_time.py --profile                    # also torch.profiler's top ops by host time
    python benchmarks/host_time.py --cuda-graphs                # also with cuda_graphs=True (GraphReplay)
    python benchmarks/host_time.py --models bnstack             # eight BatchNorm layers (a ResNet's habit)
    python benchmarks/host_time.py --without write-inputs-in-place  # also hintbackend with that pass off
    python benchmarks/host_time.py --without fast_views         # ... or with that option off

Every peer compiles first; then, in each of --rounds rounds, each peer takes a turn of --steps steps (the
order reversed every other round), so that a drift of the host's speed falls on all alike. For each peer:
the median host time of the forward call, the loss and the backward() call over all its timed steps
(the wall clock around each phase, the GPU synchronized every 20 steps so that no queue fills), their
sum, and "synced": each turn's steps once more back to back over their count (throughput, the GPU's time
included where it is longer), the median over the turns. With 8 rows the GPU's work is nothing, so the step is the host's: Dynamo's frame and
guards, the runtime around the compiled graphs, the executor, the ATen calls (docs/memory.md, "The lean
runtime's node in C++").
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from typing import Callable, Dict, List, Sequence

import torch

from hintbackend.options import Options
from memory_models import corpus_models


class BNStack(torch.nn.Module):
    """Eight convolution, BatchNorm, ReLU layers over 3 x 16 x 16 images and a linear head: where BatchNorm's
    per-layer host cost (its running statistics written back) adds up, as in a ResNet."""

    def __init__(self, width: int = 16, layers: int = 8) -> None:
        super().__init__()
        nn = torch.nn
        body = [nn.Conv2d(3, width, 3, padding=1)]
        for _ in range(layers):
            body += [nn.BatchNorm2d(width), nn.ReLU(), nn.Conv2d(width, width, 3, padding=1)]
        self.body, self.head = nn.Sequential(*body), nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x).mean((2, 3)))


# Options `--without` turns off by name, as it does passes (fast_views, memory_plan_in_place, arena ...).
_BOOL_OPTIONS = {f.name for f in dataclasses.fields(Options) if f.type in (bool, "bool")}


def peers(cuda_graphs: bool = False, without: Sequence[str] = ()) -> Dict[str, Callable[[torch.nn.Module], Callable]]:
    out = {"eager": lambda m: m,
           "hintbackend": lambda m: torch.compile(m, backend="hintbackend"),
           "hb-aot-runtime": lambda m: torch.compile(m, backend="hintbackend", options={"lean_runtime": False})}
    for name in without:  # a pass's (or a boolean option's) worth, side by side: hintbackend with it off
        off = {name: False} if name in _BOOL_OPTIONS else {"disable_passes": [name]}
        out[f"hb -{name}"] = lambda m, off=off: torch.compile(m, backend="hintbackend", options=off)
    if cuda_graphs:  # the lean runtime's own replay (GraphReplay); the timed loop keeps `y` into the next step
        out["hb-cuda-graphs"] = lambda m: torch.compile(m, backend="hintbackend", options={"cuda_graphs": True})
    return out


class Peer:
    """One peer's compiled model (fresh, seed 0) and its timed phases, accumulated over the rounds."""

    def __init__(self, make: Callable[[], torch.nn.Module], compile_fn: Callable, x: torch.Tensor, device: str,
                 dtype: torch.dtype) -> None:
        self.sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
        torch.manual_seed(0)
        model = make().to(device=device, dtype=dtype).train()
        self.fn, self.x, self.params = compile_fn(model), x, list(model.parameters())
        self.phases: Dict[str, List[float]] = {"forward": [], "loss": [], "backward()": []}
        self.synced: List[float] = []
        for _ in range(6):  # compile (AOTAutograd compiles the backward at the first backward), warm up
            self.step()
        self.sync()

    def step(self) -> None:
        for p in self.params:
            p.grad = None
        self.fn(self.x).float().pow(2).mean().backward()

    def turn(self, steps: int) -> None:
        """`steps` steps timed phase by phase (the GPU synchronized every 20 steps, so that no queue fills),
        then `steps` back to back over their count (synced)."""
        self.step()  # untimed: the turn's first step touches what the other peers' turns evicted
        self.sync()
        for i in range(steps):
            for p in self.params:
                p.grad = None
            t0 = time.perf_counter()
            y = self.fn(self.x)
            t1 = time.perf_counter()
            loss = y.float().pow(2).mean()
            t2 = time.perf_counter()
            loss.backward()
            t3 = time.perf_counter()
            self.phases["forward"].append(t1 - t0)
            self.phases["loss"].append(t2 - t1)
            self.phases["backward()"].append(t3 - t2)
            if i % 20 == 19:
                self.sync()
        self.sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            self.step()
        self.sync()
        self.synced.append((time.perf_counter() - t0) / steps)

    def result(self) -> Dict[str, float]:
        """Median host us of each phase over every timed step; synced: the median over the turns."""
        out = {k: statistics.median(v) * 1e6 for k, v in self.phases.items()}
        out["sum"] = sum(out.values())
        out["synced"] = statistics.median(self.synced) * 1e6
        return out

    def profile(self) -> None:
        from torch.profiler import ProfilerActivity
        with torch.profiler.profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(30):
                self.step()
            self.sync()
        for e in sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)[:25]:
            print(f"    {e.key[:60]:60s} calls/step {e.count / 30:5.1f}  self us/step {e.self_cpu_time_total / 30:8.1f}")


def measure(make: Callable[[], torch.nn.Module], peers_: Dict[str, Callable], x: torch.Tensor, device: str,
            dtype: torch.dtype, steps: int, rounds: int, profile: bool) -> Dict[str, object]:
    """Every peer compiles first (all stay alive); then `rounds` rounds, in which each peer takes a turn of
    `steps` steps, the order reversed every other round: a drift of the host's speed over the run (which
    moves a small step by 10-30% from one stretch to the next on the GPU machine) falls on every peer
    alike. Per peer its result, or why it failed."""
    torch._dynamo.reset()
    out: Dict[str, object] = {}
    live: Dict[str, Peer] = {}
    for name, compile_fn in peers_.items():
        try:
            live[name] = Peer(make, compile_fn, x, device, dtype)
        except Exception as e:  # a peer that fails says why in its row
            out[name] = f"fails: {type(e).__name__}: {str(e).splitlines()[0][:60] if str(e) else ''}"
    order = list(live)
    for r in range(rounds):
        for name in (order if r % 2 == 0 else order[::-1]):
            live[name].turn(steps)
    for name, peer in live.items():
        out[name] = peer.result()
        if profile:
            print(f"== {name}: top ops by host time")
            peer.profile()
    live.clear()
    torch._dynamo.reset()
    return {name: out[name] for name in peers_}


def main(argv: List[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--models", default="mlp,cnn", help="comma-separated: mlp, cnn, bnstack")
    p.add_argument("--rows", type=int, default=8, help="the batch (rows of the MLP, images of the CNN)")
    p.add_argument("--steps", type=int, default=50, help="timed steps a peer's turn")
    p.add_argument("--rounds", type=int, default=8, help="rounds, in each of which every peer takes a turn")
    p.add_argument("--profile", action="store_true", help="also torch.profiler's top ops by host time a step")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="also hintbackend with cuda_graphs=True (its replays; each step keeps the last output)")
    p.add_argument("--without", default="",
                   help="comma-separated pass names or boolean options (fast_views): also hintbackend with each "
                        "turned off (a peer each)")
    args = p.parse_args(argv)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    models = {"mlp": "MLP", "cnn": "CNN", "bnstack": "BatchNorm stack"}
    wanted = [models[m.strip()] for m in args.models.split(",") if m.strip()]
    rows = []
    for name, make, _, shape in corpus_models(True, args.device) + [("BatchNorm stack (8 layers)", BNStack, None,
                                                                     (64, 3, 16, 16))]:
        if not any(name.startswith(w) for w in wanted):
            continue
        x = torch.randn(args.rows, *shape[1:], device=args.device, dtype=dtype)
        without = [w for w in args.without.split(",") if w]
        if args.profile:
            print(f"== {name}")
        results = measure(make, peers(args.cuda_graphs, without), x, args.device, dtype, args.steps, args.rounds,
                          args.profile)
        rows += [(name, peer, r) for peer, r in results.items()]
    print(f"host us a training step by phase, {args.rows} rows, {dtype}, on "
          f"{torch.cuda.get_device_name() if args.device == 'cuda' else 'CPU'}, torch {torch.__version__}")
    cols = ["forward", "loss", "backward()", "sum", "synced"]
    w = max([16] + [len(peer) + 2 for _, peer, _ in rows])
    print(f"{'model':<30}{'peer':<{w}}" + "".join(f"{c:>12}" for c in cols))
    for name, peer, r in rows:
        cells = r if isinstance(r, str) else "".join(f"{r[c]:>12.1f}" for c in cols)
        print(f"{name:<30}{peer:<{w}}{cells}")


if __name__ == "__main__":
    main(sys.argv[1:])
