"""Generated kernels as the launch stage sees them (name, source, parameter list, neurons per thread), kept on
disk so that a process running a configuration seen before neither derives nor renders (no sympy).

A record is stored under a digest of the text that selects the kernel (the neuron configuration, the kernel
kind, dtype and options) and of the generator's code (`store.key`); it is JSON, checked by the store's checksum
and by its own fields: anything unreadable is rebuilt.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import torch

from .. import store
from ..ckernel import CParam, _launcher


class KernelRecord:
    """One generated kernel, ready to launch on a GPU (`cuda_launcher`) or on the host runner (`launch`), with
    `block` threads per block (a prefetching kernel's shared ring is sized for them); `checkpoint_steps`: the
    steps between the rows of its `<state>_checkpoints` tensors (`codegen.neuron.replay_steps`), 0 without."""

    def __init__(self, kernel_name: str, full_codes: str, params: tuple[CParam, ...], lanes: int, block: int = 256,
                 checkpoint_steps: int = 0):
        self.kernel_name, self.full_codes, self.lanes, self.block = kernel_name, full_codes, lanes, block
        self.checkpoint_steps = checkpoint_steps
        self.cparams: Mapping[str, CParam] = {p.name: p for p in params}
        self._launchers: dict[int, Any] = {}

    @classmethod
    def of(cls, kernel: Any) -> KernelRecord:
        """The record of a built kernel (anything with kernel_name, full_codes, cparams, lanes and block, and
        maybe checkpoint_steps)."""
        return cls(kernel.kernel_name, kernel.full_codes, tuple(kernel.cparams.values()), kernel.lanes, kernel.block,
                   getattr(kernel, "checkpoint_steps", 0))

    def to_json(self) -> bytes:
        params = [[p.name, p.ctype, p.pointer, p.const] for p in self.cparams.values()]
        return json.dumps({"name": self.kernel_name, "source": self.full_codes, "params": params,
                           "lanes": self.lanes, "block": self.block,
                           "checkpoint_steps": self.checkpoint_steps}).encode()

    @classmethod
    def from_json(cls, data: bytes) -> KernelRecord:
        fields = json.loads(data)
        params = tuple(CParam(str(n), str(c), bool(p), bool(k)) for n, c, p, k in fields["params"])
        return cls(str(fields["name"]), str(fields["source"]), params, int(fields["lanes"]), int(fields["block"]),
                   int(fields["checkpoint_steps"]))

    def cuda_launcher(self, device_index: int):
        """The packed-argument launcher of this kernel on a device."""
        found = self._launchers.get(device_index)
        if found is None:
            from .launch import packed_launch

            found = self._launchers[device_index] = packed_launch(
                self.full_codes, self.kernel_name, tuple(self.cparams.values()), device_index)
        return found

    def launch(self, grid: tuple, block: tuple, packed: tuple, device: torch.device, backend: str = "cuda") -> None:
        """Launch with arguments already checked and packed in parameter order."""
        _launcher(backend)(self.full_codes, self.kernel_name, tuple(self.cparams.values()), grid, block, packed,
                           device)


def kernel_record(text: str, build: Callable[[], Any]) -> KernelRecord:
    """The record stored for `text`, or `build()`'s kernel, recorded (and stored for later processes)."""
    name = store.key(text)
    data = store.read("kernels", name)
    if data is not None:
        try:
            return KernelRecord.from_json(data)
        except (ValueError, KeyError, TypeError):  # a damaged or foreign entry: rebuild it
            pass
    record = KernelRecord.of(build())
    store.save("kernels", name, record.to_json())
    return record
