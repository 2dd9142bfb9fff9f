"""scaled_dot_product_attention with a mask broadcast along its last dim (HF BERT's padding mask under
torch.compile): hintbackend passes SDPA a contiguous copy (python/hintbackend/sdpa_masks.py), so AOTAutograd
keeps a fused kernel where it would otherwise trace the math form (S x S float32 scores saved for the
backward). Outputs and gradients equal eager's; on CUDA the traced forward has no softmax of its own."""

import logging
import os

import pytest
import torch
import torch.nn.functional as F

from conftest import device
from helpers import graph_dirs, randn, tolerances
from hintbackend.sdpa_masks import make_sdpa_masks_fusable, needs_copy

B, H, S, D = 2, 4, 64, 16


def attention(q, k, v, mask):
    # mask: [B|1, 1, S, 1], one value per query row, expanded as HF BERT's is under torch.compile
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.expand(B, H, S, S))


@pytest.mark.parametrize("mask_batch", [B, 1])
@pytest.mark.parametrize("kind", ["bool", "float"])
def test_broadcast_mask_is_copied_and_results_match_eager(tmp_path, caplog, mask_batch, kind):
    """An all-True bool mask (HF BERT with no padding) and a float one (a random shift per query row, which
    softmax ignores): no row is fully masked, where the math form and the fused kernels differ."""
    torch.manual_seed(3)
    q, k, v, dout = (randn(B, H, S, D) for _ in range(4))
    mask = (torch.ones(mask_batch, 1, S, 1, dtype=torch.bool, device=device()) if kind == "bool"
            else randn(mask_batch, 1, S, 1))

    def step(fn):
        xs = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        out = fn(*xs, mask)
        out.backward(dout)
        return [out.detach()] + [t.grad for t in xs]

    want = step(attention)
    with caplog.at_level(logging.INFO, logger="hintbackend"):
        got = step(torch.compile(attention, backend="hintbackend", options={"dump_dir": str(tmp_path)}))
    for what, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        torch.testing.assert_close(g, w, **tolerances(torch.float32), msg=what)
    assert "passed as a contiguous copy" in caplog.text, caplog.text
    forward = "".join(open(os.path.join(tmp_path, d, "fx_graph.txt")).read()
                      for d in graph_dirs(tmp_path) if d.startswith("forward"))
    # the copy: narrowed to one element along the broadcast heads (and batch, when the mask has one), then
    # made contiguous: [B|1, 1, S, S]
    assert "aten.slice.Tensor" in forward and f"[{mask_batch}, 1, {S}, {S}]" in forward, forward
    if device() == "cuda":  # a fused kernel (float32: the memory-efficient one), not the math form's softmax
        assert "_safe_softmax" not in forward and "_softmax" not in forward, forward


@pytest.mark.skipif(device() != "cuda", reason="the fused SDPA kernels' mask rules are CUDA's")
def test_dropout_with_a_broadcast_mask_keeps_a_fused_kernel(tmp_path):
    """HF BERT in train mode: dropout and the broadcast mask. Without the copy the trace takes the math form
    (`_safe_softmax`, `native_dropout` on the S x S probabilities)."""
    q, k, v = (randn(B, H, 256, D, dtype=torch.bfloat16).requires_grad_(True) for _ in range(3))
    keep = torch.ones(B, 1, 256, 1, dtype=torch.bool, device="cuda")

    def f(q, k, v, keep):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=keep.expand(B, 1, 256, 256), dropout_p=0.1)

    torch.compile(f, backend="hintbackend", options={"dump_dir": str(tmp_path)})(q, k, v, keep).sum().backward()
    forward = "".join(open(os.path.join(tmp_path, d, "fx_graph.txt")).read()
                      for d in graph_dirs(tmp_path) if d.startswith("forward"))
    assert "_safe_softmax" not in forward and "native_dropout" not in forward, forward
    assert "attention" in forward, forward


def test_the_rewrite_leaves_other_masks_alone():
    """A contiguous mask, or one broadcast only along batch or heads, is what the fused kernels take: no copy."""
    full = torch.zeros(B, H, S, S)
    assert not needs_copy(full)
    assert not needs_copy(torch.zeros(1, 1, S, S).expand(B, H, S, S))
    assert needs_copy(torch.zeros(B, 1, S, 1).expand(B, 1, S, S))

    def f(q, k, v, m):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    gm = torch.fx.symbolic_trace(f)
    assert make_sdpa_masks_fusable(gm) == 0  # no example values: nothing known, nothing changed


