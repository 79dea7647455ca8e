"""The builder's kernels on arrays of other libraries (DLPack, the CUDA array interface) and on CPU tensors without
a backend named. What a CPU can check: detection, refusals, the choice of stream, NumPy arrays through DLPack on
the host runner. CuPy on a GPU: tests/gpu/test_cupy_gpu.py."""
from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import torch

from autocuda.codegen import cfunction
from autocuda.codegen.ckernel import CKernel1D, CKernel2D, KernelArgumentError
from autocuda.toolchain import arrays
from autocuda.toolchain.host import cxx as toolchain

needs_host = pytest.mark.skipif(toolchain.missing() is not None, reason=f"host runner: {toolchain.missing()}")


class CudaArray:
    """What a GPU array library hands over: the CUDA array interface (version 3) and nothing else."""

    def __init__(self, shape: tuple[int, ...] = (4,), typestr: str = "<f4"):
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (0x7F0000000000, False),
                                         "version": 3, "strides": None, "stream": 1}


class DlpackArray:
    """An array that speaks DLPack, on a device of the given DLPack type (2: CUDA, 8: Metal, ...)."""

    def __init__(self, device_type: int):
        self.device_type = device_type

    def __dlpack__(self, stream: int | None = None):
        raise AssertionError("not to be exported where no kernel can read it")

    def __dlpack_device__(self) -> tuple[int, int]:
        return self.device_type, 0


def heaviside() -> CKernel1D:
    kernel = CKernel1D("arrays_heaviside")
    kernel.add_param("const float *", "x")
    kernel.add_param("float *", "y")
    kernel.core = cfunction.heaviside("y[index]", "x[index]", dtype="float32")
    return kernel


def cumsum() -> CKernel2D:
    kernel = CKernel2D("arrays_cumsum")
    kernel.add_param("const float *", "x")
    kernel.add_param("float *", "y")
    kernel.core = "y[t] = (t - dt < 0) ? x[t] : x[t] + y[t - dt];"
    return kernel


def test_what_counts_as_an_array() -> None:
    assert arrays.is_array(CudaArray()) and arrays.is_array(np.zeros(3)) and arrays.is_array(DlpackArray(2))
    assert not arrays.is_array(torch.zeros(3)) and not arrays.is_array(1.5) and not arrays.is_array([1.0])
    assert arrays.memory(CudaArray()) == "cuda" and arrays.memory(np.zeros(3)) == "cpu"
    assert arrays.memory(DlpackArray(8)) == "DLPack device type 8"


def test_cuda_arrays_on_the_host_backend_are_refused() -> None:
    with pytest.raises(KernelArgumentError, match=r"x: a CudaArray in cuda memory; backend 'host' needs cpu memory "
                                                  r"\(leave backend out"):
        heaviside().simple_call(x=CudaArray(), y=torch.zeros(4), backend="host")
    with pytest.raises(KernelArgumentError, match="x: a DlpackArray in cuda memory; backend 'host'"):
        heaviside()((1,), (32,), {"numel": 4, "x": DlpackArray(2), "y": torch.zeros(4)}, backend="host")


def test_cuda_arrays_without_a_cuda_device_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(KernelArgumentError, match=r"y: a CudaArray in CUDA memory, but this torch .* no CUDA device"):
        cumsum().simple_call(x=torch.zeros(2, 4), y=CudaArray((2, 4)))


def test_arrays_no_kernel_can_read_are_refused() -> None:
    with pytest.raises(KernelArgumentError, match="x: a DlpackArray in memory of DLPack device type 8: kernels read "
                                                  "cuda or cpu memory"):
        heaviside().simple_call(x=DlpackArray(8), y=torch.zeros(4))


def test_an_array_given_for_a_scalar_is_refused() -> None:
    kernel = heaviside()
    kernel.add_param("const float", "alpha")
    with pytest.raises(KernelArgumentError, match="alpha: a scalar of C type float is passed by value; got an array"):
        kernel.simple_call(x=torch.zeros(4), y=torch.zeros(4), alpha=CudaArray())


def test_a_read_only_array_is_refused_by_name() -> None:
    x = np.zeros(4, dtype=np.float32)
    y = np.zeros(4, dtype=np.float32)
    y.flags.writeable = False
    with pytest.raises(KernelArgumentError, match=r"y: a read-only ndarray for a parameter the kernel writes"):
        heaviside().simple_call(x=x, y=y)
    assert not y.any()
    cuda_read_only = CudaArray()
    cuda_read_only.__cuda_array_interface__["data"] = (0x7F0000000000, True)
    assert arrays.read_only(cuda_read_only) and not arrays.read_only(CudaArray())
    with pytest.raises(KernelArgumentError, match="y: a read-only CudaArray"):
        heaviside().simple_call(x=torch.zeros(4), y=cuda_read_only)


