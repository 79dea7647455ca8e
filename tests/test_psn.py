"""The parallel spiking neurons (`autocuda.nn.PSN`, `MaskedPSN`, `SlidingPSN`) against SpikingJelly 2.0's own
classes in float64 on the CPU: the same initial parameters under one seed, the same spikes, memories and gradients
(to the last bits of the surrogate's gradient formula) in both step modes, the same refusals."""
from __future__ import annotations

from typing import Any

import pytest
import torch

import autocuda.nn as our
from autocuda.spec.surrogate import ATan, Sigmoid

sj_psn = pytest.importorskip("spikingjelly.activation_based.neuron.psn", reason="SpikingJelly 2.0 is a test extra")
from spikingjelly.activation_based import base, functional  # noqa: E402
from spikingjelly.activation_based import surrogate as sj_surrogate  # noqa: E402

F64 = torch.float64


def pair(name: str, *args: Any, seed: int = 0, **kwargs: Any) -> tuple[torch.nn.Module, torch.nn.Module]:
    """SpikingJelly's layer and ours, each built after `torch.manual_seed(seed)`, in float64."""
    torch.manual_seed(seed)
    theirs = getattr(sj_psn, name)(*args, **kwargs).to(F64)
    torch.manual_seed(seed)
    ours = getattr(our, name)(*args, **kwargs).to(F64)
    return theirs, ours


def check_same(theirs: torch.nn.Module, ours: torch.nn.Module, calls: list[torch.Tensor], spiking: bool = True
               ) -> None:
    """The calls' spikes equal, and the gradients of a weighted sum of them by the inputs and every parameter. Not
    `spiking`, the outputs are a surrogate's primitive: torch's sigmoid (SpikingJelly's) and the formula ours
    evaluates round apart by an ulp on some CPUs (torch's AVX-512 kernels), so they agree to rounding."""
    outs_theirs = [theirs(x) for x in calls]
    outs_ours = [ours(x) for x in calls]
    for a, b in zip(outs_theirs, outs_ours):
        if spiking:
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(b, a, rtol=1e-14, atol=1e-15)
    weights = [torch.randn_like(a) for a in outs_theirs]
    loss_theirs = sum((a * w).sum() for a, w in zip(outs_theirs, weights))
    loss_ours = sum((b * w).sum() for b, w in zip(outs_ours, weights))
    wrt_theirs = [*calls, *theirs.parameters()]
    wrt_ours = [*calls, *ours.parameters()]
    for a, b in zip(torch.autograd.grad(loss_theirs, wrt_theirs), torch.autograd.grad(loss_ours, wrt_ours)):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-14)


def sequence(*shape: int, seed: int = 1) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=generator, dtype=F64) * 1.5).requires_grad_(True)


@pytest.mark.parametrize("T", [1, 4, 7])
def test_psn(T: int) -> None:
    theirs, ours = pair("PSN", T)
    assert torch.equal(theirs.weight, ours.weight) and torch.equal(theirs.bias, ours.bias)
    check_same(theirs, ours, [sequence(T, 3, 5)])
    with pytest.raises(ValueError, match="T = 4"):
        our.PSN(4)(torch.zeros(3, 2))
    with pytest.raises(ValueError, match="multi-step mode only"):
        ours.step_mode = "s"


@pytest.mark.parametrize("lambda_init", [0.0, 0.4, 1.0])
def test_masked_psn_multi_step(lambda_init: float) -> None:
    theirs, ours = pair("MaskedPSN", 2, 5, lambda_init=lambda_init, step_mode="m")
    check_same(theirs, ours, [sequence(5, 2, 3), sequence(5, 2, 3, seed=2)])
    with pytest.raises(ValueError, match="T = 5"):
        ours(torch.zeros(4, 2))


def test_a_changed_lambda_or_mask_takes_effect_at_the_next_call() -> None:
    """The eased mask is kept between calls: a new lambda_ (its setter fills the buffer in place), a mask changed in
    place and a mask replaced each take effect at the next call, as SpikingJelly reads them at every call."""
    theirs, ours = pair("MaskedPSN", 2, 4, lambda_init=0.3, step_mode="m")
    x = sequence(4, 3)
    check_same(theirs, ours, [x])
    theirs.lambda_, ours.lambda_ = 0.7, 0.7
    check_same(theirs, ours, [x])
    for layer in (theirs, ours):
        with torch.no_grad():
            layer.mask1[0, 3] = 0.0
    check_same(theirs, ours, [x])
    for layer in (theirs, ours):
        layer.mask0 = torch.ones(4, 4, dtype=F64)
    check_same(theirs, ours, [x])
    assert torch.equal(ours.masked_weight(), theirs.masked_weight())


