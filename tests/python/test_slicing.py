"""BFS vs DFS slice scheduling through the whole backend: the hinted region runs slice by slice
(a hintbackend::slice_loop in the IR) and gives the same results as BFS, forward and backward."""

import os

import pytest
import torch

from conftest import device
from helpers import randn
from hintbackend import hinted_context


def attention(q, k, v):
    s = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    return s.float().softmax(-1).to(q.dtype) @ v


def run(schedule, q, k, v, dump_dir, **hints):
    def f(q, k, v):
        with hinted_context(schedule=schedule, **hints):
            out = attention(q, k, v)
        return out * 2

    torch._dynamo.reset()
    qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = torch.compile(f, backend="hintbackend", options={"strict": True, "dump_dir": dump_dir})(qq, kk, vv)
    out.backward(torch.ones_like(out))
    return out.detach(), qq.grad, kk.grad, vv.grad


def final_ir(dump_dir):
    return {d: open(os.path.join(dump_dir, d, "ir-final.txt")).read() for d in os.listdir(dump_dir)}


@pytest.mark.parametrize("slices", [2, 8])
def test_dfs_equals_bfs_forward_and_backward(tmp_path, slices):
    torch.manual_seed(0)
    q, k, v = randn(2, 4, 16, 8), randn(2, 4, 16, 8), randn(2, 4, 16, 8)
    bfs = run("bfs", q, k, v, str(tmp_path / "bfs"))
    dfs = run("dfs", q, k, v, str(tmp_path / "dfs"), slices=slices)
    for name, a, b in zip(("out", "dq", "dk", "dv"), dfs, bfs):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6, msg=lambda m: f"{name}: {m}")
    # and against a float64 reference of the function itself
    ref = attention(q.double(), k.double(), v.double()) * 2
    torch.testing.assert_close(dfs[0].double(), ref, rtol=1e-5, atol=1e-5)
    dfs_ir = final_ir(str(tmp_path / "dfs"))
    bfs_ir = final_ir(str(tmp_path / "bfs"))
    assert any(f"slices={slices}" in t and "hintbackend::slice_loop" in t for d, t in dfs_ir.items()
               if d.startswith("forward")), "the forward DFS region must become a slice loop"
    assert not any("hintbackend::slice_loop" in t for t in bfs_ir.values()), "BFS must not slice"


def test_auto_schedule_with_an_impossible_budget_errors():
    q, k, v = randn(2, 4, 16, 8), randn(2, 4, 16, 8), randn(2, 4, 16, 8)

    def f(q, k, v):
        with hinted_context(schedule="auto", memory_budget=64):
            return attention(q, k, v)

    with pytest.raises(Exception, match="memory_budget"):
        with torch.no_grad():
            torch.compile(f, backend="hintbackend")(q, k, v)
