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
                     q = 0:  c0 = e^{mu dt} (1 + q dt^2 / 2),  c1 = dt e^{mu dt} (1 + q dt^2 / 6)  (the others' value
                             and slope at q = 0; e^{mu dt} and dt e^{mu dt} where q = c b^2, whose slope is 0 there)
                   Branches sympy cannot rule out become a Piecewise on the sign of q (each branch finite
                   everywhere, so gradients stay finite). A triangular A (one state does not feel the other) gives
                   e^{a dt}, e^{d dt} on the diagonal and A01 (e^{a dt} - e^{d dt}) / (a - d) off it (dt e^{a dt}
                   where a = d). The input term is adj(A)(e^{A dt} - I) b / det A (sympy's exponential of
                   [[A, b], [0, 0]] when det A = 0). Three triangular states: along each path of couplings the
                   divided difference of e^{z dt} over the path's rates, guarded where rates coincide
                   (`_exp_triangular_3x3`); a singular A: sympy's matrix exponential (it must come out real).

Rounding: e^{a dt} - 1 and the quotients (e^{a dt} - 1)/a, (e^{a dt} - e^{d dt})/(a - d), (e^{l+ dt} - e^{l- dt})/(2r)
cancel for small a dt, nearly equal a and d, small r; they are built from expm1 (`_exp_integral`, `_exp_2x2`), so
the float32 step keeps float32's digits (docs/ode.md, Rounding). Where a rate may be 0 at run time, its quotient
is guarded to the limit (dt): exponential Euler gives u + dt b there too.

Linear means linear everywhere: a state in a condition of a `where` (`_switches`) makes f piecewise in it, though
its derivative by that state is 0 wherever it exists. A coupled 2x2 A holding a `where` of x or parameters is
integrated once per branch of it (`_branched_coefficient`).

Automatic choice: exact when f is linear in the states with coefficients free of the states (for three or more
states only when A is diagonal, or triangular in some order of the states with at most MAX_EXACT_STATES states),
else exponential_euler when each equation is linear in its own state, else euler. `exact` asked of a larger coupled
system integrates with exponential_euler and warns (`discretise`).
`with_jump` applies an after-spike jump: u' = u_integrated + s (jump - u_integrated).
"""
from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ..base.errors import SpecError
from ..base.lazy import lazy_import

if TYPE_CHECKING:
    import sympy as sp
else:
    sp = lazy_import("sympy")

__all__ = ["METHODS", "TIME_STEP", "Discretised", "choose_method", "discretise", "euler",
           "exponential_euler", "exact", "exp_2x2", "with_jump"]

METHODS = ("euler", "exponential_euler", "exact")
MAX_EXACT_STATES = 3  # coupled (triangular) states whose exact step sympy builds in well under a second
TIME_STEP = "time_step"  # `dt` is a name the generated kernels own (the time stride of CKernel2D)


@dataclass(frozen=True)
class Discretised:
    """One step of an ODE system: the method used and each state's value at the end of the step."""

    method: str
    values: Mapping[sp.Symbol, sp.Expr]
    note: str | None = None  # why the method differs from the one asked for


# -- analysis -----------------------------------------------------------------------------------------------------
def _switches(f: sp.Expr) -> set[sp.Symbol]:
    """The symbols that choose a branch of f (those in the conditions of its `where`s). f is piecewise in them,
    not linear, though its derivative by them may be 0 wherever it exists: `where(v > 1, -1, 0)` by v."""
    return {z for p in f.atoms(sp.Piecewise) for _, condition in p.args for z in condition.free_symbols}


def _linear_system(rhs: Mapping[sp.Symbol, sp.Expr]
                   ) -> tuple[sp.Matrix, sp.Matrix, tuple[str, str, str] | None]:
    """(A, b, None) with f = A S + b when A is free of the states and no state chooses a branch; else
    (_, _, (state, variable, why)) naming the first equation that is not linear in `variable`, and why."""
    states = list(rhs)
    rows = []
    for state, f in rhs.items():
        switching = [u for u in states if u in _switches(f)]
        if switching:
            return sp.Matrix(), sp.Matrix(), (state.name, switching[0].name,
                                              f"'{switching[0].name}' chooses a branch of a where(...)")
        row = [sp.diff(f, u) for u in states]
        for u, coefficient in zip(states, row):
            if coefficient.free_symbols & set(states):
                return sp.Matrix(), sp.Matrix(), (state.name, u.name,
                                                  f"the coefficient of '{u.name}' depends on the states")
        rows.append(row)
    zero = dict.fromkeys(states, sp.Integer(0))
    return sp.Matrix(rows), sp.Matrix([f.xreplace(zero) for f in rhs.values()]), None


