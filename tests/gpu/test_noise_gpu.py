"""Random draws on a GPU (`autocuda.codegen.noise`, `randn()` and `rand()` in specs): the generator's C on the GPU
equals the host runner and the torch reference bit for bit in float and double; a noisy LIF's forward kernel on the GPU
equals the host runner's bit for bit in float32 and float64 for two layouts (its step has no division but by tau = 2 and
no transcendental function, so the GPU's approximate division and libm do not enter; the draws are made alike), its
backward (the surrogate's exp: the GPU's libm) to a tight tolerance; and every dtype runs against the reference fed
the same draws."""
from __future__ import annotations

import pytest
import torch

import autocuda.nn as ann
from autocuda.codegen import noise
from autocuda.runtime.neuron_launch import NeuronConfig
from autocuda.spec.load import spec_from_toml
from autocuda.tools.testing.named_launch import backward, forward

pytestmark = pytest.mark.gpu
NOISY_LIF = """
name = "noisy_lif"
charge = "v + (x - (v - v_reset)) / tau + sigma * randn() + 0.1 * (rand() - 0.5)"
[params]
tau = 2.0
v_threshold = 1.0
v_reset = 0.0
sigma = { default = 0.5, learnable = true }
[states]
v = "v_reset"
"""
SCALARS = {"tau": 2.0, "v_threshold": 1.0, "v_reset": 0.0, "sigma": 0.5}
T, N = 16, 4099  # an odd N: the kernels' tails too


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.view({torch.float32: torch.int32, torch.float64: torch.int64}[x.dtype])


@pytest.mark.parametrize("precision", ["float", "double"])
@pytest.mark.parametrize("kind", noise.KINDS)
def test_gpu_draws_equal_host_and_torch_bitwise(kind, precision):
    kernel = noise.DrawKernel(kind, precision)
    count, first, seed = 1 << 20, 2**32 - 12345, 2**64 - 5
    gpu = kernel.draws(seed, count, step=2**32 + 9, site=2, neuron0=first, backend="cuda", device="cuda")
    host = kernel.draws(seed, count, step=2**32 + 9, site=2, neuron0=first, backend="host")
    torch_cpu = noise.draws(kind, seed, torch.arange(count) + first, 2**32 + 9, 2, kernel.precision.torch_dtype)
    torch_gpu = noise.draws(kind, seed, torch.arange(count, device="cuda") + first, 2**32 + 9, 2,
                            kernel.precision.torch_dtype)
    assert torch.equal(bits(gpu.cpu()), bits(host))
    assert torch.equal(bits(host), bits(torch_cpu))
    assert torch.equal(bits(torch_gpu.cpu()), bits(torch_cpu))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("layout", [None, {"lanes": 4, "block": 128}, {"lanes": 2, "unroll": 2, "block": 64}],
                         ids=["fixed", "lanes4", "block64"])
def test_gpu_forward_equals_host_bitwise(dtype, layout):
    spec = spec_from_toml(NOISY_LIF)
    config = NeuronConfig(spec, spec.surrogate, "hard")
    generator = torch.Generator().manual_seed(0)
    x, v0 = torch.rand(T, N, generator=generator, dtype=dtype), torch.zeros(N, dtype=dtype)
    grad_spike = torch.randn(T, N, generator=generator, dtype=dtype)
    seed = noise.Seed(31337, offset=7)
    outs = {}
    for backend, device in (("host", "cpu"), ("cuda", "cuda")):
        given = {**SCALARS, **seed.arguments()}
        out = forward(config, x.to(device), {"v": v0.to(device)}, given, backend=backend, layout=layout)
        grads = backward(config, {"grad_spike_seq": grad_spike.to(device), "grad_v_final": torch.zeros_like(
            v0, device=device)}, {"h_seq": out["h_seq"], "x_seq": x.to(device), "v_init": v0.to(device)}, given,
            backend=backend, layout=layout)
        outs[backend] = {k: v.cpu() for k, v in {**out, **grads}.items()}
    tolerance = 1e-5 if dtype == torch.float32 else 1e-12
    for name, value in outs["host"].items():
        if name.startswith("grad_"):
            torch.testing.assert_close(outs["cuda"][name], value, rtol=tolerance, atol=tolerance)
        else:
            assert torch.equal(outs["cuda"][name], value), name


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_every_dtype_runs_against_the_reference(dtype):
    spec = spec_from_toml(NOISY_LIF)
    x = torch.rand(T, N, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    results = {}
    for backend, data in (("cuda", x.to("cuda", dtype)), ("reference", x.to("cuda", dtype))):
        layer = ann.Neuron(spec, step_mode="m", backend=backend).to("cuda")
        given = data.clone().requires_grad_()
        torch.manual_seed(5)
        spikes = layer(given)
        spikes.float().sum().backward()
        results[backend] = (spikes.detach().double(), given.grad.double(), layer.sigma.grad.double())
    (spikes, grad_x, grad_sigma), (ref_spikes, ref_grad_x, ref_grad_sigma) = results["cuda"], results["reference"]
    tolerance = {torch.float64: 1e-9, torch.float32: 1e-3, torch.float16: 5e-2, torch.bfloat16: 1e-1}[dtype]
    assert float((spikes != ref_spikes).double().mean()) <= (0 if dtype == torch.float64 else 0.01)
    if dtype == torch.float64:
        torch.testing.assert_close(grad_x, ref_grad_x, rtol=tolerance, atol=tolerance)
        torch.testing.assert_close(grad_sigma, ref_grad_sigma, rtol=tolerance, atol=tolerance)
    assert torch.isfinite(grad_x).all() and torch.isfinite(grad_sigma).all()


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_shipped_noisy_cuba_lif_against_the_reference(dtype):
    """The shipped spec (draws in the charge and in an update; a learnable scale on each): the kernels in every dtype
    against the reference fed the same input under one seed (it computes in float64 from the draws of the input's
    dtype, as the kernels draw them): outputs, the input's and both noise scales' gradients."""
    x = 0.8 * torch.rand(T, N, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    results = {}
    for backend, data in (("cuda", x.to("cuda", dtype)), ("reference", x.to("cuda", dtype))):
        layer = ann.Neuron("noisy_cuba_lif", step_mode="m", backend=backend).to("cuda")
        given = data.clone().requires_grad_()
        torch.manual_seed(9)
        out = layer(given)
        out.double().sum().backward()
        results[backend] = (out.detach().double(), given.grad.double(), layer.sigma_v.grad.double(),
                            layer.sigma_s.grad.double())
    (out, grad_x, grad_v, grad_s), (ref_out, ref_grad_x, ref_grad_v, ref_grad_s) = results["cuda"], results["reference"]
    tolerance = {torch.float64: 1e-9, torch.float32: 1e-3, torch.float16: 5e-2, torch.bfloat16: 1e-1}[dtype]
    flipped = ((out - ref_out).abs() > 0.5).double().mean()  # a spike decided otherwise near the threshold
    assert float(flipped) <= (0 if dtype == torch.float64 else 0.01)
    if dtype == torch.float64:
        torch.testing.assert_close(out, ref_out, rtol=tolerance, atol=tolerance)
        torch.testing.assert_close(grad_x, ref_grad_x, rtol=tolerance, atol=tolerance)
    for got, want in ((grad_v, ref_grad_v), (grad_s, ref_grad_s)):  # sums over every neuron and step
        torch.testing.assert_close(got, want, rtol=min(tolerance, 0.1),
                                   atol=tolerance * float(want.abs()) + 1e-6)
    assert torch.isfinite(grad_x).all()
