"""torch.func's transforms on a GPU: the layers whose kernels step aside under them (the parallel spiking neurons:
torch composes the call) give autograd's gradients and a loop's outputs; the neuron kernels refuse them by name."""
from __future__ import annotations

import pytest
import torch

import autocuda.nn as our

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")
LAYERS = {"PSN": lambda: our.PSN(5), "MaskedPSN": lambda: our.MaskedPSN(2, 5, lambda_init=0.5, step_mode="m"),
          "SlidingPSN": lambda: our.SlidingPSN(3, step_mode="m")}


@pytest.mark.parametrize("name", list(LAYERS))
def test_psns_run_under_grad_and_vmap(name):
    torch.manual_seed(0)
    layer = LAYERS[name]().to(CUDA, torch.float64)
    x = torch.randn(5, 4, 33, device=CUDA, dtype=torch.float64) * 1.5
    weights = torch.rand(33, device=CUDA, dtype=torch.float64)
    got = torch.func.grad(lambda u: (layer(u) * weights).sum())(x)
    leaf = x.clone().requires_grad_()
    (layer(leaf) * weights).sum().backward()  # the mixing kernels
    assert leaf.grad is not None and leaf.grad.abs().sum() > 0
    torch.testing.assert_close(got, leaf.grad, rtol=1e-10, atol=1e-12)
    batch = torch.stack([x, -x])
    torch.testing.assert_close(torch.vmap(layer)(batch), torch.stack([layer(u) for u in batch]), rtol=0, atol=0)


def test_the_neuron_kernels_refuse_the_transforms_by_name():
    layer = our.LIFNode(step_mode="m").to(CUDA)
    x = torch.rand(5, 3, device=CUDA)
    with pytest.raises(NotImplementedError, match=r"autocuda's kernels \(backend 'cuda'\) do not run under torch.func"):
        torch.func.grad(lambda u: layer(u).sum())(x)
    layer.reset()
    assert layer(x).shape == x.shape
