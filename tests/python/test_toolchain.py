"""hintbackend in PyTorch's toolchain: tlparse artifacts under TORCH_TRACE, the dump folder's index and
memory picture, and what goes to the `hintbackend` logger (docs/debugging.md)."""

import json
import logging
import os
import re
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import device
from helpers import randn
from hintbackend import hinted_context


def attention(q, k, v):
    with hinted_context(schedule="dfs", slices=8):
        s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
        return s.float().softmax(-1).to(q.dtype) @ v


SCRIPT = textwrap.dedent("""
    import torch
    from hintbackend import hinted_context

    def attention(q, k, v):
        with hinted_context(schedule="dfs", slices=8):
            s = (q @ k.transpose(-1, -2)) * q.shape[-1] ** -0.5
            return s.float().softmax(-1).to(q.dtype) @ v

    q, k, v = (torch.randn(2, 4, 64, 16, requires_grad=True) for _ in range(3))
    torch.compile(attention, backend="hintbackend")(q, k, v).sum().backward()
""")


def _trace_records(folder):
    """(metadata dict) of every structured-trace record in TORCH_TRACE's log files."""
    out = []
    for name in os.listdir(folder):
        with open(os.path.join(folder, name)) as f:
            for line in f:
                m = re.match(r"^[VIWE]\d{4} [\d:.]+ \d+ \S+\] (\{.*\})$", line.rstrip("\n"))
                if m:
                    out.append(json.loads(m.group(1)))
    return out


@pytest.mark.skipif(device() == "cuda", reason="the artifacts do not depend on the device")
def test_torch_trace_carries_hintbackend_artifacts_beside_dynamo_and_aot(tmp_path):
    trace = tmp_path / "trace"
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "TORCH_TRACE": str(trace)})
    assert r.returncode == 0, r.stderr[-3000:]
    records = _trace_records(trace)
    dynamo = [x for x in records if "dynamo_output_graph" in x]
    ours = [x for x in records if x.get("artifact", {}).get("name", "").startswith("hintbackend_")]
    assert dynamo, "no Dynamo graph in the trace"
    names = {x["artifact"]["name"] for x in ours}
    for kind in ("forward_", "backward_"):
        for stem in ("fx_graph", "graph", "ir-import", "ir-final", "kernels", "memory-plan", "notes"):
            assert any(n.startswith("hintbackend_" + kind) and n.endswith("_" + stem) for n in names), (kind, stem, names)
        assert any(kind in n and "-slice-schedule" in n for n in names), names
    # Every artifact belongs to the compile that produced Dynamo's graph (tlparse groups by this id).
    compile_id = (dynamo[0]["frame_id"], dynamo[0]["frame_compile_id"])
    assert {(x["frame_id"], x["frame_compile_id"]) for x in ours} == {compile_id}
    assert all(x["artifact"]["encoding"] == "string" and "has_payload" in x for x in ours)
    if shutil.which("tlparse"):  # tlparse itself reads the trace and lists our pages under that compile
        out = tmp_path / "tlparse"
        log = next(iter(os.listdir(trace)))
        p = subprocess.run(["tlparse", str(trace / log), "-o", str(out), "--no-browser", "--strict"],
                           capture_output=True, text=True, timeout=120)
        assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
        directory = json.loads((out / "compile_directory.json").read_text())
        pages = [a["name"] for entry in directory.values() for a in entry.get("artifacts", [])]
        assert any(n.startswith("hintbackend_forward_") and "memory-plan" in n for n in pages), pages
        assert any(n.startswith("dynamo_output_graph") for n in pages), pages


def _overlap(a0, a1, b0, b1):
    return a0 < b1 and b0 < a1


