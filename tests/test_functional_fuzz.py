"""Fuzzing `autocuda.call.functional` (`multi_step`, `single_step`) and the ops (`torch.ops.autocuda.neuron_*`).

Valid calls, drawn from seeds: a random shipped spec, neuron shapes with size-1 and empty dims, T = 0 and 1, 0-dim x
for single steps, initial states as floats, ints, NumPy float64s and tensors (with and without gradients, some left
out), parameters as floats, ints, NumPy float64s, 0-dim, [1], per-channel and per-neuron tensors (with and without
gradients), reset overrides, v_reset=None, surrogates, detach_reset, store_state_seq, final_states, save_h and
recompute: the host runner's spikes equal the reference's, its states and the gradients of every tensor leaf match
in float64, and every output has its documented shape and dtype.

Invalid calls (hypothesis): one argument of a valid call made wrong raises TypeError or ValueError (autocuda's own
errors are such) naming that argument; the ops called with wrong lists raise naming the list or the tensor, and
never read a tensor past its end. Each fault found is a regression test of its own (the first block).
"""
from __future__ import annotations

import functools
import math
import random
import re

import numpy as np
import pytest
import torch
from backends import NEEDS_HOST
from conftest import compile_launched, examples
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from autocuda.base.errors import AutocudaError, KernelArgumentError
from autocuda.call import functional as F
from autocuda.codegen.broadcast import PER_CHANNEL
from autocuda.codegen.noise import Seed
from autocuda.runtime.configs import get_config, resolve_spec, spec_facts, spec_ref
from autocuda.spec.load import list_specs

D = torch.float64
SPECS = [name for name, _ in list_specs()]
SETTINGS = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True)

pytestmark = NEEDS_HOST


# -- regressions ---------------------------------------------------------------------------------------------------
def _op_args(name: str, steps: int = 4, n: int = 5, signature: tuple = ()):
    """The forward op's arguments of `name`'s default configuration (tensor initial states)."""
    spec = resolve_spec(name)
    config = get_config(spec, None, None, False, (), signature, True)
    x = torch.rand(steps, n, dtype=D, generator=torch.Generator().manual_seed(0))
    states = [torch.zeros(n, dtype=D) for _ in config.state_names]
    defaults = {p.name: p.default for p in spec.params}
    scalars = [float(defaults.get(s, 0.0)) for s in config.op_scalars]
    return config, x, states, scalars


def test_forward_op_refuses_tensors_of_the_wrong_size():
    """A state, tensor parameter or x of another size than the call's T and N was read past its end (or short of
    it) by the kernel and the op returned what it read; now a KernelArgumentError (a TypeError) names it. (An x of
    3 dims ran as [T, N] of its first and last: `test_ops_refuse_x_of_no_kernel_form_by_name`.)"""
    config, x, states, scalars = _op_args("alif")
    forward = torch.ops.autocuda.neuron_forward
    for bad in ([torch.zeros(3, dtype=D), states[1]], [states[0], torch.zeros(1, dtype=D)]):
        with pytest.raises(KernelArgumentError, match=r"^(v|a)_init: expected a tensor of 5 elements .* got shape"):
            forward(config.key, x, bad, [], [], scalars, False, False, True, [])
    plif, x, states, scalars = _op_args("parametric_lif", signature=(("w", True, True),))
    for w in (torch.zeros(3, dtype=D), torch.zeros(1, dtype=D)):  # per neuron: N values
        with pytest.raises(KernelArgumentError, match=r"^w: expected a tensor of 5 elements"):
            forward(plif.key, x, states, [], [w], scalars, False, False, True, [])
    assert forward(plif.key, x, states, [], [torch.zeros(1, 5, dtype=D)], scalars, False, False, True, [])


