"""Every hinted_context validation error, with its message: in eager, under torch.compile, and for
the functional form. Plus memory_budget parsing and the too-old-torch error."""

import re

import pytest
import torch

import hintbackend.hoo as hoo

from importlib import import_module

HintError = hoo.HintError
hinted_context = hoo.hinted_context
impl = import_module(hoo.__name__ + ".hinted_context")

BAD = [
    ({"shedule": "dfs"}, "hinted_context: unknown hint 'shedule' (allowed: schedule, slice_dims, slices, slice_size, "
     "memory_budget, kernel, deterministic)"),
    ({"schedule": "fast"}, "hinted_context: schedule='fast' is not one of \"bfs\", \"dfs\", \"auto\""),
    ({"schedule": None}, "hinted_context: schedule=None is not one of \"bfs\", \"dfs\", \"auto\""),
    ({"kernel": "triton"}, "hinted_context: kernel='triton' is not one of \"auto\", \"cudnn\", \"fused\", \"aten\""),
    ({"slices": 0}, "hinted_context: slices=0 must be an int >= 1"),
    ({"slices": True}, "hinted_context: slices=True must be an int >= 1"),
    ({"slices": 2.0}, "hinted_context: slices=2.0 must be an int >= 1"),
    ({"slice_size": -3}, "hinted_context: slice_size=-3 must be an int >= 1"),
    ({"slice_dims": [0, -1]}, "hinted_context: slice_dims=[0, -1] must be a list of non-negative ints (leading "
     "dimensions, e.g. [0, 1] for batch and heads)"),
    ({"slice_dims": "01"}, "hinted_context: slice_dims='01' must be a list of non-negative ints"),
    ({"slice_dims": [1, 1]}, "hinted_context: slice_dims=[1, 1] names a dimension twice"),
    ({"memory_budget": "lots"}, "hinted_context: memory_budget='lots' is not a size: give an int (bytes) or a string "
     "like \"4GB\", \"512MiB\", \"1.5G\""),
    ({"memory_budget": "4 parsecs"}, "hinted_context: memory_budget='4 parsecs' is not a size"),
    ({"memory_budget": 0}, "hinted_context: memory_budget=0 must be >= 1 byte"),
    ({"memory_budget": "0GB"}, "hinted_context: memory_budget='0GB' must be >= 1 byte"),
    ({"memory_budget": 1.5}, "hinted_context: memory_budget=1.5 is not a size"),
    ({"deterministic": "yes"}, "hinted_context: deterministic='yes' must be True or False"),
    ({"slices": 4, "slice_size": 2}, "hinted_context: give slices or slice_size, not both (got slices=4, slice_size=2)"),
    ({"schedule": "dfs", "memory_budget": "1GB"}, "hinted_context: memory_budget is what schedule=\"auto\" plans "
     "against; it does not go with schedule='dfs' (drop it, or use schedule=\"auto\")"),
]
IDS = [next(iter(h)) + ("+" + list(h)[1] if len(h) > 1 else "") + f"-{i}" for i, (h, _) in enumerate(BAD)]


@pytest.mark.parametrize("hints,message", BAD, ids=IDS)
def test_eager_context_manager(hints, message):
    with pytest.raises(HintError, match="^" + re.escape(message)):
        with hinted_context(**hints):
            pass


@pytest.mark.parametrize("hints,message", BAD, ids=IDS)
def test_eager_decorator_and_functional(hints, message):
    with pytest.raises(HintError, match="^" + re.escape(message)):
        hinted_context(**hints)(torch.sin)
    with pytest.raises(HintError, match="^" + re.escape(message)):
        hinted_context(torch.sin, torch.randn(2), **hints)


@pytest.mark.parametrize("form", ["with", "functional"])
@pytest.mark.parametrize("hints,message", BAD[:3] + BAD[-2:], ids=IDS[:3] + IDS[-2:])
def test_compiled(form, hints, message):
    def f(x):
        if form == "with":
            with hinted_context(**hints):
                return x.sin()
        return hinted_context(torch.sin, x, **hints)

    with pytest.raises(HintError, match="^" + re.escape(message)):
        torch.compile(f, backend="aot_eager")(torch.randn(3))


def test_nested_budget_under_inherited_bfs_schedule():
    msg = ("hinted_context: memory_budget is what schedule=\"auto\" plans against, and this region inherits "
           "schedule='bfs' from its enclosing region (add schedule=\"auto\")")

    def f(x):
        with hinted_context(schedule="bfs"):
            with hinted_context(memory_budget="1GB"):
                return x.sin()

    with pytest.raises(HintError, match="^" + re.escape(msg)):
        torch.compile(f, backend="aot_eager")(torch.randn(3))


def test_not_callable_body_and_decorator_target():
    with pytest.raises(TypeError, match=re.escape("hinted_context: the first positional argument is the body function "
                                                  "of the functional form, got <class 'str'>; hints are keyword arguments")):
        hinted_context("dfs")
    with pytest.raises(TypeError, match=re.escape("hinted_context(...) decorates a function or method, got <class 'int'>")):
        hinted_context(schedule="dfs")(3)


def test_op_argument_checks():
    op = torch.ops.higher_order.hinted_context
    with pytest.raises(TypeError, match=re.escape("hinted_context: hints must be a JSON string, got <class 'dict'>")):
        op(torch.sin, torch.randn(2), hints={"schedule": "dfs"})
    with pytest.raises(TypeError, match=re.escape("hinted_context: the body must be callable, got <class 'int'>")):
        op(3, torch.randn(2), hints="{}")


def test_torch_too_old_fails_at_first_use(monkeypatch):
    monkeypatch.setattr(impl, "_TORCH_PROBLEM", "torch 2.4.0 is too old")
    with pytest.raises(RuntimeError, match=re.escape("hintbackend.hinted_context needs torch >= 2.11 with "
                                                     "torch.fx.traceback.annotate and BaseHOP, but torch 2.4.0 is too old. "
                                                     "Upgrade torch")):
        hinted_context(schedule="dfs")
    monkeypatch.setattr(impl.torch, "__version__", "2.4.0")
    assert impl._torch_problem() == "torch 2.4.0 is too old"


@pytest.mark.parametrize(
    "text,nbytes",
    [(4096, 4096), ("4096", 4096), ("4GB", 4 * 10**9), ("4gb", 4 * 10**9), ("512MiB", 512 * 2**20),
     ("1.5G", int(1.5 * 2**30)), ("2 KiB", 2048), ("100B", 100), ("1TB", 10**12)],
)
def test_memory_budget_parsing(text, nbytes):
    assert hoo.parse_memory_budget(text) == nbytes
    assert hoo.validate_hints({"memory_budget": text}) == {"memory_budget": nbytes}


def test_merge_rules():
    outer = {"region": 1, "path": [1], "schedule": "auto", "memory_budget": 100, "slices": 4, "kernel": "aten"}
    assert hoo.merge_hints(outer, {"slice_size": 2}, 2) == {
        "region": 2, "path": [1, 2], "schedule": "auto", "memory_budget": 100, "slice_size": 2, "kernel": "aten"}
    assert hoo.merge_hints(outer, {"schedule": "dfs"}, 3) == {
        "region": 3, "path": [1, 3], "schedule": "dfs", "slices": 4, "kernel": "aten"}
    assert hoo.merge_hints(None, {}, 7) == {"region": 7, "path": [7]}
    assert hoo.validate_hints({"slice_dims": 0}) == {"slice_dims": [0]}
