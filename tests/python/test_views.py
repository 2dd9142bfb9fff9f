"""Views made without the dispatcher (KernelKind::View, backend/runtime/ViewCall.cpp; option fast_views):
a model whose graphs are full of views (transpose, slices and selects at constant positions, expand,
unsqueeze, detach) gives eager's results and gradients with the option on and off, the kernels dump says
which views skip the dispatcher, and an in-place write through such a view reaches its base."""

from __future__ import annotations

import os

import torch

from conftest import device
from helpers import STRICT, check_model, randn


class Heads(torch.nn.Module):
    """Attention-like reshapes: heads split and merged, a rotary-style half swap, a select and an expand."""

    def __init__(self) -> None:
        super().__init__()
        self.proj = torch.nn.Linear(32, 96)
        self.out = torch.nn.Linear(32, 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, _ = x.shape
        q, k, v = self.proj(x).view(b, s, 3, 4, 8).permute(2, 0, 3, 1, 4).unbind(0)
        q = torch.cat([-q[..., 4:], q[..., :4]], -1)
        w = (q @ k.transpose(-1, -2)).softmax(-1)
        y = (w @ v).transpose(1, 2).reshape(b, s, 32)
        first = x[:, 0].unsqueeze(1).expand(b, s, 32)
        return self.out(y) + first * x.detach().sigmoid()


def kernels_text(dump: str) -> str:
    text = ""
    for d in sorted(os.listdir(dump)):
        path = os.path.join(dump, d, "kernels.txt")
        if os.path.exists(path):
            text += open(path).read()
    return text


def test_views_match_eager_with_the_option_on_and_off(tmp_path):
    for fast in (True, False):
        torch.manual_seed(0)
        dump = str(tmp_path / f"fast_{fast}")
        check_model(Heads().to(device()), [randn(2, 6, 32)], options={**STRICT, "fast_views": fast, "dump_dir": dump})
        kernels = kernels_text(dump)
        # forward and backward both hold views read inside the graph (the transposes, q's halves)
        made = [line for line in kernels.splitlines() if ": view aten::" in line]
        assert bool(made) == fast, kernels
        if fast:
            assert any("aten::transpose.int" in line or "aten::t.default" in line for line in made), made
            assert any("aten::slice.Tensor" in line for line in made), made


def test_a_write_through_a_view_reaches_the_buffer(tmp_path):
    """`cache[:, 1] = k` on a buffer: the functional copy into the select becomes copy_ into the buffer's
    own view (write-inputs-in-place), here a view made without the dispatcher; the buffer gets the value
    and its version moves, as in eager."""

    class Step(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.register_buffer("cache", torch.zeros(2, 4, 8))

        def forward(self, k: torch.Tensor) -> torch.Tensor:
            self.cache[:, 1] = k
            return self.cache.sum(1)

    torch.manual_seed(0)
    eager, compiled = Step().to(device()), Step().to(device())
    f = torch.compile(compiled, backend="hintbackend", options={**STRICT, "dump_dir": str(tmp_path)})
    k = randn(2, 8)
    with torch.no_grad():
        want = eager(k)
        version = compiled.cache._version
        got = f(k)
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(compiled.cache, eager.cache)
    assert compiled.cache._version > version
    kernels = kernels_text(str(tmp_path))
    assert "view aten::select.int" in kernels and "aten::copy_.default" in kernels, kernels
