"""The compile cache: a second process loads the compiled graphs instead of tracing AOTAutograd again.

hintbackend does not store graphs itself. It hands AOTAutograd compilers whose results are
`OutputCode` (torch's interface for a serializable compiled graph, `HintOutputCode` below), so
torch's AOTAutogradCache in its bundled mode saves the whole AOT result (the partitioned forward and
backward, AOTAutograd's runtime wrappers and metadata, and our compiled graphs) and a later process
with the same Dynamo graph skips AOTAutograd's tracing, partitioning and our compile.

What an entry holds of ours is the input to our compile, not its output: the graph's JSON document,
its constants and the FX text (for dumps). Loading recompiles the C++ plan from them (about 20 ms a
graph); generated kernels come from the kernel cache. The entry is keyed by AOTAutograd's own key
(the Dynamo graph, the inputs' metadata, torch's version and configs) and, through
`torch.compiler.config.cache_key_tag`, by `signature()`: hintbackend's build (a hash of the installed
package and its C++ extension), the options, the hints the Dynamo graph carries in node metadata
(`hinted_context`'s context-manager and decorator forms: torch's key does not see node metadata),
the CUDA/cuDNN versions and the GPUs. A stale entry (another build, other options or hints) is
therefore never found. Our part of an entry carries a SHA-256 of its payload, checked when it is
unpickled: a corrupt entry fails to load, which torch's cache treats as absent (it logs a warning,
compiles and writes a fresh entry).

Entries live in `<cache_dir>/aotautograd` (`cache_dir`: the option, default ~/.cache/hintbackend):
AOTAutogradCache writes below torch's cache folder (`TORCHINDUCTOR_CACHE_DIR`), which is pointed at
`cache_dir` while our backend runs (Dynamo compiles one frame at a time). Writers go through torch's
`write_atomic` (a temporary file renamed into place), so concurrent processes are safe.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import hashlib
import json
import logging
import os
import pickle
from typing import Any, Callable, Iterator, List, Optional, Sequence

import torch
import torch._functorch.config as functorch_config
import torch._inductor.config as inductor_config
from torch._inductor.output_code import OutputCode

from .options import Options

log = logging.getLogger("hintbackend")

# Bump when what an entry holds or how it is loaded changes.
FORMAT = "hintbackend-compile-cache-1"


@functools.lru_cache(maxsize=None)
def _build_id() -> str:
    """A hash of the installed package: its Python files and its C++ extension (a rebuilt core or an
    edited partition makes every older entry stale)."""
    from . import __version__, _core

    h = hashlib.sha256(f"{FORMAT} {__version__}".encode())
    paths = []
    root = os.path.dirname(os.path.abspath(__file__))
    for folder, _, files in os.walk(root):
        paths += [os.path.join(folder, f) for f in files if f.endswith((".py", ".so", ".json"))]
    core = getattr(_core(), "__file__", None)
    if core and os.path.abspath(core) not in paths:
        paths.append(os.path.abspath(core))
    for path in sorted(paths):
        h.update(os.path.relpath(path, root).encode())
        with open(path, "rb") as f:
            h.update(hashlib.sha256(f.read()).digest())
    return h.hexdigest()


@functools.lru_cache(maxsize=None)
def _platform() -> str:
    """Versions and devices a compiled plan depends on beyond what torch's key has."""
    parts = [f"torch {torch.__version__}", f"cuda {torch.version.cuda}"]
    if torch.backends.cudnn.is_available():
        parts.append(f"cudnn {torch.backends.cudnn.version()}")
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            p = torch.cuda.get_device_properties(i)
            parts.append(f"gpu{i} {p.name} sm{p.major}{p.minor}")
    return "; ".join(parts)


