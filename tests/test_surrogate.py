"""Surrogates: gradients match design.md's formulas, primitives' derivatives match gradients, torch backward
matches both; and the sympy -> torch evaluator they (and the reference) run on."""
from __future__ import annotations

import math
import pickle
from collections.abc import Callable

import mpmath
import numpy as np
import pytest
import sympy
import torch
from sympy.codegen.cfunctions import expm1

from autocuda.base.errors import SpecError
from autocuda.spec import surrogate as sg
from autocuda.spec.torch_eval import evaluate

Z = sympy.Symbol("z", real=True)


def _sig(x):
    return 1 / (1 + np.exp(-x))


# design.md §4, written independently of the library with numpy.
FORMULAS = {
    "Sigmoid": lambda x, alpha: alpha * _sig(alpha * x) * (1 - _sig(alpha * x)),
    "ATan": lambda x, alpha: (alpha / 2) / (1 + (np.pi / 2 * alpha * x) ** 2),
    "PiecewiseQuadratic": lambda x, alpha: np.maximum(0, alpha - alpha**2 * np.abs(x)),
    "PiecewiseExp": lambda x, alpha: alpha / 2 * np.exp(-alpha * np.abs(x)),
    "SoftSign": lambda x, alpha: 1 / (2 * alpha * (1 / alpha + np.abs(x)) ** 2),
    "SuperSpike": lambda x, alpha: alpha / (1 + np.abs(x)) ** 2,
    "NonzeroSignLogAbs": lambda x, alpha: 1 / (1 / alpha + np.abs(x)),
    "Erf": lambda x, alpha: alpha / np.sqrt(np.pi) * np.exp(-(alpha**2) * x**2),
    "PiecewiseLeakyReLU": lambda x, w, c: np.where(np.abs(x) <= w, 1 / (2 * w), c),
    "S2NN": lambda x, alpha, beta: np.where(x < 0, alpha * _sig(alpha * x) * (1 - _sig(alpha * x)),
                                            beta / (np.maximum(x, 0) + 1)),
    "QPseudoSpike": lambda x, alpha: (1 + 2 * np.abs(x) / (alpha - 1)) ** (-alpha),
    "LeakyKReLU": lambda x, leak, k: np.where(x >= 0, k, leak),
    "FakeNumericalGradient": lambda x, alpha: np.minimum(
        np.divide(2 * (x >= 0) - 1.0, x, out=np.full_like(x, np.inf), where=x != 0), alpha),
    "LogTailedReLU": lambda x, alpha: np.where(x <= 0, alpha, np.where(x <= 1, 1.0, 1 / np.maximum(x, 1))),
    "Rect": lambda x, alpha: np.where(np.abs(x) < 1 / (2 * alpha), alpha, 0.0),
    "SquarewaveFourierSeries": lambda x, n, T_period: 4 / T_period * sum(
        np.cos((2 * i - 1) * 2 * np.pi / T_period * x) for i in range(1, int(n))) + 0 * x,
    "DeterministicPass": lambda x: np.ones_like(x),
}

INSTANCES = [cls() for name, cls in sg.SURROGATES.items() if name != "Custom"] + [
    sg.Sigmoid(alpha=2.5), sg.ATan(0.7), sg.PiecewiseQuadratic(alpha=2.0), sg.PiecewiseExp(alpha=3.0),
    sg.SoftSign(alpha=0.5), sg.SuperSpike(alpha=2.0), sg.NonzeroSignLogAbs(alpha=3.0), sg.Erf(alpha=0.5),
    sg.PiecewiseLeakyReLU(w=0.5, c=0.1), sg.S2NN(alpha=2.0, beta=0.5), sg.QPseudoSpike(alpha=3.5),
    sg.LeakyKReLU(leak=0.1, k=2.0), sg.FakeNumericalGradient(alpha=0.5), sg.LogTailedReLU(alpha=0.1),
    sg.Rect(alpha=2.0), sg.SquarewaveFourierSeries(n=4, T_period=5.0), sg.SquarewaveFourierSeries(n=1),
]
IDS = [repr(s) for s in INSTANCES]


