"""Check generated neuron kernels against the reference: hypothesis strategies and `check_spec`.

One *case* is a setup (spec x dtype x reset x detach_reset) with one random input set. Checking it:
  1. the float64 inputs are rounded to what the kernel sees (x, states and incoming gradients to the storage
     dtype; parameters to the arithmetic dtype), so kernel and reference compute from identical values;
  2. the reference (`autocuda.reference`, float64, autograd through the surrogate) gives spikes, h, states and
     the gradients of x, of the initial states and of every learnable parameter (per neuron);
  3. the generated kernels run through `autocuda.runtime.neuron_launch` on the chosen backend: FPTT, then BPTT on what
     that forward saved; step-forward, then step-backward, for one step from states the dynamics reached;
  4. every output is compared within the dtype's tolerance (TOLERANCES), spikes exactly.

Spikes are discontinuous. Where h is within rounding of the threshold the kernel may rightly decide otherwise
than the reference, and from then on that neuron's states legitimately differ. Such neurons are *ambiguous*:
their forward outputs are compared only before their first ambiguous step, and none of their gradients (the
adjoint of step t depends on every later step). Restarting each step from the reference's states (teacher
forcing) would be finer, but a fused multi-step kernel cannot be restarted; masking drops only neurons on which
both computations may legitimately disagree, and the report counts them.

Limits: surrogate gradients with jumps away from 0 (PiecewiseQuadratic's |z| = 1/alpha and the like) are not
masked; a rounding-sized difference there can fail a low-precision check.

Use: `check_spec(spec, backend="host", raise_on_failure=True)` runs a few seeded cases of every variant; in a
hypothesis test, `@given(case=cases(Setup(spec, "float16", "soft")))` then `assert check_case(case).passed`.
"""
from __future__ import annotations

import functools
import math
import os
import zlib
from collections.abc import Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import sympy
import torch

from . import reference
from .codegen.neuron import REPLAY_STEPS, KernelOptions, replay_steps
from .dtypes import get_dtype
from .runtime.neuron_launch import NeuronConfig, backward, forward, replay_option
from .spec.derive import THRESHOLD, H, StepSystem
from .spec.model import NeuronSpec, Param, check_reset, load_spec
from .spec.system import initial_value
from .spec.torch_eval import evaluate
from .surrogate import Surrogate, get_surrogate

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

__all__ = ["TOLERANCES", "Tolerance", "Setup", "Inputs", "Case", "Comparison", "CaseReport", "Report",
           "shapes", "params_for", "inputs_for", "cases", "make_params", "make_inputs", "make_case",
           "check_case", "check_spec"]

F64 = torch.float64
DTYPES = ("float32", "float64", "float16", "bfloat16")
BOUND = 1e3          # inputs are scaled down until every state stays below this (and finite)
FIRE_RATE = 0.3      # input calibration aims at this fraction of spiking neuron-steps


@dataclass(frozen=True)
class Tolerance:
    """|kernel - reference| <= rtol |reference| + atol scale, where scale is the largest magnitude among the
    output's family (forward values or gradients, see _compare_run); a spike is ambiguous where
    |h - threshold| <= margin (|h| + |threshold|)."""

    rtol: float
    atol: float
    margin: float


# Why these numbers. In brackets: the worst error seen, as a fraction of the tolerance, over ~1300 host cases of
# the shipped specs (T <= 8, N <= 33) and ~200 cases on an H100 (N up to 262144, vectorised layouts).
# - float64: 1e-16 per operation; the kernel evaluates the CSE'd derived adjoint, the reference autograd's
#   chain, so orders differ and terms cancel over up to 8 steps. [0.003]
# - float32: arithmetic in float (6e-8 per operation) from identical rounded inputs; 1e-5 leaves room for
#   cancellation and exp/div in the adjoint. [0.12]
# - float16 / bfloat16: arithmetic in float, but h, states and gradients are stored with 11 / 8 significant
#   bits (relative 4.9e-4 / 3.9e-3): the tolerances are about 10 units of storage rounding. Backward
#   recomputes v[t-1] and the surrogate from the *stored* h, sigma' amplifies an error in h by up to alpha
#   (4 for Sigmoid), and adjoints add such errors over T steps. [0.17 / 0.18]
#   The margins are 8 half-units of storage rounding of h (and of a state-dependent threshold); they mask
#   about 2% (float16) and 10% (bfloat16) of the neurons of an 8-step run, none in float32/float64.
TOLERANCES: Mapping[str, Tolerance] = {
    "float64": Tolerance(rtol=1e-12, atol=1e-12, margin=1e-12),
    "float32": Tolerance(rtol=1e-5, atol=1e-5, margin=1e-5),
    "float16": Tolerance(rtol=5e-3, atol=5e-3, margin=2e-3),
    "bfloat16": Tolerance(rtol=4e-2, atol=4e-2, margin=1.6e-2),
}