def _own_linear(rhs: Mapping[sp.Symbol, sp.Expr]) -> tuple[dict[sp.Symbol, tuple[sp.Expr, sp.Expr]], str | None]:
    """Per state u: (a, b) with f_u = a u + b, a free of u and u choosing no branch of f_u; or the first state
    whose equation is not."""
    parts = {}
    for u, f in rhs.items():
        a = sp.diff(f, u)
        if u in a.free_symbols or u in _switches(f):
            return {}, u.name
        parts[u] = (a, f.xreplace({u: sp.Integer(0)}))
    return parts, None


def _triangular_order(A: sp.Matrix) -> list[int] | None:
    """An order of the states (their indices) in which A is triangular, the given one where it is; None where none
    is. A state's equation that reads another state only one way round makes A triangular in some order, however the
    [ode] table lists the states."""
    n = A.shape[0]
    if A.is_upper or A.is_lower:
        return list(range(n))
    return next((list(order) for order in itertools.permutations(range(n))
                 if A.extract(list(order), list(order)).is_upper), None)


def _exact_in_closed_form(A: sp.Matrix) -> bool:
    """Whether `exact` builds e^{A dt} here: up to two states, a diagonal A (uncoupled states), or a triangular
    A of at most MAX_EXACT_STATES states. sympy's matrix exponential of a larger or fuller A grows
    combinatorially in size and time (minutes at seven triangular or three coupled states)."""
    n = A.shape[0]
    return n <= 2 or A.is_diagonal() or (n <= MAX_EXACT_STATES and _triangular_order(A) is not None)


def choose_method(rhs: Mapping[sp.Symbol, sp.Expr]) -> str:
    """exact, else exponential_euler, else euler: the first one the system qualifies for (module doc)."""
    A, _, problem = _linear_system(rhs)
    if problem is None and _exact_in_closed_form(A):
        return "exact"
    return "exponential_euler" if _own_linear(rhs)[1] is None else "euler"


def discretise(rhs: Mapping[sp.Symbol, sp.Expr], dt: sp.Expr, method: str | None = None) -> Discretised:
    """One step of dS/dt = rhs with the given method (None: `choose_method`). `rhs` maps each integrated state
    symbol to its right-hand side; every other symbol is constant over the step. `exact` asked of a linear
    system it cannot solve in closed form (`_exact_in_closed_form`) integrates with exponential_euler instead,
    and says so in the result's `note`."""
    method, note = method or choose_method(rhs), None
    if method == "exact":
        A, _, problem = _linear_system(rhs)
        if problem is None and not _exact_in_closed_form(A):
            method = "exponential_euler"
            note = (f"the exact solution of {A.shape[0]} coupled linear states has no closed form of bounded size "
                    f"(at most {MAX_EXACT_STATES} triangular or any number of uncoupled states); integrated with "
                    "exponential_euler instead")
        elif problem is None and len(rhs) > 2:  # sympy's exponential of A, triangular in the order given to it
            order, states = _triangular_order(A), list(rhs)
            rhs = {states[i]: rhs[states[i]] for i in order} if order is not None else rhs
    integrators = {"euler": euler, "exponential_euler": exponential_euler, "exact": exact}
    return Discretised(method, integrators[method](rhs, dt), note)


# -- e^z - 1 without cancellation ---------------------------------------------------------------------------------
def _expm1(z: sp.Expr) -> sp.Expr:
    """e^z - 1 as one function. Written exp(z) - 1 it has a relative error of eps / |z| for small z (1e-3 in
    float32 at z = 6e-5); expm1 is accurate to eps. sympy's codegen expm1 differentiates to exp, and expand, cse
    and subs leave it alone; the printers spell it expm1f / expm1, torch_eval torch.expm1."""
    from sympy.codegen.cfunctions import expm1  # here, not at the top: this module imports sympy lazily

    return expm1(z)


