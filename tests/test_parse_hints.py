"""Refused syntax that the language can say another way: the message says how."""
from __future__ import annotations

import pytest

from autocuda import NeuronSpec, SpecError


@pytest.mark.parametrize(("charge", "suggestion"), [
    ("v + (v > 1)", "where(v > 1, a, b)"),
    ("v + x * (x <= 0.5)", "where(x <= 0.5, a, b)"),
])
def test_a_comparison_outside_where_suggests_where(charge: str, suggestion: str) -> None:
    with pytest.raises(SpecError, match="comparison not allowed in an expression") as error:
        NeuronSpec(name="demo", charge=charge, params={"v_threshold": 1.0, "v_reset": 0.0}, states={"v": 0.0})
    assert suggestion in str(error.value) and error.value.field == "charge"


def test_the_suggestion_is_valid() -> None:
    spec = NeuronSpec(name="demo", charge="v + where(v > 1, 0.5, x)", params={"v_threshold": 1.0, "v_reset": 0.0},
                      states={"v": 0.0})
    assert spec.charge
