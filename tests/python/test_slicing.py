"""BFS vs DFS slice scheduling through the whole backend: the hinted region runs slice by slice
(a hintbackend::slice_loop in the IR) and gives the same results as BFS, forward and backward.

In training, hintbackend's partition (python/hintbackend/partition.py) recomputes a dfs/auto region's
saved intermediates in the backward: the forward saves the region's inputs instead of its S x S
scores, and the backward region (recompute + gradient ops) becomes one slice loop."""

import logging
import os
import re

import pytest
import torch
import torch.nn.functional as F
from functorch.compile import make_boxed_func
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.partitioners import default_partition, min_cut_rematerialization_partition

from conftest import device
from helpers import randn, graph_dirs
from hintbackend import hinted_context
from hintbackend.partition import partition

B, H, S, D = 2, 4, 16, 8  # S differs from every other size, so "S x S" is recognizable in shapes


def attention(q, k, v):
    s = (q @ k.transpose(-1, -2)) * (q.shape[-1] ** -0.5)
    return s.float().softmax(-1).to(q.dtype) @ v


def run(schedule, q, k, v, dump_dir, **hints):
    def f(q, k, v):
        with hinted_context(schedule=schedule, **hints):
            out = attention(q, k, v)
        return out * 2

    torch._dynamo.reset()
    qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = torch.compile(f, backend="hintbackend", options={"strict": True, "dump_dir": dump_dir})(qq, kk, vv)
    out.backward(torch.ones_like(out))
    return out.detach(), qq.grad, kk.grad, vv.grad


def final_ir(dump_dir, after=None):
    """Each dumped graph's final IR, or its IR as pass `after` left it (the dump of the latest pass up to
    it that changed the graph: an unchanged one's dump says "(unchanged)")."""
    def read(d):
        if after is None:
            return open(os.path.join(dump_dir, d, "ir-final.txt")).read()
        dumps = sorted((int(m.group(1)), m.group(2), n) for n in os.listdir(os.path.join(dump_dir, d))
                       if (m := re.fullmatch(r"ir-after-(\d+)-(.+)\.txt", n)))
        last = next(k for k, p, _ in dumps if p == after)
        text = open(os.path.join(dump_dir, d, "ir-import.txt")).read()
        for k, _, n in dumps:
            t = open(os.path.join(dump_dir, d, n)).read()
            if k <= last and not t.startswith("(unchanged)"):
                text = t
        return text
    return {d: read(d) for d in graph_dirs(dump_dir)}


def main_graph(ir):
    """The top-level graph of an ir-final.txt dump, without the slice bodies after it."""
    return ir[:ir.index("\n}\n")]


def has_s_by_s(text):
    return re.search(rf"\[[^\]]*\b{S}, {S}\]", text) is not None


def float64_reference(q, k, v):
    qq, kk, vv = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    out = attention(qq, kk, vv) * 2
    out.backward(torch.ones_like(out))
    return out.detach(), qq.grad, kk.grad, vv.grad


@pytest.mark.parametrize("slices", [2, 4, 8])
def test_dfs_equals_bfs_forward_and_backward(tmp_path, slices):
    torch.manual_seed(0)
    q, k, v = randn(B, H, S, D), randn(B, H, S, D), randn(B, H, S, D)
    bfs = run("bfs", q, k, v, str(tmp_path / "bfs"))
    dfs = run("dfs", q, k, v, str(tmp_path / "dfs"), slices=slices)
    ref = float64_reference(q, k, v)
    for name, a, b, r in zip(("out", "dq", "dk", "dv"), dfs, bfs, ref):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-6, msg=lambda m: f"{name} dfs vs bfs: {m}")
        # and against a float64 eager run of the function itself
        torch.testing.assert_close(a.double(), r, rtol=1e-5, atol=1e-5, msg=lambda m: f"{name} vs eager: {m}")
    dfs_ir = final_ir(str(tmp_path / "dfs"))
    bfs_ir = final_ir(str(tmp_path / "bfs"))
    for kind in ("forward", "backward"):
        assert any(f"slices={slices}" in t and "hintbackend::slice_loop" in t for d, t in dfs_ir.items()
                   if d.startswith(kind)), f"the {kind} DFS region must become a slice loop"
    assert not any("hintbackend::slice_loop" in t for t in bfs_ir.values()), "BFS must not slice"
    # The S x S scores exist only inside the slice bodies: the forward does not save them and the
    # backward recomputes them slice by slice. BFS (default partition) has them in both graphs.
    for d, t in dfs_ir.items():
        assert not has_s_by_s(main_graph(t)), f"DFS graph {d} holds an S x S value outside its slice loop:\n{t}"
    for kind in ("forward", "backward"):
        assert any(has_s_by_s(main_graph(t)) for d, t in bfs_ir.items() if d.startswith(kind))


