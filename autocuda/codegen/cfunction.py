"""Typed CUDA expression emitters, one per operation, for every dtype of the table.

Each emitter takes the C name of its result (`y`/`z`/`w`, or None for a bare expression), the C texts of
its operands, numeric parameters, and `dtype` ('float32', 'float64', 'float16'/'half2', 'bfloat16' or a
torch dtype). With a result name it returns a statement `y = <expr>;`, otherwise the expression:

    >>> add('z', 'x', 'y', dtype='float')
    'z = (x + y);'
    >>> add(None, 'x', 'y', dtype='half2')
    '__hadd2(x, y)'

The spelling of each operation comes from `autocuda.dtypes`; composite functions (sigmoid, the surrogate
gradients) are sympy expressions printed by the same printer the neuron kernels use.
"""
from __future__ import annotations

import inspect
import math
import re
from collections.abc import Callable
from typing import Any

import numpy as np
import sympy as sp

from ..base.errors import LiteralError
from ..spec import surrogate as _surrogate
from .dtypes import get_dtype
from .printer import print_expr

_SIMPLE_OPERAND = re.compile(r"[A-Za-z0-9_.]+(\[[^\[\]]*\])?\Z")
_Z = sp.Symbol("z", real=True)


def _is_number(value: Any) -> bool:
    """A number of the emitters: a Python or NumPy integer or float; not a bool (True is no number to print), not
    a complex (its imaginary part would be lost)."""
    return isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, bool)


def _real(value: Any, what: str) -> float:
    """`value`, a number (`_is_number`), as a float; `what` names it in a refusal."""
    if not _is_number(value):
        raise TypeError(f"cfunction: {what} is a number, got {type(value).__name__} {value!r:.80}")
    try:
        return float(value)
    except OverflowError:  # an int beyond a double
        raise LiteralError(f"cfunction: {what}, an integer of {int(value).bit_length()} bits, is beyond the range "
                           f"of every dtype") from None


def _operand(value: str | float, dtype: Any) -> str:
    """An operand safe to splice into a larger expression: C text, or a number as the dtype's literal. Anything else
    (None, a bool, a complex, a list, empty text) is refused: it would print as C that does not compile, or compiles to
    something else."""
    if _is_number(value):
        return get_dtype(dtype).literal(_real(value, "an operand"))
    if not isinstance(value, str):
        raise TypeError(f"cfunction: an operand is C text (a str) or a number, got {type(value).__name__} {value!r}")
    text = value.strip()
    if not text:
        raise ValueError("cfunction: an operand is empty C text")
    return text if _SIMPLE_OPERAND.match(text) else f"({text})"


def wrap_return_codes(y: str | None, codes: str) -> str:
    """`y = codes;` when a result name is given, else the bare expression."""
    if y is None:
        return codes
    if not isinstance(y, str) or not y.strip():
        raise TypeError(f"cfunction: the result is None or the C text it is assigned to, got {y!r}")
    return f"{y} = {codes};"


def constant(y: str | None, x: float, dtype: Any) -> str:
    """`y = x` for the number `x`, as the dtype's literal."""
    return wrap_return_codes(y, get_dtype(dtype).literal(_real(x, "the constant")))


def _unary(op: str) -> Callable[..., str]:
    def emit(y: str | None, x: str, dtype: Any) -> str:
        return wrap_return_codes(y, get_dtype(dtype).op(op, _operand(x, dtype)))
    emit.__name__ = emit.__qualname__ = op
    emit.__doc__ = f"`y = {op}(x)` in the given dtype."
    return emit


def _binary(op: str) -> Callable[..., str]:
    def emit(z: str | None, x: str, y: str, dtype: Any) -> str:
        return wrap_return_codes(z, get_dtype(dtype).op(op, _operand(x, dtype), _operand(y, dtype)))
    emit.__name__ = emit.__qualname__ = op
    emit.__doc__ = f"`z = {op}(x, y)` in the given dtype (comparisons give 1 or 0)."
    return emit


abs = _unary("abs")  # noqa: A001 - the seeds' name
neg = _unary("neg")
exp = _unary("exp")
log = _unary("log")
sqrt = _unary("sqrt")
heaviside = _unary("heaviside")
add = _binary("add")
sub = _binary("sub")
mul = _binary("mul")
div = _binary("div")
power = _binary("power")
minimal = _binary("minimal")
maximum = _binary("maximum")
greater_equal = _binary("greater_equal")
greater_than = _binary("greater_than")


def if_else(z: str | None, x: str, y: str, mask: str, dtype: Any) -> str:
    """`z = mask ? x : y` for a 0/1 mask, lane by lane; the branch not taken is never multiplied in."""
    return wrap_return_codes(z, get_dtype(dtype).op("if_else", _operand(x, dtype), _operand(y, dtype),
                                                    _operand(mask, dtype)))


