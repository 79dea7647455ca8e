"""Python step functions traced into specs (autocuda.spec.trace, autocuda.spec.python): every shipped neuron
written in Python gives the TOML spec's step, LIF and ALIF give byte-identical kernels, both libraries'
surrogates are recognised, and what a kernel cannot do is refused at the user's line."""
from __future__ import annotations

import math

import pytest
import torch

import autocuda
from autocuda.base.errors import SpecError
from autocuda.call import functional as F
from autocuda.spec.python import EXPRESSION, SPIKE, STATE, expression_text, load_python_spec, neuron, step_spec
from autocuda.spec.step import StepSpec
from autocuda.spec.surrogate import SURROGATES, ATan, Custom, Sigmoid, get_surrogate
from autocuda.toolchain.host import cxx as toolchain

sj_surrogate = pytest.importorskip("spikingjelly.activation_based.surrogate")

sg = Sigmoid()
KERNELS = ("fptt", "bptt", "step-forward", "step-backward")
DTYPES = ("float32", "float16", "bfloat16", "float64")


# ---- the shipped neurons, in Python ----

@neuron(initial={"v": "v_reset"}, domains={"tau": "> 0"})
def lif(x, v, tau=2.0, v_threshold=1.0, v_reset=0.0):
    """Leaky integrate-and-fire (SpikingJelly LIFNode): h = v + (x - (v - v_reset)) / tau"""
    h = v + (x - (v - v_reset)) / tau
    s = sg(h - v_threshold)
    return s, h * (1 - s) + v_reset * s


@neuron(initial={"v": "v_reset"}, domains={"tau": "> 0", "tau_a": "> 0"})
def alif(x, v, a, tau=2.0, tau_a=20.0, beta=0.2, v_threshold=1.0, v_reset=0.0):
    """Adaptive-threshold LIF (LSNN-style): threshold v_threshold + beta * a, a decays by rho and jumps by each spike"""
    h = v + (x - (v - v_reset)) / tau
    s = sg(h - (v_threshold + beta * a))
    rho = torch.exp(-1 / tau_a)
    return s, h * (1 - s) + v_reset * s, rho * a + s


@neuron(initial={"v": "v_reset"})
def if_(x, v, v_threshold=1.0, v_reset=0.0):
    h = v + x
    s = sg(h - v_threshold)
    return s, h * (1 - s) + v_reset * s


@neuron(learnable=("w",), initial={"v": "v_reset"})
def parametric_lif(x, v, w=0.0, v_threshold=1.0, v_reset=0.0):
    h = v + (x - (v - v_reset)) * torch.sigmoid(w)
    s = sg(h - v_threshold)
    return s, h - s * (h - v_reset)


@neuron(initial={"v": "v_reset"})
def qif(x, v, tau=2.0, v_c=0.8, a0=1.0, v_rest=0.0, v_threshold=1.0, v_reset=-0.1):
    h = v + (x + a0 * (v - v_rest) * (v - v_c)) / tau
    s = sg(h - v_threshold)
    return s, h * (1 - s) + v_reset * s


@neuron(initial={"v": "v_reset"})
def eif(x, v, tau=2.0, delta_T=1.0, theta_rh=0.8, v_rest=0.0, v_threshold=1.0, v_reset=-0.1):
    h = v + (x + v_rest - v + delta_T * torch.exp((v - theta_rh) / delta_T)) / tau
    s = sg(h - v_threshold)
    return s, h * (1 - s) + v_reset * s


@neuron(initial={"v": "v_reset"})
def izhikevich(x, v, w, tau=2.0, v_c=0.8, a0=1.0, v_rest=-0.1, tau_w=2.0, a=0.0, b=0.0, v_threshold=1.0,
               v_reset=0.0):
    h = v + (x + a0 * (v - v_rest) * (v - v_c) - w) / tau
    s = sg(h - v_threshold)
    return s, h * (1 - s) + v_reset * s, w + (a * (h - v_rest) - w) / tau_w + b * s


@neuron(initial={"v": "v_reset"})
def adex(x, v, w, tau=2.0, delta_T=1.0, theta_rh=0.8, v_rest=0.0, R=1.0, tau_w=2.0, a=0.1, b=0.1,
         v_threshold=1.0, v_reset=-0.1):
    h = v + (-(v - v_rest) + delta_T * torch.exp((v - theta_rh) / delta_T) + R * x - w) / tau
    s = sg(h - v_threshold)
    return s, h * (1 - s) + v_reset * s, w + (a * (h - v_rest) - w) / tau_w + b * s


