"""Encoders (autocuda.encoding): layout [T, *], statistics, determinism under a seed, and argument checks."""
from __future__ import annotations

import pytest
import torch

from autocuda.call import encoding as E
from autocuda.nn import LIFNode


# -- Poisson --------------------------------------------------------------------------------------------------
def test_poisson_layout_dtype_and_values() -> None:
    x = torch.rand(3, 4, dtype=torch.float64)
    s = E.poisson(x, 7, seed=0)
    assert s.shape == (7, 3, 4) and s.dtype == torch.float64
    assert set(s.unique().tolist()) <= {0.0, 1.0}


def test_poisson_rate_matches_probability() -> None:
    p = torch.tensor([0.0, 0.1, 0.5, 0.9, 1.0])
    s = E.poisson(p.expand(4000, 5).T.contiguous(), 50, seed=1)  # [50, 5, 4000]
    rates = s.mean(dim=(0, 2))
    assert rates[0] == 0 and rates[-1] == 1
    assert torch.allclose(rates, p, atol=0.01)


def test_poisson_gain_scales_probabilities() -> None:
    x = torch.full((20000,), 100.0)
    rate = E.poisson(x, 10, gain=1 / 400, seed=3).mean()
    assert abs(float(rate) - 0.25) < 0.01


def test_poisson_same_seed_same_train_other_seed_other_train() -> None:
    x = torch.rand(64)
    a, b, c = E.poisson(x, 16, seed=5), E.poisson(x, 16, seed=5), E.poisson(x, 16, seed=6)
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_poisson_same_train_in_every_dtype() -> None:
    x = torch.tensor([0.25, 0.5, 0.75]).repeat(50)  # exactly representable in every dtype
    trains = [E.poisson(x.to(d), 9, seed=2) for d in (torch.float16, torch.bfloat16, torch.float32, torch.float64)]
    assert all(torch.equal(t.float(), trains[0].float()) for t in trains)
    assert [t.dtype for t in trains] == [torch.float16, torch.bfloat16, torch.float32, torch.float64]


def test_poisson_generator_continues_and_module_resets() -> None:
    x = torch.rand(32)
    g = torch.Generator().manual_seed(9)
    first, second = E.poisson(x, 4, generator=g), E.poisson(x, 4, generator=g)
    assert not torch.equal(first, second)
    enc = E.PoissonEncoder(4, seed=9)
    assert torch.equal(enc(x), first) and torch.equal(enc(x), second)  # the module's stream continues
    enc.reset()
    assert torch.equal(enc(x), first)


def test_poisson_module_without_seed_follows_torch_manual_seed() -> None:
    x = torch.rand(32)
    torch.manual_seed(0)
    a = E.PoissonEncoder(5)(x)
    torch.manual_seed(0)
    assert torch.equal(E.PoissonEncoder(5)(x), a)


