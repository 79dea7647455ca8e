"""Layers with SpikingJelly's class names, constructor signatures and defaults, each a `Neuron` of a shipped spec.

Arguments come in SpikingJelly 2.0's order, positionally too (`IFNode(1., 0., sg, False, 'm', True)`); our
`backend` follows them (SpikingJelly 2.0 has none). Numbers are checked as SpikingJelly asserts (tau > 1, ...),
with a ValueError naming the argument; tensors are not (see docs/spec-format.md, `domain`).

SpikingJelly class -> spec, and its argument names where they differ from the spec's parameter names:

| class               | spec             | renamed / extra arguments                                    |
|---------------------|------------------|--------------------------------------------------------------|
| `IFNode`            | `if`             |                                                              |
| `LIFNode`           | `lif`            | decay_input: the spec option                                 |
| `ParametricLIFNode` | `parametric_lif` | init_tau -> learnable w = -log(init_tau - 1); decay_input   |
| `QIFNode`           | `qif`            |                                                              |
| `EIFNode`           | `eif`            | (delta_T, theta_rh as in SpikingJelly)                       |
| `IzhikevichNode`    | `izhikevich`     | w_rest: initial value of the state w                         |
| `AdExNode` (new)    | `adex`           | w_rest: initial value of the state w                         |
| `ALIFNode` (new)    | `alif`           |                                                              |

More of SpikingJelly's classes are in `spikingjelly_more.py`.
"""
from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from .arguments import require_number
from .neuron import SIGMOID, Neuron, option_attribute

__all__ = ["IFNode", "LIFNode", "ParametricLIFNode", "QIFNode", "EIFNode", "IzhikevichNode", "AdExNode", "ALIFNode"]


def _common(surrogate_function: Any, detach_reset: bool, step_mode: str, store_v_seq: bool,
            backend: str | None) -> dict[str, Any]:
    return {"surrogate_function": surrogate_function, "detach_reset": detach_reset, "step_mode": step_mode,
            "store_v_seq": store_v_seq, "backend": backend}