# -- what is checked -------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Setup:
    """What selects the kernels of a check (everything but shapes and values)."""

    spec: NeuronSpec
    dtype: str = "float32"
    reset: str = "hard"
    detach_reset: bool = False
    surrogate: Surrogate | None = None        # None: the spec's
    constants: tuple[tuple[str, float], ...] = ()
    per_neuron: bool = True                   # tensor parameters hold one value per neuron (else one, shared)
    store_state_seq: bool = True              # FPTT writes every state sequence, BPTT takes their gradients
    layout: tuple[tuple[str, Any], ...] = ()  # kernel layout options (lanes, vector, ...); () lets the launch choose

    def config(self) -> NeuronConfig:
        runtime = {p.name for p in _base_config(self).derivation().system.params}
        tensors = tuple((p.name, self.per_neuron) for p in self.spec.params if p.kind == "tensor" and p.name in runtime)
        return NeuronConfig(self.spec, self.surrogate or self.spec.surrogate, check_reset(self.spec, self.reset),
                            self.detach_reset, self.constants, tensors)

    @property
    def label(self) -> str:
        options = [self.reset] + ["detach_reset"] * self.detach_reset + ["shared"] * (not self.per_neuron)
        options += [f"{k}={v}" for k, v in self.layout]
        return f"{self.spec.name} {self.dtype} {' '.join(options)}"


def _base_config(setup: Setup) -> NeuronConfig:
    return NeuronConfig(setup.spec, setup.spec.surrogate, check_reset(setup.spec, setup.reset), setup.detach_reset,
                        setup.constants)


@dataclass(frozen=True, eq=False)
class Inputs:
    """float64 values of one run: x [T, N] (the first step input; `more_x` the others of a spec with several),
    initial states [N], incoming gradients (of spikes [T, N], final states [N] and, when state sequences are
    compared, of the state sequences [T, N])."""

    x: torch.Tensor
    initial: dict[str, torch.Tensor]
    grad_spike: torch.Tensor
    grad_final: dict[str, torch.Tensor]
    grad_seq: dict[str, torch.Tensor] = field(default_factory=dict)
    more_x: tuple[torch.Tensor, ...] = ()

    @property
    def all_x(self) -> tuple[torch.Tensor, ...]:
        """Every step input's sequence, in the spec's order."""
        return (self.x, *self.more_x)


@dataclass(frozen=True, eq=False)
class Case:
    """A setup with values: parameters (floats; tensors [N] or [1]), a multi-step run and a single step."""

    setup: Setup
    params: dict[str, Any]
    multi: Inputs
    single: Inputs          # T = 1, from states the multi-step dynamics reached

    @property
    def label(self) -> str:
        steps, neurons = self.multi.x.shape
        return f"{self.setup.label} T={steps} N={neurons}"


# -- random values --------------------------------------------------------------------------------------------
def _runtime_params(setup: Setup) -> list[Param]:
    names = {p.name for p in _base_config(setup).derivation().system.params}
    return [p for p in setup.spec.params if p.name in names]


def _near(default: float, u: torch.Tensor | float, spread: float) -> torch.Tensor | float:
    """A value near `default` (u in [-1, 1] picks where): same sign, within a factor exp(spread); 0 -> +-spread."""
    if default == 0:
        return spread * u
    return default * (torch.exp(spread * u) if isinstance(u, torch.Tensor) else math.exp(spread * u))


def make_params(setup: Setup, neurons: int, offsets: Mapping[str, float], seed: int, spread: float = 0.1
                ) -> dict[str, Any]:
    """Runtime parameters near their defaults: scalars as floats, tensor ones [N] (per neuron) or [1]."""
    generator = torch.Generator().manual_seed(seed)
    values: dict[str, Any] = {}
    for p in _runtime_params(setup):
        u: float | torch.Tensor = offsets.get(p.name, 0.0)
        if p.kind == "tensor":
            size = neurons if setup.per_neuron else 1
            u = u + 0.5 * (2 * torch.rand(size, generator=generator, dtype=F64) - 1)
        values[p.name] = _near(p.default, u, spread)
    return values


