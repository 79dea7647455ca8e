"""Launching a compiled kernel on the tensors' device and on torch's current stream.

The hot path packs the arguments itself: one `struct.pack_into` of every value into 8-byte slots (the layout
is derived from the kernel's parameter list), then one driver launch on torch's raw current stream. That keeps
a launch at a few microseconds of host time, however many parameters a kernel has.
"""
from __future__ import annotations

import ctypes
import functools
import struct
import threading
from collections.abc import Sequence

import torch

from .compile import cupy_function, import_cupy

# struct code of one 8-byte argument slot, by C type of a scalar parameter (pointers are addresses: "Q")
_SLOT_CODES = {"float": "f4x", "double": "d", "long long": "q", "int64_t": "q", "int": "i4x",
               "unsigned int": "I4x", "unsigned char": "B7x", "bool": "?7x",
               "half2": "I4x", "__nv_bfloat162": "I4x", "nv_bfloat162": "I4x"}


class PackedLaunch:
    """A compiled kernel with its argument layout: call with plain Python values in parameter order
    (tensor addresses as ints, scalars as numbers; packed half2/bfloat162 scalars as their 32-bit patterns).

    The slots and the array of pointers to them are allocated once; a call writes the values in place and
    launches. The driver copies the values during the launch call, so a lock around the two suffices.
    """

    def __init__(self, source: str, name: str, params: Sequence, device_index: int):
        raw = cupy_function(source, name, device_index)
        with import_cupy().cuda.Device(device_index):
            self.function_ptr = raw.kernel.ptr
        self.format = "<" + "".join("Q" if p.pointer else _SLOT_CODES[p.ctype] for p in params)
        count = max(1, len(params))
        self.slots = (ctypes.c_uint64 * count)()
        base = ctypes.addressof(self.slots)
        self.pointers = (ctypes.c_void_p * count)(*(base + 8 * i for i in range(count)))
        self.pointers_address = ctypes.addressof(self.pointers)
        self.launch_kernel = import_cupy().cuda.driver.launchKernel
        self.lock = threading.Lock()
        self.device_index = device_index

    def __call__(self, grid: Sequence[int], block: Sequence[int], values: Sequence, stream_ptr: int) -> None:
        gx, gy, gz = (*grid, 1, 1)[:3]
        bx, by, bz = (*block, 1, 1)[:3]
        if torch.cuda.current_device() != self.device_index:  # the driver launches in the current context
            with torch.cuda.device(self.device_index):
                return self(grid, block, values, stream_ptr)
        with self.lock:
            struct.pack_into(self.format, self.slots, 0, *values)
            self.launch_kernel(self.function_ptr, gx, gy, gz, bx, by, bz, 0, stream_ptr, self.pointers_address, 0)
        return None


@functools.lru_cache(maxsize=4096)
def packed_launch(source: str, name: str, params: tuple, device_index: int) -> PackedLaunch:
    return PackedLaunch(source, name, params, device_index)


def current_stream_ptr(device_index: int) -> int:
    """torch's current stream on a device, as a raw pointer (cheaper than building a Stream object)."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    return raw(device_index) if raw is not None else torch.cuda.current_stream(device_index).cuda_stream


def launch(source: str, name: str, params: Sequence, grid: tuple, block: tuple, args: Sequence,
           device: torch.device) -> None:
    """Run kernel `name` of `source` with packed `args` (numpy scalars) on `device`'s current torch stream."""
    values = [a.item() for a in args]
    packed_launch(source, name, tuple(params), device.index)(grid, block, values, current_stream_ptr(device.index))
