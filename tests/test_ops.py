"""The autocuda::neuron_* ops on the CPU: the generated kernels run through the host runner (backend "host")
and must give the reference's spikes, states and gradients (autograd through the torch reference), for LIF,
PLIF (learnable w, shared and per channel), Izhikevich and ALIF in float32 and float64; `opcheck` on every op
form; what backward saves; the key registry."""
from __future__ import annotations

import functools

import pytest
import torch
from backends import NEEDS_HOST
from conftest import compile_launched, profile

from autocuda.call import functional as F
from autocuda.call import native, ops
from autocuda.runtime.configs import get_config, resolve_spec

# Relative to the largest magnitude of each compared tensor: float64 kernels and the reference differ by op
# order only; float32 adds one rounding per operation over a few steps.
TOLERANCE = {torch.float64: 1e-10, torch.float32: 2e-5}
PARAMS = {"lif": {"tau": 2.5}, "parametric_lif": {}, "izhikevich": {"a": 0.3, "b": 0.2, "tau_w": 3.0},
          "alif": {"beta": 0.3, "tau_a": 5.0}}
CASES = [("lif", "hard", False), ("lif", "soft", True), ("parametric_lif", "hard", False),
         ("izhikevich", "hard", False), ("izhikevich", "soft", True), ("alif", "hard", True)]


# (single, store, finals) of the forward op's opcheck; (steps, checkpoint interval) of ALIF's long loops
OPCHECK_FORWARD = [(False, False, True), (False, True, True), (False, False, False), (True, False, True)]
LONG_LOOPS = [(63, 8), (64, 32)]  # the short rule; the long one from its first T, a multiple of K
LANES = [1, 2, 4]
PLIF_W = [torch.tensor(0.4), torch.tensor([[0.3], [-0.5], [1.0]])]  # PLIF's learnable w: shared, per channel
# The forward op's opcheck: its specs, its forms by name, its two kinds of state arguments (`opcheck_default`)
OPCHECK_SPECS = ("lif", "parametric_lif", "alif")  # one state; a tensor parameter; two states, one checkpointed
OPCHECK_FORMS = dict(zip(("multi", "multi-store", "multi-no-finals", "single"), OPCHECK_FORWARD))
STATE_ARGUMENTS = {False: "tensor-states", True: "number-states"}
OPCHECK_FULL = [(name, form, numbers) for numbers in STATE_ARGUMENTS for form in OPCHECK_FORMS
                for name in OPCHECK_SPECS]


def opcheck_default() -> list[tuple[str, str, bool]]:
    """The forward op's opcheck cases by default: every spec in every form, the state arguments tensors or numbers
    in turn, so that every pair of spec, form and state arguments of the full product (--slow) is checked."""
    return [(name, form, bool((i + j) % 2)) for i, name in enumerate(OPCHECK_SPECS)
            for j, form in enumerate(OPCHECK_FORMS)]


OPCHECKS = OPCHECK_FULL if profile() == "slow" else opcheck_default()


def close(actual: torch.Tensor, expected: torch.Tensor, rtol: float) -> None:
    scale = expected.abs().max().item() if expected.numel() else 0.0
    torch.testing.assert_close(actual, expected, rtol=rtol, atol=rtol * max(scale, 1.0))


