"""A layer's last prepared call (`prepared.layer_multi_step`): a layer's call like its last one runs that call
without building its key; any change of what the key holds (the layer's switches, the compile-time constants'
values, x's shape, dtype, alignment, contiguity or grad, the states' and parameters' types) runs the call the
change asks for. On the host runner, every result and gradient equals the full path's bitwise."""
from __future__ import annotations

import copy
import pickle

import pytest
import torch

from autocuda import prepared
from autocuda.nn import LIFNode, Neuron
from autocuda.spec.load import spec_from_toml

GAIN_LIF = spec_from_toml("""
name = "gain_lif"
charge = "v + (a0 * x - (v - v_reset)) / tau"
reset = "hard"
[params]
tau = 2.0
v_threshold = 1.0
v_reset = 0.0
a0 = { default = 1.0, kind = "constant" }
[states]
v = "v_reset"
""")


def x_of(shape=(5, 3, 4), dtype=torch.float64, grad=True, device="cpu"):
    x = torch.rand(*shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64) * 2
    return x.to(device, dtype).requires_grad_(grad)


def outcome(layer, x):
    """The layer's output from a reset, its final membrane and, where x records a graph, x's gradient."""
    layer.reset()
    out = layer(x)
    results = [out, layer.v]
    if out.grad_fn is not None:
        weights = torch.linspace(0.5, 1.5, out.numel(), dtype=out.dtype, device=out.device).view(out.shape)
        results.append(torch.autograd.grad((out * weights).sum(), x)[0])
    return results


def full_path(layer, x, monkeypatch):
    monkeypatch.setattr(prepared, "ENABLED", False)
    try:
        return outcome(layer, x)
    finally:
        monkeypatch.setattr(prepared, "ENABLED", True)


def assert_same(got, want, what):
    assert len(got) == len(want), what
    for g, w in zip(got, want):
        assert g.shape == w.shape and g.dtype == w.dtype and torch.equal(g, w), what


def misaligned(x):
    """x's values in storage that starts one element later: contiguous, its address not 16-byte aligned."""
    flat = torch.empty(x.numel() + 1, dtype=x.dtype, device=x.device)[1:]
    return flat.view(x.shape).copy_(x.detach()).requires_grad_(x.requires_grad)


# change -> (how, whether the layer's call then runs another prepared call: False where it is the same call, or
# where the full path runs it: recompute's checkpoint, a view that is not contiguous)
CHANGES = {
    "tau (a number: the same call)": (lambda layer, x: (setattr(layer, "tau", 3.0), x)[1], False),
    "a0 (a constant: another kernel)": (lambda layer, x: (setattr(layer, "a0", 2.5), x)[1], True),
    "v_reset None (a soft reset)": (lambda layer, x: (setattr(layer, "v_reset", None), x)[1], True),
    "detach_reset": (lambda layer, x: (setattr(layer, "detach_reset", True), x)[1], True),
    "store_v_seq": (lambda layer, x: (setattr(layer, "store_v_seq", True), x)[1], True),
    "save_h": (lambda layer, x: (setattr(layer, "save_h", False), x)[1], True),
    "recompute": (lambda layer, x: (setattr(layer, "recompute", True), x)[1], False),
    "backend torch (the reference)": (lambda layer, x: (setattr(layer, "backend", "torch"), x)[1], False),
    "dtype": (lambda layer, x: x.detach().float().requires_grad_(), True),
    "shape": (lambda layer, x: x.detach()[:3].clone().requires_grad_(), True),
    "neuron shape": (lambda layer, x: x.detach()[:, :2].clone().requires_grad_(), True),
    "no grad": (lambda layer, x: x.detach(), True),
    "grad again": (lambda layer, x: x.detach().requires_grad_(), True),  # after calls without it (below)
    "misaligned": (lambda layer, x: misaligned(x), True),
    "not contiguous": (lambda layer, x: x.detach().transpose(1, 2).contiguous().transpose(1, 2).requires_grad_(),
                       False),
}


def check_change(change, monkeypatch, layer, x):
    """Two calls of `layer` on x, then `change` and two more: each equal to the full path's."""
    make, another = CHANGES[change]
    for _ in range(2):  # prepares, then runs the layer's last call
        assert_same(outcome(layer, x), full_path(layer, x, monkeypatch), "before")
    before = layer._last_call.prepared
    assert before is not None
    changed = make(layer, x)
    got = outcome(layer, changed)
    assert_same(got, full_path(layer, changed, monkeypatch), change)
    assert_same(outcome(layer, changed), got, f"{change}, again")
    assert (layer._last_call.prepared is not before) == another, change
    if layer.backend == "torch":  # torch's ops ran, not a kernel: autograd recorded theirs
        assert "NeuronCall" not in got[0].grad_fn.name() and got[0].grad_fn.name() != "_EagerBackward"
    if layer.store_v_seq:
        assert layer.v_seq.shape == changed.shape


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_change_between_calls_runs_the_call_it_asks_for(change, monkeypatch):
    layer = Neuron(GAIN_LIF, step_mode="m", backend="host")
    check_change(change, monkeypatch, layer, x_of(grad=change != "grad again"))


def test_a_repeated_call_builds_no_key_and_reads_the_numbers_afresh(monkeypatch):
    layer = LIFNode(tau=2.0, step_mode="m", backend="host")
    x = x_of()
    outcome(layer, x)
    keys = []
    original = prepared._key
    monkeypatch.setattr(prepared, "_key", lambda *a: (keys.append(a), original(*a))[1])
    for tau in (2.0, 4.0, 8.0):
        layer.tau = tau
        got = outcome(layer, x)
        assert_same(got, full_path(layer, x, monkeypatch), tau)
    assert keys == [], "the layer's last call ran: no call built a key (the full path's calls build none either)"


def test_tensor_states_and_parameters_take_the_full_path(monkeypatch):
    layer = LIFNode(tau=2.0, step_mode="m", backend="host")
    x = x_of(grad=False)
    outcome(layer, x)
    layer.v = torch.full((3, 4), 0.5, dtype=torch.float64)  # a call that goes on from a tensor state
    got = layer(x)
    layer.v = torch.full((3, 4), 0.5, dtype=torch.float64)
    monkeypatch.setattr(prepared, "ENABLED", False)
    assert torch.equal(got, layer(x))
    monkeypatch.setattr(prepared, "ENABLED", True)
    layer.tau = torch.tensor(3.0, dtype=torch.float64)
    assert_same(outcome(layer, x), full_path(layer, x, monkeypatch), "tensor tau")


def test_copies_of_a_layer_start_without_its_last_call():
    layer = LIFNode(tau=2.0, step_mode="m", backend="host")
    x = x_of(grad=False)
    want = outcome(layer, x)
    assert layer._last_call.prepared is not None
    for copied in (copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))):
        assert copied._last_call is not layer._last_call and copied._last_call.prepared is None
        assert_same(outcome(copied, x), want, type(copied))
    old = pickle.loads(pickle.dumps(layer))
    del old.__dict__["_last_call"]  # a layer pickled before layers kept their last call
    assert_same(outcome(old, x), want, "no _last_call")
