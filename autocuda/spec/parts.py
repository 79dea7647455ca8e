"""The parts of a neuron spec: its parameters (`Param`), states (`State`) and spike levels (`Level`), each a frozen
record checked on construction, and the rules that turn a TOML table or a Python value into a tuple of them
(SpecErrors name the field). `autocuda.spec.model.NeuronSpec` holds them; they know no spec."""
from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Mapping
from typing import Any, Literal

from ..base.errors import SpecError
from . import domain
from .domain import Bound
from .surrogate import Surrogate, get_surrogate

__all__ = ["Kind", "Level", "Param", "State"]


Kind = Literal["constant", "scalar", "tensor"]
KINDS = ("constant", "scalar", "tensor")


def finite_number(value: Any, field: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not math.isfinite(float(value)):
        raise SpecError(f"expected a finite number, got {value!r}", field=field)
    return float(value)


def expect(value: Any, kind: type | tuple[type, ...], field: str, what: str) -> Any:
    if not isinstance(value, kind) or isinstance(value, bool) is not (kind is bool):
        raise SpecError(f"expected {what}, got {type(value).__name__} {value!r}", field=field)
    return value


@dataclasses.dataclass(frozen=True)
class Param:
    """A parameter: a compile-time constant, a runtime scalar, or a (possibly learnable) tensor."""

    name: str
    default: float
    kind: Kind | None = None  # None: 'tensor' when learnable, else 'scalar'
    learnable: bool = False
    doc: str = ""
    domain: str = ""  # the values it may take, e.g. "> 0" or ">= 1, <= 100" (autocuda.spec.domain)

    def __post_init__(self) -> None:
        field = f"params.{self.name}"
        object.__setattr__(self, "default", finite_number(self.default, f"{field}.default"))
        expect(self.learnable, bool, f"{field}.learnable", "true or false")
        expect(self.doc, str, f"{field}.doc", "a string")
        try:
            problem = domain.problem(domain.parse_domain(self.domain), self.default)
        except ValueError as error:
            raise SpecError(f"invalid domain: {error}", field=f"{field}.domain") from None
        if problem is not None:
            raise SpecError(f"the default {problem}", field=f"{field}.default")
        kind = self.kind if self.kind is not None else ("tensor" if self.learnable else "scalar")
        if kind not in KINDS:
            raise SpecError(f"kind must be one of {', '.join(KINDS)}, got {kind!r}", field=f"{field}.kind",
                            symbol=str(kind))
        if self.learnable and kind != "tensor":
            raise SpecError(f"a learnable parameter must be a tensor, not {kind!r}", field=f"{field}.kind",
                            symbol=kind)
        object.__setattr__(self, "kind", kind)

    @property
    def bounds(self) -> tuple[Bound, ...]:
        return domain.parse_domain(self.domain)

    def check(self, value: float, spec: str | None = None) -> None:
        """Refuse a number outside the parameter's domain with a ValueError naming both (and the spec, if given,
        as a call's check does)."""
        problem = domain.problem(self.bounds, value)
        if problem is not None:
            of = "" if spec is None else f" of {spec!r}"
            raise ValueError(f"parameter {self.name!r}{of} {problem}")


@dataclasses.dataclass(frozen=True)
class State:
    """A state variable and its initial value: a number, or the name of a parameter."""

    name: str
    init: float | str = 0.0

    def __post_init__(self) -> None:
        if not isinstance(self.init, str):
            object.__setattr__(self, "init", finite_number(self.init, f"states.{self.name}"))


@dataclasses.dataclass(frozen=True)
class Level:
    """One level of a multi-level spike: `weight` where `argument` (of h, states, params) is >= 0 (> 0 where the
    neuron's `fires_at` is ">"), with its own surrogate gradient (None: the neuron's)."""

    argument: str
    weight: float = 1.0
    surrogate: Surrogate | None = None

    def check(self, field: str) -> Level:
        """This level with its surrogate built and its fields checked; SpecErrors name `field`'s parts."""
        expect(self.argument, str, f"{field}.argument", "an expression string")
        weight = finite_number(self.weight, f"{field}.weight")
        if weight == 0:
            raise SpecError("a level's weight must not be 0", field=f"{field}.weight")
        try:
            surrogate = None if self.surrogate is None else get_surrogate(self.surrogate).frozen()
        except SpecError as err:
            raise err.with_source(err.source, field) from None
        return Level(self.argument, weight, surrogate)


_LEVEL_KEYS = tuple(f.name for f in dataclasses.fields(Level))


def normalise_levels(value: Any) -> tuple[Level, ...] | None:
    if value is None:
        return None
    if not isinstance(value, (list, tuple)) or not value:
        raise SpecError("expected a non-empty list of levels ([[levels]] tables)", field="levels")
    levels = []
    for i, level in enumerate(value):
        field = f"levels[{i}]"
        if isinstance(level, Mapping):
            unknown = [k for k in level if k not in _LEVEL_KEYS]
            if unknown:
                raise SpecError(f"unknown key {unknown[0]!r} (allowed: {', '.join(_LEVEL_KEYS)})",
                                field=f"{field}.{unknown[0]}", symbol=str(unknown[0]))
            if "argument" not in level:
                raise SpecError("missing 'argument'", field=f"{field}.argument")
            level = Level(**level)
        if not isinstance(level, Level):
            raise SpecError(f"expected a table or a Level, got {type(level).__name__}", field=field)
        levels.append(level.check(field))
    return tuple(levels)


def pairs(value: Any, field: str) -> tuple[tuple[str, Any], ...]:
    """A mapping or a sequence of (name, value) pairs, as a tuple of pairs."""
    if isinstance(value, Mapping):
        return tuple(value.items())
    if isinstance(value, (list, tuple)) and all(isinstance(p, (list, tuple)) and len(p) == 2 for p in value):
        for name, _ in value:
            expect(name, str, field, "a table whose names are strings")
        return tuple((p[0], p[1]) for p in value)
    raise SpecError("expected a table of name = value entries", field=field)


_PARAM_KEYS = tuple(f.name for f in dataclasses.fields(Param) if f.name != "name")


def _make_param(name: str, value: Any) -> Param:
    if isinstance(value, Param):
        if value.name != name:
            raise SpecError(f"Param named {value.name!r} listed as {name!r}", field=f"params.{name}", symbol=name)
        return value
    if not isinstance(value, Mapping):
        return Param(name, value)
    for key in value:
        if key not in _PARAM_KEYS:
            raise SpecError(f"unknown key {key!r} (allowed: {', '.join(_PARAM_KEYS)})",
                            field=f"params.{name}.{key}", symbol=str(key))
    if "default" not in value:
        raise SpecError("missing 'default'", field=f"params.{name}.default")
    return Param(name, **value)


def normalise_params(value: Any) -> tuple[Param, ...]:
    if isinstance(value, (list, tuple)) and all(isinstance(p, Param) for p in value):
        return tuple(value)
    return tuple(_make_param(n, v) for n, v in pairs(value, "params"))


def normalise_states(value: Any) -> tuple[State, ...]:
    if isinstance(value, (list, tuple)) and all(isinstance(s, State) for s in value):
        return tuple(value)
    return tuple(State(n, v) for n, v in pairs(value, "states"))


def normalise_inputs(value: Any) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, (list, tuple)) or not value:
        raise SpecError(f"expected a non-empty list of input names, got {value!r}", field="inputs")
    return tuple(expect(name, str, f"inputs[{i}]", "an input name") for i, name in enumerate(value))


def text_pairs(value: Any, field: str) -> tuple[tuple[str, str], ...]:
    return tuple((n, expect(t, str, f"{field}.{n}", "an expression string")) for n, t in pairs(value, field))
