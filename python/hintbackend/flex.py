"""FlexAttention on any device, for training on CPU.

torch 2.11's public ``flex_attention`` refuses backward on CPU in a Python check
(``_validate_device``) before it reaches the higher-order op, although the op and its autograd
support run on CPU. ``flex_attention_hop_call`` makes the same higher-order-op call that the public
API makes under torch.compile, minus that check, so CPU tests and the CPU demo can train through
FlexAttention. It must be called under torch.compile (like the public API's compiled path), and it
is only for CPU: on CUDA use ``torch.nn.attention.flex_attention.flex_attention``.
"""

from __future__ import annotations

import math
from typing import Callable, Optional

import torch
from torch._higher_order_ops.flex_attention import flex_attention as flex_attention_hop
from torch.nn.attention import flex_attention as _fa


def flex_attention_hop_call(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                            score_mod: Optional[Callable] = None, block_mask=None,
                            scale: Optional[float] = None) -> torch.Tensor:
    if score_mod is None:
        score_mod = _fa._identity
    if block_mask is None:
        block_mask = _fa._create_empty_block_mask(query, key)
    if scale is None:
        scale = 1.0 / math.sqrt(query.size(-1))
    kernel_options = _fa._apply_kernel_options(query, key, value, False, None, None)
    out, _lse, _max = flex_attention_hop(query, key, value, score_mod, block_mask.as_tuple(), scale, kernel_options)
    return out
