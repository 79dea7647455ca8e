"""Partial derivatives for the derivation (`spec.derive`): sympy's `diff`, cached, with its large constants stood in.

sympy's `Derivative` takes the free symbols of every subexpression it differentiates, at every level of the
expression: each subtree is walked once per level above it. Where a large subexpression is free of the variable
(the coefficients of an exactly integrated linear ODE, functions of the parameters alone, repeated in every term),
that walk is most of the work, and the subexpression's derivative is 0 wherever it stands. So each subexpression
free of the variable of at least STAND_IN_NODES nodes stands in as a symbol of its own while sympy differentiates,
and is put back after: the derivative is the same, term for term (sympy treats a symbol and a subexpression free of
the variable alike), and without such subexpressions `diff` runs as it is. A stand-in is real, as every value of a
kernel is: where sympy cannot tell that a constant is real (a square root of a difference), its own derivative of
|x + c| holds re(c); the stand-in's is the same with re(c) = c and im(c) = 0 (no re or im reaches a printer).
"""
from __future__ import annotations

import functools

import sympy as sp

STAND_IN_NODES = 40  # nodes of a subexpression free of the variable, from which a symbol stands in for it
_STAND_IN = "ac_constant_"  # generated names start with "ac_": no spec's name is one


@functools.lru_cache(maxsize=2048)
def derivative(expr: sp.Expr, u: sp.Symbol) -> sp.Expr:
    """sp.diff(expr, u) (cached: the derivations of a system with and without detach_reset take the same ones), with
    powers of a variable exponent differentiated as torch's pow is (`_Power`), and a min or max of more than two
    arguments as the pairs the reference folds it into (`_MinPair`, `_MaxPair`)."""
    stand_ins: dict[sp.Basic, sp.Symbol] = {}
    folds = any(len(e.args) > 2 for e in expr.atoms(sp.Min, sp.Max))
    if folds:  # before the stand-ins: a stand-in for an argument would reorder the arguments
        expr = expr.replace(lambda e: isinstance(e, (sp.Min, sp.Max)) and len(e.args) > 2, _in_pairs)
    smaller = _Constants(u, stand_ins).replace(expr)
    powers = [p for p in smaller.atoms(sp.Pow) if _variable_exponent(p)]
    if powers:
        smaller = smaller.replace(_variable_exponent, lambda p: _Power(*p.args))
    found = sp.diff(smaller, u)
    if powers:
        found = found.replace(_Power, sp.Pow)
    if folds:
        found = found.replace(_MinPair, sp.Min).replace(_MaxPair, sp.Max)
    return found.xreplace({symbol: value for value, symbol in stand_ins.items()}) if stand_ins else found


def _variable_exponent(e: sp.Basic) -> bool:
    return isinstance(e, sp.Pow) and not e.exp.is_Number and not e.base.is_Number


class _Power(sp.Function):
    """b**e, e not a number, while sympy differentiates it, with torch's pow's derivatives (the reference's): d/db =
    e * b**(e - 1), 0 where e = 0; d/de = b**e * log(b), 0 where b = 0 and e >= 0. sympy's own are e * b**e / b and
    b**e * log(b): 0/0 and 0 * -inf where b = 0, NaN for every step before it in backward. (Equality as two
    comparisons: the printers spell <=, >=.)"""

    nargs = 2

    def fdiff(self, argindex: int = 1) -> sp.Expr:
        b, e = self.args
        value = e * _Power(b, e - 1) if argindex == 1 else _Power(b, e) * sp.log(b)
        try:
            zero = (e >= 0) & (e <= 0) if argindex == 1 else (b >= 0) & (b <= 0) & (e >= 0)
            return sp.Piecewise((0, zero), (value, True))
        except TypeError:  # a base or exponent sympy knows is not real (log of a negative): no comparison
            return value


class _MinPair(sp.Function):
    """min(a, b), one pair of a min of more than two arguments while sympy differentiates it: sympy's own derivative of
    Min(a, b, c) by a is H(min(b, c) - a), 1/2 for each of three equal arguments (3/2 in all); the reference folds
    the arguments in their order, torch.minimum(torch.minimum(a, b), c) (`spec.torch_eval`), whose gradient splits
    evenly at each pair's tie (1/4, 1/4, 1/2). As pairs, the derivation takes the reference's."""

    nargs = 2

    def fdiff(self, argindex: int = 1) -> sp.Expr:
        a, b = self.args
        return sp.Heaviside(b - a) if argindex == 1 else sp.Heaviside(a - b)


class _MaxPair(sp.Function):
    """max(a, b), one pair of a max of more than two arguments (see `_MinPair`)."""

    nargs = 2

    def fdiff(self, argindex: int = 1) -> sp.Expr:
        a, b = self.args
        return sp.Heaviside(a - b) if argindex == 1 else sp.Heaviside(b - a)


def _in_pairs(e: sp.Expr) -> sp.Expr:
    """A min or max of more than two arguments as pairs, left to right: min(a, b, c) = min(min(a, b), c)."""
    pair = _MinPair if isinstance(e, sp.Min) else _MaxPair
    return functools.reduce(pair, e.args)


class _Constants:
    """Replaces the large subexpressions free of `u` by symbols (`stand_ins`: subexpression -> its symbol, named
    in the order met, so that sympy's own cache serves the same shapes again)."""

    def __init__(self, u: sp.Symbol, stand_ins: dict[sp.Basic, sp.Symbol]) -> None:
        self.u, self.stand_ins = u, stand_ins
        self.has_u: dict[sp.Basic, bool] = {}
        self.nodes: dict[sp.Basic, int] = {}

    def replace(self, e: sp.Basic) -> sp.Basic:
        if not e.args:
            return e
        if isinstance(e, sp.Expr) and not self._has_u(e) and self._nodes(e) >= STAND_IN_NODES:
            symbol = self.stand_ins.get(e)
            if symbol is None:
                symbol = self.stand_ins[e] = sp.Symbol(f"{_STAND_IN}{len(self.stand_ins)}", real=True)
            return symbol
        args = tuple(self.replace(a) for a in e.args)
        return e if args == e.args else e.func(*args)

    def _has_u(self, e: sp.Basic) -> bool:
        found = self.has_u.get(e)
        if found is None:
            found = self.has_u[e] = e == self.u or any(self._has_u(a) for a in e.args)
        return found

    def _nodes(self, e: sp.Basic) -> int:
        found = self.nodes.get(e)
        if found is None:
            found = self.nodes[e] = 1 + sum(self._nodes(a) for a in e.args)
        return found
