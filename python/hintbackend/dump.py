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


class Dumper:
    def __init__(self, root: str, name: str) -> None:
        self.dir = os.path.join(root, name)
        os.makedirs(self.dir, exist_ok=True)

    def write(self, filename: str, text: str) -> None:
        with open(os.path.join(self.dir, filename), "w") as f:
            f.write(text)
