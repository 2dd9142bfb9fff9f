"""split-column-sum (passes/SplitColumnSum.h) on the GPU: a Linear's bias gradient, a column sum over the
rows of the output gradient, runs as two float32 sums instead of ATen's one-pass sum, which stages its
partial sums in a global buffer larger than the gradient itself. Gradients are checked against float64
at no worse than twice eager's error; the step's peak must drop by most of that buffer. The IR rewrite
itself is checked without a GPU in tests/cpp/core/split_column_sum_test.cpp."""

import pytest
import torch
import torch.nn as nn

from conftest import device
from helpers import graph_dirs

pytestmark = pytest.mark.skipif(device() != "cuda" or not torch.cuda.is_available(),
                                reason="needs HINTBACKEND_TEST_DEVICE=cuda and a GPU")


def mlp(dtype):
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512)).to("cuda", dtype)


def grads(model, x, dout):
    for p in model.parameters():
        p.grad = None
    (model(x).double() * dout).sum().backward()
    return [p.grad.detach().clone() for p in model.parameters()]


def rel(a, ref):
    return ((a.double() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_bias_gradients_match_float64(tmp_path, dtype):
    x = torch.randn(4, 512, 512, device="cuda", dtype=torch.float64)
    dout = torch.randn(4, 512, 512, device="cuda", dtype=torch.float64)
    ref = grads(mlp(torch.float64), x, dout)
    eager = grads(mlp(dtype), x.to(dtype), dout)
    compiled = torch.compile(mlp(dtype), backend="hintbackend", options={"dump_dir": str(tmp_path)})
    got = grads(compiled, x.to(dtype), dout)
    for name, g, e, r in zip(["w1", "b1", "w2", "b2"], got, eager, ref):
        assert torch.isfinite(g).all(), name
        assert rel(g, r) <= 2 * rel(e, r) + 1e-6, f"{name}: {rel(g, r):.3g} vs eager {rel(e, r):.3g}"
    notes = "".join(open(tmp_path / d / "notes.txt").read() for d in graph_dirs(str(tmp_path)))
    assert "over 2048 rows of 2048 as 32 partial sums of 64 rows" in notes, notes  # b1
    assert "over 2048 rows of 512 as 32 partial sums of 64 rows" in notes, notes   # b2


def test_no_block_larger_than_the_largest_tensor():
    """ATen's one-pass column sum of the first Linear's [2048, 2048] bf16 output gradient stages 32 MiB
    (benchmarks/column_sum.py). With the pass no allocation of the training step is larger than the
    model's largest tensor (8 MiB: that gradient), and the step's peak is lower."""
    x = torch.randn(4, 512, 512, device="cuda", dtype=torch.bfloat16)

    def measure(options):
        torch._dynamo.reset()
        model = torch.compile(mlp(torch.bfloat16), backend="hintbackend", options=options)

        def step():
            for p in model.parameters():
                p.grad = None
            model(x).float().pow(2).mean().backward()
        step(), step()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        torch.cuda.memory._record_memory_history(max_entries=100000)
        try:
            step()
            torch.cuda.synchronize()
            trace = torch.cuda.memory._snapshot()["device_traces"][0]
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
        largest = max(e["size"] for e in trace if e["action"] == "alloc") / 2**20
        return largest, (torch.cuda.max_memory_allocated() - base) / 2**20

    (largest, peak), (largest_off, peak_off) = measure({}), measure({"disable_passes": ["split-column-sum"]})
    assert largest_off >= 32, largest_off  # the premise: without the pass the staging buffer is there
    assert largest <= 8, largest
    assert peak < peak_off, (peak, peak_off)
