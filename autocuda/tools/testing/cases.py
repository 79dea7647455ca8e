"""The cases `autocuda.testing` checks: what is checked (`Setup`), tolerances, random parameters and inputs
calibrated to fire, and hypothesis strategies over them."""
from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from ...codegen.noise import Seed
from ...runtime import reference
from ...runtime.neuron_launch import NeuronConfig
from ...spec.model import NeuronSpec, Param, check_reset
from ...spec.surrogate import Surrogate
from ...spec.system import initial_value
from ...spec.torch_eval import evaluate

# The seed of every check's runs of a step that draws (`spec.draws`): the kernels and the reference draw alike.
CHECK_SEED = Seed(0x5EED_2026, 0)

if TYPE_CHECKING:
    from hypothesis.strategies import SearchStrategy

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

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """How hypothesis shows a case: by its label. It prints each explicit example's arguments before running
        it, failing or not, and printing every tensor of a case would take longer than checking it."""
        printer.text(f"Case({self.label})")


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
    spikes, trajectories = _trajectories(setup, xs, initial, params)
    return (spikes, trajectories) if _bounded(trajectories) else None


def _trajectories(setup: Setup, xs: Sequence[torch.Tensor], initial: Sequence[torch.Tensor],
                  params: Mapping[str, Any]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """`_simulate`'s run, bounded or not."""
    config = _base_config(setup)
    system = config.derivation().system
    with torch.no_grad():
        spikes, _, seqs = reference.multi_step(system, tuple(xs), list(initial), _symbols(setup, params),
                                               config.surrogate, setup.detach_reset, CHECK_SEED)
    return spikes, [torch.cat([i.expand(1, xs[0].shape[1]), s]) for i, s in zip(initial, seqs)]


def _bounded(trajectories: Sequence[torch.Tensor]) -> bool:
    return all(bool(torch.isfinite(t).all()) and t.abs().max() <= BOUND for t in trajectories)


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
    gains = [2.0 ** k for k in range(-10, 11)]
    # Every gain in one run, 256 neurons each side by side: the reference is element-wise (one neuron's values never
    # reach another's), so each block of columns is that gain's own run.
    initial = [torch.zeros(256 * len(gains), dtype=F64) + _initial(base, s.name, params) for s in spec.states]
    spikes, trajectories = _trajectories(base, [torch.cat([gain * z for gain in gains], 1) for z in zs], initial,
                                         params)
    rated = []
    for i, gain in enumerate(gains):
        block = slice(256 * i, 256 * (i + 1))
        if _bounded([t[:, block] for t in trajectories]):
            rated.append((abs(float((spikes[:, block] != 0).to(F64).mean()) - FIRE_RATE), gain))  # any level counts
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