def breaks(s: sg.Surrogate) -> list[float]:
    p = s.params
    table = {"PiecewiseQuadratic": lambda: [1 / p["alpha"]], "PiecewiseLeakyReLU": lambda: [p["w"]],
             "FakeNumericalGradient": lambda: [1 / p["alpha"]], "LogTailedReLU": lambda: [1.0],
             "Rect": lambda: [1 / (2 * p["alpha"])]}
    points = [0.0, *table.get(s.name, list)()]
    return sorted({b * sign for b in points for sign in (1, -1)})


def sample_points(s: sg.Surrogate) -> np.ndarray:
    near = [b + d for b in breaks(s) for d in (-1e-3, 1e-3)]
    return np.array(sorted({*np.linspace(-3.1, 3.1, 41).tolist(), *near, *breaks(s)}))


def test_table_lists_every_design_surrogate():
    assert set(FORMULAS) | {"Custom"} == set(sg.SURROGATES)


@pytest.mark.parametrize("s", INSTANCES, ids=IDS)
def test_gradient_matches_design_formula(s):
    points = sample_points(s)
    expected = FORMULAS[s.name](points, **s.params)
    got = evaluate(s.gradient(Z), {Z: torch.tensor(points, dtype=torch.float64)}).numpy()
    np.testing.assert_allclose(got, expected, rtol=1e-12, atol=1e-14)
    by_sympy = [float(s.gradient(Z).subs(Z, sympy.Float(p))) for p in points[::5]]
    np.testing.assert_allclose(by_sympy, expected[::5], rtol=1e-10)


def primitive_tolerance(s: sg.Surrogate) -> float:
    """How far a primitive's derivative may be from the gradient, relatively (and the primitive from continuous):
    S2NN's is SpikingJelly's, log(|x + 1| + 1e-5) for x >= 0, off by up to 1e-5 · beta."""
    return 2e-5 * max(1.0, s.params.get("beta", 1.0)) if s.name == "S2NN" else 1e-9


def _at_a_float(expr: sympy.Expr) -> Callable[[float], float]:
    """x -> expr at Z = x, as `float(expr.subs(Z, sympy.Float(x)))` gives it (mpmath at 53 bits), with the
    expression translated to mpmath once rather than substituted into at every point."""
    function = sympy.lambdify(Z, expr, "mpmath")
    return lambda x: float(function(mpmath.mpf(float(x))))


@pytest.mark.parametrize("s", INSTANCES, ids=IDS)
def test_primitive_derivative_is_gradient(s):
    prim = s.primitive(Z)
    if s.name in ("SuperSpike", "FakeNumericalGradient"):
        assert prim is None  # SpikingJelly documents no primitive for these
        return
    assert prim is not None
    derivative, gradient, primitive = (_at_a_float(e) for e in (sympy.diff(prim, Z), s.gradient(Z), prim))
    off_breaks = [p for p in sample_points(s) if min(abs(p - b) for b in breaks(s)) > 1e-6]
    for point in off_breaks:
        d, g = derivative(point), gradient(point)
        assert d == pytest.approx(g, rel=primitive_tolerance(s), abs=1e-12), point
    for b in breaks(s):  # the primitive is continuous across every break
        left, right = (primitive(b + d) for d in (-1e-9, 1e-9))
        assert left == pytest.approx(right, abs=max(1e-7, primitive_tolerance(s))), b


@pytest.mark.parametrize("s", [sg.Sigmoid(), sg.ATan(), sg.Erf(), sg.SoftSign()], ids=repr)
def test_smooth_primitives_symbolically(s):
    difference = sympy.diff(s.primitive(Z), Z) - s.gradient(Z)
    # Sigmoid's gradient holds |x|, which sympy simplifies after splitting it by sign (as a Piecewise)
    assert sympy.simplify(difference) == 0 or sympy.simplify(difference.rewrite(sympy.Piecewise)) == 0


