"""Continuous dynamics -> one discrete step: the integrators behind a spec's `[ode]` table.

A spec may give dS/dt = f(S, x) for the membrane and other states instead of discrete equations. Over one step
of length dt (the parameter `time_step`) the input x, the parameters and every state *without* an ODE are held
constant; the states with an ODE are integrated together, from their values S at the start of the step:

euler              S' = S + dt f(S)                                        (any f; first order)
exponential_euler  per state u, with f_u = a u + b where a = df_u/du does not depend on u (a and b may depend on
                   the other states and x, taken at the start of the step):
                   u' = u e^{a dt} + (b / a)(e^{a dt} - 1)                  (u' = u + dt b where a = 0)
exact              f = A S + b with A free of the states (constant over the step; x may appear in b and A):
                   S' = e^{A dt} S + A^{-1}(e^{A dt} - I) b                 (the exact solution)
                   One state: u' = u e^{a dt} + (b / a)(e^{a dt} - 1). Two states, A = mu I + N with mu = tr A / 2
                   and N^2 = q I, q = ((A00 - A11)/2)^2 + A01 A10:  e^{A dt} = c0 I + c1 N with
                     q > 0:  c0 = (e^{l+ dt} + e^{l- dt}) / 2,  c1 = (e^{l+ dt} - e^{l- dt}) / (2 r),  r = sqrt(q),
                             l+- = mu +- r (the real eigenvalues)
                     q < 0:  c0 = e^{mu dt} cos(w dt),  c1 = e^{mu dt} sin(w dt) / w,  w = sqrt(-q) (oscillation)
                     q = 0:  c0 = e^{mu dt},  c1 = dt e^{mu dt}
                   Branches sympy cannot rule out become a Piecewise on the sign of q (each branch finite
                   everywhere, so gradients stay finite). A triangular A (one state does not feel the other) gives
                   e^{a dt}, e^{d dt} on the diagonal and A01 (e^{a dt} - e^{d dt}) / (a - d) off it (dt e^{a dt}
                   where a = d). The input term is adj(A)(e^{A dt} - I) b / det A (sympy's exponential of
                   [[A, b], [0, 0]] when det A = 0). Three or more states: sympy's matrix exponential (it must
                   come out real).

Automatic choice: exact when f is linear in the states with coefficients free of the states (for three or more
states only when A is triangular), else exponential_euler when each equation is linear in its own state, else
euler. `with_jump` applies an after-spike jump: u' = u_integrated + s (jump - u_integrated).
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..errors import SpecError
from ..lazy import lazy_import

sp = lazy_import("sympy")

if TYPE_CHECKING:
    from .model import NeuronSpec

__all__ = ["METHODS", "TIME_STEP", "Discretised", "check_structure", "choose_method", "discretise", "euler",
           "exponential_euler", "exact", "exp_2x2", "with_jump"]

METHODS = ("euler", "exponential_euler", "exact")
TIME_STEP = "time_step"  # `dt` is a name the generated kernels own (the time stride of CKernel2D)


@dataclass(frozen=True)
class Discretised:
    """One step of an ODE system: the method used and each state's value at the end of the step."""

    method: str
    values: Mapping[sp.Symbol, sp.Expr]


