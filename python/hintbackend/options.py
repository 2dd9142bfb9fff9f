"""Validated options for ``torch.compile(model, backend="hintbackend", options={...})``.

The one place settings are read: the options dict and the HINTBACKEND_* environment variables are
checked here, once per compile, and handed to the C++ core as values (``core_settings``); nothing
below reads the environment.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Mapping, Optional, Sequence


#: Choices the training partition makes on AOTAutograd's joint graph (partition.py), turned off by name like
#: the C++ passes (disable_passes, HINTBACKEND_DISABLE_PASSES): the loss's rewrite before min-cut, and min-cut
#: recomputing cheap ops whose values the backward materializes anyway.
PARTITION_PASSES = ("save-logsumexp", "recompute-materialized")

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
    #: Place intermediates in the memory plan's arena (False: every op allocates its own result, as
    #: eager does). Also HINTBACKEND_ARENA=0/1.
    arena: bool = True
    #: Let an elementwise result take over a dying input's buffer. Also HINTBACKEND_MEMORY_PLAN_IN_PLACE=0/1.
    memory_plan_in_place: bool = True
    #: Make the views a graph reads only inside itself (view, t, permute, slice at a constant position ...)
    #: as aliases of their input without a dispatcher call (backend/runtime/ViewCall.cpp); False: every
    #: view through ATen's dispatcher, for bisecting an aliasing bug. Also HINTBACKEND_FAST_VIEWS=0/1.
    fast_views: bool = True
    #: Force one placement strategy ("greedy-by-size" or "best-fit"); "" keeps the better of both.
    #: Also HINTBACKEND_MEMORY_PLAN_STRATEGY.
    memory_plan_strategy: str = ""
    #: Training only: the partition that decides what the forward saves for the backward in graphs with no
    #: dfs/auto region. "min-cut": torch's min_cut_rematerialization_partition (Inductor's: saves less and
    #: recomputes cheap pointwise ops in the backward; on the H200 it lowered HF Llama's training peak from
    #: 2108 to 1968 MiB and its step from 13.4 to 10.8 ms, docs/memory.md); "default": torch's
    #: default_partition (saves what the backward reads). Also HINTBACKEND_PARTITION.
    partition: str = "min-cut"
    #: Record each compiled graph's launches in a CUDA graph and replay it (torch's cudagraph trees, as
    #: Inductor's mode="reduce-overhead" does), where shapes are static and every op runs on one GPU;
    #: other graphs run as usual with a logged reason. mode="reduce-overhead" sets it.
    #: Also HINTBACKEND_CUDA_GRAPHS=0/1.
    cuda_graphs: bool = False
    #: Where generated kernels are cached across processes (<cache_dir>/kernels, keyed by source, compiler
    #: and CPU). Also HINTBACKEND_CACHE_DIR; default ~/.cache/hintbackend (XDG_CACHE_HOME respected).
    cache_dir: Optional[str] = None
    #: Keep compiled graphs across processes: torch's AOTAutograd cache stores each backend call's result
    #: in <cache_dir>/aotautograd, keyed by the graph, the options, the hints and the versions, and a later
    #: process loads it instead of running AOTAutograd and the passes (compile_cache.py). Also
    #: HINTBACKEND_COMPILE_CACHE=0/1.
    compile_cache: bool = True
    #: Run a training graph with no input mutation, aliased output, tensor subclass, functionalized RNG or
    #: saved SymInt in hintbackend's own autograd.Function instead of AOTAutograd's runtime wrappers
    #: (lean_runtime.py; less host time a step). Also HINTBACKEND_LEAN_RUNTIME=0/1.
    lean_runtime: bool = True
    #: The C++ compiler that builds generated CPU kernels (FlexAttention's kernel="fused"), as a command
    #: ("c++", "ccache g++"); "" turns generated CPU kernels off (the reference runs instead). Also
    #: HINTBACKEND_HOST_COMPILER; default $CXX, else the first of c++, g++, clang++ on PATH.
    host_compiler: Optional[str] = None
    #: The CUDA compiler that builds generated CUDA kernels (FlexAttention's kernel="fused" on CUDA, and
    #: the default where cuDNN cannot run a flex node); "" turns them off. Also HINTBACKEND_NVCC; default
    #: nvcc on PATH, else $CUDA_HOME/bin/nvcc, else /usr/local/cuda/bin/nvcc.
    nvcc: Optional[str] = None
    #: The folder holding CUTLASS's cute/ and cutlass/ headers, which the CUDA kernels are written with.
    #: Also HINTBACKEND_CUTLASS_INCLUDE; default: the nvidia-cutlass wheel's cutlass_library/source/include.
    cutlass_include: Optional[str] = None

    def core_settings(self, dump: Optional[bool] = None, zero_inputs: Sequence[str] = (),
                      input_writes: Sequence[str] = ()) -> Any:
        """The C++ core's CompileSettings for these options (`dump`: print the IR after every pass and
        the plans; default: when dump_dir is set; `zero_inputs`: placeholders the caller passes as zeros,
        fold-zero-inputs, the lean runtime's undefined gradients; `input_writes`: the placeholders the
        graph's first outputs are written back into, in order, write-inputs-in-place)."""
        from . import _core

        s = _core().CompileSettings()
        s.disable_passes = [p for p in self.disable_passes if p not in PARTITION_PASSES]
        s.zero_inputs = list(zero_inputs)
        s.input_writes = list(input_writes)
        s.verify_each_pass = self.verify_each_pass
        s.arena = self.arena
        s.memory_plan_in_place = self.memory_plan_in_place
        s.fast_views = self.fast_views
        s.keep_across_calls = not self.cuda_graphs  # a kept value would sit in the CUDA graphs' pool untracked
        s.memory_plan_strategy = self.memory_plan_strategy
        s.dump = self.dump_dir is not None if dump is None else dump
        s.host_compiler = self.host_compiler or ""
        s.cache_dir = self.cache_dir or ""
        s.nvcc = self.nvcc or ""
        s.cutlass_include = self.cutlass_include or ""
        s.cuda_arch = cuda_arch() if s.nvcc else ""
        s.cuda_smem_per_block = cuda_smem_per_block() if s.cuda_arch else 0
        return s


