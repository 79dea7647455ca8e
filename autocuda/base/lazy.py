"""Modules imported on their first use, not when autocuda is imported.

sympy is slow to import. Only parsing, deriving and rendering need it, and a process whose kernels
are all in the disk cache does none of them. Modules on the path of every call bind it through `lazy_import`;
the derive and print stages, which always need it, import it as usual.
"""
from __future__ import annotations

import importlib
from collections.abc import Iterable, Mapping
from typing import Any


class lazy_import:  # noqa: N801 - stands in for a module name
    """Module `name`, imported on the first attribute access. Not a module object and not in sys.modules:
    torch (and `inspect`) walk sys.modules touching every module's attributes, which would import it at once."""

    def __init__(self, name: str):
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        return getattr(importlib.import_module(self._name), attr)

    def __repr__(self) -> str:
        return f"<lazily imported module {self._name!r}>"


def exported(package: str, homes: Mapping[str, str], name: str, submodules: Iterable[str] = ()) -> Any:
    """A package's public `name` for its module `__getattr__` (PEP 562): imported on first use from the module
    `homes` names (relative to `package`), or one of its `submodules` itself; AttributeError for anything else."""
    if name in homes:
        return getattr(importlib.import_module(homes[name], package), name)
    if name in submodules:
        return importlib.import_module(f".{name}", package)
    raise AttributeError(f"module {package!r} has no attribute {name!r}")
