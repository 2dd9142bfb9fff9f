"""The backend's contract with torch.compile: registration by entry point, options validation,
fallback and strict mode for unsupported ops, dumps, logging, and graph-document errors."""

import json
import logging
import os
import re
import subprocess
import sys
import warnings

import pytest
import torch

import hintbackend
from conftest import device
from helpers import randn, graph_dirs
from hintbackend.backend import HintBackendFallbackWarning, UnsupportedGraphError


def test_entry_point_without_import():
    """torch.compile finds "hintbackend" in a fresh interpreter that never imported the package."""
    code = ("import sys, torch, torch._dynamo\n"
            "assert 'hintbackend' in torch._dynamo.list_backends(), torch._dynamo.list_backends()\n"
            "f = torch.compile(lambda x: torch.sin(x) * 2, backend='hintbackend')\n"
            "x = torch.randn(8)\n"
            "assert torch.allclose(f(x), torch.sin(x) * 2)\n"
            "assert 'hintbackend' in sys.modules\n"
            "print('ok')\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-2000:]


@pytest.mark.parametrize("options, message", [
    ({"strictt": True}, "unknown option 'strictt'; valid options are arena, cache_dir, compile_cache, cuda_graphs, "
                        "cutlass_include, disable_passes, dump_dir, fast_views, host_compiler, lean_runtime, memory_plan_in_place, "
                        "memory_plan_strategy, nvcc, partition, strict, verify_each_pass"),
    ({"nvcc": 1}, "option 'nvcc' must be the nvcc command, \"\" (off) or None, got 1"),
    ({"host_compiler": 1}, "option 'host_compiler' must be a compiler command (\"c++\"), \"\" (off) or None, got 1"),
    ({"partition": "greedy"}, "option 'partition' must be one of \"default\", \"min-cut\", got 'greedy'"),
    ({"memory_plan_strategy": "first-fit"}, "option 'memory_plan_strategy' must be one of \"\", \"greedy-by-size\", "
                                            "\"best-fit\", got 'first-fit'"),
    ({"arena": 1}, "option 'arena' must be a bool, got 1"),
    ({"strict": "yes"}, "option 'strict' must be a bool, got 'yes'"),
    ({"disable_passes": ["no-such-pass"]}, "cannot disable unknown pass 'no-such-pass'; the passes are dead-code-elimination"),
    ({"dump_dir": 3}, "option 'dump_dir' must be a path string or None, got 3"),
])
def test_options_are_validated(options, message):
    f = torch.compile(lambda x: x + 1, backend="hintbackend", options=options)
    with pytest.raises(Exception) as info:
        f(randn(3))
    assert message in str(info.value)


# A custom op that mutates its input: AOT functionalizes it into auto_functionalized, a higher-order
# op hintbackend has no implementation for.
@torch.library.custom_op("hbtest::scale_", mutates_args=("x",))
def scale_(x: torch.Tensor, s: float) -> None:
    x.mul_(s)


@scale_.register_fake
def _(x, s):
    return None


def model_with_unsupported_op(x):
    y = x.sin()
    scale_(y, 3.0)
    return y.cos()


def test_unsupported_op_falls_back_with_one_warning():
    x = randn(5)
    f = torch.compile(model_with_unsupported_op, backend="hintbackend")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = f(x)
    ours = [w for w in caught if issubclass(w.category, HintBackendFallbackWarning)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    assert "auto_functionalized" in str(ours[0].message)
    torch.testing.assert_close(got, (x.sin() * 3.0).cos())


def test_unsupported_op_strict_raises_naming_it():
    f = torch.compile(model_with_unsupported_op, backend="hintbackend", options={"strict": True})
    with pytest.raises(Exception) as info:
        f(randn(5))
    assert isinstance(info.value, UnsupportedGraphError) or "UnsupportedGraphError" in repr(info.value)
    assert "auto_functionalized" in str(info.value) and "strict" in str(info.value)


def test_dumps_every_stage(tmp_path):
    f = torch.compile(lambda x, w: torch.relu(x @ w).sum(), backend="hintbackend", options={"dump_dir": str(tmp_path)})
    x, w = randn(4, 3), randn(3, 2).requires_grad_(True)
    f(x, w).backward()
    graphs = graph_dirs(tmp_path)
    assert any(g.startswith("forward_") for g in graphs) and any(g.startswith("backward_") for g in graphs), graphs
    fwd = tmp_path / next(g for g in graphs if g.startswith("forward_"))
    names = set(os.listdir(fwd))
    assert {"fx_graph.txt", "graph.json", "ir-import.txt", "ir-final.txt", "kernels.txt"} <= names, names
    assert any(n.startswith("ir-after-1-dead-code-elimination") for n in names), names
    doc = json.loads((fwd / "graph.json").read_text())
    assert doc["format"] == "hintbackend.graph" and doc["version"] == 1
    ir = (fwd / "ir-final.txt").read_text()
    assert "aten::mm.default" in ir and "aten::relu.default" in ir
    assert "aten-dispatch aten::mm.default" in (fwd / "kernels.txt").read_text()
    plan = (fwd / "memory-plan.txt").read_text()
    assert plan.startswith("memory-plan graph") and "for target runtime" in plan and "%mm" in plan, plan
    # The placement table the runtime planned with: hb-opt --placement=placement.txt replays it.
    table = (fwd / "placement.txt").read_text()
    assert "aten::mm.default cpu: ok" in table or "aten::mm.default cuda:0: ok" in table, table


def test_backward_document_says_which_inputs_the_caller_keeps(tmp_path):
    """The backward owns its saved activations but not the saved weight view (the module holds the
    weight) nor the tangent (AOTAutograd's backward frame holds it): the document lists those two."""
    lin = torch.nn.Linear(8, 16).to(device())
    f = torch.compile(lambda x: torch.tanh(lin(x)).relu(), backend="hintbackend",
                      options={"dump_dir": str(tmp_path), "partition": "default"})  # saves tanh's output
    f(randn(4, 8).requires_grad_(True)).sum().backward()
    bwd = tmp_path / next(g for g in graph_dirs(tmp_path) if g.startswith("backward_"))
    graph = json.loads((bwd / "graph.json").read_text())["graph"]
    placeholders = [n["name"] for n in graph["nodes"] if n["op"] == "placeholder"]
    assert graph["inputs_owned"] is True
    kept = set(graph["inputs_kept"])
    assert {p for p in placeholders if p.startswith("tangents_")} <= kept, (kept, placeholders)
    assert any(p.startswith("primals_") for p in kept), (kept, placeholders)  # the input x, kept by the caller
    fx_text = (bwd / "fx_graph.txt").read_text()
    weight_views = [p for p in placeholders if p.startswith(("t", "permute")) and not p.startswith("tangents_")]
    assert weight_views and set(weight_views) <= kept, (weight_views, kept, fx_text)  # W^T for dx: the module's
    activations = [p for p in placeholders if p.startswith("detach")]
    assert activations and not set(activations) & kept, (activations, kept)  # saved tanh: freed after its last use
    fwd = tmp_path / next(g for g in graph_dirs(tmp_path) if g.startswith("forward_"))
    assert "inputs_owned" not in json.loads((fwd / "graph.json").read_text())["graph"]
    header = (bwd / "ir-import.txt").read_text().splitlines()[0]
    assert header.startswith(f"graph {graph['name']} (inputs owned except %"), header


def test_dump_dir_from_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("HINTBACKEND_DUMP_DIR", str(tmp_path))
    torch.compile(lambda x: x.exp(), backend="hintbackend")(randn(3))
    assert graph_dirs(tmp_path), "HINTBACKEND_DUMP_DIR must produce a dump"


def test_disabled_pass_is_reported(tmp_path):
    f = torch.compile(lambda x: (x * 2).sum(), backend="hintbackend",
                      options={"dump_dir": str(tmp_path), "disable_passes": ["dead-code-elimination"]})
    f(randn(3))
    notes = (tmp_path / graph_dirs(tmp_path)[0] / "notes.txt").read_text()
    assert "dead-code-elimination: disabled" in notes


def test_logging_under_hintbackend_name(caplog):
    with caplog.at_level(logging.DEBUG, logger="hintbackend"):
        torch.compile(lambda x: x.tanh(), backend="hintbackend")(randn(3))
    assert any(r.name == "hintbackend" and "compiled" in r.getMessage() for r in caplog.records)


def test_graph_document_errors_name_the_node():
    """A hand-written bad document reaches the C++ verifier and comes back as a Python error."""
    doc = {"format": "hintbackend.graph", "version": 1, "graph": {"name": "g", "nodes": [
        {"name": "x", "op": "placeholder", "target": "x"},
        {"name": "r", "op": "call_function", "target": "aten::relu.default", "args": [{"ref": "ghost"}]},
        {"name": "output", "op": "output", "args": [{"tuple": [{"ref": "r"}]}]}]}}
    with pytest.raises(ValueError, match=r"node 1 \('r'\): dangling reference to 'ghost'"):
        hintbackend._core().CompiledGraph(json.dumps(doc), [], _settings())
    doc["version"] = 7
    with pytest.raises(ValueError, match="schema version 7 is not supported"):
        hintbackend._core().CompiledGraph(json.dumps(doc), [], _settings())


def _settings():
    from hintbackend.options import parse_options
    return parse_options({}).core_settings()


def test_runtime_error_names_the_node():
    doc = {"format": "hintbackend.graph", "version": 1, "graph": {"name": "g", "nodes": [
        {"name": "a", "op": "placeholder", "target": "a"}, {"name": "b", "op": "placeholder", "target": "b"},
        {"name": "mm", "op": "call_function", "target": "aten::mm.default", "args": [{"ref": "a"}, {"ref": "b"}],
         "source": "model.py:9 in forward"},
        {"name": "output", "op": "output", "args": [{"tuple": [{"ref": "mm"}]}]}]}}
    g = hintbackend._core().CompiledGraph(json.dumps(doc), [], _settings())
    with pytest.raises(RuntimeError, match=r"%mm \(aten::mm.default\) at model.py:9 in forward"):
        g.run([torch.randn(2, 3), torch.randn(4, 5)])
    with pytest.raises(ValueError, match="takes 2 inputs, got 1"):
        g.run([torch.randn(2, 3)])


def test_a_graph_without_cudnn_reports_no_kernel_workspace():
    """kernel_workspace_bytes is the last run's largest workspace a kernel allocated for itself (cuDNN's
    SDPA, test_flex_cudnn.py checks it against the plan's model): none here, before or after a run."""
    doc = {"format": "hintbackend.graph", "version": 1, "graph": {"name": "g", "nodes": [
        {"name": "a", "op": "placeholder", "target": "a"}, {"name": "b", "op": "placeholder", "target": "b"},
        {"name": "mm", "op": "call_function", "target": "aten::mm.default", "args": [{"ref": "a"}, {"ref": "b"}]},
        {"name": "output", "op": "output", "args": [{"tuple": [{"ref": "mm"}]}]}]}}
    g = hintbackend._core().CompiledGraph(json.dumps(doc), [], _settings())
    assert g.kernel_workspace_bytes == 0 and g.cudnn_workspace_model == []
    g.run([torch.randn(2, 3), torch.randn(3, 4)])
    assert g.kernel_workspace_bytes == 0


def test_outside_torch_compile_nothing_changes():
    assert hintbackend.__version__
    assert callable(hintbackend.hintbackend)


@pytest.mark.parametrize("name, value, message", [
    ("HINTBACKEND_ARENA", "off", "HINTBACKEND_ARENA='off' must be 0 or 1"),
    ("HINTBACKEND_MEMORY_PLAN_IN_PLACE", "no", "HINTBACKEND_MEMORY_PLAN_IN_PLACE='no' must be 0 or 1"),
    ("HINTBACKEND_MEMORY_PLAN_STRATEGY", "first-fit", "HINTBACKEND_MEMORY_PLAN_STRATEGY='first-fit' must be one of"),
])
def test_environment_settings_are_validated(monkeypatch, name, value, message):
    """Settings are read once, in options.py, and a bad value is an error naming the variable."""
    from hintbackend.options import parse_options
    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=re.escape(message)):
        parse_options({})


def test_settings_reach_the_core_as_values(monkeypatch):
    """The environment fills what options leave unset; options win; the core gets the values."""
    from hintbackend.options import parse_options
    monkeypatch.setenv("HINTBACKEND_ARENA", "0")
    monkeypatch.setenv("HINTBACKEND_MEMORY_PLAN_STRATEGY", "best-fit")
    s = parse_options({}).core_settings()
    assert (s.arena, s.memory_plan_strategy, s.memory_plan_in_place, s.dump) == (False, "best-fit", True, False)
    s = parse_options({"arena": True, "memory_plan_strategy": "greedy-by-size", "dump_dir": "/tmp/x"}).core_settings()
    assert (s.arena, s.memory_plan_strategy, s.dump) == (True, "greedy-by-size", True)


def test_no_dump_prints_no_ir():
    """Without dump_dir the core prints nothing: the dumps are empty (they cost nothing when off)."""
    from hintbackend.options import parse_options
    doc = {"format": "hintbackend.graph", "version": 1, "graph": {"name": "g", "nodes": [
        {"name": "a", "op": "placeholder", "target": "a"},
        {"name": "r", "op": "call_function", "target": "aten::relu.default", "args": [{"ref": "a"}]},
        {"name": "output", "op": "output", "args": [{"tuple": [{"ref": "r"}]}]}]}}
    off = hintbackend._core().CompiledGraph(json.dumps(doc), [], parse_options({}).core_settings())
    assert off.dumps == []
    on = hintbackend._core().CompiledGraph(json.dumps(doc), [], parse_options({"dump_dir": "/tmp/unused"}).core_settings())
    names = [n for n, _ in on.dumps]
    assert names[0] == "ir-import" and "ir-final" in names and "memory-plan" in names and "placement" in names, names
    x = torch.randn(5)
    assert torch.equal(off.run([x.clone()])[0], torch.relu(x))


def test_compiled_graphs_lists_what_a_step_compiled():
    """hintbackend.backend.compiled_graphs(): the C++ graphs compiled inside the block, by name, in order
    (what benchmarks and tests read after a torch.compile'd step); nothing after the block."""
    from hintbackend.backend import compiled_graphs

    torch._dynamo.reset()
    w = torch.randn(4, 4, requires_grad=True)
    f = torch.compile(lambda x: (x @ w).tanh().sum(), backend="hintbackend")
    with compiled_graphs() as graphs:
        f(torch.randn(3, 4)).backward()
    assert [name.split("_")[0] for name, _ in graphs] == ["forward", "backward"], graphs
    assert all("aten::" in g.kernels for _, g in graphs)
    torch._dynamo.reset()
    torch.compile(lambda x: x.sin(), backend="hintbackend")(torch.randn(2))
    assert len(graphs) == 2


def test_nodes_that_read_only_constants_run_once():
    """flex_attention without a block_mask builds its default BlockMask from constants in the traced graph
    (arange, sort, ...): the call-invariance analysis names those nodes, which run on the first call only;
    every call still matches eager, and with the analysis disabled nothing runs once."""
    from torch.nn.attention.flex_attention import flex_attention

    from hintbackend.backend import compiled_graphs

    def attend(q, k, v):
        return flex_attention(q, k, v)

    for disable in ([], ["call-invariance"]):
        torch._dynamo.reset()
        fn = torch.compile(attend, backend="hintbackend", options={"disable_passes": disable})
        with compiled_graphs() as graphs:
            for _ in range(3):
                q, k, v = (torch.randn(1, 2, 128, 16) for _ in range(3))
                torch.testing.assert_close(fn(q, k, v), attend(q, k, v), atol=1e-5, rtol=1e-4)
        notes = "\n".join(n for _, g in graphs for n in g.notes)
        if disable:
            assert "run once" not in notes and "call-invariance: disabled" in notes, notes
        else:
            assert re.search(r"call-invariance graph \S+: \d+ nodes run once \(%", notes), notes


def test_forward_inputs_that_get_a_gradient_are_marked(tmp_path):
    """AOT traces the forward graph's inputs without requires_grad; partition.py marks those the backward
    computes a gradient for (serialize.py's WANTS_GRAD, written as requires_grad), which a forward node's
    kernel selection may read (codegen/KernelSelect.cpp, a FlexAttention table that gets a gradient)."""
    w = randn(8, 8).requires_grad_(True)
    c = randn(4, 8)  # no gradient

    def f(x):
        return (x @ w + c).square().sum()

    torch._dynamo.reset()
    torch.compile(f, backend="hintbackend", options={"dump_dir": str(tmp_path)})(randn(4, 8)).backward()
    forward = [d for d in graph_dirs(tmp_path) if d.startswith("forward")]
    assert len(forward) == 1, graph_dirs(tmp_path)
    nodes = json.load(open(os.path.join(tmp_path, forward[0], "graph.json")))["graph"]["nodes"]
    inputs = {n["name"]: n["val"]["tensor"]["requires_grad"] for n in nodes if n["op"] == "placeholder"}
    assert len(inputs) == 3 and sum(inputs.values()) == 1, inputs