def test_backward_op_refuses_tensors_of_the_wrong_size():
    config, x, states, scalars = _op_args("alif")
    from autocuda.call import ops

    outputs = torch.ops.autocuda.neuron_forward(config.key, x, states, [], [], scalars, False, True, True, [])
    available = {"x_seq": x, **{f"{s}_init": v for s, v in zip(config.state_names, states)},
                 **dict(zip(ops.forward_outputs(config.key, False, False, True), outputs))}
    saved = [available[n] for n in ops.saved_names(config.key, False, True)]
    backward = torch.ops.autocuda.neuron_backward
    grad = torch.ones_like(x)
    assert len(backward(config.key, grad, [], [], saved, [], [], scalars)) == 3
    with pytest.raises(KernelArgumentError, match=r"^h_seq: expected a tensor of 20 elements"):
        backward(config.key, grad, [], [], [s[:2] for s in saved], [], [], scalars)
    with pytest.raises(KernelArgumentError, match=r"^h_seq: expected a tensor of 10 elements"):  # grad [2, N]
        backward(config.key, grad[:2], [], [], saved, [], [], scalars)
    with pytest.raises(KernelArgumentError, match=r"^grad_v_final: expected a tensor of 5 elements"):
        backward(config.key, grad, [torch.ones(3, dtype=D)] * 2, [], saved, [], [], scalars)
    with pytest.raises(KernelArgumentError, match=r"^grad_v_seq: expected a tensor of 20 elements"):
        backward(config.key, grad, [], [torch.ones(2, 5, dtype=D)] * 2, saved, [], [], scalars)


def test_ops_refuse_x_of_no_kernel_form_by_name():
    """A 0-dim x raised IndexError, an integer or complex one 'unsupported dtype torch.int64' naming no argument, and
    one of 3 dims ran as [T, N] of its first and last dims (reading T·N of its elements)."""
    config, x, states, scalars = _op_args("lif")
    for bad in (x[0, 0], x.long(), x.to(torch.complex128), x.view(1, 1, 4, 5)[..., 0]):
        with pytest.raises(ValueError, match=r"^autocuda\.neuron_forward: x: expected a tensor of shape \[T, N\]"):
            torch.ops.autocuda.neuron_forward(config.key, bad, states, [], [], scalars, False, False, True, [])
    with pytest.raises(ValueError, match=r"^autocuda\.neuron_backward: grad_spike: expected"):
        torch.ops.autocuda.neuron_backward(config.key, x[0, 0], [], [], [], [], [], scalars)


def test_forward_op_refuses_channel_sizes_that_divide_by_zero():
    """ac_channels or ac_inner of 0 divided by zero in the kernel (a crash of the process on the host runner)."""
    config, x, states, scalars = _op_args("lif", n=6, signature=(("tau", PER_CHANNEL, False),))
    tau = torch.full((3,), 2.0, dtype=D)
    good = scalars[:-2] + [3.0, 2.0]
    assert torch.ops.autocuda.neuron_forward(config.key, x, states, [], [tau], good, False, False, True, [])
    for channels, inner in ((0.0, 2.0), (3.0, 0.0), (3.0, 4.0)):
        with pytest.raises(KernelArgumentError, match=r"^ac_channels, ac_inner: expected sizes of at least 1"):
            torch.ops.autocuda.neuron_forward(config.key, x, states, [], [tau], scalars[:-2] + [channels, inner],
                                              False, False, True, [])


@pytest.mark.parametrize("backend", ["host", "reference"])
def test_an_int_beyond_a_float_is_refused_by_name(backend):
    """`tau=10**400` raised OverflowError('int too large to convert to float'), naming nothing; also on a bound
    program's later call and for an initial state."""
    x = torch.rand(3, 4, dtype=D)
    F.multi_step("lif", x, backend=backend, tau=3)  # binds the program of int tau
    for call in (lambda: F.multi_step("lif", x, backend=backend, tau=10 ** 400),
                 lambda: F.single_step("lif", x[0], backend=backend, v_threshold=-10 ** 400)):
        with pytest.raises(ValueError, match=r"^parameter '(tau|v_threshold)' of 'lif': an int of 1329 bits"):
            call()
    with pytest.raises(ValueError, match=r"^state 'v': an int of 1329 bits"):
        F.multi_step("lif", x, 10 ** 400, backend=backend)


