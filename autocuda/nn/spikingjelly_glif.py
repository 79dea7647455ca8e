"""SpikingJelly 2.0's `GatedLIFNode` (GLIF, Yao et al. 2022), multi-step only: learned gates (the sigmoids of
alpha, gamma) mix a multiplicative and a linear leak and a multiplicative and a subtractive reset, which the
previous step's spike applies; the input is gated by a conductance learned per step, conduct[t].

The step's conductance is a parameter indexed by time, which the spec language has no word for; it gates only the
input (x[t] (1 - sigmoid(beta) (1 - sigmoid(conduct[t])))), so the layer gates the inputs with torch (one
element-wise product, differentiated by autograd) and runs the recurrence, which is a spec (`gated_lif`), on the
kernels. The parameters are SpikingJelly's, with its names, shapes (one value, or one per channel with `inplane`,
along dimension 1 of a step's input) and initialisation (alpha, beta and gamma drawn with numpy's global
generator, as SpikingJelly's: seed numpy to reproduce them).
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from torch import nn

from .arguments import fixed_at_construction
from .neuron import SIGMOID, Neuron
from .per_channel import PerChannel

__all__ = ["GatedLIFNode"]

# SpikingJelly's parameter order (its state dict's); beta and conduct gate the input, the others are the spec's
PARAMETER_ORDER = ("alpha", "beta", "gamma", "tau", "v_threshold", "linear_decay", "v_subreset", "conduct")


def _open_unit(name: str, value: Any) -> float:
    """A value in (0, 1), whose logit initialises a gate (SpikingJelly asserts < 1; 0 or less has no logit)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 < value < 1.0:
        raise ValueError(f"{name}: expected a float in (0, 1) (a sigmoid's value), got {value!r}")
    return float(value)


def _logit(value: float, shape: tuple[int, ...]) -> nn.Parameter:
    return nn.Parameter(torch.full(shape, -math.log(1 / value - 1), dtype=torch.float))


class GatedLIFNode(PerChannel, Neuron):
    """`GatedLIFNode(T, inplane=None, init_linear_decay=None, init_v_subreset=None, init_tau=0.25,
    init_v_threshold=0.5, init_conduct=0.5, surrogate_function=Sigmoid(), step_mode='m')`: a call takes exactly T
    steps; each call starts from no previous spike, and from the membrane the last call left."""

    T = fixed_at_construction("T", "the per-step conductances' shape follows it")

    _per_channel = PARAMETER_ORDER[:1] + PARAMETER_ORDER[2:7]
    channel_dim = 1
    beta: nn.Parameter
    conduct: nn.Parameter

    def __init__(self, T: int, inplane: int | None = None, init_linear_decay: float | None = None,
                 init_v_subreset: float | None = None, init_tau: float = 0.25, init_v_threshold: float = 0.5,
                 init_conduct: float = 0.5, surrogate_function: Any = SIGMOID, step_mode: str = "m",
                 backend: str | None = None):
        if isinstance(T, bool) or not isinstance(T, int) or T < 1:
            raise ValueError(f"T: expected a whole number of time-steps >= 1, got {T!r}")
        if inplane is not None and (isinstance(inplane, bool) or not isinstance(inplane, int) or inplane < 1):
            raise ValueError(f"inplane: expected None or a number of channels >= 1, got {inplane!r}")
        if step_mode != "m":
            raise ValueError(f"step_mode: GatedLIFNode runs in multi-step mode only ('m'), got {step_mode!r}")
        init_v_threshold = _open_unit("init_v_threshold", init_v_threshold)
        decay = init_v_threshold / (T * 2) if init_linear_decay is None else init_linear_decay
        subreset = init_v_threshold if init_v_subreset is None else init_v_subreset
        shape = () if inplane is None else (inplane,)
        alpha, beta, gamma = (nn.Parameter(torch.tensor(0.2 * (np.random.rand(*shape) - 0.5), dtype=torch.float))
                              for _ in range(3))
        super().__init__("gated_lif", surrogate_function=surrogate_function, step_mode="m", backend=backend,
                         alpha=alpha, gamma=gamma, tau=_logit(_open_unit("init_tau", init_tau), shape),
                         v_threshold=_logit(init_v_threshold, shape),
                         linear_decay=_logit(_open_unit("init_linear_decay", decay), shape),
                         v_subreset=_logit(_open_unit("init_v_subreset", subreset), shape))
        self.beta = beta
        self.conduct = _logit(_open_unit("init_conduct", init_conduct), (T, *shape))
        self._parameters = {name: self._parameters[name] for name in PARAMETER_ORDER}
        self.__dict__["_T"] = T

    def input_gate(self, x_seq: torch.Tensor) -> torch.Tensor:
        """The factor of each step's input, 1 - sigmoid(beta) (1 - sigmoid(conduct[t])), shaped to multiply x_seq."""
        gate = 1 - self.beta.sigmoid() * (1 - self.conduct.sigmoid())
        if gate.dim() == 1:
            return gate.view(-1, *([1] * (x_seq.dim() - 1)))
        if x_seq.dim() < 3 or x_seq.shape[2] != gate.shape[1]:
            raise ValueError(f"x_seq: GatedLIFNode(inplane={gate.shape[1]}) expects [T, N, {gate.shape[1]}, ...], "
                             f"got {tuple(x_seq.shape)}")
        return gate.view(*gate.shape[:1], 1, *gate.shape[1:], *([1] * (x_seq.dim() - 3)))

    def _gated(self, x_seq: Any) -> torch.Tensor:
        if not isinstance(x_seq, torch.Tensor) or x_seq.dim() < 2 or x_seq.shape[0] != self.T:
            raise ValueError(f"x_seq: GatedLIFNode(T={self.T}) expects a tensor [T, N, ...] of {self.T} steps, got "
                             f"{tuple(x_seq.shape) if isinstance(x_seq, torch.Tensor) else type(x_seq).__name__}")
        return x_seq * self.input_gate(x_seq)

    def single_step_forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        raise ValueError("step_mode: GatedLIFNode runs in multi-step mode only ('m')")

    def multi_step_forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        gated = self._gated(inputs[0] if len(inputs) == 1 else None)
        self.__dict__["s_prev"] = 0.0  # no previous spike at a call's first step, as SpikingJelly's
        with self._channels_of(gated[0]):
            return super().multi_step_forward(gated)

    def _functional(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...], *, multi: bool
                    ) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
        if not multi:
            raise ValueError("step_mode: GatedLIFNode runs in multi-step mode only ('m')")
        gated = self._gated(inputs[0] if isinstance(inputs, (tuple, list)) and len(inputs) == 1 else None)
        states = (states[0], 0.0, *states[2:])
        with self._channels_of(gated[0]):
            return super()._functional((gated,), states, multi=True)

    def extra_repr(self) -> str:
        return f"T={self.T}, " + super().extra_repr()
