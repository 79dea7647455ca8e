"""Impure calls in a traced step function: refused by name, at the step's line, while the step is traced.

A step is traced once, and what it computes becomes the kernel: a Python number it gets at trace time from
anything but its arguments is frozen into the kernel as one constant. That is right for a constant (a literal,
a default, a global or a closure's number, arithmetic on them) and wrong for a value that differs from call to
call. So these sources of values are refused while the step runs (until specs have noise of their own, noise
is added to the input outside the neuron):

- random numbers: Python's `random` and `secrets`, `os.urandom`, NumPy's `numpy.random` (its functions,
  RandomState and Generator), torch's random functions (`torch.rand*`, `torch.randn*`, `torch.randint*`,
  `torch.bernoulli`, `torch.normal`, `torch.poisson`, `torch.multinomial`, dropout, `rrelu`, the random Tensor
  methods `uniform_`, `normal_`, ..., generators, seeds) and `torch.empty*` (uninitialised memory);
- clocks and the environment: the `time` module, `datetime`'s now/today/utcnow, `os.environ`, `os.getenv`,
  `open`, `input`.

Two checks apply, in the tracing thread only (a profile function, `sys.setprofile`, set for the call of the
step and restored after it):

- every function of the user's code that runs (the step, its helpers, their lambdas and comprehensions: code
  outside torch, SpikingJelly, sympy, autocuda and the standard library) is read before it runs: a global name,
  closure variable or attribute chain of it (`np.random.rand`, `os.environ`, `rng` holding a Generator) that
  names one of the sources above is refused at its line, whether or not that line then runs;
- every call of a C function is watched: a random one is refused whoever calls it (torch.distributions,
  torch.nn.init and other libraries included; only sympy's and autocuda's own algorithms, and Python's import
  machinery, may draw numbers of their own), a clock or the environment when the user's code calls it.

What runs while a module is imported during the step is not watched (importing is not drawing values), nor what
runs in a garbage-collector callback or a finaliser (the interpreter runs those wherever the step happens to be).
"""
from __future__ import annotations

import builtins
import contextlib
import dis
import functools
import gc
import importlib._bootstrap
import sys
import sysconfig
import types
from collections.abc import Callable, Iterator
from typing import Any

from ..base.errors import SpecError

__all__ = ["watching", "impure", "in_stdlib", "chains", "RANDOM", "CLOCK"]

RANDOM, CLOCK = "random numbers", "a clock or the environment"
_RANDOM_MODULES = ("random", "_random", "secrets", "numpy.random", "torch.random")
_RANDOM_TORCH = frozenset({"bernoulli", "normal", "poisson", "multinomial", "dropout", "alpha_dropout",
                           "feature_dropout", "feature_alpha_dropout", "native_dropout", "rrelu", "uniform",
                           "exponential", "geometric", "cauchy", "log_normal", "random", "seed", "manual_seed",
                           "initial_seed", "empty", "empty_like", "empty_strided", "new_empty", "Generator"})
# torch's random functions a traced step may call: they become the spec's draws randn() and rand() (`spec.trace`)
TRACED_DRAWS = frozenset({"randn_like", "rand_like"})
_CLOCK_METHODS = frozenset({"now", "today", "utcnow"})
_ENVIRONMENT = frozenset({"getenv", "getenvb", "urandom", "getrandom", "_Environ"})
_OWN = ("sympy", "autocuda", "importlib", "_frozen_importlib", "zipimport")  # their numbers are their own
_IMPORT = importlib._bootstrap._find_and_load.__code__  # type: ignore[attr-defined]  # every import runs it
_STDLIB = sysconfig.get_paths()["stdlib"]
_LOADS = frozenset({"LOAD_GLOBAL", "LOAD_NAME", "LOAD_DEREF", "LOAD_CLASSDEREF"})
_ATTRIBUTES = frozenset({"LOAD_ATTR", "LOAD_METHOD"})


