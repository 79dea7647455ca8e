"""Kernel variants of the shipped specs are valid CUDA for sm_80 and sm_90 (nvcc, no GPU needed).

The full set, per spec and dtype: 4 kernels x its reset rules x detach_reset, the speed layouts (vector accesses,
several neurons per thread, prefetching) with per-neuron tensors and state sequences, backward kernels without
final-state gradients, initial states passed as numbers, a forward without final states, and native
half2/bfloat162 arithmetic.

The default profile checks a covering set of it (`--slow` checks the full set: 3,504 distinct kernels, not 392):

- every shipped spec in float32 and float64, each of the 4 kernels with the spec's own reset rule and default
  options: each spec's equations printed in each arithmetic type (float16 and bfloat16 compute in float unless
  `native`, so their kernels print a spec's equations as float32's do; what they add, the conversions of loads,
  stores and initial values, does not depend on the spec and is checked on the representative specs);
- the 4 own-reset kernels of the specs in conftest's REPRESENTATIVE_SPECS (between them they have what changes a
  kernel's skeleton beyond its equations: see there) in every dtype, and each other variant of their full set
  (kernel kind, dtype and options) on one of them, the specs that have it taking the variants in turn.

So every combination of kernel kind, dtype and options that the full set holds is in the default set
(`test_the_default_set_holds_every_option_combination_of_the_full_set` checks it), and every line and branch of
the generator and its templates that rendering the full set runs, rendering the default set runs too
(bench/results/2026-11-27-cpu2-test-time/branches.py measures it). nvcc's verdict on a kernel that differs from a
checked one only in options already checked on another spec is the same unless the spec's equations and those
options interact, which is what the slow profile checks. Translation units of `CHUNK` kernels run in parallel.

Architectures and stages: with --slow every kernel is compiled to SASS for each of CHECK_ARCHS. By default the
representative specs' kernels (every dtype and option combination of the default set) are compiled to SASS for the
first architecture (sm_80), and those of the half types to PTX for the others: what ptxas decides, such as a
block's shared memory (48 KB of static shared memory a block on every architecture checked), follows the kernel's
dtype and options and is decided on sm_80; what nvcc compiles differently for another architecture, the CUDA
headers' paths under __CUDA_ARCH__ and the half and bfloat16 intrinsics, the front end and cicc decide, and they
run for each architecture on the kernels that include those headers (`HEADER_DTYPES`: float32 and float64 kernels
include none); ptxas assembling another architecture's PTX of the same kernel adds no verdict on the generator's
code (the slow profile runs it, and test_nvrtc assembles a multi-step kernel of every spec for sm_90 through
NVRTC). The other specs' kernels (their equations, in each arithmetic type) are compiled to PTX for the first
architecture: the front end and cicc, which decide whether a spec's equations are valid CUDA, run; ptxas, which
assembles what cicc made of them, does not.
"""
from __future__ import annotations

import functools
from collections.abc import Iterator
from typing import Any

import pytest
from conftest import REPRESENTATIVE_SPECS, profile

from autocuda.codegen.dtypes import DTYPES, get_dtype
from autocuda.codegen.kernels import neuron_kernel
from autocuda.codegen.neuron_kernel import KERNELS
from autocuda.spec.draws import makes_draws
from autocuda.spec.load import list_specs, load_spec
from autocuda.spec.model import reset_rules
from autocuda.toolchain.compile import CHECK_ARCHS

LAYOUTS = ({"lanes": 4, "vector": True}, {"prefetch": 4}, {"lanes": 2, "vector": True, "unroll": 2},
           {"lanes": 2, "vector": True, "unroll": 8, "prefetch": 32, "block": 64})  # the last: a long-loop tuning
# candidate (its ring of 32 steps in shared memory must fit the 48 KB a block may declare statically)
NATIVE = ({"native": True}, {"native": True, "lanes": 8, "vector": True})

