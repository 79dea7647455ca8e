"""cfunction emitters: every emitter x dtype compiles (nvcc, sm_80 and sm_90); float and double text computes
the mathematical function (host g++); surrogate gradients equal design.md's formulas; reference bugs stay fixed."""
from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Mapping

import numpy as np
import pytest
from conftest import compile_together

from autocuda.base.errors import LiteralError
from autocuda.codegen import cfunction as cf
from autocuda.codegen.dtypes import DTYPES, get_dtype
from autocuda.spec import surrogate

VARIABLES = ("x", "y", "z", "m", "mx", "my")
OPERANDS = {"x": "x", "y": "y", "z": "z", "mask": "m", "mask_x": "mx", "mask_y": "my"}
NUMERIC = {"alpha", "beta", "w", "c", "leak", "k", "n", "T_period"}
HOST_CTYPES = {"float32": "float", "float64": "double"}
TOLERANCE = {"float32": dict(rtol=2e-5, atol=1e-6), "float64": dict(rtol=1e-12, atol=1e-14)}


def emit(name: str, dtype: str, result: str | None = "r", **numbers: float) -> str:
    """Call emitter `name` with the standard operand names; numeric parameters from `numbers`."""
    fn = getattr(cf, name)
    params = [p for p in inspect.signature(fn).parameters if p != "dtype"]
    args: dict[str, object] = {params[0]: result}
    for p in params[1:]:
        args[p] = numbers[p] if (p in NUMERIC or name == "constant") else OPERANDS[p]
    return fn(**args, dtype=dtype)


# -- reference formulas -------------------------------------------------------------------------------
V = Mapping[str, np.ndarray]
# (x, y, z, m, mx, my): signs, zeros (also -0.0), equal operands, every mask combination
GENERAL = ((-2.5, 0.5, 4.0, 1, 0, 1), (-1.0, -1.0, -3.0, 0, 1, 0), (-0.25, 2.0, 0.125, 1, 1, 0),
           (0.0, 0.0, 1.5, 0, 0, 1), (-0.0, 0.25, 0.0, 0, 1, 1), (0.5, -1.5, -0.75, 1, 0, 0),
           (1.0, 1.0, 2.0, 0, 0, 0), (3.0, 0.75, -2.0, 1, 1, 1))
POSITIVE = ((0.25, 0.5, 1.0, 0, 0, 0), (1.0, 3.0, 1.0, 0, 0, 0), (2.5, -1.5, 1.0, 0, 0, 0),
            (7.0, 0.5, 1.0, 0, 0, 0), (0.5, 0.0, 1.0, 0, 0, 0))


def _sg(v):
    return 1 / (1 + np.exp(-v))


# emitter -> (numeric parameters, numpy reference, points)
MATH: dict[str, tuple[dict[str, float], Callable[[V], np.ndarray], tuple]] = {
    "constant": ({"x": -1.25}, lambda v: np.full_like(v["x"], -1.25), GENERAL),
    "abs": ({}, lambda v: np.abs(v["x"]), GENERAL),
    "neg": ({}, lambda v: -v["x"], GENERAL),
    "exp": ({}, lambda v: np.exp(v["x"]), GENERAL),
    "log": ({}, lambda v: np.log(v["x"]), POSITIVE),
    "sqrt": ({}, lambda v: np.sqrt(v["x"]), POSITIVE),
    "power": ({}, lambda v: v["x"] ** v["y"], POSITIVE),
    "add": ({}, lambda v: v["x"] + v["y"], GENERAL),
    "sub": ({}, lambda v: v["x"] - v["y"], GENERAL),
    "mul": ({}, lambda v: v["x"] * v["y"], GENERAL),
    "div": ({}, lambda v: v["x"] / v["y"], tuple(p for p in GENERAL if p[1] != 0)),
    "minimal": ({}, lambda v: np.minimum(v["x"], v["y"]), GENERAL),
    "maximum": ({}, lambda v: np.maximum(v["x"], v["y"]), GENERAL),
    "greater_equal": ({}, lambda v: (v["x"] >= v["y"]).astype(float), GENERAL),
    "greater_than": ({}, lambda v: (v["x"] > v["y"]).astype(float), GENERAL),
    "heaviside": ({}, lambda v: (v["x"] >= 0).astype(float), GENERAL),
    "if_else": ({}, lambda v: np.where(v["m"] != 0, v["x"], v["y"]), GENERAL),
    "if_else_else": ({}, lambda v: np.where(v["mx"] != 0, v["x"], np.where(v["my"] != 0, v["y"], v["z"])),
                     GENERAL),
    "sigmoid": ({"alpha": 2.0}, lambda v: _sg(2.0 * v["x"]), GENERAL),
}


