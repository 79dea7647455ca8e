"""Generated kernels as the launch stage sees them (name, source, parameter list, neurons per thread), kept on
disk so that a process running a configuration seen before neither derives nor renders (no sympy).

A record is stored under a digest of the text that selects the kernel (the neuron configuration, the kernel
kind, dtype and options) and of the generator's code (`store.key`); it is JSON, checked by the store (a private
folder, the file's owner and mode, its checksum) and then field by field (`RECORD_FIELDS`): a record that is not
exactly what `to_json` writes is rebuilt, never used.
"""
from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import torch

from ..base.errors import RecordError
from ..codegen.ckernel import CParam, _launcher
from ..toolchain import store
from ..toolchain.cnames import KERNEL_NAME

MAX_RECORD_BYTES = 1 << 24
MAX_SOURCE = 1 << 22  # characters of kernel source; generated kernels have tens of thousands
MAX_PARAMS = 256


def _identifier(value: object, field: str) -> str:
    if not isinstance(value, str) or not KERNEL_NAME.match(value):
        raise RecordError(f"{field}: expected a C identifier ({KERNEL_NAME.pattern}), got {value!r:.80}")
    return value


def _source(value: object, field: str) -> str:
    if not isinstance(value, str) or not value or len(value) > MAX_SOURCE:
        raise RecordError(f"{field}: expected kernel source text of 1 to {MAX_SOURCE} characters, "
                          f"got {type(value).__name__} of length {len(value) if isinstance(value, str) else '-'}")
    return value


def _count(least: int, most: int) -> Callable[[object, str], int]:
    def check(value: object, field: str) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= most:
            raise RecordError(f"{field}: expected an int from {least} to {most}, got {value!r:.80}")
        return value
    return check


def _param(value: object, field: str) -> CParam:
    """[name, ctype, pointer, const] of a parameter the builder accepts: `CParam.parse` must give it back."""
    if not isinstance(value, list) or len(value) != 4:
        raise RecordError(f"{field}: expected [name, C type, pointer, const], got {value!r:.80}")
    name, ctype, pointer, const = value
    if not isinstance(ctype, str) or not isinstance(pointer, bool) or not isinstance(const, bool):
        raise RecordError(f"{field}: expected a C type text and two booleans, got {value!r:.80}")
    param = CParam(_identifier(name, f"{field} name"), ctype, pointer, const)
    try:
        parsed = CParam.parse(f"{'const ' if const else ''}{ctype}{' *' if pointer else ''}", param.name)
    except ValueError as error:
        raise RecordError(f"{field}: {error}") from None
    if parsed != param:
        raise RecordError(f"{field}: C type {ctype!r} is not one the builder writes (it reads back as {parsed})")
    return param


def _params(value: object, field: str) -> tuple[CParam, ...]:
    if not isinstance(value, list) or len(value) > MAX_PARAMS:
        raise RecordError(f"{field}: expected a list of at most {MAX_PARAMS} parameters, got {value!r:.80}")
    params = tuple(_param(item, f"{field}[{i}]") for i, item in enumerate(value))
    names = [p.name for p in params]
    if len(set(names)) != len(names):
        raise RecordError(f"{field}: a parameter name repeats in {names}")
    return params


# Each field of a stored record -> its check (value, field name -> the value to use); the field order is the
# constructor's.
RECORD_FIELDS: Mapping[str, Callable[[object, str], Any]] = {
    "name": _identifier,
    "source": _source,
    "params": _params,
    "lanes": _count(1, 16),  # neurons per thread: the layouts use 1, 2, 4 and 8
    "block": _count(1, 1024),  # threads per block: the GPU's limit
    "checkpoint_steps": _count(0, 1 << 20),
}


def _record_fields(data: bytes) -> dict[str, Any]:
    """The checked fields of a stored record; RecordError naming the first that is missing, extra or wrong."""
    if len(data) > MAX_RECORD_BYTES:
        raise RecordError(f"record of {len(data)} bytes, more than {MAX_RECORD_BYTES}")
    try:
        fields = json.loads(data)
    except (ValueError, RecursionError) as error:  # not JSON; nested deeper than the parser goes
        raise RecordError(f"not a JSON record ({type(error).__name__})") from None
    if not isinstance(fields, dict) or set(fields) != set(RECORD_FIELDS):
        found = sorted(fields) if isinstance(fields, dict) else type(fields).__name__
        raise RecordError(f"expected the fields {sorted(RECORD_FIELDS)}, got {found}")
    return {field: check(fields[field], field) for field, check in RECORD_FIELDS.items()}


class KernelRecord:
    """One generated kernel, ready to launch on a GPU (`cuda_launcher`) or on the host runner (`launch`), with
    `block` threads per block (a prefetching kernel's shared ring is sized for them); `checkpoint_steps`: the
    steps between the rows of its `<state>_checkpoints` tensors (`codegen.neuron_kernel.replay_steps`), 0 without."""

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
        """A record read back, every field checked (`RECORD_FIELDS`); RecordError (a ValueError) otherwise."""
        return cls(*_record_fields(data).values())

    def cuda_launcher(self, device_index: int):
        """The packed-argument launcher of this kernel on a device."""
        found = self._launchers.get(device_index)
        if found is None:
            from ..toolchain.launch import packed_launch

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
        except RecordError:  # a damaged or foreign entry: rebuild it
            pass
    record = KernelRecord.of(build())
    store.save("kernels", name, record.to_json())
    return record
