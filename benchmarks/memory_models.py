"""Training-step peak memory and time of real models: eager, Inductor and hintbackend side by side in one
process (issue 12: compiled peak at or below eager, close to Inductor, step time no worse than eager).

    python benchmarks/memory_models.py                      # CUDA: HF Llama, GPT-2, BERT + the corpus
    python benchmarks/memory_models.py --device cpu --small # CPU: small shapes, live-bytes tracking
    python benchmarks/memory_models.py --device cpu --small --full-vocab --dtype bfloat16 --no-inductor
                                                            # CPU: the losses' [N, vocab] tensors at full weight
    python benchmarks/memory_models.py --models sdpa --profile --cuda-graphs
                                                            # where a step's time goes; with CUDA graphs too
    python benchmarks/memory_models.py --models sdpa --aot-runtime
                                                            # also with AOTAutograd's runtime (lean_runtime off)
    python benchmarks/memory_models.py --no-inductor --recompute
                                                            # also without recompute-materialized

Models: HF Llama, GPT-2 and BERT (masked LM), 4 layers, hidden 512, 8 heads, SDPA attention, random init,
train mode (their default dropout), bf16 on CUDA, B4 S1024 (the issue's setting); then the test corpus's
models (tests/python/test_models.py): its SDPA and flex blocks, its MLP and its CNN (large batches). Each
step is forward, loss, backward.

How peaks are accounted: "peak above the model" is the most memory allocated during one warm training
step (the third; the first ones compile and create the gradients) minus what was allocated just before
it (parameters, their gradients, the inputs), i.e. what the step itself adds: activations, saved values,
temporaries, workspaces. On CUDA it is torch.cuda.max_memory_allocated (the caching allocator's own
count). On CPU (no allocator peak) it is the most bytes of tensor storage alive at once, counted by a
TorchDispatchMode that sees every op's results, eager's and hintbackend's runtime's alike (its executor
calls ATen through the dispatcher; its arenas are ATen tensors too): the same accounting for both. The mode
lets torch.compile run its compiled graphs under it (ignore_compile_internals); Inductor's CPU code
allocates outside the dispatcher, so run --no-inductor on CPU.
Time: the median of --rounds x --steps steps (CUDA events around each on CUDA, the wall clock on CPU), the
peers taking turns round by round after each has compiled (run_peers).
A peer that fails (Inductor does on some models) prints its error in place of the numbers.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import traceback
import weakref
from typing import Callable, Dict, List, Optional, Tuple

import torch
import torch.nn as nn
from torch.utils._python_dispatch import TorchDispatchMode

HERE = os.path.dirname(os.path.abspath(__file__))


# ---- models --------------------------------------------------------------------------------------

def hf_models(small: bool, full_vocab: bool = False
              ) -> List[Tuple[str, Callable[[], nn.Module], Callable[[nn.Module, torch.Tensor], torch.Tensor]]]:
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("transformers is not installed: the HF models are skipped (pip install transformers)")
        return []
    from transformers import (BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel, LlamaConfig,
                              LlamaForCausalLM)
    hidden, layers, heads = (128, 2, 4) if small else (512, 4, 8)
    vocab = 1024 if small and not full_vocab else None

    def llama():
        cfg = LlamaConfig(hidden_size=hidden, intermediate_size=hidden * 8 // 3, num_hidden_layers=layers,
                          num_attention_heads=heads, num_key_value_heads=heads, vocab_size=vocab or 32000,
                          max_position_embeddings=2048)
        return LlamaForCausalLM._from_config(cfg, attn_implementation="sdpa")

    def gpt2():
        cfg = GPT2Config(n_embd=hidden, n_layer=layers, n_head=heads, n_positions=2048, vocab_size=vocab or 50257)
        return GPT2LMHeadModel._from_config(cfg, attn_implementation="sdpa")

    def bert():
        cfg = BertConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=heads,
                         intermediate_size=4 * hidden, vocab_size=vocab or 30522, max_position_embeddings=2048)
        return BertForMaskedLM._from_config(cfg, attn_implementation="sdpa")

    def lm_loss(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
        return model(input_ids=ids, labels=ids).loss

    return [("HF Llama", llama, lm_loss), ("HF GPT-2", gpt2, lm_loss), ("HF BERT (masked LM)", bert, lm_loss)]


def corpus_models(small: bool, device: str):
    os.environ["HINTBACKEND_TEST_DEVICE"] = device  # the corpus builds its block masks there
    sys.path.insert(0, os.path.join(HERE, "..", "tests", "python"))
    from test_models import CNN, MLP, GPTFlexBlock, SDPABlock  # the corpus' own models, at bench sizes

    def mse(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        return model(x).float().pow(2).mean()

    s = 128 if small else 512
    return [("transformer block (sdpa)", lambda: SDPABlock(d=256 if small else 512, h=8), mse, (4, s, 256 if small else 512)),
            ("gpt block (flex, learned bias)", lambda: GPTFlexBlock(d=256, h=4, s=s), mse, (4, s, 256)),
            # the MLP and the CNN have fixed widths (16 -> 32 -> 8; 3 x 16 x 16 images): their batch sets the size
            ("MLP (corpus)", MLP, mse, (8192 if small else 262144, 16)),
            ("CNN with BatchNorm (corpus)", CNN, mse, (64 if small else 2048, 3, 16, 16))]


# ---- measuring -----------------------------------------------------------------------------------

class LiveBytes(TorchDispatchMode):
    """The most bytes of tensor storage alive at once while active (CPU peaks): every op's results are
    counted once per storage until the storage is freed."""

    supports_higher_order_operators = True  # flex_attention: run it, count what it returns

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        # True: torch.compile compiles and runs its artifacts under this mode (it sees the ops a compiled
        # graph runs: hintbackend's executor calls them through the dispatcher). With torch's default
        # (False), Dynamo runs every frame eagerly while a dispatch mode is active, so a compiled peer would
        # measure eager's ops.
        return True

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.peak = 0
        self.seen: Dict[int, int] = {}

    def _track(self, t: torch.Tensor) -> None:
        st = t.untyped_storage()
        key = st.data_ptr()
        if key in self.seen or st.nbytes() == 0:
            return
        n = st.nbytes()
        self.seen[key] = n
        self.live += n
        self.peak = max(self.peak, self.live)
        weakref.finalize(st, self._free, key)

    def _free(self, key: int) -> None:
        self.live -= self.seen.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in torch.utils._pytree.tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.device.type == "cpu" and not t.is_meta:
                try:
                    self._track(t)
                except (RuntimeError, NotImplementedError):  # no storage to count (sparse, wrapper subclasses)
                    pass
        return out


GRAPH_PEERS = ("hb cuda graphs", "inductor cuda graphs")


def graph_pools_bytes() -> int:
    """The bytes CUDA graphs' private memory pools hold (hintbackend's recordings, cudagraph trees'): memory
    a replay writes without the allocator seeing it, so max_memory_allocated leaves it out."""
    return sum(s["total_size"] for s in torch.cuda.memory_snapshot()
               if tuple(s.get("segment_pool_id") or (0, 0)) != (0, 0))


def peak_of(step: Callable[[], None], device: str, graphs: bool = False) -> float:
    """MiB above what was allocated before one warm step, at the step's most (the first two steps compile and
    allocate the gradients). graphs: a peer that replays CUDA graphs; it warms up for five steps (the
    recordings come after a warm-up call of each graph, two for a backward), and its peak counts the
    memory its graphs' pools took as well."""
    pools = graph_pools_bytes() if device == "cuda" else 0
    for _ in range(5 if graphs else 2):
        step()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        step()
        torch.cuda.synchronize()
        pools = graph_pools_bytes() - pools if graphs else 0
        return (torch.cuda.max_memory_allocated() - base + pools) / 2**20
    with LiveBytes() as lb:
        step()
    return lb.peak / 2**20


