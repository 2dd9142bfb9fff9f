"""hinted_context puts its hints on all and only the ATen nodes a region covers, in the AOT forward and
backward graphs, for the context manager, the decorator and the higher-order op (docs/hints.md).

The graphs are captured with a plain aot_autograd backend (not hintbackend's own), so these tests
check the contract the serializer and the C++ importer rely on:
node.meta["custom"]["hintbackend"] == {"region": id, "path": [...], <merged hints>}.
"""


import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func

from hintbackend.hoo import HintError, hinted_context

aten = torch.ops.aten
KEY = "hintbackend"


class Capture:
    """A torch.compile backend that records the Dynamo graphs and the AOT forward/backward graphs."""

    def __init__(self):
        self.dynamo, self.fw, self.bw = [], [], []

        def keep(into):
            def compiler(gm, example_inputs):
                into.append(gm)
                return make_boxed_func(gm.forward)

            return compiler

        self._aot = aot_autograd(fw_compiler=keep(self.fw), bw_compiler=keep(self.bw), inference_compiler=keep(self.fw))

    def __call__(self, gm, example_inputs):
        self.dynamo.append(gm)
        return self._aot(gm, example_inputs)


def calls(gm):
    return [n for n in gm.graph.nodes if n.op == "call_function"]


def hints_of(node):
    return (node.meta.get("custom") or {}).get(KEY)


def hinted(gm):
    return [n for n in calls(gm) if hints_of(n) is not None]


def targets(nodes):
    return {n.target for n in nodes}


def check_backward_inherits(fw_graphs, bw_graphs):
    """Every backward op whose forward op (same seq_nr) is hinted carries the same hints; every other
    backward op carries none. Returns the hinted backward ops."""
    fw_hints = {}
    for gm in fw_graphs:
        for n in calls(gm):
            if "seq_nr" in n.meta:
                fw_hints.setdefault(n.meta["seq_nr"], hints_of(n))
    out = []
    for gm in bw_graphs:
        for n in calls(gm):
            expected = fw_hints.get(n.meta.get("seq_nr")) if not n.meta.get("is_gradient_acc") else None
            assert hints_of(n) == expected, f"{n.format_node()}: {hints_of(n)} != {expected}"
            if expected is not None:
                out.append(n)
    return out


def check_only_op_nodes_hinted(gm):
    """Graph inputs (parameters, user inputs, incoming gradients) and the output never carry hints.
    (A backward placeholder for an activation saved from a hinted op does: FX copies its producer's
    metadata, and get_attr nodes of a hinted op's subgraphs do too.)"""
    for n in gm.graph.nodes:
        if n.op == "output" or (n.op == "placeholder" and n.name.startswith(("primals", "arg", "tangents"))):
            assert hints_of(n) is None, n.format_node()


def xw(shape=(4, 8), grad=True):
    torch.manual_seed(0)
    return torch.randn(*shape, requires_grad=grad), torch.randn(shape[-1], shape[-1], requires_grad=grad)


# ---- the three forms -------------------------------------------------------------------------------


def region_ctx(x, w):
    y = x @ w
    with hinted_context(schedule="dfs", slices=2):
        z = y.sin() * 2
    return z.cos().sum()


@hinted_context(schedule="dfs", slices=2)
def _decorated_body(y):
    return y.sin() * 2


def region_decorator(x, w):
    y = x @ w
    z = _decorated_body(y)
    return z.cos().sum()


def region_functional(x, w):
    y = x @ w
    z = hinted_context(lambda t: t.sin() * 2, y, schedule="dfs", slices=2)
    return z.cos().sum()


@pytest.mark.parametrize("fn", [region_ctx, region_decorator, region_functional], ids=["with", "decorator", "functional"])
def test_forms_mark_all_and_only_covered_nodes(fn):
    cap = Capture()
    x, w = xw()
    out = torch.compile(fn, backend=cap)(x, w)
    out.backward()
    assert len(cap.fw) == 1 and len(cap.bw) == 1
    fw, bw = cap.fw[0], cap.bw[0]
    assert targets(hinted(fw)) == {aten.sin.default, aten.mul.Tensor}
    assert {aten.mm.default, aten.cos.default, aten.sum.default} <= targets(calls(fw)) - targets(hinted(fw))
    payload = hints_of(hinted(fw)[0])
    assert set(payload) == {"region", "path", "schedule", "slices"}
    assert payload["schedule"] == "dfs" and payload["slices"] == 2 and payload["path"] == [payload["region"]]
    assert all(hints_of(n) == payload for n in hinted(fw))
    bw_hinted = check_backward_inherits(cap.fw, cap.bw)
    assert bw_hinted and all(hints_of(n) == payload for n in bw_hinted)
    # sin's backward (cos, mul) is in the region; mm's backward (mm, t) and cos's are not.
    assert aten.cos.default in targets(bw_hinted)
    assert aten.mm.default not in targets(bw_hinted) and aten.sin.default not in targets(bw_hinted)
    check_only_op_nodes_hinted(fw)
    check_only_op_nodes_hinted(bw)
    # Values and gradients match eager.
    x2, w2 = xw()
    ref = fn(x2, w2)
    ref.backward()
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(w.grad, w2.grad)


