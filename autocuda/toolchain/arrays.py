"""Arrays of other libraries as torch tensors, for the builder's kernels (`CKernel.__call__`, `simple_call`).

An argument with DLPack (`__dlpack__` and `__dlpack_device__`: CuPy, NumPy, JAX, ...) or the CUDA array
interface (`__cuda_array_interface__`: CuPy, Numba, PyCUDA, ...) becomes a torch view of the same memory, no
copy, so a kernel reads and writes the caller's array. DLPack is preferred where an array has both: its protocol
hands the consumer's stream to the producer, which orders its pending work before the view is used.

Kernels run on torch's current stream, except with CuPy arrays: then on CuPy's current stream (of the device
the array is on), as CuPy's own kernels would. CuPy is never imported here: an array of it means the caller
imported it, and its module is taken from `sys.modules`.
"""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Collection, Iterator, Mapping
from typing import Any

import torch

from ..base.errors import KernelArgumentError

# DLPack device types (`__dlpack_device__()[0]`) whose memory kernels of a backend can address, by device type
DLPACK_MEMORY = {1: "cpu", 2: "cuda", 13: "cuda"}  # kDLCPU, kDLCUDA, kDLCUDAManaged
BACKEND_MEMORY = {"cuda": "cuda", "host": "cpu"}


def dense_problem(what: str, value: torch.Tensor) -> str | None:
    """Why `value` (named `what`) is no dense tensor, where it is not (sparse, nested): kernels read strided memory."""
    if value.layout == torch.strided and not value.is_nested:
        return None
    kind = "nested" if value.is_nested else value.layout
    return (f"{what}: expected a dense tensor, got a {kind} one (a dense copy: .to_dense(), or a nested tensor's "
            ".to_padded_tensor(0))")


def is_array(value: Any) -> bool:
    """Whether `value` is an array of another library that a kernel can take as a tensor."""
    return not isinstance(value, torch.Tensor) and (
        hasattr(value, "__cuda_array_interface__") or (hasattr(value, "__dlpack__")
                                                       and hasattr(value, "__dlpack_device__")))


def memory(value: Any) -> str:
    """Where an array's memory is: 'cuda', 'cpu', or a description of a DLPack device no kernel can read."""
    if hasattr(value, "__dlpack_device__"):
        kind = int(value.__dlpack_device__()[0])
        return DLPACK_MEMORY.get(kind, f"DLPack device type {kind}")
    return "cuda"  # only the CUDA array interface: device memory


def read_only(value: Any) -> bool:
    """Whether an array says it must not be written: the CUDA array interface's flag, or NumPy-style flags (DLPack
    carries the flag only in versions torch does not ask for)."""
    interface = getattr(value, "__cuda_array_interface__", None)
    if isinstance(interface, dict) and isinstance(interface.get("data"), tuple) and len(interface["data"]) == 2:
        return bool(interface["data"][1])
    return getattr(getattr(value, "flags", None), "writeable", True) is False


def as_tensor(name: str, value: Any, backend: str | None, writable: bool = False) -> torch.Tensor:
    """A torch view of the array `value`, passed as the argument `name` (a kernel may write it: `writable`);
    KernelArgumentError where no kernel of `backend` (None: the one of the array's memory) can use it."""
    where, kind = memory(value), type(value).__name__
    if writable and read_only(value):
        raise KernelArgumentError(f"{name}: a read-only {kind} for a parameter the kernel writes (not const)")
    wanted = BACKEND_MEMORY.get(backend) if backend else (where if where in BACKEND_MEMORY.values() else None)
    if wanted is None:
        raise KernelArgumentError(f"{name}: a {kind} in memory of {where}: kernels read cuda or cpu memory")
    if where != wanted:
        raise KernelArgumentError(f"{name}: a {kind} in {where} memory; backend {backend!r} needs {wanted} memory"
                                  f"{' (leave backend out to run where the arrays are)' if backend else ''}")
    if where == "cuda" and not torch.cuda.is_available():
        raise KernelArgumentError(f"{name}: a {kind} in CUDA memory, but this torch ({torch.__version__}) sees no "
                                  f"CUDA device")
    try:
        if hasattr(value, "__dlpack__") and hasattr(value, "__dlpack_device__"):
            return torch.from_dlpack(value)  # the protocol orders the producer's work before torch's stream
        tensor = torch.as_tensor(value)
    except (RuntimeError, TypeError, ValueError, BufferError) as error:
        raise KernelArgumentError(f"{name}: a {kind} that torch cannot view: {error}") from None
    _wait_for_producer(value.__cuda_array_interface__.get("stream"), tensor.device)
    return tensor


def _wait_for_producer(stream: int | None, device: torch.device) -> None:
    """The CUDA array interface (version 3) names the stream on which the data is being produced: the current
    stream waits for it. None: nothing to wait for; 1: the legacy default stream (torch's default stream);
    2: the per-thread default stream, which torch cannot name (the device is synchronized instead)."""
    if stream is None:
        return
    if stream == 2:
        torch.cuda.synchronize(device)
        return
    producer = torch.cuda.default_stream(device) if stream == 1 else torch.cuda.ExternalStream(stream, device=device)
    current = torch.cuda.current_stream(device)
    if producer.cuda_stream != current.cuda_stream:
        current.wait_stream(producer)


def cupy_stream(values: Collection[Any]) -> tuple[int, int] | None:
    """(CuPy's current stream, its device) where one of `values` is a CuPy array, else None."""
    for value in values:
        if type(value).__module__.split(".")[0] == "cupy":
            cupy = sys.modules["cupy"]
            device = int(value.device.id)
            with cupy.cuda.Device(device):
                return int(cupy.cuda.get_current_stream().ptr), device
    return None


@contextlib.contextmanager
def torch_views(values: Mapping[str, Any], pointers: Mapping[str, bool], backend: str | None
                ) -> Iterator[Mapping[str, Any]]:
    """`values` with every array of another library among the `pointers` arguments (name -> written by the
    kernel?) replaced by a torch view; inside, torch's current stream is CuPy's where a CuPy array is among them
    (the launch and any copies run there). `values` itself where all are torch tensors or numbers (the common
    case: nothing is built)."""
    foreign = [name for name in pointers if name in values and is_array(values[name])]
    if not foreign:
        yield values
        return
    stream = cupy_stream([values[name] for name in foreign])
    with torch.cuda.stream(_torch_stream(*stream)) if stream else contextlib.nullcontext():
        yield {**values, **{name: as_tensor(name, values[name], backend, pointers[name]) for name in foreign}}


def _torch_stream(pointer: int, device: int) -> torch.cuda.Stream:
    """The torch stream of a raw CUDA stream (0: the default stream, CuPy's null stream)."""
    return torch.cuda.ExternalStream(pointer, device=device) if pointer else torch.cuda.default_stream(device)
