"""SpikingJelly 2.0's DSR neurons (Meng et al. 2022, "Differentiation on Spike Representation", arXiv:2205.00459):
`DSRIFNode` and `DSRLIFNode`, multi-step only, without memories.

Forward: an IF (or a LIF discretised with step `delta_t`) with a soft reset by `v_threshold`, firing where the
membrane reaches `alpha * v_threshold`; the output is `v_threshold` per spike (divided by `delta_t` for the LIF).
Backward is not back-propagation through time: it differentiates the spike *rate* as a function of the input
rate. The IF's input gradient is the time mean of the output gradient where the input's mean lies in
[0, v_threshold] (0 elsewhere), the same at every step; the threshold's gradient sums the output gradient's
time-sum where the input's mean exceeds v_threshold. The LIF weights both means over time by
exp(-(T - t) delta_t / tau) (SpikingJelly's `weight_rate_spikes`).

A gradient rule over the whole sequence is not a recurrence, which the spec language describes: the forward is
the `dsr` spec (on the generated kernels for CUDA tensors, the IF's writing its output), the backward the rate rule's
kernel (`call.dsr`) or a torch composition (a few reductions over time; also under `create_graph=True`, where the
gradient is differentiated again: it is linear in the output's gradient) in an autograd function; with SpikingJelly's
constructors, checks (as `ValueError`s naming the argument), parameter (`v_threshold`, a 0-d `nn.Parameter`
when `v_threshold_training`) and results. The outputs keep the input's dtype (SpikingJelly's are float32).
"""
from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import torch
from torch import nn

from ..call import dsr
from ..call import functional as F
from ..call.mixing import kernel_backend
from ..runtime.configs import spec_ref
from ..spec.load import load_spec
from .arguments import BACKENDS, check_backend, checked_attribute, require_steps
from .memory import Memories, MemoryBase, MultiStepOnly

__all__ = ["DSRIFNode", "DSRLIFNode"]


def _real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"{name}: expected a finite number, got {value!r}")
    return float(value)


def _checked_steps(T: Any) -> int:
    if isinstance(T, bool) or not isinstance(T, int) or T < 1:
        raise ValueError(f"T: expected a whole number of time-steps >= 1, got {T!r}")
    return T


def _check_common(T: Any, v_threshold: Any, alpha: Any, v_threshold_lower_bound: Any, step_mode: Any) -> None:
    """SpikingJelly's assertions of both DSR classes, as ValueErrors naming the argument."""
    _checked_steps(T)
    if not 0.0 < _real("alpha", alpha) <= 1.0:
        raise ValueError(f"alpha: expected 0 < alpha <= 1, got {alpha!r}")
    if _real("v_threshold_lower_bound", v_threshold_lower_bound) <= 0.0:
        raise ValueError(f"v_threshold_lower_bound: expected > 0, got {v_threshold_lower_bound!r}")
    if _real("v_threshold", v_threshold) < v_threshold_lower_bound:
        raise ValueError(f"v_threshold: expected >= v_threshold_lower_bound ({v_threshold_lower_bound}), "
                         f"got {v_threshold!r}")
    if step_mode != "m":
        raise ValueError(f"step_mode: the DSR neurons run in multi-step mode only ('m'), got {step_mode!r}")


def _weight_values(steps: int, tau: float, delta_t: float) -> list[float]:
    """The LIF's rate weights over `steps` steps, exp(-(steps - t) delta_t / tau) for t = 1..steps."""
    return [math.exp(-(delta_t * steps - t * delta_t) / tau) for t in range(1, steps + 1)]


def _time_weights(steps: int, tau: float, delta_t: float, like: torch.Tensor) -> torch.Tensor:
    """`_weight_values` as a column of `like`'s dtype and device."""
    weight = _weight_values(steps, tau, delta_t)
    return torch.tensor(weight, dtype=like.dtype, device=like.device).view(steps, *([1] * (like.dim() - 1)))


def _weighted_rate(seq: torch.Tensor, tau: float, delta_t: float) -> torch.Tensor:
    """The time-weighted mean of `seq` [T, *] (SpikingJelly's `DSRLIFNode.weight_rate_spikes`)."""
    weight = _time_weights(seq.shape[0], tau, delta_t, seq)
    return (weight * seq).sum(0) / weight.sum()


