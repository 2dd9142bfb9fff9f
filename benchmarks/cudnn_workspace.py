"""cuDNN's SDPA workspace against the memory plan's model of it (issue 13).

For each case, flex_attention compiled through hintbackend runs one forward + backward step on CUDA; the
table shows, per compiled graph (forward, backward), the workspace cuDNN asked for
(CompiledGraph.kernel_workspace_bytes: the largest one kernel allocated in the last run) next to the
model the planner counts (CompiledGraph.cudnn_workspace_model: cudnn_sdpa_workspace_bytes in
codegen/FlexLowering.cpp), and their ratio. The model must be an upper bound everywhere and close where
the bytes matter.

    python benchmarks/cudnn_workspace.py            # the grid of docs/flex-attention.md
    python benchmarks/cudnn_workspace.py --quick    # small shapes only
    python benchmarks/cudnn_workspace.py --json out.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import hintbackend.backend as hb_backend
from hintbackend import hinted_context

MiB = 1 << 20


def causal(b, h, q, kv):
    return q >= kv


def make_case(bias: str, B: int, H: int, Hkv: int, S: int, D: int, dtype=torch.bfloat16):
    """(q, k, v, dout, score_mod or None, the bias buffer that wants a gradient or None)."""
    q = torch.randn(B, H, S, D, device="cuda", dtype=dtype, requires_grad=True)
    k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=dtype, requires_grad=True) for _ in range(2))
    dout = torch.randn(B, H, S, D, device="cuda", dtype=dtype)
    if bias == "none":
        return q, k, v, dout, None, None
    if bias == "relative":  # a learned relative bias lb[q - kv + S - 1, h]
        buf = torch.randn(2 * S - 1, H, device="cuda", requires_grad=True)
        return q, k, v, dout, lambda s, b, h, qi, kv: s + buf[qi - kv + S - 1, h], buf
    if bias == "dense":  # a dense [H, S, S] bias (the [1, H, S, S] one cuDNN adds)
        buf = torch.randn(H, S, S, device="cuda", requires_grad=True)
        return q, k, v, dout, lambda s, b, h, qi, kv: s + buf[h, qi, kv], buf
    raise ValueError(bias)


def measure(graphs, mask: str, bias: str, B: int, H: int, Hkv: int, S: int, D: int, det: bool) -> list:
    torch._dynamo.reset()
    first = len(graphs)
    q, k, v, dout, mod, buf = make_case(bias, B, H, Hkv, S, D)
    bm = create_block_mask(causal, None, None, S, S, device="cuda") if mask == "causal" else None

    def attn(q, k, v):
        with hinted_context(deterministic=det):
            return flex_attention(q, k, v, score_mod=mod, block_mask=bm, enable_gqa=H != Hkv)

    fn = torch.compile(attn, backend="hintbackend", options={"compile_cache": False})
    fn(q, k, v).backward(dout)
    torch.cuda.synchronize()
    rows = []
    for name, g in graphs[first:]:
        model = sum(b for _, b in g.cudnn_workspace_model)
        on_cudnn = bool(g.cudnn_workspace_model)
        rows.append(dict(graph=name.split("_")[0], mask=mask, bias=bias, B=B, H=H, Hkv=Hkv, S=S, D=D,
                         deterministic=det, cudnn=on_cudnn, reported=g.kernel_workspace_bytes, model=model))
    del q, k, v, dout, buf
    torch.cuda.empty_cache()
    return rows


def grid(quick: bool):
    """(mask, bias, B, H, Hkv, S, D, deterministic): every bias and both algorithms on small shapes (S % 128 != 0
    and GQA among them), causal on one, then the large shapes where the bytes matter."""
    small = [(1, 4, 4, 256, 64), (2, 8, 8, 1000, 128), (2, 8, 2, 640, 64)]  # (B, H, Hkv, S, D)
    for shape, bias, det in itertools.product(small, BIASES, [False, True]):
        yield ("none", bias, *shape, det)
    for bias in BIASES:
        yield ("causal", bias, 2, 8, 8, 1000, 128, False)
    if quick:
        return
    for bias, det in itertools.product(BIASES, [False, True]):
        yield ("none", bias, 2, 16, 16, 2048, 128, det)
    for bias in BIASES:
        yield ("none", bias, 4, 16, 16, 4096, 128, False)
    yield ("none", "none", 4, 16, 16, 4096, 128, True)
    for bias in ["none", "relative"]:
        yield ("none", bias, 4, 16, 16, 4096, 64, False)


BIASES = ["none", "relative", "dense"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small shapes only")
    p.add_argument("--json", help="write the rows here too")
    args = p.parse_args(argv)
    with hb_backend.compiled_graphs() as graphs:
        return run(graphs, args)


def run(graphs, args) -> int:
    print(torch.cuda.get_device_name(), "torch", torch.__version__, "cuDNN", torch.backends.cudnn.version())
    head = f"{'graph':8} {'mask':6} {'bias':8} {'B':>2} {'H':>3} {'Hkv':>3} {'S':>5} {'D':>3} {'det':>3} " \
           f"{'reported MiB':>13} {'model MiB':>10} {'model/rep':>9}"
    print(head)
    rows, bad = [], 0
    for case in grid(args.quick):
        mask, bias, B, H, Hkv, S, D, det = case
        try:
            measured = measure(graphs, mask, bias, B, H, Hkv, S, D, det)
        except Exception as e:  # noqa: BLE001 - a case cuDNN refuses is a row of the table, not the end of it
            print(f"{'-':8} {mask:6} {bias:8} {B:>2} {H:>3} {Hkv:>3} {S:>5} {D:>3} {det:>3d}   failed: "
                  f"{str(e).splitlines()[0][:200]}", flush=True)
            torch.cuda.empty_cache()
            continue
        for r in measured:
            rows.append(r)
            if not r["cudnn"]:
                print(f"{r['graph']:8} {mask:6} {bias:8} {B:>2} {H:>3} {Hkv:>3} {S:>5} {D:>3} {det:d}   not on cuDNN")
                continue
            ratio = r["model"] / r["reported"] if r["reported"] else float("inf") if r["model"] else 1.0
            under = r["model"] < r["reported"]
            bad += under
            print(f"{r['graph']:8} {mask:6} {bias:8} {B:>2} {H:>3} {Hkv:>3} {S:>5} {D:>3} {det:>3d} "
                  f"{r['reported'] / MiB:>13.3f} {r['model'] / MiB:>10.3f} {ratio:>9.3f}{'  UNDER' if under else ''}",
                  flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    print(f"{len(rows)} graphs, {bad} where the model is below cuDNN's workspace")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
