"""Generated kernels compile with nvcc (sm_80, sm_90); compiler errors surface; 64-bit indexing; and the
float skeletons do what they say when run on the host (CUDA built-ins emulated, threads run one by one)."""
from __future__ import annotations

import re
import shutil
import subprocess
import tempfile
from pathlib import Path

import numpy as np
import pytest
from conftest import compile_together

from autocuda.codegen.ckernel import CKernel, CKernel1D, CKernel2D
from autocuda.toolchain.compile import (
    CHECK_ARCHS,
    FAST_COMPILE,
    UNOPTIMISED,
    CompileError,
    nvcc_check,
    unoptimised_flags,
)

DTYPES = ["float32", "float16", "bfloat16", "float64"]


@pytest.fixture(scope="module")
def seed_sources(seed_kernels) -> dict[str, str]:
    sources = {}
    for dtype in DTYPES:
        sources[f"heaviside-{dtype}"] = seed_kernels["heaviside"](dtype).full_codes
        sources[f"cumsum-{dtype}"] = seed_kernels["cumsum"](dtype).full_codes
        sources[f"cumsum-reverse-{dtype}"] = seed_kernels["cumsum"](dtype, reverse=True).full_codes
    return sources


def _hand_written_heaviside() -> CKernel1D:
    """The seeds' heaviside, core written as in their example."""
    kernel = CKernel1D(kernel_name="heaviside")
    kernel.add_param(ctype="const float *", cname="x")
    kernel.add_param(ctype="float *", cname="y")
    kernel.core = """
        y[index] = x[index] >= 0.0f ? 1.0f: 0.0f;
    """
    return kernel


def _every_param_kind() -> CKernel2D:
    """Scalars by value of each type (the seeds' `const float &` too), int pointers, both packed headers."""
    kernel = CKernel2D("mixed", reverse=True)
    params = [("const float &", "alpha"), ("const double", "beta"), ("const half2", "h"), ("const __nv_bfloat162", "b"),
              ("const int", "k"), ("const long long", "m"), ("unsigned int", "u"), ("bool", "flag"),
              ("const half2 *", "xh"), ("__nv_bfloat162 *", "yb"), ("const int *", "idx"), ("unsigned char *", "mask"),
              ("const nv_bfloat162 *", "zb")]
    for ctype, name in params:
        kernel.add_param(ctype, name)
    kernel.pre_core = "float acc = alpha + (float)beta + (float)(k + m + u + flag);"
    kernel.core = """
        const float2 f = __half22float2(ac_h2_select(h, xh[t], h));
        acc += f.x + f.y + (float)idx[index];
        yb[t] = __hmul2(ac_bf2_lanes(acc, acc), __hadd2(b, zb[t]));
        mask[t] = acc > 0.0f;
    """
    return kernel


@pytest.fixture(scope="module")
def seed_failures(nvcc, seed_sources) -> dict[str, str]:
    """nvcc's refusals among the seed examples and the two kernels below, all in one nvcc run (`compile_together`:
    the sources one by one only where the unit is refused)."""
    assert tuple(CHECK_ARCHS) == ("sm_80", "sm_90")
    return compile_together(nvcc, {**seed_sources, "hand-written heaviside": _hand_written_heaviside().full_codes,
                                   "every param kind": _every_param_kind().full_codes})


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel", ["heaviside", "cumsum", "cumsum-reverse"])
def test_seed_examples_compile(seed_sources, seed_failures, kernel: str, dtype: str):
    label = f"{kernel}-{dtype}"
    assert label not in seed_failures, seed_failures[label]
    assert 'extern "C" __global__ void' in seed_sources[label]


def test_the_seeds_hand_written_core_compiles(seed_failures):
    """The seeds' heaviside, core written as in their example."""
    assert "hand-written heaviside" not in seed_failures, seed_failures["hand-written heaviside"]


def test_kernels_with_every_param_kind_compile(seed_failures):
    """Scalars by value of each type (the seeds' `const float &` too), int pointers, both packed headers."""
    assert "every param kind" not in seed_failures, seed_failures["every param kind"]


def test_broken_core_raises_compile_error_with_nvccs_message(nvcc):
    kernel = CKernel1D("broken")
    kernel.add_param("float *", "y")
    kernel.core = "y[index] = undeclared_thing;"
    with pytest.raises(CompileError) as info:
        nvcc_check(kernel.full_codes, optimise=False)
    message = str(info.value)
    assert 'identifier "undeclared_thing" is undefined' in message
    assert "y[index] = undeclared_thing;" in message  # the numbered source follows the diagnostics


@pytest.mark.parametrize(("release", "flags"), [("12.4", UNOPTIMISED), ("12.8", FAST_COMPILE),
                                               ("13.0", FAST_COMPILE), ("unknown", UNOPTIMISED)])
def test_unoptimised_checks_use_fast_compile_where_nvcc_has_it(release, flags, tmp_path: Path):
    nvcc = tmp_path / "nvcc"
    nvcc.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {release}, V{release}.1'\n")
    nvcc.chmod(0o755)
    assert unoptimised_flags(str(nvcc)) == flags


