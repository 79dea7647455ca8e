"""An optional progress bar: tqdm's when tqdm is installed and stderr is a terminal, otherwise nothing.

`progress(iterable, desc=..., total=...)` returns a tqdm wrapper of the iterable, or the iterable itself (the
very same object) when tqdm is missing, stderr is not a TTY (pipes, CI logs, tests) or `disable=True`.
`AUTOCUDA_PROGRESS=0` turns bars off everywhere, `=1` forces them on a non-terminal stderr (when tqdm is there).
"""
from __future__ import annotations

import os
import sys
from collections.abc import Iterable
from typing import Any, TypeVar

__all__ = ["progress", "enabled"]

T = TypeVar("T")

# AUTOCUDA_PROGRESS -> whether bars are shown (None: when stderr is a terminal)
_SETTING = {"0": False, "false": False, "off": False, "1": True, "true": True, "on": True, "": None}


def enabled() -> bool:
    """Whether `progress` draws a bar: tqdm installed, and the setting (or stderr being a TTY) allows it."""
    setting = os.environ.get("AUTOCUDA_PROGRESS", "").strip().lower()
    if setting not in _SETTING:
        raise ValueError(f"AUTOCUDA_PROGRESS: expected 0 or 1 (or unset), got {setting!r}")
    wanted = _SETTING[setting]
    if wanted is None:
        wanted = bool(getattr(sys.stderr, "isatty", lambda: False)())
    return wanted and _tqdm() is not None


def _tqdm() -> Any:
    """tqdm's class, or None when tqdm is not installed (imported only once a bar is wanted)."""
    try:
        from tqdm import tqdm  # type: ignore[import-untyped]
    except ImportError:
        return None
    return tqdm


def progress(iterable: Iterable[T], desc: str | None = None, total: int | None = None,
             disable: bool = False, **options: object) -> Iterable[T]:
    """`iterable` with a progress bar on stderr when one can be shown (see the module's docstring), else
    `iterable` unchanged. `options` go to tqdm (e.g. `leave=False`, `unit="spec"`)."""
    if disable or not enabled():
        return iterable
    return _tqdm()(iterable, desc=desc, total=total, file=sys.stderr, **options)