class Captured:
    """A torch.compile backend that records AOTAutograd's joint graph and partitions it with both
    default_partition and hintbackend's partition over the same base (options={"partition": "default"}),
    running the default's forward and backward."""

    def __init__(self):
        self.results = []  # (default (fw, bw), hintbackend (fw, bw), num_fwd_outputs)

    def __call__(self, gm, example_inputs):
        def partition_fn(joint, joint_inputs, **kwargs):
            want = default_partition(joint, joint_inputs, **kwargs)
            got = partition(joint, joint_inputs, base="default", **kwargs)
            self.results.append((want, got, kwargs["num_fwd_outputs"]))
            return want

        compiler = lambda g, _: make_boxed_func(g.forward)  # noqa: E731
        return aot_autograd(fw_compiler=compiler, bw_compiler=compiler, partition_fn=partition_fn)(gm, example_inputs)


def saved_values(fw, num_fwd_outputs):
    out = next(iter(fw.graph.find_nodes(op="output")))
    return list(out.args[0])[num_fwd_outputs:]


def partitions_of(f, *args):
    backend = Captured()
    out = torch.compile(f, backend=backend)(*args)
    out.sum().backward()
    assert len(backend.results) == 1
    return backend.results[0]


def qkv():
    return [randn(B, H, S, D).requires_grad_(True) for _ in range(3)]


@pytest.mark.parametrize("hints", [None, {"schedule": "bfs"}, {"schedule": "bfs", "slices": 4},
                                   {"schedule": "dfs", "slices": 1}])
def test_bfs_and_unhinted_graphs_partition_exactly_like_default(hints):
    def f(q, k, v):
        if hints is None:
            return attention(q, k, v) * 2
        with hinted_context(**hints):
            return attention(q, k, v) * 2

    (want_fw, want_bw), (got_fw, got_bw), n = partitions_of(f, *qkv())
    assert len(saved_values(got_fw, n)) == len(saved_values(want_fw, n))
    assert got_fw.code == want_fw.code
    assert got_bw.code == want_bw.code


def min_cut_results(f, *args, recompute_materialized=True):
    """(min-cut as torch's config has it, min-cut allowed to recompute what the backward materializes,
    default_partition, hintbackend's partition, num_fwd_outputs) of f's one joint graph."""
    from torch._functorch import config as functorch_config
    results = []

    def backend(gm, example_inputs):
        def partition_fn(joint, joint_inputs, **kwargs):
            plain = min_cut_rematerialization_partition(joint, joint_inputs, compiler="inductor", **kwargs)
            with functorch_config.patch(ban_recompute_materialized_backward=False):
                recompute = min_cut_rematerialization_partition(joint, joint_inputs, compiler="inductor", **kwargs)
            default = default_partition(joint, joint_inputs, **kwargs)
            got = partition(joint, joint_inputs, recompute_materialized=recompute_materialized, **kwargs)
            results.append((plain, recompute, default, got, kwargs["num_fwd_outputs"]))
            return got

        compiler = lambda g, _: make_boxed_func(g.forward)  # noqa: E731
        return aot_autograd(fw_compiler=compiler, bw_compiler=compiler, partition_fn=partition_fn)(gm, example_inputs)

    torch.compile(f, backend=backend)(*args).sum().backward()
    assert len(results) == 1
    return results[0]


def saved_bytes(fw, n):
    return sum(v.meta["val"].numel() * v.meta["val"].element_size() for v in saved_values(fw, n)
               if isinstance(v.meta.get("val"), torch.Tensor))


def test_unhinted_graphs_use_the_min_cut_partition():
    """Graphs with no dfs/auto region get min_cut_rematerialization_partition (the default partition
    option): exactly its forward and backward, saving no more bytes than default_partition."""
    def f(x, w):
        return torch.nn.functional.gelu(x @ w).tanh().sum(-1)

    x, w = randn(8, 64).requires_grad_(True), randn(64, 64).requires_grad_(True)
    _, (want_fw, want_bw), (default_fw, _), (got_fw, got_bw), n = min_cut_results(f, x, w)
    assert got_fw.code == want_fw.code and got_bw.code == want_bw.code
    assert saved_bytes(got_fw, n) <= saved_bytes(default_fw, n)


