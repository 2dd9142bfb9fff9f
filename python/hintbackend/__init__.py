"""hintbackend: a torch.compile backend that reads the model author's hints.

    model = torch.compile(model, backend="hintbackend", options={"dump_dir": "hb-dumps"})

The backend is registered under the ``torch_dynamo_backends`` entry point, so the string works
without importing this package.
"""

from __future__ import annotations

import functools
import importlib

__version__ = "0.1.0"
__all__ = ["hintbackend", "hinted_context", "__version__"]


@functools.lru_cache(maxsize=None)
def _core():
    """The C++ extension, loaded on first use (torch must be imported first for its libraries)."""
    import torch  # noqa: F401

    return importlib.import_module("hintbackend._C")


def __getattr__(name):
    if name == "hintbackend":
        from .backend import hintbackend

        return hintbackend
    if name == "hinted_context":
        from .hoo import hinted_context

        return hinted_context
    raise AttributeError(f"module 'hintbackend' has no attribute {name!r}")
