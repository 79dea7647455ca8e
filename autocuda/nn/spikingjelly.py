"""Layers with SpikingJelly's class names, constructor signatures and defaults, each a `Neuron` of a shipped spec.

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
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from .neuron import SIGMOID, Neuron

__all__ = ["IFNode", "LIFNode", "ParametricLIFNode", "QIFNode", "EIFNode", "IzhikevichNode", "AdExNode", "ALIFNode"]


def _common(surrogate_function, detach_reset, step_mode, backend, store_v_seq) -> dict[str, Any]:
    return {"surrogate_function": surrogate_function, "detach_reset": detach_reset, "step_mode": step_mode,
            "backend": backend, "store_v_seq": store_v_seq}


class IFNode(Neuron):
    def __init__(self, v_threshold: float = 1., v_reset: float | None = 0., surrogate_function: Any = SIGMOID,
                 detach_reset: bool = False, step_mode: str = "s", backend: str | None = None,
                 store_v_seq: bool = False):
        super().__init__("if", v_threshold=v_threshold, v_reset=v_reset,
                         **_common(surrogate_function, detach_reset, step_mode, backend, store_v_seq))


class LIFNode(Neuron):
    def __init__(self, tau: float = 2., decay_input: bool = True, v_threshold: float = 1.,
                 v_reset: float | None = 0., surrogate_function: Any = SIGMOID, detach_reset: bool = False,
                 step_mode: str = "s", backend: str | None = None, store_v_seq: bool = False):
        super().__init__("lif", tau=tau, v_threshold=v_threshold, v_reset=v_reset,
                         options={"decay_input": bool(decay_input)},
                         **_common(surrogate_function, detach_reset, step_mode, backend, store_v_seq))
        self.decay_input = bool(decay_input)


class ParametricLIFNode(Neuron):
    def __init__(self, init_tau: float = 2.0, decay_input: bool = True, v_threshold: float = 1.,
                 v_reset: float | None = 0., surrogate_function: Any = SIGMOID, detach_reset: bool = False,
                 step_mode: str = "s", backend: str | None = None, store_v_seq: bool = False):
        if not init_tau > 1:
            raise ValueError(f"init_tau: must be > 1 (1/tau = sigmoid(w) lies in (0, 1)), got {init_tau}")
        w = nn.Parameter(torch.tensor(-math.log(init_tau - 1.)))
        super().__init__("parametric_lif", w=w, v_threshold=v_threshold, v_reset=v_reset,
                         options={"decay_input": bool(decay_input)},
                         **_common(surrogate_function, detach_reset, step_mode, backend, store_v_seq))
        self.decay_input = bool(decay_input)


class QIFNode(Neuron):
    def __init__(self, tau: float = 2., v_c: float = 0.8, a0: float = 1., v_threshold: float = 1.,
                 v_rest: float = 0., v_reset: float | None = -0.1, surrogate_function: Any = SIGMOID,
                 detach_reset: bool = False, step_mode: str = "s", backend: str | None = None,
                 store_v_seq: bool = False):
        super().__init__("qif", tau=tau, v_c=v_c, a0=a0, v_threshold=v_threshold, v_rest=v_rest, v_reset=v_reset,
                         **_common(surrogate_function, detach_reset, step_mode, backend, store_v_seq))


class EIFNode(Neuron):
    def __init__(self, tau: float = 2., delta_T: float = 1., theta_rh: float = .8, v_threshold: float = 1.,
                 v_rest: float = 0., v_reset: float | None = -0.1, surrogate_function: Any = SIGMOID,
                 detach_reset: bool = False, step_mode: str = "s", backend: str | None = None,
                 store_v_seq: bool = False):
        super().__init__("eif", tau=tau, delta_T=delta_T, theta_rh=theta_rh, v_threshold=v_threshold,
                         v_rest=v_rest, v_reset=v_reset,
                         **_common(surrogate_function, detach_reset, step_mode, backend, store_v_seq))


class IzhikevichNode(Neuron):
    def __init__(self, tau: float = 2., v_c: float = 0.8, a0: float = 1., v_threshold: float = 1.,
                 v_reset: float | None = 0., v_rest: float = -0.1, w_rest: float = 0., tau_w: float = 2.,
                 a: float = 0., b: float = 0., surrogate_function: Any = SIGMOID, detach_reset: bool = False,
                 step_mode: str = "s", backend: str | None = None, store_v_seq: bool = False):
        super().__init__("izhikevich", tau=tau, v_c=v_c, a0=a0, v_threshold=v_threshold, v_reset=v_reset,
                         v_rest=v_rest, tau_w=tau_w, a=a, b=b, initial={"w": w_rest},
                         **_common(surrogate_function, detach_reset, step_mode, backend, store_v_seq))
        self.w_rest = w_rest


class AdExNode(Neuron):
    def __init__(self, tau: float = 2., delta_T: float = 1., theta_rh: float = .8, v_threshold: float = 1.,
                 v_rest: float = 0., v_reset: float | None = -0.1, R: float = 1., tau_w: float = 2.,
                 a: float = 0.1, b: float = 0.1, w_rest: float = 0., surrogate_function: Any = SIGMOID,
                 detach_reset: bool = False, step_mode: str = "s", backend: str | None = None,
                 store_v_seq: bool = False):
        super().__init__("adex", tau=tau, delta_T=delta_T, theta_rh=theta_rh, v_threshold=v_threshold,
                         v_rest=v_rest, v_reset=v_reset, R=R, tau_w=tau_w, a=a, b=b, initial={"w": w_rest},
                         **_common(surrogate_function, detach_reset, step_mode, backend, store_v_seq))
        self.w_rest = w_rest


class ALIFNode(Neuron):
    def __init__(self, tau: float = 2., tau_a: float = 20., beta: float = 0.2, v_threshold: float = 1.,
                 v_reset: float | None = 0., surrogate_function: Any = SIGMOID, detach_reset: bool = False,
                 step_mode: str = "s", backend: str | None = None, store_v_seq: bool = False):
        super().__init__("alif", tau=tau, tau_a=tau_a, beta=beta, v_threshold=v_threshold, v_reset=v_reset,
                         **_common(surrogate_function, detach_reset, step_mode, backend, store_v_seq))
