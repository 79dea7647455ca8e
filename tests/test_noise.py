"""The generator of draws (`autocuda.codegen.noise`): Philox4x32-10's known answers, the C on the host runner bitwise
equal to the torch reference, the accuracy of float's normal by segments and of double's Box-Muller log and cos, and
the moments of the draws (2^24 samples under --slow, 2^16 by default)."""
from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch
from conftest import compile_launched, profile

from autocuda.codegen import noise, normal_segments

# Random123's known-answer vectors for philox4x32-10 (kat_vectors): counter, key -> output
KNOWN = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
         ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
         ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
          (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]
PRECISIONS = {"float": (torch.float32, torch.int32), "double": (torch.float64, torch.int64)}


@pytest.mark.parametrize("counter, key, expected", KNOWN)
def test_philox_known_answers(counter, key, expected):
    words = noise.philox4x32_10(tuple(torch.tensor([c]) for c in counter), key)
    assert tuple(int(w) for w in words) == expected


def bits(x: torch.Tensor) -> torch.Tensor:
    return x.view(torch.int32 if x.dtype == torch.float32 else torch.int64)


@pytest.fixture(scope="module")
def draw_kernels():
    """The four kernels, compiled for the host in one compiler run."""
    kernels = {(kind, p): noise.DrawKernel(kind, p) for kind in noise.KINDS for p in PRECISIONS}
    compile_launched(*(lambda k=k: k.draws(1, 1, backend="host") for k in kernels.values()))
    return kernels


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("kind", noise.KINDS)
def test_host_runner_equals_torch_bitwise(draw_kernels, kind, precision):
    """Neuron indices past 2^32 (the counter's second word), steps whose group is past 2^32 (taken modulo 2^32) at
    an odd and an even place in their group (a sine and a cosine draw; in float the second pair of the group), and
    the largest seed: the C and the torch reference give the same bits."""
    dtype, _ = PRECISIONS[precision]
    count, first, seed = 20000, 2**32 - 7000, 2**64 - 1
    for step in (2**34 + 5, 2**34 + 2):
        got = draw_kernels[kind, precision].draws(seed, count, step=step, site=3, neuron0=first, backend="host")
        expected = noise.draws(kind, seed, torch.arange(count) + first, step, 3, dtype)
        assert torch.equal(bits(got), bits(expected))


def test_streams_are_independent_of_each_other():
    """A draw depends on seed, neuron, step and site: changing any one changes (almost) every draw."""
    n = torch.arange(4096)
    base = noise.draws("normal", 7, n, 11, 0)
    assert torch.equal(base, noise.draws("normal", 7, n, 11, 0))
    for other in (noise.draws("normal", 8, n, 11, 0), noise.draws("normal", 7, n + 1, 11, 0),
                  noise.draws("normal", 7, n, 12, 0), noise.draws("normal", 7, n, 11, 1),
                  noise.draws("normal", 7 + 2**32, n, 11, 0)):
        assert (other == base).float().mean() < 0.01


def test_seed_is_checked():
    for bad in (-1, 2**64, 1.5, True):
        with pytest.raises(ValueError, match="seed"):
            noise.draws("normal", bad, 0, 0, 0)
    with pytest.raises(ValueError, match="kind of draw"):
        noise.draws("poisson", 1, 0, 0, 0)


def test_log_and_cos_accuracy():
    """Double's Box-Muller: its own log (over (0, 1]), cos and sin (over a full turn) against float64 math, each
    within 8 units of 2^-53, relative to |log u| and to 1 (measured: 4.2 for log, 6 for cos)."""
    p = noise.PRECISIONS["double"]
    ulp = 2.0 ** -53
    generator = torch.Generator().manual_seed(0)
    j = torch.randint(0, 2**62, (50000,), generator=generator) >> (62 - p.bits)
    j = torch.cat([j, torch.tensor([0, 1, 2**p.bits - 1, 2**(p.bits - 1), 2**(p.bits - 2), 2**(p.bits - 3)])])
    u = (j + 1).to(torch.float64) * 2.0 ** -p.bits
    exact = torch.log(u)  # float64 math: within an ulp of 2^-53
    assert ((noise._log(u, p) - exact).abs() <= 8 * ulp * exact.abs().clamp_min(2**-10)).all()
    turns = j.to(torch.float64) * 2.0 ** -p.bits
    cos, sin = noise._cos_sin_turns(j, p)
    assert ((cos - torch.cos(2 * math.pi * turns)).abs() <= 8 * ulp).all()
    assert ((sin - torch.sin(2 * math.pi * turns)).abs() <= 8 * ulp).all()


