"""The reference: the same step equations evaluated with torch ops, differentiable by autograd.

It is the oracle of every test and the CPU execution path. It evaluates the sympy step of a `StepSystem`
(never the printed C), with the spike through the surrogate's autograd function and, with detach_reset,
a detached spike inside the membrane reset — exactly the semantics of docs/semantics.md.

`derived_backward` evaluates the *derived* adjoint (what the BPTT kernel computes, including the recomputed
v[t-1]) with torch, so the derivation can be checked against autograd without any kernel.
"""
from __future__ import annotations

import functools
import operator
from collections.abc import Mapping, Sequence

import sympy as sp
import torch

from ..codegen.noise import Seed, step_values
from ..spec.derive import (
    EVENT,
    EVENT_RESET,
    GRAD_SPIKE,
    SPIKE,
    SPIKE_RESET,
    THRESHOLD,
    Derivation,
    H,
    StepSystem,
    adjoint_symbol,
    fire_step,
    level_gradient_symbol,
    membrane_update,
    previous_membrane,
    spike_levels,
)
from ..spec.draws import Draw, system_draws
from ..spec.flat import run
from ..spec.surrogate import Surrogate
from ..spec.torch_eval import evaluate, prepare_expression, program_of

Values = Mapping[sp.Symbol, "torch.Tensor | float"]
# The names `step` gives the values it computes (the programs read values by name).
_H, _THRESHOLD, _SPIKE, _SPIKE_RESET, _EVENT, _EVENT_RESET = (
    s.name for s in (H, THRESHOLD, SPIKE, SPIKE_RESET, EVENT, EVENT_RESET))


def _inputs(x: torch.Tensor | Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """x, or one tensor per step input of a spec with several, as a tuple."""
    return (x,) if isinstance(x, torch.Tensor) else tuple(x)


def step(system: StepSystem, x: torch.Tensor | Sequence[torch.Tensor], states: Sequence[torch.Tensor],
         params: Values, surrogate: Surrogate, detach_reset: bool = False, draws: Values | None = None
         ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], torch.Tensor]:
    """One step: (spike, new states, h). `x`: the input, or one tensor per step input (`StepSystem.inputs`);
    `draws`: the values of the step's random draws (`noise.step_values`), where it makes any."""
    return _step(prepare(system), x, states, _by_name(params), surrogate, detach_reset, _by_name(draws or {}))


def _step(prepared: _Prepared, x: torch.Tensor | Sequence[torch.Tensor], states: Sequence[torch.Tensor],
          params: Mapping[str, torch.Tensor | float], surrogate: Surrogate, detach_reset: bool,
          draws: Mapping[str, torch.Tensor | float]) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], torch.Tensor]:
    """`step` with the values by name (what the prepared programs read)."""
    inputs = _inputs(x)
    x = inputs[0]
    values = {**params, **dict(zip(prepared.inputs, inputs)), **dict(zip(prepared.states, states)), **draws}
    h = prepared.charge(values)
    threshold = prepared.threshold(values)
    values |= {_H: h, _THRESHOLD: threshold}
    spike, event = _fire(prepared, values, surrogate)
    reset_spike = spike.detach() if detach_reset else spike
    values |= {_SPIKE: spike, _SPIKE_RESET: reset_spike}
    if prepared.levels:
        values |= {_EVENT: event, _EVENT_RESET: event.detach() if detach_reset else event}
    new_states = tuple(update(values) for update in prepared.updates)
    return _like(spike, x), tuple(_like(s, x) for s in new_states), _like(h, x)


def fire(system: StepSystem, values: Values, surrogate: Surrogate) -> tuple[torch.Tensor, torch.Tensor]:
    """(spike, event) from `values` of H, THRESHOLD, states and parameters: each level through its surrogate's
    autograd function (the neuron's `surrogate` where it has none of its own)."""
    return _fire(prepare(system), _by_name(values), surrogate)


def _fire(prepared: _Prepared, values: Mapping[str, torch.Tensor | float], surrogate: Surrogate
          ) -> tuple[torch.Tensor, torch.Tensor]:
    # The step Θ(0) = 0 (fires strictly above, derive.fire_step) is asked for by keyword, so that a surrogate of
    # the default comparison may be any callable of z alone.
    strict = {"strict": True} if prepared.strict else {}
    if not prepared.levels:
        spike = surrogate(values[_H] - values[_THRESHOLD], **strict)  # type: ignore[arg-type]  # H: a tensor
        return spike, spike
    fired = [(own or surrogate)(argument(values), **strict) for argument, own in prepared.levels]
    spike = functools.reduce(operator.add, (c * f for c, f in zip(prepared.weights, fired)))
    event = functools.reduce(operator.add, (abs(c) * f for c, f in zip(prepared.weights, fired)))
    return spike, event


