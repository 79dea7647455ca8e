"""The parallel spiking neurons (`autocuda.nn.PSN`, `MaskedPSN`, `SlidingPSN`) against SpikingJelly 2.0's classes in
float64, their parameters copied into ours: spikes and the gradients of the inputs and of every learnable parameter
for each constructor option, input shapes ([T], [T, N], [T, B, C, H, W], a batch of one, T = 1, non-contiguous), both
step modes, the composition ("reference": torch's `addmm` and the surrogate, the CPU's default) and the mixing
kernels on the host runner ("host"), SpikingJelly's surrogates, a lambda_ schedule, the queue of single steps and
its reset, state dicts both ways, copies, attributes set after building, lower dtypes within their rounding.

Faults found here (each test fails on the code before its fix):
- MaskedPSN keeps its eased mask between calls keyed by its buffers' version counters: a deep copy or a pickle
  took the kept mask along while the copy's buffers restart their counters, so a copy whose counters met the kept
  ones again (a layer loaded by `load_state_dict`, called, then given a new lambda_, then copied) mixed with the
  old lambda_'s mask, silently;
- a MaskedPSN called first under `torch.inference_mode()` kept an inference tensor as its mask, and every later
  training call failed ("Inference tensors cannot be saved for backward"), where SpikingJelly's trains;
- a SlidingPSN whose `weight` was replaced by one of another length (k is fixed at construction) ran a multi-step
  call with the new length and failed a single step inside torch's broadcasting: now refused by name in both.
"""
from __future__ import annotations

import copy
import io
import pickle
from collections.abc import Callable
from typing import Any

import pytest
import torch
from conftest import profile

import autocuda.nn as our
from autocuda.call import mixing
from autocuda.spec.surrogate import ATan, Sigmoid

sj_psn = pytest.importorskip("spikingjelly.activation_based.neuron.psn", reason="SpikingJelly 2.0 is a test extra")
from spikingjelly.activation_based import functional  # noqa: E402
from spikingjelly.activation_based import surrogate as sj_surrogate  # noqa: E402

F64 = torch.float64
SLOW = pytest.mark.skipif(profile() != "slow", reason="a wide sweep: --slow")


def host_missing() -> str | None:
    from autocuda.toolchain.host import cxx

    return cxx.missing()


