"""FlexAttention on the generated tiled CPU kernel (kernel selection's "fused" choice, the CPU default
where a C++ compiler is found): outputs, logsumexp, q/k/v gradients and captured-buffer gradients
against an independent float64 reference (dense attention with torch's own autograd, on fresh random
inputs), no worse than twice the error of the low-precision baseline (eager flex's math path; for buffer
gradients, which eager flex does not give on CPU, hintbackend's reference kernel, which mirrors it).
Also: the kernels dump names the fused kernel and shows the generated source; deterministic results run
to run; out-of-range buffer reads raise IndexError; kernel="fused" that cannot be honoured is an error;
host_compiler="" falls back to the reference with the reason."""

import math
import os
import warnings
import zlib

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask

from flex_reference import KINKED_SCORE_MODS, SCORE_MODS, causal, hop, kernels_text, outputs_and_grads, rel
from flex_reference import dense as dense_natural
from hintbackend import hinted_context
from hintbackend.backend import HintBackendFallbackWarning

pytestmark = pytest.mark.skipif(not (os.environ.get("CXX") or any(
    os.path.exists(os.path.join(p, c)) for p in os.environ.get("PATH", "").split(os.pathsep)
    for c in ("c++", "g++", "clang++"))), reason="needs a host C++ compiler")

LN2 = math.log(2)


def dense(q, k, v, score_mod=None, mask_mod=None, scale=None):
    """The float64 reference with the logsumexp in base 2, as the higher-order op returns it."""
    out, lse = dense_natural(q, k, v, score_mod, mask_mod, scale)
    return out, lse / LN2


def window(b, h, q, kv):
    return (q >= kv) & (q - kv < 48)


MASKS = {"none": None, "causal": causal, "window": window}


def run_case(tmp_path, score, mask, dtype=torch.float32, shape=(2, 4, 4, 200, 32), buf_dtype=torch.float32,
             with_lse_grad=False, options=None):
    """Compiled hintbackend, the low-precision baselines and the float64 reference for one case; asserts
    the error bound and returns the kernels dump."""
    B, Hq, Hkv, S, D = shape
    buf_shape, wants_grad, make_mod = {**SCORE_MODS, **KINKED_SCORE_MODS}[score]
    torch.manual_seed(zlib.crc32(repr((score, mask, dtype, shape, buf_dtype, with_lse_grad)).encode()))
    q = torch.randn(B, Hq, S, D, dtype=torch.float64)
    k, v = (torch.randn(B, Hkv, S, D, dtype=torch.float64) for _ in range(2))
    dout = torch.randn(B, Hq, S, D, dtype=torch.float64)
    dlse = torch.randn(B, Hq, S, dtype=torch.float64)
    table = torch.randn(buf_shape(B, Hq, S), dtype=torch.float64) if buf_shape else None
    mask_mod = MASKS[mask]
    bm = create_block_mask(mask_mod, None, None, S, S, device="cpu", BLOCK_SIZE=64) if mask_mod else None

    def step(fn, dt, bdt):
        return outputs_and_grads(fn, q, k, v, dout, dt, table, bdt, make_mod, wants_grad, S,
                                 dlse if with_lse_grad else None)

    def flex(qq, kk, vv, sm):
        return hop(qq, kk, vv, sm, bm)

    def reference(qq, kk, vv, sm):
        return dense(qq, kk, vv, sm, mask_mod)

    def compiled(kernel):
        def f(qq, kk, vv, sm):
            with hinted_context(kernel=kernel):
                return hop(qq, kk, vv, sm, bm)

        def call(qq, kk, vv, sm):
            torch._dynamo.reset()
            opts = {"dump_dir": str(tmp_path / kernel)}
            opts.update(options or {})
            return torch.compile(f, backend="hintbackend", options=opts)(qq, kk, vv, sm)
        return call

    ref = step(reference, torch.float64, torch.float64)
    got = step(compiled("auto"), dtype, buf_dtype)
    base = step(compiled("aten"), dtype, buf_dtype)  # the reference kernel: eager flex's math
    eager = step(flex, dtype, buf_dtype) if not wants_grad else None
    floor = {torch.float64: 1e-12, torch.float32: 2e-6}.get(dtype, 1e-4)
    names = ["out", "lse", "dq", "dk", "dv", "dbuf"]
    for i, (g, r) in enumerate(zip(got, ref)):
        err = rel(g, r)
        baseline = rel(base[i], r)
        if eager is not None and i < 5:
            baseline = max(baseline, rel(eager[i], r))
        if r.double().norm() < 1e-9:  # zero in exact arithmetic (a row shift's gradient): both are rounding
            baseline = max(baseline, {torch.float32: 1e-5, torch.float64: 1e-12}.get(dtype, 1e-2))
        assert err <= 2 * baseline + floor, f"{names[i]}: {err:.3g} vs baseline {baseline:.3g}"
    return kernels_text(tmp_path / "auto"), got


