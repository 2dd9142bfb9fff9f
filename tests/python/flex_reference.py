"""The float64 reference and the score_mod / mask cases the FlexAttention kernel tests share
(test_flex_fused.py on CPU, test_flex_fused_cuda.py on a GPU)."""

import math
import os

import torch
import torch.nn.functional as F
from torch._higher_order_ops.flex_attention import flex_attention as flex_hop
from torch.nn.attention import flex_attention as _fa

from helpers import graph_dirs


def hop(q, k, v, score_mod=None, block_mask=None, scale=None):
    """The higher-order-op call the public API makes (which refuses backward on CPU): (out, lse base 2)."""
    score_mod = _fa._identity if score_mod is None else score_mod
    block_mask = _fa._create_empty_block_mask(q, k) if block_mask is None else block_mask
    scale = 1.0 / math.sqrt(q.size(-1)) if scale is None else scale
    opts = _fa._apply_kernel_options(q, k, v, False, None, None)
    out, lse, _ = flex_hop(q, k, v, score_mod, block_mask.as_tuple(), scale, opts)
    return out, lse


def dense(q, k, v, score_mod=None, mask_mod=None, scale=None):
    """Attention over the whole score matrix with plain torch ops, on q's device: (out, logsumexp in
    natural units). In float64 it is the reference the kernels are held to."""
    B, Hq, S, D = q.shape
    G = Hq // k.size(1)
    k = k.repeat_interleave(G, 1).expand(B, -1, -1, -1)
    v = v.repeat_interleave(G, 1).expand(B, -1, -1, -1)
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    s = (q @ k.transpose(-2, -1)) * scale
    dev = q.device
    b, h = torch.arange(B, device=dev).view(B, 1, 1, 1), torch.arange(Hq, device=dev).view(1, Hq, 1, 1)
    qi, ki = torch.arange(S, device=dev).view(1, 1, S, 1), torch.arange(k.size(2), device=dev).view(1, 1, 1, -1)
    if score_mod is not None:
        s = score_mod(s, b, h, qi, ki).expand(s.shape)
    if mask_mod is not None:
        s = s.masked_fill(~mask_mod(b, h, qi, ki).expand(s.shape), -math.inf)
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


def outputs_and_grads(fn, q, k, v, dout, dtype, table=None, buf_dtype=None, make_mod=None, wants_grad=False,
                      S=None, dlse=None):
    """fn(q, k, v, score_mod) -> (out, lse) on copies of q, k, v in `dtype` (the captured table in
    `buf_dtype`, requiring grad when `wants_grad`), then the backward of sum(out * dout) (+ sum(lse * dlse)
    when dlse is given): [out, lse, dq, dk, dv] (+ [dtable])."""
    buf = table.detach().to(buf_dtype).clone().requires_grad_(wants_grad) if table is not None else None
    qq, kk, vv = (t.detach().to(dtype).clone().requires_grad_(True) for t in (q, k, v))
    out, lse = fn(qq, kk, vv, make_mod(buf, S) if make_mod else None)
    loss = (out.double() * dout).sum()
    if dlse is not None:
        loss = loss + (lse.double() * dlse).sum()
    loss.backward()
    grads = [qq.grad, kk.grad, vv.grad] + ([buf.grad] if wants_grad else [])
    return [out.detach(), lse.detach()] + grads


def causal(b, h, q, kv):
    return q >= kv


def rel(x, ref):
    """Relative error; absolute where the reference is near zero (a bias that only shifts softmax rows
    has a zero gradient)."""
    return ((x.double() - ref.double()).norm() / ref.double().norm().clamp_min(1.0)).item()


def kernels_text(path):
    return "".join(open(os.path.join(path, d, "kernels.txt")).read() for d in graph_dirs(path))


