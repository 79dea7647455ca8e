"""A layer configuration's kernels launched with their arguments by name, a layout chosen or the call's own: how
`check_spec` and the tests run one kernel (the ops pass arguments in a fixed order: `runtime.neuron_launch`).

x is [T, N] (or [N] for a single step), states [N], tensor parameters [N] (one per neuron) or [1] (shared),
scalars any real numbers. Names follow `autocuda.codegen.neuron_kernel`'s docstring.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from ...base.errors import KernelArgumentError
from ...codegen.layout import Layout
from ...runtime.neuron_launch import Flags, KernelCall, NeuronConfig


def forward(config: NeuronConfig, x: torch.Tensor | Sequence[torch.Tensor], initial: Mapping[str, torch.Tensor | float],
            params: Mapping[str, Any], *, single_step: bool = False, store_state_seq: bool = False,
            save_for_backward: bool = True, final_states: bool = True, backend: str = "cuda",
            layout: Layout | Mapping[str, Any] | None = None) -> dict[str, torch.Tensor]:
    """Launch the forward kernel: returns spike_seq, h_seq / <state>_seq as configured, and <state>_final
    (unless `final_states` is False), in the kernel's parameter order. `x`: the input, or a sequence of one
    tensor per step input for a spec with several (all of one shape). `initial`: every state's [N] tensor, or
    every state's one number. `layout` (a Layout, or some of its fields by name) overrides the fixed rules."""
    inputs = (x,) if isinstance(x, torch.Tensor) else tuple(x)
    if len(inputs) != len(config.input_keys) or any(u.shape != inputs[0].shape for u in inputs):
        raise KernelArgumentError(f"{config.spec.name}: expected {len(config.input_keys)} input tensor(s) of one "
                                  f"shape ({', '.join(config.spec.inputs)}), got shapes "
                                  f"{[tuple(u.shape) for u in inputs]}")
    numbers = [not isinstance(v, torch.Tensor) for v in initial.values()]
    if any(numbers) and not all(numbers):
        raise TypeError("initial states: give every state as a tensor or every state as a number, not a mix")
    given = {**dict(zip(config.input_keys, inputs)), **{f"{s}_init": v for s, v in initial.items()}, **params}
    flags = (store_state_seq, save_for_backward, not numbers or not numbers[0], final_states)
    return _run(config, "step-forward" if single_step else "fptt", flags, given, inputs[0], single_step, backend,
                layout)


def backward(config: NeuronConfig, grads: Mapping[str, torch.Tensor], saved: Mapping[str, torch.Tensor],
             params: Mapping[str, Any], *, single_step: bool = False, grad_state_seq: bool = False,
             grad_finals: bool = True, given_inits: bool = True, backend: str = "cuda",
             layout: Layout | Mapping[str, Any] | None = None, gradients: str = "all") -> dict[str, torch.Tensor]:
    """Launch the backward kernel. `grads`: grad_spike_seq, grad_<state>_final (unless `grad_finals` is False:
    they are zero) and grad_<state>_seq (when `grad_state_seq`);
    `saved`: h_seq and whatever else the kernel reads (x_seq or each input's sequence, <state>_seq,
    <state>_init: tensors, or numbers when `given_inits` is False). Returns grad_x_seq (grad_<input>_seq for
    each of several inputs), grad_<state>_init (for tensors given) and grad_<param>
    (partial sums, one per neuron, or per group of `GRADIENT_GROUP` neurons for a shared parameter; reduce them).
    `gradients` (BPTT): what it stores (`kernels.neuron_kernel`); the
    correction's c1 and c0 come in `params` under their keys."""
    flags = (grad_state_seq, grad_finals, given_inits) + (() if gradients == "all" else (gradients,))
    return _run(config, "step-backward" if single_step else "bptt", flags, {**grads, **saved, **params},
                grads["grad_spike_seq"], single_step, backend, layout)


def _run(config: NeuronConfig, kind: str, flags: Flags, given: Mapping[str, Any], like: torch.Tensor, single: bool,
         backend: str, layout: Layout | Mapping[str, Any] | None) -> dict[str, torch.Tensor]:
    """The outputs by name of a kernel called with its arguments by name (the scalars any real numbers)."""
    args = [float(v) if type(v) is int else v for v in given.values()]
    steps = None if single else like.shape[0]
    bound = KernelCall(config, kind, flags, tuple(given)).bind(args, like, like.shape[-1], steps, backend,
                                                             layout=None if layout is None else Layout.of(layout))
    return dict(zip(bound.recipe.outputs, bound(args, like)))
