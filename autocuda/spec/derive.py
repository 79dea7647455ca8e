"""Derivation: one time step of a neuron as equations, its adjoint for backpropagation through time,
and the choice of what the forward pass must save for the backward pass.

Notation (per neuron, step t): inputs x = x[t] and the states S = (v, w, ...) of step t-1;
    h  = charge(x, S)                   thr = threshold(S)
    s  = Θ(h - thr)                     the spike (surrogate gradient σ'(h - thr) in backward); Θ(0) = 1
                                        (fires_at ">=") or Θ(0) = 0 (fires_at ">": the strict step)
    v' = reset(h, s_r, thr)             s_r is the spike as the reset sees it (detached if detach_reset)
    w' = update_w(x, h, s, S)           further states, after firing
A multi-level spike (`levels`) is s = Σ_k c_k Θ(a_k(h, thr, S)), each level with its own surrogate σ_k; its
hard reset sees the event e = Σ_k |c_k| Θ(a_k) (e_r, detached as s_r) instead of s. The single spike is the one
level c = 1, a = h - thr.
Several step inputs (x, y, ...) are alike: each is read where x is, and gets its own gradient dL/dy.
Backward receives λ = dL/dS' (the gradient reaching the new states) and g_s = dL/ds, and returns
dL/dx, dL/dS (the next λ, one step earlier) and dL/dp for learnable parameters p (λ·F = Σ_j λ_j F_j):
    g_sp = g_s + ∂(λ·F)/∂s + [not detach] ∂(λ·F)/∂s_r       g_e = [not detach] ∂(λ·F)/∂e_r
    G_k  = (g_sp c_k + g_e |c_k|) σ_k'(a_k)                    per level
    g_h  = ∂(λ·F)/∂h + Σ_k G_k ∂a_k/∂h                         g_thr = ∂(λ·F)/∂thr + Σ_k G_k ∂a_k/∂thr
    dL/du = g_h ∂h/∂u + g_thr ∂thr/∂u + Σ_k G_k ∂a_k/∂u + ∂(λ·F)/∂u          for u in x, S, p
(for the single spike, G = g_sp σ', g_h = ∂(λ·F)/∂h + g_sp σ', g_thr = ∂(λ·F)/∂thr - g_sp σ').
Where ∂h/∂u mentions x and h gives x back (`recovered_input`), x is replaced by its value from h, so that
backward need not read x[t].
"""
from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Literal

import sympy as sp

from .draws import system_draws
from .partials import derivative

if TYPE_CHECKING:
    from .surrogate import Surrogate

Reset = Literal["hard", "soft", "none"]
RESETS: tuple[Reset, ...] = ("hard", "soft", "none")
FiresAt = Literal[">=", ">"]
# The spike's step Θ(z) at z = 0, per comparison: sympy's Heaviside(z, Θ(0)), which the printers know as the
# table's `heaviside` (fires at equality) and `heaviside_strict` (fires strictly above).
_STEP_AT_ZERO: dict[str, int] = {">=": 1, ">": 0}


