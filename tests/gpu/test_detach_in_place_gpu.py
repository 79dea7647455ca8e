"""`detach()` in place on CUDA (tests/test_detach_in_place.py's checks through the CUDA kernels): the final states
of inputs with several neuron dims are tensors of the neuron shape, not views, through the Python launch path, a
program's bound launch and the native operator's keyed call; a state held from before `functional.detach_net`
loses its graph and the next chunk's results are unchanged."""
from __future__ import annotations

import pytest
import torch

import autocuda.nn as our
import autocuda.spec.surrogate as ours
from autocuda.call import native, program

functional = pytest.importorskip("spikingjelly.activation_based.functional")

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")
SHAPES = [(5, 3, 4), (4, 2, 3, 2, 2)]  # [T, B, N] and [T, B, C, H, W]
SIGMOID = ours.Sigmoid()


def sigmoid_lif(x: torch.Tensor, v: torch.Tensor):
    h = v + (x - v) / 2.0
    s = SIGMOID(h - 1.0)
    return s, h * (1.0 - s)


LAYERS = {
    "lif": lambda mode: our.LIFNode(step_mode=mode),
    "izhikevich": lambda mode: our.IzhikevichNode(step_mode=mode),
    "flexsn": lambda mode: our.FlexSN(sigmoid_lif, 1, step_mode=mode),
}


@pytest.fixture(params=["python", "native"])
def path(request, monkeypatch):
    monkeypatch.setattr(native, "USE", request.param == "native")
    monkeypatch.setattr(program, "ENABLED", True)
    if request.param == "native" and not native.ensure():
        pytest.skip(f"no native call path: {native.status()}")
    return request.param


def chunk(seed: int, shape: tuple[int, ...], grad: bool) -> torch.Tensor:
    x = torch.rand(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64) * 2
    return x.to(CUDA).requires_grad_(grad)


def run(layer: torch.nn.Module, x: torch.Tensor, mode: str) -> torch.Tensor:
    return layer(x) if mode == "m" else torch.stack([layer(step) for step in x])


def memories(layer: torch.nn.Module) -> list[torch.Tensor]:
    return [value for _, value in layer.named_memories()]


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("mode", ["m", "s"])
@pytest.mark.parametrize("grad", [True, False])
@pytest.mark.parametrize("kind", list(LAYERS))
def test_detach_net_cuts_the_graph_of_states_held_from_before_on_the_gpu(kind, grad, mode, shape, path):
    layer, twin = LAYERS[kind](mode).to(CUDA, torch.float64), LAYERS[kind](mode).to(CUDA, torch.float64)
    for _ in range(3):  # the same call again: the program's, then the keyed call
        functional.reset_net(layer), functional.reset_net(twin)
        first = chunk(0, shape, grad)
        run(layer, first, mode), run(twin, first, mode)
    if kind != "flexsn" and mode == "m":
        assert layer._programs.configured is not None, "the warm-up kept the layer's configuration"
        # a training program takes the native path from the call after its first backward (none here)
        planned = any(p.native is not None for p in layer._programs.values())
        assert planned == (path == "native" and not grad)
    held = memories(layer)
    assert held and all(h.shape == shape[1:] and not h._is_view() for h in held)
    if grad:
        assert all(h.grad_fn is not None for h in held)
    values = [h.clone() for h in held]
    functional.detach_net(layer)
    for h, value in zip(held, values):
        assert h.grad_fn is None and not h.requires_grad, "the state held from before lost its graph"
        torch.testing.assert_close(h, value, rtol=0, atol=0)
    second = chunk(1, shape, grad)
    out, want = run(layer, second, mode), run(twin, second, mode)
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    for got, expected in zip(memories(layer), memories(twin)):
        torch.testing.assert_close(got, expected, rtol=0, atol=0)
    if grad:
        out.sum().backward()
        assert second.grad is not None