class _Expression:
    """One expression of the step, evaluated by its flat program (`spec.flat`: a loop over a tuple, which
    torch.compile traces in a fraction of the sympy walk's time), or by the walk where it cannot be lowered (which
    then raises, naming the node)."""

    def __init__(self, expr: sp.Basic):
        self.expr, self.program = prepare_expression(expr), program_of(expr)

    def __call__(self, values: Mapping[str, torch.Tensor | float]) -> torch.Tensor:
        if self.program is not None:
            return run(self.program, values)
        return evaluate(self.expr, {sp.Symbol(name, real=True): value for name, value in values.items()})


class _Prepared:
    """A step's expressions as programs and its symbols' names: all `step` reads, built outside any trace."""

    def __init__(self, system: StepSystem):
        self.inputs = tuple(u.name for u in system.inputs)
        self.states = tuple(s.name for s in system.states)
        self.charge, self.threshold = _Expression(system.charge), _Expression(system.threshold)
        self.updates = tuple(_Expression(u) for u in (membrane_update(system), *system.updates))
        self.levels = tuple((_Expression(level.argument), level.surrogate) for level in system.levels)
        self.weights = tuple(float(level.weight) for level in system.levels)
        self.strict = system.fires_at == ">"


def _by_name(values: Mapping[sp.Symbol, torch.Tensor | float] | Mapping[str, torch.Tensor | float]
             ) -> dict[str, torch.Tensor | float]:
    return {k if isinstance(k, str) else k.name: v for k, v in values.items()}


def prepare(system: StepSystem) -> _Prepared:
    """The step of `system` prepared for evaluation (its expressions lowered to programs, the membrane's reset rule
    and the updates among them), built once and kept on the system: so that torch.compile traces torch ops only,
    never sympy. The reference's plans call it before anything is traced."""
    cached = system.__dict__.get("_reference_step")
    if cached is None:
        cached = _Prepared(system)
        for level in system.levels:  # the levels' own surrogates' gradients, built now rather than when traced
            if level.surrogate is not None:
                level.surrogate.gradient_of_x()
        object.__setattr__(system, "_reference_step", cached)  # a frozen dataclass: a derived cache only
    return cached


def multi_step(system: StepSystem, x_seq: torch.Tensor | Sequence[torch.Tensor], initial: Sequence[torch.Tensor],
               params: Values, surrogate: Surrogate, detach_reset: bool = False, seed: Seed | None = None
               ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], tuple[torch.Tensor, ...]]:
    """Over x_seq [T, *] (or one such sequence per step input): (spike_seq, final states, state sequences [T, *]
    per state). `seed`: the call's seed, for a step that draws (`spec.draws`)."""
    draws = _draws_of(system, seed)
    prepared, named = prepare(system), _by_name(params)
    sequences_in = _inputs(x_seq)
    x_seq = sequences_in[0]
    states = tuple(initial)
    spikes: list[torch.Tensor] = []
    sequences: list[list[torch.Tensor]] = [[] for _ in states]
    for t, x in enumerate(zip(*sequences_in)):
        drawn = _by_name(step_values(draws, seed, t, x[0])) if seed is not None and draws else {}
        spike, states, _ = _step(prepared, x, states, named, surrogate, detach_reset, drawn)
        spikes.append(spike)
        for seq, s in zip(sequences, states):
            seq.append(s)
    stacked = tuple(torch.stack(seq) if seq else torch.empty_like(x_seq) for seq in sequences)
    spike_seq = torch.stack(spikes) if spikes else torch.empty_like(x_seq)
    return spike_seq, states, stacked


def _draws_of(system: StepSystem, seed: Seed | None) -> tuple[Draw, ...]:
    """The step's draws; a step that draws needs a seed. A call that torch.compile traces makes none (calls that
    draw run eagerly: `functional.multi_step`), and sympy is not traced: it is not asked."""
    if seed is None and torch.compiler.is_compiling():
        return ()
    draws = system_draws(system)
    if draws and seed is None:
        raise ValueError("this step makes random draws (randn(), rand()): give its seed (autocuda.codegen.noise.Seed)")
    return draws