_TYPES = {"strict": bool, "dump_dir": (str, os.PathLike, type(None)), "disable_passes": (list, tuple),
          "verify_each_pass": bool, "arena": bool, "memory_plan_in_place": bool, "fast_views": bool,
          "memory_plan_strategy": str,
          "partition": str, "cuda_graphs": bool, "cache_dir": (str, os.PathLike, type(None)), "compile_cache": bool,
          "lean_runtime": bool,
          "host_compiler": (str, type(None)), "nvcc": (str, type(None)),
          "cutlass_include": (str, os.PathLike, type(None))}
_WANT = {"strict": "a bool", "dump_dir": "a path string or None", "disable_passes": "a list of pass names",
         "verify_each_pass": "a bool", "arena": "a bool", "memory_plan_in_place": "a bool", "fast_views": "a bool",
         "memory_plan_strategy": 'one of "", "greedy-by-size", "best-fit"',
         "partition": 'one of "default", "min-cut"', "cuda_graphs": "a bool",
         "cache_dir": "a path string or None", "compile_cache": "a bool", "lean_runtime": "a bool",
         "host_compiler": 'a compiler command ("c++"), "" (off) or None',
         "nvcc": 'the nvcc command, "" (off) or None', "cutlass_include": "a path string or None"}
STRATEGIES = ("", "greedy-by-size", "best-fit")
PARTITIONS = ("default", "min-cut")
# Options whose value is one of a few strings.
_CHOICES = {"memory_plan_strategy": STRATEGIES, "partition": PARTITIONS}
# Settings the environment may give: variable -> option (booleans as 0/1, choices by name).
_ENV_BOOLS = {"HINTBACKEND_ARENA": "arena", "HINTBACKEND_MEMORY_PLAN_IN_PLACE": "memory_plan_in_place",
              "HINTBACKEND_FAST_VIEWS": "fast_views",
              "HINTBACKEND_VERIFY_EACH_PASS": "verify_each_pass", "HINTBACKEND_CUDA_GRAPHS": "cuda_graphs",
              "HINTBACKEND_COMPILE_CACHE": "compile_cache", "HINTBACKEND_LEAN_RUNTIME": "lean_runtime"}
_ENV_CHOICES = {"HINTBACKEND_MEMORY_PLAN_STRATEGY": "memory_plan_strategy", "HINTBACKEND_PARTITION": "partition"}


