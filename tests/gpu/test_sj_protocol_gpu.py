"""SpikingJelly's protocol on CUDA (tests/test_sj_protocol.py's checks through the CUDA kernels, a program's bound
launch and the keyed call of the native path): a parameter made learnable after warm-up, a surrogate or decay_input
changed after warm-up, and detach() in place, each against SpikingJelly 2.0's own class on the CPU in float64."""
from __future__ import annotations

import os
import sys

import pytest
import torch
from torch import nn

import autocuda.nn as our
import autocuda.spec.surrogate as ours
from autocuda.call import native

pytestmark = pytest.mark.gpu

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
from test_sj_protocol import (  # noqa: E402 - the cores of the CPU test, shared (skipped without SpikingJelly)
    CHANGES,
    F64,
    functional,
    inputs,
    make_learnable,
    outcome,
    sj,
    surrogate,
)

CUDA = torch.device("cuda")


def outcome_on_cuda(layer: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    """`outcome` of a layer on CUDA, as CPU tensors."""
    layer.reset()
    x = x.detach().to(CUDA).requires_grad_(True)
    out = layer(x)
    weights = torch.linspace(0.5, 1.5, out.numel(), dtype=F64, device=CUDA).view(out.shape)
    (out * weights).sum().backward()
    return [out.detach().cpu(), layer.v.detach().cpu(), x.grad.cpu()]


def warmed_on_cuda(layer: nn.Module, x: torch.Tensor) -> nn.Module:
    for _ in range(3):
        layer.reset()
        layer(x.detach().to(CUDA))
    layer.reset()
    return layer


def assert_close(mine: list[torch.Tensor], theirs: list[torch.Tensor]) -> None:
    for got, want in zip(mine, theirs, strict=True):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.fixture(params=["python", "native"])
def path(request, monkeypatch):
    monkeypatch.setattr(native, "USE", request.param == "native")
    if request.param == "native" and not native.ensure():
        pytest.skip(f"no native call path: {native.status()}")
    return request.param


@pytest.mark.parametrize("how", ["Parameter", "register_parameter", "register_buffer"])
def test_a_parameter_made_learnable_after_warm_up_on_the_gpu(how: str, path: str) -> None:
    x = inputs()
    mine = warmed_on_cuda(our.LIFNode(tau=2.0, step_mode="m").to(CUDA), x)
    assert mine._programs.configured is not None, "the warm-up kept the layer's configuration"
    assert any(p.native is not None for p in mine._programs.values()) == (path == "native")
    learned = make_learnable(mine, how)
    mine.to(CUDA)
    theirs = sj.LIFNode(tau=2.0, step_mode="m")
    theirs.tau = nn.Parameter(torch.tensor(3.0, dtype=F64)) if how != "register_buffer" else 3.0
    assert_close(outcome_on_cuda(mine, x), outcome(theirs, x))
    if how != "register_buffer":
        torch.testing.assert_close(learned.grad.cpu(), theirs.tau.grad, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("change", list(CHANGES))
def test_a_change_after_warm_up_is_read_at_the_next_call_on_the_gpu(change: str, path: str) -> None:
    x = inputs(1)
    mine_sg, their_sg, make = CHANGES[change]
    mine = our.LIFNode(surrogate_function=ours.Sigmoid() if mine_sg is None else surrogate(mine_sg), step_mode="m")
    theirs = sj.LIFNode(surrogate_function=surrogate(their_sg), step_mode="m")
    warmed_on_cuda(mine, x)
    make(mine, theirs)
    for _ in range(2):
        assert_close(outcome_on_cuda(mine, x), outcome(theirs, x))


def test_detach_in_place_on_the_gpu() -> None:
    layer = our.LIFNode(step_mode="m")
    layer(inputs(5, (6, 12)).to(CUDA).requires_grad_(True))
    held = layer.v
    assert held.grad_fn is not None
    functional.detach_net(layer)
    assert held.grad_fn is None and layer.v is held
