"""sympy -> CUDA printer: the printed C computes what sympy computes (host g++ for float/double), the
packed printers' text compiles (nvcc), and what cannot be printed is refused with PrintError."""
from __future__ import annotations

import numpy as np
import pytest
import sympy as sp
from sympy.codegen.cfunctions import expm1

from autocuda.codegen.printer import CudaPrinter, PrintError, print_expr

x, y = sp.symbols("x y", real=True)
NAMES = {x: "x", y: "y"}

ANY = ((-2.5, 0.75), (-0.5, -1.25), (0.0, 2.0), (0.3, -0.6), (1.0, 1.0), (1.75, 0.5))
POSITIVE = ((0.25, 0.5), (0.5, 2.0), (1.0, 1.5), (2.5, 0.75), (4.0, 3.0))
# Points on and next to the branch boundaries (-1, 0, 1) of the selections below.
EDGES = tuple((v, 0.5) for v in (-2.0, -1.0, -0.999, -0.5, 0.0, 0.001, 0.5, 0.999, 1.0, 1.001, 3.0))

CASES: list[tuple[sp.Expr, tuple[tuple[float, float], ...]]] = [
    # arithmetic
    (x + y, ANY), (x - 2 * y, ANY), (-x - y, ANY), (x * y, ANY), (-x * y, ANY), (x / y, ANY),
    (-x / 2, ANY), (3 * x / 7 + y, ANY), (sp.Rational(1, 3) * x + sp.Rational(5, 2), ANY),
    (x * y - sp.Rational(-7, 4), ANY), (1 - x, ANY),
    # powers: integer (unrolled and not), negative, square root, fractional, symbolic
    (x**2, ANY), (x**3 - y**4, ANY), (x**5, ANY), (x**-1, POSITIVE), (x**-3, POSITIVE), (y / x**2, POSITIVE),
    (sp.sqrt(x), POSITIVE), (x ** sp.Rational(-1, 2), POSITIVE), (x ** sp.Rational(3, 2), POSITIVE),
    (x**2.5, POSITIVE), (x**y, POSITIVE), (2**x, ANY), (sp.E**x, ANY), ((x + 1) ** -2 * y, POSITIVE),
    # functions
    (sp.exp(x), ANY), (sp.exp(-(x**2)), ANY), (sp.log(x), POSITIVE), (sp.log(1 + x**2), ANY),
    (sp.Abs(x), ANY), (sp.Abs(x - y), ANY), (sp.sin(x), ANY), (sp.cos(x * y), ANY), (sp.tan(x / 2), ANY),
    (sp.tanh(x), ANY), (sp.atan(x), ANY), (sp.erf(x), ANY), (1 / (1 + sp.exp(-4 * x)), ANY),
    (expm1(x), ANY), (1000 * expm1(x / 1000), ANY),  # the second fails for exp(z) - 1 (error 6e-5 at z = 1e-3)
    # folds and selections
    (sp.Min(x, y), ANY), (sp.Max(x, y), ANY), (sp.Max(x, y, sp.Rational(1, 2)), ANY), (sp.Min(x, 1), ANY),
    (sp.Piecewise((x, x < -1), (x**2, sp.And(x >= -1, x < 1)), (2 * x, True)), EDGES),
    (sp.Piecewise((-1, x <= -1), (0, x <= 0), (y, x > 1), (x, True)), EDGES),
    (sp.Piecewise((3, sp.And(x > 0, x <= 1, y > 0)), (-x, True)), EDGES),
    (sp.Heaviside(x, 1), EDGES), (sp.Heaviside(x - 1, 1) * y, EDGES), (sp.Heaviside(-x, 1), EDGES),
    # conditions sympy decided inside a condition chosen by a condition (ITE(c, True, d)): printed as 1 and 0
    (sp.Piecewise((x, sp.ITE(y > 0, sp.true, x > 1)), (-x, True)), EDGES),
    (sp.Piecewise((x, sp.ITE(x > 0, y > 0.6, sp.false)), (-x, True)), EDGES),
    # constants
    (sp.pi * x, ANY), (sp.E * x + sp.pi, ANY), (x / sp.sqrt(sp.pi), ANY), (sp.Integer(3), ANY),
]
CTYPES = {"float32": "float", "float64": "double"}
TOLERANCE = {"float32": dict(rtol=2e-6, atol=2e-6), "float64": dict(rtol=1e-13, atol=1e-13)}


def sympy_value(expr: sp.Expr, point: tuple[float, float]) -> float:
    return float(expr.subs({x: sp.Float(point[0], 30), y: sp.Float(point[1], 30)}).evalf(30))


@pytest.fixture(scope="module")
def host_values(host_eval):
    """Every case printed for float and for double, evaluated in one g++ program."""
    cases = [(CTYPES[d], f"r = {print_expr(e, d, NAMES)};", ("x", "y"), pts) for d in CTYPES for e, pts in CASES]
    values = iter(host_eval(cases))
    return {d: [next(values) for _ in CASES] for d in CTYPES}


