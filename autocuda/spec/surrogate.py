"""Surrogate gradients: the forward is the Heaviside step Θ(z) = 1 if z >= 0 else 0 (z > 0 with strict=True, for a
spec's fires_at ">"); a surrogate object says which derivative backward uses instead of Θ's (zero almost
everywhere). With `spiking=False` (SpikingJelly's non-spiking mode) the forward is the primitive itself, on the
torch reference only: the kernels' forward is Θ.

Names, parameters and formulas follow SpikingJelly's `surrogate` module (see docs/semantics.md and
docs/surrogates.md: PiecewiseLeakyReLU's gradient at |x| = w is 1/(2w), its documented closed interval, where
its torch code gives c). `primitive()` is the smooth function the gradient is the derivative of, where
SpikingJelly documents one (None for SuperSpike and FakeNumericalGradient). `key()` is a stable tuple for cache
keys.

Objects can be changed as SpikingJelly's can: `sg.alpha = 5.0` (any parameter, checked as the constructor checks
it), `sg.set_spiking_mode(False)` or `sg.spiking = False`. Each change bumps `version` and tells the objects
that `watch` it (the layers that use it). What keeps a surrogate for later (a spec, a registered plan) keeps a
frozen copy (`frozen()`), which refuses changes, so that a change never alters what was built from the old
values.
"""
from __future__ import annotations

import functools
import itertools
import math
import numbers
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import torch

from ..base.errors import LiteralError, SpecError
from ..base.lazy import lazy_import

if TYPE_CHECKING:
    import sympy
else:
    sympy = lazy_import("sympy")

__all__ = [
    "Surrogate", "Sigmoid", "ATan", "PiecewiseQuadratic", "PiecewiseExp", "SoftSign", "SuperSpike",
    "NonzeroSignLogAbs", "Erf", "PiecewiseLeakyReLU", "S2NN", "QPseudoSpike", "LeakyKReLU",
    "FakeNumericalGradient", "LogTailedReLU", "Rect", "SquarewaveFourierSeries", "DeterministicPass", "Custom",
    "SURROGATES", "surrogate_from_spec", "get_surrogate",
]

@functools.cache
def _x() -> sympy.Symbol:
    """The variable of Custom gradient expressions and of cached gradients."""
    return sympy.Symbol("x", real=True)

MAX_COUNT = 256  # a series' terms (SquarewaveFourierSeries' n): sympy writes each, and a larger n would not derive
# within spec.budget's limit (the reference's gradient, which no budget bounds, took minutes at n = 100000)
# Parameter domains: rule name -> (test, what the message says). Parameters not listed take any finite value.
_DOMAINS = {"positive": (lambda v: v > 0, "must be > 0"), "above_one": (lambda v: v > 1, "must be > 1"),
            "count": (lambda v: 1 <= v <= MAX_COUNT and float(v).is_integer(),
                      f"must be a whole number from 1 to {MAX_COUNT}")}


def _number(value: float) -> sympy.Expr:
    # Whole numbers stay exact so gradients read `4*x`, not `4.0*x`, and simplify cleanly.
    return sympy.Integer(int(value)) if float(value).is_integer() else sympy.Float(value)


def _sg(z: sympy.Expr) -> sympy.Expr:
    return 1 / (1 + sympy.exp(-z))


def _sg_slope(z: sympy.Expr) -> sympy.Expr:
    """sg'(z) = sg(z)(1 - sg(z)), written as e/(1 + e)^2 with e = exp(-|z|) (it is even in z): one exp and
    one division, where the product form divides twice, and e in (0, 1] cannot overflow."""
    e = sympy.exp(-sympy.Abs(z))
    return e / (1 + e) ** 2


def _check_value(cls_name: str, name: str, value: Any, domain: str | None) -> float:
    number = _finite(value)
    if number is None:
        raise SpecError(f"{cls_name} parameter '{name}' must be a finite number, got {value!r}",
                        field=f"surrogate.{name}", symbol=name)
    if domain is not None and not _DOMAINS[domain][0](number):
        raise SpecError(f"{cls_name} parameter '{name}' {_DOMAINS[domain][1]}, got {value!r}",
                        field=f"surrogate.{name}", symbol=name)
    return number


