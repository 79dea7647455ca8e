"""The fused BatchNorm layer's training call with batch statistics, backward in two passes of the neuron's kernels.

BatchNorm's backward needs, per channel, sums over the whole batch of the gradient reaching its output before
any element's input gradient is final: with y = a_c * x + b_c, a_c = w_c * rstd_c, b_c = bias_c - mean_c * a_c,

    S_a = sum dL/da_c,  S_b = sum dL/db_c                     (the neuron kernel's per-channel sums)
    G = S_a - mean * S_b                                      (= sum dL/dy * (x - mean))
    dL/dw = rstd * G,  dL/dbias = S_b
    dL/dmean = -a * S_b,  dL/dvar = -a * rstd^2 * G / 2
    dL/dx = a * dL/dy + c1 * x + c0,  c1 = 2 dL/dvar / M,  c0 = dL/dmean / M - c1 * mean   (M values per channel)

So backward runs the neuron's BPTT twice, both replaying h from x (`save_h=False`): the first pass
(`gradients="sums"`) reads the spikes' gradient and x and stores S_a and S_b alone; the per-channel algebra above
runs in torch on C values; the second pass (`gradients="corrected"`) reads them again and stores dL/dx with
c1 * x + c0 added, and every other gradient (initial states, the neuron's own parameters). No gradient of the
normalised input is written or read, and no pass of its own adds the statistics' term.
"""
from __future__ import annotations

from typing import Any, NamedTuple

import torch

from ..call import ops
from ..call.program import Call, neuron_shaped
from ..codegen.broadcast import PER_CHANNEL
from ..spec.transform import INPUT_SCALE, INPUT_SHIFT

_AFFINE = (INPUT_SCALE, INPUT_SHIFT)


class Block(NamedTuple):
    """A call's constants: what the Function's forward and backward need besides tensors (Dynamo keeps them)."""

    key: str
    initial: tuple[float, ...]        # initial states as numbers ((): given as tensors)
    scalars: tuple[float, ...]
    affine_at: tuple[int, int]        # where a and b stand among the kernel's tensor parameters
    others: tuple[tuple[bool, bool], ...]  # each other tensor parameter: (learnable?, one per neuron?)
    channel: int                      # x's channel dim
    per_channel: int                  # values per channel (M)
    eps: float
    sums: tuple[str, ...]             # the first pass's outputs: a's and b's names, in the kernel's order
    picks: tuple[int, ...]            # what backward reads, among (x, initial states, forward's outputs)
    spike_at: int                     # where forward's outputs hold the spikes
    finals: tuple[int, ...]           # ... and the final states (none: the kernels write none)


def two_passes(call: Call, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float,
               channel: int, final_states: bool = True
               ) -> tuple[torch.Tensor, list[torch.Tensor], torch.Tensor, torch.Tensor]:
    """(spikes, final states ([] where `final_states` is False: the kernels write none), batch mean, batch variance)
    of a training call whose a and b come from the batch statistics of x (`call`: the neuron's call with a and b
    given as placeholders of their shape that need gradients); every gradient flows back to x, weight, bias, the
    initial states and the neuron's parameters."""
    layer = call.program
    names = [name for name, _ in layer.tensors]
    tensors = call.tensor_args()
    others = [t for name, t in zip(names, tensors) if name not in _AFFINE]
    (spike_at, finals, _), picks, learnable = ops.form_layout(call.key, False, False, True, not call.numbers,
                                                              final_states)
    block = Block(call.key, tuple(float(s) for s in call.states) if call.numbers else (),
                  tuple([float(call.values[n]) for n in layer.scalars] + call.channel_sizes()),
                  (names.index(INPUT_SCALE), names.index(INPUT_SHIFT)),
                  tuple((name in learnable, kind is True) for name, kind in layer.tensors if name not in _AFFINE),
                  channel, x.numel() // x.shape[channel], eps, tuple(name for name in learnable if name in _AFFINE),
                  picks, spike_at, finals)
    states = [] if call.numbers else [s.reshape(-1) for s in call.state_tensors()]
    out = _TwoPasses.apply(block, x, weight, bias, len(states), *states, *others)
    return out[0], list(out[1:-2]), out[-2], out[-1]


def eligible(call: Call) -> bool:
    """Whether the two passes serve this call: kernels (not the reference), a and b one value per channel (not
    under deterministic algorithms, nor on channels-last input) and no other parameter, one step input."""
    kinds = dict(call.program.tensors)
    return call.backend != "reference" and len(call.program.inputs) == 1 \
        and all((kind == PER_CHANNEL) == (name in _AFFINE) for name, kind in kinds.items()) \
        and all(name in kinds for name in _AFFINE)


