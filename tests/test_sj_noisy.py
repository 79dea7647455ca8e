"""SpikingJelly's noisy neurons (autocuda.nn.spikingjelly_noisy) in float64 on the CPU against SpikingJelly's own
classes fed the same noise episodes: equal outputs, states and gradients (the input, `conn`'s weights, the learned
`sigma`) over training calls, an evaluation call and a loaded noise; the 1/f^beta generator against SpikingJelly's
for one random_state, and its moments; the refusals (skipped where SpikingJelly does not import)."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from backends import NEEDS_HOST
from sj_signatures import assert_signature_is_theirs_then_backend

import autocuda.nn as our
from autocuda.nn.spikingjelly_noisy import powerlaw_psd_gaussian

try:  # any failure (not installed, a dependency missing or too new) means: nothing to test against here
    from spikingjelly.activation_based.neuron import noisy as sj_noisy
except Exception as error:
    pytest.skip(f"SpikingJelly does not import: {type(error).__name__}: {error}", allow_module_level=True)

F64 = torch.float64
TOL = {"rtol": 1e-13, "atol": 1e-13}
SPIKING = [{}, {"c_decay": 0.3, "v_decay": 0.9, "v_threshold": 0.4, "sigma_init": 2.0}]
CLASSES = ["NoisyBaseNode", "NoisyCUBALIFNode", "NoisyILCBaseNode", "NoisyILCCUBALIFNode",
           "NoisyNonSpikingBaseNode", "NoisyNonSpikingIFNode"]


def twin_inputs(seed: int, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    torch.manual_seed(seed)
    x = 1.5 * torch.randn(*shape, dtype=F64)
    return x.clone().requires_grad_(True), x.clone().requires_grad_(True)


def weighted_sum(y: torch.Tensor) -> torch.Tensor:
    return (y * torch.arange(y.numel(), dtype=y.dtype).view_as(y)).sum()


def share_noise(theirs: torch.nn.Module, mine: torch.nn.Module, episodes: int, names: tuple[str, ...]) -> None:
    """Their episodes given to ours, drawn by their generator from a seeded NumPy generator (theirs draws from fresh
    entropy, which would make each run's float32 sums, and so the tolerances they meet, differ)."""
    draw, seeded = sj_noisy.powerlaw_psd_gaussian, np.random.default_rng(0)
    sj_noisy.powerlaw_psd_gaussian = lambda exponent, size: draw(exponent, size, random_state=seeded)
    try:
        theirs.reset_noise(episodes)
    finally:
        sj_noisy.powerlaw_psd_gaussian = draw
    mine.reset_noise(episodes)
    for name in names:
        setattr(mine, name, getattr(theirs, name).clone())


def calls(layer: torch.nn.Module, x: torch.Tensor, cn: torch.Tensor) -> list[torch.Tensor]:
    """Two training calls (two episodes), one with loaded noise, one evaluation call."""
    outputs = [layer(x), layer(x)]
    layer.load_colored_noise(cn)
    outputs.append(layer(x))
    layer.cancel_load()
    layer.is_training = False
    outputs.append(layer(x))
    layer.is_training = True
    return [torch.stack(y) if isinstance(y, list) else y for y in outputs]


@pytest.mark.parametrize("backend", ["torch", pytest.param("host", marks=NEEDS_HOST)])
@pytest.mark.parametrize("kwargs", SPIKING)
def test_noisy_cuba_lif_as_theirs(kwargs: dict, backend: str) -> None:
    theirs, mine = sj_noisy.NoisyCUBALIFNode(6, T=4, **kwargs), our.NoisyCUBALIFNode(6, T=4, backend=backend,
                                                                                       **kwargs)
    share_noise(theirs, mine, 3, ("eps_v_seq", "eps_s_seq"))
    x, y = twin_inputs(0, (4, 3, 6))
    cn = torch.randn(3, 4, 12, dtype=F64)
    a, b = calls(theirs, x, cn), calls(mine, y, cn)
    for got, expected in zip(b, a):
        torch.testing.assert_close(got, expected, **TOL)
    assert not torch.equal(a[0], a[1]) and not torch.equal(a[0], a[3])  # each call's noise is another
    torch.testing.assert_close(mine.v, theirs.v, **TOL)
    torch.testing.assert_close(mine.c, theirs.c, **TOL)
    weighted_sum(torch.stack(a)).backward(), weighted_sum(torch.stack(b)).backward()
    torch.testing.assert_close(y.grad, x.grad, rtol=1e-12, atol=1e-12)


def test_noisy_ilc_cuba_lif_as_theirs() -> None:
    torch.manual_seed(5)
    theirs = sj_noisy.NoisyILCCUBALIFNode(2, 3, T=4).to(F64)
    torch.manual_seed(5)
    mine = our.NoisyILCCUBALIFNode(2, 3, T=4, backend="torch").to(F64)
    assert [n for n, _ in mine.named_parameters()] == [n for n, _ in theirs.named_parameters()]
    for (_, p), (_, q) in zip(mine.named_parameters(), theirs.named_parameters()):
        assert torch.equal(p, q)  # initialised as theirs under one seed
    share_noise(theirs, mine, 3, ("eps_v_seq", "eps_s_seq"))
    x, y = twin_inputs(1, (4, 5, 6))
    cn = torch.randn(5, 4, 12, dtype=F64)
    a, b = calls(theirs, x, cn), calls(mine, y, cn)
    for got, expected in zip(b, a):
        torch.testing.assert_close(got, expected, **TOL)
    weighted_sum(torch.stack(a)).backward(), weighted_sum(torch.stack(b)).backward()
    torch.testing.assert_close(y.grad, x.grad, rtol=1e-12, atol=1e-12)
    for (name, p), (_, q) in zip(mine.named_parameters(), theirs.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-12, atol=1e-12, msg=name)


def test_noisy_ilc_node_in_half_precision_mixes_in_its_connections_dtype() -> None:
    """A half-precision NoisyILC node: the float32 noise makes the step's spikes float32 (as SpikingJelly's), and the
    feedback runs in `conn`'s dtype (SpikingJelly's raises on the mismatch): the call and its backward run."""
    torch.manual_seed(0)
    layer = our.NoisyILCCUBALIFNode(4, 8, T=3, backend="torch").to(torch.bfloat16)
    layer.reset_noise(1)
    x = torch.rand(3, 2, 32, dtype=torch.bfloat16).requires_grad_()
    out = layer(x)
    assert out.dtype == torch.float32 and out.shape == x.shape
    out.sum().backward()
    assert x.grad is not None and x.grad.dtype == torch.bfloat16 and layer.conn.weight.grad is not None


@pytest.mark.parametrize("decode", [None, "max-mem", "max-abs-mem", "mean-mem", "last-me"])
def test_noisy_non_spiking_if_as_theirs(decode: str | None) -> None:
    theirs = sj_noisy.NoisyNonSpikingIFNode(6, T=4, sigma_init=3.0, decode=decode)
    mine = our.NoisyNonSpikingIFNode(6, T=4, sigma_init=3.0, decode=decode, backend="torch")
    assert mine.sigma.dtype == theirs.sigma.dtype and torch.equal(mine.sigma, theirs.sigma)
    share_noise(theirs, mine, 3, ("eps_seq",))
    x, y = twin_inputs(2, (4, 3, 6))
    cn = torch.randn(3, 4, 6)
    a, b = calls(theirs, x, cn), calls(mine, y, cn)
    for got, expected in zip(b, a):
        torch.testing.assert_close(got, expected, **TOL)
    weighted_sum(torch.stack(a)).backward(), weighted_sum(torch.stack(b)).backward()
    torch.testing.assert_close(y.grad, x.grad, rtol=1e-12, atol=1e-12)
    # float32, as theirs: each library sums the noise's products with the gradient (terms up to a few units) in its
    # own order, so the sums differ by a few units of float32's rounding of the terms, not of the result (the noise
    # is seeded: `share_noise`)
    torch.testing.assert_close(mine.sigma.grad, theirs.sigma.grad, rtol=1e-5, atol=1e-4)
    assert theirs.sigma.grad.abs().sum() > 0


@pytest.mark.parametrize(("exponent", "size", "fmin"), [(0.0, (3, 16), 0.0), (1.0, (2, 5, 17), 0.0),
                                                        (2.0, 64, 0.1), (0.5, (4, 2), 0.5)])
def test_powerlaw_noise_is_theirs_for_one_random_state(exponent: float, size, fmin: float) -> None:
    expected = sj_noisy.powerlaw_psd_gaussian(exponent, size, fmin, random_state=7)
    got = powerlaw_psd_gaussian(exponent, size, fmin, random_state=7)
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-12)
    np.testing.assert_allclose(powerlaw_psd_gaussian(exponent, size, fmin, np.random.default_rng(3)),
                               sj_noisy.powerlaw_psd_gaussian(exponent, size, fmin, np.random.default_rng(3)),
                               rtol=0, atol=1e-12)


