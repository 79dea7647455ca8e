"""Encoders: turn values into spike trains [T, *] (the step_mode 'm' layout), on the input's device.

- `poisson` / `PoissonEncoder`: x holds rates per step (`gain * x` in [0, 1]); each step fires with that
  probability, independently; randomness from a `torch.Generator` on x's device.
- `latency` / `LatencyEncoder`: x holds intensities in [0, 1]; one spike per value, at step
  `round((T - 1) * (1 - x))`: stronger values fire earlier. Deterministic.
- `delta` / `DeltaEncoder`: x_seq [T, *]; +1 / -1 where the value moved by `threshold` or more since the last
  spike (or since x_seq[0]). Deterministic.

Spikes have x's (floating) dtype, ready for a layer. Each function checks its input's values unless
`check=False`: the check reads one boolean back from the device (one synchronisation per call, never per step).
Poisson trains are reproducible: the same `seed` gives the same train on the same device (CPU and CUDA
generators differ, so a seed's trains differ between devices).
"""
from __future__ import annotations

import math
import numbers

import torch
from torch import nn

from ..base.switches import check_switches

__all__ = ["poisson", "latency", "delta", "PoissonEncoder", "LatencyEncoder", "DeltaEncoder"]

Tensor = torch.Tensor


def poisson(x: Tensor, T: int, *, gain: float = 1.0, seed: int | None = None,
            generator: torch.Generator | None = None, check: bool = True) -> Tensor:
    """Poisson (rate) spike trains [T, *x.shape]: at every step a spike with probability `gain * x`.

    `seed` makes a fresh generator on x's device; `generator` continues a given one (on x's device); neither uses
    torch's global generator. `gain` scales values to probabilities per step (e.g. pixel / 255 with gain 0.5 caps
    the rate at one spike every other step); `gain * x` must lie in [0, 1].
    """
    _check_tensor(x, "x")
    _check_steps(T)
    check_switches(check=check)
    gain = _number(gain, "gain", ">= 0")
    if seed is not None and generator is not None:
        raise ValueError("seed, generator: pass one of them (seed makes a new generator; generator continues one)")
    if generator is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator: expected a torch.Generator, got {type(generator).__name__}")
    # gain * x in float64: in x's dtype, bfloat16 rounded 200 / 255 to 0.785 (a biased rate, another train)
    p = x.to(torch.float64) * gain if gain != 1 else x
    if check:
        _check_range(p, "x" if gain == 1 else "gain * x", " (scale them first, or use gain=)")
    generator = _generator(x.device, seed) if seed is not None else generator
    if generator is not None and generator.device.type != x.device.type:
        raise ValueError(f"generator: it lives on {generator.device}, x on {x.device}; make it with "
                         f"torch.Generator(device=x.device)")
    # float32 draws whatever x's dtype: a seed gives the same train for float16, bfloat16, float32 and float64
    noise = torch.rand((T, *x.shape), generator=generator, device=x.device, dtype=torch.float32)
    return (noise < p).to(_float_dtype(x))


def latency(x: Tensor, T: int, *, check: bool = True) -> Tensor:
    """Time-to-first-spike trains [T, *x.shape]: one spike per value, at step round((T - 1) * (1 - x)).

    x = 1 fires at step 0, x = 0 at the last step; values must lie in [0, 1] (scale them first).
    """
    _check_tensor(x, "x")
    _check_steps(T)
    check_switches(check=check)
    if check:
        _check_range(x, "x", " (scale them first)")
    when = torch.round((T - 1) * (1 - x.to(torch.float64))).long()
    steps = torch.arange(T, device=x.device).view(T, *([1] * x.dim()))
    return (steps == when.unsqueeze(0)).to(_float_dtype(x))


def delta(x_seq: Tensor, threshold: float, *, signed: bool = True, check: bool = True) -> Tensor:
    """Send-on-delta spikes [T, *] of a sequence x_seq [T, *]: +1 where x_seq[t] exceeds the reference by
    `threshold` or more, -1 where it falls below it by as much; the reference starts at x_seq[0] and moves to
    x_seq[t] at each spike, so slow drifts fire too. `signed=False` gives 1 for either direction.
    """
    _check_tensor(x_seq, "x_seq")
    if x_seq.dim() < 1 or x_seq.shape[0] < 1:
        raise ValueError(f"x_seq: expected a sequence of shape [T, *] with T > 0, got shape {tuple(x_seq.shape)}")
    threshold = _number(threshold, "threshold", "> 0")
    check_switches(signed=signed, check=check)
    if check and not bool(torch.isfinite(x_seq).all()):
        raise ValueError("x_seq: holds NaN or infinite values")
    out = torch.zeros(x_seq.shape, dtype=_float_dtype(x_seq), device=x_seq.device)
    # changes in float64 (exact for float16/bfloat16/float32 values) against the threshold as given, never the
    # threshold rounded to x_seq's dtype (float16 0.1 is 0.09998: smaller changes would fire). Integers: signed
    # int64 (uint8 would wrap, 1 - 3 = 254; bool has no subtraction) against the threshold's ceiling, exactly.
    work, limit = (torch.float64, threshold) if x_seq.is_floating_point() else (
        torch.long, math.ceil(threshold) if threshold < 2**63 else 2**63 - 1)
    reference = x_seq[0].detach().to(work)
    for t in range(1, x_seq.shape[0]):  # the reference depends on earlier spikes: a loop over time
        now = x_seq[t].detach().to(work)
        change = now - reference
        up, down = change >= limit, change <= -limit
        # a difference of masks: +0.0 where nothing fires (sign(change) * mask is -0.0 for small falls)
        out[t] = up.to(out.dtype) - down.to(out.dtype) if signed else (up | down).to(out.dtype)
        reference = torch.where(up | down, now, reference)
    return out


