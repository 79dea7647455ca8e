"""SpikingJelly's noisy and ILC nodes (autocuda.nn.spikingjelly_noisy, spikingjelly_ilc) on a GPU: the generated
kernels in every dtype against our float64 torch reference on the CPU (which tests/test_sj_noisy.py and
tests/test_sj_ilc.py hold equal to SpikingJelly's), with the same noise episodes and `conn` weights: outputs where
no spike is decided otherwise near the threshold, and the gradients of the input, `conn` and `sigma`."""
from __future__ import annotations

import pytest
import torch

import autocuda.nn as our

pytestmark = pytest.mark.gpu
CUDA = "cuda"
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 3e-2, torch.bfloat16: 1e-1}
T, BATCH = 6, 512


def build(name: str, backend: str) -> torch.nn.Module:
    torch.manual_seed(4)  # conn's initialisation, the same for both
    if name.startswith("NoisyILC") or name.startswith("ILC"):
        return getattr(our, name)(4, 8, backend=backend, **({"T": T} if name.startswith("Noisy") else {}))
    return getattr(our, name)(32, T=T, backend=backend)


def run(layer: torch.nn.Module, x: torch.Tensor, noise: dict[str, torch.Tensor]) -> tuple[torch.Tensor, list]:
    if noise:
        layer.reset_noise(1)
        for key, value in noise.items():
            setattr(layer, key, value)
    given = x.clone().requires_grad_()
    out = layer(given)
    out = torch.stack(out) if isinstance(out, list) else out
    weights = torch.linspace(-1, 1, out.numel(), dtype=torch.float64, device=x.device).view_as(out)
    (out.double() * weights).sum().backward()
    return out.detach().double().cpu(), [given.grad.double().cpu(), *(p.grad.double().cpu()
                                                                     for p in layer.parameters())]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ["NoisyCUBALIFNode", "NoisyILCCUBALIFNode", "NoisyNonSpikingIFNode", "ILCIFNode",
                                  "ILCLIFNode", "ILCCUBALIFNode"])
def test_kernels_in_every_dtype_against_the_float64_reference(name: str, dtype: torch.dtype) -> None:
    reference, kernels = build(name, "torch").double(), build(name, "cupy").to(CUDA, dtype)
    num_node = 32
    x = 0.6 * torch.rand(T, BATCH, num_node, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    noise = {}
    if name.startswith("Noisy"):
        reference.reset_noise(1)
        keys = ("eps_seq",) if "NonSpiking" in name else ("eps_v_seq", "eps_s_seq")
        noise = {key: getattr(reference, key).clone() for key in keys}
    want, want_grads = run(reference, x, noise)
    got, got_grads = run(kernels, x.to(CUDA, dtype), noise)
    tolerance = TOLERANCE[dtype]
    flipped = ((got - want).abs() > 0.5).double().mean()  # a spike decided otherwise near the threshold
    assert float(flipped) <= (0 if dtype == torch.float64 else 0.02)
    if dtype == torch.float64 or "NonSpiking" in name:
        torch.testing.assert_close(got, want, rtol=tolerance, atol=tolerance * float(want.abs().max()))
    for got_grad, want_grad in zip(got_grads, want_grads, strict=True):
        scale = float(want_grad.abs().max())
        if dtype == torch.float64:
            torch.testing.assert_close(got_grad, want_grad, rtol=tolerance, atol=tolerance * scale)
        else:  # flips move gradients locally: compare the whole
            assert float((got_grad - want_grad).norm() / want_grad.norm().clamp_min(1e-12)) < 10 * tolerance + 0.05


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ["OTTTLIFNode", "SLTTLIFNode"])
def test_online_nodes_in_every_dtype_against_the_float64_reference(name: str, dtype: torch.dtype) -> None:
    """Training steps, each with its own backward (nothing flows back in time): spikes, OTTT's trace, each step's
    input gradient."""
    data = [1.5 * torch.rand(BATCH, 64, generator=torch.Generator().manual_seed(t), dtype=torch.float64)
            for t in range(4)]
    results = {}
    for label, layer, device, kind in (("reference", getattr(our, name)(backend="torch"), "cpu", torch.float64),
                                       ("kernels", getattr(our, name)(backend="cupy"), CUDA, dtype)):
        steps = []
        for x in data:
            given = x.detach().to(device, kind).requires_grad_()
            out = layer(given)
            out = out if isinstance(out, list) else [out]
            out[0].double().sum().backward()
            steps.append([o.detach().double().cpu() for o in out] + [given.grad.double().cpu()])
        results[label] = steps
    tolerance = TOLERANCE[dtype]
    for got, want in zip(results["kernels"], results["reference"]):
        flipped = ((got[0] - want[0]).abs() > 0.5).double().mean()
        assert float(flipped) <= (0 if dtype == torch.float64 else 0.02)
        if dtype == torch.float64:
            for a, b in zip(got, want, strict=True):
                torch.testing.assert_close(a, b, rtol=tolerance, atol=tolerance)
        else:  # the input gradient, as a whole (a flip moves it locally)
            assert float((got[-1] - want[-1]).norm() / want[-1].norm().clamp_min(1e-12)) < 10 * tolerance + 0.05
