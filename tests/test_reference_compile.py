"""The reference path under torch.compile: no graph break (the sympy work is done before tracing), and the scalar
arithmetic of the reference's evaluator keeps torch's inf and nan without `Tensor.item()`."""
from __future__ import annotations

import math
import warnings

import pytest
import sympy
import torch
from conftest import examples
from sympy.codegen.cfunctions import expm1

import autocuda
from autocuda.nn import LIFNode, Neuron
from autocuda.spec.torch_eval import evaluate, prepare_expression

X = sympy.Symbol("x", real=True)
# Time steps of the multi-step calls traced (Dynamo unrolls the reference's loop: its trace grows with each step): by
# default two, the fewest where a step reads the state another step left; with --slow each test's own count.
STEPS = 2


def compiled_training_call(module: torch.nn.Module, x: torch.Tensor) -> tuple:
    """`module` compiled whole (a graph break raises, naming its reason) and its output on x after a backward of its
    sum, with no Dynamo warning on the way (one would say, e.g., that an lru_cache was traced through)."""
    torch._dynamo.reset()
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        got = compiled(x)
        got.sum().backward()
    assert not [str(w.message) for w in caught if "Dynamo" in str(w.message)]
    return compiled, got


@pytest.mark.parametrize("step_mode", ["m", "s"])
def test_layers_on_the_reference_compile_without_graph_breaks_or_warnings(step_mode: str) -> None:
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(6, 6), LIFNode(step_mode=step_mode, backend="reference"))
    x = torch.randn(examples(3, STEPS), 2, 6) * 3 if step_mode == "m" else torch.randn(2, 6)
    expected = net(x)
    assert step_mode == "s" or expected.sum() > 0  # a spike: the reset's path is in the graph
    expected.sum().backward()
    expected_grad = net[0].weight.grad.clone()
    net.zero_grad()
    net[1].reset()
    compiled, got = compiled_training_call(net, x)
    assert torch.equal(got, expected)
    torch.testing.assert_close(net[0].weight.grad, expected_grad)
    net[1].reset()
    with torch._dynamo.config.patch(error_on_recompile=True):  # tracing changed nothing its guards read
        assert torch.equal(compiled(x), expected)


@pytest.mark.parametrize("name", ["liaf", "stbif"])
def test_a_layer_whose_output_is_an_expression_compiles_whole(name: str) -> None:
    """An output computed from the kernels' sequences by the spec's expression (LIAF's reads the membrane, STBIF's
    only the spike): its program is the layer's, taken when it was built, so the call's trace reads neither the
    disk cache nor sympy."""
    torch.manual_seed(0)
    layer = Neuron(name, step_mode="m", backend="reference")
    x = torch.randn(examples(4, STEPS), 2, 6, requires_grad=True)
    expected = layer(x)
    expected.sum().backward()
    expected_grad, x.grad = x.grad, None
    layer.reset()
    _, got = compiled_training_call(layer, x)
    assert torch.equal(got, expected)
    torch.testing.assert_close(x.grad, expected_grad)


@pytest.mark.parametrize(("expr", "value", "expected"), [
    (sympy.exp(X), 1000.0, math.inf),            # overflow: inf, as torch gives on tensors
    (sympy.log(X), 0.0, -math.inf),
    (sympy.log(X), -1.0, math.nan),
    (sympy.sqrt(X), -1.0, math.nan),
    (1 / X, 0.0, math.inf),
    (X ** sympy.Rational(1, 3), -8.0, math.nan),  # a negative base's fractional power
    (sympy.Pow(X, 2.5), 4.0, 32.0),
    (sympy.sin(X), math.inf, math.nan),
    (sympy.sign(X), -3.0, -1.0),
    (sympy.sign(X), 0.0, 0.0),
    (expm1(X), 1e-10, 1e-10),
    (sympy.erf(X), 0.5, math.erf(0.5)),
])
def test_scalar_arithmetic_matches_torch_on_tensors(expr: sympy.Expr, value: float, expected: float) -> None:
    scalar = evaluate(expr, {X: value})
    tensor = evaluate(expr, {X: torch.tensor(value, dtype=torch.float64)})
    torch.testing.assert_close(scalar, torch.tensor(expected, dtype=torch.float32), equal_nan=True)
    torch.testing.assert_close(tensor.float(), scalar, equal_nan=True)


