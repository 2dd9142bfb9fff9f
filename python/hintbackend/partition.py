"""Training partition: recompute DFS regions in the backward instead of saving their intermediates.

AOTAutograd hands the partitioner one joint forward+backward graph and asks which forward values to
save for the backward. torch's ``default_partition`` saves whatever the backward reads, so for an
attention region it saves the B x H x S x S softmax: the forward materializes it in full (defeating
the forward slice loop) and the backward starts from it.

``partition`` starts from ``default_partition``'s decision and changes one thing: a saved value made by
a node of a region whose schedule is ``"dfs"`` or ``"auto"`` is not saved; the backward recomputes it
from the region's inputs instead. The walk goes back through the value's producers while they are in
such a region and saves the first values outside one (graph inputs, values made before the region),
e.g. q, k and v. The recomputed nodes keep their meta (``meta["custom"]["hintbackend"]`` included), so
in the backward graph the region holds its forward recompute followed by its backward ops, and the
slice-schedule pass turns all of it into one slice loop.

Not recomputed (their values are saved, as the default does):

- random ops (``nondeterministic_seeded``, e.g. dropout): recomputing would draw different numbers.
  Their outputs are saved and a warning names the node, since the forward then still materializes
  them;
- impure ops, values the default partitioner must save (``MUST_SAVE``, effectful ops, collectives),
  forward outputs (the caller holds them anyway, so saving them costs nothing), higher-order ops other
  than ``flex_attention``;
- the values of a region that slice-schedule leaves whole (1 slice) in the default partition's forward:
  an ``auto`` region whose ``memory_budget`` that forward already meets, or that has none, and ``dfs``
  with ``slices=1``. The C++ chooser decides (``slice_decisions``; the partition never restates its
  rule), so recomputing would only cost time. The log says so;
- saved values no larger than the region's largest output whose recompute would rerun a matrix
  product or an attention op (FlexAttention's logsumexp, B x H x S next to its B x H x S x D output):
  saving one costs less than the output the caller holds anyway, while recomputing it would rerun the
  whole attention in the backward. Attention's S x S values are far larger and are recomputed; views
  of the region's inputs cost nothing to recompute and are.

A graph with no dfs/auto region gets torch's ``min_cut_rematerialization_partition`` (Inductor's: it saves
less and recomputes cheap pointwise ops in the backward), or ``default_partition`` with
``options={"partition": "default"}``. Before min-cut, the cross-entropy loss of upcast half-precision logits
(``logits.float()``, as HF's models write it) is rewritten so that the forward saves one value per row for
the backward instead of the [N, C] float32 log-probabilities (``save_logsumexp_for_cross_entropy``).

The whole graph keeps the default partition, with a log line saying why, when: the graph uses
activation checkpointing tags or activation offloading, a region node mutates, a value to recompute from is mutated (or aliases a mutated value),
or anything else is unexpected.
"""

from __future__ import annotations

import json
import logging
import operator
from typing import AbstractSet, Any, Dict, List, Optional, Set, Tuple

import torch
import torch.fx as fx
import torch.utils._pytree as pytree
from torch._functorch import config as functorch_config
from torch._functorch._aot_autograd.descriptors import InputMutationAOTOutput, MetadataMutationAOTOutput
from torch._functorch.compile_utils import raise_getitems
from torch._functorch.partitioners import (
    _extract_fwd_bwd_modules,
    _has_tag_must_be_in_backward,
    _has_tag_must_be_in_forward,
    _is_primal,
    default_partition,
    has_recomputable_ops,
    min_cut_rematerialization_partition,
    is_not_collective,
    thread_graphsafe_rng_from_hops,
)
from torch.fx.experimental.proxy_tensor import is_sym_node
from torch.utils._ordered_set import OrderedSet
from torch.utils.checkpoint import CheckpointPolicy