Variant = tuple[str, str, tuple[tuple[str, Any], ...]]  # spec, kernel kind, neuron_kernel's options


def _options(**options: Any) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted(options.items()))


def spec_variants(name: str, dtype: str) -> Iterator[Variant]:
    """The full set's variants of one spec in one dtype: first its 4 kernels with its own reset rule."""
    spec = load_spec(name)
    tensors = tuple(p.name for p in spec.params if p.kind == "tensor")
    for reset in reset_rules(spec):
        for detach in (False, True):
            for kind in KERNELS:
                yield name, kind, _options(reset=reset, detach_reset=detach)
    for layout in LAYOUTS:
        if dtype == "float64" and layout.get("lanes") == 4:
            continue  # 32 bytes: wider than one vector access
        for kind in ("fptt", "bptt"):
            yield name, kind, _options(per_neuron=tensors, store_state_seq=True, **layout)
    for kind in ("bptt", "step-backward") if dtype in ("float32", "float16") else ():
        yield name, kind, _options(grad_finals=False)  # final states' gradients start at 0
    for kind in KERNELS:  # initial states as numbers (dtype-specific: rounded through the storage type)
        finals = {"grad_finals": False} if kind in ("bptt", "step-backward") else {}
        yield name, kind, _options(given_inits=False, **finals)
    yield name, "fptt", _options(given_inits=False, final_states=False)
    # native packed arithmetic makes no random draws: the generator refuses such kernels (tests/test_replay_charge.py)
    for layout in NATIVE if dtype in ("float16", "bfloat16") and not makes_draws(spec) else ():
        for kind in KERNELS:
            yield name, kind, _options(**layout)
        for kind in ("fptt", "bptt"):
            yield name, kind, _options(given_inits=False, **layout)


def full_set(dtype: str) -> list[Variant]:
    return [variant for name, _ in list_specs() for variant in spec_variants(name, dtype)]


def arithmetic_dtype(dtype: str) -> bool:
    """Whether `dtype` computes in its own type (float32, float64) rather than in another's (half and bfloat16
    compute in float unless `native`: their kernels print a spec's equations as float32's do)."""
    return get_dtype(dtype).compute.name == get_dtype(dtype).name


def signature(variant: Variant, dtype: str) -> tuple:
    """What a variant is apart from its spec: kind, dtype and options (per-neuron tensors: whether there are any)."""
    _, kind, options = variant
    return kind, dtype, tuple((k, bool(v) if k == "per_neuron" else v) for k, v in options)


def default_set(dtype: str) -> list[Variant]:
    """Every spec's own-reset kernels with default options in each arithmetic type (the float32 and float64 sets),
    the representative specs' own-reset kernels in every dtype, and each other (kernel kind, options) of the
    representative specs' full variants once, on one of the representative specs that have it, taken in turn."""
    own = len(KERNELS) if arithmetic_dtype(dtype) else 0
    chosen = [variant for name, _ in list_specs()
              for variant in list(spec_variants(name, dtype))[:len(KERNELS) if name in REPRESENTATIVE_SPECS else own]]
    rest = [variant for name in REPRESENTATIVE_SPECS for variant in list(spec_variants(name, dtype))[len(KERNELS):]]
    holders: dict[tuple, list[Variant]] = {}
    for variant in rest:
        holders.setdefault(signature(variant, dtype), []).append(variant)
    return chosen + [held[turn % len(held)] for turn, held in enumerate(holders.values())]


@functools.cache  # rendering is slow: both tests share it
def _sources(dtype: str, representative: bool | None = None) -> tuple[str, ...]:
    """The sources of the profile's set in `dtype`; with `representative` True (False), of its REPRESENTATIVE_SPECS'
    variants (of the other specs')."""
    chosen = full_set(dtype) if profile() == "slow" else default_set(dtype)
    return tuple(dict.fromkeys(neuron_kernel(load_spec(name), kind, dtype, **dict(options)).full_codes
                               for name, kind, options in chosen
                               if representative is None or (name in REPRESENTATIVE_SPECS) == representative))


