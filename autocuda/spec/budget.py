"""Bounds on the symbolic work a spec may cause: what sympy is asked to evaluate, and for how long.

A spec is untrusted text, and sympy evaluates eagerly: `(2*v)**(10**29)` or `exp(10**29*log(2))` would build an
integer of 10**29 bits inside one C call that nothing can interrupt. So two kinds of bound apply:

- limits checked *before* sympy evaluates (`check_exponent`) or on every expression built (`check_size`):
  numeric exponents of at most MAX_EXPONENT, numbers of magnitude at most MAX_MAGNITUDE, expressions of at most
  MAX_NODES nodes;
- a wall-clock budget (`symbolic_budget`, default DEFAULT_SECONDS, `AUTOCUDA_SYMBOLIC_BUDGET` seconds) on each
  stage that runs sympy (parse, step system, derivation, kernel rendering). Past it, the stage is interrupted and
  the spec refused with a SpecError naming the field being worked on and the limit. Stack exhaustion in sympy's
  recursive algorithms is refused the same way.

The interruption is an asynchronous exception raised in the working thread by a timer thread: it lands between
two Python bytecodes, which is why the C-level evaluations above are refused beforehand instead.
"""
from __future__ import annotations

import contextlib
import ctypes
import math
import os
import threading
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from ..errors import SpecError

if TYPE_CHECKING:
    import sympy

__all__ = ["MAX_EXPONENT", "MAX_MAGNITUDE", "MAX_NODES", "DEFAULT_SECONDS", "budget_seconds", "check_exponent",
           "check_node", "check_size", "exp_problem", "substituted", "symbolic_budget", "working_on"]

MAX_EXPONENT = 64        # a neuron equation raises to small powers; larger ones only serve to blow sympy up
MAX_MAGNITUDE = 1e30     # numbers beyond it are typos or attacks, and overflow float16/bfloat16/float32 anyway
MAX_NODES = 20_000       # sympy nodes in one expression after derived values are substituted
DEFAULT_SECONDS = 10.0
BUDGET_VARIABLE = "AUTOCUDA_SYMBOLIC_BUDGET"


def budget_seconds() -> float:
    """The wall-clock budget of one symbolic stage: $AUTOCUDA_SYMBOLIC_BUDGET seconds, else DEFAULT_SECONDS."""
    text = os.environ.get(BUDGET_VARIABLE, "").strip()
    if not text:
        return DEFAULT_SECONDS
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):
        raise ValueError(f"{BUDGET_VARIABLE}={text!r}: expected a positive number of seconds")
    return seconds


# -- limits checked before sympy evaluates ----------------------------------------------------------------------
def check_exponent(exponent: sympy.Expr) -> str | None:
    """Why a power with this exponent may not be built, or None. Only numeric exponents are bounded: a symbolic
    one stays symbolic until a number replaces it, and the result is checked then."""
    if exponent.is_Number and abs(exponent) > MAX_EXPONENT:
        return f"exponent {_short(exponent)} is larger than {MAX_EXPONENT} in magnitude"
    return None


def exp_problem(argument: sympy.Expr) -> str | None:
    """Why exp(argument) may not be built, or None: sympy turns exp(c*log(b)) into b**c."""
    import sympy

    coefficient = argument.as_coeff_Mul()[0]
    if argument.has(sympy.log) and abs(coefficient) > MAX_EXPONENT:
        return f"exp of {_short(coefficient)} times a logarithm is a power larger than {MAX_EXPONENT}"
    return None


def check_size(expr: sympy.Basic, bound_floats: bool = True) -> str | None:
    """Why a built expression is out of bounds, or None: too many nodes, or a node `check_node` refuses
    (substitution can create one: `b = a**8` with `a = c**16`). `bound_floats=False` bounds only exact numbers,
    whose cost grows with their size (a float costs the same at any magnitude; whether a kernel's dtype can hold
    it is decided where it is printed)."""
    stack, seen = [expr], 0
    while stack:
        node = stack.pop()
        seen += 1
        if seen > MAX_NODES:
            return f"the expression has more than {MAX_NODES} terms and factors"
        problem = _node_problem(node, bound_floats)
        if problem:
            return problem
        stack.extend(node.args)
    return None


