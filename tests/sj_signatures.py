"""A check shared by the tests of SpikingJelly-named classes: a class's constructor takes SpikingJelly's arguments, in
its order and with its defaults, then autocuda's `backend`."""
from __future__ import annotations

import inspect
from typing import Any

import autocuda.spec.surrogate as ours


def assert_signature_is_theirs_then_backend(theirs: type, mine: type) -> None:
    def parameters(cls: type) -> list[tuple[str, Any]]:
        return [(p.name, p.default) for p in inspect.signature(cls.__init__).parameters.values()]  # type: ignore[misc]

    expected, got = parameters(theirs), parameters(mine)
    assert got[-1] == ("backend", None)
    assert [n for n, _ in got[:-1]] == [n for n, _ in expected]
    for (name, a), (_, b) in zip(expected, got):
        assert (ours.get_surrogate(a) == ours.get_surrogate(b)) if name == "surrogate_function" else a == b, name
