"""Before AOTAutograd: give scaled_dot_product_attention's attn_mask a layout its fused kernels take.

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
from typing import Dict

import torch
import torch.nn.functional as F

log = logging.getLogger("hintbackend")



def _mask_arg(node: torch.fx.Node):
    if "attn_mask" in node.kwargs:
        return node.kwargs["attn_mask"], ("kw", "attn_mask")
    if len(node.args) > 3:
        return node.args[3], ("arg", 3)
    return None, None


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
