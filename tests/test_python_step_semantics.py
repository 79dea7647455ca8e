"""Python step functions (`@autocuda.neuron`, FlexSN cores): what the whitelist accepts runs, through the generated
kernels (the host runner) and the reference, as the function itself does run eagerly in torch float64 step by step,
forward and backward (autograd through the eager loop, the surrogate standing in for the spike's derivative); what
it does not accept is refused by a SpecError that names the problem.

Pinned here, each once wrong:
- torch.relu and torch.clamp had the gradient of a min/max tie (1/2) at 0 and at a bound, where torch's is 0 (relu)
  and 1 (clamp): a membrane reset to 0 and rectified next step is exactly such a tie;
- F.relu (which passes inplace=False) was refused as "torch.relu with these arguments";
- a state whose new value is the spike itself, met before the membrane, crashed the mapping (AttributeError);
- a parameter named v_reset read by a step whose reset is not hard: the spec read it as 0, the step its value
  (`@autocuda.neuron` now refuses it, naming it; a FlexSN core's is renamed in the spec, and runs as the core);
- the membrane a spec of the step's own shape adds (`u`) collided with a parameter or input named u (a confusing
  "'u' is declared twice"), and a step with states u, u_spike and u_membrane crashed (StopIteration); an input named
  v_reset collided with the constant v_reset of a hard reset to a number;
- `//`, `%`, `divmod`, `round`, `@` on a step value raised Python's TypeError; `torch.clamp` without bounds ran
  as the identity (torch refuses it);
- a `**kwargs` signature was accepted (the step is called positionally: it got nothing there), a method's `self`
  was read as the input (an AttributeError deep in the mapping), a functools.partial or a callable object crashed on
  `__name__`, a builtin on `inspect.signature`'s ValueError.
"""
from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from backends import CPU_BACKENDS, NEEDS_HOST
from conftest import compile_launched, profile

import autocuda
from autocuda.base.errors import SpecError
from autocuda.call import functional as F
from autocuda.nn import FlexSN
from autocuda.spec import budget
from autocuda.spec.model import RESERVED
from autocuda.spec.step import input_names, spec_names
from autocuda.spec.surrogate import ATan, Sigmoid

SPIKE = Sigmoid()
F64 = torch.float64
T, N = 8, 9


# ---- the comparison: the kernels (or the reference) against the step run eagerly ----

def _layout(fn: Callable[..., Any], num_inputs: int) -> tuple[list[str], list[str], dict[str, float]]:
    """The step's inputs, states and parameters (with their defaults), as its signature names them."""
    signature = list(inspect.signature(fn).parameters.values())
    rest = signature[num_inputs:]
    return ([p.name for p in signature[:num_inputs]], [p.name for p in rest if p.default is inspect.Parameter.empty],
            {p.name: float(p.default) for p in rest if p.default is not inspect.Parameter.empty})


