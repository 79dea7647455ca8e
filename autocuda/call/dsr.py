"""The DSR neurons' rate rule on kernels (SpikingJelly's DSRIFNode and DSRLIFNode, `nn.spikingjelly_dsr`; the
kernels of `codegen.dsr_kernel`): the layer's output from the spikes (scaled by a value read on the device), and
the rule's backward in one pass. Each function returns None where the kernels do not run the call (a CPU tensor
without `backend="host"`, a dtype the kernels lack, a torch.compile trace): the layer then composes torch ops.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from ..base.tensor_cache import tensor_cache
from ..runtime.configs import compute_dtype
from .mixing import kernel_backend, launch_per_neuron, span

__all__ = ["scaled_spikes", "backward"]

Tensor = torch.Tensor


def _runs(x: Tensor, backend: str | None) -> str | None:
    return None if x.dim() < 1 else kernel_backend(x, backend)


def scaled_spikes(spikes: Tensor, v_threshold: Tensor, divisor: float, backend: str | None) -> Tensor | None:
    """spikes [T, *] times a one-value tensor (the threshold) over `divisor`, in the spikes' dtype, without autograd;
    None where the kernels do not run it."""
    runs = _runs(spikes, backend)
    if runs is None:
        return None
    from ..codegen.dsr_kernel import dsr_output_kernel

    kernel = dsr_output_kernel(str(spikes.dtype).removeprefix("torch."))
    rows = spikes.contiguous().view(spikes.shape[0], -1)
    out = torch.empty_like(rows)
    if rows.numel():
        launch_per_neuron(kernel, {"numel": rows.shape[1], "steps": rows.shape[0], "v_th": _one(v_threshold, rows),
                                   "s": rows, "divisor": float(divisor), "out": out}, runs)
    return out.view(spikes.shape)


def backward(x: Tensor, grad_out: Tensor, v_threshold: Tensor, weights: Sequence[float], bound_factor: float,
             value_divisor: float, strict: bool, backend: str | None) -> tuple[Tensor, Tensor] | None:
    """The rate rule's input gradient [T, *] (x's dtype) and its per-neuron threshold gradients [N] (the compute
    dtype; the threshold's gradient is their sum), for x [T, *], the output's gradient and the time `weights`;
    None where the kernels do not run it."""
    runs = _runs(x, backend)
    if runs is None or grad_out.shape != x.shape or len(weights) != x.shape[0]:
        return None
    from ..codegen.dsr_kernel import dsr_backward_kernel

    kernel = dsr_backward_kernel(str(x.dtype).removeprefix("torch."), strict)
    steps = x.shape[0]
    rows = x.contiguous().view(steps, -1)
    gradient = grad_out.to(x.dtype).reshape(steps, -1)  # a view where its strides allow (an expanded one's do)
    compute = compute_dtype(x.dtype)
    grad_x = torch.empty_like(rows)
    partial = torch.zeros(rows.shape[1], dtype=compute, device=x.device)
    if rows.numel():
        launch_per_neuron(kernel, {
            "numel": rows.shape[1], "steps": steps, "v_th": _one(v_threshold, rows), "x": rows,
            "grad_out": span(gradient), "grad_step": gradient.stride(0), "grad_neuron": gradient.stride(1),
            "weights": _device_weights(tuple(weights), compute, x.device),
            "weight_sum": math.fsum(weights), "bound_factor": float(bound_factor),
            "value_divisor": float(value_divisor), "grad_x": grad_x, "partial": partial}, runs)
    return grad_x.view(x.shape), partial


@tensor_cache(maxsize=32)
def _device_weights(weights: tuple[float, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """The time weights on the device, made once: a copy from the host each call would wait for the device's queue."""
    return torch.tensor(weights, dtype=dtype, device=device)


def _one(value: Tensor, rows: Tensor) -> Tensor:
    """A one-value tensor as the kernels read it: the compute dtype, on the rows' device, contiguous."""
    return value.detach().to(device=rows.device, dtype=compute_dtype(rows.dtype)).reshape(1).contiguous()
