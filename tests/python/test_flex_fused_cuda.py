"""FlexAttention on the generated tiled CUDA kernels (hinted_context(kernel="fused") on a GPU; the default
where cuDNN cannot run a node): outputs, logsumexp, q/k/v gradients and captured-buffer gradients against
an independent float64 reference (dense attention with torch's autograd) on fresh random inputs, no worse
than twice the error of the low-precision baseline (eager flex_attention in the same dtype; for buffer
gradients, hintbackend's reference kernel in that dtype). Runs with HINTBACKEND_TEST_DEVICE=cuda where
nvcc and CUTLASS's headers are found; CI (no GPU) checks the generator and an nvcc build of its output in
tests/cpp/core/flex_kernel_gen_test.cpp."""

import zlib

import pytest
import torch
from torch.nn.attention.flex_attention import create_block_mask, flex_attention

import flex_reference
from conftest import device
from flex_reference import SCORE_MODS, causal, dense, kernels_text, outputs_and_grads, rel
from hintbackend import hinted_context
from hintbackend.options import parse_options

OPTS = parse_options({})
pytestmark = pytest.mark.skipif(
    device() != "cuda" or not torch.cuda.is_available() or not OPTS.nvcc or not OPTS.cutlass_include,
    reason="needs HINTBACKEND_TEST_DEVICE=cuda, a GPU, nvcc and CUTLASS's headers")


def window(b, h, q, kv):
    return (q >= kv) & (q - kv < 200)


# The CPU test's score_mods (relative position aside) and a temperature, whose backward cuDNN does not run.
SCORE_MODS = {k: v for k, v in SCORE_MODS.items() if k != "relpos"}
SCORE_MODS["temperature"] = (None, False, lambda buf, S: lambda s, b, h, q, kv: s * 0.7)
# A table read at (q - kv) mod 97: not affine, so no proven line; the kernel's run-time probe finds
# diagonals in most steps, and the steps where they wrap must still add up.
SCORE_MODS["wrapped"] = ((lambda B, H, S: (97, H)), True,
                         lambda buf, S: lambda s, b, h, q, kv: s + buf[(q - kv) % 97, h])
MASKS = {"none": None, "causal": causal, "window": window}


def run_case(tmp_path, score, mask, dtype=torch.bfloat16, shape=(2, 4, 4, 300, 64), buf_dtype=torch.float32,
             with_lse_grad=False, deterministic=False, value_dim=None):
    """kernel="fused" against float64 and the baselines; asserts the bound; returns the kernels dump (with
    deterministic=True: also the fused run's results, and a second run's, which must be bitwise equal).
    value_dim: v's head dim where it is not q's."""
    B, Hq, Hkv, S, D = shape
    Dv = value_dim or D
    buf_shape, wants_grad, make_mod = SCORE_MODS[score]
    torch.manual_seed(zlib.crc32(repr((score, mask, dtype, shape, buf_dtype, with_lse_grad, value_dim)).encode()))
    dev = "cuda"
    q = torch.randn(B, Hq, S, D, dtype=torch.float64, device=dev)
    k = torch.randn(B, Hkv, S, D, dtype=torch.float64, device=dev)
    v = torch.randn(B, Hkv, S, Dv, dtype=torch.float64, device=dev)
    dout = torch.randn(B, Hq, S, Dv, dtype=torch.float64, device=dev)
    dlse = torch.randn(B, Hq, S, dtype=torch.float64, device=dev)
    table = torch.randn(buf_shape(B, Hq, S), dtype=torch.float64, device=dev) if buf_shape else None
    mask_mod = MASKS[mask]
    bm = create_block_mask(mask_mod, None, None, S, S, device=dev) if mask_mod else None

    def step(fn, dt, bdt):
        return outputs_and_grads(fn, q, k, v, dout, dt, table, bdt, make_mod, wants_grad, S,
                                 dlse if with_lse_grad else None)

    def eager(qq, kk, vv, sm):
        return flex_attention(qq, kk, vv, sm, bm, enable_gqa=Hq != Hkv, return_lse=True)

    def reference(qq, kk, vv, sm):
        return dense(qq, kk, vv, sm, mask_mod)

    def compiled(kernel):
        def f(qq, kk, vv, sm):
            with hinted_context(kernel=kernel, **({"deterministic": True} if deterministic and kernel == "fused" else {})):
                return flex_attention(qq, kk, vv, sm, bm, enable_gqa=Hq != Hkv, return_lse=True)

        def call(qq, kk, vv, sm):
            torch._dynamo.reset()
            return torch.compile(f, backend="hintbackend", options={"dump_dir": str(tmp_path / kernel)})(qq, kk, vv, sm)
        return call

    ref = step(reference, torch.float64, torch.float64)
    got = step(compiled("fused"), dtype, buf_dtype)
    base = step(eager, dtype, buf_dtype)
    aten = step(compiled("aten"), dtype, buf_dtype) if wants_grad else None
    names = ["out", "lse", "dq", "dk", "dv", "dbuf"]
    for i, (g, r) in enumerate(zip(got, ref)):
        assert torch.isfinite(g).all(), names[i]
        err = rel(g, r)
        baseline = rel(base[i], r)
        if aten is not None:
            baseline = max(baseline, rel(aten[i], r))
        if r.double().norm() < 1e-9:  # zero in exact arithmetic (a row shift's gradient)
            baseline = max(baseline, 1e-2)
        assert err <= 2 * baseline + 1e-4, f"{names[i]}: {err:.3g} vs baseline {baseline:.3g}"
    kernels = kernels_text(tmp_path / "fused")
    assert "flex-attention-fused" in kernels and "flex-attention-backward-fused" in kernels, kernels
    assert "CUDA, head dim" in kernels, kernels
    if deterministic:
        assert "deterministic: dQ added in key-tile order" in kernels, kernels
        return kernels, got, step(compiled("fused"), dtype, buf_dtype)
    return kernels


