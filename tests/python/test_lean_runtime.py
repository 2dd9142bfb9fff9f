"""The lean runtime (python/hintbackend/lean_runtime.py, option lean_runtime): a plain training graph runs
in hintbackend's own autograd.Function instead of AOTAutograd's runtime wrappers, with the same results
bit for bit as AOTAutograd's runtime and eager's within float32 rounding, the same autograd checks, and
AOTAutograd's runtime wherever the graph needs more (inputs mutated other than by data written into an
input that takes no gradient, outputs that alias inputs)."""

import logging

import pytest
import torch

from conftest import device
from hintbackend.options import parse_options
from test_models import SDPABlock

LEAN, AOT = "LeanBackward", "CompiledFunctionBackward"


def grad_fn_name(t: torch.Tensor) -> str:
    return type(t.grad_fn).__name__


def steps(model, x, options, n=3, loss=lambda y: y.float().square().mean()):
    """n training steps of the compiled model: the gradients of the last and each step's output grad_fn."""
    torch._dynamo.reset()
    fn = torch.compile(model, backend="hintbackend", options=options)
    names = []
    for _ in range(n):
        for p in model.parameters():
            p.grad = None
        x.grad = None
        y = fn(x)
        names.append(grad_fn_name(y if isinstance(y, torch.Tensor) else y[0]))
        loss(y).backward()
    return [x.grad] + [p.grad for p in model.parameters()], names


def eager_grads(model, x, loss=lambda y: y.float().square().mean()):
    for p in model.parameters():
        p.grad = None
    x.grad = None
    loss(model(x)).backward()
    return [x.grad] + [p.grad for p in model.parameters()]


