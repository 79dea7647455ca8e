"""Torch modules for the NIR nodes that are not spiking neurons of a spec.

NIR's non-spiking neurons output their membrane, while a spec's output is a spike; they run here as torch ops
(any device, autograd, no fused kernel), one step at a time, with the same discretisation as the specs
(autocuda.nir.specs): "euler" v' = v + dt f(v, x), "semi_implicit" (CubaLI: the current first), or "exact"
with x held over the step.

    LI        tau dv/dt = (v_leak - v) + r x                  output v
    I             dv/dt = r x                                 output v
    CubaLI    tau_syn di/dt = -i + w_in x,  tau_mem dv/dt = (v_leak - v) + r i      output v
    Threshold y = 1 where x > threshold, else 0 (no gradient)
    Delay     y[t] = x[t - k], k = delay / dt steps per neuron (zeros before the first input)

Every stateful module here has SpikingJelly's interface: `step_mode` ('s': x [*], 'm': x [T, *]) and `reset()`.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["CubaLI", "Delay", "Integrator", "LeakyIntegrator", "Scale", "StepModule", "SumPool2d", "Threshold"]


class StepModule(nn.Module):
    """A module with states advanced by `step`; 'm' runs `step` over the first dimension."""

    STATES: tuple[str, ...] = ()

    def __init__(self, params: Mapping[str, torch.Tensor], step_mode: str = "s", method: str = "euler",
                 dt: float = 1e-4):
        super().__init__()
        for name, value in params.items():
            self.register_buffer(name, value)
        self.step_mode, self.method, self.dt = step_mode, method, float(dt)
        self.reset()

    def reset(self) -> None:
        for name in self.STATES:
            setattr(self, name, None)  # None until the first step gives the neuron shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.step_mode == "s":
            return self.step(x)
        if self.step_mode == "m":  # an empty sequence runs no step: an empty output, the states as they were
            return torch.stack([self.step(x_t) for x_t in x]) if len(x) else x.new_empty(x.shape)
        raise ValueError(f"step_mode: expected 's' or 'm', got {self.step_mode!r}")

    def step(self, x: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _state(self, name: str, x: torch.Tensor, start: torch.Tensor | float = 0.0) -> torch.Tensor:
        """The state `name` for a step of `x`: at `start` where none is kept or the kept one has another shape than
        a step of x gives (x's broadcast with the parameters: the batch size changed), as our layers restart
        (docs/bad-input.md)."""
        value = getattr(self, name)
        if value is None or value.shape != torch.broadcast_shapes(x.shape, *(b.shape for b in self._buffers.values()
                                                                             if b is not None)):
            return torch.zeros_like(x) + start
        return value

    def extra_repr(self) -> str:
        return f"method={self.method!r}, dt={self.dt:g}, step_mode={self.step_mode!r}"


def _decay(rate_dt: torch.Tensor, method: str) -> torch.Tensor:
    """The factor a state keeps over one step of du/dt = -u/tau, rate_dt = dt/tau."""
    return torch.exp(-rate_dt) if method == "exact" else 1 - rate_dt


class LeakyIntegrator(StepModule):
    """NIR LI: tau dv/dt = (v_leak - v) + r x; outputs v. Starts at v_leak."""

    STATES = ("v",)
    tau: torch.Tensor
    r: torch.Tensor
    v_leak: torch.Tensor

    def step(self, x: torch.Tensor) -> torch.Tensor:
        v = self._state("v", x, self.v_leak)
        target = self.v_leak + self.r * x  # the membrane's fixed point under this step's input
        self.v = target + (v - target) * _decay(self.dt / self.tau, self.method)
        return self.v


class Integrator(StepModule):
    """NIR I: dv/dt = r x; outputs v (both methods are exact). Starts at 0."""

    STATES = ("v",)
    r: torch.Tensor

    def step(self, x: torch.Tensor) -> torch.Tensor:
        self.v = self._state("v", x) + self.dt * self.r * x
        return self.v


class CubaLI(StepModule):
    """NIR CubaLI: tau_syn di/dt = -i + w_in x, tau_mem dv/dt = (v_leak - v) + r i; outputs v.

    euler: both states from their start-of-step values; semi_implicit: i first, v with the new i. exact: with
    i* = w_in x, v* = v_leak + r i* (the fixed point), i' - i* = (i - i*) e^{-dt/tau_syn} and
    v' - v* = (v - v*) e^{-dt/tau_mem} + (r/tau_mem) phi (i - i*),
    phi = (e^{-dt/tau_mem} - e^{-dt/tau_syn}) / (1/tau_syn - 1/tau_mem) (dt e^{-dt/tau_mem} where the two are
    equal), computed as e^{max rate dt} dt (e^{-|rate difference| dt} - 1)/(-|rate difference| dt), without
    cancellation. Starts at v = v_leak, i = 0."""

    STATES = ("v", "i")
    tau_syn: torch.Tensor
    tau_mem: torch.Tensor
    r: torch.Tensor
    v_leak: torch.Tensor
    w_in: torch.Tensor

    def step(self, x: torch.Tensor) -> torch.Tensor:
        v, i = self._state("v", x, self.v_leak), self._state("i", x)
        if self.method != "exact":
            self.i = i + self.dt / self.tau_syn * (self.w_in * x - i)
            current = self.i if self.method == "semi_implicit" else i
            self.v = v + self.dt / self.tau_mem * (self.v_leak - v + self.r * current)
            return self.v
        i_star = self.w_in * x
        v_star = self.v_leak + self.r * i_star
        a, d = -1 / self.tau_mem, -1 / self.tau_syn
        ea, ed = torch.exp(a * self.dt), torch.exp(d * self.dt)
        # phi from the larger rate, e^{max dt} dt exprel(-|a - d| dt): (ea - ed)/(a - d) loses digits where a and d
        # are nearly equal (eps / |(a - d) dt|), as the specs' exact step does not (autocuda.spec.ode)
        z = -(self.tau_mem - self.tau_syn).abs() / (self.tau_mem * self.tau_syn) * self.dt
        exprel = torch.where(z == 0, torch.ones_like(z), torch.expm1(z) / torch.where(z == 0, torch.ones_like(z), z))
        phi = torch.maximum(ea, ed) * self.dt * exprel
        self.v = v_star + (v - v_star) * ea + self.r / self.tau_mem * phi * (i - i_star)
        self.i = i_star + (i - i_star) * ed
        return self.v


class Threshold(nn.Module):
    """NIR Threshold: 1 where x > threshold, else 0. A step function: no gradient flows through it."""

    threshold: torch.Tensor

    def __init__(self, threshold: torch.Tensor):
        super().__init__()
        self.register_buffer("threshold", threshold)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x > self.threshold).to(x.dtype)


class Scale(nn.Module):
    """NIR Scale: x * scale (per element)."""

    scale: torch.Tensor

    def __init__(self, scale: torch.Tensor):
        super().__init__()
        self.register_buffer("scale", scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale


class SumPool2d(nn.Module):
    """NIR SumPool2d: the sum over each window (zero padding)."""

    def __init__(self, kernel_size: tuple[int, int], stride: tuple[int, int], padding: tuple[int, int]):
        super().__init__()
        self.kernel_size, self.stride, self.padding = kernel_size, stride, padding

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # avg_pool2d divides each window's sum by divisor_override where one is given: 1 leaves the sum
        return F.avg_pool2d(x, self.kernel_size, self.stride, self.padding, divisor_override=1)


class Delay(StepModule):
    """NIR Delay: y[t] = x[t - k] with k = delay / dt steps per neuron (`steps`, integers); 0 before."""

    STATES = ("history",)
    steps: torch.Tensor
    history: torch.Tensor | None

    def step(self, x: torch.Tensor) -> torch.Tensor:
        depth = int(self.steps.max()) + 1
        history = self.history  # restarts (zeros) where none is kept or x's shape changed (the batch size)
        if history is None or history.shape[1:] != x.shape:
            history = x.new_zeros((depth, *x.shape))
        history = torch.cat([x.unsqueeze(0), history[:-1]])  # history[k] is x k steps ago
        self.history = history
        index = self.steps.expand(x.shape).unsqueeze(0)
        return history.gather(0, index).squeeze(0)
