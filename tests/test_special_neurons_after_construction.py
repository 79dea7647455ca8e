"""Pins faults found by probing the special neurons outside the generic neuron path (parallel spiking neurons and
their mixing kernels, few-spike coding, DSR, MPBN LIF, the noisy nodes): a bias the mixing kernels would read per
step where torch broadcasts it along the neurons, attributes changed after construction (the surrogate, MaskedPSN's
lambda_, few-spike tables and thresholds, DSR's and the noisy nodes' T, the noisy decode) taking effect or refused by
name, torch.compile(fullgraph=True) with a surrogate of ours not built yet, and DSR's gradient differentiated again
(create_graph=True) on the kernels. CPU only: kernels through the host runner."""
from __future__ import annotations

import pytest
import torch

from autocuda.call import few_spike, mixing
from autocuda.nn.psn import PSN, MaskedPSN, SlidingPSN
from autocuda.nn.spikingjelly_base import BaseNode, SimpleBaseNode
from autocuda.nn.spikingjelly_dsr import DSRIFNode, DSRLIFNode
from autocuda.nn.spikingjelly_few_spike import FewSpikeNode, FewSpikeTable, HGNode, OutlierAwareThresholdNode
from autocuda.nn.spikingjelly_mpbn import MPBNLIFNode
from autocuda.nn.spikingjelly_noisy import NoisyCUBALIFNode, NoisyNonSpikingIFNode
from autocuda.spec.surrogate import ATan, Sigmoid

sj_surrogate = pytest.importorskip("spikingjelly.activation_based.surrogate")


def _table(scale: float = 1.0) -> FewSpikeTable:
    values = [scale, scale / 2, scale / 4, scale / 8]
    return FewSpikeTable(values, values, values)


def test_mixing_kernels_leave_a_bias_torch_broadcasts_along_the_neurons_to_torch():
    # a bias [T] (or [1, T]) against N = T neurons is one value per neuron in torch's addmm, not one per step
    steps = 3
    x = torch.randn(steps, steps, dtype=torch.float64)
    weight = torch.zeros(steps, steps, dtype=torch.float64)
    for bias in (torch.tensor([5.0, -5.0, 0.0], dtype=torch.float64), torch.tensor([[5.0, -5.0, 0.0]],
                                                                                   dtype=torch.float64)):
        assert mixing.fire(x, weight, bias, ATan(), backend="host") is None
    per_step = torch.tensor([[5.0], [-5.0], [0.0]], dtype=torch.float64)
    spikes = mixing.fire(x, weight, per_step, ATan(), backend="host")
    assert spikes is not None
    torch.testing.assert_close(spikes, (torch.addmm(per_step, weight, x) >= 0).to(x.dtype))


def test_masked_psn_lambda_set_to_nan_is_refused_as_at_construction():
    layer = MaskedPSN(2, 3, step_mode="s")
    for value in (float("nan"), torch.tensor(float("nan"))):
        with pytest.raises(ValueError, match="lambda_"):
            layer.lambda_ = value
    layer.lambda_ = 1.0
    assert layer(torch.randn(4)).shape == (4,)


@pytest.mark.parametrize("make", [
    lambda s: PSN(3, surrogate_function=s),
    lambda s: SlidingPSN(2, surrogate_function=s, step_mode="m"),
    lambda s: MaskedPSN(2, 3, surrogate_function=s, step_mode="m"),
    lambda s: FewSpikeNode(_table(), surrogate_function=s, step_mode="m"),
    lambda s: MPBNLIFNode(out_features=2, surrogate_function=s, step_mode="m"),
    lambda s: _SubclassedIF(surrogate_function=s, step_mode="m"),
    lambda s: _SubclassedSimpleIF(surrogate_function=s, step_mode="m"),
], ids=["PSN", "SlidingPSN", "MaskedPSN", "FewSpikeNode", "MPBNLIFNode", "BaseNode", "SimpleBaseNode"])
def test_a_surrogate_of_ours_replaces_a_spikingjelly_one_and_back(make):
    layer = make(sj_surrogate.Sigmoid())
    x = torch.randn(3 if not isinstance(layer, FewSpikeNode) else 4, 5, 2)
    ours = ATan(alpha=3.0)
    layer.surrogate_function = ours
    assert layer.surrogate_function is ours and "surrogate_function" not in layer._modules
    x.requires_grad_(True)
    layer(x).sum().backward()
    theirs = sj_surrogate.Sigmoid()
    layer.surrogate_function = theirs
    assert layer.surrogate_function is theirs
    if hasattr(layer, "reset"):
        layer.reset()
    assert layer(x.detach()).shape == x.shape


class _SubclassedIF(BaseNode):
    """A user's subclass of SpikingJelly's BaseNode (as its docs write one): an IF neuron."""

    def single_step_functional_forward(self, inputs, states, **kwargs):
        (x,), (v,) = inputs, states
        h = v + x
        spike = self.surrogate_function(h - self.v_threshold)
        return (spike,), (h * (1 - spike),)


class _SubclassedSimpleIF(SimpleBaseNode):
    def neuronal_charge(self, x):
        self.v = self.v + x


@pytest.mark.parametrize("make", [lambda: SlidingPSN(2, surrogate_function=Sigmoid(alpha=3.3), step_mode="m"),
                                  lambda: _SubclassedIF(step_mode="m"), lambda: _SubclassedSimpleIF(step_mode="m")],
                         ids=["SlidingPSN", "BaseNode", "SimpleBaseNode"])
