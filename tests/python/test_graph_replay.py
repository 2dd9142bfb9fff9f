"""CUDA-graph replay in the lean runtime (options={"cuda_graphs": True}; backend/runtime/GraphReplay.h):
each training graph is recorded once and replayed, with the results of eager on fresh inputs every step,
outputs the caller keeps never overwritten, autograd's version checks intact, and calls the replay cannot
take (outputs of both recordings still held, moved parameters) run as usual, correctly.

On the CPU (CI) the same bookkeeping runs in GraphReplay's emulated mode (lean_runtime.EMULATE_REPLAY: a
"replay" runs the graph on the static inputs and copies its results into the recorded storages); on CUDA
(HINTBACKEND_TEST_DEVICE=cuda) the graphs are captured and replayed for real."""

import copy
import gc
import logging

import pytest
import torch

from conftest import device
from helpers import randn
from hintbackend import lean_runtime
from test_models import MLP


@pytest.fixture(autouse=True)
def replay_mode(monkeypatch):
    monkeypatch.setattr(lean_runtime, "EMULATE_REPLAY", device() != "cuda")
    torch._dynamo.reset()
    gc.collect()


def replayed():
    """The (forward, backward) ReplayedGraphs of the pairs built since the fixture reset Dynamo."""
    pairs = [o for o in gc.get_objects() if type(o) is lean_runtime.LeanPair and o.replayed]
    assert len(pairs) == 1, f"{len(pairs)} replayed pairs"
    return pairs[0].replayed


def compiled(model):
    # Compiled in this process (no compile cache): the counts below assume the backward is compiled at the
    # first backward, which a cache hit loads with the forward instead (test_compile_cache.py covers a hit
    # under replay).
    return torch.compile(model, backend="hintbackend",
                         options={"cuda_graphs": True, "strict": True, "compile_cache": False})


def loss(y):
    return y.float().square().mean()


def assert_same_grads(model, ref, what=""):
    for (name, p), q in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-5, msg=lambda m: f"{what}{name}: {m}")


def backward_both(f, model, ref, step):
    """A step's backward of the compiled model and of its eager copy on a fresh batch, into the gradients
    as the caller left them: the same gradients."""
    x = randn(64, 16)
    loss(f(x)).backward()
    loss(ref(x)).backward()
    assert_same_grads(model, ref, f"step {step} ")


def check_step(f, model, ref, x):
    """One training step of the compiled model and of its eager copy on x: the same output and gradients."""
    for p in list(model.parameters()) + list(ref.parameters()):
        p.grad = None
    out = f(x)
    loss(out).backward()
    want = ref(x)
    loss(want).backward()
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
    assert_same_grads(model, ref)
    return out


def test_training_steps_replay_and_match_eager(caplog):
    torch.manual_seed(0)
    model = MLP().to(device())
    ref = copy.deepcopy(model)
    f = compiled(model)
    with caplog.at_level(logging.INFO, logger="hintbackend"):
        out = None
        for _ in range(8):  # fresh inputs; the loop keeps the last output, as `out = model(x)` does
            out = check_step(f, model, ref, randn(64, 16))
    fw, bw = (g.stats for g in replayed())
    # (the first call runs on AOTAutograd's runtime: the backward is compiled at the first backward; the next
    # warms up; then each graph replays, on a second recording while the loop holds the first one's output)
    assert fw["calls"] == bw["calls"] == 7, (fw, bw)
    assert fw["replays"] == bw["replays"] == 6, (fw, bw)
    assert fw["recordings"] == 2 and bw["recordings"] == 2, (fw, bw)
    assert fw["copied_inputs"] == 1 and bw["copied_inputs"] == 1, (fw, bw)  # the batch; the tangent
    messages = [r.getMessage() for r in caplog.records if r.name == "hintbackend"]
    assert any(m.startswith("graph forward_") and "replays as a CUDA graph" in m for m in messages), messages
    assert any(m.startswith("graph backward_") and "replays as a CUDA graph" in m for m in messages), messages
    assert not any("without CUDA graphs" in m for m in messages), messages


def test_outputs_the_caller_keeps_are_never_overwritten(caplog):
    torch.manual_seed(1)
    model = MLP().to(device())
    ref = copy.deepcopy(model)
    f = compiled(model)
    xs = [randn(64, 16) for _ in range(6)]
    with caplog.at_level(logging.INFO, logger="hintbackend"):
        kept = [check_step(f, model, ref, x) for x in xs]
    for x, out in zip(xs, kept):  # each still holds its own step's values
        torch.testing.assert_close(out, ref(x), rtol=1e-5, atol=1e-5)
    fw = replayed()[0].stats
    assert fw["replays"] == 2 and fw["plain"] == 3, fw  # two recordings, then both held: as usual
    messages = [r.getMessage() for r in caplog.records if r.name == "hintbackend"]
    assert sum("were still referenced when it was called again" in m for m in messages) == 1, messages


