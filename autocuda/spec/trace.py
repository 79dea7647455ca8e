"""Python step functions -> a table of what they compute: call a function on symbolic stand-ins.

A neuron written as one step, `step(x, *states, *params) -> (*outputs, *new_states)`, is called once with a
`Value` for every argument. A Value is a node of the tracer's table and answers the arithmetic, comparisons,
tensor methods and torch functions (through `__torch_function__`) a step uses by adding nodes; the step's
return values are then nodes over the input, the states and the parameters. No sympy here: a process whose
traced spec is cached (`autocuda.nn.flexsn`) never imports it; `spec.python` turns the table into sympy.

The spike is the one call of a surrogate spike function: autocuda's surrogates, and SpikingJelly's (its modules
and its autograd functions, recognised by what they are, without importing SpikingJelly), or a library's of the
same name and parameters (snnTorch's ATan). Its result is the node ("spike",); its argument (h - threshold), the
surrogate and the comparison its forward makes (`z >= 0`, or `z > 0`: a spec's fires_at ">") are recorded.

What a kernel cannot do is refused when it is met, with the line of the user's function and what to write
instead: a Python `if` on a tensor, in-place operations, sorting and other operations off the whitelist, random
numbers, `math` functions on a tensor, tensors captured by the function. Nothing falls back to running the
function eagerly.

The trace is bounded as a TOML spec is (`spec.budget`), each limit checked as the step runs, at the line that
passes it: at most MAX_OPERATIONS operations recorded (a long Python loop stops there, not at its end),
expressions nested at most MAX_DEPTH operations deep and of at most budget.MAX_NODES terms once written out,
numbers of magnitude at most budget.MAX_MAGNITUDE, numeric exponents of at most budget.MAX_EXPONENT; the call of
the step runs under the CPU-time budget of a symbolic stage (`budget.bounded`), and its calls are watched for
random numbers, clocks and the environment (`spec.purity`). Stack and memory exhaustion in the step are refused
naming its line.
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import linecache
import math
import numbers
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from ..base.errors import SpecError
from . import budget
from .purity import in_stdlib, watching
from .surrogate import SURROGATES, Custom, Surrogate

__all__ = ["Value", "Trace", "Spike", "trace", "refuse", "captured_tensor"]

_HERE = __file__
_LIBRARIES = ("torch", "spikingjelly", "snntorch", "norse", "sympy", "autocuda")  # never the user's line
MAX_OPERATIONS = 5_000   # operations recorded in one trace, repeats included: a neuron step needs a few hundred
MAX_DEPTH = 200          # operations from a returned value down to an argument


@dataclasses.dataclass(frozen=True)
class Spike:
    """The spike Θ(argument), with `surrogate`'s gradient (its nodes: ("spike",), ("detached",) for s.detach());
    `strict`: Θ(0) = 0, the surrogate's forward compared `argument > 0` (else `>= 0`)."""

    argument: int
    surrogate: Surrogate
    line: str
    strict: bool = False


@dataclasses.dataclass(frozen=True)
class Trace:
    """What one call computed: the node table, the argument names (("sym", name) nodes), the returned nodes."""

    name: str
    nodes: tuple[Node, ...]
    names: tuple[str, ...]
    returns: tuple[int, ...]
    spike: Spike | None
    lines: tuple[str, ...] = ()  # per node, "file:line" of the step where it was first computed (not in text())

    def text(self) -> str:
        """The whole computation as text (equal texts: equal steps)."""
        spike = None if self.spike is None else (self.spike.argument, self.spike.surrogate.key(),
                                                 *(("strict",) if self.spike.strict else ()))
        return repr((self.names, self.nodes, self.returns, spike))


# ---- where in the user's function ----

def _user_frame(frame: Any = None) -> Any:
    """The innermost frame of the user's code from `frame` (default: the caller's) outwards: not this module,
    torch, a surrogate library or the standard library."""
    frame = sys._getframe(1) if frame is None else frame
    while frame is not None:
        if _is_user(frame):
            return frame
        frame = frame.f_back
    return None


def _is_user(frame: Any) -> bool:
    """Whether `frame` runs the user's code: not this module, torch, a surrogate library or the standard
    library (whose site-packages are not in it)."""
    file = frame.f_code.co_filename
    return file != _HERE and not (frame.f_globals.get("__name__", "") or "").startswith(_LIBRARIES) and \
        not in_stdlib(file)


def _line_text(frame: Any) -> str:
    """`the source line` (file:line) of `frame`'s current line."""
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    return f"in {frame.f_code.co_name}(), `{line}` ({frame.f_code.co_filename}:{frame.f_lineno})"


