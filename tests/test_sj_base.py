"""SpikingJelly 2.0's neuron base classes (`autocuda.nn.BaseNode`, `AdaptBaseNode`, `SimpleBaseNode`,
`NonSpikingBaseNode`): a subclass written for SpikingJelly's (the same body, on either base) runs as it does
there, in float64 on the CPU: equal spikes, memories, v_seq and gradients in both step modes over calls and a
reset; the free functions of SpikingJelly's memory protocol; the checks."""
from __future__ import annotations

from typing import Any

import pytest
import torch

import autocuda.nn as our

sj_base_node = pytest.importorskip("spikingjelly.activation_based.neuron.base_node",
                                   reason="SpikingJelly 2.0 is a test extra")
from spikingjelly.activation_based import base, functional  # noqa: E402
from spikingjelly.activation_based.neuron import adapt as sj_adapt  # noqa: E402

F64 = torch.float64


def leaky_step(self: Any, inputs: tuple, states: tuple, **kwargs: Any) -> tuple:
    """A LIF step in SpikingJelly 2.0's BaseNode contract (`single_step_functional_forward`)."""
    x, v = inputs[0], states[0]
    h = v + (x - v) / kwargs.get("tau", 2.0)
    spike = self.surrogate_function(h - self.v_threshold)
    spike_d = spike.detach() if self.detach_reset else spike
    v = self.apply_soft_reset(h, spike_d, self.v_threshold) if self.v_reset is None else \
        self.apply_hard_reset(h, spike_d, self.v_reset)
    return (spike,), (v, *states[1:])


def adapting_step(self: Any, inputs: tuple, states: tuple, **kwargs: Any) -> tuple:
    """An AdEx-like step on AdaptBaseNode: the membrane less the adaptation current, w jumping by b per spike."""
    x, v, w = inputs[0], states[0], states[1]
    h = v + (x - w - v) / 2.0
    spike = self.surrogate_function(h - self.v_threshold)
    w = self.jit_neuronal_adaptation(w, self.tau_w, self.a, self.v_rest, h) + self.b * spike
    return (spike,), (self.apply_hard_reset(h, spike, self.v_reset), w)


def charge(self: Any, x: torch.Tensor) -> None:
    self.v = self.v + (x - self.v) / 2.0


def pair(theirs_base: type, ours_base: type, method: str, body: Any, *args: Any, **kwargs: Any) -> tuple:
    """The same subclass body on SpikingJelly's base and on ours, built with the same arguments."""
    layers = [type(f"Sub{base_.__name__}", (base_,), {method: body})(*args, **kwargs) for base_ in
              (theirs_base, ours_base)]
    return layers[0], layers[1]


def run(layer: torch.nn.Module, x: torch.Tensor, step_mode: str, **kwargs: Any) -> torch.Tensor:
    if step_mode == "m":
        return layer(x, **kwargs)
    return torch.stack([layer(step, **kwargs) for step in x])


def check_calls(theirs: torch.nn.Module, ours: torch.nn.Module, step_mode: str, **kwargs: Any) -> None:
    for seed in (1, 2, 3):  # two calls, a reset, a third
        generator = torch.Generator().manual_seed(seed)
        x = (torch.randn(5, 3, 4, generator=generator, dtype=F64) + 0.8).requires_grad_(True)
        out_theirs, out_ours = run(theirs, x, step_mode, **kwargs), run(ours, x, step_mode, **kwargs)
        assert torch.equal(out_ours, out_theirs)
        memories = [list(layer.named_memories()) for layer in (theirs, ours)]
        assert [n for n, _ in memories[0]] == [n for n, _ in memories[1]]
        for (name, a), (_, b) in zip(*memories):
            torch.testing.assert_close(b, a, rtol=0, atol=0, msg=name)
        if getattr(theirs, "store_v_seq", False):
            torch.testing.assert_close(ours.v_seq, theirs.v_seq, rtol=0, atol=0)
        (grad_theirs,) = torch.autograd.grad((out_theirs * x).sum() + (theirs.v ** 2).sum(), x)
        (grad_ours,) = torch.autograd.grad((out_ours * x).sum() + (ours.v ** 2).sum(), x)
        torch.testing.assert_close(grad_ours, grad_theirs, rtol=1e-12, atol=1e-14)  # two Sigmoid formulas
        functional.detach_net(theirs)
        functional.detach_net(ours)
        if seed == 2:
            functional.reset_net(theirs)
            functional.reset_net(ours)
            assert ours.v == theirs.v and getattr(ours, "v_seq", None) is None


