"""Random sequences of what a user does with a built layer, applied alike to a layer on the host runner (its programs,
keyed calls and bound launches; with --slow the native plans too) and its twin on the torch reference: calls in
both step modes with and without gradients and under no_grad, resets, constructor arguments set, surrogates swapped
or changed in place, states set, in-place steps on learnable parameters. After every call the outputs, states,
stored sequences and gradients agree, so a cache that misses a change shows up as a difference. Each sequence is
drawn from a fixed seed: the same operations every run."""
from __future__ import annotations

import inspect
import random
from typing import Any

import pytest
import torch
from conftest import examples

import autocuda.nn as ann
from autocuda import surrogate as sg
from autocuda.call import native
from autocuda.toolchain.host import cxx

pytestmark = pytest.mark.skipif(cxx.missing() is not None, reason=f"host runner: {cxx.missing()}")

F64 = torch.float64
SURROGATES = (lambda: sg.Sigmoid(alpha=2.0), lambda: sg.ATan(alpha=1.0), lambda: sg.PiecewiseQuadratic(alpha=1.0))
UNSET = ("self", "step_mode", "backend", "store_v_seq", "surrogate_function", "init_tau", "w_rest")
CLASSES = ("LIFNode", "ParametricLIFNode", "IzhikevichNode", "CUBALIFNode")  # by default: 1, 2 states, learnable w
MORE_CLASSES = ("IFNode", "ALIFNode", "QIFNode", "EIFNode", "AdExNode", "KLIFNode", "TernaryLIFNode")
# Calls most often, half of them from a reset (a training loop's batch: its states numbers, from which a layer's kept
# configuration runs the call at once, `nn.layer_call.run_keyed`), so that changes between such calls are drawn
OPERATIONS = ("call",) * 4 + ("batch",) * 4 + ("reset",) + ("attribute",) * 3 + ("state",) * 2 + (
    "surrogate", "alpha", "mode", "step")


def _choices(name: str) -> dict[str, list[Any]]:
    """Values to set for each number and flag of a class's constructor: its default and another."""
    found: dict[str, list[Any]] = {"store_v_seq": [True, False]}
    for p in inspect.signature(getattr(ann, name).__init__).parameters.values():
        if p.name in UNSET:
            continue
        if isinstance(p.default, bool):
            found[p.name] = [True, False]
        elif isinstance(p.default, (int, float)):
            found[p.name] = [float(p.default), float(p.default) * 1.25 + 0.1]
    if "v_reset" in found:
        found["v_reset"].append(None)
    return found


def _outputs(layer: Any, x: torch.Tensor, gradients: bool, no_grad: bool) -> list[torch.Tensor]:
    """A call's spikes, membrane, stored sequence, and gradients of x and the learnable parameters; the states are
    detached after it (a graph per call, as in training)."""
    leaf = x.clone().requires_grad_(gradients)
    with torch.no_grad() if no_grad else torch.enable_grad():
        spikes = layer(leaf)
    v = layer.v
    found = [spikes.detach(), v.detach() if isinstance(v, torch.Tensor) else x.new_tensor(float(v))]
    if layer.store_v_seq and layer.step_mode == "m" and getattr(layer, "v_seq", None) is not None:
        found.append(layer.v_seq.detach())
    if spikes.requires_grad and gradients:
        weights = torch.linspace(-1, 1, spikes.numel(), dtype=F64, device=x.device).view(spikes.shape)
        loss = (spikes * weights).sum() + (v.sum() * 0.5 if isinstance(v, torch.Tensor) and v.requires_grad else 0)
        wanted = [leaf, *(p for p in layer.parameters() if p.requires_grad)]
        found += [x.new_zeros(1) if g is None else g
                  for g in torch.autograd.grad(loss, wanted, allow_unused=True)]
    for name in layer.__dict__["_state_names"]:
        if isinstance(getattr(layer, name), torch.Tensor):
            setattr(layer, name, getattr(layer, name).detach())
    return found


