"""LayerNorm over narrow rows on CUDA (KernelKind::LayerNormRows: backend/runtime/LayerNormCall.cpp,
codegen/cuda/LayerNorm.cu), and a GELU or SiLU folded into it (fold-layer-norm-activation,
hintbackend::layer_norm_act and its backward: backend/runtime/LayerNormAct.h). On the GPU
(HINTBACKEND_TEST_DEVICE=cuda) the compiled forward and backward must be as close to a float64 reference
as eager's ATen kernels are (within 2x their error), on fresh random inputs, with rows that leave a block
part empty and rows that leave lanes past a row's end; the weight and bias gradients must be bitwise the
same from run to run. On the CPU the node stays ATen's (the kernels dump says so) and equals eager bit for
bit, nothing folds, and the fused ops are the ATen ops they stand for."""

import pytest
import torch
import torch.nn.functional as F

from conftest import device
from helpers import graph_dirs, randn

CUDA = device() == "cuda"
needs_cuda = pytest.mark.skipif(not CUDA, reason="the LayerNormRows kernels run on CUDA only")


def kernels(dump):
    return "".join((dump / d / "kernels.txt").read_text() for d in graph_dirs(dump))


def step(fn, x, w, b, gy, dims=1):
    """y and the gradients of x, w, b (those given) for the output gradient gy."""
    leaves = [t.detach().clone().requires_grad_() if t is not None else None for t in (x, w, b)]
    y = fn(leaves[0], leaves[1], leaves[2], dims)
    y.backward(gy)
    return [y.detach()] + [t.grad for t in leaves if t is not None]


def layer_norm(x, w, b, dims):
    return F.layer_norm(x, x.shape[-dims:], w, b, 1e-5)


def inputs(rows, shape, dtype, affine=True):
    """x off-centre and spread (so that the mean and the scale both matter), w around 1, b, gy."""
    x = (randn(rows, *shape) * 3 + 1.5).to(dtype)
    w = (randn(*shape) * 0.5 + 1).to(dtype) if affine else None
    b = randn(*shape).to(dtype) if affine else None
    return x, w, b, randn(rows, *shape).to(dtype)


def compiled(tmp_path):
    return torch.compile(layer_norm, backend="hintbackend", options={"dump_dir": str(tmp_path)})


def assert_as_close_as_eager(got, eager, ref, dtype, what):
    for k, (g, e, r) in enumerate(zip(got, eager, ref)):
        assert g.dtype == e.dtype and g.shape == e.shape, (what, k)
        err, err_eager = (g.double() - r).abs().max().item(), (e.double() - r).abs().max().item()
        slack = 2 * torch.finfo(dtype).eps * r.abs().max().item()  # a rounding step at the largest value
        assert err <= 2 * err_eager + slack, f"{what}, result {k} (y, dx, dw, db): {err} against eager's {err_eager}"


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("n", [8, 32, 96, 256, 768, 1024])
def test_matches_float64_as_closely_as_eager(dtype, n, tmp_path):
    torch.manual_seed(n)
    x, w, b, gy = inputs(4099, (n,), dtype)  # 4099 rows: no block's row count divides it
    ref = step(layer_norm, x.double(), w.double(), b.double(), gy.double())
    eager = step(layer_norm, x, w, b, gy)
    got = step(compiled(tmp_path), x, w, b, gy)
    assert_as_close_as_eager(got, eager, ref, dtype, f"{dtype} rows of {n}")
    k = kernels(tmp_path)
    assert "layer-norm-rows aten::native_layer_norm.default" in k, k
    assert "layer-norm-rows aten::native_layer_norm_backward.default" in k, k


@needs_cuda
def test_without_weight_and_bias_and_over_two_dims(tmp_path):
    torch.manual_seed(1)
    x, _, _, gy = inputs(777, (4, 16), torch.bfloat16, affine=False)
    ref = step(layer_norm, x.double(), None, None, gy.double(), dims=2)
    eager = step(layer_norm, x, None, None, gy, dims=2)
    got = step(compiled(tmp_path), x, None, None, gy, dims=2)
    assert_as_close_as_eager(got, eager, ref, torch.bfloat16, "no affine, normalized over (4, 16)")
    assert "layer-norm-rows aten::native_layer_norm_backward.default" in kernels(tmp_path)


@needs_cuda
def test_parameter_gradients_are_bitwise_the_same_each_run(tmp_path):
    torch.manual_seed(2)
    x, w, b, gy = inputs(262144, (32,), torch.bfloat16)  # the corpus MLP's LayerNorm at bench size
    fn = compiled(tmp_path)
    first, second = step(fn, x, w, b, gy), step(fn, x, w, b, gy)
    for a, c in zip(first, second):
        assert torch.equal(a, c)


@needs_cuda
def test_what_the_kernels_do_not_take_runs_on_aten(tmp_path):
    torch.manual_seed(3)
    x, w, b, gy = inputs(300, (2048,), torch.bfloat16)  # wider than a warp's registers hold
    got = step(compiled(tmp_path), x, w, b, gy)
    eager = step(layer_norm, x, w, b, gy)
    for g, e in zip(got, eager):
        assert torch.equal(g, e)
    assert "not layer-norm-rows: rows of 2048 (above 1024)" in kernels(tmp_path)


