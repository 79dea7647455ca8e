"""Multi-level spikes ([[levels]]): a user's spec with weights other than 1, a level's own surrogate and a
state in a level's argument, on the generated kernels (host runner) against the reference; bad levels refused
naming the field; a spec without levels keeps its text (cache keys)."""
from __future__ import annotations

import pytest

from autocuda.base.errors import SpecError
from autocuda.spec.load import load_spec, spec_from_toml
from autocuda.spec.model import Level, NeuronSpec, spec_text
from autocuda.spec.surrogate import ATan
from autocuda.toolchain.host import cxx as toolchain
from autocuda.tools.testing import check_spec

USER = NeuronSpec(
    name="user_levels", charge="v + x", threshold="v_threshold",
    params={"v_threshold": 1.0, "v_reset": 0.0, "rho": 0.7}, states={"v": "v_reset", "a": 0.0},
    updates={"a": "rho * a + s"},
    levels=[Level("h - v_threshold - 0.2 * a", 2.0), Level("-h - v_threshold", -0.5, ATan(3.0))])


@pytest.mark.skipif(toolchain.missing() is not None, reason=f"host runner: {toolchain.missing()}")
def test_a_users_levels_on_the_kernels() -> None:
    report = check_spec(USER, dtypes=("float64", "float32"), resets=("hard", "soft"), examples=2,
                        raise_on_failure=True)
    assert len(report.cases) == 16  # 2 dtypes x 2 resets x 2 detach_reset x 2 examples
    assert any(case.ambiguous == 0 and case.neurons > 1 for case in report.cases)


TOML = '''{}
name = "bad"
charge = "v + x"
reset = "soft"
[params]
v_threshold = 1.0
[states]
v = 0.0
'''


@pytest.mark.parametrize(("levels", "field"), [
    ("levels = []\n", "levels"),
    ("[[levels]]\nweight = 1.0", "levels[0].argument"),
    ("[[levels]]\nargument = \"h - 1\"\nweight = 0.0", "levels[0].weight"),
    ("[[levels]]\nargument = \"h - 1\"\nweight = \"one\"", "levels[0].weight"),
    ("[[levels]]\nargument = \"h - 1\"\nsurrogate = { name = \"Nope\" }", "levels[0].surrogate.name"),
    ("[[levels]]\nargument = \"h - 1\"\n[[levels]]\nargument = \"x - 1\"", "levels[1].argument"),
    ("[[levels]]\nargument = \"h - 1\"\nsign = 1", "levels[0].sign"),
])
def test_bad_levels_are_refused_naming_the_field(levels: str, field: str) -> None:
    with pytest.raises(SpecError) as error:
        head, tail = (levels, "") if levels.startswith("levels =") else ("", levels)
        spec_from_toml(TOML.format(head) + tail, source="bad.toml")
    assert error.value.field == field


def test_specs_without_levels_keep_their_text() -> None:
    assert "levels" not in spec_text(load_spec("lif"))
    assert "levels" in spec_text(load_spec("ternary_if"))
