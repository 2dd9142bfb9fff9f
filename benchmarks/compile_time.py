"""Compile time of the demo model (TinyGPT: 2 blocks of causal flex_attention with a learned relative bias, a
training step), in a first process with empty caches and in a second process that finds them filled, for
hintbackend and Inductor side by side.

    python benchmarks/compile_time.py [--device cpu|cuda] [--backends hintbackend,inductor] [--seq 128]
                                      [--dynamo-cache]

Each run is a fresh Python process: hintbackend's kernel cache (options cache_dir) and Inductor's caches
(TORCHINDUCTOR_CACHE_DIR) point into one temporary folder per backend, empty for the first process and kept
for the second. hintbackend's compile cache (<cache_dir>/aotautograd, README "Caching") is on, as by default:
the second process loads the compiled graphs instead of running AOTAutograd. "compile" is the first training
step's wall time less a warm step's; beside it, from torch._dynamo.utils.compile_times: Dynamo's frame
compiles (which include the backend's work) and, of that, AOTAutograd's (on a cache hit: its cache lookup
and load), and whether AOTAutograd's cache hit. The last column is the second process's compile time over
the first's.

--dynamo-cache also runs both processes with torch's Dynamo cache (torch._dynamo.config.caching_precompile,
the opt-in TORCH_CACHING_PRECOMPILE=1): the first process saves its entries with
torch.compiler.save_cache_artifacts() after its steps, and the second loads them when torch.compile wraps
the model, skipping Dynamo's tracing as well (its row says whether Dynamo's cache hit).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time


def child(args) -> dict:
    import torch

    from hintbackend.demo import TinyGPT

    if args.dynamo_cache:
        torch._dynamo.config.caching_precompile = True
    torch.manual_seed(0)
    dev = args.device
    model = TinyGPT(seq=args.seq, device=dev).to(dev)
    if args.backend == "hintbackend":
        fn = torch.compile(model, backend="hintbackend", options={"cache_dir": args.cache})
    else:
        fn = torch.compile(model, backend="inductor")
    data = torch.randint(0, 256, (4, args.seq + 1), device=dev)

    def step() -> float:
        t0 = time.perf_counter()
        fn(data[:, :-1], data[:, 1:]).backward()
        if dev.startswith("cuda"):
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    first = step()
    warm = min(step() for _ in range(3))
    times = torch._dynamo.utils.compile_times(repr="csv")
    dynamo = 0.0
    aot = 0.0
    for name, value in zip(times[0], times[1]):
        total = sum(float(x) for x in str(value).split(",") if x.strip()) if value else 0.0
        if name == "_compile.compile_inner":
            dynamo = total
        elif name in ("aot_collect_metadata", "create_aot_dispatcher_function", "AOTAutogradCache.inductor_load"):
            aot = max(aot, total)
    c = torch._dynamo.utils.counters["aot_autograd"]
    cache = "hit" if c["autograd_cache_hit"] else "miss" if c["autograd_cache_miss"] else "off"
    if args.dynamo_cache:
        d = torch._dynamo.utils.counters["dynamo_cache"]
        cache += ", Dynamo " + ("hit" if d["dynamo_cache_hit"] else "error" if d["dynamo_cache_error"] else "miss")
        torch.compiler.save_cache_artifacts()  # writes this process's Dynamo entries (none new on a hit)
    return {"first": first, "warm": warm, "compile": first - warm, "dynamo": dynamo, "aot": aot, "cache": cache}


def run(backend: str, device: str, seq: int, cache: str, dynamo_cache: bool) -> dict:
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": os.path.join(cache, "inductor")}
    cmd = [sys.executable, os.path.abspath(__file__), "--child", "--backend", backend, "--device", device,
           "--seq", str(seq), "--cache", os.path.join(cache, "hintbackend")] + (["--dynamo-cache"] if dynamo_cache else [])
    p = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if p.returncode != 0:
        errors = [line for line in p.stderr.splitlines() if "Error" in line and "TORCHDYNAMO_VERBOSE" not in line]
        return {"error": (errors[-1].strip() if errors else "exit %d" % p.returncode)[:100]}
    return json.loads(p.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cpu")
    p.add_argument("--backends", default="hintbackend,inductor")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--backend", help=argparse.SUPPRESS)
    p.add_argument("--cache", help=argparse.SUPPRESS)
    p.add_argument("--dynamo-cache", action="store_true",
                   help="also with torch's Dynamo cache (caching_precompile), saved by the first process")
    args = p.parse_args()
    if args.child:
        print(json.dumps(child(args)))
        return
    import torch

    rows = []
    for dynamo_cache in (False, True) if args.dynamo_cache else (False,):
        for backend in args.backends.split(","):
            with tempfile.TemporaryDirectory(prefix=f"hb_compile_{backend}_") as cache:
                name = backend + (" + Dynamo cache" if dynamo_cache else "")
                rows.append((name, run(backend, args.device, args.seq, cache, dynamo_cache),
                             run(backend, args.device, args.seq, cache, dynamo_cache)))
    print(f"\n# compile time of the demo model's training step (TinyGPT, seq {args.seq}, batch 4) on {args.device}, "
          f"torch {torch.__version__}, {os.cpu_count()} CPUs; seconds")
    print("| backend | first process: compile (Dynamo frames; AOT of it; AOT cache) | second process: compile (Dynamo "
          "frames; AOT of it; AOT cache) | second / first |")
    print("|---|---|---|---|")

    def cell(r: dict) -> str:
        if "error" in r:
            return f"fails: {r['error']}"
        return f"{r['compile']:.2f} ({r['dynamo']:.2f}; {r['aot']:.2f}; {r['cache']})"

    for backend, a, b in rows:
        ratio = f"{b['compile'] / a['compile']:.2f}" if "error" not in a and "error" not in b else "-"
        print(f"| {backend} | {cell(a)} | {cell(b)} | {ratio} |")


if __name__ == "__main__":
    main()