def _like(value: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    return value.expand_as(reference) if value.shape != reference.shape else value


def derived_backward(derivation: Derivation, surrogate: Surrogate, x_seq: torch.Tensor | Sequence[torch.Tensor],
                     initial: Sequence[torch.Tensor], params: Values, h_seq: torch.Tensor,
                     saved: Mapping[int, torch.Tensor], grad_spike_seq: torch.Tensor,
                     grad_finals: Sequence[torch.Tensor], grad_state_seqs: Sequence[torch.Tensor | None] = (),
                     seed: Seed | None = None
                     ) -> tuple[torch.Tensor | tuple[torch.Tensor, ...], tuple[torch.Tensor, ...],
                                tuple[torch.Tensor, ...]]:
    """The derived adjoint run backwards through time, reading only what forward saved (h, `saved` state
    sequences by index, x_seq where `needs_x`) as the BPTT kernel does: (grad_x_seq, grads of initial states,
    grads of learnable parameters summed over time, per neuron). With several step inputs (`x_seq` a sequence
    of them), grad_x_seq is a tuple: one gradient sequence per input. `seed`: the forward call's, for a step
    that draws (the same draws, made again)."""
    several = not isinstance(x_seq, torch.Tensor)
    draws = _draws_of(derivation.system, seed)
    input_seqs = _inputs(x_seq)
    x_seq = input_seqs[0]
    system, back = derivation.system, derivation.backward
    z = sp.Symbol("z", real=True)
    levels = spike_levels(system)
    gradients = [(level_gradient_symbol(k), (level.surrogate or surrogate).gradient(z).subs(z, level.argument))
                 for k, level in enumerate(levels)]
    lambdas = list(grad_finals)
    grad_inputs = [torch.zeros_like(x_seq) for _ in input_seqs]
    grad_params = [torch.zeros_like(x_seq[0]) for _ in system.learnable]
    for t in reversed(range(x_seq.shape[0])):
        for i, seq in enumerate(grad_state_seqs):
            if seq is not None:
                lambdas[i] = lambdas[i] + seq[t]
        previous = [_previous_state(derivation, i, t, initial, h_seq, saved, params) for i in range(len(initial))]
        # an input only where backward reads it (needs_x), as the kernel; else poisoned, so that misuse shows
        inputs = {u: seq[t] if needed else torch.full_like(seq[t], float("nan"))
                  for u, seq, needed in zip(system.inputs, input_seqs, back.needs_inputs)}
        values = {**params, **inputs, H: h_seq[t], GRAD_SPIKE: grad_spike_seq[t],
                  **dict(zip(system.states, previous)),
                  **{adjoint_symbol(s): lam for s, lam in zip(system.states, lambdas)},
                  **(step_values(draws, seed, t, x_seq[t]) if seed is not None and draws else {})}
        values[THRESHOLD] = evaluate(system.threshold, values)
        fired = [evaluate(fire_step(system, level.argument), values) for level in levels]
        values[SPIKE] = sum(float(level.weight) * f for level, f in zip(levels, fired))
        values[EVENT] = sum(abs(float(level.weight)) * f for level, f in zip(levels, fired))
        values |= {symbol: evaluate(gradient, values) for symbol, gradient in gradients}
        for grad, expr in zip(grad_inputs, back.grad_inputs):
            grad[t] = evaluate(expr, values)
        lambdas = [_like(evaluate(g, values), x_seq[t]) for g in back.grad_states]
        for k, g in enumerate(back.grad_params):
            grad_params[k] = grad_params[k] + evaluate(g, values)
    return (tuple(grad_inputs) if several else grad_inputs[0]), tuple(lambdas), tuple(grad_params)


def _previous_state(derivation: Derivation, i: int, t: int, initial: Sequence[torch.Tensor],
                    h_seq: torch.Tensor, saved: Mapping[int, torch.Tensor], params: Values) -> torch.Tensor:
    if t == 0:
        return initial[i]
    if i == 0 and derivation.recompute_membrane:
        h_prev = sp.Symbol("ac_h_prev", real=True)
        return evaluate(previous_membrane(derivation.system, h_prev), {**params, h_prev: h_seq[t - 1]})
    if i in saved:
        return saved[i][t - 1]
    return torch.full_like(initial[i], float("nan"))  # not needed by backward: poison it so misuse shows
