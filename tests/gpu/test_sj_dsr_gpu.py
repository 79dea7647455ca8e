"""The DSR neurons on a GPU (their forward the `dsr` spec's generated kernels, their backward torch): in every
dtype against the same layer in float64 on the CPU. The IF's inputs are eighths and its threshold 1, so its
membranes and spikes are exact in every dtype; the LIF's decay rounds, so its spikes may differ near the
threshold in half precision. The gradients are reductions over time, within the dtype's rounding."""
from __future__ import annotations

import pytest
import torch

import autocuda.nn as our

pytestmark = pytest.mark.gpu

F64 = torch.float64
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


def eighths() -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randint(-4, 13, (8, 64, 257), generator=generator).to(F64) / 8


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ["DSRIFNode", "DSRLIFNode"])
def test_dsr_on_cuda_as_on_the_cpu(name: str, dtype: torch.dtype) -> None:
    kwargs = {"T": 8, "v_threshold": 1.0, "delta_t": 0.25} if name == "DSRLIFNode" else {"T": 8, "v_threshold": 1.0}
    cpu, gpu = getattr(our, name)(**kwargs).to(F64), getattr(our, name)(**kwargs).to("cuda", dtype)
    x = eighths()
    x_cpu, x_gpu = x.clone().requires_grad_(True), x.to("cuda", dtype).requires_grad_(True)
    out_cpu, out_gpu = cpu(x_cpu), gpu(x_gpu)
    assert out_gpu.dtype == dtype
    differ = float((out_gpu.cpu().to(F64) != out_cpu).double().mean())
    exact = name == "DSRIFNode" or dtype in (torch.float32, torch.float64)
    assert differ <= (0.0 if exact and dtype != torch.float32 else 1e-3 if exact else 2e-2), differ
    weights = torch.linspace(-1.0, 1.0, out_cpu.numel(), dtype=F64).view_as(out_cpu)
    grads_cpu = torch.autograd.grad((out_cpu * weights).sum(), [x_cpu, cpu.v_threshold])
    grads_gpu = torch.autograd.grad((out_gpu * weights.to("cuda", dtype)).sum(), [x_gpu, gpu.v_threshold])
    tolerance = {torch.float64: 1e-12, torch.float32: 1e-4}.get(dtype, 5e-2)
    for a, b in zip(grads_cpu, grads_gpu):
        assert (b.cpu().to(F64) - a).norm() <= tolerance * a.norm() + 1e-12
