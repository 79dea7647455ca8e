"""What a new neuron's first use in a process does once, not again: a spec text parsed before is not built
again (for the same symbols and options of the names it uses), and the kernels of one derivation that differ in
layout share their common subexpressions (bench/flexsn_first_use.py times the whole first use)."""
from __future__ import annotations

import pytest
import sympy
import torch

from autocuda.base.errors import SpecError
from autocuda.codegen import builder, kernels, neuron_kernel
from autocuda.nn.flexsn import flexsn_spec
from autocuda.spec import parse
from autocuda.spec.load import load_spec
from autocuda.spec.surrogate import Sigmoid

X, V = sympy.Symbol("x", real=True), sympy.Symbol("v", real=True)


def test_a_text_parsed_before_is_not_built_again(monkeypatch: pytest.MonkeyPatch) -> None:
    builds = []
    bounded = parse.budget.bounded
    monkeypatch.setattr(parse.budget, "bounded", lambda *args, **kwargs: builds.append(args[1]) or bounded(*args,
                                                                                                          **kwargs))
    text = "min(max(x + 0.25 * v, -1.0), 4.5) + where(v > 1, x, 0)"
    first = parse.parse_expression(text, {"x": X, "v": V}, field="one")
    again = parse.parse_expression(text, {"x": X, "v": V, "a": sympy.Symbol("a", real=True)}, field="two")
    assert again == first and builds == ["one"]  # a name the text does not use changes nothing
    other = parse.parse_expression(text, {"x": sympy.Symbol("x"), "v": V}, field="three")  # another x
    assert other != first and builds == ["one", "three"]
    with pytest.raises(SpecError, match="unknown name 'v'"):  # an error is never taken from an earlier parse
        parse.parse_expression(text, {"x": X})


def test_an_option_of_the_text_is_part_of_what_was_parsed() -> None:
    text = "x if fast else v"
    assert parse.parse_expression(text, {"x": X, "v": V}, options={"fast": True}) == X
    assert parse.parse_expression(text, {"x": X, "v": V}, options={"fast": False}) == V


def test_kernels_of_two_layouts_share_their_common_subexpressions() -> None:
    spec = load_spec("alif")
    kernels.neuron_kernel(spec, "bptt", "float32")
    before = builder.shared_subexpressions.cache_info()
    kernels.neuron_kernel(spec, "bptt", "float32", unroll=4, replay=8)
    after = builder.shared_subexpressions.cache_info()
    assert after.hits > before.hits and after.misses == before.misses


def _clamp_where_step(x, v, a):  # min, max and where: a derivation of Piecewise and Heaviside terms
    h = torch.clamp(v + (x - v) / 2.0, -1.0, 4.0)
    s = Sigmoid(4.0)(h - (1.0 + a))
    return s, torch.where(h > 0.0, h, 0.1 * h), h * (1.0 - s), torch.clamp(0.9 * a + 0.1 * s, 0.0, 1.0)


@pytest.mark.parametrize("name", ["alif", "izhikevich", "liaf", "clamp_where"])
def test_a_derivation_prints_as_its_repr(name: str) -> None:
    """Kernel names are digests of a derivation's repr: its text printed with shared subexpressions is that repr
    (Floats at the top and inside included)."""
    spec = flexsn_spec(_clamp_where_step, 2).spec if name == "clamp_where" else load_spec(name)
    derivation = kernels._derivation(spec, spec.reset, False, ())
    neuron_kernel._text.cache_clear()
    neuron_kernel._SHARED.clear()
    assert neuron_kernel._text(derivation) == repr(derivation)
    neuron_kernel._SHARED.clear()  # a Float alone (full precision), then inside a product, and the other way
    value = (sympy.Float(0.25), sympy.Float(0.25) * X, sympy.Float(0.1) * X, sympy.Float(0.1), (X,), ())
    assert neuron_kernel.value_text(value) == repr(value)
