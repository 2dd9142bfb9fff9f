"""Before AOTAutograd: drop a scaled_dot_product_attention attn_mask that masks nothing, and give the
others a layout SDPA's fused kernels take.

A mask computed from constants alone (HF's bidirectional mask under torch.compile: `arange(S)[None, None,
:, None] >= 0`, expanded to [B, 1, S, S]; eager HF skips it, since it can look at the values) is
evaluated here, on the CPU, and when it is all True (or, as a float mask, all zero) the call gets no mask:
the same attention, without a [1, 1, S, S] bias built, kept for the backward and read by the kernel (HF
BERT's 2 MiB above eager's peak, docs/memory.md).

SDPA is decomposed when AOTAutograd traces it, into whichever kernel torch's dispatcher picks for the
traced tensors. A mask broadcast along its last dim (stride 0 there, as HF BERT's padding mask is under
torch.compile: [B, 1, S, S] expanded from one value per query row) is refused by the memory-efficient
and cuDNN kernels, so the trace takes the math form: S x S float32 scores, probabilities and dropout masks
saved for the backward (docs/memory.md: 2.5x eager's peak on BERT, where eager, which gets no mask,
runs a fused kernel). Here such a mask is copied contiguous first, along its batch and head dims only
where it varies (a dim of stride 0 is narrowed to size 1, which SDPA broadcasts back): the same values,
a [B|1, H|1, Sq, Skv] copy, and a fused kernel.
"""

from __future__ import annotations

import logging
import operator
from typing import Dict, Optional

import torch
import torch.nn.functional as F

log = logging.getLogger("hintbackend")



def _mask_arg(node: torch.fx.Node):
    if "attn_mask" in node.kwargs:
        return node.kwargs["attn_mask"], ("kw", "attn_mask")
    if len(node.args) > 3:
        return node.args[3], ("arg", 3)
    return None, None


# What a mask computed from constants may be made of: index arithmetic, comparisons, views. Nothing random
# (its value now would not be its value at run time) and nothing that reads a graph input.
_CONSTANT_FUNCTIONS = {
    torch.arange, torch.ones, torch.zeros, torch.full, torch.where, torch.logical_and, torch.logical_or,
    torch.logical_not, torch.ge, torch.gt, torch.le, torch.lt, torch.eq, torch.ne, torch.abs,
    operator.add, operator.sub, operator.mul, operator.floordiv, operator.mod, operator.neg, operator.getitem,
    operator.ge, operator.gt, operator.le, operator.lt, operator.eq, operator.ne, operator.and_, operator.or_,
    operator.xor, operator.invert,
}
_CONSTANT_METHODS = {"expand", "view", "reshape", "unsqueeze", "squeeze", "to", "bool", "float", "int", "long",
                     "contiguous", "clone", "transpose", "permute", "__getitem__", "__and__", "__or__", "__invert__",
                     "abs", "ge", "gt", "le", "lt", "eq", "ne", "add", "sub", "mul"}
_CONSTANT_MAX_BYTES = 64 << 20  # what evaluating one may allocate, per value


def constant_value(node: torch.fx.Node) -> Optional[torch.Tensor]:
    """node's value where it depends on no graph input (made only of _CONSTANT_FUNCTIONS/_METHODS on
    literals), computed now on the CPU; None otherwise, or where a value would pass _CONSTANT_MAX_BYTES."""
    order, seen = [], set()

    def visit(n: torch.fx.Node) -> bool:
        if n in seen:
            return True
        seen.add(n)
        ok = (n.op == "call_function" and n.target in _CONSTANT_FUNCTIONS) or \
             (n.op == "call_method" and n.target in _CONSTANT_METHODS)
        if not ok or not all(visit(a) for a in n.all_input_nodes):
            return False
        order.append(n)
        return True

    if not visit(node):
        return None
    env: Dict[torch.fx.Node, object] = {}

    def on_cpu(x):
        return torch.device("cpu") if isinstance(x, torch.device) else x

    try:
        for n in order:
            args = torch.fx.node.map_arg(n.args, lambda a: env[a])
            kwargs = {k: on_cpu(v) for k, v in torch.fx.node.map_arg(n.kwargs, lambda a: env[a]).items()}
            if n.op == "call_function":
                value = n.target(*args, **kwargs)
            else:
                value = getattr(args[0], n.target)(*args[1:], **kwargs)
            if isinstance(value, torch.Tensor):
                if value.is_cuda or value.untyped_storage().nbytes() > _CONSTANT_MAX_BYTES:
                    return None
            env[n] = value
    except Exception:  # noqa: BLE001 (any op this cannot run here: the mask stays as traced)
        return None
    value = env[node]
    return value if isinstance(value, torch.Tensor) else None


