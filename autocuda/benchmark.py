"""Benchmarks (issue 6): our kernels against SpikingJelly 2.0, an eager PyTorch loop and `torch.compile` of it.

One run measures, on one device:
- the copy bandwidth (a large device-to-device `copy_`), which sets the memory floor of every workload:
  floor = bytes / bandwidth with 2 accesses per neuron-step in inference (read x, write the spike) and 6 in
  training (forward + backward), each of the storage dtype's size (8 and 24 bytes in float32);
- speed: each workload x (T, N) x mode x dtype, timed with CUDA events (median after warm-up, L2 flushed
  before each repetition, the host's launch latency covered by a GPU-side wait: see `Clock`), ours checked
  against the eager loop (in float32) before it is timed;
- memory: bytes per neuron-step kept between forward and backward, and the peak over a training step;
- host overhead: wall time per call of a tiny problem, and the first use of a spec in a fresh process.

Run it as `autocuda bench` or `python bench/run.py`; `--device cpu --quick` exercises the logic on a CPU.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import functools
import importlib
import importlib.metadata
import inspect
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch

from .runtime import nvrtc

Tensor = torch.Tensor
States = tuple[Tensor, ...]
Forward = Callable[[], tuple[Tensor, States]]   # one call of a system: (spike_seq, final states)

ALPHA = 4.0  # the surrogate of every system: Sigmoid(alpha=4), SpikingJelly's default
MODES = ("inference", "training")
HOST_ROUNDS = 5  # of the host-overhead benchmark's calls: it reports the median round
# The host benchmark's calls: (mode, autograd's multithreading). By default torch runs the backward of CUDA nodes
# on a worker thread per device, so each backward hands work to that thread and back: on the lent hosts those two
# hand-offs cost more than the 60 us a whole training call may take (a bare autograd.Function, 82 us;
# `bench/results/2026-11-23-h200-host-threads`). `torch.autograd.set_multithreading_enabled(False)` keeps
# backward on the calling thread; training is timed both ways, for every system.
HOST_CALLS = (("inference", True), ("training", True), ("training", False))
DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}
ACCESSES = {"inference": 2, "training": 6}  # element accesses per neuron-step that the floor counts
# The timed calls ask for spike_seq alone, as the floor counts: ours and torch.compile's loop then write no final
# state (one write per neuron and state: 6% of LIF's bytes at T = 8, 12% of Izhikevich's). SpikingJelly's
# functions return theirs regardless. Our final states are still checked, by a call that returns them.
TIMED_FINAL_STATES = False
FULL_SHAPES = ((8, 8 << 20), (64, 1 << 20), (256, 64 << 10), (1024, 16 << 10), (4, 4096))
QUICK_SHAPES = {"cuda": ((8, 1 << 20), (64, 64 << 10), (4, 4096)), "cpu": ((4, 64), (16, 32))}
MEMORY_WORKLOADS, MEMORY_DTYPES = ("lif", "qif", "izhikevich", "alif"), ("float32", "float16")
PARTS = ("speed", "memory", "host", "first-use")
SPIKE_AGREEMENT, STATE_AGREEMENT, GRAD_COSINE = 0.999, 0.999, 0.99
STATE_TOL = {torch.float32: 1e-4, torch.float16: 4e-3, torch.bfloat16: 3e-2}  # rtol = atol, final states


class Skip(Exception):
    """A measurement not taken, with the reason (printed in the table's notes)."""


# -- the eager loop: a step function per model (hand-written, or the zoo's spec through the reference) -----
class SigmoidSpike(torch.autograd.Function):
    """Θ(z) forward, α·sg(αz)(1 - sg(αz)) backward: `autocuda.surrogate.Sigmoid(alpha)` in plain torch ops.

    The Surrogate object's own __call__ evaluates its sympy gradient, which torch.compile cannot trace (a
    graph break in backward), so the loop that both the eager and the compiled peer run uses this
    equivalent (tests/test_benchmark.py checks the gradients are equal)."""

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
    hand-written steps do not pay (hundreds of µs), and torch.compile cannot trace it (see SPEC_NO_COMPILE).
    The plan is built on first use, not when this module is imported."""

    def __init__(self, key: str):
        self.key = key

    @functools.cached_property
    def _reference(self) -> tuple[Any, Mapping[str, Any], Callable[..., Any]]:
        from .reference import step
        from .runtime.cache import get_plan

        plan = get_plan(self.key, kernels=False)  # the spec's reset; parameters as runtime values
        return plan.system, plan.symbols, step

    def __call__(self, x: Tensor, state: States, p: Mapping[str, Any]) -> tuple[Tensor, States]:
        system, symbols, step = self._reference
        params = {symbols[name]: value for name, value in p.items() if name in symbols}
        s, states, _ = step(system, x, state, params, spike)  # the reference only calls its surrogate on h - θ
        return s, states

    def __repr__(self) -> str:
        return f"SpecStep({self.key!r})"


SPEC_NO_COMPILE = ("the eager step evaluates the spec's sympy expressions (autocuda.reference): torch.compile "
                   "cannot trace it (graph breaks in sympy and at Tensor.item())")


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


def _zoo(key: str, label: str, params: Mapping[str, float], initial: tuple[str | float, ...],
         input: tuple[float, float] = (2.0, 0.5)) -> Workload:
    """A model of the zoo: no SpikingJelly counterpart, the eager loop runs the spec through our reference."""
    return Workload(key, label, SpecStep(key), params, initial, input=input, no_compile=SPEC_NO_COMPILE)


# The zoo: parameters are the specs' defaults, initial states the specs'; the input makes 5-40% of
# neuron-steps spike at every T from 4 to 1024 (the JSON's spike_rate has each case's).
WORKLOADS |= {w.key: w for w in (
    _zoo("alif", "ALIF", {"tau": 2.0, "tau_a": 20.0, "beta": 0.2, **_HARD, "v_reset": 0.0}, ("v_reset", 0.0)),
    _zoo("cuba_lif", "CUBA-LIF", {"tau": 2.0, "tau_syn": 5.0, "R": 1.0, "v_rest": 0.0, **_HARD, "v_reset": 0.0,
                                  "time_step": 1.0},
         ("v_reset", 0.0), input=(2.0, 0.0)),  # the synaptic current integrates x: a bias would drive it up
    _zoo("sfa_lif", "SFA-LIF", {"tau": 2.0, "tau_w": 10.0, "b": 0.2, "R": 1.0, "v_rest": 0.0, **_HARD,
                                "v_reset": 0.0, "time_step": 1.0}, ("v_reset", 0.0)),
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


# -- the systems -------------------------------------------------------------------------------------------
def ours(case: Case, by_name: bool = False, final_states: bool = True) -> Forward:
    """`autocuda.functional.multi_step` with the spec loaded once, as a layer holds it (or by name each call).
    The initial states are the same values the peers get as tensors, given as numbers: what a layer passes at
    the start of a sequence, after `reset()` (the kernels then start from them and read no state tensor).
    `final_states=False`: the call neither writes nor returns them (its finals are then ())."""
    from .functional import multi_step
    from .spec.model import load_spec
    from .surrogate import Sigmoid

    w, surrogate = case.workload, Sigmoid(alpha=ALPHA)
    spec = w.key if by_name else load_spec(w.key)
    initial = [w.initial_value(i) for i in range(len(w.initial))]

    def run() -> tuple[Tensor, States]:
        spikes, finals, _ = multi_step(spec, case.x, *initial, surrogate=surrogate, final_states=final_states,
                                       **w.params, **case.tensors)
        return spikes, finals or ()
    return run


def eager(case: Case) -> Forward:
    w = case.workload
    return lambda: run_loop(w.step, case.x, case.states, {**w.params, **case.tensors})


def compiled(case: Case, whole_loop: bool = True, backend: str = "inductor", final_states: bool = True) -> Forward:
    """`torch.compile` of the eager loop: the whole loop, which Dynamo unrolls over T, or (`whole_loop=False`,
    for long loops, whose unrolled graphs take too long to compile) the step alone, called by the Python loop.
    `final_states=False`: the compiled loop returns the spikes alone (finals ()), so it need not write them."""
    torch._dynamo.reset()  # every case compiles afresh: no cache-size limit falls back to eager silently
    w = case.workload
    if not whole_loop:
        step = torch.compile(w.step, dynamic=False, backend=backend)
        return lambda: run_loop(step, case.x, case.states, {**w.params, **case.tensors})

    def loop(x: Tensor, states: States, tensors: dict[str, Tensor]) -> tuple[Tensor, States]:
        spikes, finals = run_loop(w.step, x, states, {**w.params, **tensors})
        return spikes, finals if final_states else ()
    fn = torch.compile(loop, dynamic=False, backend=backend)
    return lambda: fn(case.x, case.states, case.tensors)


@dataclasses.dataclass
class SpikingJelly:
    """SpikingJelly 2.0's functional API, or why it is not there."""

    functional: Any = None
    surrogate: Any = None
    version: str | None = None
    missing: str | None = None

    @staticmethod
    def load(enabled: bool) -> SpikingJelly:
        if not enabled:
            return SpikingJelly(missing="--no-peers")
        try:
            functional = importlib.import_module("spikingjelly.activation_based.functional")
            surrogates = importlib.import_module("spikingjelly.activation_based.surrogate")
        except Exception as error:  # noqa: BLE001 - any import failure means: no SJ numbers, with the reason
            return SpikingJelly(missing=f"not importable ({type(error).__name__}: {error})")
        return SpikingJelly(functional, surrogates.Sigmoid(alpha=ALPHA), _version("spikingjelly"))

    def kwargs(self, w: Workload) -> dict[str, Any]:
        """SJ keywords of a workload; a name SJ's function does not take is reported, not passed."""
        if self.functional is None:
            raise Skip(f"SpikingJelly {self.missing}")
        if w.sj is None:
            raise Skip(f"no SpikingJelly counterpart of {w.label}")
        kwargs = {w.sj_names.get(k, k): v for k, v in w.params.items()} | dict(w.sj_extra)
        kwargs["surrogate_function"] = self.surrogate
        accepted = inspect.signature(getattr(self.functional, w.sj)).parameters
        unknown = [k for k in kwargs if k not in accepted]
        if unknown and not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in accepted.values()):
            raise Skip(f"{w.sj}() takes no {', '.join(unknown)}: update the workload's sj_names")
        return kwargs

    def implementation(self, w: Workload, device: torch.device) -> str | None:
        try:
            kind = w.sj.removesuffix("_multi_step")  # type: ignore[union-attr]
            return str(self.functional.neuron_implementation(kind, device)["implementation"])
        except Exception:  # noqa: BLE001 - diagnostics only
            return None

    def forward(self, case: Case) -> Forward:
        w = case.workload
        kwargs = self.kwargs(w)
        fn = getattr(self.functional, w.sj)
        # SJ's fused kernels take float32 states whatever x's dtype (else it runs its torch reference).
        states = tuple(s.float() for s in case.states)
        count = len(states)

        def run() -> tuple[Tensor, States]:
            out = fn(case.x, *states, *case.tensors.values(), **kwargs)
            return out[0], tuple(out[1:1 + count])
        return run


