"""Encoders' semantics at and beyond their documented ranges, checked against SpikingJelly 2.0's classes of the
same names where they overlap (PoissonEncoder's rates, LatencyEncoder's linear firing times): dtypes, shapes,
the Poisson module's generator state, statistics under fixed seeds, gradients (none, as SpikingJelly's), and the
regressions of faults found by probing them (each test names what it guards)."""
from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest
import torch
from conftest import profile
from torch import nn

from autocuda.call import encoding as E

DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def sj_encoding() -> Any:
    try:
        from spikingjelly.activation_based import encoding
    except Exception as error:  # not installed, or a dependency missing: nothing to compare with here
        pytest.skip(f"SpikingJelly does not import: {type(error).__name__}: {error}")
    return encoding


# -- faults found (each failed before its fix) -----------------------------------------------------------------
@pytest.mark.parametrize(("dtype", "threshold"), [(torch.float16, 0.1), (torch.bfloat16, 0.7),
                                                  (torch.float32, 0.7), (torch.int64, 16777216.5)])
def test_delta_threshold_is_not_rounded_to_the_input_dtype(dtype: torch.dtype, threshold: float) -> None:
    """A change below `threshold` fired: the threshold was rounded to x_seq's dtype (float16 0.1 -> 0.09998,
    bfloat16 0.7 -> 0.6992; integers were compared in float32, 16777216.5 -> 16777216) before the comparison."""
    below = torch.tensor(threshold).to(dtype)  # the largest value of the dtype at or below the threshold
    if float(below) > threshold:
        below = torch.nextafter(below.double(), torch.tensor(0.0, dtype=torch.float64)).to(dtype)
    assert float(below) < threshold
    x = torch.stack([torch.zeros((), dtype=dtype), below, torch.zeros((), dtype=dtype), -below]).unsqueeze(1)
    assert E.delta(x, threshold).abs().sum() == 0
    assert E.delta(x, threshold, signed=False).sum() == 0
    # a change of the threshold itself (where the dtype holds it) still fires
    assert E.delta(torch.tensor([[0.0], [0.5], [0.0]], dtype=dtype if dtype.is_floating_point else torch.float32),
                   0.5).squeeze(1).tolist() == [0.0, 1.0, -1.0]


def test_delta_spikes_hold_no_negative_zeros() -> None:
    """A small fall gave -0.0 (sign(-d) * False): a spike train of {-1, 0, 1} printed `-0.` and had signbits set."""
    x = torch.tensor([0.0, -0.01, -0.02, 0.5, 0.49]).unsqueeze(1)
    for signed in (True, False):
        s = E.delta(x, 0.1, signed=signed)
        assert not torch.signbit(s[s == 0]).any()


def test_poisson_gain_is_applied_at_full_precision_in_every_dtype() -> None:
    """`gain * x` was computed in x's dtype: bfloat16 rounded the probability 200 / 255 = 0.7843 to 0.7852, so
    a seed gave a different train in bfloat16 than in float32 (the docs promise the same) and a biased rate."""
    x = torch.arange(256.0)  # integers up to 256: exact in every floating dtype and in uint8's range
    reference = E.poisson(x.to(torch.uint8), 64, gain=1 / 255, seed=4)
    for dtype in DTYPES:
        train = E.poisson(x.to(dtype), 64, gain=1 / 255, seed=4)
        assert train.dtype == dtype and torch.equal(train.float(), reference.float()), dtype