def test_save_h_false_with_draws_names_save_h():
    """A spec that draws cannot replay its charge: `save_h=False` raised at the launch, naming neither the switch
    nor the call ('... (a fused BatchNorm's two-pass backward)')."""
    x = torch.rand(3, 2, dtype=D)
    with pytest.raises(ValueError, match=r"^save_h=False: neuron 'noisy_cuba_lif' makes random draws"):
        F.multi_step("noisy_cuba_lif", x, backend="host", save_h=False)
    assert F.multi_step("noisy_cuba_lif", x, backend="reference", save_h=False)[0].shape == x.shape


def test_a_tuple_of_step_inputs_names_the_element_that_is_no_tensor():
    """(g_e, 1.0) said 'x_seq: expected a torch.Tensor, or a tuple of them ..., got tuple' of a tuple."""
    g = torch.rand(3, 2, dtype=D)
    with pytest.raises(TypeError, match=r"^x_seq\[1\]: expected a torch.Tensor \(one per step input\), got float"):
        F.multi_step("conductance_lif", (g, 1.0), backend="host")
    with pytest.raises(TypeError, match=r"^x\[0\]: expected a torch.Tensor .* got NoneType"):
        F.single_step("conductance_lif", (None, g[0]), backend="reference")
    with pytest.raises(TypeError, match=r"^x_seq: expected .* got an empty tuple"):
        F.multi_step("conductance_lif", (), backend="host")
    with pytest.raises(TypeError, match=r"^x_seq: expected .* got list"):
        F.multi_step("lif", [[1.0, 2.0]], backend="host")


@pytest.mark.parametrize("backend", ["host", "reference"])
@pytest.mark.parametrize("reset", ["", 0, False])
def test_a_falsy_reset_is_refused(backend, reset):
    """reset='' (or 0, False) ran the spec's own reset silently (`reset or spec.reset`); None alone means that."""
    with pytest.raises(ValueError, match="field 'reset': reset must be one of hard, soft, none"):
        F.multi_step("lif", torch.rand(3, 2, dtype=D), backend=backend, reset=reset)


@pytest.mark.parametrize("single", [False, True])
def test_an_empty_backend_is_refused(single):
    """backend='' ran the device's default backend silently (`backend or default_backend(...)`)."""
    x = torch.rand(3, 2, dtype=D)
    run = F.single_step if single else F.multi_step
    with pytest.raises(ValueError, match=r"^backend: expected 'cuda', 'host', 'reference' or None, got ''"):
        run("lif", x[0] if single else x, backend="")


@pytest.mark.parametrize("shape", [(), (1,)])
def test_a_spec_that_draws_takes_one_seed_per_call_when_v_starts_at_a_tensor(shape):
    """From the second call of a program on, a state starting at a tensor parameter (v = v_reset, a tensor) made the
    bound path take a seed from torch's generator before it gave the call to `Call`, which took another: under
    `torch.manual_seed(s)` the second and later calls drew other noise than the first (and than the reference)."""
    x = torch.tensor([[0.5], [0.3]], dtype=D)
    results = []
    for backend in ("reference", "host", "host", "host"):
        torch.manual_seed(1)
        _, finals, _ = F.multi_step("noisy_cuba_lif", x, backend=backend, v_reset=torch.full(shape, -0.04, dtype=D))
        results.append(torch.stack(finals))
        after = torch.get_rng_state()
        torch.manual_seed(1)
        Seed.from_torch()  # one call's seed
        assert torch.equal(after, torch.get_rng_state()), f"{backend}: the call took more than one seed"
    for got in results[1:]:
        torch.testing.assert_close(got, results[0], rtol=1e-12, atol=1e-12)


# -- valid calls: the host runner against the reference ------------------------------------------------------------
def _in_domain(value: float, bounds) -> bool:
    compare = {">": float.__gt__, ">=": float.__ge__, "<": float.__lt__, "<=": float.__le__}
    return all(compare[op](float(value), float(limit)) for op, limit in bounds)


