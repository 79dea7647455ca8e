"""The fused BatchNorm layer's two backward passes on a GPU (float32, float64; the kernels' per-channel sums are
atomics, so gradients agree closely, not bitwise): equal to one pass, eager and under torch.compile."""
from __future__ import annotations

import copy

import pytest
import torch

import autocuda.nn as ann
from autocuda.nn.batchnorm import BatchNormNeuron

pytestmark = pytest.mark.gpu
CUDA = "cuda"


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-12))


def _step(layer, x):
    inp = x.clone().requires_grad_(True)
    spikes = layer(inp)
    (spikes * torch.linspace(-1, 1, spikes.numel(), device=CUDA, dtype=spikes.dtype).reshape(spikes.shape)).sum() \
        .backward()
    return spikes, inp.grad, layer.weight.grad, layer.bias.grad, layer.running_var


@pytest.mark.parametrize("shape", [(4, 16, 32, 16, 16), (16, 8, 64, 8, 8)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_two_passes_equal_one_pass(dtype, shape, monkeypatch):
    torch.manual_seed(5)
    layer = ann.BatchNormNeuron(shape[2], ann.ParametricLIFNode(step_mode="m")).to(CUDA, dtype)
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
        layer.bias.uniform_(-0.3, 0.3)
    one, compiled_layer = copy.deepcopy(layer), copy.deepcopy(layer)
    x = (torch.randn(shape, device=CUDA) + 0.8).to(dtype)
    got = _step(layer, x)
    compiled = _step(torch.compile(compiled_layer, fullgraph=True), x)
    monkeypatch.setattr(BatchNormNeuron, "_two_passes_fit", lambda self, x: False)
    want = _step(one, x)
    tol = 1e-9 if dtype == torch.float64 else 2e-4
    # compiled, the statistics are Inductor's reductions rather than torch.var_mean: float64 is held to 1e-7 there
    for result, bound in ((got, tol), (compiled, 1e-7 if dtype == torch.float64 else tol)):
        assert torch.equal(result[0], want[0])
        for a, b in zip(result[1:], want[1:]):
            assert _relative(a, b) < bound
    assert _relative(layer.neuron.w.grad, one.neuron.w.grad) < tol
