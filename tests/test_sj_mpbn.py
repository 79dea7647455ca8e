"""SpikingJelly 2.0's membrane-potential BatchNorm neurons (`autocuda.nn.MPBNLIFNode`, `MPBNBaseNode`) against
SpikingJelly's own classes in float64 on the CPU: from the same state dict, equal spikes, membranes, BatchNorm
statistics and gradients (the input and every parameter) in both step modes, in training and in eval, before and
after folding the BatchNorm into the threshold (with test-time re-estimation and residual normalisation)."""
from __future__ import annotations

import copy

import pytest
import torch

import autocuda.nn as our

sj_mpbn = pytest.importorskip("spikingjelly.activation_based.neuron.mpbn", reason="SpikingJelly 2.0 is a test extra")
from spikingjelly.activation_based import base, functional  # noqa: E402

F64 = torch.float64
CASES = [
    {"out_channels": 3},
    {"out_features": 5, "learnable_vth": True, "v_reset": None},
    {"out_channels": 3, "decay_input": True, "store_v_seq": True, "detach_reset": True},
]


def pair(step_mode: str, **kwargs: object) -> tuple[torch.nn.Module, torch.nn.Module]:
    theirs = sj_mpbn.MPBNLIFNode(step_mode=step_mode, **kwargs).to(F64)
    ours = our.MPBNLIFNode(step_mode=step_mode, **kwargs).to(F64)
    with torch.no_grad():  # BatchNorm's affine parameters away from (1, 0), the learned threshold away from 0
        for p in theirs.parameters():
            p.copy_(torch.linspace(0.5, 1.5, p.numel(), dtype=F64).view_as(p))
    assert list(ours.state_dict()) == list(theirs.state_dict())
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def inputs(shape: tuple[int, ...], seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=generator, dtype=F64) + 0.5).requires_grad_(True)


def check_call(theirs: torch.nn.Module, ours: torch.nn.Module, x: torch.Tensor, step_mode: str) -> None:
    """One call: spikes, membrane, v_seq, every buffer and every gradient as SpikingJelly's; then detach_net."""
    outs = [layer(x) if step_mode == "m" else torch.stack([layer(step) for step in x]) for layer in (theirs, ours)]
    assert torch.equal(outs[0], outs[1])
    torch.testing.assert_close(ours.v, theirs.v, rtol=1e-12, atol=1e-12)
    if theirs.store_v_seq:
        torch.testing.assert_close(ours.v_seq, theirs.v_seq, rtol=1e-12, atol=1e-12)
    for (name, a), (_, b) in zip(theirs.state_dict().items(), ours.state_dict().items()):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12, msg=name)
    weights = torch.linspace(-1.0, 1.0, outs[0].numel(), dtype=F64).view_as(outs[0])
    grads = [torch.autograd.grad((out * weights).sum() + (layer.v ** 2).sum(), [x, *layer.parameters()])
             for out, layer in zip(outs, (theirs, ours))]
    for a, b in zip(*grads):
        torch.testing.assert_close(b, a, rtol=1e-10, atol=1e-12)
    functional.detach_net(theirs)
    functional.detach_net(ours)


@pytest.mark.parametrize("step_mode", ["s", "m"])
@pytest.mark.parametrize("kwargs", CASES)
def test_mpbn_lif_as_theirs(kwargs: dict, step_mode: str) -> None:
    theirs, ours = pair(step_mode, **kwargs)
    shape = (4, 6, 3, 2, 2) if "out_channels" in kwargs else (4, 6, 5)
    for seed, training in ((1, True), (2, True), (3, False)):
        theirs.train(training), ours.train(training)
        check_call(theirs, ours, inputs(shape, seed), step_mode)
    for normalize_residual, running_stats in ((False, False), (True, True)):
        folded_theirs, folded_ours = copy.deepcopy(theirs), copy.deepcopy(ours)
        for layer in (folded_theirs, folded_ours):
            layer.re_parameterize_v_threshold(normalize_residual, running_stats)
        assert list(folded_ours.state_dict()) == list(folded_theirs.state_dict()) == ["gamma", "beta", "mu", "sigma2"]
        for seed, training in ((4, True), (5, False), (6, True)):
            folded_theirs.train(training), folded_ours.train(training)
            check_call(folded_theirs, folded_ours, inputs(shape, seed), step_mode)
        assert folded_ours.bn_momentum == folded_theirs.bn_momentum
    functional.reset_net(ours)
    assert ours.v == 0.0 and isinstance(ours, base.MemoryModule) and isinstance(ours, our.BaseNode)


def test_without_mpbn_the_membrane_is_not_normalised() -> None:
    theirs, ours = pair("m", out_features=4, mpbn=False)
    assert isinstance(ours.vbn, torch.nn.Identity)
    check_call(theirs, ours, inputs((3, 2, 4), 7), "m")
    ours.re_parameterize_v_threshold()  # nothing to fold, as SpikingJelly's
    assert not ours.fold_bn


@pytest.mark.parametrize(("kwargs", "message"), [
    ({}, "^out_features, out_channels: specify exactly one"),
    ({"out_features": 3, "out_channels": 3}, "^out_features, out_channels: specify exactly one"),
    ({"out_features": 0}, "^out_features:"), ({"out_features": 3, "tau": 1.0}, "^tau:"),
    ({"out_features": 3, "v_threshold": "1"}, "^v_threshold:"), ({"out_features": 3, "v_reset": True}, "^v_reset:"),
    ({"out_features": 3, "detach_reset": 1}, "^detach_reset:"),
])
def test_checks_name_the_argument(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        our.MPBNLIFNode(**kwargs)