# -- structure of a spec with [ode] ------------------------------------------------------------------------------
def check_structure(spec: NeuronSpec) -> None:
    """Which state is set by what: charge or ODE for the membrane, update or ODE for the others; jumps, method
    and time step. Raises SpecError naming the field and symbol."""
    ode, updates, states = dict(spec.ode), dict(spec.updates), [s.name for s in spec.states]
    if not ode:
        if spec.method is not None:
            raise SpecError("'method' integrates [ode] dynamics; this spec has no [ode]", field="method",
                            symbol=str(spec.method))
        for name, _ in spec.jumps:
            raise SpecError("[jumps] act on states with an ODE; without [ode] write the spike's effect in "
                            "[updates] (it may use s)", field=f"jumps.{name}", symbol=name)
        return
    if spec.method is not None and spec.method not in METHODS:
        raise SpecError(f"unknown method {spec.method!r} (allowed: {', '.join(METHODS)})", field="method",
                        symbol=str(spec.method))
    for name in ode:
        if name not in states:
            raise SpecError(f"'{name}' is not a state (states: {', '.join(states)})", field=f"ode.{name}",
                            symbol=name)
        if name in updates:
            raise SpecError(f"'{name}' has both an ODE and an update; keep one (an ODE state's spike effect goes "
                            "in [jumps])", field=f"updates.{name}", symbol=name)
    if spec.membrane in ode and spec.charge:
        raise SpecError(f"the membrane '{spec.membrane}' has both 'charge' and an ODE; keep one",
                        field=f"ode.{spec.membrane}", symbol=spec.membrane)
    if spec.membrane not in ode and not spec.charge:
        raise SpecError(f"missing 'charge' (or an [ode] entry for the membrane '{spec.membrane}')", field="charge")
    _check_jumps(spec, ode)
    step = next(p for p in spec.params if p.name == TIME_STEP)
    if step.default <= 0:
        raise SpecError(f"the time step must be positive, got {step.default:g}", field=f"params.{TIME_STEP}",
                        symbol=TIME_STEP)


def _check_jumps(spec: NeuronSpec, ode: Mapping[str, str]) -> None:
    if len(dict(spec.jumps)) != len(spec.jumps):
        raise SpecError("a state jumps twice", field="jumps")
    for name, _ in spec.jumps:
        if name == spec.membrane:
            raise SpecError(f"the membrane '{name}' is reset by 'reset', not by a jump", field=f"jumps.{name}",
                            symbol=name)
        if name not in ode:
            raise SpecError(f"'{name}' has no ODE: jumps act on ODE states (an update may use s instead)",
                            field=f"jumps.{name}", symbol=name)


# -- analysis -----------------------------------------------------------------------------------------------------
def _linear_system(rhs: Mapping[sp.Symbol, sp.Expr]) -> tuple[sp.Matrix, sp.Matrix, tuple[str, str] | None]:
    """(A, b, None) with f = A S + b when A is free of the states; else (_, _, (state, variable)) naming the
    first equation whose coefficient of `variable` depends on a state."""
    states = list(rhs)
    rows = []
    for state, f in rhs.items():
        row = [sp.diff(f, u) for u in states]
        for u, coefficient in zip(states, row):
            if coefficient.free_symbols & set(states):
                return sp.Matrix(), sp.Matrix(), (state.name, u.name)
        rows.append(row)
    zero = dict.fromkeys(states, sp.Integer(0))
    return sp.Matrix(rows), sp.Matrix([f.xreplace(zero) for f in rhs.values()]), None


def _own_linear(rhs: Mapping[sp.Symbol, sp.Expr]) -> tuple[dict[sp.Symbol, tuple[sp.Expr, sp.Expr]], str | None]:
    """Per state u: (a, b) with f_u = a u + b, a free of u; or the first state whose equation is not."""
    parts = {}
    for u, f in rhs.items():
        a = sp.diff(f, u)
        if u in a.free_symbols:
            return {}, u.name
        parts[u] = (a, f.xreplace({u: sp.Integer(0)}))
    return parts, None


def _triangular(A: sp.Matrix) -> bool:
    return A.is_upper or A.is_lower


def choose_method(rhs: Mapping[sp.Symbol, sp.Expr]) -> str:
    """exact, else exponential_euler, else euler: the first one the system qualifies for (module doc)."""
    A, _, problem = _linear_system(rhs)
    if problem is None and (len(rhs) <= 2 or _triangular(A)):
        return "exact"
    return "exponential_euler" if _own_linear(rhs)[1] is None else "euler"


def discretise(rhs: Mapping[sp.Symbol, sp.Expr], dt: sp.Expr, method: str | None = None) -> Discretised:
    """One step of dS/dt = rhs with the given method (None: `choose_method`). `rhs` maps each integrated state
    symbol to its right-hand side; every other symbol is constant over the step."""
    method = method or choose_method(rhs)
    integrators = {"euler": euler, "exponential_euler": exponential_euler, "exact": exact}
    return Discretised(method, integrators[method](rhs, dt))