@pytest.mark.parametrize("cache", [True, False])
def test_a_plain_block_runs_lean_and_matches_aot_bitwise_and_eager(tmp_path, cache):
    torch.manual_seed(0)
    model = SDPABlock(d=64, h=4).to(device()).train()
    x = torch.randn(2, 8, 64, device=device(), requires_grad=True)
    opts = {"cache_dir": str(tmp_path), "compile_cache": cache}
    lean, names = steps(model, x, {**opts, "lean_runtime": True})
    # Without the cache AOTAutograd compiles the backward at the first backward: the first step is its.
    assert names == ([LEAN] * 3 if cache else [AOT, LEAN, LEAN]), names
    aot, names = steps(model, x, {**opts, "lean_runtime": False})
    assert names == [AOT] * 3
    assert all(torch.equal(a, b) for a, b in zip(lean, aot))
    for a, b in zip(lean, eager_grads(model, x)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


class TwoOutputs(torch.nn.Module):
    """An output that needs no gradient (an index) beside one that does."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 5)

    def forward(self, x):
        y = torch.tanh(self.lin(x))
        return y, y.detach().argmax(-1)


def test_outputs_without_gradient_and_gradients_of_another_layout(tmp_path):
    torch.manual_seed(0)
    model = TwoOutputs().to(device())
    x = torch.randn(4, 6, device=device(), requires_grad=True)
    w = torch.randn(5, 4, device=device())
    # y.t() * w: the gradient reaching the compiled graph is transposed (not the traced layout)
    loss = lambda out: (out[0].t() * w).sum()  # noqa: E731
    got, names = steps(model, x, {"cache_dir": str(tmp_path)}, loss=loss)
    assert names == [LEAN] * 3
    y, idx = torch.compile(model, backend="hintbackend", options={"cache_dir": str(tmp_path)})(x)
    assert not idx.requires_grad and idx.dtype == torch.int64
    torch.testing.assert_close(idx, model(x)[1], rtol=0, atol=0)
    for a, b in zip(got, eager_grads(model, x, loss=loss)):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


class Aliasing(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)

    def forward(self, x):
        return self.lin(x), x.view(-1)  # the second output is a view of the input


class DecayedScale(torch.nn.Module):
    """A parameter (it takes a gradient) that the forward itself changes in place, under no_grad."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)
        self.scale = torch.nn.Parameter(torch.full((6,), 2.0))

    def forward(self, x):
        with torch.no_grad():
            self.scale.mul_(0.5)
        return self.lin(x) * self.scale


def eager_steps(model, x, loss, n=3):
    """n eager training steps: the last step's gradients."""
    grads = None
    for _ in range(n):
        grads = eager_grads(model, x, loss=loss)
    return grads


@pytest.mark.parametrize("model", ["aliasing", "mutated_parameter"])
def test_graphs_that_need_more_keep_aot_runtime_and_say_why(tmp_path, caplog, model):
    import copy
    torch.manual_seed(0)
    if model == "aliasing":
        m, why = Aliasing(), "aliases an input"
    else:
        m, why = DecayedScale(), "is mutated and takes a gradient"
    m, x = m.to(device()), torch.randn(8, 6, device=device(), requires_grad=True)
    ref = copy.deepcopy(m)
    loss = lambda y: (y[0] if isinstance(y, tuple) else y).square().mean()  # noqa: E731
    with caplog.at_level(logging.INFO, logger="hintbackend"):
        got, names = steps(m, x, {"cache_dir": str(tmp_path)}, loss=loss)
    assert names == [AOT] * 3
    assert any("AOTAutograd's runtime (not the lean one)" in r.getMessage() and why in r.getMessage()
               for r in caplog.records), [r.getMessage() for r in caplog.records]
    for a, b in zip(got, eager_steps(ref, x, loss)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    for a, b in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


class BatchNormNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)
        self.bn = torch.nn.BatchNorm1d(6)

    def forward(self, x):
        return torch.tanh(self.bn(self.lin(x)))


@pytest.mark.parametrize("cache", [True, False])
def test_batchnorm_runs_lean_and_updates_its_running_statistics(tmp_path, caplog, cache):
    """Training BatchNorm writes its running statistics and batch count (inputs that take no gradient): the
    lean runtime copies their new values in after each forward, as AOTAutograd's runtime does. The
    statistics equal eager's after three steps, the gradients too (bitwise those of AOTAutograd's runtime)."""
    import copy
    torch.manual_seed(0)
    m = BatchNormNet().to(device()).train()
    x = torch.randn(8, 6, device=device(), requires_grad=True)
    ref, aot_model = copy.deepcopy(m), copy.deepcopy(m)
    opts = {"cache_dir": str(tmp_path), "compile_cache": cache}
    with caplog.at_level(logging.INFO, logger="hintbackend"):
        lean, names = steps(m, x, {**opts, "lean_runtime": True})
    assert names == ([LEAN] * 3 if cache else [AOT, LEAN, LEAN]), names
    assert not any("not the lean one" in r.getMessage() for r in caplog.records), [r.getMessage() for r in caplog.records]
    aot, names = steps(aot_model, x, {**opts, "lean_runtime": False})
    assert names == [AOT] * 3
    assert all(torch.equal(a, b) for a, b in zip(lean, aot))
    want = eager_steps(ref, x, lambda y: y.float().square().mean())
    for a, b in zip(lean, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    assert m.bn.num_batches_tracked.item() == ref.bn.num_batches_tracked.item() == 3
    assert not torch.equal(m.bn.running_mean, torch.zeros_like(m.bn.running_mean))
    torch.testing.assert_close(m.bn.running_mean, ref.bn.running_mean, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(m.bn.running_var, ref.bn.running_var, rtol=1e-5, atol=1e-6)
    # In eval mode BatchNorm reads the statistics: the compiled model's outputs agree with eager's.
    m.eval(), ref.eval()
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(m, backend="hintbackend", options=opts)(x), ref(x),
                                   rtol=1e-4, atol=1e-5)


class ReadsStatistics(torch.nn.Module):
    """BatchNorm whose running mean the forward also reads: after the BatchNorm (the new value, as eager
    reads it) or before it (the old value)."""

    def __init__(self, before: bool):
        super().__init__()
        self.lin = torch.nn.Linear(6, 6)
        self.bn = torch.nn.BatchNorm1d(6)
        self.before = before

    def forward(self, x):
        h = self.lin(x)
        if self.before:
            return torch.tanh(self.bn(h + self.bn.running_mean))
        return torch.tanh(self.bn(h)) * self.bn.running_mean


@pytest.mark.parametrize("cache", [True, False])
def test_batchnorm_writes_its_statistics_in_place(tmp_path, cache):
    """write-inputs-in-place: the forward updates BatchNorm's running statistics and batch count in the
    buffers themselves (no clones, no copies back): the compiled graph says so, the buffers keep their
    memory, the running statistics' version counters do not move (eager's do not either: the lean runtime
    copies nothing), and two forwards before one backward give eager's gradients and statistics."""
    from hintbackend.backend import compiled_graphs

    torch.manual_seed(0)
    m = BatchNormNet().to(device()).train()
    ref = __import__("copy").deepcopy(m)
    x1 = torch.randn(8, 6, device=device(), requires_grad=True)
    x2 = torch.randn(8, 6, device=device(), requires_grad=True)
    torch._dynamo.reset()
    fn = torch.compile(m, backend="hintbackend", options={"cache_dir": str(tmp_path), "compile_cache": cache})
    with compiled_graphs() as graphs:
        fn(x1).square().mean().backward()  # (the first step: AOTAutograd's runtime without the cache)
    forward = [g for name, g in graphs if name.startswith("forward")]
    assert forward and any("write-inputs-in-place" in n and "batch_norm_in_place" in n and "(add_)" in n
                           for n in forward[0].notes), forward[0].notes
    ir = forward[0].ir
    assert "= hintbackend::batch_norm_in_place" in ir and "= aten::_native_batch_norm_legit_functional" not in ir
    ref(x1).square().mean().backward()
    buffers = {k: (b.data_ptr(), b._version) for k, b in m.bn.named_buffers()}
    for p in list(m.parameters()) + list(ref.parameters()):
        p.grad = None
    x1.grad = None
    # Two forwards, one backward (the first forward's saved statistics outlive the second's update).
    loss = fn(x1).square().mean() + fn(x2).square().mean()
    assert grad_fn_name(fn(x2)) == LEAN
    loss.backward()
    got = [x1.grad] + [p.grad for p in m.parameters()]
    x1.grad = None
    (ref(x1).square().mean() + ref(x2).square().mean()).backward()
    ref(x2)
    want = [x1.grad] + [p.grad for p in ref.parameters()]
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    for k, b in m.bn.named_buffers():
        assert b.data_ptr() == buffers[k][0], k
        torch.testing.assert_close(b, dict(ref.bn.named_buffers())[k], rtol=1e-5, atol=1e-6)
    assert m.bn.num_batches_tracked.item() == 4
    assert m.bn.running_mean._version == buffers["running_mean"][1]
    assert m.bn.running_var._version == buffers["running_var"][1]


def test_half_precision_batchnorm_statistics_in_place(tmp_path):
    """A bf16 module's statistics are bf16, the functional form's new values float: the forward converts
    them back before writing them back. In place there is no conversion left, and after three steps the
    statistics are eager's (the same kernel updates them: on the CPU bit for bit)."""
    import copy
    from hintbackend.backend import compiled_graphs
    from test_models import CNN

    torch.manual_seed(0)
    m = CNN().to(device(), torch.bfloat16).train()
    ref = copy.deepcopy(m)
    x = torch.randn(8, 3, 16, 16, device=device(), dtype=torch.bfloat16)
    torch._dynamo.reset()
    fn = torch.compile(m, backend="hintbackend", options={"cache_dir": str(tmp_path)})
    with compiled_graphs() as graphs:
        for _ in range(3):
            fn(x).float().square().mean().backward()
            ref(x).float().square().mean().backward()
    forward = [g for name, g in graphs if name.startswith("forward")][0]
    assert any("batch_norm_in_place" in n for n in forward.notes), forward.notes
    assert "_to_copy" not in forward.ir, forward.ir
    for (k, a), (_, b) in zip(m.bn.named_buffers(), ref.bn.named_buffers()):
        if device() == "cpu" or k == "num_batches_tracked":
            assert torch.equal(a, b), k
        else:
            torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)
    for a, b in zip(m.parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=5e-2, atol=5e-2)


@pytest.mark.parametrize("before", [False, True], ids=["read-after", "read-before"])
def test_batchnorm_statistics_read_by_the_forward(tmp_path, before):
    """A forward that reads the running mean itself: after the BatchNorm it reads the new value (in place
    as well), before it the old one (then the statistics are not written in place, as the note says);
    outputs, gradients and statistics equal eager's over three steps."""
    from hintbackend.backend import compiled_graphs

    torch.manual_seed(0)
    m = ReadsStatistics(before).to(device()).train()
    with torch.no_grad():
        m.bn.running_mean.uniform_(-1, 1)
    ref = __import__("copy").deepcopy(m)
    x = torch.randn(8, 6, device=device(), requires_grad=True)
    with compiled_graphs() as graphs:
        got, names = steps(m, x, {"cache_dir": str(tmp_path)})
    assert names[-1] == LEAN
    notes = [n for name, g in graphs if name.startswith("forward") for n in g.notes if "write-inputs-in-place" in n]
    assert (notes and "batch_norm_in_place" in notes[0]) != before, notes
    want = eager_steps(ref, x, lambda y: y.float().square().mean())
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    for k, b in m.bn.named_buffers():
        torch.testing.assert_close(b, dict(ref.bn.named_buffers())[k], rtol=1e-5, atol=1e-6)


def test_autograd_checks_hold(tmp_path):
    """A saved tensor changed in place before the backward is an error, as in eager; a second
    differentiation of the compiled backward is refused with a clear error."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 6).to(device())
    fn = torch.compile(lin, backend="hintbackend", options={"cache_dir": str(tmp_path)})
    x = torch.randn(4, 6, device=device(), requires_grad=True)
    xs = x * 1.0  # a non-leaf input, which the forward saves for the weight's gradient
    y = fn(xs)
    assert grad_fn_name(y) == LEAN
    with torch.no_grad():
        xs.add_(1.0)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        y.square().sum().backward()
    y = fn(x)
    (gx,) = torch.autograd.grad(y.square().sum(), x, create_graph=True)
    with pytest.raises(RuntimeError, match="once_differentiable|differentiate twice|does not require grad"):
        gx.sum().backward()


def test_no_grad_calls_and_the_option_off(tmp_path, monkeypatch):
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 3).to(device())
    x = torch.randn(4, 6, device=device())
    fn = torch.compile(lin, backend="hintbackend", options={"cache_dir": str(tmp_path)})
    with torch.no_grad():
        torch.testing.assert_close(fn(x), lin(x), rtol=1e-5, atol=1e-6)
    monkeypatch.setenv("HINTBACKEND_LEAN_RUNTIME", "0")
    torch._dynamo.reset()
    fn = torch.compile(lin, backend="hintbackend", options={"cache_dir": str(tmp_path)})
    assert grad_fn_name(fn(x)) == AOT
    with pytest.raises(ValueError, match="option 'lean_runtime' must be a bool"):
        parse_options({"lean_runtime": "yes"})
    monkeypatch.setenv("HINTBACKEND_LEAN_RUNTIME", "yes")
    with pytest.raises(ValueError, match="HINTBACKEND_LEAN_RUNTIME='yes' must be 0 or 1"):
        parse_options({})


def test_the_backward_frees_what_the_forward_saved_as_aot_runtime_does(tmp_path):
    """The lean backward releases the saved tensors before the compiled backward runs (unless retain_graph),
    so that the backward can free each after its last use: the step's peak of live tensor bytes is
    AOTAutograd's runtime's (CPU; benchmarks/memory_models.py's LiveBytes). Without that release it was
    2 MiB above (16 against 14 MiB at B2 S128 d256)."""
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
    from memory_models import LiveBytes

    if device() != "cpu":
        pytest.skip("live tensor bytes are counted on CPU")
    peaks = {}
    for lean in (True, False):
        torch._dynamo.reset()
        torch.manual_seed(0)
        model = SDPABlock(d=256, h=8).train()
        x = torch.randn(2, 128, 256)
        fn = torch.compile(model, backend="hintbackend", options={"cache_dir": str(tmp_path), "lean_runtime": lean})
        for _ in range(2):  # compile; the gradients' own memory
            fn(x).square().mean().backward()
        with LiveBytes() as mode:
            y = fn(x)
            assert grad_fn_name(y) == (LEAN if lean else AOT)
            y.square().mean().backward()
        peaks[lean] = mode.peak
    assert peaks[True] == peaks[False], peaks


def test_retain_graph_is_refused_where_aot_runtime_refuses_it(tmp_path):
    """AOTAutograd marks saved tensors the backward may overwrite (donated buffers); a second backward would
    read them overwritten, so both runtimes refuse retain_graph=True there."""
    torch.manual_seed(0)
    model = SDPABlock(d=64, h=4).to(device()).train()
    x = torch.randn(1, 8, 64, device=device())
    errors = {}
    for lean in (True, False):
        torch._dynamo.reset()
        fn = torch.compile(model, backend="hintbackend", options={"cache_dir": str(tmp_path), "lean_runtime": lean})
        y = fn(x)
        assert grad_fn_name(y) == (LEAN if lean else AOT)
        with pytest.raises(RuntimeError) as e:
            y.square().mean().backward(retain_graph=True)
        errors[lean] = str(e.value)
    assert "donated" in errors[True] and "retain_graph=True" in errors[True], errors[True]
    assert "donated buffers" in errors[False], errors[False]


def test_retain_graph_where_nothing_is_donated(tmp_path):
    """Where AOTAutograd marked no donated buffer (a linear layer saves only its input), retain_graph=True
    works as in eager: a second backward over the same graph adds the same gradients again."""
    torch.manual_seed(0)
    lin = torch.nn.Linear(6, 6).to(device())
    ref = torch.nn.Linear(6, 6).to(device())
    ref.load_state_dict(lin.state_dict())
    fn = torch.compile(lin, backend="hintbackend", options={"cache_dir": str(tmp_path)})
    x = torch.randn(4, 6, device=device(), requires_grad=True)
    y, r = fn(x), ref(x)
    assert grad_fn_name(y) == LEAN
    for _ in range(2):
        y.square().sum().backward(retain_graph=True)
        r.square().sum().backward(retain_graph=True)
    torch.testing.assert_close(lin.weight.grad, ref.weight.grad)
    torch.testing.assert_close(lin.bias.grad, ref.bias.grad)


class LossAndLogits(torch.nn.Module):
    """A language-model head that returns the loss and the logits, as HF's models do."""

    def __init__(self, vocab=512, d=32):
        super().__init__()
        self.emb = torch.nn.Embedding(vocab, d)
        self.head = torch.nn.Linear(d, vocab)

    def forward(self, ids, labels):
        logits = self.head(torch.tanh(self.emb(ids)))
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), labels.view(-1))
        return loss, logits


