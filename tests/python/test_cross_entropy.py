"""fold-cross-entropy-backward (passes/FoldCrossEntropyBackward.h): F.cross_entropy's gradient as one op
(hintbackend::cross_entropy_backward, backend/runtime/CrossEntropyBackward.h) writing one [N, C] buffer
where AOTAutograd's graph has nll_loss_backward and _log_softmax_backward_data write two; and the
partition's save-logsumexp (python/hintbackend/partition.py), after which the forward saves one logsumexp
per row instead of the [N, C] log-probabilities and the op reads the logits (its .logits form).

The op against a float64 reference of ATen's two ops, then small language-model heads trained through
the backend against eager (some targets ignore_index, float32, a bf16 model whose logits go through
.float(), and one whose loss takes its bf16 logits, which folds on CUDA only), with the dumps showing the fold happened and that the plan holds one [N, C] float32 buffer
at a time; a class weight and label smoothing stay as traced and still match."""

import re

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import hintbackend
from conftest import device
from helpers import check_model, graph_dirs, randn

hintbackend._core()  # registers the ops
ops = torch.ops.hintbackend
IGNORE = -100
REDUCTIONS = {"none": 0, "mean": 1, "sum": 2}


def targets(n, classes, ignore=IGNORE, ignored=0.25, generator=None):
    t = torch.randint(0, classes, (n,), generator=generator)
    t[torch.rand(n, generator=generator) < ignored] = ignore
    return t.to(device())


def aten_chain(grad, lsm, target, reduction, ignore, total_weight):
    """The traced gradient: nll_loss_backward, then the log-softmax gradient over the classes."""
    nll = torch.ops.aten.nll_loss_backward(grad, lsm, target, None, reduction, ignore, total_weight)
    return torch.ops.aten._log_softmax_backward_data(nll, lsm, 1, lsm.dtype)


@pytest.mark.parametrize("reduction", list(REDUCTIONS))
@pytest.mark.parametrize("ignored", [0.0, 0.3, 1.0])
def test_op_matches_atens_two_ops(reduction, ignored):
    """Fresh logits and targets (none, some or all ignored; ignore_index a valid class id here, 3, so an
    ignored row's target is in range): the op is as close to the float64 chain as eager's float32
    chain is, and its out= form may write over the log-probabilities themselves."""
    torch.manual_seed(len(reduction) * 10 + int(ignored * 10))
    n, c = 48, 300
    for ignore in (IGNORE, 3):
        lsm = torch.log_softmax(randn(n, c) * 3, 1)
        target = targets(n, c, ignore, ignored)
        r = REDUCTIONS[reduction]
        _, total_weight = torch.ops.aten.nll_loss_forward(lsm, target, None, r, ignore)
        grad = randn(n) if r == 0 else randn(())
        ref = aten_chain(grad.double(), lsm.double(), target, r, ignore, total_weight.double())
        want = aten_chain(grad, lsm, target, r, ignore, total_weight)
        got = ops.cross_entropy_backward(grad, lsm, target, r, ignore, total_weight)
        assert got.dtype == torch.float32 and got.shape == lsm.shape
        err = (got.double() - ref).abs().max().item()
        eager_err = (want.double() - ref).abs().max().item()
        assert err <= 2 * eager_err + 1e-7, (err, eager_err)
        ignored_rows = target == ignore
        assert torch.all(got[ignored_rows] == 0)  # no nan, even with every row ignored under mean
        inplace = lsm.clone()
        ops.cross_entropy_backward.out(grad, inplace, target, r, ignore, total_weight, out=inplace)
        assert torch.equal(inplace, got)
        f64 = ops.cross_entropy_backward(grad.double(), lsm.double(), target, r, ignore, total_weight.double())
        torch.testing.assert_close(f64, ref, rtol=1e-12, atol=1e-15)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("reduction", list(REDUCTIONS))
def test_half_precision_op_on_cuda_rounds_once(reduction, dtype):
    """On CUDA the op is one kernel computing in float32 (what lets bf16 losses fold): against the float64
    chain it is at least as close as ATen's own chain in that dtype (which rounds nll's scale, then the
    gradient), in place too."""
    if device() != "cuda":
        pytest.skip("the half-precision kernel is CUDA's (HINTBACKEND_TEST_DEVICE=cuda)")
    torch.manual_seed(len(reduction) + (7 if dtype == torch.float16 else 0))
    n, c = 96, 1000
    lsm = torch.log_softmax(randn(n, c) * 3, 1).to(dtype)
    target = targets(n, c, IGNORE, 0.3)
    r = REDUCTIONS[reduction]
    _, total_weight = torch.ops.aten.nll_loss_forward(lsm, target, None, r, IGNORE)
    grad = (randn(n) if r == 0 else randn(())).to(dtype)
    ref = aten_chain(grad.double(), lsm.double(), target, r, IGNORE, total_weight.double())
    want = aten_chain(grad, lsm, target, r, IGNORE, total_weight)
    got = ops.cross_entropy_backward(grad, lsm, target, r, IGNORE, total_weight)
    assert got.dtype == dtype and got.shape == lsm.shape
    err = ((got.double() - ref).norm() / ref.norm()).item()
    eager_err = ((want.double() - ref).norm() / ref.norm()).item()
    assert err <= 1.25 * eager_err + 1e-6, (err, eager_err)
    assert torch.all(got[target == IGNORE] == 0)
    inplace = lsm.clone()
    ops.cross_entropy_backward.out(grad, inplace, target, r, IGNORE, total_weight, out=inplace)
    assert torch.equal(inplace, got)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("reduction", list(REDUCTIONS))
