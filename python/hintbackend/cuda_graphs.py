"""CUDA-graph replay of compiled graphs (options={"cuda_graphs": True}, mode="reduce-overhead"), by
torch's cudagraph trees: docs/debugging.md, "CUDA graphs"."""

from __future__ import annotations

import logging
from typing import Any, Callable, List, Optional

import torch

log = logging.getLogger("hintbackend")


class CudaGraphs:
    """CUDA-graph replay of one aot_autograd call's compiled graphs, by torch's cudagraph trees (what
    Inductor's mode="reduce-overhead" uses): each graph is warmed up, then recorded and replayed, with
    inputs copied into static buffers except the parameters and buffers (forward) and the saved values
    (backward), whose addresses do not change. A graph torch's own checks refuse (an op on the CPU,
    several devices, an input it mutates, an op that cannot be captured) or one with dynamic shapes runs
    as usual, with the reason logged; a forward that runs as usual keeps its backward out too."""

    def __init__(self, num_dynamo_inputs: int) -> None:
        from torch._inductor.cudagraph_utils import BoxedDeviceIndex
        from torch._inductor.utils import BoxedBool

        self.num_dynamo_inputs = num_dynamo_inputs
        self.enabled = BoxedBool(True)
        self.device_index = BoxedDeviceIndex(None)

    def _skip_reason(self, gm: torch.fx.GraphModule, example_inputs: List[Any], fixed: int) -> Optional[str]:
        from torch._dynamo.backends.cudagraphs import check_for_skip

        if any(isinstance(x, torch.SymInt) for x in example_inputs) or any(
                isinstance(x, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in x.shape)
                for x in example_inputs):
            return "dynamic shapes"
        devices = {x.device.type for x in example_inputs if isinstance(x, torch.Tensor)}
        if "cuda" not in devices:
            return "no CUDA tensors"
        return check_for_skip(gm, fixed)

    def wrap(self, fn: Callable, gm: torch.fx.GraphModule, example_inputs: List[Any], kind: str,
             name: str) -> Callable:
        from torch._dynamo.backends.cudagraphs import find_input_mutations, get_device_index, get_stack_traces
        from torch._inductor.cudagraph_trees import cudagraphify_impl, get_manager
        from torch._inductor.cudagraph_utils import get_placeholder_info
        from torch._inductor.utils import BoxedBool, count_tangents, num_fw_fixed_arguments

        backward = kind == "backward"
        if backward and not self.enabled:
            return fn  # its forward runs as usual: so does it
        fixed = count_tangents(gm) if backward else num_fw_fixed_arguments(self.num_dynamo_inputs, len(example_inputs))
        reason = self._skip_reason(gm, example_inputs, fixed)
        if reason:
            log.warning("graph %s runs without CUDA graphs: %s", name, reason)
            if not backward:
                BoxedBool.disable(self.enabled)
                return fn
            manager = get_manager(self.device_index.value or 0, create_if_none_exists=False)

            def backward_fn(inputs: List[Any]) -> Any:
                if manager is not None:
                    manager.set_to_running_backward()
                return fn(inputs)

            backward_fn._boxed_call = True  # type: ignore[attr-defined]
            return backward_fn
        device = get_device_index(gm)
        if not backward:
            self.device_index.set(device)
        log.info("graph %s replays as a CUDA graph (%d static inputs)", name, fixed)
        out = cudagraphify_impl(fn, example_inputs, range(fixed), device_index=device, is_backward=backward,
                                is_inference=kind == "inference", stack_traces=get_stack_traces(gm),
                                placeholders=get_placeholder_info(gm.graph),
                                mutated_input_idxs=find_input_mutations(gm.graph))
        out._boxed_call = True  # type: ignore[attr-defined]
        return out