def _symbols(setup: Setup, params: Mapping[str, Any]) -> dict:
    return {s: params[s.name] for s in _base_config(setup).derivation().system.params}


def _membrane_scale(setup: Setup, params: Mapping[str, Any]) -> float:
    """|threshold - v_init| at the given parameters: the size of state noise (1 where that is 0)."""
    system = _base_config(setup).derivation().system
    starts = [_initial(setup, s.name, params) for s in system.states]
    values = {**_symbols(setup, params), **{s: v for s, v in zip(system.states, starts)}}
    scale = float((evaluate(system.threshold, values) - starts[0]).abs().max())
    return scale if math.isfinite(scale) and scale > 0 else 1.0


def _initial(setup: Setup, state: str, params: Mapping[str, Any]) -> torch.Tensor | float:
    """A state's initial value under the given parameters (a parameter's value, possibly one per neuron)."""
    values = {**{p.name: p.default for p in setup.spec.params}, **params}
    init = initial_value(setup.spec, state, check_reset(setup.spec, setup.reset), values)
    return values.get(init, init) if isinstance(init, str) else init


def _simulate(setup: Setup, xs: Sequence[torch.Tensor], initial: Sequence[torch.Tensor], params: Mapping[str, Any]
              ) -> tuple[torch.Tensor, list[torch.Tensor]] | None:
    """Reference forward without gradients over the step inputs `xs` (one [T, N] each): (spikes, per state
    [initial, states...] as [T+1, N]) or None when a state leaves [-BOUND, BOUND] or stops being finite."""
    config = _base_config(setup)
    system = config.derivation().system
    with torch.no_grad():
        spikes, _, seqs = reference.multi_step(system, tuple(xs), list(initial), _symbols(setup, params),
                                               config.surrogate, setup.detach_reset)
    trajectories = [torch.cat([i.expand(1, xs[0].shape[1]), s]) for i, s in zip(initial, seqs)]
    if not all(torch.isfinite(t).all() and t.abs().max() <= BOUND for t in trajectories):
        return None
    return spikes, trajectories


def _input_gain(setup: Setup) -> float:
    return _calibrated_gain(setup.spec, setup.reset, setup.constants)


@functools.lru_cache(maxsize=256)
def _calibrated_gain(spec: NeuronSpec, reset: str, constants: tuple[tuple[str, float], ...]) -> float:
    """The input scale g (each input g (z + 0.5), z standard normal) whose fire rate at the default parameters
    is closest to FIRE_RATE with bounded states: neurons both fire and stay silent, whatever the spec's units."""
    base = Setup(spec, "float64", reset, constants=constants, per_neuron=False)
    params = make_params(base, 1, {}, 0, spread=0.0)
    generator = torch.Generator().manual_seed(0)
    zs = [torch.randn(16, 256, generator=generator, dtype=F64) + 0.5 for _ in spec.inputs]
    initial = [torch.zeros(256, dtype=F64) + _initial(base, s.name, params) for s in spec.states]
    rated = []
    for gain in (2.0 ** k for k in range(-10, 11)):
        run = _simulate(base, [gain * z for z in zs], initial, params)
        if run is not None:
            rated.append((abs(float((run[0] != 0).to(F64).mean()) - FIRE_RATE), gain))  # any level counts
    if not rated or min(rated)[0] > FIRE_RATE - 0.02:
        raise ValueError(f"{spec.name} ({reset} reset): no input scale in 2^-10..2^10 makes its neurons "
                         f"fire at a moderate rate with states inside +-{BOUND:g}; check the spec's defaults")
    return min(rated)[1]