def refuse(operation: str, instead: str, frame: Any = None, line_number: int | None = None) -> SpecError:
    """A SpecError at the user's line (the innermost from `frame`, default the caller's; `line_number` of that
    frame's file where given, else its current line): `operation` cannot be part of a neuron step; `instead`
    says what can."""
    inner = sys._getframe(1) if frame is None else frame
    frame = _user_frame(inner)
    library = _non_spiking_surrogate(inner, frame)
    if library is not None:  # the operation is the library's, inside a surrogate in its non-spiking mode
        operation = f"{library}(spiking=False) (its primitive uses {operation})"
        instead = ("a step takes a surrogate's spike (spiking=True); write a smooth output with the allowed torch "
                   "functions (torch.atan, torch.sigmoid, ...)")
    if frame is None:
        return SpecError(f"{operation} cannot be part of a neuron step: {instead}", symbol=operation)
    number = frame.f_lineno if line_number is None else line_number
    line = linecache.getline(frame.f_code.co_filename, number).strip()
    where = f"{frame.f_code.co_filename}:{number}"
    return SpecError(f"in {frame.f_code.co_name}(), `{line}`: {operation} cannot be part of a neuron step; "
                     f"{instead}", source=where, symbol=operation)


def _non_spiking_surrogate(frame: Any, user: Any) -> str | None:
    """The class name of a library's surrogate module in its non-spiking mode whose forward runs between `frame`
    and the user's frame `user` (SpikingJelly's compute their primitive with operations a step cannot hold), else
    None."""
    while frame is not None and frame is not user:
        module = frame.f_locals.get("self") if frame.f_code.co_name == "forward" else None
        if module is not None and type(module).__module__.startswith("spikingjelly") and \
                getattr(module, "spiking", True) is False:
            return f"{type(module).__module__}.{type(module).__name__}"
        frame = frame.f_back
    return None


# ---- the stand-in ----
# A traced step is a table of nodes, each a tuple (operation, *operands), operands node ids or constants:
#   ("sym", name)  ("int", n)  ("float", f)  ("spike",)  ("detached",)
#   ("add"|"sub"|"mul"|"div"|"pow"|"min"|"max", a, b)  ("neg", a)  ("fn", name, a)  ("heaviside", a)
#   ("rel", "lt"|"le"|"gt"|"ge", a, b)  ("where", rel, a, b)  ("ind", rel): 1 where rel holds, else 0
#   ("draw", "normal"|"uniform", k): the k-th random draw of the step (torch.randn_like, torch.rand_like)
# Equal nodes are stored once, so the table grows with the step's operations, not with the size of its
# expressions, and its text names the whole computation (the key of a disk cache of traced specs).

Node = tuple