@dataclass(frozen=True)
class StepSystem:
    """One step's equations in sympy, with the reset rule chosen (the input of the derivation)."""

    x: sp.Symbol
    states: tuple[sp.Symbol, ...]          # values of step t-1; states[0] is the membrane
    params: tuple[sp.Symbol, ...]          # every parameter symbol that may appear
    learnable: tuple[sp.Symbol, ...]       # parameters that get gradients
    charge: sp.Expr                        # h
    threshold: sp.Expr
    updates: tuple[sp.Expr, ...]           # new values of states[1:], in terms of h, s, x, states, params
    reset: Reset
    v_reset: sp.Expr | None                # the hard-reset value (a parameter symbol or a number) or None
    levels: tuple[SpikeLevel, ...] = ()    # a multi-level spike; () is the single spike Θ(h - thr)
    more_inputs: tuple[sp.Symbol, ...] = ()  # the step inputs after x (the first), for a spec with several
    fires_at: FiresAt = ">="               # the spike's comparison (of every level): Θ(0) = 1, or 0 for ">"
    output: sp.Expr | None = None          # what the forward writes in place of s (states after the step): inference

    @property
    def inputs(self) -> tuple[sp.Symbol, ...]:
        """Every step input, x first."""
        return (self.x, *self.more_inputs)

    def __repr__(self) -> str:
        """The dataclass's repr, without `levels` where there are none, `more_inputs` where there is x alone,
        `fires_at` where it is ">=" and `output` where it is None: kernel names are digests of it, and the systems
        without these keep theirs."""
        return self.text(repr)

    def text(self, field_repr: Callable[[Any], str]) -> str:
        """repr(self), each field's value spelled by `field_repr` (which must give repr's text)."""
        return _repr_without_defaults(self, ("levels", "more_inputs", "fires_at", "output"), field_repr)


def _repr_without_defaults(obj: object, optional: tuple[str, ...],
                           field_repr: Callable[[Any], str] = repr) -> str:
    """A dataclass's repr, leaving out the fields named in `optional` where they hold their default; each field's
    value as `field_repr` spells it (a caller may pass a cached repr: it must give repr's text)."""
    shown = (f for f in fields(obj)  # type: ignore[arg-type]
             if not (f.name in optional and getattr(obj, f.name) == f.default))
    return f"{type(obj).__qualname__}({', '.join(f'{f.name}={field_repr(getattr(obj, f.name))}' for f in shown)})"


@dataclass(frozen=True)
class SpikeLevel:
    """One level of a spike: it adds `weight` where `argument` >= 0 (> 0 under fires_at ">"), with `surrogate`'s
    gradient in backward
    (None: the neuron's surrogate, the one the layer or kernel is given)."""

    weight: sp.Expr
    argument: sp.Expr                      # in H, THRESHOLD, the states and the parameters
    surrogate: Surrogate | None = None


# Symbols the derivation introduces. Their names start with the generated prefix, so no spec name equals one.
H = sp.Symbol("ac_h", real=True)
SPIKE = sp.Symbol("ac_s", real=True)
SPIKE_RESET = sp.Symbol("ac_s_reset", real=True)
THRESHOLD = sp.Symbol("ac_thr", real=True)
SURROGATE_GRAD = sp.Symbol("ac_sg", real=True)
GRAD_SPIKE = sp.Symbol("ac_grad_s", real=True)
EVENT = sp.Symbol("ac_e", real=True)              # a multi-level spike's hard-reset event Σ |c_k| Θ(a_k)
EVENT_RESET = sp.Symbol("ac_e_reset", real=True)  # the event as the reset sees it (detached if detach_reset)
SINGLE_LEVEL = (SpikeLevel(sp.Integer(1), H - THRESHOLD),)


def spike_levels(system: StepSystem) -> tuple[SpikeLevel, ...]:
    """The levels of the system's spike (the single spike is one level)."""
    return system.levels or SINGLE_LEVEL


def level_gradient_symbol(k: int) -> sp.Symbol:
    """σ_k'(a_k), the surrogate gradient of level k (level 0's is SURROGATE_GRAD)."""
    return SURROGATE_GRAD if k == 0 else sp.Symbol(f"ac_sg_{k}", real=True)


def fire_step(system: StepSystem, z: sp.Expr) -> sp.Expr:
    """Θ(z), the step of the system's spike: Heaviside(z, 1) for fires_at ">=", the strict Heaviside(z, 0) for ">"."""
    return sp.Heaviside(z, _STEP_AT_ZERO[system.fires_at])


def spike_value(system: StepSystem, magnitude: bool = False) -> sp.Expr:
    """s = Σ c_k Θ(a_k) in H, THRESHOLD, states and parameters; with `magnitude`, the event Σ |c_k| Θ(a_k)."""
    return sp.Add(*((abs(level.weight) if magnitude else level.weight) * fire_step(system, level.argument)
                    for level in spike_levels(system)))


