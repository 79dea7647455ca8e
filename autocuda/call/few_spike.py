"""Few-spike coding as one autograd op (SpikingJelly's FewSpikeNode, HGNode and OutlierAwareThresholdNode,
`nn.spikingjelly_few_spike`), by the kernels of `codegen.few_spike_kernel`: per neuron a gate (x, or the sum of a
sequence's K inputs), the table row of the gate's region, K steps. Autograd keeps x alone; backward rebuilds the
steps.

`run` takes a call where the kernels can run it (on a GPU with NVRTC, or `backend="host"` for tests; K up to
`MAX_STEPS`; a surrogate of ours or SpikingJelly's in its spiking form; no torch.compile trace); elsewhere it
returns None and the layer composes torch ops, as SpikingJelly does.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from ..runtime.configs import compute_dtype
from .mixing import kernel_backend, launch_per_neuron, span, spiking_surrogate
from .ops import differentiable_once

__all__ = ["run"]

Tensor = torch.Tensor


def run(x: Tensor, theta: Tensor, h: Tensor, d: Tensor, thresholds: Tensor, surrogate: Any, sequence: bool,
        backend: str | None = None, signed: bool = False, clamp_value: float = math.inf) -> Tensor | None:
    """The weighted spikes [K, *] of a sequence x [K, *] (`sequence`), or their sum [*] for one step's gate x [*],
    with tables theta, h, d [R, K] and R - 1 increasing gate `thresholds`, in x's dtype; `signed`: the steps run on
    the magnitude of the gate clamped to ±clamp_value, and the outputs take its sign (OutlierAwareThresholdNode).
    None where the kernels do not run it."""
    from ..codegen.few_spike_kernel import MAX_STEPS

    chosen = spiking_surrogate(surrogate)
    regions, steps = theta.shape
    # every thread reads K entries of each table row and R - 1 thresholds: tables of another shape are not read
    if chosen is None or not 1 <= steps <= MAX_STEPS or (sequence and (x.dim() < 1 or x.shape[0] != steps)) \
            or h.shape != theta.shape or d.shape != theta.shape or thresholds.numel() != regions - 1:
        return None
    if torch.is_grad_enabled() and any(t.requires_grad for t in (theta, h, d)):
        return None  # a table made learnable: the kernels give x's gradient alone, the composition the table's too
    runs = kernel_backend(x, backend)
    if runs is None:
        return None
    compute = compute_dtype(x.dtype)
    tables = [t.detach().to(device=x.device, dtype=compute).contiguous() for t in (theta, h, d)]
    cut = thresholds.detach().to(device=x.device, dtype=compute).reshape(-1)
    cut = cut if cut.numel() else torch.zeros(1, dtype=compute, device=x.device)  # read by no thread
    rows = x.contiguous().view(steps, -1) if sequence else x.contiguous().view(-1)
    return _FewSpike.apply(rows, *tables, cut, chosen, sequence, runs, signed, float(clamp_value)).view(x.shape)


class _FewSpike(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, rows: Tensor, theta: Tensor, h: Tensor, d: Tensor, thresholds: Tensor, surrogate: Any,
                sequence: bool, backend: str, signed: bool, clamp_value: float) -> Tensor:
        from ..codegen.few_spike_kernel import few_spike_kernels

        forward, backward = few_spike_kernels(theta.shape[1], theta.shape[0], str(rows.dtype).removeprefix("torch."),
                                              surrogate, sequence, signed)
        out = torch.empty_like(rows)
        neurons = rows.shape[-1]
        tables = {"theta": theta, "h": h, "d": d, "thresholds": thresholds,
                  **({"clamp_value": clamp_value} if signed else {})}
        if neurons:
            launch_per_neuron(forward, {"numel": neurons, "x": rows, **tables, "out": out}, backend)
        ctx.save_for_backward(rows)
        ctx.tables, ctx.kernel, ctx.backend = tables, backward, backend
        return out

    @staticmethod
    @differentiable_once
    def backward(ctx: Any, grad_out: Tensor) -> tuple[Tensor | None, ...]:
        (rows,) = ctx.saved_tensors
        grad_x = torch.empty_like(rows)
        neurons = rows.shape[-1]
        if neurons:
            step, neuron = (grad_out.stride(0), grad_out.stride(1)) if grad_out.dim() == 2 else (0, grad_out.stride(0))
            launch_per_neuron(ctx.kernel, {"numel": neurons, "x": rows, **ctx.tables, "grad_out": span(grad_out),
                                           "grad_step": step, "grad_neuron": neuron, "grad_x": grad_x}, ctx.backend)
        return grad_x, None, None, None, None, None, None, None, None, None
