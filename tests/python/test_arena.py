"""The runtime's arena (one allocation per call; placed intermediates are views into it), end to end on
the test device (HINTBACKEND_TEST_DEVICE=cuda on the GPU machine): outputs and gradients equal those with
HINTBACKEND_ARENA=0 (to the suite's float32 tolerance: a misplaced buffer is off by far more), the dump says
what was placed and where, and a call's outputs survive the next call."""

from __future__ import annotations

import pathlib

import torch

from conftest import device
from helpers import tolerances


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 96), torch.nn.GELU(), torch.nn.Linear(96, 96), torch.nn.Tanh(),
                               torch.nn.Linear(96, 96), torch.nn.SiLU(), torch.nn.Linear(96, 16)).to(device())


def _step(arena: str, monkeypatch, dump_dir: pathlib.Path):
    monkeypatch.setenv("HINTBACKEND_ARENA", arena)  # read once per compile (options.py)
    torch._dynamo.reset()
    m = _mlp()
    f = torch.compile(m, backend="hintbackend", options={"strict": True, "dump_dir": str(dump_dir)})
    x = torch.randn(64, 32, device=device())
    y = f(x)
    y.square().mean().backward()
    with torch.no_grad():
        z = f(x * 2)
    return [y.detach(), z] + [p.grad for p in m.parameters()]


def _same(a: torch.Tensor, b: torch.Tensor) -> None:
    # Not bitwise: BLAS libraries may pick kernels by the result's address and thread count (MKL documents
    # both), so the arena's views may round differently from fresh allocations. CI runs saw up to 3.8e-6
    # (values about 0.1, through four layers) where this machine sees none. The suite's float32 tolerance:
    # far below the error of a clobbered or misplaced buffer, which is of the values' own size.
    torch.testing.assert_close(a, b, **tolerances(torch.float32))


def test_arena_matches_no_arena_and_dumps_its_plan(monkeypatch, tmp_path):
    on = _step("1", monkeypatch, tmp_path / "on")
    off = _step("0", monkeypatch, tmp_path / "off")
    for a, b in zip(on, off):
        _same(a, b)
    plans = {p.parent.name: p.read_text() for p in (tmp_path / "on").glob("*/memory-plan.txt")}
    assert any(g.startswith("forward_") for g in plans) and any(g.startswith("inference_") for g in plans), plans
    where = "cpu" if device() == "cpu" else "cuda:0"
    assert any(f" on {where} for target runtime" in t and "offset 0" in t for t in plans.values()), plans
    offs = list((tmp_path / "off").glob("*/memory-plan.txt"))
    assert offs
    for p in offs:
        assert "(arena off)" in p.read_text() and "offset" not in p.read_text()


def test_outputs_survive_the_next_call(monkeypatch):
    monkeypatch.setenv("HINTBACKEND_ARENA", "1")
    m = _mlp()
    f = torch.compile(m, backend="hintbackend", options={"strict": True})
    with torch.no_grad():
        x1, x2 = torch.randn(64, 32, device=device()), torch.randn(64, 32, device=device())
        y1 = f(x1)
        kept = y1.clone()
        y2 = f(x2)
        assert torch.equal(y1, kept)
        torch.testing.assert_close(y2, m(x2))
