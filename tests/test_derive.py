"""The derived backward equals autograd through the reference, for every shipped spec, reset and detach_reset.

float64 on the CPU; the derived adjoint reads only what forward saves (h and the saved state sequences), so
this also checks the choice of the saved set and the recomputation of v[t-1].
"""
from __future__ import annotations

import dataclasses
import functools
import zlib

import pytest
import sympy as sp
import torch
from conftest import first_arch_by_default

from autocuda.codegen import noise
from autocuda.codegen.kernels import derivation, neuron_kernel
from autocuda.runtime import reference
from autocuda.spec.derive import H
from autocuda.spec.draws import system_draws
from autocuda.spec.load import list_specs, load_spec
from autocuda.spec.model import NeuronSpec, reset_rules
from autocuda.spec.system import initial_value

SPECS = [name for name, _ in list_specs()]
T, N = 6, 7


def _inputs(spec, system, reset, generator, shared=False):
    """Random float64 step inputs (one sequence per input of the spec), initial states and parameters
    (perturbed defaults, learnable per neuron, or one 0-d value for all neurons when `shared`)."""
    # Without a reset, exponential neurons (EIF, AdEx) blow up under strong input: keep it moderate there.
    scale, shift = (1.5, 0.5) if reset != "none" else (0.3, -0.1)
    xs = tuple(torch.randn(T, N, dtype=torch.float64, generator=generator) * scale + shift for _ in spec.inputs)
    defaults = {p.name: p.default for p in spec.params}
    params = {}
    for symbol in system.params:
        value = defaults[symbol.name] * (1 + 0.1 * torch.rand((), generator=generator, dtype=torch.float64).item())
        if symbol in system.learnable and shared:
            value = torch.tensor(value, dtype=torch.float64, requires_grad=True)
        elif symbol in system.learnable:
            value = torch.full((N,), value, dtype=torch.float64) + 0.1 * torch.randn(N, generator=generator,
                                                                                   dtype=torch.float64)
            value.requires_grad_(True)
        params[symbol] = value
    initial = []
    for s in system.states:
        init = initial_value(spec, s.name, reset, {k.name: v for k, v in params.items()})
        base = float(defaults[init]) if isinstance(init, str) else float(init)
        initial.append((base + 0.3 * torch.randn(N, generator=generator, dtype=torch.float64)).requires_grad_(True))
    return tuple(x.requires_grad_(True) for x in xs), initial, params


def _forward_with_saves(d, spec, xs, initial, params, seed):
    states, spikes, hs, seqs = tuple(initial), [], [], [[] for _ in initial]
    draws = system_draws(d.system)
    for t, x in enumerate(zip(*xs)):  # each step's inputs (and draws, of a spec that makes any)
        drawn = noise.step_values(draws, seed, t, x[0]) if draws else None
        spike, states, h = reference.step(d.system, x, states, params, spec.surrogate, d.detach_reset, drawn)
        spikes.append(spike)
        hs.append(h)
        for seq, s in zip(seqs, states):
            seq.append(s)
    return torch.stack(spikes), states, torch.stack(hs), [torch.stack(s) for s in seqs]


SPEC_RESETS = [(name, reset) for name in SPECS for reset in reset_rules(load_spec(name))]


@pytest.mark.parametrize("detach_reset", [False, True])
@pytest.mark.parametrize(("name", "reset"), SPEC_RESETS)
def test_derived_backward_equals_autograd(name, reset, detach_reset):
    _check_against_autograd(load_spec(name), reset, detach_reset)


# abs, min, max and heaviside in an update: their derivatives (sign, steps with H(0) = 1/2, DiracDelta) reach
# the printers as steps with H(0) = 1 (autocuda.spec.derive._steps_and_kinks).
KINKED = ("0.5 * w + 0.2 * abs(v) + min(v, 0.5) - max(w, -0.2) + 0.3 * heaviside(v - 0.2) + 0.1 * s",)


KINK_RESETS = ("hard", "soft")


def _kinked(update: str) -> NeuronSpec:
    return dataclasses.replace(load_spec("izhikevich"), name="kinked", updates=(("w", update),))


@functools.cache
def _kinked_nvcc_failures(nvcc, update: str) -> dict[str, str]:
    """nvcc's failures on the kinked spec's backward kernels under each of KINK_RESETS, labelled by reset: one
    translation unit of them all (each nvcc run pays its start-up and the CUDA headers), each reset's on its own
    only where nvcc refuses that."""
    spec = _kinked(update)
    sources = {reset: [spec.source(kind, dtype, reset=reset) for kind in ("bptt", "step-backward")
                       for dtype in ("float32", "float64")] + [spec.source("bptt", "float16", native=True)]
               for reset in KINK_RESETS}
    every = dict.fromkeys(source for kernels in sources.values() for source in kernels)  # each kernel once
    if not nvcc({"kinked": "\n".join(every)}, archs=first_arch_by_default()):
        return {}
    return nvcc({reset: "\n".join(kernels) for reset, kernels in sources.items()}, archs=first_arch_by_default())


