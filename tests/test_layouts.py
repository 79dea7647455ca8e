"""Thread layouts (neurons per thread, vector accesses, loop unrolling) change speed, never results.

Run on the host runner: every layout of a kernel must give bitwise the same outputs as one neuron per thread.
With --slow every model runs every layout of its dtype; by default each layout runs on one of the models, taken in
turn (`chosen`), so that every layout and every model is checked, in every dtype, with a fraction of the kernels.
"""
from __future__ import annotations

import functools
import re

import pytest
import torch
from conftest import compile_launched, profile

from autocuda.codegen.kernels import neuron_kernel
from autocuda.codegen.layout import Layout
from autocuda.codegen.neuron_kernel import REPLAY_STEPS
from autocuda.runtime.neuron_launch import NeuronConfig
from autocuda.runtime.tuning import LONG_LOOP_STEPS, MIN_THREADS, choose_layout
from autocuda.spec.load import load_spec
from autocuda.spec.model import NeuronSpec
from autocuda.tools.testing.named_launch import backward, forward

T, N = 7, 32
LAYOUTS = {
    torch.float32: [{"lanes": 4, "vector": True}, {"lanes": 2, "vector": True, "unroll": 2}, {"lanes": 3},
                    {"lanes": 1, "prefetch": 2}, {"lanes": 1, "prefetch": 8},
                    {"lanes": 2, "vector": True, "prefetch": 3}, {"unroll": 8, "prefetch": 8},
                    {"lanes": 2, "vector": True, "prefetch": 32, "block": 64}, {"prefetch": 32, "block": 64},
                    {"replay": 0}, {"lanes": 4, "vector": True, "replay": 0},
                    {"lanes": 1, "vector": True, "staged": 4},
                    {"lanes": 2, "vector": True, "staged": 2, "staged_blocks": 2},
                    {"lanes": 4, "vector": True, "staged": 32, "block": 64}],
    torch.float16: [{"lanes": 8, "vector": True, "unroll": 4}, {"lanes": 2, "vector": True}, {"prefetch": 4},
                    {"lanes": 2, "vector": True, "unroll": 8, "prefetch": 8},
                    {"lanes": 2, "vector": True, "prefetch": 32, "block": 64},
                    {"lanes": 1, "prefetch": 32, "block": 64},  # one neuron per thread: pair copies
                    {"lanes": 2, "vector": True, "staged": 4},
                    {"lanes": 8, "vector": True, "staged": 2, "staged_blocks": 3}],
    torch.float64: [{"lanes": 2, "vector": True, "unroll": 2}, {"prefetch": 5}, {"replay": 0},
                    {"lanes": 1, "vector": True, "staged": 4}],
}


def _config(spec):
    return NeuronConfig(spec, spec.surrogate, "hard", tensors=tuple((p.name, True) for p in spec.params
                                                                    if p.kind == "tensor"))


def _run_all(spec, dtype, layout):
    config = _config(spec)
    gen = torch.Generator().manual_seed(7)
    x = (torch.randn(T, N, generator=gen) * 2).to(dtype)
    init = {s.name: (0.3 * torch.randn(N, generator=gen)).to(dtype) for s in spec.states}
    compute = torch.float64 if dtype == torch.float64 else torch.float32
    params = {p.name: (torch.full((N,), p.default + 0.1, dtype=compute) if p.kind == "tensor" else p.default)
              for p in spec.params}
    out = forward(config, x, init, params, backend="host", store_state_seq=True, layout=layout)
    grads = {"grad_spike_seq": torch.randn(T, N, generator=gen).to(dtype),
             **{f"grad_{s.name}_final": torch.randn(N, generator=gen).to(dtype) for s in spec.states}}
    saved = {**out, "x_seq": x, **{f"{k}_init": v for k, v in init.items()}}
    return out | backward(config, grads, saved, params, backend="host", layout=layout)


MODELS = ("izhikevich", "alif", "parametric_lif", "two_compartment")
NATIVE_MODELS = ("izhikevich", "parametric_lif")
NATIVE_LAYOUTS = ({"lanes": 2}, {"native": True}, {"native": True, "lanes": 4, "prefetch": 2},
                  {"native": True, "lanes": 4, "vector": True, "staged": 4})


CLASH = NeuronSpec(name="clash", params={"row": 2.0, "n0": 0.5, "v_threshold": 1.0, "v_reset": 0.0},
                   states={"v": 0.0, "d": 0.0}, charge="v + (x - v) / row + n0 * d", updates={"d": "d * n0 + s"})