@pytest.mark.parametrize("cls", [CKernel1D, CKernel2D])
def test_indices_are_64_bit(cls: type):
    kernel = cls("k")
    kernel.add_param("float *", "y")
    kernel.core = "y[index] = 0.0f;"
    codes = kernel.full_codes
    assert "const long long numel" in codes
    assert re.search(r"const long long index = \(long long\)blockIdx\.x \* blockDim\.x \+ threadIdx\.x;", codes)
    if cls is CKernel2D:
        assert "const long long N" in codes and "const long long dt = N;" in codes
        assert re.search(r"for \(long long t = ", codes)
    assert not re.search(r"\b(int|unsigned|size_t)\b", codes), codes  # no 32-bit index anywhere


@pytest.mark.parametrize("reverse", [False, True])
def test_2d_indices_are_64_bit_in_reverse_too(reverse: bool):
    codes = CKernel2D("k", reverse=reverse).full_codes
    assert re.search(r"for \(long long t = [^;]*; t (<|>=) [^;]*; t (\+|-)= dt\)", codes)


# -- host emulation of the float skeletons ---------------------------------------------------------------------
EMULATION = """#include <cstdio>
#include <cmath>
struct ac_dim3 { unsigned int x, y, z; };
static ac_dim3 blockIdx, blockDim, threadIdx;
#define __global__
"""


def run_on_host(kernel: CKernel, blocks: int, threads: int, arrays: dict[str, np.ndarray],
                scalars: dict[str, str]) -> dict[str, np.ndarray]:
    """Run `kernel` over blocks x threads on the CPU; arrays are float32; returns the arrays afterwards."""
    compiler = shutil.which("g++")
    if compiler is None:
        pytest.skip("needs g++ to run emulated kernels")
    setup = [f"    static float {k}[] = {{{', '.join(repr(float(v)) for v in a)}}};" for k, a in arrays.items()]
    call = ", ".join(scalars.get(name, name) for name in kernel.cparams)
    prints = [f'    for (float v : {k}) std::printf("%.9g\\n", v);' for k in arrays]
    main = "\n".join(["int main() {", *setup, f"    blockDim.x = {threads};",
                      f"    for (unsigned b = 0; b < {blocks}; ++b) for (unsigned i = 0; i < {threads}; ++i) {{",
                      f"        blockIdx.x = b; threadIdx.x = i; {kernel.kernel_name}({call});", "    }",
                      *prints, "    return 0;", "}"])
    with tempfile.TemporaryDirectory(prefix="autocuda-emu-") as tmp:
        src, exe = Path(tmp) / "k.cpp", Path(tmp) / "k"
        src.write_text(EMULATION + kernel.full_codes + main + "\n")
        subprocess.run([compiler, "-std=c++17", "-o", str(exe), str(src)], check=True, capture_output=True)
        out = iter(float(v) for v in subprocess.run([str(exe)], check=True, capture_output=True,
                                                    text=True).stdout.split())
    return {k: np.array([next(out) for _ in a]) for k, a in arrays.items()}


def test_heaviside_skeleton_guards_the_tail(seed_kernels):
    """numel = 10 elements in 3 blocks of 4 threads: the 2 extra threads must not write; Θ(0) = 1."""
    x = np.array([-1.5, 0.0, 2.0, -0.0, 3.0, -2.0, 0.5, -0.5, 1e-30, -1e-30, 77.0, 77.0], dtype=np.float32)
    y = np.full(12, -9.0, dtype=np.float32)
    out = run_on_host(seed_kernels["heaviside"]("float32"), 3, 4, {"x": x, "y": y}, {"numel": "10LL"})
    np.testing.assert_array_equal(out["y"][:10], (x[:10] >= 0).astype(np.float32))
    np.testing.assert_array_equal(out["y"][10:], [-9.0, -9.0])


@pytest.mark.parametrize("reverse", [False, True])
def test_cumsum_skeleton_runs_over_time(seed_kernels, reverse: bool):
    T, N = 5, 3
    rng = np.random.default_rng(0)
    x = rng.integers(-3, 4, size=(T, N)).astype(np.float32)
    y = np.zeros(T * N + 2, dtype=np.float32)  # two words past the end must stay untouched
    y[-2:] = -9.0
    out = run_on_host(seed_kernels["cumsum"]("float32", reverse), 2, 2, {"x": x.ravel(), "y": y},
                      {"numel": f"{T * N}LL", "N": f"{N}LL"})
    expected = np.flip(np.cumsum(np.flip(x, 0), 0), 0) if reverse else np.cumsum(x, 0)
    np.testing.assert_array_equal(out["y"][:-2].reshape(T, N), expected)
    np.testing.assert_array_equal(out["y"][-2:], [-9.0, -9.0])


def test_pre_and_post_core_run_once_per_neuron():
    kernel = CKernel2D("final_sum")
    kernel.add_param("const float *", "x")
    kernel.add_param("const float *", "v0")
    kernel.add_param("float *", "v_last")
    kernel.add_param("const float &", "decay")
    kernel.pre_core = "float v = v0[index];"
    kernel.core = "v = v * decay + x[t];"
    kernel.post_core = "v_last[index] = v;"
    T, N = 4, 3
    x = np.arange(T * N, dtype=np.float32)
    v0 = np.array([1.0, -2.0, 0.5], dtype=np.float32)
    out = run_on_host(kernel, 1, 8, {"x": x, "v0": v0, "v_last": np.zeros(N, dtype=np.float32)},
                      {"numel": f"{T * N}LL", "N": f"{N}LL", "decay": "0.5f"})
    v = v0.astype(np.float64)
    for step in x.reshape(T, N):
        v = v * 0.5 + step
    np.testing.assert_allclose(out["v_last"], v, rtol=1e-6)
