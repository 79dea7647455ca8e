"""Specs with several step inputs (`inputs = [...]`): each input is read where x is and gets its own gradient.

The spec here (a conductance-based LIF, neuron_specs/conductance_lif.toml) reads g_e and g_i each beside the
membrane, so no single value of the inputs alone carries them.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from autocuda import nn as ann
from autocuda.base.errors import SpecError
from autocuda.call import functional as F
from autocuda.codegen.kernels import derivation
from autocuda.runtime import reference
from autocuda.spec.load import load_spec
from autocuda.spec.model import NeuronSpec, spec_text

SPEC = "conductance_lif"
F64 = torch.float64


def _spec() -> NeuronSpec:
    return load_spec(SPEC)


def _conductances(steps: int = 12, neurons: int = 9, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    g_e = torch.rand(steps, neurons, generator=generator, dtype=F64) * 0.9
    g_i = torch.rand(steps, neurons, generator=generator, dtype=F64) * 0.6
    return g_e, g_i


def test_inputs_are_parsed_and_named_in_the_derivation():
    spec = _spec()
    assert spec.inputs == ("g_e", "g_i")
    system = derivation(spec).system
    assert [u.name for u in system.inputs] == ["g_e", "g_i"]
    assert len(derivation(spec).backward.grad_inputs) == 2
    assert "inputs" in spec_text(spec) and "inputs" not in spec_text(load_spec("lif"))


@pytest.mark.parametrize("reset", ["hard", "soft"])
@pytest.mark.parametrize("detach_reset", [False, True])
def test_derived_backward_equals_autograd(reset, detach_reset):
    """One gradient per input: d loss / d g_e[t] and d loss / d g_i[t] of the derived adjoint equal autograd's
    through the reference, in float64."""
    spec = _spec()
    d = derivation(spec, reset, detach_reset)
    system = d.system
    g_e, g_i = (u.requires_grad_(True) for u in _conductances())
    v0 = (torch.rand(g_e.shape[1], dtype=F64) * 0.5).requires_grad_(True)
    defaults = {p.name: p.default for p in spec.params}
    params = {p: defaults[p.name] for p in system.params}
    spikes, finals, seqs = reference.multi_step(system, (g_e, g_i), [v0], params, spec.surrogate, detach_reset)
    assert spikes.sum() > 0, "the inputs must make the neurons fire"
    generator = torch.Generator().manual_seed(1)
    grad_spike = torch.randn(spikes.shape, generator=generator, dtype=F64)
    grad_final = torch.randn(v0.shape, generator=generator, dtype=F64)
    loss = (spikes * grad_spike).sum() + (finals[0] * grad_final).sum()
    expected = torch.autograd.grad(loss, (g_e, g_i, v0))
    h_seq = torch.stack([reference.step(system, (a, b), [v], params, spec.surrogate)[2]
                         for a, b, v in zip(g_e, g_i, [v0, *seqs[0][:-1]])]).detach()
    saved = {i: seqs[i].detach() for i, keep in enumerate(d.saved_states) if keep}
    with torch.no_grad():
        grad_inputs, grad_init, _ = reference.derived_backward(
            d, spec.surrogate, (g_e.detach(), g_i.detach()), [v0.detach()], params, h_seq, saved, grad_spike,
            [grad_final])
    for got, want, what in zip([*grad_inputs, *grad_init], expected, ["g_e", "g_i", "v"]):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-12, msg=lambda m, what=what: f"{what}: {m}")


@pytest.mark.parametrize("single", [False, True], ids=["multi", "single"])
def test_host_kernels_equal_the_reference(single):
    """The generated kernels (host runner) against the reference: spikes equal, the final membrane and the
    gradient of every input within rounding, in float64."""
    g_e, g_i = _conductances()
    if single:
        g_e, g_i = g_e[0], g_i[0]
    results = {}
    for backend in ("reference", "host"):
        inputs = [g_e.clone().requires_grad_(True), g_i.clone().requires_grad_(True)]
        run = F.single_step if single else F.multi_step
        spikes, finals, *_ = run(SPEC, tuple(inputs), backend=backend)
        weights = torch.linspace(-1.0, 1.0, spikes.numel(), dtype=F64).view(spikes.shape)
        loss = (spikes * weights).sum() + (finals[0] ** 2).sum()
        results[backend] = (spikes.detach(), finals[0].detach(), *torch.autograd.grad(loss, inputs))
    assert results["reference"][0].sum() > 0
    assert torch.equal(results["host"][0], results["reference"][0])
    for got, want in zip(results["host"][1:], results["reference"][1:]):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_kernels_read_and_write_a_sequence_per_input():
    spec = _spec()
    forward, backward = spec.source("fptt", "float32"), spec.source("bptt", "float32")
    for name in ("g_e", "g_i"):
        assert f"usr_{name}_seq" in forward
        assert f"usr_grad_{name}_seq" in backward
    assert "x_seq" not in forward


def test_single_input_specs_keep_x():
    lif = load_spec("lif")
    assert lif.inputs == ("x",)
    assert "x_seq" in lif.source("fptt", "float32")


def test_wrong_number_of_inputs_is_refused():
    g_e, g_i = _conductances()
    with pytest.raises(TypeError, match=r"takes 2 step input\(s\) \(g_e, g_i\)"):
        F.multi_step(SPEC, g_e, backend="host")
    with pytest.raises(TypeError, match=r"takes 1 step input\(s\) \(x\)"):
        F.multi_step("lif", (g_e, g_i), backend="host")
    with pytest.raises(TypeError, match="takes 2 step input"):
        F.multi_step(SPEC, (g_e, g_i, g_i), backend="reference")


def test_mismatched_inputs_are_refused():
    g_e, g_i = _conductances()
    with pytest.raises(ValueError, match=r"x_seq\[1\]: every step input must match the first"):
        F.multi_step(SPEC, (g_e, g_i[:, :4]), backend="host")
    with pytest.raises(ValueError, match=r"x_seq\[1\]"):
        F.multi_step(SPEC, (g_e, g_i.float()), backend="host")
    with pytest.raises(TypeError, match="x_seq: expected a torch.Tensor, or a tuple"):
        F.multi_step(SPEC, (), backend="host")


@pytest.mark.parametrize(("inputs", "message"), [
    (("g_e", "v"), "'v' is declared twice"),
    (("g_e", "tau"), "'tau' is declared twice"),
    (("g_e", "g_e"), "input 'g_e' is declared twice"),
    (("g_e", "h"), "cannot name an input"),
    (("g_e", "spike"), "cannot name an input"),
    (("g_e", "g_seq"), "kernel argument"),
    ((), "non-empty list of input names"),
    ("g_e", "non-empty list of input names"),
])
def test_bad_input_names_are_refused(inputs, message):
    with pytest.raises(SpecError, match=message):
        dataclasses.replace(_spec(), inputs=inputs)


def test_an_undeclared_input_is_an_unknown_name():
    with pytest.raises(SpecError, match="unknown name 'g_i'"):
        dataclasses.replace(_spec(), inputs=("g_e",))


# ---- the layer: autocuda.nn.Neuron with several inputs ----

def _layer(**kwargs):
    return ann.Neuron(SPEC, **kwargs)


@pytest.mark.parametrize("backend", ["reference", "host"])
def test_layer_step_modes_agree_keep_states_and_reset(backend):
    """'m' over two chunks continues from its states, 's' step by step gives the same spikes and states, and
    both equal the functional API; store_v_seq, reset and detach as for one input."""
    g_e, g_i = _conductances()
    layer = _layer(step_mode="m", store_v_seq=True, backend=backend)
    spikes = torch.cat([layer(g_e[:5], g_i[:5]), layer(g_e[5:], g_i[5:])])
    expected, finals, _ = F.multi_step(SPEC, (g_e, g_i), backend=backend)
    assert spikes.sum() > 0 and torch.equal(spikes, expected)
    torch.testing.assert_close(layer.v, finals[0])
    assert layer.v_seq.shape == (7, 9) and torch.equal(layer.v_seq[-1], layer.v)
    layer.reset()
    assert layer.v == 0.0 and layer.v_seq is None
    layer.step_mode = "s"
    stepped = torch.stack([layer(a, b) for a, b in zip(g_e, g_i)])
    assert torch.equal(stepped, expected) and layer.v_seq.shape == (12, 9)
    torch.testing.assert_close(layer.v, finals[0])


def test_layer_gradients_reach_every_input_and_detach_cuts_them():
    g_e, g_i = (u.requires_grad_(True) for u in _conductances())
    layer = _layer(step_mode="m", backend="host")
    spikes = layer(g_e, g_i)
    grads = torch.autograd.grad(spikes.sum() + (layer.v ** 2).sum(), (g_e, g_i))
    spikes, finals, _ = F.multi_step(SPEC, (g_e, g_i), backend="reference")
    want = torch.autograd.grad(spikes.sum() + (finals[0] ** 2).sum(), (g_e, g_i))
    for got, expected in zip(grads, want):
        assert got.abs().sum() > 0
        torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    layer(g_e, g_i)
    assert layer.v.requires_grad
    layer.detach()
    assert not layer.v.requires_grad


def test_layer_functional_forward_takes_one_tensor_per_input():
    """SpikingJelly's functional protocol: inputs a tuple (g_e, g_i), states explicit, the layer's untouched."""
    g_e, g_i = _conductances()
    layer = _layer(step_mode="m", backend="host")
    (spikes,), (v,) = layer.functional_forward((g_e, g_i), (0.0,))
    expected, finals, _ = F.multi_step(SPEC, (g_e, g_i), backend="host")
    assert torch.equal(spikes, expected) and torch.equal(v, finals[0]) and layer.v == 0.0
    layer.step_mode = "s"
    (spike,), (v1,) = layer.functional_forward((g_e[0], g_i[0]), (0.0,))
    assert torch.equal(spike, expected[0])
    with pytest.raises(TypeError, match=r"takes 2 step input\(s\) \(g_e, g_i\)"):
        layer.functional_forward((g_e[0],), (0.0,))
    for states in (None, 0.0):  # "'NoneType' object is not iterable" (SpikingJelly's: "... not subscriptable")
        with pytest.raises(TypeError, match=r"^states: expected a tuple of the memories \(v\), got"):
            layer.functional_forward((g_e[0], g_i[0]), states)


def test_layer_output_expression_reads_the_inputs():
    """An output that is an expression of the inputs sees each by name (here the excitatory current)."""
    g_e, g_i = _conductances()
    spec = dataclasses.replace(_spec(), output="g_e * (E_e - v)")
    layer = ann.Neuron(spec, step_mode="m", backend="host")
    out = layer(g_e, g_i)
    _, _, seqs = F.multi_step(spec, (g_e, g_i), backend="host", store_state_seq=True)
    torch.testing.assert_close(out, g_e * (3.0 - seqs[0]))


@pytest.mark.parametrize("step_mode", ["s", "m"])
def test_layer_refuses_a_wrong_count_or_unlike_shapes(step_mode):
    g_e, g_i = _conductances()
    if step_mode == "s":
        g_e, g_i = g_e[0], g_i[0]
    layer = _layer(step_mode=step_mode, backend="host")
    with pytest.raises(TypeError, match=r"'conductance_lif' takes 2 step input\(s\) \(g_e, g_i\), one tensor each; "
                                        r"got 1"):
        layer(g_e)
    with pytest.raises(TypeError, match="got 3"):
        layer(g_e, g_i, g_i)
    with pytest.raises(ValueError, match=r"step input 'g_i' has shape \(.*\) but 'g_e' has"):
        layer(g_e, g_i[..., :4])
    with pytest.raises(TypeError, match=r"'lif' takes 1 step input\(s\) \(x\)"):
        ann.Neuron("lif", step_mode=step_mode)(g_e, g_i)
    if step_mode == "m":  # a [T] sequence is one neuron (as in SpikingJelly), so g_i[0] is only unlike g_e
        with pytest.raises(ValueError, match=r"step input 'g_i' has shape \(9,\) but 'g_e' has \(12, 9\)"):
            layer(g_e, g_i[0])
        with pytest.raises(ValueError, match=r"g_e: step_mode 'm' expects a tensor of shape \[T, \*\]"):
            layer(g_e[0, 0], g_i[0, 0])
