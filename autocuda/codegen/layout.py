"""A kernel's layout: how its work is spread over threads and how far its loads run ahead.

A layout changes a kernel's speed, never its results (every layout is bitwise equal; `native` half arithmetic
excepted, which only the caller asks for). The tuner's candidates, the launch's fixed rules and the generator's
options all speak of one `Layout`.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

REPLAY_STEPS = 8  # steps between checkpoints of replayed states, by default (`codegen.neuron_kernel.REPLAY_STEPS`)


@dataclasses.dataclass(frozen=True)
class Layout:
    """Speed options of a kernel (`kernels.neuron_kernel` says what each does); hashable, so a cache key."""

    lanes: int = 0               # neurons per thread (0: the dtype's word width)
    vector: bool = False         # one aligned access per transfer (N % lanes == 0, aligned tensors)
    unroll: int = 1              # unrolling of the time loop
    prefetch: int = 0            # steps of inputs kept in flight through shared memory
    staged: int = 0              # steps per block of inputs loaded into registers ...
    staged_blocks: int = 1       # ... that many blocks ahead
    native: bool = False         # half2/bfloat162 arithmetic instead of float
    block: int = 256             # threads per block
    replay: int = REPLAY_STEPS   # steps per checkpoint of replayed states

    def __post_init__(self) -> None:
        # the fields are numbers and flags: a plain tuple (astuple deep-copies each)
        object.__setattr__(self, "_hash", hash(tuple(getattr(self, name) for name in _FIELD_ORDER)))

    def __hash__(self) -> int:  # a cache key of every call: hashed once
        return self._hash  # type: ignore[attr-defined]

    @classmethod
    def of(cls, options: Mapping[str, Any] | Layout | None) -> Layout:
        """The layout that `options` (a mapping of some fields, or a layout) names; the defaults elsewhere."""
        if isinstance(options, Layout):
            return options
        unknown = set(options or {}) - FIELDS
        if unknown:
            raise TypeError(f"unknown layout options {sorted(unknown)}; layout options are {sorted(FIELDS)}")
        return cls(**(options or {}))

    def options(self) -> dict[str, Any]:
        """Every field by name: the keyword options of `kernels.neuron_kernel` (numbers and flags: no deep copy)."""
        return {name: getattr(self, name) for name in _FIELD_ORDER}

    def replace(self, **changes: Any) -> Layout:
        return dataclasses.replace(self, **changes)


_FIELD_ORDER = tuple(field.name for field in dataclasses.fields(Layout))
FIELDS = frozenset(_FIELD_ORDER)
