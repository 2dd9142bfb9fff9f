"""Graph dumps: one folder per compiled graph under options["dump_dir"] / HINTBACKEND_DUMP_DIR, and the same
text as tlparse artifacts when PyTorch's structured trace is on (TORCH_TRACE=dir).

  <dump_dir>/index.html                        every graph, its files, which passes changed it
            <kind>_<n>/fx_graph.txt            what came in (FX, readable)
                       graph.json              the document sent to C++
                       ir-import.txt           the IR right after import
                       ir-after-<k>-<pass>.txt after each pass ("(unchanged)" when it did nothing)
                       ir-final.txt            the IR that runs
                       kernels.txt             which kernel runs each node
                       memory-plan.txt         the program's memory plan, which the runtime runs as given
                                               (what goes into its arenas, where, and why the rest does not)
                       memory.html             its picture (memory_picture.py), beside the plan without
                                               slicing when a hint sliced the graph
                       placement.txt           what the runtime could place, per op and device
                                               (hb-opt --placement=placement.txt replays this plan)
                       notes.txt               what passes reported (disabled passes, schedules, plans)

Under TORCH_TRACE each text file is also a `trace_structured` artifact named
"hintbackend_<kind>_<n>_<file stem>", so tlparse shows it on the page of the compile it belongs to.
"""

from __future__ import annotations

import logging
import os
from typing import Dict, List, Optional, Tuple

log = logging.getLogger("hintbackend")


class DumpDirError(OSError):
    """dump_dir (or HINTBACKEND_DUMP_DIR) cannot be written."""


def format_bytes(n: int) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n} bytes" if unit == "bytes" else f"{n:.3g} {unit}"
        n /= 1024
    return str(n)


def structured_trace_on() -> bool:
    """Whether PyTorch's structured trace (TORCH_TRACE) is recording."""
    try:
        from torch._logging._internal import trace_log
    except ImportError:  # a torch without structured tracing
        return False
    return bool(trace_log.handlers)


class Dumper:
    """One compiled graph's dumps: files under `root`/`name` (root None: no files) and, with `trace`,
    tlparse artifacts."""

    def __init__(self, root: Optional[str], name: str, trace: bool = False) -> None:
        self.root, self.name, self.trace = root, name, trace
        self.dir = os.path.join(root, name) if root else None
        if self.dir:
            try:
                os.makedirs(self.dir, exist_ok=True)
            except OSError as e:
                raise self._error(e) from e

    def write(self, filename: str, text: str, trace: bool = True) -> None:
        if self.dir:
            try:
                with open(os.path.join(self.dir, filename), "w") as f:
                    f.write(text)
            except OSError as e:
                raise self._error(e) from e
        if self.trace and trace:
            from torch._logging import trace_structured

            stem = os.path.splitext(filename)[0]
            trace_structured("artifact",
                             metadata_fn=lambda: {"name": f"hintbackend_{self.name}_{stem}", "encoding": "string"},
                             payload_fn=lambda: text)

    def finish(self) -> None:
        """Rewrites the dump folder's index.html to list this graph too."""
        if not self.root:
            return
        from .memory_picture import write_index

        graphs: Dict[str, List[Tuple[str, str]]] = {}
        for g in os.listdir(self.root):
            folder = os.path.join(self.root, g)
            if os.path.isdir(folder):
                graphs[g] = [(f, _what(folder, f)) for f in sorted(os.listdir(folder), key=_file_order)]
        self.write_root("index.html", write_index(self.root, graphs))

    def write_root(self, filename: str, text: str) -> None:
        tmp = os.path.join(self.root, f".{filename}.{os.getpid()}")
        try:
            with open(tmp, "w") as f:
                f.write(text)
            os.replace(tmp, os.path.join(self.root, filename))  # readers never see half a file
        except OSError as e:
            raise self._error(e) from e

    def _error(self, e: OSError) -> DumpDirError:
        return DumpDirError(
            f"hintbackend: cannot write graph dumps under dump_dir={self.root!r}: {e.strerror or e} "
            f"({e.filename or self.dir}). Give options={{'dump_dir': ...}} (or HINTBACKEND_DUMP_DIR) a folder "
            "you can write, or unset it to turn dumps off.")


_ORDER = ["fx_graph.txt", "graph.json", "ir-import.txt"]
_LAST = ["ir-final.txt", "kernels.txt", "memory-plan.txt", "memory.html", "placement.txt", "notes.txt"]


def _file_order(f: str) -> Tuple[int, int, str]:
    if f in _ORDER:
        return (0, _ORDER.index(f), f)
    if f.startswith("ir-after-"):
        step = f[len("ir-after-"):].split("-", 1)[0]
        return (1, int(step) if step.isdigit() else 0, f)
    return (2, _LAST.index(f) if f in _LAST else len(_LAST), f)


def _what(folder: str, f: str) -> str:
    if not f.startswith("ir-after-"):
        return ""
    try:
        with open(os.path.join(folder, f)) as fh:
            return "unchanged" if fh.readline().startswith("(unchanged)") else "changed the IR"
    except OSError:
        return ""
