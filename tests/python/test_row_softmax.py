"""The row softmax ops (backend/runtime/RowSoftmax.h) that row-softmax-fusion rewrites softmax chains
into, on fresh random inputs. On CUDA (HINTBACKEND_TEST_DEVICE=cuda, the GPU machine) the row kernels
must be as close to a float64 reference of the chain as eager's ATen ops are; on CPU the ops run the
chain as ATen ops and must equal eager bit for bit. Then through the backend, BFS and DFS."""

import pytest
import torch

import hintbackend
from conftest import device
from helpers import randn
from hintbackend import hinted_context

hintbackend._core()  # registers the ops
ops = torch.ops.hintbackend

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# Row lengths: tiny, odd (the scalar path), the vector path, a row that leaves some threads' chunks
# past its end (1000), long rows (several chunks per thread; 8200 also past the end), and longer than
# the CUDA kernel's rows (ATen ops then).
LENGTHS = [1, 7, 64, 100, 1000, 4096, 8200, 20000]


def rows(n, dtype, spread=4.0):
    return (randn(3, 5, n) * spread).to(dtype)


def chain_forward64(x, scale):
    """The chain in float64 from the same rounded inputs: x * scale rounds to x's dtype first."""
    v = (x * scale) if scale is not None else x
    return torch.softmax(v.double(), -1)


def eager_forward(x, scale, dtype):
    v = (x * scale) if scale is not None else x
    return torch._softmax(v.float(), -1, False).to(dtype)


def err(a, ref):
    return (a.double() - ref).abs().max().item()


def check(got, want, ref, ulp):
    """CUDA: the kernel within twice eager's error from float64 (float32 sums run in another order;
    after a half-precision downcast the two agree to a unit in the last place). CPU: eager's bits."""
    if device() == "cuda":
        assert err(got, ref) <= 2 * err(want, ref) + ulp, (err(got, ref), err(want, ref))
    else:
        assert torch.equal(got, want)


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [None, 0.125])
def test_forward_is_as_accurate_as_eager(dtype, n, scale):
    torch.manual_seed(n)
    x = rows(n, dtype)
    ref = chain_forward64(x, scale)
    for out_dtype in {torch.float32, dtype}:
        got = ops.row_softmax(x, scale, out_dtype)
        want = eager_forward(x, scale, out_dtype)
        assert got.dtype == out_dtype and got.shape == x.shape
        check(got, want, ref, torch.finfo(out_dtype).eps)
    y32, low = ops.row_softmax2(x, scale)
    assert torch.equal(y32, ops.row_softmax(x, scale, torch.float32))
    assert torch.equal(low, ops.row_softmax(x, scale, dtype))