def _tensor(value: float, shape, seed: int) -> torch.Tensor:
    noise = torch.rand(shape, dtype=D, generator=torch.Generator().manual_seed(seed))
    return torch.tensor(value, dtype=D) * (1 + 0.05 * noise)


def _parameter(r: random.Random, name: str, default: float, bounds, neuron: tuple, seed: int):
    """A value of parameter `name` near its default, in one of the forms a call may give (None: left out)."""
    form = r.choice(["omit", "omit", "float", "int", "numpy", "0-dim", "[1]", "channel", "neuron", "trailing"])
    value = default * r.uniform(0.85, 1.0) if default else r.uniform(-0.05, 0.05)
    if bounds and not _in_domain(value, bounds):
        value = default
    if form == "omit":
        return None
    if form == "int":  # a whole number near the default, where one is in the domain
        whole = round(value)
        return whole if abs(whole - value) <= 0.3 * max(1.0, abs(value)) and (not bounds or _in_domain(whole, bounds)) \
            else float(value)
    if form in ("float", "numpy"):
        return float(value) if form == "float" else np.float64(value)
    if form == "0-dim" or not neuron:
        t = torch.tensor(value, dtype=D)
    elif form == "[1]":
        t = torch.tensor([value], dtype=D)
    elif form == "channel":  # [C, 1, ...] over one dim of the neuron shape, with or without leading ones
        dim = r.randrange(len(neuron))
        shape = [1] * len(neuron)
        shape[dim] = neuron[dim]
        t = _tensor(value, shape[dim:] if r.random() < 0.5 else shape, seed)
    else:
        t = _tensor(value, neuron if form == "neuron" else neuron[r.randrange(len(neuron)):], seed)
    if bounds and t.numel() and not (_in_domain(t.min(), bounds) and _in_domain(t.max(), bounds)):
        t = torch.full(t.shape, float(default), dtype=D)
    return t.requires_grad_(r.random() < 0.5)


def valid_call(seed: int) -> dict:
    """A valid call drawn from `seed`: spec, inputs, initial states, parameters and options."""
    r = random.Random(seed)
    name = r.choice(SPECS)
    facts = spec_facts(spec_ref(name))
    single = r.random() < 0.25
    dims = r.choice([0, 1, 1, 2, 3]) if single else r.choice([1, 1, 2, 3])
    neuron = tuple(r.choice([1, 2, 3, 4, 2, 0 if r.random() < 0.1 else 1]) for _ in range(dims))
    steps = r.choice([0, 1, 2, 3, 5, 8])
    defaults, domains = dict(facts.defaults), dict(facts.domains)
    params = {}
    for i, p in enumerate(n for n in facts.param_names if n not in facts.constant_names):
        value = _parameter(r, p, defaults[p], domains.get(p), neuron, seed * 31 + i)
        if value is not None:
            params[p] = value
    resets = [None, None, "soft", "none"] + (["hard"] if "v_reset" in facts.param_names else [])
    reset = r.choice(resets)
    if "v_reset" in facts.param_names and r.random() < 0.1:
        params["v_reset"] = None  # a soft reset (unless `reset` says otherwise)
    states: list = []
    for i in range(r.randrange(len(facts.initial) + 1)):
        form = r.choice(["float", "int", "numpy", "tensor", "tensor"])
        value = r.uniform(-0.2, 0.5)
        if form == "tensor":
            t = torch.rand(neuron, dtype=D, generator=torch.Generator().manual_seed(seed + 7 + i)) * 0.6 - 0.2
            states.append(t.requires_grad_(r.random() < 0.6))
        else:
            states.append({"float": value, "int": r.choice([0, 1, -1]), "numpy": np.float64(value)}[form])
    generator = torch.Generator().manual_seed(seed + 100)
    shape = neuron if single else (steps, *neuron)
    xs = [(torch.rand(shape, dtype=D, generator=generator) * 1.6 - 0.3).requires_grad_(r.random() < 0.85)
          for _ in facts.inputs]
    options: dict = {"detach_reset": r.random() < 0.3, "reset": reset,
                     "surrogate": r.choice([None, None, "ATan", "Erf", {"name": "Sigmoid", "alpha": 3.0}])}
    if not single:
        options.update(store_state_seq=r.random() < 0.5, final_states=r.random() < 0.8,
                       save_h=r.random() < 0.7 or facts.draws, recompute=r.random() < 0.15)
    return {"name": name, "single": single, "xs": xs, "states": states, "params": params, "options": options,
            "seed": seed}