# -- integrators ----------------------------------------------------------------------------------------------------
def euler(rhs: Mapping[sp.Symbol, sp.Expr], dt: sp.Expr) -> dict[sp.Symbol, sp.Expr]:
    """S' = S + dt f(S)."""
    return {u: u + dt * f for u, f in rhs.items()}


def _exponential(u: sp.Expr, a: sp.Expr, b: sp.Expr, dt: sp.Expr) -> sp.Expr:
    """The solution at dt of du/dt = a u + b (a, b constant) from u."""
    if a == 0:
        return u + dt * b
    decay = sp.exp(a * dt)
    return u * decay + b / a * (decay - 1)


def exponential_euler(rhs: Mapping[sp.Symbol, sp.Expr], dt: sp.Expr) -> dict[sp.Symbol, sp.Expr]:
    """Per state u: f_u = a u + b with a, b frozen at the start of the step, solved exactly over dt."""
    parts, problem = _own_linear(rhs)
    if problem is not None:
        raise SpecError(f"method 'exponential_euler' needs each equation linear in its own state; the ODE of "
                        f"'{problem}' is not linear in '{problem}' (use method = \"euler\")",
                        field=f"ode.{problem}", symbol=problem)
    return {u: _exponential(u, a, b, dt) for u, (a, b) in parts.items()}


def exact(rhs: Mapping[sp.Symbol, sp.Expr], dt: sp.Expr) -> dict[sp.Symbol, sp.Expr]:
    """S' = e^{A dt} S + A^{-1}(e^{A dt} - I) b for f = A S + b, A free of the states (module doc)."""
    A, b, problem = _linear_system(rhs)
    if problem is not None:
        state, variable = problem
        raise SpecError(f"method 'exact' needs dynamics linear in the states with coefficients constant over "
                        f"the step; in the ODE of '{state}' the coefficient of '{variable}' depends on the states",
                        field=f"ode.{state}", symbol=variable)
    S = sp.Matrix(list(rhs))
    if len(rhs) == 1:
        return {S[0]: _exponential(S[0], A[0, 0], b[0], dt)}
    if len(rhs) == 2:
        new = _exact_2x2(A, b, S, dt)
    else:
        new = _exact_sympy(A, b, S, dt)
    return dict(zip(S, new))


def _square(q: sp.Expr) -> tuple[sp.Expr, sp.Expr] | None:
    """(c, b) with q = c b^2 for a number c, when q has that form (so its sign is the sign of c)."""
    c, rest = q.as_coeff_Mul()
    base, exponent = rest.as_base_exp()
    if exponent.is_Integer and exponent.is_even and c != 0:
        return c, base ** (exponent / 2)
    return None


def _roots(q: sp.Expr, condition: sp.Basic) -> tuple[sp.Expr, sp.Expr]:
    """sqrt(q) twice: to use in values, and to divide by. The branches use even functions of the root only, so
    a perfect square's root is signed (no Abs) and finite everywhere; other roots, and every divisor, are guarded
    to 1 where `condition` fails, so that each branch is finite (with finite gradients) everywhere."""
    square = _square(q)
    if square is not None:
        root = sp.sqrt(square[0]) * square[1]
    else:
        root = sp.Mul(*(f.args[0] if isinstance(f, sp.Abs) else f for f in sp.Mul.make_args(sp.sqrt(q))))
    safe = root if condition is sp.true else sp.Piecewise((root, condition), (1, True))
    return (root if square is not None else safe), safe


def _signs(q: sp.Expr) -> tuple[bool, bool, bool]:
    """Whether q may be positive, negative, zero (real parameters; perfect squares are recognised)."""
    square = _square(q)
    if square is not None:
        return bool(square[0] > 0), bool(square[0] < 0), True
    return q.is_nonpositive is not True, q.is_nonnegative is not True, q.is_nonzero is not True


