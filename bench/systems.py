"""The systems timed: ours (`autocuda.functional.multi_step`), the eager loop, `torch.compile` of that loop, and
SpikingJelly 2.0's functional API when it is importable.

Each takes a `Case` and returns a `Forward`: one call, (spike_seq, final states).
"""
from __future__ import annotations

import dataclasses
import importlib
import importlib.metadata
import inspect
from typing import Any

import torch

from .workloads import ALPHA, Case, Forward, SpecStep, States, Tensor, Workload, run_loop


def version(dist: str) -> str | None:
    """The installed version of a distribution, or None."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


class Skip(Exception):
    """A measurement not taken, with the reason (printed in the table's notes)."""


def ours(case: Case, by_name: bool = False, final_states: bool = True) -> Forward:
    """`autocuda.functional.multi_step` with the spec loaded once, as a layer holds it (or by name each call).
    The initial states are the same values the peers get as tensors, given as numbers: what a layer passes at
    the start of a sequence, after `reset()` (the kernels then start from them and read no state tensor).
    `final_states=False`: the call neither writes nor returns them (its finals are then ())."""
    from autocuda.call.functional import multi_step
    from autocuda.spec.load import load_spec
    from autocuda.spec.surrogate import Sigmoid

    w, surrogate = case.workload, Sigmoid(alpha=ALPHA)
    spec = w.key if by_name else w.spec or load_spec(w.key)
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
    eager_step = w.step.prepare() if isinstance(w.step, SpecStep) else w.step  # its sympy work before tracing
    if not whole_loop:
        step = torch.compile(eager_step, dynamic=False, backend=backend)
        return lambda: run_loop(step, case.x, case.states, {**w.params, **case.tensors})

    def loop(x: Tensor, states: States, tensors: dict[str, Tensor]) -> tuple[Tensor, States]:
        spikes, finals = run_loop(eager_step, x, states, {**w.params, **tensors})
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
        return SpikingJelly(functional, surrogates.Sigmoid(alpha=ALPHA), version("spikingjelly"))

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
        if w.sj is None and w.flexsn is not None:
            return "FlexSN"
        try:
            kind = w.sj.removesuffix("_multi_step")  # type: ignore[union-attr]
            return str(self.functional.neuron_implementation(kind, device)["implementation"])
        except Exception:  # noqa: BLE001 - diagnostics only
            return None

    def forward(self, case: Case) -> Forward:
        w = case.workload
        if w.sj is None and w.flexsn is not None and self.functional is not None:
            return self.flexsn(case)
        kwargs = self.kwargs(w)
        fn = getattr(self.functional, w.sj)
        # SJ's fused kernels take float32 states whatever x's dtype (else it runs its torch reference).
        states = tuple(s.float() for s in case.states)
        count = len(states)

        def run() -> tuple[Tensor, States]:
            out = fn(case.x, *states, *case.tensors.values(), **kwargs)
            return out[0], tuple(out[1:1 + count])
        return run

    def flexsn(self, case: Case) -> Forward:
        """SpikingJelly 2.0's FlexSN running the workload's core (a Python step; Triton kernels on CUDA), its
        surrogate the autograd function `sigmoid` with alpha: the spike function SpikingJelly's modules call. The
        layer starts every call from zeros, the zoo's initial states (v_reset = 0)."""
        flexsn = importlib.import_module("spikingjelly.activation_based.neuron.flexsn")
        sigmoid = importlib.import_module("spikingjelly.activation_based.surrogate").sigmoid
        w = case.workload
        if any(w.initial_value(i) != 0.0 for i in range(len(w.initial))):
            raise Skip(f"{w.label}: FlexSN starts from zeros, the workload does not")
        layer = flexsn.FlexSN(w.flexsn(w.params, lambda z: sigmoid.apply(z, ALPHA)), len(w.initial))

        def run() -> tuple[Tensor, States]:
            layer.reset()
            spikes = layer(case.x)
            return spikes, tuple(layer.states)
        return run