from .hoo.hints import HINTS_KEY
from . import _core
from .serialize import WANTS_GRAD, SerializationError, draws_random, serialize, target_name

log = logging.getLogger("hintbackend")

#: Region schedules whose intermediates the backward recomputes.
RECOMPUTE_SCHEDULES = ("dfs", "auto")


class _Fallback(Exception):
    """This graph keeps the default partition; the message says why."""


def node_hints(node: fx.Node) -> Optional[dict]:
    custom = node.meta.get("custom")
    if not isinstance(custom, dict):
        return None
    hints = custom.get(HINTS_KEY)
    return hints if isinstance(hints, dict) else None


def recomputes(node: fx.Node, kept: AbstractSet[int] = frozenset()) -> bool:
    """Whether node belongs to a region whose saved values the backward recomputes (`kept`: regions the
    slice chooser leaves whole, see _regions_left_whole)."""
    hints = node_hints(node)
    return bool(hints) and hints.get("schedule") in RECOMPUTE_SCHEDULES and hints.get("region") not in kept


def _regions_left_whole(joint: fx.GraphModule, fw_default: fx.GraphModule, settings: Any) -> Set[int]:
    """The dfs/auto regions that slice-schedule leaves whole (1 slice) in the default partition's forward.

    The decision has one owner, the C++ slice chooser: this asks it (``slice_decisions``) on the default
    forward graph, whose saved values are outputs, under the same settings the compile uses. A region it
    keeps whole (an auto region that meets its memory_budget, or has none; dfs with slices=1) is not
    recomputed: that would only cost time. When the decision cannot be made (the graph does not
    serialize, or no slice count meets a budget), the regions are recomputed, as before."""
    regions = {h["region"] for n in joint.graph.nodes
               if (h := node_hints(n)) and h.get("schedule") in RECOMPUTE_SCHEDULES and "region" in h}
    if not regions:
        return set()
    try:
        doc, _ = serialize(fw_default, "partition_check")
        counts = _core().slice_decisions(json.dumps(doc), settings)
    except (SerializationError, ValueError, RuntimeError) as e:
        log.info("partition: cannot ask slice-schedule about the default forward (%s); dfs/auto regions are "
                 "recomputed", e)
        return set()
    kept = {r for r in regions if counts.get(r) == 1}
    for r in sorted(kept):
        log.info("partition: slice-schedule leaves region %d whole in the forward (1 slice: an auto region that "
                 "fits its memory_budget or has none, or slices=1): the backward does not recompute it", r)
    return kept


def _describe(node: fx.Node) -> str:
    hints = node_hints(node) or {}
    where = f" in region {hints['region']} (schedule={hints.get('schedule')})" if "region" in hints else ""
    return f"%{node.name} ({node.target}){where}"


def _is_random(node: fx.Node) -> bool:
    """A nondeterministic_seeded op (dropout, rand, bernoulli, SDPA kernels that can drop out): running
    it again draws different numbers, so the backward must not recompute it."""
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return torch.Tag.nondeterministic_seeded in target.tags
    name = getattr(target, "__name__", "") or str(target)
    return "rng" in name or "rand" in name


def _is_tuple_valued(node: fx.Node) -> bool:
    return isinstance(node.meta.get("val"), (tuple, list))


def _joint_outputs(joint: fx.GraphModule) -> tuple:
    out = next(iter(joint.graph.find_nodes(op="output")))
    leaves = list(pytree.arg_tree_leaves(*out.args))
    descs = list(pytree.arg_tree_leaves(out.meta.get("desc") or [None] * len(leaves)))
    return leaves, descs


def _numel(node: fx.Node) -> Optional[int]:
    """The element count of node's tensor value, None when not a tensor or not a static size."""
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return None
    try:
        return int(val.numel())
    except (TypeError, ValueError, RuntimeError):  # symbolic
        return None