def test_number_arguments_accept_numpy_scalars_and_name_overflows() -> None:
    """`gain=np.float32(0.5)` was refused as "expected a number >= 0, got np.float32(0.5)" (it is one); an int too
    large for a float failed inside torch (OverflowError: int too big to convert) naming no argument."""
    x = torch.full((50,), 0.5)
    assert torch.equal(E.poisson(x, 4, gain=np.float32(0.5), seed=1), E.poisson(x, 4, gain=0.5, seed=1))
    x_seq = torch.tensor([[0.0], [0.6]])
    assert torch.equal(E.delta(x_seq, np.float32(0.5)), E.delta(x_seq, 0.5))
    assert torch.equal(E.DeltaEncoder(np.float64(0.5))(x_seq), E.delta(x_seq, 0.5))
    with pytest.raises(ValueError, match=r"^gain: expected a number >= 0"):
        E.poisson(torch.zeros(3), 4, gain=10**400)
    with pytest.raises(ValueError, match=r"^threshold: expected a number > 0"):
        E.delta(x_seq, 10**400)
    with pytest.raises(ValueError, match=r"^gain: expected a number >= 0"):
        E.poisson(x, 4, gain=np.float32(-1))


def test_modules_check_their_settings_when_built() -> None:
    """PoissonEncoder(4, gain=-1), PoissonEncoder(4, check="no") and DeltaEncoder(0.1, signed="no") were built and
    failed only at their first call; SpikingJelly's `LatencyEncoder(T, 'log')` (its enc_function, positional) set
    autocuda's `check` to 'log' and failed at the first call with "check: expected True or False"."""
    with pytest.raises(ValueError, match=r"^gain: expected a number >= 0"):
        E.PoissonEncoder(4, gain=-1)
    with pytest.raises(TypeError, match=r"^check: expected True or False, got 'no'"):
        E.PoissonEncoder(4, check="no")
    with pytest.raises(TypeError, match=r"^check: expected True or False, got 'log'"):
        E.LatencyEncoder(4, "log")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^signed: expected True or False, got 'no'"):
        E.DeltaEncoder(0.1, signed="no")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"^check: expected True or False"):
        E.DeltaEncoder(0.1, check=1)  # type: ignore[arg-type]


# -- SpikingJelly's classes where they overlap -----------------------------------------------------------------
@pytest.mark.parametrize("T", [1, 2, 5, 16, 100])
def test_latency_equals_spikingjelly_linear(T: int) -> None:
    """Same firing step round((T - 1)(1 - x)) (ties to even) as SpikingJelly's LatencyEncoder('linear'), whose
    multi-step train is its `single_step_encode` and whose single steps replay it, spike[t % T]. (In float32 and
    below SpikingJelly rounds the product in x's dtype, so it differs from the formula at near-ties; we do not.)"""
    sj = sj_encoding()
    g = torch.Generator().manual_seed(T)
    x = torch.cat([torch.rand(500, generator=g, dtype=torch.float64),
                   torch.arange(2 * T - 1, dtype=torch.float64) / max(2 * T - 2, 1)])  # exact ties included
    ours = E.latency(x, T)
    theirs = sj.LatencyEncoder(T).single_step_encode(x)
    assert torch.equal(ours, theirs)
    stepper = sj.LatencyEncoder(T)  # step mode 's': one step per call, cycling through the train
    assert all(torch.equal(stepper(x), ours[t % T]) for t in range(T + 2))


def test_poisson_rates_match_spikingjelly_and_the_probability() -> None:
    """Both fire at each step with probability x (SpikingJelly: rand <= x; ours: rand < x, so 0 never fires and 1
    always does); rates over 40000 draws agree within 0.01 under fixed seeds."""
    sj = sj_encoding()
    p = torch.tensor([0.0, 0.05, 0.3, 0.5, 0.77, 1.0])
    ours = E.poisson(p.repeat(1000), 40, seed=11).view(40, 1000, 6).mean((0, 1))
    torch.manual_seed(11)
    theirs = torch.stack([sj.PoissonEncoder()(p.repeat(1000)) for _ in range(40)]).view(40, 1000, 6).mean((0, 1))
    assert torch.allclose(ours, p, atol=0.01) and torch.allclose(theirs, p, atol=0.01)
    assert ours[0] == 0 and ours[-1] == 1