def time_steps(step: Callable[[], None], device: str, steps: int) -> List[float]:
    """The ms of each of `steps` steps (CUDA events around each on CUDA, the wall clock on CPU)."""
    times = []
    for _ in range(steps):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            step()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            step()
            times.append((time.perf_counter() - t0) * 1e3)
    return times


def measure(step: Callable[[], None], device: str, steps: int) -> Tuple[float, float]:
    """(peak MiB above what was allocated before the step, median ms of `steps` steps), one peer alone."""
    peak = peak_of(step, device)
    return peak, statistics.median(time_steps(step, device, steps))


def compiled(peer: str, model: nn.Module):
    """The module as `peer` runs it."""
    if peer == "eager":
        fn = model
    elif peer == "inductor":
        fn = torch.compile(model)
    elif peer == "inductor cuda graphs":  # Inductor's mode="reduce-overhead": its graphs as CUDA graphs
        fn = torch.compile(model, mode="reduce-overhead")
    elif peer == "aot_eager":  # the AOT graphs run by torch: what the partition alone costs
        fn = torch.compile(model, backend="aot_eager")
    elif peer == "hb default partition":
        fn = torch.compile(model, backend="hintbackend", options={"partition": "default"})
    elif peer == "hb no recompute-materialized":  # min-cut as torch's config has it: saves what the backward reads
        fn = torch.compile(model, backend="hintbackend", options={"disable_passes": ["recompute-materialized"]})
    elif peer == "hb no save-logsumexp":  # the forward saves cross-entropy's [N, C] log-probabilities
        fn = torch.compile(model, backend="hintbackend", options={"disable_passes": ["save-logsumexp"]})
    elif peer == "hb no loss folds":  # the loss as traced: [N, C] log-probabilities and two [N, C] gradients
        fn = torch.compile(model, backend="hintbackend", options={"disable_passes": [
            "save-logsumexp", "fold-cross-entropy-forward", "fold-cross-entropy-backward"]})
    elif peer == "hb cuda graphs":  # mode="reduce-overhead": each graph replayed as a CUDA graph
        fn = torch.compile(model, backend="hintbackend", options={"cuda_graphs": True})
    elif peer == "hb no arena":
        fn = torch.compile(model, backend="hintbackend", options={"arena": False})
    elif peer == "hb aot runtime":  # AOTAutograd's runtime wrappers instead of the lean one (lean_runtime.py)
        fn = torch.compile(model, backend="hintbackend", options={"lean_runtime": False})
    else:
        fn = torch.compile(model, backend="hintbackend")
    return fn


