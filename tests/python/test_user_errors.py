"""User mistakes and failures at run time, end to end through torch.compile: each gets a clear error
(or warning) that says it comes from hintbackend, names what is wrong and how to fix it, and a compiled
function that failed once keeps working. (Hint validation: test_hinted_validation.py; options and
environment settings: test_backend.py.)"""

import os
import re
import warnings

import pytest
import torch
from torch.nn.attention.flex_attention import flex_attention

from conftest import device
from helpers import randn
from hintbackend.backend import HintBackendHintWarning
from hintbackend.hoo import hinted_context


def compile_hb(fn, **options):
    return torch.compile(fn, backend="hintbackend", options={"strict": True, **options})


# ---- dump_dir -------------------------------------------------------------------------------------


def test_dump_dir_that_cannot_be_written(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    f = compile_hb(lambda x: x.sin(), dump_dir=str(blocker / "dumps"))
    with pytest.raises(Exception) as info:
        f(randn(4))
    message = str(info.value)
    assert f"hintbackend: cannot write graph dumps under dump_dir={str(blocker / 'dumps')!r}" in message, message
    assert "Not a directory" in message and "or unset it to turn dumps off" in message, message


# ---- the decorator form misused -----------------------------------------------------------------------


def test_decorator_without_parentheses():
    with pytest.raises(TypeError, match=re.escape(
            "hinted_context(block) has neither operands nor hints: as a decorator it takes its hints in "
            "parentheses, @hinted_context(schedule='dfs')")):
        @hinted_context
        def block(x):
            return x


def test_decorator_on_a_class():
    with pytest.raises(TypeError, match=re.escape(
            "hinted_context(...) decorates a function or method, got the class Block: decorate its forward method")):
        @hinted_context(schedule="dfs")
        class Block(torch.nn.Module):
            pass


# ---- hints the backend cannot honor ---------------------------------------------------------------------


def test_dfs_region_with_nothing_to_slice_warns_naming_the_region():
    def f(x):
        with hinted_context(schedule="dfs"):
            return x.sin() * 2  # 2-d: no batch and heads dims to slice

    with pytest.warns(HintBackendHintWarning) as record:
        out = compile_hb(f)(x := randn(4, 8))
    torch.testing.assert_close(out, x.sin() * 2)
    message = str(record[0].message)
    assert message.startswith("hintbackend: graph 'inference_"), message
    assert re.search(r": region \d+ \(%sin \(aten::sin.default\) at .*test_user_errors.py:\d+ in f", message), message
    assert "schedule='dfs' but nothing can be sliced: its tensors have no slice dims of size > 1" in message, message


def test_dfs_region_that_slices_does_not_warn():
    def f(x):
        with hinted_context(schedule="dfs", slice_dims=[0], slices=2):
            return x.sin() * 2

    with warnings.catch_warnings():
        warnings.simplefilter("error", HintBackendHintWarning)
        x = randn(4, 8)
        torch.testing.assert_close(compile_hb(f)(x), x.sin() * 2)


def test_memory_budget_nothing_fits_names_the_minimum():
    def f(x):
        with hinted_context(schedule="auto", slice_dims=[0], memory_budget=16):
            return (x.sin() * 2).cos()

    with pytest.raises(Exception) as info:
        compile_hb(f)(randn(8, 64))
    message = str(info.value)
    assert re.search(r"memory_budget=16 bytes \(16 bytes\)", message), message
    assert re.search(r"a memory_budget of at least \d+ bytes", message) and "Raise memory_budget" in message, message


@pytest.mark.skipif(device() == "cuda", reason="the CPU has no cuDNN: the point of this test")
def test_kernel_cudnn_where_it_cannot_run_is_an_error_naming_the_node():
    def f(q, k, v):
        with hinted_context(kernel="cudnn"):
            return flex_attention(q, k, v)

    q, k, v = (randn(1, 2, 16, 16) for _ in range(3))
    with pytest.raises(Exception) as info:
        compile_hb(f)(q, k, v)
    message = str(info.value)
    assert "flex_attention" in message and 'kernel="cudnn" was asked for (hinted_context)' in message, message
    assert 'Drop kernel="cudnn"' in message, message


# ---- failures inside a compiled call -----------------------------------------------------------------


def _divide_in_slices(x, a, b):
    with hinted_context(schedule="dfs", slice_dims=[0], slices=4):
        y = x.sin() * 2 + a // b
    return y.sum()


@pytest.mark.skipif(device() == "cuda", reason="integer division by zero raises on the CPU only")
def test_aten_error_in_a_slice_loop_names_node_and_slice_and_the_next_call_works():
    x, a = randn(4, 8), torch.randint(1, 9, (4, 8))
    b = torch.randint(1, 5, (4, 8))
    f = compile_hb(_divide_in_slices)
    torch.testing.assert_close(f(x, a, b), _divide_in_slices(x, a, b))
    zero_in_row_3 = b.clone()
    zero_in_row_3[3, 5] = 0
    with pytest.raises(RuntimeError) as info:  # ATen's own error type and message, with our lines added
        f(x, a, zero_in_row_3)
    message = str(info.value)
    assert message.startswith("ZeroDivisionError"), message
    assert "hintbackend: while running %floor_divide (aten::floor_divide.default)" in message, message
    assert "hintbackend: in slice 3 of 4" in message and "hintbackend: while running %slice_loop_" in message, message
    # Nothing poisoned: the same compiled code runs again, with no recompile, and matches eager.
    x2, a2, b2 = randn(4, 8), torch.randint(1, 9, (4, 8)), torch.randint(1, 5, (4, 8))
    torch.testing.assert_close(f(x2, a2, b2), _divide_in_slices(x2, a2, b2))


_FLAKY = {"calls": 0, "fail_at": -1}


@torch.library.custom_op("hbtest::flaky", mutates_args=())
def flaky(x: torch.Tensor) -> torch.Tensor:
    _FLAKY["calls"] += 1
    if _FLAKY["calls"] == _FLAKY["fail_at"]:
        raise KeyError("injected failure")
    return x * 2


@flaky.register_fake
def _(x):
    return torch.empty_like(x)


def test_python_kernel_error_keeps_its_type_and_gets_the_node_as_a_note():
    def f(x):
        return flaky(x.sin()).cos()

    c = compile_hb(f)
    x = randn(16, 16)
    torch.testing.assert_close(c(x), f(x))
    before = torch.cuda.memory_allocated() if device() == "cuda" else 0
    _FLAKY["fail_at"] = _FLAKY["calls"] + 1
    try:
        c(x)
        pytest.fail("the injected failure did not surface")
    except KeyError as e:  # (its traceback, which holds the failed call's tensors, dies with `e`)
        assert "injected failure" in str(e)
        notes = getattr(e, "__notes__", [])
    assert any(n.startswith("hintbackend: raised while running %flaky (hbtest::flaky.default)") for n in notes), notes
    if device() == "cuda":  # the failed call's arena and intermediates went back to the allocator
        assert torch.cuda.memory_allocated() == before
    torch.testing.assert_close(c(x), f(x))
    # The site was taken with the error: a later, unrelated failure is not blamed on this node.
    import hintbackend
    assert hintbackend._core().take_failure_site() == ""