CLASH_LAYOUTS = ({"lanes": 1}, {"lanes": 2, "prefetch": 3}, {"lanes": 4, "vector": True, "prefetch": 2})
# (T, N, dtype) of the LIF calls whose layout the launch layer chooses (`_lif_run`)
LIF_RUNS = [(LONG_LOOP_STEPS, n, dtype) for n in (2 * MIN_THREADS, 2 * MIN_THREADS - 2)
            for dtype in (torch.float32, torch.bfloat16)] + [(3, 2 * MIN_THREADS * 2, torch.float32),
                                                            (3, 1000, torch.float32)]


def _lif_run(steps: int, n: int, dtype: torch.dtype) -> NeuronConfig:
    """LIF forward and backward over [T, N] with the layout the launch layer chooses; the config that ran them."""
    spec = load_spec("lif")
    params = dict(tau=2.0, v_threshold=1.0, v_reset=0.0)
    config = NeuronConfig(spec, spec.surrogate, "hard")
    x = (torch.randn(steps, n) * 2).to(dtype)
    out = forward(config, x, {"v": 0.0}, params, backend="host")
    backward(config, {"grad_spike_seq": torch.ones_like(x)}, {"h_seq": out["h_seq"]}, params,
             grad_finals=False, given_inits=False, backend="host")
    return config


def chosen(layouts: list[dict], models: tuple[str, ...], name: str, turn: int) -> list[dict]:
    """The layouts `name` (one of `models`) runs: all with --slow; by default every len(models)-th, from its place in
    `models` shifted by `turn` (so each layout runs on one model, and a model's share moves from dtype to dtype)."""
    if profile() == "slow":
        return layouts
    return [layout for i, layout in enumerate(layouts) if models[(i + turn) % len(models)] == name]


def layouts_of(name: str, dtype: torch.dtype) -> list[dict]:
    return chosen(LAYOUTS[dtype], MODELS, name, list(LAYOUTS).index(dtype))


def native_layouts_of(name: str, dtype: torch.dtype) -> list[dict]:
    return chosen(list(NATIVE_LAYOUTS[1:]), NATIVE_MODELS, name, list(NATIVE_TOLERANCE).index(dtype))


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels() -> int:
    """Compile the kernels the tests below launch up front, many to a compiler run (`conftest.compile_launched`);
    the tests would compile them on demand, one kernel a run."""
    runs = [(name, dtype, layout) for name in MODELS for dtype in LAYOUTS
            for layout in ({"lanes": 1}, *layouts_of(name, dtype))]
    runs += [(name, dtype, layout) for name in NATIVE_MODELS for dtype in NATIVE_TOLERANCE
             for layout in (NATIVE_LAYOUTS[0], *native_layouts_of(name, dtype))]
    calls = [functools.partial(_run_all, load_spec(name), dtype, layout) for name, dtype, layout in runs]
    calls += [functools.partial(_run_all, CLASH, torch.float32, layout) for layout in CLASH_LAYOUTS]
    calls += [functools.partial(_lif_run, steps, n, dtype) for steps, n, dtype in LIF_RUNS]
    return compile_launched(*calls)


@pytest.mark.parametrize("dtype", list(LAYOUTS), ids=str)
@pytest.mark.parametrize("name", MODELS)
def test_every_layout_gives_identical_results(name, dtype):
    spec = load_spec(name)
    baseline = _run_all(spec, dtype, {"lanes": 1})
    layouts = layouts_of(name, dtype)
    assert layouts, "every model runs some layout in every dtype"
    for layout in layouts:
        result = _run_all(spec, dtype, layout)
        assert result.keys() == baseline.keys()
        for key in baseline:
            got = result[key]
            if key.endswith("_checkpoints") and got.shape != baseline[key].shape:  # replay=False: every step
                got = got[REPLAY_STEPS - 1::REPLAY_STEPS]
            assert torch.equal(got, baseline[key]), f"{name} {dtype} {layout}: {key} differs"


def test_the_default_layouts_cover_every_layout_and_model():
    """By default each layout of a dtype runs on exactly one model and each model runs some layout of each dtype
    (with --slow, every model every layout)."""
    for dtype, layouts in LAYOUTS.items():
        runs = [layout for name in MODELS for layout in layouts_of(name, dtype)]
        assert sorted(map(str, runs)) == sorted(map(str, layouts * (len(MODELS) if profile() == "slow" else 1)))
    for dtype in NATIVE_TOLERANCE:
        runs = [layout for name in NATIVE_MODELS for layout in native_layouts_of(name, dtype)]
        assert sorted(map(str, runs)) == sorted(map(str, NATIVE_LAYOUTS[1:] * (2 if profile() == "slow" else 1)))


