"""The names a spec may choose: its own name, and those of its parameters, states, derived quantities and options.

Sympy-free: a spec checks its names on every construction, also in a process that never parses an expression.

A declared name reaches generated C only as `cnames.c_name` spells it (behind a prefix no keyword, macro or header
name starts with), so C itself does not constrain it. What does:
- its shape: an ASCII identifier (a letter first), at most MAX_IDENTIFIER characters, without '__';
- the expression language, which is Python syntax: none of its functions and constants, no Python keyword;
- the derivation, whose own sympy symbols start with RESERVED_PREFIX (a symbol of that name would be the same);
- names the layers above reserve (kernel argument keys: `hooks.reserved_name`).
The spec's name makes kernel names: letters, digits and single '_' between them.
"""
from __future__ import annotations

import keyword
import re

from ..base.errors import SpecError
from . import hooks

__all__ = ["LANGUAGE_NAMES", "MAX_IDENTIFIER", "RESERVED_PREFIX", "name_problem", "check_identifier",
           "spec_name_problem"]

MAX_IDENTIFIER = 32
# The functions and constants of the expression language (`spec.parse.FUNCTIONS`, `CONSTANTS` and the draws,
# `spec.draws.DRAW_FUNCTIONS`).
LANGUAGE_NAMES = frozenset({"exp", "log", "sqrt", "abs", "sin", "cos", "tan", "tanh", "atan", "sigmoid", "erf",
                            "heaviside", "min", "max", "where", "pi", "e", "randn", "rand"})
RESERVED_PREFIX = "ac_"  # no declared name starts with it: the derivation's own symbols (and generated names) do

_IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")
MAX_SPEC_NAME = 64
_SPEC_NAME = re.compile(rf"(?!{RESERVED_PREFIX})[A-Za-z](?:[A-Za-z0-9]|_(?!_|$)){{0,{MAX_SPEC_NAME - 1}}}\Z")


def name_problem(name: object) -> str | None:
    """Why `name` cannot name a parameter, state, derived quantity or option, or None if it can."""
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        return "must be an ASCII identifier: a letter, then letters, digits or '_'"
    if len(name) > MAX_IDENTIFIER:
        return f"must be at most {MAX_IDENTIFIER} characters"
    if "__" in name:
        return "must not contain '__'"
    if name.startswith(RESERVED_PREFIX):
        return f"must not start with {RESERVED_PREFIX!r} (the derivation's own symbols do)"
    if name in LANGUAGE_NAMES:
        return "is a function or constant of the expression language"
    if keyword.iskeyword(name):
        return "is a Python keyword (expressions could not name it)"
    return hooks.reserved_name(name)


def check_identifier(name: object, *, source: str = "<python>", field: str = "") -> str:
    """Return `name` if it can name a parameter, state, derived quantity or option; raise SpecError otherwise."""
    problem = name_problem(name)
    if problem is not None or not isinstance(name, str):
        raise SpecError(f"invalid name {name!r}: {problem}", source=source, field=field, symbol=str(name))
    return name


def spec_name_problem(name: object) -> str | None:
    """Why `name` cannot be a spec's name, or None if it can."""
    if isinstance(name, str) and _SPEC_NAME.match(name):
        return None
    return (f"a spec name is a letter then letters, digits or single '_' (not last, no {RESERVED_PREFIX!r} "
            f"prefix), {MAX_SPEC_NAME} characters at most: kernel names are made from it")