def _phi(a, dt):
    """(exp(a dt) - 1) / a: the integral of exp(a t) over a step."""
    return (torch.exp(a * dt) - 1) / a


@neuron(initial={"v": "v_reset"})
def sfa_lif(x, v, w, tau=2.0, tau_w=10.0, b=0.2, R=1.0, v_rest=0.0, v_threshold=1.0, v_reset=0.0, time_step=1.0):
    # exact step of dv/dt = (-(v - v_rest) + R x - w)/tau, dw/dt = -w/tau_w (tau != tau_w)
    decay = torch.exp(-time_step / tau)
    coupling = torch.exp(-time_step / tau) * _phi(1 / tau - 1 / tau_w, time_step) / tau
    h = v * decay + (R * x + v_rest) * (1 - decay) - w * coupling
    s = sg(h - v_threshold)
    return s, h * (1 - s) + v_reset * s, w * torch.exp(-time_step / tau_w) + b * s


@neuron(initial={"v": "v_reset"})
def cuba_lif(x, v, i, tau=2.0, tau_syn=5.0, R=1.0, v_rest=0.0, v_threshold=1.0, v_reset=0.0, time_step=1.0):
    # exact step of di/dt = -i/tau_syn + x, dv/dt = (-(v - v_rest) + R i)/tau (tau != tau_syn)
    e_v, e_i = torch.exp(-time_step / tau), torch.exp(-time_step / tau_syn)
    i_new = i * e_i + x * tau_syn * (1 - e_i)
    k = 1 / tau - 1 / tau_syn
    h = (v * e_v + v_rest * (1 - e_v) + R * (i - x * tau_syn) * (e_i - e_v) / (tau * k)
         + R * x * tau_syn * (1 - e_v))
    s = sg(h - v_threshold)
    return s, h * (1 - s) + v_reset * s, i_new


@neuron(initial={"v": "v_reset", "w": -0.6})
def fitzhugh_nagumo(x, v, w, tau=1.0, tau_w=12.5, a=0.7, b=0.8, R=1.0, time_step=0.5, v_threshold=1.0,
                    v_reset=-1.2):
    h = v + time_step * (v - v ** 3 / 3 - w + R * x) / tau
    s = sg(h - v_threshold)
    return s, h * (1 - s) + v_reset * s, w + time_step * (v + a - b * w) / tau_w


@neuron(initial={"v": "v_reset"})
def resonate_fire(x, v, u, b=-0.1, omega=1.0, v_threshold=1.0, v_reset=0.0, time_step=1.0):
    # exact step of d(v + iu)/dt = (b + i omega)(v + iu) + x (omega != 0)
    g = torch.exp(b * time_step)
    c, sn = g * torch.cos(omega * time_step), g * torch.sin(omega * time_step)
    norm = b * b + omega * omega
    re, im = ((c - 1) * b + sn * omega) / norm, (sn * b - (c - 1) * omega) / norm
    h = v * c - u * sn + x * re
    s = sg(h - v_threshold)
    return s, h * (1 - s) + v_reset * s, v * sn + u * c + x * im


@neuron(initial={"v": "v_reset"})
def raf(x, v, u, b=-0.2, omega=1.0, step_dt=1.0, v_threshold=1.0, v_reset=0.0):
    decay = torch.exp(b * step_dt)
    cos, sin = torch.cos(omega * step_dt), torch.sin(omega * step_dt)
    h = decay * (u * sin + v * cos)
    s = sg(h - v_threshold)
    return s, h * (1 - s) + v_reset * s, decay * (u * cos - v * sin) + x


@neuron(initial={"v": "v_reset"})
def cuba_lif_discrete(x, v, c, c_decay=0.5, v_decay=0.75, v_threshold=0.5, v_reset=0.0):
    c = c * c_decay + x
    h = v * v_decay + c
    s = sg(h - v_threshold)
    return s, h * (1 - s) + v_reset * s, c


@neuron(learnable=("k",), initial={"v": "v_reset"})
def klif(x, v, tau=2.0, k=1.0, v_threshold=1.0, v_reset=0.0):
    h = torch.relu(k * (v + (x - (v - v_reset)) / tau))
    s = sg(h - v_threshold)
    return s, h * (1 - s) + v_reset * s


@neuron()
def nonspiking_if(x, v):
    h = v + x
    s = sg(h - 1)  # never read: the layer's output is v
    return s, h


@neuron()
def nonspiking_lif(x, v, tau=2.0):
    h = v + (x - v) / tau
    s = sg(h - 1)
    return s, h