# -- timing -------------------------------------------------------------------------------------------------
class Clock:
    """Median time of a callable: CUDA events on a GPU (L2 flushed before each repetition), else wall time.

    Before the start event the GPU also waits `HOST_COVER_CYCLES` (about a millisecond): the host enqueues the
    call meanwhile, so the events time the device from the call's first kernel to its last (gaps the host
    leaves between them included) rather than the host's Python up to its first launch, which the
    host-overhead benchmark measures on its own. Every system is timed the same way."""

    HOST_COVER_CYCLES = 2_000_000

    def __init__(self, device: torch.device, quick: bool):
        self.device, self.cuda = device, device.type == "cuda"
        self.warmup, self.min_reps, self.max_reps, self.budget_ms = (1, 1, 3, 50.0) if quick else (3, 3, 20, 250.0)
        self.flush_buffer = torch.empty(64 << 20, dtype=torch.int32, device=device) if self.cuda else None

    def sync(self) -> None:
        if self.cuda:
            torch.cuda.synchronize(self.device)

    def once(self, fn: Callable[[], Any]) -> float:
        """One call, in ms."""
        if not self.cuda:
            start = time.perf_counter()
            fn()
            return (time.perf_counter() - start) * 1e3
        self.flush_buffer.zero_()  # 256 MiB written: what the call reads does not start in L2
        torch.cuda._sleep(self.HOST_COVER_CYCLES)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)

    def median(self, fn: Callable[[], Any], max_call_s: float | None = None) -> float:
        """Warm-up (cut short for slow calls), then repetitions within the time budget: the median in ms."""
        last = self.once(fn)
        if max_call_s is not None and last > max_call_s * 1e3:
            raise Skip(f"{last / 1e3:.1f} s per call > {max_call_s:g} s")
        for _ in range(self.warmup - 1):
            if last > self.budget_ms:
                break
            last = self.once(fn)
        reps = min(self.max_reps, max(self.min_reps, int(self.budget_ms / max(last, 1e-3))))
        return statistics.median(self.once(fn) for _ in range(reps))

    def first(self, fn: Callable[[], Any]) -> float:
        """Seconds of one call (a first call: compile time included)."""
        start = time.perf_counter()
        fn()
        self.sync()
        return time.perf_counter() - start


