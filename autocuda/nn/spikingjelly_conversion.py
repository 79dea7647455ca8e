"""SpikingJelly 2.0's neurons for ANN-to-SNN conversion, with its names, constructor signatures (positional order
included), defaults and argument checks (a `ValueError` naming the argument); `backend` comes last. Each is a
`Neuron` of a shipped spec with `[[levels]]`:

| class                   | spec                  | spike                                                      |
|-------------------------|-----------------------|------------------------------------------------------------|
| `STBIFNode`             | `stbif`               | signed ternary: +1 where q >= 1 below pos_max, -1 where    |
|                         |                       | q < 0 above neg_min; output s * q_threshold; no training   |
| `ActivationAwareIFNode` | `activation_aware_if` | H(h + v_offset - v_threshold), threshold and offset one    |
|                         |                       | value or one per channel (`channel_dim`)                   |

SpikingJelly's `STBIFNode` (SpikeZIP, from `neuron/spikezip.py`) keeps its count `acc_q` as a float that it rounds
before each comparison; the spec compares the count as it is, which is the same wherever the count holds whole
numbers (always, from the reset values: it changes by +-1 a step).
"""
from __future__ import annotations

import math
import numbers
from typing import Any

import torch
from torch import nn

from .arguments import as_values, fixed_at_construction
from .layer_call import read_params
from .neuron import SIGMOID, Neuron
from .per_channel import PerChannel

__all__ = ["STBIFNode", "ActivationAwareIFNode"]


def _one_value(name: str, value: Any) -> torch.Tensor:
    """A number or a one-element tensor as a 0-d float32 tensor (SpikingJelly's buffers), checked finite."""
    if isinstance(value, bool) or not isinstance(value, (numbers.Real, torch.Tensor)):
        raise ValueError(f"{name}: expected a number or a one-element tensor, got {type(value).__name__}")
    tensor = value.detach().clone() if isinstance(value, torch.Tensor) else torch.tensor(float(value))
    if tensor.numel() != 1:
        raise ValueError(f"{name}: expected one value, got a tensor of shape {tuple(tensor.shape)}")
    tensor = tensor.reshape(()).float()
    if not bool(torch.isfinite(tensor)):
        raise ValueError(f"{name}: must be finite, got {float(tensor)}")
    return tensor


