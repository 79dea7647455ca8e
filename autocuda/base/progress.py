"""Progress bars for work that takes more than a couple of seconds (`check`, `tour`, `bench`, tuning).

`progress(iterable, desc=..., total=...)` yields the same items and draws a bar on stderr: tqdm's when tqdm is
installed, else a plain one. No bar, and the very same iterable back, when stderr is not a terminal (pipes, CI
logs, tests) or `disable=True`. `AUTOCUDA_PROGRESS=0` turns bars off everywhere, `=1` forces them on a
non-terminal stderr.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

__all__ = ["progress", "enabled", "uses_tqdm"]

T = TypeVar("T")

# AUTOCUDA_PROGRESS -> whether bars are shown (None: when stderr is a terminal)
_SETTING = {"0": False, "false": False, "off": False, "1": True, "true": True, "on": True, "": None}
PLAIN_WIDTH = 30  # characters of the plain bar


def enabled() -> bool:
    """Whether `progress` draws a bar: the setting, or else stderr being a terminal."""
    setting = os.environ.get("AUTOCUDA_PROGRESS", "").strip().lower()
    if setting not in _SETTING:
        raise ValueError(f"AUTOCUDA_PROGRESS: expected 0 or 1 (or unset), got {setting!r}")
    wanted = _SETTING[setting]
    return bool(getattr(sys.stderr, "isatty", lambda: False)()) if wanted is None else wanted


def uses_tqdm() -> bool:
    """Whether bars are tqdm's (installed) rather than the plain one."""
    return _tqdm() is not None


def _tqdm() -> Any:
    """tqdm's class, or None when tqdm is not installed (imported only once a bar is wanted)."""
    try:
        from tqdm import tqdm  # type: ignore[import-untyped]
    except ImportError:
        return None
    return tqdm


def progress(iterable: Iterable[T], desc: str | None = None, total: int | None = None,
             disable: bool = False, **options: Any) -> Iterable[T]:
    """`iterable` with a progress bar on stderr when one can be shown (see the module's docstring), else
    `iterable` unchanged. `options` go to tqdm (e.g. `leave=False`, `unit="spec"`)."""
    if disable or not enabled():
        return iterable
    bar = _tqdm()
    if bar is not None:
        return bar(iterable, desc=desc, total=total, file=sys.stderr, **options)
    return _plain(iterable, desc or "", total if total is not None else _length(iterable))


def _length(iterable: Iterable[Any]) -> int | None:
    try:
        return len(iterable)  # type: ignore[arg-type]
    except TypeError:
        return None


def _plain(iterable: Iterable[T], desc: str, total: int | None) -> Iterator[T]:
    """The items, with `[###....] done/total desc` redrawn on stderr before each; cleared at the end."""
    done = 0
    try:
        for item in iterable:
            label = f"{done}/{total}" if total else str(done)
            filled = PLAIN_WIDTH * done // total if total else 0
            print(f"\r[{'#' * filled}{'.' * (PLAIN_WIDTH - filled)}] {label} {desc:<30.30}", end="",
                  file=sys.stderr, flush=True)
            yield item
            done += 1
    finally:
        print("\r" + " " * (PLAIN_WIDTH + 48) + "\r", end="", file=sys.stderr, flush=True)
