"""Lets a graph break happen inside a hinted_context region.

Under Dynamo the context-manager form is torch.fx.traceback.annotate({"hintbackend": payload}), which
Dynamo runs eagerly while it traces (FxTracebackAnnotateVariable). Upstream cannot resume an annotate
block after a graph break: it has no way to rebuild the dict in bytecode, so Dynamo gives up on the
whole frame and runs it in eager, silently dropping the region (torch 2.11, "torch.fx.traceback.annotate
escaped from compiled region").

For annotations that are exactly ours ({"hintbackend": {...}}) we keep the payload as one JSON string
and rebuild the context from it with hinted_context._reenter_region(json), so the code before the
break, the breaking call itself and the resumed code all run inside the region, and both graphs carry
its hints under the same region id. Every other annotate keeps upstream's behavior.
"""

from __future__ import annotations

import json
from contextlib import ExitStack

import torch

from .hints import HINTS_KEY

_installed = False


def _is_ours(target_values) -> bool:
    return isinstance(target_values, dict) and list(target_values) == [HINTS_KEY]


def install(region_module: str) -> bool:
    """Routes Dynamo's annotate variable through a subclass that can be rebuilt after a graph break.
    `region_module` is the importable name of the module defining _reenter_region. Returns whether
    the hook is in place (False on a torch whose Dynamo lacks the pieces; regions then lose graph
    break support only)."""
    global _installed
    if _installed:
        return True
    try:
        import torch._dynamo.variables as dynamo_variables
        from torch._dynamo.variables.constant import ConstantVariable
        from torch._dynamo.variables.ctx_manager import ContextWrappingVariable, FxTracebackAnnotateVariable
    except ImportError:
        return False

    class HintedRegionVariable(FxTracebackAnnotateVariable):
        """A hintbackend region: target_values is (payload_json,) so it can be rebuilt in bytecode."""

        def __init__(self, target_values, initial_values=None, **kwargs) -> None:
            if _is_ours(target_values):
                target_values = (json.dumps(target_values[HINTS_KEY], sort_keys=True),)
                # The source upstream passes is the annotate *function*'s: rebuilding the value from it
                # would hand back annotate itself instead of an entered region.
                kwargs["source"] = None
            super().__init__(target_values=target_values, initial_values=initial_values, **kwargs)

        def _ours(self) -> bool:
            return isinstance(self.target_values, tuple)

        def enter(self, tx, *args):
            if not self._ours():
                return super().enter(tx, *args)
            stack = ExitStack()
            stack.enter_context(torch.fx.traceback.annotate({HINTS_KEY: json.loads(self.target_values[0])}))
            stack.enter_context(torch.fx.traceback.preserve_node_meta())
            self.set_cleanup_hook(tx, lambda: stack.close())
            return ConstantVariable.create(None)

        def module_name(self) -> str:
            return region_module if self._ours() else super().module_name()

        def fn_name(self) -> str:
            return "_reenter_region" if self._ours() else super().fn_name()

        def reconstruct_type(self, codegen) -> None:
            if not self._ours():
                return super().reconstruct_type(codegen)
            return ContextWrappingVariable.reconstruct_type(self, codegen)

    # TorchInGraphFunctionVariable looks the class up in this package when it meets annotate().
    dynamo_variables.FxTracebackAnnotateVariable = HintedRegionVariable
    _installed = True
    return True
