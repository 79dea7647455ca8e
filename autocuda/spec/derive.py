"""Derivation: one time step of a neuron as equations, its adjoint for backpropagation through time,
and the choice of what the forward pass must save for the backward pass.

Notation (per neuron, step t): inputs x = x[t] and the states S = (v, w, ...) of step t-1;
    h  = charge(x, S)                   thr = threshold(S)
    s  = Θ(h - thr)                     the spike (surrogate gradient σ'(h - thr) in backward)
    v' = reset(h, s_r, thr)             s_r is the spike as the reset sees it (detached if detach_reset)
    w' = update_w(x, h, s, S)           further states, after firing
Backward receives λ = dL/dS' (the gradient reaching the new states) and g_s = dL/ds, and returns
dL/dx, dL/dS (the next λ, one step earlier) and dL/dp for learnable parameters p:
    g_sp = g_s + Σ λ_k ∂F_k/∂s + [not detach] Σ λ_k ∂F_k/∂s_r
    g_h  = Σ λ_k ∂F_k/∂h + g_sp σ'
    dL/du = g_h ∂h/∂u - g_sp σ' ∂thr/∂u + Σ λ_k ∂F_k/∂u          for u in x, S, p
Where ∂h/∂u mentions x and h gives x back (`recovered_input`), x is replaced by its value from h, so that
backward need not read x[t].
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import sympy as sp

Reset = Literal["hard", "soft", "none"]
RESETS: tuple[Reset, ...] = ("hard", "soft", "none")


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


# Symbols the derivation introduces. Their names start with the generated prefix, so no spec name equals one.
H = sp.Symbol("ac_h", real=True)
SPIKE = sp.Symbol("ac_s", real=True)
SPIKE_RESET = sp.Symbol("ac_s_reset", real=True)
THRESHOLD = sp.Symbol("ac_thr", real=True)
SURROGATE_GRAD = sp.Symbol("ac_sg", real=True)
GRAD_SPIKE = sp.Symbol("ac_grad_s", real=True)


def adjoint_symbol(state: sp.Symbol) -> sp.Symbol:
    """λ for a state: the gradient of the loss w.r.t. that state after the current step."""
    return sp.Symbol(f"ac_grad_{state.name}", real=True)


@dataclass(frozen=True)
class ForwardStep:
    threshold: sp.Expr
    charge: sp.Expr
    new_states: tuple[sp.Expr, ...]     # in terms of H, SPIKE (SPIKE_RESET replaced by SPIKE), x, states, params


@dataclass(frozen=True)
class BackwardStep:
    """Gradients through one step. Expressions use H, SPIKE, SURROGATE_GRAD, THRESHOLD, GRAD_SPIKE, λs."""

    grad_x: sp.Expr
    grad_states: tuple[sp.Expr, ...]    # the λ of the previous step, per state
    grad_params: tuple[sp.Expr, ...]    # per learnable parameter
    needs_x: bool                       # the backward reads x[t] (not when recovered from h: recovered_input)
    needs_states: tuple[bool, ...]      # the backward reads the previous value of each state


@dataclass(frozen=True)
class Derivation:
    system: StepSystem
    detach_reset: bool
    forward: ForwardStep
    backward: BackwardStep
    saved_states: tuple[bool, ...]      # forward saves this state's sequence for backward
    recompute_membrane: bool            # backward recomputes v[t-1] from h[t-1] (nothing saved for it)
    replayable: bool = False            # backward may rebuild the saved states from checkpoints and h (`replayable`)


def membrane_update(system: StepSystem) -> sp.Expr:
    """v' from h and the reset spike: the reset rule of docs/semantics.md."""
    if system.reset == "hard":
        return H * (1 - SPIKE_RESET) + system.v_reset * SPIKE_RESET
    if system.reset == "soft":
        return H - SPIKE_RESET * THRESHOLD
    return H


def forward_step(system: StepSystem) -> ForwardStep:
    membrane = membrane_update(system).subs(SPIKE_RESET, SPIKE)
    return ForwardStep(system.threshold, system.charge, (membrane, *system.updates))


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
    if any(e.has(x) for e in (system.threshold, *system.updates)):
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