@pytest.mark.parametrize("step_mode", ["s", "m"])
@pytest.mark.parametrize("kwargs", [{}, {"v_reset": None, "detach_reset": True, "store_v_seq": True}])
def test_a_base_node_subclass_runs_as_on_theirs(kwargs: dict, step_mode: str) -> None:
    theirs, ours = pair(sj_base_node.BaseNode, our.BaseNode, "single_step_functional_forward", leaky_step,
                        v_threshold=0.75, step_mode=step_mode, **kwargs)
    assert isinstance(ours, base.MemoryModule) and not isinstance(ours, sj_base_node.BaseNode)
    check_calls(theirs, ours, step_mode, tau=3.0)  # keyword arguments reach the step, as SpikingJelly's
    x = torch.rand(2, 3, dtype=F64)
    (out_theirs,), states_theirs = theirs.functional_forward((x,), (0.25,))
    (out_ours,), states_ours = ours.functional_forward((x,), (0.25,))
    assert torch.equal(out_ours, out_theirs) and torch.equal(states_ours[0], states_theirs[0])


@pytest.mark.parametrize("step_mode", ["s", "m"])
def test_an_adapt_base_node_subclass_runs_as_on_theirs(step_mode: str) -> None:
    theirs, ours = pair(sj_adapt.AdaptBaseNode, our.AdaptBaseNode, "single_step_functional_forward",
                        adapting_step, v_reset=-0.1, w_rest=0.05, tau_w=3.0, a=0.3, b=0.2, step_mode=step_mode)
    check_calls(theirs, ours, step_mode)
    assert ours.extra_repr() == theirs.extra_repr()


@pytest.mark.parametrize("step_mode", ["s", "m"])
def test_a_simple_base_node_subclass_runs_as_on_theirs(step_mode: str) -> None:
    theirs, ours = pair(sj_base_node.SimpleBaseNode, our.SimpleBaseNode, "neuronal_charge", charge,
                        v_threshold=0.75, v_reset=None, step_mode=step_mode)
    check_calls(theirs, ours, step_mode)


@pytest.mark.parametrize("decode", [None, "max-abs-mem", "last_mem"])
def test_a_non_spiking_base_node_subclass_runs_as_on_theirs(decode: str | None) -> None:
    theirs, ours = pair(sj_base_node.NonSpikingBaseNode, our.NonSpikingBaseNode, "neuronal_charge", charge,
                        decode=decode)
    x = torch.randn(4, 3, dtype=F64, requires_grad=True)
    out_theirs, out_ours = theirs(x), ours(x)
    if decode is None:
        out_theirs, out_ours = torch.stack(out_theirs), torch.stack(out_ours)
    assert torch.equal(out_ours, out_theirs)
    grads = [torch.autograd.grad((out * out).sum(), x)[0] for out in (out_theirs, out_ours)]
    assert torch.equal(grads[0], grads[1])
    with pytest.raises(ValueError, match="^decode:"):
        our.NonSpikingBaseNode(decode="max")


def test_the_contracts_a_subclass_must_fill_are_named() -> None:
    with pytest.raises(NotImplementedError, match="BaseNode must implement single_step_functional_forward"):
        our.BaseNode()(torch.zeros(2))
    with pytest.raises(NotImplementedError, match="SimpleBaseNode must implement neuronal_charge"):
        our.SimpleBaseNode()(torch.zeros(2))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"v_threshold": "1"}, "^v_threshold:"), ({"v_reset": True}, "^v_reset:"), ({"detach_reset": 0}, "^detach_reset:"),
    ({"store_v_seq": None}, "^store_v_seq:"), ({"step_mode": "x"}, "^step_mode:"),
])
def test_base_node_checks_name_the_argument(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        our.BaseNode(**kwargs)
    with pytest.raises(ValueError, match="^tau_w:"):
        our.AdaptBaseNode(tau_w=None)
