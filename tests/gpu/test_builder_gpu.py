"""The builder on a GPU: the seeds' worked examples (heaviside, cumsum) through `simple_call` and the explicit
`kernel((blocks,), (threads,), py_dict)` form, in float32, half2 (odd sizes padded invisibly), bf16 and float64;
torch's current stream; scalars by value; packed emitters against float64; 64-bit indices."""
from __future__ import annotations

import inspect

import pytest
import torch

from autocuda.codegen import cfunction as cf
from autocuda.codegen.ckernel import CKernel1D, CKernel2D, KernelArgumentError, launch_shape
from autocuda.codegen.dtypes import get_dtype
from autocuda.toolchain.compile import kernel_function
from autocuda.toolchain.launch import packed_launch

pytestmark = pytest.mark.gpu

DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]
CUDA = "cuda"


def ints(*shape: int, dtype: torch.dtype, low: int = -3, high: int = 4) -> torch.Tensor:
    """Small integers: exact in every dtype, so sums compare exactly."""
    return torch.randint(low, high, shape, device=CUDA).to(dtype)


def signed(*shape: int, dtype: torch.dtype) -> torch.Tensor:
    x = (torch.rand(*shape, device=CUDA) - 0.5).to(dtype)
    x.view(-1)[::5] = 0.0  # Θ(0) = 1 must show
    return x


