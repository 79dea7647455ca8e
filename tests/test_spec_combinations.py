"""User-written specs that combine features of the spec language (several inputs, several states reading each other,
an output expression, multi-level spikes, `fires_at = ">"`, learnable thresholds and reset values, constants,
kinks, `[ode]` with jumps), run as layers and through `autocuda.functional`: the generated kernels on the host
runner against autograd through the torch reference, in float64 (spikes and states to 1e-12, gradients of the
inputs, the initial states and the learnable parameters to 1e-10).

Pinned here, where it once went otherwise: a spec with a learnable `v_reset` run under a soft reset or none (a
call's `reset=`, a layer's `v_reset=None`) failed in the host backward (KeyError 'grad_v_reset': the kernels have no
v_reset there); a min or max of three arguments at a three-way tie gave each 1/2 of the gradient (3/2 in all)
where the reference folds it in pairs (1/4, 1/4, 1/2); a functional call that left out a state starting at a
constant parameter raised KeyError; a triangular linear ODE of three states listed in an order in which A is not
triangular was not integrated exactly (`method = "exact"` fell back to exponential Euler, with a warning)."""
from __future__ import annotations

import warnings

import pytest
import torch
from autocuda.testing import check_spec
from backends import NEEDS_HOST

from autocuda.call import functional
from autocuda.nn import Neuron
from autocuda.spec.load import spec_from_toml

F64 = torch.float64

# A ternary spike whose negative level reads a second state, firing strictly above, hard reset to a learnable
# v_reset, a learnable threshold that also starts the second state, a constant, a kink, an analog output.
TERNARY = spec_from_toml('''
name = "combo_ternary"
charge = "v + x * gain - leak * v"
fires_at = ">"
output = "s * v_threshold + 0.1 * w"
[params]
gain = { default = 1.0, kind = "constant" }
leak = { default = 0.1, learnable = true, domain = ">= 0, <= 1" }
v_threshold = { default = 1.0, learnable = true }
v_reset = { default = 0.1, learnable = true }
[states]
v = "v_reset"
w = "v_threshold"
[updates]
w = "0.5 * w + s + 0.1 * max(h, -1)"
[[levels]]
argument = "h - v_threshold"
[[levels]]
argument = "-h - v_threshold - 0.2 * w"
weight = -1.0
[levels.surrogate]
name = "ATan"
alpha = 3.0
''', source="combo_ternary.toml")

# Two step inputs, an adaptive threshold through abs, a where on a state, learnable tau, beta and threshold, a state
# starting at a parameter, a soft reset and an output of the states.
TWO_INPUTS = spec_from_toml('''
name = "combo_two_inputs"
inputs = ["ge", "gi"]
charge = "v + (ge * (2.0 - v) + gi * (-1.0 - v) - v) / tau + where(a > 0.3, -0.1 * a, 0.05 * a)"
threshold = "v_threshold + beta * abs(a)"
reset = "soft"
output = "v + a"
[params]
tau = { default = 2.0, learnable = true, domain = "> 0" }
beta = { default = 0.2, learnable = true }
v_threshold = { default = 1.0, learnable = true }
rho = 0.9
[states]
v = 0.0
a = "rho"
[updates]
a = "rho * a + s - 0.1 * min(h, 1.5) + 0.2 * ge"
''', source="combo_two_inputs.toml")

# Minima and maxima of three and four arguments, met at ties (states and k start at 0, x is 0), and a state starting
# at a constant.
TIES = spec_from_toml('''
name = "combo_ties"
charge = "v + max(x, w, k) + min(x, w, k) + max(x, 0, k, w)"
reset = "none"
[params]
k = { default = 0.0, learnable = true }
c0 = { default = 0.25, kind = "constant" }
v_threshold = 10.0
[states]
v = 0.0
w = "c0"
[updates]
w = "max(h, 0.5 * w, 0) - c0"
''', source="combo_ties.toml")


def _ode(order: tuple[str, ...]) -> str:
    equations = {"i": 'i = "-i / tau_s + x"', "v": 'v = "(-v + R * i - a) / tau"', "a": 'a = "-a / tau_a"'}
    return '''
name = "combo_ode"
reset = "soft"
output = "v + 0.5 * i"
[params]
tau = { default = 2.0, learnable = true }
tau_s = 4.0
tau_a = 8.0
R = { default = 1.0, learnable = true }
v_threshold = { default = 1.0, learnable = true }
[states]
v = 0.0
i = 0.0
a = 0.0
[jumps]
a = "a + 0.2"
[ode]
''' + "\n".join(equations[name] for name in order)


def _leaves(xs, states, params):  # type: ignore[no-untyped-def]
    xs = [x.detach().clone().requires_grad_(True) for x in xs]
    states = [s.detach().clone().requires_grad_(True) if isinstance(s, torch.Tensor) else s for s in states]
    params = {k: v.detach().clone().requires_grad_(True) if isinstance(v, torch.Tensor) else v
              for k, v in params.items()}
    return xs, states, params