def _copy(value):
    return value.detach().clone().requires_grad_(value.requires_grad) if isinstance(value, torch.Tensor) else value


def run_call(call: dict, backend: str):
    """(spikes, final states, state sequences), the gradients of every tensor leaf and the leaves of one call (a
    loss of random weights on every output)."""
    xs, states = [_copy(u) for u in call["xs"]], [_copy(s) for s in call["states"]]
    params = {k: _copy(v) for k, v in call["params"].items()}
    x = xs[0] if len(xs) == 1 else tuple(xs)
    torch.manual_seed(call["seed"])  # the seed a noisy spec's call draws from: the same for both backends
    if call["single"]:
        spikes, finals = F.single_step(call["name"], x, *states, backend=backend, **call["options"], **params)
        seqs = None
    else:
        spikes, finals, seqs = F.multi_step(call["name"], x, *states, backend=backend, **call["options"], **params)
    outputs = [spikes, *(finals or ()), *(seqs or ())]
    leaves = [t for t in (*xs, *states, *params.values()) if isinstance(t, torch.Tensor) and t.requires_grad]
    weights = torch.Generator().manual_seed(5)
    loss = sum((o * torch.rand(o.shape, dtype=o.dtype, generator=weights)).sum() for o in outputs)
    grads: list = [None] * len(leaves)
    if leaves and isinstance(loss, torch.Tensor) and loss.requires_grad:
        grads = list(torch.autograd.grad(loss, leaves, allow_unused=True))
    return (spikes, finals, seqs), grads, leaves


def check_call(call: dict) -> None:
    (spikes, finals, seqs), grads, leaves = run_call(call, "host")
    (ref_spikes, ref_finals, ref_seqs), ref_grads, _ = run_call(call, "reference")
    x = call["xs"][0]
    neuron = x.shape if call["single"] else x.shape[1:]
    n_states = len(spec_facts(spec_ref(call["name"])).initial)
    assert spikes.shape == x.shape and spikes.dtype == x.dtype
    assert torch.equal(spikes, ref_spikes)
    options = call["options"]
    assert (finals is None) == (ref_finals is None) == (options.get("final_states") is False)
    assert (seqs is None) == (ref_seqs is None) == (not options.get("store_state_seq"))
    for got, want in zip(finals or (), ref_finals or ()):
        assert got.shape == want.shape == neuron and got.dtype == want.dtype == x.dtype
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10, equal_nan=True)
    for got, want in zip(seqs or (), ref_seqs or ()):
        assert got.shape == want.shape == x.shape and got.dtype == x.dtype
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10, equal_nan=True)
    assert len(finals or ()) in (0, n_states) and len(seqs or ()) in (0, n_states)
    for got, want, leaf in zip(grads, ref_grads, leaves):
        if got is None or want is None:  # no path to it on one side: the other's gradient is zero
            other = want if got is None else got
            assert other is None or not other.any()
            continue
        assert got.shape == leaf.shape and got.dtype == leaf.dtype
        torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9, equal_nan=True)


VALID_SEEDS = range(examples(400, 12))


@pytest.fixture(scope="module")
def valid_kernels() -> int:
    """The kernels the valid calls launch, compiled up front many to a compiler run."""
    return compile_launched(*(functools.partial(check_call, valid_call(seed)) for seed in VALID_SEEDS))


@pytest.mark.parametrize("seed", VALID_SEEDS)
def test_valid_calls_match_the_reference(seed, valid_kernels):
    check_call(valid_call(seed))


# -- invalid calls: one argument made wrong ------------------------------------------------------------------------
X = torch.rand(3, 2, 4, dtype=D)