def _fake_numerical(x, alpha):
    with np.errstate(divide="ignore"):
        return np.minimum(np.where(x >= 0, 1.0, -1.0) / x, alpha)  # Θ(0) = 1: at 0, min(+inf, α) = α


# design.md §4, written out by hand: emitter -> (parameters, gradient of x, the formula's breaks)
SURROGATE_FORMULAS: dict[str, tuple[dict[str, float], Callable[..., np.ndarray], tuple[float, ...]]] = {
    "sigmoid_backward": ({"alpha": 4.0}, lambda x, alpha: alpha * _sg(alpha * x) * (1 - _sg(alpha * x)), ()),
    "atan_backward": ({"alpha": 2.0}, lambda x, alpha: (alpha / 2) / (1 + (np.pi / 2 * alpha * x) ** 2), ()),
    "piecewise_quadratic_backward": ({"alpha": 2.0},
                                     lambda x, alpha: np.maximum(0, alpha - alpha**2 * np.abs(x)), (-0.5, 0.5)),
    "piecewise_exp_backward": ({"alpha": 1.5}, lambda x, alpha: alpha / 2 * np.exp(-alpha * np.abs(x)), (0.0,)),
    "soft_sign_backward": ({"alpha": 2.0}, lambda x, alpha: 1 / (2 * alpha * (1 / alpha + np.abs(x)) ** 2), (0.0,)),
    "super_spike_backward": ({"alpha": 1.5}, lambda x, alpha: alpha / (1 + np.abs(x)) ** 2, (0.0,)),
    "nonzero_sign_log_abs_backward": ({"alpha": 1.0}, lambda x, alpha: 1 / (1 / alpha + np.abs(x)), (0.0,)),
    "erf_backward": ({"alpha": 2.0}, lambda x, alpha: alpha / np.sqrt(np.pi) * np.exp(-(alpha**2) * x**2), ()),
    "piecewise_leaky_relu_backward": ({"w": 0.5, "c": 0.01},
                                      lambda x, w, c: np.where(np.abs(x) <= w, 1 / (2 * w), c), (-0.5, 0.5)),
    "s2nn_backward": ({"alpha": 4.0, "beta": 1.5},
                      lambda x, alpha, beta: np.where(x < 0, alpha * _sg(alpha * x) * (1 - _sg(alpha * x)),
                                                      beta / (np.abs(x) + 1)), (0.0,)),  # |x| = x where taken
    "q_pseudo_spike_backward": ({"alpha": 2.5}, lambda x, alpha: (1 + 2 * np.abs(x) / (alpha - 1)) ** (-alpha),
                                (0.0,)),
    "leaky_k_relu_backward": ({"leak": 0.1, "k": 1.5}, lambda x, leak, k: np.where(x >= 0, k, leak), (0.0,)),
    "fake_numerical_gradient_backward": ({"alpha": 0.25}, _fake_numerical, (-4.0, 0.0, 4.0)),
    "log_tailed_relu_backward": ({"alpha": 0.1},
                                 lambda x, alpha: np.where(x <= 0, alpha, np.where(x <= 1, 1.0, 1 / np.maximum(x, 1))),
                                 (0.0, 1.0)),
    "rect_backward": ({"alpha": 2.0}, lambda x, alpha: np.where(np.abs(x) < 1 / (2 * alpha), alpha, 0.0),
                      (-0.25, 0.25)),
    "squarewave_fourier_series_backward": ({"n": 3.0, "T_period": 6.0}, lambda x, n, T_period: 4 / T_period * sum(
        np.cos((2 * i - 1) * 2 * np.pi / T_period * x) for i in range(1, int(n))), ()),
    "deterministic_pass_backward": ({}, lambda x: np.ones_like(x), ()),
}
GRID = (-6.0, -2.5, -1.2, -0.3, 0.2, 0.7, 1.6, 3.0, 9.0)


