"""Pins faults found by probing the monitor, the encoders and SpikingJelly's non-spiking nodes:

- a deep copy of a monitored network records into no monitor (not the original's, also after its `remove()`),
  and its copied hooks keep neither the monitor nor its records alive;
- a monitor records as "spike" only an output that is a spike record (a tensor; in step mode 'm' a sequence of the
  input's steps), and says why it skips any other (a list, a decoded membrane) rather than naming a state;
- `delta` of unsigned or boolean values gives signed changes (uint8 does not wrap);
- setting a `PoissonEncoder`'s seed starts its trains afresh from the new seed, and is checked;
- a non-spiking node's `decode` is checked where it is set, and its `step_mode` cannot leave 'm' (SpikingJelly's
  refuses it; ours ran a sequence anyway).
"""
from __future__ import annotations

import copy
import gc
import warnings
import weakref

import pytest
import torch
from torch import nn

from autocuda.call.encoding import PoissonEncoder, delta
from autocuda.nn import LIFNode, NonSpikingIFNode, NonSpikingLIFNode, OTTTLIFNode
from autocuda.tools.monitor import Monitor


def _net(step_mode: str = "m") -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), LIFNode(step_mode=step_mode, backend="reference"))


def test_a_deep_copy_of_a_monitored_network_records_into_no_monitor() -> None:
    net, x = _net(), torch.rand(3, 2, 4) * 2
    monitor = Monitor(net)
    net(x)
    net[1].reset()
    twin = copy.deepcopy(net)
    twin(x)
    assert monitor.count == 2  # the original's call alone: a spike and a membrane record
    monitor.remove()
    twin(x)
    assert monitor.count == 2


def test_a_copys_hooks_keep_neither_the_monitor_nor_its_records_alive() -> None:
    net = _net()
    monitor = Monitor(net)
    net(torch.rand(3, 2, 4))
    net[1].reset()
    twin = copy.deepcopy(net)
    gone = weakref.ref(monitor)
    del monitor
    gc.collect()
    assert gone() is None
    twin(torch.rand(3, 2, 4))  # its hooks find no monitor and do nothing


def test_a_decoded_multi_step_output_is_not_recorded_as_a_spike_sequence() -> None:
    layer = NonSpikingLIFNode(tau=3.0, decode="max-mem", backend="reference")
    monitor = Monitor(layer)
    with pytest.warns(UserWarning, match=r"output is of shape \(2, 4\), not a sequence"):
        layer(torch.rand(3, 2, 4))
    assert not monitor.records[""]["spike"]
    assert monitor.sequence("", "v").shape == (3, 2, 4)


def test_an_output_that_is_no_tensor_is_named_as_the_reason_it_is_not_recorded() -> None:
    layer = OTTTLIFNode(backend="reference")  # [spike, trace] in training
    monitor = Monitor(layer)
    with pytest.warns(UserWarning, match="output is a list, not a tensor"):
        layer(torch.rand(2, 4))
    assert monitor.sequence("", "v").shape == (1, 2, 4)


def test_a_multi_step_spike_sequence_is_still_recorded() -> None:
    net = _net()
    monitor = Monitor(net)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = net(torch.rand(3, 2, 4) * 2)
    assert torch.equal(monitor.sequence("1"), out)


def test_delta_of_unsigned_integers_gives_signed_changes() -> None:
    falling = torch.tensor([[3], [1], [0], [2]], dtype=torch.uint8)
    assert delta(falling, 1).flatten().tolist() == [0.0, -1.0, -1.0, 1.0]
    assert delta(torch.tensor([[True], [False], [True]]), 1).flatten().tolist() == [0.0, -1.0, 1.0]


def test_setting_a_poisson_encoders_seed_starts_its_trains_afresh() -> None:
    x = torch.full((64,), 0.5)
    first = PoissonEncoder(8, seed=3)(x)
    other = PoissonEncoder(8, seed=7)(x)
    encoder = PoissonEncoder(8, seed=3)
    encoder(x)
    encoder.seed = 7
    assert torch.equal(encoder(x), other)
    encoder.seed = 3
    assert torch.equal(encoder(x), first)
    with pytest.raises(TypeError, match="seed"):
        encoder.seed = 1.5  # type: ignore[assignment]


def test_a_non_spiking_nodes_decode_is_checked_where_it_is_set() -> None:
    layer = NonSpikingIFNode(backend="reference")
    with pytest.raises(ValueError, match="decode"):
        layer.decode = "bogus"
    layer.decode = "last_mem"
    x = torch.rand(3, 2)
    assert torch.allclose(layer(x), x.sum(0))


def test_a_non_spiking_node_refuses_step_mode_s() -> None:
    layer = NonSpikingLIFNode(backend="reference")
    with pytest.raises(ValueError, match="step_mode"):
        layer.step_mode = "s"
    layer.step_mode = "m"
    assert layer.step_mode == "m"
