"""Host time of forwards whose graphs are full of views: a decode step of a small HF Llama (one token, no
cache: every layer splits and merges heads, slices halves for the rotary embedding, transposes) and a chain
of views, eager against hintbackend and hintbackend with fast_views=False (every view a dispatcher call),
side by side in one process.

    python benchmarks/views.py [--device cuda|cpu] [--rounds 16] [--calls 100] [--layers 4]

Every peer compiles first; then, in each of --rounds rounds, each peer runs --calls forwards (the order
reversed every other round), synchronized at the end of its turn. Printed: the median over the turns of
the host us a forward (the turn's wall clock over its calls), and hintbackend against the same without
fast views. With one token the GPU's work is nothing: the forward is the host's.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Callable, Dict, List

import torch


def llama(layers: int, device: str, dtype: torch.dtype) -> torch.nn.Module:
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=256, intermediate_size=512, num_hidden_layers=layers, num_attention_heads=4,
                      num_key_value_heads=4, vocab_size=1000, attn_implementation="sdpa")
    return LlamaForCausalLM(cfg).eval().to(device=device, dtype=dtype)


class ViewChain(torch.nn.Module):
    """64 rounds of six views (t, unsqueeze, squeeze, t, view, view) and an add on a 4 x 8 tensor."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(64):
            x = x.t().unsqueeze(0).squeeze(0).t().view(-1).view(x.shape) + 1
        return x


def time_peers(peers: Dict[str, Callable[[], object]], rounds: int, calls: int, device: str) -> Dict[str, float]:
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    turns: Dict[str, List[float]] = {k: [] for k in peers}
    with torch.no_grad():
        for f in peers.values():  # compile and warm up
            for _ in range(5):
                f()
        sync()
        names = list(peers)
        for r in range(rounds):
            for k in (names if r % 2 == 0 else names[::-1]):
                t0 = time.perf_counter()
                for _ in range(calls):
                    peers[k]()
                sync()
                turns[k].append((time.perf_counter() - t0) / calls * 1e6)
    return {k: statistics.median(v) for k, v in turns.items()}


def main(argv: List[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--rounds", type=int, default=16)
    p.add_argument("--calls", type=int, default=100)
    p.add_argument("--layers", type=int, default=4)
    args = p.parse_args(argv)
    dtype = torch.bfloat16 if args.device == "cuda" else torch.float32
    torch.manual_seed(0)
    rows = []
    cases = [("HF Llama decode step", lambda: llama(args.layers, args.device, dtype),
              torch.randint(0, 1000, (1, 1), device=args.device), {"use_cache": False}),
             ("view chain (384 views)", ViewChain, torch.randn(4, 8, device=args.device, dtype=dtype), {})]
    for name, make, x, kw in cases:
        try:
            m = make()
        except ImportError as e:  # transformers missing
            rows.append((name, f"skipped: {e}"))
            continue
        torch._dynamo.reset()
        compiled = {"hintbackend": torch.compile(m, backend="hintbackend"),
                    "hb fast_views=False": torch.compile(m, backend="hintbackend", options={"fast_views": False})}
        peers = {"eager": lambda: m(x, **kw)}
        peers.update({k: (lambda c=c: c(x, **kw)) for k, c in compiled.items()})
        rows.append((name, time_peers(peers, args.rounds, args.calls, args.device)))
    print(f"host us a forward (median of {args.rounds} turns of {args.calls} calls), {dtype}, on "
          f"{torch.cuda.get_device_name() if args.device == 'cuda' else 'CPU'}, torch {torch.__version__}")
    print(f"{'graph':<26}{'eager':>10}{'hintbackend':>14}{'hb fast_views=False':>22}{'hb / without':>14}")
    for name, r in rows:
        if isinstance(r, str):
            print(f"{name:<26}{r}")
            continue
        hb, slow = r["hintbackend"], r["hb fast_views=False"]
        print(f"{name:<26}{r['eager']:>10.1f}{hb:>14.1f}{slow:>22.1f}{hb / slow:>14.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