def graph_hints(gm: torch.fx.GraphModule) -> List[Any]:
    """The hints a Dynamo graph carries in node metadata (meta["custom"]), in node order, over the
    graph and its subgraphs; AOTAutograd's key reads the graph's code, which leaves them out."""
    hints = []
    for prefix, module in gm.named_modules():
        if not isinstance(module, torch.fx.GraphModule):
            continue
        for i, node in enumerate(module.graph.nodes):
            custom = node.meta.get("custom")
            if custom:
                hints.append([prefix, i, node.name, custom])
    return hints


def signature(opts: Options, gm: torch.fx.GraphModule) -> str:
    """What an entry must match beyond AOTAutograd's own key (module docstring)."""
    settings = {k: v for k, v in dataclasses.asdict(opts).items() if k not in ("dump_dir", "compile_cache")}
    text = json.dumps({"build": _build_id(), "platform": _platform(), "options": settings,
                       "hints": graph_hints(gm)}, sort_keys=True, default=repr)
    return hashlib.sha256(text.encode()).hexdigest()


class CacheBypass(Exception):
    """Why a compiled graph is not stored (raised while torch prepares the entry; torch logs a bypass)."""


@dataclasses.dataclass
class _Current:
    """The compile in progress in this process: what a loaded entry is rebuilt with."""
    opts: Options
    build: Callable[..., Callable]  # (kind, payload) -> boxed callable
    loaded: List[str]  # graphs loaded from the cache (their kinds)
    fallbacks: List[str] = dataclasses.field(default_factory=list)  # graphs compiled here that cannot be stored,
    # each "kind: why" (HintOutputCode.reason)


_current: List[_Current] = []


class HintOutputCode(OutputCode):
    """One compiled graph as AOTAutograd's cache stores it (see the module docstring).

    `payload`: what our compile needs to rebuild the graph (name, document, constants, FX text, FX node
    count); None when the graph cannot be stored (it runs in eager: the fallback keeps the GraphModule)."""

    def __init__(self, kind: str, fn: Callable, payload: Optional[dict], opts: Options, reason: str = "") -> None:
        super().__init__()
        self.kind = kind
        self.opts = opts
        self.build_id = _build_id()
        self.payload = payload
        self.reason = reason
        if payload is None and _current:
            _current[-1].fallbacks.append(f"{kind}: {reason}")
        self._fn: Optional[Callable] = fn
        self._boxed_call = True

    @property
    def hintbackend_graph(self) -> Any:
        return getattr(self._fn, "hintbackend_graph", None)

    def __call__(self, inputs: List[Any]) -> Any:
        assert self._fn is not None, "hintbackend: a cached graph was called before it was loaded"
        return self._fn(inputs)

    # --- saving: torch copies this object (shallow), calls prepare_for_serialization, pickles it ---
    def prepare_for_serialization(self) -> None:
        if self.payload is None:
            raise _bypass(self.reason)
        self._fn = None

    def __getstate__(self) -> dict:  # pickling (and torch's copy before it): no callable, a checksum
        state = dict(self.__dict__)
        state["_fn"] = None
        state["_checksum"] = _digest(self.kind, self.payload, self.opts, self.build_id)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        if self._checksum != _digest(self.kind, self.payload, self.opts, self.build_id):
            raise pickle.UnpicklingError("hintbackend: corrupt compile cache entry (checksum mismatch)")

    # --- loading: torch unpickles the entry and calls post_compile before the first run ---
    def post_compile(self, example_inputs: Sequence[Any], constants: Any, graph_kwargs: Any) -> None:
        if self._fn is not None:
            return
        current = _current[-1] if _current else None
        if current is not None:
            self._fn = current.build(self.kind, self.payload)
            current.loaded.append(self.kind)
            return
        # Loaded outside a backend call (Dynamo's precompile cache installs a saved backend): rebuild with
        # the options it was compiled with, after checking it matches this build.
        if self.build_id != _build_id():
            raise RuntimeError("hintbackend: a compile cache entry from another hintbackend build")
        from .backend import rebuild

        self._fn = rebuild(self.kind, self.payload, self.opts)
        log.info("compile cache: %s loaded by Dynamo's precompile cache", self.kind)
        if self.opts.cuda_graphs:  # the lean runtime's pair, which replays, is made by a backend call
            log.warning("compile cache: %s loaded by Dynamo's precompile cache runs without CUDA graphs", self.kind)

    def set_triton_bundle(self, triton_bundle: Any) -> None:
        pass