def make_inputs(setup: Setup, params: Mapping[str, Any], shape: tuple[int, int], seed: int, gain: float = 0.0
                ) -> tuple[Inputs, Inputs]:
    """Random (multi-step, single-step) inputs; `gain` in [-1, 1] scales x (every step input) by 2**(gain/2)
    around the calibrated scale. x is halved until the reference's states stay bounded; the single step starts
    from states the multi-step reference reached (a random step per neuron), so resets and adaptation are
    exercised."""
    steps, neurons = shape
    generator = torch.Generator().manual_seed(seed)

    def randn(*size: int) -> torch.Tensor:
        return torch.randn(*size, generator=generator, dtype=F64)

    scale = _input_gain(setup) * 2.0 ** (gain / 2)
    # x first, then each further input (none for most specs: their draws are those of one input)
    xs = [scale * (randn(steps, neurons) + 0.5)]
    x_steps = [scale * (randn(1, neurons) + 0.5)]
    for _ in setup.spec.inputs[1:]:
        xs.append(scale * (randn(steps, neurons) + 0.5))
        x_steps.append(scale * (randn(1, neurons) + 0.5))
    noise = 0.3 * _membrane_scale(setup, params)
    names = [s.name for s in setup.spec.states]
    initial = [_initial(setup, s, params) + noise * randn(neurons) for s in names]
    run = _simulate(setup, xs, initial, params)
    for _ in range(8):
        if run is not None:
            break
        xs, x_steps = [x / 2 for x in xs], [x / 2 for x in x_steps]
        run = _simulate(setup, xs, initial, params)
    if run is None:
        raise ValueError(f"{setup.label}: the reference diverges even with 1/256 of the calibrated input")
    pick = torch.randint(0, steps + 1, (1, neurons), generator=generator)
    starts = [trajectory.gather(0, pick)[0] for trajectory in run[1]]

    def grads(t: int, seqs: bool) -> dict[str, Any]:
        return {"grad_spike": randn(t, neurons), "grad_final": {s: randn(neurons) for s in names},
                "grad_seq": {s: randn(t, neurons) for s in names} if seqs else {}}

    multi = Inputs(xs[0], dict(zip(names, initial)), **grads(steps, setup.store_state_seq), more_x=tuple(xs[1:]))
    single = Inputs(x_steps[0], dict(zip(names, starts)), **grads(1, False), more_x=tuple(x_steps[1:]))
    return multi, single


def make_case(setup: Setup, shape: tuple[int, int], seed: int, offsets: Mapping[str, float] | None = None,
              gain: float = 0.0) -> Case:
    """A deterministic case; parameter offsets are drawn from `seed` unless given (each in [-1, 1])."""
    generator = torch.Generator().manual_seed(seed)
    if offsets is None:
        offsets = {p.name: 2 * float(torch.rand((), generator=generator, dtype=F64)) - 1
                   for p in _runtime_params(setup)}
    params = make_params(setup, shape[1], offsets, seed)
    multi, single = make_inputs(setup, params, shape, seed + 1, gain)
    return Case(setup, params, multi, single)