@pytest.mark.parametrize("recompute", [True, False], ids=["recompute-materialized", "disabled"])
def test_min_cut_recomputes_what_the_backward_materializes(recompute):
    """GELU's output feeds a layer norm, whose backward reads it: torch's min-cut saves it (it bans
    recomputing a value the backward materializes, which Inductor could not fuse); hintbackend's partition
    recomputes it from the matmul's output, which is saved anyway (recompute-materialized), and saves one
    [N, 64] value less. disable_passes=["recompute-materialized"] gives torch's min-cut exactly."""
    ln = torch.nn.LayerNorm(64).to(device())

    def f(x, w):
        return ln(torch.nn.functional.gelu(x @ w)).tanh()

    x, w = randn(32, 64).requires_grad_(True), randn(64, 64).requires_grad_(True)
    (plain_fw, plain_bw), (re_fw, re_bw), _, (got_fw, got_bw), n = min_cut_results(f, x, w, recompute_materialized=recompute)
    gelu = torch.ops.aten.gelu.default
    assert not any(node.target == gelu for node in plain_bw.graph.nodes)
    if not recompute:
        assert got_fw.code == plain_fw.code and got_bw.code == plain_bw.code
        return
    assert got_fw.code == re_fw.code and got_bw.code == re_bw.code
    assert any(node.target == gelu for node in got_bw.graph.nodes), got_bw.code
    assert saved_bytes(plain_fw, n) - saved_bytes(got_fw, n) == 32 * 64 * x.element_size()


@pytest.mark.parametrize("hints", [{"schedule": "dfs", "slices": 4}, {"schedule": "dfs"},
                                   {"schedule": "auto", "memory_budget": 4096}])
def test_dfs_and_auto_regions_save_their_inputs_not_their_intermediates(hints):
    def f(x, w):
        q, k, v = (x @ w).view(B, S, 3, H, D).permute(2, 0, 3, 1, 4)  # outside the region
        with hinted_context(**hints):
            out = attention(q, k, v)
        return out.sum(1)

    x, w = randn(B, S, 4 * D).requires_grad_(True), randn(4 * D, 3 * H * D).requires_grad_(True)
    (want_fw, _), (got_fw, got_bw), n = partitions_of(f, x, w)
    shapes = lambda nodes: [tuple(v.meta["val"].shape) for v in nodes]  # noqa: E731
    assert (B, H, S, S) in shapes(saved_values(want_fw, n)), "the default saves the softmax"
    saved = saved_values(got_fw, n)
    assert not any(has_s_by_s(str(list(shape))) for shape in shapes(saved)), shapes(saved)
    # what the region reads: q, k and v (selects of the projection), plus what x @ w's backward needs
    assert sum(v.meta["val"].shape == (B, H, S, D) for v in saved) == 3, shapes(saved)
    # the recomputed region nodes keep their hints in the backward graph
    bw_regions = {node.meta.get("custom", {}).get("hintbackend", {}).get("schedule")
                  for node in got_bw.graph.nodes if node.target == torch.ops.aten._softmax.default}
    assert bw_regions == {hints["schedule"]}, "the backward must recompute the softmax inside the region"


def test_auto_region_that_fits_its_budget_whole_partitions_like_default(caplog):
    """An auto region whose budget the default forward already meets keeps 1 slice in the chooser, so
    recomputing it in the backward would only cost time: it partitions exactly like the default, and
    the log says so. A budget below that forward's simulated peak still recomputes."""
    def f(q, k, v, budget):
        with hinted_context(schedule="auto", memory_budget=budget):
            return attention(q, k, v) * 2

    with caplog.at_level(logging.INFO, logger="hintbackend"):
        (want_fw, want_bw), (got_fw, got_bw), n = partitions_of(lambda *a: f(*a, "1GB"), *qkv())
    assert got_fw.code == want_fw.code
    assert got_bw.code == want_bw.code
    assert any("slice-schedule leaves region" in r.getMessage() and "whole" in r.getMessage() for r in caplog.records)
    torch._dynamo.reset()
    (want_fw, _), (got_fw, _), n = partitions_of(lambda *a: f(*a, 4096), *qkv())
    assert len(saved_values(got_fw, n)) < len(saved_values(want_fw, n))