@neuron(initial={"v": "v_reset"})
def liaf(x, v, v_charged, tau=2.0, v_threshold=1.0, v_reset=0.0):
    h = v + (x - (v - v_reset)) / tau
    s = sg(h - v_threshold)
    return s, h * (1 - s) + v_reset * s, h


@neuron()
def clif(x, v_charged, v, m, tau=2.0, v_threshold=1.0):
    h = v - v / tau + x
    s = sg(h - v_threshold)
    m = m * torch.sigmoid(h / tau) + s
    return s, h, h - s * (v_threshold + torch.sigmoid(m)), m


@neuron(num_inputs=2, initial={"v": "v_reset"}, domains={"tau": "> 0"})
def conductance_lif(g_e, g_i, v, tau=2.0, E_e=3.0, E_i=-1.0, v_rest=0.0, v_threshold=1.0, v_reset=0.0):
    h = v + (g_e * (E_e - v) + g_i * (E_i - v) - (v - v_rest)) / tau
    s = sg(h - v_threshold)
    return s, h * (1 - s) + v_reset * s


@neuron(learnable=("alpha", "gamma", "tau", "v_threshold", "linear_decay", "v_subreset"))
def gated_lif(x, v, s_prev, alpha=0.0, gamma=0.0, tau=-1.0986122886681098, v_threshold=0.0,
              linear_decay=-3.6635616461296463, v_subreset=0.0):
    decay = 1 - torch.sigmoid(alpha) * (1 - torch.sigmoid(tau))
    h = (decay * v * (1 - torch.sigmoid(gamma) * s_prev) - (1 - torch.sigmoid(alpha)) * torch.sigmoid(linear_decay)
         + x - (1 - torch.sigmoid(gamma)) * torch.sigmoid(v_subreset) * s_prev)
    s = sg(h - torch.sigmoid(v_threshold))
    return s, h, s


PYTHON = {"lif": lif, "alif": alif, "if": if_, "parametric_lif": parametric_lif, "qif": qif, "eif": eif,
          "izhikevich": izhikevich, "adex": adex, "sfa_lif": sfa_lif, "cuba_lif": cuba_lif,
          "fitzhugh_nagumo": fitzhugh_nagumo, "resonate_fire": resonate_fire, "raf": raf,
          "cuba_lif_discrete": cuba_lif_discrete, "klif": klif, "nonspiking_if": nonspiking_if,
          "nonspiking_lif": nonspiking_lif, "liaf": liaf, "clif": clif, "conductance_lif": conductance_lif,
          "gated_lif": gated_lif}
# Not written here: two_compartment (its exact step is a general 2x2 matrix exponential; expressible, but long);
# the multi-level spikes (ternary_if, ternary_lif, ilif): a traced step fires through one surrogate call;
# noisy_cuba_lif, whose one input draw reaches both the charge and c's update (c = h - v_decay * v), which a traced
# step writes as two equations holding the draw (refused: they would be two draws).
# the multi-level spikes of SpikingJelly's classes (activation_aware_if, stbif, dsr): as ternary_if.
NOT_WRITTEN = {"two_compartment", "ternary_if", "ternary_lif", "ilif", "activation_aware_if", "dsr", "noisy_cuba_lif",
               "stbif"}


def test_every_shipped_spec_is_written_or_listed() -> None:
    missing = {n for n, _ in autocuda.list_specs()} - set(PYTHON) - NOT_WRITTEN
    assert not missing, f"write {sorted(missing)} as Python step functions here (or list them in NOT_WRITTEN)"


def _run(spec, xs, params, surrogate):
    """(spikes, state sequences, the gradient of each step input) over `xs`, one sequence per input."""
    xs = tuple(x.clone().requires_grad_() for x in xs)
    spikes, finals, seqs = F.multi_step(spec, xs, backend="reference", store_state_seq=True, surrogate=surrogate,
                                        **params)
    loss = (spikes * torch.linspace(0.5, 1.5, spikes.numel(), dtype=spikes.dtype).reshape(spikes.shape)).sum()
    loss = loss + sum((q * (k + 1)).sum() for k, q in enumerate(seqs))
    return spikes, seqs, torch.autograd.grad(loss, xs)


