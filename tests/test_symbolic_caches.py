"""The caches that spare repeated symbolic work between the kernels of one spec (bench/derive_speed.py measures it):
each gives what the uncached work gives, and the work is not done again. tests/test_golden.py proves the kernels'
texts unchanged. And the budget's stages reuse their worker threads (tests/test_security*.py check the budget)."""
from __future__ import annotations

import cmath
import dataclasses
import gc
import random
import threading
import weakref

import sympy as sp
from conftest import examples
from hypothesis import example, given, settings
from hypothesis import strategies as st
from sympy.codegen.cfunctions import expm1

from autocuda.codegen import builder
from autocuda.codegen.builder import Builder
from autocuda.codegen.dtypes import FLOAT32, FLOAT32_UNDER_HALF, FLOAT64, get_dtype
from autocuda.codegen.kernels import derivation
from autocuda.codegen.layout import Layout
from autocuda.codegen.options import KernelOptions
from autocuda.codegen.printer import CudaPrinter
from autocuda.spec import budget, derive, draws, partials, surrogate
from autocuda.spec.load import load_spec
from autocuda.spec.surrogate import Custom, Sigmoid
from autocuda.spec.system import step_system

x, y, z = sp.symbols("x y z", real=True)


def _counting_prints(monkeypatch) -> list[sp.Basic]:
    """The top-level expressions CudaPrinter prints from now on (cached ones are not printed)."""
    printed: list[sp.Basic] = []
    inner = CudaPrinter.print

    def counted(self, expr):
        if not printed or printed[-1] is not expr:
            printed.append(expr)
        return inner(self, expr)
    monkeypatch.setattr(CudaPrinter, "print", counted)
    return printed


def test_a_text_is_printed_once_per_dtype_and_names(monkeypatch):
    expr = sp.exp(x * y + 3 * z) / (x - z)
    first = CudaPrinter(FLOAT64, {x: "a", y: "b", z: "c"})(expr)
    printed = _counting_prints(monkeypatch)
    assert CudaPrinter(FLOAT64, {x: "a", y: "b", z: "c", sp.Symbol("w"): "w"})(expr) == first
    assert not printed  # the same dtype and names for its symbols: the text printed before
    other = CudaPrinter(FLOAT64, {x: "a", y: "B", z: "c"})(expr)
    assert other == first.replace("b", "B") and printed  # another name: printed again, with it


def test_dtypes_of_one_name_keep_their_own_texts():
    """float32 storage and the float arithmetic of half storage are both named float32, with their own exp."""
    expr = sp.exp(x) + 1
    assert "expf(" in CudaPrinter(FLOAT32, {x: "x"})(expr)
    assert "__expf(" in CudaPrinter(FLOAT32_UNDER_HALF, {x: "x"})(expr)
    assert "__expf(" not in CudaPrinter(FLOAT32, {x: "x"})(expr)


def test_the_detached_derivation_takes_no_partial_derivative_again(monkeypatch):
    """With and without detach_reset, the adjoint's partial derivatives are the same: taken once."""
    system = step_system(load_spec("alif"), "soft")
    without = derive.derive(system, False)
    calls = []
    inner = sp.diff
    monkeypatch.setattr(sp, "diff", lambda *args: calls.append(args) or inner(*args))
    detached = derive.derive(system, True)
    assert not calls
    assert detached.backward != without.backward  # the reset's path is cut: another adjoint


def test_kernels_of_one_derivation_hoist_and_find_draws_once(monkeypatch):
    """A second kernel of a derivation (another dtype) walks none of its expressions to hoist invariants or find
    the step's draws, and hoists the same invariants under the same names."""
    d = derivation(load_spec("noisy_cuba_lif"))
    assert draws.system_draws(d.system)  # a step that draws

    def hoisted(dtype: str) -> dict:
        b = Builder(d, KernelOptions("fptt", get_dtype(dtype)))
        b.draws()
        for e in (d.forward.charge, *d.forward.new_states):
            b.hoist(e)
        return b.invariants

    first = hoisted("float32")
    walks = []
    monkeypatch.setattr(draws, "draws_of", lambda exprs: walks.append(exprs))
    parts = builder.invariant_parts.cache_info()
    assert hoisted("float64") == first and not walks
    assert builder.invariant_parts.cache_info().misses == parts.misses