def test_torch_compile_fullgraph_takes_a_surrogate_of_ours_not_built_yet(make):
    # (the surrogate's gradient is built when it is set, as for every layer of `nn.arguments.TakesSurrogate`: Dynamo
    # would otherwise trace the sympy that builds it; seconds: Dynamo's own start)
    torch._dynamo.reset()
    layer = make()
    layer.surrogate_function = ATan(alpha=3.1)
    x = torch.randn(3, 2, requires_grad=True)
    compiled = torch.compile(layer, backend="eager", fullgraph=True)
    compiled(x).sum().backward()
    assert x.grad is not None and x.grad.shape == x.shape


def test_few_spike_columns_replaced_with_another_length_are_refused_by_name():
    layer = FewSpikeNode(_table())
    layer.h = torch.tensor([1.0, 0.5])
    with pytest.raises(ValueError, match="theta, h, d"):
        layer(torch.rand(5))
    theta, h, d, cut = layer._kernel_tables()
    # the kernels read K entries of every column: a shorter one is not theirs to read
    assert few_spike.run(torch.rand(5), theta, h, d, cut, layer.surrogate_function, False, backend="host") is None
    outlier = OutlierAwareThresholdNode(_table(), _table(2.0), 1.0)
    outlier.outlier_d = torch.ones(3)
    with pytest.raises(ValueError, match="outlier_d"):
        outlier(torch.rand(5))


def test_hg_node_thresholds_of_another_count_are_refused_by_name():
    layer = HGNode([_table(), _table(2.0)], [1.0])
    layer.gate_thresholds = torch.tensor([1.0, 2.0])
    with pytest.raises(ValueError, match="gate_thresholds"):
        layer(torch.rand(5) * 3)
    layer.gate_thresholds = torch.tensor([2.0])  # a new threshold of the right count takes effect
    x = torch.rand(7) * 4
    torch.testing.assert_close(layer(x), HGNode([_table(), _table(2.0)], [2.0])(x))
    with pytest.raises(TypeError, match="tables"):
        HGNode(_table(), [1.0])


def test_outlier_node_thresholds_set_later_are_checked_and_take_effect():
    layer = OutlierAwareThresholdNode(_table(), _table(2.0), 1.0, 2.0)
    with pytest.raises(TypeError, match="split_threshold"):
        layer.split_threshold = "x"
    with pytest.raises(ValueError, match="clamp_value"):
        layer.clamp_value = -1.0
    layer.clamp_value = 0.5  # below split_threshold: refused at the call, either may be set first
    with pytest.raises(ValueError, match="clamp_value"):
        layer(torch.tensor([3.0]))
    layer.split_threshold = 0.25
    x = torch.tensor([3.0, -0.1])
    torch.testing.assert_close(layer(x), OutlierAwareThresholdNode(_table(), _table(2.0), 0.25, 0.5)(x))


@pytest.mark.parametrize("cls", [DSRIFNode, DSRLIFNode])
def test_dsr_gradient_differentiated_again_on_the_kernels_is_the_references(cls):
    results = []
    for backend in ("host", "torch"):
        layer = cls(T=5, v_threshold=1.0, backend=backend)
        generator = torch.Generator().manual_seed(0)
        x = (torch.rand(5, 4, dtype=torch.float64, generator=generator) * 1.5).requires_grad_()
        grad = torch.randn(5, 4, dtype=torch.float64, generator=generator, requires_grad=True)
        grad_x, grad_v_th = torch.autograd.grad(layer(x), (x, layer.v_threshold), grad, create_graph=True)
        results.append(torch.autograd.grad(grad_x.pow(2).sum() + grad_v_th, grad)[0])
    torch.testing.assert_close(results[0], results[1])


def test_dsr_T_set_later_is_checked():
    layer = DSRIFNode(T=4, backend="host")
    with pytest.raises(ValueError, match="T"):
        layer.T = "a"
    layer.T = 2
    with pytest.raises(ValueError, match="T=2"):
        layer(torch.rand(4, 3, requires_grad=True))


def test_noisy_decode_set_later_is_checked():
    layer = NoisyNonSpikingIFNode(3, T=4, decode="max-mem")
    with pytest.raises(ValueError, match="decode"):
        layer.decode = "foo"
    layer.decode = "last-me"
    layer.is_training = False
    x = torch.randn(4, 2, 3)
    torch.testing.assert_close(layer(x), x.sum(0))


def test_noisy_T_changed_after_reset_noise_takes_the_first_steps_or_asks_for_new_noise():
    layer = NoisyCUBALIFNode(3, T=4, backend="host")
    layer.reset_noise(2, random_state=0)
    with pytest.raises(ValueError, match="T"):
        layer.T = 0
    layer.T = 3
    x = torch.randn(3, 2, 3)
    out = layer(x)
    reference = NoisyCUBALIFNode(3, T=3, backend="torch")
    reference.eps_v_seq, reference.eps_s_seq = layer.eps_v_seq[:, :3], layer.eps_s_seq[:, :3]
    reference.noise_step = -1
    torch.testing.assert_close(out, reference(x))
    layer.T = 6
    with pytest.raises(RuntimeError, match="reset_noise"):
        layer(torch.randn(6, 2, 3))