class STBIFNode(Neuron):
    """`STBIFNode(q_threshold, level, sym=False, pos_max=None, neg_min=None, step_mode='s')`: SpikeZIP's signed
    ternary neuron (inference only: a call with an input or a parameter that requires grad is refused)."""

    level = fixed_at_construction("level", "pos_max and neg_min were derived from it (set those)")
    sym = fixed_at_construction("sym", "pos_max and neg_min were derived from it (set those)")
    q_threshold: torch.Tensor

    def __init__(self, q_threshold: Any, level: int, sym: bool = False, pos_max: Any = None, neg_min: Any = None,
                 step_mode: str = "s", backend: str | None = None):
        if isinstance(level, bool) or not isinstance(level, numbers.Real) or not math.isfinite(level) or level < 2:
            raise ValueError(f"level: the quantizer's number of levels must be a whole number >= 2, got {level!r}")
        level, sym = int(level), bool(sym)
        threshold = _one_value("q_threshold", q_threshold)
        if threshold <= 0:
            raise ValueError(f"q_threshold: the quantizer's scale must be > 0, got {float(threshold)}")
        high = _one_value("pos_max", (level // 2 - 1 if sym else level - 1) if pos_max is None else pos_max)
        low = _one_value("neg_min", (-level // 2 if sym else 0) if neg_min is None else neg_min)
        super().__init__("stbif", step_mode=step_mode, backend=backend, q_threshold=threshold, pos_max=high,
                         neg_min=low)
        self.__dict__["_level"], self.__dict__["_sym"] = level, sym

    @classmethod
    def from_quantizer(cls, quantizer: nn.Module) -> STBIFNode:
        """The neuron of a SpikeZIP quantizer (its scale `s`, `sym`, `pos_max`, `neg_min`, and `level` where it
        has one, else pos_max - neg_min + 1)."""
        pos_max: Any = quantizer.pos_max
        neg_min: Any = quantizer.neg_min
        default_level = int(float(pos_max)) - int(float(neg_min)) + 1
        level = int(getattr(quantizer, "level", default_level))
        return cls(quantizer.s, level=level, sym=bool(quantizer.sym), pos_max=pos_max, neg_min=neg_min)

    @property
    def accumulated(self) -> torch.Tensor:
        """The value released so far, acc_q * q_threshold."""
        acc_q = self.__dict__.get("acc_q")
        if not isinstance(acc_q, torch.Tensor):
            raise RuntimeError("STBIFNode has no accumulated state before forward.")
        return acc_q * self.q_threshold.to(dtype=acc_q.dtype)

    def _inference_only(self, x: Any) -> None:
        """SpikingJelly's refusals: no autograd (the spike rounds), no empty sequence."""
        if isinstance(x, torch.Tensor) and self.step_mode == "m" and x.dim() >= 1 and x.shape[0] == 0:
            raise ValueError("x_seq: STBIFNode does not take an empty sequence (T = 0)")
        named = {"x": x, **read_params(self, torch.compiler.is_compiling())}
        for name, value in named.items():
            if isinstance(value, torch.Tensor) and value.requires_grad:
                raise RuntimeError(f"STBIFNode: {name} requires grad: STBIF runs inference only (its spike counts "
                                   "are rounded; SpikingJelly's refuses autograd too)")

    def single_step_forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        self._inference_only(inputs[0] if inputs else None)
        return super().single_step_forward(*inputs)

    def multi_step_forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        self._inference_only(inputs[0] if inputs else None)
        return super().multi_step_forward(*inputs)

    def _functional(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...], *, multi: bool
                    ) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
        self._inference_only(inputs[0] if isinstance(inputs, (tuple, list)) and inputs else None)
        return super()._functional(inputs, states, multi=multi)

    def extra_repr(self) -> str:
        return f"level={self.level}, sym={self.sym}, " + super().extra_repr()


def _first_step(x_seq: torch.Tensor) -> torch.Tensor:
    """A sequence's first step, or one of its shape where it has none (a call of T = 0 returns empty outputs)."""
    return x_seq[0] if x_seq.shape[0] else x_seq.new_empty(x_seq.shape[1:])


def _one_or_per_channel(name: str, value: Any, positive: bool) -> torch.Tensor:
    """SpikingJelly's check of ActivationAwareIFNode's threshold and offset: a scalar or a 1-D tensor, finite
    (and > 0 for the threshold)."""
    tensor = as_values(name, value)
    if tensor.dim() > 1:
        raise ValueError(f"{name}: must be a scalar or 1D tensor, but got shape {tuple(tensor.shape)}")
    values = tensor if tensor.is_floating_point() else tensor.float()
    if not bool(torch.isfinite(values).all()) or (positive and not bool((values > 0).all())):
        raise ValueError(f"{name}: must contain finite {'positive ' if positive else ''}values")
    return tensor


class ActivationAwareIFNode(PerChannel, Neuron):
    """`ActivationAwareIFNode(v_threshold=1., v_offset=0., channel_dim=-1, v_reset=None,
    surrogate_function=Sigmoid(), detach_reset=False, step_mode='s', store_v_seq=False)`: an IF that fires where
    h + v_offset >= v_threshold and subtracts v_threshold (or resets to v_reset); the threshold and the offset
    are buffers of one value or one per channel along `channel_dim` of a step's input. As SpikingJelly's, single
    steps do not append to `v_seq` (only multi-step calls set it, with `store_v_seq`)."""

    _per_channel = ("v_threshold", "v_offset")

    def __init__(self, v_threshold: Any = 1.0, v_offset: Any = 0.0, channel_dim: int = -1,
                 v_reset: float | None = None, surrogate_function: Any = SIGMOID, detach_reset: bool = False,
                 step_mode: str = "s", store_v_seq: bool = False, backend: str | None = None):
        if step_mode not in ("s", "m"):
            raise ValueError(f"step_mode: must be 's' or 'm', got {step_mode!r}")
        if v_reset is not None and (not isinstance(v_reset, float) or not math.isfinite(v_reset)):
            raise ValueError(f"v_reset: must be a finite float or None, got {v_reset!r}")
        for name, flag in (("detach_reset", detach_reset), ("store_v_seq", store_v_seq)):
            if not isinstance(flag, bool):
                raise ValueError(f"{name}: must be bool, got {flag!r}")
        if isinstance(channel_dim, bool) or not isinstance(channel_dim, int):
            raise ValueError(f"channel_dim: must be int, got {channel_dim!r}")
        super().__init__("activation_aware_if", surrogate_function=surrogate_function, detach_reset=detach_reset,
                         step_mode=step_mode, store_v_seq=store_v_seq, backend=backend,
                         v_threshold=_one_or_per_channel("v_threshold", v_threshold, positive=True),
                         v_offset=_one_or_per_channel("v_offset", v_offset, positive=False), v_reset=v_reset)
        self.channel_dim = channel_dim

    def single_step_forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        kept_v_seq = self.__dict__.get("v_seq")
        with self._channels_of(inputs[0]):
            out = super().single_step_forward(*inputs)
        self.__dict__["v_seq"] = kept_v_seq  # SpikingJelly's single steps leave v_seq as it was
        return out

    def multi_step_forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        x_seq = inputs[0]
        step = _first_step(x_seq) if isinstance(x_seq, torch.Tensor) and x_seq.dim() >= 1 else x_seq
        with self._channels_of(step):
            return super().multi_step_forward(*inputs)

    def _functional(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...], *, multi: bool
                    ) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
        x = _first_step(inputs[0]) if multi else inputs[0]
        with self._channels_of(x):
            return super()._functional(inputs, states, multi=multi)

    def extra_repr(self) -> str:
        return f"channel_dim={self.channel_dim}, " + super().extra_repr()
