"""The benchmark scripts' own bookkeeping (what their tables print when a peer fails), on CPU with stand-in
steps: nothing compiles here."""

import math
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "benchmarks"))
import memory_models  # noqa: E402


def test_memory_models_a_peer_failing_in_its_timed_rounds_keeps_its_peak(monkeypatch):
    """run_peers measures every peer's peak, then times them in turns: a peer that fails only in the timed
    rounds keeps its peak, gets the error in its time, and the others are still timed; a peer that fails
    before its peak gets the error alone."""
    calls = {"good": 0, "late": 0, "early": 0}

    def training_step(peer, make, loss_fn, x, device, dtype, reset=True):
        def step():
            calls[peer] += 1
            if peer == "early":
                raise RuntimeError("cannot compile")
            if peer == "late" and calls[peer] > 4:  # peak_of's three steps, then round 1's untimed one
                raise ValueError("failed in round 1")
            torch.ones(4096).sum()  # a 16 KiB tensor: the peak LiveBytes counts (and the sum's 4 bytes)
        return step

    monkeypatch.setattr(memory_models, "training_step", training_step)
    res = memory_models.run_peers(["good", "late", "early"], None, None, torch.zeros(1), "cpu", torch.float32,
                                  steps=3, rounds=2)
    good, late, early = res["good"], res["late"], res["early"]
    assert good[0] == late[0] and 16 / 1024 <= good[0] < 17 / 1024, (good, late)  # the tensor and its sum
    assert good[1] is not None and good[1] >= 0 and good[2] == ""
    assert late[1] is None and late[2] == "ValueError: failed in round 1"
    assert early == (None, None, "RuntimeError: cannot compile")
    assert calls["good"] == 3 + 2 * (1 + 3), calls  # the peak's 3 steps, then 2 rounds of 1 untimed + 3 timed
    assert calls["late"] == 5, calls  # not called again after it failed
    assert memory_models.table_cell(*late) == "0 / fails: ValueEr"
    assert memory_models.table_cell(*early) == "fails: RuntimeError: "  # the first 14 characters, as before
    assert math.isnan(memory_models.ratio(late[1], good[1])) and memory_models.ratio(good[0], late[0]) == 1.0


def test_host_time_times_its_peers_in_rounds(capsys):
    """host_time.py compiles every peer, then times them in interleaved rounds: each gets a row of five
    positive times, a `--without` peer included."""
    import host_time
    host_time.main(["--device", "cpu", "--models", "cnn", "--rows", "2", "--steps", "2", "--rounds", "2",
                    "--without", "write-inputs-in-place"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("CNN")]
    peers = [" ".join(r.split()[4:-5]) for r in rows]
    assert peers == ["eager", "hintbackend", "hb-aot-runtime", "hb -write-inputs-in-place"], rows
    for r in rows:
        values = [float(v) for v in r.split()[-5:]]
        assert all(v > 0 for v in values), r


def test_buffer_updates_shows_the_cache_copied_without_the_pass(capsys):
    """buffer_updates.py: with write-inputs-in-place the step's peak is eager's; without it the step copies
    the whole cache (its peak at least one cache more)."""
    import buffer_updates
    buffer_updates.main(["--device", "cpu", "--seq", "256", "--rounds", "1", "--steps", "2"])
    out = capsys.readouterr().out
    cache_mib = 4 * 16 * 256 * 64 * 4 / 2**20
    peaks = {line.split()[0]: float(line.split()[-4]) for line in out.splitlines()
             if line.split() and line.split()[0] in ("eager", "hintbackend", "hb")}
    assert set(peaks) == {"eager", "hintbackend", "hb"}, out
    assert peaks["hintbackend"] <= peaks["eager"] + 0.1, out
    assert peaks["hb"] >= peaks["hintbackend"] + cache_mib * 0.9, out


def test_views_times_its_peers_and_a_fast_views_peer(capsys):
    """views.py: each graph gets eager, hintbackend and hintbackend with fast_views off, every time
    positive; host_time.py's --without takes the option by name as it takes a pass."""
    import views
    views.main(["--device", "cpu", "--rounds", "2", "--calls", "2", "--layers", "1"])
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith(("HF Llama", "view chain"))]
    assert any(r.startswith("view chain") for r in rows), rows
    for r in rows:
        if "skipped" in r:  # no transformers
            continue
        values = [float(v) for v in r.split()[-4:]]
        assert all(v > 0 for v in values), r
    import host_time
    assert "hb -fast_views" in host_time.peers(without=["fast_views"])


def test_buffer_updates_ema_shows_the_temporary_without_the_fold(capsys):
    """buffer_updates.py --model ema: the average's mul_/add_ in place at eager's peak; without
    fold-scaled-add the step holds a full-size temporary (alpha times the sample), one buffer more."""
    import buffer_updates
    buffer_updates.main(["--device", "cpu", "--seq", "256", "--rounds", "1", "--steps", "2", "--model", "ema"])
    out = capsys.readouterr().out
    buf_mib = 4 * 16 * 256 * 64 * 4 / 2**20
    peaks = {" ".join(line.split()[:-4]): float(line.split()[-4]) for line in out.splitlines()
             if line.startswith(("eager", "hintbackend", "hb "))}
    assert set(peaks) == {"eager", "hintbackend", "hb -write-inputs-in-place", "hb -fold-scaled-add"}, out
    assert peaks["hintbackend"] <= peaks["eager"] + 0.1, out
    assert peaks["hb -fold-scaled-add"] >= peaks["hintbackend"] + buf_mib * 0.9, out
