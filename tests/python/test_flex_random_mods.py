"""Random score_mods and mask_mods through the generated CPU kernel (kernel="fused"), against eager flex in
float64: the generator's translation of each op (types and promotion, integer division and remainder of
negatives, comparisons, where, clamps, buffer reads and their gradients) checked on expressions nobody
wrote by hand. Each case is a seeded random tree over the score, b, h, q_idx, kv_idx and three captured
buffers (a learned float table, a float one, an int64 one that integer expressions and masks read), forward (out, logsumexp) and backward (q, k, v and the buffer's gradient),
under a random mask_mod; both sides compute in float64, so they agree to rounding (1e-9 relative). The
buffer's gradient, which eager flex does not give on CPU, is held to attention over the whole score
matrix with torch's autograd.

HINTBACKEND_RANDOM_MODS=<n> runs n cases instead of the default 8 (a longer search: the seeds are the case
numbers, so a failure names the seed that reproduces it)."""

import math
import os
import random
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention.flex_attention import create_block_mask

from flex_reference import hop, kernels_text
from hintbackend import hinted_context
from hintbackend.backend import HintBackendFallbackWarning

pytestmark = pytest.mark.skipif(not (os.environ.get("CXX") or any(
    os.path.exists(os.path.join(p, c)) for p in os.environ.get("PATH", "").split(os.pathsep)
    for c in ("c++", "g++", "clang++"))), reason="needs a host C++ compiler")

B, H, S, D = 2, 2, 150, 16  # S not a multiple of the 64-row blocks
L = 37  # the buffers' length: indices reach it through % and clamp
DOC = torch.randint(0, 4, (L,), generator=torch.Generator().manual_seed(0))  # an int64 buffer, read by index


class Expr:
    """A random expression: `text` for the failure message, `fn(s, b, h, q, kv, table, slope)` to evaluate."""

    def __init__(self, text, fn):
        self.text, self.fn = text, fn