def _finite(value: Any) -> float | None:
    """`value` as a finite float, else None: a bool, a non-real, inf, NaN, or a whole number beyond float64's range
    (float(10**400) raises OverflowError) is none."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    try:
        number = float(value)
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


_VERSIONS = itertools.count(1)  # every change of any surrogate takes the next: (object, version) names its values


class Surrogate:
    """Base class: subclasses list DEFAULTS (name, value) and DOMAIN, and define _gradient/_primitive."""

    _values: tuple[tuple[str, float], ...]
    _spiking: bool = True
    _version: int = 0      # 0 until the first change (see the module doc)
    _frozen: bool = False  # a frozen copy refuses changes

    DEFAULTS: ClassVar[tuple[tuple[str, float], ...]] = ()
    DOMAIN: ClassVar[Mapping[str, str]] = {}

    def __init__(self, *args: float, spiking: bool = True, **kwargs: float):
        names = [n for n, _ in self.DEFAULTS]
        if len(args) > len(names):
            raise TypeError(f"{self.name} takes at most {len(names)} positional parameters")
        given = dict(zip(names, args, strict=False))  # fewer positionals than parameters is fine
        for key, value in kwargs.items():
            if key not in names:
                raise SpecError(f"{self.name} has no parameter '{key}' (parameters: {', '.join(names)})",
                                field=f"surrogate.{key}", symbol=key)
            if key in given:
                raise TypeError(f"{self.name} got parameter '{key}' twice")
            given[key] = value
        values = tuple((n, _check_value(self.name, n, given.get(n, d), self.DOMAIN.get(n)))
                       for n, d in self.DEFAULTS)
        object.__setattr__(self, "_values", values)
        self._set_spiking(spiking)

    def _set_spiking(self, spiking: Any) -> None:
        if not isinstance(spiking, bool):
            raise TypeError(f"{self.name}: spiking must be True or False, got {spiking!r}")
        if not spiking and type(self)._primitive is Surrogate._primitive:
            raise SpecError(f"{self.name} has no primitive, so no non-spiking mode (spiking=False)",
                            field="surrogate.spiking", symbol="spiking")
        if not spiking:  # the class default (True) serves spiking objects
            object.__setattr__(self, "_spiking", False)

    @property
    def spiking(self) -> bool:
        """False: forward is the primitive (SpikingJelly's non-spiking mode; the torch reference only)."""
        return self._spiking

    @spiking.setter
    def spiking(self, value: bool) -> None:
        self.set_spiking_mode(value)

    def set_spiking_mode(self, spiking: bool) -> None:
        """SpikingJelly's switch: True, the step Θ in forward; False, the primitive (the torch reference only)."""
        self._refuse_change_if_frozen("spiking")
        self._set_spiking(spiking)
        object.__setattr__(self, "_spiking", spiking)
        self._changed()

    @property
    def version(self) -> int:
        """0 for an object never changed; a number no other change of any surrogate had, after each change."""
        return self._version

    def _refuse_change_if_frozen(self, attr: str) -> None:
        if self._frozen:
            raise AttributeError(f"{self!r} is frozen (a spec or a built plan holds it): change a copy, "
                                 f"sg.copy().{attr} = ...")

    def _changed(self) -> None:
        """Forget what was worked out from the old values, take a new version, and tell the watchers. An object
        whose programs were built (it ran, or `gradient_of_x` readied it) has them rebuilt at once: code compiled
        with it (torch.compile, fullgraph=True) retraces after the change, and the trace must not meet sympy."""
        ready = "_gradient_x" in self.__dict__ or "_primitive_x" in self.__dict__
        for cached in ("_gradient_x", "_primitive_x", "_primitive_slope_x", "_frozen_copy", "_gradients",
                       "_formula_text"):
            self.__dict__.pop(cached, None)
        object.__setattr__(self, "_version", next(_VERSIONS))
        for watcher in list(self.__dict__.get("_watchers", ())):
            watcher._surrogate_changed(self)
        if ready:
            try:
                self.gradient_of_x()
            except SpecError:  # values whose program no dtype represents are refused where used, as a new object's
                pass

    def watch(self, watcher: Any) -> None:
        """Call `watcher._surrogate_changed(self)` after each change of this object (a layer takes the new values
        at once, so that its calls compare nothing per call). Held weakly: a watcher may go away."""
        watchers = self.__dict__.get("_watchers")
        if watchers is None:
            watchers = weakref.WeakSet()
            object.__setattr__(self, "_watchers", watchers)
        watchers.add(watcher)

    def copy(self) -> Surrogate:
        """A copy that can be changed on its own."""
        return _rebuild(type(self), self._init_kwargs())

    def frozen(self) -> Surrogate:
        """This object where it is frozen, else a frozen copy of its current values (made once per version)."""
        if self._frozen:
            return self
        cached = self.__dict__.get("_frozen_copy")
        if cached is None:
            cached = _rebuild(type(self), self._init_kwargs(), True)
            object.__setattr__(self, "_frozen_copy", cached)
        return cached

    @property
    def name(self) -> str:
        return type(self).__name__

    @property
    def params(self) -> dict[str, float]:
        return dict(self._values)

    def __getattr__(self, attr: str) -> float:
        # SpikingJelly-style attribute access: Sigmoid().alpha. Private names must not recurse here.
        if not attr.startswith("_"):
            for name, value in self.__dict__.get("_values", ()):
                if name == attr:
                    return value
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {attr!r}")

    def __delattr__(self, attr: str) -> None:
        # a parameter or `spiking` is always set (a change sets a new value); other names are no attributes
        if attr == "spiking" or any(n == attr for n, _ in self._values):
            raise AttributeError(f"{self.name} parameter {attr!r} cannot be deleted: set a new value")
        object.__delattr__(self, attr)

    def __setattr__(self, attr: str, value: Any) -> None:
        """`sg.alpha = 5.0` (SpikingJelly's objects take such changes): a parameter, checked as the constructor
        checks it; `spiking` through its property."""
        if attr == "spiking":
            object.__setattr__(self, attr, value)  # the property's setter
            return
        names = [n for n, _ in self._values]
        if attr not in names:
            raise AttributeError(f"{self.name} has no parameter {attr!r} (parameters: {', '.join(names) or 'none'})")
        self._refuse_change_if_frozen(attr)
        checked = _check_value(self.name, attr, value, self.DOMAIN.get(attr))
        object.__setattr__(self, "_values", tuple((n, checked if n == attr else v) for n, v in self._values))
        self._changed()

    def key(self) -> tuple:
        """(name, values[, "non-spiking"]); a class other than the one SURROGATES names so (a user's subclass, or
        another class of that name) adds the exact text of its formulas, made once per version: two classes of one
        name with their own gradients never share a plan or a kernel (the disk cache is keyed by this too)."""
        base = (self.name, self._values) if self._spiking else (self.name, self._values, "non-spiking")
        if SURROGATES.get(self.name) is type(self):
            return base
        text = self.__dict__.get("_formula_text")
        if text is None:
            formulas = [self.gradient(_x())]
            if not self._spiking:
                formulas += [self.primitive(_x()), self._primitive_gradient(_x(), **self._sympy_params())]
            text = tuple(sympy.srepr(f) for f in formulas)
            object.__setattr__(self, "_formula_text", text)
        return (*base, text)

    def __eq__(self, other: object) -> bool:
        return type(self) is type(other) and self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())

    def __repr__(self) -> str:
        spiking = [] if self._spiking else ["spiking=False"]
        return f"{self.name}({', '.join([*(f'{n}={v!r}' for n, v in self._values), *spiking])})"

    def __reduce__(self):
        return (_rebuild, (type(self), self._init_kwargs(), self._frozen))

    def _init_kwargs(self) -> dict[str, Any]:
        return self.params if self._spiking else {**self.params, "spiking": False}

    def _sympy_params(self) -> dict[str, sympy.Expr]:
        return {n: _number(v) for n, v in self._values}

    def gradient(self, z: sympy.Symbol) -> sympy.Expr:
        """dΘ/dz as used in backward, with the parameters substituted as numbers (built once per variable and
        version: every backward kernel asks)."""
        gradients = self.__dict__.get("_gradients")
        if gradients is None:
            gradients = {}
            object.__setattr__(self, "_gradients", gradients)
        found = gradients.get(z)
        if found is None:
            found = gradients[z] = self._gradient(z, **self._sympy_params())
        return found

    def primitive(self, z: sympy.Symbol) -> sympy.Expr | None:
        """The smooth surrogate function whose derivative is `gradient`, or None if none is documented."""
        return self._primitive(z, **self._sympy_params())

    def _gradient(self, x: sympy.Symbol, **p: sympy.Expr) -> sympy.Expr:
        raise NotImplementedError

    def _primitive(self, x: sympy.Symbol, **p: sympy.Expr) -> sympy.Expr | None:
        return None

    def _primitive_gradient(self, x: sympy.Symbol, **p: sympy.Expr) -> sympy.Expr:
        """The primitive's derivative, which backward uses with spiking=False: the gradient, where the primitive is
        its exact antiderivative (every class but S2NN)."""
        return self._gradient(x, **p)

    def torch_gradient(self, x: torch.Tensor) -> torch.Tensor:
        """The gradient evaluated with torch ops, shaped as `x` (a constant gradient too), in its dtype and device."""
        value = _evaluate_in_x(self._gradient_in_x(), x)
        return value if value.shape == x.shape else value.expand_as(x)

    def gradient_of_x(self) -> tuple[sympy.Symbol, sympy.Expr]:
        """(x, the gradient in x), built once with its flat program, and with spiking=False the primitive's too (the
        forward): torch.compile traces `torch_gradient` and the forward through the cached programs, never through
        sympy (call this before compiling: the reference's plans do)."""
        symbol, gradient, _ = self._gradient_in_x()
        if not self._spiking:
            self._primitive_in_x()
            self._primitive_slope_in_x()
        return symbol, gradient

    def _gradient_in_x(self) -> tuple[sympy.Symbol, Any, Any]:
        return self._prepared("_gradient_x", lambda: self.gradient(_x()), "gradient")

    def _primitive_in_x(self) -> tuple[sympy.Symbol, Any, Any]:
        return self._prepared("_primitive_x", lambda: self.primitive(_x()), "primitive")

    def _primitive_slope_in_x(self) -> tuple[sympy.Symbol, Any, Any]:
        """The primitive's derivative in x, prepared: the gradient's program where they are the same."""
        if type(self)._primitive_gradient is Surrogate._primitive_gradient:
            return self._gradient_in_x()
        return self._prepared("_primitive_slope_x", lambda: self._primitive_gradient(_x(), **self._sympy_params()),
                              "primitive's derivative")

    def _prepared(self, key: str, expr: Any, what: str) -> tuple[sympy.Symbol, Any, Any]:
        """`_in_x` of `expr()`, kept under `key` until the next change (`_changed` drops it)."""
        cached = self.__dict__.get(key)
        if cached is None:
            cached = self._in_x(expr(), what)
            object.__setattr__(self, key, cached)
        return cached

    def _in_x(self, expr: sympy.Expr | None, what: str) -> tuple[sympy.Symbol, Any, Any]:
        """`_in_x`, refusing a number of the expression beyond float64's range by the parameters that made it."""
        try:
            return _in_x(expr)
        except LiteralError as error:
            raise SpecError(f"{type(self).__name__}'s {what} with {self.params} holds a number no dtype represents "
                            f"({error})", field="surrogate") from None

    def __call__(self, x: torch.Tensor, strict: bool = False) -> torch.Tensor:
        """Θ(x) in forward (Θ(0) = 1, or 0 where `strict`: a neuron's fires_at ">"), this surrogate's gradient
        in backward; with spiking=False, the primitive in forward and its derivative, the gradient, in backward
        (`strict` unused)."""
        if isinstance(x, numbers.Number):  # a tensor, or a traced step's stand-in (`spec.trace.Value`)
            raise TypeError(f"{type(self).__name__}: expected a tensor, got the number {x!r} (in a step function: "
                            "the spike's argument, h - threshold, must depend on the input or a state)")
        tangents = _forward_ad._current_level >= 0
        if self._spiking:
            return (_TangentSpikeFunction if tangents else _SpikeFunction).apply(x, self, strict)
        if not isinstance(x, torch.Tensor):  # a traced step's stand-in: the primitive's own operations
            return _evaluate_in_x(self._primitive_in_x(), x)
        return (_TangentPrimitiveFunction if tangents else _PrimitiveFunction).apply(x, self, strict)