@pytest.mark.parametrize("name", sorted(PYTHON))
def test_python_neuron_steps_as_its_toml_spec(name: str) -> None:
    toml, python = autocuda.load_spec(name), PYTHON[name]
    assert [s.name for s in python.states] == [s.name for s in toml.states]
    assert python.reset == toml.reset and python.inputs == toml.inputs
    torch.manual_seed(0)
    xs = tuple(torch.rand(16, 6, dtype=torch.float64) * 2 for _ in toml.inputs)
    params = {p.name: p.default for p in toml.params}
    ours, theirs = _run(python, xs, params, toml.surrogate), _run(toml, xs, params, toml.surrogate)
    assert torch.equal(ours[0], theirs[0]) and ours[0].sum() > 0  # spikes, and some fired
    for a, b in zip(ours[1], theirs[1]):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    for a, b in zip(ours[2], theirs[2]):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("name", ["lif", "alif"])
def test_traced_kernels_are_byte_identical_to_the_toml_specs(name: str) -> None:
    toml, python = autocuda.load_spec(name), PYTHON[name]
    for kernel in KERNELS:
        for dtype in DTYPES:
            assert python.source(kernel, dtype) == toml.source(kernel, dtype), (kernel, dtype)


# Written otherwise than their TOML files (same values, other expressions): the ODE models' exact steps, and the
# gated LIF's gates (named in the TOML file's [derived]). (KLIF's relu traces as its file writes it: where(0 < h, h, 0))
WRITTEN_OTHERWISE = {"cuba_lif", "sfa_lif", "resonate_fire", "gated_lif"}


@pytest.mark.parametrize("name", sorted(set(PYTHON) - WRITTEN_OTHERWISE))
def test_python_neurons_generate_the_toml_specs_kernels(name: str) -> None:
    """Byte for byte, but for the first line, the spec's doc (the Python functions here have none or another)."""
    toml, python = autocuda.load_spec(name), PYTHON[name]
    for kernel in KERNELS:
        ours, theirs = python.source(kernel, "float32"), toml.source(kernel, "float32")
        assert ours.split("\n", 1)[1] == theirs.split("\n", 1)[1], kernel


# ---- what the tracer follows ----

def test_arithmetic_functions_and_closures_trace() -> None:
    leak = 0.25  # a Python number captured by the step

    def step(x, v, w):
        h = torch.clamp(v * (1 - leak) + x, min=-2.0, max=5.0) + 0.1 * torch.tanh(w) + torch.abs(w) * 0
        h = h + torch.minimum(w, torch.maximum(x, torch.sqrt(torch.exp(w) + 1))) * 0.01
        threshold = 1 + torch.log(1 + torch.sigmoid(w))
        s = sg(h - threshold)
        return s, h - s * threshold, torch.where(x > 0.5, w * 0.5, -w) + s

    traced = step_spec(step, ["v", "w"], [])
    spec = traced.spec
    assert spec.reset == "soft" and spec.membrane == "v" and dict(spec.updates)["w"]
    torch.manual_seed(1)
    x = torch.rand(5, 7, dtype=torch.float64)
    spikes, finals, _ = F.multi_step(spec, x, backend="reference")
    v, w = torch.zeros(7, dtype=torch.float64), torch.zeros(7, dtype=torch.float64)
    for xt in x:  # the step itself, eagerly, with autocuda's surrogate (forward: Θ)
        s, v, w = step(xt, v, w)
    torch.testing.assert_close(finals[0], v)
    torch.testing.assert_close(finals[1], w)


def test_a_where_compared_in_a_condition_traces_as_the_toml_spec_of_it_runs() -> None:
    """Found by a fuzz of Python step functions: comparing a where's value in a where's condition gives sympy a
    condition of several comparisons (ITE, And, Or), which the spec's text wrote as none: the step was refused.
    Each comparison is now a where of its own, and the step computes what the TOML spec of its equations does."""
    def step(x, v, w, k=0.5):
        inner = torch.where(torch.where(v < 3, 1000, v) < torch.where(3 < x, 0, 3), -w, torch.where(v < 3, 1000, v))
        h = torch.where(-(v * v) < -torch.where(w < 3, 3, w), -v, x - inner * 1e-3)
        s = sg(h - (1 + torch.where(k < v, w, k)))
        return s, h * (1 - s), torch.where(-(v * v) < -torch.where(w < 3, 3, w), w, x)

    traced = neuron(step)
    toml = autocuda.NeuronSpec(
        name="written", params={"k": 0.5, "v_threshold": 1.0, "v_reset": 0.0}, states={"v": 0.0, "w": 0.0},
        charge="where(-(v * v) < -where(w < 3, 3, w), -v, x - where(where(v < 3, 1000, v) < where(3 < x, 0, 3), "
               "-w, where(v < 3, 1000, v)) * 1e-3)",
        threshold="1 + where(k < v, w, k)", reset="hard", updates={"w": "where(-(v * v) < -where(w < 3, 3, w), w, x)"})
    torch.manual_seed(3)
    x = (torch.rand(6, 5, dtype=torch.float64) - 0.5) * 12
    v0, w0 = ((torch.rand(5, dtype=torch.float64) - 0.5) * 12 for _ in range(2))
    (spikes, finals, _), (want, want_finals, _) = (F.multi_step(spec, x, v0, w0, backend="reference")
                                                   for spec in (traced, toml))
    assert torch.equal(spikes, want) and 0 < spikes.sum() < spikes.numel()
    for got, expected in zip(finals, want_finals):
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)


