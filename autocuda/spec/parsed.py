"""A spec's expressions in sympy form (`ParsedSpec`), the record `autocuda.spec.model.parse_spec` fills: every
field of a `NeuronSpec` parsed through the whitelist (`spec.parse`), an [ode] block integrated into its step."""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ..base.lazy import lazy_import

if TYPE_CHECKING:
    import sympy
else:
    sympy = lazy_import("sympy")

__all__ = ["ParsedSpec", "SPIKE_OUTPUT"]

SPIKE_OUTPUT = "s"  # the spike's symbol in a spec's expressions, and a spec's output by default


@dataclasses.dataclass(frozen=True, eq=False)
class ParsedSpec:
    """Sympy form of a spec. Expressions keep derived quantities as symbols; `expand` substitutes them."""

    x: sympy.Symbol
    h: sympy.Symbol
    s: sympy.Symbol
    param_symbols: Mapping[str, sympy.Symbol]
    state_symbols: Mapping[str, sympy.Symbol]
    derived_symbols: Mapping[str, sympy.Symbol]
    derived: Mapping[str, sympy.Expr]  # as written: params and earlier derived symbols
    derived_values: Mapping[str, sympy.Expr]  # fully substituted: params only
    charge: sympy.Expr
    threshold: sympy.Expr
    updates: Mapping[str, sympy.Expr]
    method: str | None = None  # the integration method of [ode], None for a discrete spec
    ode: Mapping[str, sympy.Expr] = dataclasses.field(default_factory=lambda: MappingProxyType({}))
    output: sympy.Expr | None = None  # the layer's output (states are their values after the step); None: s
    levels: tuple[sympy.Expr, ...] = ()  # the arguments of a multi-level spike's levels
    inputs: tuple[sympy.Symbol, ...] = ()  # every step input's symbol, in the spec's order (x is the first)

    @property
    def membrane(self) -> sympy.Symbol:
        return next(iter(self.state_symbols.values()))

    def __reduce__(self):
        # MappingProxyType does not pickle: ship plain dicts, wrap them again on the way in.
        values = (getattr(self, f.name) for f in dataclasses.fields(self))
        return (_parsed_spec, tuple(dict(v) if isinstance(v, MappingProxyType) else v for v in values))

    def expand(self, expr: sympy.Expr) -> sympy.Expr:
        """`expr` with every derived symbol replaced by its value in terms of params."""
        return expr.xreplace(self.derived_substitution())

    def derived_substitution(self) -> dict[sympy.Symbol, sympy.Expr]:
        """Each derived symbol's value in terms of params."""
        return {self.derived_symbols[n]: v for n, v in self.derived_values.items()}

    @property
    def charge_expanded(self) -> sympy.Expr:
        return self.expand(self.charge)

    @property
    def threshold_expanded(self) -> sympy.Expr:
        return self.expand(self.threshold)

    @property
    def updates_expanded(self) -> Mapping[str, sympy.Expr]:
        return MappingProxyType({n: self.expand(e) for n, e in self.updates.items()})


def _parsed_spec(*values: Any) -> ParsedSpec:
    fields: list[Any] = [MappingProxyType(v) if isinstance(v, dict) else v for v in values]
    return ParsedSpec(*fields)