def run(name: str, backend: str, dtype: torch.dtype, reset: str, detach: bool, seed: int = 0, steps: int = 7,
        w: torch.Tensor | None = None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Outputs (spikes, finals, sequences) and gradients (x, initial states, w) of one seeded run."""
    g = torch.Generator().manual_seed(seed)
    shape = (steps, 3, 5)
    x = (torch.rand(shape, generator=g, dtype=torch.float64) * 2 - 0.4).to(dtype).requires_grad_()
    states = [(torch.rand(shape[1:], generator=g, dtype=torch.float64) * 0.6 - 0.2).to(dtype).requires_grad_()
              for _ in resolve_spec(name).states]
    params = dict(PARAMS[name])
    if w is not None:
        params["w"] = w = w.detach().clone().requires_grad_()
    spikes, finals, seqs = F.multi_step(name, x, *states, reset=reset, detach_reset=detach, store_state_seq=True,
                                        backend=backend, **params)
    weights = [torch.rand(t.shape, generator=g, dtype=torch.float64).to(dtype) for t in (spikes, *finals, *seqs)]
    loss = sum((t * u).sum() for t, u in zip((spikes, *finals, *seqs), weights))
    leaves = [x, *states] + ([w] if w is not None else [])
    return [spikes, *finals, *seqs], list(torch.autograd.grad(loss, leaves))


@pytest.fixture(scope="module", autouse=True)
def compiled_kernels() -> int:
    """The kernels the tests below launch through multi_step, single_step and the forward op, compiled up front
    many to a compiler run (`conftest.compile_launched`)."""
    calls = [functools.partial(run, name, "host", dtype, reset, detach, w=_plif_w(name, dtype))
             for dtype in (torch.float32, torch.float64) for name, reset, detach in CASES]
    calls += [functools.partial(F.single_step, name, torch.rand(4, 3, dtype=torch.float64).requires_grad_(),
                                backend="host", **PARAMS[name]) for name in ("lif", "izhikevich", "alif")]
    calls += [functools.partial(_forward_op, name, *OPCHECK_FORMS[form], numbers) for name, form, numbers in OPCHECKS]
    calls += [functools.partial(_forward_op, "alif", False, False, True, False, steps) for steps, _ in LONG_LOOPS]
    calls += [functools.partial(run, "parametric_lif", "host", torch.float64, "hard", False, w=w.double())
              for w in PLIF_W]
    calls += [functools.partial(_channel_runs, lanes) for lanes in LANES]
    return compile_launched(*calls)


def _forward_op(name: str, single: bool, store: bool, finals: bool, numbers: bool, steps: int = 4) -> None:
    """The forward op called as opcheck calls it, and backward through its autograd formula."""
    args = _op_args(name, single, store, True, numbers=numbers, steps=steps)
    outputs = torch.ops.autocuda.neuron_forward.default(*args, finals, [])
    loss = sum(o.sum() for o in outputs if o.requires_grad)
    if isinstance(loss, torch.Tensor):
        loss.backward()


def _plif_w(name: str, dtype: torch.dtype) -> torch.Tensor | None:
    return torch.linspace(-1, 1, 15, dtype=dtype).view(3, 5) if name == "parametric_lif" else None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize(("name", "reset", "detach"), CASES, ids=lambda v: str(v))
def test_kernels_match_reference(name: str, reset: str, detach: bool, dtype: torch.dtype):
    w = _plif_w(name, dtype)
    got, got_grads = run(name, "host", dtype, reset, detach, w=w)
    want, want_grads = run(name, "reference", dtype, reset, detach, w=w)
    assert got[0].sum() > 0 and torch.equal(got[0], want[0])
    for a, b in zip(got[1:] + got_grads, want[1:] + want_grads):
        assert a.dtype == b.dtype and a.shape == b.shape
        close(a, b, TOLERANCE[dtype])


@pytest.mark.parametrize("w", PLIF_W, ids=["shared", "channel"])
def test_plif_learnable_w_is_reduced_to_its_shape(w: torch.Tensor):
    got, (*_, grad_w) = run("parametric_lif", "host", torch.float64, "hard", False, w=w.double())
    want, (*_, want_w) = run("parametric_lif", "reference", torch.float64, "hard", False, w=w.double())
    assert grad_w.shape == w.shape
    close(grad_w, want_w, 1e-10)


@pytest.mark.parametrize("name", ["lif", "izhikevich", "alif"])
def test_single_step_matches_reference(name: str):
    g = torch.Generator().manual_seed(1)
    x = (torch.rand(4, 3, generator=g, dtype=torch.float64) * 2).requires_grad_()
    results = []
    for backend in ("host", "reference"):
        spike, states = F.single_step(name, x, backend=backend, **PARAMS[name])
        grad = torch.autograd.grad((spike * torch.arange(12.0).view(4, 3)).sum() + sum(s.sum() for s in states), x)
        results.append((spike, *states, *grad))
    assert torch.equal(results[0][0], results[1][0])
    for a, b in zip(results[0][1:], results[1][1:]):
        close(a, b, 1e-10)


def test_what_backward_saves():
    """Only what the backward kernel reads: h for LIF; h and v_init (v[t-1] is recomputed from h[t-1]) for
    Izhikevich and PLIF (whose dh/dw = (x - (v - v_reset)) sigmoid'(w) takes x back from h, so x is not kept
    alive for backward); the threshold state's checkpoints for ALIF (every 8 steps in float32, its backward
    replays the steps between)."""
    def saved(name: str, signature=()) -> set[str]:
        return set(ops.saved_names(get_config(resolve_spec(name), None, None, False, (), signature, True).key, False))

    assert saved("lif") == {"h_seq"}
    assert saved("izhikevich") == {"h_seq", "v_init"}
    assert saved("parametric_lif", (("w", False, True),)) == {"h_seq", "v_init"}
    assert saved("parametric_lif", (("w", True, True),)) == {"h_seq", "v_init"}
    assert saved("alif") == {"h_seq", "a_init", "a_checkpoints"}


def test_no_grad_forward_writes_no_saved_tensors():
    plan = get_config(resolve_spec("lif"), None, None, False, (), (), True)
    assert "h_seq" in ops.forward_outputs(plan.key, False, False, True)
    assert ops.forward_outputs(plan.key, False, False, False) == ("spike_seq", "v_final")


def _op_args(name: str, single: bool, store: bool, save: bool, dtype=torch.float64, numbers: bool = False,
             steps: int = 4):
    """The forward op's arguments; `numbers`: the initial states as one number each instead of tensors."""
    spec = resolve_spec(name)
    signature = (("w", True, True),) if name == "parametric_lif" else ()
    plan = get_config(spec, None, None, False, (), signature, True)
    g = torch.Generator().manual_seed(2)
    shape = (5,) if single else (steps, 5)
    x = (torch.rand(shape, generator=g, dtype=torch.float64) * 2).to(dtype).requires_grad_()
    states = [] if numbers else [torch.zeros(5, dtype=dtype, requires_grad=True) for _ in plan.state_names]
    initial = [0.25 * i for i in range(len(plan.state_names))] if numbers else []
    tensors = [torch.full((5,), 0.3, dtype=dtype, requires_grad=True) for _ in plan.tensors]
    scalars = [float(dict((p.name, p.default) for p in spec.params)[n]) for n in plan.op_scalars]
    return plan.key, x, states, initial, tensors, scalars, store, save


