"""autocuda.spec.flat: an expression lowered to a flat program evaluates, without sympy, to exactly what the walk
over the expression (`torch_eval.walk`) gives (dtype, values, nan and inf included), and `torch_eval.evaluate` runs
the program outside a torch.compile trace; a program read back is checked instruction by instruction; FlexSN keeps
its expression outputs' programs on disk."""
from __future__ import annotations

import math

import pytest
import sympy
import torch
from conftest import examples
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from autocuda.base.errors import SpecError
from autocuda.nn import FlexSN, flexsn
from autocuda.spec import flat
from autocuda.spec.parse import parse_expression
from autocuda.spec.surrogate import Sigmoid
from autocuda.spec.torch_eval import evaluate, lower, walk
from autocuda.toolchain import store

NAMES = ("x", "v", "s", "p")
SYMBOLS = {n: sympy.Symbol(n, real=True) for n in NAMES}
_UNARY = ("exp", "log", "sqrt", "abs", "sin", "cos", "tanh", "atan", "sigmoid", "erf", "heaviside")
_NUMBERS = st.sampled_from(["0", "1", "2", "0.5", "-1.5", "3", "1e-3", "pi", "e"])


def _expressions() -> st.SearchStrategy[str]:
    """Texts of the spec language over NAMES: operators, every function, min/max and where."""
    leaves = st.one_of(st.sampled_from(NAMES), _NUMBERS)

    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.tuples(inner, st.sampled_from(["+", "-", "*", "/"]), inner).map(lambda t: f"({t[0]} {t[1]} {t[2]})"),
            st.tuples(inner, st.sampled_from(["2", "3", "-1", "0.5", "-2", "1.5"])).map(lambda t: f"({t[0]})**{t[1]}"),
            st.tuples(st.sampled_from(_UNARY), inner).map(lambda t: f"{t[0]}({t[1]})"),
            st.tuples(st.sampled_from(["min", "max"]), inner, inner).map(lambda t: f"{t[0]}({t[1]}, {t[2]})"),
            st.tuples(inner, st.sampled_from(["<", "<=", ">", ">="]), inner, inner, inner).map(
                lambda t: f"where({t[0]} {t[1]} {t[2]}, {t[3]}, {t[4]})"),
            st.tuples(inner, inner).map(lambda t: f"-{t[0]} + {t[1]}"))
    return st.recursive(leaves, extend, max_leaves=8)


KINDS = ("finite", "special", "mixed", "scalars")


def _values(kind: str) -> dict[str, torch.Tensor | float]:
    """float32 tensors (finite, or with inf and nan), float32 and float64 mixed, or Python floats alone."""
    special = torch.tensor([0.0, -0.0, 1.0, -1.0, 2.5, -3.0, 1e-3, 40.0, -90.0, 0.5, -0.5, 3.0])
    if kind != "finite":
        special[-3:] = torch.tensor([math.inf, -math.inf, math.nan])
    if kind == "scalars":
        return {"x": 0.7, "v": -1.25, "s": 1.0, "p": 2.0}
    v = special.roll(1).to(torch.float64 if kind == "mixed" else torch.float32)
    return {"x": special.to(torch.float32), "v": v, "s": (special > 0).to(torch.float32), "p": 0.5}


def _same(a: torch.Tensor, b: torch.Tensor) -> None:
    """Equal dtype, shape, values, nan and signs of zeros."""
    assert a.dtype == b.dtype and a.shape == b.shape and a.device == b.device
    torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True)
    if a.is_floating_point():
        assert torch.equal(torch.signbit(a) | a.isnan(), torch.signbit(b) | b.isnan())


def _check_text(text: str, kind: str) -> None:
    expr = parse_expression(text, SYMBOLS)
    values = _values(kind)
    expected = walk(expr, {SYMBOLS[n]: v for n, v in values.items()})
    _same(flat.run(flat.from_json(flat.to_json(lower(expr)), NAMES), values), expected)
    _same(evaluate(expr, {SYMBOLS[n]: v for n, v in values.items()}), expected)  # which runs the program