def _run(name: str, seed: int, length: int, backend: str = "host") -> None:
    """One sequence of `length` operations drawn from `seed`, on a layer of class `name` on `backend` (its tensors on
    the GPU for "cuda") and its reference twin."""
    draw = random.Random(seed)
    device = "cuda" if backend == "cuda" else "cpu"
    host, reference = (getattr(ann, name)(backend=b).double().to(device) for b in (backend, "reference"))
    host.step_mode = reference.step_mode = draw.choice(["s", "m"])
    training = draw.random() < 0.7
    reference.load_state_dict(host.state_dict())
    choices, shape, done = _choices(name), draw.choice([(5,), (2, 3)]), []
    for _ in range(length):
        operation = draw.choice(OPERATIONS)
        done.append(operation)
        if operation == "reset":
            host.reset(), reference.reset()
        elif operation == "attribute":
            attribute = draw.choice(sorted(choices))
            value = draw.choice(choices[attribute])
            done[-1] += f" {attribute}={value}"
            refused = []
            for layer in (host, reference):
                try:
                    setattr(layer, attribute, value)
                except (ValueError, TypeError) as error:  # a value the class refuses (EIF's reset order, say)
                    refused.append(str(error))
            assert len(refused) in (0, 2), f"{name}: refused by one layer only: {refused} after {done}"
        elif operation == "surrogate":
            pick = draw.randrange(len(SURROGATES))
            host.surrogate_function, reference.surrogate_function = SURROGATES[pick](), SURROGATES[pick]()
            done[-1] += f" {host.surrogate_function!r}"
        elif operation == "alpha":
            value = draw.choice([1.5, 3.0])
            for layer in (host, reference):
                layer.surrogate_function.alpha = value
            done[-1] += f" {value}"
        elif operation == "mode":
            host.step_mode = reference.step_mode = draw.choice(["s", "m"])
            done[-1] += f" {host.step_mode}"
        elif operation == "state":
            if draw.random() < 0.5:
                host.v = reference.v = 0.25
            else:
                values = torch.randn(shape, dtype=F64, generator=torch.Generator().manual_seed(len(done))).to(device)
                host.v, reference.v = values.clone(), values.clone()
        elif operation == "step":  # an optimiser's step: in place, under no_grad
            with torch.no_grad():
                for p, q in zip(host.parameters(), reference.parameters()):
                    change = 0.1 * torch.randn(p.shape, dtype=F64,
                                               generator=torch.Generator().manual_seed(len(done))).to(device)
                    p.add_(change), q.add_(change)
        else:
            if operation == "batch":
                host.reset(), reference.reset()
            gradients = training if draw.random() < 0.9 else not training  # mostly as the episode trains
            no_grad = draw.random() < 0.1
            size = (3, *shape) if host.step_mode == "m" else shape
            x = (torch.rand(size, dtype=F64, generator=torch.Generator().manual_seed(seed * 1000 + len(done))) * 3
                 - 0.5).to(device)
            done[-1] += f" {host.step_mode} gradients={gradients} no_grad={no_grad}"
            got, want = _outputs(host, x, gradients, no_grad), _outputs(reference, x, gradients, no_grad)
            assert len(got) == len(want), f"{name}: outputs {len(got)} against {len(want)} after {done}"
            for i, (a, b) in enumerate(zip(got, want)):
                torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9, equal_nan=True,
                                           msg=lambda m, i=i: f"{name}, output {i}, after {done}: {m}")


@pytest.mark.parametrize("name", CLASSES + (MORE_CLASSES if examples(1, 0) else ()))
def test_a_layer_changed_between_calls_computes_what_its_reference_twin_does(name: str) -> None:
    for seed in range(examples(40, 2)):
        _run(name, seed, examples(80, 40))


@pytest.mark.skipif(not native.USE, reason="the native path is off (AUTOCUDA_NATIVE=0)")
def test_the_native_plans_of_a_changed_layer_compute_what_its_reference_twin_does(monkeypatch) -> None:
    """The same on the native operator's plans (host calls take them where `native.HOST` holds): slow, as the
    library is built with the real compiler where it is not in the cache."""
    if examples(1, 0) == 0:
        pytest.skip("builds the native library where the cache has none: --slow")
    native.ensure()
    monkeypatch.setattr(native, "HOST", True)
    for name in CLASSES + MORE_CLASSES:
        for seed in range(10):
            _run(name, seed, 80)


def test_the_sequences_catch_a_layer_that_keeps_a_stale_configuration(monkeypatch) -> None:
    """Proof that the sequences can fail: a keyed call that takes every read object for the one it kept (its identity
    check always true) runs with stale switches and parameters, and the twins part."""
    from autocuda.nn import layer_call

    monkeypatch.setattr(layer_call, "is_", lambda a, b: True)
    parted = []
    for name in CLASSES:
        try:
            for seed in range(examples(40, 2)):
                _run(name, seed, examples(80, 40))
        except AssertionError:
            parted.append(name)
    assert len(parted) >= 2, f"only {parted} parted from their twins"