def copy_bandwidth(clock: Clock, quick: bool) -> float:
    """Bytes per second of a device-to-device copy (bytes read + written)."""
    numel = (16 << 20 if quick or not clock.cuda else 512 << 20) // 4
    src = torch.rand(numel, device=clock.device)
    dst = torch.empty_like(src)
    ms = clock.median(lambda: dst.copy_(src))
    return 2 * src.numel() * src.element_size() / (ms * 1e-3)


# -- checks against the eager loop ----------------------------------------------------------------------------
@dataclasses.dataclass
class Reference:
    """The eager loop in float32 on the case's (rounded) inputs, with the gradients of the training loss."""

    spikes: Tensor
    finals: States
    grads: tuple[Tensor | None, ...]

    @staticmethod
    def of(case: Case) -> Reference:
        w = case.workload
        x = case.x.detach().float().requires_grad_(True)
        tensors = {k: v.detach().float().requires_grad_(True) for k, v in case.tensors.items()}
        states = tuple(s.float() for s in case.states)
        spikes, finals = run_loop(w.step, x, states, {**w.params, **tensors})
        grads = torch.autograd.grad(spikes, [x, *tensors.values()], case.g.float(), allow_unused=True)
        return Reference(spikes.detach(), tuple(f.detach() for f in finals), grads)


def check(case: Case, forward: Forward, ref: Reference) -> tuple[str, dict[str, float]]:
    """'ok', 'FAIL ...' (spikes or final states disagree) or 'warn ...' (gradients), and the figures."""
    if case.training:
        spikes, finals = forward()
        grads = torch.autograd.grad(spikes, case.grad_inputs, case.g, allow_unused=True)
    else:
        with torch.no_grad():
            spikes, finals = forward()
        grads = ()
    tol = STATE_TOL[case.dtype]
    figures = {"spike_agreement": (spikes.float() == ref.spikes).float().mean().item(),
               "spike_rate": ref.spikes.mean().item()}
    for i, (final, expected) in enumerate(zip(finals, ref.finals)):
        close = torch.isclose(final.float(), expected, rtol=tol, atol=tol)
        figures[f"state{i}_close"] = close.float().mean().item()
        figures[f"state{i}_max_abs_err"] = (final.float() - expected).abs().max().item()
    if grads and grads[0] is not None and ref.grads[0] is not None:
        figures["grad_x_cosine"] = _cosine(grads[0], ref.grads[0])
    for name, got, expected in zip(case.tensors, grads[1:], ref.grads[1:]):
        if got is not None and expected is not None:
            figures[f"grad_{name}_rel_err"] = ((got.float() - expected).abs() / expected.abs().clamp_min(1e-12)).item()
    agreement = figures["spike_agreement"]
    problems = [f"spikes {100 * agreement:.2f}%"] if agreement < SPIKE_AGREEMENT else []
    problems += [f"state {100 * v:.2f}%" for k, v in figures.items() if k.endswith("_close") and v < STATE_AGREEMENT]
    if problems:
        return "FAIL " + ", ".join(problems), figures
    if figures.get("grad_x_cosine", 1.0) < GRAD_COSINE:
        return f"warn grad cos {figures['grad_x_cosine']:.3f}", figures
    return "ok", figures


def _cosine(a: Tensor, b: Tensor) -> float:
    a, b = a.float().flatten(), b.float().flatten()
    norms = a.norm() * b.norm()
    return 1.0 if norms.item() == 0 and torch.equal(a, b) else (a @ b / norms).item()


# -- speed -----------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Row:
    workload: str
    spec: str
    dtype: str
    mode: str
    T: int
    N: int
    floor_ms: float
    ours_ms: float | None = None
    sj_ms: float | None = None
    compile_ms: float | None = None
    eager_ms: float | None = None
    compile_s: float | None = None           # time of the first compiled call (the compile)
    compile_form: str | None = None          # "loop": the whole loop compiled; "step": the step, looped in Python
    check: str = "–"
    check_figures: dict[str, float] = dataclasses.field(default_factory=dict)
    sj_check: str | None = None
    notes: dict[str, str] = dataclasses.field(default_factory=dict)  # system -> why it has no time

    def derived(self) -> dict[str, float | None]:
        def ratio(peer: float | None) -> float | None:
            return peer / self.ours_ms if peer and self.ours_ms else None
        return {"pct_floor": 100 * self.floor_ms / self.ours_ms if self.ours_ms else None,
                "x_sj": ratio(self.sj_ms), "x_compile": ratio(self.compile_ms), "x_eager": ratio(self.eager_ms)}


@dataclasses.dataclass
class Config:
    device: torch.device
    workloads: list[Workload]
    dtypes: list[torch.dtype]
    shapes: list[tuple[int, int]]
    parts: list[str]
    quick: bool
    peers: bool
    out: Path
    compile_budget_s: float
    compile_max_t: int
    eager_max_call_s: float
    first_use_spec: str
    seed: int
    resume: bool = False
    modes: tuple[str, ...] = MODES


