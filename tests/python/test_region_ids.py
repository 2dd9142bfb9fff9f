"""Region ids are stable: derived from the source place and the order of entry, so a recompile (or a
second process) gives the same ids and the same dumps, while distinct regions, and one `with` line
entered once per loop iteration, get distinct ids."""

import os

import torch

from conftest import device
from helpers import randn
from hintbackend import hinted_context


class Layers(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lins = torch.nn.ModuleList(torch.nn.Linear(16, 16) for _ in range(3))

    def forward(self, x):
        with hinted_context(schedule="bfs"):
            x = x.sin()
        for lin in self.lins:  # one `with` line, three regions
            with hinted_context(schedule="dfs", slices=2):
                x = lin(x).relu()
                with hinted_context(kernel="aten"):  # nested: its path starts with the layer's id
                    x = x * 2
        return x


def _compile_and_dump(model, x, dump):
    """{"forward": IR text, "backward": IR text} with the graph names (a process-wide counter) left out."""
    torch._dynamo.reset()
    f = torch.compile(model, backend="hintbackend", options={"dump_dir": str(dump)})
    f(x).sum().backward()
    out = {}
    for g in os.listdir(dump):
        if not (dump / g).is_dir():  # index.html
            continue
        kind = g.rsplit("_", 1)[0]
        out[kind] = (dump / g / "ir-import.txt").read_text().replace(g, kind)
    return out


def _region_ids(ir_texts):
    """The region id of every annotated line, in order (graphs by kind)."""
    ids = []
    for _, text in sorted(ir_texts.items()):
        for line in text.splitlines():
            if "{region=" in line:
                ids.append(int(line.split("{region=")[1].split()[0]))
    return ids


def test_recompiling_gives_the_same_ids_and_dumps(tmp_path):
    torch.manual_seed(0)
    model = Layers().to(device())
    x = randn(4, 16)
    first = _compile_and_dump(model, x, tmp_path / "a")
    second = _compile_and_dump(model, x, tmp_path / "b")
    assert first["forward"] == second["forward"]  # the forward IR text, ids included, is identical
    # The backward too, node by node (torch may number its FX node names differently on a retrace).
    assert _region_ids({"bw": first["backward"]}) == _region_ids({"bw": second["backward"]})
    fw = first["forward"]
    ids = set(_region_ids({"fw": fw}))
    # sin's region, three layer regions and three nested ones: seven distinct ids.
    assert len(ids) == 7, sorted(ids)
    # Nested regions name their layer's region first in their path.
    paths = {line.split(" path=")[1].split()[0] for line in fw.splitlines() if " path=" in line}
    nested = [p for p in paths if "/" in p]
    assert len(nested) == 3 and {int(p.split("/")[0]) for p in nested} <= ids, paths


def test_ids_do_not_depend_on_what_was_compiled_before(tmp_path):
    """A process that compiled other regions first still gives this model the same ids."""
    torch.manual_seed(0)
    model = Layers().to(device())
    x = randn(4, 16)
    alone = _region_ids(_compile_and_dump(model, x, tmp_path / "a"))
    assert alone

    def other(y):
        with hinted_context(schedule="dfs", slices=2):
            return y.cos()

    torch._dynamo.reset()
    torch.compile(other, backend="hintbackend")(randn(4, 16))
    assert _region_ids(_compile_and_dump(model, x, tmp_path / "b")) == alone
