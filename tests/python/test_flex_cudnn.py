"""FlexAttention on cuDNN (kernel selection picks it on CUDA for fp16/bf16 with no mask, causal or a causal
sliding window, and a score_mod that is the identity, a kv-independent row shift or an additive bias):
outputs, logsumexp, q/k/v and buffer gradients against a float64 reference on fresh random inputs, no worse than twice eager bf16/fp16 flex's own error against the same
reference; the kernels dump says cuDNN ran; deterministic=True gives bitwise-equal gradients run to run;
a backward that gets a logsumexp gradient stays on the reference, and says why.
CUDA only (HINTBACKEND_TEST_DEVICE=cuda); CI checks the selection from IR text
(tests/cpp/core/flex_lowering_test.cpp)."""

import os

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

from conftest import device
from helpers import graph_dirs
from hintbackend import hinted_context
from hintbackend.options import parse_options

pytestmark = pytest.mark.skipif(device() != "cuda", reason="cuDNN runs on CUDA (HINTBACKEND_TEST_DEVICE=cuda)")
OPTS = parse_options({})


def causal(b, h, q, kv):
    return q >= kv


def window(b, h, q, kv):
    return (q >= kv) & (q - kv < 64)


MASKS = {"none": None, "causal": causal, "window": window}
# (B, Hq, Hkv, S, D): GQA, S % 128 != 0; head dims 64, 128 and 256 (the largest the lowering sends to cuDNN)
EACH_HEAD_DIM = pytest.mark.parametrize(
    "shape", [(2, 4, 4, 256, 64), (1, 8, 2, 200, 128), (1, 4, 2, 200, 256)], ids=["d64", "d128", "d256"])


def rel(x, ref):
    return ((x.double() - ref).norm() / ref.norm()).item()


def run(fn, q, k, v, dout):
    """(out, logsumexp, dq, dk, dv): the gradients of a training step (the logsumexp unused, as in a
    model), the logsumexp from a no-grad call (a returned logsumexp that requires grad gives the backward
    a logsumexp gradient, which cuDNN does not take: that backward runs on the reference)."""
    q, k, v = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = fn(q, k, v, False)
    out.backward(dout)
    with torch.no_grad():
        lse = fn(q, k, v, True)[1]
    return out, lse, q.grad, k.grad, v.grad


def flex_step(compile_dir, dtype, q, k, v, dout, score_mod, bm, deterministic=False):
    """run() of flex_attention (GQA where k has fewer heads than q) on q, k, v and dout cast to `dtype`, in
    hinted_context(deterministic=...): eager where compile_dir is None, else compiled with hintbackend,
    its dumps in compile_dir."""
    def attn(q, k, v, lse):
        with hinted_context(deterministic=deterministic):
            return flex_attention(q, k, v, score_mod=score_mod, block_mask=bm, enable_gqa=q.size(1) != k.size(1),
                                  return_lse=lse)

    fn = attn
    if compile_dir:
        torch._dynamo.reset()
        fn = torch.compile(attn, backend="hintbackend", options={"dump_dir": compile_dir})
    return run(fn, q.to(dtype), k.to(dtype), v.to(dtype), dout.to(dtype))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mask", list(MASKS))
@EACH_HEAD_DIM
def test_cudnn_flex_matches_float64(tmp_path, dtype, mask, shape):
    B, Hq, Hkv, S, D = shape
    torch.manual_seed(hash((str(dtype), mask, shape)) % 2**31)
    q = torch.randn(B, Hq, S, D, device="cuda", dtype=dtype)
    k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=dtype) for _ in range(2))
    dout = torch.randn(B, Hq, S, D, device="cuda", dtype=dtype)
    bm = create_block_mask(MASKS[mask], None, None, S, S, device="cuda") if MASKS[mask] else None
    gqa = Hq != Hkv

    def attn(q, k, v, lse):
        return flex_attention(q, k, v, block_mask=bm, enable_gqa=gqa, return_lse=lse)

    torch._dynamo.reset()
    compiled = torch.compile(attn, backend="hintbackend", options={"dump_dir": str(tmp_path)})
    got = run(compiled, q, k, v, dout)
    eager = run(attn, q, k, v, dout)  # flex's own math path in this dtype
    ref = run(lambda *a: attn(*a), q.double(), k.double(), v.double(), dout.double())
    for name, g, e, r in zip(("out", "lse", "dq", "dk", "dv"), got, eager, ref):
        err, eager_err = rel(g, r), rel(e, r)
        assert err <= 2 * eager_err + 1e-5, f"{name}: {err:.3g} vs eager {eager_err:.3g}"
    kernels = "".join(open(os.path.join(tmp_path, d, "kernels.txt")).read() for d in graph_dirs(tmp_path))
    assert "flex-attention-cudnn" in kernels and "flex-attention-backward-cudnn" in kernels, kernels


