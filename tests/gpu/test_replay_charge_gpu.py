"""`save_h=False` on a GPU, in every dtype and the launch's layouts (short loops over many neurons, tuned or by the
fixed rule; long loops over few, with 32-step segments): forward's outputs bitwise those of keeping h, the
gradients close to them (float16 and bfloat16 keep h rounded: the replayed ones are the more exact) and, in
float32, to the float64 reference; the fused BatchNorm layer (which replays h) under torch.compile equals eager."""
from __future__ import annotations

import copy

import pytest
import torch

import autocuda.call.functional as F
import autocuda.nn as ann

pytestmark = pytest.mark.gpu
CUDA = "cuda"
DTYPES = [torch.float64, torch.float32, torch.float16, torch.bfloat16]
SHAPES = [(4, 3 * 4096), (16, 1 << 17), (70, 999), (1, 64)]


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-12))


def _run(name: str, x: torch.Tensor, save_h: bool, backend: str | None = None) -> tuple[torch.Tensor, ...]:
    inp = x.clone().requires_grad_()
    spikes, finals, _ = F.multi_step(name, inp, save_h=save_h, backend=backend)
    g = torch.linspace(-1, 1, spikes.numel(), device=x.device, dtype=torch.float64).reshape(spikes.shape)
    (spikes * g.to(spikes.dtype)).sum().add((finals[0] * 0.5).sum()).backward()
    return spikes, *finals, inp.grad


@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("name", ["lif", "alif", "parametric_lif", "izhikevich"])
def test_replayed_charge_equals_saved_h(name: str, dtype: torch.dtype, shape: tuple[int, int]) -> None:
    torch.manual_seed(sum(shape))
    x = (torch.rand(shape, device=CUDA, dtype=torch.float64) * 3 - 0.5).to(dtype)
    saved, replayed = _run(name, x, True), _run(name, x, False)
    for want, got in zip(saved[:-1], replayed[:-1]):
        assert torch.equal(got, want)
    assert 0 < saved[0].double().mean() < 1
    if dtype in (torch.float64, torch.float32):
        assert _relative(replayed[-1], saved[-1]) < (1e-12 if dtype == torch.float64 else 1e-5)
        return
    # float16 / bfloat16: against float64 (the same rounded input), the replay is at least as exact as saving h
    reference = _run(name, x.double(), True, backend="reference")
    assert _relative(replayed[-1], reference[-1]) <= 1.1 * _relative(saved[-1], reference[-1]) + 1e-3


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_fused_batchnorm_compiled_equals_eager(dtype: torch.dtype) -> None:
    torch.manual_seed(3)
    layer = ann.BatchNormNeuron(16, ann.LIFNode(step_mode="m")).to(CUDA, dtype)
    with torch.no_grad():
        layer.weight.uniform_(0.5, 1.5)
        layer.bias.uniform_(-0.5, 0.5)
    compiled_layer = copy.deepcopy(layer)
    compiled = torch.compile(compiled_layer, fullgraph=True)
    x = torch.randn(4, 8, 16, 9, 7, device=CUDA).to(dtype)
    x1, x2 = x.clone().requires_grad_(), x.clone().requires_grad_()
    want, got = layer(x1), compiled(x2)
    assert torch.equal(got, want)
    g = torch.rand_like(want)
    (want * g).sum().backward()
    (got * g).sum().backward()
    tol = 1e-9 if dtype == torch.float64 else 1e-3 if dtype == torch.float32 else 5e-2
    assert _relative(x2.grad, x1.grad) < tol
    assert _relative(compiled_layer.weight.grad, layer.weight.grad) < tol
