"""autocuda.toolchain.host: the emitted CUDA source compiled for the CPU and checked against torch."""
from __future__ import annotations

import os
import textwrap
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import python_children
import torch
from conftest import HOST_PARAM_CLASS, cores, host_group

import autocuda.toolchain.host as host
import autocuda.toolchain.host.cache as host_cache
import autocuda.toolchain.host.cxx as host_cxx
import autocuda.toolchain.host.runner as runner
from autocuda.codegen import cfunction
from autocuda.codegen.ckernel import CKernel, CKernel1D, CKernel2D, CParam, KernelArgumentError, launch_shape
from autocuda.codegen.dtypes import get_dtype
from autocuda.toolchain.compile import CompileError

REPO = Path(__file__).resolve().parents[1]
# The seeds' hand-written cores: dtype -> (word type, heaviside expression, "x[t] + y[t - dt]" with a, b).
SEEDS = {
    torch.float32: ("float", "x[index] >= 0.0f ? 1.0f : 0.0f", "{a} + {b}"),
    torch.float64: ("double", "x[index] >= 0.0 ? 1.0 : 0.0", "{a} + {b}"),
    torch.float16: ("half2", "__hge2(x[index], __float2half2_rn(0.0f))", "__hadd2({a}, {b})"),
    torch.bfloat16: ("__nv_bfloat162", "__hge2(x[index], __float2bfloat162_rn(0.0f))", "__hadd2({a}, {b})"),
}
DTYPES = list(SEEDS)
DTYPE_IDS = [str(d).removeprefix("torch.") for d in DTYPES]