def test_symbolic_shapes_leave_the_mask_as_traced(caplog):
    """dynamic=True: the mask's sizes are symbols, and deciding would add guards: no copy, results as eager."""
    torch.manual_seed(4)
    q, k, v = (randn(B, H, S, D) for _ in range(3))
    mask = torch.ones(B, 1, S, 1, dtype=torch.bool, device=device())
    def f(q, k, v, mask):  # the mask expanded to the inputs' (symbolic) sizes
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask.expand(q.shape[0], q.shape[1], q.shape[2],
                                                                             k.shape[2]))

    with caplog.at_level(logging.INFO, logger="hintbackend"):
        got = torch.compile(f, backend="hintbackend", dynamic=True)(q, k, v, mask)
    torch.testing.assert_close(got, f(q, k, v, mask), **tolerances(torch.float32))
    assert "passed as a contiguous copy" not in caplog.text


@pytest.mark.parametrize("kind", ["all-true", "zeros", "causal"])
def test_a_constant_mask_that_masks_nothing_is_dropped(tmp_path, caplog, kind):
    """HF's bidirectional mask under torch.compile (`arange(S)[None, None, :, None] >= 0`, expanded), and an
    all-zero float mask: computed from constants, they mask nothing, so SDPA gets no mask (eager HF passes
    none); a causal mask built the same way masks half the scores and stays. Results as eager's."""
    torch.manual_seed(5)
    q, k, v, dout = (randn(B, H, S, D) for _ in range(4))

    def f(q, k, v):
        i = torch.arange(S, device=q.device)
        if kind == "all-true":
            m = (i[None, None, :, None] >= 0).expand(B, -1, S, S)
        elif kind == "zeros":
            m = torch.zeros(1, 1, S, S, device=q.device)
        else:
            m = i[None, None, :, None] >= i[None, None, None, :]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    def step(fn):
        xs = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        out = fn(*xs)
        out.backward(dout)
        return [out.detach()] + [t.grad for t in xs]

    want = step(f)
    torch._dynamo.reset()
    with caplog.at_level(logging.INFO, logger="hintbackend"):
        got = step(torch.compile(f, backend="hintbackend", options={"dump_dir": str(tmp_path)}))
    for what, g, w in zip(("out", "dq", "dk", "dv"), got, want):
        torch.testing.assert_close(g, w, **tolerances(torch.float32), msg=what)
    dropped = "masks nothing" in caplog.text
    assert dropped == (kind != "causal"), caplog.text
    forward = "".join(open(os.path.join(tmp_path, d, "fx_graph.txt")).read()
                      for d in graph_dirs(tmp_path) if d.startswith("forward"))
    assert ("aten.arange" in forward or "aten.zeros" in forward or "aten.full" in forward) == (not dropped), forward


def test_masks_that_read_inputs_or_random_numbers_are_not_evaluated():
    """Only a mask made of constants is evaluated at compile time: one that reads an input, or random numbers
    (whose value now is not their value at run time), is left as traced."""
    from hintbackend.sdpa_masks import constant_value

    def f(q, k, v, lengths):  # (q, k, v unread: a mask's usual company)
        i = torch.arange(S, device=q.device)
        padded = (i[None, None, None, :] < lengths[:, None, None, None]).expand(B, 1, S, S)
        noisy = torch.rand(1, 1, S, S, device=q.device) >= 0  # all True here, but random
        fixed = (i[None, None, :, None] >= 0).expand(B, 1, S, S)
        return padded, noisy, fixed

    graphs = []

    def capture(gm, example_inputs):  # Dynamo's graph, as hintbackend gets it
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    torch.compile(f, backend=capture)(*(randn(B, H, S, D) for _ in range(3)), torch.full((B,), S // 2, device=device()))
    out = [n for n in graphs[0].graph.nodes if n.op == "output"][0].args[0]
    assert constant_value(out[0]) is None
    assert constant_value(out[1]) is None
    fixed = constant_value(out[2])
    assert fixed is not None and fixed.shape == (B, 1, S, S) and bool(fixed.all())
