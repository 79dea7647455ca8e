"""Evaluate a sympy expression with torch ops: the surrogate backward and the reference neuron step.

A table-driven walk over the sympy tree (no lambdify: it would exec generated Python text). Tensors keep
their dtype and broadcast; Python floats stay scalars so they do not promote a float16 tensor to float32.
Subexpressions are memoised per call, so common subexpressions are computed once. Outside a torch.compile trace an
expression is lowered once (`lower`) and its flat program run (`spec.flat.run`: the same operations in the same
order, without the walk's per-node dispatch); a trace takes the walk, unless the caller keeps the program
(`program_of`, made before tracing: the reference's step and the surrogates do), which traces in a fraction of
the walk's time.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any, Union

import sympy
import torch
from mpmath.libmp import to_float  # type: ignore[import-untyped]
from sympy.codegen.cfunctions import expm1

from ..base.errors import LiteralError
from .flat import Evaluation, Program, run, symbols_of
from .flat import maximum as _maximum
from .flat import minimum as _minimum
from .flat import reciprocal as _reciprocal
from .flat import scalar_of as _scalar
from .flat import sign as _sign

__all__ = ["evaluate", "walk", "prepare_expression", "program_of", "lower"]

Value = Union[torch.Tensor, float, bool]  # noqa: UP007 - used at runtime on py3.10 too


def evaluate(expr: sympy.Basic, values: Mapping[sympy.Symbol, torch.Tensor | float]) -> torch.Tensor:
    """The value of `expr` with each free symbol replaced by its entry in `values` (tensor or float).

    Symbols are matched by name: sympy may hold two equal symbol objects (its cache of them can be cleared
    between a spec's parse and its derivation), and torch.compile looks sympy objects up in a dict by identity,
    so a lookup by object would find the value in eager mode and miss it in a compiled one."""
    named = {symbol.name: value for symbol, value in values.items()}
    if not torch.compiler.is_compiling():  # (Dynamo traces the walk: it does not look up a cache keyed by sympy)
        lowered = _lowered(expr)
        if lowered is not None and lowered[1] <= named.keys():  # else the walk names what is missing
            return run(lowered[0], named)  # the same torch operations in the same order (tests/test_flat.py)
    return _walk(expr, named)


def walk(expr: sympy.Basic, values: Mapping[sympy.Symbol, torch.Tensor | float]) -> torch.Tensor:
    """`evaluate` by the walk over the tree alone (what a torch.compile trace takes; the definition that lowered
    programs are held to)."""
    return _walk(expr, {symbol.name: value for symbol, value in values.items()})


def _walk(expr: sympy.Basic, named: Mapping[str, torch.Tensor | float]) -> torch.Tensor:
    tensors = [v for v in named.values() if isinstance(v, torch.Tensor)]
    dtype = functools.reduce(torch.promote_types, [t.dtype for t in tensors], torch.bool)
    if not dtype.is_floating_point:  # all-integer or no tensor inputs: compute in torch's default float
        dtype = torch.get_default_dtype()
    device = tensors[0].device if tensors else torch.device("cpu")
    result = _Walker(named, dtype, device).eval(expr)
    if isinstance(result, torch.Tensor):
        return result if result.is_floating_point() or result.dtype == torch.bool else result.to(dtype)
    return torch.tensor(result, dtype=torch.bool if isinstance(result, bool) else dtype, device=device)


@functools.lru_cache(maxsize=4096)
def _lowered(expr: sympy.Basic) -> tuple[Program, frozenset[str]] | None:
    """`expr` lowered once (`lower`), with the names it reads: evaluating its program skips the walk's per-node
    dispatch and sympy lookups; None where a node cannot be evaluated (the walk then raises, naming it)."""
    try:
        program = lower(expr)
    except TypeError:
        return None
    return program, frozenset(symbols_of(program))


def program_of(expr: sympy.Basic) -> Program | None:
    """`expr` lowered to its flat program (`lower`, once per expression), or None where a node cannot be
    evaluated (`evaluate` then raises, naming it). Keep the program where torch.compile may trace its evaluation:
    `spec.flat.run` of a program traces in a fraction of the walk's time."""
    lowered = _lowered(expr)
    return None if lowered is None else lowered[0]


def prepare_expression(expr: sympy.Basic) -> sympy.Basic:
    """`expr` with the hash of each of its nodes computed (sympy computes one on first use and keeps it in the
    node: a side effect torch.compile refuses in an autograd.Function's backward). Call it before tracing."""
    for node in sympy.preorder_traversal(expr):
        hash(node)
    return expr


class _Walker(Evaluation):
    def __init__(self, values: Mapping[str, Any], dtype: torch.dtype, device: torch.device):
        super().__init__(values, dtype, device)
        self.memo: dict[sympy.Basic, Value] = {}

    def eval(self, expr: sympy.Basic) -> Value:
        if isinstance(expr, _NUMBER_BASES):  # a leaf: nothing to remember (and torch.compile of older torch
            return self.apply(expr)          # cannot hash a sympy number, whose class overrides __hash__)
        if expr in self.memo:
            return self.memo[expr]
        value = self.memo[expr] = self.apply(expr)
        return value

    def apply(self, expr: sympy.Basic) -> Value:
        rule = _rule_for(expr)
        if rule is None:
            raise TypeError(f"cannot evaluate sympy node {type(expr).__name__}: {expr}")
        return rule(self, expr)





def _symbol(w: _Walker, e: sympy.Symbol) -> Value:
    if e.name not in w.values:
        raise TypeError(f"no value given for symbol {e}")
    value = w.values[e.name]
    return value if isinstance(value, torch.Tensor) else float(value)


def _number(w: _Walker, e: sympy.Expr) -> float:
    # Not float(e): torch.compile cannot trace float() of a sympy number (nor, for a Rational or pi, the mpmath
    # it calls). p / q of Python ints is rounded correctly, a Float is its mpmath value, constants are math's.
    # A finite number beyond float64's range is refused, as the kernels' printers refuse it (`LiteralError`).
    if isinstance(e, sympy.Rational):
        try:
            return e.p / e.q
        except OverflowError:
            raise LiteralError(f"the number {sympy.Float(e, 3)} is beyond float64's range") from None
    if isinstance(e, sympy.Float):
        value = to_float(e._mpf_)
        if math.isinf(value):
            raise LiteralError(f"the number {sympy.Float(e, 3)} is beyond float64's range")
        return value
    return _CONSTANTS.get(type(e)) or float(e)


_CONSTANTS = {type(sympy.pi): math.pi, type(sympy.E): math.e}


def _add(w: _Walker, e: sympy.Add) -> Value:
    total: Value = 0.0
    for arg in e.args:
        total = total + w.eval(arg)
    return total


def _mul(w: _Walker, e: sympy.Mul) -> Value:
    product: Value = 1.0
    for arg in e.args:
        product = product * w.eval(arg)
    return product


# Compared with, not built, in `_pow`: building sympy numbers while torch.compile traces calls sympy's caches.
_HALF, _MINUS_ONE = sympy.Rational(1, 2), sympy.Integer(-1)


def _pow(w: _Walker, e: sympy.Pow) -> Value:
    base, exponent = e.args
    b = w.eval(base)
    if exponent == _HALF:
        return w.unary(torch.sqrt, math.sqrt, b)
    if exponent == _MINUS_ONE:
        return w.unary(torch.reciprocal, _reciprocal, b)
    if exponent.is_Integer and isinstance(b, torch.Tensor):
        return b ** exponent.p  # integer powers stay exact and defined for negative bases
    x = w.eval(exponent)
    if isinstance(b, torch.Tensor):
        return torch.pow(b, x)
    if isinstance(x, torch.Tensor):
        return torch.pow(b, x)
    return _scalar(torch.pow, math.pow, b, x)






def _function(fn: Callable[[torch.Tensor], torch.Tensor], scalar: Callable[[float], float]
              ) -> Callable[[_Walker, sympy.Expr], Value]:
    return lambda w, e: w.unary(fn, scalar, w.eval(e.args[0]))


def _fold(pair: Callable[[Value, Value], Value]) -> Callable[[_Walker, sympy.Expr], Value]:
    def rule(w: _Walker, e: sympy.Expr) -> Value:
        values = [w.eval(a) for a in e.args]
        result = values[0]
        for v in values[1:]:
            result = pair(result, v)
        return result
    return rule






def _select(w: _Walker, cond: Value, a: Value, b: Value) -> Value:
    if isinstance(cond, bool):
        return a if cond else b
    if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
        a = w.tensor(a)  # torch.where(cond, 1.0, 2.0) would pick the default dtype, not ours
    return torch.where(cond, a, b)  # type: ignore[arg-type]  # the stubs want tensors; torch takes numbers too


def _heaviside(w: _Walker, e: sympy.Heaviside) -> Value:
    z = w.eval(e.args[0])
    at_zero = _number(w, e.args[1]) if len(e.args) > 1 else 0.5
    if not isinstance(z, torch.Tensor):
        return 1.0 if z > 0 else (at_zero if z == 0 else 0.0)
    # torch.where, not torch.heaviside (which autograd cannot differentiate): a step's gradient is 0
    return torch.where(z > 0, w.tensor(1.0), torch.where(z == 0, w.tensor(at_zero), w.tensor(0.0)))


def _piecewise(w: _Walker, e: sympy.Piecewise) -> Value:
    result: Value = math.nan  # sympy's value when no condition holds
    for piece, cond in reversed(e.args):
        result = _select(w, w.eval(cond), w.eval(piece), result) if cond is not sympy.true else w.eval(piece)
    return result


def _relation(op: Callable[[Any, Any], Any]) -> Callable[[_Walker, sympy.Expr], Value]:
    return lambda w, e: op(w.eval(e.args[0]), w.eval(e.args[1]))


def _logic(tensor_op: Callable, scalar_op: Callable) -> Callable[[_Walker, sympy.Expr], Value]:
    def rule(w: _Walker, e: sympy.Expr) -> Value:
        return w.logic(tensor_op, scalar_op, [w.eval(a) for a in e.args])
    return rule


def _ite(w: _Walker, e: sympy.ITE) -> Value:
    """A condition chosen by a condition (booleans throughout)."""
    condition, then, otherwise = (w.eval(a) for a in e.args)
    if not isinstance(condition, torch.Tensor):
        return then if condition else otherwise
    return torch.where(condition, torch.as_tensor(then), torch.as_tensor(otherwise))


def _not(w: _Walker, e: sympy.Not) -> Value:
    value = w.eval(e.args[0])
    return torch.logical_not(value) if isinstance(value, torch.Tensor) else not value


_RULES: dict[type, Callable[[_Walker, Any], Value]] = {
    sympy.Symbol: _symbol, sympy.Add: _add, sympy.Mul: _mul, sympy.Pow: _pow,
    sympy.exp: _function(torch.exp, math.exp), expm1: _function(torch.expm1, math.expm1),
    sympy.log: _function(torch.log, math.log), sympy.Abs: _function(torch.abs, abs),
    sympy.sin: _function(torch.sin, math.sin), sympy.cos: _function(torch.cos, math.cos),
    sympy.tan: _function(torch.tan, math.tan), sympy.tanh: _function(torch.tanh, math.tanh),
    sympy.atan: _function(torch.atan, math.atan), sympy.erf: _function(torch.erf, math.erf),
    sympy.sign: _function(torch.sign, _sign), sympy.Min: _fold(_minimum), sympy.Max: _fold(_maximum),
    sympy.Heaviside: _heaviside, sympy.Piecewise: _piecewise,
    sympy.StrictLessThan: _relation(lambda a, b: a < b), sympy.LessThan: _relation(lambda a, b: a <= b),
    sympy.StrictGreaterThan: _relation(lambda a, b: a > b), sympy.GreaterThan: _relation(lambda a, b: a >= b),
    sympy.Eq: _relation(lambda a, b: a == b), sympy.Ne: _relation(lambda a, b: a != b),
    sympy.And: _logic(torch.logical_and, all), sympy.Or: _logic(torch.logical_or, any), sympy.Not: _not,
    sympy.ITE: _ite,
    type(sympy.true): lambda w, e: True, type(sympy.false): lambda w, e: False,
}
# Numbers (Integer, Rational, Float, pi, E, and sympy's singleton subclasses of them) become Python floats.
_NUMBER_BASES = (sympy.Number, sympy.NumberSymbol)


def _rule_for(expr: sympy.Basic) -> Callable[[_Walker, Any], Value] | None:
    rule = _RULES.get(type(expr))
    if rule is not None:
        return rule
    if isinstance(expr, _NUMBER_BASES) and expr.is_extended_real:  # inf allowed, nan/zoo not
        return _number
    if isinstance(expr, sympy.Symbol):  # Dummy and other Symbol subclasses
        return _symbol
    return None


# -- lowering: the expression as a flat program (`spec.flat`), which `flat.run` evaluates as `evaluate` does ------
_FUNCTION_NAMES: dict[type, str] = {
    sympy.exp: "exp", expm1: "expm1", sympy.log: "log", sympy.Abs: "abs", sympy.sin: "sin", sympy.cos: "cos",
    sympy.tan: "tan", sympy.tanh: "tanh", sympy.atan: "atan", sympy.erf: "erf", sympy.sign: "sign"}
_FOLD_NAMES: dict[type, str] = {sympy.Add: "add", sympy.Mul: "mul", sympy.Min: "min", sympy.Max: "max",
                                sympy.And: "and", sympy.Or: "or"}
_RELATION_NAMES: dict[type, str] = {
    sympy.StrictLessThan: "lt", sympy.LessThan: "le", sympy.StrictGreaterThan: "gt", sympy.GreaterThan: "ge",
    sympy.Eq: "eq", sympy.Ne: "ne"}


def lower(expr: sympy.Basic) -> Program:
    """`expr` as a flat program (`spec.flat`): each distinct subexpression once, before the nodes that use it.
    TypeError for a node `evaluate` cannot evaluate either."""
    program: list[tuple[Any, ...]] = []
    at: dict[sympy.Basic, int] = {}

    def emit(instruction: tuple[Any, ...]) -> int:
        program.append(instruction)
        return len(program) - 1

    def index(e: sympy.Basic) -> int:  # iterative over the tree's depth would not help: parsing bounds it
        found = at.get(e)
        if found is None:
            found = at[e] = emit(_instruction(e, index))
        return found

    index(expr)
    return tuple(program)


def _instruction(e: sympy.Basic, index: Callable[[sympy.Basic], int]) -> tuple[Any, ...]:
    """The instruction of node `e`, its operands lowered first (`index`), as `_rule_for(e)` evaluates it."""
    kind = type(e)
    if kind in _FOLD_NAMES:
        return (_FOLD_NAMES[kind], *(index(a) for a in e.args))
    if kind in _FUNCTION_NAMES:
        return (_FUNCTION_NAMES[kind], index(e.args[0]))
    if kind in _RELATION_NAMES:
        return (_RELATION_NAMES[kind], index(e.args[0]), index(e.args[1]))
    if kind is sympy.Pow:
        base, exponent = e.args
        how = "sqrt" if exponent == _HALF else "reciprocal" if exponent == _MINUS_ONE else \
            int(exponent.p) if exponent.is_Integer else None
        return ("pow", index(base), index(exponent), how)
    if kind is sympy.Heaviside:
        return ("heaviside", index(e.args[0]), _number(None, e.args[1]) if len(e.args) > 1 else 0.5)  # type: ignore[arg-type]
    if kind is sympy.Piecewise:
        return ("piecewise", *(i for piece, cond in e.args
                               for i in (index(piece), -1 if cond is sympy.true else index(cond))))
    if kind is sympy.Not:
        return ("not", index(e.args[0]))
    if kind is sympy.ITE:
        return ("ite", *(index(a) for a in e.args))
    if e is sympy.true or e is sympy.false:
        return (str(bool(e)).lower(),)
    rule = _rule_for(e)
    if rule is _number:
        return ("number", _number(None, e))  # type: ignore[arg-type]
    if rule is _symbol:
        return ("symbol", e.name)
    raise TypeError(f"cannot evaluate sympy node {type(e).__name__}: {e}")