def test_the_default_opchecks_hold_every_pair_of_the_full_product():
    default = opcheck_default()
    for pick in (lambda c: (c[0], c[1]), lambda c: (c[0], c[2]), lambda c: (c[1], c[2])):
        assert {pick(c) for c in OPCHECK_FULL} == {pick(c) for c in default}
    assert set(default) <= set(OPCHECK_FULL)


@pytest.mark.parametrize(("name", "form", "numbers"), OPCHECKS,
                         ids=[f"{STATE_ARGUMENTS[numbers]}-{form}-{name}" for name, form, numbers in OPCHECKS])
def test_opcheck_forward(name: str, form: str, numbers: bool):
    """opcheck (schema, fake kernel, autograd registration, AOT dispatch) of each form of the forward op: with
    --slow every spec in every form with both kinds of state arguments; by default a covering set
    (`opcheck_default`)."""
    single, store, finals = OPCHECK_FORMS[form]
    torch.library.opcheck(torch.ops.autocuda.neuron_forward.default,
                          (*_op_args(name, single, store, True, numbers=numbers), finals, []))


@pytest.mark.parametrize(("steps", "every"), LONG_LOOPS)
def test_fake_checkpoints_follow_the_long_loop_rule(steps: int, every: int):
    """Long loops over few neurons replay ALIF's adaptation in 32-step segments, others in 8-step ones
    (`runtime.neuron_launch.LONG_LOOP`): the fake kernel shapes a_checkpoints as the launched kernel does."""
    args = _op_args("alif", False, False, True, steps=steps)
    torch.library.opcheck(torch.ops.autocuda.neuron_forward.default, (*args, True, []))
    key, x, states, initial, tensors, scalars, store, save = args
    outputs = torch.ops.autocuda.neuron_forward(key, x.detach(), [s.detach() for s in states], initial,
                                                [t.detach() for t in tensors], scalars, store, save, True, [])
    named = dict(zip(ops.forward_outputs(key, False, store, save), outputs))
    assert named["a_checkpoints"].shape == ((steps - 1) // every, 5), "none after the last step"


@pytest.mark.parametrize(("name", "store"), [("parametric_lif", False), ("alif", True)])
@pytest.mark.parametrize("numbers", [False, True], ids=["tensor-states", "number-states"])
def test_opcheck_backward(name: str, store: bool, numbers: bool):
    key, x, states, initial, tensors, scalars, _, _ = _op_args(name, False, store, True, numbers=numbers)
    outputs = torch.ops.autocuda.neuron_forward(key, x.detach(), [s.detach() for s in states], initial,
                                                [t.detach() for t in tensors], scalars, store, True, True, [])
    available = {"x_seq": x.detach(), **{f"{s}_init": v.detach() for s, v in zip(ops.entry(key).state_names, states)},
                 **dict(zip(ops.forward_outputs(key, False, store, True), outputs))}
    saved = [available[n] for n in ops.saved_names(key, False, not numbers)]
    grad_finals = [torch.ones(5, dtype=x.dtype) for _ in ops.entry(key).state_names]
    grad_seqs = [torch.ones_like(x) for _ in ops.entry(key).state_names] if store else []
    args = (key, torch.ones_like(x), grad_finals, grad_seqs, saved, initial, [t.detach() for t in tensors], scalars)
    torch.library.opcheck(torch.ops.autocuda.neuron_backward.default, args)


def test_op_with_no_steps_passes_states_through():
    key, _, _, _, tensors, scalars, _, _ = _op_args("alif", False, True, True)
    x = torch.zeros(0, 5, dtype=torch.float64)
    init = [torch.full((5,), 0.25, dtype=torch.float64), torch.full((5,), 0.5, dtype=torch.float64)]
    outputs = dict(zip(ops.forward_outputs(key, False, True, True),
                       torch.ops.autocuda.neuron_forward(key, x, init, [], tensors, scalars, True, True, True, [])))
    assert torch.equal(outputs["v_final"], init[0]) and torch.equal(outputs["a_final"], init[1])
    assert outputs["v_final"].data_ptr() != init[0].data_ptr()  # outputs never alias inputs
    outputs = dict(zip(ops.forward_outputs(key, False, True, True),
                       torch.ops.autocuda.neuron_forward(key, x, [], [0.25, 0.5], tensors, scalars, True, True, True,
                                                                 [])))
    assert torch.equal(outputs["v_final"], init[0]) and torch.equal(outputs["a_final"], init[1])


def test_whole_number_scalars_run_as_their_floats():
    """The kernels take scalars as given on the ops' path (floats by the op's schema; ints are packed as such)
    and converted on the mapping path (`testing.named_launch.forward`)."""
    from autocuda.tools.testing import named_launch

    key, x, _, initial, tensors, scalars, _, _ = _op_args("lif", False, False, False, numbers=True)
    x = x.detach()
    whole = [float(round(v)) for v in scalars]
    want = ops.forward(key, x, [], initial, tensors, whole, False, False, True)
    got = ops.forward(key, x, [], initial, tensors, [int(v) for v in whole], False, False, True)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    entry = ops.entry(key)
    given = dict(zip(entry.op_scalars, map(int, whole)))
    by_name = named_launch.forward(entry, x, dict(zip(entry.state_names, initial)), given, save_for_backward=False,
                             backend="host")
    assert all(torch.equal(by_name[n], w) for n, w in zip(ops.forward_outputs(key, False, False, False), want))


def test_op_refuses_initial_states_given_twice_or_missing():
    key, x, states, _, tensors, scalars, _, _ = _op_args("alif", False, False, False)
    with pytest.raises(ValueError, match="as tensors or as numbers, not both"):
        torch.ops.autocuda.neuron_forward(key, x, states, [0.0, 0.0], tensors, scalars, False, False, True, [])
    with pytest.raises(ValueError, match="has 2 states .* got 1 initial values"):
        torch.ops.autocuda.neuron_forward(key, x, [], [0.0], tensors, scalars, False, False, True, [])


def test_keys_are_stable_and_checked():
    spec = resolve_spec("lif")
    a = get_config(spec, None, None, False, (), (), True).key
    assert a == get_config(spec, "Sigmoid", "hard", False, (), (), True).key  # the same configuration
    assert a.startswith("lif_") and a != get_config(spec, None, "soft", False, (), (), True).key
    with pytest.raises(KeyError, match="unknown autocuda neuron key"):
        ops.entry("lif_0000")


def test_unwritable_kernel_cache_falls_back_to_a_temporary_folder_with_one_warning(tmp_path, monkeypatch):
    from autocuda.toolchain import store

    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(blocker / "cache"))  # below a file: nothing can be created there
    monkeypatch.setattr(store, "_fallbacks", {})
    with pytest.warns(UserWarning, match="not writable"):
        store.save("binaries", "probe", b"image")
    assert store.read("binaries", "probe") == b"image"  # this process keeps using the fallback, silently
    assert not str(store.folder("binaries")).startswith(str(blocker))