class Value:
    """A symbolic stand-in for a tensor of a neuron step (see the module doc): a node of its tracer's table."""

    __slots__ = ("node", "relation", "tracer")

    def __init__(self, node: int, tracer: _Tracer, relation: int | None = None):
        self.node, self.tracer, self.relation = node, tracer, relation

    def _new(self, node: int, relation: int | None = None) -> Value:
        return Value(node, self.tracer, relation)

    def _op(self, op: str, other: Any, reverse: bool = False) -> Value:
        a, b = self.node, self.tracer.of(other)
        return self._new(self.tracer.node(op, *((b, a) if reverse else (a, b))))

    # arithmetic
    def __add__(self, other: Any) -> Value: return self._op("add", other)
    def __radd__(self, other: Any) -> Value: return self._op("add", other, True)
    def __sub__(self, other: Any) -> Value: return self._op("sub", other)
    def __rsub__(self, other: Any) -> Value: return self._op("sub", other, True)
    def __mul__(self, other: Any) -> Value: return self._op("mul", other)
    def __rmul__(self, other: Any) -> Value: return self._op("mul", other, True)
    def __truediv__(self, other: Any) -> Value: return self._op("div", other)
    def __rtruediv__(self, other: Any) -> Value: return self._op("div", other, True)
    def __pow__(self, other: Any) -> Value: return self._op("pow", other)
    def __rpow__(self, other: Any) -> Value: return self._op("pow", other, True)
    def __neg__(self) -> Value: return self._new(self.tracer.node("neg", self.node))
    def __pos__(self) -> Value: return self
    def __abs__(self) -> Value: return self._new(self.tracer.node("fn", "abs", self.node))

    # comparisons: a condition for torch.where, or 0/1 where a number is needed
    def _compare(self, op: str, other: Any) -> Value:
        spike = self.tracer.spike_in_surrogate(self, op, other)
        if spike is not None:
            return spike
        relation = self.tracer.node("rel", op, self.node, self.tracer.of(other))
        return self._new(self.tracer.node("ind", relation), relation)

    def __lt__(self, other: Any) -> Value: return self._compare("lt", other)
    def __le__(self, other: Any) -> Value: return self._compare("le", other)
    def __gt__(self, other: Any) -> Value: return self._compare("gt", other)
    def __ge__(self, other: Any) -> Value: return self._compare("ge", other)

    def __eq__(self, other: Any) -> Any:
        raise refuse("== on a tensor", "compare with <, <=, > or >= (equality of floats is no condition a "
                                       "gradient can pass)")

    def __ne__(self, other: Any) -> Any:
        raise refuse("!= on a tensor", "compare with <, <=, > or >=")

    __hash__ = object.__hash__

    def __bool__(self) -> bool:
        raise refuse("a Python `if` (or and/or/not) on a tensor",
                     "the branch would depend on the data; write torch.where(a < b, then, else)")

    def __float__(self) -> float:
        raise refuse("float() or a math function of a tensor", "use torch functions (torch.exp, not math.exp)")

    __int__ = __index__ = __float__

    def __len__(self) -> int:
        raise refuse("len() of a tensor", "a step works on one neuron's values; no shapes")

    def __iter__(self) -> Any:
        raise refuse("iterating over a tensor", "a step works on one neuron's values elementwise")

    def __getitem__(self, key: Any) -> Any:
        raise refuse("indexing a tensor", "a step works on one neuron's values elementwise")

    def __setitem__(self, key: Any, value: Any) -> None:
        raise refuse("item assignment (in place)", "compute a new value: v = torch.where(c, a, v)")

    def _in_place(self, *args: Any) -> Any:
        raise refuse("an in-place operation (+=, -=, *=, ...)", "write v = v + ... (a new value)")

    __iadd__ = __isub__ = __imul__ = __itruediv__ = __ipow__ = __iand__ = __ior__ = _in_place

    def __and__(self, other: Any) -> Any:
        raise refuse("& | ~ on conditions", "nest torch.where calls, one comparison each")

    __or__ = __rand__ = __ror__ = __invert__ = __xor__ = __and__

    def _rounding(self, *args: Any) -> Any:
        raise refuse("//, %, divmod(), round() or math.floor/ceil/trunc of a tensor",
                     "a kernel's arithmetic is + - * / ** and the listed torch functions; compare with "
                     "torch.where for steps")

    __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = __divmod__ = __rdivmod__ = _rounding
    __round__ = __trunc__ = __floor__ = __ceil__ = __ifloordiv__ = __imod__ = _rounding

    def _matrix(self, *args: Any) -> Any:
        raise refuse("@ (matrix product) or a shift of a tensor", "a step works on one neuron's values "
                                                                  "elementwise")

    __matmul__ = __rmatmul__ = __imatmul__ = __lshift__ = __rlshift__ = __rshift__ = __rrshift__ = _matrix

    def __repr__(self) -> str:
        return f"Value({self.tracer.nodes[self.node]})"

    # attributes a step may read
    @property
    def dtype(self) -> torch.dtype:
        return self.tracer.dtype

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # probes of private and special names (hasattr) get the usual answer
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        if name.endswith("_"):
            raise refuse(f"the in-place method Tensor.{name}", f"use Tensor.{name[:-1]} (a new value)")
        if name in _METHODS:
            return functools.partial(_METHODS[name], self)
        if name in _TORCH:
            return functools.partial(_call, name, self)
        raise refuse(f"Tensor.{name}", _supported())

    @classmethod
    def __torch_function__(cls, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: Mapping[str, Any] | None = None) -> Any:
        name = getattr(func, "__name__", repr(func))
        if any(isinstance(a, torch.Tensor) for a in (*args, *(kwargs or {}).values())):
            raise refuse("a tensor made outside the step", "pass tensors in as parameters (FlexSN's static_inputs)")
        if name.endswith("_") and not name.startswith("_"):
            raise refuse(f"the in-place torch.{name}", f"use torch.{name[:-1]} (a new value)")
        if (kwargs or {}).get("out") is not None:
            raise refuse(f"torch.{name}(..., out=...)", "return a new value instead of writing into a tensor")
        if name in _DRAWS:
            return _call(name, *args, **(kwargs or {}))
        if name in _RANDOM or "rand" in name:
            raise refuse(f"torch.{name} (random numbers)", "a neuron step is deterministic; add noise to the "
                                                           "input outside the neuron")
        if name in _METHODS:
            return _METHODS[name](*args, **(kwargs or {}))
        if name not in _TORCH:
            raise refuse(f"torch.{name}", _supported())
        return _call(name, *args, **(kwargs or {}))


