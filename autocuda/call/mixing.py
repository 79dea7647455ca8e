"""A mixing over time then a threshold as one autograd op (SpikingJelly's parallel spiking neurons, `nn.psn`):
S = Θ(W X + b) over [T, N] rows, by the kernels of `codegen.mixing_kernel`. Backward runs one kernel (H rebuilt from
X): for T up to `FUSED_STEPS` it gives grad_x and the weights' and biases' gradients (summed over the neurons in
the kernel), else grad_h and grad_x, and torch's matrix product and sum give those (also under torch's
deterministic algorithms: the fused kernel's atomics add in any order). Autograd keeps X alone (which its
producer keeps anyway, where it trains). A thread takes two neighbouring neurons where the rows allow one access
for both (`word_lanes`), else one.

`fire` runs a call where the kernels can: rows on a GPU with NVRTC (or `backend="host"`: CPU rows through the host
runner, for tests), T up to `MAX_STEPS`, a surrogate of ours or SpikingJelly's in its spiking form, no
torch.compile trace (Dynamo would stop at the kernels' launch). Elsewhere it returns None and the caller composes
torch ops (`torch.addmm`, then the surrogate), as SpikingJelly does.
"""
from __future__ import annotations

import functools
from typing import Any

import torch

from ..base.errors import SpecError
from ..runtime.configs import compute_dtype, default_backend
from ..spec.surrogate import Surrogate, get_surrogate
from .ops import differentiable_once
from .program import SUPPORTED_DTYPES, forward_ad, functorch_active, tracing_state

__all__ = ["fire"]

Tensor = torch.Tensor


def fire(x: Tensor, weight: Tensor, bias: Tensor, surrogate: Any, backend: str | None = None) -> Tensor | None:
    """Θ(weight @ rows + bias) in x's shape, for x [T, *] (its rows [T, N]), weight [T, T] and bias broadcast to
    [T, 1], with `surrogate`'s gradient in backward, by the mixing kernels; None where they do not run this call
    (see the module). One autograd node: the weight's and bias's conversions and x's rows are made inside it."""
    from ..codegen.mixing_kernel import MAX_STEPS  # the kernels' builder (sympy, jinja2): on the first call only

    # where no kernel runs (a torch.compile trace among others) the surrogate is never read: a SpikingJelly one's
    # values changed after a trace are symbolic floats there, which `spiking_surrogate` cannot convert
    runs = kernel_backend(x, backend)
    if runs is None:
        return None
    steps = x.shape[0] if x.dim() else 0
    chosen = spiking_surrogate(surrogate)
    # the kernels add one bias per step: a bias that broadcasts over [T, N] as one value per step ([T, 1], or one
    # value), not one that torch would broadcast along the neurons ([T] or [1, T] against N = T neurons)
    per_step = bias.numel() == 1 or tuple(bias.shape) == (steps, 1)
    if chosen is None or not 1 <= steps <= MAX_STEPS or tuple(weight.shape) != (steps, steps) or not per_step \
            or weight.device != x.device or bias.device != x.device:
        return None  # (torch's composition names what is wrong)
    if torch.is_autocast_enabled(x.device.type):  # as autocast runs `torch.addmm`: in its dtype
        x = x.to(torch.get_autocast_dtype(x.device.type))
        if x.dtype not in SUPPORTED_DTYPES:
            return None
    return _Fire.apply(x, weight, bias, chosen, runs)


def kernel_backend(x: Tensor, backend: str | None) -> str | None:
    """Where kernels run a call on x: "cuda" (CUDA tensors with NVRTC), "host" (CPU tensors, asked for by name), or
    None where `backend` (default: the device's) runs no kernels for x's device, where x's dtype is none the kernels
    take, under a torch.compile trace (Dynamo would stop at the kernels' launch), a torch.func transform (whose
    batching and functorch autograd the kernels' Functions lack), torch.jit.trace (which records no launch) and
    forward-mode AD (no tangents through the kernels)."""
    if x.dtype not in SUPPORTED_DTYPES or torch.compiler.is_compiling() or functorch_active() or tracing_state() \
            or forward_ad._current_level >= 0:
        return None
    runs = default_backend(x.device.type) if backend is None else backend
    return runs if runs in ("cuda", "host") and (runs == "host") == (x.device.type == "cpu") else None