def test_logits_form_matches_atens_two_ops(reduction, dtype):
    """The .logits form (what the fold writes after save-logsumexp): from logits of any float dtype, their
    row maxima and the log-softmax's row maxima (what the forward saves), as close to the float64 chain as
    eager's chain on log_softmax of the same (upcast) logits; its out= form may write over the logits
    where they have the result's dtype."""
    torch.manual_seed(len(reduction) + 3)
    n, c = 48, 300
    r = REDUCTIONS[reduction]
    logits = (randn(n, c) * 3).to(dtype)
    wide = torch.float64 if dtype == torch.float64 else torch.float32
    lsm = torch.log_softmax(logits.to(wide), 1)
    row_max, lsm_max = logits.to(wide).amax(1, keepdim=True), lsm.amax(1, keepdim=True)
    target = targets(n, c, IGNORE, 0.3)
    _, total_weight = torch.ops.aten.nll_loss_forward(lsm, target, None, r, IGNORE)
    grad = (randn(n) if r == 0 else randn(())).to(wide)
    ref = aten_chain(grad.double(), torch.log_softmax(logits.double(), 1), target, r, IGNORE, total_weight.double())
    want = aten_chain(grad, lsm, target, r, IGNORE, total_weight)
    got = ops.cross_entropy_backward.logits(grad, logits, row_max, lsm_max, target, r, IGNORE, total_weight)
    assert got.dtype == wide and got.shape == logits.shape
    err = (got.double() - ref).abs().max().item()
    eager_err = (want.double() - ref).abs().max().item()
    assert err <= 2 * eager_err + (1e-15 if dtype == torch.float64 else 1e-7), (err, eager_err)
    assert torch.all(got[target == IGNORE] == 0)
    if dtype == wide:
        inplace = logits.clone()
        ops.cross_entropy_backward.logits_out(grad, inplace, row_max, lsm_max, target, r, IGNORE, total_weight,
                                              out=inplace)
        assert torch.equal(inplace, got)


class LMHead(nn.Module):
    """Embedding, one hidden layer and a vocabulary projection, then F.cross_entropy over all positions.
    `upcast`: the logits are computed in the parameters' dtype and go through .float() first (HF's
    causal-LM loss on a bf16 model); `return_logits`: the logits are returned beside the loss (HF's
    models do), so the caller holds them anyway."""

    def __init__(self, vocab=320, hidden=24, dtype=torch.float32, upcast=False, return_logits=False, **ce):
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden, dtype=dtype)
        self.mlp = nn.Linear(hidden, hidden, dtype=dtype)
        self.out = nn.Linear(hidden, vocab, dtype=dtype)
        self.vocab, self.upcast, self.return_logits, self.ce = vocab, upcast, return_logits, ce

    def forward(self, ids, labels):
        out = logits = self.out(torch.tanh(self.mlp(self.emb(ids))))
        if self.upcast:
            logits = logits.float()
        loss = F.cross_entropy(logits.view(-1, self.vocab), labels.view(-1), **self.ce)
        return (loss, out) if self.return_logits else loss


def buffers(plan_text):
    """(name, size, first, last) of each planned buffer in a memory-plan.txt."""
    return [(m[1], int(m[2]), int(m[3]), int(m[4]))
            for m in re.finditer(r"^\s+%(\S+): offset \d+ size (\d+) live \[(\d+), (\d+)\]", plan_text, re.M)]


def big_overlaps(dump, at_least):
    """Pairs of planned buffers of at least `at_least` bytes alive at the same time, in the backward."""
    (bw,) = [d for d in graph_dirs(dump) if d.startswith("backward")]
    big = [b for b in buffers((dump / bw / "memory-plan.txt").read_text()) if b[1] >= at_least]
    return [(a[0], b[0]) for i, a in enumerate(big) for b in big[i + 1:] if a[2] <= b[3] and b[2] <= a[3]]


def kernels(dump):
    return "".join(p.read_text() for p in dump.glob("*/kernels.txt"))