def test_constant_result_marks_functions_as_torch_does():
    """Our decorator stands in for torch.compiler.assume_constant_result (which imports Dynamo): both must leave
    a function with the same attributes, or torch.compile would trace into our plan builders."""
    from autocuda.runtime.configs import constant_result

    def ours():
        return 1

    def torchs():
        return 1

    constant_result(ours)
    torch.compiler.assume_constant_result(torchs)
    extra = lambda f: {k: v for k, v in vars(f).items()}  # noqa: E731
    assert extra(ours) == extra(torchs) == {"_dynamo_marked_constant": True}


def test_backward_gets_no_zero_gradients_for_unused_outputs(monkeypatch):
    """Outputs kept only for backward (h_seq, state sequences nobody asked for) and unused final states reach
    backward as None: torch must not fill [T, N] zero tensors for them on every training step."""
    monkeypatch.setattr(native, "USE", False)  # the Python path's backward is what is watched
    received = []
    backward = ops._backward

    def recording(ctx, grads, run_backward=None):
        received.append({name: g is None for name, g in zip(ctx.outputs, grads)})
        return backward(ctx, grads, run_backward)

    monkeypatch.setattr(ops, "_backward", recording)
    x = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    spikes, _, _ = F.multi_step("izhikevich", x, backend="host")
    (gx,) = torch.autograd.grad(spikes.sum(), x)
    (none,) = received
    assert none.pop("spike_seq") is False
    assert all(none.values()), f"materialised zero gradients: {[n for n, is_none in none.items() if not is_none]}"
    ref_spikes, _, _ = F.multi_step("izhikevich", x, backend="reference")
    (ref,) = torch.autograd.grad(ref_spikes.sum(), x)
    torch.testing.assert_close(gx, ref)


