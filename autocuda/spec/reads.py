"""What a step function reads besides its arguments, as a key: a traced step may be reused while it is equal.

A step's trace depends on its code and on the values it reads when it runs: its globals (and the attributes it
reads from modules and classes: `config.TAU`), its closure's cells, its defaults, and the same of the Python
functions it calls by name. `reads_key(fn)` is all of that as one hashable key, or None where some value read
cannot be compared safely; a cache of traces keyed on it (`autocuda.nn.flexsn`) traces a step again exactly when
the key differs or is None. A value is compared:

- by value: None, booleans, numbers, strings, bytes, and tuples and frozensets of such;
- by value too: autocuda's surrogates (immutable, compared by their parameters);
- by identity: modules, classes, C functions and the functions of libraries (torch, SpikingJelly, snnTorch, Norse,
  NumPy, sympy, autocuda, the standard library); values read through attributes of modules and classes are
  compared as the values they are (`config.TAU` by its number);
- through its own reads: the Python functions called by name (at most MAX_HELPERS levels deep);
- not at all (the key is None: the step is traced each time it is asked for): anything else, as a list, a
  dict, a tensor, SpikingJelly's surrogate modules or any other object whose attributes may change in place.
"""
from __future__ import annotations

import functools
import types
from collections.abc import Hashable
from typing import Any

from .purity import chains, in_stdlib
from .surrogate import Surrogate

__all__ = ["reads_key", "MAX_HELPERS"]

MAX_HELPERS = 8  # levels of functions calling functions followed; a deeper chain is not cached
_VALUES = (type(None), bool, int, float, complex, str, bytes)
_BY_IDENTITY = (types.ModuleType, type, types.BuiltinFunctionType)
_LIBRARIES = frozenset({"torch", "spikingjelly", "snntorch", "norse", "numpy", "sympy", "autocuda"})


class _Unsafe(Exception):
    """A value read that cannot be compared safely."""


def reads_key(fn: Any) -> Hashable | None:
    """The key of everything `fn` reads (see the module doc), or None where something cannot be compared."""
    try:
        key = _key(fn, 0, set())
        hash(key)  # a class or C function of a kind that cannot be hashed: no key either
    except (_Unsafe, TypeError):
        return None
    return key


def _key(value: Any, depth: int, seen: set[int]) -> Hashable:
    if isinstance(value, _VALUES):
        return (type(value).__name__, repr(value) if isinstance(value, (float, complex)) else value)
    if type(value) in (tuple, frozenset):
        return (type(value).__name__, *sorted((_key(v, depth, seen) for v in value), key=repr)) \
            if isinstance(value, frozenset) else ("tuple", *(_key(v, depth, seen) for v in value))
    if isinstance(value, Surrogate):
        return ("surrogate", value.frozen())  # its values now: the object itself may change later
    if isinstance(value, _BY_IDENTITY):
        return ("identity", value)
    if isinstance(value, functools.partial):
        return ("partial", _key(value.func, depth, seen), _key(value.args, depth, seen),
                _key(tuple(sorted(value.keywords.items())), depth, seen))
    if isinstance(value, types.FunctionType):
        return ("identity", value) if _library(value) else _function_key(value, depth, seen)
    raise _Unsafe


def _library(fn: types.FunctionType) -> bool:
    """Whether `fn` is a library's (those of _LIBRARIES, the standard library): code that does not change while a
    process runs, compared by identity."""
    return (fn.__module__ or "").split(".")[0] in _LIBRARIES or in_stdlib(fn.__code__.co_filename)


def _function_key(fn: types.FunctionType, depth: int, seen: set[int]) -> Hashable:
    if id(fn) in seen:
        return ("recursive", fn)
    if depth > MAX_HELPERS:
        raise _Unsafe
    seen = seen | {id(fn)}
    cells = dict(zip(fn.__code__.co_freevars, fn.__closure__ or ()))
    read = []
    for code in _codes(fn.__code__):
        for load, name, attributes, _ in chains(code):
            if load in ("LOAD_DEREF", "LOAD_CLASSDEREF"):
                if name not in cells:
                    continue  # a variable of an enclosing call, computed as the step runs
                try:
                    value = cells[name].cell_contents
                except ValueError:  # an empty cell: the step fails on it itself
                    continue
            else:
                value = fn.__globals__.get(name, _MISSING)
                if value is _MISSING:
                    continue  # a builtin or a local name
            read.append((name, attributes, _key(_through(value, attributes), depth + 1, seen)))
    defaults = (fn.__defaults__ or (), tuple(sorted((fn.__kwdefaults__ or {}).items())))
    return ("function", fn, fn.__code__, tuple(read), _key(defaults, depth, seen))


_MISSING = object()


def _codes(code: types.CodeType) -> list[types.CodeType]:
    """`code` and the code of the functions, lambdas and comprehensions defined in it."""
    found, stack = [], [code]
    while stack:
        current = stack.pop()
        found.append(current)
        stack.extend(c for c in current.co_consts if isinstance(c, types.CodeType))
    return found


def _through(value: Any, attributes: tuple[str, ...]) -> Any:
    """The value an attribute chain reads, followed through modules and classes; where it goes on through another
    object, that object (compared as a whole, if it can be)."""
    for attribute in attributes:
        if not isinstance(value, (types.ModuleType, type)):
            return value
        try:
            value = getattr(value, attribute)
        except Exception:  # noqa: BLE001  # not there (yet): what it is read from, by identity
            return value
    return value