@pytest.mark.parametrize("cache", [False, True])
def test_an_unused_output_gets_no_zero_gradient(tmp_path, cache):
    """A step that uses the loss and not the logits: autograd would hand the backward a tensor of zeros
    for the logits' gradient, which it adds to the loss's. The lean runtime turns materialization off and
    runs the backward compiled again with that tangent known to be zero (fold-zero-inputs), built at the
    first such step and kept: the same gradients as eager, no [N, vocabulary] block of zeros at the peak. A
    step that uses both outputs runs the backward as compiled. With the compile cache, the second compile
    is a cache hit (backend.rebuild), which builds the same variant."""
    import pathlib
    import sys

    from hintbackend.backend import compiled_graphs

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
    from memory_models import LiveBytes

    if device() != "cpu":
        pytest.skip("live tensor bytes are counted on CPU")
    torch.manual_seed(0)
    model = LossAndLogits().train()
    ids = torch.randint(0, 512, (4, 64))
    labels = torch.randint(0, 512, (4, 64))
    logits_bytes = 4 * 64 * 512 * 4

    def grads(step):
        for p in model.parameters():
            p.grad = None
        step()
        return [p.grad.clone() for p in model.parameters()]

    want_loss = grads(lambda: model(ids, labels)[0].backward())
    want_both = grads(lambda: (lambda r: (r[0] + r[1].mean()).backward())(model(ids, labels)))
    peaks = {}
    for run, lean in enumerate((True, True, False)):  # (cache: the second lean compile is a hit)
        torch._dynamo.reset()
        fn = torch.compile(model, backend="hintbackend",
                           options={"cache_dir": str(tmp_path), "compile_cache": cache, "lean_runtime": lean})
        for _ in range(2):  # compile; the gradients' own memory
            grads(lambda: fn(ids, labels)[0].backward())
        with compiled_graphs() as built:
            with LiveBytes() as mode:
                got = grads(lambda: fn(ids, labels)[0].backward())
        peaks[run] = mode.peak
        for a, b in zip(got, want_loss):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert built == [], [name for name, _ in built]  # nothing compiled again: the variant was kept
        with compiled_graphs() as built:
            got = grads(lambda: (lambda r: (r[0] + r[1].mean()).backward())(fn(ids, labels)))
        for a, b in zip(got, want_both):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
        assert built == [], [name for name, _ in built]  # both gradients defined: the backward as compiled
    # The variant's compile says what it folded.
    torch._dynamo.reset()
    fn = torch.compile(model, backend="hintbackend", options={"compile_cache": False})
    grads(lambda: fn(ids, labels)[0].backward())  # compiles forward and backward (AOTAutograd's first call)
    with compiled_graphs() as built:
        grads(lambda: fn(ids, labels)[0].backward())
    assert len(built) == 1 and "_zero_" in built[0][0], [name for name, _ in built]
    notes = "\n".join(built[0][1].notes)
    assert "is zero: 1 add folded" in notes, notes
    assert built[0][1].unread_inputs and built[0][1].unread_inputs[0].startswith("tangents_"), notes
    # Without the lean runtime autograd's zeros are live with the loss's gradient.
    assert peaks[0] == peaks[1] and peaks[0] <= peaks[2] - logits_bytes, peaks