def _unary(op: str, name: str | None = None) -> Callable[..., int]:
    return lambda t, x: t.node(op, name, t.of(x)) if name else t.node(op, t.of(x))


def _clamp(t: _Tracer, x: Any, min: Any = None, max: Any = None) -> int:
    """torch.clamp as where()s, with torch's gradient at a bound: x's where min <= x <= max (1 at a bound, not the
    1/2 of a min/max tie), a bound's where x passes it; where min > max, torch's value, max."""
    if min is None and max is None:  # torch refuses it too
        raise refuse("torch.clamp without min and max", "give min=, max= or both")
    node = value = t.of(x)
    if max is not None:
        node = t.node("where", t.node("rel", "lt", t.of(max), value), t.of(max), node)
    if min is not None:
        node = t.node("where", t.node("rel", "lt", value, t.of(min)), t.of(min), node)
    if min is not None and max is not None and (isinstance(min, Value) or isinstance(max, Value) or min > max):
        node = t.node("where", t.node("rel", "lt", t.of(max), t.of(min)), t.of(max), node)
    return node


def _relu(t: _Tracer, x: Any, inplace: Any = False) -> int:
    """torch.relu (and F.relu) as where(0 < x, x, 0): gradient 0 at x = 0, as torch's (max(0, x) would split it at
    the tie)."""
    if inplace is not False:
        raise refuse("relu(..., inplace=True)", "use relu(v) (a new value)")
    return t.node("where", t.node("rel", "lt", t.of(0), t.of(x)), t.of(x), t.of(0))


def _where(t: _Tracer, condition: Any, a: Any, b: Any) -> int:
    if not (isinstance(condition, Value) and condition.relation is not None):
        raise refuse("a condition that is not one comparison", "write torch.where(a < b, then, else)")
    return t.node("where", condition.relation, t.of(a), t.of(b))


def _heaviside(t: _Tracer, x: Any, values: Any = None) -> int:
    at_zero = None if values is None else t.nodes[t.of(values)]
    if at_zero in (("int", 0), ("float", 0.0)):  # the strict step: 1 where x > 0, else 0
        return t.node("ind", t.node("rel", "gt", t.of(x), t.of(0)))
    if at_zero not in (None, ("int", 1), ("float", 1.0)):
        raise refuse("torch.heaviside with Θ(0) other than 0 or 1", "use torch.heaviside(z, torch.ones_like(z)) "
                                                                   "or (z >= 0).float(); (z > 0).float() for Θ(0) = 0")
    return t.node("heaviside", t.of(x))


def _scaled(op: str) -> Callable[..., int]:
    def build(t: _Tracer, a: Any, b: Any, alpha: Any = 1) -> int:
        return t.node(op, t.of(a), t.of(b) if alpha == 1 else t.node("mul", t.of(alpha), t.of(b)))
    return build


def _binary(op: str) -> Callable[..., int]:
    return lambda t, a, b: t.node(op, t.of(a), t.of(b))


FUNCTION_NAMES = ("exp", "log", "sqrt", "sin", "cos", "tan", "tanh", "sigmoid", "erf", "abs", "atan")

# torch function (and Tensor method) name -> builder of its node (tracer, *arguments)
_TORCH: Mapping[str, Callable[..., int]] = {
    **{n: _unary("fn", n) for n in FUNCTION_NAMES}, "arctan": _unary("fn", "atan"),
    "neg": _unary("neg"), "negative": _unary("neg"), "heaviside": _heaviside,
    "square": lambda t, x: t.node("pow", t.of(x), t.of(2)),
    "reciprocal": lambda t, x: t.node("div", t.of(1), t.of(x)),
    "rsqrt": lambda t, x: t.node("div", t.of(1), t.node("fn", "sqrt", t.of(x))),
    "relu": _relu, "exp2": lambda t, x: t.node("pow", t.of(2), t.of(x)),
    "add": _scaled("add"), "sub": _scaled("sub"), "mul": _binary("mul"), "div": _binary("div"),
    "true_divide": _binary("div"), "pow": _binary("pow"), "minimum": _binary("min"), "maximum": _binary("max"),
    "clamp": _clamp, "clip": _clamp, "clamp_min": lambda t, x, m: _clamp(t, x, min=m),
    "clamp_max": lambda t, x, m: _clamp(t, x, max=m), "where": _where,
    "zeros_like": lambda t, x, **_: t.of(0), "ones_like": lambda t, x, **_: t.of(1),
    "full_like": lambda t, x, value, **_: t.of(value),
}
# torch.randn_like and torch.rand_like: the spec's draws randn() and rand(), a node of its own per call
_DRAWS: Mapping[str, Callable[..., int]] = {"randn_like": lambda t, x, **_: t.draw("normal"),
                                            "rand_like": lambda t, x, **_: t.draw("uniform")}
