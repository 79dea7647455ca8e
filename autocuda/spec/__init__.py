"""Neuron specs: the declarative description (model), read from text and files (load), its expression language
(parse), its sympy form (parsed), torch evaluation.

Names are imported on first use: `parse` and `torch_eval` need sympy, which a process running only cached
kernels never imports, and `model` needs `autocuda.surrogate`, which itself needs this package.
"""
from __future__ import annotations

from typing import Any

from ..base.lazy import exported

_HOMES = {"check_identifier": ".parse", "parse_expression": ".parse", "evaluate": ".torch_eval",
          "ParsedSpec": ".parsed",
          **dict.fromkeys(("NeuronSpec", "Param", "State"), ".model"),
          **dict.fromkeys(("load_spec", "list_specs", "spec_from_toml"), ".load")}

__all__ = list(_HOMES)


def __getattr__(name: str) -> Any:
    return exported(__name__, _HOMES, name)