class Runner:
    """Holds what the parts share: the clock, the copy bandwidth, SpikingJelly, the compile time spent."""

    def __init__(self, cfg: Config):
        self.cfg, self.started = cfg, time.perf_counter()
        self.clock = Clock(cfg.device, cfg.quick)
        self.sj = SpikingJelly.load(cfg.peers)
        self.bandwidth = copy_bandwidth(self.clock, cfg.quick)
        self.compile_spent = 0.0
        cfg.out.mkdir(parents=True, exist_ok=True)
        self.progress = cfg.out / "progress.jsonl"  # every result as it comes: a run cut short keeps them
        self.kept = _kept_speed_rows(self.progress) if cfg.resume else {}
        self.progress.write_text("".join(json.dumps({"part": "speed", **r}) + "\n" for r in self.kept.values()))

    def record(self, part: str, row: Mapping[str, Any]) -> None:
        with self.progress.open("a") as f:
            f.write(json.dumps({"part": part, **row}, default=str) + "\n")
        if part != "speed":  # speed rows are logged as a line of the table
            self.log(f"{part}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                             for k, v in row.items()))

    def log(self, text: str) -> None:
        print(f"[{time.perf_counter() - self.started:6.1f} s] {text}", file=sys.stderr, flush=True)

    def floor_ms(self, dtype: torch.dtype, mode: str, steps: int, neurons: int) -> float:
        nbytes = steps * neurons * ACCESSES[mode] * torch.empty((), dtype=dtype).element_size()
        return nbytes / self.bandwidth * 1e3

    def measure(self, row: Row, system: str, make: Callable[[], Callable[[], Any]],
                max_call_s: float | None = None) -> None:
        """Time `make()`'s callable into row.<system>_ms, or note why there is no time."""
        try:
            setattr(row, f"{system}_ms", self.clock.median(make(), max_call_s))
        except Exception as error:  # noqa: BLE001 - a failure is a table entry, not the end of the run
            row.notes[system] = _why(error)
        finally:
            if self.clock.cuda:
                torch.cuda.empty_cache()

    def compile_skip(self, w: Workload, steps: int) -> str | None:
        cfg = self.cfg
        if not cfg.peers:
            return "--no-peers"
        if w.no_compile:
            return w.no_compile
        if cfg.quick:
            return "--quick"
        if self.compile_spent > cfg.compile_budget_s:
            return f"compile budget ({cfg.compile_budget_s:g} s) spent"
        return None

    def compile_call(self, case: Case, row: Row) -> Callable[[], Any]:
        reason = self.compile_skip(case.workload, case.x.shape[0])
        if reason:
            raise Skip(reason)
        row.compile_form = "loop" if case.x.shape[0] <= self.cfg.compile_max_t else "step"
        fn = call(case, compiled(case, whole_loop=row.compile_form == "loop", final_states=TIMED_FINAL_STATES))
        row.compile_s = self.clock.first(fn)
        self.compile_spent += row.compile_s
        return fn

    # -- the parts ----------------------------------------------------------------------------------------
    def speed(self) -> list[Row]:
        rows = []
        for dtype in self.cfg.dtypes:  # float32 first: if the compile budget runs out, it is on other dtypes
            for w in self.cfg.workloads:
                for steps, neurons in self.cfg.shapes:
                    rows += self.speed_shape(w, dtype, steps, neurons)
        order = {w.key: i for i, w in enumerate(self.cfg.workloads)}
        shapes = {s: i for i, s in enumerate(self.cfg.shapes)}
        dtypes = {_name(d): i for i, d in enumerate(self.cfg.dtypes)}
        return sorted(rows, key=lambda r: (order[r.spec], shapes[(r.T, r.N)], dtypes[r.dtype], MODES.index(r.mode)))

    def speed_shape(self, w: Workload, dtype: torch.dtype, steps: int, neurons: int) -> list[Row]:
        kept = [self.kept.get((w.key, _name(dtype), mode, steps, neurons)) for mode in self.cfg.modes]
        if all(kept):  # measured by the run this one resumes
            self.log(f"kept from {self.progress}: {w.label} {_name(dtype)} ({steps}, {neurons})")
            fields = [f.name for f in dataclasses.fields(Row)]
            return [Row(**{k: r[k] for k in fields}) for r in kept]
        data = Case.draw(w, dtype, steps, neurons, self.cfg.device)
        ref = Reference.of(data)
        return [self.speed_row(data.mode(mode == "training"), ref) for mode in self.cfg.modes]

    def speed_row(self, case: Case, ref: Reference) -> Row:
        w, (steps, neurons), mode = case.workload, case.x.shape, MODES[case.training]
        row = Row(w.label, w.key, _name(case.dtype), mode, steps, neurons,
                  self.floor_ms(case.dtype, mode, steps, neurons))
        try:
            row.check, row.check_figures = check(case, ours(case), ref)
            if row.check == "ok" and not TIMED_FINAL_STATES:  # the call timed: its spikes and gradients
                row.check = check(case, ours(case, final_states=False), ref)[0]
        except Exception as error:  # noqa: BLE001
            row.check = f"error: {_first_line(error)}"
        self.measure(row, "ours", lambda: call(case, ours(case, final_states=TIMED_FINAL_STATES)))
        if self.sj.functional is not None and w.sj is not None:
            try:
                row.sj_check = check(case, self.sj.forward(case), ref)[0]
            except Exception as error:  # noqa: BLE001 - the timing below reports it
                row.sj_check = f"error: {_first_line(error)}"
        self.measure(row, "sj", lambda: call(case, self.sj.forward(case)))
        if self.cfg.peers:
            self.measure(row, "eager", lambda: call(case, eager(case)), self.cfg.eager_max_call_s)
        else:
            row.notes["eager"] = "skipped: --no-peers"
        self.measure(row, "compile", lambda: self.compile_call(case, row))
        self.log(_progress(row))
        self.record("speed", dataclasses.asdict(row) | row.derived())
        return row

    def memory(self) -> dict[str, Any]:
        """Bytes per neuron-step of a training step: held between forward and backward (less the outputs),
        and the peak over forward + backward, above what was allocated before the step."""
        if not self.clock.cuda:
            return {"note": "skipped: needs a CUDA device (torch.cuda memory statistics)", "rows": []}
        steps, neurons = (64, 64 << 10) if self.cfg.quick else (64, 1 << 20)
        chosen = {w.key for w in self.cfg.workloads}
        rows = []
        for key in (k for k in MEMORY_WORKLOADS if k in chosen):
            for dtype in (DTYPES[d] for d in MEMORY_DTYPES if DTYPES[d] in self.cfg.dtypes):
                case = Case.draw(WORKLOADS[key], dtype, steps, neurons, self.cfg.device).mode(True)
                for system, make in (("ours", ours), ("sj", self.sj.forward)):
                    row: dict[str, Any] = {"workload": WORKLOADS[key].label, "dtype": _name(dtype), "system": system,
                                           "T": steps, "N": neurons}
                    try:
                        row |= _memory_of(case, make(case))
                    except Exception as error:  # noqa: BLE001
                        row["note"] = _why(error)
                    rows.append(row)
                    self.record("memory", row)
                del case
        return {"rows": rows}

    def host(self) -> dict[str, Any]:
        """Wall time per call of LIF at T=4, N=4096 (perf_counter over many calls, synchronised at the end).
        Inference runs its calls under one `torch.no_grad()`, as a network's forward runs all its layers: entering
        the context costs about as much host time as two allocations, and it is neither ours nor the peer's."""
        steps, neurons, calls = 4, 4096, (20 if self.cfg.quick else 500)
        data = Case.draw(WORKLOADS["lif"], torch.float32, steps, neurons, self.cfg.device)
        rows = []
        for mode, threads in HOST_CALLS:
            case = data.mode(mode == "training")
            for system, make in (("ours", ours), ("ours, spec by name", lambda c: ours(c, by_name=True)),
                                 ("sj", self.sj.forward)):
                row: dict[str, Any] = {"system": system, "mode": mode, "T": steps, "N": neurons, "calls": calls,
                                       "multithreaded_backward": threads}
                try:
                    fn = call(case, make(case)) if case.training else make(case)
                    with torch.set_grad_enabled(case.training), torch.autograd.set_multithreading_enabled(threads):
                        rounds = self._wall_per_call(fn, calls)
                    row |= {"us_per_call": statistics.median(rounds), "us_per_call_rounds": rounds}
                except Exception as error:  # noqa: BLE001
                    row["note"] = _why(error)
                rows.append(row)
                self.record("host", row)
        return {"rows": rows, "what": f"us_per_call: wall time per call, the median of {HOST_ROUNDS} rounds "
                                      "(us_per_call_rounds); inference calls under one torch.no_grad(); "
                                      "multithreaded_backward: False under "
                                      "torch.autograd.set_multithreading_enabled(False)"}

    def _wall_per_call(self, fn: Callable[[], Any], calls: int) -> list[float]:
        """Microseconds per call of each of HOST_ROUNDS rounds of `calls` calls: a host's load moves single
        rounds by more than a tenth."""
        for _ in range(max(3, calls // 10)):
            fn()
        rounds = []
        for _ in range(HOST_ROUNDS):
            self.clock.sync()
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            self.clock.sync()
            rounds.append((time.perf_counter() - start) / calls * 1e6)
        return rounds

    def first_use(self) -> dict[str, Any]:
        """A fresh process: import to first backward done, with empty caches (cold), then again (warm)."""
        libs = ["ours"] + (["sj"] if self.sj.functional is not None else [])
        rows = []
        for lib in libs:
            with tempfile.TemporaryDirectory(prefix="autocuda-bench-") as tmp:
                env = _child_env(Path(tmp))
                # Python's bytecode as after an install (pip compiles it), so "cold" means empty kernel caches:
                # on machines that keep no bytecode of their packages every process would compile sympy (or
                # SpikingJelly's imports) from source (`_child_env`).
                subprocess.run([sys.executable, "-c", _BYTECODE, lib], env=env, capture_output=True, timeout=600)
                for cache in ("cold", "warm"):
                    row: dict[str, Any] = {"system": lib, "cache": cache,
                                           "spec": self.cfg.first_use_spec if lib == "ours" else "lif"}
                    argv = [sys.executable, "-c", _FIRST_USE, str(self.cfg.device), lib, self.cfg.first_use_spec]
                    start = time.perf_counter()
                    try:
                        proc = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300)
                    except subprocess.TimeoutExpired:
                        proc = subprocess.CompletedProcess(argv, -1, "", "timed out after 300 s")
                    row["process_wall_s"] = time.perf_counter() - start
                    if proc.returncode == 0:
                        row |= json.loads(proc.stdout.strip().splitlines()[-1])
                    else:
                        row["note"] = "error: " + (proc.stderr.strip().splitlines() or ["?"])[-1][:300]
                    rows.append(row)
                    self.record("first_use", row)
        return {"rows": rows, "what": "first_use_s: from `import autocuda` (torch already imported, CUDA context "
                                      "up) to the first backward done; process_wall_s: the whole process"}


# Imports (without running anything) every module a first use needs, so that their bytecode is cached.
_BYTECODE = r"""
import sys
import torch, sympy, jinja2, numpy
if sys.argv[1] == "ours":
    import autocuda.functional, autocuda.kernels, autocuda.reference
else:
    import spikingjelly.activation_based.functional
"""

# The child of the first-use benchmark: it must not import autocuda before the clock starts.
_FIRST_USE = r"""
import json, sys, time
start = time.perf_counter()
import torch
device, lib, spec = torch.device(sys.argv[1]), sys.argv[2], sys.argv[3]
x = (torch.randn(4, 4096, device=device) * 2.0 + 0.5).requires_grad_(True)
g = torch.randn(4, 4096, device=device)
sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
sync()
t0 = time.perf_counter()
if lib == "ours":
    from autocuda.functional import multi_step
    spikes = multi_step(spec, x)[0]
else:
    from spikingjelly.activation_based.functional import lif_multi_step
    spikes = lif_multi_step(x, torch.zeros(4096, device=device))[0]
sync()
t1 = time.perf_counter()
(spikes * g).sum().backward()  # a training step's backward (autograd.grad with grad_outputs imports sympy: torch 2.11)
sync()
t2 = time.perf_counter()
print(json.dumps({"first_use_s": t2 - t0, "first_forward_s": t1 - t0, "torch_and_cuda_init_s": t0 - start}))
"""


def _child_env(tmp: Path) -> dict[str, str]:
    # PYTHONDONTWRITEBYTECODE would keep the bytecode step from writing anything (the lent GPU machines set it,
    # and ship sympy without bytecode: each process then compiled it from source, 1.6-1.9 s of a first use)
    env = {k: v for k, v in os.environ.items() if k not in ("CUPY_CACHE_IN_MEMORY", "PYTHONDONTWRITEBYTECODE")}
    env |= {"AUTOCUDA_CACHE_DIR": str(tmp / "autocuda"), "CUPY_CACHE_DIR": str(tmp / "cupy"),
            "PYTHONPYCACHEPREFIX": str(tmp / "bytecode"),
            "TRITON_CACHE_DIR": str(tmp / "triton"), "TORCHINDUCTOR_CACHE_DIR": str(tmp / "inductor"),
            "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}  # the packages this process sees
    return env


def _memory_of(case: Case, forward: Forward) -> dict[str, float]:
    step, device = call(case, forward), case.x.device
    for _ in range(2):
        step()
    torch.cuda.synchronize(device)
    neuron_steps = case.x.numel()
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    spikes, finals = forward()
    outputs = sum(t.numel() * t.element_size() for t in (spikes, *finals))
    held = torch.cuda.memory_allocated(device) - base - outputs
    grads = torch.autograd.grad(spikes, case.grad_inputs, case.g, allow_unused=True)
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - base
    del spikes, finals, grads
    return {"saved_bytes_per_step": held / neuron_steps, "peak_bytes_per_step": peak / neuron_steps}


# -- environment --------------------------------------------------------------------------------------------
def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _command(*argv: str, cwd: Path | None = None) -> str | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=20, cwd=cwd)
    except (OSError, subprocess.SubprocessError):
        return None
    return (out.stdout.strip() or None) if out.returncode == 0 else None


def environment(device: torch.device, sj: SpikingJelly) -> dict[str, Any]:
    from . import __version__

    env: dict[str, Any] = {
        "device": str(device), "python": platform.python_version(), "platform": platform.platform(),
        "torch": torch.__version__, "torch_cuda": torch.version.cuda, "autocuda": __version__,
        "autocuda_commit": _command("git", "rev-parse", "--short", "HEAD", cwd=Path(__file__).resolve().parent),
        "nvrtc": nvrtc.version() if nvrtc.found() else None,
        "triton": _version("triton"), "spikingjelly": sj.version or sj.missing,
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        env |= {"gpu": props.name, "capability": f"{props.major}.{props.minor}", "sms": props.multi_processor_count,
                "gpu_memory_gib": round(props.total_memory / 2**30, 1),
                "driver": _command("nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader",
                                   f"--id={device.index or 0}")}
    return env


# -- output -------------------------------------------------------------------------------------------------------
def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _why(error: BaseException) -> str:
    """A table note: 'skipped: reason' for a Skip, else 'error: Type: first line'."""
    return f"skipped: {error}" if isinstance(error, Skip) else f"error: {_first_line(error)}"


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:300]


def _count(n: int) -> str:
    for unit, shift in (("M", 20), ("K", 10)):
        if n >= 1 << (shift + 4) and n % (1 << shift) == 0:
            return f"{n >> shift}{unit}"
    return str(n)


def _spread(row: Mapping[str, Any]) -> str:
    rounds = row.get("us_per_call_rounds")
    return f" (rounds {min(rounds):.1f}-{max(rounds):.1f})" if rounds else ""


def _fmt(value: float | None, spec: str) -> str:
    return "–" if value is None else format(value, spec)


def _progress(row: Row) -> str:
    d = row.derived()
    return (f"{row.workload} {row.dtype} {row.mode} T={row.T} N={_count(row.N)}: ours {_fmt(row.ours_ms, '.3f')} ms "
            f"({_fmt(d['pct_floor'], '.0f')}% of floor), SJ {_fmt(row.sj_ms, '.3f')}, compile "
            f"{_fmt(row.compile_ms, '.3f')}, eager {_fmt(row.eager_ms, '.3f')}; check {row.check}")


STEP_MARK = "*"  # beside a compile time measured with the step compiled, not the whole loop
HEADER = ("workload", "dtype", "mode", "T", "N", "ours ms", "% floor", "SJ ms", "×SJ", "compile ms", "×compile",
          "eager ms", "check")


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The speed table (rows as in the JSON), then the reasons for missing entries with their counts."""
    cells = [list(HEADER)]
    for r in rows:
        step = STEP_MARK if r.get("compile_form") == "step" and r["compile_ms"] else ""
        cells.append([r["workload"], r["dtype"], r["mode"], str(r["T"]), _count(r["N"]), _fmt(r["ours_ms"], ".3f"),
                      _fmt(r["pct_floor"], ".0f"), _fmt(r["sj_ms"], ".3f"), _fmt(r["x_sj"], ".2f"),
                      _fmt(r["compile_ms"], ".3f") + step, _fmt(r["x_compile"], ".2f"), _fmt(r["eager_ms"], ".3f"),
                      r["check"] + ("" if r.get("sj_check") in (None, "ok") else f" (SJ: {r['sj_check']})")])
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]
    lines = ["  ".join(c.rjust(w) if 3 <= i <= 11 else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths)))
             for row in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if any(r["compile_ms"] and r.get("compile_form") == "step" for r in rows):
        lines += ["", f"{STEP_MARK} torch.compile of the step alone, called by a Python loop over T (T > the "
                  "--compile-max-t whose unrolled loop is compiled)"]
    notes = Counter(f"{system}: {why}" for r in rows for system, why in r["notes"].items())
    if notes:
        lines += ["", "missing entries:"] + [f"  {text}  ({n} rows)" for text, n in sorted(notes.items())]
    return "\n".join(lines)


def summary(results: Mapping[str, Any]) -> str:
    """The whole report as text: bandwidth, speed table, memory, host overhead, first use."""
    env = results["environment"]
    out = [f"{env.get('gpu', env['device'])}, driver {env.get('driver')}, torch {env['torch']}, "
           f"autocuda {env['autocuda']} ({env.get('autocuda_commit')}), SpikingJelly {env['spikingjelly']}",
           f"copy bandwidth: {results['copy_bandwidth_GBps']:.0f} GB/s; floor = bytes / bandwidth with "
           "2 (inference) or 6 (training) element accesses per neuron-step", ""]
    if "speed" in results:
        out += [table(results["speed"]), ""]
    if results.get("memory"):
        out.append("memory of a training step, bytes per neuron-step (saved: held from forward to backward, "
                   "outputs excluded; peak: over forward + backward)")
        out += [f"  {r['workload']:<11} {r['dtype']:<8} {r['system']:<4} T={r['T']} N={_count(r['N'])}: saved "
                f"{_fmt(r.get('saved_bytes_per_step'), '.2f')}, peak {_fmt(r.get('peak_bytes_per_step'), '.2f')}"
                f"{'  ' + r['note'] if 'note' in r else ''}" for r in results["memory"]["rows"]]
        out += ([results["memory"]["note"]] if "note" in results["memory"] else []) + [""]
    if results.get("host"):
        out.append("host overhead, LIF T=4 N=4096, wall time per call (inference: calls under one torch.no_grad())")
        out += [f"  {r['system']:<18} {_host_mode(r):<41}: {_fmt(r.get('us_per_call'), '.1f')} µs{_spread(r)}"
                f"{'  ' + r['note'] if 'note' in r else ''}" for r in results["host"]["rows"]]
        out.append("")
    if results.get("first_use"):
        out.append("first use in a fresh process (" + results["first_use"]["what"] + ")")
        out += [f"  {r['system']:<4} {r['spec']:<10} {r['cache']}: {_fmt(r.get('first_use_s'), '.3f')} s "
                f"(process {r['process_wall_s']:.2f} s){'  ' + r['note'] if 'note' in r else ''}"
                for r in results["first_use"]["rows"]]
    return "\n".join(out).rstrip() + "\n"


def _host_mode(row: Mapping[str, Any]) -> str:
    if row["mode"] == "training" and row.get("multithreaded_backward") is False:
        return "training, backward on the calling thread"
    return str(row["mode"])


def plot(results: Mapping[str, Any], path: Path) -> str | None:
    """% of floor and speed-ups per workload and shape (bars: float32 or the first dtype; markers: the others).
    Returns why no plot was written, or None."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: pip install matplotlib, then `python bench/run.py --plot RESULTS.json`"
    rows = results.get("speed") or []
    if not rows:
        return "no speed rows to plot"
    metrics = (("pct_floor", "% of memory floor", 100.0, False), ("x_sj", "× faster than SpikingJelly 2.0", 1.0, True),
               ("x_compile", "× faster than torch.compile", 1.0, True))
    workloads = list(dict.fromkeys(r["workload"] for r in rows))
    shapes = list(dict.fromkeys((r["T"], r["N"]) for r in rows))
    dtypes = list(dict.fromkeys(r["dtype"] for r in rows))
    main = "float32" if "float32" in dtypes else dtypes[0]
    colors = plt.get_cmap("tab10" if len(workloads) <= 10 else "tab20")
    fig, axes = plt.subplots(len(metrics), len(MODES), figsize=(15, 11), squeeze=False)
    width = 0.8 / len(workloads)
    for (key, title, ref_line, log), ax_row in zip(metrics, axes):
        for mode, ax in zip(MODES, ax_row):
            drawn = False
            for i, w in enumerate(workloads):
                for dtype, marker in zip(dtypes, ("s", "x", "+", "^")):
                    points = [(j + (i - (len(workloads) - 1) / 2) * width, r[key]) for j, shape in enumerate(shapes)
                              for r in rows if r["workload"] == w and r["dtype"] == dtype and r["mode"] == mode
                              and (r["T"], r["N"]) == shape and r[key]]
                    if not points:
                        continue
                    xs, ys = zip(*points)
                    drawn = True
                    if dtype == main:
                        ax.bar(xs, ys, width, color=colors(i), label=w)
                    else:
                        ax.plot(xs, ys, marker, color="black", markersize=5, label=dtype if i == 0 else None)
            ax.axhline(ref_line, color="gray", linestyle="--", linewidth=1)
            ax.set_xticks(range(len(shapes)), [f"T={t}\nN={_count(n)}" for t, n in shapes])
            ax.set_title(f"{title} — {mode} (bars {main})", fontsize=10)
            if log:
                ax.set_yscale("log")
            if not drawn:
                ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.965), ncol=len(labels) or 1, fontsize=9)
    env = results["environment"]
    fig.suptitle(f"autocuda {env['autocuda']} on {env.get('gpu', env['device'])}, copy bandwidth "
                 f"{results['copy_bandwidth_GBps']:.0f} GB/s; speed-up = peer time / our time", y=0.99, fontsize=11)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None