def test_masked_psn_single_steps_keep_its_queue_and_refuse_the_step_after_t() -> None:
    theirs, ours = pair("MaskedPSN", 3, 4, lambda_init=0.2)
    x = sequence(4, 6)
    with pytest.raises(ValueError, match="lambda_ >= 1"):
        ours(x[0])
    theirs.lambda_, ours.lambda_ = 1.0, 1.0
    check_same(theirs, ours, [x[t] for t in range(4)])
    assert ours.time_step == theirs.time_step == 4
    with pytest.raises(OverflowError, match="T=4"):
        ours(x[0])
    with pytest.raises(OverflowError):
        theirs(x[0])
    assert len(ours.queue) == len(theirs.queue) == 3  # a refused step still entered the queue, as SpikingJelly's
    functional.reset_net(ours)
    functional.reset_net(theirs)
    assert ours.time_step == 0 and ours.queue == []
    assert torch.equal(ours(x[1]), theirs(x[1]))  # after a reset, the first step again


@pytest.mark.parametrize(("k", "exp_init"), [(1, True), (3, True), (3, False), (6, False)])
def test_sliding_psn_both_step_modes(k: int, exp_init: bool) -> None:
    theirs, ours = pair("SlidingPSN", k, exp_init=exp_init, step_mode="m")
    assert torch.equal(theirs.weight, ours.weight)
    check_same(theirs, ours, [sequence(5, 2, 3)])
    theirs.step_mode, ours.step_mode = "s", "s"
    x = sequence(5, 4)
    check_same(theirs, ours, [x[t] for t in range(5)])
    assert len(ours.queue) == len(theirs.queue) == min(k, 5)


@pytest.mark.parametrize("surrogate", ["ours", "theirs", "not spiking"])
def test_the_surrogate_is_read_at_every_call(surrogate: str) -> None:
    """A surrogate set after the first call takes effect at the next (ours, or SpikingJelly's object on ours)."""
    theirs_new = {"ours": lambda: sj_surrogate.ATan(alpha=3.0), "theirs": lambda: sj_surrogate.Sigmoid(alpha=2.0),
                  "not spiking": lambda: sj_surrogate.Sigmoid(alpha=2.0, spiking=False)}[surrogate]
    ours_new = {"ours": lambda: ATan(alpha=3.0), "theirs": theirs_new,
                "not spiking": lambda: Sigmoid(alpha=2.0, spiking=False)}[surrogate]
    theirs, ours = pair("SlidingPSN", 2, step_mode="m")
    x = sequence(3, 4)
    check_same(theirs, ours, [x])
    theirs.surrogate_function, ours.surrogate_function = theirs_new(), ours_new()
    check_same(theirs, ours, [x], spiking=surrogate != "not spiking")


def test_the_memory_protocol() -> None:
    ours = our.SlidingPSN(2)
    assert isinstance(ours, base.MemoryModule)
    x = sequence(3, 4).float()
    ours(x[0])
    assert [len(m) for m in base.extract_memories(ours)] == [1]
    functional.reset_net(ours)
    assert base.extract_memories(ours) == [[]]
    ours.to(F64)
    assert ours(x[0].double()).dtype == F64
    with pytest.raises(ValueError, match="step_mode"):
        ours.step_mode = "x"
    with pytest.raises(ValueError, match="k: expected a whole number"):
        our.MaskedPSN(0, 4)
    for layer, name in ((ours, "k"), (our.MaskedPSN(2, 4), "T"), (our.PSN(3), "T")):
        with pytest.raises(AttributeError, match=f"{name} is fixed at construction"):
            setattr(layer, name, 5)  # the weights' shapes follow it: a new value would be silently wrong


def test_arguments_of_the_wrong_kind_are_refused_by_name() -> None:
    """An integer sequence failed inside torch's matmul, a word for lambda_ inside torch.fill_; a NaN lambda_init
    made every output NaN, and a word for exp_init (true) chose the exponential weights."""
    with pytest.raises(TypeError, match=r"^PSN: x_seq: expected a floating dtype, got torch.int64"):
        our.PSN(4)(torch.ones(4, 3, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"^lambda_init: expected a finite number, got nan"):
        our.MaskedPSN(2, 4, lambda_init=float("nan"))
    layer = our.MaskedPSN(2, 4)
    with pytest.raises(TypeError, match=r"^lambda_: expected a number, got 'x'"):
        layer.lambda_ = "x"
    layer.lambda_ = torch.tensor(0.5)
    assert float(layer.lambda_) == 0.5
    with pytest.raises(TypeError, match=r"^exp_init: expected True or False, got 'no'"):
        our.SlidingPSN(2, exp_init="no")
