"""SpikingJelly 2.0's `GatedLIFNode` (`autocuda.nn.GatedLIFNode`: the input gate in torch, the recurrence the
`gated_lif` spec) against SpikingJelly's own class in float64 on the CPU, on the reference and on the generated
kernels (host runner, one case): the same parameters under one numpy seed, equal spikes, membranes and gradients
(the input and all eight parameters) over two calls; its checks."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from backends import NEEDS_HOST
from conftest import compile_launched

import autocuda.nn as our
from autocuda.toolchain.host import cxx as toolchain

sj_lif_variants = pytest.importorskip("spikingjelly.activation_based.neuron.lif_variants",
                                      reason="SpikingJelly 2.0 is a test extra")
from spikingjelly.activation_based import base, functional  # noqa: E402
from spikingjelly.activation_based import surrogate as sj_surrogate  # noqa: E402

F64 = torch.float64
CASES = [
    ({"T": 4}, "reference"),
    ({"T": 4, "inplane": 3, "init_tau": 0.5, "init_conduct": 0.25}, "reference"),
    pytest.param({"T": 4, "inplane": 3, "surrogate_function": "ATan"}, "host", marks=NEEDS_HOST),
]


def pair(kwargs: dict, backend: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    theirs_kwargs, ours_kwargs = dict(kwargs), dict(kwargs)
    if kwargs.get("surrogate_function") == "ATan":
        theirs_kwargs["surrogate_function"] = ours_kwargs["surrogate_function"] = sj_surrogate.ATan()
    np.random.seed(0)
    theirs = sj_lif_variants.GatedLIFNode(**theirs_kwargs).to(F64)
    np.random.seed(0)
    ours = our.GatedLIFNode(backend=backend, **ours_kwargs).to(F64)
    return theirs, ours


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels() -> int:
    """The host kernels of the host case, compiled up front in one compiler run (`conftest.compile_launched`)."""
    if toolchain.missing() is not None:
        return 0

    def calls() -> None:
        _, ours = pair(CASES[2].values[0], "host")
        x = torch.randn(4, 2, 3, 2, 2, dtype=F64, requires_grad=True)
        (ours(x).sum() + (ours.v ** 2).sum()).backward()

    return compile_launched(calls)


@pytest.mark.parametrize(("kwargs", "backend"), CASES)
def test_gated_lif_as_theirs(kwargs: dict, backend: str) -> None:
    theirs, ours = pair(kwargs, backend)
    assert list(ours.state_dict()) == list(theirs.state_dict())
    for (name, a), (_, b) in zip(theirs.state_dict().items(), ours.state_dict().items()):
        assert torch.equal(a, b), name
    for seed in (1, 2):  # the membrane carries over to the second call, the previous spike does not
        generator = torch.Generator().manual_seed(seed)
        x = (torch.randn(4, 2, 3, 2, 2, generator=generator, dtype=F64) + 0.8).requires_grad_(True)
        out_theirs, out_ours = theirs(x), ours(x)
        assert torch.equal(out_ours, out_theirs) and 0 < int(out_ours.sum()) < out_ours.numel()
        torch.testing.assert_close(ours.v, theirs.v, rtol=1e-12, atol=1e-12)
        weights = torch.linspace(-1.0, 1.0, out_ours.numel(), dtype=F64).view_as(out_ours)
        grads = [torch.autograd.grad((out * weights).sum() + (layer.v ** 2).sum(), [x, *layer.parameters()])
                 for out, layer in ((out_theirs, theirs), (out_ours, ours))]
        for a, b in zip(*grads):
            torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)
        functional.detach_net(theirs)
        functional.detach_net(ours)
    functional.reset_net(ours)
    assert [name for name, _ in ours.named_memories()] == ["v", "s_prev"] and ours.v == 0.0
    assert isinstance(ours, base.MemoryModule)


def test_a_call_takes_t_steps_of_its_channels() -> None:
    ours = our.GatedLIFNode(T=3, inplane=2)
    with pytest.raises(ValueError, match=r"x_seq: GatedLIFNode\(T=3\) expects a tensor \[T, N, ...\] of 3 steps"):
        ours(torch.zeros(4, 1, 2))
    with pytest.raises(ValueError, match=r"GatedLIFNode\(inplane=2\) expects \[T, N, 2, ...\]"):
        ours(torch.zeros(3, 1, 5))
    with pytest.raises(ValueError, match="multi-step mode only"):
        ours.single_step_forward(torch.zeros(1, 2))
    assert ours(torch.zeros(3, 1, 2)).shape == (3, 1, 2)  # [T, N, C]: the channels along dimension 1 of a step


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"T": 2.0}, "^T:"), ({"T": 2, "inplane": 2.0}, "^inplane:"), ({"T": 2, "init_tau": 1.0}, "^init_tau:"),
    ({"T": 2, "init_linear_decay": 1.5}, "^init_linear_decay:"),
    ({"T": 2, "init_v_subreset": 1.0}, "^init_v_subreset:"), ({"T": 2, "step_mode": "s"}, "^step_mode:"),
])
def test_checks_name_the_argument(kwargs: dict, message: str) -> None:
    with pytest.raises(AssertionError):
        sj_lif_variants.GatedLIFNode(**kwargs)
    with pytest.raises(ValueError, match=message):
        our.GatedLIFNode(**kwargs)
    # what SpikingJelly takes and fails on later: no channels, a gate of 0 (whose logit is infinite)
    with pytest.raises(ValueError, match="^inplane:"):
        our.GatedLIFNode(2, inplane=0)
    with pytest.raises(ValueError, match="^init_tau:"):
        our.GatedLIFNode(2, init_tau=0.0)
