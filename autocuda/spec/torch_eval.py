"""Evaluate a sympy expression with torch ops: the surrogate backward and the reference neuron step.

A table-driven walk over the sympy tree (no lambdify: it would exec generated Python text). Tensors keep
their dtype and broadcast; Python floats stay scalars so they do not promote a float16 tensor to float32.
Subexpressions are memoised per call, so common subexpressions are computed once.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from typing import Any, Union

import sympy
import torch
from sympy.codegen.cfunctions import expm1

__all__ = ["evaluate"]

Value = Union[torch.Tensor, float, bool]  # noqa: UP007 - used at runtime on py3.10 too


def evaluate(expr: sympy.Basic, values: Mapping[sympy.Symbol, torch.Tensor | float]) -> torch.Tensor:
    """The value of `expr` with each free symbol replaced by its entry in `values` (tensor or float)."""
    tensors = [v for v in values.values() if isinstance(v, torch.Tensor)]
    dtype = functools.reduce(torch.promote_types, [t.dtype for t in tensors], torch.bool)
    if not dtype.is_floating_point:  # all-integer or no tensor inputs: compute in torch's default float
        dtype = torch.get_default_dtype()
    device = tensors[0].device if tensors else torch.device("cpu")
    result = _Walker(values, dtype, device).eval(expr)
    if isinstance(result, torch.Tensor):
        return result if result.is_floating_point() or result.dtype == torch.bool else result.to(dtype)
    return torch.tensor(result, dtype=torch.bool if isinstance(result, bool) else dtype, device=device)


class _Walker:
    def __init__(self, values: Mapping[sympy.Symbol, Any], dtype: torch.dtype, device: torch.device):
        self.values, self.dtype, self.device = values, dtype, device
        self.memo: dict[sympy.Basic, Value] = {}

    def eval(self, expr: sympy.Basic) -> Value:
        if expr in self.memo:
            return self.memo[expr]
        rule = _rule_for(expr)
        if rule is None:
            raise TypeError(f"cannot evaluate sympy node {type(expr).__name__}: {expr}")
        value = rule(self, expr)
        self.memo[expr] = value
        return value

    def tensor(self, value: Value) -> torch.Tensor:
        if isinstance(value, torch.Tensor):
            return value
        return torch.tensor(value, dtype=torch.bool if isinstance(value, bool) else self.dtype, device=self.device)

    def unary(self, fn: Callable[[torch.Tensor], torch.Tensor], value: Value) -> Value:
        # Scalars go through torch in float64, so exp overflow gives inf and log(0) -inf, as on tensors.
        if isinstance(value, torch.Tensor):
            return fn(value)
        return fn(torch.tensor(float(value), dtype=torch.float64)).item()


def _symbol(w: _Walker, e: sympy.Symbol) -> Value:
    if e not in w.values:
        raise TypeError(f"no value given for symbol {e}")
    value = w.values[e]
    return value if isinstance(value, torch.Tensor) else float(value)


def _number(w: _Walker, e: sympy.Expr) -> float:
    return float(e)


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


def _pow(w: _Walker, e: sympy.Pow) -> Value:
    base, exponent = e.args
    b = w.eval(base)
    if exponent == sympy.Rational(1, 2):
        return w.unary(torch.sqrt, b)
    if exponent == -1:
        return w.unary(torch.reciprocal, b)
    if exponent.is_Integer and isinstance(b, torch.Tensor):
        return b ** int(exponent)  # integer powers stay exact and defined for negative bases
    x = w.eval(exponent)
    if isinstance(b, torch.Tensor):
        return torch.pow(b, x)
    if isinstance(x, torch.Tensor):
        return torch.pow(b, x)
    return torch.pow(torch.tensor(b, dtype=torch.float64), x).item()


def _function(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[_Walker, sympy.Expr], Value]:
    return lambda w, e: w.unary(fn, w.eval(e.args[0]))


def _fold(pair: Callable[[Value, Value], Value]) -> Callable[[_Walker, sympy.Expr], Value]:
    def rule(w: _Walker, e: sympy.Expr) -> Value:
        values = [w.eval(a) for a in e.args]
        result = values[0]
        for v in values[1:]:
            result = pair(result, v)
        return result
    return rule


def _minimum(a: Value, b: Value) -> Value:
    if isinstance(a, torch.Tensor):
        return torch.minimum(a, b) if isinstance(b, torch.Tensor) else torch.clamp(a, max=b)
    if isinstance(b, torch.Tensor):
        return torch.clamp(b, max=a)
    return min(a, b)


def _maximum(a: Value, b: Value) -> Value:
    if isinstance(a, torch.Tensor):
        return torch.maximum(a, b) if isinstance(b, torch.Tensor) else torch.clamp(a, min=b)
    if isinstance(b, torch.Tensor):
        return torch.clamp(b, min=a)
    return max(a, b)


def _select(w: _Walker, cond: Value, a: Value, b: Value) -> Value:
    if isinstance(cond, bool):
        return a if cond else b
    if not isinstance(a, torch.Tensor) and not isinstance(b, torch.Tensor):
        a = w.tensor(a)  # torch.where(cond, 1.0, 2.0) would pick the default dtype, not ours
    return torch.where(cond, a, b)  # type: ignore[arg-type]  # the stubs want tensors; torch takes numbers too


def _heaviside(w: _Walker, e: sympy.Heaviside) -> Value:
    z = w.eval(e.args[0])
    at_zero = float(e.args[1]) if len(e.args) > 1 else 0.5
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
        values = [w.eval(a) for a in e.args]
        if not any(isinstance(v, torch.Tensor) for v in values):
            return scalar_op(values)
        result = w.tensor(values[0])
        for v in values[1:]:
            result = tensor_op(result, w.tensor(v))
        return result
    return rule


def _not(w: _Walker, e: sympy.Not) -> Value:
    value = w.eval(e.args[0])
    return torch.logical_not(value) if isinstance(value, torch.Tensor) else not value


_RULES: dict[type, Callable[[_Walker, Any], Value]] = {
    sympy.Symbol: _symbol, sympy.Add: _add, sympy.Mul: _mul, sympy.Pow: _pow,
    sympy.exp: _function(torch.exp), expm1: _function(torch.expm1), sympy.log: _function(torch.log),
    sympy.Abs: _function(torch.abs),
    sympy.sin: _function(torch.sin), sympy.cos: _function(torch.cos), sympy.tan: _function(torch.tan),
    sympy.tanh: _function(torch.tanh), sympy.atan: _function(torch.atan), sympy.erf: _function(torch.erf),
    sympy.sign: _function(torch.sign), sympy.Min: _fold(_minimum), sympy.Max: _fold(_maximum),
    sympy.Heaviside: _heaviside, sympy.Piecewise: _piecewise,
    sympy.StrictLessThan: _relation(lambda a, b: a < b), sympy.LessThan: _relation(lambda a, b: a <= b),
    sympy.StrictGreaterThan: _relation(lambda a, b: a > b), sympy.GreaterThan: _relation(lambda a, b: a >= b),
    sympy.Eq: _relation(lambda a, b: a == b), sympy.Ne: _relation(lambda a, b: a != b),
    sympy.And: _logic(torch.logical_and, all), sympy.Or: _logic(torch.logical_or, any), sympy.Not: _not,
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