@pytest.mark.parametrize("name", ["lif", "izhikevich"])
def test_no_final_state_gradient_takes_a_kernel_that_starts_from_zero(name):
    """A loss on the spikes alone gives the final states no gradient: backward runs a kernel without those
    inputs (no zero tensors filled) and gets bitwise what explicit zero gradients give."""
    x = torch.randn(6, 5, dtype=torch.float32, generator=torch.Generator().manual_seed(3)) * 2 + 0.5
    g = torch.randn(6, 5, generator=torch.Generator().manual_seed(4))
    xa, xb = x.clone().requires_grad_(True), x.clone().requires_grad_(True)
    spikes, finals, _ = F.multi_step(name, xa, backend="host")
    (without,) = torch.autograd.grad(spikes, xa, g)
    spikes, finals, _ = F.multi_step(name, xb, backend="host")
    (with_zeros,) = torch.autograd.grad([spikes, *finals], xb, [g, *(torch.zeros_like(f) for f in finals)])
    assert torch.equal(without, with_zeros)
    recipes = get_config(name)._recipes
    flags = {flags for kind, _, flags, _ in recipes if kind == "bptt"}
    assert (False, False, False) in flags and (False, True, False) in flags, flags  # numbers as initial states


CHANNELS, INNER = 5, 9  # test_per_channel_sums_where_runs_of_a_channel_end_inside_a_thread's runs


