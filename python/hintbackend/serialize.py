"""FX GraphModule -> hintbackend graph document (JSON), schema in docs/graph-schema.md.

Every node becomes {"name", "op", "target", "args", "kwargs", "val", "effects", "custom", "source"}.
Arguments are tagged ({"ref": name}, {"int": 3}, {"float": "inf"}, {"dtype": "float32"}, ...), so the
C++ importer never guesses a type. Subgraphs (FlexAttention's score_mod, mask_mod, fw_graph,
joint_graph) are serialized recursively and referenced as {"graph": name}. Tensor constants are
handed to C++ separately; a get_attr node names one by index.

SymInt policy: symbolic sizes are supported where FX makes them graph values (SymInt placeholders,
sym_size nodes, Python arithmetic on them): they are refs, and the runtime computes them from the
actual inputs. A symbolic value that is not a graph node (a bare SymInt baked into an argument) is an
error naming the node, and the backend falls back.
"""

from __future__ import annotations

import math
import operator
import re
from typing import Any, Iterable, List, Set, Tuple

import torch
import torch.fx

SCHEMA_FORMAT = "hintbackend.graph"
SCHEMA_VERSION = 1
# A forward graph's placeholder meta key: the backward computes a gradient for this input (partition.py sets
# it; AOT traces the forward's inputs without requires_grad). Written as the input's requires_grad, which
# the kernel selection of a forward node may read (a FlexAttention bias whose float32 table gets a gradient,
# codegen/KernelSelect.cpp).
WANTS_GRAD = "hintbackend_wants_grad"


class SerializationError(Exception):
    """A node whose arguments or metadata the document cannot express."""


def target_name(target: Any) -> str:
    """The IR's name of an FX target (docs/graph-schema.md): aten::mm.default, higher_order::flex_attention ..."""
    if isinstance(target, torch._ops.OpOverload):
        overload = target._overloadname or "default"
        return f"{target._schema.name}.{overload}"
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"higher_order::{target.name()}"
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__name__", None) or repr(target)
    if module in ("_operator", "operator"):
        return f"operator::{name}"
    if module == "math":
        return f"math::{name}"
    if module.startswith("torch") and name.startswith("sym_"):
        return f"torch::{name}"
    if module == "torch" and name == "_sym_sqrt":  # math.sqrt of a SymInt (flex's default scale, dynamic head dim)
        return "torch::sym_sqrt"
    return f"python::{module}.{name}"


def draws_random(target: Any, node: torch.fx.Node) -> bool:
    """Whether a nondeterministic_seeded op draws in this call: SDPA kernels carry the tag for their
    dropout, but with a constant dropout_p of 0 they draw nothing (and may be sliced, removed or placed)."""
    for i, arg in enumerate(target._schema.arguments):
        if arg.name == "dropout_p":
            value = node.args[i] if i < len(node.args) else node.kwargs.get("dropout_p", arg.default_value)
            return not (isinstance(value, (int, float)) and not isinstance(value, bool) and value == 0)
    return True


def _effects(target: Any, node: torch.fx.Node) -> dict:
    if not isinstance(target, torch._ops.OpOverload):
        return {}
    schema = target._schema
    out = {}
    if schema.is_mutable:
        out["mutates"] = True
    if any(r.alias_info is not None and not r.alias_info.is_write for r in schema.returns):
        out["is_view"] = True
    if torch.Tag.nondeterministic_seeded in target.tags and draws_random(target, node):
        out["random"] = True
    return out


def _dim(d: Any) -> Any:
    if isinstance(d, int):
        return d
    if isinstance(d, torch.SymInt):
        expr = d.node.expr
        return int(expr) if getattr(expr, "is_number", False) else str(expr)
    return int(d)


def _val(v: Any) -> Any:
    if isinstance(v, torch.Tensor):
        try:
            stride = [_dim(s) for s in v.stride()]
        except RuntimeError:  # sparse / nested tensors have no strides
            stride = [0] * v.dim()
        return {"tensor": {"shape": [_dim(s) for s in v.shape], "stride": stride,
                           "dtype": str(v.dtype).removeprefix("torch."), "device": str(v.device),
                           "requires_grad": bool(v.requires_grad)}}
    if isinstance(v, (tuple, list)):
        return {"tuple": [_val(x) for x in v]}
    if isinstance(v, bool):
        return {"bool": v}
    if isinstance(v, int):
        return {"int": v}
    if isinstance(v, torch.SymInt):
        d = _dim(v)
        return {"int": d} if isinstance(d, int) else {"symint": d}
    if isinstance(v, (float, torch.SymFloat)):
        return {"float": None}
    if isinstance(v, torch.SymBool):
        return {"bool": None}
    if v is None:
        return {"none": None}
    return {"opaque": type(v).__name__}


def _float(x: float) -> Any:
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return x


_SOURCE_RE = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def _source(node: torch.fx.Node) -> str:
    trace = node.meta.get("stack_trace") or ""
    frames = _SOURCE_RE.findall(trace)
    if not frames:
        return ""
    path, line, fn = frames[-1]
    return f"{path}:{line} in {fn}"