def _region_output_numels(joint: fx.GraphModule, forward: AbstractSet[str], fwd_outputs: AbstractSet[fx.Node]
                          ) -> Dict[int, int]:
    """Per region: the largest element count among its forward values that the forward outside the region
    reads or returns (`forward`: the names of the forward's nodes; the backward's reads do not count)."""
    sizes: Dict[int, int] = {}
    for n in joint.graph.nodes:
        hints = node_hints(n)
        if not hints or "region" not in hints or n.name not in forward:
            continue
        region = hints["region"]
        if n in fwd_outputs or any(u.name in forward and (node_hints(u) or {}).get("region") != region
                                   for u in n.users):
            numel = _numel(n)
            if numel is not None:
                sizes[region] = max(sizes.get(region, 0), numel)
    return sizes


#: Ops whose recompute costs real work, by their IR names (any overload): matrix products and attention.
_HEAVY = {"aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm", "aten::matmul", "aten::convolution",
          "aten::_scaled_dot_product_flash_attention", "aten::_scaled_dot_product_efficient_attention",
          "aten::_scaled_dot_product_cudnn_attention", "aten::_scaled_dot_product_flash_attention_for_cpu",
          "higher_order::flex_attention"}


def _recompute_is_heavy(value: fx.Node, kept: AbstractSet[int]) -> bool:
    """Whether recomputing value (back through its region's nodes) reruns a matrix product or attention."""
    seen, stack = set(), [value]
    while stack:
        node = stack.pop()
        if node in seen or node.op != "call_function" or not recomputes(node, kept):
            continue
        seen.add(node)
        if target_name(node.target).split(".")[0] in _HEAVY:
            return True
        stack.extend(node.all_input_nodes)
    return False