def spike_symbols(system: StepSystem) -> frozenset[sp.Symbol]:
    """The symbols standing for the spike's values in the step (spike, event, threshold, level gradients)."""
    levels = spike_levels(system)
    return frozenset({SPIKE, EVENT, THRESHOLD, *(level_gradient_symbol(k) for k in range(len(levels)))})


def spike_inputs(system: StepSystem) -> set[sp.Basic]:
    """What the spike reads besides H: the threshold's and the levels' symbols."""
    inputs = set(system.threshold.free_symbols)
    for level in spike_levels(system):
        inputs |= level.argument.free_symbols - {H, THRESHOLD}
    return inputs


def adjoint_symbol(state: sp.Symbol) -> sp.Symbol:
    """λ for a state: the gradient of the loss w.r.t. that state after the current step."""
    return sp.Symbol(f"ac_grad_{state.name}", real=True)


@dataclass(frozen=True)
class ForwardStep:
    threshold: sp.Expr
    charge: sp.Expr
    new_states: tuple[sp.Expr, ...]     # in terms of H, SPIKE (SPIKE_RESET replaced by SPIKE), x, states, params

    def text(self, field_repr: Callable[[Any], str]) -> str:
        """repr(self) (the dataclass's), each field's value spelled by `field_repr` (which must give repr's text)."""
        return _repr_without_defaults(self, (), field_repr)


@dataclass(frozen=True)
class BackwardStep:
    """Gradients through one step. Expressions use H, SPIKE, SURROGATE_GRAD, THRESHOLD, GRAD_SPIKE, λs."""

    grad_x: sp.Expr
    grad_states: tuple[sp.Expr, ...]    # the λ of the previous step, per state
    grad_params: tuple[sp.Expr, ...]    # per learnable parameter
    needs_x: bool                       # the backward reads x[t] (not when recovered from h: recovered_input)
    needs_states: tuple[bool, ...]      # the backward reads the previous value of each state
    grad_more_inputs: tuple[sp.Expr, ...] = ()  # per step input after x (`StepSystem.more_inputs`)
    needs_more_inputs: tuple[bool, ...] = ()    # the backward reads that input's value at t

    @property
    def grad_inputs(self) -> tuple[sp.Expr, ...]:
        return (self.grad_x, *self.grad_more_inputs)

    @property
    def needs_inputs(self) -> tuple[bool, ...]:
        return (self.needs_x, *self.needs_more_inputs)

    def __repr__(self) -> str:
        """Without the fields of further inputs where there are none (kernel names are digests of it)."""
        return self.text(repr)

    def text(self, field_repr: Callable[[Any], str]) -> str:
        """repr(self), each field's value spelled by `field_repr` (which must give repr's text)."""
        return _repr_without_defaults(self, ("grad_more_inputs", "needs_more_inputs"), field_repr)


@dataclass(frozen=True)
class Derivation:
    system: StepSystem
    detach_reset: bool
    forward: ForwardStep
    backward: BackwardStep
    saved_states: tuple[bool, ...]      # forward saves this state's sequence for backward
    recompute_membrane: bool            # backward recomputes v[t-1] from h[t-1] (nothing saved for it)
    replayable: bool = False            # backward may rebuild the saved states from checkpoints and h (`replayable`)
    charge_replayed: bool = False       # multi-step: backward recomputes h too, from x (`replaying_charge`)

    def __repr__(self) -> str:
        """Without `charge_replayed` where it is False (kernel names are digests of it)."""
        return self.text(repr)

    def text(self, field_repr: Callable[[Any], str]) -> str:
        """repr(self), each field's value spelled by `field_repr` (which must give repr's text: a cached repr
        spares printing the system and the forward step again, which every kernel of them names itself by)."""
        return _repr_without_defaults(self, ("charge_replayed",), field_repr)


