"""Saved states replayed from checkpoints (ALIF's adaptation `a`): forward writes them every few steps, backward
rebuilds the steps in between from h. The gradients must be bitwise those of the kernels that save every step,
for every sequence length around the segment size, without backward reading a step forward did not write."""
from __future__ import annotations

import functools

import pytest
import sympy as sp
import torch
from conftest import compile_launched

from autocuda.codegen.kernels import derivation, source
from autocuda.codegen.neuron_kernel import REPLAY_STEPS
from autocuda.runtime import tuning
from autocuda.runtime.neuron_launch import NeuronConfig
from autocuda.spec.load import load_spec, spec_from_toml
from autocuda.spec.model import NeuronSpec
from autocuda.tools.testing.named_launch import backward, forward

K = REPLAY_STEPS


def _adaptive(update: str) -> NeuronSpec:
    return spec_from_toml(f"""name = "adaptive"
charge = "v + (x - v) / tau"
threshold = "1 + beta * a"
[params]
tau = 2.0
beta = 0.2
v_reset = 0.0
[states]
v = 0.0
a = 0.0
[updates]
a = "{update}"
""")


def test_which_derivations_replay():
    assert derivation(load_spec("alif")).replayable
    assert derivation(load_spec("alif"), "soft").replayable
    for name in ("lif", "izhikevich", "parametric_lif", "two_compartment"):
        assert not derivation(load_spec(name)).replayable, name  # nothing beyond h saved (or v recomputed)
    assert derivation(_adaptive("0.9 * a + s")).replayable
    assert not derivation(_adaptive("0.9 * a + s * x")).replayable, "the replay has no x"
    assert not derivation(_adaptive("0.9 * a + s + 0.1 * v")).replayable, "v is not saved"


def test_sources_write_and_read_checkpoints():
    spec = load_spec("alif")
    saving = source(spec, "fptt", "float32")
    assert f"if (t % {K} == {K - 1} && t + 1 < T)" in saving and f"usr_a_checkpoints[t / {K} * N + ac_n0" in saving
    assert "a_seq" not in saving and "_ru(" not in saving, "float32 stores h as computed"
    both = source(spec, "fptt", "float32", store_state_seq=True)
    assert "usr_a_seq[ac_row" in both and "usr_a_checkpoints[t / " in both, "asked for, the sequence is written as well"
    bptt = source(spec, "bptt", "float64")
    assert f"usr_a_checkpoints[(ac_s0 / {K} - 1) * N + ac_n0" in bptt and "ac_row - N" not in bptt
    for dtype, up in (("bfloat16", "__float2bfloat16_ru(ac_h)"), ("float16", "__float2half_ru(ac_h)")):
        forward, backward = source(spec, "fptt", dtype), source(spec, "bptt", dtype)
        # float arithmetic over h stored rounded: h rounded toward its side of the threshold, checkpoints in float
        assert f"if (t % {K} == {K - 1} && t + 1 < T)" in forward and up in forward
        assert "float* __restrict__ usr_a_checkpoints" in forward
        assert "ac_s0" in backward and "const float* __restrict__ usr_a_checkpoints" in backward
        native = source(spec, "fptt", dtype, native=True, lanes=2)  # half2 arithmetic: every step, as stored
        assert "t % " not in native and "usr_a_checkpoints[ac_row" in native
        assert "usr_a_checkpoints[ac_row - N + lane]" in source(spec, "bptt", dtype, native=True, lanes=2)
    assert "usr_a_checkpoints[ac_row - N + lane]" in source(spec, "bptt", "float32", replay=0)


def _gradients(spec: NeuronSpec, x: torch.Tensor, replay: int) -> dict[str, torch.Tensor]:
    config = NeuronConfig(spec, spec.surrogate, "hard")
    gen = torch.Generator().manual_seed(11)
    n = x.shape[1]
    init = {s.name: (0.3 * torch.randn(n, generator=gen)).to(x.dtype) for s in spec.states}
    params = {p.name: p.default for p in spec.params}
    layout = {"lanes": 2, "replay": replay}
    out = forward(config, x, init, params, backend="host", layout=layout)
    grads = {"grad_spike_seq": torch.randn(x.shape, generator=gen).to(x.dtype),
             **{f"grad_{s.name}_final": torch.randn(n, generator=gen).to(x.dtype) for s in spec.states}}
    saved = {**out, **{f"{k}_init": v for k, v in init.items()}}
    return out | backward(config, grads, saved, params, backend="host", layout=layout)


DTYPES = [torch.float32, torch.float64]
SEGMENT_STEPS = [(k, t) for k in (K, tuning.REPLAY) for t in (1, k - 1, k, k + 1, 3 * k + 5)]


def _replayed_and_saved(segment: int, steps: int, dtype: torch.dtype) -> tuple[dict, dict]:
    x = (torch.randn(steps, 16, generator=torch.Generator().manual_seed(steps)) * 3 + 2).to(dtype)
    spec = load_spec("alif")
    return _gradients(spec, x, replay=0), _gradients(spec, x, replay=segment)


