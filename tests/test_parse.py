"""The expression whitelist: valid text becomes the right sympy, everything else is a SpecError naming it."""
from __future__ import annotations

import pytest
import sympy
from conftest import examples
from hypothesis import given, settings
from hypothesis import strategies as st

from autocuda.base.errors import SpecError
from autocuda.spec import parse
from autocuda.spec.parse import FUNCTIONS, check_identifier, parse_expression

x, v, w, tau = sympy.symbols("x v w tau", real=True)
SYMBOLS = {"x": x, "v": v, "w": w, "tau": tau}
OPTIONS = {"decay_input": True, "soft": False}


def p(text: str, options=OPTIONS) -> sympy.Expr:
    return parse_expression(text, SYMBOLS, source="test.toml", field="charge", options=options)


def same(a: sympy.Expr, b: sympy.Expr) -> bool:
    return a == b or sympy.simplify(a - b) == 0


VALID = [
    ("x", x),
    ("v + (x - v) / tau", v + (x - v) / tau),
    ("-v ** 2 * 3", -3 * v**2),
    ("+x - -v", x + v),
    ("2 * pi * e", 2 * sympy.pi * sympy.E),
    ("1.5e-3 * x", sympy.Float(1.5e-3) * x),
    ("0x10 + 1_000", sympy.Integer(1016)),
    ("exp(v) + log(tau) + sqrt(tau) + abs(v)", sympy.exp(v) + sympy.log(tau) + sympy.sqrt(tau) + sympy.Abs(v)),
    ("sin(x) * cos(x) + tan(x) - tanh(v) + atan(w) + erf(v)",
     sympy.sin(x) * sympy.cos(x) + sympy.tan(x) - sympy.tanh(v) + sympy.atan(w) + sympy.erf(v)),
    ("sigmoid(w)", 1 / (1 + sympy.exp(-w))),
    ("heaviside(v - 1)", sympy.Heaviside(v - 1, 1)),
    ("min(x, v)", sympy.Min(x, v)),
    ("max(x, v, 0)", sympy.Max(x, v, 0)),
    ("where(v >= 1, x, 0)", sympy.Piecewise((x, v >= 1), (0, True))),
    ("where(v < w, x, v)", sympy.Piecewise((x, v < w), (v, True))),
    ("where(1 < 2, x, v)", x),
    ("x ** 0.5", x ** sympy.Float(0.5)),
    ("2 ** 10", sympy.Integer(1024)),
    ("10 ** -3", sympy.Rational(1, 1000)),
    ("x if decay_input else v", x),
    ("x if soft else v", v),
    ("(x if soft else v) + (1 if decay_input else 2)", v + 1),
    ("  v + x  ", v + x),
]


@pytest.mark.parametrize(("text", "expected"), VALID)
def test_valid_expressions(text, expected):
    assert same(p(text), expected)


def test_symbols_are_the_callers_objects():
    assert p("tau").free_symbols == {tau}


def test_heaviside_is_one_at_zero():
    assert p("heaviside(v)").subs(v, 0) == 1


ATTACKS = [
    ("__import__('os')", "__import__"),
    ('x); asm("trap");//', None),
    ("().__class__", None),
    ("x.real", "x.real"),
    ("x[0]", "x[0]"),
    ("lambda: 1", "lambda"),
    ("[i for i in x]", "[i for i in x]"),
    ("'a'", "'a'"),
    ("b'a'", "b'a'"),
    ("f'{x}'", None),
    ("exec('1')", "exec"),
    ("eval('1')", "eval"),
    ("open", "open"),
    ("x(1)", "x"),
    ("exp.__call__(1)", None),
    ("(lambda: 1)()", None),
    ("getattr(x, 'y')", "getattr"),
    ("exp(*x)", None),
    ("exp(x=1)", "exp"),
    ("exp(x, v)", "exp"),
    ("min(x)", "min"),
    ("exp", "exp"),
    ("(y := 1)", None),
    ("x and v", None),
    ("not x", None),
    ("~x", None),
    ("x % 2", "%"),
    ("x // 2", "//"),
    ("x @ v", "@"),
    ("x << 1", "<<"),
    ("x < 1", "x < 1"),
    ("where(x, 1, 2)", "x"),
    ("where(x < v < w, 1, 2)", None),
    ("where(x == v, 1, 2)", None),
    ("(x, v)", None),
    ("[x]", None),
    ("{x: 1}", None),
    ("{x}", None),
    ("True", "True"),
    ("None", "None"),
    ("1j", "1j"),
    ("...", None),
    ("1e400", "1e400"),
    ("1e31", "1e31"),
    ("1" + "0" * 31, None),
    ("10**100000", None),
    ("9**9**9", None),
    ("2**200", None),
    ("1/0", "1/0"),
    ("x/0", "x/0"),
    ("log(0)", None),
    ("sqrt(-1)", None),
    ("(-8) ** 0.5", None),
    ("ß + x", "ß"),
    ("ｘ", "ｘ"),
    ("x\u200b", None),
    ("int", "int"),
    ("threadIdx", "threadIdx"),
    ("x if y else v", "y"),
    ("x if v > 0 else v", None),
    ("decay_input", "decay_input"),
    ("x +", None),
    ("", None),
    ("   ", None),
    ("x\0", None),
    ("x = 1", None),
    ("import os", None),
    ("x; v", None),
    ("await x", None),
    ("x[1:2]", None),
]