# Each: a wrong value, and what the refusal's message must name (the parameter, the state, the option)
BAD_PARAMETERS = [
    (True, "tau"), ("2.0", "tau"), (None, "tau"), ([2.0], "tau"), (np.float32(2.0), "tau"), (np.int64(2), "tau"),
    (np.array(2.0), "tau"), (2 + 0j, "tau"), (torch.tensor(2), "tau"), (torch.tensor(True), "tau"),
    (torch.tensor(2 + 0j), "tau"), (torch.full((3,), 2.0, dtype=D), "tau"),
    (torch.full((2, 1, 1), 2.0, dtype=D), "tau"),
    (torch.full((0,), 2.0, dtype=D), "tau"), (torch.tensor(2.0, dtype=D, device="meta"), "tau"),
    (torch.full((4,), 2.0, dtype=D).to_sparse(), "tau"), (float("nan"), "tau"), (-1.0, "tau"), (0, "tau"),
    (-math.inf, "tau"), (10 ** 400, "tau"), (True, "v_threshold"), (None, "v_threshold"), ("x", "v_reset"),
]
BAD_STATES = [
    True, "0", None, np.zeros(4), [0.0], torch.zeros(4, dtype=D), torch.zeros((), dtype=D), torch.zeros(2, 4),
    torch.zeros(2, 4, dtype=torch.long), torch.zeros(2, 4, dtype=D, device="meta"),
    torch.zeros(2, 4, dtype=D).to_sparse(),
    10 ** 400, torch.zeros(2, 4, dtype=torch.complex128),
]
BAD_OPTIONS = [
    ("backend", "gpu", "backend"), ("backend", 1, "backend"), ("backend", "", "backend"), ("reset", "hardd", "reset"),
    ("reset", 1, "reset"), ("reset", "", "reset"), ("surrogate", "foo", "surrogate"), ("surrogate", 3, "surrogate"),
    ("surrogate", {"name": "Sigmoid", "alpha": -1.0}, "surrogate"), ("surrogate", {"name": "Sigmoid", "beta": 1.0},
                                                                    "surrogate"),
    ("detach_reset", 1, "detach_reset"), ("detach_reset", None, "detach_reset"),
    ("detach_reset", np.bool_(True), "detach_reset"), ("store_state_seq", "y", "store_state_seq"),
    ("final_states", None, "final_states"), ("save_h", 0, "save_h"), ("recompute", 1, "recompute"),
    ("taux", 2.0, "taux"), ("x", 1.0, "'x'"),
]
BAD_INPUTS = [
    (X.long(), "x_seq"), (X > 0.5, "x_seq"), (X.to(torch.complex128), "x_seq"), (X.to(torch.float8_e4m3fn), "x_seq"),
    (X[0, 0], "x_seq"), (X.to_sparse(), "x_seq"), (X.numpy(), "x_seq"), ([1.0], "x_seq"), (None, "x_seq"),
    ("x", "x_seq"), ((X, X), "'lif' takes 1 step input"), ((), "x_seq"), ((X, 1.0), r"x_seq\[1\]"),
]


def _message_names(error: BaseException, what: str) -> bool:
    return re.search(what if any(c in what for c in "\\[(") else re.escape(what), str(error)) is not None


def _assert_refused(call, what: str) -> None:
    with pytest.raises((TypeError, ValueError, AutocudaError)) as caught:
        call()
    assert isinstance(caught.value, (TypeError, ValueError)), caught.value  # autocuda's errors are such
    assert not isinstance(caught.value, (KeyError, IndexError, AttributeError, AssertionError)), caught.value
    assert _message_names(caught.value, what), f"{what!r} not named in {caught.value!r}"


@SETTINGS
@given(st.sampled_from(BAD_PARAMETERS), st.sampled_from(["host", "reference"]), st.booleans())
def test_bad_parameters_are_refused_by_name(bad, backend, single):
    value, name = bad
    x = X[0] if single else X
    run = F.single_step if single else F.multi_step
    _assert_refused(lambda: run("lif", x, backend=backend, **{name: value}), name)