def lag_one(series: np.ndarray) -> float:
    centred = series - series.mean(-1, keepdims=True)
    return float((centred[:, 1:] * centred[:, :-1]).mean() / (centred ** 2).mean())


def test_powerlaw_noise_moments() -> None:
    white = powerlaw_psd_gaussian(0.0, (64, 1024), random_state=1)
    assert abs(white.mean()) < 0.02 and abs(white.var() - 1) < 0.03 and abs(lag_one(white)) < 0.02
    assert abs(np.corrcoef(white[0], white[1])[0, 1]) < 0.1  # neurons independent
    brown = powerlaw_psd_gaussian(2.0, (64, 1024), random_state=1)
    assert lag_one(brown) > 0.9  # 1/f^2: strongly correlated from step to step


def test_episodes_follow_torchs_seed() -> None:
    layer = our.NoisyCUBALIFNode(5, T=3, beta=1.0)
    torch.manual_seed(3)
    layer.reset_noise(4)
    first = layer.eps_v_seq.clone()
    assert first.shape == (4, 3, 5) and first.dtype == torch.float32
    assert not torch.equal(first, layer.eps_s_seq)  # the input's and the output's noise are two draws
    torch.manual_seed(3)
    layer.reset_noise(4)
    assert torch.equal(layer.eps_v_seq, first)