def _spikes(x_seq: torch.Tensor, v_threshold: torch.Tensor, alpha: float, decay: float, gain: float,
            backend: str | None, spec: str = "dsr") -> torch.Tensor:
    """The forward's spikes (0 or 1), from the `dsr` spec (by default the generated kernels for CUDA tensors, the
    reference elsewhere); no final state is kept (each call starts at v = 0). With `spec` the variant of `dsr` whose
    kernels write its output in place of the spike (`_written_dsr`; kernels only), s v_threshold."""
    steps = x_seq.shape[0]
    spikes, _, _ = F.multi_step(spec, x_seq.reshape(steps, -1), decay=decay, gain=gain, v_threshold=v_threshold,
                                alpha=alpha, final_states=False, backend=BACKENDS[backend])
    return spikes.view(x_seq.shape)


@functools.cache
def _written_dsr() -> str:
    """The `dsr` spec as the variant whose forward kernels write its output, s v_threshold, in place of the spike:
    the IF's output without a spike tensor written and read back."""
    return spec_ref(dataclasses.replace(load_spec("dsr"), writes_output=True))


def _output(spikes: torch.Tensor, v_th: torch.Tensor, divisor: float, backend: str | None) -> torch.Tensor:
    """The layer's output, s v_th / divisor: one kernel where the kernels run the call, else torch."""
    out = dsr.scaled_spikes(spikes, v_th, divisor, BACKENDS[backend])
    if out is not None:
        return out
    return spikes * v_th if divisor == 1.0 else spikes * v_th / divisor


class _DSRIF(torch.autograd.Function):
    """The DSR IF's output and its gradient. Forward apart from `setup_context`, so torch.func's transforms take it
    where the torch reference runs it (the kernels refuse them by name)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x_seq: torch.Tensor, v_threshold: torch.Tensor, alpha: float, steps: int, grad_scale: float,
                backend: str | None) -> torch.Tensor:
        v_th = v_threshold.to(x_seq.dtype)
        if kernel_backend(x_seq, BACKENDS[backend]) is not None:  # the output s v_threshold in one launch
            return _spikes(x_seq, v_th, alpha, 1.0, 1.0, backend, _written_dsr())
        return _output(_spikes(x_seq, v_th, alpha, 1.0, 1.0, backend), v_th, 1.0, backend)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
        x_seq, v_threshold, _, ctx.steps, ctx.grad_scale, ctx.backend = inputs
        ctx.save_for_backward(x_seq, v_threshold)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        x_seq, v_threshold = ctx.saved_tensors
        v_th = v_threshold.to(x_seq.dtype)
        found = None if torch.is_grad_enabled() else \
            dsr.backward(x_seq, grad_out, v_th, [1.0] * ctx.steps, 1.0, ctx.steps, False, BACKENDS[ctx.backend])
        if found is not None:
            grad_x, partial = found
            grad_v_th = partial.sum() * ctx.grad_scale
            return grad_x, grad_v_th.to(v_threshold.dtype), None, None, None, None
        rate = x_seq.mean(0)
        grad_sum = grad_out.mean(0) * ctx.steps  # SpikingJelly's "grad_output_coding"
        passes = (rate >= 0) & (rate <= v_th)
        grad_x = torch.where(passes, grad_sum / ctx.steps, 0.0).expand_as(x_seq)
        grad_v_th = torch.where(rate > v_th, grad_sum, 0.0).sum() * ctx.grad_scale
        return grad_x, grad_v_th.to(v_threshold.dtype), None, None, None, None


class _DSRLIF(torch.autograd.Function):
    """The DSR LIF's output and its gradient (as `_DSRIF`: torch.func's transforms take the reference's)."""

    generate_vmap_rule = True

    @staticmethod
    def forward(x_seq: torch.Tensor, v_threshold: torch.Tensor, alpha: float, steps: int, tau: float,
                delta_t: float, grad_scale: float, backend: str | None) -> torch.Tensor:
        v_th = v_threshold.to(x_seq.dtype)
        beta = math.exp(-delta_t / tau)
        return _output(_spikes(x_seq, v_th, alpha, beta, 1 - beta, backend), v_th, delta_t, backend)

    @staticmethod
    def setup_context(ctx: Any, inputs: tuple, output: torch.Tensor) -> None:
        x_seq, v_threshold, _, ctx.steps, ctx.tau, ctx.delta_t, ctx.grad_scale, ctx.backend = inputs
        ctx.save_for_backward(x_seq, v_threshold)

    @staticmethod
    def backward(ctx: Any, grad_out: torch.Tensor) -> tuple[Any, ...]:
        x_seq, v_threshold = ctx.saved_tensors
        tau, delta_t = ctx.tau, ctx.delta_t
        found = None if torch.is_grad_enabled() else \
            dsr.backward(x_seq, grad_out, v_threshold.to(x_seq.dtype), _weight_values(ctx.steps, tau, delta_t),
                         tau / delta_t, tau * ctx.steps, True, BACKENDS[ctx.backend])
        if found is not None:
            grad_x, partial = found
            grad_v_th = partial.sum() * delta_t * ctx.grad_scale
            return grad_x, grad_v_th.to(v_threshold.dtype), None, None, None, None, None, None
        rate_bound = v_threshold.to(x_seq.dtype) / delta_t * tau
        rate = _weighted_rate(x_seq, tau, delta_t)
        grad_sum = _weighted_rate(grad_out, tau, delta_t) * ctx.steps
        passes = (rate > 0) & (rate < rate_bound)
        grad_x = torch.where(passes, grad_sum / tau / ctx.steps, 0.0).expand_as(x_seq)
        grad_v_th = torch.where(rate > rate_bound, grad_sum, 0.0).sum() * delta_t * ctx.grad_scale
        return grad_x, grad_v_th.to(v_threshold.dtype), None, None, None, None, None, None