@SETTINGS
@given(st.sampled_from(BAD_STATES), st.sampled_from(["host", "reference"]), st.sampled_from(["lif", "alif"]),
       st.integers(0, 1))
def test_bad_initial_states_are_refused_by_name(state, backend, name, at):
    """A bad state in the place `at` (after a good one for alif's second state 'a')."""
    states = [0.0, state][-1 - at:] if name == "alif" else [state]
    which = "a" if name == "alif" and at else "v"
    _assert_refused(lambda: F.multi_step(name, X, *states, backend=backend), f"state '{which}'")


@SETTINGS
@given(st.sampled_from(BAD_OPTIONS), st.sampled_from(["host", "reference"]))
def test_bad_options_are_refused_by_name(bad, backend):
    option, value, named = bad
    kwargs = {"backend": backend, option: value}
    _assert_refused(lambda: F.multi_step("lif", X, **kwargs), named)


@SETTINGS
@given(st.sampled_from(BAD_INPUTS), st.sampled_from(["host", "reference"]))
def test_bad_inputs_are_refused_by_name(bad, backend):
    x, named = bad
    _assert_refused(lambda: F.multi_step("lif", x, backend=backend), named)


@SETTINGS
@given(st.sampled_from(["lif", "alif", "izhikevich", "conductance_lif"]), st.integers(2, 4),
       st.sampled_from(["host", "reference"]))
def test_too_many_states_and_wrong_input_counts_are_refused(name, extra, backend):
    facts = spec_facts(spec_ref(name))
    inputs = X if len(facts.inputs) == 1 else (X, X)
    _assert_refused(lambda: F.multi_step(name, inputs, *[0.0] * (len(facts.initial) + extra), backend=backend),
                    f"has {len(facts.initial)} states")
    wrong = (X,) * (len(facts.inputs) + extra - 1)
    _assert_refused(lambda: F.multi_step(name, wrong if len(wrong) > 1 else wrong[0], backend=backend),
                    f"takes {len(facts.inputs)} step input")


# -- the ops with bad lists ----------------------------------------------------------------------------------------
OP_LISTS = ["states", "initial", "tensor_params", "scalars", "more_inputs"]


@SETTINGS
@given(st.sampled_from(OP_LISTS), st.sampled_from(["one more", "one less", "wrong dtype", "wrong size"]),
       st.sampled_from(["alif", "parametric_lif", "conductance_lif"]))
def test_forward_op_refuses_bad_lists(which, change, name):
    signature = (("w", True, False),) if name == "parametric_lif" else ()
    config, x, states, scalars = _op_args(name, signature=signature)
    lists = {"states": states, "initial": [], "tensor_params": [torch.zeros(5, dtype=D) for _ in config.tensors],
             "scalars": scalars, "more_inputs": [x.clone() for _ in config.input_keys[1:]]}
    given_list = lists[which]
    if change == "one more":
        given_list.append(given_list[-1] if given_list else (0.0 if which in ("initial", "scalars") else x[0]))
    elif change == "one less" and given_list:
        given_list.pop()
    elif change == "wrong dtype" and given_list and isinstance(given_list[0], torch.Tensor):
        given_list[0] = given_list[0].float()
    elif change == "wrong size" and given_list and isinstance(given_list[0], torch.Tensor):
        given_list[0] = torch.cat([given_list[0], given_list[0]])
    else:
        return  # nothing to make wrong in this list
    if which == "initial" and change == "one more":  # numbers beside tensor states
        match = "as tensors or as numbers, not both"
    else:
        names = {"states": r"states|_init", "initial": "states", "tensor_params": "tensor parameters|w:",
                 "scalars": "scalars", "more_inputs": r"step input|g_i_seq"}
        match = names[which]
    with pytest.raises((TypeError, ValueError), match=match) as caught:
        torch.ops.autocuda.neuron_forward(config.key, x, lists["states"], lists["initial"], lists["tensor_params"],
                                          lists["scalars"], False, False, True, lists["more_inputs"])
    assert not isinstance(caught.value, (KeyError, IndexError))
