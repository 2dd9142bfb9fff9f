"""FlexAttention forward+backward: hintbackend against Inductor's flex and SDPA on cuDNN, side by side in one
process (the issue-13 table). bf16, B4 H16 S4096, D64 and D128; TFLOP/s counted as in shared FACTS
(3.5 x 4*B*H*S^2*D for forward+backward, halved for causal), median of CUDA-event-timed steps; peak MiB
above the inputs.

    python benchmarks/flex.py [--s 4096] [--steps 20] [--rows none,causal,...] [--check] [--profile] [--deterministic]
                              [--fused] [--cudnn] [--reference] [--dtype bfloat16|float16|float32]

--dtype: q, k, v and the output gradient's dtype (bfloat16 by default). With float32 hintbackend's default
runs the generated SIMT kernels (cuDNN and the tensor-core kernels take no float32); choose --peers
inductor,hintbackend then, as SDPA on cuDNN refuses float32.

--fused adds the column hb-fused: hintbackend with hinted_context(kernel="fused"), the generated tiled CUDA
kernels (issue 14) instead of cuDNN (with --deterministic also hb-fused-det, those kernels with
deterministic=True: dQ added in key-tile order, for rows whose buffers get no gradient); --cudnn the column hb-cudnn, hinted_context(kernel="cudnn") (the
default takes some backwards elsewhere: a float32 table's gradient, which cuDNN's dBias would round).
--reference adds hb-aten, hinted_context(kernel="aten"): the dense reference (S x S scores).
--cuda-graphs adds hb-cg: hintbackend with options={"cuda_graphs": True} (the compiled forward and backward
replayed as CUDA graphs: the host time per step mostly gone; its q/k/v gradients are set to None before
each step, as cudagraph trees require, where the other peers accumulate).

Two timings of each peer, printed as two tables: "synced", each step timed alone (the host waits for the
GPU after every step, so the host time before a step's first kernel and between its forward and backward
counts), and "queued", steps launched back to back as a training loop does (per-step CUDA events, one
synchronization at the end): the host runs ahead and only GPU time and GPU idle time count.

Rows: none, causal, window (causal sliding window of 1024), document (packed documents of 256-1024 tokens, causal
within each; the mask reads a buffer of document ids) (masks; TFLOP/s of window and document counted at the
block mask's density); softcap; qbias, hbias (learned per-query / per-head bias, grad); relbias, relbias16
(learned relative bias lb[q - kv + S - 1, h], fp32 / bf16 buffer, grad; relbiast, relbias16t: the same with
the table stored [H][2S - 1] and passed transposed, so that a head's diagonals are contiguous); dense, dense16 (learned [1, H, S, S]
fp32 / bf16 bias, grad); alibi (slope buffer, no grad); relpos ((q - kv) * 0.01). The sdpa-cudnn column of a
bias row is SDPA on cuDNN with the same bias as a [1, H, S, S] bf16 attn_mask that needs no gradient (torch
2.11's cuDNN SDPA refuses a learnable one): a ceiling, not the same work. The cudnn-bias column of a relbias
row is cuDNN's own bias and dBias for the same attention: hintbackend's dense path on the bias already
materialized as a learnable [1, H, S, S] buffer in the dtype the relbias path materializes (the table's when
it is bf16, else float32), so that hintbackend / cudnn-bias is what the gather and the dBias reduction cost.
The big biases' gradients are set to None before each step (as zero_grad does), so no peer times autograd's
accumulation of a 1 GiB gradient.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from hintbackend import hinted_context

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from attention_shape import add_shape_args  # noqa: E402
from memory_models import measure  # noqa: E402  (peak above what was allocated before, median ms)


def measure_queued(step, steps: int) -> float:
    """Median ms per step with steps launched back to back (events around each, one sync at the end)."""
    step()
    torch.cuda.synchronize()
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(steps)]
    for a, b in events:
        a.record()
        step()
        b.record()
    torch.cuda.synchronize()
    times = sorted(a.elapsed_time(b) for a, b in events)
    return times[len(times) // 2]


def causal(b, h, q, kv):
    return q >= kv


WINDOW = 1024  # row window: the causal sliding window of the shared FACTS zoo


def window(b, h, q, kv):
    return (q >= kv) & (q - kv <= WINDOW)


# Row document: packed documents, causal within each; DOCS["ids"][i] is token i's document (made in main()).
DOCS = {}


def document(b, h, q, kv):
    return (DOCS["ids"][q] == DOCS["ids"][kv]) & (q >= kv)


def document_ids(S: int, device: str) -> torch.Tensor:
    """Token i's document for documents of random lengths (seeded: every run the same layout), 256 to 1024
    tokens each, the last one cut at S."""
    g = torch.Generator().manual_seed(1)
    lengths = []
    while sum(lengths) < S:
        lengths.append(int(torch.randint(256, 1025, (1,), generator=g)))
    ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))[:S]
    return ids.to(device=device, dtype=torch.int32)


MASKS = {"causal": causal, "window": window, "document": document}


def softcap(score, b, h, q, kv):
    return 30 * torch.tanh(score / 30)


# Learned biases that do not depend on kv_idx (rows qbias, hbias): created per row in main().
BIASES = {}


def qbias(score, b, h, q, kv):
    return score + BIASES["q"][q]


def hbias(score, b, h, q, kv):
    return score + BIASES["h"][h]


# Learned biases that depend on kv_idx (cuDNN takes them materialized, dBias scattered back).
def relbias(score, b, h, q, kv):
    return score + BIASES["rel"][q - kv + BIASES["S"] - 1, h]


def dense(score, b, h, q, kv):
    return score + BIASES["dense"][0, h, q, kv]


def materialized(score, b, h, q, kv):  # the cudnn-bias peer: a relbias row's bias, materialized
    return score + BIASES["mat"][0, h, q, kv]


def alibi(score, b, h, q, kv):
    return score + BIASES["slope"][h] * (kv - q)


def relpos(score, b, h, q, kv):
    return score + (q - kv) * 0.01


SCORE_MODS = {"softcap": softcap, "qbias": qbias, "hbias": hbias, "relbias": relbias, "relbias16": relbias,
              "relbiast": relbias, "relbias16t": relbias,
              "dense": dense, "dense16": dense, "alibi": alibi, "relpos": relpos}


def profile(what: str, fn) -> None:
    """One step's CUDA kernels summed by name, heaviest first; the GPU's idle time inside the step (the span
    from the first kernel's start to the last one's end, less the time some kernel ran); and the CUDA
    runtime calls that can make the host wait (synchronizations, copies), which leave the GPU idle."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity
    with torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == DeviceType.CUDA]
    by_name: dict = {}
    for e in kernels:
        t, n = by_name.get(e.name, (0.0, 0))
        by_name[e.name] = (t + e.time_range.elapsed_us(), n + 1)
    total = sum(t for t, _ in by_name.values())
    from profile_slicing import busy_time
    spans = [(e.time_range.start, e.time_range.end) for e in kernels]
    busy = busy_time(spans)
    span = max(b for _, b in spans) - min(a for a, _ in spans) if spans else 0.0
    print(f"  {what}: {total / 1e3:.3f} ms of CUDA kernels, {len(kernels)} launches; span {span / 1e3:.3f} ms, "
          f"GPU idle {(span - busy) / 1e3:.3f} ms")
    for name, (t, n) in sorted(by_name.items(), key=lambda x: -x[1][0])[:10]:
        print(f"    {t / 1e3:8.3f} ms x{n:<3} {name[:100]}")
    waits = {}
    for e in prof.events():
        if e.device_type == DeviceType.CPU and any(w in e.name for w in ("Synchronize", "cudaMemcpy", "Memset")):
            t, n = waits.get(e.name, (0.0, 0))
            waits[e.name] = (t + e.time_range.elapsed_us(), n + 1)
    for name, (t, n) in sorted(waits.items(), key=lambda x: -x[1][0]):
        print(f"    host waits: {name} x{n}, {t / 1e3:.3f} ms")
    cpu = [e for e in prof.key_averages() if e.self_cpu_time_total > 0]
    cpu.sort(key=lambda e: -e.self_cpu_time_total)
    print(f"    host time {sum(e.self_cpu_time_total for e in cpu) / 1e3:.3f} ms (under the profiler), heaviest:")
    for e in cpu[:8]:
        print(f"      {e.self_cpu_time_total / 1e3:8.3f} ms x{e.count:<3} {e.key[:90]}")
    # Where the step's host time goes, nested ranges with their children (Dynamo's frame, AOTAutograd's
    # autograd.Function, hintbackend's executor and its steps): what delays the first kernel and the backward.
    spans = [e for e in prof.key_averages() if any(w in e.key for w in (
        "Torch-Compiled", "TorchDynamo", "CompiledFunction", "hb ", "autograd::engine", "_cudnn_attention"))]
    spans.sort(key=lambda e: -e.cpu_time_total)
    for e in spans[:12]:
        print(f"      {e.cpu_time_total / 1e3:8.3f} ms x{e.count:<3} (total) {e.key[:80]}")


