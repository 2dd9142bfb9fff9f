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
first, and the call copies them into the inputs, as AOTAutograd's runtime does), and the backend call
returns a callable that runs the compiled
forward and backward inside one ``torch.autograd.Function`` of its own, doing only what such a graph
needs: save the forward's saved tensors (detached where they are views, with version-counter checks
where AOTAutograd would check them), mark the outputs that need no gradient, give the backward each
gradient in the layout it was traced with, and return the inputs' gradients. An output whose gradient is
undefined (the step never used it: HF's logits beside the loss) is not materialized as zeros, as torch's
autograd would: the backward runs compiled again with that tangent known to be zero (fold-zero-inputs folds
the add that read it), built at the first such call and kept. Every other graph, and an
inference graph, keeps AOTAutograd's runtime; the log says why (``TORCH_LOGS="+hintbackend"``).

The plan is plain data (JSON), stored with the forward in the compile cache, so that a cache hit runs
lean too. Without the cache AOTAutograd compiles the backward at the first backward: until then calls
go through its runtime.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, FrozenSet, List, Optional, Tuple

import torch
from torch._functorch._aot_autograd.runtime_wrappers import coerce_to_expected_memory_format
from torch.autograd.function import once_differentiable


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

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @staticmethod
    def from_json(d: dict) -> "LeanPlan":
        return LeanPlan(d["num_outputs"], tuple(d["saved"]), tuple(d["saved_unchecked"]),
                        tuple(d["differentiable"]),
                        tuple(x if isinstance(x, str) else (tuple(x[0]), tuple(x[1])) for x in d["tangent_layouts"]),
                        d["donated"], tuple(d.get("unsafe_views", ())), tuple(d.get("mutated_inputs", ())))

    def tangent_formats(self) -> List[Any]:
        """The layouts as AOTAutograd's MemoryFormatMeta, for its coerce_to_expected_memory_format."""
        from torch._functorch._aot_autograd.schemas import MemoryFormatMeta

        return [MemoryFormatMeta(memory_format=getattr(torch, x)) if isinstance(x, str)
                else MemoryFormatMeta(size=x[0], stride=x[1]) for x in self.tangent_layouts]


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
                          if info.output_type == OutputType.unsafe_view_alias), tuple(runtime_mutated)), ""


def forward_output_count(gm: torch.fx.GraphModule) -> int:
    out = next(iter(reversed(gm.graph.find_nodes(op="output"))))
    return len(out.args[0])


class LeanPair:
    """One backend call's forward and backward, as the compilers (or the compile cache) give them."""

    def __init__(self, num_inputs: int) -> None:
        self.num_inputs = num_inputs
        self.plan: Optional[LeanPlan] = None  # None: AOTAutograd's runtime
        # Built once from the plan: the tangents' layouts as AOTAutograd's MemoryFormatMeta, and the user
        # outputs that take no gradient (marked so).
        self.tangent_formats: List[Any] = []
        self.nondifferentiable: Tuple[int, ...] = ()
        self.forward: Optional[Callable] = None
        self.backward: Optional[Callable] = None
        # The backward built again with some inputs passed as zeros (backend._zero_variants), and what it
        # built, per set of input positions: (callable, the positions it no longer reads).
        self.zero_variant: Optional[Callable[[Tuple[int, ...]], Any]] = None
        self.variants: Dict[Tuple[int, ...], Tuple[Callable, FrozenSet[int]]] = {}

    def take(self, kind: str, fn: Callable, plan: Optional[LeanPlan],
             zero_variant: Optional[Callable[[Tuple[int, ...]], Any]] = None) -> None:
        """A compiled (or loaded) graph of the pair; an inference graph leaves the pair unused."""
        if kind == "forward":
            self.forward, self.plan = fn, plan
            if plan is not None:
                self.tangent_formats = plan.tangent_formats()
                self.nondifferentiable = tuple(i for i in range(plan.num_outputs) if i not in plan.differentiable)
        elif kind == "backward":
            self.backward, self.zero_variant, self.variants = fn, zero_variant, {}

    def backward_with_zeros(self, positions: Tuple[int, ...]) -> Tuple[Callable, FrozenSet[int]]:
        """The backward for calls whose inputs at `positions` are zeros (undefined gradients), and the
        positions it does not read (the caller passes None there); built at its first use."""
        got = self.variants.get(positions)
        if got is None:
            built = self.zero_variant(positions) if self.zero_variant is not None else None
            got = self.variants[positions] = built if built is not None else (self.backward, frozenset())
        return got


