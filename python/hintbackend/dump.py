"""Graph dumps: one folder per compiled graph under options["dump_dir"] / HINTBACKEND_DUMP_DIR.

  <dump_dir>/<kind>_<n>/fx_graph.txt          what came in (FX, readable)
                       graph.json             the document sent to C++
                       ir-import.txt          the IR right after import
                       ir-after-<k>-<pass>.txt  after each pass ("(unchanged)" when it did nothing)
                       ir-final.txt           the IR that runs
                       kernels.txt            which kernel runs each node
                       memory-plan.txt        the program's memory plan, which the runtime runs as given
                                              (what goes into its arenas, where, and why the rest does not)
                       placement.txt          what the runtime could place, per op and device
                                              (hb-opt --placement=placement.txt replays this plan)
                       notes.txt              what passes reported (disabled passes, schedules, plans)
"""

from __future__ import annotations

import os


class DumpDirError(OSError):
    """dump_dir (or HINTBACKEND_DUMP_DIR) cannot be written."""


class Dumper:
    def __init__(self, root: str, name: str) -> None:
        self.root = root
        self.dir = os.path.join(root, name)
        try:
            os.makedirs(self.dir, exist_ok=True)
        except OSError as e:
            raise self._error(e) from e

    def write(self, filename: str, text: str) -> None:
        try:
            with open(os.path.join(self.dir, filename), "w") as f:
                f.write(text)
        except OSError as e:
            raise self._error(e) from e

    def _error(self, e: OSError) -> DumpDirError:
        return DumpDirError(
            f"hintbackend: cannot write graph dumps under dump_dir={self.root!r}: {e.strerror or e} "
            f"({e.filename or self.dir}). Give options={{'dump_dir': ...}} (or HINTBACKEND_DUMP_DIR) a folder "
            "you can write, or unset it to turn dumps off.")
