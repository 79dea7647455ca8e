"""Running generated neuron kernels on flat tensors: allocate outputs, launch, return them by name.

This is the launch stage for neurons. Callers (the ops, the test helpers) pass x as [T, N] (or [N] for a
single step), states as [N], tensor parameters as [N] (one per neuron) or [1] (shared), scalars as floats.
Names follow `autocuda.codegen.neuron`'s docstring. Nothing here synchronises with the device.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from ..ckernel import KernelArgumentError
from ..codegen.neuron import NeuronKernel
from ..kernels import derivation, neuron_kernel
from ..spec.model import NeuronSpec
from ..surrogate import Surrogate
from .launch import current_stream_ptr

BLOCK = 256
VECTOR_BYTES = (16, 8, 4)      # widest aligned access first
MIN_THREADS = 64 * 1024         # below this many threads, keep one word per thread: latency needs parallelism


def choose_layout(n: int, dtype: torch.dtype, tensors: list[torch.Tensor]) -> dict[str, Any]:
    """Neurons per thread and vector access for N neurons: the widest aligned access that keeps enough threads.
    Odd sizes or unaligned tensors fall back to per-lane accesses (correct for any N)."""
    size = dtype.itemsize
    for width in VECTOR_BYTES:
        lanes = width // size
        aligned = all(t.data_ptr() % width == 0 for t in tensors)
        if lanes >= 2 and n % lanes == 0 and n // lanes >= MIN_THREADS and aligned:
            return {"lanes": lanes, "vector": True}
    return {"lanes": 0, "vector": False}


@dataclass(frozen=True)
class NeuronConfig:
    """What selects the kernels of one neuron layer (hashable: ops use it as a key)."""

    spec: NeuronSpec
    surrogate: Surrogate
    reset: str
    detach_reset: bool = False
    constants: tuple[tuple[str, float], ...] = ()
    tensors: tuple[tuple[str, bool], ...] = ()   # runtime tensor parameters: (name, one value per neuron?)
    _kernels: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    def derivation(self):
        return derivation(self.spec, self.reset, self.detach_reset, dict(self.constants))

    def kernel(self, kind: str, dtype: Any, **options: Any) -> NeuronKernel:
        """The kernel for these options, looked up without hashing the spec (this is on every call's path)."""
        key = (kind, dtype, *sorted(options.items()))
        found = self._kernels.get(key)
        if found is None:
            found = self._kernels[key] = neuron_kernel(
                self.spec, kind, dtype, reset=self.reset, detach_reset=self.detach_reset,
                constants=dict(self.constants), surrogate=self.surrogate, tensors=[n for n, _ in self.tensors],
                per_neuron=[n for n, p in self.tensors if p], **options)
        return found

    @property
    def state_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.spec.states)

    @property
    def learnable(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.derivation().system.learnable)


def _run(config: NeuronConfig, kind: str, options: dict[str, Any], given: Mapping[str, Any],
         shapes: Mapping[str, tuple[int, ...]], n: int, steps: int | None, backend: str,
         layout: Mapping[str, Any] | None) -> dict[str, torch.Tensor]:
    like = next(v for v in given.values() if isinstance(v, torch.Tensor))
    dtype = like.dtype
    empty = n == 0 or steps == 0
    if layout is None:  # outputs come from torch's allocator, whose blocks are aligned far beyond 16 bytes
        layout = choose_layout(n, dtype, [t for t in given.values() if isinstance(t, torch.Tensor) and t.dim()])
    kernel = config.kernel(kind, dtype, **options, **layout)
    sizes = {"N": n, "T": steps}
    values, produced = [], {}
    for name, param in kernel.cparams.items():
        if name in sizes:
            values.append(sizes[name])
        elif name in given:
            value = given[name]
            if not param.pointer:
                values.append(float(value))
                continue
            if value.dtype != param.torch_dtype or not value.is_contiguous():
                raise KernelArgumentError(f"{name}: expected a contiguous {param.torch_dtype} tensor, got "
                                          f"{value.dtype} (contiguous: {value.is_contiguous()})")
            values.append(value.data_ptr())
        elif name in shapes:
            out = produced[name] = torch.empty(shapes[name], dtype=_output_dtype(name, dtype), device=like.device)
            values.append(out.data_ptr())
        else:
            raise KeyError(f"kernel {kernel.kernel_name} needs argument {name!r}")
    if not empty:
        grid = (math.ceil(math.ceil(n / kernel.lanes) / BLOCK),)
        if backend == "cuda":
            kernel.cuda_launcher(like.device.index)(grid, (BLOCK,), values, current_stream_ptr(like.device.index))
        else:
            packed = tuple(np.uint64(v) if p.pointer else p.pack(v) for v, p in zip(values, kernel.cparams.values()))
            kernel.launch(grid, (BLOCK,), packed, like.device, backend)
    return produced


def _output_dtype(name: str, storage: torch.dtype) -> torch.dtype:
    """Sequences and states are stored in the input's dtype; parameter gradients in the compute dtype."""
    if name.startswith("grad_") and not (name.endswith("_seq") or name.endswith("_init")):
        return torch.float64 if storage == torch.float64 else torch.float32
    return storage


def forward(config: NeuronConfig, x: torch.Tensor, initial: Mapping[str, torch.Tensor],
            params: Mapping[str, Any], *, single_step: bool = False, store_state_seq: bool = False,
            save_for_backward: bool = True, backend: str = "cuda", layout: Mapping[str, Any] | None = None
            ) -> dict[str, torch.Tensor]:
    """Launch the forward kernel: returns spike_seq, <state>_final, and h_seq / <state>_seq as configured."""
    kind = "step-forward" if single_step else "fptt"
    options = {"store_state_seq": store_state_seq, "save_for_backward": save_for_backward}
    n = x.shape[-1]
    seq_shape = tuple(x.shape)
    shapes = {"spike_seq": seq_shape, "h_seq": seq_shape}
    shapes |= {f"{s}_seq": seq_shape for s in config.state_names} | {f"{s}_final": (n,) for s in config.state_names}
    given = {"x_seq": x, **{f"{s}_init": v for s, v in initial.items()}, **params}
    return _run(config, kind, options, given, shapes, n, None if single_step else x.shape[0], backend, layout)


def backward(config: NeuronConfig, grads: Mapping[str, torch.Tensor], saved: Mapping[str, torch.Tensor],
             params: Mapping[str, Any], *, single_step: bool = False, grad_state_seq: bool = False,
             backend: str = "cuda", layout: Mapping[str, Any] | None = None) -> dict[str, torch.Tensor]:
    """Launch the backward kernel. `grads`: grad_spike_seq, grad_<state>_final (and grad_<state>_seq);
    `saved`: h_seq and whatever else the kernel reads (x_seq, <state>_seq, <state>_init).
    Returns grad_x_seq, grad_<state>_init and grad_<param> (per-neuron partial sums; reduce them)."""
    kind = "step-backward" if single_step else "bptt"
    grad_spike = grads["grad_spike_seq"]
    n = grad_spike.shape[-1]
    shapes = {"grad_x_seq": tuple(grad_spike.shape)}
    shapes |= {f"grad_{s}_init": (n,) for s in config.state_names} | {f"grad_{p}": (n,) for p in config.learnable}
    given = {**grads, **saved, **params}
    return _run(config, kind, {"grad_state_seq": grad_state_seq}, given, shapes, n,
                 None if single_step else grad_spike.shape[0], backend, layout)
