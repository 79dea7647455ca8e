"""bench/derive_speed.py's logic, cheaply: the variants it builds (`autocuda.tools.testing.golden`, which
tests/test_golden.py checks too) are every pinned one, and its phases count each wrapped function's own time. The
run itself (a fresh process building every variant) is the benchmark's, not a test's."""
from __future__ import annotations

import time

import pytest

from autocuda.spec.load import load_spec
from autocuda.tools.testing import golden
from bench import derive_speed


@pytest.mark.parametrize("name", ["lif", "parametric_lif"])
def test_the_variants_are_the_pinned_ones(name: str) -> None:
    """A layout model (lif: its layouts too) and one without: the labels are those tests/golden pins, all of them."""
    labels = [label for label, *_ in golden.variants([(name, load_spec(name))])]
    pinned = {label for label in derive_speed._pins() if label.split(" ", 1)[0] == name}
    assert len(labels) == len(set(labels)) and set(labels) == pinned


def test_a_phase_counts_its_own_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """An outer phase's time excludes the wrapped calls it makes (a clock that the functions move by hand)."""
    clock = [0.0]
    monkeypatch.setattr(time, "thread_time", lambda: clock[0])
    phases = derive_speed._Phases()

    def inner() -> None:
        clock[0] += 2.0

    timed_inner = phases.timed(inner, "derive")

    def outer() -> None:
        clock[0] += 1.0
        timed_inner()
        clock[0] += 0.5
        timed_inner()

    phases.timed(outer, "plans")()
    assert phases.spent["plans"] == 1.5 and phases.spent["derive"] == 4.0