def membrane_update(system: StepSystem) -> sp.Expr:
    """v' from h and the reset spike: the reset rule of docs/semantics.md (a multi-level spike's hard reset
    sees its event)."""
    if system.reset == "hard":
        fired = EVENT_RESET if system.levels else SPIKE_RESET
        return H * (1 - fired) + system.v_reset * fired
    if system.reset == "soft":
        return H - SPIKE_RESET * THRESHOLD
    return H


def forward_step(system: StepSystem) -> ForwardStep:
    membrane = membrane_update(system).subs({SPIKE_RESET: SPIKE, EVENT_RESET: EVENT})
    return ForwardStep(system.threshold, system.charge, (membrane, *system.updates))


@functools.lru_cache(maxsize=256)
def recovered_input(system: StepSystem) -> sp.Expr | None:
    """x in terms of H, the states and the parameters, for backward to use instead of reading x[t]; None where
    it may not.

    Why: memory traffic. Reading x[t] again adds 4 bytes per neuron-step in float32 to the 24 of a training
    step's floor (forward reads x, writes spike and h; backward reads grad_spike and h, writes grad_x).
    A charge h = c0 + c1·x (c0, c1 free of x) gives x back as (h - c0)/c1, and where x is in the charge alone
    it meets backward only through ∂h/∂u = ∂c0/∂u + x ∂c1/∂u: ParametricLIF's
    ∂h/∂w = (x - (v - v_reset)) sigmoid'(w) becomes (h - v)(1 - sigmoid(w)).

    Taken only where that is exact and no less accurate:
    - c1 is provably nonzero for every value of the (real) parameter and state symbols, by sympy's assumptions
      (`is_zero` is False): sigmoid(w) and 1/tau are; `R` is not, as R may be 0, and dividing by a zero c1 would
      be a silently wrong gradient;
    - x is in the charge alone, not in the threshold or the updates of other states. In ∂h/∂u the recovered x
      becomes (h - c0) ∂log(c1)/∂u, so the rounding error of a stored h (float16, bfloat16) reaches the
      gradient with the factor ∂log(c1)/∂u (1 - sigmoid(w) for ParametricLIF). An update's term a·x would
      carry it amplified by 1/c1 (tau for LIF: a float16 h, rounded by 5e-4 |h|, and tau = 1000 give x off by
      half of |h|).
    """
    x = system.x
    if system.more_inputs:  # x from h alone needs every other input read anyway: none is recovered
        return None
    if any(e.has(x) for e in (system.threshold, *system.updates, *(lv.argument for lv in system.levels))):
        return None
    slope = sp.diff(system.charge, x)
    if slope.has(x) or slope.is_zero is not False:
        return None
    return (H - system.charge.subs(x, 0)) / slope


def _shortest(expr: sp.Expr) -> sp.Expr:
    """`expr` or a cheap rewriting of it (cancel, factor), whichever has the fewest operations: after x is
    replaced by (h - c0)/c1, cancelling c1 both saves work and keeps 1/c1 out of the kernel."""
    candidates = [expr]
    for rewrite in (sp.cancel, sp.factor):
        try:
            candidates.append(rewrite(expr))
        except sp.PolynomialError:  # expressions with Piecewise and the like: keep what there is
            continue
    return min(candidates, key=sp.count_ops)


@functools.lru_cache(maxsize=1024)
def _charge_partial(charge: sp.Expr, x: sp.Symbol, x_value: sp.Expr | None, u: sp.Symbol) -> sp.Expr:
    """∂h/∂u, x replaced by `x_value` (x recovered from h: `recovered_input`) where it has x."""
    partial = derivative(charge, u)
    if x_value is None or not partial.has(x):
        return partial
    return _shortest(partial.subs(x, x_value))