def test_layout_choice_falls_back_for_odd_sizes_and_misaligned_views():
    big = torch.zeros(1 << 20)
    assert choose_layout(1 << 20, torch.float32, [big]) == Layout(lanes=2, vector=True)
    assert choose_layout((1 << 20) - 4, torch.float32, [big[2:(1 << 20) - 2]]) == Layout(lanes=2, vector=True)
    assert choose_layout(1 << 20, torch.float64, [big.double()]) == Layout(lanes=2, vector=True), "16-byte next"
    assert choose_layout((1 << 20) - 1, torch.float32, [big]).vector is False
    assert choose_layout(1 << 20, torch.float32, [big[1:(1 << 20) - 3]]).vector is False
    assert choose_layout(1000, torch.float32, [big]).vector is False, "too few threads: keep one per neuron"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_long_loops_stage_two_neurons_per_thread_where_nothing_is_timed(dtype):
    """Many steps over few neurons, on the host runner (as under CUDA graph capture): both kernels run two
    neurons per thread in one vector access, 64 threads per block, unrolled, 16 steps of inputs staged in
    registers (runtime.neuron_launch.LONG_LOOP_LANES, LONG_LOOP); too few neurons for that, one per thread."""
    long = Layout(block=64, unroll=8, replay=32, staged=16)  # replayed states (not LIF's) in 32-step segments
    for n, lanes in ((2 * MIN_THREADS, 2), (2 * MIN_THREADS - 2, 0)):
        config = _lif_run(LONG_LOOP_STEPS, n, dtype)
        chosen = {kind: layout for kind, _, _, layout in config._recipes}
        expected = long.replace(lanes=lanes, vector=True) if lanes else long  # below: the kernel's default lanes
        assert chosen == {"fptt": expected, "bptt": expected}, n
        staged = ["software pipeline in registers" in recipe.kernel.full_codes for recipe in config._recipes.values()]
        assert staged == [lanes > 0] * 2, "staging needs vector accesses"


def test_short_loops_unroll_twice_over_many_neurons_and_four_times_over_few():
    """Below LONG_LOOP_STEPS with enough neurons for vector accesses, both kernels unroll the time loop twice
    (runtime.neuron_launch.SHORT_LOOP); too few neurons for two per thread unroll it four times (SMALL_LOOP)."""
    for n, expected in ((2 * MIN_THREADS * 2, Layout(lanes=2, vector=True, unroll=2)), (1000, Layout(unroll=4))):
        config = _lif_run(3, n, torch.float32)
        chosen = {kind: layout for kind, _, _, layout in config._recipes}
        expected = expected.replace(replay=3)  # three steps: one replay segment of T steps (`_layout`)
        assert chosen == {"fptt": expected, "bptt": expected}, n


# Native packed arithmetic rounds every operation to 11 (float16) or 8 (bfloat16) significant bits instead of 24:
# results agree with float arithmetic to a few units of the storage precision, relative to the values' size.
NATIVE_TOLERANCE = {torch.float16: 2e-2, torch.bfloat16: 8e-2}


@pytest.mark.parametrize("dtype", list(NATIVE_TOLERANCE), ids=str)
@pytest.mark.parametrize("name", NATIVE_MODELS)
def test_native_packed_arithmetic_agrees_with_float(name, dtype):
    spec = load_spec(name)
    reference = _run_all(spec, dtype, NATIVE_LAYOUTS[0])
    layouts = native_layouts_of(name, dtype)
    assert layouts, "every model runs some native layout in every dtype"
    for layout in layouts:
        result = _run_all(spec, dtype, layout)
        assert torch.equal(result["spike_seq"], reference["spike_seq"]), f"{name} {layout}: spikes differ"
        for key in reference:
            want, got = reference[key].double(), result[key].double()
            scale = want.abs().max().clamp(min=1.0)
            assert (got - want).abs().max() <= NATIVE_TOLERANCE[dtype] * scale, f"{name} {layout}: {key}"


def test_spec_names_cannot_collide_with_kernel_locals():
    """Names a template could also use (d, row, n0, t0, stage) are fine in a spec: its names carry usr_ in C."""
    baseline = _run_all(CLASH, torch.float32, CLASH_LAYOUTS[0])
    for layout in CLASH_LAYOUTS[1:]:
        result = _run_all(CLASH, torch.float32, layout)
        for key in baseline:
            assert torch.equal(result[key], baseline[key]), f"{layout}: {key}"