# -- hypothesis strategies -----------------------------------------------------------------------------------
def shapes(max_steps: int = 8, max_neurons: int = 33) -> SearchStrategy[tuple[int, int]]:
    """(T, N): T from 1; N odd (1 included) half of the time, any size otherwise."""
    from hypothesis import strategies as st
    odd = st.integers(0, (max_neurons - 1) // 2).map(lambda k: 2 * k + 1)
    return st.tuples(st.integers(1, max_steps), st.one_of(odd, st.integers(1, max_neurons)))


def params_for(spec: NeuronSpec, reset: str = "hard", neurons: int = 1, *, per_neuron: bool = True,
               constants: Mapping[str, float] | None = None, spread: float = 0.1
               ) -> SearchStrategy[dict[str, Any]]:
    """Runtime parameters near the defaults (same sign, within a factor e**spread; 0 -> +-spread); tensor
    parameters (learnable ones included) vary per neuron when `per_neuron`."""
    from hypothesis import strategies as st
    setup = Setup(spec, "float64", reset, constants=tuple(sorted((constants or {}).items())), per_neuron=per_neuron)
    offsets = st.fixed_dictionaries({p.name: st.floats(-1, 1) for p in _runtime_params(setup)})
    return st.builds(lambda o, seed: make_params(setup, neurons, o, seed, spread), offsets, st.integers(0, 2**31))


def inputs_for(spec: NeuronSpec, reset: str, shape: tuple[int, int], params: Mapping[str, Any], *,
               constants: Mapping[str, float] | None = None, state_seqs: bool = True) -> SearchStrategy[Inputs]:
    """Multi-step inputs: x scaled (per spec, calibrated) so that neurons both fire and not, never all zeros."""
    from hypothesis import strategies as st
    setup = Setup(spec, "float64", reset, constants=tuple(sorted((constants or {}).items())),
                  store_state_seq=state_seqs)
    return st.builds(lambda seed, gain: make_inputs(setup, params, shape, seed, gain)[0],
                     st.integers(0, 2**31), st.floats(-1, 1))


def cases(setup: Setup, max_steps: int = 8, max_neurons: int = 33) -> SearchStrategy[Case]:
    """Whole cases of `setup`: shape, parameter offsets, seed and input scale drawn by hypothesis."""
    from hypothesis import strategies as st
    offsets = st.fixed_dictionaries({p.name: st.floats(-1, 1) for p in _runtime_params(setup)})
    return st.builds(lambda shape, o, seed, gain: make_case(setup, shape, seed, o, gain),
                     shapes(max_steps, max_neurons), offsets, st.integers(0, 2**31), st.floats(-1, 1))


# -- checking -------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Comparison:
    """One output against the reference: `worst` is the largest error as a multiple of its tolerance."""

    name: str               # kernel and output, e.g. "bptt grad_x_seq"
    worst: float            # <= 1 passes (inf: a spike differs, or a value is NaN)
    max_abs: float          # largest |kernel - reference|
    compared: int           # values compared (ambiguous neurons excluded)
    failed: int             # values outside the tolerance

    @property
    def passed(self) -> bool:
        return self.failed == 0


@dataclass(frozen=True)
class CaseReport:
    label: str
    comparisons: tuple[Comparison, ...]
    neurons: int
    ambiguous: int          # neurons masked (partly, in forward) because a spike was within rounding

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.comparisons)

    @property
    def worst(self) -> float:
        return max((c.worst for c in self.comparisons), default=0.0)

    def describe(self) -> str:
        lines = [f"{self.label}: {'passed' if self.passed else 'FAILED'} (worst {self.worst:.3g} x tolerance, "
                 f"{self.ambiguous} of {self.neurons} neurons ambiguous)"]
        lines += [f"    {c.name}: {c.failed} of {c.compared} values off, max |error| {c.max_abs:.3g}, "
                  f"worst {c.worst:.3g} x tolerance" for c in self.comparisons if not c.passed]
        return "\n".join(lines)


@dataclass
class Report:
    """The cases of a check; `summary()` lists the failures, `raise_on_failure()` turns them into an error."""

    cases: list[CaseReport]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.cases)

    @property
    def failures(self) -> list[CaseReport]:
        return [c for c in self.cases if not c.passed]

    def summary(self) -> str:
        head = f"{len(self.cases)} cases, {len(self.failures)} failed"
        return "\n".join([head, *(c.describe() for c in self.failures)])

    def raise_on_failure(self) -> None:
        if not self.passed:
            raise AssertionError("generated kernels disagree with the reference: " + self.summary())


def _compare(name: str, got: torch.Tensor, want: torch.Tensor, rtol: float, atol: float,
             scale: float | None = None) -> Comparison:
    if want.numel() == 0:
        return Comparison(name, 0.0, 0.0, 0, 0)
    scale = float(want.abs().max()) if scale is None else scale
    allowed = atol * (scale if scale > 0 else 1.0) + rtol * want.abs()
    diff = (got - want).abs()
    ratio = torch.nan_to_num(torch.where(diff == 0, 0.0, diff / allowed), nan=math.inf)  # x/0 -> inf
    return Comparison(name, float(ratio.max()), float(torch.nan_to_num(diff, nan=math.inf).max()),
                      want.numel(), int((~(diff <= allowed)).sum()))