def test_functional_is_a_hop_in_the_dynamo_graph_and_inlined_in_aot():
    cap = Capture()
    x, w = xw()
    torch.compile(region_functional, backend=cap)(x, w).backward()
    (dg,) = cap.dynamo
    hops = [n for n in dg.graph.nodes if n.target is torch.ops.higher_order.hinted_context]
    assert len(hops) == 1
    body = getattr(dg, hops[0].args[0].target)
    assert isinstance(body, torch.fx.GraphModule)
    assert {"sin", "mul"} <= {getattr(n.target, "__name__", n.target) for n in body.graph.nodes}
    assert isinstance(hops[0].kwargs["hints"], str)
    for gm in cap.fw + cap.bw:
        assert all(n.target is not torch.ops.higher_order.hinted_context for n in gm.graph.nodes)


def test_decorated_module_method():
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(8, 8)

        @hinted_context(kernel="aten", deterministic=True)
        def forward(self, x):
            return torch.relu(self.lin(x))

    cap = Capture()
    m = Block()
    x = torch.randn(4, 8)
    out = torch.compile(lambda t: m(t).sum(), backend=cap)(x)
    out.backward()
    hinted_fw = hinted(cap.fw[0])
    assert aten.relu.default in targets(hinted_fw) and aten.addmm.default in targets(hinted_fw)
    assert aten.sum.default not in targets(hinted_fw)
    payload = hints_of(hinted_fw[0])
    assert payload["kernel"] == "aten" and payload["deterministic"] is True
    assert check_backward_inherits(cap.fw, cap.bw)
    torch.testing.assert_close(out, m(x).sum())


# ---- the functional op's gradients -------------------------------------------------------------


def test_functional_gradients_match_eager_with_closures_and_several_outputs():
    torch.manual_seed(0)
    scale = torch.randn(8, requires_grad=True)  # captured by the body, not an operand

    def body(a, b, n):
        h = torch.tanh(a @ b) * scale
        return h.softmax(-1), h.sum(0) * n

    def f(a, b):
        p, s = hinted_context(body, a, b, 3, schedule="bfs", slice_dims=[0])
        return (p * p).sum() + s.pow(2).sum()

    a, b = torch.randn(6, 8, requires_grad=True), torch.randn(8, 8, requires_grad=True)
    cap = Capture()
    out = torch.compile(f, backend=cap)(a, b)
    ga, gb, gs = torch.autograd.grad(out, (a, b, scale))
    ref = f(a, b)
    ra, rb, rs = torch.autograd.grad(ref, (a, b, scale))
    torch.testing.assert_close(out, ref)
    torch.testing.assert_close(ga, ra)
    torch.testing.assert_close(gb, rb)
    torch.testing.assert_close(gs, rs)
    assert aten.tanh.default in targets(hinted(cap.fw[0]))
    assert check_backward_inherits(cap.fw, cap.bw)


def test_functional_under_no_grad_uses_the_inference_graph():
    cap = Capture()
    x, w = xw(grad=False)
    with torch.no_grad():
        out = torch.compile(region_functional, backend=cap)(x, w)
    assert not cap.bw
    assert targets(hinted(cap.fw[0])) == {aten.sin.default, aten.mul.Tensor}
    torch.testing.assert_close(out, region_functional(x, w))


def test_other_backends_see_an_ordinary_graph():
    x, w = xw(grad=False)
    for fn in (region_ctx, region_decorator, region_functional):
        for backend in ("eager", "aot_eager"):
            torch._dynamo.reset()
            torch.testing.assert_close(torch.compile(fn, backend=backend)(x, w), fn(x, w))


# ---- nesting ---------------------------------------------------------------------------------------