def _digest(kind: str, payload: Optional[dict], opts: Options, build_id: str) -> str:
    h = hashlib.sha256(f"{FORMAT} {kind} {build_id} {opts!r}".encode())
    if payload is not None:
        h.update(json.dumps({k: v for k, v in payload.items() if k != "constants"}, sort_keys=True).encode())
        for t in payload["constants"]:
            h.update(repr((t.dtype, tuple(t.shape), tuple(t.stride()), t.device.type)).encode())
            h.update(t.detach().cpu().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
                     if t.numel() else b"")
    return h.hexdigest()


def _bypass(reason: str) -> Exception:
    from torch._functorch._aot_autograd.autograd_cache import BypassAOTAutogradCache

    return BypassAOTAutogradCache(f"hintbackend: {reason}")


def unavailable(opts: Options) -> str:
    """Why torch's AOTAutograd cache will not store our graphs in this process, or ""."""
    if not opts.compile_cache:
        return "option compile_cache is off"
    if torch.compiler.config.force_disable_caches:
        return "torch.compiler.config.force_disable_caches is set"
    if not functorch_config.enable_autograd_cache:
        return "torch's AOTAutograd cache is off (TORCHINDUCTOR_AUTOGRAD_CACHE=0)"
    if not inductor_config.fx_graph_cache:
        return "torch's FX graph cache is off (TORCHINDUCTOR_FX_GRAPH_CACHE=0), which AOTAutograd's cache requires"
    return ""


def _load_dynamo_guards_outside_a_trace() -> None:
    """Lets torch's Dynamo cache (``torch._dynamo.config.caching_precompile``, TORCH_CACHING_PRECOMPILE=1)
    reload a model whose traced code touched pytree, as FlexAttention's does, so a second process skips
    Dynamo's tracing too (docs/debugging.md, "Compile cache").

    torch 2.11 pickles a Dynamo entry's guard sources; unpickling an ``ImportSource`` (the guard on
    ``torch.utils._pytree.SUPPORTED_NODES``) runs its ``__post_init__``, which installs a guard into the
    current trace, and outside one raises "TracingContext.get() must be called within an ongoing trace"
    (then Dynamo's fallback asserts the package is not initialized yet). The entry's guards are the
    pickled ones; that install is a side effect the load does not need. So, while no trace is active,
    the unpickling runs inside a throwaway TracingContext whose guards are dropped. Installed when
    hintbackend is imported (the backend's entry point), before Dynamo looks an entry up."""
    try:
        import torch._dynamo.package as package
        from torch._guards import TracingContext, tracing
    except ImportError:  # a torch without Dynamo's package cache: nothing to fix
        return
    load = getattr(package, "load_guards_state", None)
    if load is None or getattr(load, "_hintbackend_outside_trace", False):
        return

    @functools.wraps(load)
    def load_guards_state(guards_state: bytes) -> Any:
        if TracingContext.try_get() is not None:
            return load(guards_state)
        with tracing(TracingContext(None)):
            return load(guards_state)

    load_guards_state._hintbackend_outside_trace = True  # type: ignore[attr-defined]
    package.load_guards_state = load_guards_state


_load_dynamo_guards_outside_a_trace()