def _reference_run(config: NeuronConfig, inputs: Inputs, params: Mapping[Any, Any], learnable: Mapping[str, Any]
                   ) -> dict[str, torch.Tensor]:
    """Reference outputs and gradients (autograd, float64), named like the kernels' outputs, plus `threshold`."""
    d = config.derivation()
    system = d.system
    xs = [u.clone().requires_grad_(True) for u in inputs.all_x]
    initial = [inputs.initial[s.name].clone().requires_grad_(True) for s in system.states]
    states = tuple(initial)
    rows: dict[str, list[torch.Tensor]] = {"spike_seq": [], "h_seq": [], "threshold": [], "spike_distance": []}
    for t in range(xs[0].shape[0]):
        step_inputs = tuple(u[t] for u in xs)
        values = {**params, **dict(zip(system.inputs, step_inputs)), **dict(zip(system.states, states))}
        threshold = evaluate(system.threshold, values).detach()
        rows["threshold"].append(torch.broadcast_to(threshold, step_inputs[0].shape))
        spike, states, h = reference.step(system, step_inputs, states, params, config.surrogate, d.detach_reset)
        rows["spike_distance"].append(_spike_distance(system, {**values, H: h.detach(), THRESHOLD: threshold}))
        rows["spike_seq"].append(spike)
        rows["h_seq"].append(h)
        for s, value in zip(system.states, states):
            rows.setdefault(f"{s.name}_seq", []).append(value)
    out = {k: torch.stack(v) for k, v in rows.items()}
    out |= {f"{s.name}_final": v for s, v in zip(system.states, states)}
    loss = (out["spike_seq"] * inputs.grad_spike).sum()
    loss = loss + sum((out[f"{s}_final"] * g).sum() for s, g in inputs.grad_final.items())
    loss = loss + sum((out[f"{s}_seq"] * g).sum() for s, g in inputs.grad_seq.items())
    leaves = [*xs, *initial, *learnable.values()]
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    names = [*(f"grad_{key}" for key in config.input_keys), *(f"grad_{s.name}_init" for s in system.states),
             *(f"grad_{p}" for p in learnable)]
    out |= {n: torch.zeros_like(leaf) if g is None else g for n, g, leaf in zip(names, grads, leaves)}
    return {k: v.detach() for k, v in out.items()}


def _spike_distance(system: StepSystem, values: Mapping[Any, Any]) -> torch.Tensor:
    """How far h is from changing the spike: |h - threshold|, or for a multi-level spike the least over its
    levels of |a_k| / |∂a_k/∂h| (a level's argument a_k over its slope: the distance in h, where a_k is linear)."""
    if not system.levels:
        return (values[H] - values[THRESHOLD]).abs()
    distances = [(evaluate(level.argument, values) / evaluate(sympy.diff(level.argument, H), values)).abs()
                 for level in system.levels]
    return functools.reduce(torch.minimum, (torch.broadcast_to(d, values[H].shape) for d in distances))


def _kernel_run(config: NeuronConfig, inputs: Inputs, params: Mapping[str, Any], single: bool, backend: str,
                storage: torch.dtype, layout: Mapping[str, Any] | None) -> dict[str, torch.Tensor]:
    """Forward then backward through the launch layer; outputs as CPU float64, single-step ones as [1, N]."""
    device = torch.device("cuda" if backend == "cuda" else "cpu")

    def put(value: torch.Tensor) -> torch.Tensor:
        return (value[0] if single and value.dim() == 2 else value).to(device, storage).contiguous()

    xs, initial = [put(u) for u in inputs.all_x], {s: put(v) for s, v in inputs.initial.items()}
    fwd = forward(config, xs[0] if len(xs) == 1 else xs, initial, params, single_step=single,
                  store_state_seq=bool(inputs.grad_seq), save_for_backward=True, backend=backend, layout=layout)
    grads = {"grad_spike_seq": put(inputs.grad_spike),
             **{f"grad_{s}_final": put(g) for s, g in inputs.grad_final.items()},
             **{f"grad_{s}_seq": put(g) for s, g in inputs.grad_seq.items()}}
    saved = {**fwd, **dict(zip(config.input_keys, xs)), **{f"{s}_init": v for s, v in initial.items()}}
    bwd = backward(config, grads, saved, params, single_step=single, grad_state_seq=bool(inputs.grad_seq),
                   backend=backend, layout=layout)
    out = {name: value.detach().to("cpu", F64) for name, value in {**fwd, **bwd}.items()}
    return {name: v.unsqueeze(0) if single and name.endswith("_seq") else v for name, v in out.items()}


def _rounded(inputs: Inputs, dtype: torch.dtype) -> Inputs:
    def r(v: torch.Tensor) -> torch.Tensor:
        return v.to(dtype).to(F64)
    return Inputs(r(inputs.x), {k: r(v) for k, v in inputs.initial.items()}, r(inputs.grad_spike),
                  {k: r(v) for k, v in inputs.grad_final.items()}, {k: r(v) for k, v in inputs.grad_seq.items()},
                  tuple(r(u) for u in inputs.more_x))