def backward_step(system: StepSystem, detach_reset: bool) -> BackwardStep:
    x_value = recovered_input(system)

    def charge_partial(u: sp.Symbol) -> sp.Expr:
        return _charge_partial(system.charge, system.x, x_value, u)

    new_states = [membrane_update(system), *system.updates]
    adjoints = [adjoint_symbol(s) for s in system.states]
    weighted = sum((lam * f for lam, f in zip(adjoints, new_states)), sp.Integer(0))
    grad_spike_total = GRAD_SPIKE + derivative(weighted, SPIKE)
    grad_event = sp.Integer(0)
    if not detach_reset:
        grad_spike_total += derivative(weighted, SPIKE_RESET)
        grad_event = derivative(weighted, EVENT_RESET)
    levels = [((grad_spike_total * lv.weight + grad_event * abs(lv.weight)) * level_gradient_symbol(k), lv.argument)
              for k, lv in enumerate(spike_levels(system))]

    def through_levels(u: sp.Symbol) -> sp.Expr:
        return sum((g * derivative(a, u) for g, a in levels), sp.Integer(0))

    grad_h = derivative(weighted, H) + through_levels(H)
    grad_threshold = derivative(weighted, THRESHOLD) + through_levels(THRESHOLD)

    def total(u: sp.Symbol) -> sp.Expr:
        grad = grad_h * charge_partial(u) + grad_threshold * derivative(system.threshold, u) + through_levels(u)
        # In value, the reset's spike is the spike; only its derivative differed (detach_reset). One symbol for
        # another: xreplace (subs compares every rebuilt subtree with the old one, quadratic in the size).
        return _steps_and_kinks((grad + derivative(weighted, u)).xreplace({SPIKE_RESET: SPIKE, EVENT_RESET: EVENT}))

    grads = (tuple(total(u) for u in system.inputs), tuple(total(s) for s in system.states),
             tuple(total(p) for p in system.learnable))
    # the backward recomputes the threshold, the spike and the surrogate gradient from h at every step, used or not:
    # what they read is read
    used = set().union(*(e.free_symbols for e in (*grads[0], *grads[1], *grads[2])), spike_inputs(system))
    return BackwardStep(grads[0][0], grads[1], grads[2], system.x in used, tuple(s in used for s in system.states),
                        grads[0][1:], tuple(u in used for u in system.more_inputs))


def _step(z: sp.Expr) -> sp.Expr:
    return sp.Heaviside(z, 1)


def _steps_and_kinks(expr: sp.Expr) -> sp.Expr:
    """Derivatives of heaviside, abs, min and max in one step function the printers know, H(z) with H(0) = 1
    (the table's `heaviside`): a step's derivative (DiracDelta) is 0 wherever it is defined, as autograd through the
    reference takes it; sign(z) = H(z) - H(-z); sympy's H(z, h0) (min and max, h0 = 1/2 splits the gradient
    at a tie) = h0 H(z) + (1 - h0)(1 - H(-z))."""
    def half_step(e: sp.Heaviside) -> sp.Expr:
        z, h0 = e.args[0], (e.args[1] if len(e.args) > 1 else sp.S.Half)
        return h0 * _step(z) + (1 - h0) * (1 - _step(-z))

    def other_step(e: sp.Basic) -> bool:
        return isinstance(e, sp.Heaviside) and (len(e.args) < 2 or e.args[1] != 1)

    # each rewriting only where its kind of node is there (one walk finds them; a rewriting walks and rebuilds)
    found = expr.atoms(sp.DiracDelta, sp.sign, sp.Heaviside)
    if any(isinstance(e, sp.DiracDelta) for e in found):
        expr = expr.replace(sp.DiracDelta, lambda *_: sp.S.Zero)
    if any(isinstance(e, sp.sign) for e in found):
        expr = expr.replace(sp.sign, lambda z: _step(z) - _step(-z))
    return expr.replace(other_step, half_step) if any(other_step(e) for e in found) else expr


