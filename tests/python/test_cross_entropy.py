"""fold-cross-entropy-backward (passes/FoldCrossEntropyBackward.h): F.cross_entropy's gradient as one op
(hintbackend::cross_entropy_backward, backend/runtime/CrossEntropyBackward.h) writing one [N, C] buffer
where AOTAutograd's graph has nll_loss_backward and _log_softmax_backward_data write two; and the
partition's save-logsumexp (python/hintbackend/partition.py), after which the forward saves the
log-probabilities' row maxima instead of the [N, C] log-probabilities and the op reads the logits (its
.logits form); and fold-cross-entropy-forward (passes/FoldCrossEntropyForward.h), the forward's loss a chunk
of rows at a time (hintbackend::cross_entropy_forward).

The op against a float64 reference of ATen's two ops, then small language-model heads trained through
the backend against eager (some targets ignore_index, float32, a bf16 model whose logits go through
.float(), and one whose loss takes its bf16 logits), with the dumps showing the fold happened and
that the plan holds one [N, C] float32 buffer at a time; a class weight and label smoothing stay as traced and still match."""

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
def test_half_precision_op_rounds_once(reduction, dtype):
    """The op computes half precision in float32 (one kernel on CUDA, chunks of rows on the CPU: what lets
    bf16 losses fold): against the float64 chain it is at least as close as ATen's own chain in that dtype
    (which rounds nll's scale, then the gradient), in place too."""
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
    if dtype != torch.float64:
        # The gradient's conversion folded in (a bf16 model's): computed in float32, rounded once into
        # the requested dtype and shape; no farther from float64 than eager's float32 gradient converted.
        half = ops.cross_entropy_backward.logits(grad, logits, row_max, lsm_max, target, r, IGNORE, total_weight,
                                                 torch.bfloat16, [2, n // 2, c])
        assert half.dtype == torch.bfloat16 and half.shape == (2, n // 2, c)
        half_err = (half.double().view(n, c) - ref).abs().max().item()
        eager_half_err = (want.to(torch.bfloat16).double() - ref).abs().max().item()
        assert half_err <= eager_half_err * 1.01 + 1e-9, (half_err, eager_half_err)
        assert torch.all(half.view(n, c)[target == IGNORE] == 0)


@pytest.mark.parametrize("chunk_rows", [1, 7, 48])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("reduction", list(REDUCTIONS))
def test_forward_op_matches_atens_loss(reduction, dtype, chunk_rows):
    """hintbackend::cross_entropy_forward (what fold-cross-entropy-forward writes), a chunk of rows at a
    time, from [2, 24, C] logits (bf16 ones upcast inside): the loss and total weight of ATen's
    log_softmax + nll_loss_forward on the upcast logits, as close to float64 as eager's, and the
    log-softmax's row maxima exactly."""
    torch.manual_seed(len(reduction) * 7 + chunk_rows)
    n, c = 48, 300
    r = REDUCTIONS[reduction]
    logits = (randn(2, n // 2, c) * 3).to(dtype)
    target = targets(n, c, IGNORE, 0.3)
    lsm = torch.log_softmax(logits.float().view(n, c), 1)
    want = torch.ops.aten.nll_loss_forward(lsm, target, None, r, IGNORE)
    ref = torch.ops.aten.nll_loss_forward(torch.log_softmax(logits.double().view(n, c), 1), target, None, r, IGNORE)
    loss, total_weight, lsm_max = ops.cross_entropy_forward(logits, target, r, IGNORE, torch.float32, chunk_rows)
    assert loss.dtype == torch.float32 and loss.shape == want[0].shape and total_weight.shape == want[1].shape
    assert torch.equal(total_weight, want[1])
    assert torch.equal(lsm_max, lsm.amax(1, keepdim=True))
    err = (loss.double() - ref[0]).abs().max().item()
    eager_err = (want[0].double() - ref[0]).abs().max().item()
    assert err <= 2 * eager_err + 1e-6, (err, eager_err)


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
    # The forward's loss folds too: no float32 [N, V] anywhere in it (fold-cross-entropy-forward).
    (fw,) = [d for d in graph_dirs(tmp_path / "on") if d.startswith("forward")]
    forward_ir = (tmp_path / "on" / fw / "ir-final.txt").read_text()
    assert "hintbackend::cross_entropy_forward" in forward_ir and f"f32[{n}, {vocab}]" not in forward_ir, forward_ir
    torch._dynamo.reset()
    train(lmhead(), n, vocab, tmp_path / "off", {"disable_passes": ["save-logsumexp"]})
    assert f"f32[{n}, {vocab}]" in forward_returns(tmp_path / "off")
    k = kernels(tmp_path / "off")
    assert "hintbackend::cross_entropy_backward.default" in k and "cross_entropy_forward" not in k, k


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


def test_bf16_logits_fold(tmp_path):
    """A bf16 model's loss on its bf16 logits (HF BERT's masked LM): folded (one kernel on CUDA, float32
    chunks on the CPU), with no two [N, V] bf16 buffers at once; loss and gradients match eager."""
    torch.manual_seed(14)
    n, vocab = 64, 320
    train(LMHead(vocab, dtype=torch.bfloat16, ignore_index=IGNORE), n, vocab, tmp_path)
    k = kernels(tmp_path)
    assert "hintbackend::cross_entropy_backward.default" in k and "aten::nll_loss_backward" not in k, k
    assert big_overlaps(tmp_path, n * vocab * 2) == []


@pytest.mark.parametrize("ce", [{"weight": "class"}, {"label_smoothing": 0.1}], ids=["weight", "label_smoothing"])
@pytest.mark.parametrize("upcast", [False, True], ids=["float32", "bf16-upcast"])
def test_class_weight_and_label_smoothing_stay_and_match(ce, upcast, tmp_path):
    """What the folds do not take runs as traced (the backward's pair, the forward's log-softmax), still
    against eager; save-logsumexp leaves such a loss alone too."""
    torch.manual_seed(13)
    n, vocab = 64, 320
    if "weight" in ce:
        ce = {"weight": torch.rand(vocab, device=device()) + 0.5}
    dtype = torch.bfloat16 if upcast else torch.float32
    train(LMHead(vocab, dtype=dtype, upcast=upcast, return_logits=upcast, ignore_index=IGNORE, **ce), n, vocab,
          tmp_path)
    k = kernels(tmp_path)
    assert "cross_entropy_backward" not in k and "aten::nll_loss_backward" in k, k
    assert "cross_entropy_forward" not in k and "aten::_log_softmax" in k, k


def test_a_target_out_of_range_is_eagers_error(tmp_path):
    """A target that is neither a class nor ignore_index is eager's error (IndexError, its message), from
    the op and from a compiled model whose loss folded, not a wrong loss."""
    if device() == "cuda":
        pytest.skip("CUDA reports it as a device-side assert, as eager does")
    logits = randn(4, 10)
    for bad in (10, -3):
        target = torch.tensor([1, 2, bad, IGNORE], device=device())
        with pytest.raises(IndexError, match=f"Target {bad} is out of bounds"):
            ops.cross_entropy_forward(logits, target, 1, IGNORE, torch.float32, 2)
    n, vocab = 16, 20
    model = LMHead(vocab, dtype=torch.bfloat16, upcast=True, return_logits=True, ignore_index=IGNORE).to(device())
    compiled = torch.compile(model, backend="hintbackend", options={"dump_dir": str(tmp_path)})
    ids = torch.randint(0, vocab, (2, n // 2), device=device())
    labels = torch.randint(0, vocab, (2, n // 2), device=device())
    compiled(ids, labels)[0].backward()  # compiles; the fold happened
    assert "hintbackend::cross_entropy_forward" in kernels(tmp_path)
    labels[1, 3] = vocab
    with pytest.raises(IndexError, match=f"Target {vocab} is out of bounds"):
        model(ids, labels)
    with pytest.raises(IndexError, match=f"Target {vocab} is out of bounds"):
        compiled(ids, labels)


class DFSLMHead(LMHead):
    """LMHead whose activation is a hinted_context(schedule="dfs") region (one batch row at a time): the
    graph then takes hintbackend's dfs/auto partition, not min-cut. Float32 but for a bf16 vocabulary
    projection, whose logits go through .float() for the loss (the dfs region's own float32 arithmetic
    keeps the comparison with eager tight)."""

    def __init__(self, vocab, hidden=24):
        super().__init__(vocab, hidden, ignore_index=IGNORE)
        self.out = self.out.to(torch.bfloat16)

    def forward(self, ids, labels):
        h = self.mlp(self.emb(ids))
        with hintbackend.hinted_context(schedule="dfs", slice_dims=[0]):
            h = torch.tanh(h) * torch.sigmoid(h)
        out = self.out(h.to(torch.bfloat16))
        loss = F.cross_entropy(out.float().view(-1, self.vocab), labels.view(-1), **self.ce)
        return loss, out


def test_save_logsumexp_beside_a_dfs_region(tmp_path):
    """With a dfs region in the graph (hintbackend's own partition, which recomputes the region in the
    backward), the loss still saves no [N, V] float32: the partition recomputes save-logsumexp's nodes
    from the logits as it does the region's. Loss, logits and gradients match eager."""
    torch.manual_seed(17)
    n, vocab = 64, 320
    train(DFSLMHead(vocab), n, vocab, tmp_path)
    returned = forward_returns(tmp_path)
    assert f"f32[{n}, {vocab}]" not in returned and returned.count(f"f32[{n}, 1]") == 1, returned
    k = kernels(tmp_path)
    assert "cross_entropy_backward.logits" in k and "cross_entropy_forward" in k and "slice_loop" in k, k