def _spikingjelly_surrogates() -> list[str]:
    """SpikingJelly's surrogate modules that autocuda has (by class name)."""
    base = sj_surrogate.SurrogateFunctionBase
    return sorted(n for n, c in vars(sj_surrogate).items()
                  if isinstance(c, type) and issubclass(c, base) and c is not base and n in SURROGATES)


@pytest.mark.parametrize("name", _spikingjelly_surrogates())
def test_spikingjelly_surrogates_are_recognised(name: str) -> None:
    module = getattr(sj_surrogate, name)()
    expected = get_surrogate(module)  # autocuda's surrogate of the same class and parameters

    def as_module(x, v):
        h = v + x
        s = module(h - 1)
        return s, h * (1 - s)

    assert step_spec(as_module, ["v"], []).surrogate == expected
    if type(module).spiking_function is not sj_surrogate.SurrogateFunctionBase.spiking_function:
        def as_function(x, v):  # the autograd function the module calls (`surrogate.atan.apply(z, alpha)`)
            h = v + x
            s = module.spiking_function(h - 1, *module._sg_params.values())
            return s, h * (1 - s)

        assert step_spec(as_function, ["v"], []).surrogate == expected


def test_a_random_spike_function_is_refused() -> None:
    def step(x, v):
        s = sj_surrogate.PoissonPass()(v + x - 1)
        return s, v + x - s

    with pytest.raises(SpecError, match="random numbers"):
        step_spec(step, ["v"], [])


def test_surrogate_parameters_are_kept() -> None:
    def step(x, v):
        s = sj_surrogate.atan.apply(v + x - 1, 3.5)
        return s, (v + x) * (1 - s)

    assert step_spec(step, ["v"], []).surrogate == ATan(alpha=3.5)

    def ours(x, v):
        s = Custom("1 / (1 + abs(x))")(v + x - 1)
        return s, v + x - s

    assert step_spec(ours, ["v"], []).surrogate == Custom("1 / (1 + abs(x))")


class my_spike(torch.autograd.Function):  # noqa: N801 - named as SpikingJelly names its spike functions
    @staticmethod
    def forward(ctx, x):
        return (x >= 0).to(x)

    @staticmethod
    def backward(ctx, grad):
        return grad


def test_an_unknown_spike_function_is_refused() -> None:
    def step(x, v):
        s = my_spike.apply(v + x - 1)
        return s, v + x - s

    with pytest.raises(SpecError, match="my_spike"):
        step_spec(step, ["v"], [])


# ---- how a step maps onto a spec ----

def test_reset_rules_and_thresholds() -> None:
    def hard_number(x, v):
        h = v * 0.5 + x
        s = sg(h - 1.0)
        return s, h * (1 - s) - 0.2 * s

    def none(x, v, a):
        h = v * 0.5 + x
        s = sg(h - (1 + a))
        return s, h, a * 0.9 + s

    hard = step_spec(hard_number, ["v"], []).spec
    assert (hard.reset, hard.threshold) == ("hard", "1.0")
    assert [(p.name, p.default, p.kind) for p in hard.params] == [("v_reset", -0.2, "constant")]
    kept = step_spec(none, ["v", "a"], []).spec
    assert (kept.reset, kept.threshold, dict(kept.updates)["a"]) == ("none", "a + 1", "0.9*a + s")


def test_a_reset_parameter_is_named_v_reset() -> None:
    def step(x, v, tau, rest):
        h = v + (x - v) / tau
        s = sg(h - 1)
        return s, h * (1 - s) + rest * s

    from autocuda.spec.model import Param
    traced = step_spec(step, ["v"], [Param("tau", 2.0), Param("rest", -0.5)])
    assert traced.params == ("tau", "v_reset") and traced.spec.reset == "hard"