@pytest.mark.parametrize("kind", ["fptt", "bptt"])
def test_invariants_of_scalar_parameters_take_one_register_whatever_the_lanes(kind):
    """Coefficients of scalar parameters alone (TwoCompartment's: sqrt, expm1, sin of its parameters) are computed
    once per thread into one register; those of a tensor parameter differ by lane and stay per lane."""
    source = neuron_kernel(load_spec("two_compartment"), kind, "float32", lanes=4, vector=True).full_codes
    constants = re.findall(r"const float (ac_kc?\d+) = ", source)
    assert len(constants) > 10 and not any(f"{name}[" in source for name in constants)
    source = neuron_kernel(load_spec("parametric_lif"), kind, "float32", per_neuron=["w"], lanes=4,
                           vector=True).full_codes
    assert re.search(r"ac_kc?\d+\[lane\] = \(1\.0f / \(1\.0f \+ expf\(\(?-?ac_param_usr_w\[lane\]", source)
    assert not re.search(r"const float ac_kc?\d+ = ", source)


def test_staged_inputs_fit_the_register_budget_and_need_vector_accesses():
    """`staged` keeps blocks of inputs in registers: halved until they fit STAGED_WORDS, none without vector
    accesses, without a time loop or in replayed segments; and it is one way of loading ahead, the ring another."""
    from autocuda.codegen.neuron_kernel import STAGED_WORDS

    def staged(name, kind, **layout):
        return neuron_kernel(load_spec(name), kind, "float32", **layout).plan.staged

    assert STAGED_WORDS == 128  # the arithmetic below
    assert staged("lif", "fptt", lanes=1, vector=True, staged=32) == 32  # 1 input x 1 word x 2 blocks x 32 steps
    assert staged("lif", "bptt", lanes=2, vector=True, staged=32) == 16  # 2 inputs x 2 words x 2 blocks: 32 take 256
    assert staged("lif", "bptt", lanes=4, vector=True, staged=32, staged_blocks=3) == 4
    assert staged("lif", "fptt", lanes=2, staged=32) == 0, "element by element: nothing staged"
    assert staged("lif", "step-forward", lanes=1, vector=True, staged=32) == 0, "no time loop"
    assert staged("alif", "bptt", lanes=1, vector=True, staged=32) == 0, "replayed segments load their own way"
    assert staged("alif", "fptt", lanes=1, vector=True, staged=32) == 32
    lif = load_spec("lif")
    with pytest.raises(ValueError, match="two ways of loading ahead"):
        neuron_kernel(lif, "fptt", prefetch=8, staged=8)
    for bad in ({"staged": True}, {"staged": -1}, {"staged": 8, "staged_blocks": 0}):
        with pytest.raises(ValueError, match="staged"):
            neuron_kernel(lif, "fptt", **bad)


@pytest.mark.parametrize("bad", [{"lanes": -1}, {"lanes": 1000}, {"unroll": 0}, {"unroll": -2}, {"block": 0},
                                 {"block": 1.5}, {"block": 5000}, {"prefetch": -1}, {"replay": 10**7},
                                 {"vector": 1}, {"native": "yes"}])
def test_layout_numbers_outside_what_a_kernel_runs_are_refused_by_name(bad):
    """A layout is a caller's (`neuron_kernel`, `source`, `check_spec(layout=...)`): each number is an int within its
    bounds, or the kernel is refused naming it. Before, lanes=-1 printed C the compiler rejected, block=0 divided by
    zero at the launch, unroll=0 and block=1.5 printed a kernel, replay=10**7 sized register arrays by it."""
    name = next(iter(bad))
    with pytest.raises(ValueError, match=f"^{name}: "):
        neuron_kernel(load_spec("alif"), "bptt", **bad)


def test_repeated_calls_build_no_layout_after_the_first(monkeypatch):
    """A call's layout is looked up, not built: a call shorter than a replay segment (T < REPLAY_STEPS) once built
    a new Layout on every launch, which cost more host time than the rest of a small call."""
    from autocuda.call.functional import multi_step

    x = (torch.randn(3, 2 * MIN_THREADS) * 2).requires_grad_(True)  # enough neurons for vector accesses

    def calls():
        multi_step("lif", x, tau=2.0, backend="host")[0].sum().backward()
        with torch.no_grad():
            multi_step("lif", x, tau=2.0, backend="host")
    calls()
    built = []
    original = Layout.__post_init__
    monkeypatch.setattr(Layout, "__post_init__", lambda self: (built.append(self), original(self))[1])
    for _ in range(3):
        calls()
    assert built == []