@pytest.mark.parametrize(("text", "symbol"), ATTACKS)
def test_attacks_are_refused(text, symbol):
    with pytest.raises(SpecError) as info:
        p(text)
    err = info.value
    assert err.source == "test.toml" and err.field == "charge"
    assert str(err).startswith("test.toml: field 'charge': ")
    if symbol is not None:
        assert err.symbol is not None and symbol in err.symbol


def test_unknown_name_lists_known_names():
    with pytest.raises(SpecError, match=r"unknown name 'foo' \(known: x, v, w, tau, pi, e\)") as info:
        p("v + foo")
    assert info.value.symbol == "foo"


@pytest.mark.parametrize("text", [
    "(" * 10000 + "x" + ")" * 10000,
    "-(" * 10000 + "x" + ")" * 10000,
    "-" * 10000 + "x",
    "+-" * 5000 + "x",
    "exp(" * 5000 + "x" + ")" * 5000,
    "x" + "+x" * 10000,
    "x" + "**x" * 10000,
])
def test_deep_nesting_is_a_spec_error(text, monkeypatch):
    with pytest.raises(SpecError):
        p(text)
    monkeypatch.setattr(parse, "MAX_TEXT", 10**6)  # the depth checks must hold on their own
    with pytest.raises(SpecError):
        p(text)


def test_moderately_deep_is_fine():
    assert same(p("-" * 40 + "x"), x)
    assert same(p("(" * 30 + "x" + ")" * 30), x)


def test_long_text_refused():
    with pytest.raises(SpecError, match="longer than"):
        p("x + " * 600 + "x")


def test_non_string_refused():
    with pytest.raises(SpecError):
        p(3)  # type: ignore[arg-type]


# C names too: generated C spells every user name behind a prefix (cnames.c_name); tests/test_security_names.py
# compiles and runs kernels with such names.
@pytest.mark.parametrize("name", ["v", "tau", "v_reset", "a0", "R", "theta_rh", "delta_T", "w" * 32, "int", "float",
                                  "half2", "threadIdx", "blockDim", "warpSize", "expf", "fabs", "pow", "index", "t",
                                  "numel", "dt", "uint4", "float4", "dim3", "xor", "M_LN2", "INT_MAX", "usr_v"])
def test_identifiers_accepted(name):
    assert check_identifier(name) == name


@pytest.mark.parametrize("name", [
    "if", "return", "lambda", "None", "exp", "sqrt", "min", "max", "abs", "sigmoid", "where", "heaviside", "pi",
    "e", "ac_v", "ac_", "T", "N", "_v", "__v", "v__w", "1v", "v-w", "v w", "", "ß", "vé", "w" * 33, 3, None,
    "x_seq", "spike_seq", "h_seq", "v_init", "w_final", "grad_tau", "v_checkpoints",
])
def test_identifiers_refused(name):
    with pytest.raises(SpecError) as info:
        check_identifier(name, source="f.toml", field="params.x")
    assert info.value.field == "params.x" and info.value.source == "f.toml"


def test_every_function_is_parsable():
    for name, (low, _high, _fn) in FUNCTIONS.items():
        args = ["v < 1"] + ["x"] * (low - 1) if name == "where" else ["x"] * low
        assert isinstance(p(f"{name}({', '.join(args)})"), sympy.Basic)


TOKENS = ["x", "v", "tau", "1", "2.5", "1e30", "+", "-", "*", "/", "**", "(", ")", ",", "exp", "where", "<",
          ">=", "if", "else", "decay_input", "lambda", ":", ".", "[", "]", "'", "__import__", "min", "9", "==",
          "not", "and", "foo", " "]


@settings(deadline=2000, max_examples=examples(300, 100))
@given(st.text(max_size=80))
def test_random_text_only_spec_errors(text):
    try:
        p(text)
    except SpecError:
        pass


@settings(deadline=2000, max_examples=examples(400, 150))  # each token drawn ~60 times by default
@given(st.lists(st.sampled_from(TOKENS), max_size=30))
def test_token_soup_only_spec_errors(tokens):
    try:
        result = p(" ".join(tokens))
    except SpecError:
        return
    assert isinstance(result, sympy.Expr)
    assert result.free_symbols <= set(SYMBOLS.values())