class _Serializer:
    def __init__(self) -> None:
        self.constants: List[torch.Tensor] = []
        self._constant_index: dict = {}

    def graph(self, gm: torch.fx.GraphModule, name: str) -> dict:
        nodes, subgraphs = [], {}
        for node in gm.graph.nodes:
            if node.op == "get_attr":
                attr = _fetch_attr(gm, node.target)
                if isinstance(attr, torch.fx.GraphModule):
                    subgraphs[node.target] = self.graph(attr, node.target)
                    continue
                if not isinstance(attr, torch.Tensor):
                    raise SerializationError(f"get_attr %{node.name} holds a {type(attr).__name__}, not a tensor or graph")
                nodes.append({"name": node.name, "op": "get_attr", "target": node.target,
                              "constant": self._constant(attr), "val": _val(attr)})
                continue
            if node.op in ("call_module", "call_method"):
                raise SerializationError(f"%{node.name}: {node.op} nodes do not occur in AOT graphs")
            entry: dict = {"name": node.name, "op": node.op}
            if node.op == "call_function":
                entry["target"] = target_name(node.target)
                effects = _effects(node.target, node)
                if effects:
                    entry["effects"] = effects
            elif node.op == "placeholder":
                entry["target"] = str(node.target)
            entry["args"] = [self.arg(a, gm, node) for a in node.args]
            if node.kwargs:
                entry["kwargs"] = {k: self.arg(v, gm, node) for k, v in node.kwargs.items()}
            if node.op != "output":
                entry["val"] = _val(node.meta.get("val", node.meta.get("example_value")))
                if node.meta.get(WANTS_GRAD) and isinstance(entry["val"], dict) and "tensor" in entry["val"]:
                    entry["val"]["tensor"]["requires_grad"] = True
            custom = node.meta.get("custom")
            if custom:
                entry["custom"] = custom
            src = _source(node)
            if src:
                entry["source"] = src
            nodes.append(entry)
        return {"name": name, "nodes": nodes, "subgraphs": subgraphs, "num_constants": 0}

    def _constant(self, t: torch.Tensor) -> int:
        key = id(t)
        if key not in self._constant_index:
            self._constant_index[key] = len(self.constants)
            self.constants.append(t)
        return self._constant_index[key]

    def arg(self, a: Any, gm: torch.fx.GraphModule, node: torch.fx.Node) -> Any:
        if isinstance(a, torch.fx.Node):
            if a.op == "get_attr" and isinstance(_fetch_attr(gm, a.target), torch.fx.GraphModule):
                return {"graph": a.target}
            return {"ref": a.name}
        if a is None:
            return None
        if isinstance(a, bool):
            return {"bool": a}
        if isinstance(a, int):
            return {"int": a}
        if isinstance(a, float):
            return {"float": _float(a)}
        if isinstance(a, str):
            return {"str": a}
        if isinstance(a, list):
            return {"list": [self.arg(x, gm, node) for x in a]}
        if isinstance(a, tuple):
            return {"tuple": [self.arg(x, gm, node) for x in a]}
        if isinstance(a, dict):
            return {"dict": {str(k): self.arg(v, gm, node) for k, v in a.items()}}
        if isinstance(a, torch.dtype):
            return {"dtype": str(a).removeprefix("torch.")}
        if isinstance(a, torch.device):
            return {"device": str(a)}
        if isinstance(a, torch.layout):
            return {"layout": str(a).removeprefix("torch.")}
        if isinstance(a, torch.memory_format):
            return {"memory_format": str(a).removeprefix("torch.")}
        if isinstance(a, (torch.SymInt, torch.SymFloat, torch.SymBool)):
            raise SerializationError(
                f"%{node.name} ({target_name(node.target)}): argument {a} is a symbolic value that is not a graph "
                "node; hintbackend supports symbolic sizes only as graph values. Mark the input static "
                "(torch._dynamo.mark_static) or compile with dynamic=False.")
        if isinstance(a, torch.Tensor):
            raise SerializationError(f"%{node.name}: a tensor literal in the arguments (should have been lifted)")
        raise SerializationError(f"%{node.name} ({target_name(node.target)}): cannot serialize argument of type "
                                 f"{type(a).__name__}: {a!r}")


def _fetch_attr(gm: torch.nn.Module, target: str) -> Any:
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def _set_num_constants(g: dict, n: int) -> None:
    g["num_constants"] = n
    for sub in g["subgraphs"].values():
        _set_num_constants(sub, n)


def input_aliases(gm: torch.fx.GraphModule) -> Set[str]:
    """Names of the graph's placeholders and of the values that are views of them (through ops whose
    schema returns an alias). In an AOT forward, a saved value with such a name shares storage with a
    parameter or a user input: freeing it in the backward frees nothing."""
    names: Set[str] = set()
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            names.add(node.name)
        elif node.op == "call_function" and _effects(node.target, node).get("is_view"):
            first = node.args[0] if node.args else None
            if isinstance(first, torch.fx.Node) and first.name in names:
                names.add(node.name)
    return names


def serialize(gm: torch.fx.GraphModule, name: str, inputs_owned: bool = False,
              inputs_kept: Iterable[str] = ()) -> Tuple[dict, List[torch.Tensor]]:
    """Returns (document, constants). Constants are shared by the graph and its subgraphs.

    `inputs_owned`: the caller hands the graph its inputs (an AOT backward: AOTAutograd clears the saved
    tensors and passes them boxed), so each is freed after its last use; the memory passes simulate so.
    `inputs_kept`: placeholder names the caller holds all the same (saved parameters and views of them,
    tangents); names that are not placeholders of this graph are ignored."""
    s = _Serializer()
    graph = s.graph(gm, name)
    if inputs_owned:
        graph["inputs_owned"] = True
        placeholders = {n.name for n in gm.graph.nodes if n.op == "placeholder"}
        kept = sorted(placeholders & set(inputs_kept))
        if kept:
            graph["inputs_kept"] = kept
    _set_num_constants(graph, len(s.constants))
    doc = {"format": SCHEMA_FORMAT, "version": SCHEMA_VERSION, "torch_version": torch.__version__, "graph": graph}
    return doc, s.constants
