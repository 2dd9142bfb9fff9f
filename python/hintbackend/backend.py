"""The ``hintbackend`` torch.compile backend.

Dynamo hands us a graph; AOTAutograd splits it into forward and backward (or one inference graph),
and each is serialized to a JSON document, compiled by the C++ core (import, verify, passes, kernel
selection) and run by its executor with no Python per node. A graph with an op the core cannot run
falls back to the original GraphModule in eager with one warning naming every unsupported op, or
raises under ``options={"strict": True}``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import json
import logging
import warnings
from typing import Any, Callable, FrozenSet, Iterator, List, Mapping, Optional, Sequence, Set, Tuple

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import SerializableAOTDispatchCompiler, make_boxed_func

from . import _core, compile_cache
from .cuda_graphs import CudaGraphs
from .dump import Dumper, structured_trace_on
from .lean_runtime import LeanPair, LeanPlan, forward_output_count, plan_of, runtime, written_inputs
from .options import Options, parse_options
from .partition import partition
from .sdpa_masks import drop_masks_that_mask_nothing, make_sdpa_masks_fusable
from .serialize import SerializationError, input_aliases, serialize

log = logging.getLogger("hintbackend")

_graph_ids = itertools.count()


class UnsupportedGraphError(RuntimeError):
    """Raised under strict mode when a graph has ops hintbackend cannot run."""


class HintBackendFallbackWarning(UserWarning):
    """A graph ran in eager because hintbackend cannot run some of its ops."""


class HintBackendHintWarning(UserWarning):
    """A hinted_context hint that hintbackend could not honor (the warning says which region and why)."""


def _fallback(gm: torch.fx.GraphModule, opts: Options, name: str, reasons: List[str]) -> Callable:
    listing = "\n  ".join(reasons)
    if opts.strict:
        raise UnsupportedGraphError(
            f"hintbackend (strict): graph '{name}' has ops hintbackend cannot run:\n  {listing}\n"
            "Remove options={'strict': True} to run such graphs in eager instead.")
    warnings.warn(f"hintbackend: graph '{name}' runs in eager because of unsupported ops:\n  {listing}",
                  HintBackendFallbackWarning, stacklevel=2)
    log.warning("graph %s falls back to eager: %s", name, "; ".join(reasons))
    return make_boxed_func(gm.forward)


def compile_graph(gm: torch.fx.GraphModule, example_inputs: List[Any], opts: Options, kind: str,
                  forward_input_aliases: Optional[Set[str]] = None,
                  cuda_graphs: Optional[CudaGraphs] = None, lean: Optional[LeanPair] = None) -> Callable:
    """Compiles one AOT graph (kind: forward, backward or inference) into a boxed callable.

    `forward_input_aliases`: shared by the forward and backward of one aot_autograd call. The forward
    fills it (serialize.input_aliases); the backward, whose placeholders are named after the saved
    values, tells the core which of its inputs the caller keeps anyway (those, and the tangents, which
    AOTAutograd's backward frame holds until it returns).

    `lean`: the pair the forward and backward of one aot_autograd call go into (lean_runtime.py)."""
    fn, _, _ = _compile(gm, example_inputs, opts, kind, forward_input_aliases, cuda_graphs, lean)
    return fn


def _compile(gm: torch.fx.GraphModule, example_inputs: List[Any], opts: Options, kind: str,
             forward_input_aliases: Optional[Set[str]], cuda_graphs: Optional[CudaGraphs],
             lean: Optional[LeanPair] = None):
    """compile_graph, also returning what the compile cache stores to rebuild it and, where it stores
    nothing (None), why: a fallback to eager, or a graph torch's cudagraph trees replay (their wrapper is
    made from the FX graph, which an entry does not keep)."""
    name = f"{kind}_{next(_graph_ids)}"
    kept: Set[str] = set()
    if forward_input_aliases is not None:
        if kind == "forward":
            forward_input_aliases.update(input_aliases(gm))
        elif kind == "backward":
            kept = set(forward_input_aliases)
            kept.update(n.name for n in gm.graph.nodes if n.op == "placeholder" and n.name.startswith("tangents_"))
    fx_text = gm.print_readable(print_output=False, include_stride=True, include_device=True)
    try:
        doc, constants = serialize(gm, name, inputs_owned=kind == "backward", inputs_kept=kept)
    except SerializationError as e:
        dumper = _dumper(opts, name)
        if dumper:
            dumper.write("fx_graph.txt", fx_text)
        return _fallback(gm, opts, name, [str(e)]), None, "graph runs in eager (it does not serialize)"
    payload = {"name": name, "document": json.dumps(doc), "constants": constants, "fx_text": fx_text,
               "fx_nodes": len(gm.graph.nodes)}
    plan = None
    context = torch._guards.TracingContext.try_get()
    meta = context.fw_metadata if context else None  # AOTAutograd's metadata of this graph (lean_runtime.py)
    if lean is not None and kind == "forward":
        plan, why_not = plan_of(meta, lean.num_inputs, forward_output_count(gm))
        if plan is None:
            log.info("graph %s: AOTAutograd's runtime (not the lean one): %s", name, why_not)
        else:
            payload["lean"] = plan.to_json()
    if kind in ("forward", "inference"):  # first outputs the runtime writes back into inputs: write-inputs-in-place
        placeholders = [n.name for n in gm.graph.find_nodes(op="placeholder")]
        written = written_inputs(meta, len(placeholders))
        if written:
            payload["input_writes"] = [placeholders[i] for i in written]
    fn, unsupported = _build(payload, opts, name)
    if unsupported:
        return _fallback(gm, opts, name, unsupported), None, "graph runs in eager (unsupported ops)"
    if lean is not None:
        lean.take(kind, fn, plan, _zero_variants(payload, opts, name) if kind == "backward" else None)
    # CUDA graphs: the lean runtime replays its pairs itself (lean_runtime.py, GraphReplay.h); the rest
    # (inference graphs, pairs on AOTAutograd's runtime) through torch's cudagraph trees.
    if cuda_graphs is not None and not (lean is not None and lean.plan is not None and kind != "inference"):
        return (cuda_graphs.wrap(fn, gm, example_inputs, kind, name), None,
                "its CUDA graphs go through torch's cudagraph trees, which a cache entry cannot rebuild (it keeps no FX graph)")
    return fn, payload, ""


def _dumper(opts: Options, name: str) -> Optional[Dumper]:
    trace = structured_trace_on()
    return Dumper(opts.dump_dir, name, trace) if opts.dump_dir or trace else None


# The lists compiled_graphs() is filling: every CompiledGraph _build makes is appended to each.
_watchers: List[List[Any]] = []


@contextlib.contextmanager
def compiled_graphs() -> Iterator[List[Any]]:
    """The C++ graphs compiled while the block runs, as (graph name, CompiledGraph) in order: what a
    benchmark or test reads after a torch.compile'd step (kernel_workspace_bytes, memory_plan, kernels),
    compile cache hits included (they rebuild the plan too)."""
    graphs: List[Any] = []
    _watchers.append(graphs)
    try:
        yield graphs
    finally:
        _watchers.remove(graphs)


def _build(payload: dict, opts: Options, name: str, zero_inputs: Sequence[str] = ()):
    """The C++ compile of a serialized graph, its dumps, warnings and log lines: (boxed callable, the
    unsupported ops (the callable is None then)). Also what a compile cache hit runs. `zero_inputs`:
    placeholders the caller passes as zeros (a lean backward's undefined gradients, _zero_variants). The
    payload's "input_writes": the placeholders a forward's (or inference graph's) first outputs are written
    back into (write-inputs-in-place)."""
    dumper = _dumper(opts, name)
    text, constants = payload["document"], payload["constants"]
    if dumper:
        dumper.write("fx_graph.txt", payload["fx_text"])
        dumper.write("graph.json", json.dumps(json.loads(text), indent=1))
    compiled = _core().CompiledGraph(text, constants, opts.core_settings(dump=dumper is not None, zero_inputs=zero_inputs,
                                                                        input_writes=payload.get("input_writes", ())))
    if dumper:
        _write_dumps(dumper, compiled, text, constants, opts)
    for message in compiled.warnings:
        warnings.warn(f"hintbackend: graph '{name}': {message}", HintBackendHintWarning, stacklevel=3)
        log.warning("graph %s: %s", name, message)
    _log_decisions(name, payload["fx_nodes"], compiled)
    if compiled.unsupported:
        return None, list(compiled.unsupported)
    run = compiled.run

    def compiled_fn(args: List[Any]) -> Any:
        try:
            return run(args)
        except Exception as e:
            # ATen errors carry the node already (the runtime adds it as context); an error raised by
            # a Python kernel keeps its type, and gets the node as a note.
            site = _core().take_failure_site()
            if site:
                e.add_note(f"hintbackend: raised while running {site}")
            raise

    compiled_fn._boxed_call = True  # type: ignore[attr-defined]
    compiled_fn.hintbackend_graph = compiled  # type: ignore[attr-defined]
    compiled_fn.hintbackend_name = name  # type: ignore[attr-defined]
    for graphs in _watchers:
        graphs.append((name, compiled))
    return compiled_fn, []


ZeroVariant = Optional[Tuple[Callable, FrozenSet[int]]]


def _zero_variants(payload: dict, opts: Options, name: str) -> Callable[[Sequence[int]], ZeroVariant]:
    """For a lean backward: builds this backward again with the inputs at some positions passed as zeros
    (fold-zero-inputs; lean_runtime.py calls it once per set of undefined gradients, at the first backward
    that has them). Gives (boxed callable, the input positions it no longer reads), or None where the graph
    no longer compiles (the backward as compiled then runs)."""
    def build(positions: Sequence[int]) -> ZeroVariant:
        nodes = json.loads(payload["document"])["graph"]["nodes"]
        placeholders = [n["name"] for n in nodes if n["op"] == "placeholder"]
        zero = [placeholders[k] for k in positions]
        fn, unsupported = _build(payload, opts, f"{name}_zero_{'_'.join(map(str, positions))}", zero)
        if unsupported:
            return None
        unread = set(fn.hintbackend_graph.unread_inputs)
        return fn, frozenset(k for k, p in enumerate(placeholders) if p in unread)
    return build


def _write_dumps(dumper: Dumper, compiled: Any, text: str, constants: List[Any], opts: Options) -> None:
    for stage, body in compiled.dumps:
        dumper.write(f"{stage}.txt", body)
    if compiled.notes:
        dumper.write("notes.txt", "\n".join(compiled.notes) + "\n")
    plan = compiled.memory_plan
    if dumper.dir and plan is not None:
        from .memory_picture import page

        plans = [("as compiled", plan)]
        if plan["slice_loops"]:  # a hint sliced the graph: beside it, the same graph left whole
            whole = opts.core_settings(dump=False)
            whole.disable_passes = list(whole.disable_passes) + ["slice-schedule"]
            bfs = _core().CompiledGraph(text, constants, whole).memory_plan
            if bfs is not None:
                plans.append(("without slicing (bfs)", bfs))
        dumper.write("memory.html", page(dumper.name, plans), trace=False)
    dumper.finish()


def _log_decisions(name: str, fx_nodes: int, compiled: Any) -> None:
    """What was decided for a graph, on the `hintbackend` logger (TORCH_LOGS="+hintbackend"): a summary and
    the slice decisions at INFO, every pass note, the kernel choices and the IR at DEBUG."""
    if log.isEnabledFor(logging.INFO):
        slicing = [n for n in compiled.notes if n.startswith("slice-schedule")]
        plan = compiled.memory_plan
        arena = f", arena {plan['arena_bytes']} bytes" if plan else ""
        log.info("compiled %s: %d FX nodes%s%s", name, fx_nodes, arena,
                 "".join("\n  " + n for n in slicing))
    if log.isEnabledFor(logging.DEBUG):  # printed on demand only
        log.debug("%s: pass notes\n%s", name, "\n".join(compiled.notes))
        log.debug("%s: kernels\n%s", name, compiled.kernels)
        log.debug("compiled %s (%d nodes)\n%s", name, fx_nodes, compiled.ir)


def rebuild(kind: str, payload: dict, opts: Options, lean: Optional[LeanPair] = None) -> Callable:
    """A compile cache hit: the C++ compile of a stored graph (compile_cache.py); `lean`: the pair it goes
    into, with the forward's stored plan (lean_runtime.py)."""
    name = f"{kind}_{next(_graph_ids)}"
    # The stored document carries the name of the compile that stored it; this process names it anew (the
    # dumps, the IR and error messages all say the name of its dump folder).
    doc = json.loads(payload["document"])
    doc["graph"]["name"] = name
    payload = {**payload, "document": json.dumps(doc)}
    fn, unsupported = _build(payload, opts, name)
    if unsupported:  # entries hold only graphs that compiled: another build would have another key
        raise RuntimeError(f"hintbackend: cached graph {name} no longer compiles: {unsupported}")
    if lean is not None:
        lean.take(kind, fn, LeanPlan.from_json(payload["lean"]) if "lean" in payload else None,
                  _zero_variants(payload, opts, name) if kind == "backward" else None)
    return fn


def hintbackend(gm: torch.fx.GraphModule, example_inputs: List[Any], options: Optional[Mapping[str, Any]] = None,
                mode: Optional[str] = None) -> Callable:
    """torch.compile(model, backend="hintbackend", options={...}). See README.md for the options."""
    opts = parse_options(options)
    if mode == "reduce-overhead":
        opts = dataclasses.replace(opts, cuda_graphs=True)
    elif mode not in (None, "default"):
        raise ValueError(f"hintbackend: mode={mode!r} is not supported: use mode=\"reduce-overhead\" (CUDA graphs) or "
                         "options={...}")

    drop_masks_that_mask_nothing(gm)  # before AOTAutograd decomposes SDPA (sdpa_masks.py)
    make_sdpa_masks_fusable(gm)
    forward_input_aliases: Set[str] = set()  # one forward/backward pair per aot_autograd call
    cuda_graphs = CudaGraphs(len(example_inputs)) if opts.cuda_graphs else None
    # partition: default_partition, except that saved values of dfs/auto regions are recomputed in the
    # backward (partition.py), so training keeps the regions' intermediates per slice too.
    partition_fn = functools.partial(partition, settings=opts.core_settings(), base=opts.partition,
                                     save_logsumexp="save-logsumexp" not in opts.disable_passes,
                                     recompute_materialized="recompute-materialized" not in opts.disable_passes)
    # The lean runtime (lean_runtime.py); with CUDA graphs it replays its graphs itself.
    lean = LeanPair(len(example_inputs), replay=opts.cuda_graphs) if opts.lean_runtime else None
    not_cached = compile_cache.unavailable(opts)
    if not_cached:
        log.debug("compile cache off: %s", not_cached)

        def make(kind: str) -> Callable:
            return lambda g, inputs: compile_graph(g, inputs, opts, kind, forward_input_aliases, cuda_graphs, lean)

        compiled = aot_autograd(fw_compiler=make("forward"), bw_compiler=make("backward"),
                                inference_compiler=make("inference"), partition_fn=partition_fn)(gm, example_inputs)
        return runtime(compiled, lean) if lean is not None else compiled

    # The compilers return OutputCode, so torch's AOTAutograd cache stores (and on a hit loads) the whole
    # AOT result with our graphs (compile_cache.py).
    def make_cached(kind: str) -> Callable:
        def compiler(g: torch.fx.GraphModule, inputs: List[Any]) -> compile_cache.HintOutputCode:
            fn, payload, why = _compile(g, inputs, opts, kind, forward_input_aliases, cuda_graphs, lean)
            return compile_cache.HintOutputCode(kind, fn, payload, opts, why)
        return SerializableAOTDispatchCompiler(compile_cache.HintOutputCode, compiler)

    with compile_cache.caching(opts, gm, functools.partial(rebuild, opts=opts, lean=lean)):
        compiled = aot_autograd(fw_compiler=make_cached("forward"), bw_compiler=make_cached("backward"),
                                inference_compiler=make_cached("inference"), partition_fn=partition_fn)(gm, example_inputs)
    return runtime(compiled, lean) if lean is not None else compiled
