"""A spec's expressions in sympy form (`ParsedSpec`): every field of a `NeuronSpec` parsed through the whitelist
(`spec.parse`) within the parse stage's time budget, and an [ode] block integrated into the step it implies."""
from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from ..errors import SpecError
from ..lazy import lazy_import
from . import budget
from .ode import TIME_STEP, discretise, with_jump

if TYPE_CHECKING:
    import sympy

    from .model import NeuronSpec
else:
    sympy = lazy_import("sympy")

__all__ = ["ParsedSpec", "SPIKE_OUTPUT", "parse_spec"]

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


def _symbols(names: Any) -> dict[str, sympy.Symbol]:
    return {n: sympy.Symbol(n, real=True) for n in names}


def parse_spec(spec: NeuronSpec) -> ParsedSpec:
    """`spec`'s expressions in sympy form, parsed within the parse stage's time budget."""
    return budget.bounded(spec.origin, "charge", _parse_spec_expressions, spec)


def _parse_spec_expressions(spec: NeuronSpec) -> ParsedSpec:
    from .parse import parse_expression

    h, s = (sympy.Symbol(n, real=True) for n in ("h", "s"))
    inputs = _symbols(spec.inputs)
    x = next(iter(inputs.values()))
    params = _symbols(p.name for p in spec.params)
    states = _symbols(st.name for st in spec.states)
    options = dict(spec.options)

    def parse(text: str, symbols: Mapping[str, sympy.Symbol], field: str) -> sympy.Expr:
        try:
            return parse_expression(text, symbols, source=spec.origin, field=field, options=options)
        except SpecError as err:
            if err.symbol in ("h", "s") and field in ("charge", "threshold"):
                raise SpecError(f"{err.message}; 'h' and 's' exist only in updates", source=err.source,
                                field=err.field, symbol=err.symbol) from None
            raise

    derived_symbols: dict[str, sympy.Symbol] = {}
    derived: dict[str, sympy.Expr] = {}
    values: dict[str, sympy.Expr] = {}
    for name, text in spec.derived:
        derived[name] = parse(text, {**params, **derived_symbols}, f"derived.{name}")
        values[name] = budget.substituted(derived[name], {derived_symbols[n]: v for n, v in values.items()},
                                          source=spec.origin, field=f"derived.{name}", what="derived values")
        derived_symbols[name] = sympy.Symbol(name, real=True)
    known = {**states, **params, **derived_symbols}
    rhs = {n: parse(t, {**inputs, **known}, f"ode.{n}") for n, t in spec.ode}
    charge = None if spec.membrane in rhs else parse(spec.charge, {**inputs, **known}, "charge")
    threshold = parse(spec.threshold, known, "threshold")
    updates = {n: parse(t, {**inputs, "h": h, "s": s, **known}, f"updates.{n}") for n, t in spec.updates}
    output = parse(spec.output, {**inputs, "s": s, **known}, "output") if spec.output != SPIKE_OUTPUT else None
    levels = tuple(parse(lv.argument, {"h": h, **known}, f"levels[{i}].argument")
                   for i, lv in enumerate(spec.levels or ()))
    method = None
    if rhs:  # continuous dynamics: their discrete step gives the charge and/or updates (docs/ode.md)
        jumps = {n: parse(t, {**inputs, "h": h, **known}, f"jumps.{n}") for n, t in spec.jumps}
        with budget.working_on("method" if spec.method else "ode"):
            method, integrated = _integrate(spec, rhs, jumps, states, params[TIME_STEP], h, s)
        charge = integrated.pop(spec.membrane, charge)
        updates |= integrated
    ro = MappingProxyType
    return ParsedSpec(x, h, s, ro(params), ro(states), ro(derived_symbols), ro(derived), ro(values), charge,
                      threshold, ro(updates), method, ro(rhs), output, levels, tuple(inputs.values()))


def _integrate(spec: NeuronSpec, rhs: Mapping[str, sympy.Expr], jumps: Mapping[str, sympy.Expr],
               states: Mapping[str, sympy.Symbol], dt: sympy.Symbol, h: sympy.Symbol, s: sympy.Symbol
               ) -> tuple[str, dict[str, sympy.Expr]]:
    """The ODE states' values after one step (docs/ode.md), after-spike jumps applied."""
    step = discretise({states[n]: f for n, f in rhs.items()}, dt, spec.method)
    if step.note is not None:
        warnings.warn(f"{spec.origin}: spec {spec.name!r}: {step.note}", stacklevel=5)
    values = {u.name: e for u, e in step.values.items()}
    at_end = {states[n]: e for n, e in values.items()}
    at_end[states[spec.membrane]] = h  # in a jump the membrane is h (before reset), whether ODE or charge
    for name, jump in jumps.items():
        values[name] = with_jump(values[name], jump.xreplace(at_end), s)
    return step.method, values
