"""Running generated neuron kernels on flat tensors: allocate outputs, launch, return them by name.

This is the launch stage for neurons. Callers (the ops, the test helpers) pass x as [T, N] (or [N] for a
single step), states as [N], tensor parameters as [N] (one per neuron) or [1] (shared), scalars as floats.
Names follow `autocuda.codegen.neuron`'s docstring. Nothing here synchronises with the device.
"""
from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch

from ..ckernel import CParam
from ..codegen.neuron import NeuronKernel
from ..kernels import derivation, neuron_kernel
from ..spec.model import NeuronSpec
from ..surrogate import Surrogate

BLOCK = 256


@dataclass(frozen=True)
class NeuronConfig:
    """What selects the kernels of one neuron layer (hashable: ops use it as a key)."""

    spec: NeuronSpec
    surrogate: Surrogate
    reset: str
    detach_reset: bool = False
    constants: tuple[tuple[str, float], ...] = ()
    tensors: tuple[tuple[str, bool], ...] = ()   # runtime tensor parameters: (name, one value per neuron?)

    def derivation(self):
        return derivation(self.spec, self.reset, self.detach_reset, dict(self.constants))

    def kernel(self, kind: str, dtype: Any, **options: Any) -> NeuronKernel:
        return neuron_kernel(self.spec, kind, dtype, reset=self.reset, detach_reset=self.detach_reset,
                             constants=dict(self.constants), surrogate=self.surrogate,
                             tensors=[n for n, _ in self.tensors], per_neuron=[n for n, p in self.tensors if p],
                             **options)

    @property
    def state_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.spec.states)

    @property
    def learnable(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.derivation().system.learnable)


def _allocate(param: CParam, shape: tuple[int, ...], like: torch.Tensor) -> torch.Tensor:
    return torch.empty(shape, dtype=param.torch_dtype, device=like.device)


def _run(kernel: NeuronKernel, given: Mapping[str, Any], shapes: Mapping[str, tuple[int, ...]], n: int,
         steps: int | None, backend: str) -> dict[str, torch.Tensor]:
    like = next(v for v in given.values() if isinstance(v, torch.Tensor))
    args: dict[str, Any] = {"N": n}
    if steps is not None:
        args["T"] = steps
    outputs = {}
    for name, param in kernel.cparams.items():
        if name in args:
            continue
        if name in given:
            args[name] = given[name]
        elif param.pointer and not param.const:
            outputs[name] = args[name] = _allocate(param, shapes[name], like)
        else:
            raise KeyError(f"kernel {kernel.kernel_name} needs argument {name!r}")
    if n and (steps is None or steps):
        blocks = math.ceil(n / (kernel.lanes * BLOCK))
        kernel((blocks,), (BLOCK,), args, backend=backend)
    return outputs


def forward(config: NeuronConfig, x: torch.Tensor, initial: Mapping[str, torch.Tensor],
            params: Mapping[str, Any], *, single_step: bool = False, store_state_seq: bool = False,
            save_for_backward: bool = True, backend: str = "cuda") -> dict[str, torch.Tensor]:
    """Launch the forward kernel: returns spike_seq, <state>_final, and h_seq / <state>_seq as configured."""
    kind = "step-forward" if single_step else "fptt"
    kernel = config.kernel(kind, x.dtype, store_state_seq=store_state_seq, save_for_backward=save_for_backward)
    n = x.shape[-1]
    seq_shape = tuple(x.shape)
    shapes = {"spike_seq": seq_shape, "h_seq": seq_shape}
    shapes |= {f"{s}_seq": seq_shape for s in config.state_names} | {f"{s}_final": (n,) for s in config.state_names}
    given = {"x_seq": x, **{f"{s}_init": v for s, v in initial.items()}, **params}
    return _run(kernel, given, shapes, n, None if single_step else x.shape[0], backend)


def backward(config: NeuronConfig, grads: Mapping[str, torch.Tensor], saved: Mapping[str, torch.Tensor],
             params: Mapping[str, Any], *, single_step: bool = False, grad_state_seq: bool = False,
             backend: str = "cuda") -> dict[str, torch.Tensor]:
    """Launch the backward kernel. `grads`: grad_spike_seq, grad_<state>_final (and grad_<state>_seq);
    `saved`: h_seq and whatever else the kernel reads (x_seq, <state>_seq, <state>_init).
    Returns grad_x_seq, grad_<state>_init and grad_<param> (per-neuron partial sums; reduce them)."""
    kind = "step-backward" if single_step else "bptt"
    grad_spike = grads["grad_spike_seq"]
    kernel = config.kernel(kind, grad_spike.dtype, grad_state_seq=grad_state_seq)
    n = grad_spike.shape[-1]
    shapes = {"grad_x_seq": tuple(grad_spike.shape)}
    shapes |= {f"grad_{s}_init": (n,) for s in config.state_names} | {f"grad_{p}": (n,) for p in config.learnable}
    given = {k: v for k, v in {**grads, **saved, **params}.items() if k in kernel.cparams}
    return _run(kernel, given, shapes, n, None if single_step else grad_spike.shape[0], backend)