class _Plan:
    """Which values the forward saves once the dfs/auto regions are recomputed."""

    def __init__(self, joint: fx.GraphModule, default_saved: List[fx.Node], default_sym: List[fx.Node],
                 num_fwd_outputs: int, kept: AbstractSet[int] = frozenset(),
                 forward: AbstractSet[str] = frozenset()) -> None:
        self.kept = kept
        leaves, self.descs = _joint_outputs(joint)
        self.fwd_outputs: Set[fx.Node] = {o for o in leaves[:num_fwd_outputs] if isinstance(o, fx.Node)}
        self.recomputed: Dict[fx.Node, None] = {}  # an ordered set
        self.saved: Dict[fx.Node, str] = {}  # value -> why it is saved
        self.saved_sym: Dict[fx.Node, None] = dict.fromkeys(default_sym)
        self.random: Dict[fx.Node, None] = {}
        output_numels = _region_output_numels(joint, forward, self.fwd_outputs)
        # Every value that stays saved first, so that a recompute walk stops at it.
        to_recompute = []
        for value in default_saved:
            reason = self._keep_reason(value)
            if reason is None:
                region = (node_hints(value) or {}).get("region")
                numel = _numel(value)
                if (numel is not None and region in output_numels and numel <= output_numels[region]
                        and _recompute_is_heavy(value, kept)):
                    reason = (f"no larger than region {region}'s largest output ({numel} <= "
                              f"{output_numels[region]} elements) and recomputing it reruns a matrix product "
                              f"or attention")
            if reason is not None:
                self.saved.setdefault(value, f"saved by default, {reason}")
            else:
                to_recompute.append(value)
        for value in to_recompute:
            self._recompute(value)

    def _keep_reason(self, node: fx.Node) -> Optional[str]:
        """None when the backward may recompute node; else why its value is saved."""
        if node.op != "call_function":
            return "not an op"
        if node.meta.get(LOSS_RECOMPUTE):  # save-logsumexp's: elementwise and row maxima of the logits
            return None
        if not recomputes(node, self.kept):
            return "outside a dfs/auto region (or in an auto region that fits its budget)"
        if node in self.fwd_outputs:
            return "a forward output"
        if node.target is operator.getitem:
            src = node.args[0]
            if not isinstance(src, fx.Node):
                raise _Fallback(f"{_describe(node)} indexes a non-node")
            return self._keep_reason(src)
        if node.meta.get("recompute") == CheckpointPolicy.MUST_SAVE:
            return "must be saved"
        if _has_tag_must_be_in_forward(node) or _has_tag_must_be_in_backward(node):
            return "pinned to the forward or backward"
        if isinstance(node.target, torch._ops.OpOverload):
            if node.target._schema.is_mutable:
                raise _Fallback(f"{_describe(node)} mutates its input inside a dfs/auto region")
            if _is_random(node):
                if draws_random(node.target, node):
                    self.random[node] = None
                return "random"
            if node.is_impure(impure_random=False):
                return "impure"
            return None
        if node.target is torch.ops.higher_order.flex_attention:
            return None
        if _is_random(node):
            self.random[node] = None
            return "random"
        return "an op the partitioner does not know to be pure"

    def _recompute(self, value: fx.Node) -> None:
        stack = [value]
        while stack:
            node = stack.pop()
            if node in self.recomputed or node in self.saved or node in self.saved_sym:
                continue
            if node.op == "get_attr":  # subgraphs and constants go to both graphs
                continue
            if is_sym_node(node):
                self.saved_sym[node] = None
                continue
            if node.op == "placeholder" and not _is_primal(node):
                raise _Fallback(f"a value to recompute reads {node.name}, which is not a forward input")
            reason = self._keep_reason(node)
            if reason is not None:
                if _is_tuple_valued(node):
                    raise _Fallback(f"{_describe(node)} returns a tuple and would have to be saved ({reason})")
                self.saved.setdefault(node, f"input of a recomputed value, {reason}")
                continue
            self.recomputed[node] = None
            stack.extend(node.all_input_nodes)

    def check_mutations(self, joint: fx.GraphModule) -> None:
        """Recomputing reads its inputs again in the backward: none of them may be mutated."""
        needed = OrderedSet(self.saved) | OrderedSet(self.recomputed)
        placeholders = {p.meta.get("desc"): p for p in joint.graph.find_nodes(op="placeholder")
                        if p.meta.get("desc") is not None}
        mutated: List[fx.Node] = []
        for desc in self.descs:
            if isinstance(desc, MetadataMutationAOTOutput):
                raise _Fallback("the graph changes an input's metadata (shape, strides or dtype) in place")
            if isinstance(desc, InputMutationAOTOutput):
                p = placeholders.get(desc.mutated_input)
                if p is None:
                    raise _Fallback(f"the graph mutates input {desc.mutated_input}, which has no placeholder")
                mutated.append(p)
        for node in joint.graph.nodes:
            if isinstance(node.target, torch._ops.OpOverload) and node.target._schema.is_mutable:
                mutated.extend(node.all_input_nodes)
        for m in mutated:
            family = _alias_family(m)
            hit = next((n for n in family if n in needed), None)
            if hit is not None:
                what = "is mutated by the graph" if hit is m else f"aliases %{m.name}, which the graph mutates"
                raise _Fallback(f"%{hit.name}, which the backward would read to recompute a dfs/auto region, "
                                f"{what}; the region's intermediates are saved for the backward instead")


def _aliased_inputs(node: fx.Node) -> List[fx.Node]:
    """The inputs node's result may alias (views, in-place and out= results)."""
    if node.target is operator.getitem:
        return [a for a in node.all_input_nodes]
    if not isinstance(node.target, torch._ops.OpOverload):
        return []
    schema = node.target._schema
    if not any(r.alias_info is not None for r in schema.returns):
        return []
    return list(node.all_input_nodes)


def _alias_family(node: fx.Node) -> Set[fx.Node]:
    """node, every value it may alias, and every value that may alias those (views of views...)."""
    roots = {node}
    stack = [node]
    while stack:
        for a in _aliased_inputs(stack.pop()):
            if a not in roots:
                roots.add(a)
                stack.append(a)
    family = set(roots)
    stack = list(roots)
    while stack:
        n = stack.pop()
        for user in n.users:
            if user not in family and n in _aliased_inputs(user):
                family.add(user)
                stack.append(user)
    return family