def test_partition_asks_the_slice_chooser():
    """One owner for the slice decision: an auto region without a memory_budget, which the chooser keeps
    whole (1 slice), is not recomputed either (before, the partition recomputed it for nothing); a dfs
    region with slices=1 neither. A dfs region the chooser slices is recomputed."""
    def auto(q, k, v):
        with hinted_context(schedule="auto"):
            return attention(q, k, v) * 2

    def dfs(q, k, v, slices):
        with hinted_context(schedule="dfs", slices=slices):
            return attention(q, k, v) * 2

    for fn in (auto, lambda *a: dfs(*a, 1)):
        torch._dynamo.reset()
        (want_fw, want_bw), (got_fw, got_bw), _ = partitions_of(fn, *qkv())
        assert got_fw.code == want_fw.code and got_bw.code == want_bw.code
    torch._dynamo.reset()
    (want_fw, _), (got_fw, _), n = partitions_of(lambda *a: dfs(*a, 4), *qkv())
    assert len(saved_values(got_fw, n)) < len(saved_values(want_fw, n))


def test_dfs_training_through_a_projection_equals_eager(tmp_path):
    """q, k, v come from a projection outside the region: the forward saves them, not the scores."""
    torch.manual_seed(0)

    def f(x, w):
        q, k, v = (x @ w).view(B, S, 3, H, D).permute(2, 0, 3, 1, 4)
        with hinted_context(schedule="dfs", slices=4):
            out = attention(q, k, v)
        return out.transpose(1, 2).reshape(B, S, H * D)

    x, w = randn(B, S, 4 * D), randn(4 * D, 3 * H * D) * 0.2
    got = [t.clone().requires_grad_(True) for t in (x, w)]
    want = [t.double().requires_grad_(True) for t in (x, w)]
    dump = str(tmp_path / "dump")
    out = torch.compile(f, backend="hintbackend", options={"strict": True, "dump_dir": dump})(*got)
    ref = f(*want)
    cot = randn(*ref.shape)
    out.backward(cot)
    ref.backward(cot.double())
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    for g, r in zip(got, want):
        torch.testing.assert_close(g.grad.double(), r.grad, rtol=1e-5, atol=1e-5)
    irs = final_ir(dump)
    assert all("hintbackend::slice_loop" in t for t in irs.values()), "forward and backward must slice"
    assert not any(has_s_by_s(main_graph(t)) for t in irs.values())


def test_dropout_in_a_dfs_region_is_saved_not_recomputed(caplog):
    """Recomputing dropout would draw a different mask; its outputs are saved and a warning names it."""
    def f(q, k, v):
        with hinted_context(schedule="dfs", slices=2):
            p = F.dropout((q @ k.transpose(-1, -2)).softmax(-1), 0.5)
            return p @ v

    torch.manual_seed(0)
    q, k, v = qkv()
    with caplog.at_level(logging.WARNING, logger="hintbackend"):
        (_, _), (got_fw, _), n = partitions_of(f, q, k, v)
    warnings = [r.getMessage() for r in caplog.records if r.name == "hintbackend"]
    assert any("native_dropout" in m and "draws random numbers" in m and "move the random op" in m
               for m in warnings), warnings
    saved = [v.meta["val"] for v in saved_values(got_fw, n)]
    assert sum(t.shape == (B, H, S, S) for t in saved) == 2, "dropout's output and mask are saved"

    # Same results as torch's own execution of the same graphs (aot_eager), drawing the same mask (a
    # different mask would differ by O(1); the tolerance covers the row-softmax kernels' float32
    # rounding, whose sums run in another order than ATen's).
    results = []
    for backend, options in (("hintbackend", {"strict": True}), ("aot_eager", None)):
        torch._dynamo.reset()
        args = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        torch.manual_seed(1)
        out = torch.compile(f, backend=backend, options=options)(*args)
        out.backward(torch.ones_like(out))
        results.append([out.detach()] + [a.grad for a in args])
    for name, a, b in zip(("out", "dq", "dk", "dv"), *results):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name}: {m}")