def _erase_unused(gm: torch.fx.GraphModule, node: torch.fx.Node) -> None:
    """Erases node and then its inputs as they lose their last user (a dropped mask's constant chain; the
    rest of the graph is left to AOTAutograd, since a Dynamo graph's in-place methods look unused)."""
    if node.users:
        return
    inputs = list(node.all_input_nodes)
    gm.graph.erase_node(node)
    for a in inputs:
        _erase_unused(gm, a)


def masks_nothing(mask: torch.Tensor) -> bool:
    """An attn_mask that lets every score through: all True, or, added to the scores, all zero."""
    if mask.dtype == torch.bool:
        return bool(mask.all())
    return mask.is_floating_point() and not bool(mask.any())


def drop_masks_that_mask_nothing(gm: torch.fx.GraphModule) -> int:
    """Rewrites gm in place: SDPA calls whose attn_mask is computed from constants and masks nothing get no
    mask (module docstring); returns how many."""
    dropped = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not F.scaled_dot_product_attention:
            continue
        mask, where = _mask_arg(node)
        if not isinstance(mask, torch.fx.Node) or node.kwargs.get("is_causal", False):
            continue
        value = constant_value(mask)
        if value is None or not masks_nothing(value):
            continue
        if where[0] == "kw":
            node.update_kwarg(where[1], None)
        else:
            node.update_arg(where[1], None)
        _erase_unused(gm, mask)
        dropped += 1
        log.info("sdpa: %s's attn_mask %s is computed from constants and masks nothing (%s %s): the call gets no "
                 "mask", node.name, mask.name, "all True" if value.dtype == torch.bool else "all zero",
                 list(value.shape))
    if dropped:
        gm.graph.lint()
        gm.recompile()
    return dropped


def needs_copy(mask: torch.Tensor) -> bool:
    """Whether the mask's last dim is broadcast (stride 0 over more than one element): the layout the
    fused SDPA kernels refuse."""
    return mask.dim() >= 2 and mask.size(-1) > 1 and mask.stride(-1) == 0


def make_sdpa_masks_fusable(gm: torch.fx.GraphModule) -> int:
    """Rewrites gm in place (see the module docstring); returns how many SDPA calls changed."""
    copies: Dict[torch.fx.Node, torch.fx.Node] = {}  # one copy per mask, however many calls read it
    changed = 0
    for node in list(gm.graph.nodes):
        if node.op != "call_function" or node.target is not F.scaled_dot_product_attention:
            continue
        mask, where = _mask_arg(node)
        if not isinstance(mask, torch.fx.Node):
            continue
        value = mask.meta.get("example_value")
        if not isinstance(value, torch.Tensor):
            continue
        if not all(isinstance(x, int) for x in (*value.shape, *value.stride())):
            continue  # symbolic sizes or strides: deciding would add guards; left as traced
        if not needs_copy(value):
            continue
        if mask not in copies:  # before its first reader (nodes are visited in order)
            with gm.graph.inserting_before(node):
                m = mask
                for d in range(value.dim() - 2):
                    if value.stride(d) == 0 and value.size(d) > 1:
                        m = gm.graph.call_function(torch.narrow, (m, d, 0, 1))
                copies[mask] = gm.graph.call_method("contiguous", (m,))
        copy = copies[mask]
        if where[0] == "kw":
            node.update_kwarg(where[1], copy)
        else:
            node.update_arg(where[1], copy)
        changed += 1
        log.info("sdpa: %s reads attn_mask %s broadcast along its last dim (stride 0): passed as a contiguous "
                 "copy, so SDPA keeps a fused kernel instead of its math form", node.name, mask.name)
    if changed:
        gm.graph.lint()
        gm.recompile()
    return changed
