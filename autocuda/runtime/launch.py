"""Launching a compiled kernel on the tensors' device and on torch's current stream."""
from __future__ import annotations

import functools
from collections.abc import Sequence

import torch

from .compile import cupy_function, import_cupy


@functools.lru_cache(maxsize=64)
def _external_stream(stream_ptr: int, device_index: int):
    return import_cupy().cuda.ExternalStream(stream_ptr, device_index)


def launch(source: str, name: str, params: Sequence, grid: tuple, block: tuple, args: Sequence,
           device: torch.device) -> None:
    """Run kernel `name` of `source` with packed `args` (numpy scalars) on `device`'s current torch stream."""
    stream = _external_stream(torch.cuda.current_stream(device).cuda_stream, device.index)
    _driver_function(source, name, device.index)(grid, block, args, stream=stream)


@functools.cache
def _driver_function(source: str, name: str, device_index: int):
    """CuPy's driver-level function of a RawKernel: it takes the stream as an argument, so a launch needs no
    stream context (the RawKernel itself launches on CuPy's current stream)."""
    raw = cupy_function(source, name, device_index)
    with import_cupy().cuda.Device(device_index):
        function = getattr(raw, "kernel", None)
    if function is None:  # an older CuPy: fall back to the stream context
        def function(grid, block, args, stream):
            with stream:
                raw(grid, block, args)
    return function