def _channel_runs(lanes: int) -> tuple[dict, dict]:
    """PLIF's forward and backward with w per channel and with the same w per neuron, on `lanes` lanes a thread."""
    from autocuda.codegen.broadcast import PER_CHANNEL, PER_NEURON
    from autocuda.runtime import neuron_launch as neuron
    from autocuda.tools.testing import named_launch

    spec = resolve_spec("parametric_lif")
    channels, inner, steps = CHANNELS, INNER, 4
    n = 8 * channels * inner
    g = torch.Generator().manual_seed(3)
    w = torch.linspace(-1, 1, channels)
    x, grad = torch.rand(steps, n, generator=g) * 2, torch.randn(steps, n, generator=g)
    layout = {"lanes": lanes, "vector": True, "unroll": 2} if lanes > 1 else {"lanes": 0, "unroll": 2}

    def run(kind):
        config = neuron.NeuronConfig(spec, spec.surrogate, "hard", tensors=(("w", kind),))
        params = {"v_threshold": 1.0, "v_reset": 0.0}
        if kind == PER_CHANNEL:
            params |= {"w": w, "ac_channels": float(channels), "ac_inner": float(inner)}
        else:
            params |= {"w": w.repeat_interleave(inner).repeat(n // (channels * inner))}
        out = named_launch.forward(config, x, {"v": 0.0}, params, layout=layout, backend="host")
        saved = {"h_seq": out["h_seq"], "x_seq": x, "v_init": 0.0}
        return out | named_launch.backward(config, {"grad_spike_seq": grad}, saved, params, grad_finals=False,
                                     given_inits=False, layout=layout, backend="host")

    return run(PER_CHANNEL), run(PER_NEURON)


@NEEDS_HOST
@pytest.mark.parametrize("lanes", LANES)
def test_per_channel_sums_where_runs_of_a_channel_end_inside_a_thread(lanes):
    """Backward adds a per-channel parameter's gradient per channel: a thread whose lanes are all in one run of a
    channel adds their sum, one where a run ends among its lanes adds each lane's own. Runs of 9 neurons end
    inside threads of 2 and 4 lanes (one run spans three threads); the sums are the per-neuron partials'."""
    channels, inner = CHANNELS, INNER
    by_channel, by_neuron = _channel_runs(lanes)
    assert torch.equal(by_channel["grad_x_seq"], by_neuron["grad_x_seq"])
    partials = by_neuron["grad_w"].reshape(-1, channels, inner).transpose(0, 1).reshape(channels, -1)
    torch.testing.assert_close(by_channel["grad_w"], partials.sum(1), rtol=1e-5, atol=1e-5)
    assert partials.abs().sum() > 0


@NEEDS_HOST
def test_a_compiled_training_call_of_a_step_without_scalars_takes_its_gradients():
    """The op's backward gives an empty float[] argument an empty list, as torch's autograd.Function check asks: the
    scalars' slot gave None, so a compiled call whose configuration has no scalar (a FlexSN core's, a layer whose
    parameters are all tensors) failed in backward ("Expected the return from backward to be of the same structure
    as the inputs")."""
    from autocuda.nn import FlexSN
    from autocuda.spec.surrogate import Sigmoid

    surrogate = Sigmoid()

    def core(x, v):
        h = v + x
        s = surrogate(h - 1.0)
        return s, h * (1 - s)

    x = (torch.rand(4, 3, dtype=torch.float64) * 2).requires_grad_(True)
    eager = torch.autograd.grad(FlexSN(core, 1, backend="host")(x).sum(), x)[0]
    compiled = torch.compile(FlexSN(core, 1, backend="host"), backend="eager", fullgraph=True)
    assert torch.equal(torch.autograd.grad(compiled(x).sum(), x)[0], eager)
