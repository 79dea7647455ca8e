"""autocuda.functional on the CPU (the torch reference path): shapes, dtypes, defaults, reset rules,
detach_reset, multi-step == stepped single steps, learnable parameters, and argument errors."""
from __future__ import annotations

import functools
import math

import pytest
import torch
from conftest import compile_launched

from autocuda.call import functional as F
from autocuda.call import program
from autocuda.runtime.neuron_launch import KIND_OPTIONS
from autocuda.spec.draws import makes_draws
from autocuda.spec.load import list_specs, load_spec

SPECS = [name for name, _ in list_specs()]
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def inputs(*shape: int, dtype=torch.float64, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=g, dtype=torch.float64) * 1.6 - 0.3).to(dtype)


def spec_inputs(name: str, *shape: int, dtype=torch.float64, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """One random sequence per step input of the spec (x alone for most)."""
    return tuple(inputs(*shape, dtype=dtype, seed=seed + i) for i in range(len(load_spec(name).inputs)))


def given(xs: tuple[torch.Tensor, ...]) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """What a call passes: x alone, or the tuple of a spec's several inputs."""
    return xs[0] if len(xs) == 1 else xs


@pytest.mark.parametrize("name", SPECS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_shapes_and_dtypes(name: str, dtype: torch.dtype):
    xs = spec_inputs(name, 4, 2, 3, dtype=dtype)
    x = xs[0]
    spikes, finals, seqs = F.multi_step(name, given(xs), store_state_seq=True)
    states = load_spec(name).states
    assert spikes.shape == x.shape and spikes.dtype == dtype
    assert len(finals) == len(seqs) == len(states)
    for final, seq in zip(finals, seqs):
        assert final.shape == (2, 3) and final.dtype == dtype
        assert seq.shape == x.shape and seq.dtype == dtype
        assert torch.equal(seq[-1], final)
    assert set(spikes.unique().tolist()) <= {0.0, 1.0}
    assert F.multi_step(name, given(xs))[2] is None


# a spec that draws is left out: each call draws anew, so single steps make other draws than one sequence's
@pytest.mark.parametrize("name", [name for name in SPECS if not makes_draws(load_spec(name))])
def test_multi_step_equals_stepped_single_steps(name: str):
    xs = spec_inputs(name, 5, 7, seed=1)
    spikes, finals, _ = F.multi_step(name, given(xs))
    states: tuple = ()
    stepped = []
    for xt in zip(*xs):
        spike, states = F.single_step(name, given(xt), *states)
        stepped.append(spike)
    assert torch.equal(torch.stack(stepped), spikes)
    for a, b in zip(states, finals):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def lif_by_hand(x: torch.Tensor, tau: float, v_th: float, v_reset: float | None) -> tuple[torch.Tensor, ...]:
    v = torch.full_like(x[0], 0.0 if v_reset is None else v_reset)
    spikes, vs = [], []
    for xt in x:
        h = v + (xt - (v - (v_reset or 0.0))) / tau
        s = (h >= v_th).to(x.dtype)
        v = h - s * v_th if v_reset is None else h * (1 - s) + v_reset * s
        spikes.append(s)
        vs.append(v)
    return torch.stack(spikes), torch.stack(vs)


@pytest.mark.parametrize("v_reset", [0.0, -0.2, None], ids=["hard0", "hard-0.2", "soft"])
def test_lif_reset_rules_match_the_formulas(v_reset: float | None):
    x = inputs(12, 9, seed=2) * 2
    spikes, (v,), (v_seq,) = F.multi_step("lif", x, tau=3.0, v_threshold=0.8, v_reset=v_reset, store_state_seq=True)
    want_spikes, want_v = lif_by_hand(x, 3.0, 0.8, v_reset)
    assert spikes.sum() > 0
    assert torch.equal(spikes, want_spikes)
    torch.testing.assert_close(v_seq, want_v)
    if v_reset is None:  # v_reset=None is the same as asking for the soft rule
        assert torch.equal(F.multi_step("lif", x, tau=3.0, v_threshold=0.8, reset="soft")[1][0], v)


def test_integer_parameters_run_as_their_float_values():
    x = inputs(6, 10, dtype=torch.float32, seed=3) * 2
    want = F.multi_step("lif", x, tau=2.0, v_threshold=1.0, v_reset=0.0, backend="host")
    for given in ({"tau": 2, "v_threshold": 1, "v_reset": 0}, {"tau": 2, "v_threshold": 1.0, "v_reset": 0.0}):
        spikes, (v,), _ = F.multi_step("lif", x, backend="host", **given)
        assert torch.equal(spikes, want[0]) and torch.equal(v, want[1][0]), given


def test_initial_state_defaults_follow_the_spec():
    x = torch.zeros(1, 3, dtype=torch.float64)
    # QIF starts at v_reset (-0.1) under a hard reset, at 0 under a soft one; h = v + (x + (v - 0)(v - 0.8)) / 2
    (_, (v_hard,), _), (_, (v_soft,), _) = F.multi_step("qif", x), F.multi_step("qif", x, v_reset=None)
    torch.testing.assert_close(v_hard, torch.full((3,), -0.1 + (-0.1 * -0.9) / 2, dtype=torch.float64))
    torch.testing.assert_close(v_soft, torch.zeros(3, dtype=torch.float64))


def test_detach_reset_cuts_only_the_reset_path():
    x = inputs(6, 5, seed=3).requires_grad_()
    grads = {}
    for detach in (False, True):
        spikes, (v,), _ = F.multi_step("lif", x, detach_reset=detach)
        grads[detach] = torch.autograd.grad(spikes.sum() + v.sum(), x)[0]
    assert not torch.allclose(grads[False], grads[True])
    # by hand: the spike inside v = h (1 - s) is a constant for backward
    xh = x.detach().clone().requires_grad_()
    v, total = torch.zeros(5, dtype=torch.float64), 0
    from autocuda.spec.surrogate import Sigmoid
    for xt in xh:
        h = v + (xt - v) / 2
        s = Sigmoid()(h - 1.0)
        v = h * (1 - s.detach())
        total = total + s.sum()
    torch.testing.assert_close(torch.autograd.grad(total + v.sum(), xh)[0], grads[True])


def test_learnable_parameter_broadcast_per_channel():
    x = inputs(5, 2, 3, 4, seed=4)
    w = torch.nn.Parameter(torch.tensor([[0.5], [-0.2], [0.1]], dtype=torch.float32))  # [C, 1] over [B, C, W]
    spikes, (v,), _ = F.multi_step("parametric_lif", x.float(), w=w)
    (spikes.sum() + v.sum()).backward()
    assert w.grad is not None and w.grad.shape == w.shape and w.grad.dtype == torch.float32
    # the same with the channel values written out per neuron
    w_full = w.detach().expand(2, 3, 4).clone().requires_grad_()
    spikes2, (v2,), _ = F.multi_step("parametric_lif", x.float(), w=w_full)
    (spikes2.sum() + v2.sum()).backward()
    assert torch.equal(spikes, spikes2)
    torch.testing.assert_close(w.grad, w_full.grad.sum(dim=(0, 2)).unsqueeze(-1))


def test_any_parameter_tensor_requiring_grad_is_learnable():
    x = inputs(6, 4, seed=5)
    tau = torch.tensor(2.5, dtype=torch.float64, requires_grad=True)
    spikes, (v,), _ = F.multi_step("lif", x, tau=tau)
    (v.sum() + spikes.sum()).backward()
    assert tau.grad is not None and torch.isfinite(tau.grad)
    assert torch.equal(spikes, F.multi_step("lif", x, tau=2.5)[0])


def test_given_states_are_used_and_not_modified():
    x = inputs(3, 4, seed=6)
    v0, w0 = torch.full((4,), 0.5, dtype=torch.float64), torch.full((4,), 0.2, dtype=torch.float64)
    _, finals, _ = F.multi_step("izhikevich", x, v0, w0, a=0.1, b=0.2)
    assert torch.equal(v0, torch.full((4,), 0.5, dtype=torch.float64))
    assert not torch.equal(finals[0], F.multi_step("izhikevich", x, a=0.1, b=0.2)[1][0])


def test_empty_sequence_returns_empty_results():
    x = torch.zeros(0, 3, 2)
    v0 = torch.ones(3, 2)
    spikes, (v,), (v_seq,) = F.multi_step("lif", x, v0, store_state_seq=True)
    assert spikes.shape == (0, 3, 2) and v_seq.shape == (0, 3, 2)
    assert torch.equal(v, v0)
    spikes, finals, _ = F.multi_step("izhikevich", x)
    assert [f.shape for f in finals] == [(3, 2), (3, 2)]


def test_single_step_accepts_any_shape():
    spike, (v,) = F.single_step("if", torch.tensor(1.5))
    assert spike.shape == () and spike.item() == 1.0 and v.item() == 0.0


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.bool, torch.complex64], ids=str)
def test_non_float_inputs_are_refused(dtype):
    with pytest.raises(TypeError, match="x_seq: expected a floating dtype"):
        F.multi_step("lif", torch.zeros(2, 3, dtype=dtype))


