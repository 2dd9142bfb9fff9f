"""hintbackend.hoo: the hinted_context region (context manager, decorator, higher-order op).

from hintbackend import hinted_context; see docs/hints.md.
"""

from .hinted_context import hinted_context, hinted_context_op
from .hints import HINT_NAMES, HINTS_KEY, HintError, merge_hints, parse_memory_budget, validate_hints

__all__ = [
    "HINT_NAMES",
    "HINTS_KEY",
    "HintError",
    "hinted_context",
    "hinted_context_op",
    "merge_hints",
    "parse_memory_budget",
    "validate_hints",
]
