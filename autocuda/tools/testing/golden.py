"""The kernel variants whose generated source the golden pins hold (tests/golden/kernel_sources.sha256, checked by
tests/test_golden.py), in one place for that test and for the benchmark that derives them all
(bench/derive_speed.py): every spec x dtype x kernel kind under its own reset and the other resets, with and without
detach_reset; the kernels' options one at a time; and for the layout models every layout the tuner and the fixed
rules can choose."""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ...spec.model import NeuronSpec

__all__ = ["BACKWARD_OPTIONS", "DTYPES", "FORWARD_OPTIONS", "KINDS", "LAYOUT_MODELS", "Variant", "label", "layouts",
           "variants"]

DTYPES = ("float32", "float16", "bfloat16", "float64")
KINDS = ("fptt", "bptt", "step-forward", "step-backward")
FORWARD_OPTIONS: tuple[dict[str, Any], ...] = (
    {"store_state_seq": True}, {"save_for_backward": False}, {"given_inits": False}, {"final_states": False})
BACKWARD_OPTIONS: tuple[dict[str, Any], ...] = (
    {"grad_state_seq": True}, {"grad_finals": False}, {"given_inits": False})
LAYOUT_MODELS = ("lif", "alif", "izhikevich")
Variant = tuple[str, str, str, str, dict[str, Any]]  # (label, spec name, kind, dtype, options)


def label(spec: str, kind: str, dtype: str, options: dict[str, Any]) -> str:
    """A variant's label in the pins."""
    extra = " ".join(f"{k}={v}" for k, v in sorted(options.items()))
    return f"{spec} {kind} {dtype} {extra}".strip()


@functools.cache
def layouts(dtype: str) -> tuple[dict[str, Any], ...]:
    """The layouts a layout model is pinned in, in `dtype`: the tuner's candidates for long and short loops, then
    (half types) native half arithmetic."""
    import torch

    from ...runtime import tuning

    seen: list[dict[str, Any]] = []
    for long in (True, False):
        for layout in tuning.candidates(1 << 16, getattr(torch, dtype), lambda width: True, long=long):
            if layout not in seen:
                seen.append(layout)
    if dtype in ("float16", "bfloat16"):
        seen += [{"native": True}, {"native": True, "lanes": 4, "vector": True}]
    return tuple(seen)


def variants(specs: Iterable[tuple[str, NeuronSpec]], keep: Callable[[str, str, int], bool] | None = None
             ) -> Iterator[Variant]:
    """The pinned variants of `specs` ((name, spec) pairs). `keep(name, dtype, index)`: whether to take the variant
    numbered `index` within its group of its kind (the resets: 2 x reset + detach_reset; the options; the layouts);
    all by default."""
    for name, spec in specs:
        resets = dict.fromkeys([spec.reset, "soft", "none",
                                *(["hard"] if any(p.name == "v_reset" for p in spec.params) else [])])
        taken = (lambda dtype, index: True) if keep is None else functools.partial(keep, name)
        for dtype in DTYPES:
            for kind in KINDS:
                for r, reset in enumerate(resets):
                    for detach in (False, True):
                        options = {"reset": reset, "detach_reset": detach}
                        if taken(dtype, 2 * r + detach):
                            yield label(name, kind, dtype, options), name, kind, dtype, options
                for o, options in enumerate(FORWARD_OPTIONS if kind in ("fptt", "step-forward") else BACKWARD_OPTIONS):
                    # fptt is the only kernel that may skip the final states
                    if (kind == "fptt" or "final_states" not in options) and taken(dtype, o):
                        yield label(name, kind, dtype, options), name, kind, dtype, options
            if name in LAYOUT_MODELS:
                for j, layout in enumerate(layouts(dtype)):
                    if taken(dtype, j):
                        for kind in ("fptt", "bptt"):
                            yield label(name, kind, dtype, layout), name, kind, dtype, layout
