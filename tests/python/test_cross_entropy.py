"""fold-cross-entropy-backward (passes/FoldCrossEntropyBackward.h): F.cross_entropy's gradient as one op
(hintbackend::cross_entropy_backward, backend/runtime/CrossEntropyBackward.h) writing one [N, C] buffer
where AOTAutograd's graph has nll_loss_backward and _log_softmax_backward_data write two.

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


class LMHead(nn.Module):
    """Embedding, one hidden layer and a vocabulary projection, then F.cross_entropy over all positions.
    `upcast`: the logits are computed in the parameters' dtype and go through .float() first (HF's
    causal-LM loss on a bf16 model)."""

    def __init__(self, vocab=320, hidden=24, dtype=torch.float32, upcast=False, **ce):
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden, dtype=dtype)
        self.mlp = nn.Linear(hidden, hidden, dtype=dtype)
        self.out = nn.Linear(hidden, vocab, dtype=dtype)
        self.vocab, self.upcast, self.ce = vocab, upcast, ce

    def forward(self, ids, labels):
        logits = self.out(torch.tanh(self.mlp(self.emb(ids))))
        if self.upcast:
            logits = logits.float()
        return F.cross_entropy(logits.view(-1, self.vocab), labels.view(-1), **self.ce)


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


@pytest.mark.parametrize("reduction", list(REDUCTIONS))
def test_float32_training_folds_and_matches_eager(reduction, tmp_path):
    """Loss and all gradients within float32 tolerance of eager; the backward runs the one op, has no
    nll_loss_backward left, and plans no two [N, V] float32 buffers at once (without the pass: two)."""
    torch.manual_seed(11)
    n, vocab = 64, 320
    train(LMHead(vocab, reduction=reduction, ignore_index=IGNORE), n, vocab, tmp_path / "fold")
    k = kernels(tmp_path / "fold")
    assert "hintbackend::cross_entropy_backward.default" in k and "aten::nll_loss_backward" not in k, k
    nv = n * vocab * 4
    assert big_overlaps(tmp_path / "fold", nv) == []
    torch._dynamo.reset()
    train(LMHead(vocab, reduction=reduction, ignore_index=IGNORE), n, vocab, tmp_path / "off",
          {"disable_passes": ["fold-cross-entropy-backward"]})
    assert "cross_entropy_backward" not in kernels(tmp_path / "off")
    assert big_overlaps(tmp_path / "off", nv) != []


def test_bf16_logits_upcast_fold(tmp_path):
    """A bf16 model whose logits go through .float() (the H200 Llama's graph): the gradient is cast back
    to bf16 after the fold; loss and gradients match eager to bf16's tolerance."""
    torch.manual_seed(12)
    n, vocab = 64, 320
    train(LMHead(vocab, dtype=torch.bfloat16, upcast=True, ignore_index=IGNORE), n, vocab, tmp_path)
    k = kernels(tmp_path)
    assert "hintbackend::cross_entropy_backward.default" in k and "aten::nll_loss_backward" not in k, k
    assert big_overlaps(tmp_path, n * vocab * 4) == []


def test_bf16_logits_fold_on_cuda(tmp_path):
    """A bf16 model's loss on its bf16 logits (HF BERT's masked LM): folded on CUDA (one kernel), left as
    traced on CPU; loss and gradients match eager either way."""
    torch.manual_seed(14)
    n, vocab = 64, 320
    train(LMHead(vocab, dtype=torch.bfloat16, ignore_index=IGNORE), n, vocab, tmp_path)
    k = kernels(tmp_path)
    if device() == "cuda":
        assert "hintbackend::cross_entropy_backward.default" in k and "aten::nll_loss_backward" not in k, k
        assert big_overlaps(tmp_path, n * vocab * 2) == []
    else:
        assert "cross_entropy_backward" not in k and "aten::nll_loss_backward" in k, k


@pytest.mark.parametrize("ce", [{"weight": "class"}, {"label_smoothing": 0.1}], ids=["weight", "label_smoothing"])
def test_class_weight_and_label_smoothing_stay_and_match(ce, tmp_path):
    """What the fold does not take runs as traced, still against eager."""
    torch.manual_seed(13)
    n, vocab = 64, 320
    if "weight" in ce:
        ce = {"weight": torch.rand(vocab, device=device()) + 0.5}
    train(LMHead(vocab, ignore_index=IGNORE, **ce), n, vocab, tmp_path)
    k = kernels(tmp_path)
    assert "cross_entropy_backward" not in k and "aten::nll_loss_backward" in k, k
