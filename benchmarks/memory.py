"""Peak memory of compiled graphs against eager on the model corpus (issue 4: the memory planner alone,
BFS, no slicing, must bring the compiled graph's peak to or below eager's). Side by side in one process.

    python benchmarks/memory.py [--device cuda]

For each model: one training step (forward, loss, backward) and one no_grad forward, each measured on
its second call (the first compiles): torch.cuda.max_memory_allocated above what was allocated before
the call (parameters, inputs and, for training, gradients already exist from the first call). Prints
eager and hintbackend peaks in MB and their ratio, and hintbackend with HINTBACKEND_ARENA=0 (no arena:
every op allocates its own result, released after its last use) and torch's aot_eager (the same AOT
graphs run by torch: what the graphs themselves cost, apart from hintbackend's runtime). CUDA only (the CPU allocator keeps no peak).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "python"))
os.environ.setdefault("HINTBACKEND_TEST_DEVICE", "cuda")
from test_models import GPTFlexBlock, SDPABlock  # noqa: E402  (the corpus' own blocks, at bench sizes)


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.LayerNorm(4096), nn.Linear(4096, 1024),
                                 nn.Tanh())

    def forward(self, x):
        return self.net(x)


class CNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.c1, self.bn, self.c2 = nn.Conv2d(3, 64, 3, padding=1), nn.BatchNorm2d(64), nn.Conv2d(64, 64, 3, stride=2)
        self.fc = nn.Linear(64 * 15 * 15, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn(self.c1(x))), 2)
        return self.fc(F.relu(self.c2(x)).flatten(1))


class GRU(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn, self.head = nn.GRU(256, 512, num_layers=2, batch_first=True), nn.Linear(512, 10)

    def forward(self, x):
        return self.head(self.rnn(x)[0][:, -1])


def corpus(dev):
    return [
        ("mlp", MLP(), torch.randn(512, 1024)),
        ("cnn+batchnorm", CNN(), torch.randn(32, 3, 64, 64)),
        ("gru", GRU(), torch.randn(32, 128, 256)),
        ("transformer block (sdpa)", SDPABlock(d=512, h=8), torch.randn(8, 512, 512)),
        ("gpt block (flex, learned bias)", GPTFlexBlock(d=256, h=4, s=512), torch.randn(4, 512, 256)),
    ]


def peak_mb(fn) -> float:
    fn()  # compile / warm up; allocates the gradients
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    assert args.device.startswith("cuda"), "peak memory is measured with the CUDA caching allocator"
    torch.manual_seed(0)
    rows = []
    for name, model, x in corpus(args.device):
        model, x = model.to(args.device), x.to(args.device)
        for mode in ("train", "inference"):
            res = {}
            for backend in ("eager", "hintbackend", "no arena", "aot_eager"):
                torch._dynamo.reset()
                os.environ["HINTBACKEND_ARENA"] = "0" if backend == "no arena" else "1"
                if backend == "eager":
                    fn = model
                elif backend == "aot_eager":
                    fn = torch.compile(model, backend="aot_eager")
                else:
                    fn = torch.compile(model, backend="hintbackend", options={"strict": True})
                if mode == "train":
                    def step(fn=fn):
                        fn(x).float().pow(2).mean().backward()
                else:
                    def step(fn=fn):
                        with torch.no_grad():
                            fn(x)
                for prm in model.parameters():
                    prm.grad = None
                res[backend] = peak_mb(step)
            rows.append((name, mode, res["eager"], res["hintbackend"], res["no arena"], res["aot_eager"]))
    print(f"peak memory above the live tensors, per call, on {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(f"{'model':<32} {'mode':<10} {'eager MB':>10} {'hintbackend MB':>15} {'ratio':>7} {'no-arena MB':>12} "
          f"{'aot_eager MB':>13}")
    for name, mode, e, h, na, ae in rows:
        print(f"{name:<32} {mode:<10} {e:>10.1f} {h:>15.1f} {h / e if e else float('nan'):>7.2f} {na:>12.1f} {ae:>13.1f}")
    worst = max(h / e for _, _, e, h, _, _ in rows if e)
    print(f"worst ratio {worst:.2f} (goal: <= 1.00)")


if __name__ == "__main__":
    main()