def surrogate_points(breaks: tuple[float, ...]) -> tuple[tuple[float, ...], ...]:
    """The grid, plus each break and a point just either side of it."""
    xs = sorted({*GRID, *(b + d for b in breaks for d in (-1e-3, 0.0, 1e-3))})
    return tuple((x, 0.0, 0.0, 0.0, 0.0, 0.0) for x in xs)


# Operands that are expressions must be parenthesised by the emitters.
# emitter call, as text -> reference
COMPOUND: dict[str, Callable[[V], np.ndarray]] = {
    "mul(x + y, x - y)": lambda v: (v["x"] + v["y"]) * (v["x"] - v["y"]),
    "sub(x, y - z)": lambda v: v["x"] - (v["y"] - v["z"]),
    "div(x, y * z + 4)": lambda v: v["x"] / (v["y"] * v["z"] + 4),
    "neg(x - y)": lambda v: -(v["x"] - v["y"]),
    "maximum(-x, y * y)": lambda v: np.maximum(-v["x"], v["y"] * v["y"]),
}


# -- host evaluation, one g++ program for the whole module ------------------------------------------------
def _host_cases(dtype: str) -> dict[str, tuple[str, tuple]]:
    cases = {f"math:{n}": (emit(n, dtype, **p), pts) for n, (p, _, pts) in MATH.items()}
    cases |= {f"surrogate:{n}": (emit(n, dtype, **p), surrogate_points(b))
              for n, (p, _, b) in SURROGATE_FORMULAS.items()}
    cases |= {f"compound:{k}": (_compound(k, dtype), GENERAL) for k in COMPOUND}
    cases["plr_w2"] = (cf.piecewise_leaky_relu_backward("r", "x", 2.0, 0.05, dtype),
                       tuple((v, 0, 0, 0, 0, 0) for v in (-3.0, -2.0, -1.5, 0.0, 1.0, 2.0, 2.5)))
    inf = float("inf")
    cases["if_else_inf"] = (emit("if_else", dtype), ((2.0, inf, 0, 1, 0, 0), (inf, 3.0, 0, 0, 0, 0),
                                                      (-inf, -4.0, 0, 0, 0, 0), (5.0, -inf, 0, 1, 0, 0)))
    cases["if_else_else_inf"] = (emit("if_else_else", dtype), ((inf, inf, 5.0, 0, 0, 0), (inf, 2.0, -inf, 0, 0, 1),
                                                                (1.0, inf, -inf, 0, 1, 0), (8.0, -inf, inf, 0, 1, 1)))
    return cases


def _compound(key: str, dtype: str) -> str:
    """'mul(x + y, x - y)' -> cf.mul('r', 'x + y', 'x - y', dtype)."""
    name, args = key.split("(", 1)
    return getattr(cf, name)("r", *[a.strip() for a in args[:-1].split(",")], dtype=dtype)


@pytest.fixture(scope="module")
def host(host_eval) -> dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """dtype -> case -> (points as a (n, 6) array, values computed by the printed C)."""
    plan = {d: _host_cases(d) for d in HOST_CTYPES}
    flat = [(HOST_CTYPES[d], text, VARIABLES, pts) for d in plan for text, pts in plan[d].values()]
    values = iter(host_eval(flat))
    return {d: {k: (np.array(pts, dtype=float), next(values)) for k, (_, pts) in plan[d].items()} for d in plan}


def _variables(points: np.ndarray, dtype: str) -> dict[str, np.ndarray]:
    if dtype == "float32":  # the C program holds the operands as floats
        points = points.astype(np.float32).astype(np.float64)
    return {name: points[:, i] for i, name in enumerate(VARIABLES)}


@pytest.mark.parametrize("dtype", list(HOST_CTYPES))
@pytest.mark.parametrize("name", list(MATH))
def test_emitter_computes_its_function(host, dtype: str, name: str):
    points, got = host[dtype][f"math:{name}"]
    expected = MATH[name][1](_variables(points, dtype))
    np.testing.assert_allclose(got, expected, **TOLERANCE[dtype], err_msg=emit(name, dtype, **MATH[name][0]))


@pytest.mark.parametrize("dtype", list(HOST_CTYPES))
@pytest.mark.parametrize("name", list(SURROGATE_FORMULAS))
def test_surrogate_gradient_matches_design_formula(host, dtype: str, name: str):
    params, formula, _ = SURROGATE_FORMULAS[name]
    points, got = host[dtype][f"surrogate:{name}"]
    expected = formula(_variables(points, dtype)["x"], **params)
    np.testing.assert_allclose(got, expected, **TOLERANCE[dtype], err_msg=emit(name, dtype, **params))