@pytest.mark.parametrize("score", list(SCORE_MODS))
@pytest.mark.parametrize("mask", list(MASKS))
def test_fused_matches_float64(tmp_path, score, mask):
    kernels, got = run_case(tmp_path, score, mask)
    assert "flex-attention-fused" in kernels and "flex-attention-backward-fused" in kernels, kernels
    assert "source of %flex_attention" in kernels  # the dumps show the generated code
    # ... with codegen/FlexMath.h by name only (compiled in, the same in every source)
    assert "// ---- codegen/FlexMath.h (its text not shown)" in kernels and "hb_log_parts" not in kernels


# Kinks and jumps, in float64 (flex_reference.KINKED_SCORE_MODS says why): the generated forms of leaky_relu,
# hardtanh, relu6, selu, hardsigmoid, hardswish, a softplus past its threshold, copysign and frac, and their
# derivatives, against the float64 dense reference.
@pytest.mark.parametrize("mask", ["none", "causal"])
def test_fused_kinked_score_mods_in_float64(tmp_path, mask):
    kernels, _ = run_case(tmp_path, "kinks", mask, dtype=torch.float64)
    assert "flex-attention-fused" in kernels and "flex-attention-backward-fused" in kernels, kernels


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float64])
@pytest.mark.parametrize("score", ["softcap_relative", "alibi"])
def test_fused_dtypes(tmp_path, dtype, score):
    run_case(tmp_path, score, "causal", dtype=dtype)


@pytest.mark.parametrize("shape", [(2, 8, 2, 130, 16), (1, 2, 1, 67, 128), (2, 2, 2, 96, 256)])  # GQA/MQA, odd S, D
def test_fused_shapes(tmp_path, shape):
    run_case(tmp_path, "relative", "window", shape=shape)


def test_fused_bf16_buffer_and_logsumexp_gradient(tmp_path):
    run_case(tmp_path, "relative", "causal", dtype=torch.bfloat16, buf_dtype=torch.bfloat16)
    run_case(tmp_path, "head", "none", with_lse_grad=True)  # the per-head bias's gradient is the lse's


@pytest.mark.parametrize("score", ["query", "head"])
def test_a_row_shift_costs_nothing_and_its_gradient_is_zero(tmp_path, score):
    """score + t with t independent of kv_idx, only the output used: the joint is skipped and the bias's
    gradient is exactly zero (the float64 reference agrees to rounding)."""
    torch.manual_seed(5)
    B, H, S, D = 2, 4, 96, 16
    buf = torch.randn(S if score == "query" else H, requires_grad=True)
    mod = (lambda s, b, h, qi, ki: s + buf[qi]) if score == "query" else (lambda s, b, h, qi, ki: s + buf[h])
    q, k, v = (torch.randn(B, H, S, D, requires_grad=True) for _ in range(3))
    out = torch.compile(lambda q, k, v: hop(q, k, v, mod)[0], backend="hintbackend",
                        options={"dump_dir": str(tmp_path)})(q, k, v)
    out.square().sum().backward()
    assert "the joint is skipped, its buffer gradients are zero" in kernels_text(tmp_path)
    assert torch.equal(buf.grad, torch.zeros_like(buf))
    ref_buf = buf.detach().double().requires_grad_(True)
    rmod = (lambda s, b, h, qi, ki: s + ref_buf[qi]) if score == "query" else (lambda s, b, h, qi, ki: s + ref_buf[h])
    rq, rk, rv = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    dense(rq, rk, rv, rmod)[0].square().sum().backward()
    assert ref_buf.grad.abs().max() < 1e-9
    for g, r in zip((q.grad, k.grad, v.grad), (rq.grad, rk.grad, rv.grad)):
        assert rel(g, r) < 1e-5