def test_deterministic_backward_is_bitwise_repeatable(tmp_path):
    torch.manual_seed(0)
    q, k, v, dout = (torch.randn(2, 4, 512, 64, device="cuda", dtype=torch.bfloat16) for _ in range(4))

    def attn(q, k, v, lse):
        with hinted_context(deterministic=True):
            return flex_attention(q, k, v, return_lse=lse)

    torch._dynamo.reset()
    compiled = torch.compile(attn, backend="hintbackend", options={"dump_dir": str(tmp_path)})
    first = run(compiled, q, k, v, dout)
    second = run(compiled, q, k, v, dout)
    for a, b in zip(first[2:], second[2:]):
        assert torch.equal(a, b)
    kernels = "".join(open(os.path.join(tmp_path, d, "kernels.txt")).read() for d in graph_dirs(tmp_path))
    assert "cudnn: no mask, identity score_mod, deterministic" in kernels, kernels


def test_a_logsumexp_gradient_keeps_the_reference_backward(tmp_path):
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 128, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))

    def attn(q, k, v):
        out, lse = flex_attention(q, k, v, return_lse=True)
        return out.float().sum() + lse.sum()

    torch._dynamo.reset()
    torch.compile(attn, backend="hintbackend", options={"dump_dir": str(tmp_path)})(q, k, v).backward()
    got = [t.grad.clone() for t in (q, k, v)]
    ref = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    attn(*ref).backward()
    for g, r in zip(got, ref):
        torch.testing.assert_close(g.double(), r.grad, rtol=2e-2, atol=2e-2)
    kernels = "".join(open(os.path.join(tmp_path, d, "kernels.txt")).read() for d in graph_dirs(tmp_path))
    assert "flex-attention-cudnn" in kernels, kernels
    assert "not cuDNN: the backward takes a logsumexp gradient" in kernels, kernels


@pytest.mark.parametrize("bias", ["query", "head"])
def test_learned_kv_independent_bias_runs_on_cudnn(tmp_path, bias):
    """score + qb[q_idx] or score + hb[h] (learned, requires grad): softmax is shift-invariant per row, so
    cuDNN runs the identity attention; the output and q/k/v gradients match float64, the logsumexp
    moves by the bias, and the bias's gradient is zero (no logsumexp gradient), as the reference's is."""
    torch.manual_seed(1 if bias == "query" else 2)
    B, H, S, D = 2, 4, 256, 64
    q, k, v, dout = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    table = torch.randn(S if bias == "query" else H, device="cuda")
    bm = create_block_mask(causal, None, None, S, S, device="cuda")

    def make(buf):
        def score_mod(score, b, h, q_idx, kv_idx):
            return score + (buf[q_idx] if bias == "query" else buf[h])

        def attn(q, k, v, lse):
            return flex_attention(q, k, v, score_mod=score_mod, block_mask=bm, return_lse=lse)
        return attn

    def step(fn_of, dtype, buf):
        buf = buf.detach().clone().to(dtype).requires_grad_(True)
        out = run(fn_of(buf), q.to(dtype), k.to(dtype), v.to(dtype), dout.to(dtype))
        return out, buf.grad

    torch._dynamo.reset()
    got, got_gbuf = step(lambda b: torch.compile(make(b), backend="hintbackend", options={"dump_dir": str(tmp_path)}),
                         torch.bfloat16, table)
    eager, _ = step(make, torch.bfloat16, table)
    ref, ref_gbuf = step(make, torch.float64, table)
    for name, g, e, r in zip(("out", "lse", "dq", "dk", "dv"), got, eager, ref):
        err, eager_err = rel(g, r), rel(e, r)
        assert err <= 2 * eager_err + 1e-5, f"{name}: {err:.3g} vs eager {eager_err:.3g}"
    assert ref_gbuf.abs().max().item() < 1e-9  # the math says zero; float64 agrees
    assert got_gbuf is not None and torch.equal(got_gbuf, torch.zeros_like(got_gbuf))
    kernels = "".join(open(os.path.join(tmp_path, d, "kernels.txt")).read() for d in graph_dirs(tmp_path))
    assert "flex-attention-backward-cudnn" in kernels and "kv-independent term" in kernels, kernels