def test_nested_regions_merge_inner_overrides_and_paths():
    def f(x):
        with hinted_context(schedule="dfs", slices=4, kernel="aten"):
            a = x.sin()
            with hinted_context(schedule="bfs", slice_size=2):
                b = a.cos()
            c = b.exp()
        return c.sum()

    cap = Capture()
    torch.compile(f, backend=cap)(torch.randn(4, 4, requires_grad=True)).backward()
    by_target = {n.target: hints_of(n) for n in calls(cap.fw[0])}
    outer, inner = by_target[aten.sin.default], by_target[aten.cos.default]
    assert by_target[aten.exp.default] == outer
    assert outer == {"region": outer["region"], "path": [outer["region"]], "schedule": "dfs", "slices": 4, "kernel": "aten"}
    # inner overrides schedule, its slice_size replaces the outer slices, kernel is inherited
    assert inner == {
        "region": inner["region"],
        "path": [outer["region"], inner["region"]],
        "schedule": "bfs",
        "slice_size": 2,
        "kernel": "aten",
    }
    assert inner["region"] != outer["region"]
    assert by_target[aten.sum.default] is None
    check_backward_inherits(cap.fw, cap.bw)


def test_adjacent_equal_regions_get_distinct_ids():
    def f(x):
        for _ in range(2):  # same source line twice
            with hinted_context(schedule="dfs"):
                x = x.sin()
        with hinted_context(schedule="dfs"):
            x = x.cos()
        return x

    cap = Capture()
    torch.compile(f, backend=cap)(torch.randn(4))
    payloads = [hints_of(n) for n in calls(cap.fw[0])]
    assert len(payloads) == 3 and all(p is not None for p in payloads)
    assert len({p["region"] for p in payloads}) == 3
    assert all({k: v for k, v in p.items() if k not in ("region", "path")} == {"schedule": "dfs"} for p in payloads)


def test_functional_nested_in_context_and_context_nested_in_functional():
    def body(t):
        u = t.sin()
        with hinted_context(kernel="cudnn"):
            u = u.cos()
        return u

    def f(x):
        with hinted_context(schedule="auto", memory_budget="1GiB"):
            y = hinted_context(body, x, slices=2)
        return y.exp()

    cap = Capture()
    torch.compile(f, backend=cap)(torch.randn(4, requires_grad=True)).sum().backward()
    by_target = {n.target: hints_of(n) for n in calls(cap.fw[0])}
    fn_region, inner = by_target[aten.sin.default], by_target[aten.cos.default]
    assert fn_region["schedule"] == "auto" and fn_region["memory_budget"] == 2**30 and fn_region["slices"] == 2
    assert len(fn_region["path"]) == 2
    assert inner["path"] == fn_region["path"] + [inner["region"]]
    assert inner["kernel"] == "cudnn" and inner["slices"] == 2 and inner["memory_budget"] == 2**30
    assert by_target[aten.exp.default] is None
    check_backward_inherits(cap.fw, cap.bw)


# ---- flex_attention ----------------------------------------------------------------------------------


def _flex_region(q, k, v):
    from torch.nn.attention.flex_attention import flex_attention

    with hinted_context(schedule="dfs", slice_dims=[0, 1], kernel="fused"):
        o = flex_attention(q, k, v, score_mod=lambda s, b, h, qi, ki: s + (qi - ki) * 0.01)
    return o.sum()


def _qkv(grad):
    torch.manual_seed(0)
    return [torch.randn(2, 2, 16, 8, requires_grad=grad) for _ in range(3)]


def test_flex_attention_region_forward():
    cap = Capture()
    torch.compile(_flex_region, backend=cap)(*_qkv(False))
    flex = [n for n in calls(cap.fw[0]) if n.target is torch.ops.higher_order.flex_attention]
    assert len(flex) == 1 and hints_of(flex[0])["slice_dims"] == [0, 1]
    getitems = [n for n in calls(cap.fw[0]) if n.args and n.args[0] is flex[0]]
    assert getitems and all(hints_of(n) == hints_of(flex[0]) for n in getitems)
    sums = [n for n in calls(cap.fw[0]) if n.target is aten.sum.default]
    assert sums and hints_of(sums[-1]) is None


def test_flex_attention_public_api_refuses_cpu_backward():
    # torch 2.11: flex_attention() refuses requires_grad inputs on CPU, compiled or not.
    with pytest.raises(NotImplementedError, match="does not support backward on CPU"):
        torch.compile(_flex_region, backend=Capture())(*_qkv(True))