@pytest.mark.parametrize("update", KINKED)
@pytest.mark.parametrize("reset", KINK_RESETS)
def test_derived_backward_of_kinks_equals_autograd(update, reset, nvcc):
    _check_against_autograd(_kinked(update), reset, False)
    assert _kinked_nvcc_failures(nvcc, update).get(reset) is None


def _check_against_autograd(spec, reset, detach_reset, shared=False):
    """`shared`: learnable parameters are one value for all neurons; the derived per-neuron gradients must add
    up to autograd's."""
    name = spec.name
    d = derivation(spec, reset, detach_reset)
    generator = torch.Generator().manual_seed(zlib.crc32(f"{name}-{reset}-{detach_reset}".encode()))
    xs, initial, params = _inputs(spec, d.system, reset, generator, shared)
    seed = noise.Seed(zlib.crc32(name.encode()), offset=3)  # for a spec that draws
    spike_seq, finals, h_seq, state_seqs = _forward_with_saves(d, spec, xs, initial, params, seed)
    grad_spike = torch.randn_like(spike_seq)
    grad_finals = [torch.randn_like(f) for f in finals]
    grad_seqs = [torch.randn_like(s) for s in state_seqs]
    loss = (spike_seq * grad_spike).sum() + sum((f * g).sum() for f, g in zip(finals, grad_finals)) \
        + sum((s * g).sum() for s, g in zip(state_seqs, grad_seqs))
    learnable = [params[p] for p in d.system.learnable]
    wrt = [*xs, *initial, *learnable]
    # a state that nothing reads (a record of h, such as liaf's v_charged) has no graph from its initial value
    expected = [torch.zeros_like(t) if g is None else g
                for t, g in zip(wrt, torch.autograd.grad(loss, wrt, allow_unused=True))]
    assert all(torch.isfinite(e).all() for e in expected), "inputs must keep the dynamics finite"

    saved = {i: state_seqs[i].detach() for i, keep in enumerate(d.saved_states) if keep}
    with torch.no_grad():
        grad_xs, grad_init, grad_params = reference.derived_backward(
            d, spec.surrogate, tuple(x.detach() for x in xs), [s.detach() for s in initial],
            {k: (v.detach() if isinstance(v, torch.Tensor) else v) for k, v in params.items()},
            h_seq.detach(), saved, grad_spike, grad_finals, grad_seqs, seed=seed)
    if shared:
        grad_params = tuple(g.sum(0) for g in grad_params)
    for got, want, what in zip([*grad_xs, *grad_init, *grad_params], expected,
                               [*spec.inputs, *(s.name for s in d.system.states),
                                *(p.name for p in d.system.learnable)]):
        label = f"{name} {reset} gradient of {what}"
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12, msg=lambda m, label=label: f"{label}: {m}")


@pytest.mark.parametrize("name", ["lif", "qif", "eif", "izhikevich", "parametric_lif"])
def test_backward_saves_h_alone(name):
    """design.md: for these neurons backward reads h[t] only; v[t-1] and s are recomputed from it."""
    for reset in ("hard", "soft"):
        d = derivation(load_spec(name), reset)
        assert not any(d.saved_states), (name, reset, d.saved_states)
        assert not d.backward.needs_x


def test_adaptive_threshold_state_is_saved():
    d = derivation(load_spec("alif"))
    assert d.saved_states[1], "the adaptation state sets the threshold: it must be saved"
    assert not d.recompute_membrane or not d.backward.needs_states[0]


def test_detach_reset_cuts_only_the_reset_path():
    d_attached, d_detached = derivation(load_spec("lif"), "hard", False), derivation(load_spec("lif"), "hard", True)
    difference = sp.simplify(d_attached.backward.grad_x - d_detached.backward.grad_x)
    assert difference != 0
    assert d_detached.backward.grad_x.has(sp.Symbol("ac_sg", real=True)), "the spike's own gradient remains"


# Charges linear in x with a learnable coefficient: backward takes x back from h where the coefficient cannot
# be zero and x is in the charge alone (autocuda.spec.derive.recovered_input), and reads x[t] otherwise.
LEARNED_TAU = NeuronSpec(name="learned_tau", charge="v + (x - (v - v_reset)) / tau",
                         params={"tau": {"default": 2.0, "learnable": True}, "v_threshold": 1.0, "v_reset": 0.0},
                         states={"v": "v_reset"})
