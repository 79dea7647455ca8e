"""`GatedLIFNode` on the generated CUDA kernels (the `gated_lif` spec; its kernels in every dtype against the
reference, with near-threshold neurons masked, are test_runtime_gpu's): in float64 against the same layer on the
CPU (spikes equal, membranes and the gradients of the input and all eight parameters within rounding), and in
every dtype against SpikingJelly's own class on the same device and dtype, spikes agreeing but for the few near
the threshold that another order of rounding moves."""
from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

import autocuda.nn as our

pytestmark = pytest.mark.gpu

sj_lif_variants = pytest.importorskip("spikingjelly.activation_based.neuron.lif_variants",
                                      reason="SpikingJelly 2.0 is a test extra")

CUDA = torch.device("cuda")
F64 = torch.float64


def inputs(device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(6, 32, 4, 8, 8, generator=generator, dtype=F64) + 0.8
    return x.to(device, dtype).requires_grad_(True)


@pytest.mark.parametrize("inplane", [None, 4])
def test_float64_on_cuda_as_on_the_cpu(inplane: int | None) -> None:
    np.random.seed(0)
    cpu = our.GatedLIFNode(6, inplane=inplane).to(F64)
    gpu = copy.deepcopy(cpu).to(CUDA)
    x_cpu, x_gpu = inputs(torch.device("cpu"), F64), inputs(CUDA, F64)
    out_cpu, out_gpu = cpu(x_cpu), gpu(x_gpu)
    assert torch.equal(out_gpu.cpu(), out_cpu)
    torch.testing.assert_close(gpu.v.cpu(), cpu.v, rtol=1e-12, atol=1e-12)
    weights = torch.linspace(-1.0, 1.0, out_cpu.numel(), dtype=F64).view_as(out_cpu)
    grads_cpu = torch.autograd.grad((out_cpu * weights).sum(), [x_cpu, *cpu.parameters()])
    grads_gpu = torch.autograd.grad((out_gpu * weights.to(CUDA)).sum(), [x_gpu, *gpu.parameters()])
    for a, b in zip(grads_cpu, grads_gpu):
        torch.testing.assert_close(b.cpu(), a, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64], ids=str)
def test_every_dtype_as_spikingjelly_on_cuda(dtype: torch.dtype) -> None:
    np.random.seed(0)
    theirs = sj_lif_variants.GatedLIFNode(6, inplane=4).to(CUDA, dtype)
    np.random.seed(0)
    ours = our.GatedLIFNode(6, inplane=4).to(CUDA, dtype)
    x = inputs(CUDA, dtype)
    a, b = theirs(x), ours(x)
    assert b.dtype == dtype and b.shape == a.shape
    differ = float((a != b).double().mean())
    assert differ <= {torch.float64: 0.0, torch.float32: 1e-3}.get(dtype, 3e-2), differ