def test_flex_attention_region_backward(monkeypatch):
    # The refusal above is only the public API's device check: the flex_attention ops themselves run
    # on CPU. Skip the check to get the real backward graph with flex_attention_backward.
    import torch.nn.attention.flex_attention as fa

    monkeypatch.setattr(fa, "_validate_device", lambda *args: None)
    cap = Capture()
    q, k, v = _qkv(True)
    torch.compile(_flex_region, backend=cap)(q, k, v).backward()
    fw_flex = [n for n in calls(cap.fw[0]) if n.target is torch.ops.higher_order.flex_attention]
    bw_flex = [n for n in calls(cap.bw[0]) if n.target is torch.ops.higher_order.flex_attention_backward]
    assert len(fw_flex) == 1 and len(bw_flex) == 1
    assert hints_of(bw_flex[0]) == hints_of(fw_flex[0]) and hints_of(bw_flex[0])["kernel"] == "fused"
    check_backward_inherits(cap.fw, cap.bw)
    assert q.grad is not None and torch.isfinite(q.grad).all()


# ---- autograd.Function backward ---------------------------------------------------------------------


class _SinWithHintedBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x.sin()

    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        with hinted_context(schedule="bfs"):
            return g * x.cos()


class _SinWithFunctionalBackward(_SinWithHintedBackward):
    @staticmethod
    def backward(ctx, g):
        (x,) = ctx.saved_tensors
        return hinted_context(lambda a, b: a * b.cos(), g, x, kernel="aten")


@pytest.mark.parametrize("fn_cls", [_SinWithHintedBackward, _SinWithFunctionalBackward], ids=["with", "functional"])
def test_region_inside_autograd_function_backward(fn_cls):
    def f(x):
        return fn_cls.apply(x * 2).sum()

    cap = Capture()
    x = torch.randn(4, 4, requires_grad=True)
    out = torch.compile(f, backend=cap)(x)
    out.backward()
    assert not hinted(cap.fw[0])  # the forward has no region
    bw_hinted = hinted(cap.bw[0])
    assert targets(bw_hinted) == {aten.cos.default, aten.mul.Tensor}
    assert len({hints_of(n)["region"] for n in bw_hinted}) == 1
    # the chain rule through `x * 2` is outside the region
    muls = [n for n in calls(cap.bw[0]) if n.target is aten.mul.Tensor]
    assert any(hints_of(n) is None for n in muls)
    torch.testing.assert_close(x.grad, 2 * (2 * x).cos())


# ---- graph breaks and recompilation ---------------------------------------------------------------------


def test_graph_break_inside_region():
    def f(x, w):
        y = x @ w
        with hinted_context(schedule="dfs", slices=2):
            z = y.sin()
            torch._dynamo.graph_break()
            z = z * 2
        return z.cos().sum()

    cap = Capture()
    x, w = xw()
    out = torch.compile(f, backend=cap)(x, w)
    out.backward()
    # Both halves compiled (upstream would drop the frame to eager), both carry the one region.
    assert len(cap.fw) == 2 and len(cap.bw) == 2
    first, second = cap.fw
    assert targets(hinted(first)) == {aten.sin.default} and aten.mm.default in targets(calls(first))
    assert targets(hinted(second)) == {aten.mul.Tensor}
    assert {aten.cos.default, aten.sum.default} <= targets(calls(second)) - targets(hinted(second))
    assert hints_of(hinted(first)[0]) == hints_of(hinted(second)[0])
    check_backward_inherits(cap.fw, cap.bw)
    x2, w2 = xw()
    f(x2, w2).backward()
    torch.testing.assert_close(x.grad, x2.grad)


def test_graph_break_inside_nested_region_keeps_both_levels():
    def f(x):
        with hinted_context(schedule="dfs"):
            with hinted_context(slices=3):
                y = x.sin()
                torch._dynamo.graph_break()
                y = y.cos()
            y = y.exp()
        return y

    cap = Capture()
    torch.compile(f, backend=cap)(torch.randn(4))
    assert len(cap.fw) == 2
    sin = hints_of(hinted(cap.fw[0])[0])
    by_target = {n.target: hints_of(n) for n in calls(cap.fw[1])}
    assert by_target[aten.cos.default] == sin and sin["slices"] == 3 and len(sin["path"]) == 2
    assert by_target[aten.exp.default]["region"] == sin["path"][0]


