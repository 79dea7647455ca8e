"""Random draws in a spec's step: `randn()`, a standard normal, and `rand()`, a uniform on [0, 1) (docs/spec-format.md).

A draw is one value per (neuron, step, call site): each call written in the spec is a site of its own, numbered in the
order the spec's fields are parsed (charge, then the updates in their order; within a field, left to right), and
stands in the step's equations for a symbol of its own (`draw_symbol`). The derivation treats it as a value given to
the step, like an input without a gradient; kernels make it where it is used (`autocuda.codegen.noise`), forward and
backward alike, from the call's seed: nothing is stored.
"""
from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..base.lazy import lazy_import

if TYPE_CHECKING:
    import sympy as sp
else:
    sp = lazy_import("sympy")

__all__ = ["DRAW_FUNCTIONS", "Draw", "draw_symbol", "as_draw", "draws_of", "renumbered", "system_draws",
           "draw_refusal", "makes_draws"]

# the spec language's functions of a draw -> the kind of draw (`autocuda.codegen.noise.KINDS`)
DRAW_FUNCTIONS = {"randn": "normal", "rand": "uniform"}
_PREFIX = {"normal": "ac_randn_", "uniform": "ac_rand_"}


def draw_refusal(field: str) -> str:
    """Why a draw may not stand in `field` (any field but the charge and the state updates)."""
    allowed = "random draws (randn(), rand()) may stand only in the charge and in the updates of states"
    if field == "threshold" or field.startswith("levels"):
        return (f"{allowed}: backward recomputes the spike's argument (the surrogate's) of every step from what "
                "forward saved, and a draw in it is not made again there; add the noise to the charge instead")
    if field.startswith(("ode", "jumps")):
        return f"{allowed}: a draw in an [ode] block needs a stochastic integrator, which autocuda does not have"
    if field.startswith("derived"):
        return f"{allowed}: derived quantities are of the parameters alone, the same at every step"
    return allowed


@dataclass(frozen=True)
class Draw:
    symbol: sp.Symbol
    kind: str       # "normal" or "uniform"
    site: int       # the call site: the fourth word of the generator's counter


def draw_symbol(kind: str, site: int) -> sp.Symbol:
    """The symbol standing for the draw of call site `site`."""
    return sp.Symbol(f"{_PREFIX[kind]}{site}", real=True)


def as_draw(symbol: sp.Basic) -> Draw | None:
    """The draw `symbol` stands for, or None where it is no draw's."""
    if not isinstance(symbol, sp.Symbol):
        return None
    for kind, prefix in _PREFIX.items():
        rest = symbol.name[len(prefix):]
        if symbol.name.startswith(prefix) and rest.isdigit():
            return Draw(symbol, kind, int(rest))
    return None


def draws_of(exprs: Iterable[sp.Basic]) -> tuple[Draw, ...]:
    """The draws in `exprs`, by site."""
    found = {d.site: d for e in exprs for s in e.free_symbols if (d := as_draw(s)) is not None}
    return tuple(found[site] for site in sorted(found))


def renumbered(expr: sp.Expr, first: int) -> tuple[sp.Expr, int]:
    """`expr` with the sites of its draws (0, 1, ... as parsed within one field) moved to first, first + 1, ...;
    and how many it has."""
    draws = draws_of([expr])
    moved = {d.symbol: draw_symbol(d.kind, first + d.site) for d in draws}
    return (expr.xreplace(moved) if first else expr), len(draws)


@functools.lru_cache(maxsize=256)
def system_draws(system: object) -> tuple[Draw, ...]:
    """The draws of a `StepSystem`'s step (its charge and updates), by site (cached: every kernel of a system asks,
    and finding them walks every expression)."""
    return draws_of([system.charge, *system.updates])  # type: ignore[attr-defined]


def makes_draws(spec: object) -> bool:
    """Whether a spec's step draws (a call of randn or rand in its charge or updates), from the text alone: no
    sympy (a process running cached kernels asks it of every layer's configuration) and only string methods (a
    layer's first call may be traced by torch.compile). The parse refuses draws anywhere else, and strings in
    expressions, so this is the parsed step's answer too."""
    texts = [spec.charge, *(text for _, text in spec.updates)]  # type: ignore[attr-defined]
    return any(_calls_draw(text) for text in texts if isinstance(text, str))


def _calls_draw(text: str) -> bool:
    """Whether `text` calls randn or rand: the name, not preceded by a name's character, then "(" after blanks."""
    for name in DRAW_FUNCTIONS:
        at = text.find(name)
        while at >= 0:
            before = text[at - 1] if at else " "
            after = text[at + len(name):].lstrip()
            if not (before.isalnum() or before == "_") and after.startswith("("):
                return True
            at = text.find(name, at + 1)
    return False