@pytest.mark.parametrize("dtype", list(HOST_CTYPES))
@pytest.mark.parametrize("key", list(COMPOUND))
def test_compound_operands_are_parenthesised(host, dtype: str, key: str):
    points, got = host[dtype][f"compound:{key}"]
    np.testing.assert_allclose(got, COMPOUND[key](_variables(points, dtype)), **TOLERANCE[dtype],
                               err_msg=_compound(key, dtype))


@pytest.mark.parametrize("dtype", list(HOST_CTYPES))
def test_piecewise_leaky_relu_slope_is_one_over_2w(host, dtype: str):
    """Regression: the reference CUDA used 1/w inside |x| <= w; the primitive's derivative is 1/(2w)."""
    _, got = host[dtype]["plr_w2"]
    assert got.tolist() == pytest.approx([0.05, 0.25, 0.25, 0.25, 0.25, 0.25, 0.05])


@pytest.mark.parametrize("dtype", list(HOST_CTYPES))
@pytest.mark.parametrize("case", ["if_else_inf", "if_else_else_inf"])
def test_if_else_ignores_an_inf_in_the_branch_not_taken(host, dtype: str, case: str):
    """Regression: `x * mask + y * (1 - mask)` turns an Inf in the other branch into NaN."""
    _, got = host[dtype][case]
    expected = {"if_else_inf": [2.0, 3.0, -4.0, 5.0], "if_else_else_inf": [5.0, 2.0, 1.0, 8.0]}[case]
    assert got.tolist() == expected


# -- text and compilation -------------------------------------------------------------------------------
DEVICE_DTYPES = ["float32", "float64", "float16", "bfloat16"]
EMITTER_PARAMS = {n: p for n, (p, _, _) in MATH.items()} | {n: p for n, (p, _, _) in SURROGATE_FORMULAS.items()}


def test_every_emitter_has_a_reference_here():
    assert set(cf.EMITTERS) == set(EMITTER_PARAMS), "add the new emitter's formula to this test"


SURROGATE_CLASSES = {
    "sigmoid_backward": "Sigmoid", "atan_backward": "ATan", "piecewise_quadratic_backward": "PiecewiseQuadratic",
    "piecewise_exp_backward": "PiecewiseExp", "soft_sign_backward": "SoftSign", "super_spike_backward": "SuperSpike",
    "nonzero_sign_log_abs_backward": "NonzeroSignLogAbs", "erf_backward": "Erf",
    "piecewise_leaky_relu_backward": "PiecewiseLeakyReLU", "s2nn_backward": "S2NN",
    "q_pseudo_spike_backward": "QPseudoSpike", "leaky_k_relu_backward": "LeakyKReLU",
    "fake_numerical_gradient_backward": "FakeNumericalGradient", "log_tailed_relu_backward": "LogTailedReLU",
    "rect_backward": "Rect", "squarewave_fourier_series_backward": "SquarewaveFourierSeries",
    "deterministic_pass_backward": "DeterministicPass",
}


def test_every_named_surrogate_has_an_emitter_with_its_parameters():
    assert set(SURROGATE_CLASSES) == set(cf.SURROGATE_EMITTERS)
    assert set(SURROGATE_CLASSES.values()) == set(surrogate.SURROGATES) - {"Custom"}
    for name, cls_name in SURROGATE_CLASSES.items():
        params = list(inspect.signature(getattr(cf, name)).parameters)
        assert params == ["y", "x", *(n for n, _ in surrogate.SURROGATES[cls_name].DEFAULTS), "dtype"], name


def emitters_kernel(dtype: str, with_result: bool) -> str:
    """One __global__ function using every emitter, operands of the dtype's word type."""
    d = get_dtype(dtype)
    body = [f"    const {d.ctype} {n} = in[{i}];" for i, n in enumerate(VARIABLES)] + [f"    {d.ctype} r;"]
    for k, name in enumerate(cf.EMITTERS):
        if with_result:
            body += [f"    {emit(name, dtype, **EMITTER_PARAMS[name])}", f"    out[{k}] = r;"]
        else:
            body.append(f"    out[{k}] = {emit(name, dtype, None, **EMITTER_PARAMS[name])};")
    kind = "statements" if with_result else "expressions"
    return (f'extern "C" __global__ void emitters_{kind}_{d.name}(const {d.ctype}* in, {d.ctype}* out) {{\n'
            + "\n".join(body) + "\n}\n")