def training_step(peer: str, make: Callable[[], nn.Module], loss_fn, x: torch.Tensor, device: str,
                  dtype: torch.dtype, reset: bool = True) -> Callable[[], None]:
    """A fresh model (seed 0) as `peer` runs it, and one training step of it: forward, loss, backward.
    reset: forget what Dynamo compiled before (run_peers keeps every peer's compiled model alive at once)."""
    if reset:
        torch._dynamo.reset()
    torch.manual_seed(0)
    model = make().to(device=device, dtype=dtype).train()
    fn = compiled(peer, model)

    def step():
        for p in model.parameters():
            p.grad = None
        loss_fn(fn, x).backward()
    return step


def run_peers(peers: List[str], make: Callable[[], nn.Module], loss_fn, x: torch.Tensor, device: str,
              dtype: torch.dtype, steps: int, rounds: int) -> Dict[str, Tuple[Optional[float], Optional[float], str]]:
    """Each peer's (peak MiB, median ms a step, error). Every peer compiles and has its peak measured first;
    then the peers' steps are timed in `rounds` rounds of `steps` steps each, the peers taking turns, so that
    a drift of the host's or the GPU's clocks over the run falls on every peer alike (a step of a small
    block is host time, which moves by 10-30% from one stretch of steps to the next)."""
    torch._dynamo.reset()
    live: Dict[str, Callable[[], None]] = {}
    out: Dict[str, Tuple[Optional[float], Optional[float], str]] = {}
    peaks: Dict[str, float] = {}
    def failed(e: Exception) -> str:  # what a peer's cell says when it cannot run this model
        traceback.print_exc(limit=3)
        return f"{type(e).__name__}: {str(e).splitlines()[0][:60] if str(e) else ''}"

    for peer in peers:
        try:
            step = training_step(peer, make, loss_fn, x, device, dtype, reset=False)
            peaks[peer] = peak_of(step, device, graphs=peer in GRAPH_PEERS)
            live[peer] = step
        except Exception as e:
            out[peer] = (None, None, failed(e))
        if device == "cuda":
            torch.cuda.empty_cache()
    times: Dict[str, List[float]] = {peer: [] for peer in live}
    for _ in range(rounds):
        for peer, step in list(live.items()):
            try:
                step()  # one untimed step: the turn's first touches what the other peers' turns evicted
                times[peer] += time_steps(step, device, steps)
            except Exception as e:  # failed after it compiled: its peak stands, the others go on
                out[peer] = (peaks[peer], None, failed(e))
                del live[peer]
    for peer in live:
        out[peer] = (peaks[peer], statistics.median(times[peer]), "")
    live.clear()
    torch._dynamo.reset()
    if device == "cuda":
        torch.cuda.empty_cache()
    return {peer: out[peer] for peer in peers}


