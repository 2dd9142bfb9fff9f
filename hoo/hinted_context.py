"""hinted_context: a model author's hints for a region of the model, carried into the AOT graphs.

Three forms, one mechanism (see docs/hints.md for the hints themselves):

    with hinted_context(schedule="dfs", slices=8):          # context manager
        y = attention(q, k, v)

    @hinted_context(schedule="bfs")                          # decorator (parentheses required)
    def block(x): ...

    y = hinted_context(attention, q, k, v, schedule="dfs")   # functional: torch.ops.higher_order.hinted_context

Every ATen node a region covers, in the AOT forward graph and in the backward graph, gets
node.meta["custom"]["hintbackend"] = {"region": id, "path": [outer ids..., id], <merged hints>};
no other node does. Outside torch.compile a region runs its code unchanged.

How: when Dynamo traces a region, the payload (validated hints merged with the enclosing region's,
a stable region id: see _stable_region_id) is computed eagerly at trace time (_region_payload is assume_constant_result, so
it costs no guard and no graph node). The context manager and decorator then become
torch.fx.traceback.annotate(payload), which Dynamo runs while tracing, so the Dynamo nodes carry the
payload and AOTAutograd copies it onto the ATen nodes it traces from them; backward nodes inherit it
from their forward node by seq_nr. The functional form calls the higher-order op (_op.py) with the
payload as a JSON string; AOTAutograd inlines its body under the same annotation.
"""

from __future__ import annotations

import functools
import json
import os
import re
import threading
import traceback
import weakref
import zlib
from typing import Any, Callable

import torch
import torch._guards
import torch.fx.traceback as fx_traceback

from .hints import HINTS_KEY, HintError, merge_hints, validate_hints

MIN_TORCH = (2, 11)


def _torch_version() -> tuple[int, int]:
    m = re.match(r"(\d+)\.(\d+)", torch.__version__)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def _torch_problem() -> str | None:
    """Why this torch cannot run hinted_context, or None."""
    if _torch_version() < MIN_TORCH:
        return f"torch {torch.__version__} is too old"
    if not hasattr(fx_traceback, "annotate"):
        return "torch.fx.traceback.annotate is missing"
    try:
        from torch._higher_order_ops.base_hop import BaseHOP  # noqa: F401
    except ImportError:
        return "torch._higher_order_ops.base_hop.BaseHOP is missing"
    return None


_TORCH_PROBLEM = _torch_problem()

if _TORCH_PROBLEM is None:
    import torch._dynamo

    from . import _dynamo_support
    from ._op import annotated, dynamo_callback, hinted_context_op

    _dynamo_support.install(__name__)
    _assume_constant_result = torch._dynamo.assume_constant_result
else:
    hinted_context_op = None

    def _assume_constant_result(fn):
        return fn


def _check_torch() -> None:
    if _TORCH_PROBLEM is not None:
        raise RuntimeError(
            f"hintbackend.hinted_context needs torch >= {MIN_TORCH[0]}.{MIN_TORCH[1]} with "
            f"torch.fx.traceback.annotate and BaseHOP, but {_TORCH_PROBLEM}. Upgrade torch "
            f"(pip install 'torch>={MIN_TORCH[0]}.{MIN_TORCH[1]}')."
        )


# Region ids are stable: derived from where the region is entered in the user's source and how many
# times that place was entered before in the same trace (a loop over layers enters one `with` line once
# per layer), so recompiling the same code gives the same ids and dumps of two runs compare line by line.
# id = crc32("<file name>:<line>#<occurrence>") in 31 bits; a clash with another id of the same trace
# (never seen) takes the next free number, which is deterministic too.
_HOO_DIR = os.path.dirname(os.path.abspath(__file__))
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__))
# Per trace (Dynamo's TracingContext; None outside Dynamo): occurrences per place, ids taken.
_traces: "weakref.WeakKeyDictionary[Any, tuple[dict, set]]" = weakref.WeakKeyDictionary()
_untraced: tuple[dict, set] = ({}, set())


def _user_place() -> tuple[str, Any]:
    """("file.py:line", the trace's key) of the code entering a region: the frame Dynamo is tracing, or
    outside Dynamo (make_fx, export) the innermost caller outside hintbackend and torch."""
    ctx = torch._guards.TracingContext.try_get()
    frames = list(torch._guards.TracingContext.extract_stack()) if ctx is not None else []
    if not frames:
        frames = [f for f in traceback.extract_stack()
                  if not os.path.abspath(f.filename).startswith((_HOO_DIR, _TORCH_DIR))]
    if not frames:
        return "<unknown>", ctx
    f = frames[-1]
    return f"{os.path.basename(f.filename)}:{f.lineno}", ctx


def _stable_region_id() -> int:
    place, ctx = _user_place()
    seen, taken = _untraced if ctx is None else _traces.setdefault(ctx, ({}, set()))
    occurrence = seen.get(place, 0)
    seen[place] = occurrence + 1
    rid = zlib.crc32(f"{place}#{occurrence}".encode()) & 0x7FFFFFFF
    while rid in taken:
        rid = (rid + 1) & 0x7FFFFFFF
    taken.add(rid)
    return rid


def _enclosing_payload() -> dict | None:
    custom = fx_traceback.current_meta.get("custom") or {}
    return custom.get(HINTS_KEY)