@pytest.fixture(scope="module")
def compiled(nvcc) -> tuple[dict[str, str], dict[str, str]]:
    """Each dtype's translation unit (statements and bare expressions), and nvcc's failures, by dtype."""
    sources = {}
    for dtype in DEVICE_DTYPES:
        d = get_dtype(dtype)
        sources[dtype] = "\n".join([*d.headers, d.prelude, emitters_kernel(dtype, True), emitters_kernel(dtype, False)])
    return sources, compile_together(nvcc, sources)


@pytest.mark.parametrize("dtype", DEVICE_DTYPES)
def test_every_emitter_compiles(compiled, dtype: str):
    sources, failures = compiled
    assert dtype not in failures, failures.get(dtype)
    assert sources[dtype].count("out[") == 2 * len(cf.EMITTERS)


@pytest.mark.parametrize("dtype", DEVICE_DTYPES)
def test_log_tailed_relu_emitter_compiles(compiled, dtype: str):
    """Regression: the reference's LogTailedReLU emitter produced code that did not compile."""
    sources, failures = compiled
    text = emit("log_tailed_relu_backward", dtype, **EMITTER_PARAMS["log_tailed_relu_backward"])
    assert text in sources[dtype]
    assert dtype not in failures, failures.get(dtype)


@pytest.mark.parametrize("dtype", DEVICE_DTYPES)
def test_power_prints_a_c_call(dtype: str):
    """Regression: the reference's `power` printed a Python tuple into the C source."""
    text = cf.power("z", "x", "y", dtype=dtype)
    assert re.fullmatch(r"z = [A-Za-z_][A-Za-z0-9_]*\(x, y\);", text), text
    assert cf.power("z", "a[t]", "2.0f", dtype=dtype).endswith("(a[t], 2.0f);")


@pytest.mark.parametrize("dtype", [*DEVICE_DTYPES, *[get_dtype(d).torch_dtype for d in DEVICE_DTYPES]], ids=str)
@pytest.mark.parametrize("name", cf.EMITTERS)
def test_statement_form_wraps_the_expression_form(name: str, dtype):
    expression = emit(name, dtype, None, **EMITTER_PARAMS[name])
    assert emit(name, dtype, "out[t]", **EMITTER_PARAMS[name]) == f"out[t] = {expression};"
    assert expression.count("(") == expression.count(")")


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_packed_emitters_use_only_packed_words(dtype: str):
    """No float literal or float-typed call leaks into half2/bf16 text outside the broadcast helpers."""
    d = get_dtype(dtype)
    for name in cf.EMITTERS:
        text = emit(name, dtype, None, **EMITTER_PARAMS[name])
        stripped = re.sub(r"__float2\w+\([^()]*\)", "", text)
        assert not re.search(r"\d\.\d*f\b", stripped), (name, text)
        assert not re.search(r"\b(expf|logf|powf|fabsf|fminf|fmaxf|sqrtf)\(", stripped), (name, text)
    assert d.literal(0.5) in emit("constant", dtype, None, x=0.5)


def test_emitters_take_the_seeds_positional_arguments():
    assert cf.sigmoid_backward("y", "x", 4.0, "float") == cf.sigmoid_backward(y="y", x="x", alpha=4.0, dtype="float")
    assert cf.piecewise_leaky_relu_backward("y", "x", 1.0, 0.01, "half2") == cf.piecewise_leaky_relu_backward(
        y="y", x="x", w=1.0, c=0.01, dtype="float16")
    assert cf.if_else("z", "x", "y", "mask", "float") == "z = (mask != 0.0f ? x : y);"
    with pytest.raises(TypeError):
        cf.sigmoid_backward("y", "x", dtype="float")  # alpha missing


