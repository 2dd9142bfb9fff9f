"""LayerNorm on CUDA: eager (ATen's kernels) against hintbackend (KernelKind::LayerNormRows for rows up
to 1024 elements: codegen/cuda/LayerNorm.cu), side by side in one process. Per row width n, about
`--elements` elements in all (rows = elements / n), bf16 by default: the device time of the forward
and of the backward (torch.profiler's CUDA kernels, summed, per call; the compiled call's host time
does not count), their ratio, and the largest error of each against a float64 reference. With --act,
the layer norm of an activation, layer_norm(act(h)): eager runs the activation, the layer norm and, in the
backward, their two backward ops; hintbackend folds the activation into the layer norm
(fold-layer-norm-activation: one kernel each way, the activation never stored).

    python benchmarks/layer_norm.py [--widths 32,64,...] [--elements 33554432] [--dtype bfloat16]
                                    [--act gelu|gelu_tanh|silu]
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile


def layer_norm(x, w, b):
    return F.layer_norm(x, x.shape[-1:], w, b, 1e-5)


ACTIVATIONS = {"none": lambda h: h, "gelu": F.gelu, "gelu_tanh": lambda h: F.gelu(h, approximate="tanh"),
               "silu": F.silu}


def act_layer_norm(act: str):
    f = ACTIVATIONS[act]

    def fn(x, w, b):
        return F.layer_norm(f(x), x.shape[-1:], w, b, 1e-5)
    return fn if act != "none" else layer_norm


def device_ms(fn, iters: int) -> float:
    """The CUDA kernels' time of one fn() (ms), summed over `iters` calls under the profiler."""
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    return sum(e.device_time for e in kernels) / 1e3 / iters


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--widths", default="32,64,128,256,384,512,768,1024")
    p.add_argument("--elements", type=int, default=1 << 25)
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    p.add_argument("--iters", type=int, default=20)
    p.add_argument("--act", default="none", choices=sorted(ACTIVATIONS),
                   help="time layer_norm(act(x)) (hintbackend folds the activation in)")
    args = p.parse_args()
    dtype = getattr(torch, args.dtype)
    fn_of = act_layer_norm(args.act)
    what = "LayerNorm" if args.act == "none" else f"LayerNorm of {args.act}"
    print(f"{what} on {torch.cuda.get_device_name()}, {args.dtype}, {args.elements} elements a call, "
          f"device ms a call (torch.profiler), torch {torch.__version__}")
    print(f"{'n':>6}{'rows':>10}{'eager fw':>10}{'hb fw':>9}{'hb/eager':>10}{'eager bw':>10}{'hb bw':>9}"
          f"{'hb/eager':>10}{'err eager':>11}{'err hb':>9}")
    for n in [int(v) for v in args.widths.split(",")]:
        rows = args.elements // n
        torch.manual_seed(n)
        x = (torch.randn(rows, n, device="cuda") * 3 + 1.5).to(dtype).requires_grad_()
        w = (torch.randn(n, device="cuda") * 0.5 + 1).to(dtype).requires_grad_()
        b = torch.randn(n, device="cuda").to(dtype).requires_grad_()
        gy = torch.randn(rows, n, device="cuda").to(dtype)
        torch._dynamo.reset()
        peers = {"eager": fn_of, "hb": torch.compile(fn_of, backend="hintbackend", dynamic=False)}
        ref = fn_of(x.double(), w.double(), b.double())
        row = {}
        for name, fn in peers.items():
            y = fn(x, w, b)
            err = (y.double() - ref).abs().max().item()
            def fwbw():
                x.grad = w.grad = b.grad = None  # no accumulation kernels: each gradient is the backward's own
                fn(x, w, b).backward(gy)
            fw = device_ms(lambda: fn(x, w, b), args.iters)
            row[name] = (fw, device_ms(fwbw, args.iters) - fw, err)
        e, h = row["eager"], row["hb"]
        print(f"{n:>6}{rows:>10}{e[0]:>10.4f}{h[0]:>9.4f}{h[0] / e[0]:>10.2f}{e[1]:>10.4f}{h[1]:>9.4f}"
              f"{h[1] / e[1]:>10.2f}{e[2]:>11.2e}{h[2]:>9.2e}", flush=True)


if __name__ == "__main__":
    main()
