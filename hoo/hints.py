"""The hints a hinted_context region carries: validation, normalization and nesting (no torch here).

A region's hints end up, merged with its enclosing regions' hints, under
``node.meta["custom"]["hintbackend"]`` of every ATen node the region covers::

    {"region": 7, "path": [3, 7], "schedule": "dfs", "slices": 8}

``region`` is the region's id, ``path`` the ids from the outermost enclosing region to this one.
Only keys the user gave (here or in an enclosing region) are written. See docs/hints.md.

This module is the one owner of the hint rules: each hint's type, range and spelling, and how hints of
nested regions merge and may not conflict (not both slices and slice_size; memory_budget only with
schedule="auto"). The C++ importer only reads what they produce (types and spellings), and the
hint-propagation pass checks what needs the graph (slice_dims against ranks, a region's nodes agree).
"""

from __future__ import annotations

import re
from typing import Any, Mapping

# The key under node.meta["custom"]; the C++ importer reads custom.hintbackend.
HINTS_KEY = "hintbackend"

SCHEDULES = ("bfs", "dfs", "auto")
KERNELS = ("auto", "cudnn", "fused", "aten")
HINT_NAMES = ("schedule", "slice_dims", "slices", "slice_size", "memory_budget", "kernel", "deterministic")

# Pairs that set the same knob two ways: a region may give one of them, and an inner region's choice
# replaces the outer region's other one when they merge.
_EXCLUSIVE = {"slices": "slice_size", "slice_size": "slices"}

_UNITS = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_BUDGET_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*$")


class HintError(ValueError):
    """A hint the user gave is unknown or has a bad value; the message names it and what is allowed."""


def _quoted(values: tuple[str, ...]) -> str:
    return ", ".join(f'"{v}"' for v in values)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def parse_memory_budget(value: Any) -> int:
    """Bytes from an int or a string like "4GB" (10**9), "512MiB" (2**20), "1.5G" (2**30), "4096"."""
    if _is_int(value):
        if value < 1:
            raise HintError(f"hinted_context: memory_budget={value!r} must be >= 1 byte")
        return value
    if isinstance(value, str):
        m = _BUDGET_RE.match(value)
        if m and m.group(2).lower() in _UNITS:
            nbytes = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
            if nbytes < 1:
                raise HintError(f"hinted_context: memory_budget={value!r} must be >= 1 byte")
            return nbytes
    raise HintError(
        f"hinted_context: memory_budget={value!r} is not a size: give an int (bytes) or a string like "
        f'"4GB", "512MiB", "1.5G" (units: B, KB, MB, GB, TB = powers of 1000; K, M, G, T, KiB, MiB, GiB, '
        f"TiB = powers of 1024)"
    )


def validate_hints(hints: Mapping[str, Any]) -> dict[str, Any]:
    """Checks one region's hints and returns them normalized (memory_budget in bytes, slice_dims a
    list). Raises HintError naming the bad key or value and the allowed ones."""
    out: dict[str, Any] = {}
    for key, value in hints.items():
        if key not in HINT_NAMES:
            raise HintError(f"hinted_context: unknown hint {key!r} (allowed: {', '.join(HINT_NAMES)})")
        if key == "schedule":
            if value not in SCHEDULES:
                raise HintError(f"hinted_context: schedule={value!r} is not one of {_quoted(SCHEDULES)}")
        elif key == "kernel":
            if value not in KERNELS:
                raise HintError(f"hinted_context: kernel={value!r} is not one of {_quoted(KERNELS)}")
        elif key in ("slices", "slice_size"):
            if not _is_int(value) or value < 1:
                raise HintError(f"hinted_context: {key}={value!r} must be an int >= 1")
        elif key == "slice_dims":
            if isinstance(value, int) and not isinstance(value, bool):
                value = [value]
            if not isinstance(value, (list, tuple)) or not all(_is_int(d) and d >= 0 for d in value):
                raise HintError(
                    f"hinted_context: slice_dims={value!r} must be a list of non-negative ints (leading "
                    f"dimensions, e.g. [0, 1] for batch and heads)"
                )
            if len(set(value)) != len(value):
                raise HintError(f"hinted_context: slice_dims={value!r} names a dimension twice")
            value = list(value)
        elif key == "memory_budget":
            value = parse_memory_budget(value)
        elif key == "deterministic":
            if not isinstance(value, bool):
                raise HintError(f"hinted_context: deterministic={value!r} must be True or False")
        out[key] = value
    if "slices" in out and "slice_size" in out:
        raise HintError(
            f"hinted_context: give slices or slice_size, not both (got slices={out['slices']}, "
            f"slice_size={out['slice_size']})"
        )
    if "memory_budget" in out and out.get("schedule") in ("bfs", "dfs"):
        raise HintError(
            f"hinted_context: memory_budget is what schedule=\"auto\" plans against; it does not go with "
            f"schedule={out['schedule']!r} (drop it, or use schedule=\"auto\")"
        )
    return out


def merge_hints(outer: Mapping[str, Any] | None, inner: Mapping[str, Any], region: int) -> dict[str, Any]:
    """The payload for a region nested in `outer` (the enclosing region's payload, or None): inner keys
    override outer ones; an inner slices/slice_size replaces the outer other one; an inner bfs/dfs
    schedule drops an inherited memory_budget."""
    merged: dict[str, Any] = {}
    if outer:
        merged.update((k, v) for k, v in outer.items() if k not in ("region", "path"))
    for key, value in inner.items():
        merged.pop(_EXCLUSIVE.get(key, ""), None)
        merged[key] = value
    if merged.get("schedule") in ("bfs", "dfs") and "schedule" in inner:
        merged.pop("memory_budget", None)
    if merged.get("schedule") in ("bfs", "dfs") and "memory_budget" in inner:
        raise HintError(
            f"hinted_context: memory_budget is what schedule=\"auto\" plans against, and this region "
            f"inherits schedule={merged['schedule']!r} from its enclosing region (add schedule=\"auto\")"
        )
    path = list(outer["path"]) if outer and "path" in outer else []
    return {"region": region, "path": path + [region], **merged}