def test_mutated_region_input_keeps_the_default_partition(caplog):
    """The region reads m, which the graph mutates afterwards: recomputing in the backward would read the
    mutated m, so this graph keeps the default partition and the log says why."""
    def f(q, k, v, m):
        with hinted_context(schedule="dfs", slices=2):
            out = ((q @ k.transpose(-1, -2)) + m).softmax(-1) @ v
        m.add_(1)
        return out

    torch.manual_seed(0)
    q, k, v = qkv()
    m = randn(S, S)
    with caplog.at_level(logging.WARNING, logger="hintbackend"):
        (want_fw, want_bw), (got_fw, got_bw), _ = partitions_of(f, q, k, v, m.clone())
    assert got_fw.code == want_fw.code and got_bw.code == want_bw.code
    assert any("keeps the default partition" in r.getMessage() and "mutated" in r.getMessage()
               for r in caplog.records if r.name == "hintbackend")

    torch._dynamo.reset()
    got = [t.detach().clone().requires_grad_(True) for t in (q, k, v)] + [m.clone()]
    want = [t.detach().clone().requires_grad_(True) for t in (q, k, v)] + [m.clone()]
    out = torch.compile(f, backend="hintbackend", options={"strict": True})(*got)
    ref = f(*want)
    out.pow(2).sum().backward()
    ref.pow(2).sum().backward()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[3], want[3])
    for g, r in zip(got[:3], want[:3]):
        torch.testing.assert_close(g.grad, r.grad, rtol=1e-5, atol=1e-5)


def test_auto_schedule_with_an_impossible_budget_errors():
    q, k, v = randn(2, 4, 16, 8), randn(2, 4, 16, 8), randn(2, 4, 16, 8)

    def f(q, k, v):
        with hinted_context(schedule="auto", memory_budget=64):
            return attention(q, k, v)

    with pytest.raises(Exception, match="memory_budget"):
        with torch.no_grad():
            torch.compile(f, backend="hintbackend")(q, k, v)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sdpa_without_dropout_slices_forward_and_backward(tmp_path, dtype):
    """SDPA kernels are tagged random for their dropout; with dropout_p=0 they draw nothing, so a dfs
    region around one slices (both graphs) and equals BFS. On CUDA the kernel (efficient attention in
    f32, cuDNN in bf16 on Hopper) also returns its RNG seed and offset, which leave the loop replicated."""
    if dtype == torch.bfloat16 and device() == "cpu":
        pytest.skip("bf16 picks a CUDA kernel (cuDNN or flash) only on CUDA")

    def f(q, k, v, schedule):
        with hinted_context(schedule=schedule, slices=4):
            out = F.scaled_dot_product_attention(q, k, v)
        return out * 2

    torch.manual_seed(5)
    q, k, v = (randn(2, 4, 64, 32, dtype=dtype) for _ in range(3))
    results = {}
    for schedule in ("bfs", "dfs"):
        torch._dynamo.reset()
        xs = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        out = torch.compile(lambda *a: f(*a, schedule), backend="hintbackend",
                            options={"strict": True, "dump_dir": str(tmp_path / schedule)})(*xs)
        out.backward(torch.ones_like(out))
        results[schedule] = [out.detach()] + [x.grad for x in xs]
    tol = {"rtol": 1e-5, "atol": 1e-6} if dtype == torch.float32 else {"rtol": 2e-2, "atol": 2e-2}
    for got, want in zip(results["dfs"], results["bfs"]):
        torch.testing.assert_close(got, want, **tol)
    irs = final_ir(str(tmp_path / "dfs"))
    for kind in ("forward", "backward"):
        ir = "".join(t for d, t in irs.items() if d.startswith(kind))
        assert "hintbackend::slice_loop(" in ir, ir