_RANDOM = frozenset({"bernoulli", "normal", "poisson", "dropout", "multinomial", "random", "uniform",
                     "exponential", "geometric", "cauchy", "log_normal", "alpha_dropout", "feature_dropout"})


def _supported() -> str:
    return ("a step may use + - * / **, comparisons inside torch.where, and torch." + ", torch.".join(
        sorted(n for n in _TORCH if not n.endswith("_like"))) + " (or the same Tensor methods)")


def _call(name: str, *args: Any, **kwargs: Any) -> Any:
    values = [a for a in (*args, *kwargs.values()) if isinstance(a, Value)]
    if not values:  # e.g. torch.exp of a Python number: the stand-in only sees calls that involve a Value
        raise refuse(f"torch.{name} without a step value", "use Python numbers or math for constants")
    anchor = values[0]
    for a in (*args, *kwargs.values()):
        if isinstance(a, Value) and a.tracer is not anchor.tracer:
            raise refuse(f"torch.{name} on values of another trace", "call the step on its own arguments")
    try:
        result = (_DRAWS.get(name) or _TORCH[name])(anchor.tracer, *args, **kwargs)
    except TypeError as err:
        raise refuse(f"torch.{name} with these arguments ({err})", _supported()) from None
    return anchor._new(result)


def _keep(self: Value, *args: Any, **kwargs: Any) -> Value:
    """Dtype and device changes: a step's arithmetic dtype is the kernel's."""
    if self.relation is not None:
        return self._new(self.node)  # a condition as 0/1
    return self


def _detach(self: Value) -> Value:
    return self.tracer.detach(self)


def _reject(what: str, instead: str) -> Callable[..., Any]:
    def method(self: Value, *args: Any, **kwargs: Any) -> Any:
        raise refuse(what, instead)
    return method


_METHODS: Mapping[str, Callable[..., Any]] = {
    "to": _keep, "float": _keep, "double": _keep, "half": _keep, "bfloat16": _keep, "type_as": _keep,
    "type": _keep, "contiguous": _keep, "clone": _keep, "view_as": _keep, "reshape_as": _keep,
    "expand_as": _keep, "detach": _detach,
    "sort": _reject("torch.sort", "a neuron step is elementwise: one neuron's values, no ordering across "
                                  "neurons"),
    "argsort": _reject("torch.argsort", "a neuron step is elementwise"),
    "topk": _reject("torch.topk", "a neuron step is elementwise"),
    "item": _reject("Tensor.item()", "keep values as tensors; use torch.where for choices"),
    "tolist": _reject("Tensor.tolist()", "keep values as tensors"),
    "numpy": _reject("Tensor.numpy()", "keep values as tensors"),
    "sum": _reject("torch.sum", "a neuron step is elementwise: no reductions across neurons"),
    "mean": _reject("torch.mean", "a neuron step is elementwise: no reductions across neurons"),
}


# ---- surrogate spike functions ----

def _library_surrogate(frame: Any) -> tuple[type, dict[str, Any]] | None:
    """(class, arguments) when `frame` runs the forward of an autograd Function defined in a surrogate module."""
    if frame.f_code.co_name != "forward":
        return None
    owner = next((v for v in frame.f_globals.values()
                  if isinstance(v, type) and issubclass(v, torch.autograd.Function)
                  and getattr(getattr(v, "forward", None), "__code__", None) is frame.f_code), None)
    if owner is None:
        return None
    names = frame.f_code.co_varnames[:frame.f_code.co_argcount]
    return _applied(frame, owner), {n: frame.f_locals[n] for n in names if n in frame.f_locals}


_APPLY = torch.autograd.Function.apply.__func__.__code__  # type: ignore[attr-defined]


def _applied(frame: Any, owner: type) -> type:
    """The Function class whose `apply` ran the forward in `frame` (a subclass of `owner`, whose forward it
    inherits), else `owner`."""
    for _ in range(4):
        frame = frame.f_back
        if frame is None:
            break
        if frame.f_code is _APPLY:
            cls = frame.f_locals.get("cls")
            return cls if isinstance(cls, type) and issubclass(cls, owner) else owner
    return owner