def _run(fn: Callable[..., Any], backend: str, *, seed: int = 0, num_inputs: int = 1, state_scale: float = 0.5,
         learnable: bool = True, **decorator: Any) -> tuple[list[torch.Tensor], list[torch.Tensor], Any]:
    """(eager [spikes, *final states, *gradients], kernels' the same, the spec): one loss of the spikes and the
    final states, its gradients for the inputs, the initial states and every parameter (tensors requiring grad)."""
    spec = autocuda.neuron(fn, num_inputs=num_inputs, **decorator)
    inputs, states, params = _layout(fn, num_inputs)
    g = torch.Generator().manual_seed(seed)
    xs = [(torch.rand(T, N, generator=g, dtype=F64) * 2 - 0.5) * 1.8 for _ in inputs]
    starts = {n: torch.rand(N, generator=g, dtype=F64) * state_scale for n in states}
    weights = torch.rand(T, N, generator=g, dtype=F64)
    final_weights = {n: torch.rand(N, generator=g, dtype=F64) for n in states}

    def leaves() -> tuple[list[torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        return ([x.clone().requires_grad_() for x in xs], {n: v.clone().requires_grad_() for n, v in starts.items()},
                {n: torch.tensor(v, dtype=F64, requires_grad=learnable) for n, v in params.items()})

    def results(spikes: torch.Tensor, finals: dict[str, torch.Tensor], x: list, s0: dict, p: dict) -> list:
        loss = (spikes * weights).sum() + sum((finals[n] * final_weights[n]).sum() for n in states)
        wrt = [*x, *s0.values(), *(p.values() if learnable else ())]
        grads = torch.autograd.grad(loss, wrt, allow_unused=True)
        return [spikes.detach(), *(finals[n].detach() for n in states),
                *(torch.zeros_like(w) if d is None else d for w, d in zip(wrt, grads))]

    x, s0, p = leaves()  # the step itself, eagerly
    state, spikes = dict(s0), []
    for t in range(T):
        out = fn(*(xi[t] for xi in x), *(state[n] for n in states), *(p[n] for n in params))
        spikes.append(out[0])
        state = dict(zip(states, out[1:]))
    eager = results(torch.stack(spikes), state, x, s0, p)

    x, s0, p = leaves()  # the kernels: the spec's states (the membrane first, maybe one more) and parameters
    spelled = dict(zip(states, spec_names(states, {*RESERVED, *input_names(inputs)}, "state")))
    by_spec = {spelled[n]: s0[n] for n in states}
    initial = [by_spec.get(s.name, torch.full((N,), float(s.init), dtype=F64)) for s in spec.states]
    names = {q.name for q in spec.params}
    kwargs = {(n if n in names else "v_reset"): v for n, v in p.items()}  # a hard reset's parameter is v_reset
    out_spikes, finals, _ = F.multi_step(spec, x[0] if num_inputs == 1 else tuple(x), *initial, backend=backend,
                                         **kwargs)
    order = [s.name for s in spec.states]
    kernels = results(out_spikes, {n: finals[order.index(spelled[n])] for n in states}, x, s0, p)
    return eager, kernels, spec


def _message(name: str, index: int, message: str) -> str:
    return f"{name}, result {index} (final states, then gradients): {message}"


def _same(fn: Callable[..., Any], backend: str, **options: Any) -> Any:
    eager, kernels, spec = _run(fn, backend, **options)
    fired = int(eager[0].sum())
    assert 0 < fired < eager[0].numel(), f"{fn.__name__}: a test that never (or always) fires checks little"
    assert torch.equal(kernels[0], eager[0]), f"{fn.__name__}: spikes"
    for i, (k, e) in enumerate(zip(kernels[1:], eager[1:])):
        torch.testing.assert_close(k, e, rtol=1e-10, atol=1e-12, msg=functools.partial(_message, fn.__name__, i + 1))
    return spec


# ---- accepted families ----

def where_branch(x, v, tau=2.0, vth=1.0):
    h = torch.where(v > 0.3, v + x / tau, v * 0.5 + x)
    s = SPIKE(h - vth)
    return s, h - s * vth


def min_max_abs(x, v, w, a=0.7, b=-0.2):
    h = torch.maximum(torch.minimum(v + x, 2.5 * a), b * torch.ones_like(v)) + abs(w) * 0.1
    s = SPIKE(h - 1.0)
    return s, h * (1 - s), torch.clamp(w + x, min=-1.0, max=1.0)


def powers(x, v, w, p=1.5, q=-0.5):
    h = v + x ** 2 * 0.1 + (abs(w) + 1) ** p * 0.1 + (abs(v) + 1) ** q + torch.rsqrt(1 + x * x) * 0.1
    s = SPIKE(h - 2.0)
    return s, h * (1 - s), (w * w + 1) ** -1.5 + x + 2 ** v * 0.1


def transcendental(x, v, w, tau=2.0):
    h = v + torch.tanh(x) / tau + torch.sigmoid(w) - torch.log(1 + torch.exp(-abs(v)))
    s = ATan(alpha=3.0)(h - 1.0)
    return s, h - s, torch.exp(-1 / tau) * w + s


def _scaled(value, gain):  # a helper the step calls; locals reassigned
    out = value * gain
    out = out + 1
    return out - 1


def helpers_and_constants(x, v, k=2, gain=0.5):
    y = x
    y = _scaled(y * 2, gain)
    h = v + (y - v) / k + 1 // 2 + math.pi * 0.01 * torch.sin(v)
    h = h * 0.9
    s = SPIKE(h - 1)
    return s, h * (1 - s)


def membrane_declared_second(x, w, v, c, a=0.5, unused=3.0):
    """States updated in another order than declared; a state that never changes; an unused parameter."""
    h = v + x - 0.1 * w + 0.1 * c
    s = SPIKE(h - 1.0)
    return s, w * a + s, h * (1 - s), c


def named_like_builtins(x, v, sum=2.0, pow=1.0, round=0.5, len=0.2, beta=0.3, gamma=0.2):
    h = v + x / sum + round * len * pow - beta * gamma
    s = SPIKE(h - 1.0)
    return s, h - s


def adaptive_threshold(x, v, a, beta=0.2, tau_a=20.0, v_reset=-0.1):
    h = v + (x - (v - v_reset)) / 2
    s = SPIKE(h - (1.0 + beta * a))
    return s, h * (1 - s) + v_reset * s, torch.exp(-1 / tau_a) * a + s


def detached_hard_reset(x, v, vr=0.1):
    h = 0.9 * v + x
    s = SPIKE(h - 1.0)
    sd = s.detach()
    return s, h * (1 - sd) + vr * sd


def where_reset(x, v, w, vr=-0.1):
    """A reset by torch.where on the spike (no gradient through it), the spike in an update's condition."""
    h = v * 0.9 + x + 0.1 * w
    s = SPIKE(h - 1.0, strict=True)
    return s, torch.where(s > 0, vr * torch.ones_like(h), h), w * 0.5 + torch.where(s >= 1, h, w) * (h > 0.5).float()


def conductance(g_e, g_i, v, E_e=3.0, E_i=-1.0, tau=2.0):
    h = v + (g_e * (E_e - v) + g_i * (E_i - v) - v) / tau
    s = SPIKE(h - 1.0)
    return s, h * (1 - s)


def fires_before_charging(x, last, v):
    """The spike of the state before the step, first among the states: its new value is the spike itself."""
    s = SPIKE(v - 1.0)
    return s, s, (v + x) * (1 - s)


def rectified(x, v, w, lo=0.0):
    """relu, clamp and friends at 0 after a hard reset to 0: ties, where torch has its own gradients."""
    h = torch.relu(v) + x + torch.nn.functional.relu(w) * 0.1
    s = SPIKE(h - 1.0)
    return s, h * (1 - s), w * 0.5 + torch.clamp(v, min=lo) + v.clamp(lo, lo + 1.0) + torch.clamp(v, max=0.0) + \
        v.clamp_min(0.0) - v.clamp_max(lo)


DEFAULT = [where_branch, powers, helpers_and_constants, membrane_declared_second, adaptive_threshold,
           where_reset, rectified, fires_before_charging]
SLOW = [min_max_abs, transcendental, named_like_builtins, detached_hard_reset, conductance]
OPTIONS: dict[Any, dict[str, Any]] = {conductance: {"num_inputs": 2}, rectified: {"state_scale": 0.0}}


def _launches() -> list[Callable[[], object]]:
    return [functools.partial(_run, fn, "host", **OPTIONS.get(fn, {})) for fn in DEFAULT]


@pytest.fixture(scope="module")
def host_kernels() -> int:
    """The host kernels of the default comparisons, compiled up front many to a compiler run."""
    return compile_launched(*_launches())


@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("fn", DEFAULT, ids=lambda f: f.__name__)
def test_accepted_steps_run_as_the_function_does(fn, backend, request, monkeypatch) -> None:
    monkeypatch.setenv(budget.BUDGET_VARIABLE, "120")
    if backend == "host":
        request.getfixturevalue("host_kernels")
    _same(fn, backend, **OPTIONS.get(fn, {}))


@pytest.mark.skipif(profile() != "slow", reason="more step families under --slow")
@pytest.mark.parametrize("backend", CPU_BACKENDS)
@pytest.mark.parametrize("fn", SLOW, ids=lambda f: f.__name__)
def test_more_accepted_steps_run_as_the_function_does(fn, backend, monkeypatch) -> None:
    monkeypatch.setenv(budget.BUDGET_VARIABLE, "120")
    _same(fn, backend, **OPTIONS.get(fn, {}))


# ---- faults found here ----

@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_relu_and_clamp_have_torchs_gradient_at_a_tie(backend, monkeypatch) -> None:
    """relu'(0) = 0 and clamp's x-gradient is 1 at a bound (torch's): they were min/max ties of gradient 1/2."""
    monkeypatch.setenv(budget.BUDGET_VARIABLE, "120")

    def step(x, v, w, lo=0.0):
        h = torch.relu(v) + x
        s = SPIKE(h - 1.0)
        return s, h * (1 - s), w * 0.5 + torch.clamp(v, min=lo) - torch.clamp(v, max=0.0)

    _same(step, backend, state_scale=0.0)  # v starts at 0 and returns to 0 after each spike


def test_clamp_with_bounds_the_wrong_way_round_is_torchs() -> None:
    """torch.clamp(x, lo, hi) with lo > hi is hi everywhere (and the x-gradient 0); parameters as bounds too."""
    def step(x, v, lo=1.0, hi=-1.0):
        h = torch.clamp(v + x, lo, hi) + v * 0.5 + x + torch.clamp(x, 0.5, 0.25)
        s = SPIKE(h - 1.0)
        return s, h * (1 - s)

    _same(step, "reference")


def test_functional_relu_is_accepted_and_its_in_place_form_refused() -> None:
    def step(x, v):
        h = torch.nn.functional.relu(v + x)
        s = SPIKE(h - 1.0)
        return s, h - s

    assert autocuda.neuron(step).charge == "where(v + x > 0, v + x, 0)"

    def in_place(x, v):
        h = torch.nn.functional.relu(v + x, inplace=True)
        s = SPIKE(h - 1.0)
        return s, h - s

    with pytest.raises(SpecError, match=r"relu\(\.\.\., inplace=True\) cannot be part of a neuron step"):
        autocuda.neuron(in_place)


@NEEDS_HOST
def test_a_state_that_is_the_spike_itself_maps(monkeypatch) -> None:
    monkeypatch.setenv(budget.BUDGET_VARIABLE, "120")
    spec = _same(fires_before_charging, "host")
    assert spec.reset == "hard"


def test_a_parameter_v_reset_read_without_a_hard_reset_is_refused_naming_it() -> None:
    def soft(x, v, tau=2.0, v_threshold=1.0, v_reset=-0.5):  # LIF's charge, soft reset
        h = v + (x - (v - v_reset)) / tau
        s = SPIKE(h - v_threshold)
        return s, h - s * v_threshold

    with pytest.raises(SpecError, match="parameter 'v_reset' is read by the step.*rename the argument") as err:
        autocuda.neuron(soft)
    assert err.value.field == "params.v_reset"

    def other_reset(x, v, v_reset=0.3, vr=-0.2):  # a hard reset to another parameter
        h = v + x - v_reset * 0.1
        s = SPIKE(h - 1.0)
        return s, h * (1 - s) + vr * s

    with pytest.raises(SpecError, match="parameter 'v_reset' is read by the step"):
        autocuda.neuron(other_reset)

    def unread(x, v, v_threshold=1.0, v_reset=0.3):  # kept, as before: the spec's 0 and the step's value agree
        h = v + x
        s = SPIKE(h - v_threshold)
        return s, h - s * v_threshold

    assert [p.name for p in autocuda.neuron(unread).params] == ["v_threshold", "v_reset"]


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_a_flexsn_static_input_v_reset_under_a_soft_reset_runs_as_the_core(backend) -> None:
    def core(x, v, v_reset):
        h = v + (x - (v - v_reset)) / 2.0
        s = SPIKE(h - 1.0)
        return s, h - s

    v_reset = torch.linspace(-0.5, 0.4, N, dtype=F64)
    layer = FlexSN(core, 1, (v_reset,), step_mode="m", backend=backend)
    x = torch.rand(T, N, dtype=F64, generator=torch.Generator().manual_seed(3)) * 2
    v, want = torch.zeros(N, dtype=F64), []
    for t in range(T):
        s, v = core(x[t], v, v_reset)
        want.append(s)
    assert torch.equal(layer(x), torch.stack(want))
    torch.testing.assert_close(layer.states[0], v, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_the_added_membrane_takes_a_free_name(backend, monkeypatch) -> None:
    """A step of its own shape (a spike against an input) gets one more state: never a parameter's, an input's or a
    state's name."""
    monkeypatch.setenv(budget.BUDGET_VARIABLE, "120")

    def param_u(x, v, u=0.5):
        s = SPIKE(v - x)
        return s, v * u + x

    def input_u(a, u, v):
        s = SPIKE(v - u)
        return s, v * 0.5 + u + a

    def states_u(x, u, u_spike, u_membrane):
        s = SPIKE(u - x)
        return s, u * 0.5 + x, u_spike + s * x, u_membrane * 0.5 + x

    assert _same(param_u, backend).states[0].name == "u_spike"
    assert _same(input_u, backend, num_inputs=2).states[0].name == "u_spike"
    assert _same(states_u, backend).states[0].name == "u_membrane1"


def test_an_input_named_v_reset_leaves_a_hard_reset_to_a_number_mapped() -> None:
    def step(v_reset, g, v):
        h = v * 0.9 + v_reset + g
        s = SPIKE(h - 1.0)
        return s, h * (1 - s) + 0.2 * s

    _same(step, "reference", num_inputs=2)


# ---- refusals: a SpecError that names the problem ----

def _lines(*body: str) -> Callable[..., Any]:
    namespace = {"torch": torch, "SPIKE": SPIKE, "math": math}
    exec("def step(x, v, tau=2.0):\n" + "".join(f"    {line}\n" for line in body), namespace)  # noqa: S102
    return namespace["step"]


G = torch.tensor(0.5)


def _global_tensor(x, v):
    h = v + x * G
    s = SPIKE(h - 1.0)
    return s, h - s


REFUSED_BODIES = {  # each refused at its line, naming what
    "if": (["h = v + x", "if h > 1:", "    h = h * 0.5", "s = SPIKE(h - 1.0)", "return s, h - s"], "Python `if`"),
    "while": (["h = v + x", "while h > 1:", "    h = h - 1", "s = SPIKE(h - 1.0)", "return s, h - s"], "Python `if`"),
    "for": (["h = v", "for t in x:", "    h = h + t", "s = SPIKE(h - 1.0)", "return s, h - s"], "iterating"),
    "+=": (["h = v + x", "h += 1", "s = SPIKE(h - 1.0)", "return s, h - s"], "in-place operation"),
    "mul_": (["h = v + x", "h.mul_(2)", "s = SPIKE(h - 1.0)", "return s, h - s"], "in-place method"),
    "cosh": (["h = v + torch.cosh(x)", "s = SPIKE(h - 1.0)", "return s, h - s"], "torch.cosh"),
    "math.exp": (["h = v + math.exp(x)", "s = SPIKE(h - 1.0)", "return s, h - s"], "math function"),
    "==": (["h = torch.where(v == 0, x, v + x)", "s = SPIKE(h - 1.0)", "return s, h - s"], "== on a tensor"),
    "&": (["h = torch.where((v > 0) & (v < 1), x, v)", "s = SPIKE(h - 1.0)", "return s, h - s"], "& | ~"),
    "index": (["h = v + x[0]", "s = SPIKE(h - 1.0)", "return s, h - s"], "indexing"),
    "//": (["h = (v + x) // 1", "s = SPIKE(h - 1.0)", "return s, h - s"], "//, %"),
    "%": (["h = (v + x) % 1.0", "s = SPIKE(h - 1.0)", "return s, h - s"], "//, %"),
    "round": (["h = round(v + x)", "s = SPIKE(h - 1.0)", "return s, h - s"], "round"),
    "floor": (["h = math.floor(v + x)", "s = SPIKE(h - 1.0)", "return s, h - s"], "floor"),
    "divmod": (["h = divmod(v, x)[0]", "s = SPIKE(h - 1.0)", "return s, h - s"], "divmod"),
    "@": (["h = v @ x", "s = SPIKE(h - 1.0)", "return s, h - s"], "matrix product"),
    "clamp()": (["h = torch.clamp(v + x)", "s = SPIKE(h - 1.0)", "return s, h - s"], "without min and max"),
    "two spikes": (["h = v + x", "s = SPIKE(h - 1.0)", "return s, h - s - SPIKE(h - 2.0)"], "second spike"),
    "lambda recursion": (["f = lambda a: f(a)", "return f(x)"], "recursion too deep"),
    "detach": (["h = (v + x).detach()", "s = SPIKE(h - 1.0)", "return s, h - s"], "detach"),
    "None state": (["h = v + x", "s = SPIKE(h - 1.0)", "return s, None"], "return value 1.*NoneType"),
    "tuple state": (["h = v + x", "s = SPIKE(h - 1.0)", "return s, (h,)"], "return value 1.*tuple"),
    "tensor state": (["h = v + x", "s = SPIKE(h - 1.0)", "return s, torch.zeros(3)"], "return value 1.*tensor"),
    "3 returns": (["h = v + x", "s = SPIKE(h - 1.0)", "return s, h - s, h"], "returned 3 values, not 2"),
    "no spike": (["h = v + x", "return (h > 1).float(), h"], "first value is not the spike"),
    "generator": (["yield SPIKE(v + x - 1.0)", "yield v"], "generator"),
}


@pytest.mark.parametrize("case", sorted(REFUSED_BODIES))
def test_refused_steps_name_the_problem(case) -> None:
    body, message = REFUSED_BODIES[case]
    with pytest.raises(SpecError, match=message):
        autocuda.neuron(_lines(*body))


class _Methods:
    def step(self, x, v, tau=2.0):
        h = v + x / tau
        s = SPIKE(h - 1.0)
        return s, h - s

    def __call__(self, x, v):
        h = v + x
        s = SPIKE(h - 1.0)
        return s, h - s


def _kwargs(x, v, **more):
    h = v + x / more.get("tau", 2.0)
    s = SPIKE(h - 1.0)
    return s, h - s


def _args(x, *states):
    return SPIKE(x - 1.0), *states


REFUSED_FUNCTIONS = {
    "global tensor": (_global_tensor, "a tensor made outside the step"),
    "**kwargs": (_kwargs, r"takes \*\*more"),
    "*args": (_args, r"takes \*args"),
    "method": (_Methods.step, "first argument is 'self'"),
    "partial": (functools.partial(_Methods().step, tau=3.0), "keyword-only argument 'tau'"),
    "builtin": (max, "expected a Python step function"),
}


@pytest.mark.parametrize("case", sorted(REFUSED_FUNCTIONS))
def test_refused_functions_name_the_problem(case) -> None:
    fn, message = REFUSED_FUNCTIONS[case]
    with pytest.raises(SpecError, match=message):
        autocuda.neuron(fn)


def test_bound_methods_and_callable_objects_are_steps() -> None:
    assert autocuda.neuron(_Methods().step).charge == "v + x/tau"
    spec = autocuda.neuron(_Methods())
    assert spec.name == "Methods" and spec.charge == "v + x"
