"""sympy -> CUDA expression text, for any dtype of the table.

One printer serves every dtype: it decomposes a sympy tree into the table's operations (`add`, `mul`,
`exp`, `if_else`, ...) and lets the dtype record spell each one. Symbols print as the C names the caller
maps them to; an unmapped symbol is an error (so nothing reaches C that the caller did not name).
"""
from __future__ import annotations

from collections.abc import Callable, Mapping

import sympy as sp
from sympy.codegen.cfunctions import expm1

from ..base.errors import PrintError
from .dtypes import DType, get_dtype

_FUNCTIONS: dict[type, str] = {
    sp.exp: "exp", expm1: "expm1", sp.log: "log", sp.Abs: "abs", sp.sin: "sin", sp.cos: "cos", sp.tan: "tan",
    sp.tanh: "tanh", sp.atan: "atan", sp.erf: "erf",
}
_COMPARISONS: dict[type, str] = {
    sp.GreaterThan: "cond_ge", sp.StrictGreaterThan: "cond_gt", sp.LessThan: "cond_le", sp.StrictLessThan: "cond_lt",
}
_FOLDS: dict[type, str] = {sp.Min: "minimum_nan", sp.Max: "maximum_nan"}  # NaN kept, as torch's
# Heaviside(z, Θ(0)) -> the table's step: Θ(0) = 1 fires at equality (s = Θ(h - v_th) under fires_at ">="),
# Θ(0) = 0 strictly above (fires_at ">"); no other value at 0 has a spelling.
_STEPS: dict[sp.Expr, str] = {sp.Integer(1): "heaviside", sp.Integer(0): "heaviside_strict"}
_MAX_UNROLLED_POWER = 4


class CudaPrinter:
    """Prints sympy expressions as C expressions of one dtype's word type."""

    def __init__(self, dtype: DType | str, names: Mapping[sp.Symbol, str]):
        self.dtype = get_dtype(dtype)
        self.names = dict(names)
        self._used: dict[sp.Symbol, str] = {}  # the names the expression being printed used (`__call__`)

    def __call__(self, expr: sp.Basic) -> str:
        """The text of `expr`. A text is a function of the dtype, the expression and the names of its symbols, so
        an expression printed before (by any printer of this dtype) with the same names is not printed again: the
        kernels of one derivation in other options, layouts or storage dtypes print the same statements."""
        expr = sp.sympify(expr) if isinstance(expr, (int, float)) else expr
        printed = _printed(self.dtype).setdefault(expr, [])
        for text, names in printed:
            if all(self.names.get(symbol) == name for symbol, name in names):
                return text
        self._used = {}
        text = self.print(expr)
        if len(printed) < MAX_NAMINGS:
            printed.append((text, tuple(self._used.items())))
        return text

    def print(self, expr: sp.Basic) -> str:
        for cls in type(expr).__mro__:
            handler = _HANDLERS.get(cls)
            if handler is not None:
                return handler(self, expr)
        raise PrintError(f"cannot print {type(expr).__name__} ({expr}) as CUDA")

    # -- leaves -------------------------------------------------------------------------------------
    def _symbol(self, expr: sp.Symbol) -> str:
        try:
            name = self._used[expr] = self.names[expr]
            return name
        except KeyError:
            raise PrintError(f"symbol {expr} has no C name in this kernel") from None

    def _number(self, expr: sp.Expr) -> str:
        if expr.is_real is False:
            raise PrintError(f"non-real constant {expr} cannot be printed")
        return self.dtype.literal(float(expr))

    def _truth(self, expr: sp.logic.boolalg.BooleanAtom) -> str:
        """A condition sympy decided (`ITE(c, 0 < 1, 0 < x)` made `ITE(c, True, 0 < x)`): 1 or 0, as comparisons."""
        return self.dtype.literal(1.0 if expr == sp.true else 0.0)

    # -- arithmetic ---------------------------------------------------------------------------------
    def _op(self, name: str, *args: str) -> str:
        return self.dtype.op(name, *args)

    def _add(self, expr: sp.Add) -> str:
        terms = sorted(expr.args, key=lambda a: a.could_extract_minus_sign())
        text = self.print(terms[0])
        for term in terms[1:]:
            if term.could_extract_minus_sign():
                text = self._op("sub", text, self.print(-term))
            else:
                text = self._op("add", text, self.print(term))
        return text

    def _mul(self, expr: sp.Mul) -> str:
        coeff, rest = expr.as_coeff_Mul()
        if coeff == -1:
            return self._op("neg", self.print(rest))
        numer, denom = [], []
        for factor in sp.Mul.make_args(expr):
            base, exponent = factor.as_base_exp()
            if exponent.is_Number and exponent < 0 and not factor.is_Number:
                denom.append(sp.Pow(base, -exponent, evaluate=False) if exponent != -1 else base)
            elif factor.is_Rational and not factor.is_Integer and abs(factor.p) == 1:
                if factor.p < 0:
                    numer.append(sp.Integer(-1))
                denom.append(sp.Integer(factor.q))
            else:
                numer.append(factor)
        top = self._product(numer) if numer else self.dtype.literal(1.0)
        return self._op("div", top, self._product(denom)) if denom else top

    def _product(self, factors: list[sp.Expr]) -> str:
        if factors[0] == -1 and len(factors) > 1:
            return self._op("neg", self._product(factors[1:]))
        text = self.print(factors[0])
        for f in factors[1:]:
            text = self._op("mul", text, self.print(f))
        return text

    def _pow(self, expr: sp.Pow) -> str:
        base, exponent = expr.args
        if exponent == sp.Rational(1, 2):
            return self._op("sqrt", self.print(base))
        if exponent.is_Integer and 0 < abs(int(exponent)) <= _MAX_UNROLLED_POWER:
            b = self.print(base)
            text = b
            for _ in range(abs(int(exponent)) - 1):
                text = self._op("mul", text, b)
            return text if exponent > 0 else self._op("div", self.dtype.literal(1.0), text)
        if base == sp.E:
            return self._op("exp", self.print(exponent))
        return self._op("power", self.print(base), self.print(exponent))

    # -- functions ----------------------------------------------------------------------------------
    def _function(self, expr: sp.Function) -> str:
        name = _FUNCTIONS[type(expr)]
        return self._op(name, self.print(expr.args[0]))

    def _fold(self, expr: sp.Expr) -> str:
        name = next(v for k, v in _FOLDS.items() if isinstance(expr, k))
        texts = [self.print(a) for a in expr.args]
        text = texts[0]
        for t in texts[1:]:
            text = self._op(name, text, t)
        return text

    def _heaviside(self, expr: sp.Heaviside) -> str:
        name = _STEPS.get(expr.args[1]) if len(expr.args) > 1 else None
        if name is None:
            raise PrintError(f"only Heaviside with H(0) = 1 (fires at equality) or H(0) = 0 (strictly above) is "
                             f"supported, got {expr}")
        return self._op(name, self.print(expr.args[0]))

    def _relational(self, expr: sp.core.relational.Relational) -> str:
        name = next((v for k, v in _COMPARISONS.items() if isinstance(expr, k)), None)
        if name is None:
            raise PrintError(f"cannot print the comparison {expr} (only <, <=, >, >= are supported)")
        return self._op(name, self.print(expr.lhs), self.print(expr.rhs))

    def _and(self, expr: sp.And) -> str:
        texts = [self.print(a) for a in expr.args]
        text = texts[0]
        for t in texts[1:]:
            text = self._op("cond_and", text, t)
        return text

    def _ite(self, expr: sp.ITE) -> str:
        # a condition chosen by a condition: sympy writes `0 < where(c, a, b)` as ITE(c, 0 < a, 0 < b)
        condition, then, otherwise = expr.args
        return self._op("select", self.print(then), self.print(otherwise), self.print(condition))

    def _piecewise(self, expr: sp.Piecewise) -> str:
        *branches, (last_value, last_cond) = expr.args
        if last_cond != sp.true:
            raise PrintError(f"Piecewise without a default branch cannot be printed: {expr}")
        text = self.print(last_value)
        for value, cond in reversed(branches):
            text = self._op("select", self.print(value), text, self.print(cond))
        return text