def test_a_step_that_fits_no_reset_rule_gets_a_spec_of_its_own() -> None:
    def step(x, v):
        h = v + x
        s = sg(h - 1)
        return s, h * (1 - s) * (1 - s) + 0.3 * s * h  # quadratic in s: no reset rule

    traced = step_spec(step, ["v"], [])
    assert [s.name for s in traced.spec.states] == ["u", "v"] and traced.spec.reset == "none"
    x = torch.rand(6, 3, dtype=torch.float64) * 2
    spikes, finals, _ = F.multi_step(traced.spec, x, backend="reference")
    v = torch.zeros(3, dtype=torch.float64)
    for t, xt in enumerate(x):
        s, v = step(xt, v)
        assert torch.equal(spikes[t], s)
    torch.testing.assert_close(finals[1], v)


def test_a_step_without_a_spike() -> None:
    def leaky(x, v):
        v = v * 0.5 + x
        return v * 2, v

    traced = step_spec(leaky, ["v"], [])
    assert traced.surrogate is None and traced.outputs[0].kind == EXPRESSION
    spikes, finals, _ = F.multi_step(traced.spec, torch.ones(3, 2), backend="reference")
    assert not spikes.any()
    torch.testing.assert_close(finals[1], torch.full((2,), 1.75))


def test_outputs_are_the_spike_a_state_or_an_expression() -> None:
    def step(x, v):
        h = v + x
        s = sg(h - 1)
        new = h * (1 - s)
        return s, new, h * 2 + s, new

    kinds = [o.kind for o in step_spec(step, ["v"], []).outputs]
    assert kinds == [SPIKE, STATE, EXPRESSION]


def test_the_detached_spike_is_the_detach_reset() -> None:
    def step(x, v):
        h = v + x
        s = sg(h - 1)
        return s, h * (1 - s.detach())

    assert step_spec(step, ["v"], []).detach_reset

    def elsewhere(x, v, a):
        h = v + x
        s = sg(h - 1)
        return s, h * (1 - s), a + s.detach()

    with pytest.raises(SpecError, match="detach"):
        step_spec(elsewhere, ["v", "a"], [])


def _soft(x, v, v_threshold=1.0):
    h = v + x
    s = sg(h - v_threshold)
    return s, h - s * v_threshold


def _soft_detached(x, v, v_threshold=1.0):
    h = v + x
    s = sg(h - v_threshold)
    return s, h - s.detach() * v_threshold


@pytest.mark.parametrize("backend", ["reference", "host"])
def test_a_decorated_step_with_s_detach_detaches_its_reset_in_every_call(backend: str) -> None:
    """The decorator's spec keeps the detachment: its calls' gradients are those of detach_reset=True (they were the
    attached reset's), the layer's switch reads True and refuses False, and the TOML key says the same."""
    attached, detached = neuron(_soft, name="soft"), neuron(_soft_detached, name="soft_detached")
    assert detached.detach_reset and not attached.detach_reset

    def grad(spec, **switches):
        x = torch.full((3, 2), 0.6, dtype=torch.float64, requires_grad=True)  # fires at the second step
        F.multi_step(spec, x, backend=backend, **switches)[0].sum().backward()
        return x.grad

    torch.testing.assert_close(grad(detached), grad(attached, detach_reset=True), rtol=0, atol=0)
    assert not torch.equal(grad(detached), grad(attached))
    layer = autocuda.nn.Neuron(detached, step_mode="m", backend="torch" if backend == "reference" else backend)
    assert layer.detach_reset
    with pytest.raises(ValueError, match="detaches the spike"):
        layer.detach_reset = False
    from_toml = autocuda.spec_from_toml("name = 'soft_toml'\ncharge = 'v + x'\nreset = 'soft'\n"
                                        "detach_reset = true\n[params]\nv_threshold = 1.0\n[states]\nv = 0.0\n")
    torch.testing.assert_close(grad(from_toml), grad(detached), rtol=0, atol=0)
    with pytest.raises(SpecError, match="detach_reset"):
        autocuda.spec_from_toml("name = 'bad'\ncharge = 'v + x'\nreset = 'soft'\ndetach_reset = 1\n[params]\n"
                                "v_threshold = 1.0\n[states]\nv = 0.0\n")


def test_names_the_language_reserves_are_renamed() -> None:
    def step(x, s, exp):  # a state named s, a parameter named exp
        h = s + x / exp
        spike = sg(h - 1)
        return spike, h * (1 - spike)

    from autocuda.spec.model import Param
    traced = step_spec(step, ["s"], [Param("exp", 2.0)])
    assert traced.states == ("s_state",) and traced.params == ("exp_param",)