def test_surrogate_parameters_are_validated():
    with pytest.raises(ValueError):
        cf.q_pseudo_spike_backward("y", "x", 1.0, "float")  # alpha must be > 1


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_constant_refuses_non_finite(dtype: str):
    with pytest.raises(ValueError):
        cf.constant("y", float("nan"), dtype)


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_a_number_operand_is_the_dtypes_literal(dtype: str):
    """A number was spliced as Python wrote it: `3.5` beside a half2 word, `nan`, `True` (C that does not compile,
    or that computes in another type)."""
    op, literal = get_dtype(dtype).op, get_dtype(dtype).literal
    assert cf.mul(None, "a", 3.5, dtype) == op("mul", "a", literal(3.5))
    assert cf.if_else("z", 1, 0, "m", dtype) == f"z = {op('if_else', literal(1.0), literal(0.0), 'm')};"


@pytest.mark.parametrize(("call", "error", "pattern"), [
    (lambda: cf.mul(None, "a", None, "float"), TypeError, "an operand is C text .* got NoneType"),
    (lambda: cf.mul(None, "a", True, "float"), TypeError, "got bool True"),
    (lambda: cf.mul(None, "a", [1.0], "float"), TypeError, "got list"),
    (lambda: cf.heaviside(None, "  ", "float"), ValueError, "an operand is empty"),
    (lambda: cf.mul(None, "a", float("nan"), "float"), ValueError, "non-finite"),
    (lambda: cf.add("", "a", "b", "float"), TypeError, "the result is None or the C text"),
    (lambda: cf.add(3, "a", "b", "float"), TypeError, "the result is None or the C text"),
])
def test_an_operand_or_result_that_is_no_c_text_is_refused(call, error: type, pattern: str):
    with pytest.raises(error, match=pattern):
        call()


@pytest.mark.parametrize(("call", "error", "pattern"), [
    # bare errors of float(): None, a list, text, an int beyond a double; True printed as 1.0f, a complex as its real
    (lambda: cf.constant("y", None, "float"), TypeError, r"cfunction: the constant is a number, got NoneType"),
    (lambda: cf.constant("y", [1], "float"), TypeError, r"the constant is a number, got list"),
    (lambda: cf.constant("y", "1.5", "float"), TypeError, r"the constant is a number, got str"),
    (lambda: cf.constant("y", True, "float"), TypeError, r"the constant is a number, got bool"),
    (lambda: cf.constant("y", np.complex128(1 + 1j), "float"), TypeError, r"the constant is a number, got complex128"),
    (lambda: cf.constant("y", 10**400, "float64"), LiteralError, r"the constant, an integer of 1329 bits, is beyond"),
    (lambda: cf.mul(None, "a", 10**400, "half2"), LiteralError, r"an operand, an integer of 1329 bits, is beyond"),
    (lambda: cf.mul(None, "a", np.complex64(1), "float"), TypeError, r"an operand is C text .* got complex64"),
    (lambda: cf.mul(None, "a", np.bool_(True), "float"), TypeError, r"an operand is C text .* got bool"),
    (lambda: cf.sigmoid("y", "x", 10**400, "float"), LiteralError, r"sigmoid's alpha, an integer of 1329 bits"),
    (lambda: cf.atan_backward("y", "x", 10**400, "float64"), LiteralError, r"atan_backward's alpha, an integer of"),
])
def test_a_number_that_is_no_real_number_a_double_holds_is_refused_by_its_role(call, error: type, pattern: str):
    with pytest.raises(error, match=pattern):
        call()


@pytest.mark.parametrize("dtype", ["float32", "float64", "half2"])
def test_numpy_integers_and_floats_are_numbers_as_python_ones(dtype: str):
    """np.float64 was taken (a float), np.float32 and np.int64 refused as no C text."""
    for number, python in ((np.float32(1.5), 1.5), (np.float64(1.5), 1.5), (np.int64(3), 3), (np.int8(-2), -2)):
        assert cf.mul(None, "a", number, dtype) == cf.mul(None, "a", python, dtype)
        assert cf.constant("y", number, dtype) == cf.constant("y", python, dtype)
    assert cf.sigmoid("y", "x", np.float32(2.0), dtype) == cf.sigmoid("y", "x", 2.0, dtype)


@pytest.mark.parametrize("alpha", [None, "abc", True, float("inf"), float("nan")])
def test_sigmoid_takes_a_finite_number_for_alpha(alpha):
    with pytest.raises(ValueError, match="cfunction.sigmoid: alpha must be a finite number"):
        cf.sigmoid("y", "x", alpha, "float")
