"""split-column-sum (passes/SplitColumnSum.h) and its op, hintbackend::column_sum (backend/runtime/
ColumnSum.h): a Linear's bias gradient, a column sum over the rows of the output gradient, runs as float32
partial sums and their sum instead of ATen's one-pass sum, which stages its partial sums in a global buffer
larger than the gradient itself. The op is checked against float64 on fresh random inputs on the test
device (on CPU its ATen form, on CUDA its kernels) at no worse than twice eager's error, and bitwise the
same from run to run. On the GPU, the model's gradients against float64 and the step's largest block and
peak. The IR rewrite itself is checked without a GPU in tests/cpp/core/split_column_sum_test.cpp."""

import zlib

import pytest
import torch
import torch.nn as nn

import hintbackend
from conftest import device
from helpers import graph_dirs

hintbackend._core()  # registers the ops
ops = torch.ops.hintbackend
cuda_only = pytest.mark.skipif(device() != "cuda" or not torch.cuda.is_available(),
                               reason="needs HINTBACKEND_TEST_DEVICE=cuda and a GPU")


# (shape, leading dims summed, keepdim, parts): a bias gradient's [N, C] (C a multiple of the kernel's
# 16-byte vectors, and not: 1001), two leading dims of a 3-d gradient, keepdim.
CASES = [((2048, 512), 1, False, 32), ((1024, 1001), 1, False, 32), ((4, 256, 768), 2, False, 32),
         ((8, 128, 1, 256), 2, True, 64)]


@pytest.mark.parametrize("dtype,out_dtype", [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
                                             (torch.float32, torch.float32), (torch.bfloat16, torch.float32)])
@pytest.mark.parametrize("shape,dims,keepdim,parts", CASES)
def test_column_sum_matches_float64(shape, dims, keepdim, parts, dtype, out_dtype):
    torch.manual_seed(zlib.crc32(repr((shape, dims, dtype, out_dtype)).encode()))
    x = (torch.randn(shape, device=device()) + 0.5).to(dtype)  # a mean, so that rounding shows
    lead = list(range(dims))
    ref = x.double().sum(lead, keepdim=keepdim)
    eager = x.sum(lead, keepdim=keepdim, dtype=torch.float32).to(out_dtype)
    got = ops.column_sum(x, dims, keepdim, parts, out_dtype)
    assert got.dtype == out_dtype and got.shape == ref.shape, (got.dtype, got.shape, ref.shape)
    err = ((got.double() - ref).norm() / ref.norm()).item()
    base = ((eager.double() - ref).norm() / ref.norm()).item()
    assert err <= 2 * base + 1e-6, f"{err:.3g} vs eager {base:.3g}"
    assert torch.equal(got, ops.column_sum(x, dims, keepdim, parts, out_dtype))  # the same adds every run
    out = torch.empty_like(got)
    r = ops.column_sum.out(x, dims, keepdim, parts, out_dtype, out=out)
    assert r.data_ptr() == out.data_ptr() and torch.equal(out, got)


def test_column_sum_names_a_wrong_out():
    x = torch.randn(512, 256, device=device())
    with pytest.raises(RuntimeError, match=r"column_sum.out: out must be Float of shape \[256\]"):
        ops.column_sum.out(x, 1, False, 32, torch.float32, out=torch.empty(255, device=device()))
    with pytest.raises(RuntimeError, match="dims must be in"):
        ops.column_sum(x, 2, False, 32, torch.float32)


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


@cuda_only
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
    ir = "".join(open(tmp_path / d / "ir-final.txt").read() for d in graph_dirs(str(tmp_path)))
    assert ir.count("hintbackend::column_sum.default(") == 2, ir


@cuda_only
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
