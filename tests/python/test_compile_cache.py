"""The compile cache (python/hintbackend/compile_cache.py, README "Caching"): a second process loads the
compiled graphs from <cache_dir>/aotautograd instead of running AOTAutograd and the passes, with the same
results bit for bit; a corrupt entry is rebuilt; other options, hints or graphs miss."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from conftest import device
from hintbackend.options import parse_options

pytestmark = pytest.mark.skipif(device() == "cuda", reason="the cache does not depend on the device; CPU is enough")

# The scripts' first lines: `lines` keeps the hintbackend logger's messages.
KEEP_LOG = textwrap.dedent("""
    import logging

    lines = []

    class Keep(logging.Handler):
        def emit(self, record):
            lines.append(record.getMessage())

    log = logging.getLogger("hintbackend")
    log.setLevel(logging.INFO)
    log.addHandler(Keep())
""")

# A training step of a block with a hinted (dfs) attention region; prints the cache counters and the
# hintbackend log lines about the cache, and saves the loss and the gradients.
SCRIPT = KEEP_LOG + textwrap.dedent("""
    import json, sys
    import torch
    from hintbackend import hinted_context

    cache, out, slices, arena, variant = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] == "1", sys.argv[5]

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = torch.nn.Linear(16, 48)

        def forward(self, x):
            q, k, v = self.qkv(x).view(2, 64, 3, 4, 4).permute(2, 0, 3, 1, 4)
            with hinted_context(schedule="dfs", slices=slices):
                s = (q @ k.transpose(-1, -2)) * 0.5
                a = s.float().softmax(-1) @ v
            return a.tanh() if variant == "tanh" else a.relu()

    torch.manual_seed(0)
    model = Block()
    x = torch.randn(2, 64, 16, requires_grad=True)
    fn = torch.compile(model, backend="hintbackend", options={"cache_dir": cache, "arena": arena})
    y = fn(x)
    loss = y.square().sum()
    loss.backward()
    torch.save({"loss": loss.detach(), "grads": [x.grad] + [p.grad for p in model.parameters()]}, out)
    counters = dict(torch._dynamo.utils.counters["aot_autograd"])
    print(json.dumps({"counters": counters, "log": [m for m in lines if "compile cache" in m],
                      "grad_fn": type(y.grad_fn).__name__}))