def require(name: str, value: Any, test: Callable[[float], bool], rule: str) -> None:
    """SpikingJelly's assertion on a constructor argument, as a ValueError naming it (numbers only)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not test(float(value)):
        raise ValueError(f"{name}: must be {rule} (as SpikingJelly requires), got {value!r}")


def require_tau(tau: Any, name: str = "tau") -> None:
    require(name, tau, lambda t: t > 1, "> 1 (the membrane keeps 1 - 1/tau of itself per step)")


def require_reset_order(v_threshold: Any, v_rest: Any, v_reset: Any) -> None:
    """QIF and EIF: v_reset < v_threshold and v_reset <= v_rest, under a hard reset."""
    numbers = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (v_threshold, v_rest, v_reset))
    if v_reset is None or not numbers:
        return
    require("v_threshold", v_threshold, lambda v: v > v_reset, f"> v_reset ({v_reset})")
    require("v_rest", v_rest, lambda v: v >= v_reset, f">= v_reset ({v_reset})")


class IFNode(Neuron):
    def __init__(self, v_threshold: float = 1., v_reset: float | None = 0., surrogate_function: Any = SIGMOID,
                 detach_reset: bool = False, step_mode: str = "s", store_v_seq: bool = False,
                 backend: str | None = None):
        super().__init__("if", v_threshold=v_threshold, v_reset=v_reset,
                         **_common(surrogate_function, detach_reset, step_mode, store_v_seq, backend))


class LIFNode(Neuron):
    decay_input = option_attribute("decay_input")

    def __init__(self, tau: float = 2., decay_input: bool = True, v_threshold: float = 1.,
                 v_reset: float | None = 0., surrogate_function: Any = SIGMOID, detach_reset: bool = False,
                 step_mode: str = "s", store_v_seq: bool = False, backend: str | None = None):
        require_tau(tau)
        super().__init__("lif", tau=tau, v_threshold=v_threshold, v_reset=v_reset,
                         options={"decay_input": bool(decay_input)},
                         **_common(surrogate_function, detach_reset, step_mode, store_v_seq, backend))


class ParametricLIFNode(Neuron):
    decay_input = option_attribute("decay_input")

    def __init__(self, init_tau: float = 2.0, decay_input: bool = True, v_threshold: float = 1.,
                 v_reset: float | None = 0., surrogate_function: Any = SIGMOID, detach_reset: bool = False,
                 step_mode: str = "s", store_v_seq: bool = False, backend: str | None = None):
        if isinstance(init_tau, bool) or not isinstance(init_tau, (int, float)):
            raise TypeError(f"init_tau: expected a number, got {type(init_tau).__name__}")
        require_tau(init_tau, "init_tau")
        w = nn.Parameter(torch.tensor(-math.log(init_tau - 1.)))
        super().__init__("parametric_lif", w=w, v_threshold=v_threshold, v_reset=v_reset,
                         options={"decay_input": bool(decay_input)},
                         **_common(surrogate_function, detach_reset, step_mode, store_v_seq, backend))


class QIFNode(Neuron):
    def __init__(self, tau: float = 2., v_c: float = 0.8, a0: float = 1., v_threshold: float = 1.,
                 v_rest: float = 0., v_reset: float | None = -0.1, surrogate_function: Any = SIGMOID,
                 detach_reset: bool = False, step_mode: str = "s", store_v_seq: bool = False,
                 backend: str | None = None):
        require_tau(tau)
        require_reset_order(v_threshold, v_rest, v_reset)
        require("a0", a0, lambda a: a > 0, "> 0")
        super().__init__("qif", tau=tau, v_c=v_c, a0=a0, v_threshold=v_threshold, v_rest=v_rest, v_reset=v_reset,
                         **_common(surrogate_function, detach_reset, step_mode, store_v_seq, backend))


class EIFNode(Neuron):
    def __init__(self, tau: float = 2., delta_T: float = 1., theta_rh: float = .8, v_threshold: float = 1.,
                 v_rest: float = 0., v_reset: float | None = -0.1, surrogate_function: Any = SIGMOID,
                 detach_reset: bool = False, step_mode: str = "s", store_v_seq: bool = False,
                 backend: str | None = None):
        require_tau(tau)
        require_reset_order(v_threshold, v_rest, v_reset)
        require("delta_T", delta_T, lambda d: d > 0, "> 0")
        super().__init__("eif", tau=tau, delta_T=delta_T, theta_rh=theta_rh, v_threshold=v_threshold,
                         v_rest=v_rest, v_reset=v_reset,
                         **_common(surrogate_function, detach_reset, step_mode, store_v_seq, backend))


class IzhikevichNode(Neuron):
    def __init__(self, tau: float = 2., v_c: float = 0.8, a0: float = 1., v_threshold: float = 1.,
                 v_reset: float | None = 0., v_rest: float = -0.1, w_rest: float = 0., tau_w: float = 2.,
                 a: float = 0., b: float = 0., surrogate_function: Any = SIGMOID, detach_reset: bool = False,
                 step_mode: str = "s", store_v_seq: bool = False, backend: str | None = None):
        require_tau(tau)
        require("a0", a0, lambda a: a > 0, "> 0")
        require_number("w_rest", w_rest)
        self.w_rest = w_rest  # w's initial value, read at each reset (a change takes effect there)
        super().__init__("izhikevich", tau=tau, v_c=v_c, a0=a0, v_threshold=v_threshold, v_reset=v_reset,
                         v_rest=v_rest, tau_w=tau_w, a=a, b=b, initial={"w": "w_rest"},
                         **_common(surrogate_function, detach_reset, step_mode, store_v_seq, backend))


class AdExNode(Neuron):
    def __init__(self, tau: float = 2., delta_T: float = 1., theta_rh: float = .8, v_threshold: float = 1.,
                 v_rest: float = 0., v_reset: float | None = -0.1, R: float = 1., tau_w: float = 2.,
                 a: float = 0.1, b: float = 0.1, w_rest: float = 0., surrogate_function: Any = SIGMOID,
                 detach_reset: bool = False, step_mode: str = "s", store_v_seq: bool = False,
                 backend: str | None = None):
        require_number("w_rest", w_rest)
        self.w_rest = w_rest  # w's initial value, read at each reset (a change takes effect there)
        super().__init__("adex", tau=tau, delta_T=delta_T, theta_rh=theta_rh, v_threshold=v_threshold,
                         v_rest=v_rest, v_reset=v_reset, R=R, tau_w=tau_w, a=a, b=b, initial={"w": "w_rest"},
                         **_common(surrogate_function, detach_reset, step_mode, store_v_seq, backend))


class ALIFNode(Neuron):
    def __init__(self, tau: float = 2., tau_a: float = 20., beta: float = 0.2, v_threshold: float = 1.,
                 v_reset: float | None = 0., surrogate_function: Any = SIGMOID, detach_reset: bool = False,
                 step_mode: str = "s", store_v_seq: bool = False, backend: str | None = None):
        super().__init__("alif", tau=tau, tau_a=tau_a, beta=beta, v_threshold=v_threshold, v_reset=v_reset,
                         **_common(surrogate_function, detach_reset, step_mode, store_v_seq, backend))
