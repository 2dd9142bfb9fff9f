"""write-inputs-in-place (passes/WriteInputsInPlace.h) on buffers a module updates in place: a cache written a
position at a time (select, slice, index_put), a step counter, an exponential moving average. AOTAutograd
traces each update as a functional op whose result is copied back into the buffer after the call; the pass
writes the buffer itself. Results, buffers and gradients equal eager's; the buffer keeps its memory; the
compiled graph shows the in-place ops and no scatter of the whole buffer. (BatchNorm's running statistics:
test_lean_runtime.py.)"""
import copy

import pytest
import torch
from conftest import device
from hintbackend.backend import compiled_graphs


class Cache(torch.nn.Module):
    """A key/value cache written at `pos` each call (as a decoder's is), read whole, and a call counter."""

    def __init__(self, how: str):
        super().__init__()
        self.how = how
        self.register_buffer("cache", torch.zeros(2, 4, 32, 8))
        self.register_buffer("count", torch.zeros((), dtype=torch.long))

    def forward(self, kv, pos):
        if self.how == "select":  # one position: kv [2, 4, 8]
            self.cache[:, :, pos] = kv
        elif self.how == "slice":  # two positions: kv [2, 4, 2, 8]
            self.cache[:, :, pos:pos + 2] = kv
        elif self.how == "index_put":  # positions given as a tensor: kv [2, 4, 2, 8]
            self.cache[:, :, pos] = kv
        elif self.how == "index_copy":  # as Hugging Face's static cache writes: kv [2, 4, 2, 8]
            self.cache.index_copy_(2, pos, kv)
        else:  # "reads itself": the new value reads the buffer too (not in place)
            self.cache[:, :, pos] = self.cache[:, :, pos] * 0.5 + kv
        self.count.add_(1)
        return self.cache.square().sum((2, 3)) + self.count


def kv_and_pos(how: str, step: int):
    if how in ("slice", "index_put", "index_copy"):
        kv = torch.randn(2, 4, 2, 8, device=device())
        pos = 2 * step if how == "slice" else torch.tensor([2 * step, 2 * step + 1], device=device())
        return kv, pos
    return torch.randn(2, 4, 8, device=device()), step


@pytest.mark.parametrize("how", ["select", "slice", "index_put", "index_copy", "reads itself"])
def test_a_cache_written_a_position_at_a_time(tmp_path, how):
    torch.manual_seed(0)
    m = Cache(how).to(device())
    ref = copy.deepcopy(m)
    fn = torch.compile(m, backend="hintbackend", options={"cache_dir": str(tmp_path)})
    ptr = m.cache.data_ptr()
    with torch.no_grad(), compiled_graphs() as graphs:
        for step in range(4):
            kv, pos = kv_and_pos(how, step)
            torch.testing.assert_close(fn(kv, pos), ref(kv, pos), rtol=1e-5, atol=1e-5)
    assert torch.equal(m.cache, ref.cache) and m.count.item() == ref.count.item() == 4
    assert m.cache.data_ptr() == ptr
    assert graphs
    for name, g in graphs:
        notes = [n for n in g.notes if n.startswith("write-inputs-in-place")]
        if how == "reads itself":  # only the counter: the cache's new value reads the old one, a scatter stays
            assert notes and "(add_)" in notes[0] and "copy_ into a view" not in notes[0], notes
            assert "aten::select_scatter.default" in g.ir, g.ir
            continue
        want = {"index_put": "(index_put_)", "index_copy": "(index_copy_)"}.get(how, "copy_ into a view")
        assert notes and want in notes[0], (name, g.notes)
        assert "_scatter" not in g.ir and "aten::index_put.default" not in g.ir and \
            "aten::index_copy.default" not in g.ir, g.ir


class EMA(torch.nn.Module):
    """Training: a Linear and an exponential moving average of its input's mean, updated each step with
    lerp_ or as a chain of two in-place ops (mul_ then add_, as optimizers and EMA helpers write it)."""

    def __init__(self, how: str = "lerp"):
        super().__init__()
        self.how = how
        self.lin = torch.nn.Linear(6, 6)
        self.register_buffer("ema", torch.zeros(6))

    def forward(self, x):
        with torch.no_grad():
            if self.how == "lerp":
                self.ema.lerp_(x.mean(0), 0.25)
            else:
                self.ema.mul_(0.75).add_(x.mean(0), alpha=0.25)
        return torch.tanh(self.lin(x))


@pytest.mark.parametrize("how,rewrite", [("lerp", "(lerp_)"), ("chain", "(mul_, add_)")])
def test_a_moving_average_updated_in_a_training_step(tmp_path, how, rewrite):
    torch.manual_seed(0)
    m = EMA(how).to(device()).train()
    ref = copy.deepcopy(m)
    fn = torch.compile(m, backend="hintbackend", options={"cache_dir": str(tmp_path)})
    ptr = m.ema.data_ptr()
    with compiled_graphs() as graphs:
        for _ in range(3):
            x = torch.randn(8, 6, device=device())
            for p in list(m.parameters()) + list(ref.parameters()):
                p.grad = None
            fn(x).square().mean().backward()
            ref(x).square().mean().backward()
            for a, b in zip(m.parameters(), ref.parameters()):
                torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(m.ema, ref.ema, rtol=1e-6, atol=1e-7)
    assert m.ema.data_ptr() == ptr
    forward = [g for name, g in graphs if name.startswith("forward")]
    assert forward and any(rewrite in n for n in forward[0].notes), forward[0].notes
    if how == "chain":  # add_(x, alpha=...) as eager runs it: AOTAutograd's mul by alpha folded back
        assert any(n.startswith("fold-scaled-add") for n in forward[0].notes), forward[0].notes


class BatchNormAndAlias(torch.nn.Module):
    """Training BatchNorm in a graph that returns a view of its input: AOTAutograd's runtime, not the lean
    one, writes the statistics back (its copy_ of a buffer onto itself bumps the buffer's version counter;
    the saved statistics have counters of their own)."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)
        self.bn = torch.nn.BatchNorm1d(6)

    def forward(self, x):
        return torch.tanh(self.bn(self.lin(x))), x.view(-1)


def test_batchnorm_in_place_on_aotautograds_runtime(tmp_path):
    torch.manual_seed(0)
    m = BatchNormAndAlias().to(device()).train()
    ref = copy.deepcopy(m)
    fn = torch.compile(m, backend="hintbackend", options={"cache_dir": str(tmp_path)})
    x = torch.randn(8, 6, device=device(), requires_grad=True)
    with compiled_graphs() as graphs:
        for step in range(3):
            for p in list(m.parameters()) + list(ref.parameters()):
                p.grad = None
            y = fn(x)[0]
            assert type(y.grad_fn).__name__ == "CompiledFunctionBackward"
            # two forwards before one backward: the first one's saved statistics outlive the second's update
            (y.square().mean() + fn(x * 2)[0].sum()).backward()
            (ref(x)[0].square().mean() + ref(x * 2)[0].sum()).backward()
            for a, b in zip(m.parameters(), ref.parameters()):
                torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-5)
    assert any("batch_norm_in_place" in n for _, g in graphs for n in g.notes)
    for (k, a), (_, b) in zip(m.bn.named_buffers(), ref.bn.named_buffers()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert m.bn.num_batches_tracked.item() == 6
