"""NIR's spiking neurons as ODE-form `NeuronSpec`s, with NIR's own parameter names.

NIR gives continuous dynamics (time in seconds) and leaves the time step to the simulator. Each spec here
states NIR's equations in `[ode]` form with the step `time_step` = dt, a hard reset to `v_reset` and a spike
where v exceeds `v_threshold` (`fires_at=">"`: NIR's v > v_threshold, where our default spikes at >=):

    LIF      tau dv/dt = (v_leak - v) + r x
    IF           dv/dt = r x
    CubaLIF  tau_syn di/dt = -i + w_in x,   tau_mem dv/dt = (v_leak - v) + r i

`method` picks how a step is integrated (autocuda.spec.ode): "euler" is v' = v + dt f(v, x) with every state
from its start-of-step value (Norse's step, and snnTorch's and SpikingJelly's LIF and IF); "semi_implicit" is
Euler with CubaLIF's current stepped first and the membrane stepped with the new current (snnTorch's Synaptic,
SpikingJelly's CUBALIFNode; a discrete spec, the same as "euler" for one-state neurons); "exact" the exact
solution with x held over the step. Every parameter is a runtime value: a float, or a tensor of per-neuron
values broadcast over the neuron shape. The membrane starts at v_leak (IF: at v_reset).
"""
from __future__ import annotations

import functools
from collections.abc import Mapping

from ...spec.model import NeuronSpec, Param, State

__all__ = ["NEURONS", "METHODS", "nir_spec", "spec_kind"]

METHODS = ("euler", "semi_implicit", "exact")

# NIR type name -> (NIR fields in order, states with their initial values, ODE per state)
NEURONS: Mapping[str, tuple[tuple[str, ...], Mapping[str, str], Mapping[str, str]]] = {
    "LIF": (("tau", "r", "v_leak", "v_threshold", "v_reset"), {"v": "v_leak"},
            {"v": "((v_leak - v) + r * x) / tau"}),
    "IF": (("r", "v_threshold", "v_reset"), {"v": "v_reset"}, {"v": "r * x"}),
    "CubaLIF": (("tau_syn", "tau_mem", "r", "v_leak", "v_threshold", "v_reset", "w_in"), {"v": "v_leak", "i": "0"},
                {"v": "((v_leak - v) + r * i) / tau_mem", "i": "(-i + w_in * x) / tau_syn"}),
}
# "semi_implicit" steps of two-state neurons: (charge with the current's new value, the current's update)
_CURRENT_FIRST = "i + time_step * (w_in * x - i) / tau_syn"
SEMI_IMPLICIT = {"CubaLIF": (f"v + time_step * ((v_leak - v) + r * ({_CURRENT_FIRST})) / tau_mem", _CURRENT_FIRST)}
_DEFAULTS = {"tau": 1e-3, "tau_syn": 1e-3, "tau_mem": 1e-3, "r": 1.0, "v_leak": 0.0, "v_threshold": 1.0,
             "v_reset": 0.0, "w_in": 1.0}


@functools.cache
def nir_spec(kind: str, method: str = "euler") -> NeuronSpec:
    """The spec of NIR neuron type `kind` ('LIF', 'IF', 'CubaLIF') integrated with `method`."""
    if kind not in NEURONS:
        raise ValueError(f"kind: NIR neuron types with a spec are {', '.join(NEURONS)}, got {kind!r}")
    if method not in METHODS:
        raise ValueError(f"method: expected one of {', '.join(METHODS)}, got {method!r}")
    if method == "semi_implicit" and kind not in SEMI_IMPLICIT:
        return nir_spec(kind, "euler")
    fields, states, ode = NEURONS[kind]
    params = tuple(Param(name, _DEFAULTS[name]) for name in fields) + (Param("time_step", 1e-4),)
    initial = tuple(State(name, float(init) if init[0].isdigit() else init) for name, init in states.items())
    name, doc = f"nir_{kind.lower()}_{method}", f"NIR {kind} ({method} step of dt = time_step)"
    if method == "semi_implicit":
        charge, current = SEMI_IMPLICIT[kind]
        return NeuronSpec(name=name, doc=doc, params=params, states=initial, charge=charge, reset="hard",
                          updates=(("i", current),), fires_at=">")
    return NeuronSpec(name=name, doc=doc, params=params, states=initial, ode=tuple(ode.items()), reset="hard",
                      method=method, fires_at=">")


def spec_kind(spec: NeuronSpec) -> tuple[str, str] | None:
    """(NIR type, method) of a spec built by `nir_spec`, else None."""
    for kind in NEURONS:
        for method in METHODS:
            if spec.name == f"nir_{kind.lower()}_{method}" and spec == nir_spec(kind, method):
                return kind, method
    return None