# score + t(b, h, q_idx, kv_idx): cuDNN adds t as a materialized bias; dBias goes back into t's buffers
# through the joint graph's scatter. (name, buffer shape (from B, H, S), buffer dtype, requires grad, score_mod)
BIASES = {
    # the demo's learned relative bias, fp32 and bf16 buffers (Inductor cannot compile the fp32 one)
    "relative": (lambda B, H, S: (2 * S - 1, H), torch.float32, True,
                 lambda buf, S: lambda s, b, h, q, kv: s + buf[q - kv + S - 1, h]),
    "relative_bf16": (lambda B, H, S: (2 * S - 1, H), torch.bfloat16, True,
                      lambda buf, S: lambda s, b, h, q, kv: s + buf[q - kv + S - 1, h]),
    # the same table transposed and read backwards: lb[h, kv - q + S - 1]
    "relative_t": (lambda B, H, S: (H, 2 * S - 1), torch.float32, True,
                   lambda buf, S: lambda s, b, h, q, kv: s + buf[h, kv - q + S - 1]),
    # ALiBi: a captured slope per head, no gradient (no dBias asked of cuDNN)
    "alibi": (lambda B, H, S: (H,), torch.float32, False,
              lambda buf, S: lambda s, b, h, q, kv: s + buf[h] * (kv - q)),
    # a relative-position score_mod with no buffer at all
    "relpos": (None, None, False, lambda buf, S: lambda s, b, h, q, kv: s + (q - kv) * 0.01),
    # a dense learned bias, as users move an SDPA attn_mask to flex, per batch and head
    "dense": (lambda B, H, S: (B, H, S, S), torch.float32, True,
              lambda buf, S: lambda s, b, h, q, kv: s + buf[b, h, q, kv]),
    # ... in bf16: cuDNN takes it as it is (exact), no float32 copy
    "dense_bf16": (lambda B, H, S: (B, H, S, S), torch.bfloat16, True,
                   lambda buf, S: lambda s, b, h, q, kv: s + buf[b, h, q, kv]),
    # a key-padding-style bias read by kv_idx alone
    "key": (lambda B, H, S: (S,), torch.float32, True, lambda buf, S: lambda s, b, h, q, kv: s + buf[kv]),
}