def _exprel(z: sp.Expr) -> sp.Expr:
    """(e^z - 1)/z, 1 at z = 0. Numerator and denominator are the same z, so an error in z itself (z a difference
    of nearly equal rates, say) moves the result only by z/2 times that error. Where z may be 0 the division is
    guarded (each branch finite everywhere, and so are its derivatives) and 1 + z/2 takes over: the value and the
    slope at 0, so gradients there are right too."""
    nonzero = z**2 > 0
    if nonzero is sp.true:
        return _expm1(z) / z
    if nonzero is sp.false:
        return sp.Integer(1)
    # z + (0 or 1), not Piecewise((z, nonzero), (1, True)): sympy moves a power into a Piecewise's branches, which
    # would bring back 1/z (inf at 0, and a NaN gradient through torch.where in the reference's autograd).
    safe = z + sp.Piecewise((0, nonzero), (1, True))
    return sp.Piecewise((_expm1(z) / safe, nonzero), (1 + z / 2, True))


def _exp_integral(rate: sp.Expr, dt: sp.Expr) -> sp.Expr:
    """The integral of e^{rate s} over [0, dt]: (e^{rate dt} - 1)/rate, and dt where rate = 0.

    A single term known to be nonzero (-1/tau): expm1(rate dt)/rate. Any other rate, which may vanish or be a sum
    that cancels (a - d for nearly equal a, d): dt exprel(z) with z = rate dt, guarded where z = 0 (rate 0, or a
    runtime time step of 0). A rate with branches (`where`, a guarded root) gets one integral per branch: a guard
    on the branched rate would be a condition holding a Piecewise, which sympy turns into an ITE the printers do
    not know."""
    rate = sp.piecewise_fold(rate)
    if isinstance(rate, sp.Piecewise):
        return sp.Piecewise(*((_exp_integral(value, dt), condition) for value, condition in rate.args))
    if rate == 0:
        return dt
    if rate.is_zero is False and not rate.is_Add:
        return _expm1(rate * dt) / rate
    # z expanded: a sum whose every term carries dt, so that a constant time step folded in later changes z alike
    # in all its uses. Unexpanded, 1/(dt (p - q)) splits into (1/dt) (1/(p - q)) while the 0.1 in e^{0.1 (p - q)}
    # is multiplied into each term, and the two copies of z would round apart by eps |p| / |p - q|.
    return dt * _exprel(sp.expand_mul(rate * dt))


# -- integrators ----------------------------------------------------------------------------------------------------
def euler(rhs: Mapping[sp.Symbol, sp.Expr], dt: sp.Expr) -> dict[sp.Symbol, sp.Expr]:
    """S' = S + dt f(S)."""
    return {u: u + dt * f for u, f in rhs.items()}


def _exponential(u: sp.Expr, a: sp.Expr, b: sp.Expr, dt: sp.Expr) -> sp.Expr:
    """The solution at dt of du/dt = a u + b (a, b constant) from u: u e^{a dt} + b (e^{a dt} - 1)/a."""
    return u * sp.exp(a * dt) + b * _exp_integral(a, dt)


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
        state, variable, why = problem
        raise SpecError(f"method 'exact' needs dynamics linear in the states with coefficients constant over "
                        f"the step; in the ODE of '{state}' {why}", field=f"ode.{state}", symbol=variable)
    S = sp.Matrix(list(rhs))
    if len(rhs) == 1:
        return {S[0]: _exponential(S[0], A[0, 0], b[0], dt)}
    if len(rhs) == 2:
        coupled = A[0, 1] != 0 and A[1, 0] != 0
        branched = _branched_coefficient(rhs, A) if coupled else None
        if branched is not None:  # one exact step per branch of that `where` (`_branched_coefficient`)
            steps = [(exact({u: f.xreplace({branched: value}) for u, f in rhs.items()}, dt), condition)
                     for value, condition in branched.args]
            return {u: sp.Piecewise(*((step[u], condition) for step, condition in steps)) for u in S}
        new = _exact_2x2(A, b, S, dt)
    elif A.is_diagonal():  # uncoupled: each state's own exponential step
        return {u: _exponential(u, A[i, i], b[i], dt) for i, u in enumerate(S)}
    else:
        triangular = _exp_triangular_3x3(A, dt) if A.det() != 0 else None
        if triangular is None:
            new = _exact_sympy(A, b, S, dt)
        else:
            E, E_minus_I = triangular
            new = E * S + A.inv() * E_minus_I * b if not b.is_zero_matrix else E * S
    return dict(zip(S, new))


