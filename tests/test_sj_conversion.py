"""SpikingJelly 2.0's conversion neurons (`autocuda.nn.STBIFNode`, `ActivationAwareIFNode`) against SpikingJelly's
own classes in float64 on the CPU, on the reference (every case) and on the generated kernels through the host
runner (one case of each, compiled together): equal outputs, memories and gradients within rounding, in both step
modes over two calls and a reset; their checks and refusals."""
from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from backends import NEEDS_HOST
from conftest import compile_launched

import autocuda.nn as our
from autocuda.toolchain.host import cxx as toolchain

try:  # any failure (not installed, a dependency missing or too new) means: nothing to test against here
    from spikingjelly.activation_based import functional
    from spikingjelly.activation_based import neuron as sj_neuron
    from spikingjelly.activation_based import surrogate as sj_surrogate
except Exception as error:
    pytest.skip(f"SpikingJelly does not import: {type(error).__name__}: {error}", allow_module_level=True)

F64 = torch.float64
STBIF_CASES = [
    ((0.5, 8), {"sym": True}),
    ((0.25, 4), {}),
    ((0.5, 6), {"pos_max": 2.0, "neg_min": torch.tensor(-1.0)}),
]
PER_CHANNEL = {"v_threshold": torch.tensor([0.5, 1.0, 1.5]), "v_offset": torch.tensor([0.125, -0.25, 0.5]),
               "channel_dim": 1}
AAIF_CASES = [
    {},
    {"v_reset": 0.25, "detach_reset": True},
    {"v_threshold": 0.75, "v_offset": 0.25},
    PER_CHANNEL,
    {"v_threshold": torch.tensor([0.5, 1.0, 1.5, 0.75]), "v_reset": 0.0},  # channels last (channel_dim=-1)
    {"v_threshold": torch.tensor([1, 2, 1]), "v_offset": torch.tensor(1), "channel_dim": -2},  # integer buffers
]
ON_HOST = [("STBIFNode", 0, "m"), ("ActivationAwareIFNode", 3, "m")]


def run(layer: torch.nn.Module, x_seq: torch.Tensor, step_mode: str) -> torch.Tensor:
    return layer(x_seq) if step_mode == "m" else torch.stack([layer(x) for x in x_seq])


def sequence(seed: int, channels: int = 3) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(6, 2, channels, 4, generator=generator, dtype=F64) * 0.8 + 0.2


def quantized(seed: int, scale: float) -> torch.Tensor:
    """Inputs in eighths of the scale: the residual lands on 0 and on 1 exactly (where -1 does not fire, +1 does)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(-12, 13, (6, 2, 3, 4), generator=generator).to(F64) / 8 * scale


def build(name: str, index: int, step_mode: str, backend: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """SpikingJelly's layer and ours of case `index`, in float64."""
    if name == "STBIFNode":
        args, kwargs = STBIF_CASES[index]
        return (sj_neuron.STBIFNode(*args, step_mode=step_mode, **kwargs).to(F64),
                our.STBIFNode(*args, step_mode=step_mode, backend=backend, **kwargs).to(F64))
    kwargs = AAIF_CASES[index]
    return (sj_neuron.ActivationAwareIFNode(step_mode=step_mode, store_v_seq=True,
                                            surrogate_function=sj_surrogate.ATan(), **kwargs).to(F64),
            our.ActivationAwareIFNode(step_mode=step_mode, store_v_seq=True, backend=backend,
                                      surrogate_function=sj_surrogate.ATan(), **kwargs).to(F64))


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels() -> int:
    """The host kernels of ON_HOST, compiled up front in one compiler run (`conftest.compile_launched`)."""
    if toolchain.missing() is not None:
        return 0

    def calls(name: str, index: int, step_mode: str) -> None:
        _, mine = build(name, index, step_mode, "host")
        x = sequence(0, 4 if index == 4 else 3)
        if name == "STBIFNode":
            run(mine, x, step_mode)
        else:
            (run(mine, x.requires_grad_(True), step_mode).sum() + (mine.v ** 2).sum()).backward()

    return compile_launched(*(functools.partial(calls, *case) for case in ON_HOST))


def cases(name: str, count: int) -> list[Any]:
    return [pytest.param(name, index, step_mode, backend, marks=NEEDS_HOST if backend == "host" else ())
            for index in range(count) for step_mode in ("s", "m") for backend in ("reference", "host")
            if backend == "reference" or (name, index, step_mode) in ON_HOST]


@pytest.mark.parametrize(("name", "index", "step_mode", "backend"), cases("STBIFNode", len(STBIF_CASES)))
def test_stbif_as_theirs(name: str, index: int, step_mode: str, backend: str) -> None:
    theirs, ours = build(name, index, step_mode, backend)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for seed in (1, 2, 3):  # two calls, a reset, a third
        x = sequence(seed) if seed < 3 else quantized(seed, STBIF_CASES[index][0][0])
        assert torch.equal(run(ours, x, step_mode), run(theirs, x, step_mode))
        for (name_ours, a), (name_theirs, b) in zip(ours.named_memories(), theirs.named_memories()):
            assert name_ours == name_theirs and torch.equal(a, b), name_ours
        torch.testing.assert_close(ours.accumulated, theirs.accumulated, rtol=0, atol=0)
        if seed == 2:
            assert bool((ours.acc_q == ours.pos_max).any()) and bool((ours.acc_q == ours.neg_min).any())
            functional.reset_net(theirs)
            functional.reset_net(ours)
            assert [v for _, v in ours.named_memories()] == [0.5, 0.0, 0.0]


