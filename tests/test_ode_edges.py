"""Edges of the ODE integrators (autocuda.spec.ode) that specs reach through `[ode]`: an equation that a state
switches between branches (`where(v > ..., ...)`) is not linear in that state, so `exact` and `exponential_euler`
refuse it (naming the field and the state) and the automatic choice falls back to `euler`, instead of dropping the
state's term; and a coupled two-state linear system whose coefficients hold a `where` of the input or parameters
integrates exactly per branch, so its kernels print (no And / Or / ITE conditions) and its step is the matrix
exponential's on each side of the branch."""
from __future__ import annotations

import pytest
import sympy as sp
import torch

from autocuda.base.errors import SpecError
from autocuda.spec import NeuronSpec
from autocuda.spec.ode import TIME_STEP

PARAMS = {"tau": 2.0, "v_threshold": 1.0, "v_reset": 0.0}


def ode_spec(ode: dict, states: dict | None = None, **fields) -> NeuronSpec:
    return NeuronSpec("n", params=PARAMS, states=states or {"v": "v_reset"}, ode=ode, **fields)


# -- a state in a branch condition ------------------------------------------------------------------------------
@pytest.mark.parametrize("method", ["exact", "exponential_euler"])
def test_a_state_choosing_a_branch_is_refused_by_the_linear_methods(method):
    """d/dv of where(v > 0.5, -1, 0) is 0 wherever it exists, but the ODE is not linear in v: both methods used to
    accept it and integrate v' = v + dt x, the where dropped."""
    with pytest.raises(SpecError) as caught:
        ode_spec({"v": "where(v > 0.5, -1.0, 0.0) + x"}, method=method).parsed()
    assert (caught.value.field, caught.value.symbol) == ("ode.v", "v")


def test_a_state_choosing_a_branch_is_integrated_by_euler_by_default():
    parsed = ode_spec({"v": "where(v > 0.5, -1.0, 0.0) + x"}).parsed()
    assert parsed.method == "euler"
    v, x, dt = parsed.state_symbols["v"], parsed.x, parsed.param_symbols[TIME_STEP]
    at = {x: 0.25, dt: 1.0}
    assert float(parsed.charge.xreplace({**at, v: 0.75})) == pytest.approx(0.75 + 0.25 - 1.0)
    assert float(parsed.charge.xreplace({**at, v: 0.25})) == pytest.approx(0.25 + 0.25)


def test_another_state_choosing_a_branch_is_frozen_by_exponential_euler_and_refused_by_exact():
    """Exponential Euler freezes the other states over the step, branch conditions included; exact needs the whole
    system linear, so it names the state in the condition."""
    ode, states = {"v": "-v / tau + where(w > 0, 1.0, 0.0)", "w": "-w + x"}, {"v": "v_reset", "w": 0.0}
    assert ode_spec(ode, states).parsed().method == "exponential_euler"
    with pytest.raises(SpecError) as caught:
        ode_spec(ode, states, method="exact").parsed()
    assert (caught.value.field, caught.value.symbol) == ("ode.v", "w")
    assert "where" in caught.value.message


# -- a coupled system with a `where` in its coefficients --------------------------------------------------------
WHERE_IN_A = {"v": "-v / where(x > 0, tau, 2 * tau) + u", "u": "-0.7 * u + x - v"}


def test_coupled_system_with_a_where_in_its_coefficients_prints():
    """The step branched on the sign of q with the where inside q; sympy made that condition an Or, and printing
    the kernels raised PrintError ('cannot print Or')."""
    spec = ode_spec(WHERE_IN_A, {"v": 0.2, "u": -0.1})
    parsed = spec.parsed()
    assert parsed.method == "exact"
    assert not parsed.charge.has(sp.Or, sp.And, sp.ITE)
    assert "__global__" in spec.source("fptt", "float32")


@pytest.mark.parametrize("x_value", [0.8, -0.6])
def test_coupled_system_with_a_where_in_its_coefficients_steps_by_the_matrix_exponential(x_value):
    parsed = ode_spec(WHERE_IN_A, {"v": 0.2, "u": -0.1}).parsed()
    v, u = parsed.state_symbols["v"], parsed.state_symbols["u"]
    x, dt = parsed.x, parsed.param_symbols[TIME_STEP]
    at = {x: x_value, v: 0.3, u: -0.4, dt: 0.9, parsed.param_symbols["tau"]: 2.0}
    got = [float(parsed.charge.xreplace(at)), float(parsed.updates["u"].xreplace(at))]
    tau = 2.0 if x_value > 0 else 4.0
    M = torch.tensor([[-1 / tau, 1.0, 0.0], [-1.0, -0.7, x_value], [0.0, 0.0, 0.0]], dtype=torch.float64)
    E = torch.linalg.matrix_exp(M * 0.9)
    want = E @ torch.tensor([0.3, -0.4, 1.0], dtype=torch.float64)
    assert got == pytest.approx(want[:2].tolist(), rel=1e-12, abs=1e-14)


@pytest.mark.parametrize("value", [-1.0, 0.0, float("nan")])
def test_a_time_step_given_at_run_time_must_be_positive(value):
    """The spec checked its default alone: a layer built with time_step=-1 ran the step backwards, silently."""
    from autocuda import nn as ann
    from autocuda.call import functional as F

    with pytest.raises(ValueError, match="parameter 'time_step' of 'two_compartment' must be > 0"):
        ann.Neuron("two_compartment", step_mode="m", backend="reference", time_step=value)(torch.rand(3, 2))
    with pytest.raises(ValueError, match="parameter 'time_step' of 'two_compartment' must be > 0"):
        F.multi_step("two_compartment", torch.rand(3, 2), time_step=value, backend="reference")
