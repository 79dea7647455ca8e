"""The shipped noisy spec `noisy_cuba_lif` (white noise drawn in the kernels: SpikingJelly's NoisyCUBALIFNode with
beta = 0) as a layer: listed, its generated kernels (host runner) equal to the torch reference under one seed in
outputs, states and gradients (the input and both learnable noise scales), the noise repeatable under
`torch.manual_seed` and new at each call, and without noise the noiseless CUBA LIF."""
from __future__ import annotations

import torch
from backends import NEEDS_HOST

from autocuda.nn import Neuron
from autocuda.spec.load import list_specs

F64 = torch.float64
TOL = {"rtol": 1e-12, "atol": 1e-12}


def test_it_is_listed() -> None:
    assert "noisy_cuba_lif" in dict(list_specs())


def noisy_run(backend: str, seed: int = 1) -> tuple[Neuron, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    x = (0.8 * torch.rand(6, 3, 5, dtype=F64)).requires_grad_()
    layer = Neuron("noisy_cuba_lif", step_mode="m", backend=backend, sigma_v=torch.nn.Parameter(
        torch.tensor(0.3, dtype=F64)), sigma_s=torch.nn.Parameter(torch.tensor(0.2, dtype=F64)))
    torch.manual_seed(seed)
    y = layer(x)
    (y * torch.arange(y.numel(), dtype=F64).view_as(y)).sum().backward()
    return layer, x, y


@NEEDS_HOST
def test_kernels_equal_the_reference_under_one_seed() -> None:
    (ref, x, y), (host, x2, y2) = noisy_run("reference"), noisy_run("host")
    torch.testing.assert_close(y2, y, **TOL)
    for name in ("v", "c", "y"):
        torch.testing.assert_close(getattr(host, name), getattr(ref, name), **TOL, msg=name)
    torch.testing.assert_close(x2.grad, x.grad, **TOL)
    for name in ("sigma_v", "sigma_s"):
        got, expected = getattr(host, name).grad, getattr(ref, name).grad
        assert expected.abs() > 1e-3, name
        torch.testing.assert_close(got, expected, **TOL, msg=name)


def test_noise_follows_the_seed_and_is_new_at_each_call() -> None:
    first, again, other = noisy_run("reference", 1)[2], noisy_run("reference", 1)[2], noisy_run("reference", 2)[2]
    assert torch.equal(first, again) and not torch.equal(first, other)
    assert not torch.equal(first.detach().round(), first.detach())  # the output is not a bare spike


def test_without_noise_it_is_the_cuba_lif() -> None:
    x = torch.rand(6, 3, 5, dtype=F64)
    quiet = Neuron("noisy_cuba_lif", step_mode="m", sigma_v=0.0, sigma_s=0.0, v_threshold=0.5)
    plain = Neuron("cuba_lif_discrete", step_mode="m", v_threshold=0.5)
    torch.testing.assert_close(quiet(x), plain(x), **TOL)
    torch.testing.assert_close(quiet.v, plain.v, **TOL)
