"""The MPBN LIF neuron's kernels (`autocuda.call.mpbn`, `codegen.mpbn_kernel`), run on the CPU through the host runner
(`backend="host"`), against the same layer composed of torch ops (`backend="torch"`) in float64 on the same inputs:
spikes, the final membrane, every gradient (the input of two calls in a row, the second from the first's membrane,
and the BatchNorm's weight and bias) and the running statistics, in training and in eval, for a BatchNorm2d and a
BatchNorm1d, hard and soft resets, the decaying input and detach_reset; the calls the kernels leave to the
composition; and that the layer's `backend` is read at every call and checked."""
from __future__ import annotations

import functools

import pytest
import torch
from conftest import compile_launched

import autocuda.nn as our
from autocuda.call import mpbn

F64 = torch.float64
CASES = {"channels": {"out_channels": 3}, "soft": {"out_channels": 3, "v_reset": None},
         "decay-detach": {"out_channels": 3, "decay_input": True, "detach_reset": True},
         "features": {"out_features": 5}}
# relative error of each result against the float64 composition (bfloat16: the final membrane elementwise); the
# spikes of float32 and float64 are equal
TOLERANCE = {F64: 1e-12, torch.float32: 1e-5, torch.bfloat16: 6e-2}
DTYPES = (F64, torch.float32, torch.bfloat16)


def layer(case: str, backend: str, dtype: torch.dtype, training: bool) -> our.MPBNLIFNode:
    node = our.MPBNLIFNode(step_mode="m", **CASES[case]).to(dtype)
    with torch.no_grad():  # the BatchNorm's affine parameters away from (1, 0), its running statistics from 0, 1
        for tensor in (*node.parameters(), node.vbn.running_mean, node.vbn.running_var):
            tensor.copy_(torch.linspace(0.5, 1.5, tensor.numel()).view_as(tensor))
    node.backend = backend
    return node.train(training)


def sequence(case: str) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    shape = (8, 4, 3, 9, 11) if "out_channels" in CASES[case] else (8, 6, 5)
    return torch.randn(shape, generator=generator, dtype=F64) + 0.5


def results(case: str, backend: str, dtype: torch.dtype, training: bool) -> list[torch.Tensor]:
    """Two calls in a row (the second from the first's membrane): the spikes, the final membrane, the gradients of
    both inputs and of the BatchNorm's parameters, and the buffers."""
    node, x = layer(case, backend, dtype, training), sequence(case).to(dtype)
    first, second = x[:4].clone().requires_grad_(True), x[4:].clone().requires_grad_(True)
    spikes = torch.cat([node(first), node(second)])
    weights = torch.linspace(-1.0, 1.0, spikes.numel(), dtype=dtype).view_as(spikes)
    grads = torch.autograd.grad((spikes * weights).sum() + (node.v ** 2).sum(), [first, second, *node.parameters()])
    return [spikes, node.v, *grads, *node.buffers()]


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels() -> int:
    """The host kernels of the cases below, compiled up front many to a compiler run (`conftest.compile_launched`)."""
    return compile_launched(*(functools.partial(results, "channels", "host", dtype, True) for dtype in DTYPES))


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kernels_equal_the_composition(case: str, dtype: torch.dtype, training: bool,
                                       monkeypatch: pytest.MonkeyPatch) -> None:
    ran = []
    run = mpbn.run
    monkeypatch.setattr(mpbn, "run", lambda *args: ran.append(run(*args)) or ran[-1])
    ours = results(case, "host", dtype, training)
    assert len(ran) == 2 and all(found is not None for found in ran)  # both calls on the kernels
    theirs = results(case, "torch", F64, training)
    if dtype != torch.bfloat16:
        assert torch.equal(ours[0].double(), theirs[0])
    else:  # a spike flipped by rounding moves its membrane by about 1 and its channel's statistics a little
        assert float((ours[0].double() != theirs[0]).double().mean()) < 1e-2
        apart = (ours[1].double() - theirs[1]).abs() > TOLERANCE[dtype] * (1 + theirs[1].abs())
        assert float(apart.double().mean()) < 1e-2
        ours, theirs = ours[1:], theirs[1:]
    for got, expected in zip(ours[1:], theirs[1:]):
        assert got.dtype == (dtype if got.dtype.is_floating_point else expected.dtype)
        assert (got.double() - expected.double()).norm() <= TOLERANCE[dtype] * (expected.double().norm() + 1.0)


def test_calls_the_kernels_do_not_run_compose(monkeypatch: pytest.MonkeyPatch) -> None:
    ran = []
    run = mpbn.run
    monkeypatch.setattr(mpbn, "run", lambda *args: ran.append(run(*args)) or ran[-1])
    x = sequence("channels")
    node = layer("channels", "host", F64, True)
    node(x)
    assert ran[-1] is not None
    for change in ({"backend": None}, {"backend": "torch"}):  # a CPU tensor without "host"; the composition
        ran.clear()
        node.reset()
        for name, value in change.items():
            setattr(node, name, value)
        node(x)
        assert ran == [None]
    ran.clear()
    for kwargs in ({"learnable_vth": True}, {}):  # a learned threshold; a momentum of None: never asked
        node = our.MPBNLIFNode(step_mode="m", out_channels=3, **kwargs).to(F64)
        node.backend = "host"
        node.vbn.momentum = None
        node(x)
    assert ran == []
    node = layer("channels", "host", F64, True)
    node.re_parameterize_v_threshold()  # folded: the threshold is a tensor
    node(x)
    assert ran == []


def test_a_batch_of_one_value_per_channel_in_training_is_refused_as_by_torch() -> None:
    node = layer("channels", "host", F64, True)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        node(torch.ones(2, 1, 3, 1, 1, dtype=F64))


def test_the_backend_is_checked() -> None:
    node = our.MPBNLIFNode(step_mode="m", out_channels=3)
    with pytest.raises(ValueError, match="backend"):
        node.backend = "cupy2"
    assert node.backend is None
