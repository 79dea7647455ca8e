"""A learned threshold under the soft reset on the CUDA kernels, in every dtype, against the float64 reference:
the threshold's gradient holds the reset's -λ s term of the same step, which the kernels sum before the adjoint
moves to the previous step (codegen/kernel_plans.py; on the host runner, test_host_neurons' gated_lif under the
soft reset and tests/test_update_gradients.py)."""
from __future__ import annotations

import pytest
import torch

from autocuda.call import functional as F

pytestmark = pytest.mark.gpu

F64 = torch.float64


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_a_learned_threshold_under_the_soft_reset_on_cuda(dtype: torch.dtype) -> None:
    generator = torch.Generator().manual_seed(0)
    x = (torch.rand(8, 4096, generator=generator, dtype=F64) * 1.5 + 0.2).to(dtype).to(F64)  # exact in dtype
    grads = {}
    for device, run_dtype in (("cpu", F64), ("cuda", dtype)):
        threshold = torch.full((4096,), 0.375, dtype=run_dtype, device=device, requires_grad=True)
        backend = "reference" if device == "cpu" else "cuda"
        spikes, (v,), _ = F.multi_step("if", x.to(device, run_dtype), backend=backend, v_threshold=threshold,
                                       v_reset=None)
        weights = torch.linspace(0.5, 1.5, spikes.numel(), dtype=F64, device=device).view_as(spikes)
        loss = (spikes.to(F64) * weights).sum() + (v.to(F64) ** 2).sum()
        (grads[device],) = torch.autograd.grad(loss, threshold)
    reference, got = grads["cpu"], grads["cuda"].cpu().to(F64)
    tolerance = {torch.float64: 1e-12, torch.float32: 1e-5}.get(dtype, 3e-2)
    assert (got - reference).norm() <= tolerance * reference.norm()
