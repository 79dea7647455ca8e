"""SpikingJelly 2.0's DSR neurons (`autocuda.nn.DSRIFNode`, `DSRLIFNode`) against SpikingJelly's own classes in
float64 on the CPU: equal outputs, and equal gradients of the input and the threshold within float32 rounding
(SpikingJelly's outputs, hence the gradients its backward gets, are float32); the forward (the `dsr` spec) on the
reference and on the generated kernels (host runner); their checks and step mode."""
from __future__ import annotations

from typing import Any

import pytest
import torch
from backends import CPU_BACKENDS

import autocuda.nn as our

sj_dsr = pytest.importorskip("spikingjelly.activation_based.neuron.dsr", reason="SpikingJelly 2.0 is a test extra")
from spikingjelly.activation_based import base, functional  # noqa: E402

F64 = torch.float64
# Thresholds and steps exact in float32, so that SpikingJelly's float32 spikes are our float64 ones
CASES = [
    ("DSRIFNode", {"T": 4, "v_threshold": 1.0}),
    ("DSRIFNode", {"T": 4, "v_threshold": 0.75, "alpha": 1.0, "v_threshold_grad_scaling": 0.5}),
    ("DSRLIFNode", {"T": 4, "v_threshold": 0.5, "delta_t": 0.25, "tau": 1.0}),
    ("DSRLIFNode", {"T": 4, "v_threshold": 0.25, "delta_t": 0.5, "tau": 2.0, "alpha": 0.5,
                    "v_threshold_grad_scaling": 2.0}),
]


def pair(name: str, backend: str | None = None, **kwargs: Any) -> tuple[torch.nn.Module, torch.nn.Module]:
    return getattr(sj_dsr, name)(**kwargs).to(F64), getattr(our, name)(backend=backend, **kwargs).to(F64)


def inputs(steps: int, seed: int) -> torch.Tensor:
    """Inputs whose time means fall on both sides of the gradient's window (below 0, inside, above)."""
    generator = torch.Generator().manual_seed(seed)
    shift = torch.linspace(-1.0, 3.0, 30, dtype=F64)
    return (torch.randn(steps, 2, 30, generator=generator, dtype=F64) + shift).requires_grad_(True)


def output_weights(like: torch.Tensor, seed: int) -> torch.Tensor:
    """Weights of the loss exact in float32 (quarters), whose sums over time are exact in float32 too."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(-8, 9, like.shape, generator=generator).to(F64) / 4


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize(("name", "kwargs"), CASES)
def test_dsr_nodes_as_theirs(name: str, kwargs: dict, backend: str) -> None:
    theirs, ours = pair(name, backend, **kwargs)
    for seed in (1, 2):  # two calls: no state carries over, as SpikingJelly's (no memories)
        x = inputs(kwargs["T"], seed)
        y_theirs, y_ours = theirs(x), ours(x)
        assert y_ours.dtype == F64 and y_theirs.dtype == torch.float32  # SpikingJelly's casts its spikes
        assert torch.equal(y_ours, y_theirs.to(F64))
        assert 0 < int((y_ours != 0).sum()) < y_ours.numel()
        w = output_weights(y_ours, seed)
        grads_theirs = torch.autograd.grad((y_theirs * w).sum(), [x, theirs.v_threshold])
        grads_ours = torch.autograd.grad((y_ours * w).sum(), [x, ours.v_threshold])
        for a, b in zip(grads_theirs, grads_ours):
            torch.testing.assert_close(b, a, rtol=1e-6, atol=1e-6)
        assert grads_ours[1] != 0 and int((grads_ours[0] == 0).sum()) > 0  # both sides of the window drawn


@pytest.mark.parametrize("name", ["DSRIFNode", "DSRLIFNode"])
def test_a_threshold_below_its_bound_is_clamped_and_gets_no_gradient(name: str) -> None:
    theirs, ours = pair(name, T=3, v_threshold=0.5, v_threshold_lower_bound=0.25)
    with torch.no_grad():
        theirs.v_threshold.fill_(0.125)
        ours.v_threshold.fill_(0.125)
    x = inputs(3, 4)
    y_theirs, y_ours = theirs(x), ours(x)
    assert torch.equal(y_ours, y_theirs.to(F64))
    spike = y_ours.abs().max() * (ours.delta_t if name == "DSRLIFNode" else 1)
    assert spike == 0.25  # fires the bound
    (grad,) = torch.autograd.grad(y_ours.sum(), [ours.v_threshold])
    assert grad == 0


def test_a_fixed_threshold_is_a_buffer_outside_the_state_dict() -> None:
    theirs, ours = pair("DSRIFNode", T=2, v_threshold_training=False)
    assert [n for n, _ in ours.named_parameters()] == [n for n, _ in theirs.named_parameters()] == []
    assert set(ours.state_dict()) == set(theirs.state_dict()) == set()
    trained, ours_trained = pair("DSRLIFNode")
    assert set(ours_trained.state_dict()) == set(trained.state_dict()) == {"v_threshold"}
    ours_trained.load_state_dict(trained.state_dict())
    x = inputs(2, 3)
    assert torch.equal(ours(x), theirs(x).to(F64))
    assert ours.v_threshold.dtype == F64  # moved and converted with the layer


def test_the_memory_protocol_and_step_mode() -> None:
    ours = our.DSRIFNode(T=3)
    assert isinstance(ours, base.MemoryModule) and list(ours.named_memories()) == []
    functional.reset_net(ours)
    functional.set_step_mode(ours, "m")
    with pytest.raises(ValueError, match="multi-step mode only"):
        ours.step_mode = "s"
    (y,), states = ours.multi_step_functional_forward((torch.ones(3, 2),), ())
    assert states == () and y.shape == (3, 2)


def test_a_gradient_needs_t_steps() -> None:
    ours = our.DSRLIFNode(T=4)
    with pytest.raises(ValueError, match="x_seq has 3 time-steps but T=4"):
        ours(torch.ones(3, 2))
    with torch.no_grad():
        assert ours(torch.ones(3, 2)).shape == (3, 2)  # forward alone takes any length, as SpikingJelly's


@pytest.mark.parametrize(("kwargs", "names"), [
    ({"T": 2.0}, "T"), ({"alpha": 0.0}, "alpha"), ({"alpha": 1.5}, "alpha"),
    ({"v_threshold_lower_bound": 0.0}, "v_threshold_lower_bound"), ({"v_threshold": 0.001}, "v_threshold"),
    ({"v_threshold": "1"}, "v_threshold"), ({"step_mode": "s"}, "step_mode"),
])
def test_refusals_name_the_argument(kwargs: dict, names: str) -> None:
    for name in ("DSRIFNode", "DSRLIFNode"):
        with pytest.raises(AssertionError):
            getattr(sj_dsr, name)(**kwargs)
        with pytest.raises(ValueError, match=f"^{names}:"):
            getattr(our, name)(**kwargs)
    # what SpikingJelly takes and fails on later (T=0: an empty gradient; tau, delta_t: a division by zero)
    with pytest.raises(ValueError, match="^T:"):
        our.DSRIFNode(T=0)
    with pytest.raises(ValueError, match="^tau:"):
        our.DSRLIFNode(tau=0.0)
    with pytest.raises(ValueError, match="^delta_t:"):
        our.DSRLIFNode(delta_t=-0.1)