def backward_step(system: StepSystem, detach_reset: bool) -> BackwardStep:
    x_value = recovered_input(system)

    def charge_partial(u: sp.Symbol) -> sp.Expr:
        partial = sp.diff(system.charge, u)
        if x_value is None or not partial.has(system.x):
            return partial
        return _shortest(partial.subs(system.x, x_value))

    new_states = [membrane_update(system), *system.updates]
    adjoints = [adjoint_symbol(s) for s in system.states]
    weighted = sum((lam * f for lam, f in zip(adjoints, new_states)), sp.Integer(0))
    grad_spike_total = GRAD_SPIKE + sp.diff(weighted, SPIKE)
    if not detach_reset:
        grad_spike_total += sp.diff(weighted, SPIKE_RESET)
    grad_h = sp.diff(weighted, H) + grad_spike_total * SURROGATE_GRAD
    grad_threshold = sp.diff(weighted, THRESHOLD) - grad_spike_total * SURROGATE_GRAD

    def total(u: sp.Symbol) -> sp.Expr:
        grad = grad_h * charge_partial(u) + grad_threshold * sp.diff(system.threshold, u)
        # In value, the reset's spike is the spike; only its derivative differed (detach_reset).
        return _steps_and_kinks((grad + sp.diff(weighted, u)).subs(SPIKE_RESET, SPIKE))

    grads = (total(system.x), tuple(total(s) for s in system.states), tuple(total(p) for p in system.learnable))
    used = set().union(*(e.free_symbols for e in (grads[0], *grads[1], *grads[2])))
    if used & {SPIKE, SURROGATE_GRAD, THRESHOLD}:
        used |= system.threshold.free_symbols
    return BackwardStep(grads[0], grads[1], grads[2], system.x in used,
                        tuple(s in used for s in system.states))


def _step(z: sp.Expr) -> sp.Expr:
    return sp.Heaviside(z, 1)


def _steps_and_kinks(expr: sp.Expr) -> sp.Expr:
    """Derivatives of heaviside, abs, min and max in the one step function the printers know, H(z) with
    H(0) = 1: a step's derivative (DiracDelta) is 0 wherever it is defined, as autograd through the
    reference takes it; sign(z) = H(z) - H(-z); sympy's H(z, h0) (min and max, h0 = 1/2 splits the gradient
    at a tie) = h0 H(z) + (1 - h0)(1 - H(-z))."""
    def half_step(e: sp.Heaviside) -> sp.Expr:
        z, h0 = e.args[0], (e.args[1] if len(e.args) > 1 else sp.S.Half)
        return h0 * _step(z) + (1 - h0) * (1 - _step(-z))

    expr = expr.replace(sp.DiracDelta, lambda *_: sp.S.Zero)
    expr = expr.replace(sp.sign, lambda z: _step(z) - _step(-z))
    return expr.replace(lambda e: isinstance(e, sp.Heaviside) and (len(e.args) < 2 or e.args[1] != 1), half_step)


def derive(system: StepSystem, detach_reset: bool = False) -> Derivation:
    """The forward step, its adjoint, and what forward saves for backward.

    Backward always reads h[t] (spike and surrogate gradient are recomputed from it). A previous state
    it reads is either recomputed or saved: the membrane v[t-1] = reset(h[t-1]) is recomputed when the
    threshold is a function of parameters only (then s[t-1] follows from h[t-1] alone); any other state,
    and the membrane under a state-dependent threshold, is saved as a sequence.
    """
    backward = backward_step(system, detach_reset)
    membrane_recomputable = not (system.threshold.free_symbols & set(system.states))
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
    and no state that is not saved itself: the replay has h and the saved states alone.
    """
    kept = {s for s, keep in zip(system.states, saved) if keep}
    if not kept:
        return False
    read: set[sp.Basic] = set()
    for state, update in zip(system.states, step.new_states):
        if state in kept:
            spiking = update.has(SPIKE) or update.has(THRESHOLD)
            read |= update.free_symbols | (system.threshold.free_symbols if spiking else set())
    return system.x not in read and read & set(system.states) <= kept


def previous_membrane(system: StepSystem, h_previous: sp.Symbol) -> sp.Expr:
    """v[t-1] from h[t-1] when the threshold depends on parameters only (used by the backward kernel)."""
    spike = sp.Heaviside(h_previous - system.threshold, 1)
    return membrane_update(system).subs({SPIKE_RESET: spike, THRESHOLD: system.threshold, H: h_previous})
