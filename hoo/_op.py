"""torch.ops.higher_order.hinted_context: the functional form of a hinted region as a higher-order op.

    hinted_context(body, *operands, hints=<JSON of the region's payload>) == body(*operands)

Dynamo traces it like any BaseHOP: `body` becomes a subgraph of the Dynamo graph and the op a node
calling it. AOTAutograd then inlines the body: every ATen op in it is traced on its own, under the
region's annotation, so it lands in the forward graph with node.meta["custom"]["hintbackend"], and
its backward ops inherit that from it by seq_nr. The hints travel as a JSON string because the op's
arguments must be flat (a dict argument fails in AOT).

One implementation per dispatch key or mode, as torch/_higher_order_ops/hints_wrap.py does:
  Autograd              inline: each op records its own autograd node (no opaque backward)
  Functionalize         functionalize the body, redispatch below
  ProxyTorchDispatchMode inline under the annotation: ATen nodes, no HOP node, in the traced graph
  FakeTensorMode        run the body on fake tensors
  CompositeExplicitAutograd (dense) run the body
"""

from __future__ import annotations

import contextlib
import json

import torch
import torch.fx.traceback as fx_traceback
from torch._higher_order_ops.base_hop import BaseHOP
from torch._ops import HigherOrderOperator

from .hints import HINTS_KEY


@contextlib.contextmanager
def annotated(payload: dict):
    """Puts `payload` under current_meta["custom"]["hintbackend"] for the FX nodes created inside.
    Unlike fx.traceback.annotate it never updates the current custom dict in place: during AOT that
    dict belongs to the Dynamo node being replayed."""
    saved = fx_traceback.current_meta.get("custom")
    fx_traceback.current_meta["custom"] = {**(saved or {}), HINTS_KEY: payload}
    try:
        yield
    finally:
        if saved is None:
            fx_traceback.current_meta.pop("custom", None)
        else:
            fx_traceback.current_meta["custom"] = saved


def _decode(hints: str) -> dict:
    return json.loads(hints)


def _run_body(subgraph, operands):
    """Runs the body. A Dynamo-traced body (a GraphModule) is replayed node by node while FX records
    node metadata, so each ATen op inherits its own Dynamo node's metadata: a region nested inside
    the body keeps its own hints, and stack traces point at the user's code."""
    if isinstance(subgraph, torch.fx.GraphModule) and fx_traceback.has_preserved_node_meta():
        return torch.fx.Interpreter(subgraph).run(*operands)
    return subgraph(*operands)


# BaseHOP: Dynamo traces subclasses of it generically (BaseHOPVariable), with the body as a subgraph.
class HintedContextOp(BaseHOP):
    def __init__(self) -> None:
        super().__init__("hinted_context")

    def __call__(self, subgraph, *operands, hints):
        if not callable(subgraph):
            raise TypeError(f"hinted_context: the body must be callable, got {type(subgraph)}")
        if not isinstance(hints, str):
            raise TypeError(f"hinted_context: hints must be a JSON string, got {type(hints)}")
        # BaseHOP.__call__ would insist on a GraphModule; any callable is fine here because every
        # implementation below only calls it.
        return HigherOrderOperator.__call__(self, subgraph, *operands, hints=hints)

    def _call_Autograd(self, subgraph, *operands, hints):
        with annotated(_decode(hints)):
            return _run_body(subgraph, operands)

    def _call_Functionalize(self, ctx, subgraph, *operands, hints):
        unwrapped = ctx.unwrap_tensors(operands)
        with ctx.redispatch_to_next():
            out = self(ctx.functionalize(subgraph), *unwrapped, hints=hints)
        return ctx.wrap_tensors(out)

    def _call_ProxyTorchDispatchMode(self, proxy_mode, subgraph, *operands, hints):
        with proxy_mode, annotated(_decode(hints)):
            return _run_body(subgraph, operands)

    def _call_FakeTensorMode(self, mode, subgraph, *operands, hints):
        with mode:
            return subgraph(*operands)

    def _call_CompositeExplicitAutograd(self, subgraph, *operands, hints):
        return subgraph(*operands)


# Registers itself as torch.ops.higher_order.hinted_context.
hinted_context_op = HintedContextOp()
