"""Parameter domains: the values a parameter may take, written `domain = "> 0"` or `domain = ">= 1, <= 100"`.

A domain is one or two comparisons of the parameter with a number, at most one bound from below and one from
above. Python numbers are checked on the host before a call runs (`problem`); tensors are not (a check would
read them back from the GPU on every call), so an out-of-domain tensor value computes what the equations give,
as the reference does: inf or NaN where they divide by zero, divergence where they grow.
"""
from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable
from typing import NamedTuple

__all__ = ["Bound", "checks", "parse_domain", "problem"]

_COMPARISONS: dict[str, tuple[Callable[[float, float], bool], str]] = {
    ">": (operator.gt, "lower"), ">=": (operator.ge, "lower"), "<": (operator.lt, "upper"),
    "<=": (operator.le, "upper"),
}
_BOUND = re.compile(r"\s*(>=|<=|>|<)\s*([-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?)\s*\Z")
MAX_DOMAIN_TEXT = 64


class Bound(NamedTuple):
    """One comparison a value must satisfy: `value <operator> limit`."""

    operator: str
    limit: float

    def __str__(self) -> str:
        return f"{self.operator} {self.limit:g}"


def parse_domain(text: object) -> tuple[Bound, ...]:
    """The bounds a domain text states; ValueError saying what is wrong with it."""
    if not isinstance(text, str):
        raise ValueError(f"expected a string such as \"> 0\" or \">= 1, <= 100\", got {type(text).__name__}")
    if len(text) > MAX_DOMAIN_TEXT:
        raise ValueError(f"longer than {MAX_DOMAIN_TEXT} characters")
    if not text.strip():
        return ()
    bounds, sides = [], set()
    for part in text.split(","):
        match = _BOUND.match(part)
        if match is None:
            raise ValueError(f"{part.strip()!r} is not a comparison such as \"> 0\" or \"<= 100\"")
        limit = float(match.group(2))
        side = _COMPARISONS[match.group(1)][1]
        if not math.isfinite(limit):
            raise ValueError(f"{part.strip()!r}: the limit must be a finite number")
        if side in sides:
            raise ValueError(f"two {side} bounds; give at most one from below and one from above")
        sides.add(side)
        bounds.append(Bound(match.group(1), limit))
    return tuple(bounds)


def checks(bounds: tuple[tuple[str, float], ...]) -> tuple[tuple[Callable[[float, float], bool], float], ...]:
    """(comparison, limit) pairs that hold for a value inside the domain: what a per-call check runs."""
    return tuple((_COMPARISONS[op][0], limit) for op, limit in bounds)


def problem(bounds: tuple[tuple[str, float], ...], value: float) -> str | None:
    """Why `value` is outside the domain given as (operator, limit) pairs (`Bound`s or plain tuples), or None."""
    for op, limit in bounds:
        if not _COMPARISONS[op][0](value, limit):
            return f"must be {' and '.join(str(Bound(*b)) for b in bounds)}, got {value:g}"
    return None
