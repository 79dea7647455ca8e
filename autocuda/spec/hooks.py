"""Services the spec layer uses but does not own, installed from above (`autocuda/__init__.py` wires them when
autocuda is imported), so that spec/ imports neither the disk cache, nor the code generator, nor CUDA naming facts.

- the parse cache: whether a spec's text parsed before (`parsed_before`), and recording that it did
  (`remember_parsed`): a process whose specs all parsed before never imports sympy;
- reserved names: why a name is taken by a layer above (a kernel argument's key), or None;
- kernel source: the CUDA source of one of a spec's kernels (`NeuronSpec.source`).
Until installed, each does the plain thing: no text parsed before, no name reserved, no generator.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

TextCheck = Callable[[str], bool]
TextRecord = Callable[[str], None]
NameRule = Callable[[str], "str | None"]
SourceMaker = Callable[..., str]


def _never(text: str) -> bool:
    return False


def _forget(text: str) -> None:
    return None


def _no_reservation(name: str) -> str | None:
    return None


def _no_generator(spec: Any, kernel: str, dtype: Any, **options: Any) -> str:
    raise RuntimeError("no kernel generator is installed (autocuda's package import installs it)")


_parsed_before: TextCheck = _never
_remember_parsed: TextRecord = _forget
_reserved_name: NameRule = _no_reservation
_kernel_source: SourceMaker = _no_generator


def set_parse_cache(known: TextCheck, remember: TextRecord) -> None:
    """Install the parse cache: `known(text)` whether a spec of this text parsed before, `remember(text)` after
    one did. Only a hint to skip parsing: a spec's names and structure are checked on every construction."""
    global _parsed_before, _remember_parsed
    _parsed_before, _remember_parsed = known, remember


def set_reserved_names(rule: NameRule) -> None:
    """Install the rule that says why a name is reserved by a layer above (None: it is not)."""
    global _reserved_name
    _reserved_name = rule


def set_kernel_source(maker: SourceMaker) -> None:
    """Install `maker(spec, kernel, dtype, **options)`, the CUDA source of one of a spec's kernels."""
    global _kernel_source
    _kernel_source = maker


def parsed_before(text: str) -> bool:
    return _parsed_before(text)


def remember_parsed(text: str) -> None:
    _remember_parsed(text)


def reserved_name(name: str) -> str | None:
    return _reserved_name(name)


def kernel_source(spec: Any, kernel: str, dtype: Any, **options: Any) -> str:
    return _kernel_source(spec, kernel, dtype, **options)
