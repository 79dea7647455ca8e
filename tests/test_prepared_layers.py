"""A layer's last prepared call (`prepared.layer_multi_step`): a layer's call like its last one runs that call
without building its key; any change of what the key holds (the layer's switches, the compile-time constants'
values, x's shape, dtype, alignment, contiguity or grad, the states' and parameters' types) runs the call the
change asks for. A layer whose switches and parameters are the objects they were, called from a reset, reruns its
settled call (`nn.layer_call.settled_call`: the native operator, which checks x), and no changed call runs it. On
the host runner, every result and gradient equals the full path's bitwise."""
from __future__ import annotations

import copy
import pickle

import pytest
import torch

from autocuda import native, prepared
from autocuda.nn import LIFNode, Neuron
from autocuda.spec.load import spec_from_toml

# Host calls through the native path here, as CUDA calls take it by default (the GPU file runs these cores on CUDA)
pytestmark = pytest.mark.usefixtures("native_on_host")

GAIN_LIF_TOML = """
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
"""
GAIN_LIF = spec_from_toml(GAIN_LIF_TOML)


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
    "another shape, as many neurons": (lambda layer, x: x.detach().flatten(1).requires_grad_(), True),
    "as many elements, another step count": (lambda layer, x: x.detach().reshape(1, -1).requires_grad_(), True),
    "tau, the same float object": (lambda layer, x: (setattr(layer, "tau", layer.tau), x)[1], False),
}
# the changes after which the layer's settled call still serves: nothing it was made from changed (x's neuron shape
# only shapes the results, which the operator gives in x's shape)
SERVED = {"another shape, as many neurons", "tau, the same float object"}


def settled_runs(layer):
    """The list that each run of the layer's settled call with results (an x it fits) appends to; None where the
    layer has no settled call (the native path off, or its operator not loaded)."""
    last = layer._last_call
    if not native.USE or last.settled is None:
        assert not (native.USE and native.loaded()), "a layer called from a reset settles its native call"
        return None
    ran = []
    run, *rest = last.settled

    def spy(plan, x, numbers):
        results = run(plan, x, numbers)
        if results:
            ran.append(tuple(x.shape))
        return results

    last.settled = (spy, *rest)
    return ran


def needs_the_native_operator():
    if not native.USE:
        pytest.skip("the native call path is off (AUTOCUDA_NATIVE=0): a layer settles native calls only")
    if not native.ensure():
        pytest.skip(f"the native operator is not loaded ({native.status()})")


def check_change(change, monkeypatch, layer, x):
    """Two calls of `layer` on x, then `change` and two more: each equal to the full path's."""
    make, another = CHANGES[change]
    for _ in range(2):  # prepares, then runs the layer's last call
        assert_same(outcome(layer, x), full_path(layer, x, monkeypatch), "before")
    before = layer._last_call.prepared
    assert before is not None
    ran = settled_runs(layer)
    changed = make(layer, x)
    got = outcome(layer, changed)
    if ran is not None:
        assert bool(ran) == (change in SERVED), change
    assert_same(got, full_path(layer, changed, monkeypatch), change)
    assert_same(outcome(layer, changed), got, f"{change}, again")
    served = ran is not None and change in SERVED  # the settled call ran: no other prepared call was asked for
    assert (layer._last_call.prepared is not before) == (another and not served), change
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


def check_settled(layer, x, monkeypatch):
    """From its second call on, a layer called from a reset on x runs its settled call, not the check, with the full
    path's results."""
    want = full_path(layer, x, monkeypatch)
    assert_same(outcome(layer, x), want, "settles")
    ran = settled_runs(layer)
    checked = []
    original = prepared.layer_multi_step
    monkeypatch.setattr(prepared, "layer_multi_step", lambda *a: (checked.append(a), original(*a))[1])
    for _ in range(3):
        got = outcome(layer, x)
        assert_same(got, want, "again")
        assert layer.v.shape == x.shape[1:] and (got[0].grad_fn is not None) == x.requires_grad
    assert ran == [tuple(x.shape)] * 3 and checked == [], "three calls, each the settled call's, none through the check"


