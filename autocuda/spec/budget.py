"""Bounds on the symbolic work a spec may cause: what sympy is asked to evaluate, and for how long.

A spec is untrusted text, and sympy evaluates eagerly: `(2*v)**(10**29)` or `exp(10**29*log(2))` would build an
integer of 10**29 bits inside one C call that nothing can interrupt. So two kinds of bound apply:

- limits checked *before* sympy evaluates (`check_exponent`) or on every expression built (`check_size`):
  numeric exponents of at most MAX_EXPONENT, numbers of magnitude at most MAX_MAGNITUDE, expressions of at most
  MAX_NODES nodes;
- a budget of CPU time (`bounded`, default DEFAULT_SECONDS, `AUTOCUDA_SYMBOLIC_BUDGET` seconds) on the whole
  chain of symbolic stages from a spec's text to any one of its kernels: a Python step's trace and its mapping
  onto a spec, the parse, the step system and derivation, the kernel's rendering. Each stage runs in a worker
  thread, and what is measured is that thread's own CPU time (its clock, `time.pthread_getcpuclockid`): the work
  the spec causes, not the wall time it takes. A busy machine runs the stage later and slower, but the stage's
  CPU time, and so the verdict, stays that of an idle one. Past the budget the caller refuses the spec with a
  SpecError naming the field being worked on and the limit, and the worker is interrupted. Stack exhaustion in
  sympy's recursive algorithms is refused the same way.

The chain is what makes the budget one per spec load rather than one per stage: each stage's result (a parsed
spec, a derivation, a trace, ...) is recorded with the CPU time of the chain that made it (`_Costs`), and a later
stage that builds on it (`reuse`) starts with that time already spent. So a refusal comes within the budget of
CPU time from the start of the spec's load, however the work is split between stages, and however long ago the
earlier stages ran. Where a stage builds on several results, it counts the costliest chain among them (they share
their parse), so a stage that joins two unrelated chains may run past the budget by the smaller one.

A stage that uses no CPU (it waits on a lock, on I/O, sleeps) is refused by a wall-clock backstop of
BACKSTOP_FACTOR times the budget, at least BACKSTOP_SECONDS: only a hang, or a machine so loaded that the stage
got a core for less than one part in BACKSTOP_FACTOR of the time, meets it. Where the platform has no clock per
thread (`time.pthread_getcpuclockid`: not on Windows or macOS), the budget is wall-clock time per stage.

The interruption is an asynchronous exception raised in the worker: it lands between two Python bytecodes, which
is why the C-level evaluations above are refused beforehand instead.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import itertools
import math
import os
import queue
import sys
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from fractions import Fraction
from typing import TYPE_CHECKING, Any, TypeVar

from ..base.errors import SpecError

if TYPE_CHECKING:
    import sympy

T = TypeVar("T")

__all__ = ["MAX_EXPONENT", "MAX_MAGNITUDE", "MAX_NODES", "DEFAULT_SECONDS", "BACKSTOP_FACTOR", "BACKSTOP_SECONDS",
           "budget_seconds", "backstop_seconds", "check_exponent",
           "check_node", "check_size", "exp_problem", "bounded", "bounded_at", "reuse", "substituted", "working_on"]

MAX_EXPONENT = 64        # a neuron equation raises to small powers; larger ones only serve to blow sympy up
MAX_MAGNITUDE = 1e30     # numbers beyond it are typos or attacks, and overflow float16/bfloat16/float32 anyway
MAX_NODES = 20_000       # sympy nodes in one expression after derived values are substituted
DEFAULT_SECONDS = 4.0    # CPU seconds of the stages from a spec's text to one of its kernels, together
BACKSTOP_FACTOR = 10     # the wall-clock backstop: this many times the budget ...
BACKSTOP_SECONDS = 60.0  # ... and at least this many seconds
BUDGET_VARIABLE = "AUTOCUDA_SYMBOLIC_BUDGET"


def budget_seconds() -> float:
    """The CPU-time budget of a chain of symbolic stages: $AUTOCUDA_SYMBOLIC_BUDGET seconds, else
    DEFAULT_SECONDS."""
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
    if exponent.is_Number and _larger(exponent, MAX_EXPONENT):
        return f"exponent {_short(exponent)} is larger than {MAX_EXPONENT} in magnitude"
    return None


def _larger(number: sympy.Expr, bound: float) -> bool:
    """abs(number) > bound, exactly as sympy compares them: a rational's in integers (sympy's comparison of two
    numbers is slow, and checks run on every node)."""
    if number.is_Rational:
        whole = int(bound)
        limit = whole if whole == bound else Fraction(bound)  # Fraction(float): its exact value
        return abs(number.p) > limit * number.q
    return bool(abs(number) > bound)


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
        if digits > 40 or _larger(number, MAX_MAGNITUDE):
            return f"the number {_short(number)} is larger than {MAX_MAGNITUDE:g} or too finely divided"
        return None
    if number.is_Float and not abs(float(number)) <= MAX_MAGNITUDE:
        return f"the number {_short(number)} is larger than {MAX_MAGNITUDE:g}"
    return None


def _short(number: sympy.Expr) -> str:
    text = str(number)
    return text if len(text) <= 24 else f"{text[:10]}...({len(text)} characters)"


def backstop_seconds(seconds: float) -> float:
    """The wall-clock time after which a stage with a CPU budget of `seconds` is refused whatever it used."""
    return max(BACKSTOP_FACTOR * seconds, BACKSTOP_SECONDS)


# -- the CPU-time budget -------------------------------------------------------------------------------------------
class _Interrupted(BaseException):
    """Raised inside an abandoned stage's worker thread (a BaseException, so that no `except Exception` inside
    sympy swallows it)."""


class _Stage:
    """One symbolic stage run in a worker thread while the calling thread watches the worker's CPU time (and the
    wall-clock backstop). Past the budget, the caller refuses the spec at once, and the worker is interrupted by
    an asynchronous exception, raised again every REPEAT seconds until it ends (an interruption landing in a
    finaliser is dropped by Python). Only the worker ever receives one: it lands between two bytecodes wherever
    the worker is, cleanup code included, so it must never reach a thread that goes on with other work: a worker
    that was sent one ends with its stage (`_Worker`), one that was not runs the next stage."""

    POLL = 0.02  # seconds between two readings of the worker's clock
    REPEAT = 0.05
    MAX_REPEATS = 200

    def __init__(self, source: str, field: str, seconds: float, work: Callable[[], T],
                 locate: Callable[[Any], str] | None = None):
        self.source, self.field, self.seconds, self.work, self.locate = source, field, seconds, work, locate
        self.number = next(_stage_numbers)  # names the stage in the results it records (`_Costs`)
        self.reused = 0.0  # CPU seconds of the costliest chain of earlier stages this one builds on (`reuse`)
        self.ready, self.finished = threading.Event(), threading.Event()
        self.lock = threading.Lock()  # held to set `finished` and to interrupt: never both at once
        self.cpu_time: Callable[[], float] | None = None
        self.interrupted = False  # an interruption was sent to the worker (set under `lock`)
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> Any:
        worker = _idle_worker().start(self)
        self.ready.wait()
        start = time.monotonic()
        while not self.finished.wait(self.POLL):
            problem = self._past_budget(time.monotonic() - start)
            if problem is not None and not self.finished.is_set():
                field, where = self.field, self._where(worker)
                threading.Thread(target=self._interrupt, args=(worker,), name="autocuda-stage-interrupt",
                                 daemon=True).start()
                raise SpecError(f"{problem}{where} (set {BUDGET_VARIABLE} to allow more); simplify the "
                                f"expressions", source=self.source, field=field)
        if self.error is not None:
            raise self.error
        return self.result

    def _past_budget(self, wall: float) -> str | None:
        """Why the stage is refused after `wall` seconds, or None: its CPU time is past the budget, or the wall
        time past the backstop (where the platform has no clock per thread: past the budget)."""
        if self.cpu_time is None:
            if wall > self.seconds:
                return f"symbolic work ran past its budget of {self.seconds:g} s (of wall-clock time: this " \
                       f"platform has no CPU clock per thread)"
            return None
        try:
            used = self.cpu_time() + self.reused
        except OSError:  # the worker has just ended: its clock is gone
            return None
        if used > self.seconds:
            earlier = f", {self.reused:.2g} s of it in the earlier stages it builds on" if self.reused else ""
            return f"symbolic work ran past its budget of {self.seconds:g} s of CPU time{earlier}"
        backstop = backstop_seconds(self.seconds)
        if wall > backstop:
            return f"symbolic work did not end within {backstop:g} s of wall-clock time, the backstop of a " \
                   f"budget of {self.seconds:g} s of CPU time (it waits instead of working, or the machine is " \
                   f"overloaded)"
        return None

    def _where(self, worker: threading.Thread) -> str:
        """Where the worker is now, as `locate` names it (empty without one)."""
        frame = sys._current_frames().get(worker.ident or -1) if self.locate is not None else None
        where = self.locate(frame) if self.locate is not None and frame is not None else ""
        return f" {where}" if where else ""

    def _work(self) -> None:
        _current.stage = self
        try:
            try:
                self.cpu_time = _cpu_clock_of_this_thread()
                self.ready.set()
                self.result = _costs.recorded(self.work())
            except _Interrupted:
                pass  # abandoned: the caller has refused the spec already
            except RecursionError:
                self.error = SpecError("the expressions are nested too deeply for the derivation (the stack ran "
                                       "out); simplify them", source=self.source, field=self.field)
            except BaseException as error:  # handed to the caller, which raises it
                self.error = error
        except _Interrupted:
            pass  # one that landed in a handler above
        finally:
            # Set `finished`, however often an interruption lands meanwhile (inline, not in a function whose
            # entry could take one). Under the lock: once it is set, no interruption is sent, and one sent before
            # has landed by the end of Event.set (a Python call), so the thread ends without one pending and its
            # id, which a later thread may reuse, is never sent one again.
            while True:
                try:
                    with self.lock:
                        self.ready.set()
                        self.finished.set()
                    break
                except _Interrupted:
                    continue

    def _interrupt(self, worker: threading.Thread) -> None:
        if not getattr(sys.unraisablehook, "drops_interruptions", False):
            sys.unraisablehook = _dropping_interruptions(sys.unraisablehook)
        for _ in range(self.MAX_REPEATS):
            with self.lock:
                if self.finished.is_set() or worker.ident is None:
                    return
                self.interrupted = True
                _set_async_exception(worker.ident, _Interrupted)
            if self.finished.wait(self.REPEAT):
                return


def _dropping_interruptions(previous: Callable[[Any], object]) -> Callable[[Any], object]:
    """`previous` (sys.unraisablehook), less the interruptions of stages: one that lands in a finaliser, or anywhere
    else Python cannot raise it from, is dropped there (the stage sends it again until the worker ends), and
    Python would print it as "Exception ignored in ..." on the user's stderr."""
    def hook(unraisable: Any) -> None:
        if isinstance(unraisable.exc_value, _Interrupted) or (
                isinstance(unraisable.exc_type, type) and issubclass(unraisable.exc_type, _Interrupted)):
            return
        previous(unraisable)

    hook.drops_interruptions = True  # type: ignore[attr-defined]
    return hook