def test_fused_document_mask_reads_a_buffer(tmp_path):
    """A mask_mod that reads a captured buffer (document ids), with a score_mod on top."""
    torch.manual_seed(3)
    B, H, S, D = 2, 2, 160, 32
    doc = torch.sort(torch.randint(0, 4, (S,))).values

    def mask_mod(b, h, q, kv):
        return (doc[q] == doc[kv]) & (q >= kv)

    bm = create_block_mask(mask_mod, None, None, S, S, device="cpu", BLOCK_SIZE=32)
    q, k, v = (torch.randn(B, H, S, D, dtype=torch.float64) for _ in range(3))

    def f(q, k, v):
        return hop(q, k, v, lambda s, b, h, qi, ki: s - 0.1 * (qi - ki), bm)

    torch._dynamo.reset()
    qs = [t.float().requires_grad_(True) for t in (q, k, v)]
    out, lse = torch.compile(f, backend="hintbackend", options={"dump_dir": str(tmp_path)})(*qs)
    out.sum().backward()
    rs = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ro, rl = dense(*rs, lambda s, b, h, qi, ki: s - 0.1 * (qi - ki), mask_mod)
    ro.sum().backward()
    for g, r in zip([out, lse] + [t.grad for t in qs], [ro, rl] + [t.grad for t in rs]):
        assert rel(g, r) < 2e-5
    assert "flex-attention-backward-fused" in kernels_text(tmp_path)


@pytest.mark.parametrize("kernel", ["auto", "aten"])
def test_dynamic_shapes_with_captured_sizes(tmp_path, kernel):
    """dynamic=True: the score_mod's graphs capture symbolic sizes (SymInts) beside its buffers, and the
    scale is 1 / sqrt(D) of a symbolic head dim (torch._sym_sqrt, computed per call); both the generated
    kernel and the reference take them, forward and backward, for every sequence length and head dim,
    with no graph left to eager."""
    table = torch.randn(4, dtype=torch.float64)
    mod = lambda s, b, h, qi, ki: s + table[h] - 0.01 * (qi - ki).abs()  # noqa: E731

    def f(q, k, v):
        with hinted_context(kernel=kernel):
            return hop(q, k, v, mod)[0]

    compiled = torch.compile(f, backend="hintbackend", dynamic=True, options={"dump_dir": str(tmp_path)})
    with warnings.catch_warnings():
        warnings.simplefilter("error", HintBackendFallbackWarning)
        for S, D in ((64, 16), (96, 16), (130, 24)):
            q, k, v = (torch.randn(2, 4, S, D, dtype=torch.float64, requires_grad=True) for _ in range(3))
            out = compiled(q, k, v)
            dout = torch.randn_like(out)
            out.backward(dout)
            rq, rk, rv = (t.detach().clone().requires_grad_() for t in (q, k, v))
            want = dense(rq, rk, rv, mod)[0]
            want.backward(dout)
            # 0.01 * |q - kv| is float32 in torch (an int tensor times a Python float), so in the reference;
            # the generated code computes floats in the working type, here double: about 1e-8 apart
            for got, ref in ((out, want), (q.grad, rq.grad), (k.grad, rk.grad), (v.grad, rv.grad)):
                assert rel(got, ref) < 1e-6, (S, D, rel(got, ref))
    kernels = kernels_text(tmp_path)
    assert "torch::sym_sqrt" in kernels, kernels  # the scale, computed natively
    fused = "flex-attention-fused" if kernel == "auto" else "flex-attention-reference"
    assert fused in kernels and fused.replace("attention-", "attention-backward-") in kernels, kernels