CHUNK = 512  # kernels per translation unit, of every dtype: each nvcc run pays its start-up and the CUDA headers once
# (the default set is one unit per architecture; the slow set a few, since units check in parallel)


# The dtypes whose kernels include CUDA headers (cuda_fp16.h, cuda_bf16.h): the only code of a generated kernel that
# the front end compiles differently per architecture (its paths under __CUDA_ARCH__); float32 and float64 kernels
# include none and test `defined(__CUDA_ARCH__)` alone (device against host), never its value.
HEADER_DTYPES = tuple(dtype for dtype in DTYPES if get_dtype(dtype).headers)


def _units(representative: bool | None = None, dtypes: tuple[str, ...] = tuple(DTYPES)) -> dict[str, str]:
    """The translation units of `CHUNK` sources each (`_sources` of each of `dtypes`, in turn)."""
    sources = [source for dtype in dtypes for source in _sources(dtype, representative)]
    return {f"unit #{i // CHUNK}": "\n".join(sources[i:i + CHUNK]) for i in range(0, len(sources), CHUNK)}


def test_every_variant_of_every_shipped_spec_compiles(nvcc):
    """Every kernel to SASS for each of CHECK_ARCHS with --slow; by default the representative specs' to SASS for
    the first architecture and (those of HEADER_DTYPES) to PTX for the others, the other specs' to PTX for the first
    (module doc)."""
    if profile() == "slow":
        failures = nvcc(_units(), archs=CHECK_ARCHS)
    else:
        failures = nvcc(_units(representative=True), archs=CHECK_ARCHS[:1])
        for archs, units in ((CHECK_ARCHS[1:], _units(True, HEADER_DTYPES)), (CHECK_ARCHS[:1], _units(False))):
            failures |= {f"{name} (to PTX, {', '.join(archs)})": message for name, message
                         in nvcc(units, archs=archs, assemble=False).items()}
    assert not failures, "\n\n".join(f"{d}:\n{m[:3000]}" for d, m in failures.items())


def test_the_representative_kernels_hold_every_option_combination_of_the_default_set():
    """What is assembled to SASS by default (and, of the half types, checked for the other architectures) holds
    each (kernel kind, dtype, options) of the default set."""
    for dtype in DTYPES:
        default = {signature(v, dtype) for v in default_set(dtype)}
        assert default == {signature(v, dtype) for v in default_set(dtype) if v[0] in REPRESENTATIVE_SPECS}


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_kernel_names_are_unique_per_variant(dtype):
    sources = _sources(dtype)
    names = [s.split('extern "C" __global__ void ')[1].split("(")[0] for s in sources]
    assert len(names) == len(set(names)), "two different kernels share a name"


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_the_default_set_holds_every_option_combination_of_the_full_set(dtype):
    """Each (kernel kind, dtype, options) of the full set is in the default set on some spec, and every spec's
    own-reset kernels are in each arithmetic type, so no option goes unchecked by default (nothing is rendered
    here)."""
    full, default = full_set(dtype), default_set(dtype)
    missing = {signature(v, dtype) for v in full} - {signature(v, dtype) for v in default}
    assert not missing, f"options of the full set that no default variant has: {sorted(missing)[:5]}"
    assert set(default) <= set(full)
    own = {(name, kind) for name, kind, options in default if options == _options(
        reset=reset_rules(load_spec(name))[0], detach_reset=False)}
    every_spec = {(name, kind) for name, _ in list_specs() for kind in KERNELS}
    assert own == every_spec if arithmetic_dtype(dtype) else own == {
        (name, kind) for name, kind in every_spec if name in REPRESENTATIVE_SPECS}
    assert set(REPRESENTATIVE_SPECS) <= {name for name, _ in list_specs()}
