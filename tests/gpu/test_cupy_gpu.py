"""The builder on CuPy arrays: the seeds' worked examples (heaviside, cumsum) through `simple_call` and the explicit
call, written into the CuPy arrays themselves, on CuPy's current stream; an array that speaks only the CUDA array
interface; CuPy mixed with torch tensors."""
from __future__ import annotations

import pytest
import torch

from autocuda.toolchain import launch

cupy = pytest.importorskip("cupy")

pytestmark = pytest.mark.gpu

DTYPES = {"float32": (cupy.float32, torch.float32), "float16": (cupy.float16, torch.float16),
          "float64": (cupy.float64, torch.float64)}


def signed(*shape: int, dtype) -> cupy.ndarray:
    x = (cupy.random.rand(*shape) - 0.5).astype(dtype)
    x.reshape(-1)[::5] = 0  # Θ(0) = 1 must show
    return x


class InterfaceOnly:
    """A GPU array of a library that speaks only the CUDA array interface (as Numba's do)."""

    def __init__(self, array: cupy.ndarray):
        self.array = array
        self.__cuda_array_interface__ = array.__cuda_array_interface__


@pytest.fixture
def streams(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The stream of every launch, as the launcher reads it."""
    seen: list[int] = []
    real = launch.current_stream_ptr

    def recording(device_index: int) -> int:
        seen.append(real(device_index))
        return seen[-1]

    monkeypatch.setattr(launch, "current_stream_ptr", recording)
    return seen


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("shape", [(4, 4), (5, 7), (1001,)], ids=str)
def test_heaviside_on_cupy_arrays(seed_kernels, streams, dtype: str, shape: tuple[int, ...]):
    cp_dtype, torch_dtype = DTYPES[dtype]
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:  # made, computed and compared on this stream alone
        x = signed(*shape, dtype=cp_dtype)
        y = cupy.full_like(x, -7)
        seed_kernels["heaviside"](torch_dtype).simple_call(x=x, y=y)
    stream.synchronize()
    assert streams and set(streams) == {stream.ptr}, "launched on CuPy's current stream"
    assert y.shape == x.shape and y.dtype == x.dtype
    assert bool(cupy.all(y == (x >= 0).astype(cp_dtype)))


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize(("T", "N"), [(4, 3), (6, 7), (3, 513)])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_cumsum_on_cupy_arrays(seed_kernels, streams, dtype: str, T: int, N: int, reverse: bool):
    cp_dtype, torch_dtype = DTYPES[dtype]
    x = cupy.random.randint(-3, 4, (T, N)).astype(cp_dtype)  # small integers: exact sums in every dtype
    y = cupy.full_like(x, 99)
    seed_kernels["cumsum"](torch_dtype, reverse).simple_call(x=x, y=y)
    cupy.cuda.get_current_stream().synchronize()
    expected = cupy.flip(cupy.cumsum(cupy.flip(x, 0), 0), 0) if reverse else cupy.cumsum(x, 0)
    assert set(streams) == {cupy.cuda.get_current_stream().ptr}
    assert bool(cupy.all(y == expected.astype(cp_dtype)))


def test_explicit_call_with_cupy_arrays(seed_kernels):
    x = signed(6, 10, dtype=cupy.float32)
    y = cupy.zeros_like(x)
    seed_kernels["heaviside"](torch.float32)((1,), (1024,), {"numel": x.size, "x": x, "y": y})
    cupy.cuda.get_current_stream().synchronize()
    assert bool(cupy.all(y == (x >= 0).astype(cupy.float32)))


def test_an_array_with_only_the_cuda_array_interface(seed_kernels, streams):
    """No DLPack: viewed through the interface, on torch's current stream, which waits for the producer's."""
    x = signed(3, 8, dtype=cupy.float32)
    y = cupy.zeros_like(x)
    seed_kernels["cumsum"](torch.float32).simple_call(x=InterfaceOnly(x), y=InterfaceOnly(y))
    torch.cuda.synchronize()
    assert set(streams) == {torch.cuda.current_stream().cuda_stream}
    assert bool(cupy.all(y == cupy.cumsum(x, 0)))


def test_cupy_and_torch_arguments_together(seed_kernels):
    x = torch.randn(5, 9, device="cuda")
    y = cupy.zeros((5, 9), dtype=cupy.float32)
    seed_kernels["heaviside"](torch.float32).simple_call(x=x, y=y)
    cupy.cuda.get_current_stream().synchronize()
    assert torch.equal(torch.from_dlpack(y), (x >= 0).float())


def test_wrong_dtype_of_a_cupy_array_is_explained(seed_kernels):
    from autocuda.codegen.ckernel import KernelArgumentError

    with pytest.raises(KernelArgumentError, match=r"x: expected dtype torch.float32 .*got torch.float64"):
        seed_kernels["heaviside"](torch.float32).simple_call(x=cupy.zeros(4), y=cupy.zeros(4, dtype=cupy.float32))