# -- command line ---------------------------------------------------------------------------------------------
def _shape(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)x(\d+)([KM]?)", text.strip(), re.IGNORECASE)
    if not match:
        raise argparse.ArgumentTypeError(f"shape {text!r}: expected TxN, e.g. 8x8M, 64x1M, 4x4096")
    unit = {"": 1, "K": 1 << 10, "M": 1 << 20}[match[3].upper()]
    return int(match[1]), int(match[2]) * unit


def _choices(text: str, known: Sequence[str], what: str) -> list[str]:
    names = [n.strip() for n in text.split(",") if n.strip()]
    unknown = [n for n in names if n not in known]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown {what} {', '.join(unknown)} (known: {', '.join(known)})")
    return names


def _workloads(text: str) -> list[str]:
    """Workload names, aliases and groups (core, zoo, all), in the order given, each once."""
    names: list[str] = []
    for name in (n.strip() for n in text.split(",") if n.strip()):
        names += GROUPS.get(name, [ALIASES.get(name, name)])
    unknown = [n for n in names if n not in WORKLOADS]
    if unknown:
        raise argparse.ArgumentTypeError(f"unknown workload {', '.join(unknown)} (known: {', '.join(WORKLOADS)}; "
                                         f"groups: {', '.join(GROUPS)})")
    return list(dict.fromkeys(names))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The benchmark's options (shared by `autocuda bench` and bench/run.py)."""
    parser.add_argument("--quick", action="store_true", help="few shapes and repetitions, no torch.compile (a smoke "
                        "test; with --device cpu: tiny shapes)")
    parser.add_argument("--workloads", type=_workloads, default=list(CORE),
                        help=f"comma-separated workloads or groups of them: core (the default: {', '.join(CORE)}), "
                             f"zoo (the model zoo: {', '.join(ZOO)}), all (both); e.g. core,alif or lif,qif "
                             f"(aliases: {', '.join(f'{k} = {v}' for k, v in ALIASES.items())})")
    parser.add_argument("--dtypes", type=lambda s: _choices(s, list(DTYPES), "dtype"), default=list(DTYPES),
                        help="comma-separated, of float32,float16,bfloat16 (default all)")
    parser.add_argument("--shapes", type=lambda s: [_shape(p) for p in s.split(",")], default=None,
                        help="comma-separated TxN, e.g. 8x8M,64x1M (default: the issue's five; fewer with --quick)")
    parser.add_argument("--parts", type=lambda s: _choices(s, PARTS, "part"), default=list(PARTS),
                        help=f"comma-separated, of {','.join(PARTS)} (default all)")
    parser.add_argument("--modes", type=lambda s: tuple(_choices(s, MODES, "mode")), default=MODES,
                        help="comma-separated, of inference,training (default both)")
    parser.add_argument("--no-peers", action="store_true", help="ours only: no SpikingJelly, eager or compile times")
    parser.add_argument("--device", default="cuda", help="cuda (default), cuda:N, or cpu (to test the logic)")
    parser.add_argument("--out", type=Path, default=None, help="output folder (default bench/results/<date>-<gpu>)")
    parser.add_argument("--compile-budget", type=float, default=120.0, metavar="S",
                        help="seconds of torch.compile time, after which compile is skipped (default 120)")
    parser.add_argument("--compile-max-t", type=int, default=64, metavar="T",
                        help="largest T whose unrolled loop is compiled; longer loops compile the step alone, "
                             "called by a Python loop over T (default 64)")
    parser.add_argument("--eager-max-call", type=float, default=2.0, metavar="S",
                        help="skip timing the eager loop where one call takes longer (default 2 s)")
    parser.add_argument("--first-use-spec", default="lif", help="spec of the first-use benchmark (default lif)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--resume", action="store_true", help="continue a run cut short (same options and --out): "
                        "keep the speed rows in its progress.jsonl, measure the rest and the other parts")
    parser.add_argument("--plot", type=Path, default=None, metavar="RESULTS_JSON",
                        help="only redraw plot.png (and table.txt) from an earlier results.json")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def config(args: argparse.Namespace, results_root: Path) -> Config:
    device = torch.device(args.device)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("no CUDA device: run on a GPU, or pass --device cpu to test the benchmark's logic")
        if device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        torch.cuda.set_device(device)  # kernels launch on the current device's current stream
    shapes = args.shapes or list(QUICK_SHAPES.get(device.type, QUICK_SHAPES["cuda"]) if args.quick else FULL_SHAPES)
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    out = args.out or results_root / f"{datetime.date.today().isoformat()}-{_slug(gpu)}{'-quick' if args.quick else ''}"
    return Config(device, [WORKLOADS[k] for k in args.workloads], [DTYPES[d] for d in args.dtypes], shapes,
                  args.parts, args.quick, not args.no_peers, out, args.compile_budget, args.compile_max_t,
                  args.eager_max_call, args.first_use_spec, args.seed, getattr(args, "resume", False),
                  getattr(args, "modes", MODES))


