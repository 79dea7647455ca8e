"""The conversion neurons (`STBIFNode`, `ActivationAwareIFNode`) on the generated CUDA kernels, in every dtype,
against the same class in float64 on the CPU (the reference). The inputs are eighths (of the quantizer's scale),
so every membrane, count and comparison is exact in every dtype: the outputs and states must be equal; the
gradients (ActivationAwareIFNode's) round in the dtype."""
from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import autocuda.nn as our

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")
F64 = torch.float64
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
LAYERS: dict[str, Callable[[], torch.nn.Module]] = {
    "STBIFNode": lambda: our.STBIFNode(0.5, 8, sym=True, step_mode="m"),
    "STBIFNode-single": lambda: our.STBIFNode(0.25, 4, pos_max=2.0, neg_min=-1.0),
    "ActivationAwareIFNode": lambda: our.ActivationAwareIFNode(0.75, 0.25, v_reset=0.0, step_mode="m"),
    "ActivationAwareIFNode-channels": lambda: our.ActivationAwareIFNode(
        torch.tensor([0.5, 1.0, 1.5]), torch.tensor([0.125, -0.25, 0.5]), channel_dim=1, step_mode="m",
        store_v_seq=True),
}


def eighths(scale: float) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    return torch.randint(-12, 13, (6, 16, 3, 33), generator=generator).to(F64) / 8 * scale


def run(layer: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    return layer(x) if layer.step_mode == "m" else torch.stack([layer(step) for step in x])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", list(LAYERS))
def test_kernels_in_every_dtype_match_the_float64_reference(name: str, dtype: torch.dtype) -> None:
    cpu, gpu = LAYERS[name]().to(F64), LAYERS[name]().to(CUDA)
    gpu.backend = "cupy"
    training = name.startswith("ActivationAware")
    x = eighths(float(cpu.q_threshold) if not training else 1.0)
    x_cpu = x.clone().requires_grad_(training)
    x_gpu = x.to(CUDA, dtype).requires_grad_(training)
    out_cpu, out_gpu = run(cpu, x_cpu), run(gpu, x_gpu)
    assert out_gpu.dtype == dtype and torch.equal(out_gpu.cpu().to(F64), out_cpu)
    for (state, a), (_, b) in zip(cpu.named_memories(), gpu.named_memories()):
        assert torch.equal(b.cpu().to(F64), a), state
    if training:
        weights = torch.linspace(-1.0, 1.0, out_cpu.numel(), dtype=F64).view_as(out_cpu)
        (grad_cpu,) = torch.autograd.grad((out_cpu * weights).sum(), x_cpu)
        (grad_gpu,) = torch.autograd.grad((out_gpu * weights.to(CUDA, dtype)).sum(), x_gpu)
        tolerance = {torch.float64: 1e-12, torch.float32: 1e-5}.get(dtype, 3e-2)
        assert (grad_gpu.cpu().to(F64) - grad_cpu).norm() <= tolerance * grad_cpu.norm()