@pytest.mark.parametrize("grad", [False, True])
@pytest.mark.parametrize("shape", [(5, 12), (5, 3, 4)])
def test_a_layer_called_from_a_reset_reruns_its_settled_call(shape, grad, monkeypatch):
    needs_the_native_operator()
    check_settled(LIFNode(tau=2.0, step_mode="m", backend="host"), x_of(shape, grad=grad), monkeypatch)


def settled_layer():
    """A LIF layer that has settled its call on x (no grad), x, the call's results and the settled call's runs."""
    needs_the_native_operator()
    layer = LIFNode(tau=2.0, step_mode="m", backend="host")
    x = x_of(grad=False)
    want = outcome(layer, x)
    return layer, x, want, settled_runs(layer)


@pytest.mark.parametrize("switch", ["prepared.ENABLED", "native.USE"])
def test_the_switches_turn_the_settled_call_off(switch, monkeypatch):
    layer, x, want, ran = settled_layer()
    module, name = switch.split(".")
    monkeypatch.setattr({"prepared": prepared, "native": native}[module], name, False)
    assert_same(outcome(layer, x), want, switch)
    assert ran == []


def test_a_state_that_is_not_a_float_leaves_the_settled_call(monkeypatch):
    layer, x, _, ran = settled_layer()
    for value in (0.25, 1, torch.tensor(0.25, dtype=torch.float64)):  # a float, an int, a 0-d tensor
        layer.reset()
        layer.v = value
        got = layer(x)
        layer.v = value
        monkeypatch.setattr(prepared, "ENABLED", False)
        assert torch.equal(got, layer(x)), value
        monkeypatch.setattr(prepared, "ENABLED", True)
    assert ran == [(5, 3, 4)], "only the float state ran the settled call"


def test_functorch_transforms_leave_the_settled_call():
    layer, x, _, ran = settled_layer()

    def loss(inp):
        layer.reset()
        return layer(inp).sum()

    with pytest.raises(RuntimeError, match="functorch transforms"):  # the full path's refusal (a kernel backend)
        torch.func.grad(loss)(x)
    assert ran == []


class ScheduledTau(LIFNode):
    """tau read through a property: not an attribute in the layer's dict, so it may change without a write."""

    tau = property(lambda self: self.schedule[-1], lambda self, value: setattr(self, "schedule", [value]))


def test_a_parameter_read_through_a_property_is_read_on_every_call(monkeypatch):
    layer = ScheduledTau(tau=2.0, step_mode="m", backend="host")
    x = x_of(grad=False)
    outcome(layer, x)
    for tau in (4.0, 8.0):
        layer.schedule.append(tau)
        assert_same(outcome(layer, x), full_path(layer, x, monkeypatch), tau)


def test_the_references_a_layer_passes_decide_its_call(monkeypatch):
    """The spec and surrogate references (set where a layer is built or unpickled) are read on every call."""
    from autocuda.runtime.plans import spec_ref, surrogate_ref
    from autocuda.surrogate import ATan

    layer = Neuron(GAIN_LIF, step_mode="m", backend="host")
    x = x_of()
    outcome(layer, x)
    layer._surrogate_ref = surrogate_ref(ATan(alpha=3.0))
    assert_same(outcome(layer, x), full_path(layer, x, monkeypatch), "surrogate")
    halved = spec_from_toml(GAIN_LIF_TOML.replace("/ tau", "/ (2 * tau)").replace("gain_lif", "halved_gain_lif"))
    layer._spec_ref = spec_ref(halved)
    assert_same(outcome(layer, x), full_path(layer, x, monkeypatch), "spec")
    from autocuda.spec.step import STATE, Output

    layer._output = Output(STATE, state="v")  # what a spec whose output is its membrane gives a layer
    got = outcome(layer, x)
    assert_same(got, full_path(layer, x, monkeypatch), "output")
    assert not torch.equal(got[0], got[0].round()), "the membrane, not spikes"
