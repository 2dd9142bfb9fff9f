"""Pointwise fusion (passes/PointwiseFusion.h): chains of elementwise ops run as one fused kernel (CPU,
and CUDA with HINTBACKEND_TEST_DEVICE=cuda). Every op of the fusion table, forward and backward, in float64 (tight tolerances), float32 and
bfloat16, with broadcasting and non-contiguous inputs, compared with eager; the dump shows the fusion."""

import glob
import os

import pytest
import torch
import torch.nn.functional as F

from helpers import check_model, randn

UNARY = {
    "neg": torch.neg, "relu": torch.relu, "sigmoid": torch.sigmoid, "tanh": torch.tanh, "exp": torch.exp,
    "log": lambda x: torch.log(x.abs() + 0.5), "sqrt": lambda x: torch.sqrt(x.abs() + 0.1),
    "rsqrt": lambda x: torch.rsqrt(x.abs() + 0.1), "abs": torch.abs, "reciprocal": lambda x: 1 / (x.abs() + 0.5),
    "sin": torch.sin, "cos": torch.cos, "log1p": lambda x: torch.log1p(x.abs()), "expm1": torch.expm1,
    "erf": torch.erf, "silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "leaky_relu": lambda x: F.leaky_relu(x, 0.2), "pow": lambda x: x.abs().pow(1.5), "square": lambda x: x ** 2,
}
BINARY = {
    "add_alpha": lambda x, y: torch.add(x, y, alpha=3), "sub": lambda x, y: x - y, "rsub": lambda x, y: 1.5 - x * y,
    "mul": torch.mul, "div": lambda x, y: x / (y.abs() + 0.5), "maximum": torch.maximum, "minimum": torch.minimum,
}


def fused_bodies(dump_dir):
    text = "".join(open(p).read() for p in glob.glob(os.path.join(dump_dir, "*", "ir-final.txt")))
    return text.count("hintbackend::fused_pointwise(")


def unary_case(name):
    op = UNARY[name]

    def f(x, b):
        return op(x * 1.25 + b) * 0.5

    return f


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_ops_fuse_forward_and_backward(tmp_path, name, dtype):
    torch.manual_seed(0)
    check_model(unary_case(name), [randn(6, 37, dtype=dtype), randn(37, dtype=dtype)],
                options={"dump_dir": str(tmp_path)})
    assert fused_bodies(str(tmp_path)) >= 1, f"{name}: nothing was fused"


@pytest.mark.parametrize("name", sorted(UNARY))
def test_bfloat16_fusion_is_at_least_as_accurate_as_eager(tmp_path, name):
    """bf16 groups keep float intermediates (eager rounds after every op), so they are compared with a
    float64 reference: the fused error must not exceed eager's (plus one bf16 ulp of slack)."""
    f = unary_case(name)
    torch.manual_seed(0)
    x, b = randn(6, 37, dtype=torch.bfloat16), randn(37, dtype=torch.bfloat16)

    def run(fn, dtype):
        xs = [t.detach().to(dtype).requires_grad_(True) for t in (x, b)]
        out = fn(*xs)
        out.backward(torch.ones_like(out))
        return [t.double() for t in (out.detach(), xs[0].grad, xs[1].grad)]

    ref = run(f, torch.float64)
    eager = run(f, torch.bfloat16)
    got = run(torch.compile(f, backend="hintbackend", options={"strict": True, "dump_dir": str(tmp_path)}),
              torch.bfloat16)
    assert fused_bodies(str(tmp_path)) >= 1
    for what, r, e, g in zip(("output", "grad x", "grad b"), ref, eager, got):
        err_eager = ((e - r).abs() / (r.abs() + 1)).max().item()
        err_got = ((g - r).abs() / (r.abs() + 1)).max().item()
        assert err_got <= err_eager + 2 ** -7, f"{name} {what}: fused error {err_got:.3g} > eager's {err_eager:.3g}"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_ops_fuse_with_broadcast_and_transposed_inputs(tmp_path, name, dtype):
    op = BINARY[name]

    def f(x, y, b):
        return torch.tanh(op(x.t() + b, y) * 2)  # x.t() is a non-contiguous view

    torch.manual_seed(1)
    check_model(f, [randn(33, 5, dtype=dtype), randn(5, 33, dtype=dtype), randn(5, 1, dtype=dtype)],
                options={"dump_dir": str(tmp_path)})
    assert fused_bodies(str(tmp_path)) >= 1


def test_training_fuses_forward_and_backward_chains(tmp_path):
    def f(x, w):
        return torch.tanh(torch.sigmoid(x * w + 1) * x).sum(-1)

    torch.manual_seed(2)
    check_model(f, [randn(8, 16), randn(16)], options={"dump_dir": str(tmp_path)})
    bw = "".join(open(p).read() for p in glob.glob(os.path.join(str(tmp_path), "backward*", "ir-final.txt")))
    assert "hintbackend::fused_pointwise(" in bw, "the backward's elementwise chains were not fused"


def test_disable_pass_turns_fusion_off(tmp_path):
    def f(x):
        return torch.sigmoid(torch.relu(x) * 2 + 1)

    torch.manual_seed(3)
    check_model(f, [randn(4, 8)], options={"dump_dir": str(tmp_path), "disable_passes": ["pointwise-fusion"]})
    assert fused_bodies(str(tmp_path)) == 0


def test_large_cpu_groups_run_op_by_op_with_the_same_results(tmp_path):
    """Above the CPU kernel's size limit (backend/runtime/FusedPointwise.cpp) the group's body runs op by
    op through ATen; results and gradients still match eager."""
    def f(x, b):
        return torch.sigmoid(F.gelu(x * 1.25 + b) * 0.5)

    torch.manual_seed(4)
    check_model(f, [randn(64, 256, dtype=torch.float64), randn(256, dtype=torch.float64)],
                options={"dump_dir": str(tmp_path)})
    assert fused_bodies(str(tmp_path)) >= 1