@pytest.fixture(params=["reference", "host"])
def backend(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The layers' multi-step calls by torch's composition (the CPU's default) or by the mixing kernels on the host
    runner (as on a GPU, where they run by default)."""
    if request.param == "host":
        if host_missing() is not None:
            pytest.skip(f"no host compiler: {host_missing()}")
        fire = mixing.fire
        monkeypatch.setattr(mixing, "fire", lambda x, w, b, s, backend=None: fire(x, w, b, s, backend="host"))
    return str(request.param)


def pair(name: str, *args: Any, seed: int = 0, **kwargs: Any) -> tuple[torch.nn.Module, torch.nn.Module]:
    """SpikingJelly's layer (built under `seed`) and ours with its parameters and buffers loaded, both float64."""
    torch.manual_seed(seed)
    theirs = getattr(sj_psn, name)(*args, **kwargs).to(F64)
    torch.manual_seed(seed + 1)  # other initial values: the state dict must carry them all
    ours = getattr(our, name)(*args, **kwargs).to(F64)
    ours.load_state_dict(theirs.state_dict())
    return theirs, ours


def sequence(*shape: int, seed: int = 1, contiguous: bool = True) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    if contiguous:
        x = torch.randn(*shape, generator=generator, dtype=F64) * 1.5
    else:  # the same shape, its dimensions' strides reversed
        x = (torch.randn(*reversed(shape), generator=generator, dtype=F64) * 1.5).permute(
            *reversed(range(len(shape))))
    return x.requires_grad_(True)


def check_same(theirs: torch.nn.Module, ours: torch.nn.Module, calls: list[torch.Tensor],
               inputs: list[torch.Tensor] | None = None, spiking: bool = True) -> None:
    """The calls' outputs equal (to rounding where not `spiking`), and the gradients of a weighted sum of them by the
    `inputs` (default: the calls') and every parameter of each layer to 1e-12."""
    outs_theirs = [theirs(x) for x in calls]
    outs_ours = [ours(x) for x in calls]
    for a, b in zip(outs_theirs, outs_ours):
        assert a.shape == b.shape and a.dtype == b.dtype
        if spiking:
            assert torch.equal(a, b)
        else:
            torch.testing.assert_close(b, a, rtol=1e-14, atol=1e-15)
    generator = torch.Generator().manual_seed(7)
    weights = [torch.randn(a.shape, generator=generator, dtype=a.dtype) for a in outs_theirs]
    loss_theirs = sum((a * w).sum() for a, w in zip(outs_theirs, weights))
    loss_ours = sum((b * w).sum() for b, w in zip(outs_ours, weights))
    leaves = [x for x in (calls if inputs is None else inputs) if x.requires_grad]
    names = [n for n, p in theirs.named_parameters() if p.requires_grad]
    assert names == [n for n, p in ours.named_parameters() if p.requires_grad]
    params_theirs = dict(theirs.named_parameters())
    params_ours = dict(ours.named_parameters())
    got_theirs = torch.autograd.grad(loss_theirs, [*leaves, *(params_theirs[n] for n in names)])
    got_ours = torch.autograd.grad(loss_ours, [*leaves, *(params_ours[n] for n in names)])
    for what, a, b in zip([f"input {i}" for i in range(len(leaves))] + names, got_theirs, got_ours):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-13, msg=lambda m, what=what: f"grad of {what}: {m}")


SHAPES = {"[T, N]": (5,), "[T, B, C, H, W]": (2, 3, 2, 2), "batch of one": (1,), "[T]": ()}


# -- every option, shape and backend --------------------------------------------------------------------------------
@pytest.mark.parametrize("T", [1, 4])
@pytest.mark.parametrize("shape", list(SHAPES), ids=list(SHAPES))
def test_psn(T: int, shape: str, backend: str) -> None:
    theirs, ours = pair("PSN", T)
    x = sequence(T, *SHAPES[shape])
    if shape == "[T]":  # SpikingJelly's `flatten(1)` refuses a [T] sequence; ours takes it as one neuron
        check_same(theirs, ours, [x.unsqueeze(1)])
        assert torch.equal(ours(x), ours(x.unsqueeze(1)).squeeze(1))
        return
    check_same(theirs, ours, [x, sequence(T, *SHAPES[shape], seed=2, contiguous=False)])


@pytest.mark.parametrize(("k", "T", "lambda_init"), [(1, 4, 0.0), (2, 4, 0.35), (3, 4, 1.0), (6, 4, 0.6),
                                                     (2, 1, 0.5), (2, 5, 2.5), (2, 4, -0.5)])
def test_masked_psn_multi_step(k: int, T: int, lambda_init: float, backend: str) -> None:
    theirs, ours = pair("MaskedPSN", k, T, lambda_init=lambda_init, step_mode="m")
    check_same(theirs, ours, [sequence(T, 2, 3), sequence(T, 1, seed=2, contiguous=False)])


@pytest.mark.parametrize(("k", "exp_init"), [(1, True), (3, True), (3, False), (5, False)])
@pytest.mark.parametrize("T", [1, 3, 7])
def test_sliding_psn_multi_step_any_t(k: int, exp_init: bool, T: int, backend: str) -> None:
    """One layer, several sequence lengths (shorter and longer than k), each its own banded matrix."""
    theirs, ours = pair("SlidingPSN", k, exp_init=exp_init, step_mode="m")
    check_same(theirs, ours, [sequence(T, 2, 3), sequence(T, 4, seed=2, contiguous=False), sequence(T + 1, 3)])


def test_every_spikingjelly_surrogate(backend: str) -> None:
    """SpikingJelly's surrogates with values other than their defaults, on ours: the kernels take them as their own
    (`mixing.spiking_surrogate`) with the same gradient; the composition calls them."""
    made = [sj_surrogate.ATan(alpha=3.0), sj_surrogate.Sigmoid(alpha=2.5),
            sj_surrogate.PiecewiseLeakyReLU(w=0.7, c=0.02)]
    if profile() == "slow":
        made += [sj_surrogate.PiecewiseQuadratic(alpha=1.5), sj_surrogate.PiecewiseExp(alpha=1.5),
                 sj_surrogate.SoftSign(alpha=3.0), sj_surrogate.SuperSpike(alpha=1.5),
                 sj_surrogate.NonzeroSignLogAbs(alpha=1.5), sj_surrogate.Erf(alpha=3.0),
                 sj_surrogate.S2NN(alpha=3.0, beta=1.5), sj_surrogate.QPseudoSpike(alpha=3.0),
                 sj_surrogate.LeakyKReLU(leak=0.1, k=1.5), sj_surrogate.FakeNumericalGradient(alpha=0.4),
                 sj_surrogate.LogTailedReLU(alpha=0.1), sj_surrogate.Rect(alpha=0.8),
                 sj_surrogate.SquarewaveFourierSeries(n=3, T_period=7.0), sj_surrogate.DeterministicPass()]
    for surrogate in made:
        theirs, ours = pair("PSN", 4)
        theirs.surrogate_function = ours.surrogate_function = surrogate
        check_same(theirs, ours, [sequence(4, 3, 5)])


def test_frozen_parameters_and_an_input_without_gradient(backend: str) -> None:
    """Gradients of the parameters alone, of x alone, of the weights alone: each as SpikingJelly's."""
    for frozen in ("weight", "bias", "both"):
        theirs, ours = pair("MaskedPSN", 2, 4, lambda_init=0.5, step_mode="m")
        for layer in (theirs, ours):
            for name in ("weight", "bias") if frozen == "both" else (frozen,):
                getattr(layer, name).requires_grad_(False)
        check_same(theirs, ours, [sequence(4, 3, 2)])
    theirs, ours = pair("SlidingPSN", 3, step_mode="m")
    check_same(theirs, ours, [sequence(5, 3).detach()])


# -- single steps, the queue, the lambda_ schedule ---------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 2, 4])
def test_sliding_psn_single_steps_keep_k_inputs_until_reset(k: int) -> None:
    theirs, ours = pair("SlidingPSN", k, exp_init=False)
    x = sequence(6, 2, 3)
    steps = [x[t] for t in range(4)] + [x[4].transpose(0, 1).contiguous().transpose(0, 1)]
    check_same(theirs, ours, steps, inputs=[x])
    assert len(ours.queue) == len(theirs.queue) == min(k, 5)
    assert all(torch.equal(a, b) for a, b in zip(ours.queue, theirs.queue))
    ours.reset()
    theirs.reset()
    assert ours.queue == theirs.queue == []
    check_same(theirs, ours, [x[5], x[0]], inputs=[x])  # the first steps again: the earlier inputs forgotten
    theirs.step_mode = ours.step_mode = "m"  # a multi-step call neither reads nor changes the queue
    check_same(theirs, ours, [sequence(3, 2, 3, seed=4)])
    assert len(ours.queue) == len(theirs.queue) == min(k, 2)


def test_masked_psn_lambda_schedule_over_training_then_single_steps(backend: str) -> None:
    """lambda_ eased from 0 to past 1 between training steps (an optimizer stepping the weights between calls), then
    single steps once it is >= 1, then a multi-step call again, each as SpikingJelly's."""
    theirs, ours = pair("MaskedPSN", 2, 4, lambda_init=0.0, step_mode="m")
    optimizers = [torch.optim.SGD(layer.parameters(), lr=0.5) for layer in (theirs, ours)]
    for i, value in enumerate([0.0, 0.25, 0.5, 1.0, 1.5]):
        theirs.lambda_ = ours.lambda_ = value
        x = sequence(4, 3, 2, seed=i)
        for layer, optimizer in zip((theirs, ours), optimizers):
            optimizer.zero_grad()
            (layer(x) * torch.linspace(-1, 1, 6, dtype=F64).view(3, 2)).sum().backward()
            optimizer.step()
        torch.testing.assert_close(ours.weight, theirs.weight, rtol=1e-12, atol=1e-13)
        torch.testing.assert_close(ours.bias, theirs.bias, rtol=1e-12, atol=1e-13)
    torch.testing.assert_close(ours.masked_weight(), theirs.masked_weight(), rtol=1e-12, atol=1e-13)
    theirs.step_mode = ours.step_mode = "s"
    x = sequence(4, 3)
    check_same(theirs, ours, [x[0], x[1]], inputs=[x])
    theirs.lambda_ = ours.lambda_ = 0.5  # single steps refused again mid-sequence
    with pytest.raises(ValueError, match="lambda_ >= 1"):
        ours(x[2])
    theirs.lambda_ = ours.lambda_ = 1.0
    check_same(theirs, ours, [x[2], x[3]], inputs=[x])
    assert ours.time_step == theirs.time_step == 4
    functional.reset_net(ours)
    functional.reset_net(theirs)
    theirs.step_mode = ours.step_mode = "m"
    check_same(theirs, ours, [sequence(4, 3, seed=9)])


# -- state dicts, copies, attributes -----------------------------------------------------------------------------
LAYERS: dict[str, Callable[[Any], torch.nn.Module]] = {
    "PSN": lambda m: m.PSN(4), "MaskedPSN": lambda m: m.MaskedPSN(2, 4, lambda_init=0.3, step_mode="m"),
    "SlidingPSN": lambda m: m.SlidingPSN(3, exp_init=False, step_mode="m")}


@pytest.mark.parametrize("name", list(LAYERS))
def test_state_dicts_both_ways(name: str) -> None:
    """The same keys, shapes and dtypes; SpikingJelly's state dict loads into ours (strict) and ours into theirs."""
    torch.manual_seed(0)
    theirs = LAYERS[name](sj_psn).to(F64)
    torch.manual_seed(3)
    ours = LAYERS[name](our).to(F64)
    with torch.no_grad():
        for p in ours.parameters():
            p.add_(0.25)
    if name == "MaskedPSN":
        ours.lambda_ = 0.8
    state = ours.state_dict()
    assert {k: (v.shape, v.dtype) for k, v in state.items()} == \
        {k: (v.shape, v.dtype) for k, v in theirs.state_dict().items()}
    theirs.load_state_dict(state)
    check_same(theirs, ours, [sequence(4, 2, 3)])
    fresh = LAYERS[name](our).to(F64)
    fresh.load_state_dict(theirs.state_dict())
    check_same(theirs, fresh, [sequence(4, 2, 3, seed=5)])


@pytest.mark.parametrize("how", ["deepcopy", "pickle", "torch.save"])
def test_a_copy_of_a_masked_psn_mixes_with_its_own_lambda(how: str) -> None:
    """FAULT: the eased mask kept between calls travelled into the copy, keyed by version counters that the copy's
    buffers restart: here the loaded buffers are at 1 each when the mask is kept, lambda_ then changes (2), and
    the copy's buffers are at 1 again, so the copy mixed with the old lambda_'s mask."""
    theirs, ours = pair("MaskedPSN", 2, 4, lambda_init=0.0, step_mode="m")
    x = sequence(4, 3)
    check_same(theirs, ours, [x])
    theirs.lambda_ = ours.lambda_ = 0.9
    copied: Any
    if how == "deepcopy":
        copied = copy.deepcopy(ours)
    elif how == "pickle":
        copied = pickle.loads(pickle.dumps(ours))
    else:
        buffer = io.BytesIO()
        torch.save(ours, buffer)
        buffer.seek(0)
        copied = torch.load(buffer, weights_only=False)
    torch.testing.assert_close(copied.masked_weight(), theirs.masked_weight(), rtol=0, atol=1e-15)
    check_same(theirs, copied, [x])
    copied.lambda_ = theirs.lambda_ = 0.2  # and the copy's own changes after
    check_same(theirs, copied, [x])


def test_a_masked_psn_called_under_inference_mode_then_trains() -> None:
    """FAULT: a first call under torch.inference_mode kept its eased mask as an inference tensor, which the next
    training call's product saves for backward: 'Inference tensors cannot be saved for backward'."""
    theirs, ours = pair("MaskedPSN", 2, 4, lambda_init=0.4, step_mode="m")
    x = sequence(4, 3)
    with torch.inference_mode():
        assert torch.equal(ours(x.detach()), theirs(x.detach()))
    check_same(theirs, ours, [x])
    with torch.inference_mode():  # and a mask kept from training serves inference
        assert torch.equal(ours(x.detach()), theirs(x.detach()))


def test_a_sliding_psn_weight_of_another_length_is_refused_by_name() -> None:
    """FAULT: k is fixed at construction (the queue and the band follow it), but a `weight` of another length ran a
    multi-step call as a window of its length and failed a single step inside torch's broadcasting."""
    layer = our.SlidingPSN(3, step_mode="m")
    layer.weight = torch.nn.Parameter(torch.ones(5))
    with pytest.raises(ValueError, match=r"^SlidingPSN: weight: expected shape \(3,\) \(k = 3"):
        layer(torch.zeros(6, 2))
    layer.step_mode = "s"
    with pytest.raises(ValueError, match=r"^SlidingPSN: weight: expected shape \(3,\)"):
        layer(torch.zeros(2))
    layer.weight = torch.nn.Parameter(torch.full((3,), 0.5))  # one of the same length takes effect
    assert torch.equal(layer(torch.ones(2)), torch.zeros(2)) and torch.equal(layer(torch.ones(2)), torch.ones(2))


def test_attributes_set_after_building_take_effect() -> None:
    """A replaced weight or bias (same shapes), a mask changed in place, a new surrogate and step mode: read at the
    next call, as SpikingJelly's; T and k refused by name (tests/test_psn.py)."""
    theirs, ours = pair("SlidingPSN", 2, step_mode="m")
    for layer in (theirs, ours):
        layer.weight = torch.nn.Parameter(torch.tensor([0.3, -0.7], dtype=F64))
        layer.bias = torch.nn.Parameter(torch.tensor(0.2, dtype=F64))
        layer.surrogate_function = sj_surrogate.Sigmoid(alpha=3.0)
    check_same(theirs, ours, [sequence(4, 3)])
    theirs, ours = pair("PSN", 3)
    for layer in (theirs, ours):
        layer.weight = torch.nn.Parameter(torch.eye(3, dtype=F64))
        layer.surrogate_function = sj_surrogate.ATan(alpha=1.0)
    check_same(theirs, ours, [sequence(3, 4)])
    ours.surrogate_function = ATan(alpha=1.0)  # ours, the same function
    check_same(theirs, ours, [sequence(3, 4)])
    theirs, ours = pair("MaskedPSN", 3, 4, lambda_init=0.5, step_mode="m")
    check_same(theirs, ours, [sequence(4, 3)])
    for layer in (theirs, ours):
        layer.mask0.zero_()
        layer.mask0.fill_diagonal_(1.0)
    check_same(theirs, ours, [sequence(4, 3)])
    for layer in (theirs, ours):
        layer.surrogate_function = sj_surrogate.Sigmoid(alpha=2.0, spiking=False)
    check_same(theirs, ours, [sequence(4, 3)], spiking=False)


# -- errors, dtypes ----------------------------------------------------------------------------------------------
def test_a_sequence_of_another_t_is_refused_by_name() -> None:
    """SpikingJelly's PSN fails inside addmm, its MaskedPSN on a bare assert; ours name T. SlidingPSN takes any T."""
    with pytest.raises(ValueError, match=r"^PSN: x_seq: expected shape \[T, \*\] with T = 4, got \(3, 2\)"):
        our.PSN(4)(torch.zeros(3, 2))
    with pytest.raises(ValueError, match=r"^MaskedPSN: x_seq: expected shape \[T, \*\] with T = 4, got \(5, 2\)"):
        our.MaskedPSN(2, 4, step_mode="m")(torch.zeros(5, 2))
    assert our.SlidingPSN(2, step_mode="m")(torch.zeros(0, 2)).shape == (0, 2)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", list(LAYERS))
def test_lower_dtypes_within_their_rounding(name: str, dtype: torch.dtype, backend: str) -> None:
    """Layers and inputs in float32 or bfloat16 against SpikingJelly's in the same dtype: the same spikes except
    where H lies within the dtype's rounding of the threshold (the kernels compute H in float32 for bfloat16, where
    SpikingJelly's addmm rounds it to bfloat16: docs/spikingjelly.md); gradients as close to the float64 ones (the
    same rounded values, SpikingJelly's layer) as SpikingJelly's own in that dtype, to the dtype's tolerance (sums
    with cancellation, such as SlidingPSN's one bias, are where the dtypes' orders of summation show)."""
    torch.manual_seed(0)
    theirs = LAYERS[name](sj_psn).to(dtype)
    ours = LAYERS[name](our).to(dtype)
    ours.load_state_dict(theirs.state_dict())
    exact = copy.deepcopy(theirs).to(F64)
    x = sequence(4, 64, 8).to(dtype).detach().requires_grad_()
    x64 = x.detach().to(F64).requires_grad_()
    a, b = theirs(x), ours(x)
    assert a.dtype == b.dtype == dtype
    assert (a != b).float().mean() <= (0.0 if dtype == torch.float32 else 0.01)
    w = torch.randn(a.shape, generator=torch.Generator().manual_seed(3)).to(dtype)
    grads_a = torch.autograd.grad((a * w).sum(), (x, *theirs.parameters()))
    grads_b = torch.autograd.grad((b * w).sum(), (x, *ours.parameters()))
    grads_64 = torch.autograd.grad((exact(x64) * w.to(F64)).sum(), (x64, *exact.parameters()))
    tolerance = 1e-5 if dtype == torch.float32 else 2e-2
    for ga, gb, g64 in zip(grads_a, grads_b, grads_64):
        assert gb.dtype == ga.dtype
        theirs_off, ours_off = (float((g.double() - g64).norm()) for g in (ga, gb))
        assert ours_off <= 2 * theirs_off + tolerance * float(g64.norm()) + 1e-6


# -- the wide sweep ----------------------------------------------------------------------------------------------
@SLOW
@pytest.mark.parametrize("T", [1, 2, 5, 9])
def test_wide_sweep(T: int, backend: str) -> None:
    for shape in [(3,), (1,), (2, 3, 2, 2), (1, 1)]:
        for contiguous in (True, False):
            calls = [sequence(T, *shape, contiguous=contiguous)]
            check_same(*pair("PSN", T), calls)
            for k in (1, 2, T + 1):
                for lambda_init in (0.0, 0.3, 1.0, 1.7):
                    check_same(*pair("MaskedPSN", k, T, lambda_init=lambda_init, step_mode="m"), calls)
                for exp_init in (True, False):
                    check_same(*pair("SlidingPSN", k, exp_init=exp_init, step_mode="m"), calls)
                    theirs, ours = pair("SlidingPSN", k, exp_init=exp_init)
                    check_same(theirs, ours, [calls[0][t] for t in range(T)], inputs=calls)
                theirs, ours = pair("MaskedPSN", k, T, lambda_init=1.0)
                check_same(theirs, ours, [calls[0][t] for t in range(T)], inputs=calls)
    for surrogate in (Sigmoid(alpha=2.5), ATan(alpha=3.0)):
        theirs, ours = pair("PSN", T)
        theirs.surrogate_function = sj_surrogate.Sigmoid(alpha=2.5) if surrogate.name == "Sigmoid" \
            else sj_surrogate.ATan(alpha=3.0)
        ours.surrogate_function = surrogate
        check_same(theirs, ours, [sequence(T, 3, 4)])