@pytest.fixture(scope="module")
def compiled_kernels() -> int:
    """The kernels test_replayed_gradients_equal_saved_ones launches, compiled up front many to a compiler run
    (`conftest.compile_launched`); the cases would compile them one kernel a run."""
    return compile_launched(*(functools.partial(_replayed_and_saved, segment, steps, dtype)
                              for segment, steps in SEGMENT_STEPS for dtype in DTYPES))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("segment", "steps"), SEGMENT_STEPS)
def test_replayed_gradients_equal_saved_ones(segment, steps, dtype, compiled_kernels):
    """Checkpoints every `segment` steps (8 by default, 32 in long loops) against every step (`replay=0`): the
    replay rebuilds a bit for bit."""
    saved, replayed = _replayed_and_saved(segment, steps, dtype)
    assert replayed["spike_seq"].sum() > 0, "spikes move a, so the replay is exercised"
    for key in ("spike_seq", "grad_x_seq", "grad_v_init", "grad_a_init"):
        assert torch.equal(replayed[key], saved[key]), key
    assert saved["a_checkpoints"].shape == (steps - 1, 16), "every step's but the last (the final states)"
    assert replayed["a_checkpoints"].shape == ((steps - 1) // segment, 16)
    assert torch.equal(replayed["a_checkpoints"], saved["a_checkpoints"][segment - 1::segment])


def test_long_loops_replay_longer_segments():
    """The launch's own choice: 32-step segments where T >= 64 over few neurons, 8-step ones elsewhere."""
    spec = load_spec("alif")
    config = NeuronConfig(spec, spec.surrogate, "hard")
    params = {p.name: p.default for p in spec.params}
    for steps, every in ((63, K), (64, tuning.REPLAY), (100, tuning.REPLAY)):
        x = torch.randn(steps, 8) + 1
        out = forward(config, x, {"v": 0.0, "a": 0.0}, params, backend="host")
        assert out["a_checkpoints"].shape == ((steps - 1) // every, 8)
    with pytest.raises(ValueError, match="replay: steps per checkpoint"):
        source(spec, "fptt", "float32", replay=True)


def test_replayed_gradients_match_autograd_through_the_reference():
    import autocuda.call.functional as F

    x = (torch.randn(3 * K + 3, 6, dtype=torch.float64) * 2 + 0.5).requires_grad_(True)
    a0 = torch.rand(6, dtype=torch.float64, requires_grad=True)
    v0 = torch.zeros(6, dtype=torch.float64)
    got, finals, _ = F.multi_step("alif", x, v0, a0, backend="host")
    want, want_finals, _ = F.multi_step("alif", x, v0, a0, backend="reference")
    torch.testing.assert_close(got, want)
    g = torch.randn_like(got)
    weights = [torch.randn_like(f) for f in finals]
    for a, b in zip(torch.autograd.grad([got, *finals], (x, a0), [g, *weights]),
                    torch.autograd.grad([want, *want_finals], (x, a0), [g, *weights])):
        torch.testing.assert_close(a, b)
    assert sp.Symbol("a", real=True) in derivation(load_spec("alif")).system.states


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_precision_h_is_stored_on_the_side_of_its_spike(dtype):
    """float16 / bfloat16 kernels compute h in float and store it rounded; where rounding to nearest would
    cross the threshold, h is stored rounded toward its own side, so a replay deciding the spike from the
    stored h decides as forward did. ALIF with beta = 0 (a constant threshold, between two stored values) checks
    it exactly."""
    spec = load_spec("alif")
    config = NeuronConfig(spec, spec.surrogate, "hard")
    params = {p.name: p.default for p in spec.params} | {"beta": 0.0, "v_threshold": 1.001}
    threshold = torch.tensor(1.001)  # as the kernel holds it: float32
    x = (torch.rand(32, 4096, generator=torch.Generator().manual_seed(3)) * 2.5).to(dtype)
    out = forward(config, x, {"v": 0.0, "a": 0.0}, params, backend="host")
    h, spikes = out["h_seq"].float(), out["spike_seq"].float()
    assert torch.equal((h >= threshold).float(), spikes), "the stored h decides every spike as forward did"
    v, h32 = torch.zeros(x.shape[1]), []
    for xt in x.float():  # forward's float arithmetic: h = v + (x - v) / 2, hard reset to 0
        ht = v + (xt - v) * 0.5
        h32.append(ht)
        v = torch.where(ht >= threshold, 0.0, ht)
    h32 = torch.stack(h32)
    nearest = h32.to(dtype).float()
    crossing = (nearest >= threshold) != (h32 >= threshold)
    assert crossing.sum() > 0, "rounding to nearest would have crossed the threshold somewhere"
    assert torch.equal(h[~crossing], nearest[~crossing]), "elsewhere h is rounded to nearest"
    assert torch.equal(h[crossing] >= threshold, h32[crossing] >= threshold)
    assert ((h - h32).abs() <= (h32.abs() * torch.finfo(dtype).eps)).all(), "within one unit of the last place"
