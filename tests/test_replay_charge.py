"""A replayed charge (`save_h=False`): forward saves no h, only every state every K steps, and backward replays each
segment's steps from x. The replay must rebuild forward's values bit for bit (the spikes it decides are forward's),
so the gradients are those of the kernels that save h, up to the rounding of backward's own coefficients.

With --slow every shipped spec replays its charge in float64; by default a covering set of them does
(`replay_specs`): conftest's REPRESENTATIVE_SPECS, the low-precision test's specs, and specs added in turn until
every fact of a spec that shapes the replay's code (`replay_facts`: how many states and inputs it has, its reset
rule, multi-level spikes, an output other than the spike, per-neuron tensors, state updates, derived values, an ODE
solved exactly, jumps) that some shipped spec has is held by one of them
(`test_the_default_specs_hold_every_replay_fact_of_the_shipped_specs`). The replay prints forward's step with
forward's printer (`kernel_plans._replay_charge`), so what one spec's equations add beyond these facts is checked by
test_host_neurons on every spec's forward kernel; the slow profile replays each."""
from __future__ import annotations

import functools

import pytest
import torch
from conftest import REPRESENTATIVE_SPECS, compile_launched, profile

import autocuda.call.functional as F
from autocuda.codegen.kernels import source
from autocuda.codegen.neuron_kernel import REPLAY_STEPS
from autocuda.runtime.neuron_launch import NeuronConfig
from autocuda.spec.draws import makes_draws
from autocuda.spec.load import list_specs, load_spec
from autocuda.tools.testing.named_launch import backward, forward

K = REPLAY_STEPS
# a spec that draws cannot replay its charge (the replay would not make the draws again): refused, by design
SPECS = [name for name, _ in list_specs() if not makes_draws(load_spec(name))]
LOW_PRECISION_SPECS = ["lif", "alif", "izhikevich", "ternary_lif"]


def replay_facts(name: str) -> frozenset[tuple[str, object]]:
    """The facts of a spec that change the code of its replay (the histories kept, the inputs loaded, the reset,
    the spike's levels and the step's parts), read from the spec alone (no derivation)."""
    spec = load_spec(name)
    return frozenset({("states", min(len(spec.states), 3)), ("inputs", min(len(spec.inputs), 2)),
                      ("reset", spec.reset), ("levels", bool(spec.levels)), ("output is the spike", spec.output == "s"),
                      ("tensor parameters", any(p.kind == "tensor" for p in spec.params)),
                      ("updates", bool(spec.updates)), ("derived", bool(spec.derived)), ("ode", bool(spec.ode)),
                      ("jumps", bool(spec.jumps))})


def replay_specs() -> list[str]:
    """The specs whose charge the profile replays (module doc): all with --slow; by default the representative and
    low-precision specs, then, in SPECS' order, each spec that holds a fact none of those before it holds."""
    if profile() == "slow":
        return SPECS
    chosen = [name for name in SPECS if name in REPRESENTATIVE_SPECS or name in LOW_PRECISION_SPECS]
    held = set().union(*map(replay_facts, chosen))
    for name in SPECS:
        if not replay_facts(name) <= held:
            chosen.append(name)
            held |= replay_facts(name)
    return [name for name in SPECS if name in chosen]


def _run(name: str, dtype: torch.dtype, steps: int, replay_charge: bool, store_state_seq: bool = False) -> dict:
    spec = load_spec(name)
    config = NeuronConfig(spec, spec.surrogate, spec.reset, replay_charge=replay_charge)
    gen = torch.Generator().manual_seed(steps)
    n = 10
    xs = {f"{u}_seq": (torch.randn(steps, n, generator=gen) * 1.5 + 0.5).to(dtype) for u in spec.inputs}
    init = {s.name: (0.3 * torch.randn(n, generator=gen)).to(dtype) for s in spec.states}
    params = {p.name: p.default for p in spec.params}
    x = xs["x_seq"] if len(xs) == 1 else [xs[f"{u}_seq"] for u in spec.inputs]
    out = forward(config, x, init, params, backend="host", layout={"lanes": 2}, store_state_seq=store_state_seq)
    grads = {"grad_spike_seq": torch.randn(steps, n, generator=gen).to(dtype),
             **{f"grad_{s.name}_final": torch.randn(n, generator=gen).to(dtype) for s in spec.states}}
    saved = {**out, **{f"{k}_init": v for k, v in init.items()}, **xs}
    return out | backward(config, grads, saved, params, backend="host", layout={"lanes": 2})