class _Worker:
    """A daemon thread that runs stages one after another: starting a thread costs more CPU than most stages (a
    kernel's rendering) take. After each stage it waits among the idle workers for the next, unless its stage was
    sent an interruption: then it ends (one may still be on its way; see `_Stage`)."""

    def __init__(self) -> None:
        self.stages: queue.SimpleQueue[_Stage] = queue.SimpleQueue()
        self.thread = threading.Thread(target=self._run, name="autocuda-symbolic-stage", daemon=True)
        self.thread.start()

    def start(self, stage: _Stage) -> threading.Thread:
        """Run `stage` in this worker's thread; returns the thread."""
        self.stages.put(stage)
        return self.thread

    def _run(self) -> None:
        try:
            while not self._run_one(self.stages.get()) and _keep_idle(self):
                pass
        except _Interrupted:
            pass  # one that came after its stage's end: the thread ends

    @staticmethod
    def _run_one(stage: _Stage) -> bool:
        """Run `stage`; returns whether it was sent an interruption. Nothing of it is kept afterwards (its work
        holds a spec)."""
        stage._work()
        _current.stage = None
        return stage.interrupted


MAX_IDLE_WORKERS = 4  # idle stage threads kept (one per thread that runs stages at the same time)
_idle: list[_Worker] = []
_idle_lock = threading.Lock()


