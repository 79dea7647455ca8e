"""BatchNorm fused into the neuron's CUDA kernels (`BatchNormNeuron`, `fuse_batchnorm`) against torch's BatchNorm
followed by our neuron, on a GPU: every dtype, both step modes, training steps then eval, autocast, and
torch.compile(fullgraph=True). float64 matches to rounding; in lower precisions the two compute BatchNorm's
affine in another order (and the fused kernel does not round it to the storage dtype), so a membrane within
rounding of its threshold may fire in one and not the other: spikes are compared by the share that differ."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import autocuda.nn as ann

pytestmark = pytest.mark.gpu
CUDA = "cuda"
# dtype -> (largest share of differing spikes, relative error of gradients and running statistics)
TOLERANCE = {torch.float64: (0.0, 1e-9), torch.float32: (1e-3, 1e-3), torch.float16: (2e-2, 5e-2),
             torch.bfloat16: (5e-2, 1e-1)}


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-12))


def _models(dtype: torch.dtype, mode: str, channels: int = 8):
    torch.manual_seed(0)
    bn = nn.BatchNorm2d(channels).to(CUDA, dtype)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 1.5)
        bn.bias.uniform_(-0.5, 0.5)
    neuron = ann.LIFNode(step_mode=mode)
    fused = ann.BatchNormNeuron.from_batchnorm(copy.deepcopy(bn), copy.deepcopy(neuron))
    return bn, neuron, fused


def _unfused(bn: nn.Module, neuron: nn.Module, x: torch.Tensor, mode: str) -> torch.Tensor:
    if mode == "m":
        return neuron(bn(x.flatten(0, 1)).view(x.shape))
    return torch.stack([neuron(bn(step)) for step in x])


def _fused(layer: nn.Module, x: torch.Tensor, mode: str) -> torch.Tensor:
    return layer(x) if mode == "m" else torch.stack([layer(step) for step in x])


def _compare(got: torch.Tensor, want: torch.Tensor, dtype: torch.dtype) -> None:
    spikes, _ = TOLERANCE[dtype]
    differ = (got != want).double().mean().item()
    assert differ <= spikes, f"{differ:.2%} of spikes differ"
    assert 0 < want.double().mean() < 1


@pytest.mark.parametrize("mode", ["m", "s"])
@pytest.mark.parametrize("dtype", list(TOLERANCE), ids=str)
def test_fused_equals_unfused_on_cuda(dtype: torch.dtype, mode: str) -> None:
    _, tol = TOLERANCE[dtype]
    bn, neuron, fused = _models(dtype, mode)
    for step in range(3):
        g = torch.Generator(CUDA).manual_seed(step)
        x = (torch.randn(4, 16, 8, 12, 12, generator=g, device=CUDA) * 2 + 0.5).to(dtype).requires_grad_()
        x2 = x.detach().clone().requires_grad_()
        want, got = _unfused(bn, neuron, x, mode), _fused(fused, x2, mode)
        _compare(got, want, dtype)
        weights = torch.randn_like(want)
        (want * weights).sum().backward()
        (got * weights).sum().backward()
        for ours, theirs in ((x2.grad, x.grad), (fused.weight.grad, bn.weight.grad), (fused.bias.grad, bn.bias.grad)):
            assert relative(ours, theirs) < tol
        assert relative(fused.running_var, bn.running_var) < tol
        assert relative(fused.running_mean, bn.running_mean) < tol
        neuron.reset()
        fused.reset()
    bn.eval()
    fused.eval()
    x = (torch.randn(4, 16, 8, 12, 12, device=CUDA) * 2 + 0.5).to(dtype)
    _compare(_fused(fused, x, mode), _unfused(bn, neuron, x, mode), dtype)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_under_autocast_statistics_are_float32(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    conv = nn.Conv2d(3, 8, 3, padding=1).to(CUDA)
    bn, neuron, fused = _models(torch.float32, "m")
    x = torch.rand(4, 16, 3, 12, 12, device=CUDA) * 3
    with torch.autocast(CUDA, dtype=dtype):
        y = conv(x.flatten(0, 1)).view(4, 16, 8, 12, 12)
        assert y.dtype == dtype
        want, got = _unfused(bn, neuron, y, "m"), fused(y)
    assert got.dtype == want.dtype == dtype
    _compare(got, want, dtype)
    assert fused.running_mean.dtype == torch.float32
    assert relative(fused.running_var, bn.running_var) < 1e-3


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_compiled_fullgraph_on_cuda(dtype: torch.dtype) -> None:
    _, tol = TOLERANCE[dtype]
    _, _, eager = _models(dtype, "m")
    compiled_layer = copy.deepcopy(eager)
    compiled = torch.compile(compiled_layer, fullgraph=True)
    for _ in range(2):
        x = (torch.randn(4, 16, 8, 12, 12, device=CUDA) * 2 + 0.5).to(dtype).requires_grad_()
        x2 = x.detach().clone().requires_grad_()
        want, got = eager(x), compiled(x2)
        _compare(got, want, dtype)
        want.float().square().sum().backward()
        got.float().square().sum().backward()
        assert relative(x2.grad, x.grad) < tol
        assert relative(compiled_layer.weight.grad, eager.weight.grad) < tol
        eager.reset()
        compiled_layer.reset()
    assert relative(compiled_layer.running_var, eager.running_var) < tol
    assert int(compiled_layer.num_batches_tracked) == 2


class Block(nn.Module):
    """bench/network.py's block: conv and BatchNorm with T folded into the batch, then a multi-step neuron."""

    def __init__(self, cin: int, cout: int) -> None:
        super().__init__()
        self.conv, self.bn = nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout)
        self.neuron = ann.LIFNode(step_mode="m")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.bn(self.conv(x.flatten(0, 1)))
        return self.neuron(y.reshape(*x.shape[:2], *y.shape[1:]))


def test_fuse_batchnorm_pairs_on_a_benchmark_like_model() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(Block(3, 16), Block(16, 16)).to(CUDA)
    fused = ann.fuse_batchnorm(copy.deepcopy(model), pairs=[("bn", "neuron")])
    assert sum(isinstance(m, ann.BatchNormNeuron) for m in fused.modules()) == 2
    x = torch.rand(4, 8, 3, 16, 16, device=CUDA) * 3
    want, got = model(x), fused(x)
    _compare(got, want, torch.float32)
    want.sum().backward()
    got.sum().backward()
    for p, q in zip(model.parameters(), fused.parameters()):
        assert relative(q.grad, p.grad) < 1e-3