def _gradients(outputs, leaves):  # type: ignore[no-untyped-def]
    """The gradients of a fixed random weighting of every output (a leaf that none reaches: zeros)."""
    weights = torch.Generator().manual_seed(7)
    loss = sum((o * torch.randn(o.shape, generator=weights, dtype=F64)).sum() for o in outputs)
    found = torch.autograd.grad(loss, leaves, allow_unused=True)
    return [torch.zeros_like(leaf) if g is None else g for g, leaf in zip(found, leaves)]


def _functional(spec, backend, xs, states, params, single=False, **kw):  # type: ignore[no-untyped-def]
    xs, states, params = _leaves(xs, states, params)
    if single:
        outputs, current = [], list(states)
        for t in range(xs[0].shape[0]):
            step = [x[t] for x in xs]
            spike, current = functional.single_step(spec, step[0] if len(step) == 1 else tuple(step), *current,
                                                    backend=backend, **params, **kw)
            outputs += [spike, *current]
    else:
        spikes, finals, seqs = functional.multi_step(spec, xs[0] if len(xs) == 1 else tuple(xs), *states,
                                                     backend=backend, store_state_seq=True, **params, **kw)
        outputs = [spikes, *finals, *seqs]
    leaves = [*xs, *(s for s in states if isinstance(s, torch.Tensor)),
              *(v for v in params.values() if isinstance(v, torch.Tensor))]
    return [o.detach() for o in outputs], _gradients(outputs, leaves)


def _layer(spec, backend, xs, step_mode, init=None, **params):  # type: ignore[no-untyped-def]
    layer = Neuron(spec, step_mode=step_mode, backend=backend, store_v_seq=True, **params).double()
    xs = [x.detach().clone().requires_grad_(True) for x in xs]
    for name, value in (init or {}).items():
        setattr(layer, name, value.detach().clone().requires_grad_(True))
    initial = [getattr(layer, name) for name in init or {}]
    if step_mode == "m":
        out, v_seq = layer(*xs), layer.v_seq
    else:
        out = torch.stack([layer(*[x[t] for x in xs]) for t in range(xs[0].shape[0])])
        v_seq = torch.stack(list(layer.v_seq))
    outputs = [out, v_seq, *(getattr(layer, s.name) for s in spec.states)]
    return [o.detach() for o in outputs], _gradients(outputs, [*xs, *initial, *layer.parameters()])


def _agree(run, *args, **kw) -> None:  # type: ignore[no-untyped-def]
    (want, want_grads), (got, got_grads) = run(args[0], "reference", *args[1:], **kw), run(args[0], "host", *args[1:],
                                                                                            **kw)
    assert len(got) == len(want) and len(got_grads) == len(want_grads)
    for i, (g, w) in enumerate(zip(got, want)):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-12, msg=lambda m, i=i: f"output {i}: {m}")
    for i, (g, w) in enumerate(zip(got_grads, want_grads)):
        torch.testing.assert_close(g, w, rtol=0, atol=1e-10, msg=lambda m, i=i: f"gradient {i}: {m}")


def _uniform(*shape: int, scale: float, seed: int) -> torch.Tensor:
    return (torch.rand(*shape, generator=torch.Generator().manual_seed(seed), dtype=F64) * 2 - 1) * scale


T, N = 6, 8


@NEEDS_HOST
@pytest.mark.parametrize("single", [False, True])
def test_ternary_levels_with_learnable_threshold_and_reset(single: bool) -> None:
    x = _uniform(T, N, scale=2.0, seed=1)
    params = {"leak": torch.full((N,), 0.1, dtype=F64), "v_threshold": torch.tensor(1.0, dtype=F64),
              "v_reset": _uniform(N, scale=0.1, seed=2) + 0.1}
    states = (_uniform(N, scale=1.0, seed=3), _uniform(N, scale=1.0, seed=4))
    _agree(_functional, TERNARY, [x], (), params, single)
    _agree(_functional, TERNARY, [x], states, params, single, detach_reset=True)
    _agree(_layer, TERNARY, [x], "s" if single else "m", init={"v": states[0]})


@NEEDS_HOST
@pytest.mark.parametrize("reset", ["soft", "none"])
def test_learnable_v_reset_under_a_soft_reset_or_none(reset: str) -> None:
    """The equations read v_reset as 0 there: no gradient of it, and the host backward returns the others' (it
    looked for v_reset's among the kernels' outputs: KeyError 'grad_v_reset')."""
    x = _uniform(T, N, scale=2.0, seed=5)
    params = {"leak": torch.full((N,), 0.1, dtype=F64), "v_threshold": torch.tensor(1.0, dtype=F64)}
    states = (_uniform(N, scale=1.0, seed=6), _uniform(N, scale=1.0, seed=7))
    _agree(_functional, TERNARY, [x], states, params, reset=reset)
    _agree(_functional, TERNARY, [x], states, params, True, reset=reset)
    if reset == "soft":  # SpikingJelly's v_reset=None: the layer's learnable v_reset is no parameter
        for step_mode in "ms":
            _agree(_layer, TERNARY, [x], step_mode, v_reset=None)