def run(args: argparse.Namespace, results_root: Path = Path("bench/results")) -> int:
    """Run the parts asked for; print the report; write results.json, table.txt and plot.png."""
    if args.plot is not None:
        return _write_outputs(json.loads(args.plot.read_text()), args.plot.parent)
    cfg = config(args, results_root)
    torch.manual_seed(cfg.seed)
    runner = Runner(cfg)
    peer = runner.sj.version or runner.sj.missing
    runner.log(f"copy bandwidth {runner.bandwidth / 1e9:.0f} GB/s; SpikingJelly: {peer}")
    results: dict[str, Any] = {
        "date": datetime.datetime.now().isoformat(timespec="seconds"), "argv": sys.argv[1:],
        "environment": environment(cfg.device, runner.sj), "copy_bandwidth_GBps": runner.bandwidth / 1e9,
        "method": _method(cfg, runner.clock),
        "workloads": {w.key: _describe(w, runner.sj, cfg.device) for w in cfg.workloads},
    }
    if "speed" in cfg.parts:
        results["speed"] = [dataclasses.asdict(r) | r.derived() for r in runner.speed()]
        results["compile_seconds_spent"] = runner.compile_spent
    for part, method in (("memory", runner.memory), ("host", runner.host), ("first-use", runner.first_use)):
        if part in cfg.parts:
            results[part.replace("-", "_")] = method()
    results["elapsed_s"] = time.perf_counter() - runner.started
    return _write_outputs(results, cfg.out)