def _branched_coefficient(rhs: Mapping[sp.Symbol, sp.Expr], A: sp.Matrix) -> sp.Piecewise | None:
    """A `where` (of x or parameters) that a coefficient of A depends on, or that holds a state; None if none.
    The coupled 2x2 step branches on the sign of q, a function of A: with a Piecewise inside q, sympy rewrites the
    condition q > 0 as And / Or / ITE of the inner conditions, which the printers do not know. So such a system is
    integrated once per branch of the `where`, each branch's A free of it."""
    states = set(rhs)
    found = [p for f in rhs.values() for p in f.atoms(sp.Piecewise)
             if p.free_symbols & states or any(entry.has(p) for entry in A)]
    return next(iter(sp.ordered(found)), None)


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
    to 1 where `condition` (q > 0) fails, so that each branch is finite (with finite gradients) everywhere. A root
    is guarded inside, sqrt(|q| + where(condition, 0, 1)) (sympy moves a power of a Piecewise into its branches):
    guarded outside, the root of a q of the wrong sign is NaN, and the torch reference's autograd, which
    differentiates the branches not taken too, multiplies its NaN slope by 0."""
    square = _square(q)
    if square is not None:
        root = sp.sqrt(square[0]) * square[1]
    elif condition is sp.true:
        root = sp.Mul(*(f.args[0] if isinstance(f, sp.Abs) else f for f in sp.Mul.make_args(sp.sqrt(q))))
    else:
        root = sp.sqrt(sp.Abs(q) + sp.Piecewise((0, condition), (1, True)))
    safe = root if condition is sp.true or square is None else sp.Piecewise((root, condition), (1, True))
    return root, safe


def _signs(q: sp.Expr) -> tuple[bool, bool, bool]:
    """Whether q may be positive, negative, zero (real parameters; perfect squares are recognised)."""
    square = _square(q)
    if square is not None:
        return bool(square[0] > 0), bool(square[0] < 0), True
    return q.is_nonpositive is not True, q.is_nonnegative is not True, q.is_nonzero is not True


def exp_2x2(A: sp.Matrix, dt: sp.Expr) -> tuple[sp.Expr, sp.Expr, sp.Expr, sp.Expr, sp.Matrix]:
    """e^{A dt} = c0 I + c1 N for a 2x2 A: returns (c0, c1, mu, q, N) (module doc)."""
    c0, _, c1, mu, q, N = _exp_2x2(A, dt)
    return c0, c1, mu, q, N


def _exp_2x2(A: sp.Matrix, dt: sp.Expr) -> tuple[sp.Expr, sp.Expr, sp.Expr, sp.Expr, sp.Expr, sp.Matrix]:
    """(c0, c0 - 1, c1, mu, q, N) with e^{A dt} = c0 I + c1 N. c0 - 1 (for e^{A dt} - I) and c1 are written so
    that nothing cancels where A dt is small or the eigenvalues nearly coincide: with l+- = mu +- r,
    c0 - 1 = (expm1(l+ dt) + expm1(l- dt))/2 and c1 = e^{l- dt} (e^{2 r dt} - 1)/(2 r) (`_exp_integral`); in the
    oscillating case c0 - 1 = expm1(mu dt) - 2 e^{mu dt} sin(w dt/2)^2."""
    mu = sp.expand((A[0, 0] + A[1, 1]) / 2)
    N = (A - mu * sp.eye(2)).applyfunc(sp.expand)
    q = N[0, 0] ** 2 + N[0, 1] * N[1, 0]  # not expanded: a square stays recognisable
    positive, negative, zero = _signs(q)
    growth, branches = sp.exp(mu * dt), []
    if positive:
        condition = q > 0 if negative or zero else sp.true
        r, r_safe = _roots(q, condition)
        combine = sp.expand if not r.has(sp.Piecewise) else sp.Add  # a square's root cancels against mu
        high, low = combine(mu + r) * dt, combine(mu - r) * dt  # the two eigenvalues, times dt
        # (e^{2 r dt} - 1)/(2 r): a guarded root is never 0 (1 where q <= 0); `_exp_integral` guards the others
        # (and would split a guarded root into a branch per side, its root unguarded again)
        spread = _expm1(2 * r * dt) / (2 * r_safe) if condition is not sp.true and _square(q) is None \
            else _exp_integral(2 * r, dt)
        branches.append(((sp.exp(high) + sp.exp(low)) / 2, (_expm1(high) + _expm1(low)) / 2,
                         sp.exp(low) * spread, q > 0))
    if negative:
        w, w_safe = _roots(-q, q < 0 if positive or zero else sp.true)
        branches.append((growth * sp.cos(w * dt), _expm1(mu * dt) - 2 * growth * sp.sin(w * dt / 2) ** 2,
                         growth * sp.sin(w * dt) / w_safe, q < 0))
    if zero and _square(q) is None:  # the other branches' series to first order in q: value and slope at q = 0
        bend = growth * q * dt**2 / 2
        branches.append((growth + bend, _expm1(mu * dt) + bend, dt * growth * (1 + q * dt**2 / 6), sp.true))
    elif zero:  # q = c b^2: its slope is 0 where it is 0
        branches.append((growth, _expm1(mu * dt), dt * growth, sp.true))
    if len(branches) == 1:
        return (*branches[0][:3], mu, q, N)
    branches[-1] = (*branches[-1][:3], sp.true)
    c0, c0_minus_one, c1 = (sp.Piecewise(*((branch[k], branch[3]) for branch in branches)) for k in range(3))
    return c0, c0_minus_one, c1, mu, q, N


def _exp_triangular_2x2(A: sp.Matrix, dt: sp.Expr) -> tuple[sp.Matrix, sp.Matrix]:
    """e^{A dt} and e^{A dt} - I for a triangular 2x2 A: e^{a dt}, e^{d dt} on the diagonal (expm1 of their
    exponents in e^{A dt} - I), the coupling times phi = (e^{a dt} - e^{d dt})/(a - d) off it. phi is computed as
    e^{a dt} (e^{(d - a) dt} - 1)/(d - a) from the larger rate a (or its mirror) by `_divided_difference_2` (dt e^{a dt}
    where a = d): as a difference of two nearly equal exponentials it had a relative error of eps / |(a - d) dt|."""
    a, d = A[0, 0], A[1, 1]
    ea, ed = sp.exp(a * dt), sp.exp(d * dt)
    phi = _divided_difference([a, d], dt)
    coupling = [A[0, 1] * phi, A[1, 0] * phi]
    E = sp.Matrix([[ea, coupling[0]], [coupling[1], ed]])
    return E, sp.Matrix([[_expm1(a * dt), coupling[0]], [coupling[1], _expm1(d * dt)]])


def _exact_2x2(A: sp.Matrix, b: sp.Matrix, S: sp.Matrix, dt: sp.Expr) -> sp.Matrix:
    if A[0, 1] == 0 or A[1, 0] == 0:
        E, E_minus_I = _exp_triangular_2x2(A, dt)
    else:
        c0, c0_minus_one, c1, _, _, N = _exp_2x2(A, dt)
        E, E_minus_I = c0 * sp.eye(2) + c1 * N, c0_minus_one * sp.eye(2) + c1 * N
    if b.is_zero_matrix:
        return E * S
    det = sp.expand(A.det())
    if det == 0:
        return _exact_sympy(A, b, S, dt)
    return E * S + A.adjugate() * E_minus_I * b / det


def _exp_triangular_3x3(A: sp.Matrix, dt: sp.Expr) -> tuple[sp.Matrix, sp.Matrix] | None:
    """e^{A dt} and e^{A dt} - I for a triangular 3x3 A, or None (not triangular, or a diagonal with a `where`).
    Along each path i < k < j of an upper A the entry gathers the couplings times the divided difference of e^{z dt}
    over the path's rates: A01 f[a, b] and A12 f[b, c] next to the diagonal, A02 f[a, c] + A01 A12 f[a, b, c] in the
    corner (a lower A is the transpose's). sympy's exponential divides by the rates' differences, 0/0 (NaN) where
    two time constants are equal at run time; these are guarded there (`_divided_difference`)."""
    if A.is_lower and not A.is_upper:
        found = _exp_triangular_3x3(A.T, dt)
        return None if found is None else (found[0].T, found[1].T)
    if A.shape != (3, 3) or not A.is_upper or any(A[i, i].has(sp.Piecewise) for i in range(3)):
        return None
    rates = [A[i, i] for i in range(3)]

    def f(*at: int) -> sp.Expr:
        return _divided_difference([rates[i] for i in at], dt)
    corner = A[0, 2] * f(0, 2) + A[0, 1] * A[1, 2] * f(0, 1, 2)
    upper = [[0, A[0, 1] * f(0, 1), corner], [0, 0, A[1, 2] * f(1, 2)], [0, 0, 0]]
    E = sp.Matrix(3, 3, lambda i, j: sp.exp(rates[i] * dt) if i == j else upper[i][j])
    E_minus_I = sp.Matrix(3, 3, lambda i, j: _expm1(rates[i] * dt) if i == j else upper[i][j])
    return E, E_minus_I


def _divided_difference_2(a: sp.Expr, b: sp.Expr, dt: sp.Expr) -> sp.Expr:
    """f[a, b] = (e^{a dt} - e^{b dt})/(a - b), factored from the larger rate: e^{a dt} dt exprel((b - a) dt) where
    (a - b) dt > 0, its mirror where < 0, dt e^{b dt} (1 + (a - b) dt/2) where a = b or dt = 0 (value and slopes).
    Factored from the smaller one, e^{(a - b) dt} - 1 overflows where e^{b dt} underflows (a fast synapse beside a
    slow membrane: inf * 0, NaN). Each branch is finite everywhere, with finite derivatives (the reference's
    torch.where passes a NaN of a branch it does not take into gradients): outside its region its exponent is -1,
    through a sum (sympy would move the power of 1/exponent into the branches of a Piecewise)."""
    difference = sp.expand(a - b)
    if difference == 0:
        return dt * sp.exp(a * dt)
    z = sp.expand(difference * dt)  # its sign, not the rates': a run-time dt of 0 takes the third branch too
    above, below = z > 0, z < 0

    def branch(u: sp.Expr, z: sp.Expr, region: sp.Basic) -> sp.Expr:
        if region is not sp.true:
            z = z * sp.Piecewise((1, region), (0, True)) + sp.Piecewise((0, region), (-1, True))
        return sp.exp(u * dt) * dt * _expm1(z) / z
    if above is sp.true:
        return branch(a, -z, sp.true)
    if below is sp.true:
        return branch(b, z, sp.true)
    return sp.Piecewise((branch(a, -z, above), above), (branch(b, z, below), below),
                        (dt * sp.exp(b * dt) * (1 + difference * dt / 2), True))


def _divided_difference(rates: list[sp.Expr], dt: sp.Expr) -> sp.Expr:
    """The divided difference of e^{z dt} over two or three rates, finite (with finite derivatives) where rates
    coincide: f[a, b] = (e^{a dt} - e^{b dt})/(a - b) factored from the larger rate (`_divided_difference_2`), and
    f[a, b, c] = dt^2 e^{c dt} g(u, v), u = (a - c) dt, v = (b - c) dt, g(u, v) = (exprel(u) - exprel(v))/(u - v),
    which at u = v is exprel' at their mean w (value and both slopes; 1/2 + w/3 at w = 0). Near a coincidence the
    differences cancel as sympy's own formula does."""
    if len(rates) == 2:
        return _divided_difference_2(rates[0], rates[1], dt)
    a, b, c = rates
    u, v = sp.expand((a - c) * dt), sp.expand((b - c) * dt)
    w = (u + v) / 2
    slope_nonzero = w**2 > 0
    slope = (w * sp.exp(w) - _expm1(w)) / (w**2 + sp.Piecewise((0, slope_nonzero), (1, True)))
    if slope_nonzero is not sp.true:
        slope = sp.Piecewise((slope, slope_nonzero), (sp.Rational(1, 2) + w / 3, True))
    apart = (u - v)**2 > 0
    spread = (_exprel(u) - _exprel(v)) / (u - v + sp.Piecewise((0, apart), (1, True)))
    g = spread if apart is sp.true else slope if apart is sp.false else sp.Piecewise((spread, apart), (slope, True))
    return dt**2 * sp.exp(c * dt) * g


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