def test_torch_arguments_pass_through_untouched() -> None:
    values = {"numel": 4, "x": torch.zeros(4), "y": torch.zeros(4)}
    with arrays.torch_views(values, {"x": False, "y": True}, None) as views:
        assert views is values  # nothing built on the common path


def test_cupy_arrays_run_on_cupys_current_stream(monkeypatch: pytest.MonkeyPatch) -> None:
    """The stream is CuPy's current one on the array's device, taken from the CuPy the caller imported."""
    calls = []

    class Device:
        def __init__(self, index: int):
            calls.append(("device", index))

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            return None

    fake_cupy = types.SimpleNamespace(cuda=types.SimpleNamespace(
        Device=Device, get_current_stream=lambda: types.SimpleNamespace(ptr=0xABC)))
    monkeypatch.setitem(sys.modules, "cupy", fake_cupy)
    ndarray = type("ndarray", (), {"__module__": "cupy._core.core", "device": types.SimpleNamespace(id=1)})
    assert arrays.cupy_stream([np.zeros(2), ndarray()]) == (0xABC, 1)
    assert calls == [("device", 1)]
    assert arrays.cupy_stream([np.zeros(2), CudaArray()]) is None


def test_no_cupy_is_touched_without_a_cupy_array(monkeypatch: pytest.MonkeyPatch) -> None:
    class Untouchable(types.ModuleType):
        def __getattr__(self, name: str):
            raise AssertionError(f"cupy.{name} read without a CuPy array")

    monkeypatch.setitem(sys.modules, "cupy", Untouchable("cupy"))
    assert arrays.cupy_stream([np.zeros(2), CudaArray(), torch.zeros(1)]) is None


@needs_host
def test_cpu_tensors_run_on_the_host_runner_without_a_backend() -> None:
    x = torch.tensor([-1.0, 0.0, 2.0, -3.0, 0.5])
    y = torch.full_like(x, 7.0)
    heaviside().simple_call(x=x, y=y)
    assert y.tolist() == [0.0, 1.0, 1.0, 0.0, 1.0]
    seq = torch.arange(6.0).reshape(3, 2)
    out = torch.zeros_like(seq)
    cumsum().simple_call(x=seq, y=out)
    assert torch.equal(out, seq.cumsum(0))


@needs_host
def test_numpy_arrays_through_dlpack_are_used_in_place() -> None:
    x = np.array([[-1.0, 0.0, 2.0], [3.0, -0.5, 0.0]], dtype=np.float32)
    x.flags.writeable = False  # read only, for a parameter the kernel only reads (const): fine
    y = np.full_like(x, 7.0)
    heaviside().simple_call(x=x, y=y)  # written into y's own memory
    assert y.tolist() == [[0.0, 1.0, 1.0], [1.0, 0.0, 1.0]]
    out = np.zeros_like(x)
    cumsum().simple_call(x=x, y=out, backend="host")
    assert np.array_equal(out, x.cumsum(0))
    with pytest.raises(KernelArgumentError, match=r"x: expected dtype torch.float32 .*got torch.float64"):
        heaviside().simple_call(x=x.astype(np.float64), y=np.zeros((2, 3), dtype=np.float32))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_a_launch_under_jit_trace_or_a_torch_func_transform_is_refused() -> None:
    """The launch writes its arrays' memory: a trace would not run it, a transform would not batch it."""
    kernel = heaviside()
    y = torch.zeros(4)

    def launch(x: torch.Tensor) -> torch.Tensor:
        kernel.simple_call(x=x, y=y)
        return y

    with pytest.raises(NotImplementedError, match=r"^kernel 'arrays_heaviside': torch.jit.trace records no launch"):
        torch.jit.trace(launch, (torch.ones(4),))
    with pytest.raises(NotImplementedError, match=r"^kernel 'arrays_heaviside': a launch does not run under torch"):
        torch.vmap(launch)(torch.ones(2, 4))


@needs_host
def test_torch_compile_runs_a_launch_outside_its_graph() -> None:
    """Dynamo traced into the launch and failed with an internal error naming nothing; a launch reads and writes memory
    through addresses, so it runs eagerly, a graph break (which fullgraph=True refuses)."""
    import torch._dynamo

    kernel = heaviside()

    def step(x: torch.Tensor) -> torch.Tensor:
        y = torch.empty_like(x)
        kernel.simple_call(x=x, y=y)
        kernel((1,), (32,), {"numel": x.numel(), "x": y, "y": y})
        return y + 1

    x = torch.tensor([-1.0, 0.0, 2.0, -3.0])
    torch._dynamo.reset()
    assert torch.compile(step, backend="eager")(x).tolist() == [2.0, 2.0, 2.0, 2.0]
    torch._dynamo.reset()
    with pytest.raises(torch._dynamo.exc.Unsupported):
        torch.compile(step, backend="eager", fullgraph=True)(x)
    torch._dynamo.reset()