def _kept_speed_rows(progress: Path) -> dict[tuple, dict[str, Any]]:
    """The speed rows of a run cut short, by (spec, dtype, mode, T, N); rows cut off mid-line are dropped."""
    kept = {}
    lines = progress.read_text().splitlines() if progress.exists() else []
    for line in lines:
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if row.pop("part", None) == "speed":
            kept[(row["spec"], row["dtype"], row["mode"], row["T"], row["N"])] = row
    return kept


def _method(cfg: Config, clock: Clock) -> dict[str, Any]:
    tolerances = {_name(k): v for k, v in STATE_TOL.items()}
    return {
        "timing": ("CUDA events, median after warm-up, L2 flushed (256 MiB written) before each repetition"
                   if clock.cuda else "wall time, median after warm-up"),
        "training": "forward + autograd.grad(spike_seq, [x, learnable params], g) with g ~ randn: the gradients "
                    "of (spike_seq * g).sum()",
        "eager": "a Python loop over T of a torch step with SigmoidSpike: hand-written per model (core), the "
                 "spec through autocuda.reference.step (zoo: SpecStep); torch.compile compiles the same loop (up to "
                 f"T = {cfg.compile_max_t}; longer loops: the step alone, called by the Python loop)",
        "timed_outputs": "spike_seq and the final states" if TIMED_FINAL_STATES else
                         "spike_seq alone (ours and torch.compile write no final state; SpikingJelly returns its "
                         "own); our final states are checked by a call that returns them",
        "floor_accesses_per_neuron_step": ACCESSES, "quick": cfg.quick, "seed": cfg.seed,
        "checks": f"against the eager loop in float32 on the same inputs: spikes >= {SPIKE_AGREEMENT:.1%} equal, "
                  f"final states >= {STATE_AGREEMENT:.1%} close (rtol = atol = {tolerances}) or FAIL; grad_x "
                  f"cosine >= {GRAD_COSINE} or warn",
    }


def _describe(w: Workload, sj: SpikingJelly, device: torch.device) -> dict[str, Any]:
    return {"label": w.label, "params": dict(w.params), "tensors": dict(w.tensors), "initial": list(w.initial),
            "input_scale_shift": list(w.input), "eager_step": getattr(w.step, "__name__", repr(w.step)),
            "no_compile": w.no_compile, "sj_function": w.sj, "sj_keywords": dict(w.sj_names),
            "sj_implementation": sj.implementation(w, device) if w.sj and sj.functional is not None else None}


def _write_outputs(results: dict[str, Any], out: Path) -> int:
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str) + "\n")
    text = summary(results)
    (out / "table.txt").write_text(text)
    print(text)
    why = plot(results, out / "plot.png")
    print(f"wrote {out}/results.json, table.txt" + (f"; no plot: {why}" if why else ", plot.png"))
    failed = [r for r in results.get("speed", []) if r["check"].startswith(("FAIL", "error"))]
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None, results_root: Path = Path("bench/results")) -> int:
    parser = argparse.ArgumentParser(prog="autocuda bench", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv), results_root)


if __name__ == "__main__":
    sys.exit(main())
