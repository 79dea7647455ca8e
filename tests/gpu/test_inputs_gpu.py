"""A spec with several step inputs on CUDA, through the functional API's tuple of inputs (multi- and single-step):
the kernels against the float64 reference (neuron_specs/conductance_lif.toml: g_e and g_i each meet the membrane).
Float64 and float32 compare every value; float16 and bfloat16 the spikes, since their stored membrane drifts from
a float64 reference step by step (tests/gpu/test_runtime_gpu.py's property test of every shipped spec checks
their values, with tolerances for storage rounding and masks for neurons within rounding of the threshold)."""
from __future__ import annotations

import pytest
import torch

from autocuda.call import functional as F

pytestmark = pytest.mark.gpu

CUDA = torch.device("cuda")
SPEC = "conductance_lif"
# (dtype, tolerance of the final membrane and the input gradients, relative to their largest value; None: spikes
# only)
DTYPES = [(torch.float64, 1e-12), (torch.float32, 1e-5), (torch.float16, None), (torch.bfloat16, None)]


@pytest.mark.parametrize(("dtype", "tol"), DTYPES, ids=lambda v: str(v))
@pytest.mark.parametrize("single", [False, True], ids=["multi", "single"])
def test_kernels_equal_the_reference(dtype, tol, single):
    generator = torch.Generator().manual_seed(0)
    shape = (1, 4096) if single else (16, 4096)
    g_e = (torch.rand(shape, generator=generator, dtype=torch.float64) * 0.9).to(dtype).to(torch.float64)
    g_i = (torch.rand(shape, generator=generator, dtype=torch.float64) * 0.6).to(dtype).to(torch.float64)
    if single:
        g_e, g_i = g_e[0], g_i[0]
    results = {}
    for backend, device, storage in (("reference", "cpu", torch.float64), ("cuda", CUDA, dtype)):
        inputs = [u.to(device, storage).requires_grad_(True) for u in (g_e, g_i)]
        run = F.single_step if single else F.multi_step
        spikes, finals, *_ = run(SPEC, tuple(inputs), backend=backend)
        weights = torch.linspace(-1.0, 1.0, spikes.numel(), device=device, dtype=storage).view(spikes.shape)
        loss = (spikes * weights).sum() + finals[0].sum()
        grads = torch.autograd.grad(loss, inputs)
        results[backend] = [t.detach().cpu().double() for t in (spikes, finals[0], *grads)]
    want, got = results["reference"], results["cuda"]
    assert want[0].sum() > 0
    # spikes equal except where h lies within rounding of the threshold (low precision storage)
    differ = (got[0] != want[0]).double().mean().item()
    assert differ <= (0.0 if dtype == torch.float64 else 0.01), differ
    if dtype == torch.float64:
        for a, b in zip(got[1:], want[1:]):
            torch.testing.assert_close(a, b, rtol=tol, atol=tol)
    elif tol is not None:  # neurons whose spike differs are left out of the value comparison
        same = (got[0] == want[0]).all(0) if not single else got[0] == want[0]
        for a, b in zip(got[1:], want[1:]):
            scale = b.abs().max().clamp_min(1.0)
            assert ((a - b).abs()[..., same] <= tol * scale).all()