_SJ_NAMES = {cls.__name__.lower(): cls for cls in SURROGATES.values() if cls is not Custom}
_SPIKE_LIBRARIES = ("spikingjelly", "snntorch")  # whose spike functions of our names compute ours (norse's do not)
_OWN = ("forward", "setup_context", "backward", "vjp", "jvp")


def _not_theirs(owner: type) -> str | None:
    """Why the autograd Function `owner` (what `_library_surrogate` found: the class applied) does not compute the
    surrogate its name says, or None: it is not SpikingJelly's or snnTorch's, or a class of its MRO before the
    library's defines its own forward or backward."""
    for c in owner.__mro__:
        if c.__module__.split(".")[0] in _SPIKE_LIBRARIES:
            return None
        for name in _OWN:
            if name in vars(c):
                return f"{c.__module__}.{c.__qualname__} defines its own {name}"
    return f"{owner.__module__}.{owner.__qualname__} is not SpikingJelly's or snnTorch's"


def _named_surrogate(owner: type, arguments: Mapping[str, Any], operation: str) -> Surrogate:
    """The autocuda surrogate of a library autograd Function (SpikingJelly's `sigmoid`, `atan`, ...)."""
    given = next((v for v in arguments.values() if isinstance(v, Surrogate)), None)
    if given is not None:
        return given
    cls = _SJ_NAMES.get(owner.__name__.replace("_", "").lower())
    if cls is None:
        known = ", ".join(sorted(c.__name__ for c in _SJ_NAMES.values()))
        raise refuse(f"the spike function {owner.__module__}.{owner.__name__}",
                     f"use one of the surrogates {known} (SpikingJelly's or autocuda's)")
    why = _not_theirs(owner)
    if why is not None:  # autocuda's of that name would silently replace its gradient
        raise refuse(f"the spike function {owner.__module__}.{owner.__name__} ({why})",
                     f"write its gradient as autocuda.surrogate.Custom(...) or a subclass of autocuda's {cls.__name__}")
    ours = [name for name, _ in cls.DEFAULTS]
    for name, value in arguments.items():  # a parameter of theirs that ours lacks would be silently dropped
        if name not in ours and isinstance(value, (numbers.Real, torch.Tensor)):
            raise refuse(f"{operation} {owner.__module__}.{owner.__name__} with the parameter {name!r}",
                         f"autocuda's {cls.__name__} has the parameters {', '.join(ours) or 'none'}; use one of "
                         f"autocuda's surrogates")
    params = {}
    for name, _ in cls.DEFAULTS:
        if name in arguments:
            value = arguments[name]
            if isinstance(value, Value) or isinstance(value, torch.Tensor) and value.numel() != 1:
                raise refuse(f"{operation}: the surrogate parameter {name!r} as a tensor",
                             "give surrogate parameters as numbers")
            params[name] = float(value)
    return cls(**params)  # type: ignore[arg-type]


# nodes without operands (other nodes' ints are ids; a draw's is its number)
_LEAVES = frozenset({"sym", "int", "float", "spike", "detached", "draw"})