def _default_saved(joint: fx.GraphModule, fw: fx.GraphModule, num_fwd_outputs: int) -> tuple:
    """default_partition's saved values and saved symbolic values, as nodes of the joint graph."""
    by_name = {n.name: n for n in joint.graph.nodes}
    out = next(iter(fw.graph.find_nodes(op="output")))
    saved, sym = [], []
    for o in list(out.args[0])[num_fwd_outputs:]:
        node = by_name.get(getattr(o, "name", None))
        if node is None:
            raise _Fallback(f"cannot find the default partition's saved value {o} in the joint graph")
        (sym if is_sym_node(node) else saved).append(node)
    return saved, sym


_aten = torch.ops.aten
#: meta key of the nodes save-logsumexp adds that the backward recomputes (the dfs/auto partition's _Plan
#: recomputes them as it does a region's nodes; min-cut decides for itself).
LOSS_RECOMPUTE = "hintbackend_loss_recompute"
#: Readers of a log-softmax's output in the backward that the rewrite below hands the recomputed form.
_LSM_BACKWARD_READERS = (_aten.nll_loss_backward.default, _aten._log_softmax_backward_data.default)
_VIEWS = (_aten.view.default, _aten._unsafe_view.default)


def _static_tensor(node: Any) -> Optional[torch.Tensor]:
    """node's value when it is a tensor with static sizes, else None."""
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    if not isinstance(val, torch.Tensor) or not all(isinstance(s, int) for s in val.shape):
        return None
    return val


def _backward_readers(lsm: fx.Node) -> Optional[List[fx.Node]]:
    """The nodes through which the backward reads lsm (its gradient ops, directly or through detach), or None
    when anything else but the loss's nll_loss_forward reads it (then the rewrite would not pay)."""
    readers: List[fx.Node] = []
    stack = [u for u in lsm.users if u.target is not _aten.nll_loss_forward.default]
    while stack:
        u = stack.pop()
        if u.target is _aten.detach.default:
            stack.extend(u.users)
        elif u.target in _LSM_BACKWARD_READERS:
            readers.append(u)
        else:
            return None
    return readers


def _before_upcast(x: fx.Node) -> Optional[Tuple[fx.Node, List[fx.Node]]]:
    """When x is a float upcast of lower-precision logits seen through views (``logits.float().view(-1, C)``,
    as HF's losses write it): the logits and the views to repeat on them (outermost last). Subtracting a
    float32 row maximum from them promotes to float32 and gives exactly what subtracting it from x gives."""
    views: List[fx.Node] = []
    n = x
    while isinstance(n, fx.Node) and n.target in _VIEWS:
        views.append(n)
        n = n.args[0]
    if not isinstance(n, fx.Node):
        return None
    if n.target is _aten._to_copy.default:
        if len(n.args) != 1 or set(n.kwargs) - {"dtype", "layout", "device", "memory_format"}:
            return None
    elif n.target is not torch.ops.prims.convert_element_type.default or n.kwargs:
        return None
    src, out = _static_tensor(n.args[0]), _static_tensor(n)
    if src is None or out is None:
        return None
    upcast = src.dtype in (torch.bfloat16, torch.float16) or (src.dtype == torch.float32 and out.dtype == torch.float64)
    if (not upcast or src.device != out.device or src.layout != torch.strided or not src.is_contiguous()
            or n.kwargs.get("memory_format") not in (None, torch.preserve_format, torch.contiguous_format)):
        return None
    return n.args[0], list(reversed(views))