@pytest.mark.parametrize("dtype", list(CTYPES))
@pytest.mark.parametrize("case", range(len(CASES)), ids=[str(e) for e, _ in CASES])
def test_printed_expression_evaluates_like_sympy(host_values, dtype: str, case: int):
    expr, points = CASES[case]
    expected = np.array([sympy_value(expr, p) for p in points])
    if dtype == "float32":  # the float kernel sees the inputs rounded to float
        expected = np.array([sympy_value(expr, tuple(float(np.float32(v)) for v in p)) for p in points])
    np.testing.assert_allclose(host_values[dtype][case], expected, **TOLERANCE[dtype],
                               err_msg=f"{expr} printed as {print_expr(expr, dtype, NAMES)}")


def test_heaviside_is_one_at_zero(host_eval):
    cases = [(c, f"r = {print_expr(sp.Heaviside(x, 1), d, NAMES)};", ("x", "y"), ((0.0, 0.0), (-0.0, 0.0)))
             for d, c in CTYPES.items()]
    for values in host_eval(cases):
        assert values.tolist() == [1.0, 1.0]


def test_min_and_max_keep_a_nan_as_torchs_do(host_eval):
    """A spec's min and max print as torch's minimum and maximum: NaN where either operand is NaN (C's fmin and
    fmax give the other operand). sqrt(x) is NaN in C at x < 0."""
    root = sp.sqrt(x)
    exprs = (sp.Min(root, y), sp.Min(y, root), sp.Max(root, y), sp.Max(y, root), sp.Max(root, y, -y))
    points = ((-1.0, 0.5), (4.0, 0.5), (4.0, -3.0))
    cases = [(c, f"r = {print_expr(e, d, NAMES)};", ("x", "y"), points) for d, c in CTYPES.items() for e in exprs]
    values = host_eval(cases)
    for got in values:
        assert np.isnan(got[0]) and not np.isnan(got[1:]).any()
    assert [got.tolist()[1:] for got in values[:len(exprs)]] == [[0.5, -3.0], [0.5, -3.0], [2.0, 2.0], [2.0, 2.0],
                                                                  [2.0, 3.0]]


def test_rational_coefficients_are_exact_in_double():
    text = print_expr(sp.Rational(1, 3) * x, "float64", NAMES)
    assert "0.333" not in text and "3" in text  # printed as a division by 3, not a rounded decimal


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "bfloat16"])
def test_powers_print_as_c_calls_or_products(dtype: str):
    for expr in (x**y, x**2.5, 2**x):
        text = print_expr(expr, dtype, NAMES)
        assert "pow" in text and "," in text and "(" in text and "**" not in text
    assert "pow" not in print_expr(x**3, dtype, NAMES)
    assert "sqrt" in print_expr(sp.sqrt(x), dtype, NAMES)


def test_packed_printers_compile(nvcc):
    """Every case printed for half2 and __nv_bfloat162 compiles (one translation unit, sm_80 and sm_90)."""
    from autocuda.codegen.dtypes import BFLOAT16, FLOAT16

    parts = [*FLOAT16.headers, *BFLOAT16.headers, FLOAT16.prelude, BFLOAT16.prelude]
    for d in (FLOAT16, BFLOAT16):
        printer = CudaPrinter(d, {x: "x[i]", y: "y[i]"})
        body = "\n".join(f"    out[{k}] = {printer(e)};" for k, (e, _) in enumerate(CASES))
        parts.append(f'extern "C" __global__ void printed_{d.name}(const {d.ctype}* x, const {d.ctype}* y, '
                     f"{d.ctype}* out) {{\n    const int i = threadIdx.x;\n{body}\n}}")
    failures = nvcc({"packed printers": "\n".join(parts) + "\n"})
    assert not failures, "\n".join(failures.values())


@pytest.mark.parametrize("expr", [
    x + sp.Symbol("z"),                       # unmapped symbol
    sp.Function("f")(x),                      # unknown function
    sp.Heaviside(x),                          # sympy's default H(0) = 1/2
    sp.Piecewise((1, x > 0)),                 # no default branch
    sp.Piecewise((1, sp.Eq(x, 0)), (0, True)),  # equality conditions
    sp.Piecewise((1, sp.Or(x > 1, x < -1)), (0, True)),
    sp.I * x,                                 # complex
    sp.gamma(x),
])
def test_unprintable_expressions_raise_print_error(expr):
    with pytest.raises(PrintError):
        print_expr(expr, "float32", NAMES)


def test_unmapped_symbol_message_names_it():
    with pytest.raises(PrintError, match="v_th"):
        print_expr(x - sp.Symbol("v_th"), "float64", NAMES)


def test_symbols_print_as_their_c_names():
    text = print_expr(x * y, "float32", {x: "x_seq[t]", y: "v_v_seq[t]"})
    assert "x_seq[t]" in text and "v_v_seq[t]" in text