def test_poisson_steps_and_values_are_independent() -> None:
    """P(spike at t and t+1) = p^2 and P(two neighbours) = p^2: no correlation across steps or elements."""
    s = E.poisson(torch.full((20000,), 0.4), 20, seed=7)
    assert abs(float((s[1:] * s[:-1]).mean()) - 0.16) < 0.005
    assert abs(float((s[:, 1:] * s[:, :-1]).mean()) - 0.16) < 0.005


def test_no_gradient_through_encoders_as_in_spikingjelly() -> None:
    """Neither autocuda nor SpikingJelly claims a differentiable encoder: the trains carry no graph. (delta's did:
    sign(change) * mask kept x_seq's graph over every step, and its gradient was zero everywhere.)"""
    x = torch.rand(5, requires_grad=True)
    x_seq = torch.rand(4, 5, requires_grad=True)
    for s in (E.poisson(x, 3, seed=0), E.poisson(x, 3, gain=0.5, seed=0), E.latency(x, 3), E.delta(x_seq, 0.1),
              E.PoissonEncoder(3)(x), E.LatencyEncoder(3)(x), E.DeltaEncoder(0.1)(x_seq)):
        assert not s.requires_grad and s.grad_fn is None


# -- shapes, dtypes, values -----------------------------------------------------------------------------------
@pytest.mark.parametrize("shape", [(), (0,), (0, 3), (2, 1, 3)])
def test_shapes_zero_dim_and_empty(shape: tuple[int, ...]) -> None:
    x = torch.full(shape, 0.5)
    assert E.poisson(x, 3, seed=0).shape == (3, *shape)
    assert E.latency(x, 3).shape == (3, *shape)
    assert E.latency(x, 3).sum() == x.numel()
    assert E.delta(torch.stack([x, x + 0.2]), 0.1).shape == (2, *shape)
    if not shape or shape[0] == 0:  # no steps (0-d, or T = 0): refused by name
        with pytest.raises(ValueError, match=r"^x_seq: expected a sequence of shape \[T, \*\] with T > 0"):
            E.delta(x, 0.1)


@pytest.mark.parametrize("dtype", [*DTYPES, torch.uint8, torch.int8, torch.int64, torch.bool])
def test_dtypes_in_and_out(dtype: torch.dtype) -> None:
    x = torch.tensor([0, 1, 1, 0]).to(dtype)
    out = dtype if dtype.is_floating_point else torch.get_default_dtype()
    for s in (E.poisson(x, 4, seed=0), E.latency(x, 4), E.delta(x, 0.5)):
        assert s.dtype == out
    assert E.poisson(x, 4, seed=0).float().mean(0).tolist() == [0.0, 1.0, 1.0, 0.0]
    assert E.latency(x, 4).argmax(0).tolist() == [3, 0, 0, 3]
    if dtype.is_signed or dtype.is_floating_point:
        assert E.latency(torch.tensor([-1, 1]).to(dtype), 4, check=False).sum(0).tolist() == [0.0, 1.0]


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf"), -1e-30, 1 + 1e-6])
def test_values_outside_the_range_are_refused(bad: float) -> None:
    x = torch.tensor([0.5, bad], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"^x: values must lie in \[0, 1\]"):
        E.poisson(x, 4)
    with pytest.raises(ValueError, match=r"^x: values must lie in \[0, 1\]"):
        E.latency(x, 4)
    if bad != bad or abs(bad) == float("inf") or bad < 0:
        with pytest.raises(ValueError, match=r"^gain \* x: values must lie in \[0, 1\]"):
            E.poisson(x, 4, gain=0.5)
    if bad != bad or abs(bad) == float("inf"):
        with pytest.raises(ValueError, match=r"^x_seq: holds NaN or infinite values"):
            E.delta(x.unsqueeze(1), 0.1)


def test_zero_gain_and_bounds_of_the_unit_interval() -> None:
    x = torch.tensor([0.0, 1.0, 0.5])
    assert E.poisson(x, 50, gain=0, seed=0).sum() == 0
    s = E.poisson(x, 50, seed=0)
    assert s[:, 0].sum() == 0 and s[:, 1].sum() == 50
    assert E.latency(x, 9).argmax(0).tolist() == [8, 0, 4]


