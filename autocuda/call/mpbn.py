"""SpikingJelly's MPBN LIF neuron on kernels (`nn.spikingjelly_mpbn`; the kernels of `codegen.mpbn_kernel`): a
multi-step call's spikes and final membrane, the BatchNorm's running statistics updated in place in training, and
the backward of the whole sequence (the input, the initial membrane and the BatchNorm's weight and bias). `run`
returns None where the kernels do not run the call (see `mixing.kernel_backend`; a surrogate not in its spiking
form; a batch of one value per channel in training, which the composition refuses as torch does): the layer then
composes torch ops.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from ..runtime.configs import compute_dtype
from ..spec.surrogate import Surrogate
from .mixing import kernel_backend, launch_per_neuron, span, spiking_surrogate
from .ops import differentiable_once

__all__ = ["Settings", "run"]

Tensor = torch.Tensor


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a call's kernels take besides its tensors: the LIF's charge and reset, the BatchNorm's mode and
    constants, the surrogate."""

    tau: float
    decay_input: bool
    v_threshold: float
    v_reset: float | None  # None: a soft reset (the charge decays towards 0)
    detach_reset: bool
    training: bool
    momentum: float
    eps: float
    surrogate: Any


def run(x: Tensor, v: Tensor | float, weight: Tensor | None, bias: Tensor | None, running_mean: Tensor,
        running_var: Tensor, settings: Settings, backend: str | None) -> tuple[Tensor, Tensor] | None:
    """The spikes [T, B, C, *] and the final membrane [B, C, *] of x [T, B, C, *] from membrane `v` (a number or a
    tensor of x[0]'s shape), the BatchNorm's affine `weight` and `bias` ([C] or None) and its running statistics
    ([C], updated in place in training); None where the kernels do not run the call."""
    runs = None if x.dim() < 3 or x.shape[0] < 1 else kernel_backend(x, backend)
    surrogate = spiking_surrogate(settings.surrogate)
    if runs is None or surrogate is None or torch.is_autocast_enabled(x.device.type):
        return None
    steps, channels = x.shape[0], x.shape[2]
    neurons = x[0].numel()
    if neurons == 0 or (settings.training and neurons // channels < 2):
        return None
    if isinstance(v, Tensor) and (v.shape != x.shape[1:] or v.device != x.device):
        return None
    if any(s.shape != (channels,) for s in (running_mean, running_var)):
        return None
    compute = compute_dtype(x.dtype)
    stats = [s.to(device=x.device, dtype=compute).contiguous() for s in (running_mean, running_var)]
    gamma = torch.ones(channels, dtype=compute, device=x.device) if weight is None else weight.to(compute)
    beta = torch.zeros(channels, dtype=compute, device=x.device) if bias is None else bias.to(compute)
    if isinstance(v, Tensor):
        initial = v.to(x.dtype).contiguous().view(-1)
    else:
        initial = torch.full((1,), float(v), dtype=x.dtype, device=x.device)
    plan = _Plan(settings, surrogate, runs, stats, neurons // (x.shape[1] * channels), channels, isinstance(v, Tensor))
    spikes, final = _Steps.apply(x.contiguous().view(steps, neurons), initial, gamma.contiguous(),
                                 beta.contiguous(), plan)
    for kept, updated in zip((running_mean, running_var), stats):
        if settings.training and updated is not kept:
            kept.copy_(updated)
    return spikes.view(x.shape), final.view(x.shape[1:])


@dataclasses.dataclass(frozen=True)
class _Plan:
    settings: Settings
    surrogate: Surrogate
    backend: str
    stats: list[Tensor]  # the running mean and variance in the compute dtype (updated in place)
    inner: int  # neurons of one channel in a row of the batch
    channels: int
    per_neuron: bool  # the initial membrane is a tensor (else one number)


def _common(plan: _Plan, steps: int, neurons: int) -> dict[str, Any]:
    s = plan.settings
    return {"numel": neurons, "steps": steps, "inner": plan.inner, "channels": plan.channels,
            "count": float(neurons // plan.channels), "training": int(s.training), "decay_input": int(s.decay_input),
            "hard": int(s.v_reset is not None), "tau": s.tau,
            "v_reset": 0.0 if s.v_reset is None else s.v_reset,  # the charge's rest too (0 under a soft reset)
            "v_threshold": s.v_threshold}


class _Steps(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, initial: Tensor, gamma: Tensor, beta: Tensor, plan: _Plan
                ) -> tuple[Tensor, Tensor]:
        from ..codegen.mpbn_kernel import mpbn_forward_kernel

        s = plan.settings
        steps, neurons = x.shape
        compute = gamma.dtype
        h = torch.empty(steps, neurons, dtype=compute, device=x.device)
        spikes, final = torch.empty_like(x), x.new_empty(neurons)
        sums = torch.zeros(steps, 2, plan.channels, dtype=torch.float64, device=x.device)
        mean, invstd = (torch.empty(steps, plan.channels, dtype=compute, device=x.device) for _ in range(2))
        args = _common(plan, steps, neurons)
        count = args["count"]
        args |= {
            "v0_per_neuron": int(plan.per_neuron), "eps": s.eps, "momentum": s.momentum,
            "unbias": count / (count - 1) if count > 1 else 1.0, "x": x, "v0": initial, "h": h, "spike": spikes,
            "v_final": final, "sums": sums, "mean": mean, "invstd": invstd, "running_mean": plan.stats[0],
            "running_var": plan.stats[1], "gamma": gamma, "beta": beta}
        kernel = mpbn_forward_kernel(str(x.dtype).removeprefix("torch."))
        for t in range(steps + 1):
            args["t"] = t
            launch_per_neuron(kernel, args, plan.backend)
        ctx.save_for_backward(h, mean, invstd, gamma, beta)
        ctx.plan, ctx.dtype = plan, x.dtype
        return spikes, final

    @staticmethod
    @differentiable_once
    def backward(ctx: Any, grad_spikes: Tensor | None, grad_final: Tensor | None) -> tuple[Tensor | None, ...]:
        from ..codegen.mpbn_kernel import mpbn_backward_kernel

        h, mean, invstd, gamma, beta = ctx.saved_tensors
        plan = ctx.plan
        steps, neurons = h.shape
        zero = torch.zeros(1, dtype=ctx.dtype, device=h.device)
        gradient = zero.expand(steps, neurons) if grad_spikes is None else grad_spikes.to(ctx.dtype)
        grad_x = torch.empty(steps, neurons, dtype=ctx.dtype, device=h.device)
        wants_v0 = ctx.needs_input_grad[1] and plan.per_neuron
        grad_v0 = torch.empty(neurons, dtype=ctx.dtype, device=h.device) if wants_v0 else zero
        sums = torch.zeros(steps, 2, plan.channels, dtype=torch.float64, device=h.device)
        args = _common(plan, steps, neurons) | {
            "detach_reset": int(plan.settings.detach_reset), "has_grad_final": int(grad_final is not None),
            "wants_grad_v0": int(wants_v0), "h": h, "mean": mean, "invstd": invstd, "gamma": gamma, "beta": beta,
            "grad_spike": span(gradient), "grad_step": gradient.stride(0), "grad_neuron": gradient.stride(1),
            "grad_final": zero if grad_final is None else grad_final.to(ctx.dtype).contiguous(),
            "g": torch.empty(neurons, dtype=h.dtype, device=h.device), "sums": sums, "grad_x": grad_x,
            "grad_v0": grad_v0}
        kernel = mpbn_backward_kernel(str(ctx.dtype).removeprefix("torch."), plan.surrogate)
        for t in range(steps, -1, -1):
            args["t"] = t
            launch_per_neuron(kernel, args, plan.backend)
        totals = sums.sum(0).to(gamma.dtype)  # [2, C]: Σ g (the bias's gradient) and Σ g x̂ (the weight's)
        return (grad_x, grad_v0 if wants_v0 else None, totals[1] if ctx.needs_input_grad[2] else None,
                totals[0] if ctx.needs_input_grad[3] else None, None)