@pytest.fixture(scope="module", autouse=True)
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh disk cache for this module (kernels compiled once here are shared through the memory cache)."""
    path = tmp_path_factory.mktemp("autocuda-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("AUTOCUDA_CACHE_DIR", str(path))
        yield path


def heaviside(dtype: torch.dtype) -> CKernel1D:
    ctype, expression, _ = SEEDS[dtype]
    kernel = CKernel1D(f"seed_heaviside_{get_dtype(dtype).name}")
    kernel.add_param(f"const {ctype} *", "x")
    kernel.add_param(f"{ctype} *", "y")
    kernel.core = f"y[index] = {expression};"
    return kernel


def cumsum(dtype: torch.dtype, reverse: bool = False) -> CKernel2D:
    ctype, _, add = SEEDS[dtype]
    kernel = CKernel2D(f"seed_cumsum_{get_dtype(dtype).name}{'_rev' if reverse else ''}", reverse=reverse)
    kernel.add_param(f"const {ctype} *", "x")
    kernel.add_param(f"{ctype} *", "y")
    first, previous = ("t + dt >= numel", "y[t + dt]") if reverse else ("t - dt < 0", "y[t - dt]")
    kernel.core = f"if ({first}) {{ y[t] = x[t]; }} else {{ y[t] = {add.format(a='x[t]', b=previous)}; }}"
    return kernel


def scan(x: torch.Tensor, reverse: bool = False) -> torch.Tensor:
    """Cumulative sum over dim 0 step by step in x's dtype: the kernel's own order of rounding."""
    steps = list(x.flip(0) if reverse else x)
    out = [steps[0]]
    for step in steps[1:]:
        out.append(step + out[-1])
    result = torch.stack(out)
    return result.flip(0) if reverse else result


@pytest.fixture(scope="module", autouse=True)
def seed_kernels_compiled(cache_dir: Path) -> int:
    """The seeds' and the emitters' kernels of the tests below, compiled up front many to a compiler run (as
    `conftest.compile_launched` does): the tests would compile them one a run. (The compile paths themselves are
    the other tests'.)"""
    if host_cxx.missing() is not None:
        return 0
    kernels = [heaviside(d) for d in DTYPES] + [cumsum(d, r) for d in DTYPES for r in (False, True)]
    kernels += [emitted(d) for d in DTYPES]
    host.load_kernels([job(k) for k in kernels], group=host_group(len(kernels)), workers=cores())
    return len(kernels)


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_heaviside_matches_torch(dtype: torch.dtype) -> None:
    x = torch.randn(1001).to(dtype)  # odd: packed kernels get a padded copy
    x[:3] = torch.tensor([0.0, -0.0, float("inf")])
    y = torch.full_like(x, 7.0)
    heaviside(dtype).simple_call(backend="host", x=x, y=y)
    assert torch.equal(y, (x >= 0).to(dtype))


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_cumsum_matches_torch(dtype: torch.dtype, reverse: bool) -> None:
    x = torch.randn(9, 37).to(dtype)  # N odd: half2/bfloat162 kernels pad to whole words
    y = torch.empty_like(x)
    cumsum(dtype, reverse).simple_call(backend="host", x=x, y=y)
    assert torch.equal(y, scan(x, reverse))
    expected = (x.double().flip(0).cumsum(0).flip(0) if reverse else x.double().cumsum(0)).to(dtype)
    torch.testing.assert_close(y, expected, atol=0.1, rtol=0.02)


# Emitters from autocuda.cfunction inside a 1D core, with a scalar of the word type passed by value.
def emitted(dtype: torch.dtype) -> CKernel1D:
    d = get_dtype(dtype)
    kernel = CKernel1D(f"emitted_{d.name}")
    for name in ("x", "b"):
        kernel.add_param(f"const {d.ctype} *", name)
    kernel.add_param(f"const {d.ctype} &", "alpha")
    for name in ("y_sigmoid", "y_exp", "y_select", "y_scaled"):
        kernel.add_param(f"{d.ctype} *", name)
    mask = cfunction.heaviside(None, "x[index]", dtype=d)
    kernel.core = "\n".join([
        cfunction.sigmoid("y_sigmoid[index]", "x[index]", 4.0, dtype=d),
        cfunction.exp("y_exp[index]", "x[index]", dtype=d),
        cfunction.if_else("y_select[index]", "x[index]", "b[index]", mask, dtype=d),
        cfunction.mul("y_scaled[index]", "x[index]", "alpha", dtype=d),
    ])
    return kernel


@pytest.mark.parametrize("dtype", DTYPES, ids=DTYPE_IDS)
def test_cfunction_emitters_match_torch(dtype: torch.dtype) -> None:
    x, b = (torch.linspace(-3, 3, 301) + 0.01).to(dtype), torch.randn(301).to(dtype)
    out = {name: torch.empty_like(x) for name in ("y_sigmoid", "y_exp", "y_select", "y_scaled")}
    emitted(dtype).simple_call(backend="host", x=x, b=b, alpha=0.75, **out)
    tolerance = {torch.float16: 4e-3, torch.bfloat16: 3e-2}.get(dtype, 1e-6)
    close = dict(atol=tolerance, rtol=tolerance)
    torch.testing.assert_close(out["y_sigmoid"], torch.sigmoid(4.0 * x.double()).to(dtype), **close)
    torch.testing.assert_close(out["y_exp"], torch.exp(x.double()).to(dtype), **close)
    assert torch.equal(out["y_select"], torch.where(x >= 0, x, b))
    assert torch.equal(out["y_scaled"], x * torch.tensor(0.75, dtype=dtype))


def test_explicit_launch_and_memory_cache() -> None:
    kernel, x = heaviside(torch.float32), torch.randn(300)
    y = torch.empty_like(x)
    before = host.stats["memory"]
    kernel((3,), (128,), {"numel": x.numel(), "x": x, "y": y}, backend="host")
    kernel(*launch_shape(x.numel()), {"numel": x.numel(), "x": x, "y": y}, backend="host")
    assert torch.equal(y, (x >= 0).float())
    assert host.stats["memory"] >= before + 1
    with pytest.raises(ValueError, match="1024"):
        kernel((1,), (2048,), {"numel": x.numel(), "x": x, "y": y}, backend="host")


@pytest.mark.parametrize(("grid", "block", "pattern"), [
    ((2.7,), (128,), r"grid: expected a tuple of 1 to 3 integers, got \(2.7,\)"),  # was run as 2 blocks
    ((1,), (128.0,), r"block: expected a tuple of 1 to 3 integers"),
    (("3",), (128,), r"grid: expected a tuple"),
    ((True,), (128,), r"grid: expected a tuple"),
    (3, (128,), r"grid: expected a tuple of 1 to 3 integers, got 3"),  # was 'int' object is not iterable
])
def test_launch_sizes_are_integers_never_truncated(grid, block, pattern: str) -> None:
    kernel, x = heaviside(torch.float32), torch.randn(300)
    y = torch.zeros_like(x)
    with pytest.raises(KernelArgumentError, match=pattern):
        kernel(grid, block, {"numel": x.numel(), "x": x, "y": y}, backend="host")
    with pytest.raises(KernelArgumentError, match=pattern):
        runner.launch(kernel.full_codes, kernel.kernel_name, tuple(kernel.cparams.values()), grid, block,
                      kernel.pack_args({"numel": x.numel(), "x": x, "y": y}))
    assert not y.any()
    kernel((np.int64(3),), [np.uint16(128)], {"numel": x.numel(), "x": x, "y": y}, backend="host")  # NumPy integers
    assert torch.equal(y, (x >= 0).float())


def scaler(name: str, factor: float) -> CKernel1D:
    kernel = CKernel1D(name)
    kernel.add_param("const float *", "x")
    kernel.add_param("float *", "y")
    kernel.core = f"y[index] = x[index] * {factor!r}f;"
    return kernel


def job(kernel: CKernel) -> tuple[str, str, tuple[CParam, ...]]:
    return kernel.full_codes, kernel.kernel_name, tuple(kernel.cparams.values())


def test_kernels_compiled_as_a_group_share_one_library_stored_under_each_key() -> None:
    kernels = [scaler(f"grouped_scale_{i}", 1.5 + i) for i in range(3)]
    before = host.stats["compiled"]
    loaded = host.load_kernels([job(k) for k in kernels], group=3)
    assert host.stats["compiled"] == before + 3
    assert len({k.path.stat().st_ino for k in loaded}) == 1 and len({k.path for k in loaded}) == 3
    for k, entry in zip(kernels, loaded):  # each kernel's own entry, found as load_kernel would look it up
        assert host_cache.find(runner._digest(host.translation_unit(*job(k)))) == entry.path
    x = torch.randn(300)
    for i, k in enumerate(kernels):
        y = torch.empty_like(x)
        k.simple_call(backend="host", x=x, y=y)
        assert torch.equal(y, x * torch.tensor(1.5 + i))
    assert host.load_kernels([job(k) for k in kernels]) == loaded  # from memory now
    assert host.stats["compiled"] == before + 3


def test_a_group_is_stored_as_copies_where_the_file_system_takes_no_links(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise OSError("links not supported")

    monkeypatch.setattr(os, "link", refuse)
    kernels = [scaler(f"copied_group_{i}", 0.5 + i) for i in range(2)]
    loaded = host.load_kernels([job(k) for k in kernels], group=2)
    assert loaded[0].path != loaded[1].path and loaded[0].path.stat().st_ino != loaded[1].path.stat().st_ino
    assert all(host_cache.find(runner._digest(host.translation_unit(*job(k)))) for k in kernels)
    x, y = torch.randn(40), torch.empty(40)
    kernels[1].simple_call(backend="host", x=x, y=y)
    assert torch.equal(y, x * torch.tensor(1.5))


def test_a_group_the_compiler_refuses_is_compiled_kernel_by_kernel() -> None:
    good = [scaler(f"refused_group_ok_{i}", 2.0 + i) for i in range(2)]
    broken = scaler("refused_group_broken", 1.0)
    broken.core = "y[index] = not_declared_anywhere;"
    with pytest.raises(CompileError, match="refused_group_broken") as caught:
        host.load_kernels([job(good[0]), job(broken), job(good[1])], group=3)
    assert "refused_group_ok" not in str(caught.value).split("---")[0]  # the message names the broken one alone
    paths = [host_cache.find(runner._digest(host.translation_unit(*job(k)))) for k in good]
    assert all(paths) and paths[0] != paths[1] and paths[0].stat().st_ino != paths[1].stat().st_ino


def test_threads_asking_for_one_kernel_at_once_compile_it_once() -> None:
    kernel = scaler("concurrent_scale", 3.25)
    start = threading.Barrier(4)

    def load(_: int) -> object:
        start.wait()
        return host.load_kernel(*job(kernel))

    before = dict(host.stats)
    with ThreadPoolExecutor(max_workers=4) as pool:
        loaded = list(pool.map(load, range(4)))
    assert all(k is loaded[0] for k in loaded)
    new = {kind: host.stats[kind] - before.get(kind, 0) for kind in ("compiled", "disk", "memory")}
    assert new["compiled"] + new["disk"] == 1 and new["memory"] == 3, new


def test_kernels_of_one_group_need_distinct_names() -> None:
    with pytest.raises(ValueError, match="share a name"):
        host.load_kernels([job(scaler("same_name", 1.0)), job(scaler("same_name", 2.0))])


# Fast-math and packed math intrinsics (host definitions in shim.h), through launch() directly.
INTRINSICS = """
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#define PACKED(p, i) p[6 * i] = h2exp(p[6 * i]); p[6 * i + 1] = h2log(p[6 * i + 1]); \\
    p[6 * i + 2] = h2sqrt(p[6 * i + 2]); p[6 * i + 3] = h2sin(p[6 * i + 3]); \\
    p[6 * i + 4] = h2cos(p[6 * i + 4]); p[6 * i + 5] = h2rcp(p[6 * i + 5]);
extern "C" __global__ void __launch_bounds__(256) host_intrinsics(const float* __restrict__ x, float* y, half2* h,
                                                                  __nv_bfloat162* b) {
    const unsigned i = threadIdx.x;
    const float v = __ldg(x + i);
    const float r[8] = {__expf(v), __logf(v), __powf(v, 1.5f), __fdividef(v, 3.0f), __frcp_rn(v),
                        __saturatef(v - 1.0f), rsqrtf(v), __sinf(v)};
    for (int k = 0; k < 8; ++k) y[8 * i + k] = r[k];
    PACKED(h, i)
    PACKED(b, i)
}
"""


def test_intrinsics_have_host_meanings() -> None:
    n = 16
    x = torch.linspace(0.5, 2.0, n)
    y = torch.empty(n, 8)
    packed = {dtype: x[:, None, None].expand(n, 6, 2).to(dtype).contiguous() for dtype in DTYPES[2:]}
    params = (CParam("x", "float", True, True), CParam("y", "float", True, False),
              CParam("h", "half2", True, False), CParam("b", "__nv_bfloat162", True, False))
    tensors = (x, y, *packed.values())
    host.launch(INTRINSICS, "host_intrinsics", params, (1,), (n,), [np.uint64(t.data_ptr()) for t in tensors],
                torch.device("cpu"))
    expected = torch.stack([x.exp(), x.log(), x**1.5, x / 3, 1 / x, (x - 1).clamp(0, 1), x.rsqrt(), x.sin()], 1)
    torch.testing.assert_close(y, expected)
    functions = [torch.exp, torch.log, torch.sqrt, torch.sin, torch.cos, torch.reciprocal]
    for dtype, got in packed.items():
        want = torch.stack([f(x.to(dtype).float()).to(dtype) for f in functions], 1)[:, :, None].expand(n, 6, 2)
        torch.testing.assert_close(got, want, atol=0, rtol=0)  # float math, rounded once: as torch rounds


OVERLOADED = """
__global__ void host_overloaded(const float* x, float* y) { y[threadIdx.x] = x[threadIdx.x] + 1.0f; }
__global__ void host_overloaded(const double* x, double* y) { y[threadIdx.x] = x[threadIdx.x] + 2.0; }
"""


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_the_wrapper_calls_the_kernel_its_parameters_declare(dtype: torch.dtype) -> None:
    """The wrapper calls the kernel through a pointer typed by the declared parameters (so that the compiler keeps
    one copy of the kernel): of an overloaded name it takes the one a call with those arguments takes."""
    ctype, added = ("float", 1.0) if dtype == torch.float32 else ("double", 2.0)
    params = (CParam("x", ctype, True, True), CParam("y", ctype, True, False))
    x, y = torch.arange(4, dtype=dtype), torch.zeros(4, dtype=dtype)
    host.launch(OVERLOADED, "host_overloaded", params, (1,), (4,), [np.uint64(x.data_ptr()), np.uint64(y.data_ptr())])
    assert torch.equal(y, x + added)


def test_three_dimensional_grid_and_block() -> None:
    kernel = CKernel("host_grid_ids")
    kernel.add_param("int *", "out")
    kernel.core = """
        const long long block = blockIdx.x + gridDim.x * (blockIdx.y + (long long)gridDim.y * blockIdx.z);
        const long long thread = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
        out[block * blockDim.x * blockDim.y * blockDim.z + thread] = (int)(1000 * block + thread);
    """
    out = torch.zeros(2 * 3 * 2, 4 * 1 * 3, dtype=torch.int32)
    kernel((2, 3, 2), (4, 1, 3), {"out": out}, backend="host")
    assert torch.equal(out, 1000 * torch.arange(12).unsqueeze(1) + torch.arange(12).int())


def test_compile_error_names_the_problem() -> None:
    kernel = CKernel1D("host_broken")
    kernel.add_param("float *", "y")
    kernel.core = "y[index] = not_declared_anywhere;"
    with pytest.raises(CompileError, match="not_declared_anywhere") as error:
        kernel.simple_call(backend="host", y=torch.zeros(4))
    assert "   7          y[index] = not_declared_anywhere;" in str(error.value)  # the numbered source
    assert "host_broken.cu:7" in str(error.value)  # compiler lines refer to that numbering


def test_syncthreads_is_refused() -> None:
    kernel = CKernel1D("host_barrier")
    kernel.add_param("float *", "y")
    kernel.core = "__syncthreads();"
    with pytest.raises(CompileError, match="one after another"):
        kernel.simple_call(backend="host", y=torch.zeros(4))


def test_missing_toolchain_says_what_to_set(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    kernel = CKernel1D("host_toolchain_probe")
    kernel.add_param("float *", "y")
    kernel.core = "y[index] = 1.0f;"
    monkeypatch.setenv("CXX", str(tmp_path / "no-such-compiler"))
    with pytest.raises(RuntimeError, match="set CXX"):
        kernel.simple_call(backend="host", y=torch.zeros(4))
    monkeypatch.delenv("CXX")
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    with pytest.raises(RuntimeError, match="CUDA_HOME"):
        kernel.simple_call(backend="host", y=torch.zeros(4))


def test_unwritable_cache_dir_falls_back_with_a_warning(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(blocker))  # host/ cannot be created under a file
    kernel = CKernel1D("host_fallback_probe")
    kernel.add_param("float *", "y")
    kernel.core = "y[index] = 2.0f;"
    y = torch.zeros(3)
    with pytest.warns(UserWarning, match="not writable"):
        kernel.simple_call(backend="host", y=y)
    assert torch.equal(y, torch.full((3,), 2.0))


# Runs the kernel and prints where it came from; with an argument, forgets it (as a fresh process would not have
# it in memory) and runs it again.
PROBE = textwrap.dedent("""
    import dataclasses, sys
    import numpy as np
    import autocuda.toolchain.host as host
    from autocuda.toolchain.host import runner

    # HOST_PARAM_CLASS

    SOURCE = ('extern "C" __global__ void host_disk_probe(const double* x, double* y, const long long n) {\\n'
              '    const long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;\\n'
              '    if (i < n) y[i] = 2.0 * x[i];\\n}\\n')
    PARAMS = (Param("x", "double", True, True), Param("y", "double", True, False), Param("n", "long long", False, True))
    for _ in range(2 if sys.argv[1:] == ["again"] else 1):
        runner._loaded.clear()
        host.stats.clear()
        x = np.arange(5.0)
        y = np.empty_like(x)
        host.launch(SOURCE, "host_disk_probe", PARAMS, (1,), (32,),
                    [np.uint64(x.ctypes.data), np.uint64(y.ctypes.data), np.int64(x.size)])
        assert np.array_equal(y, 2 * x)
        print("disk" if host.stats["disk"] else "compiled")
""").replace("# HOST_PARAM_CLASS\n", HOST_PARAM_CLASS)


def test_disk_cache_is_shared_between_processes_and_rebuilt_when_corrupt(tmp_path: Path) -> None:
    env = os.environ | {"AUTOCUDA_CACHE_DIR": str(tmp_path), "PYTHONPATH": str(REPO)}

    def run(*again: str) -> list[str]:
        done = python_children.run(["-c", PROBE, *again], env=env)
        assert done.returncode == 0, done.stderr
        return done.stdout.split()

    assert run() == ["compiled"]
    assert run() == ["disk"]
    (library,) = (tmp_path / "host").glob("*.so")
    library.write_bytes(library.read_bytes()[:100])  # truncated: must be detected, never loaded
    assert run("again") == ["compiled", "disk"]  # rebuilt, and the rebuilt library is found on disk


def test_units_include_the_shim_precompiled_once_and_rebuilt_when_damaged(tmp_path, monkeypatch) -> None:
    """Kernels compile against a precompiled shim kept in the host cache (built once per toolchain); a damaged
    one fails its checksum and is built again rather than handed to the compiler."""
    from autocuda.toolchain.host import runner

    monkeypatch.setenv("AUTOCUDA_CACHE_DIR", str(tmp_path))
    sources = []
    real_compile = runner._compile

    def recording(unit, source, name, output):
        sources.append(runner._shim_header(runner.shim_of(unit)))
        return real_compile(unit, source, name, output)

    monkeypatch.setattr(runner, "_compile", recording)

    def run(scale: float) -> None:
        kernel = CKernel1D(f"host_pch_probe_{int(scale)}")
        kernel.add_param("const double *", "x")
        kernel.add_param("double *", "y")
        kernel.core = f"y[index] = {scale} * x[index];"
        x = torch.arange(5.0, dtype=torch.float64)
        y = torch.empty_like(x)
        kernel.simple_call(backend="host", x=x, y=y)
        assert torch.equal(y, scale * x)

    run(2.0)
    (folder,) = (tmp_path / "host").glob("shim-*")
    precompiled = folder / "shim.h.gch"
    # The compiler reads a private copy of the verified bytes, never the cache's files by name.
    (header,) = sources
    assert not header.is_relative_to(tmp_path) and header.read_text() == runner.SHIM_PLAIN  # a double kernel's
    assert header.with_name("shim.h.gch").read_bytes() == precompiled.read_bytes() and precompiled.stat().st_size
    precompiled.write_bytes(precompiled.read_bytes()[:1000])  # truncated: g++ would stop on it
    runner._private_headers.clear()  # as in a fresh process
    run(3.0)
    assert sources[-1] != header and precompiled.stat().st_size > 1000
    assert sources[-1].with_name("shim.h.gch").read_bytes() == precompiled.read_bytes()