@pytest.mark.parametrize("score", list(SCORE_MODS))
def test_cuda_fused_score_mods_under_a_causal_mask(tmp_path, score):
    run_case(tmp_path, score, "causal")


# Ramps (HB_KV_RAMP): score + c * (kv - q), the forward reading the slope once a tile and adding the bias
# along each row; the backward calls score_mod per score. ALiBi under a window's partial blocks at D64 (GQA,
# S 700 ends inside a key tile), a relative position (q - kv) * 0.01 under a causal mask at D128, and a
# learned slope; the joint of a slope that gets no gradient is the identity though it converts the gradient
# (FlexKernelGen.cpp). (Added to SCORE_MODS after the test above took its list.)
SCORE_MODS["relpos"] = flex_reference.SCORE_MODS["relpos"]
SCORE_MODS["alibi_learned"] = ((lambda B, H, S: (H,)), True, flex_reference.SCORE_MODS["alibi"][2])


@pytest.mark.parametrize("score,mask,shape", [
    ("alibi", "window", (1, 4, 2, 700, 64)),
    ("relpos", "causal", (2, 4, 4, 1000, 128)),
    ("alibi_learned", "none", (1, 4, 4, 700, 128)),
])
def test_cuda_fused_ramps(tmp_path, score, mask, shape):
    kernels = run_case(tmp_path, score, mask, shape=shape)
    assert kernels.count("a ramp in kv_idx - q_idx") == 1, kernels  # the forward's
    if score != "alibi_learned":  # a bf16 joint returns _to_copy(grad): still the identity (split schedule)
        assert "joint: identity" in kernels, kernels


# Head dim 128 with the BlockMask's 128-row blocks: the Hopper forward's ping-pong kernel (flex_fwd_pp:
# mbarrier stages, warpgroup turns, P V a tile behind) under a row shift, a soft cap, a slope buffer and a
# partial-block mask, fp16 included; S 700 ends inside a key tile.
@pytest.mark.parametrize("score,mask,dtype", [
    ("query", "causal", torch.bfloat16),
    ("softcap", "window", torch.bfloat16),
    ("alibi", "none", torch.float16),
    ("trig", "window", torch.bfloat16),
])
def test_cuda_fused_head_dim_128(tmp_path, score, mask, dtype):
    run_case(tmp_path, score, mask, dtype=dtype, shape=(1, 4, 2, 700, 128))