@pytest.mark.parametrize("schedule", ["bfs", "dfs"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_softmax_upcast_is_folded_on_cuda(tmp_path, schedule, dtype):
    """fp16 scores upcast for the softmax (`s.float().softmax(-1)`): on CUDA, fold-softmax-upcast makes the
    softmax read fp16 with half_to_float (no float32 copy of the scores), in the forward and in the
    backward's recompute. bf16 (CUDA's half_to_float refuses it) and CPU keep the upcast. Results match
    eager (half-precision tolerance) and sit as close to float64 as eager's do."""
    torch.manual_seed(11)
    q, k, v = (randn(B, H, S, D, dtype=dtype) for _ in range(3))
    got = run(schedule, q, k, v, str(tmp_path), **({"slices": 4} if schedule == "dfs" else {}))
    qq, kk, vv = (t.detach().clone().requires_grad_(True) for t in (q, k, v))
    out = attention(qq, kk, vv) * 2
    out.backward(torch.ones_like(out))
    want = (out.detach(), qq.grad, kk.grad, vv.grad)
    ref = float64_reference(q, k, v)
    for g, w, r in zip(got, want, ref):
        torch.testing.assert_close(g, w, rtol=2e-2, atol=2e-2)
        assert (g.double() - r).abs().max() <= 2 * (w.double() - r).abs().max() + 1e-3
    folded = device() == "cuda" and dtype == torch.float16
    irs = final_ir(str(tmp_path), after="fold-softmax-upcast")
    finals = final_ir(str(tmp_path))
    for kind in ("forward", "backward") if schedule == "dfs" else ("forward",):
        ir = "".join(t for d, t in irs.items() if d.startswith(kind))
        assert re.search(rf"aten::_softmax\.default\(%\w+, -1, {'true' if folded else 'false'}\)", ir), ir
        # row-softmax-fusion then takes the chain, half_to_float or not.
        final = "".join(t for d, t in finals.items() if d.startswith(kind))
        assert "hintbackend::row_softmax" in final and "aten::_softmax.default" not in final, final


def test_flex_attention_default_block_mask_stays_outside_the_loop(tmp_path):
    """flex_attention without a block_mask builds its default one inside the region (ones, arange,
    index_put, sort ...: no slicing rule, but computed from constants only). Those ops stay outside the
    slice loop, run once; the attention itself is sliced (on CUDA this region did not slice at all)."""
    from torch.nn.attention.flex_attention import flex_attention

    def bias(score, b, h, q_idx, kv_idx):
        return score + (q_idx - kv_idx) * 0.01

    def f(q, k, v):
        with hinted_context(schedule="dfs", slices=4):
            return flex_attention(q, k, v, score_mod=bias)

    torch.manual_seed(5)
    q, k, v = (randn(B, H, S, D) for _ in range(3))
    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(f, backend="hintbackend", options={"strict": True, "dump_dir": str(tmp_path)})(q, k, v)
        want = flex_attention(q, k, v, score_mod=bias)
        ref = flex_attention(q.double(), k.double(), v.double(), score_mod=bias)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)
    assert (got.double() - ref).abs().max() <= 2 * (want.double() - ref).abs().max() + 1e-6
    ir = "".join(final_ir(str(tmp_path)).values())
    loop = main_graph(ir)
    assert "hintbackend::slice_loop(" in loop and "aten::sort" in loop, ir  # the mask: outside, once
    assert "higher_order::flex_attention" in ir[len(loop):], ir             # the attention: in the body


@pytest.mark.parametrize("buf_dtype", [torch.float32, torch.bfloat16])
def test_flex_backward_with_a_learned_bias_sums_its_gradient_over_batch_slices(tmp_path, buf_dtype):
    """A learned relative bias lb[q - kv + S - 1, h] under a causal mask (its score_mod reads the head
    index, so the region slices along batch only: slice_dims=[0]) trained in a dfs region: the backward's
    slice loop computes each batch's part of lb's gradient and sums them (out_dims -2 in the dump), q/k/v's
    gradients are split by slice. Without a slice_dims hint the region narrows to batch by itself; along
    batch and heads each slice reads its global head index from a table. Outputs and every gradient sit as
    close to a float64 reference as the unsliced compile's."""
    from torch.nn.attention.flex_attention import create_block_mask

    from flex_reference import causal, dense, hop

    Bn = 4
    mask = create_block_mask(causal, None, None, S, S, device=device())

    def f(q, k, v, lb, hints):
        with hinted_context(**hints):
            out = hop(q, k, v, lambda s, b, h, qi, ki: s + lb[qi - ki + S - 1, h], block_mask=mask)[0]
        return out * 2

    torch.manual_seed(8)
    q, k, v = (randn(Bn, H, S, D) for _ in range(3))
    lb = (torch.randn(2 * S - 1, H, device=device()) * 0.5).to(buf_dtype)
    grad = randn(Bn, H, S, D)
    leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v, lb)]
    want = dense(*leaves[:3], lambda s, b, h, qi, ki: s + leaves[3][qi - ki + S - 1, h], causal)[0] * 2
    want.backward(grad.double())
    ref = [want.detach()] + [t.grad for t in leaves]

    results = {}
    # Without slice_dims, slice-legality narrows the default (batch and heads) to batch: the score_mod reads h.
    # Along batch and heads, each slice reads its global head index from a table (slice-schedule).
    for name, hints in (("bfs", {"schedule": "bfs"}), ("dfs", {"schedule": "dfs", "slice_dims": [0]}),
                        ("dfs-default", {"schedule": "dfs"}), ("dfs-heads", {"schedule": "dfs", "slice_dims": [0, 1]})):
        torch._dynamo.reset()
        xs = [t.detach().clone().requires_grad_(True) for t in (q, k, v, lb)]
        compiled = torch.compile(lambda *a: f(*a, hints), backend="hintbackend",
                                 options={"strict": True, "dump_dir": str(tmp_path / name)})
        out = compiled(*xs)
        out.backward(grad)
        results[name] = [out.detach()] + [t.grad for t in xs]
    err = lambda a, r: (a.double() - r).abs().max().item()  # noqa: E731
    for dfs, slices in (("dfs", 4), ("dfs-default", 4), ("dfs-heads", 4 * H)):
        for what, d, b, r in zip(("out", "dq", "dk", "dv", "dlb"), results[dfs], results["bfs"], ref):
            assert d.dtype == b.dtype and d.shape == b.shape, what
            assert err(d, r) <= 2 * err(b, r) + 1e-5, (dfs, what, err(d, r), err(b, r))
        backward = "".join(t for d, t in final_ir(str(tmp_path / dfs)).items() if d.startswith("backward"))
        loop = main_graph(backward)
        summed = rf"hintbackend::slice_loop\(.*slices={slices}, extent={slices}, out_dims=\[[-0-9, ]*-2"
        assert re.search(summed, loop), backward
        assert "higher_order::flex_attention_backward" not in loop, loop  # it runs in the body, per slice
        assert "higher_order::flex_attention_backward" in backward[len(loop):], backward
    def notes(run):
        return "".join(open(tmp_path / run / d / "notes.txt").read() for d in graph_dirs(str(tmp_path / run)))

    assert "no slice_dims hint: batch only:" in notes("dfs-default") and "reads the head index" in notes("dfs-default")
    assert "reads the head index: each slice reads the global one from an index table" in notes("dfs-heads")