@pytest.mark.parametrize("n", LENGTHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("scale", [None, 0.125])
def test_backward_is_as_accurate_as_eager(dtype, n, scale):
    torch.manual_seed(100 + n)
    x = rows(n, dtype)
    grad = rows(n, dtype, spread=1.0)
    y = ops.row_softmax(x, 0.5, torch.float32)
    y64, g64 = y.double(), grad.double()
    r64 = y64 * (g64 - (g64 * y64).sum(-1, keepdim=True))
    ref = (r64.to(dtype).double() * scale) if scale is not None else r64
    want = torch._softmax_backward_data(grad.float(), y, -1, torch.float32).to(dtype)
    want = want * scale if scale is not None else want
    got = ops.row_softmax_backward(grad, y, scale, dtype)
    assert got.dtype == dtype and got.shape == x.shape
    check(got, want, ref, torch.finfo(dtype).eps * ref.abs().max().item())
    # Recomputing y in the kernel gives the same bits as reading the stored one; the in-place kernel
    # overwrites grad with those bits and x with row_softmax's.
    assert torch.equal(ops.row_softmax_recompute_backward(grad, x, 0.5, scale, dtype), got)
    g2, x2 = grad.clone(), x.clone()
    r = ops.row_softmax_recompute_backward_(g2, x2, 0.5, scale)
    assert r.data_ptr() == g2.data_ptr()
    assert torch.equal(g2, got) and torch.equal(x2, ops.row_softmax(x, 0.5, dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_masked_rows_match_eager(dtype):
    """Scores masked with -inf (a causal mask, say): partly masked rows are exact zeros where masked;
    a row masked whole is NaN, as eager's softmax gives. Forward and the recomputing backward."""
    torch.manual_seed(9)
    x = rows(4096, dtype)
    x[..., 1::3] = float("-inf")
    x[1, 2] = float("-inf")  # one row masked whole
    got = ops.row_softmax(x, 0.125, dtype)
    want = eager_forward(x, 0.125, dtype)
    assert torch.equal(got.isnan(), want.isnan()) and got.isnan()[1, 2].all() and not got.isnan()[0].any()
    assert (got[..., 1::3][~got.isnan()[..., 1::3]] == 0).all()
    torch.testing.assert_close(got, want, rtol=0, atol=torch.finfo(dtype).eps, equal_nan=True)
    grad = rows(4096, dtype, spread=1.0)
    y = eager_forward(x, 0.125, torch.float32)
    want_g = torch._softmax_backward_data(grad.float(), y, -1, torch.float32).to(dtype)
    got_g = ops.row_softmax_recompute_backward(grad, x, 0.125, None, dtype)
    assert torch.equal(got_g.isnan(), want_g.isnan())
    eps = torch.finfo(dtype).eps  # a unit in the last place either way (float32 sums in another order)
    torch.testing.assert_close(got_g, want_g, rtol=2 * eps, atol=2 * eps, equal_nan=True)


def test_strided_inputs_and_out_overloads():
    """Transposed rows are not the kernels' layout: the ops run the chain as ATen ops (eager's exact
    result). The out= overloads write into the given tensor."""
    torch.manual_seed(3)
    x = randn(4, 32, 16).to(torch.bfloat16).transpose(-1, -2)
    assert torch.equal(ops.row_softmax(x, 0.25, torch.bfloat16), eager_forward(x, 0.25, torch.bfloat16))
    out = torch.empty(4, 16, 32, dtype=torch.float32, device=device())
    r = ops.row_softmax.out(x.contiguous(), 0.25, torch.float32, out=out)
    assert r.data_ptr() == out.data_ptr()
    assert torch.equal(out, ops.row_softmax(x.contiguous(), 0.25, torch.float32))
    g = randn(4, 16, 32).to(torch.bfloat16)
    out2 = torch.empty_like(g)
    ops.row_softmax_backward.out(g, out, None, torch.bfloat16, out=out2)
    assert torch.equal(out2, ops.row_softmax_backward(g, out, None, torch.bfloat16))
    with pytest.raises(RuntimeError, match="out must be"):
        ops.row_softmax.out(x, 0.25, torch.float32, out=torch.empty(3, device=device()))


def attention(q, k, v):
    s = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    return s.float().softmax(-1).to(q.dtype) @ v


def run(schedule, q, k, v, options=None, **hints):
    def f(q, k, v):
        with hinted_context(schedule=schedule, **hints):
            return attention(q, k, v)

    torch._dynamo.reset()
    qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = torch.compile(f, backend="hintbackend", options={"strict": True, **(options or {})})(qq, kk, vv)
    out.backward(torch.ones_like(out))
    return out.detach(), qq.grad, kk.grad, vv.grad


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_attention_bfs_dfs_and_eager(dtype, tmp_path):
    """Plain-op attention, forward and backward: BFS (saved softmax, row_softmax2 + row_softmax_backward)
    and DFS (row_softmax + row_softmax_recompute_backward in the slice body) give the same bits; both are
    as close to float64 as eager, and as close as the unfused graph."""
    torch.manual_seed(7)
    q, k, v = (randn(2, 4, 64, 16, dtype=dtype) for _ in range(3))
    bfs = run("bfs", q, k, v, {"dump_dir": str(tmp_path / "bfs")})
    dfs = run("dfs", q, k, v, {"dump_dir": str(tmp_path / "dfs")}, slices=4)
    plain = run("bfs", q, k, v, {"disable_passes": ["row-softmax-fusion"]})
    qq, kk, vv = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    o = attention(qq, kk, vv)
    o.backward(torch.ones_like(o))
    ref = (o.detach(), qq.grad, kk.grad, vv.grad)
    qe, ke, ve = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    oe = attention(qe, ke, ve)
    oe.backward(torch.ones_like(oe))
    eager = (oe.detach(), qe.grad, ke.grad, ve.grad)
    for name, b, d, p, e, r in zip(("out", "dq", "dk", "dv"), bfs, dfs, plain, eager, ref):
        assert torch.equal(b, d), f"{name}: dfs differs from bfs"
        assert err(b, r) <= 2 * max(err(e, r), err(p, r)) + 1e-6, (name, err(b, r), err(e, r), err(p, r))
    kernels = {s: "".join(open(p).read() for p in (tmp_path / s).glob("*/kernels.txt")) for s in ("bfs", "dfs")}
    # bf16: the forward saves the float32 softmax and reads its bf16 copy (row_softmax2); float32 has no copy.
    fw = "row_softmax2" if dtype == torch.bfloat16 else "row_softmax.default"
    assert fw in kernels["bfs"] and "row_softmax_backward" in kernels["bfs"], kernels["bfs"]
    assert "row_softmax_recompute_backward_" in kernels["dfs"], kernels["dfs"]
    assert "aten::_softmax" not in kernels["dfs"], kernels["dfs"]