def _pickle_dynamo_sources_by_their_init_fields() -> None:
    """The other torch 2.11 bug on the Dynamo cache's load path (seen on the GPU machine, where the demo's
    traced code guards a function's defaults): `dataclass_with_cached_hash` (torch/_guards.py) pickles a
    guard source as its class called with every dataclass field, including fields computed in
    `__post_init__` (`init=False`), so unpickling `DefaultsSource` raises "__init__() takes from 3 to 4
    positional arguments but 6 were given" and the second process fails. For the source classes that have
    such fields, the reduction passes the constructor's fields only (`__post_init__` recomputes the rest).
    Entries written before this ran keep the old form and fail to load: delete them."""
    try:
        from torch._dynamo import source as sources
    except ImportError:
        return

    def __reduce__(self: Any) -> Any:
        return (self.__class__, tuple(getattr(self, f.name) for f in dataclasses.fields(self) if f.init))

    for cls in list(vars(sources).values()):
        if (isinstance(cls, type) and issubclass(cls, sources.Source) and dataclasses.is_dataclass(cls)
                and "__reduce__" in vars(cls) and any(not f.init for f in dataclasses.fields(cls))):
            cls.__reduce__ = __reduce__


_pickle_dynamo_sources_by_their_init_fields()


@contextlib.contextmanager
def _without_inductor_codegen_import() -> Iterator[None]:
    """AOTAutogradCache's key (FxGraphHashDetails in torch/_inductor/codecache.py) calls Inductor's
    init_backend_registration, which imports Inductor's code generators (about 0.5 s of a process's
    first compile, on a cache hit as on a miss), to hash the custom passes of registered Inductor device
    backends. Our entries depend on no Inductor code generator: while our backend call runs, and only
    if none is registered yet, the registration is skipped, so the key hashes the empty registry, the
    same in every process that has not used Inductor (one that has keeps its own, consistent, key: at
    worst a miss, never a wrong hit). Inductor registers them itself when it compiles."""
    from torch._inductor import codecache
    from torch._inductor.codegen import common

    if common.custom_backend_passes or common.device_codegens:
        yield
        return
    saved = codecache.init_backend_registration
    codecache.init_backend_registration = lambda: None
    try:
        yield
    finally:
        codecache.init_backend_registration = saved


@contextlib.contextmanager
def caching(opts: Options, gm: torch.fx.GraphModule, build: Callable[..., Callable]) -> Iterator[_Current]:
    """Runs one backend call (aot_autograd) with torch's AOTAutograd cache storing our graphs:
    bundled entries, the backward compiled with the forward (so the entry is written here, not at the
    first backward), our signature in the key, and entries below `<cache_dir>`."""
    from torch._dynamo.utils import counters

    tag = torch.compiler.config.cache_key_tag
    tag = f"{tag}|hintbackend:{signature(opts, gm)}" if tag else f"hintbackend:{signature(opts, gm)}"
    current = _Current(opts, build, [])
    before = dict(counters["aot_autograd"])
    saved_env = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = opts.cache_dir
    _current.append(current)
    try:
        with functorch_config.patch(bundled_autograd_cache=True, force_non_lazy_backward_lowering=True), \
                torch.compiler.config.patch(cache_key_tag=tag), _without_inductor_codegen_import():
            yield current
    finally:
        _current.pop()
        if saved_env is None:
            os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
        else:
            os.environ["TORCHINDUCTOR_CACHE_DIR"] = saved_env
    delta = {k: counters["aot_autograd"][k] - before.get(k, 0)
             for k in ("autograd_cache_hit", "autograd_cache_miss", "autograd_cache_bypass", "autograd_cache_saved")}
    where = os.path.join(opts.cache_dir, "aotautograd")
    why = ('torch\'s AOTAutograd cache bypassed it; TORCH_LOGS="+torch._functorch._aot_autograd.autograd_cache" '
           'says why')
    if current.fallbacks:
        why = "; ".join(current.fallbacks)
    if delta["autograd_cache_hit"]:
        log.info("compile cache hit: %s loaded from %s (AOTAutograd and the passes skipped)",
                 " and ".join(current.loaded) or "graph", where)
    elif delta["autograd_cache_saved"]:
        log.info("compile cache miss: compiled and stored in %s", where)
    elif delta["autograd_cache_miss"]:
        log.info("compile cache miss: compiled, not stored: %s", why)
    elif delta["autograd_cache_bypass"]:
        log.info("compile cache not used: %s", why)