def save_logsumexp_for_cross_entropy(joint: fx.GraphModule) -> int:
    """Rewrites the joint graph so that a cross-entropy loss saves two values per row for its backward
    instead of its [N, C] log-probabilities; returns how many log-softmaxes it rewrote.

    ``F.cross_entropy`` traces as ``lsm = _log_softmax(x, 1)`` and ``nll_loss_forward(lsm, target)``; its
    gradient reads lsm again (``nll_loss_backward``, ``_log_softmax_backward_data``), so min-cut saves lsm:
    float32 [N, C], 785 MiB for GPT-2's vocabulary at B4 S1024, held from the loss into the backward.
    The backward's readers get ``(x - m) + a`` instead, with ``m = amax(x)`` and ``a = amax(lsm)`` per row
    (m taken over the logits before their upcast, the same value):
    ATen computes lsm as ``(x - m) - log(sum(exp(x - m)))``, a function increasing in x, so ``a`` is exactly
    minus that log-sum (the row's logsumexp is m - a), and ``(x - m) + a`` repeats ATen's own two roundings:
    the same log-probabilities, bit for bit where ATen's kernel computes it in that order (CUDA's does).
    x is an upcast of lower-precision logits (``logits.float()``, as HF's losses write it), and the sub
    reads those logits themselves (promoting to x's dtype gives the same values), so that min-cut, which
    weighs what it saves by bytes, finds a ([N, 1]) and the logits (half of lsm's bytes; the model returns
    them, so the caller holds them anyway) cheaper than lsm: m, sub and add read only those, and the
    backward recomputes them. fold-cross-entropy-backward (C++) then computes the gradient from those in
    one op. Without an upcast, saving x would cost min-cut what saving lsm does (it weighs a forward output
    like any saved value), and it computes both in the forward: x's loss is left as traced.

    Only float32/float64 log-softmaxes over dim 1 of a 2-D upcast tensor with static sizes, read by nothing
    but the loss and its gradient ops."""
    rewritten = 0
    for lsm in list(joint.graph.find_nodes(op="call_function", target=_aten._log_softmax.default)):
        val = _static_tensor(lsm)
        if (val is None or val.dim() != 2 or val.dtype not in (torch.float32, torch.float64) or len(lsm.args) != 3
                or lsm.args[1] not in (1, -1) or lsm.args[2] or lsm.kwargs):
            continue
        x = lsm.args[0]
        readers = _backward_readers(lsm)
        upcast = _before_upcast(x)
        if upcast is None or not readers or not any(u.target is _aten.nll_loss_forward.default for u in lsm.users):
            continue
        graph = joint.graph
        last = lsm

        def emit(target: Any, args: tuple) -> fx.Node:
            nonlocal last
            with graph.inserting_after(last):
                last = graph.call_function(target, args)
            last.meta["val"] = target(*[a.meta["val"] if isinstance(a, fx.Node) else a for a in args])
            return last

        dim = [lsm.args[1]]
        lsm_max = emit(_aten.amax.default, (lsm, dim, True))
        first_recomputable = len(graph.nodes)
        operand, views = upcast
        for v in views:
            operand = emit(v.target, (operand, *v.args[1:]))
        # The row maximum of the logits themselves, upcast (exactly): min-cut may recompute it in the
        # backward, where it reads them (not x, which would be materialized again in float32 for it).
        row_max = emit(torch.ops.prims.convert_element_type.default,
                       (emit(_aten.amax.default, (operand, dim, True)), val.dtype))
        recomputed = emit(_aten.add.Tensor, (emit(_aten.sub.Tensor, (operand, row_max)), lsm_max))
        # What the backward recomputes from the logits and lsm_max (the dfs/auto partition's _Plan asks).
        node = recomputed
        for _ in range(len(graph.nodes) - first_recomputable):
            node.meta[LOSS_RECOMPUTE] = True
            node = node.prev
        if recomputed.meta["val"].dtype != val.dtype or tuple(recomputed.meta["val"].shape) != tuple(val.shape):
            raise AssertionError(f"save_logsumexp_for_cross_entropy: %{recomputed.name} is not %{lsm.name}'s type")
        for r in readers:  # args[1]: nll_loss_backward's self, _log_softmax_backward_data's output
            old = r.args[1]
            r.replace_input_with(old, recomputed)
            while old is not lsm and not old.users:  # the detaches in between, now unread
                parent = old.args[0]
                graph.erase_node(old)
                old = parent
        rewritten += 1
    if rewritten:
        joint.graph.lint()
        joint.recompile()
    return rewritten