# Every operation of the language alone, on tensors and on numbers.
OPERATIONS = [*(f"{f}(x * v - 0.5)" for f in ("exp", "log", "sqrt", "abs", "sin", "cos", "tan", "tanh", "atan",
                                             "sigmoid", "erf", "heaviside")),
              "heaviside(x)", "x**2", "x**3", "x**-2", "x**0.5", "x**-1", "x**1.5", "2**x", "p**x", "x**v",
              "min(x, v)", "max(x, 0.5)", "min(1, x, v)", "max(p, 2)", "where(x < v, x, 2)", "where(x >= 0, 1, 2)",
              "where(p > 1, x, v)", "x - v", "x / v", "-x", "0 * x", "x * v * p * s", "pi * x + e"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("text", OPERATIONS)
def test_each_operation_evaluates_as_the_expression(text: str, kind: str) -> None:
    _check_text(text, kind)


@settings(max_examples=examples(400, 60), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=_expressions(), kind=st.sampled_from(KINDS))
def test_a_lowered_program_evaluates_as_the_expression(text: str, kind: str) -> None:
    try:
        parse_expression(text, SYMBOLS)
    except SpecError:
        assume(False)  # out of the language's bounds (a number too large, log of a negative constant, ...)
    _check_text(text, kind)


def test_evaluate_runs_the_lowered_program_once_lowered_and_walks_under_a_trace(monkeypatch) -> None:
    """Outside a trace `evaluate` lowers an expression once and runs its program (the walk is not taken); under a
    torch.compile trace it walks; a missing value is named by the walk either way."""
    from autocuda.spec import torch_eval

    x, v = SYMBOLS["x"], SYMBOLS["v"]
    expr = sympy.exp(x * v) + sympy.Max(x, v)
    values = {x: torch.linspace(-1, 1, 5, dtype=torch.float64), v: 0.25}
    expected = walk(expr, values)
    walked: list[int] = []
    original = torch_eval._Walker.eval
    monkeypatch.setattr(torch_eval._Walker, "eval", lambda self, e: walked.append(1) or original(self, e))
    torch_eval._lowered.cache_clear()
    _same(evaluate(expr, values), expected)
    _same(evaluate(expr, values), expected)
    assert not walked and torch_eval._lowered.cache_info().misses == 1
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    _same(evaluate(expr, values), expected)
    assert walked
    monkeypatch.undo()
    with pytest.raises(TypeError, match="no value given for symbol v"):
        evaluate(expr, {x: values[x]})


def test_numbers_and_logic_round_trip_exactly() -> None:
    x, v = SYMBOLS["x"], SYMBOLS["v"]
    expr = sympy.Piecewise((sympy.Rational(1, 3) * x, sympy.And(x > 0, sympy.Not(v < 1))),
                           (sympy.oo, sympy.Or(x < -1, v > 2)), (sympy.pi * v, True)) \
        + sympy.Heaviside(x, 1) + sympy.sign(v)
    program = lower(expr)
    values = _values("finite")
    _same(flat.run(flat.from_json(flat.to_json(program), NAMES), values),
          walk(expr, {SYMBOLS[n]: u for n, u in values.items()}))


@pytest.mark.parametrize("program, problem", [
    ([], "1 to"),
    ([["symbol", "y"]], "a symbol of"),
    ([["symbol", "x"], ["add", 0, 1]], "earlier indices"),
    ([["symbol", "x"], ["exp", -1]], "one earlier index"),
    ([["number", "1.0"]], "one number"),
    ([["number", math.nan]], "one number"),
    ([["symbol", "x"], ["pow", 0, 0, "cube"]], "how expected"),
    ([["symbol", "x"], ["piecewise", 0]], "pieces and conditions"),
    ([["symbol", "x"], ["getattr", 0]], "unknown operation"),
    ("x + 1", "a list"),
])
def test_a_program_read_back_is_checked(program: object, problem: str) -> None:
    with pytest.raises(ValueError, match=problem):
        flat.check(program, NAMES)
    with pytest.raises(ValueError):
        flat.from_json(str(program).encode(), NAMES)


_SPIKE = Sigmoid(4.0)


def _expression_core(x, v):  # outputs: the spike, an expression (the clamped charge), the new state
    h = torch.clamp(v + (x - v) / 2.0, -1.0, 3.0)
    s = _SPIKE(h - 1.0)
    return s, torch.where(h > 0.5, h, 0.2 * x), h * (1.0 - s)


def test_flexsn_keeps_an_expression_outputs_program(tmp_path, monkeypatch) -> None:
    """A layer whose output is an expression lowers it once: a later process reads the program (no sympy), and a
    damaged entry is refused and written again."""
    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(tmp_path / "cache"))
    x = torch.rand(5, 7, dtype=torch.float64) * 3

    def outputs() -> tuple[torch.Tensor, ...]:
        flexsn._output_program.cache_clear()  # as a new process would
        return FlexSN(_expression_core, 1, backend="reference")(x)

    first = outputs()
    step = flexsn.flexsn_spec(_expression_core, 1)
    [text] = [o.expr for o in step.outputs if o.kind == "expression"]
    key = store.key("flexsn output program " + repr((flexsn._output_names(step), text)))
    assert flat.from_json(store.read(flexsn.KIND, key) or b"", flexsn._output_names(step))

    def refuse(expr: object) -> None:
        raise AssertionError("lowered again, though the program is on disk")
    monkeypatch.setattr("autocuda.spec.torch_eval.lower", refuse)
    for a, b in zip(outputs(), first):
        _same(a, b)
    monkeypatch.undo()
    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(tmp_path / "cache"))
    store.save(flexsn.KIND, key, b'[["symbol", "__import__"]]')
    for a, b in zip(outputs(), first):
        _same(a, b)
    assert flat.from_json(store.read(flexsn.KIND, key) or b"", flexsn._output_names(step))


