"""How a tensor parameter of a neuron kernel spreads over the neurons, and where each lane finds its value: facts
shared by the generator (`codegen.builder`, `codegen.schedule`) and the launch stage (`runtime.neuron_launch`),
which imports this without the generator's dependencies."""
from __future__ import annotations

from typing import Any

__all__ = ["BROADCASTS", "CHANNEL_KEYS", "CHANNEL_RUN", "CORRECTION_KEYS", "GRADIENT_GROUP", "PARAM_INDEX",
           "PER_CHANNEL", "PER_NEURON", "SHARED", "Broadcast", "channel_run", "gradient_groups"]

# How a tensor parameter spreads over the neurons (`KernelOptions.tensor_params`): one value for all, one per neuron,
# or one per channel of a [..., C, inner] neuron layout (neuron n's channel: n / ac_inner % ac_channels, the two
# sizes passed by value under CHANNEL_KEYS). The first two are spelled False and True: an option's spelling is part
# of its kernels' names, which kernels made before the third kind existed keep.
SHARED, PER_NEURON, PER_CHANNEL = False, True, "channel"
Broadcast = bool | str
BROADCASTS: tuple[Broadcast, ...] = (SHARED, PER_NEURON, PER_CHANNEL)
CHANNEL_KEYS = ("ac_channels", "ac_inner")
# c1 and c0 of the per-channel term a BPTT kernel of `gradients="corrected"` adds to the input's gradient
# (`codegen.options.GRADIENTS`), one per channel in the arithmetic's type
CORRECTION_KEYS = ("ac_grad_x_scale", "ac_grad_x_shift")
# A shared parameter's gradient leaves a BPTT kernel as one partial sum per group of GRADIENT_GROUP consecutive
# neurons (the last group may be shorter), each by one binary tree over its neurons whatever the layout
# (`Transfer.group_sum`): a thread's lanes (1, 2, 4 or 8 neurons) divide a group, a warp's 32 threads hold whole groups.
GRADIENT_GROUP = 32


def gradient_groups(neurons: Any) -> Any:  # an int, or a SymInt under torch.compile's fake tensors
    """How many partial sums a shared parameter's gradient has over `neurons` neurons."""
    return (neurons + GRADIENT_GROUP - 1) // GRADIENT_GROUP


def channel_run(lane: str) -> str:
    """The run of neurons of one channel that lane `lane` of a thread is in (runs repeat every C channels)."""
    return f"(ac_n0 + {lane}) / ac_inner"


CHANNEL_RUN = channel_run("lane")
# Where lane `lane` of a thread reads a tensor parameter: (offset, one element per lane after it?)
PARAM_INDEX: dict[Broadcast, tuple[str, bool]] = {SHARED: ("0", False), PER_NEURON: ("ac_n0", True),
                                                  PER_CHANNEL: (f"{CHANNEL_RUN} % ac_channels", False)}