def test_an_in_place_change_to_a_saved_output_is_caught():
    # The MLP's output (tanh's) is also a saved value: both come back on one storage with one version counter.
    torch.manual_seed(2)
    model = MLP().to(device())
    f = compiled(model)
    for _ in range(4):
        loss(f(randn(64, 16))).backward()
    assert replayed()[0].stats["replays"] >= 2
    out = f(randn(64, 16))
    out.mul_(2)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        loss(out).backward()


def test_moved_parameters_and_kept_gradients():
    """A parameter replaced between steps (its address moves), with gradients kept and zeroed in place
    (autograd accumulates into them, so the replays' own outputs are free again after each backward):
    correct at every step, replaying again after one new recording of each graph."""
    torch.manual_seed(3)
    model = MLP().to(device())
    ref = copy.deepcopy(model)
    f = compiled(model)
    for p in list(model.parameters()) + list(ref.parameters()):
        p.grad = torch.zeros_like(p)
    for step in range(10):
        if step == 5:
            with torch.no_grad():
                for m in (model, ref):
                    m.net[0].weight.data = m.net[0].weight.data * 0.5
        for p in list(model.parameters()) + list(ref.parameters()):
            p.grad.zero_()
        backward_both(f, model, ref, step)
    fw, bw = (g.stats for g in replayed())
    # (the forward: warm-up, a recording, and a second one for the moved weight; the backward: a second one
    # for the saved values of the forward's second)
    assert fw["recordings"] == 2 and fw["replays"] == 8, fw
    assert bw["recordings"] == 2 and bw["replays"] >= 6, bw


def test_gradients_kept_from_a_replay_are_never_overwritten():
    """The backward's recording shares its forward's memory pool, so its gradients may sit where the forward's
    intermediates were. Gradients a replay returned, kept from step 3 on (zero_grad(set_to_none=False)), send
    the forward to a second recording; on CUDA, a replay of the first would overwrite them."""
    torch.manual_seed(6)
    model = MLP().to(device())
    ref = copy.deepcopy(model)
    f = compiled(model)
    params = list(model.parameters()) + list(ref.parameters())
    for step in range(8):
        for p in params:
            if step <= 3:
                p.grad = None  # step 3's gradients are the backward replay's own outputs, taken by autograd
            else:
                p.grad.zero_()
        backward_both(f, model, ref, step)
    fw, bw = (g.stats for g in replayed())
    assert fw["recordings"] == 2 and fw["replays"] == 6 and fw["plain"] == 1, fw
    assert bw["recordings"] == 2 and bw["replays"] == 6, bw


def test_a_graph_on_another_device_is_refused_once(caplog):
    if device() == "cuda":
        pytest.skip("the refusal of CPU inputs is what the CPU run checks")
    torch.manual_seed(4)
    model = MLP()
    f = compiled(model)
    lean_runtime.EMULATE_REPLAY = False  # (monkeypatched back) a real CUDA-graph replay of CPU tensors
    with caplog.at_level(logging.INFO, logger="hintbackend"):
        for _ in range(3):
            loss(f(randn(64, 16))).backward()
    messages = [r.getMessage() for r in caplog.records if r.name == "hintbackend"]
    assert sum(m.endswith("runs without CUDA graphs: an input is not a CUDA tensor") for m in messages) == 2, messages


@torch.library.custom_op("hbtest::host_max", mutates_args=())
def host_max(t: torch.Tensor) -> torch.Tensor:
    """max |t| + 1 through the host: a copy to the CPU and back, which no CUDA graph can record."""
    return (t.abs().max().cpu() + 1.0).to(t.device)


@host_max.register_fake
def _(t):
    return t.new_empty(())


class SyncsTheHost(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        y = self.lin(x)
        return y / host_max(y.detach())


@pytest.mark.skipif(device() != "cuda", reason="a failed capture needs a GPU (HINTBACKEND_TEST_DEVICE=cuda)")
def test_a_graph_that_cannot_be_captured_runs_as_usual_and_leaves_cuda_sound(caplog):
    torch.manual_seed(5)
    model = SyncsTheHost().to(device())
    ref = copy.deepcopy(model)
    with caplog.at_level(logging.INFO, logger="hintbackend"):
        f = compiled(model)
        for _ in range(5):
            check_step(f, model, ref, randn(64, 16))
    fw = replayed()[0].stats
    assert "could not be recorded as a CUDA graph" in fw["refused"] and fw["replays"] == 0, fw
    messages = [r.getMessage() for r in caplog.records if r.name == "hintbackend"]
    assert sum("could not be recorded as a CUDA graph" in m for m in messages) == 1, messages
    # What the failed capture began (the allocator's routing into its pool, the capture) is undone: another
    # model records and replays after it.
    del f
    torch._dynamo.reset()
    gc.collect()
    caplog.clear()
    test_training_steps_replay_and_match_eager(caplog)