@pytest.mark.parametrize("bias", list(BIASES))
@EACH_HEAD_DIM
def test_kv_dependent_bias_matches_float64(tmp_path, bias, shape):
    B, Hq, Hkv, S, D = shape
    buf_shape, buf_dtype, wants_grad, make_mod = BIASES[bias]
    torch.manual_seed(hash((bias, shape)) % 2**31)
    q = torch.randn(B, Hq, S, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    dout = torch.randn(B, Hq, S, D, device="cuda", dtype=torch.bfloat16)
    table = torch.randn(buf_shape(B, Hq, S), device="cuda") if buf_shape else None
    bm = create_block_mask(causal, None, None, S, S, device="cuda")

    def step(compile_dir, dtype):
        buf = None
        if table is not None:
            buf = table.to(dtype if dtype == torch.float64 else buf_dtype).detach().clone().requires_grad_(wants_grad)

        def attn(q, k, v, lse):
            with hinted_context(kernel="cudnn"):  # the default takes a float32 table's gradient elsewhere
                return flex_attention(q, k, v, score_mod=make_mod(buf, S), block_mask=bm, enable_gqa=Hq != Hkv,
                                      return_lse=lse)

        fn = attn
        if compile_dir:
            torch._dynamo.reset()
            fn = torch.compile(attn, backend="hintbackend", options={"dump_dir": compile_dir})
        out = run(fn, q.to(dtype), k.to(dtype), v.to(dtype), dout.to(dtype))
        return out + ((buf.grad,) if wants_grad else ())

    got = step(str(tmp_path), torch.bfloat16)
    eager = step(None, torch.bfloat16)
    ref = step(None, torch.float64)
    for name, g, e, r in zip(("out", "lse", "dq", "dk", "dv", "dbuf"), got, eager, ref):
        err, eager_err = rel(g, r), rel(e, r)
        # cuDNN 9.19 writes dBias in q's dtype only (hintbackend warns once): every score gradient is rounded
        # to bf16 before the buffer sums it, which measured 2.0-3.3x eager's float32 error (the most where a
        # key bias sums H*S of them). Held to 4x here, where kernel="cudnn" asks for it: by default such a
        # backward runs on the generated kernel (test_float_table_gradient_goes_to_the_generated_backward).
        factor = 4 if name == "dbuf" else 2
        assert err <= factor * eager_err + 1e-5, f"{name}: {err:.3g} vs eager {eager_err:.3g}"
    kernels = "".join(open(os.path.join(tmp_path, d, "kernels.txt")).read() for d in graph_dirs(tmp_path))
    assert "flex-attention-backward-cudnn" in kernels, kernels
    if bias in ("alibi", "relpos"):  # no learned buffer: cuDNN evaluates the term itself, nothing materialized
        assert "score_mod as cuDNN pointwise nodes" in kernels and "materialized" not in kernels, kernels
        return
    assert "adds a bias cuDNN takes materialized" in kernels, kernels
    assert ("dBias scattered" in kernels) == wants_grad, kernels
    # Tables read along diagonals and dense biases skip the grid evaluation and the scatter.
    layout = {"relative": "toeplitz", "relative_bf16": "toeplitz", "relative_t": "toeplitz",
              "dense": "dense buf0[b, h, q_idx, kv_idx]", "dense_bf16": "dense buf0[b, h, q_idx, kv_idx]"}.get(
                  bias, "evaluated on the index grid")
    assert layout in kernels, kernels


@pytest.mark.parametrize("bias", ["relative", "relative_t"])
@pytest.mark.parametrize("S", [256, 200])
def test_deterministic_relative_bias_gradient_is_bitwise_repeatable(tmp_path, bias, S):
    """deterministic=True: the learned table's gradient (cuDNN's dBias summed along diagonals) comes from
    a reduction with no atomics, the same bits run after run, and as accurate as the default's."""
    B, H, D = 2, 4, 64
    buf_shape, _, _, make_mod = BIASES[bias]
    torch.manual_seed(S)
    q, k, v, dout = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    table = torch.randn(buf_shape(B, H, S), device="cuda")
    bm = create_block_mask(causal, None, None, S, S, device="cuda")

    def grad_of(dtype, compiled, deterministic):  # q, k, v in dtype; the table in float32 (float64 for the reference)
        buf = table.to(torch.float64 if dtype == torch.float64 else torch.float32).detach().clone().requires_grad_(True)

        def attn(q, k, v):
            with hinted_context(deterministic=deterministic, kernel="cudnn"):
                return flex_attention(q, k, v, score_mod=make_mod(buf, S), block_mask=bm)

        fn = attn
        if compiled:
            torch._dynamo.reset()
            fn = torch.compile(attn, backend="hintbackend", options={"dump_dir": str(tmp_path / str(deterministic))})
        fn(*(t.to(dtype) for t in (q, k, v))).backward(dout.to(dtype))
        return buf.grad

    first, second = grad_of(torch.bfloat16, True, True), grad_of(torch.bfloat16, True, True)
    assert torch.equal(first, second)
    default = grad_of(torch.bfloat16, True, False)
    ref, eager = grad_of(torch.float64, False, False), grad_of(torch.bfloat16, False, False)
    assert rel(first, ref) <= 4 * rel(eager, ref) + 1e-5  # the dBias-in-bf16 bound of the test above
    torch.testing.assert_close(first, default, rtol=1e-4, atol=1e-4)  # the same sums in another order
    kernels = "".join(open(os.path.join(tmp_path / "True", d, "kernels.txt")).read() for d in graph_dirs(tmp_path / "True"))
    assert "toeplitz" in kernels and "deterministic" in kernels, kernels


@pytest.mark.parametrize("bias,shape,deterministic", [
    (None, (2, 8, 8, 1000, 128), False),     # the float32 dQ accumulator; S % 128 != 0
    (None, (2, 8, 2, 640, 64), True),        # deterministic: dP; GQA: the per-q-head partials
    ("relative", (2, 8, 8, 1000, 128), False),  # dBias: dP, padded to 1024 x 1024
    ("dense", (1, 4, 4, 256, 64), False),
])
def test_cudnn_workspace_is_within_the_plan_s_model(bias, shape, deterministic):
    """The workspace cuDNN asks for (CompiledGraph.kernel_workspace_bytes after a step) is at most what the
    memory plan counts for it (cudnn_workspace_model, the model in codegen/FlexLowering.cpp), and a
    backward's at least half of it: the plan neither misses cuDNN's memory nor books far too much."""
    from hintbackend.backend import compiled_graphs

    B, H, Hkv, S, D = shape
    torch.manual_seed(S)
    q = torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(2))
    mod = None
    if bias:
        buf_shape, buf_dtype, _, make_mod = BIASES[bias]
        buf = torch.randn(buf_shape(B, H, S), device="cuda", dtype=buf_dtype, requires_grad=True)
        mod = make_mod(buf, S)

    def attn(q, k, v):
        with hinted_context(deterministic=deterministic, kernel="cudnn"):
            return flex_attention(q, k, v, score_mod=mod, enable_gqa=H != Hkv)

    torch._dynamo.reset()
    fn = torch.compile(attn, backend="hintbackend", options={"compile_cache": False})
    with compiled_graphs() as graphs:
        fn(q, k, v).backward(torch.randn_like(q))
        torch.cuda.synchronize()
    kinds = {name.split("_")[0]: g for name, g in graphs}
    assert set(kinds) == {"forward", "backward"}, [name for name, _ in graphs]
    for kind, g in kinds.items():
        model = g.cudnn_workspace_model
        assert len(model) == 1, (kind, model, g.kernels)  # the one flex node, on cuDNN
        planned, reported = model[0][1], g.kernel_workspace_bytes
        assert reported <= planned, (kind, reported, planned)
        if kind == "backward":
            assert reported >= planned / 2, (kind, reported, planned)


