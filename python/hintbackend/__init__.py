"""hintbackend: a torch.compile backend that reads the model author's hints.

    model = torch.compile(model, backend="hintbackend", options={"dump_dir": "hb-dumps"})

The backend is registered under the ``torch_dynamo_backends`` entry point, so the string works
without importing this package.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys

__version__ = "0.1.0"
__all__ = ["hintbackend", "hinted_context", "__version__"]


@functools.lru_cache(maxsize=None)
def _core():
    """The C++ extension, loaded on first use (torch must be imported first for its libraries).

    HINTBACKEND_CORE_PATH names another build of it to load instead (a development hook: `.ci/sanitize
    python` runs the Python suite on an AddressSanitizer build this way)."""
    import torch  # noqa: F401

    path = os.environ.get("HINTBACKEND_CORE_PATH")
    if not path:
        return importlib.import_module("hintbackend._C")
    spec = importlib.util.spec_from_file_location("hintbackend._C", path)
    if spec is None or not os.path.isfile(path):
        raise ImportError(f"hintbackend: HINTBACKEND_CORE_PATH={path!r} is not a built extension module")
    module = importlib.util.module_from_spec(spec)
    sys.modules["hintbackend._C"] = module
    spec.loader.exec_module(module)
    return module


def __getattr__(name):
    if name == "hintbackend":
        from .backend import hintbackend

        return hintbackend
    if name == "hinted_context":
        from .hoo import hinted_context

        return hinted_context
    raise AttributeError(f"module 'hintbackend' has no attribute {name!r}")