def _broken_body(y):
    z = y.sin()
    torch._dynamo.graph_break()
    return z * 2


def test_graph_break_inside_functional_body():
    # Dynamo cannot trace a body that breaks the graph: it runs the higher-order op eagerly and
    # compiles the body's frames on their own. Both sides of the break keep the region's hints.
    def f(x, w):
        return hinted_context(_broken_body, x @ w, schedule="dfs", slices=2).cos().sum()

    cap = Capture()
    x, w = xw()
    torch.compile(f, backend=cap)(x, w).backward()
    by_target = {n.target: hints_of(n) for gm in cap.fw for n in calls(gm)}
    assert by_target[aten.sin.default] == by_target[aten.mul.Tensor]
    assert by_target[aten.sin.default]["schedule"] == "dfs" and by_target[aten.sin.default]["slices"] == 2
    assert by_target[aten.mm.default] is None and by_target[aten.cos.default] is None
    assert len(check_backward_inherits(cap.fw, cap.bw)) >= 2  # the sin and mul backward ops
    x2, w2 = xw()
    _broken_body(x2 @ w2).cos().sum().backward()
    torch.testing.assert_close(x.grad, x2.grad)
    torch.testing.assert_close(w.grad, w2.grad)


def test_graph_break_inside_functional_body_nested_in_region():
    def f(x):
        with hinted_context(schedule="dfs"):
            return hinted_context(_broken_body, x, slices=3).exp()

    cap = Capture()
    torch.compile(f, backend=cap)(torch.randn(4))
    by_target = {n.target: hints_of(n) for gm in cap.fw for n in calls(gm)}
    inner = by_target[aten.sin.default]
    assert inner == by_target[aten.mul.Tensor] and inner["slices"] == 3 and inner["schedule"] == "dfs"
    assert len(inner["path"]) == 2 and by_target[aten.exp.default]["region"] == inner["path"][0]


def test_recompilation_with_new_shapes():
    cap = Capture()
    cf = torch.compile(region_ctx, backend=cap, dynamic=False)
    for shape in ((4, 8), (6, 16)):
        x, w = xw(shape)
        cf(x, w).backward()
    assert len(cap.fw) == 2 and len(cap.bw) == 2
    for fw in cap.fw:
        assert targets(hinted(fw)) == {aten.sin.default, aten.mul.Tensor}
    check_backward_inherits(cap.fw, cap.bw)
    shapes = [n.meta["val"].shape for fw in cap.fw for n in hinted(fw) if n.target is aten.sin.default]
    assert shapes == [torch.Size([4, 8]), torch.Size([6, 16])]


def test_dynamic_shapes():
    cap = Capture()
    cf = torch.compile(region_functional, backend=cap, dynamic=True)
    x, w = xw((5, 8))
    cf(x, w).backward()
    assert targets(hinted(cap.fw[0])) == {aten.sin.default, aten.mul.Tensor}


# ---- outside torch.compile --------------------------------------------------------------------------------


def test_eager_runs_unchanged_and_records_nothing():
    import torch.fx.traceback as fx_traceback

    x, w = xw(grad=False)
    before = dict(fx_traceback.current_meta)
    with hinted_context(schedule="dfs") as entered:
        assert entered is None
        assert fx_traceback.current_meta == before
        y = x @ w
    torch.testing.assert_close(y, x @ w)
    torch.testing.assert_close(region_functional(x, w), ((x @ w).sin() * 2).cos().sum())
    torch.testing.assert_close(region_decorator(x, w), region_ctx(x, w))
    assert fx_traceback.current_meta == before


def test_make_fx_outside_dynamo_records_hints():
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x):
        with hinted_context(schedule="bfs"):
            y = x.sin()
        return hinted_context(torch.cos, y, kernel="aten")

    with torch.fx.traceback.preserve_node_meta():
        gm = make_fx(f)(torch.randn(3))
    by_target = {n.target: hints_of(n) for n in calls(gm)}
    assert by_target[aten.sin.default]["schedule"] == "bfs"
    assert by_target[aten.cos.default]["kernel"] == "aten"
    assert by_target[aten.sin.default]["region"] != by_target[aten.cos.default]["region"]


def test_op_is_registered():
    assert torch.ops.higher_order.hinted_context.name() == "hinted_context"
    x = torch.randn(3)
    torch.testing.assert_close(torch.ops.higher_order.hinted_context(torch.sin, x, hints='{"region": 0, "path": [0]}'), x.sin())
