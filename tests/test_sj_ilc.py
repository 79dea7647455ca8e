"""SpikingJelly's neurons with inter-layer connections (autocuda.nn.spikingjelly_ilc) in float64 on the CPU against
SpikingJelly's own classes: `conn` initialised as theirs under one seed; equal spikes, states and gradients (the
input and `conn`'s weight and bias) over two calls, on the reference and the host runner; the refusals (skipped
where SpikingJelly does not import)."""
from __future__ import annotations

import functools

import pytest
import torch
from backends import NEEDS_HOST
from conftest import compile_launched
from sj_signatures import assert_signature_is_theirs_then_backend

import autocuda.nn as our
from autocuda.toolchain.host import cxx as toolchain

try:  # any failure (not installed, a dependency missing or too new) means: nothing to test against here
    from spikingjelly.activation_based.neuron import inter_layer_connection as sj_ilc
except Exception as error:
    pytest.skip(f"SpikingJelly does not import: {type(error).__name__}: {error}", allow_module_level=True)

F64 = torch.float64
NODES = [("ILCIFNode", {}), ("ILCIFNode", {"v_reset": None, "v_threshold": 0.7}),
         ("ILCLIFNode", {"v_decay": 0.6}), ("ILCCUBALIFNode", {"c_decay": 0.3, "v_threshold": 0.8})]
ON_HOST = NODES[1::2]  # the host runner's kernels for two specs and both resets; the others on the reference


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels() -> int:
    """The host kernels of the tests below, compiled up front in one compiler run (`conftest.compile_launched`)."""
    if toolchain.missing() is not None:
        return 0

    def call(name: str, kwargs: dict) -> None:
        x = torch.ones(2, 1, 6, dtype=F64, requires_grad=True)
        getattr(our, name)(2, 3, backend="host", **kwargs)(x).sum().backward()

    return compile_launched(*(functools.partial(call, name, kwargs) for name, kwargs in ON_HOST))


def twin_inputs(seed: int, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    x = 1.2 * torch.randn(*shape, dtype=F64)
    return x.clone().requires_grad_(True), x.clone().requires_grad_(True)


def weighted_sum(y: torch.Tensor) -> torch.Tensor:
    return (y * torch.arange(y.numel(), dtype=y.dtype).view_as(y)).sum()


@pytest.mark.parametrize(("name", "kwargs", "backend"), [
    *((name, kwargs, "torch") for name, kwargs in NODES),
    *(pytest.param(name, kwargs, "host", marks=NEEDS_HOST) for name, kwargs in ON_HOST)])
def test_ilc_nodes_as_theirs(name: str, kwargs: dict, backend: str) -> None:
    if kwargs.get("v_reset", 0.0) is None:  # theirs fills v with None: start it from v = 0, as ours
        theirs = _soft_reset_twin(getattr(sj_ilc, name), kwargs)
    else:
        torch.manual_seed(3)
        theirs = getattr(sj_ilc, name)(2, 3, **kwargs).to(F64)
    torch.manual_seed(3)
    mine = getattr(our, name)(2, 3, backend=backend, **kwargs).to(F64)
    for (n, p), (_, q) in zip(mine.named_parameters(), theirs.named_parameters(), strict=True):
        assert torch.equal(p, q), n
    x, y = twin_inputs(1, (5, 4, 6))
    # theirs adds each step's feedback into x_seq itself (in place): give it a copy, ours leaves x_seq as it is
    a, b = torch.stack([theirs(x.clone()) for _ in range(2)]), torch.stack([mine(y) for _ in range(2)])
    assert torch.equal(a, b) and 0 < float(a.detach().mean()) < 1
    torch.testing.assert_close(mine.v, theirs.v, rtol=1e-13, atol=1e-13)
    weighted_sum(a).backward(), weighted_sum(b).backward()
    torch.testing.assert_close(y.grad, x.grad, rtol=1e-12, atol=1e-12)
    for (n, p), (_, q) in zip(mine.named_parameters(), theirs.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-12, atol=1e-12, msg=n)


def _soft_reset_twin(cls: type, kwargs: dict) -> torch.nn.Module:
    torch.manual_seed(3)
    layer = cls(2, 3, **kwargs).to(F64)
    layer.init_tensor = lambda data: setattr(layer, "v", torch.zeros_like(data))
    return layer


@pytest.mark.parametrize("name", ["ILCIFNode", "ILCLIFNode", "ILCCUBALIFNode"])
def test_signatures_are_theirs_then_backend(name: str) -> None:
    assert_signature_is_theirs_then_backend(getattr(sj_ilc, name), getattr(our, name))


@pytest.mark.parametrize(("build", "error", "words"), [
    (lambda: our.ILCIFNode(2, 3, v_threshold=1), ValueError, "^v_threshold"),
    (lambda: our.ILCLIFNode(2, 3, v_reset=0), ValueError, "^v_reset"),
    (lambda: our.ILCCUBALIFNode(0, 3), ValueError, "^act_dim"),
    (lambda: our.ILCBaseNode(2, 3), TypeError, "base class"),
    (lambda: our.ILCIFNode(2, 3)(torch.zeros(4, 2, 5)), ValueError, "act_dim \\* dec_pop_dim = 6"),
    (lambda: setattr(our.ILCIFNode(2, 3), "step_mode", "s"), ValueError, "^step_mode"),
])
def test_bad_input_is_refused_naming_it(build, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        build()