def _compare_run(config: NeuronConfig, inputs: Inputs, expected: dict[str, torch.Tensor],
                 actual: dict[str, torch.Tensor], tol: Tolerance, single: bool, segment: int = 0
                 ) -> tuple[list[Comparison], int]:
    """Every kernel output against the reference, ambiguous neurons masked (see the module doc). With a
    `segment`, <state>_checkpoints are compared with the reference's sequence every `segment` steps
    (`codegen.neuron.replay_steps`).

    atol is scaled by the largest value of the output's family, forward values (x, states, h) or gradients
    (incoming and outgoing): rounding errors are relative to the terms a result is summed from, and those can
    be far larger than the result (e.g. one neuron whose gradient terms nearly cancel)."""
    h, threshold = expected["h_seq"], expected["threshold"]
    ambiguous = expected["spike_distance"] <= tol.margin * (h.abs() + threshold.abs())
    steps = h.shape[0]
    first = torch.where(ambiguous.any(0), ambiguous.to(torch.uint8).argmax(0), steps)
    before_first = torch.arange(steps)[:, None] < first[None, :]
    clean = first == steps
    values = [*inputs.all_x, *inputs.initial.values(),
              *(v for k, v in expected.items() if not k.startswith("grad_"))]
    grads = [inputs.grad_spike, *inputs.grad_final.values(), *inputs.grad_seq.values(),
             *(v for k, v in expected.items() if k.startswith("grad_"))]
    family = {False: max(float(v.abs().max()) for v in values), True: max(float(v.abs().max()) for v in grads)}
    shared = {f"grad_{name}" for name, per_neuron in config.tensors if not per_neuron}
    kernels = ("step-forward", "step-backward") if single else ("fptt", "bptt")
    results = []
    for name, got in actual.items():
        if name not in expected and not name.endswith("_checkpoints"):
            raise KeyError(f"kernel output {name!r} has no reference value")
        is_grad = name.startswith("grad_")
        want = expected[name] if name in expected else expected[f"{name[:-12]}_seq"]  # checkpoints: rows below
        kernel, scale = kernels[is_grad], family[is_grad]
        valid = before_first if name.endswith(("_seq", "_checkpoints")) and not is_grad else clean.expand_as(want)
        if name.endswith("_checkpoints"):  # rows K-1, 2K-1, ... of the state's sequence
            want, valid = (v[segment - 1::segment][:got.shape[0]] for v in (expected[f"{name[:-12]}_seq"], valid))
        got, want = got[valid], want[valid]
        if name in shared:  # one value for all neurons: what matters is the sum of the per-neuron partials
            got, want = got.sum(0, keepdim=True), want.sum(0, keepdim=True)
            scale = max(scale, float(expected[name].abs().sum()))
        exact = name == "spike_seq"
        results.append(_compare(f"{kernel} {name}", got, want, 0.0 if exact else tol.rtol,
                                0.0 if exact else tol.atol, scale))
    return results, int((~clean).sum())


def check_case(case: Case, backend: str = "host", config: NeuronConfig | None = None) -> CaseReport:
    """Compare the kernels of `case.setup` (or those of `config`, e.g. a test's mutated kernels) with the
    reference on the case's multi-step run and single step."""
    setup = case.setup
    config = config or setup.config()
    dtype = get_dtype(setup.dtype)
    storage, compute, tol = dtype.torch_dtype, dtype.compute.torch_dtype, TOLERANCES[dtype.name]
    device = torch.device("cuda" if backend == "cuda" else "cpu")
    params_k: dict[str, Any] = {}   # what the kernel gets: scalars by value, tensors in the arithmetic dtype
    for name, value in case.params.items():
        params_k[name] = value.to(device, compute) if isinstance(value, torch.Tensor) else value
    neurons = case.multi.x.shape[1]
    system = config.derivation().system
    comparisons, ambiguous = [], 0
    for single, inputs in ((False, case.multi), (True, case.single)):
        inputs = _rounded(inputs, storage)
        learnable = {p.name: _rounded_param(case.params[p.name], compute).expand(neurons).clone().requires_grad_(True)
                     for p in system.learnable}
        params_ref = {p: learnable.get(p.name, _rounded_param(case.params[p.name], compute)) for p in system.params}
        expected = _reference_run(config, inputs, params_ref, learnable)
        actual = _kernel_run(config, inputs, params_k, single, backend, storage, dict(setup.layout) or None)
        segment = 0 if single else _replay_steps(config, setup, *inputs.x.shape)
        found, masked = _compare_run(config, inputs, expected, actual, tol, single, segment)
        comparisons += found
        ambiguous = max(ambiguous, masked)
    return CaseReport(case.label, tuple(comparisons), neurons, ambiguous)