_HANDLERS: dict[type, Callable[[CudaPrinter, sp.Basic], str]] = {
    sp.Symbol: CudaPrinter._symbol,
    sp.Number: CudaPrinter._number,
    sp.NumberSymbol: CudaPrinter._number,
    sp.logic.boolalg.BooleanAtom: CudaPrinter._truth,
    sp.Add: CudaPrinter._add,
    sp.Mul: CudaPrinter._mul,
    sp.Pow: CudaPrinter._pow,
    sp.Heaviside: CudaPrinter._heaviside,
    sp.Piecewise: CudaPrinter._piecewise,
    sp.And: CudaPrinter._and,
    sp.ITE: CudaPrinter._ite,
    sp.core.relational.Relational: CudaPrinter._relational,
    sp.Min: CudaPrinter._fold,
    sp.Max: CudaPrinter._fold,
    **{cls: CudaPrinter._function for cls in _FUNCTIONS},
}


MAX_PRINTED = 50_000  # expressions whose texts `CudaPrinter` keeps, per dtype
MAX_NAMINGS = 8  # texts kept per expression and dtype, each under other names of its symbols
_PRINTED: dict[int, tuple[DType, dict[sp.Basic, list[tuple[str, tuple[tuple[sp.Symbol, str], ...]]]]]] = {}


def _printed(dtype: DType) -> dict[sp.Basic, list[tuple[str, tuple[tuple[sp.Symbol, str], ...]]]]:
    """The texts printed in `dtype`: expression -> [(text, the (symbol, name) pairs it was printed with)]. Kept by
    the dtype's identity (its operations are not hashable; two records may share a name), with the record held so
    that its id is not reused."""
    kept = _PRINTED.get(id(dtype))
    if kept is None or kept[0] is not dtype or len(kept[1]) >= MAX_PRINTED:
        kept = _PRINTED[id(dtype)] = (dtype, {})
    return kept[1]


def print_expr(expr: sp.Basic, dtype: DType | str, names: Mapping[sp.Symbol, str]) -> str:
    """Convenience: print one expression."""
    return CudaPrinter(dtype, names)(expr)