@pytest.mark.parametrize("threshold_related", [True, False])
def test_a_layer_output_expression_is_kept_as_a_program(threshold_related: bool, tmp_path, monkeypatch) -> None:
    """A spec's output expression (LIAF's) evaluates from its program as from the parsed expression; a later
    process reads the program from disk (no sympy)."""
    from autocuda.nn import output
    from autocuda.spec.load import load_spec

    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(tmp_path / "cache"))
    spec = load_spec("liaf").with_options(threshold_related=threshold_related)
    torch.manual_seed(0)
    x, spike = torch.randn(4, 6, dtype=torch.float64), (torch.rand(4, 6) > 0.5).double()
    after = {s.name: torch.randn(4, 6, dtype=torch.float64) for s in spec.states}
    params = {p.name: (None if p.name == "v_reset" else float(p.default)) for p in spec.params}
    parsed = spec.parsed()
    expected = walk(parsed.expand(parsed.output), {
        **dict(zip(parsed.inputs, (x,))), parsed.s: spike,
        **{symbol: after[n] for n, symbol in parsed.state_symbols.items()},
        **{symbol: 0.0 if params[n] is None else params[n] for n, symbol in parsed.param_symbols.items()}})
    output._program.cache_clear()  # as a new process would: the program is lowered and stored here
    got = output.layer_output(spec, output.spec_output(spec), x, spike, after, params)
    _same(got, expected)
    output._program.cache_clear()  # as a new process would

    def refuse(expr: object) -> None:
        raise AssertionError("lowered again, though the program is on disk")
    monkeypatch.setattr("autocuda.spec.torch_eval.lower", refuse)
    monkeypatch.setattr(type(spec), "parsed", refuse)  # nor parsed: a process with the program needs no sympy
    _same(output.layer_output(spec, output.spec_output(spec), x, spike, after, params), expected)


def test_a_sequence_keeps_state_sequences_only_where_the_output_reads_a_state(monkeypatch) -> None:
    """STBIF's output (`s * q_threshold`) reads no state: its multi-step call asks the kernels for no state sequences
    and returns the same output; LIAF's reads its membrane and keeps them."""
    from autocuda.nn import Neuron, layer_call, output

    asked: list[bool] = []
    run = layer_call.F.run_sequence

    def spy(*args, **kwargs):
        asked.append(args[7])  # store_state_seq
        return run(*args, **kwargs)

    monkeypatch.setattr(layer_call.F, "run_sequence", spy)
    x = torch.randn(5, 7, dtype=torch.float64) * 2
    for name, reads in (("stbif", False), ("liaf", True)):
        layer = Neuron(name, step_mode="m", backend="reference")
        kind = output.spec_output(layer.spec)
        assert output.reads_states(layer.spec, kind, output.output_program(layer.spec, kind)) is reads
        got = layer(x)
        assert asked[-1] is reads
        spikes, _, seqs = layer_call.F.multi_step(name, x, store_state_seq=True, backend="reference")
        after = dict(zip((s.name for s in layer.spec.states), seqs))
        params = {p.name: float(p.default) if p.default is not None else None for p in layer.spec.params}
        _same(got, output.layer_output(layer.spec, output.spec_output(layer.spec), x, spikes, after, params))