@pytest.mark.skipif(CUDA, reason="the CPU's layer norm")
def test_on_the_cpu_the_node_stays_aten_and_equals_eager(tmp_path):
    torch.manual_seed(4)
    x, w, b, gy = inputs(50, (32,), torch.float32)
    got = step(compiled(tmp_path), x, w, b, gy)
    eager = step(layer_norm, x, w, b, gy)
    for g, e in zip(got, eager):
        assert torch.equal(g, e)
    k = kernels(tmp_path)
    assert "aten-dispatch aten::native_layer_norm.default" in k and "layer-norm-rows" not in k, k


ACTIVATIONS = {"gelu": F.gelu, "gelu_tanh": lambda h: F.gelu(h, approximate="tanh"), "silu": F.silu}


def act_layer_norm(act):
    """layer_norm(act(h)): what fold-layer-norm-activation folds (the backward recomputes act(h))."""
    def fn(h, w, b, dims):
        return F.layer_norm(ACTIVATIONS[act](h), h.shape[-dims:], w, b, 1e-5)
    return fn


@needs_cuda
@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize("n", [32, 768])
def test_an_activation_folds_into_the_layer_norm(act, dtype, n, tmp_path):
    torch.manual_seed(n)
    x, w, b, gy = inputs(4099, (n,), dtype)
    fn = act_layer_norm(act)
    ref = step(fn, x.double(), w.double(), b.double(), gy.double())
    eager = step(fn, x, w, b, gy)
    got = step(torch.compile(fn, backend="hintbackend", options={"dump_dir": str(tmp_path)}), x, w, b, gy)
    assert_as_close_as_eager(got, eager, ref, dtype, f"{act}, {dtype} rows of {n}")
    k = kernels(tmp_path)
    assert "layer-norm-rows hintbackend::layer_norm_act.default" in k, k
    assert "layer-norm-rows hintbackend::layer_norm_act_backward.default" in k, k
    assert "aten::gelu" not in k and "aten::silu" not in k, k


@needs_cuda
def test_a_folded_activation_without_weight_and_bias(tmp_path):
    torch.manual_seed(5)
    x, _, _, gy = inputs(1000, (64,), torch.bfloat16, affine=False)
    fn = act_layer_norm("gelu")
    ref = step(fn, x.double(), None, None, gy.double())
    eager = step(fn, x, None, None, gy)
    got = step(torch.compile(fn, backend="hintbackend", options={"dump_dir": str(tmp_path)}), x, None, None, gy)
    assert_as_close_as_eager(got, eager, ref, torch.bfloat16, "gelu, no affine")
    assert "layer-norm-rows hintbackend::layer_norm_act_backward.default" in kernels(tmp_path)


@pytest.mark.skipif(CUDA, reason="the CPU's layer norm")
def test_on_the_cpu_nothing_folds(tmp_path):
    torch.manual_seed(6)
    x, w, b, gy = inputs(50, (32,), torch.float32)
    fn = act_layer_norm("gelu")
    got = step(torch.compile(fn, backend="hintbackend", options={"dump_dir": str(tmp_path)}), x, w, b, gy)
    for g, e in zip(got, step(fn, x, w, b, gy)):
        assert torch.equal(g, e)
    k = kernels(tmp_path)
    assert "aten-dispatch aten::gelu.default" in k and "layer_norm_act" not in k, k


@pytest.mark.parametrize("act", sorted(ACTIVATIONS))
def test_the_fused_ops_are_the_aten_ops_they_stand_for(act):
    """Where LayerNormRows' kernels do not run, hintbackend::layer_norm_act and its backward run eager's
    ops: the same bits as the chain they replace (on the test device)."""
    import hintbackend  # noqa: F401  (registers the ops)
    torch.manual_seed(7)
    x, w, b, gy = inputs(40, (24,), torch.float32)
    h = x.detach().clone().requires_grad_()
    a = ACTIVATIONS[act](h)
    y, mean, rstd = torch.native_layer_norm(a, [24], w, b, 1e-5)
    dx, dw, db = torch.ops.aten.native_layer_norm_backward(gy, a, [24], mean, rstd, w, b, [True, True, True])
    (dh,) = torch.autograd.grad(a, h, dx)
    got = torch.ops.hintbackend.layer_norm_act(x, [24], w, b, 1e-5, act)
    for g, e in zip(got, (y, mean, rstd)):
        assert torch.equal(g, e)
    got = torch.ops.hintbackend.layer_norm_act_backward(gy, x, [24], mean, rstd, w, b, [True, True, True], act)
    for g, e in zip(got, (dh, dw, db)):
        assert torch.equal(g, e)
    with pytest.raises(RuntimeError, match="unknown activation 'relu' \\(gelu, gelu_tanh or silu\\)"):
        torch.ops.hintbackend.layer_norm_act(x, [24], w, b, 1e-5, "relu")
