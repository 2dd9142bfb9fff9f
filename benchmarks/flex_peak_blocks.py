"""What is live at the peak of one warm FlexAttention forward+backward step, per peer: the CUDA caching
allocator's history (torch.cuda.memory._record_memory_history) replayed to the step's highest point, the
largest blocks printed with the C++ and Python frames that allocated them.

    python benchmarks/flex_peak_blocks.py [--b 4 --h 16 --s 4096 --d 128] [--peers fused,default,inductor]

fused: hintbackend with hinted_context(kernel="fused"); default: hintbackend's own choice; inductor:
torch.compile's default backend. bf16, no mask, no score_mod. The peak is above what was allocated before
the step (q, k, v, dO and their gradients from earlier steps), as benchmarks/flex.py counts it.
"""
from __future__ import annotations

import argparse
import os

import torch
from torch.nn.attention.flex_attention import flex_attention

from hintbackend import hinted_context

from attention_shape import add_shape_args


def frames_of(block: dict) -> str:
    keep = [f"{f['name'][:70]}@{os.path.basename(f['filename'])}:{f['line']}" for f in block.get("frames") or []
            if "hb::" in f["name"] or "flex" in f["name"].lower()
            or (f["filename"].endswith(".py") and "site-packages/torch/" not in f["filename"])]
    return " < ".join(keep[:4])


def main() -> None:
    p = argparse.ArgumentParser()
    add_shape_args(p)
    p.add_argument("--peers", default="fused,default")
    p.add_argument("--top", type=int, default=12)
    args = p.parse_args()
    torch.manual_seed(0)
    shape = (args.b, args.h, args.s, args.d)
    q, k, v, dout = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    q, k, v = (t.requires_grad_(True) for t in (q, k, v))
    for peer in args.peers.split(","):
        def attn(q, k, v, peer=peer):
            if peer == "fused":
                with hinted_context(kernel="fused"):
                    return flex_attention(q, k, v)
            return flex_attention(q, k, v)

        f = torch.compile(attn, backend="inductor" if peer == "inductor" else "hintbackend")

        def step():
            f(q, k, v).backward(dout)

        step(), step()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        torch.cuda.memory._record_memory_history(max_entries=200000, stacks="all")
        step()
        torch.cuda.synchronize()
        snap = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
        peak = (torch.cuda.max_memory_allocated() - base) / 2**20
        live, cur, best, at_peak = {}, 0, -1, {}
        for e in snap["device_traces"][torch.cuda.current_device()]:
            if e["action"] == "alloc":
                live[e["addr"]] = e
                cur += e["size"]
                if cur > best:
                    best, at_peak = cur, dict(live)
            elif e["action"] in ("free_requested", "free_completed") and e["addr"] in live:
                cur -= live.pop(e["addr"])["size"]
        print(f"== {peer}: peak {peak:.1f} MiB above the step's start; {len(at_peak)} blocks allocated in the step "
              f"live there ({best / 2**20:.1f} MiB)", flush=True)
        for e in sorted(at_peak.values(), key=lambda e: -e["size"])[:args.top]:
            print(f"  {e['size'] / 2**20:9.3f} MiB  {frames_of(e)[:300]}", flush=True)
        for t in (q, k, v):
            t.grad = None
        torch._dynamo.reset()
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