def test_hf_models_run_lean_without_the_logits_zero_gradient():
    """HF's language models (small configs from benchmarks/memory_models.py; transformers, which .ci/setup
    installs) return their logits as an `_unsafe_view` beside the loss: they run lean (as AOTAutograd
    replays such an output, a fresh `_unsafe_view`), their step builds the backward without the logits'
    zero tangent once, and their gradients are eager's. Eval mode: no dropout draws to differ."""
    pytest.importorskip("transformers")
    import pathlib
    import sys

    from hintbackend.backend import compiled_graphs

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
    from memory_models import hf_models

    if device() != "cpu":
        pytest.skip("a CPU check of the runtime's bookkeeping")
    ids = torch.randint(0, 1000, (2, 32), generator=torch.Generator().manual_seed(0))
    for name, make, loss_fn in hf_models(True, False):
        grads = {}
        for peer in ("eager", "hintbackend"):
            torch._dynamo.reset()
            torch.manual_seed(0)
            model = make().float().eval()
            fn = model if peer == "eager" else torch.compile(model, backend="hintbackend",
                                                             options={"compile_cache": False})
            built = []
            for _ in range(3):
                for p in model.parameters():
                    p.grad = None
                with compiled_graphs() as graphs:
                    loss = loss_fn(fn, ids)
                    loss.backward()
                built.append([n for n, _ in graphs])
            grads[peer] = [p.grad for p in model.parameters()]
        # Step 1 compiles (AOTAutograd's runtime runs it); step 2 runs lean and builds the zero variant(s).
        assert any("_zero_" in n for n in built[1]) and built[2] == [], (name, built)
        scale = max(g.abs().max().item() for g in grads["eager"] if g is not None)
        for a, b in zip(grads["hintbackend"], grads["eager"]):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6 * scale, msg=name)