def _idle_worker() -> _Worker:
    """An idle worker, or a new one."""
    with _idle_lock:
        while _idle:
            worker = _idle.pop()
            if worker.thread.is_alive():  # (a forked child holds its parent's workers' records)
                return worker
    return _Worker()


def _keep_idle(worker: _Worker) -> bool:
    """Put `worker` among the idle ones; False where enough are kept already (it ends)."""
    with _idle_lock:
        if len(_idle) < MAX_IDLE_WORKERS:
            _idle.append(worker)
            return True
    return False


def _forget_workers() -> None:
    """In a forked child: its parent's worker threads do not exist there, and the lock may have been held."""
    global _idle_lock
    _idle.clear()
    _idle_lock = threading.Lock()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_workers)


def _cpu_clock_of_this_thread() -> Callable[[], float] | None:
    """A reader of the calling thread's CPU time from now on, that another thread may call, or None where the
    platform has none. It reads the clock by its id: after the thread ends, the reading fails (OSError) instead of
    reading freed memory."""
    clock_id_of = getattr(time, "pthread_getcpuclockid", None)
    if clock_id_of is None:
        return None
    try:
        clock = clock_id_of(threading.get_ident())
        start = time.clock_gettime(clock)
    except (OSError, OverflowError):
        return None
    return lambda: time.clock_gettime(clock) - start


