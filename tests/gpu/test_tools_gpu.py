"""Monitors and encoders on a GPU: records stay on the device and recording never synchronises it; encoders
run on the input's device, reproducibly under a seed."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from autocuda.call import encoding as E
from autocuda.nn import LIFNode, Neuron
from autocuda.tools.monitor import Monitor

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")


def _no_sync(step) -> None:
    """Run `step` once to warm up (compilation, caches), then again with synchronisations raising errors."""
    step()
    torch.cuda.synchronize()
    previous = torch.cuda.get_sync_debug_mode()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode(previous)
    torch.cuda.synchronize()


@pytest.mark.parametrize("step_mode", ["s", "m"])
def test_monitor_records_on_the_device_without_synchronising(step_mode: str) -> None:
    net = nn.Sequential(nn.Linear(32, 64), LIFNode(step_mode=step_mode), nn.Linear(64, 16),
                        Neuron("izhikevich", step_mode=step_mode)).to(CUDA)
    x = torch.rand(8, 4, 32, device=CUDA) * 3
    mon = Monitor(net, states="all", max_bytes=1 << 30)

    def step() -> None:
        for layer in (net[1], net[3]):
            layer.reset()
        if step_mode == "m":
            net(x).sum().backward()
        else:
            sum(net(x[t]).sum() for t in range(x.shape[0])).backward()

    _no_sync(step)
    mon.remove()
    assert mon.sequence("1").device.type == "cuda" and mon.sequence("3", "v").shape == (16, 4, 16)
    assert 0 <= float(mon.firing_rate("1")) <= 1
    if step_mode == "s":
        assert mon.sequence("3", "w").shape == (16, 4, 16)


def test_encoders_on_the_device_reproducible_and_without_synchronising() -> None:
    x = torch.rand(64, 64, device=CUDA)
    trains = []
    _no_sync(lambda: trains.append(E.poisson(x, 16, seed=7, check=False)))
    assert trains[0].device.type == "cuda" and torch.equal(trains[0], trains[1])
    assert abs(float(trains[0].mean()) - float(x.mean())) < 0.02
    enc = E.PoissonEncoder(16, seed=7)
    assert torch.equal(enc(x), trains[0])  # the module's generator lives on x's device
    assert torch.equal(E.latency(x, 10), E.latency(x.cpu(), 10).to(CUDA))
    seq = torch.randn(20, 128, device=CUDA).cumsum(0)
    assert torch.equal(E.delta(seq, 0.5), E.delta(seq.cpu(), 0.5).to(CUDA))
    with pytest.raises(ValueError, match="^generator: it lives on cpu"):
        E.poisson(x, 4, generator=torch.Generator())