class _Tracer:
    def __init__(self, dtype: torch.dtype):
        self.dtype = dtype
        self.spike: Spike | None = None
        self.nodes: list[Node] = []
        self.ids: dict[Node, int] = {}
        self.operations = 0
        self.draws = 0  # the random draws made so far (`draw`)
        self.depths: list[int] = []  # per node: operations down to an argument
        self.sizes: list[int] = []   # per node: terms of its expression written out (capped past the limit)
        self.lines: list[str] = []

    def node(self, *node: Any) -> int:
        """The id of `node`, added to the table unless an equal one is there; refused past a limit."""
        self.operations += 1
        if self.operations > MAX_OPERATIONS:
            raise refuse(f"more than {MAX_OPERATIONS} operations (a loop this long?)",
                         "a neuron step is a few hundred operations at most; take fewer substeps")
        key = tuple(node)
        found = self.ids.get(key)
        if found is None:
            self._check(key)
            found = self.ids[key] = len(self.nodes)
            self.nodes.append(key)
        return found

    def _check(self, node: Node) -> None:
        """Refuse a new node past the limits on nesting, size and exponents; else record its shape and line."""
        operands = [] if node[0] in _LEAVES else [a for a in node[1:] if type(a) is int]
        depth = 1 + max((self.depths[a] for a in operands), default=0)
        size = min(1 + sum(self.sizes[a] for a in operands), budget.MAX_NODES + 1)
        if depth > MAX_DEPTH:
            raise refuse(f"an expression nested more than {MAX_DEPTH} operations deep",
                         "write the step with fewer nested operations (fewer substeps)")
        if size > budget.MAX_NODES:
            raise refuse(f"an expression of more than {budget.MAX_NODES} terms once written out",
                         "reuse fewer intermediate values in products and powers")
        if node[0] == "pow":
            exponent = self.nodes[node[2]]
            if exponent[0] in ("int", "float") and abs(exponent[1]) > budget.MAX_EXPONENT:
                raise refuse(f"a power with the exponent {_short(exponent[1])}",
                             f"exponents are at most {budget.MAX_EXPONENT} in magnitude")
        frame = _user_frame(sys._getframe(1))
        self.depths.append(depth)
        self.sizes.append(size)
        self.lines.append(f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "")

    def of(self, value: Any) -> int:
        """The node of a Value or a Python number."""
        if isinstance(value, Value):
            if value.tracer is not self:
                raise refuse("a value of another trace", "call the step on its own arguments")
            return value.node
        if isinstance(value, bool) or isinstance(value, numbers.Integral):
            if abs(int(value)) > budget.MAX_MAGNITUDE:
                raise refuse(f"the number {_short(int(value))}", f"numbers are at most {budget.MAX_MAGNITUDE:g} "
                                                                 f"in magnitude")
            return self.node("int", int(value))
        if isinstance(value, numbers.Real):
            if not math.isfinite(float(value)):
                raise refuse(f"the number {value!r}", "use finite numbers")
            if abs(float(value)) > budget.MAX_MAGNITUDE:
                raise refuse(f"the number {value!r}", f"numbers are at most {budget.MAX_MAGNITUDE:g} in magnitude")
            return self.node("float", float(value))
        if isinstance(value, torch.Tensor):
            raise refuse("a tensor made outside the step", "pass tensors in as parameters (FlexSN's static_inputs)")
        raise refuse(f"a value of type {type(value).__name__}", "use numbers, the step's arguments and torch ops")

    def spike_in_surrogate(self, value: Value, op: str, other: Any) -> Value | None:
        """Inside a surrogate's forward, its comparison of the argument with 0 is the spike: `>= 0` fires at 0,
        `> 0` (snnTorch's, or autocuda's with strict=True) only above it."""
        if op not in ("ge", "gt") or not isinstance(other, numbers.Real) or other != 0:
            return None
        frame: Any = sys._getframe(2)
        for _ in range(6):
            if frame is None:
                return None
            found = _library_surrogate(frame)
            if found is not None:
                owner, arguments = found
                if not any(v is value for v in arguments.values()):
                    return None
                return self.record_spike(value, _named_surrogate(owner, arguments, "the spike function"),
                                         strict=op == "gt")
            frame = frame.f_back
        return None

    def record_spike(self, argument: Value, surrogate: Surrogate, strict: bool = False) -> Value:
        if self.spike is not None:
            raise refuse("a second spike function call", "a neuron fires once per step: call the surrogate "
                                                         "once, on h - threshold")
        frame = _user_frame()
        line = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else ""
        self.spike = Spike(argument.node, surrogate, line, strict)
        return Value(self.node("spike"), self)

    def draw(self, kind: str) -> int:
        """A new random draw of `kind` (`spec.draws`): each call its own node, never merged with an equal one."""
        self.draws += 1
        return self.node("draw", kind, self.draws - 1)

    def detach(self, value: Value) -> Value:
        if self.nodes[value.node] == ("spike",):
            return Value(self.node("detached"), self)
        if self.nodes[value.node][0] in ("int", "float"):
            return value
        raise refuse("detach() of a value other than the spike",
                     "detach only the spike (s.detach() in the reset, SpikingJelly's detach_reset)")


def captured_tensor(fn: Callable[..., Any]) -> str | None:
    """The name of a tensor (or a module that is no surrogate) the function captures in a closure, or None."""
    while isinstance(fn, functools.partial):
        for value in (*fn.args, *fn.keywords.values()):
            if isinstance(value, (torch.Tensor, torch.nn.Module)) and not _is_surrogate_object(value):
                return "a functools.partial argument"
        fn = fn.func
    code = getattr(fn, "__code__", None)
    for name, cell in zip(getattr(code, "co_freevars", ()), getattr(fn, "__closure__", None) or ()):
        try:
            value = cell.cell_contents
        except ValueError:
            continue
        if isinstance(value, torch.Tensor) or (isinstance(value, torch.nn.Module) and not _is_surrogate_object(value)):
            return name
    return None