def _in_x(expr: sympy.Expr | None) -> tuple[sympy.Symbol, Any, Any]:
    """(x, `expr` prepared for evaluation, its flat program or None where it has none)."""
    from .torch_eval import prepare_expression, program_of

    if expr is None:
        return _x(), None, None
    return _x(), prepare_expression(expr), program_of(expr)


def _evaluate_in_x(cached: tuple[sympy.Symbol, Any, Any], x: torch.Tensor) -> torch.Tensor:
    """The value at `x` of an expression in x cached by `_in_x`: by its program, else by the walk (which names
    what it cannot evaluate)."""
    from .flat import run
    from .torch_eval import evaluate

    symbol, expr, program = cached
    if program is not None:
        return run(program, {symbol.name: x})
    return evaluate(expr, {symbol: x})


def _rebuild(cls: type[Surrogate], kwargs: dict[str, Any], frozen: bool = False) -> Surrogate:
    made = cls(**kwargs)
    if frozen:
        object.__setattr__(made, "_frozen", True)
    return made


def _keep(ctx: Any, inputs: tuple[torch.Tensor, Surrogate, bool], slope: Callable[..., torch.Tensor]) -> None:
    """What backward and jvp read: x, the derivative they use (`slope(surrogate, x)`), the surrogate, and its values
    as this forward ran (version, values)."""
    x, surrogate, _ = inputs
    ctx.save_for_backward(x)
    ctx.slope, ctx.surrogate, ctx.version, ctx.values = slope, surrogate, surrogate.version, surrogate._values