def test_compiled_autograd_takes_aot_runtime_and_a_lean_node_refuses_it_clearly(tmp_path):
    """The lean node is C++ and compiled autograd cannot trace it: a forward run under compiled autograd
    takes AOTAutograd's runtime (its gradients are eager's), and a lean forward whose backward runs under
    compiled autograd is refused with an error that says what to do, never a crash."""
    from torch._dynamo import compiled_autograd

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh()).to(device())
    ref = torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.Tanh()).to(device())
    ref.load_state_dict(model.state_dict())
    x = torch.randn(4, 6, device=device())
    fn = torch.compile(model, backend="hintbackend", options={"cache_dir": str(tmp_path)})
    for _ in range(2):
        fn(x).square().sum().backward()
    model.zero_grad()
    eager = lambda gm: torch.compile(gm, backend="eager")  # noqa: E731
    with compiled_autograd._enable(eager):
        y = fn(x)
        assert grad_fn_name(y) == AOT
        y.square().sum().backward()
    ref(x).square().sum().backward()
    for a, b in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-5, atol=1e-6)
    y = fn(x)
    assert grad_fn_name(y) == LEAN
    with compiled_autograd._enable(eager):
        with pytest.raises(RuntimeError, match="run the forward under compiled autograd too.*lean_runtime"):
            y.square().sum().backward()