# Head dim 128 with 128-key blocks: the Hopper backward's flex_bwd_ws (two consumer warpgroups per 128 keys
# and a dQ writer, FlexTiledKernel.cuh), full blocks on its split schedule (a score_mod per element there), a
# mask's partial blocks and a joint's tiles through bwd_p_ds; S 700 and 1000 end inside a key tile, GQA,
# fp16, and B8 H16 S1024, whose backward runs in four dQ launches on two streams. A buffer gradient: the
# relative bias's diagonals summed per consumer (line_reduce), its steps across a sequence's end adding per
# element, and the wrapped table's run-time probe.
@pytest.mark.parametrize("score,mask,dtype,shape", [
    ("identity", "none", torch.bfloat16, (1, 4, 2, 700, 128)),
    ("identity", "causal", torch.bfloat16, (2, 4, 4, 1000, 128)),
    ("identity", "window", torch.float16, (1, 4, 2, 700, 128)),
    ("identity", "causal", torch.bfloat16, (8, 16, 16, 1024, 128)),
    ("alibi", "causal", torch.bfloat16, (2, 4, 4, 1000, 128)),
    ("alibi", "none", torch.bfloat16, (8, 16, 16, 1024, 128)),
    ("temperature", "none", torch.bfloat16, (1, 8, 2, 1000, 128)),
    ("activations", "window", torch.float16, (1, 4, 2, 700, 128)),
    ("relative", "causal", torch.bfloat16, (2, 4, 4, 1000, 128)),
    ("softcap_relative", "none", torch.float16, (1, 4, 2, 700, 128)),
    ("wrapped", "window", torch.bfloat16, (1, 4, 2, 700, 128)),
])
def test_cuda_fused_hopper_backward_head_dim_128(tmp_path, score, mask, dtype, shape):
    kernels = run_case(tmp_path, score, mask, dtype=dtype, shape=shape)
    if shape[0] == 8:
        assert "on two streams in turn (4 launches, " in kernels, kernels


@pytest.mark.parametrize("mask", ["none", "window"])
@pytest.mark.parametrize("score", ["identity", "relative"])
def test_cuda_fused_masks(tmp_path, score, mask):
    run_case(tmp_path, score, mask)


# Without a BlockMask torch passes one block of 2^30 rows each way, so every walk is many tiles of block 0,
# counted along (WalkPos, Steps in FlexTiledKernel.cuh): S a multiple of the tiles, S ending inside a tile
# under GQA and fp16 with a ramp, a learned relative bias whose gradient the backward scatters.
@pytest.mark.parametrize("score,dtype,shape", [
    ("softcap", torch.bfloat16, (2, 2, 2, 576, 64)),
    ("alibi", torch.float16, (1, 4, 2, 1000, 64)),
    ("relative", torch.bfloat16, (2, 2, 2, 450, 64)),
])
def test_cuda_fused_without_a_block_mask(tmp_path, score, dtype, shape):
    run_case(tmp_path, score, "none", dtype=dtype, shape=shape)


@pytest.mark.parametrize("dtype", [torch.float16])
def test_cuda_fused_float16(tmp_path, dtype):
    run_case(tmp_path, "softcap_relative", "causal", dtype=dtype)


# GQA with D128 and S not a multiple of any tile; MQA with D32; D16; a batch broadcast in the mask.
@pytest.mark.parametrize("shape", [(1, 8, 2, 1000, 128), (2, 4, 1, 130, 32), (1, 2, 2, 256, 16)])
def test_cuda_fused_shapes(tmp_path, shape):
    run_case(tmp_path, "relative", "causal", shape=shape)


# Enough (b, kv head) pairs that the backward sums dQ in float a launch of pairs at a time
# (codegen/FlexKernelAbi.h, flex_dq_pairs: B32 H16 S256 is 512 pairs of 4 key tiles, two launches of 256,
# each with its pairs along the grid's x), its workspace reused between launches: the second launch's rows
# must not carry the first's sums.
@pytest.mark.parametrize("score,mask,deterministic", [("alibi", "causal", False), ("softcap", "none", True)])
def test_cuda_fused_dq_in_launches_of_pairs(tmp_path, score, mask, deterministic):
    result = run_case(tmp_path, score, mask, shape=(32, 16, 16, 256, 64), deterministic=deterministic)
    kernels = result[0] if deterministic else result
    want = ("256 of 512 (b, kv head) pairs a launch (2 launches, 16 MiB)" if deterministic else
            "128 of 512 (b, kv head) pairs a launch, on two streams in turn (4 launches, 16 MiB)")
    assert "dQ summed in float " + want in kernels, kernels
    if deterministic:
        assert torch.equal(result[1][2], result[2][2]), "dq differs between two deterministic runs"