# -- the budget's stages: one worker thread runs them one after another ------------------------------------------
def test_stages_one_after_another_run_in_one_worker_thread():
    threads = [budget.bounded("<test>", "charge", threading.current_thread) for _ in range(3)]
    assert threads[0] is not threading.current_thread() and threads[0] is threads[1] is threads[2]


def test_an_idle_worker_keeps_nothing_of_its_stage():
    """A stage's work and result are freed when it ends (a layer's spec must not live on in an idle thread)."""
    class Result:
        pass

    def work(argument: Result) -> Result:
        return argument

    given = Result()
    seen = weakref.ref(given)
    assert budget.bounded("<test>", "charge", work, given) is given
    del given
    gc.collect()
    assert seen() is None


def test_stages_of_two_threads_at_once_run_in_two_workers():
    inside, release = threading.Event(), threading.Event()
    found: list[threading.Thread] = []

    def waiting() -> None:
        found.append(budget.bounded("<test>", "charge", lambda: inside.set() or release.wait(30)
                                    and threading.current_thread()))

    caller = threading.Thread(target=waiting)
    caller.start()
    try:
        assert inside.wait(30)
        other = budget.bounded("<test>", "charge", threading.current_thread)
    finally:
        release.set()
        caller.join(30)
    assert found and found[0] is not other


# -- surrogates and layouts -----------------------------------------------------------------------------------------
def test_a_surrogate_gradient_is_built_once_per_version():
    sg = Sigmoid(alpha=4.0)
    first = sg.gradient(z)
    assert sg.gradient(z) is first
    sg.alpha = 5.0  # a change forgets it
    assert sg.gradient(z) == Sigmoid(alpha=5.0).gradient(z) != first


def test_a_custom_surrogate_key_is_its_exact_text():
    one, same, other = Custom("1 / (1 + abs(a * x))", a=2.0), Custom("1 / (1 + abs(a * x))", a=2.0), \
        Custom("1 / (1 + abs(a * x))", a=3.0)
    assert one.key() == same.key() == ("Custom", sp.srepr(one.gradient(surrogate._x())), (("a", 2.0),))
    assert one == same and hash(one) == hash(same) and one != other


def test_layout_options_are_every_field():
    layout = Layout(lanes=4, vector=True, unroll=2)
    assert layout.options() == dataclasses.asdict(layout)


def test_bounds_on_numbers_compare_as_sympy_does():
    """The budget's limits on numbers and exponents, compared in integers for rationals, decide as sympy's comparison
    at and around the bounds."""
    edge = int(budget.MAX_MAGNITUDE)  # the float's exact value
    numbers = [sp.Integer(edge), sp.Integer(edge + 1), -sp.Integer(edge + 1), sp.Rational(3 * edge + 1, 3),
               sp.Rational(3 * edge - 1, 3), sp.Integer(64), sp.Integer(65), sp.Rational(129, 2), sp.Rational(-129, 2),
               sp.Rational(128, 2), sp.Float(64.5), sp.Float(64.0), sp.Float(1e31)]
    for number in numbers:
        for bound in (budget.MAX_MAGNITUDE, budget.MAX_EXPONENT, 2.5):
            assert budget._larger(number, bound) == bool(abs(number) > bound), (number, bound)


# -- partial derivatives with their large constants stood in (spec.partials) ----------------------------------------
p, q, a = sp.symbols("p q a", real=True)
# Subexpressions of the parameters alone, of more nodes than partials.STAND_IN_NODES (an exact ODE solution's kind)
_ROOT = sp.sqrt(p**2 / (q * (1 + p)) + (p / (2 * q) - 1 / (2 * p)) ** 2)
CONSTANTS = (
    sp.Piecewise((expm1(2 * q * _ROOT) / (2 * q * _ROOT), _ROOT > 0), (q * sp.exp(-p / q), True)),
    sp.exp(q * (-p / (2 * q) - _ROOT)) * sp.cos(p * _ROOT) + sp.log(1 + p**2) / (1 + q**2),
)
_LEAVES = st.sampled_from([x, y, z, a, sp.Integer(2), sp.Rational(1, 3), sp.Float(0.25), *CONSTANTS])
_UNARY = [sp.exp, sp.sin, sp.tanh, sp.Abs, lambda e: sp.Heaviside(e, 1), lambda e: e**2, lambda e: 1 / (1 + e**2)]
_BINARY = [sp.Add, sp.Mul, lambda e, f: sp.Max(e, f), lambda e, f: sp.Piecewise((e, f > 0), (f, True)),
           lambda e, f: e / (2 + f**2)]


