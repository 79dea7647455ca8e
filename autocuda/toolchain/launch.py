"""Launching a compiled kernel on the tensors' device and on torch's current stream.

Where torch ships its C++ launcher of Inductor's kernels (`torch._C._StaticCudaLauncher`, CUDA builds of torch
2.8 and later) and the device's context is current, a launch goes through it: the values in one tuple, with a
type letter each (derived from the kernel's parameter list). Elsewhere (another context current, 2-D blocks,
no such launcher) the launch packs the arguments itself, one `struct.pack_into` of every value into 8-byte slots,
then one driver launch through ctypes (`toolchain.driver`). Both run on torch's raw current stream, in the
device's own context.
"""
from __future__ import annotations

import functools
import struct
from collections.abc import Sequence
from typing import Any

import torch

from ..base.errors import DriverError
from .compile import kernel_function
from .driver import Launcher

# Of one 8-byte argument slot, by C type of a scalar parameter: (struct code, the static launcher's type letter).
# Pointers are addresses: ("Q", "K"). Packed half2/bfloat162 scalars are their 32-bit patterns.
_SLOTS = {"float": ("f4x", "f"), "double": ("d", "d"), "long long": ("q", "l"), "int64_t": ("q", "l"),
          "int": ("i4x", "i"), "unsigned int": ("I4x", "I"), "unsigned char": ("B7x", "B"), "bool": ("?7x", "B"),
          "half2": ("I4x", "I"), "__nv_bfloat162": ("I4x", "I"), "nv_bfloat162": ("I4x", "I")}
_POINTER_SLOT = ("Q", "K")


def _static_launcher():
    """torch's C++ launcher (`_launch_kernel(function, grid x, y, z, warps, shared bytes, types, values, stream)`),
    or None where torch has none or it takes other arguments: a grid of no blocks checks the arguments and
    launches nothing."""
    launch = getattr(getattr(torch._C, "_StaticCudaLauncher", None), "_launch_kernel", None)
    if launch is None:
        return None
    try:
        launch(0, 0, 1, 1, 1, 0, "", (), 0)
    except Exception:  # a private API: any other signature means ctypes launches
        return None
    return launch


# Found when the first kernel loads (CUDA is up by then); None: every launch through ctypes (tests set it so)
_UNRESOLVED = object()
STATIC_LAUNCHER: Any = _UNRESOLVED


class PackedLaunch:
    """A compiled kernel with its argument layout: call with plain Python values in parameter order
    (tensor addresses as ints, scalars as numbers; packed half2/bfloat162 scalars as their 32-bit patterns).
    A call hands them to torch's static launcher, or writes them into the launcher's slots and launches."""

    def __init__(self, source: str, name: str, params: Sequence, device_index: int):
        self.launcher = Launcher(kernel_function(source, name, device_index), device_index, len(params))
        slots = [_POINTER_SLOT if p.pointer else _SLOTS[p.ctype] for p in params]
        self.format = "<" + "".join(code for code, _ in slots)
        self.types = "".join(letter for _, letter in slots)  # the static launcher's
        self._pack_into = struct.Struct(self.format).pack_into
        self.device_index = device_index
        global STATIC_LAUNCHER
        if STATIC_LAUNCHER is _UNRESOLVED:
            STATIC_LAUNCHER = _static_launcher()

    def __call__(self, grid: Sequence[int], block: Sequence[int], values: Sequence, stream_ptr: int) -> None:
        launcher = self.launcher
        static = STATIC_LAUNCHER
        with launcher.lock:
            # whole warps in a 1-D block (the static launcher's), in the device's context (the kernel's)
            if static is not None and len(block) == 1 and not block[0] & 31 and launcher.in_own_context():
                try:
                    static(launcher.function, *grid, *_ONES[len(grid)], block[0] >> 5, 0, self.types,
                           values if type(values) is tuple else tuple(values), stream_ptr)
                except RuntimeError as error:  # torch's check of the driver's status
                    raise DriverError(f"cuLaunchKernel failed: {error}") from error
                return
            self._pack_into(launcher.slots, 0, *values)
            # Padded to three sizes inline: this runs on every launch, and a helper's call costs more
            launcher.launch((*grid, 1, 1)[:3], (*block, 1, 1)[:3], stream_ptr)  # type: ignore[arg-type]


_ONES = {1: (1, 1), 2: (1,), 3: ()}  # a grid's missing sizes


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