class _TwoPasses(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, block: Block, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, n_states: int,
                *tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        states, others = list(tensors[:n_states]), list(tensors[n_states:])
        mean, var = batch_statistics(x, block.channel)
        rstd = torch.rsqrt(var + block.eps)
        scale = weight * rstd
        shift = bias - mean * scale
        params = _with_affine(others, scale, shift, block.affine_at)
        flat = x.reshape(x.shape[0], -1)
        outputs = ops.forward(block.key, flat, states, list(block.initial), params, list(block.scalars), False, True,
                              bool(block.finals), (), x.shape[1:])  # (a neuron has a state: finals, where written)
        available = (flat, *states, *outputs)
        ctx.save_for_backward(*[available[i] for i in block.picks], *params, weight, mean, rstd, x)
        ctx.block, ctx.n_saved, ctx.n_states = block, len(block.picks), n_states
        ctx.mark_non_differentiable(mean, var)
        ctx.set_materialize_grads(False)
        spikes = outputs[block.spike_at].view(x.shape)
        finals = [neuron_shaped(outputs[i], x.shape[1:]) for i in block.finals]
        return (spikes, *finals, mean, var)

    @staticmethod
    @ops.differentiable_once  # a double backward (create_graph=True) raises, as the neuron's own kernels' does
    def backward(ctx: Any, grad_spikes: torch.Tensor | None, *grads: torch.Tensor | None) -> tuple[Any, ...]:
        block: Block = ctx.block
        saved = ctx.saved_tensors
        picked, params = list(saved[:ctx.n_saved]), list(saved[ctx.n_saved:-4])
        weight, mean, rstd, x = saved[-4:]
        shape = (x.shape[0], x.numel() // x.shape[0])
        grad_spike = torch.zeros(shape, dtype=x.dtype, device=x.device) if grad_spikes is None \
            else grad_spikes.reshape(shape).contiguous()
        finals = grads[:-2]
        grad_finals = [] if all(g is None for g in finals) else \
            [torch.zeros(shape[1], dtype=x.dtype, device=x.device) if g is None else g.reshape(-1).contiguous()
             for g in finals]
        initial, scalars = list(block.initial), list(block.scalars)
        sums = dict(zip(block.sums, ops.backward_part(block.key, "sums", grad_spike, grad_finals, picked, initial,
                                                      params, scalars, [])))
        sum_scale, sum_shift = sums[INPUT_SCALE], sums[INPUT_SHIFT]
        a = params[block.affine_at[0]]
        centred = sum_scale - mean * sum_shift
        grad_var = -0.5 * a * rstd * rstd * centred
        c1 = grad_var * (2.0 / block.per_channel)
        c0 = -a * sum_shift / block.per_channel - c1 * mean
        rest = ops.backward_part(block.key, "corrected", grad_spike, grad_finals, picked, initial, params, scalars,
                                 [c1.contiguous(), c0.contiguous()])
        grad_x, grad_states, partials = rest[0].view(x.shape), rest[1:1 + ctx.n_states], rest[1 + ctx.n_states:]
        grad_others: list[torch.Tensor | None] = []
        at = 0
        for learnable, per_neuron in block.others:
            if not learnable:
                grad_others.append(None)
                continue
            partial = partials[at]
            at += 1
            grad_others.append(partial if per_neuron else partial.sum(0, keepdim=True))
        grad_weight = (rstd * centred).to(weight.dtype)
        return (None, grad_x, grad_weight, sum_shift.to(weight.dtype), None, *grad_states, *grad_others)


def batch_statistics(x: torch.Tensor, channel: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Per channel (dim `channel` of x): the mean and the biased variance over the other dims."""
    dims = [d for d in range(x.dim()) if d != channel]
    if torch.compiler.is_compiling():
        # Two plain reductions (the mean, then the squared deviations'): Inductor's one-pass var_mean kernel for
        # large layers fails in Triton's compiler
        mean = x.mean(dim=dims, keepdim=True)
        return mean.reshape(-1), (x - mean).square().mean(dim=dims)
    var, mean = torch.var_mean(x, dim=dims, correction=0)
    return mean, var


def _with_affine(others: list[torch.Tensor], scale: torch.Tensor, shift: torch.Tensor, at: tuple[int, int]
                 ) -> list[torch.Tensor]:
    """The kernel's tensor parameters in order: a and b (one per channel, flat) at their places among the others."""
    params = list(others)
    placed = ((at[0], scale), (at[1], shift)) if at[0] < at[1] else ((at[1], shift), (at[0], scale))
    for position, value in placed:  # the lower place first: the higher one counts it
        params.insert(position, value.reshape(-1).contiguous())
    return params