def words(n: int, dtype: torch.dtype) -> int:
    return -(-n // get_dtype(dtype).width)


# -- heaviside (CKernel1D) ------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(4, 4), (5, 7), (1,), (1001,)], ids=str)
def test_heaviside_simple_call(seed_kernels, dtype: torch.dtype, shape: tuple[int, ...]):
    x = signed(*shape, dtype=dtype)
    y = torch.full_like(x, -7.0)
    seed_kernels["heaviside"](dtype).simple_call(x=x, y=y)
    torch.cuda.synchronize()
    assert y.shape == x.shape and y.dtype == dtype
    assert torch.equal(y, (x >= 0).to(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_heaviside_explicit_call(seed_kernels, dtype: torch.dtype):
    x = signed(6, 10, dtype=dtype)  # even: the explicit form does no padding
    y = torch.zeros_like(x)
    numel = words(x.numel(), dtype)
    blocks, threads = launch_shape(numel, block=32)
    seed_kernels["heaviside"](dtype)(blocks, threads, {"numel": numel, "x": x, "y": y})
    torch.cuda.synchronize()
    assert torch.equal(y, (x >= 0).to(dtype))


def test_heaviside_seed_core_with_cupy_style_grid(seed_kernels):
    """The seeds' exact call shape: ((blocks,), (threads,), py_dict) with 1024 threads."""
    x = signed(4, 4, dtype=torch.float32)
    y = torch.zeros_like(x)
    threads = 1024
    blocks = (x.numel() + threads - 1) // threads
    seed_kernels["heaviside"]("float")((blocks,), (threads,), {"numel": x.numel(), "x": x, "y": y})
    torch.cuda.synchronize()
    assert torch.equal(y, (x >= 0).float())


# -- cumsum (CKernel2D) ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("T", "N"), [(4, 3), (6, 7), (5, 8), (1, 1), (3, 513)])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_cumsum_simple_call(seed_kernels, dtype: torch.dtype, T: int, N: int, reverse: bool):
    x = ints(T, N, dtype=dtype)
    y = torch.full_like(x, 99.0)
    seed_kernels["cumsum"](dtype, reverse).simple_call(x=x, y=y)
    torch.cuda.synchronize()
    expected = x.flip(0).cumsum(0).flip(0) if reverse else x.cumsum(0)
    assert y.shape == (T, N)
    assert torch.equal(y, expected.to(dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_cumsum_explicit_call(seed_kernels, dtype: torch.dtype, reverse: bool):
    T, N = 4, 6
    x = ints(T, N, dtype=dtype)
    y = torch.zeros_like(x)
    n = words(N, dtype)
    blocks, threads = launch_shape(n, block=1024)
    seed_kernels["cumsum"](dtype, reverse)(blocks, threads, {"N": n, "numel": T * n, "x": x, "y": y})
    torch.cuda.synchronize()
    expected = x.flip(0).cumsum(0).flip(0) if reverse else x.cumsum(0)
    assert torch.equal(y, expected)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("N", [7, 8])
def test_per_neuron_tensors_and_pre_post_core(dtype: torch.dtype, N: int):
    """[N] tensors beside [T, N] ones (padded too when N is odd): v_last = v0 + sum over t of x."""
    d = get_dtype(dtype)
    kernel = CKernel2D(f"accumulate_{d.name}")
    kernel.add_param(f"const {d.ctype} *", "x")
    kernel.add_param(f"const {d.ctype} *", "v0")
    kernel.add_param(f"{d.ctype} *", "v_last")
    kernel.pre_core = f"{d.ctype} v = v0[index];"
    kernel.core = cf.add("v", "v", "x[t]", dtype=d)
    kernel.post_core = "v_last[index] = v;"
    x, v0 = ints(5, N, dtype=dtype), ints(N, dtype=dtype)
    v_last = torch.zeros(N, device=CUDA, dtype=dtype)
    kernel.simple_call(x=x, v0=v0, v_last=v_last)
    torch.cuda.synchronize()
    assert torch.equal(v_last, v0 + x.sum(0))


# -- stream, scalars, arguments --------------------------------------------------------------------------------
def test_runs_on_torchs_current_stream(seed_kernels):
    """On a side stream held up by a sleep, the input is written after the sleep: a kernel launched on any
    other stream would read the stale input."""
    kernel = seed_kernels["heaviside"](torch.float32)
    source = signed(1 << 20, dtype=torch.float32)
    x = torch.full_like(source, -1.0)
    y = torch.full_like(source, 5.0)
    kernel.simple_call(x=x, y=y)  # compile and warm up outside the timed section
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time on this stream only
        x.copy_(source)
        kernel.simple_call(x=x, y=y)
    side.synchronize()
    assert torch.equal(y, (source >= 0).float())


@pytest.mark.parametrize(("ctype", "dtype", "alpha"), [
    ("const float", torch.float32, 2.5), ("const float &", torch.float32, -0.75), ("float", torch.float32, 3.0),
    ("const double", torch.float64, 1.0 / 3.0), ("const half2", torch.float16, 1.5),
    ("const __nv_bfloat162", torch.bfloat16, -2.0),
])
def test_scalars_are_passed_by_value(ctype: str, dtype: torch.dtype, alpha: float):
    d = get_dtype(dtype)
    kernel = CKernel1D(f"scale_{d.name}")
    kernel.add_param(f"const {d.ctype} *", "x")
    kernel.add_param(f"{d.ctype} *", "y")
    kernel.add_param(ctype, "alpha")
    kernel.core = cf.mul("y[index]", "x[index]", "alpha", dtype=d)
    x = ints(9, dtype=dtype)
    y = torch.zeros_like(x)
    kernel.simple_call(x=x, y=y, alpha=alpha)
    torch.cuda.synchronize()
    expected = (x.double() * torch.tensor(alpha, dtype=dtype).item()).to(dtype)  # one rounding, as on the GPU
    assert torch.equal(y, expected)


def test_integer_scalars_and_pointers():
    kernel = CKernel1D("integers")
    for ctype, name in [("const int", "a"), ("unsigned int", "b"), ("const long long", "c"), ("int64_t", "d"),
                        ("bool", "flag"), ("const int *", "idx"), ("unsigned char *", "mask"), ("float *", "y")]:
        kernel.add_param(ctype, name)
    kernel.core = """
        y[index] = (float)(a + b + c + d + flag + idx[index]);
        mask[index] = idx[index] > 2;
    """
    idx = torch.arange(6, device=CUDA, dtype=torch.int32)
    mask = torch.zeros(6, device=CUDA, dtype=torch.uint8)
    y = torch.zeros(6, device=CUDA)
    kernel.simple_call(a=-3, b=4, c=2**40, d=-(2**40), flag=True, idx=idx, mask=mask, y=y)
    torch.cuda.synchronize()
    assert y.tolist() == [2.0 + i for i in range(6)]
    assert mask.tolist() == [0, 0, 0, 1, 1, 1]


def test_cpu_tensors_are_refused_on_the_cuda_backend(seed_kernels):
    x = torch.zeros(4)
    with pytest.raises(KernelArgumentError, match="on cpu.*backend='host'"):
        seed_kernels["heaviside"](torch.float32).simple_call(x=x, y=torch.zeros(4), backend="cuda")
    with pytest.raises(KernelArgumentError, match="on cpu"):
        seed_kernels["cumsum"](torch.float32)((1,), (32,), {"numel": 4, "N": 4, "x": x, "y": torch.zeros(4)},
                                              backend="cuda")


def test_mixed_devices_are_refused(seed_kernels):
    with pytest.raises(KernelArgumentError, match="expected cuda"):
        seed_kernels["heaviside"](torch.float32).simple_call(x=torch.zeros(4, device=CUDA), y=torch.zeros(4))


def test_compiled_kernel_is_reused(seed_kernels):
    kernel = seed_kernels["heaviside"](torch.float16)
    x = signed(10, dtype=torch.float16)
    kernel.simple_call(x=x, y=torch.empty_like(x))
    before, compiled = packed_launch.cache_info(), kernel_function.cache_info()
    for _ in range(3):
        kernel.simple_call(x=x, y=torch.empty_like(x))
    after = packed_launch.cache_info()
    assert after.misses == before.misses and after.hits >= before.hits + 3
    assert kernel_function.cache_info().misses == compiled.misses, "nothing is compiled again"


# -- packed emitters against float64 -----------------------------------------------------------------------------
NUMBERS = {"alpha": 2.0, "beta": 1.0, "w": 0.5, "c": 0.01, "leak": 0.1, "k": 1.5, "n": 2, "T_period": 8.0}


def emitter_kernel(dtype: torch.dtype) -> CKernel1D:
    """out_i[index] = surrogate emitter i at x[index], every surrogate emitter, in one kernel."""
    d = get_dtype(dtype)
    kernel = CKernel1D(f"surrogates_{d.name}")
    kernel.add_param(f"const {d.ctype} *", "x")
    lines = []
    for i, name in enumerate(cf.SURROGATE_EMITTERS):
        kernel.add_param(f"{d.ctype} *", f"out{i}")
        fn = getattr(cf, name)
        numbers = {p: NUMBERS[p] for p in list(inspect.signature(fn).parameters)[2:-1]}
        lines.append(fn(f"out{i}[index]", "x[index]", **numbers, dtype=d))
    kernel.core = "\n".join(lines)
    return kernel


def run_emitters(dtype: torch.dtype, x: torch.Tensor) -> torch.Tensor:
    x = x.to(dtype)
    outs = {f"out{i}": torch.full_like(x, float("nan")) for i in range(len(cf.SURROGATE_EMITTERS))}
    emitter_kernel(dtype).simple_call(x=x, **outs)
    torch.cuda.synchronize()
    return torch.stack([outs[f"out{i}"].double() for i in range(len(outs))])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_surrogate_emitters_agree_with_float64(dtype: torch.dtype):
    x = torch.arange(-64, 65, device=CUDA, dtype=torch.float64) / 16  # exact in every dtype, breaks included
    reference, got = run_emitters(torch.float64, x), run_emitters(dtype, x)
    assert torch.isfinite(reference).all()
    tolerance = {torch.float32: 1e-5, torch.float16: 1e-2, torch.bfloat16: 3e-2}[dtype]
    for i, name in enumerate(cf.SURROGATE_EMITTERS):
        torch.testing.assert_close(got[i], reference[i], rtol=tolerance, atol=tolerance, msg=name)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_packed_if_else_ignores_inf_in_the_branch_not_taken(dtype: torch.dtype):
    d = get_dtype(dtype)
    kernel = CKernel1D(f"select_{d.name}")
    for ctype, name in [(f"const {d.ctype} *", "x"), (f"const {d.ctype} *", "y"), (f"const {d.ctype} *", "m"),
                        (f"{d.ctype} *", "z")]:
        kernel.add_param(ctype, name)
    kernel.core = cf.if_else("z[index]", "x[index]", "y[index]", "m[index]", dtype=d)
    inf = float("inf")
    x = torch.tensor([1.0, inf, -inf, 2.0, 3.0], device=CUDA, dtype=dtype)
    y = torch.tensor([inf, 4.0, 5.0, -inf, inf], device=CUDA, dtype=dtype)
    m = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0], device=CUDA, dtype=dtype)
    z = torch.zeros_like(x)
    kernel.simple_call(x=x, y=y, m=m, z=z)
    torch.cuda.synchronize()
    assert z.tolist() == [1.0, 4.0, 5.0, 2.0, 3.0]


# -- 64-bit indices ------------------------------------------------------------------------------------------------
def test_more_than_2_pow_31_elements(seed_kernels):
    n = 2**31 + 6
    if torch.cuda.mem_get_info()[0] < 2 * 4 * n + (2 << 30):
        pytest.skip("needs about 20 GB of free GPU memory")
    x = torch.full((n,), -1.0, device=CUDA)
    x[-6::2] = 1.0
    y = torch.zeros_like(x)
    seed_kernels["heaviside"](torch.float32).simple_call(x=x, y=y)
    torch.cuda.synchronize()
    assert y[-6:].tolist() == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    assert y.sum().item() == 3.0
    del x, y
    torch.cuda.empty_cache()