RESISTANCE = NeuronSpec(name="resistance", charge="v + R * x - (v - v_reset) / 2",   # R may be 0
                        params={"R": {"default": 1.0, "learnable": True}, "v_threshold": 1.0, "v_reset": 0.0},
                        states={"v": "v_reset"})
INPUT_IN_UPDATE = NeuronSpec(name="input_in_update", charge="v + (x - (v - v_reset)) * sigmoid(w) + c",
                             params={"w": {"default": 0.0, "learnable": True}, "v_threshold": 1.0, "v_reset": 0.0},
                             states={"v": "v_reset", "c": 0.0}, updates={"c": "0.5 * c + 0.1 * x"})
READS_X = {LEARNED_TAU: False, RESISTANCE: True, INPUT_IN_UPDATE: True}


@pytest.mark.parametrize("detach_reset", [False, True])
@pytest.mark.parametrize("reset", ["hard", "soft", "none"])
def test_parametric_lif_backward_takes_x_from_h(reset, detach_reset):
    """dL/dw = g_h (x - (v - v_reset)) sigmoid'(w) = g_h (h - v)(1 - sigmoid(w)): backward reads h, not x, and
    does not divide by sigmoid(w)."""
    spec = load_spec("parametric_lif")
    d = derivation(spec, reset, detach_reset)
    assert not d.backward.needs_x
    x, v = d.system.x, d.system.states[0]
    w = next(p for p in d.system.learnable if p.name == "w")
    decay = 1 / (1 + sp.exp(-w))
    (grad_w,) = d.backward.grad_params
    assert not grad_w.has(x)
    # dL/dx = g_h sigmoid(w), so the identity below pins grad_w to g_h (h - v)(1 - sigmoid(w))
    assert sp.simplify(grad_w * decay - d.backward.grad_x * (H - v) * (1 - decay)) == 0
    assert not grad_w.has(1 + sp.exp(-w)), f"divides by sigmoid(w): {grad_w}"
    for kernel in ("bptt", "step-backward"):
        assert "x_seq" not in neuron_kernel(spec, kernel, reset=reset, detach_reset=detach_reset).cparams


@pytest.mark.parametrize("spec", list(READS_X), ids=lambda s: s.name)
def test_backward_reads_x_only_where_h_cannot_give_it_back(spec):
    for reset in ("hard", "soft"):
        d = derivation(spec, reset)
        assert d.backward.needs_x == READS_X[spec], (spec.name, reset)
        assert ("x_seq" in neuron_kernel(spec, "bptt", reset=reset).cparams) == READS_X[spec]


@pytest.mark.parametrize("shared", [False, True], ids=["per-neuron", "shared"])
@pytest.mark.parametrize("spec", [load_spec("parametric_lif"), *READS_X], ids=lambda s: s.name)
def test_learnable_coefficient_gradients_equal_autograd(spec, shared):
    for reset, detach_reset in (("hard", False), ("soft", True)):
        _check_against_autograd(spec, reset, detach_reset, shared)


def test_a_constant_naming_no_parameter_is_refused_by_name():
    """`constants` fold parameters into the source (`neuron_kernel`, `source`, `check_spec`): a name the spec lacks
    was dropped silently, so a misspelt one left its parameter a runtime value."""
    from autocuda.base.errors import SpecError

    lif = load_spec("lif")
    with pytest.raises(SpecError, match="field 'constants': 'tau_typo' is not a parameter"):
        neuron_kernel(lif, "fptt", constants={"tau_typo": 3.0})
    assert "tau" not in neuron_kernel(lif, "fptt", constants={"tau": 3.0}).cparams  # folded


def test_kernel_requests_take_a_spec_by_name_and_refuse_arguments_of_the_wrong_kind():
    """`autocuda.source("lif")` raised AttributeError ('str' object has no attribute 'params'); per_neuron="tau" was
    read as its letters ("'t' is not a tensor parameter"); store_state_seq="no" was true and stored sequences."""
    assert neuron_kernel("lif").full_codes == neuron_kernel(load_spec("lif")).full_codes
    with pytest.raises(TypeError, match="^spec: expected a NeuronSpec"):
        neuron_kernel(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="^per_neuron: expected an iterable of parameter names, got 'tau'"):
        neuron_kernel("lif", per_neuron="tau")
    with pytest.raises(TypeError, match="^store_state_seq: expected True or False, got 'no'"):
        neuron_kernel("lif", store_state_seq="no")  # type: ignore[arg-type]