def table_cell(peak: Optional[float], ms: Optional[float], err: str) -> str:
    """A peer's cell: peak / ms, or where it failed (while compiling: no peak; in the timed rounds: no ms)."""
    if peak is None:
        return "fails: " + err[:14]
    return f"{peak:.0f} / " + (f"{ms:.2f}" if ms is not None else "fails: " + err[:7])


def ratio(a: Optional[float], b: Optional[float]) -> float:
    return a / b if a is not None and b else float("nan")


def profile(name: str, peer: str, make, loss_fn, x: torch.Tensor, device: str, dtype: torch.dtype) -> None:
    """torch.profiler over three warm training steps of one peer: the ops by self device time, and the
    device's busy time against the wall time (a gap is host time the GPU waited for)."""
    from torch.profiler import ProfilerActivity
    step = training_step(peer, make, loss_fn, x, device, dtype)
    for _ in range(3):
        step()
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    if device == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    with torch.profiler.profile(activities=acts) as prof:
        for _ in range(3):
            step()
        if device == "cuda":
            torch.cuda.synchronize()
    wall = (time.perf_counter() - t0) * 1e3 / 3
    key = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    events = prof.key_averages()
    busy = sum(getattr(e, key) for e in events if e.device_type.name == "CUDA") / 1e3 / 3 if device == "cuda" else 0.0
    print(f"== profile: {name}, {peer}: {wall:.2f} ms a step (profiled), device busy {busy:.2f} ms")
    # What a host-bound step spends its host time on beyond the ops: kernel launches and the runtime calls
    # that can block, counted a step (a launch is host time whether or not the device is busy).
    calls = [(e.key, e.count / 3) for e in events if e.key.startswith(("cuda", "cuLaunch")) or e.key == "aten::copy_"]
    if calls:
        print("a step: " + ", ".join(f"{k} {c:g}" for k, c in sorted(calls, key=lambda kc: -kc[1])))
    print(events.table(sort_by=key, row_limit=18, max_name_column_width=60))