def _mutates_inputs(joint: fx.GraphModule) -> bool:
    """Whether the joint graph changes an input: AOTAutograd returns an input's new value or metadata as an
    output, or an op with a mutable schema is left in the graph."""
    if any(isinstance(d, (InputMutationAOTOutput, MetadataMutationAOTOutput)) for d in _joint_outputs(joint)[1]):
        return True
    return any(isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable
               for n in joint.graph.nodes if n.op == "call_function")


def _mark_wanted_gradients(joint: fx.GraphModule, fw: fx.GraphModule, num_fwd_outputs: int) -> None:
    """Sets WANTS_GRAD (serialize.py) on the forward's inputs that the joint graph returns a gradient for."""
    primals = [p.name for p in joint.graph.find_nodes(op="placeholder") if _is_primal(p)]
    grads = _joint_outputs(joint)[0][num_fwd_outputs:]
    wants = {name for name, g in zip(primals, grads) if g is not None}
    for p in fw.graph.find_nodes(op="placeholder"):
        if p.name in wants:
            p.meta[WANTS_GRAD] = True


def partition(joint_module: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int, **kwargs: Any):
    """hintbackend's partition_fn for aot_autograd (see the module docstring and _partition), which also
    marks the forward's inputs that get a gradient (WANTS_GRAD)."""
    fw, bw = _partition(joint_module, joint_inputs, num_fwd_outputs=num_fwd_outputs, **kwargs)
    _mark_wanted_gradients(joint_module, fw, num_fwd_outputs)
    return fw, bw


