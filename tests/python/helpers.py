"""Shared checks: compile with hintbackend (strict, verifying after every pass) and compare outputs and
every gradient with eager on fresh random inputs."""

from __future__ import annotations

import copy
from typing import Any, Callable, Sequence

import torch
import torch.utils._pytree as pytree

from conftest import device

STRICT = {"strict": True, "verify_each_pass": True}


def tolerances(dtype: torch.dtype) -> dict:
    return {torch.float32: dict(rtol=1e-4, atol=1e-5), torch.float64: dict(rtol=1e-10, atol=1e-12),
            torch.bfloat16: dict(rtol=2e-2, atol=2e-2), torch.float16: dict(rtol=5e-3, atol=5e-3)}[dtype]


def assert_close_tree(got: Any, want: Any, what: str, **tol) -> None:
    g_leaves, g_spec = pytree.tree_flatten(got)
    w_leaves, w_spec = pytree.tree_flatten(want)
    assert g_spec == w_spec, f"{what}: structure differs: {g_spec} vs {w_spec}"
    for i, (g, w) in enumerate(zip(g_leaves, w_leaves)):
        if isinstance(w, torch.Tensor):
            assert isinstance(g, torch.Tensor), f"{what}[{i}]: expected a tensor, got {type(g)}"
            t = tol or tolerances(w.dtype if w.is_floating_point() else torch.float32)
            torch.testing.assert_close(g, w, **t, msg=lambda m: f"{what}[{i}]: {m}")
        else:
            assert g == w, f"{what}[{i}]: {g!r} != {w!r}"


def check_model(model: torch.nn.Module | Callable, inputs: Sequence[Any], *, train: bool = True,
                options: dict | None = None, dynamic: bool | None = None, reference: str = "eager", **tol) -> Any:
    """Runs model eagerly and compiled with hintbackend on copies of the same inputs and parameters;
    compares outputs, input gradients and parameter gradients (and buffers, e.g. BatchNorm stats).

    reference="aot_eager" compiles the reference with torch's aot_eager backend instead: needed where
    eager cannot run the model (FlexAttention's higher-order op called directly on CPU sees no
    gradient of captured buffers in eager; under torch.compile it runs PyTorch's math reference)."""
    eager_model = model
    compiled_model = copy.deepcopy(model) if isinstance(model, torch.nn.Module) else model
    if reference == "aot_eager":
        eager_model = torch.compile(eager_model, backend="aot_eager", dynamic=dynamic)

    def prep(xs):
        out = []
        for x in xs:
            if isinstance(x, torch.Tensor):
                x = x.detach().clone()
                if train and x.is_floating_point():
                    x.requires_grad_(True)
            out.append(x)
        return out

    xs_e, xs_c = prep(inputs), prep(inputs)
    compiled = torch.compile(compiled_model, backend="hintbackend", options={**STRICT, **(options or {})},
                             dynamic=dynamic)
    want = eager_model(*xs_e)
    got = compiled(*xs_c)
    assert_close_tree(got, want, "output", **tol)
    if train:
        seed = torch.Generator().manual_seed(1)
        leaves = [w for w in pytree.tree_leaves(want) if isinstance(w, torch.Tensor) and w.requires_grad]
        assert leaves, "a training check needs an output that requires grad"
        cots = [torch.randn(w.shape, generator=seed, dtype=w.dtype).to(w.device) for w in leaves]
        torch.autograd.backward(leaves, cots)
        g_leaves = [g for g in pytree.tree_leaves(got) if isinstance(g, torch.Tensor) and g.requires_grad]
        torch.autograd.backward(g_leaves, cots)
        for i, (a, b) in enumerate(zip(xs_c, xs_e)):
            if isinstance(b, torch.Tensor) and b.grad is not None:
                assert a.grad is not None, f"input {i}: compiled run produced no gradient"
                assert_close_tree(a.grad, b.grad, f"grad of input {i}", **tol)
        if isinstance(model, torch.nn.Module):
            for (name, pe), pc in zip(model.named_parameters(), compiled_model.parameters()):
                if pe.grad is None:
                    assert pc.grad is None, f"grad of {name}: compiled has one, eager none"
                    continue
                assert pc.grad is not None, f"grad of {name}: missing in the compiled run"
                assert_close_tree(pc.grad, pe.grad, f"grad of {name}", **tol)
    if isinstance(model, torch.nn.Module):
        for (name, be), bc in zip(model.named_buffers(), compiled_model.buffers()):
            assert_close_tree(bc, be, f"buffer {name}", **tol)
    return got


def randn(*shape, dtype=torch.float32) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype, device=device())


def graph_dirs(dump_dir) -> list:
    """The per-graph folders of a dump folder (not its index.html), sorted."""
    import os

    return sorted(d for d in os.listdir(dump_dir) if os.path.isdir(os.path.join(dump_dir, d)))