def substituted(expr: sympy.Expr, values: Mapping[sympy.Basic, sympy.Expr], *, source: str, field: str,
                what: str) -> sympy.Expr:
    """`expr` with `values` put in (sympy evaluates as it goes), refused with a SpecError naming `field` when the
    result is out of bounds (`check_size`) or undefined: complex, infinite, or a comparison sympy cannot decide
    (log of a value that came out negative, say). `what` says what was substituted."""
    import sympy

    try:
        result = expr.xreplace(dict(values))
    except (TypeError, ValueError, ZeroDivisionError) as error:
        raise SpecError(f"undefined once {what} are substituted ({error})", source=source, field=field) from None
    problem = check_size(result, bound_floats=False)
    if problem is None and result.has(sympy.I, sympy.zoo, sympy.nan, sympy.oo, -sympy.oo):
        problem = "a complex, infinite or undefined value"
    if problem is not None:
        raise SpecError(f"{problem} once {what} are substituted", source=source, field=field)
    return result


def check_node(expr: sympy.Basic) -> str | None:
    """`check_size` of one node and its direct arguments, for an expression built from checked parts: the
    evaluation that made it (a product of constants, a power distributed over a product) can only have changed
    those."""
    for node in (expr, *expr.args):
        problem = _node_problem(node, True)
        if problem:
            return problem
    return None


def _node_problem(node: sympy.Basic, bound_floats: bool) -> str | None:
    if node.is_Number and (bound_floats or node.is_Rational):
        return _number_problem(node)
    if node.is_Pow:
        return check_exponent(node.args[1])
    return None


def _number_problem(number: sympy.Expr) -> str | None:
    if number.is_Rational:
        digits = len(str(abs(number.p))) + len(str(number.q))
        if digits > 40 or abs(number) > MAX_MAGNITUDE:
            return f"the number {_short(number)} is larger than {MAX_MAGNITUDE:g} or too finely divided"
        return None
    if number.is_Float and not abs(float(number)) <= MAX_MAGNITUDE:
        return f"the number {_short(number)} is larger than {MAX_MAGNITUDE:g}"
    return None


def _short(number: sympy.Expr) -> str:
    text = str(number)
    return text if len(text) <= 24 else f"{text[:10]}...({len(text)} characters)"


# -- the wall-clock budget ----------------------------------------------------------------------------------------
class _Interrupted(BaseException):
    """Raised inside the working thread when its budget runs out (a BaseException, so that no `except
    Exception` inside sympy swallows it)."""


class _Budget:
    """One stage's budget: the field in progress, and the watcher thread that interrupts the stage's thread
    when the budget runs out, and again every REPEAT seconds after that: an interruption that lands inside a
    finaliser or a weakref callback is reported and dropped by Python, so one is not enough."""

    REPEAT = 0.05

    def __init__(self, source: str, field: str, seconds: float):
        self.source, self.field, self.seconds = source, field, seconds
        self.field_fired = field
        self.thread = threading.get_ident()
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.fired = False
        self.watcher = threading.Thread(target=self._watch, name="autocuda-symbolic-budget", daemon=True)

    def _watch(self) -> None:
        wait = self.seconds
        while not self.done.wait(wait):
            with self.lock:
                if self.done.is_set():
                    return
                if not self.fired:
                    self.field_fired = self.field
                self.fired = True
                _set_async_exception(self.thread, _Interrupted)
            wait = self.REPEAT

    def close(self) -> None:
        with self.lock:
            self.done.set()
            if self.fired:  # raised but maybe not yet delivered: withdraw it, the stage is over
                _set_async_exception(self.thread, None)

    def refusal(self) -> SpecError:
        return SpecError(f"symbolic work ran past its budget of {self.seconds:g} s (set {BUDGET_VARIABLE} to "
                         "allow more); simplify the expressions", source=self.source, field=self.field_fired)


def _set_async_exception(thread: int, exception: type[BaseException] | None) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), ctypes.py_object(exception)
                                               if exception is not None else None)


_current = threading.local()


@contextlib.contextmanager
def symbolic_budget(source: str, field: str) -> Iterator[None]:
    """Run a symbolic stage under the wall-clock budget; nested stages share the outermost one's. Running past
    it, or exhausting the stack, raises a SpecError naming `source` and the field in progress."""
    outer = getattr(_current, "budget", None)
    if outer is not None:
        with working_on(field):
            yield
        return
    budget = _current.budget = _Budget(source, field, budget_seconds())
    budget.watcher.start()
    try:
        yield
    except _Interrupted:
        raise budget.refusal() from None
    except RecursionError:
        raise SpecError("the expressions are nested too deeply for the derivation (the stack ran out); "
                        "simplify them", source=budget.source, field=budget.field) from None
    finally:
        budget.close()
        _current.budget = None


@contextlib.contextmanager
def working_on(field: str) -> Iterator[None]:
    """Name `field` as the one in progress in the current budget's refusals (no-op outside a budget)."""
    budget = getattr(_current, "budget", None)
    if budget is None:
        yield
        return
    previous, budget.field = budget.field, field
    try:
        yield
    finally:
        budget.field = previous