def test_fused_is_deterministic(tmp_path):
    torch.manual_seed(0)
    S = 128
    lb = torch.randn(2 * S - 1, 4, requires_grad=True)
    q, k, v = (torch.randn(2, 4, S, 32, requires_grad=True) for _ in range(3))

    def f(q, k, v):
        with hinted_context(deterministic=True):
            return hop(q, k, v, lambda s, b, h, qi, ki: s + lb[qi - ki + S - 1, h])[0]

    fn = torch.compile(f, backend="hintbackend")
    runs = []
    for _ in range(2):
        for t in (q, k, v, lb):
            t.grad = None
        fn(q, k, v).sum().backward()
        runs.append([t.grad.clone() for t in (q, k, v, lb)])
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_out_of_range_buffer_read_raises_index_error():
    S = 64
    table = torch.randn(S)  # read at q + kv: out of range for most pairs

    def f(q, k, v):
        return hop(q, k, v, lambda s, b, h, qi, ki: s + table[qi + ki])[0]

    q, k, v = (torch.randn(1, 1, S, 16) for _ in range(3))
    with pytest.raises(IndexError, match="score_mod indexes captured buffer 0 out of range"):
        torch.compile(f, backend="hintbackend")(q, k, v)


def test_no_host_compiler_falls_back_to_the_reference(tmp_path):
    q, k, v = (torch.randn(1, 2, 64, 16) for _ in range(3))

    def f(q, k, v):
        return hop(q, k, v, lambda s, b, h, qi, ki: s * 0.5)[0]

    out = torch.compile(f, backend="hintbackend", options={"dump_dir": str(tmp_path), "host_compiler": ""})(q, k, v)
    torch.testing.assert_close(out.double(), dense(q.double(), k.double(), v.double(), lambda s, *a: s * 0.5)[0],
                               rtol=1e-5, atol=1e-5)
    kernels = kernels_text(tmp_path)
    assert "flex-attention-reference" in kernels and "not fused: no host C++ compiler is configured" in kernels

    def g(q, k, v):
        with hinted_context(kernel="fused"):
            return hop(q, k, v)[0]

    torch._dynamo.reset()
    with pytest.raises(Exception, match='kernel="fused" was asked for .* no host C\\+\\+ compiler'):
        torch.compile(g, backend="hintbackend", options={"host_compiler": ""})(q, k, v)


def test_a_broken_compiler_falls_back_with_its_error(tmp_path):
    q, k, v = (torch.randn(1, 2, 64, 16) for _ in range(3))

    def f(q, k, v):
        return hop(q, k, v, lambda s, b, h, qi, ki: s * 0.25)[0]

    opts = {"dump_dir": str(tmp_path / "dump"), "host_compiler": "false", "cache_dir": str(tmp_path / "cache")}
    out = torch.compile(f, backend="hintbackend", options=opts)(q, k, v)
    assert torch.isfinite(out).all()
    assert "not fused: building the generated kernel failed: `false` failed" in kernels_text(tmp_path / "dump")


CACHE_SCRIPT = """
import sys, torch
torch.manual_seed(0)
from torch.nn.attention import flex_attention as _fa
from torch._higher_order_ops.flex_attention import flex_attention as flex_hop
q, k, v = (torch.randn(1, 2, 64, 16) for _ in range(3))
def f(q, k, v):
    opts = _fa._apply_kernel_options(q, k, v, False, None, None)
    return flex_hop(q, k, v, lambda s, b, h, qi, ki: s * 0.75 + 0.125, _fa._create_empty_block_mask(q, k).as_tuple(),
                    0.25, opts)[0]
compiled = torch.compile(f, backend="hintbackend", options={"dump_dir": sys.argv[1], "cache_dir": sys.argv[2]})
torch.save(compiled(q, k, v), sys.argv[1] + "/out.pt")
"""


def test_a_second_process_takes_the_kernel_from_the_cache(tmp_path):
    import subprocess
    import sys

    cache = tmp_path / "cache"
    texts, outs = [], []
    for tag in ("first", "second"):
        d = tmp_path / tag
        d.mkdir()
        subprocess.run([sys.executable, "-c", CACHE_SCRIPT, str(d), str(cache)], check=True,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        texts.append(kernels_text(d))
        outs.append(torch.load(d / "out.pt"))
    assert "compiled in" in texts[0], texts[0]
    assert "from the kernel cache" in texts[1], texts[1]
    assert len(list((cache / "kernels").glob("*.so"))) == 1
    # The same kernel on the same inputs; not bitwise: its tile products are MKL's sgemm, whose rounding may
    # follow the buffers' alignment, which differs between processes (seen once in CI, in the last digits).
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-6, atol=1e-7)
