"""Max and norm relative errors against float64 of a learned relative bias with a float32 table (causal,
B2 H4 S1024 D128, bf16 q/k/v; hintbackend runs its backward on the generated kernels): eager flex,
hintbackend, and hintbackend with deterministic=True (run twice: are the results bitwise equal?).

    python benchmarks/flex_errors.py [--s 1024] [--d 128]

Each cell: max |x - ref| / max |ref|, then ||x - ref|| / ||ref||, for out, dq, dk, dv and the table's gradient.
"""
from __future__ import annotations

import argparse

import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from hintbackend import hinted_context


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--s", type=int, default=1024)
    p.add_argument("--d", type=int, default=128)
    args = p.parse_args()
    torch.manual_seed(0)
    B, H, S, D = 2, 4, args.s, args.d
    q, k, v, dout = (torch.randn(B, H, S, D, device="cuda", dtype=torch.float64) for _ in range(4))
    table = torch.randn(2 * S - 1, H, device="cuda", dtype=torch.float64)
    bm = create_block_mask(lambda b, h, qi, kv: qi >= kv, None, None, S, S, device="cuda")

    def run(compiled: bool, deterministic: bool, dtype: torch.dtype) -> list:
        t = [x.to(dtype).clone().requires_grad_(True) for x in (q, k, v)]
        buf = table.to(torch.float64 if dtype == torch.float64 else torch.float32).clone().requires_grad_(True)

        def f(q_, k_, v_):
            with hinted_context(deterministic=deterministic):
                return flex_attention(q_, k_, v_, lambda s, b, h, qi, kv: s + buf[qi - kv + S - 1, h], block_mask=bm)

        if compiled:
            torch._dynamo.reset()
            f = torch.compile(f, backend="hintbackend")
        out = f(*t)
        out.backward(dout.to(dtype))
        return [out.detach()] + [x.grad for x in t] + [buf.grad]

    ref = run(False, False, torch.float64)

    def errs(xs: list) -> str:
        return " ".join(f"{((x.double() - r).abs().max() / r.abs().max()).item():.2e}/"
                        f"{((x.double() - r).norm() / r.norm()).item():.2e}" for x, r in zip(xs, ref))

    print(f"B{B} H{H} S{S} D{D} causal, bf16, on {torch.cuda.get_device_name()}: max-rel/norm-rel of out dq dk dv "
          "dtable", flush=True)
    print("eager flex      ", errs(run(False, False, torch.bfloat16)), flush=True)
    print("hintbackend     ", errs(run(True, False, torch.bfloat16)), flush=True)
    a, b = run(True, True, torch.bfloat16), run(True, True, torch.bfloat16)
    print("hb deterministic", errs(a), "| two runs bitwise equal:", all(torch.equal(x, y) for x, y in zip(a, b)),
          flush=True)


if __name__ == "__main__":
    main()
