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
Called eagerly while torch.compile runs (Dynamo could not trace the body: it broke the graph), the op
skips dispatch and runs the body under the annotation with node-meta preservation on, so the frames
Dynamo compiles inside the body carry the region's hints (annotated_between_graph_breaks).
"""

from __future__ import annotations

import contextlib
import json

import torch
import torch._dynamo
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


@contextlib.contextmanager
def annotated_between_graph_breaks(payload: dict):
    """annotated(payload) for eager code that torch.compile runs between graph breaks: also turns on
    node-meta preservation, which Dynamo otherwise enables only inside an annotate it traces, so
    the frames it compiles from here record the payload on their nodes."""
    with fx_traceback.preserve_node_meta(), annotated(payload):
        yield


# Truthy in eager code that torch.compile runs between graph breaks: Dynamo's frame callback is
# installed, so the frames called from there are compiled. The builtin itself, called inline: a Python
# function around it would be a frame Dynamo tries to compile.
dynamo_callback = torch._C._dynamo.eval_frame.get_eval_frame_callback


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
        # Its hints are a node argument and its body a subgraph, both in the graph's code, which caches
        # (AOTAutograd's, the compile cache) hash: an entry of a graph with this op is keyed by them.
        self._cacheable = True

    # Dynamo traces calls of the op itself (BaseHOPVariable) and never this frame; it reaches it
    # only when the body broke its graph, and then must not try to compile the dispatch below.
    @torch._dynamo.disable(recursive=False)
    def __call__(self, subgraph, *operands, hints):
        if not callable(subgraph):
            raise TypeError(f"hinted_context: the body must be callable, got {type(subgraph)}")
        if not isinstance(hints, str):
            raise TypeError(f"hinted_context: hints must be a JSON string, got {type(hints)}")
        if not fx_traceback.has_preserved_node_meta() and dynamo_callback():
            # Eager between graph breaks, no tracer below: every implementation would run the body
            # under the annotation, which is what this does, and Dynamo compiles the body's frames.
            with annotated_between_graph_breaks(_decode(hints)):
                return subgraph(*operands)
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