SEGMENT_STEPS = (1, K - 1, K + 1, 3 * K + 5)  # sequences around the segment size
LOW_PRECISION = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels() -> int:
    """The kernels `_run` launches below, and those of the functional and layer tests (their calls, run with the
    launches recorded), compiled up front many to a compiler run (`conftest.compile_launched`)."""
    runs = [(name, torch.float64, steps, replay) for name in replay_specs() for steps in SEGMENT_STEPS
            for replay in (0, 1)]
    runs += [(name, dtype, 2 * K + 3, replay) for name in LOW_PRECISION_SPECS for dtype in LOW_PRECISION
             for replay in (0, 1)]
    calls = [functools.partial(_run, name, dtype, steps, bool(replay)) for name, dtype, steps, replay in runs]
    calls += [functools.partial(_run, "izhikevich", torch.float32, 3 * K + 2, True, True),
              test_functional_save_h_keeps_x_not_h, test_layers_take_save_h,
              *(functools.partial(test_calls_shorter_than_a_segment_replay_one_segment, steps) for steps in (4, K + 4)),
              *(functools.partial(test_fused_batchnorm_replays_h_in_float32_and_keeps_it_in_half, dtype, 0)
                for dtype in (torch.float32, torch.bfloat16)),
              *(functools.partial(test_functional_save_h_with_several_inputs_and_recompute, recompute)
                for recompute in (False, True))]
    return compile_launched(*calls)


@pytest.mark.parametrize("name", SPECS)
def test_every_shipped_spec_replays_its_charge(name):
    """float64, sequences around the segment size: forward's outputs bitwise, gradients to rounding (by default
    the specs of `replay_specs`; every spec with --slow)."""
    if name not in replay_specs():
        pytest.skip("the default specs hold its replay's facts (module doc): runs with --slow")
    for steps in SEGMENT_STEPS:
        saved, replayed = _run(name, torch.float64, steps, False), _run(name, torch.float64, steps, True)
        assert "h_seq" in saved and "h_seq" not in replayed
        assert all(f"{s.name}_checkpoints" in replayed for s in load_spec(name).states)
        for key, value in saved.items():
            if key == "h_seq" or key.endswith("_checkpoints") or (key.endswith("_seq") and key not in replayed):
                continue  # what forward saves for backward (h, a state's sequence), replayed from checkpoints
            if key.startswith("grad_"):
                torch.testing.assert_close(replayed[key], value, rtol=1e-12, atol=1e-12, equal_nan=True, msg=key)
            else:
                assert torch.allclose(replayed[key], value, rtol=0, atol=0, equal_nan=True), (name, steps, key)


def test_the_default_specs_hold_every_replay_fact_of_the_shipped_specs():
    """Every fact of `replay_facts` that a shipped spec has, a spec the default profile replays has too, and the
    default specs are the representative and low-precision specs and one more spec per fact they lack at most."""
    default = [name for name in SPECS if name in REPRESENTATIVE_SPECS or name in LOW_PRECISION_SPECS]
    chosen = replay_specs()
    assert set(default) <= set(chosen) <= set(SPECS)
    held = set().union(*map(replay_facts, chosen))
    assert held == set().union(*map(replay_facts, SPECS))
    assert profile() == "slow" or len(chosen) - len(default) <= len(held - set().union(*map(replay_facts, default)))


@pytest.mark.parametrize("dtype", LOW_PRECISION, ids=str)
@pytest.mark.parametrize("name", LOW_PRECISION_SPECS)
def test_low_precision_replays_decide_forward_spikes(name, dtype):
    """In float16 and bfloat16 the saved h is rounded to the storage, the replayed one is not: the spikes and
    states agree bitwise, the gradients closely (the replay's are the more exact)."""
    saved, replayed = _run(name, dtype, 2 * K + 3, False), _run(name, dtype, 2 * K + 3, True)
    for key in ("spike_seq", *(f"{s.name}_final" for s in load_spec(name).states)):
        assert torch.equal(replayed[key], saved[key]), key
    tolerance = 1e-6 if dtype == torch.float32 else 6e-2
    torch.testing.assert_close(replayed["grad_x_seq"].float(), saved["grad_x_seq"].float(), rtol=tolerance,
                               atol=tolerance)


