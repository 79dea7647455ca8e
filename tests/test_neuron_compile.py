"""Every kernel variant of every shipped spec is valid CUDA for sm_80 and sm_90 (nvcc, no GPU needed).

Variants: 4 kernels x 4 dtypes x 3 resets x detach_reset, plus the speed layouts (vector accesses, several
neurons per thread, prefetching), initial states passed as numbers, a forward without final states, and native
half2/bfloat162 arithmetic in one configuration per spec. Translation units of `CHUNK` kernels run in parallel.
"""
from __future__ import annotations

import functools

import pytest

from autocuda.codegen.neuron import KERNELS
from autocuda.dtypes import DTYPES
from autocuda.kernels import neuron_kernel
from autocuda.spec.load import list_specs, load_spec
from autocuda.spec.model import reset_rules

LAYOUTS = ({"lanes": 4, "vector": True}, {"prefetch": 4}, {"lanes": 2, "vector": True, "unroll": 2},
           {"lanes": 2, "vector": True, "unroll": 8, "prefetch": 32, "block": 64})  # the last: a long-loop tuning
# candidate (its ring of 32 steps in shared memory must fit the 48 KB a block may declare statically)
NATIVE = ({"native": True}, {"native": True, "lanes": 8, "vector": True})


@functools.cache  # rendering ~450 kernels a dtype is slow: both tests share it
def _variants(dtype: str) -> tuple[str, ...]:
    sources = []
    for name, _ in list_specs():
        spec = load_spec(name)
        tensors = [p.name for p in spec.params if p.kind == "tensor"]
        for reset in reset_rules(spec):
            for detach in (False, True):
                for kind in KERNELS:
                    sources.append(neuron_kernel(spec, kind, dtype, reset=reset, detach_reset=detach).full_codes)
        for layout in LAYOUTS:
            if dtype == "float64" and layout.get("lanes") == 4:
                continue  # 32 bytes: wider than one vector access
            for kind in ("fptt", "bptt"):
                sources.append(neuron_kernel(spec, kind, dtype, per_neuron=tensors, store_state_seq=True,
                                             **layout).full_codes)
        for kind in ("bptt", "step-backward") if dtype in ("float32", "float16") else ():
            sources.append(neuron_kernel(spec, kind, dtype, grad_finals=False).full_codes)  # finals start at 0
        for kind in KERNELS:  # initial states as numbers (dtype-specific: rounded through the storage type)
            finals = {"grad_finals": False} if kind in ("bptt", "step-backward") else {}
            sources.append(neuron_kernel(spec, kind, dtype, given_inits=False, **finals).full_codes)
        sources.append(neuron_kernel(spec, "fptt", dtype, given_inits=False, final_states=False).full_codes)
        for layout in NATIVE if dtype in ("float16", "bfloat16") else ():
            for kind in KERNELS:
                sources.append(neuron_kernel(spec, kind, dtype, **layout).full_codes)
            for kind in ("fptt", "bptt"):
                sources.append(neuron_kernel(spec, kind, dtype, given_inits=False, **layout).full_codes)
    return tuple(dict.fromkeys(sources))


CHUNK = 64  # kernels per translation unit: nvcc's time grows faster than linearly with a unit's size


def test_every_variant_of_every_shipped_spec_compiles(nvcc):
    units = {f"{dtype} #{i // CHUNK}": "\n".join(_variants(dtype)[i:i + CHUNK])
             for dtype in DTYPES for i in range(0, len(_variants(dtype)), CHUNK)}
    failures = nvcc(units)
    assert not failures, "\n\n".join(f"{d}:\n{m[:3000]}" for d, m in failures.items())


@pytest.mark.parametrize("dtype", list(DTYPES))
def test_kernel_names_are_unique_per_variant(dtype):
    sources = _variants(dtype)
    names = [s.split('extern "C" __global__ void ')[1].split("(")[0] for s in sources]
    assert len(names) == len(set(names)), "two different kernels share a name"
