"""The builder on GPU arrays of other libraries, without CuPy installed: torch's own CUDA memory handed over as an
object that speaks only the CUDA array interface, or only DLPack, and a stand-in for CuPy whose current stream is
a side stream (what `toolchain.arrays` reads of CuPy). With CuPy itself: tests/gpu/test_cupy_gpu.py."""
from __future__ import annotations

import sys
import types

import pytest
import torch

from autocuda.toolchain import launch

pytestmark = pytest.mark.gpu


class InterfaceOnly:
    """A GPU array that speaks only the CUDA array interface (as Numba's do)."""

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor
        self.__cuda_array_interface__ = tensor.__cuda_array_interface__


class DlpackOnly:
    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor

    def __dlpack__(self, stream=None):
        return self.tensor.__dlpack__(stream=stream)

    def __dlpack_device__(self):
        return self.tensor.__dlpack_device__()


@pytest.fixture
def streams(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The stream of every launch, as the launcher reads it."""
    seen: list[int] = []
    real = launch.current_stream_ptr
    monkeypatch.setattr(launch, "current_stream_ptr", lambda index: seen.append(real(index)) or seen[-1])
    return seen


@pytest.mark.parametrize("wrap", [InterfaceOnly, DlpackOnly])
def test_foreign_gpu_arrays_are_used_in_place(seed_kernels, streams, wrap):
    x = torch.randn(5, 7, device="cuda")
    y = torch.full_like(x, 9.0)
    seed_kernels["heaviside"](torch.float32).simple_call(x=wrap(x), y=wrap(y))
    seq, out = torch.randint(-3, 4, (4, 9), device="cuda").float(), torch.zeros(4, 9, device="cuda")
    seed_kernels["cumsum"](torch.float32)((1,), (32,), {"numel": 36, "N": 9, "x": wrap(seq), "y": wrap(out)})
    torch.cuda.synchronize()
    assert torch.equal(y, (x >= 0).float()) and torch.equal(out, seq.cumsum(0))
    assert set(streams) == {torch.cuda.current_stream().cuda_stream}


def test_half2_padding_writes_back_into_the_foreign_array(seed_kernels):
    x = torch.randn(5, 7, device="cuda").half()  # odd: padded to whole half2 words, copied back
    y = torch.zeros_like(x)
    seed_kernels["heaviside"](torch.float16).simple_call(x=InterfaceOnly(x), y=InterfaceOnly(y))
    torch.cuda.synchronize()
    assert torch.equal(y, (x >= 0).half())


def test_cupy_arrays_launch_on_cupys_current_stream(seed_kernels, streams, monkeypatch: pytest.MonkeyPatch):
    """A stand-in for CuPy whose current stream is a side stream held up by a sleep: the kernel must wait for the
    input written there, so it is right only when it runs there too."""
    side = torch.cuda.Stream()
    fake = types.SimpleNamespace(cuda=types.SimpleNamespace(
        Device=lambda index: torch.cuda.device(index),
        get_current_stream=lambda: types.SimpleNamespace(ptr=side.cuda_stream)))
    monkeypatch.setitem(sys.modules, "cupy", fake)
    ndarray = type("ndarray", (DlpackOnly,), {"__module__": "cupy._core.core"})
    source = torch.randn(1 << 20, device="cuda")
    x, y = torch.full_like(source, -1.0), torch.full_like(source, 5.0)
    torch.cuda.synchronize()
    wrapped = ndarray(x)
    wrapped.device = types.SimpleNamespace(id=x.device.index)
    with torch.cuda.stream(side):
        torch.cuda._sleep(200_000_000)
        x.copy_(source)
    seed_kernels["heaviside"](torch.float32).simple_call(x=wrapped, y=y)
    side.synchronize()
    assert streams == [side.cuda_stream]
    assert torch.equal(y, (source >= 0).float())