@pytest.mark.parametrize("name", ["NoisyCUBALIFNode", "NoisyILCCUBALIFNode", "NoisyNonSpikingIFNode"])
def test_signatures_are_theirs_then_backend(name: str) -> None:
    assert_signature_is_theirs_then_backend(getattr(sj_noisy, name), getattr(our, name))


@pytest.mark.parametrize(("build", "error", "words"), [
    (lambda: our.NoisyCUBALIFNode(4, v_threshold=1), ValueError, "^v_threshold"),
    (lambda: our.NoisyCUBALIFNode(4, v_reset=0), ValueError, "^v_reset"),
    (lambda: our.NoisyCUBALIFNode(0), ValueError, "^num_node"),
    (lambda: our.NoisyCUBALIFNode(4, T=0), ValueError, "^T"),
    (lambda: our.NoisyILCCUBALIFNode(2, 0), ValueError, "^dec_pop_dim"),
    (lambda: our.NoisyNonSpikingIFNode(4, decode="last_mem"), ValueError, "^decode"),
    (lambda: our.NoisyBaseNode(4), TypeError, "base class"),
    (lambda: our.NoisyNonSpikingBaseNode(4), TypeError, "base class"),
    (lambda: our.NoisyCUBALIFNode(4)(torch.zeros(3, 4)), ValueError, "T = 5"),
    (lambda: our.NoisyCUBALIFNode(4, T=2)(torch.zeros(2, 4)), RuntimeError, "reset_noise"),
    (lambda: setattr(our.NoisyCUBALIFNode(4), "step_mode", "s"), ValueError, "^step_mode"),
    (lambda: our.NoisyCUBALIFNode(4).reset_noise(2, random_state="x"), ValueError, "^random_state"),
    (lambda: powerlaw_psd_gaussian(1.0, 8, fmin=0.6), ValueError, "^fmin"),
    (lambda: powerlaw_psd_gaussian(1.0, (4, 1)), ValueError, "^size"),
])
def test_bad_input_is_refused_naming_it(build, error: type, words: str) -> None:
    with pytest.raises(error, match=words):
        build()


def test_used_up_episodes_are_refused() -> None:
    layer = our.NoisyCUBALIFNode(4, T=2)
    layer.reset_noise(1)
    layer(torch.zeros(2, 3, 4))
    with pytest.raises(RuntimeError, match="used up"):
        layer(torch.zeros(2, 3, 4))


def test_every_noisy_class_is_exported() -> None:
    assert set(CLASSES) <= set(our.__all__) and set(CLASSES) == set(sj_noisy.__all__) - {"powerlaw_psd_gaussian"}
