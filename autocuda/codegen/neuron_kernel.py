"""Neuron kernels from a derivation: FPTT, BPTT and their single-step forms, for any dtype.

The parameter list is declared once, by the plans (`kernel_plans`, in the builder's vocabulary); the body is written
from the plan (`schedule`); the template frames it.
Tensor parameter names are the interface to the op layer:
    forward:  x_seq, <state>_init, [tensor params] -> spike_seq, h_seq, <state>_seq, <state>_checkpoints,
              <state>_final
    backward: grad_spike_seq, grad_<state>_seq, grad_<state>_final, h_seq, <state>_seq, <state>_checkpoints,
              x_seq, <state>_init
              -> grad_x_seq, grad_<state>_init, grad_<param> (partial sums, reduced by the caller: one per neuron,
              or for a shared parameter one per group of `broadcast.GRADIENT_GROUP` neurons)
              (x_seq only where the adjoint needs x and cannot take it back from h: `BackwardStep.needs_x`;
              <state>_checkpoints [(T - 1) // K, N] instead of the saved <state>_seq where backward replays: row j
              is the state after step (j + 1)·K - 1, K = `replay_steps`; none after the last step)
Single-step kernels use the same names with T = 1 and no time loop. With `given_inits=False` every
<state>_init is one number for all neurons, passed by value, and backward returns no grad_<state>_init.
In the source, every name made from a user's (states, parameters, the arguments named after them) is spelled by
`cnames.c_name`; the arguments' keys above stay as they are (`CParam.name` is the key, `CParam.cname` the C).
"""
from __future__ import annotations

import functools
import hashlib
from typing import Any

import sympy as sp
from sympy.printing.str import StrPrinter

from ..spec.derive import BackwardStep, Derivation, ForwardStep, StepSystem, spike_value
from ..toolchain.cnames import comment_text
from .broadcast import GRADIENT_GROUP
from .builder import kernel_param
from .ckernel import CKernel
from .dtypes import headers_for
from .kernel_plans import SURROGATE_INPUT, backward_plan, forward_plan
from .noise import c_source
from .options import (
    KERNELS,
    REPLAY_STEPS,
    SHARED_BYTES,
    STAGED_WORDS,
    VECTOR_CTYPES,
    KernelOptions,
    KernelPlan,
    Statement,
    Transfer,
    pair_copies,
    pipeline_depth,
    replay_steps,
    staged_steps,
)
from .schedule import kernel_body

__all__ = ["KERNELS", "KERNEL_STEM", "REPLAY_STEPS", "SHARED_BYTES", "STAGED_WORDS", "SURROGATE_INPUT",
           "VECTOR_CTYPES", "KernelOptions", "NeuronKernel", "KernelPlan", "Statement", "Transfer", "build_kernel",
           "describe", "kernel_param", "kernel_stem", "pair_copies", "pipeline_depth", "replay_steps",
           "staged_steps"]


class NeuronKernel(CKernel):
    """A generated neuron kernel; launch arguments are named as in the module docstring. The template frames the
    body (`schedule.kernel_body`) with the includes, the description and the signature."""

    template = "neuron.cu.j2"

    def __init__(self, kernel_name: str, plan: KernelPlan, options: KernelOptions, description: tuple[str, ...] = (),
                 checkpoint_steps: int = 0):
        super().__init__(kernel_name)
        self.plan, self.options, self.checkpoint_steps = plan, options, checkpoint_steps
        self.description = tuple(comment_text(line) for line in description)
        for param in plan.params:
            self.cparams[param.name] = param

    @property
    def lanes(self) -> int:
        return self.options.lanes

    @property
    def block(self) -> int:
        """Threads per block the kernel must be launched with (its shared ring is sized for them)."""
        return self.options.block

    def _context(self) -> dict[str, Any]:
        storage = self.options.dtype
        draws = c_source(self.plan.draws) if self.plan.draws else ""  # only kernels that draw carry the generator
        return {"name": self.kernel_name, "headers": headers_for([storage]),
                "prelude": (storage.prelude if self.options.native else "") + draws,
                "params": [p.declaration(restrict=p.pointer) for p in self.cparams.values()],
                "launch_bounds": self.launch_bounds,
                "description": self.description, "async_copies": self.plan.depth > 1,
                "channel_sums": any(t.channel_sum for t in self.plan.finish),
                "group_sums": any(t.group_sum for t in self.plan.finish), "group": GRADIENT_GROUP,
                "body": kernel_body(self.plan, self.options)}


def describe(spec_title: str, derivation: Derivation, options: KernelOptions) -> tuple[str, ...]:
    """Comment lines heading a kernel: what it is and the step equations it implements."""
    system, step = derivation.system, derivation.forward
    role = {"fptt": "forward through T steps", "bptt": "backward through T steps (reverse time loop)",
            "step-forward": "one forward step", "step-backward": "one backward step"}[options.kernel]
    arithmetic = options.dtype.compute.name
    lines = [spec_title, f"{options.kernel}: {role}; {options.dtype.name} storage, {arithmetic} arithmetic, "
             f"{system.reset} reset{', detach_reset' if derivation.detach_reset and 'backward' in role else ''}"]
    return tuple(lines) + _equations(system, step)


