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
from conftest import profile

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


# -- the coupled 2x2 step's derivatives where branches meet ------------------------------------------------------
def test_the_coupled_step_has_the_matrix_exponentials_slope_at_repeated_eigenvalues():
    """At q = 0 (equal rates, one coupling 0) the step took c0 = e^{mu dt}, c1 = dt e^{mu dt}, right in value but
    flat in q: its derivative by the other coupling missed e^{mu dt} dt^2/2 (c0) and e^{mu dt} dt^3/6 (c1)."""
    from autocuda.spec.ode import exp_2x2

    a, b, c, dt = sp.symbols("a b c dt", real=True)
    c0, c1, _, _, N = exp_2x2(sp.Matrix([[a, b], [c, a]]), dt)
    E = c0 * sp.eye(2) + c1 * N
    at = {a: -0.5, b: 0.0, c: 1.0, dt: 0.7}
    got = [[float(sp.diff(E[i, j], b).xreplace(at)) for j in range(2)] for i in range(2)]
    coupling = torch.tensor(0.0, dtype=torch.float64, requires_grad=True)
    A = torch.stack([torch.stack([torch.tensor(-0.5, dtype=torch.float64), coupling]),
                     torch.tensor([1.0, -0.5], dtype=torch.float64)])
    want = [[torch.autograd.grad(torch.linalg.matrix_exp(A * 0.7)[i, j], coupling, retain_graph=True)[0].item()
             for j in range(2)] for i in range(2)]
    assert got == [pytest.approx(row, rel=1e-12, abs=1e-14) for row in want]


@pytest.mark.parametrize("values", [{"g_c": 1.0, "tau": 2.0, "tau_d": 4.0}, {"g_c": 0.0, "tau": 3.0, "tau_d": 3.0}])
def test_learnable_coefficients_of_a_coupled_step_get_finite_gradients_on_the_reference(values):
    """The reference differentiates every branch of the step with autograd, also those not taken: a root guarded
    outside (where(q < 0, sqrt(-q), 1)) was NaN where q > 0, and 0 times its NaN slope made g_c's, tau's and tau_d's
    gradients NaN. The membrane (no spike: a threshold out of reach) is smooth in them: its gradients are the
    central differences'."""
    from autocuda import nn as ann

    x = torch.rand(5, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(3)) * 2

    def membrane(**given):
        layer = ann.Neuron("two_compartment", step_mode="m", backend="reference", store_v_seq=True,
                           v_threshold=1e9, **given)
        layer(x)
        return layer.v_seq.sum()

    params = {name: torch.nn.Parameter(torch.tensor(value, dtype=torch.float64)) for name, value in values.items()}
    grads = torch.autograd.grad(membrane(**params), list(params.values()))
    for (name, value), grad in zip(values.items(), grads):
        step = 1e-6
        up, down = (membrane(**{**values, name: value + d}).item() for d in (step, -step))
        assert grad.item() == pytest.approx((up - down) / (2 * step), rel=1e-6, abs=1e-8), name


@pytest.mark.skipif(profile() != "slow", reason="derives and compiles a coupled step with three learnable "
                    "coefficients (seconds of sympy): in the slow profile")
def test_learnable_coefficients_of_a_coupled_step_get_the_references_gradients_on_the_host(monkeypatch):
    """The host kernels' gradients of g_c, tau and tau_d equal the reference's where q > 0, at q = 0 and with a
    negative coupling. The symbolic budget (CPU time, which the machine's load moves) is lifted: this test checks
    the gradients, not the budget."""
    from autocuda import nn as ann
    from autocuda.spec import budget

    monkeypatch.setenv(budget.BUDGET_VARIABLE, "120")
    x = torch.rand(6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(1)) * 2
    weights = torch.arange(24.0, dtype=torch.float64).view(6, 4)
    for values in ({"g_c": 1.0, "tau": 2.0, "tau_d": 4.0}, {"g_c": 0.0, "tau": 3.0, "tau_d": 3.0},
                   {"g_c": -0.3, "tau": 2.0, "tau_d": 5.0}):
        found = {}
        for backend in ("reference", "host"):
            params = {k: torch.nn.Parameter(torch.tensor([v], dtype=torch.float64)) for k, v in values.items()}
            given = x.clone().requires_grad_()
            out = ann.Neuron("two_compartment", step_mode="m", backend=backend, **params)(given)
            (out * weights).sum().backward()
            found[backend] = (out, given.grad, *(p.grad for p in params.values()))
        reference, host = found["reference"], found["host"]
        assert torch.equal(reference[0], host[0])
        for want, got in zip(reference[1:], host[1:]):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


# -- three triangular states whose time constants coincide -------------------------------------------------------
CASCADE = {"v": "-v / tau + i2", "i2": "-i2 / tau2 + i1", "i1": "-i1 / tau1 + x"}


@pytest.mark.parametrize("taus", [(3.0, 5.0, 2.0), (2.0, 2.0, 2.0), (3.0, 3.0, 2.0), (2.0, 5.0, 2.0)],
                         ids=["distinct", "all-equal", "tau1=tau2", "tau1=tau"])
def test_three_triangular_states_step_by_the_matrix_exponential_also_where_rates_coincide(taus):
    """sympy's exponential of a triangular A divides by the rates' differences: equal time constants at run time
    (tau1 = tau2 = tau, a cascade of equal filters) gave 0/0, NaN states. The step is the exponential of the
    augmented system [[A, b], [0, 0]], in value and in its derivatives by the time constants."""
    parsed = NeuronSpec("cascade", params={**PARAMS, "tau1": 3.0, "tau2": 5.0}, states={"v": 0.0, "i1": 0.0, "i2": 0.0},
                        ode=CASCADE).parsed()
    assert parsed.method == "exact"
    sym = {**parsed.param_symbols, **parsed.state_symbols}
    names = ("tau1", "tau2", "tau")
    at = {sym["v"]: 0.3, sym["i1"]: -0.2, sym["i2"]: 0.5, parsed.x: 0.8, sym[TIME_STEP]: 0.9,
          **{sym[n]: value for n, value in zip(names, taus)}}
    step = [parsed.charge, parsed.updates["i1"], parsed.updates["i2"]]
    got = [float(e.xreplace(at)) for e in step]
    got_slopes = [[float(sp.diff(e, sym[n]).xreplace(at)) for n in names] for e in step]
    rates = torch.tensor(taus, dtype=torch.float64, requires_grad=True)
    zero = torch.zeros((), dtype=torch.float64)
    one = torch.ones((), dtype=torch.float64)
    # states (v, i1, i2, 1): dv = -v/tau + i2, di1 = -i1/tau1 + x, di2 = -i2/tau2 + i1
    M = torch.stack([torch.stack([-1 / rates[2], zero, one, zero]),
                     torch.stack([zero, -1 / rates[0], zero, 0.8 * one]),
                     torch.stack([zero, one, -1 / rates[1], zero]),
                     torch.stack([zero, zero, zero, zero])])
    want = torch.linalg.matrix_exp(M * 0.9) @ torch.tensor([0.3, -0.2, 0.5, 1.0], dtype=torch.float64)
    assert got == pytest.approx(want[:3].tolist(), rel=1e-12, abs=1e-14)
    for row, value in zip(got_slopes, want[:3]):
        slopes = torch.autograd.grad(value, rates, retain_graph=True)[0].tolist()
        assert row == pytest.approx(slopes, rel=1e-10, abs=1e-13)