def test_flex_mask_reading_the_head_index_slices_along_heads(tmp_path):
    """A per-head causal window (mask_mod reads h; the block mask is [1, H, ...]) in a dfs region along
    heads (slice_dims=[1]): the body's mask_mod reads its global head from a [H] index table sliced with
    the heads, so every slice keeps its own head's window. Outputs and gradients sit as close to a float64
    reference as the unsliced compile's."""
    from torch.nn.attention.flex_attention import create_block_mask

    from flex_reference import dense, hop

    def window(b, h, q_idx, kv_idx):
        return (q_idx >= kv_idx) & (q_idx - kv_idx <= h * 3 + 1)

    mask = create_block_mask(window, None, H, S, S, device=device())

    def f(q, k, v, hints):
        with hinted_context(**hints):
            out = hop(q, k, v, block_mask=mask)[0]
        return out * 2

    torch.manual_seed(9)
    q, k, v = (randn(B, H, S, D) for _ in range(3))
    grad = randn(B, H, S, D)
    leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    want = dense(*leaves, None, window)[0] * 2
    want.backward(grad.double())
    ref = [want.detach()] + [t.grad for t in leaves]
    results = {}
    for name, hints in (("bfs", {"schedule": "bfs"}), ("dfs", {"schedule": "dfs", "slice_dims": [1]})):
        torch._dynamo.reset()
        xs = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        out = torch.compile(lambda *a: f(*a, hints), backend="hintbackend",
                            options={"strict": True, "dump_dir": str(tmp_path / name)})(*xs)
        out.backward(grad)
        results[name] = [out.detach()] + [t.grad for t in xs]
    err = lambda a, r: (a.double() - r).abs().max().item()  # noqa: E731
    for what, d, b, r in zip(("out", "dq", "dk", "dv"), results["dfs"], results["bfs"], ref):
        assert err(d, r) <= 2 * err(b, r) + 1e-5, (what, err(d, r), err(b, r))
    for kind in ("forward", "backward"):
        ir = "".join(t for d, t in final_ir(str(tmp_path / "dfs")).items() if d.startswith(kind))
        assert re.search(rf"hintbackend::slice_loop\(.*slices={H}, extent={H}", main_graph(ir)), ir
        assert re.search(r"aten::index\.Tensor\(%slice_head_index\w*, \[%\w+\]\)", ir), ir  # the mask's global h


