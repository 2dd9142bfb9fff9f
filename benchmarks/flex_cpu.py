"""FlexAttention on the CPU: eager flex (its math path), Inductor's CPU flex, hintbackend's reference and
its generated tiled kernel (kernel="fused"), side by side, forward and forward+backward.

    python benchmarks/flex_cpu.py                       # B2 H8 S2048 D64, the issue's setting
    python benchmarks/flex_cpu.py --S 1024 --cases causal,relbias

Each (case, variant) runs in its own process so its peak resident memory (ru_maxrss, less the process's
memory once the inputs exist) is its own. Times are the best of --reps after one warm-up call (which
compiles). Inductor's flex has no CPU backward in torch 2.11: its fwd+bwd column says so.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time

VARIANTS = ("eager", "inductor", "hb-reference", "hb-fused")
CASES = ("none", "causal", "softcap", "alibi", "relbias", "logdist", "silu", "trig")


def one(args) -> dict:
    import torch
    from torch._higher_order_ops.flex_attention import flex_attention as flex_hop
    from torch.nn.attention import flex_attention as _fa
    from torch.nn.attention.flex_attention import create_block_mask

    from hintbackend import hinted_context

    torch.manual_seed(0)
    B, H, S, D = args.B, args.H, args.S, args.D
    q, k, v = (torch.randn(B, H, S, D, requires_grad=True) for _ in range(3))
    slope = torch.rand(H)
    lb = torch.randn(2 * S - 1, H, requires_grad=True)
    case = args.case
    score_mod = {
        "none": _fa._identity, "causal": _fa._identity,
        "softcap": lambda s, b, h, qi, ki: 30 * torch.tanh(s / 30),
        "alibi": lambda s, b, h, qi, ki: s + slope[h] * (ki - qi),
        "relbias": lambda s, b, h, qi, ki: s + lb[qi - ki + S - 1, h],
        # a logarithmic distance penalty, and a score-dependent gate (exp in the forward and backward)
        "logdist": lambda s, b, h, qi, ki: s - torch.log1p((qi - ki).abs()),
        "silu": lambda s, b, h, qi, ki: s * torch.sigmoid(s),
        # an erf gate and a periodic (rotary-like) term on the score (sin, erf in the forward; cos, erf, exp in
        # the backward)
        "trig": lambda s, b, h, qi, ki: s * torch.erf(s) + 0.1 * torch.sin(s + (qi - ki) * 0.05),
    }[case]
    if case in ("causal", "alibi", "relbias"):
        bm = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, S, S, device="cpu")
    else:
        bm = _fa._create_empty_block_mask(q, k)
    scale = 1.0 / math.sqrt(D)

    def attn(q, k, v):
        opts = _fa._apply_kernel_options(q, k, v, False, None, None)
        return flex_hop(q, k, v, score_mod, bm.as_tuple(), scale, opts)[0]

    if args.variant == "eager":
        fn = attn
    elif args.variant == "inductor":
        fn = torch.compile(attn)
    else:
        kernel = "fused" if args.variant == "hb-fused" else "aten"

        def hinted(q, k, v):
            with hinted_context(kernel=kernel):
                return attn(q, k, v)
        fn = torch.compile(hinted, backend="hintbackend")

    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = {"case": case, "variant": args.variant}

    def timed(backward: bool):
        best = math.inf
        for rep in range(args.reps + 1):
            t0 = time.perf_counter()
            if backward:
                fn(q, k, v).sum().backward()
            else:
                with torch.no_grad():
                    fn(q, k, v)
            if rep:
                best = min(best, time.perf_counter() - t0)
        return best * 1e3

    for key, backward in (("fwd_ms", False), ("fwdbwd_ms", True)):
        try:
            result[key] = timed(backward)
        except Exception as e:  # a variant that cannot run this: say so in the table
            result[key] = None
            result[key + "_error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:80]}"
    result["peak_mib"] = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - base) / 1024
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--B", type=int, default=2)
    p.add_argument("--H", type=int, default=8)
    p.add_argument("--S", type=int, default=2048)
    p.add_argument("--D", type=int, default=64)
    p.add_argument("--reps", type=int, default=2)
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--case", help=argparse.SUPPRESS)
    p.add_argument("--variant", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.case:
        print(json.dumps(one(args)))
        return

    import torch

    print(f"# FlexAttention on CPU: B{args.B} H{args.H} S{args.S} D{args.D} float32, torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads; ms best of {args.reps}, peak = max RSS growth")
    rows = {}
    for case in args.cases.split(","):
        for variant in args.variants.split(","):
            cmd = [sys.executable, __file__, "--case", case, "--variant", variant] + [
                f"--{n}={getattr(args, n)}" for n in ("B", "H", "S", "D", "reps")]
            out = subprocess.run(cmd, capture_output=True, text=True, env=os.environ)
            lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
            rows[case, variant] = json.loads(lines[-1]) if lines else {"fwd_ms": None, "fwdbwd_ms": None,
                                                                      "fwd_ms_error": out.stderr.strip()[-80:]}

    def cell(r, key):
        return f"{r[key]:.0f}" if r.get(key) is not None else "fails"

    variants = args.variants.split(",")
    print("| case | " + " | ".join(f"{v} fwd / fwd+bwd ms (peak MiB)" for v in variants) +
          " | fused vs eager fwd / fwd+bwd |")
    print("|---" * (len(variants) + 2) + "|")
    for case in args.cases.split(","):
        cells = []
        for v in variants:
            r = rows[case, v]
            cells.append(f"{cell(r, 'fwd_ms')} / {cell(r, 'fwdbwd_ms')} ({r.get('peak_mib', 0):.0f})")
        e, f = rows.get((case, "eager")), rows.get((case, "hb-fused"))
        ratio = "-"
        if e and f and e.get("fwd_ms") and f.get("fwd_ms"):
            ratio = f"{e['fwd_ms'] / f['fwd_ms']:.2f}x"
            if e.get("fwdbwd_ms") and f.get("fwdbwd_ms"):
                ratio += f" / {e['fwdbwd_ms'] / f['fwdbwd_ms']:.2f}x"
        print(f"| {case} | " + " | ".join(cells) + f" | {ratio} |")
    errors = [(k, r[e]) for k, r in rows.items() for e in ("fwd_ms_error", "fwdbwd_ms_error") if e in r]
    for (case, variant), msg in errors[:8]:
        print(f"# {case} / {variant}: {msg}")


if __name__ == "__main__":
    main()