def _env_bool(name: str) -> Optional[bool]:
    value = os.environ.get(name)
    if value is None or value == "":
        return None
    if value not in ("0", "1"):
        raise ValueError(f"hintbackend: environment variable {name}={value!r} must be 0 or 1")
    return value == "1"


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
        if not isinstance(value, _TYPES[key]) or (key in _CHOICES and value not in _CHOICES[key]):
            raise ValueError(f"hintbackend: option {key!r} must be {_WANT[key]}, got {value!r}")
        values[key] = value
    env_dump = os.environ.get("HINTBACKEND_DUMP_DIR")
    if values.get("dump_dir") is None and env_dump:
        values["dump_dir"] = env_dump
    if values.get("dump_dir") is not None:
        values["dump_dir"] = os.fspath(values["dump_dir"])
    disabled = list(values.get("disable_passes", ()))
    disabled += [p for p in os.environ.get("HINTBACKEND_DISABLE_PASSES", "").split(",") if p]
    from . import _core

    known = [name for name, _ in _core().pipeline()] + list(PARTITION_PASSES)
    for p in disabled:
        if not isinstance(p, str) or p not in known:
            raise ValueError(f"hintbackend: cannot disable unknown pass {p!r}; the passes are {', '.join(known)}")
    values["disable_passes"] = tuple(disabled)
    # The environment fills what the options dict leaves unset (verify_each_pass: either turns it on).
    for name, key in _ENV_BOOLS.items():
        env = _env_bool(name)
        if env is not None and (key not in values or (key == "verify_each_pass" and env)):
            values[key] = env
    for name, key in _ENV_CHOICES.items():
        value = os.environ.get(name, "")
        if value and value not in _CHOICES[key]:
            raise ValueError(f"hintbackend: environment variable {name}={value!r} must be one of "
                             f"{', '.join(repr(x) for x in _CHOICES[key] if x)} (or unset)")
        if value and key not in values:
            values[key] = value
    if values.get("cache_dir") is None:
        values["cache_dir"] = os.environ.get("HINTBACKEND_CACHE_DIR") or default_cache_dir()
    values["cache_dir"] = os.fspath(values["cache_dir"])
    if values.get("host_compiler") is None:
        env = os.environ.get("HINTBACKEND_HOST_COMPILER")
        values["host_compiler"] = env if env is not None else default_host_compiler()
    if values.get("nvcc") is None:
        env = os.environ.get("HINTBACKEND_NVCC")
        values["nvcc"] = env if env is not None else default_nvcc()
    if values.get("cutlass_include") is None:
        values["cutlass_include"] = os.environ.get("HINTBACKEND_CUTLASS_INCLUDE") or default_cutlass_include()
    values["cutlass_include"] = os.fspath(values["cutlass_include"])
    return Options(**values)


def default_cache_dir() -> str:
    """~/.cache/hintbackend, under $XDG_CACHE_HOME when it is set."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "hintbackend")


def default_host_compiler() -> str:
    """$CXX, else the first C++ compiler on PATH, else "" (no generated CPU kernels)."""
    import shutil

    cxx = os.environ.get("CXX", "").strip()
    if cxx:
        return cxx
    for name in ("c++", "g++", "clang++"):
        if shutil.which(name):
            return name
    return ""


def default_nvcc() -> str:
    """nvcc on PATH, else under $CUDA_HOME or /usr/local/cuda, else "" (no generated CUDA kernels)."""
    import shutil

    found = shutil.which("nvcc")
    if found:
        return found
    for home in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"):
        path = os.path.join(home, "bin", "nvcc") if home else ""
        if path and os.access(path, os.X_OK):
            return path
    return ""


def default_cutlass_include() -> str:
    """The nvidia-cutlass wheel's header folder (cutlass_library/source/include), or ""."""
    import importlib.util

    try:
        spec = importlib.util.find_spec("cutlass_library")
    except (ImportError, ValueError):
        return ""
    for root in (spec.submodule_search_locations or []) if spec else []:
        path = os.path.join(root, "source", "include")
        if os.path.isfile(os.path.join(path, "cute", "arch", "mma_sm80.hpp")):
            return path
    return ""


def cuda_smem_per_block() -> int:
    """The current CUDA device's shared memory per block with opt-in, in bytes (0 without a GPU): kernel
    selection keeps generated kernels that need more off it."""
    import torch

    if not torch.cuda.is_available():
        return 0
    return int(torch.cuda.get_device_properties(torch.cuda.current_device()).shared_memory_per_block_optin)


def cuda_arch() -> str:
    """The current CUDA device's compute capability as nvcc spells it ("90"), or "" without a GPU."""
    import torch

    if not torch.cuda.is_available():
        return ""
    major, minor = torch.cuda.get_device_capability()
    return f"{major}{minor}" if major >= 8 else ""  # the kernels use sm_80's mma.sync and cp.async