def explain(name: str, make, loss_fn, x: torch.Tensor, device: str, dtype: torch.dtype) -> None:
    """What the training step keeps for the backward: eager's saved tensors (autograd's saved-tensor hooks)
    against the backward inputs of the AOT graphs hintbackend compiles (its partition), biggest first."""
    from torch._dynamo.backends.common import aot_autograd
    from hintbackend.partition import partition

    torch.manual_seed(0)
    model = make().to(device=device, dtype=dtype).train()
    seen: Dict[int, Tuple[int, str]] = {}

    def pack(t):
        seen.setdefault(t.untyped_storage().data_ptr(), (t.untyped_storage().nbytes(), f"{tuple(t.shape)} {t.dtype}"))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = loss_fn(model, x)
    del loss
    total = sum(v[0] for v in seen.values())
    print(f"{name}: eager saves {total / 2**20:.0f} MiB in {len(seen)} storages; biggest: " +
          ", ".join(f"{v[1]} {v[0] / 2**20:.0f}" for v in sorted(seen.values(), reverse=True)[:6]))
    graphs = {}

    def keep(kind):
        def compiler(gm, inputs):
            graphs[kind] = gm
            return gm
        return compiler

    torch._dynamo.reset()
    f = torch.compile(model, backend=aot_autograd(fw_compiler=keep("fw"), bw_compiler=keep("bw"), partition_fn=partition))
    loss_fn(f, x).backward()
    if "bw" not in graphs:
        return
    items = []
    for n in graphs["bw"].graph.nodes:
        v = n.meta.get("val")
        if n.op == "placeholder" and isinstance(v, torch.Tensor) and not n.name.startswith("tangents"):
            items.append((v.numel() * v.element_size(), n.name, f"{tuple(v.shape)} {v.dtype}"))
    print(f"{name}: the AOT forward saves {sum(i[0] for i in items) / 2**20:.0f} MiB in {len(items)} values; biggest: " +
          ", ".join(f"%{i[1]} {i[2]} {i[0] / 2**20:.0f}" for i in sorted(items, reverse=True)[:8]))
    ops = sorted({str(n.target) for n in graphs["fw"].graph.nodes if n.op == "call_function" and
                  any(k in str(n.target) for k in ("attention", "softmax", "bmm", "dropout", "bernoulli", "rand"))})
    print(f"{name}: attention-related forward ops: {', '.join(ops)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--small", action="store_true", help="small shapes (CPU)")
    p.add_argument("--full-vocab", action="store_true",
                   help="with --small: the HF models keep their real vocabularies (32000, 50257, 30522), so the loss's "
                        "[N, vocab] tensors weigh as they do at full size")
    p.add_argument("--dtype", choices=["bfloat16", "float32"], default=None,
                   help="parameters' dtype (default: bfloat16 on CUDA, float32 on CPU)")
    p.add_argument("--steps", type=int, default=20, help="timed steps a peer a round")
    p.add_argument("--rounds", type=int, default=5, help="rounds of timed steps, the peers taking turns")
    p.add_argument("--models", default="", help="comma-separated substrings of model names to run")
    p.add_argument("--no-inductor", action="store_true")
    p.add_argument("--diagnose", action="store_true",
                   help="also aot_eager (the AOT graphs run by torch), hintbackend with torch's default partition, "
                        "without save-logsumexp, without the loss's folds and without the arena, and what eager and "
                        "the AOT forward save for the backward")
    p.add_argument("--cuda-graphs", action="store_true",
                   help="also hintbackend with cuda_graphs=True (mode=\"reduce-overhead\"): host time per step gone; "
                        "and Inductor's reduce-overhead, unless --no-inductor")
    p.add_argument("--aot-runtime", action="store_true",
                   help="also hintbackend with lean_runtime=False (AOTAutograd's runtime wrappers: their host time)")
    p.add_argument("--recompute", action="store_true",
                   help="also hintbackend without recompute-materialized (min-cut saving what the backward reads)")
    p.add_argument("--profile", action="store_true",
                   help="also torch.profiler tables of eager's and hintbackend's steps (where the time goes)")
    args = p.parse_args()
    dev = args.device
    dtype = getattr(torch, args.dtype) if args.dtype else torch.bfloat16 if dev == "cuda" else torch.float32
    B, S = (2, 128) if args.small else (4, 1024)
    peers = ["eager"] + ([] if args.no_inductor else ["inductor"]) + ["hintbackend"]
    if args.cuda_graphs:
        peers += ["hb cuda graphs"] + ([] if args.no_inductor else ["inductor cuda graphs"])
    if args.aot_runtime:
        peers.append("hb aot runtime")
    if args.recompute:
        peers.append("hb no recompute-materialized")
    if args.diagnose:
        peers += ["hb default partition", "hb no save-logsumexp", "hb no loss folds", "hb no arena", "aot_eager"]
    rows = []
    models = [(n, mk, lf, None) for n, mk, lf in hf_models(args.small, args.full_vocab)] + list(corpus_models(args.small, dev))
    for name, make, loss_fn, shape in models:
        if args.models and not any(m.strip().lower() in name.lower() for m in args.models.split(",")):
            continue
        torch.manual_seed(0)
        if shape is None:  # token ids
            x = torch.randint(0, 1000, (B, S), device=dev)
        else:
            x = torch.randn(*shape, device=dev, dtype=dtype)
        if args.diagnose:
            try:
                explain(name, make, loss_fn, x, dev, dtype)
            except Exception as e:
                print(f"{name}: explain failed: {type(e).__name__}: {e}")
        if args.profile:
            for peer in ("eager", "hintbackend"):
                profile(name, peer, make, loss_fn, x, dev, dtype)
        res = run_peers(peers, make, loss_fn, x, dev, dtype, args.steps, args.rounds)
        rows.append((name, res))
        print(f"{name}: " + ", ".join(f"{k} {v[0] if v[0] is None else round(v[0])} MiB / "
                                      f"{v[1] if v[1] is None else round(v[1], 2)} ms {v[2]}" for k, v in res.items()),
              flush=True)
    where = torch.cuda.get_device_name() if dev == "cuda" else "CPU (live tensor bytes)"
    print(f"\ntraining step peak above the model (MiB) / median ms per step, {str(dtype).split('.')[-1]}, "
          f"B{B} S{S}, on {where}, torch {torch.__version__}")
    head = f"{'model':<32}" + "".join(f"{p:>{max(22, len(p) + 2)}}" for p in peers) + f"{'hb/eager peak':>15}{'hb/eager ms':>13}"
    if "inductor" in peers:
        head += f"{'hb/ind peak':>13}"
    print(head)
    for name, res in rows:
        line = f"{name:<32}"
        for peer in peers:
            line += f"{table_cell(*res[peer]):>{max(22, len(peer) + 2)}}"
        hb, ea = res["hintbackend"], res["eager"]
        line += f"{ratio(hb[0], ea[0]):>15.2f}{ratio(hb[1], ea[1]):>13.2f}"
        if "inductor" in peers:
            line += f"{ratio(hb[0], res['inductor'][0]):>13.2f}"
        print(line)
    if "hb cuda graphs" in peers:
        print("cuda graphs peers: peak = the replayed step's own allocations + the bytes its CUDA graphs' memory "
              "pools hold (allocated at recording, written by each replay)")
        for name, res in rows:
            hg, ea = res["hb cuda graphs"], res["eager"]
            print(f"{name:<32} hb cuda graphs/eager peak {ratio(hg[0], ea[0]):.2f}, ms {ratio(hg[1], ea[1]):.2f}"
                  + (f"; /inductor cuda graphs peak {ratio(hg[0], res['inductor cuda graphs'][0]):.2f}, ms "
                     f"{ratio(hg[1], res['inductor cuda graphs'][1]):.2f}" if "inductor cuda graphs" in res else ""))
    print("goal (issue 12): hb/eager peak <= 1.00, hb/ind peak <= 1.20, hb/eager ms <= 1.00")


if __name__ == "__main__":
    main()
