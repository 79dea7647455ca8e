"""`recompute=True` on a GPU, in every dtype: a LIF layer gives bitwise the spikes, states and input gradients of
keeping h (the forward runs again with the same kernels); the fused BatchNorm gives the same spikes and, its
per-channel sums being atomics, close gradients; torch.compile(mode="reduce-overhead") of a channels-last block
with recompute equals eager."""
from __future__ import annotations

import copy

import pytest
import torch

import autocuda.nn as ann

pytestmark = pytest.mark.gpu
CUDA = "cuda"
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-12))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_recompute_is_bitwise_keeping_h(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    x = (torch.rand(8, 16, 4096, device=CUDA) * 3).to(dtype)
    runs = []
    for recompute in (False, True):
        layer = ann.Neuron("lif", step_mode="m", store_v_seq=True, recompute=recompute)
        inp = x.clone().requires_grad_()
        spikes = layer(inp)
        (spikes * 1.5 + layer.v_seq * 0.25).sum().backward()
        runs.append((spikes, layer.v, layer.v_seq, inp.grad))
    for want, got in zip(*runs):
        assert torch.equal(got, want)
    assert 0 < runs[0][0].double().mean() < 1


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_batchnorm_with_recompute(dtype: torch.dtype) -> None:
    torch.manual_seed(1)
    layer = ann.BatchNormNeuron(16, ann.LIFNode(step_mode="m")).to(CUDA, dtype)
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
        layer.bias.uniform_(-0.5, 0.5)
    other = copy.deepcopy(layer)
    other.neuron.recompute = True
    x = torch.randn(4, 8, 16, 9, 7, device=CUDA).to(dtype)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    want, got = layer(x1), other(x2)
    assert torch.equal(got, want)
    g = torch.rand_like(want)
    (want * g).sum().backward()
    (got * g).sum().backward()
    tol = 1e-9 if dtype == torch.float64 else 1e-3 if dtype == torch.float32 else 5e-2
    assert _relative(x2.grad, x1.grad) < tol
    assert _relative(other.weight.grad, layer.weight.grad) < tol
    assert torch.equal(other.running_var, layer.running_var)


def test_compiled_reduce_overhead_with_recompute_equals_eager() -> None:
    torch.manual_seed(2)
    conv = torch.nn.Conv2d(3, 16, 3, padding=1).to(CUDA).to(memory_format=torch.channels_last)
    eager_lif = ann.Neuron("lif", step_mode="m", recompute=True)
    compiled_lif = ann.Neuron("lif", step_mode="m", recompute=True)

    def step(lif: torch.nn.Module, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        lif.reset()
        conv.zero_grad(set_to_none=True)
        y = lif(conv(x.flatten(0, 1)).unflatten(0, x.shape[:2]))
        (y * torch.linspace(0, 1, y.shape[-1], device=CUDA)).sum().backward()
        return y.detach(), conv.weight.grad.clone()

    compiled = torch.compile(step, mode="reduce-overhead")
    x = torch.rand(4, 8, 3, 12, 12, device=CUDA).flatten(0, 1).contiguous(memory_format=torch.channels_last)
    x = x.unflatten(0, (4, 8)) * 3
    want_y, want_grad = step(eager_lif, x)
    for _ in range(3):  # recorded, then replayed from the CUDA graph
        torch.compiler.cudagraph_mark_step_begin()
        got_y, got_grad = compiled(compiled_lif, x)
    assert (got_y != want_y).double().mean() <= 1e-3
    assert _relative(got_grad, want_grad) < 1e-3