@NEEDS_HOST
def test_two_inputs_adaptive_threshold_and_output() -> None:
    ge = torch.rand(5, N, generator=torch.Generator().manual_seed(8), dtype=F64) * 1.5
    gi = torch.rand(5, N, generator=torch.Generator().manual_seed(9), dtype=F64) * 0.5
    params = {"tau": torch.full((N,), 2.0, dtype=F64), "beta": torch.tensor(0.2, dtype=F64),
              "v_threshold": torch.tensor(1.0, dtype=F64)}
    states = (_uniform(N, scale=0.5, seed=10), _uniform(N, scale=1.0, seed=11))
    _agree(_functional, TWO_INPUTS, [ge, gi], (), params)
    _agree(_functional, TWO_INPUTS, [ge, gi], states, params, True, detach_reset=True)
    for step_mode in "ms":
        _agree(_layer, TWO_INPUTS, [ge, gi], step_mode, init={"v": states[0]},
               tau=torch.nn.Parameter(torch.full((N,), 2.5)))
    assert check_spec(TWO_INPUTS, dtypes=["float64"], resets=["soft"], examples=2).passed


@NEEDS_HOST
@pytest.mark.parametrize("single", [False, True])
def test_min_and_max_of_more_than_two_at_ties(single: bool) -> None:
    """The derivative of max(a, b, c) at a three-way tie was 1/2 for each argument (sympy's, 3/2 in all); autograd
    through the reference folds the arguments in pairs, 1/4, 1/4, 1/2, and so does the derivation now."""
    x = torch.tensor([[0.0, 0.0, 1.0, -1.0], [0.0, 0.5, 0.0, 0.0], [0.0, 0.0, 0.0, 0.0]], dtype=F64)
    zeros = torch.zeros(4, dtype=F64)
    _agree(_functional, TIES, [x], (zeros, zeros), {"k": zeros}, single)


@NEEDS_HOST
@pytest.mark.parametrize("backend", ["reference", "host"])
def test_a_state_left_out_starts_at_a_constant(backend: str) -> None:
    """w = "c0", a constant parameter: a call that leaves w out starts it at c0's value, the default or the call's
    (it raised KeyError 'c0': the call's values hold no constant, which the kernels fold in)."""
    x = torch.zeros(1, 3, dtype=F64)
    for given, c0 in (({}, 0.25), ({"c0": 0.5}, 0.5)):
        _, finals, _ = functional.multi_step(TIES, x, backend=backend, **given)
        _, (_, w) = functional.single_step(TIES, x[0], backend=backend, **given)
        # h = max(0, c0, 0) + min(0, c0, 0) + max(0, 0, 0, c0) = 2 c0; w = max(h, c0 / 2, 0) - c0 = c0
        assert torch.equal(finals[1], torch.full((3,), c0, dtype=F64)) and torch.equal(w, finals[1])
    assert Neuron(TIES, backend=backend, c0=0.5).w == 0.5


@pytest.mark.parametrize("order", [("v", "i", "a"), ("i", "v", "a"), ("a", "v", "i")])
def test_triangular_ode_of_three_states_is_exact_in_any_order(order: tuple[str, ...]) -> None:
    """di/dt reads i, da/dt reads a, dv/dt reads all three: A is triangular with the states in the order v, i, a (or
    i, a, v), not as i, v, a lists them; in that order the exact step fell back to exponential Euler (a warning)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        spec = spec_from_toml(_ode(order), source="combo_ode.toml")
        parsed = spec.parsed()
    want = spec_from_toml(_ode(("v", "i", "a")), source="combo_ode.toml").parsed()
    assert parsed.method == "exact"
    assert (parsed.charge, dict(parsed.updates)) == (want.charge, dict(want.updates))


@NEEDS_HOST
def test_exact_ode_with_jump_learnable_and_output() -> None:
    spec = spec_from_toml(_ode(("i", "v", "a")), source="combo_ode.toml")
    x = _uniform(4, 2, 3, scale=3.0, seed=12)
    params = {"tau": 2.0 + _uniform(3, scale=0.1, seed=13), "R": torch.ones(3, dtype=F64),
              "v_threshold": torch.tensor(0.8, dtype=F64)}
    _agree(_functional, spec, [x], tuple(_uniform(2, 3, scale=1.0, seed=s) for s in (14, 15, 16)), params)
    _agree(_layer, spec, [x], "s", tau=torch.nn.Parameter(torch.full((3,), 2.2)))