def _gradient_slope(surrogate: Surrogate, x: torch.Tensor) -> torch.Tensor:
    return surrogate.torch_gradient(x)


def _primitive_slope(surrogate: Surrogate, x: torch.Tensor) -> torch.Tensor:
    return _evaluate_in_x(surrogate._primitive_slope_in_x(), x)


def _as_at_forward(ctx: Any) -> Surrogate:
    """The surrogate with the values its forward ran with: a change between a forward and its backward
    (`sg.alpha = 1.0` before `loss.backward()`) never reaches into a graph already built, as in SpikingJelly (its
    Functions take the parameters by value) and in the layers (their plans keep frozen copies)."""
    surrogate = ctx.surrogate
    if surrogate.version != ctx.version:  # rebuilt once per graph node (kept for a second backward)
        # the forward's values over the current ones (which give Custom's text)
        kwargs = {**surrogate._init_kwargs(), **dict(ctx.values)}
        kwargs.pop("spiking", None)  # the Function says which derivative: spiking's or the primitive's
        surrogate = _rebuild(type(surrogate), kwargs)
        ctx.surrogate, ctx.version = surrogate, surrogate.version
    return surrogate


class _SpikeFunction(torch.autograd.Function):
    """Θ(x) with the surrogate's gradient. Forward apart from `setup_context` and elementwise, so torch.func's
    transforms (grad, vmap, jacrev, ...) take it: vmap batches it as it batches its body."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x: torch.Tensor, surrogate: Surrogate, strict: bool) -> torch.Tensor:
        return (x > 0 if strict else x >= 0).to(x.dtype)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[torch.Tensor, Surrogate, bool], output: torch.Tensor) -> None:
        _keep(ctx, inputs, _gradient_slope)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (x,) = ctx.saved_tensors
        return grad * ctx.slope(_as_at_forward(ctx), x), None, None


class _TangentSpikeFunction(_SpikeFunction):
    """`_SpikeFunction` with its forward-mode derivative, for calls under forward AD (torch.compile refuses a
    Function that defines one)."""

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[torch.Tensor, Surrogate, bool], output: torch.Tensor) -> None:
        _keep(ctx, inputs, _gradient_slope)
        ctx.save_for_forward(inputs[0])

    @staticmethod
    def jvp(ctx: Any, tangent: torch.Tensor, *_: Any) -> torch.Tensor:
        """The tangent times the derivative backward uses."""
        (x,) = ctx.saved_tensors
        return tangent * ctx.slope(_as_at_forward(ctx), x)


class _PrimitiveFunction(_SpikeFunction):
    """spiking=False: the primitive in forward, its derivative in backward (`Surrogate._primitive_gradient`: the
    gradient, as with spiking=True, but for S2NN's). Autograd through the primitive's own operations gave NaN where an
    intermediate overflows, as 0·inf: Sigmoid's 1/(1 + exp(-αx)) at αx < -11 in float16 or < -89 in float32,
    PiecewiseExp's branch it does not pick at |αx| > 89, LogTailedReLU's log(x) at x = 0; the gradient is written
    to stay finite (exp(-α|x|), each branch on its own side). Backward's operations are torch's, so it
    differentiates again (double backward, torch.func.hessian)."""

    @staticmethod
    def forward(x: torch.Tensor, surrogate: Surrogate, strict: bool) -> torch.Tensor:
        value = _evaluate_in_x(surrogate._primitive_in_x(), x)
        # a primitive that is x itself (DeterministicPass) returns a view: autograd refuses an input returned as-is
        # and saved for backward
        return value.view_as(x) if value is x else value

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[torch.Tensor, Surrogate, bool], output: torch.Tensor) -> None:
        _keep(ctx, inputs, _primitive_slope)


class _TangentPrimitiveFunction(_PrimitiveFunction):
    """`_PrimitiveFunction` with its forward-mode derivative, for calls under forward AD."""

    jvp = staticmethod(_TangentSpikeFunction.jvp)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple[torch.Tensor, Surrogate, bool], output: torch.Tensor) -> None:
        _keep(ctx, inputs, _primitive_slope)
        ctx.save_for_forward(inputs[0])


_forward_ad = torch.autograd.forward_ad  # `_current_level` >= 0: forward-mode AD is on
_ALPHA = {"alpha": "positive"}


class Sigmoid(Surrogate):
    DEFAULTS, DOMAIN = (("alpha", 4.0),), _ALPHA

    def _gradient(self, x, alpha):
        return alpha * _sg_slope(alpha * x)

    def _primitive(self, x, alpha):
        return _sg(alpha * x)


class ATan(Surrogate):
    DEFAULTS, DOMAIN = (("alpha", 2.0),), _ALPHA

    def _gradient(self, x, alpha):
        return (alpha / 2) / (1 + (sympy.pi / 2 * alpha * x) ** 2)

    def _primitive(self, x, alpha):
        return sympy.atan(sympy.pi / 2 * alpha * x) / sympy.pi + sympy.Rational(1, 2)


class PiecewiseQuadratic(Surrogate):
    DEFAULTS, DOMAIN = (("alpha", 1.0),), _ALPHA

    def _gradient(self, x, alpha):
        return sympy.Piecewise((0, sympy.Abs(x) > 1 / alpha), (alpha - alpha**2 * sympy.Abs(x), True))

    def _primitive(self, x, alpha):
        middle = -(alpha**2) / 2 * x * sympy.Abs(x) + alpha * x + sympy.Rational(1, 2)
        return sympy.Piecewise((0, x < -1 / alpha), (1, x > 1 / alpha), (middle, True))


class PiecewiseExp(Surrogate):
    DEFAULTS, DOMAIN = (("alpha", 1.0),), _ALPHA

    def _gradient(self, x, alpha):
        return alpha / 2 * sympy.exp(-alpha * sympy.Abs(x))

    def _primitive(self, x, alpha):
        return sympy.Piecewise((sympy.exp(alpha * x) / 2, x < 0), (1 - sympy.exp(-alpha * x) / 2, True))


class SoftSign(Surrogate):
    DEFAULTS, DOMAIN = (("alpha", 2.0),), _ALPHA

    def _gradient(self, x, alpha):
        return 1 / (2 * alpha * (1 / alpha + sympy.Abs(x)) ** 2)

    def _primitive(self, x, alpha):
        return (x / (1 / alpha + sympy.Abs(x)) + 1) / 2


class SuperSpike(Surrogate):
    DEFAULTS, DOMAIN = (("alpha", 1.0),), _ALPHA

    def _gradient(self, x, alpha):
        return alpha / (1 + sympy.Abs(x)) ** 2


class NonzeroSignLogAbs(Surrogate):
    DEFAULTS, DOMAIN = (("alpha", 1.0),), _ALPHA

    def _gradient(self, x, alpha):
        return 1 / (1 / alpha + sympy.Abs(x))

    def _primitive(self, x, alpha):  # sign(x)·log(|αx| + 1), with sign(0) taken as +1
        return sympy.Piecewise((-sympy.log(1 - alpha * x), x < 0), (sympy.log(1 + alpha * x), True))


class Erf(Surrogate):
    DEFAULTS, DOMAIN = (("alpha", 2.0),), _ALPHA

    def _gradient(self, x, alpha):
        return alpha / sympy.sqrt(sympy.pi) * sympy.exp(-(alpha**2) * x**2)

    def _primitive(self, x, alpha):
        return (1 + sympy.erf(alpha * x)) / 2


class PiecewiseLeakyReLU(Surrogate):
    DEFAULTS, DOMAIN = (("w", 1.0), ("c", 0.01)), {"w": "positive"}

    def _gradient(self, x, w, c):
        return sympy.Piecewise((1 / (2 * w), sympy.Abs(x) <= w), (c, True))

    def _primitive(self, x, w, c):
        return sympy.Piecewise((c * (x + w), x < -w), (c * (x - w) + 1, x > w),
                               (x / (2 * w) + sympy.Rational(1, 2), True))


class S2NN(Surrogate):
    DEFAULTS, DOMAIN = (("alpha", 4.0), ("beta", 1.0)), _ALPHA

    def _gradient(self, x, alpha, beta):
        return sympy.Piecewise((alpha * _sg_slope(alpha * x), x < 0), (beta / (x + 1), True))

    def _primitive(self, x, alpha, beta):
        # SpikingJelly's: log(|x + 1| + 1e-5), finite where torch evaluates the branch it does not pick (x <= -1)
        tail = beta * sympy.log(sympy.Abs(x + 1) + sympy.Float(1e-5)) + sympy.Rational(1, 2)
        return sympy.Piecewise((_sg(alpha * x), x < 0), (tail, True))

    def _primitive_gradient(self, x, alpha, beta):
        # the primitive's derivative: beta/(x + 1 + 1e-5) for x >= 0 (where x + 1 > 0), what SpikingJelly's
        # non-spiking mode backpropagates
        return sympy.Piecewise((alpha * _sg_slope(alpha * x), x < 0), (beta / (x + 1 + sympy.Float(1e-5)), True))


class QPseudoSpike(Surrogate):
    DEFAULTS, DOMAIN = (("alpha", 2.0),), {"alpha": "above_one"}

    def _gradient(self, x, alpha):
        return (1 + 2 * sympy.Abs(x) / (alpha - 1)) ** (-alpha)

    def _primitive(self, x, alpha):
        # Each branch's x is clipped beyond the other branch's side, at -+(alpha - 1) / 4 (Min, Max), so that its base
        # stays >= 1/2 where torch evaluates the branch it does not pick: a negative base to a fractional power is NaN,
        # and so would be its (discarded) gradient. The clip is no tie on the branch's own side (a tie's gradient is
        # split, as min's and max's are).
        half, clip = sympy.Rational(1, 2), (alpha - 1) / 4
        return sympy.Piecewise((half * (1 - 2 * sympy.Min(x, clip) / (alpha - 1)) ** (1 - alpha), x < 0),
                               (1 - half * (1 + 2 * sympy.Max(x, -clip) / (alpha - 1)) ** (1 - alpha), True))


class LeakyKReLU(Surrogate):
    DEFAULTS = (("leak", 0.0), ("k", 1.0))

    def _gradient(self, x, leak, k):
        return sympy.Piecewise((k, x >= 0), (leak, True))

    def _primitive(self, x, leak, k):
        return sympy.Piecewise((k * x, x >= 0), (leak * x, True))


class FakeNumericalGradient(Surrogate):
    """min((2Θ(x) - 1)/x, α) = min(1/|x|, α), written so that x = 0 gives α without dividing by zero."""

    DEFAULTS, DOMAIN = (("alpha", 0.3),), _ALPHA

    def _gradient(self, x, alpha):
        return sympy.Piecewise((alpha, sympy.Abs(x) <= 1 / alpha), (1 / sympy.Abs(x), True))


class LogTailedReLU(Surrogate):
    DEFAULTS = (("alpha", 0.0),)

    def _gradient(self, x, alpha):
        return sympy.Piecewise((alpha, x <= 0), (1, x <= 1), (1 / x, True))

    def _primitive(self, x, alpha):
        return sympy.Piecewise((alpha * x, x <= 0), (x, x <= 1), (sympy.log(x) + 1, True))


class Rect(Surrogate):
    """α where |x| < 1/(2α), else 0: SpikingJelly's code, whose inequality is strict (0 at |x| = 1/(2α))."""

    DEFAULTS, DOMAIN = (("alpha", 1.0),), _ALPHA

    def _gradient(self, x, alpha):
        return sympy.Piecewise((alpha, sympy.Abs(x) < 1 / (2 * alpha)), (0, True))

    def _primitive(self, x, alpha):  # clamp(αx + 1/2, 0, 1)
        half = 1 / (2 * alpha)
        return sympy.Piecewise((0, x < -half), (1, x > half), (alpha * x + sympy.Rational(1, 2), True))


class SquarewaveFourierSeries(Surrogate):
    """The first n - 1 odd terms of the Fourier series of a square wave of period T_period:
    (4/T) Σ_{i<n} cos((2i - 1)ωx), ω = 2π/T (0 for n = 1, as SpikingJelly's loop gives)."""

    DEFAULTS, DOMAIN = (("n", 2.0), ("T_period", 8.0)), {"n": "count", "T_period": "positive"}

    def _gradient(self, x, n, T_period):
        w = 2 * sympy.pi / T_period
        return 4 / T_period * sympy.Add(*(sympy.cos((2 * i - 1) * w * x) for i in range(1, int(n))))

    def _primitive(self, x, n, T_period):
        w = 2 * sympy.pi / T_period
        terms = sympy.Add(*(sympy.sin((2 * i - 1) * w * x) / (2 * i - 1) for i in range(1, int(n))))
        return sympy.Rational(1, 2) + 2 / sympy.pi * terms


class DeterministicPass(Surrogate):
    """The straight-through estimator: gradient 1; the primitive is x itself."""

    def _gradient(self, x):
        return sympy.Integer(1)

    def _primitive(self, x):
        return x


class Custom(Surrogate):
    """A user gradient: an expression of `x` (parsed through the spec whitelist) and named parameters."""

    _text: str
    _expr: sympy.Expr

    def __init__(self, gradient: str, *, spiking: bool = True, **params: float):
        from .parse import check_identifier, parse_expression

        self._set_spiking(spiking)  # taken as the other classes take it: spiking=False refused (no primitive)
        for name in params:
            check_identifier(name, field=f"surrogate.{name}")
            if name == "x":
                raise SpecError("'x' is the surrogate's variable, not a parameter", field="surrogate.x",
                                symbol="x")
        values = tuple((n, _check_value("Custom", n, v, None)) for n, v in params.items())
        symbols = {"x": _x(), **{n: sympy.Symbol(n, real=True) for n in params}}
        expr = parse_expression(gradient, symbols, field="surrogate.gradient")
        object.__setattr__(self, "_values", values)
        object.__setattr__(self, "_text", gradient)
        object.__setattr__(self, "_expr", expr.xreplace({symbols[n]: _number(v) for n, v in values}))

    @property
    def gradient_text(self) -> str:
        return self._text

    def __setattr__(self, attr: str, value: Any) -> None:
        if attr == "spiking":
            object.__setattr__(self, attr, value)
            return
        raise AttributeError(f"Custom surrogates cannot be changed ({attr!r}): build a new Custom")

    def key(self) -> tuple:
        """The gradient's exact text (srepr) and the parameters; the text made once (the object cannot change,
        and kernels are cached by a key that hashes it)."""
        text = self.__dict__.get("_expr_text")
        if text is None:
            text = sympy.srepr(self._expr)
            object.__setattr__(self, "_expr_text", text)
        return (self.name, text, self._values)

    def __repr__(self) -> str:
        extra = "".join(f", {n}={v!r}" for n, v in self._values)
        return f"Custom({self._text!r}{extra})"

    def _init_kwargs(self) -> dict[str, Any]:
        return {"gradient": self._text, **self.params}

    def gradient(self, z: sympy.Symbol) -> sympy.Expr:
        return self._expr.xreplace({_x(): z})


SURROGATES: Mapping[str, type[Surrogate]] = {cls.__name__: cls for cls in (
    Sigmoid, ATan, PiecewiseQuadratic, PiecewiseExp, SoftSign, SuperSpike, NonzeroSignLogAbs, Erf,
    PiecewiseLeakyReLU, S2NN, QPseudoSpike, LeakyKReLU, FakeNumericalGradient, LogTailedReLU, Rect,
    SquarewaveFourierSeries, DeterministicPass, Custom)}
_BY_LOWER = {name.lower(): cls for name, cls in SURROGATES.items()}


def surrogate_from_spec(name: str, params: Mapping[str, Any] | None = None) -> Surrogate:
    """Build a surrogate from its (case-insensitive) class name and parameters, e.g. a TOML table."""
    cls = _BY_LOWER.get(name.lower()) if isinstance(name, str) else None
    if cls is None:
        raise SpecError(f"unknown surrogate {name!r} (known: {', '.join(SURROGATES)})", field="surrogate.name",
                        symbol=str(name))
    params = dict(params or {})
    if cls is Custom and "gradient" not in params:
        raise SpecError("a Custom surrogate needs a 'gradient' expression of x", field="surrogate.gradient")
    return cls(**params)


_BEHAVIOUR = ("forward", "__call__", "spiking_function", "primitive_function", "backward")


def _own_behaviour(cls: type) -> str | None:
    """Why an object of `cls`, named as one of ours, is not the surrogate of that name, or None where it is: a class
    of its MRO before SpikingJelly's (a subclass of SpikingJelly's, torch.nn.Sigmoid, ...) defines how it computes
    (`forward`, `spiking_function`, `backward`, ...), or the SpikingJelly class it derives from has another name. A
    plain object that only holds the parameters (duck-typed) is taken by its name."""
    for c in cls.__mro__:
        if c.__module__.split(".")[0] == "spikingjelly":
            return None if c.__name__ == cls.__name__ else f"it derives from SpikingJelly's {c.__name__}"
        if c is object or c is torch.nn.Module:
            continue
        for name in _BEHAVIOUR:
            if name in vars(c):
                return f"{c.__module__}.{c.__qualname__} defines its own {name}"
    return None


def get_surrogate(obj: Surrogate | str | Mapping[str, Any] | Any) -> Surrogate:
    """A Surrogate from a Surrogate, a name, a {'name': ..., params} mapping or a SpikingJelly surrogate."""
    if isinstance(obj, Surrogate):
        return obj
    if isinstance(obj, str):
        return surrogate_from_spec(obj)
    if isinstance(obj, Mapping):
        params = dict(obj)
        name = params.pop("name", "Custom" if "gradient" in params else None)
        if name is None:
            raise SpecError("a surrogate table needs a 'name' or a 'gradient'", field="surrogate.name")
        return surrogate_from_spec(name, params)
    cls = SURROGATES.get(type(obj).__name__)
    if cls is None or cls is Custom:
        raise SpecError(f"cannot use {type(obj).__name__} as a surrogate (known: {', '.join(SURROGATES)})",
                        field="surrogate", symbol=type(obj).__name__)
    own = _own_behaviour(type(obj))
    if own is not None:
        raise SpecError(f"cannot use {type(obj).__name__} as a surrogate: {own}, so autocuda's {cls.__name__} of "
                        f"the same name would silently replace what it computes; write its gradient as "
                        f"autocuda.surrogate.Custom(...) or a subclass of autocuda's {cls.__name__}",
                        field="surrogate", symbol=type(obj).__name__)
    spiking = bool(getattr(obj, "spiking", True))
    return cls(**{n: _foreign_value(obj, n) for n, _ in cls.DEFAULTS if hasattr(obj, n)}, spiking=spiking)


def _foreign_value(obj: Any, name: str) -> Any:
    """A foreign surrogate's parameter as a number (a one-element tensor's value); the constructor checks it. A tensor
    of several values (per neuron) is refused by name: autocuda's surrogate parameters are numbers."""
    value = getattr(obj, name)
    if isinstance(value, torch.Tensor):
        if value.numel() != 1:
            raise SpecError(f"{type(obj).__name__} parameter '{name}' must be one number, got a tensor of shape "
                            f"{tuple(value.shape)} (autocuda's surrogate parameters are numbers, not per neuron)",
                            field=f"surrogate.{name}", symbol=name)
        return value.item()
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        return value  # the constructor refuses it by name