def test_expression_text_parses_back() -> None:
    import sympy

    from autocuda.spec.parse import parse_expression

    a, b = sympy.symbols("a b", real=True)
    for e in [a + b / 3, sympy.Min(a, b) * sympy.Abs(a), sympy.Piecewise((a, a < b), (b, True)),
              sympy.exp(-a) ** sympy.Rational(3, 2), -a * sympy.E + sympy.pi, sympy.Float(0.1) * a]:
        assert parse_expression(expression_text(e), {"a": a, "b": b}) == e


# ---- refusals ----

W = torch.ones(3)


def _closure():
    weights = torch.ones(3)

    def step(x, v):
        h = v + x * weights
        return sg(h - 1), h
    return step


def _sort(x, v):
    h = torch.sort(v + x).values
    return sg(h - 1), h


def _if(x, v):
    h = v + x
    if h > 1:
        h = h - 1
    return sg(h - 1), h


def _in_place(x, v):
    h = v + x
    h += 1
    return sg(h - 1), h


def _in_place_method(x, v):
    h = v + x
    h.mul_(2)
    return sg(h - 1), h


def _global_tensor(x, v):
    h = v + x * W
    return sg(h - 1), h


def _random(x, v):  # (torch.rand_like of a step value is the spec's draw rand(): tests/test_noise_specs.py)
    h = v + x + torch.normal(0.0, torch.ones_like(v))
    return sg(h - 1), h


def _math(x, v):
    h = v + math.exp(x)
    return sg(h - 1), h


def _two_spikes(x, v):
    h = v + x
    return sg(h - 1), sg(h - 2), h


def _reduction(x, v):
    h = v + x.sum()
    return sg(h - 1), h


REFUSED = [(_closure(), "captures the tensor or module 'weights'"), (_sort, "torch.sort"),
           (_if, "Python `if`"), (_in_place, "in-place"), (_in_place_method, "in-place method Tensor.mul_"),
           (_global_tensor, "tensor made outside the step"), (_random, "random numbers"),
           (_math, "math function"), (_two_spikes, "second spike"), (_reduction, "torch.sum")]


@pytest.mark.parametrize("step,message", REFUSED, ids=[getattr(s, "__name__", "closure") for s, _ in REFUSED])
def test_refusals_name_the_operation_and_the_line(step, message: str) -> None:
    with pytest.raises(SpecError, match=message.replace("(", r"\(").replace("`", ".")) as info:
        step_spec(step, ["v"], [])
    if "captures" not in message:
        assert __file__ in info.value.source  # the user's file and line
        assert info.value.source.rsplit(":", 1)[1].isdigit()


def test_several_step_inputs_are_the_specs_inputs() -> None:
    """Each step input is an input of the spec, named as the function names it, wherever the step reads it
    (apart, or together in one value); the traced spec survives its JSON form (FlexSN's disk cache)."""
    def apart(x_exc, x_inh, v):  # (v + x_exc) - x_inh: the inputs meet the state one by one
        h = v + x_exc - 0.5 * x_inh * v
        return sg(h - 1), h

    def together(x_exc, x_inh, v):
        h = v + (x_exc + x_inh)
        return sg(h - 1), h

    for fn in (apart, together):
        step = step_spec(fn, ["v"], [], num_inputs=2)
        assert step.spec.inputs == ("x_exc", "x_inh") and step.num_inputs == 2
        assert {"x_exc", "x_inh"} <= {str(u) for u in step.spec.parsed().charge.free_symbols}
        assert StepSpec.from_json(step.to_json()) == step
    with pytest.raises(SpecError, match="fewer than its 2 input"):
        step_spec(lambda x, v: (sg(v + x - 1), v + x), ["v"], [], num_inputs=2)


def test_an_input_in_the_threshold_makes_a_spec_of_its_own() -> None:
    """The threshold may not read an input (as x before): a spike against an input is a spec of its own shape."""
    def against_y(x, y, v):
        s = sg(v + x - y)
        return s, (v + x) * (1 - s)

    step = step_spec(against_y, ["v"], [], num_inputs=2)
    assert step.spec.threshold == "0" and step.spec.inputs == ("x", "y")


# ---- the decorator and Python files ----