class Gen:
    def __init__(self, seed):
        self.r = random.Random(seed)
        self.row_only = False  # no kv_idx and no score: a term that only shifts each softmax row

    def pick(self, *options):
        return self.r.choice(options)

    def const(self, lo=-2.0, hi=2.0):
        return round(self.r.uniform(lo, hi), 3)

    def integer(self, depth):
        r = self.r
        if depth > 0 and r.random() < 0.1:  # an integer buffer read (a document id, say)
            i = self.index(depth - 1)
            return Expr(f"doc[{i.text}]", lambda *a: DOC[i.fn(*a)])
        if depth <= 0 or r.random() < 0.3:
            name = self.pick("q", "h", "b") if self.row_only else self.pick("q", "kv", "h", "b", "q - kv", "kv - q")
            fn = {"q": lambda s, b, h, q, kv, *_: q, "kv": lambda s, b, h, q, kv, *_: kv,
                  "h": lambda s, b, h, q, kv, *_: h, "b": lambda s, b, h, q, kv, *_: b,
                  "q - kv": lambda s, b, h, q, kv, *_: q - kv, "kv - q": lambda s, b, h, q, kv, *_: kv - q}[name]
            return Expr(name, fn)
        x = self.integer(depth - 1)
        op = self.pick("+c", "*c", "%c", "//c", "abs", "clamp", "+", "max", "min")
        c = r.randint(1, 9)
        if op in ("+", "max", "min"):
            y = self.integer(depth - 1)
            f = {"+": torch.add, "max": torch.maximum, "min": torch.minimum}[op]
            return Expr(f"{op}({x.text}, {y.text})", lambda *a, f=f: f(x.fn(*a), y.fn(*a)))
        if op == "clamp":
            lo = r.randint(-20, 5)
            return Expr(f"clamp({x.text}, {lo}, {lo + c * 5})", lambda *a: torch.clamp(x.fn(*a), lo, lo + c * 5))
        f = {"+c": lambda t: t + (c - 5), "*c": lambda t: t * (c - 5), "%c": lambda t: t % c,
             "//c": lambda t: t // c, "abs": torch.abs}[op]
        return Expr(f"({x.text}){op.replace('c', str(c - 5 if op in ('+c', '*c') else c))}",
                    lambda *a, f=f: f(x.fn(*a)))

    def boolean(self, depth, ints_only=False):
        """ints_only: over the indices alone (a mask_mod)."""
        op = self.pick("cmp", "cmp", "and", "or", "not", *(() if ints_only else ("fcmp",))) if depth > 0 else "cmp"
        if op == "cmp":
            x, y = self.integer(depth - 1), self.integer(depth - 1)
            cmp = self.pick(">", ">=", "<", "<=", "==", "!=")
            f = {">": torch.gt, ">=": torch.ge, "<": torch.lt, "<=": torch.le, "==": torch.eq, "!=": torch.ne}[cmp]
            return Expr(f"({x.text} {cmp} {y.text})", lambda *a, f=f: f(x.fn(*a), y.fn(*a)))
        if op == "fcmp":
            x, c = self.floating(depth - 1), self.const()
            return Expr(f"({x.text} > {c})", lambda *a: x.fn(*a) > c)
        if op == "not":
            x = self.boolean(depth - 1, ints_only)
            return Expr(f"~{x.text}", lambda *a: ~x.fn(*a))
        x, y = self.boolean(depth - 1, ints_only), self.boolean(depth - 1, ints_only)
        f = self.pick(torch.logical_and, torch.bitwise_and) if op == "and" else \
            self.pick(torch.logical_or, torch.bitwise_or)
        return Expr(f"({x.text} {op} {y.text})", lambda *a, f=f: f(x.fn(*a), y.fn(*a)))

    def index(self, depth):
        i = self.integer(depth)
        return Expr(f"({i.text}) % {L}", lambda *a: i.fn(*a) % L)

    def floating(self, depth):
        r = self.r
        if depth <= 0 or r.random() < 0.25:
            leaf = self.pick("int", "table", "slope") if self.row_only else self.pick("s", "s", "int", "table", "slope")
            if leaf == "s":
                c = self.const(0.5, 1.5)
                return Expr(f"s * {c}", lambda s, *a: s * c)
            if leaf == "int":
                # In float64: an int tensor times a Python float is float32 in eager, which the generated
                # code computes in its working type (double here), more precisely than eager rounds it.
                i, c = self.integer(depth - 1), self.const(-0.1, 0.1)
                return Expr(f"double({i.text}) * {c}", lambda *a: i.fn(*a).double() * c)
            i = self.index(depth - 1)
            if leaf == "table":  # learned: its gradient is the scatter of the joint
                return Expr(f"table[{i.text}, h]", lambda s, b, h, q, kv, t, sl: t[i.fn(s, b, h, q, kv, t, sl), h])
            return Expr(f"slope[{i.text}]", lambda s, b, h, q, kv, t, sl: sl[i.fn(s, b, h, q, kv, t, sl)])
        op = self.pick("+", "-", "*", "/", "max", "min", "where", "tanh", "sigmoid", "sin", "cos", "erf", "exp",
                       "log1p", "sqrt", "neg", "square", "softcap", "atan", "rsqrt", "relu", "cube", "floor", "abs",
                       "recip", "fmod", "silu", "gelu", "softplus", "mish", "elu", "leaky", "hardtanh", "hardswish",
                       "asinh", "atan2", "hypot", "logaddexp", "lerp")
        x = self.floating(depth - 1)
        if op in ("+", "-", "*", "/", "max", "min", "atan2", "hypot", "logaddexp", "lerp"):
            y = self.floating(depth - 1)
            f = {"+": torch.add, "-": torch.sub, "*": torch.mul, "/": lambda u, v: u / (1 + v.abs()),
                 "max": torch.maximum, "min": torch.minimum, "atan2": lambda u, v: torch.atan2(u, v * v + 0.5),
                 "hypot": lambda u, v: torch.hypot(u, v * v + 0.25), "logaddexp": torch.logaddexp,
                 "lerp": lambda u, v: torch.lerp(u, v, 0.3)}[op]
            return Expr(f"{op}({x.text}, {y.text})", lambda *a, f=f: f(x.fn(*a), y.fn(*a)))
        if op == "where":
            c, y = self.boolean(depth - 1), self.floating(depth - 1)
            return Expr(f"where({c.text}, {x.text}, {y.text})", lambda *a: torch.where(c.fn(*a), x.fn(*a), y.fn(*a)))
        f = {"tanh": torch.tanh, "sigmoid": torch.sigmoid, "sin": torch.sin, "cos": torch.cos, "erf": torch.erf,
             "exp": lambda t: torch.exp(torch.clamp(t, -8, 8)), "log1p": lambda t: torch.log1p(t.abs()),
             "sqrt": lambda t: torch.sqrt(t * t + 0.25), "neg": torch.neg, "square": lambda t: t * t,
             "softcap": lambda t: 5 * torch.tanh(t / 5), "atan": torch.atan,
             "rsqrt": lambda t: torch.rsqrt(t * t + 1), "relu": torch.relu, "cube": lambda t: torch.pow(t, 3),
             "floor": torch.floor, "abs": torch.abs, "recip": lambda t: torch.reciprocal(t.abs() + 1),
             "fmod": lambda t: torch.fmod(t, 1.5), "silu": F.silu, "gelu": F.gelu,
             "softplus": lambda t: F.softplus(t, beta=1.5, threshold=3.0), "mish": F.mish,
             "elu": lambda t: F.elu(t, 0.7), "leaky": lambda t: F.leaky_relu(t, 0.2),
             "hardtanh": lambda t: F.hardtanh(t, -0.8, 1.2), "hardswish": F.hardswish, "asinh": torch.asinh}[op]
        return Expr(f"{op}({x.text})", lambda *a, f=f: f(x.fn(*a)))


def case(seed):
    g = Gen(seed)
    # A sixth of the cases add a row shift, s + t(b, h, q): the kernels may run it once per row, and its
    # gradient is the logsumexp gradient's (given here) sum.
    g.row_only = g.r.random() < 1 / 6
    body = g.floating(3)
    g.row_only = False
    mask = g.boolean(2, ints_only=True) if g.r.random() < 0.6 else None
    # The score always enters (a score_mod that drops it is legal, but says little about the kernel).
    score_mod_text = f"s + {body.text}"
    return score_mod_text, body, (mask.text if mask else "none"), mask


def run_seed(tmp_path, seed, kernel="fused"):
    text, body, mask_text, mask = case(seed)
    torch.manual_seed(seed)
    q, k, v, dout = (torch.randn(B, H, S, D, dtype=torch.float64) for _ in range(4))
    dlse = torch.randn(B, H, S, dtype=torch.float64)
    table0 = torch.randn(L, H, dtype=torch.float64)
    slope = torch.randn(L, dtype=torch.float64)
    mask_mod = None
    if mask is not None:
        def mask_mod(b, h, q_idx, kv_idx):
            # index-only (no score): the buffers and score positions are unused
            return mask.fn(None, b, h, q_idx, kv_idx, table0, slope)
    bm = create_block_mask(mask_mod, B, H, S, S, device="cpu", BLOCK_SIZE=64) if mask_mod else None

    def run(compiled):
        table = table0.clone().requires_grad_(True)
        qq, kk, vv = (t.clone().requires_grad_(True) for t in (q, k, v))

        def score_mod(s, b, h, q_idx, kv_idx):
            return s + body.fn(s, b, h, q_idx, kv_idx, table, slope)

        def f(qq, kk, vv):
            if compiled:
                with hinted_context(kernel=kernel):
                    return hop(qq, kk, vv, score_mod, bm)
            return hop(qq, kk, vv, score_mod, bm)

        if compiled:
            torch._dynamo.reset()
            f = torch.compile(f, backend="hintbackend", options={"dump_dir": str(tmp_path)})
        out, lse = f(qq, kk, vv)
        ((out * dout).sum() + (torch.where(lse.isfinite(), lse, 0) * dlse).sum()).backward()
        return {"out": out.detach(), "lse": lse.detach(), "dq": qq.grad, "dk": kk.grad, "dv": vv.grad,
                "dtable": table.grad if table.grad is not None else torch.zeros_like(table)}  # (eager: none)

    def dense_table_grad():
        """The learned buffer's gradient, which eager flex does not give on CPU: attention over the whole
        score matrix with torch's autograd (rows that the mask empties contribute nothing, as in flex)."""
        if "table" not in body.text:
            return torch.zeros_like(table0)
        table = table0.clone().requires_grad_(True)
        b_, h_ = torch.arange(B).view(B, 1, 1, 1), torch.arange(H).view(1, H, 1, 1)
        q_, kv_ = torch.arange(S).view(1, 1, S, 1), torch.arange(S).view(1, 1, 1, S)
        s = (q @ k.transpose(-2, -1)) * D ** -0.5
        s = (s + body.fn(s, b_, h_, q_, kv_, table, slope)).expand(B, H, S, S)
        if mask is not None:
            s = s.masked_fill(~mask.fn(None, b_, h_, q_, kv_, table0, slope).expand(B, H, S, S), float("-inf"))
        m = s.amax(-1, keepdim=True)
        m = torch.where(torch.isinf(m), 0, m).detach()
        p = torch.exp(s - m)
        l = p.sum(-1, keepdim=True)
        out = p / torch.where(l == 0, 1, l) @ v
        lse = (torch.log(l) + m).squeeze(-1) / math.log(2)  # base 2, as flex's
        loss = (out * dout).sum() + (torch.where(lse.isfinite(), lse, 0) * dlse).sum()
        if not loss.requires_grad:  # the table is read only where no gradient flows (a condition, a floor)
            return torch.zeros_like(table0)
        loss.backward()
        return table.grad if table.grad is not None else torch.zeros_like(table)

    with warnings.catch_warnings():
        warnings.simplefilter("error", HintBackendFallbackWarning)  # the fused kernel, or the test says why
        got = run(True)
    want = run(False)
    want["dtable"] = dense_table_grad()
    what = f"seed {seed}: score_mod {text}, mask_mod {mask_text}"
    for name in want:
        w, x = want[name], got[name]
        assert x.shape == w.shape, f"{what}: {name} shape {tuple(x.shape)} vs {tuple(w.shape)}"
        same_inf = torch.equal(torch.isinf(w), torch.isinf(x)) and torch.equal(torch.isnan(w), torch.isnan(x))
        assert same_inf, f"{what}: {name} has infinities or NaNs where eager has none (or the reverse)"
        fw, fx = torch.nan_to_num(w, posinf=0, neginf=0), torch.nan_to_num(x, posinf=0, neginf=0)
        err = (fx - fw).abs().max().item() / max(fw.abs().max().item(), 1e-30)
        assert err < 1e-9, f"{what}: {name} differs from eager flex by {err:.3g} (relative to its largest value)"
    kernels = kernels_text(tmp_path)
    if kernel == "fused":
        assert "flex-attention-fused" in kernels and "flex-attention-backward-fused" in kernels, f"{what}:\n{kernels}"


CASES = int(os.environ.get("HINTBACKEND_RANDOM_MODS", "8"))


@pytest.mark.parametrize("seed", range(CASES))
def test_random_score_and_mask_mods_match_eager(tmp_path, seed):
    run_seed(tmp_path, seed)


@pytest.mark.parametrize("seed", range(CASES // 2))
def test_random_score_and_mask_mods_on_the_reference(tmp_path, seed):
    """The dense reference (kernel="aten": the subgraphs run as ATen ops over the score matrix), which every
    node falls back to, on the same cases."""
    run_seed(tmp_path, seed, kernel="aten")