class _LeanFunction(torch.autograd.Function):
    """The compiled forward and backward of one plain graph (see the module docstring)."""

    @staticmethod
    def forward(ctx: Any, pair: LeanPair, *args: Any) -> Any:
        plan = pair.plan
        outs = pair.forward(list(args))
        a, b = plan.saved
        ctx.save_for_backward(*[x.detach() if x._is_view() else x for x in outs[a:b]])
        a, b = plan.saved_unchecked
        ctx.unchecked = [x.detach() if x._is_view() else x for x in outs[a:b]]
        ctx.pair = pair
        nm = len(plan.mutated_inputs)  # the mutated inputs' new values come first (runtime() copies them)
        user = list(outs[nm:nm + plan.num_outputs])
        for i in plan.unsafe_views:  # not a view for autograd (as AOTAutograd's runtime does)
            user[i] = torch.ops.aten._unsafe_view(user[i], user[i].shape)
        if pair.nondifferentiable or nm:
            ctx.mark_non_differentiable(*outs[:nm], *[user[i] for i in pair.nondifferentiable])
        ctx._materialize_non_diff_grads = False
        # An output whose gradient nobody computes (the logits beside a loss) gets None, not a tensor of
        # zeros: the backward then runs with that tangent folded away where it can (backward_with_zeros),
        # else gets the zeros from here (the outputs' sizes, kept without the tensors).
        ctx.set_materialize_grads(False)
        ctx.tangent_meta = [(user[i].shape, user[i].dtype, user[i].device) for i in plan.differentiable]
        return (*outs[:nm], *user) if nm else tuple(user)

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, *grads: Any) -> Any:
        pair = ctx.pair
        plan = pair.plan
        if plan.mutated_inputs:  # (the mutated inputs' new values take no gradient)
            grads = grads[len(plan.mutated_inputs):]
        keep_graph = torch._C._autograd._get_current_graph_task_keep_graph()
        if plan.donated and keep_graph:  # as AOTAutograd's runtime refuses it
            raise RuntimeError(
                "hintbackend: this compiled backward may overwrite the tensors its forward saved (AOTAutograd's "
                "donated buffers), so it runs once: call backward() without retain_graph=True or create_graph=True, "
                "or set torch._functorch.config.donated_buffer=False before compiling.")
        args = [*ctx.saved_tensors, *ctx.unchecked]
        if not keep_graph:  # (retain_graph: a later backward takes them again)
            ctx.unchecked = None
        ctx.maybe_clear_saved_tensors()  # (unless retain_graph) the backward may free them as it goes
        base = len(args)
        undefined = tuple(base + k for k, i in enumerate(plan.differentiable) if grads[i] is None)
        backward, unread = pair.backward_with_zeros(undefined) if undefined else (pair.backward, frozenset())
        for k, (i, f) in enumerate(zip(plan.differentiable, pair.tangent_formats)):
            g = grads[i]
            if g is None:
                if base + k in unread:
                    args.append(None)
                    continue
                shape, dtype, device = ctx.tangent_meta[k]
                g = torch.zeros(shape, dtype=dtype, device=device)
            args.append(coerce_to_expected_memory_format(g, f))  # AOTAutograd's own coercion
        return (None, *backward(args))


# torch.autograd.Function.apply is a Python wrapper: it binds default arguments (forward has none) and
# unwraps functorch's dead wrappers (there are none outside functorch's transforms) before the C++ apply,
# about 5 us a call on the development machine's CPU. Outside those transforms the C++ apply runs directly.
_c_apply = super(torch.autograd.Function, _LeanFunction).apply


def _apply(pair: LeanPair, args: Tuple[Any, ...]) -> Any:
    if torch._C._are_functorch_transforms_active():
        return _LeanFunction.apply(pair, *args)
    return _c_apply(pair, *args)


def runtime(aot_fn: Callable, pair: LeanPair) -> Callable:
    """The backend call's result: AOTAutograd's callable until the pair is ready, then the lean one."""
    import torch._dynamo
    from torch._dynamo import compiled_autograd

    def run(*args: Any) -> Any:
        # Compiled autograd traces AOTAutograd's backward nodes specially: under it, AOTAutograd's runtime.
        if pair.plan is None or pair.backward is None or not torch.is_grad_enabled() or \
                compiled_autograd.compiled_autograd_enabled:
            return aot_fn(*args)
        if not pair.plan.mutated_inputs:
            return _apply(pair, args)
        outs = _apply(pair, args)
        nm = len(pair.plan.mutated_inputs)
        for i, new in zip(pair.plan.mutated_inputs, outs[:nm]):
            args[i].copy_(new)  # as AOTAutograd's runtime writes a data mutation back
        return outs[nm:]

    for attr in ("zero_grad", "named_parameters", "named_buffers", "serialize"):
        if hasattr(aot_fn, attr):
            setattr(run, attr, getattr(aot_fn, attr))
    run.hintbackend_lean = pair  # type: ignore[attr-defined]
    return torch._dynamo.disable(run, reason="do not trace hintbackend's compiled graph")