def test_a_dropped_model_frees_its_compiled_pair(tmp_path):
    """The C++ function holds the zero-variant callback and the pair holds the function: the callback
    reaches the pair through a weak reference, so that dropping the compiled model frees its pair and
    graphs (a cycle through C++ would be one Python's collector cannot see). A backward still pending then
    runs the backward as compiled, its undefined gradient given as zeros: eager's gradients."""
    import gc
    import weakref

    from hintbackend.lean_runtime import LeanPair

    if device() != "cpu":
        pytest.skip("a check of the runtime's bookkeeping")
    torch.manual_seed(0)
    model = LossAndLogits(vocab=64, d=8).train()
    ids = torch.randint(0, 64, (2, 16))
    labels = torch.randint(0, 64, (2, 16))
    for p in model.parameters():
        p.grad = None
    model(ids, labels)[0].backward()
    want = [p.grad.clone() for p in model.parameters()]
    def live_pairs():  # (type(), not isinstance: the heap holds dead weak proxies, which raise on isinstance)
        return [o for o in gc.get_objects() if type(o) is LeanPair]

    torch._dynamo.reset()
    before = {id(o) for o in live_pairs()}
    fn = torch.compile(model, backend="hintbackend", options={"cache_dir": str(tmp_path), "compile_cache": False})
    for _ in range(2):  # compile (the first backward compiles the backward)
        fn(ids, labels)[0].sum().backward()
    loss, logits = fn(ids, labels)  # the last step: its backward pending, the logits' gradient never given
    assert grad_fn_name(loss) == LEAN
    pairs = [weakref.ref(o) for o in live_pairs() if id(o) not in before]
    assert pairs and all(r() is not None for r in pairs)
    del fn
    torch._dynamo.reset()
    gc.collect()
    assert all(r() is None for r in pairs), "the compiled pair outlived its model"
    for p in model.parameters():
        p.grad = None
    loss.backward()
    for p, w in zip(model.parameters(), want):
        torch.testing.assert_close(p.grad, w, rtol=1e-5, atol=1e-6)


def test_forward_mode_ad_is_refused_clearly(tmp_path):
    """Forward-mode AD (dual tensors) through a compiled graph has no rule (AOTAutograd's runtime has none
    either): the lean node says so, naming it, instead of torch's generic custom-Function error."""
    import torch.autograd.forward_ad as fwAD

    torch.manual_seed(0)
    lin = torch.nn.Linear(4, 4).to(device())
    fn = torch.compile(lin, backend="hintbackend", options={"cache_dir": str(tmp_path)})
    x = torch.randn(2, 4, device=device())
    for _ in range(2):
        fn(x).sum().backward()
    with fwAD.dual_level():
        with pytest.raises(RuntimeError, match="forward-mode AD.*not supported"):
            fn(fwAD.make_dual(x, torch.randn_like(x)))