@pytest.mark.parametrize(("name", "index", "step_mode", "backend"), cases("ActivationAwareIFNode",
                                                                          len(AAIF_CASES)))
def test_activation_aware_if_as_theirs(name: str, index: int, step_mode: str, backend: str) -> None:
    theirs, ours = build(name, index, step_mode, backend)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for seed in (1, 2, 3):  # two calls, a reset, a third
        x = sequence(seed, 4 if index == 4 else 3).requires_grad_(True)
        out_theirs, out_ours = run(theirs, x, step_mode), run(ours, x, step_mode)
        assert torch.equal(out_ours, out_theirs)
        torch.testing.assert_close(ours.v, theirs.v, rtol=1e-12, atol=1e-14)
        if step_mode == "m":
            torch.testing.assert_close(ours.v_seq, theirs.v_seq, rtol=1e-12, atol=1e-14)
        else:
            assert ours.v_seq is None and theirs.v_seq is None  # single steps do not record v_seq
        weights = torch.randn_like(out_ours)
        (grad_theirs,) = torch.autograd.grad((out_theirs * weights).sum() + (theirs.v ** 2).sum(), x)
        (grad_ours,) = torch.autograd.grad((out_ours * weights).sum() + (ours.v ** 2).sum(), x)
        torch.testing.assert_close(grad_ours, grad_theirs, rtol=1e-12, atol=1e-14)
        if seed == 2:
            functional.reset_net(theirs)
            functional.reset_net(ours)


def test_stbif_refuses_training_and_empty_sequences() -> None:
    theirs, ours = sj_neuron.STBIFNode(0.5, 4, step_mode="m"), our.STBIFNode(0.5, 4, step_mode="m")
    x = torch.randn(3, 2, requires_grad=True)
    with pytest.raises(RuntimeError):
        theirs(x)
    with pytest.raises(RuntimeError, match="STBIFNode: x requires grad"):
        ours(x)
    with pytest.raises(ValueError, match="x_seq: STBIFNode does not take an empty sequence"):
        ours(torch.zeros(0, 2))
    ours.q_threshold.requires_grad_(True)
    with pytest.raises(RuntimeError, match="q_threshold requires grad"):
        ours(x.detach())
    with pytest.raises(RuntimeError, match="before forward"):
        _ = our.STBIFNode(0.5, 4).accumulated


@pytest.mark.parametrize(("args", "kwargs", "name"), [
    ((0.5, 1), {}, "level"), ((0.5, True), {}, "level"), ((0.5, "4"), {}, "level"),
    ((torch.ones(2), 4), {}, "q_threshold"), ((0.0, 4), {}, "q_threshold"), ((0.5, 4), {"pos_max": "2"}, "pos_max"),
    ((0.5, 4), {"neg_min": float("nan")}, "neg_min"),
])
def test_stbif_checks_name_the_argument(args: tuple, kwargs: dict, name: str) -> None:
    with pytest.raises(ValueError, match=f"^{name}:"):
        our.STBIFNode(*args, **kwargs)


def test_stbif_from_a_quantizer() -> None:
    quantizer = torch.nn.Module()
    quantizer.s, quantizer.sym = torch.tensor(0.25), True
    quantizer.pos_max, quantizer.neg_min = torch.tensor(3.0), torch.tensor(-4.0)
    theirs, ours = sj_neuron.STBIFNode.from_quantizer(quantizer), our.STBIFNode.from_quantizer(quantizer)
    assert ours.level == theirs.level == 8
    for name in ("q_threshold", "pos_max", "neg_min"):
        assert torch.equal(getattr(ours, name), getattr(theirs, name))


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"step_mode": "x"}, "^step_mode:"), ({"v_reset": 0}, "^v_reset:"), ({"detach_reset": 1}, "^detach_reset:"),
    ({"store_v_seq": None}, "^store_v_seq:"), ({"channel_dim": 1.0}, "^channel_dim:"),
    ({"v_threshold": torch.ones(2, 2)}, "^v_threshold:"), ({"v_threshold": torch.tensor([1.0, -1.0])}, "^v_threshold:"),
    ({"v_offset": float("inf")}, "^v_offset:"),
])
def test_activation_aware_if_checks_name_the_argument(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError):
        sj_neuron.ActivationAwareIFNode(**kwargs)
    with pytest.raises(ValueError, match=message):
        our.ActivationAwareIFNode(**kwargs)


def test_activation_aware_if_per_channel_lengths_are_checked_at_the_call() -> None:
    ours = our.ActivationAwareIFNode(**PER_CHANNEL)
    with pytest.raises(ValueError, match="v_threshold has length 3, but input shape .* has 5 channels"):
        ours(torch.zeros(2, 5))
    ours.channel_dim = 4
    with pytest.raises(ValueError, match="channel_dim=4 is out of range"):
        ours(torch.zeros(2, 3))
    assert ours.v_threshold.shape == (3,)  # the buffers are the layer's own again after a refused call