def _expressions(children):
    return st.one_of(st.tuples(st.sampled_from(_UNARY), children).map(lambda t: _built(t[0], t[1])),
                     st.tuples(st.sampled_from(_BINARY), children, children).map(lambda t: _built(t[0], *t[1:])))


def _built(build, *args: sp.Expr) -> sp.Expr:
    """build(*args), or their sum where sympy refuses to build it: a Max or a condition of nan (a draw of the --slow
    profile made one) is not comparable."""
    try:
        return build(*args)
    except (ValueError, TypeError):
        return sp.Add(*args)


def _of_real_constants(e: sp.Expr) -> sp.Expr:
    """sympy's derivative where the constants are real, as their stand-ins are (`partials`): where sympy cannot tell a
    constant is real, it differentiates |x + c| as (x + re(c)) sign(x + c) / (x + c), which is sign(x + c) for a
    real c."""
    return e.replace(sp.re, lambda w: w).replace(sp.im, lambda w: sp.S.Zero)


@settings(deadline=None, max_examples=examples(200, 30))
@given(st.recursive(_LEAVES, _expressions, max_leaves=12), st.sampled_from([x, y, a]))
@example(sp.exp(2 * y * CONSTANTS[1]), y)
@example(sp.Abs(x + CONSTANTS[0]), x)  # sympy cannot tell the constant is real
def test_a_derivative_with_its_constants_stood_in_is_sympys(expr, u):
    """sympy's own diff (the constants are parameters' functions that the derivation's expressions hold: an exact
    ODE solution's coefficients), with the constants real (`_of_real_constants`): term for term, or where a product
    of a number and a constant that is a sum was taken apart by sympy (it distributes a number over a sum in a
    product of those two alone, and the stand-in's product holds a third factor), equal once expanded; or, where
    sympy's form keeps a constant's powers apart (|x c| differentiated as c^2 (1/c) sign(x c), each factor a
    Piecewise of its own), equal in value at random points."""
    ours, sympys = partials.derivative.__wrapped__(expr, u), _of_real_constants(sp.diff(expr, u))
    assert ours == sympys or sp.expand(ours - sympys) == 0 or _equal_in_value(ours, sympys)


def _equal_in_value(one: sp.Expr, other: sp.Expr, points: int = 4) -> bool:
    """Whether two expressions agree (to 1e-9, relatively) at random real points: x, y, z, a in [-2, 2] and the
    parameters p, q in [0.5, 2] (the constants' domain); points where either is not finite do not count, and at
    least two must."""
    generator = random.Random(7)
    compared = 0
    for _ in range(points):
        values = {s: generator.uniform(0.5, 2.0) if s in (p, q) else generator.uniform(-2.0, 2.0)
                  for s in one.free_symbols | other.free_symbols}
        first, second = (complex(e.evalf(30, subs=values)) for e in (one, other))
        if not (cmath.isfinite(first) and cmath.isfinite(second)):
            continue
        if abs(first - second) > 1e-9 * max(1.0, abs(first)):
            return False
        compared += 1
    return compared >= 2


def test_large_constants_stand_in_while_sympy_differentiates(monkeypatch):
    expr = x * CONSTANTS[0] + sp.exp(x) * CONSTANTS[1] * y
    seen = []
    inner = sp.diff
    monkeypatch.setattr(sp, "diff", lambda e, u: seen.append(e) or inner(e, u))
    assert partials.derivative.__wrapped__(expr, x) == inner(expr, x)
    assert not seen[0].has(*CONSTANTS) and len(seen) == 1