def train(model, n, vocab, dump, options=None):
    """One step through the backend against eager (loss and every gradient), fresh inputs; the
    backward's dump in `dump`."""
    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    ids = torch.randint(0, vocab, (2, n // 2), generator=g).to(device())
    labels = targets(n, vocab, generator=g).view(2, n // 2)
    model = model.to(device())
    check_model(model, [ids, labels], options={"dump_dir": str(dump), **(options or {})})


@pytest.mark.parametrize("partition", ["min-cut", "default"])
@pytest.mark.parametrize("reduction", list(REDUCTIONS))
def test_float32_training_folds_and_matches_eager(reduction, partition, tmp_path):
    """Loss and all gradients within float32 tolerance of eager; the backward runs the one op (in either
    form: with float32 logits that only the loss reads, saving them costs min-cut what saving the
    log-probabilities does), has no nll_loss_backward left, and plans no two [N, V] float32 buffers at once
    (without the pass: two); under torch's default partition too, which save-logsumexp leaves alone."""
    torch.manual_seed(11)
    n, vocab = 64, 320
    train(LMHead(vocab, reduction=reduction, ignore_index=IGNORE), n, vocab, tmp_path / "fold",
          {"partition": partition})
    k = kernels(tmp_path / "fold")
    assert "hintbackend::cross_entropy_backward." in k and "aten::nll_loss_backward" not in k, k
    if partition == "default":
        assert ".logits" not in k, k
    nv = n * vocab * 4
    assert big_overlaps(tmp_path / "fold", nv) == []
    torch._dynamo.reset()
    train(LMHead(vocab, reduction=reduction, ignore_index=IGNORE), n, vocab, tmp_path / "off",
          {"disable_passes": ["fold-cross-entropy-backward"], "partition": partition})
    assert "cross_entropy_backward" not in kernels(tmp_path / "off")
    assert big_overlaps(tmp_path / "off", nv) != []


def test_bf16_logits_upcast_fold(tmp_path):
    """A bf16 model whose logits go through .float() (the H200 Llama's graph): the gradient is cast back
    to bf16 after the fold; loss and gradients match eager to bf16's tolerance."""
    torch.manual_seed(12)
    n, vocab = 64, 320
    train(LMHead(vocab, dtype=torch.bfloat16, upcast=True, ignore_index=IGNORE), n, vocab, tmp_path)
    k = kernels(tmp_path)
    assert "hintbackend::cross_entropy_backward.logits" in k and "aten::nll_loss_backward" not in k, k
    assert big_overlaps(tmp_path, n * vocab * 4) == []


def forward_returns(dump):
    """The types of the values the forward graph returns (its outputs, then what it saves), from its IR."""
    (fw,) = [d for d in graph_dirs(dump) if d.startswith("forward")]
    ir = (dump / fw / "ir-import.txt").read_text()
    types = dict(re.findall(r"^\s+%(\S+): (\w+\[[^\]]*\])", ir, re.M))
    (ret,) = re.findall(r"^\s+return \((.*)\)", ir, re.M)
    return [types.get(v.strip().lstrip("%"), v.strip()) for v in ret.split(",") if v.strip()]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_the_forward_saves_a_logsumexp_not_log_probabilities(dtype, tmp_path):
    """HF's shape of loss on a half-precision model: the logits returned beside it, upcast by .float()
    for the loss. The forward returns no float32 [N, V] at all (the caller holds the logits; the backward
    gets one float32 [N, 1], the log-probabilities' row maxima, and takes the logits' own from them), and
    the backward's op reads the logits with no float32 copy of them before it; with save-logsumexp
    disabled the forward saves the [N, V] log-probabilities (what min-cut alone does). Loss, logits and
    gradients match eager both ways."""
    torch.manual_seed(15)
    n, vocab = 64, 320
    lmhead = lambda: LMHead(vocab, dtype=dtype, upcast=True, return_logits=True, ignore_index=IGNORE)  # noqa: E731
    train(lmhead(), n, vocab, tmp_path / "on")
    returned = forward_returns(tmp_path / "on")
    assert f"f32[{n}, {vocab}]" not in returned and returned.count(f"f32[{n}, 1]") == 1, returned
    assert "hintbackend::cross_entropy_backward.logits" in kernels(tmp_path / "on")
    (bw,) = [d for d in graph_dirs(tmp_path / "on") if d.startswith("backward")]
    backward_ir = (tmp_path / "on" / bw / "ir-final.txt").read_text()
    assert f"f32[2, {n // 2}, {vocab}]" not in backward_ir.split("hintbackend::cross_entropy_backward")[0], backward_ir
    torch._dynamo.reset()
    train(lmhead(), n, vocab, tmp_path / "off", {"disable_passes": ["save-logsumexp"]})
    assert f"f32[{n}, {vocab}]" in forward_returns(tmp_path / "off")
    assert "hintbackend::cross_entropy_backward.default" in kernels(tmp_path / "off")


def test_float32_logits_keep_their_log_probabilities(tmp_path):
    """Without an upcast, saving the float32 logits would cost min-cut what saving the log-probabilities
    does, and it would compute both in the forward: save-logsumexp leaves the loss as traced (the forward
    saves the log-probabilities, computed once)."""
    torch.manual_seed(16)
    n, vocab = 64, 320
    train(LMHead(vocab, return_logits=True, ignore_index=IGNORE), n, vocab, tmp_path)
    (fw,) = [d for d in graph_dirs(tmp_path) if d.startswith("forward")]
    ir = (tmp_path / fw / "ir-import.txt").read_text()
    assert "aten::amax" not in ir and ir.count(f"f32[{n}, {vocab}]") >= 1, ir
    assert "hintbackend::cross_entropy_backward.default" in kernels(tmp_path)
