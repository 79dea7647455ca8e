"""More of SpikingJelly 2.0's neuron classes, with its names, constructor signatures (positional order included)
and defaults; `backend` comes last. Each is a `Neuron` of a shipped spec (see docs/semantics.md):

| class                 | spec                | notes                                                          |
|-----------------------|---------------------|----------------------------------------------------------------|
| `SimpleIFNode`        | `if`                | v starts at 0 (not v_reset), as SpikingJelly's SimpleBaseNode  |
| `SimpleLIFNode`       | `lif`               | tau, decay_input required; v starts at 0; hard reset only      |
| `HalfThresholdIFNode` | `if`                | soft reset; v starts at v_threshold / 2                         |
| `CUBALIFNode`         | `cuba_lif_discrete` | states v, c; default surrogate Rect(alpha=1)                    |
| `KLIFNode`            | `klif`              | learnable k; scale_reset=True is refused (see below)            |
| `RAFNode`             | `raf`               | SpikingJelly's dt is the parameter step_dt                      |

KLIFNode's `scale_reset=True` resets h / k instead of h: the reset rules act on the charge itself, so the spec
language cannot say it.
"""
from __future__ import annotations

import math
from typing import Any

import torch

from ..spec.surrogate import Rect
from .neuron import SIGMOID, Neuron, option_attribute
from .spikingjelly import _common, require, require_tau

__all__ = ["SimpleIFNode", "SimpleLIFNode", "HalfThresholdIFNode", "CUBALIFNode", "KLIFNode", "RAFNode"]

RECT = Rect().frozen()  # CUBALIFNode's default surrogate (SpikingJelly's; each layer changes a copy of its own)


class SimpleIFNode(Neuron):
    def __init__(self, v_threshold: float = 1., v_reset: float | None = 0., surrogate_function: Any = SIGMOID,
                 detach_reset: bool = False, step_mode: str = "s", backend: str | None = None):
        super().__init__("if", v_threshold=v_threshold, v_reset=v_reset, initial={"v": 0.0},
                         **_common(surrogate_function, detach_reset, step_mode, False, backend))


SIMPLE_LIF_RESET = ("v_reset: SimpleLIFNode needs a number (its charge uses v_reset); LIFNode(v_reset=None) is the "
                    "soft-reset LIF")


class SimpleLIFNode(Neuron):
    decay_input = option_attribute("decay_input")

    def __init__(self, tau: float, decay_input: bool, v_threshold: float = 1., v_reset: float = 0.,
                 surrogate_function: Any = SIGMOID, detach_reset: bool = False, step_mode: str = "s",
                 backend: str | None = None):
        if v_reset is None:  # SpikingJelly's charge reads v_reset: it has no soft reset
            raise ValueError(SIMPLE_LIF_RESET)
        super().__init__("lif", tau=tau, v_threshold=v_threshold, v_reset=v_reset, initial={"v": 0.0},
                         options={"decay_input": bool(decay_input)},
                         **_common(surrogate_function, detach_reset, step_mode, False, backend))

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "v_reset" and value is None:  # refused as at construction
            raise ValueError(SIMPLE_LIF_RESET)
        super().__setattr__(name, value)


class HalfThresholdIFNode(Neuron):
    v_threshold: Any  # a number, or a tensor set since (`Neuron` reads its parameters afresh each call)

    def __init__(self, v_threshold: float = 1., surrogate_function: Any = SIGMOID, detach_reset: bool = False,
                 step_mode: str = "s", store_v_seq: bool = False, backend: str | None = None):
        if isinstance(v_threshold, torch.Tensor):
            if v_threshold.numel() != 1:
                raise ValueError(f"v_threshold: must be one number, got a tensor of shape {tuple(v_threshold.shape)}")
            v_threshold = float(v_threshold)
        if isinstance(v_threshold, bool) or not isinstance(v_threshold, (int, float)):
            raise TypeError(f"v_threshold: expected a number, got {type(v_threshold).__name__}")
        require("v_threshold", v_threshold, lambda v: math.isfinite(v) and v > 0, "finite and > 0")
        super().__init__("if", v_threshold=float(v_threshold), v_reset=None, initial={"v": "half_threshold"},
                         **_common(surrogate_function, detach_reset, step_mode, store_v_seq, backend))

    @property
    def half_threshold(self) -> Any:
        """v's initial value, half of v_threshold as it is now (each reset, and a new input shape, read it)."""
        return self.v_threshold / 2


class CUBALIFNode(Neuron):
    def __init__(self, c_decay: float = 0.5, v_decay: float = 0.75, v_threshold: float = 0.5,
                 v_reset: float | None = 0., surrogate_function: Any = RECT, backend: str | None = None):
        super().__init__("cuba_lif_discrete", c_decay=c_decay, v_decay=v_decay, v_threshold=v_threshold,
                         v_reset=v_reset, **_common(surrogate_function, False, "s", False, backend))


class KLIFNode(Neuron):
    decay_input = option_attribute("decay_input")

    @property
    def scale_reset(self) -> bool:
        """False: the reset acts on h (True, SpikingJelly's reset of h / k, is refused, as in the constructor)."""
        return False

    @scale_reset.setter
    def scale_reset(self, value: bool) -> None:
        if value is not False:
            raise ValueError("scale_reset: only False is supported (a reset of h / k is not expressible in the spec "
                             f"language), got {value!r}")

    def __init__(self, scale_reset: bool = False, tau: float = 2., decay_input: bool = True,
                 v_threshold: float = 1., v_reset: float | None = 0., surrogate_function: Any = SIGMOID,
                 detach_reset: bool = False, step_mode: str = "s", store_v_seq: bool = False,
                 backend: str | None = None):
        if scale_reset is not False:
            raise ValueError("scale_reset: only False is supported (a reset of h / k is not expressible in "
                             f"the spec language), got {scale_reset!r}")
        require_tau(tau)
        super().__init__("klif", tau=tau, v_threshold=v_threshold, v_reset=v_reset,
                         options={"decay_input": bool(decay_input)},
                         **_common(surrogate_function, detach_reset, step_mode, store_v_seq, backend))


class RAFNode(Neuron):
    def __init__(self, b: float = -0.2, omega: float = 1., dt: float = 1., v_threshold: float = 1.,
                 v_reset: float | None = 0., surrogate_function: Any = SIGMOID, detach_reset: bool = False,
                 step_mode: str = "s", store_v_seq: bool = False, backend: str | None = None):
        require("b", b, lambda v: v < 0, "< 0")
        require("omega", omega, lambda v: v > 0, "> 0")
        require("dt", dt, lambda v: v > 0, "> 0")
        super().__init__("raf", b=b, omega=omega, step_dt=dt, v_threshold=v_threshold, v_reset=v_reset,
                         **_common(surrogate_function, detach_reset, step_mode, store_v_seq, backend))

    @property
    def dt(self) -> Any:
        """SpikingJelly's name of the step's length (the spec's step_dt)."""
        return self.step_dt

    @dt.setter
    def dt(self, value: Any) -> None:
        self.step_dt = value