# Since the sixteenth session the dQ launches of several pairs take two streams (the workspace's halves in
# turn, HB_DQ_STREAMS in FlexTiledKernel.cuh): the same case recorded and replayed as CUDA graphs, where the
# side stream's launches join the capture through their events, against float64 on fresh inputs each step.
def test_cuda_fused_dq_launches_on_two_streams_under_cuda_graphs(tmp_path):
    B, H, S, D = 32, 16, 256, 64
    bm = create_block_mask(causal, None, None, S, S, device="cuda")

    def attn(q, k, v):
        with hinted_context(kernel="fused"):
            return flex_attention(q, k, v, block_mask=bm)

    torch._dynamo.reset()
    f = torch.compile(attn, backend="hintbackend", options={"cuda_graphs": True, "dump_dir": str(tmp_path)})
    def run(fn, q, k, v, dout, dtype):  # [out, dq, dk, dv] of sum(fn(q, k, v) * dout), on copies in dtype
        qq, kk, vv = (t.to(dtype).requires_grad_(True) for t in (q, k, v))
        out = fn(qq, kk, vv)
        (out.double() * dout).sum().backward()
        return [out.detach().double(), qq.grad.double(), kk.grad.double(), vv.grad.double()]

    for step in range(3):
        torch.manual_seed(100 + step)
        q, k, v, dout = (torch.randn(B, H, S, D, dtype=torch.float64, device="cuda") for _ in range(4))
        torch.compiler.cudagraph_mark_step_begin()
        got = run(f, q, k, v, dout, torch.bfloat16)
        base = run(lambda qq, kk, vv: flex_attention(qq, kk, vv, block_mask=bm), q, k, v, dout, torch.bfloat16)
        ref = run(lambda qq, kk, vv: dense(qq, kk, vv, None, causal)[0], q, k, v, dout, torch.float64)
        for name, g, b, r in zip(["out", "dq", "dk", "dv"], got, base, ref):
            assert torch.isfinite(g).all(), name
            assert rel(g, r) <= 2 * rel(b, r) + 1e-4, f"step {step} {name}: {rel(g, r):.3g} vs {rel(b, r):.3g}"
    kernels = kernels_text(tmp_path)
    assert "128 of 512 (b, kv head) pairs a launch, on two streams in turn (4 launches, 16 MiB)" in kernels, kernels


# The forward's logsumexp and max_scores (return_aux) against float64 at D64 and D128 (the ping-pong
# forward), with scores that grow along the keys so that the running max moves often.
@pytest.mark.parametrize("D", [64, 128])
def test_cuda_fused_forward_max_scores_and_logsumexp(tmp_path, D):
    from torch.nn.attention.flex_attention import AuxRequest
    B, H, S = 2, 4, 1000
    torch.manual_seed(7 + D)
    q, k, v = (torch.randn(B, H, S, D, dtype=torch.float64, device="cuda") for _ in range(3))
    ramp = torch.linspace(0, 6, S, dtype=torch.float64, device="cuda")
    k = k * (1 + ramp[None, None, :, None])  # later keys score higher: the running max moves
    bm = create_block_mask(causal, None, None, S, S, device="cuda")
    aux = AuxRequest(lse=True, max_scores=True)

    def fused(qq, kk, vv):
        with hinted_context(kernel="fused"):
            return flex_attention(qq, kk, vv, block_mask=bm, return_aux=aux)

    torch._dynamo.reset()
    f = torch.compile(fused, backend="hintbackend", options={"dump_dir": str(tmp_path)})
    lo = [t.to(torch.bfloat16) for t in (q, k, v)]
    out, got = f(*lo)
    eout, eaux = flex_attention(*lo, block_mask=bm, return_aux=aux)
    scores = (q @ k.transpose(-1, -2)) / D ** 0.5
    keep = torch.ones(S, S, dtype=torch.bool, device="cuda").tril()
    scores = scores.masked_fill(~keep, float("-inf"))
    ref_lse, ref_max = torch.logsumexp(scores, -1), scores.amax(-1)
    ref_out = torch.softmax(scores, -1) @ v
    for name, g, e, r in [("out", out, eout, ref_out), ("lse", got.lse, eaux.lse, ref_lse),
                          ("max_scores", got.max_scores, eaux.max_scores, ref_max)]:
        assert torch.isfinite(g).all(), name
        assert rel(g, r) <= 2 * rel(e, r) + 1e-4, f"{name}: {rel(g, r):.3g} vs eager {rel(e, r):.3g}"
    assert "flex-attention-fused" in kernels_text(tmp_path)