def check(args) -> None:
    """Relative error ||x - ref|| / ||ref|| of out, dq, dk, dv (and the learned table's gradient, relbias)
    against a float64 reference, for hintbackend (cuDNN where selected), hintbackend with
    deterministic=True, and eager flex (its math path in bf16), on fresh random inputs."""
    S = 1024
    print(f"error against float64 (B2 H4 S{S} bf16): out dq dk dv [dtable], hintbackend | hb deterministic | eager")
    for D in (int(d) for d in args.dims.split(",")):
        for row in ("none", "causal", "relbias", "relbias16"):
            torch.manual_seed(D + len(row))
            q, k, v, dout = (torch.randn(2, 4, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
            table = torch.randn(2 * S - 1, 4, device="cuda") if row.startswith("relbias") else None
            table_dtype = torch.bfloat16 if row == "relbias16" else torch.float32
            bm = create_block_mask(causal, None, None, S, S, device="cuda") if row != "none" else None

            def make(buf, deterministic):
                def mod(score, b, h, qi, kv):
                    return score + buf[qi - kv + S - 1, h]

                def attn(q, k, v):
                    with hinted_context(deterministic=deterministic):
                        return flex_attention(q, k, v, score_mod=mod if buf is not None else None, block_mask=bm)

                return attn

            def grads(compiled, deterministic, *t):
                t = [x.detach().clone().requires_grad_(True) for x in t[:3]] + [t[3]]
                buf = None
                if table is not None:
                    buf = table.to(table_dtype).to(torch.float64 if t[0].dtype == torch.float64 else table_dtype)
                    buf = buf.detach().clone()
                    buf.requires_grad_(True)
                fn = make(buf, deterministic)
                if compiled:
                    torch._dynamo.reset()
                    fn = torch.compile(fn, backend="hintbackend")
                out = fn(*t[:3])
                out.backward(t[3])
                return [out] + [x.grad for x in t[:3]] + ([buf.grad] if buf is not None else [])

            hb = grads(True, False, q, k, v, dout)
            hb_det = grads(True, True, q, k, v, dout)
            eager = grads(False, False, q, k, v, dout)
            ref = grads(False, False, q.double(), k.double(), v.double(), dout.double())

            def errs(xs):
                return " ".join(f"{((x.double() - r).norm() / r.norm()).item():.2e}" for x, r in zip(xs, ref))

            print(f"  {row:<9} D{D:<4} {errs(hb)} | {errs(hb_det)} | {errs(eager)}", flush=True)


def main() -> None:
    p = argparse.ArgumentParser()
    add_shape_args(p, head_dim=False)  # --dims: the head dims
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--dims", default="64,128")
    p.add_argument("--rows", default="none,causal,window,document,softcap,qbias,hbias,relbias,relbias16,dense,dense16,alibi,relpos")
    p.add_argument("--profile", action="store_true",
                   help="print the CUDA kernels of one step of each peer (torch.profiler), heaviest first")
    p.add_argument("--check", action="store_true",
                   help="first print hintbackend's and eager flex's error against float64 (B2 H4 S1024)")
    p.add_argument("--deterministic", action="store_true",
                   help="also time hintbackend with hinted_context(deterministic=True) (column hb-det)")
    p.add_argument("--fused", action="store_true",
                   help='also time hintbackend with hinted_context(kernel="fused") (column hb-fused)')
    p.add_argument("--cudnn", action="store_true",
                   help='also time hintbackend with hinted_context(kernel="cudnn") (column hb-cudnn)')
    p.add_argument("--reference", action="store_true",
                   help='also time hintbackend with hinted_context(kernel="aten") (column hb-aten)')
    p.add_argument("--cuda-graphs", action="store_true",
                   help='also time hintbackend with options={"cuda_graphs": True} (column hb-cg)')
    p.add_argument("--peers", default="inductor,sdpa-cudnn,cudnn-bias,hintbackend",
                   help="which of the default peers to time")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"],
                   help="q, k, v and the output gradient's dtype")
    args = p.parse_args()
    if args.check:
        check(args)
    B, H, S = args.b, args.h, args.s
    rows = []
    for D in (int(d) for d in args.dims.split(",")):
        for row in args.rows.split(","):
            torch.manual_seed(0)
            q, k, v, dout = (torch.randn(B, H, S, D, device="cuda", dtype=getattr(torch, args.dtype)) for _ in range(4))
            q, k, v = (t.requires_grad_(True) for t in (q, k, v))
            DOCS["ids"] = document_ids(S, "cuda")
            bm = create_block_mask(MASKS[row], None, None, S, S, device="cuda") if row in MASKS else None
            BIASES["q"] = torch.randn(S, device="cuda", requires_grad=True)
            BIASES["h"] = torch.randn(H, device="cuda", requires_grad=True)
            BIASES["S"] = S
            BIASES["rel"] = None
            if row.startswith("relbias"):  # relbiast, relbias16t: the table stored [H][2S - 1], read transposed
                rel_dtype = torch.bfloat16 if row.startswith("relbias16") else torch.float32
                BIASES["rel"] = (torch.randn(H, 2 * S - 1, device="cuda", dtype=rel_dtype).t() if row.endswith("t")
                                 else torch.randn(2 * S - 1, H, device="cuda", dtype=rel_dtype)).requires_grad_(True)
            BIASES["dense"] = torch.randn(1, H, S, S, device="cuda",
                                          dtype=torch.bfloat16 if row == "dense16" else torch.float32,
                                          requires_grad=True) if row.startswith("dense") else None
            # cudnn-bias: the relbias row's bias as the relbias path materializes it, learnable.
            BIASES["mat"] = None
            if row.startswith("relbias") and "cudnn-bias" in args.peers.split(","):
                with torch.no_grad():
                    d = torch.arange(S, device="cuda").view(S, 1) - torch.arange(S, device="cuda").view(1, S) + S - 1
                    BIASES["mat"] = BIASES["rel"][d].permute(2, 0, 1).unsqueeze(0).contiguous()
                BIASES["mat"].requires_grad_(True)
            BIASES["slope"] = torch.exp2(-torch.arange(1, H + 1, device="cuda", dtype=torch.float32) * 8 / H)
            score_mod = SCORE_MODS.get(row)
            # The bias of a kv-dependent row as a [1, H, S, S] tensor, for SDPA-cuDNN's ceiling (only when
            # that peer runs: at S 32768 it alone is 64 GiB).
            sdpa_mask = None
            if (row.startswith("relbias") or row in ("dense", "dense16", "alibi", "relpos")) and \
                    "sdpa-cudnn" in args.peers.split(","):
                with torch.no_grad():
                    qi = torch.arange(S, device="cuda").view(1, 1, S, 1)
                    ki = torch.arange(S, device="cuda").view(1, 1, 1, S)
                    hi = torch.arange(H, device="cuda").view(1, H, 1, 1)
                    sdpa_mask = score_mod(torch.zeros((), device="cuda"), 0, hi, qi, ki).expand(1, H, S, S)
                    sdpa_mask = sdpa_mask.to(torch.bfloat16).contiguous()
            flops = 3.5 * 4 * B * H * S * S * D / (2 if row == "causal" else 1)
            if row in ("window", "document"):
                flops *= 1 - bm.sparsity() / 100  # the blocks computed

            def attn(q, k, v):
                return flex_attention(q, k, v, score_mod=score_mod, block_mask=bm)

            def attn_mat(q, k, v):
                return flex_attention(q, k, v, score_mod=materialized, block_mask=bm)

            def hinted(**hints):  # attn under hinted_context(**hints)
                def attn_hinted(q, k, v):
                    with hinted_context(**hints):
                        return flex_attention(q, k, v, score_mod=score_mod, block_mask=bm)
                return attn_hinted

            res = {"inductor": None, "sdpa-cudnn": None, "cudnn-bias": None, "hintbackend": None}
            for peer in tuple(args.peers.split(",")) + (("hb-det",) if args.deterministic else ()) + \
                    (("hb-fused",) if args.fused else ()) + \
                    (("hb-fused-det",) if args.fused and args.deterministic else ()) + \
                    (("hb-cudnn",) if args.cudnn else ()) + \
                    (("hb-aten",) if args.reference else ()) + \
                    (("hb-cg",) if args.cuda_graphs else ()):
                if (peer == "sdpa-cudnn" and ((score_mod is not None and sdpa_mask is None) or
                                              (row in MASKS and row != "causal"))) or \
                        (peer == "cudnn-bias" and BIASES["mat"] is None):
                    res[peer] = None
                    continue
                if peer == "inductor" and row == "hbias":  # ~1 TFLOP/s (shared FACTS): minutes per step
                    res[peer] = "skipped: ~1 TFLOP/s"
                    continue
                torch._dynamo.reset()
                try:
                    def fresh_grads():  # as zero_grad(set_to_none=True): no 1 GiB accumulation timed
                        for t in (BIASES["dense"], BIASES["mat"]):
                            if t is not None:
                                t.grad = None

                    if peer == "sdpa-cudnn":
                        def fn():
                            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                                F.scaled_dot_product_attention(q, k, v, attn_mask=sdpa_mask,
                                                               is_causal=row == "causal").backward(dout)
                    else:
                        f = torch.compile({"hb-det": hinted(deterministic=True), "hb-fused": hinted(kernel="fused"),
                                           "hb-fused-det": hinted(kernel="fused", deterministic=True),
                                           "hb-cudnn": hinted(kernel="cudnn"), "hb-aten": hinted(kernel="aten"),
                                           "cudnn-bias": attn_mat}.get(
                            peer, attn), backend="inductor" if peer == "inductor" else "hintbackend",
                            options={"cuda_graphs": True} if peer == "hb-cg" else None)

                        def fn(f=f, cg=peer == "hb-cg"):
                            fresh_grads()
                            if cg:  # a new iteration for CUDA-graph trees (mode="reduce-overhead" usage): the
                                # gradients a replay returned live in the graphs' memory, which the next replay
                                # overwrites, so they are dropped (zero_grad), not accumulated into
                                torch.compiler.cudagraph_mark_step_begin()
                                q.grad = k.grad = v.grad = None
                            f(q, k, v).backward(dout)
                    peak, ms = measure(fn, "cuda", args.steps)
                    ms_q = measure_queued(fn, args.steps)
                    res[peer] = (flops / ms / 1e9, peak, ms, flops / ms_q / 1e9)
                    print(f"  {peer} {row} D{D}: {res[peer][0]:.0f} TFLOP/s synced, {res[peer][3]:.0f} queued, "
                          f"peak {peak:.0f} MiB", flush=True)
                    if args.profile:
                        profile(f"{peer} {row} D{D}", fn)
                except Exception as e:  # a peer that cannot run this row: say so in its cell (why: on stderr)
                    res[peer] = f"fails: {type(e).__name__}"
                    print(f"{peer} {row} D{D} fails:\n{traceback.format_exc()[-3000:]}", file=sys.stderr)
                for t in (q, k, v, BIASES["rel"], BIASES["dense"], BIASES["mat"]):
                    if t is not None:
                        t.grad = None
            rows.append((row, D, res))
            print(row, D, res, flush=True)
    for timing, k in (("synced", 0), ("queued", 3)):
        print(f"\nFlexAttention fwd+bw, {args.dtype}, B{B} H{H} S{S}, on {torch.cuda.get_device_name()}, torch "
              f"{torch.__version__}, {timing} steps: TFLOP/s (peak MiB)")
        print(f"{'row':<10}{'D':>5}{'inductor':>16}{'sdpa-cudnn':>16}{'cudnn-bias':>16}{'hintbackend':>16}"
              f"{'hb/inductor':>13}{'hb/sdpa':>9}{'hb/cudnn-bias':>15}")

        def cell(x):
            if x is None:
                return "-"
            return x[:15] if isinstance(x, str) else f"{x[k]:.0f} ({x[1]:.0f})"

        def ratio(a, b):
            return f"{a[k] / b[k]:.2f}" if isinstance(a, tuple) and isinstance(b, tuple) else "-"

        for row, D, res in rows:
            hb = res["hintbackend"]
            extra = ""
            det = res.get("hb-det")
            if isinstance(det, tuple) and isinstance(hb, tuple):
                extra = f"  hb-det {cell(det)}, {ratio(det, hb)}x hb"
            if "hb-fused" in res:
                extra += f"  hb-fused {cell(res['hb-fused'])}, {ratio(res['hb-fused'], res['inductor'])}x inductor"
            if "hb-fused-det" in res:
                extra += f"  hb-fused-det {cell(res['hb-fused-det'])}, {ratio(res['hb-fused-det'], res['hb-fused'])}x hb-fused"
            if "hb-cudnn" in res:
                extra += f"  hb-cudnn {cell(res['hb-cudnn'])}, {ratio(hb, res['hb-cudnn'])}x hb-cudnn"
            if "hb-aten" in res:
                extra += f"  hb-aten {cell(res['hb-aten'])}, {ratio(hb, res['hb-aten'])}x hb-aten"
            if "hb-cg" in res:
                extra += f"  hb-cg {cell(res['hb-cg'])}, {ratio(res['hb-cg'], res['sdpa-cudnn'])}x sdpa"
            print(f"{row:<10}{D:>5}{cell(res['inductor']):>16}{cell(res['sdpa-cudnn']):>16}"
                  f"{cell(res['cudnn-bias']):>16}{cell(hb):>16}{ratio(hb, res['inductor']):>13}"
                  f"{ratio(hb, res['sdpa-cudnn']):>9}{ratio(hb, res['cudnn-bias']):>15}{extra}")


if __name__ == "__main__":
    main()
