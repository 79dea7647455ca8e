"""Channels-last inputs on a GPU, in every dtype: the kernels run on the permuted view that is contiguous and give
bitwise the contiguous input's spikes, states and input gradients, in the input's layout; the fused BatchNorm
(whose per-channel parameters are then read per neuron) gives the same spikes and close gradients; torch.compile
(fullgraph) of a Conv-BatchNorm-LIF block in channels_last equals eager."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import autocuda.nn as ann
from autocuda.call import functional as F

pytestmark = pytest.mark.gpu
CUDA = "cuda"
CL = torch.channels_last
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


def _channels_last(x: torch.Tensor) -> torch.Tensor:
    return x.flatten(0, 1).contiguous(memory_format=CL).unflatten(0, x.shape[:2])


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-12))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_channels_last_sequence_is_bitwise_the_contiguous_one(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    x = (torch.rand(4, 8, 16, 9, 7, device=CUDA) * 3).to(dtype)
    runs = []
    for inp in (x, _channels_last(x)):
        inp = inp.clone().requires_grad_()
        spikes, (final,), (v_seq,) = F.multi_step("lif", inp, store_state_seq=True, tau=2.0)
        (spikes * 1.5 + v_seq * 0.25).sum().backward()
        runs.append((spikes, final, v_seq, inp.grad, inp))
    want, got = runs
    for a, b in zip(got[:4], want[:4]):
        assert torch.equal(a, b)
    assert got[0].stride() == got[4].stride() and got[3].stride() == got[4].stride()
    assert 0 < want[0].double().mean() < 1


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_channels_last_single_step_layer(dtype: torch.dtype) -> None:
    torch.manual_seed(1)
    contiguous, channels_last = ann.LIFNode(), ann.LIFNode()
    for _ in range(3):
        x = (torch.rand(8, 16, 9, 7, device=CUDA) * 3).to(dtype)
        assert torch.equal(channels_last(x.contiguous(memory_format=CL)), contiguous(x))
        assert torch.equal(channels_last.v, contiguous.v) and channels_last.v.is_contiguous(memory_format=CL)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_batchnorm_on_channels_last(dtype: torch.dtype) -> None:
    torch.manual_seed(2)
    layer = ann.BatchNormNeuron(16, ann.LIFNode(step_mode="m")).to(CUDA, dtype)
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
        layer.bias.uniform_(-0.5, 0.5)
    other = copy.deepcopy(layer)
    x = torch.randn(4, 8, 16, 9, 7, device=CUDA).to(dtype)
    x1, x2 = x.clone().requires_grad_(), _channels_last(x).requires_grad_()
    want, got = layer(x1), other(x2)
    differ = (got != want).double().mean().item()
    assert differ <= (0.0 if dtype == torch.float64 else 2e-2), f"{differ:.2%} of spikes differ"
    g = torch.rand_like(want)
    (want * g).sum().backward()
    (got * g).sum().backward()
    tol = {torch.float64: 1e-9, torch.float32: 1e-3}.get(dtype, 1e-1)
    assert _relative(x2.grad, x1.grad) < tol
    assert _relative(other.weight.grad, layer.weight.grad) < tol
    assert got.stride() == x2.stride()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_compiled_channels_last_block_equals_eager(dtype: torch.dtype) -> None:
    torch.manual_seed(3)
    block = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16)).to(CUDA, dtype).to(memory_format=CL)
    lif = ann.LIFNode(step_mode="m")

    def forward(x: torch.Tensor) -> torch.Tensor:
        y = block(x.flatten(0, 1))
        return lif(y.unflatten(0, x.shape[:2]))

    compiled = torch.compile(forward, fullgraph=True)
    x = _channels_last(torch.rand(4, 8, 3, 12, 12, device=CUDA).to(dtype))
    want = forward(x)
    lif.reset()
    got = compiled(x)
    assert got.is_contiguous() is False and got.flatten(0, 1).is_contiguous(memory_format=CL)
    differ = (got != want).double().mean().item()
    assert differ <= (1e-3 if dtype == torch.float32 else 2e-2), f"{differ:.2%} of spikes differ"
