"""Per-call overhead: a compiled small-tensor model of about 50 ops against eager, side by side in one
process. Goal (issue 2): on CPU the hintbackend call costs at most half of eager's.

    python benchmarks/overhead.py [--device cpu|cuda] [--iters 2000] [--inductor]

On CUDA it also times hintbackend with CUDA graphs (mode="reduce-overhead", issue 16's goal: at most
0.3x eager per call) and, with --inductor, Inductor's reduce-overhead.

Prints a table of median microseconds per call and the ratio to eager, for inference (no_grad) and
for a training step (forward + backward). hintbackend-aot is hintbackend with lean_runtime=False: the same
graphs inside AOTAutograd's runtime wrappers (python/hintbackend/lean_runtime.py), so the training row
shows what the lean runtime saves.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch


class Chain(torch.nn.Module):
    """10 rounds of 5 ops on 8x16 tensors: 50 ATen ops per forward."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(10, 16, 16) * 0.1)
        self.b = torch.nn.Parameter(torch.randn(10, 16) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i in range(10):
            x = torch.sigmoid(torch.relu(x @ self.w[i] + self.b[i]) * 0.5)
        return x


def per_call_us(fn, iters: int, sync) -> float:
    for _ in range(20):
        fn()
    sync()
    samples = []
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(iters // 5):
            fn()
        sync()
        samples.append((time.perf_counter() - t0) / (iters // 5) * 1e6)
    return statistics.median(samples)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--iters", type=int, default=2000)
    p.add_argument("--inductor", action="store_true", help="also time backend='inductor'")
    args = p.parse_args()
    dev = args.device
    sync = torch.cuda.synchronize if dev.startswith("cuda") else (lambda: None)
    torch.manual_seed(0)
    model = Chain().to(dev)
    x = torch.randn(8, 16, device=dev)
    # hintbackend-aot: lean_runtime=False, AOTAutograd's runtime wrappers around the same graphs
    backends = ["eager", "aot_eager", "hintbackend", "hintbackend-aot"] + (["inductor"] if args.inductor else [])
    if dev.startswith("cuda"):
        backends += ["hintbackend+cg"] + (["inductor+cg"] if args.inductor else [])
    rows = []
    for mode in ("inference", "train step"):
        times = {}
        for name in backends:
            torch._dynamo.reset()
            if name == "eager":
                fn = model
            elif name.endswith("+cg"):  # CUDA graphs
                fn = torch.compile(model, backend=name[:-3], mode="reduce-overhead")
            elif name == "hintbackend-aot":
                fn = torch.compile(model, backend="hintbackend", options={"lean_runtime": False})
            else:
                fn = torch.compile(model, backend=name)
            if mode == "inference":
                def call(fn=fn):
                    with torch.no_grad():
                        fn(x)
            else:
                xg = x.clone().requires_grad_(True)

                def call(fn=fn, xg=xg):
                    xg.grad = None  # zero_grad(set_to_none=True), as a training step does
                    model.zero_grad(set_to_none=True)
                    fn(xg).sum().backward()
            call()  # compile outside the timing
            times[name] = per_call_us(call, args.iters, sync)
        rows.append((mode, times))
    print(f"per-call time, Chain model (50 ops, 8x16 fp32) on {dev}, torch {torch.__version__}; median of 5 x {args.iters // 5} calls")
    ratios = ["hintbackend", "hintbackend-aot"] + (["hintbackend+cg"] if "hintbackend+cg" in backends else [])
    print(f"{'mode':<11} " + " ".join(f"{b + ' us':>16}" for b in backends) + "".join(f"{r + '/eager':>22}" for r in ratios))
    for mode, t in rows:
        print(f"{mode:<11} " + " ".join(f"{t[b]:>16.1f}" for b in backends)
              + "".join(f"{t[r] / t['eager']:>22.2f}" for r in ratios))


if __name__ == "__main__":
    main()