def exp_2x2(A: sp.Matrix, dt: sp.Expr) -> tuple[sp.Expr, sp.Expr, sp.Expr, sp.Expr, sp.Matrix]:
    """e^{A dt} = c0 I + c1 N for a 2x2 A: returns (c0, c1, mu, q, N) (module doc)."""
    mu = sp.expand((A[0, 0] + A[1, 1]) / 2)
    N = (A - mu * sp.eye(2)).applyfunc(sp.expand)
    q = N[0, 0] ** 2 + N[0, 1] * N[1, 0]  # not expanded: a square stays recognisable
    positive, negative, zero = _signs(q)
    growth, branches = sp.exp(mu * dt), []
    if positive:
        r, r_safe = _roots(q, q > 0 if negative or zero else sp.true)
        combine = sp.expand if not r.has(sp.Piecewise) else sp.Add  # a square's root cancels against mu
        high, low = sp.exp(combine(mu + r) * dt), sp.exp(combine(mu - r) * dt)  # the two eigenvalues
        branches.append(((high + low) / 2, (high - low) / (2 * r_safe), q > 0))
    if negative:
        w, w_safe = _roots(-q, q < 0 if positive or zero else sp.true)
        branches.append((growth * sp.cos(w * dt), growth * sp.sin(w * dt) / w_safe, q < 0))
    if zero:
        branches.append((growth, dt * growth, sp.true))
    if len(branches) == 1:
        return branches[0][0], branches[0][1], mu, q, N
    branches[-1] = (*branches[-1][:2], sp.true)
    c0 = sp.Piecewise(*((c, cond) for c, _, cond in branches))
    c1 = sp.Piecewise(*((c, cond) for _, c, cond in branches))
    return c0, c1, mu, q, N


def _exp_triangular_2x2(A: sp.Matrix, dt: sp.Expr) -> sp.Matrix:
    """e^{A dt} for a triangular 2x2 A: e^{a dt}, e^{d dt} on the diagonal, the coupling times
    (e^{a dt} - e^{d dt}) / (a - d) off it (dt e^{a dt} where a = d)."""
    a, d = A[0, 0], A[1, 1]
    ea, ed = sp.exp(a * dt), sp.exp(d * dt)
    gap = sp.expand(a - d)
    distinct = gap**2 > 0
    if gap == 0:
        phi = dt * ea
    elif distinct is sp.true:
        phi = (ea - ed) / gap
    else:
        phi = sp.Piecewise(((ea - ed) / sp.Piecewise((gap, distinct), (1, True)), distinct), (dt * ea, True))
    return sp.Matrix([[ea, A[0, 1] * phi], [A[1, 0] * phi, ed]])


def _exact_2x2(A: sp.Matrix, b: sp.Matrix, S: sp.Matrix, dt: sp.Expr) -> sp.Matrix:
    if A[0, 1] == 0 or A[1, 0] == 0:
        E = _exp_triangular_2x2(A, dt)
    else:
        c0, c1, _, _, N = exp_2x2(A, dt)
        E = c0 * sp.eye(2) + c1 * N
    if b.is_zero_matrix:
        return E * S
    det = sp.expand(A.det())
    if det == 0:
        return _exact_sympy(A, b, S, dt)
    return E * S + A.adjugate() * (E - sp.eye(2)) * b / det


def _exact_sympy(A: sp.Matrix, b: sp.Matrix, S: sp.Matrix, dt: sp.Expr) -> sp.Matrix:
    """Three or more states, or a singular A: sympy's matrix exponential (of [[A, b], [0, 0]] when A is
    singular, so that the input term needs no inverse)."""
    n = A.shape[0]
    if A.det() != 0:
        E = _real((A * dt).exp())
        return E * S + A.inv() * (E - sp.eye(n)) * b
    M = sp.zeros(n + 1, n + 1)
    M[:n, :n], M[:n, n] = A, b
    E = _real((M * dt).exp())
    return E[:n, :n] * S + E[:n, n]


def _real(E: sp.Matrix) -> sp.Matrix:
    E = E.applyfunc(lambda entry: entry.rewrite(sp.exp))
    if E.has(sp.I, sp.nan, sp.zoo):
        raise SpecError("the exact solution of this linear system is not a real closed form sympy can give; "
                        "use method = \"exponential_euler\"", field="method", symbol="exact")
    return E


def with_jump(integrated: sp.Expr, jump: sp.Expr, spike: sp.Expr) -> sp.Expr:
    """The state after an optional jump: the jump's value where the neuron spiked (s = 1), else unchanged."""
    return integrated + spike * (jump - integrated)