def segment_words() -> torch.Tensor:
    """Random words, and each segment's first and last word on both signs (every octave e, segment j)."""
    ends = []
    for e in range(normal_segments.OCTAVES):
        for j in range(1 << normal_segments.SEGMENT_BITS):
            low = (1 << 31 | j << (31 - normal_segments.SEGMENT_BITS)) >> e  # r = 2 (w mod 2^31) + 1 from here
            high = ((1 << 31 | (j + 1) << (31 - normal_segments.SEGMENT_BITS)) >> e) - 1
            ends += [w >> 1 for w in (low | 1, high | 1) if w & 1]
    ends = torch.tensor(ends)
    random = torch.randint(0, 2**32, (100000,), generator=torch.Generator().manual_seed(0))
    return torch.cat([random, ends, ends | 2**31])


def test_float_normal_accuracy():
    """Float's normal by segments (`normal_segments`) against the inverse normal CDF in double: within 6 units of
    2^-24 relative to max(1, |z|) (measured 3.7), at random words and at both ends of every segment of every octave
    (where a segment's cubic or the word's decomposition would go wrong first), with the sign of the word's top
    bit."""
    words = segment_words()
    z = noise._segment_normal(words).double()
    q = (((words & 0x7FFFFFFF) << 1) | 1).double() * 2.0**-32
    exact = torch.tensor([normal_segments.magnitude_at(v) for v in q.tolist()], dtype=torch.float64)
    exact = torch.where(words >= 2**31, -exact, exact)
    assert ((z - exact).abs() <= 6 * 2.0**-24 * exact.abs().clamp_min(1)).all()
    assert float(z.abs().max()) == pytest.approx(normal_segments.magnitude_at(2.0**-32), rel=1e-6)  # the deepest


def test_fma_is_rounded_once():
    """The torch reference's fused multiply-add (`noise._fma`, as the C's fmaf) rounds a·b + c once: where the exact
    value lies just past a float32 midpoint, a float64 sum rounded again would land on the midpoint and round to even.
    And random products near cancellation, against exact rational arithmetic."""
    a = torch.tensor([1 + 2**-12], dtype=torch.float32)  # a·a = 1 + 2^-11 + 2^-24: a midpoint between two floats
    for c, units in ((2**-60, 4097), (-(2**-60), 4096), (0.0, 4096)):
        got = noise._fma(a, a, torch.tensor([c], dtype=torch.float32))
        assert (float(got) - 1) * 2**23 == units
    generator = torch.Generator().manual_seed(3)
    x, y = torch.randn(2, 2000, generator=generator)
    z = (-(x.double() * y.double()) * (1 + torch.randint(-3, 4, (2000,), generator=generator) * 2.0**-23)).float()
    got = noise._fma(x, y, z)
    for i in range(0, 2000, 10):
        exact = Fraction(float(x[i])) * Fraction(float(y[i])) + Fraction(float(z[i]))
        near = torch.tensor(float(exact), dtype=torch.float32)  # with its neighbours: the float32s around the value
        candidates = [torch.nextafter(near, torch.tensor(side)) for side in (-math.inf, math.inf)] + [near]
        nearest = min(candidates, key=lambda v: (abs(Fraction(float(v)) - exact), int(v.view(torch.int32)) & 1))
        assert float(got[i]) == float(nearest)


def moments(x: torch.Tensor) -> tuple[float, float, float, float]:
    """Mean, variance, and the lag-1 correlations of a [steps, neurons] sample along steps and along neurons."""
    x = x.double()
    centred = x - x.mean()
    var = float(centred.pow(2).mean())
    along_steps = float((centred[1:] * centred[:-1]).mean()) / var
    along_neurons = float((centred[:, 1:] * centred[:, :-1]).mean()) / var
    return float(x.mean()), var, along_steps, along_neurons


@pytest.mark.parametrize("kind, mean, var", [("normal", 0.0, 1.0), ("uniform", 0.5, 1 / 12)])
def test_moments(kind, mean, var):
    """Moments of 2^24 draws (--slow; 2^16 by default) of one site over steps x neurons, and the correlation
    between two sites: each within 5 standard errors of its expected value."""
    steps, neurons = (256, 65536) if profile() == "slow" else (32, 2048)
    samples = steps * neurons
    n, t = torch.arange(neurons)[None, :], torch.arange(steps)[:, None]
    x = noise.draws(kind, 2024, n, t, 0)
    got_mean, got_var, along_steps, along_neurons = moments(x)
    error = 5 / math.sqrt(samples)
    assert abs(got_mean - mean) <= error * math.sqrt(var)
    fourth = 3.0 if kind == "normal" else 9 / 5  # E[(x - mean)^4] / var^2
    assert abs(got_var - var) <= 5 * var * math.sqrt((fourth - 1) / samples)
    assert abs(along_steps) <= error and abs(along_neurons) <= error
    other = noise.draws(kind, 2024, n, t, 1).double()
    between_sites = float(((x.double() - mean) * (other - mean)).mean()) / var
    assert abs(between_sites) <= error