def test_checkpoints_are_the_states_every_k_steps():
    steps = 3 * K + 2
    out = _run("izhikevich", torch.float32, steps, True, store_state_seq=True)
    for state in ("v", "w"):
        assert out[f"{state}_checkpoints"].shape == (steps // K, 10)
        torch.testing.assert_close(out[f"{state}_checkpoints"], out[f"{state}_seq"][K - 1::K], rtol=0, atol=0)


def test_sources_save_no_h_and_backward_reads_x():
    spec = load_spec("lif")
    fptt = source(spec, "fptt", "float32", replay_charge=True)
    bptt = source(spec, "bptt", "float32", replay_charge=True)
    assert "h_seq" not in fptt and f"if (t % {K} == {K - 1} && t + 1 < T)" in fptt and "usr_v_checkpoints" in fptt
    assert "h_seq" not in bptt and "const float* __restrict__ x_seq" in bptt
    assert "ac_hist_h[ac_k][lane] = ac_h;" in bptt, "h comes from the replay"
    assert "h_seq" in source(spec, "step-forward", "float32", replay_charge=True), "single steps are unchanged"
    assert fptt != source(spec, "fptt", "float32") and "h_seq" in source(spec, "bptt", "float32")
    with pytest.raises(ValueError, match="native packed arithmetic"):
        source(spec, "fptt", "bfloat16", replay_charge=True, native=True, lanes=2)


def test_functional_save_h_keeps_x_not_h():
    x = (torch.randn(2 * K + 1, 4, 3, dtype=torch.float64) * 2 + 0.5).requires_grad_(True)
    kept = []

    def pack(t):
        kept.append(t)
        return t
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        spikes, finals, _ = F.multi_step("parametric_lif", x, backend="host", save_h=False)
    assert any(t.data_ptr() == x.data_ptr() and t.numel() == x.numel() for t in kept), "x is kept"
    sequences = [t for t in kept if t.shape[0] == x.shape[0] and t.data_ptr() != x.data_ptr()]
    assert not sequences, "nothing of x's length besides x"
    want, want_finals, _ = F.multi_step("parametric_lif", x, backend="reference")
    assert torch.equal(spikes, want)
    g = torch.randn_like(spikes)
    got_grad = torch.autograd.grad([spikes, finals[0]], x, [g, torch.ones_like(finals[0])])[0]
    want_grad = torch.autograd.grad([want, want_finals[0]], x, [g, torch.ones_like(want_finals[0])])[0]
    torch.testing.assert_close(got_grad, want_grad)


def test_save_h_must_be_a_bool():
    with pytest.raises(TypeError, match="save_h: expected True or False"):
        F.multi_step("lif", torch.rand(3, 4), backend="host", save_h=0)


def test_layers_take_save_h():
    import autocuda.nn as ann

    x = (torch.rand(K + 3, 2, 5, dtype=torch.float64) * 2).requires_grad_(True)
    results = []
    for save_h in (True, False):
        layer = ann.Neuron("alif", step_mode="m", backend="host", save_h=save_h)
        spikes = layer(x)
        results.append((spikes, layer.v, torch.autograd.grad(spikes.sum() + layer.a.sum(), x)[0]))
        assert ("save_h=False" in repr(layer)) == (not save_h)
    for saved, replayed in zip(*results):
        torch.testing.assert_close(replayed, saved, rtol=1e-12, atol=1e-12)
    with pytest.raises(TypeError, match="save_h: expected True or False"):
        ann.Neuron("lif", save_h=None)


@pytest.mark.parametrize("steps", [4, K + 4])
def test_calls_shorter_than_a_segment_replay_one_segment(steps):
    """A call of T < K steps replays one segment of T steps (no step tested against T) from the initial states and
    keeps no checkpoint row (the one after its last step would be the final states); a call of K + 4 steps keeps one,
    after step K - 1. The op's fake kernel (torch.compile) shapes them alike."""
    x = (torch.rand(steps, 6, dtype=torch.float64) * 2).requires_grad_(True)
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        F.multi_step("alif", x, backend="host", save_h=False)
    rows = {tuple(t.shape) for t in kept if t.dim() == 2 and t.shape[0] != steps}
    assert rows == {((steps - 1) // min(steps, REPLAY_STEPS), 6)}, rows


def test_compiled_layer_with_save_h_equals_eager():
    import autocuda.nn as ann

    eager, compiled_layer = (ann.Neuron("alif", step_mode="m", backend="host", save_h=False) for _ in range(2))
    # Inductor with --slow; by default AOTAutograd without Inductor's code generation (`aot_eager`), which decides
    # what the compiled graph saves and replays; our op meets Inductor itself in test_batchnorm's and
    # test_memory_order's default compiles
    compiled = torch.compile(compiled_layer, fullgraph=True, backend="inductor" if profile() == "slow" else "aot_eager")
    # Each length is a compile (seconds): by default the one of several segments; a compiled call shorter than a
    # segment, replaying h, is also test_gradient_passes' test_fused_layer_in_two_passes_compiles[dynamic].
    for steps in (4, 2 * K + 1) if profile() == "slow" else (2 * K + 1,):
        x = torch.rand(steps, 3, 4, dtype=torch.float64) * 2
        a, b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        eager.reset()
        compiled_layer.reset()
        want, got = eager(a), compiled(b)
        assert torch.equal(got, want)
        want.sum().backward()
        got.sum().backward()
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("dtype", "others"), [(torch.float32, 0), (torch.bfloat16, 1)], ids=str)
def test_fused_batchnorm_replays_h_in_float32_and_keeps_it_in_half(dtype, others):
    import autocuda.nn as ann

    layer = ann.BatchNormNeuron(3, ann.Neuron("lif", step_mode="m", backend="host")).to(dtype)
    x = (torch.randn(4, 2, 3, 5, 5) + 1).to(dtype).requires_grad_(True)
    kept = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: kept.append(t) or t, lambda t: t):
        layer(x)
    large = {t.data_ptr() for t in kept if t.numel() == x.numel() and t.data_ptr() != x.data_ptr()}
    assert len(large) == others


# An Inductor compile (seconds) whose case the default run checks in test_gradient_passes'
# test_fused_layer_in_two_passes_compiles[dynamic]: a fused layer (replaying h) compiled with dynamic shapes, on
# sequences on both sides of the segment size.
@pytest.mark.skipif(profile() != "slow", reason="test_gradient_passes' dynamic compile covers it: runs with --slow")
def test_fused_batchnorm_compiles_with_dynamic_shapes():
    """Symbolic sizes (torch.compile's dynamic shapes) pass the parameters' broadcast check, and sequences on
    both sides of the segment size replay alike."""
    import copy

    import autocuda.nn as ann

    layer = ann.BatchNormNeuron(4, ann.LIFNode(step_mode="m", backend="host")).double()
    other = copy.deepcopy(layer)
    compiled = torch.compile(other, fullgraph=True, dynamic=True)
    for shape in [(4, 3, 4, 5, 6), (K + 3, 2, 4, 3, 3)]:
        x = torch.randn(*shape, dtype=torch.float64)
        a, b = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
        layer.reset()
        other.reset()
        want, got = layer(a), compiled(b)
        assert torch.equal(got, want)
        want.sum().backward()
        got.sum().backward()
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("recompute", [False, True], ids=["once", "recompute"])
def test_functional_save_h_with_several_inputs_and_recompute(recompute):
    """Every step input is kept and replayed (conductance LIF's g_e and g_i), also under recompute."""
    gen = torch.Generator().manual_seed(4)
    inputs = [(torch.rand(K + 5, 6, generator=gen, dtype=torch.float64) * 2).requires_grad_(True) for _ in range(2)]
    results = []
    for save_h in (True, False):
        spikes, finals, _ = F.multi_step("conductance_lif", tuple(inputs), backend="host", save_h=save_h,
                                         recompute=recompute)
        results.append((spikes, *finals, *torch.autograd.grad(spikes.sum() + finals[0].sum(), inputs)))
    assert results[0][0].sum() > 0
    for saved, replayed in zip(*results):
        torch.testing.assert_close(replayed, saved, rtol=1e-12, atol=1e-12)