def derive(system: StepSystem, detach_reset: bool = False) -> Derivation:
    """The forward step, its adjoint, and what forward saves for backward.

    Backward always reads h[t] (spike and surrogate gradient are recomputed from it). A previous state
    it reads is either recomputed or saved: the membrane v[t-1] = reset(h[t-1]) is recomputed when the
    threshold is a function of parameters only (then s[t-1] follows from h[t-1] alone); any other state,
    and the membrane under a state-dependent threshold, is saved as a sequence.
    """
    backward = backward_step(system, detach_reset)
    membrane_recomputable = not (spike_inputs(system) & set(system.states))
    recompute = backward.needs_states[0] and membrane_recomputable
    saved = tuple(needed and not (i == 0 and recompute) for i, needed in enumerate(backward.needs_states))
    step = forward_step(system)
    return Derivation(system, detach_reset, step, backward, saved, recompute,
                      not recompute and replayable(system, step, saved))


def replayable(system: StepSystem, step: ForwardStep, saved: tuple[bool, ...]) -> bool:
    """Whether the saved states' values can be rebuilt from h[t] and their values at an earlier step, by running
    their updates again: then forward need write them only every few steps (checkpoints), and backward replays
    the steps in between.

    Why: memory traffic. ALIF's adaptation `a` enters the threshold, so backward needs a[t-1], and saving its
    sequence moves 8 more bytes per neuron-step in float32 (32 against LIF's 24). Its update `rho·a + s` needs
    only a and the spike, and the spike only h and the threshold, so a checkpoint every K steps (4/K bytes
    each way) and h rebuild it exactly.

    Taken where the updates of the saved states (and the threshold, where they use the spike) read no input x
    and no state that is not saved itself: the replay has h and the saved states alone. Not for a multi-level
    spike: the h that forward stores is rounded to keep one threshold's decision (`h_stored_as_decided`).
    """
    if system.levels or system_draws(system):  # a replay would make the draws again: not done (`spec.draws`)
        return False
    kept = {s for s, keep in zip(system.states, saved) if keep}
    if not kept:
        return False
    read: set[sp.Basic] = set()
    for state, update in zip(system.states, step.new_states):
        if state in kept:
            spiking = update.has(SPIKE) or update.has(THRESHOLD)
            read |= update.free_symbols | (spike_inputs(system) if spiking else set())
    return not read & set(system.inputs) and read & set(system.states) <= kept


def replaying_charge(derivation: Derivation) -> Derivation:
    """The derivation whose multi-step forward saves no h: it writes checkpoints of every state every few steps,
    and backward replays each segment's steps from the last checkpoint and x, h included.

    Why: memory traffic where backward reads x anyway. A fused BatchNorm's backward reads x for the gradients
    of its scale; reading h as well moves e more per neuron-step each way (forward's write and backward's read).
    The replay runs forward's expressions again, printed alike, on the same values: it rebuilds h and every
    state bit for bit."""
    if system_draws(derivation.system):
        raise ValueError("a step with random draws (randn(), rand()) cannot replay its charge in backward (a fused "
                         "BatchNorm's two-pass backward): the replay does not make the draws again")
    states = derivation.system.states
    return dataclasses.replace(derivation, saved_states=(True,) * len(states), recompute_membrane=False,
                               replayable=True, charge_replayed=True)


@functools.lru_cache(maxsize=256)
def previous_membrane(system: StepSystem, h_previous: sp.Symbol) -> sp.Expr:
    """v[t-1] from h[t-1] when the spike depends on parameters only (used by the backward kernel; cached: every
    backward kernel of the system asks)."""
    if not system.levels:
        spike = fire_step(system, h_previous - system.threshold)
        return membrane_update(system).subs({SPIKE_RESET: spike, THRESHOLD: system.threshold, H: h_previous})
    values = {SPIKE_RESET: spike_value(system), EVENT_RESET: spike_value(system, magnitude=True)}
    return membrane_update(system).subs(values).subs({THRESHOLD: system.threshold, H: h_previous})