def test_integer_input_gives_default_float_spikes() -> None:
    x = torch.tensor([0, 255, 128], dtype=torch.uint8)
    s = E.poisson(x, 3, gain=1 / 255, seed=0)
    assert s.dtype == torch.get_default_dtype() and s[:, 1].eq(1).all() and s[:, 0].eq(0).all()


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"T": 0}, r"^T: expected the number of time steps"),
    ({"T": 2.0}, r"^T: "),
    ({"T": True}, r"^T: "),
    ({"gain": -1.0}, r"^gain: expected a number >= 0"),
    ({"gain": 3.0}, r"^gain \* x: values must lie in \[0, 1\]"),
    ({"seed": 1, "generator": torch.Generator()}, r"^seed, generator: pass one of them"),
])
def test_poisson_refuses_bad_arguments(kwargs: dict, match: str) -> None:
    args = {"T": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        E.poisson(torch.full((3,), 0.5), **args)


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan")])
def test_poisson_and_latency_refuse_values_outside_unit_interval(bad: float) -> None:
    x = torch.tensor([0.2, bad])
    with pytest.raises(ValueError, match=r"^x: values must lie in \[0, 1\]"):
        E.poisson(x, 4)
    with pytest.raises(ValueError, match=r"^x: values must lie in \[0, 1\]"):
        E.latency(x, 4)


def test_seeds_generators_and_switches_of_the_wrong_kind_are_named() -> None:
    """They failed inside torch (manual_seed's RuntimeError, an overflow, an AttributeError of the generator), or a
    word such as "no" turned a switch on; latency has no gain, so its range error no longer suggests one."""
    x = torch.full((3,), 0.5)
    with pytest.raises(TypeError, match=r"^seed: expected an int or None, got '1'"):
        E.poisson(x, 4, seed="1")
    with pytest.raises(ValueError, match=r"^seed: expected an int of 64 bits"):
        E.poisson(x, 4, seed=2**70)
    with pytest.raises(ValueError, match=r"^seed: expected an int of 64 bits"):
        E.PoissonEncoder(4, seed=-2**63 - 1)
    assert E.poisson(x, 4, seed=2**64 - 1).shape == (4, 3)
    with pytest.raises(TypeError, match=r"^generator: expected a torch.Generator, got int"):
        E.poisson(x, 4, generator=3)
    with pytest.raises(TypeError, match=r"^check: expected True or False, got 'no'"):
        E.poisson(x, 4, check="no")
    with pytest.raises(TypeError, match=r"^check: expected True or False"):
        E.latency(x, 4, check=0)
    with pytest.raises(TypeError, match=r"^signed: expected True or False, got 'no'"):
        E.delta(torch.rand(3, 2), 0.1, signed="no")
    with pytest.raises(ValueError, match=r"^x: values must lie in \[0, 1\] \(scale them first\)$"):
        E.latency(torch.full((3,), 2.0), 4)


def test_check_false_skips_the_value_check() -> None:
    s = E.poisson(torch.tensor([1.5, -1.0]), 6, seed=0, check=False)
    assert s[:, 0].eq(1).all() and s[:, 1].eq(0).all()


def test_not_a_tensor_is_named() -> None:
    with pytest.raises(TypeError, match=r"^x: expected a torch.Tensor, got list"):
        E.poisson([0.5], 4)
    with pytest.raises(TypeError, match=r"^x_seq: expected a torch.Tensor"):
        E.delta([0.5], 0.1)


# -- latency --------------------------------------------------------------------------------------------------
def test_latency_one_spike_each_stronger_first() -> None:
    x = torch.tensor([[1.0, 0.75], [0.5, 0.0]])
    s = E.latency(x, 5)
    assert s.shape == (5, 2, 2)
    assert s.sum(0).eq(1).all()
    when = s.argmax(0)
    assert when.tolist() == [[0, 1], [2, 4]]  # round((T - 1) * (1 - x))


def test_latency_single_step() -> None:
    assert E.latency(torch.tensor([0.0, 1.0]), 1).tolist() == [[1.0, 1.0]]


def test_latency_module() -> None:
    x = torch.rand(3, 2)
    assert torch.equal(E.LatencyEncoder(6)(x), E.latency(x, 6))
    with pytest.raises(ValueError, match=r"^T: "):
        E.LatencyEncoder(-1)


# -- delta ----------------------------------------------------------------------------------------------------
def test_delta_signed_changes_and_reference_tracking() -> None:
    x = torch.tensor([0.0, 0.05, 0.12, 0.12, -0.2, 0.0]).unsqueeze(1)
    s = E.delta(x, 0.1)
    # the reference starts at 0, moves to 0.12 at step 2, to -0.2 at step 4, to 0.0 at step 5
    assert s.squeeze(1).tolist() == [0.0, 0.0, 1.0, 0.0, -1.0, 1.0]
    assert E.delta(x, 0.1, signed=False).squeeze(1).tolist() == [0.0, 0.0, 1.0, 0.0, 1.0, 1.0]


def test_delta_slow_drift_fires() -> None:
    x = torch.linspace(0, 1, 101).unsqueeze(1)  # steps of 0.01: a change-per-step encoder would never fire
    s = E.delta(x, 0.1)
    assert 9 <= int(s.sum()) <= 10 and s.ge(0).all()


def test_delta_module_and_checks() -> None:
    x = torch.randn(10, 3)
    assert torch.equal(E.DeltaEncoder(0.5)(x), E.delta(x, 0.5))
    with pytest.raises(ValueError, match=r"^threshold: expected a number > 0"):
        E.delta(x, 0.0)
    with pytest.raises(ValueError, match=r"^threshold: "):
        E.DeltaEncoder(-1)
    with pytest.raises(ValueError, match=r"^x_seq: expected a sequence of shape \[T, \*\] with T > 0"):
        E.delta(torch.zeros(0, 3), 0.1)
    with pytest.raises(ValueError, match=r"^x_seq: holds NaN"):
        E.delta(torch.tensor([[0.0], [float("inf")]]), 0.1)


# -- into a layer ---------------------------------------------------------------------------------------------
def test_encoded_trains_feed_a_multi_step_layer() -> None:
    x = torch.rand(2, 8)
    spikes = LIFNode(step_mode="m", v_threshold=0.5)(E.PoissonEncoder(12, seed=0)(x) * 2)
    assert spikes.shape == (12, 2, 8)
