"""The attention shape the issues' anchor numbers use (B4 H16 S4096 D128), as the command-line options
--b --h --s [--d] the attention benchmarks share."""

from __future__ import annotations

import argparse


def add_shape_args(p: argparse.ArgumentParser, head_dim: bool = True) -> None:
    p.add_argument("--b", type=int, default=4, help="batch")
    p.add_argument("--h", type=int, default=16, help="heads")
    p.add_argument("--s", type=int, default=4096, help="sequence length")
    if head_dim:
        p.add_argument("--d", type=int, default=128, help="head dim")