# Head dims between the built ones (16, 32, 64, 128; 256 forward only) run on the next one up, q, k, v,
# out and dO padded with zero columns; a value head dim unlike q's takes the built one that holds both.
@pytest.mark.parametrize("shape,value_dim", [((1, 4, 2, 300, 96), None), ((2, 2, 2, 200, 80), None),
                                             ((1, 2, 1, 257, 48), 24), ((1, 4, 4, 300, 64), 128)])
def test_cuda_fused_padded_head_dims(tmp_path, shape, value_dim):
    kernels = run_case(tmp_path, "relative", "causal", shape=shape, value_dim=value_dim)
    assert "padded with zero columns" in kernels, kernels


def test_cuda_fused_forward_head_dim_up_to_256(tmp_path):
    """Inference at head dim 192: the forward kernel built for 256, against float64."""
    torch.manual_seed(11)
    B, H, S, D = 1, 2, 300, 192
    q, k, v = (torch.randn(B, H, S, D, dtype=torch.float64, device="cuda") for _ in range(3))
    bm = create_block_mask(causal, None, None, S, S, device="cuda")
    score_mod = SCORE_MODS["softcap"][2](None, S)

    def f(qq, kk, vv):
        with hinted_context(kernel="fused"):
            return flex_attention(qq, kk, vv, score_mod, bm, return_lse=True)

    ref_out, ref_lse = dense(q, k, v, score_mod, causal)
    lo = [t.bfloat16() for t in (q, k, v)]
    with torch.no_grad():
        out, lse = torch.compile(f, backend="hintbackend", options={"dump_dir": str(tmp_path)})(*lo)
        base_out, base_lse = flex_attention(*lo, score_mod, bm, return_lse=True)
    assert out.shape == (B, H, S, D) and out.is_contiguous()
    assert rel(out, ref_out) <= 2 * rel(base_out, ref_out) + 1e-4
    assert rel(lse, ref_lse) <= 2 * rel(base_lse, ref_lse) + 1e-4
    kernels = kernels_text(tmp_path)
    assert "flex-attention-fused" in kernels and "CUDA, head dim 256 (q/k 192, v 192, padded" in kernels, kernels


def test_cuda_fused_row_shift_runs_once_per_row(tmp_path):
    """A per-query bias only shifts each softmax row: the kernels run the identity and score_mod once per
    row. The forward moves the logsumexp by it (run_case returns the logsumexp, so its backward takes a
    logsumexp gradient and runs score_mod and the joint per element); without return_lse the backward
    takes the shift back per row first and skips the joint (the bias's gradient is zero). Against float64."""
    assert "run once per row (a row shift)" in run_case(tmp_path / "lse", "query", "causal")
    torch.manual_seed(9)
    B, H, S, D = 2, 2, 300, 64
    q, k, v, dout = (torch.randn(B, H, S, D, dtype=torch.float64, device="cuda") for _ in range(4))
    bias = torch.randn(S, dtype=torch.float64, device="cuda")
    bm = create_block_mask(causal, None, None, S, S, device="cuda")

    def run(fn, dtype):
        qq, kk, vv = (t.to(dtype).clone().requires_grad_(True) for t in (q, k, v))
        bb = bias.to(torch.float64 if dtype == torch.float64 else torch.float32).clone().requires_grad_(True)
        out = fn(qq, kk, vv, lambda s, b, h, qi, kv: s + bb[qi])
        (out.double() * dout).sum().backward()
        return [out.detach(), qq.grad, kk.grad, vv.grad, bb.grad]

    def fused(qq, kk, vv, mod):
        with hinted_context(kernel="fused"):
            return flex_attention(qq, kk, vv, mod, bm)

    ref = run(lambda qq, kk, vv, mod: dense(qq, kk, vv, mod, causal)[0], torch.float64)
    base = run(lambda qq, kk, vv, mod: flex_attention(qq, kk, vv, mod, bm), torch.bfloat16)
    torch._dynamo.reset()
    got = run(torch.compile(fused, backend="hintbackend", options={"dump_dir": str(tmp_path / "out")}), torch.bfloat16)
    for name, g, b_, r in zip(["out", "dq", "dk", "dv"], got, base, ref):
        assert rel(g, r) <= 2 * rel(b_, r) + 1e-4, f"{name}: {rel(g, r):.3g} vs eager {rel(b_, r):.3g}"
    assert ref[4].norm() < 1e-9 * bias.numel() and (got[4] == 0).all()  # zero in exact arithmetic; exactly here
    assert kernels_text(tmp_path / "out").count("run once per row (a row shift)") == 2


