"""NVRTC through ctypes compiles the generated kernels on a machine without a GPU (the `test` extra installs
NVRTC and the CUDA headers): the compiler the GPU path uses, checked where CI runs.
"""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from conftest import REPRESENTATIVE_SPECS, profile

from autocuda.codegen.kernels import neuron_kernel
from autocuda.codegen.neuron_kernel import KERNELS
from autocuda.runtime import configs
from autocuda.spec.load import list_specs, load_spec
from autocuda.toolchain import compile, nvrtc

pytestmark = pytest.mark.skipif(not nvrtc.found(), reason="NVRTC not found: pip install -e '.[test]' brings it")
HOPPER = 90
BROKEN = 'extern "C" __global__ void broken(float* x) { x[0] = not_declared(x[0]); }'


def _sources(dtype: str, names: list[str], kinds=KERNELS) -> dict[str, str]:
    kernels = (neuron_kernel(load_spec(name), kind, dtype) for name in names for kind in kinds)
    return {k.kernel_name: k.full_codes for k in kernels}


def multi_step_kinds(index: int, name: str) -> tuple[str, ...]:
    """The multi-step kernels of the spec numbered `index` that NVRTC compiles: both with --slow and for conftest's
    REPRESENTATIVE_SPECS, by default FPTT or BPTT for the others, taken in turn (each spec's equations through
    NVRTC once; what NVRTC sees beyond them, the kind's skeleton and the headers, the representative specs hold)."""
    if profile() == "slow" or name in REPRESENTATIVE_SPECS:
        return ("fptt", "bptt")
    return (("fptt", "bptt")[index % 2],)


THREADS = 4


def _compile_unit(sources: dict[str, str]) -> bytes:
    """The cubin of the sources as one NVRTC program; where NVRTC refuses it, each source's on its own, so that the
    error names its kernel."""
    try:
        return nvrtc.compile_program("\n".join(sources.values()), " + ".join(sources), HOPPER, compile.NVRTC_OPTIONS)
    except nvrtc.NvrtcError:
        for name, source in sources.items():
            nvrtc.compile_program(source, name, HOPPER, compile.NVRTC_OPTIONS)
        raise


def test_shipped_kernels_compile_to_cubins_in_parallel_threads():
    # every spec's multi-step kernels in bfloat16 (the headers NVRTC must find: `multi_step_kinds`), every kind of
    # LIF in each dtype
    sources: dict[str, str] = {}
    for index, (name, _) in enumerate(list_specs()):
        sources |= _sources("bfloat16", [name], multi_step_kinds(index, name))
    for dtype in ("float32", "float16", "float64"):
        sources |= _sources(dtype, ["lif"])
    # With --slow each source is a program of its own, as the runtime compiles it; by default the sources are
    # THREADS programs, one a thread (each program parses the CUDA headers again; generated kernels stand alone,
    # their shared preludes behind include guards, so a program of several compiles where each does alone)
    names = list(sources)
    units = [[name] for name in names] if profile() == "slow" else [names[i::THREADS] for i in range(THREADS)]
    with ThreadPoolExecutor(max_workers=THREADS) as pool:
        images = list(pool.map(lambda unit: _compile_unit({name: sources[name] for name in unit}), units))
    assert all(image.startswith(b"\x7fELF") for image in images)
    assert len(set(images)) == len(images) == len(units)


def test_a_device_newer_than_nvrtc_gets_ptx_for_the_newest_architecture_it_knows():
    newest = max(nvrtc.supported_archs())
    ptx = nvrtc.compile_program(next(iter(_sources("float16", ["lif"]).values())), "k", newest + 1000,
                                compile.NVRTC_OPTIONS).decode()
    assert f".target sm_{newest}" in ptx and not ptx.endswith("\0")


def test_rejected_source_raises_compile_error_with_nvrtcs_log_and_the_numbered_source(monkeypatch):
    with pytest.raises(nvrtc.NvrtcError, match="not_declared"):
        nvrtc.compile_program(BROKEN, "broken", HOPPER, ())
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda index: (9, 0))
    with pytest.raises(compile.CompileError, match=r"(?s)NVRTC rejected kernel broken.*not_declared.*   1  extern"):
        compile.nvrtc_compile(BROKEN, "broken", 0)


def test_half_precision_headers_are_found_beside_nvrtc():
    assert nvrtc.include_folders(), "cuda_fp16.h is in no include folder"
    assert nvrtc.version().split(".")[0].isdigit()


def test_without_nvrtc_kernels_fall_back_to_the_reference_and_compiling_says_what_to_install(monkeypatch):
    with monkeypatch.context() as patch:
        patch.setattr(nvrtc, "_library_candidates", lambda: iter(["libnvrtc-that-does-not-exist.so"]))
        nvrtc._library.cache_clear()
        try:
            assert not nvrtc.found()
            assert configs.default_backend("cuda") == "reference"
            with pytest.raises(RuntimeError, match=r"needs NVRTC.*autocuda\[cuda13\]"):
                nvrtc.compile_program(BROKEN, "broken", HOPPER, ())
        finally:
            nvrtc._library.cache_clear()
    assert nvrtc.found()