@pytest.mark.parametrize("buf_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("deterministic", [False, True])
def test_relative_bias_in_dfs_slices_matches_float64(tmp_path, buf_dtype, deterministic):
    """A learned relative bias in a dfs region sliced along batch and heads (slice_dims=[0, 1], 4 slices of
    2 heads): each slice's score_mod reads its global head from slice-schedule's index table,
    lb[q - kv + S - 1, table[b, h]], which cuDNN's path still gathers along diagonals (the kernels dump
    names the map) instead of evaluating it on the index grid; the table's gradient is the slices' parts
    summed. Outputs, logsumexp and every gradient against float64, as the unsliced run is held;
    deterministic=True gives the same bits twice."""
    B, H, S, D = 2, 4, 256, 64
    torch.manual_seed(11)
    q, k, v, dout = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    table = torch.randn(2 * S - 1, H, device="cuda")
    bm = create_block_mask(causal, None, None, S, S, device="cuda")

    def step(dtype, name=None):
        buf = table.to(torch.float64 if dtype == torch.float64 else buf_dtype).detach().clone().requires_grad_(True)

        def mod(s, b, h, qi, kv):
            return s + buf[qi - kv + S - 1, h]

        def attn(q, k, v, lse):
            if name is None:
                return flex_attention(q, k, v, score_mod=mod, block_mask=bm, return_lse=lse)
            with hinted_context(schedule="dfs", slice_dims=[0, 1], slices=4, deterministic=deterministic,
                                kernel="cudnn"):
                return flex_attention(q, k, v, score_mod=mod, block_mask=bm, return_lse=lse)

        fn = attn
        if name is not None:
            torch._dynamo.reset()
            fn = torch.compile(attn, backend="hintbackend", options={"strict": True, "dump_dir": str(tmp_path / name)})
        return run(fn, *(t.to(dtype) for t in (q, k, v, dout))) + (buf.grad,)

    got = step(torch.bfloat16, "dfs")
    eager, ref = step(torch.bfloat16), step(torch.float64)
    for name, g, e, r in zip(("out", "lse", "dq", "dk", "dv", "dbuf"), got, eager, ref):
        err, eager_err = rel(g, r), rel(e, r)
        factor = 4 if name == "dbuf" else 2  # dBias in bf16 (test_kv_dependent_bias_matches_float64)
        assert err <= factor * eager_err + 1e-5, f"{name}: {err:.3g} vs eager {eager_err:.3g}"
    if deterministic:
        assert torch.equal(step(torch.bfloat16, "dfs2")[-1], got[-1])
    dirs = graph_dirs(tmp_path / "dfs")
    kernels = "".join(open(os.path.join(tmp_path / "dfs", d, "kernels.txt")).read() for d in dirs)
    ir = "".join(open(os.path.join(tmp_path / "dfs", d, "ir-final.txt")).read() for d in dirs)
    assert "slices=4, extent=8" in ir, ir
    assert "flex-attention-backward-cudnn" in kernels, kernels
    assert "(toeplitz buf0[q_idx - kv_idx + 255, buf1[b, h]])" in kernels, kernels
    assert "evaluated on the index grid" not in kernels, kernels


def held_to_float64(step, tmp_path, dbuf_factor):
    """step(dtype, compiled) -> (out, lse, dq, dk, dv, dbuf): the compiled bf16 run within 2x (the buffer's
    gradient: dbuf_factor x) eager bf16's error against float64; returns the kernels dump under tmp_path."""
    got, eager, ref = step(torch.bfloat16, True), step(torch.bfloat16, False), step(torch.float64, False)
    for name, g, e, r in zip(("out", "lse", "dq", "dk", "dv", "dbuf"), got, eager, ref):
        err, eager_err = rel(g, r), rel(e, r)
        factor = dbuf_factor if name == "dbuf" else 2
        assert err <= factor * eager_err + 1e-5, f"{name}: {err:.3g} vs eager {eager_err:.3g}"
    return "".join(open(os.path.join(tmp_path, d, "kernels.txt")).read() for d in graph_dirs(tmp_path))


def test_relative_bias_read_through_a_head_permutation(tmp_path):
    """lb[q - kv + S - 1, perm[h]] with a captured int64 head permutation, one entry negative (wrapped as
    an index wraps it): a Toeplitz read through a head map on cuDNN's path, against float64."""
    B, H, S, D = 2, 4, 200, 64
    torch.manual_seed(12)
    q, k, v, dout = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    table = torch.randn(2 * S - 1, H, device="cuda")
    perm = torch.tensor([2, 0, -1, 1], device="cuda")  # -1: the last column
    bm = create_block_mask(causal, None, None, S, S, device="cuda")

    def step(dtype, compiled):
        buf = table.to(torch.float64 if dtype == torch.float64 else torch.float32).detach().clone().requires_grad_(True)

        def attn(q, k, v, lse):
            with hinted_context(kernel="cudnn"):
                return flex_attention(q, k, v, score_mod=lambda s, b, h, qi, kv: s + buf[qi - kv + S - 1, perm[h]],
                                      block_mask=bm, return_lse=lse)

        fn = attn
        if compiled:
            torch._dynamo.reset()
            fn = torch.compile(attn, backend="hintbackend", options={"dump_dir": str(tmp_path)})
        return run(fn, *(t.to(dtype) for t in (q, k, v, dout))) + (buf.grad,)

    kernels = held_to_float64(step, tmp_path, dbuf_factor=4)
    # (Dynamo lifts the buffers in the order the score_mod reads them: perm is buf0.)
    assert "(toeplitz buf1[q_idx - kv_idx + 199, buf0[h]])" in kernels, kernels


@pytest.mark.skipif(not OPTS.nvcc or not OPTS.cutlass_include, reason="needs nvcc and CUTLASS's headers")
@pytest.mark.parametrize("dfs", [False, True])
def test_float_table_gradient_goes_to_the_generated_backward(tmp_path, dfs):
    """By default, a float32 table whose gradient cuDNN would give in bf16 (its dBias) has its backward on
    the generated kernel, which adds the gradient in float32, and its forward with it (partition.py marks
    the table as getting a gradient): every result within 2x eager's error against float64, the table's
    gradient included (cuDNN's is held to 4x above). With dfs, inside slice loops over batch and heads."""
    B, H, S, D = 2, 4, 256, 64
    torch.manual_seed(13)
    q, k, v, dout = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    table = torch.randn(2 * S - 1, H, device="cuda")
    bm = create_block_mask(causal, None, None, S, S, device="cuda")

    def step(dtype, compiled):
        buf = table.to(torch.float64 if dtype == torch.float64 else torch.float32).detach().clone().requires_grad_(True)

        def mod(s, b, h, qi, kv):
            return s + buf[qi - kv + S - 1, h]

        def attn(q, k, v, lse):
            if not dfs:
                return flex_attention(q, k, v, score_mod=mod, block_mask=bm, return_lse=lse)
            with hinted_context(schedule="dfs", slice_dims=[0, 1], slices=4):
                return flex_attention(q, k, v, score_mod=mod, block_mask=bm, return_lse=lse)

        fn = attn
        if compiled:
            torch._dynamo.reset()
            fn = torch.compile(attn, backend="hintbackend", options={"dump_dir": str(tmp_path)})
        return run(fn, *(t.to(dtype) for t in (q, k, v, dout))) + (buf.grad,)

    kernels = held_to_float64(step, tmp_path, dbuf_factor=2)
    assert "flex-attention-fused" in kernels and "flex-attention-backward-fused" in kernels, kernels
    assert "not cuDNN: its dBias is bfloat16 only: buffer 0's float gradient would carry that rounding" in kernels
    assert "(the backward runs on the generated kernel)" in kernels, kernels  # the forward's reason


# score_mods cuDNN evaluates as pointwise nodes inside its kernel (no learned buffer). The backward runs
# there too where the score_mod's derivative is 1 (score + t), and for a soft cap through cuDNN's own
# Softcap modifier; a temperature or a where() keep the reference backward on cuDNN 9.19
# (codegen/FlexLowering.cpp, score_pointwise, says why).
POINTWISE = {
    "relpos": (None, lambda buf: lambda s, b, h, q, kv: s + (q - kv) * 0.01),
    "alibi": (lambda H, S: (H,), lambda buf: lambda s, b, h, q, kv: s - buf[h] * (q - kv).abs()),
    "softcap": (None, lambda buf: lambda s, b, h, q, kv: 30 * torch.tanh(s / 30)),
    "softcap_small": (None, lambda buf: lambda s, b, h, q, kv: 2 * torch.tanh(s / 2)),
    # a per-query temperature from a captured buffer (no gradient)
    "temperature": (lambda H, S: (S,), lambda buf: lambda s, b, h, q, kv: s * buf[q]),
    # ALiBi written with torch.where: the slope only below the diagonal
    "where": (lambda H, S: (H,), lambda buf: lambda s, b, h, q, kv: torch.where(q >= kv, s - buf[h] * (q - kv), s)),
}


@pytest.mark.parametrize("mod", list(POINTWISE))
@pytest.mark.parametrize("mask", ["none", "causal", "window"])
@EACH_HEAD_DIM
def test_pointwise_score_mod_matches_float64(tmp_path, mod, mask, shape):
    B, Hq, Hkv, S, D = shape
    buf_shape, make_mod = POINTWISE[mod]
    torch.manual_seed(hash((mod, mask, shape)) % 2**31)
    q = torch.randn(B, Hq, S, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    dout = torch.randn(B, Hq, S, D, device="cuda", dtype=torch.bfloat16)
    table = torch.rand(buf_shape(Hq, S), device="cuda") + 0.5 if buf_shape else None
    bm = create_block_mask(MASKS[mask], None, None, S, S, device="cuda") if MASKS[mask] else None

    def step(compile_dir, dtype):
        buf = table.to(torch.float64 if dtype == torch.float64 else torch.float32) if table is not None else None
        return flex_step(compile_dir, dtype, q, k, v, dout, make_mod(buf), bm)

    got = step(str(tmp_path), torch.bfloat16)
    eager = step(None, torch.bfloat16)
    ref = step(None, torch.float64)
    for name, g, e, r in zip(("out", "lse", "dq", "dk", "dv"), got, eager, ref):
        err, eager_err = rel(g, r), rel(e, r)
        assert err <= 2 * eager_err + 1e-5, f"{name}: {err:.3g} vs eager {eager_err:.3g}"
    kernels = "".join(open(os.path.join(tmp_path, d, "kernels.txt")).read() for d in graph_dirs(tmp_path))
    if mod.startswith("softcap"):  # cuDNN's own Softcap modifier, forward and backward
        assert "flex-attention-backward-cudnn" in kernels and "cuDNN's Softcap modifier" in kernels, kernels
        return
    assert "flex-attention-cudnn" in kernels and "score_mod as cuDNN pointwise nodes" in kernels, kernels
    if mod in ("relpos", "alibi"):
        assert "flex-attention-backward-cudnn" in kernels and "cuDNN's default backward" in kernels, kernels
    else:  # the generated CUDA kernel where it can be built, else the reference; either says why not cuDNN
        assert ("flex-attention-backward-fused" in kernels or "flex-attention-backward-reference" in kernels) and \
            "d score_mod / d score != 1" in kernels, kernels


@pytest.mark.parametrize("score", ["identity", "query_bias"])
@pytest.mark.parametrize("with_causal", [False, True])
def test_kv_padding_mask_runs_on_cudnn_with_sequence_lengths(tmp_path, with_causal, score):
    """kv_idx < lengths[b] (a captured per-batch key length; with causal too): cuDNN's padding mask. The
    lengths cover an empty batch (every score masked: flex gives zeros, a logsumexp of -inf and no
    gradient), one key, a partial length and one past S; outputs, logsumexp and gradients against float64
    within 2x eager's error, the empty batch exactly as flex defines it."""
    B, H, S, D = 4, 4, 200, 64
    torch.manual_seed(17 + with_causal + 2 * (score == "query_bias"))
    lengths = torch.tensor([0, 1, 137, 250], device="cuda", dtype=torch.int32)
    q, k, v, dout = (torch.randn(B, H, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    qb = torch.randn(S, device="cuda")

    def mask(b, h, qi, kv):
        m = kv < lengths[b]
        return (qi >= kv) & m if with_causal else m

    bm = create_block_mask(mask, B, None, S, S, device="cuda")

    def step(compile_dir, dtype):
        buf = qb.to(torch.float64 if dtype == torch.float64 else torch.float32).detach().clone().requires_grad_(True)

        def score_mod(s, b, h, qi, kv):
            return s + buf[qi] if score == "query_bias" else s

        def attn(q, k, v, lse):
            return flex_attention(q, k, v, score_mod=score_mod, block_mask=bm, return_lse=lse)

        fn = attn
        if compile_dir:
            torch._dynamo.reset()
            fn = torch.compile(attn, backend="hintbackend", options={"dump_dir": compile_dir})
        out = run(fn, q.to(dtype), k.to(dtype), v.to(dtype), dout.to(dtype))
        return out + ((buf.grad,) if score == "query_bias" else ())

    got = step(str(tmp_path), torch.bfloat16)
    eager = step(None, torch.bfloat16)
    ref = step(None, torch.float64)
    for name, g, e, r in zip(("out", "lse", "dq", "dk", "dv", "dqb"), got, eager, ref):
        if name == "dqb":  # a row shift's buffer: zero gradient (the logsumexp is unused)
            assert g is None or torch.count_nonzero(g) == 0, g
            continue
        if name == "lse":  # the empty batch: -inf, as flex gives
            assert torch.all(torch.isneginf(g[0])) and torch.all(torch.isneginf(r[0])), g[0]
            g, e, r = g[1:], e[1:], r[1:]
        else:
            assert torch.count_nonzero(g[0]) == 0, name  # the empty batch: zeros, no gradient
        assert torch.isfinite(g).all(), name
        err, eager_err = rel(g, r), rel(e, r)
        assert err <= 2 * eager_err + 1e-5, f"{name}: {err:.3g} vs eager {eager_err:.3g}"
    kernels = "".join(open(os.path.join(tmp_path, d, "kernels.txt")).read() for d in graph_dirs(tmp_path))
    assert "flex-attention-cudnn" in kernels and "flex-attention-backward-cudnn" in kernels, kernels
    assert "kv padding (kv_idx < mask buffer 0[b]" in kernels, kernels


# cuDNN's backward in calls of whole batches, or of kv heads of one batch (cudnn_backward_group,
# codegen/FlexLowering.h: at least 1024 key tiles of 64 a call), so its float dQ accumulator is one call's.
# ALiBi's slope per head is an input that each call's graph gets narrowed to its heads.
ALIBI = ((lambda B, H: (H,)), lambda buf: lambda s, b, h, q, kv: s - buf[h] * (q - kv).abs())
GROUPED = {
    # (B, Hq, Hkv, S, D), mask, score_mod (buffer shape, mod), deterministic, what the dump says
    "batches": ((8, 16, 16, 1024, 64), "causal", ALIBI, False, "2 calls of 4 batches"),
    "gqa_deterministic": ((16, 16, 8, 1024, 64), "none", None, True, "2 calls of 8 batches"),
    "heads": ((1, 32, 32, 4096, 64), "causal", ALIBI, False, "2 calls of 16 kv heads"),
}


@pytest.mark.parametrize("case", list(GROUPED))
def test_backward_in_calls_of_batches_or_heads_matches_float64(tmp_path, case):
    (B, Hq, Hkv, S, D), mask, mod, deterministic, calls = GROUPED[case]
    torch.manual_seed(hash(case) % 2**31)
    q = torch.randn(B, Hq, S, D, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(B, Hkv, S, D, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    dout = torch.randn(B, Hq, S, D, device="cuda", dtype=torch.bfloat16)
    table = torch.rand(mod[0](B, Hq), device="cuda") * 0.1 if mod else None
    bm = create_block_mask(MASKS[mask], None, None, S, S, device="cuda") if MASKS[mask] else None

    def step(compile_dir, dtype):
        score_mod = mod[1](table.to(torch.float64 if dtype == torch.float64 else torch.float32)) if mod else None
        return flex_step(compile_dir, dtype, q, k, v, dout, score_mod, bm, deterministic)

    got = step(str(tmp_path), torch.bfloat16)
    kernels = "".join(open(os.path.join(tmp_path, d, "kernels.txt")).read() for d in graph_dirs(tmp_path))
    assert "flex-attention-backward-cudnn" in kernels and f"; {calls} (cuDNN's workspace one call's)" in kernels, kernels
    if deterministic:
        again = step(str(tmp_path / "again"), torch.bfloat16)
        for a, b in zip(got[2:], again[2:]):
            assert torch.equal(a, b)
    eager = step(None, torch.bfloat16)
    ref = step(None, torch.float64)
    for name, g, e, r in zip(("out", "lse", "dq", "dk", "dv"), got, eager, ref):
        err, eager_err = rel(g, r), rel(e, r)
        assert err <= 2 * eager_err + 1e-5, f"{name}: {err:.3g} vs eager {eager_err:.3g}"