def test_dump_index_and_memory_picture(tmp_path):
    q, k, v = (randn(2, 4, 64, 16).requires_grad_() for _ in range(3))
    f = torch.compile(attention, backend="hintbackend", options={"dump_dir": str(tmp_path)})
    f(q, k, v).sum().backward()
    graphs = sorted(g for g in os.listdir(tmp_path) if (tmp_path / g).is_dir())
    assert [g.rsplit("_", 1)[0] for g in graphs] == ["backward", "forward"], graphs
    index = (tmp_path / "index.html").read_text()
    for g in graphs:
        folder = tmp_path / g
        for name in os.listdir(folder):
            assert f'href="{g}/{name}"' in index, (g, name)
            if name.startswith("ir-after-"):  # the index says whether the pass changed the IR
                changed = not (folder / name).read_text().startswith("(unchanged)")
                label = "changed the IR" if changed else "unchanged"
                assert re.search(rf'href="{g}/{re.escape(name)}">{re.escape(name)}</a> - {label}<', index), name
    page = (tmp_path / graphs[1] / "memory.html").read_text()
    assert page.startswith("<!doctype html>") and "<script" not in page  # self-contained, static
    assert "as compiled" in page and "without slicing (bfs)" in page  # the dfs hint changed the plan
    assert "slice body slice_body_" in page and "it runs 8 times in this arena" in page


def test_memory_plan_data_is_a_valid_placement():
    """The data the picture draws: buffers live at the same time never share bytes of one arena, and
    slicing shrinks the arena (the picture's side-by-side claim)."""
    import hintbackend
    from hintbackend.options import parse_options
    from hintbackend.serialize import serialize

    gm = torch.fx.symbolic_trace(lambda x: ((x.exp() * 2).tanh() + x).relu().sum(-1))
    from torch._functorch.aot_autograd import aot_function, make_boxed_func

    plans = []

    def keep(g, inputs):
        doc, constants = serialize(g, "g", inputs_owned=False, inputs_kept=set())
        plans.append(hintbackend._core().CompiledGraph(json.dumps(doc), constants,
                                                       parse_options({}).core_settings()).memory_plan)
        return make_boxed_func(g.forward)

    aot_function(gm, fw_compiler=keep)(torch.randn(64, 64))
    plan = plans[0]
    assert plan is not None and plan["buffers"], plan
    for i, a in enumerate(plan["buffers"]):
        assert a["offset"] % 64 == 0 and a["offset"] + a["size"] <= plan["arena_bytes"], a
        for b in plan["buffers"][i + 1:]:
            if a["segment"] == b["segment"] and _overlap(a["start"], a["end"] + 1, b["start"], b["end"] + 1):
                assert not _overlap(a["offset"], a["offset"] + a["size"], b["offset"], b["offset"] + b["size"]), (a, b)
    assert plan["live_peak_bytes"] <= plan["arena_bytes"] <= plan["no_reuse_bytes"]


def test_decisions_go_to_the_hintbackend_logger(caplog):
    q, k, v = (randn(2, 4, 64, 16) for _ in range(3))
    with caplog.at_level(logging.DEBUG, logger="hintbackend"):
        torch.compile(attention, backend="hintbackend")(q, k, v)
    info = [r.getMessage() for r in caplog.records if r.name == "hintbackend" and r.levelno == logging.INFO]
    debug = [r.getMessage() for r in caplog.records if r.name == "hintbackend" and r.levelno == logging.DEBUG]
    summary = next(m for m in info if m.startswith("compiled inference_"))
    assert re.search(r"slice-schedule region \d+: dfs with slices=8", summary), summary
    assert any("kernels" in m.splitlines()[0] and "%" in m for m in debug), debug
    assert any("pass notes" in m.splitlines()[0] and "memory-plan graph" in m for m in debug), debug


# ---- CUDA graphs -------------------------------------------------------------------------------------


class Chain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 16, 16) * 0.3)

    def forward(self, x):
        for i in range(4):
            x = torch.sigmoid(torch.relu(x @ self.w[i]) * 0.5) + x
        return x


@pytest.mark.parametrize("how", [{"mode": "reduce-overhead"}, {"options": {"cuda_graphs": True, "strict": True}}],
                         ids=["mode", "option"])