def if_else_else(w: str | None, x: str, y: str, z: str, mask_x: str, mask_y: str, dtype: Any) -> str:
    """`w = mask_x ? x : (mask_y ? y : z)`."""
    inner = if_else(None, y, z, mask_y, dtype)
    return if_else(w, x, inner, mask_x, dtype)


def _printed(y: str | None, expr: sp.Expr, x: str, dtype: Any) -> str:
    return wrap_return_codes(y, print_expr(expr, dtype, {_Z: _operand(x, dtype)}))


def sigmoid(y: str | None, x: str, alpha: float, dtype: Any) -> str:
    """`y = 1 / (1 + exp(-alpha * x))`; alpha a finite number."""
    if not _is_number(alpha) or not math.isfinite(_real(alpha, "sigmoid's alpha")):
        raise ValueError(f"cfunction.sigmoid: alpha must be a finite number, got {alpha!r}")
    return _printed(y, 1 / (1 + sp.exp(-sp.Float(float(alpha)) * _Z)), x, dtype)


def _surrogate_backward(function_name: str, class_name: str, params: tuple[str, ...]) -> Callable[..., str]:
    cls = _surrogate.SURROGATES[class_name]

    def emit(y: str | None, x: str, *args: Any, **kwargs: Any) -> str:
        bound = signature.bind(y, x, *args, **kwargs)
        values = {p: bound.arguments[p] for p in params}
        for name, value in values.items():  # the surrogate checks its parameters; a double must hold them first
            if isinstance(value, int) and not isinstance(value, bool):
                _real(value, f"{function_name}'s {name}")
        return _printed(y, cls(**values).gradient(_Z), x, bound.arguments["dtype"])

    signature = inspect.Signature(
        [inspect.Parameter(n, inspect.Parameter.POSITIONAL_OR_KEYWORD) for n in ("y", "x", *params, "dtype")])
    emit.__signature__ = signature  # type: ignore[attr-defined]
    emit.__name__ = emit.__qualname__ = function_name
    emit.__doc__ = f"`y` = the gradient of the {class_name} surrogate at `x` (see autocuda.spec.surrogate)."
    return emit


sigmoid_backward = _surrogate_backward("sigmoid_backward", "Sigmoid", ("alpha",))
atan_backward = _surrogate_backward("atan_backward", "ATan", ("alpha",))
piecewise_quadratic_backward = _surrogate_backward("piecewise_quadratic_backward", "PiecewiseQuadratic", ("alpha",))
piecewise_exp_backward = _surrogate_backward("piecewise_exp_backward", "PiecewiseExp", ("alpha",))
soft_sign_backward = _surrogate_backward("soft_sign_backward", "SoftSign", ("alpha",))
super_spike_backward = _surrogate_backward("super_spike_backward", "SuperSpike", ("alpha",))
nonzero_sign_log_abs_backward = _surrogate_backward("nonzero_sign_log_abs_backward", "NonzeroSignLogAbs",
                                                    ("alpha",))
erf_backward = _surrogate_backward("erf_backward", "Erf", ("alpha",))
piecewise_leaky_relu_backward = _surrogate_backward("piecewise_leaky_relu_backward", "PiecewiseLeakyReLU",
                                                    ("w", "c"))
s2nn_backward = _surrogate_backward("s2nn_backward", "S2NN", ("alpha", "beta"))
q_pseudo_spike_backward = _surrogate_backward("q_pseudo_spike_backward", "QPseudoSpike", ("alpha",))
leaky_k_relu_backward = _surrogate_backward("leaky_k_relu_backward", "LeakyKReLU", ("leak", "k"))
fake_numerical_gradient_backward = _surrogate_backward("fake_numerical_gradient_backward",
                                                       "FakeNumericalGradient", ("alpha",))
log_tailed_relu_backward = _surrogate_backward("log_tailed_relu_backward", "LogTailedReLU", ("alpha",))
rect_backward = _surrogate_backward("rect_backward", "Rect", ("alpha",))
squarewave_fourier_series_backward = _surrogate_backward("squarewave_fourier_series_backward",
                                                         "SquarewaveFourierSeries", ("n", "T_period"))
deterministic_pass_backward = _surrogate_backward("deterministic_pass_backward", "DeterministicPass", ())
SURROGATE_EMITTERS = tuple(n for n in dir() if n.endswith("_backward") and not n.startswith("_"))

EMITTERS = ("constant", "abs", "neg", "exp", "log", "sqrt", "power", "add", "sub", "mul", "div", "minimal",
            "maximum", "greater_equal", "greater_than", "heaviside", "if_else", "if_else_else", "sigmoid",
            *SURROGATE_EMITTERS)
__all__ = ["wrap_return_codes", *EMITTERS]