class _DSRNode(MultiStepOnly, Memories, MemoryBase):
    """What both DSR neurons share: the threshold (a parameter, or a buffer outside the state dict as
    SpikingJelly's plain tensor), multi-step mode only, no memories (SpikingJelly's `MemoryModule` protocol)."""

    v_threshold: torch.Tensor

    T = checked_attribute("T", _checked_steps, "The time-steps a gradient is spread over")

    @property
    def backend(self) -> str | None:
        """Where calls run (`nn.arguments.BACKENDS`), read at every call; checked when set."""
        return self.__dict__["_backend"]

    @backend.setter
    def backend(self, value: str | None) -> None:
        check_backend(value)
        self.__dict__["_backend"] = value

    def __init__(self, T: int, v_threshold: float, alpha: float, v_threshold_training: bool,
                 v_threshold_grad_scaling: float, v_threshold_lower_bound: float, step_mode: str,
                 backend: str | None):
        _check_common(T, v_threshold, alpha, v_threshold_lower_bound, step_mode)
        nn.Module.__init__(self)  # not MemoryModule's (where it is the base): it sets the dict this class lacks
        self._step_mode = "m"
        self._start_memories({})
        self.T = T
        threshold = torch.tensor(float(v_threshold))
        if v_threshold_training:
            self.v_threshold = nn.Parameter(threshold)
        else:
            self.register_buffer("v_threshold", threshold, persistent=False)
        self.alpha = float(alpha)
        self.v_threshold_lower_bound = float(v_threshold_lower_bound)
        self.v_threshold_grad_scaling = _real("v_threshold_grad_scaling", v_threshold_grad_scaling)
        self.backend = backend

    def forward(self, x_seq: torch.Tensor) -> torch.Tensor:
        return self.multi_step_forward(x_seq)

    def multi_step_forward(self, x_seq: torch.Tensor) -> torch.Tensor:
        (y_seq,), _ = self.multi_step_functional_forward((x_seq,), ())
        return y_seq

    def multi_step_functional_forward(self, inputs: tuple[torch.Tensor, ...], states: tuple[Any, ...],
                                      **kwargs: Any) -> tuple[tuple[torch.Tensor, ...], tuple[Any, ...]]:
        x_seq = self._checked(inputs[0])
        v_threshold = self.v_threshold.clamp(min=self.v_threshold_lower_bound)
        return (self._apply_rule(x_seq, v_threshold),), tuple(states)

    def _apply_rule(self, x_seq: torch.Tensor, v_threshold: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _checked(self, x_seq: Any) -> torch.Tensor:
        """x_seq a floating [T, *] tensor; a gradient needs exactly T steps (the rule spreads it over T)."""
        name = type(self).__name__
        if not isinstance(x_seq, torch.Tensor) or not x_seq.is_floating_point() or x_seq.dim() < 1:
            raise ValueError(f"{name}: x_seq: expected a floating-point tensor of shape [T, *], got "
                             f"{getattr(x_seq, 'shape', type(x_seq).__name__)}")
        require_steps(self, x_seq)
        needs_grad = torch.is_grad_enabled() and (x_seq.requires_grad or self.v_threshold.requires_grad)
        if needs_grad and x_seq.shape[0] != self.T:
            raise ValueError(f"{name}: x_seq has {x_seq.shape[0]} time-steps but T={self.T}: the DSR gradient is "
                             f"spread over T steps (run without gradients, or build the layer with this T)")
        return x_seq


class DSRIFNode(_DSRNode):
    """`DSRIFNode(T=20, v_threshold=6.0, alpha=0.5, v_threshold_training=True, v_threshold_grad_scaling=1.0,
    v_threshold_lower_bound=0.01, step_mode='m', backend=None)`."""

    def __init__(self, T: int = 20, v_threshold: float = 6.0, alpha: float = 0.5, v_threshold_training: bool = True,
                 v_threshold_grad_scaling: float = 1.0, v_threshold_lower_bound: float = 0.01,
                 step_mode: str = "m", backend: str | None = None):
        super().__init__(T, v_threshold, alpha, v_threshold_training, v_threshold_grad_scaling,
                         v_threshold_lower_bound, step_mode, backend)

    def _apply_rule(self, x_seq: torch.Tensor, v_threshold: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _DSRIF.apply(x_seq, v_threshold, self.alpha, self.T, self.v_threshold_grad_scaling,
                                         self.backend)
        return out

    def extra_repr(self) -> str:
        return (f", T={self.T}, init_vth={self.v_threshold}, alpha={self.alpha}, "
                f"vth_bound={self.v_threshold_lower_bound}, vth_g_scale={self.v_threshold_grad_scaling}")


class DSRLIFNode(_DSRNode):
    """`DSRLIFNode(T=20, v_threshold=1.0, tau=2.0, delta_t=0.05, alpha=0.3, v_threshold_training=True,
    v_threshold_grad_scaling=1.0, v_threshold_lower_bound=0.1, step_mode='m', backend=None)`."""

    def __init__(self, T: int = 20, v_threshold: float = 1.0, tau: float = 2.0, delta_t: float = 0.05,
                 alpha: float = 0.3, v_threshold_training: bool = True, v_threshold_grad_scaling: float = 1.0,
                 v_threshold_lower_bound: float = 0.1, step_mode: str = "m", backend: str | None = None):
        super().__init__(T, v_threshold, alpha, v_threshold_training, v_threshold_grad_scaling,
                         v_threshold_lower_bound, step_mode, backend)
        # SpikingJelly checks neither; a zero or negative one divides by zero or grows without bound
        if _real("tau", tau) <= 0.0:
            raise ValueError(f"tau: expected > 0, got {tau!r}")
        if _real("delta_t", delta_t) <= 0.0:
            raise ValueError(f"delta_t: expected > 0, got {delta_t!r}")
        self.tau, self.delta_t = float(tau), float(delta_t)

    @classmethod
    def weight_rate_spikes(cls, data: torch.Tensor, tau: float, delta_t: float) -> torch.Tensor:
        """The time-weighted mean rate of `data` [T, *] (SpikingJelly's method of the same name)."""
        return _weighted_rate(data, tau, delta_t)

    def _apply_rule(self, x_seq: torch.Tensor, v_threshold: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = _DSRLIF.apply(x_seq, v_threshold, self.alpha, self.T, self.tau, self.delta_t,
                                          self.v_threshold_grad_scaling, self.backend)
        return out

    def extra_repr(self) -> str:
        return (f", T={self.T}, init_vth={self.v_threshold}, tau={self.tau}, dt={self.delta_t}, "
                f"alpha={self.alpha}, vth_bound={self.v_threshold_lower_bound}, "
                f"vth_g_scale={self.v_threshold_grad_scaling}")