def test_decorator_errors() -> None:
    with pytest.raises(SpecError, match="return \\(spike, \\*new_states\\)"):
        @neuron
        def no_spike_first(x, v):
            h = v + x
            s = sg(h - 1)
            return h, h * (1 - s)
    with pytest.raises(SpecError, match="not a parameter"):
        @neuron(learnable=("tau",))
        def unknown(x, v):
            s = sg(v + x - 1)
            return s, v + x - s


def test_decorated_neurons_take_several_inputs() -> None:
    @neuron(num_inputs=2)
    def conductance(g_e, g_i, v, tau=2.0, E_e=3.0, E_i=-1.0):
        h = v + (g_e * (E_e - v) + g_i * (E_i - v) - v) / tau
        s = sg(h - 1.0)
        return s, h * (1 - s)

    assert conductance.inputs == ("g_e", "g_i") and [s.name for s in conductance.states] == ["v"]
    layer = autocuda.nn.Neuron(conductance, step_mode="m")
    g_e, g_i = torch.rand(6, 4) * 0.9, torch.rand(6, 4) * 0.5
    assert torch.equal(layer(g_e, g_i), F.multi_step(conductance, (g_e, g_i), backend="reference")[0])
    with pytest.raises(SpecError, match="the first 2 arguments are the inputs"):
        neuron(lambda g_e, g_i=0.0, v=0.0: (sg(v - 1), v), num_inputs=2)
    with pytest.raises(SpecError, match="num_inputs: expected a positive integer"):
        neuron(lambda x, v: (sg(v - 1), v), num_inputs=0)


def test_a_decorated_neuron_runs_in_a_layer() -> None:
    layer = autocuda.nn.Neuron(alif, step_mode="m", tau=3.0)
    out = layer(torch.rand(4, 5) * 3)
    assert out.shape == (4, 5) and set(out.unique().tolist()) <= {0.0, 1.0}
    assert layer.a.shape == (5,)


def test_load_python_spec(tmp_path) -> None:
    path = tmp_path / "mine.py"
    path.write_text("import autocuda\nfrom autocuda.spec.surrogate import Sigmoid\n\n"
                    "@autocuda.neuron\ndef mine(x, v, tau=2.0, v_reset=0.0, v_threshold=1.0):\n"
                    "    h = v + (x - v) / tau\n    s = Sigmoid()(h - v_threshold)\n"
                    "    return s, h * (1 - s) + v_reset * s\n")
    assert load_python_spec(str(path)).name == "mine"
    assert load_python_spec(f"{path}:mine").name == "mine"
    with pytest.raises(SpecError, match="no spec named 'other'"):
        load_python_spec(f"{path}:other")
    empty = tmp_path / "empty.py"
    empty.write_text("X = 1\n")
    with pytest.raises(SpecError, match="no NeuronSpec"):
        load_python_spec(str(empty))


def test_the_command_line_reads_a_python_file(tmp_path, capsys) -> None:
    from autocuda.tools.cli import main

    path = tmp_path / "mine.py"
    path.write_text("import torch\nimport autocuda\nfrom autocuda.spec.surrogate import ATan\n\n"
                    "@autocuda.neuron\ndef leaky(x, v, tau=2.0, v_threshold=1.0, v_reset=0.0):\n"
                    "    \"\"\"A leaky neuron in Python.\"\"\"\n"
                    "    h = v + (x - v) / tau\n    s = ATan()(h - v_threshold)\n"
                    "    return s, h * (1 - s) + v_reset * s\n")
    assert main(["show", str(path), "--kernel", "bptt"]) == 0
    out = capsys.readouterr().out
    assert "// leaky: A leaky neuron in Python." in out and "leaky_bptt_float32" in out
    bad = tmp_path / "bad.py"
    bad.write_text("import torch\nimport autocuda\nfrom autocuda.spec.surrogate import ATan\n\n"
                   "@autocuda.neuron\ndef bad(x, v, v_reset=0.0):\n"
                   "    if v > 1:\n        v = v - 1\n    s = ATan()(v + x - 1)\n    return s, v + x - s\n")
    assert main(["show", str(bad)]) == 2
    assert "bad.py:7" in capsys.readouterr().err  # the line of the `if`


@pytest.mark.skipif(toolchain.missing() is not None, reason=f"host runner: {toolchain.missing()}")
def test_check_spec_runs_the_kernels_of_a_traced_spec() -> None:
    from autocuda.tools.testing import check_spec

    report = check_spec(alif, backend="host", dtypes=("float32", "float64"), resets=("hard",), detach=(False,),
                        examples=1)
    assert report.passed and len(report.cases) == 2
