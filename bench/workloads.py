"""What the benchmark runs: the models (an eager torch step per model), their parameters, and one case's inputs.

The core six have hand-written steps; the zoo's step is its spec as autocuda's torch reference evaluates it
(`SpecStep`). Every system gets the same parameter values and the same input tensors.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

import torch

Tensor = torch.Tensor
States = tuple[Tensor, ...]
Forward = Callable[[], tuple[Tensor, States]]   # one call of a system: (spike_seq, final states)

ALPHA = 4.0  # the surrogate of every system: Sigmoid(alpha=4), SpikingJelly's default
MODES = ("inference", "training")
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


# -- the eager loop: a step function per model (hand-written, or the zoo's spec through the reference) -----
class SigmoidSpike(torch.autograd.Function):
    """Θ(z) forward, α·sg(αz)(1 - sg(αz)) backward: `autocuda.surrogate.Sigmoid(alpha)` in plain torch ops.

    The Surrogate object's own __call__ walks its sympy gradient in backward (host time a hand-written loop
    does not spend), so the loop that both the eager and the compiled peer run uses this equivalent
    (tests/test_benchmark.py checks the gradients are equal)."""

    @staticmethod
    def forward(ctx: Any, z: Tensor, alpha: float) -> Tensor:
        ctx.save_for_backward(z)
        ctx.alpha = alpha
        return (z >= 0).to(z.dtype)

    @staticmethod
    def backward(ctx: Any, grad: Tensor) -> tuple[Tensor, None]:
        (z,) = ctx.saved_tensors
        sg = torch.sigmoid(ctx.alpha * z)
        return grad * (ctx.alpha * sg * (1 - sg)), None


def spike(z: Tensor) -> Tensor:
    return SigmoidSpike.apply(z, ALPHA)


def fire(h: Tensor, p: Mapping[str, Any]) -> tuple[Tensor, Tensor]:
    """Spike, and the membrane after a hard reset: v = h (1 - s) + v_reset s (the spike not detached)."""
    s = spike(h - p["v_threshold"])
    return s, h * (1 - s) + p["v_reset"] * s


def recovery(w: Tensor, h: Tensor, s: Tensor, p: Mapping[str, Any]) -> Tensor:
    """Izhikevich/AdEx adaptation after firing: w + (a (h - v_rest) - w) / tau_w + b s."""
    return w + (p["a"] * (h - p["v_rest"]) - w) / p["tau_w"] + p["b"] * s


def lif_step(x: Tensor, state: States, p: Mapping[str, Any]) -> tuple[Tensor, States]:
    (v,) = state
    h = v + (x - (v - p["v_reset"])) / p["tau"]
    s, v = fire(h, p)
    return s, (v,)


def plif_step(x: Tensor, state: States, p: Mapping[str, Any]) -> tuple[Tensor, States]:
    (v,) = state
    h = v + (x - (v - p["v_reset"])) * torch.sigmoid(p["w"])
    s, v = fire(h, p)
    return s, (v,)


def qif_step(x: Tensor, state: States, p: Mapping[str, Any]) -> tuple[Tensor, States]:
    (v,) = state
    h = v + (x + p["a0"] * (v - p["v_rest"]) * (v - p["v_c"])) / p["tau"]
    s, v = fire(h, p)
    return s, (v,)


def eif_step(x: Tensor, state: States, p: Mapping[str, Any]) -> tuple[Tensor, States]:
    (v,) = state
    h = v + (x + p["v_rest"] - v + p["delta_T"] * torch.exp((v - p["theta_rh"]) / p["delta_T"])) / p["tau"]
    s, v = fire(h, p)
    return s, (v,)


def izhikevich_step(x: Tensor, state: States, p: Mapping[str, Any]) -> tuple[Tensor, States]:
    v, w = state
    h = v + (x + p["a0"] * (v - p["v_rest"]) * (v - p["v_c"]) - w) / p["tau"]
    s, v_next = fire(h, p)
    return s, (v_next, recovery(w, h, s, p))


def adex_step(x: Tensor, state: States, p: Mapping[str, Any]) -> tuple[Tensor, States]:
    v, w = state
    exp_term = p["delta_T"] * torch.exp((v - p["theta_rh"]) / p["delta_T"])
    h = v + (-(v - p["v_rest"]) + exp_term + p["R"] * x - w) / p["tau"]
    s, v_next = fire(h, p)
    return s, (v_next, recovery(w, h, s, p))


Step = Callable[[Tensor, States, Mapping[str, Any]], tuple[Tensor, States]]


class SpecStep:
    """A shipped spec's step as autocuda's torch reference evaluates it: `autocuda.reference.step` on the
    `StepSystem` of the spec's reference plan (what `functional`'s backend="reference" runs), parameters by
    name, the spec's own reset, and `spike` (SigmoidSpike) as the spike function, so that the gradient is
    the one every system uses. The zoo's eager loop, so its models are not written twice.

    The reference walks the spec's sympy expressions on every step: each step costs host time the
    hand-written steps do not pay; torch.compile traces only its torch ops (the sympy work is done when the
    plan is built). The plan is built on first use, not when this module is imported."""

    def __init__(self, key: str, spec: Any = None):
        self.key, self.spec = key, spec  # a shipped spec's name, or a user's spec file and its NeuronSpec

    @functools.cached_property
    def _reference(self) -> tuple[Any, Mapping[str, Any], Callable[..., Any]]:
        from autocuda.runtime.configs import get_config
        from autocuda.runtime.reference import step

        # the spec's reset; parameters as runtime values
        return (*get_config(self.spec or self.key, kernels=False).reference_step, step)

    def prepare(self) -> SpecStep:
        """Itself, with the reference built: torch.compile then traces torch ops only."""
        self._reference  # noqa: B018 - builds the cached property
        return self

    def __call__(self, x: Tensor, state: States, p: Mapping[str, Any]) -> tuple[Tensor, States]:
        system, symbols, step = self._reference
        params = {symbols[name]: value for name, value in p.items() if name in symbols}
        s, states, _ = step(system, x, state, params, spike)  # the reference only calls its surrogate on h - θ
        return s, states

    def __repr__(self) -> str:
        return f"SpecStep({self.key!r})"


def run_loop(step: Step, x_seq: Tensor, states: States, params: Mapping[str, Any]) -> tuple[Tensor, States]:
    """The eager loop over time: (spike_seq, final states)."""
    spikes = []
    for x in x_seq:
        s, states = step(x, states, params)
        spikes.append(s)
    return torch.stack(spikes), tuple(states)


# -- workloads --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Workload:
    """A model as every system runs it, with the same parameter values for all of them."""

    key: str                                  # shipped autocuda spec, and the --workloads name
    label: str
    step: Step
    params: Mapping[str, float]               # scalar parameters (autocuda's names), passed to every system
    initial: tuple[str | float, ...]          # initial states in the spec's order: a parameter's name or a number
    tensors: Mapping[str, float] = dataclasses.field(default_factory=dict)  # 0-d float32 tensors, learnable
    input: tuple[float, float] = (2.0, 0.5)  # x = scale * randn + shift: most neurons fire now and then
    sj: str | None = None                     # SpikingJelly 2.0 function (activation_based.functional)
    sj_names: Mapping[str, str] = dataclasses.field(default_factory=dict)  # autocuda name -> SJ keyword
    sj_extra: Mapping[str, Any] = dataclasses.field(default_factory=dict)  # further SJ keywords
    no_compile: str | None = None             # why the torch.compile peer cannot run this workload's loop
    spec: Any = None                          # a user's NeuronSpec (key: its file); None: the shipped spec `key`
    flexsn: Any = None                        # (params, spike) -> a FlexSN core: SpikingJelly's FlexSN runs it

    def initial_value(self, i: int) -> float:
        init = self.initial[i]
        return float(self.params[init]) if isinstance(init, str) else float(init)


_HARD = {"v_threshold": 1.0}
WORKLOADS: dict[str, Workload] = {w.key: w for w in (
    Workload("lif", "LIF", lif_step, {"tau": 2.0, **_HARD, "v_reset": 0.0}, ("v_reset",),
             sj="lif_multi_step", sj_extra={"decay_input": True}),
    Workload("parametric_lif", "ParametricLIF", plif_step, {**_HARD, "v_reset": 0.0}, ("v_reset",),
             tensors={"w": 0.5}, sj="plif_multi_step", sj_extra={"decay_input": True}),
    Workload("qif", "QIF", qif_step, {"tau": 2.0, "v_c": 0.8, "a0": 1.0, "v_rest": 0.0, **_HARD, "v_reset": -0.1},
             ("v_reset",), sj="qif_multi_step"),
    Workload("eif", "EIF", eif_step,
             {"tau": 2.0, "delta_T": 1.0, "theta_rh": 0.8, "v_rest": 0.0, **_HARD, "v_reset": -0.1}, ("v_reset",),
             sj="eif_multi_step", sj_names={"delta_T": "delta_t"}),
    Workload("izhikevich", "Izhikevich", izhikevich_step,
             {"tau": 2.0, "v_c": 0.8, "a0": 1.0, "v_rest": -0.1, "tau_w": 2.0, "a": 0.1, "b": 0.2, **_HARD,
              "v_reset": 0.0}, ("v_reset", 0.0), sj="izhikevich_multi_step"),
    Workload("adex", "AdEx", adex_step,
             {"tau": 2.0, "delta_T": 1.0, "theta_rh": 0.8, "v_rest": 0.0, "R": 1.0, "tau_w": 2.0, "a": 0.1,
              "b": 0.1, **_HARD, "v_reset": -0.1}, ("v_reset", 0.0)),
)}
CORE = tuple(WORKLOADS)  # the default selection


# -- the zoo as FlexSN cores: SpikingJelly 2.0's FlexSN (Triton on CUDA) is their SpikingJelly counterpart --------
# Each factory takes the workload's parameters and the spike function and returns the core, a Python step
# `core(x, *states) -> (spike, *new_states)` over Python numbers (FlexSN refuses captured tensors and modules).
def alif_core(p: Mapping[str, float], spike: Callable[[Tensor], Tensor]) -> Callable[..., Any]:
    tau, beta, v_th, v_reset, rho = p["tau"], p["beta"], p["v_threshold"], p["v_reset"], math.exp(-1 / p["tau_a"])

    def alif(x: Tensor, v: Tensor, a: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        h = v + (x - (v - v_reset)) / tau
        s = spike(h - (v_th + beta * a))
        return s, h * (1.0 - s) + v_reset * s, rho * a + s
    return alif


def sfa_lif_core(p: Mapping[str, float], spike: Callable[[Tensor], Tensor]) -> Callable[..., Any]:
    """The exact step of the spec's ODE (tau != tau_w): dv/dt = (-(v - v_rest) + R x - w) / tau, w decays."""
    tau, tau_w, dt, b = p["tau"], p["tau_w"], p["time_step"], p["b"]
    r, v_rest, v_th, v_reset = p["R"], p["v_rest"], p["v_threshold"], p["v_reset"]
    decay, w_decay, k = math.exp(-dt / tau), math.exp(-dt / tau_w), 1 / tau - 1 / tau_w
    coupling = decay * math.expm1(k * dt) / k / tau

    def sfa_lif(x: Tensor, v: Tensor, w: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        h = v * decay + (r * x + v_rest) * (1 - decay) - w * coupling
        s = spike(h - v_th)
        return s, h * (1.0 - s) + v_reset * s, w * w_decay + b * s
    return sfa_lif


def cuba_lif_core(p: Mapping[str, float], spike: Callable[[Tensor], Tensor]) -> Callable[..., Any]:
    """The exact step of the spec's ODE (tau != tau_syn): di/dt = -i / tau_syn + x drives the leaky membrane."""
    tau, tau_syn, dt, r = p["tau"], p["tau_syn"], p["time_step"], p["R"]
    v_rest, v_th, v_reset = p["v_rest"], p["v_threshold"], p["v_reset"]
    e_v, e_i = math.exp(-dt / tau), math.exp(-dt / tau_syn)
    cross = r * (e_i - e_v) / (tau * (1 / tau - 1 / tau_syn))

    def cuba_lif(x: Tensor, v: Tensor, i: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        h = v * e_v + v_rest * (1 - e_v) + (i - x * tau_syn) * cross + r * x * tau_syn * (1 - e_v)
        s = spike(h - v_th)
        return s, h * (1.0 - s) + v_reset * s, i * e_i + x * tau_syn * (1 - e_i)
    return cuba_lif


def _zoo(key: str, label: str, params: Mapping[str, float], initial: tuple[str | float, ...],
         input: tuple[float, float] = (2.0, 0.5), flexsn: Any = None) -> Workload:
    """A model of the zoo: the eager loop runs the spec through our reference; SpikingJelly's counterpart, where
    there is one, is its FlexSN running the model's core."""
    return Workload(key, label, SpecStep(key), params, initial, input=input, flexsn=flexsn)


# The zoo: parameters are the specs' defaults, initial states the specs'; the input makes 5-40% of
# neuron-steps spike at every T from 4 to 1024 (the JSON's spike_rate has each case's).
WORKLOADS |= {w.key: w for w in (
    _zoo("alif", "ALIF", {"tau": 2.0, "tau_a": 20.0, "beta": 0.2, **_HARD, "v_reset": 0.0}, ("v_reset", 0.0),
         flexsn=alif_core),
    _zoo("cuba_lif", "CUBA-LIF", {"tau": 2.0, "tau_syn": 5.0, "R": 1.0, "v_rest": 0.0, **_HARD, "v_reset": 0.0,
                                  "time_step": 1.0},
         ("v_reset", 0.0), input=(2.0, 0.0), flexsn=cuba_lif_core),  # the current integrates x: no bias
    _zoo("sfa_lif", "SFA-LIF", {"tau": 2.0, "tau_w": 10.0, "b": 0.2, "R": 1.0, "v_rest": 0.0, **_HARD,
                                "v_reset": 0.0, "time_step": 1.0}, ("v_reset", 0.0), flexsn=sfa_lif_core),
    _zoo("resonate_fire", "ResonateFire", {"b": -0.1, "omega": 1.0, **_HARD, "v_reset": 0.0, "time_step": 1.0},
         ("v_reset", 0.0), input=(1.0, 0.5)),
    _zoo("fitzhugh_nagumo", "FitzHughNagumo", {"tau": 1.0, "tau_w": 12.5, "a": 0.7, "b": 0.8, "R": 1.0,
                                               "time_step": 0.5, **_HARD, "v_reset": -1.2}, ("v_reset", -0.6)),
    _zoo("two_compartment", "TwoCompartment", {"tau": 2.0, "tau_d": 4.0, "g_c": 1.0, "R": 1.0, "v_rest": 0.0,
                                               **_HARD, "v_reset": 0.0, "time_step": 1.0},
         ("v_reset", 0.0), input=(4.0, 4.0)),  # the soma settles at x / 3 (g_c = 1): it needs x near 3
)}
ZOO = tuple(k for k in WORKLOADS if k not in CORE)
ALIASES = {"plif": "parametric_lif", "izh": "izhikevich"}
GROUPS = {"core": CORE, "zoo": ZOO, "all": tuple(WORKLOADS)}  # --workloads names that select several


# -- a user's own spec: --workloads my_neuron.toml ------------------------------------------------------------
def is_spec_file(name: str) -> bool:
    """Whether a --workloads entry names a spec file (a path, or a name ending in .toml or .py)."""
    return name.endswith((".toml", ".py")) or "/" in name or os.sep in name


def load_user_spec(path: str) -> Any:
    """The NeuronSpec in a spec file: what `autocuda show PATH` reads (`autocuda.spec.load.spec_argument`), so
    every kind of file the command line reads is a workload too."""
    from autocuda.spec.load import spec_argument

    return spec_argument(path)


@functools.cache
def spec_workload(path: str) -> Workload:
    """A user's spec as a workload, like the zoo's: the spec's defaults as parameters (tensor parameters as 0-d
    tensors, learnable in training), its initial states, the eager loop its reference (`SpecStep`), torch.compile
    of that loop, no SpikingJelly counterpart. Keyed by the path as given."""
    spec = load_user_spec(path)
    defaults = {p.name: float(p.default) for p in spec.params}
    params = {p.name: defaults[p.name] for p in spec.params if p.kind != "tensor"}
    tensors = {p.name: defaults[p.name] for p in spec.params if p.kind == "tensor"}
    # a state starting at v_reset starts at 0 without a hard reset, as in autocuda's layers
    initial = tuple(0.0 if s.init == "v_reset" and spec.reset != "hard" else
                    defaults[s.init] if isinstance(s.init, str) else float(s.init) for s in spec.states)
    return Workload(path, spec.name, SpecStep(path, spec), params, initial, tensors=tensors, spec=spec)


def workload(name: str) -> Workload:
    """A --workloads entry that names one workload: a shipped one, or a spec file."""
    return spec_workload(name) if is_spec_file(name) else WORKLOADS[name]


# -- one case: inputs of a (workload, dtype, T, N), in one mode ---------------------------------------------
@dataclasses.dataclass
class Case:
    workload: Workload
    dtype: torch.dtype
    training: bool
    x: Tensor                     # [T, N], requires grad in training
    g: Tensor                     # the upstream gradient of spike_seq: the loss is (spike_seq * g).sum()
    states: States                # initial states, x's dtype, no grad (as at the start of a sequence)
    tensors: dict[str, Tensor]    # tensor parameters (float32), learnable in training

    @property
    def grad_inputs(self) -> list[Tensor]:
        return [self.x, *self.tensors.values()] if self.training else []

    def mode(self, training: bool) -> Case:
        """The same data with the gradients switched on or off."""
        return dataclasses.replace(self, training=training, x=self.x.detach().requires_grad_(training),
                                   tensors={k: v.detach().requires_grad_(training) for k, v in self.tensors.items()})

    @staticmethod
    def draw(workload: Workload, dtype: torch.dtype, steps: int, neurons: int, device: torch.device) -> Case:
        scale, shift = workload.input
        x = (torch.randn(steps, neurons, device=device) * scale + shift).to(dtype)
        g = torch.randn(steps, neurons, device=device).to(dtype)
        states = tuple(torch.full((neurons,), workload.initial_value(i), device=device, dtype=dtype)
                       for i in range(len(workload.initial)))
        tensors = {k: torch.tensor(v, device=device) for k, v in workload.tensors.items()}
        return Case(workload, dtype, False, x, g, states, tensors)


def call(case: Case, forward: Forward) -> Callable[[], Any]:
    """What one repetition runs: forward without autograd, or forward + backward of (spike_seq * g).sum()
    (as `autograd.grad(spike_seq, inputs, g)`: the same gradients, without timing a mul and a sum)."""
    if not case.training:
        def infer() -> Any:
            with torch.no_grad():
                return forward()
        return infer

    inputs = case.grad_inputs

    def train() -> Any:
        spikes, _ = forward()
        return torch.autograd.grad(spikes, inputs, case.g, allow_unused=True)
    return train

