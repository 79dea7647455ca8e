"""Neuron specs: the declarative description (model), its expression language (parse), torch evaluation.

`model` is imported lazily: it needs `autocuda.surrogate`, which itself needs `parse` from this package, so an
eager import here would make `import autocuda.surrogate` circular.
"""
from __future__ import annotations

import importlib
from typing import Any

from .parse import check_identifier, parse_expression
from .torch_eval import evaluate

_MODEL_NAMES = ("NeuronSpec", "Param", "State", "ParsedSpec", "load_spec", "list_specs", "spec_from_toml")

__all__ = ["check_identifier", "parse_expression", "evaluate", *_MODEL_NAMES]


def __getattr__(name: str) -> Any:
    if name in _MODEL_NAMES:
        return getattr(importlib.import_module(".model", __name__), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