def test_cuda_fused_row_shift_of_minus_infinity_masks_the_row(tmp_path):
    """A row shift of -inf (score + where(q % 7 == 0, -inf, bias[q])) leaves nothing to attend to in those
    rows: out 0 and logsumexp -inf, as eager flex gives; the other rows match float64."""
    torch.manual_seed(5)
    B, H, S, D = 1, 2, 200, 64
    q, k, v = (torch.randn(B, H, S, D, dtype=torch.float64, device="cuda") for _ in range(3))
    bias = torch.randn(S, dtype=torch.float64, device="cuda")

    def mod(buf):
        return lambda s, b, h, qi, kv: s + torch.where(qi % 7 == 0, float("-inf"), buf[qi])

    def f(qq, kk, vv, buf):
        with hinted_context(kernel="fused"):
            return flex_attention(qq, kk, vv, mod(buf), return_lse=True)

    lo = [t.bfloat16() for t in (q, k, v)]
    with torch.no_grad():
        out, lse = torch.compile(f, backend="hintbackend", options={"dump_dir": str(tmp_path)})(*lo, bias.float())
        base_out, base_lse = flex_attention(*lo, mod(bias.float()), return_lse=True)
    dead = torch.arange(S, device="cuda") % 7 == 0
    assert (out[:, :, dead] == 0).all() and (lse[:, :, dead] == float("-inf")).all()
    assert (base_out[:, :, dead] == 0).all() and (base_lse[:, :, dead] == float("-inf")).all()
    ref_out, ref_lse = dense(q, k, v, mod(bias))
    live = ~dead
    assert rel(out[:, :, live], ref_out[:, :, live]) <= 2 * rel(base_out[:, :, live], ref_out[:, :, live]) + 1e-4
    assert rel(lse[:, :, live], ref_lse[:, :, live]) <= 2 * rel(base_lse[:, :, live], ref_lse[:, :, live]) + 1e-4
    assert "run once per row (a row shift)" in kernels_text(tmp_path)


def test_cuda_fused_bf16_buffer_and_logsumexp_gradient(tmp_path):
    run_case(tmp_path, "relative", "causal", buf_dtype=torch.bfloat16)
    run_case(tmp_path, "head", "none", with_lse_grad=True)


def test_cuda_fused_buffer_gradient_lines(tmp_path):
    """Which scatters the generator proves to run along the tiles' lines (summed per line, no check per
    element), against float64 like every case here."""
    assert "summed per tile along its diagonals" in run_case(tmp_path / "rel", "relative", "none")
    assert "summed per tile along its rows" in run_case(tmp_path / "query", "query", "causal")
    assert "summed per tile" not in run_case(tmp_path / "wrap", "wrapped", "none")


def test_cuda_fused_document_mask_reads_a_buffer(tmp_path):
    torch.manual_seed(3)
    B, H, S, D = 2, 2, 640, 64
    doc = torch.sort(torch.randint(0, 5, (S,), device="cuda")).values

    def mask_mod(b, h, q, kv):
        return (doc[q] == doc[kv]) & (q >= kv)

    bm = create_block_mask(mask_mod, None, None, S, S, device="cuda")
    q, k, v = (torch.randn(B, H, S, D, dtype=torch.float64, device="cuda") for _ in range(3))

    def f(q, k, v):
        with hinted_context(kernel="fused"):
            return flex_attention(q, k, v, lambda s, b, h, qi, ki: s - 0.01 * (qi - ki), bm, return_lse=True)

    def grads(fn, dt):
        xs = [t.to(dt).requires_grad_(True) for t in (q, k, v)]
        out, lse = fn(*xs)
        out.double().sum().backward()
        return [out, lse] + [x.grad for x in xs]

    got = grads(torch.compile(f, backend="hintbackend", options={"dump_dir": str(tmp_path)}), torch.bfloat16)
    base = grads(lambda *x: flex_attention(*x, lambda s, b, h, qi, ki: s - 0.01 * (qi - ki), bm, return_lse=True),
                 torch.bfloat16)
    rs = [t.clone().requires_grad_(True) for t in (q, k, v)]
    ro, rl = dense(*rs, lambda s, b, h, qi, ki: s - 0.01 * (qi - ki), mask_mod)
    ro.sum().backward()
    for g, bb, r in zip(got, base, [ro, rl] + [t.grad for t in rs]):
        assert rel(g, r) <= 2 * rel(bb, r) + 1e-4
    assert "flex-attention-backward-fused" in kernels_text(tmp_path)


