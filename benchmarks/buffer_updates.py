"""A buffer written in place by the model: a decoder's key/value cache, one position a step. AOTAutograd
traces `cache.index_copy_(2, pos, k)` (as Hugging Face's static cache writes it) as an index_copy into a
copy of the whole cache, which the runtime then copies back; write-inputs-in-place (passes/WriteInputsInPlace.h) writes the position into the cache itself. Eager,
hintbackend and hintbackend without that pass (and Inductor with --inductor) side by side in one process,
the peers taking turns in rounds:

    python benchmarks/buffer_updates.py                    # CUDA if there is one: bf16, B4 H16 S8192 D64
    python benchmarks/buffer_updates.py --device cpu       # float32, S2048
    python benchmarks/buffer_updates.py --inductor         # also torch.compile's default backend
    python benchmarks/buffer_updates.py --model ema        # an average of the cache's size, mul_ then add_

--model ema: the buffer is an exponential moving average, `ema.mul_(0.75).add_(x, alpha=0.25)` with x a new
sample of the buffer's size a step, then its sum; AOTAutograd decomposes the add's alpha into a full-size
mul, which fold-scaled-add folds back (the peer "hb -fold-scaled-add" runs without that fold).

A step: write k at position pos (a one-element index tensor, step mod S), then one query's attention over the
whole cache (scores, softmax, weighted sum). Printed per peer: the step's
peak above what was allocated before it (MiB; on CPU the tensor storage alive at once), the median ms a step,
and both against eager's.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from typing import Callable, Dict, List

import torch

from memory_models import peak_of, time_steps


class DecodeCache(torch.nn.Module):
    def __init__(self, b: int, h: int, s: int, d: int) -> None:
        super().__init__()
        self.register_buffer("cache", torch.randn(b, h, s, d) * 0.1)

    def forward(self, q: torch.Tensor, k: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        self.cache.index_copy_(2, pos, k)
        scores = (q @ self.cache.transpose(-1, -2)) * q.shape[-1] ** -0.5
        return scores.softmax(-1) @ self.cache


class MovingAverage(torch.nn.Module):
    def __init__(self, b: int, h: int, s: int, d: int) -> None:
        super().__init__()
        self.register_buffer("ema", torch.zeros(b, h, s, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.ema.mul_(0.75).add_(x, alpha=0.25)
        return self.ema.sum()


def main(argv: List[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seq", type=int, default=None, help="cache positions (default 8192 on CUDA, 2048 on CPU)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--inductor", action="store_true", help="also Inductor (torch.compile's default backend)")
    p.add_argument("--model", choices=("decode", "ema"), default="decode")
    args = p.parse_args(argv)
    dev = args.device
    dtype = torch.bfloat16 if dev == "cuda" else torch.float32
    b, h, s, d = 4, 16, args.seq or (8192 if dev == "cuda" else 2048), 64
    torch.manual_seed(0)
    base = (DecodeCache if args.model == "decode" else MovingAverage)(b, h, s, d).to(dev, dtype)
    peers: Dict[str, Callable[[torch.nn.Module], Callable]] = {
        "eager": lambda m: m,
        "hintbackend": lambda m: torch.compile(m, backend="hintbackend"),
        "hb -write-inputs-in-place": lambda m: torch.compile(
            m, backend="hintbackend", options={"disable_passes": ["write-inputs-in-place"]}),
    }
    if args.model == "ema":
        peers["hb -fold-scaled-add"] = lambda m: torch.compile(
            m, backend="hintbackend", options={"disable_passes": ["fold-scaled-add"]})
    if args.inductor:
        peers["inductor"] = lambda m: torch.compile(m)
    q = torch.randn(b, h, 1, d, device=dev, dtype=dtype)
    k = torch.randn(b, h, 1, d, device=dev, dtype=dtype)
    positions = [torch.tensor([i], device=dev) for i in range(s)]
    sample = torch.randn(b, h, s, d, device=dev, dtype=dtype)
    steps: Dict[str, Callable[[], None]] = {}
    peaks: Dict[str, float] = {}
    for name, make in peers.items():
        fn = make(copy.deepcopy(base))
        pos = [0]

        def step(fn=fn, pos=pos) -> None:
            with torch.no_grad():
                if args.model == "decode":
                    fn(q, k, positions[pos[0] % s])
                else:
                    fn(sample)
            pos[0] += 1

        for _ in range(3):  # compile, warm up
            step()
        peaks[name] = peak_of(step, dev)
        steps[name] = step
    times: Dict[str, List[float]] = {name: [] for name in steps}
    order = list(steps)
    for r in range(args.rounds):
        for name in (order if r % 2 == 0 else order[::-1]):
            steps[name]()
            times[name] += time_steps(steps[name], dev, args.steps)
    buf = base.cache if args.model == "decode" else base.ema
    cache_mib = buf.numel() * buf.element_size() / 2**20
    what = "a decode step over a key/value cache" if args.model == "decode" else "a moving average's update of a buffer"
    print(f"{what} of {cache_mib:.0f} MiB ({b}x{h}x{s}x{d}, {dtype}), on "
          f"{torch.cuda.get_device_name() if dev == 'cuda' else 'CPU'}, torch {torch.__version__}")
    print(f"{'peer':<28}{'peak MiB':>10}{'ms':>10}{'peak / eager':>14}{'ms / eager':>12}")
    e_peak, e_ms = peaks["eager"], statistics.median(times["eager"])
    for name in steps:
        ms = statistics.median(times[name])
        print(f"{name:<28}{peaks[name]:>10.1f}{ms:>10.3f}{peaks[name] / max(e_peak, 1e-9):>14.2f}{ms / e_ms:>12.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
