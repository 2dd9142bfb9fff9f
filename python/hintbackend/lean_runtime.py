"""A lean autograd runtime for plain training graphs (option ``lean_runtime``, on by default).

AOTAutograd hands back a callable that wraps our compiled forward and backward in its own runtime:
Python wrappers that handle input mutations, outputs aliasing inputs, tensor subclasses, functionalized
RNG, effect tokens, saved SymInts and more, on every call. For a graph that has none of these, that
runtime is much of the host time of a small step: on the development machine's CPU, the test corpus's
SDPA block (``SDPABlock(d=64, h=4)``, [1, 8, 64]) steps in 1.00-1.06x eager's time with this runtime and
1.19-1.23x with AOTAutograd's (docs/memory.md, "The lean runtime").

Here a graph whose AOTAutograd metadata (``ViewAndMutationMeta``, read while the forward compiles) shows
none of those features gets a `LeanPlan` (input mutations allowed only as data written into inputs that take
no gradient, as training BatchNorm writes its running statistics: the forward returns their new values
first, and the call copies them into the inputs, as AOTAutograd's runtime does, where the forward did not
write them in place: write-inputs-in-place), and the backend call
returns a callable that runs the compiled forward and backward as one autograd function written in C++
(``hintbackend._C.LeanFunction``, backend/bindings/LeanAutograd.cpp; its node is ``LeanBackward``), doing
only what such a graph needs: save the forward's saved tensors (detached where they are views, with
version-counter checks where AOTAutograd would check them), mark the outputs that need no gradient, give
the backward each gradient in the layout it was traced with, and return the inputs' gradients, with no
Python on the way (a Python ``torch.autograd.Function`` here cost a third of a small step's host time on
the GPU machine: docs/memory.md). An output whose gradient is undefined (the step never used it: HF's
logits beside the loss) is not materialized as zeros, as torch's autograd would: the backward runs
compiled again with that tangent known to be zero (fold-zero-inputs folds the add that read it), built
at the first such call (by Python, `_zero_graph`) and kept. Every other graph, an inference
graph, calls under functorch's transforms or compiled autograd keep AOTAutograd's runtime; the log says
why for a graph (``TORCH_LOGS="+hintbackend"``).

With ``cuda_graphs`` (``mode="reduce-overhead"``) the function runs each graph of the pair through
``hintbackend._C.ReplayedGraph`` (backend/runtime/GraphReplay.h): recorded once as a CUDA graph and
replayed, so that the step costs the host two launches instead of one per kernel; a call the replay cannot
take (outputs of both recordings still held, changed inputs) runs the graph as usual, and the log says
why, once.

The plan is plain data (JSON), stored with the forward in the compile cache, so that a cache hit runs
lean too. Without the cache AOTAutograd compiles the backward at the first backward: until then calls
go through its runtime.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import weakref
from typing import Any, Callable, FrozenSet, List, Optional, Tuple

import torch

log = logging.getLogger("hintbackend")

# Tests set this to replay on the CPU (GraphReplay's emulated mode: no capture, the same bookkeeping),
# so that CI, which has no GPU, checks what cuda_graphs does around the graphs.
EMULATE_REPLAY = False


@dataclasses.dataclass(frozen=True)
class LeanPlan:
    """How one forward/backward pair is called (all from AOTAutograd's metadata of the pair)."""

    num_outputs: int  # the user's outputs, first among the forward's
    saved: Tuple[int, int]  # the forward's outputs saved with version-counter checks: [start, stop)
    saved_unchecked: Tuple[int, int]  # those saved without (stashed on the context): [start, stop)
    differentiable: Tuple[int, ...]  # user outputs whose gradients the backward takes, in its order
    # The layout each tangent was traced with, as AOTAutograd records it: a memory format's name
    # ("contiguous_format", "channels_last", ...), or [size, stride] where it guesses the output's strides.
    tangent_layouts: Tuple[Any, ...]
    # AOTAutograd found saved tensors the backward may overwrite (bw_donated_idxs): retain_graph is refused.
    donated: bool = False
    # User outputs that are an `_unsafe_view` of an intermediate (a Linear on a 3-d input: HF's logits):
    # returned as a fresh `_unsafe_view` of the compiled output, as AOTAutograd's runtime returns them.
    unsafe_views: Tuple[int, ...] = ()
    # Inputs whose new values are the forward's first outputs, in order, copied into them after each
    # forward: data mutations of inputs that take no gradient (BatchNorm's running statistics).
    mutated_inputs: Tuple[int, ...] = ()
    # The inputs Dynamo marks static (parameters, buffers): a CUDA-graph replay reads them where they are
    # (None: not known, all inputs are read in place).
    static_inputs: Optional[Tuple[int, ...]] = None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_json(d: dict) -> "LeanPlan":
        return LeanPlan(d["num_outputs"], tuple(d["saved"]), tuple(d["saved_unchecked"]),
                        tuple(d["differentiable"]),
                        tuple(x if isinstance(x, str) else (tuple(x[0]), tuple(x[1])) for x in d["tangent_layouts"]),
                        d["donated"], tuple(d.get("unsafe_views", ())), tuple(d.get("mutated_inputs", ())),
                        None if d.get("static_inputs") is None else tuple(d["static_inputs"]))


def _absolute(s: slice, n: int) -> Tuple[int, int]:
    start, stop, _ = s.indices(n)
    return start, max(start, stop)


def plan_of(meta: Any, num_inputs: int, num_forward_outputs: int) -> Tuple[Optional[LeanPlan], str]:
    """The plan of a training forward from AOTAutograd's metadata, or (None, why not).

    `num_inputs`: the backend call's inputs (Dynamo's); `num_forward_outputs`: the compiled forward's."""
    from torch._functorch._aot_autograd.schemas import MutationType, OutputType, PlainTensorMeta

    if meta is None:
        return None, "no AOTAutograd metadata"
    if len(meta.input_info) != num_inputs:
        return None, "AOTAutograd changed the inputs (duplicates, lifted parameters or synthetic bases)"
    runtime_mutated = list(meta.mutated_inp_runtime_indices)
    for i, info in enumerate(meta.input_info):
        layout = info.mutates_metadata or info.mutates_storage_metadata or \
            getattr(info, "mutation_inductor_storage_resize", False)
        if not (info.mutates_data or layout):
            continue
        if layout:
            return None, f"input {i} is mutated (its sizes, strides or storage)"
        if info.requires_grad:
            return None, f"input {i} is mutated and takes a gradient"
        if info.mutation_type != MutationType.MUTATED_OUT_GRAPH or i not in runtime_mutated:
            return None, f"input {i} is mutated inside the graph"
    if any(s is not None for s in getattr(meta, "mutated_inp_stream_indices", None) or ()):
        return None, "an input mutated on a user stream"
    for i, info in enumerate(meta.output_info):
        if info.output_type not in (OutputType.non_alias, OutputType.unsafe_view_alias):
            return None, f"output {i} aliases an input or an intermediate ({info.output_type.name})"
        if not issubclass(info.raw_type, torch.Tensor):
            return None, f"output {i} is a {info.raw_type.__name__}"
    for what, metas in (("input", meta.subclass_inp_meta), ("output", meta.subclass_fw_graph_out_meta)):
        if not all(isinstance(m, (int, PlainTensorMeta)) for m in metas):
            return None, f"a tensor subclass among the {what}s"
    checks = [
        (meta.num_intermediate_bases, "intermediate bases"),
        (len(meta.tokens) + meta.num_backward_tokens, "effect tokens"),
        (meta.is_rng_op_functionalized or getattr(meta, "num_graphsafe_rng_states", 0), "functionalized RNG"),
        (meta.num_symints_saved_for_bw, "saved SymInts"),
        (getattr(meta, "num_opaque_objects_saved_for_bw", 0) or 0, "saved opaque objects"),
        (meta.grad_enabled_mutation is not None, "a grad-mode change inside the graph"),
        (getattr(meta, "dynamic_saved_tensors_idxs", None), "dynamic saved tensors"),
        (getattr(meta, "num_outputs_rng_offset", 0), "an RNG offset output"),
    ]
    for present, what in checks:
        if present:
            return None, f"the graph has {what}"
    differentiable = tuple(i for i, info in enumerate(meta.output_info) if info.requires_grad)
    if len(meta.subclass_tangent_meta) != len(differentiable):
        return None, "tangents other than the outputs' gradients"
    layouts: List[Any] = []
    for t in meta.subclass_tangent_meta:
        if not isinstance(t, PlainTensorMeta) or t.memory_format is None:
            return None, "a tangent of a tensor subclass"
        f = t.memory_format
        if f.memory_format is not None:
            name = str(f.memory_format).replace("torch.", "")
            if getattr(torch, name, None) is not f.memory_format:
                return None, f"a tangent of memory format {name}"
            layouts.append(name)
            continue
        size, stride = tuple(f.size or ()), tuple(f.stride or ())
        if f.size is None or f.stride is None or not all(type(v) is int for v in size + stride):
            return None, "a tangent of symbolic shape"
        layouts.append((size, stride))
    n = num_forward_outputs
    return LeanPlan(meta.num_outputs, _absolute(meta.tensors_saved_for_backwards_with_vc_check_slice, n),
                    _absolute(meta.tensors_saved_for_backwards_no_vc_check_slice, n), differentiable,
                    tuple(layouts), bool(getattr(meta, "bw_donated_idxs", None)),
                    tuple(i for i, info in enumerate(meta.output_info)
                          if info.output_type == OutputType.unsafe_view_alias), tuple(runtime_mutated),
                    tuple(meta.static_input_indices) if meta.static_input_indices else None), ""


def written_inputs(meta: Any, num_inputs: int) -> Tuple[int, ...]:
    """The graph inputs whose new values are a forward's (or inference graph's) first outputs, in order: the
    data mutations AOTAutograd's runtime (or the lean one) copies back into them after each call
    (write-inputs-in-place writes them in place instead). () where the metadata shows any other kind of
    input mutation, or inputs the graph does not take one for one (effect tokens, synthetic bases)."""
    from torch._functorch._aot_autograd.schemas import MutationType

    if meta is None or len(meta.input_info) != num_inputs:
        return ()
    runtime_mutated = tuple(meta.mutated_inp_runtime_indices)
    if any(s is not None for s in getattr(meta, "mutated_inp_stream_indices", None) or ()):
        return ()
    for i in runtime_mutated:
        info = meta.input_info[i]
        if not info.mutates_data or info.mutates_metadata or info.mutates_storage_metadata or \
                getattr(info, "mutation_inductor_storage_resize", False) or info.requires_grad or \
                info.mutation_type != MutationType.MUTATED_OUT_GRAPH:
            return ()
    return runtime_mutated


def forward_output_count(gm: torch.fx.GraphModule) -> int:
    out = next(iter(reversed(gm.graph.find_nodes(op="output"))))
    return len(out.args[0])


class LeanPair:
    """One backend call's forward and backward, as the compilers (or the compile cache) give them, and the
    C++ autograd function that runs them (hintbackend._C.LeanFunction, backend/bindings/LeanAutograd.cpp)
    once both are there."""

    def __init__(self, num_inputs: int, replay: bool = False) -> None:
        self.num_inputs = num_inputs
        self.replay = replay  # cuda_graphs: the forward and backward replayed (_replayed)
        self.replayed: Tuple[Any, ...] = ()  # their ReplayedGraphs, once built (stats for tests, benchmarks)
        self.plan: Optional[LeanPlan] = None  # None: AOTAutograd's runtime
        self.forward: Optional[Callable] = None
        self.backward: Optional[Callable] = None
        # The backward built again with some inputs passed as zeros (backend._zero_variants).
        self.zero_variant: Optional[Callable[[Tuple[int, ...]], Any]] = None
        self.native: Any = None  # the C++ function, when the plan, the forward and the backward are there

    def take(self, kind: str, fn: Callable, plan: Optional[LeanPlan],
             zero_variant: Optional[Callable[[Tuple[int, ...]], Any]] = None) -> None:
        """A compiled (or loaded) graph of the pair; an inference graph leaves the pair unused."""
        if kind == "forward":
            self.forward, self.plan = fn, plan
        elif kind == "backward":
            self.backward, self.zero_variant = fn, zero_variant
        else:
            return
        self.native = None
        if self.plan is not None and self.forward is not None and self.backward is not None:
            from . import _core

            graphs = (self.forward.hintbackend_graph, self.backward.hintbackend_graph)
            if self.replay:  # (the backward reads the saved values in place: its first inputs)
                p = self.plan
                saved = p.saved[1] - p.saved[0] + p.saved_unchecked[1] - p.saved_unchecked[0]
                graphs = self.replayed = (_replayed(self.forward, p.static_inputs),
                                          _replayed(self.backward, tuple(range(saved))))
                graphs[1].follow(graphs[0])  # the backward's recordings share its forward's pools
            # (the callback reaches the pair through a weak reference: the C++ function holds it, and the
            # pair holds the function)
            self.native = _core().LeanFunction(*graphs, self.plan.to_json(),
                                               functools.partial(_zero_graph, weakref.ref(self)))


def _replayed(fn: Callable, in_place: Optional[Tuple[int, ...]]) -> Any:
    """A compiled graph of the pair as a ReplayedGraph that reads the inputs `in_place` where they are
    (None: all) and copies the others: its events (recorded, or why a call or the graph runs without CUDA
    graphs) go to the log, each once."""
    from . import _core

    name = getattr(fn, "hintbackend_name", "?")

    def note(warning: bool, text: str) -> None:
        (log.warning if warning else log.info)("graph %s %s", name, text)

    return _core().ReplayedGraph(fn.hintbackend_graph, EMULATE_REPLAY, None if in_place is None else list(in_place),
                                 note)


def _zero_graph(pair_ref: Callable[[], Optional[LeanPair]], positions: Tuple[int, ...]) -> Tuple[Any, FrozenSet[int]]:
    """For backwards whose inputs at `positions` are zeros (undefined gradients): the backward that folds
    them, and the positions it does not read (the node passes None there); where none builds (or the pair
    is gone: the compiled model was dropped with a backward still pending), None, and the node runs the
    backward as compiled with zeros. Called by the C++ function at the first such backward; it keeps the
    result."""
    pair = pair_ref()
    built = pair.zero_variant(positions) if pair is not None and pair.zero_variant is not None else None
    if built is None:
        return None, frozenset()
    fn, unread = built
    return fn.hintbackend_graph, unread


def runtime(aot_fn: Callable, pair: LeanPair) -> Callable:
    """The backend call's result: AOTAutograd's callable until the pair is ready, then the lean one."""
    from torch._dynamo import compiled_autograd

    from . import _core

    core = _core()

    def run(*args: Any) -> Any:
        native = pair.native
        # Compiled autograd traces AOTAutograd's backward nodes (ours it cannot: LeanBackward refuses it
        # with a clear error), and functorch's transforms wrap autograd.Functions in Python: under either,
        # AOTAutograd's runtime.
        if native is None or not torch.is_grad_enabled() or compiled_autograd.compiled_autograd_enabled or \
                torch._C._are_functorch_transforms_active():
            return aot_fn(*args)
        try:
            return native(*args)
        except Exception as e:
            # ATen errors carry the node already; an error a Python kernel raised gets it as a note.
            site = core.take_failure_site()
            if site:
                e.add_note(f"hintbackend: raised while running {site}")
            raise

    for attr in ("zero_grad", "named_parameters", "named_buffers", "serialize"):
        if hasattr(aot_fn, attr):
            setattr(run, attr, getattr(aot_fn, attr))
    run.hintbackend_lean = pair  # type: ignore[attr-defined]
    # (Dynamo calls it through its own disable wrapper, "do not trace Dynamo-compiled graph": one more
    # here cost each call two frame-evaluation switches)
    return run