class PoissonEncoder(nn.Module):
    """`poisson` as a module: `PoissonEncoder(T=8, seed=0)(x)` -> [T, *x.shape].

    With a seed, the module keeps one generator per device, seeded once: successive calls continue the stream
    (different trains), and `reset()` reseeds it (the same trains again). Without one, it draws from torch's
    global generator (`torch.manual_seed` decides).
    """

    def __init__(self, T: int, gain: float = 1.0, seed: int | None = None, check: bool = True):
        super().__init__()
        _check_steps(T)
        gain = _number(gain, "gain", ">= 0")
        check_switches(check=check)  # here, not at the first call
        self._generators: dict[str, torch.Generator] = {}
        self.T, self.gain, self.seed, self.check = T, gain, seed, check

    @property
    def seed(self) -> int | None:
        return self.__dict__["_seed"]

    @seed.setter
    def seed(self, value: int | None) -> None:
        """A new seed starts the trains afresh from it, as `reset()` does (the generators of the old one go)."""
        if value is not None:
            _check_seed(value)
        self.__dict__["_seed"] = value
        self._generators.clear()

    def reset(self) -> None:
        """Start every generator afresh from the seed (SpikingJelly's `functional.reset_net` calls this)."""
        self._generators.clear()

    def forward(self, x: Tensor) -> Tensor:
        generator = None
        if self.seed is not None:
            _check_tensor(x, "x")
            key = str(x.device)
            if key not in self._generators:
                self._generators[key] = _generator(x.device, self.seed)
            generator = self._generators[key]
        return poisson(x, self.T, gain=self.gain, generator=generator, check=self.check)

    def extra_repr(self) -> str:
        return f"T={self.T}, gain={self.gain}, seed={self.seed}"


class LatencyEncoder(nn.Module):
    """`latency` as a module: `LatencyEncoder(T=8)(x)` -> [T, *x.shape]."""

    def __init__(self, T: int, check: bool = True):
        super().__init__()
        _check_steps(T)
        check_switches(check=check)  # here: SpikingJelly's LatencyEncoder(T, 'log') would set check to 'log'
        self.T, self.check = T, check

    def forward(self, x: Tensor) -> Tensor:
        return latency(x, self.T, check=self.check)

    def extra_repr(self) -> str:
        return f"T={self.T}"


class DeltaEncoder(nn.Module):
    """`delta` as a module: `DeltaEncoder(threshold=0.1)(x_seq)` -> [T, *]."""

    def __init__(self, threshold: float, signed: bool = True, check: bool = True):
        super().__init__()
        threshold = _number(threshold, "threshold", "> 0")
        check_switches(signed=signed, check=check)
        self.threshold, self.signed, self.check = threshold, signed, check

    def forward(self, x_seq: Tensor) -> Tensor:
        return delta(x_seq, self.threshold, signed=self.signed, check=self.check)

    def extra_repr(self) -> str:
        return f"threshold={self.threshold}, signed={self.signed}"


def _check_tensor(x: object, name: str) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.is_complex():
        raise TypeError(f"{name}: expected real values, got {x.dtype}")


def _number(value: object, name: str, bound: str) -> float:
    """A real number (numpy's scalars too, bools not) above its bound ("> 0" or ">= 0"), as a float."""
    try:
        number = float(value) if isinstance(value, numbers.Real) and not isinstance(value, bool) else math.nan
    except OverflowError:  # an int beyond a float's range, which torch could not take either
        number = math.nan
    if not (number > 0 if bound == "> 0" else number >= 0):
        raise ValueError(f"{name}: expected a number {bound}, got {value!r}")
    return number


def _check_steps(T: object) -> None:
    if not isinstance(T, int) or isinstance(T, bool) or T <= 0:
        raise ValueError(f"T: expected the number of time steps, an int > 0, got {T!r}")


def _check_range(p: Tensor, name: str, hint: str) -> None:
    """One read-back for the whole tensor: NaN fails too (comparisons with NaN are false)."""
    if not bool(((p >= 0) & (p <= 1)).all()):
        raise ValueError(f"{name}: values must lie in [0, 1]{hint}")


def _check_seed(seed: object) -> None:
    """A seed a torch.Generator takes: an int of 64 bits (signed or not)."""
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise TypeError(f"seed: expected an int or None, got {seed!r}")
    if not -2**63 <= seed < 2**64:
        raise ValueError(f"seed: expected an int of 64 bits (-2**63 to 2**64 - 1), got {seed}")


def _float_dtype(x: Tensor) -> torch.dtype:
    """Spikes take x's dtype when it is floating (a layer's input), else the default float dtype."""
    return x.dtype if x.is_floating_point() else torch.get_default_dtype()


def _generator(device: torch.device, seed: int) -> torch.Generator:
    _check_seed(seed)
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    return generator