def test_cuda_fused_forward_head_dim_256(tmp_path):
    """D 256 runs forward on the generated kernel (inference: no backward; test_cuda_fused_simt covers it)."""
    torch.manual_seed(1)
    q, k, v = (torch.randn(1, 2, 200, 256, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    bm = create_block_mask(causal, None, None, 200, 200, device="cuda")

    def f(q, k, v):
        with hinted_context(kernel="fused"):
            return flex_attention(q, k, v, lambda s, b, h, qi, ki: s + 0.01 * (qi - ki), bm)

    out = torch.compile(f, backend="hintbackend", options={"dump_dir": str(tmp_path)})(q, k, v)
    ref = dense(q.double(), k.double(), v.double(), lambda s, b, h, qi, ki: s + 0.01 * (qi - ki), causal)[0]
    eager = flex_attention(q, k, v, lambda s, b, h, qi, ki: s + 0.01 * (qi - ki), bm)
    assert rel(out, ref) <= 2 * rel(eager, ref) + 1e-4
    assert "flex-attention-fused" in kernels_text(tmp_path)


def test_cuda_fused_out_of_range_read_raises_index_error():
    S = 256
    table = torch.randn(S, device="cuda")

    def f(q, k, v):
        with hinted_context(kernel="fused"):
            return flex_attention(q, k, v, lambda s, b, h, qi, ki: s + table[qi + ki])

    q, k, v = (torch.randn(1, 1, S, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    with pytest.raises(IndexError, match="score_mod indexes captured buffer 0 out of range"):
        torch.compile(f, backend="hintbackend")(q, k, v)
    # The GPU is fine afterwards.
    assert torch.isfinite(torch.compile(lambda x: x * 2, backend="hintbackend")(q)).all()


# float32 q/k/v (forward and backward on the SIMT kernels, codegen/cuda/FlexSimtKernel.cuh: float FMA, no
# TF32) at head dims 64, 128, 256 and one padded to 128 (96), and the bf16/fp16 backward at head dim 256 (the
# SIMT backward, converting as it loads), against float64 within 2x eager's error: a learned relative bias
# (its gradient: the proven diagonal line sums) under a causal mask, a sliding window (partial blocks), GQA
# and MQA, S not a multiple of 64 (or 32).
@pytest.mark.parametrize("score,mask,dtype,shape", [
    ("relative", "causal", torch.float32, (2, 4, 2, 300, 64)),
    ("softcap_relative", "window", torch.float32, (1, 4, 4, 333, 128)),
    ("relative", "causal", torch.float32, (1, 4, 1, 200, 256)),
    ("wrapped", "none", torch.float32, (1, 2, 2, 130, 96)),
    ("query", "causal", torch.float32, (2, 2, 2, 100, 16)),
    ("alibi", "window", torch.float32, (1, 4, 2, 257, 32)),
    ("relative", "causal", torch.bfloat16, (1, 4, 2, 300, 256)),
    ("softcap", "window", torch.float16, (1, 2, 1, 333, 200)),
])
def test_cuda_fused_simt(tmp_path, score, mask, dtype, shape):
    kernels = run_case(tmp_path, score, mask, dtype=dtype, shape=shape)
    assert "SIMT (CUDA cores, float FMA" in kernels, kernels


def test_cuda_fused_simt_document_mask_and_logsumexp_gradient(tmp_path):
    """float32 under a document mask that reads a buffer (partial blocks through mask_mod, full ones
    without), a learned relative bias and a logsumexp gradient, GQA, S 700: the SIMT kernels against
    float64, within 2x eager's error."""
    torch.manual_seed(4)
    B, Hq, Hkv, S, D = 1, 4, 2, 700, 64
    doc = torch.sort(torch.randint(0, 4, (S,), device="cuda")).values

    def mask_mod(b, h, q, kv):
        return (doc[q] == doc[kv]) & (q >= kv)

    bm = create_block_mask(mask_mod, None, None, S, S, device="cuda")
    q = torch.randn(B, Hq, S, D, dtype=torch.float64, device="cuda")
    k, v = (torch.randn(B, Hkv, S, D, dtype=torch.float64, device="cuda") for _ in range(2))
    dout = torch.randn(B, Hq, S, D, dtype=torch.float64, device="cuda")
    dlse = torch.randn(B, Hq, S, dtype=torch.float64, device="cuda")
    table = torch.randn(2 * S - 1, Hq, dtype=torch.float64, device="cuda")
    make_mod = SCORE_MODS["relative"][2]

    def step(fn, dt):
        return outputs_and_grads(fn, q, k, v, dout, dt, table, dt, make_mod, True, S, dlse)

    def fused(qq, kk, vv, sm):
        with hinted_context(kernel="fused"):
            return flex_attention(qq, kk, vv, sm, bm, enable_gqa=True, return_lse=True)

    torch._dynamo.reset()
    got = step(torch.compile(fused, backend="hintbackend", options={"dump_dir": str(tmp_path)}), torch.float32)
    base = step(lambda qq, kk, vv, sm: flex_attention(qq, kk, vv, sm, bm, enable_gqa=True, return_lse=True),
                torch.float32)
    ref = step(lambda qq, kk, vv, sm: dense(qq, kk, vv, sm, mask_mod), torch.float64)
    for name, g, b_, r in zip(["out", "lse", "dq", "dk", "dv", "dbuf"], got, base, ref):
        assert torch.isfinite(g).all(), name
        assert rel(g, r) <= 2 * rel(b_, r) + 1e-4, f"{name}: {rel(g, r):.3g} vs eager {rel(b_, r):.3g}"
    kernels = kernels_text(tmp_path)
    assert "flex-attention-backward-fused" in kernels and "float32, SIMT" in kernels, kernels


# deterministic=True: the generated backward adds dQ in key-tile order, so two runs on the same inputs give
# bitwise-equal gradients (dK and dV were already: each CTA owns its key rows), and the results still meet
# the float64 bound. GQA at S 1000 (several heads add into one CTA's dK/dV; the last query block straddles
# the end), MQA D32, no mask and a sliding window. A buffer gradient along the tiles' diagonals (a relative
# bias) or rows (a per-query bias) is summed per line into a window per key tile, then added key by key in
# window order: bitwise equal too, across sequence ends, GQA and the mma.sync kernels (D32).
@pytest.mark.parametrize("score,mask,shape", [
    ("softcap", "causal", (2, 4, 4, 300, 64)),
    ("identity", "none", (1, 8, 2, 1000, 128)),
    ("alibi", "window", (2, 4, 1, 130, 32)),
    ("temperature", "causal", (1, 4, 4, 700, 128)),
    ("relative", "causal", (1, 4, 2, 1000, 128)),
    ("softcap_relative", "none", (2, 2, 2, 300, 64)),
    ("query", "window", (2, 4, 1, 130, 32)),
])
def test_cuda_fused_deterministic_gradients_are_bitwise_repeatable(tmp_path, score, mask, shape):
    kernels, first, second = run_case(tmp_path, score, mask, shape=shape, deterministic=True)
    for name, a, b in zip(["out", "lse", "dq", "dk", "dv", "dbuf"], first, second):
        assert torch.equal(a, b), f"{name} differs between two deterministic runs"
    if SCORE_MODS[score][1]:
        assert "line sums kept per key tile and added in tile order" in kernels, kernels


# A buffer gradient that is not one scatter along the tiles' lines ((q - kv) mod 97 wraps) would still be
# added with atomics in no fixed order: kernel="fused" with deterministic=True says so and names the node,
# instead of giving a gradient that moves from run to run.
def test_cuda_fused_deterministic_refuses_a_buffer_gradient_off_the_lines():
    S = 256
    q, k, v = (torch.randn(1, 2, S, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    table = torch.randn(97, 2, device="cuda", requires_grad=True)

    def f(q, k, v):
        with hinted_context(kernel="fused", deterministic=True):
            return flex_attention(q, k, v, lambda s, b, h, qi, kv: s + table[(qi - kv) % 97, h])

    torch._dynamo.reset()
    with pytest.raises(Exception, match=r"kernel=\"fused\" was asked for.*deterministic=True, and the joint's buffer "
                                        r"gradient is not a scatter along the tiles' rows, columns or diagonals"):
        torch.compile(f, backend="hintbackend")(q, k, v).sum().backward()