def test_expressions_compile_whole() -> None:
    """Every kind of number and the integer powers, under fullgraph (the sympy nodes are prepared first)."""
    expr = prepare_expression(sympy.Float(0.1) * X + sympy.pi * X ** 2 - sympy.E / (1 + X ** 2) ** 3
                              + sympy.Heaviside(X, sympy.Rational(1, 2)) + sympy.Rational(1, 3) + 2 * sympy.sqrt(2))
    t = torch.tensor([-1.5, 0.0, 0.25, 2.0], dtype=torch.float64)
    torch._dynamo.reset()
    compiled = torch.compile(lambda v: evaluate(expr, {X: v}), fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(t), evaluate(expr, {X: t}), rtol=0, atol=0)
    expected = 0.1 * t + math.pi * t**2 - math.e / (1 + t**2) ** 3 + torch.tensor([0, 0.5, 1, 1]) + 1 / 3 \
        + 2 * math.sqrt(2)
    torch.testing.assert_close(evaluate(expr, {X: t}), expected)


def test_symbols_are_matched_by_name_under_compile() -> None:
    """A value given under an equal but distinct symbol object (sympy makes one after its cache is cleared,
    e.g. by simplify) is found in a compiled call as in an eager one."""
    from sympy.core.cache import clear_cache

    expr = prepare_expression(2 * sympy.Symbol("y_eval") + 1)
    clear_cache()
    twin = sympy.Symbol("y_eval")
    assert twin == expr.free_symbols.pop()
    t = torch.tensor([0.5, 2.0], dtype=torch.float64)
    torch._dynamo.reset()
    compiled = torch.compile(lambda v: evaluate(expr, {twin: v}), fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(t), 2 * t + 1, rtol=0, atol=0)


def test_a_layer_compiled_before_any_eager_call_traces_whole() -> None:
    """The first call of a new layer is the traced one: its plan's derivation and symbols are constants to Dynamo
    (not traced through, nor through the lock Python < 3.12's cached_property takes)."""
    torch._dynamo.reset()
    spec = autocuda.load_spec("lif").with_defaults(tau=3.25)  # a spec, so a plan, that no other test built
    layer = Neuron(spec, step_mode="m", backend="reference")
    x = torch.rand(examples(4, STEPS), 3, requires_grad=True)
    got = torch.compile(layer, fullgraph=True, backend="aot_eager")(x)
    got.sum().backward()
    layer.reset()
    y = x.detach().requires_grad_()
    expected = layer(y)
    expected.sum().backward()
    assert torch.equal(got, expected) and torch.equal(x.grad, y.grad)


def test_a_compiled_reference_call_evaluates_programs_not_the_walk(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reference's step, its surrogate's gradient and a primitive surrogate are evaluated under torch.compile by
    the flat programs their layer prepared (`spec.flat.run`), the same ops eager runs: Dynamo never walks a sympy
    tree (a walk traced here raises, and fullgraph turns that into a failed compile)."""
    from autocuda.spec import surrogate as sg
    from autocuda.spec import torch_eval

    def no_walk(*_: object) -> torch.Tensor:
        raise AssertionError("the sympy walk was traced")

    torch.manual_seed(0)
    for surrogate in (sg.Sigmoid(), sg.ATan(spiking=False)):
        layer = LIFNode(step_mode="m", backend="reference", surrogate_function=surrogate)
        x = (torch.randn(examples(3, STEPS), 2, 5) * 3).requires_grad_()
        expected = layer(x)
        expected.sum().backward()
        expected_grad, x.grad = x.grad, None
        layer.reset()
        with monkeypatch.context() as patched:
            patched.setattr(torch_eval, "_walk", no_walk)
            _, got = compiled_training_call(layer, x)
        assert torch.equal(got, expected)
        torch.testing.assert_close(x.grad, expected_grad)