def _set_async_exception(thread: int, exception: type[BaseException]) -> None:
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread), ctypes.py_object(exception))


_current = threading.local()
_stage_numbers = itertools.count()


def _spent(stage: _Stage) -> float:
    """CPU seconds of `stage` so far, the chain it builds on included (read in its worker: the clock is alive)."""
    return (stage.cpu_time() if stage.cpu_time is not None else 0.0) + stage.reused


class _Costs:
    """The CPU time of the chain of stages that made each recorded result, and which stage recorded it: by the
    result's identity, for as long as it lives. Results that cannot be referred to weakly (tuples, sympy
    expressions) are not recorded: nothing caches them to build on later."""

    def __init__(self) -> None:
        self._by_id: dict[int, tuple[int, float]] = {}

    def recorded(self, result: T) -> T:
        """`result`, recorded with the current stage's time so far (the first stage to record it keeps it)."""
        stage = getattr(_current, "stage", None)
        if stage is None or stage.cpu_time is None or id(result) in self._by_id:
            return result
        try:
            weakref.finalize(result, self._by_id.pop, id(result), None)
        except TypeError:
            return result
        self._by_id[id(result)] = (stage.number, _spent(stage))
        return result

    def of(self, result: object) -> tuple[int, float] | None:
        """(the recording stage's number, the chain's CPU seconds) of `result`, or None."""
        return self._by_id.get(id(result))


_costs = _Costs()


def reuse(result: object) -> None:
    """Count the chain of earlier stages that made `result` (a stage's result, kept in a cache) as spent by the
    current stage, which builds on it. No-op outside a stage, for a result this stage made (its clock holds that
    time already), and for one never recorded."""
    stage: _Stage | None = getattr(_current, "stage", None)
    if stage is None:
        return
    made = _costs.of(result)
    if made is not None and made[0] != stage.number:
        stage.reused = max(stage.reused, made[1])


def bounded(source: str, field: str, work: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """`work(*args, **kwargs)`, a symbolic stage, run under the CPU-time budget; a stage called from inside
    another is part of the outermost one. Running past it, or exhausting the stack, raises a SpecError naming
    `source` and the field in progress. The result is recorded with the CPU time spent on it, which a later stage
    that builds on it (`reuse`) counts as its own."""
    outer = getattr(_current, "stage", None)
    if outer is not None:
        with working_on(field):
            return _costs.recorded(work(*args, **kwargs))
    return _Stage(source, field, budget_seconds(), functools.partial(work, *args, **kwargs)).run()


def bounded_at(source: str, field: str, locate: Callable[[Any], str], work: Callable[..., T], *args: Any) -> T:
    """`bounded(source, field, work, *args)`, whose refusal for time says where the work was: `locate(frame)` of
    the worker's innermost frame then (a step function's line)."""
    if getattr(_current, "stage", None) is not None:
        with working_on(field):
            return _costs.recorded(work(*args))
    return _Stage(source, field, budget_seconds(), functools.partial(work, *args), locate).run()


@contextlib.contextmanager
def working_on(field: str) -> Iterator[None]:
    """Name `field` as the one in progress in the current stage's refusals (no-op outside a stage)."""
    stage = getattr(_current, "stage", None)
    if stage is None:
        yield
        return
    previous, stage.field = stage.field, field
    try:
        yield
    finally:
        stage.field = previous
