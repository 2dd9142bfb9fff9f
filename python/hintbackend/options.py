"""Validated options for ``torch.compile(model, backend="hintbackend", options={...})``."""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Optional


@dataclasses.dataclass(frozen=True)
class Options:
    #: Raise instead of falling back to eager when a graph has an op hintbackend cannot run.
    strict: bool = False
    #: Write, per compiled graph, the FX code, the JSON sent to C++, the IR after import and after
    #: every pass, and the kernel plan. Also set by HINTBACKEND_DUMP_DIR.
    dump_dir: Optional[str] = None
    #: Pass names to turn off (kill switches for bisecting). Also HINTBACKEND_DISABLE_PASSES=a,b.
    disable_passes: tuple = ()
    #: Verify the IR after every pass (slower compile; tests turn it on). Also HINTBACKEND_VERIFY_EACH_PASS=1.
    verify_each_pass: bool = False

    def core_args(self) -> dict:
        """The keyword arguments of the C++ core's CompiledGraph."""
        return {"disable_passes": list(self.disable_passes), "verify_each_pass": self.verify_each_pass}


_TYPES = {"strict": bool, "dump_dir": (str, os.PathLike, type(None)), "disable_passes": (list, tuple),
          "verify_each_pass": bool}


def parse_options(options: Optional[Mapping[str, Any]]) -> Options:
    """Checks every key and value; an unknown key or a bad value raises naming the valid ones."""
    if options is None:
        options = {}
    if not isinstance(options, Mapping):
        raise TypeError(f"hintbackend: options must be a dict, got {type(options).__name__}")
    valid = sorted(f.name for f in dataclasses.fields(Options))
    values: dict = {}
    for key, value in options.items():
        if key not in _TYPES:
            raise ValueError(f"hintbackend: unknown option {key!r}; valid options are {', '.join(valid)}")
        if not isinstance(value, _TYPES[key]):
            want = {"strict": "a bool", "dump_dir": "a path string or None", "disable_passes": "a list of pass names",
                    "verify_each_pass": "a bool"}[key]
            raise ValueError(f"hintbackend: option {key!r} must be {want}, got {value!r}")
        values[key] = value
    env_dump = os.environ.get("HINTBACKEND_DUMP_DIR")
    if values.get("dump_dir") is None and env_dump:
        values["dump_dir"] = env_dump
    if values.get("dump_dir") is not None:
        values["dump_dir"] = os.fspath(values["dump_dir"])
    disabled = list(values.get("disable_passes", ()))
    disabled += [p for p in os.environ.get("HINTBACKEND_DISABLE_PASSES", "").split(",") if p]
    from . import _core

    known = [name for name, _ in _core().pipeline()]
    for p in disabled:
        if not isinstance(p, str) or p not in known:
            raise ValueError(f"hintbackend: cannot disable unknown pass {p!r}; the passes are {', '.join(known)}")
    values["disable_passes"] = tuple(disabled)
    if os.environ.get("HINTBACKEND_VERIFY_EACH_PASS") == "1":
        values["verify_each_pass"] = True
    return Options(**values)
