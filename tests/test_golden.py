"""The generated source of every kernel variant, pinned by its sha256: a change to the generator that changes any
kernel's text fails here, naming the variants, so that a refactor is proven byte-identical and every intended
change of generated code is reviewed (and the GPU suite run) before the pin moves.

Variants: every shipped spec x dtype x kernel kind, under its own reset and the other resets, with and without
detach_reset; the kernels' options one at a time; and for three models every layout the tuner and the fixed
rules can choose (long-loop candidates, access widths, unrolling, native half arithmetic).

The default profile renders a covering set of them (`variants(every=False)`): every variant of conftest's
REPRESENTATIVE_SPECS (whose kernels run every line and branch of the generator: alif's layouts among them); of
each other spec, every kernel kind under each (reset, detach_reset) and each option, and each layout of the other
layout models, each in one dtype taken in turn, so that each kind (and layout model) is rendered in every dtype
(`test_the_default_variants_cover_every_pair`).
With --slow, every variant. A generator change is proven byte-identical by the slow profile:
`python -m pytest tests/test_golden.py --slow`.

To move the pin after a reviewed change: `AUTOCUDA_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py --slow`.
"""
from __future__ import annotations

import functools
import hashlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path

from conftest import REPRESENTATIVE_SPECS, profile

from autocuda.codegen import kernels
from autocuda.spec.load import list_specs, load_spec
from autocuda.tools.testing import golden
from autocuda.tools.testing.golden import BACKWARD_OPTIONS, DTYPES, FORWARD_OPTIONS

GOLDEN = Path(__file__).with_name("golden") / "kernel_sources.sha256"


def _taken(whole: bool, shift: int, dtype: str, index: int) -> bool:
    """Whether the covering set holds the variant numbered `index` within its kind, of the spec numbered `shift`, in
    `dtype`: all where `whole`, else those whose number picks this dtype, in turn."""
    return whole or DTYPES.index(dtype) == (shift + index) % len(DTYPES)


def variants(specs: Iterable[str] | None = None, every: bool = True) -> Iterator[golden.Variant]:
    """(label, spec, kind, dtype, options) of every pinned variant (of the shipped specs named, default all); with
    `every=False` the covering set of them (module doc): a variant of a spec other than REPRESENTATIVE_SPECS is
    taken in the dtype its index (spec's number + the variant's number within its kind) picks, in turn."""
    all_specs = [name for name, _ in list_specs()]

    def keep(name: str, dtype: str, index: int) -> bool:
        return _taken(every or name in REPRESENTATIVE_SPECS, all_specs.index(name) if name in all_specs else 0,
                      dtype, index)

    names = all_specs if specs is None else specs
    return golden.variants(((name, load_spec(name)) for name in names), keep)


def sources(specs: Iterable[str] | None = None, every: bool = True) -> dict[str, str]:
    loaded = functools.cache(load_spec)  # each spec loaded once (loading finds and reads its file)
    return {label: kernels.source(loaded(name), kind, dtype, **options)
            for label, name, kind, dtype, options in variants(specs, every)}


def digests(specs: Iterable[str] | None = None, every: bool = True) -> dict[str, str]:
    return {label: hashlib.sha256(source.encode()).hexdigest() for label, source in sources(specs, every).items()}


def _read() -> dict[str, str]:
    pinned = {}
    for line in GOLDEN.read_text().splitlines():
        digest, label = line.split("  ", 1)
        pinned[label] = digest
    return pinned


def test_every_kernel_variant_is_byte_identical_to_its_pin():
    """Every pinned variant with --slow (and when the pin is moved), the covering set of them by default."""
    every = profile() == "slow" or bool(os.environ.get("AUTOCUDA_UPDATE_GOLDEN"))
    texts = sources(every=every)
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
    added = sorted(set(found) - set(pinned))
    removed = sorted(set(pinned) - set(found if every else (label for label, *_ in variants())))
    assert not (changed or added or removed), (
        f"{len(changed)} of {len(found)} kernel sources changed (first: {changed[:5]}), {len(added)} variants new "
        f"({added[:3]}), {len(removed)} gone ({removed[:3]}). Review the difference, run the GPU suite, then move "
        "the pin (module doc).")
    assert len(found) > 1000


def test_the_default_variants_cover_every_pair():
    """The covering set holds every variant of REPRESENTATIVE_SPECS and, of every spec, each kind under each (reset,
    detach_reset) and each option, each kind in every dtype, and each layout model's layouts in every dtype."""
    full, default = list(variants()), list(variants(every=False))
    assert {v[0] for v in default} < {v[0] for v in full}
    assert {v[0] for v in full if v[1] in REPRESENTATIVE_SPECS} <= {v[0] for v in default}
    option_keys = {"reset", "detach_reset", *(key for options in FORWARD_OPTIONS + BACKWARD_OPTIONS for key in options)}

    def is_layout(variant: tuple) -> bool:
        return bool(set(variant[4]) - option_keys)

    def without_dtype(variant: tuple) -> tuple:
        return variant[1], variant[2], tuple(sorted(variant[4].items()))
    assert {without_dtype(v) for v in full if not is_layout(v)} == {without_dtype(v) for v in default
                                                                    if not is_layout(v)}
    assert {v[1:4] for v in full} == {v[1:4] for v in default}  # spec, kind, dtype
    assert {v[1:4] for v in full if is_layout(v)} == {v[1:4] for v in default if is_layout(v)}


def test_the_pin_can_fail(monkeypatch):
    """One changed character in one kernel's text is seen, in that kernel's variants only (LIF's are compared, all
    of them with --slow, their covering set by default: the other specs' are rendered by the test above, and the
    edit reaches LIF's alone)."""
    original = kernels.source

    def edited(spec, kind="fptt", dtype="float32", **options):
        text = original(spec, kind, dtype, **options)
        return text.replace("{", "{ ", 1) if spec.name == "lif" and kind == "bptt" and dtype == "float16" else text

    monkeypatch.setattr(kernels, "source", edited)
    found, pinned = digests(["lif"], every=profile() == "slow"), _read()
    changed = [label for label in found if pinned.get(label) != found[label]]
    assert changed and all(label.startswith("lif bptt float16") for label in changed)


def test_a_kernels_text_does_not_depend_on_what_the_process_printed_before(monkeypatch, tmp_path):
    """A kernel's name digests its derivation's text, printed through a cache of field texts: sympy's 1 printed
    first (a surrogate whose gradient is the constant 1; it equals True, of one hash) made a later
    detach_reset=True print as 1, renaming every detached backward kernel in that process."""
    import sympy

    from autocuda.codegen import kernels as kernel_requests
    from autocuda.codegen import neuron_kernel

    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(tmp_path))  # rendered here, not read from disk
    for cache in (neuron_kernel._text, kernel_requests._kernel, kernel_requests._derivation):
        cache.cache_clear()
    neuron_kernel._text(sympy.S.One), neuron_kernel._text(sympy.S.Zero)
    label = "lif bptt float32 detach_reset=True reset=hard"
    text = kernels.source(load_spec("lif"), "bptt", "float32", detach_reset=True, reset="hard")
    assert hashlib.sha256(text.encode()).hexdigest() == _read()[label]