# -- the Poisson module's state --------------------------------------------------------------------------------
def test_poisson_module_state_copies_resets_and_settings() -> None:
    x = torch.rand(40)
    enc = E.PoissonEncoder(6, seed=3)
    first = enc(x)
    twin = copy.deepcopy(enc)  # mid-stream: the copy continues from where the original is, independently
    second = enc(x)
    assert torch.equal(twin(x), second) and not torch.equal(first, second)
    twin.reset()
    assert torch.equal(twin(x), first)
    enc(x)
    enc.reset()
    assert torch.equal(enc(x), first)
    assert enc.state_dict() == {} and not list(enc.parameters())
    enc.T = 9  # read at each call
    assert enc(x).shape == (9, 40)
    enc.seed = 3  # a new seed (even the same) starts afresh
    assert torch.equal(enc(x)[:6], first)
    enc.T = 0
    with pytest.raises(ValueError, match=r"^T: "):
        enc(x)


def test_poisson_module_is_reset_by_spikingjelly_reset_net() -> None:
    try:
        from spikingjelly.activation_based import functional
    except Exception as error:
        pytest.skip(f"SpikingJelly does not import: {type(error).__name__}: {error}")
    from autocuda.nn import LIFNode
    net = nn.Sequential(E.PoissonEncoder(5, seed=0), LIFNode(step_mode="m"))
    x = torch.rand(2, 3)
    a = net(x)
    functional.reset_net(net)
    assert torch.equal(net(x), a)


def test_global_generator_repeats_under_manual_seed() -> None:
    x = torch.rand(30)
    torch.manual_seed(5)
    a = E.poisson(x, 4)
    torch.manual_seed(5)
    assert torch.equal(E.poisson(x, 4), a)


# -- wider sweeps (--slow) ------------------------------------------------------------------------------------
@pytest.mark.skipif(profile() != "slow", reason="a sweep of T and values: the slow profile")
def test_latency_equals_spikingjelly_sweep() -> None:
    sj = sj_encoding()
    g = torch.Generator().manual_seed(0)
    for T in range(1, 300, 7):
        x = torch.cat([torch.rand(5000, generator=g, dtype=torch.float64),
                       torch.arange(2 * T - 1, dtype=torch.float64) / max(2 * T - 2, 1)])
        assert torch.equal(E.latency(x, T), sj.LatencyEncoder(T).single_step_encode(x)), T


@pytest.mark.skipif(profile() != "slow", reason="a sweep of integer inputs: the slow profile")
def test_gain_of_one_over_the_maximum_is_never_refused() -> None:
    """n * (1 / n) never exceeds 1 in any dtype, so pixel / max scaling passes the range check."""
    for dtype in (torch.uint8, torch.int64, *DTYPES):
        top = 255 if dtype == torch.uint8 else 2048
        n = torch.arange(1, top + 1)
        n = n[n.to(dtype).double() == n.double()]
        for k in n.tolist():
            assert E.poisson(torch.tensor([k]).to(dtype), 1, gain=1 / k, seed=0).sum() == 1


@pytest.mark.skipif(profile() != "slow", reason="a sweep of changes near the threshold: the slow profile")
def test_delta_fires_exactly_at_the_threshold_sweep() -> None:
    g = torch.Generator().manual_seed(1)
    for dtype in DTYPES:
        for threshold in torch.rand(200, generator=g, dtype=torch.float64).tolist():
            x = (torch.rand(64, 8, generator=g, dtype=torch.float64) * 2).to(dtype)
            s = E.delta(x, threshold)
            reference = x[0].double()
            for t in range(1, 64):  # the documented rule in float64
                change = x[t].double() - reference
                want = (change >= threshold).double() - (change <= -threshold).double()
                assert torch.equal(s[t].double(), want)
                reference = torch.where(want != 0, x[t].double(), reference)