""")


def run(tmp_path, tag, cache, slices=8, arena=True, variant="relu", env=None):
    out = tmp_path / f"{tag}.pt"
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(cache), str(out), str(slices), "1" if arena else "0",
                        variant], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), **(env or {})})
    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    result["out"] = torch.load(out)
    result["stderr"] = r.stderr
    return result


def hit(r):
    return r["counters"].get("autograd_cache_hit", 0) == 1 and any("compile cache hit" in m for m in r["log"])


def miss(r):
    return r["counters"].get("autograd_cache_miss", 0) == 1 and any("compile cache miss" in m for m in r["log"])


def same(a, b):
    return torch.equal(a["out"]["loss"], b["out"]["loss"]) and \
        all(torch.equal(x, y) for x, y in zip(a["out"]["grads"], b["out"]["grads"]))


def entries(cache):
    folder = cache / "aotautograd"
    return sorted(p for p in folder.rglob("*") if p.is_file() and not p.name.startswith(".")) if folder.exists() else []


def test_a_second_process_loads_the_graphs_and_matches_bitwise(tmp_path):
    cache = tmp_path / "cache"
    first = run(tmp_path, "first", cache)
    assert miss(first), first
    assert first["counters"].get("autograd_cache_saved") == 1, first
    assert len(entries(cache)) == 1
    second = run(tmp_path, "second", cache)
    assert hit(second), second
    assert "forward and backward" in " ".join(second["log"]), second["log"]
    assert same(first, second)
    # the lean runtime's plan is stored with the forward: a hit runs lean too (lean_runtime.py)
    assert first["grad_fn"] == second["grad_fn"] == "LeanBackward", (first["grad_fn"], second["grad_fn"])
    assert len(entries(cache)) == 1


def test_a_corrupt_entry_is_detected_and_rebuilt(tmp_path):
    cache = tmp_path / "cache"
    first = run(tmp_path, "first", cache)
    assert miss(first), first
    (entry,) = entries(cache)
    content = entry.read_bytes()
    # a change inside our part of the entry (the graph document's name, as its JSON spells it: torch's part
    # of the entry may hold "forward_" too, before ours in an order that varies between processes) that
    # still unpickles: the checksum says no
    assert b'"name": "forward_' in content
    entry.write_bytes(content.replace(b'"name": "forward_', b'"name": "forwarX_', 1))
    second = run(tmp_path, "second", cache)
    assert miss(second) and not hit(second), second
    assert "corrupt compile cache entry" in second["stderr"]
    assert same(first, second)
    third = run(tmp_path, "third", cache)  # the rebuilt entry is found
    assert hit(third), third
    assert same(first, third)
    # a truncated entry does not unpickle at all: a miss, and rebuilt
    for e in entries(cache):
        e.write_bytes(e.read_bytes()[: len(content) // 2])
    fourth = run(tmp_path, "fourth", cache)
    assert miss(fourth) and not hit(fourth), fourth
    assert same(first, fourth)
    assert hit(run(tmp_path, "fifth", cache))


def test_other_options_hints_or_graphs_miss(tmp_path):
    cache = tmp_path / "cache"
    assert miss(run(tmp_path, "first", cache))
    assert miss(run(tmp_path, "no_arena", cache, arena=False))   # an option
    assert miss(run(tmp_path, "slices", cache, slices=4))        # a hint (node metadata, not in torch's key)
    assert miss(run(tmp_path, "graph", cache, variant="tanh"))   # the graph
    assert len(entries(cache)) == 4
    assert hit(run(tmp_path, "again", cache, slices=4))


def test_the_cache_can_be_turned_off(tmp_path):
    cache = tmp_path / "cache"
    r = run(tmp_path, "off", cache, env={"HINTBACKEND_COMPILE_CACHE": "0"})
    assert not r["counters"].get("autograd_cache_hit") and not r["counters"].get("autograd_cache_saved"), r
    assert entries(cache) == []


# Training steps of an MLP with cuda_graphs=True on the CPU, where the lean runtime's replay is emulated
# (lean_runtime.EMULATE_REPLAY: the same bookkeeping, no capture); prints the cache counters, the log lines
# about the cache and the replay statistics, and saves the losses and the gradients.
REPLAY_SCRIPT = KEEP_LOG + textwrap.dedent("""
    import gc, json, sys
    import torch
    from hintbackend import lean_runtime

    lean_runtime.EMULATE_REPLAY = True
    cache, out = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 8))
    fn = torch.compile(model, backend="hintbackend", options={"cache_dir": cache, "cuda_graphs": True})
    losses, grads = [], []
    for step in range(5):
        model.zero_grad()
        loss = fn(torch.randn(64, 16)).square().mean()
        loss.backward()
        losses.append(loss.detach())
        grads.append([p.grad.clone() for p in model.parameters()])
    torch.save({"loss": torch.stack(losses), "grads": [g for gs in grads for g in gs]}, out)
    pairs = [o for o in gc.get_objects() if type(o) is lean_runtime.LeanPair and o.replayed]
    stats = [g.stats for g in pairs[0].replayed] if pairs else []
    counters = dict(torch._dynamo.utils.counters["aot_autograd"])
    print(json.dumps({"counters": counters, "log": [m for m in lines if "compile cache" in m],
                      "replays": [s["replays"] for s in stats]}))
