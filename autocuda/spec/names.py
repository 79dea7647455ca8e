"""The names a spec may choose: its own name, and those of its parameters, states, derived quantities and options.

Sympy-free: a spec checks its names on every construction, also in a process that never parses an expression.

A declared name reaches generated C only as `cnames.c_name` spells it (behind a prefix no keyword, macro or header
name starts with), so C itself does not constrain it. What does:
- its shape: an ASCII identifier (a letter first), at most MAX_IDENTIFIER characters, without '__';
- the expression language, which is Python syntax: none of its functions and constants, no Python keyword;
- the derivation, whose own sympy symbols start with 'ac_' (a symbol of the same name would be the same symbol);
- the kernels' argument keys, which callers use as written (`x_seq`, `<state>_init`, `grad_<param>`, `N`, ...): a
  name shaped like one would make two arguments one.
The spec's name makes kernel names (`codegen.neuron.kernel_stem`): letters, digits and single '_' between them.
"""
from __future__ import annotations

import keyword
import re

from ..cnames import GENERATED_PREFIX
from ..errors import SpecError

__all__ = ["LANGUAGE_NAMES", "MAX_IDENTIFIER", "FIXED_KEYS", "name_problem", "check_identifier", "spec_name_problem"]

MAX_IDENTIFIER = 32
# The functions and constants of the expression language (`spec.parse.FUNCTIONS` and `CONSTANTS`).
LANGUAGE_NAMES = frozenset({"exp", "log", "sqrt", "abs", "sin", "cos", "tan", "tanh", "atan", "sigmoid", "erf",
                            "heaviside", "min", "max", "where", "pi", "e"})
# Kernel argument keys (`codegen.neuron`) that hold no user's name; every other key is made from one, in a shape
# below: `<state>_init`, `<state>_seq`, `<state>_final`, `<state>_checkpoints`, `grad_<state or param>...`.
FIXED_KEYS = frozenset({"x_seq", "spike_seq", "h_seq", "grad_spike_seq", "grad_x_seq", "N", "T"})
KEY_SUFFIXES = ("_init", "_seq", "_final", "_checkpoints")
KEY_PREFIXES = ("grad_",)

_IDENTIFIER = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")
MAX_SPEC_NAME = 64
_SPEC_NAME = re.compile(rf"(?!{GENERATED_PREFIX})[A-Za-z](?:[A-Za-z0-9]|_(?!_|$)){{0,{MAX_SPEC_NAME - 1}}}\Z")


def name_problem(name: object) -> str | None:
    """Why `name` cannot name a parameter, state, derived quantity or option, or None if it can."""
    if not isinstance(name, str) or not _IDENTIFIER.match(name):
        return "must be an ASCII identifier: a letter, then letters, digits or '_'"
    if len(name) > MAX_IDENTIFIER:
        return f"must be at most {MAX_IDENTIFIER} characters"
    if "__" in name:
        return "must not contain '__'"
    if name.startswith(GENERATED_PREFIX):
        return f"must not start with {GENERATED_PREFIX!r} (the derivation's own symbols do)"
    if name in LANGUAGE_NAMES:
        return "is a function or constant of the expression language"
    if keyword.iskeyword(name):
        return "is a Python keyword (expressions could not name it)"
    if name in FIXED_KEYS or name.endswith(KEY_SUFFIXES) or name.startswith(KEY_PREFIXES):
        return (f"is, or is shaped like, the name of a kernel argument ({', '.join(sorted(FIXED_KEYS))}; starting "
                f"with {', '.join(map(repr, KEY_PREFIXES))} or ending in {', '.join(map(repr, KEY_SUFFIXES))})")
    return None


def check_identifier(name: object, *, source: str = "<python>", field: str = "") -> str:
    """Return `name` if it can name a parameter, state, derived quantity or option; raise SpecError otherwise."""
    problem = name_problem(name)
    if problem is not None:
        raise SpecError(f"invalid name {name!r}: {problem}", source=source, field=field, symbol=str(name))
    return name


def spec_name_problem(name: object) -> str | None:
    """Why `name` cannot be a spec's name, or None if it can."""
    if isinstance(name, str) and _SPEC_NAME.match(name):
        return None
    return (f"a spec name is a letter then letters, digits or single '_' (not last, no {GENERATED_PREFIX!r} "
            f"prefix), {MAX_SPEC_NAME} characters at most: kernel names are made from it")
