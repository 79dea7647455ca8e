"""The derived backward equals autograd through the reference, for every shipped spec, reset and detach_reset.

float64 on the CPU; the derived adjoint reads only what forward saves (h and the saved state sequences), so
this also checks the choice of the saved set and the recomputation of v[t-1].
"""
from __future__ import annotations

import zlib

import pytest
import sympy as sp
import torch

from autocuda import reference
from autocuda.kernels import derivation
from autocuda.spec.model import list_specs, load_spec
from autocuda.spec.system import initial_value

SPECS = [name for name, _ in list_specs()]
T, N = 6, 7


def _inputs(spec, system, reset, generator):
    """Random float64 inputs, initial states and parameters (perturbed defaults, learnable per neuron)."""
    # Without a reset, exponential neurons (EIF, AdEx) blow up under strong input: keep it moderate there.
    scale, shift = (1.5, 0.5) if reset != "none" else (0.3, -0.1)
    x_seq = torch.randn(T, N, dtype=torch.float64, generator=generator) * scale + shift
    defaults = {p.name: p.default for p in spec.params}
    params = {}
    for symbol in system.params:
        value = defaults[symbol.name] * (1 + 0.1 * torch.rand((), generator=generator, dtype=torch.float64).item())
        if symbol in system.learnable:
            value = torch.full((N,), value, dtype=torch.float64) + 0.1 * torch.randn(N, generator=generator,
                                                                                   dtype=torch.float64)
            value.requires_grad_(True)
        params[symbol] = value
    initial = []
    for s in system.states:
        init = initial_value(spec, s.name, reset, {k.name: v for k, v in params.items()})
        base = float(defaults[init]) if isinstance(init, str) else float(init)
        initial.append((base + 0.3 * torch.randn(N, generator=generator, dtype=torch.float64)).requires_grad_(True))
    return x_seq.requires_grad_(True), initial, params


def _forward_with_saves(d, spec, x_seq, initial, params):
    states, spikes, hs, seqs = tuple(initial), [], [], [[] for _ in initial]
    for x in x_seq:
        spike, states, h = reference.step(d.system, x, states, params, spec.surrogate, d.detach_reset)
        spikes.append(spike)
        hs.append(h)
        for seq, s in zip(seqs, states):
            seq.append(s)
    return torch.stack(spikes), states, torch.stack(hs), [torch.stack(s) for s in seqs]


@pytest.mark.parametrize("detach_reset", [False, True])
@pytest.mark.parametrize("reset", ["hard", "soft", "none"])
@pytest.mark.parametrize("name", SPECS)
def test_derived_backward_equals_autograd(name, reset, detach_reset):
    _check_against_autograd(load_spec(name), reset, detach_reset)


# abs, min, max and heaviside in an update: their derivatives (sign, steps with H(0) = 1/2, DiracDelta) reach
# the printers as steps with H(0) = 1 (autocuda.spec.derive._steps_and_kinks).
KINKED = ("0.5 * w + 0.2 * abs(v) + min(v, 0.5) - max(w, -0.2) + 0.3 * heaviside(v - 0.2) + 0.1 * s",)


@pytest.mark.parametrize("update", KINKED)
@pytest.mark.parametrize("reset", ["hard", "soft"])
def test_derived_backward_of_kinks_equals_autograd(update, reset, nvcc):
    import dataclasses

    spec = dataclasses.replace(load_spec("izhikevich"), name="kinked", updates=(("w", update),))
    _check_against_autograd(spec, reset, False)
    sources = [spec.source(k, d, reset=reset) for k in ("bptt", "step-backward") for d in ("float32", "float64")]
    assert nvcc({f"kinked {reset}": "\n".join(sources + [spec.source("bptt", "float16", native=True)])}) == {}


def _check_against_autograd(spec, reset, detach_reset):
    name = spec.name
    d = derivation(spec, reset, detach_reset)
    generator = torch.Generator().manual_seed(zlib.crc32(f"{name}-{reset}-{detach_reset}".encode()))
    x_seq, initial, params = _inputs(spec, d.system, reset, generator)
    spike_seq, finals, h_seq, state_seqs = _forward_with_saves(d, spec, x_seq, initial, params)
    grad_spike = torch.randn_like(spike_seq)
    grad_finals = [torch.randn_like(f) for f in finals]
    grad_seqs = [torch.randn_like(s) for s in state_seqs]
    loss = (spike_seq * grad_spike).sum() + sum((f * g).sum() for f, g in zip(finals, grad_finals)) \
        + sum((s * g).sum() for s, g in zip(state_seqs, grad_seqs))
    learnable = [params[p] for p in d.system.learnable]
    expected = torch.autograd.grad(loss, [x_seq, *initial, *learnable])
    assert all(torch.isfinite(e).all() for e in expected), "inputs must keep the dynamics finite"

    saved = {i: state_seqs[i].detach() for i, keep in enumerate(d.saved_states) if keep}
    with torch.no_grad():
        grad_x, grad_init, grad_params = reference.derived_backward(
            d, spec.surrogate, x_seq.detach(), [s.detach() for s in initial],
            {k: (v.detach() if isinstance(v, torch.Tensor) else v) for k, v in params.items()},
            h_seq.detach(), saved, grad_spike, grad_finals, grad_seqs)
    for got, want, what in zip([grad_x, *grad_init, *grad_params], expected,
                               ["x", *(s.name for s in d.system.states), *(p.name for p in d.system.learnable)]):
        label = f"{name} {reset} gradient of {what}"
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12, msg=lambda m, label=label: f"{label}: {m}")


@pytest.mark.parametrize("name", ["lif", "qif", "eif", "izhikevich"])
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