# name -> (buffer shape from (B, H, S) or None, buffer wants grad, score_mod(buf, S))
SCORE_MODS = {
    "identity": (None, False, None),
    "softcap": (None, False, lambda buf, S: lambda s, b, h, q, kv: 20 * torch.tanh(s / 20)),
    "relpos": (None, False, lambda buf, S: lambda s, b, h, q, kv: s + (q - kv) * 0.01),
    "alibi": (lambda B, H, S: (H,), False, lambda buf, S: lambda s, b, h, q, kv: s + buf[h] * (kv - q)),
    "relative": (lambda B, H, S: (2 * S - 1, H), True, lambda buf, S: lambda s, b, h, q, kv: s + buf[q - kv + S - 1, h]),
    "softcap_relative": (lambda B, H, S: (2 * S - 1, H), True,
                         lambda buf, S: lambda s, b, h, q, kv: 20 * torch.tanh(s / 20) + buf[q - kv + S - 1, h]),
    "query": (lambda B, H, S: (S,), True, lambda buf, S: lambda s, b, h, q, kv: s + buf[q]),
    "head": (lambda B, H, S: (H,), True, lambda buf, S: lambda s, b, h, q, kv: s + buf[h]),
    "dense": (lambda B, H, S: (B, H, S, S), True, lambda buf, S: lambda s, b, h, q, kv: s + buf[b, h, q, kv]),
    # two indexings of one buffer (Inductor refuses this)
    "two_reads": (lambda B, H, S: (S,), True, lambda buf, S: lambda s, b, h, q, kv: s + buf[q] * buf[kv]),
    # a multiplicative, score-dependent use of a buffer: its gradient depends on the score
    "scaled": (lambda B, H, S: (H,), True, lambda buf, S: lambda s, b, h, q, kv: s * torch.sigmoid(buf[h])),
    # every exponential and logarithm the generated code has its own float form of (codegen/FlexMath.h), on the
    # score (so the backward differentiates them) and on the distance
    "transcendental": (None, False, lambda buf, S: lambda s, b, h, q, kv: (
        s * torch.sigmoid(s) - torch.log(1 + torch.exp(s * 0.5)) + torch.expm1(s * 0.01)
        + torch.log1p((q - kv).abs()) * 0.1 + torch.exp2(-torch.log2(1.0 + (q - kv).abs())))),
    # sin, cos, tan, erf and erfc (codegen/FlexMath.h's float forms) on the score (the backward differentiates
    # them: cos, sin, 1 + tan^2, exp(-x^2)) and on the distance, some of it past the quarter period
    "trig": (None, False, lambda buf, S: lambda s, b, h, q, kv: (
        torch.sin(s) + torch.cos(s * 0.7) * 0.5 + torch.tan(s * 0.2) * 0.2 + torch.erf(s * 0.5)
        - torch.erfc(s * 0.3) * 0.25 + torch.sin((q - kv) * 0.1) * 0.3 + torch.cos((q - kv) * 0.05)
        + torch.erfc((q - kv).abs() * 0.02) - torch.erf((q - kv) * 0.03) * 0.5)),
    # the smooth activations (the joint differentiates them with their *_backward ops; elu and celu(1.5)
    # have a continuous slope), and two-operand and other smooth float functions of the score and the
    # distance (autograd writes their derivatives from ops above). Kinks are KINKED_SCORE_MODS's, in float64:
    # in float32 or bf16 a score that rounds across a kink moves a gradient by far more than rounding.
    "activations": (None, False, lambda buf, S: lambda s, b, h, q, kv: 0.3 * (
        F.silu(s) + F.gelu(s) * 0.5 + F.gelu(s, approximate="tanh") * 0.5 + F.softplus(s, beta=2.0)
        + F.elu(s) * 0.5 + F.celu(s, 1.5) * 0.5 + F.mish(s) * 0.5)),
    "functions": (None, False, lambda buf, S: lambda s, b, h, q, kv: (
        torch.atan2(s, ((q - kv) * 0.01 + 0.5).to(s.dtype)) + torch.hypot(s, ((q - kv) * 0.02 + 0.3).to(s.dtype)) * 0.5
        + torch.logaddexp(s, ((q - kv) * 0.01).to(s.dtype)) * 0.5
        + torch.logaddexp2(-s, ((kv - q) * 0.01).to(s.dtype)) * 0.3
        + torch.special.xlogy(s * s + 0.1, ((q - kv).abs() + 1).to(s.dtype)) * 0.1
        + torch.asinh(s) + torch.acosh(s * s + 1.5) * 0.5 + torch.atanh(torch.tanh(s) * 0.5)
        + torch.sinc(s * 0.3) + torch.nan_to_num(s) * 0.2 + torch.rad2deg(s) * 0.005
        + torch.deg2rad((q - kv).to(s.dtype)) * 0.1 + torch.lerp(s, s * 0.5 + 0.1, 0.3)
        + torch.lerp(s, s * s * 0.1, 0.7))),
}

# Score_mods with kinks or jumps (leaky_relu, hardtanh, relu6, selu, hardsigmoid, hardswish, softplus past its
# threshold, copysign, frac), checked in float64 only (see "activations" above).
KINKED_SCORE_MODS = {
    "kinks": (None, False, lambda buf, S: lambda s, b, h, q, kv: 0.3 * (
        F.leaky_relu(s, 0.1) + F.hardtanh(s, -1.5, 1.0) + F.relu6(s * 3) * 0.2 + F.selu(s) * 0.5
        + F.hardsigmoid(s * 2) + F.hardswish(s * 2) * 0.5 + F.softplus(s, beta=2.0, threshold=1.0)
        + torch.copysign(s, (q - kv).to(s.dtype)) + torch.frac(s * 2) * 0.1)),
}