def _replay_steps(config: NeuronConfig, setup: Setup, steps: int, n: int) -> int:
    """Steps between the rows of <state>_checkpoints: the setup's layout's, else what the launch chose."""
    layout = dict(setup.layout) if setup.layout else replay_option(n, steps)
    options = KernelOptions("fptt", get_dtype(setup.dtype), replay=layout.get("replay", REPLAY_STEPS))
    return replay_steps(config.derivation(), options)


def _rounded_param(value: Any, compute: torch.dtype) -> Any:
    """A parameter as the kernel holds it: scalars rounded to the arithmetic type, tensors stored in it."""
    if isinstance(value, torch.Tensor):
        return value.to(compute).to(F64)
    return float(torch.tensor(float(value), dtype=compute))

def check_spec(spec: NeuronSpec | str, backend: str = "host", *, dtypes: Iterable[str] = DTYPES,
               resets: Iterable[str] | None = None, detach: Iterable[bool] = (False, True), examples: int = 3,
               seed: int = 0, surrogate: Any = None, constants: Mapping[str, float] | None = None,
               per_neuron: bool = True, store_state_seq: bool = True, layout: Mapping[str, Any] | None = None,
               max_steps: int = 8, max_neurons: int = 33, raise_on_failure: bool = False) -> Report:
    """Run the generated FPTT/BPTT and single-step kernels of `spec` on `backend` ("host": the CPU through the
    shim; "cuda": the GPU) against the float64 reference, for every dtype x reset x detach_reset, on `examples`
    random cases each (the first with T = 1, the second with N = 1). Default resets: the spec's, plus hard
    (when it has v_reset) and soft. `layout` forces kernel layout options (e.g. {"lanes": 4, "vector": True};
    N must then suit them); by default the launch layer chooses. Returns a Report (per case: each output's
    largest error as a multiple of its tolerance); with `raise_on_failure`, failures raise AssertionError."""
    spec = load_spec(spec) if isinstance(spec, str) else spec
    if resets is None:
        has_v_reset = any(p.name == "v_reset" for p in spec.params)
        resets = dict.fromkeys([spec.reset, *(["hard"] if has_v_reset else []), "soft"])
    chosen = get_surrogate(surrogate) if surrogate is not None else None
    frozen = tuple(sorted((constants or {}).items()))
    multiple = (layout or {}).get("lanes", 1) if (layout or {}).get("vector") else 1   # vector access needs it
    jobs = []
    for dtype in dtypes:
        for reset in resets:
            for detach_reset in detach:
                setup = Setup(spec, get_dtype(dtype).name, reset, bool(detach_reset), chosen, frozen, per_neuron,
                              store_state_seq, tuple(sorted((layout or {}).items())))
                for i in range(examples):
                    case_seed = zlib.crc32(f"{seed} {setup.label} {i}".encode())
                    jobs.append((setup, _shape(i, case_seed, max_steps, max_neurons, multiple), case_seed))
    # Host kernels compile in compiler processes and run with the GIL released: threads overlap both.
    workers = (os.cpu_count() or 2) if backend == "host" else 1
    with ThreadPoolExecutor(max_workers=workers) as pool:
        report = Report(list(pool.map(lambda job: check_case(make_case(*job), backend), jobs)))
    if raise_on_failure:
        report.raise_on_failure()
    return report


def _shape(example: int, seed: int, max_steps: int, max_neurons: int, multiple: int = 1) -> tuple[int, int]:
    """Example 0 has T = 1, example 1 has N = 1 (or `multiple`); N is odd (a packed pair's lone lane) unless it
    must be a multiple of `multiple`."""
    generator = torch.Generator().manual_seed(seed)
    steps = int(torch.randint(1, max_steps + 1, (), generator=generator))
    neurons = int(torch.randint(1, max_neurons + 1, (), generator=generator)) | 1
    if multiple > 1:
        neurons = multiple * max(1, neurons // multiple)
    return {0: (1, neurons), 1: (steps, multiple)}.get(example, (steps, neurons))
