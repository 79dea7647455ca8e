"""Pins faults found by probing how layers and networks are saved, loaded, copied and moved:

- a network watched by a `Monitor` saves and loads whole (`torch.save`, `pickle`): the loaded copy is not watched
  (as a deep copy is not), and the original keeps recording;
- a layer deep-copies after a training call (its states, v_seq and the like carry an autograd graph, which
  torch's deepcopy refused, naming weight_norm): the copy holds them detached, as pickling does, and then runs and
  trains as the original does;
- `Module.to` moves a layer's `v_seq` with its states: single steps after `.double()` go on appending to it (it
  restarted, silently dropping the steps before, while the states went on).
"""
from __future__ import annotations

import copy
import io
import pickle

import pytest
import torch
from backends import CPU_BACKENDS
from torch import nn

from autocuda.nn import BatchNormNeuron, ComplementaryLIFNode, LIFNode, ParametricLIFNode
from autocuda.tools.monitor import Monitor


def _saved_and_loaded(module: nn.Module) -> nn.Module:
    buffer = io.BytesIO()
    torch.save(module, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


def test_a_monitored_network_saves_and_loads_whole_and_its_copy_is_not_watched() -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), LIFNode(step_mode="m", backend="reference"))
    x = torch.rand(3, 2, 4) * 2
    monitor = Monitor(net)
    net(x)
    assert monitor.count == 2  # a spike and a membrane record
    for loaded in (_saved_and_loaded(net), pickle.loads(pickle.dumps(net))):
        loaded[1].reset()
        net[1].reset()
        assert torch.equal(loaded(x), net(x))
        assert loaded[1].store_v_seq is False  # the monitor turned it on for its call only
    assert monitor.count == 6  # the original's three calls alone


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("make", [
    lambda backend: ParametricLIFNode(step_mode="m", store_v_seq=True, backend=backend),
    lambda backend: ComplementaryLIFNode(step_mode="m", backend=backend),  # its v_charged, m, state_seqs
    lambda backend: BatchNormNeuron(4, "parametric_lif", dims=1, step_mode="m", backend=backend),
], ids=["plif", "clif", "batchnorm"])
def test_a_layer_deep_copies_after_a_training_call(backend: str, make) -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 4), make(backend))
    x = torch.rand(3, 2, 4) * 2
    net(x).sum().backward()  # the states carry the call's graph
    twin = copy.deepcopy(net)
    for (name, held), (_, copied) in zip(vars(net[1]).items(), vars(twin[1]).items()):
        if isinstance(held, torch.Tensor):
            assert torch.equal(copied, held) and copied is not held and copied.grad_fn is None, name
    for layer in (net[1], twin[1]):
        layer.neuron.detach() if isinstance(layer, BatchNormNeuron) else layer.detach()
    net.zero_grad(), twin.zero_grad()
    y, y_twin = net(x), twin(x)
    y.sum().backward(), y_twin.sum().backward()
    assert torch.equal(y_twin, y)
    for (name, p), p_twin in zip(net.named_parameters(), twin.parameters()):
        assert torch.equal(p_twin.grad, p.grad), name


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_a_moved_layer_goes_on_appending_to_its_v_seq(backend: str) -> None:
    torch.manual_seed(0)
    layer = LIFNode(store_v_seq=True, backend=backend)
    x = torch.rand(3, 2, 4) * 2
    layer(x[0]), layer(x[1])
    before = layer.v_seq.clone()
    layer.double()
    assert layer.v_seq.dtype == torch.float64
    layer(x[2].double())
    assert layer.v_seq.shape == (3, 2, 4) and torch.equal(layer.v_seq[:2], before.double())
    assert torch.equal(layer.v_seq[-1], layer.v)