@pytest.mark.parametrize(("call", "error", "match"), [
    (lambda: F.multi_step("lif", torch.zeros(3)), ValueError, r"x_seq: expected a tensor of shape \[T, \*\]"),
    (lambda: F.multi_step("lif", [[0.0]]), TypeError, "x_seq: expected a torch.Tensor"),
    (lambda: F.multi_step("lif", torch.zeros(2, 3), torch.zeros(4)), ValueError, "state 'v': expected shape"),
    (lambda: F.multi_step("lif", torch.zeros(2, 3), torch.zeros(3, dtype=torch.float64)), TypeError,
     "state 'v': expected dtype torch.float32"),
    (lambda: F.multi_step("lif", torch.zeros(2, 3), torch.zeros(3, device="meta")), ValueError,
     "state 'v': on meta"),
    (lambda: F.multi_step("lif", torch.zeros(2, 3), torch.zeros(3), torch.zeros(3)), TypeError, "has 1 states"),
    (lambda: F.multi_step("lif", torch.zeros(2, 3), taux=2.0), TypeError, "unknown parameter 'taux'.*tau"),
    (lambda: F.multi_step("lif", torch.zeros(2, 3), tau="2"), TypeError, "parameter 'tau': expected a number"),
    (lambda: F.multi_step("lif", torch.zeros(2, 3), tau=torch.ones(4)), ValueError, "parameter 'tau': shape"),
    (lambda: F.multi_step("lif", torch.zeros(2, 3), tau=torch.ones(3, device="meta")), ValueError,
     "parameter 'tau': on meta"),
    (lambda: F.multi_step("lif", torch.zeros(2, 3), tau=torch.ones(3, dtype=torch.int64)), TypeError,
     "parameter 'tau': expected a floating tensor"),
    (lambda: F.multi_step("lif", torch.zeros(2, 3), backend="tpu"), ValueError, "backend: expected"),
    (lambda: F.multi_step("no_such_neuron", torch.zeros(2, 3)), ValueError, "no shipped spec"),
    (lambda: F.multi_step(42, torch.zeros(2, 3)), TypeError, "spec: expected a NeuronSpec"),
    # switches given as words ("no" is true: they were turned on)
    (lambda: F.multi_step("lif", torch.zeros(2, 3), detach_reset="no"), TypeError, "^detach_reset: expected True"),
    (lambda: F.multi_step("lif", torch.zeros(2, 3), store_state_seq="no"), TypeError, "^store_state_seq: expected"),
    (lambda: F.multi_step("lif", torch.zeros(2, 3), final_states=0), TypeError, "^final_states: expected True"),
    (lambda: F.single_step("lif", torch.zeros(3), detach_reset="no"), TypeError, "^detach_reset: expected True"),
])
def test_argument_errors_name_the_argument(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_reduced_precision_runs_in_float32():
    # fp16 storage, fp32 arithmetic: the same spikes as float32 from the same (rounded) inputs
    x = inputs(8, 16, seed=7, dtype=torch.float16)
    spikes16, (v16,), _ = F.multi_step("eif", x)
    spikes32, (v32,), _ = F.multi_step("eif", x.float())
    assert torch.equal(spikes16.float(), spikes32)
    assert torch.equal(v16, v32.half())
    assert math.isfinite(v16.float().sum().item())


def _number_state_runs(name: str, dtype: torch.dtype) -> list[tuple[torch.Tensor, ...]]:
    """(spikes, finals, input gradient) from initial states given as numbers, then as tensors filled with them."""
    from autocuda.runtime.configs import get_config

    g = torch.Generator().manual_seed(5)
    x = (torch.randn(7, 9, generator=g) * 2 + 0.5).to(dtype)
    upstream = torch.randn(7, 9, generator=g).to(dtype)
    numbers = [0.1 * (i + 1) for i in range(len(get_config(name).state_names))]
    runs = []
    for states in (numbers, [torch.full((9,), v, dtype=dtype) for v in numbers]):
        xg = x.clone().requires_grad_(True)
        spikes, finals, _ = F.multi_step(name, xg, *states, backend="host")
        (grad,) = torch.autograd.grad([spikes, *finals], xg, [upstream, *(torch.ones_like(f) for f in finals)])
        runs.append((spikes, *finals, grad))
    return runs


def _final_state_runs(name: str, dtype: torch.dtype, x: torch.Tensor,
                      upstream: torch.Tensor) -> list[tuple[torch.Tensor, ...]]:
    """(spikes, stored sequences, input gradient, spikes without grad) with final states and without them."""
    runs = []
    for final_states in (True, False):
        xg = x.clone().requires_grad_(True)
        spikes, finals, seqs = F.multi_step(name, xg, backend="host", store_state_seq=True, final_states=final_states)
        assert (finals is None) is not final_states
        (grad,) = torch.autograd.grad(spikes, xg, upstream)
        with torch.no_grad():
            inferred, none, _ = F.multi_step(name, x, backend="host", final_states=final_states)
        runs.append((spikes, *seqs, grad, inferred))
    return runs


def _final_state_inputs(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(8)
    return (torch.randn(6, 3, 5, generator=g) * 2 + 0.5).to(dtype), torch.randn(6, 3, 5, generator=g).to(dtype)


def _long_input() -> torch.Tensor:
    return (torch.randn(80, 3, dtype=torch.float64) * 0.6 + 0.3).requires_grad_(True)


def _host_backward(name: str, x: torch.Tensor) -> None:
    spikes = F.multi_step(name, x, backend="host")[0]
    torch.autograd.grad(spikes, x, torch.ones_like(spikes))


NUMBER_STATE_CASES = [(name, dtype) for name in ("lif", "izhikevich", "alif")
                      for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64)]
FINAL_STATE_CASES = [(name, dtype) for name in ("lif", "izhikevich") for dtype in (torch.float32, torch.float16)]
LONG_SPECS = ["lif", "izhikevich", "alif"]


@pytest.fixture(scope="module")
def compiled_kernels() -> int:
    """The host kernels of the tests that take it, compiled up front many to a compiler run
    (`conftest.compile_launched`)."""
    calls = [functools.partial(_number_state_runs, name, dtype) for name, dtype in NUMBER_STATE_CASES]
    calls += [functools.partial(_final_state_runs, name, dtype, *_final_state_inputs(dtype))
              for name, dtype in FINAL_STATE_CASES]
    calls += [functools.partial(_host_backward, name, _long_input()) for name in LONG_SPECS]
    return compile_launched(*calls)


@pytest.mark.parametrize("name", LONG_SPECS)
def test_long_sequences_take_the_unrolled_kernels_and_match_the_reference(name: str, compiled_kernels):
    """T >= 64 with few neurons selects kernels whose time loop is unrolled (runtime.neuron_launch.LONG_LOOP); a
    backward that replays checkpoints (ALIF) runs segments of steps, each loop over a segment unrolled whole."""
    from autocuda.runtime import neuron_launch as neuron
    from autocuda.runtime.configs import get_config

    assert neuron.tuning.LONG_LOOP_STEPS <= 80
    x = _long_input()
    got, got_finals, _ = F.multi_step(name, x, backend="host")
    want, want_finals, _ = F.multi_step(name, x, backend="reference")
    torch.testing.assert_close(got, want)
    torch.testing.assert_close(got_finals, want_finals)
    g = torch.randn_like(got)
    torch.testing.assert_close(torch.autograd.grad(got, x, g)[0], torch.autograd.grad(want, x, g)[0])
    recipes = get_config(name)._recipes
    segments = f"ac_s0 -= {neuron.tuning.REPLAY}"
    used = {kind for (kind, _, _, layout), recipe in recipes.items()
            if layout.unroll > 1 and ("#pragma unroll 8" in recipe.kernel.full_codes
                                                       or segments in recipe.kernel.full_codes)}
    assert used >= {"fptt", "bptt"}


@pytest.mark.parametrize(("name", "dtype"), NUMBER_STATE_CASES, ids=str)
def test_number_initial_states_equal_filled_tensors(name, dtype, compiled_kernels):
    """Initial states given as numbers start the kernels from them (no tensor filled or read); the results are
    bitwise those of tensors filled with the numbers (rounded through the storage dtype alike), and backward
    gives the same input gradient without computing one for the numbers."""
    from autocuda.runtime.configs import get_config

    runs = _number_state_runs(name, dtype)
    for a, b in zip(*runs):
        assert torch.equal(a, b)
    recipes = get_config(name)._recipes
    given = {flags[KIND_OPTIONS[kind].index("given_inits")] for kind, _, flags, _ in recipes
             if kind in ("fptt", "bptt")}
    assert given == {False, True}


@pytest.mark.parametrize(("name", "dtype"), FINAL_STATE_CASES, ids=str)
def test_final_states_false_skips_them_and_changes_nothing_else(name, dtype, compiled_kernels):
    """`final_states=False` returns None for them, and its kernel has no final-state outputs; spikes, stored
    sequences and gradients are bitwise those of the default call, on the kernels and on the reference."""
    from autocuda.runtime.configs import get_config

    x, upstream = _final_state_inputs(dtype)
    runs = _final_state_runs(name, dtype, x, upstream)
    for a, b in zip(*runs):
        assert torch.equal(a, b)
    config = get_config(name)
    skipping = [key for key in config._kernels if key[0] == "fptt" and ("final_states", False) in key[2]]
    assert skipping and all(not any(p.endswith("_final") for p in config._kernels[k].cparams) for k in skipping)
    reference = F.multi_step(name, x.double(), backend="reference", final_states=False)
    assert reference[1] is None and torch.equal(reference[0], F.multi_step(name, x.double(), backend="reference")[0])
    assert F.multi_step(name, x[:0], backend="host", final_states=False)[1] is None


@pytest.mark.parametrize("final_states", [True, False])
def test_functional_call_by_name_under_torch_compile_matches_eager(final_states):
    """A function calling `multi_step` with a spec's name compiles whole (the layer is traced, not looked up)."""
    def run(x):
        return F.multi_step("izhikevich", x, backend="host", final_states=final_states)[:2]

    x = torch.randn(5, 8, generator=torch.Generator().manual_seed(9)) * 2 + 0.5
    compiled = torch.compile(run, fullgraph=True, backend="aot_eager")
    (got, got_finals), (want, want_finals) = compiled(x), run(x)
    assert torch.equal(got, want)
    if final_states:
        assert all(torch.equal(a, b) for a, b in zip(got_finals, want_finals, strict=True))
    else:
        assert got_finals is None and want_finals is None


def test_number_initial_states_single_step_and_modules():
    x = torch.randn(3, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(6)) * 2
    spike, (v,) = F.single_step("lif", x, 0.25, backend="host")
    want_spike, (want_v,) = F.single_step("lif", x, torch.full((3, 4), 0.25, dtype=torch.float64), backend="host")
    assert torch.equal(spike, want_spike) and torch.equal(v, want_v)
    spikes, (v_final, _), _ = F.multi_step("izhikevich", x[None], 0.25, torch.zeros(3, 4, dtype=torch.float64),
                                         backend="host")  # a number beside a tensor: filled
    want, (want_final, _), _ = F.multi_step("izhikevich", x[None], torch.full((3, 4), 0.25, dtype=torch.float64),
                                          torch.zeros(3, 4, dtype=torch.float64), backend="host")
    assert torch.equal(spikes, want) and torch.equal(v_final, want_final)
    with pytest.raises(TypeError, match="state 'v': expected a torch.Tensor or a number, got str"):
        F.multi_step("lif", x[None], "0", backend="host")


def test_per_channel_parameters_are_read_per_neuron_under_deterministic_algorithms() -> None:
    """A [C, 1, ...] parameter goes to the kernels as one value per channel (its gradient summed with atomics on
    a GPU), except under torch.use_deterministic_algorithms(True): then one value per neuron, summed by torch."""
    from autocuda.codegen.broadcast import PER_CHANNEL, PER_NEURON
    from autocuda.toolchain.host import cxx as toolchain

    w = torch.ones(3, 1, dtype=torch.float64)
    x = torch.rand(6, 2, 3, 5, dtype=torch.float64)
    assert program._kinds({"w": program._spread(w)}) == ({"w": PER_CHANNEL}, 2)
    assert program.PROGRAMS.find("parametric_lif", x, (), None, False, None, None, True, (False, False, True),
                                   {"w": w}).channel_dim == 2
    before = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert program._kinds({"w": program._spread(w)}) == ({"w": PER_NEURON}, 0)
        # an eager program made before, for the same call, is not reused: the flag is part of its key
        assert program.PROGRAMS.find("parametric_lif", x, (), None, False, None, None, True, (False, False, True),
                                   {"w": w}).channel_dim == 0
    finally:
        torch.use_deterministic_algorithms(before)
    if toolchain.missing() is not None:
        pytest.skip(f"host runner: {toolchain.missing()}")
    x = x * 2

    def step(deterministic: bool) -> list[torch.Tensor]:
        w = torch.linspace(-1, 1, 3, dtype=torch.float64).reshape(3, 1).requires_grad_()
        torch.use_deterministic_algorithms(deterministic)
        try:
            spikes, _, _ = F.multi_step("parametric_lif", x, backend="host", w=w)
            spikes.sum().backward()
        finally:
            torch.use_deterministic_algorithms(before)
        return [spikes.detach(), w.grad]

    fast, exact = step(False), step(True)
    assert torch.equal(fast[0], exact[0]) and fast[0].sum() > 0
    torch.testing.assert_close(fast[1], exact[1], rtol=1e-12, atol=1e-12)
