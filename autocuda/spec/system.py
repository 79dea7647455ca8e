"""From a parsed spec to the step equations the derivation works on: reset chosen, constants folded."""
from __future__ import annotations

from collections.abc import Mapping

import sympy as sp

from ..base.errors import SpecError
from .budget import bounded, substituted, working_on
from .derive import SPIKE, H, Reset, SpikeLevel, StepSystem
from .model import NeuronSpec, check_reset, runtime_params


def initial_value(spec: NeuronSpec, state: str, reset: Reset, values: Mapping[str, float]) -> float | str:
    """A state's initial value: a number, or the name of the parameter holding it (v_reset is 0 unless hard)."""
    init = next(s.init for s in spec.states if s.name == state)
    if init == "v_reset" and reset != "hard":
        return 0.0
    if isinstance(init, str) and init in values:
        return values[init]
    return init


def step_system(spec: NeuronSpec, reset: Reset | None = None, constants: Mapping[str, float] | None = None
                ) -> StepSystem:
    """The spec's step with a reset rule (default: the spec's) and its constant parameters as numbers.

    Under a soft reset or none, v_reset is taken as 0 wherever it appears (docs/semantics.md).
    """
    reset = reset or spec.reset
    check_reset(spec, reset)
    return bounded(spec.origin, "charge", _step_system, spec, reset, constants)


def _step_system(spec: NeuronSpec, reset: Reset, constants: Mapping[str, float] | None) -> StepSystem:
    parsed = spec.parsed()
    params = {p.name: p for p in spec.params}
    folded = {name: float(p.default) for name, p in params.items() if p.kind == "constant"}
    unknown = [name for name in constants or {} if name not in params]
    if unknown:  # folded nowhere: a misspelt name would leave its parameter at runtime, silently
        raise SpecError(f"{unknown[0]!r} is not a parameter (parameters: {', '.join(params)})", source=spec.origin,
                        field="constants", symbol=unknown[0])
    folded |= {k: float(v) for k, v in (constants or {}).items()}
    if reset != "hard" and "v_reset" in params:
        folded["v_reset"] = 0.0
    replace = {parsed.param_symbols[n]: sp.Float(v) for n, v in folded.items()}
    replace |= {parsed.h: H, parsed.s: SPIKE}

    def prepare(expr: sp.Expr, field: str) -> sp.Expr:
        with working_on(field):
            once = substituted(expr, parsed.derived_substitution(), source=spec.origin, field=field,
                               what="derived values")
            return substituted(once, replace, source=spec.origin, field=field,
                               what="derived values and constant parameters")

    kept = runtime_params(spec, reset)
    symbols = tuple(parsed.param_symbols[n] for n in kept if n not in folded)
    states = tuple(parsed.state_symbols.values())
    return StepSystem(
        x=parsed.x,
        states=states,
        params=symbols,
        learnable=tuple(parsed.param_symbols[p.name] for p in spec.params if p.learnable and p.name not in folded),
        charge=prepare(parsed.charge, "charge"),
        threshold=prepare(parsed.threshold, "threshold"),
        updates=tuple(prepare(parsed.updates[s.name], f"updates.{s.name}") for s in states[1:]),
        reset=reset,
        v_reset=parsed.param_symbols.get("v_reset") if reset == "hard" and "v_reset" not in folded else (
            sp.Float(folded["v_reset"]) if reset == "hard" else None),
        levels=tuple(SpikeLevel(_weight(level.weight), prepare(argument, f"levels[{i}].argument"), level.surrogate)
                     for i, (level, argument) in enumerate(zip(spec.levels or (), parsed.levels))),
        more_inputs=parsed.inputs[1:],
        fires_at=spec.fires_at,
        output=prepare(parsed.output if parsed.output is not None else parsed.s, "output")
        if spec.writes_output else None,
    )


def _weight(value: float) -> sp.Expr:
    """A level's weight as sympy: an integer where it is one (a spike of ±1 prints as one)."""
    return sp.Integer(int(value)) if float(value).is_integer() else sp.Float(value)