""")


def test_cuda_graph_pairs_are_stored_and_a_hit_replays(tmp_path):
    """cuda_graphs=True: a training pair the lean runtime replays itself is stored like any other; a second
    process loads it and replays it (emulated on the CPU), with the first process's losses and gradients bit
    for bit. (An inference graph, which torch's cudagraph trees replay, is not stored: the log says why.)"""
    cache = tmp_path / "cache"

    def replay_run(tag):
        out = tmp_path / f"{tag}.pt"
        r = subprocess.run([sys.executable, "-c", REPLAY_SCRIPT, str(cache), str(out)], capture_output=True,
                           text=True, timeout=300, env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
        assert r.returncode == 0, r.stderr[-3000:]
        result = json.loads(r.stdout.strip().splitlines()[-1])
        result["out"] = torch.load(out)
        return result

    first = replay_run("first")
    assert miss(first) and first["counters"].get("autograd_cache_saved") == 1, first
    second = replay_run("second")
    assert hit(second), second
    assert "forward and backward" in " ".join(second["log"]), second["log"]
    assert same(first, second)
    for r in (first, second):
        assert len(r["replays"]) == 2 and all(n > 0 for n in r["replays"]), r["replays"]


def test_option_and_environment_are_validated(monkeypatch):
    assert parse_options({}).compile_cache is True
    assert parse_options({"compile_cache": False}).compile_cache is False
    with pytest.raises(ValueError, match="option 'compile_cache' must be a bool"):
        parse_options({"compile_cache": "no"})
    monkeypatch.setenv("HINTBACKEND_COMPILE_CACHE", "0")
    assert parse_options({}).compile_cache is False
    assert parse_options({"compile_cache": True}).compile_cache is True  # the option wins
    monkeypatch.setenv("HINTBACKEND_COMPILE_CACHE", "off")
    with pytest.raises(ValueError, match="HINTBACKEND_COMPILE_CACHE"):
        parse_options({})


# The demo model (FlexAttention with a learned relative bias: its traced code touches pytree) trained one
# step with torch's Dynamo cache on (caching_precompile, the opt-in TORCH_CACHING_PRECOMPILE=1); the
# first process saves its entries, the second loads them when torch.compile wraps the model.
DYNAMO_SCRIPT = textwrap.dedent("""
    import json, sys
    import torch
    torch._dynamo.config.caching_precompile = True
    from hintbackend.demo import TinyGPT

    cache, out = sys.argv[1], sys.argv[2]
    torch.manual_seed(0)
    model = TinyGPT(seq=32, device="cpu")
    fn = torch.compile(model, backend="hintbackend", options={"cache_dir": cache})
    data = torch.randint(0, 256, (2, 33))
    loss = fn(data[:, :-1], data[:, 1:])
    loss.backward()
    torch.save({"loss": loss.detach(), "grads": [p.grad for p in model.parameters()]}, out)
    torch.compiler.save_cache_artifacts()
    c = torch._dynamo.utils.counters
    print(json.dumps({"dynamo_cache": dict(c["dynamo_cache"]), "graphs": c["stats"]["unique_graphs"]}))
""")


def test_dynamo_cache_reloads_the_flex_demo_in_a_second_process(tmp_path):
    """With torch's Dynamo cache on, the second process traces nothing (Dynamo's entry hit, no graph
    compiled) and its loss and gradients equal the first's bit for bit. torch 2.11 fails to reload this
    model's guards on its own ("TracingContext.get() must be called within an ongoing trace", from the
    pytree guard FlexAttention's code adds); compile_cache._load_dynamo_guards_outside_a_trace fixes it."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "torch")}
    results = []
    for tag in ("first", "second"):
        out = tmp_path / f"{tag}.pt"
        r = subprocess.run([sys.executable, "-c", DYNAMO_SCRIPT, str(tmp_path / "hb"), str(out)], capture_output=True,
                           text=True, timeout=300, env=env)
        assert r.returncode == 0, r.stderr[-3000:]
        assert "Failed to load" not in r.stderr, r.stderr[-3000:]
        results.append((json.loads(r.stdout.strip().splitlines()[-1]), torch.load(out)))
    (first, a), (second, b) = results
    assert first["dynamo_cache"].get("dynamo_cache_hit", 0) == 0 and first["graphs"] >= 1, first
    assert second["dynamo_cache"].get("dynamo_cache_hit", 0) == 1 and second["graphs"] == 0, second
    assert torch.equal(a["loss"], b["loss"])
    for x, y in zip(a["grads"], b["grads"]):
        assert torch.equal(x, y)


def test_dynamo_guard_sources_with_computed_fields_round_trip_through_pickle():
    """torch 2.11 pickles a guard source as its class called with every field, computed ones included, so
    a DefaultsSource (a guard on a function's defaults) could not be unpickled by the Dynamo cache's load;
    hintbackend's import makes the reduction pass the constructor's fields only."""
    import pickle

    import hintbackend.compile_cache  # noqa: F401  (the fix is installed on import)
    from torch._dynamo.source import DefaultsSource, LocalSource

    for src in (DefaultsSource(LocalSource("f"), 1), DefaultsSource(LocalSource("f"), "k", True)):
        back = pickle.loads(pickle.dumps(src))
        assert back == src and back.name == src.name