def _within(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _kind(module: str, owner: str, name: str) -> str | None:
    """RANDOM or CLOCK when a function or object `name` of `module` (bound to an object of `owner`) is one of
    the module doc's sources, else None."""
    if _within(module, _RANDOM_MODULES) or _within(owner, _RANDOM_MODULES):
        return RANDOM
    if (module.startswith("torch") or owner.startswith("torch")) and name in TRACED_DRAWS:
        return None  # the tracer makes these a spec's draws (`spec.draws`): no random number is taken
    if (module.startswith("torch") or owner.startswith("torch")) and (
            name.rstrip("_") in _RANDOM_TORCH or name.lstrip("_").startswith("rand")):
        return RANDOM
    if module in ("os", "posix", "nt") and name in ("urandom", "getrandom"):
        return RANDOM
    if module == "time" or (owner in ("datetime", "_datetime") and name in _CLOCK_METHODS):
        return CLOCK
    if (module in ("os", "posix", "nt") and name in _ENVIRONMENT) or (
            module in ("builtins", "io", "_io") and name in ("open", "input")):
        return CLOCK
    return None


def impure(value: Any) -> tuple[str, str] | None:
    """(its name, RANDOM or CLOCK) when `value` (a module, function, method, class or object) is a source of
    values that change from call to call, else None."""
    try:
        if isinstance(value, types.ModuleType):
            module, owner, name = value.__name__, "", value.__name__
        elif isinstance(value, (type, types.FunctionType, types.BuiltinFunctionType, types.MethodType)) or \
                "cython" in type(value).__name__:
            module, name = str(getattr(value, "__module__", None) or ""), str(getattr(value, "__name__", ""))
            bound = getattr(value, "__self__", None)
            bound_type = bound if isinstance(bound, type) else type(bound)
            owner = "" if bound is None or isinstance(bound, types.ModuleType) else str(bound_type.__module__)
        else:  # an object: judged by its class
            module, owner, name = str(type(value).__module__), "", type(value).__name__
    except Exception:  # noqa: BLE001  # an object that will not say what it is: no source we know
        return None
    kind = _kind(module, owner, name)
    if kind is None:
        return None
    if isinstance(value, types.ModuleType) or module in ("builtins", "io", "_io"):
        return name, kind
    return f"{module or owner}.{name}", kind


_C_SOURCES: dict[tuple[Any, str], tuple[str, str] | None] = {}
_UNKNOWN = ("", "")


def _c_function_source(function: Any) -> tuple[str, str] | None:
    """`impure(function)` for a C function, remembered by what decides it (what it is bound to: a module, a class
    or an object's class, else its module; and its name), since every call the traced step makes asks."""
    owner = getattr(function, "__self__", None)
    if owner is None:
        key = (getattr(function, "__module__", None), function.__name__)
    elif isinstance(owner, (types.ModuleType, type)):
        key = (owner, function.__name__)
    else:
        key = (type(owner), function.__name__)
    found = _C_SOURCES.get(key, _UNKNOWN)
    if found is _UNKNOWN:
        found = _C_SOURCES[key] = impure(function)
    return found


@functools.lru_cache(maxsize=1024)
def chains(code: types.CodeType) -> tuple[tuple[str, str, tuple[str, ...], int], ...]:
    """Each name the code loads with the attributes read from it in a row: (load instruction, name, attributes,
    line)."""
    found: list[tuple[str, str, tuple[str, ...], int]] = []
    line, in_chain = code.co_firstlineno, False
    for instruction in dis.get_instructions(code):
        line = _line_of(instruction) or line
        if instruction.opname in _LOADS:
            found.append((instruction.opname, str(instruction.argval), (), line))
            in_chain = True
        elif instruction.opname in _ATTRIBUTES and in_chain:
            load, name, attributes, at = found[-1]
            found[-1] = (load, name, (*attributes, str(instruction.argval)), at)
        else:
            in_chain = False
    return tuple(found)


def _line_of(instruction: dis.Instruction) -> int | None:
    positions = getattr(instruction, "positions", None)  # Python 3.11 on
    return getattr(positions, "lineno", None) or instruction.starts_line


def _resolve(frame: Any, load: str, name: str, attributes: tuple[str, ...]) -> Any:
    """The object a chain reads, as far as it can be read without running the user's code: through modules and
    classes, stopping at the first other object."""
    if load in ("LOAD_DEREF", "LOAD_CLASSDEREF"):
        value = frame.f_locals.get(name)
    else:
        value = frame.f_globals.get(name, getattr(builtins, name, None))
    for attribute in attributes:
        if not isinstance(value, (types.ModuleType, type)):
            break
        try:
            value = getattr(value, attribute)
        except Exception:  # noqa: BLE001  # not there (yet): the step will fail on it itself
            break
    return value


def impure_reference(frame: Any) -> tuple[str, str, int] | None:
    """(name, kind, line) of the first source of changing values the frame's code reads, or None."""
    for load, name, attributes, line in chains(frame.f_code):
        found = impure(_resolve(frame, load, name, attributes))
        if found is not None:
            return found[0], found[1], line
    return None


@contextlib.contextmanager
def watching(refuse: Callable[[str, str, Any, int | None], SpecError], is_user: Callable[[Any], bool]
             ) -> Iterator[None]:
    """Run the body with its calls watched (see the module doc). An impure one raises `refuse(operation,
    instead, frame, line)`: the frame of the user's code that reads or calls it, the line where (None: the
    frame's current line). `is_user(frame)`: whether a frame runs the user's code."""
    previous = sys.getprofile()
    importing = [0]  # imports in progress
    drawing: list[list[Any]] = []  # per call of a TRACED_DRAWS function in progress: [function, dispatched]

    def profile(frame: Any, event: str, arg: Any) -> None:
        if event == "c_call" and getattr(arg, "__name__", None) in TRACED_DRAWS and is_user(frame):
            drawing.append([arg, False])
        elif event in ("c_return", "c_exception") and drawing and drawing[-1][0] is arg:
            _, dispatched = drawing.pop()
            if event == "c_return" and not dispatched:  # it drew numbers: it was given a real tensor
                raise refuse(*_refusal(f"torch.{arg.__name__} of a tensor that is not a step value", RANDOM),
                             frame, None)
        if event == "call" and drawing and frame.f_code.co_name == "__torch_function__":
            drawing[-1][1] = True  # the stand-in's: the tracer makes it a draw of the spec
        if event == "c_call":
            source = None if importing[0] else _c_function_source(arg)
            if source is not None and (is_user(frame) or (source[1] == RANDOM and not _for_own_use(frame))) \
                    and not _housekeeping(frame):
                raise refuse(*_refusal(*source), frame, None)
        elif event == "call":
            if frame.f_code is _IMPORT:
                importing[0] += 1
            elif not importing[0] and is_user(frame):
                found = impure_reference(frame)
                if found is not None and not _housekeeping(frame):
                    raise refuse(*_refusal(found[0], found[1]), frame, found[2])
        elif event == "return" and frame.f_code is _IMPORT:
            importing[0] -= 1

    sys.setprofile(profile)
    try:
        yield
    finally:
        sys.setprofile(previous)


def _housekeeping(frame: Any) -> bool:
    """Whether `frame` runs inside a garbage-collector callback or a finaliser (`__del__`): code the interpreter
    runs wherever the step happens to be, not code of the step."""
    callbacks = {getattr(callback, "__code__", None) for callback in gc.callbacks}
    while frame is not None:
        if frame.f_code in callbacks or frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


def _for_own_use(frame: Any) -> bool:
    """Whether a call from `frame` is made for sympy's, autocuda's or the import machinery's own work: the first
    frame out of the standard library (random.py, say) is theirs."""
    while frame is not None and in_stdlib(frame.f_code.co_filename):
        frame = frame.f_back
    return frame is not None and _within(frame.f_globals.get("__name__", "") or "", _OWN)


def in_stdlib(file: str) -> bool:
    """Whether `file` is one of the standard library's (its site-packages are not)."""
    return file.startswith(_STDLIB) and "-packages" not in file


def _refusal(name: str, kind: str) -> tuple[str, str]:
    return (f"{name} ({kind})", "a neuron step is deterministic: it is traced once, and a value drawn while "
                                "tracing would be one constant in its kernel (add noise to the input outside "
                                "the neuron)")