def test_cuda_graphs_replay_matches_eager(how, caplog):
    import copy

    torch.manual_seed(0)
    model = Chain().to(device())
    compiled_model = copy.deepcopy(model)
    f = torch.compile(compiled_model, backend="hintbackend", **how)
    with caplog.at_level(logging.INFO, logger="hintbackend"):
        for step in range(4):  # warm-up, record, then replays, on fresh inputs each time
            torch.compiler.cudagraph_mark_step_begin()
            # A step's zero_grad(set_to_none=True): the gradients a replay returns live in the CUDA graphs'
            # memory, which the next step reuses (accumulating into them is what Inductor's
            # reduce-overhead refuses too).
            compiled_model.w.grad = model.w.grad = None
            x = randn(8, 16)
            got = f(x)
            torch.testing.assert_close(got, model(x), rtol=1e-5, atol=1e-5)
            got.sum().backward()
            model(x).sum().backward()
            torch.testing.assert_close(compiled_model.w.grad, model.w.grad, rtol=1e-5, atol=1e-5)
    messages = [r.getMessage() for r in caplog.records if r.name == "hintbackend"]
    if device() == "cuda":
        assert any("replays as a CUDA graph" in m and m.startswith("graph forward_") for m in messages), messages
        assert any("replays as a CUDA graph" in m and m.startswith("graph backward_") for m in messages), messages
        assert not any("runs without CUDA graphs" in m for m in messages), messages
    else:  # the CPU: the same results, and the reason it did not record (the lean runtime's replay refuses)
        assert any(m.endswith("runs without CUDA graphs: an input is not a CUDA tensor") for m in messages), messages


@pytest.mark.skipif(device() != "cuda", reason="FlexAttention on cuDNN under CUDA graphs (HINTBACKEND_TEST_DEVICE=cuda)")
@pytest.mark.parametrize("case", ["default_block_mask", "causal", "query_bias"])
def test_cuda_graphs_replay_flex_attention_training(case, caplog):
    """FlexAttention training steps replayed as CUDA graphs match eager. Without a block mask the forward
    builds flex's default BlockMask from constants, steps the executor otherwise runs once and keeps; a
    per-query bias (a row shift on cuDNN) reads index tensors cuDNN's call otherwise makes once. Under CUDA
    graphs nothing is kept across calls (Program::keep_across_calls): a kept value would sit in the graphs'
    memory pool untracked, which cudagraph trees refuse ("tensor(s) in the cudagraph pool not tracked as
    outputs")."""
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    torch.manual_seed(3)
    bm = create_block_mask(lambda b, h, q, kv: q >= kv, None, None, 256, 256, device="cuda") if case == "causal" else None
    qb = torch.randn(256, device="cuda")

    def score_mod(s, b, h, q, kv):
        return s + qb[q] if case == "query_bias" else s

    def attn(q, k, v):
        return flex_attention(q, k, v, score_mod=score_mod, block_mask=bm)

    f = torch.compile(attn, backend="hintbackend", options={"cuda_graphs": True})
    with caplog.at_level(logging.INFO, logger="hintbackend"):
        for step in range(4):
            torch.compiler.cudagraph_mark_step_begin()
            q, k, v = (torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            dout = torch.randn(2, 4, 256, 64, device="cuda", dtype=torch.bfloat16)
            got = f(q, k, v)
            got.backward(dout)
            grads = [t.grad for t in (q, k, v)]
            q2, k2, v2 = (t.detach().requires_grad_(True) for t in (q, k, v))
            want = attn(q2, k2, v2)
            want.backward(dout)
            torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2)
            for g, w in zip(grads, (q2.grad, k2.grad, v2.grad)):
                torch.testing.assert_close(g, w, rtol=2e-2, atol=2e-2)
    messages = [r.getMessage() for r in caplog.records if r.name == "hintbackend"]
    assert any("replays as a CUDA graph" in m and m.startswith("graph backward_") for m in messages), messages


def test_unsupported_mode_names_the_ones_that_work():
    f = torch.compile(lambda x: x + 1, backend="hintbackend", mode="max-autotune")
    with pytest.raises(Exception, match='mode=\'max-autotune\' is not supported: use mode="reduce-overhead"'):
        f(randn(3))