def _is_surrogate_object(value: Any) -> bool:
    """autocuda's surrogates, and SpikingJelly's surrogate modules (by their module path)."""
    return isinstance(value, Surrogate) or type(value).__module__.endswith(".surrogate")


def trace(fn: Callable[..., Any], names: Sequence[str], *, dtype: torch.dtype = torch.float32) -> Trace:
    """Call `fn` once with one Value per name (positionally) and return what it computed."""
    captured = captured_tensor(fn)
    if captured is not None:
        raise SpecError(f"{_name(fn)} captures the tensor or module {captured!r}: a kernel cannot read it; pass "
                        f"it as an argument (a parameter, or FlexSN's static_inputs)", symbol=captured)
    return budget.bounded_at(origin(fn), "step", _located, _traced, fn, names, dtype)


def _traced(fn: Callable[..., Any], names: Sequence[str], dtype: torch.dtype) -> Trace:
    """The trace of one call of `fn`, a symbolic stage: the Trace is its result, recorded with the stage's CPU
    time, which the mapping onto a spec builds on (`budget.reuse`)."""
    tracer = _Tracer(dtype)
    arguments = [Value(tracer.node("sym", n), tracer) for n in names]
    returned = _call_step(fn, arguments)
    returns = returned if isinstance(returned, (tuple, list)) else (returned,)
    nodes = []
    for i, value in enumerate(returns):
        try:
            nodes.append(tracer.of(value))
        except SpecError as err:
            raise SpecError(f"{_name(fn)}: return value {i}: {err.message}", source=err.source) from None
    return Trace(_name(fn), tuple(tracer.nodes), tuple(names), tuple(nodes), tracer.spike, tuple(tracer.lines))


def _call_step(fn: Callable[..., Any], arguments: list[Value]) -> Any:
    """`fn(*arguments)` with its calls watched (`spec.purity`); the stack or memory running out is refused at
    the step's innermost line."""
    try:
        with watching(refuse, _is_user):
            return fn(*arguments)
    except (RecursionError, MemoryError) as error:
        what = "the stack ran out (recursion too deep)" if isinstance(error, RecursionError) else \
            "memory ran out"
        frame = _innermost_user_frame(error.__traceback__)
        where = _line_text(frame) if frame is not None else _name(fn)
        source = f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else origin(fn)
        raise SpecError(f"{where}: {what} while tracing the step", source=source) from None


def _innermost_user_frame(tb: Any) -> Any:
    """The innermost frame of the user's code in a traceback that had begun to run (a frame still at its `def`
    line failed as it was entered: the line that called it is the one to name)."""
    found: list[Any] = []
    while tb is not None:
        if _is_user(tb.tb_frame):
            found.append(tb.tb_frame)
        tb = tb.tb_next
    if len(found) > 1 and found[-1].f_lineno == found[-1].f_code.co_firstlineno:
        found.pop()
    return found[-1] if found else None


def _located(frame: Any) -> str:
    """Where a step was when its budget ran out: its innermost line."""
    found = _user_frame(frame)
    return _line_text(found) if found is not None else ""


def origin(fn: Any) -> str:
    """file:line of the step function's definition."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    code = getattr(fn, "__code__", None)
    return f"{code.co_filename}:{code.co_firstlineno}" if code is not None else "<python>"


def _short(number: int | float) -> str:
    """A number as text, however large (str() refuses integers of more than 4300 digits)."""
    if isinstance(number, int) and number.bit_length() > 128:
        return f"of about 10**{int(number.bit_length() * math.log10(2))}"
    return repr(number)


def _name(fn: Any) -> str:
    while isinstance(fn, functools.partial):
        fn = fn.func
    return getattr(fn, "__name__", type(fn).__name__)


step_name = _name  # a step function's name, for messages: a partial's function's, a callable object's class's


def signature_names(fn: Callable[..., Any]) -> list[inspect.Parameter]:
    """The positional parameters of `fn` (refusing *args, and what has no signature to read)."""
    try:
        parameters = list(inspect.signature(fn).parameters.values())
    except (ValueError, TypeError) as err:
        raise SpecError(f"{_name(fn)}: expected a Python step function whose arguments can be read ({err})",
                        symbol=_name(fn)) from None
    if any(p.kind == inspect.Parameter.VAR_POSITIONAL for p in parameters):
        raise SpecError(f"{_name(fn)} takes *args: name each input, state and parameter")
    return [p for p in parameters if p.kind in (inspect.Parameter.POSITIONAL_ONLY,
                                                inspect.Parameter.POSITIONAL_OR_KEYWORD)]
