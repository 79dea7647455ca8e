"""Launching a compiled kernel on the tensors' device and on torch's current stream.

The hot path packs the arguments itself: one `struct.pack_into` of every value into 8-byte slots (the layout
is derived from the kernel's parameter list), then one driver launch (`runtime.driver`) on torch's raw current
stream, in the device's own context. That keeps a launch at a few microseconds of host time, however many
parameters a kernel has.
"""
from __future__ import annotations

import functools
import struct
from collections.abc import Sequence

import torch

from .compile import kernel_function
from .driver import Launcher

# struct code of one 8-byte argument slot, by C type of a scalar parameter (pointers are addresses: "Q")
_SLOT_CODES = {"float": "f4x", "double": "d", "long long": "q", "int64_t": "q", "int": "i4x",
               "unsigned int": "I4x", "unsigned char": "B7x", "bool": "?7x",
               "half2": "I4x", "__nv_bfloat162": "I4x", "nv_bfloat162": "I4x"}


class PackedLaunch:
    """A compiled kernel with its argument layout: call with plain Python values in parameter order
    (tensor addresses as ints, scalars as numbers; packed half2/bfloat162 scalars as their 32-bit patterns).
    A call writes the values into the launcher's slots in place and launches."""

    def __init__(self, source: str, name: str, params: Sequence, device_index: int):
        self.launcher = Launcher(kernel_function(source, name, device_index), device_index, len(params))
        self.format = "<" + "".join("Q" if p.pointer else _SLOT_CODES[p.ctype] for p in params)
        self._pack_into = struct.Struct(self.format).pack_into
        self.device_index = device_index

    def __call__(self, grid: Sequence[int], block: Sequence[int], values: Sequence, stream_ptr: int) -> None:
        launcher = self.launcher
        with launcher.lock:
            self._pack_into(launcher.slots, 0, *values)
            # Padded to three sizes inline: this runs on every launch, and a helper's call costs more
            launcher.launch((*grid, 1, 1)[:3], (*block, 1, 1)[:3], stream_ptr)  # type: ignore[arg-type]


@functools.lru_cache(maxsize=4096)
def packed_launch(source: str, name: str, params: tuple, device_index: int) -> PackedLaunch:
    return PackedLaunch(source, name, params, device_index)


_RAW_STREAM = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # absent from CPU-only builds of torch


def current_stream_ptr(device_index: int) -> int:
    """torch's current stream on a device, as a raw pointer (cheaper than building a Stream object)."""
    if _RAW_STREAM is not None:
        return _RAW_STREAM(device_index)
    return torch.cuda.current_stream(device_index).cuda_stream


def launch(source: str, name: str, params: Sequence, grid: tuple, block: tuple, args: Sequence,
           device: torch.device) -> None:
    """Run kernel `name` of `source` with packed `args` (numpy scalars) on `device`'s current torch stream."""
    values = [a.item() for a in args]
    packed_launch(source, name, tuple(params), device.index)(grid, block, values, current_stream_ptr(device.index))