@functools.lru_cache(maxsize=1024)
def _equations(system: Any, step: Any) -> tuple[str, ...]:
    """The step's equations as comment lines (printed once per derivation: every variant repeats them), in sympy's
    text (`sstr`), whose subexpressions the kernel names' text prints too (`value_text`)."""
    lines = [f"h = {value_text(step.charge)}", f"threshold = {value_text(step.threshold)}"]
    lines += [f"s = {value_text(spike_value(system))}", f"e = {value_text(spike_value(system, magnitude=True))}"] \
        if system.levels else [f"s = (h {system.fires_at} threshold)"]
    lines += [f"{s.name}' = {value_text(e)}" for s, e in zip(system.states, step.new_states)]
    renames = (("ac_h", "h"), ("ac_thr", "threshold"), ("ac_s", "s"), ("ac_e", "e"))
    return tuple(functools.reduce(lambda text, r: text.replace(*r), renames, line) for line in lines)


@functools.lru_cache(maxsize=1024, typed=True)
def _text(part: Any) -> str:
    """repr of a derivation or a part of it, once: every variant of a spec names its kernel from it, and
    printing a large derivation takes a good part of a second. A derivation's is made of its parts' (its system
    and forward step are printed once, for its forward kernels' names and its own). Typed: True and 1 (equal, of
    one hash) print apart, so a kernel's name never depends on which of them a process printed first."""
    return part.text(_text) if isinstance(part, Derivation) else value_text(part)


class _SharedStr(StrPrinter):
    """sympy's repr text (`sstr`, order None), each subexpression's text kept in `_SHARED` and used again wherever
    it appears: a derivation's expressions share many subexpressions, which repr prints once per appearance.
    A subexpression prints alike wherever it stands, but for a Float, whose text differs at the top (full
    precision) and inside an expression: Floats are printed each time."""

    def __init__(self) -> None:
        super().__init__({"order": None})

    def _print(self, expr: Any, **kwargs: Any) -> str:
        if kwargs or not isinstance(expr, sp.Basic) or isinstance(expr, sp.Float):
            return super()._print(expr, **kwargs)
        found = _SHARED.get(expr)
        if found is None:
            found = super()._print(expr)
            if len(_SHARED) >= MAX_SHARED:
                _SHARED.clear()
            _SHARED[expr] = found
        return found


MAX_SHARED = 50_000  # subexpression texts kept by `_SharedStr`
_SHARED: dict[sp.Basic, str] = {}


def value_text(value: Any) -> str:
    """repr(value) for the values a derivation holds (sympy expressions, tuples, the derivation's dataclasses,
    anything else by its own repr), sympy's text printed by `_SharedStr`."""
    if isinstance(value, sp.Basic):
        return _SharedStr().doprint(value)
    if type(value) is tuple:
        return "(" + ", ".join(value_text(v) for v in value) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, (StepSystem, ForwardStep, BackwardStep)):
        return value.text(value_text)
    return repr(value)


def _tuple_text(items: tuple) -> str:
    """repr(items), a tuple of two or more, with its sympy items' reprs printed once (`_text`)."""
    return "(" + ", ".join(_text(item) if isinstance(item, sp.Basic) else repr(item) for item in items) + ")"


def build_kernel(spec_name: str, derivation: Derivation, options: KernelOptions,
                 surrogate_gradient: sp.Expr, description: tuple[str, ...] = ()) -> NeuronKernel:
    """The kernel `options.kernel` of a derivation; `surrogate_gradient` is an expression of SURROGATE_INPUT."""
    if options.forward:
        plan = forward_plan(derivation, options)
    else:
        plan = backward_plan(derivation, options, surrogate_gradient)
    streamed = [t for t in plan.loads if t.streamable]
    if options.multi_step and not plan.segment:
        plan.depth = pipeline_depth(options, len(streamed))
        plan.staged = staged_steps(options, streamed)
    if plan.depth > 1 or plan.staged:
        plan.streamed, plan.loads = streamed, [t for t in plan.loads if not t.streamable]
    # Readable parts first; the digest tells apart variants that differ in anything else.
    # A forward kernel depends on detach_reset and the surrogate only through what it saves: leaving them out
    # of its name lets identical forward kernels share one name, one source and one compiled binary.
    forward = options.forward
    identity = ((_text(derivation.system), _text(derivation.forward), derivation.saved_states, options,
                 *(("charge replayed",) if derivation.charge_replayed else ())) if forward
                else (_text(derivation), options, surrogate_gradient))
    digest = hashlib.sha1(_tuple_text(identity).encode()).hexdigest()[:6]
    detach = "_detach" if derivation.detach_reset and not forward else ""
    kind = options.kernel.replace("-", "_")
    name = f"{kernel_stem(spec_name)}_{kind}_{options.dtype.name}_{derivation.system.reset}{detach}_{digest}"
    return NeuronKernel(name, plan, options, description, replay_steps(derivation, options))


# A kernel name is its stem and at most 42 more characters ('_step_backward_bfloat16_hard_detach_<digest>'), 63 in all.
KERNEL_STEM = 21


def kernel_stem(spec_name: str) -> str:
    """The start of a spec's kernel names: its name, or where that is longer than KERNEL_STEM, its first characters
    and a digest of the whole (specs whose names start alike still name their kernels apart)."""
    if len(spec_name) <= KERNEL_STEM:
        return spec_name
    digest = hashlib.sha1(spec_name.encode()).hexdigest()[:6]
    return f"{spec_name[:KERNEL_STEM - len(digest) - 1].rstrip('_')}_{digest}"
