"""`fires_at` on a GPU: ">=" and ">" in float64, float32, float16 and bfloat16 (and half2 / bfloat162 arithmetic)
against the float64 reference, on inputs that put h exactly on the threshold at many neuron-steps (multiples of
1/4, exact in every dtype): the spikes equal the reference's bit for bit, the gradients agree to the dtype's
tolerance, and the two comparisons give different spikes."""
from __future__ import annotations

import dataclasses

import pytest
import torch

import autocuda.nn as ann
from autocuda.runtime.neuron_launch import NeuronConfig
from autocuda.spec.load import load_spec
from autocuda.tools.testing.named_launch import backward, forward

pytestmark = pytest.mark.gpu
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
TOLERANCE = {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 3e-2, torch.bfloat16: 1e-1}
T, N = 16, 4099  # an odd N: the kernels' tails too


def _inputs() -> torch.Tensor:
    """Multiples of 1/4 in [-0.5, 1]: IF's h = v + x stays on that grid, and lands on v_threshold = 1 often."""
    generator = torch.Generator().manual_seed(3)
    return torch.randint(-2, 5, (T, N), generator=generator).double() / 4


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-12))


def _run(spec, x: torch.Tensor, backend: str | None):
    layer = ann.Neuron(spec, step_mode="m", backend=backend)
    x = x.clone().requires_grad_()
    spikes = layer(x)
    weights = torch.linspace(0.5, 1.5, x.shape[0], dtype=x.dtype, device=x.device).view(-1, 1)
    (spikes * weights + layer.v * 0.25).sum().backward()
    return spikes.detach(), layer.v.detach(), x.grad


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ["if", "ternary_if"])
def test_both_comparisons_match_the_reference(name: str, dtype: torch.dtype) -> None:
    x = _inputs()
    spikes = {}
    for fires_at in (">=", ">"):
        spec = dataclasses.replace(load_spec(name), fires_at=fires_at)
        got = _run(spec, x.to("cuda", dtype), None)
        want = _run(spec, x, "torch")  # the float64 reference on the CPU
        assert torch.equal(got[0].cpu().double(), want[0]), f"{fires_at}: spikes differ"
        for a, b in zip(got[1:], want[1:]):
            assert _relative(a.cpu(), b) <= TOLERANCE[dtype], fires_at
        spikes[fires_at] = want[0]
    assert not torch.equal(spikes[">="], spikes[">"])  # h met the threshold exactly somewhere


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("fires_at", [">=", ">"])
def test_native_packed_arithmetic_compares_as_the_spec_says(fires_at: str, dtype: torch.dtype) -> None:
    spec = dataclasses.replace(load_spec("if"), fires_at=fires_at)
    config = NeuronConfig(spec, spec.surrogate, "hard")
    x64 = _inputs()
    x = x64.to("cuda", dtype)
    params, initial = {"v_threshold": 1.0, "v_reset": 0.0}, {"v": torch.zeros(N, device="cuda", dtype=dtype)}
    layout = {"native": True, "lanes": 2}
    out = forward(config, x, initial, params, backend="cuda", layout=layout)
    grads = {"grad_spike_seq": torch.ones_like(x), "grad_v_final": torch.zeros_like(initial["v"])}
    saved = {**out, "x_seq": x, "v_init": initial["v"]}
    grad_x = backward(config, grads, saved, params, backend="cuda", layout=layout)["grad_x_seq"]
    reference = ann.Neuron(spec, step_mode="m", backend="torch")
    x_ref = x64.clone().requires_grad_()
    want = reference(x_ref)
    want.sum().backward()
    assert torch.equal(out["spike_seq"].cpu().double(), want.detach())
    assert _relative(grad_x.cpu(), x_ref.grad) <= TOLERANCE[dtype]
