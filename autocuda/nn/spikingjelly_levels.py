"""SpikingJelly 2.0's neurons with a multi-level spike, with its names, constructor signatures (positional order
included), defaults and argument checks (a `ValueError` or `TypeError` naming the argument); `backend` comes
last. Each is a `Neuron` of a shipped spec with `[[levels]]` (see docs/semantics.md):

| class            | spec          | spike                                                                  |
|------------------|---------------|------------------------------------------------------------------------|
| `TernaryIFNode`  | `ternary_if`  | +1 at h >= v_threshold, -1 at h <= -v_threshold; the surrogate on each |
| `TernaryLIFNode` | `ternary_lif` | as TernaryIFNode, with LIF's charge                                    |
| `ILIFNode`       | `ilif`        | round(clip(h / v_threshold, 0, D)): D unit levels, straight-through    |
"""
from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Any

from ..base.switches import check_switches
from ..spec.load import load_spec
from ..spec.model import Level, NeuronSpec
from ..spec.surrogate import Custom, Surrogate
from .neuron import SIGMOID, Neuron, option_attribute
from .spikingjelly import _common

__all__ = ["TernaryIFNode", "TernaryLIFNode", "ILIFNode", "MultiLevelSpikeCount", "ilif_spec"]


def _real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name}: expected a number, got {type(value).__name__} {value!r}")
    if not math.isfinite(float(value)):
        raise ValueError(f"{name}: must be finite, got {value!r}")
    return float(value)


def _flag(name: str, value: Any) -> bool:
    check_switches(**{name: value})
    return value


def _ternary_checks(v_threshold: Any, v_reset: Any, detach_reset: Any) -> None:
    """SpikingJelly's: a positive threshold, and a hard reset strictly between the two thresholds."""
    threshold = _real("v_threshold", v_threshold)
    if threshold <= 0:
        raise ValueError(f"v_threshold: must be > 0, got {v_threshold!r}")
    if v_reset is not None and not -threshold < _real("v_reset", v_reset) < threshold:
        raise ValueError(f"v_reset: must lie strictly between -v_threshold and v_threshold "
                         f"({-threshold}, {threshold}), got {v_reset!r}")
    _flag("detach_reset", detach_reset)


def _tau(tau: Any) -> float:
    value = _real("tau", tau)
    if value <= 1:
        raise ValueError(f"tau: must be > 1 (as SpikingJelly requires), got {tau!r}")
    return value


class TernaryIFNode(Neuron):
    def __init__(self, v_threshold: float = 1., v_reset: float | None = 0., surrogate_function: Any = SIGMOID,
                 detach_reset: bool = False, step_mode: str = "s", store_v_seq: bool = False,
                 backend: str | None = None):
        _ternary_checks(v_threshold, v_reset, detach_reset)
        super().__init__("ternary_if", v_threshold=v_threshold, v_reset=v_reset,
                         **_common(surrogate_function, detach_reset, step_mode, store_v_seq, backend))


class TernaryLIFNode(Neuron):
    decay_input = option_attribute("decay_input")

    def __init__(self, tau: float = 2., decay_input: bool = True, v_threshold: float = 1.,
                 v_reset: float | None = 0., surrogate_function: Any = SIGMOID, detach_reset: bool = False,
                 step_mode: str = "s", store_v_seq: bool = False, backend: str | None = None):
        _ternary_checks(v_threshold, v_reset, detach_reset)
        super().__init__("ternary_lif", tau=_tau(tau), v_threshold=v_threshold, v_reset=v_reset,
                         options={"decay_input": _flag("decay_input", decay_input)},
                         **_common(surrogate_function, detach_reset, step_mode, store_v_seq, backend))