def _partition(joint_module: fx.GraphModule, joint_inputs: Any, *, num_fwd_outputs: int,
               static_lifetime_input_indices: Optional[List[int]] = None, settings: Any = None,
               base: str = "min-cut", save_logsumexp: bool = True, recompute_materialized: bool = True,
               **kwargs: Any):
    """`settings`: the compile's CompileSettings (Options.core_settings()), so the slice decision is the
    compile's own. `base`: the partition of graphs with no dfs/auto region ("default" or "min-cut",
    options.py's partition). `save_logsumexp`: rewrite cross-entropy losses before min-cut (off:
    disable_passes=["save-logsumexp"]). `recompute_materialized`: min-cut may recompute an op of its
    allowlist whose value the backward materializes anyway (off: disable_passes=["recompute-materialized"])."""
    if settings is None:
        settings = _core().CompileSettings()

    def default():
        return default_partition(joint_module, joint_inputs, num_fwd_outputs=num_fwd_outputs,
                                 static_lifetime_input_indices=static_lifetime_input_indices, **kwargs)

    def rewrite_losses() -> None:
        # Not under activation checkpointing tags: min-cut's SAC handling would see untagged new nodes.
        if (save_logsumexp and not has_recomputable_ops(joint_module)
                and (n := save_logsumexp_for_cross_entropy(joint_module))):
            log.info("partition: %d cross-entropy loss(es) save their logsumexp (max and log-probability max per "
                     "row) for the backward instead of the [N, C] log-probabilities", n)

    if not any(recomputes(n) for n in joint_module.graph.nodes):
        if base == "min-cut":
            rewrite_losses()
            # Min-cut bans recomputing a value that the backward materializes anyway (an input of a
            # non-fusible backward op: GELU's output, read by layer norm's backward), since Inductor's
            # recomputes are fused and that one would not be. Here no recompute is fused, and such a
            # value costs one pointwise kernel in the backward against a saved activation of its size
            # (the corpus MLP's peak 93 -> 77 MiB, Inductor's; the SDPA block's 56 -> 48 on the CPU;
            # docs/memory.md, "Recomputing what the backward materializes").
            # Not where the graph mutates an input (BatchNorm's running statistics, a parameter changed
            # under no_grad): min-cut would then recompute from the input before its update, which the
            # runtime's write-back changes before the backward (test_lean_runtime's DecayedScale).
            allow = recompute_materialized and not _mutates_inputs(joint_module)
            with functorch_config.patch(ban_recompute_materialized_backward=not allow):
                return min_cut_rematerialization_partition(joint_module, joint_inputs, compiler="inductor",
                                                           num_fwd_outputs=num_fwd_outputs,
                                                           static_lifetime_input_indices=static_lifetime_input_indices)
        return default()
    if has_recomputable_ops(joint_module):
        log.warning("partition: keeps the default partition for this graph: it has activation checkpointing "
                    "tags, so its dfs/auto regions' intermediates are saved for the backward in full")
        return default()
    if getattr(functorch_config, "enable_activation_offloading", False):
        log.warning("partition: keeps the default partition for this graph: activation offloading is on")
        return default()
    rewrite_losses()
    fw_default, bw_default = default()
    try:
        saved, sym = _default_saved(joint_module, fw_default, num_fwd_outputs)
        plan = _Plan(joint_module, saved, sym, num_fwd_outputs, _regions_left_whole(joint_module, fw_default, settings),
                     {n.name for n in fw_default.graph.nodes})
        if not plan.recomputed:
            log.debug("partition: no saved value of a dfs/auto region to recompute")
            return fw_default, bw_default
        plan.check_mutations(joint_module)
    except _Fallback as e:
        log.warning("partition: keeps the default partition for this graph: %s", e)
        return fw_default, bw_default

    for node in plan.random:
        log.warning(
            "partition: %s draws random numbers, so the backward cannot recompute it; its output is saved "
            "for the backward and the forward still materializes it in full. To keep the region's memory "
            "bounded, move the random op (e.g. dropout) out of the hinted_context(schedule=...) region.",
            _describe(node))

    log.debug("partition: saved values and why:\n  %s",
              "\n  ".join(f"%{n.name}: {why}" for n, why in plan.saved.items()))
    primals = [p for p in joint_module.graph.find_nodes(op="placeholder") if _is_primal(p)]
    static = OrderedSet(p for i, p in enumerate(primals) if i in (static_lifetime_input_indices or []))
    saved_values, saved_sym = list(plan.saved), list(plan.saved_sym)
    try:
        fw, bw = _extract_fwd_bwd_modules(joint_module, saved_values, saved_sym_nodes=saved_sym,
                                          num_fwd_outputs=num_fwd_outputs, static_lifetime_input_nodes=static)
    except Exception as e:  # torch internals we did not expect: the default partition is always valid
        log.warning("partition: keeps the default partition for this graph: extracting the recomputing "
                    "forward and backward failed: %s: %s", type(e).__name__, e)
        return fw_default, bw_default
    fw.graph.eliminate_dead_code(is_impure_node=is_not_collective)
    bw.graph.eliminate_dead_code(is_impure_node=is_not_collective)
    fw = raise_getitems(fw)
    bw = raise_getitems(bw)
    fw = thread_graphsafe_rng_from_hops(fw, is_backward=False)
    bw = thread_graphsafe_rng_from_hops(bw, is_backward=True)
    log.info("partition: the backward recomputes %d nodes of dfs/auto regions; saves %d values (%s) "
             "instead of the default %d (%s)", len(plan.recomputed), len(saved_values),
             ", ".join(n.name for n in saved_values), len(saved),
             ", ".join(n.name for n in saved))
    return fw, bw