def _new_payload(hints: dict) -> dict:
    return merge_hints(_enclosing_payload(), validate_hints(hints), _stable_region_id())


@_assume_constant_result
def _region_payload(hints: dict) -> Any:
    """{"hintbackend": payload} for a region entered now, or the HintError message. Dynamo calls this
    eagerly while tracing (assume_constant_result): the enclosing region's annotation is live in
    fx.traceback.current_meta then, and the result is a constant in the compiled code."""
    try:
        return {HINTS_KEY: _new_payload(hints)}
    except HintError as e:
        return str(e)


@_assume_constant_result
def _region_payload_json(hints: dict) -> str:
    """The same payload as a JSON string for the higher-order op ("!" + message on a HintError)."""
    try:
        return json.dumps(_new_payload(hints), sort_keys=True)
    except HintError as e:
        return "!" + str(e)


@_assume_constant_result
def _decode(payload_json: str) -> dict:
    return {HINTS_KEY: json.loads(payload_json)}


def _reenter_region(payload_json: str):
    """Re-enters a region after a graph break (bytecode Dynamo generates calls this; see
    _dynamo_support). Eagerly it is a plain annotate around the code that broke the graph."""
    return fx_traceback.annotate(_decode(payload_json))


# Eager regions on this thread, innermost last (merged hints, no ids): so that eager code raises the
# same nesting errors as compiled code, which falls back to eager when a region's hints are bad.
_eager = threading.local()


def _eager_enter(hints: dict) -> None:
    stack = _eager.__dict__.setdefault("stack", [])
    # With no eager region open, an enclosing one may still be live as an annotation: one that
    # Dynamo entered in a frame it compiled before falling back to eager for the rest.
    stack.append(merge_hints(stack[-1] if stack else _enclosing_payload(), validate_hints(hints), -1))


def _eager_exit() -> None:
    _eager.stack.pop()


class _Region:
    """What hinted_context(**hints) returns outside torch.compile: a context manager and decorator.
    It does nothing unless an FX tracer outside Dynamo is recording node metadata (make_fx or export
    with preserve_node_meta), in which case it annotates like the compiled form."""

    __slots__ = ("_hints", "_active")

    def __init__(self, hints: dict) -> None:
        validate_hints(hints)
        self._hints = hints
        self._active: list = []

    def __enter__(self) -> None:
        _eager_enter(self._hints)
        cm = None
        if fx_traceback.has_preserved_node_meta():
            try:
                cm = annotated(_new_payload(self._hints))
                cm.__enter__()
            except BaseException:
                _eager_exit()
                raise
        self._active.append(cm)

    def __exit__(self, *exc) -> None:
        cm = self._active.pop()
        if cm is not None:
            cm.__exit__(*exc)
        _eager_exit()

    def __call__(self, fn: Callable) -> Callable:
        if not callable(fn):
            raise TypeError(f"hinted_context(...) decorates a function or method, got {type(fn)}")
        if isinstance(fn, type):
            raise TypeError(f"hinted_context(...) decorates a function or method, got the class {fn.__name__}: "
                            f"decorate its forward method instead")
        hints = self._hints

        @functools.wraps(fn)
        def hinted(*args, **kwargs):
            with hinted_context(**hints):
                return fn(*args, **kwargs)

        return hinted

    def __repr__(self) -> str:
        return f"hinted_context({', '.join(f'{k}={v!r}' for k, v in self._hints.items())})"


def hinted_context(*args: Any, **hints: Any) -> Any:
    """A hinted region (docs/hints.md).

    hinted_context(**hints)                  -> context manager / decorator
    hinted_context(body, *operands, **hints) -> body(*operands), traced as torch.ops.higher_order.hinted_context
    """
    _check_torch()
    if args:
        body, operands = args[0], args[1:]
        if not callable(body):
            raise TypeError(
                f"hinted_context: the first positional argument is the body function of the functional "
                f"form, got {type(body)}; hints are keyword arguments: hinted_context(schedule='dfs')"
            )
        if not operands and not hints:
            raise TypeError(
                f"hinted_context({getattr(body, '__name__', 'body')}) has neither operands nor hints: as a "
                f"decorator it takes its hints in parentheses, @hinted_context(schedule='dfs'); the functional "
                f"form is hinted_context(body, *operands, **hints)"
            )
        if not torch.compiler.is_compiling():
            _eager_enter(hints)
            try:
                # Under a tracer outside Dynamo (make_fx, export), or eagerly while torch.compile runs
                # because the body broke Dynamo's graph: the op carries the hints (_op.py).
                if fx_traceback.has_preserved_node_meta() or dynamo_callback():
                    return hinted_context_op(body, *operands, hints=json.dumps(_new_payload(hints)))
                return body(*operands)
            finally:
                _eager_exit()
        payload_json = _region_payload_json(hints)
        if payload_json.startswith("!"):
            raise HintError(payload_json[1:])
        # Entered while Dynamo traces the body too: regions nested in it merge with it, and the
        # body's Dynamo nodes carry the payload (AOT replays them with their own metadata).
        with fx_traceback.annotate(_decode(payload_json)):
            return hinted_context_op(body, *operands, hints=payload_json)
    if not torch.compiler.is_compiling():
        return _Region(hints)
    payload = _region_payload(hints)
    if isinstance(payload, str):
        raise HintError(payload)
    return fx_traceback.annotate(payload)
