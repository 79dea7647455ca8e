"""torch.compile of layers changed between calls: a change either takes effect in the compiled call (its outputs and
gradients those of an eager layer of the new setting) or is refused by an error that names it."""
from __future__ import annotations

import pytest
import torch

from autocuda import nn as ann

sj_surrogate = pytest.importorskip("spikingjelly.activation_based.surrogate")


def _grads(model, x):
    """The output of a call on `x` (the layer reset first, where it has states) and x's gradient."""
    x = x.detach().clone().requires_grad_()
    out = model(x)
    (out * torch.linspace(0.5, 1.5, out.numel(), dtype=x.dtype).view(out.shape)).sum().backward()
    return out.detach(), x.grad


def test_mixing_layers_compiled_take_a_spikingjelly_surrogates_new_values():
    """The PSN family's compiled call runs torch's composition, which calls the SpikingJelly surrogate itself: a
    change of its alpha after a trace is a symbolic float there, which the kernels' surrogate conversion (never
    needed there) failed on (`mixing.fire`, shared by PSN and SlidingPSN)."""
    torch.manual_seed(0)
    layer = ann.SlidingPSN(2, surrogate_function=sj_surrogate.ATan(), step_mode="m")
    x = torch.rand(4, 2, 5, dtype=torch.float64) * 2 - 0.5
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    _grads(compiled, x)
    layer.surrogate_function.alpha = 0.5
    for got, want in zip(_grads(compiled, x), _grads(layer, x)):
        torch.testing.assert_close(got, want)


def test_neuron_compiled_fullgraph_refuses_a_spikingjelly_surrogate_changed_after_the_trace_by_name():
    """A Neuron takes a SpikingJelly surrogate's values again at a call where they changed, eager work that a trace
    cannot do: fullgraph=True refuses it naming surrogate_function (not a Dynamo error deep in the surrogate's
    conversion); assigning the surrogate again takes the values, also in the compiled call."""
    x = torch.rand(3, 2, 5, dtype=torch.float64) * 2
    layer = ann.LIFNode(step_mode="m", backend="reference", surrogate_function=sj_surrogate.ATan())
    compiled = torch.compile(layer, fullgraph=True, backend="aot_eager")
    compiled(x)
    layer.surrogate_function.alpha = 0.5
    layer.reset()
    with pytest.raises(Exception, match="surrogate_function: the values of ATan changed after torch.compile traced "
                                        "LIFNode"):
        compiled(x)
    layer.surrogate_function = layer.surrogate_function
    want = ann.LIFNode(step_mode="m", backend="reference", surrogate_function=sj_surrogate.ATan(alpha=0.5))
    layer.reset()
    for got, expected in zip(_grads(compiled, x), _grads(want, x)):
        torch.testing.assert_close(got, expected)