def test_flex_dense_learned_bias_is_read_whole_by_every_slice(tmp_path):
    """A dense learned bias bias[b, h, q, kv] ([B, H, S, S], what users move an SDPA attn_mask to) in a dfs
    region along batch and heads: every slice reads the whole buffer at its global (b, h), and the loop
    sums the slices' parts of its gradient. Outputs and gradients sit as close to a float64 reference as
    the unsliced compile's."""
    from flex_reference import dense, hop

    def f(q, k, v, bias, hints):
        with hinted_context(**hints):
            out = hop(q, k, v, lambda s, b, h, qi, ki: s + bias[b, h, qi, ki])[0]
        return out * 2

    torch.manual_seed(10)
    q, k, v = (randn(B, H, S, D) for _ in range(3))
    bias = randn(B, H, S, S) * 0.5
    grad = randn(B, H, S, D)
    leaves = [t.detach().double().requires_grad_(True) for t in (q, k, v, bias)]
    want = dense(*leaves[:3], lambda s, b, h, qi, ki: s + leaves[3][b, h, qi, ki])[0] * 2
    want.backward(grad.double())
    ref = [want.detach()] + [t.grad for t in leaves]
    results = {}
    for name, hints in (("bfs", {"schedule": "bfs"}), ("dfs", {"schedule": "dfs", "slice_dims": [0, 1]})):
        torch._dynamo.reset()
        xs = [t.detach().clone().requires_grad_(True) for t in (q, k, v, bias)]
        out = torch.compile(lambda *a: f(*a, hints), backend="hintbackend",
                            options={"strict": True, "dump_dir": str(tmp_path / name)})(*xs)
        out.backward(grad)
        results[name] = [out.detach()] + [t.grad for t in xs]
    err = lambda a, r: (a.double() - r).abs().max().item()  # noqa: E731
    for what, d, b, r in zip(("out", "dq", "dk", "dv", "dbias"), results["dfs"], results["bfs"], ref):
        assert err(d, r) <= 2 * err(b, r) + 1e-5, (what, err(d, r), err(b, r))
    for kind in ("forward", "backward"):
        ir = "".join(t for d, t in final_ir(str(tmp_path / "dfs")).items() if d.startswith(kind))
        assert re.search(rf"hintbackend::slice_loop\(.*slices={B * H}, extent={B * H}", main_graph(ir)), ir


def test_small_values_of_heavy_ops_are_saved_not_recomputed():
    """Attention through a log-sum-exp: the default partition saves S x S values (the scores, the
    probabilities) and the B x H x S x 1 log-sum-exp. hintbackend's recomputes the S x S values but
    saves the log-sum-exp: it is smaller than the region's output and recomputing it would rerun q @ k^T
    (FlexAttention's logsumexp is the case that matters: recomputing it reruns the whole attention).
    Training through the backend still matches eager, BFS and DFS alike."""
    def region(q, k, v):
        s = (q @ k.transpose(-1, -2)) * (D ** -0.5)
        lse = torch.logsumexp(s, -1, keepdim=True)
        return (s - lse).exp() @ v

    def f(q, k, v, hints):
        with hinted_context(**hints):
            out = region(q, k, v)
        return out * 2

    hints = {"schedule": "dfs", "slices": 4}
    (want_fw, _), (got_fw, _), n = partitions_of(lambda *a: f(*a, hints), *qkv())
    shapes = lambda nodes: [tuple(v.meta["val"].shape) for v in nodes]  # noqa: E731
    assert (B, H, S, 1) in shapes(saved_values(want_fw, n)) and any(
        has_s_by_s(str(list(x))) for x in shapes(saved_values(want_fw, n)))
    saved = shapes(saved_values(got_fw, n))
    assert (B, H, S, 1) in saved and not any(has_s_by_s(str(list(x))) for x in saved), saved

    torch.manual_seed(4)
    q, k, v = (randn(B, H, S, D) for _ in range(3))
    ref = [t.detach().double().requires_grad_(True) for t in (q, k, v)]
    want = region(*ref) * 2
    want.backward(torch.ones_like(want))
    for h in ({"schedule": "bfs"}, hints):
        torch._dynamo.reset()
        xs = [t.detach().clone().requires_grad_(True) for t in (q, k, v)]
        out = torch.compile(lambda *a: f(*a, h), backend="hintbackend", options={"strict": True})(*xs)
        out.backward(torch.ones_like(out))
        for name, got, r in zip(("out", "dq", "dk", "dv"), [out.detach()] + [x.grad for x in xs],
                                [want.detach()] + [x.grad for x in ref]):
            torch.testing.assert_close(got.double(), r, rtol=1e-4, atol=1e-5, msg=lambda m: f"{h} {name}: {m}")
