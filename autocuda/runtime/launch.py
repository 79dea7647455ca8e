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
    function = cupy_function(source, name, device.index)
    stream = torch.cuda.current_stream(device)
    with _external_stream(stream.cuda_stream, device.index):
        function(tuple(grid), tuple(block), tuple(args))
