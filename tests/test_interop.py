"""autocuda layers inside SpikingJelly networks (runs only where SpikingJelly imports; skipped otherwise)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import autocuda.surrogate as ours
from autocuda.nn import IzhikevichNode, LIFNode

try:  # any failure (not installed, a dependency missing or too new) means: nothing to test against here
    from spikingjelly.activation_based import functional as sj_functional
    from spikingjelly.activation_based import layer as sj_layer
    from spikingjelly.activation_based import neuron as sj_neuron
    from spikingjelly.activation_based import surrogate as sj_surrogate
except Exception as error:
    pytest.skip(f"SpikingJelly does not import: {type(error).__name__}: {error}", allow_module_level=True)


def network(step_mode: str) -> nn.Sequential:
    return nn.Sequential(
        sj_layer.Linear(6, 5, step_mode=step_mode),
        LIFNode(tau=2.0, step_mode=step_mode),
        sj_layer.Linear(5, 4, step_mode=step_mode),
        sj_neuron.LIFNode(tau=2.0, step_mode=step_mode),
        sj_layer.Linear(4, 3, step_mode=step_mode),
        IzhikevichNode(step_mode=step_mode),
    )


@pytest.mark.parametrize("step_mode", ["s", "m"])
def test_reset_net_resets_our_layers(step_mode: str) -> None:
    torch.manual_seed(0)
    net = network(step_mode)
    ours_lif, ours_izh = net[1], net[5]
    x = 3 * torch.rand(6, 2, 6)
    outputs = [net(x)] if step_mode == "m" else [net(step) for step in x]
    assert isinstance(ours_lif.v, torch.Tensor) and ours_lif.v.shape == (2, 5)
    assert isinstance(ours_izh.w, torch.Tensor)
    sj_functional.reset_net(net)
    assert ours_lif.v == 0.0 and ours_izh.v == 0.0 and ours_izh.w == 0.0
    again = [net(x)] if step_mode == "m" else [net(step) for step in x]
    for a, b in zip(outputs, again):  # the same sequence from the same start gives the same spikes
        assert torch.equal(a, b)


def test_gradients_flow_through_a_mixed_network() -> None:
    torch.manual_seed(1)
    net = network("m")
    net(3 * torch.rand(8, 2, 6)).sum().backward()
    assert all(p.grad is not None for p in net.parameters())


@pytest.mark.parametrize(("theirs", "expected"), [
    (sj_surrogate.ATan(), ours.ATan(alpha=2.0)),
    (sj_surrogate.ATan(alpha=3.0), ours.ATan(alpha=3.0)),
    (sj_surrogate.Sigmoid(alpha=5.0), ours.Sigmoid(alpha=5.0)),
    (sj_surrogate.Erf(), ours.Erf(alpha=2.0)),
    (sj_surrogate.PiecewiseLeakyReLU(w=0.5, c=0.02), ours.PiecewiseLeakyReLU(w=0.5, c=0.02)),
])
def test_their_surrogate_objects_are_accepted(theirs, expected) -> None:
    assert ours.get_surrogate(theirs) == expected
    lif = LIFNode(surrogate_function=theirs, step_mode="m")
    x = (2 * torch.rand(5, 7)).requires_grad_(True)
    lif(x).sum().backward()
    reference = LIFNode(surrogate_function=expected, step_mode="m")
    y = x.detach().clone().requires_grad_(True)
    reference(y).sum().backward()
    torch.testing.assert_close(x.grad, y.grad)


def test_their_non_spiking_mode_is_refused() -> None:
    with pytest.raises(ValueError, match="spiking=False"):
        LIFNode(surrogate_function=sj_surrogate.ATan(spiking=False))


def test_same_spikes_as_their_lif() -> None:
    torch.manual_seed(2)
    x = 2 * torch.rand(10, 3, 8)
    theirs = sj_neuron.LIFNode(tau=2.0, step_mode="m", surrogate_function=sj_surrogate.ATan())
    mine = LIFNode(tau=2.0, step_mode="m", surrogate_function=sj_surrogate.ATan())
    assert torch.equal(theirs(x), mine(x))
    torch.testing.assert_close(theirs.v, mine.v)
