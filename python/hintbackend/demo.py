"""Demo: train a small GPT-style model whose attention is FlexAttention with a causal block mask and
a learned relative-position bias, compiled with backend="hintbackend", side by side with a reference.

    python -m hintbackend.demo [--steps 5] [--device cuda|cpu] [--dump-dir hb-dumps] [--dfs [--slice-dims 0,1]]

Prints the loss per step for both runs and the largest difference of loss and parameters, and
writes a graph dump. On CUDA the reference is eager PyTorch with the public flex_attention API. On
CPU, torch 2.11's public API refuses FlexAttention backward, so the CPU variant calls the same
higher-order op the public API calls under torch.compile (hintbackend.flex) and the reference is
PyTorch's own math implementation of that op (torch.compile with the "aot_eager" backend). The demo
says which variant ran.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from .flex import flex_attention_hop_call
from .hoo import hinted_context


class Block(nn.Module):
    def __init__(self, d: int, heads: int, seq: int, block_mask, on_cpu: bool, attn_dtype=None,
                 attn_hints=None, rel_bias: bool = True) -> None:
        super().__init__()
        self.heads, self.seq, self.block_mask, self.on_cpu = heads, seq, block_mask, on_cpu
        self.attn_dtype = attn_dtype  # q, k, v cast to it for the attention (mixed precision), or None
        self.attn_hints = attn_hints  # hinted_context hints around the attention (e.g. schedule="dfs"), or None
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))
        # learned relative-position bias, one scalar per (distance, head): its gradient is the
        # backward's scatter into a captured buffer
        self.rel_bias = nn.Parameter(0.02 * torch.randn(2 * seq - 1, heads)) if rel_bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        B, S, D = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(B, S, 3, self.heads, D // self.heads).permute(2, 0, 3, 1, 4)
        bias, seq = self.rel_bias, self.seq
        if self.attn_dtype is not None:
            q, k, v = (t.to(self.attn_dtype) for t in (q, k, v))

        def rel_bias(score, b, h, q_idx, kv_idx):
            return score + bias[q_idx - kv_idx + seq - 1, h]

        score_mod = rel_bias if bias is not None else None  # None: causal attention, no score_mod

        def attention(q, k, v):
            if self.on_cpu:
                return flex_attention_hop_call(q, k, v, score_mod, self.block_mask)
            return flex_attention(q, k, v, score_mod=score_mod, block_mask=self.block_mask)

        if self.attn_hints:
            with hinted_context(**self.attn_hints):
                a = attention(q, k, v)
        else:
            a = attention(q, k, v)
        x = x + self.proj(a.to(x.dtype).transpose(1, 2).reshape(B, S, D))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab: int = 256, d: int = 64, heads: int = 4, layers: int = 2, seq: int = 128,
                 device: str = "cpu", attn_dtype=None, attn_hints=None, rel_bias: bool = True) -> None:
        super().__init__()
        block_mask = create_block_mask(lambda b, h, q, kv: q >= kv, None, None, seq, seq, device=device)
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Parameter(0.02 * torch.randn(seq, d))
        self.blocks = nn.ModuleList(Block(d, heads, seq, block_mask, device == "cpu", attn_dtype, attn_hints, rel_bias)
                                    for _ in range(layers))
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos[: idx.shape[1]]
        for blk in self.blocks:
            x = blk(x)
        logits = self.head(self.ln(x))
        return F.cross_entropy(logits.flatten(0, 1), targets.flatten())


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--dump-dir", default="hb-dumps")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--attn-dtype", choices=["float32", "bfloat16", "float16"], default="float32",
                   help="the attention's q, k, v dtype (the rest stays float32); on CUDA, bfloat16 and float16 "
                        "run FlexAttention on cuDNN, whose rounding the tolerance then allows for")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="replay each compiled graph as a CUDA graph (options={'cuda_graphs': True}, what "
                        "mode='reduce-overhead' sets)")
    p.add_argument("--dfs", action="store_true",
                   help="run each attention in a hinted_context(schedule='dfs') region: one slice at a time, "
                        "the learned bias's gradient summed over the slices (docs/hints.md)")
    p.add_argument("--slice-dims", default="",
                   help="with --dfs: the slice_dims hint, e.g. 0,1 (batch and heads: each slice reads its global "
                        "head index); default: batch and heads, narrowed to batch because the bias reads h")
    args = p.parse_args(argv)
    hints = None
    if args.dfs:
        hints = {"schedule": "dfs"}
        if args.slice_dims:
            hints["slice_dims"] = [int(x) for x in args.slice_dims.split(",")]
    elif args.slice_dims:
        p.error("--slice-dims needs --dfs")

    torch.manual_seed(0)
    dev = args.device
    on_cpu = dev == "cpu"
    attn_dtype = None if args.attn_dtype == "float32" else getattr(torch, args.attn_dtype)
    model = TinyGPT(seq=args.seq, device=dev, attn_dtype=attn_dtype, attn_hints=hints).to(dev)
    ref_model = copy.deepcopy(model)
    if on_cpu:
        variant = ("CPU variant: flex_attention's higher-order op called directly (torch 2.11's public API "
                   "refuses CPU backward); reference = PyTorch's math implementation (aot_eager)")
        ref = torch.compile(ref_model, backend="aot_eager")
    else:
        variant = f"{dev} variant: public flex_attention API; reference = eager PyTorch"
        ref = ref_model
    print(f"hintbackend demo: {variant}")
    region = f", in a hinted_context{hints} region" if hints else ""
    print(f"model: TinyGPT, 2 blocks, d=64, 4 heads, seq={args.seq}, batch={args.batch}, causal block mask + "
          f"learned relative bias, attention in {args.attn_dtype}{region}")
    compiled = torch.compile(model, backend="hintbackend",
                             options={"dump_dir": args.dump_dir, "strict": True, "cuda_graphs": args.cuda_graphs})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.1)

    g = torch.Generator().manual_seed(1)
    print(f"{'step':>4} {'loss (hintbackend)':>20} {'loss (reference)':>18} {'|diff|':>10} {'ms':>8}")
    worst = 0.0
    for step in range(args.steps):
        data = torch.randint(0, 256, (args.batch, args.seq + 1), generator=g).to(dev)
        idx, tgt = data[:, :-1], data[:, 1:]
        t0 = time.perf_counter()
        loss = compiled(idx, tgt)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if dev.startswith("cuda"):
            torch.cuda.synchronize()
        ms = 1e3 * (time.perf_counter() - t0)
        ref_loss = ref(idx, tgt)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        diff = abs(loss.item() - ref_loss.item())
        worst = max(worst, diff)
        print(f"{step:>4} {loss.item():>20.6f} {ref_loss.item():>18.6f} {diff:>10.2e} {ms:>8.1f}")
    pdiff = max((a - b).abs().max().item() for a, b in zip(model.parameters(), ref_model.parameters()))
    print(f"max |loss diff| = {worst:.3e}; max |parameter diff| after {args.steps} steps = {pdiff:.3e}")
    dumps = sorted(os.listdir(args.dump_dir)) if os.path.isdir(args.dump_dir) else []
    print(f"graph dump: {os.path.abspath(args.dump_dir)} ({', '.join(dumps)})")
    if hints:  # what slice-schedule did with the region, per graph (the dump's notes.txt)
        for d in dumps:
            notes = os.path.join(args.dump_dir, d, "notes.txt")
            for line in open(notes).read().splitlines() if os.path.exists(notes) else []:
                if line.startswith("slice-schedule region"):
                    print(f"  {d}: {line.strip()}")
    # float32: both runs compute the same math; a half-precision attention rounds differently in each
    # (cuDNN's fused kernel against eager's math path), by about its epsilon per step.
    tol = 1e-3 if attn_dtype is None else 2e-2
    ok = worst < tol and pdiff < tol
    print("OK: hintbackend matches the reference" if ok else "MISMATCH: hintbackend differs from the reference")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