def spiking_surrogate(surrogate: Any) -> Surrogate | None:
    """Ours (a frozen copy: its values now) for a surrogate object of ours or SpikingJelly's in its spiking form."""
    try:
        chosen = get_surrogate(surrogate)
    except SpecError:
        return None
    return chosen.frozen() if chosen.spiking else None


class _Fire(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: Tensor, weight: Tensor, bias: Tensor, surrogate: Surrogate, backend: str) -> Tensor:
        from ..codegen.mixing_kernel import mixing_kernels

        steps, compute = x.shape[0], compute_dtype(x.dtype)
        rows = x.reshape(steps, -1).contiguous()
        lanes = word_lanes(rows)
        forward, backward, fused = mixing_kernels(steps, str(x.dtype).removeprefix("torch."), surrogate, lanes)
        # the kernels read the weights and biases in aligned vectors of `chunk_bytes`
        weights = aligned(weight.detach().to(compute).contiguous(), forward.chunk_bytes)
        biases = aligned(bias.detach().reshape(-1).expand(steps).to(compute).contiguous(),  # one bias (SlidingPSN's):
                         forward.chunk_bytes)                                              # each step
        spike = torch.empty_like(rows)
        neurons = rows.shape[1]
        if neurons:
            launch_per_neuron(forward, {"numel": neurons // lanes, "x": rows, "weight": weights, "bias": biases,
                                        "spike": spike}, backend)
        ctx.save_for_backward(rows, weights, biases)
        ctx.kernels, ctx.backend, ctx.shapes = (backward, fused), backend, (x.shape, weight.dtype, bias.shape,
                                                                           bias.dtype)
        return spike.view(x.shape)

    @staticmethod
    @differentiable_once
    def backward(ctx: Any, grad_spike: Tensor) -> tuple[Tensor | None, ...]:
        rows, weight, bias = ctx.saved_tensors
        shape, weight_dtype, bias_shape, bias_dtype = ctx.shapes
        gradient = grad_spike.reshape(rows.shape)  # a view where its strides allow (a sum's expanded one's do)
        grad_x = torch.empty_like(rows)
        steps, neurons = rows.shape
        args = {"x": rows, "weight": weight, "bias": bias, "grad_step": gradient.stride(0),
                "grad_neuron": gradient.stride(1), "grad_x": grad_x}
        if neurons:
            args["grad_spike"] = span(gradient)
        backward, fused = ctx.kernels
        grad_w: Tensor | None
        grad_b: Tensor | None
        if fused is not None and not torch.are_deterministic_algorithms_enabled():  # its atomics add in any order
            square = steps * steps
            sums = torch.zeros(square + steps, dtype=weight.dtype, device=rows.device)  # grad_W, then grad_b
            grad_w, grad_b = sums[:square].view(steps, steps), sums[square:]
            if neurons:
                launch_per_neuron(fused, args | {"numel": neurons // fused.lanes, "grad_weight": grad_w,
                                                 "grad_bias": grad_b}, ctx.backend,
                                  grid_stride=True)
        else:
            grad_h = torch.empty_like(rows)
            if neurons:
                launch_per_neuron(backward, args | {"numel": neurons // backward.lanes, "grad_h": grad_h}, ctx.backend)
            else:
                grad_h.zero_()
            grad_w = _outer_sum(grad_h, rows) if ctx.needs_input_grad[1] else None
            grad_b = grad_h.sum(1, dtype=bias.dtype) if ctx.needs_input_grad[2] else None
        grad_weight = grad_w.to(weight_dtype) if grad_w is not None and ctx.needs_input_grad[1] else None
        grad_bias = None
        if grad_b is not None and ctx.needs_input_grad[2]:
            grad_bias = (grad_b.sum() if len(grad_b) != bias_shape.numel() else grad_b).reshape(bias_shape) \
                .to(bias_dtype)
        return grad_x.view(shape), grad_weight, grad_bias, None, None


def word_lanes(rows: Tensor) -> int:
    """Neurons per thread for rows [T, N] (contiguous): 2 where the elements' size is one of PAIRED_ITEMSIZES, T is
    at most PAIRED_MAX_STEPS, a row's length is even and the rows start at a multiple of a pair's bytes, so that
    each pair is one aligned access; else 1. The outputs the kernels write are new tensors, aligned far beyond
    that."""
    from ..codegen.mixing_kernel import PAIRED_ITEMSIZES, PAIRED_MAX_STEPS

    steps, neurons = rows.shape
    size = rows.element_size()
    paired = size in PAIRED_ITEMSIZES and steps <= PAIRED_MAX_STEPS and neurons % 2 == 0
    return 2 if paired and rows.data_ptr() % (2 * size) == 0 else 1


def aligned(t: Tensor, alignment: int) -> Tensor:
    """`t` (contiguous), or a copy where its first element is not aligned to `alignment` bytes (a view into another
    tensor's storage): allocators align every new block far beyond 16 bytes."""
    return t if t.data_ptr() % alignment == 0 else t.clone()


def launch_per_neuron(kernel: Any, args: dict[str, Any], backend: str, grid_stride: bool = False) -> None:
    """One thread per neuron. On a GPU straight to the kernel's launcher with the arguments in parameter order
    (the caller makes every tensor: contiguous, of the kernel's dtypes, on one device); the host runner through
    the builder's checked call. `grid_stride`: a kernel whose threads loop over the neurons, launched on the GPU
    with at most GRID_STRIDE_BLOCKS blocks per multiprocessor."""
    from ..codegen.ckernel import launch_shape
    from ..toolchain.launch import current_stream_ptr

    grid, block = launch_shape(args["numel"])
    if backend != "cuda":
        kernel(grid, block, args, backend=backend)
        return
    device = next(value for value in args.values() if isinstance(value, Tensor)).get_device()
    if grid_stride:
        grid = (min(grid[0], GRID_STRIDE_BLOCKS * _multiprocessors(device)),)
    values = [value.data_ptr() if isinstance(value, Tensor) else value
              for value in map(args.__getitem__, kernel.cparams)]
    kernel.cuda_launch(device)(grid, block, values, current_stream_ptr(device))


GRID_STRIDE_BLOCKS = 4  # blocks per multiprocessor of a grid-stride kernel: each block's sums take one atomic each


@functools.cache
def _multiprocessors(device: int) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count


def span(t: Tensor) -> Tensor:
    """The memory `t` reads, as a contiguous vector from its first element (the kernel indexes it by t's strides):
    an expanded gradient is not copied."""
    return t.as_strided((1 + sum((size - 1) * stride for size, stride in zip(t.shape, t.stride())),), (1,))


# Neurons per chunk of the weights' gradient in float32 and float64 (`_outer_sum`)
CHUNK = 8192


def _outer_sum(grad_h: Tensor, rows: Tensor) -> Tensor:
    """grad_h @ rowsᵀ, [T, T] summed over the N neurons. cuBLAS splits so long a sum over many blocks for half
    types, not for float32 and float64 (`bench/results/2026-11-29-h200-psn-kernels`), so these sum chunks of CHUNK
    neurons as one batch and add the chunks' products."""
    neurons = rows.shape[1]
    chunks = neurons // CHUNK
    if rows.dtype in (torch.float16, torch.bfloat16) or chunks < 2:
        return grad_h @ rows.T
    whole = chunks * CHUNK
    steps = rows.shape[0]
    parts = torch.bmm(grad_h[:, :whole].reshape(steps, chunks, CHUNK).transpose(0, 1),
                      rows[:, :whole].reshape(steps, chunks, CHUNK).permute(1, 2, 0)).sum(0)
    return parts if whole == neurons else parts + grad_h[:, whole:] @ rows[:, whole:].T
