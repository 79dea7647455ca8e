"""The generated source of every kernel variant, pinned by its sha256: a change to the generator that changes any
kernel's text fails here, naming the variants, so that a refactor is proven byte-identical and every intended
change of generated code is reviewed (and the GPU suite run) before the pin moves.

Variants: every shipped spec x dtype x kernel kind, under its own reset and the other resets, with and without
detach_reset; the kernels' options one at a time; and for three models every layout the tuner and the fixed
rules can choose (long-loop candidates, access widths, unrolling, native half arithmetic).

To move the pin after a reviewed change: `AUTOCUDA_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py`.
"""
from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

import torch

from autocuda import kernels
from autocuda.runtime import tuning
from autocuda.spec.load import list_specs, load_spec

GOLDEN = Path(__file__).with_name("golden") / "kernel_sources.sha256"
DTYPES = ("float32", "float16", "bfloat16", "float64")
KINDS = ("fptt", "bptt", "step-forward", "step-backward")
FORWARD_OPTIONS: tuple[dict[str, Any], ...] = (
    {"store_state_seq": True}, {"save_for_backward": False}, {"given_inits": False}, {"final_states": False})
BACKWARD_OPTIONS: tuple[dict[str, Any], ...] = (
    {"grad_state_seq": True}, {"grad_finals": False}, {"given_inits": False})
LAYOUT_MODELS = ("lif", "alif", "izhikevich")


def _label(spec: str, kind: str, dtype: str, options: dict[str, Any]) -> str:
    extra = " ".join(f"{k}={v}" for k, v in sorted(options.items()))
    return f"{spec} {kind} {dtype} {extra}".strip()


def _layouts(dtype: str) -> Iterator[dict[str, Any]]:
    torch_dtype = getattr(torch, dtype)
    seen: list[dict[str, Any]] = []
    for long in (True, False):
        for layout in tuning.candidates(1 << 16, torch_dtype, lambda width: True, long=long):
            if layout not in seen:
                seen.append(layout)
                yield layout
    if dtype in ("float16", "bfloat16"):
        yield {"native": True}
        yield {"native": True, "lanes": 4, "vector": True}


def variants(specs: Iterable[str] | None = None) -> Iterator[tuple[str, str, str, str, dict[str, Any]]]:
    """(label, spec, kind, dtype, options) of every pinned variant (of the shipped specs named, default all)."""
    for name in [name for name, _ in list_specs()] if specs is None else specs:
        spec = load_spec(name)
        resets = dict.fromkeys([spec.reset, "soft", "none", *(["hard"] if any(
            p.name == "v_reset" for p in spec.params) else [])])
        for dtype in DTYPES:
            for kind in KINDS:
                for reset in resets:
                    for detach in (False, True):
                        options = {"reset": reset, "detach_reset": detach}
                        yield _label(name, kind, dtype, options), name, kind, dtype, options
                for options in FORWARD_OPTIONS if kind in ("fptt", "step-forward") else BACKWARD_OPTIONS:
                    if kind == "fptt" or "final_states" not in options:  # the only kernel that may skip them
                        yield _label(name, kind, dtype, options), name, kind, dtype, options
            if name in LAYOUT_MODELS:
                for layout in _layouts(dtype):
                    for kind in ("fptt", "bptt"):
                        yield _label(name, kind, dtype, layout), name, kind, dtype, layout


def sources(specs: Iterable[str] | None = None) -> dict[str, str]:
    loaded = functools.cache(load_spec)  # each spec loaded once (loading finds and reads its file)
    return {label: kernels.source(loaded(name), kind, dtype, **options)
            for label, name, kind, dtype, options in variants(specs)}


def digests(specs: Iterable[str] | None = None) -> dict[str, str]:
    return {label: hashlib.sha256(source.encode()).hexdigest() for label, source in sources(specs).items()}


def _read() -> dict[str, str]:
    pinned = {}
    for line in GOLDEN.read_text().splitlines():
        digest, label = line.split("  ", 1)
        pinned[label] = digest
    return pinned


def test_every_kernel_variant_is_byte_identical_to_its_pin():
    texts = sources()
    found = {label: hashlib.sha256(source.encode()).hexdigest() for label, source in texts.items()}
    named: dict[str, str] = {}  # the kernels are compiled and cached by name: two texts must not share one
    for label, source in texts.items():
        name = source.split('extern "C" __global__ void ')[1].split("(")[0]
        assert named.setdefault(name, source) == source, f"{label}: another variant's text has the name {name}"
    if os.environ.get("AUTOCUDA_UPDATE_GOLDEN"):
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text("".join(f"{digest}  {label}\n" for label, digest in sorted(found.items())))
    pinned = _read()
    changed = sorted(label for label in found if label in pinned and pinned[label] != found[label])
    added, removed = sorted(set(found) - set(pinned)), sorted(set(pinned) - set(found))
    assert not (changed or added or removed), (
        f"{len(changed)} of {len(found)} kernel sources changed (first: {changed[:5]}), {len(added)} variants new "
        f"({added[:3]}), {len(removed)} gone ({removed[:3]}). Review the difference, run the GPU suite, then move "
        "the pin (module doc).")
    assert len(found) > 1000


def test_the_pin_can_fail(monkeypatch):
    """One changed character in one kernel's text is seen, in that kernel's variants only (all of LIF's are
    compared: the other specs' are rendered by the test above, and the edit reaches LIF's alone)."""
    original = kernels.source

    def edited(spec, kind="fptt", dtype="float32", **options):
        text = original(spec, kind, dtype, **options)
        return text.replace("{", "{ ", 1) if spec.name == "lif" and kind == "bptt" and dtype == "float16" else text

    monkeypatch.setattr(kernels, "source", edited)
    found, pinned = digests(["lif"]), _read()
    changed = [label for label in found if pinned.get(label) != found[label]]
    assert changed and all(label.startswith("lif bptt float16") for label in changed)