@dataclasses.dataclass(frozen=True)
class MultiLevelSpikeCount:
    """SpikingJelly's integer spike count round(clip(x, 0, max_spike_count)), with gradient 1 where
    grad_min <= x <= grad_max (default [0, max_spike_count]): what `ILIFNode` fires. SpikingJelly's own object
    is taken as well."""

    max_spike_count: int
    spiking: bool = True
    grad_window: tuple[float, float] | None = None

    def __post_init__(self) -> None:
        count = self.max_spike_count
        if not isinstance(count, numbers.Integral) or isinstance(count, bool):
            raise TypeError(f"max_spike_count: expected an integer, got {count!r}")
        if count < 1:
            raise ValueError(f"max_spike_count: must be >= 1, got {count}")
        if self.grad_window is not None:
            low, high = (_real("grad_window", v) for v in self.grad_window)
            if low > high:
                raise ValueError(f"grad_window: must satisfy grad_min <= grad_max, got {self.grad_window!r}")

    @property
    def grad_min(self) -> float:
        return 0.0 if self.grad_window is None else float(self.grad_window[0])

    @property
    def grad_max(self) -> float:
        return float(self.max_spike_count) if self.grad_window is None else float(self.grad_window[1])


def _rectangle(low: float, high: float, closed: bool) -> Custom:
    """Gradient 1 on [low, high) ([low, high] where `closed`), 0 elsewhere (and everywhere, where empty)."""
    if low > high or (low == high and not closed):
        return Custom("0")
    gradient = "heaviside(x - lo) * heaviside(hi - x)" if closed else "heaviside(x - lo) - heaviside(x - hi)"
    return Custom(gradient, lo=low, hi=high)


def ilif_levels(count: int, grad_min: float, grad_max: float) -> tuple[Level, ...]:
    """`count` unit levels, level k firing at h/v_threshold >= k - 1/2 (so that they sum to round(clip(., 0,
    count)), rounding halves up), and the window [grad_min, grad_max] of h/v_threshold split among them at the
    integers 1 .. count-1: level k takes [k - 1, k) of it (the first all below 1, the last all from count - 1,
    closed), in its argument's coordinates h/v_threshold - (k - 1/2)."""
    levels = []
    for k in range(1, count + 1):
        low = grad_min if k == 1 else max(grad_min, k - 1.0)
        high = grad_max if k == count else min(grad_max, float(k))
        offset = k - 0.5
        levels.append(Level(f"h / v_threshold - {offset!r}", 1.0, _rectangle(low - offset, high - offset,
                                                                              closed=k == count)))
    return tuple(levels)


def ilif_spec(surrogate_function: Any) -> NeuronSpec:
    """The `ilif` spec with the count and gradient window of a (SpikingJelly or our) MultiLevelSpikeCount."""
    count = surrogate_function.max_spike_count
    levels = ilif_levels(int(count), float(surrogate_function.grad_min), float(surrogate_function.grad_max))
    shipped = load_spec("ilif")
    return shipped if levels == shipped.levels else dataclasses.replace(shipped, levels=levels)


class ILIFNode(Neuron):
    def __init__(self, tau: float = 4. / 3., v_threshold: float = 1.,
                 surrogate_function: Any = MultiLevelSpikeCount(4), detach_reset: bool = False,
                 step_mode: str = "s", store_v_seq: bool = False, backend: str | None = None):
        _check_count(surrogate_function)
        super().__init__(ilif_spec(surrogate_function), tau=_tau(tau),
                         **_common(surrogate_function, _flag("detach_reset", detach_reset), step_mode, store_v_seq,
                                   backend))
        # Any number, as SpikingJelly takes it (its calls give NaN at 0); set unchecked, so that a call names the
        # spec's domain (v_threshold > 0) where it is outside
        self.v_threshold = _real("v_threshold", v_threshold)

    def _surrogate_for(self, source: Any) -> Surrogate:
        """The surrogate_function (a MultiLevelSpikeCount) selects the spec: its count and gradient window are
        the levels'; their own surrogates serve, so the neuron's is the default."""
        _check_count(source)
        spec = ilif_spec(source)
        if spec.levels != self.spec.levels:
            self._use_spec(spec)
        return SIGMOID


def _check_count(surrogate_function: Any) -> None:
    if type(surrogate_function).__name__ != "MultiLevelSpikeCount" or not surrogate_function.spiking:
        raise ValueError(f"surrogate_function: must be a spiking MultiLevelSpikeCount, got {surrogate_function!r}")