@pytest.mark.parametrize("s", INSTANCES, ids=IDS)
def test_torch_forward_is_heaviside_and_backward_is_gradient(s):
    points = sample_points(s)
    x = torch.tensor(points, dtype=torch.float64, requires_grad=True)
    y = s(x)
    assert torch.equal(y, (x >= 0).to(torch.float64))
    upstream = torch.linspace(0.5, 1.5, len(points), dtype=torch.float64)
    y.backward(upstream)
    np.testing.assert_allclose(x.grad.numpy(), upstream.numpy() * FORMULAS[s.name](points, **s.params),
                               rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_torch_keeps_dtype(dtype):
    for s in INSTANCES[:14]:
        x = torch.linspace(-2, 2, 7, dtype=dtype).reshape(7, 1).expand(7, 3).clone().requires_grad_()
        y = s(x)
        y.sum().backward()
        assert y.dtype == dtype and x.grad.dtype == dtype and x.grad.shape == x.shape


def test_fake_numerical_gradient():
    s = sg.FakeNumericalGradient(alpha=0.3)
    x = torch.tensor([0.0, 1.0, 1 / 0.3, 4.0, -4.0, -10.0], dtype=torch.float64)
    g = s.torch_gradient(x)
    assert g.tolist() == pytest.approx([0.3, 0.3, 0.3, 0.25, 0.25, 0.1])


def test_log_tailed_relu():
    s = sg.LogTailedReLU(alpha=0.2)
    g = s.torch_gradient(torch.tensor([-2.0, 0.0, 0.5, 1.0, 2.0, 4.0], dtype=torch.float64))
    assert g.tolist() == pytest.approx([0.2, 0.2, 1.0, 1.0, 0.5, 0.25])
    assert sg.LogTailedReLU().torch_gradient(torch.tensor([-1.0])).item() == 0.0


def test_piecewise_leaky_relu_uses_half_over_w():
    # The primitive's slope in |x| <= w is 1/(2w), as SpikingJelly 2.0's torch code (not 1/w).
    s = sg.PiecewiseLeakyReLU(w=0.5, c=0.01)
    assert float(s.gradient(Z).subs(Z, 0)) == 1.0
    assert float(sympy.diff(s.primitive(Z), Z).subs(Z, 0.1)) == 1.0


@pytest.mark.parametrize(("cls", "kwargs", "param"), [
    (sg.Sigmoid, {"alpha": 0.0}, "alpha"), (sg.ATan, {"alpha": -1.0}, "alpha"),
    (sg.Sigmoid, {"alpha": float("nan")}, "alpha"), (sg.Sigmoid, {"alpha": float("inf")}, "alpha"),
    (sg.Sigmoid, {"alpha": True}, "alpha"), (sg.Sigmoid, {"alpha": "4"}, "alpha"),
    (sg.QPseudoSpike, {"alpha": 1.0}, "alpha"), (sg.PiecewiseLeakyReLU, {"w": 0.0}, "w"),
    (sg.FakeNumericalGradient, {"alpha": 0.0}, "alpha"), (sg.Sigmoid, {"beta": 1.0}, "beta"),
])
def test_parameter_validation(cls, kwargs, param):
    with pytest.raises(ValueError, match=param) as info:
        cls(**kwargs)
    assert isinstance(info.value, SpecError) and info.value.symbol == param


def test_positional_parameters():
    assert sg.PiecewiseLeakyReLU(0.5, 0.1).params == {"w": 0.5, "c": 0.1}
    with pytest.raises(TypeError):
        sg.Sigmoid(1.0, 2.0)


def test_equality_hash_key_and_frozen_copies():
    a, b = sg.Sigmoid(), sg.Sigmoid(alpha=4)
    assert a == b and hash(a) == hash(b) and a.key() == b.key() == ("Sigmoid", (("alpha", 4.0),))
    assert a != sg.Sigmoid(alpha=3.0) and a != sg.ATan(alpha=4.0)
    assert len({a, b, sg.ATan()}) == 2
    assert a.alpha == 4.0 and a.name == "Sigmoid" and repr(a) == "Sigmoid(alpha=4.0)"
    with pytest.raises(AttributeError):
        _ = a.beta
    with pytest.raises(AttributeError, match="no parameter 'beta'"):
        a.beta = 1.0
    a.params["alpha"] = 1.0  # a copy
    assert a.alpha == 4.0
    frozen = a.frozen()
    assert frozen == a and frozen is not a and frozen.frozen() is frozen and a.frozen() is frozen  # once a version
    with pytest.raises(AttributeError, match="frozen"):
        frozen.alpha = 1.0
    with pytest.raises(AttributeError, match="frozen"):
        frozen.set_spiking_mode(False)
    assert pickle.loads(pickle.dumps(frozen)).frozen() == frozen  # stays frozen
    assert pickle.loads(pickle.dumps(frozen)).frozen() is not frozen


def test_changes_as_spikingjelly_takes_them():
    """SpikingJelly's surrogates are changed in place (`sg.alpha = ...`, `set_spiking_mode`): so are ours, each
    change checked as the constructor checks it, and each taking a new version; a frozen copy keeps the values."""
    a = sg.ATan(alpha=2.0)
    before, kept = a.version, a.frozen()
    a.alpha = 5.0
    assert a == sg.ATan(alpha=5.0) and a.version != before and kept == sg.ATan(alpha=2.0)
    x = torch.tensor([0.3], dtype=torch.float64, requires_grad=True)
    a(x).sum().backward()
    assert x.grad.item() == pytest.approx(FORMULAS["ATan"](np.array([0.3]), alpha=5.0)[0], rel=1e-12)
    with pytest.raises(SpecError, match="alpha"):
        a.alpha = -1.0
    assert a.alpha == 5.0
    version = a.version
    a.set_spiking_mode(False)
    assert not a.spiking and a.version != version and a == sg.ATan(alpha=5.0, spiking=False)
    assert a(torch.tensor([0.0], dtype=torch.float64)).item() == pytest.approx(0.5)  # the primitive
    a.spiking = True
    assert a.spiking and a == sg.ATan(alpha=5.0)
    with pytest.raises(SpecError, match="non-spiking"):
        sg.SuperSpike().set_spiking_mode(False)
    with pytest.raises(AttributeError, match="Custom"):
        sg.Custom("alpha / (1 + abs(x))**2", alpha=2.0).alpha = 3.0
    copied = a.copy()
    copied.alpha = 1.0
    assert a.alpha == 5.0


def test_pickle_round_trip():
    for s in [*INSTANCES, sg.Custom("alpha / (1 + abs(x))**2", alpha=2.0)]:
        copy = pickle.loads(pickle.dumps(s))
        assert copy == s and hash(copy) == hash(s)


def test_from_spec_and_get_surrogate():
    assert sg.surrogate_from_spec("atan", {"alpha": 3.0}) == sg.ATan(alpha=3.0)
    assert sg.get_surrogate("Sigmoid") == sg.Sigmoid()
    assert sg.get_surrogate({"name": "S2NN", "beta": 2.0}) == sg.S2NN(beta=2.0)
    assert sg.get_surrogate({"gradient": "1 / (1 + abs(x))", "a": 1.0}).name == "Custom"
    with pytest.raises(SpecError, match="unknown surrogate"):
        sg.surrogate_from_spec("Nope", {})
    with pytest.raises(SpecError, match="gradient"):
        sg.surrogate_from_spec("Custom", {})
    with pytest.raises(SpecError, match="needs a 'name'"):
        sg.get_surrogate({"alpha": 1.0})


def test_get_surrogate_duck_types_spikingjelly_objects():
    fake = type("PiecewiseLeakyReLU", (), {"w": 0.5, "c": 0.2, "spiking": True})()
    assert sg.get_surrogate(fake) == sg.PiecewiseLeakyReLU(w=0.5, c=0.2)
    assert sg.get_surrogate(type("ATan", (), {"alpha": 3.0})()) == sg.ATan(alpha=3.0)
    assert sg.get_surrogate(type("Sigmoid", (), {"alpha": 4.0, "spiking": False})()) == sg.Sigmoid(spiking=False)
    with pytest.raises(SpecError, match="non-spiking"):  # no primitive: no non-spiking mode
        sg.get_surrogate(type("SuperSpike", (), {"alpha": 1.0, "spiking": False})())
    with pytest.raises(SpecError):
        sg.get_surrogate(object())


def test_custom_surrogate():
    c = sg.Custom("alpha / (1 + abs(x))**2", alpha=2.0)
    assert sympy.simplify(c.gradient(Z) - sg.SuperSpike(alpha=2.0).gradient(Z)) == 0
    assert c.primitive(Z) is None and c.params == {"alpha": 2.0} and c.name == "Custom"
    assert c == sg.Custom("alpha/(1+abs(x))**2", alpha=2.0) and c != sg.Custom("alpha / (1 + abs(x))**2", alpha=1.0)
    x = torch.linspace(-2, 2, 9, dtype=torch.float64, requires_grad=True)
    c(x).sum().backward()
    np.testing.assert_allclose(x.grad.numpy(), FORMULAS["SuperSpike"](x.detach().numpy(), 2.0))
    assert "Custom('alpha / (1 + abs(x))**2', alpha=2.0)" == repr(c)


@pytest.mark.parametrize(("text", "params"), [
    ("y", {}), ("__import__('os')", {}), ("x.real", {}), ("1", {"x": 1.0}), ("1", {"exp": 1.0}),
    ("a", {"a": float("nan")}),
])
def test_custom_refuses_bad_input(text, params):
    with pytest.raises(SpecError):
        sg.Custom(text, **params)


# ---- the sympy -> torch evaluator ----

a, b = sympy.symbols("a b", real=True)


def test_evaluate_broadcasts_and_keeps_dtype():
    ta = torch.arange(3, dtype=torch.float16).reshape(3, 1)
    tb = torch.ones(1, 4, dtype=torch.float16)
    out = evaluate(a * b + 2 * a - sympy.Rational(1, 2), {a: ta, b: tb})
    assert out.dtype == torch.float16 and out.shape == (3, 4)
    assert torch.equal(out, ta * tb + 2 * ta - 0.5)


def test_evaluate_scalars_and_mixed():
    assert evaluate(a + 1, {a: 2.0}).item() == 3.0
    assert evaluate(sympy.pi * a, {a: torch.tensor([1.0], dtype=torch.float64)}).item() == math.pi
    assert evaluate(sympy.E, {}).item() == pytest.approx(math.e)
    assert evaluate(sympy.exp(a), {a: 1000.0}).item() == math.inf


@pytest.mark.parametrize(("expr", "fn"), [
    (a**2, lambda x: x**2), (a**-1, lambda x: 1 / x), (a**-2, lambda x: x**-2.0),
    (sympy.sqrt(a), np.sqrt), (a ** sympy.Rational(3, 2), lambda x: x**1.5), (a**0.25, lambda x: x**0.25),
    (2**a, lambda x: 2.0**x), (a**a, lambda x: x**x), (sympy.exp(a), np.exp), (sympy.log(a), np.log),
    (sympy.Abs(a - 2), lambda x: np.abs(x - 2)), (sympy.sin(a), np.sin), (sympy.cos(a), np.cos),
    (sympy.tan(a), np.tan), (sympy.tanh(a), np.tanh), (sympy.atan(a), np.arctan),
    (expm1(a), np.expm1), (expm1(a * 1e-9), lambda x: np.expm1(x * 1e-9)),  # not exp(z) - 1: 1e-7 off there
    (sympy.erf(a), lambda x: np.array([math.erf(v) for v in x])), (sympy.sign(a - 1), lambda x: np.sign(x - 1)),
    (sympy.Min(a, 1, 2 * a), lambda x: np.minimum(np.minimum(x, 1), 2 * x)),
    (sympy.Max(a, 1), lambda x: np.maximum(x, 1)),
    (sympy.Heaviside(a - 1, 1), lambda x: (x >= 1).astype(float)),
    (sympy.Heaviside(a - 1), lambda x: np.where(x == 1, 0.5, (x > 1).astype(float))),
    (sympy.Piecewise((a, a < 1), (2 * a, a <= 2), (0, True)), lambda x: np.where(x < 1, x, np.where(x <= 2, 2 * x, 0))),
    (sympy.Piecewise((1, sympy.And(a > 0.5, a < 2)), (0, True)), lambda x: ((x > 0.5) & (x < 2)).astype(float)),
    (sympy.Piecewise((1, sympy.Or(a < 0.5, a >= 2)), (0, True)), lambda x: ((x < 0.5) | (x >= 2)).astype(float)),
    (sympy.Piecewise((1, a > 5), (3, True)), lambda x: np.where(x > 5, 1.0, 3.0)),
])
def test_evaluate_functions(expr, fn):
    points = np.array([0.25, 0.5, 1.0, 1.5, 2.0, 3.0])
    got = evaluate(expr, {a: torch.tensor(points, dtype=torch.float64)})
    assert got.dtype == torch.float64
    np.testing.assert_allclose(got.numpy(), fn(points), rtol=1e-12)


def test_evaluate_piecewise_of_scalars_keeps_dtype():
    out = evaluate(sympy.Piecewise((1, a > 0), (2, True)), {a: torch.tensor([-1.0, 1.0], dtype=torch.float64)})
    assert out.dtype == torch.float64 and out.tolist() == [2.0, 1.0]


def test_evaluate_memoises_common_subexpressions():
    big = sympy.exp(a + b)
    assert evaluate(big * big + big, {a: torch.tensor(0.0), b: 0.0}).item() == 2.0


def test_evaluate_refuses_unknown_nodes():
    with pytest.raises(TypeError, match="DiracDelta"):
        evaluate(sympy.DiracDelta(a), {a: torch.tensor(0.0)})
    with pytest.raises(TypeError, match="no value"):
        evaluate(a + b, {a: torch.tensor(0.0)})
    with pytest.raises(TypeError):
        evaluate(sympy.zoo * a, {a: torch.tensor(1.0)})


@pytest.mark.parametrize("s", [cls(spiking=False) for name, cls in sg.SURROGATES.items()
                               if name != "Custom" and cls._primitive is not sg.Surrogate._primitive], ids=repr)
def test_non_spiking_forward_is_the_primitive_and_backward_its_derivative(s):
    points = sample_points(s)
    x = torch.tensor(points, dtype=torch.float64, requires_grad=True)
    y = s(x)
    primitive = _at_a_float(s.primitive(Z))
    expected = [primitive(p) for p in points]
    np.testing.assert_allclose(y.detach().numpy(), expected, rtol=1e-12, atol=1e-14)
    y.sum().backward()
    off_breaks = np.array([min(abs(p - b) for b in breaks(s)) > 1e-6 for p in points])
    np.testing.assert_allclose(x.grad.numpy()[off_breaks], FORMULAS[s.name](points, **s.params)[off_breaks],
                               rtol=primitive_tolerance(s), atol=1e-12)


def test_non_spiking_mode_is_part_of_identity_and_pickles():
    on, off = sg.ATan(alpha=3.0), sg.ATan(alpha=3.0, spiking=False)
    assert on != off and on.key() != off.key() and not off.spiking and on.spiking
    assert repr(off) == "ATan(alpha=3.0, spiking=False)"
    assert pickle.loads(pickle.dumps(off)) == off
    with pytest.raises(TypeError, match="spiking"):
        sg.ATan(spiking="no")
    with pytest.raises(SpecError, match="non-spiking"):
        sg.SuperSpike(spiking=False)


def test_new_surrogates_parameters_are_checked():
    with pytest.raises(SpecError, match="n"):
        sg.SquarewaveFourierSeries(n=2.5)
    with pytest.raises(SpecError, match="from 1 to 256"):  # sympy writes each term: n = 100000 ran for minutes
        sg.SquarewaveFourierSeries(n=100000)
    series = sg.SquarewaveFourierSeries(n=256)
    with pytest.raises(SpecError, match="surrogate.n"):
        series.n = 257
    with pytest.raises(SpecError, match="T_period"):
        sg.SquarewaveFourierSeries(T_period=0.0)
    with pytest.raises(SpecError, match="alpha"):
        sg.Rect(alpha=-1.0)


@pytest.mark.parametrize("spiking", [True, False])
def test_a_surrogate_of_a_number_is_refused_naming_it(spiking):
    """Found by a fuzz of Python step functions: a step whose spike argument was a number (charge and threshold
    constants) failed inside the surrogate with "'bool' object has no attribute 'to'"."""
    with pytest.raises(TypeError, match=r"Sigmoid: expected a tensor, got the number 2\.0"):
        sg.Sigmoid(spiking=spiking)(2.0)

    def step(x, v, v_threshold=1.0):
        return sg.Sigmoid()(3.0 - 1.0), v + x

    from autocuda.spec.python import neuron
    with pytest.raises(TypeError, match="the spike's argument, h - threshold, must depend on the input or a state"):
        neuron(step)


@pytest.mark.parametrize("backend", ["reference", "host"])
def test_a_parameter_whose_gradient_no_dtype_represents_is_refused_by_the_surrogate(backend: str) -> None:
    """ATan(alpha=1e300) is a valid surrogate, but its gradient folds (pi/2 alpha)**2, beyond float64: the reference
    raised a bare OverflowError from its evaluator, the kernels named the spec's params."""
    from autocuda.call import functional as F
    from autocuda.spec.model import NeuronSpec

    spec = NeuronSpec(name="steep", params={"v_threshold": 1.0, "v_reset": 0.0}, states={"v": 0.0},
                      charge="v + x", surrogate=sg.ATan(alpha=1e300))
    x = torch.rand(3, 4, dtype=torch.float64, requires_grad=True)
    with pytest.raises(SpecError, match="field 'surrogate'.*1e\\+300"):
        F.multi_step(spec, x, backend=backend)[0].sum().backward()
